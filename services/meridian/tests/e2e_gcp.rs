//! End to end on a Google Cloud site, driven with the CLI as a user would, against the
//! Compute Engine stand-in (`meridian-gce-standin`: no Compute Engine emulator runs here,
//! so these are `contract_*` tests). `meridian up --adapter gcp-test=gcp:FILE` reads an
//! `authorized_user` credentials file, as Application Default Credentials would, and
//! calls with the tokens Google's client gets for it; the stand-in checks each call's
//! token.
//!
//! - A workflow runs on a Compute Engine instance: this test plays the instance, running
//!   the startup script it was inserted with against the running API; the script's
//!   power-off stops the instance (TERMINATED, as Compute Engine does), and the adapter
//!   deletes it with its boot disk. The run is billed from the instance's creation at the
//!   catalogue's instance-hour price, and no credential reaches what Meridian writes.
//! - Exhausted resource pools in every zone send the work to another site, as `meridian
//!   explain` shows.

#![cfg(feature = "site-gcp")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use meridian_gce_standin::GceStandIn;

const CLIENT: &str = "764086051850-e2e.apps.googleusercontent.com";
const SECRET: &str = "e2e-gcp-client-secret-never-in-the-log";
const REFRESH: &str = "1//e2e-gcp-refresh-token-never-in-the-log";
const ZONES: [&str; 2] = ["us-central1-a", "us-central1-b"];

/// A catalogue with one Google Cloud site, `gcp-test`, offering e2-standard-4 at `price`.
fn catalog(price: &str) -> String {
    format!(
        r#"
sites:
  - name: gcp-test
    kind: gcp
    region: us-central1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: "test list prices"
      compute:
        - {{offer: e2-standard-4, per_instance_hour: "{price}"}}
    shapes:
      - {{name: e2-standard-4, offer: e2-standard-4, cpus: 4, memory: 16GiB}}
"#
    )
}

/// The credentials file the adapter reads, and its own configuration.
fn adapter_config(dir: &Path, standin: &GceStandIn, power_off: &Path) -> std::path::PathBuf {
    let credentials = write(dir, "adc.json", &standin.credentials_json().to_string());
    write(
        dir,
        "gcp.yaml",
        &format!(
            "project: physics-lab-1\nregion: us-central1\nzones: [{}, {}]\nimages: {{x86_64: projects/debian-cloud/global/images/family/debian-12}}\nendpoint_url: {}\ncredentials: {{file: {}}}\nlifecycle:\n  work_dir: {}\n  power_off_command: sh {}\n  output_every_seconds: 1\n",
            ZONES[0],
            ZONES[1],
            standin.url(),
            credentials.display(),
            dir.join("instance").display(),
            power_off.display()
        ),
    )
}

/// `meridian up` with the Google Cloud site `gcp-test`, once its runner is connected.
fn up_gcp(dir: &Path, catalog_text: &str, config: &Path) -> (String, Proc) {
    up_site(dir, catalog_text, "gcp-test", "gcp", config, &[])
}

fn standin() -> (tokio::runtime::Runtime, GceStandIn) {
    let runtime = standin_runtime();
    let standin = runtime.block_on(GceStandIn::start(CLIENT, SECRET, REFRESH));
    (runtime, standin)
}

