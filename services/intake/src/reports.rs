//! What a workflow cost and what its jobs printed: read from the ledger (kept by the
//! accounting service) and from the output the site runners keep when runs end.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use meridian_store::job_logs::{self, JobLog};
use meridian_store::StoreError;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::api::ErrorBody;
use crate::handlers::{load_workflow, workflow_id};
use crate::{read, ApiError, Intake};

/// 404 unless the workflow exists, in the read model or (not yet projected) in the log.
async fn must_exist(intake: &Intake, id: Uuid) -> Result<(), ApiError> {
    intake.ready().await?;
    let known = read::status(intake.store(), id)
        .await
        .map(|s| s.is_some())
        .unwrap_or(false);
    if known || load_workflow(intake, id).await?.sequence > 0 {
        return Ok(());
    }
    Err(ApiError::no_workflow(id))
}

fn store_error(context: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::Database(db) => ApiError::from_db(context, db),
        other => {
            tracing::error!(error = %other, "{context}");
            ApiError::Internal(context.to_string())
        }
    }
}

/// A workflow's bill: one line per charge, exact amounts, one total per currency.
///
/// Reads the ledger, which follows the log by a moment: `as_of_position` says how far.
#[utoipa::path(
    get,
    path = "/v1/workflows/{id}/bill",
    tag = "billing",
    operation_id = "get_bill",
    params(("id" = Uuid, Path, description = "The workflow's id")),
    responses(
        (status = 200, description = "The bill so far", body = meridian_accounting::Bill),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
    )
)]
pub(crate) async fn bill(
    State(intake): State<Intake>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<meridian_accounting::Bill>, ApiError> {
    let id = workflow_id(path)?;
    must_exist(&intake, id).await?;
    meridian_accounting::bill(intake.store(), id)
        .await
        .map(Json)
        .map_err(|e| store_error("reading the ledger", e))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogQuery {
    job: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LogList {
    /// One entry per run that ended, in job, index and attempt order.
    pub logs: Vec<JobLog>,
}

/// The captured output of a workflow's runs (each stream capped by its site).
///
/// Output is kept when a run ends; a run still going has none here yet.
#[utoipa::path(
    get,
    path = "/v1/workflows/{id}/logs",
    tag = "workflows",
    operation_id = "get_logs",
    params(
        ("id" = Uuid, Path, description = "The workflow's id"),
        ("job" = Option<String>, Query, description = "Only this job's runs"),
    ),
    responses(
        (status = 200, description = "The output kept so far", body = LogList),
        (status = 400, description = "The id or a query parameter is invalid", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
    )
)]
pub(crate) async fn logs(
    State(intake): State<Intake>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<LogQuery>, QueryRejection>,
) -> Result<Json<LogList>, ApiError> {
    let id = workflow_id(path)?;
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!("invalid query: {}; accepted is job", e.body_text()))
    })?;
    must_exist(&intake, id).await?;
    let logs = job_logs::read(intake.store(), &id.to_string(), query.job.as_deref())
        .await
        .map_err(|e| store_error("reading job output", e))?;
    Ok(Json(LogList { logs }))
}
