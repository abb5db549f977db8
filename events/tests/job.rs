//! The Job aggregate, given events / when a command / then events or an error.

mod common;

use common::*;
use meridian_events::aggregate::testing::given;
use meridian_events::aggregate::{Job, JobCommand, JobError, JobState};
use meridian_events::vocabulary::Usage;
use meridian_events::{Aggregate, FailureReason, JobEvent, JobOutcome, Money};

fn resources() -> meridian_spec::Resources {
    spec().jobs["train"].resources.clone()
}

fn dispatched() -> JobEvent {
    JobEvent::Dispatched {
        workflow_id: id(WORKFLOW),
        job: "train".into(),
        index: None,
        attempt: 1,
        site: "hpc-eu".into(),
        rate: hpc_rate(),
        resources: resources(),
        batch: None,
    }
}

fn on_site() -> JobEvent {
    JobEvent::SubmittedToSite {
        backend_job_id: "4242".into(),
        submitted_at: at(1, 0),
    }
}

fn started() -> JobEvent {
    JobEvent::Started {
        started_at: at(1, 0),
        allocated: gpu_allocation(),
        hosts: vec!["gpu017".into()],
    }
}

fn usage() -> Usage {
    Usage {
        cpu_seconds: Some(dec("1234.5")),
        max_rss_bytes: Some(1 << 35),
        gpu_seconds: None,
        billed: None,
    }
}

fn finished() -> JobEvent {
    JobEvent::Finished {
        workflow_id: id(WORKFLOW),
        site: "hpc-eu".into(),
        rate: hpc_rate(),
        started_at: at(1, 0),
        ended_at: at(3, 0),
        exit_code: 0,
        allocated: gpu_allocation(),
        usage: usage(),
    }
}

fn finish(exit_code: i32) -> JobCommand {
    JobCommand::Finish {
        ended_at: at(3, 0),
        exit_code,
        usage: usage(),
    }
}

#[test]
fn dispatch_submit_start_finish() {
    given::<Job>([])
        .when(
            JobCommand::Dispatch {
                workflow_id: id(WORKFLOW),
                job: "train".into(),
                index: None,
                attempt: 1,
                site: "hpc-eu".into(),
                rate: hpc_rate(),
                resources: resources(),
                batch: None,
            },
            at(0, 59),
        )
        .then(vec![dispatched()]);
    given::<Job>([dispatched()])
        .when(
            JobCommand::RecordSubmission {
                backend_job_id: "4242".into(),
            },
            at(1, 0),
        )
        .then(vec![on_site()]);
    given::<Job>([dispatched(), on_site()])
        .when(
            JobCommand::Start {
                started_at: at(1, 0),
                allocated: gpu_allocation(),
                hosts: vec!["gpu017".into()],
            },
            at(1, 1),
        )
        .then(vec![started()]);
    let job = given::<Job>([dispatched(), on_site(), started()])
        .when(finish(0), at(3, 1))
        .then(vec![finished()]);
    assert_eq!(job.state(), Some(JobState::Finished));
    assert_eq!(job.outcome(), Some(&JobOutcome::Succeeded));
    assert_eq!(job.backend_job_id(), Some("4242"));
}

#[test]
fn a_finished_run_bills_its_allocation_at_the_dispatch_rate() {
    // 2 h × (96 cores × 0.01 + 1024 GiB × 0.002 + 8 GPUs × 2.50) = 2 × 23.008 = 46.016
    let cost = finished().compute_cost().unwrap().unwrap();
    assert_eq!(cost, Money::new(dec("46.016"), usd()));
    assert_eq!(dispatched().compute_cost(), None);
}

#[test]
fn a_non_zero_exit_fails_the_run() {
    given::<Job>([dispatched(), started()])
        .when(finish(137), at(3, 1))
        .then(vec![JobEvent::Failed {
            workflow_id: id(WORKFLOW),
            site: "hpc-eu".into(),
            rate: hpc_rate(),
            started_at: Some(at(1, 0)),
            ended_at: at(3, 0),
            exit_code: Some(137),
            reason: FailureReason::ExitCode { code: 137 },
            allocated: Some(gpu_allocation()),
            usage: usage(),
        }]);
}

