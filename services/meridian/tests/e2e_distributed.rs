//! End to end with one process per service, over a real nats-server (JetStream) and the
//! machine's PostgreSQL: `meridian server intake|router|accounting|adapter`.

mod common;

use common::*;
use meridian_eventlog::testkit::NatsServer;

struct Deployment {
    server: String,
    /// Each service's `--ops-listen` address.
    ops: Vec<(&'static str, String)>,
    dir: tempfile::TempDir,
    database: String,
    _procs: Vec<Proc>,
    _nats: NatsServer,
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self._procs.clear();
        let database = self.database.clone();
        let _ = tokio::runtime::Runtime::new()
            .map(|rt| rt.block_on(meridian_store::testing::drop_postgres(&database)));
    }
}

fn deploy() -> Deployment {
    let nats = NatsServer::start().expect("a nats-server 2.10+ (set MERIDIAN_NATS_SERVER)");
    let database = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(meridian_store::testing::fresh_postgres())
        .expect("PostgreSQL (set MERIDIAN_TEST_POSTGRES)");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = nats.url();
    let env = [
        ("MERIDIAN_NATS_URL", url.as_str()),
        ("MERIDIAN_DATABASE_URL", database.as_str()),
    ];
    let root = dir.path().join("site");
    // One credential key for the intake and the adapter, made before either starts.
    std::fs::write(dir.path().join("credential.key"), "ab".repeat(32)).unwrap();
    let server = format!("http://127.0.0.1:{port}");
    let ops: Vec<(&'static str, String)> = ["intake", "router", "accounting", "adapter"]
        .into_iter()
        .map(|s| (s, format!("127.0.0.1:{}", free_port())))
        .collect();
    let procs = vec![
        Proc::spawn(
            "intake",
            dir.path(),
            &[
                "server",
                "intake",
                "--ops-listen",
                &ops[0].1,
                "--listen",
                &listen,
                "--admin-token-file",
                "admin-token",
                "--credential-key-file",
                "credential.key",
            ],
            &env,
        ),
        Proc::spawn(
            "router",
            dir.path(),
            &["server", "router", "--ops-listen", &ops[1].1],
            &env,
        ),
        Proc::spawn(
            "accounting",
            dir.path(),
            &["server", "--ops-listen", &ops[2].1, "accounting"],
            &env,
        ),
        Proc::spawn(
            "adapter",
            dir.path(),
            &[
                "server",
                "adapter",
                "--ops-listen",
                &ops[3].1,
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
            ],
            &env,
        ),
    ];
    wait_ready(&server, &procs.iter().collect::<Vec<_>>());
    // The adapter registers its site at start; placement needs it in the catalogue.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !procs[3].output().contains("registered the local site") {
        assert!(
            std::time::Instant::now() < deadline,
            "the adapter never registered its site:\n{}",
            procs[3].output()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Deployment {
        server,
        ops,
        dir,
        database,
        _procs: procs,
        _nats: nats,
    }
}

#[test]
fn distributed_services_run_a_dag_fail_a_job_cancel_and_bill() {
    let d = deploy();
    dag_and_array(&d.server, d.dir.path());
    failing_job(&d.server, d.dir.path());
    cancel_running(&d.server, d.dir.path());
    garbage_is_refused(&d.server, d.dir.path());
    health_and_metrics(d);
}

/// Each service's `/healthz`, `/readyz` and `/metrics`; readiness goes when the log does.
fn health_and_metrics(mut d: Deployment) {
    let get = |address: &str, path: &str| http_get(address, path).unwrap_or_default();
    let status = |response: &str| response.split_whitespace().nth(1).unwrap_or("").to_string();
    for (service, address) in &d.ops {
        assert_eq!(status(&get(address, "/healthz")), "200", "{service}");
        // Ready once its read models have caught up with the log.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let ready = get(address, "/readyz");
            if status(&ready) == "200" {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{service}: {ready}");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let metrics = get(address, "/metrics");
        assert!(
            metrics.contains(&format!(
                "meridian_log_reachable{{service=\"{service}\"}} 1"
            )),
            "{service}: {metrics}"
        );
        assert!(
            metrics.contains("# TYPE meridian_log_head gauge"),
            "{metrics}"
        );
    }
    let intake = get(&d.ops[0].1, "/metrics");
    let finished = intake
        .lines()
        .find(|l| l.starts_with("meridian_workflows{service=\"intake\",state=\"finished\"}"))
        .unwrap_or_else(|| panic!("{intake}"));
    assert!(!finished.ends_with(" 0"), "{finished}");
    assert!(
        intake.contains("meridian_projection_lag_events{service=\"intake\",projection="),
        "{intake}"
    );
    let accounting = get(&d.ops[2].1, "/metrics");
    assert!(
        accounting.contains(&format!(
            "meridian_projection_position{{service=\"accounting\",projection=\"{}\"}}",
            meridian_accounting::NAME
        )),
        "{accounting}"
    );
    // Without the log, a service is alive but not ready, and says why.
    d._nats.kill();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let ready = get(&d.ops[1].1, "/readyz");
        if status(&ready) == "503" {
            assert!(ready.contains("the event log"), "{ready}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{ready}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(status(&get(&d.ops[1].1, "/healthz")), "200");
}

/// `meridian admin migrate` creates every service's tables in a new database, again
/// without harm, and says what is wrong with a database it cannot reach.
#[test]
fn admin_migrate_creates_every_table_once() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let database = rt
        .block_on(meridian_store::testing::fresh_postgres())
        .expect("PostgreSQL (set MERIDIAN_TEST_POSTGRES)");
    let migrate = |url: &str| {
        std::process::Command::new(BIN)
            .args(["admin", "migrate", "--database-url", url])
            .output()
            .unwrap()
    };
    for _ in 0..2 {
        let out = migrate(&database);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listed = std::process::Command::new("psql")
        .args([
            database.as_str(),
            "-Atc",
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'",
        ])
        .output()
        .expect("psql");
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let tables: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    for want in [
        "intake_workflows",
        "intake_idempotency",
        "audit_records",
        "ledger_charges",
        "ledger_applied",
        "job_logs",
        "run_reports",
        "projection_positions",
    ] {
        assert!(tables.iter().any(|t| t == want), "no {want} in {tables:?}");
    }
    let out = migrate("postgres://nobody@127.0.0.1:1/none");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("connecting to the database"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rt.block_on(meridian_store::testing::drop_postgres(&database));
}
