//! The router as a service, over a real SQLite log: what it appends in answer to what
//! it reads. Jobs are "run" here by driving the Job aggregate directly, as a site
//! runner would, so every step of the router is visible.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use meridian_eventlog::aggregates::{decode_all, execute, load};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::testkit::{BeforeAppend, FailAppend, Intercepted};
use meridian_eventlog::{EventLog, LogError, Snapshot};
use meridian_events::aggregate::{
    Job, JobCommand, Site, SiteCommand, Workflow, WorkflowCommand, WorkflowState,
};
use meridian_events::vocabulary::Usage;
use meridian_events::{
    Allocation, ComputeOffer, ComputePricing, Currency, Event, EventContext, JobEvent, PriceSheet,
    RawEnvelope, SiteKind, WorkflowEvent,
};
use meridian_router::{Router, RouterStart};
use rust_decimal::Decimal;
use tokio::sync::watch;
use uuid::Uuid;

struct Bench {
    log: Arc<dyn EventLog>,
    stop: watch::Sender<bool>,
    router: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// A new SQLite log in a directory of its own.
async fn new_log() -> (tempfile::TempDir, Arc<dyn EventLog>) {
    let dir = tempfile::tempdir().unwrap();
    let log = SqliteLog::open(&dir.path().join("e.sqlite")).await.unwrap();
    (dir, Arc::new(log))
}

impl Bench {
    async fn new() -> Bench {
        Bench::with_sites(&[("only", "1")]).await
    }

    async fn with_sites(sites: &[(&str, &str)]) -> Bench {
        Bench::seen_through(sites, |log| log).await
    }

    /// A bench whose one site, `name`, no adapter serves yet (connect it with `connect`).
    async fn with_unconnected_site(name: &str) -> (Bench, Uuid) {
        let (dir, log) = new_log().await;
        let site = register_unconnected_site(&*log, name).await;
        (Bench::start(dir, log), site)
    }

    /// A router started on `log` (in `dir`), set up already.
    fn start(dir: tempfile::TempDir, log: Arc<dyn EventLog>) -> Bench {
        Bench::start_through(dir, log, |log| log)
    }

    /// [`Bench::start`], the router reaching the log through `wrap`.
    fn start_through(
        dir: tempfile::TempDir,
        log: Arc<dyn EventLog>,
        wrap: impl FnOnce(Arc<dyn EventLog>) -> Arc<dyn EventLog>,
    ) -> Bench {
        let (stop, stopped) = watch::channel(false);
        Bench {
            router: Bench::spawn(wrap(log.clone()), stopped),
            log,
            stop,
            _dir: dir,
        }
    }

    /// A bench whose router reaches the log through `wrap` (the bench itself reads and
    /// writes the log directly).
    async fn seen_through(
        sites: &[(&str, &str)],
        wrap: impl FnOnce(Arc<dyn EventLog>) -> Arc<dyn EventLog>,
    ) -> Bench {
        let (dir, log) = new_log().await;
        for (name, price) in sites {
            register_site(&*log, name, price).await;
        }
        Bench::start_through(dir, log, wrap)
    }

    fn spawn(
        log: Arc<dyn EventLog>,
        stopped: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            Router::new(log)
                .await
                .unwrap()
                .with_backoff(Duration::from_millis(300))
                .run(stopped)
                .await
                .unwrap();
        })
    }

    /// Stops the router (as a crash would: no clean hand-over) and starts a new one.
    async fn restart(&mut self) {
        self.restart_on(self.log.clone()).await;
    }

    /// Restarts as after a crash before any acknowledgement: the new router's
    /// subscription delivers the whole log again.
    async fn restart_unacknowledged(&mut self, suffix: &str) {
        let log = Intercepted::new(self.log.clone()).subscriptions_renamed(suffix);
        self.restart_on(Arc::new(log)).await;
    }

    async fn restart_on(&mut self, log: Arc<dyn EventLog>) {
        self.router.abort();
        let _ = (&mut self.router).await;
        let (stop, stopped) = watch::channel(false);
        self.stop = stop;
        self.router = Self::spawn(log, stopped);
    }

    async fn submit(&self, yaml: &str) -> Uuid {
        submit_to(&*self.log, yaml).await
    }

    async fn workflow(&self, id: Uuid) -> Workflow {
        load::<Workflow>(&*self.log, id).await.unwrap().state
    }

    /// Job ids dispatched for workflow `id`, with their task names, in log order.
    async fn dispatched(&self, id: Uuid) -> Vec<(Uuid, String)> {
        let mut out = Vec::new();
        for commit in self.log.read_from(0, 100_000).await.unwrap() {
            for e in decode_all(commit.into_events()).unwrap() {
                if let Event::Job(JobEvent::Dispatched {
                    workflow_id,
                    job,
                    index,
                    ..
                }) = &e.payload
                {
                    if *workflow_id == id {
                        let name = match index {
                            Some(i) => format!("{job}[{i}]"),
                            None => job.clone(),
                        };
                        out.push((e.aggregate.id, name));
                    }
                }
            }
        }
        out
    }

    /// The jobs of workflow `id` dispatched so far, once there are at least `count`.
    async fn dispatched_at_least(&self, what: &str, id: Uuid, count: usize) -> Vec<(Uuid, String)> {
        self.wait_for(what, async || {
            let d = self.dispatched(id).await;
            (d.len() >= count).then_some(d)
        })
        .await
    }

    async fn wait_for<T>(&self, what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The site loses the job's node while it runs.
    async fn lose_node(&self, job_id: Uuid) {
        let ctx = EventContext::new_chain("t");
        let now = Utc::now();
        for cmd in [
            JobCommand::RecordSubmission {
                backend_job_id: "1".into(),
            },
            JobCommand::Start {
                started_at: now,
                allocated: Allocation {
                    nodes: 1,
                    cpus: 1,
                    memory_bytes: 1 << 30,
                    gpus: None,
                },
                hosts: vec![],
            },
            JobCommand::Fail {
                ended_at: now,
                exit_code: None,
                reason: meridian_events::FailureReason::NodeFailure,
                usage: Usage::default(),
            },
        ] {
            execute::<Job, _>(&*self.log, job_id, &ctx, |_| cmd.clone())
                .await
                .unwrap();
        }
    }

    async fn run_job(&self, job_id: Uuid, exit_code: i32) {
        meridian_eventlog::testkit::run_job(&*self.log, job_id, exit_code).await
    }
}

/// Submits the workflow `yaml` to `log`; returns its id.
async fn submit_to(log: &dyn EventLog, yaml: &str) -> Uuid {
    meridian_eventlog::testkit::submit(log, yaml).await.0
}

async fn register_site(log: &dyn EventLog, name: &str, core_hour: &str) {
    register_sized_site(log, name, core_hour, 8).await
}

