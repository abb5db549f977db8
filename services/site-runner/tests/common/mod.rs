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
    use meridian_events::aggregate::{Workflow, WorkflowCommand};
    let workflow_id = Uuid::now_v7();
    let spec = meridian_spec::parse(yaml).unwrap();
    execute::<Workflow, _>(log, workflow_id, &EventContext::new_chain("t"), |_| {
        WorkflowCommand::Submit {
            workflow_id,
            spec: spec.clone(),
            submitted_by: "t".into(),
            idempotency_key: None,
            parent_workflow_id: None,
        }
    })
    .await
    .unwrap();
    (workflow_id, spec)
}
