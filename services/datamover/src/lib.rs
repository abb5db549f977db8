//! The data mover brings each volume's declared inputs (its `ingress` steps) to every
//! site where the volume is held, before any job that mounts it there starts: the
//! Workflow aggregate releases such a job only once `workflow.volume_staged.v1` says the
//! data arrived, and fails the workflow with the reason when a step fails for good
//! (`workflow.volume_staging_failed.v1`), so no job runs on missing data. Every copy is a
//! Transfer aggregate (requested, then completed with its bytes and digest, or failed),
//! which the data-locality map and the ledger read.
//!
//! Where the bytes go: the data mover writes into the volume's directory at the site
//! ([`meridian_adapter_core::volume_dir`] under the site's volume root, which its adapter
//! gives: [`meridian_adapter_core::SiteAdapter::volume_root`]), for sites whose storage
//! this machine reaches (the local site; Slurm and PBS sites with a shared
//! `volume_root`). Other sites' volumes are refused with that reason. Sources:
//! `file://`, `http(s)://`, `s3://`, `gs://`, `az://` and `hf://` ([`fetch`]); what was
//! fetched is kept in the site's cache by content ([`cache`]), so the same input asked
//! for again is not fetched again. A step may name a secret whose variables reach its
//! store ([`DataMover::with_secrets`]).
//!
//! Moves: in a split workflow a volume is copied from the site where the jobs that fill
//! it ran to the next job's site once they are done, in place of its ingress there.
//!
//! Egress: a volume is due to be copied out once every job that mounts it succeeded
//! (`workflow.egress_due.v1`); the mover copies its `egress` steps to their destinations
//! and records it exported, or fails it with the reason (its outputs are then kept at
//! the site until a retry or an admin's release). Each copy out, and each move, is billed
//! at the site's egress price in force.
//!
//! Progress: while a copy runs, `transfer.progressed.v1` says how far it got, once a
//! second.
//!
//! Restarts: at start the mover folds its snapshot and the log after it for volumes
//! allocated and not yet staged, and for transfers already done; a copy that was under way is taken up under the same
//! transfer, continuing from the part it had fetched when the source is unchanged, and
//! a finished one is not repeated.

pub mod cache;
pub mod fetch;
pub mod gcs;
pub mod testkit;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use meridian_eventlog::aggregates::{self, ExecuteError};
use meridian_eventlog::snapshot::{self, Refresh, SAVE_AFTER};
use meridian_eventlog::{EventLog, LogError};
use meridian_events::aggregate::{
    Transfer, TransferCommand, Workflow, WorkflowCommand, WorkflowError,
};
use meridian_events::vocabulary::workflow::StorageClass;
use meridian_events::vocabulary::{Endpoint, Location};
use meridian_events::{AggregateKind, Event, EventContext, TransferEvent, WorkflowEvent};
use meridian_ops::{counted, trace};
use tokio::sync::watch;
use tracing::Instrument;
use uuid::Uuid;

/// One volume held at one site: (workflow, volume, site).
type Holding = (Uuid, String, String);

/// What the mover does for a holding: bring its ingress in, or copy its outputs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
enum Work {
    Stage,
    Export,
}

/// A transfer already in the log, by what it copies: (workflow, source, destination).
type TransferKey = (Uuid, Endpoint, Endpoint);

/// What the data mover folds from the log before it serves: the work open at start
/// and the transfers already in the log. Kept as its snapshot (one for every mover: it
/// does not depend on the sites a mover serves), so a restart folds only what came
/// after the last one.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct MoverStart {
    /// The last position folded in.
    pub position: u64,
    open: Vec<(Work, Holding)>,
    transfers: BTreeMap<Uuid, (TransferKey, bool)>,
    /// Commits read from the log (after the snapshot, if one was used).
    #[serde(skip)]
    pub read: u64,
}

/// The data mover's snapshot name and format: bump the format when what it folds changes.
pub const SNAPSHOT: &str = "datamover";
const SNAPSHOT_FORMAT: u32 = 1;

