//! The control plane, as one task ticking every 100 ms over the shared state: the
//! Job controller, the Deployment controller (without ReplicaSets), the scheduler,
//! the TTL-after-finished controller and the kubelet.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, PodFailurePolicyRule};
use serde_json::{json, Value};

use crate::kubelet::{self, fail_pod, is_ready, is_terminal, set_condition};
use crate::select::{intervals, node_requirement, quantity_of};
use crate::store::{int, key, kind, now, seconds_since, text, Key, State};
use crate::Shared;

const JOB_TIMES: &[&str] = &["lastProbeTime", "lastTransitionTime"];
const DEPLOY_TIMES: &[&str] = &["lastUpdateTime", "lastTransitionTime"];
pub(crate) const INDEX_KEY: &str = "batch.kubernetes.io/job-completion-index";

pub(crate) async fn run(sh: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut st = sh.lock();
        if st.stopped {
            return;
        }
        let owned = pods_by_owner(&st);
        for k in st.keys("jobs") {
            reconcile_job(&mut st, &k, &owned);
        }
        for k in st.keys("deployments") {
            reconcile_deployment(&mut st, &k, &owned);
        }
        schedule(&mut st);
        kubelet::tick(&sh, &mut st);
    }
}

fn owner_uid(pod: &Value) -> Option<&str> {
    let refs = pod.pointer("/metadata/ownerReferences")?.as_array()?;
    refs.iter()
        .find(|r| r.get("controller") == Some(&json!(true)))
        .and_then(|r| text(r, "/uid"))
}

fn pods_by_owner(st: &State) -> HashMap<String, Vec<Key>> {
    let mut out: HashMap<String, Vec<Key>> = HashMap::new();
    for ((ns, name), pod) in st.list("pods") {
        if let Some(uid) = owner_uid(pod) {
            out.entry(uid.to_string())
                .or_default()
                .push(key("pods", ns, name));
        }
    }
    out
}

/// Deletes an object. Pods lose their process; Jobs and Deployments take their
/// pods with them unless `propagation` is Orphan (then the pods lose the owner
/// reference, as the garbage collector does).
pub(crate) fn delete(st: &mut State, k: &Key, propagation: &str) -> Option<Value> {
    let obj = st.remove(k)?;
    let uid = text(&obj, "/metadata/uid").unwrap_or_default().to_string();
    if k.0 == "pods" {
        kubelet::kill(st, &uid);
    } else if k.0 == "jobs" || k.0 == "deployments" {
        let pods: Vec<Key> = st
            .keys("pods")
            .into_iter()
            .filter(|p| st.get(p).and_then(owner_uid) == Some(&uid))
            .collect();
        for p in pods {
            if propagation == "Orphan" {
                st.modify(&p, |pod| {
                    if let Some(refs) = pod
                        .pointer_mut("/metadata/ownerReferences")
                        .and_then(Value::as_array_mut)
                    {
                        refs.retain(|r| text(r, "/uid") != Some(&uid));
                        if refs.is_empty() {
                            pod["metadata"]
                                .as_object_mut()
                                .map(|m| m.remove("ownerReferences"));
                        }
                    }
                });
            } else {
                delete(st, &p, "Background");
            }
        }
    }
    Some(obj)
}

/// Creates a pod from a template for an owner (ownerReference, labels, annotations).
fn create_pod(
    st: &mut State,
    owner: &Value,
    name: String,
    labels: Value,
    annotations: Value,
    spec: Value,
) {
    let template_meta = owner
        .pointer("/spec/template/metadata")
        .cloned()
        .unwrap_or(json!({}));
    let mut meta = json!({"name": name, "labels": template_meta.get("labels").cloned().unwrap_or(json!({})),
        "annotations": template_meta.get("annotations").cloned().unwrap_or(json!({}))});
    for (field, extra) in [("labels", labels), ("annotations", annotations)] {
        crate::select::merge_patch(&mut meta[field], &extra);
        if meta[field].as_object().is_some_and(|m| m.is_empty()) {
            meta.as_object_mut().map(|m| m.remove(field));
        }
    }
    meta["ownerReferences"] = json!([{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"], "controller": true,
        "blockOwnerDeletion": true}]);
    let qos = if spec.pointer("/containers/0/resources/limits").is_some() {
        "Burstable"
    } else {
        "BestEffort"
    };
    let pod =
        json!({"metadata": meta, "spec": spec, "status": {"phase": "Pending", "qosClass": qos}});
    let ns = text(owner, "/metadata/namespace")
        .unwrap_or_default()
        .to_string();
    st.insert(kind("pods").expect("pods"), &ns, pod);
}

