//! Restart time on a long history: how long the router, a site runner and the data
//! mover take to fold what they need from an SQLite log of `--events N` events
//! (1,000,000 by default) before they serve, without a snapshot (the whole log) and
//! from snapshots with `--tail` commits (10,000 by default, about what a running
//! service leaves between two snapshots) appended after them.
//!
//! ```text
//! cargo bench -p meridian --bench restart -- [--events 10000000] [--tail 10000]
//! ```
//! The history is `meridian_accounting::synthetic` (sites, workflows, jobs at HPC,
//! Kubernetes and cloud sites, transfers, tenants), written straight into the log's
//! table. Beside it, in the same run: reading and decoding the whole log alone, what
//! any fold of the whole log costs at least. Prints Markdown table rows.

use std::path::Path;
use std::time::{Duration, Instant};

use meridian_accounting::synthetic::{self, Generator};
use meridian_datamover::MoverStart;
use meridian_domain::Catalog;
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_router::RouterStart;
use meridian_site_runner::OpenJobs;

fn number(name: &str, default: u64) -> u64 {
    let mut args = std::env::args().skip_while(|a| a != name).skip(1);
    args.next()
        .map(|v| {
            v.replace('_', "")
                .parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

/// Every fold a restart of the three services does, timed one after the other.
struct Restart {
    router: (Duration, u64),
    site: (Duration, u64),
    mover: (Duration, u64),
    catalog: (Duration, u64),
}

impl Restart {
    /// The site runner's fold is of the site with the most runs.
    async fn measure(log: &dyn EventLog, save_after: u64) -> Restart {
        let t = Instant::now();
        let router = RouterStart::load(log, save_after).await.expect("router");
        let site = busiest_site(&router.catalog);
        let router = (t.elapsed(), router.read);
        let t = Instant::now();
        let open = OpenJobs::load(log, &site, save_after).await.expect("site");
        let site = (t.elapsed(), open.read);
        let t = Instant::now();
        let mover = MoverStart::load(log, save_after).await.expect("mover");
        let mover = (t.elapsed(), mover.read);
        // What the site runner and the data mover load besides (its own snapshot, saved
        // once it reads 10,000 commits or more).
        let before = log
            .load_snapshot(meridian_domain::catalog::SNAPSHOT)
            .await
            .unwrap()
            .map_or(0, |s| s.position);
        let t = Instant::now();
        let catalog = Catalog::load(log).await.expect("catalogue");
        let catalog = (t.elapsed(), catalog.position() - before);
        Restart {
            router,
            site,
            mover,
            catalog,
        }
    }

    fn rows(&self, events: u64, how: &str) {
        let row = |what: &str, (took, read): (Duration, u64)| {
            println!(
                "| {what}, {how} | {events} | {read} | {:.3} |",
                took.as_secs_f64()
            )
        };
        row("router", self.router);
        row("site runner (open jobs)", self.site);
        row("data mover", self.mover);
        row("catalogue (site runner, data mover)", self.catalog);
    }
}

fn busiest_site(catalog: &Catalog) -> String {
    catalog
        .sites
        .values()
        .max_by_key(|s| s.runs)
        .map(|s| s.name.clone())
        .expect("the history has sites")
}

/// The size of each snapshot, as stored.
async fn sizes(log: &dyn EventLog) {
    let site = busiest_site(&Catalog::load(log).await.unwrap());
    for name in [
        meridian_router::SNAPSHOT.to_string(),
        OpenJobs::snapshot_name(&site).unwrap_or_default(),
        meridian_datamover::SNAPSHOT.to_string(),
        meridian_domain::catalog::SNAPSHOT.to_string(),
    ] {
        if let Ok(Some(s)) = log.load_snapshot(&name).await {
            println!(
                "| snapshot `{name}`: {} bytes at position {} |",
                s.body.len(),
                s.position
            );
        }
    }
}

async fn read_and_decode(log: &dyn EventLog) -> Duration {
    let t = Instant::now();
    let mut after = 0;
    loop {
        let commits = log.read_from(after, 512).await.unwrap();
        let Some(last) = commits.last() else { break };
        after = last.position;
        for e in commits.iter().flat_map(|c| c.events.iter()) {
            std::hint::black_box(e.decode_event().unwrap());
        }
    }
    t.elapsed()
}

#[tokio::main]
async fn main() {
    let events = number("--events", 1_000_000);
    let tail = number("--tail", 10_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.sqlite");
    let mut generator = Generator::new(42);
    let t = Instant::now();
    let (commits, written) = write(&path, &mut generator, |_, n| n >= events).await;
    eprintln!(
        "wrote {written} events in {commits} commits in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let log = SqliteLog::open(&path).await.unwrap();
    println!("| what | events in the log | commits read | seconds |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| read and decode the whole log alone | {written} | {commits} | {:.3} |",
        read_and_decode(&log).await.as_secs_f64()
    );
    // No snapshot: every fold reads the whole log, and saves a snapshot at its end.
    Restart::measure(&log, 1).await.rows(written, "no snapshot");
    // The services run on: `tail` more commits come, then a restart.
    let mut left = tail;
    let (_, more) = write(&path, &mut generator, |_, _| {
        left = left.saturating_sub(1);
        left == 0
    })
    .await;
    Restart::measure(&log, u64::MAX)
        .await
        .rows(written + more, &format!("snapshot {tail} commits behind"));
    sizes(&log).await;
}

async fn write(
    path: &Path,
    generator: &mut Generator,
    enough: impl FnMut(&Generator, u64) -> bool,
) -> (u64, u64) {
    synthetic::write_sqlite_log(path, generator, enough)
        .await
        .expect("write the synthetic log")
}
