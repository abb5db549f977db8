//! The site runner reports its site's capacity and health as Site events, for placement.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use meridian_adapter_local::{ContainerRuntime, LocalAdapter, LocalConfig};
use meridian_eventlog::aggregates::{execute, load};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Site, SiteCommand};
use meridian_events::{Event, EventContext, SiteEvent, SiteKind};
use meridian_site_runner::SiteRunner;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_and_health_are_reported_as_site_events() {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let site_id = Uuid::now_v7();
    execute::<Site, _>(&*log, site_id, &EventContext::new_chain("t"), |_| {
        SiteCommand::Register {
            name: "here".into(),
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
