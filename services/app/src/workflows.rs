//! Workflows: submit (with idempotency keys), status, list, cancel, events, and the
//! service's health.

use futures::{StreamExt, TryStreamExt};
use meridian_eventlog::aggregates::{execute, load, Cached, Loaded};
use meridian_events::aggregate::{
    Workflow, WorkflowCommand, WorkflowError, WorkflowState as AggregateState,
};
use meridian_events::{AggregateKind, AggregateRef, Event, EventContext, WorkflowEvent};
use meridian_ops::trace;
use sha2::{Digest, Sha256};
use tracing::Instrument;
use uuid::Uuid;

use crate::api::{
    Accepted, CancelAccepted, EventList, FieldErrorBody, Health, OutputsAccepted, WorkflowPage,
    WorkflowState, WorkflowStatus,
};
use crate::idempotency::{self, Reservation};
use crate::read::{self, api_state, last_placement_rejected, ListQuery};
use crate::{projection, Action, App, AppError, Principal};

/// A submission as a transport received it.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The workflow document, YAML or JSON.
    pub document: String,
    /// The caller said it is JSON (`Content-Type: application/json`).
    pub declared_json: bool,
    /// A retry with the same key and document returns the first submission.
    pub idempotency_key: Option<String>,
    /// The caller's W3C trace context, carried into the events.
    pub traceparent: Option<String>,
}

/// What a submission came to.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub accepted: Accepted,
    /// An idempotent replay: the workflow first submitted with this key.
    pub replayed: bool,
}

/// Why a submission was not appended.
enum Refusal {
    Rejected(WorkflowError),
    App(AppError),
}

impl Refusal {
    /// Whether retrying the same document can never succeed.
    fn is_final(&self) -> bool {
        match self {
            Refusal::Rejected(_) => true,
            Refusal::App(e) => matches!(e, AppError::PayloadTooLarge(_) | AppError::OverBudget(_)),
        }
    }

    fn into_app(self) -> AppError {
        match self {
            Refusal::Rejected(WorkflowError::InvalidSpec { reason }) => {
                AppError::InvalidWorkflow(vec![FieldErrorBody {
                    path: String::new(),
                    message: reason,
                }])
            }
            Refusal::Rejected(other) => AppError::Conflict(other.to_string()),
            Refusal::App(e) => e,
        }
    }
}

fn replay(id: Uuid, loaded: &Loaded<Workflow>) -> Submitted {
    let state = loaded.state.state().map_or(WorkflowState::Submitted, |s| {
        api_state(s, last_placement_rejected(loaded))
    });
    Submitted {
        accepted: Accepted {
            id,
            name: loaded
                .state
                .spec()
                .map(|s| s.name.clone())
                .unwrap_or_default(),
            state,
        },
        replayed: true,
    }
}

impl App {
    pub async fn load_workflow(&self, id: Uuid) -> Result<Loaded<Workflow>, AppError> {
        load::<Workflow>(&*self.log, id)
            .await
            .map_err(|e| AppError::from_log("loading the workflow", e))
    }

    /// Submits a workflow. An invalid document is answered with every problem found and
    /// appends nothing. With an idempotency key, a retry with the same key (per tenant)
    /// and the same document returns the original workflow, however much later it comes.
    pub async fn submit(
        &self,
        who: &Principal,
        submission: Submission,
    ) -> Result<Submitted, AppError> {
        self.authorize(who, Action::SubmitWorkflow).await?;
        // The root of the workflow's trace (or a child of the caller's `traceparent`).
        let span = trace::child_of("submit workflow", submission.traceparent.as_deref());
        let result = self
            .submit_authorized(who, submission)
            .instrument(span.clone())
            .await;
        if let Ok(submitted) = &result {
            trace::mark_workflow(&span, submitted.accepted.id);
        }
        let target = match &result {
            Ok(s) => format!("workflow/{}", s.accepted.id),
            Err(_) => "workflow".into(),
        };
        self.audited(who, Action::SubmitWorkflow, &target, result)
            .await
    }

