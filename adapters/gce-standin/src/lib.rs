//! For tests only: a stand-in for Compute Engine's instance, zone operation and machine
//! type calls, and for Google's OAuth2 token endpoint (the refresh-token grant of an
//! `authorized_user` credentials file). It speaks their documented JSON shapes: instances
//! with `status` and `labels`, `compute#operation`s that run and end `DONE` (with
//! `error.errors[].code` when they fail), aggregated lists by `zones/…` scope with page
//! tokens and a label filter, `{"error": {"code", "message", "errors": [{"reason"}]}}`
//! for a call refused at once. With state: an inserted instance is PROVISIONING until
//! its operation is looked at, then RUNNING; a request id sent again gets the same
//! operation; a name taken in its zone is refused; a deleted instance is STOPPING, then
//! gone; a Spot instance can be preempted (deleted, as `instanceTerminationAction: DELETE`
//! says); a guest shutdown leaves it TERMINATED with its disk. Inserts are checked as
//! Compute Engine checks them (labels, GPU instances that must terminate on host
//! maintenance, Spot without a termination action).
//!
//! Every Compute Engine call must carry a bearer token this stand-in issued.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// One instance the stand-in holds.
#[derive(Debug, Clone)]
pub struct StandInInstance {
    pub zone: String,
    pub name: String,
    /// The insert's body as sent.
    pub body: Value,
    /// `PROVISIONING`, `RUNNING`, `STOPPING`, `TERMINATED`.
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    /// Looks left before a STOPPING instance being deleted is gone.
    deleting: Option<u32>,
}

/// A zone operation.
#[derive(Debug, Clone)]
struct Operation {
    zone: String,
    kind: &'static str,
    target: String,
    /// Looks left before it is DONE.
    looks: u32,
    /// How it ends: done, or (HTTP status, code, message).
    end: Result<(), (u16, String, String)>,
    id: u64,
}

/// A refusal of inserts in a zone: at once with an HTTP error (`reason`), or through the
/// operation (`code`).
#[derive(Debug, Clone)]
struct Refusal {
    at_once: bool,
    http: u16,
    code: String,
    message: String,
}

#[derive(Default)]
struct Inner {
    instances: Vec<StandInInstance>,
    operations: BTreeMap<String, Operation>,
    request_ids: HashMap<String, String>,
    refusals: HashMap<String, Refusal>,
    tokens: Vec<String>,
    requests: Vec<String>,
    next: u64,
    /// The most instances an aggregated list page holds, below what was asked.
    page_size: Option<usize>,
}

/// The stand-in's state, shared with its server task.
#[derive(Clone)]
pub struct GceStandIn {
    inner: Arc<Mutex<Inner>>,
    url: String,
    client_id: String,
    client_secret: String,
    refresh_token: String,
}

/// The machine types every zone has: (name, vCPUs, MB, accelerator type, count).
const MACHINE_TYPES: &[(&str, i64, i64, &str, i64)] = &[
    ("e2-standard-4", 4, 16_384, "", 0),
    ("n1-standard-8", 8, 30_720, "", 0),
    ("n2-standard-16", 16, 65_536, "", 0),
    ("g2-standard-4", 4, 16_384, "nvidia-l4", 1),
    ("a2-highgpu-1g", 12, 87_040, "nvidia-tesla-a100", 1),
    ("a3-highgpu-8g", 208, 1_916_928, "nvidia-h100-80gb", 8),
];

const API: &str = "https://www.googleapis.com/compute/v1";

