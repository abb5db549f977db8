//! Events of the Workflow aggregate: a submission's life from intake to its bill.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{ArrayBatch, JobOutcome, TaskRef};
use crate::money::{ComputeRate, Currency, Money, MoneyError, StorageRate};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum WorkflowEvent {
    /// A researcher submitted a valid workflow.
    #[serde(rename = "workflow.submitted.v1")]
    Submitted {
        workflow_id: Uuid,
        name: String,
        spec: meridian_spec::Workflow,
        /// The principal who submitted it (a user or an agent's name).
        submitted_by: String,
        /// The client's key, so a retried submission is recognised.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
        /// The workflow whose job submitted this one, with its workflow credential.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_workflow_id: Option<Uuid>,
    },

    /// The router chose a site, with the prices in force and why.
    #[serde(rename = "workflow.placement_decided.v1")]
    PlacementDecided {
        /// 1 for the first placement; each re-placement counts up.
        attempt: u32,
        site: String,
        region: String,
        /// The compute rate in force at the decision, for jobs not in `job_rates`.
        rate: ComputeRate,
        /// Per-job rates where jobs need different offerings (a GPU instance type for
        /// `train`, a small one for `prep`).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        job_rates: BTreeMap<String, ComputeRate>,
        storage_rate: StorageRate,
        estimated_cost: Money,
        explanation: PlacementExplanation,
        /// Where each job runs when the workflow is split across sites (`placement.split`);
        /// a job not named here runs at `site`.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        job_sites: BTreeMap<String, String>,
        /// The storage price in force at each other site a split workflow uses, for the
        /// volumes held there.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        storage_rates: BTreeMap<String, StorageRate>,
    },

    /// No site could take the workflow this time.
    #[serde(rename = "workflow.placement_rejected.v1")]
    PlacementRejected {
        attempt: u32,
        rejections: Vec<SiteRejection>,
    },

    /// The DAG made a job (or array task) runnable and gave it a Job aggregate.
    /// The workflow cannot be placed yet and waits for `reason`: no connected site fits
    /// though some would (`sites`: the fitting sites no adapter serves), or its tenant
    /// is at its limit of concurrent workflows (`sites` empty).
    #[serde(rename = "workflow.placement_waiting.v1")]
    PlacementWaiting {
        reason: String,
        sites: Vec<String>,
        since: DateTime<Utc>,
    },

    /// A runnable task is not released yet, for `reason` (its tenant is at its limit of
    /// concurrent GPUs); it is released when the reason goes. The next release clears it.
    #[serde(rename = "workflow.release_held.v1")]
    ReleaseHeld {
        job: String,
        reason: String,
        since: DateTime<Utc>,
    },

    /// A service's run answers at `address` (host:port): jobs that require it may start.
    #[serde(rename = "workflow.service_ready.v1")]
    ServiceReady {
        service: String,
        job_id: Uuid,
        address: String,
    },

    #[serde(rename = "workflow.job_released.v1")]
    JobReleased {
        job: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
        job_id: Uuid,
        site: String,
        /// 1 for the first run of this task; a re-run after a site fault counts up.
        attempt: u32,
        /// Set when the task was released with others of its array, to go to the site
        /// as one submission.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch: Option<ArrayBatch>,
    },

    /// A released job reached a terminal state; mirrors the Job aggregate's terminal
    /// event so the DAG can advance from the workflow's own history.
    #[serde(rename = "workflow.job_settled.v1")]
    JobSettled {
        job: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
        job_id: Uuid,
        outcome: JobOutcome,
        /// The task goes back to be released again (after a site's fault); decided here
        /// so that replay never depends on today's retry policy.
        #[serde(default)]
        retry: bool,
    },

    #[serde(rename = "workflow.cancel_requested.v1")]
    CancelRequested {
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        requested_at: DateTime<Utc>,
    },

    /// Every job succeeded.
    #[serde(rename = "workflow.finished.v1")]
    Finished { finished_at: DateTime<Utc> },

    #[serde(rename = "workflow.failed.v1")]
    Failed {
        reason: String,
        /// The tasks whose failure failed the workflow.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        failed_jobs: Vec<TaskRef>,
        failed_at: DateTime<Utc>,
    },

    #[serde(rename = "workflow.cancelled.v1")]
    Cancelled { cancelled_at: DateTime<Utc> },

    /// The ledger's totals for this workflow as of a ledger position.
    #[serde(rename = "workflow.billed.v1")]
    Billed {
        totals: BTreeMap<Currency, Decimal>,
        /// The ledger consumer's position the totals include.
        as_of_position: u64,
    },

    /// Space was set aside for the workflow at a site (a volume of its spec, or cached
    /// data), billed from `allocated_at` at `rate` until it is released.
    #[serde(rename = "workflow.volume_allocated.v1")]
    VolumeAllocated {
        /// The volume's name in the spec, or the cache's name (e.g. a dataset digest).
        volume: String,
        class: StorageClass,
        site: String,
        bytes: u64,
        /// The site's storage price in force at the allocation.
        rate: StorageRate,
        allocated_at: DateTime<Utc>,
    },

    /// Every ingress step of `volume` at `site` is done (the transfers name what came
    /// in): jobs that mount it there may start.
    #[serde(rename = "workflow.volume_staged.v1")]
    VolumeStaged {
        volume: String,
        site: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        transfers: Vec<Uuid>,
    },

    /// An ingress step of `volume` at `site` failed for good: no job that mounts it there
    /// runs, and the workflow fails with `reason` once nothing else can run.
    #[serde(rename = "workflow.volume_staging_failed.v1")]
    VolumeStagingFailed {
        volume: String,
        site: String,
        reason: String,
    },

    /// Every job is done and these volumes have egress steps: the data mover copies
    /// them out; the workflow finishes once every one is exported.
    #[serde(rename = "workflow.egress_due.v1")]
    EgressDue { volumes: Vec<VolumeAt> },

    /// Every egress step of `volume` at `site` is done.
    #[serde(rename = "workflow.volume_exported.v1")]
    VolumeExported {
        volume: String,
        site: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        transfers: Vec<Uuid>,
    },

    /// An egress step of `volume` at `site` failed for good; the workflow fails with the
    /// reason, and the volume's data stays at the site until it is given back.
    #[serde(rename = "workflow.volume_export_failed.v1")]
    VolumeExportFailed {
        volume: String,
        site: String,
        reason: String,
    },

    /// The space was given back. Repeats the allocation's numbers, so that this event
    /// alone is a complete storage charge: `bytes` from `allocated_at` to `released_at`
    /// at `rate`.
    #[serde(rename = "workflow.volume_released.v1")]
    VolumeReleased {
        volume: String,
        class: StorageClass,
        site: String,
        bytes: u64,
        rate: StorageRate,
        allocated_at: DateTime<Utc>,
        released_at: DateTime<Utc>,
    },
}

