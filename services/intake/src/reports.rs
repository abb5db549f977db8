//! The billing routes and the logs: what a workflow cost, what a tenant owes for a
//! month, the FOCUS export, and what jobs printed.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use meridian_accounting::focus;
use meridian_accounting::Period;
use meridian_app::reports::{check_tenant, LogList};
use serde::Deserialize;

use crate::api::ErrorBody;
use crate::handlers::workflow_id;
use crate::{ApiError, Intake};
use meridian_app::Principal;

/// A workflow's bill: every line (one per priced dimension of each charge, every run,
/// attempt and site included), exact amounts, and totals per currency, per category
/// and per site. Amounts in different currencies are never summed.
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
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<meridian_accounting::Bill>, ApiError> {
    let id = workflow_id(path)?;
    Ok(Json(intake.app().bill(&who, id).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogQuery {
    job: Option<String>,
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
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<LogQuery>, QueryRejection>,
) -> Result<Json<LogList>, ApiError> {
    let id = workflow_id(path)?;
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!("invalid query: {}; accepted is job", e.body_text()))
    })?;
    Ok(Json(
        intake.app().logs(&who, id, query.job.as_deref()).await?,
    ))
}

/// The ledger's position, on exports: how much of the log they include.
pub const LEDGER_POSITION: &str = "meridian-ledger-position";

fn period_of(text: Option<String>) -> Result<Period, ApiError> {
    let text = text.ok_or_else(|| {
        ApiError::BadRequest("period is required: a month as YYYY-MM, e.g. 2026-11".into())
    })?;
    text.parse::<Period>()
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PeriodQuery {
    period: Option<String>,
}

/// A tenant's bill for one month: totals per currency, per category and per site, and
/// each workflow's share, exact.
///
/// Charges are split at month boundaries, so a run from 31 October to 1 November is in
/// both months' bills, each with its part. A tenant with nothing that month has an
/// empty bill.
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant}/bills",
    tag = "billing",
    operation_id = "get_tenant_bill",
    params(
        ("tenant" = String, Path, pattern = "^[a-z0-9_-]{1,63}$", description = "The tenant (1 to 63 of a-z, 0-9, '-', '_')"),
        ("period" = String, Query, pattern = "^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])$", description = "The month, YYYY-MM (UTC), from 1970-01", example = "2026-11"),
    ),
    responses(
        (status = 200, description = "The month's bill so far", body = meridian_accounting::TenantBill),
        (status = 400, description = "Invalid tenant or period, or an unknown parameter", body = ErrorBody),
    )
)]
pub(crate) async fn tenant_bill(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<PeriodQuery>, QueryRejection>,
) -> Result<Json<meridian_accounting::TenantBill>, ApiError> {
    let Path(tenant) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid tenant: {}", e.body_text())))?;
    check_tenant(&tenant)?;
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "invalid query: {}; accepted is period",
            e.body_text()
        ))
    })?;
    let period = period_of(query.period)?;
    Ok(Json(intake.app().tenant_bill(&who, &tenant, period).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExportQuery {
    period: Option<String>,
    tenant: Option<String>,
    format: Option<String>,
}

/// The FinOps FOCUS 1.2 export of one month: one row per ledger line, CSV (default) or
/// JSON.
///
/// Columns: every FOCUS mandatory column, ResourceId, ResourceName, ResourceType,
/// RegionId, RegionName, SkuId, ConsumedQuantity, ConsumedUnit, ListUnitPrice,
/// ContractedUnitPrice, ChargeFrequency, ServiceSubcategory, Tags (workflow, job,
/// tenant, site), then Meridian's `x_` columns. Dates are UTC `YYYY-MM-DDTHH:mm:ssZ`,
/// period ends exclusive; a null is an empty CSV field (JSON `null`). Quantities are
/// rounded to 10 decimal places and costs computed from them exactly, so
/// `ListCost = ListUnitPrice × PricingQuantity` holds on every row. The same ledger
/// always gives the same bytes; the `Meridian-Ledger-Position` header says how much of
/// the log it includes.
#[utoipa::path(
    get,
    path = "/v1/exports/focus",
    tag = "billing",
    operation_id = "export_focus",
    params(
        ("period" = String, Query, pattern = "^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])$", description = "The billing period, YYYY-MM (UTC), from 1970-01", example = "2026-11"),
        ("tenant" = Option<String>, Query, pattern = "^[a-z0-9_-]{1,63}$", description = "Only this tenant's charges"),
        ("format" = Option<String>, Query, pattern = "^(csv|json)$", description = "`csv` (default) or `json`"),
    ),
    responses(
        (status = 200, description = "The export",
            headers(("Meridian-Ledger-Position" = u64, description = "The ledger position the export includes")),
            content(
                (String = "text/csv"),
                (Vec<Object> = "application/json"),
            )
        ),
        (status = 400, description = "Invalid period, tenant or format, or an unknown parameter", body = ErrorBody),
    )
)]
pub(crate) async fn focus_export(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    query: Result<Query<ExportQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "invalid query: {}; accepted are period, tenant, format",
            e.body_text()
        ))
    })?;
    let period = period_of(query.period)?;
    if let Some(t) = &query.tenant {
        check_tenant(t)?;
    }
    let json = match query.format.as_deref() {
        None | Some("csv") => false,
        Some("json") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "invalid format {other:?}: expected csv or json"
            )))
        }
    };
    let export = intake
        .app()
        .export_focus(&who, period, query.tenant.as_deref())
        .await?;
    let name = match &query.tenant {
        Some(t) => format!("focus-{period}-{t}"),
        None => format!("focus-{period}"),
    };
    let (body, content_type, ext) = if json {
        (focus::to_json(&export.rows), "application/json", "json")
    } else {
        (
            focus::to_csv(&export.rows),
            "text/csv; charset=utf-8",
            "csv",
        )
    };
    let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{name}.{ext}\""))
        .map_err(|_| ApiError::Internal("building the file name".into()))?;
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CONTENT_DISPOSITION, disposition),
            (
                HeaderName::from_static(LEDGER_POSITION),
                HeaderValue::from(export.as_of_position),
            ),
        ],
        body,
    )
        .into_response())
}
