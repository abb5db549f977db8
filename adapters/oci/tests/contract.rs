//! `contract_*`: the OCI site's real client against the OCI stand-in
//! (`meridian-oci-standin`), which speaks Core Services' documented request and response
//! shapes with state and checks every request's signature. No OCI emulator runs here;
//! these test the adapter's calls, signing and reading of OCI's errors.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use meridian_adapter_cloud::config::Images;
use meridian_adapter_cloud::testing::{self, MemoryReports};
use meridian_adapter_cloud::{CloudProvider, CloudSite, LifecycleConfig};
use meridian_adapter_core::{AdapterError, FailureReason, JobRequest, JobState, SiteAdapter};
use meridian_adapter_oci::signer::Signer;
use meridian_adapter_oci::{AvailabilityDomain, Credentials, Oci, OciConfig};
use meridian_oci_standin::OciStandIn;

const PEM: &str = include_str!("keys/oci-doc-test-key.pem");
const TENANCY: &str = "ocid1.tenancy.oc1..meridiantest";
const USER: &str = "ocid1.user.oc1..meridiantest";
const FINGERPRINT: &str = "20:3b:97:13:55:1c:5b:0d:d3:37:d8:50:4e:c5:3a:34";
const COMPARTMENT: &str = "ocid1.compartment.oc1..meridiantest";
const ADS: &[&str] = &["Uocm:US-ASHBURN-AD-1", "Uocm:US-ASHBURN-AD-2"];

fn key_id() -> String {
    format!("{TENANCY}/{USER}/{FINGERPRINT}")
}

async fn standin() -> OciStandIn {
    OciStandIn::start(&key_id(), PEM).await
}

fn config(standin: &OciStandIn) -> OciConfig {
    OciConfig {
        region: "us-ashburn-1".into(),
        endpoint_url: Some(standin.url().to_string()),
        compartment: COMPARTMENT.into(),
        images: Images(BTreeMap::from([
            ("x86_64".into(), "ocid1.image.oc1.iad.plain".into()),
            ("x86_64-nvidia".into(), "ocid1.image.oc1.iad.nvidia".into()),
        ])),
        availability_domains: ADS
            .iter()
            .enumerate()
            .map(|(i, name)| AvailabilityDomain {
                name: name.to_string(),
                subnet: format!("ocid1.subnet.oc1.iad.ad{}", i + 1),
            })
            .collect(),
        boot_volume_gbs: None,
        credentials: Credentials::default(),
        refresh_shapes: false,
        lifecycle: LifecycleConfig::default(),
    }
}

fn site_with(standin: &OciStandIn, reports: MemoryReports) -> CloudSite<Oci> {
    let signer = Signer::new(TENANCY, USER, FINGERPRINT, PEM).unwrap();
    // Every look lists again: the stand-in moves instances on as they are looked at.
    let oci = Oci::with_signer(config(standin), signer)
        .unwrap()
        .listing_every(Duration::ZERO);
    CloudSite::new(
        oci,
        LifecycleConfig::default(),
        Some(std::sync::Arc::new(reports)),
    )
    .unwrap()
}

fn on(standin: &OciStandIn) -> CloudSite<Oci> {
    site_with(standin, MemoryReports::default())
}

/// A host job on `shape`, spot or not, with NVIDIA GPUs when `gpus`.
fn job(shape: &str, spot: bool, gpus: bool) -> JobRequest {
    testing::job(shape, spot, gpus.then_some((1, "A10")), "hello from OCI")
}

