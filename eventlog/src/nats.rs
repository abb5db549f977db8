//! The production backend: NATS JetStream (server 2.10 or newer). One stream holds the
//! whole log; each aggregate has its own subject, `<prefix>.<kind>.<id>`, and each
//! commit is one message whose payload is the JSON array of its envelopes.
//!
//! - Optimistic concurrency: `Nats-Expected-Last-Subject-Sequence` carries the stream
//!   sequence of the aggregate's last commit. The aggregate sequence of that commit is in
//!   the `Meridian-Last-Sequence` header; appenders remember it per aggregate, so a
//!   steady writer pays no extra round trip.
//! - Idempotency: `Nats-Msg-Id` is the first event's id. Inside the stream's duplicate
//!   window the server answers a retry as a duplicate; after it, the expected-sequence
//!   check fails and the event id is found in the aggregate's history instead.
//! - Subscriptions are durable pull consumers with cumulative acks.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{self, pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::{ConsumerInfoErrorKind, Context, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::object_store;
use async_nats::jetstream::stream::{
    self, DirectGetErrorKind, LastRawMessageErrorKind, StorageType,
};
use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use meridian_events::{AggregateKind, AggregateRef, Envelope, Event, RawEnvelope};

use uuid::Uuid;

use crate::{
    check_name, encoded::Written, Appended, Commit, DecodedCommit, EncodedCommit, EventLog,
    LogError, Snapshot, StoredCommit, Subscription, MAX_COMMIT_BYTES,
};

const LAST_SEQUENCE_HEADER: &str = "Meridian-Last-Sequence";

/// How long an append waits out a stream no server answers for (a cluster electing the
/// stream's leader) before it reports the log unavailable.
const NO_RESPONDERS_WAIT: Duration = Duration::from_secs(5);

/// Where and how the log lives in JetStream. Defaults suit one server; production wants
/// `replicas: 3` (R1 file storage can lose acknowledged writes on power loss).
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// One server, or several of a cluster comma-separated.
    pub url: String,
    pub stream: String,
    pub subject_prefix: String,
    pub replicas: usize,
    /// How long the server remembers message ids for de-duplication.
    pub duplicate_window: Duration,
    /// How long a delivered, unacknowledged commit waits before redelivery.
    pub ack_wait: Duration,
    /// Bound on every request to the server, so an outage surfaces as an error.
    pub request_timeout: Duration,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            stream: "MERIDIAN_EVENTS".into(),
            subject_prefix: "meridian.events".into(),
            replicas: 1,
            duplicate_window: Duration::from_secs(120),
            ack_wait: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
        }
    }
}

pub struct NatsLog {
    js: Context,
    stream: stream::Stream,
    config: NatsConfig,
    /// Where each aggregate's last commit is, shared with this log's subscriptions.
    last_seen: Arc<LastSeen>,
    /// The commits this log stored last, shared with its subscriptions.
    stored_here: Arc<StoredHere>,
    /// The object store bucket beside the stream that keeps snapshots, once opened.
    snapshots: tokio::sync::OnceCell<object_store::ObjectStore>,
}

/// The object metadata key holding a snapshot's position.
const SNAPSHOT_POSITION: &str = "position";

fn unavailable(e: impl std::fmt::Display) -> LogError {
    LogError::Unavailable(e.to_string())
}

/// Aggregate → (its last aggregate sequence, that commit's stream sequence), as last
/// seen by this process: through its own appends and what its subscriptions deliver,
/// so that a service deciding on an aggregate it was just delivered appends without
/// first looking up where the aggregate's last commit is. A stale entry only costs a
/// conflict and a re-read: the server checks the expected sequence all the same.
#[derive(Default)]
struct LastSeen(Mutex<HashMap<AggregateRef, (u64, u64)>>);

impl LastSeen {
    fn get(&self, aggregate: AggregateRef) -> Option<(u64, u64)> {
        self.0
            .lock()
            .expect("last_seen poisoned")
            .get(&aggregate)
            .copied()
    }

    fn remember(&self, aggregate: AggregateRef, sequence: u64, position: u64) {
        let mut seen = self.0.lock().expect("last_seen poisoned");
        Self::bound(&mut seen);
        seen.insert(aggregate, (sequence, position));
    }

    /// Each delivered commit's aggregate with its last event's sequence and the commit's
    /// position, unless a later commit of it was seen already (a subscription delivers a
    /// commit again after a restart or a broken stream).
    fn delivered(&self, commits: impl IntoIterator<Item = (AggregateRef, u64, u64)>) {
        let mut seen = self.0.lock().expect("last_seen poisoned");
        for (aggregate, sequence, position) in commits {
            Self::bound(&mut seen);
            let entry = seen.entry(aggregate).or_insert((0, 0));
            if sequence > entry.0 {
                *entry = (sequence, position);
            }
        }
    }

    fn forget(&self, aggregate: AggregateRef) {
        self.0
            .lock()
            .expect("last_seen poisoned")
            .remove(&aggregate);
    }

    /// Forgetting only costs one lookup on an aggregate's next append.
    fn bound(seen: &mut HashMap<AggregateRef, (u64, u64)>) {
        if seen.len() >= 100_000 {
            seen.clear();
        }
    }
}

fn decode_commit(position: u64, payload: &[u8]) -> Result<Vec<RawEnvelope>, LogError> {
    serde_json::from_slice(payload).map_err(|e| LogError::Corrupt {
        position,
        message: e.to_string(),
    })
}

