//! Contract tests: the real kube-rs client in the adapter against a **stand-in** API
//! server (`meridian-kube-standin`), because no Kubernetes API server can run on these
//! machines. The stand-in serves the documented `batch/v1`, `apps/v1` and `core/v1`
//! shapes with state, resource versions and watches, moves Jobs through their pods'
//! phases as the Kubernetes docs describe, and runs each pod's command as a local
//! process. The adapter passes the whole conformance kit against it, then the
//! Kubernetes-specific checks below.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use meridian_adapter_core::conformance::{wait_final, wait_running, ConformanceOptions, Harness};
use meridian_adapter_core::{
    AdapterError, ArrayRequest, ArrayTask, FailureReason, Gpus, JobState, ServiceRequest,
    SiteAdapter,
};
use meridian_adapter_kubernetes::{KubernetesAdapter, KubernetesConfig, LogStreams};
use meridian_kube_standin::{Node, Options, StandIn};
use tokio::time::Instant;
use uuid::Uuid;

/// A stand-in cluster and what the adapter needs to reach it.
struct Cluster {
    standin: StandIn,
    kubeconfig: PathBuf,
    scratch: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(tune: impl FnOnce(&mut Options)) -> Arc<Cluster> {
        let dir = tempfile::tempdir().unwrap();
        let mut options = Options::new(dir.path().join("standin"));
        tune(&mut options);
        let standin = StandIn::start(options).await.expect("start the stand-in");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, standin.kubeconfig("meridian")).unwrap();
        let scratch = dir.path().join("scratch");
        std::fs::create_dir(&scratch).unwrap();
        Arc::new(Cluster {
            standin,
            kubeconfig,
            scratch,
            _dir: dir,
        })
    }

    fn config(&self) -> KubernetesConfig {
        let mut config = KubernetesConfig::new("meridian");
        config.kubeconfig = Some(self.kubeconfig.clone());
        config.log_streams = LogStreams::Split;
        config.resync_seconds = 30;
        config
    }

    fn adapter(&self) -> KubernetesAdapter {
        KubernetesAdapter::new(self.config()).expect("adapter")
    }

    fn options(&self) -> ConformanceOptions {
        let mut options = ConformanceOptions::new(&self.scratch);
        options.image = Some("docker.io/library/busybox:1.37".into());
        options
    }

    async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// The live objects of `resource` whose name is `name`.
    fn named(&self, resource: &str, name: &str) -> usize {
        self.standin
            .objects(resource)
            .iter()
            .filter(|o| o["metadata"]["name"] == name)
            .count()
    }
}

async fn harness() -> Harness {
    let cluster = Cluster::start(|_| {}).await;
    let options = cluster.options();
    Harness {
        open: Arc::new(move || {
            let cluster = cluster.clone();
            Box::pin(async move { Arc::new(cluster.adapter()) as Arc<dyn SiteAdapter> })
        }),
        options,
    }
}

/// The conformance kit, against the stand-in.
mod contract_standin {
    use super::*;
    meridian_adapter_core::conformance_suite!(harness().await);
}

