//! Every event variant through serde_json inside its envelope, and the tags pinned, so a
//! rename cannot slip into the log unnoticed.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use meridian_events::money::{ComputeOffer, ComputePricing, EgressTariff, EgressTier, PriceSheet};
use meridian_events::vocabulary::site::Capacity;
use meridian_events::vocabulary::tenant::{
    AdjustmentScope, AdjustmentTerms, ChargeKind, Meter, PlacementPolicy, TenantLimits,
};
use meridian_events::vocabulary::token::{Grant, Role};
use meridian_events::vocabulary::workflow::StorageClass;
use meridian_events::vocabulary::workflow::{
    CostTerms, JobPlacement, PlacementExplanation, SiteRejection, SplitPlan, Verdict, VolumeMove,
};
use meridian_events::vocabulary::{Endpoint, Location, Usage};
use meridian_events::{
    AggregateKind, AggregateRef, Currency, Envelope, Event, EventContext, FailureReason, JobEvent,
    JobOutcome, Money, RawEnvelope, SiteEvent, SiteKind, TaskRef, TenantEvent, TokenEvent,
    TransferEvent, WorkflowEvent,
};
use serde_json::json;

/// The tag of every variant. Adding a variant means adding it here; renaming one fails.
const TAGS: [&str; 53] = [
    "workflow.submitted.v1",
    "workflow.placement_decided.v1",
    "workflow.placement_rejected.v1",
    "workflow.placement_waiting.v1",
    "workflow.release_held.v1",
    "workflow.service_ready.v1",
    "workflow.job_released.v1",
    "workflow.job_settled.v1",
    "workflow.cancel_requested.v1",
    "workflow.finished.v1",
    "workflow.failed.v1",
    "workflow.cancelled.v1",
    "workflow.billed.v1",
    "workflow.volume_allocated.v1",
    "workflow.volume_released.v1",
    "workflow.volume_staged.v1",
    "workflow.volume_staging_failed.v1",
    "workflow.egress_due.v1",
    "workflow.volume_exported.v1",
    "workflow.volume_export_failed.v1",
    "job.dispatched.v1",
    "job.submitted_to_site.v1",
    "job.started.v1",
    "job.waiting.v1",
    "job.service_ready.v1",
    "job.finished.v1",
    "job.failed.v1",
    "job.cancel_requested.v1",
    "job.cancelled.v1",
    "site.registered.v1",
    "site.prices_changed.v1",
    "site.health_reported.v1",
    "site.shapes_declared.v1",
    "site.datasets_declared.v1",
    "site.devices_reported.v1",
    "site.device_cordoned.v1",
    "site.device_uncordoned.v1",
    "site.drained.v1",
    "site.undrained.v1",
    "site.heartbeat.v1",
    "site.disconnected.v1",
    "transfer.requested.v1",
    "transfer.progressed.v1",
    "transfer.completed.v1",
    "transfer.failed.v1",
    "tenant.adjustment_granted.v1",
    "tenant.adjustment_revoked.v1",
    "tenant.policy_set.v1",
    "tenant.limits_set.v1",
    "tenant.budget_reserved.v1",
    "tenant.budget_released.v1",
    "token.issued.v1",
    "token.revoked.v1",
];

