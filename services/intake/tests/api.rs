//! The `/v1` API end to end, in-process: a real SQLite event log and a real store.
//! Every scenario runs twice, with a SQLite store and with the machine's PostgreSQL.

mod common;

use axum::http::{Method, StatusCode};
use common::*;
use meridian_eventlog::aggregates::load;
use meridian_events::aggregate::{Workflow, WorkflowState as AggregateState};
use meridian_events::vocabulary::FailureReason;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Runs each scenario against both stores.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let mut bench = super::Bench::new(super::Db::Sqlite).await;
                    super::$name(&mut bench).await;
                    bench.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    let mut bench = super::Bench::new(super::Db::Postgres).await;
                    super::$name(&mut bench).await;
                    bench.finish().await;
                }
            )*
        }
    };
}

scenarios!(
    submits_yaml_and_json,
    refuses_an_invalid_workflow_with_every_error,
    refuses_other_content_types,
    refuses_garbage_bodies,
    refuses_bad_headers,
    replays_an_idempotent_retry,
    refuses_a_reused_key_with_another_body,
    completes_a_reservation_that_was_never_appended,
    answers_status_before_and_after_projection,
    reports_unknown_and_malformed_ids,
    lists_newest_first_in_pages,
    cancels,
    lists_a_workflows_events,
    status_follows_a_workflow_to_the_end,
    status_shows_failures_retries_and_rejections,
    garbage_to_every_endpoint_changes_nothing,
    reports_health,
    counts_array_tasks_and_dispatches_seen_first,
);

fn submitted_events(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["payload"]["type"] == "workflow.submitted.v1")
        .collect()
}

async fn submits_yaml_and_json(b: &mut Bench) {
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HELLO_YAML)
                .header("x-meridian-tenant", "lab-7")
                .header("x-meridian-user", "ada"),
        )
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
    let id = res.id();
    assert_eq!(id.get_version_num(), 7);
    assert_eq!(
        res.body,
        json!({"id": id.to_string(), "name": "hello", "state": "submitted"})
    );
    assert_eq!(
        res.header("location"),
        Some(format!("/v1/workflows/{id}").as_str())
    );
    let events = b.all_events().await;
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(
        e["aggregate"],
        json!({"kind": "workflow", "id": id.to_string()})
    );
    assert_eq!(e["tenant"], "lab-7");
    assert_eq!(e["payload"]["submitted_by"], "ada");
    assert_eq!(
        e["payload"]["spec"]["jobs"]["hello"]["command"],
        json!(["echo", "hello"])
    );

    // JSON, declared; and every YAML media type; and none (sniffed).
    let res = b.call(Req::post("/v1/workflows").json(&hello_json())).await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
    assert_eq!(res.body["name"], "hello-json");
    for content_type in [
        "application/x-yaml",
        "text/yaml",
        "Application/YAML; charset=utf-8",
    ] {
        let res = b
            .call(
                Req::post("/v1/workflows")
                    .header("content-type", content_type)
                    .body(HELLO_YAML),
            )
            .await;
        assert_eq!(
            res.status,
            StatusCode::ACCEPTED,
            "{content_type}: {}",
            res.body
        );
    }
    let res = b
        .call(Req::post("/v1/workflows").body(serde_json::to_vec(&hello_json()).unwrap()))
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
    let res = b.call(Req::post("/v1/workflows").body(HELLO_YAML)).await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);

    let events = b.all_events().await;
    assert_eq!(submitted_events(&events).len(), 7);
    // Defaults for the principal and the tenant: a token with no label or tenant acts
    // under its id in the default tenant.
    assert_eq!(events[1]["tenant"], "default");
    assert!(events[1]["payload"]["submitted_by"]
        .as_str()
        .unwrap()
        .starts_with("token "));
}

async fn refuses_an_invalid_workflow_with_every_error(b: &mut Bench) {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/invalid/many-errors.yaml"
    ))
    .unwrap();
    let expected = meridian_spec::parse(&doc).unwrap_err();
    assert!(expected.len() >= 5);
    let res = b.call(Req::post("/v1/workflows").yaml(&doc)).await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(res.error(), "invalid workflow");
    let errors: Vec<(String, String)> = res.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = expected
        .iter()
        .map(|e| (e.path.clone(), e.message.clone()))
        .collect();
    assert_eq!(errors, want);

    // The same through JSON, with a vendor typo.
    let mut doc = hello_json();
    doc["jobs"]["hello"]["resources"] = json!({"gpus": {"count": 1, "vendor": "nvidai"}});
    let res = b.call(Req::post("/v1/workflows").json(&doc)).await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        res.body["errors"][0]["path"],
        "jobs.hello.resources.gpus.vendor"
    );
    assert_eq!(b.appended().await, 0, "an invalid workflow appends nothing");
}

