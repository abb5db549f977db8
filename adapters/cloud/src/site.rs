//! [`CloudSite`]: the [`SiteAdapter`] every cloud provider runs behind, and [`judge`],
//! the pure rule that turns an instance and its run's report into the run's state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use meridian_adapter_core::{
    AdapterError, BackendJobId, Capacity, FailureReason, JobReport, JobRequest, JobState, Logs,
    RunReport, RunReports, ShapeFacts, SiteAdapter, Usage,
};
use meridian_events::vocabulary::BilledInterval;
use uuid::Uuid;

use crate::bootstrap::{self, BootstrapSettings};
use crate::{tags, CloudProvider, Instance, InstanceState, Launch, LifecycleConfig, ProviderError};

/// Why Meridian terminated an instance itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndedBy {
    /// The run was cancelled.
    Cancel,
    /// It ran past its walltime and the grace period.
    Walltime,
    /// Its bootstrap never reported within the boot timeout.
    BootTimeout,
    /// Its run reported its exit and the instance had not powered off yet.
    Exited,
    /// Someone stopped it outside Meridian: it runs nothing and may still bill.
    Stopped,
}

/// What the lifecycle makes of an instance now.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    pub state: JobState,
    /// Why a pending run waits, for `meridian status`.
    pub waiting: Option<String>,
    /// Terminate it now, for this reason.
    pub terminate: Option<EndedBy>,
}

fn chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// The run's state from its instance (as the provider describes it), what the run
/// reported of itself, and what Meridian did to it: pure, so every case is tested.
///
/// A run ends only when its instance has terminated (the bill is launch to terminate);
/// its exit code decides success. An instance gone without an exit report failed for a
/// reason: Meridian's own termination (cancel, walltime, boot timeout), a spot reclaim
/// (a site fault, so the work is placed again), or a node failure.
pub fn judge(
    instance: &Instance,
    report: Option<&RunReport>,
    ended_by: Option<EndedBy>,
    config: &LifecycleConfig,
    now: DateTime<Utc>,
) -> Judgement {
    let started = report.and_then(|r| r.started_at);
    let exit = report.and_then(|r| r.exit_code.map(|code| (code, r.ended_at)));
    let launched = instance.launched_at.unwrap_or(now);
    let walltime = instance
        .tags
        .get(tags::WALLTIME)
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs);
    let pending = |waiting: String, terminate| Judgement {
        state: JobState::Pending,
        waiting: Some(waiting),
        terminate,
    };
    match instance.state {
        InstanceState::Terminated => {
            // Providers give the end to the second; the start is the API's clock, and
            // may fall later within that second. A run never ends before it started.
            let ended_at = instance
                .ended_at
                .unwrap_or(now)
                .max(started.unwrap_or(launched));
            let state = match (exit, ended_by) {
                (Some((0, at)), _) => JobState::Succeeded {
                    started_at: started.unwrap_or(launched),
                    ended_at: at.unwrap_or(ended_at),
                },
                (Some((code, at)), _) => JobState::Failed {
                    started_at: started,
                    ended_at: at.unwrap_or(ended_at),
                    exit_code: Some(code),
                    failure: FailureReason::ExitCode { code },
                },
                (None, Some(EndedBy::Cancel)) => JobState::Cancelled {
                    started_at: started,
                    ended_at,
                },
                (None, Some(EndedBy::Walltime)) => {
                    failed(started, ended_at, FailureReason::Timeout)
                }
                (None, Some(EndedBy::BootTimeout)) => {
                    failed(started, ended_at, FailureReason::BootFailure)
                }
                (None, Some(EndedBy::Stopped)) => {
                    failed(started, ended_at, FailureReason::NodeFailure)
                }
                (None, _) if instance.reclaimed => {
                    failed(started, ended_at, FailureReason::Preempted)
                }
                // After a restart Meridian no longer remembers ending it: the walltime
                // tells a run it stopped at its limit from one that died.
                (None, _)
                    if walltime
                        .is_some_and(|w| ended_at >= started.unwrap_or(launched) + chrono(w)) =>
                {
                    failed(started, ended_at, FailureReason::Timeout)
                }
                (None, _) if started.is_none() => {
                    failed(None, ended_at, FailureReason::BootFailure)
                }
                (None, _) => failed(started, ended_at, FailureReason::NodeFailure),
            };
            Judgement {
                state,
                waiting: None,
                terminate: None,
            }
        }
        InstanceState::Pending => pending(
            format!(
                "instance {} is starting{}",
                instance.id,
                instance
                    .zone
                    .as_deref()
                    .map(|z| format!(" in {z}"))
                    .unwrap_or_default()
            ),
            None,
        ),
        InstanceState::Running
        | InstanceState::Stopping
        | InstanceState::Stopped
        | InstanceState::Terminating => {
            let stopping = instance.state != InstanceState::Running;
            // Exited: the bootstrap powers off; Meridian makes sure.
            if exit.is_some() {
                return Judgement {
                    state: JobState::Running {
                        started_at: started.unwrap_or(launched),
                    },
                    waiting: None,
                    terminate: (instance.state != InstanceState::Terminating)
                        .then_some(ended_by.unwrap_or(EndedBy::Exited)),
                };
            }
            // A stopped instance runs nothing and may still bill: end it.
            let stopped = (instance.state == InstanceState::Stopped)
                .then_some(ended_by.unwrap_or(EndedBy::Stopped));
            match started {
                Some(started_at) => {
                    let over = walltime.is_some_and(|w| {
                        now > started_at + chrono(w) + chrono(config.walltime_grace)
                    });
                    Judgement {
                        state: JobState::Running { started_at },
                        waiting: None,
                        terminate: if over && !stopping {
                            Some(EndedBy::Walltime)
                        } else {
                            stopped
                        },
                    }
                }
                None => {
                    let late = now > launched + chrono(config.boot_timeout);
                    pending(
                        format!(
                            "instance {} is up; its bootstrap has not reported the start yet",
                            instance.id
                        ),
                        if late && !stopping {
                            Some(EndedBy::BootTimeout)
                        } else {
                            stopped
                        },
                    )
                }
            }
        }
    }
}

