//! The router decides where a workflow runs and when each of its jobs may start.
//! It reads the whole log through its durable subscription and reacts:
//! - a submitted workflow is placed ([`placement::decide`]) or rejected with a reason
//!   per site;
//! - a placed workflow's runnable tasks (its DAG and each array's parallelism cap, as
//!   the pure Workflow aggregate computes them) are released, and each release is
//!   dispatched as a new Job aggregate carrying the price in force;
//! - a job that ended is settled into its workflow, which then finishes, fails or
//!   releases what became runnable;
//! - a cancel request is passed to each running job.
//!
//! Every reaction re-derives what should happen from aggregate state, so delivering a
//! commit twice (after a crash) decides nothing twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use meridian_eventlog::aggregates::{self, Cached, ExecuteError};
use meridian_eventlog::deferred::{Deferred, Failed};
use meridian_eventlog::read_ahead::ReadAhead;
use meridian_eventlog::{snapshot, EventLog, LogError};
use meridian_events::aggregate::{
    Job, JobCommand, JobError, Workflow, WorkflowCommand, WorkflowError, WorkflowState,
};
use meridian_events::vocabulary::workflow::StorageClass;
use meridian_events::{
    AggregateKind, ArrayBatch, Envelope, Event, EventContext, JobEvent, JobOutcome, SiteEvent,
    TaskRef, TenantEvent, TextEnvelope, WorkflowEvent,
};
use meridian_ops::{counted, trace};
use tokio::sync::watch;
use tracing::Instrument;
use uuid::Uuid;

use meridian_domain::{placement, Catalog};

/// The durable subscription the router reads through.
pub const SUBSCRIPTION: &str = "router";

/// Workflows read from the log at once when many wait to be reconciled.
const PREFETCH: usize = 64;
/// How many workflows of a long list are decided before their decisions are appended,
/// while the next ones are decided (as many as the log has chains in flight).
const AHEAD: usize = 1024;
/// How many delivered batches may have their decisions on the way to the log at once,
/// while the next batch is read and decided.
const IN_FLIGHT: usize = 4;
/// How long the loop waits for more commits while workflows wait to be decided again
/// (their decisions landed, or met a conflict), rather than a whole second.
const LANDING_WAIT: Duration = Duration::from_millis(5);
/// How many times a workflow's decisions may meet a conflict in a row before it is left
/// to the next delivery of its events.
const CONFLICT_ROUNDS: u32 = 8;

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("workflow {id}: {source}")]
    Workflow {
        id: Uuid,
        source: ExecuteError<WorkflowError>,
    },
    #[error("job {id}: {source}")]
    Job {
        id: Uuid,
        source: ExecuteError<JobError>,
    },
}

/// What a release said, needed to dispatch it.
#[derive(Debug, Clone)]
struct Release {
    task: TaskRef,
    site: String,
    attempt: u32,
    batch: Option<ArrayBatch>,
}

pub struct Router {
    log: Arc<dyn EventLog>,
    catalog: Catalog,
    workflows: HashMap<Uuid, Cached<Workflow>>,
    jobs: HashMap<Uuid, Cached<Job>>,
    /// job id → its workflow, for routing job events to the workflow they belong to.
    job_workflow: HashMap<Uuid, Uuid>,
    releases: HashMap<Uuid, Release>,
    /// Per workflow: sites that failed its work for site reasons, and until when each
    /// is kept out of its placement.
    exclusions: HashMap<Uuid, BTreeMap<String, Exclusion>>,
    /// Per workflow: no release before this instant (the backoff after a site fault).
    not_before: BTreeMap<Uuid, DateTime<Utc>>,
    backoff_base: chrono::Duration,
    /// Job runs whose site fault was already counted.
    faulted_jobs: std::collections::HashSet<Uuid>,
    /// Workflows not placed yet (waiting for a site to connect, or not seen to yet):
    /// placed again when a site changes.
    unplaced: BTreeSet<Uuid>,
    /// Whether a site changed since the unplaced workflows were last tried.
    sites_changed: bool,
    /// Per tenant: its workflows placed and not ended, for its concurrency limit.
    active: HashMap<String, BTreeSet<Uuid>>,
    /// Per tenant: its workflows held for that limit, placed oldest first.
    limit_held: HashMap<String, BTreeSet<Uuid>>,
    /// Per tenant: the GPUs of each of its jobs released and not ended.
    gpus: HashMap<String, BTreeMap<Uuid, u32>>,
    /// Workflows with a task held back for their tenant's GPU limit.
    gpu_held: BTreeSet<Uuid>,
    /// Whether GPUs were freed since the held workflows were last tried.
    gpus_freed: bool,
    /// The last refusal of a command by an aggregate, logged at WARN.
    last_refusal: Option<String>,
    /// What was decided while working through the delivered batch, sent to the log when
    /// the batch is done, each workflow's commits in order (see `meridian_eventlog::deferred`).
    deferred: Deferred,
    /// Decisions on the way to the log while more are decided, oldest first: a
    /// delivered batch's, or a long list's (see [`Router::reconcile_many`]).
    in_flight: std::collections::VecDeque<InFlight>,
    /// Workflows to decide once their decisions in flight have landed, each with the
    /// lowest position not acknowledged until they are decided: a commit about it, or
    /// the first of the batch whose decisions for it met a conflict (`u64::MAX`: none,
    /// for a workflow from a list kept in memory).
    postponed: BTreeMap<Uuid, u64>,
    /// Per workflow: the conflicts its decisions met in a row.
    conflicts: HashMap<Uuid, u32>,
    /// Woken as decisions in flight land.
    landing: Arc<tokio::sync::Notify>,
    /// The last position delivered since the subscription opened, and the last acknowledged.
    delivered: u64,
    acked: u64,
    /// The log position the start folded up to.
    folded_to: u64,
    /// [`Work`] folded from the commits the log holds up to `logged_to` (the start's
    /// fold, then each commit delivered): the router's own fields are ahead of the log
    /// while its decisions travel, this never is. Saved with the catalogue as the
    /// snapshot.
    logged: Work,
    logged_to: u64,
    /// Saves a new snapshot in the background every so many commits delivered.
    snapshots: snapshot::Refresh,
}

/// Decisions on the way to the log (a delivered batch's, or a long list's) while more
/// are decided.
struct InFlight {
    task: tokio::task::JoinHandle<Vec<Failed>>,
    /// Set once the appends are done, just before the task ends (and wakes the loop).
    done: Arc<std::sync::atomic::AtomicBool>,
    /// The workflows whose commits it appends: their next decisions wait for it to land.
    chains: std::collections::HashSet<Uuid>,
    /// The lowest position whose decisions it carries: nothing from there on is
    /// acknowledged before it has landed (`u64::MAX`: none, for a list kept in memory).
    from: u64,
}

/// Refusals that mean a decision was already carried out (a commit delivered again after
/// a restart, a race with another event): nothing is wrong, and they are logged at DEBUG.
fn already_done(e: &WorkflowError) -> bool {
    matches!(
        e,
        WorkflowError::AlreadySubmitted
            | WorkflowError::AlreadyTerminal { .. }
            | WorkflowError::AlreadyCancelled
            | WorkflowError::AlreadyPlaced
            | WorkflowError::JobNotReleased { .. }
            | WorkflowError::DuplicateJobId { .. }
            | WorkflowError::VolumeAlreadyAllocated { .. }
            | WorkflowError::VolumeNotAllocated { .. }
            | WorkflowError::StaleBill { .. }
    ) || matches!(e, WorkflowError::JobNotRunnable { reason, .. } if reason.contains("already released"))
}

/// What the router folds from the log before it serves: the catalogue and the work
/// waiting on it. Kept as the router's snapshot, so that a restart folds only the
/// commits after the last one (see `meridian_eventlog::snapshot`).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RouterStart {
    pub catalog: Catalog,
    pub work: Work,
    /// The position of the snapshot it started from, if one was used.
    #[serde(skip)]
    pub from_snapshot: Option<u64>,
    /// Commits it read from the log (after the snapshot, if one was used).
    #[serde(skip)]
    pub read: u64,
    /// The unplaced workflows whose whole history it read, when asked to keep them.
    #[serde(skip)]
    histories: Histories,
}

/// The histories of unplaced workflows submitted after the snapshot, as the start read
/// them: the router begins with those workflows cached instead of reading each one
/// again (after a restart with a backlog, thousands of reads, the longest part of it).
/// Kept as text, each event's sequence and JSON, and decoded only for the workflows
/// still unplaced at the end of the fold.
#[derive(Debug, Default)]
struct Histories(HashMap<Uuid, Vec<(u64, String)>>);

