//! End to end on a real Slurm (Debian's 22.05, started by `infra/slurm/start.sh` when it
//! is not running): `meridian up` with a Slurm site from a catalogue file, a workflow
//! with a DAG, a task array and a failing job, a restart of Meridian mid-run, and a
//! volume on the site's shared path that the data mover fills and copies out.

mod common;

use common::*;
use rust_decimal::Decimal;
use serde_json::Value;

const CATALOG: &str = r#"
sites:
  - name: hpc
    kind: slurm
    region: campus-1
    jurisdiction: eu
    prices:
      currency: EUR
      effective_from: 2026-01-01T00:00:00Z
      source: "test charge-back rates"
      compute:
        - {offer: debug, per_core_hour: "0.02", per_gib_hour: "0.002"}
    shapes:
      - {name: debug, offer: debug, cpus: 2, memory: 1GiB, max_walltime: 1h}
"#;

struct SlurmUp {
    server: String,
    dir: tempfile::TempDir,
    port: u16,
    proc: Proc,
}

fn start(dir: tempfile::TempDir, port: u16) -> SlurmUp {
    let work = dir.path().join("slurm-work");
    write(
        dir.path(),
        "slurm.yaml",
        &format!(
            "mode: {{kind: cli}}\npartition: debug\nwork_dir: {}\nvolume_root: {}\n",
            work.display(),
            dir.path().join("shared-volumes").display()
        ),
    );
    write(dir.path(), "hpc.yaml", CATALOG);
    let (server, proc) = up_with_adapter(dir.path(), port, "hpc.yaml", "hpc=slurm:slurm.yaml");
    SlurmUp {
        server,
        dir,
        port,
        proc,
    }
}

fn ensure_slurm() {
    if let Err(why) = meridian_adapter_slurm::testkit::ensure_slurm() {
        panic!("this test needs a running Slurm, and it could not be started: {why}");
    }
}

/// The allocation Slurm reported for each job run, from the events: (cpus, memory GiB).
fn allocations(server: &str, id: &str) -> std::collections::BTreeMap<String, (u64, Decimal)> {
    let events = cli_json(server, &["events", id]);
    let mut out = std::collections::BTreeMap::new();
    for e in events["events"].as_array().unwrap() {
        if e["payload"]["type"] == "job.started.v1" {
            let a = &e["payload"]["allocated"];
            out.insert(
                e["aggregate"]["id"].as_str().unwrap().to_string(),
                (
                    a["cpus"].as_u64().unwrap(),
                    Decimal::from(a["memory_bytes"].as_u64().unwrap()) / Decimal::from(1u64 << 30),
                ),
            );
        }
    }
    out
}

