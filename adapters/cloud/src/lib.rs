//! The cloud VM lifecycle every cloud site shares. A provider ([`CloudProvider`]) is only
//! its API calls: launch, describe, find by Meridian's tags, terminate. [`CloudSite`]
//! builds the rest on it once: one instance of the placed shape per run, launched
//! idempotently (a client token, and a look-up by tag first) with a [`bootstrap`] that
//! runs the job and reports its start, output and exit code through Meridian's API;
//! followed by the provider's API and that report; terminated at cancel, at walltime
//! plus a grace period, and when it leaks; capacity refusals fail over to the next zone
//! (the refusing one is kept out for a backoff) and then back to placement; a spot
//! reclaim is a site fault. The bill is the instance's life, launch to terminate.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use meridian_adapter_core::{JobRequest, ShapeFacts};
use serde::Deserialize;
use uuid::Uuid;

pub mod bootstrap;
pub mod config;
mod site;
pub mod testing;

pub use site::{judge, CloudSite, EndedBy, Judgement};

/// The tags Meridian puts on every instance it launches (AWS tags, GCP labels, Azure
/// tags, OCI freeform tags): lower case, digits and `-`, which every provider accepts.
pub mod tags {
    /// Marks what Meridian launched: the leak sweep looks only at these.
    pub const MANAGED: &str = "meridian-managed";
    pub const JOB_ID: &str = "meridian-job-id";
    pub const WORKFLOW_ID: &str = "meridian-workflow-id";
    /// The job's name in its workflow.
    pub const JOB: &str = "meridian-job";
    pub const TENANT: &str = "meridian-tenant";
    /// The run's walltime in seconds: the adapter's backstop survives its restart.
    pub const WALLTIME: &str = "meridian-walltime";
    /// The vendor of the shape's accelerators, for the bill.
    pub const GPU_VENDOR: &str = "meridian-gpu-vendor";
}

/// An instance as its provider describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub id: String,
    pub state: InstanceState,
    pub zone: Option<String>,
    /// When it was launched: the bill starts here.
    pub launched_at: Option<DateTime<Utc>>,
    /// When it ended, where the provider says: the bill ends here.
    pub ended_at: Option<DateTime<Utc>>,
    /// The provider's code for its last change (`Server.SpotInstanceTermination`).
    pub reason: Option<String>,
    /// The provider took it back (a spot reclaim).
    pub reclaimed: bool,
    /// Its private address.
    pub address: Option<String>,
    pub tags: BTreeMap<String, String>,
}

impl Instance {
    /// Whether Meridian launched it (its `meridian-managed` tag).
    pub fn is_managed(&self) -> bool {
        self.tags.get(tags::MANAGED).map(String::as_str) == Some("true")
    }

    /// Whether Meridian launched it for `job_id`.
    pub fn runs(&self, job_id: Uuid) -> bool {
        self.is_managed() && self.job_id() == Some(job_id)
    }

    /// The Meridian job it runs, from its tag.
    pub fn job_id(&self) -> Option<Uuid> {
        self.tags
            .get(tags::JOB_ID)
            .and_then(|id| Uuid::try_parse(id).ok())
    }
}

/// What a provider whose API can only list every instance (OCI, Azure) keeps of that
/// list for each call.
pub mod listed {
    use std::time::{Duration, Instant};

    use super::{Instance, InstanceState, ProviderError};
    use uuid::Uuid;

    /// The last list, kept for a moment: the site runner asks after each run it follows
    /// four times a second, and a provider that can only list everything would list it
    /// for each. A launch or a terminate forgets it.
    pub struct Cache {
        every: Duration,
        last: tokio::sync::Mutex<Option<(Instant, Vec<Instance>)>>,
    }

    impl Cache {
        /// Lists again when the last list is older than `every` (zero: every time).
        pub fn new(every: Duration) -> Cache {
            Cache {
                every,
                last: tokio::sync::Mutex::new(None),
            }
        }

        /// The list, from `list` when the kept one is too old.
        pub async fn get<F, Fut>(&self, list: F) -> Result<Vec<Instance>, ProviderError>
        where
            F: FnOnce() -> Fut,
            Fut: std::future::Future<Output = Result<Vec<Instance>, ProviderError>>,
        {
            let mut last = self.last.lock().await;
            if let Some((at, all)) = last.as_ref() {
                if at.elapsed() < self.every {
                    return Ok(all.clone());
                }
            }
            let all = list().await?;
            *last = Some((Instant::now(), all.clone()));
            Ok(all)
        }

