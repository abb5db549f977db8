//! The site catalogue and quotes through the API, on a real SQLite log and both stores.

mod common;

use axum::http::{Method, StatusCode};
use common::*;
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

#[tokio::test]
async fn sqlite_sites_and_quotes_through_the_api() {
    sites_scenario(Db::Sqlite).await;
}

#[tokio::test]
async fn postgres_sites_and_quotes_through_the_api() {
    sites_scenario(Db::Postgres).await;
}
