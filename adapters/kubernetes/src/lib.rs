//! The Kubernetes site, and CoreWeave as a profile of it: a job becomes a `batch/v1` Job,
//! an array one Indexed Job, a service a Deployment with a ClusterIP Service, and a
//! workflow volume a PersistentVolumeClaim ([`manifest`]). The adapter follows what it
//! created through watches (kube-runtime's reflectors, listed again every
//! `resync_seconds`), so following a 1,000-task array costs no more API calls than one
//! job; status, find and the leak sweep read those caches.
//!
//! Everything it creates has a deterministic name (`meridian-<job or batch id>`) and
//! Meridian's ids as labels: a restarted adapter finds it, and a second create of the
//! same job is answered `AlreadyExists` by the cluster. `docs/site-kubernetes.md` has the
//! configuration, the mapping and the RBAC the adapter needs.

pub mod config;
pub mod gpu;
pub mod manifest;
pub mod quantity;
pub mod state;
mod watch;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use meridian_adapter_core::{
    AdapterError, ArrayRequest, BackendJobId, Capacity, JobReport, JobRequest, JobState, Logs,
    SiteAdapter, Usage,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::OnceCell;
use uuid::Uuid;

pub use config::{KubernetesConfig, LogStreams, Profile};
use manifest::{Requested, TaskEntry};

/// The Kubernetes kind in the adapter registry.
pub const REGISTRATION: meridian_adapter_core::Registration = meridian_adapter_core::Registration {
    kind: "kubernetes",
    about: "a Kubernetes cluster, or CoreWeave with profile: coreweave (Jobs, Deployments, PVCs)",
    needs_config: true,
    build: |text, _| {
        let config: KubernetesConfig = meridian_adapter_core::registry::parse_config(text)?;
        Ok(Arc::new(KubernetesAdapter::new(config)?))
    },
};

/// The most of each of stdout and stderr that [`SiteAdapter::logs`] returns: the last
/// 1 MiB, as on the other sites.
pub const LOG_CAP_BYTES: usize = 1 << 20;

/// The most tasks of one array submitted as one Indexed Job: its task table stays far
/// below the API's object size limit.
pub const MAX_ARRAY_TASKS: u32 = 1000;

/// Which of Meridian's runs a backend id names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A Job of one pod.
    Job(String),
    /// The task with this completion index of an Indexed Job.
    Task(String, u32),
    /// A Deployment and its Service.
    Service(String),
}

impl Target {
    fn parse(id: &BackendJobId) -> Option<Target> {
        let mut parts = id.0.split('/');
        let target = match (parts.next()?, parts.next()?, parts.next()) {
            ("job", name, None) => Target::Job(name.into()),
            ("job", name, Some(index)) => Target::Task(name.into(), index.parse().ok()?),
            ("deployment", name, None) => Target::Service(name.into()),
            _ => return None,
        };
        parts.next().is_none().then_some(target)
    }

    /// The name of the object the run is (part of).
    fn object(&self) -> &str {
        match self {
            Target::Job(name) | Target::Task(name, _) | Target::Service(name) => name,
        }
    }

    fn id(&self) -> BackendJobId {
        BackendJobId(match self {
            Target::Job(name) => format!("job/{name}"),
            Target::Task(name, index) => format!("job/{name}/{index}"),
            Target::Service(name) => format!("deployment/{name}"),
        })
    }
}

/// What this adapter remembers of a run it cancelled: its object may be gone.
#[derive(Debug, Clone, Copy)]
struct Cancelled {
    started_at: Option<DateTime<Utc>>,
    at: DateTime<Utc>,
}

/// A Kubernetes site. Cheap to create: the cluster is contacted on the first call.
pub struct KubernetesAdapter {
    config: Arc<KubernetesConfig>,
    live: OnceCell<Live>,
    cancelled: Arc<Mutex<HashMap<String, Cancelled>>>,
    /// The last word on the tasks of an Indexed Job this adapter deleted once every task
    /// had ended or been cancelled, for the runner to read after the Job is gone.
    settled: Mutex<HashMap<String, JobReport>>,
}

impl std::fmt::Debug for KubernetesAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesAdapter")
            .field("namespace", &self.config.namespace)
            .finish()
    }
}

