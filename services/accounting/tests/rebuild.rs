//! A rebuilt ledger equals the one kept up to date, line for line; two replicas of the
//! consumer racing over one database bill nothing twice.

mod common;

use std::time::Duration;

use common::*;
use meridian_accounting::{rebuild, rebuild_with, snapshot, Ledger, Replay, NAME};
use meridian_events::vocabulary::tenant::{AdjustmentScope, AdjustmentTerms};
use meridian_events::{Event, SiteKind, TenantEvent};
use meridian_store::{catch_up, Store};
use tokio::sync::watch;

async fn synthetic_log(billable: u64) -> Log {
    let mut log = Log::new().await;
    for commit in meridian_accounting::synthetic::history(11, billable) {
        log.append_raw(commit).await;
    }
    log
}

/// The synthetic history with changes half-way through that the ledger must take in
/// order: every adjustment so far revoked, a new one granted, a site moved to another
/// region — so that a batch which holds both the change and the events after it prices
/// them as one commit at a time would.
async fn changing_log(billable: u64) -> Log {
    let mut log = Log::new().await;
    let history = meridian_accounting::synthetic::history(11, billable);
    let half = history.len() / 2;
    let mut granted: Vec<(String, uuid::Uuid)> = Vec::new();
    for (i, commit) in history.into_iter().enumerate() {
        if i == half {
            for (tenant, id) in std::mem::take(&mut granted) {
                log.revoke(&tenant, id, t("2026-11-20T00:00:00Z")).await;
            }
            log.grant(
                "physics",
                AdjustmentScope::default(),
                AdjustmentTerms::PercentDiscount { percent: d("30") },
                t("2026-11-01T00:00:00Z"),
                None,
            )
            .await;
            log.site("hpc-eu", SiteKind::Slurm, "moved-away").await;
            // Something in the log that is no event at all: skipped by both paths.
            let mut untyped = commit[0].clone();
            untyped.event_id = uuid::Uuid::now_v7();
            untyped.aggregate = meridian_events::AggregateRef::new(
                meridian_events::AggregateKind::Workflow,
                uuid::Uuid::now_v7(),
            );
            untyped.sequence = 1;
            untyped.payload = serde_json::json!({"note": "no type"});
            log.append_raw(vec![untyped]).await;
        }
        for e in &commit {
            if let Ok(Event::Tenant(TenantEvent::AdjustmentGranted { adjustment_id, .. })) =
                serde_json::from_value::<Event>(e.payload.clone())
            {
                granted.push((e.tenant.clone(), adjustment_id));
            }
        }
        log.append_raw(commit).await;
    }
    log
}

async fn rebuild_equals_the_live_ledger(store: &Store) {
    let log = changing_log(250).await;
    // Kept up to date in small steps, as the service does.
    let head = log.log.head().await.unwrap();
    let mut position = 0;
    while position < head {
        let commits = log.log.read_from(position, 7).await.unwrap();
        let mut tx = store.begin().await.unwrap();
        for c in &commits {
            meridian_store::Projection::apply(&Ledger, &mut tx, c)
                .await
                .unwrap();
        }
        sqlx::query(
            "INSERT INTO projection_positions (name, position) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET position = excluded.position",
        )
        .bind(NAME)
        .bind(commits.last().unwrap().position as i64)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        position = commits.last().unwrap().position;
    }
    let live = snapshot(store).await.unwrap();
    assert!(live.lines.len() > 500, "{} lines", live.lines.len());
    assert_eq!(live.position, head);
    let rebuilt = rebuild(store, &*log.log).await.unwrap();
    assert_eq!(rebuilt.position, head);
    assert_eq!(rebuilt.lines as usize, live.lines.len());
    assert_eq!(snapshot(store).await.unwrap(), live);
    // In many small pages, each priced from what the pages before it left in memory
    // while the one before is written.
    let pages = Replay {
        page: 5,
        ..Replay::default()
    };
    let rebuilt = rebuild_with(store, &*log.log, pages).await.unwrap();
    assert_eq!(rebuilt.position, head);
    assert_eq!(snapshot(store).await.unwrap(), live);
    // With room for a few jobs only: half-way, the rest batch by batch.
    let bounded = Replay {
        page: 5,
        jobs_in_memory: 40,
    };
    let rebuilt = rebuild_with(store, &*log.log, bounded).await.unwrap();
    assert_eq!(rebuilt.position, head);
    assert_eq!(snapshot(store).await.unwrap(), live);
}

