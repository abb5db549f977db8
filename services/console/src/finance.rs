//! Finance's page: one month's charges by tenant, site and category, spend per day and
//! per site as charts, each workflow's share of its tenant's month, and the FOCUS export
//! to download. Every figure is summed exactly from the same FOCUS rows the download
//! holds (and `meridian export focus` writes), so the page and the file cannot disagree.

use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup};
use meridian_accounting::focus::{self, Row};
use meridian_accounting::Period;
use meridian_app::{Action, Principal};
use rust_decimal::Decimal;
use serde::Deserialize;

use crate::layout::{amount, failed, page, raw, refusal};
use crate::{chart, Console};

#[derive(Deserialize)]
pub(crate) struct MonthParams {
    month: Option<String>,
    tenant: Option<String>,
}

fn period(params: &MonthParams) -> Result<Period, String> {
    match params.month.as_deref().filter(|m| !m.is_empty()) {
        None => Ok(Period::of(chrono::Utc::now())),
        Some(m) => m
            .parse::<Period>()
            .map_err(|e| format!("month: {e} (expected YYYY-MM, such as 2026-12)")),
    }
}

fn tenant(params: &MonthParams) -> Option<&str> {
    params.tenant.as_deref().filter(|t| !t.is_empty())
}

/// The month asked for and its FOCUS rows, or the page that says why not.
async fn month_export(
    console: &Console,
    who: &Principal,
    params: &MonthParams,
) -> Result<(Period, focus::Export), Response> {
    let period = period(params).map_err(|e| refusal(StatusCode::BAD_REQUEST, Some(who), &e))?;
    let export = console
        .app
        .export_focus(who, period, tenant(params))
        .await
        .map_err(|e| failed(who, e))?;
    Ok((period, export))
}

/// Exact sums in each currency by a key.
#[derive(Default)]
struct Sums(BTreeMap<(String, String), Decimal>);

impl Sums {
    fn add(&mut self, key: &str, currency: &str, value: Decimal) {
        *self
            .0
            .entry((key.to_string(), currency.to_string()))
            .or_default() += value;
    }
}

fn cost(row: &Row) -> Decimal {
    row.get("BilledCost")
        .and_then(|c| c.parse().ok())
        .unwrap_or_default()
}

pub(crate) async fn month(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    Query(params): Query<MonthParams>,
) -> Response {
    let (period, export) = match month_export(&console, &who, &params).await {
        Ok(found) => found,
        Err(refused) => return refused,
    };
    let (mut totals, mut tenants, mut sites, mut categories, mut days, mut workflows) = (
        Sums::default(),
        Sums::default(),
        Sums::default(),
        Sums::default(),
        Sums::default(),
        Sums::default(),
    );
    let mut workflow_tenant: BTreeMap<String, String> = BTreeMap::new();
    for row in &export.rows {
        let currency = row.get("BillingCurrency").unwrap_or("");
        let c = cost(row);
        let tenant = row.get("BillingAccountId").unwrap_or("");
        totals.add("", currency, c);
        tenants.add(tenant, currency, c);
        sites.add(row.get("x_Site").unwrap_or(""), currency, c);
        categories.add(row.get("ServiceCategory").unwrap_or(""), currency, c);
        days.add(
            row.get("ChargePeriodStart")
                .map_or("", |d| &d[..d.len().min(10)]),
            currency,
            c,
        );
        if let Some(w) = row.get("x_WorkflowId") {
            workflows.add(w, currency, c);
            workflow_tenant.insert(w.to_string(), tenant.to_string());
        }
    }
    let currencies: Vec<String> = totals.0.keys().map(|(_, c)| c.clone()).collect();
    let query = |extra: &str| {
        let mut q = format!("month={period}");
        if let Some(t) = tenant(&params) {
            q.push_str(&format!("&tenant={t}"));
        }
        q.push_str(extra);
        q
    };
    let body = html! {
        h1 { "Charges, " (period) }
        form.inline method="get" action="/finance" {
            label for="month" { "Month" }
            input #month type="month" name="month" value=(period.to_string());
            @if who.every_tenant {
                label for="tenant" { "Tenant" }
                input #tenant type="text" name="tenant" value=(tenant(&params).unwrap_or("")) placeholder="every tenant" pattern="[a-z0-9_-]{1,63}";
            }
            button type="submit" { "Show" }
            a.button #download href={ "/finance/focus.csv?" (query("")) } download { "Download the FOCUS export (CSV)" }
        }
        p.note { (export.rows.len()) " FOCUS rows, as of ledger position " (export.as_of_position) ". Amounts are billed cost (contracted), exact; hover for every digit." }
        @if export.rows.is_empty() { p.empty { "No charges this month." } }
        @for cur in &currencies {
            @let total = totals.0.get(&(String::new(), cur.clone())).copied().unwrap_or_default();
            section.currency data-currency=(cur) {
                h2 { "In " (cur) ": " (amount(&total.to_string(), cur, 2)) }
                div.columns {
                    (table("by-tenant", "Tenant", &tenants, cur, total))
                    (table("by-site", "Site", &sites, cur, total))
                    (table("by-category", "Category", &categories, cur, total))
                }
                h3 { "Spend per day" }
                (raw(chart::bars(&format!("per-day-{cur}"), "spend per day", &every_day(period, &days, cur), cur)))
                h3 { "Spend per site" }
                (raw(chart::bars(&format!("per-site-{cur}"), "spend per site", &series(&sites, cur, str::to_string), cur)))
                h3 { "Each workflow's share of its tenant's month" }
                table.workflows {
                    thead { tr { th { "Workflow" } th { "Tenant" } th.num { "Amount" } th.num { "Share" } } }
                    tbody {
                        @for ((w, c), v) in workflows.0.iter().filter(|((_, c), _)| c == cur) {
                            @let t = workflow_tenant.get(w).cloned().unwrap_or_default();
                            @let of_tenant = tenants.0.get(&(t.clone(), c.clone())).copied().unwrap_or_default();
                            tr {
                                td { @if who.may(Action::ReadWorkflow) { a href={ "/workflows/" (w) } { code { (w) } } } @else { code { (w) } } }
                                td { (t) }
                                td.num { (amount(&v.to_string(), c, 6)) }
                                td.num { (share(*v, of_tenant)) }
                            }
                        }
                    }
                }
            }
        }
    };
    page("Finance", Some(&who), body).into_response()
}