        /// The next [`Cache::get`] lists again.
        pub async fn forget(&self) {
            *self.last.lock().await = None;
        }
    }

    /// Meridian's instances as last seen, for a provider whose deleted instances vanish
    /// from its lists at once (Azure, Google Cloud): the lifecycle still needs what an
    /// instance was (its tags, its launch) to judge how its run ended. One gone from a
    /// list is taken as terminated only once the provider says so for that instance (a
    /// list can lag a create); what ended over an hour ago is forgotten.
    #[derive(Default)]
    pub struct Seen {
        all: std::sync::Mutex<std::collections::HashMap<String, (Instance, bool)>>,
    }

    impl Seen {
        fn lock(
            &self,
        ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (Instance, bool)>>
        {
            self.all.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Remembers `instance` (a spot one when `spot`) if it is Meridian's.
        pub fn remember(&self, instance: &Instance, spot: bool) {
            if instance.is_managed() {
                self.lock()
                    .insert(instance.id.clone(), (instance.clone(), spot));
            }
        }

        /// Meridian's instances seen before, not ended, and missing from `listed`, as
        /// last seen: the ones to ask the provider about.
        pub fn missing(&self, listed: &[Instance]) -> Vec<Instance> {
            self.lock()
                .iter()
                .filter(|(id, (i, _))| {
                    i.state != InstanceState::Terminated && !listed.iter().any(|l| &l.id == *id)
                })
                .map(|(_, (i, _))| i.clone())
                .collect()
        }

        /// Remembers `listed` (with whether each is spot), marks `gone` terminated (a
        /// spot instance the provider deleted was reclaimed; the lifecycle asks only
        /// when Meridian did not end it), and returns `listed` with every terminated
        /// instance remembered.
        pub fn merge(&self, listed: Vec<(Instance, bool)>, gone: &[String]) -> Vec<Instance> {
            let now = chrono::Utc::now();
            let mut all = self.lock();
            for (instance, spot) in listed.iter().filter(|(i, _)| i.is_managed()) {
                all.insert(instance.id.clone(), (instance.clone(), *spot));
            }
            for id in gone {
                if let Some((i, spot)) = all.get_mut(id) {
                    i.state = InstanceState::Terminated;
                    // Where the provider said when it stopped, billing ended there.
                    i.ended_at = i.ended_at.or(Some(now));
                    i.reclaimed = *spot;
                }
            }
            all.retain(|_, (i, _)| {
                i.ended_at
                    .is_none_or(|t| now - t < chrono::Duration::hours(1))
            });
            let mut out: Vec<Instance> = listed.into_iter().map(|(i, _)| i).collect();
            out.extend(
                all.values()
                    .filter(|(i, _)| {
                        i.state == InstanceState::Terminated && !out.iter().any(|o| o.id == i.id)
                    })
                    .map(|(i, _)| i.clone())
                    .collect::<Vec<_>>(),
            );
            out
        }
    }

    /// [`super::CloudProvider::describe`]: the instances with these ids.
    pub fn with_ids(all: Vec<Instance>, ids: &[String]) -> Vec<Instance> {
        all.into_iter().filter(|i| ids.contains(&i.id)).collect()
    }

    /// [`super::CloudProvider::find`]: Meridian's instances for `job_id`.
    pub fn of_job(all: Vec<Instance>, job_id: Uuid) -> Vec<Instance> {
        all.into_iter().filter(|i| i.runs(job_id)).collect()
    }

    /// [`super::CloudProvider::owned`]: Meridian's instances not terminated.
    pub fn owned(all: Vec<Instance>) -> Vec<Instance> {
        all.into_iter()
            .filter(|i| i.is_managed() && i.state != InstanceState::Terminated)
            .collect()
    }
}

/// Where an instance stands, in every provider's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    /// Asked for; booting.
    Pending,
    Running,
    /// Powering off or being stopped.
    Stopping,
    /// Stopped but not gone: it still holds its disk (and, at some providers, bills).
    Stopped,
    /// Being terminated.
    Terminating,
    /// Gone; billing ended.
    Terminated,
}

/// One launch, as the lifecycle asks the provider for it.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub job: &'a JobRequest,
    /// The provider's name for the shape (an instance type).
    pub instance_type: &'a str,
    /// The zone to launch in; `None`: where the provider chooses.
    pub zone: Option<&'a str>,
    /// Spot (preemptible) capacity, terminated when reclaimed.
    pub spot: bool,
    /// The bootstrap, as text (the provider encodes it as its API wants).
    pub user_data: &'a str,
    pub tags: &'a [(String, String)],
    /// The same token for the same launch: a retried call launches nothing twice.
    pub client_token: &'a str,
}

