//! The local site: runs each Meridian job as a process on this machine (or in a podman or
//! apptainer container) and keeps every job's state in plain files under one directory, so
//! that a restarted adapter on the same directory reports, finishes and polices the jobs
//! the previous one started. It is the embedded default site of `meridian up` and a real
//! site for small on-prem use. Linux only (it reads `/proc`).
//!
//! The backend id of a job is its Meridian job id: stable, and the job directory's name.
//! `docs/site-local.md` describes the state directory, restarts and the limits.

pub mod gpu;
mod jobdir;
mod launch;
mod process;

use meridian_adapter_core::seconds;
use std::collections::{BTreeSet, HashMap};
use std::fs::{self, OpenOptions};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::{SecondsFormat, Utc};
use meridian_adapter_core::gpu::DeviceStatus;
use meridian_adapter_core::{
    AdapterError, BackendJobId, Capacity, JobReport, JobRequest, JobState, Logs, SiteAdapter,
};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::process::Child;
use tokio::sync::watch;
use uuid::Uuid;

use jobdir::{JobDir, Outcome, OutcomeKind, Snapshot};
use process::Identity;

pub use launch::{ContainerRuntime, NO_CONTAINER_RUNTIME};

/// The local kind in the adapter registry. A configuration that names no `root` keeps
/// its jobs in the state directory the binary gives.
pub const REGISTRATION: meridian_adapter_core::Registration = meridian_adapter_core::Registration {
    kind: "local",
    about: "processes (or podman/apptainer containers) on this machine",
    needs_config: false,
    build: |text, context| {
        let mut config: LocalConfig = meridian_adapter_core::registry::parse_config(text)?;
        if config.root == LocalConfig::default().root {
            config.root = context.state_dir.clone();
        }
        Ok(std::sync::Arc::new(LocalAdapter::new(config)?))
    },
};

/// The most of each of stdout and stderr that [`SiteAdapter::logs`] returns: the last
/// 1 MiB, after a line saying how much was left out. The files themselves are kept whole.
pub const LOG_CAP_BYTES: u64 = 1 << 20;

/// How often a job is looked at when nothing wakes its watcher sooner.
const POLL: Duration = Duration::from_secs(1);

/// Half-made job directories older than this are debris of a crashed submit.
const STAGING_DEBRIS_AGE: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LocalConfig {
    /// The state directory, e.g. `meridian-data/sites/local`.
    pub root: PathBuf,
    /// CPUs the site offers; jobs asking for more are rejected.
    pub cpus: u32,
    /// Memory the site offers; jobs asking for more are rejected.
    pub memory_bytes: u64,
    /// What runs jobs that name an image: `"detect"` (podman, else apptainer), `"none"`,
    /// `{podman = "/path"}` or `{apptainer = "/path"}`.
    pub container_runtime: ContainerRuntime,
    /// How long a cancelled or timed-out job has between SIGTERM and SIGKILL (seconds in a
    /// config file).
    #[serde(with = "seconds")]
    pub kill_grace: Duration,
    /// Find this machine's GPUs with `nvidia-smi` and `amd-smi` when the adapter starts
    /// (unless `gpus` lists them).
    pub discover_gpus: bool,
    /// The GPUs the site hands out, each to one job at a time.
    pub gpus: Vec<gpu::Device>,
}

impl LocalConfig {
    /// This machine's CPUs and memory, the runtime detected, state under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalConfig {
            root: root.into(),
            cpus: std::thread::available_parallelism()
                .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
                .unwrap_or(1),
            memory_bytes: mem_total().unwrap_or(0),
            container_runtime: ContainerRuntime::Detect,
            kill_grace: Duration::from_secs(5),
            discover_gpus: true,
            gpus: Vec::new(),
        }
    }
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig::new("meridian-data/sites/local")
    }
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
fn mem_total() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What a job not yet ended holds of the site.
#[derive(Debug, Clone, Default)]
struct Hold {
    cpus: u32,
    memory_bytes: u64,
    /// The UUIDs of its GPUs.
    gpus: Vec<String>,
}