impl GceStandIn {
    /// Starts it on a free port of 127.0.0.1; tokens go to whoever presents this client
    /// and refresh token.
    pub async fn start(client_id: &str, client_secret: &str, refresh_token: &str) -> GceStandIn {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let standin = GceStandIn {
            inner: Arc::default(),
            url,
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            refresh_token: refresh_token.into(),
        };
        let zone = "/compute/v1/projects/{project}/zones/{zone}";
        let app = Router::new()
            .route("/token", post(token))
            .route(&format!("{zone}/instances"), post(insert).get(list))
            .route(
                &format!("{zone}/instances/{{name}}"),
                get(get_instance).delete(delete),
            )
            .route(&format!("{zone}/operations/{{operation}}"), get(operation))
            .route(&format!("{zone}/machineTypes/{{name}}"), get(machine_type))
            .route(
                "/compute/v1/projects/{project}/aggregated/instances",
                get(aggregated),
            )
            // Not Compute Engine's API: what an instance's own `shutdown -h now` does to
            // it (it stops, TERMINATED), for tests that play the instance.
            .route("/standin/instances/{zone}/{name}/shutdown", post(shutdown))
            .with_state(standin.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        standin
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// An `authorized_user` credentials file's JSON for this stand-in's token endpoint.
    pub fn credentials_json(&self) -> Value {
        json!({
            "type": "authorized_user",
            "client_id": self.client_id,
            "client_secret": self.client_secret,
            "refresh_token": self.refresh_token,
            "token_uri": format!("{}/token", self.url),
        })
    }

    /// From now on inserts in `zone` fail with `code`: at once with HTTP `http` (`code`
    /// as the error's reason), or through their operation (`code` as its error code).
    pub fn refuse(&self, zone: &str, at_once: bool, http: u16, code: &str, message: &str) {
        self.lock().refusals.insert(
            zone.into(),
            Refusal {
                at_once,
                http,
                code: code.into(),
                message: message.into(),
            },
        );
    }

    /// Compute Engine preempts a Spot instance; its termination action deletes it.
    pub fn preempt(&self, zone: &str, name: &str) {
        let mut inner = self.lock();
        let i = inner
            .instances
            .iter()
            .find(|i| i.zone == zone && i.name == name)
            .expect("a known instance");
        assert_eq!(
            i.body["scheduling"]["provisioningModel"], "SPOT",
            "not a Spot instance"
        );
        assert_eq!(i.body["scheduling"]["instanceTerminationAction"], "DELETE");
        inner
            .instances
            .retain(|i| !(i.zone == zone && i.name == name));
    }

    /// Aggregated lists give at most `n` instances a page, whatever was asked.
    pub fn page_size(&self, n: usize) {
        self.lock().page_size = Some(n);
    }

    pub fn instances(&self) -> Vec<StandInInstance> {
        self.lock().instances.clone()
    }

    /// Adds an instance someone else made (not Meridian's), running.
    pub fn add_foreign(&self, zone: &str, name: &str, labels: Value) {
        let mut inner = self.lock();
        inner.instances.push(StandInInstance {
            zone: zone.into(),
            name: name.into(),
            body: json!({"name": name, "labels": labels, "machineType": format!("zones/{zone}/machineTypes/e2-standard-4")}),
            status: "RUNNING".into(),
            created_at: Utc::now(),
            stopped_at: None,
            deleting: None,
        });
    }

    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `None` when the request carries a token this stand-in issued.
    fn unauthorized(&self, headers: &HeaderMap) -> Option<Response> {
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match token {
            Some(t) if self.lock().tokens.iter().any(|k| k == t) => None,
            _ => Some(error(
                401,
                "authError",
                "Request had invalid authentication credentials. Expected OAuth 2 access token.",
            )),
        }
    }
}

impl Inner {
    /// One look at the instances: a deleted one STOPPING since the last look is gone.
    fn look(&mut self) {
        for i in self.instances.iter_mut() {
            if let Some(n) = i.deleting.as_mut() {
                *n = n.saturating_sub(1);
            }
        }
        self.instances.retain(|i| i.deleting != Some(0));
    }

    fn new_operation(
        &mut self,
        zone: &str,
        kind: &'static str,
        target: &str,
        end: Result<(), (u16, String, String)>,
    ) -> String {
        self.next += 1;
        let name = format!(
            "operation-{}-{:016x}",
            1_764_000_000_000u64 + self.next,
            self.next * 7919
        );
        self.operations.insert(
            name.clone(),
            Operation {
                zone: zone.into(),
                kind,
                target: target.into(),
                looks: 1,
                end,
                id: 4_000_000_000 + self.next,
            },
        );
        name
    }
}

fn error(http: u16, reason: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(http).expect("a status"),
        [("content-type", "application/json")],
        json!({"error": {"code": http, "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}]}})
        .to_string(),
    )
        .into_response()
}

fn ok(value: Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn instance_json(project: &str, i: &StandInInstance) -> Value {
    let mut v = i.body.clone();
    let zone_url = format!("{API}/projects/{project}/zones/{}", i.zone);
    v["kind"] = json!("compute#instance");
    v["id"] = json!(format!(
        "{}",
        7_000_000_000u64 + i.created_at.timestamp_subsec_nanos() as u64
    ));
    v["zone"] = json!(zone_url);
    v["status"] = json!(i.status);
    v["selfLink"] = json!(format!("{zone_url}/instances/{}", i.name));
    v["creationTimestamp"] = json!(i
        .created_at
        .with_timezone(&chrono::FixedOffset::west_opt(8 * 3600).expect("an offset"))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, false));
    if let Some(t) = i.stopped_at {
        v["lastStopTimestamp"] = json!(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, false));
    }
    if let Some(nics) = v["networkInterfaces"].as_array_mut() {
        for (n, nic) in nics.iter_mut().enumerate() {
            nic["networkIP"] = json!(format!("10.128.0.{}", 2 + n));
            nic["name"] = json!(format!("nic{n}"));
        }
    }
    v
}

fn operation_json(project: &str, name: &str, op: &Operation) -> Value {
    let zone_url = format!("{API}/projects/{project}/zones/{}", op.zone);
    let mut v = json!({
        "kind": "compute#operation",
        "id": op.id.to_string(),
        "name": name,
        "zone": zone_url,
        "operationType": op.kind,
        "targetLink": format!("{zone_url}/instances/{}", op.target),
        "status": if op.looks == 0 { "DONE" } else { "RUNNING" },
        "progress": if op.looks == 0 { 100 } else { 0 },
        "insertTime": Utc::now().to_rfc3339(),
        "selfLink": format!("{zone_url}/operations/{name}"),
        "user": "meridian@standin",
    });
    if op.looks == 0 {
        if let Err((http, code, message)) = &op.end {
            v["httpErrorStatusCode"] = json!(http);
            v["httpErrorMessage"] = json!(StatusCode::from_u16(*http)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("")
                .to_ascii_uppercase());
            v["error"] = json!({"errors": [{"code": code, "message": message}]});
        }
    }
    v
}

fn is_name(value: &str) -> bool {
    value.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// What Compute Engine would refuse in an insert's body, as `(reason, message)`.
fn invalid(zone: &str, body: &Value) -> Option<String> {
    let name = body["name"].as_str().unwrap_or("");
    if !is_name(name) {
        return Some(format!("Invalid value for field 'resource.name': '{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'"));
    }
    let machine = body["machineType"].as_str().unwrap_or("");
    let prefix = format!("zones/{zone}/machineTypes/");
    let Some(machine) = machine
        .strip_prefix(&prefix)
        .and_then(|m| MACHINE_TYPES.iter().find(|t| t.0 == m))
    else {
        return Some(format!("Invalid value for field 'resource.machineType': '{machine}'. Machine type with name does not exist in zone '{zone}'."));
    };
    let disk = &body["disks"][0];
    if disk["boot"] != true || disk["initializeParams"]["sourceImage"].as_str().is_none() {
        return Some("Invalid value for field 'resource.disks[0]': a boot disk with initializeParams.sourceImage is required.".into());
    }
    if body["networkInterfaces"]
        .as_array()
        .is_none_or(|n| n.is_empty())
    {
        return Some("Invalid value for field 'resource.networkInterfaces': at least one network interface is required.".into());
    }
    for (k, v) in body["labels"].as_object().into_iter().flatten() {
        let value = v.as_str().unwrap_or("");
        let ok_value = value.len() <= 63
            && value
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if !is_name(k) || !ok_value {
            return Some(format!("Invalid value for field 'resource.labels': '{k}={value}'. Label keys and values may contain only lowercase letters, numeric characters, underscores and dashes."));
        }
    }
    let scheduling = &body["scheduling"];
    let gpus = machine.4 > 0
        || body["guestAccelerators"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
    if gpus && scheduling["onHostMaintenance"] != "TERMINATE" {
        return Some("Instances with guest accelerators do not support live migration.".into());
    }
    let action = scheduling["instanceTerminationAction"].as_str();
    if (scheduling["provisioningModel"] == "SPOT" || scheduling["maxRunDuration"].is_object())
        && action.is_none()
    {
        return Some("Invalid value for field 'resource.scheduling.instanceTerminationAction': a termination action is required with SPOT provisioning or maxRunDuration.".into());
    }
    let startup = body["metadata"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|i| i["key"] == "startup-script");
    if !startup {
        return Some("the stand-in expects a startup-script in metadata".into());
    }
    None
}

/// Google's token endpoint takes the grant as a form or as JSON; Google's Rust client
/// sends JSON, the one form this stand-in reads.
async fn token(State(s): State<GceStandIn>, body: Bytes) -> Response {
    s.lock().requests.push("token".into());
    let form: HashMap<String, String> = serde_json::from_slice::<HashMap<String, Value>>(&body)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_str()?.to_string())))
        .collect();
    if form.get("grant_type").map(String::as_str) != Some("refresh_token")
        || form.get("client_id") != Some(&s.client_id)
        || form.get("client_secret") != Some(&s.client_secret)
        || form.get("refresh_token") != Some(&s.refresh_token)
    {
        return (
            StatusCode::BAD_REQUEST,
            [("content-type", "application/json")],
            json!({"error": "invalid_grant", "error_description": "Bad Request"}).to_string(),
        )
            .into_response();
    }
    let mut inner = s.lock();
    inner.next += 1;
    let token = format!("ya29.standin-{}", inner.next);
    inner.tokens.push(token.clone());
    ok(
        json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer",
        "scope": "https://www.googleapis.com/auth/cloud-platform"}),
    )
}

