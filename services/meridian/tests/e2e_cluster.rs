//! Meridian on its production shape: a three-server JetStream cluster (three real
//! `nats-server` processes on loopback, each run from `infra/nats/cluster.conf`), the
//! event stream at R3, the machine's PostgreSQL, one process per service. A workflow runs
//! to its end while one NATS server is killed (SIGKILL) and later restarted, and while
//! each Meridian service in turn is killed with SIGKILL and restarted. Afterwards nothing
//! is lost (every task finished), no task ran twice, and the ledger equals a clean
//! rebuild of the same log.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use meridian_accounting::{snapshot, Ledger, NAME};
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::testkit::NatsCluster;
use meridian_eventlog::EventLog;
use meridian_store::{catch_up, Store};
use serde_json::Value;

const TASKS: u32 = 8;

/// One service's command line, to start it again after a kill.
struct Service {
    name: &'static str,
    args: Vec<String>,
    proc: Option<Proc>,
    starts: u32,
}

impl Service {
    fn start(&mut self, dir: &Path, env: &[(&str, &str)]) {
        self.starts += 1;
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.proc = Some(Proc::spawn(
            &format!("{}-{}", self.name, self.starts),
            dir,
            &args,
            env,
        ));
    }

    fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    fn output(&self) -> String {
        self.proc.as_ref().map(Proc::output).unwrap_or_default()
    }
}

