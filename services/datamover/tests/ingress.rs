//! The data mover with the router over a real SQLite log: a volume's ingress from a
//! `file://` path and from a real HTTP server lands in the volume's directory before the
//! job that mounts it is dispatched; a missing object fails the workflow with its name;
//! a site the mover cannot write to is refused with that reason; a copy under way when
//! the mover stopped is finished under the same transfer; outputs are copied out before
//! the workflow finishes, billed at the site's egress price.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use meridian_datamover::DataMover;
use meridian_eventlog::aggregates::{decode_all, execute, load};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{
    Site, SiteCommand, Transfer, TransferCommand, Workflow, WorkflowState,
};
use meridian_events::vocabulary::Endpoint;
use meridian_events::{
    ComputeOffer, ComputePricing, Currency, Envelope, Event, EventContext, JobEvent, PriceSheet,
    SiteKind, TransferEvent, WorkflowEvent,
};
use rust_decimal::Decimal;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use uuid::Uuid;

struct Bench {
    log: Arc<dyn EventLog>,
    dir: tempfile::TempDir,
    stop: watch::Sender<bool>,
    http: String,
}

impl Bench {
    /// A log with sites `local` (which the mover reaches) and `far` (which it does not),
    /// the router, and an HTTP server that serves `/x.csv`.
    async fn new() -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> =
            Arc::new(SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap());
        register(&*log, "local", "1").await;
        register(&*log, "far", "0.5").await;
        let (stop, stopped) = watch::channel(false);
        let router_log = log.clone();
        let router_stop = stopped.clone();
        tokio::spawn(async move {
            meridian_router::Router::new(router_log)
                .await
                .unwrap()
                .run(router_stop)
                .await
                .unwrap();
        });
        let http = serve_http().await;
        Bench {
            log,
            dir,
            stop,
            http,
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("volumes")
    }

    fn mover(&self) -> tokio::task::JoinHandle<()> {
        let roots = BTreeMap::from([("local".to_string(), self.root())]);
        let mover = DataMover::new(self.log.clone(), roots)
            .with_retry_after(Duration::from_millis(50))
            .with_progress_every(Duration::from_millis(50));
        let stopped = self.stop.subscribe();
        tokio::spawn(async move { mover.run(stopped).await.unwrap() })
    }

    async fn submit(&self, yaml: &str) -> Uuid {
        meridian_eventlog::testkit::submit(&*self.log, yaml).await.0
    }

    /// Every event so far, with its log position.
    async fn events(&self) -> Vec<(u64, Envelope<Event>)> {
        let mut out = Vec::new();
        for commit in self.log.read_from(0, 100_000).await.unwrap() {
            for e in decode_all(commit.events.to_vec()).unwrap() {
                out.push((commit.position, e));
            }
        }
        out
    }

