//! The site runner reports its site's capacity and health as Site events, for placement.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use meridian_adapter_local::{ContainerRuntime, LocalAdapter, LocalConfig};
use meridian_eventlog::aggregates::load;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::Site;
use meridian_events::{Event, SiteEvent};
use meridian_site_runner::SiteRunner;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_and_health_are_reported_as_site_events() {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let site_id = common::register(&*log, "here").await;
    let mut config = LocalConfig::new(dir.path().join("site"));
    config.cpus = 2;
    config.container_runtime = ContainerRuntime::None;
    let adapter = Arc::new(LocalAdapter::new(config).unwrap());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = SiteRunner::new("here", adapter, log.clone(), None)
        .with_health_interval(Duration::from_millis(100));
    let task = tokio::spawn(async move { runner.run(stopped).await });

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let report = loop {
        let history = load::<Site>(&*log, site_id).await.unwrap().history;
        if let Some(report) = history.iter().find_map(|e| match &e.payload {
            Event::Site(SiteEvent::HealthReported {
                healthy,
                capacity,
                observed_at,
                ..
            }) => Some((*healthy, capacity.clone(), *observed_at)),
            _ => None,
        }) {
            break report;
        }
        assert!(tokio::time::Instant::now() < deadline, "no health report");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(report.0, "the local site is healthy");
    assert_eq!(report.1.free_cpus, 2, "nothing runs: all CPUs free");
    assert!(report.2 <= Utc::now());

    // An unchanged site is not reported again at every interval.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let reports = load::<Site>(&*log, site_id)
        .await
        .unwrap()
        .history
        .iter()
        .filter(|e| matches!(e.payload, Event::Site(SiteEvent::HealthReported { .. })))
        .count();
    assert_eq!(reports, 1, "unchanged reports are not repeated");
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();
}
