//! The Slurm site: federates a Slurm cluster people already own. It submits each Meridian
//! job as one batch job, through the Slurm commands (here or on a login node over SSH) or
//! through slurmrestd, follows it, and maps every Slurm state to Meridian's job model
//! ([`state::map_state`]), so the router can tell a site's failures from a job's own.
//!
//! Every batch job carries `--comment=meridian:<job id>`. Submits take a lock
//! ([`meridian_adapter_core::submit_lock`]), look for a job with that comment, and
//! submit only when there is none, so a restarted or racing adapter never submits a job
//! twice.
//!
//! Arrays go to Slurm as one `sbatch --array=a-b%N` (up to `max_array_size` tasks, tagged
//! with their batch), and Slurm holds them to the array's cap; each task is then followed
//! as `<array job>_<index>`. Dependencies stay with Meridian: a job is only released once
//! the jobs it requires have succeeded, never as a Slurm `--dependency`.
//! `docs/site-slurm.md` has the configuration, the state table and the limits.

pub mod cli;
pub mod config;
pub mod parse;
pub mod rest;
pub mod runner;
pub mod script;
pub mod state;
pub mod testkit;

use std::sync::Arc;

use async_trait::async_trait;
use meridian_adapter_core::{
    AdapterError, ArrayRequest, BackendJobId, Capacity, JobReport, JobRequest, Logs, SiteAdapter,
};
use tokio::sync::OnceCell;
use uuid::Uuid;

pub use config::{Mode, PollConfig, RestConfig, SlurmConfig, SshTarget, TokenSource};

/// The Slurm kind in the adapter registry.
pub const REGISTRATION: meridian_adapter_core::Registration = meridian_adapter_core::Registration {
    kind: "slurm",
    about: "a Slurm cluster, through sbatch/squeue/sacct (here or over SSH) or slurmrestd",
    needs_config: true,
    build: |text, _| {
        let config: SlurmConfig = meridian_adapter_core::registry::parse_config(text)?;
        Ok(std::sync::Arc::new(SlurmAdapter::new(config)?))
    },
};
pub use runner::{Command, CommandRunner, LocalRunner, Output, SshRunner};
pub use state::{map_state, ExitStatus, StateError};

use cli::Cli;
use meridian_adapter_core::submit_lock::SubmitLock;
use parse::SlurmId;
use rest::Rest;

/// The most of each of stdout and stderr that [`SiteAdapter::logs`] returns: the last
/// 1 MiB. The files in `work_dir` are kept whole.
pub const LOG_CAP_BYTES: u64 = 1 << 20;

/// A Slurm site. Cheap to create: nothing is contacted until the first call.
#[derive(Debug)]
pub struct SlurmAdapter {
    config: Arc<SlurmConfig>,
    runner: Arc<dyn CommandRunner>,
    backend: Backend,
    work_dir_ready: OnceCell<()>,
}

#[derive(Debug)]
enum Backend {
    Cli(Cli),
    Rest(Rest),
}

impl SlurmAdapter {
    /// A site that runs its commands here, or over SSH when `config.ssh` is set.
    pub fn new(config: SlurmConfig) -> Result<Self, AdapterError> {
        let timeout = config.poll.command_timeout;
        let runner: Arc<dyn CommandRunner> = match &config.ssh {
            Some(target) => Arc::new(SshRunner {
                target: target.clone(),
                bin_dir: config.bin_dir.clone(),
                timeout,
            }),
            None => Arc::new(LocalRunner {
                bin_dir: config.bin_dir.clone(),
                timeout,
            }),
        };
        Self::with_runner(config, runner)
    }