    async fn wait_for<T>(&self, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {:#?}",
                self.events()
                    .await
                    .iter()
                    .map(|(_, e)| e.payload.kind())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn register(log: &dyn EventLog, name: &str, core_hour: &str) {
    let prices = PriceSheet {
        currency: Currency::USD,
        effective_from: Utc::now() - chrono::Duration::days(1),
        source: "test".into(),
        compute: vec![ComputeOffer {
            offer: "node".into(),
            pricing: ComputePricing::Resource {
                per_core_hour: core_hour.parse().unwrap(),
                per_gib_memory_hour: Decimal::ZERO,
                per_gpu_hour: Decimal::ZERO,
            },
        }],
        storage_per_gib_hour: Decimal::ZERO,
        egress_per_gb: Decimal::ZERO,
        egress_by_destination: None,
        egress_tiers: Vec::new(),
    };
    let id = Uuid::now_v7();
    let ctx = EventContext::new_chain("system");
    execute::<Site, _>(log, id, &ctx, |_| SiteCommand::Register {
        name: name.into(),
        kind: SiteKind::Local,
        region: "here".into(),
        jurisdiction: "eu".into(),
        credentials_secret: None,
        labels: BTreeMap::from([("max_cpus".into(), "8".into())]),
        prices: Some(prices.clone()),
    })
    .await
    .unwrap();
    execute::<Site, _>(log, id, &ctx, |_| SiteCommand::Heartbeat {
        adapter: "test".into(),
        instance: Uuid::now_v7(),
        ttl_secs: 86_400,
        arrays: None,
    })
    .await
    .unwrap();
}

/// The large file `/slow.bin` serves, in four parts a moment apart.
const SLOW_PART: usize = 64 * 1024;

/// A real HTTP/1.1 server on a free port: `/x.csv` is `a,b\n1,2\n`; `/etag.bin` has an
/// ETag (and HEAD), and counts the GETs of it in [`GETS`]; `/slow.bin` is four parts of
/// [`SLOW_PART`] bytes sent 150 ms apart; anything else 404.
async fn serve_http() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&request);
                let method = line.split_whitespace().next().unwrap_or("GET").to_string();
                let path = line.split_whitespace().nth(1).unwrap_or("/");
                let answer = match (method.as_str(), path) {
                    (_, "/x.csv") => "HTTP/1.1 200 OK\r\ncontent-length: 8\r\nconnection: close\r\n\r\na,b\n1,2\n".to_string(),
                    (method, "/etag.bin") => {
                        let head = "HTTP/1.1 200 OK\r\ncontent-length: 6\r\netag: \"v1\"\r\nconnection: close\r\n\r\n";
                        match method {
                            "HEAD" => head.to_string(),
                            _ => {
                                GETS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                format!("{head}etag!\n")
                            }
                        }
                    }
                    (_, "/slow.bin") => {
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            4 * SLOW_PART
                        );
                        let _ = stream.write_all(head.as_bytes()).await;
                        for _ in 0..4 {
                            let _ = stream.write_all(&[7u8; SLOW_PART]).await;
                            tokio::time::sleep(Duration::from_millis(150)).await;
                        }
                        return;
                    }
                    _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string(),
                };
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    format!("http://{address}")
}

