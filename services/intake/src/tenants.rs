//! The tenant routes: a tenant's placement policy and its price adjustments, each
//! through the application layer.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Extension;
use axum::Json;
use meridian_app::formats::json_body;
use meridian_app::tenants::{
    parse_policy, AdjustmentList, AdjustmentView, GrantRequest, PolicyDocument, RevokeRequest,
    TenantPolicy,
};
use uuid::Uuid;

use crate::api::ErrorBody;
use crate::handlers::read_body;
use crate::{ApiError, Intake};
use meridian_app::budgets::{BudgetDocument, BudgetView};
use meridian_app::Principal;

const MAX_POLICY_BYTES: usize = 64 * 1024;
const MAX_ADJUSTMENT_BYTES: usize = 16 * 1024;

fn tenant_path(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(tenant) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    meridian_app::tenants::check_tenant_path(&tenant)?;
    Ok(tenant)
}

/// The tenant's placement policy.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/policy", tag = "tenants", operation_id = "get_policy",
    params(("tenant" = String, Path, description = "The tenant's name", pattern = "^[a-z0-9_-]{1,63}$")),
    responses(
        (status = 200, description = "The policy in force", body = TenantPolicy),
        (status = 400, description = "The tenant name is invalid", body = ErrorBody),
    ))]
pub(crate) async fn get_policy(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TenantPolicy>, ApiError> {
    let tenant = tenant_path(path)?;
    Ok(Json(intake.app().policy(&who, &tenant).await?))
}

/// Replaces the tenant's placement policy (JSON). The stricter of it and a workflow's own
/// `placement` hints applies to every placement from now on; placed work stays put.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/policy", tag = "tenants", operation_id = "set_policy",
    params(("tenant" = String, Path, description = "The tenant's name", pattern = "^[a-z0-9_-]{1,63}$")),
    request_body(content = PolicyDocument, content_type = "application/json"),
    responses(
        (status = 200, description = "The policy now in force", body = TenantPolicy),
        (status = 400, description = "The policy is invalid; the error names the field", body = ErrorBody),
        (status = 409, description = "The tenant's history refuses it", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
    ))]
pub(crate) async fn set_policy(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<TenantPolicy>, ApiError> {
    let tenant = tenant_path(path)?;
    let bytes = read_body(&headers, body, MAX_POLICY_BYTES).await?;
    let policy = parse_policy(&bytes)?;
    Ok(Json(intake.app().set_policy(&who, &tenant, policy).await?))
}

/// The tenant's discounts and committed rates, in grant order.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/adjustments", tag = "tenants", operation_id = "list_adjustments",
    params(("tenant" = String, Path, description = "The tenant's name", pattern = "^[a-z0-9_-]{1,63}$")),
    responses(
        (status = 200, description = "The adjustments", body = AdjustmentList),
        (status = 400, description = "The tenant name is invalid", body = ErrorBody),
    ))]
pub(crate) async fn list_adjustments(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<AdjustmentList>, ApiError> {
    let tenant = tenant_path(path)?;
    Ok(Json(intake.app().adjustments(&who, &tenant).await?))
}

/// Grants the tenant a discount or a committed rate, from now or a later time: what was
/// billed is never re-priced.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/adjustments", tag = "tenants", operation_id = "grant_adjustment",
    params(("tenant" = String, Path, description = "The tenant's name", pattern = "^[a-z0-9_-]{1,63}$")),
    request_body(content = GrantRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Granted", body = AdjustmentView),
        (status = 400, description = "The request is invalid; the error names the field", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
    ))]
pub(crate) async fn grant_adjustment(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<AdjustmentView>), ApiError> {
    let tenant = tenant_path(path)?;
    let bytes = read_body(&headers, body, MAX_ADJUSTMENT_BYTES).await?;
    let request: GrantRequest = json_body(&bytes, "adjustment")?;
    let granted = intake
        .app()
        .grant_adjustment(&who, &tenant, request)
        .await?;
    Ok((StatusCode::CREATED, Json(granted)))
}

/// Ends an adjustment from now (or a later time); what was billed stays billed.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/adjustments/{id}/revoke", tag = "tenants", operation_id = "revoke_adjustment",
    params(
        ("tenant" = String, Path, description = "The tenant's name", pattern = "^[a-z0-9_-]{1,63}$"),
        ("id" = Uuid, Path, description = "The adjustment's id"),
    ),
    request_body(content = Option<RevokeRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Revoked", body = AdjustmentView),
        (status = 400, description = "The request is invalid", body = ErrorBody),
        (status = 404, description = "No such adjustment", body = ErrorBody),
        (status = 409, description = "It already ended", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
    ))]
pub(crate) async fn revoke_adjustment(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<AdjustmentView>, ApiError> {
    let Path((tenant, id)) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let tenant = tenant_path(Ok(Path(tenant)))?;
    let id = Uuid::parse_str(&id).map_err(|_| {
        ApiError::BadRequest(format!("invalid adjustment id {id:?}: expected a UUID"))
    })?;
    let bytes = read_body(&headers, body, MAX_ADJUSTMENT_BYTES).await?;
    let request: RevokeRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        RevokeRequest::default()
    } else {
        json_body::<Option<RevokeRequest>>(&bytes, "revocation")?.unwrap_or_default()
    };
    Ok(Json(
        intake
            .app()
            .revoke_adjustment(&who, &tenant, id, request)
            .await?,
    ))
}

/// The tenant's budget this month and where it stands: billed, in flight, left.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/budget", tag = "tenants", operation_id = "get_budget",
    params(("tenant" = String, Path, description = "The tenant's name", pattern = "^[a-z0-9_-]{1,63}$")),
    responses(
        (status = 200, description = "The budget and this month's standing", body = BudgetView),
        (status = 400, description = "The tenant name is invalid", body = ErrorBody),
        (status = 404, description = "Another tenant's", body = ErrorBody),
    ))]
pub(crate) async fn get_budget(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<BudgetView>, ApiError> {
    let tenant = tenant_path(path)?;
    Ok(Json(intake.app().budget(&who, &tenant).await?))
}

/// Replaces the tenant's limits (JSON). Submissions whose estimate would take the month
/// past the budget are refused (402) from now on.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/budget", tag = "tenants", operation_id = "set_budget",
    params(("tenant" = String, Path, description = "The tenant's name", pattern = "^[a-z0-9_-]{1,63}$")),
    request_body(content = BudgetDocument, content_type = "application/json"),
    responses(
        (status = 200, description = "The budget now in force", body = BudgetView),
        (status = 400, description = "The budget is invalid; the error names the field", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
    ))]
pub(crate) async fn set_budget(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<BudgetView>, ApiError> {
    let tenant = tenant_path(path)?;
    let bytes = read_body(&headers, body, MAX_POLICY_BYTES).await?;
    let limits = meridian_app::budgets::parse_budget(&bytes)?;
    Ok(Json(intake.app().set_budget(&who, &tenant, limits).await?))
}
