//! The embedded backend: one SQLite file, no server. Appends run in `BEGIN IMMEDIATE`
//! transactions so the expected-sequence check and the insert are one atomic step, and
//! every commit is fsynced (`synchronous=FULL`): an acknowledged append survives a crash.
//! Appends are committed in groups: one writer takes every append waiting when it is
//! free, checks them all in one statement before it writes (a conflict is refused alone,
//! having written nothing), and commits them with one fsync; each caller is answered only
//! after that commit.
//! Subscriptions' acknowledgements go through the same writer, in the same commits: a
//! second connection writing the file would wait in SQLite's busy handler, which sleeps
//! between tries, while the writer holds the lock.
//!
//! The writer keeps the last commits it stored (4 MiB of their JSON at most) in memory, and
//! subscriptions deliver from them when they can: the services of one process mostly
//! read the log's tail, each of them every commit, and a copy of a decoded commit costs
//! a fraction of a query and a parse. Positions are dense, so a commit that is not one
//! past the last kept shows another process wrote in between, and what is kept starts
//! again from it.

use std::collections::VecDeque;
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use meridian_events::{AggregateRef, RawEnvelope};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::{
    check_name, Appended, Commit, EncodedCommit, EventLog, LogError, Snapshot, StoredCommit,
    Subscription,
};

/// How often a waiting subscription looks for commits written by another process.
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Appends committed together at most (one transaction, one fsync).
const GROUP: usize = 256;

/// The encoded size of the commits kept in [`Recent`] at most (decoded, they take a few
/// times as much memory).
const RECENT_BYTES: usize = 4 * 1024 * 1024;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    position       INTEGER NOT NULL,
    idx            INTEGER NOT NULL,
    event_id       TEXT    NOT NULL UNIQUE,
    aggregate_kind TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    sequence       INTEGER NOT NULL,
    envelope       TEXT    NOT NULL,
    PRIMARY KEY (position, idx),
    UNIQUE (aggregate_kind, aggregate_id, sequence)
);
CREATE TABLE IF NOT EXISTS subscriptions (
    name     TEXT    PRIMARY KEY,
    position INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
    name     TEXT    PRIMARY KEY,
    position INTEGER NOT NULL,
    body     BLOB    NOT NULL
);
";

#[derive(Clone)]
pub struct SqliteLog {
    inner: Arc<Inner>,
}

struct Inner {
    pool: SqlitePool,
    /// Wakes this process's subscriptions when it appends.
    appended: Arc<Notify>,
    /// To the writer that commits appends and acknowledgements in groups.
    writer: mpsc::Sender<Write>,
    /// The commits this process stored last.
    recent: Arc<Mutex<Recent>>,
    /// How often subscriptions read the file.
    #[cfg(test)]
    file_reads: std::sync::atomic::AtomicU64,
}

/// The last commits the writer stored, in position order without a gap.
#[derive(Default)]
struct Recent {
    /// Each commit and its encoded size.
    commits: VecDeque<(Commit, usize)>,
    bytes: usize,
}

impl Recent {
    fn push(&mut self, commit: Commit, bytes: usize) {
        let follows = |(last, _): &(Commit, usize)| last.position + 1 == commit.position;
        if !self.commits.back().is_none_or(follows) {
            // Another process appended in between: what is kept would have a hole.
            self.commits.clear();
            self.bytes = 0;
        }
        self.bytes += bytes;
        self.commits.push_back((commit, bytes));
        while self.bytes > RECENT_BYTES {
            let Some((_, dropped)) = self.commits.pop_front() else {
                break;
            };
            self.bytes -= dropped;
        }
    }

    /// Whether commits after `after` come before the first one kept: written by another
    /// process, or before what is kept; only the file has them.
    fn behind(&self, after: u64) -> bool {
        self.commits
            .front()
            .is_some_and(|(first, _)| first.position > after.saturating_add(1))
    }

    /// Copies of up to `max` commits after position `after`, when the first of them is
    /// kept; None when it is older than what is kept, or newer (written since by another
    /// process, or not yet).
    fn after(&self, after: u64, max: usize) -> Option<Vec<Commit>> {
        let (first, _) = self.commits.front()?;
        let skip = usize::try_from(after.checked_sub(first.position - 1)?).ok()?;
        if skip >= self.commits.len() {
            return None;
        }
        let end = skip.saturating_add(max).min(self.commits.len());
        Some(
            self.commits
                .range(skip..end)
                .map(|(c, _)| c.clone())
                .collect(),
        )
    }
}

