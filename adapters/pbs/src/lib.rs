//! The PBS site: federates an OpenPBS or PBS Professional cluster through its commands,
//! `qsub`, `qstat -f -F json -x`, `qdel` and `pbsnodes -a -F json`. Each Meridian job is
//! one PBS job, tagged with `-v MERIDIAN_JOB_ID=<job id>` (shown by qstat in its
//! `Variable_List`); submits take a lock, look for the tag, and submit only when it is not
//! there, so a restarted or racing adapter never submits a job twice.
//!
//! An array released as one batch is one `qsub -J` held to its cap by
//! `-W max_run_subjobs`, tagged `-v MERIDIAN_BATCH_ID=<batch>`; each task is followed as
//! its subjob (`123[4].server`). Meridian holds dependencies: a job is released only once
//! the jobs it requires have succeeded. [`state::map_state`] decides what every
//! `job_state` letter and `Exit_status` means.
//!
//! No PBS server runs where Meridian is tested: the crate is tested against the outputs
//! the OpenPBS documentation describes, replayed by stand-in commands (the `contract_*`
//! tests; see `docs/site-pbs.md`).

pub mod config;
pub mod qstat;
pub mod qsub;
pub mod runner;
pub mod state;

use std::path::PathBuf;

use async_trait::async_trait;
use meridian_adapter_core::{
    AdapterError, ArrayRequest, BackendJobId, Capacity, JobReport, JobRequest, JobState, Logs,
    SiteAdapter,
};
use serde_json::Value;
use uuid::Uuid;

pub use config::PbsConfig;

/// The PBS kind in the adapter registry.
pub const REGISTRATION: meridian_adapter_core::Registration = meridian_adapter_core::Registration {
    kind: "pbs",
    about: "an OpenPBS or PBS Professional cluster, through qsub/qstat/qdel/pbsnodes",
    needs_config: true,
    build: |text, _| {
        let config: PbsConfig = meridian_adapter_core::registry::parse_config(text)?;
        Ok(std::sync::Arc::new(PbsAdapter::new(config)?))
    },
};
pub use qsub::{array_args, depend_arg, PbsId};
pub use state::{map_state, Observed};

use meridian_adapter_core::submit_lock::SubmitLock;
use qstat::JobInfo;
use runner::{Output, Runner};

/// The most of each of stdout and stderr that [`SiteAdapter::logs`] returns: the last
/// 1 MiB. The files themselves are kept whole.
pub const LOG_CAP_BYTES: u64 = 1 << 20;

/// A PBS site. Cheap to create: nothing is contacted until the first call.
#[derive(Debug)]
pub struct PbsAdapter {
    config: PbsConfig,
    runner: Runner,
}

/// What a failure of a PBS command says about trying again: these mean the server could
/// not be reached or is busy, so the same request may work later.
const TRANSIENT: [&str; 9] = [
    "cannot connect to server",
    "connection refused",
    "no route to host",
    "timed out",
    "errno=15010",
    "server is busy",
    "try again",
    "maximum number of jobs",
    "would exceed",
];

fn transient(stderr: &str) -> bool {
    let lower = stderr.to_ascii_lowercase();
    TRANSIENT.iter().any(|t| lower.contains(t))
}

impl PbsAdapter {
    pub fn new(config: PbsConfig) -> Result<Self, AdapterError> {
        if !config.work_dir.is_absolute() {
            return Err(AdapterError::Rejected(format!(
                "the PBS work_dir must be an absolute path (execution hosts resolve it), got {}",
                config.work_dir.display()
            )));
        }
        let runner = Runner {
            bin_dir: config.bin_dir.clone(),
            timeout: config.command_timeout,
        };
        Ok(PbsAdapter { config, runner })
    }

    pub fn config(&self) -> &PbsConfig {
        &self.config
    }

