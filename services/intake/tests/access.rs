//! Who may do what, through the API: every endpoint × every kind of caller × its own
//! tenant's things or another's, each answer checked against the table of rights in
//! `docs/security.md` (written out again here, apart from the code that enforces it),
//! and nothing appended to the log by a refused request. Then the audit trail, tokens'
//! lifecycle, and workflow credentials.

mod common;

use axum::http::{Method, StatusCode};
use common::*;
use meridian_app::{Grant, Role};
use serde_json::{json, Value};
use sqlx::Row;
use uuid::Uuid;

const OWN: &str = "physics";
const OTHER: &str = "chem";

const CATALOG: &str = r#"
sites:
  - name: cheap
    kind: local
    region: campus-1
    jurisdiction: eu
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      compute: [{offer: cpu, per_core_hour: "0.01", per_gib_hour: "0.001"}]
    shapes: [{name: cpu, offer: cpu, cpus: 64, memory: 256GiB}]
"#;

/// Who calls, by the name the table of rights uses.
struct Caller {
    name: &'static str,
    /// `None`: no credentials at all.
    token: Option<String>,
}

/// The table of rights: which callers each endpoint answers (before tenant checks).
fn allowed(endpoint: &str, caller: &str) -> bool {
    let readers = ["researcher", "agent", "agent+grants", "admin"];
    let callers: &[&str] = match endpoint {
        "health" => &[
            "anonymous",
            "bad-token",
            "researcher",
            "agent",
            "agent+grants",
            "finance",
            "finance-all",
            "admin",
            "job",
        ],
        "submit" => &["researcher", "agent+grants", "admin", "job"],
        "status" | "events" | "logs" => &["researcher", "agent", "agent+grants", "admin", "job"],
        "list" | "quote" | "get-policy" => &readers,
        "cancel" => &["researcher", "agent+grants", "admin", "job"],
        "bill" | "tenant-bill" => &[
            "researcher",
            "agent",
            "agent+grants",
            "finance",
            "finance-all",
            "admin",
        ],
        "export" | "list-adjustments" => &["finance", "finance-all", "admin"],
        "get-budget" => &[
            "researcher",
            "agent",
            "agent+grants",
            "finance",
            "finance-all",
            "admin",
        ],
        "sites" => &[
            "researcher",
            "agent",
            "agent+grants",
            "finance",
            "finance-all",
            "admin",
        ],
        "apply-sites" | "drain" | "undrain" | "refresh-shapes" | "set-policy"
        | "grant-adjustment" | "revoke-adjustment" | "issue-token" | "list-tokens"
        | "revoke-token" | "audit" | "set-budget" => &["admin"],
        other => panic!("no rights for {other}"),
    };
    callers.contains(&caller)
}

/// What an endpoint's things belong to.
#[derive(Clone, Copy, PartialEq)]
enum Scope {
    /// Nobody's: sites, tokens, the audit trail.
    Global,
    /// A tenant's (its bills, policy, adjustments) or a workflow's.
    Owned,
}

const ENDPOINTS: [(&str, Scope, StatusCode); 27] = [
    ("health", Scope::Global, StatusCode::OK),
    ("submit", Scope::Owned, StatusCode::ACCEPTED),
    ("list", Scope::Owned, StatusCode::OK),
    ("status", Scope::Owned, StatusCode::OK),
    ("events", Scope::Owned, StatusCode::OK),
    ("logs", Scope::Owned, StatusCode::OK),
    ("cancel", Scope::Owned, StatusCode::ACCEPTED),
    ("bill", Scope::Owned, StatusCode::OK),
    ("tenant-bill", Scope::Owned, StatusCode::OK),
    ("export", Scope::Owned, StatusCode::OK),
    ("quote", Scope::Global, StatusCode::OK),
    ("sites", Scope::Global, StatusCode::OK),
    ("apply-sites", Scope::Global, StatusCode::OK),
    ("drain", Scope::Global, StatusCode::OK),
    ("undrain", Scope::Global, StatusCode::OK),
    ("refresh-shapes", Scope::Global, StatusCode::ACCEPTED),
    ("get-policy", Scope::Owned, StatusCode::OK),
    ("set-policy", Scope::Owned, StatusCode::OK),
    ("list-adjustments", Scope::Owned, StatusCode::OK),
    ("grant-adjustment", Scope::Owned, StatusCode::CREATED),
    ("revoke-adjustment", Scope::Owned, StatusCode::OK),
    ("get-budget", Scope::Owned, StatusCode::OK),
    ("set-budget", Scope::Owned, StatusCode::OK),
    ("issue-token", Scope::Global, StatusCode::CREATED),
    ("list-tokens", Scope::Global, StatusCode::OK),
    ("revoke-token", Scope::Global, StatusCode::OK),
    ("audit", Scope::Global, StatusCode::OK),
];

