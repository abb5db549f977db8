//! For the cloud adapters' tests: the runs' reports held in memory, as a bootstrap would
//! have sent them (the store-backed reports are tested end to end in `meridian`), and a
//! run as placement hands it to a cloud site.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use meridian_adapter_core::{
    AdapterError, Gpus, JobRequest, PlacedShape, ReportTo, RunReport, RunReports,
};
use uuid::Uuid;

/// The runs' reports, as a map.
#[derive(Clone, Default)]
pub struct MemoryReports(Arc<Mutex<HashMap<Uuid, RunReport>>>);

impl MemoryReports {
    /// The run of `job` reported its start at `at`.
    pub fn started(&self, job: Uuid, at: DateTime<Utc>) {
        self.0.lock().unwrap().entry(job).or_default().started_at = Some(at);
    }

    /// The run of `job` reported its exit `code`, having printed `stdout`.
    pub fn exited(&self, job: Uuid, code: i32, stdout: &str) {
        self.ended(job, code);
        self.output(job, "stdout", stdout);
    }

    /// The run of `job` reported its exit `code`.
    pub fn ended(&self, job: Uuid, code: i32) {
        let mut all = self.0.lock().unwrap();
        let r = all.entry(job).or_default();
        r.exit_code = Some(code);
        r.ended_at = Some(Utc::now());
    }

    /// The run of `job` sent the tail of its `stream` (`stdout` or `stderr`).
    pub fn output(&self, job: Uuid, stream: &str, text: &str) {
        let mut all = self.0.lock().unwrap();
        let logs = &mut all.entry(job).or_default().logs;
        match stream {
            "stderr" => logs.stderr = text.to_string(),
            _ => logs.stdout = text.to_string(),
        }
    }
}

#[async_trait]
impl RunReports for MemoryReports {
    async fn read(&self, job_id: Uuid) -> Result<Option<RunReport>, AdapterError> {
        Ok(self.0.lock().unwrap().get(&job_id).cloned())
    }
}

/// A host job printing `greeting`, placed on `shape` (its spot offer when `spot`), for
/// ten minutes, with `gpus` NVIDIA GPUs of `model` when given, and a run credential to
/// report with.
pub fn job(shape: &str, spot: bool, gpus: Option<(u32, &str)>, greeting: &str) -> JobRequest {
    let command = format!("echo {greeting}");
    let mut job = JobRequest::new("train", &["sh", "-c", &command]);
    job.resources.cpus = 4;
    job.resources.memory_bytes = 16 << 30;
    job.resources.walltime = std::time::Duration::from_secs(600);
    job.resources.gpus = gpus.map(|(count, model)| Gpus {
        count,
        vendor: "nvidia".into(),
        model: Some(model.into()),
    });
    job.tenant = Some("physics".into());
    job.shape = Some(PlacedShape {
        name: shape.into(),
        offer: shape.into(),
        spot,
        gpu_vendor: gpus.map(|_| "nvidia".to_string()),
    });
    job.report_to = Some(ReportTo {
        server: "http://127.0.0.1:9".into(),
        credential: format!("mer_run_{}_deadbeef", job.job_id.simple()),
    });
    job
}
