//! Where read models live, and how they are kept up to date. A [`Store`] is one
//! database — a SQLite file when embedded, PostgreSQL when distributed — reached through
//! sqlx's `Any` driver so each read model writes its SQL once. A [`Projection`] folds
//! commits of the log into its tables; [`run`] applies them and records the position it
//! has reached **in the same transaction** as the rows, so a crash or a redelivery
//! never applies a commit twice and a rebuild is a replay from position 0.
//!
//! SQL written for both: `$1`-style parameters in increasing order, `BIGINT`/`TEXT`
//! columns (money and times as exact text), `INSERT … ON CONFLICT … DO NOTHING/UPDATE`.

use std::time::Duration;

use async_trait::async_trait;
use meridian_eventlog::{Commit, EventLog, LogError};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use tokio::sync::watch;

pub type Tx = sqlx::Transaction<'static, sqlx::Any>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Log(#[from] LogError),
    /// An event the projection cannot make sense of: stops the projection rather than
    /// skipping a fact silently.
    #[error("projection {projection} cannot apply position {position}: {message}")]
    Apply {
        projection: String,
        position: u64,
        message: String,
    },
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
}

impl StoreError {
    /// PostgreSQL gave up the transaction because another one changed what it read or
    /// wrote (a serialization failure or a deadlock): nothing of it was kept, and doing
    /// it again from the start is the answer.
    pub fn is_serialization_failure(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40001" | "40P01"))
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    /// Where writes go: on SQLite a pool of one connection, so writers queue here and
    /// each starts the moment the last is done. Several connections writing one file
    /// wait in SQLite's busy handler instead, which sleeps 1, 2, 5, 10… ms between
    /// tries: under load the embedded default spent most of its time asleep there.
    /// On PostgreSQL, the same pool as reads.
    writer: AnyPool,
    backend: Backend,
    /// Which database it is: a SQLite file's canonical path, else the URL it was opened
    /// with, so that two stores on one file are seen as one however the path was spelt.
    identity: std::sync::Arc<str>,
}

const POSITIONS: &str = "CREATE TABLE IF NOT EXISTS projection_positions (
    name TEXT PRIMARY KEY,
    position BIGINT NOT NULL
)";