struct World {
    /// A workflow of each tenant; `own_job` is the one the job credential speaks for.
    own_job: Uuid,
    own: Uuid,
    other: Uuid,
}

async fn submit_in(b: &Bench, tenant: &str) -> Uuid {
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HELLO_YAML)
                .header("x-meridian-tenant", tenant),
        )
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
    res.id()
}

/// The request for `endpoint` on the caller's own tenant's things, or another's. Writes
/// that can happen once get a fresh target: a new workflow, adjustment or token.
async fn request(b: &Bench, w: &World, endpoint: &str, caller: &Caller, own: bool) -> Req {
    let tenant = if own { OWN } else { OTHER };
    let workflow = match (own, caller.name) {
        (true, "job") => w.own_job,
        (true, _) => w.own,
        (false, _) => w.other,
    };
    let month = chrono::Utc::now().format("%Y-%m");
    match endpoint {
        "health" => Req::get("/v1/health"),
        "submit" => {
            let req = Req::post("/v1/workflows").yaml(HELLO_YAML);
            if own {
                req
            } else {
                req.header("x-meridian-tenant", OTHER)
            }
        }
        "list" => Req::get(&format!("/v1/workflows?tenant={tenant}")),
        "status" => Req::get(&format!("/v1/workflows/{workflow}")),
        "events" => Req::get(&format!("/v1/workflows/{workflow}/events")),
        "logs" => Req::get(&format!("/v1/workflows/{workflow}/logs")),
        "bill" => Req::get(&format!("/v1/workflows/{workflow}/bill")),
        "cancel" => {
            // Its own new workflow to cancel (for a job: a child it submitted).
            let target = if !own {
                submit_in(b, OTHER).await
            } else if caller.name == "job" {
                let res = b
                    .call(
                        Req::post("/v1/workflows")
                            .yaml(HELLO_YAML)
                            .bearer(caller.token.as_deref().unwrap()),
                    )
                    .await;
                assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
                res.id()
            } else {
                submit_in(b, OWN).await
            };
            Req::post(&format!("/v1/workflows/{target}/cancel"))
        }
        "tenant-bill" => Req::get(&format!("/v1/tenants/{tenant}/bills?period={month}")),
        "export" => Req::get(&format!(
            "/v1/exports/focus?period={month}&format=json&tenant={tenant}"
        )),
        "quote" => Req::post("/v1/quotes").yaml(HELLO_YAML),
        "sites" => Req::get("/v1/sites"),
        "apply-sites" => Req::new(Method::PUT, "/v1/sites").yaml(CATALOG),
        "drain" => Req::post("/v1/sites/cheap/drain"),
        "undrain" => Req::post("/v1/sites/cheap/undrain"),
        "refresh-shapes" => Req::post("/v1/sites/cheap/refresh"),
        "get-policy" => Req::get(&format!("/v1/tenants/{tenant}/policy")),
        "set-policy" => {
            Req::new(Method::PUT, &format!("/v1/tenants/{tenant}/policy")).json(&json!({}))
        }
        "list-adjustments" => Req::get(&format!("/v1/tenants/{tenant}/adjustments")),
        "get-budget" => Req::get(&format!("/v1/tenants/{tenant}/budget")),
        "set-budget" => {
            Req::new(Method::PUT, &format!("/v1/tenants/{tenant}/budget")).json(&json!({}))
        }
        "grant-adjustment" => Req::post(&format!("/v1/tenants/{tenant}/adjustments"))
            .json(&json!({"terms": {"kind": "percent_discount", "percent": "10"}})),
        "revoke-adjustment" => {
            let res = b
                .call(
                    Req::post(&format!("/v1/tenants/{tenant}/adjustments"))
                        .json(&json!({"terms": {"kind": "percent_discount", "percent": "5"}})),
                )
                .await;
            assert_eq!(res.status, StatusCode::CREATED, "{}", res.body);
            let id = res.body["id"].as_str().unwrap().to_string();
            Req::post(&format!("/v1/tenants/{tenant}/adjustments/{id}/revoke"))
        }
        "issue-token" => {
            Req::post("/v1/tokens").json(&json!({"role": "researcher", "tenant": OWN}))
        }
        "list-tokens" => Req::get("/v1/tokens"),
        "revoke-token" => {
            let token = b.token(Some(OWN), Role::Researcher, vec![]).await;
            let id = &token["mer_".len().."mer_".len() + 32];
            Req::post(&format!(
                "/v1/tokens/{}/revoke",
                Uuid::parse_str(id).unwrap()
            ))
        }
        "audit" => Req::get("/v1/audit"),
        other => panic!("no request for {other}"),
    }
}