/// The connection and the caches the watches keep.
struct Live {
    client: Client,
    jobs: Api<Job>,
    pods: Api<Pod>,
    deployments: Api<Deployment>,
    services: Api<Service>,
    claims: Api<PersistentVolumeClaim>,
    watches: watch::Watches,
}

impl KubernetesAdapter {
    /// Checks `config` (and that its kubeconfig has the context it names) without
    /// contacting the cluster.
    pub fn new(config: KubernetesConfig) -> Result<Self, meridian_adapter_core::BuildError> {
        use meridian_adapter_core::BuildError;
        config.check().map_err(BuildError::Config)?;
        if !config.in_cluster {
            let kubeconfig = read_kubeconfig(&config).map_err(BuildError::Config)?;
            if let Some(context) = &config.context {
                if !kubeconfig.contexts.iter().any(|c| &c.name == context) {
                    let names: Vec<&str> = kubeconfig
                        .contexts
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect();
                    return Err(BuildError::Config(format!(
                        "context: no context {context:?} in the kubeconfig (it has: {})",
                        if names.is_empty() {
                            "none".into()
                        } else {
                            names.join(", ")
                        }
                    )));
                }
            } else if kubeconfig.current_context.is_none() {
                return Err(BuildError::Config(
                    "context: the kubeconfig has no current-context; name one".into(),
                ));
            }
        }
        Ok(KubernetesAdapter {
            config: Arc::new(config),
            live: OnceCell::new(),
            cancelled: Arc::default(),
            settled: Mutex::default(),
        })
    }

    pub fn config(&self) -> &KubernetesConfig {
        &self.config
    }

    async fn live(&self) -> Result<&Live, AdapterError> {
        self.live
            .get_or_try_init(|| async {
                let client = connect(&self.config).await?;
                let ns = self.config.namespace.as_str();
                let resync = Duration::from_secs(self.config.resync_seconds);
                Ok::<_, AdapterError>(Live {
                    jobs: Api::namespaced(client.clone(), ns),
                    pods: Api::namespaced(client.clone(), ns),
                    deployments: Api::namespaced(client.clone(), ns),
                    services: Api::namespaced(client.clone(), ns),
                    claims: Api::namespaced(client.clone(), ns),
                    watches: watch::Watches::start(&client, ns, resync, self.cancelled.clone()),
                    client,
                })
            })
            .await
    }

    /// The live connection, once its caches hold the cluster's state.
    async fn synced(&self) -> Result<&Live, AdapterError> {
        let live = self.live().await?;
        live.watches.ready().await?;
        Ok(live)
    }

