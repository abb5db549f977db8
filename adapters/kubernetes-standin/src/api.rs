//! The HTTP surface: Kubernetes paths, verbs, errors as `metav1.Status`, lists,
//! watches, patches, logs and evictions.

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State as AxState};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::controllers;
use crate::kubelet::{self, is_terminal};
use crate::select::{
    fields_match, labels_match, merge_patch, parse_fields, parse_labels, FieldReq, LabelReq,
};
use crate::store::{self, text, Event, Key, Kind};
use crate::validate;
use crate::Shared;

const USER: &str = "system:serviceaccount:meridian:meridian";
const JOB_DELETE_WARNING: &str = "299 - \"child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress this warning\"";

pub(crate) fn router(sh: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(sh)
}

/// An error answer, sent as a `metav1.Status`.
pub(crate) struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Value,
}

fn err(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        code,
        reason,
        message: message.into(),
        details: Value::Null,
    }
}

fn status_json(code: u16, reason: &str, message: &str, details: &Value) -> Value {
    let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    if !details.is_null() {
        s["details"] = details.clone();
    }
    s
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = status_json(self.code, self.reason, &self.message, &self.details);
        reply(self.code, &body)
    }
}

fn reply(code: u16, body: &Value) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn with_warning(mut r: Response, warning: Option<String>) -> Response {
    if let Some(v) = warning.and_then(|w| HeaderValue::from_str(&w).ok()) {
        r.headers_mut().insert("warning", v);
    }
    r
}

type Reply = Result<Response, ApiError>;

fn details(kind: &Kind, name: &str) -> Value {
    json!({"name": name, "group": kind.group, "kind": kind.resource})
}

fn not_found(kind: &Kind, name: &str) -> ApiError {
    ApiError {
        details: details(kind, name),
        ..err(
            404,
            "NotFound",
            format!("{} {name:?} not found", kind.qualified()),
        )
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    err(400, "BadRequest", message)
}

/// The parsed path of a request.
struct Target {
    kind: &'static Kind,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", g, "v1", rest @ ..] => (*g, rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (resource, name, sub) = match rest {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(n.to_string()), None),
        [r, n, s] => (*r, Some(n.to_string()), Some(s.to_string())),
        _ => return None,
    };
    let kind = store::kind(resource).filter(|k| k.group == group)?;
    // Namespaced kinds may be listed across namespaces; cluster kinds have none.
    let fits = match (kind.namespaced, &ns) {
        (true, Some(_)) | (false, None) => true,
        (true, None) => name.is_none(),
        (false, Some(_)) => false,
    };
    fits.then_some(Target {
        kind,
        ns,
        name,
        sub,
    })
}

async fn handle(
    AxState(sh): AxState<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
    method: Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    sh.requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let result = dispatch(&sh, &q, &method, uri.path(), &headers, &body).await;
    let response = result.unwrap_or_else(IntoResponse::into_response);
    tracing::debug!(%method, %uri, status = response.status().as_u16(), "request");
    response
}

