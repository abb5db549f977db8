//! The site catalogue and quotes through the API, on a real SQLite log and both stores,
//! and what a catalogue read costs: only the commits appended since the last one.

mod common;

use axum::http::{Method, StatusCode};
use common::*;
use meridian_eventlog::testkit::Intercepted;
use meridian_intake::Intake;
use serde_json::json;

const CATALOG: &str = r#"
sites:
  - name: cheap
    kind: slurm
    region: campus-1
    jurisdiction: eu
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      compute: [{offer: cpu, per_core_hour: "0.01", per_gib_hour: "0.001"}]
    shapes: [{name: cpu, offer: cpu, cpus: 64, memory: 256GiB}]
  - name: gpu
    kind: aws
    region: us-east-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      compute: [{offer: g, per_instance_hour: "4.00"}]
    shapes: [{name: g, offer: g, cpus: 48, memory: 192GiB, gpus: {count: 4, vendor: nvidia, model: L4, memory: 24GiB}}]
"#;

fn put(uri: &str) -> Req {
    Req::new(Method::PUT, uri)
}

async fn sites_scenario(db: Db) {
    let b = Bench::new(db).await;

    // A catalogue document registers sites; applying it again changes nothing.
    let res = b
        .call(
            put("/v1/sites")
                .header("content-type", "application/yaml")
                .body(CATALOG),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(
        res.body["sites"][0],
        json!({"site": "cheap", "outcome": "registered"})
    );
    let head = b.head().await;
    let res = b.call(put("/v1/sites").body(CATALOG)).await;
    assert_eq!(res.body["sites"][1]["outcome"], "unchanged");
    assert_eq!(b.head().await, head, "unchanged sites append nothing");
    connect_all(&*b.log).await;
    let head = b.head().await;

    // A bad document names the field and changes nothing.
    let bad = CATALOG.replace("\"4.00\"", "\"four\"");
    let res = b.call(put("/v1/sites").body(bad)).await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        res.body["errors"][0]["path"],
        "sites[1].prices.compute[0].per_instance_hour"
    );
    assert_eq!(b.head().await, head);

    let res = b.call(Req::get("/v1/sites")).await;
    assert_eq!(res.status, StatusCode::OK);
    let names: Vec<&str> = res.body["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cheap", "gpu"]);

    // Quotes use the live catalogue: a CPU job goes to the cheap site…
    let cpu = "version: v1\nname: q\njobs:\n  a: {image: host, command: [\"true\"], resources: {cpus: 4, walltime: 2h}}\n";
    let res = b.call(Req::post("/v1/quotes").body(cpu)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["site"], "cheap");
    // …until it is drained.
    let res = b
        .call(Req::post("/v1/sites/cheap/drain").json(&json!({"reason": "maintenance"})))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let res = b.call(Req::post("/v1/sites/cheap/drain")).await;
    assert_eq!(
        res.status,
        StatusCode::CONFLICT,
        "draining twice is a conflict"
    );
    let res = b.call(Req::post("/v1/quotes").body(cpu)).await;
    assert_eq!(res.body["site"], "gpu");
    let cheap = res.body["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["site"] == "cheap")
        .unwrap()
        .clone();
    assert_eq!(
        cheap["verdict"],
        json!({"verdict": "rejected", "reason": "drained by an admin"})
    );
    let res = b.call(Req::post("/v1/sites/cheap/undrain")).await;
    assert_eq!(res.status, StatusCode::OK);

    // A workflow nothing can run: a reason per site. Bad input: 400 and 404.
    let impossible = "version: v1\nname: q\njobs:\n  a: {image: host, command: [\"true\"], resources: {gpus: {count: 8, vendor: amd}}}\n";
    let res = b.call(Req::post("/v1/quotes").body(impossible)).await;
    assert_eq!(res.body["site"], serde_json::Value::Null);
    assert_eq!(res.body["candidates"].as_array().unwrap().len(), 2);
    let res = b
        .call(Req::post("/v1/quotes").body("version: v1\nname: q\n"))
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    let res = b.call(Req::post("/v1/sites/nowhere/drain")).await;
    assert_eq!(res.status, StatusCode::NOT_FOUND);
    let res = b
        .call(Req::post("/v1/sites/cheap/drain").body("{\"why\": 1}"))
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    b.finish().await;
}

