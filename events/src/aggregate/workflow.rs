//! The Workflow aggregate: a submission's state machine and its DAG.
//!
//! Submitted → Placed → Running → Finished | Failed | Cancelled, with CancelRequested
//! between Running and Cancelled. Settling a job decides what follows: a site's fault
//! sends the task back to be released again (at most [`MAX_TASK_ATTEMPTS`] runs); any
//! other failure blocks the job's dependents, while independent work goes on; once
//! nothing runs and nothing more can, the workflow finishes or fails. A cancel request
//! releases nothing more and ends as Cancelled once the last running job settles.
//!
//! Services are nodes of the same DAG, with one run each. A service is released once the
//! jobs it requires succeeded and the services it requires are ready; jobs that require
//! it wait until it is ready. It runs while it is wanted: a service some job requires,
//! while such a job can still run; a service no job requires (an end product, such as
//! an inference server), until the workflow is cancelled or one of its jobs failed for
//! good. A service the router stopped because it was no longer wanted settles as a
//! success.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Aggregate;
use crate::envelope::AggregateKind;
use crate::money::{ComputeRate, Currency, Money, StorageRate};
use crate::vocabulary::workflow::{
    PlacementExplanation, SiteRejection, StorageClass, Verdict, VolumeAt, VolumeMove,
};
use crate::vocabulary::{ArrayBatch, JobOutcome, TaskRef, WorkflowEvent, MAX_ARRAY_BATCH};

/// How many times one task may run when its runs keep failing through the site's fault.
pub const MAX_TASK_ATTEMPTS: u32 = 3;

/// At most this many failed tasks are named in `workflow.failed.v1`; a failed array of a
/// million tasks must not make a million-entry event. The reason still gives the count.
pub const MAX_LISTED_FAILURES: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    Submitted,
    Placed,
    Running,
    CancelRequested,
    Finished,
    Failed,
    Cancelled,
}

impl WorkflowState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkflowState::Finished | WorkflowState::Failed | WorkflowState::Cancelled
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowState::Submitted => "submitted",
            WorkflowState::Placed => "placed",
            WorkflowState::Running => "running",
            WorkflowState::CancelRequested => "cancel_requested",
            WorkflowState::Finished => "finished",
            WorkflowState::Failed => "failed",
            WorkflowState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for WorkflowState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub enum WorkflowCommand {
    Submit {
        workflow_id: Uuid,
        spec: meridian_spec::Workflow,
        submitted_by: String,
        idempotency_key: Option<String>,
        /// The workflow whose job submitted this one, with its workflow credential.
        parent_workflow_id: Option<Uuid>,
    },
    /// The router's decision; the aggregate numbers the attempt.
    RecordPlacement {
        site: String,
        region: String,
        rate: ComputeRate,
        job_rates: BTreeMap<String, ComputeRate>,
        storage_rate: StorageRate,
        estimated_cost: Money,
        explanation: PlacementExplanation,
        /// Jobs placed away from `site` (a split workflow); empty: all run at `site`.
        job_sites: BTreeMap<String, String>,
        /// The storage rate at each of those other sites.
        storage_rates: BTreeMap<String, StorageRate>,
    },
    RejectPlacement {
        rejections: Vec<SiteRejection>,
    },
    /// The workflow cannot be placed yet and waits, for `reason`: no connected site fits
    /// (it waits for one of `sites` to connect), or its tenant is at its limit of
    /// concurrent workflows (`sites` empty). Repeating the reason it already waits for
    /// records nothing.
    WaitForSite {
        reason: String,
        sites: Vec<String>,
    },
    /// A runnable task is held back for `reason`; repeating the reason it is already held
    /// for records nothing.
    HoldRelease {
        job: String,
        reason: String,
    },
    /// A service's run answers at `address`; repeating it records nothing.
    RecordServiceReady {
        job_id: Uuid,
        address: String,
    },
    /// Gives a runnable task a Job aggregate, whose new id comes in here.
    ReleaseJob {
        job: String,
        index: Option<u32>,
        job_id: Uuid,
        site: String,
    },
    /// Gives runnable tasks of one array their Job aggregates at once (`tasks`: index
    /// and new job id, indices ascending), to go to `site` as one submission that runs
    /// at most `cap` of them at a time ([`Workflow::next_array_batch`] says which).
    ReleaseArray {
        job: String,
        tasks: Vec<(u32, Uuid)>,
        site: String,
        batch_id: Uuid,
        cap: u32,
    },
    /// Every ingress step of `volume` at `site` is done.
    RecordVolumeStaged {
        volume: String,
        site: String,
        transfers: Vec<Uuid>,
    },
    /// An ingress step of `volume` at `site` failed for good.
    FailVolumeStaging {
        volume: String,
        site: String,
        reason: String,
    },
    /// Every egress step of `volume` at `site` is done.
    RecordVolumeExported {
        volume: String,
        site: String,
        transfers: Vec<Uuid>,
    },
    /// An egress step of `volume` at `site` failed for good.
    FailVolumeExport {
        volume: String,
        site: String,
        reason: String,
    },
    /// Copies out again the outputs of `volume` kept after its egress failed (at every
    /// site that keeps them); the workflow stays as it ended.
    RetryExport {
        volume: String,
    },
    /// A released job's Job aggregate reached a terminal state.
    SettleJob {
        job_id: Uuid,
        outcome: JobOutcome,
    },
    RequestCancel {
        by: String,
        reason: Option<String>,
    },
    /// Gives up on a workflow with nothing running (e.g. no site will ever take it).
    Fail {
        reason: String,
    },
    RecordBill {
        totals: BTreeMap<Currency, Decimal>,
        as_of_position: u64,
    },
    /// Space set aside at a site: a volume of the spec, or a cache. Billed until released.
    AllocateVolume {
        volume: String,
        class: StorageClass,
        site: String,
        bytes: u64,
        rate: StorageRate,
        allocated_at: DateTime<Utc>,
    },
    /// Gives back the allocation of `volume` at `site`; allowed after the workflow ended
    /// (volumes outlive the last job by the stage-out).
    ReleaseVolume {
        volume: String,
        site: String,
        released_at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkflowError {
    #[error("the workflow was already submitted")]
    AlreadySubmitted,
    #[error("the workflow has not been submitted")]
    NotSubmitted,
    #[error("invalid workflow: {reason}")]
    InvalidSpec { reason: String },
    #[error("the workflow has not been placed yet")]
    NotPlaced,
    #[error("invalid placement: {reason}")]
    InvalidPlacement { reason: String },
    #[error("the workflow is cancelled or being cancelled")]
    AlreadyCancelled,
    #[error("the workflow is already {state}")]
    AlreadyTerminal { state: WorkflowState },
    #[error("the workflow has no job named {job:?}")]
    UnknownJob { job: String },
    #[error("{task} is not a task of this workflow: {reason}")]
    InvalidArrayIndex { task: TaskRef, reason: String },
    #[error("{task} cannot run now: {reason}")]
    JobNotRunnable { task: TaskRef, reason: String },
    #[error("volume {volume:?} at {site} is not due to be copied out")]
    NoEgressDue { volume: String, site: String },
    #[error("no outputs of volume {volume:?} are kept after a failed copy out")]
    NoOutputsKept { volume: String },
    #[error("volume {volume:?} at {site} was already copied out")]
    AlreadyExported { volume: String, site: String },
    #[error("volume {volume:?} declares no ingress, and no move brings it to that site")]
    NoIngress { volume: String },
    #[error("the ingress of volume {volume:?} at {site} was already recorded")]
    AlreadyStaged { volume: String, site: String },
    #[error("invalid array batch of {job:?}: {reason}")]
    InvalidArrayBatch { job: String, reason: String },
    #[error("job id {job_id} was already released")]
    DuplicateJobId { job_id: Uuid },
    #[error("job {job_id} is not a released, unsettled job of this workflow")]
    JobNotReleased { job_id: Uuid },
    #[error("{count} job(s) still running")]
    JobsStillRunning { count: usize },
    #[error("the workflow already has a place")]
    AlreadyPlaced,
    #[error("{job} is a job, not a service")]
    NotAService { job: String },
    #[error("a bill as of position {given} does not follow the last one, as of {last}")]
    StaleBill { last: u64, given: u64 },
    #[error("the workflow declares no volume named {volume:?}")]
    UnknownVolume { volume: String },
    #[error("invalid allocation of {volume:?}: {reason}")]
    InvalidAllocation { volume: String, reason: String },
    #[error("{volume:?} is already allocated at {site}")]
    VolumeAlreadyAllocated { volume: String, site: String },
    #[error("{volume:?} is not allocated at {site}")]
    VolumeNotAllocated { volume: String, site: String },
    #[error(
        "{volume:?} cannot be released at {released_at}, before its allocation at {allocated_at}"
    )]
    ReleaseBeforeAllocation {
        volume: String,
        allocated_at: DateTime<Utc>,
        released_at: DateTime<Utc>,
    },
}