/// One of each variant, in the order of `TAGS`, with the optional fields filled in.
fn every_event() -> Vec<Event> {
    let sheet = PriceSheet {
        currency: Currency::EUR,
        effective_from: at(0, 0),
        source: "grant agreement 2025-03".into(),
        compute: vec![
            ComputeOffer {
                offer: "p5.48xlarge".into(),
                pricing: ComputePricing::Instance {
                    per_instance_hour: dec("98.32"),
                },
            },
            ComputeOffer {
                offer: "gpu".into(),
                pricing: ComputePricing::Resource {
                    per_core_hour: dec("0.01"),
                    per_gib_memory_hour: dec("0.002"),
                    per_gpu_hour: dec("2.50"),
                },
            },
        ],
        storage_per_gib_hour: dec("0.0001"),
        egress_per_gb: dec("0.02"),
        egress_by_destination: None,
        egress_tiers: vec![EgressTier {
            from_gb: dec("10000"),
            per_gb: dec("0.015"),
        }],
    };
    let resources = spec().jobs["train"].resources.clone();
    let usage = Usage {
        cpu_seconds: Some(dec("86400.25")),
        max_rss_bytes: Some(1 << 36),
        gpu_seconds: Some(dec("57600")),
        billed: Some(meridian_events::vocabulary::BilledInterval {
            from: at(0, 55),
            to: at(3, 5),
        }),
    };
    let wf = id(WORKFLOW);
    let site = || "hpc-eu".to_string();
    vec![
        WorkflowEvent::Submitted {
            workflow_id: wf,
            name: "prep-train-eval".into(),
            spec: spec(),
            submitted_by: "ada".into(),
            idempotency_key: Some("k-1".into()),
            parent_workflow_id: None,
        }
        .into(),
        WorkflowEvent::PlacementDecided {
            attempt: 1,
            site: site(),
            region: "eu-central".into(),
            rate: hpc_rate(),
            job_rates: BTreeMap::from([("prep".to_string(), sheet.compute_rate("gpu").unwrap())]),
            storage_rate: storage_rate(),
            estimated_cost: Money::new(dec("174.00"), usd()),
            explanation: PlacementExplanation {
                split: Some(SplitPlan {
                    verdict: Verdict::Chosen,
                    jobs: vec![
                        JobPlacement {
                            job: "prep".into(),
                            site: site(),
                            offer: "gpu".into(),
                            compute: dec("1.50"),
                        },
                        JobPlacement {
                            job: "train".into(),
                            site: "aws-us-east-1".into(),
                            offer: "p5.48xlarge".into(),
                            compute: dec("98.32"),
                        },
                    ],
                    moves: vec![VolumeMove {
                        volume: "data".into(),
                        from: site(),
                        to: "aws-us-east-1".into(),
                        bytes: 1_000_000_000,
                        before_job: "train".into(),
                        cost: dec("0.02"),
                    }],
                    cost: Some(CostTerms {
                        currency: usd(),
                        compute: dec("99.82"),
                        data_in: dec("0"),
                        storage: dec("0.01"),
                        data_out: dec("0"),
                        data_between: dec("0.02"),
                    }),
                }),
                ..explanation()
            },
            job_sites: BTreeMap::from([("train".to_string(), "aws-us-east-1".to_string())]),
            storage_rates: BTreeMap::from([("aws-us-east-1".to_string(), storage_rate())]),
        }
        .into(),
        WorkflowEvent::PlacementRejected {
            attempt: 2,
            rejections: vec![SiteRejection {
                site: "pbs-lab".into(),
                reason: "no H100".into(),
            }],
        }
        .into(),
        WorkflowEvent::PlacementWaiting {
            reason: "waiting for a site to connect: gpu-a".into(),
            sites: vec!["gpu-a".into()],
            since: at(0, 5),
        }
        .into(),
        WorkflowEvent::ReleaseHeld {
            job: "train".into(),
            reason: "held: tenant physics has 8 of its 8 GPUs in use".into(),
            since: at(0, 6),
        }
        .into(),
        WorkflowEvent::ServiceReady {
            service: "serve".into(),
            job_id: id(28),
            address: "gpu017:8000".into(),
        }
        .into(),
        WorkflowEvent::JobReleased {
            job: "sweep".into(),
            index: Some(7),
            job_id: id(27),
            site: site(),
            attempt: 2,
            batch: None,
        }
        .into(),
        WorkflowEvent::JobSettled {
            job: "sweep".into(),
            index: Some(7),
            job_id: id(27),
            outcome: JobOutcome::Failed {
                reason: FailureReason::Preempted,
            },
            retry: true,
        }
        .into(),
        WorkflowEvent::CancelRequested {
            by: "ada".into(),
            reason: Some("wrong data".into()),
            requested_at: at(2, 0),
        }
        .into(),
        WorkflowEvent::Finished {
            finished_at: at(9, 0),
        }
        .into(),
        WorkflowEvent::Failed {
            reason: "train failed".into(),
            failed_jobs: vec![TaskRef::new("train", None)],
            failed_at: at(9, 0),
        }
        .into(),
        WorkflowEvent::Cancelled {
            cancelled_at: at(9, 0),
        }
        .into(),
        WorkflowEvent::Billed {
            totals: BTreeMap::from([(Currency::USD, dec("46.016")), (Currency::EUR, dec("0.45"))]),
            as_of_position: 1234,
        }
        .into(),
        WorkflowEvent::VolumeAllocated {
            volume: "data".into(),
            class: StorageClass::Volume,
            site: site(),
            bytes: 200 << 30,
            rate: storage_rate(),
            allocated_at: at(1, 0),
        }
        .into(),
        WorkflowEvent::VolumeReleased {
            volume: "data".into(),
            class: StorageClass::Volume,
            site: site(),
            bytes: 200 << 30,
            rate: storage_rate(),
            allocated_at: at(1, 0),
            released_at: at(9, 30),
        }
        .into(),
        WorkflowEvent::VolumeStaged {
            volume: "data".into(),
            site: site(),
            transfers: vec![uuid::Uuid::nil()],
        }
        .into(),
        WorkflowEvent::VolumeStagingFailed {
            volume: "data".into(),
            site: site(),
            reason: "s3://bucket/x: not found".into(),
        }
        .into(),
        WorkflowEvent::EgressDue {
            volumes: vec![meridian_events::vocabulary::workflow::VolumeAt {
                volume: "results".into(),
                site: site(),
            }],
        }
        .into(),
        WorkflowEvent::VolumeExported {
            volume: "results".into(),
            site: site(),
            transfers: vec![uuid::Uuid::nil()],
        }
        .into(),
        WorkflowEvent::VolumeExportFailed {
            volume: "results".into(),
            site: site(),
            reason: "s3://bucket/out/: access denied".into(),
        }
        .into(),
        JobEvent::Dispatched {
            workflow_id: wf,
            job: "train".into(),
            index: None,
            attempt: 1,
            site: site(),
            rate: hpc_rate(),
            resources,
            batch: None,
        }
        .into(),
        JobEvent::SubmittedToSite {
            backend_job_id: "4242".into(),
            submitted_at: at(1, 0),
        }
        .into(),
        JobEvent::Started {
            started_at: at(1, 0),
            allocated: gpu_allocation(),
            hosts: vec!["gpu017".into(), "gpu018".into()],
        }
        .into(),
        JobEvent::Waiting {
            reason: "Priority: 40 jobs ahead in the queue".into(),
        }
        .into(),
        JobEvent::ServiceReady {
            address: "gpu017:8000".into(),
            ready_at: at(1, 1),
        }
        .into(),
        JobEvent::Finished {
            workflow_id: wf,
            site: site(),
            rate: hpc_rate(),
            started_at: at(1, 0),
            ended_at: at(3, 0),
            exit_code: 0,
            allocated: gpu_allocation(),
            usage: usage.clone(),
        }
        .into(),
        JobEvent::Failed {
            workflow_id: wf,
            site: site(),
            rate: hpc_rate(),
            started_at: Some(at(1, 0)),
            ended_at: at(3, 0),
            exit_code: Some(137),
            reason: FailureReason::OutOfMemory,
            allocated: Some(gpu_allocation()),
            usage: usage.clone(),
        }
        .into(),
        JobEvent::CancelRequested {
            by: "ada".into(),
            reason: None,
            requested_at: at(2, 0),
        }
        .into(),
        JobEvent::Cancelled {
            workflow_id: wf,
            site: site(),
            rate: hpc_rate(),
            started_at: None,
            ended_at: at(2, 0),
            allocated: None,
            usage: Usage::default(),
        }
        .into(),
        SiteEvent::Registered {
            name: site(),
            kind: SiteKind::Slurm,
            region: "eu-central".into(),
            jurisdiction: "eu".into(),
            credentials_secret: Some("hpc-eu-token".into()),
            labels: BTreeMap::from([("tier".to_string(), "1".to_string())]),
        }
        .into(),
        SiteEvent::PricesChanged { prices: sheet }.into(),
        SiteEvent::HealthReported {
            healthy: false,
            capacity: Capacity {
                idle_nodes: 0,
                free_cpus: 0,
                free_gpus: 6,
                free_gpus_by_model: BTreeMap::from([("A100".to_string(), 4)]),
                pending_jobs: 900,
            },
            message: Some("slurmctld not responding".into()),
            observed_at: at(4, 0),
        }
        .into(),
        SiteEvent::ShapesDeclared {
            shapes: vec![meridian_events::vocabulary::site::Shape {
                name: "gpu".into(),
                offer: "gpu-a100".into(),
                spot_offer: Some("gpu-a100-spot".into()),
                cpus: 64,
                memory_bytes: 512 << 30,
                gpus: Some(meridian_events::vocabulary::site::ShapeGpus {
                    count: 4,
                    vendor: meridian_events::vocabulary::AcceleratorVendor::Nvidia,
                    model: "A100".into(),
                    memory_bytes: 80 << 30,
                }),
                max_nodes: 16,
                max_walltime_secs: Some(172_800),
            }],
        }
        .into(),
        SiteEvent::DatasetsDeclared {
            datasets: vec![meridian_events::vocabulary::site::Dataset {
                uri: "s3://datasets/imagenet-mini/".into(),
                digest: "sha256:9f86d081884c7d65".into(),
                bytes: 4_200_000_000,
            }],
        }
        .into(),
        SiteEvent::DevicesReported {
            devices: vec![meridian_events::vocabulary::site::Device {
                id: "GPU-5b1c".into(),
                vendor: meridian_events::vocabulary::AcceleratorVendor::Nvidia,
                model: "H100".into(),
                memory_bytes: 80 << 30,
            }],
        }
        .into(),
        SiteEvent::DeviceCordoned {
            device: "GPU-5b1c".into(),
            model: "H100".into(),
            reason: "2 uncorrectable ECC errors".into(),
            by: "health check".into(),
            fault: true,
            cordoned_at: at(4, 1),
        }
        .into(),
        SiteEvent::DeviceUncordoned {
            device: "GPU-5b1c".into(),
            by: "admin".into(),
            uncordoned_at: at(4, 2),
        }
        .into(),
        SiteEvent::Drained {
            by: "admin".into(),
            reason: Some("maintenance".into()),
            drained_at: at(4, 1),
        }
        .into(),
        SiteEvent::Undrained {
            by: "admin".into(),
            undrained_at: at(5, 0),
        }
        .into(),
        SiteEvent::Heartbeat {
            adapter: "slurm".into(),
            instance: id(40),
            ttl_secs: 90,
            observed_at: at(5, 1),
            arrays: None,
        }
        .into(),
        SiteEvent::Disconnected {
            instance: id(40),
            observed_at: at(5, 2),
        }
        .into(),
        TransferEvent::Requested {
            workflow_id: wf,
            source: Endpoint::SitePath {
                site: site(),
                path: "/results/".into(),
            },
            destination: Endpoint::Uri {
                uri: "s3://results/run-17/".into(),
            },
            bytes_expected: Some(1_000),
        }
        .into(),
        TransferEvent::Progressed {
            workflow_id: wf,
            bytes_done: 512,
            bytes_total: Some(1_000),
        }
        .into(),
        TransferEvent::Completed {
            workflow_id: wf,
            bytes: 1_000,
            digest: "sha256:9f86d081884c7d65".into(),
            from: Location::Site { site: site() },
            to: Location::Region {
                region: "aws:us-east-1".into(),
            },
            started_at: at(9, 0),
            ended_at: at(9, 1),
            egress: Some(EgressTariff {
                per_gb: dec("0.02"),
                currency: Currency::EUR,
                effective_from: at(0, 0),
                source: "grant agreement 2025-03".into(),
                tiers: vec![EgressTier {
                    from_gb: dec("10240"),
                    per_gb: dec("0.015"),
                }],
            }),
            cached: true,
            class: Some(meridian_events::money::Destination::OtherRegion),
        }
        .into(),
        TransferEvent::Failed {
            workflow_id: wf,
            reason: "403 from s3".into(),
            failed_at: at(9, 1),
        }
        .into(),
        TenantEvent::AdjustmentGranted {
            adjustment_id: id(40),
            tenant: "tenant-a".into(),
            scope: AdjustmentScope {
                site: None,
                site_kind: Some(SiteKind::Slurm),
                charge: Some(ChargeKind::Compute),
            },
            terms: AdjustmentTerms::CommittedRate {
                meter: Meter::GpuHours,
                unit_price: dec("1.80"),
                currency: Currency::USD,
            },
            effective_from: at(0, 0),
            effective_until: Some(at(23, 0)),
            granted_by: "finance".into(),
            reference: Some("PO-4411".into()),
        }
        .into(),
        TenantEvent::AdjustmentRevoked {
            adjustment_id: id(40),
            effective_at: at(12, 0),
            revoked_by: "finance".into(),
            reason: None,
        }
        .into(),
        TenantEvent::PolicySet {
            tenant: "physics".into(),
            policy: PlacementPolicy {
                sites: vec!["hpc-eu".into()],
                regions: vec!["eu-central".into()],
                residency: Some("eu".into()),
                budget_per_workflow: Some(Money::new(dec("500"), Currency::EUR)),
                spot_allowed: false,
                split_allowed: true,
            },
            set_by: "admin".into(),
        }
        .into(),
        TenantEvent::LimitsSet {
            tenant: "physics".into(),
            limits: TenantLimits {
                money_per_month: Some(Money::new(dec("1000"), Currency::EUR)),
                concurrent_workflows: Some(4),
                concurrent_gpus: Some(16),
                gpu_hours_per_month: Some(dec("500")),
            },
            set_by: "admin".into(),
        }
        .into(),
        TenantEvent::BudgetReserved {
            workflow_id: id(91),
            month: "2025-03".into(),
            estimate: Money::new(dec("12.50"), Currency::EUR),
            gpu_hours: dec("16"),
        }
        .into(),
        TenantEvent::BudgetReleased {
            workflow_id: id(91),
        }
        .into(),
        TokenEvent::Issued {
            token_id: id(90),
            tenant: Some("physics".into()),
            role: Role::Agent,
            grants: vec![Grant::Submit, Grant::Cancel],
            expires_at: Some(at(23, 0)),
            secret_sha256: "ab".repeat(32),
            label: Some("ci".into()),
            issued_by: "admin".into(),
        }
        .into(),
        TokenEvent::Revoked {
            token_id: id(90),
            revoked_by: "admin".into(),
            reason: Some("leaked".into()),
        }
        .into(),
    ]
}

