//! A tenant's placement policy through the API: where its work may run, whatever its
//! workflows ask. Setting it is a command on the Tenant aggregate, like the CLI's
//! `meridian admin policy set`; the router applies it to every placement after it.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::{DateTime, Utc};
use meridian_eventlog::aggregates::{execute, load, ExecuteError};
use meridian_events::aggregate::tenant::valid_tenant_name;
use meridian_events::aggregate::tenant::Adjustment;
use meridian_events::aggregate::{tenant_id, Tenant, TenantCommand, TenantError};
use meridian_events::vocabulary::tenant::{AdjustmentScope, AdjustmentTerms, PlacementPolicy};
use meridian_events::{EventContext, Money};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::api::ErrorBody;
use crate::handlers::{read_body, user};
use crate::{ApiError, Intake};

const MAX_POLICY_BYTES: usize = 64 * 1024;

// Request bodies are read field by field (`parse_policy`) so that an error names its
// field; the serde attributes here give the OpenAPI document the same shape and defaults.
/// A tenant's placement policy. Every field is optional; what is left out does not limit.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    /// Sites the tenant may use; empty or absent: any.
    #[serde(default)]
    pub sites: Vec<String>,
    /// Regions the tenant may use; empty or absent: any.
    #[serde(default)]
    pub regions: Vec<String>,
    /// The jurisdiction its data must stay in, such as `eu`.
    #[serde(default)]
    pub residency: Option<String>,
    /// The most one workflow's estimate may be, such as `"500 USD"`.
    #[serde(default)]
    pub budget_per_workflow: Option<String>,
    /// Whether workflows that ask for spot capacity may have it; default true.
    #[serde(default = "yes")]
    pub spot_allowed: bool,
    /// Whether workflows that ask to be split across sites may be; default true.
    #[serde(default = "yes")]
    pub split_allowed: bool,
}

fn yes() -> bool {
    true
}

/// The policy in force for a tenant.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantPolicy {
    pub tenant: String,
    /// False when no policy was ever set: the tenant may go anywhere its hints allow.
    pub set: bool,
    pub policy: PolicyDocument,
}

impl From<&PlacementPolicy> for PolicyDocument {
    fn from(p: &PlacementPolicy) -> Self {
        PolicyDocument {
            sites: p.sites.clone(),
            regions: p.regions.clone(),
            residency: p.residency.clone(),
            budget_per_workflow: p
                .budget_per_workflow
                .as_ref()
                .map(|m| format!("{} {}", m.amount, m.currency)),
            spot_allowed: p.spot_allowed,
            split_allowed: p.split_allowed,
        }
    }
}

const FIELDS: [&str; 6] = [
    "sites",
    "regions",
    "residency",
    "budget_per_workflow",
    "spot_allowed",
    "split_allowed",
];

/// The policy a request body describes, or a 400 that names the field at fault.
fn parse_policy(bytes: &[u8]) -> Result<PlacementPolicy, ApiError> {
    let bad =
        |field: &str, expected: &str| ApiError::BadRequest(format!("{field}: expected {expected}"));
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not JSON: {e}")))?;
    let serde_json::Value::Object(fields) = value else {
        return Err(ApiError::BadRequest(format!(
            "expected a JSON object with the fields {}",
            FIELDS.join(", ")
        )));
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::BadRequest(format!(
            "{unknown}: unknown field; expected one of {}",
            FIELDS.join(", ")
        )));
    }
    let list = |field: &str| -> Result<Vec<String>, ApiError> {
        match fields.get(field) {
            None | Some(serde_json::Value::Null) => Ok(Vec::new()),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad(field, "a list of names")),
            Some(_) => Err(bad(field, "a list of names")),
        }
    };
    let text = |field: &str, expected: &str| -> Result<Option<String>, ApiError> {
        match fields.get(field) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(t)) => Ok(Some(t.clone())),
            Some(_) => Err(bad(field, expected)),
        }
    };
    let flag = |field: &str| -> Result<bool, ApiError> {
        match fields.get(field) {
            None => Ok(true),
            Some(serde_json::Value::Bool(b)) => Ok(*b),
            Some(_) => Err(bad(field, "true or false")),
        }
    };
    Ok(PlacementPolicy {
        sites: list("sites")?,
        regions: list("regions")?,
        residency: text("residency", "a jurisdiction such as \"eu\"")?,
        budget_per_workflow: text("budget_per_workflow", "an amount such as \"500 USD\"")?
            .map(|b| {
                b.parse::<Money>()
                    .map_err(|e| ApiError::BadRequest(format!("budget_per_workflow: {e}")))
            })
            .transpose()?,
        spot_allowed: flag("spot_allowed")?,
        split_allowed: flag("split_allowed")?,
    })
}

fn tenant_path(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(tenant) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    if !valid_tenant_name(&tenant) {
        return Err(ApiError::BadRequest(format!(
            "invalid tenant {tenant:?} in the path: expected 1 to 63 of a-z, 0-9, '-' and '_'"
        )));
    }
    Ok(tenant)
}

