//! The Site and Transfer aggregates.

mod common;

use std::collections::BTreeMap;

use chrono::Duration;
use common::*;
use meridian_events::aggregate::testing::given;
use meridian_events::aggregate::{
    Site, SiteCommand, SiteError, Transfer, TransferCommand, TransferError, TransferState,
};
use meridian_events::money::{ComputeOffer, ComputePricing, EgressTariff, PriceSheet};
use meridian_events::vocabulary::site::Capacity;
use meridian_events::vocabulary::{Endpoint, Location};
use meridian_events::{Money, SiteEvent, SiteKind, TransferEvent};

fn sheet(effective_from: chrono::DateTime<chrono::Utc>) -> PriceSheet {
    PriceSheet {
        currency: usd(),
        effective_from,
        source: "https://hpc.example.org/prices".into(),
        compute: vec![ComputeOffer {
            offer: "gpu".into(),
            pricing: ComputePricing::Resource {
                per_core_hour: dec("0.01"),
                per_gib_memory_hour: dec("0.002"),
                per_gpu_hour: dec("2.50"),
            },
        }],
        storage_per_gib_hour: dec("0.0001"),
        egress_per_gb: dec("0.02"),
        egress_by_destination: None,
        egress_tiers: Vec::new(),
    }
}

fn registered() -> SiteEvent {
    SiteEvent::Registered {
        name: "hpc-eu".into(),
        kind: SiteKind::Slurm,
        region: "eu-central".into(),
        jurisdiction: "eu".into(),
        credentials_secret: Some("hpc-eu-slurmrestd-token".into()),
        labels: BTreeMap::new(),
    }
}

#[test]
fn register_with_prices() {
    let site = given::<Site>([])
        .when(
            SiteCommand::Register {
                name: "hpc-eu".into(),
                kind: SiteKind::Slurm,
                region: "eu-central".into(),
                jurisdiction: "eu".into(),
                credentials_secret: Some("hpc-eu-slurmrestd-token".into()),
                labels: BTreeMap::new(),
                prices: Some(sheet(at(0, 0))),
            },
            at(0, 0),
        )
        .then(vec![
            registered(),
            SiteEvent::PricesChanged {
                prices: sheet(at(0, 0)),
            },
        ]);
    assert_eq!(site.name(), "hpc-eu");
    assert_eq!(
        site.prices_at(at(1, 0)).unwrap().compute_rate("gpu"),
        Some(hpc_rate())
    );
    assert_eq!(
        site.prices_at(at(1, 0)).unwrap().storage_rate(),
        storage_rate()
    );
    given::<Site>([registered()])
        .when(
            SiteCommand::Register {
                name: "hpc-eu".into(),
                kind: SiteKind::Slurm,
                region: "eu-central".into(),
                jurisdiction: "eu".into(),
                credentials_secret: None,
                labels: BTreeMap::new(),
                prices: None,
            },
            at(0, 1),
        )
        .then_err(|e| *e == SiteError::AlreadyRegistered);
}

#[test]
fn prices_never_go_back_in_time() {
    let site = given::<Site>([
        registered(),
        SiteEvent::PricesChanged {
            prices: sheet(at(0, 0)),
        },
    ])
    .when(
        SiteCommand::ChangePrices {
            prices: sheet(at(12, 0)),
        },
        at(1, 0),
    )
    .then(vec![SiteEvent::PricesChanged {
        prices: sheet(at(12, 0)),
    }]);
    // The announced sheet takes effect only at its date.
    assert_eq!(site.prices_at(at(11, 59)).unwrap().effective_from, at(0, 0));
    assert_eq!(site.prices_at(at(12, 0)).unwrap().effective_from, at(12, 0));
    assert_eq!(site.latest_prices().unwrap().effective_from, at(12, 0));

    given::<Site>([
        registered(),
        SiteEvent::PricesChanged {
            prices: sheet(at(12, 0)),
        },
    ])
    .when(
        SiteCommand::ChangePrices {
            prices: sheet(at(6, 0)),
        },
        at(13, 0),
    )
    .then_err(|e| {
        *e == SiteError::PricesPredateCurrent {
            current: at(12, 0),
            proposed: at(6, 0),
        }
    });
}

