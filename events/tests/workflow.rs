//! The Workflow aggregate, given events / when a command / then events or an error.

mod common;

use std::collections::BTreeMap;

use common::*;
use meridian_events::aggregate::testing::{given, given_state};
use meridian_events::aggregate::workflow::MAX_TASK_ATTEMPTS;
use meridian_events::aggregate::{Workflow, WorkflowCommand, WorkflowError, WorkflowState};
use meridian_events::vocabulary::workflow::SiteRejection;
use meridian_events::{Aggregate, Currency, FailureReason, JobOutcome, TaskRef, WorkflowEvent};
use serde_json::json;
use uuid::Uuid;

fn submitted() -> WorkflowEvent {
    WorkflowEvent::Submitted {
        workflow_id: id(WORKFLOW),
        name: "prep-train-eval".into(),
        spec: spec(),
        submitted_by: "ada".into(),
        idempotency_key: Some("k-1".into()),
        parent_workflow_id: None,
    }
}

fn placed(attempt: u32) -> WorkflowEvent {
    placed_event(attempt)
}

fn released(job: &str, index: Option<u32>, job_id: u128, attempt: u32) -> WorkflowEvent {
    WorkflowEvent::JobReleased {
        job: job.into(),
        index,
        job_id: id(job_id),
        site: "hpc-eu".into(),
        attempt,
        batch: None,
    }
}

fn settled(job: &str, index: Option<u32>, job_id: u128, outcome: JobOutcome) -> WorkflowEvent {
    WorkflowEvent::JobSettled {
        job: job.into(),
        index,
        job_id: id(job_id),
        outcome,
        retry: false,
    }
}

fn release(job: &str, index: Option<u32>, job_id: u128) -> WorkflowCommand {
    WorkflowCommand::ReleaseJob {
        job: job.into(),
        index,
        job_id: id(job_id),
        site: "hpc-eu".into(),
    }
}

fn settle(job_id: u128, outcome: JobOutcome) -> WorkflowCommand {
    WorkflowCommand::SettleJob {
        job_id: id(job_id),
        outcome,
    }
}

fn cancel() -> WorkflowCommand {
    WorkflowCommand::RequestCancel {
        by: "ada".into(),
        reason: Some("wrong data".into()),
    }
}

fn exit1() -> JobOutcome {
    JobOutcome::Failed {
        reason: FailureReason::ExitCode { code: 1 },
    }
}

fn tasks(list: &[(&str, Option<u32>)]) -> Vec<TaskRef> {
    list.iter().map(|(j, i)| TaskRef::new(*j, *i)).collect()
}

/// Releases and succeeds one task, asserting nothing ends the workflow.
fn run_ok(wf: Workflow, job: &str, index: Option<u32>, job_id: u128) -> Workflow {
    let wf = given_state(wf)
        .when(release(job, index, job_id), at(1, 0))
        .then_ok()
        .1;
    given_state(wf)
        .when(settle(job_id, JobOutcome::Succeeded), at(1, 5))
        .then(vec![settled(job, index, job_id, JobOutcome::Succeeded)])
}

#[test]
fn submit_records_the_spec() {
    given::<Workflow>([])
        .when(
            WorkflowCommand::Submit {
                workflow_id: id(WORKFLOW),
                spec: spec(),
                submitted_by: "ada".into(),
                idempotency_key: Some("k-1".into()),
                parent_workflow_id: None,
            },
            at(0, 0),
        )
        .then(vec![submitted()]);
}

#[test]
fn submit_twice_is_refused() {
    given::<Workflow>([submitted()])
        .when(
            WorkflowCommand::Submit {
                workflow_id: id(WORKFLOW),
                spec: spec(),
                submitted_by: "ada".into(),
                idempotency_key: None,
                parent_workflow_id: None,
            },
            at(0, 1),
        )
        .then_err(|e| *e == WorkflowError::AlreadySubmitted);
}

#[test]
fn submit_refuses_a_dag_that_could_never_finish() {
    let submit = |jobs| WorkflowCommand::Submit {
        workflow_id: id(WORKFLOW),
        spec: spec_with_jobs(jobs),
        submitted_by: "ada".into(),
        idempotency_key: None,
        parent_workflow_id: None,
    };
    let job =
        |requires: &[&str]| json!({"image": "host", "command": ["true"], "requires": requires});
    let e = given::<Workflow>([])
        .when(submit(json!({"a": job(&["ghost"])})), at(0, 0))
        .then_err(|e| matches!(e, WorkflowError::InvalidSpec { .. }));
    assert!(e.to_string().contains("ghost"), "{e}");
    let e = given::<Workflow>([])
        .when(
            submit(json!({"a": job(&["b"]), "b": job(&["a"]), "c": job(&[])})),
            at(0, 0),
        )
        .then_err(|e| matches!(e, WorkflowError::InvalidSpec { .. }));
    assert!(e.to_string().contains("a, b"), "{e}");
}

#[test]
fn commands_before_submission_are_refused() {
    given::<Workflow>([])
        .when(place_cmd(), at(0, 0))
        .then_err(|e| *e == WorkflowError::NotSubmitted);
    given::<Workflow>([])
        .when(cancel(), at(0, 0))
        .then_err(|e| *e == WorkflowError::NotSubmitted);
    given::<Workflow>([])
        .when(settle(9, JobOutcome::Succeeded), at(0, 0))
        .then_err(|e| *e == WorkflowError::NotSubmitted);
}