/// What `caller` must get from `endpoint` on its own or another tenant's things.
fn expected(endpoint: &str, scope: Scope, ok: StatusCode, caller: &str, own: bool) -> StatusCode {
    if endpoint == "health" {
        return ok;
    }
    if matches!(caller, "anonymous" | "bad-token") {
        return StatusCode::UNAUTHORIZED;
    }
    let every_tenant = matches!(caller, "admin" | "finance-all");
    if endpoint == "submit" && !own && !every_tenant {
        // It asked to act in another tenant (X-Meridian-Tenant).
        return StatusCode::FORBIDDEN;
    }
    if !allowed(endpoint, caller) {
        return StatusCode::FORBIDDEN;
    }
    if scope == Scope::Owned && !own && !every_tenant && endpoint != "list" {
        return StatusCode::NOT_FOUND;
    }
    ok
}

#[tokio::test]
async fn every_endpoint_answers_every_caller_as_the_table_says() {
    let b = Bench::new(Db::Sqlite).await;
    let res = b
        .call(Req::new(Method::PUT, "/v1/sites").yaml(CATALOG))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let world = World {
        own_job: submit_in(&b, OWN).await,
        own: submit_in(&b, OWN).await,
        other: submit_in(&b, OTHER).await,
    };
    let callers = vec![
        Caller {
            name: "anonymous",
            token: None,
        },
        Caller {
            name: "bad-token",
            token: Some(format!(
                "mer_{}_{}",
                Uuid::now_v7().simple(),
                "0".repeat(64)
            )),
        },
        Caller {
            name: "researcher",
            token: Some(b.token(Some(OWN), Role::Researcher, vec![]).await),
        },
        Caller {
            name: "agent",
            token: Some(b.token(Some(OWN), Role::Agent, vec![]).await),
        },
        Caller {
            name: "agent+grants",
            token: Some(
                b.token(Some(OWN), Role::Agent, vec![Grant::Submit, Grant::Cancel])
                    .await,
            ),
        },
        Caller {
            name: "finance",
            token: Some(b.token(Some(OWN), Role::Finance, vec![]).await),
        },
        Caller {
            name: "finance-all",
            token: Some(b.token(None, Role::Finance, vec![]).await),
        },
        Caller {
            name: "admin",
            token: Some(b.token(None, Role::Admin, vec![]).await),
        },
        Caller {
            name: "job",
            token: Some(b.credentials.mint(world.own_job)),
        },
    ];

    let mut failures = Vec::new();
    let mut checked = 0;
    for (endpoint, scope, ok) in ENDPOINTS {
        for caller in &callers {
            let sides: &[bool] = if scope == Scope::Global {
                &[true]
            } else {
                &[true, false]
            };
            for &own in sides {
                let req = request(&b, &world, endpoint, caller, own).await;
                let req = match &caller.token {
                    Some(token) => req.bearer(token),
                    None => req.anonymous(),
                };
                let head = b.head().await;
                let res = b.call(req).await;
                let want = expected(endpoint, scope, ok, caller.name, own);
                checked += 1;
                let side = if own { "own" } else { "other" };
                if res.status != want {
                    failures.push(format!(
                        "{endpoint} by {} on its {side} tenant: {} (wanted {want}): {}",
                        caller.name, res.status, res.body
                    ));
                }
                if !res.status.is_success() && b.head().await != head {
                    failures.push(format!(
                        "{endpoint} by {} on its {side} tenant was refused ({}) yet appended to the log",
                        caller.name, res.status
                    ));
                }
                // Another tenant's list is empty: it says nothing of that tenant.
                if endpoint == "list" && !own && res.status.is_success() && caller.name != "admin" {
                    if let Some(items) = res.body["items"].as_array() {
                        if items.iter().any(|i| i["tenant"] == OTHER) {
                            failures
                                .push(format!("list by {} shows {OTHER}'s workflows", caller.name));
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 300, "only {checked} checks");
    assert!(
        failures.is_empty(),
        "{} of {checked} answers were wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // A hidden workflow is answered exactly as one that does not exist.
    let researcher = callers[2].token.as_deref().unwrap();
    let hidden = b
        .call(Req::get(&format!("/v1/workflows/{}", world.other)).bearer(researcher))
        .await;
    let missing_id = Uuid::now_v7();
    let missing = b
        .call(Req::get(&format!("/v1/workflows/{missing_id}")).bearer(researcher))
        .await;
    assert_eq!(hidden.status, missing.status);
    assert_eq!(
        hidden.error().replace(&world.other.to_string(), "ID"),
        missing.error().replace(&missing_id.to_string(), "ID")
    );
    b.finish().await;
}

fn records(res: &Res) -> Vec<Value> {
    res.body["records"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn writes_and_refusals_are_audited_and_tokens_end() {
    let b = Bench::new(Db::Sqlite).await;
    let token = b.token(Some(OWN), Role::Researcher, vec![]).await;
    let id = {
        let res = b
            .call(Req::post("/v1/workflows").yaml(HELLO_YAML).bearer(&token))
            .await;
        assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
        res.id()
    };
    let refused = b
        .call(Req::post("/v1/sites/cheap/drain").bearer(&token))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let anonymous = b.call(Req::get("/v1/workflows").anonymous()).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert!(anonymous.header("www-authenticate").is_some());

    let audit = b.call(Req::get(&format!("/v1/audit?tenant={OWN}"))).await;
    assert_eq!(audit.status, StatusCode::OK, "{}", audit.body);
    let own = records(&audit);
    let token_id = &token["mer_".len().."mer_".len() + 32];
    let token_id = Uuid::parse_str(token_id).unwrap().to_string();
    assert!(own.iter().any(|r| r["action"] == "submit_workflow"
        && r["outcome"] == "ok"
        && r["target"] == format!("workflow/{id}")
        && r["token_id"] == token_id.as_str()
        && r["role"] == "researcher"));
    assert!(own
        .iter()
        .any(|r| r["action"] == "change_sites" && r["outcome"] == "forbidden"));
    let all = records(&b.call(Req::get("/v1/audit")).await);
    assert!(all
        .iter()
        .any(|r| r["action"] == "GET /v1/workflows" && r["outcome"] == "unauthenticated"));
    // The trail never holds a token's value.
    let text = serde_json::to_string(&all).unwrap();
    assert!(!text.contains(&token) && !text.contains(&b.admin_token));
    // In a file of its own (as `meridian up` keeps it), not the store's.
    assert!(!b.store.has_table("audit_records").await.unwrap());
    let kept: i64 = sqlx::query("SELECT count(*) FROM audit_records")
        .fetch_one(b.audit.pool())
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept as usize, all.len());

    // Revoked: refused from then on, though the token was read a moment before (and so
    // is held, see services/app/src/held.rs).
    let res = b.call(Req::get("/v1/workflows").bearer(&token)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    let res = b
        .call(Req::post(&format!("/v1/tokens/{token_id}/revoke")))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["revoked"], true);
    let res = b.call(Req::get("/v1/workflows").bearer(&token)).await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);
    let res = b
        .call(Req::post(&format!("/v1/tokens/{token_id}/revoke")))
        .await;
    assert_eq!(res.status, StatusCode::CONFLICT);

    // Expiry in the past, a job role, grants for a researcher: refused, with why.
    for (body, says) in [
        (
            json!({"role": "researcher", "tenant": OWN, "expires_at": "2020-01-01T00:00:00Z"}),
            "not in the future",
        ),
        (
            json!({"role": "job", "tenant": OWN}),
            "workflow credentials",
        ),
        (
            json!({"role": "researcher", "tenant": OWN, "grants": ["submit"]}),
            "grants",
        ),
        (json!({"role": "researcher"}), "--tenant"),
        (json!({"role": "owner", "tenant": OWN}), "role"),
    ] {
        let head = b.head().await;
        let res = b.call(Req::post("/v1/tokens").json(&body)).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.body);
        assert!(res.error().contains(says), "{body}: {}", res.error());
        assert_eq!(b.head().await, head);
    }

    // The list shows every token, never a value.
    let list = b.call(Req::get("/v1/tokens")).await;
    let text = list.body.to_string();
    assert!(text.contains(&token_id) && !text.contains(&token) && !text.contains("secret"));
    b.finish().await;
}

#[tokio::test]
async fn a_workflow_credential_acts_for_its_workflow_until_it_ends() {
    let b = Bench::new(Db::Sqlite).await;
    let parent = submit_in(&b, OWN).await;
    let sibling = submit_in(&b, OWN).await;
    let credential = b.credentials.mint(parent);

    // It submits a child in its workflow's tenant, recorded as the parent's child.
    let res = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HELLO_YAML)
                .bearer(&credential),
        )
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
    let child = res.id();
    let events = b.all_events().await;
    let submitted = events
        .iter()
        .find(|e| e["aggregate"]["id"] == child.to_string())
        .unwrap();
    assert_eq!(submitted["tenant"], OWN);
    assert_eq!(
        submitted["payload"]["parent_workflow_id"],
        parent.to_string()
    );

    // It follows its workflow and its child, nothing else of its tenant.
    for (id, want) in [
        (parent, StatusCode::OK),
        (child, StatusCode::OK),
        (sibling, StatusCode::NOT_FOUND),
    ] {
        let res = b
            .call(Req::get(&format!("/v1/workflows/{id}")).bearer(&credential))
            .await;
        assert_eq!(res.status, want, "{id}: {}", res.body);
    }
    // A credential made with another key, or altered, is refused.
    let forged = meridian_app::WorkflowCredentials::generate().mint(parent);
    let res = b
        .call(Req::get(&format!("/v1/workflows/{parent}")).bearer(&forged))
        .await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED);

    // Once its workflow ends, it is refused.
    let res = b
        .call(Req::post(&format!("/v1/workflows/{parent}/cancel")).bearer(&credential))
        .await;
    assert_eq!(res.status, StatusCode::ACCEPTED, "{}", res.body);
    assert_eq!(res.body["state"], "cancelled");
    let res = b
        .call(Req::get(&format!("/v1/workflows/{child}")).bearer(&credential))
        .await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.body);
    b.finish().await;
}

const PRICED: &str = r#"
sites:
  - name: dear
    kind: slurm
    region: campus-1
    jurisdiction: eu
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      compute: [{offer: cpu, per_core_hour: "10.00", per_gib_hour: "0"}]
    shapes: [{name: cpu, offer: cpu, cpus: 64, memory: 256GiB}]
"#;

const HOUR_JOB: &str = "version: v1\nname: hour\njobs:\n  a:\n    image: host\n    command: [\"true\"]\n    resources: {cpus: 1, memory: 1GiB, walltime: 1h}\n";

/// A month's budget holds: a submission whose estimate would pass it is refused with
/// the numbers, and of several racing submissions only as many pass as it covers.
#[tokio::test]
async fn submissions_over_the_monthly_budget_are_refused_even_when_they_race() {
    let b = Bench::new(Db::Sqlite).await;
    let res = b
        .call(Req::new(Method::PUT, "/v1/sites").yaml(PRICED))
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    connect_all(&*b.log).await;
    let quote = b
        .call(
            Req::post("/v1/quotes")
                .yaml(HOUR_JOB)
                .header("x-meridian-tenant", OWN),
        )
        .await;
    assert_eq!(quote.status, StatusCode::OK, "{}", quote.body);
    let estimate: rust_decimal::Decimal = quote.body["estimated_cost"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(estimate > rust_decimal::Decimal::ZERO);
    // Room for two and a half.
    let budget = estimate * rust_decimal::Decimal::new(25, 1);
    // Read once without a budget, so that the tenant is held as having none: setting it
    // below must be seen by the next submission all the same.
    let res = b.call(Req::get(&format!("/v1/tenants/{OWN}/budget"))).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);

    // Bad budgets are refused naming the field, and change nothing.
    for (body, says) in [
        (json!({"money_per_month": "lots"}), "money_per_month"),
        (json!({"gpus_per_month": 3}), "gpus_per_month"),
    ] {
        let head = b.head().await;
        let res = b
            .call(Req::new(Method::PUT, &format!("/v1/tenants/{OWN}/budget")).json(&body))
            .await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{}", res.body);
        assert!(res.error().contains(says), "{}", res.error());
        assert_eq!(b.head().await, head);
    }
    let res = b
        .call(
            Req::new(Method::PUT, &format!("/v1/tenants/{OWN}/budget"))
                .json(&json!({"money_per_month": format!("{budget} USD")})),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);

    // Five at once: two pass, three are refused.
    let researcher = b.token(Some(OWN), Role::Researcher, vec![]).await;
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let router = b.router.clone();
            let req = Req::post("/v1/workflows")
                .yaml(HOUR_JOB)
                .bearer(&researcher);
            tokio::spawn(async move { call(&router, req).await })
        })
        .collect();
    let mut accepted = 0;
    let mut refused = Vec::new();
    for t in tasks {
        let res = t.await.unwrap();
        match res.status {
            StatusCode::ACCEPTED => accepted += 1,
            StatusCode::PAYMENT_REQUIRED => refused.push(res.error().to_string()),
            other => panic!("{other}: {}", res.body),
        }
    }
    assert_eq!(accepted, 2, "{refused:?}");
    assert_eq!(refused.len(), 3);
    let message = &refused[0];
    for number in [
        format!(
            "budget for {} is {budget} USD",
            chrono::Utc::now().format("%Y-%m")
        ),
        "0 USD is billed".to_string(),
        format!("{} USD is in flight", estimate * rust_decimal::Decimal::TWO),
        format!("estimate of {estimate} USD"),
    ] {
        assert!(message.contains(&number), "{message:?} lacks {number:?}");
    }

    // Where it stands.
    let view = b
        .call(Req::get(&format!("/v1/tenants/{OWN}/budget")).bearer(&researcher))
        .await;
    assert_eq!(view.status, StatusCode::OK, "{}", view.body);
    assert_eq!(
        view.body["in_flight"],
        format!("{} USD", estimate * rust_decimal::Decimal::TWO)
    );
    assert_eq!(
        view.body["left"],
        format!("{} USD", budget - estimate * rust_decimal::Decimal::TWO)
    );
    // Another tenant has no budget and is not held to this one.
    let other = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HOUR_JOB)
                .header("x-meridian-tenant", OTHER),
        )
        .await;
    assert_eq!(other.status, StatusCode::ACCEPTED, "{}", other.body);
    b.finish().await;
}

