//! The catalogue as a read model over a real SQLite log: what a load counts (job ends
//! too, for each site's reliability), what a catch-up reads, and that events seen again
//! through a subscription are not counted twice.

use std::collections::BTreeMap;

use chrono::Utc;
use meridian_domain::Catalog;
use meridian_eventlog::aggregates::execute;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Site, SiteCommand};
use meridian_events::vocabulary::Usage;
use meridian_events::{
    AggregateKind, AggregateRef, Allocation, ComputePricing, ComputeRate, Currency, Envelope,
    Event, EventContext, FailureReason, JobEvent, SiteKind,
};
use rust_decimal::Decimal;
use uuid::Uuid;

async fn open() -> (tempfile::TempDir, SqliteLog) {
    let dir = tempfile::tempdir().unwrap();
    let log = SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap();
    (dir, log)
}

async fn register(log: &dyn EventLog, name: &str) {
    execute::<Site, _>(
        log,
        Uuid::now_v7(),
        &EventContext::new_chain("system"),
        |_| SiteCommand::Register {
            name: name.into(),
            kind: SiteKind::Local,
            region: "here".into(),
            jurisdiction: "eu".into(),
            credentials_secret: None,
            labels: BTreeMap::new(),
            prices: None,
        },
    )
    .await
    .unwrap();
}

fn rate() -> ComputeRate {
    ComputeRate {
        offer: "node".into(),
        pricing: ComputePricing::Instance {
            per_instance_hour: Decimal::ONE,
        },
        currency: Currency::USD,
        effective_from: Utc::now(),
        source: "test".into(),
    }
}

/// Appends the end of one job run at `site`: finished, or failed for `reason`.
async fn job_end(log: &dyn EventLog, site: &str, failed: Option<FailureReason>) {
    let now = Utc::now();
    let event = match failed {
        None => JobEvent::Finished {
            workflow_id: Uuid::now_v7(),
            site: site.into(),
            rate: rate(),
            started_at: now,
            ended_at: now,
            exit_code: 0,
            allocated: Allocation {
                nodes: 1,
                cpus: 1,
                memory_bytes: 1 << 30,
                gpus: None,
            },
            usage: Usage::default(),
        },
        Some(reason) => JobEvent::Failed {
            workflow_id: Uuid::now_v7(),
            site: site.into(),
            rate: rate(),
            started_at: None,
            ended_at: now,
            exit_code: None,
            reason,
            allocated: None,
            usage: Usage::default(),
        },
    };
    let aggregate = AggregateRef::new(AggregateKind::Job, Uuid::now_v7());
    let events = Envelope::sequence_after(
        aggregate,
        0,
        &EventContext::new_chain("t"),
        now,
        vec![Event::Job(event)],
    )
    .iter()
    .map(|e| e.to_raw().unwrap())
    .collect();
    log.append(events).await.unwrap();
}

fn counts(catalog: &Catalog, site: &str) -> (u64, u64) {
    let s = catalog.find(site).unwrap();
    (s.runs, s.faults)
}

/// Every event of the log from `after` on, decoded, with its commit's position: what a
/// subscription delivers.
async fn delivered(log: &dyn EventLog, after: u64) -> Vec<(u64, Envelope<Event>)> {
    log.read_from(after, 10_000)
        .await
        .unwrap()
        .into_iter()
        .flat_map(|c| {
            let position = c.position;
            c.into_events()
                .into_iter()
                .map(move |e| (position, e.decode_event().unwrap()))
        })
        .collect()
}

#[tokio::test]
async fn a_loaded_catalogue_counts_job_ends_per_site() {
    let (_dir, log) = open().await;
    register(&log, "flaky").await;
    register(&log, "steady").await;
    job_end(&log, "flaky", Some(FailureReason::NodeFailure)).await;
    job_end(&log, "steady", None).await;
    // The job's own fault: a run, not the site's fault.
    job_end(&log, "steady", Some(FailureReason::ExitCode { code: 1 })).await;

    let catalog = Catalog::load(&log).await.unwrap();
    assert_eq!(catalog.position(), log.head().await.unwrap());
    assert_eq!(counts(&catalog, "flaky"), (1, 1));
    assert!(catalog.find("flaky").unwrap().reliability() < 0.5);
    assert_eq!(counts(&catalog, "steady"), (2, 0));
    assert!(catalog.find("steady").unwrap().reliability() > 0.5);
}

#[tokio::test]
async fn a_catch_up_folds_in_only_what_was_appended_since() {
    let (_dir, log) = open().await;
    let mut catalog = Catalog::default();
    assert_eq!(catalog.position(), 0);
    catalog.catch_up(&log).await.unwrap();
    assert_eq!(catalog.position(), 0, "an empty log");

    register(&log, "a").await;
    job_end(&log, "a", Some(FailureReason::Preempted)).await;
    catalog.catch_up(&log).await.unwrap();
    let first = log.head().await.unwrap();
    assert_eq!(catalog.position(), first);
    assert_eq!(counts(&catalog, "a"), (1, 1));

    // Nothing new: nothing changes (a catch-up that re-read the log would count again).
    catalog.catch_up(&log).await.unwrap();
    assert_eq!(catalog.position(), first);
    assert_eq!(counts(&catalog, "a"), (1, 1));

    register(&log, "b").await;
    job_end(&log, "a", None).await;
    catalog.catch_up(&log).await.unwrap();
    assert!(catalog.position() > first);
    assert_eq!(catalog.position(), log.head().await.unwrap());
    assert_eq!(counts(&catalog, "a"), (2, 1));
    assert!(catalog.find("b").is_some());
}

