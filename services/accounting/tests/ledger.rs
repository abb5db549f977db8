//! The ledger against hand-computed amounts, on SQLite and on the machine's PostgreSQL,
//! with events appended to a real (SQLite) log by driving the Job aggregate.

use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Duration, TimeZone, Utc};
use meridian_accounting::{bill, Ledger};
use meridian_eventlog::aggregates::execute;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Job, JobCommand};
use meridian_events::vocabulary::{AcceleratorVendor, AllocatedGpus, Usage};
use meridian_events::{
    Allocation, ComputePricing, ComputeRate, Currency, EventContext, FailureReason,
};
use meridian_store::{catch_up, Projection, Store};
use rust_decimal::Decimal;
use uuid::Uuid;

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

fn rate() -> ComputeRate {
    ComputeRate {
        offer: "gpu-node".into(),
        pricing: ComputePricing::Resource {
            per_core_hour: d("0.05"),
            per_gib_memory_hour: d("0.01"),
            per_gpu_hour: d("2.00"),
        },
        currency: Currency::USD,
        effective_from: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
        source: "test sheet".into(),
    }
}

fn allocation() -> Allocation {
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

/// Drives one job run through the aggregate; `end` says how it ends.
async fn run(
    log: &dyn EventLog,
    workflow_id: Uuid,
    started: Option<DateTime<Utc>>,
    end: JobCommand,
) -> Uuid {
    let id = Uuid::now_v7();
    let ctx = EventContext::new_chain("physics");
    let resources = meridian_spec::parse(
        "version: v1\nname: x\njobs:\n  train: {image: host, command: [\"true\"], resources: {cpus: 8, memory: 32GiB}}\n",
    )
    .unwrap()
    .jobs["train"]
        .resources
        .clone();
    let mut commands = vec![
        JobCommand::Dispatch {
            workflow_id,
            job: "train".into(),
            index: None,
            attempt: 1,
            site: "hpc".into(),
            rate: rate(),
            resources,
        },
        JobCommand::RecordSubmission {
            backend_job_id: "4242".into(),
        },
    ];
    if let Some(started_at) = started {
        commands.push(JobCommand::Start {
            started_at,
            allocated: allocation(),
            hosts: vec!["node1".into()],
        });
    }
    commands.push(end);
    for command in commands {
        execute::<Job, _>(log, id, &ctx, |_| command.clone())
            .await
            .unwrap();
    }
    id
}

async fn scenario(store: Store) {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let workflow = Uuid::now_v7();
    let t0 = Utc.with_ymd_and_hms(2026, 11, 2, 9, 0, 0).unwrap();

    // 1 h 30 min at (8 × 0.05 + 32 × 0.01 + 2 × 2.00) = 4.72 per hour → 7.08.
    run(
        &*log,
        workflow,
        Some(t0),
        JobCommand::Finish {
            ended_at: t0 + Duration::minutes(90),
            exit_code: 0,
            usage: Usage::default(),
        },
    )
    .await;
    // Failed after 10 minutes: still billed, 4.72 / 6 = 0.78666…
    run(
        &*log,
        workflow,
        Some(t0),
        JobCommand::Fail {
            ended_at: t0 + Duration::minutes(10),
            exit_code: Some(3),
            reason: FailureReason::ExitCode { code: 3 },
            usage: Usage::default(),
        },
    )
    .await;
    // Refused before it started: nothing to bill.
    run(
        &*log,
        workflow,
        None,
        JobCommand::Fail {
            ended_at: t0,
            exit_code: None,
            reason: FailureReason::SiteRefused {
                message: "full".into(),
            },
            usage: Usage::default(),
        },
    )
    .await;

    catch_up(&store, &*log, &Ledger).await.unwrap();
    let b = bill(&store, workflow).await.unwrap();
    assert_eq!(b.lines.len(), 2, "{b:#?}");
    assert_eq!(d(&b.lines[0].amount), d("7.08"));
    assert_eq!(d(&b.lines[0].quantity), d("1.5"));
    assert_eq!(b.lines[0].unit, "Hours");
    assert_eq!(b.lines[0].price_source, "test sheet");
    let ten_minutes = d("4.72") * d("10") / d("60");
    assert_eq!(d(&b.lines[1].amount), ten_minutes);
    assert_eq!(b.totals.len(), 1);
    assert_eq!(b.totals[0].currency, "USD");
    assert_eq!(d(&b.totals[0].amount), d("7.08") + ten_minutes);

    // Redelivery: the same commits applied again (as after a crash before the ack)
    // change nothing, because each line is keyed by its event.
    let commits = log.read_from(0, 1000).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    for commit in &commits {
        Ledger.apply(&mut tx, commit).await.unwrap();
    }
    tx.commit().await.unwrap();
    assert_eq!(bill(&store, workflow).await.unwrap().lines, b.lines);

    // A rebuild from the log yields the same bill, line for line.
    store.reset(&Ledger).await.unwrap();
    catch_up(&store, &*log, &Ledger).await.unwrap();
    assert_eq!(bill(&store, workflow).await.unwrap().lines, b.lines);
}

#[tokio::test]
async fn sqlite_ledger_bills_compute_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("ledger.sqlite").display());
    scenario(Store::connect(&url).await.unwrap()).await;
}

#[tokio::test]
async fn postgres_ledger_bills_compute_exactly_once() {
    let url = meridian_store::testing::fresh_postgres()
        .await
        .expect("PostgreSQL");
    scenario(Store::connect(&url).await.unwrap()).await;
    meridian_store::testing::drop_postgres(&url).await;
}
