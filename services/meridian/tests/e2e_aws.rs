//! End to end on an AWS site, driven with the CLI as a user would:
//!
//! - `meridian up --adapter aws-test=aws:FILE` against **moto's EC2 server**, with this
//!   test playing the instance: it reads the bootstrap moto holds as the instance's user
//!   data and runs it here, against the running API; the bootstrap reports the start,
//!   the output and the exit code with its run credential and powers the instance off
//!   (a stand-in that terminates it in moto). The run is billed launch to terminate at
//!   the catalogue's instance-hour price, and no credential reaches the log.
//! - `contract_*`: against the EC2 stand-in (`meridian-ec2-standin`), a site refusing
//!   in every zone sends the work to another site, as `meridian explain` shows.

#![cfg(feature = "site-aws")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use meridian_adapter_aws::aws_sdk_ec2::types::{Filter, InstanceAttributeName};
use meridian_adapter_aws::{AwsConfig, Ec2};
use meridian_datamover::testkit::Moto;

const ACCESS_KEY: &str = "AKIAMERIDIANE2E00001";
const SECRET_KEY: &str = "meridian-e2e-secret-key-never-in-the-log";

/// A catalogue with one AWS site, `aws-test`, offering `compute` (YAML flow lines) and
/// `shapes`.
fn aws_catalog(compute: &[&str], shapes: &[&str]) -> String {
    let list = |indent: &str, lines: &[&str]| {
        lines
            .iter()
            .map(|l| format!("{indent}- {l}\n"))
            .collect::<String>()
    };
    format!(
        r#"
sites:
  - name: aws-test
    kind: aws
    region: us-east-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: "test list prices"
      compute:
{}    shapes:
{}"#,
        list("        ", compute),
        list("      ", shapes)
    )
}

/// The one-shape catalogue most tests use: c7i.4xlarge at `price` an hour.
fn catalog(price: &str) -> String {
    aws_catalog(
        &[&format!(
            r#"{{offer: c7i.4xlarge, per_instance_hour: "{price}"}}"#
        )],
        &["{name: c7i.4xlarge, offer: c7i.4xlarge, cpus: 16, memory: 32GiB}"],
    )
}

/// The site's adapter configuration; `subnets` (the stand-in's `subnet-<zone>`) only
/// where the endpoint knows them (moto checks that subnets exist).
fn adapter_config(
    dir: &Path,
    endpoint: &str,
    power_off: &Path,
    subnets: bool,
) -> std::path::PathBuf {
    let subnets = if subnets {
        "subnets: [{zone: us-east-1a, subnet: subnet-us-east-1a}, {zone: us-east-1b, subnet: subnet-us-east-1b}]\n"
    } else {
        ""
    };
    write(
        dir,
        "aws.yaml",
        &format!(
            "region: us-east-1\nendpoint_url: {endpoint}\nimages: {{x86_64: ami-12c6146b}}\n{subnets}lifecycle:\n  work_dir: {}\n  power_off_command: sh {}\n  output_every_seconds: 1\n",
            dir.join("instance").display(),
            power_off.display()
        ),
    )
}

/// `meridian up` with the AWS site `aws-test`, its credentials in the environment only,
/// once that site's runner is connected.
fn up_aws(dir: &Path, catalog_text: &str, config: &Path) -> (String, Proc) {
    up_site(
        dir,
        catalog_text,
        "aws-test",
        "aws",
        config,
        &[
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ],
    )
}

fn ec2(endpoint: &str) -> Ec2 {
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let config: AwsConfig = serde_saphyr::from_str(&format!(
        "region: us-east-1\nendpoint_url: {endpoint}\nimages: {{x86_64: ami-12c6146b}}\n"
    ))
    .unwrap();
    Ec2::new(config).unwrap()
}