/// A tenant's placement policy: set, read back, applied to its quotes and no one else's,
/// and refused whole when a field is wrong.
#[tokio::test]
async fn a_tenant_policy_is_set_through_the_api_and_binds_its_quotes() {
    let b = Bench::new(Db::Sqlite).await;
    let res = b.call(put("/v1/sites").body(CATALOG)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    connect_all(&*b.log).await;

    let res = b.call(Req::get("/v1/tenants/physics/policy")).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["set"], false);
    assert_eq!(res.body["policy"]["spot_allowed"], true);

    let res = b
        .call(
            put("/v1/tenants/physics/policy")
                .json(&json!({"residency": "us", "budget_per_workflow": "50 USD"})),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["set"], true);
    assert_eq!(res.body["policy"]["residency"], "us");
    assert_eq!(res.body["policy"]["budget_per_workflow"], "50 USD");

    let cpu = "version: v1\nname: q\njobs:\n  a: {image: host, command: [\"true\"], resources: {cpus: 4, walltime: 2h}}\n";
    let res = b
        .call(
            Req::post("/v1/quotes")
                .header("x-meridian-tenant", "physics")
                .body(cpu),
        )
        .await;
    assert_eq!(res.body["site"], "gpu", "{}", res.body);
    let cheap = res.body["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["site"] == "cheap")
        .unwrap()
        .clone();
    assert_eq!(
        cheap["verdict"]["reason"],
        "jurisdiction eu does not satisfy the tenant's residency us"
    );
    // Other tenants are not bound by it.
    let res = b.call(Req::post("/v1/quotes").body(cpu)).await;
    assert_eq!(res.body["site"], "cheap");

    // Bad input names the field and records nothing.
    let head = b.head().await;
    for (body, field) in [
        (
            json!({"budget_per_workflow": "fifty"}),
            "budget_per_workflow",
        ),
        (
            json!({"budget_per_workflow": "0 USD"}),
            "budget_per_workflow",
        ),
        (json!({"regions": [""]}), "regions"),
        (json!({"sitez": ["cheap"]}), "sitez"),
        (json!({"spot_allowed": "no"}), "spot_allowed"),
        (json!({"sites": "cheap"}), "sites"),
    ] {
        let res = b.call(put("/v1/tenants/physics/policy").json(&body)).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}");
        let error = res.body["error"].as_str().unwrap();
        assert!(error.contains(field), "{error} names {field}");
    }
    let res = b
        .call(put("/v1/tenants/No%20Such/policy").json(&json!({})))
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(b.head().await, head, "refused policies append nothing");
    b.finish().await;
}

#[tokio::test]
async fn sqlite_sites_and_quotes_through_the_api() {
    sites_scenario(Db::Sqlite).await;
}

#[tokio::test]
async fn postgres_sites_and_quotes_through_the_api() {
    sites_scenario(Db::Postgres).await;
}