#[test]
fn negative_prices_are_refused() {
    let mut bad = sheet(at(0, 0));
    bad.egress_per_gb = dec("-0.01");
    given::<Site>([registered()])
        .when(SiteCommand::ChangePrices { prices: bad }, at(0, 0))
        .then_err(|e| matches!(e, SiteError::InvalidPrices { .. }));
}

#[test]
fn health_drain_undrain() {
    let capacity = Capacity {
        idle_nodes: 3,
        free_cpus: 288,
        free_gpus: 24,
        free_gpus_by_model: BTreeMap::from([("H100".to_string(), 16)]),
        pending_jobs: 17,
    };
    let site = given::<Site>([registered()])
        .when(
            SiteCommand::ReportHealth {
                healthy: true,
                capacity: capacity.clone(),
                message: None,
            },
            at(1, 0),
        )
        .then(vec![SiteEvent::HealthReported {
            healthy: true,
            capacity,
            message: None,
            observed_at: at(1, 0),
        }]);
    assert!(site.health().unwrap().healthy);

    let drained = SiteEvent::Drained {
        by: "admin".into(),
        reason: Some("maintenance".into()),
        drained_at: at(2, 0),
    };
    given::<Site>([registered()])
        .when(
            SiteCommand::Drain {
                by: "admin".into(),
                reason: Some("maintenance".into()),
            },
            at(2, 0),
        )
        .then(vec![drained.clone()]);
    given::<Site>([registered(), drained.clone()])
        .when(
            SiteCommand::Drain {
                by: "admin".into(),
                reason: None,
            },
            at(2, 1),
        )
        .then_err(|e| *e == SiteError::AlreadyDrained);
    let site = given::<Site>([registered(), drained])
        .when(SiteCommand::Undrain { by: "admin".into() }, at(3, 0))
        .then(vec![SiteEvent::Undrained {
            by: "admin".into(),
            undrained_at: at(3, 0),
        }]);
    assert!(!site.is_drained());
    given::<Site>([registered()])
        .when(SiteCommand::Undrain { by: "admin".into() }, at(3, 0))
        .then_err(|e| *e == SiteError::NotDrained);
    given::<Site>([])
        .when(
            SiteCommand::Drain {
                by: "admin".into(),
                reason: None,
            },
            at(3, 0),
        )
        .then_err(|e| *e == SiteError::NotRegistered);
}

#[test]
fn devices_are_reported_when_they_change_and_cordoned_one_by_one() {
    use meridian_events::vocabulary::site::Device;
    use meridian_events::vocabulary::AcceleratorVendor;
    let device = |id: &str| Device {
        id: id.into(),
        vendor: AcceleratorVendor::Nvidia,
        model: "H100".into(),
        memory_bytes: 80 << 30,
    };
    let reported = SiteEvent::DevicesReported {
        devices: vec![device("GPU-a"), device("GPU-b")],
    };
    given::<Site>([registered()])
        .when(
            SiteCommand::ReportDevices {
                devices: vec![device("GPU-a"), device("GPU-b")],
            },
            at(1, 0),
        )
        .then(vec![reported.clone()]);
    // The same devices again: nothing to record.
    given::<Site>([registered(), reported.clone()])
        .when(
            SiteCommand::ReportDevices {
                devices: vec![device("GPU-a"), device("GPU-b")],
            },
            at(1, 1),
        )
        .then(vec![]);
    let cordon = |device: &str, reason: &str| SiteCommand::CordonDevice {
        device: device.into(),
        reason: reason.into(),
        by: "health check".into(),
        fault: true,
    };
    let cordoned = SiteEvent::DeviceCordoned {
        device: "GPU-b".into(),
        model: "H100".into(),
        reason: "3 uncorrectable ECC errors".into(),
        by: "health check".into(),
        fault: true,
        cordoned_at: at(2, 0),
    };
    let site = given::<Site>([registered(), reported.clone()])
        .when(cordon("GPU-b", "3 uncorrectable ECC errors"), at(2, 0))
        .then(vec![cordoned.clone()]);
    assert_eq!(
        site.cordoned()["GPU-b"].reason,
        "3 uncorrectable ECC errors"
    );
    // A device the site never reported, a second cordon, no reason: refused.
    given::<Site>([registered(), reported.clone()])
        .when(cordon("GPU-z", "x"), at(2, 0))
        .then_err(|e| {
            matches!(e, SiteError::UnknownDevice { device, known }
                if device == "GPU-z" && known == "GPU-a, GPU-b")
        });
    given::<Site>([registered(), reported.clone(), cordoned.clone()])
        .when(cordon("GPU-b", "again"), at(2, 1))
        .then_err(|e| matches!(e, SiteError::AlreadyCordoned { .. }));
    given::<Site>([registered(), reported.clone()])
        .when(cordon("GPU-a", " "), at(2, 1))
        .then_err(|e| *e == SiteError::NoReason);
    // An admin gives it back; only a cordoned device can be.
    let site = given::<Site>([registered(), reported.clone(), cordoned])
        .when(
            SiteCommand::UncordonDevice {
                device: "GPU-b".into(),
                by: "admin".into(),
            },
            at(3, 0),
        )
        .then(vec![SiteEvent::DeviceUncordoned {
            device: "GPU-b".into(),
            by: "admin".into(),
            uncordoned_at: at(3, 0),
        }]);
    assert!(site.cordoned().is_empty());
    given::<Site>([registered(), reported])
        .when(
            SiteCommand::UncordonDevice {
                device: "GPU-a".into(),
                by: "admin".into(),
            },
            at(3, 0),
        )
        .then_err(|e| matches!(e, SiteError::NotCordoned { .. }));
}