impl MoverStart {
    /// From the snapshot and the commits after it up to the log's head when it began
    /// (or the whole log); saves a new snapshot when it read `save_after` commits or
    /// more.
    pub async fn load(log: &dyn EventLog, save_after: u64) -> Result<MoverStart, MoverError> {
        let mut start = snapshot::load::<MoverStart>(log, SNAPSHOT, SNAPSHOT_FORMAT)
            .await?
            .map(|(_, start)| start)
            .unwrap_or_default();
        let read = snapshot::fold_to_head(log, start.position, 512, |commit| {
            for raw in commit.events.iter() {
                start.visit(commit.position, raw)?;
            }
            start.position = commit.position;
            Ok::<_, MoverError>(())
        })
        .await?;
        start.read += read;
        if start.read >= save_after {
            if let Err(e) =
                snapshot::save(log, SNAPSHOT, SNAPSHOT_FORMAT, start.position, &start).await
            {
                tracing::warn!(error = %e, "could not save the data mover's snapshot");
            }
        }
        Ok(start)
    }

    fn visit(
        &mut self,
        position: u64,
        raw: &meridian_events::RawEnvelope,
    ) -> Result<(), MoverError> {
        if !matches!(
            raw.aggregate.kind,
            AggregateKind::Workflow | AggregateKind::Transfer
        ) {
            return Ok(());
        }
        let e = decode(position, raw)?;
        let id = e.aggregate.id;
        match e.payload {
            Event::Workflow(WorkflowEvent::VolumeAllocated {
                volume,
                class: StorageClass::Volume,
                site,
                ..
            }) => self.open.push((Work::Stage, (id, volume, site))),
            Event::Workflow(WorkflowEvent::EgressDue { volumes }) => self.open.extend(
                volumes
                    .into_iter()
                    .map(|v| (Work::Export, (id, v.volume, v.site))),
            ),
            Event::Workflow(
                WorkflowEvent::VolumeStaged { volume, site, .. }
                | WorkflowEvent::VolumeStagingFailed { volume, site, .. },
            ) => self
                .open
                .retain(|w| *w != (Work::Stage, (id, volume.clone(), site.clone()))),
            Event::Workflow(
                WorkflowEvent::VolumeExported { volume, site, .. }
                | WorkflowEvent::VolumeExportFailed { volume, site, .. },
            ) => self
                .open
                .retain(|w| *w != (Work::Export, (id, volume.clone(), site.clone()))),
            Event::Workflow(WorkflowEvent::VolumeReleased { volume, site, .. }) => self
                .open
                .retain(|(_, h)| *h != (id, volume.clone(), site.clone())),
            Event::Workflow(WorkflowEvent::Finished { .. } | WorkflowEvent::Cancelled { .. }) => {
                self.open.retain(|(_, h)| h.0 != id)
            }
            // A failed workflow still copies out what is due (its outputs
            // are kept until then); it stages nothing more.
            Event::Workflow(WorkflowEvent::Failed { .. }) => self
                .open
                .retain(|(work, h)| h.0 != id || *work == Work::Export),
            Event::Transfer(TransferEvent::Requested {
                workflow_id,
                source,
                destination,
                ..
            }) => {
                self.transfers
                    .insert(id, ((workflow_id, source, destination), false));
            }
            Event::Transfer(TransferEvent::Completed { .. }) => {
                if let Some(t) = self.transfers.get_mut(&id) {
                    t.1 = true;
                }
            }
            Event::Transfer(TransferEvent::Failed { .. }) => {
                self.transfers.remove(&id);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The event of `raw`, read at log position `position`.
fn decode(
    position: u64,
    raw: &meridian_events::RawEnvelope,
) -> Result<meridian_events::Envelope<Event>, MoverError> {
    raw.decode_event().map_err(|e| MoverError::Decode {
        position,
        message: e.to_string(),
    })
}

#[derive(Debug, thiserror::Error)]
pub enum MoverError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("undecodable event at position {position}: {message}")]
    Decode { position: u64, message: String },
}

/// How often a step whose source did not answer is tried before it fails for good.
const TRIES: u32 = 3;

pub struct DataMover {
    log: Arc<dyn EventLog>,
    /// Each reachable site's volume root.
    roots: Arc<BTreeMap<String, PathBuf>>,
    reach: fetch::Reach,
    /// Named secrets a step may use (`credentials: NAME`): each a set of variables.
    secrets: Arc<BTreeMap<String, Arc<BTreeMap<String, String>>>>,
    /// Transfers found in the log at start: their id, and whether they completed.
    transfers: Arc<Mutex<HashMap<TransferKey, (Uuid, bool)>>>,
    /// Whether `transfers` was filled from the log (by the first `recover`).
    recovered: std::sync::atomic::AtomicBool,
    /// Holdings being staged or exported now.
    busy: Arc<Mutex<HashSet<(Work, Holding)>>>,
    /// Holdings whose data comes from another site once the jobs there are done: tried
    /// again when a job of their workflow settles.
    waiting: Arc<Mutex<HashSet<Holding>>>,
    retry_after: Duration,
    progress_every: Duration,
    /// The sites this mover answers for; `None`: every site (one mover for the whole
    /// deployment, as in `meridian up`).
    sites: Option<std::collections::BTreeSet<String>>,
}

impl DataMover {
    /// A mover that writes into the volumes of `roots` (site → volume root).
    pub fn new(log: Arc<dyn EventLog>, roots: BTreeMap<String, PathBuf>) -> DataMover {
        DataMover {
            log,
            roots: Arc::new(roots),
            reach: fetch::Reach::new(
                reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(30))
                    .build()
                    .unwrap_or_default(),
            ),
            secrets: Default::default(),
            transfers: Default::default(),
            recovered: Default::default(),
            busy: Default::default(),
            waiting: Default::default(),
            retry_after: Duration::from_secs(1),
            progress_every: Duration::from_secs(1),
            sites: None,
        }
    }

    /// Answers only for these sites (the site of an adapter process, which runs beside
    /// its storage); volumes elsewhere are another mover's.
    pub fn only(mut self, sites: impl IntoIterator<Item = String>) -> DataMover {
        self.sites = Some(sites.into_iter().collect());
        self
    }

    /// The durable subscription's name: one per mover.
    fn subscription(&self) -> String {
        match &self.sites {
            None => "datamover".into(),
            Some(sites) => {
                let names: Vec<&str> = sites.iter().map(String::as_str).collect();
                let clean: String = names
                    .join("-")
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                format!("datamover-{clean}")
            }
        }
    }

    /// The secrets a workflow's steps may name (`credentials: NAME`): for each name, the
    /// variables (`AWS_ACCESS_KEY_ID`, `GOOGLE_APPLICATION_CREDENTIALS`,
    /// `AZURE_STORAGE_ACCOUNT_KEY`, `HF_TOKEN`, …) that stand over the process
    /// environment for that step. Their values stay in this process.
    pub fn with_secrets(
        mut self,
        secrets: BTreeMap<String, BTreeMap<String, String>>,
    ) -> DataMover {
        self.secrets = Arc::new(
            secrets
                .into_iter()
                .map(|(name, vars)| (name, Arc::new(vars)))
                .collect(),
        );
        self
    }

    /// How long after a source did not answer it is asked again (doubling each time).
    pub fn with_retry_after(mut self, after: Duration) -> DataMover {
        self.retry_after = after;
        self
    }

    /// How often a copy under way records how far it has got (`transfer.progressed.v1`);
    /// every second by default.
    pub fn with_progress_every(mut self, every: Duration) -> DataMover {
        self.progress_every = every.max(Duration::from_millis(10));
        self
    }

    /// Runs until `shutdown` turns true. A log that does not answer is waited for, as
    /// the other services do: its work is found again in the log.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), MoverError> {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.serve(&mut shutdown).await {
                Err(MoverError::Log(e)) if e.is_transient() => {
                    tracing::warn!(error = %e, "log unavailable; the data mover retries");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.changed() => return Ok(()),
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    async fn serve(&self, shutdown: &mut watch::Receiver<bool>) -> Result<(), MoverError> {
        for (work, holding) in self.recover().await? {
            self.start(work, holding);
        }
        let mut sub = self.log.subscribe(&self.subscription()).await?;
        let mut snapshots = Refresh::every(SAVE_AFTER);
        // Moves are woken when a job of their workflow settles, and now and then in case
        // that came while they were being looked at.
        let mut sweep = tokio::time::interval(Duration::from_secs(5));
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = sweep.tick() => {
                    let waiting: Vec<Holding> =
                        self.waiting.lock().expect("waiting").drain().collect();
                    for holding in waiting {
                        self.start(Work::Stage, holding);
                    }
                }
                commits = sub.next_decoded(128, Duration::from_millis(200), &[AggregateKind::Workflow]) => {
                    let commits = commits?;
                    // A restart then folds at most about SAVE_AFTER commits past the snapshot.
                    let log = self.log.clone();
                    snapshots.delivered(commits.len() as u64, move || async move {
                        if let Err(e) = MoverStart::load(&*log, snapshot::REFRESH_SAVES).await {
                            tracing::warn!(error = %e, "could not fold the log for the data mover's snapshot");
                        }
                    });
                    for commit in commits {
                        for envelope in commit.events {
                            let id = envelope.aggregate.id;
                            match envelope.payload {
                                Event::Workflow(WorkflowEvent::VolumeAllocated {
                                    volume,
                                    class: StorageClass::Volume,
                                    site,
                                    ..
                                }) => self.start(Work::Stage, (id, volume, site)),
                                Event::Workflow(WorkflowEvent::EgressDue { volumes }) => {
                                    for v in volumes {
                                        self.start(Work::Export, (id, v.volume, v.site));
                                    }
                                }
                                // A job done may be the last one a move waits for.
                                Event::Workflow(WorkflowEvent::JobSettled { .. }) => {
                                    let woken: Vec<Holding> = {
                                        let mut waiting = self.waiting.lock().expect("waiting");
                                        let woken = waiting.iter().filter(|h| h.0 == id).cloned().collect();
                                        waiting.retain(|h| h.0 != id);
                                        woken
                                    };
                                    for holding in woken {
                                        self.start(Work::Stage, holding);
                                    }
                                }
                                _ => {}
                            }
                        }
                        sub.ack(commit.position).await?;
                    }
                }
                _ = shutdown.changed() => {
                    snapshots.finish(snapshot::FINISH_WITHIN).await;
                    return Ok(());
                }
            }
        }
    }

