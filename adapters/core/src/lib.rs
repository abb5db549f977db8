//! What every site adapter is: the [`SiteAdapter`] trait (submit a job, an array of tasks
//! or a service, status, cancel, find-again after a restart, logs, capacity), the job model it
//! speaks, and the conformance kit ([`conformance`]) each adapter runs against its real
//! backend. Adapters report failures in the events' own taxonomy ([`FailureReason`]),
//! so nothing is lost between what a site says and what the log records.
//!
//! Adapters know nothing of the event log: the adapter service turns what they report
//! into events. They tag every backend job with its Meridian job id, so a restarted
//! adapter finds what it already submitted and never submits it twice.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use meridian_events::FailureReason;

pub mod batch;
pub mod conformance;
pub mod gpu;
pub mod registry;
pub mod submit_lock;

pub use registry::{BuildContext, BuildError, Registration};

/// One job (or one task of an array) to run at a site: everything the backend needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRequest {
    /// The Meridian Job aggregate id; the backend job is tagged with it.
    pub job_id: Uuid,
    pub workflow_id: Uuid,
    /// The job's name in the workflow spec.
    pub name: String,
    pub array_index: Option<u32>,
    /// `None` runs on the host; `Some("docker://…")` in a container.
    pub image: Option<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub resources: Resources,
    /// Set for a service: run it until cancelled, restart it when it crashes, and say
    /// when it answers on its port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRequest>,
    /// Volume name → where the job sees it at the site.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mounts: BTreeMap<String, String>,
    /// Volume name → its declared size in bytes, for sites that provision a volume per
    /// workflow (a Kubernetes PersistentVolumeClaim).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub volume_sizes: BTreeMap<String, u64>,
    /// The tenant the workflow belongs to, for sites that label what they create with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The shape placement chose, when the site's catalogue entry names it (a cloud site
    /// launches that instance type, spot when its offer is the spot one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<PlacedShape>,
    /// Where and with what a run reports its start and end itself (a cloud instance):
    /// never serialized, since it holds a credential.
    #[serde(skip)]
    pub report_to: Option<ReportTo>,
    /// What the workflow asks of a Slurm site (partition, QOS); other sites ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmOptions>,
}

/// A job's options for a Slurm site, from its workflow (`jobs.NAME.slurm`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmOptions {
    /// `--partition`, instead of the site's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// `--qos`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
}

/// The shape placement chose for a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedShape {
    /// The site's name for it: an instance type at a cloud site.
    pub name: String,
    /// The priced offer placement chose.
    pub offer: String,
    /// Whether that offer is the shape's spot (preemptible) one.
    pub spot: bool,
    /// The vendor of its accelerators (`nvidia`, `amd`), if it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_vendor: Option<String>,
}

/// Where a run reports itself, and the credential that speaks for that one run.
#[derive(Clone, PartialEq, Eq)]
pub struct ReportTo {
    /// Meridian's API, as the site's machines reach it.
    pub server: String,
    /// A credential good only for reporting this one run.
    pub credential: String,
}

impl std::fmt::Debug for ReportTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportTo")
            .field("server", &self.server)
            .field("credential", &"..")
            .finish()
    }
}

/// What a run said of itself through Meridian's API (`POST /v1/runs/{job}/report`):
/// when it started, how it ended and its output. Sites whose machines report this way
/// (the cloud sites) read it through [`RunReports`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i32>,
    pub logs: Logs,
}

/// The runs' own reports, as the API keeps them.
#[async_trait]
pub trait RunReports: Send + Sync {
    /// What run `job_id` reported, if anything.
    async fn read(&self, job_id: Uuid) -> Result<Option<RunReport>, AdapterError>;
}

/// Tasks of one array to submit as one unit (a Slurm `--array`, a PBS `-J`), of which
/// the site runs at most `cap` at once. Every task runs `template`'s command with its own
/// job id and index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArrayRequest {
    /// The batch, from the tasks' release: the site's submission is tagged with it, so a
    /// restarted adapter finds it and never submits it twice.
    pub batch_id: Uuid,
    /// What every task runs; its `job_id` and `array_index` are those of the first task.
    pub template: JobRequest,
    /// The tasks, indices ascending.
    pub tasks: Vec<ArrayTask>,
    /// At most this many run at once.
    pub cap: u32,
}