fn failed(
    started_at: Option<DateTime<Utc>>,
    ended_at: DateTime<Utc>,
    failure: FailureReason,
) -> JobState {
    JobState::Failed {
        started_at,
        ended_at,
        exit_code: None,
        failure,
    }
}

/// What the adapter remembers between calls (lost at a restart, which [`judge`]
/// allows for).
#[derive(Default)]
struct Memory {
    /// Zones that refused for capacity, kept out until then.
    zones_out: HashMap<String, (DateTime<Utc>, String)>,
    /// Instances Meridian terminated, and why.
    ended_by: HashMap<String, EndedBy>,
}

/// A cloud site: the lifecycle over one provider.
pub struct CloudSite<P> {
    provider: Arc<P>,
    config: LifecycleConfig,
    reports: Option<Arc<dyn RunReports>>,
    memory: Mutex<Memory>,
    shapes_at_start: bool,
}

impl<P: CloudProvider> CloudSite<P> {
    /// The site over `provider`. Without `reports` (no store in this process) runs
    /// cannot be followed, and every submission is refused as not supported.
    pub fn new(
        provider: P,
        config: LifecycleConfig,
        reports: Option<Arc<dyn RunReports>>,
    ) -> Result<CloudSite<P>, String> {
        config.check()?;
        Ok(CloudSite {
            provider: Arc::new(provider),
            config,
            reports,
            memory: Mutex::new(Memory::default()),
            shapes_at_start: false,
        })
    }

    /// Refreshes the site's shapes from the provider when the site runner starts.
    pub fn with_shapes_at_start(mut self, refresh: bool) -> CloudSite<P> {
        self.shapes_at_start = refresh;
        self
    }

