//! What a site runner follows again after a restart: its site's jobs that have not
//! ended, folded from its snapshot and the log after it.

use std::sync::Arc;

use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::{EventLog, Snapshot};
use meridian_site_runner::OpenJobs;
use uuid::Uuid;

mod common;

async fn dispatch(log: &dyn EventLog, site: &str) -> Uuid {
    let resources = meridian_spec::Resources::default();
    common::dispatch(log, site, Uuid::now_v7(), "j", resources).await
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
    meridian_eventlog::testkit::run_job(&*log, here[0], 0).await;

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
    meridian_eventlog::testkit::run_job(&*log, here[1], 0).await;
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

/// A start folds up to the head it found: with a writer appending after every page it
/// reads, a start that followed the head never ended. What comes after is the
/// subscription's to deliver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_while_writers_append_ends_at_the_head_it_found() {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let job = dispatch(&*log, "here").await;
    let head = log.head().await.unwrap();
    let on = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flooded = meridian_eventlog::testkit::Intercepted::new(log.clone()).after_read(
        meridian_eventlog::testkit::appending_while(log.clone(), on.clone()),
    );
    let start = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        OpenJobs::load(&flooded, "here", u64::MAX),
    )
    .await;
    on.store(false, std::sync::atomic::Ordering::SeqCst);
    let open = start
        .expect("the start did not end while a writer appended")
        .unwrap();
    assert_eq!(open.jobs, [job].into());
    assert_eq!(open.position, head);
    assert!(log.head().await.unwrap() > head, "the writer appended");
}