/// What the writer commits: an append, or a subscription's acknowledgement.
enum Write {
    Append(Pending),
    Ack(PendingAck),
}

/// A subscription's acknowledgement waiting for the writer.
struct PendingAck {
    name: String,
    position: u64,
    reply: oneshot::Sender<Result<(), LogError>>,
}

/// An append waiting for the writer, checked and encoded already.
struct Pending {
    events: Vec<RawEnvelope>,
    encoded: Vec<String>,
    aggregate: AggregateRef,
    expected: u64,
    reply: oneshot::Sender<Result<Appended, LogError>>,
}

impl Inner {
    /// Hands `write` to the writer and waits for its answer.
    async fn write<T>(
        &self,
        write: Write,
        answer: oneshot::Receiver<Result<T, LogError>>,
    ) -> Result<T, LogError> {
        let stopped = || LogError::Unavailable("the SQLite log's writer has stopped".into());
        self.writer.send(write).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn backend(e: sqlx::Error) -> LogError {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => LogError::Unavailable(e.to_string()),
        other => LogError::Backend(other.to_string()),
    }
}

impl SqliteLog {
    /// Opens (creating if needed) the log at `path`, e.g. `meridian-data/events.sqlite`.
    pub async fn open(path: &Path) -> Result<SqliteLog, LogError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                LogError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .map_err(backend)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(|e| LogError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
        sqlx::raw_sql(SCHEMA)
            .execute(&pool)
            .await
            .map_err(backend)?;
        let appended = Arc::new(Notify::new());
        let recent = Arc::new(Mutex::new(Recent::default()));
        let (writer, pending) = mpsc::channel(GROUP * 4);
        // Ends when the last handle to this log is dropped (the channel closes).
        tokio::spawn(write_groups(
            pool.clone(),
            pending,
            appended.clone(),
            recent.clone(),
        ));
        Ok(SqliteLog {
            inner: Arc::new(Inner {
                pool,
                appended,
                writer,
                recent,
                #[cfg(test)]
                file_reads: Default::default(),
            }),
        })
    }

    /// What a subscription delivers next: the commits after `after` that this process
    /// stored last, when it keeps the first of them; else a page of the file, when
    /// `file_due` or when the file holds commits before what is kept. It may stop short of
    /// `max` where another process wrote after them (the next call reads on), which
    /// `read_from` never does. The flag says whether the file was read.
    async fn read_next(
        &self,
        after: u64,
        max: usize,
        file_due: bool,
    ) -> Result<(Vec<Commit>, bool), LogError> {
        let (kept, behind) = {
            let recent = self.inner.recent.lock().expect("recent commits poisoned");
            (recent.after(after, max), recent.behind(after))
        };
        match kept {
            Some(commits) => Ok((commits, false)),
            None if behind || file_due => {
                #[cfg(test)]
                self.inner
                    .file_reads
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok((self.read_from(after, max).await?, true))
            }
            None => Ok((Vec::new(), false)),
        }
    }

    /// The rows of up to `max` commits after `after`: positions are dense here (each
    /// commit takes MAX + 1), so a range is a page.
    async fn page(&self, after: u64, max: usize) -> Result<Vec<sqlx::sqlite::SqliteRow>, LogError> {
        sqlx::query(
            "SELECT position, envelope FROM events WHERE position > ? AND position <= ? ORDER BY position, idx",
        )
        .bind(after as i64)
        .bind(after.saturating_add(max as u64).min(i64::MAX as u64) as i64)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(backend)
    }