fn launches(standin: &OciStandIn) -> Vec<String> {
    standin
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("LaunchInstance"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_launch_is_signed_sized_tagged_and_terminated_with_its_boot_volume() {
    let standin = standin().await;
    let site = on(&standin);
    let job = job("VM.Standard.E5.Flex", false, false);
    let id = site.submit(&job).await.unwrap();
    let launched = standin.instances();
    assert_eq!(launched.len(), 1);
    let body = &launched[0].launch;
    assert_eq!(launched[0].id, id.0);
    assert_eq!(body["availabilityDomain"], ADS[0]);
    assert_eq!(body["compartmentId"], COMPARTMENT);
    assert_eq!(
        body["createVnicDetails"]["subnetId"],
        "ocid1.subnet.oc1.iad.ad1"
    );
    assert_eq!(
        body["sourceDetails"]["imageId"],
        "ocid1.image.oc1.iad.plain"
    );
    // A flexible shape sized to the job: 4 vCPUs are 2 OCPUs.
    assert_eq!(body["shapeConfig"]["ocpus"], 2);
    assert_eq!(body["shapeConfig"]["memoryInGBs"], 16);
    assert!(body.get("preemptibleInstanceConfig").is_none());
    assert_eq!(body["freeformTags"]["meridian-managed"], "true");
    assert_eq!(
        body["freeformTags"]["meridian-job-id"],
        job.job_id.to_string()
    );
    let script = base64::engine::general_purpose::STANDARD
        .decode(body["metadata"]["user_data"].as_str().unwrap())
        .unwrap();
    let script = String::from_utf8(script).unwrap();
    assert!(script.starts_with("#!/bin/sh"), "{script}");
    assert!(script.contains("hello from OCI"), "{script}");
    assert_eq!(
        standin.unsigned(),
        0,
        "every request was signed as OCI requires"
    );

    // Booting, then running, as OCI lists it; found again by its tag after a restart.
    assert_eq!(site.status(&id).await.unwrap().state, JobState::Pending);
    assert_eq!(site.provider().find(job.job_id).await.unwrap()[0].id, id.0);
    // Cancelled: terminated with its boot volume, so nothing is left billing.
    site.cancel(&id).await.unwrap();
    let terminate = format!("TerminateInstance {} preserveBootVolume=false", id.0);
    assert!(
        standin.requests().contains(&terminate),
        "{:?}",
        standin.requests()
    );
    let mut state = site.status(&id).await.unwrap().state;
    for _ in 0..5 {
        if state.is_terminal() {
            break;
        }
        state = site.status(&id).await.unwrap().state;
    }
    assert!(matches!(state, JobState::Cancelled { .. }), "{state:?}");
    assert!(site.provider().owned().await.unwrap().is_empty());
    assert!(standin.instances().iter().all(|i| i.state == "TERMINATED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_out_of_host_capacity_in_one_domain_goes_to_the_next_and_keeps_it_out() {
    let standin = standin().await;
    standin.refuse(ADS[0], 500, "InternalError", "Out of host capacity.");
    let site = on(&standin);
    let id = site
        .submit(&job("VM.GPU.A10.1", false, true))
        .await
        .unwrap();
    let launched = standin.instances();
    assert_eq!(
        (launched.len(), launched[0].id.as_str()),
        (1, id.0.as_str())
    );
    assert_eq!(launched[0].availability_domain, ADS[1]);
    assert_eq!(
        launched[0].launch["sourceDetails"]["imageId"],
        "ocid1.image.oc1.iad.nvidia"
    );
    assert_eq!(
        launches(&standin),
        vec![
            format!("LaunchInstance {}", ADS[0]),
            format!("LaunchInstance {}", ADS[1])
        ]
    );
    site.submit(&job("VM.GPU.A10.1", false, true))
        .await
        .unwrap();
    assert_eq!(launches(&standin)[2], format!("LaunchInstance {}", ADS[1]));

    // Out of capacity everywhere: refused, each domain named.
    let standin = self::standin().await;
    for ad in ADS {
        standin.refuse(ad, 500, "InternalError", "Out of host capacity.");
    }
    let error = on(&standin)
        .submit(&job("BM.GPU.H100.8", false, true))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Refused(m) if ADS.iter().all(|ad| m.contains(ad))),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_service_limit_refuses_the_whole_site_at_once() {
    let standin = standin().await;
    standin.refuse(
        ADS[0],
        400,
        "LimitExceeded",
        "The following service limits were exceeded: gpu-h100-count. Request a service limit increase from the service limits page in the console.",
    );
    let error = on(&standin)
        .submit(&job("BM.GPU.H100.8", false, true))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Refused(m) if m.contains("LimitExceeded")),
        "{error:?}"
    );
    assert_eq!(
        launches(&standin),
        vec![format!("LaunchInstance {}", ADS[0])]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_request_oci_can_never_take_is_rejected_not_refused() {
    let standin = standin().await;
    standin.refuse(
        ADS[0],
        404,
        "NotAuthorizedOrNotFound",
        "Authorization failed or requested resource not found.",
    );
    let error = on(&standin)
        .submit(&job("VM.Standard.E5.Flex", false, false))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Rejected(m) if m.contains("NotAuthorizedOrNotFound")),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_preemptible_instance_taken_back_is_a_site_fault() {
    let standin = standin().await;
    let reports = MemoryReports::default();
    let site = site_with(&standin, reports.clone());
    let job = job("VM.GPU.A10.1", true, true);
    let id = site.submit(&job).await.unwrap();
    assert_eq!(
        standin.instances()[0].launch["preemptibleInstanceConfig"]["preemptionAction"],
        serde_json::json!({"type": "TERMINATE", "preserveBootVolume": false})
    );
    reports.started(job.job_id, Utc::now());
    site.status(&id).await.unwrap();
    assert!(matches!(
        site.status(&id).await.unwrap().state,
        JobState::Running { .. }
    ));
    standin.reclaim(&id.0);
    let report = site.status(&id).await.unwrap();
    let JobState::Failed { failure, .. } = &report.state else {
        panic!("{report:?}")
    };
    assert_eq!(*failure, FailureReason::Preempted);
    assert!(
        failure.is_site_fault(),
        "a reclaim sends the work back to placement"
    );
    assert!(
        report.usage.billed.is_some(),
        "the instance's time is billed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_retry_token_given_again_launches_nothing_new() {
    let standin = standin().await;
    let site = on(&standin);
    let job = job("VM.Standard.E5.Flex", false, false);
    let tags = vec![("meridian-managed".to_string(), "true".to_string())];
    let launch = meridian_adapter_cloud::Launch {
        job: &job,
        instance_type: "VM.Standard.E5.Flex",
        zone: Some(ADS[1]),
        spot: false,
        user_data: "#!/bin/sh\ntrue\n",
        tags: &tags,
        client_token: "meridian-token-1",
    };
    let first = site.provider().launch(&launch).await.unwrap();
    let again = site.provider().launch(&launch).await.unwrap();
    assert_eq!(first.id, again.id);
    assert_eq!(standin.instances().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_request_signed_with_an_unknown_key_is_refused_by_oci() {
    let standin = OciStandIn::start("ocid1.tenancy.oc1..other/u/f", PEM).await;
    let error = on(&standin).provider().check().await.unwrap_err();
    assert!(
        error.to_string().contains("401 NotAuthenticated"),
        "{error}"
    );
    assert_eq!(standin.unsigned(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_shapes_are_read_from_list_shapes() {
    let standin = standin().await;
    let facts = on(&standin)
        .provider()
        .shapes(&[
            "BM.GPU.H100.8".into(),
            "BM.GPU.MI300X.8".into(),
            "BM.Nope".into(),
        ])
        .await
        .unwrap();
    let summary: Vec<(String, u32, u32, String)> = facts
        .iter()
        .map(|f| {
            let g = f.gpus.clone().unwrap();
            (
                f.name.clone(),
                f.cpus,
                g.count,
                format!("{} {}", g.vendor, g.model),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "BM.GPU.H100.8".to_string(),
                224,
                8,
                "nvidia H100".to_string()
            ),
            (
                "BM.GPU.MI300X.8".to_string(),
                224,
                8,
                "amd MI300X".to_string()
            )
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_the_api_key_comes_from_ocis_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("oci_api_key.pem");
    std::fs::write(&key, PEM).unwrap();
    let file = dir.path().join("config");
    std::fs::write(
        &file,
        format!(
            "[DEFAULT]\nuser={USER}\nfingerprint={FINGERPRINT}\ntenancy={TENANCY}\nregion=us-ashburn-1\nkey_file={}\n",
            key.display()
        ),
    )
    .unwrap();
    let standin = standin().await;
    let mut config = config(&standin);
    config.credentials = Credentials {
        config_file: file,
        profile: "DEFAULT".into(),
    };
    let oci = Oci::new(config.clone()).unwrap();
    oci.check().await.unwrap();
    config.credentials.profile = "PROD".into();
    let error = Oci::new(config).err().unwrap();
    assert!(error.contains("no profile [PROD]"), "{error}");
}

/// The conformance kit of `meridian-adapter-core`, against the stand-in: instances are
/// played on this machine by `meridian-cloud-testkit` (each running instance's user data
/// run with `sh`, killed when the instance stops or terminates), and report to its
/// stand-in of Meridian's run-report routes.
mod contract_conformance {
    use super::*;
    use meridian_adapter_core::conformance::Harness;
    use meridian_cloud_testkit::Running;

    async fn harness() -> Harness {
        let standin = standin().await;
        let dir = tempfile::tempdir().unwrap();
        let listed = standin.clone();
        let running = move || {
            listed
                .instances()
                .into_iter()
                .filter(|i| i.state == "RUNNING")
                .filter_map(|i| {
                    let script = base64::engine::general_purpose::STANDARD
                        .decode(i.launch["metadata"]["user_data"].as_str()?)
                        .ok()?;
                    Some(Running {
                        power_off_url: format!(
                            "{}/standin/instances/{}/shutdown",
                            listed.url(),
                            i.id
                        ),
                        id: i.id,
                        script: String::from_utf8(script).ok()?,
                    })
                })
                .collect()
        };
        let config = config(&standin);
        let site = move |lifecycle, reports| {
            let signer = Signer::new(TENANCY, USER, FINGERPRINT, PEM).unwrap();
            let oci = Oci::with_signer(config.clone(), signer)
                .unwrap()
                .listing_every(Duration::ZERO);
            let site = CloudSite::new(oci, lifecycle, Some(std::sync::Arc::new(reports))).unwrap();
            std::sync::Arc::new(site) as std::sync::Arc<dyn SiteAdapter>
        };
        let harness = meridian_cloud_testkit::harness(
            dir.path(),
            "VM.Standard.E5.Flex",
            "ocid1.instance.oc1.iad.nothinghere".into(),
            running,
            site,
        )
        .await;
        // The stand-in and the directory live as long as the test's runtime.
        std::mem::forget((standin, dir));
        harness
    }

    meridian_cloud_testkit::cloud_conformance_suite!(harness().await);
}
