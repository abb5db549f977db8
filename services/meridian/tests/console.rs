//! The web console of a running `meridian up`, over HTTP as a browser without JavaScript
//! meets it: signing in sets an HTTP-only, same-site cookie; every page and form is
//! refused for a token that may not do what it does (a researcher of one tenant gets a
//! 404 for another tenant's workflow); forms from another site are refused; a revoked
//! token's session ends; the read-only pages are whole HTML and name nothing outside
//! the server; the finance download is the FOCUS export. The browser test
//! (`tests/console/console.test.mjs`) drives the same console in Chromium.

mod common;

use common::*;
use reqwest::header::{COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use reqwest::StatusCode;

const HELLO: &str = "version: v1\nname: console-hello\njobs:\n  hello:\n    image: host\n    command: [sh, -c, \"echo hello from the console; echo '<script>alert(1)</script>'\"]\n    resources: {cpus: 1, memory: 64MiB, walltime: 5m}\n";

fn token(server: &str, tenant: Option<&str>, role: &str, grants: &[&str]) -> String {
    let mut args = vec!["admin", "token", "create", "--role", role];
    if let Some(t) = tenant {
        args.extend(["--tenant", t]);
    }
    for g in grants {
        args.extend(["--grant", g]);
    }
    let out = cli(server, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

struct Browser {
    server: String,
    http: reqwest::Client,
    cookie: Option<String>,
}

impl Browser {
    fn new(server: &str) -> Browser {
        Browser {
            server: server.to_string(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookie: None,
        }
    }

    async fn sign_in(&mut self, token: &str) -> reqwest::Response {
        let response = self
            .http
            .post(format!("{}/sign-in", self.server))
            .form(&[("token", token)])
            .send()
            .await
            .unwrap();
        if let Some(set) = response.headers().get(SET_COOKIE) {
            let set = set.to_str().unwrap().to_string();
            self.cookie = Some(set.split(';').next().unwrap().to_string());
        }
        response
    }

    async fn get(&self, path: &str) -> (StatusCode, String, Option<String>) {
        let mut request = self.http.get(format!("{}{path}", self.server));
        if let Some(c) = &self.cookie {
            request = request.header(COOKIE, c);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let location = response
            .headers()
            .get(LOCATION)
            .map(|l| l.to_str().unwrap().to_string());
        (status, response.text().await.unwrap(), location)
    }

    async fn post(
        &self,
        path: &str,
        form: &[(&str, &str)],
    ) -> (StatusCode, String, Option<String>) {
        let mut request = self
            .http
            .post(format!("{}{path}", self.server))
            .header(ORIGIN, &self.server)
            .form(form);
        if let Some(c) = &self.cookie {
            request = request.header(COOKIE, c);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let location = response
            .headers()
            .get(LOCATION)
            .map(|l| l.to_str().unwrap().to_string());
        (status, response.text().await.unwrap(), location)
    }
}

#[test]
fn every_page_does_what_its_token_may_and_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _proc) = up_in(dir.path());
    let alpha = token(&server, Some("alpha"), "researcher", &[]);
    let beta = token(&server, Some("beta"), "researcher", &[]);
    let finance = token(&server, None, "finance", &[]);
    let reader = token(&server, Some("alpha"), "agent", &[]);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Not signed in: reads go to the sign-in page and back; forms are refused.
        let mut browser = Browser::new(&server);
        let (status, _, location) = browser.get("/workflows?state=running").await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert_eq!(
            location.as_deref(),
            Some("/sign-in?next=/workflows%3Fstate%3Drunning")
        );
        let (status, _, _) = browser
            .post("/workflows/new", &[("workflow", HELLO), ("action", "submit")])
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);

        // A token that does not hold is refused with why; nothing is set.
        let response = browser.sign_in("mer_nope").await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(browser.cookie.is_none());
        assert!(response.text().await.unwrap().contains("does not sign in"));

        // Signing in keeps the token in an HTTP-only, same-site cookie.
        let response = browser.sign_in(&alpha).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let set = response.headers()[SET_COOKIE].to_str().unwrap().to_string();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"),
            "{set}"
        );

        // A researcher submits (the no-JavaScript way: the form's submit button).
        let (status, body, _) = browser
            .post("/workflows/new", &[("workflow", "version: v1\nname: x\njobs:\n  a:\n    image: host\n    command: [echo]\n    resources: {cpus: two}\n"), ("action", "check")])
            .await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("jobs.a.resources.cpus"), "{body}");
        let (status, _, location) = browser
            .post(
                "/workflows/new",
                &[("workflow", HELLO), ("action", "submit"), ("idempotency_key", "k1")],
            )
            .await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        let page = location.unwrap();
        let id = page.trim_start_matches("/workflows/").to_string();
        wait_state(&server, &id, &["finished"]);
        // A second press of the same form is the same workflow.
        let (_, _, again) = browser
            .post(
                "/workflows/new",
                &[("workflow", HELLO), ("action", "submit"), ("idempotency_key", "k1")],
            )
            .await;
        assert_eq!(again.as_deref(), Some(page.as_str()));
        let (status, body, _) = browser.get(&page).await;
        assert_eq!(status, StatusCode::OK);
        for want in ["console-hello", "hello from the console", "Why there", "data-node=\"hello\""] {
            assert!(body.contains(want), "{want} not on the page:\n{body}");
        }
        // What a job printed is shown as text, never as markup.
        assert!(body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{body}");
        assert!(!body.contains("<script>alert"), "{body}");
        // Not framed, not cached, scripts from the server only.
        let response = browser
            .http
            .get(format!("{server}{page}"))
            .header(COOKIE, browser.cookie.clone().unwrap())
            .send()
            .await
            .unwrap();
        let header = |name: &str| response.headers()[name].to_str().unwrap().to_string();
        assert_eq!(header("x-frame-options"), "DENY");
        assert_eq!(header("cache-control"), "no-store");
        assert!(header("content-security-policy").contains("default-src 'self'"));
        // After signing in, only this server's pages are followed.
        let mut wary = Browser::new(&server);
        let response = wary
            .http
            .post(format!("{server}/sign-in"))
            .form(&[("token", alpha.as_str()), ("next", "/\t/evil.example")])
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()[LOCATION], "/workflows");
        wary.cookie = None;
        // The sites page shows the prices in force: the local site's placeholders.
        let (_, sites, _) = browser.get("/sites").await;
        assert!(
            sites.contains("Prices in force") && sites.contains("0.01 per core-hour"),
            "{sites}"
        );
        // Whole pages, nothing fetched from elsewhere.
        for path in [page.as_str(), "/workflows", "/sites", "/workflows/new"] {
            let (_, body, _) = browser.get(path).await;
            assert!(body.starts_with("<!DOCTYPE html>"), "{path}");
            for outside in ["src=\"http", "href=\"http", "src=\"//", "href=\"//"] {
                assert!(!body.contains(outside), "{path} names {outside}");
            }
        }
        // What a researcher may not do.
        for path in ["/tenants", "/finance", "/finance/focus.csv"] {
            let (status, body, _) = browser.get(path).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        }
        let (status, _, _) = browser.post("/sites/local/drain", &[("reason", "no")]).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        // A form from another site is refused, even with the cookie.
        let forged = browser
            .http
            .post(format!("{server}/workflows/{id}/cancel"))
            .header(ORIGIN, "http://elsewhere.example")
            .header(COOKIE, browser.cookie.clone().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::FORBIDDEN);
        // From another port of the same host (same site, not same origin) too.
        let forged = browser
            .http
            .post(format!("{server}/workflows/{id}/cancel"))
            .header("sec-fetch-site", "same-site")
            .header(COOKIE, browser.cookie.clone().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(forged.status(), StatusCode::FORBIDDEN);
        assert_eq!(wait_state(&server, &id, &["finished"])["state"], "finished");

        // Another tenant's researcher: not found, to read or to cancel.
        let mut other = Browser::new(&server);
        other.sign_in(&beta).await;
        let (status, body, _) = other.get(&page).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        let (status, _, _) = other.post(&format!("{page}/cancel"), &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (_, body, _) = other.get("/workflows").await;
        assert!(!body.contains(&id), "beta's list shows alpha's workflow");

        // An agent token without grants reads, and is refused submitting, saying why.
        let mut agent = Browser::new(&server);
        agent.sign_in(&reader).await;
        assert_eq!(agent.get(&page).await.0, StatusCode::OK);
        let (status, body, _) = agent.get("/workflows/new").await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(body.contains("may not submit"), "{body}");
        let (status, _, _) = agent
            .post("/workflows/new", &[("workflow", HELLO), ("action", "submit")])
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN);

        // Finance: the month's charges, and the export is the API's, byte for byte.
        let mut money = Browser::new(&server);
        let landed = money.sign_in(&finance).await;
        assert_eq!(landed.headers()[LOCATION], "/finance");
        let (status, _, _) = money.get("/workflows/new").await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _, _) = money.get("/tenants").await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let month = chrono::Utc::now().format("%Y-%m").to_string();
        let mut csv = String::new();
        for _ in 0..100 {
            let (status, body, _) = money.get(&format!("/finance/focus.csv?month={month}")).await;
            assert_eq!(status, StatusCode::OK);
            csv = body;
            if csv.contains(&id) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(csv.contains(&id), "{csv}");
        let exported = cli_as(&server, &finance, &["export", "focus", "--period", &month]);
        assert_eq!(csv, String::from_utf8_lossy(&exported.stdout));
        let (status, body, _) = money.get(&format!("/finance?month={month}")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("id=\"per-day-USD\"") && body.contains("alpha"), "{body}");
        let (status, body, _) = money.get("/finance?month=2026-13").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("month:"), "{body}");

        // Revoking the token ends the session at once.
        let listed = cli_json(&server, &["admin", "token", "list"]);
        let alpha_id = listed["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tenant"] == "alpha" && t["role"] == "researcher")
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        cli_ok(&server, &["admin", "token", "revoke", &alpha_id]);
        let (status, _, location) = browser.get("/workflows").await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert!(location.unwrap().starts_with("/sign-in"));
    });
}

