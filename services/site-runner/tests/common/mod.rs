//! What the site runner's tests share.

// Each test file uses some of these.
#![allow(dead_code)]

use std::collections::BTreeMap;

use meridian_eventlog::aggregates::execute;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Site, SiteCommand};
use meridian_events::{EventContext, SiteKind};
use uuid::Uuid;

/// Registers a local site `name` without prices; its aggregate id.
pub async fn register(log: &dyn EventLog, name: &str) -> Uuid {
    let site_id = Uuid::now_v7();
    execute::<Site, _>(log, site_id, &EventContext::new_chain("t"), |_| {
        SiteCommand::Register {
            name: name.into(),
            kind: SiteKind::Local,
            region: "r".into(),
            jurisdiction: "eu".into(),
            credentials_secret: None,
            labels: BTreeMap::new(),
            prices: None,
        }
    })
    .await
    .unwrap();
    site_id
}

/// Dispatches a new job of `workflow_id` to `site` at a local rate (one commit); its id.
pub async fn dispatch(
    log: &dyn EventLog,
    site: &str,
    workflow_id: Uuid,
    job: &str,
    resources: meridian_spec::Resources,
) -> Uuid {
    use meridian_events::aggregate::{Job, JobCommand};
    let job_id = Uuid::now_v7();
    let rate = meridian_events::ComputeRate {
        offer: "local".into(),
        pricing: meridian_events::ComputePricing::Resource {
            per_core_hour: rust_decimal::Decimal::ONE,
            per_gib_memory_hour: rust_decimal::Decimal::ZERO,
            per_gpu_hour: rust_decimal::Decimal::ZERO,
        },
        currency: meridian_events::Currency::USD,
        effective_from: chrono::Utc::now(),
        source: "test".into(),
    };
    execute::<Job, _>(log, job_id, &EventContext::new_chain("t"), |_| {
        JobCommand::Dispatch {
            workflow_id,
            job: job.into(),
            index: None,
            attempt: 1,
            site: site.into(),
            rate: rate.clone(),
            resources: resources.clone(),
            batch: None,
        }
    })
    .await
    .unwrap();
    job_id
}

/// Submits a new workflow of `yaml`; its id and spec.
pub async fn submit(log: &dyn EventLog, yaml: &str) -> (Uuid, meridian_spec::Workflow) {
    meridian_eventlog::testkit::submit(log, yaml).await
}

/// A local site that remembers every job it was asked to run, and that can fail its
/// first cancel, as a site that is briefly unreachable does.
pub struct Watched {
    inner: meridian_adapter_local::LocalAdapter,
    pub submitted: std::sync::Mutex<Vec<meridian_adapter_core::JobRequest>>,
    miss_first_cancel: bool,
    cancel_missed: std::sync::atomic::AtomicBool,
}

impl Watched {
    pub fn new(config: meridian_adapter_local::LocalConfig) -> Watched {
        Watched {
            inner: meridian_adapter_local::LocalAdapter::new(config).unwrap(),
            submitted: Default::default(),
            miss_first_cancel: false,
            cancel_missed: Default::default(),
        }
    }

    pub fn missing_first_cancel(mut self) -> Watched {
        self.miss_first_cancel = true;
        self
    }
}

#[async_trait::async_trait]
impl meridian_adapter_core::SiteAdapter for Watched {
    fn kind(&self) -> &'static str {
        "local"
    }
    async fn submit(
        &self,
        job: &meridian_adapter_core::JobRequest,
    ) -> Result<meridian_adapter_core::BackendJobId, meridian_adapter_core::AdapterError> {
        self.submitted.lock().unwrap().push(job.clone());
        self.inner.submit(job).await
    }
    async fn find(
        &self,
        job_id: Uuid,
    ) -> Result<Option<meridian_adapter_core::BackendJobId>, meridian_adapter_core::AdapterError>
    {
        self.inner.find(job_id).await
    }
    async fn status(
        &self,
        id: &meridian_adapter_core::BackendJobId,
    ) -> Result<meridian_adapter_core::JobReport, meridian_adapter_core::AdapterError> {
        self.inner.status(id).await
    }
    async fn cancel(
        &self,
        id: &meridian_adapter_core::BackendJobId,
    ) -> Result<(), meridian_adapter_core::AdapterError> {
        use std::sync::atomic::Ordering;
        if self.miss_first_cancel && !self.cancel_missed.swap(true, Ordering::SeqCst) {
            return Err(meridian_adapter_core::AdapterError::Unavailable(
                "the site did not answer".into(),
            ));
        }
        self.inner.cancel(id).await
    }
    async fn logs(
        &self,
        id: &meridian_adapter_core::BackendJobId,
    ) -> Result<meridian_adapter_core::Logs, meridian_adapter_core::AdapterError> {
        self.inner.logs(id).await
    }
    async fn capacity(
        &self,
    ) -> Result<meridian_adapter_core::Capacity, meridian_adapter_core::AdapterError> {
        self.inner.capacity().await
    }
}