impl Store {
    /// Connects to `sqlite://PATH` (created if missing) or `postgres://…`.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(StoreError::UnsupportedUrl(url.to_string()));
        };
        let mut identity: std::sync::Arc<str> = url.into();
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            _ => url.to_string(),
        };
        let file = std::path::PathBuf::from(
            url.trim_start_matches("sqlite://")
                .split('?')
                .next()
                .unwrap_or_default(),
        );
        if backend == Backend::Sqlite {
            if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Database(e.into()))?;
            }
        }
        let options = |connections| {
            AnyPoolOptions::new()
                .max_connections(connections)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        if backend == Backend::Sqlite {
                            for pragma in [
                                "PRAGMA journal_mode=WAL",
                                "PRAGMA busy_timeout=10000",
                                "PRAGMA synchronous=FULL",
                            ] {
                                sqlx::query(pragma).execute(&mut *conn).await?;
                            }
                        }
                        Ok(())
                    })
                })
        };
        let (pool, writer) = match backend {
            Backend::Sqlite => {
                let writer = options(1).connect(&url).await?;
                (options(4).connect(&url).await?, writer)
            }
            Backend::Postgres => {
                let pool = options(8).connect(&url).await?;
                (pool.clone(), pool)
            }
        };
        // The file exists once connected (`mode=rwc`); an in-memory database keeps its URL.
        if backend == Backend::Sqlite {
            if let Ok(path) = std::fs::canonicalize(&file) {
                identity = path.to_string_lossy().into();
            }
        }
        let store = Store {
            pool,
            writer,
            backend,
            identity,
        };
        store.migrate(&[POSITIONS]).await?;
        Ok(store)
    }

    /// For reads. Writes go through [`Store::begin`] or [`Store::writer`].
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// For a write of one statement outside a transaction.
    pub fn writer(&self) -> &AnyPool {
        &self.writer
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether `other` is the same database (the same SQLite file, or the same URL).
    pub fn same_as(&self, other: &Store) -> bool {
        self.identity == other.identity
    }

    /// Whether `table` exists.
    pub async fn has_table(&self, table: &str) -> Result<bool, StoreError> {
        let sql = match self.backend {
            Backend::Sqlite => {
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1"
            }
            Backend::Postgres => {
                "SELECT count(*) FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_name = $1"
            }
        };
        let row: AnyRow = sqlx::query(sql).bind(table).fetch_one(&self.pool).await?;
        Ok(row.get::<i64, _>(0) > 0)
    }

    /// Starts a write transaction. On SQLite it takes the write lock at once (`BEGIN
    /// IMMEDIATE`): a transaction that reads first and writes later could not wait for
    /// the lock and would fail with "database is locked" when another writer went first.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        Ok(match self.backend {
            Backend::Sqlite => self.writer.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.writer.begin().await?,
        })
    }

    /// [`Store::begin`], for a writer that reads what it then writes (a projection that
    /// adds to totals it read): on PostgreSQL every statement sees one snapshot, taken
    /// at the transaction's first statement, and an `UPDATE` (or an `INSERT … ON
    /// CONFLICT`) that meets a row another transaction changed or inserted after it
    /// fails ([`StoreError::is_serialization_failure`]) instead of building on what was
    /// read. PostgreSQL's default (read committed) would let a rival's commit land
    /// between a read and the write that depends on it. SQLite's write lock, taken at
    /// `BEGIN`, already keeps every other writer out.
    pub async fn begin_snapshot(&self) -> Result<Tx, StoreError> {
        Ok(match self.backend {
            Backend::Sqlite => self.writer.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => {
                self.writer
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    .await?
            }
        })
    }

    /// Creates a projection's tables (each statement must be idempotent). Runs in one
    /// transaction under a lock: PostgreSQL's `CREATE TABLE IF NOT EXISTS` is not safe
    /// against itself, and several services create their tables as they start.
    pub async fn migrate(&self, statements: &[&str]) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        if self.backend == Backend::Postgres {
            // Any fixed key: every Meridian process migrating this database waits here.
            sqlx::query("SELECT pg_advisory_xact_lock(7373)")
                .execute(&mut *tx)
                .await?;
            // `IF NOT EXISTS` on what exists is no news: keep its notices out of the logs.
            sqlx::query("SET LOCAL client_min_messages = warning")
                .execute(&mut *tx)
                .await?;
        }
        for statement in statements {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The last position `projection` has applied (0: none).
    pub async fn position(&self, projection: &str) -> Result<u64, StoreError> {
        let row: Option<AnyRow> = sqlx::query(POSITION)
            .bind(projection)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map_or(0, |r| r.get::<i64, _>(0) as u64))
    }

    /// Drops a projection's tables and position, so the next run rebuilds it from the log.
    ///
    /// A runner of the projection left up can take the tables' locks in another order
    /// than the drops do (the ledger writes its charges last, and they are dropped
    /// first): PostgreSQL then aborts one of the two as a deadlock, most often the reset,
    /// which waited longest. The reset is tried again, a few times, after a pause.
    pub async fn reset(&self, projection: &dyn Projection) -> Result<(), StoreError> {
        let mut pause = Duration::from_millis(50);
        let mut tries = 1;
        loop {
            match self.try_reset(projection).await {
                Err(e) if e.is_serialization_failure() && tries < 8 => {
                    tracing::warn!(projection = projection.name(), error = %e, "reset met a running writer of the projection; trying again");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    tries += 1;
                }
                done => return done,
            }
        }
    }

    async fn try_reset(&self, projection: &dyn Projection) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        for table in projection.tables() {
            sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DELETE FROM projection_positions WHERE name = $1")
            .bind(projection.name())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// A projection's position, by name (none: no row).
const POSITION: &str = "SELECT position FROM projection_positions WHERE name = $1";

/// The position `projection` has applied, read inside the caller's transaction.
pub async fn position_in(tx: &mut Tx, projection: &str) -> Result<u64, StoreError> {
    let row: Option<AnyRow> = sqlx::query(POSITION)
        .bind(projection)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.map_or(0, |r| r.get::<i64, _>(0) as u64))
}

/// A read model: tables, and how a commit changes them.
#[async_trait]
pub trait Projection: Send + Sync {
    /// Unique among projections; keys its position.
    fn name(&self) -> &'static str;
    /// Idempotent `CREATE TABLE IF NOT EXISTS …` / `CREATE INDEX IF NOT EXISTS …`.
    fn schema(&self) -> &'static [&'static str];
    /// Tables dropped by a rebuild.
    fn tables(&self) -> &'static [&'static str];
    /// Applies one commit inside `tx`; the runner commits it with the new position.
    async fn apply(&self, tx: &mut Tx, commit: &Commit) -> Result<(), StoreError>;
    /// Applies `commits`, in order, inside `tx`. A projection that can write a batch in
    /// fewer statements than commit by commit overrides this; the result must be the
    /// same as applying them one by one.
    async fn apply_all(&self, tx: &mut Tx, commits: &[Commit]) -> Result<(), StoreError> {
        for commit in commits {
            self.apply(tx, commit).await?;
        }
        Ok(())
    }
}

