//! `contract_*`: the Azure site's real client against the Azure stand-in
//! (`meridian-azure-standin`), which speaks Resource Manager's documented shapes with
//! state (long-running operations, allocation failures, quotas, Spot evictions) and
//! issues tokens as Entra ID does. No Azure emulator for compute runs here.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use meridian_adapter_azure::credential::Source;
use meridian_adapter_azure::{Arm, AzureConfig};
use meridian_adapter_cloud::testing::{self, MemoryReports};
use meridian_adapter_cloud::{CloudProvider, CloudSite, LifecycleConfig};
use meridian_adapter_core::{AdapterError, FailureReason, JobRequest, JobState, SiteAdapter};
use meridian_azure_standin::AzureStandIn;

const CLIENT: &str = "5b7e2c1a-0d3f-4e8a-9b6c-1f2e3d4c5b6a";
const SECRET: &str = "meridian-azure-test-secret";
const SUB: &str = "6f3c1a52-9d1e-4b7a-8c2f-0e5d4a3b2c1d";

fn config(standin: &AzureStandIn) -> AzureConfig {
    let text = format!(
        "subscription: {SUB}\nresource_group: jobs\nlocation: eastus\nzones: ['1', '2']\nsubnet: /subscriptions/{SUB}/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/s\nimages: {{x86_64: 'Canonical:ubuntu-24_04-lts:server:latest', x86_64-nvidia: /subscriptions/{SUB}/resourceGroups/img/providers/Microsoft.Compute/images/nvidia}}\nssh_public_key: ssh-ed25519 AAAAC3Nz ops\nendpoint_url: {0}\nauthority_url: {0}\n",
        standin.url()
    );
    meridian_adapter_core::registry::parse_config(&text).unwrap()
}

fn source(secret: &str) -> Source {
    Source::ClientSecret {
        tenant: "72f988bf-86f1-41af-91ab-2d7cd011db47".into(),
        client: CLIENT.into(),
        secret: secret.into(),
    }
}

fn site_with(standin: &AzureStandIn, reports: MemoryReports) -> CloudSite<Arm> {
    // Every look lists again: the stand-in moves VMs on as they are looked at.
    let arm = Arm::new(config(standin), source(SECRET))
        .unwrap()
        .listing_every(Duration::ZERO);
    CloudSite::new(arm, LifecycleConfig::default(), Some(Arc::new(reports))).unwrap()
}

fn on(standin: &AzureStandIn) -> CloudSite<Arm> {
    site_with(standin, MemoryReports::default())
}

async fn standin() -> AzureStandIn {
    AzureStandIn::start(CLIENT, SECRET).await
}

/// A host job on `shape`, spot or not, with NVIDIA GPUs when `gpus`.
fn job(shape: &str, spot: bool, gpus: bool) -> JobRequest {
    testing::job(shape, spot, gpus.then_some((8, "H100")), "hello from Azure")
}

fn creates(standin: &AzureStandIn) -> Vec<String> {
    standin
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("PUT vm"))
        .collect()
}

