//! Fixtures shared by the integration tests: one spec, one site's prices, fixed times.
#![allow(dead_code)]

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use meridian_events::aggregate::WorkflowCommand;
use meridian_events::money::{ComputePricing, ComputeRate, Currency, Money, StorageRate};
use meridian_events::vocabulary::workflow::{Candidate, CostTerms, PlacementExplanation, Verdict};
use meridian_events::vocabulary::{AcceleratorVendor, AllocatedGpus, Allocation};
use rust_decimal::Decimal;
use serde_json::json;
use uuid::Uuid;

/// A fixed instant on a test day: `at(h, m)` is 2025-03-01 h:m:00 UTC.
pub fn at(h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 3, 1, h, m, 0).unwrap()
}

pub fn dec(s: &str) -> Decimal {
    Decimal::from_str_exact(s).unwrap()
}

/// Deterministic ids, so expected events can be written out in full.
pub fn id(n: u128) -> Uuid {
    Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 | n)
}

pub const WORKFLOW: u128 = 1;

/// prep → (train, sweep[1..=5] at most 2 at once) → eval.
pub fn spec() -> meridian_spec::Workflow {
    serde_json::from_value(json!({
        "version": "v1",
        "name": "prep-train-eval",
        "jobs": {
            "prep": {
                "image": "docker://python:3.12",
                "command": ["python", "prep.py"],
                "resources": {"cpus": 4, "memory": "16GiB", "walltime": "30m"}
            },
            "train": {
                "requires": ["prep"],
                "image": "docker://nvcr.io/nvidia/pytorch:24.05",
                "command": ["torchrun", "train.py"],
                "resources": {
                    "cpus": 96, "memory": "1TiB", "walltime": "8h",
                    "gpus": {"count": 8, "vendor": "nvidia", "model": "H100"}
                }
            },
            "sweep": {
                "requires": ["prep"],
                "image": "host",
                "command": ["sh", "-c", "echo ${ARRAY_INDEX}"],
                "array": {"start": 1, "end": 5, "parallelism": 2}
            },
            "eval": {
                "requires": ["train", "sweep"],
                "image": "host",
                "command": ["python", "eval.py"]
            }
        }
    }))
    .expect("the fixture spec parses")
}

/// A spec from only its `jobs` map.
pub fn spec_with_jobs(jobs: serde_json::Value) -> meridian_spec::Workflow {
    serde_json::from_value(json!({"version": "v1", "name": "w", "jobs": jobs})).unwrap()
}

pub fn usd() -> Currency {
    Currency::USD
}

pub fn hpc_rate() -> ComputeRate {
    ComputeRate {
        offer: "gpu".into(),
        pricing: ComputePricing::Resource {
            per_core_hour: dec("0.01"),
            per_gib_memory_hour: dec("0.002"),
            per_gpu_hour: dec("2.50"),
        },
        currency: usd(),
        effective_from: at(0, 0),
        source: "https://hpc.example.org/prices".into(),
    }
}

pub fn storage_rate() -> StorageRate {
    StorageRate {
        per_gib_hour: dec("0.0001"),
        currency: usd(),
        effective_from: at(0, 0),
        source: "https://hpc.example.org/prices".into(),
    }
}

pub fn explanation() -> PlacementExplanation {
    PlacementExplanation {
        candidates: vec![
            Candidate {
                site: "hpc-eu".into(),
                verdict: Verdict::Chosen,
                cost: Some(CostTerms {
                    currency: usd(),
                    compute: dec("172.50"),
                    data_in: dec("1.20"),
                    storage: dec("0.30"),
                    data_out: dec("0"),
                    data_between: dec("0"),
                }),
            },
            Candidate {
                site: "aws-us-east-1".into(),
                verdict: Verdict::Fitted,
                cost: Some(CostTerms {
                    currency: usd(),
                    compute: dec("260.00"),
                    data_in: dec("0"),
                    storage: dec("0.50"),
                    data_out: dec("9.00"),
                    data_between: dec("0"),
                }),
            },
            Candidate {
                site: "pbs-lab".into(),
                verdict: Verdict::Rejected {
                    reason: "no H100".into(),
                },
                cost: None,
            },
        ],
        split: None,
    }
}

pub fn place_cmd() -> WorkflowCommand {
    WorkflowCommand::RecordPlacement {
        site: "hpc-eu".into(),
        region: "eu-central".into(),
        rate: hpc_rate(),
        job_rates: BTreeMap::new(),
        storage_rate: storage_rate(),
        estimated_cost: Money::new(dec("174.00"), usd()),
        explanation: explanation(),
        job_sites: BTreeMap::new(),
        storage_rates: BTreeMap::new(),
    }
}

pub fn gpu_allocation() -> Allocation {
    Allocation {
        nodes: 1,
        cpus: 96,
        memory_bytes: 1 << 40,
        gpus: Some(AllocatedGpus {
            count: 8,
            vendor: AcceleratorVendor::Nvidia,
            model: Some("H100".into()),
        }),
    }
}

/// The event [`place_cmd`] records, as attempt `attempt`.
pub fn placed_event(attempt: u32) -> meridian_events::WorkflowEvent {
    let WorkflowCommand::RecordPlacement {
        site,
        region,
        rate,
        job_rates,
        storage_rate,
        estimated_cost,
        explanation,
        job_sites,
        storage_rates,
    } = place_cmd()
    else {
        unreachable!("place_cmd records a placement")
    };
    meridian_events::WorkflowEvent::PlacementDecided {
        attempt,
        site,
        region,
        rate,
        job_rates,
        storage_rate,
        estimated_cost,
        explanation,
        job_sites,
        storage_rates,
    }
}