/// The local site adapter. Creating one (with [`LocalAdapter::new`]) reconciles: every
/// job under the root that has not ended gets a watcher again, which reports its end,
/// frees its capacity, and kills it at its walltime. Dropping the adapter stops its
/// watchers but never its jobs.
pub struct LocalAdapter {
    inner: Arc<Inner>,
    /// Dropping it tells the watchers to stop.
    _shutdown: watch::Sender<()>,
}

struct Inner {
    config: LocalConfig,
    jobs: PathBuf,
    staging: PathBuf,
    /// Jobs not yet ended that this instance watches (or is starting), with what they hold.
    active: Mutex<HashMap<Uuid, Hold>>,
    /// The GPUs found so far: those at start, and any a later look found. A device no
    /// longer found stays, reported at fault, so it is cordoned rather than forgotten.
    gpus: RwLock<Vec<gpu::Device>>,
    /// Devices (UUIDs) that get no new work: the log's cordons, as the runner says.
    cordoned: RwLock<BTreeSet<String>>,
    /// Whether the GPUs were found by the tools (looked for again at each health check),
    /// not listed in the config.
    rediscover: bool,
    /// What the health check could not read, said once each.
    health_notes: Mutex<BTreeSet<String>>,
    shutdown: watch::Receiver<()>,
}

impl LocalAdapter {
    /// Opens (creating if needed) the state directory and adopts the jobs in it that have
    /// not ended. Must be called within a tokio runtime: the watchers are tasks on it.
    pub fn new(mut config: LocalConfig) -> Result<Self, AdapterError> {
        tokio::runtime::Handle::try_current().map_err(|_| {
            AdapterError::Unavailable(
                "the local adapter must be created inside a tokio runtime".into(),
            )
        })?;
        // Jobs run with their own directory as the working directory, and the wrapper
        // writes its files by path: a relative root would point somewhere else there.
        fs::create_dir_all(&config.root)?;
        config.root = fs::canonicalize(&config.root)?;
        let jobs = config.root.join("jobs");
        let staging = config.root.join("staging");
        fs::create_dir_all(&jobs)?;
        fs::create_dir_all(&staging)?;
        clear_debris(&staging);
        let rediscover = config.discover_gpus && config.gpus.is_empty();
        if rediscover {
            let found = gpu::discover();
            for note in &found.notes {
                tracing::info!(note, "GPU discovery");
            }
            config.gpus = found.devices;
        }
        for d in &config.gpus {
            tracing::info!(
                vendor = d.vendor,
                model = d.model,
                uuid = d.uuid,
                memory_bytes = d.memory_bytes,
                "local GPU"
            );
        }
        let (tx, rx) = watch::channel(());
        let inner = Arc::new(Inner {
            gpus: RwLock::new(config.gpus.clone()),
            cordoned: RwLock::new(BTreeSet::new()),
            rediscover,
            health_notes: Mutex::new(BTreeSet::new()),
            config,
            jobs,
            staging,
            active: Mutex::new(HashMap::new()),
            shutdown: rx,
        });
        let mut adopted = 0;
        for entry in fs::read_dir(&inner.jobs)? {
            let entry = entry?;
            let Some(job_id) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let dir = inner.dir(job_id);
            if dir.is_finished() {
                continue;
            }
            match dir.snapshot() {
                Ok(snapshot) if !snapshot.state.is_terminal() => {
                    inner.watch(job_id, &snapshot.request, None);
                    adopted += 1;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(job = %job_id, error = %e, "cannot read job; not adopted"),
            }
        }
        tracing::info!(root = %inner.config.root.display(), adopted, "local site ready");
        Ok(LocalAdapter {
            inner,
            _shutdown: tx,
        })
    }

    pub fn config(&self) -> &LocalConfig {
        &self.inner.config
    }

    /// The directory of a job, e.g. to find its `stdout` or `stderr` in full.
    pub fn job_dir(&self, job_id: Uuid) -> PathBuf {
        self.inner.dir(job_id).path().to_path_buf()
    }

    /// What can never run here, whatever the moment: decided before anything is written.
    fn validate(&self, job: &JobRequest) -> Result<(), AdapterError> {
        let config = &self.inner.config;
        let r = &job.resources;
        let reject = |why: String| Err(AdapterError::Rejected(why));
        if let Some(g) = r.gpus.as_ref().filter(|g| g.count > 0) {
            let devices = self.inner.gpus.read().expect("lock").clone();
            let cordoned: Vec<String> = self
                .inner
                .cordoned
                .read()
                .expect("lock")
                .iter()
                .cloned()
                .collect();
            let wanted = format!(
                "{} {} GPU(s){}",
                g.count,
                g.vendor,
                g.model
                    .as_deref()
                    .map(|m| format!(" of model {m}"))
                    .unwrap_or_default()
            );
            let fits = gpu::pick(&devices, &[], g.count, &g.vendor, g.model.as_deref()).is_some();
            // Refused, not rejected: another site may run it, or this one once an admin
            // gives the devices back (placement may not have seen the cordon yet).
            if fits
                && gpu::pick(&devices, &cordoned, g.count, &g.vendor, g.model.as_deref()).is_none()
            {
                return Err(AdapterError::Refused(format!(
                    "{wanted} requested; the local site's that fit are cordoned ({})",
                    cordoned.join(", ")
                )));
            }
            if !fits {
                let have: Vec<String> = devices
                    .iter()
                    .map(|d| format!("{} {}", d.vendor, d.model))
                    .collect();
                return reject(format!(
                    "{wanted} requested; the local site has {}",
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    }
                ));
            }
        }
        if r.nodes > 1 {
            return reject(format!("the local site is one node; {} requested", r.nodes));
        }
        if r.cpus > config.cpus {
            return reject(format!(
                "{} cpus requested; the local site has {}",
                r.cpus, config.cpus
            ));
        }
        if r.memory_bytes > config.memory_bytes {
            return reject(format!(
                "{} bytes of memory requested; the local site has {}",
                r.memory_bytes, config.memory_bytes
            ));
        }
        if let Err(why) = job.check() {
            return reject(why);
        }
        if let Some(service) = &job.service {
            if service.min_replicas > 1 {
                return reject(format!(
                    "the local site runs one replica of a service (all would share port {}); {} requested",
                    service.port, service.min_replicas
                ));
            }
        }
        let nul = |s: &String| s.contains('\0');
        if job.command.iter().any(nul)
            || job.env.values().any(nul)
            || job.cwd.as_ref().is_some_and(nul)
        {
            return reject("the command, env and cwd cannot contain NUL bytes".into());
        }
        Ok(())
    }