#[test]
fn placement_is_numbered_and_explained() {
    let wf = given::<Workflow>([submitted()])
        .when(place_cmd(), at(0, 1))
        .then(vec![placed(1)]);
    assert_eq!(wf.state(), Some(WorkflowState::Placed));
    assert_eq!(wf.placement().unwrap().rate_for("train"), &hpc_rate());
    assert_eq!(wf.runnable_jobs(), tasks(&[("prep", None)]));

    // A later decision (re-placement) counts up, also after a rejection.
    given::<Workflow>([
        submitted(),
        WorkflowEvent::PlacementRejected {
            attempt: 1,
            rejections: vec![SiteRejection {
                site: "hpc-eu".into(),
                reason: "unhealthy".into(),
            }],
        },
    ])
    .when(place_cmd(), at(0, 5))
    .then(vec![placed(2)]);
}

#[test]
fn placement_whose_explanation_chose_another_site_is_refused() {
    let mut cmd = place_cmd();
    if let WorkflowCommand::RecordPlacement { site, .. } = &mut cmd {
        *site = "aws-us-east-1".into();
    }
    given::<Workflow>([submitted()])
        .when(cmd, at(0, 1))
        .then_err(|e| matches!(e, WorkflowError::InvalidPlacement { .. }));
}

#[test]
fn placement_rejected_keeps_the_workflow_waiting() {
    let wf = given::<Workflow>([submitted()])
        .when(
            WorkflowCommand::RejectPlacement {
                rejections: vec![SiteRejection {
                    site: "pbs-lab".into(),
                    reason: "no H100".into(),
                }],
            },
            at(0, 1),
        )
        .then(vec![WorkflowEvent::PlacementRejected {
            attempt: 1,
            rejections: vec![SiteRejection {
                site: "pbs-lab".into(),
                reason: "no H100".into(),
            }],
        }]);
    assert_eq!(wf.state(), Some(WorkflowState::Submitted));
    assert!(wf.runnable_jobs().is_empty());
    given_state(wf)
        .when(release("prep", None, 10), at(0, 2))
        .then_err(|e| *e == WorkflowError::NotPlaced);
}

#[test]
fn prep_train_eval_with_an_array_under_its_cap_finishes() {
    let wf = given::<Workflow>([submitted(), placed(1)]).state().clone();
    let wf = run_ok(wf, "prep", None, 10);
    assert_eq!(wf.state(), Some(WorkflowState::Running));
    assert_eq!(
        wf.runnable_jobs(),
        tasks(&[("sweep", Some(1)), ("sweep", Some(2)), ("train", None)])
    );

    // Two sweep tasks in flight fill the cap of 2.
    let wf = given_state(wf)
        .when(release("sweep", Some(1), 21), at(1, 10))
        .then(vec![released("sweep", Some(1), 21, 1)]);
    let wf = given_state(wf)
        .when(release("sweep", Some(2), 22), at(1, 10))
        .then(vec![released("sweep", Some(2), 22, 1)]);
    assert_eq!(wf.runnable_jobs(), tasks(&[("train", None)]));
    let err = given_state(wf.clone())
        .when(release("sweep", Some(3), 23), at(1, 10))
        .then_err(|e| matches!(e, WorkflowError::JobNotRunnable { .. }));
    assert!(err.to_string().contains("parallelism cap"), "{err}");

    // eval waits for train and every sweep task.
    let err = given_state(wf.clone())
        .when(release("eval", None, 40), at(1, 10))
        .then_err(|e| matches!(e, WorkflowError::JobNotRunnable { .. }));
    assert!(err.to_string().contains("requires"), "{err}");

    let wf = given_state(wf)
        .when(release("train", None, 30), at(1, 11))
        .then(vec![released("train", None, 30, 1)]);
    let wf = given_state(wf)
        .when(settle(21, JobOutcome::Succeeded), at(1, 20))
        .then(vec![settled("sweep", Some(1), 21, JobOutcome::Succeeded)]);
    assert_eq!(wf.runnable_jobs(), tasks(&[("sweep", Some(3))]));
    let wf = given_state(wf)
        .when(settle(22, JobOutcome::Succeeded), at(1, 21))
        .then(vec![settled("sweep", Some(2), 22, JobOutcome::Succeeded)]);
    let wf = run_ok(wf, "sweep", Some(3), 23);
    let wf = run_ok(wf, "sweep", Some(4), 24);
    let wf = run_ok(wf, "sweep", Some(5), 25);
    assert!(wf.runnable_jobs().is_empty(), "train still runs");
    let wf = given_state(wf)
        .when(settle(30, JobOutcome::Succeeded), at(9, 0))
        .then(vec![settled("train", None, 30, JobOutcome::Succeeded)]);
    assert_eq!(wf.runnable_jobs(), tasks(&[("eval", None)]));

    let wf = given_state(wf)
        .when(release("eval", None, 40), at(9, 1))
        .then(vec![released("eval", None, 40, 1)]);
    let wf = given_state(wf)
        .when(settle(40, JobOutcome::Succeeded), at(9, 30))
        .then(vec![
            settled("eval", None, 40, JobOutcome::Succeeded),
            WorkflowEvent::Finished {
                finished_at: at(9, 30),
            },
        ]);
    assert_eq!(wf.state(), Some(WorkflowState::Finished));
    assert!(wf.running_jobs().is_empty());

    given_state(wf).when(place_cmd(), at(9, 31)).then_err(|e| {
        *e == WorkflowError::AlreadyTerminal {
            state: WorkflowState::Finished,
        }
    });
}

