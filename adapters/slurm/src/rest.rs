//! The slurmrestd backend. It speaks the API version the site serves: v0.0.38 (Slurm
//! 22.05, the one tested here against a real slurmrestd) and v0.0.39 to v0.0.41 (Slurm
//! 23.02 to 24.05, from their published OpenAPI specs). The versions differ in shape:
//!
//! | | v0.0.38 | v0.0.39+ |
//! | --- | --- | --- |
//! | script | top-level `script` | `job.script` |
//! | `environment` | a map | an array of `"K=V"` |
//! | numbers | plain | `{set, infinite, number}` |
//! | `job_state` | a string | an array: base state and flags |
//! | `exit_code` | the raw wait status | `{status, return_code, signal}` |
//!
//! Readers here accept both forms of every field, whatever the version.
//!
//! slurmrestd answers a bad or expired token with HTTP 500 (not 401), and then with
//! errors that look unrelated (`Unable to find JobId=…`); only error number 2017 really
//! means "no such job". Every other 500 is reported as unavailable with a hint at the
//! token.

use std::sync::Arc;

use chrono::Utc;
use meridian_adapter_core::{AdapterError, BackendJobId, Capacity, JobReport, Usage};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::OnceCell;

use crate::config::{RestConfig, SlurmConfig, TokenSource};
use crate::parse::{
    add_free_by_model, epoch, has_nodes, parse_tres, task_string_holds, tres_gpus_by_model, Record,
    SlurmId,
};
use crate::script::Plan;
use crate::state::ExitStatus;

/// The versions this adapter speaks, newest first.
pub const SUPPORTED_VERSIONS: [&str; 4] = ["v0.0.41", "v0.0.40", "v0.0.39", "v0.0.38"];

/// `ESLURM_INVALID_JOB_ID`: the job is not (or no longer) known to slurmctld.
const INVALID_JOB_ID: i64 = 2017;
/// slurmdbd's "Nothing found" for a query that matched no job.
const NOTHING_FOUND: i64 = 9003;

/// What a job runs with when submitted over REST, which has no submitting shell to
/// inherit from.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

#[derive(Debug)]
pub(crate) struct Rest {
    http: reqwest::Client,
    rest: RestConfig,
    config: Arc<SlurmConfig>,
    version: OnceCell<String>,
}

