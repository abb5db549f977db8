//! The kubelet: runs each bound pod's first container as a host process in its
//! own process group, keeps its output, probes readiness and reports the pod's
//! status the way the real kubelet does.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::store::{int, now, seconds_since, text, Key, Proc, State};
use crate::Shared;

/// How long a crashed container of a restartPolicy=Always pod waits before it runs again.
const CRASH_BACKOFF: Duration = Duration::from_secs(1);
/// How long an image that "does not exist" shows ErrImagePull before ImagePullBackOff.
const PULL_BACKOFF: Duration = Duration::from_secs(1);

fn signal_group(pgid: i32, signal: i32) {
    // pgid 0 or 1 would signal ourselves or everything: never.
    if pgid > 1 {
        // SAFETY: killpg only sends a signal; a stale group answers ESRCH, ignored.
        unsafe {
            libc::killpg(pgid, signal);
        }
    }
}

/// Stops a pod's process: SIGTERM to its group, SIGKILL two seconds later.
/// Whoever calls this writes the pod's status; the process's own exit is then ignored.
pub(crate) fn kill(st: &mut State, uid: &str) {
    st.waits.remove(uid);
    let Some(p) = st.procs.remove(uid) else {
        return;
    };
    signal_group(p.pgid, libc::SIGTERM);
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                signal_group(p.pgid, libc::SIGKILL);
            });
        }
        Err(_) => signal_group(p.pgid, libc::SIGKILL),
    }
}

pub(crate) fn kill_all_now(st: &mut State) {
    for (_, p) in st.procs.drain() {
        signal_group(p.pgid, libc::SIGKILL);
    }
}

/// Sets a condition, moving its transition time only when its status changes.
/// `times` are the condition's time fields (pods: lastTransitionTime; Jobs also
/// lastProbeTime; Deployments also lastUpdateTime).
pub(crate) fn set_condition(
    status: &mut Value,
    times: &[&str],
    ctype: &str,
    value: &str,
    reason: &str,
    message: &str,
) {
    let conds = &mut status["conditions"];
    if !conds.is_array() {
        *conds = json!([]);
    }
    let Some(list) = conds.as_array_mut() else {
        return;
    };
    let now = now();
    let pos = list.iter().position(|c| text(c, "/type") == Some(ctype));
    let c = match pos {
        Some(i) => &mut list[i],
        None => {
            list.push(json!({"type": ctype}));
            list.last_mut().expect("just pushed")
        }
    };
    let flipped = text(c, "/status") != Some(value);
    let changed = flipped
        || text(c, "/reason").unwrap_or("") != reason
        || text(c, "/message").unwrap_or("") != message;
    if !changed {
        return;
    }
    c["status"] = json!(value);
    for t in times {
        if flipped || *t != "lastTransitionTime" {
            c[*t] = json!(now);
        }
    }
    for (field, v) in [("reason", reason), ("message", message)] {
        match v {
            "" => {
                c.as_object_mut().map(|o| o.remove(field));
            }
            v => c[field] = json!(v),
        }
    }
}

const POD_TIMES: &[&str] = &["lastTransitionTime"];

pub(crate) fn is_terminal(pod: &Value) -> bool {
    matches!(text(pod, "/status/phase"), Some("Succeeded" | "Failed"))
}

pub(crate) fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| text(c, "/type") == Some("Ready") && text(c, "/status") == Some("True"))
        })
}

/// The first container's status, made if missing.
fn container_status(pod: &mut Value) -> &mut Value {
    let name = pod
        .pointer("/spec/containers/0/name")
        .cloned()
        .unwrap_or(json!(""));
    let image = pod
        .pointer("/spec/containers/0/image")
        .cloned()
        .unwrap_or(json!(""));
    let list = &mut pod["status"]["containerStatuses"];
    if list.as_array().is_none_or(|l| l.is_empty()) {
        *list = json!([{"name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0,
            "started": false, "state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": {}}]);
    }
    &mut list[0]
}