/// Storage held for a workflow at a site, not yet released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeAllocation {
    pub volume: String,
    pub class: StorageClass,
    pub site: String,
    pub bytes: u64,
    pub rate: StorageRate,
    pub allocated_at: DateTime<Utc>,
}

/// The placement in force: where the workflow runs and at what prices.
#[derive(Debug, Clone, PartialEq)]
pub struct CurrentPlacement {
    pub attempt: u32,
    pub site: String,
    pub region: String,
    pub rate: ComputeRate,
    pub job_rates: BTreeMap<String, ComputeRate>,
    pub storage_rate: StorageRate,
    /// Jobs that run away from `site` (a split workflow).
    pub job_sites: BTreeMap<String, String>,
    pub storage_rates: BTreeMap<String, StorageRate>,
    /// Volumes copied from one site to another between jobs (the chosen split plan's).
    pub moves: Vec<VolumeMove>,
}

impl CurrentPlacement {
    /// The rate `job` is billed at.
    pub fn rate_for(&self, job: &str) -> &ComputeRate {
        self.job_rates.get(job).unwrap_or(&self.rate)
    }

    /// Where `job` runs.
    pub fn site_for(&self, job: &str) -> &str {
        self.job_sites.get(job).unwrap_or(&self.site)
    }

    /// The storage rate at `site`, when the placement uses it.
    pub fn storage_rate_at(&self, site: &str) -> Option<&StorageRate> {
        if site == self.site {
            Some(&self.storage_rate)
        } else {
            self.storage_rates.get(site)
        }
    }

    /// Every site the placement uses: `site` first, then the others by name.
    pub fn sites(&self) -> Vec<&str> {
        let mut out = vec![self.site.as_str()];
        for s in self.job_sites.values() {
            if !out.contains(&s.as_str()) {
                out.push(s);
            }
        }
        out[1..].sort_unstable();
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ArrayShape {
    start: u32,
    end: u32,
    parallelism: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskStatus {
    /// Waiting to be released again after a site's fault.
    Pending,
    Released(Uuid),
    Succeeded,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TaskRecord {
    status: TaskStatus,
    /// Runs released so far.
    attempts: u32,
}

/// The numbers of one job that decide what can run next; small and `Copy`, so a command
/// can weigh "what if" without cloning the workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    tasks: u32,
    /// Tasks allowed in flight at once: the array's parallelism, 1 for a plain job.
    cap: u32,
    succeeded: u32,
    in_flight: u32,
    /// Never released, or back after a site's fault.
    pending: u32,
}

impl Counts {
    fn all_succeeded(&self) -> bool {
        self.succeeded == self.tasks
    }

    fn free_slots(&self) -> u32 {
        self.cap.saturating_sub(self.in_flight)
    }
}

/// One job of the DAG. Tasks absent from `tasks` have never been released.
#[derive(Debug, Clone)]
struct JobNode {
    /// The jobs and services it requires.
    requires: Vec<String>,
    /// A service, run until it is no longer wanted, rather than a job run to its end.
    service: bool,
    /// A service's run that said it is ready (and has not ended since).
    ready: Option<Uuid>,
    array: Option<ArrayShape>,
    tasks: BTreeMap<Option<u32>, TaskRecord>,
    counts: Counts,
    /// Every array index below this one is released or settled for good, so the search
    /// for pending tasks starts here rather than at the array's start.
    /// Wide, so stepping past an array that ends at `u32::MAX` cannot overflow.
    low_water: u64,
}

impl JobNode {
    fn new(requires: Vec<String>, array: Option<ArrayShape>, service: bool) -> JobNode {
        let tasks = array.map_or(1, |a| (a.end - a.start).saturating_add(1));
        JobNode {
            requires,
            service,
            ready: None,
            array,
            tasks: BTreeMap::new(),
            counts: Counts {
                tasks,
                // A cap of 0 would deadlock; treat it as 1.
                cap: array.map_or(1, |a| a.parallelism.max(1)),
                succeeded: 0,
                in_flight: 0,
                pending: tasks,
            },
            low_water: array.map_or(0, |a| u64::from(a.start)),
        }
    }

    fn is_pending(&self, index: Option<u32>) -> bool {
        self.tasks
            .get(&index)
            .is_none_or(|t| t.status == TaskStatus::Pending)
    }

    /// Pending tasks, lowest index first.
    fn pending_tasks(&self) -> Box<dyn Iterator<Item = Option<u32>> + '_> {
        match self.array {
            Some(a) => Box::new(
                (self.low_water..=u64::from(a.end))
                    .map(|i| Some(i as u32))
                    .filter(|i| self.is_pending(*i)),
            ),
            None => Box::new(std::iter::once(None).filter(|i| self.is_pending(*i))),
        }
    }

    fn advance_low_water(&mut self) {
        if let Some(a) = self.array {
            while self.low_water <= u64::from(a.end)
                && !self.is_pending(Some(self.low_water as u32))
            {
                self.low_water += 1;
            }
        }
    }
}

/// What a settled run makes of its task.
fn settled_status(outcome: &JobOutcome, retry: bool) -> TaskStatus {
    match (outcome, retry) {
        (_, true) => TaskStatus::Pending,
        (JobOutcome::Succeeded, false) => TaskStatus::Succeeded,
        (JobOutcome::Failed { .. }, false) => TaskStatus::Failed,
        (JobOutcome::Cancelled, false) => TaskStatus::Cancelled,
    }
}

/// A cancel the workflow asked for is not a failure; a job cancelled from outside
/// blocks its dependents like one.
fn is_failure(status: TaskStatus, state: Option<WorkflowState>) -> bool {
    match status {
        TaskStatus::Failed => true,
        TaskStatus::Cancelled => state != Some(WorkflowState::CancelRequested),
        _ => false,
    }
}

#[derive(Debug, Clone, Default)]
pub struct Workflow {
    id: Option<Uuid>,
    state: Option<WorkflowState>,
    spec: Option<meridian_spec::Workflow>,
    submitted_by: String,
    /// The workflow whose job submitted this one.
    parent: Option<Uuid>,
    nodes: BTreeMap<String, JobNode>,
    /// The last placement attempt, decided or rejected.
    placement_attempts: u32,
    placement: Option<CurrentPlacement>,
    /// Released, unsettled jobs by Job aggregate id.
    running: BTreeMap<Uuid, TaskRef>,
    released_ids: BTreeSet<Uuid>,
    /// Tasks that failed (or were cancelled from outside), in settle order.
    failed: Vec<TaskRef>,
    billed_as_of: Option<u64>,
    /// Live storage allocations by (volume, site).
    volumes: BTreeMap<(String, String), VolumeAllocation>,
    /// Why placement waits, while it waits for a site to connect.
    waiting: Option<String>,
    /// Why a runnable task is held back, until the next release.
    held: Option<String>,
    /// Volumes whose ingress is done, by (volume, site).
    staged: BTreeSet<(String, String)>,
    /// Volumes whose ingress failed for good, by (volume, site), and why.
    staging_failed: BTreeMap<(String, String), String>,
    /// The volumes to copy out, once every job was done; empty before.
    egress_due: Vec<VolumeAt>,
    /// Volumes copied out, by (volume, site).
    exported: BTreeSet<(String, String)>,
    /// Volumes whose egress failed, by (volume, site), and why: their outputs are kept
    /// at the site until a retry copies them out or an admin releases them.
    export_failed: BTreeMap<(String, String), String>,
}

/// Why a step's data is not at its site yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataWait {
    /// The ingress of `volume` at `site` is not done yet.
    Staging { volume: String, site: String },
    /// The ingress of `volume` at `site` failed, for `reason`.
    Failed {
        volume: String,
        site: String,
        reason: String,
    },
}

impl fmt::Display for DataWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataWait::Staging { volume, site } => {
                write!(
                    f,
                    "waiting for the data of volume {volume} to arrive at {site}"
                )
            }
            DataWait::Failed {
                volume,
                site,
                reason,
            } => write!(
                f,
                "the data of volume {volume} could not be brought to {site}: {reason}"
            ),
        }
    }
}