fn unique_name(st: &mut State, ns: &str, prefix: &str, n: usize) -> String {
    loop {
        let name = format!("{prefix}{}", st.random_suffix(n));
        if st.get(&key("pods", ns, &name)).is_none() {
            return name;
        }
    }
}

enum Action {
    FailJob(String),
    FailIndex,
    Ignore,
    Count,
}

/// The first podFailurePolicy rule that matches a failed pod decides; none is Count.
fn evaluate(rules: &[PodFailurePolicyRule], pod: &Value) -> Action {
    let pod_name = format!(
        "{}/{}",
        text(pod, "/metadata/namespace").unwrap_or(""),
        text(pod, "/metadata/name").unwrap_or("")
    );
    for (i, rule) in rules.iter().enumerate() {
        let mut why = None;
        if let Some(codes) = &rule.on_exit_codes {
            let statuses = pod
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten();
            for cs in statuses {
                let name = text(cs, "/name").unwrap_or("");
                let Some(code) = int(cs, "/state/terminated/exitCode") else {
                    continue;
                };
                // Only non-zero exit codes are checked, whatever the operator.
                if code == 0 || codes.container_name.as_ref().is_some_and(|c| c != name) {
                    continue;
                }
                let listed = codes.values.iter().any(|v| i64::from(*v) == code);
                if listed == (codes.operator == "In") {
                    why = Some(format!(
                        "Container {name} for pod {pod_name} failed with exit code {code}"
                    ));
                    break;
                }
            }
        }
        for c in rule.on_pod_conditions.iter().flatten() {
            let conds = pod
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten();
            let wanted = if c.status.is_empty() {
                "True"
            } else {
                c.status.as_str()
            };
            let found = conds
                .into_iter()
                .any(|p| text(p, "/type") == Some(&c.type_) && text(p, "/status") == Some(wanted));
            if found && why.is_none() {
                why = Some(format!("Pod {pod_name} has condition {} matching", c.type_));
            }
        }
        let Some(why) = why else { continue };
        return match rule.action.as_str() {
            "FailJob" => {
                let lead = why.strip_suffix(" matching").unwrap_or(&why);
                Action::FailJob(format!("{lead} matching FailJob rule at index {i}"))
            }
            "FailIndex" => Action::FailIndex,
            "Ignore" => Action::Ignore,
            _ => Action::Count,
        };
    }
    Action::Count
}

fn pod_index(pod: &Value) -> Option<i64> {
    pod.pointer("/metadata/annotations")
        .and_then(|a| a.get(INDEX_KEY))
        .and_then(Value::as_str)?
        .parse()
        .ok()
}

fn finished_at(job: &Value) -> Option<String> {
    let conds = job.pointer("/status/conditions")?.as_array()?;
    conds
        .iter()
        .find(|c| {
            matches!(text(c, "/type"), Some("Complete" | "Failed"))
                && text(c, "/status") == Some("True")
        })
        .and_then(|c| text(c, "/lastTransitionTime").map(str::to_string))
}