/// One answer from slurmrestd.
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn errors(&self) -> Vec<(i64, String)> {
        self.body["errors"]
            .as_array()
            .map(|errors| {
                errors
                    .iter()
                    .map(|e| {
                        let number = e["error_number"]
                            .as_i64()
                            .or_else(|| e["error_code"].as_i64())
                            .unwrap_or(0);
                        let text = [&e["description"], &e["error"]]
                            .iter()
                            .filter_map(|v| v.as_str())
                            .filter(|s| !s.is_empty())
                            .collect::<Vec<_>>()
                            .join(": ");
                        (number, text)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn has_error(&self, number: i64) -> bool {
        self.errors().iter().any(|(n, _)| *n == number)
    }
}

impl Rest {
    pub fn new(rest: RestConfig, config: Arc<SlurmConfig>) -> Result<Rest, AdapterError> {
        let http = reqwest::Client::builder()
            .timeout(config.poll.command_timeout)
            .build()
            .map_err(|e| AdapterError::Unavailable(format!("HTTP client: {e}")))?;
        let version = OnceCell::new_with(rest.api_version.clone());
        Ok(Rest {
            http,
            rest,
            config,
            version,
        })
    }

    fn token(&self) -> Result<String, AdapterError> {
        let raw = match &self.rest.token {
            TokenSource::Env(name) => std::env::var(name).map_err(|_| {
                AdapterError::Unavailable(format!(
                    "the slurmrestd token variable {name} is not set"
                ))
            })?,
            TokenSource::File(path) => std::fs::read_to_string(path).map_err(|e| {
                AdapterError::Unavailable(format!(
                    "cannot read the slurmrestd token file {}: {e}",
                    path.display()
                ))
            })?,
        };
        // `scontrol token` prints `SLURM_JWT=<token>`: take either form.
        let token = raw.trim();
        Ok(token
            .strip_prefix("SLURM_JWT=")
            .unwrap_or(token)
            .to_string())
    }

    fn token_hint(&self) -> String {
        let source = match &self.rest.token {
            TokenSource::Env(name) => format!("environment variable {name}"),
            TokenSource::File(path) => format!("file {}", path.display()),
        };
        format!(
            "slurmrestd also answers 500 when the token is bad or expired: check the token in \
             {source} for user {}",
            self.rest.user
        )
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, AdapterError> {
        let url = format!("{}{path}", self.rest.url.trim_end_matches('/'));
        let mut request = self
            .http
            .request(method.clone(), &url)
            .header("X-SLURM-USER-NAME", &self.rest.user)
            .header("X-SLURM-USER-TOKEN", self.token()?);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| AdapterError::Unavailable(format!("slurmrestd at {url}: {e}")))?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .map_err(|e| AdapterError::Unavailable(format!("slurmrestd at {url}: {e}")))?;
        tracing::debug!(%method, %url, status, "slurmrestd");
        if status == 401 || status == 403 {
            return Err(AdapterError::Unavailable(format!(
                "slurmrestd refused the credentials of user {} (HTTP {status}: {})",
                self.rest.user,
                text.trim()
            )));
        }
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Answer { status, body })
    }

    /// Turns an unexpected answer into an error that says what to check.
    fn unexpected(&self, what: &str, answer: &Answer) -> AdapterError {
        let errors: Vec<String> = answer
            .errors()
            .into_iter()
            .map(|(n, text)| format!("{text} ({n})"))
            .collect();
        let mut message = format!(
            "slurmrestd {what}: HTTP {}: {}",
            answer.status,
            if errors.is_empty() {
                "no error given".to_string()
            } else {
                errors.join("; ")
            }
        );
        if answer.status == 500 {
            message.push_str(&format!(" ({})", self.token_hint()));
        }
        AdapterError::Unavailable(message)
    }

    /// The API version: configured, else the newest one the site serves.
    pub async fn version(&self) -> Result<&str, AdapterError> {
        self.version
            .get_or_try_init(|| self.discover())
            .await
            .map(String::as_str)
    }

    async fn discover(&self) -> Result<String, AdapterError> {
        if let Ok(answer) = self.call(Method::GET, "/openapi/v3", None).await {
            if let Some(paths) = answer.body["paths"].as_object() {
                let served = SUPPORTED_VERSIONS.iter().find(|v| {
                    let submit = format!("/slurm/{v}/job/submit");
                    paths.keys().any(|p| p.replace("\\/", "/") == submit)
                });
                if let Some(v) = served {
                    tracing::info!(version = v, "slurmrestd API version from /openapi/v3");
                    return Ok(v.to_string());
                }
            }
        }
        for v in SUPPORTED_VERSIONS {
            let answer = self
                .call(Method::GET, &format!("/slurm/{v}/ping"), None)
                .await?;
            if answer.status != 404 {
                tracing::info!(version = v, "slurmrestd API version by probing");
                return Ok(v.to_string());
            }
        }
        Err(AdapterError::Unavailable(format!(
            "slurmrestd at {} serves none of {SUPPORTED_VERSIONS:?}",
            self.rest.url
        )))
    }

    pub async fn submit(&self, plan: &Plan) -> Result<BackendJobId, AdapterError> {
        let v = self.version().await?;
        let body = submit_body(plan, v);
        let answer = self
            .call(Method::POST, &format!("/slurm/{v}/job/submit"), Some(&body))
            .await?;
        let job_id = num(&answer.body["job_id"]).or_else(|| num(&answer.body["result"]["job_id"]));
        match job_id {
            Some(id) if answer.status == 200 => {
                tracing::info!(slurm_job = id, comment = %plan.comment, "submitted to slurmrestd");
                Ok(BackendJobId(id.to_string()))
            }
            _ if answer.status == 500 && !answer.errors().is_empty() => {
                // A real refusal names its reason; a bad token gives a transport error.
                let errors = answer.errors();
                let transport = errors
                    .iter()
                    .any(|(n, _)| (5000..6000).contains(n) || *n == -1 || *n == 0);
                if transport {
                    Err(self.unexpected("job submit", &answer))
                } else {
                    Err(AdapterError::Rejected(
                        errors
                            .into_iter()
                            .map(|(_, t)| t)
                            .collect::<Vec<_>>()
                            .join("; "),
                    ))
                }
            }
            _ => Err(self.unexpected("job submit", &answer)),
        }
    }

    /// As [`crate::cli::Cli::find`]: slurmctld's jobs, then accounting (for `name` only
    /// when it is known).
    pub async fn find(
        &self,
        tag: &str,
        name: Option<&str>,
    ) -> Result<Option<BackendJobId>, AdapterError> {
        let v = self.version().await?;
        let answer = self
            .call(Method::GET, &format!("/slurm/{v}/jobs"), None)
            .await?;
        if answer.status != 200 {
            return Err(self.unexpected("jobs", &answer));
        }
        let tagged = |jobs: &Value, comment: &dyn Fn(&Value) -> Option<String>| {
            jobs.as_array()
                .into_iter()
                .flatten()
                .filter(|j| comment(j).as_deref() == Some(tag))
                // An array's task: the array's own id.
                .filter_map(|j| {
                    num(&j["array_job_id"])
                        .filter(|n| *n > 0)
                        .or_else(|| num(&j["job_id"]))
                })
                .min()
        };
        if let Some(id) = tagged(&answer.body["jobs"], &|j| text(&j["comment"])) {
            return Ok(Some(BackendJobId(id.to_string())));
        }
        // Accounting, for jobs slurmctld has forgotten. Dates only: slurmrestd 22.05
        // cannot parse times in this query.
        let since = Utc::now()
            - chrono::Duration::from_std(self.config.poll.find_lookback)
                .unwrap_or(chrono::Duration::days(30))
            - chrono::Duration::days(1);
        let mut path = format!("/slurmdb/{v}/jobs?start_time={}", since.format("%Y-%m-%d"));
        if let Some(name) = name {
            // Job names here are `[A-Za-z0-9._-]` only (script::plan): no escaping needed.
            path.push_str(&format!("&job_name={name}"));
        }
        let answer = self.call(Method::GET, &path, None).await?;
        if answer.status != 200 {
            // No slurmdbd behind this slurmrestd: only slurmctld's jobs can be found.
            tracing::debug!(status = answer.status, "no accounting to search");
            return Ok(None);
        }
        let comment = |j: &Value| text(&j["comment"]["job"]).or_else(|| text(&j["comment"]));
        Ok(tagged(&answer.body["jobs"], &comment).map(|id| BackendJobId(id.to_string())))
    }

    pub async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        let sid = SlurmId::from_backend(id)?;
        if let Some((array, task)) = sid.job.split_once('_') {
            let task = task
                .parse()
                .map_err(|_| AdapterError::UnknownJob(id.0.clone()))?;
            return self.array_task_status(id, array, task).await;
        }
        let v = self.version().await?;
        let answer = self
            .call(Method::GET, &format!("/slurm/{v}/job/{}", sid.job), None)
            .await?;
        if answer.status == 200 {
            if let Some(job) = answer.body["jobs"].as_array().and_then(|j| j.first()) {
                return ctld_record(job).report(id);
            }
        }
        if !(answer.has_error(INVALID_JOB_ID)
            || answer.status == 404
            || (answer.status == 200 && answer.errors().is_empty()))
        {
            return Err(self.unexpected("job status", &answer));
        }
        let answer = self
            .call(Method::GET, &format!("/slurmdb/{v}/job/{}", sid.job), None)
            .await?;
        let job = answer.body["jobs"].as_array().and_then(|j| j.last());
        match job {
            Some(job) if answer.status == 200 => dbd_record(job).report(id),
            None if answer.status == 404
                || answer.has_error(NOTHING_FOUND)
                || (answer.status == 200 && answer.errors().is_empty()) =>
            {
                Err(AdapterError::UnknownJob(id.0.clone()))
            }
            _ => Err(self.unexpected("accounting job", &answer)),
        }
    }

    /// What one read of each array's records says of its tasks among `ids`: a report for
    /// each task still waiting or running; `None` for the rest (a task that ended, one
    /// slurmctld forgot), to be asked for alone.
    pub async fn array_statuses(&self, ids: &[BackendJobId]) -> Vec<Option<JobReport>> {
        let mut out: Vec<Option<JobReport>> = ids.iter().map(|_| None).collect();
        if let Ok(v) = self.version().await {
            for (array, tasks) in crate::cli::array_tasks(ids) {
                let Ok(answer) = self
                    .call(Method::GET, &format!("/slurm/{v}/job/{}", array.job), None)
                    .await
                else {
                    continue;
                };
                if answer.status != 200 {
                    continue;
                }
                let jobs = answer.body["jobs"].as_array().cloned().unwrap_or_default();
                for (i, task) in tasks {
                    if let Some(Ok(report)) = array_task_record(&jobs, task)
                        .map(|job| ctld_record(job).report(&ids[i]))
                        .filter(|r| r.as_ref().is_ok_and(|r| !r.state.is_terminal()))
                    {
                        out[i] = Some(report);
                    }
                }
            }
        }
        out
    }

    /// One task of an array. slurmrestd 22.05 does not read `<array>_<task>` ids, so the
    /// array's records are read and the task picked out: its own record once it started,
    /// else the array's pending record that still holds it; accounting after that.
    async fn array_task_status(
        &self,
        id: &BackendJobId,
        array: &str,
        task: u32,
    ) -> Result<JobReport, AdapterError> {
        let v = self.version().await?;
        let answer = self
            .call(Method::GET, &format!("/slurm/{v}/job/{array}"), None)
            .await?;
        if answer.status == 200 {
            let jobs = answer.body["jobs"].as_array().cloned().unwrap_or_default();
            if let Some(job) = array_task_record(&jobs, task) {
                return ctld_record(job).report(id);
            }
        } else if !(answer.has_error(INVALID_JOB_ID) || answer.status == 404) {
            return Err(self.unexpected("job status", &answer));
        }
        let answer = self
            .call(Method::GET, &format!("/slurmdb/{v}/job/{array}"), None)
            .await?;
        if answer.status == 200 {
            let jobs = answer.body["jobs"].as_array().cloned().unwrap_or_default();
            if let Some(job) = jobs
                .iter()
                .find(|j| num(&j["array"]["task_id"]) == Some(i64::from(task)))
            {
                return dbd_record(job).report(id);
            }
            return Err(AdapterError::UnknownJob(id.0.clone()));
        }
        if answer.status == 404 || answer.has_error(NOTHING_FOUND) {
            return Err(AdapterError::UnknownJob(id.0.clone()));
        }
        Err(self.unexpected("accounting job", &answer))
    }

    pub async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        let report = self.status(id).await?;
        if report.state.is_terminal() {
            return Ok(());
        }
        let sid = SlurmId::from_backend(id)?;
        let v = self.version().await?;
        let answer = self
            .call(Method::DELETE, &format!("/slurm/{v}/job/{}", sid.job), None)
            .await?;
        if answer.status == 200 || answer.has_error(INVALID_JOB_ID) {
            tracing::info!(slurm_job = %id, "cancelled through slurmrestd");
            return Ok(());
        }
        Err(self.unexpected("job cancel", &answer))
    }

    pub async fn capacity(&self) -> Capacity {
        match self.try_capacity().await {
            Ok(c) => c,
            Err(e) => Capacity {
                healthy: false,
                message: Some(e.to_string()),
                ..Capacity::default()
            },
        }
    }

    async fn try_capacity(&self) -> Result<Capacity, AdapterError> {
        let v = self.version().await?;
        let ping = self
            .call(Method::GET, &format!("/slurm/{v}/ping"), None)
            .await?;
        let up = ping.status == 200
            && ping.body["pings"].as_array().is_some_and(|pings| {
                pings.iter().any(|p| {
                    text(&p["ping"]).or_else(|| text(&p["pinged"])).as_deref() == Some("UP")
                        || p["responding"].as_bool() == Some(true)
                })
            });
        if !up {
            return Ok(Capacity {
                healthy: false,
                message: Some(self.unexpected("ping", &ping).to_string()),
                ..Capacity::default()
            });
        }
        let nodes = self
            .call(Method::GET, &format!("/slurm/{v}/nodes"), None)
            .await?;
        if nodes.status != 200 {
            return Err(self.unexpected("nodes", &nodes));
        }
        let partition = self.config.partition.as_deref();
        let mut capacity = rest_nodes_capacity(&nodes.body, partition);
        let jobs = self
            .call(Method::GET, &format!("/slurm/{v}/jobs"), None)
            .await?;
        if jobs.status != 200 {
            return Err(self.unexpected("jobs", &jobs));
        }
        capacity.pending = jobs.body["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| states(&j["job_state"]).split(',').any(|s| s == "PENDING"))
            .filter(|j| partition.is_none_or(|p| text(&j["partition"]).as_deref() == Some(p)))
            .count() as u32;
        Ok(capacity)
    }
}

/// A number, plain or wrapped as `{set, infinite, number}` (unset or infinite: none).
pub fn num(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::Object(o) => {
            if o.get("set").and_then(Value::as_bool) == Some(false)
                || o.get("infinite").and_then(Value::as_bool) == Some(true)
            {
                None
            } else {
                o.get("number").and_then(Value::as_i64)
            }
        }
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::to_string)
}

/// A state: a string, or an array of base state and flags (joined with commas).
fn states(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        _ => String::new(),
    }
}

