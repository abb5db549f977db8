//! End to end on a Kubernetes site: `meridian up --adapter k8s=kubernetes:FILE` against
//! the **stand-in** API server (`meridian-kube-standin`; no real Kubernetes can run on
//! these machines), driven with the CLI as a user would: a DAG with a capped array, a
//! GPU job, a service, an evicted pod whose work is placed again, a cancel that deletes
//! what it created, and a kill -9 of Meridian mid-run that creates nothing twice.

#![cfg(feature = "site-kubernetes")]

mod common;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use common::*;
use meridian_kube_standin::{Node, Options, StandIn};
use rust_decimal::Decimal;
use serde_json::Value;

const CATALOG: &str = r#"
sites:
  - name: k8s
    kind: kubernetes
    region: campus-1
    jurisdiction: eu
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: "test charge-back rates"
      compute:
        - {offer: cpu-node, per_core_hour: "0.01", per_gib_hour: "0.001"}
        - {offer: gpu-node, per_core_hour: "0.01", per_gib_hour: "0.001", per_gpu_hour: "0.90"}
    shapes:
      - {name: cpu-node, offer: cpu-node, cpus: 4, memory: 8GiB, max_walltime: 1h}
      - {name: gpu-node, offer: gpu-node, cpus: 8, memory: 32GiB, max_walltime: 1h, gpus: {count: 2, vendor: nvidia, model: H100, memory: 80GiB}}
"#;

/// The same site as CoreWeave sells it: whole 8-GPU nodes by the hour, named by class.
const COREWEAVE_CATALOG: &str = r#"
sites:
  - name: k8s
    kind: coreweave
    region: us-east-04
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: "test rates"
      compute:
        - {offer: H100_NVLINK_80GB.8, per_instance_hour: "22.80"}
    shapes:
      - {name: H100_NVLINK_80GB.8, offer: H100_NVLINK_80GB.8, cpus: 128, memory: 2TiB, gpus: {count: 8, vendor: nvidia, model: H100, memory: 80GiB}}
"#;

/// Which cluster the stand-in plays.
#[derive(Clone, Copy, PartialEq)]
enum Flavour {
    /// A plain cluster with NVIDIA's feature discovery labels.
    Kubernetes,
    /// CoreWeave: `gpu.nvidia.com/class` labels, `profile: coreweave`.
    Coreweave,
}

/// The stand-in cluster (on its own runtime) and `meridian up` with a site on it.
struct K8sUp {
    server: String,
    port: u16,
    proc: Proc,
    standin: StandIn,
    dir: tempfile::TempDir,
    flavour: Flavour,
    _runtime: tokio::runtime::Runtime,
}

fn cluster(dir: &std::path::Path, flavour: Flavour) -> (tokio::runtime::Runtime, StandIn) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut options = Options::new(dir.join("standin"));
    options.forbidden_namespaces.push("locked".into());
    options.nodes.push(match flavour {
        Flavour::Kubernetes => Node {
            name: "gpu-node".into(),
            cpus: 8,
            memory_bytes: 32 << 30,
            labels: BTreeMap::from([(
                "nvidia.com/gpu.product".into(),
                "NVIDIA-H100-80GB-HBM3".into(),
            )]),
            extended: BTreeMap::from([("nvidia.com/gpu".into(), 2)]),
        },
        Flavour::Coreweave => Node {
            name: "gd-8xh100ib-i128".into(),
            cpus: 128,
            memory_bytes: 2 << 40,
            labels: BTreeMap::from([("gpu.nvidia.com/class".into(), "H100_NVLINK_80GB".into())]),
            extended: BTreeMap::from([("nvidia.com/gpu".into(), 8)]),
        },
    });
    let standin = runtime.block_on(StandIn::start(options)).unwrap();
    (runtime, standin)
}

