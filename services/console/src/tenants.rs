//! The tenants page, for admins: each tenant that holds a token, with its placement
//! policy, its budget and what is left of it this month, and its tokens (never their
//! values).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;
use meridian_app::auth::TokenView;
use meridian_app::Principal;

use crate::layout::{failed, page};
use crate::Console;

pub(crate) async fn list(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
) -> Response {
    let tokens = match console.app.list_tokens(&who).await {
        Ok(t) => t.tokens,
        Err(e) => return failed(&who, e),
    };
    let mut by_tenant: BTreeMap<String, Vec<&TokenView>> = BTreeMap::new();
    for t in &tokens {
        by_tenant
            .entry(t.tenant.clone().unwrap_or_else(|| "(every tenant)".into()))
            .or_default()
            .push(t);
    }
    let mut sections = Vec::new();
    for (tenant, tokens) in &by_tenant {
        let named = tokens.iter().any(|t| t.tenant.is_some());
        let policy = if named {
            console.app.policy(&who, tenant).await.ok()
        } else {
            None
        };
        let budget = if named {
            console.app.budget(&who, tenant).await.ok()
        } else {
            None
        };
        sections.push(html! {
            section.tenant data-tenant=(tenant) {
                h2 { (tenant) }
                @if let Some(p) = &policy {
                    h3 { "Policy" }
                    @if !p.set { p.note { "No policy set: every site, spot and split allowed." } }
                    @else {
                        dl.facts {
                            dt { "Sites" } dd { @if p.policy.sites.is_empty() { "any" } @else { (p.policy.sites.join(", ")) } }
                            dt { "Regions" } dd { @if p.policy.regions.is_empty() { "any" } @else { (p.policy.regions.join(", ")) } }
                            dt { "Residency" } dd { (p.policy.residency.as_deref().unwrap_or("any")) }
                            dt { "Budget per workflow" } dd { (p.policy.budget_per_workflow.as_deref().unwrap_or("none")) }
                            dt { "Spot" } dd { @if p.policy.spot_allowed { "allowed" } @else { "not allowed" } }
                            dt { "Split across sites" } dd { @if p.policy.split_allowed { "allowed" } @else { "not allowed" } }
                        }
                    }
                }
                @if let Some(b) = &budget {
                    h3 { "Budget, " (b.month) }
                    dl.facts {
                        dt { "Per month" } dd { (b.money_per_month.as_deref().unwrap_or("no limit")) }
                        dt { "Spent" } dd { (b.spent.as_deref().unwrap_or("0")) }
                        dt { "In flight" } dd { (b.in_flight.as_deref().unwrap_or("0")) }
                        dt { "Left" } dd { (b.left.as_deref().unwrap_or("no limit")) }
                        dt { "GPU-hours" } dd { (b.gpu_hours_used.as_deref().unwrap_or("0")) " used of " (b.gpu_hours_per_month.as_deref().unwrap_or("no limit")) }
                        dt { "Concurrent" } dd { (b.concurrent_workflows.map_or("no limit".to_string(), |n| format!("{n} workflows"))) ", " (b.concurrent_gpus.map_or("no limit".to_string(), |n| format!("{n} GPUs"))) }
                    }
                }
                h3 { "Tokens" }
                table.tokens {
                    thead { tr { th { "Id" } th { "Role" } th { "Grants" } th { "Label" } th { "Issued by" } th { "Expires" } th { "State" } } }
                    tbody {
                        @for t in tokens {
                            tr {
                                td { code { (t.id) } }
                                td { (t.role.as_str()) }
                                td { @for g in &t.grants { (g.as_str()) " " } }
                                td { (t.label.as_deref().unwrap_or("")) }
                                td { (t.issued_by) }
                                td { @if let Some(e) = t.expires_at { (e.format("%Y-%m-%d %H:%M UTC")) } @else { "never" } }
                                td { @if t.revoked { span.warn { "revoked" } } @else { "active" } }
                            }
                        }
                    }
                }
            }
        });
    }
    let body = html! {
        h1 { "Tenants" }
        p.note { "Tokens are issued and revoked with " code { "meridian admin token" } "; policies with " code { "meridian admin policy" } "; budgets with " code { "meridian admin budget" } "." }
        @for s in sections { (s) }
    };
    page("Tenants", Some(&who), body).into_response()
}
