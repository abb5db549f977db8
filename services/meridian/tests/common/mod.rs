//! Shared by the end-to-end tests: running `meridian` processes, talking to them with
//! the CLI as a user would, and the scenarios both deployments must pass.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_meridian");

/// A child process killed (SIGKILL) when dropped; its output goes to a log file.
pub struct Proc {
    pub child: Child,
    pub name: String,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(BIN)
            .args(args)
            .env("MERIDIAN_CONFIG_DIR", dir.join("config"))
            .envs(env.iter().copied())
            .env("MERIDIAN_LOG", "info,sqlx=warn")
            .current_dir(dir)
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn meridian");
        Proc {
            child,
            name: name.into(),
            log,
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn free_port() -> u16 {
    meridian_eventlog::testkit::free_port().unwrap()
}

/// How the CLI authenticates to each deployment under test: the client profile
/// `meridian up` wrote, or the first admin token `meridian server intake` wrote.
static CREDENTIALS: std::sync::Mutex<BTreeMap<String, (&'static str, String)>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Learns how to authenticate to `server` from what `proc` wrote in its directory.
pub fn learn_credentials(server: &str, proc: &Proc) {
    let dir = proc.log.parent().unwrap();
    let credential = if dir.join("config").join("client.json").exists() {
        (
            "MERIDIAN_CONFIG_DIR",
            dir.join("config").display().to_string(),
        )
    } else if let Ok(token) = std::fs::read_to_string(dir.join("admin-token")) {
        ("MERIDIAN_TOKEN", token.trim().to_string())
    } else {
        return;
    };
    CREDENTIALS
        .lock()
        .unwrap()
        .insert(server.to_string(), credential);
}

/// The admin credential of `server`, as an environment variable for the CLI.
pub fn credential(server: &str) -> Option<(&'static str, String)> {
    CREDENTIALS.lock().unwrap().get(server).cloned()
}

/// Runs the CLI against `server`, as its admin.
pub fn cli(server: &str, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).env("MERIDIAN_SERVER", server);
    command.env_remove("MERIDIAN_TOKEN");
    // Never the profile of whoever runs the tests.
    command.env("MERIDIAN_CONFIG_DIR", "/nonexistent/meridian-tests");
    if let Some((name, value)) = credential(server) {
        command.env(name, value);
    }
    command.output().expect("run meridian")
}

/// Runs the CLI against `server` with `token`.
pub fn cli_as(server: &str, token: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("MERIDIAN_SERVER", server)
        .env("MERIDIAN_CONFIG_DIR", "/nonexistent/meridian-tests")
        .env("MERIDIAN_TOKEN", token)
        .output()
        .expect("run meridian")
}

/// Runs the CLI against `server`; it must succeed. Its standard output.
pub fn cli_ok(server: &str, args: &[&str]) -> String {
    let out = cli(server, args);
    assert!(
        out.status.success(),
        "meridian {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

pub fn cli_json(server: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = cli(server, &all);
    assert!(
        out.status.success(),
        "meridian {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// Waits until the API answers, or panics with the processes' output.
pub fn wait_ready(server: &str, procs: &[&Proc]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(first) = procs.first() {
            learn_credentials(server, first);
        }
        if cli(server, &["list"]).status.success() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let logs: Vec<String> = procs
        .iter()
        .map(|p| format!("--- {} ---\n{}", p.name, p.output()))
        .collect();
    panic!("Meridian at {server} never answered:\n{}", logs.join("\n"));
}

/// `meridian up` in `dir` on `port`, with the sites of the catalogue file `catalog` and
/// one adapter (`NAME=KIND:FILE`); returns the API's address once it answers.
pub fn up_with_adapter(dir: &Path, port: u16, catalog: &str, adapter: &str) -> (String, Proc) {
    up_with_adapter_env(dir, port, catalog, adapter, &[])
}

/// [`up_with_adapter`] with `env` set for Meridian (an SDK's credentials).
pub fn up_with_adapter_env(
    dir: &Path,
    port: u16,
    catalog: &str,
    adapter: &str,
    env: &[(&str, &str)],
) -> (String, Proc) {
    up_with_adapters_env(dir, port, catalog, &[adapter], env)
}

/// `meridian up` with the catalogue `catalog_text` and one adapter, `SITE=KIND:CONFIG`, the
/// environment `env` added, once that site's runner is connected: work submitted earlier
/// would be placed elsewhere (`not connected`).
pub fn up_site(
    dir: &Path,
    catalog_text: &str,
    site: &str,
    kind: &str,
    config: &Path,
    env: &[(&str, &str)],
) -> (String, Proc) {
    let catalog = write(dir, "catalog.yaml", catalog_text);
    let (server, proc) = up_with_adapter_env(
        dir,
        free_port(),
        catalog.to_str().unwrap(),
        &format!("{site}={kind}:{}", config.display()),
        env,
    );
    wait_connected(&server, site, &proc);
    (server, proc)
}

/// A runtime of one worker, for a stand-in these (synchronous) tests start.
pub fn standin_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// None of `secrets` in what Meridian wrote: its data directory under `dir` (the log,
/// the read models), its output, and `meridian events` of workflow `id`.
pub fn assert_no_secret_written(dir: &Path, proc: &Proc, server: &str, id: &str, secrets: &[&str]) {
    let mut written = files_under(&dir.join("data"));
    written.push((proc.log.clone(), proc.output().into_bytes()));
    written.push((
        "meridian events".into(),
        cli(server, &["events", id]).stdout,
    ));
    for (path, bytes) in written {
        let text = String::from_utf8_lossy(&bytes);
        for secret in secrets {
            assert!(
                !text.contains(secret),
                "{} holds a secret ({}…)",
                path.display(),
                &secret[..8]
            );
        }
    }
}

/// [`up_with_adapter_env`] with several adapters.
pub fn up_with_adapters_env(
    dir: &Path,
    port: u16,
    catalog: &str,
    adapters: &[&str],
    env: &[(&str, &str)],
) -> (String, Proc) {
    let mut args = vec!["--catalog", catalog];
    for adapter in adapters {
        args.extend(["--adapter", adapter]);
    }
    let proc = spawn_up(dir, port, &args, env);
    let server = format!("http://127.0.0.1:{port}");
    wait_ready(&server, &[&proc]);
    (server, proc)
}

pub fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// Submits `file` and waits for the end with the CLI's `--wait`; returns the status.
pub fn submit_wait(server: &str, file: &Path) -> Value {
    let out = submit_waiting(server, file);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "submit --wait gave no status: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// `meridian submit FILE --wait --output json`, as it came out.
pub fn submit_waiting(server: &str, file: &Path) -> Output {
    cli(
        server,
        &[
            "submit",
            file.to_str().unwrap(),
            "--wait",
            "--output",
            "json",
        ],
    )
}

pub fn submit(server: &str, file: &Path) -> String {
    let accepted = cli_json(server, &["submit", file.to_str().unwrap()]);
    accepted["id"].as_str().expect("an id").to_string()
}

pub fn wait_state(server: &str, id: &str, want: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = cli_json(server, &["status", id]);
        if want.contains(&status["state"].as_str().unwrap_or("")) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "workflow {id} never reached {want:?}: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// (task name, started, ended) of every job run, from the event history.
pub fn runs(server: &str, id: &str) -> Vec<(String, DateTime<Utc>, DateTime<Utc>, String)> {
    let events = cli_json(server, &["events", id]);
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut started: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    let mut out = Vec::new();
    for e in events["events"].as_array().unwrap() {
        let job = e["aggregate"]["id"].as_str().unwrap().to_string();
        let p = &e["payload"];
        match p["type"].as_str().unwrap() {
            "job.dispatched.v1" => {
                let name = match p["index"].as_u64() {
                    Some(i) => format!("{}[{i}]", p["job"].as_str().unwrap()),
                    None => p["job"].as_str().unwrap().to_string(),
                };
                names.insert(job, name);
            }
            "job.started.v1" => {
                started.insert(job, time(&p["started_at"]));
            }
            kind @ ("job.finished.v1" | "job.failed.v1" | "job.cancelled.v1") => {
                if let Some(s) = p["started_at"].as_str() {
                    out.push((
                        names[&job].clone(),
                        s.parse().unwrap(),
                        time(&p["ended_at"]),
                        kind.to_string(),
                    ));
                }
            }
            _ => {}
        }
    }
    let _ = started;
    out
}

/// The runs a bill charges compute for: its lines grouped by job id (a run has one
/// line per priced dimension, e.g. cores and memory).
pub fn billed_runs(bill: &Value) -> BTreeMap<String, Vec<Value>> {
    let mut runs: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for line in bill["lines"].as_array().unwrap() {
        if let Some(job) = line["job_id"].as_str() {
            runs.entry(job.to_string()).or_default().push(line.clone());
        }
    }
    runs
}

/// Waits for the bill to charge `runs` runs (the ledger follows the log by a moment).
pub fn bill(server: &str, id: &str, runs: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let bill = cli_json(server, &["bill", id]);
        if billed_runs(&bill).len() >= runs {
            return bill;
        }
        assert!(
            Instant::now() < deadline,
            "the bill never charged {runs} runs: {bill:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn dec(v: &Value) -> Decimal {
    Decimal::from_str(v.as_str().unwrap()).unwrap()
}

/// Every run costs its time at the local site's default rates (0.01 per core-hour,
/// 0.001 per GiB-hour) for `cpus` cores and `memory_gib` GiB, computed here by hand
/// over its lines (one per priced dimension); the total is the lines' sum.
pub fn check_bill(bill: &Value, cpus: u32, memory_gib: Decimal) {
    check_bill_at(bill, "USD", ("0.01", "0.001"), |_| {
        (u64::from(cpus), memory_gib)
    });
}

/// Every run is its run time × (cores × `rates.0` + GiB × `rates.1`), computed here by
/// hand for the allocation `allocation(job id)` gives; the total is the lines' sum.
pub fn check_bill_at(
    bill: &Value,
    currency: &str,
    rates: (&str, &str),
    allocation: impl Fn(&str) -> (u64, Decimal),
) {
    let (core_rate, gib_rate) = (
        Decimal::from_str(rates.0).unwrap(),
        Decimal::from_str(rates.1).unwrap(),
    );
    let mut sum = Decimal::ZERO;
    for (job, lines) in billed_runs(bill) {
        let (cpus, gib) = allocation(&job);
        let per_hour = Decimal::from(cpus) * core_rate + gib * gib_rate;
        let mut seconds = 0;
        let mut amount = Decimal::ZERO;
        for line in &lines {
            assert_eq!(line["currency"], currency);
            amount += dec(&line["amount"]);
            // A run's dimensions share its stretch; one cut at a month's end has a
            // line per dimension in each month.
            if line["meter"] == "core_hours" {
                seconds += (time(&line["ended_at"]) - time(&line["started_at"]))
                    .num_microseconds()
                    .unwrap();
            }
        }
        let hours = Decimal::from(seconds) / Decimal::from(3_600_000_000u64);
        let expected = per_hour * hours;
        assert!(
            (amount - expected).abs() < Decimal::from_str("0.0000000001").unwrap(),
            "run {job} ({lines:#?}) should cost {expected}"
        );
        sum += amount;
    }
    let totals = bill["totals"].as_array().unwrap();
    assert_eq!(totals.len(), 1, "one currency, one total: {bill:#}");
    assert_eq!(dec(&totals[0]["amount"]), sum.normalize());
}

pub const DAG: &str = r#"
version: v1
name: dag-and-array
jobs:
  prep:
    image: host
    command: [sh, -c, "echo prep; sleep 0.3"]
    resources: {cpus: 1, memory: 64MiB, walltime: 1m}
  sweep:
    requires: [prep]
    image: host
    command: [sh, -c, "echo cell ${ARRAY_INDEX}; sleep 0.4"]
    array: {start: 1, end: 6, parallelism: 2}
    resources: {cpus: 1, memory: 64MiB, walltime: 1m}
  report:
    requires: [sweep]
    image: host
    command: [sh, -c, "echo report"]
    resources: {cpus: 1, memory: 64MiB, walltime: 1m}
"#;

/// A DAG with a task array runs in order, within the array's cap, and is billed.
/// Returns the workflow's id.
pub fn dag_and_array(server: &str, dir: &Path) -> String {
    let file = write(dir, "dag.yaml", DAG);
    let status = submit_wait(server, &file);
    assert_eq!(status["state"], "finished", "{status:#}");
    assert_eq!(status["tasks"]["succeeded"], 8, "{status:#}");
    let id = status["id"].as_str().unwrap();

    let runs = runs(server, id);
    assert_eq!(runs.len(), 8, "{runs:?}");
    let of = |prefix: &'static str| runs.iter().filter(move |r| r.0.starts_with(prefix));
    let prep_end = of("prep").map(|r| r.2).max().unwrap();
    let sweep_start = of("sweep").map(|r| r.1).min().unwrap();
    let sweep_end = of("sweep").map(|r| r.2).max().unwrap();
    let report_start = of("report").map(|r| r.1).min().unwrap();
    assert!(prep_end <= sweep_start, "sweep waits for prep");
    assert!(
        sweep_end <= report_start,
        "report waits for the whole sweep"
    );
    within_cap(&runs, "sweep", 2);
    printed(server, id, "sweep", (1..=6).map(|i| format!("cell {i}")));

    let bill = bill(server, id, 8);
    check_bill(&bill, 1, Decimal::from_str("0.0625").unwrap());
    id.to_string()
}

/// No task of job `job` (by name prefix) started while `cap` others of it ran.
pub fn within_cap(runs: &[(String, DateTime<Utc>, DateTime<Utc>, String)], job: &str, cap: usize) {
    let of = || runs.iter().filter(|r| r.0.starts_with(job));
    for (name, start, _, _) in of() {
        let overlapping = of().filter(|r| r.1 <= *start && *start < r.2).count();
        assert!(
            overlapping <= cap,
            "{name} started with {overlapping} {job} tasks running (cap {cap})"
        );
    }
}

/// `meridian logs ID JOB` holds each of `lines`.
pub fn printed(server: &str, id: &str, job: &str, lines: impl Iterator<Item = String>) {
    let logs = cli(server, &["logs", id, job]);
    let text = String::from_utf8_lossy(&logs.stdout);
    for line in lines {
        assert!(
            text.contains(&line),
            "{job}'s output has no {line:?}: {text}"
        );
    }
}

pub const FAILING: &str = r#"
version: v1
name: one-fails
jobs:
  ok:
    image: host
    command: [sh, -c, "sleep 0.2"]
    resources: {cpus: 1, memory: 64MiB, walltime: 1m}
  bad:
    requires: [ok]
    image: host
    command: [sh, -c, "echo about to fail >&2; sleep 0.2; exit 3"]
    resources: {cpus: 1, memory: 64MiB, walltime: 1m}
  never:
    requires: [bad]
    image: host
    command: [sh, -c, "echo should not run"]
    resources: {cpus: 1, memory: 64MiB, walltime: 1m}
"#;

/// A failing job fails its dependents and the workflow; what ran is still billed.
pub fn failing_job(server: &str, dir: &Path) {
    let file = write(dir, "failing.yaml", FAILING);
    let out = submit_waiting(server, &file);
    assert_eq!(
        out.status.code(),
        Some(1),
        "--wait exits 1 when the workflow fails"
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["state"], "failed", "{status:#}");
    let id = status["id"].as_str().unwrap();
    let jobs = status["jobs"].as_array().unwrap();
    let bad = jobs.iter().find(|j| j["name"] == "bad").expect("bad ran");
    assert_eq!(bad["state"], "failed");
    assert_eq!(bad["exit_code"], 3);
    assert!(
        jobs.iter().all(|j| j["name"] != "never"),
        "never was never released: {status:#}"
    );
    let runs = runs(server, id);
    assert_eq!(runs.len(), 2, "ok and bad ran, once each: {runs:?}");

    let bill = bill(server, id, 2);
    assert_eq!(billed_runs(&bill).len(), 2, "{bill:#}");
    check_bill(&bill, 1, Decimal::from_str("0.0625").unwrap());
}

pub const SLOW: &str = r#"
version: v1
name: slow
jobs:
  wait:
    image: host
    command: [sh, -c, "echo started; sleep 120"]
    resources: {cpus: 1, memory: 64MiB, walltime: 10m}
"#;

/// Cancelling a workflow stops its running job, and the time it ran is billed.
pub fn cancel_running(server: &str, dir: &Path) {
    let file = write(dir, "slow.yaml", SLOW);
    let id = submit(server, &file);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = cli_json(server, &["status", &id]);
        if status["tasks"]["running"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the job never ran: {status:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let answer = cli_json(server, &["cancel", &id]);
    assert!(
        answer["state"] == "cancelling" || answer["state"] == "cancelled",
        "{answer}"
    );
    let status = wait_state(server, &id, &["cancelled"]);
    assert_eq!(status["jobs"][0]["state"], "cancelled", "{status:#}");
    let runs = runs(server, &id);
    assert_eq!(runs.len(), 1);
    assert!(
        runs[0].2 - runs[0].1 < chrono::Duration::seconds(60),
        "stopped long before its sleep ended"
    );
    let bill = bill(server, &id, 1);
    check_bill(&bill, 1, Decimal::from_str("0.0625").unwrap());
}

/// Garbage gets a 4xx with a message, and nothing is appended.
pub fn garbage_is_refused(server: &str, dir: &Path) {
    let file = write(
        dir,
        "garbage.yaml",
        "version: v1\nname: x\njobs: {a: {image: host}}\n",
    );
    let out = cli(server, &["submit", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("jobs.a.command"));
    let out = cli(server, &["status", "not-a-uuid"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("HTTP 400"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(server, &["bill", "01936f3e-8a5c-7cc2-9b9e-3f1c2d4e5f60"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 404"));
}

/// A job, then a service that requires it: a web server over what the job wrote.
pub fn job_and_service(dir: &Path, port: u16) -> String {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    format!(
        r#"
version: v1
name: job-and-service
jobs:
  prep:
    image: host
    command: [sh, -c, "sleep 0.5; echo made-by-prep > {www}/index.txt"]
    resources: {{cpus: 1, memory: 64MiB, walltime: 1m}}
services:
  web:
    requires: [prep]
    image: host
    command: [python3, -m, http.server, "{port}", --bind, 127.0.0.1, --directory, "{www}"]
    port: {port}
    resources: {{cpus: 1, memory: 64MiB, walltime: 10m}}
"#,
        www = www.display()
    )
}

/// GET `path` from `address` (host:port); the body, or `None` when nothing answers.
pub fn http_get(address: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// Waits until the run of service `name` of workflow `id` says where it answers.
pub fn wait_address(server: &str, id: &str, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let status = cli_json(server, &["status", id]);
        let run = status["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["name"] == name)
            .cloned();
        if let Some(address) = run.as_ref().and_then(|r| r["address"].as_str()) {
            return address.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the service never said it is ready: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How many runs of `name` workflow `id` dispatched, from its events.
pub fn dispatches(server: &str, id: &str, name: &str) -> usize {
    let events = cli_json(server, &["events", id]);
    events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "job.dispatched.v1" && e["payload"]["job"] == name)
        .count()
}

/// The sites workflow `id`'s runs were dispatched to, in order, from its events.
pub fn dispatched_sites(server: &str, id: &str) -> Vec<String> {
    let events = cli_json(server, &["events", id]);
    events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "job.dispatched.v1")
        .map(|e| e["payload"]["site"].as_str().unwrap().to_string())
        .collect()
}

/// A workflow with a job and a service: the service starts after the job, answers on
/// its port, shows its address in `meridian status`, stops on cancel, and its bill
/// charges the time it ran.
pub fn service_runs_until_cancelled(server: &str, dir: &Path) {
    let port = free_port();
    let file = write(dir, "service.yaml", &job_and_service(dir, port));
    let id = submit(server, &file);
    let address = wait_address(server, &id, "web");
    assert_eq!(cli_json(server, &["status", &id])["state"], "running");
    assert_eq!(address, format!("127.0.0.1:{port}"));
    // It serves what the job it requires wrote: it started after that job.
    let page = http_get(&address, "/index.txt").expect("the service answers");
    assert!(page.contains("made-by-prep"), "{page}");
    let table = cli(server, &["status", &id]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("ADDRESS") && table.contains(&address),
        "{table}"
    );
    // A workflow with a service serves until it is cancelled.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cli_json(server, &["status", &id])["state"], "running");

    cli_json(server, &["cancel", &id]);
    let status = wait_state(server, &id, &["cancelled"]);
    let web = status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "web")
        .unwrap();
    assert_eq!(web["state"], "cancelled", "{status:#}");
    assert!(
        web.get("address").is_none(),
        "a stopped service has no address"
    );
    assert!(
        http_get(&address, "/index.txt").is_none(),
        "the service still answers after the cancel"
    );
    let runs = runs(server, &id);
    assert_eq!(runs.len(), 2, "{runs:?}");
    let (prep, web) = (&runs[0], &runs[1]);
    assert_eq!(prep.0, "prep");
    assert_eq!(web.0, "web");
    assert!(
        web.1 >= prep.2,
        "the service started before the job it requires ended"
    );
    assert_eq!(web.3, "job.cancelled.v1");
    // Both runs are billed for the time they ran, by hand at the local rates.
    let bill = bill(server, &id, 2);
    check_bill(&bill, 1, Decimal::from_str("0.0625").unwrap());
}

/// A typical sbatch array script: 6 tasks, at most 2 at once, 5 minutes, 300 MiB, in
/// partition `debug` with QOS `normal` (which a Slurm site takes and others ignore).
pub const SBATCH_ARRAY: &str = "#!/bin/bash\n\
#SBATCH --job-name=sweep\n\
#SBATCH --array=1-6%2\n\
#SBATCH --time=5:00\n\
#SBATCH --mem=300M\n\
#SBATCH --cpus-per-task=1\n\
#SBATCH --output=sweep-%A_%a.out\n\
#SBATCH --partition=debug --qos=normal\n\
\n\
echo \"task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT in $SLURM_JOB_NAME\"\n";

/// Submits [`SBATCH_ARRAY`] as it is (`meridian submit sweep.sh --wait`): it says it
/// imported the script, finishes with the script's six tasks within its cap, and each
/// task read its own `SLURM_ARRAY_TASK_ID`. Returns the status.
pub fn sbatch_array(server: &str, dir: &Path) -> Value {
    let file = write(dir, "sweep.sh", SBATCH_ARRAY);
    let out = submit_waiting(server, &file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sweep.sh: an sbatch script, imported")
            && stderr.contains("sweep.sh:7: --output=sweep-%A_%a.out: ignored"),
        "{stderr}"
    );
    let status: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("submit --wait gave no status: {stderr}"));
    assert_eq!(status["state"], "finished", "{status:#}");
    assert_eq!(status["tasks"]["succeeded"], 6, "{status:#}");
    let id = status["id"].as_str().unwrap();
    within_cap(&runs(server, id), "sweep", 2);
    printed(
        server,
        id,
        "sweep",
        (1..=6).map(|i| format!("task {i} of 6 in sweep")),
    );
    status
}

/// Waits until an adapter serves `site` (its runner's heartbeat is in): work submitted
/// earlier would be placed elsewhere as `not connected`.
pub fn wait_connected(server: &str, site: &str, proc: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = cli_json(server, &["site", "list"]);
        let connected = listed["sites"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == site && s["connected"] == true);
        if connected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{site} never connected: {listed:#}\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every file under `dir`, as bytes, with its path: to look for secrets in what
/// Meridian wrote.
pub fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
    out
}

/// The instance-hours line of workflow `id`'s one run, checked to cost exactly `price`
/// an hour over the interval it bills (a cloud site's run).
pub fn instance_hours(server: &str, id: &str, price: &str) -> Value {
    let bill = bill(server, id, 1);
    let lines = billed_runs(&bill).into_values().next().unwrap();
    let line = lines
        .iter()
        .find(|l| l["meter"] == "instance_hours")
        .cloned()
        .unwrap_or_else(|| panic!("an instance_hours line: {bill:#}"));
    let at = |k: &str| DateTime::parse_from_rfc3339(line[k].as_str().unwrap()).unwrap();
    let micros = (at("ended_at") - at("started_at"))
        .num_microseconds()
        .unwrap();
    let expected =
        Decimal::from_str(price).unwrap() * Decimal::from(micros) / Decimal::from(3_600_000_000u64);
    let amount = Decimal::from_str(line["amount"].as_str().unwrap()).unwrap();
    assert!(
        (amount - expected).abs() < Decimal::from_str("0.0000000001").unwrap(),
        "{line:#} should cost {expected}"
    );
    line
}

/// When a bill line's interval starts.
pub fn billed_from(line: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(line["started_at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&Utc)
}

/// Plays a cloud instance: runs the bootstrap `script` it was launched with here, with
/// `sh`, after writing `power_off` (the script its power-off command runs) as `off`.
pub fn run_bootstrap(dir: &Path, script: &[u8], off: &Path, power_off: &str) {
    std::fs::write(off, power_off).unwrap();
    let boot = dir.join("bootstrap.sh");
    std::fs::write(&boot, script).unwrap();
    let ran = Command::new("sh").arg(&boot).output().expect("sh");
    assert!(
        ran.status.success(),
        "the bootstrap failed: {}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
}

/// `meridian up` on a free port in `dir` with a two-CPU local site, once it answers:
/// its address and its process.
pub fn up_in(dir: &Path) -> (String, Proc) {
    up_at(dir, free_port(), &[], &[])
}

/// `meridian up` in `dir` on `port` with a two-CPU local site, `extra` arguments and
/// `env` set for it, once it answers: its address and its process.
pub fn up_at(dir: &Path, port: u16, extra: &[&str], env: &[(&str, &str)]) -> (String, Proc) {
    let mut args = vec!["--local-cpus", "2"];
    args.extend_from_slice(extra);
    let proc = spawn_up(dir, port, &args, env);
    let server = format!("http://127.0.0.1:{port}");
    wait_ready(&server, &[&proc]);
    (server, proc)
}

/// `meridian up --data-dir data --listen 127.0.0.1:PORT` and `args` in `dir`, with `env`
/// set for it, not waited for (a test that reaches it another way waits itself).
pub fn spawn_up(dir: &Path, port: u16, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec!["up", "--data-dir", "data", "--listen", &listen];
    all.extend_from_slice(args);
    Proc::spawn("up", dir, &all, env)
}
