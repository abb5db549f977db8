//! Volume data before jobs: a job that mounts a volume with ingress is released only
//! once the data mover recorded the volume staged at the job's site; a staging that
//! failed keeps those jobs from running and fails the workflow with the reason.

mod common;

use common::*;
use meridian_events::aggregate::testing::{given, given_state};
use meridian_events::aggregate::workflow::DataWait;
use meridian_events::aggregate::{Workflow, WorkflowCommand, WorkflowError, WorkflowState};
use meridian_events::vocabulary::workflow::StorageClass;
use meridian_events::{JobOutcome, TaskRef, WorkflowEvent};
use serde_json::json;

fn spec() -> meridian_spec::Workflow {
    serde_json::from_value(json!({
        "version": "v1",
        "name": "with-data",
        "volumes": {
            "data": {"size": "1GiB", "ingress": [{"source": "https://example.org/x.csv", "destination": "/in/"}]},
            "scratch": {"size": "1GiB"}
        },
        "jobs": {
            "read": {"image": "host", "command": ["true"], "mounts": {"data": "/data", "scratch": "/s"}},
            "free": {"image": "host", "command": ["true"], "mounts": {"scratch": "/s"}},
            "after": {"requires": ["read"], "image": "host", "command": ["true"]}
        }
    }))
    .unwrap()
}

fn submitted() -> WorkflowEvent {
    WorkflowEvent::Submitted {
        workflow_id: id(WORKFLOW),
        name: "with-data".into(),
        spec: spec(),
        submitted_by: "ada".into(),
        idempotency_key: None,
        parent_workflow_id: None,
    }
}

fn allocated(volume: &str) -> WorkflowEvent {
    WorkflowEvent::VolumeAllocated {
        volume: volume.into(),
        class: StorageClass::Volume,
        site: "hpc-eu".into(),
        bytes: 1 << 30,
        rate: storage_rate(),
        allocated_at: at(0, 1),
    }
}

fn held() -> Vec<WorkflowEvent> {
    vec![
        submitted(),
        placed_event(1),
        allocated("data"),
        allocated("scratch"),
    ]
}

fn staged() -> WorkflowCommand {
    WorkflowCommand::RecordVolumeStaged {
        volume: "data".into(),
        site: "hpc-eu".into(),
        transfers: vec![id(70)],
    }
}

#[test]
fn a_job_waits_for_its_volume_data_and_goes_once_staged() {
    let wf = given::<Workflow>(held()).state().clone();
    assert_eq!(wf.runnable_jobs(), vec![TaskRef::new("free", None)]);
    assert_eq!(
        wf.waiting_for_data(),
        Some((
            "read".into(),
            DataWait::Staging {
                volume: "data".into(),
                site: "hpc-eu".into()
            }
        ))
    );
    let err = given_state(wf.clone())
        .when(
            WorkflowCommand::ReleaseJob {
                job: "read".into(),
                index: None,
                job_id: id(10),
                site: "hpc-eu".into(),
            },
            at(0, 2),
        )
        .then_err(|e| matches!(e, WorkflowError::JobNotRunnable { .. }));
    assert!(
        err.to_string()
            .contains("waiting for the data of volume data to arrive at hpc-eu"),
        "{err}"
    );
    let wf = given_state(wf)
        .when(staged(), at(0, 3))
        .then(vec![WorkflowEvent::VolumeStaged {
            volume: "data".into(),
            site: "hpc-eu".into(),
            transfers: vec![id(70)],
        }]);
    assert_eq!(
        wf.runnable_jobs(),
        vec![TaskRef::new("free", None), TaskRef::new("read", None)]
    );
    assert_eq!(wf.waiting_for_data(), None);
    // Recorded once; a volume without ingress has nothing to stage.
    given_state(wf.clone())
        .when(staged(), at(0, 4))
        .then_err(|e| matches!(e, WorkflowError::AlreadyStaged { .. }));
    given_state(wf)
        .when(
            WorkflowCommand::RecordVolumeStaged {
                volume: "scratch".into(),
                site: "hpc-eu".into(),
                transfers: vec![],
            },
            at(0, 4),
        )
        .then_err(|e| matches!(e, WorkflowError::NoIngress { .. }));
}

#[test]
fn staging_needs_the_volume_held_at_that_site() {
    given::<Workflow>([submitted(), placed_event(1)])
        .when(staged(), at(0, 3))
        .then_err(|e| matches!(e, WorkflowError::VolumeNotAllocated { .. }));
}

