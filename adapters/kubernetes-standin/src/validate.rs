//! What the API server checks and fills in on create: strict decoding against the
//! k8s-openapi types, the validation rules the adapter is likely to trip over, and
//! the defaults clients read back.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::store::{int, text, Kind};

/// Decodes `body` as the typed object and encodes it again. Fields the type does
/// not have are lost on the way, which is how unknown fields are found. What is
/// stored is the body without those fields and without nulls (not the re-encoding,
/// which turns absent required fields into empty ones).
pub(crate) fn decode(kind: &Kind, body: &Value) -> Result<(Value, Option<String>), String> {
    use k8s_openapi::api::{apps::v1::Deployment, batch::v1::Job, core::v1};
    match kind.kind {
        "Job" => roundtrip::<Job>(body),
        "Deployment" => roundtrip::<Deployment>(body),
        "Pod" => roundtrip::<v1::Pod>(body),
        "Service" => roundtrip::<v1::Service>(body),
        "PersistentVolumeClaim" => roundtrip::<v1::PersistentVolumeClaim>(body),
        "Node" => roundtrip::<v1::Node>(body),
        _ => roundtrip::<v1::Namespace>(body),
    }
}

fn roundtrip<T: DeserializeOwned + Serialize>(
    body: &Value,
) -> Result<(Value, Option<String>), String> {
    let mut body = body.clone();
    quantities_as_strings(&mut body, "");
    let body = &body;
    let typed: T = serde_json::from_value(body.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let unknown = difference(body, &back, "");
    Ok((prune(body, &back), unknown))
}

/// The API server takes quantities written as JSON numbers (`"cpu": 2`) and
/// stores them as strings; k8s-openapi only reads strings.
fn quantities_as_strings(v: &mut Value, key: &str) {
    match v {
        Value::Number(n) if key == "sizeLimit" => *v = Value::String(n.to_string()),
        Value::Object(m)
            if matches!(
                key,
                "limits" | "requests" | "capacity" | "allocatable" | "hard"
            ) =>
        {
            for q in m.values_mut().filter(|q| q.is_number()) {
                *q = Value::String(q.to_string());
            }
        }
        Value::Object(m) => m.iter_mut().for_each(|(k, v)| quantities_as_strings(v, k)),
        Value::Array(a) => a.iter_mut().for_each(|v| quantities_as_strings(v, key)),
        _ => {}
    }
}

/// `sent`, keeping only what also came back.
fn prune(sent: &Value, back: &Value) -> Value {
    match (sent, back) {
        (Value::Object(s), Value::Object(b)) => Value::Object(
            s.iter()
                .filter(|(_, v)| !v.is_null())
                .filter_map(|(k, v)| Some((k.clone(), prune(v, b.get(k)?))))
                .collect(),
        ),
        (Value::Array(s), Value::Array(b)) => {
            Value::Array(s.iter().zip(b).map(|(s, b)| prune(s, b)).collect())
        }
        _ => sent.clone(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The first field of `sent` that did not survive the round trip. Null and absent
/// are the same; an empty object or list that vanished is not a difference.
fn difference(sent: &Value, back: &Value, path: &str) -> Option<String> {
    match (sent, back) {
        (Value::Null, _) => None,
        (Value::Object(s), Value::Object(b)) => s.iter().find_map(|(k, v)| match b.get(k) {
            Some(bv) => difference(v, bv, &join(path, k)),
            None if v.is_null() || v.as_object().is_some_and(|o| o.is_empty()) => None,
            None if v.as_array().is_some_and(|a| a.is_empty()) => None,
            None => Some(format!("unknown field \"{}\"", join(path, k))),
        }),
        (Value::Array(s), Value::Array(b)) => s
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (sv, bv))| difference(sv, bv, &format!("{path}[{i}]"))),
        (Value::Number(s), Value::Number(b)) if s.as_f64() == b.as_f64() => None,
        (Value::String(s), Value::String(b)) if s == b => None,
        // Times may come back formatted differently.
        (Value::String(s), Value::String(b))
            if crate::store::parse_time(s).is_some()
                && crate::store::parse_time(s) == crate::store::parse_time(b) =>
        {
            None
        }
        (s, b) if s == b => None,
        _ => Some(format!("unexpected value for field \"{path}\"")),
    }
}

/// A lowercase RFC 1123 subdomain: what most object names must be.
pub(crate) fn dns_subdomain(name: &str) -> bool {
    !name.is_empty() && name.len() <= 253 && name.split('.').all(dns_label_ok)
}

fn dns_label_ok(label: &str) -> bool {
    let b = label.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// One failed rule, as a `metav1.StatusCause`.
pub(crate) struct Cause {
    pub field: String,
    pub message: String,
}

fn cause(field: &str, message: String) -> Cause {
    Cause {
        field: field.to_string(),
        message: format!("{field}: {message}"),
    }
}

pub(crate) fn validate(kind: &Kind, obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let name = text(obj, "/metadata/name").unwrap_or("");
    if name.is_empty() {
        out.push(cause(
            "metadata.name",
            "Required value: name or generateName is required".into(),
        ));
    } else if kind.kind == "Service" {
        if !(dns_label_ok(name) && name.as_bytes()[0].is_ascii_lowercase()) {
            out.push(cause("metadata.name", format!("Invalid value: {name:?}: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character")));
        }
    } else if !dns_subdomain(name) {
        out.push(cause("metadata.name", format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")));
    }
    match kind.kind {
        "Job" => validate_job(obj, &mut out),
        "Deployment" => {
            pod_spec(
                obj.pointer("/spec/template/spec"),
                "spec.template.spec",
                &mut out,
            );
            let restart = text(obj, "/spec/template/spec/restartPolicy").unwrap_or("Always");
            if restart != "Always" {
                out.push(cause(
                    "spec.template.spec.restartPolicy",
                    format!("Unsupported value: {restart:?}: supported values: \"Always\""),
                ));
            }
            let selector = obj
                .pointer("/spec/selector/matchLabels")
                .and_then(Value::as_object);
            let labels = obj.pointer("/spec/template/metadata/labels");
            match selector {
                None if obj.pointer("/spec/selector/matchExpressions").is_none() => {
                    out.push(cause("spec.selector", "Required value".into()))
                }
                Some(sel)
                    if !sel
                        .iter()
                        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)) =>
                {
                    out.push(cause(
                        "spec.template.metadata.labels",
                        "Invalid value: `selector` does not match template `labels`".into(),
                    ))
                }
                _ => {}
            }
        }
        "Pod" => pod_spec(obj.get("spec"), "spec", &mut out),
        _ => {}
    }
    out
}

fn pod_spec(spec: Option<&Value>, at: &str, out: &mut Vec<Cause>) {
    let containers = spec
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array);
    if containers.is_none_or(|c| c.is_empty()) {
        out.push(cause(&format!("{at}.containers"), "Required value".into()));
    }
    for (i, c) in containers.into_iter().flatten().enumerate() {
        if text(c, "/name").is_none_or(|n| !dns_label_ok(n)) {
            out.push(cause(
                &format!("{at}.containers[{i}].name"),
                "Invalid value: must be a DNS-1123 label".into(),
            ));
        }
    }
}

fn validate_job(job: &Value, out: &mut Vec<Cause>) {
    pod_spec(
        job.pointer("/spec/template/spec"),
        "spec.template.spec",
        out,
    );
    // Jobs must say their restart policy; the pod default (Always) is not allowed.
    let restart = text(job, "/spec/template/spec/restartPolicy").unwrap_or("Always");
    if restart != "Never" && restart != "OnFailure" {
        out.push(cause(
            "spec.template.spec.restartPolicy",
            format!("Unsupported value: {restart:?}: supported values: \"OnFailure\", \"Never\""),
        ));
    }
    let indexed = text(job, "/spec/completionMode") == Some("Indexed");
    if indexed && int(job, "/spec/completions").is_none() {
        out.push(cause(
            "spec.completions",
            "Required value: when completion mode is Indexed".into(),
        ));
    }
    let per_index = int(job, "/spec/backoffLimitPerIndex");
    if let Some(limit) = per_index.filter(|_| !indexed) {
        out.push(cause(
            "spec.backoffLimitPerIndex",
            format!("Invalid value: {limit}: requires indexed completion mode"),
        ));
    }
    let Some(rules) = job
        .pointer("/spec/podFailurePolicy/rules")
        .and_then(Value::as_array)
    else {
        return;
    };
    if restart != "Never" {
        out.push(cause(
            "spec.template.spec.restartPolicy",
            format!("Invalid value: {restart:?}: only \"Never\" is supported when podFailurePolicy is specified"),
        ));
    }
    for (i, rule) in rules.iter().enumerate() {
        let action = text(rule, "/action").unwrap_or("");
        let field = format!("spec.podFailurePolicy.rules[{i}]");
        if !["FailJob", "FailIndex", "Ignore", "Count"].contains(&action) {
            out.push(cause(
                &format!("{field}.action"),
                format!("Unsupported value: {action:?}"),
            ));
        }
        if action == "FailIndex" && per_index.is_none() {
            out.push(cause(
                &format!("{field}.action"),
                "Invalid value: \"FailIndex\": requires the backoffLimitPerIndex to be set".into(),
            ));
        }
        let codes = rule.get("onExitCodes");
        let conditions = rule.get("onPodConditions").and_then(Value::as_array);
        if codes.is_some() == conditions.is_some_and(|c| !c.is_empty()) {
            out.push(cause(
                &field,
                "Invalid value: specifying one of OnExitCodes and OnPodConditions is required"
                    .into(),
            ));
        }
        if let Some(codes) = codes {
            let zero = codes
                .get("values")
                .and_then(Value::as_array)
                .is_some_and(|v| v.contains(&json!(0)));
            if text(codes, "/operator") == Some("In") && zero {
                out.push(cause(
                    &format!("{field}.onExitCodes.values"),
                    "Invalid value: 0: must not be 0 for the In operator".into(),
                ));
            }
        }
    }
}

fn set_default(obj: &mut Value, field: &str, value: Value) {
    if obj.get(field).is_none_or(Value::is_null) {
        obj[field] = value;
    }
}

fn default_pod_spec(spec: &mut Value) {
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "securityContext", json!({}));
    for c in spec
        .get_mut("containers")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let latest = text(c, "/image").is_none_or(|i| {
            i.ends_with(":latest") || !i.rsplit('/').next().unwrap_or(i).contains(':')
        });
        set_default(
            c,
            "imagePullPolicy",
            json!(if latest { "Always" } else { "IfNotPresent" }),
        );
        set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
        set_default(c, "terminationMessagePolicy", json!("File"));
        set_default(c, "resources", json!({}));
    }
}

