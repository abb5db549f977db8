//! For the cloud adapters' tests: the runs' reports held in memory, as a bootstrap would
//! have sent them (the store-backed reports are tested end to end in `meridian`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use meridian_adapter_core::{AdapterError, RunReport, RunReports};
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
        let mut all = self.0.lock().unwrap();
        let r = all.entry(job).or_default();
        r.exit_code = Some(code);
        r.ended_at = Some(Utc::now());
        r.logs.stdout = stdout.to_string();
    }
}

#[async_trait]
impl RunReports for MemoryReports {
    async fn read(&self, job_id: Uuid) -> Result<Option<RunReport>, AdapterError> {
        Ok(self.0.lock().unwrap().get(&job_id).cloned())
    }
}