async fn current(intake: &Intake, tenant: String) -> Result<TenantPolicy, ApiError> {
    let loaded = load::<Tenant>(&**intake.log(), tenant_id(&tenant))
        .await
        .map_err(|e| ApiError::from_log("reading the tenant", e))?;
    let policy = loaded.state.policy().cloned();
    Ok(TenantPolicy {
        tenant,
        set: policy.is_some(),
        policy: PolicyDocument::from(&policy.unwrap_or_else(PlacementPolicy::open)),
    })
}

/// The tenant's placement policy.
#[utoipa::path(get, path = "/v1/tenants/{tenant}/policy", tag = "tenants", operation_id = "get_policy",
    params(("tenant" = String, Path, description = "The tenant's name")),
    responses(
        (status = 200, description = "The policy in force", body = TenantPolicy),
        (status = 400, description = "The tenant name is invalid", body = ErrorBody),
    ))]
pub(crate) async fn get_policy(
    State(intake): State<Intake>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TenantPolicy>, ApiError> {
    let tenant = tenant_path(path)?;
    Ok(Json(current(&intake, tenant).await?))
}

/// Replaces the tenant's placement policy (JSON). The stricter of it and a workflow's own
/// `placement` hints applies to every placement from now on; placed work stays put.
#[utoipa::path(put, path = "/v1/tenants/{tenant}/policy", tag = "tenants", operation_id = "set_policy",
    params(("tenant" = String, Path, description = "The tenant's name")),
    request_body(content = PolicyDocument, content_type = "application/json"),
    responses(
        (status = 200, description = "The policy now in force", body = TenantPolicy),
        (status = 400, description = "The policy is invalid; the error names the field", body = ErrorBody),
    ))]
pub(crate) async fn set_policy(
    State(intake): State<Intake>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<TenantPolicy>, ApiError> {
    let tenant = tenant_path(path)?;
    let by = user(&headers)?;
    let bytes = read_body(&headers, body, MAX_POLICY_BYTES).await?;
    let policy = parse_policy(&bytes)?;
    let ctx = EventContext::new_chain(tenant.clone());
    match execute::<Tenant, _>(&**intake.log(), tenant_id(&tenant), &ctx, |_| {
        TenantCommand::SetPolicy {
            tenant: tenant.clone(),
            policy: policy.clone(),
            set_by: by.clone(),
        }
    })
    .await
    {
        Ok(_) => {}
        Err(ExecuteError::Rejected(e @ TenantError::InvalidPolicy { .. })) => {
            return Err(ApiError::BadRequest(e.to_string()))
        }
        Err(ExecuteError::Rejected(e)) => return Err(ApiError::Conflict(e.to_string())),
        Err(ExecuteError::Log(e)) => return Err(ApiError::from_log("recording the policy", e)),
        Err(other) => return Err(ApiError::internal("recording the policy", other)),
    }
    Ok(Json(current(&intake, tenant).await?))
}

// ---------------------------------------------------------------------------------
// Price adjustments: discounts and committed rates, granted and revoked through the API
// like the CLI's `meridian admin discount|committed-rate|revoke-adjustment`.

const MAX_ADJUSTMENT_BYTES: usize = 16 * 1024;

/// A discount or committed rate to grant a tenant. `terms` is
/// `{"kind": "percent_discount", "percent": "10"}` or
/// `{"kind": "committed_rate", "meter": "gpu_hours", "unit_price": "1.80", "currency": "USD"}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    /// Which charges it covers: `site`, `site_kind` and `charge` (compute, storage,
    /// egress) each narrow it; none covers all.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub scope: AdjustmentScope,
    #[schema(value_type = Object)]
    pub terms: AdjustmentTerms,
    /// From when (RFC 3339, UTC); default now, never in the past.
    #[serde(default)]
    pub effective_from: Option<DateTime<Utc>>,
    /// Until when (exclusive); default never.
    #[serde(default)]
    pub effective_until: Option<DateTime<Utc>>,
    /// A contract or ticket reference kept with it.
    #[serde(default)]
    pub reference: Option<String>,
}

/// Ends an adjustment.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    /// When it stops applying (RFC 3339, UTC); default now, never in the past.
    #[serde(default)]
    pub at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// One adjustment as it stands.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdjustmentView {
    pub id: Uuid,
    pub tenant: String,
    #[schema(value_type = Object)]
    pub scope: AdjustmentScope,
    #[schema(value_type = Object)]
    pub terms: AdjustmentTerms,
    /// The terms and scope in words, e.g. `10% off list for site hpc-eu`.
    pub description: String,
    pub effective_from: DateTime<Utc>,
    pub effective_until: Option<DateTime<Utc>>,
    pub granted_by: String,
    pub reference: Option<String>,
}

/// A tenant's adjustments, in grant order.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdjustmentList {
    pub tenant: String,
    pub adjustments: Vec<AdjustmentView>,
}