async fn refuses_other_content_types(b: &mut Bench) {
    for content_type in [
        "text/plain",
        "application/xml",
        "multipart/form-data; boundary=x",
    ] {
        let res = b
            .call(
                Req::post("/v1/workflows")
                    .header("content-type", content_type)
                    .body(HELLO_YAML),
            )
            .await;
        assert_eq!(res.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        for accepted in meridian_intake::WORKFLOW_CONTENT_TYPES {
            assert!(res.error().contains(accepted), "{}", res.error());
        }
    }
    assert_eq!(b.appended().await, 0);
}

async fn refuses_garbage_bodies(b: &mut Bench) {
    let huge = format!(
        "{HELLO_YAML}# {}\n",
        "x".repeat(meridian_spec::MAX_DOCUMENT_BYTES)
    );
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let nested_json = format!("{{\"a\": {}{}}}", "[".repeat(10_000), "]".repeat(10_000));
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
                e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n\
                g: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n";
    let cases: Vec<(&str, Option<&str>, Vec<u8>, StatusCode)> = vec![
        (
            "binary",
            None,
            vec![0xff, 0xfe, 0x00, 0x01, 0x80, 0x81],
            StatusCode::BAD_REQUEST,
        ),
        (
            "binary as yaml",
            Some("application/yaml"),
            vec![0, 159, 146, 150],
            StatusCode::BAD_REQUEST,
        ),
        (
            "huge",
            Some("application/yaml"),
            huge.into_bytes(),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        ("nested", None, nested.into_bytes(), StatusCode::BAD_REQUEST),
        (
            "nested json",
            Some("application/json"),
            nested_json.into_bytes(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "alias bomb",
            Some("application/yaml"),
            bomb.as_bytes().to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        ("empty", None, Vec::new(), StatusCode::BAD_REQUEST),
        (
            "empty json",
            Some("application/json"),
            Vec::new(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "whitespace",
            Some("application/yaml"),
            b"  \n\n ".to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        ("null", None, b"null".to_vec(), StatusCode::BAD_REQUEST),
        (
            "a list",
            None,
            b"[1, 2, 3]".to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "yaml sent as json",
            Some("application/json"),
            HELLO_YAML.as_bytes().to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "broken json",
            Some("application/json"),
            b"{\"version\": \"v1\",".to_vec(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "two documents",
            None,
            format!("{HELLO_YAML}---\n{HELLO_YAML}").into_bytes(),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (what, content_type, body, status) in cases {
        let mut req = Req::post("/v1/workflows").body(body);
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        let res = b.call(req).await;
        assert_eq!(res.status, status, "{what}: {}", res.body);
        assert!(!res.error().is_empty(), "{what}");
        if status == StatusCode::BAD_REQUEST && res.error() == "invalid workflow" {
            assert!(
                !res.body["errors"].as_array().unwrap().is_empty(),
                "{what}: {}",
                res.body
            );
        }
    }
    // A declared length over the limit is refused before the body is read.
    let res = b
        .call(
            Req::post("/v1/workflows")
                .header("content-length", "99999999")
                .body(HELLO_YAML),
        )
        .await;
    assert_eq!(res.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(b.appended().await, 0, "garbage appends nothing");

    // Valid, under the document limit, but over what one event may hold: refused
    // whole, and the idempotency key stays free for a smaller document.
    let big = format!(
        "{HELLO_YAML}    env: {{BIG: \"{}\"}}\n",
        "x".repeat(950_000)
    );
    meridian_spec::parse(&big).expect("the big document is valid");
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml(&big)
                .header("idempotency-key", "big"),
        )
        .await;
    assert_eq!(res.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", res.body);
    assert!(res.error().contains("event log"), "{}", res.error());
    assert_eq!(b.appended().await, 0);
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HELLO_YAML)
                .header("idempotency-key", "big"),
        )
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
}

async fn refuses_bad_headers(b: &mut Bench) {
    let long = "k".repeat(201);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("x-meridian-tenant", b"Lab".to_vec(), "X-Meridian-Tenant"),
        ("x-meridian-tenant", b"lab 7".to_vec(), "X-Meridian-Tenant"),
        (
            "x-meridian-tenant",
            "t".repeat(64).into_bytes(),
            "X-Meridian-Tenant",
        ),
        ("x-meridian-tenant", Vec::new(), "X-Meridian-Tenant"),
        (
            "x-meridian-tenant",
            "läb".as_bytes().to_vec(),
            "x-meridian-tenant",
        ),
        ("idempotency-key", long.into_bytes(), "Idempotency-Key"),
        ("idempotency-key", Vec::new(), "Idempotency-Key"),
        ("idempotency-key", b"tab\there".to_vec(), "Idempotency-Key"),
        ("idempotency-key", vec![b'k', 0xe9], "idempotency-key"),
        (
            "x-meridian-user",
            "u".repeat(201).into_bytes(),
            "X-Meridian-User",
        ),
    ];
    for (name, value, mentions) in cases {
        let res = b
            .call(
                Req::post("/v1/workflows")
                    .yaml(HELLO_YAML)
                    .header(name, &value),
            )
            .await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{name}: {value:?}");
        assert!(res.error().contains(mentions), "{}", res.error());
    }
    // A header given twice is ambiguous.
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HELLO_YAML)
                .header("idempotency-key", "a")
                .header("idempotency-key", "b"),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert_eq!(b.appended().await, 0);

    // The edges that are fine.
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HELLO_YAML)
                .header("x-meridian-tenant", "t".repeat(63))
                .header("idempotency-key", "k ~!".repeat(50)),
        )
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
}

async fn replays_an_idempotent_retry(b: &mut Bench) {
    let submit = |tenant: &'static str| {
        Req::post("/v1/workflows")
            .yaml(HELLO_YAML)
            .header("idempotency-key", "run-17")
            .header("x-meridian-tenant", tenant)
    };
    let first = b.call(submit("lab")).await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert_eq!(first.header("idempotent-replay"), None);
    let id = first.id();

    let again = b.call(submit("lab")).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.header("idempotent-replay"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(
        again.header("location"),
        Some(format!("/v1/workflows/{id}").as_str())
    );

    // Long after JetStream would have forgotten: a new instance on the same store.
    b.restart();
    let later = b.call(submit("lab")).await;
    assert_eq!(later.status, StatusCode::OK);
    assert_eq!(later.id(), id);
    let events = b.all_events().await;
    assert_eq!(
        submitted_events(&events).len(),
        1,
        "one Submitted event only"
    );
    assert_eq!(events[0]["payload"]["idempotency_key"], "run-17");

    // The replay reports the workflow's state now.
    place(&*b.log, id, "local").await;
    let placed = b.call(submit("lab")).await;
    assert_eq!(placed.body["state"], "placed");

    // Keys are per tenant.
    let other = b.call(submit("other")).await;
    assert_eq!(other.status, StatusCode::ACCEPTED);
    assert_ne!(other.id(), id);

    // Concurrent retries still make one workflow.
    let router = b.router.clone();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let router = router.clone();
            let req = b.authed(
                Req::post("/v1/workflows")
                    .yaml(HELLO_YAML)
                    .header("idempotency-key", "burst"),
            );
            tokio::spawn(async move { call(&router, req).await })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        let res = t.await.unwrap();
        assert!(
            res.status == StatusCode::ACCEPTED || res.status == StatusCode::OK,
            "{} {}",
            res.status,
            res.body
        );
        ids.push(res.id());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every retry names the same workflow");
    assert_eq!(submitted_events(&b.all_events().await).len(), 3);
}

async fn refuses_a_reused_key_with_another_body(b: &mut Bench) {
    let req = |doc: &str| {
        Req::post("/v1/workflows")
            .yaml(doc)
            .header("idempotency-key", "k1")
    };
    assert_eq!(b.call(req(HELLO_YAML)).await.status, StatusCode::ACCEPTED);
    let head = b.head().await;
    let res = b.call(req(&named("other"))).await;
    assert_eq!(res.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        res.body,
        json!({"error": "idempotency key reused with a different body"})
    );
    assert_eq!(b.head().await, head);

    // An invalid body does not take the key: it can be fixed and sent again.
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml("version: v1\nname: x\njobs: {a: {image: nope}}\n")
                .header("idempotency-key", "k2"),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HELLO_YAML)
                .header("idempotency-key", "k2"),
        )
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED);
}

async fn completes_a_reservation_that_was_never_appended(b: &mut Bench) {
    // As if a process reserved the key and died before appending.
    b.intake.migrate().await.unwrap();
    let reserved = Uuid::now_v7();
    let digest = format!("{:x}", Sha256::digest(HELLO_YAML.as_bytes()));
    sqlx::query(
        "INSERT INTO intake_idempotency (tenant, key, workflow_id, body_sha256, created_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind("default")
    .bind("crashed")
    .bind(reserved.to_string())
    .bind(&digest)
    .bind("2025-03-01T00:00:00.000000Z")
    .execute(b.store.pool())
    .await
    .unwrap();
    assert_eq!(b.appended().await, 0);

    let req = || {
        Req::post("/v1/workflows")
            .yaml(HELLO_YAML)
            .header("idempotency-key", "crashed")
    };
    let res = b.call(req()).await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
    assert_eq!(res.id(), reserved, "appended under the reserved id");
    let res = b.call(req()).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.id(), reserved);
    assert_eq!(submitted_events(&b.all_events().await).len(), 1);
}

async fn answers_status_before_and_after_projection(b: &mut Bench) {
    let id = b.submit(&named("fresh")).await;
    // Not projected yet: answered from the log.
    let res = b.call(Req::get(&format!("/v1/workflows/{id}"))).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["state"], "submitted");
    assert_eq!(res.body["name"], "fresh");
    assert_eq!(res.body["tenant"], "default");
    assert_eq!(res.body["tasks"]["total"], 1);
    let from_log = res.body.clone();

    b.catch_up().await;
    let res = b.call(Req::get(&format!("/v1/workflows/{id}"))).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(res.body, from_log, "the log and the read model agree");
    assert_eq!(
        res.body,
        json!({
            "id": id.to_string(),
            "name": "fresh",
            "tenant": "default",
            "state": "submitted",
            "site": null,
            "submitted_at": from_log["submitted_at"],
            "updated_at": from_log["submitted_at"],
            "reason": null,
            "tasks": {"total": 1, "pending": 1, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0},
            "jobs": [],
            "jobs_truncated": false,
            "transfers": [],
        })
    );
    let submitted_at = res.body["submitted_at"].as_str().unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(submitted_at).is_ok());
    assert!(submitted_at.ends_with('Z'));
}

