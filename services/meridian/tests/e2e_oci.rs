//! End to end on an OCI site, driven with the CLI as a user would, against the OCI
//! stand-in (`meridian-oci-standin`: no OCI emulator runs here, so these are `contract_*`
//! tests). `meridian up --adapter oci-test=oci:FILE` reads the API key from an OCI config
//! file and signs every call; the stand-in checks each signature.
//!
//! - A workflow runs on an OCI instance: this test plays the instance, running the
//!   bootstrap the launch carried as its user data against the running API; the
//!   bootstrap's power-off stops the instance as OCI does, and the adapter terminates it
//!   with its boot volume. The run is billed launch to terminate at the catalogue's
//!   instance-hour price, and nothing of the API key reaches what Meridian writes.
//! - "Out of host capacity" in every availability domain sends the work to another site,
//!   as `meridian explain` shows.

#![cfg(feature = "site-oci")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use common::*;
use meridian_oci_standin::OciStandIn;

const PEM: &str = include_str!("../../../adapters/oci/tests/keys/oci-doc-test-key.pem");
const TENANCY: &str = "ocid1.tenancy.oc1..meridiane2e";
const USER: &str = "ocid1.user.oc1..meridiane2e";
const FINGERPRINT: &str = "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34";
const ADS: [&str; 2] = ["Uocm:US-ASHBURN-AD-1", "Uocm:US-ASHBURN-AD-2"];

/// A catalogue with one OCI site, `oci-test`, offering VM.Standard.E5.Flex at `price`.
fn catalog(price: &str) -> String {
    format!(
        r#"
sites:
  - name: oci-test
    kind: oci
    region: us-ashburn-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: "test list prices"
      compute:
        - {{offer: e5-flex, per_instance_hour: "{price}"}}
    shapes:
      - {{name: VM.Standard.E5.Flex, offer: e5-flex, cpus: 8, memory: 64GiB}}
"#
    )
}

/// The OCI config file and key the adapter reads, and its own configuration.
fn adapter_config(dir: &Path, standin: &OciStandIn, power_off: &Path) -> std::path::PathBuf {
    let key = write(dir, "oci_api_key.pem", PEM);
    let profile = write(
        dir,
        "oci-config",
        &format!(
            "[DEFAULT]\nuser={USER}\nfingerprint={FINGERPRINT}\ntenancy={TENANCY}\nregion=us-ashburn-1\nkey_file={}\n",
            key.display()
        ),
    );
    write(
        dir,
        "oci.yaml",
        &format!(
            "region: us-ashburn-1\nendpoint_url: {}\ncompartment: ocid1.compartment.oc1..e2e\nimages: {{x86_64: ocid1.image.oc1.iad.e2e}}\navailability_domains:\n  - {{name: '{}', subnet: ocid1.subnet.oc1.iad.one}}\n  - {{name: '{}', subnet: ocid1.subnet.oc1.iad.two}}\ncredentials: {{config_file: {}}}\nlifecycle:\n  work_dir: {}\n  power_off_command: sh {}\n  output_every_seconds: 1\n",
            standin.url(),
            ADS[0],
            ADS[1],
            profile.display(),
            dir.join("instance").display(),
            power_off.display()
        ),
    )
}

/// `meridian up` with the OCI site `oci-test`, once its runner is connected.
fn up_oci(dir: &Path, catalog_text: &str, config: &Path) -> (String, Proc) {
    up_site(dir, catalog_text, "oci-test", "oci", config, &[])
}

fn standin() -> (tokio::runtime::Runtime, OciStandIn) {
    let runtime = standin_runtime();
    let standin = runtime.block_on(OciStandIn::start(
        &format!("{TENANCY}/{USER}/{FINGERPRINT}"),
        PEM,
    ));
    (runtime, standin)
}

#[test]
fn contract_a_workflow_runs_on_an_oci_instance_is_billed_by_the_instance_hour_and_leaves_nothing_running(
) {
    let (runtime, standin) = standin();
    let dir = tempfile::tempdir().unwrap();
    let power_off = dir.path().join("poweroff.sh");
    let config = adapter_config(dir.path(), &standin, &power_off);
    let (server, proc) = up_oci(dir.path(), &catalog("0.25"), &config);
    let file = write(
        dir.path(),
        "hello.yaml",
        "version: v1\nname: hello-oci\nplacement: {sites: [oci-test]}\njobs:\n  hello:\n    image: host\n    command: [sh, -c, \"echo hello from OCI\"]\n    resources: {cpus: 4, memory: 8GiB, walltime: 10m}\n",
    );
    let id = submit(&server, &file);

    let deadline = Instant::now() + Duration::from_secs(60);
    let instance = loop {
        if let Some(i) = standin.instances().into_iter().next() {
            break i;
        }
        let status = cli_json(&server, &["status", &id]);
        assert!(
            Instant::now() < deadline && status["state"] != "failed",
            "no instance launched: {status:#}\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(instance.shape, "VM.Standard.E5.Flex");
    assert_eq!(instance.launch["shapeConfig"]["ocpus"], 2);
    assert_eq!(standin.unsigned(), 0, "every call signed");

    // Play the instance: its user data, run here; its power-off stops it, as OCI does.
    let script = base64::engine::general_purpose::STANDARD
        .decode(instance.launch["metadata"]["user_data"].as_str().unwrap())
        .unwrap();
    let script = String::from_utf8(script).unwrap();
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
            "curl -sf -o /dev/null -X POST {}/standin/instances/{}/shutdown\n",
            standin.url(),
            instance.id
        ),
    );

    let status = wait_state(&server, &id, &["finished", "failed"]);
    assert_eq!(status["state"], "finished", "{status:#}\n{}", proc.output());
    let logs = cli_json(&server, &["logs", &id]).to_string();
    assert!(logs.contains("hello from OCI"), "{logs}");

    // Stopped by its own power-off, then terminated by Meridian with its boot volume.
    let gone = standin
        .instances()
        .into_iter()
        .find(|i| i.id == instance.id)
        .unwrap();
    assert_eq!(gone.state, "TERMINATED");
    assert_eq!(gone.preserve_boot_volume, Some(false));
    let line = instance_hours(&server, &id, "0.25");
    assert_eq!(
        billed_from(&line).timestamp_millis(),
        instance.created_at.timestamp_millis(),
        "billed from the launch: {line:#}"
    );

    // Nothing of the API key, nor the run's credential, in what Meridian wrote.
    let key_line = PEM.lines().nth(1).unwrap();
    assert_no_secret_written(dir.path(), &proc, &server, &id, &[key_line, &run_token]);
    drop(runtime);
}

#[test]
fn contract_out_of_host_capacity_everywhere_sends_the_work_elsewhere_and_explain_says_why() {
    let (runtime, standin) = standin();
    for ad in ADS {
        standin.refuse(ad, 500, "InternalError", "Out of host capacity.");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = adapter_config(dir.path(), &standin, &dir.path().join("poweroff.sh"));
    // Cheaper than the local site, so placement tries it first.
    let (server, proc) = up_oci(dir.path(), &catalog("0.0001"), &config);
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
        ["oci-test", "local"],
        "placed on the OCI site first, then elsewhere"
    );
    let text = String::from_utf8_lossy(&cli(&server, &["explain", &id]).stdout).to_string();
    assert!(
        text.contains("Out of host capacity") && text.contains(ADS[1]),
        "explain should say the site refused and where: {text}"
    );
    assert!(standin.instances().is_empty(), "nothing launched");
    drop(runtime);
}