#[test]
fn a_failing_job_blocks_its_dependents_and_fails_the_workflow() {
    let wf = given::<Workflow>([
        submitted(),
        placed(1),
        released("prep", None, 10, 1),
        settled("prep", None, 10, JobOutcome::Succeeded),
        released("train", None, 30, 1),
        released("sweep", Some(1), 21, 1),
    ])
    .state()
    .clone();

    // train fails while sweep[1] still runs: no conclusion yet.
    let wf = given_state(wf)
        .when(settle(30, exit1()), at(2, 0))
        .then(vec![settled("train", None, 30, exit1())]);
    assert_eq!(wf.state(), Some(WorkflowState::Running));
    // eval can never run; independent sweep tasks go on.
    assert_eq!(wf.runnable_jobs(), tasks(&[("sweep", Some(2))]));
    given_state(wf.clone())
        .when(release("eval", None, 40), at(2, 1))
        .then_err(
            |e| matches!(e, WorkflowError::JobNotRunnable { task, .. } if task.job == "eval"),
        );

    let wf = run_ok(wf, "sweep", Some(2), 22);
    let wf = run_ok(wf, "sweep", Some(3), 23);
    let wf = run_ok(wf, "sweep", Some(4), 24);
    let wf = run_ok(wf, "sweep", Some(5), 25);
    let wf = given_state(wf)
        .when(settle(21, JobOutcome::Succeeded), at(3, 0))
        .then(vec![
            settled("sweep", Some(1), 21, JobOutcome::Succeeded),
            WorkflowEvent::Failed {
                reason: "train failed".into(),
                failed_jobs: tasks(&[("train", None)]),
                failed_at: at(3, 0),
            },
        ]);
    assert_eq!(wf.state(), Some(WorkflowState::Failed));
    given_state(wf).when(cancel(), at(3, 1)).then_err(|e| {
        *e == WorkflowError::AlreadyTerminal {
            state: WorkflowState::Failed,
        }
    });
}

#[test]
fn a_failure_with_nothing_else_running_fails_at_once() {
    given::<Workflow>([submitted(), placed(1), released("prep", None, 10, 1)])
        .when(settle(10, exit1()), at(1, 0))
        .then(vec![
            settled("prep", None, 10, exit1()),
            WorkflowEvent::Failed {
                reason: "prep failed".into(),
                failed_jobs: tasks(&[("prep", None)]),
                failed_at: at(1, 0),
            },
        ]);
}

#[test]
fn cancel_while_running_waits_for_running_jobs() {
    let wf = given::<Workflow>([
        submitted(),
        placed(1),
        released("prep", None, 10, 1),
        settled("prep", None, 10, JobOutcome::Succeeded),
        released("train", None, 30, 1),
        released("sweep", Some(1), 21, 1),
    ])
    .when(cancel(), at(2, 0))
    .then(vec![WorkflowEvent::CancelRequested {
        by: "ada".into(),
        reason: Some("wrong data".into()),
        requested_at: at(2, 0),
    }]);
    assert_eq!(wf.state(), Some(WorkflowState::CancelRequested));
    assert_eq!(
        wf.running_jobs().keys().copied().collect::<Vec<Uuid>>(),
        vec![id(21), id(30)]
    );
    assert!(wf.runnable_jobs().is_empty());
    given_state(wf.clone())
        .when(release("sweep", Some(2), 22), at(2, 1))
        .then_err(|e| *e == WorkflowError::AlreadyCancelled);

    // A site fault during cancellation is not retried.
    let site_fault = JobOutcome::Failed {
        reason: FailureReason::NodeFailure,
    };
    let wf = given_state(wf)
        .when(settle(21, site_fault.clone()), at(2, 2))
        .then(vec![settled("sweep", Some(1), 21, site_fault)]);
    let wf = given_state(wf)
        .when(settle(30, JobOutcome::Cancelled), at(2, 3))
        .then(vec![
            settled("train", None, 30, JobOutcome::Cancelled),
            WorkflowEvent::Cancelled {
                cancelled_at: at(2, 3),
            },
        ]);
    assert_eq!(wf.state(), Some(WorkflowState::Cancelled));
}

#[test]
fn cancel_with_nothing_running_is_immediate() {
    given::<Workflow>([submitted(), placed(1)])
        .when(cancel(), at(0, 2))
        .then(vec![
            WorkflowEvent::CancelRequested {
                by: "ada".into(),
                reason: Some("wrong data".into()),
                requested_at: at(0, 2),
            },
            WorkflowEvent::Cancelled {
                cancelled_at: at(0, 2),
            },
        ]);
}

#[test]
fn cancel_twice_is_refused() {
    let requested = WorkflowEvent::CancelRequested {
        by: "ada".into(),
        reason: None,
        requested_at: at(2, 0),
    };
    given::<Workflow>([
        submitted(),
        placed(1),
        released("prep", None, 10, 1),
        requested.clone(),
    ])
    .when(cancel(), at(2, 1))
    .then_err(|e| *e == WorkflowError::AlreadyCancelled);
    given::<Workflow>([
        submitted(),
        requested,
        WorkflowEvent::Cancelled {
            cancelled_at: at(2, 0),
        },
    ])
    .when(cancel(), at(2, 1))
    .then_err(|e| *e == WorkflowError::AlreadyCancelled);
}

#[test]
fn placing_a_cancelled_workflow_is_refused() {
    given::<Workflow>([
        submitted(),
        WorkflowEvent::CancelRequested {
            by: "ada".into(),
            reason: None,
            requested_at: at(0, 1),
        },
        WorkflowEvent::Cancelled {
            cancelled_at: at(0, 1),
        },
    ])
    .when(place_cmd(), at(0, 2))
    .then_err(|e| *e == WorkflowError::AlreadyCancelled);
}

