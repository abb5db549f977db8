//! The conformance suite every [`EventLog`] backend must pass. Each check gets an
//! [`Open`]: a function that opens the same, initially empty store every time it is
//! called, as a restarted process would. [`crate::conformance_suite!`] turns the whole
//! suite into one `#[tokio::test]` per check for a backend.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use meridian_events::{
    AggregateKind, AggregateRef, Envelope, Event, JobEvent, RawEnvelope, TokenEvent, WorkflowEvent,
};
use serde_json::json;
use uuid::Uuid;

use crate::{
    Appended, Commit, DecodedCommit, EncodedCommit, EventLog, LogError, StoredCommit,
    MAX_COMMIT_BYTES,
};

pub type Open =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Arc<dyn EventLog>> + Send>> + Send + Sync>;

/// A test event: sequence `sequence` of `aggregate`, with `payload`.
pub fn event(aggregate: AggregateRef, sequence: u64, payload: serde_json::Value) -> RawEnvelope {
    Envelope {
        event_id: Uuid::now_v7(),
        aggregate,
        sequence,
        occurred_at: Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap(),
        tenant: "conformance".into(),
        causation_id: None,
        correlation_id: Uuid::now_v7(),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        payload,
    }
}

pub fn workflow() -> AggregateRef {
    AggregateRef::new(AggregateKind::Workflow, Uuid::now_v7())
}

/// The payloads of `aggregate`'s history, in order.
pub async fn payloads(log: &dyn EventLog, aggregate: AggregateRef) -> Vec<serde_json::Value> {
    log.read_aggregate(aggregate)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.payload)
        .collect()
}

async fn append_ok(log: &dyn EventLog, events: Vec<RawEnvelope>) -> u64 {
    match log.append(events).await {
        Ok(Appended::Stored { position }) => position,
        other => panic!("expected the append to be stored, got {other:?}"),
    }
}

/// Reads the whole log from the start in pages of `page`.
pub async fn read_all(log: &dyn EventLog, page: usize) -> Vec<Commit> {
    let mut all = Vec::new();
    let mut after = 0;
    loop {
        let commits = log.read_from(after, page).await.expect("read_from");
        assert!(commits.len() <= page, "read_from returned more than max");
        match commits.last() {
            Some(last) => after = last.position,
            None => return all,
        }
        all.extend(commits);
    }
}

pub async fn empty_log(open: Open) {
    let log = open().await;
    assert_eq!(log.head().await.unwrap(), 0);
    assert!(log.read_from(0, 10).await.unwrap().is_empty());
    assert!(log.read_aggregate(workflow()).await.unwrap().is_empty());
}

pub async fn append_then_read(open: Open) {
    let log = open().await;
    let a = workflow();
    let first = vec![event(a, 1, json!({"n": 1})), event(a, 2, json!({"n": 2}))];
    let p1 = append_ok(&*log, first.clone()).await;
    let third = vec![event(a, 3, json!({"n": 3}))];
    let p2 = append_ok(&*log, third.clone()).await;
    assert!(p2 > p1, "positions grow: {p1} then {p2}");
    assert_eq!(log.head().await.unwrap(), p2);

    let history = log.read_aggregate(a).await.unwrap();
    let expected: Vec<RawEnvelope> = first.iter().chain(&third).cloned().collect();
    assert_eq!(history, expected, "history comes back as written");

    let commits = log.read_from(0, 10).await.unwrap();
    assert_eq!(commits.len(), 2, "two appends are two commits");
    assert_eq!(commits[0].position, p1);
    assert_eq!(
        *commits[0].events, first,
        "a commit keeps its events together"
    );
    assert_eq!(*commits[1].events, third);
    assert!(log.read_from(p2, 10).await.unwrap().is_empty());
}

pub async fn long_history_reads_back_whole(open: Open) {
    let log = open().await;
    let a = workflow();
    let other = workflow();
    let mut written = Vec::new();
    for s in 1..=100u64 {
        let e = event(a, s, json!({"step": s}));
        written.push(e.clone());
        append_ok(&*log, vec![e]).await;
        // Interleave another aggregate so the history is not contiguous in the log.
        append_ok(&*log, vec![event(other, s, json!(s))]).await;
    }
    assert_eq!(log.read_aggregate(a).await.unwrap(), written);
}

