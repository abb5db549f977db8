//! The JetStream backend against the conformance suite and a real nats-server (2.10+):
//! each check on a new stream, and a server killed and restarted mid-test.

use std::sync::Arc;
use std::time::Duration;

use meridian_eventlog::conformance::{event, payloads, workflow, Open};
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::testkit::{nats_url_or_start, NatsServer};
use meridian_eventlog::{Appended, Commit, EventLog, LogError};
use serde_json::json;

fn config(url: String) -> NatsConfig {
    // A stream per check, so checks never see each other's events on a shared server.
    let unique = uuid::Uuid::now_v7().simple().to_string();
    NatsConfig {
        url,
        stream: format!("CONFORMANCE_{unique}"),
        subject_prefix: format!("conformance.{unique}"),
        ack_wait: Duration::from_secs(30),
        ..NatsConfig::default()
    }
}

fn fresh() -> Open {
    let (url, server) = nats_url_or_start().expect("a nats-server to test against");
    let server = Arc::new(server);
    let config = config(url);
    Arc::new(move || {
        let (config, _keep_alive) = (config.clone(), server.clone());
        Box::pin(async move {
            let log = NatsLog::connect(config).await.expect("connect to nats");
            Arc::new(log) as Arc<dyn EventLog>
        })
    })
}

meridian_eventlog::conformance_suite!(fresh());

/// Appends, retrying while the server is away, as a service would.
async fn append_retrying(log: &NatsLog, events: Vec<meridian_events::RawEnvelope>) -> Appended {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match log.append(events.clone()).await {
            Ok(done) => return done,
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("append failed for good: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_mid_test_and_the_backend_recovers() {
    // Always our own server: this test must be able to kill it.
    let mut server = NatsServer::start().expect("start nats-server");
    let mut cfg = config(server.url());
    cfg.request_timeout = Duration::from_secs(2);
    let log = NatsLog::connect(cfg).await.expect("connect");
    let a = workflow();
    append_retrying(&log, vec![event(a, 1, json!("before"))]).await;
    let mut sub = log.subscribe("survivor").await.unwrap();
    let got = sub.next(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1);
    sub.ack(got[0].position).await.unwrap();

    server.kill();
    let during = vec![event(a, 2, json!("during"))];
    match log.append(during.clone()).await {
        Err(LogError::Unavailable(_)) => {}
        other => panic!("with the server down an append is Unavailable, got {other:?}"),
    }

    server.resume().expect("restart nats-server");
    // The same client reconnects by itself. "Unavailable" left the outcome unknown (the
    // client may still deliver its buffered publish), so the caller retries the same
    // events: they land exactly once either way.
    append_retrying(&log, during.clone()).await;
    match log.append(during).await {
        Ok(Appended::Duplicate { .. }) => {}
        other => panic!("a second retry is a duplicate, got {other:?}"),
    }
    append_retrying(&log, vec![event(a, 3, json!("after"))]).await;
    assert_eq!(
        payloads(&log, a).await,
        vec![json!("before"), json!("during"), json!("after")]
    );

    // The durable subscription delivers everything after its ack, in order. A SIGKILL
    // may lose the server's record of the latest ack (it writes consumer state lazily),
    // so an acknowledged commit may come again: delivery is at-least-once, and readers
    // de-duplicate by event id or position.
    let mut sub = log.subscribe("survivor").await.unwrap();
    let mut payloads = Vec::new();
    while !payloads.ends_with(&[json!("during"), json!("after")]) {
        let batch = sub.next(10, Duration::from_secs(5)).await.unwrap();
        assert!(
            !batch.is_empty(),
            "the subscription delivers after a restart: {payloads:?}"
        );
        payloads.extend(
            batch
                .into_iter()
                .flat_map(Commit::into_events)
                .map(|e| e.payload),
        );
    }
    let redelivered = &payloads[..payloads.len() - 2];
    assert!(
        redelivered.is_empty() || redelivered == [json!("before")],
        "only already-acknowledged commits may come again, in order: {payloads:?}"
    );
}

/// A read's consumer is deleted once read, and a tail's when the tail is dropped: the
/// server keeps an idle ordered consumer for 30 s, and a stream takes 1,000 consumers
/// by default (nats-server 2.15), which a start folding the log page by page while
/// writers write reached within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_tails_leave_no_consumers_behind() {
    let (url, _server) = nats_url_or_start().expect("a nats-server to test against");
    let cfg = config(url.clone());
    let log = NatsLog::connect(cfg.clone())
        .await
        .expect("connect to nats");
    log.append(vec![event(workflow(), 1, json!("one"))])
        .await
        .unwrap();
    for _ in 0..20 {
        assert_eq!(log.read_from(0, 10).await.unwrap().len(), 1);
    }
    let mut tail = log.tail(0).await.unwrap();
    assert_eq!(
        tail.next(10, Duration::from_secs(5)).await.unwrap().len(),
        1
    );
    drop(tail);

    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let mut stream = js.get_stream(&cfg.stream).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = stream.info().await.unwrap().state.consumer_count;
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} consumers left behind"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A delivery that never reaches the subscription (here taken by another reader of the
/// same durable, as one lost on the way would be) is delivered again, not acknowledged
/// unseen: acknowledgements are cumulative, so acknowledging the commits after it would
/// acknowledge it too, and its commit would never be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_never_arrived_is_delivered_again() {
    use futures::StreamExt;
    let (url, _server) = nats_url_or_start().expect("a nats-server to test against");
    let cfg = config(url.clone());
    let log = NatsLog::connect(cfg.clone())
        .await
        .expect("connect to nats");
    let mut sub = log.subscribe("reader").await.unwrap();
    for i in 1..=3 {
        log.append(vec![event(workflow(), 1, json!(i))])
            .await
            .unwrap();
    }
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let stream = js.get_stream(&cfg.stream).await.unwrap();
    let other: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer("reader").await.unwrap();
    let mut batch = other.fetch().max_messages(1).messages().await.unwrap();
    let taken = batch.next().await.unwrap().unwrap();
    assert_eq!(taken.info().unwrap().stream_sequence, 1);

    let mut positions = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while positions.len() < 3 {
        match sub.next(10, Duration::from_millis(500)).await {
            Ok(commits) => positions.extend(commits.iter().map(|c| c.position)),
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("the subscription failed for good: {e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first commit never came again: {positions:?}"
        );
    }
    assert_eq!(positions, [1, 2, 3]);
}