#[test]
fn settling_a_job_never_released_is_refused() {
    given::<Workflow>([submitted(), placed(1)])
        .when(settle(10, JobOutcome::Succeeded), at(1, 0))
        .then_err(|e| *e == WorkflowError::JobNotReleased { job_id: id(10) });
    // Nor twice.
    given::<Workflow>([
        submitted(),
        placed(1),
        released("prep", None, 10, 1),
        settled("prep", None, 10, JobOutcome::Succeeded),
    ])
    .when(settle(10, JobOutcome::Succeeded), at(1, 0))
    .then_err(|e| *e == WorkflowError::JobNotReleased { job_id: id(10) });
}

#[test]
fn releasing_before_requirements_succeed_is_refused() {
    let err = given::<Workflow>([submitted(), placed(1), released("prep", None, 10, 1)])
        .when(release("train", None, 30), at(1, 0))
        .then_err(
            |e| matches!(e, WorkflowError::JobNotRunnable { task, .. } if task.job == "train"),
        );
    assert_eq!(
        err.to_string(),
        "train cannot run now: it requires \"prep\", which has not succeeded"
    );
}

#[test]
fn release_checks_names_indices_ids_and_repeats() {
    let wf = given::<Workflow>([submitted(), placed(1), released("prep", None, 10, 1)])
        .state()
        .clone();
    given_state(wf.clone())
        .when(release("nope", None, 11), at(1, 0))
        .then_err(|e| *e == WorkflowError::UnknownJob { job: "nope".into() });
    given_state(wf.clone())
        .when(release("prep", Some(1), 11), at(1, 0))
        .then_err(|e| matches!(e, WorkflowError::InvalidArrayIndex { .. }));
    given_state(wf.clone())
        .when(release("prep", None, 11), at(1, 0))
        .then_err(|e| matches!(e, WorkflowError::JobNotRunnable { reason, .. } if reason.contains("already released")));
    let wf = given_state(wf)
        .when(settle(10, JobOutcome::Succeeded), at(1, 0))
        .then_ok()
        .1;
    given_state(wf.clone())
        .when(release("sweep", Some(6), 26), at(1, 0))
        .then_err(|e| matches!(e, WorkflowError::InvalidArrayIndex { .. }));
    given_state(wf.clone())
        .when(release("sweep", None, 26), at(1, 0))
        .then_err(|e| matches!(e, WorkflowError::InvalidArrayIndex { .. }));
    given_state(wf)
        .when(release("sweep", Some(1), 10), at(1, 0))
        .then_err(|e| *e == WorkflowError::DuplicateJobId { job_id: id(10) });
}

#[test]
fn a_site_fault_sends_the_task_back_until_attempts_run_out() {
    let node_failure = || JobOutcome::Failed {
        reason: FailureReason::NodeFailure,
    };
    let mut wf = given::<Workflow>([submitted(), placed(1)]).state().clone();
    for attempt in 1..MAX_TASK_ATTEMPTS {
        let job_id = 10 + u128::from(attempt);
        wf = given_state(wf)
            .when(release("prep", None, job_id), at(1, 0))
            .then(vec![released("prep", None, job_id, attempt)]);
        wf = given_state(wf)
            .when(settle(job_id, node_failure()), at(1, 1))
            .then(vec![WorkflowEvent::JobSettled {
                job: "prep".into(),
                index: None,
                job_id: id(job_id),
                outcome: node_failure(),
                retry: true,
            }]);
        assert_eq!(wf.runnable_jobs(), tasks(&[("prep", None)]));
        assert!(wf.failed_jobs().is_empty());
        // The router may re-place between attempts.
        wf = given_state(wf).when(place_cmd(), at(1, 2)).then_ok().1;
    }
    let last = 10 + u128::from(MAX_TASK_ATTEMPTS);
    wf = given_state(wf)
        .when(release("prep", None, last), at(1, 3))
        .then(vec![released("prep", None, last, MAX_TASK_ATTEMPTS)]);
    given_state(wf)
        .when(settle(last, node_failure()), at(1, 4))
        .then(vec![
            settled("prep", None, last, node_failure()),
            WorkflowEvent::Failed {
                reason: "prep failed".into(),
                failed_jobs: tasks(&[("prep", None)]),
                failed_at: at(1, 4),
            },
        ]);
}

#[test]
fn a_job_cancelled_from_outside_fails_the_workflow() {
    given::<Workflow>([submitted(), placed(1), released("prep", None, 10, 1)])
        .when(settle(10, JobOutcome::Cancelled), at(1, 0))
        .then(vec![
            settled("prep", None, 10, JobOutcome::Cancelled),
            WorkflowEvent::Failed {
                reason: "prep failed".into(),
                failed_jobs: tasks(&[("prep", None)]),
                failed_at: at(1, 0),
            },
        ]);
}

#[test]
fn fail_gives_up_only_when_nothing_runs() {
    given::<Workflow>([submitted(), placed(1), released("prep", None, 10, 1)])
        .when(
            WorkflowCommand::Fail {
                reason: "operator".into(),
            },
            at(1, 0),
        )
        .then_err(|e| *e == WorkflowError::JobsStillRunning { count: 1 });
    given::<Workflow>([submitted()])
        .when(
            WorkflowCommand::Fail {
                reason: "no site can run it".into(),
            },
            at(1, 0),
        )
        .then(vec![WorkflowEvent::Failed {
            reason: "no site can run it".into(),
            failed_jobs: vec![],
            failed_at: at(1, 0),
        }]);
}

