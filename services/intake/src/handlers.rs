//! The handlers of the workflow routes of `/v1`, and what every handler reads the same
//! way: the caller's headers (tenant, user, idempotency key, trace context), bodies
//! within a size limit, ids in paths. Each reads and checks the request, then calls one
//! function of the application layer.

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, Request};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use futures::StreamExt;
use meridian_app::workflows::Submission;
use meridian_app::{Credentials, Principal};
use uuid::Uuid;

use crate::api::{
    Accepted, CancelAccepted, CancelRequest, ErrorBody, EventList, Health, OutputsAccepted,
    WorkflowPage, WorkflowState, WorkflowStatus,
};
use crate::read::ListQuery;
use crate::{ApiError, Intake};

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const IDEMPOTENT_REPLAY: &str = "idempotent-replay";
pub const TENANT: &str = "x-meridian-tenant";
pub const USER: &str = "x-meridian-user";
const TRACEPARENT: &str = "traceparent";

/// The content types a workflow document may be sent as.
pub const WORKFLOW_CONTENT_TYPES: [&str; 4] = [
    "application/yaml",
    "application/x-yaml",
    "text/yaml",
    "application/json",
];

/// The cancel body is one short reason; anything bigger is not a cancel request.
const MAX_CANCEL_BODY: usize = 16 * 1024;
const MAX_CANCEL_REASON: usize = 1000;
const MAX_HEADER_TEXT: usize = 200;
const MAX_LIST_LIMIT: u32 = 500;
const DEFAULT_LIST_LIMIT: u32 = 50;

// ---------------------------------------------------------------------------------
// Input checks shared by the handlers.

/// A header's value as text, `None` when absent; refuses repeats and non-ASCII.
fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::BadRequest(format!(
            "header {name} is given more than once"
        )));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| ApiError::BadRequest(format!("header {name} must be printable ASCII")))
}

