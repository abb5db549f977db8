//! End to end with one process per service, over a real nats-server (JetStream) and the
//! machine's PostgreSQL: `meridian server intake|router|accounting|adapter`.

mod common;

use common::*;
use meridian_eventlog::testkit::NatsServer;

struct Deployment {
    server: String,
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
    let procs = vec![
        Proc::spawn(
            "intake",
            dir.path(),
            &[
                "server",
                "intake",
                "--listen",
                &listen,
                "--admin-token-file",
                "admin-token",
                "--credential-key-file",
                "credential.key",
            ],
            &env,
        ),
        Proc::spawn("router", dir.path(), &["server", "router"], &env),
        Proc::spawn("accounting", dir.path(), &["server", "accounting"], &env),
        Proc::spawn(
            "adapter",
            dir.path(),
            &[
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