#[test]
fn a_workflow_without_jobs_finishes_once_placed() {
    let empty = WorkflowEvent::Submitted {
        workflow_id: id(WORKFLOW),
        name: "w".into(),
        spec: spec_with_jobs(json!({})),
        submitted_by: "ada".into(),
        idempotency_key: None,
        parent_workflow_id: None,
    };
    given::<Workflow>([empty])
        .when(place_cmd(), at(0, 1))
        .then(vec![
            placed(1),
            WorkflowEvent::Finished {
                finished_at: at(0, 1),
            },
        ]);
}

#[test]
fn bills_move_forward_only() {
    let totals = BTreeMap::from([(Currency::USD, dec("12.3456")), (Currency::EUR, dec("1"))]);
    let wf = given::<Workflow>([submitted()])
        .when(
            WorkflowCommand::RecordBill {
                totals: totals.clone(),
                as_of_position: 42,
            },
            at(5, 0),
        )
        .then(vec![WorkflowEvent::Billed {
            totals: totals.clone(),
            as_of_position: 42,
        }]);
    assert_eq!(wf.billed_as_of(), Some(42));
    given_state(wf)
        .when(
            WorkflowCommand::RecordBill {
                totals,
                as_of_position: 42,
            },
            at(5, 1),
        )
        .then_err(|e| {
            *e == WorkflowError::StaleBill {
                last: 42,
                given: 42,
            }
        });
}

#[test]
fn load_replays_to_the_same_state_as_execute() {
    let mut live = Workflow::default();
    let mut log = Vec::new();
    for cmd in [
        WorkflowCommand::Submit {
            workflow_id: id(WORKFLOW),
            spec: spec(),
            submitted_by: "ada".into(),
            idempotency_key: None,
            parent_workflow_id: None,
        },
        place_cmd(),
        release("prep", None, 10),
        settle(10, JobOutcome::Succeeded),
        release("sweep", Some(1), 21),
    ] {
        log.extend(live.execute(cmd, at(1, 0)).unwrap());
    }
    let replayed = Workflow::load(&log);
    assert_eq!(replayed.state(), live.state());
    assert_eq!(replayed.runnable_jobs(), live.runnable_jobs());
    assert_eq!(replayed.running_jobs(), live.running_jobs());
    assert_eq!(
        replayed.runnable_jobs(),
        tasks(&[("sweep", Some(2)), ("train", None)])
    );
}

/// `sbatch --array=1-1000%50`: never more than 50 in flight, and it finishes.
#[test]
fn a_thousand_task_array_respects_its_cap() {
    let spec = spec_with_jobs(json!({
        "cells": {
            "image": "host",
            "command": ["sh", "-c", "echo ${ARRAY_INDEX}"],
            "array": {"start": 1, "end": 1000, "parallelism": 50}
        }
    }));
    let mut wf = Workflow::default();
    let mut log = wf
        .execute(
            WorkflowCommand::Submit {
                workflow_id: id(WORKFLOW),
                spec,
                submitted_by: "ada".into(),
                idempotency_key: None,
                parent_workflow_id: None,
            },
            at(0, 0),
        )
        .unwrap();
    log.extend(wf.execute(place_cmd(), at(0, 0)).unwrap());
    let mut next_id = 1000u128;
    let mut settled_count = 0;
    let mut retried = std::collections::BTreeSet::new();
    while wf.state() == Some(WorkflowState::Running) || wf.state() == Some(WorkflowState::Placed) {
        let runnable = wf.runnable_jobs();
        assert!(runnable.len() + wf.running_jobs().len() <= 50);
        for task in runnable {
            next_id += 1;
            log.extend(
                wf.execute(release(&task.job, task.index, next_id), at(1, 0))
                    .unwrap(),
            );
        }
        assert!(wf.running_jobs().len() <= 50);
        // Settle the oldest running job; a site fault on every 100th sends it back once.
        let (&job_id, task) = wf.running_jobs().iter().next().unwrap();
        let index = task.index.unwrap();
        let outcome = if index % 100 == 0 && retried.insert(index) {
            JobOutcome::Failed {
                reason: FailureReason::Preempted,
            }
        } else {
            JobOutcome::Succeeded
        };
        log.extend(
            wf.execute(WorkflowCommand::SettleJob { job_id, outcome }, at(2, 0))
                .unwrap(),
        );
        settled_count += 1;
    }
    assert_eq!(wf.state(), Some(WorkflowState::Finished));
    assert_eq!(settled_count, 1000 + 10);
    assert!(matches!(log.last(), Some(WorkflowEvent::Finished { .. })));
    assert_eq!(Workflow::load(&log).state(), Some(WorkflowState::Finished));
}