#[test]
fn contract_a_workflow_runs_on_a_compute_engine_instance_is_billed_by_the_instance_hour_and_leaves_nothing_running(
) {
    let (runtime, standin) = standin();
    let dir = tempfile::tempdir().unwrap();
    let power_off = dir.path().join("poweroff.sh");
    let config = adapter_config(dir.path(), &standin, &power_off);
    let (server, proc) = up_gcp(dir.path(), &catalog("0.25"), &config);
    let file = write(
        dir.path(),
        "hello.yaml",
        "version: v1\nname: hello-gcp\nplacement: {sites: [gcp-test]}\njobs:\n  hello:\n    image: host\n    command: [sh, -c, \"echo hello from Google Cloud\"]\n    resources: {cpus: 4, memory: 8GiB, walltime: 10m}\n",
    );
    let id = submit(&server, &file);

    let deadline = Instant::now() + Duration::from_secs(60);
    let instance = loop {
        if let Some(i) = standin
            .instances()
            .into_iter()
            .find(|i| i.status == "RUNNING")
        {
            break i;
        }
        let status = cli_json(&server, &["status", &id]);
        assert!(
            Instant::now() < deadline && status["state"] != "failed",
            "no instance inserted: {status:#}\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        instance.body["machineType"],
        format!("zones/{}/machineTypes/e2-standard-4", ZONES[0])
    );
    assert_eq!(instance.body["labels"]["meridian-workflow-id"], id);

    // Play the instance: its startup script, run here; its power-off stops it, as
    // Compute Engine does.
    let script = instance.body["metadata"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["key"] == "startup-script")
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_string();
    let run_token = script
        .lines()
        .find_map(|l| l.strip_prefix("meridian_run_token="))
        .expect("the run credential in the bootstrap")
        .to_string();
    run_bootstrap(
        dir.path(),
        script.as_bytes(),
        &power_off,
        &format!(
            "curl -sf -o /dev/null -X POST {}/standin/instances/{}/{}/shutdown\n",
            standin.url(),
            instance.zone,
            instance.name
        ),
    );

    let status = wait_state(&server, &id, &["finished", "failed"]);
    assert_eq!(status["state"], "finished", "{status:#}\n{}", proc.output());
    let logs = cli_json(&server, &["logs", &id]).to_string();
    assert!(logs.contains("hello from Google Cloud"), "{logs}");

    // Stopped by its own power-off, then deleted by Meridian with its boot disk.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !standin.instances().is_empty() {
        assert!(Instant::now() < deadline, "left: {:?}", standin.instances());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(standin
        .requests()
        .contains(&format!("delete {}/{}", instance.zone, instance.name)));
    let line = instance_hours(&server, &id, "0.25");
    assert_eq!(
        billed_from(&line).timestamp_millis(),
        instance.created_at.timestamp_millis(),
        "billed from the instance's creation: {line:#}"
    );

    // No credential, token or run credential in what Meridian wrote.
    assert_no_secret_written(
        dir.path(),
        &proc,
        &server,
        &id,
        &[SECRET, REFRESH, "ya29.standin-", &run_token],
    );
    drop(runtime);
}

#[test]
fn contract_exhausted_zones_send_the_work_elsewhere_and_explain_says_why() {
    let (runtime, standin) = standin();
    for zone in ZONES {
        standin.refuse(
            zone,
            false,
            503,
            "ZONE_RESOURCE_POOL_EXHAUSTED",
            &format!("The zone 'projects/physics-lab-1/zones/{zone}' does not have enough resources available to fulfill the request."),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let config = adapter_config(dir.path(), &standin, &dir.path().join("poweroff.sh"));
    // Cheaper than the local site, so placement tries it first.
    let (server, proc) = up_gcp(dir.path(), &catalog("0.0001"), &config);
    let file = write(
        dir.path(),
        "anywhere.yaml",
        "version: v1\nname: anywhere\njobs:\n  work:\n    image: host\n    command: [sh, -c, \"echo ran\"]\n    resources: {cpus: 1, memory: 64MiB, walltime: 10m}\n",
    );
    let id = submit(&server, &file);
    let status = wait_state(&server, &id, &["finished", "failed"]);
    assert_eq!(status["state"], "finished", "{status:#}\n{}", proc.output());
    assert_eq!(
        dispatched_sites(&server, &id),
        ["gcp-test", "local"],
        "placed on the Google Cloud site first, then elsewhere"
    );
    let text = String::from_utf8_lossy(&cli(&server, &["explain", &id]).stdout).to_string();
    assert!(
        text.contains("ZONE_RESOURCE_POOL_EXHAUSTED") && text.contains(ZONES[1]),
        "explain should say the site refused and where: {text}"
    );
    assert!(standin.instances().is_empty(), "nothing made");
    drop(runtime);
}
