//! Synthetic billable histories, for tests, crash tests and benchmarks: a deterministic
//! stream of commits (given a seed) that exercises every charge — compute on HPC,
//! Kubernetes and cloud sites in two currencies, runs that fail or are cancelled,
//! volumes and caches, tiered egress — with runs and copies that cross month ends and
//! tenants with discounts and committed rates.
//!
//! Each item is one commit of one aggregate, as `EventLog::append` takes it.

use chrono::{DateTime, Duration, TimeZone, Utc};
use meridian_events::vocabulary::tenant::{AdjustmentScope, AdjustmentTerms, ChargeKind, Meter};
use meridian_events::vocabulary::workflow::StorageClass;
use meridian_events::vocabulary::{AcceleratorVendor, AllocatedGpus, Location, Usage};
use meridian_events::{
    AggregateKind, AggregateRef, Allocation, ComputePricing, ComputeRate, Currency, EgressTariff,
    EgressTier, Envelope, Event, EventContext, FailureReason, JobEvent, RawEnvelope, SiteEvent,
    SiteKind, StorageRate, TenantEvent, TransferEvent, WorkflowEvent,
};
use rust_decimal::Decimal;
use uuid::Uuid;

/// xorshift64*: small, fast, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const TENANTS: [&str; 3] = ["physics", "chemistry", "biology"];

struct SiteDef {
    name: &'static str,
    kind: SiteKind,
    region: &'static str,
    currency: Currency,
}

const SITES: [SiteDef; 3] = [
    SiteDef {
        name: "hpc-eu",
        kind: SiteKind::Slurm,
        region: "eu-central",
        currency: Currency::EUR,
    },
    SiteDef {
        name: "k8s-lab",
        kind: SiteKind::Kubernetes,
        region: "us-lab",
        currency: Currency::USD,
    },
    SiteDef {
        name: "aws-us-east-1",
        kind: SiteKind::Aws,
        region: "us-east-1",
        currency: Currency::USD,
    },
];

fn d(s: &str) -> Decimal {
    s.parse().expect("literal decimals parse")
}

fn since() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

fn rate(site: &SiteDef) -> ComputeRate {
    let pricing = match site.kind {
        SiteKind::Aws => ComputePricing::Instance {
            per_instance_hour: d("98.32"),
        },
        _ => ComputePricing::Resource {
            per_core_hour: d("0.031"),
            per_gib_memory_hour: d("0.0042"),
            per_gpu_hour: d("2.49"),
        },
    };
    ComputeRate {
        offer: match site.kind {
            SiteKind::Aws => "p5.48xlarge".into(),
            _ => "gpu-node".into(),
        },
        pricing,
        currency: site.currency,
        effective_from: since(),
        source: format!("{} price sheet", site.name),
    }
}

fn storage_rate(site: &SiteDef) -> StorageRate {
    StorageRate {
        per_gib_hour: d("0.00014"),
        currency: site.currency,
        effective_from: since(),
        source: format!("{} price sheet", site.name),
    }
}

fn tariff(site: &SiteDef) -> EgressTariff {
    EgressTariff {
        per_gb: d("0"),
        currency: site.currency,
        effective_from: since(),
        source: format!("{} price sheet", site.name),
        tiers: vec![
            EgressTier {
                from_gb: d("100"),
                per_gb: d("0.09"),
            },
            EgressTier {
                from_gb: d("10240"),
                per_gb: d("0.085"),
            },
        ],
    }
}

/// A deterministic stream of commits. The first ones register the sites and grant the
/// adjustments; then each billable event comes with the commits it needs.
pub struct Generator {
    rng: Rng,
    /// Billable events made so far.
    pub billable: u64,
    setup: Vec<Vec<RawEnvelope>>,
    pending: Vec<Vec<RawEnvelope>>,
    /// Ids are made from a counter, so the stream is the same on every run.
    counter: u128,
    seed: u64,
}

impl Generator {
    pub fn new(seed: u64) -> Generator {
        let mut g = Generator {
            rng: Rng(seed.max(1)),
            billable: 0,
            setup: Vec::new(),
            pending: Vec::new(),
            counter: 0,
            seed,
        };
        g.setup = g.setup_commits();
        g.setup.reverse();
        g
    }