/// A volume held at a site.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VolumeAt {
    pub volume: String,
    pub site: String,
}

/// What a storage allocation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageClass {
    /// A volume the spec declares.
    Volume,
    /// Data kept at a site for reuse (stage-in caches).
    Cache,
}

impl StorageClass {
    pub fn as_str(self) -> &'static str {
        match self {
            StorageClass::Volume => "volume",
            StorageClass::Cache => "cache",
        }
    }
}

impl WorkflowEvent {
    /// The storage this event bills: `bytes` × the time held at the rate captured at the
    /// allocation. `None` for events that bill nothing.
    pub fn storage_cost(&self) -> Option<Result<Money, MoneyError>> {
        match self {
            WorkflowEvent::VolumeReleased {
                bytes,
                rate,
                allocated_at,
                released_at,
                ..
            } => Some(rate.cost(
                *bytes,
                crate::money::seconds_between(*allocated_at, *released_at),
            )),
            _ => None,
        }
    }

    /// The versioned tag this event serializes with.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkflowEvent::Submitted { .. } => "workflow.submitted.v1",
            WorkflowEvent::PlacementDecided { .. } => "workflow.placement_decided.v1",
            WorkflowEvent::PlacementRejected { .. } => "workflow.placement_rejected.v1",
            WorkflowEvent::PlacementWaiting { .. } => "workflow.placement_waiting.v1",
            WorkflowEvent::ReleaseHeld { .. } => "workflow.release_held.v1",
            WorkflowEvent::ServiceReady { .. } => "workflow.service_ready.v1",
            WorkflowEvent::JobReleased { .. } => "workflow.job_released.v1",
            WorkflowEvent::JobSettled { .. } => "workflow.job_settled.v1",
            WorkflowEvent::CancelRequested { .. } => "workflow.cancel_requested.v1",
            WorkflowEvent::Finished { .. } => "workflow.finished.v1",
            WorkflowEvent::Failed { .. } => "workflow.failed.v1",
            WorkflowEvent::Cancelled { .. } => "workflow.cancelled.v1",
            WorkflowEvent::Billed { .. } => "workflow.billed.v1",
            WorkflowEvent::VolumeAllocated { .. } => "workflow.volume_allocated.v1",
            WorkflowEvent::VolumeReleased { .. } => "workflow.volume_released.v1",
            WorkflowEvent::VolumeStaged { .. } => "workflow.volume_staged.v1",
            WorkflowEvent::VolumeStagingFailed { .. } => "workflow.volume_staging_failed.v1",
            WorkflowEvent::EgressDue { .. } => "workflow.egress_due.v1",
            WorkflowEvent::VolumeExported { .. } => "workflow.volume_exported.v1",
            WorkflowEvent::VolumeExportFailed { .. } => "workflow.volume_export_failed.v1",
        }
    }
}