pub async fn conflict_on_stale_sequence(open: Open) {
    let log = open().await;
    let a = workflow();
    append_ok(&*log, vec![event(a, 1, json!("first"))]).await;

    match log.append(vec![event(a, 1, json!("stale"))]).await {
        Err(LogError::Conflict {
            aggregate,
            expected,
            actual,
        }) => {
            assert_eq!((aggregate, expected, actual), (a, 0, 1));
        }
        other => panic!("a stale sequence must conflict, got {other:?}"),
    }
    match log.append(vec![event(a, 3, json!("ahead"))]).await {
        Err(LogError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (2, 1)),
        other => panic!("a sequence from the future must conflict, got {other:?}"),
    }
    let history = log.read_aggregate(a).await.unwrap();
    assert_eq!(history.len(), 1, "a conflict writes nothing");
    assert_eq!(history[0].payload, json!("first"));
    // The writer that lost reloads and goes on.
    append_ok(&*log, vec![event(a, 2, json!("second"))]).await;
}

pub async fn concurrent_writers_one_wins(open: Open) {
    // Separate connections, as separate processes would have.
    let mut writers = Vec::new();
    for _ in 0..4 {
        writers.push(open().await);
    }
    for round in 0..10 {
        let a = workflow();
        if round % 2 == 1 {
            // Odd rounds race on an aggregate that already has history.
            append_ok(&*writers[0], vec![event(a, 1, json!("base"))]).await;
        }
        let next = 1 + (round % 2) as u64;
        let mut tasks = Vec::new();
        for (i, log) in writers.iter().enumerate() {
            let log = log.clone();
            let e = event(a, next, json!({"writer": i}));
            tasks.push(tokio::spawn(async move { log.append(vec![e]).await }));
        }
        let mut won = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(Appended::Stored { .. }) => won += 1,
                Err(LogError::Conflict { .. }) => {}
                other => panic!("a racing writer either wins or conflicts, got {other:?}"),
            }
        }
        assert_eq!(won, 1, "exactly one writer wins round {round}");
        assert_eq!(
            writers[0].read_aggregate(a).await.unwrap().len(),
            next as usize
        );
    }
}

/// Many appends at once through one handle (a backend may commit them together): new
/// aggregates, pairs racing on one aggregate, and a retry of a stored batch. Each gets
/// the answer it would get alone, and the log holds exactly the stored ones, each at its
/// own position.
pub async fn many_appends_at_once_through_one_handle(open: Open) {
    let log = open().await;
    let earlier = workflow();
    let stored_batch = vec![event(earlier, 1, json!("first"))];
    let earlier_position = append_ok(&*log, stored_batch.clone()).await;

    let fresh: Vec<AggregateRef> = (0..48).map(|_| workflow()).collect();
    let raced: Vec<AggregateRef> = (0..8).map(|_| workflow()).collect();
    let mut tasks = Vec::new();
    for (i, a) in fresh.iter().enumerate() {
        let (log, e) = (log.clone(), event(*a, 1, json!({ "fresh": i })));
        tasks.push((
            "fresh",
            *a,
            tokio::spawn(async move { log.append(vec![e]).await }),
        ));
    }
    for a in &raced {
        for writer in 0..2 {
            let (log, e) = (log.clone(), event(*a, 1, json!({ "writer": writer })));
            tasks.push((
                "raced",
                *a,
                tokio::spawn(async move { log.append(vec![e]).await }),
            ));
        }
    }
    let retry = log.clone();
    tasks.push((
        "retry",
        earlier,
        tokio::spawn(async move { retry.append(stored_batch).await }),
    ));

    let mut positions = HashSet::new();
    let mut winners: BTreeMap<Uuid, usize> = BTreeMap::new();
    for (what, aggregate, task) in tasks {
        match (what, task.await.unwrap()) {
            ("fresh", Ok(Appended::Stored { position })) => {
                assert!(
                    positions.insert(position),
                    "position {position} given twice"
                );
            }
            ("raced", Ok(Appended::Stored { position })) => {
                assert!(
                    positions.insert(position),
                    "position {position} given twice"
                );
                *winners.entry(aggregate.id).or_default() += 1;
            }
            ("raced", Err(LogError::Conflict { .. })) => {}
            ("retry", Ok(Appended::Duplicate { position })) => {
                assert_eq!(position, earlier_position)
            }
            (what, other) => panic!("{what}: unexpected {other:?}"),
        }
    }
    assert_eq!(
        winners.len(),
        raced.len(),
        "each raced aggregate has one winner"
    );
    assert!(winners.values().all(|n| *n == 1), "{winners:?}");
    let all = read_all(&*log, 1000).await;
    assert_eq!(
        all.len(),
        1 + fresh.len() + raced.len(),
        "exactly the stored commits"
    );
    for (i, commit) in all.iter().enumerate() {
        assert_eq!(commit.position, i as u64 + 1, "positions without gaps");
    }
    for a in fresh.iter().chain(&raced) {
        assert_eq!(log.read_aggregate(*a).await.unwrap().len(), 1);
    }
    assert_eq!(log.read_aggregate(earlier).await.unwrap().len(), 1);
}

