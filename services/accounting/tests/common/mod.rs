//! Shared by the ledger's tests: a real (SQLite) log that events are appended to as the
//! services would append them, both read-model databases, and small builders for the
//! billable facts.
#![allow(dead_code)]

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::vocabulary::tenant::{AdjustmentScope, AdjustmentTerms};
use meridian_events::vocabulary::workflow::StorageClass;
use meridian_events::vocabulary::{AcceleratorVendor, AllocatedGpus, Location, Usage};
use meridian_events::{
    AggregateKind, AggregateRef, Allocation, ComputePricing, ComputeRate, Currency, EgressTariff,
    EgressTier, Envelope, Event, EventContext, FailureReason, JobEvent, SiteEvent, SiteKind,
    StorageRate, TenantEvent, TransferEvent, WorkflowEvent,
};
use meridian_store::Store;
use rust_decimal::Decimal;
use uuid::Uuid;

pub fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

pub fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

pub fn jan() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// The two databases every test runs on.
pub enum Db {
    Sqlite(tempfile::TempDir),
    Postgres(String),
}

impl Db {
    pub async fn sqlite() -> (Db, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("ledger.sqlite").display());
        let store = Store::connect(&url).await.unwrap();
        (Db::Sqlite(dir), store)
    }

    pub async fn postgres() -> (Db, Store) {
        let url = meridian_store::testing::fresh_postgres()
            .await
            .expect("PostgreSQL on 127.0.0.1:5432 (or MERIDIAN_TEST_POSTGRES)");
        let store = Store::connect(&url).await.unwrap();
        (Db::Postgres(url), store)
    }

    pub async fn finish(self) {
        if let Db::Postgres(url) = self {
            meridian_store::testing::drop_postgres(&url).await;
        }
    }
}

/// A SQLite event log and what has been appended to it.
pub struct Log {
    _dir: tempfile::TempDir,
    pub log: Arc<dyn EventLog>,
    sequences: HashMap<AggregateRef, u64>,
}

impl Log {
    pub async fn new() -> Log {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> = Arc::new(
            SqliteLog::open(&dir.path().join("events.sqlite"))
                .await
                .unwrap(),
        );
        Log {
            _dir: dir,
            log,
            sequences: HashMap::new(),
        }
    }

    /// Appends `events` to aggregate `kind/id` as one commit, stamped `tenant`; returns
    /// the envelopes' event ids.
    pub async fn append(
        &mut self,
        kind: AggregateKind,
        id: Uuid,
        tenant: &str,
        events: Vec<Event>,
    ) -> Vec<Uuid> {
        let aggregate = AggregateRef::new(kind, id);
        let last = self.sequences.get(&aggregate).copied().unwrap_or(0);
        let envelopes = Envelope::sequence_after(
            aggregate,
            last,
            &EventContext::new_chain(tenant),
            Utc::now(),
            events,
        );
        self.sequences
            .insert(aggregate, last + envelopes.len() as u64);
        let raw = envelopes.iter().map(|e| e.to_raw().unwrap()).collect();
        self.log.append(raw).await.unwrap();
        envelopes.iter().map(|e| e.event_id).collect()
    }

    /// Appends a commit made elsewhere (the synthetic history), keeping count of its
    /// aggregates' sequences so that later appends follow them.
    pub async fn append_raw(&mut self, commit: Vec<meridian_events::RawEnvelope>) {
        for e in &commit {
            let seen = self.sequences.entry(e.aggregate).or_insert(0);
            *seen = (*seen).max(e.sequence);
        }
        self.log.append(commit).await.unwrap();
    }

    /// Ends adjustment `id` of `tenant` at `at`.
    pub async fn revoke(&mut self, tenant: &str, id: Uuid, at: DateTime<Utc>) {
        self.append(
            AggregateKind::Tenant,
            meridian_events::aggregate::tenant_id(tenant),
            tenant,
            vec![TenantEvent::AdjustmentRevoked {
                adjustment_id: id,
                effective_at: at,
                revoked_by: "finance".into(),
                reason: None,
            }
            .into()],
        )
        .await;
    }

