//! Load generator for the event log. Measures, in one run on one machine:
//! 1. raw JetStream async publish, no concurrency headers (the ceiling);
//! 2. Meridian's JetStream appends with expected-sequence checks, pipelined across
//!    many aggregates, and one writer alone;
//! 3. the SQLite backend, the same two ways.
//!
//! `cargo bench -p meridian-eventlog --bench append_load [-- --scale 1.0]`
//! Starts its own nats-server (2.10+) unless NATS_URL is set. Prints a Markdown table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use meridian_eventlog::conformance::{event, workflow};
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::testkit::nats_url_or_start;
use meridian_eventlog::EventLog;
use serde_json::json;

struct Row {
    what: String,
    count: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Row {
    fn new(what: impl Into<String>, elapsed: Duration, mut latencies: Vec<Duration>) -> Row {
        latencies.sort();
        Row {
            what: what.into(),
            count: latencies.len(),
            elapsed,
            latencies,
        }
    }

    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }

    fn print(&self) {
        let per_sec = self.count as f64 / self.elapsed.as_secs_f64();
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} |",
            self.what,
            self.count,
            per_sec,
            self.percentile(0.50).as_secs_f64() * 1e3,
            self.percentile(0.99).as_secs_f64() * 1e3,
        );
    }
}

/// A realistic event: a job-finished fact with times, resources and usage.
fn job_finished(i: u64) -> serde_json::Value {
    json!({
        "type": "job.finished.v1",
        "workflow_id": "01936f3e-8a5c-7cc2-9b9e-3f1c2d4e5f60",
        "job": "train",
        "array_index": i,
        "started_at": "2026-11-29T10:00:00Z",
        "ended_at": "2026-11-29T11:00:00Z",
        "exit_code": 0,
        "allocated": {"nodes": 1, "cpus": 8, "memory_bytes": 34359738368u64,
                      "gpus": {"count": 1, "vendor": "nvidia", "model": "H100"}},
    })
}

/// `writers` tasks, each appending `per_writer` single-event commits to its own aggregate.
async fn appends(
    log: Arc<dyn EventLog>,
    writers: usize,
    per_writer: usize,
) -> (Duration, Vec<Duration>) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let a = workflow();
            let mut latencies = Vec::with_capacity(per_writer);
            for seq in 1..=per_writer as u64 {
                let e = event(a, seq, job_finished(seq));
                let t = Instant::now();
                log.append(vec![e]).await.expect("append");
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("writer task"));
    }
    (start.elapsed(), all)
}

async fn raw_publish(url: &str, count: usize, window: usize) -> (Duration, Vec<Duration>) {
    let client = async_nats::connect(url).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let name = format!("BENCH_RAW_{}", uuid::Uuid::now_v7().simple());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("create stream");
    let subject = format!("{name}.raw");
    let payload = vec![b'x'; 128];
    let start = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        if in_flight.len() >= window {
            latencies.push(in_flight.next().await.expect("in flight"));
        }
        let t = Instant::now();
        let ack = js
            .publish(subject.clone(), payload.clone().into())
            .await
            .expect("publish");
        in_flight.push(async move {
            ack.await.expect("ack");
            t.elapsed()
        });
    }
    while let Some(l) = in_flight.next().await {
        latencies.push(l);
    }
    (start.elapsed(), latencies)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let scale: f64 = std::env::args()
        .skip_while(|a| a != "--scale")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let n = |base: usize| ((base as f64 * scale) as usize).max(1);

    let (url, _server) = nats_url_or_start().expect("nats-server for the benchmark");
    let config = NatsConfig {
        url: url.clone(),
        stream: format!("BENCH_{}", uuid::Uuid::now_v7().simple()),
        subject_prefix: format!("bench.{}", uuid::Uuid::now_v7().simple()),
        ..NatsConfig::default()
    };
    let nats: Arc<dyn EventLog> = Arc::new(NatsLog::connect(config).await.expect("connect"));
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite: Arc<dyn EventLog> = Arc::new(
        SqliteLog::open(&dir.path().join("events.sqlite"))
            .await
            .expect("sqlite"),
    );

    let mut rows = Vec::new();
    let (t, l) = raw_publish(&url, n(100_000), 256).await;
    rows.push(Row::new(
        "JetStream raw async publish, 128 B, 256 in flight (ceiling)",
        t,
        l,
    ));
    let (t, l) = appends(nats.clone(), 256, n(100)).await;
    rows.push(Row::new(
        "Meridian JetStream append, expected-sequence, 256 aggregates in parallel",
        t,
        l,
    ));
    let (t, l) = appends(nats.clone(), 1, n(2_000)).await;
    rows.push(Row::new("Meridian JetStream append, one writer", t, l));
    let (t, l) = appends(sqlite.clone(), 256, n(40)).await;
    rows.push(Row::new(
        "Meridian SQLite append (synchronous=FULL), 256 aggregates in parallel",
        t,
        l,
    ));
    let (t, l) = appends(sqlite.clone(), 16, n(200)).await;
    rows.push(Row::new(
        "Meridian SQLite append (synchronous=FULL), 16 aggregates in parallel",
        t,
        l,
    ));
    let (t, l) = appends(sqlite.clone(), 1, n(1_000)).await;
    rows.push(Row::new(
        "Meridian SQLite append (synchronous=FULL), one writer",
        t,
        l,
    ));

    println!("| measurement | appends | per second | p50 ms | p99 ms |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for row in &rows {
        row.print();
    }
}