/// How many commits one transaction applies at most while following the log.
const BATCH: usize = 256;
/// … and while catching up (a start or a rebuild): fewer, larger transactions.
pub const CATCH_UP_BATCH: usize = 4096;

/// Moves `projection`'s position from `from` to `to` inside the caller's transaction,
/// only if it is still at `from` (a compare-and-set: of two writers that applied the
/// same commits, one finds it moved); whether it moved. A caller that gets false rolls
/// back what it applied. A missing position is 0: a writer that applied from a later
/// one does not move a position a rebuild's reset deleted, it finds it moved.
pub async fn move_position(
    tx: &mut Tx,
    projection: &str,
    from: u64,
    to: u64,
) -> Result<bool, StoreError> {
    let statement = if from == 0 {
        "INSERT INTO projection_positions (name, position) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET position = excluded.position
         WHERE projection_positions.position = $3"
    } else {
        "UPDATE projection_positions SET position = $2 WHERE name = $1 AND position = $3"
    };
    let moved = sqlx::query(statement)
        .bind(projection)
        .bind(to as i64)
        .bind(from as i64)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    Ok(moved > 0)
}

/// What applying a batch came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// Applied (or found applied by another writer) up to this position.
    Applied(u64),
    /// The position is behind the commit the batch was read after (a rebuild reset it,
    /// and is still short of the batch): applying the batch would skip what lies
    /// between. Read again from this position.
    Behind(u64),
}