    async fn submit_authorized(
        &self,
        who: &Principal,
        submission: Submission,
    ) -> Result<Submitted, AppError> {
        let text = submission.document.as_str();
        if submission.declared_json && !text.trim_start().starts_with('{') {
            return Err(AppError::InvalidWorkflow(vec![FieldErrorBody {
                path: String::new(),
                message: "expected a JSON object: the body was sent as application/json".into(),
            }]));
        }
        let spec = meridian_spec::parse(text)?;
        self.migrate().await?;

        let ctx = EventContext {
            tenant: who.tenant.clone(),
            causation_id: None,
            correlation_id: Uuid::now_v7(),
            traceparent: trace::traceparent_now(submission.traceparent.as_deref()),
        };
        let append = Append {
            spec,
            user: who.user.clone(),
            key: submission.idempotency_key.clone(),
            parent: who.workflow,
            ctx,
        };
        let Some(key) = submission.idempotency_key else {
            return append
                .run(self, Uuid::now_v7(), Made::Now)
                .await
                .map_err(Refusal::into_app);
        };

        let digest = format!("{:x}", Sha256::digest(text.as_bytes()));
        let fresh = Uuid::now_v7();
        let tenant = &who.tenant;
        let reservation = idempotency::reserve(&self.store, tenant, &key, fresh, &digest)
            .await
            .map_err(|e| AppError::from_db("reserving the idempotency key", e))?;
        let (workflow_id, made) = match reservation {
            Reservation::Reserved => (fresh, Made::Now),
            Reservation::Existing { body_sha256, .. } if body_sha256 != digest => {
                return Err(AppError::IdempotencyMismatch)
            }
            Reservation::Existing { workflow_id, .. } => {
                let loaded = self.load_workflow(workflow_id).await?;
                if loaded.state.state().is_some() {
                    return Ok(replay(workflow_id, &loaded));
                }
                // Reserved, never appended: the request that reserved it died in between,
                // or is still appending. Append under the reserved id; the aggregate lets
                // only one of us succeed.
                tracing::info!(%workflow_id, tenant, "appending a submission reserved but not yet appended");
                (workflow_id, Made::Earlier)
            }
        };
        match append.run(self, workflow_id, made).await {
            Ok(submitted) => Ok(submitted),
            // A concurrent request with the same key appended it first.
            Err(Refusal::Rejected(WorkflowError::AlreadySubmitted)) => {
                let loaded = self.load_workflow(workflow_id).await?;
                Ok(replay(workflow_id, &loaded))
            }
            Err(refusal) => {
                // A refused or oversized workflow will never exist: free the key so the
                // client can fix the document and reuse it. A log outage keeps the
                // reservation, since the append may still have landed.
                if refusal.is_final() {
                    idempotency::release(&self.store, tenant, &key, workflow_id)
                        .await
                        .map_err(|e| AppError::from_db("releasing the idempotency key", e))?;
                }
                Err(refusal.into_app())
            }
        }
    }

    /// A workflow's status, from the status read model; one accepted moments ago and not
    /// yet projected is answered from the log, with less detail (no runs yet).
    pub async fn status(&self, who: &Principal, id: Uuid) -> Result<WorkflowStatus, AppError> {
        self.authorize(who, Action::ReadWorkflow).await?;
        self.visible_workflow(who, Action::ReadWorkflow, id).await?;
        self.migrate().await?;
        if let Some(status) = read::status(&self.store, id)
            .await
            .map_err(|e| read_error("reading the workflow's status", e))?
        {
            return self.say_what_holds(status).await;
        }
        let loaded = self.load_workflow(id).await?;
        read::status_from_log(id, &loaded).ok_or_else(|| AppError::no_workflow(id))
    }