impl Workflow {
    pub fn id(&self) -> Option<Uuid> {
        self.id
    }

    /// `None` before submission.
    pub fn state(&self) -> Option<WorkflowState> {
        self.state
    }

    pub fn spec(&self) -> Option<&meridian_spec::Workflow> {
        self.spec.as_ref()
    }

    pub fn submitted_by(&self) -> &str {
        &self.submitted_by
    }

    /// The workflow whose job submitted this one, if a job did.
    pub fn parent(&self) -> Option<Uuid> {
        self.parent
    }

    pub fn placement(&self) -> Option<&CurrentPlacement> {
        self.placement.as_ref()
    }

    pub fn placement_attempts(&self) -> u32 {
        self.placement_attempts
    }

    /// Whether the data `step` mounts is at the site it runs at: every volume it mounts
    /// that declares ingress is staged there. The first thing it still waits for, if any.
    pub fn data_wait(&self, step: &str) -> Option<DataWait> {
        let (spec, placement) = (self.spec.as_ref()?, self.placement.as_ref()?);
        let site = placement.site_for(step);
        for volume in spec.mounts_of(step) {
            if spec
                .volumes
                .get(volume)
                .is_none_or(|v| v.ingress.is_empty())
                && self.volume_move(volume, site).is_none()
            {
                continue;
            }
            let key = (volume.to_string(), site.to_string());
            if let Some(reason) = self.staging_failed.get(&key) {
                return Some(DataWait::Failed {
                    volume: key.0,
                    site: key.1,
                    reason: reason.clone(),
                });
            }
            if !self.staged.contains(&key) {
                return Some(DataWait::Staging {
                    volume: key.0,
                    site: key.1,
                });
            }
        }
        None
    }

    /// A step that could start but for its data, and what it waits for: the reason to
    /// show while the data mover works.
    pub fn waiting_for_data(&self) -> Option<(String, DataWait)> {
        if !matches!(
            self.state,
            Some(WorkflowState::Placed | WorkflowState::Running)
        ) {
            return None;
        }
        let counts = self.counts();
        self.nodes.iter().find_map(|(name, node)| {
            let c = counts[name.as_str()];
            let ready = c.pending > 0
                && c.free_slots() > 0
                && node.requires.iter().all(|r| self.met(&counts, r, None));
            match self.data_wait(name) {
                Some(wait @ DataWait::Staging { .. }) if ready => Some((name.clone(), wait)),
                _ => None,
            }
        })
    }

    /// The volumes held with egress steps not yet copied out, in order.
    pub fn egress_pending(&self) -> Vec<VolumeAt> {
        let Some(spec) = &self.spec else {
            return Vec::new();
        };
        let moves = self.placement.as_ref().map(|p| &p.moves[..]).unwrap_or(&[]);
        self.volumes
            .keys()
            .filter(|(volume, _)| {
                spec.volumes
                    .get(volume)
                    .is_some_and(|v| !v.egress.is_empty())
            })
            // A volume that moved on from a site goes out from where it ended.
            .filter(|(volume, site)| !moves.iter().any(|m| m.volume == *volume && m.from == *site))
            .filter(|key| !self.exported.contains(*key))
            .map(|(volume, site)| VolumeAt {
                volume: volume.clone(),
                site: site.clone(),
            })
            .collect()
    }

    /// The volumes due to be copied out now (every job done), not yet exported.
    pub fn egress_due(&self) -> Vec<VolumeAt> {
        self.egress_due
            .iter()
            .filter(|v| !self.exported.contains(&(v.volume.clone(), v.site.clone())))
            .cloned()
            .collect()
    }

    /// The copy that brings `volume` to `site` from another site in a split workflow,
    /// if one does: the data there is what the jobs before it left at the other site,
    /// not the volume's ingress.
    pub fn volume_move(&self, volume: &str, site: &str) -> Option<&VolumeMove> {
        self.placement
            .as_ref()?
            .moves
            .iter()
            .find(|m| m.volume == volume && m.to == site)
    }

    /// Whether the jobs whose output `a_move` carries are done: every job at its source
    /// site that mounts the volume and that the job it is for requires (directly or
    /// not) has succeeded.
    pub fn move_ready(&self, a_move: &VolumeMove) -> bool {
        let (Some(spec), Some(placement)) = (&self.spec, &self.placement) else {
            return false;
        };
        let counts = self.counts();
        let mut seen = std::collections::BTreeSet::new();
        let mut stack: Vec<&str> = self
            .nodes
            .get(&a_move.before_job)
            .map(|n| n.requires.iter().map(String::as_str).collect())
            .unwrap_or_default();
        while let Some(name) = stack.pop() {
            if !seen.insert(name) {
                continue;
            }
            let Some(node) = self.nodes.get(name) else {
                continue;
            };
            stack.extend(node.requires.iter().map(String::as_str));
            let produces = placement.site_for(name) == a_move.from
                && spec.mounts_of(name).any(|v| v == a_move.volume);
            if produces && !node.service && !counts[name].all_succeeded() {
                return false;
            }
        }
        true
    }

    /// Outputs kept at their site after their copy out failed, still held there: a
    /// retry ([`WorkflowCommand::RetryExport`]) or an admin's release ends that.
    pub fn outputs_kept(&self) -> Vec<VolumeAt> {
        self.export_failed
            .keys()
            .filter(|key| self.volumes.contains_key(*key))
            .map(|(volume, site)| VolumeAt {
                volume: volume.clone(),
                site: site.clone(),
            })
            .collect()
    }

    /// Volumes a failed workflow must keep holding: outputs kept after a failed copy
    /// out, and those due to be copied out and not yet. Other ends keep nothing.
    pub fn volumes_to_keep(&self) -> Vec<VolumeAt> {
        if self.state != Some(WorkflowState::Failed) {
            return Vec::new();
        }
        let mut keep = self.outputs_kept();
        keep.extend(self.egress_due());
        keep
    }

    /// Volumes with egress steps, not due yet, whose every step (jobs only: a service
    /// runs on) has succeeded by `counts`: nothing will write to them any more.
    fn outputs_ready(&self, counts: &BTreeMap<&str, Counts>) -> Vec<VolumeAt> {
        let Some(spec) = &self.spec else {
            return Vec::new();
        };
        self.egress_pending()
            .into_iter()
            .filter(|v| !self.egress_due.contains(v))
            .filter(|v| {
                self.nodes.iter().all(|(name, node)| {
                    !spec.mounts_of(name).any(|m| m == v.volume)
                        || (!node.service
                            && counts.get(name.as_str()).is_some_and(Counts::all_succeeded))
                })
            })
            .collect()
    }

    /// Whether `volume`'s ingress at `site` is done.
    pub fn is_staged(&self, volume: &str, site: &str) -> bool {
        self.staged
            .contains(&(volume.to_string(), site.to_string()))
    }

    /// Released jobs not yet settled, by Job aggregate id: what a cancel must reach.
    pub fn running_jobs(&self) -> &BTreeMap<Uuid, TaskRef> {
        &self.running
    }

    pub fn failed_jobs(&self) -> &[TaskRef] {
        &self.failed
    }

    /// Why the workflow waits for a site to connect, while it does.
    pub fn waiting_reason(&self) -> Option<&str> {
        self.waiting.as_deref()
    }

    /// The run of service `name` that said it is ready, while it runs.
    pub fn ready_run(&self, name: &str) -> Option<Uuid> {
        self.nodes.get(name).and_then(|n| n.ready)
    }

    /// Whether `name` is a service of this workflow.
    pub fn is_service(&self, name: &str) -> bool {
        self.nodes.get(name).is_some_and(|n| n.service)
    }

