//! Services in the Workflow aggregate, and waiting for a site to connect: given events,
//! when a command, then events or an error.

mod common;

use common::*;
use meridian_events::aggregate::testing::{given, given_state};
use meridian_events::aggregate::{Workflow, WorkflowCommand, WorkflowError, WorkflowState};
use meridian_events::{Aggregate, FailureReason, JobOutcome, TaskRef, WorkflowEvent};
use serde_json::json;

/// `train` → `serve` (an end product), and a `db` service that `report` requires.
fn serving_spec() -> meridian_spec::Workflow {
    serde_json::from_value(json!({
        "version": "v1",
        "name": "train-and-serve",
        "jobs": {
            "train": {"image": "host", "command": ["true"]},
            "report": {"requires": ["db"], "image": "host", "command": ["true"]}
        },
        "services": {
            "serve": {"requires": ["train"], "image": "host", "command": ["sleep", "1d"], "port": 8000},
            "db": {"image": "host", "command": ["sleep", "1d"], "port": 5432}
        }
    }))
    .expect("the fixture spec parses")
}

fn submitted(spec: meridian_spec::Workflow) -> WorkflowEvent {
    WorkflowEvent::Submitted {
        workflow_id: id(WORKFLOW),
        name: spec.name.clone(),
        spec,
        submitted_by: "ada".into(),
        idempotency_key: None,
        parent_workflow_id: None,
    }
}

fn placed() -> WorkflowEvent {
    placed_event(1)
}

fn released(job: &str, job_id: u128) -> WorkflowEvent {
    WorkflowEvent::JobReleased {
        job: job.into(),
        index: None,
        job_id: id(job_id),
        site: "hpc-eu".into(),
        attempt: 1,
        batch: None,
    }
}

fn ready(service: &str, job_id: u128) -> WorkflowEvent {
    WorkflowEvent::ServiceReady {
        service: service.into(),
        job_id: id(job_id),
        address: "node1:8000".into(),
    }
}

fn settle(job_id: u128, outcome: JobOutcome) -> WorkflowCommand {
    WorkflowCommand::SettleJob {
        job_id: id(job_id),
        outcome,
    }
}

fn runnable(wf: &Workflow) -> Vec<TaskRef> {
    wf.runnable_jobs()
}

#[test]
fn a_placement_that_prices_services_is_accepted() {
    // The router prices services like jobs; the aggregate once refused their rates as
    // unknown jobs, and the workflow stayed submitted for ever.
    let mut cmd = place_cmd();
    if let WorkflowCommand::RecordPlacement { job_rates, .. } = &mut cmd {
        job_rates.insert("serve".into(), hpc_rate());
    }
    let (events, wf) = given::<Workflow>([submitted(serving_spec())])
        .when(cmd, at(0, 1))
        .then_ok();
    assert!(matches!(
        events[..],
        [WorkflowEvent::PlacementDecided { .. }]
    ));
    assert_eq!(wf.state(), Some(WorkflowState::Placed));
}

#[test]
fn a_service_starts_after_the_job_it_requires_and_jobs_wait_for_a_ready_service() {
    let wf = given::<Workflow>([submitted(serving_spec()), placed()])
        .state()
        .clone();
    // train and db have no requirements; report waits for db, serve for train.
    assert_eq!(
        runnable(&wf),
        vec![TaskRef::new("db", None), TaskRef::new("train", None)]
    );
    let wf = given_state(wf)
        .when(
            WorkflowCommand::ReleaseJob {
                job: "report".into(),
                index: None,
                job_id: id(9),
                site: "hpc-eu".into(),
            },
            at(0, 2),
        )
        .then_err(|e| {
            matches!(e, WorkflowError::JobNotRunnable { reason, .. } if reason.contains("\"db\", which is not ready"))
        });
    let _ = wf;
    let wf = given::<Workflow>([
        submitted(serving_spec()),
        placed(),
        released("db", 10),
        released("train", 11),
    ])
    .state()
    .clone();
    assert!(runnable(&wf).is_empty(), "{:?}", runnable(&wf));
    // db says it is ready: report may go.
    let wf = given_state(wf)
        .when(
            WorkflowCommand::RecordServiceReady {
                job_id: id(10),
                address: "node1:8000".into(),
            },
            at(0, 3),
        )
        .then(vec![ready("db", 10)]);
    assert_eq!(runnable(&wf), vec![TaskRef::new("report", None)]);
    // Saying it again records nothing.
    let wf = given_state(wf)
        .when(
            WorkflowCommand::RecordServiceReady {
                job_id: id(10),
                address: "node1:8000".into(),
            },
            at(0, 4),
        )
        .then(vec![]);
    // train succeeds: serve may go.
    let (_, wf) = given_state(wf)
        .when(settle(11, JobOutcome::Succeeded), at(0, 5))
        .then_ok();
    assert_eq!(
        runnable(&wf),
        vec![TaskRef::new("report", None), TaskRef::new("serve", None)]
    );
}

