//! Load generator for the ledger. Measures, on one machine:
//! 1. ingest: how many billable events per second the ledger projection applies from a
//!    log into a fresh SQLite store and into a fresh PostgreSQL database (`catch_up`,
//!    the same code path as the service, 256 commits per transaction);
//! 2. rebuild: the time to rebuild the ledger from a log of `--rebuild N` synthetic
//!    billable events (1,000,000 for the figure in BENCHMARKS.md), into SQLite and,
//!    with `--rebuild-postgres`, into PostgreSQL.
//!
//! ```text
//! cargo bench -p meridian-accounting --bench ledger_load -- [--ingest 20000] [--rebuild 1000000] [--rebuild-postgres] [--export FILE] [--page COMMITS]
//! ```
//! Each log is also read and decoded alone first (every event the ledger reads, as it
//! reads them): the ceiling the projection is measured against. `--export FILE` writes
//! what the rebuilt ledger holds — the FOCUS export of every month, then every line —
//! so that two builds can be compared byte for byte.
//! The rebuild runs only when asked (`--rebuild`), so CI never does. The synthetic log
//! (`meridian_accounting::synthetic`: compute on HPC, Kubernetes and cloud sites, runs
//! that fail or are cancelled, volumes and caches, tiered egress, discounts, month
//! ends) is written straight into the SQLite log's table in large transactions, since
//! building it through `append` (one fsync per commit) would take longer than the
//! measurement. PostgreSQL: `MERIDIAN_TEST_POSTGRES` or the local server, a fresh
//! database per measurement. Prints Markdown table rows.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meridian_accounting::{rebuild_with, synthetic, Ledger, Replay};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_store::{catch_up, Store};
use sqlx::Row;

struct Args {
    ingest: u64,
    rebuild: Option<u64>,
    rebuild_postgres: bool,
    skip_postgres: bool,
    seed: u64,
    export: Option<std::path::PathBuf>,
    page: Option<usize>,
}

