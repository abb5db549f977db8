//! The CLI verbs that talk to a Meridian API: submit, status, list, logs, cancel,
//! events (bills are in `accounting_cli`). Human tables by default, the API's JSON with
//! `--output json`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use meridian_app::api::{
    Accepted, CancelAccepted, OutputsAccepted, RunState, TransferState, TransferStatus,
    WorkflowPage, WorkflowState, WorkflowStatus,
};

use crate::Output;

pub struct Client {
    base: String,
    http: reqwest::Client,
    /// Sent as X-Meridian-Tenant with every request, when set.
    tenant: Option<String>,
    /// Sent as X-Meridian-User, when set: who does it, in the log.
    user: Option<String>,
    /// Sent as `Authorization: Bearer`, when there is one for this server.
    token: Option<String>,
}

/// The API an admin verb changes the federation through.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArg {
    /// The Meridian API to talk to: site and admin verbs change the federation through
    /// it, as `submit` does, never by writing to the log themselves. Default: the client
    /// profile's, else http://127.0.0.1:7373.
    #[arg(long, env = "MERIDIAN_SERVER")]
    pub server: Option<String>,
}

impl ServerArg {
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::new(&crate::profile::server(self.server.as_deref()))
    }
}

/// An API answer that is not a success: its status and the server's message.
fn api_error(status: reqwest::StatusCode, body: &Value) -> anyhow::Error {
    let message = body
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("no message")
        .to_string();
    let mut text = format!("{message} (HTTP {})", status.as_u16());
    if let Some(errors) = body.get("errors").and_then(Value::as_array) {
        for e in errors {
            let path = e.get("path").and_then(Value::as_str).unwrap_or("");
            let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
            if path.is_empty() {
                text.push_str(&format!("\n  {msg}"));
            } else {
                text.push_str(&format!("\n  {path}: {msg}"));
            }
        }
    }
    anyhow::anyhow!(text)
}

impl Client {
    pub fn new(base: &str) -> anyhow::Result<Client> {
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(30));
        // A deployment's own CA (or self-signed certificate), trusted besides the usual.
        if let Some(path) = std::env::var_os("MERIDIAN_CA_CERT") {
            let path = PathBuf::from(path);
            let pem = std::fs::read(&path)
                .with_context(|| format!("reading MERIDIAN_CA_CERT {}", path.display()))?;
            let cert = reqwest::Certificate::from_pem(&pem).with_context(|| {
                format!("MERIDIAN_CA_CERT {}: not a PEM certificate", path.display())
            })?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder.build().context("building the HTTP client")?;
        Ok(Client {
            base: base.trim_end_matches('/').to_string(),
            http,
            tenant: None,
            user: None,
            token: crate::profile::token_for(base),
        })
    }

    /// Speaks for `tenant` (the server's default tenant when `None`).
    pub fn for_tenant(mut self, tenant: Option<&str>) -> Client {
        self.tenant = tenant.map(str::to_string);
        self
    }

    /// Acts as `user` (sent as X-Meridian-User).
    pub fn acting_as(mut self, user: &str) -> Client {
        self.user = Some(user.to_string());
        self
    }