/// One task of an [`ArrayRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// Its index in the workflow's array.
    pub index: u32,
    /// Its Meridian job id.
    pub job_id: Uuid,
}

/// What makes a run a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRequest {
    /// The TCP port it listens on.
    pub port: u16,
    /// Replicas to start now (`min`) and to scale to (`max`, not used yet).
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// How often a crashed service is started again before its run fails.
    pub max_restarts: u32,
}

/// How often a crashed service is restarted unless the adapter is told otherwise.
pub const DEFAULT_MAX_RESTARTS: u32 = 3;

impl JobRequest {
    /// Job `name` running `command` on the host with new ids, one node, one CPU, 1 GiB
    /// and a minute, and nothing else: what callers then change field by field.
    pub fn new(name: &str, command: &[&str]) -> JobRequest {
        JobRequest {
            job_id: Uuid::now_v7(),
            workflow_id: Uuid::now_v7(),
            name: name.into(),
            array_index: None,
            image: None,
            command: command.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::new(),
            cwd: None,
            resources: Resources {
                nodes: 1,
                cpus: 1,
                memory_bytes: 1 << 30,
                walltime: Duration::from_secs(60),
                gpus: None,
            },
            service: None,
            mounts: BTreeMap::new(),
            volume_sizes: BTreeMap::new(),
            tenant: None,
            shape: None,
            report_to: None,
            slurm: None,
        }
    }

    /// The container image to run in, or `None` to run on the host (`host` or empty).
    pub fn container_image(&self) -> Option<&str> {
        self.image
            .as_deref()
            .map(str::trim)
            .filter(|image| !image.is_empty() && *image != "host")
    }

    /// The command with `${ARRAY_INDEX}` replaced by this task's index.
    pub fn task_command(&self) -> Vec<String> {
        self.command
            .iter()
            .map(|arg| match self.array_index {
                Some(index) => arg.replace("${ARRAY_INDEX}", &index.to_string()),
                None => arg.clone(),
            })
            .collect()
    }

    /// The variables Meridian sets for every job: its ids, and for an array task its
    /// index (as `MERIDIAN_ARRAY_INDEX` and `ARRAY_INDEX`). Adapters set them after the
    /// job's own, so a job cannot pass itself off as another.
    pub fn meridian_env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("MERIDIAN_JOB_ID".to_string(), self.job_id.to_string()),
            (
                "MERIDIAN_WORKFLOW_ID".to_string(),
                self.workflow_id.to_string(),
            ),
        ];
        if let Some(index) = self.array_index {
            env.push(("MERIDIAN_ARRAY_INDEX".into(), index.to_string()));
            env.push(("ARRAY_INDEX".into(), index.to_string()));
        }
        env
    }

    /// The port, for a service.
    pub fn service_port(&self) -> Option<u16> {
        self.service.as_ref().map(|s| s.port)
    }

    /// Why the request can never run anywhere (no command on the host, an environment
    /// variable name a shell cannot export), if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.command.is_empty() && self.container_image().is_none() {
            return Err("a job on the host needs a command".into());
        }
        if let Some(bad) = self.env.keys().find(|k| !valid_env_name(k)) {
            return Err(format!("{bad:?} is not an environment variable name"));
        }
        Ok(())
    }
}

/// `[A-Za-z_][A-Za-z0-9_]*`: what a POSIX shell can export.
pub fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    pub nodes: u32,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub walltime: Duration,
    pub gpus: Option<Gpus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpus {
    pub count: u32,
    /// `nvidia`, `amd` or `any`.
    pub vendor: String,
    pub model: Option<String>,
}

/// The backend's own id for a submitted job (Slurm job id, PID, instance id…).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BackendJobId(pub String);

impl std::fmt::Display for BackendJobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a job stands at its site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum JobState {
    /// Accepted, waiting for resources.
    Pending,
    Running {
        started_at: DateTime<Utc>,
    },
    Succeeded {
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
    },
    Failed {
        started_at: Option<DateTime<Utc>>,
        ended_at: DateTime<Utc>,
        exit_code: Option<i32>,
        failure: FailureReason,
    },
    Cancelled {
        started_at: Option<DateTime<Utc>>,
        ended_at: DateTime<Utc>,
    },
}