    pub async fn site(&mut self, name: &str, kind: SiteKind, region: &str) {
        self.append(
            AggregateKind::Site,
            Uuid::now_v7(),
            "system",
            vec![SiteEvent::Registered {
                name: name.into(),
                kind,
                region: region.into(),
                jurisdiction: "eu".into(),
                credentials_secret: None,
                labels: Default::default(),
            }
            .into()],
        )
        .await;
    }

    /// A run of `job` (dispatched, then ended as `end` says); returns the Job's id.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        &mut self,
        tenant: &str,
        workflow_id: Uuid,
        site: &str,
        job: &str,
        attempt: u32,
        rate: &ComputeRate,
        allocated: &Allocation,
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
        end: End,
    ) -> Uuid {
        let job_id = Uuid::now_v7();
        self.append(
            AggregateKind::Job,
            job_id,
            tenant,
            vec![JobEvent::Dispatched {
                workflow_id,
                job: job.into(),
                index: None,
                attempt,
                site: site.into(),
                rate: rate.clone(),
                resources: Default::default(),
                batch: None,
            }
            .into()],
        )
        .await;
        let event = match end {
            End::Finished => JobEvent::Finished {
                workflow_id,
                site: site.into(),
                rate: rate.clone(),
                started_at,
                ended_at,
                exit_code: 0,
                allocated: allocated.clone(),
                usage: Usage::default(),
            },
            End::FinishedBilled(billed) => JobEvent::Finished {
                workflow_id,
                site: site.into(),
                rate: rate.clone(),
                started_at,
                ended_at,
                exit_code: 0,
                allocated: allocated.clone(),
                usage: Usage {
                    billed: Some(billed),
                    ..Usage::default()
                },
            },
            End::Failed(reason) => JobEvent::Failed {
                workflow_id,
                site: site.into(),
                rate: rate.clone(),
                started_at: Some(started_at),
                ended_at,
                exit_code: None,
                reason,
                allocated: Some(allocated.clone()),
                usage: Usage::default(),
            },
            End::Refused => JobEvent::Failed {
                workflow_id,
                site: site.into(),
                rate: rate.clone(),
                started_at: None,
                ended_at,
                exit_code: None,
                reason: FailureReason::SiteRefused {
                    message: "full".into(),
                },
                allocated: None,
                usage: Usage::default(),
            },
            End::Cancelled => JobEvent::Cancelled {
                workflow_id,
                site: site.into(),
                rate: rate.clone(),
                started_at: Some(started_at),
                ended_at,
                allocated: Some(allocated.clone()),
                usage: Usage::default(),
            },
            End::CancelledBilledBeforeStart(billed) => JobEvent::Cancelled {
                workflow_id,
                site: site.into(),
                rate: rate.clone(),
                started_at: None,
                ended_at,
                allocated: Some(allocated.clone()),
                usage: Usage {
                    billed: Some(billed),
                    ..Usage::default()
                },
            },
        };
        self.append(AggregateKind::Job, job_id, tenant, vec![event.into()])
            .await;
        job_id
    }

    /// A volume held from `from` to `until` (allocated, then released).
    #[allow(clippy::too_many_arguments)]
    pub async fn volume(
        &mut self,
        tenant: &str,
        workflow_id: Uuid,
        volume: &str,
        class: StorageClass,
        site: &str,
        bytes: u64,
        rate: &StorageRate,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) {
        self.append(
            AggregateKind::Workflow,
            workflow_id,
            tenant,
            vec![WorkflowEvent::VolumeAllocated {
                volume: volume.into(),
                class,
                site: site.into(),
                bytes,
                rate: rate.clone(),
                allocated_at: from,
            }
            .into()],
        )
        .await;
        self.append(
            AggregateKind::Workflow,
            workflow_id,
            tenant,
            vec![WorkflowEvent::VolumeReleased {
                volume: volume.into(),
                class,
                site: site.into(),
                bytes,
                rate: rate.clone(),
                allocated_at: from,
                released_at: until,
            }
            .into()],
        )
        .await;
    }

    /// A completed copy of `bytes` out of `from`; returns the Transfer's id.
    #[allow(clippy::too_many_arguments)]
    pub async fn transfer(
        &mut self,
        tenant: &str,
        workflow_id: Uuid,
        bytes: u64,
        from: Location,
        to: Location,
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
        tariff: Option<EgressTariff>,
    ) -> Uuid {
        let id = Uuid::now_v7();
        self.append(
            AggregateKind::Transfer,
            id,
            tenant,
            vec![TransferEvent::Completed {
                workflow_id,
                bytes,
                digest: "sha256:00ff".into(),
                from,
                to,
                started_at,
                ended_at,
                egress: tariff,
                cached: false,
                class: None,
            }
            .into()],
        )
        .await;
        id
    }

    /// Grants an adjustment to `tenant`; returns its id.
    pub async fn grant(
        &mut self,
        tenant: &str,
        scope: AdjustmentScope,
        terms: AdjustmentTerms,
        from: DateTime<Utc>,
        until: Option<DateTime<Utc>>,
    ) -> Uuid {
        let adjustment_id = Uuid::now_v7();
        self.append(
            AggregateKind::Tenant,
            meridian_events::aggregate::tenant_id(tenant),
            tenant,
            vec![TenantEvent::AdjustmentGranted {
                adjustment_id,
                tenant: tenant.into(),
                scope,
                terms,
                effective_from: from,
                effective_until: until,
                granted_by: "finance".into(),
                reference: None,
            }
            .into()],
        )
        .await;
        adjustment_id
    }
}

