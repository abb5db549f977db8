//! The ledger projection: billable events in, priced lines out, in the same transaction
//! as the projection's position (see `meridian_store::run`).
//!
//! What it reads:
//! - `job.finished|failed|cancelled.v1` of a run that started: compute lines;
//! - `workflow.volume_released.v1`: storage lines;
//! - `transfer.completed.v1` with an egress tariff: egress lines, tiered by the tenant's
//!   cumulative volume out of the same source in the month (`ledger_egress_volume`);
//! - `job.dispatched.v1`, `site.registered.v1`, `tenant.adjustment_*.v1`: the names,
//!   site kinds and regions, and price adjustments that lines are described and priced
//!   with.
//!
//! Lines are keyed by (event id, item) and inserted with `ON CONFLICT DO NOTHING`: a
//! redelivered event, or one applied by a second replica at the same moment, changes
//! nothing (its items depend only on the event). Egress also adds to the month's volume
//! counter, so an egress event is first claimed in `ledger_applied`: whoever claims it
//! second skips it (on PostgreSQL, a batch that waited for the first claim's
//! transaction is applied again from the start, and then skips it), and the volume is
//! never counted twice.
//!
//! A batch of commits is applied in a handful of statements: everything its lines need
//! besides their events (the jobs' names, the sites' kinds and regions, the tenants'
//! adjustments, the months' egress volumes) is read at once for the keys the batch
//! names, kept up to date in memory as its events are applied in log order, and the
//! batch's rows are written with multi-row statements. Applying commits one at a time
//! gives the same rows.
//!
//! A rebuild ([`crate::rebuild`]) reads nothing back: it starts from empty tables, so what it
//! has applied, kept in memory, is all the tables hold, and each page of the log is
//! priced on a blocking thread while the page before is written. It reads the log as
//! stored text and decodes only the events it bills, straight from it; the thread that
//! prices a page also binds the statements that write it, so the writer only runs them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use meridian_eventlog::{Commit, EventLog, StoredCommit};
use meridian_events::vocabulary::tenant::{ChargeKind, Meter};
use meridian_events::vocabulary::transfer::TransferEvent;
use meridian_events::vocabulary::workflow::WorkflowEvent;
use meridian_events::vocabulary::Location;
use meridian_events::{
    AggregateKind, AggregateRef, Allocation, ComputeRate, Envelope, Event, JobEvent, SiteEvent,
    SiteKind, TenantEvent,
};
use meridian_ops::trace;
use meridian_store::{catch_up, move_position, Backend, Projection, Store, StoreError, Tx};
use rust_decimal::Decimal;
use serde_json::value::RawValue;
use sqlx::Row;
use uuid::Uuid;

use crate::period::Period;
use crate::pricing::{self, AdjustmentRule, Metered};

/// The projection's name (its position is kept under it). Version 2 replaced the one
/// line per run of version 1 by one line per priced dimension and period; the new name
/// makes an old database rebuild itself from the log.
pub const NAME: &str = "ledger.v2";

/// Only `ledger_charges` has secondary indexes: on PostgreSQL `CREATE INDEX IF NOT
/// EXISTS` takes a share lock on its table even when the index exists, and a migration
/// locking two tables could deadlock with a consumer writing them in the other order
/// (replicas starting while others run). Adjustments are few per tenant: no index.
pub(crate) const SCHEMA: &[&str] = &[
    // Version 1's table and position: replaced, rebuilt under the new names.
    "DROP TABLE IF EXISTS ledger_lines",
    "DELETE FROM projection_positions WHERE name = 'ledger'",
    "CREATE TABLE IF NOT EXISTS ledger_charges (
        event_id TEXT NOT NULL,
        item TEXT NOT NULL,
        position BIGINT NOT NULL,
        tenant TEXT NOT NULL,
        workflow_id TEXT NOT NULL,
        category TEXT NOT NULL,
        meter TEXT NOT NULL,
        unit TEXT NOT NULL,
        period TEXT NOT NULL,
        charge_start TEXT NOT NULL,
        charge_end TEXT NOT NULL,
        site TEXT NOT NULL,
        site_kind TEXT,
        region TEXT,
        resource_id TEXT NOT NULL,
        resource_name TEXT NOT NULL,
        resource_type TEXT NOT NULL,
        job_id TEXT,
        job TEXT,
        array_index BIGINT,
        attempt BIGINT,
        sku TEXT NOT NULL,
        band BIGINT,
        description TEXT NOT NULL,
        quantity TEXT NOT NULL,
        list_unit_price TEXT NOT NULL,
        contracted_unit_price TEXT NOT NULL,
        list_cost TEXT NOT NULL,
        contracted_cost TEXT NOT NULL,
        currency TEXT NOT NULL,
        adjustment_id TEXT,
        price_source TEXT NOT NULL,
        price_effective_from TEXT NOT NULL,
        PRIMARY KEY (event_id, item)
    )",
    "CREATE INDEX IF NOT EXISTS ledger_charges_workflow ON ledger_charges (workflow_id)",
    "CREATE INDEX IF NOT EXISTS ledger_charges_period ON ledger_charges (period, tenant)",
    "CREATE TABLE IF NOT EXISTS ledger_applied (
        event_id TEXT PRIMARY KEY,
        position BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS ledger_jobs (
        job_id TEXT PRIMARY KEY,
        job TEXT NOT NULL,
        array_index BIGINT,
        attempt BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS ledger_sites (
        name TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        region TEXT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS ledger_adjustments (
        adjustment_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        position BIGINT NOT NULL,
        scope TEXT NOT NULL,
        terms TEXT NOT NULL,
        effective_from TEXT NOT NULL,
        effective_until TEXT
    )",
    "CREATE TABLE IF NOT EXISTS ledger_egress_volume (
        tenant TEXT NOT NULL,
        source TEXT NOT NULL,
        period TEXT NOT NULL,
        gb TEXT NOT NULL,
        PRIMARY KEY (tenant, source, period)
    )",
];

pub(crate) const TABLES: &[&str] = &[
    "ledger_charges",
    "ledger_applied",
    "ledger_jobs",
    "ledger_sites",
    "ledger_adjustments",
    "ledger_egress_volume",
];

