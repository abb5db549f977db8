//! The projection runner against real databases (a SQLite file and the machine's
//! PostgreSQL) and a real SQLite event log.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use meridian_eventlog::conformance::{event, workflow};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::{Commit, EventLog};
use meridian_events::AggregateRef;
use meridian_store::{
    catch_up, move_position, position_in, run, Projection, Store, StoreError, Tx,
};
use serde_json::json;
use sqlx::Row;

/// Counts events per aggregate; a double-applied commit would show as a wrong count.
struct Counts;

#[async_trait]
impl Projection for Counts {
    fn name(&self) -> &'static str {
        "counts"
    }
    fn schema(&self) -> &'static [&'static str] {
        &["CREATE TABLE IF NOT EXISTS counts (aggregate TEXT PRIMARY KEY, n BIGINT NOT NULL)"]
    }
    fn tables(&self) -> &'static [&'static str] {
        &["counts"]
    }
    async fn apply(&self, tx: &mut Tx, commit: &Commit) -> Result<(), StoreError> {
        for e in commit.events.iter() {
            sqlx::query(
                "INSERT INTO counts (aggregate, n) VALUES ($1, 1)
                 ON CONFLICT (aggregate) DO UPDATE SET n = counts.n + 1",
            )
            .bind(e.aggregate.to_string())
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }
}

async fn counts(store: &Store) -> Vec<(String, i64)> {
    sqlx::query("SELECT aggregate, n FROM counts ORDER BY aggregate")
        .fetch_all(store.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1)))
        .collect()
}

/// Waits until the projection's position is `head` (the deadline only turns a hang
/// into a failure).
async fn reached(store: &Store, head: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.position("counts").await.unwrap() != head {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runners never reached {head}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A SQLite log holding `commits` one-event commits of one workflow.
async fn log_of(commits: u64) -> (tempfile::TempDir, Arc<dyn EventLog>, AggregateRef) {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let a = workflow();
    for s in 1..=commits {
        log.append(vec![event(a, s, json!(s))]).await.unwrap();
    }
    (dir, log, a)
}

/// A fresh PostgreSQL database (its URL, to drop it) and a store on it.
async fn postgres() -> (String, Store) {
    let url = meridian_store::testing::fresh_postgres()
        .await
        .expect("a PostgreSQL server (set MERIDIAN_TEST_POSTGRES)");
    let store = Store::connect(&url).await.unwrap();
    (url, store)
}

async fn scenario(store: Store) {
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> =
        Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
    let (a, b) = (workflow(), workflow());
    for s in 1..=3 {
        log.append(vec![event(a, s, json!(s))]).await.unwrap();
    }
    log.append(vec![event(b, 1, json!(1)), event(b, 2, json!(2))])
        .await
        .unwrap();

    let head = log.head().await.unwrap();
    assert_eq!(catch_up(&store, &*log, &Counts).await.unwrap(), head);
    let expected = {
        let mut v = vec![(a.to_string(), 3), (b.to_string(), 2)];
        v.sort();
        v
    };
    assert_eq!(counts(&store).await, expected);
    // Catching up again (a restart) applies nothing twice.
    catch_up(&store, &*log, &Counts).await.unwrap();
    assert_eq!(counts(&store).await, expected);
    assert_eq!(store.position("counts").await.unwrap(), head);

    // The runner follows live appends and stops when told.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = {
        let (store, log) = (store.clone(), log.clone());
        tokio::spawn(async move { run(store, &*log, &Counts, stopped).await })
    };
    log.append(vec![event(a, 4, json!(4))]).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while counts(&store)
        .await
        .iter()
        .find(|(k, _)| *k == a.to_string())
        .unwrap()
        .1
        != 4
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runner applies live commits"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();
    runner.await.unwrap().unwrap();

    // Two runners of the projection at once (replicas), each applying from the position
    // it knows: whichever finds the position moved applies nothing, so each commit
    // still counts once.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runners: Vec<_> = (0..2)
        .map(|_| {
            let (store, log, stopped) = (store.clone(), log.clone(), stopped.clone());
            tokio::spawn(async move { run(store, &*log, &Counts, stopped).await })
        })
        .collect();
    for s in 5..=24 {
        log.append(vec![event(a, s, json!(s))]).await.unwrap();
    }
    reached(&store, log.head().await.unwrap()).await;
    stop.send(true).unwrap();
    for runner in runners {
        runner.await.unwrap().unwrap();
    }
    let n = |counts: Vec<(String, i64)>| counts.into_iter().find(|(k, _)| *k == a.to_string());
    assert_eq!(n(counts(&store).await), Some((a.to_string(), 24)));

    // A rebuild from the log yields the same rows.
    let before = counts(&store).await;
    store.reset(&Counts).await.unwrap();
    assert_eq!(store.position("counts").await.unwrap(), 0);
    catch_up(&store, &*log, &Counts).await.unwrap();
    assert_eq!(counts(&store).await, before);
}

#[tokio::test]
async fn sqlite_store_applies_each_commit_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("read.sqlite").display());
    scenario(Store::connect(&url).await.unwrap()).await;
}

