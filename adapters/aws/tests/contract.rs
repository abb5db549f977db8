//! `contract_*`: the AWS site's real client against the EC2 stand-in
//! (`meridian-ec2-standin`), for what moto cannot produce: EC2's capacity and limit
//! error responses, a spot reclaim, and client tokens honoured. The stand-in answers in
//! the Query API's documented XML, so these test the adapter's reading of EC2's codes.

mod common;

use std::time::Duration;

use chrono::Utc;
use common::*;
use meridian_adapter_cloud::{CloudProvider, LifecycleConfig};
use meridian_adapter_core::{AdapterError, FailureReason, JobState, SiteAdapter};
use meridian_ec2_standin::Ec2StandIn;

const AMI: &str = "ami-0123456789abcdef0";
const ZONES: &[&str] = &["us-east-1a", "us-east-1b"];

/// A site on `standin`, launching in both zones, its runs' reports kept nowhere.
fn on(standin: &Ec2StandIn) -> meridian_adapter_cloud::CloudSite<meridian_adapter_aws::Ec2> {
    site(
        standin.url(),
        AMI,
        ZONES,
        LifecycleConfig::default(),
        MemoryReports::default(),
    )
}

fn launches(standin: &Ec2StandIn) -> Vec<String> {
    standin
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("RunInstances"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_zone_without_capacity_is_skipped_and_kept_out() {
    let standin = Ec2StandIn::start().await;
    standin.refuse(
        "us-east-1a",
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient g6.xlarge capacity in the Availability Zone you requested (us-east-1a).",
    );
    let site = on(&standin);
    let first = job("g6.xlarge", Duration::from_secs(600), false, true);
    let id = site.submit(&first).await.unwrap();
    let launched = standin.instances();
    assert_eq!(launched.len(), 1);
    assert_eq!(launched[0].id, id.0);
    assert_eq!(launched[0].zone, "us-east-1b");
    assert_eq!(
        launches(&standin),
        vec!["RunInstances us-east-1a", "RunInstances us-east-1b"]
    );
    // The refusing zone is kept out for its backoff: the next launch goes straight on.
    let second = job("g6.xlarge", Duration::from_secs(600), false, true);
    site.submit(&second).await.unwrap();
    assert_eq!(launches(&standin).len(), 3);
    assert_eq!(launches(&standin)[2], "RunInstances us-east-1b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_every_capacity_code_in_every_zone_is_a_site_refusal_naming_each_attempt() {
    for code in [
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "UnfulfillableCapacity",
    ] {
        let standin = Ec2StandIn::start().await;
        for zone in ZONES {
            standin.refuse(zone, code, &format!("no capacity in {zone}"));
        }
        let site = on(&standin);
        let error = site
            .submit(&job("g6.xlarge", Duration::from_secs(600), true, true))
            .await
            .unwrap_err();
        let AdapterError::Refused(message) = &error else {
            panic!("{code}: not a refusal: {error:?}")
        };
        for zone in ZONES {
            assert!(message.contains(&format!("{zone}: {code}")), "{message}");
        }
        assert!(message.contains("g6.xlarge spot"), "{message}");
        assert!(standin.instances().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_an_account_limit_refuses_the_whole_site_at_once() {
    for code in [
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
    ] {
        let standin = Ec2StandIn::start().await;
        standin.refuse(
            "us-east-1a",
            code,
            "You have requested more vCPU capacity than your current vCPU limit allows.",
        );
        let site = on(&standin);
        let error = site
            .submit(&job("p4d.24xlarge", Duration::from_secs(600), false, true))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, AdapterError::Refused(m) if m.contains(code) && m.contains("limits")),
            "{code}: {error:?}"
        );
        // A limit of the account holds in every zone: no second try.
        assert_eq!(
            launches(&standin),
            vec!["RunInstances us-east-1a"],
            "{code}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_request_ec2_can_never_take_is_rejected_not_refused() {
    let standin = Ec2StandIn::start().await;
    standin.refuse(
        "us-east-1a",
        "InvalidAMIID.NotFound",
        "The image id '[ami-0123456789abcdef0]' does not exist",
    );
    let site = site(
        standin.url(),
        AMI,
        &["us-east-1a"],
        LifecycleConfig::default(),
        MemoryReports::default(),
    );
    let error = site
        .submit(&job("c7i.4xlarge", Duration::from_secs(600), false, false))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AdapterError::Rejected(m) if m.contains("InvalidAMIID.NotFound")),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_spot_reclaim_is_a_site_fault() {
    let standin = Ec2StandIn::start().await;
    let reports = MemoryReports::default();
    let site = site(
        standin.url(),
        AMI,
        ZONES,
        LifecycleConfig::default(),
        reports.clone(),
    );
    let job = job("g6.xlarge", Duration::from_secs(3600), true, true);
    let id = site.submit(&job).await.unwrap();
    assert!(standin.instances()[0].spot);
    reports.started(job.job_id, Utc::now());
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
        "a reclaim must send the work back to placement"
    );
    assert!(
        report.usage.billed.is_some(),
        "the reclaimed instance's time is billed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_a_client_token_given_again_launches_nothing_new() {
    let standin = Ec2StandIn::start().await;
    let site = on(&standin);
    let job = job("c7i.4xlarge", Duration::from_secs(600), false, false);
    let tags = vec![("meridian-managed".to_string(), "true".to_string())];
    let launch = meridian_adapter_cloud::Launch {
        job: &job,
        instance_type: "c7i.4xlarge",
        zone: Some("us-east-1b"),
        spot: false,
        user_data: "#!/bin/sh\ntrue\n",
        tags: &tags,
        client_token: "meridian-token-1",
    };
    let first = site.provider().launch(&launch).await.unwrap();
    let again = site.provider().launch(&launch).await.unwrap();
    assert_eq!(first.id, again.id);
    assert_eq!(standin.instances().len(), 1);
    assert_eq!(
        standin.instances()[0].shutdown_behavior.as_deref(),
        Some("terminate")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contract_many_runs_are_followed_with_one_describe_and_a_forgotten_one_spoils_none() {
    let standin = Ec2StandIn::start().await;
    let site = on(&standin);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let job = job("c7i.4xlarge", Duration::from_secs(600), false, false);
        ids.push(site.submit(&job).await.unwrap());
    }
    // EC2 forgets a terminated instance after about an hour.
    ids.push(meridian_adapter_core::BackendJobId(
        "i-0000000000000dead".into(),
    ));
    let describes = || {
        standin
            .requests()
            .iter()
            .filter(|r| *r == "DescribeInstances")
            .count()
    };
    let before = describes();
    let reports = site.status_all(&ids).await;
    assert_eq!(describes() - before, 1, "one call for all of them");
    for report in &reports[..3] {
        assert_eq!(report.as_ref().unwrap().state, JobState::Pending);
    }
    assert!(
        matches!(reports[3], Err(AdapterError::UnknownJob(_))),
        "{:?}",
        reports[3]
    );
}