/// The columns of `ledger_charges`, in table order.
pub const COLUMNS: [&str; 33] = [
    "event_id",
    "item",
    "position",
    "tenant",
    "workflow_id",
    "category",
    "meter",
    "unit",
    "period",
    "charge_start",
    "charge_end",
    "site",
    "site_kind",
    "region",
    "resource_id",
    "resource_name",
    "resource_type",
    "job_id",
    "job",
    "array_index",
    "attempt",
    "sku",
    "band",
    "description",
    "quantity",
    "list_unit_price",
    "contracted_unit_price",
    "list_cost",
    "contracted_cost",
    "currency",
    "adjustment_id",
    "price_source",
    "price_effective_from",
];

/// The ledger projection. Stateless: everything it needs is in its tables.
pub struct Ledger;

/// Times as the ledger stores them: RFC 3339 UTC with microseconds, so that text order
/// is time order.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Exact decimals as the ledger stores them: no trailing zeros, no exponent.
pub fn decimal(d: Decimal) -> String {
    d.normalize().to_string()
}

fn apply_error(position: u64, message: impl Into<String>) -> StoreError {
    StoreError::Apply {
        projection: NAME.into(),
        position,
        message: message.into(),
    }
}

/// The tags the ledger reads; everything else is skipped without being decoded.
pub const READS: [&str; 9] = [
    "job.dispatched.v1",
    "job.finished.v1",
    "job.failed.v1",
    "job.cancelled.v1",
    "site.registered.v1",
    "tenant.adjustment_granted.v1",
    "tenant.adjustment_revoked.v1",
    "workflow.volume_released.v1",
    "transfer.completed.v1",
];

#[async_trait]
impl Projection for Ledger {
    fn name(&self) -> &'static str {
        NAME
    }

    fn schema(&self) -> &'static [&'static str] {
        SCHEMA
    }

    fn tables(&self) -> &'static [&'static str] {
        TABLES
    }

    async fn apply(&self, tx: &mut Tx, commit: &Commit) -> Result<(), StoreError> {
        self.apply_all(tx, std::slice::from_ref(commit)).await
    }

    /// A batch in a handful of statements: its events are decoded, the egress among
    /// them claimed, everything their lines need loaded at once, the lines priced in
    /// memory in log order (each event seeing what those before it changed), and all of
    /// it written with multi-row statements.
    async fn apply_all(&self, tx: &mut Tx, commits: &[Commit]) -> Result<(), StoreError> {
        let events = decode(commits)?;
        if events.is_empty() {
            return Ok(());
        }
        let claimed = claim(tx, egress_rows(&events)).await?;
        let mut known = Known::load(tx, &events).await?;
        let mut writes = Writes::default();
        for read in events {
            if read.is_egress() && !claimed.contains(&read.head.event_id) {
                continue;
            }
            // What is charged shows in the workflow's trace, under the span that
            // recorded it (a job's end, a volume's release, a transfer).
            read.span().in_scope(|| known.apply(read, &mut writes))?;
        }
        writes.flush(tx).await
    }
}

/// Replays the whole log into the ledger's tables, which a rebuild has just emptied.
///
/// Each page of the log is priced on a blocking thread while the page before it is
/// written, so that deciding and writing use a core each. That needs no reads between
/// pages: while the tables start empty and only this replay writes them, everything
/// pricing needs (jobs, sites, adjustments, egress volumes) is what the replay itself
/// has applied, kept in memory from the first page to the last. Each page's
/// transaction checks that: should the position be other than where the page before
/// left it, or an egress event already claimed (another consumer of the ledger left
/// running), the page is rolled back and the rest of the log applied by [`catch_up`],
/// which takes turns with other writers.
pub(crate) async fn replay(
    store: &Store,
    log: &dyn EventLog,
    how: Replay,
) -> Result<u64, StoreError> {
    store.migrate(SCHEMA).await?;
    if store.position(NAME).await? != 0 {
        return catch_up(store, log, &Ledger).await;
    }
    // The lines' secondary indexes are built once at the end rather than kept up to
    // date row by row (a tenth of the writing). A replay cut short leaves them to the
    // next start's migration, which every consumer of the ledger runs.
    for index in SECONDARY_INDEXES {
        sqlx::query(&format!("DROP INDEX IF EXISTS {index}"))
            .execute(store.writer())
            .await?;
    }
    let position = replay_pages(store, log, how).await?;
    store.migrate(SCHEMA).await?;
    Ok(position)
}

/// How a rebuild replays the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// Commits read, priced and written at a time.
    pub page: usize,
    /// Jobs kept in memory at most (their names, array indexes and attempts). Past
    /// this, the rest of the log is applied batch by batch, each batch reading what it
    /// needs from the tables.
    pub jobs_in_memory: usize,
}

impl Default for Replay {
    fn default() -> Replay {
        Replay {
            page: meridian_store::CATCH_UP_BATCH,
            jobs_in_memory: 2_000_000,
        }
    }
}

/// The secondary indexes of `ledger_charges`, as [`SCHEMA`] creates them.
const SECONDARY_INDEXES: [&str; 2] = ["ledger_charges_workflow", "ledger_charges_period"];

async fn replay_pages(store: &Store, log: &dyn EventLog, how: Replay) -> Result<u64, StoreError> {
    let mut known = Known::default();
    let style = Placeholders::for_backend(store.backend());
    let mut commits = log.read_text_from(0, how.page).await?;
    let mut writing: Option<tokio::task::JoinHandle<Result<bool, StoreError>>> = None;
    let mut after = 0;
    while let Some(end) = commits.last().map(|c| c.position) {
        if known.jobs.len() > how.jobs_in_memory {
            if let Some(write) = writing.take() {
                if !joined(write.await, after)?? {
                    return hand_over(store, log, after).await;
                }
            }
            tracing::info!(
                after,
                jobs = known.jobs.len(),
                "the rebuild holds as many jobs in memory as it may; going on batch by batch"
            );
            return catch_up(store, log, &Ledger).await;
        }
        let pricing = tokio::task::spawn_blocking(move || {
            let priced = price(&commits, &mut known, style);
            (priced, known)
        });
        let written = async {
            match writing.take() {
                Some(write) => joined(write.await, after)?,
                None => Ok(true),
            }
        };
        let (priced, next, written) =
            tokio::join!(pricing, log.read_text_from(end, how.page), written);
        if !written? {
            return hand_over(store, log, after).await;
        }
        let (priced, left) = joined(priced, end)?;
        known = left;
        writing = Some(tokio::spawn(write_page(store.clone(), priced?, after, end)));
        after = end;
        commits = next?;
    }
    if let Some(write) = writing {
        if !joined(write.await, after)?? {
            return hand_over(store, log, after).await;
        }
    }
    Ok(after)
}