pub async fn duplicate_event_id_stored_once(open: Open) {
    let log = open().await;
    let a = workflow();
    let batch = vec![event(a, 1, json!("once")), event(a, 2, json!("twice?"))];
    let position = append_ok(&*log, batch.clone()).await;
    match log.append(batch.clone()).await {
        Ok(Appended::Duplicate { position: p }) => assert_eq!(p, position),
        other => panic!("a retried append is a duplicate, got {other:?}"),
    }
    // After the aggregate moved on, and from another connection, still a duplicate.
    append_ok(&*log, vec![event(a, 3, json!("later"))]).await;
    let other = open().await;
    match other.append(batch).await {
        Ok(Appended::Duplicate { position: p }) => assert_eq!(p, position),
        other => panic!("an old retry is still a duplicate, got {other:?}"),
    }
    let history = log.read_aggregate(a).await.unwrap();
    assert_eq!(history.len(), 3, "stored once");
    let ids: HashSet<Uuid> = history.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), 3);
}

/// An encoded append ([`EventLog::append_encoded`]) is an append: stored as the same
/// events, read back equal, a retry a duplicate, a stale one a conflict that writes
/// nothing, one too large refused.
pub async fn encoded_appends_are_appends(open: Open) {
    let log = open().await;
    let a = workflow();
    let batch = vec![event(a, 1, json!({"n": 1})), event(a, 2, json!("é ✓"))];
    let position = match log
        .append_encoded(EncodedCommit::encode(&batch).unwrap())
        .await
    {
        Ok(Appended::Stored { position }) => position,
        other => panic!("expected the encoded append to be stored, got {other:?}"),
    };
    assert_eq!(log.read_aggregate(a).await.unwrap(), batch);
    let commits = log.read_from(position - 1, 10).await.unwrap();
    assert_eq!(commits[0].position, position);
    assert_eq!(*commits[0].events, batch);
    // What an encoded append stored, a plain one retries as a duplicate, and back.
    match log.append(batch.clone()).await {
        Ok(Appended::Duplicate { position: p }) => assert_eq!(p, position),
        other => panic!("a retried append is a duplicate, got {other:?}"),
    }
    let next = vec![event(a, 3, json!("third"))];
    append_ok(&*log, next.clone()).await;
    match log
        .append_encoded(EncodedCommit::encode(&next).unwrap())
        .await
    {
        Ok(Appended::Duplicate { .. }) => {}
        other => panic!("a retried encoded append is a duplicate, got {other:?}"),
    }
    match log
        .append_encoded(EncodedCommit::encode(&[event(a, 3, json!("stale"))]).unwrap())
        .await
    {
        Err(LogError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (2, 3)),
        other => panic!("a stale encoded append must conflict, got {other:?}"),
    }
    let huge = vec![event(a, 4, json!("x".repeat(MAX_COMMIT_BYTES)))];
    match log
        .append_encoded(EncodedCommit::encode(&huge).unwrap())
        .await
    {
        Err(LogError::TooLarge { limit, .. }) => assert_eq!(limit, MAX_COMMIT_BYTES),
        other => panic!("an encoded commit over the limit is refused, got {other:?}"),
    }
    assert_eq!(
        log.read_aggregate(a).await.unwrap().len(),
        3,
        "nothing more written"
    );
}