#[test]
fn a_failed_staging_fails_what_needs_it_and_then_the_workflow() {
    let wf = given::<Workflow>(held()).state().clone();
    // `free` runs meanwhile; the failure waits for it.
    let wf = given_state(wf)
        .when(
            WorkflowCommand::ReleaseJob {
                job: "free".into(),
                index: None,
                job_id: id(11),
                site: "hpc-eu".into(),
            },
            at(0, 2),
        )
        .then_ok()
        .1;
    let fail = WorkflowCommand::FailVolumeStaging {
        volume: "data".into(),
        site: "hpc-eu".into(),
        reason: "https://example.org/x.csv: the server answered 404 Not Found".into(),
    };
    let wf = given_state(wf)
        .when(fail, at(0, 3))
        .then(vec![WorkflowEvent::VolumeStagingFailed {
            volume: "data".into(),
            site: "hpc-eu".into(),
            reason: "https://example.org/x.csv: the server answered 404 Not Found".into(),
        }]);
    assert!(wf.runnable_jobs().is_empty(), "read (and after) never run");
    let (events, _) = given_state(wf)
        .when(
            WorkflowCommand::SettleJob {
                job_id: id(11),
                outcome: JobOutcome::Succeeded,
            },
            at(0, 4),
        )
        .then_ok();
    let Some(WorkflowEvent::Failed { reason, .. }) = events.last() else {
        panic!("the workflow fails once nothing runs: {events:?}")
    };
    assert_eq!(
        reason,
        "the data of volume data could not be brought to hpc-eu: https://example.org/x.csv: the server answered 404 Not Found"
    );
}

#[test]
fn with_nothing_running_a_failed_staging_ends_the_workflow_at_once() {
    let (events, wf) = given::<Workflow>(held())
        .when(
            WorkflowCommand::FailVolumeStaging {
                volume: "data".into(),
                site: "hpc-eu".into(),
                reason: "gone".into(),
            },
            at(0, 3),
        )
        .then_ok();
    // `free` could still run: the workflow goes on for it.
    assert_eq!(wf.state(), Some(WorkflowState::Placed));
    assert_eq!(events.len(), 1);
    assert_eq!(wf.runnable_jobs(), vec![TaskRef::new("free", None)]);
}

#[test]
fn data_given_back_is_gone() {
    let mut events = held();
    events.push(WorkflowEvent::VolumeStaged {
        volume: "data".into(),
        site: "hpc-eu".into(),
        transfers: vec![],
    });
    events.push(WorkflowEvent::VolumeReleased {
        volume: "data".into(),
        class: StorageClass::Volume,
        site: "hpc-eu".into(),
        bytes: 1 << 30,
        rate: storage_rate(),
        allocated_at: at(0, 1),
        released_at: at(0, 5),
    });
    let wf = given::<Workflow>(events).state().clone();
    assert!(!wf.is_staged("data", "hpc-eu"));
    assert!(matches!(
        wf.data_wait("read"),
        Some(DataWait::Staging { .. })
    ));
}

// --- Egress: outputs are copied out before the workflow finishes ------------------------

fn out_spec() -> meridian_spec::Workflow {
    serde_json::from_value(json!({
        "version": "v1",
        "name": "with-outputs",
        "volumes": {
            "results": {"size": "1GiB", "egress": [{"source": "/out/", "destination": "s3://results/run-1/"}]}
        },
        "jobs": {
            "write": {"image": "host", "command": ["true"], "mounts": {"results": "/r"}}
        }
    }))
    .unwrap()
}

fn with_outputs_running() -> Workflow {
    let events = vec![
        WorkflowEvent::Submitted {
            workflow_id: id(WORKFLOW),
            name: "with-outputs".into(),
            spec: out_spec(),
            submitted_by: "ada".into(),
            idempotency_key: None,
            parent_workflow_id: None,
        },
        placed_event(1),
        allocated("results"),
        WorkflowEvent::JobReleased {
            job: "write".into(),
            index: None,
            job_id: id(20),
            site: "hpc-eu".into(),
            attempt: 1,
            batch: None,
        },
    ];
    given::<Workflow>(events).state().clone()
}

fn results_at() -> meridian_events::vocabulary::workflow::VolumeAt {
    meridian_events::vocabulary::workflow::VolumeAt {
        volume: "results".into(),
        site: "hpc-eu".into(),
    }
}

