//! The leak sweep: what a site runs that no live job needs is stopped.

use std::sync::Arc;
use std::time::Duration;

use meridian_adapter_core::{JobRequest, JobState, SiteAdapter};
use meridian_adapter_local::{ContainerRuntime, LocalAdapter, LocalConfig};
use meridian_eventlog::aggregates::execute;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::EventContext;
use meridian_site_runner::SiteRunner;

mod common;

fn orphan(command: &[&str]) -> JobRequest {
    let mut job = JobRequest::new("orphan", command);
    job.resources.memory_bytes = 1 << 20;
    job.resources.walltime = Duration::from_secs(600);
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_the_log_does_not_know_is_stopped_by_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    common::register(&*log, "here").await;
    let mut config = LocalConfig::new(dir.path().join("site"));
    config.container_runtime = ContainerRuntime::None;
    config.kill_grace = Duration::from_millis(200);
    let adapter = Arc::new(LocalAdapter::new(config).unwrap());
    // Started behind Meridian's back (or left by a log that was lost): no Job knows it.
    let job = orphan(&["sleep", "600"]);
    let id = adapter.submit(&job).await.unwrap();
    assert_eq!(adapter.owned().await.unwrap(), vec![job.job_id]);

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = SiteRunner::new("here", adapter.clone(), log.clone(), None)
        .with_sweep_interval(Duration::from_millis(200));
    let task = tokio::spawn(async move { runner.run(stopped).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let report = adapter.status(&id).await.unwrap();
        if matches!(report.state, JobState::Cancelled { .. }) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sweep never stopped it: {report:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(adapter.owned().await.unwrap().is_empty());
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}

/// A cancel the site failed to take is passed on again, at the next look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_the_site_missed_is_passed_on_again() {
    use meridian_events::aggregate::{Job, JobCommand};
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let ctx = EventContext::new_chain("t");
    let (workflow_id, spec) = common::submit(
        &*log,
        "version: v1\nname: w\njobs:\n  slow: {image: host, command: [sleep, \"600\"], resources: {memory: 64MiB}}\n",
    )
    .await;
    let job_id = common::dispatch(
        &*log,
        "here",
        workflow_id,
        "slow",
        spec.jobs["slow"].resources.clone(),
    )
    .await;
    let mut config = LocalConfig::new(dir.path().join("site"));
    config.container_runtime = ContainerRuntime::None;
    config.kill_grace = Duration::from_millis(200);
    let adapter = Arc::new(common::Watched::new(config).missing_first_cancel());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = SiteRunner::new("here", adapter, log.clone(), None)
        .with_poll_interval(Duration::from_millis(100));
    let task = tokio::spawn(async move { runner.run(stopped).await });
    let state = |log: Arc<dyn EventLog>| async move {
        meridian_eventlog::aggregates::load::<Job>(&*log, job_id)
            .await
            .unwrap()
            .state
            .state()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while state(log.clone()).await != Some(meridian_events::aggregate::JobState::Started) {
        assert!(tokio::time::Instant::now() < deadline, "never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    execute::<Job, _>(&*log, job_id, &ctx, |_| JobCommand::RequestCancel {
        by: "t".into(),
        reason: None,
    })
    .await
    .unwrap();
    // The first cancel fails; the next poll passes it on again and the run ends.
    while state(log.clone()).await != Some(meridian_events::aggregate::JobState::Cancelled) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cancel never reached the site"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}
