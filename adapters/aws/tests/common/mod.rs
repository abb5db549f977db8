//! What the AWS tests share: a site on an endpoint, jobs, and the runs' reports held
//! in memory.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use meridian_adapter_aws::{AwsConfig, Ec2, Subnet};
use meridian_adapter_cloud::{CloudSite, LifecycleConfig};
use meridian_adapter_core::{Gpus, JobRequest, PlacedShape, ReportTo, Resources};
use uuid::Uuid;

/// Test credentials for the SDK's standard chain; set once for the whole process.
pub fn credentials() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIAMERIDIANTEST0001");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "meridian-test-secret-never-logged");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    });
}

pub use meridian_adapter_cloud::testing::MemoryReports;

/// An AWS site on `endpoint`, launching in `zones` (a subnet `subnet-<zone>` each).
pub fn site(
    endpoint: &str,
    image: &str,
    zones: &[&str],
    lifecycle: LifecycleConfig,
    reports: MemoryReports,
) -> CloudSite<Ec2> {
    credentials();
    let config = AwsConfig {
        region: "us-east-1".into(),
        endpoint_url: Some(endpoint.to_string()),
        images: meridian_adapter_cloud::config::Images(BTreeMap::from([(
            "x86_64".into(),
            image.to_string(),
        )])),
        subnets: zones
            .iter()
            .map(|z| Subnet {
                zone: z.to_string(),
                subnet: format!("subnet-{z}"),
            })
            .collect(),
        security_groups: Vec::new(),
        instance_profile: None,
        key_name: None,
        refresh_shapes: false,
        lifecycle: lifecycle.clone(),
    };
    CloudSite::new(
        Ec2::new(config).unwrap(),
        lifecycle,
        Some(Arc::new(reports)),
    )
    .unwrap()
}

/// A host job of `walltime` on `instance_type`, spot or not, with NVIDIA GPUs when
/// `gpus`.
pub fn job(instance_type: &str, walltime: Duration, spot: bool, gpus: bool) -> JobRequest {
    let job_id = Uuid::now_v7();
    JobRequest {
        job_id,
        workflow_id: Uuid::now_v7(),
        name: "train".into(),
        array_index: None,
        image: None,
        command: vec![
            "sh".into(),
            "-c".into(),
            "echo hello from the instance".into(),
        ],
        env: BTreeMap::from([("GREETING".into(), "hello".into())]),
        cwd: None,
        resources: Resources {
            nodes: 1,
            cpus: 2,
            memory_bytes: 1 << 30,
            walltime,
            gpus: gpus.then(|| Gpus {
                count: 1,
                vendor: "nvidia".into(),
                model: Some("L4".into()),
            }),
        },
        service: None,
        mounts: BTreeMap::new(),
        volume_sizes: BTreeMap::new(),
        tenant: Some("physics".into()),
        shape: Some(PlacedShape {
            name: instance_type.into(),
            offer: if spot {
                format!("{instance_type}-spot")
            } else {
                instance_type.into()
            },
            spot,
            gpu_vendor: gpus.then(|| "nvidia".to_string()),
        }),
        report_to: Some(ReportTo {
            server: "http://127.0.0.1:9".into(),
            credential: format!("mer_run_{}_deadbeef", job_id.simple()),
        }),
        slurm: None,
    }
}

/// Polls `check` until it gives a value, for at most 20 s.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