/// The commits this log (this connection) stored last, by their message id (their first
/// event's id), as the typed events they were written from ([`EncodedCommit::written`]):
/// this log's subscriptions hand those back rather than decode the commit's text again.
/// A service reads back everything it decides (the router: each placement, with an
/// explanation naming every site, was about three quarters of the bytes it was
/// delivered), so that decoding was most of what reading its subscription cost.
///
/// Kept only once the log has a durable subscription: a log that only writes (the
/// intake's) would keep them for nobody. A commit is kept from just before it is
/// published (its delivery can overtake the publish's acknowledgement) and let go of if
/// the publish failed or was answered as a duplicate (the message stored then is an
/// earlier one). Its message id names it alone: event ids are never reused, the stream
/// stores one message per id within its duplicate window, and after it the expected
/// last sequence refuses a second copy. Kept for the last [`StoredHere::KEPT`] commits,
/// [`StoredHere::KEPT_BYTES`] of their text at most, which a reader keeping up is
/// delivered well within; a reader further behind decodes the text, as a reader on
/// another connection does.
#[derive(Default)]
struct StoredHere {
    kept: Mutex<Kept>,
    /// Set by the log's first durable subscription.
    read_here: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Kept {
    /// Each commit with its size and the stamp of its place in `order`.
    commits: HashMap<Uuid, (Written, usize, u64)>,
    /// Ids in the order kept, oldest first, each with its stamp: an id let go of and
    /// kept again is let go only at its newer place.
    order: VecDeque<(Uuid, u64)>,
    bytes: usize,
    stamp: u64,
}

impl StoredHere {
    const KEPT: usize = 4096;
    const KEPT_BYTES: usize = 16 << 20;