pub async fn invalid_batches_change_nothing(open: Open) {
    let log = open().await;
    let (a, b) = (workflow(), workflow());
    let cases: Vec<(&str, Vec<RawEnvelope>)> = vec![
        ("empty", vec![]),
        ("zero sequence", vec![event(a, 0, json!(0))]),
        (
            "two aggregates",
            vec![event(a, 1, json!(1)), event(b, 2, json!(2))],
        ),
        ("gap", vec![event(a, 1, json!(1)), event(a, 3, json!(3))]),
        ("one event id twice", {
            let first = event(a, 1, json!(1));
            let mut again = event(a, 2, json!(2));
            again.event_id = first.event_id;
            vec![first, again]
        }),
    ];
    for (what, batch) in cases {
        match log.append(batch).await {
            Err(LogError::InvalidAppend(_)) => {}
            other => panic!("{what}: expected InvalidAppend, got {other:?}"),
        }
    }
    match log.subscribe("no spaces allowed").await {
        Err(LogError::InvalidName(_)) => {}
        Err(other) => panic!("expected InvalidName, got {other:?}"),
        Ok(_) => panic!("expected InvalidName, got a subscription"),
    }
    assert_eq!(log.head().await.unwrap(), 0, "nothing was written");
}

pub async fn large_and_non_ascii_payloads(open: Open) {
    let log = open().await;
    let a = workflow();
    let text = "Zürich → 東京 — שלום — 🚀 \u{0}\u{7f} \"quoted\" \\ back";
    let large = "x".repeat(MAX_COMMIT_BYTES - 4096);
    let events = vec![
        event(a, 1, json!({"text": text, "ключ": ["ü", 1, null]})),
        event(a, 2, json!({"blob": large})),
    ];
    let position = append_ok(&*log, events.clone()).await;
    assert_eq!(log.read_aggregate(a).await.unwrap(), events);
    let commits = log.read_from(position - 1, 1).await.unwrap();
    assert_eq!(*commits[0].events, events);
    assert_eq!(
        parsed(log.read_text_from(position - 1, 1).await.unwrap()),
        commits
    );

    let too_large = vec![event(a, 3, json!({"blob": "y".repeat(MAX_COMMIT_BYTES)}))];
    match log.append(too_large).await {
        Err(LogError::TooLarge { limit, .. }) => assert_eq!(limit, MAX_COMMIT_BYTES),
        other => panic!("an oversized commit is refused, got {other:?}"),
    }
    assert_eq!(log.read_aggregate(a).await.unwrap().len(), 2);
}

pub async fn replay_returns_everything_in_order(open: Open) {
    let log = open().await;
    let aggregates: Vec<AggregateRef> = (0..7).map(|_| workflow()).collect();
    let mut written = Vec::new();
    for i in 0..140u64 {
        let a = aggregates[(i % 7) as usize];
        let e = event(a, i / 7 + 1, json!({"i": i}));
        written.push(e.clone());
        append_ok(&*log, vec![e]).await;
    }
    for page in [1, 37, 1000] {
        let commits = read_all(&*log, page).await;
        let positions: Vec<u64> = commits.iter().map(|c| c.position).collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "positions strictly grow"
        );
        // As text, the same commits in the same pages.
        let mut after = 0;
        for chunk in commits.chunks(page) {
            let text = log.read_text_from(after, page).await.unwrap();
            assert_eq!(parsed(text), chunk, "pages of {page} after {after}");
            after = chunk.last().unwrap().position;
        }
        assert!(log.read_text_from(after, page).await.unwrap().is_empty());
        let events: Vec<RawEnvelope> = commits.into_iter().flat_map(Commit::into_events).collect();
        assert_eq!(
            events, written,
            "replay with pages of {page} returns every event in order"
        );
    }
    // A commit of several events reads back as one, as text too.
    let a = workflow();
    let batch = vec![event(a, 1, json!({"a": 1})), event(a, 2, json!({"b": 2}))];
    let position = append_ok(&*log, batch.clone()).await;
    let text = log.read_text_from(position - 1, 1).await.unwrap();
    assert_eq!(text.len(), 1);
    assert_eq!(text[0].position, position);
    assert_eq!(*parsed(text)[0].events, batch);
}