fn up_on(
    dir: tempfile::TempDir,
    port: u16,
    runtime: tokio::runtime::Runtime,
    standin: StandIn,
    flavour: Flavour,
) -> K8sUp {
    write(dir.path(), "kubeconfig", &standin.kubeconfig("meridian"));
    write(
        dir.path(),
        "k8s.yaml",
        &format!(
            "kubeconfig: {}\nnamespace: meridian\nlog_streams: split\nttl_seconds_after_finished: 600\n{}",
            dir.path().join("kubeconfig").display(),
            match flavour {
                Flavour::Kubernetes => "",
                Flavour::Coreweave => "profile: coreweave\n",
            }
        ),
    );
    let catalog = match flavour {
        Flavour::Kubernetes => CATALOG,
        Flavour::Coreweave => COREWEAVE_CATALOG,
    };
    write(dir.path(), "catalog.yaml", catalog);
    let (server, proc) =
        up_with_adapter(dir.path(), port, "catalog.yaml", "k8s=kubernetes:k8s.yaml");
    K8sUp {
        server,
        port,
        proc,
        standin,
        dir,
        flavour,
        _runtime: runtime,
    }
}

fn up() -> K8sUp {
    up_as(Flavour::Kubernetes)
}

fn up_as(flavour: Flavour) -> K8sUp {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, standin) = cluster(dir.path(), flavour);
    up_on(dir, free_port(), runtime, standin, flavour)
}

/// The workflow `text` with its placement held to the Kubernetes site.
fn on_k8s(text: &str) -> String {
    text.replacen("\njobs:", "\nplacement: {sites: [k8s]}\njobs:", 1)
}

fn jobs_of(status: &Value) -> &Vec<Value> {
    status["jobs"].as_array().unwrap()
}

#[test]
fn a_dag_with_a_capped_array_runs_on_kubernetes_and_each_pod_is_billed() {
    let up = up();
    let file = write(up.dir.path(), "dag.yaml", &on_k8s(DAG));
    let status = submit_wait(&up.server, &file);
    assert_eq!(
        status["state"],
        "finished",
        "{status:#}\n{}",
        up.proc.output()
    );
    assert_eq!(status["site"], "k8s");
    assert_eq!(status["tasks"]["succeeded"], 8, "{status:#}");
    let id = status["id"].as_str().unwrap();
    // The sweep went as one Indexed Job; prep and report as a Job each.
    let sweep: Vec<&Value> = jobs_of(&status)
        .iter()
        .filter(|j| j["name"] == "sweep")
        .collect();
    assert_eq!(sweep.len(), 6);
    let arrays: std::collections::BTreeSet<String> = sweep
        .iter()
        .map(|j| {
            let backend = j["backend_job_id"].as_str().unwrap();
            backend.rsplit_once('/').unwrap().0.to_string()
        })
        .collect();
    assert_eq!(arrays.len(), 1, "{arrays:?}");
    assert_eq!(up.standin.created("jobs"), 3, "prep, the sweep and report");

    let runs = runs(&up.server, id);
    assert_eq!(runs.len(), 8, "{runs:?}");
    for (name, start, _, _) in runs.iter().filter(|r| r.0.starts_with("sweep")) {
        let overlapping = runs
            .iter()
            .filter(|r| r.0.starts_with("sweep") && r.1 <= *start && *start < r.2)
            .count();
        assert!(
            overlapping <= 2,
            "{name} started with {overlapping} running (cap 2)"
        );
    }
    let logs = cli(&up.server, &["logs", id, "sweep"]);
    let text = String::from_utf8_lossy(&logs.stdout);
    for i in 1..=6 {
        assert!(text.contains(&format!("cell {i}")), "{text}");
    }
    // Each pod's time at the site's rates, for what it asked: 1 core, 64 MiB.
    let bill = bill(&up.server, id, 8);
    check_bill(&bill, 1, Decimal::from_str("0.0625").unwrap());
}

#[test]
fn a_gpu_job_lands_on_the_h100_node_and_its_gpu_hours_are_billed() {
    let up = up();
    let file = write(
        up.dir.path(),
        "gpu.yaml",
        r#"
version: v1
name: on-a-gpu
placement: {sites: [k8s]}
jobs:
  train:
    image: docker://docker.io/library/busybox:1.37
    command: [sh, -c, "echo trained on $MERIDIAN_JOB_ID; sleep 0.5"]
    resources:
      cpus: 2
      memory: 1GiB
      walltime: 5m
      gpus: {count: 1, vendor: any, model: H100}
"#,
    );
    let status = submit_wait(&up.server, &file);
    assert_eq!(
        status["state"],
        "finished",
        "{status:#}\n{}",
        up.proc.output()
    );
    let id = status["id"].as_str().unwrap();
    let pods = up.standin.objects("pods");
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["spec"]["nodeName"], "gpu-node");
    assert_eq!(
        pods[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );
    let bill = bill(&up.server, id, 1);
    let gpu = line_at_rate(&bill, "gpu_hours", "0.90");
    let core = line_at_rate(&bill, "core_hours", "0.02");
    assert_eq!(gpu, core, "the pod's one stretch");
}