/// GETs of `/etag.bin` so far, over every test in this file (one test uses it).
static GETS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn workflow(name: &str, site: &str, ingress: &[(String, &str)]) -> String {
    let steps: Vec<String> = ingress
        .iter()
        .map(|(source, destination)| {
            format!("      - {{source: \"{source}\", destination: \"{destination}\"}}\n")
        })
        .collect();
    format!(
        "version: v1\nname: {name}\nplacement: {{sites: [{site}]}}\nvolumes:\n  data:\n    size: 1GiB\n    ingress:\n{}jobs:\n  read:\n    image: host\n    command: [\"true\"]\n    mounts: {{data: /data}}\n",
        steps.concat()
    )
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn transfers_completed(events: &[(u64, Envelope<Event>)]) -> Vec<(u64, String)> {
    events
        .iter()
        .filter_map(|(_, e)| match &e.payload {
            Event::Transfer(TransferEvent::Completed { bytes, digest, .. }) => {
                Some((*bytes, digest.clone()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_lands_in_the_volume_before_its_job_is_dispatched() {
    let b = Bench::new().await;
    let source = b.dir.path().join("in");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("a.txt"), "hello\n").unwrap();
    std::fs::write(source.join("sub/b.txt"), "world\n").unwrap();
    let id = b
        .submit(&workflow(
            "two-sources",
            "local",
            &[
                (format!("file://{}", source.display()), "/tree/"),
                (format!("{}/x.csv", b.http), "/csv/"),
            ],
        ))
        .await;
    // Held, and saying why, until the mover runs.
    b.wait_for("the hold", async || {
        b.events().await.iter().find_map(|(_, e)| match &e.payload {
            Event::Workflow(WorkflowEvent::ReleaseHeld { reason, .. }) => {
                assert_eq!(
                    reason,
                    "held: waiting for the data of volume data to arrive at local"
                );
                Some(())
            }
            _ => None,
        })
    })
    .await;
    let _mover = b.mover();
    let events = b
        .wait_for("the job's dispatch", async || {
            let events = b.events().await;
            events
                .iter()
                .any(|(_, e)| matches!(e.payload, Event::Job(JobEvent::Dispatched { .. })))
                .then_some(events)
        })
        .await;
    let staged_at = events
        .iter()
        .find(|(_, e)| {
            matches!(
                e.payload,
                Event::Workflow(WorkflowEvent::VolumeStaged { .. })
            )
        })
        .map(|(p, _)| *p)
        .expect("staged");
    let dispatched_at = events
        .iter()
        .find(|(_, e)| matches!(e.payload, Event::Job(JobEvent::Dispatched { .. })))
        .map(|(p, _)| *p)
        .unwrap();
    assert!(staged_at < dispatched_at, "the data came first");
    let volume = b.root().join(id.to_string()).join("data");
    assert_eq!(
        std::fs::read_to_string(volume.join("tree/a.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("tree/sub/b.txt")).unwrap(),
        "world\n"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("csv/x.csv")).unwrap(),
        "a,b\n1,2\n"
    );
    // The tree's digest is its manifest's: each file's digest and path, sorted.
    let manifest = format!(
        "{}  a.txt\n{}  sub/b.txt\n",
        sha256(b"hello\n"),
        sha256(b"world\n")
    );
    assert_eq!(
        transfers_completed(&events),
        [
            (12, sha256(manifest.as_bytes())),
            (8, sha256(b"a,b\n1,2\n"))
        ]
    );
    assert!(
        !walk(&volume)
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".meridian-part")),
        "no part files are left"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_object_fails_the_workflow_with_its_name_and_nothing_runs() {
    let b = Bench::new().await;
    let _mover = b.mover();
    let missing = format!("{}/missing.csv", b.http);
    let id = b
        .submit(&workflow("missing", "local", &[(missing.clone(), "/in/")]))
        .await;
    let reason = b
        .wait_for("the workflow's failure", async || {
            let wf = load::<Workflow>(&*b.log, id).await.unwrap();
            wf.history.iter().find_map(|e| match &e.payload {
                Event::Workflow(WorkflowEvent::Failed { reason, .. }) => Some(reason.clone()),
                _ => None,
            })
        })
        .await;
    assert_eq!(
        reason,
        format!("the data of volume data could not be brought to local: {missing}: the server answered 404 Not Found")
    );
    let events = b.events().await;
    assert!(!events
        .iter()
        .any(|(_, e)| matches!(e.payload, Event::Job(JobEvent::Dispatched { .. }))));
    assert!(events
        .iter()
        .any(|(_, e)| matches!(&e.payload, Event::Transfer(TransferEvent::Failed { reason, .. }) if reason.contains("missing.csv"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_the_mover_cannot_reach_is_refused_with_the_reason() {
    let b = Bench::new().await;
    let _mover = b.mover();
    let id = b
        .submit(&workflow(
            "far-away",
            "far",
            &[(format!("{}/x.csv", b.http), "/in/")],
        ))
        .await;
    let wf = b
        .wait_for("the failure", async || {
            let wf = load::<Workflow>(&*b.log, id).await.unwrap().state;
            (wf.state() == Some(WorkflowState::Failed)).then_some(wf)
        })
        .await;
    assert!(matches!(
        wf.data_wait("read"),
        Some(meridian_events::aggregate::workflow::DataWait::Failed { reason, .. })
            if reason.contains("cannot write to site far's storage")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_under_way_at_a_stop_is_finished_under_the_same_transfer() {
    let b = Bench::new().await;
    let source = format!("{}/x.csv", b.http);
    let id = b
        .submit(&workflow("resumed", "local", &[(source.clone(), "/in/")]))
        .await;
    b.wait_for("the volume", async || {
        let wf = load::<Workflow>(&*b.log, id).await.unwrap().state;
        let held = wf.allocated_volumes().next().is_some();
        held.then_some(())
    })
    .await;
    // What a mover that died mid-copy left: a transfer requested, never completed.
    let earlier = Uuid::now_v7();
    execute::<Transfer, _>(&*b.log, earlier, &EventContext::new_chain("t"), |_| {
        TransferCommand::Request {
            workflow_id: id,
            source: Endpoint::Uri {
                uri: source.clone(),
            },
            destination: Endpoint::SitePath {
                site: "local".into(),
                path: "data:/in/".into(),
            },
            bytes_expected: None,
        }
    })
    .await
    .unwrap();
    let _mover = b.mover();
    b.wait_for("the staging", async || {
        load::<Workflow>(&*b.log, id)
            .await
            .unwrap()
            .state
            .is_staged("data", "local")
            .then_some(())
    })
    .await;
    let events = b.events().await;
    let requested: Vec<Uuid> = events
        .iter()
        .filter(|(_, e)| matches!(e.payload, Event::Transfer(TransferEvent::Requested { .. })))
        .map(|(_, e)| e.aggregate.id)
        .collect();
    assert_eq!(requested, [earlier], "no second transfer for the same copy");
    let transfer = load::<Transfer>(&*b.log, earlier).await.unwrap();
    assert!(matches!(
        transfer.history.last().map(|e| &e.payload),
        Some(Event::Transfer(TransferEvent::Completed { bytes: 8, .. }))
    ));
}

/// Runs job `job_id` to success, as a site runner would.
async fn run_job(log: &dyn EventLog, job_id: Uuid) {
    meridian_eventlog::testkit::run_job(log, job_id, 0).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_are_copied_out_before_the_workflow_finishes() {
    let b = Bench::new().await;
    let _mover = b.mover();
    let exported = b.dir.path().join("exported");
    let id = b
        .submit(&format!(
            "version: v1\nname: outputs\nplacement: {{sites: [local]}}\nvolumes:\n  results:\n    size: 1GiB\n    egress:\n      - {{source: /out/, destination: \"file://{}/\"}}\njobs:\n  write:\n    image: host\n    command: [\"true\"]\n    mounts: {{results: /r}}\n",
            exported.display()
        ))
        .await;
    let job = b
        .wait_for("the job's dispatch", async || {
            b.events().await.iter().find_map(|(_, e)| match e.payload {
                Event::Job(JobEvent::Dispatched { .. }) => Some(e.aggregate.id),
                _ => None,
            })
        })
        .await;
    // What the job wrote, where the site keeps the volume.
    let out = b.root().join(id.to_string()).join("results").join("out");
    std::fs::create_dir_all(out.join("deep")).unwrap();
    std::fs::write(out.join("r.txt"), "result\n").unwrap();
    std::fs::write(out.join("deep/s.txt"), "more\n").unwrap();
    run_job(&*b.log, job).await;
    b.wait_for("the end", async || {
        let wf = load::<Workflow>(&*b.log, id).await.unwrap().state;
        (wf.state() == Some(WorkflowState::Finished)).then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(exported.join("r.txt")).unwrap(),
        "result\n"
    );
    assert_eq!(
        std::fs::read_to_string(exported.join("deep/s.txt")).unwrap(),
        "more\n"
    );
    let events = b.events().await;
    let at = |kind: &str| {
        events
            .iter()
            .find(|(_, e)| e.payload.kind() == kind)
            .map(|(p, _)| *p)
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    assert!(at("workflow.egress_due.v1") < at("workflow.volume_exported.v1"));
    assert!(at("workflow.volume_exported.v1") <= at("workflow.finished.v1"));
    let billed = events.iter().find_map(|(_, e)| match &e.payload {
        Event::Transfer(TransferEvent::Completed { bytes, egress, .. }) => {
            Some((*bytes, egress.clone()))
        }
        _ => None,
    });
    let (bytes, tariff) = billed.expect("the copy out");
    assert_eq!(bytes, 12);
    assert_eq!(
        tariff.map(|t| t.currency),
        Some(Currency::USD),
        "billed at the site's egress price"
    );
}

/// The transfers completed for `workflow`: (bytes, digest, cached).
fn completed_for(events: &[(u64, Envelope<Event>)], workflow: Uuid) -> Vec<(u64, String, bool)> {
    events
        .iter()
        .filter_map(|(_, e)| match &e.payload {
            Event::Transfer(TransferEvent::Completed {
                workflow_id,
                bytes,
                digest,
                cached,
                ..
            }) if *workflow_id == workflow => Some((*bytes, digest.clone(), *cached)),
            _ => None,
        })
        .collect()
}

async fn staged(b: &Bench, id: Uuid) -> Vec<(u64, Envelope<Event>)> {
    b.wait_for("the volume staged", async || {
        let events = b.events().await;
        events
            .iter()
            .any(|(_, e)| {
                e.aggregate.id == id
                    && matches!(
                        e.payload,
                        Event::Workflow(WorkflowEvent::VolumeStaged { .. })
                    )
            })
            .then_some(events)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_takes_its_data_from_the_site_cache_until_the_source_changes() {
    let b = Bench::new().await;
    let _mover = b.mover();
    let source = b.dir.path().join("in");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("a.txt"), "hello\n").unwrap();
    std::fs::write(source.join("sub/b.txt"), "world\n").unwrap();
    let spec = |name: &str| {
        workflow(
            name,
            "local",
            &[
                (format!("file://{}", source.display()), "/tree/"),
                (format!("{}/etag.bin", b.http), "/e.bin"),
            ],
        )
    };
    let first = b.submit(&spec("first")).await;
    let events = staged(&b, first).await;
    let fetched = completed_for(&events, first);
    assert!(fetched.iter().all(|(_, _, cached)| !cached), "{fetched:?}");
    assert_eq!(GETS.load(std::sync::atomic::Ordering::SeqCst), 1);

    // The same inputs again: nothing is fetched, the same bytes are there.
    let second = b.submit(&spec("second")).await;
    let events = staged(&b, second).await;
    let again = completed_for(&events, second);
    assert_eq!(
        again,
        fetched
            .iter()
            .map(|(bytes, digest, _)| (*bytes, digest.clone(), true))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        GETS.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "not fetched again"
    );
    let volume = b.root().join(second.to_string()).join("data");
    assert_eq!(
        std::fs::read_to_string(volume.join("tree/sub/b.txt")).unwrap(),
        "world\n"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("e.bin")).unwrap(),
        "etag!\n"
    );
    // A copy from the cache came from the site itself.
    assert!(events.iter().any(|(_, e)| matches!(
        &e.payload,
        Event::Transfer(TransferEvent::Completed { workflow_id, from: meridian_events::vocabulary::Location::Site { site }, cached: true, .. })
            if *workflow_id == second && site == "local"
    )));

    // The source tree changes, and the cached copy of the HTTP object is damaged: both
    // are fetched again, and the damage never reaches the volume.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(source.join("a.txt"), "HELLO\n").unwrap();
    let content = b.root().join(".meridian-cache/content");
    let kept = content.join(sha256(b"etag!\n").replace(':', "-")).join("_");
    std::fs::write(&kept, "broken").unwrap();
    let third = b.submit(&spec("third")).await;
    let events = staged(&b, third).await;
    let fresh = completed_for(&events, third);
    assert!(fresh.iter().all(|(_, _, cached)| !cached), "{fresh:?}");
    assert_ne!(
        fresh[0].1, fetched[0].1,
        "the changed tree has another digest"
    );
    assert_eq!(GETS.load(std::sync::atomic::Ordering::SeqCst), 2);
    let volume = b.root().join(third.to_string()).join("data");
    assert_eq!(
        std::fs::read_to_string(volume.join("tree/a.txt")).unwrap(),
        "HELLO\n"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("e.bin")).unwrap(),
        "etag!\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_records_its_progress_while_bytes_move() {
    let b = Bench::new().await;
    let _mover = b.mover();
    let id = b
        .submit(&workflow(
            "slow",
            "local",
            &[(format!("{}/slow.bin", b.http), "/s.bin")],
        ))
        .await;
    let events = staged(&b, id).await;
    let total = 4 * SLOW_PART as u64;
    let progress: Vec<(u64, Option<u64>)> = events
        .iter()
        .filter_map(|(_, e)| match &e.payload {
            Event::Transfer(TransferEvent::Progressed {
                bytes_done,
                bytes_total,
                ..
            }) => Some((*bytes_done, *bytes_total)),
            _ => None,
        })
        .collect();
    assert!(
        progress
            .iter()
            .any(|(done, of)| *done > 0 && *done < total && *of == Some(total)),
        "some progress part-way: {progress:?}"
    );
    assert!(
        progress.windows(2).all(|w| w[0].0 < w[1].0),
        "it only grows: {progress:?}"
    );
    assert_eq!(
        completed_for(&events, id),
        [(total, sha256(&vec![7u8; total as usize]), false)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_reaches_its_store_with_the_secret_it_names_which_never_enters_the_log() {
    let moto = meridian_datamover::testkit::Moto::start();
    moto.bucket("lab");
    moto.put("lab", "cells.csv", b"id\n1\n");
    let b = Bench::new().await;
    // This process's environment names no S3 server: only the secret does.
    let secret_key = "a-secret-key-that-stays-in-the-mover";
    let vars = BTreeMap::from([
        ("AWS_ENDPOINT_URL".to_string(), moto.url().to_string()),
        ("AWS_ACCESS_KEY_ID".to_string(), "lab-key".to_string()),
        ("AWS_SECRET_ACCESS_KEY".to_string(), secret_key.to_string()),
        ("AWS_REGION".to_string(), "us-east-1".to_string()),
    ]);
    let roots = BTreeMap::from([("local".to_string(), b.root())]);
    let mover = DataMover::new(b.log.clone(), roots)
        .with_retry_after(Duration::from_millis(50))
        .with_secrets(BTreeMap::from([("lab-s3".to_string(), vars)]));
    let stopped = b.stop.subscribe();
    tokio::spawn(async move { mover.run(stopped).await.unwrap() });
    let spec = |name: &str, secret: &str| {
        format!(
            "version: v1\nname: {name}\nplacement: {{sites: [local]}}\nvolumes:\n  data:\n    size: 1GiB\n    ingress:\n      - {{source: \"s3://lab/cells.csv\", destination: /in/, credentials: {secret}}}\njobs:\n  read:\n    image: host\n    command: [\"true\"]\n    mounts: {{data: /data}}\n"
        )
    };
    let id = b.submit(&spec("with-secret", "lab-s3")).await;
    staged(&b, id).await;
    let volume = b.root().join(id.to_string()).join("data");
    assert_eq!(
        std::fs::read_to_string(volume.join("in/cells.csv")).unwrap(),
        "id\n1\n"
    );

    // A secret the mover does not have fails the step, naming it.
    let missing = b.submit(&spec("no-secret", "nope")).await;
    let reason = b
        .wait_for("the staging to fail", async || {
            b.events().await.iter().find_map(|(_, e)| match &e.payload {
                Event::Workflow(WorkflowEvent::VolumeStagingFailed { reason, .. })
                    if e.aggregate.id == missing =>
                {
                    Some(reason.clone())
                }
                _ => None,
            })
        })
        .await;
    assert!(
        reason.contains("\"nope\"") && reason.contains("secrets"),
        "{reason}"
    );

    // The workflow names the secret; its values are nowhere in the log.
    for commit in b.log.read_from(0, 100_000).await.unwrap() {
        for raw in commit.events.iter() {
            let text = raw.payload.to_string();
            assert!(
                !text.contains(secret_key) && !text.contains("lab-key"),
                "{text}"
            );
        }
    }
}