#[test]
fn outputs_are_copied_out_before_the_workflow_finishes() {
    let wf = given_state(with_outputs_running())
        .when(
            WorkflowCommand::SettleJob {
                job_id: id(20),
                outcome: JobOutcome::Succeeded,
            },
            at(1, 0),
        )
        .then(vec![
            WorkflowEvent::JobSettled {
                job: "write".into(),
                index: None,
                job_id: id(20),
                outcome: JobOutcome::Succeeded,
                retry: false,
            },
            WorkflowEvent::EgressDue {
                volumes: vec![results_at()],
            },
        ]);
    assert_eq!(wf.state(), Some(WorkflowState::Running), "not finished yet");
    assert_eq!(wf.egress_due(), vec![results_at()]);
    let wf = given_state(wf)
        .when(
            WorkflowCommand::RecordVolumeExported {
                volume: "results".into(),
                site: "hpc-eu".into(),
                transfers: vec![id(80)],
            },
            at(1, 5),
        )
        .then(vec![
            WorkflowEvent::VolumeExported {
                volume: "results".into(),
                site: "hpc-eu".into(),
                transfers: vec![id(80)],
            },
            WorkflowEvent::Finished {
                finished_at: at(1, 5),
            },
        ]);
    assert_eq!(wf.state(), Some(WorkflowState::Finished));
}

#[test]
fn an_export_not_due_is_refused_and_a_failed_one_fails_the_workflow() {
    given_state(with_outputs_running())
        .when(
            WorkflowCommand::RecordVolumeExported {
                volume: "results".into(),
                site: "hpc-eu".into(),
                transfers: vec![],
            },
            at(0, 30),
        )
        .then_err(|e| matches!(e, WorkflowError::NoEgressDue { .. }));
    let (_, wf) = given_state(with_outputs_running())
        .when(
            WorkflowCommand::SettleJob {
                job_id: id(20),
                outcome: JobOutcome::Succeeded,
            },
            at(1, 0),
        )
        .then_ok();
    let wf = given_state(wf)
        .when(
            WorkflowCommand::FailVolumeExport {
                volume: "results".into(),
                site: "hpc-eu".into(),
                reason: "s3://results/run-1/: access denied".into(),
            },
            at(1, 5),
        )
        .then(vec![
            WorkflowEvent::VolumeExportFailed {
                volume: "results".into(),
                site: "hpc-eu".into(),
                reason: "s3://results/run-1/: access denied".into(),
            },
            WorkflowEvent::Failed {
                reason: "the outputs in volume results could not be copied out of hpc-eu: s3://results/run-1/: access denied (they are kept there until a retry copies them out or an admin releases them)".into(),
                failed_jobs: vec![],
                failed_at: at(1, 5),
            },
        ]);
    assert_eq!(wf.state(), Some(WorkflowState::Failed));
    // The outputs stay held (and billed) at the site.
    assert_eq!(wf.outputs_kept(), vec![results_at()]);
    assert!(wf.volumes_to_keep().contains(&results_at()));

    // Nothing else is kept to retry; the kept one is due again, and goes out, and the
    // workflow stays failed.
    given_state(wf.clone())
        .when(
            WorkflowCommand::RetryExport {
                volume: "scratch".into(),
            },
            at(2, 0),
        )
        .then_err(|e| matches!(e, WorkflowError::NoOutputsKept { .. }));
    let wf = given_state(wf)
        .when(
            WorkflowCommand::RetryExport {
                volume: "results".into(),
            },
            at(2, 0),
        )
        .then(vec![WorkflowEvent::EgressDue {
            volumes: vec![results_at()],
        }]);
    assert!(wf.outputs_kept().is_empty());
    assert_eq!(
        wf.volumes_to_keep(),
        vec![results_at()],
        "held while it copies"
    );
    let done = given_state(wf.clone())
        .when(
            WorkflowCommand::RecordVolumeExported {
                volume: "results".into(),
                site: "hpc-eu".into(),
                transfers: vec![id(81)],
            },
            at(2, 1),
        )
        .then(vec![WorkflowEvent::VolumeExported {
            volume: "results".into(),
            site: "hpc-eu".into(),
            transfers: vec![id(81)],
        }]);
    assert_eq!(done.state(), Some(WorkflowState::Failed));
    assert!(
        done.volumes_to_keep().is_empty(),
        "out: it can be given back"
    );
    // A retry that fails again keeps them, without failing the workflow twice.
    let again = given_state(wf)
        .when(
            WorkflowCommand::FailVolumeExport {
                volume: "results".into(),
                site: "hpc-eu".into(),
                reason: "still denied".into(),
            },
            at(2, 1),
        )
        .then(vec![WorkflowEvent::VolumeExportFailed {
            volume: "results".into(),
            site: "hpc-eu".into(),
            reason: "still denied".into(),
        }]);
    assert_eq!(again.outputs_kept(), vec![results_at()]);
}