    async fn run(&self, name: &str, args: &[&str]) -> Result<Output, AdapterError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        self.runner
            .run(name, &args)
            .await
            .map_err(|e| AdapterError::Unavailable(e.to_string()))
    }

    fn failed(what: &str, out: &Output) -> AdapterError {
        AdapterError::Unavailable(format!(
            "{what} failed ({}): {}",
            out.code.map_or("killed".into(), |c| format!("exit {c}")),
            out.stderr.trim()
        ))
    }

    /// One job's attributes; `UnknownJob` when the server (history included) has none.
    async fn query(&self, id: &BackendJobId) -> Result<(PbsId, JobInfo), AdapterError> {
        let pid = PbsId::from_backend(id)?;
        let out = self
            .run("qstat", &["-f", "-F", "json", "-x", &pid.to_string()])
            .await?;
        if !out.success() {
            if out.stderr.contains("Unknown Job Id") {
                return Err(AdapterError::UnknownJob(id.0.clone()));
            }
            return Err(Self::failed("qstat", &out));
        }
        let jobs = qstat::jobs(&out.stdout).map_err(AdapterError::Unavailable)?;
        let job = jobs
            .into_iter()
            .next()
            .map(|(_, job)| job)
            .ok_or_else(|| AdapterError::UnknownJob(id.0.clone()))?;
        Ok((pid, qstat::job_info(&job)))
    }

    /// Writes `plan`'s script and submits it; the id qsub printed.
    async fn qsub(&self, plan: &qsub::Plan) -> Result<PbsId, AdapterError> {
        tokio::fs::create_dir_all(&self.config.work_dir).await?;
        // Owner-only: the script carries the job's workflow credential.
        write_owner_only(&plan.script_path, &plan.script).await?;
        let args: Vec<&str> = plan.args.iter().map(String::as_str).collect();
        let out = self.run("qsub", &args).await?;
        if !out.success() {
            let stderr = out.stderr.trim();
            return Err(if transient(stderr) || out.code.is_none() {
                Self::failed("qsub", &out)
            } else {
                AdapterError::Rejected(stderr.to_string())
            });
        }
        qsub::parse_qsub(&out.stdout).ok_or_else(|| {
            AdapterError::Unavailable(format!("qsub printed no job id: {:?}", out.stdout.trim()))
        })
    }

    /// The job (history included) whose tag, as `tag_of` reads it, is `want`: the one
    /// with the lowest sequence number if several are.
    async fn tagged(
        &self,
        tag_of: impl Fn(&JobInfo) -> Option<&str>,
        want: Uuid,
    ) -> Result<Option<BackendJobId>, AdapterError> {
        let out = self.run("qstat", &["-f", "-F", "json", "-x"]).await?;
        if !out.success() {
            return Err(Self::failed("qstat", &out));
        }
        if out.stdout.trim().is_empty() {
            return Ok(None);
        }
        let want = want.to_string();
        let jobs = qstat::jobs(&out.stdout).map_err(AdapterError::Unavailable)?;
        Ok(jobs
            .into_iter()
            .filter(|(_, job)| tag_of(&qstat::job_info(job)) == Some(want.as_str()))
            .filter_map(|(id, _)| PbsId::parse(&id))
            // An array's subjobs carry its tag too: the array itself is the answer.
            .map(|id| match id.array {
                Some(Some(_)) => PbsId {
                    array: Some(None),
                    ..id
                },
                _ => id,
            })
            .min_by_key(|id| id.seq)
            .map(|id| BackendJobId(id.to_string())))
    }

    /// Marks a job as deleted by this site: PBS reports deleted jobs as finished, so the
    /// adapter remembers, across restarts, which ends were its own `qdel`.
    fn cancel_marker(&self, id: &PbsId) -> PathBuf {
        self.config
            .work_dir
            .join(".meridian-cancelled")
            .join(id.to_string())
    }

    fn report(
        &self,
        id: &BackendJobId,
        pid: &PbsId,
        mut info: JobInfo,
    ) -> Result<JobReport, AdapterError> {
        info.observed.cancel_requested = self.cancel_marker(pid).exists();
        let state = map_state(&info.observed)
            .map_err(|e| AdapterError::Unavailable(format!("job {id}: {e}")))?;
        let host = info
            .exec_host
            .filter(|_| matches!(state, JobState::Running { .. }));
        Ok(JobReport {
            address: None,
            host,
            backend_id: id.clone(),
            state,
            usage: info.usage,
            waiting: None,
        })
    }

    /// The last [`LOG_CAP_BYTES`] of a delivered output file; empty until PBS delivers it.
    async fn read_capped(path: Option<&str>) -> Result<String, AdapterError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let Some(path) = path else {
            return Ok(String::new());
        };
        let mut file = match tokio::fs::File::open(path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
            Err(e) => {
                return Err(AdapterError::Unavailable(format!(
                    "cannot read {path}: {e}"
                )))
            }
        };
        let size = file.metadata().await?.len();
        let skip = size.saturating_sub(LOG_CAP_BYTES);
        file.seek(std::io::SeekFrom::Start(skip)).await?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).await?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Ok(if skip > 0 {
            format!("[{skip} earlier bytes left out; the whole output is in {path}]\n{text}")
        } else {
            text
        })
    }

    async fn try_capacity(&self) -> Result<Capacity, AdapterError> {
        let out = self.run("pbsnodes", &["-a", "-F", "json"]).await?;
        if !out.success() {
            return Err(Self::failed("pbsnodes", &out));
        }
        let nodes: Value = serde_json::from_str(&out.stdout).map_err(|e| {
            AdapterError::Unavailable(format!("pbsnodes printed something that is not JSON ({e})"))
        })?;
        let mut capacity = qstat::capacity(&nodes, self.config.queue.as_deref());
        let (args, key): (Vec<&str>, &str) = match &self.config.queue {
            Some(q) => (vec!["-Q", "-f", "-F", "json", q], "Queue"),
            None => (vec!["-B", "-f", "-F", "json"], "Server"),
        };
        let out = self.run("qstat", &args).await?;
        if !out.success() {
            return Err(Self::failed("qstat", &out));
        }
        let status: Value = serde_json::from_str(&out.stdout).map_err(|e| {
            AdapterError::Unavailable(format!("qstat printed something that is not JSON ({e})"))
        })?;
        capacity.pending = status[key]
            .as_object()
            .into_iter()
            .flat_map(|o| o.values())
            .filter_map(|s| s["state_count"].as_str())
            .map(qstat::pending)
            .sum();
        Ok(capacity)
    }
}