/// Printable ASCII, space included, of 1..=`max` characters.
fn printable(value: &str, max: usize) -> bool {
    (1..=max).contains(&value.len()) && value.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

fn valid_tenant(value: &str) -> bool {
    (1..=63).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// The tenant the caller says it acts in, if it says.
fn tenant(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match header_text(headers, TENANT)? {
        None => Ok(None),
        Some(t) if valid_tenant(t) => Ok(Some(t.to_string())),
        Some(t) => Err(ApiError::BadRequest(format!(
            "invalid X-Meridian-Tenant {t:?}: expected 1 to 63 of a-z, 0-9, '-' and '_'"
        ))),
    }
}

fn user(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match header_text(headers, USER)? {
        None => Ok(None),
        Some(u) if printable(u, MAX_HEADER_TEXT) => Ok(Some(u.to_string())),
        Some(_) => Err(ApiError::BadRequest(format!(
            "invalid X-Meridian-User: expected 1 to {MAX_HEADER_TEXT} printable ASCII characters"
        ))),
    }
}

/// The bearer token of `Authorization: Bearer TOKEN`, if there is one.
fn bearer(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = header_text(headers, header::AUTHORIZATION.as_str())? else {
        return Ok(None);
    };
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(ApiError::Unauthenticated(
            "expected Authorization: Bearer TOKEN".into(),
        ));
    }
    Ok(Some(token.trim().to_string()))
}

/// What the request says of its caller: its token, the tenant and user it names, its
/// peer's address.
fn credentials(request: &Request) -> Result<Credentials, ApiError> {
    let headers = request.headers();
    Ok(Credentials {
        bearer: bearer(headers)?,
        tenant: tenant(headers)?,
        user: user(headers)?,
        source: request
            .extensions()
            .get::<ConnectInfo<crate::Peer>>()
            .map(|ConnectInfo(peer)| peer.0.ip().to_string()),
        request: format!("{} {}", request.method(), request.uri().path()),
    })
}

/// What the console needs of the connection: the peer's address (for its audit
/// records, as the API's own routes take it) and whether it is secure (TLS here, or a
/// TLS proxy in front that says `X-Forwarded-Proto: https`).
pub(crate) async fn client_address(mut request: Request, next: Next) -> Response {
    let proxied_tls = request
        .headers()
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"));
    let peer = request
        .extensions()
        .get::<ConnectInfo<crate::Peer>>()
        .map(|ConnectInfo(peer)| *peer);
    request.extensions_mut().insert(meridian_console::Client {
        address: peer.map(|p| p.0.ip().to_string()),
        secure: peer.is_some_and(|p| p.1) || proxied_tls,
    });
    next.run(request).await
}

/// Every route but health goes through here: the application learns who is calling
/// (401 without credentials that hold), and the handler gets the [`Principal`].
pub(crate) async fn authenticate(
    State(intake): State<Intake>,
    mut request: Request,
    next: Next,
) -> Response {
    let found = match credentials(&request) {
        Ok(credentials) => intake.app.authenticate(&credentials).await,
        Err(e) => {
            if matches!(e, ApiError::Unauthenticated(_)) {
                intake
                    .app
                    .refused_unknown(
                        &format!("{} {}", request.method(), request.uri().path()),
                        &e.to_string(),
                    )
                    .await;
            }
            Err(e)
        }
    };
    match found {
        Ok(who) => {
            request.extensions_mut().insert(who);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match header_text(headers, IDEMPOTENCY_KEY)? {
        None => Ok(None),
        Some(k) if printable(k, MAX_HEADER_TEXT) => Ok(Some(k.to_string())),
        Some(_) => Err(ApiError::BadRequest(format!(
            "invalid Idempotency-Key: expected 1 to {MAX_HEADER_TEXT} printable ASCII characters"
        ))),
    }
}

/// A W3C `traceparent` to carry into the events; an invalid one is ignored, as the
/// W3C recommendation says to.
fn traceparent(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(TRACEPARENT)?.to_str().ok()?;
    meridian_ops::trace::parse(value).map(|_| value.trim().to_string())
}

/// The media type of `Content-Type` without parameters, lowercased; `None` if absent.
fn media_type(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        ApiError::UnsupportedMediaType("the Content-Type header is not ASCII".into())
    })?;
    let essence = text.split(';').next().unwrap_or_default().trim();
    Ok(Some(essence.to_ascii_lowercase()))
}

/// Reads the whole body, refusing more than `limit` bytes without reading them all.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large =
        || ApiError::PayloadTooLarge(format!("the request body is larger than {limit} bytes"));
    // A declared length over the limit is refused before reading anything.
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(too_large());
        }
    }
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::BadRequest(format!("the request body could not be read: {e}"))
        })?;
        if buf.len() + chunk.len() > limit {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

pub(crate) fn workflow_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, ApiError> {
    let Path(text) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid workflow id: {}", e.body_text())))?;
    Uuid::parse_str(&text).map_err(|_| {
        ApiError::BadRequest(format!(
            "invalid workflow id {text:?}: expected a UUID such as 0190b6a4-4c1e-7cc3-9a52-4d3f0b1f2e9a"
        ))
    })
}

fn location(id: Uuid) -> HeaderValue {
    HeaderValue::from_str(&format!("/v1/workflows/{id}")).expect("a UUID path is a valid header")
}

// ---------------------------------------------------------------------------------
// POST /v1/workflows

/// Submit a workflow.
///
/// The body is a workflow spec v1 document, YAML or JSON (see
/// `schemas/workflow.schema.json`). An invalid document is answered with every problem
/// found and appends nothing. With an `Idempotency-Key`, a retry with the same key (per
/// tenant) and the same body returns the original workflow with 200 and
/// `Idempotent-Replay: true`, however much later it comes.
#[utoipa::path(
    post,
    path = "/v1/workflows",
    tag = "workflows",
    operation_id = "submit_workflow",
    params(
        ("Idempotency-Key" = Option<String>, Header, pattern = "^[ -~]{1,200}$",
            description = "1 to 200 printable ASCII characters; retries with the same key and body return the original workflow"),
        ("X-Meridian-Tenant" = Option<String>, Header, pattern = "^[a-z0-9_-]{1,63}$",
            description = "The tenant, 1 to 63 of a-z, 0-9, '-', '_'; default `default`"),
        ("X-Meridian-User" = Option<String>, Header, pattern = "^[ -~]{1,200}$",
            description = "Who submits (a user or an agent's name); default `anonymous`"),
    ),
    request_body(
        description = "A workflow spec v1 document (at most 1 MiB). Without Content-Type, JSON is recognised by a leading `{`.",
        content(
            (ref("workflow.schema.json") = "application/yaml"),
            (ref("workflow.schema.json") = "application/x-yaml"),
            (ref("workflow.schema.json") = "text/yaml"),
            (ref("workflow.schema.json") = "application/json"),
        ),
    ),
    responses(
        (status = 202, description = "Accepted: the workflow was submitted", body = Accepted,
            headers(("Location" = String, description = "The workflow's status URL"))),
        (status = 200, description = "An idempotent replay: the workflow first submitted with this key", body = Accepted,
            headers(
                ("Location" = String, description = "The workflow's status URL"),
                ("Idempotent-Replay" = String, description = "`true`"),
            )),
        (status = 400, description = "Invalid workflow (every problem in `errors`) or invalid header", body = ErrorBody),
        (status = 402, description = "Over the tenant's monthly budget: the message has the budget, what is billed and in flight, and the estimate", body = ErrorBody),
        (status = 413, description = "The document is larger than 1 MiB", body = ErrorBody),
        (status = 415, description = "Unsupported Content-Type", body = ErrorBody),
        (status = 422, description = "The idempotency key was used with a different body", body = ErrorBody),
        (status = 503, description = "The event log or database is unavailable; retry with the same key", body = ErrorBody),
    )
)]
pub(crate) async fn submit(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let json = match media_type(&headers)? {
        None => false,
        Some(t) if t == "application/json" => true,
        Some(t) if WORKFLOW_CONTENT_TYPES.contains(&t.as_str()) => false,
        Some(t) => {
            return Err(ApiError::UnsupportedMediaType(format!(
                "unsupported content type {t:?}: send the workflow as {}",
                WORKFLOW_CONTENT_TYPES.join(", ")
            )))
        }
    };
    let key = idempotency_key(&headers)?;
    let bytes = read_body(&headers, body, meridian_spec::MAX_DOCUMENT_BYTES).await?;
    let document = String::from_utf8(bytes.to_vec())
        .map_err(|e| ApiError::BadRequest(format!("the body is not UTF-8 text: {e}")))?;
    let submitted = intake
        .app
        .submit(
            &who,
            Submission {
                document,
                declared_json: json,
                idempotency_key: key,
                traceparent: traceparent(&headers),
            },
        )
        .await?;
    let id = submitted.accepted.id;
    if submitted.replayed {
        return Ok((
            StatusCode::OK,
            [
                (header::LOCATION, location(id)),
                (
                    header::HeaderName::from_static(IDEMPOTENT_REPLAY),
                    HeaderValue::from_static("true"),
                ),
            ],
            Json(submitted.accepted),
        )
            .into_response());
    }
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location(id))],
        Json(submitted.accepted),
    )
        .into_response())
}

