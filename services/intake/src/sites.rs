//! The site catalogue through the API: list the sites, apply a catalogue document,
//! drain and undrain, and quote a workflow against the live catalogue. Every change is
//! a Site event in the log, like the CLI's `meridian site` verbs.
//!
//! Reads come from the [`Catalog`] the [`Intake`] keeps in memory: each endpoint first
//! catches it up, reading only the commits appended since the last call (its own
//! changes included, so a read after a drain sees it), then answers under its lock.
//! A restarted intake reads the log once, on the first call.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use meridian_domain::catalog_file;
use meridian_domain::placement::{decide_for, Decision};
use meridian_domain::Catalog;
use meridian_eventlog::aggregates::{execute, ExecuteError};
use meridian_events::aggregate::{Site, SiteCommand, SiteError};
use meridian_events::vocabulary::workflow::{Candidate, SplitPlan};
use meridian_events::EventContext;
use serde::{Deserialize, Serialize};
use tokio::sync::MutexGuard;

use crate::api::{ErrorBody, FieldErrorBody};
use crate::handlers::{read_body, tenant, user};
use crate::{ApiError, Intake};

/// The largest catalogue document taken in one request.
const MAX_CATALOG_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SiteSummary {
    pub name: String,
    pub kind: String,
    pub region: String,
    pub jurisdiction: String,
    /// `ok`, `drained` or `unhealthy`.
    pub state: String,
    /// Whether an adapter serves the site now (its heartbeat holds); placement chooses
    /// only connected sites.
    #[serde(default)]
    pub connected: bool,
    /// (runs not failed by the site + 1) / (runs + 2).
    pub reliability: f64,
    pub shapes: Vec<String>,
    /// The price sheet in force: currency, since when, and its source.
    pub prices: Option<PricesSummary>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PricesSummary {
    pub currency: String,
    pub effective_from: String,
    pub source: String,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SiteList {
    pub sites: Vec<SiteSummary>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AppliedSite {
    pub site: String,
    /// `registered`, `updated` or `unchanged`.
    pub outcome: String,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AppliedCatalog {
    pub sites: Vec<AppliedSite>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SiteState {
    pub site: String,
    pub state: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Quote {
    /// The chosen site; null when no site can run the workflow.
    pub site: Option<String>,
    /// The estimate at the chosen site, exact, as text.
    pub estimated_cost: Option<String>,
    pub currency: Option<String>,
    /// Every site, with its verdict and cost terms, or why it was rejected.
    #[schema(value_type = Vec<Object>)]
    pub candidates: Vec<Candidate>,
    /// Jobs that would run away from `site`, when the workflow is split across sites.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub job_sites: std::collections::BTreeMap<String, String>,
    /// The plan that runs the jobs at different sites, when `placement.split` asks for
    /// one: each job's site, the volumes moved and its cost terms.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub split: Option<SplitPlan>,
    /// Sites that would fit but that no adapter serves: a submission waits for one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<String>,
    /// The sites an adapter serves now; placement chooses only among them.
    #[serde(default)]
    pub connected: Vec<String>,
}

/// The intake's catalogue, caught up with the log. Callers hold the guard only to read
/// from it: catch-ups wait on it.
async fn catalog(intake: &Intake) -> Result<MutexGuard<'_, Catalog>, ApiError> {
    let mut catalog = intake.catalog.lock().await;
    catalog
        .catch_up(&**intake.log())
        .await
        .map_err(|e| ApiError::from_log("reading the site catalogue", e))?;
    Ok(catalog)
}

fn body_text(bytes: &[u8]) -> Result<&str, ApiError> {
    std::str::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not UTF-8 text: {e}")))
}

/// The sites in the catalogue, with their state, shapes and prices in force.
#[utoipa::path(get, path = "/v1/sites", tag = "sites", operation_id = "list_sites",
    responses((status = 200, description = "Every site", body = SiteList)))]
pub(crate) async fn list(State(intake): State<Intake>) -> Result<Json<SiteList>, ApiError> {
    let catalog = catalog(&intake).await?;
    let now = chrono::Utc::now();
    Ok(Json(SiteList {
        sites: catalog
            .sites
            .values()
            .map(|s| SiteSummary {
                name: s.name.clone(),
                kind: s.kind.as_str().to_string(),
                region: s.region.clone(),
                jurisdiction: s.jurisdiction.clone(),
                state: if s.drained {
                    "drained"
                } else if !s.healthy {
                    "unhealthy"
                } else {
                    "ok"
                }
                .to_string(),
                connected: s.connected_at(now),
                reliability: s.reliability(),
                shapes: s.shapes.iter().map(|x| x.name.clone()).collect(),
                prices: s.prices_at(now).map(|p| PricesSummary {
                    currency: p.currency.to_string(),
                    effective_from: p.effective_from.to_rfc3339(),
                    source: p.source.clone(),
                }),
            })
            .collect(),
    }))
}

/// Registers or updates the sites a catalogue document describes (YAML or JSON; the
/// format of `catalog/reference.yaml`). Sites it does not name are left as they are.
#[utoipa::path(put, path = "/v1/sites", tag = "sites", operation_id = "apply_catalog",
    request_body(content = String, description = "A catalogue document", content_type = "application/yaml"),
    responses(
        (status = 200, description = "What changed, per site", body = AppliedCatalog),
        (status = 400, description = "The document is invalid; the error names the field", body = ErrorBody),
    ))]
pub(crate) async fn apply(
    State(intake): State<Intake>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<AppliedCatalog>, ApiError> {
    let by = user(&headers)?;
    let bytes = read_body(&headers, body, MAX_CATALOG_BYTES).await?;
    let specs = catalog_file::parse(body_text(&bytes)?).map_err(|e| {
        ApiError::InvalidWorkflow(vec![FieldErrorBody {
            path: e.path,
            message: e.message,
        }])
    })?;
    // A copy, so that the lock is not held while the changes are appended.
    let current = Catalog::clone(&*catalog(&intake).await?);
    let applied = catalog_file::apply_to(&**intake.log(), &current, &specs, &by)
        .await
        .map_err(|e| match e {
            catalog_file::ApplyError::Log(e) => ApiError::from_log("applying the catalogue", e),
            site => ApiError::Conflict(site.to_string()),
        })?;
    Ok(Json(AppliedCatalog {
        sites: applied
            .into_iter()
            .map(|(site, outcome)| AppliedSite {
                site,
                outcome: match outcome {
                    catalog_file::Applied::Registered => "registered",
                    catalog_file::Applied::Updated => "updated",
                    catalog_file::Applied::Unchanged => "unchanged",
                }
                .to_string(),
            })
            .collect(),
    }))
}

async fn on_site(
    intake: &Intake,
    path: Result<Path<String>, PathRejection>,
    command: impl Fn(String) -> SiteCommand,
    state: &str,
    headers: &HeaderMap,
) -> Result<Json<SiteState>, ApiError> {
    let Path(name) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid site name: {}", e.body_text())))?;
    let by = user(headers)?;
    let id = catalog(intake)
        .await?
        .find(&name)
        .map(|site| site.id)
        .ok_or_else(|| ApiError::NotFound(format!("no site {name}")))?;
    let command = command(by.clone());
    match execute::<Site, _>(&**intake.log(), id, &EventContext::new_chain(by), |_| {
        command.clone()
    })
    .await
    {
        Ok(_) => Ok(Json(SiteState {
            site: name,
            state: state.to_string(),
        })),
        Err(ExecuteError::Rejected(e @ (SiteError::AlreadyDrained | SiteError::NotDrained))) => {
            Err(ApiError::Conflict(format!("{name}: {e}")))
        }
        Err(ExecuteError::Log(e)) => Err(ApiError::from_log("changing the site", e)),
        Err(e) => Err(ApiError::Conflict(format!("{name}: {e}"))),
    }
}

/// Takes a site out of placement; work already there carries on.
#[utoipa::path(post, path = "/v1/sites/{name}/drain", tag = "sites", operation_id = "drain_site",
    params(("name" = String, Path, description = "The site's name")),
    request_body(content = Option<DrainRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Drained", body = SiteState),
        (status = 404, description = "No such site", body = ErrorBody),
        (status = 409, description = "Already drained", body = ErrorBody),
    ))]
