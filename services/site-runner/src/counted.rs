//! A site adapter whose failed calls are counted, by site and call, for `/metrics`
//! (`meridian_adapter_errors_total`). "Not supported" answers are no failure: they say
//! what a kind of site cannot do. Every method of [`SiteAdapter`] is passed on here —
//! one left to the trait's default would hide the adapter's own.

use std::sync::Arc;

use async_trait::async_trait;
use meridian_adapter_core::{
    gpu, AdapterError, ArrayRequest, BackendJobId, Capacity, JobReport, JobRequest, Logs,
    ShapeFacts, SiteAdapter,
};
use meridian_ops::counted;
use uuid::Uuid;

pub(crate) struct Counted {
    site: String,
    inner: Arc<dyn SiteAdapter>,
}

impl Counted {
    pub(crate) fn new(site: &str, inner: Arc<dyn SiteAdapter>) -> Counted {
        Counted {
            site: site.to_string(),
            inner,
        }
    }

    fn seen<T>(
        &self,
        call: &'static str,
        result: Result<T, AdapterError>,
    ) -> Result<T, AdapterError> {
        if let Err(e) = &result {
            if !matches!(e, AdapterError::NotSupported(_)) {
                counted::count(
                    "meridian_adapter_errors_total",
                    "Site adapter calls that failed, by site and call.",
                    &[("site", &self.site), ("call", call)],
                    1.0,
                );
            }
        }
        result
    }
}

#[async_trait]
impl SiteAdapter for Counted {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn submit(&self, job: &JobRequest) -> Result<BackendJobId, AdapterError> {
        self.seen("submit", self.inner.submit(job).await)
    }

    async fn find(&self, job_id: Uuid) -> Result<Option<BackendJobId>, AdapterError> {
        self.seen("find", self.inner.find(job_id).await)
    }

    async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        self.seen("status", self.inner.status(id).await)
    }

    async fn status_all(&self, ids: &[BackendJobId]) -> Vec<Result<JobReport, AdapterError>> {
        let reports = self.inner.status_all(ids).await;
        reports
            .into_iter()
            .map(|r| self.seen("status", r))
            .collect()
    }

    async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        self.seen("cancel", self.inner.cancel(id).await)
    }

    async fn logs(&self, id: &BackendJobId) -> Result<Logs, AdapterError> {
        self.seen("logs", self.inner.logs(id).await)
    }

    async fn capacity(&self) -> Result<Capacity, AdapterError> {
        self.seen("capacity", self.inner.capacity().await)
    }

    fn array_limit(&self) -> Option<u32> {
        self.inner.array_limit()
    }

    async fn submit_array(&self, array: &ArrayRequest) -> Result<Vec<BackendJobId>, AdapterError> {
        self.seen("submit_array", self.inner.submit_array(array).await)
    }

    fn volume_root(&self) -> Option<std::path::PathBuf> {
        self.inner.volume_root()
    }

    async fn shapes(&self, names: &[String]) -> Result<Vec<ShapeFacts>, AdapterError> {
        self.seen("shapes", self.inner.shapes(names).await)
    }

    fn refresh_shapes_at_start(&self) -> bool {
        self.inner.refresh_shapes_at_start()
    }

    async fn devices(&self) -> Result<Vec<gpu::DeviceStatus>, AdapterError> {
        self.seen("devices", self.inner.devices().await)
    }

    fn cordon(&self, devices: &std::collections::BTreeSet<String>) {
        self.inner.cordon(devices)
    }

    async fn owned(&self) -> Result<Vec<Uuid>, AdapterError> {
        self.seen("owned", self.inner.owned().await)
    }
}