/// The rest of a replay that found another writer of the ledger: batch by batch.
async fn hand_over(store: &Store, log: &dyn EventLog, after: u64) -> Result<u64, StoreError> {
    tracing::warn!(
        after,
        "the ledger was written beside the rebuild (another consumer is running); \
         going on batch by batch, taking turns with it"
    );
    catch_up(store, log, &Ledger).await
}

/// A task's result; a panic in it goes on in the caller.
fn joined<T>(result: Result<T, tokio::task::JoinError>, position: u64) -> Result<T, StoreError> {
    result.map_err(|e| match e.try_into_panic() {
        Ok(panic) => std::panic::resume_unwind(panic),
        Err(e) => apply_error(position, format!("replaying the log: {e}")),
    })
}

/// One page of the log, priced: the statements that write its rows, and the egress
/// events to claim for them.
struct Priced {
    statements: Vec<Statement>,
    egress: Vec<(String, i64)>,
}

/// Prices a page with what the pages before it left in `known`, changing it as the
/// page's events do, and binds the statements that write it.
fn price(
    commits: &[StoredCommit],
    known: &mut Known,
    style: Placeholders,
) -> Result<Priced, StoreError> {
    let events = decode_text(commits)?;
    let egress = egress_rows(&events);
    let mut writes = Writes::default();
    for read in events {
        read.span().in_scope(|| known.apply(read, &mut writes))?;
    }
    Ok(Priced {
        statements: writes.statements(style)?,
        egress,
    })
}