#[test]
fn a_run_may_fail_before_it_starts() {
    let job = given::<Job>([dispatched()])
        .when(
            JobCommand::Fail {
                ended_at: at(1, 0),
                exit_code: None,
                reason: FailureReason::SiteRefused {
                    message: "QOSMaxGRESPerUser".into(),
                },
                usage: Usage::default(),
            },
            at(1, 0),
        )
        .then_ok()
        .1;
    match job.outcome() {
        Some(JobOutcome::Failed { reason }) => assert!(reason.is_site_fault()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_run_its_site_bills_before_it_started_carries_what_it_was_dispatched_with() {
    use meridian_events::vocabulary::BilledInterval;
    let billed = Usage {
        billed: Some(BilledInterval {
            from: at(1, 0),
            to: at(1, 30),
        }),
        ..Usage::default()
    };
    let (events, _) = given::<Job>([dispatched(), on_site()])
        .when(
            JobCommand::Fail {
                ended_at: at(1, 30),
                exit_code: None,
                reason: FailureReason::Preempted,
                usage: billed.clone(),
            },
            at(1, 30),
        )
        .then_ok();
    let JobEvent::Failed {
        started_at,
        allocated: Some(allocated),
        ..
    } = &events[0]
    else {
        panic!("{events:?}")
    };
    assert_eq!(*started_at, None);
    let r = resources();
    assert_eq!(allocated.nodes, r.nodes);
    assert_eq!(allocated.cpus, r.cpus * r.nodes);
    assert_eq!(
        allocated.memory_bytes,
        r.memory.bytes() * u64::from(r.nodes)
    );
    // Not billed by its site: nothing to charge, as before.
    let (events, _) = given::<Job>([dispatched()])
        .when(
            JobCommand::Cancel {
                ended_at: at(1, 0),
                usage: Usage::default(),
            },
            at(1, 0),
        )
        .then_ok();
    assert!(
        matches!(
            &events[0],
            JobEvent::Cancelled {
                allocated: None,
                ..
            }
        ),
        "{events:?}"
    );
}

#[test]
fn finishing_a_run_never_started_is_refused() {
    given::<Job>([dispatched(), on_site()])
        .when(finish(0), at(3, 0))
        .then_err(|e| *e == JobError::NotStarted);
}

#[test]
fn starting_twice_is_refused() {
    given::<Job>([dispatched(), started()])
        .when(
            JobCommand::Start {
                started_at: at(1, 0),
                allocated: gpu_allocation(),
                hosts: vec![],
            },
            at(1, 1),
        )
        .then_err(|e| *e == JobError::AlreadyStarted);
}

#[test]
fn nothing_follows_a_terminal_state() {
    let done = [dispatched(), on_site(), started(), finished()];
    given::<Job>(done.clone())
        .when(finish(0), at(3, 2))
        .then_err(|e| {
            *e == JobError::AlreadyTerminal {
                state: JobState::Finished,
            }
        });
    // Cancelling a finished job.
    given::<Job>(done.clone())
        .when(
            JobCommand::Cancel {
                ended_at: at(3, 3),
                usage: Usage::default(),
            },
            at(3, 3),
        )
        .then_err(|e| {
            *e == JobError::AlreadyTerminal {
                state: JobState::Finished,
            }
        });
    given::<Job>(done)
        .when(
            JobCommand::RequestCancel {
                by: "ada".into(),
                reason: None,
            },
            at(3, 3),
        )
        .then_err(|e| matches!(e, JobError::AlreadyTerminal { .. }));
}

#[test]
fn commands_before_dispatch_are_refused() {
    given::<Job>([])
        .when(finish(0), at(3, 0))
        .then_err(|e| *e == JobError::NotDispatched);
    given::<Job>([dispatched()])
        .when(
            JobCommand::Dispatch {
                workflow_id: id(WORKFLOW),
                job: "train".into(),
                index: None,
                attempt: 1,
                site: "hpc-eu".into(),
                rate: hpc_rate(),
                resources: resources(),
                batch: None,
            },
            at(1, 0),
        )
        .then_err(|e| *e == JobError::AlreadyDispatched);
    given::<Job>([dispatched(), on_site()])
        .when(
            JobCommand::RecordSubmission {
                backend_job_id: "4243".into(),
            },
            at(1, 0),
        )
        .then_err(|e| *e == JobError::AlreadySubmittedToSite);
}

#[test]
fn a_run_cannot_end_before_it_started() {
    given::<Job>([dispatched(), started()])
        .when(
            JobCommand::Finish {
                ended_at: at(0, 30),
                exit_code: 0,
                usage: Usage::default(),
            },
            at(1, 1),
        )
        .then_err(|e| matches!(e, JobError::EndsBeforeStart { .. }));
}

#[test]
fn cancel_is_requested_once_then_confirmed_with_what_ran() {
    let job = given::<Job>([dispatched(), started()])
        .when(
            JobCommand::RequestCancel {
                by: "ada".into(),
                reason: Some("wrong data".into()),
            },
            at(2, 0),
        )
        .then(vec![JobEvent::CancelRequested {
            by: "ada".into(),
            reason: Some("wrong data".into()),
            requested_at: at(2, 0),
        }]);
    assert!(job.cancel_requested());
    let requested = JobEvent::CancelRequested {
        by: "ada".into(),
        reason: None,
        requested_at: at(2, 0),
    };
    given::<Job>([dispatched(), started(), requested.clone()])
        .when(
            JobCommand::RequestCancel {
                by: "ada".into(),
                reason: None,
            },
            at(2, 1),
        )
        .then_err(|e| *e == JobError::CancelAlreadyRequested);
    let cancelled = JobEvent::Cancelled {
        workflow_id: id(WORKFLOW),
        site: "hpc-eu".into(),
        rate: hpc_rate(),
        started_at: Some(at(1, 0)),
        ended_at: at(2, 0),
        allocated: Some(gpu_allocation()),
        usage: Usage::default(),
    };
    given::<Job>([dispatched(), started(), requested])
        .when(
            JobCommand::Cancel {
                ended_at: at(2, 0),
                usage: Usage::default(),
            },
            at(2, 1),
        )
        .then(vec![cancelled.clone()]);
    // The hour it ran is billed: 23.008 USD.
    assert_eq!(
        cancelled.compute_cost().unwrap().unwrap(),
        Money::new(dec("23.008"), usd())
    );
    let job = Job::load(&[dispatched(), started(), cancelled]);
    assert_eq!(job.outcome(), Some(&JobOutcome::Cancelled));
}

/// A site that bills another stretch than the run (a cloud instance, launch to
/// terminate) has compute charged for that stretch; one that ends before it starts is
/// refused and records nothing.
#[test]
fn compute_is_charged_for_the_billed_stretch_when_the_site_gives_one() {
    use meridian_events::vocabulary::BilledInterval;
    let billed = BilledInterval {
        from: at(0, 30),
        to: at(3, 30),
    };
    let mut with_billed = usage();
    with_billed.billed = Some(billed);
    let (events, _) = given::<Job>([dispatched(), started()])
        .when(
            JobCommand::Finish {
                ended_at: at(3, 0),
                exit_code: 0,
                usage: with_billed,
            },
            at(3, 0),
        )
        .then_ok();
    let run_only = finished().compute_cost().unwrap().unwrap();
    let charged = events[0].compute_cost().unwrap().unwrap();
    // Three billed hours against two run hours, at the same rate.
    assert_eq!(
        charged.amount * rust_decimal::Decimal::from(2),
        run_only.amount * rust_decimal::Decimal::from(3)
    );

    let mut backwards = usage();
    backwards.billed = Some(BilledInterval {
        from: at(3, 30),
        to: at(0, 30),
    });
    given::<Job>([dispatched(), started()])
        .when(
            JobCommand::Finish {
                ended_at: at(3, 0),
                exit_code: 0,
                usage: backwards,
            },
            at(3, 0),
        )
        .then_err(|e| matches!(e, JobError::BilledBackwards { .. }));
}

#[test]
fn the_reason_a_site_holds_a_run_back_is_recorded_when_it_changes_and_forgotten_at_start() {
    let waiting = |reason: &str| JobCommand::RecordWaiting {
        reason: reason.into(),
    };
    let job = given::<Job>([dispatched(), on_site()])
        .when(
            waiting("Unschedulable: 0/3 nodes have a free GPU"),
            at(1, 0),
        )
        .then(vec![JobEvent::Waiting {
            reason: "Unschedulable: 0/3 nodes have a free GPU".into(),
        }]);
    assert_eq!(
        job.waiting(),
        Some("Unschedulable: 0/3 nodes have a free GPU")
    );
    // The same reason again says nothing new.
    given::<Job>([
        dispatched(),
        on_site(),
        JobEvent::Waiting {
            reason: "Priority".into(),
        },
    ])
    .when(waiting("Priority"), at(1, 0))
    .then(vec![]);
    let job = given::<Job>([
        dispatched(),
        on_site(),
        JobEvent::Waiting {
            reason: "Priority".into(),
        },
        started(),
    ])
    .when(waiting("Resources"), at(1, 0));
    job.then_err(|e| matches!(e, JobError::AlreadyStarted));
    let mut started_job = Job::default();
    for e in [
        dispatched(),
        on_site(),
        JobEvent::Waiting {
            reason: "Priority".into(),
        },
        started(),
    ] {
        started_job.apply(&e);
    }
    assert_eq!(started_job.waiting(), None);
}