/// An exit code: v0.0.38's raw wait status, or `{return_code, signal: {id}}`.
fn exit_status(v: &Value) -> ExitStatus {
    match v {
        Value::Number(n) => ExitStatus::from_wait_status(n.as_i64().unwrap_or(0)),
        Value::Object(o) => {
            let code = o.get("return_code").and_then(num).unwrap_or(0) as i32;
            let signal = o
                .get("signal")
                .and_then(|s| s.get("id").or_else(|| s.get("signal_id")))
                .and_then(num)
                .unwrap_or(0) as i32;
            ExitStatus { code, signal }
        }
        _ => ExitStatus::default(),
    }
}

/// A job from `GET /slurm/vX/job/{id}`.
pub(crate) fn ctld_record(job: &Value) -> Record {
    let ran = has_nodes(job["nodes"].as_str().unwrap_or(""));
    let mut usage = parse_tres(job["tres_alloc_str"].as_str().unwrap_or(""));
    if let Some(n) = num(&job["node_count"]) {
        usage.nodes = n as u32;
    }
    Record {
        state: states(&job["job_state"]),
        exit: exit_status(&job["exit_code"]),
        started_at: ran
            .then(|| num(&job["start_time"]).and_then(epoch))
            .flatten(),
        ended_at: num(&job["end_time"]).and_then(epoch),
        usage,
        batch_host: job["batch_host"]
            .as_str()
            .filter(|h| has_nodes(h))
            .map(str::to_string),
        pending_reason: crate::parse::pending_reason(
            &states(&job["job_state"]),
            job["state_reason"].as_str().unwrap_or(""),
        ),
    }
}