    /// The position at which `event_id` is stored, if it is.
    async fn position_of(
        conn: &mut sqlx::SqliteConnection,
        event_id: &uuid::Uuid,
    ) -> Result<Option<u64>, LogError> {
        let row = sqlx::query("SELECT position FROM events WHERE event_id = ?")
            .bind(event_id.to_string())
            .fetch_optional(&mut *conn)
            .await
            .map_err(backend)?;
        Ok(row.map(|r| r.get::<i64, _>(0) as u64))
    }
}

/// The writer: commits every append and acknowledgement waiting when it is free as one
/// transaction.
async fn write_groups(
    pool: SqlitePool,
    mut pending: mpsc::Receiver<Write>,
    appended: Arc<Notify>,
    recent: Arc<Mutex<Recent>>,
) {
    while let Some(first) = pending.recv().await {
        let (mut group, mut acks) = (Vec::new(), Vec::new());
        let mut add = |write| match write {
            Write::Append(p) => group.push(p),
            Write::Ack(a) => acks.push(a),
        };
        add(first);
        for _ in 1..GROUP {
            match pending.try_recv() {
                Ok(write) => add(write),
                Err(_) => break,
            }
        }
        match write_group(&pool, &group, &acks).await {
            Ok(outcomes) => {
                // Kept before the subscriptions wake up to read them.
                let mut replies = Vec::with_capacity(group.len());
                let mut stored = false;
                {
                    let mut recent = recent.lock().expect("recent commits poisoned");
                    for (p, outcome) in group.into_iter().zip(outcomes) {
                        if let Ok(Appended::Stored { position }) = outcome {
                            let bytes = p.encoded.iter().map(String::len).sum();
                            let events = p.events;
                            recent.push(Commit::new(position, events), bytes);
                            stored = true;
                        }
                        replies.push((p.reply, outcome));
                    }
                }
                if stored {
                    appended.notify_waiters();
                }
                for (reply, outcome) in replies {
                    let _ = reply.send(outcome);
                }
                for a in acks {
                    let _ = a.reply.send(Ok(()));
                }
            }
            // Nothing of the group is stored (or its fate is unknown): each caller
            // hears why, and may retry the same events.
            Err(e) => {
                let message = e.to_string();
                let error = || match &e {
                    LogError::Unavailable(_) => LogError::Unavailable(message.clone()),
                    _ => LogError::Backend(message.clone()),
                };
                for p in group {
                    let _ = p.reply.send(Err(error()));
                }
                for a in acks {
                    let _ = a.reply.send(Err(error()));
                }
            }
        }
    }
}

/// One transaction for the group; the commit is the one fsync. An append that conflicts
/// (or repeats events already stored) is refused by its checks before anything is
/// written, so it needs no savepoint: a failure once writing began is a database failure,
/// and fails the group. Returns each append's outcome, valid only once the commit has
/// returned.
///
/// Each statement is a round trip to the connection's thread, so the group takes few
/// whatever its size: one query checks every append against the file, the appends are
/// decided in order in memory (a later one sees what an earlier one of the group
/// stores), and the stored events go in with a handful of multi-row inserts.
async fn write_group(
    pool: &SqlitePool,
    group: &[Pending],
    acks: &[PendingAck],
) -> Result<Vec<Result<Appended, LogError>>, LogError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(backend)?;
    let mut outcomes = Vec::with_capacity(group.len());
    // A group of acknowledgements alone has nothing to check.
    if !group.is_empty() {
        let (mut next, checks) = check_group(&mut tx, group).await?;
        let mut decided = Decided::default();
        let mut rows = Vec::new();
        for (p, check) in group.iter().zip(checks) {
            let outcome = decided.decide(&mut tx, p, check, next).await;
            match &outcome {
                Ok(Appended::Stored { position }) => {
                    next += 1;
                    rows.extend(p.events.iter().zip(&p.encoded).enumerate().map(
                        |(idx, (event, text))| EventRow {
                            position: *position,
                            idx,
                            event,
                            aggregate: &p.aggregate,
                            text,
                        },
                    ));
                }
                // A database failure: the transaction is not to be trusted.
                Err(e @ (LogError::Unavailable(_) | LogError::Backend(_))) => {
                    return Err(LogError::Backend(e.to_string()))
                }
                _ => {}
            }
            outcomes.push(outcome);
        }
        insert_rows(&mut tx, &rows).await?;
    }
    // A subscription's latest acknowledgement covers its earlier ones.
    let mut positions: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for ack in acks {
        let position = positions.entry(&ack.name).or_default();
        *position = (*position).max(ack.position);
    }
    for (name, position) in positions {
        sqlx::query("UPDATE subscriptions SET position = MAX(position, ?) WHERE name = ?")
            .bind(position as i64)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
    }
    tx.commit().await.map_err(backend)?;
    Ok(outcomes)
}

/// What the file holds for one append: its aggregate's last sequence, how many of its
/// events are stored, and where its first event is.
struct Check {
    last_sequence: u64,
    stored: usize,
    first_at: Option<u64>,
}