/// The one run's line of `meter` in `bill` costs its stretch at `rate` an hour (for
/// one unit); returns the stretch in microseconds.
fn line_at_rate(bill: &Value, meter: &str, rate: &str) -> i64 {
    let lines = billed_runs(bill).into_values().next().unwrap();
    let line = lines
        .iter()
        .find(|l| l["meter"] == meter)
        .unwrap_or_else(|| panic!("a {meter} line: {bill:#}"));
    let at = |k: &str| chrono::DateTime::parse_from_rfc3339(line[k].as_str().unwrap()).unwrap();
    let micros = (at("ended_at") - at("started_at"))
        .num_microseconds()
        .unwrap();
    let expected =
        Decimal::from_str(rate).unwrap() * Decimal::from(micros) / Decimal::from(3_600_000_000u64);
    let amount = Decimal::from_str(line["amount"].as_str().unwrap()).unwrap();
    assert!(
        (amount - expected).abs() < Decimal::from_str("0.0000000001").unwrap(),
        "{line:#} should cost {expected}"
    );
    micros
}

#[test]
fn a_failing_job_fails_with_its_exit_code_and_a_cancel_deletes_the_job() {
    let up = up();
    let file = write(up.dir.path(), "failing.yaml", &on_k8s(FAILING));
    let out = submit_waiting(&up.server, &file);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["state"], "failed", "{status:#}");
    let bad = jobs_of(&status)
        .iter()
        .find(|j| j["name"] == "bad")
        .unwrap();
    assert_eq!(bad["exit_code"], 3, "{status:#}");
    let logs = cli(&up.server, &["logs", status["id"].as_str().unwrap(), "bad"]);
    assert!(String::from_utf8_lossy(&logs.stdout).contains("about to fail"));

    let file = write(up.dir.path(), "slow.yaml", &on_k8s(SLOW));
    let id = submit(&up.server, &file);
    let deadline = Instant::now() + Duration::from_secs(60);
    while cli_json(&up.server, &["status", &id])["tasks"]["running"] != 1 {
        assert!(Instant::now() < deadline, "never ran: {}", up.proc.output());
        std::thread::sleep(Duration::from_millis(100));
    }
    cli_json(&up.server, &["cancel", &id]);
    let status = wait_state(&up.server, &id, &["cancelled"]);
    assert_eq!(jobs_of(&status)[0]["state"], "cancelled", "{status:#}");
    let name = format!(
        "meridian-{}",
        jobs_of(&status)[0]["backend_job_id"]
            .as_str()
            .unwrap()
            .trim_start_matches("job/meridian-")
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while up
        .standin
        .objects("jobs")
        .iter()
        .any(|j| j["metadata"]["name"] == name.as_str())
    {
        assert!(
            Instant::now() < deadline,
            "the cancelled Job {name} is still there"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let bill = bill(&up.server, &id, 1);
    check_bill(&bill, 1, Decimal::from_str("0.0625").unwrap());
}

#[test]
fn a_service_is_a_deployment_with_a_cluster_address_until_cancelled() {
    let up = up();
    let port = free_port();
    let file = write(
        up.dir.path(),
        "service.yaml",
        &on_k8s(&job_and_service(up.dir.path(), port)),
    );
    let id = submit(&up.server, &file);
    let address = wait_address(&up.server, &id, "web");
    assert!(
        address.starts_with("meridian-") && address.ends_with(&format!(".meridian.svc:{port}")),
        "{address}"
    );
    // The stand-in runs the pod here, so its port answers on this machine.
    let page = http_get(&format!("127.0.0.1:{port}"), "/index.txt").expect("it answers");
    assert!(page.contains("made-by-prep"), "{page}");
    assert_eq!(up.standin.objects("services").len(), 1);
    cli_json(&up.server, &["cancel", &id]);
    wait_state(&up.server, &id, &["cancelled"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !up.standin.objects("deployments").is_empty()
        || !up.standin.objects("services").is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the Deployment or Service is still there"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_evicted_pod_is_a_site_fault_and_its_work_is_placed_again() {
    let up = up();
    let marker = up.dir.path().join("first-run");
    let file = write(
        up.dir.path(),
        "evicted.yaml",
        &format!(
            r#"
version: v1
name: evicted
placement: {{sites: [k8s]}}
jobs:
  work:
    image: host
    command: [sh, -c, "if [ -e {m} ]; then echo second run; else touch {m}; sleep 300; fi"]
    resources: {{cpus: 1, memory: 64MiB, walltime: 10m}}
"#,
            m = marker.display()
        ),
    );
    let id = submit(&up.server, &file);
    let deadline = Instant::now() + Duration::from_secs(60);
    let pod = loop {
        let running = up
            .standin
            .objects("pods")
            .into_iter()
            .find(|p| p["status"]["phase"] == "Running" && marker.exists());
        if let Some(pod) = running {
            break pod;
        }
        assert!(Instant::now() < deadline, "never ran: {}", up.proc.output());
        std::thread::sleep(Duration::from_millis(100));
    };
    let name = pod["metadata"]["name"].as_str().unwrap();
    let eviction = format!(
        "{}/api/v1/namespaces/meridian/pods/{name}/eviction",
        up.standin.url()
    );
    let body = format!(
        r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{name}","namespace":"meridian"}}}}"#
    );
    let out = std::process::Command::new("curl")
        .args(["-sf", "-X", "POST", "-H", "Content-Type: application/json"])
        .args([
            "-H",
            "Authorization: Bearer standin-token",
            "--data",
            &body,
            &eviction,
        ])
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_state(&up.server, &id, &["finished", "failed"]);
    assert_eq!(
        status["state"],
        "finished",
        "{status:#}\n{}",
        up.proc.output()
    );
    assert_eq!(dispatches(&up.server, &id, "work"), 2, "{status:#}");
    assert_eq!(up.standin.created("jobs"), 2, "one Job per run");
}

#[test]
fn a_kill_of_meridian_mid_run_creates_nothing_twice_on_kubernetes() {
    let mut up = up();
    let marker = up.dir.path().join("ran.txt");
    let file = write(
        up.dir.path(),
        "slow.yaml",
        &format!(
            "version: v1\nname: slow-on-k8s\nplacement: {{sites: [k8s]}}\njobs:\n  slow:\n    image: host\n    command: [sh, -c, \"echo ran >> {m}; sleep 4\"]\n    resources: {{cpus: 1, memory: 64MiB, walltime: 2m}}\n  cells:\n    image: host\n    command: [sh, -c, \"echo cell-${{ARRAY_INDEX}} >> {m}; sleep 2\"]\n    array: {{start: 1, end: 3, parallelism: 1}}\n    resources: {{cpus: 1, memory: 64MiB, walltime: 2m}}\n",
            m = marker.display()
        ),
    );
    let id = submit(&up.server, &file);
    let deadline = Instant::now() + Duration::from_secs(60);
    while cli_json(&up.server, &["status", &id])["tasks"]["running"]
        .as_u64()
        .unwrap_or(0)
        == 0
    {
        assert!(Instant::now() < deadline, "never ran: {}", up.proc.output());
        std::thread::sleep(Duration::from_millis(100));
    }
    // kill -9: nothing of Meridian's gets to tidy up.
    up.proc.kill();
    let port = up.port;
    let K8sUp {
        dir,
        standin,
        flavour,
        _runtime: runtime,
        ..
    } = up;
    let up = up_on(dir, port, runtime, standin, flavour);
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
        "each ran once: {ran:?}"
    );
    assert_eq!(jobs_of(&status).len(), 4, "{status:#}");
    assert_eq!(
        up.standin.created("jobs"),
        2,
        "one Job and one Indexed Job, once each"
    );
}

#[test]
fn a_coreweave_site_runs_an_h100_job_on_its_class_and_bills_the_instance_hours() {
    let up = up_as(Flavour::Coreweave);
    let file = write(
        up.dir.path(),
        "h100.yaml",
        r#"
version: v1
name: on-coreweave
placement: {sites: [k8s]}
jobs:
  train:
    image: docker://nvcr.io/nvidia/pytorch:25.01-py3
    command: [sh, -c, "echo trained; sleep 0.5"]
    resources:
      cpus: 16
      memory: 64GiB
      walltime: 5m
      gpus: {count: 8, vendor: nvidia, model: H100}
"#,
    );
    let status = submit_wait(&up.server, &file);
    assert_eq!(
        status["state"],
        "finished",
        "{status:#}\n{}",
        up.proc.output()
    );
    let id = status["id"].as_str().unwrap();
    let pods = up.standin.objects("pods");
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["spec"]["nodeName"], "gd-8xh100ib-i128");
    let term = &pods[0]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        ["matchExpressions"][0];
    assert_eq!(term["key"], "gpu.nvidia.com/class");
    assert!(
        term["values"]
            .as_array()
            .unwrap()
            .contains(&Value::from("H100_NVLINK_80GB")),
        "{term}"
    );
    assert_eq!(
        pods[0]["spec"]["containers"][0]["image"],
        "nvcr.io/nvidia/pytorch:25.01-py3"
    );
    // CoreWeave sells the node by the hour: one instance line, at 22.80 an hour.
    let bill = bill(&up.server, id, 1);
    line_at_rate(&bill, "instance_hours", "22.80");
}

#[test]
fn a_job_waiting_for_a_gpu_says_why_in_meridian_status() {
    let up = up();
    // Both jobs want both GPUs of the one GPU node: one waits for the other.
    let job = |name: &str| {
        format!(
            "  {name}:\n    image: host\n    command: [sh, -c, \"sleep 3\"]\n    resources: {{cpus: 1, memory: 64MiB, walltime: 5m, gpus: {{count: 2, vendor: nvidia, model: H100}}}}\n"
        )
    };
    let file = write(
        up.dir.path(),
        "two-gpu-jobs.yaml",
        &format!(
            "version: v1\nname: queued-for-gpus\nplacement: {{sites: [k8s]}}\njobs:\n{}{}",
            job("first"),
            job("second")
        ),
    );
    let id = submit(&up.server, &file);
    let deadline = Instant::now() + Duration::from_secs(60);
    let reason = loop {
        let status = cli_json(&up.server, &["status", &id]);
        let waiting = jobs_of(&status)
            .iter()
            .find(|j| j["state"] == "pending" && j["reason"].is_string())
            .map(|j| j["reason"].as_str().unwrap().to_string());
        if let Some(reason) = waiting {
            break reason;
        }
        assert!(
            Instant::now() < deadline,
            "no job said why it waits: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        reason.starts_with("waiting at the site: Unschedulable: ")
            && reason.contains("nvidia.com/gpu"),
        "{reason}"
    );
    let status = wait_state(&up.server, &id, &["finished", "failed"]);
    assert_eq!(status["state"], "finished", "{status:#}");
    assert!(
        jobs_of(&status).iter().all(|j| j["reason"].is_null()),
        "a run that started waits for nothing: {status:#}"
    );
}

#[test]
fn a_namespace_the_adapter_may_not_use_makes_the_site_unhealthy_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let (_runtime, standin) = cluster(dir.path(), Flavour::Kubernetes);
    write(dir.path(), "kubeconfig", &standin.kubeconfig("locked"));
    write(
        dir.path(),
        "k8s.yaml",
        &format!(
            "kubeconfig: {}\nnamespace: locked\n",
            dir.path().join("kubeconfig").display()
        ),
    );
    write(dir.path(), "catalog.yaml", CATALOG);
    let (server, proc) = up_with_adapter(
        dir.path(),
        free_port(),
        "catalog.yaml",
        "k8s=kubernetes:k8s.yaml",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let site = loop {
        let list = cli_json(&server, &["site", "list"]);
        let site = list["sites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "k8s")
            .cloned()
            .unwrap();
        if site["state"] == "unhealthy" {
            break site;
        }
        assert!(
            Instant::now() < deadline,
            "never unhealthy: {site:#}\n{}",
            proc.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let reason = site["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("namespace \"locked\"") && reason.contains("forbidden"),
        "{site:#}"
    );
    // Work for that site is not swallowed: placement says why it cannot go there.
    let file = write(dir.path(), "slow.yaml", &on_k8s(SLOW));
    let id = submit(&server, &file);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = cli_json(&server, &["status", &id]);
        let why = status["reason"].as_str().unwrap_or_default().to_string();
        if why.contains("unhealthy at its last report: namespace \"locked\"") {
            assert_ne!(status["state"], "running", "{status:#}");
            break;
        }
        assert!(Instant::now() < deadline, "no reason given: {status:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(standin.created("jobs"), 0);
}
