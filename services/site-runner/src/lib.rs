//! The site runner drives one site's [`SiteAdapter`] from the event log: a job
//! dispatched to its site is submitted, followed until it ends, and every change the
//! site reports becomes an event of the Job aggregate (submitted, started, finished,
//! failed, cancelled); a cancel request is passed to the site. The same runner serves
//! every adapter, so each adapter only speaks its backend.
//!
//! Liveness: the runner says it serves its site with a heartbeat (a Site event) every
//! [`SiteRunner::with_heartbeat_interval`], valid for three intervals, and that it stops
//! serving it on a clean shutdown; placement only chooses sites served this way.
//!
//! Services: a service's run is submitted like a job, with its port and restart limit;
//! once the site says it answers, the runner records where (`job.service_ready.v1`).
//!
//! Restarts: on start the runner finds, from its snapshot and the log after it, every
//! job of its site that has not ended ([`OpenJobs`]), and follows it again. Submission is idempotent at the adapter (backend jobs are
//! tagged with the Meridian job id), so nothing is submitted twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
mod counted;
mod devices;
mod shapes;

use meridian_adapter_core::{
    AdapterError, ArrayRequest, ArrayTask, BackendJobId, JobRequest, JobState as SiteState,
    PlacedShape, ReportTo, ServiceRequest, SiteAdapter, DEFAULT_MAX_RESTARTS,
};
use meridian_eventlog::aggregates::{self, Cached, ExecuteError};
use meridian_eventlog::{snapshot, EventLog, LogError};
use meridian_events::aggregate::{Job, JobCommand, JobError, SiteCommand, Workflow};
use meridian_events::vocabulary::{AcceleratorVendor, AllocatedGpus, Usage};
use meridian_events::{
    AggregateKind, Allocation, ArrayBatch, Envelope, Event, EventContext, FailureReason, JobEvent,
    WorkflowEvent,
};
use meridian_ops::trace;
use meridian_store::job_logs::{self, JobLog};
use meridian_store::Store;
use rust_decimal::Decimal;
use tokio::sync::watch;
use tracing::Instrument;
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("job {id}: {source}")]
    Job {
        id: Uuid,
        source: ExecuteError<JobError>,
    },
}

/// One job of this site the runner follows.
struct Tracked {
    job: Cached<Job>,
    backend: Option<BackendJobId>,
    tenant: String,
    /// The site took the cancel this job's history asks for.
    cancel_sent: bool,
}

pub struct SiteRunner {
    site: String,
    adapter: Arc<dyn SiteAdapter>,
    log: Arc<dyn EventLog>,
    /// Where captured output goes; none keeps no logs.
    store: Option<Store>,
    poll: Duration,
    /// How often the site's capacity and health are reported as a Site event.
    health_every: Duration,
    /// What was reported last, and when: unchanged reports are not repeated more often
    /// than every ten health intervals.
    last_health: Option<(
        meridian_events::vocabulary::site::Capacity,
        bool,
        tokio::time::Instant,
    )>,
    /// The site's aggregate id, once found in the catalogue.
    site_id: Option<Uuid>,
    /// The site's shapes when its id was found: what a rate's offer gave (GPU vendor and
    /// model) when the site does not say.
    shapes: Vec<meridian_events::vocabulary::site::Shape>,
    /// The catalogue as last read for an offer not among `shapes`, kept so that the next
    /// such read folds only the commits since (a site without shapes misses every time).
    catalog: Option<meridian_domain::Catalog>,
    /// This process, in its heartbeats.
    instance: Uuid,
    heartbeat_every: Duration,
    /// Refresh the site's shapes from its provider at the first heartbeat.
    refresh_at_start: bool,
    /// Whether "not in the catalogue" was said already.
    warned_unregistered: bool,
    /// Whether the site's devices were looked at since this process started.
    devices_checked: bool,
    /// How often the site's own jobs are checked against the log (the leak sweep).
    sweep_every: Duration,
    jobs: HashMap<Uuid, Tracked>,
    specs: HashMap<Uuid, Arc<meridian_spec::Workflow>>,
    /// What each job is given to call Meridian with; none: nothing.
    call_back: Option<CallBack>,
    /// Backend ids of array tasks submitted with their batch before their own dispatch
    /// reached this runner.
    batch_backends: HashMap<Uuid, BackendJobId>,
    /// Saves the site's snapshot of open jobs ([`OpenJobs`]) in the background every so
    /// many commits delivered.
    snapshots: snapshot::Refresh,
}

/// How a job calls Meridian back: every job and service is started with
/// `MERIDIAN_SERVER` and a `MERIDIAN_TOKEN` scoped to its workflow (a workflow credential).
/// The credential is made when the job starts and never written to the log.
#[derive(Clone)]
pub struct CallBack {
    /// The API's address as the site's jobs reach it.
    pub server: String,
    /// Makes the credential of a workflow's jobs.
    pub credential: Arc<dyn Fn(Uuid) -> String + Send + Sync>,
    /// Makes the credential one run reports its own start and end with (a cloud
    /// instance): good for that job only.
    pub run_credential: Arc<dyn Fn(Uuid) -> String + Send + Sync>,
}

/// The durable subscription name for a site: consumer names allow only `[A-Za-z0-9_-]`.
pub fn subscription_name(site: &str) -> String {
    let clean: String = site
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("site-{clean}")
}

/// The jobs dispatched to one site that have not ended, folded from the log: what a
/// runner follows again after a restart. Kept as the site's snapshot, so that a
/// restart reads only the commits after the last one.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpenJobs {
    /// The last position folded in.
    pub position: u64,
    pub jobs: std::collections::BTreeSet<Uuid>,
    /// Commits read from the log (after the snapshot, if one was used).
    #[serde(skip)]
    pub read: u64,
}

/// The snapshot format of [`OpenJobs`]: bump it when what it folds changes.
const OPEN_JOBS_FORMAT: u32 = 1;