async fn reports_unknown_and_malformed_ids(b: &mut Bench) {
    let unknown = Uuid::now_v7();
    for path in ["", "/events"] {
        let res = b
            .call(Req::get(&format!("/v1/workflows/{unknown}{path}")))
            .await;
        assert_eq!(res.status, StatusCode::NOT_FOUND);
        assert_eq!(res.body, json!({"error": format!("no workflow {unknown}")}));
    }
    let res = b
        .call(Req::post(&format!("/v1/workflows/{unknown}/cancel")))
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND);
    assert_eq!(res.error(), format!("no workflow {unknown}"));

    for bad in [
        "not-a-uuid",
        "123",
        "0190b6a4-4c1e-7cc3-9a52-4d3f0b1f2e9",
        "%FF%FE",
    ] {
        let res = b.call(Req::get(&format!("/v1/workflows/{bad}"))).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{bad}: {}", res.body);
        assert!(
            res.error().contains("invalid workflow id"),
            "{}",
            res.error()
        );
    }
    assert_eq!(b.appended().await, 0);
}

async fn lists_newest_first_in_pages(b: &mut Bench) {
    let mut ids = Vec::new();
    for (i, tenant) in ["a", "b", "a", "b", "a"].iter().enumerate() {
        let res = b
            .call(
                Req::post("/v1/workflows")
                    .yaml(&named(&format!("w{i}")))
                    .header("x-meridian-tenant", *tenant),
            )
            .await;
        ids.push(res.id());
    }
    // Not listed until projected: the list reads the read model only.
    let res = b.call(Req::get("/v1/workflows")).await;
    assert_eq!(res.body, json!({"items": [], "next": null}));
    b.catch_up().await;

    let newest_first: Vec<String> = ids.iter().rev().map(|i| i.to_string()).collect();
    let page_ids = |res: &Res| -> Vec<String> {
        res.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_string())
            .collect()
    };
    let res = b.call(Req::get("/v1/workflows")).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(page_ids(&res), newest_first);
    assert_eq!(res.body["next"], Value::Null);
    let item = &res.body["items"][0];
    assert_eq!(item["name"], "w4");
    assert_eq!(item["tenant"], "a");
    assert_eq!(item["state"], "submitted");
    assert!(item["submitted_at"].is_string() && item["updated_at"].is_string());

    let mut seen = Vec::new();
    let mut uri = "/v1/workflows?limit=2".to_string();
    loop {
        let res = b.call(Req::get(&uri)).await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
        seen.extend(page_ids(&res));
        match res.body["next"].as_str() {
            Some(next) => uri = format!("/v1/workflows?limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, newest_first);

    let res = b.call(Req::get("/v1/workflows?tenant=b")).await;
    assert_eq!(page_ids(&res), vec![ids[3].to_string(), ids[1].to_string()]);

    // Cancel one (nothing runs, so it ends cancelled at once) and filter by state.
    let res = b
        .call(Req::post(&format!("/v1/workflows/{}/cancel", ids[2])))
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED);
    b.catch_up().await;
    let res = b.call(Req::get("/v1/workflows?state=cancelled")).await;
    assert_eq!(page_ids(&res), vec![ids[2].to_string()]);
    let res = b
        .call(Req::get("/v1/workflows?state=submitted&tenant=a&limit=1"))
        .await;
    assert_eq!(page_ids(&res), vec![ids[4].to_string()]);
    assert_eq!(res.body["next"], ids[4].to_string());

    for (query, mentions) in [
        (
            "state=bogus",
            "submitted, waiting, placed, running, finished, failed, cancelling, cancelled, rejected",
        ),
        ("state=", "state"),
        ("limit=0", "limit"),
        ("limit=501", "1 to 500"),
        ("limit=-1", "limit"),
        ("limit=ten", "limit"),
        ("after=yesterday", "after"),
        ("tenant=Nope", "tenant"),
        ("color=red", "state, tenant, limit, after"),
        ("limit=1&limit=2", "more than once"),
    ] {
        let res = b.call(Req::get(&format!("/v1/workflows?{query}"))).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{query}");
        assert!(res.error().contains(mentions), "{query}: {}", res.error());
    }
}

async fn cancels(b: &mut Bench) {
    // Nothing running: cancelled at once.
    let idle = b.submit(&named("idle")).await;
    let res = b
        .call(
            Req::post(&format!("/v1/workflows/{idle}/cancel"))
                .json(&json!({"reason": "wrong input"}))
                .header("x-meridian-user", "ada"),
        )
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
    assert_eq!(
        res.body,
        json!({"id": idle.to_string(), "state": "cancelled"})
    );
    let res = b
        .call(Req::post(&format!("/v1/workflows/{idle}/cancel")))
        .await;
    assert_eq!(res.status, StatusCode::CONFLICT);
    assert_eq!(res.error(), "the workflow is cancelled or being cancelled");

    // A running job: cancelling until it settles.
    let busy = b.submit(PIPELINE_YAML).await;
    place(&*b.log, busy, "local").await;
    let prep = release(&*b.log, busy, "prep", None).await;
    start(&*b.log, prep, 1).await;
    let res = b
        .call(Req::post(&format!("/v1/workflows/{busy}/cancel")).header("x-meridian-user", "ada"))
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED);
    assert_eq!(
        res.body,
        json!({"id": busy.to_string(), "state": "cancelling"})
    );
    let loaded = load::<Workflow>(&*b.log, busy).await.unwrap();
    assert_eq!(loaded.state.state(), Some(AggregateState::CancelRequested));
    let last = loaded.history.last().unwrap();
    assert_eq!(last.payload.kind(), "workflow.cancel_requested.v1");
    // Same correlation as the submission: one chain per workflow.
    assert_eq!(last.correlation_id, loaded.history[0].correlation_id);

    // Twice: accepted, nothing new.
    let head = b.head().await;
    let res = b
        .call(Req::post(&format!("/v1/workflows/{busy}/cancel")))
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED);
    assert_eq!(res.body["state"], "cancelling");
    assert_eq!(b.head().await, head);

    b.catch_up().await;
    let res = b.call(Req::get(&format!("/v1/workflows/{busy}"))).await;
    assert_eq!(res.body["state"], "cancelling");
    assert_eq!(res.body["reason"], "cancel requested by ada");

    // A finished workflow cannot be cancelled.
    let done = b.submit(&named("done")).await;
    place(&*b.log, done, "local").await;
    let j = release(&*b.log, done, "hello", None).await;
    start(&*b.log, j, 1).await;
    finish(&*b.log, j, 2, 0).await;
    settle(&*b.log, done, j).await;
    let head = b.head().await;
    let res = b
        .call(Req::post(&format!("/v1/workflows/{done}/cancel")))
        .await;
    assert_eq!(res.status, StatusCode::CONFLICT);
    assert_eq!(res.error(), "the workflow is already finished");
    assert_eq!(b.head().await, head);
}