async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod_of_job(cluster: &Cluster, job: &str) -> Option<serde_json::Value> {
    cluster
        .standin
        .objects("pods")
        .into_iter()
        .find(|p| p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_an_evicted_pod_is_a_site_fault_and_its_own_exit_is_not() {
    let cluster = Cluster::start(|_| {}).await;
    let adapter = cluster.adapter();
    let o = cluster.options();
    let job = o.job("evicted", &["sh", "-c", "sleep 300"]);
    let id = adapter.submit(&job).await.unwrap();
    wait_running(&adapter, &id, &o).await;
    let name = format!("meridian-{}", job.job_id);
    let pod = pod_of_job(&cluster, &name).expect("its pod");
    let pods: Api<Pod> = Api::namespaced(cluster.client().await, "meridian");
    pods.evict(
        pod["metadata"]["name"].as_str().unwrap(),
        &EvictParams::default(),
    )
    .await
    .expect("evict");
    let report = wait_final(&adapter, &id, &o).await;
    match &report.state {
        JobState::Failed { failure, .. } => {
            assert_eq!(failure, &FailureReason::Preempted, "{report:?}");
            assert!(failure.is_site_fault());
        }
        other => panic!("an evicted job should fail as preempted, got {other:?}"),
    }
    let job = o.job("exits", &["sh", "-c", "exit 7"]);
    let id = adapter.submit(&job).await.unwrap();
    match wait_final(&adapter, &id, &o).await.state {
        JobState::Failed { failure, .. } => {
            assert_eq!(failure, FailureReason::ExitCode { code: 7 });
            assert!(!failure.is_site_fault());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_cancel_deletes_the_job_and_a_finished_job_goes_after_its_ttl() {
    let cluster = Cluster::start(|_| {}).await;
    let mut config = cluster.config();
    config.ttl_seconds_after_finished = 1;
    let adapter = KubernetesAdapter::new(config).unwrap();
    let o = cluster.options();
    let long = o.job("long", &["sh", "-c", "sleep 300"]);
    let id = adapter.submit(&long).await.unwrap();
    wait_running(&adapter, &id, &o).await;
    adapter.cancel(&id).await.unwrap();
    let name = format!("meridian-{}", long.job_id);
    eventually("the cancelled Job and its pod are deleted", || {
        (cluster.named("jobs", &name) == 0 && pod_of_job(&cluster, &name).is_none()).then_some(())
    })
    .await;
    assert!(matches!(
        adapter.status(&id).await.unwrap().state,
        JobState::Cancelled { .. }
    ));

    let short = o.job("short", &["true"]);
    let id = adapter.submit(&short).await.unwrap();
    let report = wait_final(&adapter, &id, &o).await;
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    let name = format!("meridian-{}", short.job_id);
    eventually(
        "the finished Job is deleted after ttlSecondsAfterFinished",
        || (cluster.named("jobs", &name) == 0).then_some(()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_gpu_job_of_vendor_any_lands_on_a_node_with_that_model() {
    let cluster = Cluster::start(|options| {
        options.nodes.push(Node {
            name: "gpu-node".into(),
            cpus: 16,
            memory_bytes: 64 << 30,
            labels: BTreeMap::from([(
                "nvidia.com/gpu.product".into(),
                "NVIDIA-H100-80GB-HBM3".into(),
            )]),
            extended: BTreeMap::from([("nvidia.com/gpu".into(), 4)]),
        });
    })
    .await;
    let adapter = cluster.adapter();
    let o = cluster.options();
    let mut job = o.job("train", &["true"]);
    job.resources.gpus = Some(Gpus {
        count: 2,
        vendor: "any".into(),
        model: Some("H100".into()),
    });
    let id = adapter.submit(&job).await.unwrap();
    let report = wait_final(&adapter, &id, &o).await;
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    assert_eq!(report.usage.gpus, 2);
    assert_eq!(report.usage.gpu_vendor.as_deref(), Some("nvidia"));
    assert_eq!(report.usage.gpu_model.as_deref(), Some("H100"));
    let pod = pod_of_job(&cluster, &format!("meridian-{}", job.job_id)).unwrap();
    assert_eq!(pod["spec"]["nodeName"], "gpu-node");

    // No MI300X here: the site says so rather than queueing work it can never start.
    job.job_id = Uuid::now_v7();
    job.resources.gpus = Some(Gpus {
        count: 1,
        vendor: "amd".into(),
        model: Some("MI300X".into()),
    });
    match adapter.submit(&job).await {
        Err(AdapterError::Refused(why)) => assert!(why.contains("MI300X"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_service_answers_at_its_service_address_until_cancelled() {
    let cluster = Cluster::start(|_| {}).await;
    let adapter = cluster.adapter();
    let o = cluster.options();
    let port = free_port();
    let mut job = o.job(
        "web",
        &[
            "python3",
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ],
    );
    job.service = Some(ServiceRequest {
        port,
        min_replicas: 1,
        max_replicas: 1,
        max_restarts: 3,
    });
    let id = adapter.submit(&job).await.unwrap();
    let name = format!("meridian-{}", job.job_id);
    let address = {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let report = adapter.status(&id).await.unwrap();
            if let Some(address) = report.address.clone() {
                assert!(
                    matches!(report.state, JobState::Running { .. }),
                    "{report:?}"
                );
                break address;
            }
            assert!(Instant::now() < deadline, "never ready: {report:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    assert_eq!(address, format!("{name}.meridian.svc:{port}"));
    assert_eq!(cluster.named("services", &name), 1);
    adapter.cancel(&id).await.unwrap();
    eventually(
        "the Deployment, its Service and its pods are deleted",
        || {
            (cluster.named("deployments", &name) == 0 && cluster.named("services", &name) == 0)
                .then_some(())
        },
    )
    .await;
    assert!(matches!(
        adapter.status(&id).await.unwrap().state,
        JobState::Cancelled { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_service_that_keeps_crashing_fails_with_its_exit_code() {
    let cluster = Cluster::start(|_| {}).await;
    let adapter = cluster.adapter();
    let o = cluster.options();
    let mut job = o.job("crashing", &["sh", "-c", "exit 4"]);
    job.service = Some(ServiceRequest {
        port: free_port(),
        min_replicas: 1,
        max_replicas: 1,
        max_restarts: 1,
    });
    let id = adapter.submit(&job).await.unwrap();
    let report = meridian_adapter_core::conformance::wait_for(
        &adapter,
        &id,
        &o,
        Duration::from_secs(60),
        "failed",
        JobState::is_terminal,
    )
    .await;
    match report.state {
        JobState::Failed { failure, .. } => {
            assert_eq!(failure, FailureReason::ExitCode { code: 4 })
        }
        other => panic!("{other:?}"),
    }
    // Kubernetes would keep restarting it: the leak sweep's cancel takes it away.
    let name = format!("meridian-{}", job.job_id);
    assert_eq!(cluster.named("deployments", &name), 1);
    adapter.cancel(&id).await.unwrap();
    eventually(
        "the failed service's Deployment and Service are deleted",
        || {
            (cluster.named("deployments", &name) == 0 && cluster.named("services", &name) == 0)
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_waiting_for_a_node_does_not_count_against_the_walltime() {
    let cluster = Cluster::start(|_| {}).await;
    let adapter = cluster.adapter();
    let o = cluster.options();
    // No node here has a GPU: the pod waits unscheduled, past its 1 s walltime.
    let mut job = o.job("waits", &["true"]);
    job.resources.walltime = Duration::from_secs(1);
    job.resources.gpus = Some(Gpus {
        count: 1,
        vendor: "nvidia".into(),
        model: None,
    });
    let id = adapter.submit(&job).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = adapter.status(&id).await.unwrap();
    assert_eq!(report.state, JobState::Pending, "{report:?}");
    // And it says why.
    let waiting = report.waiting.unwrap_or_default();
    assert!(
        waiting.starts_with("Unschedulable: ") && waiting.contains("nvidia.com/gpu"),
        "{waiting}"
    );
    let pod = pod_of_job(&cluster, &format!("meridian-{}", job.job_id)).unwrap();
    assert_eq!(
        pod["status"]["conditions"][0]["reason"], "Unschedulable",
        "{pod:#}"
    );
    adapter.cancel(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_volumes_are_claims_of_the_declared_size_and_class() {
    let cluster = Cluster::start(|_| {}).await;
    let mut config = cluster.config();
    config.storage_class = Some("fast".into());
    let adapter = KubernetesAdapter::new(config).unwrap();
    let o = cluster.options();
    let mut job = o.job("writes", &["true"]);
    job.mounts = BTreeMap::from([("results".into(), "/results".into())]);
    job.volume_sizes = BTreeMap::from([("results".into(), 10 << 30)]);
    let id = adapter.submit(&job).await.unwrap();
    let report = wait_final(&adapter, &id, &o).await;
    assert!(
        matches!(report.state, JobState::Succeeded { .. }),
        "{report:?}"
    );
    let claims = cluster.standin.objects("persistentvolumeclaims");
    assert_eq!(claims.len(), 1, "{claims:?}");
    let claim = &claims[0];
    assert_eq!(
        claim["metadata"]["name"],
        format!("meridian-{}-results", job.workflow_id)
    );
    assert_eq!(claim["spec"]["storageClassName"], "fast");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "10Gi");
    // A second job of the same workflow mounts the same claim.
    let mut second = o.job("reads", &["true"]);
    second.workflow_id = job.workflow_id;
    second.mounts = job.mounts.clone();
    second.volume_sizes = job.volume_sizes.clone();
    let id = adapter.submit(&second).await.unwrap();
    wait_final(&adapter, &id, &o).await;
    assert_eq!(cluster.standin.created("persistentvolumeclaims"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_cancelling_every_task_of_an_array_deletes_its_job() {
    let cluster = Cluster::start(|_| {}).await;
    let adapter = cluster.adapter();
    let o = cluster.options();
    let template = o.job("shards", &["sh", "-c", "sleep 300"]);
    let array = ArrayRequest {
        batch_id: Uuid::now_v7(),
        tasks: (0..4)
            .map(|index| ArrayTask {
                index,
                job_id: Uuid::now_v7(),
            })
            .collect(),
        template,
        cap: 2,
    };
    let ids = adapter.submit_array(&array).await.unwrap();
    wait_running(&adapter, &ids[0], &o).await;
    // Two run, two wait under the cap; a task cancelled while waiting never starts.
    for id in &ids {
        adapter.cancel(id).await.unwrap();
    }
    let name = format!("meridian-{}", array.batch_id);
    eventually(
        "the Indexed Job is deleted once every task is cancelled",
        || (cluster.named("jobs", &name) == 0).then_some(()),
    )
    .await;
    for id in &ids {
        let report = adapter.status(id).await.unwrap();
        assert!(
            matches!(report.state, JobState::Cancelled { .. }),
            "{report:?}"
        );
    }
    assert_eq!(adapter.owned().await.unwrap(), Vec::<Uuid>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_capacity_is_allocatable_less_what_runs() {
    let cluster = Cluster::start(|_| {}).await;
    let adapter = cluster.adapter();
    let o = cluster.options();
    let before = adapter.capacity().await.unwrap();
    assert!(before.healthy, "{before:?}");
    assert_eq!(before.total_cpus, 8);
    assert_eq!(before.free_cpus, 8);
    let mut job = o.job("busy", &["sh", "-c", "sleep 300"]);
    job.resources.cpus = 3;
    let id = adapter.submit(&job).await.unwrap();
    wait_running(&adapter, &id, &o).await;
    let during = adapter.capacity().await.unwrap();
    assert_eq!(during.free_cpus, 5, "{during:?}");
    assert_eq!(
        during.free_memory_bytes,
        before.free_memory_bytes - (64 << 20)
    );
    assert_eq!(adapter.owned().await.unwrap(), vec![job.job_id]);
    adapter.cancel(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_following_a_large_array_costs_no_more_calls_than_one_job() {
    let cluster = Cluster::start(|_| {}).await;
    let adapter = cluster.adapter();
    let o = cluster.options();
    let array = ArrayRequest {
        batch_id: Uuid::now_v7(),
        template: o.job("many", &["true"]),
        tasks: (0..200)
            .map(|index| ArrayTask {
                index,
                job_id: Uuid::now_v7(),
            })
            .collect(),
        cap: 20,
    };
    let ids = adapter.submit_array(&array).await.unwrap();
    // Once the watch has brought the Job, status of every task reads the caches.
    let deadline = Instant::now() + Duration::from_secs(30);
    while adapter.status_all(&ids).await.iter().any(|r| r.is_err()) {
        assert!(Instant::now() < deadline, "the watch never brought the Job");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let calls_before = cluster.standin.requests();
    for _ in 0..5 {
        let reports = adapter.status_all(&ids).await;
        assert_eq!(reports.len(), 200);
        assert!(
            reports.iter().all(|r| r.is_ok()),
            "{:?}",
            reports.iter().find(|r| r.is_err())
        );
    }
    assert_eq!(
        cluster.standin.requests(),
        calls_before,
        "status of 1,000 task reports went to the API instead of the watch caches"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_bad_configuration_is_named_and_the_site_shows_unhealthy() {
    let cluster = Cluster::start(|options| {
        options.forbidden_namespaces.push("locked".into());
        options.nodes.push(Node {
            name: "unlabelled-gpus".into(),
            cpus: 8,
            memory_bytes: 32 << 30,
            labels: BTreeMap::new(),
            extended: BTreeMap::from([("nvidia.com/gpu".into(), 2)]),
        });
    })
    .await;
    // No such context: refused before anything is contacted, naming the field.
    let mut config = cluster.config();
    config.context = Some("production".into());
    let err = KubernetesAdapter::new(config).unwrap_err().to_string();
    assert!(
        err.starts_with("context: no context \"production\""),
        "{err}"
    );
    assert!(err.contains("standin"), "{err}");

    // A namespace the credentials may not use.
    let mut config = cluster.config();
    config.namespace = "locked".into();
    let adapter = KubernetesAdapter::new(config).unwrap();
    let capacity = adapter.capacity().await.unwrap();
    assert!(!capacity.healthy);
    let message = capacity.message.unwrap();
    assert!(message.contains("namespace \"locked\""), "{message}");
    assert!(message.contains("forbidden"), "{message}");

    // GPUs that no configured label names.
    let adapter = cluster.adapter();
    let capacity = adapter.capacity().await.unwrap();
    assert!(!capacity.healthy);
    let message = capacity.message.unwrap();
    assert!(message.starts_with("gpu_labels.nvidia:"), "{message}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
