//! A subscription read on a task of its own, for a reader whose own work is the pace:
//! the next batch is fetched and decoded while the reader works through the last, and
//! an acknowledgement travels to the log without the reader waiting for its round trip.
//!
//! At most one batch waits decoded beside the one the reader holds. Acknowledgements are
//! cumulative, so only the newest position asked for is sent. One that is lost (the
//! process dies, the log fails) leaves its commits to be delivered again, exactly as if
//! the reader had died before acknowledging: a reader acknowledges only what it has
//! stored, and must already take a commit delivered twice. A failed fetch or
//! acknowledgement stops the reading: the reader's [`ReadAhead::next`] then returns an
//! error (after any batch already waiting), and the reader opens the subscription
//! again, which resumes after the last acknowledged commit.

use std::time::Duration;

use meridian_events::AggregateKind;
use tokio::sync::{mpsc, watch};

use crate::{DecodedCommit, LogError, Subscription};

/// How long the task asks the log to wait for a commit before it asks again: the
/// longest an acknowledgement waits while nothing is delivered (a fetch under way is
/// not given up for one, so that what it read is not read again).
const POLL: Duration = Duration::from_millis(50);

/// A [`Subscription`] read ahead on a task (see the module's documentation).
pub struct ReadAhead {
    batches: mpsc::Receiver<Result<Vec<DecodedCommit>, LogError>>,
    acks: Option<watch::Sender<u64>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ReadAhead {
    /// Reads `sub` ahead, batches of at most `max` commits with the events of `kinds`
    /// decoded ([`Subscription::next_decoded`]).
    pub fn new(
        mut sub: Box<dyn Subscription>,
        max: usize,
        kinds: &'static [AggregateKind],
    ) -> ReadAhead {
        let (batch_tx, batches) = mpsc::channel(1);
        let (acks, mut ack_rx) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            let mut acked = 0u64;
            loop {
                let closing = ack_rx.has_changed().is_err();
                let wanted = *ack_rx.borrow_and_update();
                if wanted > acked {
                    if let Err(e) = sub.ack(wanted).await {
                        tracing::warn!(error = %e, position = wanted, "an acknowledgement failed; the subscription resumes after the last one that did");
                        // With a batch waiting, the reader finds the channel closed after it.
                        let _ = batch_tx.try_send(Err(e));
                        return;
                    }
                    acked = wanted;
                }
                if closing {
                    return;
                }
                let permit = tokio::select! {
                    permit = batch_tx.reserve() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                    _ = ack_rx.changed() => continue,
                };
                match sub.next_decoded(max, POLL, kinds).await {
                    Ok(batch) if batch.is_empty() => {}
                    Ok(batch) => permit.send(Ok(batch)),
                    Err(e) => {
                        permit.send(Err(e));
                        return;
                    }
                }
            }
        });
        ReadAhead {
            batches,
            acks: Some(acks),
            task: Some(task),
        }
    }

    /// The next batch, waiting up to `wait` for one; empty when none came in time.
    /// Cancellation-safe.
    pub async fn next(&mut self, wait: Duration) -> Result<Vec<DecodedCommit>, LogError> {
        match tokio::time::timeout(wait, self.batches.recv()).await {
            Ok(Some(batch)) => batch,
            Ok(None) => Err(LogError::Unavailable(
                "the subscription's reader stopped".into(),
            )),
            Err(_) => Ok(Vec::new()),
        }
    }

    /// Asks for every commit up to and including `position` to be acknowledged; the
    /// acknowledgement is sent in the background.
    pub fn ack(&self, position: u64) {
        if let Some(acks) = &self.acks {
            acks.send_if_modified(|wanted| {
                let newer = position > *wanted;
                if newer {
                    *wanted = position;
                }
                newer
            });
        }
    }

    /// Sends the last acknowledgement asked for and stops reading, waiting up to
    /// `within` for the log to take it.
    pub async fn finish(mut self, within: Duration) {
        self.acks = None;
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(within, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // A reader that gives up (an error, a shutdown) leaves nothing reading on its
        // behalf: the subscription is opened again, from the last acknowledgement.
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteLog;
    use crate::EventLog;
    use meridian_events::vocabulary::workflow::WorkflowEvent;
    use meridian_events::{AggregateRef, Envelope, Event, EventContext};
    use uuid::Uuid;

    async fn append(log: &dyn EventLog) -> u64 {
        let event: Event = WorkflowEvent::CancelRequested {
            by: "t".into(),
            reason: None,
            requested_at: chrono::Utc::now(),
        }
        .into();
        let envelopes = Envelope::sequence_after(
            AggregateRef::new(AggregateKind::Workflow, Uuid::now_v7()),
            0,
            &EventContext::new_chain("t"),
            chrono::Utc::now(),
            vec![event],
        );
        let raw = envelopes.iter().map(|e| e.to_raw().unwrap()).collect();
        match log.append(raw).await.unwrap() {
            crate::Appended::Stored { position } => position,
            other => panic!("{other:?}"),
        }
    }

    /// Batches come decoded and in order, and the last acknowledgement asked for is
    /// kept: the subscription opened again resumes after it.
    #[tokio::test]
    async fn batches_come_in_order_and_the_last_acknowledgement_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap();
        let mut positions = Vec::new();
        for _ in 0..5 {
            positions.push(append(&log).await);
        }
        let mut ahead = ReadAhead::new(log.subscribe("r").await.unwrap(), 2, &AggregateKind::ALL);
        let mut seen = Vec::new();
        while seen.len() < 5 {
            let batch = ahead.next(Duration::from_secs(5)).await.unwrap();
            assert!(!batch.is_empty(), "five commits are there to read");
            assert!(batch.len() <= 2);
            for commit in batch {
                assert_eq!(commit.events.len(), 1, "decoded");
                seen.push(commit.position);
            }
        }
        assert_eq!(seen, positions);
        ahead.ack(positions[1]);
        ahead.ack(positions[2]);
        ahead.ack(positions[0]); // an older one changes nothing
        ahead.finish(Duration::from_secs(5)).await;
        let mut again = log.subscribe("r").await.unwrap();
        let next = again.next(10, Duration::from_secs(5)).await.unwrap();
        let next: Vec<u64> = next.iter().map(|c| c.position).collect();
        assert_eq!(next, positions[3..]);
    }

    /// Nothing to read gives an empty batch; a commit appended after is delivered.
    #[tokio::test]
    async fn nothing_to_read_gives_an_empty_batch_and_a_later_commit_comes() {
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap();
        let mut ahead = ReadAhead::new(log.subscribe("r").await.unwrap(), 8, &AggregateKind::ALL);
        assert!(ahead
            .next(Duration::from_millis(50))
            .await
            .unwrap()
            .is_empty());
        let position = append(&log).await;
        let batch = ahead.next(Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            batch.iter().map(|c| c.position).collect::<Vec<_>>(),
            [position]
        );
    }
}
