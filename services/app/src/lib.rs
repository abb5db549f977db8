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

use held::Held;

pub mod api;
pub mod audit;
pub mod auth;
pub mod budgets;
mod error;
pub mod formats;
mod held;
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
    let mut all = store_schema();
    all.extend(audit::SCHEMA);
    all
}

/// [`schema`] but the audit trail's, for a store that keeps it elsewhere.
fn store_schema() -> Vec<&'static str> {
    idempotency::SCHEMA
        .iter()
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
    /// Where the audit trail lives: the store itself, or a database of its own
    /// ([`App::with_audit_store`]).
    audit_store: Store,
    /// Started on first use, so that `new` needs no runtime.
    audit: Arc<std::sync::OnceLock<audit::AuditWriter>>,
    /// Tokens and tenants as last read, read on nearly every request ([`held`]).
    tokens: Arc<Held<uuid::Uuid, meridian_events::aggregate::Token>>,
    tenants: Arc<Held<String, meridian_events::aggregate::Tenant>>,
}

impl App {
    pub fn new(log: Arc<dyn EventLog>, store: Store) -> App {
        App {
            log,
            audit_store: store.clone(),
            store,
            schema: Arc::new(OnceCell::new()),
            catalog: Arc::new(Mutex::new(Catalog::default())),
            workflow_credentials: None,
            audit: Arc::new(std::sync::OnceLock::new()),
            tokens: Arc::new(Held::new()),
            tenants: Arc::new(Held::new()),
        }
    }

    /// Accepts the workflow credentials made with `credentials`' key.
    pub fn with_workflow_credentials(mut self, credentials: WorkflowCredentials) -> App {
        self.workflow_credentials = Some(credentials);
        self
    }

    /// Keeps the audit trail in `audit` instead of the store. The embedded default gives
    /// it a SQLite file of its own: every request waits for its record's commit, and in
    /// the store's file that commit would queue behind the read models' transactions
    /// (one writer per file). Records an older deployment kept in the store move on
    /// first use.
    pub fn with_audit_store(mut self, audit: Store) -> App {
        self.audit_store = audit;
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
                if !self.audit_apart() {
                    return migrate_twice(&self.store, &schema()).await;
                }
                migrate_twice(&self.store, &store_schema()).await?;
                migrate_twice(&self.audit_store, audit::SCHEMA).await?;
                audit::move_records(&self.store, &self.audit_store)
                    .await
                    .map_err(|e| {
                        AppError::from_store("moving the audit trail to its own database", e)
                    })
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

impl App {
    /// The audit trail is kept apart from the store.
    fn audit_apart(&self) -> bool {
        !self.audit_store.same_as(&self.store)
    }
}

async fn migrate_twice(store: &Store, statements: &[&str]) -> Result<(), AppError> {
    // PostgreSQL can fail a `CREATE ... IF NOT EXISTS` that races the same statement
    // from the projection runner; the second try sees the table.
    if store.migrate(statements).await.is_ok() {
        return Ok(());
    }
    store
        .migrate(statements)
        .await
        .map_err(|e| AppError::from_store("creating the intake's tables", e))
}
