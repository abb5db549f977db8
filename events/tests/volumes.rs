//! Storage on the Workflow aggregate: volumes and caches allocated at a site and
//! released, each release a complete storage charge.

mod common;

use common::*;
use meridian_events::aggregate::testing::given;
use meridian_events::aggregate::{Workflow, WorkflowCommand, WorkflowError, WorkflowState};
use meridian_events::vocabulary::workflow::StorageClass;
use meridian_events::{Aggregate, WorkflowEvent};
use serde_json::json;

const GIB: u64 = 1 << 30;

fn spec_with_volume() -> meridian_spec::Workflow {
    serde_json::from_value(json!({
        "version": "v1",
        "name": "with-data",
        "volumes": {"data": {"size": "200GiB"}},
        "jobs": {"a": {"image": "host", "command": ["true"]}}
    }))
    .unwrap()
}

fn submitted() -> WorkflowEvent {
    WorkflowEvent::Submitted {
        workflow_id: id(WORKFLOW),
        name: "with-data".into(),
        spec: spec_with_volume(),
        submitted_by: "ada".into(),
        idempotency_key: None,
        parent_workflow_id: None,
    }
}

fn placed() -> WorkflowEvent {
    placed_event(1)
}

fn allocate(volume: &str, class: StorageClass, site: &str, h: u32) -> WorkflowCommand {
    WorkflowCommand::AllocateVolume {
        volume: volume.into(),
        class,
        site: site.into(),
        bytes: 200 * GIB,
        rate: storage_rate(),
        allocated_at: at(h, 0),
    }
}

fn allocated(volume: &str, class: StorageClass, site: &str, h: u32) -> WorkflowEvent {
    WorkflowEvent::VolumeAllocated {
        volume: volume.into(),
        class,
        site: site.into(),
        bytes: 200 * GIB,
        rate: storage_rate(),
        allocated_at: at(h, 0),
    }
}

#[test]
fn a_volume_is_allocated_then_released_with_the_whole_charge_repeated() {
    let state = given::<Workflow>([submitted(), placed()])
        .when(
            allocate("data", StorageClass::Volume, "hpc-eu", 1),
            at(1, 0),
        )
        .then(vec![allocated("data", StorageClass::Volume, "hpc-eu", 1)]);
    assert_eq!(state.allocated_volumes().count(), 1);

    let (events, state) = meridian_events::aggregate::testing::given_state(state)
        .when(
            WorkflowCommand::ReleaseVolume {
                volume: "data".into(),
                site: "hpc-eu".into(),
                released_at: at(4, 0),
            },
            at(4, 0),
        )
        .then_ok();
    assert_eq!(
        events,
        vec![WorkflowEvent::VolumeReleased {
            volume: "data".into(),
            class: StorageClass::Volume,
            site: "hpc-eu".into(),
            bytes: 200 * GIB,
            rate: storage_rate(),
            allocated_at: at(1, 0),
            released_at: at(4, 0),
        }]
    );
    assert_eq!(state.allocated_volumes().count(), 0);
    // 200 GiB × 3 h × 0.0001 per GiB-hour = 0.06, by hand.
    let cost = events[0].storage_cost().unwrap().unwrap();
    assert_eq!(cost.amount, dec("0.06"));
    assert_eq!(cost.currency, usd());
}

#[test]
fn caches_need_no_declaration_but_volumes_do() {
    given::<Workflow>([submitted(), placed()])
        .when(
            allocate("sha256:9f86d081", StorageClass::Cache, "hpc-eu", 1),
            at(1, 0),
        )
        .then(vec![allocated(
            "sha256:9f86d081",
            StorageClass::Cache,
            "hpc-eu",
            1,
        )]);
    given::<Workflow>([submitted(), placed()])
        .when(
            allocate("scratch", StorageClass::Volume, "hpc-eu", 1),
            at(1, 0),
        )
        .then_err(|e| matches!(e, WorkflowError::UnknownVolume { volume } if volume == "scratch"));
}