    /// What the nodes offer in GPUs, for placing a GPU job.
    async fn node_gpus(&self, live: &Live) -> Result<Vec<gpu::NodeGpus>, AdapterError> {
        let nodes: Api<Node> = Api::all(live.client.clone());
        let list = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("listing nodes", e))?;
        Ok(list.items.iter().map(node_gpus).collect())
    }

    async fn placement(
        &self,
        live: &Live,
        job: &JobRequest,
    ) -> Result<Option<gpu::GpuPlacement>, AdapterError> {
        let Some(gpus) = job.resources.gpus.as_ref().filter(|g| g.count > 0) else {
            return Ok(None);
        };
        let nodes = self.node_gpus(live).await?;
        gpu::place(gpus, &self.config, &nodes)
            .map(Some)
            .map_err(AdapterError::Refused)
    }

    async fn create_claims(&self, live: &Live, job: &JobRequest) -> Result<(), AdapterError> {
        for claim in manifest::claims(&self.config, job).map_err(AdapterError::Rejected)? {
            create(&live.claims, &claim).await?;
        }
        Ok(())
    }

    fn report(&self, live: &Live, target: &Target) -> Result<JobReport, AdapterError> {
        let now = Utc::now();
        let id = target.id();
        let ns = &self.config.namespace;
        let key = match target {
            Target::Task(name, index) => format!("{name}/{index}"),
            Target::Job(name) | Target::Service(name) => name.clone(),
        };
        let cancelled = self
            .cancelled
            .lock()
            .expect("cancel map")
            .get(&key)
            .copied();
        let (state, requested, address, cancelled, waiting) = match target {
            Target::Job(name) | Target::Task(name, _) => {
                let Some(job) = live.watches.jobs.get(&ObjectRef::new(name).within(ns)) else {
                    if let Some(report) = self.settled.lock().expect("settled").get(&key) {
                        return Ok(report.clone());
                    }
                    return match cancelled {
                        Some(c) => Ok(cancelled_report(id, c)),
                        None => Err(AdapterError::UnknownJob(id.0)),
                    };
                };
                let index = match target {
                    Target::Task(_, index) => Some(*index),
                    _ => None,
                };
                let pods = live.watches.pods_of(name, index);
                let pods: Vec<&Pod> = pods.iter().map(Arc::as_ref).collect();
                let state = match index {
                    Some(index) => state::task_state(&job, index, &pods, now),
                    None => state::job_state(&job, &pods, now),
                };
                let waiting = state::waiting_reason(Some(&job), &pods);
                // A task cancelled by an earlier run of this adapter is marked on its Job.
                let marked = index.and_then(|i| watch::cancelled_tasks(&job).get(&i).copied());
                let cancelled = cancelled.or(marked.map(|at| Cancelled {
                    started_at: None,
                    at,
                }));
                (state, requested_of(&*job), None, cancelled, waiting)
            }
            Target::Service(name) => {
                let Some(deployment) = live
                    .watches
                    .deployments
                    .get(&ObjectRef::new(name).within(ns))
                else {
                    return match cancelled {
                        Some(c) => Ok(cancelled_report(id, c)),
                        None => Err(AdapterError::UnknownJob(id.0)),
                    };
                };
                let pods = live.watches.service_pods(name);
                let pods: Vec<&Pod> = pods.iter().map(Arc::as_ref).collect();
                let max_restarts = deployment
                    .annotations()
                    .get(manifest::MAX_RESTARTS)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(meridian_adapter_core::DEFAULT_MAX_RESTARTS);
                let (state, ready) = state::service_state(&deployment, &pods, max_restarts, now);
                let address = ready.then(|| service_address(&deployment, ns)).flatten();
                let waiting = state::waiting_reason(None, &pods);
                (
                    state,
                    requested_of(&*deployment),
                    address,
                    cancelled,
                    waiting,
                )
            }
        };
        let state = match (cancelled, state) {
            (_, done) if done.is_terminal() && cancelled.is_none() => done,
            (Some(c), state) => {
                let started_at = match &state {
                    JobState::Running { started_at } => Some(*started_at),
                    JobState::Succeeded { started_at, .. } => Some(*started_at),
                    JobState::Failed { started_at, .. } => *started_at,
                    _ => None,
                };
                JobState::Cancelled {
                    started_at: c.started_at.or(started_at),
                    ended_at: c.at,
                }
            }
            (None, state) => state,
        };
        Ok(JobReport {
            backend_id: id,
            usage: usage_of(&requested),
            waiting: waiting.filter(|_| matches!(state, JobState::Pending)),
            state,
            address,
            host: None,
        })
    }

    /// Where `job_id` runs, from the caches.
    fn locate(&self, live: &Live, job_id: Uuid) -> Option<Target> {
        let id = job_id.to_string();
        for job in live.watches.jobs.state() {
            if job.labels().get(manifest::JOB_ID) == Some(&id) {
                return Some(Target::Job(job.name_any()));
            }
            if let Some(tasks) = tasks_of(&job) {
                if let Some(n) = tasks.iter().position(|t| t.job_id == job_id) {
                    return Some(Target::Task(job.name_any(), n as u32));
                }
            }
        }
        live.watches
            .deployments
            .state()
            .iter()
            .find(|d| d.labels().get(manifest::JOB_ID) == Some(&id))
            .map(|d| Target::Service(d.name_any()))
    }

    async fn cancel_target(&self, live: &Live, target: &Target) -> Result<(), AdapterError> {
        // A run this adapter cancelled reports cancelled even once its object is gone.
        let report = self.report(live, target)?;
        let started_at = match report.state {
            JobState::Running { started_at } => Some(started_at),
            JobState::Cancelled { .. } => return Ok(()),
            ref done if done.is_terminal() => {
                // Ended for Meridian, perhaps not for Kubernetes: a service that kept
                // crashing still holds its Deployment, a pod whose image cannot be
                // pulled its Job. The leak sweep's cancel takes them away.
                return self.delete_leftover(live, target, done).await;
            }
            _ => None,
        };
        let at = Utc::now();
        let entry = Cancelled { started_at, at };
        let delete = DeleteParams::background();
        match target {
            Target::Job(name) => {
                self.remember(name.clone(), entry);
                gone_ok(live.jobs.delete(name, &delete).await, "deleting the Job")?;
            }
            Target::Service(name) => {
                self.remember(name.clone(), entry);
                delete_service(live, name).await?;
            }
            Target::Task(name, index) => {
                self.remember(format!("{name}/{index}"), entry);
                watch::mark_cancelled(&live.jobs, name, *index).await?;
                // The task's pod, if it has one; one that starts later is stopped by the
                // watch (it sees the mark on the Job).
                for pod in live.watches.pods_of(name, Some(*index)) {
                    gone_ok(
                        live.pods.delete(&pod.name_any(), &delete).await,
                        "deleting a task's pod",
                    )?;
                }
                if let Some(job) = live
                    .watches
                    .jobs
                    .get(&ObjectRef::new(name).within(&self.config.namespace))
                {
                    let settled =
                        watch::all_tasks_settled(&job, &self.cancelled.lock().expect("cancel map"));
                    if settled {
                        // Keep what the other tasks ended as: the runner may not have read
                        // it yet, and it must not take them for lost.
                        let count = tasks_of(&job).map_or(0, |t| t.len() as u32);
                        for n in 0..count {
                            let task = Target::Task(name.clone(), n);
                            if let Ok(report) = self.report(live, &task) {
                                self.settled
                                    .lock()
                                    .expect("settled")
                                    .insert(format!("{name}/{n}"), report);
                            }
                        }
                        gone_ok(live.jobs.delete(name, &delete).await, "deleting the Job")?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Deletes what still runs at the site for a run Meridian counts as ended.
    async fn delete_leftover(
        &self,
        live: &Live,
        target: &Target,
        state: &JobState,
    ) -> Result<(), AdapterError> {
        match target {
            Target::Service(name) => delete_service(live, name).await,
            // Only a pod whose image the registry refused waits on forever; any other
            // ended run's Job ends too (the controller may say so a moment later) and goes
            // after its TTL, keeping its state readable meanwhile.
            Target::Job(name)
                if matches!(
                    state,
                    JobState::Failed {
                        failure: meridian_adapter_core::FailureReason::ImageUnavailable { .. },
                        ..
                    }
                ) =>
            {
                gone_ok(
                    live.jobs.delete(name, &DeleteParams::background()).await,
                    "deleting the Job",
                )
            }
            Target::Job(_) | Target::Task(..) => Ok(()),
        }
    }

    fn remember(&self, key: String, entry: Cancelled) {
        self.cancelled
            .lock()
            .expect("cancel map")
            .entry(key)
            .or_insert(entry);
    }

    async fn pod_log(
        &self,
        live: &Live,
        pod: &str,
        stream: Option<&str>,
    ) -> Result<String, AdapterError> {
        let mut path = format!(
            "/api/v1/namespaces/{}/pods/{pod}/log?container={}",
            self.config.namespace,
            manifest::CONTAINER
        );
        if let Some(stream) = stream {
            path.push_str(&format!("&stream={stream}"));
        }
        let request = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| AdapterError::Unavailable(e.to_string()))?;
        match live.client.request_text(request).await {
            Ok(text) => Ok(tail(text)),
            // A pod whose container never started has no log yet.
            Err(kube::Error::Api(status)) if status.code == 400 || status.code == 404 => {
                Ok(String::new())
            }
            Err(e) => Err(api_error("reading a pod's log", e)),
        }
    }
}

/// Deletes a service's Deployment (and so its pods) and its Service.
async fn delete_service(live: &Live, name: &str) -> Result<(), AdapterError> {
    let delete = DeleteParams::background();
    gone_ok(
        live.deployments.delete(name, &delete).await,
        "deleting the Deployment",
    )?;
    gone_ok(
        live.services.delete(name, &delete).await,
        "deleting the Service",
    )
}

fn tail(mut text: String) -> String {
    if text.len() > LOG_CAP_BYTES {
        let mut cut = text.len() - LOG_CAP_BYTES;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        text.drain(..cut);
    }
    text
}

fn cancelled_report(id: BackendJobId, c: Cancelled) -> JobReport {
    JobReport {
        backend_id: id,
        state: JobState::Cancelled {
            started_at: c.started_at,
            ended_at: c.at,
        },
        usage: Usage::default(),
        address: None,
        host: None,
        waiting: None,
    }
}

fn requested_of<K: Resource>(object: &K) -> Requested {
    object
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(manifest::REQUESTED))
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

fn usage_of(requested: &Requested) -> Usage {
    Usage {
        nodes: 1,
        cpus: requested.cpus,
        memory_bytes: requested.memory_bytes,
        gpus: requested.gpus,
        gpu_vendor: requested.gpu_vendor.clone(),
        gpu_model: requested.gpu_model.clone(),
        ..Usage::default()
    }
}

/// An Indexed Job's tasks, from its annotation.
fn tasks_of(job: &Job) -> Option<Vec<TaskEntry>> {
    serde_json::from_str(job.annotations().get(manifest::TASKS)?).ok()
}

fn service_address(deployment: &Deployment, ns: &str) -> Option<String> {
    let port = deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .ports
        .as_ref()?
        .first()?
        .container_port;
    Some(format!("{}.{ns}.svc:{port}", deployment.name_any()))
}

fn node_gpus(node: &Node) -> gpu::NodeGpus {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let count = |resource: &str| {
        allocatable
            .and_then(|a| a.get(resource))
            .and_then(|q| quantity::parse(&q.0))
            .map_or(0, |n| n.max(0.0) as u32)
    };
    gpu::NodeGpus {
        labels: node.labels().clone(),
        nvidia: count("nvidia.com/gpu"),
        amd: count("amd.com/gpu"),
    }
}

fn read_kubeconfig(config: &KubernetesConfig) -> Result<Kubeconfig, String> {
    match &config.kubeconfig {
        Some(path) => Kubeconfig::read_from(path)
            .map_err(|e| format!("kubeconfig: cannot read {}: {e}", path.display())),
        None => Kubeconfig::read().map_err(|e| {
            format!(
                "kubeconfig: none given, and none found in $KUBECONFIG or ~/.kube/config \
                 ({e}); name one, or set in_cluster: true"
            )
        }),
    }
}

async fn connect(config: &KubernetesConfig) -> Result<Client, AdapterError> {
    let unavailable = |e: String| AdapterError::Unavailable(e);
    let kube_config = if config.in_cluster {
        kube::Config::incluster()
            .map_err(|e| unavailable(format!("in_cluster: no service account here: {e}")))?
    } else {
        let kubeconfig = read_kubeconfig(config).map_err(unavailable)?;
        let options = KubeConfigOptions {
            context: config.context.clone(),
            ..Default::default()
        };
        kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| unavailable(format!("kubeconfig: {e}")))?
    };
    Client::try_from(kube_config).map_err(|e| unavailable(format!("connecting: {e}")))
}

/// The cluster's answer, in the adapter's terms; `what` says what was being done.
fn api_error(what: &str, e: kube::Error) -> AdapterError {
    match e {
        kube::Error::Api(status) => {
            let message = format!("{what}: {} ({})", status.message, status.reason);
            match status.code {
                404 => AdapterError::UnknownJob(message),
                // A ResourceQuota is full: another site may have room.
                403 if status.message.contains("exceeded quota") => AdapterError::Refused(message),
                400 | 422 => AdapterError::Rejected(message),
                _ => AdapterError::Unavailable(message),
            }
        }
        other => AdapterError::Unavailable(format!("{what}: {other}")),
    }
}

fn gone_ok<T>(result: Result<T, kube::Error>, what: &str) -> Result<(), AdapterError> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(api_error(what, e)),
    }
}

