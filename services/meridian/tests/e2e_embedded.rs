//! End to end through `meridian up`: one process, the embedded log and store, the local
//! site running real processes; driven with the CLI as a user would.

mod common;

use common::*;

struct Up {
    server: String,
    dir: tempfile::TempDir,
    proc: Proc,
}

fn up_on(dir: tempfile::TempDir, port: u16) -> Up {
    up_with(dir, port, &[])
}

/// `meridian up` with a local site of 2 CPUs, and `extra` arguments.
fn up_with(dir: tempfile::TempDir, port: u16, extra: &[&str]) -> Up {
    up_with_env(dir, port, extra, &[])
}

/// [`up_with`], with `env` set for Meridian.
fn up_with_env(dir: tempfile::TempDir, port: u16, extra: &[&str], env: &[(&str, &str)]) -> Up {
    let (server, proc) = up_at(dir.path(), port, extra, env);
    Up { server, dir, proc }
}

fn up() -> Up {
    up_on(tempfile::tempdir().unwrap(), free_port())
}

#[test]
fn embedded_dag_with_an_array_runs_in_order_within_its_cap_and_is_billed() {
    let ops = format!("127.0.0.1:{}", free_port());
    let up = up_with(
        tempfile::tempdir().unwrap(),
        free_port(),
        &["--ops-listen", &ops],
    );
    dag_and_array(&up.server, up.dir.path());
    // `meridian up --ops-listen` serves what each `meridian server` does, for all of them.
    let ready = http_get(&ops, "/readyz").unwrap();
    assert!(ready.contains(" 200 OK"), "{ready}");
    let metrics = http_get(&ops, "/metrics").unwrap();
    for line in [
        "meridian_workflows{service=\"meridian\",state=\"finished\"} 1",
        "meridian_placements_total{service=\"meridian\",site=\"local\"} 1",
        "meridian_placement_seconds_count{service=\"meridian\",outcome=\"placed\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(
        metrics.contains(&format!(
            "meridian_projection_position{{service=\"meridian\",projection=\"{}\"}}",
            meridian_accounting::NAME
        )),
        "{metrics}"
    );
}

#[test]
fn embedded_failing_job_fails_its_dependents_and_still_bills_what_ran() {
    let up = up();
    failing_job(&up.server, up.dir.path());
}

#[test]
fn an_sbatch_array_script_submitted_as_it_is_runs_its_tasks_within_its_cap() {
    let up = up();
    sbatch_array(&up.server, up.dir.path());
}
#[test]
fn embedded_service_starts_after_its_job_answers_and_stops_on_cancel() {
    let up = up();
    service_runs_until_cancelled(&up.server, up.dir.path());
}

/// Only the local site is served: a workflow that fits elsewhere alone waits, says why,
/// and the live quote shows which sites are connected.
#[test]
fn a_workflow_that_fits_only_unconnected_sites_waits_and_says_why() {
    let up = up_with(
        tempfile::tempdir().unwrap(),
        free_port(),
        &[
            "--catalog",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../catalog/reference.yaml"),
        ],
    );
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/train-h100.yaml"
    );
    let id = submit(&up.server, std::path::Path::new(example));
    let status = wait_state(&up.server, &id, &["waiting"]);
    let reason = status["reason"].as_str().unwrap();
    assert!(
        reason.contains("coreweave-us-east") && reason.contains("no adapter serves"),
        "{reason}"
    );
    let out = cli(&up.server, &["status", &id]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("waiting") && table.contains("coreweave-us-east"),
        "{table}"
    );
    let events = cli_json(&up.server, &["events", &id]);
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["payload"]["type"] == "workflow.placement_waiting.v1"),
        "{events:#}"
    );
    let out = cli(&up.server, &["quote", "--server", &up.server, example]);
    let quote = String::from_utf8_lossy(&out.stdout);
    assert!(quote.contains("connected: local"), "{quote}");
    assert!(quote.contains("not connected"), "{quote}");
    assert!(quote.contains("wait for"), "{quote}");
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
    let up = up_on(dir, port);
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

