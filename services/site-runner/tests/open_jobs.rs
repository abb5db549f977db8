//! What a site runner follows again after a restart: its site's jobs that have not
//! ended, folded from its snapshot and the log after it.

use std::sync::Arc;

use meridian_eventlog::aggregates::execute;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::{EventLog, Snapshot};
use meridian_events::aggregate::{Job, JobCommand};
use meridian_events::vocabulary::Usage;
use meridian_events::{Allocation, EventContext};
use meridian_site_runner::OpenJobs;
use uuid::Uuid;

mod common;

async fn dispatch(log: &dyn EventLog, site: &str) -> Uuid {
    let resources = meridian_spec::Resources::default();
    common::dispatch(log, site, Uuid::now_v7(), "j", resources).await
}

/// Submitted, started and finished: three commits.
async fn finish(log: &dyn EventLog, job_id: Uuid) {
    let now = chrono::Utc::now();
    for command in [
        JobCommand::RecordSubmission {
            backend_job_id: "1".into(),
        },
        JobCommand::Start {
            started_at: now,
            allocated: Allocation {
                nodes: 1,
                cpus: 1,
                memory_bytes: 1 << 30,
                gpus: None,
            },
            hosts: vec![],
        },
        JobCommand::Finish {
            ended_at: now,
            exit_code: 0,
            usage: Usage::default(),
        },
    ] {
        execute::<Job, _>(log, job_id, &EventContext::new_chain("t"), |_| {
            command.clone()
        })
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_folds_the_snapshot_and_the_commits_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let here: Vec<Uuid> = [
        dispatch(&*log, "here").await,
        dispatch(&*log, "here").await,
        dispatch(&*log, "here").await,
    ]
    .into();
    let there = dispatch(&*log, "there").await;
    finish(&*log, here[0]).await;

    let first = OpenJobs::load(&*log, "here", 1).await.unwrap();
    assert_eq!(first.jobs, [here[1], here[2]].into());
    assert_eq!(first.read, 7);
    assert_eq!(first.position, log.head().await.unwrap());
    assert_eq!(
        OpenJobs::load(&*log, "there", u64::MAX).await.unwrap().jobs,
        [there].into()
    );

    // The runner goes on; then a restart reads only what came after the snapshot.
    let later = dispatch(&*log, "here").await;
    finish(&*log, here[1]).await;
    let restarted = OpenJobs::load(&*log, "here", u64::MAX).await.unwrap();
    assert_eq!(
        restarted.read, 4,
        "the dispatch and the three commits of the finish"
    );
    assert_eq!(restarted.jobs, [here[2], later].into());

    // A snapshot that does not decode is ignored: the whole log is folded again.
    let name = OpenJobs::snapshot_name("here").unwrap();
    log.save_snapshot(Snapshot {
        name,
        position: log.head().await.unwrap(),
        body: b"not a snapshot".to_vec(),
    })
    .await
    .unwrap();
    let whole = OpenJobs::load(&*log, "here", u64::MAX).await.unwrap();
    assert_eq!(whole.read, 11);
    assert_eq!(whole.jobs, restarted.jobs);

    // A site whose name makes too long a snapshot name folds the whole log every time.
    let long = "s".repeat(60);
    assert_eq!(OpenJobs::snapshot_name(&long), None);
    let job = dispatch(&*log, &long).await;
    let open = OpenJobs::load(&*log, &long, 1).await.unwrap();
    assert_eq!(open.jobs, [job].into());
    assert_eq!(open.read, 12);
}