impl OpenJobs {
    /// The snapshot name for `site`'s open jobs; `None` when the site's name makes it
    /// longer than a snapshot name may be (the log is then folded whole at each start).
    pub fn snapshot_name(site: &str) -> Option<String> {
        Some(format!("{}-jobs", subscription_name(site))).filter(|n| n.len() <= 64)
    }

    /// From the site's snapshot and the commits after it up to the log's head when it
    /// began (or the whole log); saves a new snapshot when it read `save_after` commits
    /// or more.
    pub async fn load(
        log: &dyn EventLog,
        site: &str,
        save_after: u64,
    ) -> Result<OpenJobs, LogError> {
        let name = OpenJobs::snapshot_name(site);
        let mut open = match &name {
            Some(name) => snapshot::load::<OpenJobs>(log, name, OPEN_JOBS_FORMAT)
                .await?
                .map(|(_, open)| open)
                .unwrap_or_default(),
            None => {
                tracing::warn!(
                    site,
                    "the site's name is too long for a snapshot name: each start reads the whole log"
                );
                OpenJobs::default()
            }
        };
        let read = snapshot::fold_to_head(log, open.position, 512, |commit| {
            open.position = commit.position;
            for raw in commit.events.iter() {
                open.visit(site, raw);
            }
            Ok::<_, LogError>(())
        })
        .await?;
        open.read += read;
        if let Some(name) = name.filter(|_| open.read >= save_after) {
            if let Err(e) = snapshot::save(log, &name, OPEN_JOBS_FORMAT, open.position, &open).await
            {
                tracing::warn!(site, error = %e, "could not save the site's snapshot");
            }
        }
        Ok(open)
    }

    fn visit(&mut self, site: &str, raw: &meridian_events::RawEnvelope) {
        if raw.aggregate.kind != AggregateKind::Job {
            return;
        }
        let id = raw.aggregate.id;
        if raw.sequence == 1 {
            if raw.payload.get("site").and_then(|s| s.as_str()) == Some(site) {
                self.jobs.insert(id);
            }
        } else if matches!(
            raw.payload.get("type").and_then(|t| t.as_str()),
            Some("job.finished.v1" | "job.failed.v1" | "job.cancelled.v1")
        ) {
            self.jobs.remove(&id);
        }
    }
}

/// How long a health check (or the leak sweep's listing) may take before the site is
/// reported unhealthy for it (or the sweep is skipped).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(60);

impl SiteRunner {
    pub fn new(
        site: impl Into<String>,
        adapter: Arc<dyn SiteAdapter>,
        log: Arc<dyn EventLog>,
        store: Option<Store>,
    ) -> SiteRunner {
        let site = site.into();
        let adapter: Arc<dyn SiteAdapter> = Arc::new(counted::Counted::new(&site, adapter));
        let refresh_at_start = adapter.refresh_shapes_at_start();
        SiteRunner {
            site,
            adapter,
            log,
            store,
            poll: Duration::from_millis(250),
            health_every: Duration::from_secs(30),
            last_health: None,
            site_id: None,
            shapes: Vec::new(),
            catalog: None,
            instance: Uuid::now_v7(),
            heartbeat_every: Duration::from_secs(20),
            refresh_at_start,
            warned_unregistered: false,
            devices_checked: false,
            sweep_every: Duration::from_secs(300),
            jobs: HashMap::new(),
            specs: HashMap::new(),
            call_back: None,
            batch_backends: HashMap::new(),
            snapshots: snapshot::Refresh::every(snapshot::SAVE_AFTER),
        }
    }

    /// Starts every job with `MERIDIAN_SERVER` and its workflow's credential.
    pub fn with_call_back(mut self, call_back: CallBack) -> SiteRunner {
        self.call_back = Some(call_back);
        self
    }

    /// How often the site's capacity and health are reported (30 s by default).
    pub fn with_health_interval(mut self, every: Duration) -> SiteRunner {
        self.health_every = every;
        self
    }

    /// How often the runner says it serves the site (20 s by default); each heartbeat
    /// holds for three intervals.
    pub fn with_heartbeat_interval(mut self, every: Duration) -> SiteRunner {
        self.heartbeat_every = every.max(Duration::from_secs(1));
        self
    }

    /// How often the jobs the site runs are checked against the log, and those no live
    /// job needs are stopped (5 minutes by default).
    pub fn with_sweep_interval(mut self, every: Duration) -> SiteRunner {
        self.sweep_every = every.max(Duration::from_millis(100));
        self
    }

    /// How often running jobs are asked for their state.
    pub fn with_poll_interval(mut self, poll: Duration) -> SiteRunner {
        self.poll = poll;
        self
    }

