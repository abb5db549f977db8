//! Researchers' pages: their workflows, one workflow (its DAG with each job's state,
//! task-array progress, services and their addresses, why it runs where it does, its
//! output and its bill, refreshed while it runs), submitting with live validation and a
//! quote at every connected site, and cancelling.

use std::collections::BTreeMap;

use axum::extract::rejection::{FormRejection, PathRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::{html, Markup};
use meridian_app::api::{JobRun, WorkflowState, WorkflowStatus};
use meridian_app::read::ListQuery;
use meridian_app::sites::Quote;
use meridian_app::workflows::Submission;
use meridian_app::{Action, AppError, Principal};
use meridian_events::vocabulary::workflow::{Candidate, Verdict};
use serde::Deserialize;
use uuid::Uuid;

use crate::layout::{amount, failed, page, refusal, state, time};
use crate::{locate, Console};

/// The largest workflow document the form takes (the API's limit is larger; a
/// document this size is better submitted with the CLI).
const MAX_DOCUMENT: usize = 512 * 1024;

#[derive(Deserialize)]
pub(crate) struct ListParams {
    state: Option<String>,
}

pub(crate) async fn list(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    Query(params): Query<ListParams>,
) -> Response {
    let wanted = match params.state.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match WorkflowState::parse(s) {
            Some(state) => Some(state),
            None => {
                return refusal(
                    StatusCode::BAD_REQUEST,
                    Some(&who),
                    &format!(
                        "state: expected one of {}; got {s:?}",
                        WorkflowState::names()
                    ),
                )
            }
        },
    };
    let query = ListQuery {
        state: wanted,
        tenant: None,
        limit: 200,
        after: None,
    };
    let listed = match console.app.list(&who, &query).await {
        Ok(l) => l,
        Err(e) => return failed(&who, e),
    };
    let body = html! {
        h1 { "Workflows" }
        form.inline method="get" action="/workflows" {
            label for="state" { "State" }
            select #state name="state" {
                option value="" { "any" }
                @for s in WorkflowState::ALL {
                    option value=(s.as_str()) selected[wanted == Some(s)] { (s.as_str()) }
                }
            }
            button type="submit" { "Show" }
            @if who.may(Action::SubmitWorkflow) { a.button href="/workflows/new" { "Submit a workflow" } }
        }
        {
            // Refreshed in place while the page is open (empty too, so new ones appear).
            table #workflows hx-get=(format!("/workflows{}", wanted.map(|s| format!("?state={}", s.as_str())).unwrap_or_default()))
                hx-trigger="every 5s" hx-select="#workflows" hx-swap="outerHTML" {
                thead { tr { th { "Name" } th { "State" } @if who.every_tenant { th { "Tenant" } } th { "Submitted" } th { "Updated" } th { "Id" } } }
                tbody {
                    @if listed.items.is_empty() {
                        tr { td.empty colspan="6" { "No workflows yet." @if who.may(Action::SubmitWorkflow) { " " a href="/workflows/new" { "Submit one." } } } }
                    }
                    @for w in &listed.items {
                        tr {
                            td { a href={ "/workflows/" (w.id) } { (w.name) } }
                            td { (state(w.state.as_str())) }
                            @if who.every_tenant { td { (w.tenant) } }
                            td { (time(&w.submitted_at)) }
                            td { (time(&w.updated_at)) }
                            td.id { code { (w.id) } }
                        }
                    }
                }
            }
            @if listed.next.is_some() { p.note { "The newest 200 are shown; " code { "meridian list" } " pages through the rest." } }
        }
    };
    page("Workflows", Some(&who), body).into_response()
}

#[derive(Deserialize)]
pub(crate) struct DetailParams {
    part: Option<String>,
}

fn workflow_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, String> {
    let Path(id) = path.map_err(|e| e.body_text())?;
    Uuid::try_parse(&id).map_err(|_| format!("no workflow {id:?}: a workflow id is a UUID"))
}