async fn insert(
    State(s): State<GceStandIn>,
    Path((project, zone)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(
            400,
            "parseError",
            "This API does not support parsing form-encoded input.",
        );
    };
    let mut inner = s.lock();
    let name = body["name"].as_str().unwrap_or("").to_string();
    inner.requests.push(format!("insert {zone}/{name}"));
    if let Some(id) = query.get("requestId") {
        if let Some(op) = inner.request_ids.get(id).cloned() {
            let found = inner.operations.get(&op).expect("its operation").clone();
            return ok(operation_json(&project, &op, &found));
        }
    }
    if let Some(message) = invalid(&zone, &body) {
        return error(400, "invalid", &message);
    }
    if inner
        .instances
        .iter()
        .any(|i| i.zone == zone && i.name == name)
    {
        return error(
            409,
            "alreadyExists",
            &format!(
                "The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists"
            ),
        );
    }
    let refusal = inner.refusals.get(&zone).cloned();
    let end = match refusal {
        Some(r) if r.at_once => return error(r.http, &r.code, &r.message),
        Some(r) => Err((r.http, r.code, r.message)),
        None => Ok(()),
    };
    if end.is_ok() {
        inner.instances.push(StandInInstance {
            zone: zone.clone(),
            name: name.clone(),
            body: body.clone(),
            status: "PROVISIONING".into(),
            created_at: Utc::now(),
            stopped_at: None,
            deleting: None,
        });
    }
    let op = inner.new_operation(&zone, "insert", &name, end);
    if let Some(id) = query.get("requestId") {
        inner.request_ids.insert(id.clone(), op.clone());
    }
    let found = inner.operations.get(&op).expect("its operation").clone();
    ok(operation_json(&project, &op, &found))
}