    /// The volumes allocated and not yet staged, failed or given back, those due to be
    /// copied out and not yet (from the mover's snapshot and the log after it), and the
    /// transfers the log already has.
    async fn recover(&self) -> Result<Vec<(Work, Holding)>, MoverError> {
        let start = MoverStart::load(&*self.log, SAVE_AFTER).await?;
        // Once: from then on this process's stagings record every transfer they make. A
        // second recover (serving again after the log was unavailable) would put back
        // the fold's older view of one that completed or failed while it read.
        if !self
            .recovered
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let mut known = self.transfers.lock().expect("transfers");
            for (id, (key, done)) in start.transfers {
                known.insert(key, (id, done));
            }
        }
        Ok(start.open)
    }

    /// Stages or exports `holding` in the background, unless that is under way already.
    fn start(&self, work: Work, holding: Holding) {
        if self.sites.as_ref().is_some_and(|s| !s.contains(&holding.2)) {
            return;
        }
        if !self
            .busy
            .lock()
            .expect("busy")
            .insert((work, holding.clone()))
        {
            return;
        }
        let job = Staging {
            log: self.log.clone(),
            roots: self.roots.clone(),
            reach: self.reach.clone(),
            secrets: self.secrets.clone(),
            transfers: self.transfers.clone(),
            retry_after: self.retry_after,
            progress_every: self.progress_every,
        };
        let busy = self.busy.clone();
        let waiting = self.waiting.clone();
        tokio::spawn(async move {
            let (workflow, volume, site) = &holding;
            // A log that does not answer is waited for; the copy starts again after it.
            let mut backoff = Duration::from_millis(200);
            loop {
                match job.carry_out(work, &holding).await {
                    Ok(Carried::Done) => break,
                    Ok(Carried::Waiting) => {
                        tracing::debug!(%workflow, volume, site, "waits for the jobs whose output it carries");
                        waiting.lock().expect("waiting").insert(holding.clone());
                        break;
                    }
                    Err(e) if e.is_transient() => {
                        tracing::warn!(%workflow, volume, site, error = %e, ?work, "log unavailable; trying again");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                    Err(e) => {
                        tracing::error!(%workflow, volume, site, error = %e, ?work, "stopped; it resumes when the data mover restarts");
                        break;
                    }
                }
            }
            busy.lock().expect("busy").remove(&(work, holding));
        });
    }
}

