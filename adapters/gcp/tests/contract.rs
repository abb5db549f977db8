//! `contract_*`: the Google Cloud site's real client (`google-cloud-compute-v1`, with
//! credentials from an `authorized_user` file as Application Default Credentials would
//! read one) against the Compute Engine stand-in (`meridian-gce-standin`), which speaks
//! Compute Engine's documented shapes with state (zone operations, exhausted resource
//! pools, quotas, Spot preemption) and issues OAuth2 tokens as Google's token endpoint
//! does. No Compute Engine emulator runs here.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use meridian_adapter_cloud::testing::{self, MemoryReports};
use meridian_adapter_cloud::{CloudProvider, CloudSite, Launch, LifecycleConfig};
use meridian_adapter_core::{AdapterError, FailureReason, JobRequest, JobState, SiteAdapter};
use meridian_adapter_gcp::{Gce, GcpConfig};
use meridian_gce_standin::GceStandIn;

const CLIENT: &str = "764086051850-standin.apps.googleusercontent.com";
const SECRET: &str = "d-FL95Q19q7MQmFpd7hHD0Ty";
const REFRESH: &str = "1//meridian-gcp-test-refresh-token";

struct Stand {
    standin: GceStandIn,
    /// Holds the credentials file.
    _dir: tempfile::TempDir,
    config: GcpConfig,
}

async fn stand() -> Stand {
    let standin = GceStandIn::start(CLIENT, SECRET, REFRESH).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("adc.json");
    std::fs::write(&file, standin.credentials_json().to_string()).unwrap();
    let text = format!(
        "project: physics-lab-1\nregion: us-central1\nzones: [us-central1-a, us-central1-b]\nimages: {{x86_64: projects/debian-cloud/global/images/family/debian-12, x86_64-nvidia: projects/physics-lab-1/global/images/family/cuda}}\nendpoint_url: {}\ncredentials: {{file: {}}}\n",
        standin.url(),
        file.display()
    );
    let config = meridian_adapter_core::registry::parse_config(&text).unwrap();
    Stand {
        standin,
        _dir: dir,
        config,
    }
}

impl Stand {
    fn site_with(&self, reports: MemoryReports) -> CloudSite<Gce> {
        // Every look lists again: the stand-in moves instances on as they are looked at.
        let gce = Gce::new(self.config.clone())
            .unwrap()
            .listing_every(Duration::ZERO);
        CloudSite::new(gce, LifecycleConfig::default(), Some(Arc::new(reports))).unwrap()
    }

    fn site(&self) -> CloudSite<Gce> {
        self.site_with(MemoryReports::default())
    }

    fn inserts(&self) -> Vec<String> {
        self.standin
            .requests()
            .into_iter()
            .filter(|r| r.starts_with("insert "))
            .collect()
    }
}

fn job(shape: &str, spot: bool, gpus: Option<(u32, &str)>) -> JobRequest {
    testing::job(shape, spot, gpus, "hello from Google Cloud")
}

