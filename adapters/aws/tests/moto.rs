//! The AWS site's real client (`aws-sdk-ec2`) against moto's EC2 server: launch with
//! tags, user data and spot; find again by tag; terminate on cancel and at walltime;
//! the leak sweep; shapes from DescribeInstanceTypes. Every test ends with nothing of
//! Meridian's left running in moto.

mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::InstanceAttributeName;
use chrono::Utc;
use common::*;
use meridian_adapter_aws::Ec2;
use meridian_adapter_cloud::{CloudSite, LifecycleConfig};
use meridian_adapter_core::{FailureReason, JobState, SiteAdapter};
use meridian_datamover::testkit::Moto;

/// An image moto knows (its stock Amazon Linux AMI).
const AMI: &str = "ami-12c6146b";

/// A site on moto with the default lifecycle, and the runs' reports it reads.
fn on_moto(moto: &Moto) -> (CloudSite<Ec2>, MemoryReports) {
    let reports = MemoryReports::default();
    let site = site(
        moto.url(),
        AMI,
        &[],
        LifecycleConfig::default(),
        reports.clone(),
    );
    (site, reports)
}

/// The run's report once it has ended.
async fn ended(
    site: &CloudSite<Ec2>,
    id: &meridian_adapter_core::BackendJobId,
) -> meridian_adapter_core::JobReport {
    eventually("the run ends", || async {
        let r = site.status(id).await.unwrap();
        r.state.is_terminal().then_some(r)
    })
    .await
}

