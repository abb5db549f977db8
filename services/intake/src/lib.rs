//! Meridian's intake: the federation API under `/v1`, an HTTP transport over the
//! application layer (`meridian-app`): each handler reads the request (path, query,
//! headers, body), builds the caller's [`Principal`] from its headers, calls one
//! application function, and renders what it answers. The OpenAPI document is generated
//! from the handlers and the application's types ([`openapi_json`]).
//!
//! ```no_run
//! # async fn demo(log: std::sync::Arc<dyn meridian_eventlog::EventLog>, store: meridian_store::Store) {
//! let intake = meridian_intake::Intake::new(log, store);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! meridian_intake::serve(intake, listener, std::future::pending()).await.unwrap();
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;

use axum::routing::{get, post, put};
use axum::Router;
use meridian_eventlog::EventLog;
use meridian_store::Store;
use tokio::net::TcpListener;

mod access;
mod handlers;
mod openapi;
mod reports;
mod sites;
mod tenants;
mod tls;

pub use tls::{tls_config, Peer, TlsListener};

pub use handlers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAY, TENANT, USER, WORKFLOW_CONTENT_TYPES};
pub use meridian_app::auth::DEFAULT_TENANT;
pub use meridian_app::{api, read, AppError as ApiError, Principal, MAX_LISTED_RUNS};
pub use meridian_app::{StatusProjection, PROJECTION_NAME};
pub use openapi::{openapi, openapi_json, ApiDoc};
pub use reports::LEDGER_POSITION;

/// The intake service: the application and the routes over it. Cheap to clone; clones
/// share everything.
#[derive(Clone)]
pub struct Intake {
    app: meridian_app::App,
}

impl Intake {
    pub fn new(log: Arc<dyn EventLog>, store: Store) -> Intake {
        Intake::over(meridian_app::App::new(log, store))
    }

    /// The HTTP transport over `app`.
    pub fn over(app: meridian_app::App) -> Intake {
        Intake { app }
    }

    pub fn app(&self) -> &meridian_app::App {
        &self.app
    }

    pub fn log(&self) -> &Arc<dyn EventLog> {
        self.app.log()
    }

    pub fn store(&self) -> &Store {
        self.app.store()
    }

    /// Creates the application's tables; see [`meridian_app::App::migrate`].
    pub async fn migrate(&self) -> Result<(), ApiError> {
        self.app.migrate().await
    }

    /// Every route, with the state inside; unknown routes answer 404 and wrong methods
    /// 405, both as JSON.
    pub fn router(&self) -> Router {
        self.router_with(Router::new())
    }

    /// [`Intake::router`] plus `extra` routes from other parts of Meridian. Their paths
    /// should name the workflow `{id}`, as these do. Every route but health, `extra`'s
    /// too, answers only a caller that authenticates.
    pub fn router_with(&self, extra: Router) -> Router {
        let authenticated = routes()
            .with_state(self.clone())
            .merge(extra)
            // The MCP server: its tools act as the caller this layer authenticates.
            .merge(meridian_mcp::router(self.app.clone()))
            .route_layer(axum::middleware::from_fn_with_state(
                self.clone(),
                handlers::authenticate,
            ));
        Router::new()
            .route("/v1/health", get(handlers::health))
            // A run's own credential is checked by the application, not the token layer.
            .route("/v1/runs/{job}/report", post(handlers::report_run))
            .route(
                "/v1/runs/{job}/output/{stream}",
                put(handlers::report_run_output),
            )
            .with_state(self.clone())
            .merge(authenticated)
            // The web console: its pages read their caller from the sign-in cookie.
            .merge(
                meridian_console::router(self.app.clone())
                    .layer(axum::middleware::from_fn(handlers::client_address)),
            )
            .fallback(handlers::not_found)
            .method_not_allowed_fallback(handlers::method_not_allowed)
    }
}

/// The `/v1` routes, one line each. `/v1/workflows/{id}/bill` and `/logs` are added by
/// their owners (here, or through [`Intake::router_with`]).
fn routes() -> Router<Intake> {
    Router::new()
        .route("/v1/workflows", post(handlers::submit).get(handlers::list))
        .route("/v1/workflows/{id}", get(handlers::status))
        .route("/v1/workflows/{id}/cancel", post(handlers::cancel))
        .route("/v1/workflows/{id}/events", get(handlers::events))
        .route(
            "/v1/workflows/{id}/volumes/{volume}/export",
            post(handlers::retry_egress),
        )
        .route(
            "/v1/workflows/{id}/volumes/{volume}/release",
            post(handlers::release_outputs),
        )
        .route("/v1/workflows/{id}/bill", get(reports::bill))
        .route("/v1/workflows/{id}/logs", get(reports::logs))
        .route("/v1/tenants/{tenant}/bills", get(reports::tenant_bill))
        .route("/v1/exports/focus", get(reports::focus_export))
        .route("/v1/sites", get(sites::list).put(sites::apply))
        .route("/v1/sites/{name}/drain", post(sites::drain))
        .route("/v1/sites/{name}/undrain", post(sites::undrain))
        .route("/v1/sites/{name}/refresh", post(sites::refresh))
        .route(
            "/v1/sites/{name}/devices/{device}/cordon",
            post(sites::cordon),
        )
        .route(
            "/v1/sites/{name}/devices/{device}/uncordon",
            post(sites::uncordon),
        )
        .route("/v1/quotes", post(sites::quote))
        .route(
            "/v1/tenants/{tenant}/policy",
            get(tenants::get_policy).put(tenants::set_policy),
        )
        .route(
            "/v1/tenants/{tenant}/adjustments",
            get(tenants::list_adjustments).post(tenants::grant_adjustment),
        )
        .route(
            "/v1/tenants/{tenant}/adjustments/{id}/revoke",
            post(tenants::revoke_adjustment),
        )
        .route(
            "/v1/tenants/{tenant}/budget",
            get(tenants::get_budget).put(tenants::set_budget),
        )
        .route("/v1/tokens", post(access::issue).get(access::list))
        .route("/v1/tokens/{id}/revoke", post(access::revoke))
        .route("/v1/audit", get(access::audit))
}

/// Serves `intake`'s routes over TLS on `listener` until `shutdown` completes, then
/// finishes the requests in flight.
pub async fn serve_tls(
    intake: Intake,
    listener: TcpListener,
    config: Arc<tokio_rustls::rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_on(intake, TlsListener::new(listener, config)?, "TLS", shutdown).await
}

/// Serves `intake`'s routes on `listener` until `shutdown` completes, then finishes the
/// requests in flight.
pub async fn serve(
    intake: Intake,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_on(intake, listener, "plain HTTP", shutdown).await
}

async fn serve_on<L>(
    intake: Intake,
    listener: L,
    how: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
    Peer: for<'a> axum::extract::connect_info::Connected<axum::serve::IncomingStream<'a, L>>,
{
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, how, "intake API listening");
    }
    axum::serve(
        listener,
        intake
            .router()
            .into_make_service_with_connect_info::<Peer>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}
