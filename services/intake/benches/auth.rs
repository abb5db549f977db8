//! Load generator for authentication: what checking a caller costs per request, on the
//! embedded default (SQLite log and store), in-process through the API's router.
//! Measures `GET /v1/health` (no credentials: the baseline) against `GET
//! /v1/workflows/{id}` with an API token, with a workflow credential, and with a token
//! of another tenant (404), and `App::authenticate` alone. The workflow is in the status
//! read model, as it is a moment after its submission.
//!
//! ```text
//! cargo bench -p meridian-intake --bench auth -- [--requests 2000]
//! ```
//! Prints Markdown table rows.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::Request;
use meridian_app::auth::{Credentials, TokenRequest};
use meridian_app::{App, Role, WorkflowCredentials};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_intake::Intake;
use meridian_store::Store;
use tower::ServiceExt;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn row(what: &str, mut micros: Vec<f64>) {
    micros.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let total: f64 = micros.iter().sum();
    println!(
        "| {what} | {} | {:.0} | {:.3} | {:.3} |",
        micros.len(),
        micros.len() as f64 / (total / 1e6),
        percentile(&micros, 0.5) / 1000.0,
        percentile(&micros, 0.99) / 1000.0,
    );
}

async fn token(app: &App, tenant: &str) -> String {
    app.issue_token_unchecked(
        "bench",
        TokenRequest {
            tenant: Some(tenant.into()),
            role: Role::Researcher,
            grants: Vec::new(),
            expires_at: None,
            label: None,
        },
    )
    .await
    .unwrap()
    .token
}

#[tokio::main]
async fn main() {
    let mut requests = 2000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--requests" {
            requests = args
                .next()
                .and_then(|n| n.parse().ok())
                .expect("--requests N");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let log: Arc<dyn EventLog> = Arc::new(
        SqliteLog::open(&dir.path().join("log.sqlite"))
            .await
            .unwrap(),
    );
    let store = Store::connect(&format!(
        "sqlite://{}",
        dir.path().join("read.sqlite").display()
    ))
    .await
    .unwrap();
    let credentials = WorkflowCredentials::generate();
    let app = App::new(log.clone(), store).with_workflow_credentials(credentials.clone());
    let router = Intake::over(app.clone()).router();
    let researcher = token(&app, "physics").await;
    let stranger = token(&app, "chem").await;
    // Some other tokens in the log, as a deployment has.
    for i in 0..200 {
        token(&app, &format!("t{i}")).await;
    }
    let submitted = router
        .clone()
        .oneshot(
            Request::post("/v1/workflows")
                .header("authorization", format!("Bearer {researcher}"))
                .header("content-type", "application/yaml")
                .body(Body::from(
                    "version: v1\nname: b\njobs:\n  a: {image: host, command: [\"true\"]}\n",
                ))
                .unwrap(),
        )
        .await
        .unwrap();
    let body = axum::body::to_bytes(submitted.into_body(), 1 << 20)
        .await
        .unwrap();
    let id = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let job = credentials.mint(id.parse().unwrap());
    // The status read model has the workflow, as it has within a moment in a deployment.
    meridian_store::catch_up(app.store(), &*log, &meridian_intake::StatusProjection)
        .await
        .unwrap();

    let time = |bearer: Option<String>, path: String, want: u16| {
        let router = router.clone();
        async move {
            let mut micros = Vec::with_capacity(requests);
            for _ in 0..requests {
                let mut req = Request::get(&path);
                if let Some(b) = &bearer {
                    req = req.header("authorization", format!("Bearer {b}"));
                }
                let start = Instant::now();
                let res = router
                    .clone()
                    .oneshot(req.body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                let status = res.status().as_u16();
                let _ = axum::body::to_bytes(res.into_body(), 1 << 20)
                    .await
                    .unwrap();
                micros.push(start.elapsed().as_secs_f64() * 1e6);
                assert_eq!(status, want, "{path}");
            }
            micros
        }
    };
    println!("| request | requests | per second | p50 ms | p99 ms |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    row(
        "GET /v1/health, no credentials (baseline)",
        time(None, "/v1/health".into(), 200).await,
    );
    let status = format!("/v1/workflows/{id}");
    row(
        "GET /v1/workflows/{id}, API token",
        time(Some(researcher.clone()), status.clone(), 200).await,
    );
    row(
        "GET /v1/workflows/{id}, workflow credential",
        time(Some(job), status.clone(), 200).await,
    );
    row(
        "GET /v1/workflows/{id}, another tenant's token (404)",
        time(Some(stranger), status, 404).await,
    );
    let mut micros = Vec::with_capacity(requests);
    let creds = Credentials {
        bearer: Some(researcher),
        request: "GET /v1/workflows".into(),
        ..Credentials::default()
    };
    for _ in 0..requests {
        let start = Instant::now();
        app.authenticate(&creds).await.unwrap();
        micros.push(start.elapsed().as_secs_f64() * 1e6);
    }
    row("App::authenticate alone, API token", micros);
}