/// A router loads its catalogue up to the head, then its subscription resumes after its
/// last acknowledgement, which can be older: those commits come again and must not count
/// twice.
#[tokio::test]
async fn events_delivered_again_are_not_counted_twice() {
    let (_dir, log) = open().await;
    register(&log, "flaky").await;
    job_end(&log, "flaky", Some(FailureReason::NodeFailure)).await;
    let mut catalog = Catalog::load(&log).await.unwrap();
    let loaded = catalog.position();
    assert_eq!(counts(&catalog, "flaky"), (1, 1));

    // The subscription replays from the start: everything is already in.
    for (position, envelope) in delivered(&log, 0).await {
        assert!(!catalog.observe_at(position, &envelope));
    }
    assert_eq!(counts(&catalog, "flaky"), (1, 1));
    assert_eq!(catalog.position(), loaded);

    // A new job end is counted once, however often it is delivered.
    job_end(&log, "flaky", None).await;
    let new = delivered(&log, loaded).await;
    assert_eq!(new.len(), 1);
    for _ in 0..2 {
        for (position, envelope) in &new {
            catalog.observe_at(*position, envelope);
        }
    }
    assert_eq!(counts(&catalog, "flaky"), (2, 1));
    assert_eq!(catalog.position(), log.head().await.unwrap());

    // A catch-up after deliveries reads on from there: nothing counted twice either.
    catalog.catch_up(&log).await.unwrap();
    assert_eq!(counts(&catalog, "flaky"), (2, 1));
}

/// A commit of several events that was only partly delivered: a catch-up folds in the
/// rest of it, and only the rest.
#[tokio::test]
async fn a_catch_up_finishes_a_commit_that_was_partly_observed() {
    let (_dir, log) = open().await;
    let ctx = EventContext::new_chain("system");
    let site = AggregateRef::new(AggregateKind::Site, Uuid::now_v7());
    let registered = Event::Site(meridian_events::SiteEvent::Registered {
        name: "two-step".into(),
        kind: SiteKind::Local,
        region: "here".into(),
        jurisdiction: "eu".into(),
        credentials_secret: None,
        labels: BTreeMap::new(),
    });
    let drained = Event::Site(meridian_events::SiteEvent::Drained {
        by: "admin".into(),
        reason: None,
        drained_at: Utc::now(),
    });
    let events: Vec<_> =
        Envelope::sequence_after(site, 0, &ctx, Utc::now(), vec![registered, drained])
            .iter()
            .map(|e| e.to_raw().unwrap())
            .collect();
    log.append(events).await.unwrap();

    let mut catalog = Catalog::default();
    let all = delivered(&log, 0).await;
    assert_eq!(all.len(), 2);
    assert!(catalog.observe_at(all[0].0, &all[0].1));
    assert!(!catalog.find("two-step").unwrap().drained);
    catalog.catch_up(&log).await.unwrap();
    assert!(catalog.find("two-step").unwrap().drained);
    assert!(
        !catalog.observe_at(all[1].0, &all[1].1),
        "already folded in"
    );
}

/// A catch-up longer than one page (2,048 commits) reads the next page while it folds
/// this one: every commit is folded once, in order, and the catch-up ends at the head.
#[tokio::test]
async fn a_catch_up_over_several_pages_folds_every_commit_once() {
    let (_dir, log) = open().await;
    register(&log, "a").await;
    let ends = 2_100;
    for i in 0..ends {
        let failed = (i % 3 == 0).then_some(FailureReason::Preempted);
        job_end(&log, "a", failed).await;
    }
    let mut catalog = Catalog::default();
    let mut visited = 0;
    let read = catalog
        .catch_up_visiting(&log, |_| visited += 1)
        .await
        .unwrap();
    assert_eq!(read, ends + 1, "commits read");
    assert_eq!(visited, ends + 1, "events shown to the visitor");
    assert_eq!(catalog.position(), log.head().await.unwrap());
    assert_eq!(counts(&catalog, "a"), (ends, ends.div_ceil(3)));
}

/// A load folds up to the head it found: with a writer appending after every page it
/// reads, a load that followed the head never ended. A catch-up to a position already
/// folded reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_while_writers_append_ends_at_the_head_it_found() {
    use meridian_eventlog::testkit::{appending_while, Intercepted};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let (_dir, log) = open().await;
    register(&log, "here").await;
    let log: Arc<dyn EventLog> = Arc::new(log);
    let head = log.head().await.unwrap();
    let on = Arc::new(AtomicBool::new(true));
    let flooded =
        Intercepted::new(log.clone()).after_read(appending_while(log.clone(), on.clone()));
    let loaded =
        tokio::time::timeout(std::time::Duration::from_secs(20), Catalog::load(&flooded)).await;
    let mut catalog = loaded
        .expect("the load did not end while a writer appended")
        .unwrap();
    assert_eq!(catalog.position(), head);
    assert!(catalog.find("here").is_some());
    assert!(log.head().await.unwrap() > head, "the writer appended");

    on.store(false, Ordering::SeqCst);
    flooded.take_reads();
    assert_eq!(
        catalog.catch_up_to(&flooded, head, |_| {}).await.unwrap(),
        0
    );
    assert_eq!(flooded.take_reads(), Vec::<u64>::new(), "nothing read");
}
