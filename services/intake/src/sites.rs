//! The site routes: list the sites, apply a catalogue document, drain and undrain, cordon
//! and uncordon a device, and quote a workflow against the live catalogue, each through the application layer.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Extension;
use axum::Json;
use meridian_app::sites::{
    AppliedCatalog, CordonRequest, DrainRequest, Quote, SiteList, SiteState,
};

use crate::api::ErrorBody;
use crate::handlers::read_body;
use crate::{ApiError, Intake};
use meridian_app::Principal;

/// The largest catalogue document taken in one request.
const MAX_CATALOG_BYTES: usize = 4 * 1024 * 1024;

fn body_text(bytes: &[u8]) -> Result<&str, ApiError> {
    std::str::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("the body is not UTF-8 text: {e}")))
}

fn site_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(name) =
        path.map_err(|e| ApiError::BadRequest(format!("invalid site name: {}", e.body_text())))?;
    Ok(name)
}

/// The sites in the catalogue, with their state, whether an adapter serves them, their
/// shapes and the prices in force.
#[utoipa::path(get, path = "/v1/sites", tag = "sites", operation_id = "list_sites",
    responses((status = 200, description = "Every site", body = SiteList)))]
pub(crate) async fn list(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
) -> Result<Json<SiteList>, ApiError> {
    Ok(Json(intake.app().sites(&who).await?))
}

/// Registers or updates the sites a catalogue document describes (YAML or JSON; the
/// format of `catalog/reference.yaml`). Sites it does not name are left as they are.
#[utoipa::path(put, path = "/v1/sites", tag = "sites", operation_id = "apply_catalog",
    request_body(
        description = "A catalogue document (YAML or JSON, at most 4 MiB): its shape is in `catalog.schema.json`; amounts, sizes and references between its fields are checked when it is read",
        content(
            (ref("catalog.schema.json") = "application/yaml"),
            (ref("catalog.schema.json") = "application/json"),
        ),
    ),
    responses(
        (status = 200, description = "What changed, per site", body = AppliedCatalog),
        (status = 400, description = "The document is invalid; the error names the field", body = ErrorBody),
        (status = 409, description = "A site in the document cannot take the change", body = ErrorBody),
        (status = 413, description = "The document is larger than 4 MiB", body = ErrorBody),
    ))]
pub(crate) async fn apply(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<AppliedCatalog>, ApiError> {
    let bytes = read_body(&headers, body, MAX_CATALOG_BYTES).await?;
    Ok(Json(
        intake.app().apply_catalog(&who, body_text(&bytes)?).await?,
    ))
}

/// Takes a site out of placement; work already there carries on.
#[utoipa::path(post, path = "/v1/sites/{name}/drain", tag = "sites", operation_id = "drain_site",
    params(("name" = String, Path, description = "The site's name")),
    request_body(content = Option<DrainRequest>, content_type = "application/json"),
    responses(
        (status = 200, description = "Drained", body = SiteState),
        (status = 400, description = "The body is not a drain request", body = ErrorBody),
        (status = 404, description = "No such site", body = ErrorBody),
        (status = 409, description = "Already drained", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
    ))]
pub(crate) async fn drain(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<SiteState>, ApiError> {
    let bytes = read_body(&headers, body, 64 * 1024).await?;
    // No body and JSON `null` are no request.
    let request: DrainRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        DrainRequest::default()
    } else {
        meridian_app::formats::json_body::<Option<DrainRequest>>(&bytes, "drain request")?
            .unwrap_or_default()
    };
    let name = site_name(path)?;
    Ok(Json(intake.app().drain(&who, &name, request.reason).await?))
}

fn site_and_device(
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(String, String), ApiError> {
    let Path(pair) = path.map_err(|e| {
        ApiError::BadRequest(format!("invalid site or device name: {}", e.body_text()))
    })?;
    Ok(pair)
}

/// Takes one of a site's devices (a GPU, by the id `GET /v1/sites` lists) out of its
/// work: new jobs get other devices; a job already on it carries on.
#[utoipa::path(post, path = "/v1/sites/{name}/devices/{device}/cordon", tag = "sites", operation_id = "cordon_device",
    params(
        ("name" = String, Path, description = "The site's name"),
        ("device" = String, Path, description = "The device's id, e.g. GPU-0b6ae4e2-…"),
    ),
    request_body(content = CordonRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Cordoned", body = SiteState),
        (status = 400, description = "The body is not a cordon request with a reason", body = ErrorBody),
        (status = 404, description = "No such site, or the site reported no such device", body = ErrorBody),
        (status = 409, description = "Already cordoned", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
    ))]