fn states(res: &Res) -> Vec<(String, String)> {
    res.body["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pair(name: &str, state: &str) -> (String, String) {
    (name.to_string(), state.to_string())
}

/// The intake keeps its catalogue between calls: each read catches up from where the
/// last one stopped, and still sees every change (its own and others') made since.
#[tokio::test]
async fn site_reads_catch_up_from_where_the_last_one_stopped() {
    let b = Bench::new(Db::Sqlite).await;
    // The real log, recording where each `read_from` started: what a catalogue read cost.
    let log = std::sync::Arc::new(Intercepted::new(b.log.clone()));
    let intake = Intake::new(log.clone(), b.store.clone());
    let router = intake.router();
    assert!(log.take_reads().is_empty(), "a new intake reads nothing");

    let res = call(&router, b.authed(put("/v1/sites").body(CATALOG))).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    connect_all(&*b.log).await;
    let registered = b.head().await;
    log.take_reads();

    // The first read after the writes reads them, from where the PUT's catch-up stopped
    // (the log held only the bench's token: its position)…
    let res = call(&router, b.authed(Req::get("/v1/sites"))).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(states(&res), [pair("cheap", "ok"), pair("gpu", "ok")]);
    assert_eq!(log.take_reads(), [b.base_head, registered]);
    // …and the next one only asks for what came after.
    let res = call(&router, b.authed(Req::get("/v1/sites"))).await;
    assert_eq!(states(&res), [pair("cheap", "ok"), pair("gpu", "ok")]);
    assert_eq!(log.take_reads(), [registered]);

    // A drain between two reads is in the second, read from the last position on.
    let res = call(&router, b.authed(Req::post("/v1/sites/cheap/drain"))).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let drained = b.head().await;
    assert!(drained > registered);
    log.take_reads();
    let res = call(&router, b.authed(Req::get("/v1/sites"))).await;
    assert_eq!(states(&res), [pair("cheap", "drained"), pair("gpu", "ok")]);
    assert_eq!(log.take_reads(), [registered, drained]);

    // So is a change made around the intake, straight in the log (as the CLI does).
    let specs =
        meridian_domain::catalog_file::parse(&CATALOG.replace("name: gpu", "name: gpu2")).unwrap();
    meridian_domain::catalog_file::apply(&*b.log, &specs, "cli")
        .await
        .unwrap();
    let res = call(&router, b.authed(Req::get("/v1/sites"))).await;
    assert_eq!(
        states(&res),
        [
            pair("cheap", "drained"),
            pair("gpu", "ok"),
            pair("gpu2", "ok")
        ]
    );
    assert_eq!(log.take_reads(), [drained, b.head().await]);

    // Quotes read the same way, and see the drain.
    let cpu = "version: v1\nname: q\njobs:\n  a: {image: host, command: [\"true\"], resources: {cpus: 4, walltime: 2h}}\n";
    let res = call(&router, b.authed(Req::post("/v1/quotes").body(cpu))).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["site"], "gpu");
    assert_eq!(log.take_reads(), [b.head().await]);

    // A new intake (a restart) starts empty and reads the log once: one page, up to
    // the head it found, and no read after it to see that nothing more is there.
    let restarted = Intake::new(log.clone(), b.store.clone()).router();
    let res = call(&restarted, b.authed(Req::get("/v1/sites"))).await;
    assert_eq!(states(&res).len(), 3);
    assert_eq!(log.take_reads(), [0]);
    b.finish().await;
}

/// A run released to a site that no adapter serves says why it waits, and so does its
/// workflow; once an adapter serves the site, the reason goes.
#[tokio::test]
async fn a_run_waiting_at_a_site_no_adapter_serves_says_so() {
    let b = Bench::new(Db::Sqlite).await;
    let local = r#"
sites:
  - name: local
    kind: local
    region: here
    jurisdiction: eu
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      storage_per_gib_hour: "0"
      egress_per_gb: "0"
      compute:
        - {offer: node, per_core_hour: "1.00", per_gib_hour: "0"}
"#;
    let res = b.call(put("/v1/sites").body(local)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let id = b
        .submit("version: v1\nname: w\njobs:\n  a: {image: host, command: [\"true\"]}\n")
        .await;
    place(&*b.log, id, "local").await;
    release(&*b.log, id, "a", None).await;
    b.catch_up().await;
    let res = b.call(Req::get(&format!("/v1/workflows/{id}"))).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let run = res.body["jobs"][0]["reason"].as_str().unwrap_or("");
    assert!(run.contains("site local is not connected"), "{}", res.body);
    let workflow = res.body["reason"].as_str().unwrap_or("");
    assert!(
        workflow.contains("held: local not connected"),
        "{}",
        res.body
    );

    connect_all(&*b.log).await;
    let res = b.call(Req::get(&format!("/v1/workflows/{id}"))).await;
    assert!(res.body["jobs"][0]["reason"].is_null(), "{}", res.body);
    assert!(res.body["reason"].is_null(), "{}", res.body);
}