#[test]
fn allocation_needs_a_placed_live_workflow_and_a_sane_shape() {
    given::<Workflow>([submitted()])
        .when(
            allocate("data", StorageClass::Volume, "hpc-eu", 1),
            at(1, 0),
        )
        .then_err(|e| *e == WorkflowError::NotPlaced);
    given::<Workflow>([])
        .when(
            allocate("data", StorageClass::Volume, "hpc-eu", 1),
            at(1, 0),
        )
        .then_err(|e| *e == WorkflowError::NotSubmitted);
    let mut zero = allocate("data", StorageClass::Volume, "hpc-eu", 1);
    if let WorkflowCommand::AllocateVolume { bytes, .. } = &mut zero {
        *bytes = 0;
    }
    given::<Workflow>([submitted(), placed()])
        .when(zero, at(1, 0))
        .then_err(|e| matches!(e, WorkflowError::InvalidAllocation { .. }));
    // Twice at one site is refused; at a second site (a re-placement) it is another
    // allocation, billed on its own.
    let twice = given::<Workflow>([
        submitted(),
        placed(),
        allocated("data", StorageClass::Volume, "hpc-eu", 1),
    ]);
    twice
        .when(
            allocate("data", StorageClass::Volume, "hpc-eu", 2),
            at(2, 0),
        )
        .then_err(|e| matches!(e, WorkflowError::VolumeAlreadyAllocated { .. }));
    let state = given::<Workflow>([
        submitted(),
        placed(),
        allocated("data", StorageClass::Volume, "hpc-eu", 1),
    ])
    .when(
        allocate("data", StorageClass::Volume, "aws-us-east-1", 2),
        at(2, 0),
    )
    .then(vec![allocated(
        "data",
        StorageClass::Volume,
        "aws-us-east-1",
        2,
    )]);
    assert_eq!(state.allocated_volumes().count(), 2);
    // Nothing new once it is cancelled or over.
    given::<Workflow>([
        submitted(),
        placed(),
        WorkflowEvent::Finished {
            finished_at: at(3, 0),
        },
    ])
    .when(
        allocate("data", StorageClass::Volume, "hpc-eu", 4),
        at(4, 0),
    )
    .then_err(|e| {
        *e == WorkflowError::AlreadyTerminal {
            state: WorkflowState::Finished,
        }
    });
}

#[test]
fn release_works_after_the_end_but_only_for_what_is_held() {
    let finished = || {
        given::<Workflow>([
            submitted(),
            placed(),
            allocated("data", StorageClass::Volume, "hpc-eu", 1),
            WorkflowEvent::Finished {
                finished_at: at(3, 0),
            },
        ])
    };
    let (events, state) = finished()
        .when(
            WorkflowCommand::ReleaseVolume {
                volume: "data".into(),
                site: "hpc-eu".into(),
                released_at: at(3, 30),
            },
            at(3, 30),
        )
        .then_ok();
    assert_eq!(events.len(), 1);
    assert_eq!(state.state(), Some(WorkflowState::Finished));
    finished()
        .when(
            WorkflowCommand::ReleaseVolume {
                volume: "data".into(),
                site: "aws-us-east-1".into(),
                released_at: at(3, 30),
            },
            at(3, 30),
        )
        .then_err(|e| matches!(e, WorkflowError::VolumeNotAllocated { .. }));
    finished()
        .when(
            WorkflowCommand::ReleaseVolume {
                volume: "data".into(),
                site: "hpc-eu".into(),
                released_at: at(0, 30),
            },
            at(3, 30),
        )
        .then_err(|e| matches!(e, WorkflowError::ReleaseBeforeAllocation { .. }));
    // Released once, it is gone: a second release is refused.
    let mut state = Workflow::load(&[
        submitted(),
        placed(),
        allocated("data", StorageClass::Volume, "hpc-eu", 1),
    ]);
    state
        .execute(
            WorkflowCommand::ReleaseVolume {
                volume: "data".into(),
                site: "hpc-eu".into(),
                released_at: at(2, 0),
            },
            at(2, 0),
        )
        .unwrap();
    assert!(matches!(
        state.handle(
            WorkflowCommand::ReleaseVolume {
                volume: "data".into(),
                site: "hpc-eu".into(),
                released_at: at(2, 0),
            },
            at(2, 0),
        ),
        Err(WorkflowError::VolumeNotAllocated { .. })
    ));
}