/// A kill -9 of `meridian up` while a service serves: the service keeps serving, the
/// restarted Meridian follows the same run (nothing starts twice), and the cancel still
/// stops it and bills it once.
#[test]
fn a_service_outlives_a_kill_of_meridian_and_runs_once() {
    let mut up = up();
    let service_port = free_port();
    let file = write(
        up.dir.path(),
        "service.yaml",
        &job_and_service(up.dir.path(), service_port),
    );
    let id = submit(&up.server, &file);
    let address = wait_address(&up.server, &id, "web");
    up.proc.kill();
    let port: u16 = up.server.rsplit(':').next().unwrap().parse().unwrap();
    let dir = std::mem::replace(&mut up.dir, tempfile::tempdir().unwrap());
    drop(up);
    assert!(
        http_get(&address, "/index.txt").is_some(),
        "the service serves while Meridian is down"
    );
    let up = up_on(dir, port);
    assert_eq!(wait_address(&up.server, &id, "web"), address);
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(
        dispatches(&up.server, &id, "web"),
        1,
        "one run of the service"
    );
    assert_eq!(dispatches(&up.server, &id, "prep"), 1, "one run of the job");
    cli_json(&up.server, &["cancel", &id]);
    wait_state(&up.server, &id, &["cancelled"]);
    assert!(
        http_get(&address, "/index.txt").is_none(),
        "stopped by the cancel"
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
    cli_ok(
        &up.server,
        &["site", "drain", "local", "--reason", "maintenance"],
    );
    assert!(cli_ok(&up.server, &["site", "list"]).contains("drained"));

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
    cli_ok(&up.server, &["site", "undrain", "local"]);
    let status = submit_wait(&up.server, &file);
    assert_eq!(status["state"], "finished", "{status:#}");
    let explained = cli_json(&up.server, &["explain", status["id"].as_str().unwrap()]);
    assert_eq!(explained["decisions"][0]["payload"]["site"], "local");

    // A quote against the live catalogue sees the same site.
    let out = cli(
        &up.server,
        &[
            "quote",
            file.to_str().unwrap(),
            "--server",
            &up.server,
            "--output",
            "json",
        ],
    );
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

/// Two local sites in one `meridian up`: `local` (2 CPUs, 0.01 per core-hour) and `big`
/// (8 CPUs, from a catalogue file, 0.05). A workflow that may split runs its 1-CPU step
/// at `local` and its 4-CPU step at `big`, and the bill charges each at its own site.
/// `meridian up` with the local site and a second local site, `big`, from a catalogue
/// file.
fn up_with_big_site() -> Up {
    let dir = tempfile::tempdir().unwrap();
    let catalog = write(
        dir.path(),
        "sites.yaml",
        r#"
sites:
  - name: big
    kind: local
    region: here
    jurisdiction: eu
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      compute: [{offer: node, per_core_hour: "0.05", per_gib_hour: "0.001"}]
    shapes: [{name: node, offer: node, cpus: 8, memory: 16GiB}]
"#,
    );
    let big = write(
        dir.path(),
        "big.yaml",
        "cpus: 8\nmemory_bytes: 17179869184\n",
    );
    let adapter = format!("big=local:{}", big.display());
    let catalog = catalog.display().to_string();
    up_with(
        dir,
        free_port(),
        &["--catalog", &catalog, "--adapter", &adapter],
    )
}

#[test]
fn a_split_workflow_runs_its_jobs_at_two_sites_and_each_is_billed_there() {
    let up = up_with_big_site();
    let server = up.server.clone();

    let file = write(
        up.dir.path(),
        "split.yaml",
        r#"
version: v1
name: split
placement: {split: true}
jobs:
  prep: {image: host, command: ["true"], resources: {cpus: 1, memory: 64MiB, walltime: 10m}}
  crunch: {requires: [prep], image: host, command: ["true"], resources: {cpus: 4, memory: 64MiB, walltime: 10m}}
"#,
    );
    let status = submit_wait(&server, &file);
    assert_eq!(status["state"], "finished", "{status:#}");
    let id = status["id"].as_str().unwrap();

    let explained = cli_json(&server, &["explain", id]);
    let decision = &explained["decisions"][0]["payload"];
    assert_eq!(decision["site"], "local", "{decision:#}");
    assert_eq!(decision["job_sites"]["crunch"], "big", "{decision:#}");
    assert_eq!(
        decision["explanation"]["split"]["verdict"]["verdict"],
        "chosen"
    );
    let text = String::from_utf8_lossy(&cli(&server, &["explain", id]).stdout).to_string();
    assert!(text.contains("split: local + big"), "{text}");

    let bill = bill(&server, id, 2);
    let mut sites: Vec<String> = billed_runs(&bill)
        .values()
        .map(|lines| lines[0]["site"].as_str().unwrap().to_string())
        .collect();
    sites.sort();
    assert_eq!(sites, ["big", "local"], "{bill:#}");
    // Each run at its own site's rates, computed here by hand: 1 core at 0.01 at local,
    // 4 at 0.05 at big, 64 MiB at 0.001 per GiB-hour at both.
    use rust_decimal::Decimal;
    use std::str::FromStr;
    let dec = |v: &serde_json::Value| Decimal::from_str(v.as_str().unwrap()).unwrap();
    let mut sum = Decimal::ZERO;
    for lines in billed_runs(&bill).values() {
        let (cores, core_rate) = if lines[0]["site"] == "big" {
            (4, "0.05")
        } else {
            (1, "0.01")
        };
        let per_hour = Decimal::from(cores) * Decimal::from_str(core_rate).unwrap()
            + Decimal::from_str("0.0625").unwrap() * Decimal::from_str("0.001").unwrap();
        let line = lines.iter().find(|l| l["meter"] == "core_hours").unwrap();
        let run = chrono::DateTime::parse_from_rfc3339(line["ended_at"].as_str().unwrap()).unwrap()
            - chrono::DateTime::parse_from_rfc3339(line["started_at"].as_str().unwrap()).unwrap();
        let hours =
            Decimal::from(run.num_microseconds().unwrap()) / Decimal::from(3_600_000_000u64);
        let amount: Decimal = lines.iter().map(|l| dec(&l["amount"])).sum();
        assert!(
            (amount - per_hour * hours).abs() < Decimal::from_str("0.0000000001").unwrap(),
            "{lines:#?} should cost {}",
            per_hour * hours
        );
        sum += amount;
    }
    assert_eq!(dec(&bill["totals"][0]["amount"]), sum.normalize());
}

/// A split workflow's volume follows its jobs: `prep` at `local` writes into `data`,
/// the data mover copies the volume to `big` once `prep` is done, `crunch` there reads
/// it and writes a result, and the result goes out from `big`, where the volume ended.
#[test]
fn a_split_workflow_moves_its_volume_to_the_next_site_after_the_job_that_fills_it() {
    let up = up_with_big_site();
    let results = up.dir.path().join("results");
    let file = write(
        up.dir.path(),
        "split-data.yaml",
        &format!(
            r#"
version: v1
name: split-data
placement: {{split: true}}
volumes:
  data:
    size: 1GiB
    egress: [{{source: /out/, destination: "file://{}/"}}]
jobs:
  prep:
    image: host
    command: [sh, -c, "mkdir -p $MERIDIAN_VOLUME_DATA/mid && seq 1 7 > $MERIDIAN_VOLUME_DATA/mid/numbers.txt"]
    mounts: {{data: /data}}
    resources: {{cpus: 1, memory: 64MiB, walltime: 10m}}
  crunch:
    requires: [prep]
    image: host
    command: [sh, -c, "mkdir -p $MERIDIAN_VOLUME_DATA/out && wc -l < $MERIDIAN_VOLUME_DATA/mid/numbers.txt > $MERIDIAN_VOLUME_DATA/out/count.txt"]
    mounts: {{data: /data}}
    resources: {{cpus: 4, memory: 64MiB, walltime: 10m}}
"#,
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
    let id = status["id"].as_str().unwrap();
    let decision = &cli_json(&up.server, &["explain", id])["decisions"][0]["payload"];
    assert_eq!(decision["job_sites"]["crunch"], "big", "{decision:#}");
    assert_eq!(
        std::fs::read_to_string(results.join("count.txt"))
            .unwrap()
            .trim(),
        "7",
        "crunch at big read what prep wrote at local"
    );
    let copies: Vec<(String, String, u64, String)> = cli_json(&up.server, &["events", id])
        ["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["payload"]["type"] == "transfer.completed.v1")
        .map(|e| {
            let p = &e["payload"];
            let at = |l: &serde_json::Value| {
                l["site"]
                    .as_str()
                    .or(l["region"].as_str())
                    .unwrap()
                    .to_string()
            };
            let class = p["class"].as_str().unwrap_or("-").to_string();
            (
                at(&p["from"]),
                at(&p["to"]),
                p["bytes"].as_u64().unwrap(),
                class,
            )
        })
        .collect();
    // local and big are both local sites, in regions `local` and `here`.
    assert_eq!(
        copies,
        [
            (
                "local".to_string(),
                "big".to_string(),
                14,
                "other_region".to_string()
            ),
            (
                "big".to_string(),
                "internet".to_string(),
                2,
                "internet".to_string()
            )
        ],
        "the volume moved once, and went out once from where it ended"
    );
}

#[test]
fn a_tenant_policy_set_with_the_cli_binds_the_next_placement() {
    let up = up();
    let admin = |args: &[&str]| cli_ok(&up.server, &[&["admin", "policy"], args].concat());
    let shown = admin(&["set", "--tenant", "physics", "--region", "eu-west-9"]);
    assert!(shown.contains("eu-west-9"), "{shown}");

    let file = write(up.dir.path(), "hello.yaml", "version: v1\nname: h\njobs:\n  a: {image: host, command: [\"true\"], resources: {memory: 64MiB}}\n");
    let path = file.to_str().unwrap();
    // The policy binds what `--tenant physics` submits and quotes, not other tenants.
    let out = cli(
        &up.server,
        &[
            "quote", path, "--server", &up.server, "--tenant", "physics", "-o", "json",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "no site may take it");
    let quote: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        quote["candidates"][0]["verdict"]["reason"],
        "region local is not among the regions the tenant's policy allows"
    );
    let accepted = cli_json(&up.server, &["submit", path, "--tenant", "physics"]);
    let id = accepted["id"].as_str().unwrap();
    let status = wait_state(&up.server, id, &["failed"]);
    assert!(
        status["reason"]
            .as_str()
            .unwrap_or("")
            .contains("not among the regions the tenant's policy allows"),
        "{status:#}"
    );
    assert_eq!(submit_wait(&up.server, &file)["state"], "finished");

    // Opened again, physics's work runs; `show` says what is in force.
    admin(&["set", "--tenant", "physics"]);
    let shown = admin(&["show", "--tenant", "physics"]);
    assert!(
        shown.contains("regions") && shown.contains("any"),
        "{shown}"
    );
    let accepted = cli_json(&up.server, &["submit", path, "--tenant", "physics"]);
    let status = wait_state(&up.server, accepted["id"].as_str().unwrap(), &["finished"]);
    assert_eq!(status["tenant"], "physics", "{status:#}");

    // Bad input names the flag and records nothing.
    let out = cli(
        &up.server,
        &[
            "admin",
            "policy",
            "set",
            "--tenant",
            "physics",
            "--budget-per-workflow",
            "lots",
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--budget-per-workflow \"lots\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !admin(&["show", "--tenant", "physics"]).contains("lots"),
        "the refused policy was not recorded"
    );
    assert!(admin(&["show", "--tenant", "physics"]).contains("none"));
}

/// Every site and admin verb works against the running server, through its API: none
/// takes a data directory or a NATS URL to write to the log itself.
#[test]
fn site_and_admin_verbs_go_through_the_api() {
    let up = up();
    let server = up.server.as_str();
    // The sites, with whether an adapter serves them.
    let list = cli_ok(server, &["site", "list"]);
    assert!(list.contains("CONNECTED"), "{list}");
    let local = list.lines().find(|l| l.starts_with("local")).unwrap();
    assert!(local.contains(" yes "), "{list}");
    let listed = cli_json(server, &["site", "list"]);
    assert_eq!(listed["sites"][0]["connected"], true, "{listed:#}");

    // A catalogue file applied through the API: a site no adapter serves.
    let file = write(
        up.dir.path(),
        "far.yaml",
        r#"
sites:
  - name: far
    kind: slurm
    region: far-away
    jurisdiction: eu
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      storage_per_gib_hour: "0"
      egress_per_gb: "0"
      compute:
        - {offer: node, per_core_hour: "1.00", per_gib_hour: "0"}
    shapes:
      - {name: node, offer: node, cpus: 8, memory: 32GiB}
"#,
    );
    let out = cli(server, &["site", "apply", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("far: registered"));
    let list = cli_ok(server, &["site", "list"]);
    let far = list.lines().find(|l| l.starts_with("far")).unwrap();
    assert!(far.contains(" no "), "{list}");
    // A bad file names the field and sends nothing.
    let bad = write(up.dir.path(), "bad.yaml", "sites: [{name: x}]\n");
    let out = cli(server, &["site", "apply", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("missing field `kind`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Drain and undrain; draining twice is refused with the server's reason.
    cli_ok(server, &["site", "drain", "far", "--reason", "maintenance"]);
    let out = cli(server, &["site", "drain", "far"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already drained"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cli_ok(server, &["site", "undrain", "far"]);
    let out = cli(server, &["site", "drain", "nowhere"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no site nowhere"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Price adjustments: granted, refused when backdated, revoked, listed.
    let granted = cli_ok(
        server,
        &[
            "admin",
            "discount",
            "--tenant",
            "physics",
            "--site",
            "local",
            "--percent",
            "10",
            "--from",
            "2999-01-01",
            "--reference",
            "PO-7",
        ],
    );
    assert!(granted.contains("10% off list for site local"), "{granted}");
    let id = granted.split(':').next().unwrap().trim().to_string();
    cli_ok(
        server,
        &[
            "admin",
            "committed-rate",
            "--tenant",
            "physics",
            "--site-kind",
            "kubernetes",
            "--meter",
            "gpu-hours",
            "--price",
            "1.80",
            "--currency",
            "USD",
        ],
    );
    let out = cli(
        server,
        &[
            "admin",
            "discount",
            "--tenant",
            "physics",
            "--percent",
            "50",
            "--from",
            "2020-01-01",
        ],
    );
    assert!(!out.status.success());
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        why.contains("in the past") && why.contains("nothing was recorded"),
        "{why}"
    );
    cli_ok(
        server,
        &["admin", "revoke-adjustment", "--tenant", "physics", &id],
    );
    let listing = cli_ok(server, &["admin", "adjustments", "--tenant", "physics"]);
    assert_eq!(
        listing.lines().count(),
        3,
        "a header and two adjustments: {listing}"
    );
    assert!(
        listing.contains(&id) && listing.contains("PO-7"),
        "{listing}"
    );
    assert!(
        listing.contains("committed 1.80 USD per GPU-Hour"),
        "{listing}"
    );

    // None of them writes to the log itself any more.
    for verb in [
        &["site", "list", "--data-dir", "data"][..],
        &[
            "site",
            "drain",
            "far",
            "--nats-url",
            "nats://127.0.0.1:4222",
        ][..],
        &[
            "admin",
            "adjustments",
            "--tenant",
            "physics",
            "--data-dir",
            "data",
        ][..],
        &[
            "admin",
            "policy",
            "show",
            "--tenant",
            "physics",
            "--data-dir",
            "data",
        ][..],
    ] {
        let out = cli(server, verb);
        assert!(!out.status.success(), "{verb:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("unexpected argument"),
            "{verb:?}"
        );
    }
}

/// The stdout of a CLI run that must succeed, trimmed.
fn ok_text(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A job calls Meridian back with the credential it was started with: it submits a
/// child workflow, which runs and is billed to the same tenant; once the parent ends the
/// credential is refused. Afterwards, no token of this run is anywhere in the log or the
/// database.
#[test]
fn a_job_submits_a_child_workflow_with_its_credential() {
    let up = up();
    let researcher = ok_text(
        cli(
            &up.server,
            &[
                "admin",
                "token",
                "create",
                "--tenant",
                "physics",
                "--role",
                "researcher",
                "--label",
                "ada",
            ],
        ),
        "token create",
    );
    assert!(researcher.starts_with("mer_"), "{researcher}");
    let token_file = up.dir.path().join("job-token");
    let parent = write(
        up.dir.path(),
        "parent.yaml",
        &format!(
            r#"version: v1
name: parent
jobs:
  spawn:
    image: host
    command:
      - python3
      - -c
      - |
        import os, urllib.request
        doc = b"version: v1\nname: child\njobs:\n  c:\n    image: host\n    command: [sh, -c, 'sleep 0.2']\n    resources: {{cpus: 1, memory: 64MiB, walltime: 1m}}\n"
        req = urllib.request.Request(os.environ["MERIDIAN_SERVER"] + "/v1/workflows", data=doc, method="POST",
            headers={{"Authorization": "Bearer " + os.environ["MERIDIAN_TOKEN"], "Content-Type": "application/yaml"}})
        print(urllib.request.urlopen(req).read().decode())
        open("{}", "w").write(os.environ["MERIDIAN_TOKEN"])
    resources: {{cpus: 1, memory: 64MiB, walltime: 1m}}
"#,
            token_file.display()
        ),
    );
    let out = cli_as(
        &up.server,
        &researcher,
        &[
            "submit",
            parent.to_str().unwrap(),
            "--wait",
            "--output",
            "json",
        ],
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no status: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(status["state"], "finished", "{status:#}");
    let parent_id = status["id"].as_str().unwrap().to_string();
    let job_token = std::fs::read_to_string(&token_file).unwrap();
    assert!(job_token.starts_with("mer_wf_"), "{job_token}");

    // The child: the researcher's tenant, recorded as the parent's child; it runs.
    let list: serde_json::Value = serde_json::from_slice(
        &cli_as(&up.server, &researcher, &["list", "--output", "json"]).stdout,
    )
    .unwrap();
    let child = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "child")
        .unwrap_or_else(|| panic!("no child in {list:#}"));
    assert_eq!(child["tenant"], "physics");
    let child_id = child["id"].as_str().unwrap().to_string();
    let child_status = wait_state(&up.server, &child_id, &["finished", "failed"]);
    assert_eq!(child_status["state"], "finished", "{child_status:#}");
    let events = cli_json(&up.server, &["events", &child_id]);
    assert_eq!(
        events["events"][0]["payload"]["parent_workflow_id"], parent_id,
        "{events:#}"
    );

    // Billed to the same tenant: the child's charges are in physics' month.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    loop {
        let out = cli_as(
            &up.server,
            &researcher,
            &[
                "bills", "--tenant", "physics", "--period", &month, "--output", "json",
            ],
        );
        let bill: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let billed = bill["workflows"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["workflow_id"] == child_id.as_str()));
        if billed {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child was never billed to physics: {bill:#} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    // The parent ended: its credential is refused, for its own workflow and its child's.
    for id in [&parent_id, &child_id] {
        let out = cli_as(&up.server, &job_token, &["status", id]);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("HTTP 401"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The audit trail (a file of its own) has the researcher's submission.
    let trail = cli_json(&up.server, &["audit", "--tenant", "physics"]);
    assert!(
        trail["records"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["action"] == "submit_workflow"
                && r["target"] == format!("workflow/{parent_id}").as_str()),
        "{trail:#}"
    );

    // No token of this run is in the log or the database, whole or as its secret part.
    let profile: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(up.dir.path().join("config").join("client.json")).unwrap(),
    )
    .unwrap();
    let admin = profile["token"].as_str().unwrap().to_string();
    let secrets: Vec<String> = [admin, researcher, job_token]
        .into_iter()
        .flat_map(|t| {
            let secret = t.rsplit('_').next().unwrap().to_string();
            [t, secret]
        })
        .collect();
    let data = up.dir.path().join("data");
    let mut scanned = 0;
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !["events.sqlite", "meridian.sqlite", "audit.sqlite"]
            .iter()
            .any(|file| name.starts_with(file))
        {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        scanned += bytes.len();
        for secret in &secrets {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{} holds a token",
                path.display()
            );
        }
    }
    assert!(scanned > 0, "nothing scanned in {}", data.display());
}

/// Tokens never cross the network in the clear: an API reachable from other machines
/// needs TLS (or a TLS proxy said to be in front); with a certificate it serves HTTPS,
/// and the CLI trusts the deployment's own CA through MERIDIAN_CA_CERT.
#[test]
fn the_api_serves_https_and_refuses_plain_http_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = std::process::Command::new(BIN)
        .args([
            "up",
            "--data-dir",
            "data",
            "--listen",
            &format!("0.0.0.0:{port}"),
        ])
        .current_dir(dir.path())
        .env("MERIDIAN_CONFIG_DIR", dir.path().join("config"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--tls-cert") && said.contains("--behind-tls-proxy"),
        "{said}"
    );

    // A self-signed certificate for 127.0.0.1.
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=meridian-test",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
        ])
        .current_dir(dir.path())
        .output()
        .expect("openssl");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let proc = spawn_up(
        dir.path(),
        port,
        &[
            "--local-cpus",
            "2",
            "--tls-cert",
            "cert.pem",
            "--tls-key",
            "key.pem",
        ],
        &[],
    );
    let server = format!("https://127.0.0.1:{port}");
    let ca = dir.path().join("cert.pem");
    let config = dir.path().join("config");
    let run = |args: &[&str], ca: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(BIN);
        c.args(args)
            .env("MERIDIAN_SERVER", &server)
            .env("MERIDIAN_CONFIG_DIR", &config)
            .env_remove("MERIDIAN_TOKEN");
        if let Some(ca) = ca {
            c.env("MERIDIAN_CA_CERT", ca);
        }
        c.output().unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !run(&["list"], Some(&ca)).status.success() {
        assert!(std::time::Instant::now() < deadline, "{}", proc.output());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let hello = write(dir.path(), "hello.yaml", "version: v1\nname: hello\njobs:\n  a:\n    image: host\n    command: [echo, hi]\n    resources: {cpus: 1, memory: 64MiB, walltime: 1m}\n");
    let out = run(&["submit", hello.to_str().unwrap(), "--wait"], Some(&ca));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without trusting the certificate the CLI refuses the server.
    let out = run(&["list"], None);
    assert!(!out.status.success());
    // Plain HTTP to the TLS port gets no answer.
    let out = run(
        &["list", "--server", &format!("http://127.0.0.1:{port}")],
        Some(&ca),
    );
    assert!(!out.status.success());
}

/// A tenant's concurrency limit holds work queued rather than refusing it: the second
/// workflow waits, says why in its status, and is placed once the first ends.
#[test]
fn a_tenants_concurrency_limit_holds_work_queued_and_says_why() {
    let up = up();
    cli_ok(
        &up.server,
        &[
            "admin",
            "budget",
            "--tenant",
            "physics",
            "--concurrent-workflows",
            "1",
        ],
    );
    let slow = write(
        up.dir.path(),
        "slow.yaml",
        "version: v1\nname: slow\njobs:\n  a:\n    image: host\n    command: [sh, -c, 'sleep 1.5']\n    resources: {cpus: 1, memory: 64MiB, walltime: 1m}\n",
    );
    let path = slow.to_str().unwrap();
    let first = cli_json(&up.server, &["submit", path, "--tenant", "physics"]);
    let first = first["id"].as_str().unwrap().to_string();
    wait_state(&up.server, &first, &["running"]);
    let second = cli_json(&up.server, &["submit", path, "--tenant", "physics"]);
    let second = second["id"].as_str().unwrap().to_string();
    let held = wait_state(&up.server, &second, &["waiting"]);
    let reason = held["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("1 of its 1 concurrent workflows"),
        "{held:#}"
    );
    // Killed and started again, it still knows what is placed: the second stays held.
    let port: u16 = up.server.rsplit(':').next().unwrap().parse().unwrap();
    let Up { dir, mut proc, .. } = up;
    proc.kill();
    let up = up_on(dir, port);
    let held = cli_json(&up.server, &["status", &second]);
    assert!(
        held["state"] == "waiting" || runs(&up.server, &first).len() == 1,
        "placed beside the first after a restart: {held:#}"
    );
    // Another tenant is not held by physics' limit.
    let other = cli_json(&up.server, &["submit", path, "--tenant", "chem"]);
    wait_state(
        &up.server,
        other["id"].as_str().unwrap(),
        &["running", "finished"],
    );

    let done = wait_state(&up.server, &second, &["finished", "failed"]);
    assert_eq!(done["state"], "finished", "{done:#}");
    let first_runs = runs(&up.server, &first);
    let second_runs = runs(&up.server, &second);
    assert!(
        first_runs[0].2 <= second_runs[0].1,
        "the second started before the first ended: {first_runs:?} {second_runs:?}"
    );
}

/// A volume's ingress reaches the job on `meridian up`: the job reads what was declared;
/// the events show the copy with its bytes and digest. A missing source fails the
/// workflow with the source named, and nothing runs.
#[test]
fn ingress_from_a_path_reaches_the_job_and_a_missing_one_fails_with_its_name() {
    let up = up();
    let input = up.dir.path().join("input");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(input.join("greeting.txt"), "hello from the data mover\n").unwrap();
    let file = write(
        up.dir.path(),
        "with-data.yaml",
        &format!(
            "version: v1\nname: with-data\nvolumes:\n  data:\n    size: 1GiB\n    ingress:\n      - {{source: \"file://{}\", destination: /in/}}\njobs:\n  read:\n    image: host\n    command: [sh, -c, \"cat $MERIDIAN_VOLUME_DATA/in/greeting.txt\"]\n    mounts: {{data: /data}}\n",
            input.display()
        ),
    );
    let status = submit_wait(&up.server, &file);
    assert_eq!(
        status["state"],
        "finished",
        "{status:#}\n{}",
        up.proc.output()
    );
    let id = status["id"].as_str().unwrap();
    let logs = cli_ok(&up.server, &["logs", id, "read"]);
    assert!(logs.contains("hello from the data mover"), "{logs}");
    let events = cli_ok(&up.server, &["events", id]);
    assert!(events.contains("workflow.volume_staged.v1"), "{events}");
    assert!(
        events.contains("transfer.completed.v1"),
        "the copy is shown: {events}"
    );

    let missing = up.dir.path().join("no-such-input");
    let file = write(
        up.dir.path(),
        "missing.yaml",
        &format!(
            "version: v1\nname: missing-data\nvolumes:\n  data:\n    size: 1GiB\n    ingress:\n      - {{source: \"file://{}\", destination: /in/}}\njobs:\n  read:\n    image: host\n    command: [\"true\"]\n    mounts: {{data: /data}}\n",
            missing.display()
        ),
    );
    let status = submit_wait(&up.server, &file);
    assert_eq!(status["state"], "failed", "{status:#}");
    let reason = status["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("could not be brought to local") && reason.contains("no-such-input"),
        "{status:#}"
    );
    assert!(status["jobs"].as_array().unwrap().is_empty(), "{status:#}");
}

/// A stand-in for the Hugging Face Hub's file API (none is reachable here): model
/// `org/tiny` at `main` holds `config.json`. Returns its URL and how many files it has
/// served (`resolve` requests).
fn hub() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).to_string();
            let path = request.split_whitespace().nth(1).unwrap_or("/");
            let (status, body): (&str, &[u8]) = match path {
                "/api/models/org/tiny/tree/main?recursive=true" => (
                    "200 OK",
                    br#"[{"type":"file","oid":"c0ffee","size":16,"path":"config.json"}]"#,
                ),
                "/org/tiny/resolve/main/config.json" => {
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    ("200 OK", b"{\"layers\": 2}\n\n\n")
                }
                _ => ("404 Not Found", b""),
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(body);
        }
    });
    (url, served)
}

/// The data mover end to end against real object stores: S3 (moto's server), Google
/// Cloud Storage (its emulator) and Azure Blob (Azurite), and a stand-in of the Hugging
/// Face Hub. Inputs come in from all four, the job reads them and writes a result, the
/// result goes out to all three stores before the workflow finishes, each copy is in
/// the events with its bytes and the copies out are on the bill. The same workflow run
/// again takes every input from the site's cache: nothing is fetched again.
#[test]
fn inputs_from_every_store_and_the_hub_results_out_and_a_second_run_fetches_nothing() {
    use meridian_datamover::testkit::{Azurite, GcsEmulator, Moto};
    let cells = b"id,value\n1,42\n2,43\n";
    let moto = Moto::start();
    moto.bucket("inputs");
    moto.bucket("results");
    moto.put("inputs", "run-1/cells.csv", cells);
    let gcs = GcsEmulator::start();
    gcs.bucket("inputs");
    gcs.bucket("results");
    gcs.put("inputs", "cells.csv", cells);
    let azurite = Azurite::start();
    azurite.container("inputs");
    azurite.container("results");
    azurite.put("inputs", "cells.csv", cells);
    let (hub_url, hub_served) = hub();

    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut env: Vec<(&str, String)> = moto.env();
    env.extend(gcs.env());
    env.extend(azurite.env());
    env.push(("HF_ENDPOINT", hub_url));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (server, up) = up_at(dir.path(), port, &[], &env);
    let file = write(
        dir.path(),
        "stores.yaml",
        r#"version: v1
name: every-store
volumes:
  data:
    size: 1GiB
    ingress:
      - {source: "s3://inputs/run-1/", destination: /in/s3/}
      - {source: "gs://inputs/cells.csv", destination: /in/gs/}
      - {source: "az://inputs/cells.csv", destination: /in/az/}
      - {source: "hf://org/tiny", destination: /model/}
    egress:
      - {source: /out/, destination: "s3://results/run-1/"}
      - {source: /out/, destination: "gs://results/run-1/"}
      - {source: /out/, destination: "az://results/run-1/"}
jobs:
  count:
    image: host
    command: [sh, -c, "cd $MERIDIAN_VOLUME_DATA && mkdir -p out && cat in/s3/cells.csv in/gs/cells.csv in/az/cells.csv model/config.json | wc -l > out/count.txt"]
    mounts: {data: /data}
"#,
    );
    let transfers = |id: &str| -> Vec<(String, u64, bool)> {
        let events = cli_json(&server, &["events", id]);
        let mut requested = std::collections::HashMap::new();
        let mut done = Vec::new();
        for e in events["events"].as_array().unwrap() {
            let p = &e["payload"];
            match p["type"].as_str() {
                Some("transfer.requested.v1") => {
                    let source = p["source"]["uri"]
                        .as_str()
                        .or(p["destination"]["uri"].as_str())
                        .unwrap_or_default()
                        .to_string();
                    requested.insert(e["aggregate"]["id"].to_string(), source);
                }
                Some("transfer.completed.v1") => done.push((
                    requested[&e["aggregate"]["id"].to_string()].clone(),
                    p["bytes"].as_u64().unwrap(),
                    p["cached"].as_bool().unwrap_or(false),
                )),
                _ => {}
            }
        }
        done.sort();
        done
    };

    let first = submit_wait(&server, &file);
    assert_eq!(first["state"], "finished", "{first:#}\n{}", up.output());
    let count =
        |bytes: Option<Vec<u8>>| bytes.map(|b| String::from_utf8_lossy(&b).trim().to_string());
    let expected = Some("12".to_string());
    assert_eq!(count(moto.get("results", "run-1/count.txt")), expected);
    assert_eq!(count(gcs.get("results", "run-1/count.txt")), expected);
    assert_eq!(count(azurite.get("results", "run-1/count.txt")), expected);
    let id = first["id"].as_str().unwrap();
    let out = |store: &str| (format!("{store}://results/run-1/"), 3, false);
    assert_eq!(
        transfers(id),
        [
            ("az://inputs/cells.csv".to_string(), 19, false),
            ("gs://inputs/cells.csv".to_string(), 19, false),
            ("hf://org/tiny".to_string(), 16, false),
            ("s3://inputs/run-1/".to_string(), 19, false),
            out("az"),
            out("gs"),
            out("s3"),
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>(),
        "four copies in, three out"
    );
    // `meridian status` lists the copies with their bytes.
    let status = cli_json(&server, &["status", id]);
    let copies = status["transfers"].as_array().unwrap();
    assert_eq!(copies.len(), 7, "{status:#}");
    assert!(
        copies.iter().all(|t| t["state"] == "completed"),
        "{status:#}"
    );
    // The copies out are on the bill by their bytes (3 B each, 0.000000003 GB), at the
    // local site's egress price.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let bill = cli_json(&server, &["bill", id]);
        let egress: rust_decimal::Decimal = bill["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["category"] == "egress")
            .map(|l| {
                l["quantity"]
                    .as_str()
                    .unwrap()
                    .parse::<rust_decimal::Decimal>()
                    .unwrap()
            })
            .sum();
        if egress == "0.000000009".parse().unwrap() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the egress lines do not add up to 9 bytes: {bill:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(hub_served.load(std::sync::atomic::Ordering::SeqCst), 1);

    // The same workflow again: every input comes from the site's cache.
    let second = submit_wait(&server, &file);
    assert_eq!(second["state"], "finished", "{second:#}\n{}", up.output());
    let again = transfers(second["id"].as_str().unwrap());
    let ins: Vec<&(String, u64, bool)> =
        again.iter().filter(|t| !t.0.contains("results")).collect();
    assert_eq!(ins.len(), 4, "{again:?}");
    assert!(
        ins.iter().all(|t| t.2),
        "every input from the cache: {again:?}"
    );
    assert_eq!(
        hub_served.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the model was not fetched again"
    );
}

/// A copy out that fails keeps the outputs at the site: the workflow fails saying so,
/// the volume stays held, `meridian outputs retry` copies them out once the destination
/// works and they are then given back, and `meridian outputs release` (an admin) gives
/// back another workflow's kept outputs without copying them.
#[test]
fn outputs_whose_copy_out_failed_are_kept_until_retried_or_released() {
    let moto = meridian_datamover::testkit::Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let env: Vec<(&str, String)> = moto.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (server, up) = up_at(dir.path(), port, &[], &env);
    // The bucket `late` does not exist yet.
    let file = write(
        dir.path(),
        "late.yaml",
        "version: v1\nname: late\nvolumes:\n  data:\n    size: 1GiB\n    egress:\n      - {source: /out/, destination: \"s3://late/run-1/\"}\njobs:\n  write:\n    image: host\n    command: [sh, -c, \"mkdir -p $MERIDIAN_VOLUME_DATA/out && echo 42 > $MERIDIAN_VOLUME_DATA/out/answer.txt\"]\n    mounts: {data: /data}\n",
    );
    let volume_events = |id: &str, kind: &str| {
        cli_json(&server, &["events", id])["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["payload"]["type"] == kind)
            .count()
    };
    let first = submit_wait(&server, &file);
    assert_eq!(first["state"], "failed", "{first:#}\n{}", up.output());
    let reason = first["reason"].as_str().unwrap();
    assert!(
        reason.contains("could not be copied out of local") && reason.contains("kept there"),
        "{reason}"
    );
    let first_id = first["id"].as_str().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        volume_events(first_id, "workflow.volume_released.v1"),
        0,
        "the outputs are kept"
    );

    // The destination works now: a retry copies them out, and then they are given back.
    moto.bucket("late");
    let retried = cli_ok(&server, &["outputs", "retry", first_id, "data"]);
    assert!(retried.contains("copying out again"), "{retried}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while moto.get("late", "run-1/answer.txt").is_none()
        || volume_events(first_id, "workflow.volume_released.v1") == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never copied out and given back"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(moto.get("late", "run-1/answer.txt").unwrap(), b"42\n");
    let status = cli_json(&server, &["status", first_id]);
    assert_eq!(status["state"], "failed", "it stays as it ended");
    assert!(
        status["reason"]
            .as_str()
            .unwrap()
            .starts_with("its outputs in volume data at local were copied out after all"),
        "{status:#}"
    );

    // Another one fails the same way (another missing bucket), and an admin gives its
    // outputs back instead.
    let other = write(
        dir.path(),
        "lost.yaml",
        &std::fs::read_to_string(&file)
            .unwrap()
            .replace("s3://late/", "s3://lost/")
            .replace("name: late", "name: lost"),
    );
    let second = submit_wait(&server, &other);
    assert_eq!(second["state"], "failed", "{second:#}");
    let second_id = second["id"].as_str().unwrap();
    let released = cli_ok(&server, &["outputs", "release", second_id, "data"]);
    assert!(released.contains("given back"), "{released}");
    assert_eq!(volume_events(second_id, "workflow.volume_released.v1"), 1);
    // Nothing is kept any more: a retry is refused, and says why.
    let out = cli(&server, &["outputs", "retry", second_id, "data"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("keeps no outputs of volume \"data\""),
        "{said}"
    );
}

/// A slow HTTP source: `/slow.bin` is 64 KiB of `x` sent in 32 pieces a tenth of a
/// second apart, with an ETag; a GET with `Range: bytes=N-` and that ETag in `If-Range`
/// gets the rest from N (206). Returns its URL and the offset each GET started at (a
/// HEAD, which the data mover sends to tell the version of a source, gets the headers
/// alone and is not counted).
fn slow_source() -> (String, std::sync::Arc<std::sync::Mutex<Vec<usize>>>) {
    use std::io::{Read, Write};
    const SIZE: usize = 2048 * 32;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/slow.bin", listener.local_addr().unwrap());
    let gets = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = gets.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                let n = stream.read(&mut buf).unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                let header = |name: &str| {
                    request
                        .lines()
                        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
                };
                let from = match (header("range: bytes="), header("if-range:")) {
                    (Some(range), Some(tag)) if tag == "\"v1\"" => {
                        range.trim_end_matches('-').parse().unwrap_or(0)
                    }
                    _ => 0,
                };
                let head = match from {
                    0 => format!("HTTP/1.1 200 OK\r\ncontent-length: {SIZE}\r\n"),
                    _ => format!(
                        "HTTP/1.1 206 Partial Content\r\ncontent-length: {}\r\ncontent-range: bytes {from}-{}/{SIZE}\r\n",
                        SIZE - from,
                        SIZE - 1
                    ),
                };
                let _ = write!(stream, "{head}etag: \"v1\"\r\nconnection: close\r\n\r\n");
                if request.starts_with("head") {
                    return;
                }
                seen.lock().unwrap().push(from);
                let rest = vec![b'x'; SIZE - from];
                for piece in rest.chunks(2048) {
                    if stream.write_all(piece).is_err() {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            });
        }
    });
    (url, gets)
}

/// A kill -9 of `meridian up` while an ingress copy is under way: the restarted data
/// mover continues the copy from where it stopped (a ranged GET) under the same
/// transfer, the job then runs once on the whole file, and the log holds one transfer
/// for the step, with the file's bytes counted once.
#[test]
fn a_kill_mid_ingress_resumes_under_the_same_transfer() {
    let (url, gets) = slow_source();
    let mut up = up();
    let file = write(
        up.dir.path(),
        "slow-data.yaml",
        &format!(
            "version: v1\nname: slow-data\nvolumes:\n  data:\n    size: 1GiB\n    ingress:\n      - {{source: \"{url}\", destination: /in/}}\njobs:\n  size:\n    image: host\n    command: [sh, -c, \"wc -c < $MERIDIAN_VOLUME_DATA/in/slow.bin\"]\n    mounts: {{data: /data}}\n"
        ),
    );
    let id = submit(&up.server, &file);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while gets.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the copy never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    up.proc.kill();
    let port: u16 = up.server.rsplit(':').next().unwrap().parse().unwrap();
    let dir = std::mem::replace(&mut up.dir, tempfile::tempdir().unwrap());
    drop(up);
    let up = up_on(dir, port);
    let status = wait_state(&up.server, &id, &["finished", "failed"]);
    assert_eq!(
        status["state"],
        "finished",
        "{status:#}\n{}",
        up.proc.output()
    );
    let gets = gets.lock().unwrap().clone();
    assert_eq!(gets.len(), 2, "fetched again once: {gets:?}");
    assert!(
        gets[1] > 0 && gets[1] < 65536,
        "the second GET went on from where the first stopped: {gets:?}"
    );
    let logs = cli_ok(&up.server, &["logs", &id, "size"]);
    assert!(logs.contains("65536"), "the job saw the whole file: {logs}");
    let events = cli_json(&up.server, &["events", &id]);
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["payload"]["type"].as_str())
        // Progress reports come and go with the copy; they bill nothing.
        .filter(|k| k.starts_with("transfer.") && *k != "transfer.progressed.v1")
        .collect();
    assert_eq!(
        kinds,
        ["transfer.requested.v1", "transfer.completed.v1"],
        "one transfer, completed once: {events:#}"
    );
    let completed = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["payload"]["type"] == "transfer.completed.v1")
        .unwrap();
    assert_eq!(
        completed["payload"]["bytes"], 65536,
        "the file's bytes, once"
    );
}

/// A stand-in `nvidia-smi` on `PATH` that reports two H100s, as the real one prints them,
/// the second with `ecc` uncorrectable ECC errors in its health signals.
fn two_gpus(dir: &std::path::Path, ecc: u32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let tool = bin.join("nvidia-smi");
    std::fs::write(
        &tool,
        "#!/bin/sh\n\
         case \"$*\" in\n\
         *--query-gpu=index,uuid,name,memory.total*)\n\
         echo '0, GPU-0b6ae4e2-1f0b-2c5e-8d1c-3b3d9f6c1a01, NVIDIA H100 80GB HBM3, 81559'\n\
         echo '1, GPU-7d1c9a55-63b2-4f0e-a1e4-2f0c8b9e4d02, NVIDIA H100 80GB HBM3, 81559' ;;\n\
         *--query-gpu=uuid,ecc.errors.uncorrected.volatile.total*)\n\
         echo 'GPU-0b6ae4e2-1f0b-2c5e-8d1c-3b3d9f6c1a01, 0, No, Not Active'\n\
         echo 'GPU-7d1c9a55-63b2-4f0e-a1e4-2f0c8b9e4d02, ECC, No, Not Active' ;;\n\
         *) exit 2 ;;\n\
         esac\n"
            .replace("ECC", &ecc.to_string()),
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn local_gpus_are_found_given_whole_to_one_job_at_a_time_and_billed_by_the_hour() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_gpus(dir.path(), 0);
    let Up { server, dir, proc } = up_with_env(dir, free_port(), &[], &[("PATH", &path)]);

    // The site says what it has: a shape with both H100s.
    let sites = cli_json(&server, &["site", "list"]);
    let text = sites.to_string();
    assert!(text.contains("local-h100"), "{sites:#}\n{}", proc.output());

    let job = |name: &str| {
        format!(
            "  {name}:\n    image: host\n    command: [sh, -c, 'echo \"{name} got $CUDA_VISIBLE_DEVICES\"; sleep 3']\n    resources: {{cpus: 1, memory: 64MiB, walltime: 1m, gpus: {{count: 1, vendor: nvidia, model: H100}}}}\n"
        )
    };
    let file = write(
        dir.path(),
        "gpus.yaml",
        &format!(
            "version: v1\nname: three-on-two\njobs:\n{}{}{}",
            job("a"),
            job("b"),
            job("c")
        ),
    );
    let id = submit(&server, &file);
    let status = wait_state(&server, &id, &["finished", "failed"]);
    assert_eq!(status["state"], "finished", "{status:#}\n{}", proc.output());

    // Nothing waits silently: the job that found both GPUs held recorded why (read from
    // the log, since status shows the reason only while the job waits).
    let events = cli_json(&server, &["events", &id]).to_string();
    assert!(
        events.contains("GPUs that fit"),
        "no job recorded why it waited: {events}"
    );

    // Each job saw one device, and two running at once never shared one.
    let runs = runs(&server, &id);
    within_cap(&runs, "", 2);
    let logs = String::from_utf8_lossy(&cli(&server, &["logs", &id]).stdout).to_string();
    let device = |name: &str| {
        let line = logs
            .lines()
            .find(|l| l.starts_with(&format!("{name} got ")))
            .unwrap_or_else(|| panic!("{name} printed nothing: {logs}"));
        line.split_once(" got ").unwrap().1.to_string()
    };
    for (i, a) in runs.iter().enumerate() {
        let da = device(&a.0);
        assert!(da.starts_with("GPU-") && !da.contains(','), "{da}");
        for b in &runs[i + 1..] {
            let overlap = a.1 < b.2 && b.1 < a.2;
            assert!(
                !overlap || device(&b.0) != da,
                "{} and {} shared {da}",
                a.0,
                b.0
            );
        }
    }

    // GPU-hours at the local site's default price, beside cores and memory.
    let bill = bill(&server, &id, 3);
    let billed = billed_runs(&bill);
    assert!(
        billed
            .values()
            .flatten()
            .filter(|l| l["meter"] == "gpu_hours")
            .count()
            == 3,
        "GPU-hours not billed for each run: {bill:#}"
    );

    // Started again where the tool finds nothing: the GPUs are no longer offered.
    let mut proc = proc;
    proc.kill();
    // On the same port: the client profile the first start wrote points there.
    let port = server.rsplit(':').next().unwrap().parse().unwrap();
    let again = up_with_env(dir, port, &[], &[]);
    let sites = cli_json(&again.server, &["site", "list"]);
    assert!(
        !sites.to_string().contains("local-h100"),
        "{sites:#}\n{}",
        again.proc.output()
    );
}

const HEALTHY: &str = "GPU-0b6ae4e2-1f0b-2c5e-8d1c-3b3d9f6c1a01";
const FAULTY: &str = "GPU-7d1c9a55-63b2-4f0e-a1e4-2f0c8b9e4d02";

/// The local site's devices in `meridian site list`, once the first health check recorded
/// them.
fn local_devices(server: &str) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let sites = cli_json(server, &["site", "list"]);
        let local = sites["sites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "local")
            .cloned()
            .unwrap();
        let devices = local["devices"].as_array().cloned().unwrap_or_default();
        if devices.len() == 2 && devices.iter().any(|d| d["cordoned"].is_object()) {
            return devices;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no device cordoned: {sites:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

#[test]
fn a_gpu_with_ecc_errors_is_cordoned_and_an_admin_can_cordon_and_give_back_another() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_gpus(dir.path(), 2);
    let Up { server, dir, proc } = up_with_env(dir, free_port(), &[], &[("PATH", &path)]);

    // The health check found the ECC errors and took that device out, saying why.
    let devices = local_devices(&server);
    let faulty = devices.iter().find(|d| d["id"] == FAULTY).unwrap();
    assert_eq!(faulty["cordoned"]["by"], "health check", "{devices:?}");
    assert_eq!(faulty["cordoned"]["reason"], "2 uncorrectable ECC error(s)");
    assert!(devices
        .iter()
        .any(|d| d["id"] == HEALTHY && d["cordoned"].is_null()));
    let table = cli_ok(&server, &["site", "list", "-o", "table"]);
    assert!(
        table.contains(FAULTY) && table.contains("cordoned by health check"),
        "{table}"
    );
    // It counts against the site's reliability (a new site starts at 0.5).
    let sites = cli_json(&server, &["site", "list"]);
    let reliability = sites["sites"][0]["reliability"].as_f64().unwrap();
    assert!(reliability < 0.5, "{sites:#}");

    // Both H100s asked for: no site can, and the quote says why.
    let gpus = |count: u32| {
        write(
            dir.path(),
            &format!("gpus{count}.yaml"),
            &format!(
                "version: v1\nname: g{count}\njobs:\n  a:\n    image: host\n    command: [sh, -c, 'echo \"got $CUDA_VISIBLE_DEVICES\"']\n    resources: {{cpus: 1, memory: 64MiB, walltime: 1m, gpus: {{count: {count}, vendor: nvidia, model: H100}}}}\n"
            ),
        )
    };
    let quote = |file: &std::path::Path| {
        let out = cli(
            &server,
            &[
                "quote",
                file.to_str().unwrap(),
                "--server",
                &server,
                "-o",
                "json",
            ],
        );
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) = quote(&gpus(2));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("1 of them cordoned"), "{text}");

    // One: it runs, on the healthy device.
    let status = submit_wait(&server, &gpus(1));
    assert_eq!(status["state"], "finished", "{status:#}\n{}", proc.output());
    let id = status["id"].as_str().unwrap();
    let logs = String::from_utf8_lossy(&cli(&server, &["logs", id]).stdout).to_string();
    assert!(logs.contains(&format!("got {HEALTHY}")), "{logs}");

    // An admin takes the other out too, by hand: nothing fits; given back, it does.
    let out = cli(
        &server,
        &["site", "cordon", "local", "GPU-nope", "--reason", "x"],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no device GPU-nope"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cli_ok(
        &server,
        &[
            "site",
            "cordon",
            "local",
            HEALTHY,
            "--reason",
            "fan replaced tomorrow",
        ],
    );
    let sites = cli_json(&server, &["site", "list"]).to_string();
    assert!(sites.contains("fan replaced tomorrow"), "{sites}");
    let (code, text) = quote(&gpus(1));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("2 of them cordoned"), "{text}");
    cli_ok(&server, &["site", "uncordon", "local", HEALTHY]);
    let (code, text) = quote(&gpus(1));
    assert_eq!(code, Some(0), "{text}");
    let out = cli(&server, &["site", "uncordon", "local", HEALTHY]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not cordoned"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
