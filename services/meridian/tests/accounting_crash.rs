//! The ledger survives being killed: `meridian server accounting` over a real
//! nats-server and PostgreSQL is SIGKILLed at random moments while billable events
//! arrive, restarted each time, and must end equal, line for line, to a clean rebuild
//! of the same log in another database. Also the accounting verbs of the CLI: the
//! embedded rebuild (refused while `meridian up` holds the data directory), tenant
//! adjustments, and bills and FOCUS exports through a running Meridian.

mod common;

use std::time::{Duration, Instant};

use common::*;
use meridian_accounting::{snapshot, Ledger, NAME};
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::testkit::NatsServer;
use meridian_eventlog::EventLog;
use meridian_store::{catch_up, Store};

/// xorshift64*, seeded from the clock and printed, so a failure can be replayed with
/// MERIDIAN_CRASH_SEED.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("MERIDIAN_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("crash test seed: MERIDIAN_CRASH_SEED={seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

#[test]
fn a_killed_ledger_consumer_ends_equal_to_a_clean_rebuild() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let nats = NatsServer::start().expect("a nats-server 2.10+ (set MERIDIAN_NATS_SERVER)");
    let database = rt
        .block_on(meridian_store::testing::fresh_postgres())
        .expect("PostgreSQL (set MERIDIAN_TEST_POSTGRES)");
    let reference = rt
        .block_on(meridian_store::testing::fresh_postgres())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = rt
        .block_on(NatsLog::connect(NatsConfig {
            url: nats.url(),
            ..NatsConfig::default()
        }))
        .unwrap();
    let store = rt.block_on(Store::connect(&database)).unwrap();
    let mut rng = Rng::new();

    // A few thousand billable events (every kind of charge, tiered egress whose price
    // depends on what came before, adjustments, month ends), in 12 slices.
    let history = meridian_accounting::synthetic::history(rng.below(1 << 32), 3000);
    let slices: Vec<&[Vec<meridian_events::RawEnvelope>]> =
        history.chunks(history.len().div_ceil(12)).collect();
    let url = nats.url();
    let env = [
        ("MERIDIAN_NATS_URL", url.as_str()),
        ("MERIDIAN_DATABASE_URL", database.as_str()),
    ];
    let position = || rt.block_on(store.position(NAME)).unwrap_or(0);
    let mut kills = Vec::new();
    for (round, slice) in slices.iter().enumerate() {
        let mut accounting = Proc::spawn(
            &format!("accounting-{round}"),
            dir.path(),
            &["server", "accounting"],
            &env,
        );
        // Events arrive while it starts and runs; it is killed at a random moment:
        // while it starts, while it catches up or applies this slice, or after.
        let cut = rng.below(slice.len() as u64) as usize;
        rt.block_on(async {
            for commit in &slice[..cut] {
                log.append(commit.clone()).await.unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        rt.block_on(async {
            for commit in &slice[cut..] {
                log.append(commit.clone()).await.unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(rng.below(150)));
        accounting.kill();
        kills.push((position(), rt.block_on(log.head()).unwrap()));
    }
    eprintln!("(ledger position, log head) at each kill: {kills:?}");

    // Restarted once more, it finishes the log.
    let accounting = Proc::spawn(
        "accounting-last",
        dir.path(),
        &["server", "accounting"],
        &env,
    );
    let head = rt.block_on(log.head()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while position() < head {
        assert!(
            Instant::now() < deadline,
            "the ledger never reached the log's head {head}:\n{}",
            accounting.output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(accounting);

    // A clean replay of the same log into a fresh database.
    let clean = rt.block_on(Store::connect(&reference)).unwrap();
    rt.block_on(catch_up(&clean, &log, &Ledger)).unwrap();
    let (survived, rebuilt) = (
        rt.block_on(snapshot(&store)).unwrap(),
        rt.block_on(snapshot(&clean)).unwrap(),
    );
    assert!(rebuilt.lines.len() > 5000, "{} lines", rebuilt.lines.len());
    assert_eq!(survived.position, rebuilt.position);
    assert_eq!(survived.lines.len(), rebuilt.lines.len());
    for (a, b) in survived.lines.iter().zip(&rebuilt.lines) {
        assert_eq!(a, b, "a line differs from the rebuild's");
    }
    assert_eq!(survived.egress_volume, rebuilt.egress_volume);
    assert_eq!(survived.applied, rebuilt.applied);
    assert_eq!(survived.adjustments, rebuilt.adjustments);

    rt.block_on(async {
        store.pool().close().await;
        clean.pool().close().await;
        meridian_store::testing::drop_postgres(&database).await;
        meridian_store::testing::drop_postgres(&reference).await;
    });
}

fn run(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("MERIDIAN_LOG", "warn")
        .output()
        .expect("run meridian")
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn embedded_rebuild_from_the_cli() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    rt.block_on(async {
        let log = SqliteLog::open(&data.join("events.sqlite")).await.unwrap();
        for commit in meridian_accounting::synthetic::history(5, 60) {
            log.append(commit).await.unwrap();
        }
    });

    // While `meridian up` holds the data directory, the rebuild is refused.
    {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(data.join("lock"))
            .unwrap();
        lock.try_lock().unwrap();
        let out = run(
            dir.path(),
            &["admin", "rebuild", "accounting", "--data-dir", data_arg],
        );
        assert!(!out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("in use by another Meridian process"),
            "{}",
            text(&out)
        );
    }
    // Neither a data directory nor a database: it says what it needs.
    let out = run(dir.path(), &["admin", "rebuild", "accounting"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--data-dir"), "{}", text(&out));

    // With the directory free, the rebuild replays the log into the embedded store:
    // the same ledger as a replay here.
    let out = run(
        dir.path(),
        &["admin", "rebuild", "accounting", "--data-dir", data_arg],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("rebuilt the ledger"), "{}", text(&out));
    let (rebuilt, replayed) = rt.block_on(async {
        let store = Store::connect(&format!(
            "sqlite://{}",
            data.join("meridian.sqlite").display()
        ))
        .await
        .unwrap();
        let other = Store::connect(&format!(
            "sqlite://{}",
            dir.path().join("other.sqlite").display()
        ))
        .await
        .unwrap();
        let log = SqliteLog::open(&data.join("events.sqlite")).await.unwrap();
        catch_up(&other, &log, &Ledger).await.unwrap();
        (
            snapshot(&store).await.unwrap(),
            snapshot(&other).await.unwrap(),
        )
    });
    assert!(!rebuilt.lines.is_empty());
    assert_eq!(rebuilt, replayed);
    assert_eq!(
        rebuilt.adjustments.len(),
        3,
        "the synthetic history's adjustments, rebuilt"
    );
}

#[test]
fn bills_and_focus_exports_through_a_running_meridian() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (server, _up) = up_at(dir.path(), port, &[], &[]);
    let file = write(
        dir.path(),
        "one.yaml",
        "version: v1\nname: one\njobs:\n  a:\n    image: host\n    command: [sh, -c, \"sleep 0.3\"]\n    resources: {cpus: 1, memory: 64MiB, walltime: 1m}\n",
    );
    let status = submit_wait(&server, &file);
    assert_eq!(status["state"], "finished", "{status:#}");
    let id = status["id"].as_str().unwrap();
    let bill = bill(&server, id, 1);
    let lines = bill["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 2, "cores and memory: {bill:#}");
    assert_eq!(bill["by_category"][0]["category"], "compute");
    assert_eq!(bill["by_site"][0]["site"], "local");
    let period = lines[0]["period"].as_str().unwrap().to_string();

    // The human table has the lines and the totals by category and site.
    let out = cli(&server, &["bill", id]);
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{table}");
    for needle in ["CATEGORY", "SITE", "compute", "local", "total "] {
        assert!(table.contains(needle), "{needle} missing from:\n{table}");
    }

    let tenant = cli_json(
        &server,
        &["bills", "--tenant", "default", "--period", &period],
    );
    assert!(tenant["lines"].as_u64().unwrap() >= 2, "{tenant:#}");
    assert_eq!(tenant["workflows"][0]["workflow_id"], id);
    let out = cli(
        &server,
        &["bills", "--tenant", "default", "--period", "2026-13"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 400"));

    let csv = dir.path().join("focus.csv");
    let out = cli(
        &server,
        &[
            "export",
            "focus",
            "--period",
            &period,
            "--tenant",
            "default",
            "--out",
            csv.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("BillingAccountId,"), "{text}");
    assert!(text.lines().count() >= 3, "{text}");
    let out = cli(
        &server,
        &["export", "focus", "--period", &period, "--format", "json"],
    );
    assert!(out.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), text.lines().count() - 1);
    assert_eq!(rows[0]["ProviderName"], "local");
}