#[tokio::test]
async fn sqlite_rebuild_equals_the_live_ledger() {
    let (db, store) = Db::sqlite().await;
    store
        .migrate(meridian_store::Projection::schema(&Ledger))
        .await
        .unwrap();
    rebuild_equals_the_live_ledger(&store).await;
    // Dropped for the replay, built again at its end.
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'ledger_charges'
         AND name NOT LIKE 'sqlite_autoindex%' ORDER BY name",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        indexes,
        ["ledger_charges_period", "ledger_charges_workflow"]
    );
    db.finish().await;
}

#[tokio::test]
async fn postgres_rebuild_equals_the_live_ledger() {
    let (db, store) = Db::postgres().await;
    store
        .migrate(meridian_store::Projection::schema(&Ledger))
        .await
        .unwrap();
    rebuild_equals_the_live_ledger(&store).await;
    db.finish().await;
}

/// Two consumers of the ledger on one database at once (replicas, or a rebuild while
/// the service runs) end with the ledger one consumer makes.
async fn racing_replicas_bill_once(store: Store, reference: Store) {
    let log = synthetic_log(300).await;
    let (stop, _) = watch::channel(false);
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (store, log, stop) = (store.clone(), log.log.clone(), stop.subscribe());
        tasks.push(tokio::spawn(async move {
            meridian_store::run(store, &*log, &Ledger, stop).await
        }));
    }
    reached(&store, log.log.head().await.unwrap()).await;
    stop.send(true).unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    catch_up(&reference, &*log.log, &Ledger).await.unwrap();
    assert_same_charges(&store, &reference).await;
}

/// Waits until the ledger in `store` has applied `head` (no timing is asserted; the
/// deadline only turns a hang into a failure).
async fn reached(store: &Store, head: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while store.position(NAME).await.unwrap() < head {
        assert!(tokio::time::Instant::now() < deadline, "never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The ledgers in `raced` and `single` hold the same charges. The position is left
/// out: the callers check it against the log's head themselves.
async fn assert_same_charges(raced: &Store, single: &Store) {
    let (raced, single) = (
        snapshot(raced).await.unwrap(),
        snapshot(single).await.unwrap(),
    );
    assert_eq!(raced.lines, single.lines);
    assert_eq!(raced.egress_volume, single.egress_volume);
    assert_eq!(raced.applied, single.applied);
    assert_eq!(raced.adjustments, single.adjustments);
}

#[tokio::test]
async fn sqlite_racing_replicas_bill_once() {
    let (db, store) = Db::sqlite().await;
    let (db2, reference) = Db::sqlite().await;
    racing_replicas_bill_once(store, reference).await;
    db.finish().await;
    db2.finish().await;
}

#[tokio::test]
async fn postgres_racing_replicas_bill_once() {
    let (db, store) = Db::postgres().await;
    let (db2, reference) = Db::postgres().await;
    racing_replicas_bill_once(store, reference).await;
    db.finish().await;
    db2.finish().await;
}

/// A rebuild while a consumer of the ledger still runs (a replica left up) ends with
/// the ledger one consumer makes: a page of the replay that finds the other writer's
/// work rolls back and the rest is applied taking turns with it.
async fn rebuild_beside_a_running_consumer_bills_once(store: Store, reference: Store) {
    let log = synthetic_log(300).await;
    catch_up(&reference, &*log.log, &Ledger).await.unwrap();
    let head = log.log.head().await.unwrap();
    let (stop, _) = watch::channel(false);
    let consumer = {
        let (store, log, stop) = (store.clone(), log.log.clone(), stop.subscribe());
        tokio::spawn(async move { meridian_store::run(store, &*log, &Ledger, stop).await })
    };
    let pages = Replay {
        page: 3,
        ..Replay::default()
    };
    let rebuilt = rebuild_with(&store, &*log.log, pages).await.unwrap();
    assert_eq!(rebuilt.position, head);
    reached(&store, head).await;
    // A consumer that stopped early has dropped its receiver: its error is the one to see.
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(60), consumer)
        .await
        .expect("the consumer stops when told")
        .unwrap()
        .unwrap();
    assert_same_charges(&store, &reference).await;
}

#[tokio::test]
async fn sqlite_rebuild_beside_a_running_consumer_bills_once() {
    let (db, store) = Db::sqlite().await;
    let (db2, reference) = Db::sqlite().await;
    rebuild_beside_a_running_consumer_bills_once(store, reference).await;
    db.finish().await;
    db2.finish().await;
}

#[tokio::test]
async fn postgres_rebuild_beside_a_running_consumer_bills_once() {
    let (db, store) = Db::postgres().await;
    let (db2, reference) = Db::postgres().await;
    rebuild_beside_a_running_consumer_bills_once(store, reference).await;
    db.finish().await;
    db2.finish().await;
}
