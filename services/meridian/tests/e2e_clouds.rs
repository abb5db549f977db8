//! End to end with three clouds in one `meridian up`: a Google Cloud, an OCI and an Azure
//! site, each against its stand-in (no emulator of any runs here, so these are
//! `contract_*` tests). Google Cloud is the cheapest and refuses for the project's CPU
//! quota; OCI is next and refuses for capacity in every domain; the workflow is placed
//! again on Azure, runs on a VM this test plays (running the bootstrap the VM was created
//! with), is billed there by the instance-hour, and leaves nothing behind at any of them;
//! `meridian explain` shows the three attempts.

#![cfg(all(feature = "site-oci", feature = "site-azure", feature = "site-gcp"))]

mod common;

use std::time::{Duration, Instant};

use base64::Engine;
use common::*;

const PEM: &str = include_str!("../../../adapters/oci/tests/keys/oci-doc-test-key.pem");
const OCI_KEY_ID: &str =
    "ocid1.tenancy.oc1..clouds/ocid1.user.oc1..clouds/20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34";
const AZURE_CLIENT: &str = "5b7e2c1a-0d3f-4e8a-9b6c-1f2e3d4c5b6a";
const AZURE_SECRET: &str = "meridian-e2e-azure-secret-never-in-the-log";
const SUB: &str = "6f3c1a52-9d1e-4b7a-8c2f-0e5d4a3b2c1d";
const GCP_SECRET: &str = "e2e-clouds-gcp-secret-never-in-the-log";
const GCP_REFRESH: &str = "1//e2e-clouds-gcp-refresh-token";

fn catalog() -> String {
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
        - {offer: e2-standard-4, per_instance_hour: "0.00001"}
    shapes:
      - {name: e2-standard-4, offer: e2-standard-4, cpus: 4, memory: 16GiB}
  - name: oci-test
    kind: oci
    region: us-ashburn-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: "test list prices"
      compute:
        - {offer: e5-flex, per_instance_hour: "0.0001"}
    shapes:
      - {name: VM.Standard.E5.Flex, offer: e5-flex, cpus: 8, memory: 64GiB}
  - name: azure-test
    kind: azure
    region: eastus
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: "test list prices"
      compute:
        - {offer: d4s-v5, per_instance_hour: "0.001"}
    shapes:
      - {name: Standard_D4s_v5, offer: d4s-v5, cpus: 4, memory: 16GiB}
"#
    .to_string()
}

