//! End to end with one process per service, over a real nats-server (JetStream) and the
//! machine's PostgreSQL: `meridian server intake|router|accounting|adapter`, each
//! exporting its spans to a local OTLP receiver.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};

use common::*;
use meridian_eventlog::testkit::NatsServer;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// One span as received: the service that sent it, its name, ids and attributes.
#[derive(Debug, Clone)]
struct ReceivedSpan {
    service: String,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    attributes: HashMap<String, String>,
}

/// An OTLP/HTTP receiver (protobuf, `POST /v1/traces`), as a collector takes spans.
struct OtlpReceiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

impl OtlpReceiver {
    fn start() -> OtlpReceiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || serve_otlp(stream, &kept));
            }
        });
        OtlpReceiver { endpoint, spans }
    }

    fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }
}

/// Answers each request on one connection (the exporter keeps it alive).
fn serve_otlp(stream: std::net::TcpStream, kept: &Mutex<Vec<ReceivedSpan>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let status = if request_line.starts_with("POST /v1/traces ") {
            let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
            kept.lock().unwrap().extend(received(request));
            "200 OK"
        } else {
            "404 Not Found"
        };
        write!(
            writer,
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        )
        .unwrap();
    }
}

fn received(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(Value::StringValue(s)) => s.clone(),
        other => format!("{other:?}"),
    };
    let mut spans = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(|a| text(&a.value))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace: span.trace_id,
                    id: span.span_id,
                    parent: span.parent_span_id,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(&a.value)))
                        .collect(),
                });
            }
        }
    }
    spans
}

struct Deployment {
    server: String,
    /// Each service's `--ops-listen` address.
    ops: Vec<(&'static str, String)>,
    dir: tempfile::TempDir,
    database: String,
    _procs: Vec<Proc>,
    _nats: NatsServer,
    traces: OtlpReceiver,
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
    let traces = OtlpReceiver::start();
    let env = [
        ("MERIDIAN_NATS_URL", url.as_str()),
        ("MERIDIAN_DATABASE_URL", database.as_str()),
        // The standard variables: where spans go, and no long wait before they do.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", traces.endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let root = dir.path().join("site");
    std::fs::write(
        dir.path().join("local.yaml"),
        format!("root: {}\ncpus: 2\n", root.display()),
    )
    .unwrap();
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
                // A local site's own file, as the systemd unit passes it.
                "--adapter-config",
                "local.yaml",
                "--credential-key-file",
                "credential.key",
                "--server",
                &server,
            ],
            &env,
        ),
    ];
    wait_ready(&server, &procs.iter().collect::<Vec<_>>());
    assert!(
        root.is_dir(),
        "the local site keeps its jobs where its file says"
    );
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
        traces,
    }
}

#[test]
fn distributed_services_run_a_dag_fail_a_job_cancel_and_bill() {
    let d = deploy();
    let dag = dag_and_array(&d.server, d.dir.path());
    one_trace_follows_the_workflow(&d, &dag);
    failing_job(&d.server, d.dir.path());
    cancel_running(&d.server, d.dir.path());
    garbage_is_refused(&d.server, d.dir.path());
    health_and_metrics(d);
}

/// The workflow's trace, as the services exported it: its submission at the intake is
/// the root; the router's placement, the adapter's submission of each job and the
/// accounting's bill of each are in the same trace, each linked to its root through
/// the spans that caused it, across four processes.
fn one_trace_follows_the_workflow(d: &Deployment, workflow: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let spans = d.traces.spans();
        let root = spans.iter().find(|s| {
            s.name == "submit workflow"
                && s.attributes.get("meridian.workflow.id").map(String::as_str) == Some(workflow)
        });
        let trace: Vec<&ReceivedSpan> = root
            .map(|r| spans.iter().filter(|s| s.trace == r.trace).collect())
            .unwrap_or_default();
        let named = |name: &str| trace.iter().filter(|s| s.name == name).count();
        // Eight tasks: each submitted and billed.
        let complete = root.is_some()
            && named("place workflow") == 1
            && named("submit job") >= 8
            && named("bill") >= 8;
        if !complete {
            assert!(
                std::time::Instant::now() < deadline,
                "no whole trace of {workflow} arrived: {}\n(of {} spans received: {})",
                trace
                    .iter()
                    .map(|s| format!("{}/{}", s.service, s.name))
                    .collect::<Vec<_>>()
                    .join(", "),
                spans.len(),
                spans
                    .iter()
                    .map(|s| format!(
                        "{}/{} {:?}",
                        s.service,
                        s.name,
                        s.attributes.get("meridian.workflow.id")
                    ))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
            continue;
        }
        let root = root.unwrap();
        assert_eq!(root.service, "meridian-intake");
        assert!(root.parent.is_empty(), "the submission is the trace's root");
        let by_id: HashMap<&[u8], &ReceivedSpan> =
            trace.iter().map(|s| (s.id.as_slice(), *s)).collect();
        // Each span's chain of parents, up to the root.
        let chain = |span: &ReceivedSpan| {
            let mut names = vec![format!("{}/{}", span.service, span.name)];
            let mut at = span;
            while !at.parent.is_empty() {
                at = by_id
                    .get(at.parent.as_slice())
                    .unwrap_or_else(|| panic!("{names:?}: a parent was not exported"));
                names.push(format!("{}/{}", at.service, at.name));
            }
            assert_eq!(at.id, root.id, "{names:?} ends at the submission");
            names
        };
        for span in &trace {
            chain(span);
        }
        let services = |name: &str| {
            trace
                .iter()
                .filter(|s| s.name == name)
                .map(|s| s.service.as_str())
                .collect::<std::collections::BTreeSet<_>>()
        };
        assert_eq!(services("place workflow"), ["meridian-router"].into());
        assert_eq!(services("submit job"), ["meridian-adapter"].into());
        assert_eq!(services("bill"), ["meridian-accounting"].into());
        // A bill follows its job's end at the adapter back to the router's dispatch.
        let bill = trace.iter().find(|s| s.name == "bill").unwrap();
        let path = chain(bill);
        assert!(
            path[1] == "meridian-adapter/job progress"
                && path.iter().any(|s| s == "meridian-router/route workflow"),
            "{path:?}"
        );
        return;
    }
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
    // What the router counted as it placed this test's workflows.
    let router = get(&d.ops[1].1, "/metrics");
    let value = |text: &str, prefix: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
    };
    assert!(
        value(
            &router,
            "meridian_placements_total{service=\"router\",site=\"local\"}"
        ) >= 3.0,
        "{router}"
    );
    assert!(
        router.contains("# TYPE meridian_placement_seconds histogram"),
        "{router}"
    );
    let placed = value(
        &router,
        "meridian_placement_seconds_count{service=\"router\",outcome=\"placed\"}",
    );
    assert_eq!(
        placed,
        value(
            &router,
            "meridian_placement_seconds_bucket{service=\"router\",outcome=\"placed\",le=\"+Inf\"}"
        ),
        "{router}"
    );
    // A workflow no site can run is refused by the local site, and counted.
    let huge = write(
        d.dir.path(),
        "huge.yaml",
        "version: v1\nname: huge\njobs:\n  a:\n    image: host\n    command: [\"true\"]\n    resources: {cpus: 512, memory: 1GiB, walltime: 5m}\n",
    );
    let refused = submit_wait(&d.server, &huge);
    assert_eq!(refused["state"], "failed", "{refused:#}");
    let router = get(&d.ops[1].1, "/metrics");
    assert!(
        value(
            &router,
            "meridian_placement_refusals_total{service=\"router\",site=\"local\"}"
        ) >= 1.0,
        "{router}"
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