    /// GETs `path` as the API's own type `T`.
    pub async fn get_as<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let value = self.get(path).await?;
        serde_json::from_value(value).with_context(|| {
            format!("the server's answer to GET {path} is not what this CLI reads")
        })
    }

    /// Decodes an answer as the API's own type `T`.
    pub fn decode<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> anyhow::Result<T> {
        serde_json::from_value(value)
            .with_context(|| format!("the server's answer to {what} is not what this CLI reads"))
    }

    /// PUTs a document (YAML or JSON) as the body.
    pub async fn put_text(&self, path: &str, document: String) -> anyhow::Result<Value> {
        self.send_text(reqwest::Method::PUT, path, document).await
    }

    /// Sends a document as the body: JSON when it starts with `{`, else YAML.
    async fn send_text(
        &self,
        method: reqwest::Method,
        path: &str,
        document: String,
    ) -> anyhow::Result<Value> {
        let content_type = if document.trim_start().starts_with('{') {
            "application/json"
        } else {
            "application/yaml"
        };
        self.send(
            self.http
                .request(method, format!("{}{path}", self.base))
                .header("content-type", content_type)
                .body(document),
        )
        .await
    }

    pub async fn put(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.send(self.http.put(format!("{}{path}", self.base)).json(&body))
            .await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let response = self.send_raw(request).await?;
        let status = response.status();
        let text = response.text().await.context("reading the answer")?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            return Err(self.explain(status, &body));
        }
        Ok(body)
    }

    /// Sends with the caller's headers and token; the answer as it came.
    pub async fn send_raw(
        &self,
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<reqwest::Response> {
        let request = match &self.tenant {
            Some(tenant) => request.header("x-meridian-tenant", tenant),
            None => request,
        };
        let request = match &self.user {
            Some(user) => request.header("x-meridian-user", user),
            None => request,
        };
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        request.send().await.with_context(|| {
            format!(
                "cannot reach Meridian at {} (is `meridian up` running? set --server or MERIDIAN_SERVER)",
                self.base
            )
        })
    }

    /// An error answer, with what to do about a 401.
    pub fn explain(&self, status: reqwest::StatusCode, body: &Value) -> anyhow::Error {
        let error = api_error(status, body);
        if status != reqwest::StatusCode::UNAUTHORIZED {
            return error;
        }
        let hint = match &self.token {
            None => format!(
                "no token for {}: set MERIDIAN_TOKEN (or --token), or run `meridian up`, which writes a client profile{}",
                self.base,
                crate::profile::path()
                    .map(|p| format!(" at {}", p.display()))
                    .unwrap_or_default()
            ),
            Some(_) => "the token was refused: it may be revoked or expired; ask an admin for a new one (`meridian admin token create`)".to_string(),
        };
        error.context(hint)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    pub async fn post(&self, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut request = self.http.post(format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        self.send(request).await
    }

    /// POSTs a document (YAML or JSON) as the body.
    pub async fn post_text(&self, path: &str, document: String) -> anyhow::Result<Value> {
        self.send_text(reqwest::Method::POST, path, document).await
    }

    pub async fn submit(
        &self,
        document: String,
        content_type: &str,
        key: Option<&str>,
    ) -> anyhow::Result<Value> {
        let mut request = self
            .http
            .post(format!("{}/v1/workflows", self.base))
            .header("content-type", content_type)
            .body(document);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        self.send(request).await
    }
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("-")
}

/// Prints rows as aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

pub(crate) fn json<T: serde::Serialize + ?Sized>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).expect("JSON prints"));
}

/// Bytes as people read them: decimal units, three significant figures.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1000.0;
    let mut unit = 0;
    while value >= 999.95 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    let digits = match value {
        v if v < 9.995 => 2,
        v if v < 99.95 => 1,
        _ => 0,
    };
    format!("{value:.digits$} {}", UNITS[unit])
}

/// How far a copy has got: `312 MB of 1.07 GB (29%)`, or its bytes once done.
fn transfer_progress(t: &TransferStatus) -> String {
    match (t.state, t.bytes_total) {
        (TransferState::Copying, Some(total)) if total > 0 => format!(
            "{} of {} ({}%)",
            human_bytes(t.bytes_done),
            human_bytes(total),
            t.bytes_done.min(total) * 100 / total
        ),
        (TransferState::Copying, _) => format!("{} so far", human_bytes(t.bytes_done)),
        (_, _) if t.cached => format!("{} from the site's cache", human_bytes(t.bytes_done)),
        (TransferState::Completed, _) => human_bytes(t.bytes_done),
        (TransferState::Failed, _) => "-".into(),
    }
}

fn progress_line(status: &WorkflowStatus) -> String {
    let t = &status.tasks;
    let copying: Vec<String> = status
        .transfers
        .iter()
        .filter(|t| t.state == TransferState::Copying)
        .map(|t| format!(" · copying {}: {}", t.source, transfer_progress(t)))
        .collect();
    format!(
        "{}  {} done · {} running · {} pending{}{}{}",
        status.state.as_str(),
        t.succeeded,
        t.running,
        t.pending,
        match t.failed {
            0 => String::new(),
            f => format!(" · {f} failed"),
        },
        match t.cancelled {
            0 => String::new(),
            c => format!(" · {c} cancelled"),
        },
        copying.concat(),
    )
}

