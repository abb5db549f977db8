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

    /// The instances with these ids that the provider still knows.
    async fn describe(&self, ids: &[String]) -> Result<Vec<Instance>, ProviderError>;

    /// The instances tagged with Meridian job `job_id`, in any state the provider still
    /// shows.
    async fn find(&self, job_id: Uuid) -> Result<Vec<Instance>, ProviderError>;

    /// Every instance tagged as Meridian's that is not terminated.
    async fn owned(&self) -> Result<Vec<Instance>, ProviderError>;

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
