//! Meridian's intake: the federation API under `/v1` (submit, status, list, cancel,
//! events, health), the status read model behind its reads ([`StatusProjection`]), and
//! the OpenAPI document generated from its handlers and types ([`openapi_json`]).
//!
//! Writes are commands on the Workflow aggregate, appended through
//! `meridian_eventlog::aggregates::execute`; reads come from the read model, which the
//! binary keeps up to date with `meridian_store::run(store, &*log, &StatusProjection, ..)`.
//! Bad input gets a 4xx with `{"error": ...}` and appends nothing.
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

use axum::routing::{get, post};
use axum::Router;
use meridian_domain::Catalog;
use meridian_eventlog::EventLog;
use meridian_store::{Projection, Store};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, OnceCell};

pub mod api;
mod error;
mod handlers;
mod idempotency;
mod openapi;
mod projection;
pub mod read;
mod reports;
pub mod sites;
pub mod tenants;

pub use error::ApiError;
pub use handlers::{
    DEFAULT_TENANT, DEFAULT_USER, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAY, TENANT, USER,
    WORKFLOW_CONTENT_TYPES,
};
pub use openapi::{openapi, openapi_json, ApiDoc};
pub use projection::{projection, StatusProjection, NAME as PROJECTION_NAME};
pub use reports::LEDGER_POSITION;

/// A status lists at most this many runs; `jobs_truncated` says when there are more
/// (a big array), and the counts always cover every task.
pub const MAX_LISTED_RUNS: usize = 1000;

/// The intake service: its log, its store, and the routes over them. Cheap to clone;
/// clones share everything.
#[derive(Clone)]
pub struct Intake {
    log: Arc<dyn EventLog>,
    store: Store,
    /// The intake's tables exist; created on first use so that `new` needs no I/O.
    schema: Arc<OnceCell<()>>,
    /// The site catalogue behind the `/v1/sites` and `/v1/quotes` endpoints: starts
    /// empty, and each of them catches it up with what was appended since.
    catalog: Arc<Mutex<Catalog>>,
}

impl Intake {
    pub fn new(log: Arc<dyn EventLog>, store: Store) -> Intake {
        Intake {
            log,
            store,
            schema: Arc::new(OnceCell::new()),
            catalog: Arc::new(Mutex::new(Catalog::default())),
        }
    }

    pub fn log(&self) -> &Arc<dyn EventLog> {
        &self.log
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Creates the intake's tables: the idempotency keys and the read model's (so that
    /// reads work before the projection first ran). Idempotent; the handlers call it
    /// on first use, and callers may call it at startup to fail early.
    pub async fn migrate(&self) -> Result<(), ApiError> {
        self.schema
            .get_or_try_init(|| async {
                let statements = idempotency::SCHEMA
                    .iter()
                    .chain(StatusProjection.schema())
                    .copied()
                    .collect::<Vec<_>>();
                // PostgreSQL can fail a `CREATE ... IF NOT EXISTS` that races the same
                // statement from the projection runner; the second try sees the table.
                if self.store.migrate(&statements).await.is_ok() {
                    return Ok(());
                }
                self.store
                    .migrate(&statements)
                    .await
                    .map_err(|e| ApiError::from_store("creating the intake's tables", e))
            })
            .await
            .map(|_| ())
    }

    pub(crate) async fn ready(&self) -> Result<(), ApiError> {
        self.migrate().await
    }

    /// Every route, with the state inside; unknown routes answer 404 and wrong methods
    /// 405, both as JSON.
    pub fn router(&self) -> Router {
        self.router_with(Router::new())
    }

    /// [`Intake::router`] plus `extra` routes from other parts of Meridian (the bill and
    /// the logs of a workflow). Their paths should name the workflow `{id}`, as these do.
    pub fn router_with(&self, extra: Router) -> Router {
        routes()
            .with_state(self.clone())
            .merge(extra)
            .fallback(handlers::not_found)
            .method_not_allowed_fallback(handlers::method_not_allowed)
    }
}

/// The `/v1` routes, one line each. `/v1/workflows/{id}/bill` and `/logs` are added by
/// their owners (here, or through [`Intake::router_with`]).
fn routes() -> Router<Intake> {
    Router::new()
        .route("/v1/health", get(handlers::health))
        .route("/v1/workflows", post(handlers::submit).get(handlers::list))
        .route("/v1/workflows/{id}", get(handlers::status))
        .route("/v1/workflows/{id}/cancel", post(handlers::cancel))
        .route("/v1/workflows/{id}/events", get(handlers::events))
        .route("/v1/workflows/{id}/bill", get(reports::bill))
        .route("/v1/workflows/{id}/logs", get(reports::logs))
        .route("/v1/tenants/{tenant}/bills", get(reports::tenant_bill))
        .route("/v1/exports/focus", get(reports::focus_export))
        .route("/v1/sites", get(sites::list).put(sites::apply))
        .route("/v1/sites/{name}/drain", post(sites::drain))
        .route("/v1/sites/{name}/undrain", post(sites::undrain))
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
}

/// Serves `intake`'s routes on `listener` until `shutdown` completes, then finishes the
/// requests in flight.
pub async fn serve(
    intake: Intake,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "intake API listening");
    }
    axum::serve(listener, intake.router())
        .with_graceful_shutdown(shutdown)
        .await
}