/// A job from `GET /slurmdb/vX/job/{id}`.
pub(crate) fn dbd_record(job: &Value) -> Record {
    let ran = has_nodes(job["nodes"].as_str().unwrap_or(""));
    let mut usage = Usage::default();
    for tres in job["tres"]["allocated"].as_array().into_iter().flatten() {
        let count = num(&tres["count"]).unwrap_or(0).max(0) as u64;
        match (tres["type"].as_str(), tres["name"].as_str()) {
            (Some("cpu"), _) => usage.cpus = count as u32,
            (Some("mem"), _) => usage.memory_bytes = count << 20,
            (Some("node"), _) => usage.nodes = count as u32,
            (Some("gres"), Some("gpu")) => usage.gpus = count as u32,
            _ => {}
        }
    }
    let total = &job["time"]["total"];
    if let Some(secs) = num(&total["seconds"]) {
        let micros = num(&total["microseconds"]).unwrap_or(0);
        usage.cpu_seconds = Some(secs as f64 + micros as f64 / 1e6);
    }
    Record {
        state: states(&job["state"]["current"]),
        exit: exit_status(&job["exit_code"]),
        started_at: ran
            .then(|| num(&job["time"]["start"]).and_then(epoch))
            .flatten(),
        ended_at: num(&job["time"]["end"]).and_then(epoch),
        usage,
        // Accounting answers for jobs that ended: no service is running there.
        batch_host: None,
        pending_reason: None,
    }
}