impl Histories {
    /// Called after [`Work::visit`] saw `read`: keeps an unplaced workflow's events in
    /// order from its first; a workflow placed, ended or seen with a gap is dropped (it
    /// is read from the log if the router needs it).
    fn visit(&mut self, work: &Work, read: &TextEnvelope<'_>) {
        let envelope = &read.envelope;
        if envelope.aggregate.kind != AggregateKind::Workflow {
            return;
        }
        let id = envelope.aggregate.id;
        if !work.unplaced.contains(&id) {
            self.0.remove(&id);
            return;
        }
        let kept = (envelope.sequence, read.text.to_string());
        match self.0.get_mut(&id) {
            None if envelope.sequence == 1 => {
                self.0.insert(id, vec![kept]);
            }
            None => {}
            Some(history) => {
                let last = history.last().map_or(0, |(sequence, _)| *sequence);
                if envelope.sequence == last + 1 {
                    history.push(kept);
                } else if envelope.sequence > last {
                    self.0.remove(&id);
                }
                // At or below the last: a commit read again; already kept.
            }
        }
    }

    /// Each kept workflow, its history decoded and folded.
    fn fold(self) -> Result<Vec<(Uuid, aggregates::Loaded<Workflow>)>, LogError> {
        // Sized at once (and the router's cache reserved for them): grown by doubling,
        // half of a 10,000-workflow backlog's fold went on the kernel zeroing fresh
        // pages for each larger copy.
        let mut folded = Vec::with_capacity(self.0.len());
        for (id, history) in self.0 {
            let decoded = history
                .iter()
                .map(|(sequence, text)| {
                    TextEnvelope::parse(text)
                        .and_then(|read| read.decode_event())
                        .map_err(|e| LogError::Corrupt {
                            position: 0,
                            message: format!("workflow/{id} #{sequence}: {e}"),
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            folded.push((id, aggregates::fold_decoded::<Workflow>(decoded)));
        }
        Ok(folded)
    }
}

/// What a running router saves as its snapshot: encodes as [`RouterStart`] does.
#[derive(serde::Serialize)]
struct SavedStart<'a> {
    catalog: &'a Catalog,
    work: &'a Work,
}

/// The work the router picks up again at start.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Work {
    /// Workflows submitted and never placed: their submissions may have been
    /// acknowledged long ago (one waits for a site), so they are tried again at start.
    pub unplaced: BTreeSet<Uuid>,
    /// Per tenant: its workflows placed and not ended.
    pub active: HashMap<String, BTreeSet<Uuid>>,
    /// Per tenant: the GPUs of each of its jobs released and not ended.
    pub gpus: HashMap<String, BTreeMap<Uuid, u32>>,
    /// Workflows with a task held back for their tenant's GPU limit.
    pub gpu_held: BTreeSet<Uuid>,
}

/// The name the router's snapshot is kept under, and its format (the catalogue's in
/// the high half): bump it whenever [`Work`] or how an event folds into it changes.
pub const SNAPSHOT: &str = "router";
const SNAPSHOT_FORMAT: u32 = (meridian_domain::catalog::SNAPSHOT_FORMAT << 16) | 1;

impl RouterStart {
    /// From the router's snapshot and the commits after it up to the log's head when it
    /// began (or the whole log, when there is no snapshot that matches it); saves a new
    /// snapshot when it read `save_after` commits or more. A failure to save is logged:
    /// the state is good all the same.
    pub async fn load(log: &dyn EventLog, save_after: u64) -> Result<RouterStart, LogError> {
        RouterStart::fold(log, save_after, false).await
    }

    /// [`RouterStart::load`], keeping [`Histories`] when `keep_histories`.
    async fn fold(
        log: &dyn EventLog,
        save_after: u64,
        keep_histories: bool,
    ) -> Result<RouterStart, LogError> {
        let mut start = match snapshot::load::<RouterStart>(log, SNAPSHOT, SNAPSHOT_FORMAT).await? {
            Some((position, start)) => RouterStart {
                from_snapshot: Some(position),
                ..start
            },
            None => RouterStart::default(),
        };
        let RouterStart {
            catalog,
            work,
            histories,
            ..
        } = &mut start;
        // Up to the head as it is now: what comes after is delivered to the router as
        // it runs, and a fold that followed the head would not end while writers append.
        let until = log.head().await?;
        start.read = catalog
            .catch_up_to(log, until, |raw| {
                work.visit(raw);
                if keep_histories {
                    histories.visit(work, raw);
                }
            })
            .await?;
        if start.read >= save_after {
            let position = start.catalog.position();
            match snapshot::save(log, SNAPSHOT, SNAPSHOT_FORMAT, position, &start).await {
                Ok(()) => tracing::info!(position, read = start.read, "router: saved a snapshot"),
                Err(e) => tracing::warn!(error = %e, "router: could not save a snapshot"),
            }
        }
        Ok(start)
    }

    /// Folds the whole log, ignoring and saving no snapshot: what [`RouterStart::load`]
    /// must equal.
    pub async fn fold_whole_log(log: &dyn EventLog) -> Result<RouterStart, LogError> {
        let mut start = RouterStart::default();
        let RouterStart { catalog, work, .. } = &mut start;
        let until = log.head().await?;
        start.read = catalog
            .catch_up_to(log, until, |raw| work.visit(raw))
            .await?;
        Ok(start)
    }
}

impl Work {
    /// Folds in one event read as text (a start's fold): its payload is decoded only
    /// for a dispatch's GPUs.
    fn visit(&mut self, read: &TextEnvelope<'_>) {
        let raw = &read.envelope;
        self.fold(&read.kind, raw.aggregate.id, &raw.tenant, || {
            #[derive(serde::Deserialize)]
            struct Dispatched {
                resources: Option<meridian_spec::Resources>,
            }
            serde_json::from_str::<Dispatched>(raw.payload.get())
                .ok()
                .and_then(|d| d.resources)
                .map_or(0, |r| r.gpus_total())
        });
    }

    /// Folds in one event delivered to the running router, decoded already: what
    /// [`Work::visit`] folds from the same event read as text.
    fn observe(&mut self, envelope: &Envelope<Event>) {
        self.fold(
            envelope.payload.kind(),
            envelope.aggregate.id,
            &envelope.tenant,
            || match &envelope.payload {
                Event::Job(JobEvent::Dispatched { resources, .. }) => resources.gpus_total(),
                _ => 0,
            },
        );
    }

    /// Folds in the event of type `kind` about aggregate `id` of `tenant`;
    /// `dispatched_gpus` reads a job dispatch's GPUs.
    fn fold(&mut self, kind: &str, id: Uuid, tenant: &str, dispatched_gpus: impl FnOnce() -> u32) {
        match kind {
            "workflow.submitted.v1" => {
                self.unplaced.insert(id);
            }
            "workflow.placement_decided.v1" => {
                self.unplaced.remove(&id);
                self.active
                    .entry(tenant.to_string())
                    .or_default()
                    .insert(id);
            }
            // A hold lasts until the next release; held work is tried again at start.
            "workflow.release_held.v1" => {
                self.gpu_held.insert(id);
            }
            "workflow.job_released.v1" => {
                self.gpu_held.remove(&id);
            }
            "workflow.finished.v1" | "workflow.failed.v1" | "workflow.cancelled.v1" => {
                self.unplaced.remove(&id);
                self.gpu_held.remove(&id);
                if let Some(placed) = self.active.get_mut(tenant) {
                    placed.remove(&id);
                }
            }
            "job.dispatched.v1" => {
                let n = dispatched_gpus();
                if n > 0 {
                    self.gpus
                        .entry(tenant.to_string())
                        .or_default()
                        .insert(id, n);
                }
            }
            "job.finished.v1" | "job.failed.v1" | "job.cancelled.v1" => {
                if let Some(jobs) = self.gpus.get_mut(tenant) {
                    jobs.remove(&id);
                }
            }
            _ => {}
        }
    }
}

/// A site kept out of one workflow's placement after failing its work.
#[derive(Debug, Clone)]
pub struct Exclusion {
    pub faults: u32,
    pub until: DateTime<Utc>,
}

/// How long a site stays excluded (and releases wait) after its `faults`-th fault:
/// `base` (30 s by default), doubling each time, at most an hour.
pub fn backoff(base: chrono::Duration, faults: u32) -> chrono::Duration {
    let doubled = base * (1i32 << faults.saturating_sub(1).min(7));
    doubled.min(chrono::Duration::hours(1))
}

impl Router {
    /// A router that starts from its snapshot (and the log after it), saving a new one
    /// whenever it has read [`snapshot::SAVE_AFTER`] commits past the last.
    pub async fn new(log: Arc<dyn EventLog>) -> Result<Router, RouterError> {
        Router::with_snapshots_every(log, snapshot::SAVE_AFTER).await
    }

    /// [`Router::new`], saving a snapshot every `commits` commits read past the last.
    pub async fn with_snapshots_every(
        log: Arc<dyn EventLog>,
        commits: u64,
    ) -> Result<Router, RouterError> {
        let began = std::time::Instant::now();
        let start = RouterStart::fold(&*log, commits, true).await?;
        tracing::info!(
            read = start.read,
            snapshot = ?start.from_snapshot,
            took_ms = began.elapsed().as_millis() as u64,
            "router: folded the log's commits after its snapshot (or the whole log, without one)"
        );
        let folded_to = start.catalog.position();
        let RouterStart {
            catalog,
            work,
            histories,
            ..
        } = start;
        let logged = work.clone();
        let Work {
            unplaced,
            active,
            gpus,
            gpu_held,
        } = work;
        let mut router = Router {
            log,
            catalog,
            workflows: HashMap::new(),
            jobs: HashMap::new(),
            job_workflow: HashMap::new(),
            releases: HashMap::new(),
            exclusions: HashMap::new(),
            not_before: BTreeMap::new(),
            backoff_base: chrono::Duration::seconds(30),
            faulted_jobs: std::collections::HashSet::new(),
            sites_changed: !unplaced.is_empty(),
            unplaced,
            active,
            limit_held: HashMap::new(),
            gpus,
            gpus_freed: !gpu_held.is_empty(),
            gpu_held,
            last_refusal: None,
            deferred: Deferred::default(),
            in_flight: Default::default(),
            postponed: BTreeMap::new(),
            conflicts: HashMap::new(),
            landing: Default::default(),
            delivered: 0,
            acked: 0,
            folded_to,
            logged,
            logged_to: folded_to,
            snapshots: snapshot::Refresh::every(commits),
        };
        let folded = histories.fold()?;
        router.workflows.reserve(folded.len());
        for (id, loaded) in folded {
            router.cache_loaded(id, loaded);
        }
        Ok(router)
    }

    /// The first backoff after a site fault (then doubling); 30 s unless set.
    pub fn with_backoff(mut self, base: Duration) -> Router {
        self.backoff_base = chrono::Duration::from_std(base).unwrap_or(self.backoff_base);
        self
    }

    /// Runs until `shutdown` turns true. Transient log errors are retried. A snapshot
    /// fold under way is given up to 10 s to finish at a stop.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), RouterError> {
        let mut backoff = Duration::from_millis(100);
        loop {
            if *shutdown.borrow() {
                break;
            }
            match self.serve(&mut shutdown).await {
                Ok(()) => break,
                Err(RouterError::Log(e)) if e.is_transient() => {
                    tracing::warn!(error = %e, "router: log unavailable; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.changed() => break,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
        self.snapshots.finish(snapshot::FINISH_WITHIN).await;
        Ok(())
    }

    async fn serve(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<(), RouterError> {
        // Decisions that failed part-way were never stored: their workflows are read
        // afresh, and decided again when a delivered commit not acknowledged comes
        // again, or (from a list kept in memory) as put off below.
        for flight in std::mem::take(&mut self.in_flight) {
            for failed in landed(flight.task).await {
                self.forget(failed.chain, &failed.unwritten);
                self.put_off(failed.chain, u64::MAX);
            }
        }
        for (workflow, aggregates) in self.deferred.discard() {
            self.forget(workflow, &aggregates);
        }
        // Workflows put off stay put off: their positions are the log's, and what a list
        // kept in memory put off would not come again.
        self.conflicts.clear();
        // Read ahead: the next batch is fetched and decoded while this one is decided.
        let mut sub = ReadAhead::new(
            self.log.subscribe(SUBSCRIPTION).await?,
            256,
            &AggregateKind::ALL,
        );
        (self.delivered, self.acked) = (0, 0);
        loop {
            // Put-off workflows whose decisions have landed are decided in the next pass,
            // which need not wait for commits; those still waiting are woken by landing.
            let wait = if self.postponed.keys().any(|w| !self.in_flight_holds(*w)) {
                LANDING_WAIT
            } else {
                Duration::from_secs(1)
            };
            let landing = self.landing.clone();
            let commits = tokio::select! {
                next = sub.next(wait) => next?,
                _ = landing.notified(), if !self.in_flight.is_empty() => Vec::new(),
                _ = shutdown.changed() => {
                    // A clean stop acknowledges what landed; the rest comes again.
                    match self.land(true).await {
                        Ok(()) => self.acknowledge(&sub),
                        Err(e) => tracing::warn!(error = %e, "router: decisions in flight at the stop failed; their commits come again at the next start"),
                    }
                    sub.finish(Duration::from_secs(5)).await;
                    return Ok(());
                }
            };
            // What has landed meanwhile.
            self.land(false).await?;
            // Workflows whose backoff ended get their turn again.
            let now = Utc::now();
            let due: Vec<Uuid> = self
                .not_before
                .iter()
                .filter(|(_, t)| **t <= now)
                .map(|(id, _)| *id)
                .collect();
            self.reconcile_many(due.clone()).await?;
            // Only now: a read that fails above leaves them due for the next pass.
            for id in due {
                if self.not_before.get(&id).is_some_and(|t| *t <= now) {
                    self.not_before.remove(&id);
                }
            }
            // GPUs were freed: held tasks may be released.
            if std::mem::take(&mut self.gpus_freed) {
                let held = std::mem::take(&mut self.gpu_held);
                self.reconcile_many(held.into_iter().collect()).await?;
            }
            // A site connected, changed its prices or came back: waiting work may fit.
            if std::mem::take(&mut self.sites_changed) {
                let unplaced = self.unplaced.iter().copied().collect();
                self.reconcile_many(unplaced).await?;
            }
            // Commits the start already folded come again when their acknowledgement was
            // lost in a crash: the workflows they concern are read whole from the log,
            // not built up from them, so nothing is decided on a copy that lags it.
            let again: BTreeSet<Uuid> = commits
                .iter()
                .take_while(|c| c.position <= self.folded_to)
                .flat_map(|c| c.events.iter())
                .filter(|e| e.aggregate.kind == AggregateKind::Workflow)
                .map(|e| e.aggregate.id)
                .collect();
            self.prefetch(again).await?;
            let first = commits.first().map(|c| c.position);
            let last = commits.last().map(|c| c.position);
            let delivered = commits.len() as u64;
            for commit in commits {
                if commit.position > self.logged_to {
                    commit.events.iter().for_each(|e| self.logged.observe(e));
                    self.logged_to = commit.position;
                }
                let mut touched = BTreeSet::new();
                for envelope in &commit.events {
                    if let Some(workflow) = self.observe(commit.position, envelope).await? {
                        touched.insert(workflow);
                    }
                }
                for workflow in touched {
                    // Decided on top of decisions not stored yet, a release could be
                    // refused while a dispatch that follows it is stored: wait for them.
                    if self.in_flight_holds(workflow) || self.postponed.contains_key(&workflow) {
                        self.put_off(workflow, commit.position);
                    } else {
                        self.reconcile(workflow).await?;
                    }
                }
            }
            // Workflows whose decisions have landed since they were put off.
            let ready: Vec<(Uuid, u64)> = self
                .postponed
                .iter()
                .filter(|(w, _)| !self.in_flight_holds(**w))
                .map(|(w, at)| (*w, *at))
                .collect();
            let mut from = first.unwrap_or(u64::MAX);
            for (workflow, at) in ready {
                self.postponed.remove(&workflow);
                from = from.min(at);
                self.reconcile(workflow).await?;
                if !self.deferred.holds(workflow) {
                    // Nothing more to append: no conflict to count on.
                    self.conflicts.remove(&workflow);
                }
            }
            self.send(from).await?;
            if let Some(last) = last {
                self.delivered = last;
            }
            self.acknowledge(&sub);
            self.save_snapshot_now_and_then(delivered);
        }
    }

    /// Every [`snapshot::SAVE_AFTER`] commits delivered, saves the catalogue and the work
    /// folded from the log up to the last one, so that a restart folds at most about
    /// that many commits past the snapshot. Both were folded from the delivered commits
    /// as they came, and are only encoded here: folding them again from the log (as
    /// the site runner and the data mover still do) read every commit a second time.
    fn save_snapshot_now_and_then(&mut self, delivered: u64) {
        let (log, position) = (self.log.clone(), self.logged_to);
        // Every commit up to `logged_to` was delivered, and the catalogue was shown
        // those that concern it (`observe`).
        self.catalog.passed(position);
        let (catalog, work) = (&self.catalog, &self.logged);
        self.snapshots.delivered(delivered, || {
            let state = serde_json::value::to_raw_value(&SavedStart { catalog, work });
            async move {
                let saved = match state {
                    Ok(state) => {
                        snapshot::save(&*log, SNAPSHOT, SNAPSHOT_FORMAT, position, &state).await
                    }
                    Err(e) => Err(LogError::Backend(format!("encoding the snapshot: {e}"))),
                };
                match saved {
                    Ok(()) => tracing::debug!(position, "router: saved a snapshot"),
                    Err(e) => tracing::warn!(error = %e, "router: could not save a snapshot"),
                }
            }
        });
    }

    /// Puts `workflow` off until its decisions in flight land, holding position `at`
    /// (`u64::MAX`: none) and everything after it unacknowledged until it is decided.
    fn put_off(&mut self, workflow: Uuid, at: u64) {
        let held = self.postponed.entry(workflow).or_insert(at);
        *held = (*held).min(at);
    }

    /// Whether decisions for `workflow` are on the way to the log.
    fn in_flight_holds(&self, workflow: Uuid) -> bool {
        self.in_flight.iter().any(|f| f.chains.contains(&workflow))
    }

    /// Sends what the batch decided on its way to the log, as the newest decisions in
    /// flight; `from` is the lowest position they were decided from (`u64::MAX`: none).
    /// With too many in flight, the oldest land first.
    async fn send(&mut self, from: u64) -> Result<(), RouterError> {
        if !self.deferred.is_empty() {
            let chains = self.deferred.chains().collect();
            let mut decided = std::mem::take(&mut self.deferred);
            let (log, landing) = (self.log.clone(), self.landing.clone());
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let set = done.clone();
            self.in_flight.push_back(InFlight {
                task: tokio::spawn(async move {
                    let failed = decided.flush(&*log).await;
                    set.store(true, std::sync::atomic::Ordering::Release);
                    landing.notify_one();
                    failed
                }),
                done,
                chains,
                from,
            });
        }
        while self.in_flight.len() > IN_FLIGHT {
            let oldest = self.in_flight.pop_front().expect("more than IN_FLIGHT");
            self.take_in(oldest).await?;
        }
        Ok(())
    }

    /// Takes in the decisions that have landed: all of them when `all`, else those
    /// whose appends are done.
    async fn land(&mut self, all: bool) -> Result<(), RouterError> {
        let mut pending = std::mem::take(&mut self.in_flight);
        let mut waiting = std::collections::VecDeque::new();
        while let Some(flight) = pending.pop_front() {
            if !all && !flight.done.load(std::sync::atomic::Ordering::Acquire) {
                waiting.push_back(flight);
                continue;
            }
            if let Err(e) = self.take_in(flight).await {
                // What is still in flight is taken in when the loop serves again.
                waiting.extend(pending);
                self.in_flight = waiting;
                return Err(e);
            }
        }
        self.in_flight = waiting;
        Ok(())
    }

    /// Waits for `flight` to land and settles its failures.
    async fn take_in(&mut self, flight: InFlight) -> Result<(), RouterError> {
        let failures = landed(flight.task).await;
        if !self.conflicts.is_empty() {
            for chain in &flight.chains {
                if !failures.iter().any(|f| f.chain == *chain) {
                    self.conflicts.remove(chain);
                }
            }
        }
        self.settle(failures, flight.from)
    }

    /// Forgets what failed chains cached. A workflow whose commit met a conflict (someone
    /// else moved it on) is decided again from the log in a later pass, a few times in a
    /// row at most, its position `from` held unacknowledged until then; any other failure
    /// ends the pass (the workflow is decided again when the loop serves again), and
    /// what was not acknowledged is delivered again.
    fn settle(&mut self, failures: Vec<Failed>, from: u64) -> Result<(), RouterError> {
        let mut error = None;
        for failed in failures {
            self.forget(failed.chain, &failed.unwritten);
            match failed.error {
                LogError::Conflict { .. } => {
                    let rounds = self.conflicts.entry(failed.chain).or_default();
                    *rounds += 1;
                    if *rounds > CONFLICT_ROUNDS {
                        // Decided again after a pause rather than at its next event, which
                        // may never come (nothing else writes a workflow just submitted).
                        tracing::warn!(workflow = %failed.chain, "the workflow kept changing under the router's decisions; deciding again after a pause");
                        self.conflicts.remove(&failed.chain);
                        self.not_before
                            .insert(failed.chain, Utc::now() + self.backoff_base);
                    } else {
                        tracing::debug!(workflow = %failed.chain, "a decision met a conflict; deciding again");
                        self.put_off(failed.chain, from);
                    }
                }
                e => {
                    // Decided again when the loop serves again.
                    self.put_off(failed.chain, from);
                    error = Some(e);
                }
            }
        }
        match error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Acknowledges every delivered commit whose decisions are all stored: up to the
    /// first position still owed a decision (in flight or put off), or all delivered.
    fn acknowledge(&mut self, sub: &ReadAhead) {
        let owed = self
            .in_flight
            .iter()
            .map(|f| f.from)
            .chain(self.postponed.values().copied())
            .min()
            .unwrap_or(u64::MAX);
        let through = self.delivered.min(owed.saturating_sub(1));
        if through > self.acked {
            sub.ack(through);
            self.acked = through;
        }
    }

    /// Reconciles many workflows (those waiting after a start, on a site or on GPUs),
    /// [`PREFETCH`] read at a time, sending the decisions of each [`AHEAD`] on their way
    /// to the log while the next are decided ([`Router::send`]). A workflow in two of
    /// the lists (due and held for GPUs) is decided again only once its first decisions
    /// have landed, as a workflow delivered while its decisions travel is.
    async fn reconcile_many(&mut self, ids: Vec<Uuid>) -> Result<(), RouterError> {
        for chunk in ids.chunks(AHEAD) {
            self.prefetch(chunk.iter().copied()).await?;
            for id in chunk {
                if self.in_flight_holds(*id) {
                    // In two of the lists: decided again once the first decisions land.
                    self.put_off(*id, u64::MAX);
                } else {
                    self.reconcile(*id).await?;
                }
            }
            // Nothing delivered is owed these decisions: the lists are kept in memory.
            self.send(u64::MAX).await?;
        }
        Ok(())
    }

    /// Drops what was cached for `workflow` and for the aggregates of its decisions that
    /// were not stored: they are read from the log when next needed.
    /// What was counted for those decisions goes too: a hold for the tenant's limit
    /// (decided again when the workflow is), and the GPUs of unwritten releases, which
    /// may have held another workflow's tasks back.
    fn forget(&mut self, workflow: Uuid, unwritten: &[meridian_events::AggregateRef]) {
        self.workflows.remove(&workflow);
        for held in self.limit_held.values_mut() {
            held.remove(&workflow);
        }
        for aggregate in unwritten {
            if aggregate.kind == AggregateKind::Job {
                let id = aggregate.id;
                self.jobs.remove(&id);
                self.releases.remove(&id);
                self.job_workflow.remove(&id);
                for jobs in self.gpus.values_mut() {
                    if jobs.remove(&id).is_some() {
                        self.gpus_freed = true;
                    }
                }
            }
        }
    }

    /// Folds one delivered event into the caches; returns the workflow it concerns.
    async fn observe(
        &mut self,
        position: u64,
        envelope: &Envelope<Event>,
    ) -> Result<Option<Uuid>, RouterError> {
        let id = envelope.aggregate.id;
        match envelope.aggregate.kind {
            AggregateKind::Site | AggregateKind::Transfer | AggregateKind::Tenant => {
                // The catalogue was loaded up to the head; the subscription may resume
                // from an older ack and deliver those commits again.
                let was_connected = self.site_connected(envelope);
                self.catalog.observe_at(position, envelope);
                let newly_connected = !was_connected && self.site_connected(envelope);
                let changes_placement = match &envelope.payload {
                    Event::Site(e) => !matches!(
                        e,
                        SiteEvent::Heartbeat { .. } | SiteEvent::HealthReported { .. }
                    ),
                    // Budget reservations change nothing placement sees.
                    Event::Tenant(
                        TenantEvent::BudgetReserved { .. } | TenantEvent::BudgetReleased { .. },
                    ) => false,
                    Event::Tenant(e) => {
                        // New limits may free held tasks.
                        if matches!(e, TenantEvent::LimitsSet { .. }) && !self.gpu_held.is_empty() {
                            self.gpus_freed = true;
                        }
                        true
                    }
                    _ => false,
                };
                if newly_connected || changes_placement {
                    self.sites_changed = true;
                }
                Ok(None)
            }
            // Tokens say who may call the API; placement does not care.
            AggregateKind::Token => Ok(None),
            AggregateKind::Workflow => {
                self.remember_release(id, envelope);
                self.note_settlement(id, envelope);
                self.count_active(id, envelope);
                self.observe_into_workflow(envelope).await?;
                Ok(Some(id))
            }
            AggregateKind::Job => {
                self.count_gpus(id, envelope);
                // The catalogue was loaded up to the head; the subscription may resume
                // from an older ack and deliver those commits again.
                self.catalog.observe_at(position, envelope);
                let cached = self.jobs.entry(id).or_insert_with(|| Cached::fresh(id));
                if !cached.observe(envelope) {
                    // A gap: we missed some of its history; the log has all of it.
                    self.jobs.insert(id, Cached::load(&*self.log, id).await?);
                }
                let workflow = match &envelope.payload {
                    Event::Job(JobEvent::Dispatched { workflow_id, .. }) => Some(*workflow_id),
                    _ => self.jobs[&id].state.dispatch().map(|d| d.workflow_id),
                };
                if let Some(w) = workflow {
                    self.job_workflow.insert(id, w);
                }
                Ok(workflow)
            }
        }
    }

    /// Keeps the tenant's count of placed workflows; one ending frees a slot, so held
    /// workflows are tried again.
    fn count_active(&mut self, id: Uuid, envelope: &Envelope<Event>) {
        match &envelope.payload {
            Event::Workflow(WorkflowEvent::PlacementDecided { .. }) => {
                self.active
                    .entry(envelope.tenant.clone())
                    .or_default()
                    .insert(id);
            }
            Event::Workflow(
                WorkflowEvent::Finished { .. }
                | WorkflowEvent::Failed { .. }
                | WorkflowEvent::Cancelled { .. },
            ) => {
                // Ended while held (cancelled, say): it no longer queues before others.
                if let Some(held) = self.limit_held.get_mut(&envelope.tenant) {
                    held.remove(&id);
                }
                let freed = self
                    .active
                    .get_mut(&envelope.tenant)
                    .is_some_and(|placed| placed.remove(&id));
                if freed && !self.unplaced.is_empty() {
                    self.sites_changed = true;
                }
            }
            _ => {}
        }
    }

    /// Keeps the tenant's count of GPUs in use: a job holds its GPUs from dispatch until
    /// it ends.
    fn count_gpus(&mut self, id: Uuid, envelope: &Envelope<Event>) {
        match &envelope.payload {
            Event::Job(JobEvent::Dispatched { resources, .. }) => {
                let n = resources.gpus_total();
                if n > 0 {
                    self.gpus
                        .entry(envelope.tenant.clone())
                        .or_default()
                        .insert(id, n);
                }
            }
            Event::Job(
                JobEvent::Finished { .. } | JobEvent::Failed { .. } | JobEvent::Cancelled { .. },
            ) => {
                let freed = self
                    .gpus
                    .get_mut(&envelope.tenant)
                    .is_some_and(|jobs| jobs.remove(&id).is_some());
                if freed && !self.gpu_held.is_empty() {
                    self.gpus_freed = true;
                }
            }
            _ => {}
        }
    }

    /// Why a task needing `needed` GPUs may not be released now, if its tenant's GPU
    /// limit says so.
    fn held_by_gpus(&self, tenant: Option<&str>, needed: u32) -> Option<String> {
        let tenant = tenant?;
        let limit = self.catalog.tenants.limits(tenant)?.concurrent_gpus?;
        if needed == 0 {
            return None;
        }
        let in_use: u64 = self
            .gpus
            .get(tenant)
            .map_or(0, |jobs| jobs.values().map(|n| u64::from(*n)).sum());
        if needed > limit {
            return Some(format!(
                "held: it needs {needed} GPUs at once, more than tenant {tenant}'s limit of \
                 {limit}; it starts only if the limit is raised"
            ));
        }
        // The reason leaves out how many are in use: it changes with every run that
        // starts or ends, and a new reason is a new event.
        (in_use + u64::from(needed) > u64::from(limit)).then(|| {
            format!(
                "held: tenant {tenant}'s GPUs in use are at its limit of {limit}, and the next \
                 task needs {needed}; it starts as others end"
            )
        })
    }

    /// Whether the tenant is at its limit of concurrent workflows: the reason to hold
    /// another, if so.
    fn held_by_limit(&self, id: Uuid, tenant: Option<&str>) -> Option<String> {
        let tenant = tenant?;
        let limit = self.catalog.tenants.limits(tenant)?.concurrent_workflows?;
        let placed = self.active.get(tenant).map_or(0, BTreeSet::len);
        // Held in submission order: an older held workflow of the tenant goes first.
        let queued_before = self
            .limit_held
            .get(tenant)
            .is_some_and(|held| held.range(..id).next().is_some());
        (queued_before || placed as u64 >= u64::from(limit)).then(|| {
            format!(
                "held: tenant {tenant} has {placed} of its {limit} concurrent workflows placed; \
                 this one is placed when one ends"
            )
        })
    }

    /// Whether the site a Site event is about is connected now.
    fn site_connected(&self, envelope: &Envelope<Event>) -> bool {
        if envelope.aggregate.kind != AggregateKind::Site {
            return false;
        }
        self.catalog
            .sites
            .values()
            .find(|s| s.id == envelope.aggregate.id)
            .is_some_and(|s| s.connected_at(Utc::now()))
    }

    /// Keeps what a release said (its task, site and attempt), to dispatch it.
    fn remember_release(&mut self, workflow_id: Uuid, envelope: &Envelope<Event>) {
        if let Event::Workflow(WorkflowEvent::JobReleased {
            job,
            index,
            job_id,
            site,
            attempt,
            batch,
        }) = &envelope.payload
        {
            self.job_workflow.insert(*job_id, workflow_id);
            self.releases.insert(
                *job_id,
                Release {
                    task: TaskRef::new(job.clone(), *index),
                    site: site.clone(),
                    attempt: *attempt,
                    batch: *batch,
                },
            );
        }
    }

    /// A settlement for a site's fault excludes that site (once per job run, however
    /// often the event is seen: once when appended here, once when delivered).
    fn note_settlement(&mut self, id: Uuid, envelope: &Envelope<Event>) {
        let Event::Workflow(WorkflowEvent::JobSettled {
            job_id,
            outcome: JobOutcome::Failed { reason },
            ..
        }) = &envelope.payload
        else {
            return;
        };
        if !reason.is_site_fault() || !self.faulted_jobs.insert(*job_id) {
            return;
        }
        let site = match self.releases.get(job_id) {
            Some(r) => Some(r.site.clone()),
            None => self
                .jobs
                .get(job_id)
                .and_then(|j| j.state.dispatch().map(|d| d.site.clone())),
        };
        if let Some(site) = site {
            self.site_fault(id, site, envelope.occurred_at);
        }
    }

    /// Records that `site` failed workflow `id`'s work at `at` for a site reason: the site
    /// is kept out of the workflow's next placement, and releases back off.
    fn site_fault(&mut self, id: Uuid, site: String, at: DateTime<Utc>) {
        let entry = self
            .exclusions
            .entry(id)
            .or_default()
            .entry(site.clone())
            .or_insert(Exclusion {
                faults: 0,
                until: at,
            });
        entry.faults += 1;
        entry.until = at + backoff(self.backoff_base, entry.faults);
        let until = entry.until;
        self.not_before.insert(id, until);
        tracing::info!(workflow = %id, %site, until = %until, "site fault: excluded from re-placement");
    }

    /// After a site fault: places the workflow again without the sites that failed it,
    /// if another site can take it; otherwise its work waits out the backoff where it is.
    async fn replace(&mut self, id: Uuid) -> Result<(), RouterError> {
        let now = Utc::now();
        let excluded: BTreeMap<String, Exclusion> = self
            .exclusions
            .get(&id)
            .map(|e| {
                e.iter()
                    .filter(|(_, x)| x.until > now)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let (spec, current, tenant) = {
            let wf = self.workflow(id).await?;
            let sites = wf.state.placement().map(|p| {
                p.sites()
                    .into_iter()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            });
            (wf.state.spec().cloned(), sites, wf.tenant.clone())
        };
        let (Some(spec), Some(current)) = (spec, current) else {
            return Ok(());
        };
        if !current.iter().any(|s| excluded.contains_key(s)) {
            return Ok(());
        }
        let current = current.join("+");
        let mut catalog = self.catalog.clone();
        for (site, exclusion) in &excluded {
            catalog.exclude(
                site,
                format!(
                    "excluded after {} site fault(s) with this workflow, until {}",
                    exclusion.faults,
                    exclusion
                        .until
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            );
        }
        let placement::Decision::Placed(placed) =
            placement::decide_for(&spec, tenant.as_deref(), &catalog, now)
        else {
            tracing::info!(workflow = %id, site = %current, "no other site fits; retrying where it is after the backoff");
            return Ok(());
        };
        tracing::info!(workflow = %id, from = %current, to = %placed.site, "re-placed after a site fault");
        counted::count(
            "meridian_replacements_total",
            "Workflows placed again after site faults, by the site they left.",
            &[("site", &current)],
            1.0,
        );
        self.record_placement(id, *placed).await?;
        // The new site has no reason to wait.
        self.not_before.remove(&id);
        self.hold_volumes(id).await
    }

    async fn record_placement(
        &mut self,
        id: Uuid,
        placed: placement::Placed,
    ) -> Result<(), RouterError> {
        let placement::Placed {
            site,
            region,
            job_sites,
            storage_rates,
            rate,
            job_rates,
            storage_rate,
            estimated_cost,
            explanation,
        } = placed;
        self.on_workflow(id, |_| WorkflowCommand::RecordPlacement {
            site: site.clone(),
            region: region.clone(),
            rate: rate.clone(),
            job_rates: job_rates.clone(),
            storage_rate: storage_rate.clone(),
            estimated_cost: estimated_cost.clone(),
            explanation: explanation.clone(),
            job_sites: job_sites.clone(),
            storage_rates: storage_rates.clone(),
        })
        .await?;
        Ok(())
    }

    /// Sets aside the spec's volumes where the workflow's jobs use them (storage is
    /// billed from here): at its site, or, split, at each site whose jobs mount them.
    /// Gives back any held at a site no longer used after a re-placement, unless a task
    /// still running there mounts it.
    async fn hold_volumes(&mut self, id: Uuid) -> Result<(), RouterError> {
        let now = Utc::now();
        self.workflow(id).await?;
        let (wanted, held, busy) = {
            let wf = &self.workflows[&id].state;
            let (Some(spec), Some(placement)) = (wf.spec(), wf.placement()) else {
                return Ok(());
            };
            let mut wanted: Vec<(String, String, u64, meridian_events::StorageRate)> = Vec::new();
            for (name, volume) in &spec.volumes {
                let mut sites: Vec<&str> = spec
                    .jobs
                    .keys()
                    .chain(spec.services.keys())
                    .filter(|step| spec.mounts_of(step).any(|v| v == name))
                    .map(|step| placement.site_for(step))
                    .collect();
                if sites.is_empty() {
                    sites.push(&placement.site);
                }
                sites.sort_unstable();
                sites.dedup();
                for site in sites {
                    let rate = placement
                        .storage_rate_at(site)
                        .unwrap_or(&placement.storage_rate)
                        .clone();
                    wanted.push((name.clone(), site.to_string(), volume.size.bytes(), rate));
                }
            }
            let held: Vec<(String, String)> = wf
                .allocated_volumes()
                .map(|a| (a.volume.clone(), a.site.clone()))
                .collect();
            // Volumes that running tasks mount where they run stay, whatever the new
            // placement says: they are in use.
            let busy: BTreeSet<(String, String)> = wf
                .running_jobs()
                .iter()
                .filter_map(|(job_id, task)| {
                    let site = &self.releases.get(job_id)?.site;
                    Some(
                        spec.mounts_of(&task.job)
                            .map(move |v| (v.to_string(), site.clone())),
                    )
                })
                .flatten()
                .collect();
            (wanted, held, busy)
        };
        for (volume, at) in &held {
            let in_use = busy.contains(&(volume.clone(), at.clone()));
            if !in_use && !wanted.iter().any(|(v, s, ..)| v == volume && s == at) {
                let (volume, at) = (volume.clone(), at.clone());
                self.on_workflow(id, |_| WorkflowCommand::ReleaseVolume {
                    volume: volume.clone(),
                    site: at.clone(),
                    released_at: now,
                })
                .await?;
            }
        }
        for (volume, site, bytes, rate) in wanted {
            if held.iter().any(|(v, at)| *v == volume && *at == site) {
                continue;
            }
            self.on_workflow(id, |_| WorkflowCommand::AllocateVolume {
                volume: volume.clone(),
                class: StorageClass::Volume,
                site: site.clone(),
                bytes,
                rate: rate.clone(),
                allocated_at: now,
            })
            .await?;
        }
        Ok(())
    }

    /// Gives back every volume an ended workflow still holds: its storage stops there.
    /// Outputs whose copy out failed, or is still due, are kept (and billed) until they
    /// are out or an admin releases them.
    async fn release_volumes(&mut self, id: Uuid) -> Result<(), RouterError> {
        let wf = &self.workflow(id).await?.state;
        let keep = wf.volumes_to_keep();
        let held: Vec<(String, String)> = wf
            .allocated_volumes()
            .filter(|a| {
                !keep
                    .iter()
                    .any(|k| k.volume == a.volume && k.site == a.site)
            })
            .map(|a| (a.volume.clone(), a.site.clone()))
            .collect();
        let now = Utc::now();
        for (volume, site) in held {
            self.on_workflow(id, |_| WorkflowCommand::ReleaseVolume {
                volume: volume.clone(),
                site: site.clone(),
                released_at: now,
            })
            .await?;
        }
        Ok(())
    }

    /// Folds a delivered workflow event in; an unknown workflow seen from its first event
    /// needs no read, one seen mid-history (after a restart) is loaded.
    async fn observe_into_workflow(
        &mut self,
        envelope: &Envelope<Event>,
    ) -> Result<(), RouterError> {
        let id = envelope.aggregate.id;
        let cached = self
            .workflows
            .entry(id)
            .or_insert_with(|| Cached::fresh(id));
        if !cached.observe(envelope) {
            self.load_workflow(id).await?;
        }
        Ok(())
    }

    /// Reads a workflow from the log into the cache, with what its history says about
    /// releases and site faults (so exclusions survive a router restart).
    async fn load_workflow(&mut self, id: Uuid) -> Result<(), RouterError> {
        if self.deferred.holds(id) || self.in_flight_holds(id) {
            // Decided here and not stored yet: the cache is ahead of the log.
            return Ok(());
        }
        let loaded = aggregates::load::<Workflow>(&*self.log, id).await?;
        self.cache_loaded(id, loaded);
        Ok(())
    }

    /// Reads the workflows among `ids` that are not cached, [`PREFETCH`] at a time,
    /// before they are reconciled one by one: each read is a round trip, and thousands
    /// wait to be placed after a start.
    async fn prefetch(&mut self, ids: impl IntoIterator<Item = Uuid>) -> Result<(), RouterError> {
        let missing: Vec<Uuid> = ids
            .into_iter()
            .filter(|id| {
                !self.workflows.contains_key(id)
                    && !self.deferred.holds(*id)
                    && !self.in_flight_holds(*id)
            })
            .collect();
        let log = self.log.clone();
        let loaded: Vec<_> = futures::stream::iter(missing)
            .map(|id| {
                let log = log.clone();
                async move { (id, aggregates::load::<Workflow>(&*log, id).await) }
            })
            .buffer_unordered(PREFETCH)
            .collect()
            .await;
        for (id, loaded) in loaded {
            self.cache_loaded(id, loaded?);
        }
        Ok(())
    }

    fn cache_loaded(&mut self, id: Uuid, loaded: aggregates::Loaded<Workflow>) {
        for e in &loaded.history {
            self.remember_release(id, e);
        }
        for e in &loaded.history {
            self.note_settlement(id, e);
        }
        let first = loaded.history.first();
        let tenant = first.map(|e| e.tenant.clone());
        let traceparent = first.and_then(|e| e.traceparent.clone());
        self.workflows.insert(
            id,
            Cached {
                id,
                state: loaded.state,
                sequence: loaded.sequence,
                tenant,
                traceparent,
            },
        );
    }

    async fn workflow(&mut self, id: Uuid) -> Result<&mut Cached<Workflow>, RouterError> {
        if !self.workflows.contains_key(&id) {
            self.load_workflow(id).await?;
        }
        Ok(self.workflows.get_mut(&id).expect("just loaded"))
    }

    async fn job(&mut self, id: Uuid) -> Result<&mut Cached<Job>, RouterError> {
        if !self.jobs.contains_key(&id) {
            let cached = Cached::load(&*self.log, id).await?;
            self.jobs.insert(id, cached);
        }
        Ok(self.jobs.get_mut(&id).expect("just inserted"))
    }

    fn context(workflow: &Cached<Workflow>) -> EventContext {
        let tenant = workflow.tenant.clone().unwrap_or_else(|| "default".into());
        let mut ctx = EventContext::new_chain(tenant);
        // Everything a workflow causes shares its id as the correlation id, and its trace.
        ctx.correlation_id = workflow.id;
        ctx.traceparent = trace::traceparent_now(workflow.traceparent.as_deref());
        ctx
    }

    async fn on_workflow(
        &mut self,
        id: Uuid,
        command: impl FnOnce(&Workflow) -> WorkflowCommand,
    ) -> Result<std::sync::Arc<Vec<Envelope<Event>>>, RouterError> {
        let cached = self.workflow(id).await?;
        let ctx = Self::context(cached);
        match cached.decide(&ctx, command(&cached.state)) {
            Ok((events, commit)) => {
                cached.fold(&events);
                if let Some(commit) = commit {
                    self.deferred.push(id, commit);
                }
                Ok(events)
            }
            // The aggregate moved on since this decision was made (another event came
            // first, or a commit was delivered again after a restart): it no longer
            // applies, which is no failure of the router's.
            Err(ExecuteError::Rejected(e)) if already_done(&e) => {
                tracing::debug!(workflow = %id, reason = %e, "decision no longer applies");
                Ok(Default::default())
            }
            Err(ExecuteError::Rejected(e)) => {
                tracing::warn!(workflow = %id, reason = %e, "the workflow refused the router's decision");
                self.last_refusal = Some(e.to_string());
                Ok(Default::default())
            }
            Err(source) => Err(RouterError::Workflow { id, source }),
        }
    }

    /// Brings workflow `id` forward as far as its state allows, in a span of the
    /// workflow's trace.
    async fn reconcile(&mut self, id: Uuid) -> Result<(), RouterError> {
        let traceparent = self.workflow(id).await?.traceparent.clone();
        let span = trace::child_of("route workflow", traceparent.as_deref());
        trace::mark_workflow(&span, id);
        self.reconcile_now(id).instrument(span).await
    }

    async fn reconcile_now(&mut self, id: Uuid) -> Result<(), RouterError> {
        let state = self.workflow(id).await?.state.state();
        if state != Some(WorkflowState::Submitted) {
            self.unplaced.remove(&id);
        }
        match state {
            None => Ok(()),
            Some(s) if s.is_terminal() => self.release_volumes(id).await,
            Some(WorkflowState::Submitted) => self.place(id).await,
            Some(_) => {
                self.follow_jobs(id).await?;
                self.follow_services(id).await?;
                if self.exclusions.contains_key(&id) {
                    self.replace(id).await?;
                }
                if self.not_before.get(&id).is_some_and(|t| *t > Utc::now()) {
                    return Ok(());
                }
                self.release_runnable(id).await
            }
        }
    }

    async fn place(&mut self, id: Uuid) -> Result<(), RouterError> {
        // Placed on the cached copy, not one read afresh (a round trip per workflow, one
        // after another): a copy behind the log (a cancel not delivered yet) makes the
        // placement's append meet a conflict, and the workflow is read afresh and
        // decided again in a later pass (`settle`), so no workflow is placed twice. A submission
        // delivered again after a restart is no such copy: `serve` reads it whole.
        let Some(spec) = self.workflow(id).await?.state.spec().cloned() else {
            return Ok(());
        };
        let tenant = self.workflow(id).await?.tenant.clone();
        if let Some(reason) = self.held_by_limit(id, tenant.as_deref()) {
            self.unplaced.insert(id);
            if let Some(t) = &tenant {
                self.limit_held.entry(t.clone()).or_default().insert(id);
            }
            let events = self
                .on_workflow(id, |_| WorkflowCommand::WaitForSite {
                    reason: reason.clone(),
                    sites: Vec::new(),
                })
                .await?;
            if !events.is_empty() {
                tracing::info!(workflow = %id, %reason, "placement waits");
            }
            return Ok(());
        }
        let span = tracing::info_span!("place", otel.name = "place workflow");
        self.decide_placement(id, &spec, tenant)
            .instrument(span)
            .await
    }

    async fn decide_placement(
        &mut self,
        id: Uuid,
        spec: &meridian_spec::Workflow,
        tenant: Option<String>,
    ) -> Result<(), RouterError> {
        let started = std::time::Instant::now();
        let decision = placement::decide_for(spec, tenant.as_deref(), &self.catalog, Utc::now());
        let outcome = match &decision {
            placement::Decision::Waiting { .. } => "waiting",
            placement::Decision::Placed(_) => "placed",
            placement::Decision::Rejected { .. } => "rejected",
        };
        counted::observe(
            "meridian_placement_seconds",
            "Time to decide a workflow's placement, by outcome.",
            &[("outcome", outcome)],
            started.elapsed().as_secs_f64(),
        );
        match decision {
            placement::Decision::Waiting { sites, .. } => {
                self.unplaced.insert(id);
                let reason = format!(
                    "waiting for a site to connect: {} would fit, but no adapter serves {}",
                    sites.join(", "),
                    if sites.len() == 1 { "it" } else { "them" }
                );
                let events = self
                    .on_workflow(id, |_| WorkflowCommand::WaitForSite {
                        reason: reason.clone(),
                        sites: sites.clone(),
                    })
                    .await?;
                if !events.is_empty() {
                    tracing::warn!(workflow = %id, %reason, "placement waits");
                }
                Ok(())
            }
            placement::Decision::Placed(placed) => {
                tracing::info!(workflow = %id, site = %placed.site, split = !placed.job_sites.is_empty(), estimate = %placed.estimated_cost.amount, "placed");
                counted::count(
                    "meridian_placements_total",
                    "Workflows placed, by the site chosen.",
                    &[("site", &placed.site)],
                    1.0,
                );
                self.last_refusal = None;
                self.record_placement(id, *placed).await?;
                if self.workflow(id).await?.state.state() == Some(WorkflowState::Submitted) {
                    // The aggregate refused the decision: say why rather than wait.
                    let reason = format!(
                        "placement could not be recorded: {}",
                        self.last_refusal.take().unwrap_or_else(|| "unknown".into())
                    );
                    self.on_workflow(id, |_| WorkflowCommand::Fail {
                        reason: reason.clone(),
                    })
                    .await?;
                    return Ok(());
                }
                self.unplaced.remove(&id);
                // Counted now, not when the event comes back: the next held workflow of
                // this scan must see the slot taken.
                if let Some(t) = tenant {
                    if let Some(held) = self.limit_held.get_mut(&t) {
                        held.remove(&id);
                    }
                    self.active.entry(t).or_default().insert(id);
                }
                self.hold_volumes(id).await?;
                // A workflow with nothing to run may already be finished; else release.
                self.reconcile_after_placement(id).await
            }
            placement::Decision::Rejected { rejections } => {
                self.unplaced.remove(&id);
                for r in &rejections {
                    counted::count(
                        "meridian_placement_refusals_total",
                        "Sites that refused a workflow no site could run, by site.",
                        &[("site", &r.site)],
                        1.0,
                    );
                }
                let reason = format!(
                    "no site can run it: {}",
                    rejections
                        .iter()
                        .map(|r| format!("{}: {}", r.site, r.reason))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                tracing::info!(workflow = %id, %reason, "rejected");
                self.on_workflow(id, |_| WorkflowCommand::RejectPlacement {
                    rejections: rejections.clone(),
                })
                .await?;
                self.on_workflow(id, |_| WorkflowCommand::Fail {
                    reason: reason.clone(),
                })
                .await?;
                Ok(())
            }
        }
    }

    async fn reconcile_after_placement(&mut self, id: Uuid) -> Result<(), RouterError> {
        let terminal = self
            .workflow(id)
            .await?
            .state
            .state()
            .is_some_and(WorkflowState::is_terminal);
        if terminal {
            return Ok(());
        }
        self.release_runnable(id).await
    }

    /// Dispatches releases that have no Job yet, settles jobs that ended, and passes a
    /// cancel request on to running jobs.
    async fn follow_jobs(&mut self, id: Uuid) -> Result<(), RouterError> {
        let (running, cancelling) = {
            let wf = &self.workflow(id).await?.state;
            (
                wf.running_jobs().clone(),
                wf.state() == Some(WorkflowState::CancelRequested),
            )
        };
        for (job_id, _task) in running {
            let job_state = self.job(job_id).await?.state.state();
            match job_state {
                None => self.dispatch(id, job_id).await?,
                Some(s) if s.is_terminal() => {
                    let outcome = self.jobs[&job_id]
                        .state
                        .outcome()
                        .cloned()
                        .unwrap_or(JobOutcome::Cancelled);
                    let events = self
                        .on_workflow(id, |_| WorkflowCommand::SettleJob {
                            job_id,
                            outcome: outcome.clone(),
                        })
                        .await?;
                    for e in events.iter() {
                        self.note_settlement(id, e);
                    }
                }
                Some(_) if cancelling && !self.jobs[&job_id].state.cancel_requested() => {
                    let by = self.workflow(id).await?.state.submitted_by().to_string();
                    let command = JobCommand::RequestCancel {
                        by,
                        reason: Some("the workflow was cancelled".into()),
                    };
                    match self.on_job(id, job_id, command).await? {
                        Ok(()) | Err(ExecuteError::Rejected(_)) => {}
                        Err(source) => return Err(RouterError::Job { id: job_id, source }),
                    }
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Records services that said they are ready, and stops those nothing needs any more.
    async fn follow_services(&mut self, id: Uuid) -> Result<(), RouterError> {
        let (services, unwanted): (Vec<Uuid>, Vec<Uuid>) = {
            let wf = &self.workflow(id).await?.state;
            // Services not yet known to be ready: the others need no command.
            let services = wf
                .running_jobs()
                .iter()
                .filter(|(job_id, task)| {
                    wf.is_service(&task.job) && wf.ready_run(&task.job) != Some(**job_id)
                })
                .map(|(job_id, _)| *job_id)
                .collect();
            (services, wf.unwanted_services())
        };
        for job_id in services {
            let Some(address) = self.job(job_id).await?.state.address().map(str::to_string) else {
                continue;
            };
            self.on_workflow(id, |_| WorkflowCommand::RecordServiceReady {
                job_id,
                address: address.clone(),
            })
            .await?;
        }
        for job_id in unwanted {
            if self.job(job_id).await?.state.cancel_requested() {
                continue;
            }
            let command = JobCommand::RequestCancel {
                by: "meridian".into(),
                reason: Some("nothing in the workflow needs the service any more".into()),
            };
            match self.on_job(id, job_id, command).await? {
                Ok(()) | Err(ExecuteError::Rejected(_)) => {}
                Err(source) => return Err(RouterError::Job { id: job_id, source }),
            }
        }
        Ok(())
    }

    async fn release_runnable(&mut self, id: Uuid) -> Result<(), RouterError> {
        let mut released = std::collections::HashSet::new();
        // Tasks held back for the GPU limit: the others may still go.
        let mut held = BTreeSet::new();
        // Arrays whose site takes them as one submission: they go in batches, or wait.
        let mut batched = BTreeSet::new();
        loop {
            let (task, site, needed, tenant) = {
                let wf = self.workflow(id).await?;
                let tenant = wf.tenant.clone();
                let wf = &wf.state;
                let Some(task) = wf
                    .runnable_jobs()
                    .into_iter()
                    .find(|t| !held.contains(t) && !batched.contains(&t.job))
                else {
                    // Nothing waits silently: a step that waits only for its data says so.
                    if let Some((job, wait)) = wf.waiting_for_data() {
                        let reason = format!("held: {wait}");
                        self.on_workflow(id, |_| WorkflowCommand::HoldRelease {
                            job: job.clone(),
                            reason: reason.clone(),
                        })
                        .await?;
                    }
                    return Ok(());
                };
                let Some(placement) = wf.placement() else {
                    return Ok(());
                };
                let needed = wf
                    .spec()
                    .and_then(|spec| {
                        spec.jobs
                            .get(&task.job)
                            .map(|j| j.resources.gpus_total())
                            .or_else(|| {
                                spec.services
                                    .get(&task.job)
                                    .map(|s| s.resources.gpus_total())
                            })
                    })
                    .unwrap_or(0);
                let site = placement.site_for(&task.job).to_string();
                (task, site, needed, tenant)
            };
            // A tenant held to a GPU limit has its GPU tasks weighed one by one.
            let gpu_limited = needed > 0
                && tenant
                    .as_deref()
                    .and_then(|t| self.catalog.tenants.limits(t))
                    .is_some_and(|l| l.concurrent_gpus.is_some());
            let arrays = self.catalog.find(&site).and_then(|s| s.arrays);
            if let (Some(max), Some(_), false) = (arrays, task.index, gpu_limited) {
                batched.insert(task.job.clone());
                self.release_batch(id, &task.job, &site, max, tenant.as_deref(), needed)
                    .await?;
                continue;
            }
            if let Some(reason) = self.held_by_gpus(tenant.as_deref(), needed) {
                self.gpu_held.insert(id);
                // The first task held says why; recording each would make every pass
                // append as the reasons take turns.
                if held.is_empty() {
                    let job = task.job.clone();
                    let events = self
                        .on_workflow(id, |_| WorkflowCommand::HoldRelease {
                            job: job.clone(),
                            reason: reason.clone(),
                        })
                        .await?;
                    if !events.is_empty() {
                        tracing::info!(workflow = %id, %reason, "release held");
                    }
                }
                held.insert(task);
                continue;
            }
            if !released.insert(task.clone()) {
                // The aggregate still calls it runnable after releasing it: a bug, and
                // looping would fill the log. Stop and say so.
                tracing::error!(workflow = %id, job = %task.job, index = ?task.index, "task still runnable after its release");
                return Ok(());
            }
            let job_id = Uuid::now_v7();
            self.jobs.insert(job_id, Cached::fresh(job_id));
            let events = self
                .on_workflow(id, |_| WorkflowCommand::ReleaseJob {
                    job: task.job.clone(),
                    index: task.index,
                    job_id,
                    site: site.clone(),
                })
                .await?;
            for e in events.iter() {
                self.remember_release(id, e);
            }
            // Counted now, not when the dispatch comes back: the next task must see them.
            if let (Some(t), true) = (tenant, needed > 0) {
                self.gpus.entry(t).or_default().insert(job_id, needed);
            }
            self.dispatch(id, job_id).await?;
        }
    }

    /// Releases the next batch of `job`'s array to `site`, which takes up to `max` tasks
    /// as one submission, and dispatches its tasks; nothing when the array should wait
    /// for a batch that can run at its full cap.
    async fn release_batch(
        &mut self,
        id: Uuid,
        job: &str,
        site: &str,
        max: u32,
        tenant: Option<&str>,
        needed: u32,
    ) -> Result<(), RouterError> {
        let Some((indices, cap)) = self.workflow(id).await?.state.next_array_batch(job, max) else {
            return Ok(());
        };
        let tasks: Vec<(u32, Uuid)> = indices.into_iter().map(|i| (i, Uuid::now_v7())).collect();
        let batch_id = Uuid::now_v7();
        for (_, job_id) in &tasks {
            self.jobs.insert(*job_id, Cached::fresh(*job_id));
        }
        let events = self
            .on_workflow(id, |_| WorkflowCommand::ReleaseArray {
                job: job.to_string(),
                tasks: tasks.clone(),
                site: site.to_string(),
                batch_id,
                cap,
            })
            .await?;
        if events.is_empty() {
            for (_, job_id) in &tasks {
                self.jobs.remove(job_id);
            }
            return Ok(());
        }
        tracing::info!(workflow = %id, job, site, tasks = tasks.len(), cap, "array released as one batch");
        for e in events.iter() {
            self.remember_release(id, e);
        }
        for (_, job_id) in &tasks {
            if let (Some(t), true) = (tenant, needed > 0) {
                self.gpus
                    .entry(t.to_string())
                    .or_default()
                    .insert(*job_id, needed);
            }
            self.dispatch(id, *job_id).await?;
        }
        Ok(())
    }

    /// Creates the Job aggregate of a release, with the price in force for its job.
    async fn dispatch(&mut self, workflow_id: Uuid, job_id: Uuid) -> Result<(), RouterError> {
        if !self.releases.contains_key(&job_id) {
            // Released before a restart: find the release in the workflow's history.
            let loaded = aggregates::load::<Workflow>(&*self.log, workflow_id).await?;
            for e in &loaded.history {
                self.remember_release(workflow_id, e);
            }
        }
        let Some(release) = self.releases.get(&job_id).cloned() else {
            return Ok(());
        };
        let (rate, resources) = {
            let wf = self.workflow(workflow_id).await?;
            let Some(placement) = wf.state.placement() else {
                return Ok(());
            };
            let Some(spec) = wf.state.spec() else {
                return Ok(());
            };
            let resources = spec
                .jobs
                .get(&release.task.job)
                .map(|j| j.resources.clone())
                .or_else(|| {
                    spec.services
                        .get(&release.task.job)
                        .map(|s| s.resources.clone())
                })
                .unwrap_or_default();
            (placement.rate_for(&release.task.job).clone(), resources)
        };
        let command = JobCommand::Dispatch {
            workflow_id,
            job: release.task.job.clone(),
            index: release.task.index,
            attempt: release.attempt,
            site: release.site.clone(),
            rate,
            resources,
            batch: release.batch,
        };
        match self.on_job(workflow_id, job_id, command).await? {
            Ok(()) | Err(ExecuteError::Rejected(JobError::AlreadyDispatched)) => Ok(()),
            Err(source) => Err(RouterError::Job { id: job_id, source }),
        }
    }

    /// Decides `command` for job `job_id` of `workflow_id` and holds the outcome with
    /// the workflow's other decisions, after them.
    async fn on_job(
        &mut self,
        workflow_id: Uuid,
        job_id: Uuid,
        command: JobCommand,
    ) -> Result<Result<(), ExecuteError<JobError>>, RouterError> {
        let ctx = Self::context(self.workflow(workflow_id).await?);
        let job = self.job(job_id).await?;
        let decided = job.decide(&ctx, command);
        if let Ok((events, _)) = &decided {
            job.fold(events);
        }
        Ok(decided.map(|(_, commit)| {
            if let Some(commit) = commit {
                self.deferred.push(workflow_id, commit);
            }
        }))
    }
}

/// The chains that were not stored whole by an append task.
async fn landed(task: tokio::task::JoinHandle<Vec<Failed>>) -> Vec<Failed> {
    match task.await {
        Ok(failed) => failed,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only a runtime shutting down cancels it, and the router goes with it (its batch
        // unacknowledged, so delivered again to the next).
        Err(e) => {
            tracing::warn!(error = %e, "router: appends cancelled by shutdown");
            Vec::new()
        }
    }
}