async fn lists_a_workflows_events(b: &mut Bench) {
    let id = b.submit(PIPELINE_YAML).await;
    let other = b.submit(HELLO_YAML).await;
    place(&*b.log, id, "local").await;
    let prep = release(&*b.log, id, "prep", None).await;
    submitted_to_site(&*b.log, prep, "4242").await;
    start(&*b.log, prep, 1).await;
    finish(&*b.log, prep, 2, 0).await;
    settle(&*b.log, id, prep).await;
    place(&*b.log, other, "local").await;

    let res = b
        .call(Req::get(&format!("/v1/workflows/{id}/events")))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let events = res.body["events"].as_array().unwrap();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["payload"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "workflow.submitted.v1",
            "workflow.placement_decided.v1",
            "workflow.job_released.v1",
            "job.dispatched.v1",
            "job.submitted_to_site.v1",
            "job.started.v1",
            "job.finished.v1",
            "workflow.job_settled.v1",
        ]
    );
    for e in events {
        let agg = e["aggregate"]["id"].as_str().unwrap();
        assert!(agg == id.to_string() || agg == prep.to_string(), "{e}");
        assert!(
            e["event_id"].is_string() && e["sequence"].is_u64() && e["occurred_at"].is_string()
        );
    }
    let times: Vec<&str> = events
        .iter()
        .map(|e| e["occurred_at"].as_str().unwrap())
        .collect();
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted);
}