/// The workflow's status, or `None` while the API is down (it is killed in turn too).
fn status(server: &str, id: &str) -> Option<Value> {
    let out = cli(server, &["status", id, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

fn wait_running(server: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if status(server, id).is_some_and(|s| s["tasks"]["running"].as_u64() > Some(0)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("workflow {id} never ran");
}

#[test]
fn a_workflow_survives_a_nats_server_and_every_service_killed_in_turn() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra/nats/cluster.conf");
    let mut cluster =
        NatsCluster::start(&config, 3).expect("a nats-server 2.10+ (set MERIDIAN_NATS_SERVER)");
    let database = rt
        .block_on(meridian_store::testing::fresh_postgres())
        .expect("PostgreSQL (set MERIDIAN_TEST_POSTGRES)");
    let reference = rt
        .block_on(meridian_store::testing::fresh_postgres())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let urls = cluster.urls();
    let env = [
        ("MERIDIAN_NATS_URL", urls.as_str()),
        ("MERIDIAN_REPLICAS", "3"),
        ("MERIDIAN_DATABASE_URL", database.as_str()),
    ];
    std::fs::write(dir.path().join("credential.key"), "cd".repeat(32)).unwrap();
    let port = free_port();
    let server = format!("http://127.0.0.1:{port}");
    let root = dir.path().join("site");
    let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let mut services = [
        Service {
            name: "intake",
            args: strings(&[
                "server",
                "intake",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-token-file",
                "admin-token",
                "--credential-key-file",
                "credential.key",
            ]),
            proc: None,
            starts: 0,
        },
        Service {
            name: "router",
            args: strings(&["server", "router"]),
            proc: None,
            starts: 0,
        },
        Service {
            name: "accounting",
            args: strings(&["server", "accounting"]),
            proc: None,
            starts: 0,
        },
        Service {
            name: "adapter",
            args: strings(&[
                "server",
                "adapter",
                "--site",
                "local",
                "--cpus",
                "2",
                "--root",
                root.to_str().unwrap(),
                "--credential-key-file",
                "credential.key",
                "--server",
                &server,
            ]),
            proc: None,
            starts: 0,
        },
    ];
    for s in services.iter_mut() {
        s.start(dir.path(), &env);
    }
    wait_ready(&server, &[services[0].proc.as_ref().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !services[3].output().contains("registered the local site") {
        assert!(Instant::now() < deadline, "{}", services[3].output());
        std::thread::sleep(Duration::from_millis(100));
    }

    // Each task appends its index to a file outside Meridian: a task run twice shows.
    let ran = dir.path().join("ran");
    let file = write(
        dir.path(),
        "slow.yaml",
        &format!(
            "version: v1\nname: through-faults\njobs:\n  work:\n    image: host\n    command: [sh, -c, \"echo $ARRAY_INDEX >> {}; sleep 3\"]\n    array: {{start: 1, end: {TASKS}, parallelism: 2}}\n    resources: {{cpus: 1, memory: 64MiB, walltime: 5m}}\n",
            ran.display()
        ),
    );
    let id = submit(&server, &file);
    wait_running(&server, &id);

    // One NATS server dies mid-run and comes back.
    cluster.kill(0);
    std::thread::sleep(Duration::from_secs(2));
    cluster.resume(0).unwrap();
    // Then each service in turn.
    for s in services.iter_mut() {
        s.kill();
        std::thread::sleep(Duration::from_millis(800));
        s.start(dir.path(), &env);
        std::thread::sleep(Duration::from_millis(700));
    }

    // The faults came while it ran (else this test tests nothing).
    let deadline = Instant::now() + Duration::from_secs(30);
    let during = loop {
        if let Some(s) = status(&server, &id) {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the API never came back:\n{}",
            services[0].output()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        during["tasks"]["succeeded"].as_u64() < Some(TASKS as u64),
        "the workflow ended before the last fault: {during:#}"
    );
    // The log is the stream at R3 on the cluster.
    let jsz = http_get(&cluster.monitor(1), "/jsz?streams=true&config=true").unwrap();
    assert!(
        jsz.contains("\"num_replicas\": 3") || jsz.contains("\"num_replicas\":3"),
        "{jsz}"
    );

    // Nothing is lost: every task finished.
    let deadline = Instant::now() + Duration::from_secs(180);
    let last = loop {
        if let Some(s) = status(&server, &id) {
            if s["state"]
                .as_str()
                .is_some_and(|st| st != "running" && st != "placed" && st != "submitted")
            {
                break s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the workflow never ended: {:#}\nran: {:?}\nevents: {}\n{}",
            status(&server, &id).unwrap_or_default(),
            std::fs::read_to_string(&ran),
            String::from_utf8_lossy(&cli(&server, &["events", &id]).stdout),
            services
                .iter()
                .map(|s| format!("--- {} ---\n{}", s.name, s.output()))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(last["state"], "finished", "{last:#}");
    assert_eq!(last["tasks"]["succeeded"], TASKS, "{last:#}");

    // No task ran twice.
    let mut indices: Vec<u32> = std::fs::read_to_string(&ran)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    indices.sort();
    assert_eq!(
        indices,
        (1..=TASKS).collect::<Vec<_>>(),
        "a task ran twice or never"
    );

    // The ledger, through its kill, equals a clean rebuild of the same log.
    let log = rt
        .block_on(NatsLog::connect(NatsConfig {
            url: urls.clone(),
            replicas: 3,
            ..NatsConfig::default()
        }))
        .unwrap();
    let store = rt.block_on(Store::connect(&database)).unwrap();
    let head = rt.block_on(log.head()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while rt.block_on(store.position(NAME)).unwrap_or(0) < head {
        assert!(Instant::now() < deadline, "{}", services[2].output());
        std::thread::sleep(Duration::from_millis(100));
    }
    let clean = rt.block_on(Store::connect(&reference)).unwrap();
    rt.block_on(catch_up(&clean, &log, &Ledger)).unwrap();
    let (survived, rebuilt) = (
        rt.block_on(snapshot(&store)).unwrap(),
        rt.block_on(snapshot(&clean)).unwrap(),
    );
    assert_eq!(survived.lines, rebuilt.lines);
    // Two lines (cores, memory) per task, each billed once.
    assert_eq!(
        survived.lines.len(),
        2 * TASKS as usize,
        "{:#?}",
        survived.lines
    );

    for s in services.iter_mut() {
        s.kill();
    }
    rt.block_on(async {
        store.pool().close().await;
        clean.pool().close().await;
        meridian_store::testing::drop_postgres(&database).await;
        meridian_store::testing::drop_postgres(&reference).await;
    });
}