pub(crate) async fn cordon(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<SiteState>, ApiError> {
    let bytes = read_body(&headers, body, 64 * 1024).await?;
    let request: CordonRequest = meridian_app::formats::json_body(&bytes, "cordon request")?;
    let (name, device) = site_and_device(path)?;
    Ok(Json(
        intake
            .app()
            .cordon_device(&who, &name, &device, &request.reason)
            .await?,
    ))
}

/// Gives a cordoned device back to its site's work; one whose health check still finds
/// a fault is cordoned again at the next check.
#[utoipa::path(post, path = "/v1/sites/{name}/devices/{device}/uncordon", tag = "sites", operation_id = "uncordon_device",
    params(
        ("name" = String, Path, description = "The site's name"),
        ("device" = String, Path, description = "The device's id"),
    ),
    responses(
        (status = 200, description = "Back in use", body = SiteState),
        (status = 404, description = "No such site", body = ErrorBody),
        (status = 409, description = "Not cordoned", body = ErrorBody),
    ))]
pub(crate) async fn uncordon(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<SiteState>, ApiError> {
    let (name, device) = site_and_device(path)?;
    Ok(Json(
        intake.app().uncordon_device(&who, &name, &device).await?,
    ))
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
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<SiteState>, ApiError> {
    let name = site_name(path)?;
    Ok(Json(intake.app().undrain(&who, &name).await?))
}

/// Asks the site's adapter to read its shapes' figures (CPUs, memory, GPUs) from the
/// provider again; it does at its next heartbeat, and `GET /v1/sites` shows the outcome
/// under `shapes_refresh`.
#[utoipa::path(post, path = "/v1/sites/{name}/refresh", tag = "sites", operation_id = "refresh_site_shapes",
    params(("name" = String, Path, description = "The site's name")),
    responses(
        (status = 202, description = "Asked; the adapter does it at its next heartbeat", body = SiteState),
        (status = 404, description = "No such site", body = ErrorBody),
    ))]
pub(crate) async fn refresh(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
) -> Result<(axum::http::StatusCode, Json<SiteState>), ApiError> {
    let name = site_name(path)?;
    Ok((
        axum::http::StatusCode::ACCEPTED,
        Json(intake.app().refresh_shapes(&who, &name).await?),
    ))
}

/// Prices a workflow at every site of the live catalogue, without submitting it, under
/// the placement policy of the tenant in `X-Meridian-Tenant`.
#[utoipa::path(post, path = "/v1/quotes", tag = "sites", operation_id = "quote",
    params(
        ("X-Meridian-Tenant" = Option<String>, Header, pattern = "^[a-z0-9_-]{1,63}$",
            description = "The tenant whose policy applies, 1 to 63 of a-z, 0-9, '-', '_'; default the caller's"),
    ),
    request_body(
        description = "A workflow spec v1 document (at most 1 MiB)",
        content(
            (ref("workflow.schema.json") = "application/yaml"),
            (ref("workflow.schema.json") = "application/x-yaml"),
            (ref("workflow.schema.json") = "text/yaml"),
            (ref("workflow.schema.json") = "application/json"),
        ),
    ),
    responses(
        (status = 200, description = "The cheapest site and every candidate", body = Quote),
        (status = 400, description = "The workflow is invalid; every error with its path", body = ErrorBody),
        (status = 413, description = "The document is larger than 1 MiB", body = ErrorBody),
    ))]
pub(crate) async fn quote(
    State(intake): State<Intake>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Quote>, ApiError> {
    let bytes = read_body(&headers, body, meridian_spec::MAX_DOCUMENT_BYTES).await?;
    let spec = meridian_spec::parse(body_text(&bytes)?)?;
    Ok(Json(intake.app().quote(&who, &spec).await?))
}