/// Whether a holding's work is done (or no longer wanted), or waits for the jobs whose
/// output a move between sites carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carried {
    Done,
    Waiting,
}

/// One copy of a holding's work.
#[derive(Debug, Clone)]
struct Step {
    /// What the copy reads: a URL, or a path in the volume for a copy out.
    copy_from: String,
    /// Where it goes: a path in the volume, or a URL for a copy out.
    copy_to: String,
    source: Endpoint,
    destination: Endpoint,
    from: Location,
    to: Location,
    tariff: Option<meridian_events::money::EgressTariff>,
    /// The boundary the bytes cross; `None` within a site.
    class: Option<meridian_events::money::Destination>,
    /// Kept in the site cache (ingress from a URL).
    cacheable: bool,
    /// The secret the step names for its credentials.
    credentials: Option<String>,
}

/// What one staging needs, apart from the mover.
struct Staging {
    log: Arc<dyn EventLog>,
    roots: Arc<BTreeMap<String, PathBuf>>,
    reach: fetch::Reach,
    secrets: Arc<BTreeMap<String, Arc<BTreeMap<String, String>>>>,
    transfers: Arc<Mutex<HashMap<TransferKey, (Uuid, bool)>>>,
    retry_after: Duration,
    progress_every: Duration,
}

impl Staging {
    /// Carries out every step of `work` for a volume at a site (its ingress, or its
    /// egress once due), then records it done; or records the step that failed, and why.
    async fn carry_out(&self, work: Work, holding: &Holding) -> Result<Carried, LogError> {
        let loaded = aggregates::load::<Workflow>(&*self.log, holding.0).await?;
        let traceparent = loaded.history.first().and_then(|e| e.traceparent.clone());
        let name = match work {
            Work::Stage => "stage data",
            Work::Export => "export data",
        };
        let span = trace::child_of(name, traceparent.as_deref());
        trace::mark_workflow(&span, holding.0);
        self.carry_out_loaded(work, holding, loaded, traceparent)
            .instrument(span)
            .await
    }

