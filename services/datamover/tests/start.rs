//! The data mover's start: what it folds from the log before it serves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use meridian_datamover::MoverStart;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::testkit::{appending_while, Intercepted};
use meridian_eventlog::EventLog;

/// A start folds up to the head it found: with a writer appending after every page it
/// reads, a start that followed the head never ended. What comes after is the
/// subscription's to deliver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_while_writers_append_ends_at_the_head_it_found() {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    // Something to fold: a commit of the kind the writer appends.
    let on = Arc::new(AtomicBool::new(true));
    appending_while(log.clone(), on.clone())().await;
    let head = log.head().await.unwrap();
    let flooded =
        Intercepted::new(log.clone()).after_read(appending_while(log.clone(), on.clone()));
    let start = tokio::time::timeout(
        Duration::from_secs(20),
        MoverStart::load(&flooded, u64::MAX),
    )
    .await;
    on.store(false, Ordering::SeqCst);
    let start = start
        .expect("the start did not end while a writer appended")
        .unwrap();
    assert_eq!(start.position, head);
    assert_eq!(start.read, 1);
    assert!(log.head().await.unwrap() > head, "the writer appended");
}