async fn status_follows_a_workflow_to_the_end(b: &mut Bench) {
    let id = b.submit(PIPELINE_YAML).await;
    let status = |b: &Bench| {
        let uri = format!("/v1/workflows/{id}");
        let router = b.router.clone();
        let req = b.authed(Req::get(&uri));
        async move {
            let res = call(&router, req).await;
            assert_eq!(res.status, StatusCode::OK, "{}", res.body);
            res.body
        }
    };
    b.catch_up().await;
    let s = status(b).await;
    assert_eq!(s["state"], "submitted");
    assert_eq!(s["tasks"]["total"], 4);

    place(&*b.log, id, "hpc-eu").await;
    b.catch_up().await;
    let s = status(b).await;
    assert_eq!(s["state"], "placed");
    assert_eq!(s["site"], "hpc-eu");

    let prep = release(&*b.log, id, "prep", None).await;
    submitted_to_site(&*b.log, prep, "slurm-4242").await;
    b.catch_up().await;
    let s = status(b).await;
    assert_eq!(s["state"], "placed", "released but not started");
    assert_eq!(
        s["jobs"],
        json!([{
            "name": "prep", "index": null, "job_id": prep.to_string(), "attempt": 1,
            "site": "local", "state": "pending", "backend_job_id": "slurm-4242",
            "exit_code": null, "started_at": null, "ended_at": null, "reason": null
        }])
    );

    start(&*b.log, prep, 1).await;
    b.catch_up().await;
    let s = status(b).await;
    assert_eq!(s["state"], "running");
    assert_eq!(s["jobs"][0]["state"], "running");
    assert_eq!(s["jobs"][0]["started_at"], "2025-03-01T12:01:00.000000Z");
    assert_eq!(s["tasks"]["running"], 1);
    assert_eq!(s["tasks"]["pending"], 3);

    finish(&*b.log, prep, 2, 0).await;
    settle(&*b.log, id, prep).await;
    let mut sweep = Vec::new();
    for i in 1..=2 {
        let j = release(&*b.log, id, "sweep", Some(i)).await;
        start(&*b.log, j, 3).await;
        sweep.push(j);
    }
    b.catch_up().await;
    let s = status(b).await;
    assert_eq!(
        s["tasks"],
        json!({"total": 4, "pending": 1, "running": 2, "succeeded": 1, "failed": 0, "cancelled": 0})
    );
    assert_eq!(s["jobs"][0]["state"], "succeeded");
    assert_eq!(s["jobs"][0]["exit_code"], 0);
    assert_eq!(s["jobs"][0]["ended_at"], "2025-03-01T12:02:00.000000Z");
    assert_eq!(s["jobs"][1]["index"], 1);

    for j in sweep {
        finish(&*b.log, j, 4, 0).await;
        settle(&*b.log, id, j).await;
    }
    let last = release(&*b.log, id, "sweep", Some(3)).await;
    start(&*b.log, last, 5).await;
    finish(&*b.log, last, 6, 0).await;
    settle(&*b.log, id, last).await;
    b.catch_up().await;
    let s = status(b).await;
    assert_eq!(s["state"], "finished");
    assert_eq!(
        s["tasks"],
        json!({"total": 4, "pending": 0, "running": 0, "succeeded": 4, "failed": 0, "cancelled": 0})
    );
    assert_eq!(s["jobs"].as_array().unwrap().len(), 4);
    assert!(s["updated_at"].as_str().unwrap() > s["submitted_at"].as_str().unwrap());

    // A rebuild from the log yields the same rows.
    let before = b.read_model_rows().await;
    b.store
        .reset(&meridian_intake::StatusProjection)
        .await
        .unwrap();
    b.catch_up().await;
    assert_eq!(b.read_model_rows().await, before);
    assert_eq!(status(b).await, s);
}