    /// True when every commit of the billable events made so far has been handed out.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.setup.is_empty()
    }

    /// A UUIDv7-shaped id, unique within this stream and this seed.
    fn id(&mut self) -> Uuid {
        self.counter += 1;
        let n = (u128::from(self.seed) << 64) | self.counter;
        uuid::Builder::from_unix_timestamp_millis(
            1_790_000_000_000 + (self.counter as u64 / 1000),
            &(n ^ 0x5a5a_5a5a_5a5a_5a5a_5a5a_5a5a_5a5a_5a5a).to_be_bytes()[6..16]
                .try_into()
                .expect("ten bytes"),
        )
        .into_uuid()
    }

    fn commit(
        &mut self,
        kind: AggregateKind,
        aggregate: Uuid,
        first_sequence: u64,
        tenant: &str,
        at: DateTime<Utc>,
        events: Vec<Event>,
    ) -> Vec<RawEnvelope> {
        let ctx = EventContext {
            tenant: tenant.to_string(),
            causation_id: None,
            correlation_id: aggregate,
            traceparent: None,
        };
        let mut envelopes = Envelope::sequence_after(
            AggregateRef::new(kind, aggregate),
            first_sequence - 1,
            &ctx,
            at,
            events,
        );
        for e in &mut envelopes {
            e.event_id = self.id();
        }
        envelopes
            .iter()
            .map(|e| e.to_raw().expect("events serialize"))
            .collect()
    }

    fn setup_commits(&mut self) -> Vec<Vec<RawEnvelope>> {
        let mut out = Vec::new();
        for site in &SITES {
            let id = self.id();
            out.push(self.commit(
                AggregateKind::Site,
                id,
                1,
                "system",
                since(),
                vec![SiteEvent::Registered {
                    name: site.name.into(),
                    kind: site.kind,
                    region: site.region.into(),
                    jurisdiction: "x".into(),
                    credentials_secret: None,
                    labels: Default::default(),
                }
                .into()],
            ));
        }
        let grants = [
            (
                "physics",
                AdjustmentScope {
                    site: Some("hpc-eu".into()),
                    ..AdjustmentScope::default()
                },
                AdjustmentTerms::PercentDiscount { percent: d("10") },
            ),
            (
                "chemistry",
                AdjustmentScope {
                    site_kind: Some(SiteKind::Kubernetes),
                    charge: Some(ChargeKind::Compute),
                    site: None,
                },
                AdjustmentTerms::CommittedRate {
                    meter: Meter::GpuHours,
                    unit_price: d("1.95"),
                    currency: Currency::USD,
                },
            ),
            (
                "biology",
                AdjustmentScope {
                    charge: Some(ChargeKind::Egress),
                    ..AdjustmentScope::default()
                },
                AdjustmentTerms::PercentDiscount { percent: d("12.5") },
            ),
        ];
        for (tenant, scope, terms) in grants {
            let adjustment_id = self.id();
            out.push(self.commit(
                AggregateKind::Tenant,
                meridian_events::aggregate::tenant_id(tenant),
                1,
                tenant,
                since(),
                vec![TenantEvent::AdjustmentGranted {
                    adjustment_id,
                    tenant: tenant.into(),
                    scope,
                    terms,
                    effective_from: Utc.with_ymd_and_hms(2026, 10, 15, 0, 0, 0).unwrap(),
                    effective_until: None,
                    granted_by: "finance".into(),
                    reference: None,
                }
                .into()],
            ));
        }
        out
    }

    /// A start time in Oct–Dec 2026, often close to a month's end.
    fn start(&mut self) -> DateTime<Utc> {
        let base = Utc.with_ymd_and_hms(2026, 10, 1, 0, 0, 0).unwrap();
        let near_end = self.rng.below(5) == 0;
        if near_end {
            let month_end = if self.rng.below(2) == 0 {
                Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap()
            } else {
                Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
            };
            month_end - Duration::seconds(self.rng.below(6 * 3600) as i64)
        } else {
            base + Duration::microseconds(self.rng.below(80 * 86_400 * 1_000_000) as i64)
        }
    }

    fn job_run(&mut self) {
        let tenant = TENANTS[self.rng.below(3) as usize];
        let site = &SITES[self.rng.below(3) as usize];
        let workflow_id = self.id();
        let job_id = self.id();
        let rate = rate(site);
        let started_at = self.start();
        let ended_at =
            started_at + Duration::microseconds(1 + self.rng.below(8 * 3600 * 1_000_000) as i64);
        let gpus = self.rng.below(3) as u32 * 4;
        let allocated = Allocation {
            nodes: 1 + self.rng.below(2) as u32,
            cpus: 1 + self.rng.below(96) as u32,
            memory_bytes: (1 + self.rng.below(512)) << 30,
            gpus: (gpus > 0).then(|| AllocatedGpus {
                count: gpus,
                vendor: AcceleratorVendor::Nvidia,
                model: Some("H100".into()),
            }),
        };
        let index = (self.rng.below(4) == 0).then(|| self.rng.below(1000) as u32);
        let resources = serde_json::from_value(serde_json::json!({"cpus": allocated.cpus}))
            .expect("resources parse");
        let dispatched = JobEvent::Dispatched {
            workflow_id,
            job: "train".into(),
            index,
            attempt: 1 + (self.rng.below(10) == 0) as u32,
            site: site.name.into(),
            rate: rate.clone(),
            resources,
            batch: None,
        };
        let end = match self.rng.below(10) {
            0 => JobEvent::Failed {
                workflow_id,
                site: site.name.into(),
                rate,
                started_at: Some(started_at),
                ended_at,
                exit_code: None,
                reason: FailureReason::NodeFailure,
                allocated: Some(allocated),
                usage: Usage::default(),
            },
            1 => JobEvent::Cancelled {
                workflow_id,
                site: site.name.into(),
                rate,
                started_at: Some(started_at),
                ended_at,
                allocated: Some(allocated),
                usage: Usage::default(),
            },
            _ => JobEvent::Finished {
                workflow_id,
                site: site.name.into(),
                rate,
                started_at,
                ended_at,
                exit_code: 0,
                allocated,
                usage: Usage::default(),
            },
        };
        let first = self.commit(
            AggregateKind::Job,
            job_id,
            1,
            tenant,
            started_at,
            vec![dispatched.into()],
        );
        let second = self.commit(
            AggregateKind::Job,
            job_id,
            2,
            tenant,
            ended_at,
            vec![end.into()],
        );
        self.pending.push(second);
        self.pending.push(first);
    }

    fn volume(&mut self) {
        let tenant = TENANTS[self.rng.below(3) as usize];
        let site = &SITES[self.rng.below(3) as usize];
        let workflow_id = self.id();
        let allocated_at = self.start();
        let released_at = allocated_at + Duration::seconds(1 + self.rng.below(3 * 86_400) as i64);
        let class = if self.rng.below(3) == 0 {
            StorageClass::Cache
        } else {
            StorageClass::Volume
        };
        let bytes = (1 + self.rng.below(2048)) << 30;
        let rate = storage_rate(site);
        let allocated = WorkflowEvent::VolumeAllocated {
            volume: "data".into(),
            class,
            site: site.name.into(),
            bytes,
            rate: rate.clone(),
            allocated_at,
        };
        let released = WorkflowEvent::VolumeReleased {
            volume: "data".into(),
            class,
            site: site.name.into(),
            bytes,
            rate,
            allocated_at,
            released_at,
        };
        let first = self.commit(
            AggregateKind::Workflow,
            workflow_id,
            1,
            tenant,
            allocated_at,
            vec![allocated.into()],
        );
        let second = self.commit(
            AggregateKind::Workflow,
            workflow_id,
            2,
            tenant,
            released_at,
            vec![released.into()],
        );
        self.pending.push(second);
        self.pending.push(first);
    }

    fn transfer(&mut self) {
        let tenant = TENANTS[self.rng.below(3) as usize];
        let site = &SITES[self.rng.below(3) as usize];
        let workflow_id = self.id();
        let transfer_id = self.id();
        let started_at = self.start();
        let ended_at = started_at + Duration::seconds(self.rng.below(4 * 3600) as i64);
        let bytes = 1 + self.rng.below(400_000_000_000);
        let event = TransferEvent::Completed {
            workflow_id,
            bytes,
            digest: "sha256:00".into(),
            from: Location::Site {
                site: site.name.into(),
            },
            to: Location::Region {
                region: "internet".into(),
            },
            started_at,
            ended_at,
            egress: Some(tariff(site)),
            cached: false,
            class: None,
        };
        let commit = self.commit(
            AggregateKind::Transfer,
            transfer_id,
            1,
            tenant,
            ended_at,
            vec![event.into()],
        );
        self.pending.push(commit);
    }
}