/// Applies one batch of commits, read from the log after position `after`, and their
/// position atomically. The batch is applied from `known`, the position this runner
/// applied last (else from the position read inside the transaction), and the
/// position moves only if it is still where the batch was applied from. So a runner
/// on its own reads no position per batch, and of two runners of one projection
/// (replicas) that apply the same batch, the one that finds the position moved rolls
/// back and applies the batch again from where the position now is.
///
/// A compare-and-set fails only when another writer moved the position in the
/// meantime, which is that writer's progress, so there is no limit on the attempts: a
/// rival ahead (a replica) ends by passing the batch, and then nothing is left to
/// apply; one behind the batch (a rebuild from a reset) makes this [`Batch::Behind`].
/// The runner waits a little longer after each failure so that the rival can get on.
async fn apply_batch(
    store: &Store,
    projection: &dyn Projection,
    commits: &[Commit],
    after: u64,
    known: Option<u64>,
) -> Result<Batch, StoreError> {
    let mut from = known;
    let mut pause = Duration::from_millis(1);
    let mut failed: u64 = 0;
    loop {
        match apply_from(store, projection, commits, after, from).await {
            Ok(Some(batch)) => return Ok(batch),
            Ok(None) => {}
            // Another writer changed what the batch read: nothing of it was kept.
            Err(e) if e.is_serialization_failure() => {}
            Err(e) => return Err(e),
        }
        from = None;
        failed += 1;
        if failed.is_multiple_of(64) {
            tracing::warn!(
                projection = projection.name(),
                failed,
                "another writer keeps moving the position; is a replica or a rebuild running beside this one?"
            );
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// [`apply_batch`] from `known`, or from the position read inside the transaction;
/// None when the position had moved from there (nothing is applied).
///
/// Its transaction reads one snapshot ([`Store::begin_snapshot`]): a projection reads
/// the totals it adds to, and a rebuild's page committed between that read and the
/// compare-and-set would leave the position where this batch expects it (the page
/// ends there) and the totals without the page. The snapshot makes that a
/// serialization failure, and the batch is applied again on top of the page.
async fn apply_from(
    store: &Store,
    projection: &dyn Projection,
    commits: &[Commit],
    after: u64,
    known: Option<u64>,
) -> Result<Option<Batch>, StoreError> {
    let mut tx = store.begin_snapshot().await?;
    let applied = match known {
        Some(position) => position,
        None => position_in(&mut tx, projection.name()).await?,
    };
    if applied < after {
        // Dropped, the transaction rolls back (it wrote nothing).
        return Ok(Some(Batch::Behind(applied)));
    }
    // Commits come in position order: those not yet applied are a suffix.
    let fresh = &commits[commits.partition_point(|c| c.position <= applied)..];
    let last = fresh.last().map_or(applied, |c| c.position);
    if !fresh.is_empty() {
        projection.apply_all(&mut tx, fresh).await?;
    }
    if last > applied && !move_position(&mut tx, projection.name(), applied, last).await? {
        return Ok(None);
    }
    tx.commit().await?;
    Ok(Some(Batch::Applied(last)))
}

/// Applies everything up to the log's head now, then returns the position reached.
/// The next batch is read from the log while the last one is applied.
pub async fn catch_up(
    store: &Store,
    log: &dyn EventLog,
    projection: &dyn Projection,
) -> Result<u64, StoreError> {
    store.migrate(projection.schema()).await?;
    let mut position = store.position(projection.name()).await?;
    // The position the batch in hand was read after.
    let mut after = position;
    let mut commits = log.read_from(after, CATCH_UP_BATCH).await?;
    while let Some(end) = commits.last().map(|c| c.position) {
        let (batch, next) = tokio::join!(
            apply_batch(store, projection, &commits, after, Some(position)),
            log.read_from(end, CATCH_UP_BATCH)
        );
        match batch? {
            Batch::Applied(applied) => {
                position = applied;
                after = end;
                commits = next?;
            }
            Batch::Behind(applied) => {
                tracing::info!(
                    projection = projection.name(),
                    position = applied,
                    "the position went back (a rebuild); reading again from it"
                );
                position = applied;
                after = applied;
                commits = log.read_from(after, CATCH_UP_BATCH).await?;
            }
        }
    }
    Ok(position)
}

/// Keeps `projection` up to date until `shutdown` turns true. Transient log errors are
/// retried with backoff; anything else stops the projection with its error.
pub async fn run(
    store: Store,
    log: &dyn EventLog,
    projection: &dyn Projection,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), StoreError> {
    store.migrate(projection.schema()).await?;
    let mut backoff = Duration::from_millis(100);
    'reconnect: loop {
        let position = match store.position(projection.name()).await {
            Ok(position) => position,
            Err(StoreError::Database(e)) => {
                tracing::warn!(projection = projection.name(), error = %e, "database error; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue 'reconnect;
            }
            Err(e) => return Err(e),
        };
        // The position this runner applied last, while nothing failed since it was read.
        let mut known = Some(position);
        // The position the tail's next batch follows.
        let mut after = position;
        let mut tail = match log.tail(position).await {
            Ok(tail) => tail,
            Err(e) if e.is_transient() => {
                tracing::warn!(projection = projection.name(), error = %e, "log unavailable; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue 'reconnect;
            }
            Err(e) => return Err(e.into()),
        };
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let commits = tokio::select! {
                next = tail.next(BATCH, Duration::from_secs(1)) => next,
                _ = shutdown.changed() => return Ok(()),
            };
            match commits {
                Ok(commits) if commits.is_empty() => {}
                Ok(commits) => match tokio::select! {
                    batch = apply_batch(&store, projection, &commits, after, known) => batch,
                    // Between or during tries: a transaction left unfinished rolls back.
                    _ = shutdown.changed() => return Ok(()),
                } {
                    Ok(Batch::Applied(position)) => {
                        known = Some(position);
                        after = commits.last().map_or(after, |c| c.position);
                        backoff = Duration::from_millis(100);
                    }
                    Ok(Batch::Behind(position)) => {
                        tracing::info!(
                            projection = projection.name(),
                            position,
                            "the position went back (a rebuild); following the log again from it"
                        );
                        // A reset drops the tables too; a rebuild makes them again, but
                        // it may not have begun. (A failure here shows again below.)
                        if let Err(e) = store.migrate(projection.schema()).await {
                            tracing::warn!(projection = projection.name(), error = %e, "could not make the projection's tables again");
                        }
                        continue 'reconnect;
                    }
                    // A busy or restarting database: nothing was applied (the batch and
                    // its position roll back together); read from the position again.
                    Err(StoreError::Database(e)) => {
                        tracing::warn!(projection = projection.name(), error = %e, "database error; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = shutdown.changed() => return Ok(()),
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue 'reconnect;
                    }
                    Err(e) => return Err(e),
                },
                Err(e) if e.is_transient() => {
                    tracing::warn!(projection = projection.name(), error = %e, "log unavailable; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.changed() => return Ok(()),
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue 'reconnect;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Text helpers for columns that hold exact values.
pub mod text {
    /// Reads an optional TEXT column (NULL → None).
    pub fn opt(row: &sqlx::any::AnyRow, column: &str) -> Option<String> {
        use sqlx::Row;
        row.try_get::<Option<String>, _>(column).ok().flatten()
    }
}

/// Databases for tests: a fresh PostgreSQL database per test, on the server named by
/// `MERIDIAN_TEST_POSTGRES` (default: the local one, trust auth).
pub mod testing {
    use sqlx::Connection;

    pub fn admin_url() -> String {
        std::env::var("MERIDIAN_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
    }

    /// Creates an empty database and returns its URL.
    pub async fn fresh_postgres() -> Result<String, sqlx::Error> {
        let admin = admin_url();
        let mut conn = sqlx::PgConnection::connect(&admin).await?;
        let name = format!("meridian_test_{}", uuid_like());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await?;
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        Ok(format!("{base}/{name}"))
    }

    /// Drops a database made by [`fresh_postgres`] (best effort).
    pub async fn drop_postgres(url: &str) {
        let Some((_, name)) = url.rsplit_once('/') else {
            return;
        };
        if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(&mut conn)
                .await;
        }
    }

    /// Unique across processes (the pid) and across a process's tests running at once
    /// (a counter): the clock alone repeated itself for two tests started together.
    fn uuid_like() -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::time::{SystemTime, UNIX_EPOCH};
        static MADE: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        format!("{nanos:x}_{}_{made}", std::process::id())
    }
}

/// Captured output of job runs: written by the site runner when a run ends, read by
/// the API. Kept here because both sides share it and neither owns the other.
pub mod job_logs {
    use sqlx::Row;

    use crate::{Store, StoreError};

    const SCHEMA: &[&str] = &["CREATE TABLE IF NOT EXISTS job_logs (
        job_id TEXT PRIMARY KEY,
        workflow_id TEXT NOT NULL,
        job TEXT NOT NULL,
        array_index BIGINT,
        attempt BIGINT NOT NULL,
        stdout TEXT NOT NULL,
        stderr TEXT NOT NULL,
        captured_at TEXT NOT NULL
    )"];

    #[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
    pub struct JobLog {
        pub job_id: String,
        pub workflow_id: String,
        pub job: String,
        pub index: Option<i64>,
        pub attempt: i64,
        pub stdout: String,
        pub stderr: String,
        pub captured_at: String,
    }

    /// Creates the table.
    pub async fn migrate(store: &Store) -> Result<(), StoreError> {
        store.migrate(SCHEMA).await
    }

    pub async fn save(store: &Store, log: &JobLog) -> Result<(), StoreError> {
        store.migrate(SCHEMA).await?;
        sqlx::query(
            "INSERT INTO job_logs (job_id, workflow_id, job, array_index, attempt, stdout, stderr, captured_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (job_id) DO UPDATE SET stdout = excluded.stdout, stderr = excluded.stderr,
                 captured_at = excluded.captured_at",
        )
        .bind(&log.job_id)
        .bind(&log.workflow_id)
        .bind(&log.job)
        .bind(log.index)
        .bind(log.attempt)
        .bind(&log.stdout)
        .bind(&log.stderr)
        .bind(&log.captured_at)
        .execute(store.writer())
        .await?;
        Ok(())
    }

    /// The logs of a workflow's runs, optionally of one job, in job and index order.
    pub async fn read(
        store: &Store,
        workflow_id: &str,
        job: Option<&str>,
    ) -> Result<Vec<JobLog>, StoreError> {
        store.migrate(SCHEMA).await?;
        let rows = sqlx::query(
            "SELECT job_id, workflow_id, job, array_index, attempt, stdout, stderr, captured_at
             FROM job_logs WHERE workflow_id = $1 ORDER BY job, array_index, attempt",
        )
        .bind(workflow_id)
        .fetch_all(store.pool())
        .await?;
        Ok(rows
            .iter()
            .map(|r| JobLog {
                job_id: r.get(0),
                workflow_id: r.get(1),
                job: r.get(2),
                index: r.get(3),
                attempt: r.get(4),
                stdout: r.get(5),
                stderr: r.get(6),
                captured_at: r.get(7),
            })
            .filter(|l| job.is_none_or(|j| l.job == j))
            .collect())
    }
}

/// What runs said of themselves through the API (`POST /v1/runs/{job}/report`): a
/// cloud instance reports its start, its exit code and its output there. Written by the
/// API, read by the cloud sites' adapters, which merge it with what the provider says.
/// Not a read model of the log: it is input from outside, like a batch system's state,
/// and becomes events only through the site runner.
pub mod run_reports {
    use sqlx::Row;

    use crate::{Store, StoreError};

    const SCHEMA: &[&str] = &["CREATE TABLE IF NOT EXISTS run_reports (
        job_id TEXT PRIMARY KEY,
        started_at TEXT,
        ended_at TEXT,
        exit_code BIGINT,
        stdout TEXT NOT NULL,
        stderr TEXT NOT NULL
    )"];

    /// One run's report so far; times are RFC 3339, UTC, as the API received them.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct RunReportRow {
        pub started_at: Option<String>,
        pub ended_at: Option<String>,
        pub exit_code: Option<i64>,
        pub stdout: String,
        pub stderr: String,
    }

    /// Creates the table.
    pub async fn migrate(store: &Store) -> Result<(), StoreError> {
        store.migrate(SCHEMA).await
    }

    /// Records that run `job_id` started at `at`; a second start keeps the first.
    pub async fn started(store: &Store, job_id: &str, at: &str) -> Result<(), StoreError> {
        migrate(store).await?;
        sqlx::query(
            "INSERT INTO run_reports (job_id, started_at, stdout, stderr) VALUES ($1, $2, '', '')
             ON CONFLICT (job_id) DO UPDATE SET started_at = COALESCE(run_reports.started_at, excluded.started_at)",
        )
        .bind(job_id)
        .bind(at)
        .execute(store.writer())
        .await?;
        Ok(())
    }

    /// Which of a run's output streams.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Stream {
        Stdout,
        Stderr,
    }

    /// Replaces run `job_id`'s output on `stream` with what it sent now (the tail it
    /// holds, so a retried or repeated send changes nothing).
    pub async fn output(
        store: &Store,
        job_id: &str,
        stream: Stream,
        text: &str,
    ) -> Result<(), StoreError> {
        migrate(store).await?;
        // The column comes from the enum, never from input.
        let column = match stream {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        };
        sqlx::query(
            "INSERT INTO run_reports (job_id, stdout, stderr) VALUES ($1, '', '')
             ON CONFLICT (job_id) DO NOTHING",
        )
        .bind(job_id)
        .execute(store.writer())
        .await?;
        sqlx::query(&format!(
            "UPDATE run_reports SET {column} = $1 WHERE job_id = $2"
        ))
        .bind(text)
        .bind(job_id)
        .execute(store.writer())
        .await?;
        Ok(())
    }

    /// Records how run `job_id` ended; the first end reported stands (a retried
    /// report changes nothing).
    pub async fn exited(
        store: &Store,
        job_id: &str,
        at: &str,
        exit_code: i64,
    ) -> Result<(), StoreError> {
        migrate(store).await?;
        sqlx::query(
            "INSERT INTO run_reports (job_id, started_at, ended_at, exit_code, stdout, stderr)
             VALUES ($1, $2, $2, $3, '', '')
             ON CONFLICT (job_id) DO UPDATE SET
                 started_at = COALESCE(run_reports.started_at, excluded.started_at),
                 exit_code = COALESCE(run_reports.exit_code, excluded.exit_code),
                 ended_at = COALESCE(run_reports.ended_at, excluded.ended_at)",
        )
        .bind(job_id)
        .bind(at)
        .bind(exit_code)
        .execute(store.writer())
        .await?;
        Ok(())
    }

    /// What run `job_id` reported, if anything. Adapters ask this at every look, so it
    /// does not create the table: no table yet means no report yet.
    pub async fn read(store: &Store, job_id: &str) -> Result<Option<RunReportRow>, StoreError> {
        let row = sqlx::query(
            "SELECT started_at, ended_at, exit_code, stdout, stderr FROM run_reports WHERE job_id = $1",
        )
        .bind(job_id)
        .fetch_optional(store.pool())
        .await;
        let row = match row {
            Ok(row) => row,
            Err(sqlx::Error::Database(e))
                if e.message().contains("no such table")
                    || e.message().contains("does not exist") =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        };
        Ok(row.map(|r| RunReportRow {
            started_at: r.get(0),
            ended_at: r.get(1),
            exit_code: r.get(2),
            stdout: r.get(3),
            stderr: r.get(4),
        }))
    }
}