/// Looks until the run ends, as the site runner would.
async fn ended(site: &CloudSite<Gce>, id: &meridian_adapter_core::BackendJobId) -> JobState {
    for _ in 0..10 {
        let state = site.status(id).await.unwrap().state;
        if state.is_terminal() {
            return state;
        }
    }
    panic!("never ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_an_instance_is_inserted_followed_to_running_and_deleted_with_its_disk() {
    let s = stand().await;
    let site = s.site();
    let job = job("n2-standard-16", false, None);
    let id = site.submit(&job).await.unwrap();
    let all = s.standin.instances();
    assert_eq!(all.len(), 1);
    let i = &all[0];
    assert_eq!(
        (id.0.as_str(), i.zone.as_str()),
        (i.name.as_str(), "us-central1-a")
    );
    assert_eq!(i.name, format!("meridian-{}", job.job_id.simple()));
    assert_eq!(
        i.status, "RUNNING",
        "the insert's operation was followed to its end"
    );
    assert!(s
        .standin
        .requests()
        .contains(&"operation us-central1-a".to_string()));
    let b = &i.body;
    assert_eq!(
        b["machineType"],
        "zones/us-central1-a/machineTypes/n2-standard-16"
    );
    assert_eq!(b["disks"][0]["autoDelete"], true);
    assert_eq!(
        b["disks"][0]["initializeParams"]["sourceImage"],
        "projects/debian-cloud/global/images/family/debian-12"
    );
    assert_eq!(
        b["networkInterfaces"][0]["network"],
        "global/networks/default"
    );
    assert!(b["networkInterfaces"][0]
        .get("accessConfigs")
        .is_none_or(|a| a.as_array().unwrap().is_empty()));
    assert_eq!(b["labels"]["meridian-job-id"], job.job_id.to_string());
    assert_eq!(b["labels"]["meridian-managed"], "true");
    let sched = &b["scheduling"];
    assert_eq!(sched["provisioningModel"], "STANDARD");
    assert_eq!(sched["instanceTerminationAction"], "DELETE");
    // The walltime (600 s) and an hour: Compute Engine's own backstop.
    assert_eq!(sched["maxRunDuration"]["seconds"], "4200");
    assert!(sched.get("onHostMaintenance").is_none());
    let script = b["metadata"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["key"] == "startup-script")
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(script.contains("hello from Google Cloud"), "{script}");
    assert!(s.standin.requests().contains(&"token".to_string()));

    // Up, its bootstrap not heard from yet.
    assert_eq!(site.status(&id).await.unwrap().state, JobState::Pending);
    assert_eq!(site.provider().find(job.job_id).await.unwrap()[0].id, id.0);

    site.cancel(&id).await.unwrap();
    assert!(matches!(
        ended(&site, &id).await,
        JobState::Cancelled { .. }
    ));
    assert!(
        s.standin.instances().is_empty(),
        "{:?}",
        s.standin.instances()
    );
    assert!(site.provider().owned().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_an_exhausted_zone_goes_to_the_next_and_is_kept_out_for_its_backoff() {
    let s = stand().await;
    s.standin.refuse(
        "us-central1-a",
        false,
        503,
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "The zone 'projects/physics-lab-1/zones/us-central1-a' does not have enough resources available to fulfill the request.  Try a different zone, or try again later.",
    );
    let site = s.site();
    let id = site
        .submit(&job("a3-highgpu-8g", false, Some((8, "H100"))))
        .await
        .unwrap();
    let all = s.standin.instances();
    assert_eq!(
        (all[0].name.as_str(), all[0].zone.as_str()),
        (id.0.as_str(), "us-central1-b")
    );
    assert_eq!(all.len(), 1, "nothing made in the exhausted zone: {all:?}");
    let b = &all[0].body;
    assert_eq!(b["scheduling"]["onHostMaintenance"], "TERMINATE");
    assert_eq!(
        b["disks"][0]["initializeParams"]["sourceImage"],
        "projects/physics-lab-1/global/images/family/cuda"
    );
    assert_eq!(s.inserts().len(), 2);
    site.submit(&job("a3-highgpu-8g", false, Some((8, "H100"))))
        .await
        .unwrap();
    assert!(
        s.inserts()[2].starts_with("insert us-central1-b/"),
        "{:?}",
        s.inserts()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_gpus_all_regions_quota_refuses_the_whole_site() {
    let s = stand().await;
    s.standin.refuse(
        "us-central1-a",
        false,
        403,
        "QUOTA_EXCEEDED",
        "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.",
    );
    let error = s
        .site()
        .submit(&job("a3-highgpu-8g", false, Some((8, "H100"))))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Refused(m) if m.contains("GPUS_ALL_REGIONS") && m.contains("limits")),
        "{error:?}"
    );
    assert_eq!(s.inserts().len(), 1, "no second zone for a quota");
    assert!(s.standin.instances().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_quota_refused_at_once_is_the_sites_and_a_missing_machine_type_is_rejected() {
    let s = stand().await;
    s.standin.refuse(
        "us-central1-a",
        true,
        403,
        "quotaExceeded",
        "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
    );
    let error = s
        .site()
        .submit(&job("a3-highgpu-8g", false, Some((8, "H100"))))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Refused(m) if m.contains("NVIDIA_H100_GPUS")),
        "{error:?}"
    );
    let s = stand().await;
    let error = s
        .site()
        .submit(&job("z9-huge-1", false, None))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Rejected(m) if m.contains("machineType") && m.contains("400")),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_preempted_spot_instance_is_a_site_fault_and_is_billed() {
    let s = stand().await;
    let reports = MemoryReports::default();
    let site = s.site_with(reports.clone());
    let job = job("g2-standard-4", true, Some((1, "L4")));
    let id = site.submit(&job).await.unwrap();
    let sched = s.standin.instances()[0].body["scheduling"].clone();
    assert_eq!(
        (
            sched["provisioningModel"].as_str(),
            sched["instanceTerminationAction"].as_str()
        ),
        (Some("SPOT"), Some("DELETE"))
    );
    assert_eq!(sched["automaticRestart"], false);
    reports.started(job.job_id, Utc::now());
    assert!(matches!(
        site.status(&id).await.unwrap().state,
        JobState::Running { .. }
    ));
    s.standin.preempt("us-central1-a", &id.0);
    let report = site.status(&id).await.unwrap();
    let JobState::Failed { failure, .. } = &report.state else {
        panic!("{report:?}")
    };
    assert_eq!(*failure, FailureReason::Preempted);
    assert!(report.usage.billed.is_some());
    assert!(s.standin.instances().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_an_instance_stopped_after_its_exit_is_deleted_and_the_run_succeeds() {
    let s = stand().await;
    let reports = MemoryReports::default();
    let site = s.site_with(reports.clone());
    let job = job("e2-standard-4", false, None);
    let id = site.submit(&job).await.unwrap();
    reports.started(job.job_id, Utc::now());
    reports.exited(job.job_id, 0, "hello from Google Cloud\n");
    // `shutdown -h now` stops a Compute Engine instance (TERMINATED); its disk bills on.
    let stopped = reqwest::Client::new()
        .post(format!(
            "{}/standin/instances/us-central1-a/{}/shutdown",
            s.standin.url(),
            id.0
        ))
        .send()
        .await
        .unwrap();
    assert!(stopped.status().is_success());
    assert!(matches!(
        ended(&site, &id).await,
        JobState::Succeeded { .. }
    ));
    assert!(s
        .standin
        .requests()
        .contains(&format!("delete us-central1-a/{}", id.0)));
    assert!(s.standin.instances().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_launch_sent_again_is_the_same_instance() {
    let s = stand().await;
    let gce = Gce::new(s.config.clone())
        .unwrap()
        .listing_every(Duration::ZERO);
    let job = job("n1-standard-8+nvidia-tesla-t4:2", false, Some((2, "T4")));
    let tags = vec![
        ("meridian-managed".to_string(), "true".to_string()),
        ("meridian-job-id".to_string(), job.job_id.to_string()),
    ];
    let launch = |token: &'static str| Launch {
        job: &job,
        instance_type: "n1-standard-8+nvidia-tesla-t4:2",
        zone: Some("us-central1-a"),
        spot: false,
        user_data: "#!/bin/sh\ntrue\n",
        tags: &tags,
        client_token: token,
    };
    let one = gce.launch(&launch("meridian-token-a")).await.unwrap();
    // The same request id: Compute Engine answers the first insert's operation.
    let again = gce.launch(&launch("meridian-token-a")).await.unwrap();
    // Another request id (the first expired): the name is taken, and that is the instance.
    let other = gce.launch(&launch("meridian-token-b")).await.unwrap();
    assert_eq!(
        (again.id.as_str(), other.id.as_str()),
        (one.id.as_str(), one.id.as_str())
    );
    let all = s.standin.instances();
    assert_eq!(all.len(), 1);
    let accelerators = &all[0].body["guestAccelerators"][0];
    assert_eq!(
        accelerators["acceleratorType"],
        "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4"
    );
    assert_eq!(accelerators["acceleratorCount"], 2);
    assert_eq!(
        all[0].body["machineType"],
        "zones/us-central1-a/machineTypes/n1-standard-8"
    );
    assert_eq!(one.address.as_deref(), Some("10.128.0.2"));
    gce.terminate(std::slice::from_ref(&one.id)).await.unwrap();
    // Gone already: not an error.
    for _ in 0..3 {
        gce.describe(std::slice::from_ref(&one.id)).await.unwrap();
    }
    gce.terminate(&[one.id]).await.unwrap();
    assert!(s.standin.instances().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_the_leak_sweep_pages_through_every_zone_and_sees_only_meridians() {
    let s = stand().await;
    s.standin.page_size(1);
    s.standin.add_foreign(
        "us-central1-b",
        "someone-elses",
        serde_json::json!({"team": "bio"}),
    );
    let site = s.site();
    let a = site
        .submit(&job("e2-standard-4", false, None))
        .await
        .unwrap();
    s.standin.refuse(
        "us-central1-a",
        false,
        503,
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "exhausted",
    );
    let b = site
        .submit(&job("e2-standard-4", false, None))
        .await
        .unwrap();
    let mut owned: Vec<String> = site
        .provider()
        .owned()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    owned.sort();
    assert_eq!(owned, [a.0, b.0]);
    assert!(
        s.standin
            .requests()
            .iter()
            .filter(|r| *r == "aggregated")
            .count()
            >= 2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_wrong_refresh_token_says_what_google_said_and_not_the_token() {
    let s = stand().await;
    let file = s._dir.path().join("wrong.json");
    let mut creds = s.standin.credentials_json();
    creds["refresh_token"] = "1//not-the-token".into();
    std::fs::write(&file, creds.to_string()).unwrap();
    let mut config = s.config.clone();
    config.credentials = meridian_adapter_gcp::Credentials::File(file);
    let error = Gce::new(config)
        .unwrap()
        .check()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        !error.contains("not-the-token") && !error.contains(SECRET),
        "{error}"
    );
    assert!(error.contains("invalid_grant"), "{error}");
    assert!(s.standin.instances().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_shapes_come_from_the_zones_machine_types() {
    let s = stand().await;
    let facts = s
        .site()
        .provider()
        .shapes(&[
            "a3-highgpu-8g".into(),
            "n1-standard-8+nvidia-tesla-t4:2".into(),
            "n2-standard-16".into(),
            "z9-huge-1".into(),
        ])
        .await
        .unwrap();
    assert_eq!(facts.len(), 3, "{facts:?}");
    let a3 = facts.iter().find(|f| f.name == "a3-highgpu-8g").unwrap();
    let g = a3.gpus.clone().unwrap();
    assert_eq!(
        (a3.cpus, a3.memory_bytes >> 30, g.count, g.model.as_str()),
        (208, 1872, 8, "H100")
    );
    let t4 = facts.iter().find(|f| f.name.starts_with("n1-")).unwrap();
    assert_eq!((t4.cpus, t4.gpus.clone().unwrap().count), (8, 2));
    let n2 = facts.iter().find(|f| f.name == "n2-standard-16").unwrap();
    assert_eq!(
        (n2.cpus, n2.memory_bytes >> 30, n2.gpus.is_none()),
        (16, 64, true)
    );
}

/// The conformance kit of `meridian-adapter-core`, against the stand-in: instances are
/// played on this machine by `meridian-cloud-testkit` (each running instance's startup
/// script run with `sh`, killed when the instance stops or is deleted), and report to its
/// stand-in of Meridian's run-report routes.
mod contract_conformance {
    use super::*;
    use meridian_adapter_core::conformance::Harness;
    use meridian_cloud_testkit::Running;

    async fn harness() -> Harness {
        let s = stand().await;
        let standin = s.standin.clone();
        let running = move || {
            standin
                .instances()
                .into_iter()
                .filter(|i| i.status == "RUNNING")
                .filter_map(|i| {
                    let script = i.body["metadata"]["items"]
                        .as_array()?
                        .iter()
                        .find(|m| m["key"] == "startup-script")?["value"]
                        .as_str()?
                        .to_string();
                    let power_off_url = format!(
                        "{}/standin/instances/{}/{}/shutdown",
                        standin.url(),
                        i.zone,
                        i.name
                    );
                    Some(Running {
                        id: i.name,
                        script,
                        power_off_url,
                    })
                })
                .collect()
        };
        let config = s.config.clone();
        let site = move |lifecycle, reports| {
            let gce = Gce::new(config.clone())
                .unwrap()
                .listing_every(Duration::ZERO);
            let site = CloudSite::new(gce, lifecycle, Some(Arc::new(reports))).unwrap();
            Arc::new(site) as Arc<dyn SiteAdapter>
        };
        let unknown = format!("meridian-{}", uuid::Uuid::now_v7().simple());
        let harness =
            meridian_cloud_testkit::harness(s._dir.path(), "e2-standard-4", unknown, running, site)
                .await;
        // The stand-in and its directory live as long as the test's runtime.
        std::mem::forget(s);
        harness
    }

    meridian_cloud_testkit::cloud_conformance_suite!(harness().await);
}