#[test]
fn a_retried_task_goes_first_again() {
    let spec = spec_with_jobs(json!({
        "cells": {
            "image": "host",
            "command": ["true"],
            "array": {"start": 1, "end": 10, "parallelism": 2}
        }
    }));
    let submitted = WorkflowEvent::Submitted {
        workflow_id: id(WORKFLOW),
        name: "w".into(),
        spec,
        submitted_by: "ada".into(),
        idempotency_key: None,
        parent_workflow_id: None,
    };
    let wf = given::<Workflow>([
        submitted,
        placed(1),
        WorkflowEvent::JobReleased {
            job: "cells".into(),
            index: Some(1),
            job_id: id(11),
            site: "hpc-eu".into(),
            attempt: 1,
            batch: None,
        },
        WorkflowEvent::JobReleased {
            job: "cells".into(),
            index: Some(2),
            job_id: id(12),
            site: "hpc-eu".into(),
            attempt: 1,
            batch: None,
        },
        settled("cells", Some(2), 12, JobOutcome::Succeeded),
    ])
    .state()
    .clone();
    assert_eq!(wf.runnable_jobs(), tasks(&[("cells", Some(3))]));
    let wf = given_state(wf)
        .when(
            settle(
                11,
                JobOutcome::Failed {
                    reason: FailureReason::Lost,
                },
            ),
            at(1, 0),
        )
        .then_ok()
        .1;
    assert_eq!(
        wf.runnable_jobs(),
        tasks(&[("cells", Some(1)), ("cells", Some(3))])
    );
    given_state(wf)
        .when(release("cells", Some(1), 21), at(1, 1))
        .then(vec![WorkflowEvent::JobReleased {
            job: "cells".into(),
            index: Some(1),
            job_id: id(21),
            site: "hpc-eu".into(),
            attempt: 2,
            batch: None,
        }]);
}

#[test]
fn a_failed_event_names_at_most_a_hundred_tasks() {
    let spec = spec_with_jobs(json!({
        "cells": {
            "image": "host",
            "command": ["false"],
            "array": {"start": 1, "end": 150, "parallelism": 150}
        }
    }));
    let mut wf = given::<Workflow>([
        WorkflowEvent::Submitted {
            workflow_id: id(WORKFLOW),
            name: "w".into(),
            spec,
            submitted_by: "ada".into(),
            idempotency_key: None,
            parent_workflow_id: None,
        },
        placed(1),
    ])
    .state()
    .clone();
    for i in 1..=150u32 {
        wf.execute(release("cells", Some(i), u128::from(i)), at(1, 0))
            .unwrap();
    }
    let mut last = Vec::new();
    for i in 1..=150u32 {
        last = wf
            .execute(settle(u128::from(i), exit1()), at(2, 0))
            .unwrap();
    }
    match last.as_slice() {
        [WorkflowEvent::JobSettled { .. }, WorkflowEvent::Failed {
            reason,
            failed_jobs,
            ..
        }] => {
            assert_eq!(reason, "cells[1] and 149 other task(s) failed");
            assert_eq!(failed_jobs.len(), 100);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(wf.failed_jobs().len(), 150);
}

/// A placement that runs `train` at aws-us-east-1 and the rest at hpc-eu.
fn split_cmd() -> WorkflowCommand {
    use meridian_events::vocabulary::workflow::{JobPlacement, SplitPlan, Verdict};
    let mut cmd = place_cmd();
    if let WorkflowCommand::RecordPlacement {
        explanation,
        job_sites,
        storage_rates,
        job_rates,
        ..
    } = &mut cmd
    {
        for c in &mut explanation.candidates {
            if c.verdict == Verdict::Chosen {
                c.verdict = Verdict::Fitted;
            }
        }
        let at = |job: &str, site: &str| JobPlacement {
            job: job.into(),
            site: site.into(),
            offer: "gpu".into(),
            compute: dec("1"),
        };
        explanation.split = Some(SplitPlan {
            verdict: Verdict::Chosen,
            jobs: vec![
                at("prep", "hpc-eu"),
                at("train", "aws-us-east-1"),
                at("sweep", "hpc-eu"),
                at("eval", "hpc-eu"),
            ],
            moves: Vec::new(),
            cost: None,
        });
        job_sites.insert("train".into(), "aws-us-east-1".into());
        storage_rates.insert("aws-us-east-1".into(), storage_rate());
        job_rates.insert("train".into(), hpc_rate());
    }
    cmd
}

#[test]
fn a_split_placement_sends_each_job_to_its_site() {
    let wf = given::<Workflow>([submitted()])
        .when(split_cmd(), at(0, 1))
        .then_ok()
        .1;
    let placement = wf.placement().unwrap();
    assert_eq!(placement.site_for("train"), "aws-us-east-1");
    assert_eq!(placement.site_for("prep"), "hpc-eu");
    assert_eq!(placement.sites(), ["hpc-eu", "aws-us-east-1"]);
    assert!(placement.storage_rate_at("aws-us-east-1").is_some());
    assert!(placement.storage_rate_at("elsewhere").is_none());
}

type PlacementFields<'a> = (
    &'a mut BTreeMap<String, String>,
    &'a mut BTreeMap<String, meridian_events::StorageRate>,
    &'a mut BTreeMap<String, meridian_events::ComputeRate>,
    &'a mut meridian_events::vocabulary::workflow::PlacementExplanation,
    &'a mut String,
);

fn fields(cmd: &mut WorkflowCommand) -> PlacementFields<'_> {
    match cmd {
        WorkflowCommand::RecordPlacement {
            job_sites,
            storage_rates,
            job_rates,
            explanation,
            site,
            ..
        } => (job_sites, storage_rates, job_rates, explanation, site),
        _ => unreachable!(),
    }
}