/// The values of one currency, in key order, with keys as `label` shows them.
fn series(sums: &Sums, currency: &str, label: impl Fn(&str) -> String) -> Vec<(String, Decimal)> {
    sums.0
        .iter()
        .filter(|((_, c), _)| c == currency)
        .map(|((k, _), v)| (label(k), *v))
        .collect()
}

/// Each day of the month, those without charges at zero, labelled by day of month.
fn every_day(period: Period, days: &Sums, currency: &str) -> Vec<(String, Decimal)> {
    let mut day = period.start().date_naive();
    let end = period.end().date_naive();
    let mut out = Vec::new();
    while day < end {
        let key = (day.format("%Y-%m-%d").to_string(), currency.to_string());
        let value = days.0.get(&key).copied().unwrap_or_default();
        out.push((day.format("%d").to_string(), value));
        day = day.succ_opt().unwrap_or(end);
    }
    out
}

fn share(part: Decimal, whole: Decimal) -> String {
    if whole.is_zero() {
        return "-".into();
    }
    format!("{}%", (part * Decimal::ONE_HUNDRED / whole).round_dp(1))
}

fn table(id: &str, what: &str, sums: &Sums, currency: &str, total: Decimal) -> Markup {
    html! {
        table id=(id) {
            thead { tr { th { (what) } th.num { "Amount" } th.num { "Share" } } }
            tbody {
                @for ((k, c), v) in sums.0.iter().filter(|((_, c), _)| c == currency) {
                    tr data-key=(k) { td { (k) } td.num { (amount(&v.to_string(), c, 6)) } td.num { (share(*v, total)) } }
                }
            }
        }
    }
}

/// The month's FOCUS rows as CSV: the same file as `GET /v1/exports/focus` and
/// `meridian export focus`.
pub(crate) async fn focus_csv(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    Query(params): Query<MonthParams>,
) -> Response {
    let (period, export) = match month_export(&console, &who, &params).await {
        Ok(found) => found,
        Err(refused) => return refused,
    };
    let name = match tenant(&params) {
        Some(t) => format!("focus-{period}-{t}.csv"),
        None => format!("focus-{period}.csv"),
    };
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
        .unwrap_or(HeaderValue::from_static("attachment"));
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/csv; charset=utf-8"),
            ),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        focus::to_csv(&export.rows),
    )
        .into_response()
}