#[test]
fn a_workflow_runs_on_an_ec2_instance_reports_itself_is_billed_by_the_instance_hour_and_leaves_no_instance_or_secret(
) {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let power_off = dir.path().join("poweroff.sh");
    let config = adapter_config(dir.path(), moto.url(), &power_off, false);
    let (server, proc) = up_aws(dir.path(), &catalog("0.714"), &config);
    let file = write(
        dir.path(),
        "hello.yaml",
        "version: v1\nname: hello-cloud\nplacement: {sites: [aws-test]}\njobs:\n  hello:\n    image: host\n    command: [sh, -c, \"echo hello from the cloud; echo to stderr >&2\"]\n    resources: {cpus: 2, memory: 1GiB, walltime: 10m}\n",
    );
    let id = submit(&server, &file);

    // The instance Meridian launched, as moto holds it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let provider = ec2(moto.url());
    let client = runtime.block_on(provider.client()).clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    let instance = loop {
        let found = runtime
            .block_on(
                client
                    .describe_instances()
                    .filters(
                        Filter::builder()
                            .name("tag:meridian-managed")
                            .values("true")
                            .build(),
                    )
                    .send(),
            )
            .unwrap();
        if let Some(i) = found
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .next()
        {
            break i.clone();
        }
        let status = cli_json(&server, &["status", &id]);
        assert!(
            Instant::now() < deadline && status["state"] != "failed",
            "no instance launched: {status:#}\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let instance_id = instance.instance_id().unwrap().to_string();
    assert_eq!(instance.instance_type().unwrap().as_str(), "c7i.4xlarge");
    // Nothing waits silently: until the bootstrap reports, status says what it waits for.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = cli_json(&server, &["status", &id]);
        if status
            .to_string()
            .contains("its bootstrap has not reported the start yet")
        {
            break;
        }
        assert!(Instant::now() < deadline, "no waiting reason: {status:#}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Play the instance: its user data, run here; its power-off terminates it in moto.
    let user_data = runtime
        .block_on(
            client
                .describe_instance_attribute()
                .instance_id(&instance_id)
                .attribute(InstanceAttributeName::UserData)
                .send(),
        )
        .unwrap();
    let script = String::from_utf8(aws_smithy_base64(
        user_data.user_data().and_then(|u| u.value()).unwrap(),
    ))
    .unwrap();
    let run_token = script
        .lines()
        .find_map(|l| l.strip_prefix("meridian_run_token="))
        .expect("the run credential in the bootstrap")
        .to_string();
    assert!(run_token.starts_with("mer_run_"), "{run_token}");
    let workflow_token = script
        .lines()
        .find_map(|l| l.strip_prefix("export MERIDIAN_TOKEN="))
        .expect("the workflow credential in the job's environment")
        .to_string();
    run_bootstrap(
        dir.path(),
        script.as_bytes(),
        &power_off,
        &format!(
            "curl -sf -o /dev/null -X POST -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20261203/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00' -d 'Action=TerminateInstances&InstanceId.1={instance_id}&Version=2016-11-15' {}/\n",
            moto.url()
        ),
    );

    let status = wait_state(&server, &id, &["finished", "failed"]);
    assert_eq!(status["state"], "finished", "{status:#}\n{}", proc.output());
    let logs = cli_json(&server, &["logs", &id]);
    let text = logs.to_string();
    assert!(text.contains("hello from the cloud"), "{logs:#}");
    assert!(text.contains("to stderr"), "{logs:#}");

    // Terminated in moto: the bill's stretch is launch to terminate.
    let described = runtime
        .block_on(
            client
                .describe_instances()
                .instance_ids(&instance_id)
                .send(),
        )
        .unwrap();
    let gone = &described.reservations()[0].instances()[0];
    assert_eq!(
        gone.state().and_then(|s| s.name()).unwrap().as_str(),
        "terminated"
    );
    let launched = gone.launch_time().unwrap().secs();
    let line = instance_hours(&server, &id, "0.714");
    assert_eq!(
        billed_from(&line).timestamp(),
        launched,
        "billed from the launch: {line:#}"
    );
    let owned = runtime
        .block_on(meridian_adapter_cloud_owned(&provider))
        .unwrap();
    assert!(owned.is_empty(), "left running: {owned:?}");

    // No credential in anything Meridian wrote: the log, the read models, its output.
    assert_no_secret_written(
        dir.path(),
        &proc,
        &server,
        &id,
        &[SECRET_KEY, ACCESS_KEY, &run_token, &workflow_token],
    );
}

fn aws_smithy_base64(text: &str) -> Vec<u8> {
    // Twenty lines rather than a dependency for a test.
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut buffer = 0u32;
    let mut bits = 0;
    for c in text
        .bytes()
        .filter(|c| *c != b'=' && !c.is_ascii_whitespace())
    {
        let value = alphabet.iter().position(|a| *a == c).expect("base64") as u32;
        buffer = (buffer << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    out
}

async fn meridian_adapter_cloud_owned(provider: &Ec2) -> Result<Vec<String>, String> {
    use meridian_adapter_aws::aws_sdk_ec2::types::Filter;
    let client = provider.client().await;
    let found = client
        .describe_instances()
        .filters(
            Filter::builder()
                .name("tag:meridian-managed")
                .values("true")
                .build(),
        )
        .filters(
            Filter::builder()
                .name("instance-state-name")
                .values("pending")
                .values("running")
                .build(),
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    Ok(found
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .filter_map(|i| i.instance_id().map(str::to_string))
        .collect())
}

#[test]
fn contract_a_site_refusing_in_every_zone_sends_the_work_elsewhere_and_explain_says_why() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let standin = runtime.block_on(meridian_ec2_standin::Ec2StandIn::start());
    for zone in ["us-east-1a", "us-east-1b"] {
        standin.refuse(
            zone,
            "InsufficientInstanceCapacity",
            &format!("We currently do not have sufficient c7i.4xlarge capacity in the Availability Zone you requested ({zone})."),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let config = adapter_config(
        dir.path(),
        standin.url(),
        &dir.path().join("poweroff.sh"),
        true,
    );
    // Cheaper than the local site, so placement tries it first.
    let (server, proc) = up_aws(dir.path(), &catalog("0.001"), &config);
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
        ["aws-test", "local"],
        "placed on the AWS site first, then elsewhere"
    );
    let explain = cli(&server, &["explain", &id]);
    let text = String::from_utf8_lossy(&explain.stdout).to_string();
    assert!(
        text.contains("InsufficientInstanceCapacity") && text.contains("us-east-1b"),
        "explain should say the site refused and where: {text}"
    );
    assert!(standin.instances().is_empty(), "nothing launched");
    drop(runtime);
}

#[test]
fn site_refresh_reads_the_shapes_from_describe_instance_types_and_placement_sees_them() {
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    // The catalogue has p4d.24xlarge wrong: too little memory and no GPUs.
    let catalog_text = aws_catalog(
        &[r#"{offer: p4d.24xlarge, per_instance_hour: "32.7726"}"#],
        &["{name: p4d.24xlarge, offer: p4d.24xlarge, cpus: 96, memory: 1TiB}"],
    );
    let config = write(
        dir.path(),
        "aws.yaml",
        &format!(
            "region: us-east-1\nendpoint_url: {}\nimages: {{x86_64: ami-12c6146b}}\n",
            moto.url()
        ),
    );
    let (server, proc) = up_aws(dir.path(), &catalog_text, &config);
    let gpu_job = write(
        dir.path(),
        "a100.yaml",
        "version: v1\nname: a100\nplacement: {sites: [aws-test]}\njobs:\n  train:\n    image: host\n    command: [nvidia-smi]\n    resources: {cpus: 8, memory: 64GiB, walltime: 1h, gpus: {count: 8, vendor: nvidia, model: A100}}\n",
    );
    let quote = |server: &str| -> serde_json::Value {
        let out = cli(
            server,
            &[
                "quote",
                gpu_job.to_str().unwrap(),
                "--server",
                server,
                "--output",
                "json",
            ],
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("no quote: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let before = quote(&server);
    assert!(
        before["site"].is_null(),
        "no shape has GPUs yet: {before:#}"
    );

    let out = cli(&server, &["site", "refresh", "aws-test", "--timeout", "60"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        proc.output()
    );
    assert!(
        said.contains("memory 1024 GiB -> 1152 GiB") && said.contains("8x A100 (40 GiB)"),
        "{said}"
    );
    let after = quote(&server);
    assert_eq!(after["site"], "aws-test", "{after:#}");

    // A site whose adapter cannot read shapes says so, and the command fails.
    let local = cli(&server, &["site", "refresh", "local", "--timeout", "60"]);
    let said = String::from_utf8_lossy(&local.stdout);
    // All it said, and the server's log: once in CI it failed with nothing on stdout.
    let why = || {
        format!(
            "stdout: {said}\nstderr: {}\n{}",
            String::from_utf8_lossy(&local.stderr),
            proc.output()
        )
    };
    assert!(!local.status.success(), "{}", why());
    assert!(said.contains("not supported"), "{}", why());
}

#[test]
fn contract_a_reclaimed_spot_instance_sends_the_work_elsewhere_and_its_life_is_billed() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let standin = runtime.block_on(meridian_ec2_standin::Ec2StandIn::start());
    let dir = tempfile::tempdir().unwrap();
    let config = adapter_config(
        dir.path(),
        standin.url(),
        &dir.path().join("poweroff.sh"),
        true,
    );
    // Spot is cheaper still, and the workflow allows it.
    let catalog_text = aws_catalog(
        &[
            r#"{offer: c7i.4xlarge, per_instance_hour: "0.002"}"#,
            r#"{offer: c7i.4xlarge-spot, per_instance_hour: "0.001"}"#,
        ],
        &["{name: c7i.4xlarge, offer: c7i.4xlarge, spot_offer: c7i.4xlarge-spot, cpus: 16, memory: 32GiB}"],
    );
    let (server, proc) = up_aws(dir.path(), &catalog_text, &config);
    let file = write(
        dir.path(),
        "spot.yaml",
        "version: v1\nname: spot\nplacement: {spot: true}\njobs:\n  work:\n    image: host\n    command: [sh, -c, \"echo ran\"]\n    resources: {cpus: 1, memory: 64MiB, walltime: 10m}\n",
    );
    let id = submit(&server, &file);
    let deadline = Instant::now() + Duration::from_secs(60);
    let instance = loop {
        if let Some(i) = standin.instances().into_iter().next() {
            break i;
        }
        assert!(Instant::now() < deadline, "no launch: {}", proc.output());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        instance.spot,
        "placement chose the spot offer: {instance:?}"
    );
    // The instance's bootstrap says the job started, with its run credential.
    let script = String::from_utf8(aws_smithy_base64(&instance.user_data)).unwrap();
    let token = script
        .lines()
        .find_map(|l| l.strip_prefix("meridian_run_token="))
        .unwrap();
    let job = &instance.tags["meridian-job-id"];
    let started = std::process::Command::new("curl")
        .args([
            "-sf",
            "-X",
            "POST",
            "-H",
            &format!("Authorization: Bearer {token}"),
        ])
        .args([
            "-H",
            "Content-Type: application/json",
            "--data",
            r#"{"event":"started"}"#,
        ])
        .arg(format!("{server}/v1/runs/{job}/report"))
        .output()
        .unwrap();
    assert!(started.status.success(), "{started:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cli(&server, &["status", &id, "--output", "json"]);
        assert!(out.status.success(), "{out:?}\n{}", proc.output());
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if status["state"] == "running" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never running: {}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // AWS takes it back.
    standin.reclaim(&instance.id);
    let status = loop {
        let out = cli(&server, &["status", &id, "--output", "json"]);
        assert!(out.status.success(), "{out:?}\n{}", proc.output());
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if status["state"] == "finished" || status["state"] == "failed" {
            break status;
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "{status:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status["state"], "finished", "{status:#}\n{}", proc.output());
    assert_eq!(
        dispatched_sites(&server, &id),
        ["aws-test", "local"],
        "placed on the AWS site first, then elsewhere"
    );
    let explain = String::from_utf8_lossy(&cli(&server, &["explain", &id]).stdout).to_string();
    assert!(
        explain.contains("job work at aws-test: preempted by the site"),
        "{explain}"
    );
    // The reclaimed instance's life is on the bill, at the spot price.
    let bill = bill(&server, &id, 2);
    let spot_line = bill["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["site"] == "aws-test")
        .unwrap_or_else(|| panic!("no line for the reclaimed instance: {bill:#}"));
    assert_eq!(spot_line["meter"], "instance_hours", "{spot_line:#}");
    assert_eq!(spot_line["offer"], "c7i.4xlarge-spot", "{spot_line:#}");
    assert_eq!(spot_line["list_unit_price"], "0.001", "{spot_line:#}");
    drop(runtime);
}
