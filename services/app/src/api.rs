//! The API's request and response bodies. These types are the contract: the OpenAPI
//! document is generated from them, so a field added here shows up in
//! `schemas/openapi.json` (and its freshness test says so).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// A workflow's state as the API reports it.
///
/// `waiting`: no connected site fits yet, though some site would; `reason` names them,
/// and placement goes on when one connects. `rejected`: no site could take it at its last
/// placement attempt (`reason` says why); placement may still be retried. `running`: at
/// least one task has started. `cancelling`: a cancel was requested and running jobs are
/// being stopped. Only `finished`, `failed` and `cancelled` are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    Submitted,
    Waiting,
    Placed,
    Running,
    Finished,
    Failed,
    Cancelling,
    Cancelled,
    Rejected,
}

impl WorkflowState {
    pub const ALL: [WorkflowState; 9] = [
        WorkflowState::Submitted,
        WorkflowState::Waiting,
        WorkflowState::Placed,
        WorkflowState::Running,
        WorkflowState::Finished,
        WorkflowState::Failed,
        WorkflowState::Cancelling,
        WorkflowState::Cancelled,
        WorkflowState::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowState::Submitted => "submitted",
            WorkflowState::Waiting => "waiting",
            WorkflowState::Placed => "placed",
            WorkflowState::Running => "running",
            WorkflowState::Finished => "finished",
            WorkflowState::Failed => "failed",
            WorkflowState::Cancelling => "cancelling",
            WorkflowState::Cancelled => "cancelled",
            WorkflowState::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<WorkflowState> {
        WorkflowState::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Nothing follows: the workflow finished, failed or was cancelled.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            WorkflowState::Finished | WorkflowState::Failed | WorkflowState::Cancelled
        )
    }

    /// The accepted values, for error messages.
    pub fn names() -> String {
        WorkflowState::ALL.map(|s| s.as_str()).join(", ")
    }
}

/// The state of one run of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Released to a site, not started yet (possibly queued there).
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Pending => "pending",
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<RunState> {
        [
            RunState::Pending,
            RunState::Running,
            RunState::Succeeded,
            RunState::Failed,
            RunState::Cancelled,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

/// What `POST /v1/workflows` answers: the new (or, on an idempotent replay, the
/// original) workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Accepted {
    pub id: Uuid,
    pub name: String,
    pub state: WorkflowState,
}

/// Tasks of a workflow by the state of their latest run. `total` counts every task the
/// spec defines (each array index is one task); `pending` includes tasks never released
/// and tasks waiting to run again after a site's fault.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskCounts {
    pub total: u64,
    pub pending: u64,
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
}

/// One run of one job (or array task) at a site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobRun {
    /// The job's name in the spec.
    pub name: String,
    /// The array index, for a task of an array job.
    pub index: Option<u32>,
    /// The Job aggregate's id: its events are in `GET /v1/workflows/{id}/events`.
    pub job_id: Uuid,
    /// 1 for the first run of this task; a re-run after a site's fault counts up.
    pub attempt: u32,
    pub site: String,
    pub state: RunState,
    /// The site's own id for the run (a Slurm job id, a pod name), once it accepted it.
    pub backend_job_id: Option<String>,
    pub exit_code: Option<i32>,
    #[schema(format = DateTime)]
    pub started_at: Option<String>,
    #[schema(format = DateTime)]
    pub ended_at: Option<String>,
    /// Why the run failed or was cancelled.
    pub reason: Option<String>,
    /// For a service's run that answers: where (`host:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// A workflow's status, from the status read model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkflowStatus {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub state: WorkflowState,
    /// Where it was placed, once it was; for a workflow split across sites, its first
    /// job's site (each run in `jobs` says where it ran).
    pub site: Option<String>,
    #[schema(format = DateTime)]
    pub submitted_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Why it was rejected, failed or is being cancelled.
    pub reason: Option<String>,
    pub tasks: TaskCounts,
    /// Every run released so far, in release order; at most
    /// [`crate::MAX_LISTED_RUNS`] (then `jobs_truncated` is true).
    pub jobs: Vec<JobRun>,
    pub jobs_truncated: bool,
    /// Each copy of its data the data mover made or is making (ingress, egress), in the
    /// order they were asked for; at most [`crate::MAX_LISTED_RUNS`].
    #[serde(default)]
    pub transfers: Vec<TransferStatus>,
}

/// How far one copy of a workflow's data has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransferState {
    /// Under way.
    Copying,
    Completed,
    Failed,
}

/// One copy of a workflow's data, as the data mover reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TransferStatus {
    pub id: Uuid,
    /// A URL, or `SITE:VOLUME:PATH` for a path in a volume at a site.
    pub source: String,
    pub destination: String,
    pub state: TransferState,
    /// Bytes copied so far (all of them once completed).
    pub bytes_done: u64,
    /// The bytes expected, when the source said.
    pub bytes_total: Option<u64>,
    /// The site already held these bytes (its cache): copied there, not fetched again.
    pub cached: bool,
    /// Why it failed.
    pub reason: Option<String>,
}

/// One line of `GET /v1/workflows`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkflowSummary {
    pub id: Uuid,
    pub name: String,
    pub tenant: String,
    pub state: WorkflowState,
    #[schema(format = DateTime)]
    pub submitted_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

/// A page of workflows, newest first. Pass `next` as `after` for the following page;
/// it is null on the last page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkflowPage {
    pub items: Vec<WorkflowSummary>,
    pub next: Option<Uuid>,
}

/// The optional body of `POST /v1/workflows/{id}/cancel` (and of the MCP `cancel` tool).
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Recorded in the workflow's history; at most 1000 characters.
    #[serde(default)]
    pub reason: Option<String>,
}

/// What `POST /v1/workflows/{id}/cancel` answers: `cancelling` while running jobs are
/// being stopped, `cancelled` when nothing was running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CancelAccepted {
    pub id: Uuid,
    pub state: WorkflowState,
}

/// What `POST /v1/workflows/{id}/volumes/{volume}/export` and `…/release` answer: the
/// sites whose kept outputs of the volume are being copied out again, or were given back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OutputsAccepted {
    pub id: Uuid,
    pub volume: String,
    pub sites: Vec<String>,
}

/// A workflow's history and its jobs', oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventList {
    /// Event envelopes as stored in the log: `event_id`, `aggregate {kind, id}`,
    /// `sequence`, `occurred_at`, `tenant`, `correlation_id`, ... and `payload`, whose
    /// `type` names the event (e.g. `workflow.submitted.v1`).
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok` when the service answers 200.
    pub status: String,
    /// The event log's last position.
    pub log_head: u64,
    /// How far the status read model has applied the log; the gap to `log_head` is
    /// its lag.
    pub projection_position: u64,
}

/// One problem in a workflow document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldErrorBody {
    /// The field, with dots and `[i]` for list items (`jobs.train.resources.gpus.vendor`);
    /// empty for a problem with the document as a whole.
    pub path: String,
    pub message: String,
}

/// Every error the API answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    /// Every problem found, for `invalid workflow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<FieldErrorBody>>,
}
