//! Events of the Job aggregate: one run of one job (or array task) at one site.
//!
//! The terminal events (finished, failed, cancelled) each repeat the workflow, the site
//! and the rate from `job.dispatched.v1`, so that each one alone is a complete ledger line.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Allocation, FailureReason, Usage};
use crate::money::{ComputeRate, Money, MoneyError};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum JobEvent {
    /// The workflow released this run to a site.
    #[serde(rename = "job.dispatched.v1")]
    Dispatched {
        workflow_id: Uuid,
        job: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
        attempt: u32,
        site: String,
        /// Copied from the placement decision: the price this run will be billed at.
        rate: ComputeRate,
        /// What the spec asked for, per node.
        resources: meridian_spec::Resources,
        /// The array batch it goes to the site in, when it was released in one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch: Option<super::ArrayBatch>,
    },

    /// The site accepted it and gave it its own id (a Slurm job id, a pod name, ...).
    #[serde(rename = "job.submitted_to_site.v1")]
    SubmittedToSite {
        backend_job_id: String,
        submitted_at: DateTime<Utc>,
    },

    #[serde(rename = "job.started.v1")]
    Started {
        started_at: DateTime<Utc>,
        allocated: Allocation,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hosts: Vec<String>,
    },

    /// The site holds the run back before it starts, and says why (a scheduler's
    /// pending reason, a pod the cluster cannot place yet); recorded when the reason
    /// changes.
    #[serde(rename = "job.waiting.v1")]
    Waiting { reason: String },

    /// A service's run answers at `address` (host:port) since `ready_at`.
    #[serde(rename = "job.service_ready.v1")]
    ServiceReady {
        address: String,
        ready_at: DateTime<Utc>,
    },

    /// It ran to completion with exit code 0.
    #[serde(rename = "job.finished.v1")]
    Finished {
        workflow_id: Uuid,
        site: String,
        rate: ComputeRate,
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
        exit_code: i32,
        allocated: Allocation,
        #[serde(default)]
        usage: Usage,
    },

    #[serde(rename = "job.failed.v1")]
    Failed {
        workflow_id: Uuid,
        site: String,
        rate: ComputeRate,
        /// Absent when it failed before it started (refused, never booted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started_at: Option<DateTime<Utc>>,
        ended_at: DateTime<Utc>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        reason: FailureReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allocated: Option<Allocation>,
        #[serde(default)]
        usage: Usage,
    },

    #[serde(rename = "job.cancel_requested.v1")]
    CancelRequested {
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        requested_at: DateTime<Utc>,
    },

    #[serde(rename = "job.cancelled.v1")]
    Cancelled {
        workflow_id: Uuid,
        site: String,
        rate: ComputeRate,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started_at: Option<DateTime<Utc>>,
        ended_at: DateTime<Utc>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allocated: Option<Allocation>,
        #[serde(default)]
        usage: Usage,
    },
}

impl JobEvent {
    /// The versioned tag this event serializes with.
    pub fn kind(&self) -> &'static str {
        match self {
            JobEvent::Dispatched { .. } => "job.dispatched.v1",
            JobEvent::SubmittedToSite { .. } => "job.submitted_to_site.v1",
            JobEvent::Started { .. } => "job.started.v1",
            JobEvent::Waiting { .. } => "job.waiting.v1",
            JobEvent::ServiceReady { .. } => "job.service_ready.v1",
            JobEvent::Finished { .. } => "job.finished.v1",
            JobEvent::Failed { .. } => "job.failed.v1",
            JobEvent::CancelRequested { .. } => "job.cancel_requested.v1",
            JobEvent::Cancelled { .. } => "job.cancelled.v1",
        }
    }

    /// The compute this event bills: the allocation at the rate in force, from start to
    /// end. `None` for events that bill nothing (not terminal, or never started and not
    /// billed by its site).
    pub fn compute_cost(&self) -> Option<Result<Money, MoneyError>> {
        match self {
            JobEvent::Finished {
                rate,
                started_at,
                ended_at,
                allocated,
                usage,
                ..
            } => {
                let (from, to) = usage.charged(Some(*started_at), *ended_at)?;
                Some(rate.cost_between(allocated, from, to))
            }
            JobEvent::Failed {
                rate,
                started_at,
                ended_at,
                allocated: Some(allocated),
                usage,
                ..
            }
            | JobEvent::Cancelled {
                rate,
                started_at,
                ended_at,
                allocated: Some(allocated),
                usage,
                ..
            } => {
                let (from, to) = usage.charged(*started_at, *ended_at)?;
                Some(rate.cost_between(allocated, from, to))
            }
            _ => None,
        }
    }
}