fn view(tenant: &str, a: &Adjustment) -> AdjustmentView {
    AdjustmentView {
        id: a.id,
        tenant: tenant.to_string(),
        scope: a.scope.clone(),
        terms: a.terms.clone(),
        description: format!("{} for {}", a.terms, a.scope),
        effective_from: a.effective_from,
        effective_until: a.effective_until,
        granted_by: a.granted_by.clone(),
        reference: a.reference.clone(),
    }
}

/// A JSON body of type `T`, or a 400 naming the field at fault.
fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::BadRequest(format!("invalid {what}: {inner}"))
        } else {
            ApiError::BadRequest(format!("{path}: {inner}"))
        }
    })
}

async fn tenant_state(intake: &Intake, tenant: &str) -> Result<Tenant, ApiError> {
    load::<Tenant>(&**intake.log(), tenant_id(tenant))
        .await
        .map(|loaded| loaded.state)
        .map_err(|e| ApiError::from_log("reading the tenant", e))
}

/// What refusing an adjustment command answers: the caller's mistake is a 400, a
/// missing adjustment a 404, one already ended a 409.
fn adjustment_refused(e: ExecuteError<TenantError>) -> ApiError {
    match ApiError::from_execute("recording the adjustment", e) {
        Err(api) => api,
        Ok(TenantError::UnknownAdjustment(id)) => ApiError::NotFound(format!("no adjustment {id}")),
        Ok(e @ TenantError::AlreadyEnded { .. }) => ApiError::Conflict(e.to_string()),
        Ok(e) => ApiError::BadRequest(e.to_string()),
    }
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
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<AdjustmentList>, ApiError> {
    let tenant = tenant_path(path)?;
    let state = tenant_state(&intake, &tenant).await?;
    Ok(Json(AdjustmentList {
        adjustments: state.adjustments().map(|a| view(&tenant, a)).collect(),
        tenant,
    }))
}

/// Grants the tenant a discount or a committed rate, from now or a later time: what was
/// billed is never re-priced.
#[utoipa::path(post, path = "/v1/tenants/{tenant}/adjustments", tag = "tenants", operation_id = "grant_adjustment",
    params(("tenant" = String, Path, description = "The tenant's name", pattern = "^[a-z0-9_-]{1,63}$")),
    request_body(content = GrantRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Granted", body = AdjustmentView),
        (status = 400, description = "The request is invalid; the error names the field", body = ErrorBody),
    ))]
pub(crate) async fn grant_adjustment(
    State(intake): State<Intake>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<AdjustmentView>), ApiError> {
    let tenant = tenant_path(path)?;
    let by = user(&headers)?;
    let bytes = read_body(&headers, body, MAX_ADJUSTMENT_BYTES).await?;
    let request: GrantRequest = json_body(&bytes, "adjustment")?;
    let adjustment_id = Uuid::now_v7();
    let ctx = EventContext::new_chain(tenant.clone());
    execute::<Tenant, _>(&**intake.log(), tenant_id(&tenant), &ctx, |_| {
        TenantCommand::GrantAdjustment {
            tenant: tenant.clone(),
            adjustment_id,
            scope: request.scope.clone(),
            terms: request.terms.clone(),
            effective_from: request.effective_from,
            effective_until: request.effective_until,
            granted_by: by.clone(),
            reference: request.reference.clone(),
        }
    })
    .await
    .map_err(adjustment_refused)?;
    let state = tenant_state(&intake, &tenant).await?;
    let granted = state
        .adjustment(adjustment_id)
        .ok_or_else(|| ApiError::internal("reading the adjustment back", adjustment_id))?;
    Ok((StatusCode::CREATED, Json(view(&tenant, granted))))
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
    ))]
pub(crate) async fn revoke_adjustment(
    State(intake): State<Intake>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<AdjustmentView>, ApiError> {
    let Path((tenant, id)) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let tenant = tenant_path(Ok(Path(tenant)))?;
    let id = Uuid::parse_str(&id).map_err(|_| {
        ApiError::BadRequest(format!("invalid adjustment id {id:?}: expected a UUID"))
    })?;
    let by = user(&headers)?;
    let bytes = read_body(&headers, body, MAX_ADJUSTMENT_BYTES).await?;
    let request: RevokeRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        RevokeRequest::default()
    } else {
        json_body(&bytes, "revocation")?
    };
    let ctx = EventContext::new_chain(tenant.clone());
    execute::<Tenant, _>(&**intake.log(), tenant_id(&tenant), &ctx, |_| {
        TenantCommand::RevokeAdjustment {
            adjustment_id: id,
            effective_at: request.at,
            revoked_by: by.clone(),
            reason: request.reason.clone(),
        }
    })
    .await
    .map_err(adjustment_refused)?;
    let state = tenant_state(&intake, &tenant).await?;
    let revoked = state
        .adjustment(id)
        .ok_or_else(|| ApiError::internal("reading the adjustment back", id))?;
    Ok(Json(view(&tenant, revoked)))
}
