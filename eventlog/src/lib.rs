//! The event log: Meridian's one source of truth. [`EventLog`] is the contract every
//! backend keeps — per-aggregate optimistic concurrency, idempotent append by event id,
//! ordered replay, durable subscriptions that resume after a crash — and
//! [`conformance`] is the suite that proves it. Two backends: [`nats::NatsLog`]
//! (JetStream, production) and [`sqlite::SqliteLog`] (one file, embedded default).
//!
//! The unit of append is a *commit*: the events one command produced for one
//! aggregate, stored atomically at one log position. Readers see whole commits, so a
//! read model can apply a commit and record its position in one transaction.

use std::time::Duration;

use async_trait::async_trait;
use meridian_events::{AggregateKind, AggregateRef, Envelope, Event, RawEnvelope};

pub mod aggregates;
pub mod conformance;
pub mod deferred;
pub mod encoded;
pub mod nats;
pub mod read_ahead;
pub mod snapshot;
pub mod sqlite;
pub mod testkit;

pub use encoded::EncodedCommit;
pub use snapshot::Snapshot;

/// The largest commit (its events as JSON) every backend accepts. JetStream's default
/// `max_payload` is 1 MiB; this leaves room for headers, and SQLite enforces the same
/// limit so that the two backends agree on what is valid.
pub const MAX_COMMIT_BYTES: usize = 900 * 1024;

/// The events of one append, at one log position. Positions start at 1 and only grow;
/// they may skip numbers (JetStream counts messages, not commits, per stream).
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub position: u64,
    /// Shared, not copied, between the readers of one commit: under `meridian up` five
    /// services follow the tail, each handed the same commits the SQLite log keeps.
    pub events: std::sync::Arc<Vec<RawEnvelope>>,
}

impl Commit {
    pub fn new(position: u64, events: Vec<RawEnvelope>) -> Commit {
        Commit {
            position,
            events: std::sync::Arc::new(events),
        }
    }

    /// Its events, copied only when another reader holds them too.
    pub fn into_events(self) -> Vec<RawEnvelope> {
        std::sync::Arc::try_unwrap(self.events).unwrap_or_else(|shared| (*shared).clone())
    }
}

/// A commit as the log keeps it: each event's envelope as JSON text, unparsed. For a
/// reader that decodes straight into its own types (a rebuild), so that the text is
/// not first parsed into generic JSON values only to be read once and dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCommit {
    pub position: u64,
    pub events: Vec<String>,
}

/// A delivered commit with its events decoded into [`Event`]s: those of the aggregate
/// kinds the reader asked for ([`Subscription::next_decoded`]); a commit of another kind
/// comes with no events, so that its position can still be acknowledged.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedCommit {
    pub position: u64,
    pub events: Vec<Envelope<Event>>,
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Stored at this position.
    Stored { position: u64 },
    /// These event ids were already stored (a retry); nothing new was written.
    Duplicate { position: u64 },
}

impl Appended {
    pub fn position(&self) -> u64 {
        match self {
            Appended::Stored { position } | Appended::Duplicate { position } => *position,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Someone else appended to the aggregate first: reload it and decide again.
    #[error(
        "conflict on {aggregate}: expected its last sequence to be {expected}, but it is {actual}"
    )]
    Conflict {
        aggregate: AggregateRef,
        expected: u64,
        actual: u64,
    },
    /// The batch itself is malformed (mixed aggregates, gaps in sequences, empty).
    #[error("invalid append: {0}")]
    InvalidAppend(String),
    #[error("invalid name {0:?} for a subscription or snapshot: use 1 to 64 letters, digits, '-' and '_'")]
    InvalidName(String),
    #[error("commit of {size} bytes exceeds the log's limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    /// The backend cannot be reached now. The append's outcome is unknown (it may still
    /// land): retry the *same* events, which idempotency makes safe.
    #[error("event log unavailable: {0}")]
    Unavailable(String),
    /// Stored data that does not decode: never silently skipped.
    #[error("corrupt record at position {position}: {message}")]
    Corrupt { position: u64, message: String },
    #[error("event log backend error: {0}")]
    Backend(String),
}

impl LogError {
    /// Whether retrying the same call later can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, LogError::Unavailable(_))
    }
}