    /// Sets aside the GPUs `job` asks for, with its CPUs and memory, before its directory
    /// is made: `Busy` when the devices it can use are all held by running jobs now.
    fn reserve(&self, job: &JobRequest) -> Result<Vec<gpu::Device>, AdapterError> {
        let r = &job.resources;
        let mut active = self.inner.active.lock().expect("lock");
        let devices = match r.gpus.as_ref().filter(|g| g.count > 0) {
            None => Vec::new(),
            Some(g) => {
                let cordoned = self.inner.cordoned.read().expect("lock").clone();
                let devices = self.inner.gpus.read().expect("lock");
                // Held by running jobs, or cordoned: no new work.
                let pick = |active: &HashMap<Uuid, Hold>| {
                    let mut taken: Vec<String> =
                        active.values().flat_map(|h| h.gpus.clone()).collect();
                    taken.extend(cordoned.iter().cloned());
                    gpu::pick(&devices, &taken, g.count, &g.vendor, g.model.as_deref())
                        .map(|picked| picked.into_iter().cloned().collect::<Vec<_>>())
                };
                let mut picked = pick(&active);
                if picked.is_none() {
                    // A job that has ended frees its devices now, not when its watcher
                    // next looks (up to a second later): its state on disk says so.
                    active.retain(|id, hold| {
                        hold.gpus.is_empty()
                            || !self
                                .inner
                                .dir(*id)
                                .snapshot()
                                .is_ok_and(|s| s.state.is_terminal())
                    });
                    picked = pick(&active);
                }
                picked.ok_or_else(|| {
                    AdapterError::Busy(format!(
                        "the local site's GPUs that fit ({} {}{}) are in use by other jobs",
                        g.count,
                        g.vendor,
                        g.model
                            .as_deref()
                            .map(|m| format!(" {m}"))
                            .unwrap_or_default()
                    ))
                })?
            }
        };
        active.entry(job.job_id).or_insert_with(|| Hold {
            cpus: r.cpus,
            memory_bytes: r.memory_bytes,
            gpus: devices.iter().map(|d| d.uuid.clone()).collect(),
        });
        Ok(devices)
    }