async fn operation(
    State(s): State<GceStandIn>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push(format!("operation {zone}"));
    let Some(op) = inner.operations.get_mut(&name) else {
        return error(
            404,
            "notFound",
            &format!(
                "The resource 'projects/{project}/zones/{zone}/operations/{name}' was not found"
            ),
        );
    };
    let was_running = op.looks > 0;
    op.looks = op.looks.saturating_sub(1);
    let op = op.clone();
    if was_running && op.looks == 0 && op.kind == "insert" && op.end.is_ok() {
        if let Some(i) = inner
            .instances
            .iter_mut()
            .find(|i| i.zone == op.zone && i.name == op.target && i.status == "PROVISIONING")
        {
            i.status = "RUNNING".into();
        }
    }
    ok(operation_json(&project, &name, &op))
}

async fn get_instance(
    State(s): State<GceStandIn>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push(format!("get {zone}/{name}"));
    inner.look();
    match inner
        .instances
        .iter()
        .find(|i| i.zone == zone && i.name == name)
    {
        Some(i) => ok(instance_json(&project, i)),
        None => error(
            404,
            "notFound",
            &format!(
                "The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            ),
        ),
    }
}

async fn list(
    State(s): State<GceStandIn>,
    Path((project, zone)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push(format!("list {zone}"));
    let items: Vec<Value> = inner
        .instances
        .iter()
        .filter(|i| i.zone == zone)
        .map(|i| instance_json(&project, i))
        .collect();
    ok(json!({"kind": "compute#instanceList", "items": items}))
}

/// `labels.KEY = "VALUE"` (or unquoted): the one filter the stand-in reads.
fn label_filter(filter: &str) -> Option<(String, String)> {
    let (key, value) = filter.split_once('=')?;
    let key = key.trim().strip_prefix("labels.")?;
    let value = value.trim().trim_matches('"');
    Some((key.to_string(), value.to_string()))
}

async fn aggregated(
    State(s): State<GceStandIn>,
    Path(project): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let filter = match query.get("filter") {
        None => None,
        Some(f) => match label_filter(f) {
            Some(kv) => Some(kv),
            None => {
                return error(
                    400,
                    "invalid",
                    &format!("Invalid list filter expression '{f}'."),
                )
            }
        },
    };
    let mut inner = s.lock();
    inner.requests.push("aggregated".into());
    inner.look();
    let mut matching: Vec<&StandInInstance> = inner
        .instances
        .iter()
        .filter(|i| {
            filter
                .as_ref()
                .is_none_or(|(k, v)| i.body["labels"][k.as_str()].as_str() == Some(v))
        })
        .collect();
    matching.sort_by(|a, b| (&a.zone, &a.name).cmp(&(&b.zone, &b.name)));
    let per_page: usize = query
        .get("maxResults")
        .and_then(|m| m.parse().ok())
        .unwrap_or(500)
        .clamp(1, 500)
        .min(inner.page_size.unwrap_or(500));
    let from: usize = query
        .get("pageToken")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let page: Vec<&StandInInstance> = matching.iter().skip(from).take(per_page).copied().collect();
    let mut items = serde_json::Map::new();
    for i in &page {
        let scope = items
            .entry(format!("zones/{}", i.zone))
            .or_insert_with(|| json!({"instances": []}));
        scope["instances"]
            .as_array_mut()
            .expect("a list")
            .push(instance_json(&project, i));
    }
    // A zone with nothing says so, as Compute Engine does.
    items
        .entry("zones/us-central1-f".to_string())
        .or_insert_with(|| json!({"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope 'zones/us-central1-f' on this page."}}));
    let mut out = json!({"kind": "compute#instanceAggregatedList",
        "id": format!("projects/{project}/aggregated/instances"), "items": items});
    if from + page.len() < matching.len() {
        out["nextPageToken"] = json!((from + page.len()).to_string());
    }
    ok(out)
}

async fn delete(
    State(s): State<GceStandIn>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    let mut inner = s.lock();
    inner.requests.push(format!("delete {zone}/{name}"));
    let Some(i) = inner
        .instances
        .iter_mut()
        .find(|i| i.zone == zone && i.name == name)
    else {
        return error(
            404,
            "notFound",
            &format!(
                "The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            ),
        );
    };
    // Its boot disk (autoDelete) goes with it.
    i.status = "STOPPING".into();
    i.deleting.get_or_insert(2);
    let op = inner.new_operation(&zone, "delete", &name, Ok(()));
    let found = inner.operations.get(&op).expect("its operation").clone();
    ok(operation_json(&project, &op, &found))
}

async fn machine_type(
    State(s): State<GceStandIn>,
    Path((project, zone, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Some(r) = s.unauthorized(&headers) {
        return r;
    }
    s.lock().requests.push(format!("machineType {name}"));
    let Some((n, cpus, mb, accelerator, count)) = MACHINE_TYPES.iter().find(|t| t.0 == name) else {
        return error(
            404,
            "notFound",
            &format!(
                "The resource 'projects/{project}/zones/{zone}/machineTypes/{name}' was not found"
            ),
        );
    };
    let mut v = json!({"kind": "compute#machineType", "name": n, "guestCpus": cpus,
        "memoryMb": mb, "zone": zone, "isSharedCpu": false});
    if *count > 0 {
        v["accelerators"] =
            json!([{"guestAcceleratorType": accelerator, "guestAcceleratorCount": count}]);
    }
    ok(v)
}

async fn shutdown(
    State(s): State<GceStandIn>,
    Path((zone, name)): Path<(String, String)>,
) -> Response {
    let mut inner = s.lock();
    inner.requests.push(format!("shutdown {zone}/{name}"));
    match inner
        .instances
        .iter_mut()
        .find(|i| i.zone == zone && i.name == name)
    {
        Some(i) => {
            i.status = "TERMINATED".into();
            i.stopped_at = Some(Utc::now());
            StatusCode::NO_CONTENT.into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