/// The defaults the real API server fills in, and the server-owned parts of new
/// objects (`uid` is already set).
pub(crate) fn defaults(kind: &Kind, obj: &mut Value, cluster_ip: impl FnOnce() -> String) {
    let uid = text(obj, "/metadata/uid").unwrap_or_default().to_string();
    let name = text(obj, "/metadata/name").unwrap_or_default().to_string();
    match kind.kind {
        "Pod" => {
            default_pod_spec(&mut obj["spec"]);
            let qos = qos_class(&obj["spec"]);
            obj["status"] = json!({"phase": "Pending", "qosClass": qos});
        }
        "Job" => {
            let spec = &mut obj["spec"];
            let indexed = text(spec, "/completionMode") == Some("Indexed");
            if !indexed && spec.get("completions").is_none() && spec.get("parallelism").is_none() {
                spec["completions"] = json!(1);
            }
            set_default(spec, "parallelism", json!(1));
            let per_index = spec.get("backoffLimitPerIndex").is_some();
            set_default(
                spec,
                "backoffLimit",
                json!(if per_index { i32::MAX } else { 6 }),
            );
            set_default(spec, "completionMode", json!("NonIndexed"));
            set_default(spec, "suspend", json!(false));
            let replacement = if spec.get("podFailurePolicy").is_some() {
                "Failed"
            } else {
                "TerminatingOrFailed"
            };
            set_default(spec, "podReplacementPolicy", json!(replacement));
            let rules = spec
                .pointer_mut("/podFailurePolicy/rules")
                .and_then(Value::as_array_mut);
            for rule in rules.into_iter().flatten() {
                for c in rule
                    .get_mut("onPodConditions")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    set_default(c, "status", json!("True"));
                }
            }
            // The real server generates the selector and labels the template with it.
            if spec.get("manualSelector") != Some(&json!(true)) {
                spec["selector"] =
                    json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
                let labels = &mut spec["template"]["metadata"]["labels"];
                for (k, v) in [
                    ("batch.kubernetes.io/controller-uid", &uid),
                    ("controller-uid", &uid),
                    ("batch.kubernetes.io/job-name", &name),
                    ("job-name", &name),
                ] {
                    labels[k] = json!(v);
                }
            }
            default_pod_spec(&mut spec["template"]["spec"]);
            obj["status"] = json!({});
        }
        "Deployment" => {
            let spec = &mut obj["spec"];
            set_default(spec, "replicas", json!(1));
            set_default(
                spec,
                "strategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}),
            );
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(spec, "progressDeadlineSeconds", json!(600));
            default_pod_spec(&mut spec["template"]["spec"]);
            obj["status"] = json!({});
        }
        "Service" => {
            let ip = cluster_ip();
            let spec = &mut obj["spec"];
            set_default(spec, "type", json!("ClusterIP"));
            spec["clusterIP"] = json!(ip);
            spec["clusterIPs"] = json!([ip]);
            set_default(spec, "sessionAffinity", json!("None"));
            set_default(spec, "ipFamilies", json!(["IPv4"]));
            set_default(spec, "ipFamilyPolicy", json!("SingleStack"));
            set_default(spec, "internalTrafficPolicy", json!("Cluster"));
            for p in spec
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                set_default(p, "protocol", json!("TCP"));
                let port = p.get("port").cloned().unwrap_or(Value::Null);
                set_default(p, "targetPort", port);
            }
            obj["status"] = json!({"loadBalancer": {}});
        }
        "PersistentVolumeClaim" => {
            // Bound at once: the stand-in has no provisioner to wait for.
            let storage = obj
                .pointer("/spec/resources/requests/storage")
                .cloned()
                .unwrap_or(json!("0"));
            let modes = obj
                .pointer("/spec/accessModes")
                .cloned()
                .unwrap_or(json!([]));
            set_default(&mut obj["spec"], "volumeMode", json!("Filesystem"));
            obj["spec"]["volumeName"] = json!(format!("pvc-{uid}"));
            obj["status"] =
                json!({"phase": "Bound", "accessModes": modes, "capacity": {"storage": storage}});
        }
        _ => {}
    }
}