    async fn carry_out_loaded(
        &self,
        work: Work,
        (workflow_id, volume, site): &Holding,
        loaded: aggregates::Loaded<Workflow>,
        traceparent: Option<String>,
    ) -> Result<Carried, LogError> {
        let wf = &loaded.state;
        let wanted = match work {
            Work::Stage => {
                wf.state().is_some_and(|s| {
                    !s.is_terminal()
                        && s != meridian_events::aggregate::WorkflowState::CancelRequested
                }) && !wf.is_staged(volume, site)
            }
            Work::Export => wf
                .egress_due()
                .iter()
                .any(|v| v.volume == *volume && v.site == *site),
        };
        // A volume that comes from another site of a split workflow is copied from there
        // once the jobs that fill it are done, instead of taking its ingress.
        let moved = match work {
            Work::Stage => wf.volume_move(volume, site).cloned(),
            Work::Export => None,
        };
        if wanted && moved.as_ref().is_some_and(|m| !wf.move_ready(m)) {
            return Ok(Carried::Waiting);
        }
        let declared = wf
            .spec()
            .and_then(|s| s.volumes.get(volume))
            .map(|v| match work {
                Work::Stage => v.ingress.clone(),
                Work::Export => v.egress.clone(),
            })
            .unwrap_or_default();
        if !wanted || (declared.is_empty() && moved.is_none()) {
            return Ok(Carried::Done);
        }
        let tenant = loaded
            .history
            .first()
            .map_or_else(|| "default".to_string(), |e| e.tenant.clone());
        let ctx = EventContext {
            correlation_id: *workflow_id,
            traceparent: trace::traceparent_now(traceparent.as_deref()),
            ..EventContext::new_chain(tenant)
        };
        let done = async |outcome| {
            self.record(work, &ctx, *workflow_id, volume, site, outcome)
                .await
                .map(|()| Carried::Done)
        };
        let unreachable = |site: &str, verb: &str, what: &str| {
            format!(
                "the data mover cannot {verb} site {site}'s storage: {what} reaches only sites \
                 whose volumes its machine holds (the local site, and Slurm or PBS sites with \
                 a volume_root)"
            )
        };
        let Some(root) = self.roots.get(site) else {
            let (verb, what) = match work {
                Work::Stage => ("write to", "ingress"),
                Work::Export => ("read", "egress"),
            };
            return done(Err(unreachable(site, verb, what))).await;
        };
        let dir = meridian_adapter_core::volume_dir(root, *workflow_id, volume);
        let in_volume = |site: &str, path: &str| Endpoint::SitePath {
            site: site.to_string(),
            path: format!("{volume}:{path}"),
        };
        let at = |site: &str| Location::Site {
            site: site.to_string(),
        };
        let internet = Location::Region {
            region: "internet".into(),
        };
        // Data leaving a site is billed at its egress price in force now: to the internet
        // for a copy out, by destination class for a move between sites.
        let catalog = match (work, &moved) {
            (Work::Stage, None) => None,
            _ => Some(meridian_domain::Catalog::load(&*self.log).await?),
        };
        let class_between = |from: &str, to: &str| {
            let catalog = catalog.as_ref()?;
            Some(meridian_domain::placement::destination(
                catalog.find(from)?,
                catalog.find(to)?,
            ))
        };
        let tariff_from = |from: &str, to: Option<&str>| {
            let catalog = catalog.as_ref()?;
            let source = catalog.find(from)?;
            let prices = source.prices_at(Utc::now())?;
            Some(match to.and_then(|to| catalog.find(to)) {
                Some(to) => {
                    prices.egress_tariff_to(meridian_domain::placement::destination(source, to))
                }
                None => prices.egress_tariff(),
            })
        };
        let steps: Vec<Step> = match (&moved, work) {
            (Some(m), _) => {
                let Some(from_root) = self.roots.get(&m.from) else {
                    return done(Err(unreachable(&m.from, "read", "a move between sites"))).await;
                };
                let from_dir = meridian_adapter_core::volume_dir(from_root, *workflow_id, volume);
                vec![Step {
                    copy_from: format!("file://{}", from_dir.display()),
                    copy_to: "/".into(),
                    source: in_volume(&m.from, "/"),
                    destination: in_volume(site, "/"),
                    from: at(&m.from),
                    to: at(site),
                    tariff: tariff_from(&m.from, Some(site)),
                    class: class_between(&m.from, site),
                    cacheable: false,
                    credentials: None,
                }]
            }
            (None, Work::Stage) => declared
                .iter()
                .map(|step| Step {
                    copy_from: step.source.clone(),
                    copy_to: step.destination.clone(),
                    source: Endpoint::Uri {
                        uri: step.source.clone(),
                    },
                    destination: in_volume(site, &step.destination),
                    from: source_location(&step.source, site),
                    to: at(site),
                    tariff: None,
                    class: match step.source.starts_with("file://") {
                        true => None,
                        false => Some(meridian_events::money::Destination::Internet),
                    },
                    cacheable: true,
                    credentials: step.credentials.clone(),
                })
                .collect(),
            (None, Work::Export) => declared
                .iter()
                .map(|step| Step {
                    copy_from: step.source.clone(),
                    copy_to: step.destination.clone(),
                    source: in_volume(site, &step.source),
                    destination: Endpoint::Uri {
                        uri: step.destination.clone(),
                    },
                    from: at(site),
                    to: internet.clone(),
                    tariff: tariff_from(site, None),
                    class: Some(meridian_events::money::Destination::Internet),
                    cacheable: false,
                    credentials: step.credentials.clone(),
                })
                .collect(),
        };
        let mut transfers = Vec::new();
        for step in steps {
            let Step {
                source,
                destination,
                from,
                to,
                ..
            } = step.clone();
            let key = (*workflow_id, source.clone(), destination.clone());
            let known = self.transfers.lock().expect("transfers").get(&key).copied();
            let id = match known {
                Some((id, true)) => {
                    transfers.push(id);
                    continue;
                }
                Some((id, false)) => id,
                None => {
                    let id = Uuid::now_v7();
                    aggregates::execute::<Transfer, _>(&*self.log, id, &ctx, |_| {
                        TransferCommand::Request {
                            workflow_id: *workflow_id,
                            source: source.clone(),
                            destination: destination.clone(),
                            bytes_expected: None,
                        }
                    })
                    .await
                    .map_err(execute_failed)?;
                    self.transfers
                        .lock()
                        .expect("transfers")
                        .insert(key.clone(), (id, false));
                    id
                }
            };
            tracing::info!(workflow = %workflow_id, volume, site, ?work, source = step.copy_from, destination = step.copy_to, "copy started");
            let started_at = Utc::now();
            let copied = self
                .copy(
                    (work, step.cacheable, step.credentials.as_deref()),
                    (root, &dir),
                    (&step.copy_from, &step.copy_to),
                    id,
                    &ctx,
                )
                .await;
            match copied {
                Ok((copied, cached)) => {
                    // Bytes from the site's own cache came from the site.
                    let from = match cached {
                        true => Location::Site { site: site.clone() },
                        false => from.clone(),
                    };
                    aggregates::execute::<Transfer, _>(&*self.log, id, &ctx, |_| {
                        TransferCommand::Complete {
                            bytes: copied.bytes,
                            digest: copied.digest.clone(),
                            from: from.clone(),
                            to: to.clone(),
                            started_at,
                            ended_at: Utc::now().max(started_at),
                            egress: step.tariff.clone(),
                            cached,
                            // A copy from the site's own cache crossed nothing.
                            class: step.class.filter(|_| !cached),
                        }
                    })
                    .await
                    .map_err(execute_failed)?;
                    tracing::info!(workflow = %workflow_id, volume, site, ?work, bytes = copied.bytes, digest = copied.digest, cached, "copy done");
                    counted::count(
                        "meridian_transfer_bytes_total",
                        "Bytes the data mover copied, by site and direction (in: staged, out: exported).",
                        &[
                            ("site", site),
                            ("direction", match work {
                                Work::Stage => "in",
                                Work::Export => "out",
                            }),
                        ],
                        copied.bytes as f64,
                    );
                    self.transfers
                        .lock()
                        .expect("transfers")
                        .insert(key, (id, true));
                    transfers.push(id);
                }
                Err(e) => {
                    let reason = e.to_string();
                    tracing::warn!(workflow = %workflow_id, volume, site, ?work, %reason, "copy failed");
                    aggregates::execute::<Transfer, _>(&*self.log, id, &ctx, |_| {
                        TransferCommand::Fail {
                            reason: reason.clone(),
                        }
                    })
                    .await
                    .map_err(execute_failed)?;
                    self.transfers.lock().expect("transfers").remove(&key);
                    return done(Err(reason)).await;
                }
            }
        }
        done(Ok(transfers)).await
    }