// ---------------------------------------------------------------------------------
// GET /v1/workflows/{id}

/// A workflow's status.
///
/// From the status read model; a workflow accepted moments ago and not yet projected is
/// answered from the log, with less detail (no runs yet).
#[utoipa::path(
    get,
    path = "/v1/workflows/{id}",
    tag = "workflows",
    operation_id = "get_workflow",
    params(("id" = Uuid, Path, description = "The workflow's id")),
    responses(
        (status = 200, description = "The workflow's status", body = WorkflowStatus),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
    )
)]
pub(crate) async fn status(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<WorkflowStatus>, ApiError> {
    let id = workflow_id(path)?;
    Ok(Json(intake.app.status(&who, id).await?))
}

// ---------------------------------------------------------------------------------
// GET /v1/workflows

/// List workflows, newest first.
///
/// Keyset-paged: pass the page's `next` as `after` to get the following page. Reads
/// the status read model, which may lag the log by a moment.
#[utoipa::path(
    get,
    path = "/v1/workflows",
    tag = "workflows",
    operation_id = "list_workflows",
    params(
        ("state" = Option<WorkflowState>, Query, description = "Only workflows in this state"),
        ("tenant" = Option<String>, Query, pattern = "^[a-z0-9_-]{1,63}$", description = "Only this tenant's workflows"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "Page size, 1 to 500; default 50"),
        ("after" = Option<Uuid>, Query, description = "The `next` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of workflows", body = WorkflowPage),
        (status = 400, description = "A query parameter is invalid or unknown", body = ErrorBody),
    )
)]
pub(crate) async fn list(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<WorkflowPage>, ApiError> {
    let Query(pairs) =
        query.map_err(|e| ApiError::BadRequest(format!("invalid query: {}", e.body_text())))?;
    let mut params: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in pairs {
        if !["state", "tenant", "limit", "after"].contains(&name.as_str()) {
            return Err(ApiError::BadRequest(format!(
                "unknown query parameter {name:?}: accepted are state, tenant, limit, after"
            )));
        }
        if params.insert(name.clone(), value).is_some() {
            return Err(ApiError::BadRequest(format!(
                "query parameter {name} is given more than once"
            )));
        }
    }
    let state = match params.get("state") {
        None => None,
        Some(s) => Some(WorkflowState::parse(s).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "invalid state {s:?}: expected one of {}",
                WorkflowState::names()
            ))
        })?),
    };
    let tenant = match params.get("tenant") {
        None => None,
        Some(t) if valid_tenant(t) => Some(t.clone()),
        Some(t) => {
            return Err(ApiError::BadRequest(format!(
                "invalid tenant {t:?}: expected 1 to 63 of a-z, 0-9, '-' and '_'"
            )))
        }
    };
    let limit = match params.get("limit") {
        None => DEFAULT_LIST_LIMIT,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=MAX_LIST_LIMIT).contains(l))
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "invalid limit {l:?}: expected an integer from 1 to {MAX_LIST_LIMIT}"
                ))
            })?,
    };
    let after = match params.get("after") {
        None => None,
        Some(a) => Some(Uuid::parse_str(a).map_err(|_| {
            ApiError::BadRequest(format!(
                "invalid after {a:?}: expected a workflow id (the `next` of the previous page)"
            ))
        })?),
    };
    let q = ListQuery {
        state,
        tenant,
        limit,
        after,
    };
    Ok(Json(intake.app.list(&who, &q).await?))
}