    pub fn provider(&self) -> &P {
        &self.provider
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The zones not kept out now, in order, and those kept out with why.
    fn zones(&self, now: DateTime<Utc>) -> (Vec<Option<String>>, Vec<String>) {
        let zones = self.provider.zones();
        if zones.is_empty() {
            return (vec![None], Vec::new());
        }
        let mut memory = self.memory();
        memory.zones_out.retain(|_, (until, _)| *until > now);
        let mut open = Vec::new();
        let mut out = Vec::new();
        for zone in zones {
            match memory.zones_out.get(&zone) {
                Some((until, why)) => out.push(format!(
                    "{zone} kept out until {} after {why}",
                    until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )),
                None => open.push(Some(zone)),
            }
        }
        (open, out)
    }

    async fn report_of(&self, job_id: Option<Uuid>) -> Result<Option<RunReport>, AdapterError> {
        match (&self.reports, job_id) {
            (Some(reports), Some(id)) => reports.read(id).await,
            _ => Ok(None),
        }
    }

    async fn instance(&self, id: &BackendJobId) -> Result<Instance, AdapterError> {
        let found = self
            .provider
            .describe(std::slice::from_ref(&id.0))
            .await
            .map_err(unavailable)?
            .into_iter()
            .next();
        match found {
            Some(instance) => Ok(instance),
            None => self
                .vanished(&id.0)
                .await?
                .ok_or_else(|| AdapterError::UnknownJob(id.0.clone())),
        }
    }

    /// An instance the provider no longer lists, whose run reported through the API: gone,
    /// as far as its run's reports tell (a restarted adapter no longer remembers it, and
    /// the provider keeps no trace of a deleted instance). Its bill is what the run
    /// reported: the instance's boot and power-off are not known.
    async fn vanished(&self, id: &str) -> Result<Option<Instance>, AdapterError> {
        let Some(job_id) = self.provider.job_of_instance_id(id) else {
            return Ok(None);
        };
        let Some(report) = self.report_of(Some(job_id)).await? else {
            return Ok(None);
        };
        let Some(started_at) = report.started_at else {
            return Ok(None);
        };
        tracing::info!(instance = id, job = %job_id, "the instance is gone; its run is known from its reports");
        Ok(Some(Instance {
            id: id.to_string(),
            state: InstanceState::Terminated,
            zone: None,
            launched_at: Some(started_at),
            ended_at: report.ended_at,
            reason: None,
            reclaimed: false,
            address: None,
            tags: [
                (tags::MANAGED.to_string(), "true".to_string()),
                (tags::JOB_ID.to_string(), job_id.to_string()),
            ]
            .into_iter()
            .collect(),
        }))
    }

    /// The instance of `job_id` the provider no longer lists, when its run reported.
    async fn vanished_of(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError> {
        let Some(id) = self.provider.instance_id_of(job_id) else {
            return Ok(None);
        };
        Ok(self.vanished(&id).await?.map(|i| BackendJobId(i.id)))
    }

    /// The run's report from its instance and what it reported itself; terminates the
    /// instance when the lifecycle says to.
    async fn report(
        &self,
        id: &BackendJobId,
        instance: &Instance,
    ) -> Result<JobReport, AdapterError> {
        let report = self.report_of(instance.job_id()).await?;
        let ended_by = self.memory().ended_by.get(&instance.id).copied();
        let now = Utc::now();
        let judgement = judge(instance, report.as_ref(), ended_by, &self.config, now);
        if let Some(why) = judgement.terminate {
            if let Err(e) = self.terminate(&instance.id, why).await {
                tracing::warn!(instance = %instance.id, error = %e, "could not terminate; trying again at the next look");
            }
        }
        let billed = instance.launched_at.map(|from| BilledInterval {
            from,
            to: if judgement.state.is_terminal() {
                instance.ended_at.unwrap_or(now)
            } else {
                now
            }
            .max(from),
        });
        Ok(JobReport {
            backend_id: id.clone(),
            state: judgement.state,
            usage: Usage {
                nodes: 1,
                gpu_vendor: instance.tags.get(tags::GPU_VENDOR).cloned(),
                billed,
                ..Usage::default()
            },
            address: None,
            host: instance.address.clone(),
            waiting: judgement.waiting,
        })
    }

    async fn terminate(&self, instance: &str, why: EndedBy) -> Result<(), AdapterError> {
        self.memory()
            .ended_by
            .entry(instance.to_string())
            .or_insert(why);
        tracing::info!(instance, reason = ?why, "terminating the instance");
        self.provider
            .terminate(&[instance.to_string()])
            .await
            .map_err(unavailable)
    }

    fn tags_of(job: &JobRequest, gpu_vendor: Option<&str>) -> Vec<(String, String)> {
        let mut out = vec![
            (tags::MANAGED.to_string(), "true".to_string()),
            (tags::JOB_ID.to_string(), job.job_id.to_string()),
            (tags::WORKFLOW_ID.to_string(), job.workflow_id.to_string()),
            (tags::JOB.to_string(), job.name.clone()),
            (
                tags::WALLTIME.to_string(),
                job.resources.walltime.as_secs().to_string(),
            ),
        ];
        if let Some(tenant) = &job.tenant {
            out.push((tags::TENANT.to_string(), tenant.clone()));
        }
        if let Some(vendor) = gpu_vendor {
            out.push((tags::GPU_VENDOR.to_string(), vendor.to_string()));
        }
        out
    }
}

fn unavailable(e: ProviderError) -> AdapterError {
    match e {
        ProviderError::Rejected(m) => AdapterError::Rejected(m),
        other => AdapterError::Unavailable(other.to_string()),
    }
}

/// The most instances asked of the provider in one describe call (EC2 takes 1,000 ids,
/// the others fewer; every provider pages its answer).
const DESCRIBE_CHUNK: usize = 200;

/// The client token of a launch in `zone`: at most 64 characters, as EC2 allows, and
/// different for every zone (a long zone name keeps its end, where zones differ:
/// `…-AD-1`, `us-east-1a`).
fn client_token(job: Uuid, zone: Option<&str>) -> String {
    let zone: String = zone
        .unwrap_or("any")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    let tail = &zone[zone.len().saturating_sub(20)..];
    format!("meridian-{}-{tail}", job.simple())
}

#[async_trait]
impl<P: CloudProvider> SiteAdapter for CloudSite<P> {
    fn kind(&self) -> &'static str {
        self.provider.kind()
    }

    async fn submit(&self, job: &JobRequest) -> Result<BackendJobId, AdapterError> {
        job.check().map_err(AdapterError::Rejected)?;
        if job.service.is_some() {
            return Err(AdapterError::NotSupported(format!(
                "services at a {} site (run them at a Kubernetes, Slurm or local site)",
                self.kind()
            )));
        }
        if job.resources.nodes > 1 {
            return Err(AdapterError::NotSupported(format!(
                "jobs of more than one node at a {} site",
                self.kind()
            )));
        }
        if self.reports.is_none() {
            return Err(AdapterError::NotSupported(format!(
                "following runs at a {} site from a process without Meridian's store, where instances' reports arrive",
                self.kind()
            )));
        }
        let Some(shape) = &job.shape else {
            return Err(AdapterError::Rejected(
                "no shape was placed: the site's catalogue entry has no shape for the run's offer"
                    .into(),
            ));
        };
        let Some(report_to) = &job.report_to else {
            return Err(AdapterError::NotSupported(format!(
                "runs at a {} site without Meridian's API address and run credentials: instances report there (start the adapter with --server and --credential-key-file, as `meridian up` does)",
                self.kind()
            )));
        };
        // Launched already (a retry, a restart): the same instance, even one gone.
        let mut found = self.provider.find(job.job_id).await.map_err(unavailable)?;
        found.sort_by_key(|i| i.launched_at);
        if let Some(existing) = found.pop() {
            return Ok(BackendJobId(existing.id));
        }
        if let Some(gone) = self.vanished_of(job.job_id).await? {
            return Ok(gone);
        }
        let user_data = bootstrap::script(
            job,
            shape.gpu_vendor.as_deref(),
            report_to,
            &BootstrapSettings {
                work_dir: self.config.work_dir.clone(),
                power_off_command: self.config.power_off_command.clone(),
                container_runtime: self.config.container_runtime.clone(),
                output_every_secs: self.config.output_every_seconds,
            },
        );
        let max = self.provider.max_user_data_bytes();
        if user_data.len() > max {
            return Err(AdapterError::Rejected(format!(
                "the instance's bootstrap is {} bytes, over the {max} a {} instance takes: shorten the job's command or environment",
                user_data.len(),
                self.kind()
            )));
        }
        let tags = Self::tags_of(job, shape.gpu_vendor.as_deref());
        let now = Utc::now();
        let (zones, mut attempts) = self.zones(now);
        if zones.is_empty() {
            return Err(AdapterError::Refused(format!(
                "every zone refused lately: {}",
                attempts.join("; ")
            )));
        }
        for zone in zones {
            let token = client_token(job.job_id, zone.as_deref());
            let launch = Launch {
                job,
                instance_type: &shape.name,
                zone: zone.as_deref(),
                spot: shape.spot,
                user_data: &user_data,
                tags: &tags,
                client_token: &token,
            };
            match self.provider.launch(&launch).await {
                Ok(instance) => {
                    tracing::info!(job = %job.job_id, instance = %instance.id, zone = ?zone, instance_type = %shape.name, spot = shape.spot, "launched");
                    return Ok(BackendJobId(instance.id));
                }
                Err(ProviderError::Capacity { code, message }) => {
                    let zone_name = zone.clone().unwrap_or_else(|| "the region".into());
                    tracing::warn!(job = %job.job_id, zone = %zone_name, %code, %message, "no capacity; trying the next zone");
                    attempts.push(format!("{zone_name}: {code} ({message})"));
                    if let Some(z) = zone {
                        let until = now + chrono(self.config.zone_backoff);
                        self.memory().zones_out.insert(z, (until, code));
                    }
                }
                Err(ProviderError::Quota { code, message }) => {
                    attempts.push(format!(
                        "{}: {code} ({message})",
                        zone.unwrap_or_else(|| "the region".into())
                    ));
                    return Err(AdapterError::Refused(format!(
                        "{} {} refused by the account's limits: {}",
                        shape.name,
                        if shape.spot { "spot" } else { "on-demand" },
                        attempts.join("; ")
                    )));
                }
                Err(ProviderError::Rejected(message)) => {
                    return Err(AdapterError::Rejected(message))
                }
                Err(ProviderError::Unavailable(message)) => {
                    return Err(AdapterError::Unavailable(message))
                }
            }
        }
        Err(AdapterError::Refused(format!(
            "no zone has {} {} capacity: {}",
            shape.name,
            if shape.spot { "spot" } else { "on-demand" },
            attempts.join("; ")
        )))
    }

    async fn find(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError> {
        let mut found = self.provider.find(job_id).await.map_err(unavailable)?;
        // The newest, live ones first.
        found.sort_by_key(|i| (i.state != InstanceState::Terminated, i.launched_at));
        match found.pop() {
            Some(i) => Ok(Some(BackendJobId(i.id))),
            None => self.vanished_of(job_id).await,
        }
    }

    async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        let instance = self.instance(id).await?;
        self.report(id, &instance).await
    }

    /// One DescribeInstances for all of them (in chunks the APIs take), not one each:
    /// the site runner asks every few hundred milliseconds.
    async fn status_all(&self, ids: &[BackendJobId]) -> Vec<Result<JobReport, AdapterError>> {
        let mut known: HashMap<String, Instance> = HashMap::new();
        let mut failed: Option<AdapterError> = None;
        let names: Vec<String> = ids.iter().map(|i| i.0.clone()).collect();
        for chunk in names.chunks(DESCRIBE_CHUNK) {
            match self.provider.describe(chunk).await {
                Ok(found) => known.extend(found.into_iter().map(|i| (i.id.clone(), i))),
                Err(e) => failed = Some(unavailable(e)),
            }
        }
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(match (known.get(&id.0), &failed) {
                (Some(instance), _) => self.report(id, instance).await,
                (None, Some(e)) => Err(AdapterError::Unavailable(e.to_string())),
                (None, None) => match self.vanished(&id.0).await {
                    Ok(Some(gone)) => self.report(id, &gone).await,
                    Ok(None) => Err(AdapterError::UnknownJob(id.0.clone())),
                    Err(e) => Err(e),
                },
            });
        }
        out
    }