    /// Running service runs that are no longer wanted: the router stops them.
    pub fn unwanted_services(&self) -> Vec<Uuid> {
        if self.state == Some(WorkflowState::CancelRequested) {
            return Vec::new(); // the cancel reaches every run anyway
        }
        let counts = self.counts();
        let doomed = self.doomed(&counts);
        self.running
            .iter()
            .filter(|(_, task)| {
                self.nodes
                    .get(&task.job)
                    .is_some_and(|n| n.service && !self.wanted(&counts, &task.job, &doomed))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Nodes that can never succeed, given these counts: a task failed for good, or a
    /// node they require can never succeed.
    fn doomed(&self, counts: &BTreeMap<&str, Counts>) -> BTreeSet<&str> {
        let mut doomed: BTreeSet<&str> = self
            .nodes
            .iter()
            .filter(|(name, _)| {
                let c = counts[name.as_str()];
                (!c.all_succeeded() && c.pending == 0 && c.in_flight == 0)
                    || (c.in_flight == 0
                        && matches!(self.data_wait(name), Some(DataWait::Failed { .. })))
            })
            .map(|(name, _)| name.as_str())
            .collect();
        loop {
            let more: Vec<&str> = self
                .nodes
                .iter()
                .filter(|(name, n)| {
                    !doomed.contains(name.as_str())
                        && n.requires.iter().any(|r| doomed.contains(r.as_str()))
                })
                .map(|(name, _)| name.as_str())
                .collect();
            if more.is_empty() {
                return doomed;
            }
            doomed.extend(more);
        }
    }

    /// Whether service `name` should run: some node that requires it can still run, or,
    /// when nothing requires it, no job failed for good.
    fn wanted(&self, counts: &BTreeMap<&str, Counts>, name: &str, doomed: &BTreeSet<&str>) -> bool {
        let mut dependents = self
            .nodes
            .iter()
            .filter(|(_, n)| n.requires.iter().any(|r| r == name))
            .peekable();
        if dependents.peek().is_none() {
            return !self
                .nodes
                .iter()
                .any(|(n, node)| !node.service && doomed.contains(n.as_str()));
        }
        dependents.any(|(dependent, n)| {
            let c = counts[dependent.as_str()];
            !doomed.contains(dependent.as_str())
                && (c.in_flight > 0 || c.pending > 0)
                && (!n.service || self.wanted(counts, dependent, doomed))
        })
    }

    pub fn billed_as_of(&self) -> Option<u64> {
        self.billed_as_of
    }

    /// Storage allocated and not released yet, by volume then site: what must be
    /// released once the workflow is done with it.
    pub fn allocated_volumes(&self) -> impl Iterator<Item = &VolumeAllocation> {
        self.volumes.values()
    }

    /// Tasks that may be released now: their required jobs all succeeded, they have not
    /// run (or go again after a site's fault), and their array is under its cap. Lowest
    /// indices first; empty unless the workflow is placed and not being cancelled.
    pub fn runnable_jobs(&self) -> Vec<TaskRef> {
        if !matches!(
            self.state,
            Some(WorkflowState::Placed | WorkflowState::Running)
        ) {
            return Vec::new();
        }
        let counts = self.counts();
        let mut out = Vec::new();
        for (name, node) in &self.nodes {
            if self.releasable(&counts, name, None) {
                let slots = counts[name.as_str()].free_slots() as usize;
                out.extend(
                    node.pending_tasks()
                        .take(slots)
                        .map(|i| TaskRef::new(name.clone(), i)),
                );
            }
        }
        out
    }

    fn counts(&self) -> BTreeMap<&str, Counts> {
        self.nodes
            .iter()
            .map(|(name, node)| (name.as_str(), node.counts))
            .collect()
    }

    /// Whether some task of `job` could be released, given these counts; `ended` is a
    /// service whose run is being settled (it is ready no more).
    fn releasable(&self, counts: &BTreeMap<&str, Counts>, job: &str, ended: Option<&str>) -> bool {
        let c = &counts[job];
        let node = &self.nodes[job];
        c.pending > 0
            && c.free_slots() > 0
            && node.requires.iter().all(|r| self.met(counts, r, ended))
            && self.data_wait(job).is_none()
            && (!node.service || self.wanted(counts, job, &self.doomed(counts)))
    }

    /// Whether requirement `r` holds: a job all of whose tasks succeeded, a service ready
    /// (and not `ended`).
    fn met(&self, counts: &BTreeMap<&str, Counts>, r: &str, ended: Option<&str>) -> bool {
        match self.nodes.get(r) {
            Some(n) if n.service => n.ready.is_some() && ended != Some(r),
            Some(_) => counts.get(r).is_some_and(Counts::all_succeeded),
            None => false,
        }
    }

    fn live_state(&self) -> Result<WorkflowState, WorkflowError> {
        match self.state {
            None => Err(WorkflowError::NotSubmitted),
            Some(WorkflowState::Cancelled) => Err(WorkflowError::AlreadyCancelled),
            Some(state) if state.is_terminal() => Err(WorkflowError::AlreadyTerminal { state }),
            Some(state) => Ok(state),
        }
    }

    /// Like `live_state`, and refuses a workflow being cancelled too.
    fn active_state(&self) -> Result<WorkflowState, WorkflowError> {
        match self.live_state()? {
            WorkflowState::CancelRequested => Err(WorkflowError::AlreadyCancelled),
            state => Ok(state),
        }
    }

    /// What ends the workflow in the state described, if anything does: the state,
    /// running jobs, per-job counts and failures (the recorded ones and a new one) as
    /// they will be once the events being decided are applied.
    fn conclusion(
        &self,
        state: WorkflowState,
        running: usize,
        counts: &BTreeMap<&str, Counts>,
        new_failure: Option<&TaskRef>,
        now: DateTime<Utc>,
        ended: Option<&str>,
    ) -> Option<WorkflowEvent> {
        if state.is_terminal() || state == WorkflowState::Submitted || running > 0 {
            return None;
        }
        if state == WorkflowState::CancelRequested {
            return Some(WorkflowEvent::Cancelled { cancelled_at: now });
        }
        // A service nothing wants any more, with nothing in flight, is done with.
        let doomed = self.doomed(counts);
        let done = |name: &str, c: &Counts| {
            c.all_succeeded()
                || (self.nodes[name].service
                    && c.in_flight == 0
                    && !self.wanted(counts, name, &doomed))
        };
        if counts.iter().all(|(name, c)| done(name, c)) {
            // A copy out that failed while jobs still ran fails the workflow now.
            if let Some(((volume, site), reason)) = self.export_failed.iter().next() {
                return Some(WorkflowEvent::Failed {
                    reason: export_failure(volume, site, reason),
                    failed_jobs: self.failed.clone(),
                    failed_at: now,
                });
            }
            // Outputs are copied out first; the workflow finishes once they are.
            let pending = self.egress_pending();
            if pending.is_empty() {
                return Some(WorkflowEvent::Finished { finished_at: now });
            }
            let not_due: Vec<VolumeAt> = pending
                .into_iter()
                .filter(|v| !self.egress_due.contains(v))
                .collect();
            return match not_due.is_empty() {
                true => None,
                false => Some(WorkflowEvent::EgressDue {
                    volumes: self.egress_due.iter().cloned().chain(not_due).collect(),
                }),
            };
        }
        // A job that could go but for data on its way (ingress, a move between sites)
        // goes once it arrives.
        let awaits_data = |job: &str| {
            let c = &counts[job];
            c.pending > 0
                && c.free_slots() > 0
                && self.nodes[job]
                    .requires
                    .iter()
                    .all(|r| self.met(counts, r, ended))
                && matches!(self.data_wait(job), Some(DataWait::Staging { .. }))
        };
        if counts
            .keys()
            .any(|job| self.releasable(counts, job, ended) || awaits_data(job))
        {
            return None;
        }
        let failed = self.failed.iter().chain(new_failure);
        let total = self.failed.len() + usize::from(new_failure.is_some());
        let data = self
            .staging_failed
            .iter()
            .next()
            .map(|((volume, site), reason)| {
                DataWait::Failed {
                    volume: volume.clone(),
                    site: site.clone(),
                    reason: reason.clone(),
                }
                .to_string()
            });
        let reason = match (failed.clone().next(), total, data) {
            (None, _, Some(data)) => data,
            (None, _, None) => "no job can run".to_owned(),
            (Some(one), 1, _) => format!("{one} failed"),
            (Some(first), n, _) => format!("{first} and {} other task(s) failed", n - 1),
        };
        Some(WorkflowEvent::Failed {
            reason,
            failed_jobs: failed.take(MAX_LISTED_FAILURES).cloned().collect(),
            failed_at: now,
        })
    }

    fn submit(
        &self,
        workflow_id: Uuid,
        spec: meridian_spec::Workflow,
        submitted_by: String,
        idempotency_key: Option<String>,
        parent_workflow_id: Option<Uuid>,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        if self.state.is_some() {
            return Err(WorkflowError::AlreadySubmitted);
        }
        check_dag(&spec).map_err(|reason| WorkflowError::InvalidSpec { reason })?;
        Ok(vec![WorkflowEvent::Submitted {
            workflow_id,
            name: spec.name.clone(),
            spec,
            submitted_by,
            idempotency_key,
            parent_workflow_id,
        }])
    }

    fn release(
        &self,
        job: String,
        index: Option<u32>,
        job_id: Uuid,
        site: String,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        let node = self.placed_node(&job)?;
        let task = TaskRef::new(job, index);
        match (node.array, index) {
            (None, None) => {}
            (Some(a), Some(i)) if (a.start..=a.end).contains(&i) => {}
            (Some(a), _) => {
                return Err(WorkflowError::InvalidArrayIndex {
                    reason: format!("expected an index in {}..={}", a.start, a.end),
                    task,
                })
            }
            (None, Some(_)) => {
                return Err(WorkflowError::InvalidArrayIndex {
                    reason: "the job is not an array".to_owned(),
                    task,
                })
            }
        }
        if self.released_ids.contains(&job_id) {
            return Err(WorkflowError::DuplicateJobId { job_id });
        }
        self.check_runnable(node, &task)?;
        if node.counts.free_slots() == 0 {
            return Err(WorkflowError::JobNotRunnable {
                reason: format!(
                    "its array already has {} task(s) in flight, its parallelism cap",
                    node.counts.cap
                ),
                task,
            });
        }
        let attempt = node.tasks.get(&index).map_or(0, |t| t.attempts) + 1;
        Ok(vec![WorkflowEvent::JobReleased {
            job: task.job,
            index,
            job_id,
            site,
            attempt,
            batch: None,
        }])
    }

    /// The node of `job`, in a workflow placed and not ending.
    fn placed_node(&self, job: &str) -> Result<&JobNode, WorkflowError> {
        if self.active_state()? == WorkflowState::Submitted {
            return Err(WorkflowError::NotPlaced);
        }
        self.nodes
            .get(job)
            .ok_or_else(|| WorkflowError::UnknownJob {
                job: job.to_string(),
            })
    }

    /// `event`, and what ends the workflow once it is applied, if anything does.
    fn and_conclusion(
        &self,
        state: WorkflowState,
        event: WorkflowEvent,
        now: DateTime<Utc>,
    ) -> Vec<WorkflowEvent> {
        let mut next = self.clone();
        next.apply(&event);
        let end = next.conclusion(state, next.running.len(), &next.counts(), None, now, None);
        [event].into_iter().chain(end).collect()
    }

    /// Why `task` of `node` may not be released now, whatever its array's cap: what it
    /// requires does not hold, nothing wants the service, or it was released already.
    fn check_runnable(&self, node: &JobNode, task: &TaskRef) -> Result<(), WorkflowError> {
        let not_runnable = |reason: String| WorkflowError::JobNotRunnable {
            task: task.clone(),
            reason,
        };
        let counts = self.counts();
        if let Some(r) = node.requires.iter().find(|r| !self.met(&counts, r, None)) {
            let what = if self.is_service(r) {
                "is not ready"
            } else {
                "has not succeeded"
            };
            return Err(not_runnable(format!("it requires {r:?}, which {what}")));
        }
        if node.service && !self.wanted(&counts, &task.job, &self.doomed(&counts)) {
            return Err(not_runnable("nothing needs the service any more".into()));
        }
        if !node.is_pending(task.index) {
            return Err(not_runnable("it was already released".to_owned()));
        }
        if let Some(wait) = self.data_wait(&task.job) {
            return Err(not_runnable(wait.to_string()));
        }
        Ok(())
    }

    /// Records that `volume` at `site` was copied out, or (with `failure`) that it could
    /// not be: the workflow finishes once every due volume is out, and fails at once on
    /// a failure.
    fn export(
        &self,
        volume: String,
        site: String,
        transfers: Vec<Uuid>,
        failure: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        // A workflow that failed may still copy out what was due (a retry, or a copy
        // that was under way when it failed); it stays failed.
        let ended = self.state == Some(WorkflowState::Failed);
        let state = match ended {
            true => WorkflowState::Failed,
            false => self.active_state()?,
        };
        let due = VolumeAt {
            volume: volume.clone(),
            site: site.clone(),
        };
        if !self.egress_due.contains(&due) {
            return Err(WorkflowError::NoEgressDue { volume, site });
        }
        if self.exported.contains(&(volume.clone(), site.clone())) {
            return Err(WorkflowError::AlreadyExported { volume, site });
        }
        if ended {
            return Ok(vec![match failure {
                Some(reason) => WorkflowEvent::VolumeExportFailed {
                    volume,
                    site,
                    reason,
                },
                None => WorkflowEvent::VolumeExported {
                    volume,
                    site,
                    transfers,
                },
            }]);
        }
        // Jobs still to run or running (a volume copied out as soon as the last job
        // that mounts it ended): they carry on, and the workflow fails when they end.
        let jobs_left = !self.running.is_empty() || self.counts().values().any(|c| c.pending > 0);
        match failure {
            Some(reason) if jobs_left => Ok(vec![WorkflowEvent::VolumeExportFailed {
                volume,
                site,
                reason,
            }]),
            Some(reason) => Ok(vec![
                WorkflowEvent::VolumeExportFailed {
                    volume: volume.clone(),
                    site: site.clone(),
                    reason: reason.clone(),
                },
                WorkflowEvent::Failed {
                    reason: export_failure(&volume, &site, &reason),
                    failed_jobs: self.failed.clone(),
                    failed_at: now,
                },
            ]),
            None => Ok(self.and_conclusion(
                state,
                WorkflowEvent::VolumeExported {
                    volume,
                    site,
                    transfers,
                },
                now,
            )),
        }
    }

    /// Records that `volume`'s ingress at `site` is done, or (with `failure`) that it
    /// failed for good; a failure ends the workflow once nothing else can run.
    fn stage(
        &self,
        volume: String,
        site: String,
        transfers: Vec<Uuid>,
        failure: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        let state = self.active_state()?;
        let spec = self.spec.as_ref().ok_or(WorkflowError::NotSubmitted)?;
        if spec
            .volumes
            .get(&volume)
            .is_none_or(|v| v.ingress.is_empty())
            && self.volume_move(&volume, &site).is_none()
        {
            return Err(WorkflowError::NoIngress { volume });
        }
        let key = (volume.clone(), site.clone());
        if !self.volumes.contains_key(&key) {
            return Err(WorkflowError::VolumeNotAllocated { volume, site });
        }
        if self.staged.contains(&key) || self.staging_failed.contains_key(&key) {
            return Err(WorkflowError::AlreadyStaged { volume, site });
        }
        let event = match failure {
            None => WorkflowEvent::VolumeStaged {
                volume,
                site,
                transfers,
            },
            Some(reason) => WorkflowEvent::VolumeStagingFailed {
                volume,
                site,
                reason,
            },
        };
        Ok(self.and_conclusion(state, event, now))
    }

    /// The next tasks of `job`'s array to release as one submission of at most `max`
    /// (lowest indices first), and the cap the site is to hold them to: the array's free
    /// slots. `None` when nothing of it may go now, or when it should wait for a batch
    /// that can run at the array's full cap (or hold every task still pending): a batch
    /// capped lower would keep that lower cap to its end.
    ///
    /// The cap holds across batches: a batch is capped at the slots free when it goes
    /// and counts all its tasks in flight until they settle, so the tasks running from
    /// every batch never exceed the array's parallelism.
    pub fn next_array_batch(&self, job: &str, max: u32) -> Option<(Vec<u32>, u32)> {
        if !matches!(
            self.state,
            Some(WorkflowState::Placed | WorkflowState::Running)
        ) {
            return None;
        }
        let node = self.nodes.get(job)?;
        node.array?;
        let counts = self.counts();
        if !self.releasable(&counts, job, None) {
            return None;
        }
        let c = node.counts;
        let free = c.free_slots();
        if free < c.cap.min(c.pending) {
            return None;
        }
        let max = max.clamp(1, MAX_ARRAY_BATCH) as usize;
        let indices: Vec<u32> = node.pending_tasks().take(max).flatten().collect();
        let cap = free.min(indices.len() as u32);
        (!indices.is_empty()).then_some((indices, cap))
    }

    fn release_array(
        &self,
        job: String,
        tasks: Vec<(u32, Uuid)>,
        site: String,
        batch_id: Uuid,
        cap: u32,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        let node = self.placed_node(&job)?;
        let invalid = |reason: String| WorkflowError::InvalidArrayBatch {
            job: job.clone(),
            reason,
        };
        let Some(array) = node.array else {
            return Err(invalid("the job is not an array".into()));
        };
        let size = u32::try_from(tasks.len()).unwrap_or(u32::MAX);
        if size == 0 || size > MAX_ARRAY_BATCH {
            return Err(invalid(format!(
                "a batch holds 1 to {MAX_ARRAY_BATCH} tasks, not {}",
                tasks.len()
            )));
        }
        if tasks.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(invalid("indices must ascend, each once".into()));
        }
        if let Some((i, _)) = tasks
            .iter()
            .find(|(i, _)| !(array.start..=array.end).contains(i))
        {
            return Err(WorkflowError::InvalidArrayIndex {
                task: TaskRef::new(job.clone(), Some(*i)),
                reason: format!("expected an index in {}..={}", array.start, array.end),
            });
        }
        let mut ids = BTreeSet::new();
        for (_, job_id) in &tasks {
            if self.released_ids.contains(job_id) || !ids.insert(*job_id) || *job_id == batch_id {
                return Err(WorkflowError::DuplicateJobId { job_id: *job_id });
            }
        }
        for (i, _) in &tasks {
            self.check_runnable(node, &TaskRef::new(job.clone(), Some(*i)))?;
        }
        let free = node.counts.free_slots();
        if cap == 0 || cap > free || cap > size {
            return Err(invalid(format!(
                "its cap must be 1 to {}, the array's free slots or the batch's size; got {cap}",
                free.min(size)
            )));
        }
        Ok(tasks
            .into_iter()
            .enumerate()
            .map(|(position, (index, job_id))| WorkflowEvent::JobReleased {
                job: job.clone(),
                index: Some(index),
                job_id,
                site: site.clone(),
                attempt: node.tasks.get(&Some(index)).map_or(0, |t| t.attempts) + 1,
                batch: Some(ArrayBatch {
                    id: batch_id,
                    position: position as u32,
                    size,
                    cap,
                }),
            })
            .collect())
    }

    fn allocate_volume(
        &self,
        allocation: VolumeAllocation,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        if self.active_state()? == WorkflowState::Submitted {
            return Err(WorkflowError::NotPlaced);
        }
        let volume = allocation.volume.clone();
        let invalid = |reason: &str| WorkflowError::InvalidAllocation {
            volume: volume.clone(),
            reason: reason.to_owned(),
        };
        if volume.is_empty() {
            return Err(invalid("a volume needs a name"));
        }
        if allocation.site.is_empty() {
            return Err(invalid("a site is required"));
        }
        if allocation.bytes == 0 {
            return Err(invalid("an allocation holds at least one byte"));
        }
        if allocation.rate.per_gib_hour.is_sign_negative() {
            return Err(invalid("the storage price is negative"));
        }
        let declared = self
            .spec
            .as_ref()
            .is_some_and(|s| s.volumes.contains_key(&volume));
        if allocation.class == StorageClass::Volume && !declared {
            return Err(WorkflowError::UnknownVolume { volume });
        }
        if self
            .volumes
            .contains_key(&(volume.clone(), allocation.site.clone()))
        {
            return Err(WorkflowError::VolumeAlreadyAllocated {
                volume,
                site: allocation.site,
            });
        }
        Ok(vec![WorkflowEvent::VolumeAllocated {
            volume: allocation.volume,
            class: allocation.class,
            site: allocation.site,
            bytes: allocation.bytes,
            rate: allocation.rate,
            allocated_at: allocation.allocated_at,
        }])
    }

    fn release_volume(
        &self,
        volume: String,
        site: String,
        released_at: DateTime<Utc>,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        if self.state.is_none() {
            return Err(WorkflowError::NotSubmitted);
        }
        let Some(a) = self.volumes.get(&(volume.clone(), site.clone())) else {
            return Err(WorkflowError::VolumeNotAllocated { volume, site });
        };
        if released_at < a.allocated_at {
            return Err(WorkflowError::ReleaseBeforeAllocation {
                volume,
                allocated_at: a.allocated_at,
                released_at,
            });
        }
        Ok(vec![WorkflowEvent::VolumeReleased {
            volume: a.volume.clone(),
            class: a.class,
            site: a.site.clone(),
            bytes: a.bytes,
            rate: a.rate.clone(),
            allocated_at: a.allocated_at,
            released_at,
        }])
    }

    fn settle(
        &self,
        job_id: Uuid,
        outcome: JobOutcome,
        now: DateTime<Utc>,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        let state = self.live_state()?;
        let task = self
            .running
            .get(&job_id)
            .ok_or(WorkflowError::JobNotReleased { job_id })?;
        let attempts = self.nodes[&task.job].tasks[&task.index].attempts;
        let node = &self.nodes[&task.job];
        let now_counts = self.counts();
        // A service that nothing wants any more did its work, however its run ended
        // (stopped, lost after the stop, exited). One that ends while jobs still need it
        // failed them.
        let unwanted =
            node.service && !self.wanted(&now_counts, &task.job, &self.doomed(&now_counts));
        let required = node.service && self.nodes.values().any(|n| n.requires.contains(&task.job));
        let outcome = match outcome {
            _ if unwanted => JobOutcome::Succeeded,
            JobOutcome::Succeeded if required => JobOutcome::Failed {
                reason: crate::vocabulary::FailureReason::Other {
                    message: "the service ended while jobs still needed it".into(),
                },
            },
            other => other,
        };
        let retry = match &outcome {
            JobOutcome::Failed { reason } => {
                reason.is_site_fault()
                    && attempts < MAX_TASK_ATTEMPTS
                    && state != WorkflowState::CancelRequested
            }
            JobOutcome::Succeeded | JobOutcome::Cancelled => false,
        };
        // The counts and failures as they will be once the settlement is applied.
        let status = settled_status(&outcome, retry);
        let mut counts = self.counts();
        let c = counts
            .get_mut(task.job.as_str())
            .expect("released jobs exist");
        c.in_flight -= 1;
        match status {
            TaskStatus::Succeeded => c.succeeded += 1,
            TaskStatus::Pending => c.pending += 1,
            _ => {}
        }
        let new_failure = is_failure(status, self.state).then_some(task);
        let ended = node.service.then_some(task.job.as_str());
        let conclusion = self.conclusion(
            state,
            self.running.len() - 1,
            &counts,
            new_failure,
            now,
            ended,
        );

        // A volume whose every step has succeeded goes out now, while other jobs run on.
        let early = match (&conclusion, status, state) {
            (None, TaskStatus::Succeeded, WorkflowState::Placed | WorkflowState::Running) => {
                self.outputs_ready(&counts)
            }
            _ => Vec::new(),
        };
        let mut events = vec![WorkflowEvent::JobSettled {
            job: task.job.clone(),
            index: task.index,
            job_id,
            outcome,
            retry,
        }];
        events.extend(conclusion);
        if !early.is_empty() {
            events.push(WorkflowEvent::EgressDue {
                volumes: self.egress_due.iter().cloned().chain(early).collect(),
            });
        }
        Ok(events)
    }
}

/// Why a workflow failed when its outputs could not be copied out.
fn export_failure(volume: &str, site: &str, reason: &str) -> String {
    format!(
        "the outputs in volume {volume} could not be copied out of {site}: {reason} (they are \
         kept there until a retry copies them out or an admin releases them)"
    )
}

/// Rejects `requires` naming nothing, cycles among jobs, and empty arrays: a DAG the
/// aggregate could never finish.
fn check_dag(spec: &meridian_spec::Workflow) -> Result<(), String> {
    for (name, job) in &spec.jobs {
        for r in &job.requires {
            if !spec.jobs.contains_key(r) && !spec.services.contains_key(r) {
                return Err(format!(
                    "jobs.{name}.requires: no job or service named {r:?}"
                ));
            }
        }
        if let Some(a) = &job.array {
            if a.start > a.end {
                return Err(format!(
                    "jobs.{name}.array: start {} is after end {}",
                    a.start, a.end
                ));
            }
        }
    }
    for (name, service) in &spec.services {
        if spec.jobs.contains_key(name) {
            return Err(format!(
                "services.{name}: a job has the same name; names are shared"
            ));
        }
        for r in &service.requires {
            if !spec.jobs.contains_key(r) && !spec.services.contains_key(r) {
                return Err(format!(
                    "services.{name}.requires: no job or service named {r:?}"
                ));
            }
        }
    }
    // Kahn's algorithm over jobs and services together.
    let nodes: BTreeMap<&str, &[String]> = spec
        .jobs
        .iter()
        .map(|(n, j)| (n.as_str(), j.requires.as_slice()))
        .chain(
            spec.services
                .iter()
                .map(|(n, s)| (n.as_str(), s.requires.as_slice())),
        )
        .collect();
    let mut waiting: BTreeMap<&str, usize> = nodes
        .iter()
        .map(|(n, requires)| (*n, requires.len()))
        .collect();
    let mut ready: Vec<&str> = waiting
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(n, _)| *n)
        .collect();
    let mut done = 0;
    while let Some(n) = ready.pop() {
        done += 1;
        for (m, requires) in &nodes {
            for _ in requires.iter().filter(|r| *r == n) {
                let d = waiting.get_mut(m).expect("every node is counted");
                *d -= 1;
                if *d == 0 {
                    ready.push(m);
                }
            }
        }
    }
    if done < nodes.len() {
        let stuck: Vec<&str> = waiting
            .iter()
            .filter(|(_, d)| **d > 0)
            .map(|(n, _)| *n)
            .collect();
        return Err(format!(
            "jobs {} require each other in a cycle",
            stuck.join(", ")
        ));
    }
    Ok(())
}

impl Aggregate for Workflow {
    const KIND: AggregateKind = AggregateKind::Workflow;
    type Command = WorkflowCommand;
    type Event = WorkflowEvent;
    type Error = WorkflowError;