// ---------------------------------------------------------------------------------
// POST /v1/workflows/{id}/cancel

/// Cancel a workflow.
///
/// Releases nothing more and stops running jobs; the workflow ends `cancelled` once the
/// last running job settles (at once when nothing runs). Asking again while it is being
/// cancelled is accepted and changes nothing.
#[utoipa::path(
    post,
    path = "/v1/workflows/{id}/cancel",
    tag = "workflows",
    operation_id = "cancel_workflow",
    params(
        ("id" = Uuid, Path, description = "The workflow's id"),
        ("X-Meridian-User" = Option<String>, Header, pattern = "^[ -~]{1,200}$", description = "Who cancels; default `anonymous`"),
    ),
    request_body(content = Option<CancelRequest>, content_type = "application/json",
        description = "Optional; `{\"reason\": \"...\"}`"),
    responses(
        (status = 202, description = "Cancel accepted", body = CancelAccepted),
        (status = 400, description = "Invalid id or body", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow already finished, failed or was cancelled", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
        (status = 415, description = "The body is not JSON", body = ErrorBody),
    )
)]
pub(crate) async fn cancel(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<CancelAccepted>), ApiError> {
    let id = workflow_id(path)?;
    let request = cancel_request(&headers, body).await?;
    let accepted = intake
        .app
        .cancel(&who, id, request.reason, traceparent(&headers))
        .await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

// ---------------------------------------------------------------------------------
// POST /v1/workflows/{id}/volumes/{volume}/export and /release

/// The workflow id and volume name of a kept-outputs path.
fn workflow_volume(
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(Uuid, String), ApiError> {
    let Path((id, volume)) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid path: {}", e.body_text())))?;
    let id = workflow_id(Ok(Path(id)))?;
    let valid = !volume.is_empty()
        && volume.len() <= 63
        && volume
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(ApiError::BadRequest(format!(
            "invalid volume name {volume:?}: expected 1 to 63 letters, digits, \"-\" or \"_\""
        )));
    }
    Ok((id, volume))
}

/// Copy out again a volume's outputs kept after their copy out failed.
///
/// The workflow failed because its outputs could not be copied out; they were kept at
/// the site. This copies them out again (the workflow stays `failed`); once out, they are
/// given back. Researchers of the workflow's tenant and admins may.
#[utoipa::path(
    post,
    path = "/v1/workflows/{id}/volumes/{volume}/export",
    tag = "workflows",
    operation_id = "retry_egress",
    params(
        ("id" = Uuid, Path, description = "The workflow's id"),
        ("volume" = String, Path, pattern = "^[A-Za-z0-9_-]{1,63}$", description = "The volume's name"),
    ),
    responses(
        (status = 202, description = "Copying out again", body = OutputsAccepted),
        (status = 400, description = "Invalid id or volume name", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "No outputs of that volume are kept after a failed copy out", body = ErrorBody),
    )
)]
pub(crate) async fn retry_egress(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(StatusCode, Json<OutputsAccepted>), ApiError> {
    let (id, volume) = workflow_volume(path)?;
    let accepted = intake.app.retry_egress(&who, id, &volume).await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

/// Give back a volume's outputs kept after their copy out failed.
///
/// Their storage stops being billed and nothing will copy them out. Admins only.
#[utoipa::path(
    post,
    path = "/v1/workflows/{id}/volumes/{volume}/release",
    tag = "workflows",
    operation_id = "release_outputs",
    params(
        ("id" = Uuid, Path, description = "The workflow's id"),
        ("volume" = String, Path, pattern = "^[A-Za-z0-9_-]{1,63}$", description = "The volume's name"),
    ),
    responses(
        (status = 200, description = "Given back", body = OutputsAccepted),
        (status = 400, description = "Invalid id or volume name", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "No outputs of that volume are kept after a failed copy out", body = ErrorBody),
    )
)]
pub(crate) async fn release_outputs(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<OutputsAccepted>, ApiError> {
    let (id, volume) = workflow_volume(path)?;
    Ok(Json(intake.app.release_outputs(&who, id, &volume).await?))
}

async fn cancel_request(headers: &HeaderMap, body: Body) -> Result<CancelRequest, ApiError> {
    let bytes = read_body(headers, body, MAX_CANCEL_BODY).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(CancelRequest::default());
    }
    match media_type(headers)? {
        None => {}
        Some(t) if t == "application/json" => {}
        Some(t) => {
            return Err(ApiError::UnsupportedMediaType(format!(
                "unsupported content type {t:?}: send the cancel request as application/json"
            )))
        }
    }
    let invalid = |why: String| {
        ApiError::BadRequest(format!(
            "invalid cancel request: {why}; expected {{\"reason\": \"...\"}}"
        ))
    };
    // Through a Value first: serde would also read a struct from a JSON array.
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    // JSON `null` is no request, as an empty body is.
    if value.is_null() {
        return Ok(CancelRequest::default());
    }
    if !value.is_object() {
        return Err(invalid("not a JSON object".into()));
    }
    let request: CancelRequest =
        serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
    if let Some(reason) = &request.reason {
        if reason.chars().count() > MAX_CANCEL_REASON {
            return Err(ApiError::BadRequest(format!(
                "invalid cancel request: reason is longer than {MAX_CANCEL_REASON} characters"
            )));
        }
    }
    Ok(request)
}