/// Text commits parsed as the log's own commits.
fn parsed(commits: Vec<StoredCommit>) -> Vec<Commit> {
    commits
        .into_iter()
        .map(|c| {
            Commit::new(
                c.position,
                c.events
                    .iter()
                    .map(|e| serde_json::from_str(e).expect("each stored envelope parses"))
                    .collect(),
            )
        })
        .collect()
}

/// Consumes `name` until `want` new commits arrived (or a long wait finds nothing),
/// acknowledging each when `ack` says so.
async fn consume(
    log: &dyn EventLog,
    name: &str,
    want: usize,
    mut ack: impl FnMut(usize) -> bool,
) -> Vec<Commit> {
    let mut sub = log.subscribe(name).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < want {
        let batch = sub.next(7, Duration::from_secs(5)).await.unwrap();
        if batch.is_empty() {
            break;
        }
        for commit in batch {
            if seen.len() == want {
                break;
            }
            let position = commit.position;
            seen.push(commit);
            if ack(seen.len()) {
                sub.ack(position).await.unwrap();
            }
        }
    }
    seen
}

pub async fn subscription_resumes_without_loss_or_reordering(open: Open) {
    let log = open().await;
    let aggregates: Vec<AggregateRef> = (0..5).map(|_| workflow()).collect();
    let mut sequence = BTreeMap::new();
    for i in 0..50usize {
        let a = aggregates[i % 5];
        let s = sequence.entry(a).or_insert(0u64);
        *s += 1;
        append_ok(&*log, vec![event(a, *s, json!({"i": i}))]).await;
    }

    // A reader takes 20 commits but acknowledges only the first 15, then dies.
    let first = consume(&*log, "ledger", 20, |n| n <= 15).await;
    assert_eq!(first.len(), 20);
    drop(log);

    // Restarted, it sees commit 16 next, then the rest, with nothing lost.
    let log = open().await;
    let rest = consume(&*log, "ledger", 35, |_| true).await;
    assert_eq!(
        rest.len(),
        35,
        "every commit after the last ack is delivered"
    );
    assert_eq!(
        rest[0].position, first[15].position,
        "resumes right after the ack"
    );
    assert_eq!(
        &rest[..5],
        &first[15..],
        "the unacknowledged ones come again, unchanged"
    );

    let mut last_seen: BTreeMap<AggregateRef, u64> = BTreeMap::new();
    for e in rest.iter().flat_map(|c| c.events.iter()) {
        let prev = last_seen.insert(e.aggregate, e.sequence).unwrap_or(0);
        assert!(e.sequence > prev, "in order within {}", e.aggregate);
    }
    let all: Vec<u64> = first[..15]
        .iter()
        .chain(&rest)
        .map(|c| c.position)
        .collect();
    let replay: Vec<u64> = read_all(&*log, 100)
        .await
        .iter()
        .map(|c| c.position)
        .collect();
    assert_eq!(
        all, replay,
        "acknowledged + resumed = the whole log, in order"
    );

    // A caught-up subscription sees new commits as they land; another name starts over.
    let mut sub = log.subscribe("ledger").await.unwrap();
    assert!(sub
        .next(10, Duration::from_millis(300))
        .await
        .unwrap()
        .is_empty());
    let writer = log.clone();
    let a = aggregates[0];
    let s = sequence[&a] + 1;
    let append = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        writer.append(vec![event(a, s, json!("live"))]).await
    });
    let live = sub.next(10, Duration::from_secs(10)).await.unwrap();
    append.await.unwrap().unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].events[0].payload, json!("live"));
    let other = consume(&*log, "router", 51, |_| true).await;
    assert_eq!(other.len(), 51, "each subscription has its own position");
}

