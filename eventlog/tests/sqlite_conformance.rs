//! The SQLite backend against the conformance suite, each check on a new file.

use std::sync::Arc;

use meridian_eventlog::conformance::Open;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;

fn fresh() -> Open {
    let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
    Arc::new(move || {
        let dir = dir.clone();
        Box::pin(async move {
            let log = SqliteLog::open(&dir.path().join("events.sqlite"))
                .await
                .expect("open sqlite log");
            Arc::new(log) as Arc<dyn EventLog>
        })
    })
}

meridian_eventlog::conformance_suite!(fresh());