#[test]
fn a_dag_with_an_array_and_a_failing_job_runs_on_real_slurm_and_is_billed() {
    ensure_slurm();
    let up = start(tempfile::tempdir().unwrap(), free_port());
    let file = write(
        up.dir.path(),
        "hpc-workflow.yaml",
        r#"
version: v1
name: on-slurm
placement: {sites: [hpc]}
jobs:
  prep:
    image: host
    command: [sh, -c, "echo prep on $(hostname)"]
    resources: {cpus: 1, memory: 100MiB, walltime: 2m}
  sweep:
    requires: [prep]
    image: host
    command: [sh, -c, "echo cell ${ARRAY_INDEX}"]
    array: {start: 1, end: 4, parallelism: 2}
    resources: {cpus: 1, memory: 100MiB, walltime: 2m}
  bad:
    requires: [prep]
    image: host
    command: [sh, -c, "echo failing >&2; exit 3"]
    resources: {cpus: 1, memory: 100MiB, walltime: 2m}
  never:
    requires: [bad]
    image: host
    command: ["true"]
    resources: {cpus: 1, memory: 100MiB, walltime: 2m}
"#,
    );
    let out = submit_waiting(&up.server, &file);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            up.proc.output()
        )
    });
    assert_eq!(
        status["state"],
        "failed",
        "{status:#}\n{}",
        up.proc.output()
    );
    assert_eq!(status["site"], "hpc");
    let id = status["id"].as_str().unwrap();
    let jobs = status["jobs"].as_array().unwrap();
    let state_of = |name: &str| {
        jobs.iter()
            .filter(|j| j["name"] == name)
            .map(|j| {
                (
                    j["state"].as_str().unwrap().to_string(),
                    j["exit_code"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        state_of("prep"),
        vec![("succeeded".to_string(), Value::from(0))]
    );
    assert_eq!(state_of("sweep").len(), 4);
    assert!(
        state_of("sweep").iter().all(|(s, _)| s == "succeeded"),
        "{status:#}"
    );
    assert_eq!(
        state_of("bad"),
        vec![("failed".to_string(), Value::from(3))]
    );
    assert!(state_of("never").is_empty(), "never was never released");
    for j in jobs.iter().filter(|j| j["name"] != "sweep") {
        assert!(
            j["backend_job_id"]
                .as_str()
                .is_some_and(|b| b.parse::<u64>().is_ok()),
            "each run has its Slurm job id: {j}"
        );
    }
    // The array went to Slurm as one `sbatch --array=1-4%2`: its tasks are
    // `<array job>_<index>` of one array job.
    let mut arrays = std::collections::BTreeSet::new();
    for j in jobs.iter().filter(|j| j["name"] == "sweep") {
        let backend = j["backend_job_id"].as_str().unwrap_or_default();
        let (array, task) = backend
            .split_once('_')
            .unwrap_or_else(|| panic!("an array task's id is <array>_<index>: {j}"));
        assert_eq!(task, j["index"].to_string(), "{j}");
        arrays.insert(array.to_string());
    }
    assert_eq!(arrays.len(), 1, "one array job for the sweep: {arrays:?}");
    let array = arrays.into_iter().next().unwrap();
    // Accounting records each task a moment after it ends.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let sacct = std::process::Command::new("sacct")
            .args(["-n", "-X", "-P", "--format=JobID,Comment", "-j", &array])
            .output()
            .expect("sacct");
        let sacct = String::from_utf8_lossy(&sacct.stdout).to_string();
        let tasks = sacct.lines().filter(|l| !l.trim().is_empty()).count();
        if tasks == 4 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Slurm holds one array of four tasks: {sacct}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let logs = String::from_utf8_lossy(&cli(&up.server, &["logs", id, "sweep"]).stdout).to_string();
    for i in 1..=4 {
        assert!(logs.contains(&format!("cell {i}")), "{logs}");
    }

    // Every run that started is billed at the catalogue's rates for what Slurm
    // allocated: a cores line and a memory line per run, summed here by hand.
    let bill = bill(&up.server, id, 6);
    assert_eq!(
        billed_runs(&bill).len(),
        6,
        "prep, four sweep cells and bad ran: {bill:#}"
    );
    let allocations = allocations(&up.server, id);
    check_bill_at(&bill, "EUR", ("0.02", "0.002"), |job| allocations[job]);
}

#[test]
fn an_sbatch_script_submitted_as_it_is_reaches_slurm_with_its_limits() {
    ensure_slurm();
    let up = start(tempfile::tempdir().unwrap(), free_port());
    let status = sbatch_array(&up.server, up.dir.path());
    assert_eq!(status["site"], "hpc", "{status:#}");
    // What Slurm was asked for, from its accounting: the script's walltime, memory,
    // partition, QOS and array cap, for every task.
    // slurmdbd records a task a moment after it ends.
    let workflow = format!("MERIDIAN_WORKFLOW_ID={}", status["id"].as_str().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let tasks = loop {
        let out = std::process::Command::new("sacct")
            .args([
                "-P",
                "-n",
                "-X",
                "--format=JobID,Timelimit,ReqMem,Partition,QOS,SubmitLine",
            ])
            .args(["--starttime=now-1hour"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let tasks: Vec<Vec<String>> = text
            .lines()
            .map(|l| l.split('|').map(String::from).collect::<Vec<_>>())
            .filter(|f| f.len() == 6 && f[5].contains(&workflow))
            .collect();
        if tasks.len() == 6 {
            break tasks;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sacct: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    for task in tasks {
        let asked: Vec<&str> = task[1..5].iter().map(String::as_str).collect();
        assert_eq!(asked, ["00:05:00", "300M", "debug", "normal"], "{task:?}");
        assert!(
            task[5].contains("%2"),
            "the array's cap reached sbatch: {task:?}"
        );
    }
}

#[test]
fn a_restart_mid_run_submits_nothing_twice_to_slurm() {
    ensure_slurm();
    let mut up = start(tempfile::tempdir().unwrap(), free_port());
    let marker = up.dir.path().join("ran.txt");
    let file = write(
        up.dir.path(),
        "slow.yaml",
        &format!(
            "version: v1\nname: slow-on-slurm\nplacement: {{sites: [hpc]}}\njobs:\n  slow:\n    image: host\n    command: [sh, -c, \"echo ran >> {m}; sleep 6\"]\n    resources: {{cpus: 1, memory: 100MiB, walltime: 2m}}\n  cells:\n    image: host\n    command: [sh, -c, \"echo cell-${{ARRAY_INDEX}} >> {m}; sleep 3\"]\n    array: {{start: 1, end: 3, parallelism: 1}}\n    resources: {{cpus: 1, memory: 100MiB, walltime: 2m}}\n",
            m = marker.display()
        ),
    );
    let id = submit(&up.server, &file);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while cli_json(&up.server, &["status", &id])["tasks"]["running"]
        .as_u64()
        .unwrap_or(0)
        == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never ran: {}",
            up.proc.output()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    up.proc.kill();
    let (dir, port) = (
        std::mem::replace(&mut up.dir, tempfile::tempdir().unwrap()),
        up.port,
    );
    drop(up);
    let up = start(dir, port);
    let status = wait_state(&up.server, &id, &["finished", "failed"]);
    assert_eq!(
        status["state"],
        "finished",
        "{status:#}\n{}",
        up.proc.output()
    );
    let ran = std::fs::read_to_string(&marker).unwrap();
    let mut lines: Vec<&str> = ran.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        ["cell-1", "cell-2", "cell-3", "ran"],
        "Slurm ran each once: {ran:?}"
    );
    let jobs = status["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4, "one run each, not re-submitted: {status:#}");
    let arrays: std::collections::BTreeSet<&str> = jobs
        .iter()
        .filter(|j| j["name"] == "cells")
        .filter_map(|j| j["backend_job_id"].as_str()?.split_once('_'))
        .map(|(array, _)| array)
        .collect();
    assert_eq!(arrays.len(), 1, "the array went once, as one: {status:#}");
}

/// A service on the real Slurm: a batch job with its walltime, after the job it
/// requires; ready once it answers on its node (Slurm's batch host) and port; stopped
/// by the cancel (scancel), and billed for the time it ran.
#[test]
fn a_service_runs_on_real_slurm_reports_its_node_and_port_and_stops_on_cancel() {
    ensure_slurm();
    let up = start(tempfile::tempdir().unwrap(), free_port());
    let port = free_port();
    let www = up.dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    let file = write(
        up.dir.path(),
        "service.yaml",
        &format!(
            r#"
version: v1
name: serve-on-slurm
placement: {{sites: [hpc]}}
jobs:
  prep:
    image: host
    command: [sh, -c, "echo made-on-slurm > {www}/index.txt"]
    resources: {{cpus: 1, memory: 100MiB, walltime: 2m}}
services:
  web:
    requires: [prep]
    image: host
    command: [python3, -m, http.server, "{port}", --directory, "{www}"]
    port: {port}
    resources: {{cpus: 1, memory: 100MiB, walltime: 10m}}
"#,
            www = www.display()
        ),
    );
    let id = submit(&up.server, &file);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let address = loop {
        let status = cli_json(&up.server, &["status", &id]);
        let web = status["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["name"] == "web")
            .cloned();
        if let Some(address) = web.as_ref().and_then(|w| w["address"].as_str()) {
            assert_eq!(status["site"], "hpc", "{status:#}");
            let backend = web.as_ref().unwrap()["backend_job_id"]
                .as_str()
                .unwrap_or("");
            assert!(backend.parse::<u64>().is_ok(), "a Slurm job: {status:#}");
            break address.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the service never said it is ready: {status:#}\n{}",
            up.proc.output()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(address.ends_with(&format!(":{port}")), "{address}");
    let page = http_get(&address, "/index.txt").expect("the service answers");
    assert!(page.contains("made-on-slurm"), "{page}");

    cli_json(&up.server, &["cancel", &id]);
    let status = wait_state(&up.server, &id, &["cancelled"]);
    let web = status["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "web")
        .unwrap()
        .clone();
    assert_eq!(web["state"], "cancelled", "{status:#}");
    let runs = runs(&up.server, &id);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs[1].1 >= runs[0].2,
        "the service started after prep ended: {runs:?}"
    );
    let bill = bill(&up.server, &id, 2);
    assert_eq!(billed_runs(&bill).len(), 2, "{bill:#}");
}

/// The site's `volume_root` is a shared path the data mover writes to: an input comes in
/// there before the job starts, the job on a Slurm node reads it through
/// `MERIDIAN_VOLUME_DATA` and writes a result, and the result is copied out.
#[test]
fn a_volume_on_the_shared_path_is_filled_before_the_job_and_copied_out_after() {
    ensure_slurm();
    let up = start(tempfile::tempdir().unwrap(), free_port());
    let input = write(up.dir.path(), "cells.csv", "id\n1\n2\n3\n");
    let results = up.dir.path().join("results");
    let file = write(
        up.dir.path(),
        "volume.yaml",
        &format!(
            "version: v1\nname: shared-volume\nvolumes:\n  data:\n    size: 1GiB\n    ingress:\n      - {{source: \"file://{}\", destination: /in/}}\n    egress:\n      - {{source: /out/, destination: \"file://{}/\"}}\njobs:\n  count:\n    image: host\n    command: [sh, -c, \"mkdir -p $MERIDIAN_VOLUME_DATA/out && wc -l < $MERIDIAN_VOLUME_DATA/in/cells.csv > $MERIDIAN_VOLUME_DATA/out/n.txt\"]\n    mounts: {{data: /data}}\n    resources: {{cpus: 1, memory: 256MiB, walltime: 5m}}\n",
            input.display(),
            results.display()
        ),
    );
    let status = submit_wait(&up.server, &file);
    assert_eq!(
        status["state"],
        "finished",
        "{status:#}\n{}",
        up.proc.output()
    );
    assert_eq!(
        std::fs::read_to_string(results.join("n.txt"))
            .unwrap()
            .trim(),
        "4",
        "the job read the input on the shared path, and its result came out"
    );
    let id = status["id"].as_str().unwrap();
    let events = cli_json(&up.server, &["events", id]);
    let copies = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "transfer.completed.v1")
        .count();
    assert_eq!(copies, 2, "one copy in, one out: {events:#}");
}