/// The services of a workflow that answer, as (name, address), once every other run
/// ended and nothing is left to start: the workflow serves until it is cancelled.
fn serving(status: &WorkflowStatus) -> Option<Vec<(String, String)>> {
    let mut up = Vec::new();
    for run in &status.jobs {
        match &run.address {
            Some(address) => up.push((run.name.clone(), address.clone())),
            None if matches!(
                run.state,
                RunState::Succeeded | RunState::Failed | RunState::Cancelled
            ) => {}
            None => return None,
        }
    }
    (!up.is_empty() && status.tasks.pending == 0 && status.state == WorkflowState::Running)
        .then_some(up)
}

pub async fn submit(
    client: &Client,
    file: &PathBuf,
    wait: bool,
    key: Option<&str>,
    output: Output,
) -> anyhow::Result<i32> {
    let document =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let document = crate::import_cli::submitted(document, file)?;
    // Check locally first: the same errors, without a round trip.
    if let Err(errors) = meridian_spec::parse(&document) {
        for e in &errors.errors {
            eprintln!("{}: {e}", file.display());
        }
        bail!(
            "{} is not a valid workflow; nothing was submitted",
            file.display()
        );
    }
    let content_type = if document.trim_start().starts_with('{') {
        "application/json"
    } else {
        "application/yaml"
    };
    let accepted: Accepted = Client::decode(
        client.submit(document, content_type, key).await?,
        "the submission",
    )?;
    let id = accepted.id.to_string();
    if !wait {
        match output {
            Output::Json => json(&accepted),
            Output::Table => println!("{id}"),
        }
        return Ok(0);
    }
    eprintln!("submitted {} as {id}", accepted.name);
    let status = wait_for(client, &id).await?;
    match output {
        Output::Json => json(&status),
        Output::Table => print_status(&status),
    }
    if let Some(up) = serving(&status) {
        for (name, address) in up {
            eprintln!("{name} serves at {address}");
        }
        eprintln!("it serves until cancelled: meridian cancel {id}");
        return Ok(0);
    }
    Ok(if status.state == WorkflowState::Finished {
        0
    } else {
        1
    })
}