pub(crate) async fn drain(
    State(intake): State<Intake>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<SiteState>, ApiError> {
    let bytes = read_body(&headers, body, 64 * 1024).await?;
    let request: DrainRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        DrainRequest::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::BadRequest(format!(
                "invalid drain request: {e}; expected {{\"reason\": \"...\"}}"
            ))
        })?
    };
    on_site(
        &intake,
        path,
        |by| SiteCommand::Drain {
            by,
            reason: request.reason.clone(),
        },
        "drained",
        &headers,
    )
    .await
}

/// Puts a drained site back into placement.
#[utoipa::path(post, path = "/v1/sites/{name}/undrain", tag = "sites", operation_id = "undrain_site",
    params(("name" = String, Path, description = "The site's name")),
    responses(
        (status = 200, description = "Back in placement", body = SiteState),
        (status = 404, description = "No such site", body = ErrorBody),
        (status = 409, description = "Not drained", body = ErrorBody),
    ))]
pub(crate) async fn undrain(
    State(intake): State<Intake>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Json<SiteState>, ApiError> {
    on_site(
        &intake,
        path,
        |by| SiteCommand::Undrain { by },
        "ok",
        &headers,
    )
    .await
}

/// Prices a workflow at every site of the live catalogue, without submitting it, under
/// the placement policy of the tenant in `X-Meridian-Tenant`.
#[utoipa::path(post, path = "/v1/quotes", tag = "sites", operation_id = "quote",
    request_body(content = String, description = "A workflow document (YAML or JSON)", content_type = "application/yaml"),
    responses(
        (status = 200, description = "The cheapest site and every candidate", body = Quote),
        (status = 400, description = "The workflow is invalid; every error with its path", body = ErrorBody),
    ))]