fn args() -> Args {
    let mut a = Args {
        ingest: 20_000,
        rebuild: None,
        rebuild_postgres: false,
        skip_postgres: false,
        seed: 42,
        export: None,
        page: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |name: &str| -> u64 {
            it.next()
                .and_then(|v| v.replace('_', "").parse().ok())
                .unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match arg.as_str() {
            "--ingest" => a.ingest = number("--ingest"),
            "--rebuild" => a.rebuild = Some(number("--rebuild")),
            "--seed" => a.seed = number("--seed"),
            "--rebuild-postgres" => a.rebuild_postgres = true,
            "--skip-postgres" => a.skip_postgres = true,
            "--page" => a.page = Some(number("--page") as usize),
            "--export" => a.export = Some(it.next().expect("--export takes a file").into()),
            // `cargo bench` passes --bench; anything else is ignored too.
            _ => {}
        }
    }
    a
}

/// Writes `billable` synthetic billable events (and the commits they need) into a new
/// SQLite log at `path`; returns (commits, events).
async fn build_log(path: &Path, billable: u64, seed: u64) -> (u64, u64) {
    let mut generator = synthetic::Generator::new(seed);
    synthetic::write_sqlite_log(path, &mut generator, |g, _| g.billable >= billable)
        .await
        .expect("write the synthetic log")
}

async fn lines(store: &Store) -> i64 {
    sqlx::query("SELECT COUNT(*) FROM ledger_charges")
        .fetch_one(store.pool())
        .await
        .unwrap()
        .get::<i64, _>(0)
}

struct Measured {
    elapsed: Duration,
    lines: i64,
}

async fn ingest(store: &Store, log: &dyn EventLog) -> Measured {
    let start = Instant::now();
    catch_up(store, log, &Ledger).await.expect("catch up");
    Measured {
        elapsed: start.elapsed(),
        lines: lines(store).await,
    }
}

/// Reads the whole log as a catch-up does (or, with `as_rebuild`, as a rebuild does)
/// and decodes every event the ledger reads: what the projection could reach if
/// pricing and writing cost nothing.
async fn read_alone(log: &dyn EventLog, as_rebuild: bool) -> Duration {
    let start = Instant::now();
    let (mut position, mut decoded) = (0, 0u64);
    loop {
        if as_rebuild {
            let commits = log
                .read_text_from(position, 4096)
                .await
                .expect("read the log");
            let Some(last) = commits.last() else { break };
            position = last.position;
            decoded +=
                meridian_accounting::ledger::decode_as_rebuild(&commits).expect("decode") as u64;
            continue;
        }
        let commits = log.read_from(position, 4096).await.expect("read the log");
        let Some(last) = commits.last() else { break };
        position = last.position;
        for event in commits.iter().flat_map(|c| c.events.iter()) {
            let tag = event.payload.get("type").and_then(|t| t.as_str());
            if tag.is_some_and(|t| meridian_accounting::ledger::READS.contains(&t)) {
                meridian_events::Event::from_payload(&event.payload).expect("decode");
                decoded += 1;
            }
        }
    }
    assert!(decoded > 0);
    start.elapsed()
}

/// Writes the FOCUS export of every month the ledger holds, then every line in key
/// order, to `path`.
async fn export(store: &Store, path: &Path) {
    use std::fmt::Write;
    let mut out = String::new();
    let periods: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT period FROM ledger_charges ORDER BY period")
            .fetch_all(store.pool())
            .await
            .unwrap();
    for period in periods {
        let export = meridian_accounting::focus::export(store, period.parse().unwrap(), None)
            .await
            .unwrap();
        let _ = writeln!(out, "# FOCUS {period}");
        out.push_str(&meridian_accounting::focus::to_csv(&export.rows));
    }
    let _ = writeln!(out, "# ledger_charges");
    let columns: Vec<String> = meridian_accounting::ledger::COLUMNS
        .iter()
        .map(|c| format!("COALESCE(CAST({c} AS TEXT), '-')"))
        .collect();
    let rows = sqlx::query(&format!(
        "SELECT {} FROM ledger_charges ORDER BY event_id, item",
        columns.join(" || '|' || ")
    ))
    .fetch_all(store.pool())
    .await
    .unwrap();
    for r in rows {
        out.push_str(&r.get::<String, _>(0));
        out.push('\n');
    }
    std::fs::write(path, out).expect("write the export");
}

fn row(what: &str, billable: u64, events: u64, m: &Measured) {
    let s = m.elapsed.as_secs_f64();
    println!(
        "| {what} | {billable} | {events} | {} | {:.1} | {:.0} | {:.0} |",
        m.lines,
        s,
        billable as f64 / s,
        events as f64 / s,
    );
}

async fn postgres() -> Option<(String, Store)> {
    match meridian_store::testing::fresh_postgres().await {
        Ok(url) => Some((url.clone(), Store::connect(&url).await.ok()?)),
        Err(e) => {
            eprintln!("no PostgreSQL ({e}); skipping its lines");
            None
        }
    }
}

#[tokio::main]
async fn main() {
    let args = args();
    let dir = tempfile::tempdir().unwrap();
    println!("| measurement | billable events | log events | ledger lines | seconds | billable/s | log events/s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");

    // 1. Ingest.
    let path = dir.path().join("ingest-events.sqlite");
    let t = Instant::now();
    let (_, events) = build_log(&path, args.ingest, args.seed).await;
    eprintln!(
        "built an ingest log of {events} events in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let log: Arc<dyn EventLog> = Arc::new(SqliteLog::open(&path).await.unwrap());
    let alone = read_alone(&*log, false).await;
    let m = Measured {
        elapsed: alone,
        lines: 0,
    };
    row(
        "read and decode the log alone (ceiling)",
        args.ingest,
        events,
        &m,
    );
    let sqlite = Store::connect(&format!(
        "sqlite://{}",
        dir.path().join("ingest-ledger.sqlite").display()
    ))
    .await
    .unwrap();
    let m = ingest(&sqlite, &*log).await;
    row(
        "ingest into SQLite (synchronous=FULL, WAL)",
        args.ingest,
        events,
        &m,
    );
    if !args.skip_postgres {
        if let Some((url, store)) = postgres().await {
            let m = ingest(&store, &*log).await;
            row("ingest into PostgreSQL", args.ingest, events, &m);
            store.pool().close().await;
            meridian_store::testing::drop_postgres(&url).await;
        }
    }

    // 2. Rebuild, only when asked.
    if let Some(n) = args.rebuild {
        let mut replay = Replay::default();
        if let Some(page) = args.page {
            replay.page = page;
        }
        let path = dir.path().join("rebuild-events.sqlite");
        let t = Instant::now();
        let (_, events) = build_log(&path, n, args.seed + 1).await;
        eprintln!(
            "built a log of {events} events ({n} billable) in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let log: Arc<dyn EventLog> = Arc::new(SqliteLog::open(&path).await.unwrap());
        let m = Measured {
            elapsed: read_alone(&*log, true).await,
            lines: 0,
        };
        row("read and decode the log alone (ceiling)", n, events, &m);
        let store = Store::connect(&format!(
            "sqlite://{}",
            dir.path().join("rebuild-ledger.sqlite").display()
        ))
        .await
        .unwrap();
        let start = Instant::now();
        let rebuilt = rebuild_with(&store, &*log, replay).await.expect("rebuild");
        let m = Measured {
            elapsed: start.elapsed(),
            lines: rebuilt.lines as i64,
        };
        row("rebuild into SQLite", n, events, &m);
        if let Some(path) = &args.export {
            export(&store, path).await;
            eprintln!("wrote what the ledger holds to {}", path.display());
        }
        if args.rebuild_postgres {
            if let Some((url, store)) = postgres().await {
                let start = Instant::now();
                let rebuilt = rebuild_with(&store, &*log, replay).await.expect("rebuild");
                let m = Measured {
                    elapsed: start.elapsed(),
                    lines: rebuilt.lines as i64,
                };
                row("rebuild into PostgreSQL", n, events, &m);
                store.pool().close().await;
                meridian_store::testing::drop_postgres(&url).await;
            }
        }
    }
}