#[async_trait]
impl SiteAdapter for PbsAdapter {
    fn kind(&self) -> &'static str {
        "pbs"
    }

    async fn submit(&self, job: &JobRequest) -> Result<BackendJobId, AdapterError> {
        let plan = qsub::plan(job, &self.config)?;
        let _lock = SubmitLock::acquire(&self.config.lock_dir(), job.job_id)
            .await
            .map_err(|e| AdapterError::Unavailable(format!("submit lock: {e}")))?;
        if let Some(id) = self.find(job.job_id).await? {
            tracing::debug!(job = %job.job_id, pbs_job = %id, "already submitted");
            return Ok(id);
        }
        let id = self.qsub(&plan).await?;
        tracing::info!(job = %job.job_id, pbs_job = %id, "submitted to PBS");
        Ok(BackendJobId(id.to_string()))
    }

    fn array_limit(&self) -> Option<u32> {
        (self.config.max_array_size > 1).then_some(self.config.max_array_size)
    }

    /// The shared `volume_root`, which this machine reaches.
    fn volume_root(&self) -> Option<std::path::PathBuf> {
        self.config.volume_root.clone()
    }

    /// One `qsub -J` tagged with the batch; each task's id is its subjob's. A batch of
    /// one task goes as a plain job (PBS ranges hold two subjobs or more).
    async fn submit_array(&self, array: &ArrayRequest) -> Result<Vec<BackendJobId>, AdapterError> {
        if let [task] = array.tasks.as_slice() {
            let mut job = array.template.clone();
            job.job_id = task.job_id;
            job.array_index = Some(task.index);
            return Ok(vec![self.submit(&job).await?]);
        }
        let plan = qsub::array_plan(array, &self.config)?;
        let _lock = SubmitLock::acquire(&self.config.lock_dir(), array.batch_id)
            .await
            .map_err(|e| AdapterError::Unavailable(format!("submit lock: {e}")))?;
        let parent = match self
            .tagged(|info| info.meridian_batch_id.as_deref(), array.batch_id)
            .await?
        {
            Some(id) => {
                tracing::debug!(batch = %array.batch_id, pbs_job = %id, "array already submitted");
                PbsId::from_backend(&id)?
            }
            None => {
                let id = self.qsub(&plan).await?;
                tracing::info!(batch = %array.batch_id, pbs_job = %id, tasks = array.tasks.len(), "array submitted to PBS");
                id
            }
        };
        Ok((0..array.tasks.len() as u32)
            .map(|i| {
                BackendJobId(
                    PbsId {
                        array: Some(Some(i)),
                        ..parent.clone()
                    }
                    .to_string(),
                )
            })
            .collect())
    }

    async fn find(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError> {
        self.tagged(|info| info.meridian_job_id.as_deref(), job_id)
            .await
    }

    async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        let (pid, info) = self.query(id).await?;
        self.report(id, &pid, info)
    }

    async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        let (pid, info) = self.query(id).await?;
        if self.report(id, &pid, info)?.state.is_terminal() {
            return Ok(());
        }
        // Marked first: a crash after qdel still leaves the end recognised as ours.
        let marker = self.cancel_marker(&pid);
        if let Some(dir) = marker.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        tokio::fs::write(&marker, b"").await?;
        let out = self.run("qdel", &[&pid.to_string()]).await?;
        let stderr = out.stderr.as_str();
        if out.success() {
            tracing::info!(pbs_job = %id, "deleted");
            return Ok(());
        }
        // Already over (or ending on its own): its end is not a cancellation.
        if stderr.contains("Job has finished")
            || stderr.contains("Unknown Job Id")
            || stderr.contains("Request invalid for state of job")
        {
            let _ = tokio::fs::remove_file(&marker).await;
            return Ok(());
        }
        let _ = tokio::fs::remove_file(&marker).await;
        Err(Self::failed("qdel", &out))
    }

    async fn logs(&self, id: &BackendJobId) -> Result<Logs, AdapterError> {
        let (pid, info) = self.query(id).await?;
        // A subjob's paths may still read as the array's `-o`: its index goes in.
        let path = |p: Option<String>| match (p, pid.array) {
            (Some(p), Some(Some(i))) => Some(p.replace(qsub::ARRAY_INDEX_TOKEN, &i.to_string())),
            (p, _) => p,
        };
        Ok(Logs {
            stdout: Self::read_capped(path(info.output_path).as_deref()).await?,
            stderr: Self::read_capped(path(info.error_path).as_deref()).await?,
        })
    }

    async fn capacity(&self) -> Result<Capacity, AdapterError> {
        Ok(match self.try_capacity().await {
            Ok(capacity) => capacity,
            Err(e) => Capacity {
                healthy: false,
                message: Some(e.to_string()),
                ..Capacity::default()
            },
        })
    }
}

/// Writes `text` to `path`, readable by its owner only.
async fn write_owner_only(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut options = tokio::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options.open(path).await?;
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .await?;
    file.write_all(text.as_bytes()).await?;
    file.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_say_whether_to_retry() {
        assert!(transient(
            "Connection refused\nqsub: cannot connect to server pbs (errno=15010)"
        ));
        assert!(transient("No route to host"));
        assert!(!transient("qsub: Unknown queue"));
        assert!(!transient(
            "qsub: Illegal attribute or resource value Resource_List.select"
        ));
        assert!(PbsAdapter::new(PbsConfig::new("relative")).is_err());
    }
}
