//! `serve` over a real socket, and routes added by other parts through `router_with`.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 exchange by hand; returns the status line, headers and body.
async fn http(addr: std::net::SocketAddr, request: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut out))
        .await
        .expect("the server answers")
        .unwrap();
    out
}

#[tokio::test]
async fn serves_over_tcp_and_shuts_down() {
    let bench = Bench::new(Db::Sqlite).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(meridian_intake::serve(
        bench.intake.clone(),
        listener,
        async move {
            let _ = stopped.await;
        },
    ));

    let reply = http(
        addr,
        "GET /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"status\":\"ok\""), "{reply}");

    let doc = HELLO_YAML;
    let reply = http(
        addr,
        &format!(
            "POST /v1/workflows HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Authorization: Bearer {}\r\n\
             Content-Type: application/yaml\r\nContent-Length: {}\r\n\r\n{doc}",
            bench.admin_token,
            doc.len()
        ),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 202"), "{reply}");
    assert!(
        reply
            .to_ascii_lowercase()
            .contains("location: /v1/workflows/"),
        "{reply}"
    );

    let reply = http(
        addr,
        "DELETE /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    assert!(reply.contains("\"error\""), "{reply}");
    assert!(reply.to_ascii_lowercase().contains("allow: get"), "{reply}");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("serve returns after shutdown")
        .unwrap()
        .unwrap();
    bench.finish().await;
}

#[tokio::test]
async fn other_parts_add_routes_with_one_line() {
    let bench = Bench::new(Db::Sqlite).await;
    let id = bench.submit(HELLO_YAML).await;
    let extra = Router::new().route(
        "/v1/workflows/{id}/quote",
        get(|| async { Json(json!({"total": "0.00"})) }),
    );
    let router = bench.intake.router_with(extra);
    let res = call(
        &router,
        bench.authed(Req::get(&format!("/v1/workflows/{id}/quote"))),
    )
    .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body, json!({"total": "0.00"}));
    // The intake's own routes and fallbacks are still there.
    let res = call(
        &router,
        bench.authed(Req::get(&format!("/v1/workflows/{id}"))),
    )
    .await;
    assert_eq!(res.status, StatusCode::OK);
    let res = call(
        &router,
        bench.authed(Req::post(&format!("/v1/workflows/{id}/quote"))),
    )
    .await;
    assert_eq!(res.status, StatusCode::METHOD_NOT_ALLOWED);
    let res = call(
        &router,
        bench.authed(Req::get(&format!("/v1/workflows/{id}/logs"))),
    )
    .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body, json!({"logs": []}));
    let res = call(
        &router,
        bench.authed(Req::get(&format!("/v1/workflows/{id}/bill"))),
    )
    .await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body["lines"], json!([]));
    bench.finish().await;
}
