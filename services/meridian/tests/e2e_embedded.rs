//! End to end through `meridian up`: one process, the embedded log and store, the local
//! site running real processes; driven with the CLI as a user would.

mod common;

use common::*;

struct Up {
    server: String,
    dir: tempfile::TempDir,
    proc: Proc,
}

fn up_in(dir: tempfile::TempDir, port: u16) -> Up {
    let server = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let proc = Proc::spawn(
        "up",
        dir.path(),
        &[
            "up",
            "--data-dir",
            "data",
            "--listen",
            &listen,
            "--local-cpus",
            "2",
        ],
        &[],
    );
    wait_ready(&server, &[&proc]);
    Up { server, dir, proc }
}

fn up() -> Up {
    up_in(tempfile::tempdir().unwrap(), free_port())
}

#[test]
fn embedded_dag_with_an_array_runs_in_order_within_its_cap_and_is_billed() {
    let up = up();
    dag_and_array(&up.server, up.dir.path());
}

#[test]
fn embedded_failing_job_fails_its_dependents_and_still_bills_what_ran() {
    let up = up();
    failing_job(&up.server, up.dir.path());
}

#[test]
fn embedded_cancel_stops_the_running_job() {
    let up = up();
    cancel_running(&up.server, up.dir.path());
}

#[test]
fn embedded_garbage_is_refused_with_a_message() {
    let up = up();
    garbage_is_refused(&up.server, up.dir.path());
}

#[test]
fn embedded_restart_resumes_without_running_anything_twice() {
    let mut up = up();
    let marker = up.dir.path().join("runs.txt");
    let file = write(
        up.dir.path(),
        "once.yaml",
        &format!(
            "version: v1\nname: once\njobs:\n  slow:\n    image: host\n    command: [sh, -c, \"echo ran >> {}; sleep 3\"]\n    resources: {{cpus: 1, memory: 64MiB, walltime: 1m}}\n  after:\n    requires: [slow]\n    image: host\n    command: [\"true\"]\n    resources: {{cpus: 1, memory: 64MiB, walltime: 1m}}\n",
            marker.display()
        ),
    );
    let id = submit(&up.server, &file);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while cli_json(&up.server, &["status", &id])["tasks"]["running"] != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the job never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Kill Meridian (no clean shutdown) while the job runs, then start it again.
    up.proc.kill();
    let port: u16 = up.server.rsplit(':').next().unwrap().parse().unwrap();
    let dir = std::mem::replace(&mut up.dir, tempfile::tempdir().unwrap());
    drop(up);
    let up = up_in(dir, port);
    let status = wait_state(&up.server, &id, &["finished", "failed"]);
    assert_eq!(status["state"], "finished", "{status:#}");
    let runs = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(
        runs.lines().count(),
        1,
        "the job ran exactly once: {runs:?}"
    );
    let bill = bill(&up.server, &id, 2);
    assert_eq!(billed_runs(&bill).len(), 2, "{bill:#}");
}

#[test]
fn a_second_up_on_the_same_data_dir_is_refused() {
    let up = up();
    let port = free_port();
    let out = std::process::Command::new(BIN)
        .args([
            "up",
            "--data-dir",
            "data",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .current_dir(up.dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by another Meridian process"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_drained_site_takes_no_work_and_explain_says_why() {
    let up = up();
    let data = up.dir.path().join("data");
    let data = data.to_str().unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "site",
            "drain",
            "local",
            "--reason",
            "maintenance",
            "--data-dir",
            data,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = std::process::Command::new(BIN)
        .args(["site", "list", "--data-dir", data])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("drained"));

    let file = write(up.dir.path(), "hello.yaml", "version: v1\nname: h\njobs:\n  a: {image: host, command: [\"true\"], resources: {memory: 64MiB}}\n");
    let id = submit(&up.server, &file);
    let status = wait_state(&up.server, &id, &["failed"]);
    assert!(
        status["reason"].as_str().unwrap_or("").contains("drained"),
        "{status:#}"
    );
    let explained = cli(&up.server, &["explain", &id]);
    let text = String::from_utf8_lossy(&explained.stdout);
    assert!(
        text.contains("no site could take it") && text.contains("drained by an admin"),
        "{text}"
    );

    // Undrained, the same workflow runs.
    let out = std::process::Command::new(BIN)
        .args(["site", "undrain", "local", "--data-dir", data])
        .output()
        .unwrap();
    assert!(out.status.success());
    let status = submit_wait(&up.server, &file);
    assert_eq!(status["state"], "finished", "{status:#}");
    let explained = cli_json(&up.server, &["explain", status["id"].as_str().unwrap()]);
    assert_eq!(explained["decisions"][0]["payload"]["site"], "local");

    // A quote against the live catalogue sees the same site.
    let out = std::process::Command::new(BIN)
        .args([
            "quote",
            file.to_str().unwrap(),
            "--server",
            &up.server,
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let quote: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(quote["site"], "local");
}

#[test]
fn quote_prices_a_workflow_offline_against_the_reference() {
    let out = std::process::Command::new(BIN)
        .args(["quote", "examples/train-h100.yaml", "--output", "json"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let quote: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let site = quote["site"].as_str().unwrap();
    let chosen = quote["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["site"] == site)
        .unwrap();
    assert_eq!(chosen["verdict"]["verdict"], "chosen");
    // The explanation's terms add up to the quoted total.
    let cost = &chosen["cost"];
    let sum: rust_decimal::Decimal = ["compute", "data_in", "storage", "data_out"]
        .iter()
        .map(|k| {
            cost[*k]
                .as_str()
                .unwrap()
                .parse::<rust_decimal::Decimal>()
                .unwrap()
        })
        .sum();
    let total: rust_decimal::Decimal = quote["estimated_cost"]["amount"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(sum, total);
}