/// Why the router chose what it chose: every candidate it looked at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementExplanation {
    /// Running the whole workflow at one site, site by site.
    pub candidates: Vec<Candidate>,
    /// Running its jobs at different sites, when `placement.split` allows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitPlan>,
}

/// A plan that runs a workflow's jobs at different sites, each where it costs least
/// counting the volumes it must receive from the sites of the jobs before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitPlan {
    pub verdict: Verdict,
    /// Each job (or service), in the order they were placed.
    pub jobs: Vec<JobPlacement>,
    /// Volumes copied from one site to another between jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<VolumeMove>,
    /// Absent when the plan could not be priced (see the verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostTerms>,
}

impl SplitPlan {
    /// The distinct sites the plan uses, in the order first used.
    pub fn sites(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for j in &self.jobs {
            if !out.contains(&j.site.as_str()) {
                out.push(&j.site);
            }
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPlacement {
    pub job: String,
    pub site: String,
    /// The offer it runs on there.
    pub offer: String,
    /// Its compute estimate there.
    pub compute: Decimal,
}

/// A volume copied between the sites of two jobs, at the source's egress price.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMove {
    pub volume: String,
    pub from: String,
    pub to: String,
    /// Its declared size: the most the copy moves.
    pub bytes: u64,
    /// Before the job that needs it there.
    pub before_job: String,
    pub cost: Decimal,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub site: String,
    pub verdict: Verdict,
    /// The estimate's terms; absent for a site filtered out before scoring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostTerms>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Chosen,
    /// Could run it, but scored worse.
    Fitted,
    Rejected {
        reason: String,
    },
}

/// The estimated total cost of the whole workflow at one site, term by term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostTerms {
    pub currency: Currency,
    pub compute: Decimal,
    /// Moving inputs not already cached there.
    pub data_in: Decimal,
    pub storage: Decimal,
    /// Moving results to their destinations.
    pub data_out: Decimal,
    /// Moving volumes between the sites of a split workflow.
    #[serde(default, skip_serializing_if = "Decimal::is_zero")]
    pub data_between: Decimal,
}

impl CostTerms {
    pub fn total(&self) -> Result<Money, MoneyError> {
        [self.data_in, self.storage, self.data_out, self.data_between]
            .into_iter()
            .try_fold(self.compute, |sum, term| sum.checked_add(term))
            .map(|amount| Money::new(amount, self.currency))
            .ok_or(MoneyError::Overflow)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteRejection {
    pub site: String,
    pub reason: String,
}