/// Ends a pod that the stand-in itself stops (eviction, deadlines, a failing Job):
/// its process is killed and it is Failed with exit code 137, like a SIGKILL.
pub(crate) fn fail_pod(
    st: &mut State,
    key: &Key,
    reason: Option<(&str, &str)>,
    condition: Option<(&str, &str, &str)>,
) {
    let Some(pod) = st.get(key) else { return };
    let uid = text(pod, "/metadata/uid").unwrap_or_default().to_string();
    kill(st, &uid);
    st.modify(key, |pod| {
        let status = &mut pod["status"];
        status["phase"] = json!("Failed");
        if let Some((r, m)) = reason {
            status["reason"] = json!(r);
            status["message"] = json!(m);
        }
        if let Some((t, r, m)) = condition {
            set_condition(status, POD_TIMES, t, "True", r, m);
        }
        set_condition(status, POD_TIMES, "Ready", "False", "PodFailed", "");
        set_condition(status, POD_TIMES, "ContainersReady", "False", "PodFailed", "");
        let cs = container_status(pod);
        if cs.pointer("/state/terminated").is_none() {
            let started = cs.pointer("/state/running/startedAt").cloned().unwrap_or(json!(now()));
            let id = cs.get("containerID").cloned().unwrap_or(json!(""));
            cs["state"] = json!({"terminated": {"exitCode": 137, "reason": "Error", "startedAt": started,
                "finishedAt": now(), "containerID": id}});
        }
        cs["ready"] = json!(false);
        cs["started"] = json!(false);
    });
}