async fn dispatch(
    sh: &Arc<Shared>,
    q: &HashMap<String, String>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Reply {
    match path.trim_end_matches('/') {
        "/version" => {
            return Ok(reply(
                200,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-standin",
                "gitCommit": "standin", "gitTreeState": "clean", "buildDate": "2025-04-23T00:00:00Z",
                "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}),
            ))
        }
        "/healthz" | "/readyz" | "/livez" => return Ok("ok".into_response()),
        _ => {}
    }
    if sh.lock().stopped {
        return Err(err(503, "ServiceUnavailable", "the stand-in has stopped"));
    }
    let expected = format!("Bearer {}", sh.opts.token);
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(expected.as_str())
    {
        return Err(err(401, "Unauthorized", "Unauthorized"));
    }
    let Some(t) = parse_path(path) else {
        return Err(err(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    };
    let watching = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (method.as_str(), &t.name, t.sub.as_deref()) {
        ("GET", None, _) if watching => "watch",
        ("GET", None, _) => "list",
        ("POST", None, _) | ("POST", Some(_), Some("eviction")) => "create",
        ("DELETE", None, _) => "deletecollection",
        ("GET", Some(_), _) => "get",
        ("DELETE", Some(_), None) => "delete",
        ("PATCH", Some(_), None | Some("status")) => "patch",
        ("PUT", Some(_), None | Some("status")) => "update",
        _ => {
            return Err(err(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ))
        }
    };
    // RBAC, reduced to "these namespaces are off limits".
    let ns_for_rbac = if t.kind.resource == "namespaces" {
        t.name.clone()
    } else {
        t.ns.clone()
    };
    if let Some(ns) = ns_for_rbac.filter(|n| sh.opts.forbidden_namespaces.contains(n)) {
        let resource = match &t.sub {
            Some(s) if s != "status" || verb != "get" => format!("{}/{s}", t.kind.resource),
            _ => t.kind.resource.to_string(),
        };
        let who = match &t.name {
            Some(n) => format!("{} {n:?}", t.kind.qualified()),
            None => t.kind.qualified(),
        };
        let message = format!(
            "{who} is forbidden: User {USER:?} cannot {verb} resource {resource:?} in API group {:?} in the namespace {ns:?}",
            t.kind.group
        );
        let name = t.name.clone().unwrap_or_default();
        return Err(ApiError {
            details: details(t.kind, &name),
            ..err(403, "Forbidden", message)
        });
    }
    let ns = t.ns.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let k: Key = (t.kind.resource, ns.clone(), name.clone());
    match (verb, t.sub.as_deref()) {
        ("watch", _) => watch(sh, t.kind, t.ns.as_deref(), q),
        ("list", _) => list(sh, t.kind, t.ns.as_deref(), q),
        ("create", Some("eviction")) => evict(sh, &k),
        ("create", _) => create(sh, t.kind, &ns, q, body),
        ("deletecollection", _) => delete_collection(sh, t.kind, t.ns.as_deref(), q, body),
        ("get", Some("log")) if t.kind.resource == "pods" => logs(sh, &k, q),
        ("get", None | Some("status")) => {
            let st = sh.lock();
            st.get(&k)
                .map(|o| reply(200, o))
                .ok_or_else(|| not_found(t.kind, &name))
        }
        ("delete", _) => delete(sh, t.kind, &k, q, body),
        ("patch", sub) => patch(sh, t.kind, &k, q, headers, body, sub == Some("status")),
        ("update", sub) => update(sh, t.kind, &k, q, body, sub == Some("status")),
        _ => Err(err(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

fn selectors(
    kind: &Kind,
    q: &HashMap<String, String>,
) -> Result<(Vec<LabelReq>, Vec<FieldReq>), ApiError> {
    let labels = parse_labels(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(bad_request)?;
    let fields = parse_fields(
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
        kind.resource,
    )
    .map_err(bad_request)?;
    Ok((labels, fields))
}

fn list_json(kind: &Kind, rv: u64, items: Vec<Value>) -> Value {
    json!({"apiVersion": kind.api_version, "kind": format!("{}List", kind.kind),
        "metadata": {"resourceVersion": rv.to_string()}, "items": items})
}

/// Lists ignore `limit` (everything comes in one page, with no continue token) and
/// the resourceVersion parameters (always the latest state).
fn list(
    sh: &Arc<Shared>,
    kind: &'static Kind,
    ns: Option<&str>,
    q: &HashMap<String, String>,
) -> Reply {
    let (labels, fields) = selectors(kind, q)?;
    let st = sh.lock();
    let items = st
        .list(kind.resource)
        .filter(|((ons, _), o)| {
            ns.is_none_or(|n| n == ons) && labels_match(&labels, o) && fields_match(&fields, o)
        })
        .map(|(_, o)| o.clone())
        .collect();
    Ok(reply(200, &list_json(kind, st.rv, items)))
}

fn create(
    sh: &Arc<Shared>,
    kind: &'static Kind,
    ns: &str,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Reply {
    if !kind.namespaced {
        return Err(err(
            405,
            "MethodNotAllowed",
            format!("the stand-in does not create {}", kind.resource),
        ));
    }
    let sent: Value = serde_json::from_slice(body).map_err(|e| {
        bad_request(format!(
            "{} in version \"v1\" cannot be handled as a {}: {e}",
            kind.kind, kind.kind
        ))
    })?;
    let (mut obj, warning) = decode(kind, &sent, q)?;
    if let Some(other) = text(&obj, "/metadata/namespace").filter(|n| *n != ns) {
        return Err(bad_request(format!(
            "the namespace of the provided object ({other}) does not match the namespace sent on the request ({ns})"
        )));
    }
    let mut st = sh.lock();
    if text(&obj, "/metadata/name").unwrap_or("").is_empty() {
        if let Some(prefix) = text(&obj, "/metadata/generateName").map(str::to_string) {
            obj["metadata"]["name"] = json!(format!("{prefix}{}", st.random_suffix(5)));
        }
    }
    invalid(kind, &obj)?;
    if st
        .get(&("namespaces", String::new(), ns.to_string()))
        .is_none()
    {
        return Err(not_found(
            store::kind("namespaces").expect("namespaces"),
            ns,
        ));
    }
    let name = text(&obj, "/metadata/name").unwrap_or_default().to_string();
    if st
        .get(&(kind.resource, ns.to_string(), name.clone()))
        .is_some()
    {
        let message = format!("{} {name:?} already exists", kind.qualified());
        return Err(ApiError {
            details: details(kind, &name),
            ..err(409, "AlreadyExists", message)
        });
    }
    if let Some(meta) = obj["metadata"].as_object_mut() {
        for server_owned in [
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
            "managedFields",
        ] {
            meta.remove(server_owned);
        }
        meta.insert("uid".into(), json!(uuid::Uuid::now_v7().to_string()));
    }
    validate::defaults(kind, &mut obj, || st.cluster_ip());
    let stored = st.insert(kind, ns, obj);
    *st.created.entry(kind.resource.to_string()).or_default() += 1;
    Ok(with_warning(reply(201, &stored), warning))
}

/// Strict decoding: unknown fields are rejected unless the request asked for
/// `fieldValidation=Ignore` or `Warn` (the stand-in's default is Strict, the
/// real server's Warn).
fn decode(
    kind: &Kind,
    sent: &Value,
    q: &HashMap<String, String>,
) -> Result<(Value, Option<String>), ApiError> {
    let cannot = |e: String| {
        format!(
            "{} in version {:?} cannot be handled as a {}: {e}",
            kind.kind, "v1", kind.kind
        )
    };
    let (obj, unknown) = validate::decode(kind, sent).map_err(|e| bad_request(cannot(e)))?;
    match (unknown, q.get("fieldValidation").map(String::as_str)) {
        (Some(u), Some("Warn")) => Ok((obj, Some(format!("299 - {u:?}")))),
        (Some(_), Some("Ignore")) | (None, _) => Ok((obj, None)),
        (Some(u), _) => Err(bad_request(cannot(format!("strict decoding error: {u}")))),
    }
}

fn invalid(kind: &Kind, obj: &Value) -> Result<(), ApiError> {
    let causes = validate::validate(kind, obj);
    if causes.is_empty() {
        return Ok(());
    }
    let name = text(obj, "/metadata/name").unwrap_or("");
    let list: Vec<&str> = causes.iter().map(|c| c.message.as_str()).collect();
    let message = format!(
        "{} {name:?} is invalid: {}",
        kind.qualified_kind(),
        list.join(", ")
    );
    let causes: Vec<Value> = causes
        .iter()
        .map(|c| json!({"reason": "FieldValueInvalid", "message": c.message, "field": c.field}))
        .collect();
    let details = json!({"name": name, "group": kind.group, "kind": kind.kind, "causes": causes});
    Err(ApiError {
        details,
        ..err(422, "Invalid", message)
    })
}

fn propagation(kind: &Kind, q: &HashMap<String, String>, body: &[u8]) -> (String, Option<String>) {
    let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let asked = q
        .get("propagationPolicy")
        .cloned()
        .or_else(|| text(&opts, "/propagationPolicy").map(str::to_string))
        .or_else(|| {
            (opts.get("orphanDependents") == Some(&json!(true))).then(|| "Orphan".to_string())
        });
    match asked {
        Some(p) => (p, None),
        // batch/v1 Jobs keep their pods unless told otherwise, and the server says so.
        None if kind.resource == "jobs" => ("Orphan".into(), Some(JOB_DELETE_WARNING.to_string())),
        None => ("Background".into(), None),
    }
}

fn delete(
    sh: &Arc<Shared>,
    kind: &'static Kind,
    k: &Key,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Reply {
    let (policy, warning) = propagation(kind, q, body);
    let mut st = sh.lock();
    let obj = controllers::delete(&mut st, k, &policy).ok_or_else(|| not_found(kind, &k.2))?;
    Ok(with_warning(reply(200, &obj), warning))
}

fn delete_collection(
    sh: &Arc<Shared>,
    kind: &'static Kind,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    body: &[u8],
) -> Reply {
    let (labels, fields) = selectors(kind, q)?;
    let (policy, warning) = propagation(kind, q, body);
    let mut st = sh.lock();
    let keys: Vec<Key> = st
        .list(kind.resource)
        .filter(|((ons, _), o)| {
            ns.is_none_or(|n| n == ons) && labels_match(&labels, o) && fields_match(&fields, o)
        })
        .map(|((ons, n), _)| (kind.resource, ons.clone(), n.clone()))
        .collect();
    let items = keys
        .iter()
        .filter_map(|k| controllers::delete(&mut st, k, &policy))
        .collect();
    Ok(with_warning(
        reply(200, &list_json(kind, st.rv, items)),
        warning,
    ))
}

/// Keeps what the client may not change, and the half of the object (spec or
/// status) that the endpoint does not write.
fn keep_server_fields(new: &mut Value, old: &Value, status: bool) {
    for f in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "resourceVersion",
        "generation",
    ] {
        match old["metadata"].get(f) {
            Some(v) => new["metadata"][f] = v.clone(),
            None => {
                new["metadata"].as_object_mut().map(|m| m.remove(f));
            }
        }
    }
    new["apiVersion"] = old["apiVersion"].clone();
    new["kind"] = old["kind"].clone();
    let keep = if status { "spec" } else { "status" };
    match old.get(keep) {
        Some(v) => new[keep] = v.clone(),
        None => {
            new.as_object_mut().map(|m| m.remove(keep));
        }
    }
}

fn conflict(kind: &Kind, name: &str) -> ApiError {
    let message = format!(
        "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
        kind.qualified()
    );
    ApiError {
        details: details(kind, name),
        ..err(409, "Conflict", message)
    }
}

fn check_version(kind: &Kind, k: &Key, sent: &Value, current: &Value) -> Result<(), ApiError> {
    match text(sent, "/metadata/resourceVersion").filter(|v| !v.is_empty()) {
        Some(v) if Some(v) != text(current, "/metadata/resourceVersion") => {
            Err(conflict(kind, &k.2))
        }
        _ => Ok(()),
    }
}

/// Merge patch (RFC 7386). Strategic merge patches are treated the same (lists are
/// replaced, not merged by key), and so are apply patches written as JSON, which
/// also create a missing object.
#[allow(clippy::too_many_arguments)]
fn patch(
    sh: &Arc<Shared>,
    kind: &'static Kind,
    k: &Key,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    status: bool,
) -> Reply {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ctype = ctype.split(';').next().unwrap_or("").trim();
    let apply = ctype == "application/apply-patch+yaml";
    if !apply
        && ctype != "application/merge-patch+json"
        && ctype != "application/strategic-merge-patch+json"
    {
        return Err(err(
            415,
            "UnsupportedMediaType",
            format!("the stand-in does not take {ctype:?} patches"),
        ));
    }
    let p: Value = serde_json::from_slice(body)
        .map_err(|e| bad_request(format!("invalid JSON patch body: {e}")))?;
    let current = sh.lock().get(k).cloned();
    let Some(current) = current else {
        if apply {
            return create(sh, kind, &k.1, q, body);
        }
        return Err(not_found(kind, &k.2));
    };
    check_version(kind, k, &p, &current)?;
    let mut new = current.clone();
    merge_patch(&mut new, &p);
    keep_server_fields(&mut new, &current, status);
    store_update(sh, kind, k, q, &new)
}

fn update(
    sh: &Arc<Shared>,
    kind: &'static Kind,
    k: &Key,
    q: &HashMap<String, String>,
    body: &[u8],
    status: bool,
) -> Reply {
    let mut new: Value =
        serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid body: {e}")))?;
    let current = sh
        .lock()
        .get(k)
        .cloned()
        .ok_or_else(|| not_found(kind, &k.2))?;
    check_version(kind, k, &new, &current)?;
    keep_server_fields(&mut new, &current, status);
    store_update(sh, kind, k, q, &new)
}

fn store_update(
    sh: &Arc<Shared>,
    kind: &'static Kind,
    k: &Key,
    q: &HashMap<String, String>,
    new: &Value,
) -> Reply {
    let (new, warning) = decode(kind, new, q)?;
    invalid(kind, &new)?;
    let mut st = sh.lock();
    let obj = st
        .modify(k, |o| *o = new)
        .ok_or_else(|| not_found(kind, &k.2))?;
    Ok(with_warning(reply(200, &obj), warning))
}

/// policy/v1 Eviction, without PodDisruptionBudgets. The pod is kept, Failed, with
/// the DisruptionTarget condition a real eviction sets before it deletes the pod.
fn evict(sh: &Arc<Shared>, k: &Key) -> Reply {
    let mut st = sh.lock();
    let pod = st
        .get(k)
        .ok_or_else(|| not_found(store::kind("pods").expect("pods"), &k.2))?;
    if !is_terminal(pod) {
        let condition = (
            "DisruptionTarget",
            "EvictionByEvictionAPI",
            "Eviction API: evicting",
        );
        kubelet::fail_pod(&mut st, k, None, Some(condition));
    }
    Ok(reply(
        201,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

fn logs(sh: &Arc<Shared>, k: &Key, q: &HashMap<String, String>) -> Reply {
    let pods = store::kind("pods").expect("pods");
    let (uid, state) = {
        let st = sh.lock();
        let pod = st.get(k).ok_or_else(|| not_found(pods, &k.2))?;
        let first = text(pod, "/spec/containers/0/name").unwrap_or("");
        if let Some(c) = q.get("container").filter(|c| *c != first) {
            let known = pod
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|x| text(x, "/name") == Some(c));
            let why = if known {
                "the stand-in runs only the first container"
            } else {
                "is not valid for pod"
            };
            return Err(bad_request(format!("container {c} {why} {}", k.2)));
        }
        let waiting = text(pod, "/status/containerStatuses/0/state/waiting/reason")
            .unwrap_or("ContainerCreating");
        (
            text(pod, "/metadata/uid").unwrap_or_default().to_string(),
            waiting.to_string(),
        )
    };
    let file = match q.get("stream").map(String::as_str) {
        None | Some("All") => "combined",
        Some("Stdout") => "stdout",
        Some("Stderr") => "stderr",
        Some(other) => return Err(bad_request(format!("stream: Unsupported value: {other:?}"))),
    };
    let path = sh.opts.work_dir.join(&uid).join(file);
    let Ok(mut data) = std::fs::read(&path) else {
        let c = q.get("container").cloned().unwrap_or_default();
        return Err(bad_request(format!(
            "container {c:?} in pod {:?} is waiting to start: {state}",
            k.2
        )));
    };
    if let Some(n) = q.get("tailLines").and_then(|n| n.parse::<usize>().ok()) {
        let lines: Vec<&[u8]> = data.split_inclusive(|b| *b == b'\n').collect();
        data = lines[lines.len().saturating_sub(n)..].concat();
    }
    if let Some(n) = q.get("limitBytes").and_then(|n| n.parse::<usize>().ok()) {
        data.truncate(n);
    }
    let text_plain = [(header::CONTENT_TYPE, "text/plain")];
    if !matches!(q.get("follow").map(String::as_str), Some("true" | "1")) {
        return Ok((StatusCode::OK, text_plain, data).into_response());
    }
    // Follow: send what grows until the container's process is gone.
    let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let start = futures::stream::once(async move { Ok::<Bytes, Infallible>(Bytes::from(data)) });
    let sh = sh.clone();
    let more = futures::stream::unfold((offset, false), move |(offset, done)| {
        let (sh, path, uid) = (sh.clone(), path.clone(), uid.clone());
        async move {
            let mut done = done;
            loop {
                if done {
                    return None;
                }
                let running = sh.lock().procs.contains_key(&uid);
                let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                if len > offset {
                    let bytes = std::fs::read(&path).unwrap_or_default();
                    let chunk = bytes.get(offset as usize..).unwrap_or_default().to_vec();
                    return Some((Ok(Bytes::from(chunk)), (bytes.len() as u64, !running)));
                }
                done = !running;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    use futures::StreamExt;
    Ok((
        StatusCode::OK,
        text_plain,
        Body::from_stream(start.chain(more)),
    )
        .into_response())
}

/// One watch connection's state.
struct Watch {
    rx: tokio::sync::broadcast::Receiver<Arc<Event>>,
    queue: VecDeque<Bytes>,
    kind: &'static Kind,
    ns: Option<String>,
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
    /// Objects this watcher was told about and that still match: one that stops
    /// matching is sent as DELETED.
    matched: HashSet<(String, String)>,
    last_rv: u64,
    deadline: Instant,
    bookmarks: bool,
    last_sent: Instant,
    done: bool,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

impl Watch {
    fn matches(&self, ns: &str, obj: &Value) -> bool {
        self.ns.as_deref().is_none_or(|n| n == ns)
            && labels_match(&self.labels, obj)
            && fields_match(&self.fields, obj)
    }

    fn translate(&mut self, ev: &Event) -> Option<Bytes> {
        if ev.resource != self.kind.resource
            || self.ns.as_deref().is_some_and(|n| n != ev.namespace)
        {
            return None;
        }
        let id = (ev.namespace.clone(), ev.name.clone());
        let matches = self.matches(&ev.namespace, &ev.object);
        let kind = match ev.kind {
            "DELETED" => (self.matched.remove(&id) || matches).then_some("DELETED"),
            _ if matches => Some(if self.matched.insert(id) {
                "ADDED"
            } else {
                ev.kind
            }),
            _ => self.matched.remove(&id).then_some("DELETED"),
        }?;
        Some(line(kind, &ev.object))
    }

    fn bookmark(&self, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": self.last_rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            "BOOKMARK",
            &json!({"apiVersion": self.kind.api_version, "kind": self.kind.kind, "metadata": meta}),
        )
    }

    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, Watch)> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                self.last_sent = Instant::now();
                return Some((Ok(b), self));
            }
            if self.done || Instant::now() >= self.deadline {
                return None;
            }
            let wake = if self.bookmarks {
                (self.last_sent + Duration::from_secs(1)).min(self.deadline)
            } else {
                self.deadline
            };
            match tokio::time::timeout_at(wake, self.rx.recv()).await {
                Ok(Ok(ev)) if ev.rv > self.last_rv => {
                    self.last_rv = ev.rv;
                    if let Some(b) = self.translate(&ev) {
                        self.queue.push_back(b);
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(RecvError::Lagged(_))) => {
                    // Too slow a reader: like a compacted history, the client must list again.
                    let status = status_json(
                        410,
                        "Expired",
                        "the watch fell too far behind; list again",
                        &Value::Null,
                    );
                    self.queue.push_back(line("ERROR", &status));
                    self.done = true;
                }
                Ok(Err(RecvError::Closed)) => return None,
                Err(_) if self.bookmarks && Instant::now() < self.deadline => {
                    let b = self.bookmark(false);
                    self.queue.push_back(b);
                }
                Err(_) => {}
            }
        }
    }
}

fn watch(
    sh: &Arc<Shared>,
    kind: &'static Kind,
    ns: Option<&str>,
    q: &HashMap<String, String>,
) -> Reply {
    let (labels, fields) = selectors(kind, q)?;
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(290);
    let from = q
        .get("resourceVersion")
        .and_then(|r| r.parse::<u64>().ok())
        .filter(|r| *r > 0);
    let initial_events = q.get("sendInitialEvents").map(String::as_str) == Some("true");
    let st = sh.lock();
    // Subscribing under the lock, before replaying, misses nothing: changes are
    // sent under the same lock, and resource versions dedupe the overlap.
    let rx = st
        .subscribe()
        .ok_or_else(|| err(503, "ServiceUnavailable", "the stand-in has stopped"))?;
    let now = Instant::now();
    let mut w = Watch {
        rx,
        queue: VecDeque::new(),
        kind,
        ns: ns.map(str::to_string),
        labels,
        fields,
        matched: HashSet::new(),
        last_rv: st.rv,
        deadline: now + Duration::from_secs(timeout),
        bookmarks: q.get("allowWatchBookmarks").map(String::as_str) == Some("true"),
        last_sent: now,
        done: false,
    };
    let current: Vec<(&(String, String), &Value)> = st
        .list(kind.resource)
        .filter(|((ons, _), o)| w.matches(ons, o))
        .collect();
    match from {
        Some(r) if r < st.compacted => {
            let message = format!("too old resource version: {r} ({})", st.compacted);
            w.queue.push_back(line(
                "ERROR",
                &status_json(410, "Expired", &message, &Value::Null),
            ));
            w.done = true;
        }
        Some(r) if !initial_events => {
            w.matched = current.iter().map(|(id, _)| (*id).clone()).collect();
            let replay: Vec<Arc<Event>> = st.history_after(r).cloned().collect();
            for ev in replay {
                if let Some(b) = w.translate(&ev) {
                    w.queue.push_back(b);
                }
            }
            w.last_rv = st.rv.max(r);
        }
        _ => {
            for (id, o) in current {
                w.matched.insert(id.clone());
                w.queue.push_back(line("ADDED", o));
            }
            if initial_events {
                let b = w.bookmark(true);
                w.queue.push_back(b);
            }
        }
    }
    drop(st);
    let body = Body::from_stream(futures::stream::unfold(w, Watch::next));
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