/// Polls until the workflow ends (or only its services run on, ready), showing progress
/// on standard error.
async fn wait_for(client: &Client, id: &str) -> anyhow::Result<WorkflowStatus> {
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let status: WorkflowStatus = client.get_as(&format!("/v1/workflows/{id}")).await?;
        let line = progress_line(&status);
        if tty {
            eprint!("\r\x1b[2K{line}  [{}s]", start.elapsed().as_secs());
        } else if line != last {
            eprintln!("{line}");
        }
        last = line;
        if status.state.is_final() || serving(&status).is_some() {
            if tty {
                eprintln!();
            }
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub fn print_status(status: &WorkflowStatus) {
    println!("workflow  {}  {}", status.id, status.name);
    println!("state     {}", status.state.as_str());
    if let Some(reason) = &status.reason {
        println!("reason    {reason}");
    }
    println!("site      {}", status.site.as_deref().unwrap_or("-"));
    println!(
        "tasks     {}",
        progress_line(status)
            .split_once("  ")
            .map_or("", |(_, r)| r)
    );
    if !status.transfers.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = status
            .transfers
            .iter()
            .map(|t| {
                vec![
                    t.source.clone(),
                    t.destination.clone(),
                    match t.state {
                        TransferState::Copying => "copying",
                        TransferState::Completed => "completed",
                        TransferState::Failed => "failed",
                    }
                    .to_string(),
                    transfer_progress(t),
                    t.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        table(&["FROM", "TO", "COPY", "BYTES", "REASON"], &rows);
    }
    if status.jobs.is_empty() {
        return;
    }
    println!();
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = status
        .jobs
        .iter()
        .map(|run| {
            vec![
                match run.index {
                    Some(i) => format!("{}[{i}]", run.name),
                    None => run.name.clone(),
                },
                run.state.as_str().to_string(),
                run.exit_code.map_or("-".into(), |c| c.to_string()),
                dash(&run.started_at),
                dash(&run.ended_at),
                dash(&run.address),
                run.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "JOB", "STATE", "EXIT", "STARTED", "ENDED", "ADDRESS", "REASON",
        ],
        &rows,
    );
    if status.jobs_truncated {
        println!(
            "(the first {} runs; the counts above cover every task)",
            status.jobs.len()
        );
    }
}

pub async fn status(client: &Client, id: &str, output: Output) -> anyhow::Result<()> {
    let status: WorkflowStatus = client.get_as(&format!("/v1/workflows/{id}")).await?;
    match output {
        Output::Json => json(&status),
        Output::Table => print_status(&status),
    }
    Ok(())
}

pub async fn list(
    client: &Client,
    state: Option<&str>,
    limit: u32,
    output: Output,
) -> anyhow::Result<()> {
    let mut path = format!("/v1/workflows?limit={limit}");
    if let Some(state) = state {
        path.push_str(&format!("&state={state}"));
    }
    let page: WorkflowPage = client.get_as(&path).await?;
    match output {
        Output::Json => json(&page),
        Output::Table => {
            let rows: Vec<Vec<String>> = page
                .items
                .iter()
                .map(|w| {
                    vec![
                        w.id.to_string(),
                        w.name.clone(),
                        w.state.as_str().to_string(),
                        w.submitted_at.clone(),
                    ]
                })
                .collect();
            table(&["ID", "NAME", "STATE", "SUBMITTED"], &rows);
        }
    }
    Ok(())
}

pub async fn cancel(client: &Client, id: &str, output: Output) -> anyhow::Result<()> {
    let answer: CancelAccepted = Client::decode(
        client
            .post(
                &format!("/v1/workflows/{id}/cancel"),
                Some(serde_json::json!({})),
            )
            .await?,
        "the cancel",
    )?;
    match output {
        Output::Json => json(&answer),
        Output::Table => println!("{id}: {}", answer.state.as_str()),
    }
    Ok(())
}

/// `action` is `export` (copy out again) or `release` (give back).
pub async fn outputs(
    client: &Client,
    id: &str,
    volume: &str,
    action: &str,
    output: Output,
) -> anyhow::Result<()> {
    let answer: OutputsAccepted = Client::decode(
        client
            .post(
                &format!("/v1/workflows/{id}/volumes/{volume}/{action}"),
                None,
            )
            .await?,
        "the request",
    )?;
    match output {
        Output::Json => json(&answer),
        Output::Table => println!(
            "{id}: volume {volume} at {}: {}",
            answer.sites.join(", "),
            match action {
                "export" => "copying out again; `meridian status` follows it",
                _ => "given back",
            }
        ),
    }
    Ok(())
}

pub async fn events(client: &Client, id: &str, output: Output) -> anyhow::Result<()> {
    let answer = client.get(&format!("/v1/workflows/{id}/events")).await?;
    match output {
        Output::Json => json(&answer),
        Output::Table => {
            let events = answer
                .get("events")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let rows: Vec<Vec<String>> = events
                .iter()
                .map(|e| {
                    let aggregate = e.get("aggregate").cloned().unwrap_or(Value::Null);
                    vec![
                        s(e, "occurred_at").to_string(),
                        format!("{}/{}", s(&aggregate, "kind"), s(&aggregate, "id")),
                        e.get("sequence").map_or(String::new(), Value::to_string),
                        e.get("payload").map_or("-", |p| s(p, "type")).to_string(),
                    ]
                })
                .collect();
            table(&["TIME", "AGGREGATE", "SEQ", "EVENT"], &rows);
        }
    }
    Ok(())
}

pub async fn logs(
    client: &Client,
    id: &str,
    job: Option<&str>,
    output: Output,
) -> anyhow::Result<()> {
    let mut path = format!("/v1/workflows/{id}/logs");
    if let Some(job) = job {
        path.push_str(&format!("?job={job}"));
    }
    let answer = client.get(&path).await?;
    match output {
        Output::Json => json(&answer),
        Output::Table => {
            let logs = answer
                .get("logs")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if logs.is_empty() {
                eprintln!("no output captured yet (output is kept when each run ends)");
            }
            for l in logs {
                let name = match l.get("index").and_then(Value::as_u64) {
                    Some(i) => format!("{}[{i}]", s(&l, "job")),
                    None => s(&l, "job").to_string(),
                };
                for (stream, text) in [("stdout", s(&l, "stdout")), ("stderr", s(&l, "stderr"))] {
                    if text.is_empty() || text == "-" {
                        continue;
                    }
                    println!("==> {name} {stream} <==");
                    print!("{text}");
                    if !text.ends_with('\n') {
                        println!();
                    }
                }
            }
        }
    }
    Ok(())
}
