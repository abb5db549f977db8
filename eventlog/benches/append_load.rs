//! Load generator for the event log. Measures, in one run on one machine:
//! 1. raw JetStream async publish, no concurrency headers (the ceiling);
//! 2. Meridian's JetStream appends with expected-sequence checks, pipelined across
//!    many aggregates, and one writer alone;
//! 3. the SQLite backend, the same two ways.
//!
//! `cargo bench -p meridian-eventlog --bench append_load [-- --scale 1.0]`
//! Starts its own nats-server (2.10+) unless NATS_URL is set. Prints a Markdown table.

use std::sync::Arc;
use std::time::Duration;

use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::testkit::ceiling::{appends, raw_publish};
use meridian_eventlog::testkit::nats_url_or_start;
use meridian_eventlog::EventLog;

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
    let (t, l) = raw_publish(&url, 1, n(100_000), 256).await;
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
