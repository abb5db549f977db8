//! The test bench: a real SQLite event log in a temporary directory, a real store
//! (a SQLite file or a fresh PostgreSQL database), the intake over them, and helpers to
//! call its router in-process and to drive the aggregates as the other services would.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use chrono::{DateTime, Duration, TimeZone, Utc};
use meridian_app::auth::TokenRequest;
use meridian_app::{App, Grant, Role, WorkflowCredentials};
use meridian_eventlog::aggregates::{execute, load};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Job, JobCommand, Workflow, WorkflowCommand};
use meridian_events::money::{ComputePricing, ComputeRate, Currency, Money, StorageRate};
use meridian_events::vocabulary::workflow::{PlacementExplanation, SiteRejection};
use meridian_events::vocabulary::{Allocation, FailureReason, JobOutcome, Usage};
use meridian_events::EventContext;
use meridian_intake::{Intake, StatusProjection};
use meridian_store::Store;
use rust_decimal::Decimal;
use serde_json::Value;
use sqlx::Row;
use tower::ServiceExt;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

pub struct Bench {
    pub dir: tempfile::TempDir,
    pub log: Arc<dyn EventLog>,
    pub store: Store,
    /// The audit trail's: on SQLite a file of its own, as `meridian up` keeps it; on
    /// PostgreSQL the store.
    pub audit: Store,
    pub intake: Intake,
    pub router: Router,
    /// An admin token with no tenant, sent by [`Bench::call`] unless the request brings
    /// its own credentials or asks to go without ([`Req::anonymous`]).
    pub admin_token: String,
    /// The log's head once the bench's token is issued.
    pub base_head: u64,
    /// The key of the workflow credentials the intake accepts.
    pub credentials: WorkflowCredentials,
    postgres: Option<String>,
}

