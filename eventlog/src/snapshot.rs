//! Snapshots: state a service folded from the log up to a position, kept beside the log
//! so that a restart folds only the commits after it instead of the whole history.
//!
//! A snapshot is a cache of the log, never a source of truth. [`load`] ignores, with a
//! warning, one written in another format (another version of Meridian), one that does
//! not decode, and one that does not match the log (the log is shorter, or holds
//! another commit at its position: a log replaced under the same name); the caller then
//! folds from the start, as without a snapshot. Two processes saving under one name
//! need no coordination: each saves a fold of the same log, and the backend keeps the
//! one at the later position.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{EventLog, LogError};

/// What a backend keeps under a name: the latest body saved, and the log position it
/// was folded up to (every commit up to and including it).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub name: String,
    pub position: u64,
    pub body: Vec<u8>,
}

/// Commits read past the last snapshot after which a new one is worth saving: reading
/// ten thousand commits takes well under a second, so a restart never folds much more.
pub const SAVE_AFTER: u64 = 10_000;

/// The `save_after` of a [`Refresh`]'s fold: it saves whatever it read. It runs once
/// [`SAVE_AFTER`] commits were delivered, and those include commits the last fold had
/// read already, so it can read fewer than that past the snapshot; held to the
/// threshold, it threw its work away, and a router's restart after a busy spell read
/// three times [`SAVE_AFTER`] past its snapshot.
pub const REFRESH_SAVES: u64 = 1;

/// How long a service stopping cleanly waits for a fold under way ([`Refresh::finish`]).
pub const FINISH_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// The stored body: the state, the format it was written in, and the first event id of
/// the commit at its position (so a snapshot of another log with the same name is
/// recognised).
#[derive(Serialize, Deserialize)]
struct Body<T> {
    format: u32,
    last_event: Uuid,
    state: T,
}

/// The state kept under `name` and the position it was folded up to, if a snapshot
/// there can be read, is in `format` and matches the log; `None` otherwise (why is
/// logged at WARN). Fails only when the log itself cannot be read.
pub async fn load<T: DeserializeOwned>(
    log: &dyn EventLog,
    name: &str,
    format: u32,
) -> Result<Option<(u64, T)>, LogError> {
    // A snapshot is a cache: one that cannot be read now costs a longer fold, not a start.
    let snapshot = match log.load_snapshot(name).await {
        Ok(Some(snapshot)) => snapshot,
        Ok(None) => return Ok(None),
        Err(e) => {
            tracing::warn!(snapshot = name, error = %e, "cannot read the snapshot; folding the log from its start");
            return Ok(None);
        }
    };
    let position = snapshot.position;
    let ignored = |why: String| {
        tracing::warn!(
            snapshot = name,
            position,
            "ignoring the snapshot ({why}); folding the log from its start"
        );
        None
    };
    let head = match serde_json::from_slice::<Body<IgnoredAny>>(&snapshot.body) {
        Ok(head) => head,
        Err(e) => return Ok(ignored(format!("it does not decode: {e}"))),
    };
    if head.format != format {
        return Ok(ignored(format!(
            "written in format {}, this version reads {format}",
            head.format
        )));
    }
    if last_event_at(log, position).await? != Some(head.last_event) {
        return Ok(ignored(format!(
            "the log holds no commit at position {position} whose first event is {}",
            head.last_event
        )));
    }
    match serde_json::from_slice::<Body<T>>(&snapshot.body) {
        Ok(body) => Ok(Some((position, body.state))),
        Err(e) => Ok(ignored(format!("its state does not decode: {e}"))),
    }
}

/// Saves `state`, folded from every commit up to and including `position`, under
/// `name` in `format`.
pub async fn save<T: Serialize>(
    log: &dyn EventLog,
    name: &str,
    format: u32,
    position: u64,
    state: &T,
) -> Result<(), LogError> {
    let Some(last_event) = last_event_at(log, position).await? else {
        return Err(LogError::Backend(format!(
            "no commit at position {position} to save the snapshot {name:?} at"
        )));
    };
    let body = serde_json::to_vec(&Body {
        format,
        last_event,
        state,
    })
    .map_err(|e| LogError::Backend(format!("encoding the snapshot {name:?}: {e}")))?;
    log.save_snapshot(Snapshot {
        name: name.to_string(),
        position,
        body,
    })
    .await
}