/// Creates `object`; one of that name already there is taken as this one (its name
/// holds the Meridian id, so only an earlier submission of the same run made it).
async fn create<K>(api: &Api<K>, object: &K) -> Result<(), AdapterError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        // Not the object (it is being created): its namespace.
        Err(kube::Error::Api(status)) if status.code == 404 => Err(AdapterError::Unavailable(
            format!("creating in the namespace: {}", status.message),
        )),
        Err(e) => Err(api_error(
            &format!("creating {}", object.meta().name.as_deref().unwrap_or("?")),
            e,
        )),
    }
}

#[async_trait]
impl SiteAdapter for KubernetesAdapter {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    async fn submit(&self, job: &JobRequest) -> Result<BackendJobId, AdapterError> {
        let live = self.synced().await?;
        job.check().map_err(AdapterError::Rejected)?;
        let placement = self.placement(live, job).await?;
        self.create_claims(live, job).await?;
        if job.service.is_some() {
            let (deployment, service) = manifest::service(&self.config, job, placement.as_ref())
                .map_err(AdapterError::Rejected)?;
            create(&live.deployments, &deployment).await?;
            create(&live.services, &service).await?;
            return Ok(Target::Service(manifest::object_name(job.job_id)).id());
        }
        let manifest =
            manifest::job(&self.config, job, placement.as_ref()).map_err(AdapterError::Rejected)?;
        create(&live.jobs, &manifest).await?;
        Ok(Target::Job(manifest::object_name(job.job_id)).id())
    }

