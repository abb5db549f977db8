//! The billing endpoints over a ledger built from a real log: a workflow's bill with its
//! totals, a tenant's month, and the FOCUS export in CSV and JSON; bad requests get a
//! 400 that names the problem. On SQLite and PostgreSQL.

mod common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::*;
use meridian_accounting::Ledger;
use serde_json::{json, Value};
use tower::ServiceExt;

/// A raw call, for bodies that are not JSON.
async fn raw(bench: &Bench, uri: &str) -> (StatusCode, String, String, Option<String>) {
    let response = bench
        .router
        .clone()
        .oneshot(
            Request::builder()
                .uri(uri)
                .header("authorization", format!("Bearer {}", bench.admin_token))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let header = |n: &str| {
        response
            .headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let content_type = header("content-type").unwrap_or_default();
    let position = header(meridian_intake::LEDGER_POSITION);
    let bytes = axum::body::to_bytes(response.into_body(), 64 << 20)
        .await
        .unwrap();
    (
        status,
        content_type,
        String::from_utf8(bytes.to_vec()).unwrap(),
        position,
    )
}

async fn billing_endpoints(db: Db) {
    let bench = Bench::new(db).await;
    let id = bench.submit(HELLO_YAML).await;
    place(&*bench.log, id, "local").await;
    let job_id = release(&*bench.log, id, "hello", None).await;
    start(&*bench.log, job_id, 0).await;
    finish(&*bench.log, job_id, 90, 0).await;
    meridian_store::catch_up(&bench.store, &*bench.log, &Ledger)
        .await
        .unwrap();

    // The workflow's bill: 1.5 core-hours × 0.01 and 3 GiB-hours × 0.002.
    let res = bench
        .call(Req::get(&format!("/v1/workflows/{id}/bill")))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let lines = res.body["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 2, "{:#}", res.body);
    let meters: Vec<&str> = lines.iter().map(|l| l["meter"].as_str().unwrap()).collect();
    assert!(meters.contains(&"core_hours") && meters.contains(&"memory_gib_hours"));
    assert_eq!(
        res.body["totals"],
        json!([{"currency": "USD", "amount": "0.021", "list_amount": "0.021"}])
    );
    assert_eq!(
        res.body["by_category"],
        json!([{"category": "compute", "currency": "USD", "amount": "0.021", "list_amount": "0.021"}])
    );
    assert_eq!(res.body["by_site"][0]["site"], "local");
    assert_eq!(res.body["as_of_position"], bench.head().await);

    // The tenant's month.
    let res = bench
        .call(Req::get("/v1/tenants/default/bills?period=2025-03"))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["lines"], 2);
    assert_eq!(res.body["totals"][0]["amount"], "0.021");
    assert_eq!(res.body["workflows"][0]["workflow_id"], id.to_string());
    assert_eq!(
        res.body["billing_period_start"],
        "2025-03-01T00:00:00.000000Z"
    );
    let res = bench
        .call(Req::get("/v1/tenants/default/bills?period=2025-04"))
        .await;
    assert_eq!(res.body["lines"], 0);
    assert_eq!(res.body["totals"], json!([]));

    // The FOCUS export, CSV by default.
    let (status, content_type, csv, position) =
        raw(&bench, "/v1/exports/focus?period=2025-03").await;
    assert_eq!(status, StatusCode::OK, "{csv}");
    assert_eq!(content_type, "text/csv; charset=utf-8");
    assert_eq!(position, Some(bench.head().await.to_string()));
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 3, "{csv}");
    assert!(rows[0].starts_with("BillingAccountId,BillingAccountName,BillingCurrency,"));
    assert!(
        rows[1]
            .starts_with("default,default,USD,2025-03-01T00:00:00Z,2025-04-01T00:00:00Z,Usage,,"),
        "{}",
        rows[1]
    );
    // The same bytes again, and for the tenant alone.
    assert_eq!(raw(&bench, "/v1/exports/focus?period=2025-03").await.2, csv);
    assert_eq!(
        raw(
            &bench,
            "/v1/exports/focus?period=2025-03&tenant=default&format=csv"
        )
        .await
        .2,
        csv
    );
    let (_, _, other, _) = raw(&bench, "/v1/exports/focus?period=2025-03&tenant=other").await;
    assert_eq!(other.lines().count(), 1, "only the header: {other}");
    // JSON.
    let (status, content_type, text, _) =
        raw(&bench, "/v1/exports/focus?period=2025-03&format=json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "application/json");
    let rows: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["BillingCurrency"], "USD");
    assert_eq!(rows[0]["ChargeClass"], Value::Null);
    assert!(rows[0]["BilledCost"].is_number());
    assert_eq!(rows[0]["Tags"]["workflow"], id.to_string());
    assert_eq!(rows[0]["Tags"]["job"], "hello");

    // Bad requests change nothing and say what is wrong.
    let head = bench.head().await;
    for (uri, needle) in [
        ("/v1/tenants/default/bills", "period is required"),
        ("/v1/tenants/default/bills?period=2025-13", "2025-13"),
        (
            "/v1/tenants/default/bills?period=2025-03&x=1",
            "accepted is period",
        ),
        ("/v1/tenants/Default/bills?period=2025-03", "invalid tenant"),
        ("/v1/exports/focus", "period is required"),
        ("/v1/exports/focus?period=03-2025", "YYYY-MM"),
        (
            "/v1/exports/focus?period=2025-03&format=xlsx",
            "csv or json",
        ),
        (
            "/v1/exports/focus?period=2025-03&tenant=a%20b",
            "invalid tenant",
        ),
        (
            "/v1/exports/focus?period=2025-03&period=2025-04",
            "invalid query",
        ),
        (
            "/v1/exports/focus?period=2025-03&currency=USD",
            "accepted are period, tenant, format",
        ),
    ] {
        let res = bench.call(Req::get(uri)).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{uri}: {}", res.body);
        assert!(res.error().contains(needle), "{uri}: {}", res.body);
    }
    for uri in [
        "/v1/exports/focus?period=2025-03",
        "/v1/tenants/default/bills?period=2025-03",
    ] {
        let res = bench.call(Req::new(Method::POST, uri)).await;
        assert_eq!(res.status, StatusCode::METHOD_NOT_ALLOWED, "{uri}");
    }
    assert_eq!(bench.head().await, head);
    bench.finish().await;
}

#[tokio::test]
async fn sqlite_billing_endpoints() {
    billing_endpoints(Db::Sqlite).await;
}

#[tokio::test]
async fn postgres_billing_endpoints() {
    billing_endpoints(Db::Postgres).await;
}