    /// A site whose commands go through `runner` (tests put a recording one here).
    pub fn with_runner(
        config: SlurmConfig,
        runner: Arc<dyn CommandRunner>,
    ) -> Result<Self, AdapterError> {
        if !config.work_dir.is_absolute() {
            return Err(AdapterError::Rejected(format!(
                "the Slurm work_dir must be an absolute path (compute nodes resolve it), got {}",
                config.work_dir.display()
            )));
        }
        let config = Arc::new(config);
        let backend = match &config.mode {
            Mode::Cli => Backend::Cli(Cli {
                runner: runner.clone(),
                config: config.clone(),
            }),
            Mode::Rest(rest) => Backend::Rest(Rest::new(rest.clone(), config.clone())?),
        };
        Ok(SlurmAdapter {
            config,
            runner,
            backend,
            work_dir_ready: OnceCell::new(),
        })
    }

    pub fn config(&self) -> &SlurmConfig {
        &self.config
    }

    /// The REST API version in use (discovered on first use); `None` in CLI mode.
    pub async fn rest_api_version(&self) -> Result<Option<String>, AdapterError> {
        match &self.backend {
            Backend::Cli(_) => Ok(None),
            Backend::Rest(rest) => rest.version().await.map(|v| Some(v.to_string())),
        }
    }

    async fn run(&self, command: Command) -> Result<Output, AdapterError> {
        self.runner
            .run(&command)
            .await
            .map_err(|e| AdapterError::Unavailable(e.to_string()))
    }

    /// Slurm cannot open output files in a directory that does not exist: the job would
    /// fail at start. Made once per adapter, where the jobs see it.
    async fn ensure_work_dir(&self) -> Result<(), AdapterError> {
        self.work_dir_ready
            .get_or_try_init(|| async {
                let dir = self.config.work_dir.display().to_string();
                let out = self
                    .run(Command::new("mkdir").args(["-p", "--", &dir]))
                    .await?;
                if out.success() {
                    Ok(())
                } else {
                    Err(AdapterError::Unavailable(format!(
                        "cannot create the work dir {dir}: {}",
                        out.stderr.trim()
                    )))
                }
            })
            .await
            .map(|_| ())
    }

    /// The last [`LOG_CAP_BYTES`] of one output file; empty when it does not exist.
    async fn read_capped(&self, path: &str) -> Result<String, AdapterError> {
        let script =
            format!("[ -e \"$1\" ] || exit 3; wc -c < \"$1\"; exec tail -c {LOG_CAP_BYTES} \"$1\"");
        let out = self
            .run(Command::new("sh").args(["-c", &script, "sh", path]))
            .await?;
        match out.code {
            Some(0) => {}
            Some(3) => return Ok(String::new()),
            _ => {
                return Err(AdapterError::Unavailable(format!(
                    "cannot read {path}: {}",
                    out.stderr.trim()
                )))
            }
        }
        let (size, text) = out.stdout.split_once('\n').unwrap_or(("0", ""));
        let size: u64 = size.trim().parse().unwrap_or(0);
        if size > LOG_CAP_BYTES {
            return Ok(format!(
                "[{} earlier bytes left out; the whole output is in {path}]\n{text}",
                size - LOG_CAP_BYTES
            ));
        }
        Ok(text.to_string())
    }
}