    /// Runs waiting at a site no adapter serves say so, and so does the workflow: nothing
    /// waits silently.
    async fn say_what_holds(&self, mut status: WorkflowStatus) -> Result<WorkflowStatus, AppError> {
        let pending: Vec<usize> = status
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, run)| run.state == crate::api::RunState::Pending && run.reason.is_none())
            .map(|(i, _)| i)
            .collect();
        if pending.is_empty() {
            return Ok(status);
        }
        let now = chrono::Utc::now();
        let catalog = self.catalog().await?;
        let mut held = Vec::new();
        for i in pending {
            let run = &mut status.jobs[i];
            if catalog
                .find(&run.site)
                .is_some_and(|s| !s.connected_at(now))
            {
                run.reason = Some(format!(
                    "waiting: site {} is not connected (no adapter serves it); the run starts when one does",
                    run.site
                ));
                if !held.contains(&run.site) {
                    held.push(run.site.clone());
                }
            }
        }
        if !held.is_empty() && status.reason.is_none() {
            status.reason = Some(format!(
                "held: {} not connected (no adapter serves {})",
                held.join(", "),
                if held.len() == 1 { "it" } else { "them" }
            ));
        }
        Ok(status)
    }

    /// Workflows, newest first, a page at a time.
    /// A caller that sees one tenant sees only its workflows, whatever `query` asks.
    pub async fn list(&self, who: &Principal, query: &ListQuery) -> Result<WorkflowPage, AppError> {
        self.authorize(who, Action::ListWorkflows).await?;
        self.migrate().await?;
        let mut query = query.clone();
        if !who.every_tenant {
            if let Some(asked) = query.tenant.as_deref().filter(|t| *t != who.tenant) {
                // Another tenant's list is empty to this caller, as it would be if it had
                // no workflows.
                self.audit(
                    who,
                    Action::ListWorkflows,
                    &format!("tenant/{asked}"),
                    crate::audit::Outcome::Hidden,
                    None,
                )
                .await;
                return Ok(WorkflowPage {
                    items: Vec::new(),
                    next: None,
                });
            }
            query.tenant = Some(who.tenant.clone());
        }
        read::list(&self.store, &query)
            .await
            .map_err(|e| read_error("listing workflows", e))
    }

    /// Cancels a workflow: nothing more is released and running jobs are stopped; it
    /// ends `cancelled` once the last running job settles. Asking again while it is being
    /// cancelled changes nothing.
    pub async fn cancel(
        &self,
        who: &Principal,
        id: Uuid,
        reason: Option<String>,
        traceparent: Option<String>,
    ) -> Result<CancelAccepted, AppError> {
        self.authorize(who, Action::CancelWorkflow).await?;
        self.visible_workflow(who, Action::CancelWorkflow, id)
            .await?;
        let result = self.cancel_visible(who, id, reason, traceparent).await;
        self.audited(
            who,
            Action::CancelWorkflow,
            &format!("workflow/{id}"),
            result,
        )
        .await
    }

    async fn cancel_visible(
        &self,
        who: &Principal,
        id: Uuid,
        reason: Option<String>,
        traceparent: Option<String>,
    ) -> Result<CancelAccepted, AppError> {
        let accepted = |state| Ok(CancelAccepted { id, state });
        let loaded = self.load_workflow(id).await?;
        let (Some(state), Some(first)) = (loaded.state.state(), loaded.history.first()) else {
            return Err(AppError::no_workflow(id));
        };
        if state == AggregateState::CancelRequested {
            return accepted(WorkflowState::Cancelling);
        }
        // The cancel belongs to the submission's chain: same tenant and correlation.
        let ctx = EventContext {
            tenant: first.tenant.clone(),
            causation_id: None,
            correlation_id: first.correlation_id,
            traceparent: traceparent.or_else(|| first.traceparent.clone()),
        };
        let by = &who.user;
        let result =
            execute::<Workflow, _>(&*self.log, id, &ctx, |_| WorkflowCommand::RequestCancel {
                by: by.clone(),
                reason: reason.clone(),
            })
            .await;
        match result {
            Ok(events) => {
                tracing::info!(workflow_id = %id, by, "workflow cancel requested");
                let done = events
                    .iter()
                    .any(|e| matches!(e.payload, Event::Workflow(WorkflowEvent::Cancelled { .. })));
                accepted(if done {
                    WorkflowState::Cancelled
                } else {
                    WorkflowState::Cancelling
                })
            }
            Err(e) => match AppError::from_execute("appending the cancel request", e)? {
                WorkflowError::NotSubmitted => Err(AppError::no_workflow(id)),
                // Someone else's cancel landed between our load and our append.
                WorkflowError::AlreadyCancelled
                    if self.load_workflow(id).await?.state.state()
                        == Some(AggregateState::CancelRequested) =>
                {
                    accepted(WorkflowState::Cancelling)
                }
                refusal => Err(AppError::Conflict(refusal.to_string())),
            },
        }
    }

    /// Copies out again the outputs of `volume` that a failed workflow keeps after their
    /// copy out failed: the data mover takes them up, and they are given back once out.
    pub async fn retry_egress(
        &self,
        who: &Principal,
        id: Uuid,
        volume: &str,
    ) -> Result<OutputsAccepted, AppError> {
        self.authorize(who, Action::RetryEgress).await?;
        self.visible_workflow(who, Action::RetryEgress, id).await?;
        let result = self.on_kept_outputs(id, volume, false).await;
        let target = format!("workflow/{id}/volume/{volume}");
        self.audited(who, Action::RetryEgress, &target, result)
            .await
    }

    /// Gives back the outputs of `volume` kept after their copy out failed: their
    /// storage stops being billed, and nothing will copy them out.
    pub async fn release_outputs(
        &self,
        who: &Principal,
        id: Uuid,
        volume: &str,
    ) -> Result<OutputsAccepted, AppError> {
        self.authorize(who, Action::ReleaseOutputs).await?;
        self.visible_workflow(who, Action::ReleaseOutputs, id)
            .await?;
        let result = self.on_kept_outputs(id, volume, true).await;
        let target = format!("workflow/{id}/volume/{volume}");
        self.audited(who, Action::ReleaseOutputs, &target, result)
            .await
    }

    async fn on_kept_outputs(
        &self,
        id: Uuid,
        volume: &str,
        release: bool,
    ) -> Result<OutputsAccepted, AppError> {
        let loaded = self.load_workflow(id).await?;
        let Some(first) = loaded.history.first() else {
            return Err(AppError::no_workflow(id));
        };
        // A release also gives back what is due and not out yet; a retry needs a failure.
        let held = match release {
            true => loaded.state.volumes_to_keep(),
            false => loaded.state.outputs_kept(),
        };
        let mut kept: Vec<String> = held
            .into_iter()
            .filter(|v| v.volume == volume)
            .map(|v| v.site)
            .collect();
        kept.sort();
        kept.dedup();
        if kept.is_empty() {
            return Err(AppError::Conflict(format!(
                "workflow {id} keeps no outputs of volume {volume:?} after a failed copy out"
            )));
        }
        let ctx = EventContext {
            tenant: first.tenant.clone(),
            causation_id: None,
            correlation_id: first.correlation_id,
            traceparent: first.traceparent.clone(),
        };
        let refused = |e: meridian_eventlog::aggregates::ExecuteError<WorkflowError>| {
            match AppError::from_execute("recording it", e) {
                Err(app) => app,
                Ok(refusal) => AppError::Conflict(refusal.to_string()),
            }
        };
        if release {
            for site in &kept {
                execute::<Workflow, _>(&*self.log, id, &ctx, |_| WorkflowCommand::ReleaseVolume {
                    volume: volume.to_string(),
                    site: site.clone(),
                    released_at: chrono::Utc::now(),
                })
                .await
                .map_err(refused)?;
            }
        } else {
            execute::<Workflow, _>(&*self.log, id, &ctx, |_| WorkflowCommand::RetryExport {
                volume: volume.to_string(),
            })
            .await
            .map_err(refused)?;
        }
        Ok(OutputsAccepted {
            id,
            volume: volume.to_string(),
            sites: kept,
        })
    }

    /// A workflow's events and its jobs': the Workflow aggregate's history merged with
    /// that of every Job it released, by `occurred_at`, then aggregate, then sequence.
    pub async fn events(&self, who: &Principal, id: Uuid) -> Result<EventList, AppError> {
        self.authorize(who, Action::ReadWorkflow).await?;
        self.visible_workflow(who, Action::ReadWorkflow, id).await?;
        let log_error = |e| AppError::from_log("reading the workflow's events", e);
        let mut events = self
            .log
            .read_aggregate(AggregateRef::new(AggregateKind::Workflow, id))
            .await
            .map_err(log_error)?;
        if events.is_empty() {
            return Err(AppError::no_workflow(id));
        }
        // Job ids from the raw payloads: this shows what is stored and need not
        // understand every event to do so.
        let mut job_ids: Vec<Uuid> = events
            .iter()
            .filter(|e| {
                e.payload.get("type").and_then(|t| t.as_str()) == Some("workflow.job_released.v1")
            })
            .filter_map(|e| e.payload.get("job_id")?.as_str()?.parse().ok())
            .collect();
        job_ids.sort();
        job_ids.dedup();
        // And the copies its volumes' data came in and went out by.
        let transfers = events
            .iter()
            .filter(|e| {
                matches!(
                    e.payload.get("type").and_then(|t| t.as_str()),
                    Some("workflow.volume_staged.v1" | "workflow.volume_exported.v1")
                )
            })
            .filter_map(|e| e.payload.get("transfers")?.as_array().cloned())
            .flatten()
            .filter_map(|t| t.as_str()?.parse().ok())
            .map(|t| AggregateRef::new(AggregateKind::Transfer, t));
        let related: Vec<AggregateRef> = job_ids
            .into_iter()
            .map(|job| AggregateRef::new(AggregateKind::Job, job))
            .chain(transfers)
            .collect();
        let log = &self.log;
        let jobs: Vec<_> = futures::stream::iter(related)
            .map(|aggregate| log.read_aggregate(aggregate))
            .buffered(8)
            .try_collect()
            .await
            .map_err(log_error)?;
        events.extend(jobs.into_iter().flatten());
        events.sort_by(|a, b| {
            (a.occurred_at, a.aggregate, a.sequence).cmp(&(b.occurred_at, b.aggregate, b.sequence))
        });
        let events = events
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AppError::internal("serializing the events", e))?;
        Ok(EventList { events })
    }

    /// The log's head and how far the status read model has reached; a log or database
    /// that does not answer is unavailable, never an internal error.
    pub async fn health(&self) -> Result<Health, AppError> {
        let unavailable = |e: AppError| match e {
            AppError::Internal(m) => AppError::Unavailable(m),
            other => other,
        };
        let log_head = self
            .log
            .head()
            .await
            .map_err(|e| unavailable(AppError::from_log("reading the log's head", e)))?;
        let projection_position = self.store.position(projection::NAME).await.map_err(|e| {
            unavailable(AppError::from_store("reading the projection's position", e))
        })?;
        Ok(Health {
            status: "ok".into(),
            log_head,
            projection_position,
        })
    }
}