#[test]
fn contract_a_refusal_at_one_cloud_re_places_the_workflow_on_another_and_it_is_billed_there() {
    let runtime = standin_runtime();
    let oci = runtime.block_on(meridian_oci_standin::OciStandIn::start(OCI_KEY_ID, PEM));
    for ad in ["Uocm:US-ASHBURN-AD-1", "Uocm:US-ASHBURN-AD-2"] {
        oci.refuse(ad, 500, "InternalError", "Out of host capacity.");
    }
    let gcp = runtime.block_on(meridian_gce_standin::GceStandIn::start(
        "764086051850-clouds.apps.googleusercontent.com",
        GCP_SECRET,
        GCP_REFRESH,
    ));
    gcp.refuse(
        "us-central1-a",
        false,
        403,
        "QUOTA_EXCEEDED",
        "Quota 'CPUS' exceeded.  Limit: 0.0 in region us-central1.",
    );
    let azure = runtime.block_on(meridian_azure_standin::AzureStandIn::start(
        AZURE_CLIENT,
        AZURE_SECRET,
    ));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let power_off = d.join("poweroff.sh");
    let key = write(d, "oci_api_key.pem", PEM);
    let (tenancy, rest) = OCI_KEY_ID.split_once('/').unwrap();
    let (user, fingerprint) = rest.split_once('/').unwrap();
    let profile = write(
        d,
        "oci-config",
        &format!(
            "[DEFAULT]\nuser={user}\nfingerprint={fingerprint}\ntenancy={tenancy}\nkey_file={}\n",
            key.display()
        ),
    );
    let lifecycle = format!(
        "lifecycle:\n  work_dir: {}\n  power_off_command: sh {}\n  output_every_seconds: 1\n",
        d.join("instance").display(),
        power_off.display()
    );
    let oci_config = write(
        d,
        "oci.yaml",
        &format!(
            "region: us-ashburn-1\nendpoint_url: {}\ncompartment: ocid1.compartment.oc1..e2e\nimages: {{x86_64: ocid1.image.oc1.iad.e2e}}\navailability_domains:\n  - {{name: 'Uocm:US-ASHBURN-AD-1', subnet: ocid1.subnet.oc1.iad.one}}\n  - {{name: 'Uocm:US-ASHBURN-AD-2', subnet: ocid1.subnet.oc1.iad.two}}\ncredentials: {{config_file: {}}}\n{lifecycle}",
            oci.url(),
            profile.display()
        ),
    );
    let azure_config = write(
        d,
        "azure.yaml",
        &format!(
            "subscription: {SUB}\nresource_group: jobs\nlocation: eastus\nzones: ['1']\nsubnet: /subscriptions/{SUB}/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/s\nimages: {{x86_64: 'Canonical:ubuntu-24_04-lts:server:latest'}}\nssh_public_key: ssh-ed25519 AAAAC3Nz ops\nendpoint_url: {0}\nauthority_url: {0}\n{lifecycle}",
            azure.url()
        ),
    );
    let gcp_credentials = write(d, "adc.json", &gcp.credentials_json().to_string());
    let gcp_config = write(
        d,
        "gcp.yaml",
        &format!(
            "project: physics-lab-1\nregion: us-central1\nzones: [us-central1-a, us-central1-b]\nimages: {{x86_64: projects/debian-cloud/global/images/family/debian-12}}\nendpoint_url: {}\ncredentials: {{file: {}}}\n{lifecycle}",
            gcp.url(),
            gcp_credentials.display()
        ),
    );
    let catalog = write(d, "catalog.yaml", &catalog());
    let (server, proc) = up_with_adapters_env(
        d,
        free_port(),
        catalog.to_str().unwrap(),
        &[
            &format!("gcp-test=gcp:{}", gcp_config.display()),
            &format!("oci-test=oci:{}", oci_config.display()),
            &format!("azure-test=azure:{}", azure_config.display()),
        ],
        &[
            ("AZURE_TENANT_ID", "72f988bf-86f1-41af-91ab-2d7cd011db47"),
            ("AZURE_CLIENT_ID", AZURE_CLIENT),
            ("AZURE_CLIENT_SECRET", AZURE_SECRET),
        ],
    );
    wait_connected(&server, "gcp-test", &proc);
    wait_connected(&server, "oci-test", &proc);
    wait_connected(&server, "azure-test", &proc);

    let file = write(
        d,
        "hello.yaml",
        "version: v1\nname: hello-clouds\nplacement: {sites: [gcp-test, oci-test, azure-test]}\njobs:\n  hello:\n    image: host\n    command: [sh, -c, \"echo hello from a cloud\"]\n    resources: {cpus: 2, memory: 4GiB, walltime: 10m}\n",
    );
    let id = submit(&server, &file);
    let deadline = Instant::now() + Duration::from_secs(60);
    let vm = loop {
        if let Some(vm) = azure
            .vms()
            .into_iter()
            .find(|v| v.provisioning == "Succeeded")
        {
            break vm;
        }
        let status = cli_json(&server, &["status", &id]);
        assert!(
            Instant::now() < deadline && status["state"] != "failed",
            "no VM created: {status:#}\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    };

    // Play the VM: its custom data, run here; its power-off stops it, as Azure does.
    let script = base64::engine::general_purpose::STANDARD
        .decode(
            vm.body["properties"]["osProfile"]["customData"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    run_bootstrap(
        d,
        &script,
        &power_off,
        &format!(
            "curl -sf -o /dev/null -X POST {}/standin/vms/{}/shutdown\n",
            azure.url(),
            vm.name
        ),
    );

    let status = wait_state(&server, &id, &["finished", "failed"]);
    assert_eq!(status["state"], "finished", "{status:#}\n{}", proc.output());
    assert_eq!(
        dispatched_sites(&server, &id),
        ["gcp-test", "oci-test", "azure-test"]
    );
    let explain = String::from_utf8_lossy(&cli(&server, &["explain", &id]).stdout).to_string();
    assert!(
        explain.contains("Quota 'CPUS' exceeded")
            && explain.contains("Out of host capacity")
            && explain.contains("azure-test"),
        "explain should show the three attempts: {explain}"
    );
    let logs = cli_json(&server, &["logs", &id]).to_string();
    assert!(logs.contains("hello from a cloud"), "{logs}");

    // Billed at Azure's price, from the VM's creation; nothing left at any cloud.
    let line = instance_hours(&server, &id, "0.001");
    assert_eq!(line["site"], "azure-test", "{line:#}");
    assert_eq!(
        billed_from(&line).timestamp_micros(),
        vm.created_at.timestamp_micros(),
        "{line:#}"
    );
    assert!(oci.instances().is_empty(), "nothing launched at OCI");
    assert!(gcp.instances().is_empty(), "nothing made at Google Cloud");
    assert_eq!(
        gcp.requests()
            .iter()
            .filter(|r| r.starts_with("insert "))
            .count(),
        1,
        "a quota keeps the whole Google Cloud site out: no second zone"
    );
    assert!(
        azure.vms().is_empty() && azure.nics().is_empty() && azure.disks().is_empty(),
        "left at Azure: {:?} {:?} {:?}",
        azure.vms(),
        azure.nics(),
        azure.disks()
    );

    // No cloud's secret in what Meridian wrote.
    let key_line = PEM.lines().nth(1).unwrap();
    assert_no_secret_written(
        d,
        &proc,
        &server,
        &id,
        &[
            AZURE_SECRET,
            key_line,
            "standin-token-",
            GCP_SECRET,
            GCP_REFRESH,
            "ya29.standin-",
        ],
    );
    drop(runtime);
}
