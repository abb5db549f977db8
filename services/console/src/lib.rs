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
/// console reads its caller from the sign-in cookie). The API adds what it knows of the
/// connection to each request as a [`Client`] extension.
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

/// What the transport knows of the connection: the peer's address (for the audit
/// trail) and whether the browser reached the API securely (the sign-in cookie is then
/// `Secure`).
#[derive(Debug, Clone, Default)]
pub struct Client {
    pub address: Option<String>,
    pub secure: bool,
}

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

/// Refuses a form posted from anywhere but the console's own pages: from another site,
/// and from another port of the same host (which the same-site cookie does not keep
/// out). Browsers say where a request comes from with `Sec-Fetch-Site` or `Origin`; a
/// client that sends neither is not a browser acting for someone else. Every answer
/// forbids framing, caching of signed-in pages, and content-type sniffing.
async fn same_origin(request: Request, next: Next) -> Response {
    if request.method() == axum::http::Method::POST && !from_own_page(request.headers()) {
        return layout::refusal(
            axum::http::StatusCode::FORBIDDEN,
            None,
            "This form was sent from another page than the console's own; the console takes forms from its own pages only.",
        );
    }
    let asset = request.uri().path().starts_with("/assets/");
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !asset {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// Whether a form comes from the console's own pages.
fn from_own_page(headers: &axum::http::HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        return site == "same-origin" || site == "none";
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Some(origin) = origin.to_str().ok().and_then(|o| o.split_once("://")) else {
        return false;
    };
    // Behind a TLS proxy the browser's host is the proxy's: the one it forwards.
    let host = text("x-forwarded-host").or(text(header::HOST.as_str()));
    host.is_some_and(|h| origin.1.eq_ignore_ascii_case(h))
}

#[cfg(test)]
mod tests {
    use super::from_own_page;
    use axum::http::HeaderMap;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn forms_from_elsewhere_are_told_apart() {
        assert!(from_own_page(&headers(&[(
            "sec-fetch-site",
            "same-origin"
        )])));
        // Another port of the same host is same-site, not same-origin.
        assert!(!from_own_page(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(!from_own_page(&headers(&[(
            "sec-fetch-site",
            "cross-site"
        )])));
        assert!(from_own_page(&headers(&[
            ("origin", "http://127.0.0.1:7373"),
            ("host", "127.0.0.1:7373")
        ])));
        assert!(from_own_page(&headers(&[
            ("origin", "https://Meridian.example"),
            ("host", "meridian.example")
        ])));
        assert!(!from_own_page(&headers(&[
            ("origin", "http://127.0.0.1:8000"),
            ("host", "127.0.0.1:7373")
        ])));
        // An origin with nothing to compare it with is refused, not let through.
        assert!(!from_own_page(&headers(&[(
            "origin",
            "http://127.0.0.1:7373"
        )])));
        assert!(!from_own_page(&headers(&[
            ("origin", "null"),
            ("host", "x")
        ])));
        assert!(from_own_page(&headers(&[
            ("origin", "https://meridian.example.org"),
            ("host", "10.0.0.5:7373"),
            ("x-forwarded-host", "meridian.example.org")
        ])));
        // Not a browser: no cookie would be sent for someone else.
        assert!(from_own_page(&headers(&[])));
    }
}