    fn handle(
        &self,
        cmd: WorkflowCommand,
        now: DateTime<Utc>,
    ) -> Result<Vec<WorkflowEvent>, WorkflowError> {
        match cmd {
            WorkflowCommand::Submit {
                workflow_id,
                spec,
                submitted_by,
                idempotency_key,
                parent_workflow_id,
            } => self.submit(
                workflow_id,
                spec,
                submitted_by,
                idempotency_key,
                parent_workflow_id,
            ),

            WorkflowCommand::RecordPlacement {
                site,
                region,
                rate,
                job_rates,
                storage_rate,
                estimated_cost,
                explanation,
                job_sites,
                storage_rates,
            } => {
                let state = self.active_state()?;
                let chosen: Vec<&str> = explanation
                    .candidates
                    .iter()
                    .filter(|c| c.verdict == Verdict::Chosen)
                    .map(|c| c.site.as_str())
                    .collect();
                if !(chosen.is_empty() || chosen == [site.as_str()]) {
                    return Err(WorkflowError::InvalidPlacement {
                        reason: format!("placed at {site:?} but the explanation chose {chosen:?}"),
                    });
                }
                let split_chosen = explanation
                    .split
                    .as_ref()
                    .is_some_and(|p| p.verdict == Verdict::Chosen);
                if split_chosen && !chosen.is_empty() {
                    return Err(WorkflowError::InvalidPlacement {
                        reason: "the explanation chose both one site and a split".into(),
                    });
                }
                if !job_sites.is_empty() && !split_chosen {
                    return Err(WorkflowError::InvalidPlacement {
                        reason: "jobs placed at several sites without a chosen split plan".into(),
                    });
                }
                if let Some(plan) = explanation.split.as_ref().filter(|_| split_chosen) {
                    if job_sites.is_empty() {
                        return Err(WorkflowError::InvalidPlacement {
                            reason: "a chosen split plan places every job at one site".into(),
                        });
                    }
                    if plan.jobs.first().map(|j| &j.site) != Some(&site) {
                        return Err(WorkflowError::InvalidPlacement {
                            reason: format!(
                                "placed at {site:?} but the split plan's first job runs elsewhere"
                            ),
                        });
                    }
                    if let Some(j) = plan
                        .jobs
                        .iter()
                        .find(|j| job_sites.get(&j.job).unwrap_or(&site) != &j.site)
                    {
                        return Err(WorkflowError::InvalidPlacement {
                            reason: format!(
                                "job {} runs at {:?} in the split plan but not in job_sites",
                                j.job, j.site
                            ),
                        });
                    }
                }
                if let Some(job) = job_sites.keys().find(|j| !job_rates.contains_key(*j)) {
                    return Err(WorkflowError::InvalidPlacement {
                        reason: format!(
                            "job {job} runs away from {site:?} without a rate of its own"
                        ),
                    });
                }
                if let Some(at) = job_sites
                    .values()
                    .find(|s| **s != site && !storage_rates.contains_key(*s))
                {
                    return Err(WorkflowError::InvalidPlacement {
                        reason: format!("no storage rate for site {at:?}, where jobs run"),
                    });
                }
                if let Some((at, _)) = storage_rates
                    .iter()
                    .find(|(_, r)| r.currency != storage_rate.currency)
                {
                    return Err(WorkflowError::InvalidPlacement {
                        reason: format!(
                            "the storage rate at {at:?} is not in {}, the placement's currency",
                            storage_rate.currency
                        ),
                    });
                }
                if let Some(job) = job_rates
                    .keys()
                    .chain(job_sites.keys())
                    .find(|j| !self.nodes.contains_key(*j))
                {
                    return Err(WorkflowError::UnknownJob { job: job.clone() });
                }
                let next_state = match state {
                    WorkflowState::Submitted => WorkflowState::Placed,
                    other => other,
                };
                // A workflow without jobs is done as soon as it has a place.
                let conclusion = self.conclusion(
                    next_state,
                    self.running.len(),
                    &self.counts(),
                    None,
                    now,
                    None,
                );
                let mut events = vec![WorkflowEvent::PlacementDecided {
                    attempt: self.placement_attempts + 1,
                    site,
                    region,
                    rate,
                    job_rates,
                    storage_rate,
                    estimated_cost,
                    explanation,
                    job_sites,
                    storage_rates,
                }];
                events.extend(conclusion);
                Ok(events)
            }

            WorkflowCommand::RejectPlacement { rejections } => {
                self.active_state()?;
                Ok(vec![WorkflowEvent::PlacementRejected {
                    attempt: self.placement_attempts + 1,
                    rejections,
                }])
            }

            WorkflowCommand::WaitForSite { reason, sites } => {
                if self.active_state()? != WorkflowState::Submitted {
                    return Err(WorkflowError::AlreadyPlaced);
                }
                if self.waiting.as_deref() == Some(reason.as_str()) {
                    return Ok(Vec::new());
                }
                Ok(vec![WorkflowEvent::PlacementWaiting {
                    reason,
                    sites,
                    since: now,
                }])
            }

            WorkflowCommand::HoldRelease { job, reason } => {
                self.live_state()?;
                if self.held.as_deref() == Some(reason.as_str()) {
                    return Ok(Vec::new());
                }
                Ok(vec![WorkflowEvent::ReleaseHeld {
                    job,
                    reason,
                    since: now,
                }])
            }

            WorkflowCommand::RecordServiceReady { job_id, address } => {
                self.live_state()?;
                let task = self
                    .running
                    .get(&job_id)
                    .ok_or(WorkflowError::JobNotReleased { job_id })?;
                let node = &self.nodes[&task.job];
                if !node.service {
                    return Err(WorkflowError::NotAService {
                        job: task.job.clone(),
                    });
                }
                if node.ready == Some(job_id) {
                    return Ok(Vec::new());
                }
                Ok(vec![WorkflowEvent::ServiceReady {
                    service: task.job.clone(),
                    job_id,
                    address,
                }])
            }

            WorkflowCommand::ReleaseJob {
                job,
                index,
                job_id,
                site,
            } => self.release(job, index, job_id, site),

            WorkflowCommand::ReleaseArray {
                job,
                tasks,
                site,
                batch_id,
                cap,
            } => self.release_array(job, tasks, site, batch_id, cap),

            WorkflowCommand::RecordVolumeStaged {
                volume,
                site,
                transfers,
            } => self.stage(volume, site, transfers, None, now),
            WorkflowCommand::FailVolumeStaging {
                volume,
                site,
                reason,
            } => self.stage(volume, site, Vec::new(), Some(reason), now),

            WorkflowCommand::RecordVolumeExported {
                volume,
                site,
                transfers,
            } => self.export(volume, site, transfers, None, now),
            WorkflowCommand::FailVolumeExport {
                volume,
                site,
                reason,
            } => self.export(volume, site, Vec::new(), Some(reason), now),

            WorkflowCommand::RetryExport { volume } => {
                let volumes: Vec<VolumeAt> = self
                    .outputs_kept()
                    .into_iter()
                    .filter(|v| v.volume == volume)
                    .collect();
                if volumes.is_empty() || self.state != Some(WorkflowState::Failed) {
                    return Err(WorkflowError::NoOutputsKept { volume });
                }
                Ok(vec![WorkflowEvent::EgressDue { volumes }])
            }

            WorkflowCommand::SettleJob { job_id, outcome } => self.settle(job_id, outcome, now),

            WorkflowCommand::RequestCancel { by, reason } => {
                self.active_state()?;
                let mut events = vec![WorkflowEvent::CancelRequested {
                    by,
                    reason,
                    requested_at: now,
                }];
                if self.running.is_empty() {
                    events.push(WorkflowEvent::Cancelled { cancelled_at: now });
                }
                Ok(events)
            }

            WorkflowCommand::Fail { reason } => {
                self.live_state()?;
                if !self.running.is_empty() {
                    return Err(WorkflowError::JobsStillRunning {
                        count: self.running.len(),
                    });
                }
                Ok(vec![WorkflowEvent::Failed {
                    reason,
                    failed_jobs: self.failed.clone(),
                    failed_at: now,
                }])
            }

            WorkflowCommand::RecordBill {
                totals,
                as_of_position,
            } => {
                if self.state.is_none() {
                    return Err(WorkflowError::NotSubmitted);
                }
                if let Some(last) = self.billed_as_of {
                    if as_of_position <= last {
                        return Err(WorkflowError::StaleBill {
                            last,
                            given: as_of_position,
                        });
                    }
                }
                Ok(vec![WorkflowEvent::Billed {
                    totals,
                    as_of_position,
                }])
            }

            WorkflowCommand::AllocateVolume {
                volume,
                class,
                site,
                bytes,
                rate,
                allocated_at,
            } => self.allocate_volume(VolumeAllocation {
                volume,
                class,
                site,
                bytes,
                rate,
                allocated_at,
            }),

            WorkflowCommand::ReleaseVolume {
                volume,
                site,
                released_at,
            } => self.release_volume(volume, site, released_at),
        }
    }