/// Writes a priced page in one transaction with its position, if the ledger is where
/// the page before left it (`after`) and every egress event is claimed now; otherwise
/// writes nothing and returns false.
async fn write_page(
    store: Store,
    priced: Priced,
    after: u64,
    end: u64,
) -> Result<bool, StoreError> {
    let mut tx = store.begin().await?;
    if store.backend() == Backend::Postgres {
        // The page's position commits with its rows, so a page a crash loses is only
        // replayed again: PostgreSQL need not flush its WAL before answering (the
        // index build at the end does, and everything before it is durable then).
        sqlx::query("SET LOCAL synchronous_commit = off")
            .execute(&mut *tx)
            .await?;
    }
    let egress = priced.egress.len();
    if claim(&mut tx, priced.egress).await?.len() != egress {
        return Ok(false);
    }
    for statement in priced.statements {
        statement.execute(&mut tx).await?;
    }
    // Compared and moved in one statement, so another writer that applied this page
    // meanwhile (on PostgreSQL, after a read here would have passed) rolls this back.
    if !move_position(&mut tx, NAME, after, end).await? {
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

/// An event the ledger reads, decoded, and the commit it came in.
struct Read {
    position: u64,
    head: Head,
    event: Event,
}

/// What the ledger reads of an event's envelope besides the event.
struct Head {
    event_id: Uuid,
    aggregate: AggregateRef,
    tenant: String,
    traceparent: Option<String>,
}

impl Head {
    fn of<P>(envelope: &Envelope<P>) -> Head {
        Head {
            event_id: envelope.event_id,
            aggregate: envelope.aggregate,
            tenant: envelope.tenant.clone(),
            traceparent: envelope.traceparent.clone(),
        }
    }
}

impl Read {
    /// A copy that may bill egress: claimed before it counts towards a month's volume.
    fn is_egress(&self) -> bool {
        matches!(
            self.event,
            Event::Transfer(TransferEvent::Completed {
                egress: Some(_),
                ..
            })
        )
    }

    fn span(&self) -> tracing::Span {
        match &self.event {
            Event::Job(JobEvent::Dispatched { .. }) | Event::Site(_) | Event::Tenant(_) => {
                tracing::Span::none()
            }
            _ => {
                let span = trace::child_of("bill", self.head.traceparent.as_deref());
                if self.head.aggregate.kind == AggregateKind::Job {
                    trace::mark_job(&span, self.head.aggregate.id);
                }
                span
            }
        }
    }
}

/// The events of `commits` the ledger reads, in log order; the rest are not decoded.
fn decode(commits: &[Commit]) -> Result<Vec<Read>, StoreError> {
    let mut out = Vec::new();
    for commit in commits {
        for raw in commit.events.iter() {
            let tag = raw.payload.get("type").and_then(|t| t.as_str());
            if !tag.is_some_and(|t| READS.contains(&t)) {
                continue;
            }
            let event = Event::from_payload(&raw.payload)
                .map_err(|e| apply_error(commit.position, format!("{}: {e}", raw.event_id)))?;
            out.push(Read {
                position: commit.position,
                head: Head::of(raw),
                event,
            });
        }
    }
    Ok(out)
}

/// Decodes `commits` as a rebuild does and says how many events the ledger reads
/// among them: the reading alone, which the ledger's benchmark sets pricing and
/// writing against.
pub fn decode_as_rebuild(commits: &[StoredCommit]) -> Result<usize, StoreError> {
    decode_text(commits).map(|events| events.len())
}

/// [`decode`] for commits as the log keeps them: each envelope is parsed with its
/// payload left as text, and only the events the ledger reads are decoded, straight
/// from that text.
fn decode_text(commits: &[StoredCommit]) -> Result<Vec<Read>, StoreError> {
    let mut out = Vec::new();
    for commit in commits {
        let corrupt = |e: serde_json::Error| apply_error(commit.position, e.to_string());
        for text in &commit.events {
            let envelope: Envelope<&RawValue> = serde_json::from_str(text).map_err(corrupt)?;
            let payload = envelope.payload.get();
            // A payload without a type is none of the ledger's, as in `decode`.
            let Ok(tag) = Event::type_of_json(payload) else {
                continue;
            };
            if !READS.contains(&tag.as_ref()) {
                continue;
            }
            let event = Event::from_json(&tag, payload)
                .map_err(|e| apply_error(commit.position, format!("{}: {e}", envelope.event_id)))?;
            out.push(Read {
                position: commit.position,
                head: Head::of(&envelope),
                event,
            });
        }
    }
    Ok(out)
}

/// The (event id, position) of each egress event among `events`: what [`claim`] takes.
fn egress_rows(events: &[Read]) -> Vec<(String, i64)> {
    events
        .iter()
        .filter(|r| r.is_egress())
        .map(|r| (r.head.event_id.to_string(), r.position as i64))
        .collect()
}

/// Marks the batch's egress events as billed in `ledger_applied`, and returns those
/// claimed now: one already there (a redelivery, or another replica that went first;
/// PostgreSQL makes this wait for that replica's transaction) is not billed again.
async fn claim(tx: &mut Tx, rows: Vec<(String, i64)>) -> Result<HashSet<Uuid>, StoreError> {
    let mut claimed = HashSet::new();
    let style = Placeholders::of(tx);
    let mut left = rows.into_iter();
    for n in pieces(left.len(), 2) {
        let sql = values(
            style,
            "INSERT INTO ledger_applied (event_id, position)",
            2,
            n,
            "ON CONFLICT (event_id) DO NOTHING RETURNING event_id",
        );
        let mut query = sqlx::query(&sql);
        for (id, position) in left.by_ref().take(n) {
            query = query.bind(id).bind(position);
        }
        for row in query.fetch_all(&mut **tx).await? {
            let id: String = row.get(0);
            let id = Uuid::parse_str(&id)
                .map_err(|e| apply_error(0, format!("stored event id {id:?}: {e}")))?;
            claimed.insert(id);
        }
    }
    Ok(claimed)
}

#[derive(Clone)]
struct JobInfo {
    name: String,
    index: Option<i64>,
    attempt: i64,
}

struct JobRef {
    id: Uuid,
    info: Option<JobInfo>,
}

#[derive(Clone, Default)]
struct SiteInfo {
    kind: Option<SiteKind>,
    region: Option<String>,
}

/// What the batch's lines need besides their events: loaded once for the jobs, sites
/// and tenants the batch names, then changed in memory by the batch's own events in log
/// order, as the tables would have been.
#[derive(Default)]
struct Known {
    jobs: HashMap<Uuid, JobInfo>,
    sites: HashMap<String, SiteInfo>,
    /// Each tenant's adjustments in grant order; every tenant the batch names has one.
    rules: HashMap<String, Vec<AdjustmentRule>>,
    /// The egress volume so far, by tenant, source and month.
    volumes: HashMap<(String, String, Period), Decimal>,
}

/// An adjustment as `ledger_adjustments` holds it.
struct StoredRule {
    id: String,
    tenant: String,
    position: i64,
    scope: String,
    terms: String,
    effective_from: String,
    effective_until: Option<String>,
}

impl StoredRule {
    fn rule(&self, position: u64) -> Result<AdjustmentRule, StoreError> {
        let bad = |what: &str, e: String| apply_error(position, format!("stored {what}: {e}"));
        let time = |s: &str| {
            s.parse::<DateTime<Utc>>()
                .map_err(|e| bad("time", e.to_string()))
        };
        Ok(AdjustmentRule {
            id: Uuid::parse_str(&self.id).map_err(|e| bad("adjustment id", e.to_string()))?,
            order: self.position as u64,
            scope: serde_json::from_str(&self.scope)
                .map_err(|e| bad("adjustment scope", e.to_string()))?,
            terms: serde_json::from_str(&self.terms)
                .map_err(|e| bad("adjustment terms", e.to_string()))?,
            effective_from: time(&self.effective_from)?,
            effective_until: self.effective_until.as_deref().map(time).transpose()?,
        })
    }
}

/// An egress volume as the table holds it (exact text), read back.
fn stored_gb(position: u64, gb: &str) -> Result<Decimal, StoreError> {
    Decimal::from_str(gb).map_err(|e| apply_error(position, format!("stored egress volume: {e}")))
}

/// A time as the ledger stores it and reads it back (to the microsecond).
fn stored_time(t: DateTime<Utc>) -> DateTime<Utc> {
    timestamp(t).parse().unwrap_or(t)
}

impl Known {
    async fn load(tx: &mut Tx, events: &[Read]) -> Result<Known, StoreError> {
        let (mut jobs, mut sites, mut tenants) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for read in events {
            let tenant = read.head.tenant.clone();
            match &read.event {
                Event::Job(JobEvent::Dispatched { .. }) => {}
                Event::Job(event) => {
                    if let Some(run) = Run::of(event) {
                        jobs.insert(read.head.aggregate.id.to_string());
                        sites.insert(run.site.to_string());
                        tenants.insert(tenant);
                    }
                }
                Event::Tenant(TenantEvent::AdjustmentGranted { tenant, .. }) => {
                    tenants.insert(tenant.clone());
                }
                Event::Workflow(WorkflowEvent::VolumeReleased { site, .. }) => {
                    sites.insert(site.clone());
                    tenants.insert(tenant);
                }
                Event::Transfer(TransferEvent::Completed {
                    from,
                    egress: Some(_),
                    ..
                }) => {
                    if let Location::Site { site } = from {
                        sites.insert(site.clone());
                    }
                    tenants.insert(tenant);
                }
                _ => {}
            }
        }
        let position = events.first().map_or(0, |r| r.position);
        let bad = |what: &str, e: String| apply_error(position, format!("stored {what}: {e}"));
        let mut known = Known::default();
        let select = "SELECT job_id, job, array_index, attempt FROM ledger_jobs WHERE job_id";
        for row in select_in(tx, select, &jobs).await? {
            let id: String = row.get(0);
            let id = Uuid::parse_str(&id).map_err(|e| bad("job id", e.to_string()))?;
            let info = JobInfo {
                name: row.get(1),
                index: row.get(2),
                attempt: row.get(3),
            };
            known.jobs.insert(id, info);
        }
        let select = "SELECT name, kind, region FROM ledger_sites WHERE name";
        for row in select_in(tx, select, &sites).await? {
            let kind: String = row.get(1);
            let info = SiteInfo {
                kind: serde_json::from_value(serde_json::Value::String(kind)).ok(),
                region: row.get(2),
            };
            known.sites.insert(row.get(0), info);
        }
        for tenant in &tenants {
            known.rules.insert(tenant.clone(), Vec::new());
        }
        let select = "SELECT adjustment_id, tenant, position, scope, terms, effective_from,
                effective_until FROM ledger_adjustments WHERE tenant";
        for row in select_in(tx, select, &tenants).await? {
            let stored = StoredRule {
                id: row.get(0),
                tenant: row.get(1),
                position: row.get(2),
                scope: row.get(3),
                terms: row.get(4),
                effective_from: row.get(5),
                effective_until: row.get(6),
            };
            let rule = stored.rule(position)?;
            known.rules.entry(stored.tenant).or_default().push(rule);
        }
        for rules in known.rules.values_mut() {
            rules.sort_by_key(|r| (r.order, r.id));
        }
        let select = "SELECT tenant, source, period, gb FROM ledger_egress_volume WHERE tenant";
        for row in select_in(tx, select, &tenants).await? {
            let period: String = row.get(2);
            let period = period
                .parse::<Period>()
                .map_err(|e| bad("period", e.to_string()))?;
            let gb: String = row.get(3);
            let key = (row.get(0), row.get(1), period);
            known.volumes.insert(key, stored_gb(position, &gb)?);
        }
        Ok(known)
    }

    fn site(&self, name: &str) -> SiteInfo {
        self.sites.get(name).cloned().unwrap_or_default()
    }

    fn rules(&self, tenant: &str) -> &[AdjustmentRule] {
        self.rules.get(tenant).map_or(&[], |r| r.as_slice())
    }

    /// Applies one event: what it changes, and the lines it bills.
    fn apply(&mut self, read: Read, writes: &mut Writes) -> Result<(), StoreError> {
        let Read {
            position,
            head,
            event,
        } = read;
        match event {
            Event::Job(JobEvent::Dispatched {
                job,
                index,
                attempt,
                ..
            }) => {
                let info = JobInfo {
                    name: job,
                    index: index.map(i64::from),
                    attempt: i64::from(attempt),
                };
                // The first dispatch recorded stands (`ON CONFLICT DO NOTHING`).
                if writes.job_ids.insert(head.aggregate.id) {
                    writes
                        .jobs
                        .push((head.aggregate.id.to_string(), info.clone()));
                }
                self.jobs.entry(head.aggregate.id).or_insert(info);
            }
            Event::Job(event) => {
                if let Some(run) = Run::of(&event) {
                    self.compute_charge(position, &head, run, writes)?;
                }
            }
            Event::Site(SiteEvent::Registered {
                name, kind, region, ..
            }) => {
                let info = SiteInfo {
                    kind: Some(kind),
                    region: Some(region.clone()),
                };
                self.sites.insert(name.clone(), info);
                writes.sites.insert(name, (kind.as_str(), region));
            }
            Event::Tenant(TenantEvent::AdjustmentGranted {
                adjustment_id,
                tenant,
                scope,
                terms,
                effective_from,
                effective_until,
                ..
            }) => {
                let json = |v: serde_json::Result<String>| {
                    v.map_err(|e| apply_error(position, e.to_string()))
                };
                let stored = StoredRule {
                    id: adjustment_id.to_string(),
                    tenant,
                    position: position as i64,
                    scope: json(serde_json::to_string(&scope))?,
                    terms: json(serde_json::to_string(&terms))?,
                    effective_from: timestamp(effective_from),
                    effective_until: effective_until.map(timestamp),
                };
                let rule = stored.rule(position)?;
                // A batch loads the rules of every tenant it grants to, and a replay
                // knows them all: the tenant's rules in memory are the table's.
                let rules = self.rules.entry(stored.tenant.clone()).or_default();
                if !rules.iter().any(|r| r.id == rule.id) {
                    rules.push(rule);
                    rules.sort_by_key(|r| (r.order, r.id));
                }
                if writes.grant_ids.insert(adjustment_id) {
                    writes.grants.push(stored);
                }
            }
            Event::Tenant(TenantEvent::AdjustmentRevoked {
                adjustment_id,
                effective_at,
                ..
            }) => {
                // The window only ever shrinks, so applying this twice changes nothing.
                let at = stored_time(effective_at);
                for rule in self.rules.values_mut().flatten() {
                    if rule.id == adjustment_id && rule.effective_until.is_none_or(|u| u > at) {
                        rule.effective_until = Some(at);
                    }
                }
                writes
                    .revocations
                    .push((adjustment_id.to_string(), timestamp(effective_at)));
            }
            Event::Workflow(WorkflowEvent::VolumeReleased {
                volume,
                class,
                site,
                bytes,
                rate,
                allocated_at,
                released_at,
            }) => {
                let metered = pricing::storage(&rate, bytes, allocated_at, released_at)
                    .map_err(|e| apply_error(position, e.to_string()))?;
                let place = self.site(&site);
                let workflow_id = head.aggregate.id;
                let gib =
                    Decimal::from(bytes) / Decimal::from(meridian_events::money::BYTES_PER_GIB);
                let charge = Charge {
                    category: ChargeKind::Storage,
                    workflow_id,
                    site: site.clone(),
                    site_kind: place.kind,
                    region: place.region,
                    resource_id: format!("{workflow_id}/{}/{volume}@{site}", class.as_str()),
                    resource_name: volume.clone(),
                    resource_type: match class {
                        meridian_events::vocabulary::workflow::StorageClass::Volume => "Volume",
                        meridian_events::vocabulary::workflow::StorageClass::Cache => "Cache",
                    },
                    job: None,
                    sku: format!("storage:{}", class.as_str()),
                    what: format!(
                        "{} {volume} on {site}, {} GiB held from {} to {}",
                        class.as_str(),
                        decimal(gib),
                        timestamp(allocated_at),
                        timestamp(released_at),
                    ),
                    price_source: rate.source.clone(),
                    price_effective_from: rate.effective_from,
                };
                let rules = self.rules(&head.tenant);
                lines(position, &head, &charge, rules, metered, writes)?;
            }
            Event::Transfer(TransferEvent::Completed {
                workflow_id,
                bytes,
                from,
                to,
                started_at,
                ended_at,
                egress: Some(tariff),
                ..
            }) => {
                let (source, place) = match &from {
                    Location::Site { site } => (site.clone(), self.site(site)),
                    Location::Region { region } => (
                        region.clone(),
                        SiteInfo {
                            kind: None,
                            region: Some(region.clone()),
                        },
                    ),
                };
                let tenant = head.tenant.clone();
                let key = |period: Period| (tenant.clone(), source.clone(), period);
                // The month's volume so far, per period this copy touches.
                let before: Vec<(Period, Decimal)> = crate::period::split(started_at, ended_at)
                    .into_iter()
                    .map(|piece| {
                        let gb = self.volumes.get(&key(piece.period)).copied();
                        (piece.period, gb.unwrap_or(Decimal::ZERO))
                    })
                    .collect();
                let mut already = |p: Period| {
                    before
                        .iter()
                        .find(|(q, _)| *q == p)
                        .map_or(Decimal::ZERO, |(_, gb)| *gb)
                };
                let metered = pricing::egress(&tariff, bytes, started_at, ended_at, &mut already)
                    .map_err(|e| apply_error(position, e.to_string()))?;
                for (period, gb) in &before {
                    let moved: Decimal = metered
                        .iter()
                        .filter(|m| m.piece.period == *period)
                        .map(|m| m.quantity)
                        .sum();
                    if !moved.is_zero() {
                        let text = decimal(*gb + moved);
                        self.volumes
                            .insert(key(*period), stored_gb(position, &text)?);
                        writes.volumes.insert(key(*period), text);
                    }
                }
                let to_label = match &to {
                    Location::Site { site } => site.clone(),
                    Location::Region { region } => region.clone(),
                };
                let charge = Charge {
                    category: ChargeKind::Egress,
                    workflow_id,
                    site: source.clone(),
                    site_kind: place.kind,
                    region: place.region,
                    resource_id: head.aggregate.id.to_string(),
                    resource_name: format!("{source} to {to_label}"),
                    resource_type: "Data Transfer",
                    job: None,
                    sku: "egress".into(),
                    what: format!("{bytes} bytes from {source} to {to_label}"),
                    price_source: tariff.source.clone(),
                    price_effective_from: tariff.effective_from,
                };
                lines(
                    position,
                    &head,
                    &charge,
                    self.rules(&tenant),
                    metered,
                    writes,
                )?;
            }
            _ => {}
        }
        Ok(())
    }

    fn compute_charge(
        &self,
        position: u64,
        head: &Head,
        run: Run<'_>,
        writes: &mut Writes,
    ) -> Result<(), StoreError> {
        let metered = pricing::compute(run.rate, run.allocated, run.started_at, run.ended_at)
            .map_err(|e| apply_error(position, e.to_string()))?;
        let job_id = head.aggregate.id;
        let job = self.jobs.get(&job_id).cloned();
        let place = self.site(run.site);
        let task = match &job {
            Some(j) => match j.index {
                Some(i) => format!("{}[{i}]", j.name),
                None => j.name.clone(),
            },
            None => job_id.to_string(),
        };
        let attempt = match &job {
            Some(j) if j.attempt > 1 => format!(", attempt {}", j.attempt),
            _ => String::new(),
        };
        let charge = Charge {
            category: ChargeKind::Compute,
            workflow_id: run.workflow_id,
            site: run.site.to_string(),
            site_kind: place.kind,
            region: place.region,
            resource_id: job_id.to_string(),
            resource_name: format!("{task}{attempt}"),
            resource_type: "Job Run",
            sku: run.rate.offer.clone(),
            what: format!(
                "{task} on {} ({}{attempt}, {})",
                run.site, run.rate.offer, run.outcome
            ),
            job: Some(JobRef {
                id: job_id,
                info: job,
            }),
            price_source: run.rate.source.clone(),
            price_effective_from: run.rate.effective_from,
        };
        let rules = self.rules(&head.tenant);
        lines(position, head, &charge, rules, metered, writes)
    }
}

/// A run that bills: it started, and its allocation is known. Its stretch is what the
/// site bills: the run's, or the billed interval the site reported.
struct Run<'a> {
    workflow_id: Uuid,
    site: &'a str,
    rate: &'a ComputeRate,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
    allocated: &'a Allocation,
    outcome: String,
}

impl<'a> Run<'a> {
    fn of(event: &'a JobEvent) -> Option<Run<'a>> {
        let (workflow_id, site, rate, started_at, ended_at, allocated, usage, outcome) = match event
        {
            JobEvent::Finished {
                workflow_id,
                site,
                rate,
                started_at,
                ended_at,
                allocated,
                usage,
                ..
            } => (
                workflow_id,
                site,
                rate,
                Some(*started_at),
                ended_at,
                allocated,
                usage,
                "finished".to_string(),
            ),
            JobEvent::Failed {
                workflow_id,
                site,
                rate,
                started_at,
                ended_at,
                allocated: Some(allocated),
                reason,
                usage,
                ..
            } => (
                workflow_id,
                site,
                rate,
                *started_at,
                ended_at,
                allocated,
                usage,
                format!("failed: {reason}"),
            ),
            JobEvent::Cancelled {
                workflow_id,
                site,
                rate,
                started_at,
                ended_at,
                allocated: Some(allocated),
                usage,
                ..
            } => (
                workflow_id,
                site,
                rate,
                *started_at,
                ended_at,
                allocated,
                usage,
                "cancelled".to_string(),
            ),
            _ => return None,
        };
        // A run that never started is charged only for what its site bills (a cloud
        // instance's life); one its site does not bill is not charged at all.
        let (from, to) = usage.charged(started_at, *ended_at)?;
        Some(Run {
            workflow_id: *workflow_id,
            site,
            rate,
            started_at: from,
            ended_at: to,
            allocated,
            outcome,
        })
    }
}

/// What every line of one billable event shares.
struct Charge {
    category: ChargeKind,
    workflow_id: Uuid,
    /// The site, or the region egress left.
    site: String,
    site_kind: Option<SiteKind>,
    region: Option<String>,
    resource_id: String,
    resource_name: String,
    resource_type: &'static str,
    job: Option<JobRef>,
    sku: String,
    /// What was charged for, for the line's description.
    what: String,
    price_source: String,
    price_effective_from: DateTime<Utc>,
}

fn meter_label(meter: Meter) -> &'static str {
    match meter {
        Meter::InstanceHours => "instances",
        Meter::CoreHours => "cores",
        Meter::MemoryGibHours => "memory",
        Meter::GpuHours => "GPUs",
        Meter::StorageGibHours => "space",
        Meter::EgressGb => "data",
    }
}

/// One row of `ledger_charges`, in [`COLUMNS`] order.
struct Line {
    event_id: String,
    item: String,
    position: i64,
    tenant: String,
    workflow_id: String,
    category: &'static str,
    meter: &'static str,
    unit: &'static str,
    period: String,
    charge_start: String,
    charge_end: String,
    site: String,
    site_kind: Option<&'static str>,
    region: Option<String>,
    resource_id: String,
    resource_name: String,
    resource_type: &'static str,
    job_id: Option<String>,
    job: Option<String>,
    array_index: Option<i64>,
    attempt: Option<i64>,
    sku: String,
    band: Option<i64>,
    description: String,
    quantity: String,
    list_unit_price: String,
    contracted_unit_price: String,
    list_cost: String,
    contracted_cost: String,
    currency: String,
    adjustment_id: Option<String>,
    price_source: String,
    price_effective_from: String,
}

/// Prices `metered` with the tenant's adjustments into lines to write.
fn lines(
    position: u64,
    head: &Head,
    charge: &Charge,
    rules: &[AdjustmentRule],
    metered: Vec<Metered>,
    writes: &mut Writes,
) -> Result<(), StoreError> {
    let (job_id, job, index, attempt) = match &charge.job {
        Some(j) => (
            Some(j.id.to_string()),
            j.info.as_ref().map(|i| i.name.clone()),
            j.info.as_ref().and_then(|i| i.index),
            j.info.as_ref().map(|i| i.attempt),
        ),
        None => (None, None, None, None),
    };
    for m in metered {
        let p = pricing::price(m, &charge.site, charge.site_kind, rules)
            .map_err(|e| apply_error(position, e.to_string()))?;
        let m = &p.metered;
        let description = match (charge.category, m.band) {
            (ChargeKind::Compute, _) => {
                format!("compute, {}: {}", meter_label(m.meter), charge.what)
            }
            (ChargeKind::Egress, Some(band)) if band > 0 => {
                format!("egress: {} (tier {band})", charge.what)
            }
            (category, _) => format!("{category}: {}", charge.what),
        };
        writes.charges.push(Line {
            event_id: head.event_id.to_string(),
            item: m.item(),
            position: position as i64,
            tenant: head.tenant.clone(),
            workflow_id: charge.workflow_id.to_string(),
            category: charge.category.as_str(),
            meter: m.meter.as_str(),
            unit: m.meter.unit(),
            period: m.piece.period.to_string(),
            charge_start: timestamp(m.piece.start),
            charge_end: timestamp(m.piece.end),
            site: charge.site.clone(),
            site_kind: charge.site_kind.map(|k| k.as_str()),
            region: charge.region.clone(),
            resource_id: charge.resource_id.clone(),
            resource_name: charge.resource_name.clone(),
            resource_type: charge.resource_type,
            job_id: job_id.clone(),
            job: job.clone(),
            array_index: index,
            attempt,
            sku: charge.sku.clone(),
            band: m.band.map(|b| b as i64),
            description,
            quantity: decimal(m.quantity),
            list_unit_price: decimal(m.list_unit_price),
            contracted_unit_price: decimal(p.contracted_unit_price),
            list_cost: decimal(p.list_cost),
            contracted_cost: decimal(p.contracted_cost),
            currency: m.currency.to_string(),
            adjustment_id: p.adjustment.map(|a| a.to_string()),
            price_source: charge.price_source.clone(),
            price_effective_from: timestamp(charge.price_effective_from),
        });
    }
    Ok(())
}

/// What a batch writes, in the order [`Writes::flush`] writes it.
#[derive(Default)]
struct Writes {
    jobs: Vec<(String, JobInfo)>,
    job_ids: HashSet<Uuid>,
    /// The last registration of each site in the batch. Sites and volumes are written
    /// in key order, so replicas writing the same rows lock them in the same order and
    /// PostgreSQL has no deadlock to break.
    sites: BTreeMap<String, (&'static str, String)>,
    grants: Vec<StoredRule>,
    grant_ids: HashSet<Uuid>,
    /// (adjustment id, end), applied after the grants, in log order.
    revocations: Vec<(String, String)>,
    /// Each egress volume the batch changed, at its last value.
    volumes: BTreeMap<(String, String, Period), String>,
    charges: Vec<Line>,
}

/// Arguments bound ahead of time: a rebuild binds a page's rows on the thread that
/// priced them, so that the writer only runs statements.
type Arguments = sqlx::any::AnyArguments<'static>;

/// A statement ready to run: its text and its arguments.
struct Statement {
    sql: String,
    arguments: Arguments,
}

impl Statement {
    async fn execute(self, tx: &mut Tx) -> Result<(), StoreError> {
        sqlx::query_with(&self.sql, self.arguments)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

/// Adds one argument.
fn put<T>(arguments: &mut Arguments, value: T) -> Result<(), StoreError>
where
    T: sqlx::Encode<'static, sqlx::Any> + sqlx::Type<sqlx::Any> + 'static,
{
    use sqlx::Arguments as _;
    arguments.add(value).map_err(sqlx::Error::Encode)?;
    Ok(())
}

fn bind_job(a: &mut Arguments, (id, info): (String, JobInfo)) -> Result<(), StoreError> {
    put(a, id)?;
    put(a, info.name)?;
    put(a, info.index)?;
    put(a, info.attempt)
}

fn bind_site(
    a: &mut Arguments,
    (name, (kind, region)): (String, (&'static str, String)),
) -> Result<(), StoreError> {
    put(a, name)?;
    put(a, kind)?;
    put(a, region)
}

fn bind_grant(a: &mut Arguments, r: StoredRule) -> Result<(), StoreError> {
    put(a, r.id)?;
    put(a, r.tenant)?;
    put(a, r.position)?;
    put(a, r.scope)?;
    put(a, r.terms)?;
    put(a, r.effective_from)?;
    put(a, r.effective_until)
}

type VolumeRow = ((String, String, Period), String);

fn bind_volume(
    a: &mut Arguments,
    ((tenant, source, period), gb): VolumeRow,
) -> Result<(), StoreError> {
    put(a, tenant)?;
    put(a, source)?;
    put(a, period.to_string())?;
    put(a, gb)
}

fn bind_line(a: &mut Arguments, l: Line) -> Result<(), StoreError> {
    put(a, l.event_id)?;
    put(a, l.item)?;
    put(a, l.position)?;
    put(a, l.tenant)?;
    put(a, l.workflow_id)?;
    put(a, l.category)?;
    put(a, l.meter)?;
    put(a, l.unit)?;
    put(a, l.period)?;
    put(a, l.charge_start)?;
    put(a, l.charge_end)?;
    put(a, l.site)?;
    put(a, l.site_kind)?;
    put(a, l.region)?;
    put(a, l.resource_id)?;
    put(a, l.resource_name)?;
    put(a, l.resource_type)?;
    put(a, l.job_id)?;
    put(a, l.job)?;
    put(a, l.array_index)?;
    put(a, l.attempt)?;
    put(a, l.sku)?;
    put(a, l.band)?;
    put(a, l.description)?;
    put(a, l.quantity)?;
    put(a, l.list_unit_price)?;
    put(a, l.contracted_unit_price)?;
    put(a, l.list_cost)?;
    put(a, l.contracted_cost)?;
    put(a, l.currency)?;
    put(a, l.adjustment_id)?;
    put(a, l.price_source)?;
    put(a, l.price_effective_from)
}

impl Writes {
    async fn flush(self, tx: &mut Tx) -> Result<(), StoreError> {
        let style = Placeholders::of(tx);
        for statement in self.statements(style)? {
            statement.execute(tx).await?;
        }
        Ok(())
    }

    /// The statements that write the batch, in order, with their arguments bound.
    fn statements(self, style: Placeholders) -> Result<Vec<Statement>, StoreError> {
        let mut out = Vec::new();
        insert_rows(
            &mut out,
            style,
            "INSERT INTO ledger_jobs (job_id, job, array_index, attempt)",
            4,
            "ON CONFLICT (job_id) DO NOTHING",
            self.jobs,
            bind_job,
        )?;
        insert_rows(
            &mut out,
            style,
            "INSERT INTO ledger_sites (name, kind, region)",
            3,
            "ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, region = excluded.region",
            self.sites.into_iter().collect(),
            bind_site,
        )?;
        insert_rows(
            &mut out,
            style,
            "INSERT INTO ledger_adjustments
                (adjustment_id, tenant, position, scope, terms, effective_from, effective_until)",
            7,
            "ON CONFLICT (adjustment_id) DO NOTHING",
            self.grants,
            bind_grant,
        )?;
        for (id, at) in self.revocations {
            let mut arguments = Arguments::default();
            put(&mut arguments, at.clone())?;
            put(&mut arguments, id)?;
            put(&mut arguments, at)?;
            out.push(Statement {
                sql: "UPDATE ledger_adjustments SET effective_until = $1
                 WHERE adjustment_id = $2 AND (effective_until IS NULL OR effective_until > $3)"
                    .to_string(),
                arguments,
            });
        }
        insert_rows(
            &mut out,
            style,
            "INSERT INTO ledger_egress_volume (tenant, source, period, gb)",
            4,
            "ON CONFLICT (tenant, source, period) DO UPDATE SET gb = excluded.gb",
            self.volumes.into_iter().collect(),
            bind_volume,
        )?;
        insert_rows(
            &mut out,
            style,
            &format!("INSERT INTO ledger_charges ({})", COLUMNS.join(", ")),
            COLUMNS.len(),
            "ON CONFLICT (event_id, item) DO NOTHING",
            self.charges,
            bind_line,
        )?;
        Ok(out)
    }
}

/// Rows per multi-row statement at most, and parameters (SQLite allows 32,766,
/// PostgreSQL 65,535).
const MAX_ROWS: usize = 128;
const MAX_PARAMETERS: usize = 30_000;

/// How `n` rows are cut into statements: the largest power of two that fits each time,
/// so that a handful of statement texts serve every batch (each is prepared once, then
/// found in the connection's cache by its text).
fn pieces(n: usize, columns: usize) -> impl Iterator<Item = usize> {
    let max = (MAX_PARAMETERS / columns).clamp(1, MAX_ROWS);
    let mut left = n;
    std::iter::from_fn(move || {
        (left > 0).then(|| {
            let take = 1usize << left.min(max).ilog2();
            left -= take;
            take
        })
    })
}

/// How a statement names its parameters: `$1, $2, …` for PostgreSQL; plain `?` for
/// SQLite, where sqlx looks each numbered name up in a list as long as the statement's
/// (so binding a statement of n numbered parameters costs n², which made a 128-row
/// insert slower than 128 single ones).
#[derive(Clone, Copy)]
enum Placeholders {
    Numbered,
    Anonymous,
}

impl Placeholders {
    fn of(tx: &mut Tx) -> Placeholders {
        Placeholders::for_backend(if tx.backend_name().eq_ignore_ascii_case("sqlite") {
            Backend::Sqlite
        } else {
            Backend::Postgres
        })
    }

    fn for_backend(backend: Backend) -> Placeholders {
        match backend {
            Backend::Sqlite => Placeholders::Anonymous,
            Backend::Postgres => Placeholders::Numbered,
        }
    }

    /// `(p, p, …)` for `count` parameters, the first being number `first`.
    fn list(self, sql: &mut String, first: usize, count: usize) {
        use std::fmt::Write;
        sql.push('(');
        for i in 0..count {
            if i > 0 {
                sql.push_str(", ");
            }
            match self {
                Placeholders::Numbered => {
                    let _ = write!(sql, "${}", first + i);
                }
                Placeholders::Anonymous => sql.push('?'),
            }
        }
        sql.push(')');
    }
}

/// `head VALUES (…), (…) tail` for `rows` rows of `columns` values.
fn values(style: Placeholders, head: &str, columns: usize, rows: usize, tail: &str) -> String {
    let mut sql = String::with_capacity(head.len() + tail.len() + rows * columns * 6 + 16);
    sql.push_str(head);
    sql.push_str(" VALUES ");
    for r in 0..rows {
        if r > 0 {
            sql.push_str(", ");
        }
        style.list(&mut sql, r * columns + 1, columns);
    }
    sql.push(' ');
    sql.push_str(tail);
    sql
}

/// The statements that insert `rows`, as few as [`pieces`] allows, added to `out`.
fn insert_rows<R>(
    out: &mut Vec<Statement>,
    style: Placeholders,
    head: &str,
    columns: usize,
    tail: &str,
    rows: Vec<R>,
    bind: fn(&mut Arguments, R) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut left = rows.into_iter();
    for n in pieces(left.len(), columns) {
        let mut arguments = Arguments::default();
        for row in left.by_ref().take(n) {
            bind(&mut arguments, row)?;
        }
        out.push(Statement {
            sql: values(style, head, columns, n, tail),
            arguments,
        });
    }
    Ok(())
}

/// The rows of `select … WHERE column` `IN` the given keys, 256 keys to a statement
/// (the last list padded with its last key, so that one statement text serves all).
async fn select_in(
    tx: &mut Tx,
    select: &str,
    keys: &BTreeSet<String>,
) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
    const KEYS: usize = 256;
    let keys: Vec<&String> = keys.iter().collect();
    let mut rows = Vec::new();
    if keys.is_empty() {
        return Ok(rows);
    }
    let mut sql = format!("{select} IN ");
    Placeholders::of(tx).list(&mut sql, 1, KEYS);
    for chunk in keys.chunks(KEYS) {
        let mut query = sqlx::query(&sql);
        for i in 0..KEYS {
            query = query.bind(chunk[i.min(chunk.len() - 1)].clone());
        }
        rows.extend(query.fetch_all(&mut **tx).await?);
    }
    Ok(rows)
}