/// One workflow; `?part=live` is the part that changes while it runs, for the page's
/// refresh.
pub(crate) async fn detail(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    Query(params): Query<DetailParams>,
) -> Response {
    let id = match workflow_id(path) {
        Ok(id) => id,
        Err(e) => return refusal(StatusCode::NOT_FOUND, Some(&who), &e),
    };
    let status = match console.app.status(&who, id).await {
        Ok(s) => s,
        Err(e) => return failed(&who, e),
    };
    let events = match console.app.events(&who, id).await {
        Ok(l) => l.events,
        Err(e) => {
            tracing::warn!(workflow = %id, error = %e, "console: cannot read the workflow's events");
            Vec::new()
        }
    };
    let spec = submitted_spec(&events);
    let live = live(&status, spec.as_ref());
    if params.part.as_deref() == Some("live") {
        let mut response = Html(live.into_string()).into_response();
        if status.state.is_final() {
            // The page was open while it ran: load it whole once more, with the final
            // output, bill and buttons.
            response
                .headers_mut()
                .insert("hx-refresh", axum::http::HeaderValue::from_static("true"));
        }
        return response;
    }
    let logs = console.app.logs(&who, id, None).await.ok();
    let bill = if status.state.is_final() || status.tasks.succeeded + status.tasks.failed > 0 {
        console.app.bill(&who, id).await.ok()
    } else {
        None
    };
    let cancellable = !status.state.is_final()
        && status.state != WorkflowState::Cancelling
        && who.may(Action::CancelWorkflow);
    let body = html! {
        h1 { (status.name) " " (state(status.state.as_str())) }
        dl.facts {
            dt { "Id" } dd { code { (status.id) } }
            dt { "Tenant" } dd { (status.tenant) }
            dt { "Site" } dd { (status.site.as_deref().unwrap_or("not placed yet")) }
            dt { "Submitted" } dd { (time(&status.submitted_at)) }
            @if let Some(r) = &status.reason { dt { "Why" } dd.reason { (r) } }
        }
        @if cancellable {
            form.inline method="post" action={ "/workflows/" (id) "/cancel" } {
                input type="text" name="reason" placeholder="why (optional)" maxlength="500";
                button.danger type="submit" { "Cancel this workflow" }
            }
        }
        (live)
        h2 #why { "Why there" }
        (explanation(&events))
        h2 #logs { "Output" }
        @match &logs {
            Some(l) if !l.logs.is_empty() => {
                @for log in &l.logs {
                    details open[l.logs.len() <= 4] {
                        summary { (log.job) @if let Some(i) = log.index { "[" (i) "]" } " · attempt " (log.attempt) }
                        @if !log.stdout.is_empty() { h4 { "stdout" } pre { (log.stdout) } }
                        @if !log.stderr.is_empty() { h4 { "stderr" } pre.stderr { (log.stderr) } }
                        @if log.stdout.is_empty() && log.stderr.is_empty() { p.empty { "It printed nothing." } }
                    }
                }
            }
            _ => { p.empty { "Output appears here as each run ends." } }
        }
        h2 #bill { "Bill" }
        @match &bill {
            Some(b) if !b.lines.is_empty() => { (bill_table(b)) }
            _ => { p.empty { "Charges appear here as runs end (the ledger follows the log by a moment)." } }
        }
    };
    page(&status.name, Some(&who), body).into_response()
}

/// The spec as submitted, from the workflow's first event.
fn submitted_spec(events: &[serde_json::Value]) -> Option<meridian_spec::Workflow> {
    let first = events
        .iter()
        .find(|e| e["payload"]["type"] == "workflow.submitted.v1")?;
    serde_json::from_value(first["payload"]["spec"].clone()).ok()
}