#[async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Appends the events of ONE aggregate as one atomic commit. `events[0].sequence - 1`
    /// is the sequence the caller expects the aggregate to have now (0: a new aggregate);
    /// the rest must follow without gaps. Fails with [`LogError::Conflict`] when the
    /// aggregate has moved on. Appending event ids that are already stored is a no-op
    /// that reports [`Appended::Duplicate`], however long ago they were stored.
    async fn append(&self, events: Vec<RawEnvelope>) -> Result<Appended, LogError>;

    /// [`EventLog::append`] of events already written as JSON: the same checks and
    /// outcomes, without a JSON tree of each event in between. This default parses them
    /// and appends those; both logs store the text as it is.
    async fn append_encoded(&self, commit: EncodedCommit) -> Result<Appended, LogError> {
        self.append(commit.decode()?).await
    }

    /// One aggregate's whole history, in sequence order (empty when it has none).
    async fn read_aggregate(&self, aggregate: AggregateRef) -> Result<Vec<RawEnvelope>, LogError>;

    /// Up to `max` commits after position `after`, in log order: the replay primitive.
    async fn read_from(&self, after: u64, max: usize) -> Result<Vec<Commit>, LogError>;

    /// What [`EventLog::read_from`] returns, with each envelope as JSON text. This
    /// default encodes the parsed commits again; a log that stores text returns it
    /// as stored.
    async fn read_text_from(&self, after: u64, max: usize) -> Result<Vec<StoredCommit>, LogError> {
        self.read_from(after, max)
            .await?
            .into_iter()
            .map(|c| {
                let events = c
                    .events
                    .iter()
                    .map(serde_json::to_string)
                    .collect::<Result<_, _>>()
                    .map_err(|e| LogError::Corrupt {
                        position: c.position,
                        message: e.to_string(),
                    })?;
                Ok(StoredCommit {
                    position: c.position,
                    events,
                })
            })
            .collect()
    }

    /// The position of the last commit (0 when the log is empty).
    async fn head(&self) -> Result<u64, LogError>;

    /// Opens the durable subscription `name`, creating it at the start of the log the
    /// first time. It resumes after the last acknowledged commit: anything delivered but
    /// not acknowledged before a crash is delivered again, in order. One reader per name.
    async fn subscribe(&self, name: &str) -> Result<Box<dyn Subscription>, LogError>;

    /// Follows the log from just after position `after`, remembering nothing: for readers
    /// that keep their own position (read models store it with their rows). `ack` is a
    /// no-op on a tail.
    async fn tail(&self, after: u64) -> Result<Box<dyn Subscription>, LogError>;

    /// Keeps `snapshot` as the one under its name (letters, digits, '-' and '_'),
    /// unless the one kept already is at a later position. Snapshots are kept beside the
    /// log, not in it: see [`snapshot`].
    async fn save_snapshot(&self, snapshot: Snapshot) -> Result<(), LogError>;

    /// The snapshot kept under `name`, if there is one.
    async fn load_snapshot(&self, name: &str) -> Result<Option<Snapshot>, LogError>;
}

#[async_trait]
pub trait Subscription: Send {
    /// The next commits, at most `max`, waiting up to `wait` for the first one.
    /// Returns an empty batch when nothing arrived in time.
    async fn next(&mut self, max: usize, wait: Duration) -> Result<Vec<Commit>, LogError>;

    /// [`Subscription::next`] with the events of a commit of one of `kinds` decoded into
    /// [`Event`]s (a commit holds one aggregate's events). A log that receives text
    /// decodes it straight into the types, with no JSON tree in between; events of other
    /// kinds are not decoded at all. An event that does not decode is
    /// [`LogError::Corrupt`], and the rest of its batch is not handed over: open the
    /// subscription again to go on (it resumes after the last acknowledged commit).
    async fn next_decoded(
        &mut self,
        max: usize,
        wait: Duration,
        kinds: &[AggregateKind],
    ) -> Result<Vec<DecodedCommit>, LogError> {
        self.next(max, wait)
            .await?
            .into_iter()
            .map(|commit| {
                let position = commit.position;
                let events = commit
                    .events
                    .iter()
                    .filter(|raw| kinds.contains(&raw.aggregate.kind))
                    .map(|raw| {
                        raw.decode_event().map_err(|e| LogError::Corrupt {
                            position,
                            message: e.to_string(),
                        })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(DecodedCommit { position, events })
            })
            .collect()
    }

    /// Acknowledges every commit up to and including `position`, durably.
    async fn ack(&mut self, position: u64) -> Result<(), LogError>;
}

/// Checks the shape of an append and returns its aggregate and expected sequence.
pub(crate) fn check_batch<P>(
    events: &[meridian_events::Envelope<P>],
) -> Result<(AggregateRef, u64), LogError> {
    let first = events
        .first()
        .ok_or_else(|| LogError::InvalidAppend("no events to append".into()))?;
    if first.sequence == 0 {
        return Err(LogError::InvalidAppend(format!(
            "event {} has sequence 0; aggregate sequences start at 1",
            first.event_id
        )));
    }
    for (i, e) in events.iter().enumerate() {
        if e.aggregate != first.aggregate {
            return Err(LogError::InvalidAppend(format!(
                "one append holds one aggregate's events: {} and {}",
                first.aggregate, e.aggregate
            )));
        }
        if e.sequence != first.sequence + i as u64 {
            return Err(LogError::InvalidAppend(format!(
                "sequences must follow without gaps: expected {} at index {i}, got {}",
                first.sequence + i as u64,
                e.sequence
            )));
        }
    }
    // Ids name events: a batch naming one twice could be stored on one backend and refused
    // by another's unique index, so every backend refuses it here.
    // (Most appends are one event: no set to build.)
    if events.len() > 1 {
        let mut ids = std::collections::HashSet::with_capacity(events.len());
        if let Some(twice) = events.iter().find(|e| !ids.insert(e.event_id)) {
            return Err(LogError::InvalidAppend(format!(
                "event {} appears twice in one append",
                twice.event_id
            )));
        }
    }
    Ok((first.aggregate, first.sequence - 1))
}

/// Subscription names become JetStream consumer names, which allow only these.
pub(crate) fn check_name(name: &str) -> Result<(), LogError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(LogError::InvalidName(name.to_string()));
    }
    Ok(())
}