fn reconcile_job(st: &mut State, k: &Key, owned: &HashMap<String, Vec<Key>>) {
    let Some(obj) = st.get(k).cloned() else {
        return;
    };
    if let Some(done) = finished_at(&obj) {
        let ttl = int(&obj, "/spec/ttlSecondsAfterFinished");
        if ttl.is_some_and(|ttl| seconds_since(Some(&done)) >= ttl) {
            delete(st, k, "Background");
        }
        return;
    }
    let Ok(job) = serde_json::from_value::<Job>(obj.clone()) else {
        return;
    };
    let spec = job.spec.clone().unwrap_or_default();
    let uid = text(&obj, "/metadata/uid").unwrap_or_default().to_string();
    let pods: Vec<(Key, Value)> = owned
        .get(&uid)
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p.clone(), st.get(p)?.clone())))
        .collect();
    let active: Vec<&(Key, Value)> = pods.iter().filter(|(_, p)| !is_terminal(p)).collect();

    if spec.suspend == Some(true) {
        // Suspending deletes the active pods; resuming starts the clock again.
        for (p, _) in &active {
            delete(st, p, "Background");
        }
        st.modify(k, |j| {
            let status = &mut j["status"];
            status.as_object_mut().map(|s| s.remove("startTime"));
            status.as_object_mut().map(|s| s.remove("active"));
            status["ready"] = json!(0);
            set_condition(
                status,
                JOB_TIMES,
                "Suspended",
                "True",
                "JobSuspended",
                "Job suspended",
            );
        });
        return;
    }

    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let rules = spec
        .pod_failure_policy
        .as_ref()
        .map(|p| p.rules.clone())
        .unwrap_or_default();
    let mut failed_pods: Vec<&Value> = pods
        .iter()
        .map(|(_, p)| p)
        .filter(|p| text(p, "/status/phase") == Some("Failed"))
        .collect();
    failed_pods.sort_by_key(|p| {
        (
            terminated_at(p),
            text(p, "/metadata/name").unwrap_or("").to_string(),
        )
    });
    let (mut failed, mut counted, mut fail_job) = (0, 0, None);
    let mut failed_idx = BTreeSet::new();
    let mut per_index: HashMap<i64, i32> = HashMap::new();
    for pod in failed_pods {
        match evaluate(&rules, pod) {
            Action::FailJob(m) => {
                failed += 1;
                fail_job.get_or_insert(m);
            }
            Action::FailIndex => {
                failed += 1;
                failed_idx.extend(pod_index(pod));
            }
            Action::Ignore => {}
            Action::Count => {
                failed += 1;
                counted += 1;
                if let Some(i) = pod_index(pod) {
                    *per_index.entry(i).or_default() += 1;
                }
            }
        }
    }
    if let Some(limit) = spec.backoff_limit_per_index {
        failed_idx.extend(
            per_index
                .iter()
                .filter(|(_, n)| **n > limit)
                .map(|(i, _)| *i),
        );
    }
    let succeeded_pods: Vec<&Value> = pods
        .iter()
        .map(|(_, p)| p)
        .filter(|p| text(p, "/status/phase") == Some("Succeeded"))
        .collect();
    let succeeded_idx: BTreeSet<i64> = succeeded_pods.iter().filter_map(|p| pod_index(p)).collect();
    failed_idx.retain(|i| !succeeded_idx.contains(i));
    let completions = spec.completions.map(i64::from);
    let parallelism = i64::from(spec.parallelism.unwrap_or(1));
    let succeeded = if indexed {
        succeeded_idx.len() as i64
    } else {
        succeeded_pods.len() as i64
    };

    let start = text(&obj, "/status/startTime")
        .map(str::to_string)
        .unwrap_or_else(now);
    let deadline_passed = spec
        .active_deadline_seconds
        .is_some_and(|d| seconds_since(Some(&start)) >= d);
    let failure = if let Some(m) = fail_job {
        Some(("PodFailurePolicy", m))
    } else if counted
        > spec
            .backoff_limit
            .unwrap_or(if spec.backoff_limit_per_index.is_some() {
                i32::MAX
            } else {
                6
            })
    {
        Some((
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit".to_string(),
        ))
    } else if spec
        .max_failed_indexes
        .is_some_and(|m| failed_idx.len() as i64 > i64::from(m))
    {
        Some((
            "MaxFailedIndexesExceeded",
            "Job has exceeded the specified maximal number of failed indexes".into(),
        ))
    } else if deadline_passed {
        Some((
            "DeadlineExceeded",
            "Job was active longer than specified deadline".to_string(),
        ))
    } else {
        None
    };
    let all_indexes_done = indexed
        && (succeeded_idx.len() + failed_idx.len()) as i64 >= completions.unwrap_or(0)
        && active.is_empty();
    let failure = failure.or_else(|| {
        (all_indexes_done && !failed_idx.is_empty())
            .then(|| ("FailedIndexes", "Job has failed indexes".to_string()))
    });
    let complete = failure.is_none()
        && match (indexed, completions) {
            (true, _) => all_indexes_done,
            (false, Some(c)) => succeeded >= c,
            // Work-queue Jobs: done once one pod succeeded and none is left running.
            (false, None) => succeeded > 0 && active.is_empty(),
        };

    let mut active_n = active.len() as i64;
    if failure.is_some() || complete {
        for (p, _) in &active {
            fail_pod(st, p, None, None);
        }
        active_n = 0;
    } else {
        // Start what is missing, lowest pending indexes first.
        let name = &k.2;
        let template = obj
            .pointer("/spec/template/spec")
            .cloned()
            .unwrap_or(json!({}));
        let labels = json!({"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
            "batch.kubernetes.io/job-name": name, "job-name": name});
        let room = parallelism - active_n;
        if indexed {
            let running: BTreeSet<i64> = active.iter().filter_map(|(_, p)| pod_index(p)).collect();
            let pending: Vec<i64> = (0..completions.unwrap_or(0))
                .filter(|i| {
                    !succeeded_idx.contains(i) && !failed_idx.contains(i) && !running.contains(i)
                })
                .take(room.max(0) as usize)
                .collect();
            for i in pending {
                let pod_name = unique_name(st, &k.1, &format!("{name}-{i}-"), 5);
                let mut labels = labels.clone();
                labels[INDEX_KEY] = json!(i.to_string());
                let annotations = json!({ INDEX_KEY: i.to_string() });
                create_pod(
                    st,
                    &obj,
                    pod_name,
                    labels,
                    annotations,
                    with_index_env(&template),
                );
                active_n += 1;
            }
        } else {
            let wanted = match completions {
                Some(c) => room.min(c - succeeded - active_n),
                None if succeeded > 0 => 0,
                None => room,
            };
            for _ in 0..wanted.max(0) {
                let pod_name = unique_name(st, &k.1, &format!("{name}-"), 5);
                create_pod(
                    st,
                    &obj,
                    pod_name,
                    labels.clone(),
                    json!({}),
                    template.clone(),
                );
                active_n += 1;
            }
        }
    }

    let ready = active.iter().filter(|(_, p)| is_ready(p)).count() as i64;
    st.modify(k, |j| {
        let status = &mut j["status"];
        if !status.is_object() {
            *status = json!({});
        }
        status["startTime"] = json!(start);
        for (field, n) in [
            ("active", active_n),
            ("succeeded", succeeded),
            ("failed", failed),
        ] {
            // Zero counts are left out, as the real API does (omitempty).
            if n > 0 {
                status[field] = json!(n);
            } else {
                status.as_object_mut().map(|s| s.remove(field));
            }
        }
        status["ready"] = json!(if failure.is_some() || complete {
            0
        } else {
            ready
        });
        status["uncountedTerminatedPods"] = json!({});
        if indexed {
            let done = intervals(succeeded_idx.iter().copied());
            if done.is_empty() {
                status.as_object_mut().map(|s| s.remove("completedIndexes"));
            } else {
                status["completedIndexes"] = json!(done);
            }
            if spec.backoff_limit_per_index.is_some() {
                status["failedIndexes"] = json!(intervals(failed_idx.iter().copied()));
            }
        }
        if status
            .pointer("/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter().any(|c| {
                    text(c, "/type") == Some("Suspended") && text(c, "/status") == Some("True")
                })
            })
        {
            set_condition(
                status,
                JOB_TIMES,
                "Suspended",
                "False",
                "JobResumed",
                "Job resumed",
            );
        }
        if let Some((reason, message)) = &failure {
            set_condition(status, JOB_TIMES, "FailureTarget", "True", reason, message);
            set_condition(status, JOB_TIMES, "Failed", "True", reason, message);
        } else if complete {
            let message = "Reached expected number of succeeded pods";
            set_condition(
                status,
                JOB_TIMES,
                "SuccessCriteriaMet",
                "True",
                "CompletionsReached",
                message,
            );
            set_condition(
                status,
                JOB_TIMES,
                "Complete",
                "True",
                "CompletionsReached",
                message,
            );
            status["completionTime"] = json!(now());
        }
    });
    if let Some((reason, _)) = failure {
        tracing::debug!(job = %k.2, reason, "job failed");
    }
}