// ---------------------------------------------------------------------------------
// GET /v1/workflows/{id}/events

/// A workflow's events and its jobs'.
///
/// The Workflow aggregate's history merged with the history of every Job aggregate it
/// released, ordered by `occurred_at`, then aggregate, then sequence.
#[utoipa::path(
    get,
    path = "/v1/workflows/{id}/events",
    tag = "workflows",
    operation_id = "workflow_events",
    params(("id" = Uuid, Path, description = "The workflow's id")),
    responses(
        (status = 200, description = "The events", body = EventList),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
    )
)]
pub(crate) async fn events(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<EventList>, ApiError> {
    let id = workflow_id(path)?;
    Ok(Json(intake.app.events(&who, id).await?))
}

// ---------------------------------------------------------------------------------
// GET /v1/health

/// Liveness, with the log's head and how far the status read model has reached.
#[utoipa::path(
    get,
    path = "/v1/health",
    tag = "service",
    operation_id = "health",
    responses(
        (status = 200, description = "The service, its log and its database answer", body = Health),
        (status = 503, description = "The log or the database does not answer", body = ErrorBody),
    )
)]
pub(crate) async fn health(State(intake): State<Intake>) -> Result<Json<Health>, ApiError> {
    Ok(Json(intake.app.health().await?))
}