pub(crate) async fn quote(
    State(intake): State<Intake>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Quote>, ApiError> {
    let bytes = read_body(&headers, body, meridian_spec::MAX_DOCUMENT_BYTES).await?;
    let spec = meridian_spec::parse(body_text(&bytes)?)?;
    let tenant = tenant(&headers)?;
    let catalog = catalog(&intake).await?;
    let now = chrono::Utc::now();
    let connected: Vec<String> = catalog
        .sites
        .values()
        .filter(|s| s.connected_at(now))
        .map(|s| s.name.clone())
        .collect();
    Ok(Json(
        match decide_for(&spec, Some(&tenant), &catalog, now) {
            Decision::Placed(p) => Quote {
                site: Some(p.site),
                estimated_cost: Some(p.estimated_cost.amount.to_string()),
                currency: Some(p.estimated_cost.currency.to_string()),
                candidates: p.explanation.candidates,
                job_sites: p.job_sites,
                split: p.explanation.split,
                waiting_for: Vec::new(),
                connected,
            },
            decision @ (Decision::Rejected { .. } | Decision::Waiting { .. }) => Quote {
                site: None,
                estimated_cost: None,
                currency: None,
                job_sites: Default::default(),
                split: None,
                connected,
                waiting_for: match &decision {
                    Decision::Waiting { sites, .. } => sites.clone(),
                    _ => Vec::new(),
                },
                candidates: decision
                    .rejections()
                    .to_vec()
                    .into_iter()
                    .map(|r| Candidate {
                        site: r.site,
                        verdict: meridian_events::vocabulary::workflow::Verdict::Rejected {
                            reason: r.reason,
                        },
                        cost: None,
                    })
                    .collect(),
            },
        },
    ))
}