async fn register_sized_site(log: &dyn EventLog, name: &str, core_hour: &str, max_cpus: u32) {
    let id = register(log, name, core_hour, max_cpus).await;
    // These tests play the site themselves: say an adapter serves it, for a day.
    connect(log, id, 86_400).await;
}

/// Registers a site that no adapter serves yet.
async fn register(log: &dyn EventLog, name: &str, core_hour: &str, max_cpus: u32) -> Uuid {
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
    execute::<Site, _>(log, id, &EventContext::new_chain("system"), |_| {
        SiteCommand::Register {
            name: name.into(),
            kind: SiteKind::Local,
            region: "here".into(),
            jurisdiction: "eu".into(),
            credentials_secret: None,
            labels: BTreeMap::from([("max_cpus".into(), max_cpus.to_string())]),
            prices: Some(prices.clone()),
        }
    })
    .await
    .unwrap();
    id
}

async fn connect(log: &dyn EventLog, site: Uuid, ttl_secs: u64) {
    connect_taking_arrays(log, site, ttl_secs, None).await
}

/// Says an adapter serves `site`, taking up to `arrays` tasks of an array as one unit.
async fn connect_taking_arrays(log: &dyn EventLog, site: Uuid, ttl_secs: u64, arrays: Option<u32>) {
    execute::<Site, _>(log, site, &EventContext::new_chain("system"), |_| {
        SiteCommand::Heartbeat {
            adapter: "test".into(),
            instance: Uuid::now_v7(),
            ttl_secs,
            arrays,
        }
    })
    .await
    .unwrap();
}