/// A split workflow: `prep` at hpc-eu fills `data`, which moves to `gpu-site` before
/// `train` runs there, and goes out from there.
fn split_events() -> Vec<WorkflowEvent> {
    use meridian_events::vocabulary::workflow::{JobPlacement, SplitPlan, Verdict, VolumeMove};
    let spec: meridian_spec::Workflow = serde_json::from_value(json!({
        "version": "v1",
        "name": "split",
        "placement": {"split": true},
        "volumes": {
            "data": {"size": "1GiB", "egress": [{"source": "/model/", "destination": "s3://out/"}]}
        },
        "jobs": {
            "prep": {"image": "host", "command": ["true"], "mounts": {"data": "/data"}},
            "train": {"requires": ["prep"], "image": "host", "command": ["true"], "mounts": {"data": "/data"}}
        }
    }))
    .unwrap();
    let WorkflowEvent::PlacementDecided {
        attempt,
        site,
        region,
        rate,
        job_rates,
        storage_rate,
        estimated_cost,
        mut explanation,
        storage_rates,
        ..
    } = placed_event(1)
    else {
        unreachable!()
    };
    let job = |job: &str, site: &str| JobPlacement {
        job: job.into(),
        site: site.into(),
        offer: "node".into(),
        compute: rust_decimal::Decimal::ONE,
    };
    explanation.split = Some(SplitPlan {
        verdict: Verdict::Chosen,
        jobs: vec![job("prep", "hpc-eu"), job("train", "gpu-site")],
        moves: vec![VolumeMove {
            volume: "data".into(),
            from: "hpc-eu".into(),
            to: "gpu-site".into(),
            bytes: 1 << 30,
            before_job: "train".into(),
            cost: rust_decimal::Decimal::ZERO,
        }],
        cost: None,
    });
    explanation.candidates.iter_mut().for_each(|c| {
        if c.verdict == Verdict::Chosen {
            c.verdict = Verdict::Fitted;
        }
    });
    let at_site = |site: &str| WorkflowEvent::VolumeAllocated {
        volume: "data".into(),
        class: StorageClass::Volume,
        site: site.into(),
        bytes: 1 << 30,
        rate: storage_rate.clone(),
        allocated_at: at(0, 1),
    };
    vec![
        WorkflowEvent::Submitted {
            workflow_id: id(WORKFLOW),
            name: "split".into(),
            spec,
            submitted_by: "ada".into(),
            idempotency_key: None,
            parent_workflow_id: None,
        },
        WorkflowEvent::PlacementDecided {
            attempt,
            site,
            region,
            rate,
            job_rates,
            storage_rate: storage_rate.clone(),
            estimated_cost,
            explanation,
            job_sites: std::collections::BTreeMap::from([("train".into(), "gpu-site".into())]),
            storage_rates: storage_rates
                .into_iter()
                .chain([("gpu-site".to_string(), storage_rate.clone())])
                .collect(),
        },
        at_site("hpc-eu"),
        at_site("gpu-site"),
    ]
}

#[test]
fn a_volume_moves_to_the_next_site_once_the_jobs_that_fill_it_are_done() {
    let wf = given::<Workflow>(split_events()).state().clone();
    let the_move = wf.volume_move("data", "gpu-site").cloned().expect("a move");
    assert_eq!(the_move.from, "hpc-eu");
    assert!(
        wf.volume_move("data", "hpc-eu").is_none(),
        "nothing moves in at the start"
    );
    // prep runs without waiting: its site has no move in and the volume no ingress.
    assert_eq!(wf.runnable_jobs(), vec![TaskRef::new("prep", None)]);
    assert!(!wf.move_ready(&the_move), "prep has not run yet");
    // The copy out goes from where the volume ends, not from where it moved on.
    assert_eq!(
        wf.egress_pending(),
        vec![meridian_events::vocabulary::workflow::VolumeAt {
            volume: "data".into(),
            site: "gpu-site".into(),
        }]
    );

    let wf = given_state(wf)
        .when(
            WorkflowCommand::ReleaseJob {
                job: "prep".into(),
                index: None,
                job_id: id(30),
                site: "hpc-eu".into(),
            },
            at(0, 2),
        )
        .then_ok()
        .1;
    let wf = given_state(wf)
        .when(
            WorkflowCommand::SettleJob {
                job_id: id(30),
                outcome: JobOutcome::Succeeded,
            },
            at(0, 3),
        )
        .then_ok()
        .1;
    assert!(wf.move_ready(&the_move), "prep is done");
    // train waits for the moved data, and says so.
    assert!(wf.runnable_jobs().is_empty());
    assert_eq!(
        wf.waiting_for_data(),
        Some((
            "train".into(),
            DataWait::Staging {
                volume: "data".into(),
                site: "gpu-site".into()
            }
        ))
    );
    let wf = given_state(wf)
        .when(
            WorkflowCommand::RecordVolumeStaged {
                volume: "data".into(),
                site: "gpu-site".into(),
                transfers: vec![id(71)],
            },
            at(0, 4),
        )
        .then(vec![WorkflowEvent::VolumeStaged {
            volume: "data".into(),
            site: "gpu-site".into(),
            transfers: vec![id(71)],
        }]);
    assert_eq!(wf.runnable_jobs(), vec![TaskRef::new("train", None)]);
}