/// The container ended by itself (or never started): terminal for Never/OnFailure,
/// a restart after a short back-off for Always.
fn container_ended(st: &mut State, key: &Key, code: i64, reason: &str, message: &str) {
    let Some(pod) = st.get(key) else { return };
    let always = text(pod, "/spec/restartPolicy").unwrap_or("Always") == "Always";
    let uid = text(pod, "/metadata/uid").unwrap_or_default().to_string();
    st.modify(key, |pod| {
        let name = text(pod, "/metadata/name").unwrap_or_default().to_string();
        let cs = container_status(pod);
        let started = cs.pointer("/state/running/startedAt").cloned().unwrap_or(json!(now()));
        let mut term = json!({"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now(),
            "containerID": cs.get("containerID").cloned().unwrap_or(json!(""))});
        if !message.is_empty() {
            term["message"] = json!(message);
        }
        cs["ready"] = json!(false);
        cs["started"] = json!(false);
        if always {
            let container = text(cs, "/name").unwrap_or_default().to_string();
            cs["lastState"] = json!({"terminated": term});
            cs["restartCount"] = json!(int(cs, "/restartCount").unwrap_or(0) + 1);
            cs["state"] = json!({"waiting": {"reason": "CrashLoopBackOff",
                "message": format!("back-off 1s restarting failed container={container} pod={name}")}});
        } else {
            cs["state"] = json!({"terminated": term});
            pod["status"]["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
        }
        let why = if always { "ContainersNotReady" } else { "PodCompleted" };
        set_condition(&mut pod["status"], POD_TIMES, "Ready", "False", why, "");
        set_condition(&mut pod["status"], POD_TIMES, "ContainersReady", "False", why, "");
    });
    if always {
        st.waits.insert(uid, Instant::now() + CRASH_BACKOFF);
    }
}

/// A waiting state that keeps the pod from running (bad image, no command).
fn hold(st: &mut State, key: &Key, reason: &str, message: &str, fail: bool) {
    st.modify(key, |pod| {
        let cs = container_status(pod);
        cs["state"] = json!({"waiting": {"reason": reason, "message": message}});
        let status = &mut pod["status"];
        if fail {
            status["phase"] = json!("Failed");
        }
        set_condition(status, POD_TIMES, "Initialized", "True", "", "");
        set_condition(
            status,
            POD_TIMES,
            "Ready",
            "False",
            "ContainersNotReady",
            "",
        );
        set_condition(
            status,
            POD_TIMES,
            "ContainersReady",
            "False",
            "ContainersNotReady",
            "",
        );
    });
}

/// One pass: deadlines of running pods, then start what is bound and not running.
pub(crate) fn tick(sh: &Arc<Shared>, st: &mut State) {
    let mut deadlines = Vec::new();
    let mut to_start = Vec::new();
    for ((ns, name), pod) in st.list("pods") {
        if is_terminal(pod) || text(pod, "/spec/nodeName").is_none() {
            continue;
        }
        let key = ("pods", ns.clone(), name.clone());
        let uid = text(pod, "/metadata/uid").unwrap_or_default();
        if let Some(limit) = int(pod, "/spec/activeDeadlineSeconds") {
            let start = text(pod, "/status/startTime");
            if start.is_some() && seconds_since(start) >= limit {
                deadlines.push(key);
                continue;
            }
        }
        if !st.procs.contains_key(uid) && st.waits.get(uid).is_none_or(|t| *t <= Instant::now()) {
            to_start.push((key, uid.to_string()));
        }
    }
    for key in deadlines {
        let why = (
            "DeadlineExceeded",
            "Pod was active on the node longer than the specified deadline",
        );
        fail_pod(st, &key, Some(why), None);
    }
    for (key, uid) in to_start {
        let Some(pod) = st.get(&key).cloned() else {
            continue;
        };
        let image = text(&pod, "/spec/containers/0/image").unwrap_or("");
        let always = text(&pod, "/spec/restartPolicy").unwrap_or("Always") == "Always";
        if image.contains("does-not-exist") {
            let since = *st.waits.entry(uid).or_insert_with(Instant::now);
            let (reason, message) = if since.elapsed() < PULL_BACKOFF {
                (
                    "ErrImagePull",
                    format!("failed to pull and unpack image {image:?}: not found"),
                )
            } else {
                (
                    "ImagePullBackOff",
                    format!("Back-off pulling image {image:?}"),
                )
            };
            hold(st, &key, reason, &message, false);
        } else if pod
            .pointer("/spec/containers/0/command")
            .and_then(Value::as_array)
            .is_none_or(|c| c.is_empty())
        {
            let message = "the stand-in runs no images: the container needs a command";
            hold(st, &key, "StandInNeedsCommand", message, !always);
        } else {
            start(sh, st, &key, &pod, uid);
        }
    }
}

/// `$(VAR)` from the variables defined so far; `$$` is a literal `$`; unknown
/// references stay as written (Kubernetes' rules).
pub(crate) fn expand(s: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(close) = after.strip_prefix('(').and_then(|a| a.find(')')) {
            let name = &after[1..=close];
            match vars.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&rest[i..i + close + 3]),
            }
            rest = &after[close + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The value of a downward-API fieldRef such as `metadata.labels['k']`.
fn field_ref(pod: &Value, path: &str) -> Option<String> {
    let inner = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_string)
    };
    let value = if let Some(k) = inner("metadata.labels['") {
        pod.pointer("/metadata/labels")
            .and_then(|l| l.get(&k))
            .cloned()
    } else if let Some(k) = inner("metadata.annotations['") {
        pod.pointer("/metadata/annotations")
            .and_then(|l| l.get(&k))
            .cloned()
    } else {
        let pointer = match path {
            "metadata.name" => "/metadata/name",
            "metadata.namespace" => "/metadata/namespace",
            "metadata.uid" => "/metadata/uid",
            "spec.nodeName" => "/spec/nodeName",
            "spec.serviceAccountName" => "/spec/serviceAccountName",
            "status.podIP" | "status.hostIP" => return Some("127.0.0.1".into()),
            _ => return None,
        };
        pod.pointer(pointer).cloned()
    };
    value.and_then(|v| v.as_str().map(str::to_string))
}

