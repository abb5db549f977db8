//! The status read model: `intake_workflows` (one row per workflow) and `intake_tasks`
//! (one row per run of a task), folded from workflow.* and job.* events.
//!
//! Every row is derived from events alone (times are the events' `occurred_at`), so a
//! replay from position 0 after [`meridian_store::Store::reset`] yields identical rows.
//! Job events carry only the Job aggregate's id, so they find their workflow through
//! the task row their release (or dispatch) created.

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use meridian_eventlog::Commit;
use meridian_events::vocabulary::Endpoint;
use meridian_events::{
    AggregateKind, JobEvent, JobOutcome, RawEnvelope, TransferEvent, WorkflowEvent,
};
use meridian_store::{Projection, StoreError, Tx};
use serde::Deserialize;
use sqlx::Row;
use uuid::Uuid;

/// The projection's name, which keys its position in `projection_positions`.
pub const NAME: &str = "intake_status";

/// `task_index` for a task that is not part of an array: a real value rather than
/// NULL, so that equality and indexes work the same on SQLite and PostgreSQL.
pub(crate) const NO_INDEX: i64 = -1;

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS intake_workflows (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        tenant TEXT NOT NULL,
        state TEXT NOT NULL,
        site TEXT,
        submitted_by TEXT NOT NULL,
        submitted_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        reason TEXT,
        task_total BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS intake_workflows_state ON intake_workflows (state, id)",
    "CREATE INDEX IF NOT EXISTS intake_workflows_tenant ON intake_workflows (tenant, id)",
    "CREATE TABLE IF NOT EXISTS intake_tasks (
        job_id TEXT PRIMARY KEY,
        workflow_id TEXT NOT NULL,
        job TEXT NOT NULL,
        task_index BIGINT NOT NULL,
        attempt BIGINT NOT NULL,
        latest BIGINT NOT NULL,
        released_position BIGINT NOT NULL,
        site TEXT NOT NULL,
        state TEXT NOT NULL,
        retried BIGINT NOT NULL,
        backend_job_id TEXT,
        exit_code BIGINT,
        released_at TEXT NOT NULL,
        started_at TEXT,
        ended_at TEXT,
        reason TEXT
    )",
    "CREATE TABLE IF NOT EXISTS intake_services (
        job_id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        ready_at TEXT NOT NULL
    )",
    // Each copy of a workflow's data (transfer.*), with its progress.
    "CREATE TABLE IF NOT EXISTS intake_transfers (
        id TEXT PRIMARY KEY,
        workflow_id TEXT NOT NULL,
        position BIGINT NOT NULL,
        source TEXT NOT NULL,
        destination TEXT NOT NULL,
        state TEXT NOT NULL,
        bytes_done BIGINT NOT NULL,
        bytes_total BIGINT,
        cached BIGINT NOT NULL,
        reason TEXT
    )",
    "CREATE INDEX IF NOT EXISTS intake_transfers_workflow ON intake_transfers (workflow_id, position)",
    "CREATE INDEX IF NOT EXISTS intake_tasks_task ON intake_tasks (workflow_id, job, task_index)",
    "CREATE INDEX IF NOT EXISTS intake_tasks_release ON intake_tasks (workflow_id, released_position, job_id)",
    // GPU-hours each ended run held, per calendar month: what a tenant's GPU-hour budget
    // counts as used.
    "CREATE TABLE IF NOT EXISTS intake_gpu_hours (
        job_id TEXT NOT NULL,
        period TEXT NOT NULL,
        tenant TEXT NOT NULL,
        workflow_id TEXT NOT NULL,
        gpu_hours TEXT NOT NULL,
        PRIMARY KEY (job_id, period)
    )",
    "CREATE INDEX IF NOT EXISTS intake_gpu_hours_tenant ON intake_gpu_hours (tenant, period)",
];

/// The status read model; run it with `meridian_store::run` or `catch_up`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatusProjection;

/// Times as the read model stores and the API shows them: RFC 3339, UTC, fixed width,
/// so that text order is time order.
/// How a reason for holding a release starts (`workflow.release_held.v1`), so that the
/// next release can clear it.
pub const HELD: &str = "held: ";

/// How a pending run's reason starts when its site holds it back (`job.waiting.v1`).
pub const WAITING: &str = "waiting at the site: ";

pub(crate) fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