/// A `next` dropped while it waits (a `select!` that took another branch) loses
/// nothing: a commit that lands meanwhile comes with the next call, and acknowledging
/// later commits never acknowledges one unseen. Both for a durable subscription and a
/// tail.
pub async fn a_dropped_next_loses_nothing(open: Open) {
    let log = open().await;
    let a = workflow();
    append_ok(&*log, vec![event(a, 1, json!(1))]).await;
    let mut sub = log.subscribe("dropped").await.unwrap();
    let mut tail = log.tail(0).await.unwrap();
    let first = sub.next(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(first.len(), 1);
    sub.ack(first[0].position).await.unwrap();
    assert_eq!(
        tail.next(10, Duration::from_secs(5)).await.unwrap().len(),
        1
    );
    for s in 2..=4u64 {
        // Both wait, and are given up on, before the commit lands.
        assert!(tokio::time::timeout(
            Duration::from_millis(150),
            sub.next(10, Duration::from_secs(5))
        )
        .await
        .is_err());
        assert!(tokio::time::timeout(
            Duration::from_millis(150),
            tail.next(10, Duration::from_secs(5))
        )
        .await
        .is_err());
        append_ok(&*log, vec![event(a, s, json!(s))]).await;
        let got = sub.next(10, Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            got.iter()
                .map(|c| c.events[0].payload.clone())
                .collect::<Vec<_>>(),
            vec![json!(s)],
            "the commit that landed while a next was dropped comes with the next call"
        );
        sub.ack(got[0].position).await.unwrap();
        let got = tail.next(10, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1, "the tail too");
    }
    // Nothing was acknowledged unseen: a new reader of the name has nothing left.
    drop(sub);
    let mut again = log.subscribe("dropped").await.unwrap();
    assert!(again
        .next(10, Duration::from_millis(300))
        .await
        .unwrap()
        .is_empty());
}

/// What `next_decoded` hands over is what was appended, typed: the commits of the kinds
/// asked for with their events, the others with none (and nothing of theirs decoded, so
/// an event no reader of that kind understands stops no one else); an event that does
/// not decode is an error naming its position; acknowledging works as after `next`.
pub async fn decoded_delivery_is_what_was_appended(open: Open) {
    let log = open().await;
    let at = Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap();
    let typed = |aggregate, payload: Event| event(aggregate, 1, json!(null)).with_payload(payload);
    let cancelled = typed(
        workflow(),
        WorkflowEvent::Cancelled { cancelled_at: at }.into(),
    );
    let job = AggregateRef::new(AggregateKind::Job, Uuid::now_v7());
    let asked = typed(
        job,
        JobEvent::CancelRequested {
            by: "conformance".into(),
            reason: Some("décodé".into()),
            requested_at: at,
        }
        .into(),
    );
    let token = AggregateRef::new(AggregateKind::Token, Uuid::now_v7());
    let revoked = typed(
        token,
        TokenEvent::Revoked {
            token_id: token.id,
            revoked_by: "conformance".into(),
            reason: None,
        }
        .into(),
    );
    let mut second = asked.clone();
    second.event_id = Uuid::now_v7();
    second.sequence = 2;
    let raw = |e: &Envelope<Event>| e.to_raw().unwrap();
    let positions = [
        append_ok(&*log, vec![raw(&cancelled)]).await,
        append_ok(&*log, vec![raw(&asked), raw(&second)]).await,
        append_ok(&*log, vec![raw(&revoked)]).await,
        // A token event of a type no build knows.
        append_ok(
            &*log,
            vec![event(token, 2, json!({"type": "token.unheard_of.v9"}))],
        )
        .await,
    ];

    let kinds = [AggregateKind::Workflow, AggregateKind::Job];
    let mut sub = log.subscribe("decoded").await.unwrap();
    let mut got: Vec<DecodedCommit> = Vec::new();
    while got.len() < 3 {
        let batch = sub
            .next_decoded(2, Duration::from_secs(5), &kinds)
            .await
            .unwrap();
        assert!(!batch.is_empty(), "delivered {} of 4 commits", got.len());
        got.extend(batch);
    }
    let expected = [
        DecodedCommit {
            position: positions[0],
            events: vec![cancelled],
        },
        DecodedCommit {
            position: positions[1],
            events: vec![asked, second],
        },
        DecodedCommit {
            position: positions[2],
            events: Vec::new(),
        },
    ];
    assert_eq!(got[..3], expected[..]);
    sub.ack(positions[2]).await.unwrap();
    drop(sub);

    // Resumes after the ack: the unknown token event comes, undecoded, as a position.
    let mut sub = log.subscribe("decoded").await.unwrap();
    let rest = sub
        .next_decoded(10, Duration::from_secs(5), &kinds)
        .await
        .unwrap();
    assert_eq!(
        rest,
        vec![DecodedCommit {
            position: positions[3],
            events: Vec::new(),
        }]
    );

    // A reader of every kind is stopped by it, told where.
    let mut all = log.subscribe("every_kind").await.unwrap();
    let mut delivered = 0;
    let error = loop {
        match all
            .next_decoded(1, Duration::from_secs(5), &AggregateKind::ALL)
            .await
        {
            Ok(batch) if batch.is_empty() => panic!("nothing delivered after {delivered}"),
            Ok(batch) => delivered += batch.len(),
            Err(e) => break e,
        }
    };
    assert_eq!(delivered, 3, "the three commits before it are delivered");
    match error {
        LogError::Corrupt { position, message } => {
            assert_eq!(position, positions[3]);
            assert!(message.contains("token.unheard_of.v9"), "{message}");
        }
        other => panic!("expected a corrupt record, got {other:?}"),
    }
}

pub async fn tail_follows_from_a_position(open: Open) {
    let log = open().await;
    let a = workflow();
    let mut positions = Vec::new();
    for s in 1..=5 {
        positions.push(append_ok(&*log, vec![event(a, s, json!(s))]).await);
    }
    // From the middle: exactly what came after, in order; and live appends as they land.
    let mut tail = log.tail(positions[2]).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let batch = tail.next(10, Duration::from_secs(5)).await.unwrap();
        assert!(!batch.is_empty(), "the tail delivers what is there");
        got.extend(batch.into_iter().map(|c| c.position));
    }
    assert_eq!(got, positions[3..].to_vec());
    assert!(tail
        .next(10, Duration::from_millis(200))
        .await
        .unwrap()
        .is_empty());
    let p6 = append_ok(&*log, vec![event(a, 6, json!(6))]).await;
    let live = tail.next(10, Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        live.iter().map(|c| c.position).collect::<Vec<_>>(),
        vec![p6]
    );
    // A tail keeps no position: a new one from 0 sees everything again.
    let mut again = log.tail(0).await.unwrap();
    let mut all = Vec::new();
    while all.len() < 6 {
        let batch = again.next(10, Duration::from_secs(5)).await.unwrap();
        assert!(!batch.is_empty());
        all.extend(batch);
    }
    assert_eq!(all.len(), 6);
}