#[test]
fn a_volume_goes_out_once_the_last_job_that_mounts_it_ends_while_others_run_on() {
    let spec: meridian_spec::Workflow = serde_json::from_value(json!({
        "version": "v1",
        "name": "early-out",
        "volumes": {
            "results": {"size": "1GiB", "egress": [{"source": "/out/", "destination": "s3://results/run-1/"}]}
        },
        "jobs": {
            "write": {"image": "host", "command": ["true"], "mounts": {"results": "/r"}},
            "report": {"requires": ["write"], "image": "host", "command": ["true"]}
        }
    }))
    .unwrap();
    let running = given::<Workflow>(vec![
        WorkflowEvent::Submitted {
            workflow_id: id(WORKFLOW),
            name: "early-out".into(),
            spec,
            submitted_by: "ada".into(),
            idempotency_key: None,
            parent_workflow_id: None,
        },
        placed_event(1),
        allocated("results"),
        WorkflowEvent::JobReleased {
            job: "write".into(),
            index: None,
            job_id: id(20),
            site: "hpc-eu".into(),
            attempt: 1,
            batch: None,
        },
    ])
    .state()
    .clone();
    // write is done: its volume goes out now, though report has yet to run.
    let wf = given_state(running)
        .when(
            WorkflowCommand::SettleJob {
                job_id: id(20),
                outcome: JobOutcome::Succeeded,
            },
            at(1, 0),
        )
        .then(vec![
            WorkflowEvent::JobSettled {
                job: "write".into(),
                index: None,
                job_id: id(20),
                outcome: JobOutcome::Succeeded,
                retry: false,
            },
            WorkflowEvent::EgressDue {
                volumes: vec![results_at()],
            },
        ]);
    assert_eq!(wf.runnable_jobs(), vec![TaskRef::new("report", None)]);

    // A copy out that fails meanwhile fails nothing yet: report runs, and the workflow
    // fails, saying why, when it ends.
    let wf = given_state(wf)
        .when(
            WorkflowCommand::FailVolumeExport {
                volume: "results".into(),
                site: "hpc-eu".into(),
                reason: "access denied".into(),
            },
            at(1, 1),
        )
        .then(vec![WorkflowEvent::VolumeExportFailed {
            volume: "results".into(),
            site: "hpc-eu".into(),
            reason: "access denied".into(),
        }]);
    let wf = given_state(wf)
        .when(
            WorkflowCommand::ReleaseJob {
                job: "report".into(),
                index: None,
                job_id: id(21),
                site: "hpc-eu".into(),
            },
            at(1, 2),
        )
        .then_ok()
        .1;
    let wf = given_state(wf)
        .when(
            WorkflowCommand::SettleJob {
                job_id: id(21),
                outcome: JobOutcome::Succeeded,
            },
            at(1, 3),
        )
        .then(vec![
            WorkflowEvent::JobSettled {
                job: "report".into(),
                index: None,
                job_id: id(21),
                outcome: JobOutcome::Succeeded,
                retry: false,
            },
            WorkflowEvent::Failed {
                reason: "the outputs in volume results could not be copied out of hpc-eu: access denied (they are kept there until a retry copies them out or an admin releases them)".into(),
                failed_jobs: vec![],
                failed_at: at(1, 3),
            },
        ]);
    assert_eq!(wf.outputs_kept(), vec![results_at()]);
}