    /// Claims the job directory: builds it in staging and renames it into place, so a job
    /// directory is never half-made and exactly one of racing submits wins. Returns the
    /// submit lock, held until the job is started; `None` when the job already existed.
    fn claim(
        &self,
        job: &JobRequest,
        dir: &JobDir,
        devices: &[gpu::Device],
    ) -> Result<Option<fs::File>, AdapterError> {
        let staging = self
            .inner
            .staging
            .join(format!("{}.{}", job.job_id, Uuid::now_v7()));
        let built = (|| -> std::io::Result<fs::File> {
            // Private: the request, the env file and the output may hold secrets.
            fs::DirBuilder::new().mode(0o700).create(&staging)?;
            jobdir::write_atomic(
                &staging,
                jobdir::REQUEST,
                &serde_json::to_vec_pretty(job).expect("request serializes"),
            )?;
            if !devices.is_empty() {
                jobdir::write_atomic(
                    &staging,
                    jobdir::DEVICES,
                    &serde_json::to_vec_pretty(devices).expect("devices serialize"),
                )?;
            }
            let lock = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(staging.join(jobdir::SUBMIT_LOCK))?;
            process::lock_exclusive(&lock)?;
            for name in [jobdir::STDOUT, jobdir::STDERR] {
                fs::File::create(staging.join(name))?;
            }
            fs::rename(&staging, dir.path())?;
            Ok(lock)
        })();
        match built {
            Ok(lock) => Ok(Some(lock)),
            Err(e) => {
                let _ = fs::remove_dir_all(&staging);
                if dir.exists() {
                    Ok(None)
                } else {
                    Err(e.into())
                }
            }
        }
    }
}

impl Drop for LocalAdapter {
    fn drop(&mut self) {
        tracing::debug!(root = %self.inner.config.root.display(), "local site closing; jobs keep running");
    }
}