#[test]
fn an_inconsistent_split_placement_is_refused() {
    let refused = |change: &dyn Fn(&mut WorkflowCommand)| {
        let mut cmd = split_cmd();
        change(&mut cmd);
        let e = given::<Workflow>([submitted()])
            .when(cmd, at(0, 1))
            .then_err(|e| matches!(e, WorkflowError::InvalidPlacement { .. }));
        e.to_string()
    };
    let e = refused(&|c| {
        fields(c).0.clear();
    });
    assert!(e.contains("places every job at one site"), "{e}");
    let e = refused(&|c| {
        fields(c).0.insert("eval".into(), "aws-us-east-1".into());
        fields(c).2.insert("eval".into(), hpc_rate());
    });
    assert!(
        e.contains("job eval runs at \"hpc-eu\" in the split plan"),
        "{e}"
    );
    let e = refused(&|c| {
        fields(c).2.remove("train");
    });
    assert!(e.contains("without a rate of its own"), "{e}");
    let e = refused(&|c| {
        fields(c).1.clear();
    });
    assert!(
        e.contains("no storage rate for site \"aws-us-east-1\""),
        "{e}"
    );
    let e = refused(&|c| {
        fields(c).1.get_mut("aws-us-east-1").unwrap().currency = Currency::EUR;
    });
    assert!(e.contains("not in USD"), "{e}");
    let e = refused(&|c| {
        *fields(c).4 = "aws-us-east-1".into();
    });
    assert!(e.contains("first job runs elsewhere"), "{e}");
    // Jobs at several sites need a chosen split plan.
    let e = refused(&|c| {
        fields(c).3.split = None;
    });
    assert!(e.contains("without a chosen split plan"), "{e}");
}

// --- Arrays released as one batch ------------------------------------------------------

fn release_array(job: &str, tasks: &[(u32, u128)], batch: u128, cap: u32) -> WorkflowCommand {
    WorkflowCommand::ReleaseArray {
        job: job.into(),
        tasks: tasks.iter().map(|(i, j)| (*i, id(*j))).collect(),
        site: "hpc-eu".into(),
        batch_id: id(batch),
        cap,
    }
}

fn released_in(
    job: &str,
    (index, job_id): (u32, u128),
    attempt: u32,
    (batch, position, size, cap): (u128, u32, u32, u32),
) -> WorkflowEvent {
    WorkflowEvent::JobReleased {
        job: job.into(),
        index: Some(index),
        job_id: id(job_id),
        site: "hpc-eu".into(),
        attempt,
        batch: Some(meridian_events::ArrayBatch {
            id: id(batch),
            position,
            size,
            cap,
        }),
    }
}

#[test]
fn a_whole_array_goes_as_one_batch_held_to_its_cap_by_the_site() {
    let wf = given::<Workflow>([submitted(), placed(1)]).state().clone();
    let wf = run_ok(wf, "prep", None, 10);
    // sweep is 1..=5 with a parallelism of 2: all five go, capped at 2.
    assert_eq!(
        wf.next_array_batch("sweep", 1000),
        Some((vec![1, 2, 3, 4, 5], 2))
    );
    assert_eq!(wf.next_array_batch("sweep", 3), Some((vec![1, 2, 3], 2)));
    assert_eq!(wf.next_array_batch("train", 1000), None, "not an array");
    let all = [(1, 21), (2, 22), (3, 23), (4, 24), (5, 25)];
    let wf = given_state(wf)
        .when(release_array("sweep", &all, 99, 2), at(1, 10))
        .then(
            all.iter()
                .enumerate()
                .map(|(p, t)| released_in("sweep", *t, 1, (99, p as u32, 5, 2)))
                .collect(),
        );
    assert_eq!(wf.running_jobs().len(), 5, "the whole batch is in flight");
    assert_eq!(wf.runnable_jobs(), tasks(&[("train", None)]));
    assert_eq!(wf.next_array_batch("sweep", 1000), None, "nothing left");

    // Settled task by task, the workflow goes on as before.
    let mut wf = wf;
    for (i, job_id) in all {
        wf = given_state(wf)
            .when(settle(job_id, JobOutcome::Succeeded), at(2, i))
            .then(vec![settled(
                "sweep",
                Some(i),
                job_id,
                JobOutcome::Succeeded,
            )]);
    }
    let wf = run_ok(wf, "train", None, 30);
    assert_eq!(wf.runnable_jobs(), tasks(&[("eval", None)]));
}

#[test]
fn a_retry_goes_as_a_batch_of_one_within_the_free_slots() {
    let wf = given::<Workflow>([submitted(), placed(1)]).state().clone();
    let wf = run_ok(wf, "prep", None, 10);
    let all = [(1, 21), (2, 22), (3, 23), (4, 24), (5, 25)];
    let wf = given_state(wf)
        .when(release_array("sweep", &all, 99, 2), at(1, 10))
        .then_ok()
        .1;
    // Task 2 is preempted: back to pending, but four are still in flight (cap 2).
    let wf = given_state(wf)
        .when(
            settle(
                22,
                JobOutcome::Failed {
                    reason: FailureReason::Preempted,
                },
            ),
            at(2, 0),
        )
        .then_ok()
        .1;
    assert_eq!(wf.next_array_batch("sweep", 1000), None, "no free slot");
    let err = given_state(wf.clone())
        .when(release_array("sweep", &[(2, 32)], 98, 1), at(2, 1))
        .then_err(|e| matches!(e, WorkflowError::InvalidArrayBatch { .. }));
    assert!(err.to_string().contains("free slots"), "{err}");
    // Three settle: one slot frees and the retry goes, as attempt 2, capped at 1.
    let mut wf = wf;
    for (i, job_id) in [(1, 21), (3, 23), (4, 24)] {
        wf = given_state(wf)
            .when(settle(job_id, JobOutcome::Succeeded), at(3, i))
            .then_ok()
            .1;
    }
    assert_eq!(wf.next_array_batch("sweep", 1000), Some((vec![2], 1)));
    given_state(wf)
        .when(release_array("sweep", &[(2, 32)], 98, 1), at(3, 10))
        .then(vec![released_in("sweep", (2, 32), 2, (98, 0, 1, 1))]);
}