/// Whether this request made the workflow's id, so that the log cannot hold it yet, or
/// an earlier request reserved it (and may have appended under it since).
#[derive(Clone, Copy)]
enum Made {
    Now,
    Earlier,
}

struct Append {
    spec: meridian_spec::Workflow,
    user: String,
    key: Option<String>,
    parent: Option<Uuid>,
    ctx: EventContext,
}

impl Append {
    async fn run(&self, app: &App, id: Uuid, made: Made) -> Result<Submitted, Refusal> {
        let name = self.spec.name.clone();
        let tenant = &self.ctx.tenant;
        // The budget first: a reservation whose submission never lands only holds money
        // back (until given back below, or for the month after a crash), while a
        // submission appended first could overrun the budget.
        app.reserve_budget(tenant, id, &self.spec)
            .await
            .map_err(Refusal::App)?;
        let appended = self.append(app, id, made).await;
        if let Err(refusal) = &appended {
            // Already submitted: by a concurrent retry with the same key, whose
            // reservation this is.
            let theirs = matches!(refusal, Refusal::Rejected(WorkflowError::AlreadySubmitted));
            if refusal.is_final() && !theirs {
                if let Err(e) = app.release_budget(tenant, id).await {
                    tracing::warn!(workflow_id = %id, error = %e, "could not give back a budget reservation");
                }
            }
        }
        appended?;
        tracing::info!(workflow_id = %id, tenant = %self.ctx.tenant, name, "workflow submitted");
        Ok(Submitted {
            accepted: Accepted {
                id,
                name,
                state: WorkflowState::Submitted,
            },
            replayed: false,
        })
    }

    async fn append(&self, app: &App, id: Uuid, made: Made) -> Result<(), Refusal> {
        // An id made by this request has no history to read: the append expects none, and
        // a conflict (impossible for a fresh UUIDv7) would reload and decide again.
        let mut workflow = match made {
            Made::Now => Cached::<Workflow>::fresh(id),
            Made::Earlier => Cached::load(&*app.log, id)
                .await
                .map_err(|e| Refusal::App(AppError::from_log("loading the workflow", e)))?,
        };
        workflow
            .execute(&*app.log, &self.ctx, |_| WorkflowCommand::Submit {
                workflow_id: id,
                spec: self.spec.clone(),
                submitted_by: self.user.clone(),
                idempotency_key: self.key.clone(),
                parent_workflow_id: self.parent,
            })
            .await
            .map_err(
                |e| match AppError::from_execute("appending the submission", e) {
                    Ok(rejected) => Refusal::Rejected(rejected),
                    Err(app) => Refusal::App(app),
                },
            )?;
        Ok(())
    }
}

fn read_error(context: &str, e: read::ReadError) -> AppError {
    match e {
        read::ReadError::Database(db) => AppError::from_db(context, db),
        corrupt => AppError::internal(context, corrupt),
    }
}
