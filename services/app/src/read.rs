//! Queries over the status read model, and the fallback that answers from the log for
//! a workflow the read model has not caught up with yet.

use meridian_eventlog::aggregates::Loaded;
use meridian_events::aggregate::{Workflow, WorkflowState as AggregateState};
use meridian_events::{Event, WorkflowEvent};
use meridian_store::Store;
use sqlx::any::AnyRow;
use sqlx::Row;
use uuid::Uuid;

use crate::api::{
    JobRun, RunState, TaskCounts, TransferState, TransferStatus, WorkflowPage, WorkflowState,
    WorkflowStatus, WorkflowSummary,
};
use crate::projection::{task_total, timestamp, NO_INDEX};
use crate::MAX_LISTED_RUNS;

/// A read-model query failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A row holds something the API cannot show: a bug or a foreign write.
    #[error("corrupt row in {table}: {message}")]
    Corrupt {
        table: &'static str,
        message: String,
    },
}

fn corrupt(table: &'static str, message: impl Into<String>) -> ReadError {
    ReadError::Corrupt {
        table,
        message: message.into(),
    }
}

fn uuid_column(row: &AnyRow, table: &'static str, column: &str) -> Result<Uuid, ReadError> {
    let text: String = row.try_get(column)?;
    Uuid::parse_str(&text).map_err(|e| corrupt(table, format!("{column} {text:?}: {e}")))
}

fn state_column(row: &AnyRow) -> Result<WorkflowState, ReadError> {
    let text: String = row.try_get("state")?;
    WorkflowState::parse(&text)
        .ok_or_else(|| corrupt("intake_workflows", format!("state {text:?}")))
}