    /// Runs until `shutdown` turns true. Transient log errors are retried.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), RunnerError> {
        let mut backoff = Duration::from_millis(100);
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            match self.serve(&mut shutdown).await {
                Ok(()) => return Ok(()),
                Err(RunnerError::Log(e)) if e.is_transient() => {
                    tracing::warn!(site = %self.site, error = %e, "log unavailable; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.changed() => return Ok(()),
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn serve(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<(), RunnerError> {
        // The site's shapes first: runs recovered now record what their shape gave.
        self.site_id().await?;
        self.recover().await?;
        let mut sub = self.log.subscribe(&subscription_name(&self.site)).await?;
        let mut tick = tokio::time::interval(self.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut health = tokio::time::interval(self.health_every);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut beat = tokio::time::interval(self.heartbeat_every);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweep = tokio::time::interval(self.sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweeps = true;
        loop {
            tokio::select! {
                commits = sub.next_decoded(128, Duration::from_millis(100), &[AggregateKind::Job]) => {
                    let commits = commits?;
                    // A restart then folds at most about SAVE_AFTER commits past the snapshot.
                    // (No snapshot can be kept under a site name too long for one.)
                    self.snapshots.delivered(commits.len() as u64, || {
                        let (log, site) = (self.log.clone(), self.site.clone());
                        async move {
                            if OpenJobs::snapshot_name(&site).is_none() {
                                return;
                            }
                            if let Err(e) = OpenJobs::load(&*log, &site, snapshot::REFRESH_SAVES).await {
                                tracing::warn!(%site, error = %e, "could not fold the log for the site's snapshot");
                            }
                        }
                    });
                    for commit in commits {
                        for envelope in commit.events {
                            self.observe(envelope).await?;
                        }
                        sub.ack(commit.position).await?;
                    }
                }
                _ = tick.tick() => self.poll_all().await?,
                _ = health.tick() => self.report_health().await?,
                _ = beat.tick() => self.heartbeat().await?,
                _ = sweep.tick(), if sweeps => sweeps = self.sweep().await?,
                _ = shutdown.changed() => {
                    self.snapshots.finish(snapshot::FINISH_WITHIN).await;
                    self.disconnect().await;
                    return Ok(());
                }
            }
        }
    }

    /// Reports the site's capacity and health (idle nodes, free CPUs and GPUs, queue
    /// depth) as a Site event, for placement; skips a report equal to the last one
    /// unless it is getting old.
    async fn report_health(&mut self) -> Result<(), RunnerError> {
        if let Some(site_id) = self.site_id().await? {
            // Best effort: a device check that cannot be recorded now is done again at
            // the next health report; it never stops the runner.
            match tokio::time::timeout(Duration::from_secs(60), self.check_devices(site_id)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(site = %self.site, error = %e, "could not check the site's devices")
                }
                Err(_) => {
                    tracing::warn!(site = %self.site, "the device check took over 60 s; skipped")
                }
            }
        }
        // A backend that does not answer is unhealthy, said with why, not a runner that
        // never reports.
        let capacity = match tokio::time::timeout(HEALTH_TIMEOUT, self.adapter.capacity()).await {
            Ok(answer) => answer,
            Err(_) => Err(AdapterError::Unavailable(format!(
                "the site's health check did not answer within {} s",
                HEALTH_TIMEOUT.as_secs()
            ))),
        };
        let (healthy, capacity, message) = match capacity {
            Ok(c) => (
                c.healthy,
                meridian_events::vocabulary::site::Capacity {
                    idle_nodes: c.idle_nodes,
                    free_cpus: u64::from(c.free_cpus),
                    free_gpus: c.free_gpus,
                    free_gpus_by_model: c.free_gpus_by_model,
                    pending_jobs: c.pending,
                },
                c.message,
            ),
            Err(e) => (
                false,
                meridian_events::vocabulary::site::Capacity::default(),
                Some(e.to_string()),
            ),
        };
        let now = tokio::time::Instant::now();
        if let Some((last, was_healthy, at)) = &self.last_health {
            if *last == capacity && *was_healthy == healthy && now - *at < self.health_every * 10 {
                return Ok(());
            }
        }
        let Some(site_id) = self.site_id().await? else {
            return Ok(());
        };
        let command = SiteCommand::ReportHealth {
            healthy,
            capacity: capacity.clone(),
            message,
        };
        if self.on_site(site_id, command, "report health").await? {
            self.last_health = Some((capacity, healthy, now));
        }
        Ok(())
    }

    /// Looks at the site's GPUs (the local site's): records them when they changed,
    /// cordons each one whose health check found a fault, and tells the adapter which
    /// devices get no new work (the log's cordons, an admin's among them).
    async fn check_devices(&mut self, site_id: Uuid) -> Result<(), RunnerError> {
        let devices = match self.adapter.devices().await {
            Ok(devices) => devices,
            Err(e) => {
                tracing::warn!(site = %self.site, error = %e, "could not look at the site's devices");
                return Ok(());
            }
        };
        // Sites without devices of their own skip the look-up, but for the first look
        // after a start: devices gone since must not stay listed.
        if devices.is_empty() && std::mem::replace(&mut self.devices_checked, true) {
            return Ok(());
        }
        self.devices_checked = true;
        let listed = devices::listed(&devices);
        self.on_site(
            site_id,
            SiteCommand::ReportDevices { devices: listed },
            "record the site's devices",
        )
        .await?;
        let site =
            aggregates::load::<meridian_events::aggregate::Site>(&*self.log, site_id).await?;
        let mut cordoned: std::collections::BTreeSet<String> =
            site.state.cordoned().keys().cloned().collect();
        for device in &devices {
            let Some(fault) = device
                .fault
                .clone()
                .filter(|_| !cordoned.contains(&device.id))
            else {
                continue;
            };
            tracing::warn!(site = %self.site, device = %device.id, model = %device.model, %fault, "cordoning a faulty device");
            let command = SiteCommand::CordonDevice {
                device: device.id.clone(),
                reason: fault,
                by: devices::HEALTH_CHECK.into(),
                fault: true,
            };
            if self
                .on_site(site_id, command, "cordon a faulty device")
                .await?
            {
                cordoned.insert(device.id.clone());
            }
        }
        self.adapter.cordon(&cordoned);
        Ok(())
    }

    /// Runs `command` on the site's aggregate; a refusal is logged (`what` failed) and
    /// is no error. Returns whether it was carried out.
    async fn on_site(
        &self,
        site_id: Uuid,
        command: SiteCommand,
        what: &str,
    ) -> Result<bool, RunnerError> {
        let ctx = EventContext::new_chain("system");
        match aggregates::execute::<meridian_events::aggregate::Site, _>(
            &*self.log,
            site_id,
            &ctx,
            |_| command.clone(),
        )
        .await
        {
            Ok(_) => Ok(true),
            Err(ExecuteError::Log(e)) => Err(e.into()),
            Err(e) => {
                tracing::warn!(site = %self.site, error = %e, "could not {what}");
                Ok(false)
            }
        }
    }

    /// The site's aggregate id, looked up in the catalogue until it is there.
    async fn site_id(&mut self) -> Result<Option<Uuid>, RunnerError> {
        if self.site_id.is_none() {
            let catalog = meridian_domain::Catalog::load(&*self.log).await?;
            if let Some(entry) = catalog.find(&self.site) {
                self.site_id = Some(entry.id);
                self.shapes = entry.shapes.clone();
            }
        }
        if self.site_id.is_none() && !self.warned_unregistered {
            self.warned_unregistered = true;
            tracing::warn!(site = %self.site, "the site is not in the catalogue, so nothing is placed on it: apply a catalogue that names it (meridian site apply FILE)");
        }
        Ok(self.site_id)
    }

    /// Says this process serves the site, for the next three heartbeat intervals.
    async fn heartbeat(&mut self) -> Result<(), RunnerError> {
        let Some(site_id) = self.site_id().await? else {
            return Ok(());
        };
        let command = SiteCommand::Heartbeat {
            adapter: self.adapter.kind().to_string(),
            instance: self.instance,
            ttl_secs: (self.heartbeat_every * 3).as_secs().max(1),
            arrays: self
                .adapter
                .array_limit()
                .map(|n| n.min(meridian_events::vocabulary::MAX_ARRAY_BATCH)),
        };
        self.on_site(site_id, command, "record the heartbeat")
            .await?;
        self.refresh_shapes(site_id).await
    }

    /// Reads the site's shapes from its provider when an admin asked for it (`meridian
    /// site refresh`), or at start when the adapter is configured to; records the
    /// outcome, and the shapes when they changed.
    async fn refresh_shapes(&mut self, site_id: Uuid) -> Result<(), RunnerError> {
        let at_start = std::mem::take(&mut self.refresh_at_start);
        let site =
            aggregates::load::<meridian_events::aggregate::Site>(&*self.log, site_id).await?;
        if !(at_start || site.state.shapes_refresh_pending()) {
            return Ok(());
        }
        let current = site.state.shapes().to_vec();
        let names: Vec<String> = current.iter().map(|s| s.name.clone()).collect();
        let (shapes, outcome) = match self.adapter.shapes(&names).await {
            Ok(facts) => {
                let (shapes, outcome) = shapes::refreshed(&current, &facts);
                (Some(shapes), outcome)
            }
            Err(e) => (None, format!("could not read the shapes: {e}")),
        };
        tracing::info!(site = %self.site, %outcome, "refreshed the site's shapes from its provider");
        if let Some(shapes) = &shapes {
            self.shapes = shapes.clone();
        }
        let command = SiteCommand::RecordShapesRefresh { shapes, outcome };
        self.on_site(site_id, command, "record the refreshed shapes")
            .await
            .map(|_| ())
    }

    /// Says this process no longer serves the site (best effort: a failure only means
    /// the site stays connected until its last heartbeat runs out).
    async fn disconnect(&mut self) {
        let Some(site_id) = self.site_id else {
            return;
        };
        let command = SiteCommand::Disconnect {
            instance: self.instance,
        };
        if let Err(e) = self
            .on_site(site_id, command, "record the disconnection")
            .await
        {
            tracing::warn!(site = %self.site, error = %e, "could not record the disconnection");
        }
    }

    /// Stops what the site runs that no live job of its needs: a job the log says ended
    /// (its end was recorded while the site still ran it), one dispatched elsewhere, or
    /// one the log does not know. Returns whether to sweep again (not when the site cannot
    /// list what it runs).
    async fn sweep(&mut self) -> Result<bool, RunnerError> {
        // A backend that does not answer costs one missed sweep, not a stalled runner.
        let owned = match tokio::time::timeout(HEALTH_TIMEOUT, self.adapter.owned()).await {
            Err(_) => {
                tracing::warn!(site = %self.site, "leak sweep: the site did not list its jobs within {} s", HEALTH_TIMEOUT.as_secs());
                return Ok(true);
            }
            Ok(owned) => owned,
        };
        let owned = match owned {
            Ok(owned) => owned,
            Err(AdapterError::NotSupported(what)) => {
                tracing::debug!(site = %self.site, what, "no leak sweep at this site");
                return Ok(false);
            }
            Err(e) => {
                tracing::warn!(site = %self.site, error = %e, "leak sweep: cannot list the site's jobs");
                return Ok(true);
            }
        };
        for job_id in owned {
            if self.jobs.contains_key(&job_id) {
                continue;
            }
            let job = Cached::<Job>::load(&*self.log, job_id).await?;
            let live = job.state.state().is_some_and(|s| !s.is_terminal())
                && job.state.dispatch().is_some_and(|d| d.site == self.site);
            if live {
                // Dispatched here since the last look: the subscription brings it.
                continue;
            }
            let Some(backend) = self.adapter.find(job_id).await.ok().flatten() else {
                continue;
            };
            let why = match job.state.state() {
                None => "the log has no such job".to_string(),
                Some(s) if s.is_terminal() => format!("its job is already {s}"),
                Some(_) => "its job was dispatched to another site".to_string(),
            };
            tracing::warn!(site = %self.site, job = %job_id, %backend, why, "leak sweep: stopping a job no live job needs");
            if let Err(e) = self.adapter.cancel(&backend).await {
                tracing::warn!(site = %self.site, job = %job_id, error = %e, "leak sweep: the cancel failed; will try again");
            }
        }
        Ok(true)
    }

    /// Finds this site's jobs that have not ended (from its snapshot and the log after
    /// it), and follows each again.
    async fn recover(&mut self) -> Result<(), RunnerError> {
        let open = OpenJobs::load(&*self.log, &self.site, snapshot::SAVE_AFTER).await?;
        for id in open.jobs {
            if self.jobs.contains_key(&id) {
                continue;
            }
            let job = Cached::<Job>::load(&*self.log, id).await?;
            if job.state.state().is_some_and(|s| !s.is_terminal()) {
                tracing::info!(site = %self.site, job = %id, "following a job from before the restart");
                self.track(job).await?;
            }
        }
        Ok(())
    }

    async fn observe(&mut self, envelope: Envelope<Event>) -> Result<(), RunnerError> {
        let id = envelope.aggregate.id;
        if let Some(tracked) = self.jobs.get_mut(&id) {
            if !tracked.job.observe(&envelope) {
                tracked.job = Cached::load(&*self.log, id).await?;
            }
            if matches!(
                envelope.payload,
                Event::Job(JobEvent::CancelRequested { .. })
            ) {
                self.pass_cancel_on(id).await;
            }
            return Ok(());
        }
        if let Event::Job(JobEvent::Dispatched { site, .. }) = &envelope.payload {
            if *site == self.site {
                let job = Cached::<Job>::load(&*self.log, id).await?;
                if job.state.state().is_some_and(|s| !s.is_terminal()) {
                    self.track(job).await?;
                }
            }
        }
        Ok(())
    }

    async fn track(&mut self, job: Cached<Job>) -> Result<(), RunnerError> {
        let id = job.id;
        let backend = job
            .state
            .backend_job_id()
            .map(|b| BackendJobId(b.to_string()));
        let tenant = job.tenant.clone().unwrap_or_else(|| "default".into());
        self.jobs.insert(
            id,
            Tracked {
                job,
                backend,
                tenant,
                cancel_sent: false,
            },
        );
        self.step(id).await
    }

    /// Asks the site about every job it follows: array tasks submitted together in one
    /// call per batch (a site holding a 1,000-task array is asked once, not 1,000
    /// times), every other job on its own.
    async fn poll_all(&mut self) -> Result<(), RunnerError> {
        let ids: Vec<Uuid> = self.jobs.keys().copied().collect();
        let mut batches: HashMap<Uuid, Vec<(Uuid, BackendJobId)>> = HashMap::new();
        for id in ids {
            let batch = self.jobs[&id].job.state.dispatch().and_then(|d| d.batch);
            match batch {
                Some(b) => {
                    if let Some(backend) = self.at_site(id).await? {
                        batches.entry(b.id).or_default().push((id, backend));
                    }
                }
                None => self.step(id).await?,
            }
        }
        for members in batches.into_values() {
            let backends: Vec<BackendJobId> = members.iter().map(|(_, b)| b.clone()).collect();
            let reports = self.adapter.status_all(&backends).await;
            for ((id, _), report) in members.into_iter().zip(reports) {
                if self.jobs.contains_key(&id) {
                    self.advance(id, report).await?;
                }
            }
        }
        Ok(())
    }

    async fn spec_of(
        &mut self,
        workflow_id: Uuid,
    ) -> Result<Option<Arc<meridian_spec::Workflow>>, RunnerError> {
        if let Some(spec) = self.specs.get(&workflow_id) {
            return Ok(Some(spec.clone()));
        }
        let loaded = aggregates::load::<Workflow>(&*self.log, workflow_id).await?;
        let Some(spec) = loaded.state.spec().cloned().map(Arc::new) else {
            return Ok(None);
        };
        self.specs.insert(workflow_id, spec.clone());
        Ok(Some(spec))
    }

    /// The shape whose offer (or spot offer) placement priced the run at, from the
    /// site's catalogue entry; brought up to date once when an offer is not among the
    /// shapes known (the catalogue may have changed since), folding in only the
    /// commits after the last time.
    async fn placed_shape(&mut self, offer: &str) -> Result<Option<PlacedShape>, RunnerError> {
        let find = |shapes: &[meridian_events::vocabulary::site::Shape]| {
            shapes.iter().find_map(|shape| {
                let spot = shape.spot_offer.as_deref() == Some(offer);
                (shape.offer == offer || spot).then(|| PlacedShape {
                    name: shape.name.clone(),
                    offer: offer.to_string(),
                    spot,
                    gpu_vendor: shape.gpus.as_ref().map(|g| {
                        match g.vendor {
                            AcceleratorVendor::Nvidia => "nvidia",
                            AcceleratorVendor::Amd => "amd",
                        }
                        .to_string()
                    }),
                })
            })
        };
        if let Some(found) = find(&self.shapes) {
            return Ok(Some(found));
        }
        let catalog = match &mut self.catalog {
            Some(catalog) => {
                catalog.catch_up(&*self.log).await?;
                catalog
            }
            None => self
                .catalog
                .insert(meridian_domain::Catalog::load(&*self.log).await?),
        };
        if let Some(entry) = catalog.find(&self.site) {
            self.shapes = entry.shapes.clone();
        }
        Ok(find(&self.shapes))
    }

    async fn request_for(&mut self, id: Uuid) -> Result<Option<JobRequest>, RunnerError> {
        let Some(dispatch) = self.jobs[&id].job.state.dispatch().cloned() else {
            return Ok(None);
        };
        let Some(spec) = self.spec_of(dispatch.workflow_id).await? else {
            return Ok(None);
        };
        let slurm = spec.jobs.get(&dispatch.task.job).and_then(|j| {
            j.slurm
                .as_ref()
                .map(|s| meridian_adapter_core::SlurmOptions {
                    partition: s.partition.clone(),
                    qos: s.qos.clone(),
                })
        });
        let (image, command, env, cwd, mounts, service) =
            if let Some(j) = spec.jobs.get(&dispatch.task.job) {
                (&j.image, &j.command, &j.env, &j.cwd, &j.mounts, None)
            } else if let Some(s) = spec.services.get(&dispatch.task.job) {
                let service = ServiceRequest {
                    port: s.port,
                    min_replicas: s.replicas.min,
                    max_replicas: s.replicas.max,
                    max_restarts: DEFAULT_MAX_RESTARTS,
                };
                (
                    &s.image,
                    &s.command,
                    &s.env,
                    &s.cwd,
                    &s.mounts,
                    Some(service),
                )
            } else {
                return Ok(None);
            };
        let r = &dispatch.resources;
        let mut env = env.clone();
        if let Some(call_back) = &self.call_back {
            env.insert("MERIDIAN_SERVER".into(), call_back.server.clone());
            env.insert(
                "MERIDIAN_TOKEN".into(),
                (call_back.credential)(dispatch.workflow_id),
            );
        }
        Ok(Some(JobRequest {
            job_id: id,
            workflow_id: dispatch.workflow_id,
            name: dispatch.task.job.clone(),
            array_index: dispatch.task.index,
            image: (!image.is_host()).then(|| image.as_str().to_string()),
            command: command.clone(),
            env,
            cwd: cwd.clone(),
            resources: meridian_adapter_core::Resources {
                nodes: r.nodes,
                cpus: r.cpus,
                memory_bytes: r.memory.bytes(),
                walltime: Duration::from_secs(r.walltime.secs()),
                gpus: r.gpus.as_ref().map(|g| meridian_adapter_core::Gpus {
                    count: g.count,
                    vendor: g.vendor.as_str().to_string(),
                    model: g.model.clone(),
                }),
            },
            service,
            volume_sizes: mounts
                .keys()
                .filter_map(|v| Some((v.clone(), spec.volumes.get(v)?.size.bytes())))
                .collect(),
            mounts: mounts.clone(),
            tenant: Some(self.jobs[&id].tenant.clone()),
            shape: self.placed_shape(&dispatch.rate.offer).await?,
            report_to: self.call_back.as_ref().map(|c| ReportTo {
                server: c.server.clone(),
                credential: (c.run_credential)(id),
            }),
            slurm,
        }))
    }

    async fn command(&mut self, id: Uuid, command: JobCommand) -> Result<(), RunnerError> {
        let log = self.log.clone();
        let tracked = self.jobs.get_mut(&id).expect("tracked");
        // Inside `submit job` when submitting; else a span of its own in the job's trace.
        let span = if tracing::Span::current().is_none() {
            trace::child_of("job progress", tracked.job.traceparent.as_deref())
        } else {
            tracing::Span::current()
        };
        trace::mark_job(&span, id);
        let ctx = EventContext::new_chain(tracked.tenant.clone());
        let ctx = EventContext {
            correlation_id: tracked
                .job
                .state
                .dispatch()
                .map_or(ctx.correlation_id, |d| d.workflow_id),
            traceparent: trace::traceparent_of(&span, tracked.job.traceparent.as_deref()),
            ..ctx
        };
        match tracked
            .job
            .execute(&*log, &ctx, |_| command.clone())
            .instrument(span)
            .await
        {
            Ok(_) => Ok(()),
            // Someone (a previous run of this runner) already recorded it.
            Err(ExecuteError::Rejected(
                JobError::AlreadySubmittedToSite
                | JobError::AlreadyStarted
                | JobError::AlreadyTerminal { .. },
            )) => Ok(()),
            Err(source) => Err(RunnerError::Job { id, source }),
        }
    }

    /// Moves one job forward by what its site says now.
    async fn step(&mut self, id: Uuid) -> Result<(), RunnerError> {
        let Some(backend) = self.at_site(id).await? else {
            return Ok(());
        };
        let report = self.adapter.status(&backend).await;
        self.advance(id, report).await
    }

    /// The backend id of job `id` when what the site says of it is what moves it on;
    /// `None` once it was dealt with here: forgotten when it ended, submitted when it
    /// had not been.
    async fn at_site(&mut self, id: Uuid) -> Result<Option<BackendJobId>, RunnerError> {
        match self.jobs[&id].job.state.state() {
            None => {
                self.jobs.remove(&id);
                return Ok(None);
            }
            Some(s) if s.is_terminal() => {
                self.finish_tracking(id).await;
                return Ok(None);
            }
            _ => {}
        }
        match self.jobs[&id].backend.clone() {
            Some(backend) => Ok(Some(backend)),
            None => {
                let traceparent = self.jobs[&id].job.traceparent.clone();
                let span = trace::child_of("submit job", traceparent.as_deref());
                trace::mark_job(&span, id);
                self.submit(id).instrument(span).await.map(|()| None)
            }
        }
    }

    /// Moves job `id` forward by what its site said of it.
    async fn advance(
        &mut self,
        id: Uuid,
        report: Result<meridian_adapter_core::JobReport, AdapterError>,
    ) -> Result<(), RunnerError> {
        let report = match report {
            Ok(report) => report,
            Err(AdapterError::Unavailable(e)) => {
                tracing::warn!(job = %id, error = %e, "site unavailable; will ask again");
                return Ok(());
            }
            Err(AdapterError::UnknownJob(_)) => {
                return self
                    .command(
                        id,
                        JobCommand::Fail {
                            ended_at: Utc::now(),
                            exit_code: None,
                            reason: FailureReason::Lost,
                            usage: Usage::default(),
                        },
                    )
                    .await;
            }
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "status failed");
                return Ok(());
            }
        };
        // A cancel asked for before a restart (or that failed) reaches the site now.
        if self.jobs[&id].job.state.cancel_requested()
            && !self.jobs[&id].cancel_sent
            && !report.state.is_terminal()
        {
            self.pass_cancel_on(id).await;
        }
        // Nothing waits silently: why the site holds the run back goes to the log when it
        // changes, and shows in the run's status.
        if let (SiteState::Pending, Some(reason)) = (&report.state, &report.waiting) {
            if self.jobs[&id].job.state.waiting() != Some(reason.as_str()) {
                self.command(
                    id,
                    JobCommand::RecordWaiting {
                        reason: reason.clone(),
                    },
                )
                .await?;
            }
        }
        let started = self.jobs[&id].job.state.started_at().is_some();
        let started_at = match &report.state {
            SiteState::Running { started_at } | SiteState::Succeeded { started_at, .. } => {
                Some(*started_at)
            }
            SiteState::Failed { started_at, .. } | SiteState::Cancelled { started_at, .. } => {
                *started_at
            }
            SiteState::Pending => None,
        };
        if let (false, Some(started_at)) = (started, started_at) {
            let allocated = self.allocation(id, &report.usage);
            self.command(
                id,
                JobCommand::Start {
                    started_at,
                    allocated,
                    hosts: vec![hostname()],
                },
            )
            .await?;
        }
        // A running run not yet known to answer: a service, if its spec says so.
        let unready = matches!(report.state, SiteState::Running { .. })
            && self.jobs[&id].job.state.address().is_none();
        let address = match unready {
            true => match self.service_of(id).await? {
                Some(service) => meridian_adapter_core::service_address(&report, &service).await,
                None => None,
            },
            false => None,
        };
        if let Some(address) = &address {
            if self.jobs[&id].job.state.address() != Some(address.as_str()) {
                tracing::info!(site = %self.site, job = %id, %address, "service ready");
                self.command(
                    id,
                    JobCommand::RecordServiceReady {
                        address: address.clone(),
                        ready_at: Utc::now(),
                    },
                )
                .await?;
            }
        }
        let usage = usage_of(&report.usage);
        let end = match report.state {
            SiteState::Pending | SiteState::Running { .. } => return Ok(()),
            SiteState::Succeeded { ended_at, .. } => JobCommand::Finish {
                ended_at,
                exit_code: 0,
                usage,
            },
            SiteState::Failed {
                ended_at,
                exit_code,
                failure,
                ..
            } => JobCommand::Fail {
                ended_at,
                exit_code,
                reason: failure,
                usage,
            },
            SiteState::Cancelled { ended_at, .. } => JobCommand::Cancel { ended_at, usage },
        };
        // Output first: once the run's end is in the log, readers may ask for it.
        self.keep_output(id).await;
        self.command(id, end).await?;
        self.jobs.remove(&id);
        Ok(())
    }

    /// What makes job `id` a service, if it is one (from its workflow's spec).
    async fn service_of(&mut self, id: Uuid) -> Result<Option<ServiceRequest>, RunnerError> {
        Ok(self.request_for(id).await?.and_then(|r| r.service))
    }

    async fn submit(&mut self, id: Uuid) -> Result<(), RunnerError> {
        if let Some(batch) = self.jobs[&id].job.state.dispatch().and_then(|d| d.batch) {
            return self.submit_in_batch(id, batch).await;
        }
        let Some(request) = self.request_for(id).await? else {
            return self.submit_alone_fails(id).await;
        };
        if self.jobs[&id].job.state.cancel_requested() {
            return self
                .command(
                    id,
                    JobCommand::Cancel {
                        ended_at: Utc::now(),
                        usage: Usage::default(),
                    },
                )
                .await;
        }
        match self.adapter.submit(&request).await {
            Ok(backend) => self.record_submission(id, backend).await,
            Err(e) => self.submit_failed(id, e).await,
        }
    }

    /// Submits the array batch task `id` was released in, as one unit, unless the site
    /// has it already, and records each of its tasks this runner follows as submitted.
    /// A task cancelled before the submission goes with it and is cancelled at the site
    /// (its cancel is passed on at the next poll), so no task of the batch runs unseen.
    async fn submit_in_batch(&mut self, id: Uuid, batch: ArrayBatch) -> Result<(), RunnerError> {
        if let Some(backend) = self.batch_backends.remove(&id) {
            return self.record_submission(id, backend).await;
        }
        let Some(template) = self.request_for(id).await? else {
            return self.submit_alone_fails(id).await;
        };
        let loaded = aggregates::load::<Workflow>(&*self.log, template.workflow_id).await?;
        let tasks: Vec<ArrayTask> = loaded
            .history
            .iter()
            .filter_map(|e| match &e.payload {
                Event::Workflow(WorkflowEvent::JobReleased {
                    index: Some(index),
                    job_id,
                    batch: Some(b),
                    ..
                }) if b.id == batch.id => Some((b.position, (*index, *job_id))),
                _ => None,
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_values()
            .map(|(index, job_id)| ArrayTask { index, job_id })
            .collect();
        if tasks.len() != batch.size as usize || !tasks.iter().any(|t| t.job_id == id) {
            tracing::warn!(site = %self.site, job = %id, batch = %batch.id, found = tasks.len(), size = batch.size, "the batch's release is not all in the log; will look again");
            return Ok(());
        }
        let request = ArrayRequest {
            batch_id: batch.id,
            template,
            tasks,
            cap: batch.cap,
        };
        let backends = match self.adapter.submit_array(&request).await {
            Ok(backends) if backends.len() == request.tasks.len() => backends,
            Ok(backends) => {
                let message = format!(
                    "the site gave {} ids for an array of {} tasks",
                    backends.len(),
                    request.tasks.len()
                );
                tracing::warn!(site = %self.site, batch = %batch.id, %message, "will retry");
                return Ok(());
            }
            Err(e) => return self.submit_failed(id, e).await,
        };
        tracing::info!(site = %self.site, batch = %batch.id, tasks = request.tasks.len(), cap = batch.cap, "array submitted as one unit");
        let mut mine = None;
        for (task, backend) in request.tasks.iter().zip(backends) {
            if task.job_id == id {
                mine = Some(backend);
            } else if self
                .jobs
                .get(&task.job_id)
                .is_some_and(|t| t.backend.is_none())
            {
                self.record_submission(task.job_id, backend).await?;
            } else if !self.jobs.contains_key(&task.job_id) {
                // Its dispatch has not reached this runner yet: recorded when it does.
                self.batch_backends.insert(task.job_id, backend);
            }
        }
        match mine {
            Some(backend) => self.record_submission(id, backend).await,
            None => Ok(()),
        }
    }

    async fn record_submission(
        &mut self,
        id: Uuid,
        backend: BackendJobId,
    ) -> Result<(), RunnerError> {
        self.jobs.get_mut(&id).expect("tracked").backend = Some(backend.clone());
        self.command(
            id,
            JobCommand::RecordSubmission {
                backend_job_id: backend.0,
            },
        )
        .await
    }

    async fn submit_alone_fails(&mut self, id: Uuid) -> Result<(), RunnerError> {
        tracing::warn!(job = %id, "no spec for this job; failing it");
        self.command(
            id,
            JobCommand::Fail {
                ended_at: Utc::now(),
                exit_code: None,
                reason: FailureReason::Other {
                    message: "its workflow spec has no such job".into(),
                },
                usage: Usage::default(),
            },
        )
        .await
    }

    /// What a refused submission makes of job `id`: a failure of the job when it can
    /// never run here, a site refusal (placed again) for capacity or quota; anything
    /// else is tried again at the next poll.
    async fn submit_failed(&mut self, id: Uuid, error: AdapterError) -> Result<(), RunnerError> {
        match error {
            AdapterError::Rejected(message) => {
                self.fail_unsubmitted(id, FailureReason::Other { message })
                    .await
            }
            e @ AdapterError::NotSupported(_) => {
                let message = e.to_string();
                self.fail_unsubmitted(id, FailureReason::Other { message })
                    .await
            }
            // Capacity or quota: a site fault, so the router places the work again.
            AdapterError::Refused(message) => {
                tracing::warn!(site = %self.site, job = %id, %message, "the site refused the job; it goes back to placement");
                self.fail_unsubmitted(id, FailureReason::SiteRefused { message })
                    .await
            }
            // Nothing waits silently: why the site cannot start it yet shows in the
            // run's status until it can.
            AdapterError::Busy(message) => {
                let reason = format!("waiting for the site: {message}");
                if self.jobs[&id].job.state.waiting() != Some(reason.as_str()) {
                    self.command(id, JobCommand::RecordWaiting { reason })
                        .await?;
                }
                Ok(())
            }
            e => {
                tracing::warn!(job = %id, error = %e, "submit failed; will retry");
                Ok(())
            }
        }
    }

    /// Asks the site to stop job `id`; a failure is retried at the next poll.
    async fn pass_cancel_on(&mut self, id: Uuid) {
        let Some(tracked) = self.jobs.get_mut(&id) else {
            return;
        };
        let Some(backend) = tracked.backend.clone() else {
            return;
        };
        match self.adapter.cancel(&backend).await {
            Ok(()) | Err(AdapterError::UnknownJob(_)) => tracked.cancel_sent = true,
            Err(e) => tracing::warn!(job = %id, error = %e, "cancel failed; will retry"),
        }
    }

    async fn fail_unsubmitted(
        &mut self,
        id: Uuid,
        reason: FailureReason,
    ) -> Result<(), RunnerError> {
        self.command(
            id,
            JobCommand::Fail {
                ended_at: Utc::now(),
                exit_code: None,
                reason,
                usage: Usage::default(),
            },
        )
        .await
    }

    /// The accelerators a run got: what the site reports; else what the shape its rate
    /// prices has; else what the job asked for.
    fn gpus_given(
        &self,
        rate: &meridian_events::ComputeRate,
        requested: &meridian_spec::Gpus,
        usage: &meridian_adapter_core::Usage,
    ) -> (AcceleratorVendor, Option<String>) {
        let shape = self
            .shapes
            .iter()
            .find(|s| s.offer == rate.offer || s.spot_offer.as_deref() == Some(&rate.offer))
            .and_then(|s| s.gpus.as_ref());
        let vendor = match usage.gpu_vendor.as_deref() {
            Some("amd") => AcceleratorVendor::Amd,
            Some("nvidia") => AcceleratorVendor::Nvidia,
            _ => match (requested.vendor, shape) {
                (meridian_spec::GpuVendor::Amd, _) => AcceleratorVendor::Amd,
                (meridian_spec::GpuVendor::Nvidia, _) => AcceleratorVendor::Nvidia,
                (_, Some(shape)) => shape.vendor,
                // Nothing says: the catalogue's own default.
                (_, None) => AcceleratorVendor::Nvidia,
            },
        };
        let model = usage
            .gpu_model
            .clone()
            .or_else(|| shape.map(|s| s.model.clone()))
            .or_else(|| requested.model.clone());
        (vendor, model)
    }

    fn allocation(&self, id: Uuid, usage: &meridian_adapter_core::Usage) -> Allocation {
        let requested = self.jobs[&id]
            .job
            .state
            .dispatch()
            .map(|d| d.resources.clone())
            .unwrap_or_default();
        let rate = self.jobs[&id].job.state.dispatch().map(|d| d.rate.clone());
        let gpus = requested.gpus.as_ref().zip(rate).map(|(g, rate)| {
            let (vendor, model) = self.gpus_given(&rate, g, usage);
            AllocatedGpus {
                count: usage.gpus.max(g.count * requested.nodes),
                vendor,
                model,
            }
        });
        Allocation {
            nodes: usage.nodes.max(1),
            cpus: if usage.cpus > 0 {
                usage.cpus
            } else {
                requested.cpus * requested.nodes
            },
            memory_bytes: if usage.memory_bytes > 0 {
                usage.memory_bytes
            } else {
                requested.memory.bytes() * u64::from(requested.nodes)
            },
            gpus: gpus.filter(|g| g.count > 0),
        }
    }

    /// Stops following a job that ended, keeping its output.
    async fn finish_tracking(&mut self, id: Uuid) {
        self.keep_output(id).await;
        self.jobs.remove(&id);
    }

    /// Copies a run's captured output into the store (best effort: a failure is logged).
    async fn keep_output(&self, id: Uuid) {
        let Some(tracked) = self.jobs.get(&id) else {
            return;
        };
        let (Some(store), Some(backend), Some(dispatch)) =
            (&self.store, &tracked.backend, tracked.job.state.dispatch())
        else {
            return;
        };
        match self.adapter.logs(backend).await {
            Ok(logs) => {
                let entry = JobLog {
                    job_id: id.to_string(),
                    workflow_id: dispatch.workflow_id.to_string(),
                    job: dispatch.task.job.clone(),
                    index: dispatch.task.index.map(i64::from),
                    attempt: i64::from(dispatch.attempt),
                    stdout: logs.stdout,
                    stderr: logs.stderr,
                    captured_at: Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                };
                if let Err(e) = job_logs::save(store, &entry).await {
                    tracing::warn!(job = %id, error = %e, "could not keep the job's output");
                }
            }
            Err(e) => tracing::warn!(job = %id, error = %e, "could not read the job's output"),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

fn usage_of(usage: &meridian_adapter_core::Usage) -> Usage {
    Usage {
        cpu_seconds: usage
            .cpu_seconds
            .and_then(|s| Decimal::from_f64_retain(s).map(|d| d.round_dp(3))),
        max_rss_bytes: usage.max_rss_bytes,
        gpu_seconds: None,
        billed: usage.billed,
    }
}