#[async_trait]
impl SiteAdapter for SlurmAdapter {
    fn kind(&self) -> &'static str {
        "slurm"
    }

    async fn submit(&self, job: &JobRequest) -> Result<BackendJobId, AdapterError> {
        // Decided before anything is locked or sent: what can never run here.
        let plan = script::plan(job, &self.config)?;
        let _lock = SubmitLock::acquire(&self.config.lock_dir(), job.job_id)
            .await
            .map_err(|e| AdapterError::Unavailable(format!("submit lock: {e}")))?;
        let tag = script::tag(job.job_id);
        let found = match &self.backend {
            Backend::Cli(cli) => cli.find(&tag, Some(&plan.name)).await?,
            Backend::Rest(rest) => rest.find(&tag, Some(&plan.name)).await?,
        };
        if let Some(id) = found {
            tracing::debug!(job = %job.job_id, slurm_job = %id, "already submitted");
            return Ok(id);
        }
        self.ensure_work_dir().await?;
        match &self.backend {
            Backend::Cli(cli) => cli.submit(&plan).await,
            Backend::Rest(rest) => rest.submit(&plan).await,
        }
    }

    fn array_limit(&self) -> Option<u32> {
        (self.config.max_array_size > 1).then_some(self.config.max_array_size)
    }

    /// The shared `volume_root`, when the site is driven from this machine (over SSH the
    /// data mover cannot reach it).
    fn volume_root(&self) -> Option<std::path::PathBuf> {
        match self.config.ssh {
            None => self.config.volume_root.clone(),
            Some(_) => None,
        }
    }

    /// One `sbatch --array=…%cap` tagged with the batch; each task's id is
    /// `<array job>_<index>`, which every Slurm command takes.
    async fn submit_array(&self, array: &ArrayRequest) -> Result<Vec<BackendJobId>, AdapterError> {
        let planned = script::array_plan(array, &self.config)?;
        let _lock = SubmitLock::acquire(&self.config.lock_dir(), array.batch_id)
            .await
            .map_err(|e| AdapterError::Unavailable(format!("submit lock: {e}")))?;
        let found = match &self.backend {
            Backend::Cli(cli) => {
                cli.find_array(&planned.plan.comment, &planned.plan.name)
                    .await?
            }
            Backend::Rest(rest) => {
                rest.find(&planned.plan.comment, Some(&planned.plan.name))
                    .await?
            }
        };
        let array_job = match found {
            Some(id) => {
                tracing::debug!(batch = %array.batch_id, slurm_job = %id, "array already submitted");
                id
            }
            None => {
                self.ensure_work_dir().await?;
                match &self.backend {
                    Backend::Cli(cli) => cli.submit(&planned.plan).await?,
                    Backend::Rest(rest) => rest.submit(&planned.plan).await?,
                }
            }
        };
        let sid = SlurmId::from_backend(&array_job)?;
        let job = sid.job.split('_').next().unwrap_or(&sid.job).to_string();
        Ok(planned
            .indices
            .iter()
            .map(|i| {
                let task = SlurmId {
                    job: format!("{job}_{i}"),
                    cluster: sid.cluster.clone(),
                };
                BackendJobId(task.to_string())
            })
            .collect())
    }

    async fn find(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError> {
        let tag = script::tag(job_id);
        match &self.backend {
            Backend::Cli(cli) => cli.find(&tag, None).await,
            Backend::Rest(rest) => rest.find(&tag, None).await,
        }
    }

    async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        match &self.backend {
            Backend::Cli(cli) => cli.status(id).await,
            Backend::Rest(rest) => rest.status(id).await,
        }
    }

    /// An array's waiting and running tasks in one call per array; the rest alone.
    async fn status_all(&self, ids: &[BackendJobId]) -> Vec<Result<JobReport, AdapterError>> {
        let known = match &self.backend {
            Backend::Cli(cli) => cli.array_statuses(ids).await,
            Backend::Rest(rest) => rest.array_statuses(ids).await,
        };
        let mut all = Vec::with_capacity(ids.len());
        for (id, known) in ids.iter().zip(known) {
            all.push(match known {
                Some(report) => Ok(report),
                None => self.status(id).await,
            });
        }
        all
    }

    async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        match &self.backend {
            Backend::Cli(cli) => cli.cancel(id).await,
            Backend::Rest(rest) => rest.cancel(id).await,
        }
    }

    async fn logs(&self, id: &BackendJobId) -> Result<Logs, AdapterError> {
        let sid = SlurmId::from_backend(id)?;
        // Unknown jobs are an error, not empty logs.
        self.status(id).await?;
        let path = |stream| {
            script::output_path(&self.config.work_dir, &sid.job, stream)
                .display()
                .to_string()
        };
        Ok(Logs {
            stdout: self.read_capped(&path("out")).await?,
            stderr: self.read_capped(&path("err")).await?,
        })
    }

    async fn capacity(&self) -> Result<Capacity, AdapterError> {
        Ok(match &self.backend {
            Backend::Cli(cli) => cli.capacity().await,
            Backend::Rest(rest) => rest.capacity().await,
        })
    }
}