#[async_trait]
impl Projection for StatusProjection {
    fn name(&self) -> &'static str {
        NAME
    }

    fn schema(&self) -> &'static [&'static str] {
        SCHEMA
    }

    fn tables(&self) -> &'static [&'static str] {
        &[
            "intake_workflows",
            "intake_tasks",
            "intake_services",
            "intake_gpu_hours",
            "intake_transfers",
        ]
    }

    async fn apply(&self, tx: &mut Tx, commit: &Commit) -> Result<(), StoreError> {
        for envelope in commit.events.iter() {
            let failed = |message: String| StoreError::Apply {
                projection: NAME.to_string(),
                position: commit.position,
                message: format!("{} #{}: {message}", envelope.aggregate, envelope.sequence),
            };
            match envelope.aggregate.kind {
                AggregateKind::Workflow => {
                    let event = WorkflowEvent::deserialize(&envelope.payload)
                        .map_err(|e| failed(e.to_string()))?;
                    apply_workflow(tx, commit.position, envelope, &event).await?;
                }
                AggregateKind::Job => {
                    let event = JobEvent::deserialize(&envelope.payload)
                        .map_err(|e| failed(e.to_string()))?;
                    apply_job(tx, commit.position, envelope, &event).await?;
                }
                AggregateKind::Transfer => {
                    let event = TransferEvent::deserialize(&envelope.payload)
                        .map_err(|e| failed(e.to_string()))?;
                    apply_transfer(tx, commit.position, envelope, &event).await?;
                }
                // Sites and tenants are other read models' business.
                _ => {}
            }
        }
        Ok(())
    }
}

/// How many tasks a spec defines: one per job, one per index of an array job.
pub(crate) fn task_total(spec: &meridian_spec::Workflow) -> u64 {
    spec.jobs
        .values()
        .map(|job| {
            job.array.as_ref().map_or(1, |a| {
                u64::from(a.end)
                    .saturating_sub(u64::from(a.start))
                    .saturating_add(1)
            })
        })
        .sum()
}

fn index_column(index: Option<u32>) -> i64 {
    index.map_or(NO_INDEX, i64::from)
}

fn outcome_state(outcome: &JobOutcome) -> &'static str {
    match outcome {
        JobOutcome::Succeeded => "succeeded",
        JobOutcome::Failed { .. } => "failed",
        JobOutcome::Cancelled => "cancelled",
    }
}