#[test]
fn every_variant_is_covered_once_in_tag_order() {
    let kinds: Vec<&str> = every_event().iter().map(Event::kind).collect();
    assert_eq!(kinds, TAGS);
    assert_eq!(TAGS.iter().collect::<BTreeSet<_>>().len(), TAGS.len());
}

#[test]
fn serialized_type_is_the_versioned_tag() {
    for event in every_event() {
        let value = serde_json::to_value(&event).unwrap();
        assert_eq!(value["type"], json!(event.kind()), "{value}");
        assert!(event.kind().starts_with(event.aggregate_kind().as_str()));
        assert!(event.kind().ends_with(".v1"));
    }
}

#[test]
fn every_variant_round_trips_through_the_envelope() {
    let ctx = EventContext::new_chain("tenant-a");
    for (i, event) in every_event().into_iter().enumerate() {
        let aggregate = AggregateRef::new(event.aggregate_kind(), id(100 + i as u128));
        let envelope = Envelope::sequence_after(aggregate, 6, &ctx, at(1, 0), vec![event])
            .pop()
            .unwrap();
        let raw = envelope.to_raw().unwrap();
        // Through text, as the log stores it.
        let text = serde_json::to_string(&raw).unwrap();
        // Writers encode the typed envelope straight to text (the log's encoded
        // appends): byte for byte what the JSON tree gives.
        assert_eq!(
            serde_json::to_string(&envelope).unwrap(),
            text,
            "{}",
            envelope.payload.kind()
        );
        let stored: RawEnvelope = serde_json::from_str(&text).unwrap();
        let typed: Envelope<Event> = stored.clone().decode().unwrap();
        assert_eq!(typed, envelope);
        assert_eq!(typed.sequence, 7);
        // Read in place, as services read the log: the same event.
        assert_eq!(stored.clone().decode_event().unwrap(), envelope);
        // Straight from the text with the payload left unparsed, as a rebuild reads it.
        let unparsed: Envelope<&serde_json::value::RawValue> = serde_json::from_str(&text).unwrap();
        let tag = Event::type_of_json(unparsed.payload.get()).unwrap();
        assert_eq!(tag, envelope.payload.kind());
        assert_eq!(
            Event::from_json(&tag, unparsed.payload.get()).unwrap(),
            envelope.payload
        );

        // Each per-aggregate enum reads its own events straight from the envelope too.
        let kind = envelope.payload.kind();
        match aggregate.kind {
            AggregateKind::Workflow => {
                let e: Envelope<WorkflowEvent> = stored.decode().unwrap();
                assert_eq!(e.payload.kind(), kind);
            }
            AggregateKind::Job => {
                let e: Envelope<JobEvent> = stored.decode().unwrap();
                assert_eq!(e.payload.kind(), kind);
            }
            AggregateKind::Site => {
                let e: Envelope<SiteEvent> = stored.decode().unwrap();
                assert_eq!(e.payload.kind(), kind);
            }
            AggregateKind::Transfer => {
                let e: Envelope<TransferEvent> = stored.decode().unwrap();
                assert_eq!(e.payload.kind(), kind);
            }
            AggregateKind::Tenant => {
                let e: Envelope<TenantEvent> = stored.decode().unwrap();
                assert_eq!(e.payload.kind(), kind);
            }
            AggregateKind::Token => {
                let e: Envelope<TokenEvent> = stored.decode().unwrap();
                assert_eq!(e.payload.kind(), kind);
            }
        }
    }
}