/// Every append of the group checked in one statement, with the position the group's
/// first stored commit takes. The appends travel as one JSON parameter, so the
/// statement's text is the same for every group and is prepared once.
const CHECK_GROUP: &str = "
SELECT CAST(c.key AS INTEGER),
       (SELECT COALESCE(MAX(e.sequence), 0) FROM events e
         WHERE e.aggregate_kind = json_extract(c.value, '$[0]')
           AND e.aggregate_id = json_extract(c.value, '$[1]')),
       (SELECT COUNT(*) FROM events e
         WHERE e.event_id IN (SELECT i.value FROM json_each(c.value, '$[2]') i)),
       (SELECT e.position FROM events e WHERE e.event_id = json_extract(c.value, '$[2][0]')),
       (SELECT COALESCE(MAX(position), 0) + 1 FROM events)
  FROM json_each(?) c";

async fn check_group(
    tx: &mut sqlx::SqliteConnection,
    group: &[Pending],
) -> Result<(u64, Vec<Check>), LogError> {
    let appends: Vec<serde_json::Value> = group
        .iter()
        .map(|p| {
            let ids: Vec<String> = p.events.iter().map(|e| e.event_id.to_string()).collect();
            serde_json::json!([p.aggregate.kind.as_str(), p.aggregate.id.to_string(), ids])
        })
        .collect();
    let rows = sqlx::query(CHECK_GROUP)
        .bind(serde_json::Value::Array(appends).to_string())
        .fetch_all(&mut *tx)
        .await
        .map_err(backend)?;
    let mut next = 1;
    let mut checks: Vec<Option<Check>> = group.iter().map(|_| None).collect();
    for row in rows {
        let at = row.get::<i64, _>(0) as usize;
        next = row.get::<i64, _>(4) as u64;
        if let Some(slot) = checks.get_mut(at) {
            *slot = Some(Check {
                last_sequence: row.get::<i64, _>(1) as u64,
                stored: row.get::<i64, _>(2) as usize,
                first_at: row.get::<Option<i64>, _>(3).map(|p| p as u64),
            });
        }
    }
    let checks = checks
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| LogError::Backend("the group's checks missed an append".into()))?;
    Ok((next, checks))
}

/// What the appends decided so far in this group store: what a later append of the same
/// group must see beside the file.
#[derive(Default)]
struct Decided {
    last_sequence: std::collections::HashMap<AggregateRef, u64>,
    stored_at: std::collections::HashMap<uuid::Uuid, u64>,
}

impl Decided {
    /// Whether `p` is stored at `position`, a duplicate, or refused (as it would be alone
    /// after the group's earlier appends).
    async fn decide(
        &mut self,
        tx: &mut sqlx::SqliteConnection,
        p: &Pending,
        check: Check,
        position: u64,
    ) -> Result<Appended, LogError> {
        let events = &p.events;
        // A batch's ids are distinct (`check_batch`), so counts of stored ids compare
        // with its length.
        let here = events
            .iter()
            .filter(|e| self.stored_at.contains_key(&e.event_id))
            .count();
        // A retry of an append that already landed is answered, not re-applied.
        if check.stored + here > 0 {
            let first = check
                .first_at
                .or_else(|| self.stored_at.get(&events[0].event_id).copied());
            if let Some(position) = first.filter(|_| check.stored + here == events.len()) {
                return Ok(Appended::Duplicate { position });
            }
            let mut which = events[0].event_id;
            for e in events {
                if self.stored_at.contains_key(&e.event_id)
                    || SqliteLog::position_of(tx, &e.event_id).await?.is_some()
                {
                    which = e.event_id;
                    break;
                }
            }
            return Err(LogError::InvalidAppend(format!(
                "event {which} is already stored but the rest of this batch is not"
            )));
        }
        let actual = self
            .last_sequence
            .get(&p.aggregate)
            .copied()
            .unwrap_or(check.last_sequence);
        if actual != p.expected {
            return Err(LogError::Conflict {
                aggregate: p.aggregate,
                expected: p.expected,
                actual,
            });
        }
        self.last_sequence
            .insert(p.aggregate, p.expected + events.len() as u64);
        self.stored_at
            .extend(events.iter().map(|e| (e.event_id, position)));
        Ok(Appended::Stored { position })
    }
}

/// One event row to insert.
struct EventRow<'a> {
    position: u64,
    idx: usize,
    event: &'a RawEnvelope,
    aggregate: &'a AggregateRef,
    text: &'a str,
}

/// Rows one insert statement writes at most (7 variables each, far under SQLite's
/// limit of 32,766).
const ROWS_PER_INSERT: usize = 64;

