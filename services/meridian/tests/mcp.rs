//! The MCP server at `/mcp` of a running `meridian up`, driven by a real MCP client (the
//! `rmcp` crate's, over streamable HTTP) with agent tokens as an agent would hold them:
//! the tools and their annotations; validate (a typo named at its field) and quote; a
//! submit refused without the `submit` grant, naming it; a workflow submitted, followed
//! to its end, its output, placement and bill read; a cancel refused without the `cancel`
//! grant; a call without a token refused by the API. `meridian mcp` (stdio, for an agent
//! that starts its servers as processes) bridges to the same tools with the token it
//! is given.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

const GOOD: &str = "version: v1\nname: from-an-agent\njobs:\n  hello:\n    image: host\n    command: [sh, -c, \"echo hello from an agent\"]\n    resources: {cpus: 1, memory: 64MiB, walltime: 5m}\n";

fn token(server: &str, grants: &[&str]) -> String {
    let mut args = vec![
        "admin", "token", "create", "--tenant", "physics", "--role", "agent", "--label", "agent",
    ];
    for g in grants {
        args.extend(["--grant", g]);
    }
    let out = cli(server, &args);
    assert!(
        out.status.success(),
        "token create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn connect(server: &str, token: &str) -> RunningService<RoleClient, ()> {
    // rmcp's HTTP client brings no TLS crypto of its own (as in `meridian mcp`).
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{server}/mcp")).auth_header(token),
    );
    ().serve(transport).await.expect("an MCP session")
}

/// `GOOD` as the JSON object an agent may send instead of text.
fn good_object() -> Value {
    json!({
        "version": "v1",
        "name": "from-an-agent",
        "jobs": {"hello": {
            "image": "host",
            "command": ["sh", "-c", "echo hello from an agent"],
            "resources": {"cpus": 1, "memory": "64MiB", "walltime": "5m"}
        }}
    })
}

/// A tool's answer: whether it is an error, and its text.
async fn call(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> (bool, String) {
    let args = args.as_object().cloned().unwrap_or_default();
    let result = client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e:?}"));
    let text: Vec<String> = result
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.clone())
        .collect();
    (result.is_error == Some(true), text.join("\n"))
}