fn terminated_at(pod: &Value) -> String {
    text(
        pod,
        "/status/containerStatuses/0/state/terminated/finishedAt",
    )
    .unwrap_or("")
    .to_string()
}

/// What the real Job controller does through a downward-API reference to the
/// completion-index annotation.
fn with_index_env(template: &Value) -> Value {
    let mut spec = template.clone();
    let var = json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath":
        format!("metadata.annotations['{INDEX_KEY}']")}}});
    for list in ["containers", "initContainers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let env = &mut c["env"];
            if !env.is_array() {
                *env = json!([]);
            }
            if let Some(env) = env.as_array_mut() {
                env.retain(|e| text(e, "/name") != Some("JOB_COMPLETION_INDEX"));
                env.insert(0, var.clone());
            }
        }
    }
    spec
}

/// Kubernetes' pod-template-hash: a short hash of the template, in the alphabet of
/// generated names.
fn template_hash(template: &Value) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in template.to_string().bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..10)
        .map(|_| {
            let c = ALPHABET[(h % ALPHABET.len() as u64) as usize] as char;
            h /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn reconcile_deployment(st: &mut State, k: &Key, owned: &HashMap<String, Vec<Key>>) {
    let Some(obj) = st.get(k).cloned() else {
        return;
    };
    let uid = text(&obj, "/metadata/uid").unwrap_or_default().to_string();
    let replicas = int(&obj, "/spec/replicas").unwrap_or(1);
    let template = obj.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let hash = template_hash(&template);
    let mut current = Vec::new();
    for p in owned.get(&uid).into_iter().flatten() {
        let Some(pod) = st.get(p) else { continue };
        if is_terminal(pod) {
            continue;
        }
        // A changed template replaces every pod at once (no rolling update).
        if pod
            .pointer("/metadata/labels/pod-template-hash")
            .and_then(Value::as_str)
            == Some(&hash)
        {
            current.push((p.clone(), is_ready(pod)));
        } else {
            delete(st, p, "Background");
        }
    }
    // Scale down the pods that are not ready first, then the newest.
    current.sort_by_key(|(p, ready)| (!ready, std::cmp::Reverse(p.2.clone())));
    while current.len() as i64 > replicas {
        let (p, _) = current.pop().expect("non-empty");
        delete(st, &p, "Background");
    }
    let mut total = current.len() as i64;
    while total < replicas {
        let name = unique_name(st, &k.1, &format!("{}-{hash}-", k.2), 5);
        let spec = template.get("spec").cloned().unwrap_or(json!({}));
        create_pod(
            st,
            &obj,
            name,
            json!({"pod-template-hash": hash}),
            json!({}),
            spec,
        );
        total += 1;
    }
    let ready = current.iter().filter(|(_, r)| *r).count() as i64;
    let max_unavailable = match obj.pointer("/spec/strategy/rollingUpdate/maxUnavailable") {
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        Some(Value::String(p)) => p
            .trim_end_matches('%')
            .parse::<i64>()
            .map(|p| replicas * p / 100)
            .unwrap_or(0),
        _ => replicas / 4,
    };
    let rs = format!("{}-{hash}", k.2);
    st.modify(k, |d| {
        let generation = d["metadata"]["generation"].clone();
        let status = &mut d["status"];
        if !status.is_object() {
            *status = json!({});
        }
        status["observedGeneration"] = generation;
        let unavailable = (total - ready).max(0);
        for (field, n) in [
            ("replicas", total),
            ("updatedReplicas", total),
            ("readyReplicas", ready),
            ("availableReplicas", ready),
            ("unavailableReplicas", unavailable),
        ] {
            if n > 0 {
                status[field] = json!(n);
            } else {
                status.as_object_mut().map(|s| s.remove(field));
            }
        }
        let (av, why, msg) = if ready >= replicas - max_unavailable {
            (
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        } else {
            (
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        };
        set_condition(status, DEPLOY_TIMES, "Available", av, why, msg);
        let (why, msg) = if ready >= replicas {
            (
                "NewReplicaSetAvailable",
                format!("ReplicaSet {rs:?} has successfully progressed."),
            )
        } else {
            (
                "ReplicaSetUpdated",
                format!("ReplicaSet {rs:?} is progressing."),
            )
        };
        set_condition(status, DEPLOY_TIMES, "Progressing", "True", why, &msg);
    });
}

/// The resources a pod asks for: requests, or limits where a request is missing
/// (as the API server defaults them), summed over its containers.
fn requests(pod: &Value) -> HashMap<String, f64> {
    let mut out: HashMap<String, f64> = HashMap::new();
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut mine: HashMap<String, f64> = HashMap::new();
        for which in ["/resources/limits", "/resources/requests"] {
            for (r, q) in c
                .pointer(which)
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if let Some(q) = quantity_of(q) {
                    mine.insert(r.clone(), q);
                }
            }
        }
        for (r, q) in mine {
            *out.entry(r).or_default() += q;
        }
    }
    out
}

fn node_capacity(node: &Value) -> HashMap<String, f64> {
    let caps = node
        .pointer("/status/allocatable")
        .and_then(Value::as_object)
        .into_iter()
        .flatten();
    caps.filter_map(|(r, q)| Some((r.clone(), quantity_of(q)?)))
        .collect()
}

fn affinity_ok(pod: &Value, node: &Value) -> bool {
    let labels = node.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let selector = pod
        .pointer("/spec/nodeSelector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten();
    if !selector.into_iter().all(|(k, v)| v.as_str() == label(k)) {
        return false;
    }
    let terms = pod.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms");
    let Some(terms) = terms.and_then(Value::as_array) else {
        return true;
    };
    let name = text(node, "/metadata/name");
    terms.iter().any(|t| {
        let exprs = t
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        let fields = t
            .get("matchFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        let any = t.get("matchExpressions").is_some() || t.get("matchFields").is_some();
        any && exprs
            .into_iter()
            .all(|e| node_requirement(e, text(e, "/key").and_then(label)))
            && fields.into_iter().all(|e| node_requirement(e, name))
    })
}

/// Binds each unscheduled pod to the first node where it fits; otherwise marks it
/// Unschedulable with the scheduler's kind of message.
fn schedule(st: &mut State) {
    let nodes: Vec<(String, Value, HashMap<String, f64>)> = st
        .list("nodes")
        .map(|((_, n), v)| (n.clone(), v.clone(), node_capacity(v)))
        .collect();
    let mut used: HashMap<String, HashMap<String, f64>> = HashMap::new();
    let mut pending = Vec::new();
    for ((ns, name), pod) in st.list("pods") {
        if is_terminal(pod) {
            continue;
        }
        match text(pod, "/spec/nodeName") {
            Some(node) => {
                let u = used.entry(node.to_string()).or_default();
                for (r, q) in requests(pod) {
                    *u.entry(r).or_default() += q;
                }
            }
            None => pending.push(key("pods", ns, name)),
        }
    }
    for p in pending {
        let Some(pod) = st.get(&p) else { continue };
        let want = requests(pod);
        let mut reasons: HashMap<String, usize> = HashMap::new();
        let mut chosen = None;
        for (name, node, cap) in &nodes {
            if !affinity_ok(pod, node) {
                *reasons
                    .entry("node(s) didn't match Pod's node affinity/selector".into())
                    .or_default() += 1;
                continue;
            }
            let u = used.get(name);
            let short: Vec<&String> = want
                .iter()
                .filter(|(_, q)| **q > 0.0)
                .filter(|(r, q)| {
                    let have = cap.get(*r).copied().unwrap_or(0.0);
                    let taken = u.and_then(|u| u.get(*r)).copied().unwrap_or(0.0);
                    taken + **q > have + 1e-9
                })
                .map(|(r, _)| r)
                .collect();
            if short.is_empty() {
                chosen = Some(name.clone());
                break;
            }
            for r in short {
                *reasons.entry(format!("Insufficient {r}")).or_default() += 1;
            }
        }
        match chosen {
            Some(node) => {
                let u = used.entry(node.clone()).or_default();
                for (r, q) in want {
                    *u.entry(r).or_default() += q;
                }
                st.modify(&p, |pod| {
                    pod["spec"]["nodeName"] = json!(node);
                    set_condition(
                        &mut pod["status"],
                        &["lastTransitionTime"],
                        "PodScheduled",
                        "True",
                        "",
                        "",
                    );
                });
            }
            None => {
                let mut parts: Vec<String> =
                    reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
                parts.sort();
                let n = nodes.len();
                let message = format!(
                    "0/{n} nodes are available: {}. preemption: 0/{n} nodes are available: {n} No preemption victims found for incoming pod.",
                    parts.join(", ")
                );
                st.modify(&p, |pod| {
                    set_condition(
                        &mut pod["status"],
                        &["lastTransitionTime"],
                        "PodScheduled",
                        "False",
                        "Unschedulable",
                        &message,
                    );
                });
            }
        }
    }
}
