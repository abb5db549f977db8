//! The deployment manifests in `infra/kubernetes/` as Kubernetes would take them: every
//! document decoded into k8s-openapi's types with nothing dropped (a misspelt or
//! misplaced field would be, silently, by the API server too), and what Meridian needs of
//! them: probes on each service's /healthz and /readyz, resource requests, a Service that
//! selects the intake, a NetworkPolicy that lets the API and metrics in, and the
//! adapter running as the account its Role binds.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn documents(file: &str) -> Vec<Value> {
    let path = format!(
        "{}/../../infra/kubernetes/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// `sub` is contained in `all`: every key and value of the manifest survived decoding.
fn contained(sub: &Value, all: &Value, at: &str) -> Result<(), String> {
    match (sub, all) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let there = b.get(k).ok_or_else(|| {
                    format!("{at}.{k}: dropped when decoded (misspelt or misplaced?)")
                })?;
                contained(v, there, &format!("{at}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .try_for_each(|(i, (x, y))| contained(x, y, &format!("{at}[{i}]"))),
        // Quantities and ports may be written as numbers or strings.
        (Value::Number(n), Value::String(s)) | (Value::String(s), Value::Number(n))
            if n.to_string() == *s =>
        {
            Ok(())
        }
        (a, b) if a == b => Ok(()),
        (a, b) => Err(format!("{at}: {a} became {b}")),
    }
}

/// A Deployment's pod template's spec.
fn pod(d: &Deployment) -> &k8s_openapi::api::core::v1::PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod template")
}

fn decode<T: DeserializeOwned + Serialize>(doc: &Value, at: &str) -> T {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{at}: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    contained(doc, &back, at).unwrap_or_else(|e| panic!("{e}"));
    typed
}

#[derive(Default)]
struct Decoded {
    deployments: Vec<Deployment>,
    services: Vec<Service>,
    policies: Vec<NetworkPolicy>,
    accounts: Vec<ServiceAccount>,
    bindings: Vec<RoleBinding>,
    config_maps: Vec<ConfigMap>,
}

fn all() -> Decoded {
    let mut out = Decoded::default();
    for file in ["rbac.yaml", "meridian.yaml"] {
        for (i, doc) in documents(file).iter().enumerate() {
            let kind = doc["kind"].as_str().unwrap_or("").to_string();
            let at = format!("{file} #{i} ({kind})");
            match kind.as_str() {
                "Namespace" => drop(decode::<Namespace>(doc, &at)),
                "ServiceAccount" => out.accounts.push(decode(doc, &at)),
                "Role" => drop(decode::<Role>(doc, &at)),
                "RoleBinding" => out.bindings.push(decode(doc, &at)),
                "ClusterRole" => drop(decode::<ClusterRole>(doc, &at)),
                "ClusterRoleBinding" => drop(decode::<ClusterRoleBinding>(doc, &at)),
                "ConfigMap" => out.config_maps.push(decode(doc, &at)),
                "Deployment" => out.deployments.push(decode(doc, &at)),
                "Service" => out.services.push(decode(doc, &at)),
                "NetworkPolicy" => out.policies.push(decode(doc, &at)),
                other => panic!("{at}: no check for kind {other:?}"),
            }
        }
    }
    out
}

#[test]
fn every_document_decodes_into_its_kubernetes_type_with_nothing_dropped() {
    let d = all();
    assert_eq!(
        d.deployments.len(),
        4,
        "intake, router, accounting, adapter"
    );
    assert_eq!(d.services.len(), 1);
    assert_eq!(d.policies.len(), 1);
}

#[test]
fn a_manifest_with_a_misplaced_field_is_caught() {
    let doc: Value = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [
            {"name": "c", "image": "i", "livenesProbe": {"httpGet": {"path": "/healthz", "port": 1}}}
        ]}}}
    });
    let typed: Deployment = serde_json::from_value(doc.clone()).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    let e = contained(&doc, &back, "doc").unwrap_err();
    assert!(e.contains("livenesProbe"), "{e}");
}

#[test]
fn each_service_is_probed_sized_reachable_and_runs_as_what_rbac_grants() {
    let d = all();
    for deployment in &d.deployments {
        let name = deployment.metadata.name.clone().unwrap();
        for c in &pod(deployment).containers {
            let ports: Vec<String> = c
                .ports
                .iter()
                .flatten()
                .filter_map(|p| p.name.clone())
                .collect();
            for (probe, path) in [
                (c.liveness_probe.as_ref(), "/healthz"),
                (c.readiness_probe.as_ref(), "/readyz"),
            ] {
                let get = probe
                    .and_then(|p| p.http_get.as_ref())
                    .unwrap_or_else(|| panic!("{name}: no {path} probe"));
                assert_eq!(get.path.as_deref(), Some(path), "{name}");
                let port = match &get.port {
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
                        s.clone()
                    }
                    other => panic!("{name}: probe port {other:?}: name the port"),
                };
                assert!(
                    ports.contains(&port),
                    "{name}: probe on {port}, ports {ports:?}"
                );
            }
            let requests = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .unwrap_or_else(|| panic!("{name}: no resource requests"));
            assert!(requests.contains_key("cpu") && requests.contains_key("memory"));
            let security = c.security_context.as_ref().unwrap();
            assert_eq!(security.allow_privilege_escalation, Some(false), "{name}");
            assert_eq!(security.read_only_root_filesystem, Some(true), "{name}");
            // The args are Meridian's: a `server` subcommand.
            assert_eq!(c.args.as_ref().unwrap()[0], "server", "{name}");
        }
    }
    // The Service selects exactly the intake's pods.
    let intake = d
        .deployments
        .iter()
        .find(|x| x.metadata.name.as_deref() == Some("meridian-intake"))
        .unwrap();
    let labels: BTreeMap<String, String> = intake
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let selector = d.services[0]
        .spec
        .as_ref()
        .unwrap()
        .selector
        .clone()
        .unwrap();
    assert!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "{selector:?}"
    );
    // The policy lets the API and the metrics port in.
    let policy = serde_json::to_string(&d.policies[0]).unwrap();
    assert!(
        policy.contains("7373") && policy.contains("9464"),
        "{policy}"
    );
    // The adapter runs as the account rbac.yaml binds.
    let adapter = d
        .deployments
        .iter()
        .find(|x| x.metadata.name.as_deref() == Some("meridian-adapter-k8s"))
        .unwrap();
    let account = pod(adapter).service_account_name.clone().unwrap();
    assert!(d
        .accounts
        .iter()
        .any(|a| a.metadata.name.as_deref() == Some(account.as_str())));
    assert!(d
        .bindings
        .iter()
        .any(|b| b.subjects.iter().flatten().any(|s| s.name == account)));
    // Its site configuration is there.
    assert!(d
        .config_maps
        .iter()
        .any(|c| c.metadata.name.as_deref() == Some("meridian-site-k8s")));
}