#[test]
fn a_shapes_refresh_is_asked_for_then_recorded_declaring_only_what_changed() {
    use meridian_events::vocabulary::site::Shape;
    let shape = |memory_gib: u64| Shape {
        name: "p4d.24xlarge".into(),
        offer: "p4d.24xlarge".into(),
        spot_offer: None,
        cpus: 96,
        memory_bytes: memory_gib << 30,
        gpus: None,
        max_nodes: 1,
        max_walltime_secs: None,
    };
    let asked = SiteEvent::ShapesRefreshRequested {
        by: "admin".into(),
        requested_at: at(1, 0),
    };
    let site = given::<Site>([registered()])
        .when(
            SiteCommand::RequestShapesRefresh { by: "admin".into() },
            at(1, 0),
        )
        .then(vec![asked.clone()]);
    assert!(site.shapes_refresh_pending());
    let declared = SiteEvent::ShapesDeclared {
        shapes: vec![shape(1024)],
    };
    // Changed: declared, then recorded; the request is answered.
    let site = given::<Site>([registered(), declared.clone(), asked.clone()])
        .when(
            SiteCommand::RecordShapesRefresh {
                shapes: Some(vec![shape(1152)]),
                outcome: "p4d.24xlarge: memory 1024 GiB -> 1152 GiB".into(),
            },
            at(2, 0),
        )
        .then(vec![
            SiteEvent::ShapesDeclared {
                shapes: vec![shape(1152)],
            },
            SiteEvent::ShapesRefreshed {
                outcome: "p4d.24xlarge: memory 1024 GiB -> 1152 GiB".into(),
                refreshed_at: at(2, 0),
            },
        ]);
    assert!(!site.shapes_refresh_pending());
    // Unchanged, or unreadable: only recorded.
    given::<Site>([registered(), declared.clone(), asked.clone()])
        .when(
            SiteCommand::RecordShapesRefresh {
                shapes: Some(vec![shape(1024)]),
                outcome: "unchanged".into(),
            },
            at(2, 0),
        )
        .then(vec![SiteEvent::ShapesRefreshed {
            outcome: "unchanged".into(),
            refreshed_at: at(2, 0),
        }]);
    // Bad shapes change nothing.
    given::<Site>([registered(), declared, asked])
        .when(
            SiteCommand::RecordShapesRefresh {
                shapes: Some(vec![shape(0)]),
                outcome: "x".into(),
            },
            at(2, 0),
        )
        .then_err(|e| matches!(e, SiteError::InvalidShapes { .. }));
    given::<Site>([])
        .when(
            SiteCommand::RequestShapesRefresh { by: "admin".into() },
            at(1, 0),
        )
        .then_err(|e| *e == SiteError::NotRegistered);
}

