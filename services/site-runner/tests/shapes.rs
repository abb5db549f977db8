//! The shape a job's offer names, passed to the site with the job.

use std::sync::Arc;
use std::time::Duration;

use meridian_adapter_local::{ContainerRuntime, LocalConfig};
use meridian_eventlog::aggregates::execute;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Site, SiteCommand};
use meridian_events::vocabulary::site::Shape;
use meridian_events::EventContext;
use meridian_site_runner::SiteRunner;

mod common;

/// A site with no shape for a job's offer runs the job without one; once a shape for
/// that offer is declared, the next job carries it (the site runner brings the
/// catalogue it read for the first job up to date).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shape_declared_after_a_job_ran_without_one_reaches_the_next_job() {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let ctx = EventContext::new_chain("t");
    let site_id = common::register(&*log, "here").await;
    let (workflow_id, spec) = common::submit(
        &*log,
        "version: v1\nname: w\njobs:\n  a: {image: host, command: [\"true\"], resources: {memory: 64MiB}}\n",
    )
    .await;
    let mut config = LocalConfig::new(dir.path().join("site"));
    config.container_runtime = ContainerRuntime::None;
    let adapter = Arc::new(common::Watched::new(config));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = SiteRunner::new("here", adapter.clone(), log.clone(), None)
        .with_poll_interval(Duration::from_millis(100));
    let task = tokio::spawn(async move { runner.run(stopped).await });
    let resources = spec.jobs["a"].resources.clone();
    let shape_of = |n: usize| {
        let adapter = adapter.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(job) = adapter.submitted.lock().unwrap().get(n) {
                    return job.shape.as_ref().map(|s| s.name.clone());
                }
                assert!(tokio::time::Instant::now() < deadline, "job {n} never sent");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    common::dispatch(&*log, "here", workflow_id, "a", resources.clone()).await;
    assert_eq!(shape_of(0).await, None, "the site has no shapes yet");
    execute::<Site, _>(&*log, site_id, &ctx, |_| SiteCommand::DeclareShapes {
        shapes: vec![Shape {
            name: "whole-node".into(),
            offer: "local".into(),
            spot_offer: None,
            cpus: 2,
            memory_bytes: 1 << 30,
            gpus: None,
            max_nodes: 1,
            max_walltime_secs: None,
        }],
    })
    .await
    .unwrap();
    common::dispatch(&*log, "here", workflow_id, "a", resources).await;
    assert_eq!(shape_of(1).await.as_deref(), Some("whole-node"));
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}