#[test]
fn money_travels_as_strings_never_floats() {
    let event: Event = JobEvent::Finished {
        workflow_id: id(WORKFLOW),
        site: "hpc-eu".into(),
        rate: hpc_rate(),
        started_at: at(1, 0),
        ended_at: at(3, 0),
        exit_code: 0,
        allocated: gpu_allocation(),
        usage: Usage {
            cpu_seconds: Some(dec("0.10")),
            ..Usage::default()
        },
    }
    .into();
    let value = serde_json::to_value(&event).unwrap();
    assert_eq!(
        value["rate"]["pricing"],
        json!({
            "basis": "resource",
            "per_core_hour": "0.01",
            "per_gib_memory_hour": "0.002",
            "per_gpu_hour": "2.50"
        })
    );
    assert_eq!(value["rate"]["currency"], json!("USD"));
    // Scale is kept: 0.10 stays 0.10.
    assert_eq!(value["usage"]["cpu_seconds"], json!("0.10"));
    assert_eq!(value["started_at"], json!("2025-03-01T01:00:00Z"));

    let billed = serde_json::to_value(WorkflowEvent::Billed {
        totals: BTreeMap::from([(Currency::USD, dec("46.016"))]),
        as_of_position: 9,
    })
    .unwrap();
    assert_eq!(
        billed,
        json!({"type": "workflow.billed.v1", "totals": {"USD": "46.016"}, "as_of_position": 9})
    );
}