/// Looks until the run ends, as the site runner would.
async fn ended(site: &CloudSite<Arm>, id: &meridian_adapter_core::BackendJobId) -> JobState {
    for _ in 0..10 {
        let state = site.status(id).await.unwrap().state;
        if state.is_terminal() {
            return state;
        }
    }
    panic!("never ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_vm_is_created_with_its_nic_followed_to_running_and_deleted_with_its_disk_and_nic(
) {
    let standin = standin().await;
    let site = on(&standin);
    let job = job("Standard_D4s_v5", false, false);
    let id = site.submit(&job).await.unwrap();
    let vms = standin.vms();
    assert_eq!(vms.len(), 1);
    let vm = &vms[0];
    assert_eq!(vm.name, id.0);
    assert_eq!(vm.zone.as_deref(), Some("1"));
    assert_eq!(
        vm.provisioning, "Succeeded",
        "the create was followed to its end"
    );
    let p = &vm.body["properties"];
    assert_eq!(p["hardwareProfile"]["vmSize"], "Standard_D4s_v5");
    assert_eq!(
        p["storageProfile"]["imageReference"]["publisher"],
        "Canonical"
    );
    assert_eq!(p["storageProfile"]["osDisk"]["deleteOption"], "Delete");
    assert_eq!(
        p["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"],
        "Delete"
    );
    assert_eq!(
        p["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"],
        true
    );
    assert!(p.get("priority").is_none());
    assert_eq!(vm.body["tags"]["meridian-job-id"], job.job_id.to_string());
    let script = base64::engine::general_purpose::STANDARD
        .decode(p["osProfile"]["customData"].as_str().unwrap())
        .unwrap();
    assert!(String::from_utf8(script)
        .unwrap()
        .contains("hello from Azure"));
    assert!(standin.requests().contains(&"GET operation".to_string()));
    assert_eq!(standin.nics().len(), 1);

    // Up, its bootstrap not heard from yet.
    let report = site.status(&id).await.unwrap();
    assert_eq!(report.state, JobState::Pending);
    assert_eq!(site.provider().find(job.job_id).await.unwrap()[0].id, id.0);

    site.cancel(&id).await.unwrap();
    assert!(matches!(
        ended(&site, &id).await,
        JobState::Cancelled { .. }
    ));
    assert!(
        standin.vms().is_empty() && standin.nics().is_empty() && standin.disks().is_empty(),
        "nothing left billing: {:?} {:?} {:?}",
        standin.vms(),
        standin.nics(),
        standin.disks()
    );
    assert!(site.provider().owned().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_an_allocation_failure_in_one_zone_goes_to_the_next_and_leaves_nothing_behind() {
    let standin = standin().await;
    standin.refuse(
        "1",
        false,
        200,
        "ZonalAllocationFailed",
        "Allocation failed. We do not have sufficient capacity for the requested VM size in this zone.",
    );
    let site = on(&standin);
    let id = site
        .submit(&job("Standard_ND96isr_H100_v5", false, true))
        .await
        .unwrap();
    let vms = standin.vms();
    assert_eq!(vms.len(), 1, "the failed VM was deleted: {vms:?}");
    assert_eq!(
        (vms[0].name.as_str(), vms[0].zone.as_deref()),
        (id.0.as_str(), Some("2"))
    );
    assert!(
        vms[0].body["properties"]["storageProfile"]["imageReference"]["id"]
            .as_str()
            .unwrap()
            .ends_with("/images/nvidia")
    );
    assert_eq!(standin.nics().len(), 1, "{:?}", standin.nics());
    assert_eq!(standin.disks().len(), 1);
    assert_eq!(
        creates(&standin)
            .iter()
            .map(|r| r.rsplit('=').next().unwrap().to_string())
            .collect::<Vec<_>>(),
        ["1", "2"]
    );
    // Kept out for its backoff: the next run goes straight to zone 2.
    site.submit(&job("Standard_ND96isr_H100_v5", false, true))
        .await
        .unwrap();
    assert!(creates(&standin)[2].ends_with("zone=2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_size_not_available_at_once_is_a_zone_refusal_and_its_nic_is_removed() {
    let standin = standin().await;
    for zone in ["1", "2"] {
        standin.refuse(
            zone,
            true,
            409,
            "SkuNotAvailable",
            "The requested size for resource is currently not available in location 'eastus' zones.",
        );
    }
    let error = on(&standin)
        .submit(&job("Standard_ND96isr_H100_v5", false, true))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Refused(m) if m.contains("SkuNotAvailable") && m.contains('2')),
        "{error:?}"
    );
    assert!(standin.vms().is_empty());
    assert!(standin.nics().is_empty(), "{:?}", standin.nics());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_quota_refuses_the_whole_site_at_once() {
    let standin = standin().await;
    standin.refuse(
        "1",
        true,
        409,
        "OperationNotAllowed",
        "Operation could not be completed as it results in exceeding approved standardNDSH100v5Family Cores quota.",
    );
    let error = on(&standin)
        .submit(&job("Standard_ND96isr_H100_v5", false, true))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Refused(m) if m.contains("quota")),
        "{error:?}"
    );
    assert_eq!(creates(&standin).len(), 1, "no second zone for a quota");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_an_evicted_spot_vm_is_a_site_fault_and_is_billed() {
    let standin = standin().await;
    let reports = MemoryReports::default();
    let site = site_with(&standin, reports.clone());
    let job = job("Standard_D4s_v5", true, false);
    let id = site.submit(&job).await.unwrap();
    let p = standin.vms()[0].body["properties"].clone();
    assert_eq!(
        (p["priority"].as_str(), p["evictionPolicy"].as_str()),
        (Some("Spot"), Some("Delete"))
    );
    assert_eq!(p["billingProfile"]["maxPrice"], -1);
    reports.started(job.job_id, Utc::now());
    assert!(matches!(
        site.status(&id).await.unwrap().state,
        JobState::Running { .. }
    ));
    standin.evict(&id.0);
    let report = site.status(&id).await.unwrap();
    let JobState::Failed { failure, .. } = &report.state else {
        panic!("{report:?}")
    };
    assert_eq!(*failure, FailureReason::Preempted);
    assert!(report.usage.billed.is_some());
    assert!(standin.nics().is_empty() && standin.disks().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_vm_stopped_after_its_exit_is_deleted_and_the_run_succeeds() {
    let standin = standin().await;
    let reports = MemoryReports::default();
    let site = site_with(&standin, reports.clone());
    let job = job("Standard_D4s_v5", false, false);
    let id = site.submit(&job).await.unwrap();
    reports.started(job.job_id, Utc::now());
    reports.exited(job.job_id, 0, "hello from Azure\n");
    // `shutdown -h now` in an Azure VM stops it, and a stopped VM still bills.
    standin.stop(&id.0);
    assert!(matches!(
        ended(&site, &id).await,
        JobState::Succeeded { .. }
    ));
    assert!(standin.requests().contains(&format!("DELETE vm {}", id.0)));
    assert!(standin.vms().is_empty() && standin.nics().is_empty() && standin.disks().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_wrong_secret_says_what_entra_said_and_not_the_secret() {
    let standin = standin().await;
    let arm = Arm::new(config(&standin), source("not-the-secret")).unwrap();
    let error = arm.check().await.unwrap_err().to_string();
    assert!(
        error.contains("invalid_client") && error.contains("AZURE_CLIENT_SECRET"),
        "{error}"
    );
    assert!(!error.contains("not-the-secret"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_sizes_come_from_the_resource_skus() {
    let standin = standin().await;
    let facts = on(&standin)
        .provider()
        .shapes(&[
            "Standard_ND96isr_MI300X_v5".into(),
            "Standard_D4s_v5".into(),
        ])
        .await
        .unwrap();
    let mi = facts
        .iter()
        .find(|f| f.name == "Standard_ND96isr_MI300X_v5")
        .unwrap();
    let g = mi.gpus.clone().unwrap();
    assert_eq!(
        (mi.cpus, g.count, g.vendor.as_str(), g.model.as_str()),
        (96, 8, "amd", "MI300X")
    );
    let d4 = facts.iter().find(|f| f.name == "Standard_D4s_v5").unwrap();
    assert_eq!(
        (d4.cpus, d4.memory_bytes >> 30, d4.gpus.is_none()),
        (4, 16, true)
    );
}

/// The conformance kit of `meridian-adapter-core`, against the stand-in: VMs are played
/// on this machine by `meridian-cloud-testkit` (each running VM's custom data run with
/// `sh`, killed when the VM stops or is deleted), and report to its stand-in of
/// Meridian's run-report routes.
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
                .vms()
                .into_iter()
                .filter(|v| v.provisioning == "Succeeded" && v.power == "running")
                .filter_map(|v| {
                    let script = base64::engine::general_purpose::STANDARD
                        .decode(v.body["properties"]["osProfile"]["customData"].as_str()?)
                        .ok()?;
                    Some(Running {
                        power_off_url: format!("{}/standin/vms/{}/shutdown", listed.url(), v.name),
                        id: v.name,
                        script: String::from_utf8(script).ok()?,
                    })
                })
                .collect()
        };
        let config = config(&standin);
        let site = move |lifecycle, reports| {
            let arm = Arm::new(config.clone(), source(SECRET))
                .unwrap()
                .listing_every(Duration::ZERO);
            let site = CloudSite::new(arm, lifecycle, Some(Arc::new(reports))).unwrap();
            Arc::new(site) as Arc<dyn SiteAdapter>
        };
        let harness = meridian_cloud_testkit::harness(
            dir.path(),
            "Standard_D4s_v5",
            "mer-nothing-here".into(),
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
