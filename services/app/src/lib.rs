//! The application layer: every command and query a user can issue, as one typed
//! function on [`App`] taking the caller ([`Principal`]). The HTTP API calls it, as will
//! the web console and the MCP server; the CLI reaches it through the HTTP API. It
//! learns who the caller is from its credentials ([`App::authenticate`]) and checks who
//! may do what in one place ([`App::authorize`]), then calls the domain and
//! the aggregates, and answers from the read models.
//!
//! Writes are commands on the aggregates, appended through
//! `meridian_eventlog::aggregates::execute`; reads come from the status read model
//! ([`StatusProjection`]), the ledger and the catalogue. Bad input gets an [`AppError`]
//! that says what is wrong, and appends nothing.

use std::sync::Arc;

use meridian_domain::Catalog;
use meridian_eventlog::EventLog;
use meridian_store::{Projection, Store};
use tokio::sync::{Mutex, MutexGuard, OnceCell};

pub mod api;
pub mod audit;
pub mod auth;
pub mod budgets;
mod error;
pub mod formats;
mod idempotency;
mod principal;
mod projection;
pub mod read;
pub mod reports;
pub mod runs;
pub mod sites;
pub mod tenants;
pub mod workflows;

pub use auth::{Credentials, WorkflowCredentials};
pub use error::AppError;
pub use principal::{Action, Grant, Principal, Role};
pub use projection::{StatusProjection, NAME as PROJECTION_NAME};

/// A status lists at most this many runs; `jobs_truncated` says when there are more
/// (a big array), and the counts always cover every task.
pub const MAX_LISTED_RUNS: usize = 1000;

/// Every statement that creates the application's tables (idempotency keys, the audit
/// trail, the status read model); each is idempotent.
pub fn schema() -> Vec<&'static str> {
    idempotency::SCHEMA
        .iter()
        .chain(audit::SCHEMA)
        .chain(StatusProjection.schema())
        .copied()
        .collect()
}

/// The application: the log, the store, and the catalogue read model over them. Cheap
/// to clone; clones share everything.
#[derive(Clone)]
pub struct App {
    log: Arc<dyn EventLog>,
    store: Store,
    /// The application's tables exist; created on first use so that `new` needs no I/O.
    schema: Arc<OnceCell<()>>,
    /// The site catalogue behind sites and quotes: loaded (from its snapshot) on first
    /// use, then each use catches it up with what was appended since.
    catalog: Arc<Mutex<Catalog>>,
    /// The key of the workflow credentials this deployment's jobs carry; without it,
    /// workflow credentials are refused.
    workflow_credentials: Option<WorkflowCredentials>,
    /// Started on first use, so that `new` needs no runtime.
    audit: Arc<std::sync::OnceLock<audit::AuditWriter>>,
}

impl App {
    pub fn new(log: Arc<dyn EventLog>, store: Store) -> App {
        App {
            log,
            store,
            schema: Arc::new(OnceCell::new()),
            catalog: Arc::new(Mutex::new(Catalog::default())),
            workflow_credentials: None,
            audit: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// Accepts the workflow credentials made with `credentials`' key.
    pub fn with_workflow_credentials(mut self, credentials: WorkflowCredentials) -> App {
        self.workflow_credentials = Some(credentials);
        self
    }

    pub fn log(&self) -> &Arc<dyn EventLog> {
        &self.log
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Creates the application's tables: the idempotency keys and the read model's (so
    /// that reads work before the projection first ran). Idempotent; commands and
    /// queries call it on first use, and callers may call it at startup to fail early.
    pub async fn migrate(&self) -> Result<(), AppError> {
        self.schema
            .get_or_try_init(|| async {
                let statements = schema();
                // PostgreSQL can fail a `CREATE ... IF NOT EXISTS` that races the same
                // statement from the projection runner; the second try sees the table.
                if self.store.migrate(&statements).await.is_ok() {
                    return Ok(());
                }
                self.store
                    .migrate(&statements)
                    .await
                    .map_err(|e| AppError::from_store("creating the intake's tables", e))
            })
            .await
            .map(|_| ())
    }

    /// The catalogue, caught up with the log. Callers hold the guard only to read from
    /// it: catch-ups wait on it.
    pub async fn catalog(&self) -> Result<MutexGuard<'_, Catalog>, AppError> {
        let mut catalog = self.catalog.lock().await;
        let read = if catalog.position() == 0 {
            // The first use is a start: from the catalogue's snapshot, when there is one.
            Catalog::load(&*self.log)
                .await
                .map(|loaded| *catalog = loaded)
        } else {
            catalog.catch_up(&*self.log).await
        };
        read.map_err(|e| AppError::from_log("reading the site catalogue", e))?;
        Ok(catalog)
    }
}