#[test]
fn decoding_names_what_is_wrong() {
    // Through serde and read in place, the same message.
    let decode = |payload: serde_json::Value| {
        let through_serde = serde_json::from_value::<Event>(payload.clone())
            .unwrap_err()
            .to_string();
        let in_place = Event::from_payload(&payload).unwrap_err().to_string();
        assert_eq!(through_serde, in_place);
        // From text, the same message once the type is known.
        let text = payload.to_string();
        match Event::type_of_json(&text) {
            Ok(tag) => {
                let from_text = Event::from_json(&tag, &text).unwrap_err().to_string();
                assert_eq!(strip_position(&from_text), strip_position(&in_place));
            }
            Err(e) => assert!(e.to_string().contains("type"), "{e}"),
        }
        in_place
    };
    // serde_json adds "at line L column C" to errors read from text.
    fn strip_position(message: &str) -> &str {
        message.split(" at line ").next().unwrap_or(message)
    }
    let err = decode(json!({"type": "workflow.exploded.v1"}));
    assert!(err.contains("workflow.exploded.v1"), "{err}");
    let err = decode(json!({"type": "bogus.thing.v1"}));
    assert!(err.contains("unknown event type"), "{err}");
    let err = decode(json!({"finished_at": "2025-03-01T01:00:00Z"}));
    assert!(err.contains("type"), "{err}");
    // A currency is validated on the way in.
    let err = decode(json!({
        "type": "workflow.billed.v1", "totals": {"usd": "1"}, "as_of_position": 1
    }));
    assert!(err.contains("usd"), "{err}");
}

