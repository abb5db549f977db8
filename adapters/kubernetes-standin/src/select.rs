//! Label and field selectors, resource quantities and JSON merge patch: the small
//! languages of the Kubernetes API.

use serde_json::{Map, Value};

use crate::store::text;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Splits on commas that are not inside parentheses (`k in (a,b),x=y`).
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

pub(crate) fn parse_labels(s: &str) -> Result<Vec<LabelReq>, String> {
    let mut reqs = Vec::new();
    for term in split_top(s) {
        let bad = || format!("unable to parse requirement: invalid label selector term {term:?}");
        let req = if let Some(k) = term.strip_prefix('!') {
            LabelReq::NotExists(k.trim().to_string())
        } else if let Some(open) = term.find('(') {
            let close = term.rfind(')').filter(|c| *c > open).ok_or_else(bad)?;
            let values: Vec<String> = term[open + 1..close]
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            let head: Vec<&str> = term[..open].split_whitespace().collect();
            match head.as_slice() {
                [k, "in"] => LabelReq::In(k.to_string(), values),
                [k, "notin"] => LabelReq::NotIn(k.to_string(), values),
                _ => return Err(bad()),
            }
        } else if let Some((k, v)) = term.split_once("!=") {
            LabelReq::NotEq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
        } else if term.contains(char::is_whitespace) {
            return Err(bad());
        } else {
            LabelReq::Exists(term.to_string())
        };
        reqs.push(req);
    }
    Ok(reqs)
}

pub(crate) fn labels_match(reqs: &[LabelReq], obj: &Value) -> bool {
    let label = |k: &str| {
        obj.pointer("/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
    };
    reqs.iter().all(|r| match r {
        LabelReq::Eq(k, v) => label(k) == Some(v),
        LabelReq::NotEq(k, v) => label(k) != Some(v),
        LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
        LabelReq::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
        LabelReq::Exists(k) => label(k).is_some(),
        LabelReq::NotExists(k) => label(k).is_none(),
    })
}

/// `field=value` or `field!=value`, the field as a JSON pointer.
#[derive(Debug, Clone)]
pub(crate) struct FieldReq {
    pointer: &'static str,
    value: String,
    negate: bool,
}

pub(crate) fn parse_fields(s: &str, resource: &str) -> Result<Vec<FieldReq>, String> {
    let mut reqs = Vec::new();
    for term in split_top(s) {
        let (field, value, negate) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            (f, v, false)
        } else {
            return Err(format!(
                "invalid selector: '{term}'; can't understand '{term}'"
            ));
        };
        let pointer = match (field.trim(), resource) {
            ("metadata.name", _) => "/metadata/name",
            ("metadata.namespace", _) => "/metadata/namespace",
            ("status.phase", "pods" | "namespaces" | "persistentvolumeclaims") => "/status/phase",
            ("spec.nodeName", "pods") => "/spec/nodeName",
            ("spec.restartPolicy", "pods") => "/spec/restartPolicy",
            ("status.podIP", "pods") => "/status/podIP",
            ("spec.unschedulable", "nodes") => "/spec/unschedulable",
            (other, _) => return Err(format!("field label not supported: {other}")),
        };
        reqs.push(FieldReq {
            pointer,
            value: value.trim().to_string(),
            negate,
        });
    }
    Ok(reqs)
}

pub(crate) fn fields_match(reqs: &[FieldReq], obj: &Value) -> bool {
    reqs.iter().all(|r| {
        let actual = match obj.pointer(r.pointer) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            _ => String::new(),
        };
        (actual == r.value) != r.negate
    })
}

/// A Kubernetes quantity ("500m", "1Gi", "129e6", "1G") as a number of units
/// (cores, bytes, devices).
pub(crate) fn quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(n) = s.parse::<f64>() {
        return Some(n);
    }
    const BINARY: [(&str, f64); 6] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
    ];
    for (suffix, factor) in BINARY {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    let (n, last) = s.split_at(s.len().checked_sub(1)?);
    let factor = match last {
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        _ => return None,
    };
    n.parse::<f64>().ok().map(|n| n * factor)
}

pub(crate) fn quantity_of(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => quantity(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// RFC 7386: objects merge key by key, null removes, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in patch {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Node selector requirement (`In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`)
/// against a node's labels (or, for matchFields, its name).
pub(crate) fn node_requirement(req: &Value, value: Option<&str>) -> bool {
    let values: Vec<&str> = req
        .get("values")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let number = |s: Option<&str>| s.and_then(|s| s.parse::<i64>().ok());
    match text(req, "/operator").unwrap_or("") {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => !value.is_some_and(|v| values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((number(value), number(values.first().copied())), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((number(value), number(values.first().copied())), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// "0-3,5": sorted indexes as Kubernetes writes completedIndexes and failedIndexes.
pub(crate) fn intervals(indexes: impl IntoIterator<Item = i64>) -> String {
    let mut v: Vec<i64> = indexes.into_iter().collect();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        while i + 1 < v.len() && v[i + 1] == v[i] + 1 {
            i += 1;
        }
        parts.push(if v[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", v[i])
        });
        i += 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let pod = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let m = |s: &str| labels_match(&parse_labels(s).unwrap(), &pod);
        assert!(m("app=web"));
        assert!(m("app==web,tier"));
        assert!(m("app in (web, db),!missing"));
        assert!(!m("app notin (web)"));
        assert!(m("app!=db,missing!=x"));
        assert!(!m("missing"));
        assert!(m(""));
        assert!(parse_labels("app in web").is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("64Mi"), Some(67108864.0));
        assert_eq!(quantity("1G"), Some(1e9));
        assert_eq!(quantity("129e6"), Some(129e6));
        assert_eq!(quantity("128974848"), Some(128974848.0));
        assert_eq!(quantity("1Gi"), Some(1073741824.0));
        assert_eq!(quantity("x"), None);
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn interval_strings() {
        assert_eq!(intervals([5, 0, 1, 2, 3]), "0-3,5");
        assert_eq!(intervals([]), "");
        assert_eq!(intervals([1, 3]), "1,3");
    }
}
