//! A tenant's placement policy through the API: where its work may run, whatever its
//! workflows ask. Setting it is a command on the Tenant aggregate, like the CLI's
//! `meridian admin policy set`; the router applies it to every placement after it.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use meridian_eventlog::aggregates::{execute, load, ExecuteError};
use meridian_events::aggregate::tenant::valid_tenant_name;
use meridian_events::aggregate::{tenant_id, Tenant, TenantCommand, TenantError};
use meridian_events::vocabulary::tenant::PlacementPolicy;
use meridian_events::{EventContext, Money};
use serde::{Deserialize, Serialize};

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
#[derive(Debug, Serialize, utoipa::ToSchema)]
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