/// GPU-hours have their own monthly budget: each workflow counts each task's GPUs over
/// its walltime until it ends; one that would pass the budget is refused with the numbers.
#[tokio::test]
async fn submissions_over_the_monthly_gpu_hours_are_refused() {
    let b = Bench::new(Db::Sqlite).await;
    let res = b
        .call(
            Req::new(Method::PUT, &format!("/v1/tenants/{OWN}/budget"))
                .json(&json!({"gpu_hours_per_month": "10"})),
        )
        .await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["gpu_hours_per_month"], "10");
    let six = "version: v1\nname: six\njobs:\n  a:\n    image: host\n    command: [\"true\"]\n    resources: {gpus: {count: 2, vendor: any}, walltime: 3h}\n";
    let first = b
        .call(
            Req::post("/v1/workflows")
                .yaml(six)
                .header("x-meridian-tenant", OWN),
        )
        .await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    let head = b.head().await;
    let second = b
        .call(
            Req::post("/v1/workflows")
                .yaml(six)
                .header("x-meridian-tenant", OWN),
        )
        .await;
    assert_eq!(
        second.status,
        StatusCode::PAYMENT_REQUIRED,
        "{}",
        second.body
    );
    assert_eq!(
        second.error(),
        format!(
            "over the GPU-hour budget: the tenant may hold 10 GPU-hours in {}; 0 were used and 6 are in flight, so this workflow's 6 would bring it to 12",
            chrono::Utc::now().format("%Y-%m")
        )
    );
    assert_eq!(b.head().await, head, "a refused submission appends nothing");
    let view = b.call(Req::get(&format!("/v1/tenants/{OWN}/budget"))).await;
    assert_eq!(view.body["gpu_hours_in_flight"], "6");
    assert_eq!(view.body["gpu_hours_left"], "4");
    // The first runs an hour on 2 GPUs and ends: 2 GPU-hours used, none in flight, so a
    // second workflow of 6 fits now.
    let id = first.id();
    place(&*b.log, id, "local").await;
    let job_id = release(&*b.log, id, "a", None).await;
    let now = chrono::Utc::now();
    job(
        &*b.log,
        job_id,
        meridian_events::aggregate::JobCommand::Start {
            started_at: now - chrono::Duration::hours(1),
            allocated: meridian_events::vocabulary::Allocation {
                nodes: 1,
                cpus: 1,
                memory_bytes: 1 << 30,
                gpus: Some(meridian_events::vocabulary::AllocatedGpus {
                    count: 2,
                    vendor: meridian_events::vocabulary::AcceleratorVendor::Nvidia,
                    model: None,
                }),
            },
            hosts: vec!["node1".into()],
        },
    )
    .await;
    job(
        &*b.log,
        job_id,
        meridian_events::aggregate::JobCommand::Finish {
            ended_at: now,
            exit_code: 0,
            usage: Default::default(),
        },
    )
    .await;
    settle(&*b.log, id, job_id).await;
    b.catch_up().await;
    let view = b.call(Req::get(&format!("/v1/tenants/{OWN}/budget"))).await;
    assert_eq!(view.body["gpu_hours_used"], "2", "{}", view.body);
    assert_eq!(view.body["gpu_hours_in_flight"], "0", "{}", view.body);
    let again = b
        .call(
            Req::post("/v1/workflows")
                .yaml(six)
                .header("x-meridian-tenant", OWN),
        )
        .await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);

    // CPU-only work needs no GPU-hours and is not held to them.
    let cpu = b
        .call(
            Req::post("/v1/workflows")
                .yaml(HELLO_YAML)
                .header("x-meridian-tenant", OWN),
        )
        .await;
    assert_eq!(cpu.status, StatusCode::ACCEPTED, "{}", cpu.body);
    let bad = b
        .call(
            Req::new(Method::PUT, &format!("/v1/tenants/{OWN}/budget"))
                .json(&json!({"gpu_hours_per_month": "many"})),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(
        bad.error().starts_with("gpu_hours_per_month:"),
        "{}",
        bad.error()
    );
    b.finish().await;
}