    async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        // An instance neither listed nor known from its run's reports is UnknownJob (the
        // site runner takes that as nothing left to cancel); one gone already bills
        // nothing more.
        let instance = self.instance(id).await?;
        if instance.state == InstanceState::Terminated {
            return Ok(());
        }
        self.terminate(&instance.id, EndedBy::Cancel).await
    }

    async fn logs(&self, id: &BackendJobId) -> Result<Logs, AdapterError> {
        let instance = self.instance(id).await?;
        Ok(self
            .report_of(instance.job_id())
            .await?
            .map(|r| r.logs)
            .unwrap_or_default())
    }

    async fn capacity(&self) -> Result<Capacity, AdapterError> {
        let (healthy, message) = match self.provider.check().await {
            Ok(()) => (true, None),
            Err(e) => (false, Some(format!("the {} API: {e}", self.kind()))),
        };
        let pending = if healthy {
            self.provider
                .owned()
                .await
                .map(|all| {
                    all.iter()
                        .filter(|i| i.state == InstanceState::Pending)
                        .count() as u32
                })
                .unwrap_or(0)
        } else {
            0
        };
        Ok(Capacity {
            healthy,
            pending,
            message,
            ..Capacity::default()
        })
    }

    async fn shapes(&self, names: &[String]) -> Result<Vec<ShapeFacts>, AdapterError> {
        self.provider.shapes(names).await.map_err(unavailable)
    }

    fn refresh_shapes_at_start(&self) -> bool {
        self.shapes_at_start
    }

    async fn owned(&self) -> Result<Vec<Uuid>, AdapterError> {
        let owned = self.provider.owned().await.map_err(unavailable)?;
        Ok(owned.iter().filter_map(Instance::job_id).collect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::TimeZone;

    use super::*;

    #[test]
    fn a_client_token_differs_by_zone_and_fits_64_characters() {
        let job = Uuid::now_v7();
        let one = client_token(job, Some("Uocm:EU-FRANKFURT-1-AD-1"));
        let two = client_token(job, Some("Uocm:EU-FRANKFURT-1-AD-2"));
        assert_ne!(one, two);
        assert!(
            one.len() <= 64 && one.ends_with("FRANKFURT-1-AD-1"),
            "{one}"
        );
        assert!(client_token(job, None).ends_with("-any"));
    }

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 10, minute, 0).unwrap()
    }

    /// An instance launched at 10:00 for a run of 10 minutes' walltime.
    fn instance(state: InstanceState) -> Instance {
        Instance {
            id: "i-1".into(),
            state,
            zone: Some("us-east-1a".into()),
            launched_at: Some(at(0)),
            ended_at: (state == InstanceState::Terminated).then(|| at(30)),
            reason: None,
            reclaimed: false,
            address: None,
            tags: BTreeMap::from([(tags::WALLTIME.to_string(), "600".to_string())]),
        }
    }

    fn report(started: Option<u32>, exit: Option<(i32, u32)>) -> RunReport {
        RunReport {
            started_at: started.map(at),
            ended_at: exit.map(|(_, m)| at(m)),
            exit_code: exit.map(|(c, _)| c),
            logs: Logs::default(),
        }
    }

    fn judged(i: &Instance, r: Option<&RunReport>, by: Option<EndedBy>, now: u32) -> Judgement {
        judge(i, r, by, &LifecycleConfig::default(), at(now))
    }

    #[test]
    fn a_booting_instance_waits_and_says_where() {
        let j = judged(&instance(InstanceState::Pending), None, None, 1);
        assert_eq!(j.state, JobState::Pending);
        assert_eq!(
            j.waiting.as_deref(),
            Some("instance i-1 is starting in us-east-1a")
        );
        assert_eq!(j.terminate, None);
    }

    #[test]
    fn a_run_starts_when_its_bootstrap_says_so() {
        let running = instance(InstanceState::Running);
        let j = judged(&running, None, None, 2);
        assert_eq!(j.state, JobState::Pending);
        assert!(j.waiting.unwrap().contains("has not reported"));
        let j = judged(&running, Some(&report(Some(2), None)), None, 3);
        assert_eq!(j.state, JobState::Running { started_at: at(2) });
        assert_eq!(j.terminate, None);
    }

    #[test]
    fn an_exit_reported_ends_the_run_only_once_the_instance_is_gone() {
        let r = report(Some(2), Some((0, 7)));
        let j = judged(&instance(InstanceState::Running), Some(&r), None, 8);
        assert_eq!(j.state, JobState::Running { started_at: at(2) });
        assert_eq!(j.terminate, Some(EndedBy::Exited));
        let j = judged(&instance(InstanceState::Terminated), Some(&r), None, 31);
        assert_eq!(
            j.state,
            JobState::Succeeded {
                started_at: at(2),
                ended_at: at(7)
            }
        );
        let failed = report(Some(2), Some((3, 7)));
        let j = judged(
            &instance(InstanceState::Terminated),
            Some(&failed),
            None,
            31,
        );
        assert!(matches!(
            j.state,
            JobState::Failed {
                exit_code: Some(3),
                failure: FailureReason::ExitCode { code: 3 },
                ..
            }
        ));
    }

    #[test]
    fn walltime_and_grace_past_terminates_and_ends_as_timeout() {
        let r = report(Some(1), None);
        // 10 minutes of walltime and 5 of grace from 10:01: fine at 10:15, over at 10:17.
        assert_eq!(
            judged(&instance(InstanceState::Running), Some(&r), None, 15).terminate,
            None
        );
        let j = judged(&instance(InstanceState::Running), Some(&r), None, 17);
        assert_eq!(j.terminate, Some(EndedBy::Walltime));
        let j = judged(
            &instance(InstanceState::Terminated),
            Some(&r),
            Some(EndedBy::Walltime),
            31,
        );
        assert!(matches!(
            j.state,
            JobState::Failed {
                failure: FailureReason::Timeout,
                ..
            }
        ));
        // After a restart, the walltime tag still tells.
        let j = judged(&instance(InstanceState::Terminated), Some(&r), None, 31);
        assert!(matches!(
            j.state,
            JobState::Failed {
                failure: FailureReason::Timeout,
                ..
            }
        ));
    }

    #[test]
    fn a_bootstrap_that_never_reports_is_a_boot_failure() {
        let j = judged(&instance(InstanceState::Running), None, None, 16);
        assert_eq!(j.terminate, Some(EndedBy::BootTimeout));
        let mut gone = instance(InstanceState::Terminated);
        gone.ended_at = Some(at(5));
        let j = judged(&gone, None, None, 31);
        assert!(matches!(
            j.state,
            JobState::Failed {
                failure: FailureReason::BootFailure,
                ..
            }
        ));
    }

    #[test]
    fn a_spot_reclaim_is_a_site_fault() {
        let mut reclaimed = instance(InstanceState::Terminated);
        reclaimed.ended_at = Some(at(4));
        reclaimed.reclaimed = true;
        let j = judged(&reclaimed, Some(&report(Some(1), None)), None, 31);
        let JobState::Failed { failure, .. } = j.state else {
            panic!("{:?}", j.state)
        };
        assert_eq!(failure, FailureReason::Preempted);
        assert!(failure.is_site_fault());
    }

    #[test]
    fn an_end_the_provider_gives_to_the_second_is_never_before_the_start() {
        let mut reclaimed = instance(InstanceState::Terminated);
        reclaimed.ended_at = Some(at(4));
        reclaimed.reclaimed = true;
        let started = at(4) + chrono::Duration::milliseconds(681);
        let mut report = report(None, None);
        report.started_at = Some(started);
        let j = judged(&reclaimed, Some(&report), None, 5);
        let JobState::Failed {
            started_at,
            ended_at,
            ..
        } = j.state
        else {
            panic!("{:?}", j.state)
        };
        assert_eq!(started_at, Some(started));
        assert_eq!(ended_at, started);
    }

    #[test]
    fn a_cancel_ends_as_cancelled_and_a_died_instance_as_node_failure() {
        let mut gone = instance(InstanceState::Terminated);
        gone.ended_at = Some(at(4));
        let r = report(Some(1), None);
        let j = judged(&gone, Some(&r), Some(EndedBy::Cancel), 31);
        assert_eq!(
            j.state,
            JobState::Cancelled {
                started_at: Some(at(1)),
                ended_at: at(4)
            }
        );
        let j = judged(&gone, Some(&r), None, 31);
        assert!(matches!(
            j.state,
            JobState::Failed {
                failure: FailureReason::NodeFailure,
                ..
            }
        ));
    }

    #[test]
    fn a_stopped_instance_is_terminated() {
        let j = judged(
            &instance(InstanceState::Stopped),
            Some(&report(Some(1), None)),
            None,
            3,
        );
        assert_eq!(j.terminate, Some(EndedBy::Stopped));
        let gone = instance(InstanceState::Terminated);
        let j = judged(
            &gone,
            Some(&report(Some(1), None)),
            Some(EndedBy::Stopped),
            31,
        );
        assert!(matches!(
            j.state,
            JobState::Failed {
                failure: FailureReason::NodeFailure,
                ..
            }
        ));
    }
}