impl JobState {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            JobState::Succeeded { .. } | JobState::Failed { .. } | JobState::Cancelled { .. }
        )
    }
}

/// What the backend allocated and measured, for the bill.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub nodes: u32,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub gpus: u32,
    /// CPU time used (user + system), when the backend reports it.
    pub cpu_seconds: Option<f64>,
    pub max_rss_bytes: Option<u64>,
    /// The accelerators the site gave, when it says (a job that asked for vendor `any`
    /// is billed for what it got): `nvidia` or `amd`, and the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// What the site bills when it is not the run (a cloud instance: launch to
    /// terminate); compute is charged for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billed: Option<meridian_events::vocabulary::BilledInterval>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    pub backend_id: BackendJobId,
    pub state: JobState,
    pub usage: Usage,
    /// For a running service, where it answers (`host:port`), when the site knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The host its first process runs on, when the site says (Slurm's batch host):
    /// a service there is ready once it answers on its port ([`service_address`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Why the site holds a pending run back, when it says (a scheduler's pending
    /// reason, a pod no node can take yet): shown in `meridian status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

/// Where a running service answers: the address its site gives, else its host and port
/// once something accepts connections there (each try waits at most 200 ms). `None`
/// while it does not answer, or when the run is not a running service.
pub async fn service_address(report: &JobReport, service: &ServiceRequest) -> Option<String> {
    if !matches!(report.state, JobState::Running { .. }) {
        return None;
    }
    if let Some(address) = &report.address {
        return Some(address.clone());
    }
    let address = format!("{}:{}", report.host.as_deref()?, service.port);
    let connect = tokio::net::TcpStream::connect(address.clone());
    match tokio::time::timeout(Duration::from_millis(200), connect).await {
        Ok(Ok(_)) => Some(address),
        _ => None,
    }
}

/// Free capacity and health, as the site sees it now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    pub healthy: bool,
    pub total_cpus: u32,
    pub free_cpus: u32,
    pub total_memory_bytes: u64,
    pub free_memory_bytes: u64,
    pub free_gpus: u32,
    /// Free GPUs by the catalogue's model name (`H100`), where the site tells models
    /// apart (typed GRES at Slurm, a `gpu_model` resource at PBS, the local site's
    /// devices); GPUs of no known model count only in `free_gpus`.
    #[serde(default)]
    pub free_gpus_by_model: BTreeMap<String, u32>,
    pub idle_nodes: u32,
    /// Jobs waiting at the site.
    pub pending: u32,
    /// Why it is unhealthy, when it is.
    pub message: Option<String>,
}

/// One shape's figures as its provider gives them (an instance type's vCPUs, memory and
/// GPUs); prices are not among them: they stay in the catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeFacts {
    pub name: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<GpuFacts>,
}

/// The accelerators of one node of a shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFacts {
    pub count: u32,
    /// `nvidia` or `amd` (or the maker's name for others).
    pub vendor: String,
    pub model: String,
    pub memory_bytes: u64,
}

