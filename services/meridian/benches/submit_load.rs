//! Workflows submitted to placed per second on the embedded default: `meridian up` (the
//! SQLite log and read models) is started in a temporary directory, 16 clients post
//! two-job workflows to its API as fast as it answers, and each counts when its
//! `workflow.placement_decided.v1` is in the log. Beside it, in the same run, the SQLite
//! log's own ceiling: 16 writers appending one event per commit to a fresh file.
//!
//! `cargo bench -p meridian --bench submit_load [-- --workflows N]` (default 2,000);
//! `MERIDIAN_BIN=PATH` runs another `meridian` binary.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::testkit::{ceiling, count_until};
use meridian_eventlog::EventLog;

const CLIENTS: usize = 16;

const WORKFLOW: &str = r#"
version: v1
name: load
jobs:
  a: {image: host, command: ["true"], resources: {cpus: 1, memory: 64MiB, walltime: 5m}}
  b: {image: host, command: ["true"], requires: [a], resources: {cpus: 1, memory: 64MiB, walltime: 5m}}
"#;

/// Kills `meridian up` when the benchmark ends, however it ends.
struct Up(std::process::Child);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    meridian_eventlog::testkit::free_port().unwrap()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let workflows: usize = std::env::args()
        .skip_while(|a| a != "--workflows")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = format!("http://127.0.0.1:{port}");
    let log_file = std::fs::File::create(dir.path().join("up.log")).unwrap();
    // MERIDIAN_BIN runs another build (to compare two in one run).
    let binary =
        std::env::var("MERIDIAN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_meridian").into());
    let _up = Up(Command::new(binary)
        .args([
            "up",
            "--data-dir",
            "data",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("HOME", dir.path())
        .env("MERIDIAN_CONFIG_DIR", dir.path().join("config"))
        .env("MERIDIAN_LOG", "warn")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file))
        .spawn()
        .expect("start meridian up"));
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while http
        .get(format!("{server}/v1/health"))
        .send()
        .await
        .map(|r| !r.status().is_success())
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "meridian up did not answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let profile: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("config/client.json")).expect("the profile"),
    )
    .unwrap();
    let token = profile["token"].as_str().expect("a token").to_string();
    // A second handle on the same file, as another process would have.
    let log = SqliteLog::open(&dir.path().join("data/events.sqlite"))
        .await
        .unwrap();
    let from = log.head().await.unwrap();

    let start = Instant::now();
    let submitters: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (http, server, token) = (http.clone(), server.clone(), token.clone());
            let count = workflows / CLIENTS + usize::from(c < workflows % CLIENTS);
            tokio::spawn(async move {
                for _ in 0..count {
                    let response = http
                        .post(format!("{server}/v1/workflows"))
                        .bearer_auth(&token)
                        .header("content-type", "application/yaml")
                        .body(WORKFLOW)
                        .send()
                        .await
                        .expect("submit");
                    assert!(
                        response.status().is_success(),
                        "{}",
                        response.text().await.unwrap_or_default()
                    );
                }
            })
        })
        .collect();
    // When the API has accepted every submission: how fast the front door alone goes.
    let accepted = tokio::spawn(async move {
        for s in submitters {
            s.await.unwrap();
        }
        start.elapsed()
    });
    count_until(
        &log,
        from,
        "workflow.placement_decided.v1",
        "workflow.placement_rejected.v1",
        workflows,
    )
    .await;
    let elapsed = start.elapsed();
    // How far the rest of the pipeline got meanwhile (releases, runs, their ends): a
    // build that runs the jobs faster has more of that work in the same seconds.
    let commits = log.head().await.unwrap() - from;
    let accepted = accepted.await.unwrap();
    drop(_up);
    let fresh = tempfile::tempdir().unwrap();
    let appends =
        ceiling::sqlite_appends_per_second(&fresh.path().join("ceiling.sqlite"), CLIENTS, 200)
            .await;
    let rate = workflows as f64 / elapsed.as_secs_f64();
    println!("| measurement | count | seconds | per second |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| `meridian up`: two-job workflows, {CLIENTS} clients, submit → placement_decided | {workflows} | {:.2} | {rate:.0} |",
        elapsed.as_secs_f64()
    );
    println!(
        "| … of which accepted by the API (submit answered) | {workflows} | {:.2} | {:.0} |",
        accepted.as_secs_f64(),
        workflows as f64 / accepted.as_secs_f64()
    );
    println!(
        "| … commits in the log meanwhile (every service's, the jobs' included) | {commits} | {:.2} | {:.0} |",
        elapsed.as_secs_f64(),
        commits as f64 / elapsed.as_secs_f64()
    );
    println!(
        "| SQLite log alone: fsynced appends, {CLIENTS} writers (ceiling) | {} | – | {appends:.0} |",
        CLIENTS * 200
    );
}