impl Iterator for Generator {
    type Item = Vec<RawEnvelope>;

    /// The next commit; endless (take as many as needed, or count `billable`).
    fn next(&mut self) -> Option<Vec<RawEnvelope>> {
        if let Some(c) = self.setup.pop() {
            return Some(c);
        }
        if self.pending.is_empty() {
            match self.rng.below(20) {
                0..=13 => self.job_run(),
                14..=16 => self.volume(),
                _ => self.transfer(),
            }
            self.billable += 1;
        }
        self.pending.pop()
    }
}

/// Commits until `billable` billable events have been made (and the commits they need).
pub fn history(seed: u64, billable: u64) -> Vec<Vec<RawEnvelope>> {
    let mut g = Generator::new(seed);
    let mut out = Vec::new();
    loop {
        if g.billable >= billable && g.is_idle() {
            return out;
        }
        match g.next() {
            Some(c) => out.push(c),
            None => return out,
        }
    }
}

/// Writes `generator`'s commits straight into the SQLite log at `path` (created with
/// its schema if needed), after the last position there, until `enough(generator,
/// events written)` holds and the generator is idle (or it runs out). Large
/// transactions without fsync, 100 rows to a statement: building a history of millions
/// of events through `append` (one fsync per commit) would take far longer than what is
/// measured on it. Returns the commits and events written.
pub async fn write_sqlite_log(
    path: &std::path::Path,
    generator: &mut Generator,
    mut enough: impl FnMut(&Generator, u64) -> bool,
) -> Result<(u64, u64), sqlx::Error> {
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };
    // Creates the file and its schema, as `meridian up` would.
    drop(
        meridian_eventlog::sqlite::SqliteLog::open(path)
            .await
            .map_err(|e| sqlx::Error::Configuration(e.to_string().into()))?,
    );
    let options = SqliteConnectOptions::new()
        .filename(path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Off);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let start: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(position), 0) FROM events")
        .fetch_one(&pool)
        .await?;
    let (mut position, mut events) = (start as u64, 0u64);
    let mut rows: Vec<(u64, usize, RawEnvelope)> = Vec::new();
    let mut done = false;
    while !done {
        let mut tx = pool.begin().await?;
        for _ in 0..20_000 {
            match generator.next() {
                Some(commit) => {
                    position += 1;
                    rows.extend(
                        commit
                            .into_iter()
                            .enumerate()
                            .map(|(i, e)| (position, i, e)),
                    );
                }
                None => done = true,
            }
            done |= enough(generator, events + rows.len() as u64) && generator.is_idle();
            if rows.len() >= 100 || (done && !rows.is_empty()) {
                let mut sql = String::from(
                    "INSERT INTO events (position, idx, event_id, aggregate_kind, aggregate_id, sequence, envelope) VALUES ",
                );
                for i in 0..rows.len() {
                    sql.push_str(if i == 0 {
                        "(?, ?, ?, ?, ?, ?, ?)"
                    } else {
                        ", (?, ?, ?, ?, ?, ?, ?)"
                    });
                }
                let mut q = sqlx::query(&sql);
                for (p, idx, e) in rows.drain(..) {
                    let envelope =
                        serde_json::to_string(&e).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
                    q = q
                        .bind(p as i64)
                        .bind(idx as i64)
                        .bind(e.event_id.to_string())
                        .bind(e.aggregate.kind.as_str())
                        .bind(e.aggregate.id.to_string())
                        .bind(e.sequence as i64)
                        .bind(envelope);
                    events += 1;
                }
                q.execute(&mut *tx).await?;
            }
            if done {
                break;
            }
        }
        tx.commit().await?;
    }
    pool.close().await;
    Ok((position - start as u64, events))
}
