//! Appends held back while a service works through a delivered batch, then written all
//! at once: the commits of one chain (say, everything decided for one workflow) in the
//! order they were decided, the chains side by side. One workflow's decisions wait for
//! each other, as they must (a job is dispatched only once its release is stored), but
//! not for another workflow's fsync or round trip: that is what lets the log's group
//! commit, or JetStream's many appends in flight, carry a service's throughput.
//!
//! The service folds what it decided into its cached aggregates at once, and
//! acknowledges the delivered batch only after [`Deferred::flush`] has stored every
//! commit, so a crash before then redelivers the batch and the decisions are made again
//! against the log. A chain stops at its first failed append (a conflict: someone else
//! moved the aggregate on); its remaining commits are not appended, and the service
//! forgets what it cached for that chain and decides again.
//!
//! Consecutive commits of a chain to the same aggregate (a workflow's placement and its
//! first release) are joined into one append when they fit in one commit together: the
//! second could only have been appended after the first anyway, and one append costs one
//! round trip or one row of a group commit instead of two. A joined commit is stored or
//! refused whole.

use std::collections::HashMap;

use futures::stream::{self, StreamExt};
use meridian_events::AggregateRef;
use uuid::Uuid;

use crate::{EncodedCommit, EventLog, LogError};

/// How many chains are appended at once. JetStream answers each append in a round trip
/// that grows with the load, so the more in flight the better, up to what the server
/// takes (1,024 stored a router's batch in 0.9 s where 256 took 1.4 s; 4,096 no faster);
/// the SQLite log's writer takes them 256 to a transaction, one transaction after another.
const WIDTH: usize = 1024;

/// Commits decided and not yet appended.
#[derive(Debug, Default)]
pub struct Deferred {
    /// Each chain's commits in decision order; chains in the order first seen.
    chains: Vec<(Uuid, Vec<EncodedCommit>)>,
    index: HashMap<Uuid, usize>,
}

/// A chain whose commit failed: the error, and the aggregates of that commit and of
/// every later one in the chain (none of which were appended).
#[derive(Debug)]
pub struct Failed {
    pub chain: Uuid,
    pub error: LogError,
    pub unwritten: Vec<AggregateRef>,
}

impl Deferred {
    /// Holds `commit` at the end of `chain`, joined to the commit before it where it
    /// can be (see the module's documentation and [`EncodedCommit::join`]).
    pub fn push(&mut self, chain: Uuid, commit: EncodedCommit) {
        let at = *self.index.entry(chain).or_insert_with(|| {
            self.chains.push((chain, Vec::new()));
            self.chains.len() - 1
        });
        let held = &mut self.chains[at].1;
        let commit = match held.last_mut() {
            Some(last) => last.join(commit),
            None => Some(commit),
        };
        if let Some(commit) = commit {
            held.push(commit);
        }
    }

    /// Whether `chain` has commits not yet appended.
    pub fn holds(&self, chain: Uuid) -> bool {
        self.index.contains_key(&chain)
    }

    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// The chains held, in the order first seen.
    pub fn chains(&self) -> impl Iterator<Item = Uuid> + '_ {
        self.chains.iter().map(|(chain, _)| *chain)
    }

    /// Gives up everything held without appending it; returns the chains.
    pub fn discard(&mut self) -> Vec<(Uuid, Vec<AggregateRef>)> {
        self.index.clear();
        std::mem::take(&mut self.chains)
            .into_iter()
            .map(|(chain, commits)| (chain, runs(commits.iter().map(EncodedCommit::aggregate))))
            .collect()
    }

    /// Appends everything held: each chain's commits in order, up to [`WIDTH`] chains at
    /// once. Returns the chains that stopped at a failure; everything else is stored.
    pub async fn flush(&mut self, log: &dyn EventLog) -> Vec<Failed> {
        self.index.clear();
        let chains = std::mem::take(&mut self.chains);
        stream::iter(chains)
            .map(|(chain, commits)| async move {
                // Each commit is handed to the log, not copied.
                let mut commits = commits.into_iter();
                while let Some(commit) = commits.next() {
                    let aggregate = commit.aggregate();
                    if let Err(error) = log.append_encoded(commit).await {
                        let rest = commits.map(|c| c.aggregate());
                        return Some(Failed {
                            chain,
                            error,
                            unwritten: runs(std::iter::once(aggregate).chain(rest)),
                        });
                    }
                }
                None
            })
            .buffer_unordered(WIDTH)
            .filter_map(|failed| async move { failed })
            .collect()
            .await
    }
}

