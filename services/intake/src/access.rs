//! The access routes: API tokens (issue, list, revoke) and the audit trail, admins only,
//! through the application layer.

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use meridian_app::audit::{AuditList, AuditQuery};
use meridian_app::auth::{IssuedTokenSecret, TokenList, TokenRequest, TokenView};
use meridian_app::formats::json_body;
use meridian_app::Principal;
use std::collections::BTreeMap;
use uuid::Uuid;

use crate::api::ErrorBody;
use crate::handlers::read_body;
use crate::{ApiError, Intake};

const MAX_TOKEN_BODY: usize = 16 * 1024;
const MAX_AUDIT_LIMIT: u32 = 1000;

/// Issues an API token. Its value is in this answer only: Meridian keeps its hash.
#[utoipa::path(post, path = "/v1/tokens", tag = "access", operation_id = "issue_token",
    request_body(content = TokenRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Issued; `token` is shown this once", body = IssuedTokenSecret),
        (status = 400, description = "The request is invalid; the error says which field", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
    ))]
pub(crate) async fn issue(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<IssuedTokenSecret>), ApiError> {
    let bytes = read_body(&headers, body, MAX_TOKEN_BODY).await?;
    let request: TokenRequest = json_body(&bytes, "token request")?;
    let issued = intake.app().issue_token(&who, request).await?;
    Ok((StatusCode::CREATED, Json(issued)))
}

/// Every token issued, revoked ones too; never their values.
#[utoipa::path(get, path = "/v1/tokens", tag = "access", operation_id = "list_tokens",
    responses((status = 200, description = "The tokens, oldest first", body = TokenList)))]
pub(crate) async fn list(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
) -> Result<Json<TokenList>, ApiError> {
    Ok(Json(intake.app().list_tokens(&who).await?))
}

/// Revokes a token: it is refused from now on.
#[utoipa::path(post, path = "/v1/tokens/{id}/revoke", tag = "access", operation_id = "revoke_token",
    params(("id" = Uuid, Path, description = "The token's id")),
    responses(
        (status = 200, description = "Revoked", body = TokenView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such token", body = ErrorBody),
        (status = 409, description = "Already revoked", body = ErrorBody),
    ))]
pub(crate) async fn revoke(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TokenView>, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let id = Uuid::parse_str(&id)
        .map_err(|_| ApiError::BadRequest(format!("invalid token id {id:?}: expected a UUID")))?;
    Ok(Json(intake.app().revoke_token(&who, id, None).await?))
}

/// The audit trail: every write and every refused request, oldest first.
#[utoipa::path(get, path = "/v1/audit", tag = "access", operation_id = "audit",
    params(
        ("tenant" = Option<String>, Query, pattern = "^[a-z0-9_-]{1,63}$", description = "Only this tenant's records"),
        ("since" = Option<DateTime<Utc>>, Query, description = "Only records at or after this time (RFC 3339)"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "At most this many (default 100, at most 1000)"),
    ),
    responses(
        (status = 200, description = "The records", body = AuditList),
        (status = 400, description = "A query parameter is invalid", body = ErrorBody),
    ))]
pub(crate) async fn audit(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    query: Result<Query<BTreeMap<String, String>>, QueryRejection>,
) -> Result<Json<AuditList>, ApiError> {
    let Query(params) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let mut q = AuditQuery {
        limit: 100,
        ..AuditQuery::default()
    };
    for (name, value) in params {
        match name.as_str() {
            "tenant" => {
                meridian_app::tenants::check_tenant_path(&value)?;
                q.tenant = Some(value);
            }
            "since" => {
                q.since = Some(
                    DateTime::parse_from_rfc3339(&value)
                        .map_err(|_| {
                            ApiError::BadRequest(format!(
                                "since: expected an RFC 3339 time such as 2026-12-01T00:00:00Z, got {value:?}"
                            ))
                        })?
                        .with_timezone(&Utc),
                );
            }
            "limit" => {
                q.limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_AUDIT_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "limit: expected 1 to {MAX_AUDIT_LIMIT}, got {value:?}"
                        ))
                    })?;
            }
            other => {
                return Err(ApiError::BadRequest(format!(
                    "unknown query parameter {other:?}: accepted are tenant, since, limit"
                )))
            }
        }
    }
    Ok(Json(intake.app().audit_trail(&who, &q).await?))
}