#[tokio::test]
async fn postgres_store_applies_each_commit_once() {
    let url = meridian_store::testing::fresh_postgres()
        .await
        .expect("a PostgreSQL server (set MERIDIAN_TEST_POSTGRES)");
    scenario(Store::connect(&url).await.unwrap()).await;
    meridian_store::testing::drop_postgres(&url).await;
}

/// A runner left up while its projection is reset (a rebuild about to begin) does not
/// carry its old position over the emptied tables: its next batch finds the position
/// gone, and it follows the log again from the start. (It used to write its batch and
/// position over the empty tables, and everything before them was never applied.)
async fn a_runner_beside_a_reset_starts_again_from_the_beginning(store: Store) {
    let (_dir, log, a) = log_of(30).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = {
        let (store, log) = (store.clone(), log.clone());
        tokio::spawn(async move { run(store, &*log, &Counts, stopped).await })
    };
    reached(&store, log.head().await.unwrap()).await;
    store.reset(&Counts).await.unwrap();
    store.migrate(Counts.schema()).await.unwrap();
    log.append(vec![event(a, 31, json!(31))]).await.unwrap();
    reached(&store, log.head().await.unwrap()).await;
    stop.send(true).unwrap();
    runner.await.unwrap().unwrap();
    assert_eq!(counts(&store).await, vec![(a.to_string(), 31)]);
}

#[tokio::test]
async fn sqlite_a_runner_beside_a_reset_starts_again_from_the_beginning() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("read.sqlite").display());
    a_runner_beside_a_reset_starts_again_from_the_beginning(Store::connect(&url).await.unwrap())
        .await;
}

#[tokio::test]
async fn postgres_a_runner_beside_a_reset_starts_again_from_the_beginning() {
    let (url, store) = postgres().await;
    a_runner_beside_a_reset_starts_again_from_the_beginning(store).await;
    meridian_store::testing::drop_postgres(&url).await;
}

/// What another writer of the projection does, on its own connection, just before
/// one of [`Rivalled`]'s batches is applied.
enum Rival {
    /// A replica ahead: before each of the first `n` batches, it applies the batch's
    /// first commit and moves the position, so the batch's compare-and-set fails.
    MovesAhead { n: u32 },
    /// A rebuild beginning under the first batch: it resets the projection and
    /// applies the log's first `rebuilt` commits.
    ResetsUnder {
        log: Arc<dyn EventLog>,
        rebuilt: usize,
    },
    /// A rebuild beside a projection that keeps totals the way the ledger does (it
    /// reads the count, then writes the count plus the batch): under the first batch it
    /// resets the projection and applies the log's first 3 commits before the read,
    /// and a page up to `page_end` between the read and the write.
    PagesUnderARead {
        log: Arc<dyn EventLog>,
        page_end: u64,
    },
}

/// [`Counts`], with a [`Rival`] writing beside it.
struct Rivalled {
    store: Store,
    rival: Rival,
    /// Batches the rival went before.
    went: AtomicU32,
}