/// The aggregates in order, each run of one named once.
fn runs(aggregates: impl Iterator<Item = AggregateRef>) -> Vec<AggregateRef> {
    let mut out: Vec<AggregateRef> = aggregates.collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteLog;
    use crate::MAX_COMMIT_BYTES;
    use meridian_events::vocabulary::workflow::WorkflowEvent;
    use meridian_events::{AggregateKind, Envelope, Event, EventContext};

    fn commit(id: Uuid, after: u64, n: usize) -> EncodedCommit {
        commit_by(id, after, (0..n).map(|i| format!("test {i}")))
    }

    /// A commit of one event per `by`, after `after` events of workflow `id`.
    fn commit_by(id: Uuid, after: u64, by: impl Iterator<Item = String>) -> EncodedCommit {
        let events: Vec<Event> = by
            .map(|by| {
                WorkflowEvent::CancelRequested {
                    by,
                    reason: None,
                    requested_at: chrono::Utc::now(),
                }
                .into()
            })
            .collect();
        EncodedCommit::encode(&Envelope::sequence_after(
            AggregateRef::new(AggregateKind::Workflow, id),
            after,
            &EventContext::new_chain("t"),
            chrono::Utc::now(),
            events,
        ))
        .unwrap()
    }

    /// Chains are stored in order, side by side; a chain stops at its conflict and
    /// names what it did not write, and the others are stored whole.
    #[tokio::test]
    async fn chains_are_appended_in_order_and_stop_at_a_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap();
        let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        // Someone else already wrote b's first event.
        log.append_encoded(commit(b, 0, 1)).await.unwrap();
        let mut deferred = Deferred::default();
        deferred.push(a, commit(a, 0, 1));
        deferred.push(b, commit(b, 0, 1));
        deferred.push(a, commit(a, 1, 2));
        deferred.push(b, commit(c, 0, 1));
        assert!(deferred.holds(a) && deferred.holds(b) && !deferred.holds(c));
        let failed = deferred.flush(&log).await;
        assert!(deferred.is_empty());
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].chain, b);
        assert!(matches!(failed[0].error, LogError::Conflict { .. }));
        assert_eq!(
            failed[0].unwritten,
            vec![
                AggregateRef::new(AggregateKind::Workflow, b),
                AggregateRef::new(AggregateKind::Workflow, c)
            ]
        );
        let stored = |id| log.read_aggregate(AggregateRef::new(AggregateKind::Workflow, id));
        assert_eq!(stored(a).await.unwrap().len(), 3);
        assert_eq!(stored(b).await.unwrap().len(), 1);
        assert!(stored(c).await.unwrap().is_empty(), "after b's conflict");
    }

    /// A chain's consecutive commits to one workflow are stored as one commit; a commit
    /// to another aggregate comes between, and two that would be larger together than a
    /// commit may be stay apart.
    #[tokio::test]
    async fn consecutive_commits_to_one_aggregate_are_joined_while_they_fit() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap();
        let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let half = || std::iter::once("x".repeat(MAX_COMMIT_BYTES / 2));
        let mut deferred = Deferred::default();
        deferred.push(a, commit(a, 0, 1));
        deferred.push(a, commit(a, 1, 2));
        deferred.push(a, commit(b, 0, 1));
        deferred.push(a, commit(a, 3, 1));
        deferred.push(c, commit_by(c, 0, half()));
        deferred.push(c, commit_by(c, 1, half()));
        assert!(deferred.flush(&log).await.is_empty());
        let commits = log.read_from(0, 100).await.unwrap();
        let sizes = |id: Uuid| -> Vec<usize> {
            commits
                .iter()
                .filter(|c| c.events[0].aggregate.id == id)
                .map(|c| c.events.len())
                .collect()
        };
        assert_eq!(sizes(a), vec![3, 1]);
        assert_eq!(sizes(b), vec![1]);
        assert_eq!(sizes(c), vec![1, 1]);
        let stored = log
            .read_aggregate(AggregateRef::new(AggregateKind::Workflow, a))
            .await
            .unwrap();
        let sequences: Vec<u64> = stored.iter().map(|e| e.sequence).collect();
        assert_eq!(sequences, vec![1, 2, 3, 4]);
    }
}
