//! Meridian's web console: server-rendered pages over the application layer, for
//! researchers (their workflows, submit with live validation and quotes, cancel),
//! admins (sites, drain, why work runs where, tenants and tokens) and finance (a month's
//! bills, charts, the FOCUS export). A browser signs in with an API token, kept in an
//! HTTP-only, same-site cookie; every page acts as that token's caller, so it shows and
//! does exactly what the API lets that caller do. Pages are HTML first (readable without
//! JavaScript); the embedded htmx adds live validation and refreshes while work runs.
//! Every asset is in the binary: nothing is fetched from elsewhere at run time.
//!
//! See ADR 0014 for why server-rendered pages, and `docs/console.md`.

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use meridian_app::App;

mod chart;
mod finance;
mod layout;
mod locate;
mod session;
mod sites;
mod tenants;
mod workflows;

pub use locate::line_of;
pub use session::COOKIE;

/// The console's state: the application it calls.
#[derive(Clone)]
pub(crate) struct Console {
    app: App,
}

/// The console's pages at `/`, for the API's router (outside its token layer: the
/// console reads its caller from the sign-in cookie). The API adds the peer's address
/// to each request as a [`ClientAddress`] extension, for the audit trail.
pub fn router(app: App) -> Router {
    let console = Console { app };
    let signed_in = Router::new()
        .route("/workflows", get(workflows::list))
        .route(
            "/workflows/new",
            get(workflows::new_form).post(workflows::submit),
        )
        .route("/workflows/new/check", post(workflows::check))
        .route("/workflows/{id}", get(workflows::detail))
        .route("/workflows/{id}/cancel", post(workflows::cancel))
        .route("/sites", get(sites::list))
        .route("/sites/{name}/drain", post(sites::drain))
        .route("/sites/{name}/undrain", post(sites::undrain))
        .route("/tenants", get(tenants::list))
        .route("/finance", get(finance::month))
        .route("/finance/focus.csv", get(finance::focus_csv))
        .route_layer(from_fn_with_state(console.clone(), session::signed_in));
    Router::new()
        .route("/", get(session::home))
        .route(
            "/sign-in",
            get(session::sign_in_form).post(session::sign_in),
        )
        .route("/sign-out", post(session::sign_out))
        .route("/assets/htmx.min.js", get(htmx))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
        .merge(signed_in)
        .layer(axum::middleware::from_fn(same_origin))
        .with_state(console)
}

/// The peer's address, as the transport saw it, for the audit trail.
#[derive(Debug, Clone)]
pub struct ClientAddress(pub String);

const HTMX: &str = include_str!("../assets/htmx.min.js");
const CSS: &str = include_str!("../assets/console.css");
const JS: &str = include_str!("../assets/console.js");

async fn htmx() -> Response {
    asset(HTMX, "text/javascript; charset=utf-8")
}

async fn js() -> Response {
    asset(JS, "text/javascript; charset=utf-8")
}

async fn css() -> Response {
    asset(CSS, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=3600"),
            ),
        ],
        body,
    )
        .into_response()
}

/// Refuses a form posted from another site. The cookie is `SameSite=Strict` already,
/// so a browser would not send it; this also covers browsers that ignore that. Every
/// page also forbids being framed by another site.
async fn same_origin(request: Request, next: Next) -> Response {
    if request.method() == axum::http::Method::POST {
        let headers = request.headers();
        let cross_site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == "cross-site");
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let foreign_origin = match (headers.get(header::ORIGIN), host) {
            (Some(origin), Some(host)) => origin.to_str().map_or(true, |o| {
                o.split_once("://").map(|(_, rest)| rest) != Some(host)
            }),
            _ => false,
        };
        if cross_site || foreign_origin {
            return layout::refusal(
                axum::http::StatusCode::FORBIDDEN,
                None,
                "This form was sent from another site; the console takes forms from its own pages only.",
            );
        }
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
        ),
    );
    response
}