/// What a provider's API said, in the lifecycle's terms.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// No capacity in this zone now: the next zone may have it.
    #[error("{code}: {message}")]
    Capacity { code: String, message: String },
    /// A quota or limit of the account: no zone of this site will do, until it is raised.
    #[error("{code}: {message}")]
    Quota { code: String, message: String },
    /// The request can never succeed here (an unknown instance type or image).
    #[error("{0}")]
    Rejected(String),
    /// The API cannot be reached or failed; the same call may work later.
    #[error("{0}")]
    Unavailable(String),
}

/// A cloud's API, as the lifecycle uses it.
#[async_trait]
pub trait CloudProvider: Send + Sync + 'static {
    /// The site kind: `aws`, `gcp`, `azure`, `oci`.
    fn kind(&self) -> &'static str;

    /// The zones to launch in, in order of preference; empty: where the provider
    /// chooses.
    fn zones(&self) -> Vec<String>;

    /// The most bytes of bootstrap the provider takes.
    fn max_user_data_bytes(&self) -> usize;

    /// Launches one instance. Given the same client token again, returns the instance
    /// that token launched.
    async fn launch(&self, launch: &Launch<'_>) -> Result<Instance, ProviderError>;

    /// Every instance the provider lists, for one whose API can only list them all (OCI,
    /// Azure, Google Cloud): `describe`, `find` and `owned` then need not be written, as
    /// they filter this list. One that looks instances up by id and tag (AWS) writes
    /// those three instead.
    async fn listed(&self) -> Result<Vec<Instance>, ProviderError> {
        Err(ProviderError::Rejected(format!(
            "the {} provider lists no instances: it must look them up itself",
            self.kind()
        )))
    }

    /// The instances with these ids that the provider still knows.
    async fn describe(&self, ids: &[String]) -> Result<Vec<Instance>, ProviderError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(listed::with_ids(self.listed().await?, ids))
    }

    /// The instances tagged with Meridian job `job_id`, in any state the provider still
    /// shows.
    async fn find(&self, job_id: Uuid) -> Result<Vec<Instance>, ProviderError> {
        Ok(listed::of_job(self.listed().await?, job_id))
    }

    /// Every instance tagged as Meridian's that is not terminated.
    async fn owned(&self) -> Result<Vec<Instance>, ProviderError> {
        Ok(listed::owned(self.listed().await?))
    }

    /// The id of the instance that runs `job_id`, for a provider whose instances are
    /// named after their run whatever the zone (Google Cloud): a restarted adapter then
    /// still finds the run of an instance the provider no longer lists, from the run's
    /// reports. `None` (the default): the provider gives the ids, and keeps listing an
    /// ended instance for a while (AWS, OCI), or the id depends on the zone (Azure).
    fn instance_id_of(&self, _job_id: Uuid) -> Option<String> {
        None
    }

    /// The run an instance id of [`CloudProvider::instance_id_of`] names.
    fn job_of_instance_id(&self, _id: &str) -> Option<Uuid> {
        None
    }

    /// Terminates these instances; terminating one that is gone is not an error.
    async fn terminate(&self, ids: &[String]) -> Result<(), ProviderError>;

    /// Whether the API answers with these credentials (for the site's health).
    async fn check(&self) -> Result<(), ProviderError>;

    /// The figures of these shapes (instance types), as the provider gives them.
    async fn shapes(&self, names: &[String]) -> Result<Vec<ShapeFacts>, ProviderError>;
}

/// A cloud site for the adapter registry: `provider` on the lifecycle, its runs' reports
/// from the build context, its shapes refreshed at start when its configuration says.
pub fn build_site<P: CloudProvider>(
    provider: Result<P, String>,
    lifecycle: LifecycleConfig,
    refresh_shapes: bool,
    context: &meridian_adapter_core::BuildContext,
) -> Result<std::sync::Arc<dyn meridian_adapter_core::SiteAdapter>, meridian_adapter_core::BuildError>
{
    use meridian_adapter_core::BuildError;
    let provider = provider.map_err(BuildError::Config)?;
    let site = CloudSite::new(provider, lifecycle, context.run_reports.clone())
        .map_err(BuildError::Config)?
        .with_shapes_at_start(refresh_shapes);
    Ok(std::sync::Arc::new(site))
}