fn summary(row: &AnyRow) -> Result<WorkflowSummary, ReadError> {
    Ok(WorkflowSummary {
        id: uuid_column(row, "intake_workflows", "id")?,
        name: row.try_get("name")?,
        tenant: row.try_get("tenant")?,
        state: state_column(row)?,
        submitted_at: row.try_get("submitted_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// The workflow's status from the read model; `None` when it has no row (yet).
pub async fn status(store: &Store, id: Uuid) -> Result<Option<WorkflowStatus>, ReadError> {
    let id_text = id.to_string();
    let Some(row) = sqlx::query(
        "SELECT id, name, tenant, state, site, submitted_at, updated_at, reason, task_total
         FROM intake_workflows WHERE id = $1",
    )
    .bind(&id_text)
    .fetch_optional(store.pool())
    .await?
    else {
        return Ok(None);
    };
    let head = summary(&row)?;
    let total: i64 = row.try_get("task_total")?;

    // Counts go by each task's latest run; a run that failed through the site's fault
    // and will run again leaves its task pending.
    let mut tasks = TaskCounts {
        total: u64::try_from(total).unwrap_or(0),
        ..TaskCounts::default()
    };
    let counts = sqlx::query(
        "SELECT state, retried, COUNT(*) AS n FROM intake_tasks
         WHERE workflow_id = $1 AND latest = 1 GROUP BY state, retried",
    )
    .bind(&id_text)
    .fetch_all(store.pool())
    .await?;
    for c in &counts {
        let state: String = c.try_get("state")?;
        let retried: i64 = c.try_get("retried")?;
        let n = u64::try_from(c.try_get::<i64, _>("n")?).unwrap_or(0);
        let slot = match (RunState::parse(&state), retried != 0) {
            (Some(RunState::Pending), _) | (_, true) => continue,
            (Some(RunState::Running), _) => &mut tasks.running,
            (Some(RunState::Succeeded), _) => &mut tasks.succeeded,
            (Some(RunState::Failed), _) => &mut tasks.failed,
            (Some(RunState::Cancelled), _) => &mut tasks.cancelled,
            (None, _) => return Err(corrupt("intake_tasks", format!("state {state:?}"))),
        };
        *slot += n;
    }
    tasks.pending = tasks
        .total
        .saturating_sub(tasks.running + tasks.succeeded + tasks.failed + tasks.cancelled);

    let rows = sqlx::query(
        "SELECT t.job_id, t.job, t.task_index, t.attempt, t.site, t.state, t.backend_job_id,
                t.exit_code, t.started_at, t.ended_at, t.reason,
                CASE WHEN t.state = 'running' THEN s.address END AS address
         FROM intake_tasks t LEFT JOIN intake_services s ON s.job_id = t.job_id
         WHERE t.workflow_id = $1
         ORDER BY t.released_position, t.job_id LIMIT $2",
    )
    .bind(&id_text)
    .bind(MAX_LISTED_RUNS as i64 + 1)
    .fetch_all(store.pool())
    .await?;
    let jobs_truncated = rows.len() > MAX_LISTED_RUNS;
    let jobs = rows
        .iter()
        .take(MAX_LISTED_RUNS)
        .map(job_run)
        .collect::<Result<Vec<_>, _>>()?;

    let transfers = sqlx::query(
        "SELECT id, source, destination, state, bytes_done, bytes_total, cached, reason
         FROM intake_transfers WHERE workflow_id = $1 ORDER BY position, id LIMIT $2",
    )
    .bind(&id_text)
    .bind(MAX_LISTED_RUNS as i64)
    .fetch_all(store.pool())
    .await?
    .iter()
    .map(transfer)
    .collect::<Result<Vec<_>, _>>()?;

    Ok(Some(WorkflowStatus {
        id: head.id,
        name: head.name,
        tenant: head.tenant,
        state: head.state,
        site: row.try_get("site")?,
        submitted_at: head.submitted_at,
        updated_at: head.updated_at,
        reason: row.try_get("reason")?,
        tasks,
        jobs,
        jobs_truncated,
        transfers,
    }))
}

fn transfer(row: &AnyRow) -> Result<TransferStatus, ReadError> {
    let table = "intake_transfers";
    let state: String = row.try_get("state")?;
    let count = |column: &str| -> Result<Option<u64>, ReadError> {
        let n: Option<i64> = row.try_get(column)?;
        n.map(|n| u64::try_from(n).map_err(|_| corrupt(table, column.to_string())))
            .transpose()
    };
    Ok(TransferStatus {
        id: uuid_column(row, table, "id")?,
        source: row.try_get("source")?,
        destination: row.try_get("destination")?,
        state: match state.as_str() {
            "copying" => TransferState::Copying,
            "completed" => TransferState::Completed,
            "failed" => TransferState::Failed,
            other => return Err(corrupt(table, format!("state {other:?}"))),
        },
        bytes_done: count("bytes_done")?.unwrap_or(0),
        bytes_total: count("bytes_total")?,
        cached: row.try_get::<i64, _>("cached")? != 0,
        reason: row.try_get("reason")?,
    })
}

fn job_run(row: &AnyRow) -> Result<JobRun, ReadError> {
    let state: String = row.try_get("state")?;
    let index: i64 = row.try_get("task_index")?;
    let attempt: i64 = row.try_get("attempt")?;
    let exit_code: Option<i64> = row.try_get("exit_code")?;
    Ok(JobRun {
        name: row.try_get("job")?,
        index: if index == NO_INDEX {
            None
        } else {
            Some(u32::try_from(index).map_err(|_| corrupt("intake_tasks", "task_index"))?)
        },
        job_id: uuid_column(row, "intake_tasks", "job_id")?,
        attempt: u32::try_from(attempt).map_err(|_| corrupt("intake_tasks", "attempt"))?,
        site: row.try_get("site")?,
        state: RunState::parse(&state)
            .ok_or_else(|| corrupt("intake_tasks", format!("state {state:?}")))?,
        backend_job_id: row.try_get("backend_job_id")?,
        exit_code: exit_code.map(|c| c as i32),
        started_at: row.try_get("started_at")?,
        ended_at: row.try_get("ended_at")?,
        reason: row.try_get("reason")?,
        address: row.try_get("address")?,
    })
}

/// Filters and paging of `GET /v1/workflows`, already validated.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub state: Option<WorkflowState>,
    pub tenant: Option<String>,
    pub limit: u32,
    pub after: Option<Uuid>,
}

/// Workflows newest first. UUIDv7 ids sort by creation time, so paging by id is paging
/// by time, and `after` stays stable while new workflows arrive.
pub async fn list(store: &Store, q: &ListQuery) -> Result<WorkflowPage, ReadError> {
    let mut sql = String::from(
        "SELECT id, name, tenant, state, submitted_at, updated_at FROM intake_workflows WHERE 1 = 1",
    );
    let mut params: Vec<String> = Vec::new();
    let mut param = |value: String, sql: &mut String, clause: &str| {
        params.push(value);
        sql.push_str(&format!(" AND {clause} ${}", params.len()));
    };
    if let Some(state) = q.state {
        param(state.as_str().to_string(), &mut sql, "state =");
    }
    if let Some(tenant) = &q.tenant {
        param(tenant.clone(), &mut sql, "tenant =");
    }
    if let Some(after) = q.after {
        param(after.to_string(), &mut sql, "id <");
    }
    sql.push_str(&format!(" ORDER BY id DESC LIMIT {}", q.limit + 1));
    let mut query = sqlx::query(&sql);
    for p in &params {
        query = query.bind(p);
    }
    let rows = query.fetch_all(store.pool()).await?;
    let more = rows.len() > q.limit as usize;
    let items = rows
        .iter()
        .take(q.limit as usize)
        .map(summary)
        .collect::<Result<Vec<_>, _>>()?;
    let next = if more {
        items.last().map(|i| i.id)
    } else {
        None
    };
    Ok(WorkflowPage { items, next })
}

/// The API's state for an aggregate's state. The aggregate calls a workflow running
/// once it released a job; the read model only once a task started, so a freshly
/// released workflow shows as `placed` here too.
pub(crate) fn api_state(state: AggregateState, last_rejected: bool) -> WorkflowState {
    match state {
        AggregateState::Submitted if last_rejected => WorkflowState::Rejected,
        AggregateState::Submitted => WorkflowState::Submitted,
        AggregateState::Placed | AggregateState::Running => WorkflowState::Placed,
        AggregateState::CancelRequested => WorkflowState::Cancelling,
        AggregateState::Finished => WorkflowState::Finished,
        AggregateState::Failed => WorkflowState::Failed,
        AggregateState::Cancelled => WorkflowState::Cancelled,
    }
}

/// Whether the last placement attempt in `history` was a rejection.
pub(crate) fn last_placement_rejected(loaded: &Loaded<Workflow>) -> bool {
    loaded
        .history
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            Event::Workflow(WorkflowEvent::PlacementRejected { .. }) => Some(true),
            Event::Workflow(WorkflowEvent::PlacementDecided { .. }) => Some(false),
            _ => None,
        })
        .unwrap_or(false)
}

/// A status built from the Workflow aggregate alone, for a workflow just accepted and
/// not yet projected. It knows less than the read model: no runs, every task pending.
pub(crate) fn status_from_log(id: Uuid, loaded: &Loaded<Workflow>) -> Option<WorkflowStatus> {
    let state = loaded.state.state()?;
    let first = loaded.history.first()?;
    let last = loaded.history.last()?;
    let spec = loaded.state.spec()?;
    let reason = loaded.history.iter().rev().find_map(|e| match &e.payload {
        Event::Workflow(WorkflowEvent::Failed { reason, .. }) => Some(reason.clone()),
        _ => None,
    });
    let total = task_total(spec);
    Some(WorkflowStatus {
        id,
        name: spec.name.clone(),
        tenant: first.tenant.clone(),
        state: api_state(state, last_placement_rejected(loaded)),
        site: loaded.state.placement().map(|p| p.site.clone()),
        submitted_at: timestamp(first.occurred_at),
        updated_at: timestamp(last.occurred_at),
        reason,
        tasks: TaskCounts {
            total,
            pending: total,
            ..TaskCounts::default()
        },
        jobs: Vec::new(),
        jobs_truncated: false,
        transfers: Vec::new(),
    })
}

/// How many workflows are in each state (every state, those with none at 0), for
/// metrics.
pub async fn count_by_state(
    store: &Store,
) -> Result<std::collections::BTreeMap<String, u64>, ReadError> {
    let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM intake_workflows GROUP BY state")
        .fetch_all(store.pool())
        .await?;
    let mut counts: std::collections::BTreeMap<String, u64> = WorkflowState::ALL
        .iter()
        .map(|s| (s.as_str().to_string(), 0))
        .collect();
    for row in rows {
        let state = state_column(&row)?;
        let n: i64 = row.try_get("n")?;
        counts.insert(state.as_str().to_string(), n as u64);
    }
    Ok(counts)
}