pub async fn snapshots_are_kept_beside_the_log(open: Open) {
    use crate::snapshot::{self, Snapshot};
    let log = open().await;
    assert!(log.load_snapshot("router").await.unwrap().is_none());
    for bad in ["", "a.b", "spaces here", &"x".repeat(65)] {
        let snapshot = Snapshot {
            name: bad.to_string(),
            position: 1,
            body: b"{}".to_vec(),
        };
        assert!(matches!(
            log.save_snapshot(snapshot).await,
            Err(LogError::InvalidName(_))
        ));
        assert!(matches!(
            log.load_snapshot(bad).await,
            Err(LogError::InvalidName(_))
        ));
    }
    let a = workflow();
    let mut positions = Vec::new();
    for s in 1..=3 {
        positions.push(append_ok(&*log, vec![event(a, s, json!(s))]).await);
    }
    let kept = |position: u64, body: Vec<u8>| Snapshot {
        name: "router".into(),
        position,
        body,
    };
    // Bigger than one message of the backend, and not text.
    let big: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    log.save_snapshot(kept(positions[1], big.clone()))
        .await
        .unwrap();
    log.save_snapshot(Snapshot {
        name: "site-a".into(),
        position: positions[0],
        body: b"a".to_vec(),
    })
    .await
    .unwrap();
    // An older one does not replace a newer one.
    log.save_snapshot(kept(positions[0], b"older".to_vec()))
        .await
        .unwrap();
    let reopened = open().await;
    assert_eq!(
        reopened.load_snapshot("router").await.unwrap(),
        Some(kept(positions[1], big))
    );
    assert_eq!(
        reopened
            .load_snapshot("site-a")
            .await
            .unwrap()
            .map(|s| s.body),
        Some(b"a".to_vec())
    );
    log.save_snapshot(kept(positions[2], b"newer".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        reopened.load_snapshot("router").await.unwrap(),
        Some(kept(positions[2], b"newer".to_vec()))
    );
    // Kept beside the log, not in it.
    assert_eq!(read_all(&*reopened, 10).await.len(), 3);
    assert_eq!(reopened.head().await.unwrap(), positions[2]);

    // Through `snapshot`: a state comes back only in its format and when it matches the log.
    let state = BTreeMap::from([("sites".to_string(), 3u32)]);
    snapshot::save(&*log, "catalog", 1, positions[1], &state)
        .await
        .unwrap();
    assert_eq!(
        snapshot::load::<BTreeMap<String, u32>>(&*reopened, "catalog", 1)
            .await
            .unwrap(),
        Some((positions[1], state.clone()))
    );
    assert!(
        snapshot::load::<BTreeMap<String, u32>>(&*reopened, "catalog", 2)
            .await
            .unwrap()
            .is_none()
    );
    assert!(snapshot::load::<Vec<String>>(&*reopened, "catalog", 1)
        .await
        .unwrap()
        .is_none());
    // One whose position the log does not reach (another log under the same name).
    let body = log.load_snapshot("catalog").await.unwrap().unwrap().body;
    log.save_snapshot(Snapshot {
        name: "catalog".into(),
        position: positions[2] + 100,
        body,
    })
    .await
    .unwrap();
    assert!(
        snapshot::load::<BTreeMap<String, u32>>(&*reopened, "catalog", 1)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        snapshot::save(&*log, "catalog", 1, positions[2] + 200, &state)
            .await
            .is_err()
    );
}

/// A handle that learned an aggregate only through its subscription appends after
/// it; whoever is behind, that handle or another, meets a conflict and writes nothing,
/// also when the subscription delivers an older commit again.
pub async fn appends_after_what_a_subscription_delivered(open: Open) {
    let (reader, other) = (open().await, open().await);
    let a = workflow();
    append_ok(&*other, vec![event(a, 1, json!("theirs"))]).await;
    append_ok(&*other, vec![event(a, 2, json!("theirs too"))]).await;
    let mut sub = reader.subscribe("follower").await.unwrap();
    let mut delivered = Vec::new();
    while delivered.len() < 2 {
        delivered.extend(sub.next(10, Duration::from_secs(10)).await.unwrap());
    }
    append_ok(&*reader, vec![event(a, 3, json!("mine"))]).await;
    let conflict = |r: Result<Appended, LogError>| match r {
        Err(LogError::Conflict {
            expected, actual, ..
        }) => (expected, actual),
        other => panic!("a handle behind the aggregate must conflict, got {other:?}"),
    };
    assert_eq!(
        conflict(other.append(vec![event(a, 3, json!("late"))]).await),
        (2, 3)
    );
    // The other handle moves it on; the reader has been delivered nothing since.
    append_ok(&*other, vec![event(a, 4, json!("theirs again"))]).await;
    assert_eq!(
        conflict(reader.append(vec![event(a, 4, json!("stale"))]).await),
        (3, 4)
    );
    // Delivered again from the start (never acknowledged): what is older changes nothing.
    drop(sub);
    let mut sub = reader.subscribe("follower").await.unwrap();
    let mut again = Vec::new();
    while again.len() < 4 {
        again.extend(sub.next(10, Duration::from_secs(10)).await.unwrap());
    }
    append_ok(&*reader, vec![event(a, 5, json!("mine again"))]).await;
    assert_eq!(
        payloads(&*reader, a).await,
        vec![
            json!("theirs"),
            json!("theirs too"),
            json!("mine"),
            json!("theirs again"),
            json!("mine again")
        ]
    );
}

/// Generates one `#[tokio::test]` per conformance check. `$fresh` is an expression
/// that yields an [`Open`] for a new, empty store (it may `.await`).
#[macro_export]
macro_rules! conformance_suite {
    ($fresh:expr) => {
        $crate::conformance_suite!(@tests $fresh;
            empty_log, append_then_read, long_history_reads_back_whole,
            conflict_on_stale_sequence, appends_after_what_a_subscription_delivered,
            concurrent_writers_one_wins, many_appends_at_once_through_one_handle,
            duplicate_event_id_stored_once, encoded_appends_are_appends,
            invalid_batches_change_nothing, large_and_non_ascii_payloads,
            replay_returns_everything_in_order,
            subscription_resumes_without_loss_or_reordering,
            a_dropped_next_loses_nothing, decoded_delivery_is_what_was_appended,
            tail_follows_from_a_position, snapshots_are_kept_beside_the_log);
    };
    (@tests $fresh:expr; $($check:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let open: $crate::conformance::Open = $fresh;
                $crate::conformance::$check(open).await;
            }
        )*
    };
}