impl Rivalled {
    async fn rival_goes(&self, commits: &[Commit]) -> Result<(), StoreError> {
        let rival = match &self.rival {
            Rival::MovesAhead { n } if self.went.load(Ordering::SeqCst) < *n => {
                let mut rival = self.store.begin().await?;
                let from = position_in(&mut rival, self.name()).await?;
                Counts.apply(&mut rival, &commits[0]).await?;
                assert!(move_position(&mut rival, self.name(), from, commits[0].position).await?);
                rival
            }
            Rival::ResetsUnder { log, rebuilt } if self.went.load(Ordering::SeqCst) == 0 => {
                self.store.reset(&Counts).await?;
                self.store.migrate(Counts.schema()).await?;
                let first = log.read_from(0, *rebuilt).await?;
                let mut rival = self.store.begin().await?;
                for commit in &first {
                    Counts.apply(&mut rival, commit).await?;
                }
                let end = first.last().unwrap().position;
                assert!(move_position(&mut rival, self.name(), 0, end).await?);
                rival
            }
            _ => return Ok(()),
        };
        rival.commit().await?;
        self.went.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[async_trait]
impl Projection for Rivalled {
    fn name(&self) -> &'static str {
        Counts.name()
    }
    fn schema(&self) -> &'static [&'static str] {
        Counts.schema()
    }
    fn tables(&self) -> &'static [&'static str] {
        Counts.tables()
    }
    async fn apply(&self, tx: &mut Tx, commit: &Commit) -> Result<(), StoreError> {
        Counts.apply(tx, commit).await
    }
    async fn apply_all(&self, tx: &mut Tx, commits: &[Commit]) -> Result<(), StoreError> {
        if let Rival::PagesUnderARead { log, page_end } = &self.rival {
            return self.read_then_write(tx, commits, &**log, *page_end).await;
        }
        self.rival_goes(commits).await?;
        for commit in commits {
            Counts.apply(tx, commit).await?;
        }
        Ok(())
    }
}

impl Rivalled {
    /// [`Rival::PagesUnderARead`].
    async fn read_then_write(
        &self,
        tx: &mut Tx,
        commits: &[Commit],
        log: &dyn EventLog,
        page_end: u64,
    ) -> Result<(), StoreError> {
        let rival = self.went.load(Ordering::SeqCst) == 0;
        if rival {
            self.store.reset(&Counts).await?;
            self.store.migrate(Counts.schema()).await?;
            self.page(log, 0, 3).await?;
        }
        let aggregate = commits[0].events[0].aggregate.to_string();
        let read: Option<i64> = sqlx::query("SELECT n FROM counts WHERE aggregate = $1")
            .bind(&aggregate)
            .fetch_optional(&mut **tx)
            .await?
            .map(|r| r.get(0));
        if rival {
            self.page(log, 3, page_end).await?;
            self.went.fetch_add(1, Ordering::SeqCst);
        }
        sqlx::query(
            "INSERT INTO counts (aggregate, n) VALUES ($1, $2)
             ON CONFLICT (aggregate) DO UPDATE SET n = excluded.n",
        )
        .bind(&aggregate)
        .bind(read.unwrap_or(0) + commits.len() as i64)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// A rebuild's page: the log's commits after `after` up to `to`, and the position.
    async fn page(&self, log: &dyn EventLog, after: u64, to: u64) -> Result<(), StoreError> {
        let mut rival = self.store.begin().await?;
        for commit in log.read_from(after, (to - after) as usize).await? {
            Counts.apply(&mut rival, &commit).await?;
        }
        assert!(move_position(&mut rival, "counts", after, to).await?);
        rival.commit().await?;
        Ok(())
    }
}

/// A writer whose position another writer keeps moving goes on until it gets its
/// turn: each move is the other's progress, not a reason to stop. (It stopped after
/// 8 attempts, and a follower left up beside a rebuild in small pages met that.)
/// PostgreSQL only: its transactions take no lock before they write, which is what
/// lets the rival commit
/// in the middle of the batch.
#[tokio::test]
async fn postgres_a_batch_whose_position_keeps_moving_is_applied_once_in_the_end() {
    let (url, store) = postgres().await;
    let (_dir, log, a) = log_of(30).await;
    let raced = Rivalled {
        store: store.clone(),
        rival: Rival::MovesAhead { n: 20 },
        went: AtomicU32::new(0),
    };
    let head = log.head().await.unwrap();
    assert_eq!(catch_up(&store, &*log, &raced).await.unwrap(), head);
    assert_eq!(
        raced.went.load(Ordering::SeqCst),
        20,
        "the rival moved 20 times"
    );
    assert_eq!(counts(&store).await, vec![(a.to_string(), 30)]);
    assert_eq!(store.position("counts").await.unwrap(), head);
    meridian_store::testing::drop_postgres(&url).await;
}

/// A batch read after a position that a rebuild has not reached yet is not applied over
/// the rebuild's gap: the runner reads again from where the rebuild is. (It applied
/// the batch and moved the position over the commits in between.) PostgreSQL only, as
/// for the one above.
#[tokio::test]
async fn postgres_a_batch_ahead_of_a_rebuild_is_not_applied_over_its_gap() {
    let (url, store) = postgres().await;
    let (_dir, log, a) = log_of(30).await;
    catch_up(&store, &*log, &Counts).await.unwrap();
    for s in 31..=40 {
        log.append(vec![event(a, s, json!(s))]).await.unwrap();
    }
    let under = Rivalled {
        store: store.clone(),
        rival: Rival::ResetsUnder {
            log: log.clone(),
            rebuilt: 3,
        },
        went: AtomicU32::new(0),
    };
    let head = log.head().await.unwrap();
    assert_eq!(catch_up(&store, &*log, &under).await.unwrap(), head);
    assert_eq!(
        under.went.load(Ordering::SeqCst),
        1,
        "the rebuild went first"
    );
    assert_eq!(counts(&store).await, vec![(a.to_string(), 40)]);
    meridian_store::testing::drop_postgres(&url).await;
}

/// A batch that read totals before a rebuild's page landed is not written over the
/// page. The page ends where the batch expects the position to be, so the
/// compare-and-set alone passes; the batch's snapshot sees that the rows it writes
/// changed after its read, and it is applied again on top of the page. (It wrote the
/// totals without the page: 13 instead of 40.) PostgreSQL only: SQLite's writers take
/// the write lock at the start, so no page can land in the middle of a batch.
#[tokio::test]
async fn postgres_a_batch_that_read_before_a_rebuilds_page_is_applied_again_after_it() {
    let (url, store) = postgres().await;
    let (_dir, log, a) = log_of(30).await;
    catch_up(&store, &*log, &Counts).await.unwrap();
    let page_end = store.position("counts").await.unwrap();
    for s in 31..=40 {
        log.append(vec![event(a, s, json!(s))]).await.unwrap();
    }
    let raced = Rivalled {
        store: store.clone(),
        rival: Rival::PagesUnderARead {
            log: log.clone(),
            page_end,
        },
        went: AtomicU32::new(0),
    };
    let head = log.head().await.unwrap();
    assert_eq!(catch_up(&store, &*log, &raced).await.unwrap(), head);
    assert_eq!(raced.went.load(Ordering::SeqCst), 1, "the rebuild went");
    assert_eq!(counts(&store).await, vec![(a.to_string(), 40)]);
    meridian_store::testing::drop_postgres(&url).await;
}

/// Two tables, dropped in the order a writer of the projection does not take them.
struct Pair;

#[async_trait]
impl Projection for Pair {
    fn name(&self) -> &'static str {
        "pair"
    }
    fn schema(&self) -> &'static [&'static str] {
        &[
            "CREATE TABLE IF NOT EXISTS pair_first (n BIGINT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS pair_second (n BIGINT NOT NULL)",
        ]
    }
    fn tables(&self) -> &'static [&'static str] {
        &["pair_first", "pair_second"]
    }
    async fn apply(&self, _tx: &mut Tx, _commit: &Commit) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A reset that meets a writer taking the tables' locks in the other order (as a ledger