impl Bench {
    pub async fn new(db: Db) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let log: Arc<dyn EventLog> = Arc::new(
            SqliteLog::open(&dir.path().join("log.sqlite"))
                .await
                .unwrap(),
        );
        let (url, postgres) = match db {
            Db::Sqlite => (
                format!("sqlite://{}", dir.path().join("read.sqlite").display()),
                None,
            ),
            Db::Postgres => {
                let url = meridian_store::testing::fresh_postgres()
                    .await
                    .expect("a PostgreSQL server (set MERIDIAN_TEST_POSTGRES)");
                (url.clone(), Some(url))
            }
        };
        let store = Store::connect(&url).await.unwrap();
        let audit = match db {
            Db::Sqlite => Store::connect(&format!(
                "sqlite://{}",
                dir.path().join("audit.sqlite").display()
            ))
            .await
            .unwrap(),
            Db::Postgres => store.clone(),
        };
        let credentials = WorkflowCredentials::generate();
        let intake = Intake::over(
            App::new(log.clone(), store.clone())
                .with_audit_store(audit.clone())
                .with_workflow_credentials(credentials.clone()),
        );
        let router = intake.router();
        let admin_token = issue(&intake, None, Role::Admin, vec![]).await;
        let base_head = log.head().await.unwrap();
        Bench {
            dir,
            log,
            store,
            audit,
            intake,
            router,
            admin_token,
            base_head,
            credentials,
            postgres,
        }
    }

    /// A new Intake over the same log and store, as after a restart.
    pub fn restart(&mut self) {
        self.intake = Intake::over(
            App::new(self.log.clone(), self.store.clone())
                .with_audit_store(self.audit.clone())
                .with_workflow_credentials(self.credentials.clone()),
        );
        self.router = self.intake.router();
    }

    pub async fn finish(self) {
        self.store.pool().close().await;
        if let Some(url) = &self.postgres {
            meridian_store::testing::drop_postgres(url).await;
        }
    }

    pub async fn head(&self) -> u64 {
        self.log.head().await.unwrap()
    }

    /// Commits appended since the bench's own token.
    pub async fn appended(&self) -> u64 {
        self.head().await - self.base_head
    }

    pub async fn catch_up(&self) -> u64 {
        meridian_store::catch_up(&self.store, &*self.log, &StatusProjection)
            .await
            .unwrap()
    }

    pub async fn call(&self, req: Req) -> Res {
        call(&self.router, self.authed(req)).await
    }

    /// `req` with the admin token, unless it has credentials or is anonymous.
    pub fn authed(&self, req: Req) -> Req {
        if req.anonymous
            || req
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        {
            return req;
        }
        let token = self.admin_token.clone();
        req.bearer(&token)
    }

    /// Issues a token of `role` in `tenant` (none: every tenant).
    pub async fn token(&self, tenant: Option<&str>, role: Role, grants: Vec<Grant>) -> String {
        issue(&self.intake, tenant, role, grants).await
    }

    /// Submits `doc` as YAML and returns the new workflow's id.
    pub async fn submit(&self, doc: &str) -> Uuid {
        let res = self.call(Req::post("/v1/workflows").yaml(doc)).await;
        assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
        res.id()
    }

    /// Every event of the log but the bench's token's, as JSON, in log order.
    pub async fn all_events(&self) -> Vec<Value> {
        let commits = self.log.read_from(self.base_head, 100_000).await.unwrap();
        commits
            .into_iter()
            .flat_map(meridian_eventlog::Commit::into_events)
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }

    pub async fn count_events(&self, kind: &str) -> usize {
        self.all_events()
            .await
            .iter()
            .filter(|e| e["payload"]["type"] == kind)
            .count()
    }

    /// Every row of the read model's tables, as text, for comparing two builds.
    pub async fn read_model_rows(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (table, key) in [("intake_workflows", "id"), ("intake_tasks", "job_id")] {
            let rows = sqlx::query(&format!("SELECT * FROM {table} ORDER BY {key}"))
                .fetch_all(self.store.pool())
                .await
                .unwrap();
            for row in rows {
                let mut cells = vec![table.to_string()];
                for i in 0..row.len() {
                    let cell = row
                        .try_get::<Option<String>, _>(i)
                        .map(|v| format!("{v:?}"))
                        .or_else(|_| row.try_get::<Option<i64>, _>(i).map(|v| format!("{v:?}")))
                        .unwrap();
                    cells.push(cell);
                }
                out.push(cells.join("|"));
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------
// Requests and responses.

pub struct Req {
    pub method: Method,
    pub uri: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// Sent without credentials, even through [`Bench::call`].
    pub anonymous: bool,
}

impl Req {
    pub fn new(method: Method, uri: &str) -> Req {
        Req {
            method,
            uri: uri.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            anonymous: false,
        }
    }

    pub fn anonymous(mut self) -> Req {
        self.anonymous = true;
        self
    }

    pub fn bearer(self, token: &str) -> Req {
        self.header("authorization", format!("Bearer {token}"))
    }

    pub fn get(uri: &str) -> Req {
        Req::new(Method::GET, uri)
    }

    pub fn post(uri: &str) -> Req {
        Req::new(Method::POST, uri)
    }

    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Req {
        self.headers
            .push((name.to_string(), value.as_ref().to_vec()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Req {
        self.body = body.into();
        self
    }

    pub fn yaml(self, doc: &str) -> Req {
        self.header("content-type", "application/yaml").body(doc)
    }

    pub fn json(self, value: &Value) -> Req {
        self.header("content-type", "application/json")
            .body(serde_json::to_vec(value).unwrap())
    }
}

#[derive(Debug)]
pub struct Res {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Res {
    pub fn id(&self) -> Uuid {
        self.body["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no id in {}", self.body))
            .parse()
            .unwrap()
    }

    pub fn error(&self) -> &str {
        self.body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error message in {} ({})", self.body, self.status))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// Issues a token through the application, as `meridian up` does its first.
pub async fn issue(
    intake: &Intake,
    tenant: Option<&str>,
    role: Role,
    grants: Vec<Grant>,
) -> String {
    intake
        .app()
        .issue_token_unchecked(
            "test",
            TokenRequest {
                tenant: tenant.map(str::to_string),
                role,
                grants,
                expires_at: None,
                label: None,
            },
        )
        .await
        .unwrap()
        .token
}

/// Calls the router in-process. Every answer must be JSON.
pub async fn call(router: &Router, req: Req) -> Res {
    let mut builder = Request::builder().method(req.method).uri(&req.uri);
    for (name, value) in &req.headers {
        builder = builder.header(name.as_str(), value.as_slice());
    }
    let request = builder.body(Body::from(req.body)).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), 64 << 20)
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{status}: the body is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(
        headers.get("content-type").map(|v| v.to_str().unwrap()),
        Some("application/json"),
        "{status} {body}"
    );
    Res {
        status,
        headers,
        body,
    }
}

// ---------------------------------------------------------------------------------
// Documents.

pub const HELLO_YAML: &str = "
version: v1
name: hello
jobs:
  hello:
    image: host
    command: [echo, hello]
";

pub fn hello_json() -> Value {
    serde_json::json!({
        "version": "v1",
        "name": "hello-json",
        "jobs": {"hello": {"image": "host", "command": ["echo", "hi"]}}
    })
}

/// prep → sweep[1..=3] (2 at once).
pub const PIPELINE_YAML: &str = "
version: v1
name: pipeline
jobs:
  prep:
    image: host
    command: [echo, prep]
  sweep:
    requires: [prep]
    image: host
    command: [sh, -c, 'echo ${ARRAY_INDEX}']
    array: {start: 1, end: 3, parallelism: 2}
";

pub fn named(name: &str) -> String {
    HELLO_YAML.replace("name: hello", &format!("name: {name}"))
}

// ---------------------------------------------------------------------------------
// Driving the aggregates, as the router and the site adapters would.

pub fn at(minute: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 3, 1, 12, 0, 0).unwrap() + Duration::minutes(minute)
}

fn dec(s: &str) -> Decimal {
    Decimal::from_str_exact(s).unwrap()
}

pub fn rate() -> ComputeRate {
    ComputeRate {
        offer: "cpu".into(),
        pricing: ComputePricing::Resource {
            per_core_hour: dec("0.01"),
            per_gib_memory_hour: dec("0.002"),
            per_gpu_hour: dec("2.50"),
        },
        currency: Currency::USD,
        effective_from: at(0),
        source: "test".into(),
    }
}

fn ctx() -> EventContext {
    EventContext::new_chain("default")
}

pub async fn place(log: &dyn EventLog, workflow: Uuid, site: &str) {
    let site = site.to_string();
    execute::<Workflow, _>(log, workflow, &ctx(), |_| {
        WorkflowCommand::RecordPlacement {
            site: site.clone(),
            region: "eu".into(),
            rate: rate(),
            job_rates: BTreeMap::new(),
            storage_rate: StorageRate {
                per_gib_hour: dec("0.0001"),
                currency: Currency::USD,
                effective_from: at(0),
                source: "test".into(),
            },
            estimated_cost: Money::new(dec("1.00"), Currency::USD),
            explanation: PlacementExplanation::default(),
            job_sites: BTreeMap::new(),
            storage_rates: BTreeMap::new(),
        }
    })
    .await
    .unwrap();
}

pub async fn reject_placement(log: &dyn EventLog, workflow: Uuid) {
    execute::<Workflow, _>(log, workflow, &ctx(), |_| {
        WorkflowCommand::RejectPlacement {
            rejections: vec![SiteRejection {
                site: "hpc-eu".into(),
                reason: "no H100".into(),
            }],
        }
    })
    .await
    .unwrap();
}

/// Releases a task and dispatches its Job; returns the job's id.
pub async fn release(log: &dyn EventLog, workflow: Uuid, job: &str, index: Option<u32>) -> Uuid {
    let job_id = Uuid::now_v7();
    let events = execute::<Workflow, _>(log, workflow, &ctx(), |_| WorkflowCommand::ReleaseJob {
        job: job.into(),
        index,
        job_id,
        site: "local".into(),
    })
    .await
    .unwrap();
    let attempt = match &events[0].payload {
        meridian_events::Event::Workflow(meridian_events::WorkflowEvent::JobReleased {
            attempt,
            ..
        }) => *attempt,
        other => panic!("expected a release, got {other:?}"),
    };
    let wf = load::<Workflow>(log, workflow).await.unwrap();
    let resources = wf.state.spec().unwrap().jobs[job].resources.clone();
    execute::<Job, _>(log, job_id, &ctx(), |_| JobCommand::Dispatch {
        workflow_id: workflow,
        job: job.into(),
        index,
        attempt,
        site: "local".into(),
        rate: rate(),
        resources: resources.clone(),
        batch: None,
    })
    .await
    .unwrap();
    job_id
}

pub async fn job(log: &dyn EventLog, job_id: Uuid, cmd: JobCommand) {
    execute::<Job, _>(log, job_id, &ctx(), |_| cmd.clone())
        .await
        .unwrap();
}

pub async fn submitted_to_site(log: &dyn EventLog, job_id: Uuid, backend: &str) {
    job(
        log,
        job_id,
        JobCommand::RecordSubmission {
            backend_job_id: backend.into(),
        },
    )
    .await;
}

pub async fn start(log: &dyn EventLog, job_id: Uuid, minute: i64) {
    job(
        log,
        job_id,
        JobCommand::Start {
            started_at: at(minute),
            allocated: Allocation {
                nodes: 1,
                cpus: 1,
                memory_bytes: 2 << 30,
                gpus: None,
            },
            hosts: vec!["node1".into()],
        },
    )
    .await;
}

pub async fn finish(log: &dyn EventLog, job_id: Uuid, minute: i64, exit_code: i32) {
    job(
        log,
        job_id,
        JobCommand::Finish {
            ended_at: at(minute),
            exit_code,
            usage: Usage::default(),
        },
    )
    .await;
}

pub async fn fail(log: &dyn EventLog, job_id: Uuid, minute: i64, reason: FailureReason) {
    job(
        log,
        job_id,
        JobCommand::Fail {
            ended_at: at(minute),
            exit_code: None,
            reason,
            usage: Usage::default(),
        },
    )
    .await;
}

/// Settles a job in its workflow with the Job aggregate's own outcome.
pub async fn settle(log: &dyn EventLog, workflow: Uuid, job_id: Uuid) {
    let outcome: JobOutcome = load::<Job>(log, job_id)
        .await
        .unwrap()
        .state
        .outcome()
        .cloned()
        .expect("the job ended");
    execute::<Workflow, _>(log, workflow, &ctx(), |_| WorkflowCommand::SettleJob {
        job_id,
        outcome: outcome.clone(),
    })
    .await
    .unwrap();
}

/// Says an adapter serves every site in the catalogue, for a day: these tests play the
/// sites themselves, and placement only chooses sites that are served.
pub async fn connect_all(log: &dyn EventLog) {
    let catalog = meridian_domain::Catalog::load(log).await.unwrap();
    for site in catalog.sites.values() {
        execute::<meridian_events::aggregate::Site, _>(
            log,
            site.id,
            &EventContext::new_chain("system"),
            |_| meridian_events::aggregate::SiteCommand::Heartbeat {
                adapter: "test".into(),
                instance: Uuid::now_v7(),
                ttl_secs: 86_400,
                arrays: None,
            },
        )
        .await
        .unwrap();
    }
}