#[test]
fn event_converts_back_to_its_aggregate_enum() {
    let event: Event = SiteEvent::Undrained {
        by: "admin".into(),
        undrained_at: at(5, 0),
    }
    .into();
    assert!(WorkflowEvent::try_from(event.clone()).is_err());
    assert_eq!(event.aggregate_kind(), AggregateKind::Site);
    assert!(matches!(
        SiteEvent::try_from(event),
        Ok(SiteEvent::Undrained { .. })
    ));
}

#[test]
fn tariffs_written_before_tiers_existed_still_decode() {
    // A transfer.completed.v1 as the first version wrote it: no `tiers` field.
    let old = json!({
        "type": "transfer.completed.v1",
        "workflow_id": id(WORKFLOW),
        "bytes": 1000,
        "digest": "sha256:9f86",
        "from": {"kind": "site", "site": "hpc-eu"},
        "to": {"kind": "region", "region": "aws:us-east-1"},
        "started_at": "2025-03-01T09:00:00Z",
        "ended_at": "2025-03-01T09:01:00Z",
        "egress": {"per_gb": "0.02", "currency": "EUR",
                   "effective_from": "2025-03-01T00:00:00Z", "source": "grant"}
    });
    let event: Event = serde_json::from_value(old.clone()).unwrap();
    let Event::Transfer(TransferEvent::Completed {
        egress: Some(tariff),
        ..
    }) = &event
    else {
        panic!("{event:?}")
    };
    assert!(tariff.tiers.is_empty());
    // And a flat tariff is written the old way, byte for byte.
    assert_eq!(serde_json::to_value(&event).unwrap(), old);
}