#[test]
fn a_service_nothing_needs_any_more_is_stopped_and_settles_as_a_success() {
    let history = [
        submitted(serving_spec()),
        placed(),
        released("db", 10),
        released("train", 11),
        ready("db", 10),
        released("report", 12),
    ];
    let wf = given::<Workflow>(history.clone()).state().clone();
    // report still needs db.
    assert!(wf.unwanted_services().is_empty());
    let (_, wf) = given_state(wf)
        .when(settle(12, JobOutcome::Succeeded), at(0, 6))
        .then_ok();
    assert_eq!(wf.unwanted_services(), vec![id(10)]);
    // The router cancels it; the cancelled run counts as done.
    let (events, _) = given_state(wf)
        .when(settle(10, JobOutcome::Cancelled), at(0, 7))
        .then_ok();
    assert_eq!(
        events,
        vec![WorkflowEvent::JobSettled {
            job: "db".into(),
            index: None,
            job_id: id(10),
            outcome: JobOutcome::Succeeded,
            retry: false,
        }]
    );
}

#[test]
fn a_workflow_with_an_end_product_service_runs_until_cancelled() {
    let spec: meridian_spec::Workflow = serde_json::from_value(json!({
        "version": "v1",
        "name": "serve",
        "jobs": {"train": {"image": "host", "command": ["true"]}},
        "services": {"serve": {"requires": ["train"], "image": "host", "command": ["sleep", "1d"], "port": 8000}}
    }))
    .unwrap();
    let wf = given::<Workflow>([
        submitted(spec),
        placed(),
        released("train", 11),
        WorkflowEvent::JobSettled {
            job: "train".into(),
            index: None,
            job_id: id(11),
            outcome: JobOutcome::Succeeded,
            retry: false,
        },
        released("serve", 12),
        ready("serve", 12),
    ])
    .state()
    .clone();
    // Every job succeeded, yet the service serves on: nothing ends it but a cancel.
    assert_eq!(wf.state(), Some(WorkflowState::Running));
    assert!(wf.unwanted_services().is_empty());
    let (events, wf) = given_state(wf)
        .when(
            WorkflowCommand::RequestCancel {
                by: "ada".into(),
                reason: None,
            },
            at(1, 0),
        )
        .then_ok();
    assert!(matches!(
        events[..],
        [WorkflowEvent::CancelRequested { .. }]
    ));
    let (events, wf) = given_state(wf)
        .when(settle(12, JobOutcome::Cancelled), at(1, 1))
        .then_ok();
    assert!(matches!(
        events[..],
        [
            WorkflowEvent::JobSettled {
                outcome: JobOutcome::Cancelled,
                ..
            },
            WorkflowEvent::Cancelled { .. }
        ]
    ));
    assert_eq!(wf.state(), Some(WorkflowState::Cancelled));
}

#[test]
fn an_end_product_service_stops_when_a_job_failed_for_good() {
    let spec: meridian_spec::Workflow = serde_json::from_value(json!({
        "version": "v1",
        "name": "serve",
        "jobs": {"check": {"image": "host", "command": ["false"]}},
        "services": {"serve": {"image": "host", "command": ["sleep", "1d"], "port": 8000}}
    }))
    .unwrap();
    let wf = given::<Workflow>([
        submitted(spec),
        placed(),
        released("check", 11),
        released("serve", 12),
    ])
    .state()
    .clone();
    let (_, wf) = given_state(wf)
        .when(
            settle(
                11,
                JobOutcome::Failed {
                    reason: FailureReason::ExitCode { code: 1 },
                },
            ),
            at(0, 9),
        )
        .then_ok();
    assert_eq!(wf.unwanted_services(), vec![id(12)]);
    let (events, wf) = given_state(wf)
        .when(settle(12, JobOutcome::Cancelled), at(1, 0))
        .then_ok();
    assert!(matches!(
        events.last(),
        Some(WorkflowEvent::Failed { failed_jobs, .. }) if failed_jobs == &[TaskRef::new("check", None)]
    ));
    assert_eq!(wf.state(), Some(WorkflowState::Failed));
}

#[test]
fn a_job_cannot_be_marked_ready() {
    given::<Workflow>([submitted(serving_spec()), placed(), released("train", 11)])
        .when(
            WorkflowCommand::RecordServiceReady {
                job_id: id(11),
                address: "node1:1".into(),
            },
            at(0, 3),
        )
        .then_err(|e| matches!(e, WorkflowError::NotAService { job } if job == "train"));
}