/// `(?, ?, …)` groups of `columns` variables, `rows` times, comma-separated.
fn placeholders(rows: usize, columns: usize) -> String {
    let row = format!("({})", vec!["?"; columns].join(", "));
    vec![row; rows].join(", ")
}

/// Inserts `rows` in statements of 64, 32, 16, … rows: a few statements whatever the
/// count, and few distinct texts for the connection's statement cache.
async fn insert_rows(
    tx: &mut sqlx::SqliteConnection,
    rows: &[EventRow<'_>],
) -> Result<(), LogError> {
    let mut rest = rows;
    while !rest.is_empty() {
        let take = if rest.len() >= ROWS_PER_INSERT {
            ROWS_PER_INSERT
        } else {
            1 << rest.len().ilog2()
        };
        let (chunk, after) = rest.split_at(take);
        rest = after;
        let insert = format!(
            "INSERT INTO events (position, idx, event_id, aggregate_kind, aggregate_id, sequence, envelope)
             VALUES {}",
            placeholders(chunk.len(), 7)
        );
        let mut query = sqlx::query(&insert);
        for row in chunk {
            query = query
                .bind(row.position as i64)
                .bind(row.idx as i64)
                .bind(row.event.event_id.to_string())
                .bind(row.aggregate.kind.as_str())
                .bind(row.aggregate.id.to_string())
                .bind(row.event.sequence as i64)
                .bind(row.text);
        }
        query.execute(&mut *tx).await.map_err(backend)?;
    }
    Ok(())
}

/// Rows of `(position, envelope)` in log order, as commits.
fn commits_of(rows: Vec<sqlx::sqlite::SqliteRow>) -> Result<Vec<Commit>, LogError> {
    Ok(
        by_position(rows, |position, row| decode(position, row.get(1)))?
            .into_iter()
            .map(|(position, events)| Commit::new(position, events))
            .collect(),
    )
}

/// Rows of `(position, envelope)` in log order, grouped by position, each envelope as
/// `read` takes it.
fn by_position<E>(
    rows: Vec<sqlx::sqlite::SqliteRow>,
    mut read: impl FnMut(u64, &sqlx::sqlite::SqliteRow) -> Result<E, LogError>,
) -> Result<Vec<(u64, Vec<E>)>, LogError> {
    let mut grouped: Vec<(u64, Vec<E>)> = Vec::new();
    for row in &rows {
        let position = row.get::<i64, _>(0) as u64;
        let envelope = read(position, row)?;
        match grouped.last_mut() {
            Some((p, events)) if *p == position => events.push(envelope),
            _ => grouped.push((position, vec![envelope])),
        }
    }
    Ok(grouped)
}

fn decode(position: u64, text: &str) -> Result<RawEnvelope, LogError> {
    serde_json::from_str(text).map_err(|e| LogError::Corrupt {
        position,
        message: e.to_string(),
    })
}

impl SqliteLog {
    /// Hands the writer `commit`, checked already, with `events` its events parsed.
    async fn append_checked(
        &self,
        commit: EncodedCommit,
        events: Vec<RawEnvelope>,
    ) -> Result<Appended, LogError> {
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            aggregate: commit.aggregate(),
            expected: commit.expected(),
            encoded: commit.into_texts(),
            events,
            reply,
        };
        self.inner.write(Write::Append(pending), answer).await
    }
}

#[async_trait]
impl EventLog for SqliteLog {
    async fn append(&self, events: Vec<RawEnvelope>) -> Result<Appended, LogError> {
        let commit = EncodedCommit::encode(&events)?;
        commit.fits()?;
        self.append_checked(commit, events).await
    }

    async fn append_encoded(&self, commit: EncodedCommit) -> Result<Appended, LogError> {
        commit.fits()?;
        // The parsed events are what the log's tail hands its readers from memory.
        let events = commit.decode()?;
        self.append_checked(commit, events).await
    }

    async fn read_aggregate(&self, aggregate: AggregateRef) -> Result<Vec<RawEnvelope>, LogError> {
        let rows = sqlx::query(
            "SELECT position, envelope FROM events WHERE aggregate_kind = ? AND aggregate_id = ? ORDER BY sequence",
        )
        .bind(aggregate.kind.as_str())
        .bind(aggregate.id.to_string())
        .fetch_all(&self.inner.pool)
        .await
        .map_err(backend)?;
        rows.iter()
            .map(|r| decode(r.get::<i64, _>(0) as u64, r.get(1)))
            .collect()
    }