/// A job's captured output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Logs {
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("job {0} is not known at this site")]
    UnknownJob(String),
    /// The site cannot be reached or answered garbage; the same call may work later.
    #[error("site unavailable: {0}")]
    Unavailable(String),
    /// The request can never run here (a bad image, resources the site lacks).
    #[error("rejected by the site: {0}")]
    Rejected(String),
    /// The site cannot take it now (capacity, quota): another site may, so the router
    /// places the work again, with backoff.
    #[error("refused by the site for now: {0}")]
    Refused(String),
    /// The site will run it, but not yet: what it needs (its GPUs) is held by other
    /// jobs now. The runner says so in the run's status and submits it again later.
    #[error("the site is busy: {0}")]
    Busy(String),
    #[error("not supported by this site: {0}")]
    NotSupported(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[async_trait]
pub trait SiteAdapter: Send + Sync {
    /// The backend kind, e.g. `local` or `slurm`.
    fn kind(&self) -> &'static str;

    /// Submits `job`. If a job tagged with `job.job_id` already exists at the site, returns
    /// its id instead of submitting again.
    async fn submit(&self, job: &JobRequest) -> Result<BackendJobId, AdapterError>;

    /// Looks up the backend job tagged with this Meridian job id, if any.
    async fn find(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError>;

    async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError>;

    /// The state of each of `ids`, in order. Sites that can say in one call what several
    /// jobs do (an array's tasks) answer so; the default asks for each in turn.
    async fn status_all(&self, ids: &[BackendJobId]) -> Vec<Result<JobReport, AdapterError>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(self.status(id).await);
        }
        out
    }

    /// Asks the site to stop the job; cancelling a finished job is not an error.
    async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError>;

    async fn logs(&self, id: &BackendJobId) -> Result<Logs, AdapterError>;

    async fn capacity(&self) -> Result<Capacity, AdapterError>;

    /// The most tasks of one array this site takes as one submission, holding them to
    /// the array's cap itself; `None` (the default): each task goes alone. The runner
    /// says it in its heartbeats, and the router releases arrays in batches to such a
    /// site.
    fn array_limit(&self) -> Option<u32> {
        None
    }

    /// Submits `array` as one unit and returns each task's backend id, in the order of
    /// `array.tasks`. Idempotent like [`SiteAdapter::submit`]: when a submission tagged
    /// with `array.batch_id` is already at the site, its tasks' ids are returned.
    async fn submit_array(&self, array: &ArrayRequest) -> Result<Vec<BackendJobId>, AdapterError> {
        let _ = array;
        Err(AdapterError::NotSupported(format!(
            "arrays as one submission at a {} site",
            self.kind()
        )))
    }

    /// The directory on this machine that holds the site's volumes, each at
    /// [`volume_dir`]`(root, workflow, volume)`, when this machine can write it (the local
    /// site; a batch site's shared file system): the data mover brings ingress there.
    /// `None` (the default): the data mover cannot reach the site's storage.
    fn volume_root(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// What the provider says of these shapes (instance types): CPUs, memory, GPUs, for
    /// `meridian site refresh`. Sites that cannot say answer `NotSupported`.
    async fn shapes(&self, names: &[String]) -> Result<Vec<ShapeFacts>, AdapterError> {
        let _ = names;
        Err(AdapterError::NotSupported(format!(
            "reading shapes from a {} site's provider",
            self.kind()
        )))
    }

    /// Whether the site runner refreshes the site's shapes from the provider when it
    /// starts (the adapter's configuration says).
    fn refresh_shapes_at_start(&self) -> bool {
        false
    }

    /// The GPUs of the site's machine, each with its health, read now (the local site);
    /// the runner cordons those at fault. Sites that do not watch devices one by one
    /// answer none (the default).
    async fn devices(&self) -> Result<Vec<gpu::DeviceStatus>, AdapterError> {
        Ok(Vec::new())
    }

    /// The devices (by [`gpu::DeviceStatus::id`]) that get no new work, as the log's
    /// cordons say; the runner tells the adapter after each look. The default ignores
    /// them (the site has no devices of its own to hand out).
    fn cordon(&self, devices: &std::collections::BTreeSet<String>) {
        let _ = devices;
    }

    /// The Meridian jobs this site still runs (or queues), by the job id each is tagged
    /// with: the runner stops those no live job needs (a leak sweep). Sites that cannot
    /// list what they run say `NotSupported`, and are not swept.
    async fn owned(&self) -> Result<Vec<Uuid>, AdapterError> {
        Err(AdapterError::NotSupported(format!(
            "listing the jobs a {} site runs",
            self.kind()
        )))
    }
}

/// `MERIDIAN_VOLUME_<NAME>`: where a job on the host finds volume `volume` (its name
/// upper-cased, `-` as `_`), since a host job cannot see it at its mount path.
pub fn volume_variable(volume: &str) -> String {
    format!(
        "MERIDIAN_VOLUME_{}",
        volume.to_ascii_uppercase().replace('-', "_")
    )
}

/// Where a workflow's volume lives under a site's volume root: one directory per
/// workflow and volume, the same for the adapter that mounts it and the data mover that
/// fills it.
pub fn volume_dir(root: &std::path::Path, workflow_id: Uuid, volume: &str) -> std::path::PathBuf {
    root.join(workflow_id.to_string()).join(volume)
}

/// Serde for a `Duration` written as (fractional) seconds in adapter config files:
/// `#[serde(with = "meridian_adapter_core::seconds")]`.
pub mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}