async fn status_shows_failures_retries_and_rejections(b: &mut Bench) {
    // Placement rejected: says why.
    let nowhere = b.submit(&named("nowhere")).await;
    reject_placement(&*b.log, nowhere).await;
    b.catch_up().await;
    let res = b.call(Req::get(&format!("/v1/workflows/{nowhere}"))).await;
    assert_eq!(res.body["state"], "rejected");
    assert_eq!(
        res.body["reason"],
        "no site could take the workflow (attempt 1): hpc-eu: no H100"
    );
    // ... and a later placement clears it.
    place(&*b.log, nowhere, "local").await;
    b.catch_up().await;
    let res = b.call(Req::get(&format!("/v1/workflows/{nowhere}"))).await;
    assert_eq!(res.body["state"], "placed");
    assert_eq!(res.body["reason"], Value::Null);

    // A site's fault: the task runs again, as attempt 2.
    let id = b.submit(&named("flaky")).await;
    place(&*b.log, id, "local").await;
    let first = release(&*b.log, id, "hello", None).await;
    start(&*b.log, first, 1).await;
    fail(&*b.log, first, 2, FailureReason::NodeFailure).await;
    settle(&*b.log, id, first).await;
    b.catch_up().await;
    let res = b.call(Req::get(&format!("/v1/workflows/{id}"))).await;
    assert_eq!(res.body["state"], "running");
    assert_eq!(res.body["tasks"]["pending"], 1, "it will run again");
    assert_eq!(res.body["tasks"]["failed"], 0);
    assert_eq!(res.body["jobs"][0]["state"], "failed");
    assert_eq!(res.body["jobs"][0]["reason"], "a node failed");

    let second = release(&*b.log, id, "hello", None).await;
    start(&*b.log, second, 3).await;
    finish(&*b.log, second, 4, 3).await;
    settle(&*b.log, id, second).await;
    b.catch_up().await;
    let res = b.call(Req::get(&format!("/v1/workflows/{id}"))).await;
    let s = &res.body;
    assert_eq!(s["state"], "failed");
    assert_eq!(s["reason"], "hello failed");
    assert_eq!(
        s["tasks"],
        json!({"total": 1, "pending": 0, "running": 0, "succeeded": 0, "failed": 1, "cancelled": 0})
    );
    let jobs = s["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[1]["attempt"], 2);
    assert_eq!(jobs[1]["job_id"], second.to_string());
    assert_eq!(jobs[1]["state"], "failed");
    assert_eq!(jobs[1]["exit_code"], 3);
    assert_eq!(jobs[1]["reason"], "exited with code 3");

    let before = b.read_model_rows().await;
    b.store
        .reset(&meridian_intake::StatusProjection)
        .await
        .unwrap();
    b.catch_up().await;
    assert_eq!(b.read_model_rows().await, before);
}

async fn garbage_to_every_endpoint_changes_nothing(b: &mut Bench) {
    let id = b.submit(&named("target")).await;
    b.catch_up().await;
    let head = b.head().await;
    let w = format!("/v1/workflows/{id}");
    let cancel = format!("{w}/cancel");
    let big = vec![b'{'; 20_000];
    let cases: Vec<(Req, StatusCode)> = vec![
        // Bad ids everywhere.
        (Req::get("/v1/workflows/nope"), StatusCode::BAD_REQUEST),
        (
            Req::get("/v1/workflows/nope/events"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post("/v1/workflows/nope/cancel"),
            StatusCode::BAD_REQUEST,
        ),
        (Req::get("/v1/workflows/%00"), StatusCode::BAD_REQUEST),
        (
            Req::get(&format!("/v1/workflows/{}", "9".repeat(5000))),
            StatusCode::BAD_REQUEST,
        ),
        // Bad cancel bodies.
        (
            Req::post(&cancel).json(&json!({"reason": 5})),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post(&cancel).json(&json!({"why": "x"})),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post(&cancel).json(&json!(["reason"])),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post(&cancel).json(&json!({"reason": "r".repeat(1001)})),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post(&cancel)
                .header("content-type", "application/json")
                .body("{\"reason\":"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post(&cancel)
                .header("content-type", "application/json")
                .body(vec![0xff, 0x00]),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post(&cancel)
                .header("content-type", "text/plain")
                .body("please"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            Req::post(&cancel)
                .header("content-type", "application/json")
                .body(big),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            Req::post(&cancel).header("x-meridian-user", "u".repeat(300)),
            StatusCode::BAD_REQUEST,
        ),
        // Bad queries.
        (
            Req::get("/v1/workflows?limit=99999999999999999999"),
            StatusCode::BAD_REQUEST,
        ),
        (Req::get("/v1/workflows?after=%ZZ"), StatusCode::BAD_REQUEST),
        (
            Req::get("/v1/workflows?state=RUNNING"),
            StatusCode::BAD_REQUEST,
        ),
        (Req::get("/v1/workflows?=x"), StatusCode::BAD_REQUEST),
        // Bad submissions.
        (
            Req::post("/v1/workflows")
                .header("content-type", "image/png")
                .body(vec![0x89, b'P', b'N', b'G']),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            Req::post("/v1/workflows").json(&json!({"version": "v2"})),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post("/v1/workflows")
                .header("content-type", vec![0xff])
                .body(HELLO_YAML),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        // Unknown routes and wrong methods.
        // (`/` is the web console's.)
        (Req::get("/nope"), StatusCode::NOT_FOUND),
        (Req::get("/v1"), StatusCode::NOT_FOUND),
        (Req::get("/v2/workflows"), StatusCode::NOT_FOUND),
        // Bills and logs of nothing, or asked for wrongly.
        (
            Req::get("/v1/workflows/01936f3e-8a5c-7cc2-9b9e-3f1c2d4e5f60/bill"),
            StatusCode::NOT_FOUND,
        ),
        (
            Req::get("/v1/workflows/01936f3e-8a5c-7cc2-9b9e-3f1c2d4e5f60/logs"),
            StatusCode::NOT_FOUND,
        ),
        (Req::get("/v1/workflows/nope/bill"), StatusCode::BAD_REQUEST),
        (
            Req::get(&format!("{w}/logs?jobb=x")),
            StatusCode::BAD_REQUEST,
        ),
        (
            Req::post(&format!("{w}/bill")),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (Req::new(Method::DELETE, &w), StatusCode::METHOD_NOT_ALLOWED),
        (
            Req::new(Method::PUT, "/v1/workflows"),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (Req::get(&cancel), StatusCode::METHOD_NOT_ALLOWED),
        (
            Req::post(&format!("{w}/events")),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (Req::post("/v1/health"), StatusCode::METHOD_NOT_ALLOWED),
    ];
    for (req, status) in cases {
        let what = format!(
            "{} {} {:?}",
            req.method,
            req.uri.chars().take(80).collect::<String>(),
            String::from_utf8_lossy(&req.body)
                .chars()
                .take(40)
                .collect::<String>()
        );
        let res = b.call(req).await;
        assert_eq!(res.status, status, "{what}: {}", res.body);
        assert!(!res.error().is_empty(), "{what}");
        assert_eq!(b.head().await, head, "{what} changed the log");
    }
    // The workflow is untouched.
    let res = b.call(Req::get(&w)).await;
    assert_eq!(res.body["state"], "submitted");
}

async fn reports_health(b: &mut Bench) {
    let res = b.call(Req::get("/v1/health")).await;
    assert_eq!(res.status, StatusCode::OK);
    assert_eq!(
        res.body,
        json!({"status": "ok", "log_head": b.base_head, "projection_position": 0})
    );
    b.submit(HELLO_YAML).await;
    b.submit(HELLO_YAML).await;
    let head = b.head().await;
    let res = b.call(Req::get("/v1/health")).await;
    assert_eq!(res.body["log_head"], head);
    assert_eq!(res.body["projection_position"], 0);
    b.catch_up().await;
    let res = b.call(Req::get("/v1/health")).await;
    assert_eq!(res.body["projection_position"], head);
}

async fn counts_array_tasks_and_dispatches_seen_first(b: &mut Bench) {
    let doc = "
version: v1
name: sweep
jobs:
  cell:
    image: host
    command: [echo, cell]
    array: {start: 1, end: 1000000, parallelism: 50}
";
    let id = b.submit(doc).await;
    place(&*b.log, id, "local").await;
    // The Job's dispatch lands in the log before the workflow's release of it.
    let job_id = Uuid::now_v7();
    let spec = load::<Workflow>(&*b.log, id)
        .await
        .unwrap()
        .state
        .spec()
        .unwrap()
        .clone();
    let ctx = meridian_events::EventContext::new_chain("default");
    meridian_eventlog::aggregates::execute::<meridian_events::aggregate::Job, _>(
        &*b.log,
        job_id,
        &ctx,
        |_| meridian_events::aggregate::JobCommand::Dispatch {
            workflow_id: id,
            job: "cell".into(),
            index: Some(7),
            attempt: 1,
            site: "local".into(),
            rate: rate(),
            resources: spec.jobs["cell"].resources.clone(),
            batch: None,
        },
    )
    .await
    .unwrap();
    meridian_eventlog::aggregates::execute::<Workflow, _>(&*b.log, id, &ctx, |_| {
        meridian_events::aggregate::WorkflowCommand::ReleaseJob {
            job: "cell".into(),
            index: Some(7),
            job_id,
            site: "local".into(),
        }
    })
    .await
    .unwrap();
    start(&*b.log, job_id, 1).await;
    b.catch_up().await;
    let res = b.call(Req::get(&format!("/v1/workflows/{id}"))).await;
    assert_eq!(
        res.body["tasks"],
        json!({"total": 1000000, "pending": 999999, "running": 1, "succeeded": 0, "failed": 0, "cancelled": 0})
    );
    assert_eq!(res.body["state"], "running");
    let jobs = res.body["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["index"], 7);
    assert_eq!(jobs[0]["job_id"], job_id.to_string());
}