/// Bodies are JSON objects whose values follow the formats the OpenAPI document states,
/// each a 400 naming the field when they do not, with nothing changed.
#[tokio::test]
async fn bodies_follow_the_documented_formats() {
    let b = Bench::new(Db::Sqlite).await;
    let budget = format!("/v1/tenants/{OWN}/budget");
    let put = |body: Value| Req::new(Method::PUT, &budget).json(&body);
    let refused = [
        (json!([null, null]), "expected a JSON object"),
        (
            json!({"money_per_month": "0 USD"}),
            "money_per_month: expected an amount above zero",
        ),
        (
            json!({"money_per_month": " 5 USD"}),
            "money_per_month: expected",
        ),
        (
            json!({"gpu_hours_per_month": 10}),
            "gpu_hours_per_month: invalid type",
        ),
        (
            json!({"gpu_hours_per_month": "1e3"}),
            "gpu_hours_per_month: expected a number of hours",
        ),
        (
            json!({"concurrent_gpus": 2147483648u64}),
            "concurrent_gpus: expected at most",
        ),
        (
            json!({"concurrent_gpus": 2.5}),
            "concurrent_gpus: invalid type",
        ),
    ];
    for (body, why) in refused {
        let res = b.call(put(body.clone())).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.body);
        assert!(
            res.body["error"].as_str().unwrap().contains(why),
            "{body}: {}",
            res.body
        );
    }
    let res = b.call(Req::new(Method::GET, &budget)).await;
    assert!(
        res.body["money_per_month"].is_null(),
        "nothing changed: {}",
        res.body
    );
    // A number written as a decimal is the integer it is (JSON Schema says so).
    let res = b.call(put(json!({"concurrent_gpus": 2.0}))).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    assert_eq!(res.body["concurrent_gpus"], 2);

    let policy = format!("/v1/tenants/{OWN}/policy");
    for (body, why) in [
        (json!({"sites": [" eu"]}), "sites: expected a name"),
        (json!({"residency": ""}), "residency: expected a name"),
        (
            json!({"budget_per_workflow": "0 USD"}),
            "budget_per_workflow: expected an amount above zero",
        ),
    ] {
        let res = b.call(Req::new(Method::PUT, &policy).json(&body)).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.body);
        assert!(
            res.body["error"].as_str().unwrap().contains(why),
            "{body}: {}",
            res.body
        );
    }

    let adjustments = format!("/v1/tenants/{OWN}/adjustments");
    for (terms, why) in [
        (
            json!({"kind": "percent_discount", "percent": "+5"}),
            "terms.percent: expected a decimal",
        ),
        (
            json!({"kind": "percent_discount", "percent": 5}),
            "terms: invalid type",
        ),
        (
            json!({"kind": "committed_rate", "meter": "gpu_hours", "unit_price": "1.8", "currency": "usd"}),
            "terms.currency: expected a currency code",
        ),
    ] {
        let res = b
            .call(Req::new(Method::POST, &adjustments).json(&json!({"terms": terms})))
            .await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{terms}: {}", res.body);
        assert!(
            res.body["error"].as_str().unwrap().contains(why),
            "{terms}: {}",
            res.body
        );
    }
    // Revoking what was never granted is not found, however many the tenant has.
    let res = b
        .call(Req::new(
            Method::POST,
            &format!("{adjustments}/{}/revoke", Uuid::now_v7()),
        ))
        .await;
    assert_eq!(res.status, StatusCode::NOT_FOUND, "{}", res.body);
}