#[test]
fn an_agent_lists_validates_quotes_submits_follows_and_is_refused_what_its_token_does_not_grant() {
    let dir = tempfile::tempdir().unwrap();
    let (server, proc) = up_in(dir.path());
    let reader = token(&server, &[]);
    let submitter = token(&server, &["submit"]);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = connect(&server, &reader).await;
        let tools = client.list_all_tools().await.unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        for want in [
            "list_sites",
            "validate",
            "quote",
            "submit",
            "list",
            "status",
            "logs",
            "events",
            "explain",
            "bill",
            "cancel",
        ] {
            assert!(names.contains(&want), "no tool {want}: {names:?}");
        }
        for t in &tools {
            let a = t
                .annotations
                .clone()
                .unwrap_or_else(|| panic!("{} has no annotations", t.name));
            let reads = !matches!(t.name.as_ref(), "submit" | "cancel");
            assert_eq!(a.read_only_hint, Some(reads), "{}", t.name);
            assert!(
                a.destructive_hint.is_some() && a.idempotent_hint.is_some(),
                "{}",
                t.name
            );
        }
        let cancel = tools.iter().find(|t| t.name == "cancel").unwrap();
        assert_eq!(
            cancel.annotations.as_ref().unwrap().destructive_hint,
            Some(true)
        );

        // The workflow's input schema is the API's: text, or the spec's own schema.
        let submit_tool = tools.iter().find(|t| t.name == "submit").unwrap();
        let schema = serde_json::to_value(&*submit_tool.input_schema).unwrap();
        let any_of = schema["properties"]["workflow"]["anyOf"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema:#}"));
        assert_eq!(any_of[0]["type"], "string", "{schema:#}");
        let spec = any_of[1]["$ref"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap();
        assert!(
            schema["$defs"][spec]["properties"]["jobs"].is_object(),
            "{schema:#}"
        );
        let cancel_schema = serde_json::to_value(&*cancel.input_schema).unwrap();
        assert!(
            cancel_schema["properties"]["reason"].is_object(),
            "{cancel_schema:#}"
        );

        // A typo is named at its field; the fixed document validates and is quoted.
        let (error, text) = call(
            &client,
            "validate",
            json!({"workflow": GOOD.replace("cpus: 1", "cpus: one")}),
        )
        .await;
        assert!(
            error && text.contains("jobs.hello.resources.cpus"),
            "{text}"
        );
        let (error, text) = call(&client, "validate", json!({"workflow": GOOD})).await;
        assert!(!error && text.contains("\"valid\": true"), "{text}");
        // The same document as a JSON object, a typo in it named at its field too.
        let mut object = good_object();
        let (error, text) = call(&client, "validate", json!({ "workflow": object })).await;
        assert!(!error && text.contains("\"valid\": true"), "{text}");
        object["jobs"]["hello"]["resources"]["cpus"] = json!("one");
        let (error, text) = call(&client, "validate", json!({ "workflow": object })).await;
        assert!(
            error && text.contains("jobs.hello.resources.cpus"),
            "{text}"
        );
        let (error, text) = call(&client, "validate", json!({"workflow": 5})).await;
        assert!(
            error && text.contains("workflow: expected the document as text"),
            "{text}"
        );
        let (error, text) = call(&client, "quote", json!({"workflow": GOOD})).await;
        assert!(!error && text.contains("\"local\""), "{text}");
        let (error, text) = call(&client, "list_sites", json!({})).await;
        assert!(!error && text.contains("\"local\""), "{text}");

        // The reader may not submit, and is told which grant it lacks; nothing is made.
        let (error, text) = call(&client, "submit", json!({"workflow": GOOD})).await;
        assert!(error && text.contains("`submit` grant"), "{text}");
        let (_, listed) = call(&client, "list", json!({})).await;
        assert!(!listed.contains("from-an-agent"), "{listed}");

        // The submitter may; the reader follows the workflow to its end.
        let writer = connect(&server, &submitter).await;
        let (error, text) = call(&writer, "submit", json!({"workflow": GOOD})).await;
        assert!(!error, "{text}");
        let id = serde_json::from_str::<Value>(&text).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, text) = call(&client, "status", json!({"id": id})).await;
            let status: Value = serde_json::from_str(&text).unwrap();
            if status["state"] == "finished" {
                break;
            }
            assert!(
                Instant::now() < deadline && status["state"] != "failed",
                "{status:#}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (_, logs) = call(&client, "logs", json!({"id": id})).await;
        assert!(logs.contains("hello from an agent"), "{logs}");
        let (_, why) = call(&client, "explain", json!({"id": id})).await;
        assert!(
            why.contains("workflow.placement_decided.v1") && why.contains("local"),
            "{why}"
        );
        let (error, bill) = call(&client, "bill", json!({"id": id})).await;
        assert!(!error && bill.contains("lines"), "{bill}");
        let (error, text) = call(&client, "status", json!({"id": "not-an-id"})).await;
        assert!(
            error && text.starts_with("id: expected a workflow id"),
            "{text}"
        );

        // Cancel needs its own grant: the submitter has only `submit`.
        let (error, text) = call(&writer, "cancel", json!({"id": id})).await;
        assert!(error && text.contains("`cancel` grant"), "{text}");
        client.cancel().await.unwrap();
        writer.cancel().await.unwrap();

        // The same over stdio: `meridian mcp` as an agent would start it, with the
        // reader's token.
        let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_meridian")).configure(|c| {
            c.arg("mcp")
                .env("MERIDIAN_SERVER", &server)
                .env("MERIDIAN_TOKEN", &reader)
                .env("HOME", dir.path());
        });
        let stdio = ().serve(TokioChildProcess::new(command).unwrap()).await.expect("meridian mcp");
        assert_eq!(stdio.list_all_tools().await.unwrap().len(), tools.len());
        let (error, listed) = call(&stdio, "list", json!({"state": "finished"})).await;
        assert!(!error && listed.contains(&id), "{listed}");
        let (error, text) = call(&stdio, "submit", json!({"workflow": GOOD})).await;
        assert!(error && text.contains("`submit` grant"), "{text}");
        stdio.cancel().await.unwrap();
    });

    // Without a token the API refuses before MCP sees the request.
    let refused = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args([
            "-H",
            "Content-Type: application/json",
            "-H",
            "Accept: application/json, text/event-stream",
        ])
        .args([
            "--data",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        ])
        .arg(format!("{server}/mcp"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&refused.stdout), "401");
    drop(proc);
}