/// The part of the page that changes while the workflow runs; it asks to be fetched
/// again every two seconds until the workflow has ended.
fn live(status: &WorkflowStatus, spec: Option<&meridian_spec::Workflow>) -> Markup {
    let running = !status.state.is_final();
    let t = &status.tasks;
    let done = t.succeeded + t.failed + t.cancelled;
    html! {
        section #live hx-get=[running.then(|| format!("/workflows/{}?part=live", status.id))]
            hx-trigger=[running.then_some("every 2s")] hx-swap="outerHTML" data-state=(status.state.as_str()) {
            p.progress {
                progress max=(t.total.max(1)) value=(done) {}
                " " (t.succeeded) " done · " (t.running) " running · " (t.pending) " pending"
                @if t.failed > 0 { " · " (t.failed) " failed" }
                @if t.cancelled > 0 { " · " (t.cancelled) " cancelled" }
                @if running { span.note { " (refreshing)" } }
            }
            @if let Some(spec) = spec { (dag(spec, &status.jobs)) }
            (services(status, spec))
            h3 { "Runs" }
            @if status.jobs.is_empty() {
                p.empty { "No run has started yet." @if let Some(r) = &status.reason { " " (r) } }
            } @else {
                table #runs {
                    thead { tr { th { "Job" } th { "Attempt" } th { "Site" } th { "State" } th { "Exit" } th { "Started" } th { "Ended" } th { "Why" } } }
                    tbody {
                        @for run in &status.jobs {
                            tr data-job=(run.name) {
                                td { (run.name) @if let Some(i) = run.index { "[" (i) "]" } }
                                td { (run.attempt) }
                                td { (run.site) }
                                td { (state(run.state.as_str())) }
                                td { @if let Some(c) = run.exit_code { (c) } }
                                td { @if let Some(s) = &run.started_at { (time(s)) } }
                                td { @if let Some(s) = &run.ended_at { (time(s)) } }
                                td.reason { @if let Some(r) = &run.reason { (r) } }
                            }
                        }
                    }
                }
                @if status.jobs_truncated { p.note { "The first runs are shown; the counts above cover every task." } }
            }
            @if !status.transfers.is_empty() {
                h3 { "Data" }
                table #transfers {
                    thead { tr { th { "From" } th { "To" } th { "State" } th { "Bytes" } th { "Why" } } }
                    tbody {
                        @for x in &status.transfers {
                            tr {
                                td { (x.source) } td { (x.destination) }
                                td { (state(&format!("{:?}", x.state).to_lowercase())) @if x.cached { " (cached)" } }
                                td { (x.bytes_done) @if let Some(t) = x.bytes_total { " of " (t) } }
                                td.reason { @if let Some(r) = &x.reason { (r) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The workflow's jobs and services by stage (each after the ones it requires), each
/// with the state of its latest run and, for a task array, its tasks' progress.
fn dag(spec: &meridian_spec::Workflow, runs: &[JobRun]) -> Markup {
    let mut requires: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, job) in &spec.jobs {
        requires.insert(name, job.requires.iter().map(String::as_str).collect());
    }
    for (name, service) in &spec.services {
        requires.insert(name, service.requires.iter().map(String::as_str).collect());
    }
    // Each node's stage: one more than the deepest it requires (the spec has no cycles).
    let mut stage: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..=requires.len() {
        for (name, needs) in &requires {
            let s = needs
                .iter()
                .map(|n| stage.get(n).map_or(0, |s| s + 1))
                .max()
                .unwrap_or(0);
            stage.insert(name, s);
        }
    }
    let stages = stage.values().copied().max().map_or(0, |m| m + 1);
    html! {
        h3 { "Jobs" }
        div.dag #dag {
            @for s in 0..stages {
                @if s > 0 { div.arrow aria-hidden="true" { "→" } }
                div.stage {
                    @for (name, _) in stage.iter().filter(|(_, v)| **v == s) {
                        (node(spec, name, &requires[name], runs))
                    }
                }
            }
        }
    }
}

fn node(spec: &meridian_spec::Workflow, name: &str, needs: &[&str], runs: &[JobRun]) -> Markup {
    let array = spec.jobs.get(name).and_then(|j| j.array.as_ref());
    // The latest attempt of each task decides its state.
    let mut latest: BTreeMap<Option<u32>, &JobRun> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.name == name) {
        let e = latest.entry(r.index).or_insert(r);
        if r.attempt > e.attempt {
            *e = r;
        }
    }
    // Every task of an array, released or not (runs list only the released ones).
    let tasks = array.map_or(1, |a| a.len() as usize);
    let count = |state: &str| {
        latest
            .values()
            .filter(|r| r.state.as_str() == state)
            .count()
    };
    let shown = if latest.is_empty() {
        "waiting"
    } else if count("running") > 0 {
        "running"
    } else if count("pending") > 0 || latest.len() < tasks {
        "pending"
    } else if count("failed") > 0 {
        "failed"
    } else if count("cancelled") > 0 {
        "cancelled"
    } else if count("succeeded") == latest.len() {
        "succeeded"
    } else {
        latest
            .values()
            .next()
            .map_or("waiting", |r| r.state.as_str())
    };
    let service = spec.services.contains_key(name);
    html! {
        div class={ "node " (shown) } data-node=(name) {
            strong { (name) } @if service { " (service)" }
            " " (state(shown))
            @if array.is_some() {
                div.note { "tasks: " (count("succeeded")) " of " (tasks) " done"
                    @if count("running") > 0 { ", " (count("running")) " running" }
                    @if count("failed") > 0 { ", " (count("failed")) " failed" } }
            }
            @if !needs.is_empty() { div.note { "after " (needs.join(", ")) } }
        }
    }
}

fn services(status: &WorkflowStatus, spec: Option<&meridian_spec::Workflow>) -> Markup {
    let Some(spec) = spec else { return html! {} };
    let runs: Vec<&JobRun> = status
        .jobs
        .iter()
        .filter(|r| spec.services.contains_key(&r.name))
        .collect();
    html! {
        @if !spec.services.is_empty() {
            h3 { "Services" }
            table #services {
                thead { tr { th { "Service" } th { "State" } th { "Address" } } }
                tbody {
                    @for (name, _) in &spec.services {
                        @let run = runs.iter().filter(|r| &r.name == name).max_by_key(|r| r.attempt);
                        tr {
                            td { (name) }
                            td { @if let Some(r) = run { (state(r.state.as_str())) } @else { (state("waiting")) } }
                            td { @if let Some(a) = run.and_then(|r| r.address.as_deref()) { code { (a) } } @else { "not up yet" } }
                        }
                    }
                }
            }
        }
    }
}

/// Each placement decision as a table: every site with its verdict and cost terms.
fn explanation(events: &[serde_json::Value]) -> Markup {
    let decisions: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| {
            e["payload"]["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("workflow.placement_"))
        })
        .collect();
    html! {
        @if decisions.is_empty() { p.empty { "Not placed yet." } }
        @for d in decisions {
            @let p = &d["payload"];
            @match p["type"].as_str().unwrap_or("") {
                "workflow.placement_decided.v1" => {
                    @let candidates: Vec<Candidate> = serde_json::from_value(p["explanation"]["candidates"].clone()).unwrap_or_default();
                    p { "Attempt " (p["attempt"]) ": placed at " strong { (p["site"].as_str().unwrap_or("?")) }
                        " (" (p["region"].as_str().unwrap_or("")) ") for an estimated "
                        (amount(p["estimated_cost"]["amount"].as_str().unwrap_or("0"), p["estimated_cost"]["currency"].as_str().unwrap_or(""), 4)) "." }
                    (candidates_table(&candidates))
                }
                "workflow.placement_rejected.v1" => {
                    p { "Attempt " (p["attempt"]) ": no site could take it." }
                    ul { @for r in p["rejections"].as_array().into_iter().flatten() {
                        li { strong { (r["site"].as_str().unwrap_or("?")) } ": " (r["reason"].as_str().unwrap_or("")) }
                    } }
                }
                "workflow.placement_waiting.v1" => {
                    p { "Waiting: " (p["reason"].as_str().unwrap_or("")) }
                }
                _ => {}
            }
        }
    }
}

/// Every site with its verdict, and its estimate term by term.
pub(crate) fn candidates_table(candidates: &[Candidate]) -> Markup {
    html! {
        table.candidates {
            thead { tr { th { "Site" } th { "Verdict" } th.num { "Compute" } th.num { "Data in" } th.num { "Storage" } th.num { "Data out" } th.num { "Between sites" } th.num { "Total" } th { "Why not" } } }
            tbody {
                @for c in candidates {
                    @let (verdict, why) = match &c.verdict {
                        Verdict::Chosen => ("chosen", String::new()),
                        Verdict::Fitted => ("fits", String::new()),
                        Verdict::Rejected { reason } => ("rejected", reason.clone()),
                    };
                    tr class=(verdict) data-site=(c.site) {
                        td { (c.site) }
                        td { (state(verdict)) }
                        @if let Some(cost) = &c.cost {
                            @let cur = cost.currency.to_string();
                            td.num { (amount(&cost.compute.to_string(), &cur, 4)) }
                            td.num { (amount(&cost.data_in.to_string(), &cur, 4)) }
                            td.num { (amount(&cost.storage.to_string(), &cur, 4)) }
                            td.num { (amount(&cost.data_out.to_string(), &cur, 4)) }
                            td.num { (amount(&cost.data_between.to_string(), &cur, 4)) }
                            td.num { @match cost.total() { Ok(t) => { (amount(&t.amount.to_string(), &cur, 4)) } Err(_) => { "-" } } }
                        } @else {
                            td.num { "-" } td.num { "-" } td.num { "-" } td.num { "-" } td.num { "-" } td.num { "-" }
                        }
                        td.reason { (why) }
                    }
                }
            }
        }
    }
}

fn bill_table(b: &meridian_accounting::Bill) -> Markup {
    html! {
        table #bill-lines {
            thead { tr { th { "Category" } th { "Site" } th { "What" } th.num { "Quantity" } th.num { "Unit price" } th.num { "Amount" } th { "Price from" } } }
            tbody {
                @for l in &b.lines {
                    tr {
                        td { (l.category) }
                        td { (l.site) }
                        td { (l.description) }
                        td.num { (quantity(&l.quantity)) " " (l.unit) }
                        td.num { (l.contracted_unit_price) }
                        td.num { (amount(&l.amount, &l.currency, 6)) }
                        td.note { (l.price_source) }
                    }
                }
            }
            tfoot {
                @for t in &b.totals {
                    tr.total { td colspan="5" { "Total" } td.num { (amount(&t.amount, &t.currency, 6)) } td.note { "list " (amount(&t.list_amount, &t.currency, 6)) } }
                }
            }
        }
        p.note { "Amounts are exact in the ledger (hover for every digit); shown to 6 places. Ledger position " (b.as_of_position) "." }
    }
}

/// A quantity to 6 places for reading; every digit in its title.
fn quantity(exact: &str) -> Markup {
    let shown = exact
        .parse::<rust_decimal::Decimal>()
        .map(|d| d.round_dp(6).normalize().to_string())
        .unwrap_or_else(|_| exact.to_string());
    html! { span title=(exact) { (shown) } }
}

// ---- submitting ----

#[derive(Deserialize, Default)]
pub(crate) struct Draft {
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    idempotency_key: Option<String>,
    /// `check` (validate and quote) or `submit`.
    #[serde(default)]
    action: Option<String>,
}

pub(crate) async fn new_form(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
) -> Response {
    if let Some(refused) = may_submit(&console, &who).await {
        return refused;
    }
    let draft = Draft {
        workflow: EXAMPLE.to_string(),
        idempotency_key: Some(Uuid::now_v7().to_string()),
        action: None,
    };
    page("Submit", Some(&who), submit_page(&draft, html! {})).into_response()
}

const EXAMPLE: &str = "version: v1\nname: hello\njobs:\n  hello:\n    image: host\n    command: [echo, hello from Meridian]\n    resources: {cpus: 1, memory: 64MiB, walltime: 5m}\n";

fn submit_page(draft: &Draft, checked: Markup) -> Markup {
    html! {
        h1 { "Submit a workflow" }
        p { "Paste or upload a workflow (YAML or JSON, as " code { "meridian validate" } " reads). It is checked as you type, and priced at every connected site before you submit." }
        form #submit method="post" action="/workflows/new" {
            input type="hidden" name="idempotency_key" value=(draft.idempotency_key.as_deref().unwrap_or(""));
            label for="file" { "Upload a file" }
            input #file type="file" accept=".yaml,.yml,.json";
            label for="workflow" { "Workflow" }
            textarea #workflow name="workflow" rows="18" spellcheck="false"
                hx-post="/workflows/new/check" hx-trigger="input changed delay:400ms, load" hx-target="#checked" hx-swap="innerHTML" hx-include="#submit" {
                // HTML drops one newline right after <textarea>: keep the document's own.
                "\n" (draft.workflow)
            }
            div.buttons {
                button type="submit" name="action" value="check" { "Check and quote" }
                button.primary type="submit" name="action" value="submit" { "Submit" }
            }
        }
        div #checked aria-live="polite" { (checked) }
        script src="/assets/console.js" defer {}
    }
}

/// A refusal unless `who` may submit, saying why (an agent: which grant it lacks).
async fn may_submit(console: &Console, who: &Principal) -> Option<Response> {
    console
        .app
        .authorize(who, Action::SubmitWorkflow)
        .await
        .err()?;
    let why = match who.role {
        meridian_app::Role::Agent => {
            "This agent token may not submit workflows: it lacks the `submit` grant.".to_string()
        }
        role => format!("A {} token may not submit workflows.", role.as_str()),
    };
    Some(refusal(StatusCode::FORBIDDEN, Some(who), &why))
}

/// The document checked: each error beside the line of its field, or, when valid, the
/// quote at every connected site.
async fn checked(console: &Console, who: &Principal, document: &str) -> Markup {
    match meridian_spec::parse(document) {
        Err(errors) => html! {
            div.invalid #errors {
                p.error role="alert" { (errors.len()) " problem" @if errors.len() != 1 { "s" } " in this workflow:" }
                (annotated(document, &errors))
            }
        },
        Ok(spec) => match console.app.quote(who, &spec).await {
            Ok(q) => quote(&spec, &q),
            Err(e) => html! { p.error role="alert" { "Valid, but it cannot be quoted: " (e) } },
        },
    }
}

/// The document's lines with each error below the line its path points to.
fn annotated(document: &str, errors: &meridian_spec::SpecErrors) -> Markup {
    let mut at: BTreeMap<usize, Vec<&meridian_spec::FieldError>> = BTreeMap::new();
    let mut whole = Vec::new();
    for e in errors {
        match locate::line_of(document, &e.path) {
            Some(line) => at.entry(line).or_default().push(e),
            None => whole.push(e),
        }
    }
    html! {
        @for e in &whole { p.field-error data-path=(e.path) { @if !e.path.is_empty() { code { (e.path) } ": " } (e.message) } }
        ol.annotated {
            @for (i, line) in document.lines().enumerate() {
                @let n = i + 1;
                li value=(n) class=[at.contains_key(&n).then_some("has-error")] {
                    code { (line) }
                    @for e in at.get(&n).into_iter().flatten() {
                        div.field-error data-path=(e.path) data-line=(n) { code { (e.path) } ": " (e.message) }
                    }
                }
            }
        }
    }
}

fn quote(spec: &meridian_spec::Workflow, q: &Quote) -> Markup {
    html! {
        div.valid #quote {
            p.ok { "Valid: " strong { (spec.name) } ", " (spec.jobs.len()) " job" @if spec.jobs.len() != 1 { "s" }
                @if !spec.services.is_empty() { ", " (spec.services.len()) " service" @if spec.services.len() != 1 { "s" } } "." }
            @match (&q.site, &q.estimated_cost, &q.currency) {
                (Some(site), Some(cost), Some(cur)) => { p { "It would run at " strong #quote-site { (site) } " for an estimated " (amount(cost, cur, 4)) " (over the requested walltimes)." } }
                _ => { p.error { "No connected site can run it now." @for w in &q.waiting_for { " " (w) } } }
            }
            (candidates_table(&q.candidates))
            p.note { "Connected sites: " @if q.connected.is_empty() { "none" } @else { (q.connected.join(", ")) } "." }
        }
    }
}

/// `/workflows/new/check`: the check alone, for the page's live validation.
pub(crate) async fn check(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    form: Result<Form<Draft>, FormRejection>,
) -> Response {
    let draft = match form {
        Ok(Form(d)) => d,
        Err(e) => return refusal(StatusCode::BAD_REQUEST, Some(&who), &e.body_text()),
    };
    // Checking is quoting: refused, as a quote is, to whoever may not ask for one.
    if let Err(e) = console.app.authorize(&who, Action::Quote).await {
        return failed(&who, e);
    }
    if draft.workflow.len() > MAX_DOCUMENT {
        return Html(too_large().into_string()).into_response();
    }
    Html(checked(&console, &who, &draft.workflow).await.into_string()).into_response()
}

fn too_large() -> Markup {
    html! { p.error role="alert" { "workflow: at most " (MAX_DOCUMENT / 1024) " KiB here; submit larger documents with " code { "meridian submit" } "." } }
}

/// The form's two buttons: check (the page again, checked: what a browser without
/// JavaScript gets) or submit (to the new workflow's page).
pub(crate) async fn submit(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    form: Result<Form<Draft>, FormRejection>,
) -> Response {
    let draft = match form {
        Ok(Form(d)) => d,
        Err(e) => return refusal(StatusCode::BAD_REQUEST, Some(&who), &e.body_text()),
    };
    if let Some(refused) = may_submit(&console, &who).await {
        return refused;
    }
    if draft.workflow.len() > MAX_DOCUMENT {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            page("Submit", Some(&who), submit_page(&draft, too_large())),
        )
            .into_response();
    }
    if draft.action.as_deref() != Some("submit") {
        let checked = checked(&console, &who, &draft.workflow).await;
        return page("Submit", Some(&who), submit_page(&draft, checked)).into_response();
    }
    // The form's own key (a UUID it was given), as the API takes keys: at most 200
    // printable characters.
    let key = draft
        .idempotency_key
        .clone()
        .filter(|k| (1..=200).contains(&k.len()) && k.bytes().all(|b| (0x20..0x7f).contains(&b)));
    let submission = Submission {
        document: draft.workflow.clone(),
        declared_json: false,
        idempotency_key: key,
        traceparent: None,
    };
    match console.app.submit(&who, submission).await {
        Ok(s) => Redirect::to(&format!("/workflows/{}", s.accepted.id)).into_response(),
        // The form was submitted before with another document (the browser's Back
        // button): offer it again as a new submission.
        Err(AppError::IdempotencyMismatch) => {
            let draft = Draft {
                idempotency_key: Some(Uuid::now_v7().to_string()),
                ..draft
            };
            let note = html! { p.error role="alert" { "This form was submitted before with another document; press Submit again to submit this one as a new workflow." } };
            (
                StatusCode::CONFLICT,
                page("Submit", Some(&who), submit_page(&draft, note)),
            )
                .into_response()
        }
        Err(AppError::InvalidWorkflow(_)) => {
            let checked = checked(&console, &who, &draft.workflow).await;
            (
                StatusCode::BAD_REQUEST,
                page("Submit", Some(&who), submit_page(&draft, checked)),
            )
                .into_response()
        }
        Err(e) => failed(&who, e),
    }
}

#[derive(Deserialize)]
pub(crate) struct CancelForm {
    reason: Option<String>,
}

pub(crate) async fn cancel(
    State(console): State<Console>,
    Extension(who): Extension<Principal>,
    path: Result<Path<String>, PathRejection>,
    form: Result<Form<CancelForm>, FormRejection>,
) -> Response {
    let id = match workflow_id(path) {
        Ok(id) => id,
        Err(e) => return refusal(StatusCode::NOT_FOUND, Some(&who), &e),
    };
    let reason = crate::layout::reason(form.ok().and_then(|Form(f)| f.reason));
    match console.app.cancel(&who, id, reason, None).await {
        Ok(_) => Redirect::to(&format!("/workflows/{id}")).into_response(),
        Err(e) => failed(&who, e),
    }
}