/// How the lifecycle behaves, the same for every cloud: the `lifecycle:` section of a
/// cloud site's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LifecycleConfig {
    /// How long past its walltime a run may go before its instance is terminated.
    #[serde(
        with = "meridian_adapter_core::seconds",
        rename = "walltime_grace_seconds"
    )]
    pub walltime_grace: Duration,
    /// How long an instance may run without its bootstrap reporting before it is
    /// terminated as a boot failure.
    #[serde(
        with = "meridian_adapter_core::seconds",
        rename = "boot_timeout_seconds"
    )]
    pub boot_timeout: Duration,
    /// How long a zone that refused for capacity is kept out.
    #[serde(
        with = "meridian_adapter_core::seconds",
        rename = "zone_backoff_seconds"
    )]
    pub zone_backoff: Duration,
    /// What the bootstrap runs to power the instance off (which terminates it).
    pub power_off_command: String,
    /// Where the job's volumes and output live on the instance.
    pub work_dir: String,
    /// The container runtime on the image, for jobs with an image.
    pub container_runtime: String,
    /// Seconds between sends of a running job's output.
    pub output_every_seconds: u32,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        LifecycleConfig {
            walltime_grace: Duration::from_secs(300),
            boot_timeout: Duration::from_secs(900),
            zone_backoff: Duration::from_secs(600),
            power_off_command: "shutdown -h now".into(),
            work_dir: "/var/lib/meridian".into(),
            container_runtime: "docker".into(),
            output_every_seconds: 30,
        }
    }
}

impl LifecycleConfig {
    /// What is wrong with it, naming the field.
    pub fn check(&self) -> Result<(), String> {
        if self.power_off_command.trim().is_empty() {
            return Err("lifecycle.power_off_command: expected a command; got nothing".into());
        }
        if !self.work_dir.starts_with('/') {
            return Err(format!(
                "lifecycle.work_dir: expected an absolute path; got {:?}",
                self.work_dir
            ));
        }
        if self.container_runtime.trim().is_empty() {
            return Err(
                "lifecycle.container_runtime: expected a command such as docker; got nothing"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn managed(id: &str, state: InstanceState) -> Instance {
        Instance {
            id: id.into(),
            state,
            zone: None,
            launched_at: Some(Utc::now()),
            ended_at: None,
            reason: None,
            reclaimed: false,
            address: None,
            tags: BTreeMap::from([(tags::MANAGED.to_string(), "true".to_string())]),
        }
    }

    #[test]
    fn an_instance_seen_and_then_gone_is_terminated_and_a_spot_one_reclaimed() {
        let seen = listed::Seen::default();
        let mut foreign = managed("theirs", InstanceState::Running);
        foreign.tags.clear();
        let listed = seen.merge(
            vec![
                (managed("a", InstanceState::Running), false),
                (managed("spot", InstanceState::Running), true),
                (foreign, false),
            ],
            &[],
        );
        assert_eq!(listed.len(), 3);
        // Gone from the next list: asked about, not yet taken as ended.
        let mut missing: Vec<String> = seen.missing(&[]).into_iter().map(|i| i.id).collect();
        missing.sort();
        assert_eq!(missing, ["a", "spot"], "only Meridian's are remembered");
        // The provider said `spot` is gone; `a` is still there (a lagging list).
        let mut stopped = managed("a", InstanceState::Stopped);
        let stop = Utc::now() - chrono::Duration::minutes(5);
        stopped.ended_at = Some(stop);
        let out = seen.merge(vec![(stopped, false)], &["spot".to_string()]);
        let spot = out.iter().find(|i| i.id == "spot").unwrap();
        assert_eq!(spot.state, InstanceState::Terminated);
        assert!(spot.reclaimed && spot.ended_at.is_some());
        // `a` ended when it stopped, not when it was found gone.
        let out = seen.merge(vec![], &["a".to_string()]);
        let a = out.iter().find(|i| i.id == "a").unwrap();
        assert_eq!(
            (a.state, a.ended_at, a.reclaimed),
            (InstanceState::Terminated, Some(stop), false)
        );
        assert!(
            seen.missing(&[]).is_empty(),
            "ended ones are not asked about again"
        );
    }
}