    async fn read_from(&self, after: u64, max: usize) -> Result<Vec<Commit>, LogError> {
        let rows = self.page(after, max).await?;
        // A long read (a catch-up) is decoded off the caller's thread, so that the caller
        // can work on the last page meanwhile (a projection applying it, say).
        if rows.len() >= 64 {
            tokio::task::spawn_blocking(move || commits_of(rows))
                .await
                .map_err(|e| LogError::Backend(format!("decoding a page of the log: {e}")))?
        } else {
            commits_of(rows)
        }
    }

    async fn read_text_from(&self, after: u64, max: usize) -> Result<Vec<StoredCommit>, LogError> {
        let rows = self.page(after, max).await?;
        Ok(by_position(rows, |_, row| Ok(row.get::<String, _>(1)))?
            .into_iter()
            .map(|(position, events)| StoredCommit { position, events })
            .collect())
    }

    async fn head(&self) -> Result<u64, LogError> {
        let head: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(position), 0) FROM events")
            .fetch_one(&self.inner.pool)
            .await
            .map_err(backend)?;
        Ok(head as u64)
    }

    async fn subscribe(&self, name: &str) -> Result<Box<dyn Subscription>, LogError> {
        check_name(name)?;
        sqlx::query("INSERT OR IGNORE INTO subscriptions (name, position) VALUES (?, 0)")
            .bind(name)
            .execute(&self.inner.pool)
            .await
            .map_err(backend)?;
        let acked: i64 = sqlx::query_scalar("SELECT position FROM subscriptions WHERE name = ?")
            .bind(name)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(backend)?;
        Ok(Box::new(SqliteSubscription {
            log: self.clone(),
            name: Some(name.to_string()),
            delivered: acked as u64,
            idle_since: None,
        }))
    }

    async fn tail(&self, after: u64) -> Result<Box<dyn Subscription>, LogError> {
        Ok(Box::new(SqliteSubscription {
            log: self.clone(),
            name: None,
            delivered: after,
            idle_since: None,
        }))
    }

    async fn save_snapshot(&self, snapshot: Snapshot) -> Result<(), LogError> {
        check_name(&snapshot.name)?;
        // Rare (one per service every few thousand commits): straight from the pool,
        // waiting on the group writer's lock if it holds it.
        sqlx::query(
            "INSERT INTO snapshots (name, position, body) VALUES (?, ?, ?) \
             ON CONFLICT (name) DO UPDATE SET position = excluded.position, body = excluded.body \
             WHERE excluded.position > snapshots.position",
        )
        .bind(&snapshot.name)
        .bind(snapshot.position as i64)
        .bind(snapshot.body)
        .execute(&self.inner.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn load_snapshot(&self, name: &str) -> Result<Option<Snapshot>, LogError> {
        check_name(name)?;
        let row: Option<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT position, body FROM snapshots WHERE name = ?")
                .bind(name)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(backend)?;
        Ok(row.map(|(position, body)| Snapshot {
            name: name.to_string(),
            position: position as u64,
            body,
        }))
    }
}

struct SqliteSubscription {
    log: SqliteLog,
    /// None for a tail, which keeps no position.
    name: Option<String>,
    /// Position of the last commit handed out (acknowledged or not).
    delivered: u64,
    /// When a read of the file last found nothing new. Until `POLL_INTERVAL` later only
    /// this process's own appends (kept in memory, and announced) can be new, so the file
    /// is not read again before then: a caught-up subscription woken by each append would
    /// otherwise query the file every time, finding nothing the memory does not hold.
    idle_since: Option<tokio::time::Instant>,
}

#[async_trait]
impl Subscription for SqliteSubscription {
    async fn next(&mut self, max: usize, wait: Duration) -> Result<Vec<Commit>, LogError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Register for the wake-up before reading, so an append in between is not missed.
            let appended = self.log.inner.appended.notified();
            tokio::pin!(appended);
            appended.as_mut().enable();
            let now = tokio::time::Instant::now();
            let due = self.idle_since.map(|idle| idle + POLL_INTERVAL);
            let file_due = due.is_none_or(|due| now >= due);
            let (commits, read_file) = self
                .log
                .read_next(self.delivered, max.max(1), file_due)
                .await?;
            if read_file {
                self.idle_since = commits.is_empty().then_some(now);
            }
            if let Some(last) = commits.last() {
                self.delivered = last.position;
                return Ok(commits);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            // Woken by this process's next append, or when the file is due a look.
            let until_due = self.idle_since.map_or(POLL_INTERVAL, |idle| {
                (idle + POLL_INTERVAL).saturating_duration_since(now)
            });
            let nap = (deadline - now).min(until_due.max(Duration::from_millis(1)));
            let _ = tokio::time::timeout(nap, appended).await;
        }
    }

    async fn ack(&mut self, position: u64) -> Result<(), LogError> {
        let Some(name) = &self.name else {
            return Ok(());
        };
        let (reply, answer) = oneshot::channel();
        let ack = PendingAck {
            name: name.clone(),
            position,
            reply,
        };
        self.log.inner.write(Write::Ack(ack), answer).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(position: u64) -> Commit {
        Commit::new(position, Vec::new())
    }

    fn positions(commits: Option<Vec<Commit>>) -> Option<Vec<u64>> {
        commits.map(|c| c.iter().map(|c| c.position).collect())
    }

    /// What is kept has no hole, is bounded by size, and answers only for what it holds.
    #[test]
    fn recent_commits_are_kept_without_a_hole_and_within_their_bound() {
        let mut recent = Recent::default();
        assert_eq!(positions(recent.after(0, 10)), None);
        for p in 5..=8 {
            recent.push(commit(p), 10);
        }
        assert_eq!(positions(recent.after(4, 10)), Some(vec![5, 6, 7, 8]));
        assert_eq!(positions(recent.after(6, 1)), Some(vec![7]));
        assert_eq!(positions(recent.after(3, 10)), None, "6 is older than kept");
        assert_eq!(positions(recent.after(8, 10)), None, "nothing newer kept");
        // Position 9 was written by another process.
        recent.push(commit(10), 10);
        assert_eq!(positions(recent.after(8, 10)), None);
        assert_eq!(positions(recent.after(9, 10)), Some(vec![10]));
        assert_eq!(recent.bytes, 10);
        // Over the bound, the oldest go first.
        recent.push(commit(11), RECENT_BYTES - 5);
        recent.push(commit(12), 10);
        assert_eq!(positions(recent.after(9, 10)), None);
        assert_eq!(positions(recent.after(11, 10)), Some(vec![12]));
        assert_eq!(recent.bytes, 10);
    }

    /// An append checks everything before it writes: a retry of which only a part is
    /// stored is refused, naming the stored event, and leaves the log as it was; good
    /// appends waiting in the same group beside refused ones are stored.
    #[tokio::test]
    async fn refused_appends_write_nothing_and_spare_their_group() {
        use crate::conformance::{event, workflow};
        use serde_json::json;
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(&dir.path().join("events.sqlite"))
            .await
            .unwrap();
        let a = workflow();
        let first = event(a, 1, json!("first"));
        log.append(vec![first.clone()]).await.unwrap();
        let mut again = first.clone();
        again.sequence = 3;
        let refused = log.append(vec![event(a, 2, json!("new")), again]).await;
        match refused {
            Err(LogError::InvalidAppend(message)) => {
                assert!(message.contains(&first.event_id.to_string()), "{message}")
            }
            other => panic!("expected InvalidAppend, got {other:?}"),
        }
        // A batch naming one event twice is refused before it reaches the writer.
        let mut twice = first.clone();
        twice.sequence = 2;
        match log.append(vec![first.clone(), twice]).await {
            Err(LogError::InvalidAppend(message)) => {
                assert!(message.contains("twice"), "{message}")
            }
            other => panic!("expected InvalidAppend, got {other:?}"),
        }
        assert_eq!(log.head().await.unwrap(), 1);
        assert_eq!(log.read_aggregate(a).await.unwrap(), vec![first]);

        // Several appends at once through one handle are written as one group: the
        // stale ones are refused, the others stored at dense positions.
        let appends = (0..24).map(|i| {
            let log = log.clone();
            let aggregate = if i % 3 == 0 { a } else { workflow() };
            async move { log.append(vec![event(aggregate, 1, json!(i))]).await }
        });
        let outcomes = futures::future::join_all(appends).await;
        let stored = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(Appended::Stored { .. })))
            .count();
        let conflicts = outcomes
            .iter()
            .filter(|o| matches!(o, Err(LogError::Conflict { .. })))
            .count();
        assert_eq!((stored, conflicts), (16, 8));
        let commits = log.read_from(0, 100).await.unwrap();
        let positions: Vec<u64> = commits.iter().map(|c| c.position).collect();
        assert_eq!(positions, (1..=17).collect::<Vec<u64>>());
    }

    /// Appends written in one group are decided in order, each seeing what the group's
    /// earlier appends store: a follow-up to an aggregate made in the same group is
    /// stored, a second writer to it conflicts, a retry of a batch stored in the same
    /// group is its duplicate, and one overlapping it in part is refused.
    #[tokio::test]
    async fn a_group_sees_its_own_earlier_appends() {
        use crate::conformance::{event, workflow};
        use serde_json::json;
        let dir = tempfile::tempdir().unwrap();
        let log = SqliteLog::open(&dir.path().join("events.sqlite"))
            .await
            .unwrap();
        let (a, b) = (workflow(), workflow());
        let made = vec![event(a, 1, json!("made"))];
        let follow_up = vec![event(a, 2, json!("follow-up"))];
        let rival = vec![event(a, 2, json!("rival"))];
        let pair = vec![event(b, 1, json!("one")), event(b, 2, json!("two"))];
        let retry = pair.clone();
        let overlap = vec![pair[1].clone(), event(b, 3, json!("three"))];
        let batches = [made, follow_up, rival, pair, retry, overlap];
        // Joined, they are queued before the writer runs: one group.
        let outcomes = futures::future::join_all(batches.iter().map(|batch| {
            let log = log.clone();
            let batch = batch.clone();
            async move { log.append(batch).await }
        }))
        .await;
        let summary: Vec<String> = outcomes
            .iter()
            .map(|o| match o {
                Ok(Appended::Stored { position }) => format!("stored at {position}"),
                Ok(Appended::Duplicate { position }) => format!("duplicate of {position}"),
                Err(LogError::Conflict { actual, .. }) => format!("conflict at {actual}"),
                Err(LogError::InvalidAppend(m)) => format!("invalid: {m}"),
                Err(e) => format!("error: {e}"),
            })
            .collect();
        assert_eq!(
            summary[..5],
            [
                "stored at 1",
                "stored at 2",
                "conflict at 2",
                "stored at 3",
                "duplicate of 3",
            ],
            "{summary:?}"
        );
        assert!(
            summary[5].contains(&batches[3][1].event_id.to_string()),
            "the overlap names the stored event: {summary:?}"
        );
        assert_eq!(log.head().await.unwrap(), 3);
        let payloads = |events: Vec<RawEnvelope>| -> Vec<serde_json::Value> {
            events.into_iter().map(|e| e.payload).collect()
        };
        assert_eq!(
            payloads(log.read_aggregate(a).await.unwrap()),
            [json!("made"), json!("follow-up")]
        );
        assert_eq!(
            payloads(log.read_aggregate(b).await.unwrap()),
            [json!("one"), json!("two")]
        );
    }

    /// A caught-up subscription is handed this process's appends from memory, and reads
    /// the file again only when another process's commits could be there (every 200 ms,
    /// or when the commits kept in memory start past it).
    #[tokio::test]
    async fn a_caught_up_subscription_does_not_read_the_file_for_its_own_appends() {
        use crate::conformance::{event, workflow};
        use serde_json::json;
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.sqlite");
        let log = SqliteLog::open(&path).await.unwrap();
        let mut tail = log.tail(0).await.unwrap();
        assert!(tail.next(10, Duration::ZERO).await.unwrap().is_empty());
        let reads = || log.inner.file_reads.load(Ordering::Relaxed);
        assert_eq!(reads(), 1, "the first look is at the file");
        for i in 0..50 {
            log.append(vec![event(workflow(), 1, json!(i))])
                .await
                .unwrap();
            let commits = tail.next(10, Duration::from_secs(5)).await.unwrap();
            assert_eq!(commits.len(), 1);
            assert!(tail.next(10, Duration::ZERO).await.unwrap().is_empty());
        }
        // One read a 200 ms at most: far fewer than the 100 looks above.
        assert!(reads() < 10, "{} reads of the file", reads());

        // Another process's commit, then one of this process: what is kept starts past
        // the other's, so the file is read at once and both come, in order.
        let other = SqliteLog::open(&path).await.unwrap();
        other
            .append(vec![event(workflow(), 1, json!("other"))])
            .await
            .unwrap();
        log.append(vec![event(workflow(), 1, json!("own"))])
            .await
            .unwrap();
        let commits = tail.next(10, Duration::from_secs(5)).await.unwrap();
        let payloads: Vec<&serde_json::Value> =
            commits.iter().map(|c| &c.events[0].payload).collect();
        assert_eq!(payloads, [&json!("other"), &json!("own")]);
    }
}