/// The submit request for `plan` in API version `v`.
pub fn submit_body(plan: &Plan, v: &str) -> Value {
    let legacy = v == "v0.0.38";
    let mut env: Vec<(String, String)> = vec![("PATH".into(), DEFAULT_PATH.into())];
    env.extend(plan.meridian_env.iter().cloned());
    let wrap = |n: u64| {
        if legacy {
            json!(n)
        } else {
            json!({"set": true, "infinite": false, "number": n})
        }
    };
    let mut job = json!({
        "name": plan.name,
        "comment": plan.comment,
        "current_working_directory": plan.cwd,
        "standard_output": plan.stdout,
        "standard_error": plan.stderr,
        "tasks": plan.nodes,
        "tasks_per_node": 1,
        "cpus_per_task": plan.cpus_per_task,
    });
    let o = job.as_object_mut().expect("an object");
    if legacy {
        o.insert("nodes".into(), json!([plan.nodes, plan.nodes]));
        o.insert(
            "environment".into(),
            Value::Object(env.into_iter().map(|(k, v)| (k, json!(v))).collect()),
        );
    } else {
        o.insert("minimum_nodes".into(), json!(plan.nodes));
        o.insert("maximum_nodes".into(), json!(plan.nodes));
        o.insert(
            "environment".into(),
            json!(env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()),
        );
        o.insert("script".into(), json!(plan.script));
    }
    if let Some(mb) = plan.mem_mb {
        o.insert("memory_per_node".into(), wrap(mb));
    }
    if let Some(minutes) = plan.time_minutes {
        o.insert("time_limit".into(), wrap(minutes));
    }
    if let Some(gres) = &plan.gres {
        if legacy {
            o.insert("gres".into(), json!(gres));
        } else {
            o.insert("tres_per_node".into(), json!(format!("gres/{gres}")));
        }
    }
    if let Some(p) = &plan.partition {
        o.insert("partition".into(), json!(p));
    }
    if let Some(q) = &plan.qos {
        o.insert("qos".into(), json!(q));
    }
    if let Some(a) = &plan.account {
        o.insert("account".into(), json!(a));
    }
    if let Some(array) = &plan.array {
        o.insert("array".into(), json!(array));
    }
    if legacy {
        json!({"script": plan.script, "job": job})
    } else {
        json!({ "job": job })
    }
}

