//! The SQLite backend against the conformance suite, each check on a new file.

use std::sync::Arc;

use meridian_eventlog::conformance::Open;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;

fn fresh() -> Open {
    let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
    Arc::new(move || {
        let dir = dir.clone();
        Box::pin(async move {
            let log = SqliteLog::open(&dir.path().join("events.sqlite"))
                .await
                .expect("open sqlite log");
            Arc::new(log) as Arc<dyn EventLog>
        })
    })
}

meridian_eventlog::conformance_suite!(fresh());

/// Two processes appending to one file, in turns (two handles: each keeps the commits
/// it stored last, and its subscriptions deliver from them where they can). Each
/// handle's subscriptions deliver the whole log, in order and without a hole, from any
/// position; and each handle reads it whole.
#[tokio::test]
async fn two_processes_appending_to_one_file_deliver_each_others_commits() {
    use meridian_eventlog::conformance::{event, workflow};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sqlite");
    let a = SqliteLog::open(&path).await.unwrap();
    let b = SqliteLog::open(&path).await.unwrap();
    let mut written = Vec::new();
    // a, a, b, a, b, b, a: each handle sees a hole where the other wrote.
    for (i, by_a) in [true, true, false, true, false, false, true]
        .into_iter()
        .enumerate()
    {
        let log = if by_a { &a } else { &b };
        let e = event(workflow(), 1, serde_json::json!({"n": i}));
        written.push(e.event_id);
        log.append(vec![e]).await.unwrap();
    }
    for log in [&a, &b] {
        for after in 0..=7u64 {
            let commits = log.read_from(after, 100).await.unwrap();
            let positions: Vec<u64> = commits.iter().map(|c| c.position).collect();
            assert_eq!(
                positions,
                (after + 1..=7).collect::<Vec<_>>(),
                "after {after}"
            );
            let mut following = log.tail(after).await.unwrap();
            let mut delivered = Vec::new();
            while delivered.len() < 7 - after as usize {
                let commits = following.next(3, Duration::from_secs(2)).await.unwrap();
                assert!(!commits.is_empty(), "after {after}: only {delivered:?}");
                delivered.extend(commits.iter().map(|c| (c.position, c.events[0].event_id)));
            }
            let expected: Vec<_> = (after + 1..=7)
                .zip(written[after as usize..].iter().copied())
                .collect();
            assert_eq!(delivered, expected, "after {after}");
        }
    }
    // What a handle keeps in memory is what one that keeps nothing reads from the file.
    let fresh = SqliteLog::open(&path).await.unwrap();
    // (a keeps only 7: it saw b's commits as holes.)
    let mut kept = a.tail(6).await.unwrap();
    assert_eq!(
        kept.next(1, Duration::from_secs(2)).await.unwrap(),
        fresh.read_from(6, 1).await.unwrap()
    );
}

/// The load generators' counter counts the events of its type after its position,
/// none before and none of another type, and stops the run on the refused type.
#[tokio::test]
async fn the_load_counter_counts_its_type_after_its_position() {
    use meridian_eventlog::conformance::{event, workflow};
    use meridian_eventlog::testkit::count_until;
    use serde_json::json;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(
        SqliteLog::open(&dir.path().join("events.sqlite"))
            .await
            .unwrap(),
    );
    let append = |payload: serde_json::Value| {
        let log = log.clone();
        async move {
            log.append(vec![event(workflow(), 1, payload)])
                .await
                .unwrap()
        }
    };
    for _ in 0..3 {
        append(json!({"type": "placed"})).await;
    }
    let from = log.head().await.unwrap();
    for i in 0..5 {
        append(json!({"type": "placed", "i": i})).await;
        append(json!({"type": "other", "placed": "placed"})).await;
    }
    append(json!("not an object")).await;
    let count = |n| {
        tokio::time::timeout(
            Duration::from_millis(500),
            count_until(&*log, from, "placed", "refused", n),
        )
    };
    count(5).await.expect("five placed after the position");
    assert!(count(6).await.is_err(), "only five follow the position");

    append(json!({"type": "refused"})).await;
    let log2 = log.clone();
    let refused =
        tokio::spawn(async move { count_until(&*log2, from, "placed", "refused", 6).await });
    let refused = tokio::time::timeout(Duration::from_secs(5), refused)
        .await
        .expect("the refused type stops the count");
    assert!(refused.unwrap_err().is_panic());
}
