//! Golden tests of what the adapter asks a cluster to create, one file per case under
//! `tests/golden/`. Each file is also decoded strictly into its `k8s-openapi` type: a
//! field the Kubernetes API does not have fails the test. `MERIDIAN_UPDATE_GOLDEN=1`
//! writes the files again after a deliberate change; review the diff.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use meridian_adapter_core::{ArrayRequest, ArrayTask, Gpus, JobRequest, Resources, ServiceRequest};
use meridian_adapter_kubernetes::config::{KubernetesConfig, Profile};
use meridian_adapter_kubernetes::gpu::{self, NodeGpus};
use meridian_adapter_kubernetes::manifest;
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

const JOB: Uuid = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0001);
const WORKFLOW: Uuid = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_00aa);
const BATCH: Uuid = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_00bb);

fn config() -> KubernetesConfig {
    let mut c = KubernetesConfig::new("meridian");
    c.service_account = Some("meridian-jobs".into());
    c.image_pull_secrets = vec!["registry-credentials".into()];
    c.priority_class = Some("research".into());
    c.storage_class = Some("fast-rwx".into());
    c
}

fn request(name: &str, command: &[&str]) -> JobRequest {
    JobRequest {
        job_id: JOB,
        workflow_id: WORKFLOW,
        name: name.into(),
        array_index: None,
        image: Some("docker://ghcr.io/example/align:1.4".into()),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::from([("SAMPLE".into(), "s01".into())]),
        cwd: None,
        resources: Resources {
            nodes: 1,
            cpus: 4,
            memory_bytes: 16 << 30,
            walltime: Duration::from_secs(2 * 3600),
            gpus: None,
        },
        service: None,
        mounts: BTreeMap::new(),
        volume_sizes: BTreeMap::new(),
        tenant: Some("genomics".into()),
        shape: None,
        report_to: None,
        slurm: None,
    }
}

fn golden<T: Serialize + DeserializeOwned>(case: &str, object: &T) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{case}.json"));
    let produced = serde_json::to_string_pretty(object).unwrap() + "\n";
    if std::env::var_os("MERIDIAN_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &produced).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with MERIDIAN_UPDATE_GOLDEN=1", path.display()));
    assert_eq!(
        produced,
        expected,
        "{case}: the manifest changed; if that is meant, run with MERIDIAN_UPDATE_GOLDEN=1 \
         and review the diff of {}",
        path.display()
    );
    // Strict decoding: what the golden file says must survive a trip through the API's
    // own types, so it has no field Kubernetes would drop or refuse.
    let value: serde_json::Value = serde_json::from_str(&expected).unwrap();
    let decoded: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{case}: not a valid object: {e}"));
    assert_eq!(
        serde_json::to_value(&decoded).unwrap(),
        value,
        "{case}: a field of the golden file is not in the Kubernetes API"
    );
}

#[test]
fn a_plain_job() {
    let mut job = request("align", &["align", "--sample", "$SAMPLE", "--threads=4"]);
    job.image = None;
    job.cwd = Some("/work".into());
    let manifest = manifest::job(&config(), &job, None).unwrap();
    golden("job", &manifest);
}

#[test]
fn a_job_admitted_by_kueue() {
    let mut c = config();
    c.kueue_queue = Some("research-queue".into());
    let manifest = manifest::job(&c, &request("align", &["align"]), None).unwrap();
    golden("job-kueue", &manifest);
}

#[test]
fn an_array_with_a_cap() {
    let mut template = request("shard", &["process", "--shard", "${ARRAY_INDEX}"]);
    template.array_index = Some(4);
    let tasks = (4..7)
        .map(|index| ArrayTask {
            index,
            job_id: Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_1000 + index as u128),
        })
        .collect();
    let array = ArrayRequest {
        batch_id: BATCH,
        template,
        tasks,
        cap: 2,
    };
    let manifest = manifest::array_job(&config(), &array, None).unwrap();
    golden("array", &manifest);
}

#[test]
fn an_nvidia_h100_job_on_coreweave() {
    let mut c = config();
    c.profile = Profile::Coreweave;
    let mut job = request("train", &["python", "train.py"]);
    job.resources.gpus = Some(Gpus {
        count: 8,
        vendor: "nvidia".into(),
        model: Some("H100".into()),
    });
    let placed = gpu::place(job.resources.gpus.as_ref().unwrap(), &c, &[]).unwrap();
    let manifest = manifest::job(&c, &job, Some(&placed)).unwrap();
    golden("coreweave-h100", &manifest);
}

#[test]
fn an_amd_mi300x_job() {
    let c = config();
    let nodes = [NodeGpus {
        labels: BTreeMap::from([(
            "amd.com/gpu.product-name".into(),
            "AMD_Instinct_MI300X_OAM".into(),
        )]),
        nvidia: 0,
        amd: 8,
    }];
    let mut job = request("train", &["python", "train.py"]);
    job.image = Some("docker://docker.io/rocm/pytorch:latest".into());
    job.resources.gpus = Some(Gpus {
        count: 2,
        vendor: "any".into(),
        model: Some("MI300X".into()),
    });
    let placed = gpu::place(job.resources.gpus.as_ref().unwrap(), &c, &nodes).unwrap();
    let manifest = manifest::job(&c, &job, Some(&placed)).unwrap();
    golden("amd-mi300x", &manifest);
}

#[test]
fn a_service() {
    let mut job = request("api", &["serve", "--port", "8080"]);
    job.service = Some(ServiceRequest {
        port: 8080,
        min_replicas: 2,
        max_replicas: 4,
        max_restarts: 3,
    });
    let (deployment, service): (Deployment, Service) =
        manifest::service(&config(), &job, None).unwrap();
    golden("service-deployment", &deployment);
    golden("service-service", &service);
}

#[test]
fn volumes_become_claims_mounted_where_the_job_says() {
    let mut job = request("align", &["align", "--out", "/results"]);
    job.mounts = BTreeMap::from([
        ("reference".into(), "/ref".into()),
        ("results".into(), "/results".into()),
    ]);
    job.volume_sizes = BTreeMap::from([
        ("reference".into(), 100 << 30),
        ("results".into(), 500 << 30),
    ]);
    let claims: Vec<PersistentVolumeClaim> = manifest::claims(&config(), &job).unwrap();
    assert_eq!(claims.len(), 2);
    golden("volume-claim", &claims[0]);
    let manifest: Job = manifest::job(&config(), &job, None).unwrap();
    golden("job-with-volumes", &manifest);
}

#[test]
fn what_no_cluster_can_run_is_refused_with_its_reason() {
    let mut job = request("mpi", &["mpirun", "x"]);
    job.resources.nodes = 4;
    let err = manifest::job(&config(), &job, None).unwrap_err();
    assert!(err.contains("one node"), "{err}");
    let mut job = request("data", &["cat"]);
    job.mounts = BTreeMap::from([("scratch".into(), "/scratch".into())]);
    let err = manifest::claims(&config(), &job).unwrap_err();
    assert!(err.contains("volume scratch has no declared size"), "{err}");
}