/// Moves the workflow's `updated_at` forward (never back: events of different
/// aggregates may carry times slightly out of log order).
async fn touch(tx: &mut Tx, workflow_id: &str, at: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE intake_workflows SET updated_at = $1 WHERE id = $2 AND updated_at < $3")
        .bind(at)
        .bind(workflow_id)
        .bind(at)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn apply_workflow(
    tx: &mut Tx,
    position: u64,
    envelope: &RawEnvelope,
    event: &WorkflowEvent,
) -> Result<(), StoreError> {
    let id = envelope.aggregate.id.to_string();
    let at = timestamp(envelope.occurred_at);
    match event {
        WorkflowEvent::Submitted {
            name,
            spec,
            submitted_by,
            ..
        } => {
            sqlx::query(
                "INSERT INTO intake_workflows
                    (id, name, tenant, state, site, submitted_by, submitted_at, updated_at,
                     reason, task_total)
                 VALUES ($1, $2, $3, 'submitted', NULL, $4, $5, $6, NULL, $7)
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(&id)
            .bind(name)
            .bind(&envelope.tenant)
            .bind(submitted_by)
            .bind(&at)
            .bind(&at)
            .bind(i64::try_from(task_total(spec)).unwrap_or(i64::MAX))
            .execute(&mut **tx)
            .await?;
            // The row was made with `updated_at` at this event's time.
            return Ok(());
        }
        WorkflowEvent::PlacementDecided { site, .. } => {
            // A re-placement keeps a running workflow running; only a workflow not yet
            // placed (or last rejected) becomes `placed`.
            sqlx::query(
                "UPDATE intake_workflows SET
                    site = $1,
                    reason = CASE WHEN state IN ('rejected', 'waiting') THEN NULL ELSE reason END,
                    state = CASE WHEN state IN ('submitted', 'rejected', 'waiting') THEN 'placed'
                                 ELSE state END,
                    updated_at = CASE WHEN updated_at < $3 THEN $3 ELSE updated_at END
                 WHERE id = $2",
            )
            .bind(site)
            .bind(&id)
            .bind(&at)
            .execute(&mut **tx)
            .await?;
            return Ok(());
        }
        WorkflowEvent::PlacementRejected {
            attempt,
            rejections,
        } => {
            let why = if rejections.is_empty() {
                "no site is available".to_string()
            } else {
                rejections
                    .iter()
                    .map(|r| format!("{}: {}", r.site, r.reason))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let reason = format!("no site could take the workflow (attempt {attempt}): {why}");
            sqlx::query(
                "UPDATE intake_workflows SET
                    reason = CASE WHEN state IN ('submitted', 'rejected', 'waiting') THEN $1
                                  ELSE reason END,
                    state = CASE WHEN state IN ('submitted', 'rejected', 'waiting') THEN 'rejected'
                                 ELSE state END
                 WHERE id = $2",
            )
            .bind(reason)
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        }
        WorkflowEvent::PlacementWaiting { reason, .. } => {
            sqlx::query(
                "UPDATE intake_workflows SET reason = $1, state = 'waiting'
                 WHERE id = $2 AND state IN ('submitted', 'rejected', 'waiting')",
            )
            .bind(reason)
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        }
        WorkflowEvent::ReleaseHeld { reason, .. } => {
            sqlx::query(
                "UPDATE intake_workflows SET reason = $1
                 WHERE id = $2 AND state IN ('placed', 'running')",
            )
            .bind(reason)
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        }
        // The run's own `job.service_ready.v1` gives the address.
        WorkflowEvent::ServiceReady { .. } => return Ok(()),
        WorkflowEvent::JobReleased {
            job,
            index,
            job_id,
            site,
            attempt,
            ..
        } => {
            let task = NewTask {
                workflow_id: &id,
                job,
                index: *index,
                job_id: *job_id,
                attempt: *attempt,
                site,
                at: &at,
                position,
            };
            ensure_task(tx, &task).await?;
            // A release ends the hold it was under.
            sqlx::query(
                "UPDATE intake_workflows SET
                    reason = CASE WHEN reason LIKE $2 THEN NULL ELSE reason END,
                    updated_at = CASE WHEN updated_at < $3 THEN $3 ELSE updated_at END
                 WHERE id = $1",
            )
            .bind(&id)
            .bind(format!("{HELD}%"))
            .bind(&at)
            .execute(&mut **tx)
            .await?;
            return Ok(());
        }
        WorkflowEvent::JobSettled {
            job_id,
            outcome,
            retry,
            ..
        } => {
            // The Job aggregate's own terminal event normally set the run's state
            // already; this covers a run settled without one (cancelled from outside).
            let reason = match outcome {
                JobOutcome::Failed { reason } => Some(reason.to_string()),
                _ => None,
            };
            sqlx::query(
                "UPDATE intake_tasks SET
                    reason = CASE WHEN state IN ('pending', 'running') THEN $1 ELSE reason END,
                    state = CASE WHEN state IN ('pending', 'running') THEN $2 ELSE state END,
                    retried = $3
                 WHERE job_id = $4",
            )
            .bind(reason)
            .bind(outcome_state(outcome))
            .bind(i64::from(*retry))
            .bind(job_id.to_string())
            .execute(&mut **tx)
            .await?;
        }
        WorkflowEvent::CancelRequested { by, reason, .. } => {
            let why = match reason {
                Some(r) => format!("cancel requested by {by}: {r}"),
                None => format!("cancel requested by {by}"),
            };
            sqlx::query(
                "UPDATE intake_workflows SET
                    reason = $1,
                    state = 'cancelling'
                 WHERE id = $2 AND state NOT IN ('finished', 'failed', 'cancelled')",
            )
            .bind(why)
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        }
        // Whatever it waited for (a hold, copying out) is over.
        WorkflowEvent::Finished { .. } => {
            sqlx::query(
                "UPDATE intake_workflows SET state = 'finished', reason = NULL,
                    updated_at = CASE WHEN updated_at < $2 THEN $2 ELSE updated_at END
                 WHERE id = $1",
            )
            .bind(&id)
            .bind(&at)
            .execute(&mut **tx)
            .await?;
            return Ok(());
        }
        WorkflowEvent::Failed { reason, .. } => {
            set_state(tx, &id, "failed", Some(reason.as_str())).await?
        }
        // Keeps the cancel request's reason: it says who cancelled and why.
        WorkflowEvent::Cancelled { .. } => set_state(tx, &id, "cancelled", None).await?,
        // The bill and storage have their own endpoint and read model (the ledger).
        // Its data arrived: the hold it was under for it ends.
        WorkflowEvent::VolumeStaged { .. } => clear_hold(tx, &id).await?,
        // Nothing waits silently: a workflow whose jobs are done says it copies out.
        WorkflowEvent::EgressDue { volumes } => {
            let names: Vec<String> = volumes
                .iter()
                .map(|v| format!("{} at {}", v.volume, v.site))
                .collect();
            sqlx::query(
                "UPDATE intake_workflows SET reason = $1
                 WHERE id = $2 AND state IN ('placed', 'running')",
            )
            .bind(format!(
                "copying out its outputs: volume {}",
                names.join(", ")
            ))
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        }
        // Outputs a failed workflow kept, copied out on a retry: it stays failed, and
        // says they are out.
        WorkflowEvent::VolumeExported { volume, site, .. } => {
            // Copied out while it runs on (its last job that mounts the volume ended).
            sqlx::query(
                "UPDATE intake_workflows SET reason = NULL
                 WHERE id = $1 AND state IN ('placed', 'running') AND reason LIKE $2",
            )
            .bind(&id)
            .bind("copying out its outputs%")
            .execute(&mut **tx)
            .await?;
            sqlx::query(
                "UPDATE intake_workflows SET reason = $1 || reason
                 WHERE id = $2 AND state = 'failed'",
            )
            .bind(format!(
                "its outputs in volume {volume} at {site} were copied out after all; before that: "
            ))
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        }
        WorkflowEvent::Billed { .. }
        | WorkflowEvent::VolumeAllocated { .. }
        | WorkflowEvent::VolumeReleased { .. }
        | WorkflowEvent::VolumeStagingFailed { .. }
        | WorkflowEvent::VolumeExportFailed { .. } => return Ok(()),
    }
    touch(tx, &id, &at).await
}

/// How an end of a copy reads in `GET /v1/workflows/{id}`.
pub(crate) fn endpoint_text(endpoint: &Endpoint) -> String {
    match endpoint {
        Endpoint::Uri { uri } => uri.clone(),
        Endpoint::SitePath { site, path } => format!("{site}:{path}"),
    }
}

/// Folds one transfer.* event into its row; `meridian status` shows copies and their
/// progress from it.
async fn apply_transfer(
    tx: &mut Tx,
    position: u64,
    envelope: &RawEnvelope,
    event: &TransferEvent,
) -> Result<(), StoreError> {
    let id = envelope.aggregate.id.to_string();
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    match event {
        TransferEvent::Requested {
            workflow_id,
            source,
            destination,
            bytes_expected,
        } => {
            sqlx::query(
                "INSERT INTO intake_transfers
                    (id, workflow_id, position, source, destination, state, bytes_done,
                     bytes_total, cached, reason)
                 VALUES ($1, $2, $3, $4, $5, 'copying', 0, $6, 0, NULL)
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(&id)
            .bind(workflow_id.to_string())
            .bind(count(position))
            .bind(endpoint_text(source))
            .bind(endpoint_text(destination))
            .bind(bytes_expected.map(count))
            .execute(&mut **tx)
            .await?;
        }
        TransferEvent::Progressed {
            bytes_done,
            bytes_total,
            ..
        } => {
            sqlx::query(
                "UPDATE intake_transfers SET bytes_done = $1, bytes_total = COALESCE($2, bytes_total)
                 WHERE id = $3 AND state = 'copying'",
            )
            .bind(count(*bytes_done))
            .bind(bytes_total.map(count))
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        }
        TransferEvent::Completed { bytes, cached, .. } => {
            sqlx::query(
                "UPDATE intake_transfers SET state = 'completed', bytes_done = $1,
                    bytes_total = $1, cached = $2
                 WHERE id = $3",
            )
            .bind(count(*bytes))
            .bind(i64::from(*cached))
            .bind(&id)
            .execute(&mut **tx)
            .await?;
        }
        TransferEvent::Failed { reason, .. } => {
            sqlx::query("UPDATE intake_transfers SET state = 'failed', reason = $1 WHERE id = $2")
                .bind(reason)
                .bind(&id)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

/// Ends the hold a workflow was under (`held: …`), if any.
async fn clear_hold(tx: &mut Tx, id: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE intake_workflows SET reason = NULL WHERE id = $1 AND reason LIKE $2")
        .bind(id)
        .bind(format!("{HELD}%"))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn set_state(
    tx: &mut Tx,
    id: &str,
    state: &str,
    reason: Option<&str>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE intake_workflows SET state = $1, reason = COALESCE($2, reason) WHERE id = $3",
    )
    .bind(state)
    .bind(reason)
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

struct NewTask<'a> {
    workflow_id: &'a str,
    job: &'a str,
    index: Option<u32>,
    job_id: Uuid,
    attempt: u32,
    site: &'a str,
    at: &'a str,
    position: u64,
}

/// Creates the run's row unless it exists. Both the workflow's `job_released` and the
/// job's `dispatched` call this, so the row exists whichever the log holds first. The
/// run with the highest attempt is the task's `latest`, the one its counts go by: a new
/// row is latest when no run of its task has as high an attempt, and then the lower
/// attempts stop being latest (only the highest one was).
async fn ensure_task(tx: &mut Tx, t: &NewTask<'_>) -> Result<(), StoreError> {
    let index = index_column(t.index);
    let attempt = i64::from(t.attempt);
    let inserted = sqlx::query(
        "INSERT INTO intake_tasks
            (job_id, workflow_id, job, task_index, attempt, latest, released_position, site,
             state, retried, released_at)
         VALUES ($1, $2, $3, $4, $5,
             CASE WHEN COALESCE((SELECT MAX(attempt) FROM intake_tasks
                                 WHERE workflow_id = $2 AND job = $3 AND task_index = $4), -1) < $5
                  THEN 1 ELSE 0 END,
             $6, $7, 'pending', 0, $8)
         ON CONFLICT (job_id) DO NOTHING",
    )
    .bind(t.job_id.to_string())
    .bind(t.workflow_id)
    .bind(t.job)
    .bind(index)
    .bind(attempt)
    .bind(i64::try_from(t.position).unwrap_or(i64::MAX))
    .bind(t.site)
    .bind(t.at)
    .execute(&mut **tx)
    .await?
    .rows_affected()
        > 0;
    // A first attempt has no lower attempts to demote (attempts count from 1).
    if inserted && t.attempt > 1 {
        sqlx::query(
            "UPDATE intake_tasks SET latest = 0
             WHERE workflow_id = $1 AND job = $2 AND task_index = $3 AND attempt < $4 AND latest <> 0",
        )
        .bind(t.workflow_id)
        .bind(t.job)
        .bind(index)
        .bind(attempt)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// The GPU-hours an ended run held (its allocated GPUs over its run), split by month.
async fn record_gpu_hours(
    tx: &mut Tx,
    envelope: &RawEnvelope,
    event: &JobEvent,
) -> Result<(), StoreError> {
    let (workflow_id, started, ended, allocated) = match event {
        JobEvent::Finished {
            workflow_id,
            started_at,
            ended_at,
            allocated,
            ..
        } => (workflow_id, Some(*started_at), *ended_at, Some(allocated)),
        JobEvent::Failed {
            workflow_id,
            started_at,
            ended_at,
            allocated,
            ..
        }
        | JobEvent::Cancelled {
            workflow_id,
            started_at,
            ended_at,
            allocated,
            ..
        } => (workflow_id, *started_at, *ended_at, allocated.as_ref()),
        _ => return Ok(()),
    };
    let gpus = allocated
        .and_then(|a| a.gpus.as_ref())
        .map_or(0, |g| g.count);
    let Some(started) = started.filter(|s| gpus > 0 && *s < ended) else {
        return Ok(());
    };
    let hours = rust_decimal::Decimal::from((ended - started).num_milliseconds())
        / rust_decimal::Decimal::from(3_600_000)
        * rust_decimal::Decimal::from(gpus);
    let Ok(shares) = meridian_domain::period::share_by_time(started, ended, hours) else {
        return Ok(());
    };
    // The workflow's tenant, as its row has it: the one its budget is kept for.
    let tenant: Option<String> = sqlx::query("SELECT tenant FROM intake_workflows WHERE id = $1")
        .bind(workflow_id.to_string())
        .fetch_optional(&mut **tx)
        .await?
        .map(|row| row.try_get(0))
        .transpose()?;
    let tenant = tenant.unwrap_or_else(|| envelope.tenant.clone());
    for (piece, share) in shares {
        sqlx::query(
            "INSERT INTO intake_gpu_hours (job_id, period, tenant, workflow_id, gpu_hours)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job_id, period) DO NOTHING",
        )
        .bind(envelope.aggregate.id.to_string())
        .bind(piece.period.to_string())
        .bind(&tenant)
        .bind(workflow_id.to_string())
        .bind(share.to_string())
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// [`touch`] for the workflow a run belongs to, found through the run's row in the
/// same statement (each statement is a round trip to the database's thread).
async fn touch_by_run(tx: &mut Tx, job_id: &str, at: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE intake_workflows SET updated_at = $1
         WHERE id = (SELECT workflow_id FROM intake_tasks WHERE job_id = $2) AND updated_at < $1",
    )
    .bind(at)
    .bind(job_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn apply_job(
    tx: &mut Tx,
    position: u64,
    envelope: &RawEnvelope,
    event: &JobEvent,
) -> Result<(), StoreError> {
    let job_id = envelope.aggregate.id.to_string();
    let at = timestamp(envelope.occurred_at);
    record_gpu_hours(tx, envelope, event).await?;
    match event {
        JobEvent::Dispatched {
            workflow_id,
            job,
            index,
            attempt,
            site,
            ..
        } => {
            let workflow_id = workflow_id.to_string();
            let task = NewTask {
                workflow_id: &workflow_id,
                job,
                index: *index,
                job_id: envelope.aggregate.id,
                attempt: *attempt,
                site,
                at: &at,
                position,
            };
            ensure_task(tx, &task).await?;
        }
        JobEvent::SubmittedToSite { backend_job_id, .. } => {
            sqlx::query("UPDATE intake_tasks SET backend_job_id = $1 WHERE job_id = $2")
                .bind(backend_job_id)
                .bind(&job_id)
                .execute(&mut **tx)
                .await?;
        }
        // Why the site holds a run back shows as its reason while it waits.
        JobEvent::Waiting { reason } => {
            sqlx::query(
                "UPDATE intake_tasks SET reason = $1 WHERE job_id = $2 AND state = 'pending'",
            )
            .bind(format!("{WAITING}{reason}"))
            .bind(&job_id)
            .execute(&mut **tx)
            .await?;
        }
        JobEvent::Started { started_at, .. } => {
            sqlx::query(
                "UPDATE intake_tasks SET state = 'running', started_at = $1, reason = NULL
                 WHERE job_id = $2 AND state = 'pending'",
            )
            .bind(timestamp(*started_at))
            .bind(&job_id)
            .execute(&mut **tx)
            .await?;
            sqlx::query(
                "UPDATE intake_workflows SET
                    state = CASE WHEN state = 'placed' THEN 'running' ELSE state END,
                    updated_at = CASE WHEN updated_at < $1 THEN $1 ELSE updated_at END
                 WHERE id = (SELECT workflow_id FROM intake_tasks WHERE job_id = $2)",
            )
            .bind(&at)
            .bind(&job_id)
            .execute(&mut **tx)
            .await?;
            return Ok(());
        }
        JobEvent::ServiceReady { address, ready_at } => {
            sqlx::query("DELETE FROM intake_services WHERE job_id = $1")
                .bind(&job_id)
                .execute(&mut **tx)
                .await?;
            sqlx::query(
                "INSERT INTO intake_services (job_id, address, ready_at) VALUES ($1, $2, $3)",
            )
            .bind(&job_id)
            .bind(address)
            .bind(timestamp(*ready_at))
            .execute(&mut **tx)
            .await?;
        }
        JobEvent::Finished {
            started_at,
            ended_at,
            exit_code,
            ..
        } => {
            end_run(
                tx,
                &job_id,
                "succeeded",
                Some(*started_at),
                *ended_at,
                Some(*exit_code),
                None,
            )
            .await?;
        }
        JobEvent::Failed {
            started_at,
            ended_at,
            exit_code,
            reason,
            ..
        } => {
            end_run(
                tx,
                &job_id,
                "failed",
                *started_at,
                *ended_at,
                *exit_code,
                Some(reason.to_string()),
            )
            .await?;
        }
        JobEvent::Cancelled {
            started_at,
            ended_at,
            ..
        } => {
            end_run(tx, &job_id, "cancelled", *started_at, *ended_at, None, None).await?;
        }
        // The workflow's own cancel request shows the state; nothing to show per run.
        JobEvent::CancelRequested { .. } => return Ok(()),
    }
    touch_by_run(tx, &job_id, &at).await
}

async fn end_run(
    tx: &mut Tx,
    job_id: &str,
    state: &str,
    started_at: Option<DateTime<Utc>>,
    ended_at: DateTime<Utc>,
    exit_code: Option<i32>,
    reason: Option<String>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE intake_tasks SET
            state = $1,
            started_at = COALESCE($2, started_at),
            ended_at = $3,
            exit_code = $4,
            reason = $5
         WHERE job_id = $6",
    )
    .bind(state)
    .bind(started_at.map(timestamp))
    .bind(timestamp(ended_at))
    .bind(exit_code.map(i64::from))
    .bind(reason)
    .bind(job_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