fn container_env(pod: &Value, c: &Value) -> Vec<(String, String)> {
    let mut vars: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = text(e, "/name") else {
            continue;
        };
        let value = if let Some(v) = text(e, "/value") {
            Some(expand(v, &vars))
        } else {
            text(e, "/valueFrom/fieldRef/fieldPath").and_then(|p| field_ref(pod, p))
        };
        if let Some(v) = value {
            vars.insert(name.to_string(), v.clone());
            out.push((name.to_string(), v));
        }
    }
    out
}

fn open_log(dir: &Path, name: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
}

fn start(sh: &Arc<Shared>, st: &mut State, key: &Key, pod: &Value, uid: String) {
    let c = &pod["spec"]["containers"][0];
    let env = container_env(pod, c);
    let vars: HashMap<String, String> = env.iter().cloned().collect();
    let argv: Vec<String> = ["/command", "/args"]
        .iter()
        .filter_map(|p| c.pointer(p).and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .map(|a| expand(a, &vars))
        .collect();
    let dir = sh.opts.work_dir.join(&uid);
    let cwd = match text(c, "/workingDir") {
        Some(w) if Path::new(w).is_dir() => Path::new(w).to_path_buf(),
        _ => dir.clone(),
    };
    let files = std::fs::create_dir_all(&dir).and_then(|_| {
        Ok((
            open_log(&dir, "stdout")?,
            open_log(&dir, "stderr")?,
            open_log(&dir, "combined")?,
        ))
    });
    let spawned = files.and_then(|files| {
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env("HOSTNAME", &key.2)
            .envs(env)
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that killing the pod kills what it started too.
            .process_group(0);
        Ok((cmd.spawn()?, files))
    });
    let (mut child, (out, err, combined)) = match spawned {
        Ok(x) => x,
        Err(e) => {
            tracing::info!(pod = %key.2, error = %e, "container failed to start");
            let message = format!("failed to start {:?}: {e}", argv[0]);
            return container_ended(st, key, 128, "StartError", &message);
        }
    };
    let pid = child.id().unwrap_or(0) as i32;
    st.runs += 1;
    let run = st.runs;
    st.procs.insert(
        uid.clone(),
        Proc {
            pgid: pid,
            run,
            key: key.clone(),
        },
    );
    let probe = c.get("readinessProbe").cloned();
    st.modify(key, |pod| {
        let status = &mut pod["status"];
        status["phase"] = json!("Running");
        if status.get("startTime").is_none() {
            status["startTime"] = json!(now());
        }
        status["hostIP"] = json!("127.0.0.1");
        status["hostIPs"] = json!([{"ip": "127.0.0.1"}]);
        status["podIP"] = json!("127.0.0.1");
        status["podIPs"] = json!([{"ip": "127.0.0.1"}]);
        let ready = if probe.is_some() { "False" } else { "True" };
        let why = if probe.is_some() {
            "ContainersNotReady"
        } else {
            ""
        };
        for (t, v, r) in [
            ("PodReadyToStartContainers", "True", ""),
            ("Initialized", "True", ""),
            ("Ready", ready, why),
            ("ContainersReady", ready, why),
            ("PodScheduled", "True", ""),
        ] {
            set_condition(status, POD_TIMES, t, v, r, "");
        }
        let cs = container_status(pod);
        cs["containerID"] = json!(format!("standin://{pid}"));
        cs["ready"] = json!(probe.is_none());
        cs["started"] = json!(true);
        cs["state"] = json!({"running": {"startedAt": now()}});
    });
    tracing::debug!(pod = %key.2, pid, ?argv, "container started");
    let combined = Arc::new(Mutex::new(combined));
    let pumps = (
        tokio::spawn(pump(child.stdout.take(), out, combined.clone())),
        tokio::spawn(pump(child.stderr.take(), err, combined)),
    );
    let (sh2, uid2) = (sh.clone(), uid.clone());
    tokio::spawn(async move {
        let status = child.wait().await;
        // The container is gone, so is everything it started.
        signal_group(pid, libc::SIGKILL);
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = pumps.0.await;
            let _ = pumps.1.await;
        })
        .await;
        let code = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
            }
            Err(_) => 128,
        };
        let mut st = sh2.lock();
        if st.procs.get(&uid2).is_some_and(|p| p.run == run) {
            let p = st.procs.remove(&uid2).expect("checked");
            container_ended(
                &mut st,
                &p.key,
                code.into(),
                if code == 0 { "Completed" } else { "Error" },
                "",
            );
        }
    });
    if let Some(probe) = probe {
        tokio::spawn(readiness(
            sh.clone(),
            uid,
            run,
            probe,
            c.get("ports").cloned(),
        ));
    }
}