/// Removes half-made job directories left by submits that crashed long ago.
fn clear_debris(staging: &Path) {
    let Ok(entries) = fs::read_dir(staging) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age > STAGING_DEBRIS_AGE);
        if old {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

fn parse_id(id: &BackendJobId) -> Result<Uuid, AdapterError> {
    id.0.parse()
        .map_err(|_| AdapterError::UnknownJob(id.0.clone()))
}

fn unavailable(job_id: Uuid, e: std::io::Error) -> AdapterError {
    AdapterError::Unavailable(format!("job {job_id}: {e}"))
}

impl Inner {
    /// The devices with their health: found again when the tools found them at start
    /// (a new one joins; one no longer found is at fault), then each one's signals read.
    fn look_at_devices(&self) -> Vec<DeviceStatus> {
        let mut missing = BTreeSet::new();
        if self.rediscover {
            let found = gpu::discover();
            let mut gpus = self.gpus.write().expect("lock");
            for d in &found.devices {
                if !gpus.iter().any(|g| g.uuid == d.uuid) {
                    tracing::info!(
                        vendor = d.vendor,
                        model = d.model,
                        uuid = d.uuid,
                        "local GPU found"
                    );
                    gpus.push(d.clone());
                }
            }
            // Only a tool that answered can say a device is gone: one that failed (a
            // driver's hiccup) says nothing of its devices.
            for g in gpus.iter() {
                if found.answered.contains(&g.vendor)
                    && !found.devices.iter().any(|d| d.uuid == g.uuid)
                {
                    missing.insert(g.uuid.clone());
                }
            }
        }
        let gpus = self.gpus.read().expect("lock").clone();
        let (mut faults, notes) = gpu::health(&gpus);
        let mut said = self.health_notes.lock().expect("lock");
        for note in notes {
            // Once each: the check runs every half minute.
            if said.insert(note.clone()) {
                tracing::warn!(note, "GPU health signals could not be read");
            }
        }
        drop(said);
        for uuid in missing {
            faults.entry(uuid).or_insert_with(|| {
                "no longer found by its vendor's tool (fallen off the bus, or its driver is gone)"
                    .to_string()
            });
        }
        gpus.into_iter()
            .map(|d| DeviceStatus {
                fault: faults.remove(&d.uuid),
                id: d.uuid,
                vendor: d.vendor,
                model: d.model,
                memory_bytes: d.memory_bytes,
            })
            .collect()
    }

    fn dir(&self, job_id: Uuid) -> JobDir {
        JobDir::new(self.jobs.join(job_id.to_string()))
    }

    fn existing(&self, id: &BackendJobId) -> Result<(Uuid, JobDir), AdapterError> {
        let job_id = parse_id(id)?;
        let dir = self.dir(job_id);
        if dir.exists() {
            Ok((job_id, dir))
        } else {
            Err(AdapterError::UnknownJob(id.0.clone()))
        }
    }

    /// Starts a watcher for a job that has not ended; `child` when this instance started it.
    fn watch(self: &Arc<Self>, job_id: Uuid, request: &JobRequest, child: Option<Child>) {
        let hold = Hold {
            cpus: request.resources.cpus,
            memory_bytes: request.resources.memory_bytes,
            gpus: match self.dir(job_id).devices() {
                Ok(devices) => devices.into_iter().map(|d| d.uuid).collect(),
                // Its GPUs may then go to another job while it runs: said loudly.
                Err(e) => {
                    tracing::error!(job = %job_id, error = %e, "cannot read the GPUs the job holds; they count as free");
                    Vec::new()
                }
            },
        };
        self.active.lock().expect("lock").insert(job_id, hold);
        let inner = self.clone();
        tokio::spawn(async move { inner.watcher(job_id, child).await });
    }

    /// Follows one job until it ends: reaps its process, kills it at its walltime, and
    /// frees its capacity. Stops early (leaving the job alone) when the adapter is dropped.
    async fn watcher(self: Arc<Self>, job_id: Uuid, mut child: Option<Child>) {
        let dir = self.dir(job_id);
        let mut shutdown = self.shutdown.clone();
        loop {
            let snapshot = match dir.snapshot() {
                Ok(snapshot) => snapshot,
                Err(e) => {
                    tracing::warn!(job = %job_id, error = %e, "cannot read job state");
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(POLL) => continue,
                    }
                }
            };
            if snapshot.state.is_terminal() {
                break;
            }
            let now = Utc::now();
            let mut nap = POLL;
            if let Some(deadline) = snapshot.deadline() {
                if now >= deadline {
                    self.time_out(job_id, &dir, &snapshot).await;
                    nap = Duration::from_millis(100);
                } else {
                    nap = nap.min((deadline - now).to_std().unwrap_or_default());
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = reap(&mut child) => child = None,
                _ = tokio::time::sleep(nap) => {}
            }
        }
        self.active.lock().expect("lock").remove(&job_id);
        tracing::debug!(job = %job_id, "job ended");
        // It has ended as far as its state goes; its wrapper may still be dying.
        if let Some(mut child) = child {
            tokio::select! {
                _ = shutdown.changed() => {}
                _ = child.wait() => {}
            }
        }
    }

    async fn time_out(&self, job_id: Uuid, dir: &JobDir, snapshot: &Snapshot) {
        let walltime = snapshot.request.resources.walltime;
        let message = format!("killed at its walltime of {walltime:?}");
        match dir.publish_outcome(&Outcome::now(OutcomeKind::Timeout, Some(message.clone()))) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::error!(job = %job_id, error = %e, "cannot record the walltime kill");
                return;
            }
        }
        tracing::info!(job = %job_id, ?walltime, "walltime exceeded; killing the job");
        self.kill(dir, snapshot.identity.as_ref()).await;
        dir.note_stderr(&message);
        if let Err(e) = dir.set_outcome_ended(Utc::now()) {
            tracing::warn!(job = %job_id, error = %e, "cannot record when the job ended");
        }
    }

    /// Stops a job's processes: its process group, then its container if podman runs it.
    async fn kill(&self, dir: &JobDir, identity: Option<&Identity>) {
        // Only a group whose leader is still our process: its pid may name a stranger now.
        if let Some(identity) = identity.filter(|i| i.is_alive()) {
            process::kill_group(identity.pid, self.config.kill_grace).await;
        }
        if let Ok(Some(launch)) = dir.launch() {
            if let (Some(container), Some(podman)) = (&launch.container, launch.argv.first()) {
                // A killed podman client leaves its container running under conmon.
                let rm = tokio::process::Command::new(podman)
                    .args(["rm", "--force", "--ignore", container])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status();
                match tokio::time::timeout(Duration::from_secs(60), rm).await {
                    Ok(Ok(status)) if status.success() => {}
                    outcome => tracing::warn!(container, ?outcome, "podman rm failed"),
                }
            }
        }
    }

    /// Starts the claimed job. `Ok(None)` when it was refused or cancelled before it ran;
    /// `Err` when the site failed to start it.
    async fn start(
        &self,
        job: &JobRequest,
        dir: &JobDir,
        devices: &[gpu::Device],
    ) -> std::io::Result<Option<Child>> {
        let plan = match launch::plan(job, dir.path(), &self.config.container_runtime, devices) {
            Ok(plan) => plan,
            Err(why) => {
                tracing::info!(job = %job.job_id, why, "job refused");
                dir.note_stderr(&why);
                dir.publish_outcome(&Outcome::now(OutcomeKind::Refused, Some(why)))?;
                return Ok(None);
            }
        };
        if let Some(env_file) = &plan.env_file {
            dir.write_atomic(launch::CONTAINER_ENV, env_file.as_bytes())?;
        }
        dir.write_atomic(
            jobdir::LAUNCH,
            &serde_json::to_vec_pretty(&plan.launch).expect("launch serializes"),
        )?;
        let output = |name| OpenOptions::new().append(true).open(dir.file(name));
        let mut child = launch::command(
            &plan,
            dir.path(),
            output(jobdir::STDOUT)?,
            output(jobdir::STDERR)?,
            job.service.as_ref().map(|s| s.max_restarts),
        )
        .spawn()?;
        let pid = child.id().expect("a child not yet waited for has a pid");
        let recorded = (|| -> std::io::Result<()> {
            let identity = Identity::of(pid)?;
            dir.write_atomic(
                jobdir::PID_IDENTITY,
                &serde_json::to_vec(&identity).expect("serializes"),
            )?;
            dir.write_atomic(jobdir::PID, format!("{pid}\n").as_bytes())?;
            if dir.outcome()?.is_some() {
                return Err(std::io::Error::other("cancelled while starting"));
            }
            dir.write_atomic(
                jobdir::STARTED_AT,
                format!(
                    "{}\n",
                    Utc::now().to_rfc3339_opts(SecondsFormat::AutoSi, true)
                )
                .as_bytes(),
            )
        })();
        let go = match recorded {
            Ok(()) => {
                let mut stdin = child.stdin.take().expect("stdin is piped");
                stdin.write_all(b"go\n").await
            }
            Err(e) => Err(e),
        };
        // Without `go` (stdin closed unread) the wrapper exits without running anything.
        drop(child.stdin.take());
        if let Err(e) = go {
            tokio::spawn(async move { child.wait().await });
            if dir.outcome()?.is_some() {
                return Ok(None);
            }
            return Err(e);
        }
        // The program only: arguments may carry secrets.
        tracing::info!(job = %job.job_id, pid, program = %plan.launch.argv[0], "job started");
        Ok(Some(child))
    }
}