/// Hands `fold` each commit after `after`, up to the log's head as it is when called,
/// reading `page` at a time; returns how many it read. A start folds this way: what is
/// appended meanwhile reaches its service through the subscription, and a fold that
/// followed the head would not end while writers append (under a stream of
/// submissions, a router served none until it stopped).
pub async fn fold_to_head<E: From<LogError>>(
    log: &dyn EventLog,
    mut after: u64,
    page: usize,
    mut fold: impl FnMut(&crate::Commit) -> Result<(), E>,
) -> Result<u64, E> {
    let until = log.head().await?;
    let mut read = 0;
    while after < until {
        let commits = log.read_from(after, page).await?;
        let Some(last) = commits.last() else { break };
        after = last.position;
        read += commits.len() as u64;
        for commit in &commits {
            fold(commit)?;
        }
    }
    Ok(read)
}

/// The first event id of the commit at `position`, if there is one there.
async fn last_event_at(log: &dyn EventLog, position: u64) -> Result<Option<Uuid>, LogError> {
    if position == 0 {
        return Ok(None);
    }
    let commits = log.read_from(position - 1, 1).await?;
    Ok(commits
        .into_iter()
        .next()
        .filter(|c| c.position == position)
        .and_then(|c| c.events.first().map(|e| e.event_id)))
}

/// Keeps a running service's snapshot fresh: counts the commits delivered to it and,
/// once `every` have come since the last time, runs `fold` in the background (one at a
/// time). `fold` folds the log from the snapshot again and saves the result, rather
/// than saving the running state, so a snapshot is always exactly what a start folds.
#[derive(Debug)]
pub struct Refresh {
    pub every: u64,
    since: u64,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Refresh {
    pub fn every(commits: u64) -> Refresh {
        Refresh {
            every: commits,
            since: 0,
            running: None,
        }
    }

    /// Counts `commits` delivered; starts `fold` when it is time and none is running.
    pub fn delivered<F>(&mut self, commits: u64, fold: impl FnOnce() -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.since += commits;
        if self.since < self.every || self.running.as_ref().is_some_and(|r| !r.is_finished()) {
            return;
        }
        self.since = 0;
        self.running = Some(tokio::spawn(fold()));
    }

    /// For a service stopping cleanly: lets a fold under way finish, for `within` at
    /// most, so that its work is saved for the next start rather than lost.
    pub async fn finish(&mut self, within: std::time::Duration) {
        if let Some(mut running) = self.running.take() {
            if tokio::time::timeout(within, &mut running).await.is_err() {
                tracing::warn!(
                    seconds = within.as_secs(),
                    "a snapshot fold did not finish in time; given up"
                );
                running.abort();
            }
        }
    }
}

/// A fold still running when its service stops is given up: it only reads the log and
/// saves a snapshot, which the next fold does again (a save under way finishes: both
/// logs write a snapshot whole or not at all, JetStream's on a task of its own), and
/// left running it would read the log on behalf of a service that is gone (in a
/// process that runs services in turn, taking the cores of the next one).
impl Drop for Refresh {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}

#[cfg(test)]
mod refresh_tests {
    use super::Refresh;

    /// Dropped when the fold's future is: whether it ran to its end or was given up.
    struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }

    /// A clean stop waits for the fold under way, and gives up one that takes too long.
    #[tokio::test]
    async fn a_clean_stop_lets_a_fold_finish_within_its_bound() {
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let mut refresh = Refresh::every(1);
        refresh.delivered(1, move || async move {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let _ = done_tx.send(());
        });
        refresh.finish(std::time::Duration::from_secs(5)).await;
        assert!(done.await.is_ok(), "the fold ran to its end");

        let (tx, rx) = tokio::sync::oneshot::channel();
        let guard = Dropped(Some(tx));
        refresh.delivered(1, move || async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        refresh.finish(std::time::Duration::from_millis(100)).await;
        tokio::time::timeout(std::time::Duration::from_secs(5), rx)
            .await
            .expect("a fold past its bound is given up")
            .unwrap();
    }

    #[tokio::test]
    async fn a_fold_runs_after_every_commits_and_stops_with_its_service() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let mut refresh = Refresh::every(10);
        let guard = Dropped(Some(tx));
        refresh.delivered(9, || async {});
        assert!(refresh.running.is_none(), "9 commits of 10: no fold yet");
        refresh.delivered(1, move || async move {
            let _guard = guard;
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        started.await.expect("the fold started");
        drop(refresh);
        tokio::time::timeout(std::time::Duration::from_secs(5), rx)
            .await
            .expect("the fold was given up with its service")
            .unwrap();
    }
}
