//! The Job aggregate: one run of one job (or array task) at one site.
//!
//! Dispatched → SubmittedToSite → Started → Finished | Failed | Cancelled. A run may fail
//! or be cancelled before it starts (the site refused it, it never booted); it can only
//! finish after it started, and nothing follows a terminal state.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Aggregate;
use crate::envelope::AggregateKind;
use crate::money::ComputeRate;
use crate::vocabulary::{
    Allocation, ArrayBatch, FailureReason, JobEvent, JobOutcome, TaskRef, Usage,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Dispatched,
    SubmittedToSite,
    Started,
    Finished,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Failed | JobState::Cancelled
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Dispatched => "dispatched",
            JobState::SubmittedToSite => "submitted_to_site",
            JobState::Started => "started",
            JobState::Finished => "finished",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub enum JobCommand {
    Dispatch {
        workflow_id: Uuid,
        job: String,
        index: Option<u32>,
        attempt: u32,
        site: String,
        rate: ComputeRate,
        resources: meridian_spec::Resources,
        /// The array batch it was released in, if any.
        batch: Option<ArrayBatch>,
    },
    /// The site accepted the job under `backend_job_id`; stamped with `now`.
    RecordSubmission {
        backend_job_id: String,
    },
    Start {
        started_at: DateTime<Utc>,
        allocated: Allocation,
        hosts: Vec<String>,
    },
    /// The site holds the run back, for `reason`; repeating the reason it has is a no-op,
    /// and a run that started has nothing to wait for.
    RecordWaiting {
        reason: String,
    },
    /// A service's run answers at `address`; repeating the address it has is a no-op.
    RecordServiceReady {
        address: String,
        ready_at: DateTime<Utc>,
    },
    /// The program ended. Exit code 0 finishes the run; any other fails it with
    /// [`FailureReason::ExitCode`], so adapters need not decide.
    Finish {
        ended_at: DateTime<Utc>,
        exit_code: i32,
        usage: Usage,
    },
    Fail {
        ended_at: DateTime<Utc>,
        exit_code: Option<i32>,
        reason: FailureReason,
        usage: Usage,
    },
    RequestCancel {
        by: String,
        reason: Option<String>,
    },
    /// The site confirmed the run is gone, by our request or someone else's.
    Cancel {
        ended_at: DateTime<Utc>,
        usage: Usage,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    #[error("the job was already dispatched")]
    AlreadyDispatched,
    #[error("the job has not been dispatched")]
    NotDispatched,
    #[error("attempts count from 1")]
    InvalidAttempt,
    #[error("an array task's batch needs its position below its size and a cap of 1 to its size; got {batch:?}")]
    InvalidBatch { batch: ArrayBatch },
    #[error("the site already accepted the job")]
    AlreadySubmittedToSite,
    #[error("the job already started")]
    AlreadyStarted,
    #[error("the job never started")]
    NotStarted,
    #[error("the job is already {state}")]
    AlreadyTerminal { state: JobState },
    #[error("the billed interval ends at {to}, before it starts at {from}")]
    BilledBackwards {
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    },
    #[error("a service is ready at an address; none was given")]
    NoAddress,
    #[error("a cancel was already requested")]
    CancelAlreadyRequested,
    #[error("the run ends at {ended_at}, before it started at {started_at}")]
    EndsBeforeStart {
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
    },
}

/// Fixed at dispatch: which workflow task this run is, where, and at what price.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub workflow_id: Uuid,
    pub task: TaskRef,
    pub attempt: u32,
    pub site: String,
    pub rate: ComputeRate,
    pub resources: meridian_spec::Resources,
    /// The array batch it goes to its site in, if any.
    pub batch: Option<ArrayBatch>,
}

#[derive(Debug, Clone, Default)]
pub struct Job {
    state: Option<JobState>,
    dispatch: Option<Dispatch>,
    backend_job_id: Option<String>,
    started_at: Option<DateTime<Utc>>,
    allocated: Option<Allocation>,
    hosts: Vec<String>,
    cancel_requested: bool,
    outcome: Option<JobOutcome>,
    address: Option<String>,
    waiting: Option<String>,
}

impl Job {
    /// `None` before dispatch.
    pub fn state(&self) -> Option<JobState> {
        self.state
    }

    pub fn dispatch(&self) -> Option<&Dispatch> {
        self.dispatch.as_ref()
    }

    pub fn backend_job_id(&self) -> Option<&str> {
        self.backend_job_id.as_deref()
    }

    pub fn started_at(&self) -> Option<DateTime<Utc>> {
        self.started_at
    }

    pub fn allocated(&self) -> Option<&Allocation> {
        self.allocated.as_ref()
    }

    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Why the site holds the run back, while it does.
    pub fn waiting(&self) -> Option<&str> {
        self.waiting.as_deref()
    }

    /// Where a service's run answers, once it said so.
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    pub fn cancel_requested(&self) -> bool {
        self.cancel_requested
    }

    /// How the run ended, in the terms the workflow settles it with; `None` until it ends.
    pub fn outcome(&self) -> Option<&JobOutcome> {
        self.outcome.as_ref()
    }

    /// The dispatch of a run not yet ended.
    fn live(&self) -> Result<(JobState, &Dispatch), JobError> {
        match (self.state, &self.dispatch) {
            (Some(state), _) if state.is_terminal() => Err(JobError::AlreadyTerminal { state }),
            (Some(state), Some(d)) => Ok((state, d)),
            _ => Err(JobError::NotDispatched),
        }
    }

    fn check_billed(usage: &Usage) -> Result<(), JobError> {
        match usage.billed {
            Some(b) if b.to < b.from => Err(JobError::BilledBackwards {
                from: b.from,
                to: b.to,
            }),
            _ => Ok(()),
        }
    }

    fn check_end(&self, ended_at: DateTime<Utc>) -> Result<(), JobError> {
        match self.started_at {
            Some(started_at) if ended_at < started_at => Err(JobError::EndsBeforeStart {
                started_at,
                ended_at,
            }),
            _ => Ok(()),
        }
    }

    fn failed(
        &self,
        d: &Dispatch,
        ended_at: DateTime<Utc>,
        exit_code: Option<i32>,
        reason: FailureReason,
        usage: Usage,
    ) -> JobEvent {
        JobEvent::Failed {
            workflow_id: d.workflow_id,
            site: d.site.clone(),
            rate: d.rate.clone(),
            started_at: self.started_at,
            ended_at,
            exit_code,
            reason,
            allocated: self.allocated_or_billed(d, &usage),
            usage,
        }
    }

    /// What the run was given: as recorded at its start, else — for a run that never
    /// started but that its site bills (a cloud instance that booted and was cancelled,
    /// reclaimed or never reported) — what it was dispatched with, so the billed stretch
    /// is charged. Accelerators are left out there: no site said which it gave, and the
    /// cloud sites price by the instance.
    fn allocated_or_billed(&self, d: &Dispatch, usage: &Usage) -> Option<Allocation> {
        self.allocated.clone().or_else(|| {
            usage.billed.map(|_| {
                let nodes = d.resources.nodes.max(1);
                Allocation {
                    nodes,
                    cpus: d.resources.cpus.saturating_mul(nodes),
                    memory_bytes: d.resources.memory.bytes().saturating_mul(u64::from(nodes)),
                    gpus: None,
                }
            })
        })
    }
}

impl Aggregate for Job {
    const KIND: AggregateKind = AggregateKind::Job;
    type Command = JobCommand;
    type Event = JobEvent;
    type Error = JobError;

    fn handle(&self, cmd: JobCommand, now: DateTime<Utc>) -> Result<Vec<JobEvent>, JobError> {
        match cmd {
            JobCommand::Dispatch {
                workflow_id,
                job,
                index,
                attempt,
                site,
                rate,
                resources,
                batch,
            } => {
                if self.state.is_some() {
                    return Err(JobError::AlreadyDispatched);
                }
                if attempt == 0 {
                    return Err(JobError::InvalidAttempt);
                }
                if let Some(b) = batch {
                    if index.is_none() || b.position >= b.size || b.cap == 0 || b.cap > b.size {
                        return Err(JobError::InvalidBatch { batch: b });
                    }
                }
                Ok(vec![JobEvent::Dispatched {
                    workflow_id,
                    job,
                    index,
                    attempt,
                    site,
                    rate,
                    resources,
                    batch,
                }])
            }

            JobCommand::RecordSubmission { backend_job_id } => match self.live()?.0 {
                JobState::Dispatched => Ok(vec![JobEvent::SubmittedToSite {
                    backend_job_id,
                    submitted_at: now,
                }]),
                JobState::SubmittedToSite => Err(JobError::AlreadySubmittedToSite),
                _ => Err(JobError::AlreadyStarted),
            },

            JobCommand::Start {
                started_at,
                allocated,
                hosts,
            } => match self.live()?.0 {
                JobState::Dispatched | JobState::SubmittedToSite => Ok(vec![JobEvent::Started {
                    started_at,
                    allocated,
                    hosts,
                }]),
                _ => Err(JobError::AlreadyStarted),
            },

            JobCommand::RecordWaiting { reason } => match self.live()?.0 {
                JobState::Dispatched | JobState::SubmittedToSite => {
                    if self.waiting.as_deref() == Some(reason.as_str()) || reason.trim().is_empty()
                    {
                        return Ok(Vec::new());
                    }
                    Ok(vec![JobEvent::Waiting { reason }])
                }
                _ => Err(JobError::AlreadyStarted),
            },

            JobCommand::RecordServiceReady { address, ready_at } => {
                self.live()?;
                if self.started_at.is_none() {
                    return Err(JobError::NotStarted);
                }
                if address.trim().is_empty() {
                    return Err(JobError::NoAddress);
                }
                if self.address.as_deref() == Some(address.as_str()) {
                    return Ok(Vec::new());
                }
                Ok(vec![JobEvent::ServiceReady { address, ready_at }])
            }

            JobCommand::Finish {
                ended_at,
                exit_code,
                usage,
            } => {
                let (_, d) = self.live()?;
                let (Some(started_at), Some(allocated)) = (self.started_at, &self.allocated) else {
                    return Err(JobError::NotStarted);
                };
                self.check_end(ended_at)?;
                Self::check_billed(&usage)?;
                if exit_code != 0 {
                    let reason = FailureReason::ExitCode { code: exit_code };
                    return Ok(vec![self.failed(
                        d,
                        ended_at,
                        Some(exit_code),
                        reason,
                        usage,
                    )]);
                }
                Ok(vec![JobEvent::Finished {
                    workflow_id: d.workflow_id,
                    site: d.site.clone(),
                    rate: d.rate.clone(),
                    started_at,
                    ended_at,
                    exit_code,
                    allocated: allocated.clone(),
                    usage,
                }])
            }

            JobCommand::Fail {
                ended_at,
                exit_code,
                reason,
                usage,
            } => {
                let (_, d) = self.live()?;
                self.check_end(ended_at)?;
                Self::check_billed(&usage)?;
                Ok(vec![self.failed(d, ended_at, exit_code, reason, usage)])
            }

            JobCommand::RequestCancel { by, reason } => {
                self.live()?;
                if self.cancel_requested {
                    return Err(JobError::CancelAlreadyRequested);
                }
                Ok(vec![JobEvent::CancelRequested {
                    by,
                    reason,
                    requested_at: now,
                }])
            }

            JobCommand::Cancel { ended_at, usage } => {
                let (_, d) = self.live()?;
                self.check_end(ended_at)?;
                Self::check_billed(&usage)?;
                Ok(vec![JobEvent::Cancelled {
                    workflow_id: d.workflow_id,
                    site: d.site.clone(),
                    rate: d.rate.clone(),
                    started_at: self.started_at,
                    ended_at,
                    allocated: self.allocated_or_billed(d, &usage),
                    usage,
                }])
            }
        }
    }

    fn apply(&mut self, event: &JobEvent) {
        match event {
            JobEvent::Dispatched {
                workflow_id,
                job,
                index,
                attempt,
                site,
                rate,
                resources,
                batch,
            } => {
                self.state = Some(JobState::Dispatched);
                self.dispatch = Some(Dispatch {
                    workflow_id: *workflow_id,
                    task: TaskRef::new(job.clone(), *index),
                    attempt: *attempt,
                    site: site.clone(),
                    rate: rate.clone(),
                    resources: resources.clone(),
                    batch: *batch,
                });
            }
            JobEvent::SubmittedToSite { backend_job_id, .. } => {
                self.state = Some(JobState::SubmittedToSite);
                self.backend_job_id = Some(backend_job_id.clone());
            }
            JobEvent::Started {
                started_at,
                allocated,
                hosts,
            } => {
                self.state = Some(JobState::Started);
                self.waiting = None;
                self.started_at = Some(*started_at);
                self.allocated = Some(allocated.clone());
                self.hosts = hosts.clone();
            }
            JobEvent::Waiting { reason } => self.waiting = Some(reason.clone()),
            JobEvent::ServiceReady { address, .. } => self.address = Some(address.clone()),
            JobEvent::Finished { .. } => {
                self.state = Some(JobState::Finished);
                self.outcome = Some(JobOutcome::Succeeded);
            }
            JobEvent::Failed { reason, .. } => {
                self.state = Some(JobState::Failed);
                self.outcome = Some(JobOutcome::Failed {
                    reason: reason.clone(),
                });
            }
            JobEvent::CancelRequested { .. } => self.cancel_requested = true,
            JobEvent::Cancelled { .. } => {
                self.state = Some(JobState::Cancelled);
                self.outcome = Some(JobOutcome::Cancelled);
            }
        }
    }
}