    async fn find(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError> {
        let live = self.synced().await?;
        Ok(self.locate(live, job_id).map(|t| t.id()))
    }

    async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        let target = Target::parse(id).ok_or_else(|| AdapterError::UnknownJob(id.0.clone()))?;
        let live = self.synced().await?;
        let mut report = self.report(live, &target);
        // Just created, and the watch has not brought it yet: wait a moment for it,
        // then ask the API once.
        for _ in 0..10 {
            if !matches!(report, Err(AdapterError::UnknownJob(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            report = self.report(live, &target);
        }
        match report {
            Err(AdapterError::UnknownJob(_)) => {
                let name = target.object();
                let exists = match &target {
                    Target::Service(_) => live.deployments.get_opt(name).await.map(|o| o.is_some()),
                    _ => live.jobs.get_opt(name).await.map(|o| o.is_some()),
                }
                .map_err(|e| api_error("reading the object", e))?;
                if !exists {
                    return Err(AdapterError::UnknownJob(id.0.clone()));
                }
                Ok(JobReport {
                    backend_id: id.clone(),
                    state: JobState::Pending,
                    usage: Usage::default(),
                    address: None,
                    host: None,
                    waiting: None,
                })
            }
            other => other,
        }
    }

    async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        let target = Target::parse(id).ok_or_else(|| AdapterError::UnknownJob(id.0.clone()))?;
        let live = self.synced().await?;
        self.cancel_target(live, &target).await
    }

    async fn logs(&self, id: &BackendJobId) -> Result<Logs, AdapterError> {
        let target = Target::parse(id).ok_or_else(|| AdapterError::UnknownJob(id.0.clone()))?;
        let live = self.synced().await?;
        let pods = match &target {
            Target::Job(name) => live.watches.pods_of(name, None),
            Target::Task(name, index) => live.watches.pods_of(name, Some(*index)),
            Target::Service(name) => live.watches.service_pods(name),
        };
        let Some(pod) = pods.last() else {
            // Known but without a pod (not started, or its pods are gone): no logs.
            self.report(live, &target)?;
            return Ok(Logs::default());
        };
        let name = pod.name_any();
        Ok(match self.config.log_streams {
            LogStreams::Combined => Logs {
                stdout: self.pod_log(live, &name, None).await?,
                stderr: String::new(),
            },
            LogStreams::Split => Logs {
                stdout: self.pod_log(live, &name, Some("Stdout")).await?,
                stderr: self.pod_log(live, &name, Some("Stderr")).await?,
            },
        })
    }

    async fn capacity(&self) -> Result<Capacity, AdapterError> {
        let unhealthy = |message: String| Capacity {
            healthy: false,
            message: Some(message),
            ..Capacity::default()
        };
        let live = match self.live().await {
            Ok(live) => live,
            Err(e) => return Ok(unhealthy(e.to_string())),
        };
        // The namespace must be usable before anything else counts.
        if let Err(e) = live.jobs.list(&ListParams::default().limit(1)).await {
            return Ok(unhealthy(format!(
                "namespace {:?}: {}",
                self.config.namespace,
                api_error("listing Jobs", e)
            )));
        }
        let nodes: Api<Node> = Api::all(live.client.clone());
        let nodes = match nodes.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => return Ok(unhealthy(api_error("listing nodes", e).to_string())),
        };
        let all_pods: Api<Pod> = Api::all(live.client.clone());
        let running = match all_pods
            .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
            .await
        {
            Ok(list) => list.items,
            Err(e) => return Ok(unhealthy(api_error("listing pods", e).to_string())),
        };
        let mut capacity = quantity::capacity(&nodes, &running);
        capacity.pending = live
            .watches
            .pods
            .state()
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
            .count() as u32;
        let gpus: Vec<gpu::NodeGpus> = nodes.iter().map(node_gpus).collect();
        if let Some(problem) = gpu::label_problem(&self.config, &gpus) {
            capacity.healthy = false;
            capacity.message = Some(problem);
        } else if let Some(problem) = live.watches.problem() {
            capacity.healthy = false;
            capacity.message = Some(format!("watching the namespace: {problem}"));
        }
        Ok(capacity)
    }

    fn array_limit(&self) -> Option<u32> {
        Some(MAX_ARRAY_TASKS)
    }

    async fn submit_array(&self, array: &ArrayRequest) -> Result<Vec<BackendJobId>, AdapterError> {
        let live = self.synced().await?;
        array.template.check().map_err(AdapterError::Rejected)?;
        if array.tasks.len() > MAX_ARRAY_TASKS as usize {
            return Err(AdapterError::Rejected(format!(
                "{} tasks in one array submission; this site takes at most {MAX_ARRAY_TASKS}",
                array.tasks.len()
            )));
        }
        let placement = self.placement(live, &array.template).await?;
        self.create_claims(live, &array.template).await?;
        let manifest = manifest::array_job(&self.config, array, placement.as_ref())
            .map_err(AdapterError::Rejected)?;
        create(&live.jobs, &manifest).await?;
        let name = manifest::object_name(array.batch_id);
        Ok((0..array.tasks.len() as u32)
            .map(|n| Target::Task(name.clone(), n).id())
            .collect())
    }

    async fn owned(&self) -> Result<Vec<Uuid>, AdapterError> {
        let live = self.synced().await?;
        let cancelled = self.cancelled.lock().expect("cancel map").clone();
        let mut owned = BTreeSet::new();
        for job in live.watches.jobs.state() {
            if watch::finished(&job) {
                continue;
            }
            if let Some(id) = job
                .labels()
                .get(manifest::JOB_ID)
                .and_then(|id| id.parse().ok())
            {
                owned.insert(id);
            }
            let status = job.status.as_ref();
            let marked = watch::cancelled_tasks(&job);
            for (n, task) in tasks_of(&job).unwrap_or_default().iter().enumerate() {
                let n = n as u32;
                let settled =
                    state::in_intervals(status.and_then(|s| s.completed_indexes.as_deref()), n)
                        || state::in_intervals(status.and_then(|s| s.failed_indexes.as_deref()), n)
                        || marked.contains_key(&n)
                        || cancelled.contains_key(&format!("{}/{n}", job.name_any()));
                if !settled {
                    owned.insert(task.job_id);
                }
            }
        }
        for deployment in live.watches.deployments.state() {
            if let Some(id) = deployment
                .labels()
                .get(manifest::JOB_ID)
                .and_then(|id| id.parse().ok())
            {
                owned.insert(id);
            }
        }
        Ok(owned.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_ids_name_their_objects() {
        for target in [
            Target::Job("meridian-a".into()),
            Target::Task("meridian-b".into(), 7),
            Target::Service("meridian-c".into()),
        ] {
            assert_eq!(Target::parse(&target.id()), Some(target));
        }
        assert_eq!(Target::parse(&BackendJobId("pod/x".into())), None);
        assert_eq!(Target::parse(&BackendJobId("job/x/1/2".into())), None);
    }

    #[test]
    fn logs_keep_their_last_mebibyte() {
        let long = "é".repeat(LOG_CAP_BYTES);
        let kept = tail(long);
        assert!(kept.len() <= LOG_CAP_BYTES);
        assert!(kept.chars().all(|c| c == 'é'));
    }
}