    fn read_here(&self) {
        self.read_here
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keeps the commit of `size` bytes of text whose message id is `id`, if this log
    /// is read here.
    fn remember(&self, id: Uuid, written: Written, size: usize) {
        if !self.read_here.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let mut kept = self.kept.lock().expect("stored_here poisoned");
        kept.stamp += 1;
        let stamp = kept.stamp;
        if let Some((_, replaced, _)) = kept.commits.insert(id, (written, size, stamp)) {
            kept.bytes -= replaced;
        }
        kept.order.push_back((id, stamp));
        kept.bytes += size;
        while kept.commits.len() > Self::KEPT || kept.bytes > Self::KEPT_BYTES {
            let Some((oldest, stamp)) = kept.order.pop_front() else {
                break;
            };
            if kept.commits.get(&oldest).is_some_and(|c| c.2 == stamp) {
                let (_, size, _) = kept.commits.remove(&oldest).expect("just found");
                kept.bytes -= size;
            }
        }
    }

    /// Lets go of a commit whose message the stream did not store (or not this one).
    fn forget(&self, id: Uuid) {
        let mut kept = self.kept.lock().expect("stored_here poisoned");
        if let Some((_, size, _)) = kept.commits.remove(&id) {
            kept.bytes -= size;
        }
        // Its place in `order` goes when it comes to the front.
        if kept.order.len() > 2 * Self::KEPT {
            let Kept { commits, order, .. } = &mut *kept;
            order.retain(|(id, stamp)| commits.get(id).is_some_and(|c| c.2 == *stamp));
        }
    }

    /// The commit `msg` carries, if this log stored it and keeps it still.
    fn get(&self, msg: &async_nats::Message) -> Option<Written> {
        let id = msg
            .headers
            .as_ref()?
            .get(async_nats::header::NATS_MESSAGE_ID)?;
        let id = Uuid::parse_str(id.as_str()).ok()?;
        let kept = self.kept.lock().expect("stored_here poisoned");
        kept.commits.get(&id).map(|(w, _, _)| w.clone())
    }
}

/// A commit's envelopes read from its text, each payload decoded into an [`Event`] when
/// the commit's aggregate is of one of `kinds`; with the commit's aggregate and last
/// sequence (None for a commit of no events).
fn decode_events(
    position: u64,
    payload: &[u8],
    kinds: &[AggregateKind],
) -> Result<(DecodedCommit, Option<(AggregateRef, u64)>), LogError> {
    let corrupt = |e: serde_json::Error| LogError::Corrupt {
        position,
        message: e.to_string(),
    };
    let envelopes: Vec<Envelope<&serde_json::value::RawValue>> =
        serde_json::from_slice(payload).map_err(corrupt)?;
    let last = envelopes.last().map(|e| (e.aggregate, e.sequence));
    let events = envelopes
        .iter()
        .filter(|e| kinds.contains(&e.aggregate.kind))
        .map(|e| {
            let payload = e.payload.get();
            let kind = Event::type_of_json(payload).map_err(corrupt)?;
            let event = Event::from_json(&kind, payload).map_err(corrupt)?;
            Ok(e.with_payload(event))
        })
        .collect::<Result<_, LogError>>()?;
    Ok((DecodedCommit { position, events }, last))
}

/// A replicated stream answers reads only once it has a leader and its replicas are
/// current: just created (or just after a server came back) it may not, and a direct
/// read would time out. Waits for that, bounded, so a service starting with the cluster
/// does not fail its first read.
async fn wait_for_replicas(
    stream: &stream::Stream,
    name: &str,
    replicas: usize,
) -> Result<(), LogError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut info = stream.clone();
    loop {
        let why = match info.info().await {
            Ok(i) => match &i.cluster {
                Some(c)
                    if c.leader.is_some()
                        && c.replicas.len() + 1 >= replicas
                        && c.replicas.iter().all(|r| r.current) =>
                {
                    return Ok(())
                }
                Some(c) if c.leader.is_none() => "no leader yet".to_string(),
                Some(c) if c.replicas.len() + 1 < replicas => {
                    format!("{} of {} replicas known", c.replicas.len() + 1, replicas)
                }
                Some(c) => format!(
                    "replicas not current: {}",
                    c.replicas
                        .iter()
                        .filter(|r| !r.current)
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => return Ok(()),
            },
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(LogError::Unavailable(format!(
                "stream {} at R{} is not ready after 60 s: {why}",
                name, replicas
            )));
        }
        tracing::info!(stream = %name, %why, "waiting for the stream's replicas");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl NatsLog {
    /// Connects and creates the stream when it does not exist yet.
    /// `config.url` may name several servers of a cluster, comma-separated; the client
    /// connects to one and moves to another when it goes.
    pub async fn connect(config: NatsConfig) -> Result<NatsLog, LogError> {
        let servers = config
            .url
            .split(',')
            .map(|u| u.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LogError::Unavailable(format!("invalid NATS URL {}: {e}", config.url)))?;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(config.request_timeout)
            .request_timeout(Some(config.request_timeout))
            .connect(servers)
            .await
            .map_err(|e| LogError::Unavailable(format!("cannot connect to {}: {e}", config.url)))?;
        let js = async_nats::jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .build(client);
        let stream = js
            .get_or_create_stream(stream::Config {
                name: config.stream.clone(),
                subjects: vec![format!("{}.>", config.subject_prefix)],
                storage: StorageType::File,
                num_replicas: config.replicas,
                duplicate_window: config.duplicate_window,
                allow_direct: true,
                deny_delete: true,
                deny_purge: true,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                LogError::Unavailable(format!("cannot create stream {}: {e}", config.stream))
            })?;
        if config.replicas > 1 {
            wait_for_replicas(&stream, &config.stream, config.replicas).await?;
        }
        Ok(NatsLog {
            js,
            stream,
            config,
            last_seen: Arc::default(),
            stored_here: Arc::default(),
            snapshots: tokio::sync::OnceCell::new(),
        })
    }

    /// The bucket `<stream>_SNAPSHOTS` (as many replicas as the stream), created the
    /// first time a snapshot is saved or looked for.
    async fn snapshots(&self) -> Result<&object_store::ObjectStore, LogError> {
        self.snapshots
            .get_or_try_init(|| async {
                let bucket = format!("{}_SNAPSHOTS", self.config.stream);
                let store = match self.js.get_object_store(&bucket).await {
                    Ok(store) => store,
                    Err(_) => self.create_snapshots(&bucket).await?,
                };
                // Just created (or just after a server came back), a replicated bucket
                // answers nothing until it has a leader, as the stream at `connect`.
                if self.config.replicas > 1 {
                    let stream = self
                        .js
                        .get_stream(format!("OBJ_{bucket}"))
                        .await
                        .map_err(unavailable)?;
                    wait_for_replicas(&stream, &bucket, self.config.replicas).await?;
                }
                Ok(store)
            })
            .await
    }

    async fn create_snapshots(&self, bucket: &str) -> Result<object_store::ObjectStore, LogError> {
        self.js
            .create_object_store(object_store::Config {
                bucket: bucket.to_string(),
                description: Some("Meridian's snapshots of state folded from the log".into()),
                storage: StorageType::File,
                num_replicas: self.config.replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| LogError::Unavailable(format!("cannot create the bucket {bucket}: {e}")))
    }

    fn subject(&self, aggregate: AggregateRef) -> String {
        format!(
            "{}.{}.{}",
            self.config.subject_prefix, aggregate.kind, aggregate.id
        )
    }

    /// The aggregate's last (aggregate sequence, stream sequence), or None if it has none.
    async fn last_of(&self, aggregate: AggregateRef) -> Result<Option<(u64, u64)>, LogError> {
        match self
            .stream
            .get_last_raw_message_by_subject(&self.subject(aggregate))
            .await
        {
            Ok(msg) => {
                let sequence = msg
                    .headers
                    .get(LAST_SEQUENCE_HEADER)
                    .and_then(|v| v.as_str().parse::<u64>().ok())
                    .ok_or_else(|| LogError::Corrupt {
                        position: msg.sequence,
                        message: format!("missing {LAST_SEQUENCE_HEADER} header"),
                    })?;
                Ok(Some((sequence, msg.sequence)))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Publishes `commit` as one message, its events' JSON array, expecting the
    /// aggregate's last commit where the commit expects it.
    async fn publish(&self, commit: EncodedCommit) -> Result<Appended, LogError> {
        let (aggregate, expected) = (commit.aggregate(), commit.expected());
        let (last_sequence, first_id) = (commit.last_sequence(), commit.first_id());
        let traceparent = commit.traceparent();
        let written = commit.written();
        commit.fits()?;
        let payload = commit.to_array();
        let size = payload.len();

        let expected_position = if expected == 0 {
            0
        } else {
            let cached = self.last_seen.get(aggregate);
            match cached {
                Some((sequence, position)) if sequence == expected => position,
                _ => match self.last_of(aggregate).await? {
                    Some((sequence, position)) if sequence == expected => position,
                    _ => {
                        return self
                            .conflict_or_duplicate(aggregate, expected, first_id)
                            .await
                    }
                },
            }
        };

        let payload = bytes::Bytes::from(payload);
        let publish = || {
            let mut publish = PublishMessage::build()
                .payload(payload.clone())
                .message_id(first_id.to_string())
                .expected_last_subject_sequence(expected_position)
                .header(LAST_SEQUENCE_HEADER, last_sequence.to_string().as_str());
            if let Some(tp) = traceparent {
                publish = publish.header("traceparent", tp);
            }
            publish
        };
        // Kept before it is sent: its delivery can overtake the acknowledgement.
        if let Some(written) = written {
            self.stored_here.remember(first_id, written, size);
        }
        // No server answering for the stream means no server took the message, so sending
        // it again cannot store it twice (and the message id would catch it if it could).
        // In a cluster this lasts while the stream's leader is elected, often under a
        // second: it is waited out here, briefly, rather than failing the caller's work.
        let give_up = tokio::time::Instant::now() + NO_RESPONDERS_WAIT;
        const FIRST_PAUSE: Duration = Duration::from_millis(25);
        let mut pause = FIRST_PAUSE;
        let ack = loop {
            let ack = match self
                .js
                .send_publish(self.subject(aggregate), publish())
                .await
            {
                Ok(future) => future.await,
                Err(e) => Err(e),
            };
            match ack {
                Err(e)
                    if e.kind() == PublishErrorKind::StreamNotFound
                        && tokio::time::Instant::now() + pause < give_up =>
                {
                    if pause == FIRST_PAUSE {
                        tracing::warn!(stream = %self.config.stream, "no server answered for the stream (a leader election?); publishing again for up to {} s", NO_RESPONDERS_WAIT.as_secs());
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(400));
                }
                ack => break ack,
            }
        };
        if ack.is_err() {
            // Not stored (or not known to be): its readers decode it, if it comes.
            self.stored_here.forget(first_id);
        }
        match ack {
            Ok(ack) if ack.duplicate => {
                // The message stored is an earlier one with this id: its readers decode it.
                self.stored_here.forget(first_id);
                Ok(Appended::Duplicate {
                    position: ack.sequence,
                })
            }
            Ok(ack) => {
                self.last_seen
                    .remember(aggregate, last_sequence, ack.sequence);
                Ok(Appended::Stored {
                    position: ack.sequence,
                })
            }
            Err(e) => match e.kind() {
                PublishErrorKind::WrongLastSequence => {
                    self.last_seen.forget(aggregate);
                    self.conflict_or_duplicate(aggregate, expected, first_id)
                        .await
                }
                // 10164 is the same conflict reported without the sequence.
                PublishErrorKind::Other if e.to_string().contains("wrong last sequence") => {
                    self.last_seen.forget(aggregate);
                    self.conflict_or_duplicate(aggregate, expected, first_id)
                        .await
                }
                PublishErrorKind::MaxPayloadExceeded => Err(LogError::TooLarge {
                    size,
                    limit: MAX_COMMIT_BYTES,
                }),
                // No server answered for the stream for NO_RESPONDERS_WAIT: its servers
                // are down or still electing. The stream exists (connect made it), so this
                // passes; a caller retries it as any outage.
                PublishErrorKind::StreamNotFound => Err(LogError::Unavailable(format!(
                    "no server answered for stream {} (subject {}); retry",
                    self.config.stream,
                    self.subject(aggregate)
                ))),
                _ => Err(unavailable(e)),
            },
        }
    }

    /// After a failed expected-sequence check: either these events are already stored (a
    /// retry past the duplicate window) or someone else moved the aggregate on.
    async fn conflict_or_duplicate(
        &self,
        aggregate: AggregateRef,
        expected: u64,
        first_id: Uuid,
    ) -> Result<Appended, LogError> {
        let history = self.read_commits(aggregate).await?;
        for commit in &history {
            if commit.events.iter().any(|e| e.event_id == first_id) {
                return Ok(Appended::Duplicate {
                    position: commit.position,
                });
            }
        }
        let actual = history
            .last()
            .and_then(|c| c.events.last())
            .map_or(0, |e| e.sequence);
        if let Some(last) = history.last() {
            self.last_seen.remember(aggregate, actual, last.position);
        }
        Err(LogError::Conflict {
            aggregate,
            expected,
            actual,
        })
    }

    /// Reads messages from an ordered consumer until the one at `last` (inclusive) or
    /// `max` of them, whichever comes first.
    async fn read_ordered(
        &self,
        filter_subject: String,
        start: u64,
        last: u64,
        max: usize,
    ) -> Result<Vec<Commit>, LogError> {
        self.read_ordered_payloads(filter_subject, start, last, max)
            .await?
            .into_iter()
            .map(|(position, payload)| {
                Ok(Commit::new(position, decode_commit(position, &payload)?))
            })
            .collect()
    }

    /// [`NatsLog::read_ordered`], each commit's payload as stored.
    async fn read_ordered_payloads(
        &self,
        filter_subject: String,
        start: u64,
        last: u64,
        max: usize,
    ) -> Result<Vec<(u64, bytes::Bytes)>, LogError> {
        let consumer = self
            .stream
            .create_consumer(pull::OrderedConfig {
                filter_subject,
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: start.max(1),
                },
                ..Default::default()
            })
            .await
            .map_err(unavailable)?;
        // The server keeps an ordered consumer for 30 s after its last use, and a stream
        // takes 1,000 consumers by default (nats-server 2.15): a busy reader (a start
        // folding the log page by page while writers write) would reach that within
        // seconds. Deleted once read, in the background (best effort: one the client
        // made again after a gap just lapses).
        let _delete = DeleteWhenDone::of(&self.stream, &consumer);
        let mut messages = consumer.messages().await.map_err(unavailable)?;
        let mut commits = Vec::new();
        while commits.len() < max {
            let next = tokio::time::timeout(self.config.request_timeout, messages.next())
                .await
                .map_err(|_| LogError::Unavailable("timed out reading the stream".into()))?;
            let msg = match next {
                Some(Ok(msg)) => msg,
                Some(Err(e)) => return Err(unavailable(e)),
                None => break,
            };
            let position = msg.info().map_err(unavailable)?.stream_sequence;
            // An ordered consumer that resets (a server went, a gap) starts again after
            // what it delivered; never hand back a commit twice or out of order.
            if position < start
                || commits
                    .last()
                    .is_some_and(|(at, _): &(u64, bytes::Bytes)| *at >= position)
            {
                continue;
            }
            commits.push((position, msg.message.payload));
            if position >= last {
                break;
            }
        }
        Ok(commits)
    }

    async fn read_commits(&self, aggregate: AggregateRef) -> Result<Vec<Commit>, LogError> {
        // Most histories are short: fetch them commit by commit with direct gets (one
        // round trip each). A long one switches to an ordered consumer, which streams.
        const DIRECT_GETS: usize = 32;
        let Some((_, last)) = self.last_of(aggregate).await? else {
            return Ok(Vec::new());
        };
        let subject = self.subject(aggregate);
        let mut commits = Vec::new();
        let mut next = 1;
        while commits.len() < DIRECT_GETS {
            let msg = match self
                .stream
                .direct_get_builder()
                .next_by_subject(subject.clone())
                .sequence(next)
                .send()
                .await
            {
                Ok(msg) => msg,
                // The leader holds commits up to `last`, but a replica that has not caught
                // up may answer a direct get (a cluster's followers answer them too): read
                // the rest in order, which waits for them, rather than return a history
                // cut short (a reader would act on a state that is not the log's).
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
                    commits.extend(self.read_ordered(subject, next, last, usize::MAX).await?);
                    return Ok(commits);
                }
                Err(e) => return Err(unavailable(e)),
            };
            commits.push(Commit::new(
                msg.sequence,
                decode_commit(msg.sequence, &msg.payload)?,
            ));
            if msg.sequence >= last {
                return Ok(commits);
            }
            next = msg.sequence + 1;
        }
        commits.extend(self.read_ordered(subject, next, last, usize::MAX).await?);
        Ok(commits)
    }
}

#[async_trait]
impl EventLog for NatsLog {
    async fn append(&self, events: Vec<RawEnvelope>) -> Result<Appended, LogError> {
        self.publish(EncodedCommit::encode(&events)?).await
    }

    async fn append_encoded(&self, commit: EncodedCommit) -> Result<Appended, LogError> {
        self.publish(commit).await
    }

    async fn read_aggregate(&self, aggregate: AggregateRef) -> Result<Vec<RawEnvelope>, LogError> {
        Ok(self
            .read_commits(aggregate)
            .await?
            .into_iter()
            .flat_map(Commit::into_events)
            .collect())
    }

    async fn read_from(&self, after: u64, max: usize) -> Result<Vec<Commit>, LogError> {
        let head = self.head().await?;
        if after >= head || max == 0 {
            return Ok(Vec::new());
        }
        self.read_ordered(String::new(), after + 1, head, max).await
    }

    async fn read_text_from(&self, after: u64, max: usize) -> Result<Vec<StoredCommit>, LogError> {
        let head = self.head().await?;
        if after >= head || max == 0 {
            return Ok(Vec::new());
        }
        // A commit is stored as the JSON array of its envelopes: split, not parsed.
        self.read_ordered_payloads(String::new(), after + 1, head, max)
            .await?
            .into_iter()
            .map(|(position, payload)| {
                let events: Vec<&serde_json::value::RawValue> = serde_json::from_slice(&payload)
                    .map_err(|e| LogError::Corrupt {
                        position,
                        message: e.to_string(),
                    })?;
                Ok(StoredCommit {
                    position,
                    events: events.into_iter().map(|e| e.get().to_string()).collect(),
                })
            })
            .collect()
    }

    async fn head(&self) -> Result<u64, LogError> {
        let mut stream = self.stream.clone();
        let info = stream.info().await.map_err(unavailable)?;
        Ok(info.state.last_sequence)
    }

    async fn subscribe(&self, name: &str) -> Result<Box<dyn Subscription>, LogError> {
        check_name(name)?;
        let consumer = open_durable(&self.stream, name, self.config.ack_wait).await?;
        self.stored_here.read_here();
        Ok(Box::new(NatsSubscription {
            last_seen: self.last_seen.clone(),
            stored_here: self.stored_here.clone(),
            stream: self.stream.clone(),
            name: name.to_string(),
            ack_wait: self.config.ack_wait,
            next_delivery: next_delivery(&consumer),
            consumer,
            messages: None,
            broken: false,
            unacked: VecDeque::new(),
        }))
    }

    async fn tail(&self, after: u64) -> Result<Box<dyn Subscription>, LogError> {
        let consumer = self
            .stream
            .create_consumer(pull::OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: after + 1,
                },
                ..Default::default()
            })
            .await
            .map_err(unavailable)?;
        let delete = DeleteWhenDone::of(&self.stream, &consumer);
        let messages = consumer.messages().await.map_err(unavailable)?;
        Ok(Box::new(NatsTail {
            messages: Box::pin(messages),
            after,
            _delete: delete,
        }))
    }

    async fn save_snapshot(&self, snapshot: Snapshot) -> Result<(), LogError> {
        check_name(&snapshot.name)?;
        let store = self.snapshots().await?.clone();
        // Two savers racing may both pass this check; the later position then only
        // loses to an earlier one until the next save, which is harmless (see `snapshot`).
        match store.info(&snapshot.name).await {
            Ok(info) if snapshot_position(&info).is_some_and(|p| p >= snapshot.position) => {
                return Ok(())
            }
            Ok(_) => {}
            Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => {}
            Err(e) => return Err(unavailable(e)),
        }
        let meta = object_store::ObjectMetadata {
            name: snapshot.name.clone(),
            metadata: HashMap::from([(
                SNAPSHOT_POSITION.to_string(),
                snapshot.position.to_string(),
            )]),
            ..Default::default()
        };
        // A put is chunks, then the object's metadata, then a purge of the old chunks: a
        // caller given up half-way (a service's background fold, stopped with it) would
        // leave chunks that nothing purges. It runs on its own task, so it ends either way.
        let put = tokio::spawn(async move {
            store
                .put(meta, &mut snapshot.body.as_slice())
                .await
                .map(|_| ())
                .map_err(unavailable)
        });
        put.await
            .map_err(|e| LogError::Backend(format!("saving a snapshot: {e}")))?
    }

    async fn load_snapshot(&self, name: &str) -> Result<Option<Snapshot>, LogError> {
        use tokio::io::AsyncReadExt;
        check_name(name)?;
        let store = self.snapshots().await?;
        let mut object = match store.get(name).await {
            Ok(object) => object,
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unavailable(e)),
        };
        let Some(position) = snapshot_position(&object.info) else {
            return Err(LogError::Corrupt {
                position: 0,
                message: format!("snapshot {name:?} has no {SNAPSHOT_POSITION} metadata"),
            });
        };
        let mut body = Vec::with_capacity(object.info.size);
        object.read_to_end(&mut body).await.map_err(unavailable)?;
        Ok(Some(Snapshot {
            name: name.to_string(),
            position,
            body,
        }))
    }
}

fn snapshot_position(info: &object_store::ObjectInfo) -> Option<u64> {
    info.metadata.get(SNAPSHOT_POSITION)?.parse().ok()
}

/// Deletes a one-off consumer when dropped, however the read that used it ended.
struct DeleteWhenDone(Option<(stream::Stream, String)>);

impl DeleteWhenDone {
    fn of(
        stream: &stream::Stream,
        consumer: &consumer::Consumer<pull::OrderedConfig>,
    ) -> DeleteWhenDone {
        DeleteWhenDone(Some((stream.clone(), consumer.cached_info().name.clone())))
    }
}

impl Drop for DeleteWhenDone {
    fn drop(&mut self) {
        if let (Some((stream, name)), Ok(runtime)) =
            (self.0.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(async move {
                if let Err(e) = stream.delete_consumer(&name).await {
                    // Not fatal: the server drops it after 30 s idle. Said at WARN because
                    // many at once would reach the stream's consumer limit.
                    tracing::warn!(consumer = %name, error = %e, "a read's consumer was not deleted; the server drops it after 30 s");
                }
            });
        }
    }
}

/// An ordered consumer: the client recreates it on gaps or server restarts, resuming
/// after the last message it delivered.
struct NatsTail {
    messages: std::pin::Pin<Box<pull::Ordered>>,
    after: u64,
    _delete: DeleteWhenDone,
}

#[async_trait]
impl Subscription for NatsTail {
    /// Cancellation-safe: the only await is for the first commit, before anything is
    /// taken; the rest is taken without awaiting.
    async fn next(&mut self, max: usize, wait: Duration) -> Result<Vec<Commit>, LogError> {
        let mut out = Vec::new();
        let first = match tokio::time::timeout(wait, self.messages.next()).await {
            Ok(next) => next,
            Err(_) => return Ok(out),
        };
        let mut next = Some(first);
        while let Some(item) = next {
            let msg = match item {
                Some(Ok(msg)) => msg,
                Some(Err(e)) => return Err(unavailable(e)),
                None => return Err(LogError::Unavailable("the tail's consumer ended".into())),
            };
            let position = msg.info().map_err(unavailable)?.stream_sequence;
            if position > self.after {
                self.after = position;
                out.push(Commit::new(
                    position,
                    decode_commit(position, &msg.payload)?,
                ));
            }
            next = if out.len() < max.max(1) {
                self.messages.next().now_or_never()
            } else {
                None
            };
        }
        Ok(out)
    }

    async fn ack(&mut self, _position: u64) -> Result<(), LogError> {
        Ok(())
    }
}

/// The durable consumer `name`, resuming after its last acknowledged commit.
async fn open_durable(
    stream: &stream::Stream,
    name: &str,
    ack_wait: Duration,
) -> Result<consumer::Consumer<pull::Config>, LogError> {
    let config = |deliver_policy| pull::Config {
        durable_name: Some(name.to_string()),
        ack_policy: AckPolicy::All,
        ack_wait,
        max_ack_pending: 20_000,
        deliver_policy,
        ..Default::default()
    };
    let start = match stream.consumer_info(name).await {
        // Commits delivered but never acknowledged belong to a reader that died (or to
        // this one's stream that broke). Waiting out ack_wait would let newer commits
        // overtake them, and a cumulative ack of those would acknowledge them unseen: so
        // rewind the durable to its ack floor and deliver them again, in order, at once.
        Ok(info) if info.delivered.stream_sequence > info.ack_floor.stream_sequence => {
            stream.delete_consumer(name).await.map_err(unavailable)?;
            Some(info.ack_floor.stream_sequence + 1)
        }
        Ok(_) => None,
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => Some(1),
        Err(e) => return Err(unavailable(e)),
    };
    match start {
        Some(start_sequence) => stream
            .create_consumer(config(DeliverPolicy::ByStartSequence { start_sequence }))
            .await
            .map_err(unavailable),
        None => stream.get_consumer(name).await.map_err(unavailable),
    }
}

/// The delivery sequence the consumer's next message will carry: one past the last it
/// delivered (to anyone), as its info says when it is opened.
fn next_delivery(consumer: &consumer::Consumer<pull::Config>) -> u64 {
    consumer.cached_info().delivered.consumer_sequence + 1
}

/// A durable subscription. Its messages come from one pull stream kept for the
/// subscription's life: a `next` dropped while it waits (a `select!` that took another
/// branch) loses nothing, because a commit the server delivers meanwhile waits in the
/// stream for the next call. (A pull request per call would leave the server delivering
/// into a request nobody reads; with cumulative acks the next ack would then acknowledge
/// a commit no one saw.)
struct NatsSubscription {
    last_seen: Arc<LastSeen>,
    stored_here: Arc<StoredHere>,
    stream: stream::Stream,
    name: String,
    ack_wait: Duration,
    consumer: consumer::Consumer<pull::Config>,
    messages: Option<std::pin::Pin<Box<pull::Stream>>>,
    /// The last stream failed: the consumer is reopened (rewound) before the next one.
    broken: bool,
    /// The delivery sequence the next message must carry. Every delivery, a redelivery
    /// too, takes the consumer's next one; a message that skips one means a delivery
    /// never reached this subscription (lost on the way, or taken by another reader of
    /// the durable), and with cumulative acks the next ack would acknowledge it unseen.
    next_delivery: u64,
    /// Delivered, not yet acknowledged, in position order.
    unacked: VecDeque<(u64, async_nats::jetstream::Message)>,
}

impl NatsSubscription {
    async fn messages(&mut self) -> Result<&mut std::pin::Pin<Box<pull::Stream>>, LogError> {
        if self.messages.is_none() {
            if self.broken {
                // What the broken stream delivered and nobody acknowledged is delivered
                // again, first.
                self.consumer = open_durable(&self.stream, &self.name, self.ack_wait).await?;
                self.next_delivery = next_delivery(&self.consumer);
                self.broken = false;
            }
            let stream = self
                .consumer
                .stream()
                .max_messages_per_batch(256)
                .heartbeat(Duration::from_secs(5))
                .expires(Duration::from_secs(30))
                .messages()
                .await
                .map_err(unavailable)?;
            self.messages = Some(Box::pin(stream));
        }
        Ok(self.messages.as_mut().expect("set above"))
    }

    /// After a commit that does not decode: the rest of its batch was taken from the
    /// stream and handed to no one, so the next call starts again from the last
    /// acknowledged commit (as after a broken stream), never past them.
    fn give_up(&mut self, error: LogError) -> LogError {
        self.messages = None;
        self.broken = true;
        self.unacked.clear();
        error
    }

    /// The next messages, at most `max`, waiting up to `wait` for the first, each with
    /// its position; fails (and rewinds, see `next_delivery`) when a delivery is missing.
    /// Cancellation-safe: the awaits come before anything is taken from the stream; the
    /// rest is taken without awaiting.
    async fn take(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(u64, async_nats::jetstream::Message)>, LogError> {
        let messages = self.messages().await?;
        let first = match tokio::time::timeout(wait, messages.next()).await {
            Ok(next) => next,
            Err(_) => return Ok(Vec::new()),
        };
        let mut taken = Vec::new();
        let mut next = Some(first);
        while let Some(item) = next {
            match item {
                Some(Ok(msg)) => taken.push(msg),
                Some(Err(e)) => {
                    // The stream is done for; the next call opens another, which resumes
                    // after the last acknowledged commit.
                    self.messages = None;
                    self.broken = true;
                    self.unacked.clear();
                    return Err(unavailable(e));
                }
                None => {
                    self.messages = None;
                    self.broken = true;
                    self.unacked.clear();
                    return Err(LogError::Unavailable(
                        "the subscription's stream ended".into(),
                    ));
                }
            }
            next = if taken.len() < max.max(1) {
                messages.next().now_or_never()
            } else {
                None
            };
        }
        let mut delivered = Vec::with_capacity(taken.len());
        for msg in taken {
            let info = match msg.info() {
                Ok(info) => info,
                Err(e) => return Err(self.give_up(unavailable(e))),
            };
            if info.consumer_sequence != self.next_delivery {
                // Handed to no one: the durable is rewound to its last acknowledged
                // commit and delivers from there again, the missing one included.
                let missing = self.next_delivery;
                return Err(self.give_up(LogError::Unavailable(format!(
                    "subscription {}: delivery {missing} never arrived (the next carried {}); \
                     delivering again from the last acknowledged commit",
                    self.name, info.consumer_sequence
                ))));
            }
            self.next_delivery += 1;
            delivered.push((info.stream_sequence, msg));
        }
        Ok(delivered)
    }
}

#[async_trait]
impl Subscription for NatsSubscription {
    async fn next(&mut self, max: usize, wait: Duration) -> Result<Vec<Commit>, LogError> {
        let taken = self.take(max, wait).await?;
        let mut out = Vec::with_capacity(taken.len());
        for (position, msg) in taken {
            let events = decode_commit(position, &msg.payload).map_err(|e| self.give_up(e))?;
            out.push(Commit::new(position, events));
            self.unacked.push_back((position, msg));
        }
        self.last_seen.delivered(out.iter().filter_map(|commit| {
            let last = commit.events.last()?;
            Some((last.aggregate, last.sequence, commit.position))
        }));
        Ok(out)
    }

    async fn next_decoded(
        &mut self,
        max: usize,
        wait: Duration,
        kinds: &[AggregateKind],
    ) -> Result<Vec<DecodedCommit>, LogError> {
        let taken = self.take(max, wait).await?;
        let mut out = Vec::with_capacity(taken.len());
        let mut seen = Vec::with_capacity(taken.len());
        for (position, msg) in taken {
            let (commit, last) = match self.stored_here.get(&msg) {
                Some(written) => (
                    DecodedCommit {
                        position,
                        events: written.events(kinds),
                    },
                    Some((written.aggregate, written.last_sequence)),
                ),
                None => {
                    decode_events(position, &msg.payload, kinds).map_err(|e| self.give_up(e))?
                }
            };
            out.push(commit);
            seen.extend(last.map(|(aggregate, sequence)| (aggregate, sequence, position)));
            self.unacked.push_back((position, msg));
        }
        self.last_seen.delivered(seen);
        Ok(out)
    }

    async fn ack(&mut self, position: u64) -> Result<(), LogError> {
        // Acks are cumulative (AckPolicy::All): acknowledging the newest delivered commit
        // at or below `position` acknowledges everything before it.
        let Some(index) = self.unacked.iter().rposition(|(p, _)| *p <= position) else {
            return Ok(());
        };
        let (_, msg) = &self.unacked[index];
        msg.double_ack().await.map_err(unavailable)?;
        self.unacked.drain(..=index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use meridian_events::vocabulary::workflow::WorkflowEvent;
    use meridian_events::EventContext;

    use super::*;
    use crate::testkit::nats_url_or_start;

    fn config(url: String) -> NatsConfig {
        let unique = Uuid::now_v7().simple().to_string();
        NatsConfig {
            url,
            stream: format!("STORED_HERE_{unique}"),
            subject_prefix: format!("stored_here.{unique}"),
            ..NatsConfig::default()
        }
    }

    fn finished(id: Uuid, after: u64, how_many: usize) -> Vec<Envelope<Event>> {
        let at = chrono::Utc::now();
        Envelope::sequence_after(
            AggregateRef::new(AggregateKind::Workflow, id),
            after,
            &EventContext::new_chain("t"),
            at,
            (0..how_many)
                .map(|_| Event::Workflow(WorkflowEvent::Finished { finished_at: at }))
                .collect(),
        )
    }

    async fn delivered(log: &NatsLog, reader: &str) -> Vec<DecodedCommit> {
        let mut sub = log.subscribe(reader).await.unwrap();
        let mut commits = Vec::new();
        while commits.len() < 2 {
            commits.extend(
                sub.next_decoded(10, Duration::from_secs(2), &AggregateKind::ALL)
                    .await
                    .unwrap(),
            );
        }
        commits
    }

    /// A commit this process stored from typed events is handed to its subscriptions
    /// from memory, equal to what decoding its text gives a reader elsewhere; one
    /// appended as trees is decoded.
    #[tokio::test]
    async fn a_commit_stored_here_is_handed_back_as_written_not_decoded_again() {
        let (url, _server) = nats_url_or_start().expect("a nats-server to test against");
        let cfg = config(url);
        let log = NatsLog::connect(cfg.clone()).await.unwrap();
        // Kept once the log is read here: a subscription opened before the appends.
        let _reader = log.subscribe("opened-first").await.unwrap();
        let typed = Arc::new(finished(Uuid::now_v7(), 0, 2));
        let stored = log
            .append_encoded(EncodedCommit::encode_shared(typed.clone()).unwrap())
            .await
            .unwrap();
        assert!(matches!(stored, Appended::Stored { .. }), "{stored:?}");
        let trees: Vec<RawEnvelope> = finished(Uuid::now_v7(), 0, 1)
            .iter()
            .map(|e| e.to_raw().unwrap())
            .collect();
        log.append(trees.clone()).await.unwrap();
        let kept = |id: Uuid| {
            log.stored_here
                .kept
                .lock()
                .unwrap()
                .commits
                .contains_key(&id)
        };
        assert!(kept(typed[0].event_id));
        assert!(!kept(trees[0].event_id), "appended as trees");
        // One refused (its aggregate moved on) is let go.
        let refused = Arc::new(finished(typed[0].aggregate.id, 0, 1));
        let conflict = log
            .append_encoded(EncodedCommit::encode_shared(refused.clone()).unwrap())
            .await;
        assert!(
            matches!(conflict, Err(LogError::Conflict { .. })),
            "{conflict:?}"
        );
        assert!(!kept(refused[0].event_id));

        // A reader in another process decodes the text; this one is handed the same.
        let elsewhere = NatsLog::connect(cfg).await.unwrap();
        let decoded = delivered(&elsewhere, "elsewhere").await;
        let here = delivered(&log, "here").await;
        assert_eq!(decoded[0].events, *typed);
        assert_eq!(here, decoded);

        // Handed from memory: what this process keeps for the position is what comes.
        let other = finished(typed[0].aggregate.id, 0, 2);
        let kept = EncodedCommit::encode_shared(Arc::new(other.clone()))
            .unwrap()
            .written()
            .unwrap();
        log.stored_here.remember(typed[0].event_id, kept, 1);
        let here = delivered(&log, "again").await;
        assert_eq!(here[0].events, other);
        assert_eq!(here[1], decoded[1]);
    }

    /// What is kept is bounded by count and by bytes, the oldest let go first; a
    /// commit let go of (refused) frees its bytes at once, and one kept again after
    /// that is let go of at its newer place. Nothing is kept for a log not read here.
    #[test]
    fn what_is_kept_is_bounded_and_the_oldest_goes_first() {
        let written = || {
            EncodedCommit::encode_shared(Arc::new(finished(Uuid::now_v7(), 0, 1)))
                .unwrap()
                .written()
                .unwrap()
        };
        let store = StoredHere::default();
        let holds = |id: &Uuid| store.kept.lock().unwrap().commits.contains_key(id);
        let unread = Uuid::now_v7();
        store.remember(unread, written(), 100);
        assert!(!holds(&unread), "kept with no subscription to read it");

        store.read_here();
        let again = Uuid::now_v7();
        store.remember(again, written(), 100);
        store.forget(again);
        let ids: Vec<Uuid> = (0..StoredHere::KEPT + 10).map(|_| Uuid::now_v7()).collect();
        for id in &ids[..20] {
            store.remember(*id, written(), 100);
        }
        store.remember(again, written(), 100);
        for id in &ids[20..] {
            store.remember(*id, written(), 100);
        }
        // Eleven over: the eleven oldest went, not the one kept again at its first place.
        assert!(holds(&again));
        assert!(!holds(&ids[10]) && holds(&ids[11]));
        let big = StoredHere::KEPT_BYTES / 4;
        let bigs: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
        for id in &bigs[..4] {
            store.remember(*id, written(), big);
        }
        // Four of a quarter each leave no room for the rest.
        assert!(!holds(ids.last().unwrap()) && !holds(&again));
        assert!(holds(&bigs[0]) && holds(&bigs[3]));
        store.remember(bigs[4], written(), big);
        assert!(!holds(&bigs[0]) && holds(&bigs[4]));
        store.forget(bigs[4]);
        assert!(!holds(&bigs[4]));
        assert_eq!(store.kept.lock().unwrap().bytes, 3 * big);
    }
}