#[test]
fn a_batch_that_breaks_the_rules_is_refused_and_changes_nothing() {
    let wf = given::<Workflow>([submitted(), placed(1)]).state().clone();
    let before = given_state(wf.clone())
        .when(release_array("sweep", &[(1, 21)], 99, 1), at(1, 0))
        .then_err(|e| matches!(e, WorkflowError::JobNotRunnable { .. }));
    assert!(before.to_string().contains("requires"), "{before}");
    let wf = run_ok(wf, "prep", None, 10);
    let refused = |cmd: WorkflowCommand, what: &str| {
        let err = given_state(wf.clone())
            .when(cmd, at(1, 0))
            .then_err(|_| true);
        assert!(err.to_string().contains(what), "{what}: {err}");
    };
    refused(release_array("train", &[(1, 21)], 99, 1), "not an array");
    refused(release_array("sweep", &[], 99, 1), "1 to 1000 tasks");
    refused(release_array("sweep", &[(2, 21), (1, 22)], 99, 1), "ascend");
    refused(release_array("sweep", &[(1, 21), (1, 22)], 99, 1), "ascend");
    refused(release_array("sweep", &[(6, 21)], 99, 1), "1..=5");
    refused(
        release_array("sweep", &[(1, 21), (2, 21)], 99, 1),
        "already released",
    );
    refused(
        release_array("sweep", &[(1, 10)], 99, 1),
        "already released",
    );
    refused(
        release_array("sweep", &[(1, 21), (2, 22)], 99, 3),
        "cap must be",
    );
    refused(
        release_array("sweep", &[(1, 21), (2, 22)], 99, 0),
        "cap must be",
    );
    let wf = given_state(wf)
        .when(release_array("sweep", &[(1, 21)], 99, 1), at(1, 0))
        .then_ok()
        .1;
    let err = given_state(wf)
        .when(release_array("sweep", &[(1, 31)], 98, 1), at(1, 0))
        .then_err(|e| matches!(e, WorkflowError::JobNotRunnable { .. }));
    assert!(err.to_string().contains("already released"), "{err}");
}

#[test]
fn a_thousand_task_array_in_batches_never_runs_past_its_cap() {
    let spec = spec_with_jobs(json!({
        "cells": {
            "image": "host",
            "command": ["sh", "-c", "echo ${ARRAY_INDEX}"],
            "array": {"start": 1, "end": 1000, "parallelism": 50}
        }
    }));
    let mut wf = Workflow::default();
    let mut log = wf
        .execute(
            WorkflowCommand::Submit {
                workflow_id: id(WORKFLOW),
                spec,
                submitted_by: "ada".into(),
                idempotency_key: None,
                parent_workflow_id: None,
            },
            at(0, 0),
        )
        .unwrap();
    log.extend(wf.execute(place_cmd(), at(0, 0)).unwrap());
    // The site takes at most 300 tasks a submission and runs each batch's tasks in
    // order, at most its cap at once: the model of a scheduler honouring `%cap`.
    let mut next_id = 10_000u128;
    let mut batches: Vec<(u32, Vec<Uuid>)> = Vec::new();
    let mut submissions = 0;
    let mut retried = std::collections::BTreeSet::new();
    while matches!(
        wf.state(),
        Some(WorkflowState::Running | WorkflowState::Placed)
    ) {
        while let Some((indices, cap)) = wf.next_array_batch("cells", 300) {
            let tasks: Vec<(u32, Uuid)> = indices
                .iter()
                .map(|i| {
                    next_id += 1;
                    (*i, id(next_id))
                })
                .collect();
            next_id += 1;
            log.extend(
                wf.execute(
                    WorkflowCommand::ReleaseArray {
                        job: "cells".into(),
                        tasks: tasks.clone(),
                        site: "hpc-eu".into(),
                        batch_id: id(next_id),
                        cap,
                    },
                    at(1, 0),
                )
                .unwrap(),
            );
            batches.push((cap, tasks.into_iter().map(|t| t.1).collect()));
            submissions += 1;
        }
        // What the site runs now: the first `cap` unsettled tasks of each batch.
        let running: Vec<Uuid> = batches
            .iter()
            .flat_map(|(cap, ids)| {
                ids.iter()
                    .filter(|j| wf.running_jobs().contains_key(*j))
                    .take(*cap as usize)
                    .copied()
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(running.len() <= 50, "{} run at once", running.len());
        let job_id = running[0];
        let index = wf.running_jobs()[&job_id].index.unwrap();
        let outcome = if index % 100 == 0 && retried.insert(index) {
            JobOutcome::Failed {
                reason: FailureReason::Preempted,
            }
        } else {
            JobOutcome::Succeeded
        };
        log.extend(
            wf.execute(WorkflowCommand::SettleJob { job_id, outcome }, at(2, 0))
                .unwrap(),
        );
    }
    assert_eq!(wf.state(), Some(WorkflowState::Finished));
    // 1000 tasks at 300 a submission, and the retries in batches of their own: far
    // fewer submissions than tasks.
    assert!(
        (4..=20).contains(&submissions),
        "{submissions} submissions for 1000 tasks"
    );
    assert_eq!(Workflow::load(&log).state(), Some(WorkflowState::Finished));
}