// ---------------------------------------------------------------------------------
// Fallbacks: JSON for unknown routes and wrong methods too.

pub(crate) async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("method {method} is not allowed on {}", uri.path()))
}

// ---------------------------------------------------------------------------------
// Runs reporting themselves (a cloud instance's bootstrap).

const MAX_RUN_REPORT_BODY: usize = 4 * 1024;
/// Output is kept to its last 1 MiB a stream; a little more is read so a tail cut
/// inside a character still fills it.
const MAX_RUN_OUTPUT_BODY: usize = (1 << 20) + 16;

/// A run reports its start, its output or its end, with its own run credential
/// (`mer_run_…`): the cloud sites' instances call this; nothing else may.
#[utoipa::path(
    post,
    path = "/v1/runs/{job}/report",
    tag = "runs",
    operation_id = "report_run",
    params(("job" = Uuid, Path, description = "The run's job id (MERIDIAN_JOB_ID on its machine)")),
    request_body(content = meridian_app::runs::RunReportBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Kept", body = meridian_app::runs::RunReportKept),
        (status = 400, description = "The body or the job id is invalid; the error says which", body = ErrorBody),
        (status = 401, description = "Not this run's credential", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
    )
)]
pub(crate) async fn report_run(
    State(intake): State<Intake>,
    path: Result<Path<String>, PathRejection>,
    request: Request,
) -> Result<Json<meridian_app::runs::RunReportKept>, ApiError> {
    let who = credentials(&request)?;
    let Path(text) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid job id: {}", e.body_text())))?;
    let job = run_id(&text)?;
    let headers = request.headers().clone();
    let bytes = read_body(&headers, request.into_body(), MAX_RUN_REPORT_BODY).await?;
    intake.app.report_run(&who, job, &bytes).await?;
    Ok(Json(meridian_app::runs::RunReportKept { job }))
}

fn run_id(path: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(path).map_err(|_| {
        ApiError::BadRequest(format!(
            "invalid job id {path:?}: expected a UUID such as 0190b6a4-4c1e-7cc3-9a52-4d3f0b1f2e9a"
        ))
    })
}

/// A run sends the tail of its output on one stream (`stdout` or `stderr`), as plain
/// text; each send replaces the last. Only its own run credential may.
#[utoipa::path(
    put,
    path = "/v1/runs/{job}/output/{stream}",
    tag = "runs",
    operation_id = "report_run_output",
    params(
        ("job" = Uuid, Path, description = "The run's job id (MERIDIAN_JOB_ID on its machine)"),
        ("stream" = inline(meridian_app::formats::schema::OutputStream), Path, description = "`stdout` or `stderr`"),
    ),
    request_body(content = String, content_type = "text/plain", description = "The stream's last 1 MiB"),
    responses(
        (status = 200, description = "Kept", body = meridian_app::runs::RunReportKept),
        (status = 400, description = "The job id or the stream is invalid", body = ErrorBody),
        (status = 401, description = "Not this run's credential", body = ErrorBody),
        (status = 413, description = "More than 1 MiB", body = ErrorBody),
    )
)]
pub(crate) async fn report_run_output(
    State(intake): State<Intake>,
    path: Result<Path<(String, String)>, PathRejection>,
    request: Request,
) -> Result<Json<meridian_app::runs::RunReportKept>, ApiError> {
    let who = credentials(&request)?;
    let Path((job, stream)) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid path: {}", e.body_text())))?;
    let job = run_id(&job)?;
    let headers = request.headers().clone();
    let bytes = read_body(&headers, request.into_body(), MAX_RUN_OUTPUT_BODY).await?;
    intake
        .app
        .report_run_output(&who, job, &stream, &bytes)
        .await?;
    Ok(Json(meridian_app::runs::RunReportKept { job }))
}
