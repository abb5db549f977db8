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
    catalog: Duration,
}

impl Restart {
    async fn measure(log: &dyn EventLog, site: &str, save_after: u64) -> Restart {
        let t = Instant::now();
        let router = RouterStart::load(log, save_after).await.expect("router");
        let router = (t.elapsed(), router.read);
        let t = Instant::now();
        let open = OpenJobs::load(log, site, save_after).await.expect("site");
        let site = (t.elapsed(), open.read);
        let t = Instant::now();
        let mover = MoverStart::load(log, save_after).await.expect("mover");
        let mover = (t.elapsed(), mover.read);
        // What the site runner and the data mover load besides (its own snapshot).
        let t = Instant::now();
        Catalog::load(log).await.expect("catalogue");
        Restart {
            router,
            site,
            mover,
            catalog: t.elapsed(),
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
        println!(
            "| catalogue (site runner, data mover), {how} | {events} | – | {:.3} |",
            self.catalog.as_secs_f64()
        );
    }
}

async fn read_and_decode(log: &dyn EventLog) -> Duration {
    let t = Instant::now();
    let mut after = 0;
    loop {
        let commits = log.read_from(after, 512).await.unwrap();
        let Some(last) = commits.last() else { break };
        after = last.position;
        for e in commits.into_iter().flat_map(|c| c.events) {
            std::hint::black_box(e.decode::<meridian_events::Event>().unwrap());
        }
    }
    t.elapsed()
}

async fn busiest_site(log: &dyn EventLog) -> String {
    let catalog = Catalog::load(log).await.unwrap();
    catalog
        .sites
        .values()
        .max_by_key(|s| s.runs)
        .map(|s| s.name.clone())
        .expect("the history has sites")
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
    let site = busiest_site(&log).await;
    println!("| what | events in the log | commits read | seconds |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| read and decode the whole log alone | {written} | {commits} | {:.3} |",
        read_and_decode(&log).await.as_secs_f64()
    );
    // No snapshot: every fold reads the whole log, and saves a snapshot at its end.
    Restart::measure(&log, &site, 1)
        .await
        .rows(written, "no snapshot");
    // The services run on: `tail` more commits come, then a restart.
    let mut left = tail;
    let (_, more) = write(&path, &mut generator, |_, _| {
        left = left.saturating_sub(1);
        left == 0
    })
    .await;
    Restart::measure(&log, &site, u64::MAX)
        .await
        .rows(written + more, &format!("snapshot {tail} commits behind"));
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