async fn assert_nothing_left(site: &CloudSite<Ec2>) {
    let owned = site.owned().await.unwrap();
    assert!(owned.is_empty(), "left running in moto: {owned:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_carries_tags_user_data_and_spot_and_is_found_again_not_launched_twice() {
    let moto = Moto::start();
    let reports = MemoryReports::default();
    let site = site(moto.url(), AMI, &[], LifecycleConfig::default(), reports);
    let job = job("g6.xlarge", Duration::from_secs(3600), true, true);

    let id = site.submit(&job).await.unwrap();
    let client = site.provider().client().await;
    let described = client
        .describe_instances()
        .instance_ids(&id.0)
        .send()
        .await
        .unwrap();
    let instance = &described.reservations()[0].instances()[0];
    assert_eq!(instance.instance_type().unwrap().as_str(), "g6.xlarge");
    assert_eq!(instance.image_id(), Some(AMI));
    assert_eq!(
        instance.instance_lifecycle().map(|l| l.as_str()),
        Some("spot"),
        "a spot offer launches spot capacity"
    );
    let tags: std::collections::BTreeMap<_, _> = instance
        .tags()
        .iter()
        .map(|t| (t.key().unwrap(), t.value().unwrap()))
        .collect();
    assert_eq!(tags["meridian-managed"], "true");
    assert_eq!(tags["meridian-job-id"], job.job_id.to_string());
    assert_eq!(tags["meridian-workflow-id"], job.workflow_id.to_string());
    assert_eq!(tags["meridian-tenant"], "physics");
    assert_eq!(tags["meridian-walltime"], "3600");
    assert_eq!(tags["meridian-gpu-vendor"], "nvidia");

    let user_data = client
        .describe_instance_attribute()
        .instance_id(&id.0)
        .attribute(InstanceAttributeName::UserData)
        .send()
        .await
        .unwrap();
    let encoded = user_data.user_data().and_then(|u| u.value()).unwrap();
    let script = String::from_utf8(aws_smithy_types::base64::decode(encoded).unwrap()).unwrap();
    assert!(script.starts_with("#!/bin/sh\n"), "{script}");
    assert!(script.contains(&job.job_id.to_string()), "{script}");
    assert!(script.contains("/v1/runs/$meridian_job/report"), "{script}");
    let shutdown = client
        .describe_instance_attribute()
        .instance_id(&id.0)
        .attribute(InstanceAttributeName::InstanceInitiatedShutdownBehavior)
        .send()
        .await
        .unwrap();
    assert_eq!(
        shutdown
            .instance_initiated_shutdown_behavior()
            .and_then(|b| b.value()),
        Some("terminate"),
        "powering off must end the bill"
    );

    // A retried submission, or one after a restart, finds it by its tag.
    assert_eq!(site.submit(&job).await.unwrap(), id);
    assert_eq!(site.find(job.job_id).await.unwrap(), Some(id.clone()));
    let all = client.describe_instances().send().await.unwrap();
    let count: usize = all.reservations().iter().map(|r| r.instances().len()).sum();
    assert_eq!(count, 1, "launched twice");

    // Up, but its bootstrap has not said anything: waiting, and saying why.
    let report = site.status(&id).await.unwrap();
    assert_eq!(report.state, JobState::Pending);
    assert!(report.waiting.is_some(), "{report:?}");

    site.cancel(&id).await.unwrap();
    assert_nothing_left(&site).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_terminates_and_bills_launch_to_terminate() {
    let moto = Moto::start();
    let (site, reports) = on_moto(&moto);
    let job = job("c7i.4xlarge", Duration::from_secs(3600), false, false);
    let id = site.submit(&job).await.unwrap();
    reports.started(job.job_id, Utc::now());
    assert!(matches!(
        site.status(&id).await.unwrap().state,
        JobState::Running { .. }
    ));

    site.cancel(&id).await.unwrap();
    let report = ended(&site, &id).await;
    assert!(
        matches!(report.state, JobState::Cancelled { .. }),
        "{report:?}"
    );
    let billed = report.usage.billed.expect("a billed interval");
    assert!(billed.from <= billed.to, "{billed:?}");
    // Cancelling again is not an error.
    site.cancel(&id).await.unwrap();
    assert_nothing_left(&site).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_walltime_and_grace_is_terminated_as_a_timeout() {
    let moto = Moto::start();
    let reports = MemoryReports::default();
    let lifecycle = LifecycleConfig {
        walltime_grace: Duration::ZERO,
        ..LifecycleConfig::default()
    };
    let site = site(moto.url(), AMI, &[], lifecycle, reports.clone());
    let job = job("c7i.4xlarge", Duration::from_secs(1), false, false);
    let id = site.submit(&job).await.unwrap();
    reports.started(job.job_id, Utc::now() - chrono::Duration::seconds(5));

    // The first look sees it over its walltime and terminates it; a later one sees it gone.
    let report = ended(&site, &id).await;
    let JobState::Failed { failure, .. } = report.state else {
        panic!("{report:?}")
    };
    assert_eq!(failure, FailureReason::Timeout);
    assert_nothing_left(&site).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_reported_terminates_the_instance_and_ends_the_run_with_its_code_and_output() {
    let moto = Moto::start();
    let (site, reports) = on_moto(&moto);
    let ok = job("c7i.4xlarge", Duration::from_secs(600), false, false);
    let bad = job("c7i.4xlarge", Duration::from_secs(600), false, false);
    let ok_id = site.submit(&ok).await.unwrap();
    let bad_id = site.submit(&bad).await.unwrap();
    for (job, code) in [(&ok, 0), (&bad, 3)] {
        reports.started(job.job_id, Utc::now());
        reports.exited(job.job_id, code, &format!("exit {code}\n"));
    }
    assert!(matches!(
        ended(&site, &ok_id).await.state,
        JobState::Succeeded { .. }
    ));
    assert!(matches!(
        ended(&site, &bad_id).await.state,
        JobState::Failed {
            exit_code: Some(3),
            ..
        }
    ));
    assert_eq!(site.logs(&bad_id).await.unwrap().stdout, "exit 3\n");
    assert_nothing_left(&site).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leak_sweep_terminates_tagged_instances_no_live_job_needs_and_nothing_else() {
    use meridian_eventlog::sqlite::SqliteLog;
    use meridian_eventlog::EventLog;
    use meridian_site_runner::SiteRunner;

    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    register(&*log, "aws-test").await;
    let reports = MemoryReports::default();
    let site = Arc::new(site(
        moto.url(),
        AMI,
        &[],
        LifecycleConfig::default(),
        reports,
    ));
    // Launched for a job the log never heard of (a lost log, a crash mid-launch).
    let leaked = job("c7i.4xlarge", Duration::from_secs(600), false, false);
    let leaked_id = site.submit(&leaked).await.unwrap();
    // And one someone launched by hand, without Meridian's tags: not Meridian's to end.
    let client = site.provider().client().await;
    let foreign = client
        .run_instances()
        .image_id(AMI)
        .instance_type(aws_sdk_ec2::types::InstanceType::T3Micro)
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .unwrap();
    let foreign_id = foreign.instances()[0].instance_id().unwrap().to_string();
    assert_eq!(site.owned().await.unwrap(), vec![leaked.job_id]);

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = SiteRunner::new("aws-test", site.clone(), log.clone(), None)
        .with_sweep_interval(Duration::from_millis(200));
    let task = tokio::spawn(async move { runner.run(stopped).await });
    eventually("the sweep terminates the leaked instance", || async {
        let r = site.status(&leaked_id).await.unwrap();
        r.state.is_terminal().then_some(())
    })
    .await;
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();

    let foreign_state = client
        .describe_instances()
        .instance_ids(&foreign_id)
        .send()
        .await
        .unwrap();
    let state = foreign_state.reservations()[0].instances()[0]
        .state()
        .and_then(|s| s.name())
        .unwrap()
        .as_str()
        .to_string();
    assert!(
        state == "running" || state == "pending",
        "the sweep touched an instance that is not Meridian's: {state}"
    );
    client
        .terminate_instances()
        .instance_ids(&foreign_id)
        .send()
        .await
        .unwrap();
    assert_nothing_left(&site).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shapes_come_from_describe_instance_types() {
    let moto = Moto::start();
    let site = site(
        moto.url(),
        AMI,
        &[],
        LifecycleConfig::default(),
        MemoryReports::default(),
    );
    let facts = site
        .provider()
        .instance_types(&["p4d.24xlarge".into(), "c7i.4xlarge".into()])
        .await
        .unwrap();
    let p4d = facts.iter().find(|f| f.name == "p4d.24xlarge").unwrap();
    assert_eq!(p4d.cpus, 96);
    assert_eq!(p4d.memory_bytes, 1152 << 30);
    assert_eq!(p4d.architecture, "x86_64");
    let gpus = p4d.gpus.as_ref().unwrap();
    assert_eq!(
        (gpus.count, gpus.vendor.as_str(), gpus.model.as_str()),
        (8, "nvidia", "A100")
    );
    assert_eq!(gpus.memory_bytes, 40 << 30);
    let c7i = facts.iter().find(|f| f.name == "c7i.4xlarge").unwrap();
    assert_eq!((c7i.cpus, c7i.memory_bytes), (16, 32 << 30));
    assert!(c7i.gpus.is_none());

    let unknown = site
        .provider()
        .instance_types(&["p9.huge".into()])
        .await
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("p9.huge"), "{unknown}");
}

async fn register(log: &dyn meridian_eventlog::EventLog, name: &str) {
    use meridian_eventlog::aggregates::execute;
    use meridian_events::aggregate::{Site, SiteCommand};
    use meridian_events::{EventContext, SiteKind};
    execute::<Site, _>(
        log,
        uuid::Uuid::now_v7(),
        &EventContext::new_chain("t"),
        |_| SiteCommand::Register {
            name: name.into(),
            kind: SiteKind::Aws,
            region: "us-east-1".into(),
            jurisdiction: "us".into(),
            credentials_secret: None,
            labels: Default::default(),
            prices: None,
        },
    )
    .await
    .unwrap();
}
