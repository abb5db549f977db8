//! The sites page: every site, connected or not, its health and why, its capacity by
//! GPU model, shapes and prices; admins drain and undrain from it.

use axum::extract::rejection::{FormRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::html;
use meridian_app::{Action, Principal};
use meridian_events::money::{ComputePricing, PriceSheet};
use serde::Deserialize;

use crate::layout::{failed, page, refusal, state, time};
use crate::Console;

pub(crate) async fn list(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
) -> Response {
    let sites = match console.app.sites(&who).await {
        Ok(s) => s.sites,
        Err(e) => return failed(&who, e),
    };
    // The prices in force at each site, from the catalogue the application keeps (the
    // caller may read sites: `sites` above checked).
    let now = chrono::Utc::now();
    let prices: Vec<(String, PriceSheet)> = match console.app.catalog().await {
        Ok(catalog) => catalog
            .sites
            .iter()
            .filter_map(|(name, site)| site.prices_at(now).map(|p| (name.clone(), p.clone())))
            .collect(),
        Err(e) => return failed(&who, e),
    };
    let admin = who.may(Action::ChangeSites);
    let devices: Vec<_> = sites
        .iter()
        .flat_map(|s| s.devices.iter().map(move |d| (s, d)))
        .collect();
    // Devices and those in service, by site and model.
    let mut by_model = std::collections::BTreeMap::<(&str, String), (u32, u32)>::new();
    for (s, d) in &devices {
        let e = by_model
            .entry((s.name.as_str(), format!("{} {}", d.vendor, d.model)))
            .or_default();
        e.0 += 1;
        if d.cordoned.is_none() {
            e.1 += 1;
        }
    }
    let body = html! {
        h1 { "Sites" }
        @if sites.is_empty() { p.empty { "No sites yet. " code { "meridian up" } " runs a local one; " code { "meridian site apply" } " adds others." } }
        @else {
            table #sites {
                thead { tr { th { "Site" } th { "Kind" } th { "Region" } th { "State" } th { "Connected" } th.num { "Reliability" } th { "Shapes" } th { "Prices" } th { "Why" } @if admin { th {} } } }
                tbody {
                    @for s in &sites {
                        tr data-site=(s.name) {
                            td { strong { (s.name) } }
                            td { (s.kind) }
                            td { (s.region) " " span.note { (s.jurisdiction) } }
                            td { (state(&s.state)) }
                            td { @if s.connected { "yes" } @else { span.warn { "no" } } }
                            td.num { (format!("{:.2}", s.reliability)) }
                            td { @for shape in &s.shapes { code { (shape) } " " } }
                            td { @if let Some(p) = &s.prices { (p.currency) " since " (time(&p.effective_from)) br; span.note { (p.source) } } @else { "none" } }
                            td.reason { @if let Some(r) = &s.reason { (r) } }
                            @if admin {
                                td {
                                    @if s.state == "drained" {
                                        form method="post" action={ "/sites/" (s.name) "/undrain" } { button type="submit" { "Undrain" } }
                                    } @else {
                                        form method="post" action={ "/sites/" (s.name) "/drain" } {
                                            input type="text" name="reason" placeholder="why" maxlength="500";
                                            button.danger type="submit" { "Drain" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if !prices.is_empty() {
                h2 { "Prices in force" }
                table #prices {
                    thead { tr { th { "Site" } th { "Offer" } th { "Compute" } th.num { "Storage per GiB-hour" } th.num { "Egress per GB" } } }
                    tbody {
                        @for (site, sheet) in &prices {
                            @for offer in &sheet.compute {
                                tr data-site=(site) {
                                    td { (site) }
                                    td { code { (offer.offer) } }
                                    td { (compute(&offer.pricing, sheet.currency.as_str())) }
                                    td.num { (sheet.storage_per_gib_hour.normalize()) " " (sheet.currency.as_str()) }
                                    td.num { (sheet.egress_per_gb.normalize()) " " (sheet.currency.as_str())
                                        @if !sheet.egress_tiers.is_empty() { span.note { " (tiered)" } } }
                                }
                            }
                        }
                    }
                }
            }
            @if !devices.is_empty() {
                h2 { "GPUs" }
                table #capacity {
                    thead { tr { th { "Site" } th { "Model" } th.num { "Devices" } th.num { "In service" } } }
                    tbody { @for ((site, model), (all, ok)) in &by_model { tr { td { (site) } td { (model) } td.num { (all) } td.num { (ok) } } } }
                }
                table #devices {
                    thead { tr { th { "Site" } th { "Device" } th { "Model" } th.num { "Memory" } th { "State" } } }
                    tbody {
                        @for (s, d) in &devices {
                            tr {
                                td { (s.name) } td { code { (d.id) } } td { (d.vendor) " " (d.model) }
                                td.num { (d.memory_bytes >> 30) " GiB" }
                                td { @match &d.cordoned { Some(c) => { span.warn { "cordoned by " (c.by) " at " (time(&c.at)) ": " (c.reason) } } None => { "in service" } } }
                            }
                        }
                    }
                }
            }
        }
    };
    page("Sites", Some(&who), body).into_response()
}

/// An offer's compute price as it is charged.
fn compute(pricing: &ComputePricing, currency: &str) -> String {
    match pricing {
        ComputePricing::Instance { per_instance_hour } => {
            format!(
                "{} {currency} per instance-hour",
                per_instance_hour.normalize()
            )
        }
        ComputePricing::Resource {
            per_core_hour,
            per_gib_memory_hour,
            per_gpu_hour,
        } => format!(
            "{} per core-hour, {} per GiB-hour, {} per GPU-hour ({currency})",
            per_core_hour.normalize(),
            per_gib_memory_hour.normalize(),
            per_gpu_hour.normalize()
        ),
    }
}

#[derive(Deserialize)]
pub(crate) struct DrainForm {
    reason: Option<String>,
}

fn site_name(path: Result<Path<String>, PathRejection>) -> Result<String, String> {
    path.map(|Path(n)| n).map_err(|e| e.body_text())
}

pub(crate) async fn drain(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    form: Result<Form<DrainForm>, FormRejection>,
) -> Response {
    let name = match site_name(path) {
        Ok(n) => n,
        Err(e) => return refusal(StatusCode::NOT_FOUND, Some(&who), &e),
    };
    let reason = crate::layout::reason(form.ok().and_then(|Form(f)| f.reason));
    match console.app.drain(&who, &name, reason).await {
        Ok(_) => Redirect::to("/sites").into_response(),
        Err(e) => failed(&who, e),
    }
}

pub(crate) async fn undrain(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let name = match site_name(path) {
        Ok(n) => n,
        Err(e) => return refusal(StatusCode::NOT_FOUND, Some(&who), &e),
    };
    match console.app.undrain(&who, &name).await {
        Ok(_) => Redirect::to("/sites").into_response(),
        Err(e) => failed(&who, e),
    }
}