/// Every page and form, for each kind of token: allowed ones answer (whatever their
/// outcome), refused ones answer 403 and change nothing.
#[test]
fn each_page_and_form_is_refused_to_the_roles_that_may_not_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let (server, proc) = up_in(dir.path());
    let file = write(dir.path(), "hello.yaml", HELLO);
    let id = submit(&server, &file);
    let roles: Vec<(&str, String)> = vec![
        ("admin", token(&server, None, "admin", &[])),
        (
            "researcher",
            token(&server, Some("default"), "researcher", &[]),
        ),
        ("finance", token(&server, None, "finance", &[])),
        ("agent", token(&server, Some("default"), "agent", &[])),
        (
            "agent+submit",
            token(&server, Some("default"), "agent", &["submit"]),
        ),
    ];
    let wf = format!("/workflows/{id}");
    let cancel = format!("{wf}/cancel");
    // (method, path, the roles allowed)
    let pages: Vec<(&str, &str, &[&str])> = vec![
        (
            "GET",
            "/workflows",
            &["admin", "researcher", "agent", "agent+submit"],
        ),
        (
            "GET",
            &wf,
            &["admin", "researcher", "agent", "agent+submit"],
        ),
        (
            "GET",
            "/workflows/new",
            &["admin", "researcher", "agent+submit"],
        ),
        (
            "POST",
            "/workflows/new/check",
            &["admin", "researcher", "agent", "agent+submit"],
        ),
        (
            "POST",
            "/workflows/new",
            &["admin", "researcher", "agent+submit"],
        ),
        (
            "GET",
            "/sites",
            &["admin", "researcher", "finance", "agent", "agent+submit"],
        ),
        ("POST", "/sites/local/drain", &["admin"]),
        ("POST", "/sites/local/undrain", &["admin"]),
        ("GET", "/tenants", &["admin"]),
        ("GET", "/finance", &["admin", "finance"]),
        ("GET", "/finance/focus.csv", &["admin", "finance"]),
        ("POST", &cancel, &["admin", "researcher"]),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for (role, token) in &roles {
            let mut browser = Browser::new(&server);
            let signed = browser.sign_in(token).await;
            assert_eq!(signed.status(), StatusCode::SEE_OTHER, "{role} signs in");
            for (method, path, allowed) in &pages {
                let (status, body, _) = if *method == "GET" {
                    browser.get(path).await
                } else {
                    browser
                        .post(
                            path,
                            &[
                                ("workflow", HELLO),
                                ("action", "submit"),
                                ("reason", "matrix"),
                            ],
                        )
                        .await
                };
                if allowed.contains(role) {
                    // Pages answer 200, forms redirect (303); a cancel of a workflow that
                    // has ended is a 409 that says so.
                    let expected: &[StatusCode] = if path.ends_with("/cancel") {
                        &[StatusCode::SEE_OTHER, StatusCode::CONFLICT]
                    } else if *method == "GET" || path.ends_with("/check") {
                        &[StatusCode::OK]
                    } else {
                        &[StatusCode::SEE_OTHER]
                    };
                    assert!(
                        expected.contains(&status),
                        "{role} {method} {path}: {status}\n{body}"
                    );
                    if path.ends_with("/drain") {
                        let sites = cli_json(&server, &["site", "list"]);
                        assert_eq!(sites["sites"][0]["state"], "drained", "{sites:#}");
                    }
                } else {
                    assert_eq!(
                        status,
                        StatusCode::FORBIDDEN,
                        "{role} {method} {path}: {body}"
                    );
                }
            }
        }
    });
    // A refused drain changed nothing; the admin's drain was undone by its undrain.
    let sites = cli_json(&server, &["site", "list"]);
    assert_eq!(sites["sites"][0]["state"], "ok", "{sites:#}");
    drop(proc);
}