#[test]
fn tenant_events_read_as_tenant_events() {
    let event: Event = serde_json::from_value(json!({
        "type": "tenant.adjustment_granted.v1",
        "adjustment_id": id(1),
        "tenant": "physics",
        "scope": {"site": "hpc-eu"},
        "terms": {"kind": "percent_discount", "percent": "12.5"},
        "effective_from": "2025-03-01T00:00:00Z",
        "granted_by": "finance"
    }))
    .unwrap();
    assert_eq!(event.aggregate_kind(), AggregateKind::Tenant);
    assert_eq!(event.kind(), "tenant.adjustment_granted.v1");
}

#[test]
fn placements_written_before_split_plans_existed_still_decode() {
    // A workflow.placement_decided.v1 as the first version wrote it: no job_sites,
    // storage_rates, explanation.split or cost.data_between.
    let old = json!({
        "type": "workflow.placement_decided.v1",
        "attempt": 1,
        "site": "hpc-eu",
        "region": "eu-central",
        "rate": {"offer": "gpu", "pricing": {"basis": "resource", "per_core_hour": "0.01",
                 "per_gib_memory_hour": "0.002", "per_gpu_hour": "2.50"},
                 "currency": "USD", "effective_from": "2025-03-01T00:00:00Z", "source": "grant"},
        "storage_rate": {"per_gib_hour": "0.0001", "currency": "USD",
                         "effective_from": "2025-03-01T00:00:00Z", "source": "grant"},
        "estimated_cost": {"amount": "174.00", "currency": "USD"},
        "explanation": {"candidates": [{"site": "hpc-eu", "verdict": {"verdict": "chosen"},
            "cost": {"currency": "USD", "compute": "172.50", "data_in": "1.20",
                     "storage": "0.30", "data_out": "0"}}]}
    });
    let event: Event = serde_json::from_value(old.clone()).unwrap();
    let Event::Workflow(WorkflowEvent::PlacementDecided {
        job_sites,
        storage_rates,
        explanation,
        ..
    }) = &event
    else {
        panic!("{event:?}")
    };
    assert!(job_sites.is_empty() && storage_rates.is_empty());
    assert!(explanation.split.is_none());
    let terms = explanation.candidates[0].cost.as_ref().unwrap();
    assert!(terms.data_between.is_zero());
    assert_eq!(terms.total().unwrap().amount, dec("174.00"));
    // And a single-site placement is written the old way, byte for byte.
    assert_eq!(serde_json::to_value(&event).unwrap(), old);
}