fn requested() -> TransferEvent {
    TransferEvent::Requested {
        workflow_id: id(WORKFLOW),
        source: Endpoint::Uri {
            uri: "s3://datasets/imagenet-mini/".into(),
        },
        destination: Endpoint::SitePath {
            site: "hpc-eu".into(),
            path: "/scratch/meridian/data/imagenet/".into(),
        },
        bytes_expected: Some(5_000_000_000),
    }
}

fn tariff() -> EgressTariff {
    EgressTariff {
        per_gb: dec("0.09"),
        currency: usd(),
        effective_from: at(0, 0),
        source: "https://aws.amazon.com/s3/pricing/".into(),
        tiers: vec![],
    }
}

fn complete(digest: &str) -> TransferCommand {
    TransferCommand::Complete {
        bytes: 5_000_000_000,
        digest: digest.into(),
        from: Location::Region {
            region: "aws:us-east-1".into(),
        },
        to: Location::Site {
            site: "hpc-eu".into(),
        },
        started_at: at(0, 10),
        ended_at: at(0, 10) + Duration::seconds(95),
        egress: Some(tariff()),
        cached: false,
        class: None,
    }
}

#[test]
fn transfer_request_then_complete() {
    given::<Transfer>([])
        .when(
            TransferCommand::Request {
                workflow_id: id(WORKFLOW),
                source: Endpoint::Uri {
                    uri: "s3://datasets/imagenet-mini/".into(),
                },
                destination: Endpoint::SitePath {
                    site: "hpc-eu".into(),
                    path: "/scratch/meridian/data/imagenet/".into(),
                },
                bytes_expected: Some(5_000_000_000),
            },
            at(0, 9),
        )
        .then(vec![requested()]);
    let (events, transfer) = given::<Transfer>([requested()])
        .when(complete("sha256:9f86d081884c7d65"), at(0, 12))
        .then_ok();
    assert_eq!(transfer.state(), Some(TransferState::Completed));
    assert_eq!(transfer.bytes(), Some(5_000_000_000));
    // 5 GB × 0.09 USD/GB
    assert_eq!(
        events[0].egress_cost().unwrap().unwrap(),
        Money::new(dec("0.45"), usd())
    );
}

#[test]
fn transfer_illegal_transitions() {
    given::<Transfer>([])
        .when(complete("sha256:00"), at(0, 12))
        .then_err(|e| *e == TransferError::NotRequested);
    given::<Transfer>([requested()])
        .when(complete("9f86d081"), at(0, 12))
        .then_err(|e| matches!(e, TransferError::InvalidDigest { .. }));
    given::<Transfer>([requested()])
        .when(
            TransferCommand::Request {
                workflow_id: id(WORKFLOW),
                source: Endpoint::Uri {
                    uri: "s3://x/".into(),
                },
                destination: Endpoint::Uri {
                    uri: "s3://y/".into(),
                },
                bytes_expected: None,
            },
            at(0, 12),
        )
        .then_err(|e| *e == TransferError::AlreadyRequested);
    let failed = TransferEvent::Failed {
        workflow_id: id(WORKFLOW),
        reason: "403 from s3".into(),
        failed_at: at(0, 11),
    };
    given::<Transfer>([requested()])
        .when(
            TransferCommand::Fail {
                reason: "403 from s3".into(),
            },
            at(0, 11),
        )
        .then(vec![failed.clone()]);
    given::<Transfer>([requested(), failed])
        .when(complete("sha256:00"), at(0, 12))
        .then_err(|e| {
            *e == TransferError::AlreadyTerminal {
                state: TransferState::Failed,
            }
        });
}

#[test]
fn transfer_with_disordered_tiers_is_refused() {
    let mut cmd = complete("sha256:9f86d081884c7d65");
    if let TransferCommand::Complete {
        egress: Some(t), ..
    } = &mut cmd
    {
        t.tiers = vec![
            meridian_events::EgressTier {
                from_gb: dec("500"),
                per_gb: dec("0.05"),
            },
            meridian_events::EgressTier {
                from_gb: dec("100"),
                per_gb: dec("0.07"),
            },
        ];
    }
    given::<Transfer>([requested()])
        .when(cmd, at(0, 12))
        .then_err(|e| matches!(e, TransferError::InvalidTariff { .. }));
}