    /// One step, with its progress recorded every `progress_every` while bytes move.
    /// Answers what was copied, and whether it came from the site's cache.
    async fn copy(
        &self,
        (work, cacheable, credentials): (Work, bool, Option<&str>),
        (root, dir): (&Path, &Path),
        (source, destination): (&str, &str),
        transfer: Uuid,
        ctx: &EventContext,
    ) -> Result<(fetch::Copied, bool), fetch::FetchError> {
        let progress = fetch::Progress::default();
        let step = self.copy_step(
            (work, cacheable, credentials),
            (root, dir),
            (source, destination),
            &progress,
        );
        tokio::pin!(step);
        let mut tick = tokio::time::interval(self.progress_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tick.tick().await;
        let mut reported = (0, None);
        loop {
            tokio::select! {
                done = &mut step => return done,
                _ = tick.tick() => {
                    let now = progress.now();
                    if now.0 == reported.0 {
                        continue;
                    }
                    reported = now;
                    let recorded = aggregates::execute::<Transfer, _>(&*self.log, transfer, ctx, |_| {
                        TransferCommand::Progress { bytes_done: now.0, bytes_total: now.1 }
                    })
                    .await;
                    if let Err(e) = recorded {
                        // Progress is for people watching; the copy goes on without it.
                        tracing::warn!(%transfer, error = %e, "progress not recorded");
                    }
                }
            }
        }
    }

    /// Ingress: from the site cache when it holds what the source holds now, else
    /// fetched and then kept in the cache. Egress: copied out. A far side that does not
    /// answer is asked again, [`TRIES`] times in all.
    async fn copy_step(
        &self,
        (work, cacheable, credentials): (Work, bool, Option<&str>),
        (root, dir): (&Path, &Path),
        (source, destination): (&str, &str),
        progress: &fetch::Progress,
    ) -> Result<(fetch::Copied, bool), fetch::FetchError> {
        let reach = match credentials {
            None => self.reach.clone(),
            Some(name) => match self.secrets.get(name) {
                Some(vars) => self.reach.with_secret(vars.clone()),
                None => {
                    return Err(fetch::FetchError::Invalid(format!(
                        "{source}: the step names the secret {name:?}, which is not in the \
                         data mover's secrets (--secrets FILE)"
                    )))
                }
            },
        };
        let cache = cache::SiteCache::at(root);
        let into_dir = destination.ends_with('/');
        let fingerprint = match work {
            Work::Stage if cacheable => match fetch::fingerprint(&reach, source).await {
                Ok(f) => f,
                Err(e) => {
                    // Fetched without the cache; the fetch says what is wrong, if anything.
                    tracing::warn!(source, error = %e, "its version could not be asked; not cached");
                    None
                }
            },
            _ => None,
        };
        if let Some(fingerprint) = &fingerprint {
            if let Some(entry) = cache.find(source, into_dir, fingerprint).await {
                let target = fetch::destination(dir, destination)?;
                match cache
                    .restore(source, into_dir, &entry, &target, progress)
                    .await
                {
                    Ok(copied) => return Ok((copied, true)),
                    Err(e) => {
                        tracing::warn!(source, error = %e, "the site cache's copy is unusable; fetching");
                        progress.restart();
                    }
                }
            }
        }
        let mut wait = self.retry_after;
        let mut tries = 0;
        let copied = loop {
            tries += 1;
            progress.restart();
            let copied = match work {
                Work::Stage => fetch::copy(&reach, source, dir, destination, progress).await,
                Work::Export => fetch::copy_out(&reach, dir, source, destination, progress).await,
            };
            match copied {
                Err(fetch::FetchError::Unreachable(why)) if tries < TRIES => {
                    tracing::warn!(source, destination, why, "no answer; trying again");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                other => break other?,
            }
        };
        if let Some(fingerprint) = &fingerprint {
            let target = fetch::destination(dir, destination)?;
            if let Err(e) = cache
                .keep(source, into_dir, fingerprint, &target, &copied)
                .await
            {
                tracing::warn!(source, error = %e, "not kept in the site cache");
            }
        }
        Ok((copied, false))
    }

    /// Records the volume staged or exported (with its transfers), or why it could not
    /// be. A workflow that moved on meanwhile (recorded already, volume given back,
    /// ended) refuses it, which is no error.
    async fn record(
        &self,
        work: Work,
        ctx: &EventContext,
        workflow_id: Uuid,
        volume: &str,
        site: &str,
        outcome: Result<Vec<Uuid>, String>,
    ) -> Result<(), LogError> {
        let (volume, site) = (volume.to_string(), site.to_string());
        let command = match (work, outcome) {
            (Work::Stage, Ok(transfers)) => WorkflowCommand::RecordVolumeStaged {
                volume,
                site,
                transfers,
            },
            (Work::Stage, Err(reason)) => WorkflowCommand::FailVolumeStaging {
                volume,
                site,
                reason,
            },
            (Work::Export, Ok(transfers)) => WorkflowCommand::RecordVolumeExported {
                volume,
                site,
                transfers,
            },
            (Work::Export, Err(reason)) => WorkflowCommand::FailVolumeExport {
                volume,
                site,
                reason,
            },
        };
        match aggregates::execute::<Workflow, _>(&*self.log, workflow_id, ctx, |_| command.clone())
            .await
        {
            Ok(_) => Ok(()),
            Err(ExecuteError::Log(e)) => Err(e),
            Err(ExecuteError::Rejected(
                e @ (WorkflowError::AlreadyStaged { .. }
                | WorkflowError::AlreadyExported { .. }
                | WorkflowError::NoEgressDue { .. }
                | WorkflowError::VolumeNotAllocated { .. }
                | WorkflowError::AlreadyCancelled
                | WorkflowError::AlreadyTerminal { .. }),
            )) => {
                tracing::debug!(workflow = %workflow_id, ?work, reason = %e, "no longer applies");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(workflow = %workflow_id, ?work, error = %e, "the workflow refused it");
                Ok(())
            }
        }
    }
}

/// Where an ingress source is, for the locality map: a path on this machine is at the
/// site; anything else comes from the internet.
fn source_location(source: &str, site: &str) -> Location {
    match source.starts_with("file://") {
        true => Location::Site {
            site: site.to_string(),
        },
        false => Location::Region {
            region: "internet".into(),
        },
    }
}

fn execute_failed<E: std::error::Error + 'static>(e: ExecuteError<E>) -> LogError {
    match e {
        ExecuteError::Log(e) => e,
        other => LogError::Corrupt {
            position: 0,
            message: format!("a transfer refused its own command: {other}"),
        },
    }
}