    fn apply(&mut self, event: &WorkflowEvent) {
        match event {
            WorkflowEvent::Submitted {
                workflow_id,
                spec,
                submitted_by,
                parent_workflow_id,
                ..
            } => {
                self.id = Some(*workflow_id);
                self.parent = *parent_workflow_id;
                self.state = Some(WorkflowState::Submitted);
                self.submitted_by = submitted_by.clone();
                let known =
                    |r: &&String| spec.jobs.contains_key(*r) || spec.services.contains_key(*r);
                self.nodes = spec
                    .jobs
                    .iter()
                    .map(|(name, job)| {
                        let requires = job.requires.iter().filter(known).cloned().collect();
                        let array = job.array.as_ref().map(|a| ArrayShape {
                            start: a.start,
                            end: a.end,
                            parallelism: a.parallelism,
                        });
                        (name.clone(), JobNode::new(requires, array, false))
                    })
                    .collect();
                for (name, service) in &spec.services {
                    let requires = service.requires.iter().filter(known).cloned().collect();
                    self.nodes
                        .entry(name.clone())
                        .or_insert_with(|| JobNode::new(requires, None, true));
                }
                self.spec = Some(spec.clone());
            }
            WorkflowEvent::PlacementDecided {
                attempt,
                site,
                region,
                rate,
                job_rates,
                storage_rate,
                job_sites,
                storage_rates,
                explanation,
                ..
            } => {
                self.placement_attempts = *attempt;
                let moves = match &explanation.split {
                    Some(plan) if !job_sites.is_empty() => plan.moves.clone(),
                    _ => Vec::new(),
                };
                self.placement = Some(CurrentPlacement {
                    attempt: *attempt,
                    site: site.clone(),
                    region: region.clone(),
                    rate: rate.clone(),
                    job_rates: job_rates.clone(),
                    storage_rate: storage_rate.clone(),
                    job_sites: job_sites.clone(),
                    storage_rates: storage_rates.clone(),
                    moves,
                });
                if self.state == Some(WorkflowState::Submitted) {
                    self.state = Some(WorkflowState::Placed);
                }
                self.waiting = None;
            }
            WorkflowEvent::PlacementRejected { attempt, .. } => {
                self.placement_attempts = *attempt;
            }
            WorkflowEvent::PlacementWaiting { reason, .. } => {
                self.waiting = Some(reason.clone());
            }
            WorkflowEvent::ReleaseHeld { reason, .. } => {
                self.held = Some(reason.clone());
            }
            WorkflowEvent::ServiceReady {
                service, job_id, ..
            } => {
                if self.running.contains_key(job_id) {
                    if let Some(node) = self.nodes.get_mut(service) {
                        node.ready = Some(*job_id);
                    }
                }
            }
            WorkflowEvent::JobReleased {
                job,
                index,
                job_id,
                attempt,
                ..
            } => {
                self.held = None;
                if let Some(node) = self.nodes.get_mut(job) {
                    let was_pending = node.is_pending(*index);
                    node.tasks.insert(
                        *index,
                        TaskRecord {
                            status: TaskStatus::Released(*job_id),
                            attempts: *attempt,
                        },
                    );
                    node.counts.in_flight += 1;
                    if was_pending {
                        node.counts.pending -= 1;
                    }
                    node.advance_low_water();
                }
                self.running
                    .insert(*job_id, TaskRef::new(job.clone(), *index));
                self.released_ids.insert(*job_id);
                if self.state == Some(WorkflowState::Placed) {
                    self.state = Some(WorkflowState::Running);
                }
            }
            WorkflowEvent::JobSettled {
                job,
                index,
                job_id,
                outcome,
                retry,
            } => {
                self.running.remove(job_id);
                let Some(node) = self.nodes.get_mut(job) else {
                    return;
                };
                if node.ready == Some(*job_id) {
                    node.ready = None;
                }
                let Some(task) = node.tasks.get_mut(index) else {
                    return;
                };
                if task.status != TaskStatus::Released(*job_id) {
                    return;
                }
                task.status = settled_status(outcome, *retry);
                node.counts.in_flight = node.counts.in_flight.saturating_sub(1);
                match task.status {
                    TaskStatus::Succeeded => node.counts.succeeded += 1,
                    TaskStatus::Pending => {
                        node.counts.pending += 1;
                        if let Some(i) = index {
                            node.low_water = node.low_water.min(u64::from(*i));
                        }
                    }
                    _ => {}
                }
                if is_failure(task.status, self.state) {
                    self.failed.push(TaskRef::new(job.clone(), *index));
                }
            }
            WorkflowEvent::CancelRequested { .. } => {
                self.state = Some(WorkflowState::CancelRequested);
            }
            WorkflowEvent::Finished { .. } => self.state = Some(WorkflowState::Finished),
            WorkflowEvent::Failed { .. } => self.state = Some(WorkflowState::Failed),
            WorkflowEvent::Cancelled { .. } => self.state = Some(WorkflowState::Cancelled),
            WorkflowEvent::Billed { as_of_position, .. } => {
                self.billed_as_of = Some(*as_of_position);
            }
            WorkflowEvent::VolumeAllocated {
                volume,
                class,
                site,
                bytes,
                rate,
                allocated_at,
            } => {
                self.volumes.insert(
                    (volume.clone(), site.clone()),
                    VolumeAllocation {
                        volume: volume.clone(),
                        class: *class,
                        site: site.clone(),
                        bytes: *bytes,
                        rate: rate.clone(),
                        allocated_at: *allocated_at,
                    },
                );
            }
            WorkflowEvent::VolumeReleased { volume, site, .. } => {
                let key = (volume.clone(), site.clone());
                self.volumes.remove(&key);
                // Its data went with it.
                self.staged.remove(&key);
                self.export_failed.remove(&key);
            }
            WorkflowEvent::VolumeStaged { volume, site, .. } => {
                self.staged.insert((volume.clone(), site.clone()));
            }
            WorkflowEvent::EgressDue { volumes } => {
                // Due again (a retry): no longer failed.
                for v in volumes {
                    self.export_failed
                        .remove(&(v.volume.clone(), v.site.clone()));
                }
                self.egress_due = volumes.clone();
            }
            WorkflowEvent::VolumeExported { volume, site, .. } => {
                self.exported.insert((volume.clone(), site.clone()));
            }
            WorkflowEvent::VolumeExportFailed {
                volume,
                site,
                reason,
            } => {
                self.export_failed
                    .insert((volume.clone(), site.clone()), reason.clone());
            }
            WorkflowEvent::VolumeStagingFailed {
                volume,
                site,
                reason,
            } => {
                self.staging_failed
                    .insert((volume.clone(), site.clone()), reason.clone());
            }
        }
    }
}