/// Waits for `child` to exit and reaps it; never returns when there is none.
async fn reap(child: &mut Option<Child>) {
    match child {
        Some(child) => {
            let _ = child.wait().await;
        }
        None => std::future::pending().await,
    }
}

#[async_trait]
impl SiteAdapter for LocalAdapter {
    fn kind(&self) -> &'static str {
        "local"
    }

    /// Runs `job` unless its directory exists: then returns its id and runs nothing. A job
    /// the site cannot start (no container runtime, missing cwd, unknown command) is
    /// accepted and fails as `Refused`; one that can never fit here is `Rejected`.
    async fn submit(&self, job: &JobRequest) -> Result<BackendJobId, AdapterError> {
        let id = BackendJobId(job.job_id.to_string());
        let dir = self.inner.dir(job.job_id);
        if dir.exists() {
            if dir.request().ok().as_ref() != Some(job) {
                tracing::warn!(job = %job.job_id, "resubmitted with a different request; keeping the first");
            }
            return Ok(id);
        }
        self.validate(job)?;
        let devices = self.reserve(job)?;
        let release = || {
            self.inner.active.lock().expect("lock").remove(&job.job_id);
        };
        let lock = match self.claim(job, &dir, &devices) {
            Ok(Some(lock)) => lock,
            Ok(None) => return Ok(id),
            Err(e) => {
                release();
                return Err(e);
            }
        };
        match self.inner.start(job, &dir, &devices).await {
            Ok(child) => {
                if child.is_some() {
                    self.inner.watch(job.job_id, job, child);
                } else {
                    release();
                }
            }
            Err(e) => {
                release();
                tracing::error!(job = %job.job_id, error = %e, "could not start the job");
                dir.note_stderr(&format!("could not start: {e}"));
                if let Err(e) = dir
                    .publish_outcome(&Outcome::now(OutcomeKind::BootFailure, Some(e.to_string())))
                {
                    // Without an outcome it reads as lost once the lock is released.
                    tracing::error!(job = %job.job_id, error = %e, "cannot record the failed start");
                }
            }
        }
        drop(lock);
        Ok(id)
    }

    async fn find(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError> {
        Ok(self
            .inner
            .dir(job_id)
            .exists()
            .then(|| BackendJobId(job_id.to_string())))
    }

    async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        let (job_id, dir) = self.inner.existing(id)?;
        let snapshot = dir.snapshot().map_err(|e| unavailable(job_id, e))?;
        // Everything runs here: a service answers on this host.
        let host = (snapshot.request.service.is_some()
            && matches!(snapshot.state, JobState::Running { .. }))
        .then(|| "127.0.0.1".to_string());
        Ok(JobReport {
            address: None,
            host,
            backend_id: id.clone(),
            state: snapshot.state,
            usage: snapshot.usage,
            waiting: None,
        })
    }

    /// Publishes the cancellation, then kills the job's process group (SIGTERM, SIGKILL
    /// after `kill_grace`) and returns when it is gone.
    async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        let (job_id, dir) = self.inner.existing(id)?;
        let snapshot = dir.snapshot().map_err(|e| unavailable(job_id, e))?;
        if snapshot.state.is_terminal() {
            return Ok(());
        }
        let cancelled = Outcome::now(OutcomeKind::Cancelled, None);
        if !dir.publish_outcome(&cancelled)? {
            return Ok(()); // another cancel, or the walltime, got there first
        }
        tracing::info!(job = %job_id, "cancelling");
        let mut identity = snapshot.identity;
        if snapshot.state == JobState::Pending {
            // A submit is starting it: it sees the outcome and does not start it, unless it
            // had already said go. Wait for it to finish, then kill what it started.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while dir.submit_in_progress()? && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            identity = dir.identity()?;
        }
        self.inner.kill(&dir, identity.as_ref()).await;
        dir.set_outcome_ended(Utc::now())?;
        Ok(())
    }

    /// The job's stdout and stderr, each capped to its last [`LOG_CAP_BYTES`] (1 MiB).
    async fn logs(&self, id: &BackendJobId) -> Result<Logs, AdapterError> {
        let (job_id, dir) = self.inner.existing(id)?;
        let tail = |name| {
            dir.tail(name, LOG_CAP_BYTES)
                .map_err(|e| unavailable(job_id, e))
        };
        Ok(Logs {
            stdout: tail(jobdir::STDOUT)?,
            stderr: tail(jobdir::STDERR)?,
        })
    }

    /// `<root>/volumes`: this machine writes it, so the data mover fills volumes there.
    fn volume_root(&self) -> Option<PathBuf> {
        Some(self.inner.config.root.join(launch::VOLUMES))
    }

    /// Every job directory whose job has not ended.
    /// Looks for the machine's GPUs again (when they were found by the tools, not
    /// listed) and reads each one's health.
    async fn devices(&self) -> Result<Vec<DeviceStatus>, AdapterError> {
        if self.inner.gpus.read().expect("lock").is_empty() && !self.inner.rediscover {
            return Ok(Vec::new());
        }
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || inner.look_at_devices())
            .await
            .map_err(|e| AdapterError::Unavailable(format!("the device check stopped: {e}")))
    }

    fn cordon(&self, devices: &BTreeSet<String>) {
        let mut cordoned = self.inner.cordoned.write().expect("lock");
        if *cordoned != *devices {
            tracing::info!(cordoned = ?devices, "local GPUs that get no new work");
            cordoned.clone_from(devices);
        }
    }

    async fn owned(&self) -> Result<Vec<Uuid>, AdapterError> {
        let mut owned = Vec::new();
        for entry in fs::read_dir(&self.inner.jobs)? {
            let Some(job_id) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let dir = self.inner.dir(job_id);
            if !dir.is_finished() && dir.snapshot().is_ok_and(|s| !s.state.is_terminal()) {
                owned.push(job_id);
            }
        }
        Ok(owned)
    }

    /// Totals from the config; free is the total less what the running jobs this adapter
    /// watches asked for (and cordoned GPUs). The local site has no queue: `pending` is 0.
    async fn capacity(&self) -> Result<Capacity, AdapterError> {
        let config = &self.inner.config;
        let (held_cpus, held_memory, mut unfree, running) = {
            let active = self.inner.active.lock().expect("lock");
            active.values().fold(
                (0u32, 0u64, BTreeSet::new(), 0usize),
                |(c, m, mut g, n), hold| {
                    g.extend(hold.gpus.iter().cloned());
                    (
                        c.saturating_add(hold.cpus),
                        m.saturating_add(hold.memory_bytes),
                        g,
                        n + 1,
                    )
                },
            )
        };
        unfree.extend(self.inner.cordoned.read().expect("lock").iter().cloned());
        let mut free_gpus_by_model = std::collections::BTreeMap::new();
        for d in self.inner.gpus.read().expect("lock").iter() {
            let free = free_gpus_by_model.entry(d.model.clone()).or_insert(0u32);
            if !unfree.contains(&d.uuid) {
                *free += 1;
            }
        }
        let writable = fs::metadata(&self.inner.jobs)
            .map(|m| m.is_dir() && !m.permissions().readonly())
            .unwrap_or(false);
        Ok(Capacity {
            healthy: writable,
            total_cpus: config.cpus,
            free_cpus: config.cpus.saturating_sub(held_cpus),
            total_memory_bytes: config.memory_bytes,
            free_memory_bytes: config.memory_bytes.saturating_sub(held_memory),
            free_gpus: free_gpus_by_model.values().sum(),
            free_gpus_by_model,
            idle_nodes: u32::from(running == 0),
            pending: 0,
            message: (!writable).then(|| {
                format!(
                    "the state directory {} is not writable",
                    self.inner.jobs.display()
                )
            }),
        })
    }
}