/// Task `task`'s record among an array's records from slurmctld: its own once it
/// started, else the array's pending record that still holds it.
fn array_task_record(jobs: &[Value], task: u32) -> Option<&Value> {
    jobs.iter()
        .find(|j| num(&j["array_task_id"]) == Some(i64::from(task)))
        .or_else(|| {
            jobs.iter().find(|j| {
                j["array_task_string"]
                    .as_str()
                    .is_some_and(|t| task_string_holds(t, task))
            })
        })
}

/// Capacity from `GET /slurm/vX/nodes`.
fn rest_nodes_capacity(body: &Value, partition: Option<&str>) -> Capacity {
    let mut c = Capacity {
        healthy: true,
        ..Capacity::default()
    };
    for node in body["nodes"].as_array().into_iter().flatten() {
        if let Some(p) = partition {
            let has = node["partitions"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|x| x.as_str() == Some(p)));
            if !has {
                continue;
            }
        }
        let cpus = num(&node["cpus"]).unwrap_or(0).max(0) as u32;
        let alloc = num(&node["alloc_cpus"]).unwrap_or(0).max(0) as u32;
        let mem = (num(&node["real_memory"]).unwrap_or(0).max(0) as u64) << 20;
        let alloc_mem = (num(&node["alloc_memory"]).unwrap_or(0).max(0) as u64) << 20;
        c.total_cpus += cpus;
        c.total_memory_bytes += mem;
        let state = states(&node["state"]).to_ascii_uppercase();
        let flags = states(&node["state_flags"]).to_ascii_uppercase();
        let words: Vec<&str> = state.split(',').chain(flags.split(',')).collect();
        let bad = [
            "DRAIN",
            "DOWN",
            "FAIL",
            "MAINT",
            "NOT_RESPONDING",
            "POWERED_DOWN",
            "FUTURE",
        ];
        if words.iter().any(|w| bad.contains(w)) {
            continue;
        }
        c.free_cpus += cpus.saturating_sub(alloc);
        c.free_memory_bytes += mem.saturating_sub(alloc_mem);
        let gpus = parse_tres(node["tres"].as_str().unwrap_or("")).gpus;
        let used = parse_tres(node["tres_used"].as_str().unwrap_or("")).gpus;
        c.free_gpus += gpus.saturating_sub(used);
        add_free_by_model(
            &mut c.free_gpus_by_model,
            &tres_gpus_by_model(node["tres"].as_str().unwrap_or("")),
            &tres_gpus_by_model(node["tres_used"].as_str().unwrap_or("")),
        );
        if words.contains(&"IDLE") {
            c.idle_nodes += 1;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SlurmConfig;
    use crate::script::plan;
    use meridian_adapter_core::{JobRequest, JobState, Resources};
    use std::time::Duration;

    fn a_plan() -> Plan {
        let job = JobRequest {
            job_id: uuid::Uuid::nil(),
            workflow_id: uuid::Uuid::nil(),
            name: "a".into(),
            array_index: Some(3),
            image: None,
            command: vec!["true".into()],
            env: Default::default(),
            cwd: None,
            resources: Resources {
                nodes: 1,
                cpus: 8,
                memory_bytes: 32768 << 20,
                walltime: Duration::from_secs(7200),
                gpus: Some(meridian_adapter_core::Gpus {
                    count: 1,
                    vendor: "nvidia".into(),
                    model: None,
                }),
            },
            service: None,
            mounts: Default::default(),
            volume_sizes: Default::default(),
            tenant: None,
            shape: None,
            report_to: None,
            slurm: None,
        };
        let mut config = SlurmConfig::cli("/scratch/u");
        config.partition = Some("gpu".into());
        plan(&job, &config).unwrap()
    }

    #[test]
    fn v0_0_38_puts_the_script_on_top_and_the_environment_in_a_map() {
        let body = submit_body(&a_plan(), "v0.0.38");
        assert!(body["script"].as_str().unwrap().starts_with("#!/bin/sh\n"));
        let job = &body["job"];
        assert_eq!(job["environment"]["PATH"], DEFAULT_PATH);
        assert_eq!(job["environment"]["ARRAY_INDEX"], "3");
        assert_eq!(job["memory_per_node"], 32768);
        assert_eq!(job["time_limit"], 120);
        assert_eq!(job["nodes"], json!([1, 1]));
        assert_eq!(job["gres"], "gpu:1");
        assert_eq!(job["partition"], "gpu");
        assert!(job.get("qos").is_none());
        assert_eq!(job["comment"], format!("meridian:{}", uuid::Uuid::nil()));
        assert!(job.get("script").is_none());
        let mut plan = a_plan();
        plan.qos = Some("high".into());
        assert_eq!(submit_body(&plan, "v0.0.38")["job"]["qos"], "high");
    }

    #[test]
    fn v0_0_39_and_later_wrap_numbers_and_list_the_environment() {
        for v in ["v0.0.39", "v0.0.40", "v0.0.41"] {
            let body = submit_body(&a_plan(), v);
            assert!(body.get("script").is_none());
            let job = &body["job"];
            assert!(job["script"].as_str().unwrap().contains("exec true"));
            let env: Vec<&str> = job["environment"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap())
                .collect();
            assert!(env.contains(&"PATH=/usr/local/bin:/usr/bin:/bin"));
            assert!(env.contains(&"MERIDIAN_ARRAY_INDEX=3"));
            assert_eq!(
                job["memory_per_node"],
                json!({"set": true, "infinite": false, "number": 32768})
            );
            assert_eq!(
                job["time_limit"],
                json!({"set": true, "infinite": false, "number": 120})
            );
            assert_eq!(job["tres_per_node"], "gres/gpu:1");
            assert_eq!(job["cpus_per_task"], 8);
        }
    }

    #[test]
    fn numbers_plain_and_wrapped() {
        assert_eq!(num(&json!(5)), Some(5));
        assert_eq!(
            num(&json!({"set": true, "infinite": false, "number": 5})),
            Some(5)
        );
        assert_eq!(num(&json!({"set": false, "number": 0})), None);
        assert_eq!(
            num(&json!({"set": true, "infinite": true, "number": 0})),
            None
        );
        assert_eq!(num(&json!("5")), None);
    }

    #[test]
    fn job_records_in_both_shapes() {
        // v0.0.38 (recorded from slurmrestd 22.05.8): exit 2 as a wait status.
        let v38 = json!({"job_id": 4, "job_state": "FAILED", "exit_code": 512,
            "start_time": 1795990816, "end_time": 1795990816, "nodes": "vm", "node_count": 1,
            "tres_alloc_str": "cpu=1,mem=64M,node=1,billing=1"});
        let report = ctld_record(&v38).report(&BackendJobId("4".into())).unwrap();
        match report.state {
            JobState::Failed { exit_code, .. } => assert_eq!(exit_code, Some(2)),
            other => panic!("{other:?}"),
        }
        assert_eq!(report.usage.memory_bytes, 64 << 20);
        // v0.0.40 (from the published spec): arrays and wrapped numbers.
        let v40 = json!({"job_id": 5, "job_state": ["RUNNING", "COMPLETING"],
            "exit_code": {"status": ["SIGNALED"], "return_code": {"set": true, "number": 0},
                          "signal": {"id": {"set": true, "number": 9}, "name": "KILL"}},
            "start_time": {"set": true, "infinite": false, "number": 1795990816},
            "end_time": {"set": true, "infinite": false, "number": 1795990820},
            "nodes": "gpu01", "node_count": {"set": true, "number": 1},
            "tres_alloc_str": "cpu=8,mem=32G,node=1,gres/gpu=1"});
        let record = ctld_record(&v40);
        assert_eq!(record.state, "RUNNING,COMPLETING");
        assert_eq!(record.exit.shell_code(), 137);
        assert_eq!(record.usage.gpus, 1);
        assert!(matches!(
            record.report(&BackendJobId("5".into())).unwrap().state,
            JobState::Running { .. }
        ));
        // Pending: no nodes, so no start, whatever start_time says.
        let pending = json!({"job_id": 6, "job_state": "PENDING", "nodes": "",
            "start_time": 1795990900, "end_time": 0});
        assert_eq!(
            ctld_record(&pending)
                .report(&BackendJobId("6".into()))
                .unwrap()
                .state,
            JobState::Pending
        );
    }

    #[test]
    fn accounting_records() {
        // Recorded from slurmrestd 22.05.8 /slurmdb/v0.0.38/job/4.
        let job = json!({"job_id": 4, "state": {"current": "COMPLETED", "reason": "None"},
            "exit_code": {"status": "SUCCESS", "return_code": 0}, "nodes": "vm",
            "time": {"elapsed": 1, "end": 1795990817, "start": 1795990816,
                     "total": {"seconds": 1, "microseconds": 500000}},
            "tres": {"allocated": [{"type": "cpu", "name": null, "id": 1, "count": 2},
                                   {"type": "mem", "name": null, "id": 2, "count": 64},
                                   {"type": "node", "name": null, "id": 4, "count": 1},
                                   {"type": "gres", "name": "gpu", "id": 1001, "count": 2}]}});
        let r = dbd_record(&job);
        assert_eq!((r.usage.cpus, r.usage.nodes, r.usage.gpus), (2, 1, 2));
        assert_eq!(r.usage.memory_bytes, 64 << 20);
        assert_eq!(r.usage.cpu_seconds, Some(1.5));
        assert!(matches!(
            r.report(&BackendJobId("4".into())).unwrap().state,
            JobState::Succeeded { .. }
        ));
    }

    #[test]
    fn node_capacity_from_rest() {
        // Recorded from slurmrestd 22.05.8 /slurm/v0.0.38/nodes (trimmed).
        let body = json!({"nodes": [
            {"name": "vm", "state": "idle", "state_flags": [], "cpus": 2, "alloc_cpus": 0,
             "real_memory": 23593, "alloc_memory": 0, "partitions": ["debug"],
             "tres": "cpu=2,mem=23593M,billing=2", "tres_used": null},
            {"name": "g1", "state": ["MIXED"], "state_flags": ["DRAIN"], "cpus": 8,
             "alloc_cpus": 2, "real_memory": 1000, "alloc_memory": 10,
             "partitions": ["gpu"], "tres": "cpu=8,gres/gpu=4", "tres_used": "gres/gpu=1"}]});
        let c = rest_nodes_capacity(&body, None);
        assert_eq!(
            (c.total_cpus, c.free_cpus, c.idle_nodes, c.free_gpus),
            (10, 2, 1, 0)
        );
        let c = rest_nodes_capacity(&body, Some("gpu"));
        assert_eq!((c.total_cpus, c.free_cpus), (8, 0));
    }

    #[test]
    fn free_gpus_by_model_from_typed_gres() {
        let body = json!({"nodes": [
            {"name": "g1", "state": ["MIXED"], "state_flags": [], "cpus": 64, "alloc_cpus": 8,
             "real_memory": 1000, "alloc_memory": 10, "partitions": ["gpu"],
             "tres": "cpu=64,gres/gpu=8,gres/gpu:a100=4,gres/gpu:h100_80g=4",
             "tres_used": "cpu=8,gres/gpu=3,gres/gpu:h100_80g=3"},
            {"name": "g2", "state": ["IDLE"], "state_flags": [], "cpus": 64, "alloc_cpus": 0,
             "real_memory": 1000, "alloc_memory": 0, "partitions": ["gpu"],
             "tres": "cpu=64,gres/gpu=2,gres/gpu:mi250x=2", "tres_used": null},
            {"name": "g3", "state": ["IDLE"], "state_flags": ["DRAIN"], "cpus": 64,
             "alloc_cpus": 0, "real_memory": 1000, "alloc_memory": 0, "partitions": ["gpu"],
             "tres": "cpu=64,gres/gpu=4,gres/gpu:a100=4", "tres_used": null}]});
        let c = rest_nodes_capacity(&body, None);
        assert_eq!(c.free_gpus, 7);
        assert_eq!(
            c.free_gpus_by_model,
            [("A100".into(), 4), ("H100".into(), 1), ("MI250X".into(), 2)].into()
        );
    }
}