pub enum End {
    Finished,
    /// Finished, and the site billed another stretch (a cloud instance's life).
    FinishedBilled(meridian_events::vocabulary::BilledInterval),
    Failed(FailureReason),
    Refused,
    Cancelled,
    /// Cancelled before it started, its site billing this stretch (a cloud instance
    /// that booted and was ended), as the Job aggregate records it.
    CancelledBilledBeforeStart(meridian_events::vocabulary::BilledInterval),
}

/// HPC prices: per core-hour, GiB-hour and GPU-hour.
pub fn hpc_rate(currency: Currency) -> ComputeRate {
    ComputeRate {
        offer: "gpu-node".into(),
        pricing: ComputePricing::Resource {
            per_core_hour: d("0.05"),
            per_gib_memory_hour: d("0.01"),
            per_gpu_hour: d("2.00"),
        },
        currency,
        effective_from: jan(),
        source: "hpc-eu sheet 2026".into(),
    }
}

/// Cloud prices: per instance-hour.
pub fn cloud_rate() -> ComputeRate {
    ComputeRate {
        offer: "p5.48xlarge".into(),
        pricing: ComputePricing::Instance {
            per_instance_hour: d("98.32"),
        },
        currency: Currency::USD,
        effective_from: jan(),
        source: "https://aws.amazon.com/ec2/pricing/on-demand/".into(),
    }
}

pub fn storage_rate(currency: Currency) -> StorageRate {
    StorageRate {
        per_gib_hour: d("0.0001"),
        currency,
        effective_from: jan(),
        source: "hpc-eu sheet 2026".into(),
    }
}

/// AWS-shaped internet egress: the first 100 GB of a month free, then 0.09 per GB up to
/// 10 TB, then 0.085.
pub fn tiered_tariff() -> EgressTariff {
    EgressTariff {
        per_gb: d("0"),
        currency: Currency::USD,
        effective_from: jan(),
        source: "https://aws.amazon.com/ec2/pricing/on-demand/#Data_Transfer".into(),
        tiers: vec![
            EgressTier {
                from_gb: d("100"),
                per_gb: d("0.09"),
            },
            EgressTier {
                from_gb: d("10100"),
                per_gb: d("0.085"),
            },
        ],
    }
}

/// 8 cores, 32 GiB, 2 GPUs on one node.
pub fn gpu_node() -> Allocation {
    Allocation {
        nodes: 1,
        cpus: 8,
        memory_bytes: 32 << 30,
        gpus: Some(AllocatedGpus {
            count: 2,
            vendor: AcceleratorVendor::Nvidia,
            model: Some("H100".into()),
        }),
    }
}

pub const GB: u64 = 1_000_000_000;
pub const GIB: u64 = 1 << 30;