#[tokio::test]
async fn a_run_reports_itself_with_its_own_run_credential_and_nothing_else_may() {
    let b = Bench::new(Db::Sqlite).await;
    let job = Uuid::now_v7();
    let other = Uuid::now_v7();
    let run = b.credentials.mint_run(job);
    assert!(run.starts_with("mer_run_"), "{run}");
    let report = |body: Value, token: &str| {
        Req::post(&format!("/v1/runs/{job}/report"))
            .json(&body)
            .bearer(token)
    };
    let head = b.head().await;

    // Anyone else is refused: no token, an admin's, the workflow's, another run's, a forged one.
    let forged = meridian_app::WorkflowCredentials::generate().mint_run(job);
    let refused = [
        ("admin", b.admin_token.clone()),
        ("workflow credential", b.credentials.mint(job)),
        ("another run's", b.credentials.mint_run(other)),
        ("forged", forged),
    ];
    for (who, token) in refused {
        let res = b.call(report(json!({"event": "started"}), &token)).await;
        assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{who}: {}", res.body);
        assert!(
            res.error().contains("run credential"),
            "{who}: {}",
            res.body
        );
    }
    let res = b
        .call(
            Req::post(&format!("/v1/runs/{job}/report"))
                .json(&json!({"event": "started"}))
                .anonymous(),
        )
        .await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.body);
    // Who calls is checked before what they send: a bad body or stream without the
    // run's credential is refused as such, and tells nothing of the route's rules.
    let res = b
        .call(report(json!({"event": "started", "": 1}), &b.admin_token))
        .await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.body);
    let res = b
        .call(
            Req::new(Method::PUT, &format!("/v1/runs/{job}/output/0"))
                .body("x")
                .anonymous(),
        )
        .await;
    assert_eq!(res.status, StatusCode::UNAUTHORIZED, "{}", res.body);

    // Bad input names what is wrong and keeps nothing.
    for (body, expected) in [
        (json!({"event": "finished"}), "finished"),
        (json!({"event": "exited"}), "exit_code"),
        (json!({"event": "started", "code": 1}), "code"),
    ] {
        let res = b.call(report(body.clone(), &run)).await;
        assert_eq!(res.status, StatusCode::BAD_REQUEST, "{body}: {}", res.body);
        assert!(res.error().contains(expected), "{body}: {}", res.body);
    }
    let res = b
        .call(
            Req::new(Method::PUT, &format!("/v1/runs/{job}/output/stdin"))
                .body("x")
                .bearer(&run),
        )
        .await;
    assert_eq!(res.status, StatusCode::BAD_REQUEST);
    assert!(res.error().contains("stdout or stderr"), "{}", res.body);
    assert!(
        meridian_store::run_reports::read(&b.store, &job.to_string())
            .await
            .unwrap()
            .is_none(),
        "a refused report kept something"
    );

    // Its own credential: start, output, exit; a second exit changes nothing.
    let res = b.call(report(json!({"event": "started"}), &run)).await;
    assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    for (stream, text) in [("stdout", "hello\n"), ("stderr", "warning\n")] {
        let res = b
            .call(
                Req::new(Method::PUT, &format!("/v1/runs/{job}/output/{stream}"))
                    .header("content-type", "text/plain")
                    .body(text)
                    .bearer(&run),
            )
            .await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    }
    for code in [3, 0] {
        let res = b
            .call(report(json!({"event": "exited", "exit_code": code}), &run))
            .await;
        assert_eq!(res.status, StatusCode::OK, "{}", res.body);
    }
    let kept = meridian_store::run_reports::read(&b.store, &job.to_string())
        .await
        .unwrap()
        .unwrap();
    assert!(kept.started_at.is_some());
    assert_eq!(kept.exit_code, Some(3), "the first exit reported stands");
    assert_eq!(
        (kept.stdout.as_str(), kept.stderr.as_str()),
        ("hello\n", "warning\n")
    );
    // Reports are input from outside, not events: the log is untouched.
    assert_eq!(b.head().await, head);
    b.finish().await;
}