const DAG: &str = r#"
version: v1
name: dag
jobs:
  prep: {image: host, command: ["true"]}
  sweep: {requires: [prep], image: host, command: ["true"], array: {start: 1, end: 5, parallelism: 2}}
  report: {requires: [sweep], image: host, command: ["true"]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_follow_the_dag_and_the_array_cap() {
    let b = Bench::new().await;
    let id = b.submit(DAG).await;
    let first = b.dispatched_at_least("prep dispatched", id, 1).await;
    assert_eq!(
        first.iter().map(|d| d.1.as_str()).collect::<Vec<_>>(),
        ["prep"]
    );
    let wf = b.workflow(id).await;
    assert_eq!(wf.placement().unwrap().site, "only");

    b.run_job(first[0].0, 0).await;
    let sweep = b.dispatched_at_least("two sweep tasks", id, 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = b.dispatched(id).await;
    assert_eq!(
        now.len(),
        3,
        "only two sweep tasks at once (cap 2): {now:?}"
    );
    assert!(sweep[1..].iter().all(|d| d.1.starts_with("sweep[")));

    // Finish tasks one by one; each frees a slot for the next, then report runs last.
    let mut done = 1;
    while done < 6 {
        let all = b.dispatched(id).await;
        let (job, name) = all[done].clone();
        assert!(name.starts_with("sweep["), "{all:?}");
        b.run_job(job, 0).await;
        done += 1;
        b.wait_for("the next release", async || {
            let d = b.dispatched(id).await;
            (d.len() > done.min(5) || d.len() == 7).then_some(())
        })
        .await;
    }
    let all = b
        .wait_for("report dispatched", async || {
            let d = b.dispatched(id).await;
            (d.len() == 7).then_some(d)
        })
        .await;
    assert_eq!(all[6].1, "report");
    b.run_job(all[6].0, 0).await;
    b.wait_for("the workflow finishes", async || {
        (b.workflow(id).await.state() == Some(WorkflowState::Finished)).then_some(())
    })
    .await;
}

/// The batches of workflow `id`'s dispatched tasks, in log order: (task, batch id, cap).
async fn batches(log: &dyn EventLog, id: Uuid) -> Vec<(String, Option<Uuid>, u32)> {
    let mut out = Vec::new();
    for commit in log.read_from(0, 100_000).await.unwrap() {
        for e in decode_all(commit.into_events()).unwrap() {
            if let Event::Job(JobEvent::Dispatched {
                workflow_id,
                job,
                index,
                batch,
                ..
            }) = &e.payload
            {
                if *workflow_id == id {
                    let name = match index {
                        Some(i) => format!("{job}[{i}]"),
                        None => job.clone(),
                    };
                    out.push((name, batch.map(|b| b.id), batch.map_or(0, |b| b.cap)));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_that_takes_arrays_gets_them_in_batches_held_to_the_cap() {
    let (dir, log) = new_log().await;
    let site = register(&*log, "hpc", "1", 8).await;
    connect_taking_arrays(&*log, site, 86_400, Some(3)).await;
    let b = Bench::start(dir, log);
    let id = b.submit(DAG).await;
    let prep = b
        .wait_for("prep dispatched", async || {
            b.dispatched(id).await.first().cloned()
        })
        .await;
    b.run_job(prep.0, 0).await;
    // sweep[1..=5], cap 2, at a site taking 3 at a time: one batch of 3, capped at 2.
    let first = b
        .wait_for("the first batch", async || {
            let d = batches(&*b.log, id).await;
            (d.len() >= 4).then_some(d)
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(batches(&*b.log, id).await, first, "nothing more for now");
    let batch = first[1].1.expect("released in a batch");
    assert_eq!(
        first[1..],
        [
            ("sweep[1]".to_string(), Some(batch), 2),
            ("sweep[2]".to_string(), Some(batch), 2),
            ("sweep[3]".to_string(), Some(batch), 2),
        ]
    );
    // Two end: one slot is free, but the two left wait for a batch at the full cap.
    let dispatched = b.dispatched(id).await;
    b.run_job(dispatched[1].0, 0).await;
    b.run_job(dispatched[2].0, 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        batches(&*b.log, id).await.len(),
        4,
        "the rest waits for the cap"
    );
    b.run_job(dispatched[3].0, 0).await;
    let second = b
        .wait_for("the second batch", async || {
            let d = batches(&*b.log, id).await;
            (d.len() >= 6).then_some(d)
        })
        .await;
    let next = second[4].1.expect("released in a batch");
    assert_ne!(next, batch);
    assert_eq!(
        second[4..],
        [
            ("sweep[4]".to_string(), Some(next), 2),
            ("sweep[5]".to_string(), Some(next), 2),
        ]
    );
    for (job, _) in &b.dispatched(id).await[4..] {
        b.run_job(*job, 0).await;
    }
    let all = b
        .wait_for("report dispatched", async || {
            let d = batches(&*b.log, id).await;
            (d.len() == 7).then_some(d)
        })
        .await;
    assert_eq!(
        all[6],
        ("report".to_string(), None, 0),
        "a plain job goes alone"
    );
    let _ = b.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_fails_the_workflow_without_releasing_its_dependents() {
    let b = Bench::new().await;
    let id = b.submit(DAG).await;
    let first = b.dispatched_at_least("prep", id, 1).await;
    b.run_job(first[0].0, 2).await;
    b.wait_for("the workflow fails", async || {
        (b.workflow(id).await.state() == Some(WorkflowState::Failed)).then_some(())
    })
    .await;
    assert_eq!(
        b.dispatched(id).await.len(),
        1,
        "nothing after prep was released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_request_reaches_running_jobs() {
    let b = Bench::new().await;
    let id = b.submit(DAG).await;
    let first = b.dispatched_at_least("prep", id, 1).await;
    execute::<Workflow, _>(&*b.log, id, &EventContext::new_chain("t"), |_| {
        WorkflowCommand::RequestCancel {
            by: "tester".into(),
            reason: None,
        }
    })
    .await
    .unwrap();
    b.wait_for("the job's cancel request", async || {
        load::<Job>(&*b.log, first[0].0)
            .await
            .unwrap()
            .state
            .cancel_requested()
            .then_some(())
    })
    .await;
    // The site confirms; the workflow ends cancelled.
    execute::<Job, _>(&*b.log, first[0].0, &EventContext::new_chain("t"), |_| {
        JobCommand::Cancel {
            ended_at: Utc::now(),
            usage: Usage::default(),
        }
    })
    .await
    .unwrap();
    b.wait_for("cancelled", async || {
        (b.workflow(id).await.state() == Some(WorkflowState::Cancelled)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unplaceable_workflow_is_rejected_with_reasons_and_fails() {
    let b = Bench::new().await;
    let id = b.submit("version: v1\nname: big\njobs:\n  t: {image: host, command: [\"true\"], resources: {cpus: 64}}\n").await;
    b.wait_for("failed", async || {
        (b.workflow(id).await.state() == Some(WorkflowState::Failed)).then_some(())
    })
    .await;
    let history = load::<Workflow>(&*b.log, id).await.unwrap().history;
    let rejected = history.iter().find_map(|e| match &e.payload {
        Event::Workflow(WorkflowEvent::PlacementRejected { rejections, .. }) => {
            Some(rejections.clone())
        }
        _ => None,
    });
    let rejections = rejected.expect("a placement_rejected event");
    assert_eq!(rejections[0].site, "only");
    assert!(rejections[0].reason.contains("64 CPUs"), "{rejections:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_router_decides_nothing_twice() {
    let mut b = Bench::new().await;
    let id = b.submit(DAG).await;
    let first = b.dispatched_at_least("prep", id, 1).await;
    b.restart().await;
    b.run_job(first[0].0, 0).await;
    b.dispatched_at_least("sweep", id, 3).await;
    b.restart().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let all = b.dispatched(id).await;
    assert_eq!(all.len(), 3, "a restart re-releases nothing: {all:?}");
    let placements = load::<Workflow>(&*b.log, id)
        .await
        .unwrap()
        .history
        .iter()
        .filter(|e| {
            matches!(
                e.payload,
                Event::Workflow(WorkflowEvent::PlacementDecided { .. })
            )
        })
        .count();
    assert_eq!(placements, 1);
}

/// Commits delivered again after a restart (their acknowledgement lost) are not taken
/// for new work: the placed workflow they concern is read whole from the log, placed
/// once, holds nothing back for its tenant's limit, and the tenant's next workflow is
/// placed once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_delivered_again_after_a_restart_holds_nothing_back() {
    use meridian_events::aggregate::TenantCommand;
    use meridian_events::vocabulary::tenant::TenantLimits;
    let limit = async |b: &Bench, n: u32| {
        tenant_t(
            &*b.log,
            TenantCommand::SetLimits {
                tenant: "t".into(),
                limits: TenantLimits {
                    concurrent_workflows: Some(n),
                    ..TenantLimits::default()
                },
                set_by: "admin".into(),
            },
        )
        .await;
    };
    let mut b = Bench::new().await;
    limit(&b, 1).await;
    let first = b.submit(DAG).await;
    b.dispatched_at_least("the first workflow's prep", first, 1)
        .await;
    b.restart_unacknowledged("again").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    limit(&b, 2).await;
    let second = b.submit(DAG).await;
    b.dispatched_at_least("the second workflow's prep", second, 1)
        .await;
    let kinds = kinds(&*b.log, first).await;
    assert_eq!(
        kinds.iter().filter(|k| k.contains("placement")).count(),
        1,
        "placed once, and no wait recorded for it: {kinds:?}"
    );
    assert_eq!(b.dispatched(first).await.len(), 1, "prep dispatched once");
}

/// A restart starts from the router's snapshot and folds only the commits after it, and
/// starts exactly where a fold of the whole log would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_the_snapshot_starts_where_a_fold_of_the_whole_log_would() {
    let mut b = Bench::new().await;
    let id = b.submit(DAG).await;
    let first = b.dispatched_at_least("prep", id, 1).await;
    b.run_job(first[0].0, 0).await;
    let sweep = b.dispatched_at_least("sweep", id, 3).await;
    b.stop.send(true).unwrap();
    (&mut b.router).await.unwrap();

    let json = |start: &RouterStart| serde_json::to_value(start).unwrap();
    let saved = RouterStart::load(&*b.log, 1).await.unwrap();
    assert_eq!(
        saved.from_snapshot, None,
        "the running router saved none yet"
    );
    let position = saved.catalog.position();
    assert_eq!(position, b.log.head().await.unwrap());
    assert!(saved.work.active.values().any(|w| w.contains(&id)));

    // After the snapshot: a job of the site ends, new work waits, a site appears.
    b.run_job(sweep[1].0, 0).await;
    let waiting = b.submit(DAG).await;
    register_site(&*b.log, "later", "2").await;
    let restarted = RouterStart::load(&*b.log, u64::MAX).await.unwrap();
    let whole = RouterStart::fold_whole_log(&*b.log).await.unwrap();
    assert_eq!(restarted.from_snapshot, Some(position));
    assert_eq!(restarted.read, whole.read - saved.read);
    assert_eq!(json(&restarted), json(&whole));
    assert!(restarted.work.unplaced.contains(&waiting));
    assert!(restarted.catalog.find("later").is_some());
    assert_eq!(restarted.catalog.find("only").unwrap().runs, 2);

    // One that does not decode (another version's) is ignored: the whole log is folded.
    b.log
        .save_snapshot(Snapshot {
            name: meridian_router::SNAPSHOT.into(),
            position: b.log.head().await.unwrap(),
            body: br#"{"format":1}"#.to_vec(),
        })
        .await
        .unwrap();
    let again = RouterStart::load(&*b.log, u64::MAX).await.unwrap();
    assert_eq!(again.from_snapshot, None);
    assert_eq!(again.read, whole.read);
    assert_eq!(json(&again), json(&whole));
}

/// A running router saves as its snapshot what it folded from the commits delivered to
/// it (not its decisions, which are ahead of the log, and without reading the log
/// again): a restart from it starts exactly where a fold of the whole log would, reading
/// only the commits after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_routers_snapshot_is_the_fold_of_the_commits_delivered_to_it() {
    let (dir, log) = new_log().await;
    register_site(&*log, "only", "1").await;
    let (stop, stopped) = watch::channel(false);
    let router = Router::with_snapshots_every(log.clone(), 1).await.unwrap();
    let mut b = Bench {
        router: tokio::spawn(async move { router.run(stopped).await.unwrap() }),
        log,
        stop,
        _dir: dir,
    };
    let id = b.submit(DAG).await;
    let first = b.dispatched_at_least("prep", id, 1).await;
    b.run_job(first[0].0, 0).await;
    let sweep = b.dispatched_at_least("sweep", id, 3).await; // prep and two of five
    b.run_job(sweep[1].0, 0).await;
    // Saved after a delivered batch when no save is under way: more commits until one
    // is saved past everything above.
    let target = b.log.head().await.unwrap();
    let mut more = 0;
    let position = b
        .wait_for("a snapshot past the job's end", async || {
            more += 1;
            register_site(&*b.log, &format!("more-{more}"), "9").await;
            let saved = b
                .log
                .load_snapshot(meridian_router::SNAPSHOT)
                .await
                .unwrap();
            saved.map(|s| s.position).filter(|p| *p >= target)
        })
        .await;

    // After the snapshot: another job ends, new work comes, and the router stops.
    b.run_job(sweep[2].0, 0).await;
    let later = b.submit(DAG).await;
    b.dispatched_at_least("the later workflow's prep", later, 1)
        .await;
    b.stop.send(true).unwrap();
    (&mut b.router).await.unwrap();

    let saved = b
        .log
        .load_snapshot(meridian_router::SNAPSHOT)
        .await
        .unwrap();
    let position = saved.map_or(position, |s| s.position);
    let json = |start: &RouterStart| serde_json::to_value(start).unwrap();
    let restarted = RouterStart::load(&*b.log, u64::MAX).await.unwrap();
    let whole = RouterStart::fold_whole_log(&*b.log).await.unwrap();
    let head = b.log.head().await.unwrap();
    assert_eq!(restarted.from_snapshot, Some(position));
    assert_eq!(whole.read, head, "SQLite's positions are 1, 2, 3…");
    assert!(position < head, "commits came after the snapshot");
    assert_eq!(
        restarted.read,
        head - position,
        "only what came after it is read"
    );
    assert_eq!(json(&restarted), json(&whole));
    assert!(restarted.work.active.values().any(|w| w.contains(&id)));
    assert_eq!(restarted.catalog.find("only").unwrap().runs, 3);
}

/// (job id, task, site) of every dispatch of workflow `id`, in log order.
async fn dispatch_sites(log: &dyn EventLog, id: Uuid) -> Vec<(Uuid, String)> {
    let mut out = Vec::new();
    for commit in log.read_from(0, 100_000).await.unwrap() {
        for e in decode_all(commit.into_events()).unwrap() {
            if let Event::Job(JobEvent::Dispatched {
                workflow_id, site, ..
            }) = &e.payload
            {
                if *workflow_id == id {
                    out.push((e.aggregate.id, site.clone()));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_failure_re_places_the_work_elsewhere_and_both_attempts_are_recorded() {
    let b = Bench::with_sites(&[("cheap", "1"), ("backup", "2")]).await;
    let id = b
        .submit("version: v1\nname: one\njobs:\n  a: {image: host, command: [\"true\"]}\n")
        .await;
    let first = b
        .wait_for("the first dispatch", async || {
            let d = dispatch_sites(&*b.log, id).await;
            (!d.is_empty()).then_some(d)
        })
        .await;
    assert_eq!(first[0].1, "cheap");
    b.lose_node(first[0].0).await;
    let both = b
        .wait_for("a second dispatch", async || {
            let d = dispatch_sites(&*b.log, id).await;
            (d.len() == 2).then_some(d)
        })
        .await;
    assert_eq!(
        both[1].1, "backup",
        "the failed site is excluded for a while"
    );
    b.run_job(both[1].0, 0).await;
    b.wait_for("finished", async || {
        (b.workflow(id).await.state() == Some(WorkflowState::Finished)).then_some(())
    })
    .await;

    let decisions: Vec<(
        u32,
        String,
        Vec<meridian_events::vocabulary::workflow::Candidate>,
    )> = load::<Workflow>(&*b.log, id)
        .await
        .unwrap()
        .history
        .iter()
        .filter_map(|e| match &e.payload {
            Event::Workflow(WorkflowEvent::PlacementDecided {
                attempt,
                site,
                explanation,
                ..
            }) => Some((*attempt, site.clone(), explanation.candidates.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(decisions.len(), 2);
    assert_eq!((decisions[0].0, decisions[0].1.as_str()), (1, "cheap"));
    assert_eq!((decisions[1].0, decisions[1].1.as_str()), (2, "backup"));
    let cheap = decisions[1].2.iter().find(|c| c.site == "cheap").unwrap();
    assert!(
        matches!(&cheap.verdict, meridian_events::vocabulary::workflow::Verdict::Rejected { reason } if reason.starts_with("excluded after 1 site fault")),
        "{cheap:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nowhere_else_to_go_the_work_retries_in_place_after_a_backoff() {
    let b = Bench::new().await;
    let id = b
        .submit("version: v1\nname: one\njobs:\n  a: {image: host, command: [\"true\"]}\n")
        .await;
    let first = b
        .wait_for("the first dispatch", async || {
            let d = dispatch_sites(&*b.log, id).await;
            (!d.is_empty()).then_some(d)
        })
        .await;
    b.lose_node(first[0].0).await;
    let settled_at = Utc::now();
    let both = b
        .wait_for("a retry", async || {
            let d = dispatch_sites(&*b.log, id).await;
            (d.len() == 2).then_some(d)
        })
        .await;
    assert_eq!(both[1].1, "only");
    let retried_at = load::<Job>(&*b.log, both[1].0).await.unwrap().history[0].occurred_at;
    assert!(
        retried_at - settled_at >= chrono::Duration::milliseconds(250),
        "the retry waited out the backoff (300 ms): {}",
        retried_at - settled_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_are_held_from_placement_until_the_workflow_ends() {
    let b = Bench::new().await;
    let id = b
        .submit("version: v1\nname: v\nvolumes:\n  data: {size: 10GiB}\njobs:\n  a: {image: host, command: [\"true\"], mounts: {data: /data}}\n")
        .await;
    let first = b.dispatched_at_least("the dispatch", id, 1).await;
    let held: Vec<(String, String, u64)> = b
        .workflow(id)
        .await
        .allocated_volumes()
        .map(|a| (a.volume.clone(), a.site.clone(), a.bytes))
        .collect();
    assert_eq!(
        held,
        vec![("data".to_string(), "only".to_string(), 10u64 << 30)]
    );
    b.run_job(first[0].0, 0).await;
    b.wait_for("released after the end", async || {
        let wf = b.workflow(id).await;
        (wf.state() == Some(WorkflowState::Finished) && wf.allocated_volumes().next().is_none())
            .then_some(())
    })
    .await;
    let kinds: Vec<&'static str> = load::<Workflow>(&*b.log, id)
        .await
        .unwrap()
        .history
        .iter()
        .map(|e| e.payload.kind())
        .filter(|k| k.contains("volume"))
        .collect();
    assert_eq!(
        kinds,
        [
            "workflow.volume_allocated.v1",
            "workflow.volume_released.v1"
        ]
    );
}

const SPLIT: &str = r#"
version: v1
name: split
placement: {split: true}
volumes:
  data: {size: 1GiB}
jobs:
  prep: {image: host, command: ["true"], mounts: {data: /data}, resources: {cpus: 4, walltime: 1h}}
  train: {requires: [prep], image: host, command: ["true"], mounts: {data: /data}, resources: {cpus: 32, walltime: 1h}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_workflow_runs_each_job_at_its_planned_site_and_holds_volumes_where_used() {
    let (dir, log) = new_log().await;
    // Only `big` has 32 CPUs; `small` runs prep for a fifth of the price: 4 × 0.01
    // there against 4 × 0.05, and moving the volume costs nothing here. No data mover
    // runs: the test records the volume's arrival at big itself.
    register_sized_site(&*log, "small", "0.01", 8).await;
    register_sized_site(&*log, "big", "0.05", 64).await;
    let b = Bench::start(dir, log);
    let id = b.submit(SPLIT).await;
    let first = b
        .wait_for("prep dispatched", async || {
            let d = dispatch_sites(&*b.log, id).await;
            (!d.is_empty()).then_some(d)
        })
        .await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].1, "small");
    let wf = b.workflow(id).await;
    let placement = wf.placement().unwrap();
    assert_eq!(placement.site, "small");
    assert_eq!(placement.site_for("train"), "big");
    assert!(placement.storage_rate_at("big").is_some());
    let mut held: Vec<(String, String)> = wf
        .allocated_volumes()
        .map(|a| (a.volume.clone(), a.site.clone()))
        .collect();
    held.sort();
    assert_eq!(
        held,
        [
            ("data".to_string(), "big".to_string()),
            ("data".to_string(), "small".to_string())
        ]
    );

    b.run_job(first[0].0, 0).await;
    // The volume moves to big once prep is done; until the data mover says it arrived,
    // train waits, and says why.
    b.wait_for("train held for its data", async || {
        b.workflow(id)
            .await
            .waiting_for_data()
            .filter(|(job, _)| job == "train")
    })
    .await;
    assert_eq!(dispatch_sites(&*b.log, id).await.len(), 1, "train waits");
    execute::<Workflow, _>(
        &*b.log,
        id,
        &meridian_events::EventContext::new_chain("t"),
        |_| WorkflowCommand::RecordVolumeStaged {
            volume: "data".into(),
            site: "big".into(),
            transfers: vec![Uuid::now_v7()],
        },
    )
    .await
    .unwrap();
    let both = b
        .wait_for("train dispatched", async || {
            let d = dispatch_sites(&*b.log, id).await;
            (d.len() == 2).then_some(d)
        })
        .await;
    assert_eq!(both[1].1, "big", "train runs where the plan put it");
    b.run_job(both[1].0, 0).await;
    b.wait_for("finished with nothing held", async || {
        let wf = b.workflow(id).await;
        (wf.state() == Some(WorkflowState::Finished) && wf.allocated_volumes().next().is_none())
            .then_some(())
    })
    .await;
    b.stop.send(true).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_policy_keeps_its_work_off_sites_it_does_not_allow() {
    use meridian_events::aggregate::TenantCommand;
    use meridian_events::vocabulary::tenant::PlacementPolicy;
    let b = Bench::with_sites(&[("cheap", "1"), ("pricey", "2")]).await;
    tenant_t(
        &*b.log,
        TenantCommand::SetPolicy {
            tenant: "t".into(),
            policy: PlacementPolicy {
                sites: vec!["pricey".into()],
                ..PlacementPolicy::open()
            },
            set_by: "admin".into(),
        },
    )
    .await;
    let id = b.submit(DAG).await;
    let (site, why_not_cheap) = b
        .wait_for("placed", async || {
            let history = load::<Workflow>(&*b.log, id).await.unwrap().history;
            history.iter().find_map(|e| match &e.payload {
                Event::Workflow(WorkflowEvent::PlacementDecided {
                    site, explanation, ..
                }) => {
                    let cheap = explanation.candidates.iter().find(|c| c.site == "cheap")?;
                    Some((site.clone(), cheap.verdict.clone()))
                }
                _ => None,
            })
        })
        .await;
    assert_eq!(site, "pricey");
    assert_eq!(
        why_not_cheap,
        meridian_events::vocabulary::workflow::Verdict::Rejected {
            reason: "not among the sites the tenant's policy allows".into()
        }
    );
    b.stop.send(true).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_placement_keeps_a_volume_where_a_running_task_still_mounts_it() {
    let b = Bench::with_sites(&[("cheap", "1"), ("backup", "2")]).await;
    let id = b
        .submit(
            "version: v1\nname: two\nvolumes:\n  data: {size: 1GiB}\njobs:\n  a: {image: host, command: [\"true\"], mounts: {data: /data}, array: {start: 1, end: 2, parallelism: 2}}\n",
        )
        .await;
    let first = b
        .wait_for("both tasks dispatched", async || {
            let d = dispatch_sites(&*b.log, id).await;
            (d.len() == 2).then_some(d)
        })
        .await;
    assert!(first.iter().all(|(_, site)| site == "cheap"));
    // Task 1 loses its node: the workflow moves to backup, but task 2 still runs at
    // cheap with `data` mounted, so `data` stays held there too.
    b.lose_node(first[0].0).await;
    b.wait_for("the retry dispatched at backup", async || {
        let d = dispatch_sites(&*b.log, id).await;
        (d.len() == 3).then_some(())
    })
    .await;
    let held = |wf: &Workflow| {
        let mut h: Vec<String> = wf.allocated_volumes().map(|a| a.site.clone()).collect();
        h.sort();
        h
    };
    assert_eq!(held(&b.workflow(id).await), ["backup", "cheap"]);
    let retry = dispatch_sites(&*b.log, id).await[2].clone();
    assert_eq!(retry.1, "backup");
    b.run_job(first[1].0, 0).await;
    b.run_job(retry.0, 0).await;
    b.wait_for("finished with nothing held", async || {
        let wf = b.workflow(id).await;
        (wf.state() == Some(WorkflowState::Finished) && wf.allocated_volumes().next().is_none())
            .then_some(())
    })
    .await;
}

/// The events of workflow `id`, by type.
/// Runs `command` on tenant t, as its admin would.
async fn tenant_t(log: &dyn EventLog, command: meridian_events::aggregate::TenantCommand) {
    use meridian_events::aggregate::{tenant_id, Tenant};
    execute::<Tenant, _>(log, tenant_id("t"), &EventContext::new_chain("t"), |_| {
        command.clone()
    })
    .await
    .unwrap();
}

async fn kinds(log: &dyn EventLog, id: Uuid) -> Vec<&'static str> {
    load::<Workflow>(log, id)
        .await
        .unwrap()
        .history
        .iter()
        .map(|e| match &e.payload {
            Event::Workflow(w) => w.kind(),
            _ => "other",
        })
        .collect()
}

/// A site no adapter serves takes no work: the workflow waits, with the reason in its
/// history, and is placed as soon as an adapter says it serves the site, even by a
/// router started after the wait began.
#[tokio::test]
async fn work_waits_for_a_site_to_connect_and_goes_on_when_it_does() {
    let (mut b, site) = Bench::with_unconnected_site("far").await;
    let id = b
        .submit("version: v1\nname: w\njobs:\n  a: {image: host, command: [\"true\"]}\n")
        .await;
    let reason = b
        .wait_for("the wait", async || {
            b.workflow(id).await.waiting_reason().map(str::to_string)
        })
        .await;
    assert!(
        reason.contains("far") && reason.contains("no adapter serves"),
        "{reason}"
    );
    assert_eq!(b.workflow(id).await.state(), Some(WorkflowState::Submitted));
    // A router that starts now finds the waiting workflow again.
    b.restart().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        kinds(&*b.log, id).await,
        ["workflow.submitted.v1", "workflow.placement_waiting.v1"],
        "waiting is recorded once"
    );
    connect(&*b.log, site, 60).await;
    b.wait_for("the placement", async || {
        (b.workflow(id).await.state() != Some(WorkflowState::Submitted)).then_some(())
    })
    .await;
    assert_eq!(b.workflow(id).await.placement().unwrap().site, "far");
    let _ = b.stop.send(true);
}

/// Workflows submitted while no router ran (after its snapshot) are placed by the next
/// one from what its start read, without reading each of them again; one submitted
/// before the snapshot is read, and placed all the same.
#[tokio::test]
async fn a_started_router_places_the_backlog_it_folded_without_reading_it_again() {
    let (mut b, site) = Bench::with_unconnected_site("far").await;
    const ONE_JOB: &str = "version: v1\nname: w\njobs:\n  a: {image: host, command: [\"true\"]}\n";
    let before = b.submit(ONE_JOB).await;
    b.wait_for("the wait", async || {
        b.workflow(before)
            .await
            .waiting_reason()
            .map(str::to_string)
    })
    .await;
    b.stop.send(true).unwrap();
    (&mut b.router).await.unwrap();
    b.router = tokio::spawn(async {}); // stopped: the restart below has none to stop
    RouterStart::load(&*b.log, 0).await.unwrap(); // saves a snapshot
    let backlog = [b.submit(ONE_JOB).await, b.submit(ONE_JOB).await];

    let seen = Arc::new(Intercepted::new(b.log.clone()));
    b.restart_on(seen.clone()).await;
    connect(&*b.log, site, 60).await;
    for id in backlog.iter().chain([&before]) {
        b.wait_for("the placement", async || {
            b.workflow(*id).await.placement().map(|_| ())
        })
        .await;
    }
    let read = seen.aggregates_read();
    let workflow =
        |id| meridian_events::AggregateRef::new(meridian_events::AggregateKind::Workflow, id);
    assert!(read.contains(&workflow(before)), "{read:?}");
    for id in backlog {
        assert!(!read.contains(&workflow(id)), "{id} read again: {read:?}");
    }
    let _ = b.stop.send(true);
}

/// A start folds up to the head it found and serves the rest: with a writer appending
/// a submission after every page the start reads, a start that followed the head never
/// ended. The workflows submitted before and during the start are placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_while_writers_append_ends_at_the_head_it_found() {
    const ONE_JOB: &str = "version: v1\nname: w\njobs:\n  a: {image: host, command: [\"true\"]}\n";
    let (dir, log) = new_log().await;
    register_site(&*log, "only", "1").await;
    let b = Bench {
        log: log.clone(),
        stop: watch::channel(false).0,
        router: tokio::spawn(async {}),
        _dir: dir,
    };
    let before = b.submit(ONE_JOB).await;

    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let during = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (writer, on, submitted) = (log.clone(), flooding.clone(), during.clone());
    let spec = meridian_spec::parse(ONE_JOB).unwrap();
    let seen = Intercepted::new(log.clone()).after_read(Box::new(move || {
        let (log, on, submitted, spec) =
            (writer.clone(), on.clone(), submitted.clone(), spec.clone());
        Box::pin(async move {
            if !on.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let id = Uuid::now_v7();
            execute::<Workflow, _>(&*log, id, &EventContext::new_chain("t"), |_| {
                WorkflowCommand::Submit {
                    workflow_id: id,
                    spec: spec.clone(),
                    submitted_by: "writer".into(),
                    idempotency_key: None,
                    parent_workflow_id: None,
                }
            })
            .await
            .unwrap();
            submitted.lock().unwrap().push(id);
        })
    }));
    let started = tokio::time::timeout(Duration::from_secs(20), Router::new(Arc::new(seen))).await;
    flooding.store(false, std::sync::atomic::Ordering::SeqCst);
    let router = started
        .expect("the start did not end while a writer appended")
        .unwrap();

    let (stop, stopped) = watch::channel(false);
    let running = tokio::spawn(router.run(stopped));
    let during = during.lock().unwrap().clone();
    assert!(!during.is_empty(), "the writer appended during the start");
    for id in during.iter().chain([&before]) {
        b.wait_for("the placement", async || {
            b.workflow(*id).await.placement().map(|_| ())
        })
        .await;
    }
    stop.send(true).unwrap();
    running.await.unwrap().unwrap();
}

/// A site that refuses a job for capacity sends it back to placement, and the router
/// places it at the other site.
#[tokio::test]
async fn a_refusal_for_capacity_re_places_the_work() {
    let b = Bench::with_sites(&[("cheap", "1"), ("dear", "2")]).await;
    let id = b
        .submit("version: v1\nname: w\njobs:\n  a: {image: host, command: [\"true\"]}\n")
        .await;
    let first = b
        .wait_for("the dispatch", async || {
            b.dispatched(id).await.first().cloned()
        })
        .await;
    execute::<Job, _>(&*b.log, first.0, &EventContext::new_chain("t"), |_| {
        JobCommand::Fail {
            ended_at: Utc::now(),
            exit_code: None,
            reason: meridian_events::FailureReason::SiteRefused {
                message: "quota exhausted".into(),
            },
            usage: Usage::default(),
        }
    })
    .await
    .unwrap();
    b.wait_for("the re-placement", async || {
        let wf = b.workflow(id).await;
        (wf.placement().unwrap().site == "dear").then_some(())
    })
    .await;
    let second = b
        .wait_for("the second dispatch", async || {
            b.dispatched(id).await.get(1).cloned()
        })
        .await;
    assert_eq!(second.1, "a");
    let _ = b.stop.send(true);
}

async fn register_unconnected_site(log: &dyn EventLog, name: &str) -> Uuid {
    register(log, name, "1", 8).await
}

/// A tenant's GPU limit holds tasks back rather than refusing them: with room for two
/// tasks of two GPUs, the third waits, its workflow says why, and it is released when one
/// ends. A restarted router still counts what is in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_gpu_limit_holds_tasks_back_until_gpus_free_up() {
    use meridian_events::aggregate::TenantCommand;
    use meridian_events::vocabulary::tenant::TenantLimits;
    let (dir, log) = new_log().await;
    let prices = PriceSheet {
        currency: Currency::USD,
        effective_from: Utc::now() - chrono::Duration::days(1),
        source: "test".into(),
        compute: vec![ComputeOffer {
            offer: "node".into(),
            pricing: ComputePricing::Resource {
                per_core_hour: Decimal::ONE,
                per_gib_memory_hour: Decimal::ZERO,
                per_gpu_hour: Decimal::ONE,
            },
        }],
        storage_per_gib_hour: Decimal::ZERO,
        egress_per_gb: Decimal::ZERO,
        egress_by_destination: None,
        egress_tiers: Vec::new(),
    };
    let site = Uuid::now_v7();
    execute::<Site, _>(&*log, site, &EventContext::new_chain("system"), |_| {
        SiteCommand::Register {
            name: "gpu".into(),
            kind: SiteKind::Local,
            region: "here".into(),
            jurisdiction: "eu".into(),
            credentials_secret: None,
            labels: BTreeMap::from([
                ("max_cpus".into(), "64".into()),
                ("gpus".into(), "8".into()),
            ]),
            prices: Some(prices.clone()),
        }
    })
    .await
    .unwrap();
    connect(&*log, site, 86_400).await;
    tenant_t(
        &*log,
        TenantCommand::SetLimits {
            tenant: "t".into(),
            limits: TenantLimits {
                concurrent_gpus: Some(4),
                ..TenantLimits::default()
            },
            set_by: "admin".into(),
        },
    )
    .await;
    let mut b = Bench::start(dir, log);
    let id = b
        .submit(
            "version: v1\nname: g\njobs:\n  train:\n    image: host\n    command: [\"true\"]\n    array: {start: 1, end: 3, parallelism: 3}\n    resources: {gpus: {count: 2, vendor: any}}\n",
        )
        .await;
    let two = b.dispatched_at_least("two tasks dispatched", id, 2).await;
    let held = b
        .wait_for("the third held", async || {
            let history = load::<Workflow>(&*b.log, id).await.unwrap().history;
            history.iter().find_map(|e| match &e.payload {
                Event::Workflow(WorkflowEvent::ReleaseHeld { reason, .. }) => Some(reason.clone()),
                _ => None,
            })
        })
        .await;
    assert_eq!(
        held,
        "held: tenant t's GPUs in use are at its limit of 4, and the next task needs 2; it starts as others end"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.dispatched(id).await.len(), 2, "only 4 GPUs at once");
    // A start's fold of the log counts them from the dispatches it reads.
    let whole = RouterStart::fold_whole_log(&*b.log).await.unwrap();
    let in_use = whole
        .work
        .gpus
        .get("t")
        .map(|jobs| jobs.values().sum::<u32>());
    assert_eq!(in_use, Some(4), "{:?}", whole.work.gpus);

    // Restarted, the router still counts the four GPUs in use.
    b.restart().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(b.dispatched(id).await.len(), 2, "still 4 GPUs at once");

    // Raising the limit frees the held task without any run ending.
    tenant_t(
        &*b.log,
        TenantCommand::SetLimits {
            tenant: "t".into(),
            limits: TenantLimits {
                concurrent_gpus: Some(6),
                ..TenantLimits::default()
            },
            set_by: "admin".into(),
        },
    )
    .await;
    let three = b
        .wait_for("the third released", async || {
            let d = b.dispatched(id).await;
            (d.len() == 3).then_some(d)
        })
        .await;
    b.run_job(two[0].0, 0).await;
    b.run_job(two[1].0, 0).await;
    b.run_job(three[2].0, 0).await;
    b.wait_for("the workflow finishes", async || {
        (b.workflow(id).await.state() == Some(WorkflowState::Finished)).then_some(())
    })
    .await;
    b.stop.send(true).unwrap();
}

/// The largest batch, with the longest names the spec and catalogue allow, is one commit
/// the log takes (both backends refuse a commit over `MAX_COMMIT_BYTES`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_array_batch_fits_in_one_commit() {
    let (dir, log) = new_log().await;
    let long = "n".repeat(63);
    let site = register(&*log, &"s".repeat(63), "1", 8).await;
    connect_taking_arrays(&*log, site, 86_400, Some(5000)).await;
    let b = Bench::start(dir, log);
    let yaml = format!(
        "version: v1\nname: {long}\njobs:\n  {long}:\n    image: host\n    command: [\"true\"]\n    array: {{start: 4000000000, end: 4000001499, parallelism: 1500}}\n"
    );
    let id = b.submit(&yaml).await;
    let first = b
        .wait_for("the first batch", async || {
            let d = batches(&*b.log, id).await;
            (d.len() >= 1000).then_some(d)
        })
        .await;
    let batch = first[0].1.expect("in a batch");
    assert!(first[..1000].iter().all(|d| d.1 == Some(batch)));
    // The releases of one commit (the router may join them to the placement before
    // them, where both fit), and their size alone: what a batch adds to a commit.
    let commits = b.log.read_from(0, 100_000).await.unwrap();
    let releases: Vec<Vec<&meridian_events::RawEnvelope>> = commits
        .iter()
        .map(|c| {
            c.events
                .iter()
                .filter(|e| e.payload["type"] == "workflow.job_released.v1")
                .collect()
        })
        .collect();
    let counts: std::collections::BTreeSet<usize> = releases.iter().map(Vec::len).collect();
    assert!(
        counts.contains(&1000),
        "one commit of 1000 releases: {counts:?}"
    );
    // With room to spare for longer traces and tenants.
    let largest = releases
        .iter()
        .map(|r| serde_json::to_vec(r).unwrap().len())
        .max()
        .unwrap();
    assert!(
        largest < meridian_eventlog::MAX_COMMIT_BYTES * 3 / 4,
        "{largest} bytes"
    );
    let stored = commits
        .iter()
        .map(|c| serde_json::to_vec(&c.events).unwrap().len())
        .max()
        .unwrap();
    assert!(
        stored <= meridian_eventlog::MAX_COMMIT_BYTES,
        "{stored} bytes"
    );
    let _ = b.stop.send(true);
}

/// The router holds what it decides for a delivered batch and appends it afterwards; a
/// commit that meets a conflict (here a cancel that came first) is not stored, nor is
/// anything decided after it for that workflow, and the workflow is decided again from
/// the log. Other work goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_that_meets_a_conflict_is_made_again_from_the_log() {
    // A user cancels the first workflow the router places just before the router's
    // placement is appended: that commit then meets a conflict.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let b = Bench::seen_through(&[("only", "1")], |inner| {
        let (armed, log) = (armed.clone(), inner.clone());
        let hook: BeforeAppend = Box::new(move |events: &[RawEnvelope]| {
            let placing = events.iter().any(|e| {
                e.payload.get("type").and_then(|t| t.as_str())
                    == Some("workflow.placement_decided.v1")
            });
            let (log, id) = (log.clone(), events[0].aggregate.id);
            let cancel = placing && armed.swap(false, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                if cancel {
                    execute::<Workflow, _>(&*log, id, &EventContext::new_chain("t"), |_| {
                        WorkflowCommand::RequestCancel {
                            by: "tester".into(),
                            reason: Some("changed my mind".into()),
                        }
                    })
                    .await
                    .unwrap();
                }
            })
        });
        Arc::new(Intercepted::new(inner).before_append(hook))
    })
    .await;
    let cancelled = b.submit(DAG).await;
    b.wait_for("the cancel to end the workflow", async || {
        (b.workflow(cancelled).await.state() == Some(WorkflowState::Cancelled)).then_some(())
    })
    .await;
    assert!(!armed.load(std::sync::atomic::Ordering::SeqCst));
    let other = b.submit(DAG).await;
    b.wait_for("the next workflow's first job", async || {
        (!b.dispatched(other).await.is_empty()).then_some(())
    })
    .await;
    let history = load::<Workflow>(&*b.log, cancelled).await.unwrap().history;
    let kinds: Vec<&str> = history
        .iter()
        .map(|e| match &e.payload {
            Event::Workflow(WorkflowEvent::Submitted { .. }) => "submitted",
            Event::Workflow(WorkflowEvent::CancelRequested { .. }) => "cancel requested",
            Event::Workflow(WorkflowEvent::Cancelled { .. }) => "cancelled",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["submitted", "cancel requested", "cancelled"]);
    assert!(
        b.dispatched(cancelled).await.is_empty(),
        "nothing decided after the refused placement was stored"
    );
}

/// A placement that meets a conflict more times in a row than the router decides again
/// at once is decided again after a pause, not left for the workflow's next event: a
/// workflow just submitted has none coming, and would wait for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_that_keeps_meeting_conflicts_is_decided_again_after_a_pause() {
    let refused = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let b = Bench::seen_through(&[("only", "1")], |inner| {
        let refused = refused.clone();
        let fail: FailAppend = Box::new(move |events: &[RawEnvelope]| {
            let placing = events
                .iter()
                .any(|e| kind(e) == "workflow.placement_decided.v1");
            // More than the 8 rounds decided again at once.
            (placing && refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 10).then(|| {
                LogError::Conflict {
                    aggregate: events[0].aggregate,
                    expected: events[0].sequence - 1,
                    actual: events[0].sequence,
                }
            })
        });
        Arc::new(Intercepted::new(inner).failing(fail))
    })
    .await;
    let id = b.submit(DAG).await;
    b.dispatched_at_least("prep, after the conflicts", id, 1)
        .await;
    assert!(refused.load(std::sync::atomic::Ordering::SeqCst) > 10);
    let _ = b.stop.send(true);
}

/// Decisions travel to the log while the router reads and decides the next batch: the
/// first workflow's placement is held on its way until the second workflow, submitted
/// meanwhile, is placed and stored. A router that waited for each batch's appends before
/// reading on would hold both for the 10 s the hook waits, and store the first first.
#[tokio::test]
async fn a_batch_is_decided_while_the_last_ones_decisions_are_on_the_way() {
    let first: Arc<std::sync::Mutex<Option<Uuid>>> = Arc::default();
    let b = Bench::seen_through(&[("only", "1")], |inner| {
        let (first, log) = (first.clone(), inner.clone());
        let hook: BeforeAppend = Box::new(move |events: &[RawEnvelope]| {
            let placing = events
                .iter()
                .any(|e| kind(e) == "workflow.placement_decided.v1");
            let mut first = first.lock().unwrap();
            let hold = placing && first.is_none();
            if hold {
                *first = Some(events[0].aggregate.id);
            }
            let log = log.clone();
            Box::pin(async move {
                if !hold {
                    return;
                }
                // The second workflow arrives while this placement is held.
                let second = submit_to(&*log, DAG).await;
                let placed = async {
                    while !placements(&*log).await.contains(&second) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                };
                let _ = tokio::time::timeout(Duration::from_secs(10), placed).await;
            })
        });
        Arc::new(Intercepted::new(inner).before_append(hook))
    })
    .await;
    let held = b.submit(DAG).await;
    b.wait_for("the held placement to be stored", async || {
        placements(&*b.log).await.contains(&held).then_some(())
    })
    .await;
    assert_eq!(*first.lock().unwrap(), Some(held));
    let placed = placements(&*b.log).await;
    assert_eq!(placed.len(), 2, "{placed:?}");
    assert_eq!(
        placed[1], held,
        "the second workflow's placement is stored first"
    );
}

/// The event's type.
fn kind(e: &RawEnvelope) -> &str {
    e.payload
        .get("type")
        .and_then(|t| t.as_str())
        .unwrap_or_default()
}

/// The workflows placed, in the order their placements were stored.
async fn placements(log: &dyn EventLog) -> Vec<Uuid> {
    log.read_from(0, 10_000)
        .await
        .unwrap()
        .iter()
        .flat_map(|c| c.events.iter())
        .filter(|e| kind(e) == "workflow.placement_decided.v1")
        .map(|e| e.aggregate.id)
        .collect()
}

/// The log fails one dispatch while other workflows' decisions are in flight: the
/// router serves again, and every workflow still gets its first job dispatched, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_among_decisions_in_flight_leaves_nothing_undecided() {
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let b = Bench::seen_through(&[("only", "1")], |inner| {
        let failed = failed.clone();
        let fail: FailAppend = Box::new(move |events: &[RawEnvelope]| {
            let dispatch = events.iter().any(|e| kind(e) == "job.dispatched.v1");
            (dispatch && !failed.swap(true, std::sync::atomic::Ordering::SeqCst))
                .then(|| LogError::Unavailable("the test's log failed this append".into()))
        });
        Arc::new(Intercepted::new(inner).failing(fail))
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(b.submit(DAG).await);
    }
    for id in &ids {
        let first = b.dispatched_at_least("prep dispatched", *id, 1).await;
        assert_eq!(
            first.iter().map(|d| d.1.as_str()).collect::<Vec<_>>(),
            ["prep"],
            "workflow {id}: one dispatch of its first job"
        );
    }
    assert!(
        failed.load(std::sync::atomic::Ordering::SeqCst),
        "an append failed"
    );
}