/// Copies one output stream to its own file and to the combined one, in the order
/// the chunks arrive.
async fn pump(
    r: Option<impl AsyncRead + Unpin>,
    mut own: std::fs::File,
    combined: Arc<Mutex<std::fs::File>>,
) {
    let Some(mut r) = r else { return };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let _ = own.write_all(&buf[..n]);
                if let Ok(mut c) = combined.lock() {
                    let _ = c.write_all(&buf[..n]);
                }
            }
        }
    }
}

/// Probes until the container is ready (then stops: the stand-in never marks a
/// container unready again while it runs). tcpSocket and httpGet both mean "the
/// port accepts a connection"; exec runs the command.
async fn readiness(sh: Arc<Shared>, uid: String, run: u64, probe: Value, ports: Option<Value>) {
    let port = probe
        .pointer("/tcpSocket/port")
        .or_else(|| probe.pointer("/httpGet/port"))
        .and_then(|p| {
            p.as_u64().or_else(|| {
                let named = p.as_str()?;
                let ports = ports.as_ref()?.as_array()?;
                ports
                    .iter()
                    .find(|q| text(q, "/name") == Some(named))
                    .and_then(|q| q.get("containerPort")?.as_u64())
            })
        });
    let exec: Vec<String> = probe
        .pointer("/exec/command")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let delay = int(&probe, "/initialDelaySeconds").unwrap_or(0).max(0) as u64;
    tokio::time::sleep(Duration::from_secs(delay)).await;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let ok = if let Some(port) = port {
            let connect = tokio::net::TcpStream::connect(("127.0.0.1", port as u16));
            matches!(
                tokio::time::timeout(Duration::from_secs(1), connect).await,
                Ok(Ok(_))
            )
        } else if let Some((prog, args)) = exec.split_first() {
            let out = tokio::process::Command::new(prog)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            matches!(out.await, Ok(s) if s.success())
        } else {
            true
        };
        let mut st = sh.lock();
        let Some(key) = st
            .procs
            .get(&uid)
            .filter(|p| p.run == run)
            .map(|p| p.key.clone())
        else {
            return;
        };
        if ok {
            st.modify(&key, |pod| {
                set_condition(
                    &mut pod["status"],
                    POD_TIMES,
                    "ContainersReady",
                    "True",
                    "",
                    "",
                );
                set_condition(&mut pod["status"], POD_TIMES, "Ready", "True", "", "");
                container_status(pod)["ready"] = json!(true);
            });
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_kubernetes() {
        let vars: HashMap<String, String> = [("A".to_string(), "1".to_string())].into();
        assert_eq!(expand("x$(A)y", &vars), "x1y");
        assert_eq!(expand("$$(A) $(B) $", &vars), "$(A) $(B) $");
        assert_eq!(expand("$(A", &vars), "$(A");
    }

    #[test]
    fn field_refs() {
        let pod = json!({"metadata": {"name": "p", "annotations": {"batch.kubernetes.io/job-completion-index": "3"}}});
        assert_eq!(
            field_ref(
                &pod,
                "metadata.annotations['batch.kubernetes.io/job-completion-index']"
            )
            .as_deref(),
            Some("3")
        );
        assert_eq!(field_ref(&pod, "metadata.name").as_deref(), Some("p"));
    }
}