fn qos_class(spec: &Value) -> &'static str {
    let containers = spec
        .get("containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let res = |c: &Value, which: &str| {
        c.pointer(&format!("/resources/{which}"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    if containers
        .iter()
        .all(|c| res(c, "requests").is_empty() && res(c, "limits").is_empty())
    {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let (req, lim) = (res(c, "requests"), res(c, "limits"));
        ["cpu", "memory"]
            .iter()
            .all(|r| lim.contains_key(*r) && req.get(*r).is_none_or(|q| Some(q) == lim.get(*r)))
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::kind;

    #[test]
    fn strict_decoding_names_the_unknown_field() {
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "a"},
            "spec": {"template": {"spec": {"containers": [{"name": "main", "imagePullSecret": "x"}]}}}});
        let (_, unknown) = decode(kind("jobs").unwrap(), &job).unwrap();
        assert_eq!(
            unknown.as_deref(),
            Some("unknown field \"spec.template.spec.containers[0].imagePullSecret\"")
        );
        let ok = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "a", "labels": null},
            "spec": {"template": {"spec": {"containers": [{"name": "main", "args": []}]}}}});
        let (stored, unknown) = decode(kind("jobs").unwrap(), &ok).unwrap();
        assert_eq!(unknown, None);
        assert_eq!(stored["metadata"], json!({"name": "a"}));
    }

    #[test]
    fn names() {
        assert!(dns_subdomain("a-b.c1"));
        assert!(!dns_subdomain("A"));
        assert!(!dns_subdomain("-a"));
        assert!(!dns_subdomain("a_b"));
    }
}