/// consumer left up during a rebuild does) is not lost to the deadlock: PostgreSQL
/// aborts the reset, which waited first, and the reset goes again once the writer is
/// done. (It failed with "deadlock detected".)
#[tokio::test]
async fn postgres_a_reset_that_meets_a_writer_in_the_other_order_goes_again() {
    let (url, store) = postgres().await;
    store.migrate(Pair.schema()).await.unwrap();
    let mut writer = store.begin().await.unwrap();
    sqlx::query("INSERT INTO pair_second (n) VALUES (1)")
        .execute(&mut *writer)
        .await
        .unwrap();
    let resetting = tokio::spawn({
        let store = store.clone();
        async move { store.reset(&Pair).await }
    });
    // The reset holds the first table and waits for the second.
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlx::query("INSERT INTO pair_first (n) VALUES (1)")
        .execute(&mut *writer)
        .await
        .expect("the reset, not the writer, is the deadlock's victim");
    writer.commit().await.unwrap();
    resetting.await.unwrap().expect("the reset goes again");
    assert!(!store.has_table("pair_first").await.unwrap());
    assert!(!store.has_table("pair_second").await.unwrap());
    meridian_store::testing::drop_postgres(&url).await;
}

#[tokio::test]
async fn a_bad_url_is_refused_with_a_message() {
    match Store::connect("mysql://x").await {
        Err(StoreError::UnsupportedUrl(u)) => assert_eq!(u, "mysql://x"),
        Err(other) => panic!("expected UnsupportedUrl, got {other}"),
        Ok(_) => panic!("expected UnsupportedUrl"),
    }
}
