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
    assert_eq!(bill["lines"].as_array().unwrap().len(), 2, "{bill:#}");
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