#[test]
fn a_cycle_through_a_service_is_refused_at_submission() {
    let spec: meridian_spec::Workflow = serde_json::from_value(json!({
        "version": "v1",
        "name": "loop",
        "jobs": {"a": {"requires": ["s"], "image": "host", "command": ["true"]}},
        "services": {"s": {"requires": ["a"], "image": "host", "command": ["true"], "port": 1}}
    }))
    .unwrap();
    given::<Workflow>([])
        .when(
            WorkflowCommand::Submit {
                workflow_id: id(WORKFLOW),
                spec,
                submitted_by: "ada".into(),
                idempotency_key: None,
                parent_workflow_id: None,
            },
            at(0, 0),
        )
        .then_err(
            |e| matches!(e, WorkflowError::InvalidSpec { reason } if reason.contains("cycle")),
        );
}

#[test]
fn waiting_for_a_site_is_recorded_once_per_reason_and_ends_with_a_placement() {
    let wait = |reason: &str| WorkflowCommand::WaitForSite {
        reason: reason.into(),
        sites: vec!["gpu-a".into()],
    };
    let wf = given::<Workflow>([submitted(serving_spec())])
        .when(wait("waiting for gpu-a to connect"), at(0, 1))
        .then(vec![WorkflowEvent::PlacementWaiting {
            reason: "waiting for gpu-a to connect".into(),
            sites: vec!["gpu-a".into()],
            since: at(0, 1),
        }]);
    assert_eq!(wf.waiting_reason(), Some("waiting for gpu-a to connect"));
    let wf = given_state(wf)
        .when(wait("waiting for gpu-a to connect"), at(0, 2))
        .then(vec![]);
    let (_, wf) = given_state(wf).when(place_cmd(), at(0, 3)).then_ok();
    assert_eq!(wf.waiting_reason(), None);
    given_state(wf)
        .when(wait("again"), at(0, 4))
        .then_err(|e| *e == WorkflowError::AlreadyPlaced);
}

#[test]
fn apply_ignores_readiness_of_a_run_that_is_not_running() {
    let mut wf = given::<Workflow>([submitted(serving_spec()), placed()])
        .state()
        .clone();
    wf.apply(&ready("db", 10));
    assert_eq!(
        runnable(&wf),
        vec![TaskRef::new("db", None), TaskRef::new("train", None)]
    );
}

fn settled_as(job: &str, job_id: u128, outcome: JobOutcome, retry: bool) -> WorkflowEvent {
    WorkflowEvent::JobSettled {
        job: job.into(),
        index: None,
        job_id: id(job_id),
        outcome,
        retry,
    }
}

/// `report` needs `db`; `db` is lost (a site fault, retried) while `report` runs, and
/// `report` then succeeds: nothing wants `db` any more, so the workflow finishes rather
/// than waiting for ever on a service it will never release.
#[test]
fn a_service_waiting_to_run_again_that_nothing_needs_does_not_hold_the_workflow() {
    let spec: meridian_spec::Workflow = serde_json::from_value(json!({
        "version": "v1",
        "name": "w",
        "jobs": {"report": {"requires": ["db"], "image": "host", "command": ["true"]}},
        "services": {"db": {"image": "host", "command": ["sleep", "1d"], "port": 5432}}
    }))
    .unwrap();
    let lost = JobOutcome::Failed {
        reason: FailureReason::Lost,
    };
    let wf = given::<Workflow>([
        submitted(spec),
        placed(),
        released("db", 10),
        ready("db", 10),
        released("report", 11),
        settled_as("db", 10, lost, true),
    ])
    .state()
    .clone();
    let (events, wf) = given_state(wf)
        .when(settle(11, JobOutcome::Succeeded), at(1, 0))
        .then_ok();
    assert!(
        matches!(events.last(), Some(WorkflowEvent::Finished { .. })),
        "{events:?}"
    );
    assert_eq!(wf.state(), Some(WorkflowState::Finished));
}

/// A service the router stopped that the site then reports lost (or exited non-zero)
/// did its work: a success, not a retry that would never be released.
#[test]
fn a_stopped_service_reported_lost_settles_as_a_success() {
    let history = [
        submitted(serving_spec()),
        placed(),
        released("db", 10),
        released("train", 11),
        ready("db", 10),
        released("report", 12),
        settled_as("report", 12, JobOutcome::Succeeded, false),
    ];
    let (events, _) = given::<Workflow>(history)
        .when(
            settle(
                10,
                JobOutcome::Failed {
                    reason: FailureReason::Lost,
                },
            ),
            at(1, 0),
        )
        .then_ok();
    assert_eq!(
        events[0],
        settled_as("db", 10, JobOutcome::Succeeded, false),
        "{events:?}"
    );
}

/// A service that ends by itself while a job still needs it failed that job's chance.
#[test]
fn a_service_that_ends_while_needed_is_a_failure() {
    let (events, _) = given::<Workflow>([
        submitted(serving_spec()),
        placed(),
        released("db", 10),
        released("train", 11),
    ])
    .when(settle(10, JobOutcome::Succeeded), at(0, 9))
    .then_ok();
    assert!(
        matches!(
            &events[0],
            WorkflowEvent::JobSettled {
                outcome: JobOutcome::Failed { .. },
                retry: false,
                ..
            }
        ),
        "{events:?}"
    );
}
