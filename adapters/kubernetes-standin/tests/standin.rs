//! The stand-in over real HTTP: what a Kubernetes client sees.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use meridian_kube_standin::{Node, Options, StandIn};
use serde_json::{json, Value};

const NS: &str = "meridian";
const JOBS: &str = "/apis/batch/v1/namespaces/meridian/jobs";
const PODS: &str = "/api/v1/namespaces/meridian/pods";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/meridian/deployments";

struct Api {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    fn new(standin: &StandIn) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: standin.url(),
            token: Some("standin-token".into()),
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        ctype: &str,
    ) -> (u16, Value) {
        let (code, text) = self.send_text(method, path, body, ctype).await;
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn send_text(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        ctype: &str,
    ) -> (u16, String) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.header("content-type", ctype).body(b.to_string());
        }
        let resp = req.send().await.expect("request");
        (resp.status().as_u16(), resp.text().await.expect("body"))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None, "").await
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send("POST", path, Some(body), "application/json")
            .await
    }

    async fn merge_patch(&self, path: &str, body: Value) -> (u16, Value) {
        self.send("PATCH", path, Some(body), "application/merge-patch+json")
            .await
    }

    async fn delete(&self, path: &str) -> (u16, Value) {
        self.send("DELETE", path, None, "").await
    }

    async fn items(&self, path: &str) -> Vec<Value> {
        let (code, list) = self.get(path).await;
        assert_eq!(code, 200, "{list}");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// Starts a watch; the reader hands out one event at a time.
    async fn watch(&self, path: &str) -> Watch {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth("standin-token")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        Watch {
            resp,
            buf: Vec::new(),
        }
    }
}

struct Watch {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Watch {
    /// The next event other than a bookmark, or None when the stream ends.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let event: Value = serde_json::from_slice(&line).expect("one JSON object per line");
                if event["type"] != "BOOKMARK" {
                    return Some(event);
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.resp.chunk())
                .await
                .ok()?
                .ok()??;
            self.buf.extend_from_slice(&chunk);
        }
    }
}

/// Polls until `f` gives a value (every 100 ms, for at most 60 s).
async fn until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition<'a>(obj: &'a Value, ctype: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ctype && c["status"] == "True")
}

async fn job_condition(api: &Api, name: &str, ctype: &str) -> Value {
    until(&format!("job {name} {ctype}"), || async {
        let (_, job) = api.get(&format!("{JOBS}/{name}")).await;
        condition(&job, ctype).map(|_| job.clone())
    })
    .await
}

fn job(name: &str, script: &str) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]}}}})
}

fn pod(name: &str, script: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"team": "a"}},
        "spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]}})
}

async fn start() -> (StandIn, Api, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let standin = StandIn::start(Options::new(dir.path())).await.unwrap();
    let api = Api::new(&standin);
    (standin, api, dir)
}

#[tokio::test]
async fn job_create_get_list_delete_with_strict_decoding() {
    let (standin, api, _dir) = start().await;
    let (code, created) = api.post(JOBS, job("crud", "sleep 30")).await;
    assert_eq!(code, 201, "{created}");
    assert!(created["metadata"]["uid"].is_string());
    assert_eq!(created["metadata"]["generation"], 1);
    assert_eq!(created["spec"]["completions"], 1, "defaulted");

    let (code, got) = api.get(&format!("{JOBS}/crud")).await;
    assert_eq!(code, 200);
    assert_eq!(got["metadata"]["uid"], created["metadata"]["uid"]);
    let (code, list) = api.get(JOBS).await;
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "JobList");
    assert!(list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .is_ok());
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(api
        .items(&format!("{JOBS}?labelSelector=nope%3Dx"))
        .await
        .is_empty());

    let (code, status) = api.post(JOBS, job("crud", "true")).await;
    assert_eq!(code, 409);
    assert_eq!(status["reason"], "AlreadyExists");
    assert_eq!(status["message"], "jobs.batch \"crud\" already exists");

    let mut odd = job("odd", "true");
    odd["spec"]["template"]["spec"]["containers"][0]["imagePullSecret"] = json!("x");
    let (code, status) = api.post(JOBS, odd).await;
    assert_eq!(code, 400, "{status}");
    assert_eq!(status["reason"], "BadRequest");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("unknown field \"spec.template.spec.containers[0].imagePullSecret\""),
        "{message}"
    );

    let (code, status) = api.post(JOBS, job("Not_A_Name", "true")).await;
    assert_eq!((code, status["reason"].as_str()), (422, Some("Invalid")));
    let mut always = job("always", "true");
    always["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
    assert_eq!(api.post(JOBS, always).await.0, 422);
    let mut indexed = job("indexed", "true");
    indexed["spec"]["completionMode"] = json!("Indexed");
    assert_eq!(
        api.post(JOBS, indexed).await.0,
        422,
        "Indexed needs completions"
    );
    assert_eq!(standin.created("jobs"), 1);

    // The pod runs; deleting the Job in the background takes it along.
    until("the job's pod to run", || async {
        let pods = api
            .items(&format!("{PODS}?labelSelector=job-name%3Dcrud"))
            .await;
        pods.iter()
            .any(|p| p["status"]["phase"] == "Running")
            .then_some(())
    })
    .await;
    let (code, deleted) = api
        .delete(&format!("{JOBS}/crud?propagationPolicy=Background"))
        .await;
    assert_eq!(code, 200);
    assert_eq!(deleted["metadata"]["name"], "crud");
    assert_eq!(api.get(&format!("{JOBS}/crud")).await.0, 404);
    assert!(api
        .items(&format!("{PODS}?labelSelector=job-name%3Dcrud"))
        .await
        .is_empty());
    let (code, status) = api.delete(&format!("{JOBS}/crud")).await;
    assert_eq!((code, status["reason"].as_str()), (404, Some("NotFound")));
    assert!(standin.objects("pods").is_empty());
}

#[tokio::test]
async fn failing_job_fails_by_pod_failure_policy_and_keeps_streams_apart() {
    let (_standin, api, _dir) = start().await;
    let mut j = job("fails", "echo hi; echo err >&2; exit 3");
    j["spec"]["backoffLimit"] = json!(6);
    j["spec"]["podFailurePolicy"] = json!({"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [0]}}]});
    assert_eq!(api.post(JOBS, j).await.0, 201);
    let failed = job_condition(&api, "fails", "Failed").await;
    let cond = condition(&failed, "Failed").unwrap();
    assert_eq!(cond["reason"], "PodFailurePolicy");
    assert!(condition(&failed, "FailureTarget").is_some());
    assert_eq!(failed["status"]["failed"], 1);
    let pods = api
        .items(&format!("{PODS}?labelSelector=job-name%3Dfails"))
        .await;
    assert_eq!(pods.len(), 1, "FailJob creates no replacement");
    let name = pods[0]["metadata"]["name"].as_str().unwrap();
    assert_eq!(
        cond["message"],
        format!("Container main for pod meridian/{name} failed with exit code 3 matching FailJob rule at index 1")
    );
    let terminated = &pods[0]["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 3);
    assert_eq!(terminated["reason"], "Error");

    let log = |stream: &'static str| {
        let api = &api;
        let path = format!("{PODS}/{name}/log?container=main&stream={stream}");
        async move { api.send_text("GET", &path, None, "").await }
    };
    assert_eq!(log("Stdout").await, (200, "hi\n".to_string()));
    assert_eq!(log("Stderr").await, (200, "err\n".to_string()));
    let (code, all) = log("All").await;
    assert_eq!(code, 200);
    assert!(
        all.contains("hi\n") && all.contains("err\n") && all.len() == 7,
        "{all:?}"
    );
    let (_, tail) = api
        .send_text(
            "GET",
            &format!("{PODS}/{name}/log?tailLines=1&stream=Stdout"),
            None,
            "",
        )
        .await;
    assert_eq!(tail, "hi\n");
}

#[tokio::test]
async fn indexed_job_keeps_to_its_parallelism_and_completes_every_index() {
    let (_standin, api, _dir) = start().await;
    let (_, list) = api.get(PODS).await;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut watch = api
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={rv}&labelSelector=job-name%3Didx"
        ))
        .await;
    let mut j = job("idx", "echo index $JOB_COMPLETION_INDEX; sleep 0.3");
    j["spec"]["completionMode"] = json!("Indexed");
    j["spec"]["completions"] = json!(3);
    j["spec"]["parallelism"] = json!(2);
    assert_eq!(api.post(JOBS, j).await.0, 201);

    // Follow every pod change: never more than two pods may be active at once.
    let mut phases: HashMap<String, String> = HashMap::new();
    let mut most = 0;
    while phases.len() < 3 || phases.values().any(|p| p != "Succeeded") {
        let event = watch.next().await.expect("pod events");
        let name = event["object"]["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string();
        phases.insert(
            name,
            event["object"]["status"]["phase"]
                .as_str()
                .unwrap_or("Pending")
                .to_string(),
        );
        let active = phases
            .values()
            .filter(|p| *p != "Succeeded" && *p != "Failed")
            .count();
        most = most.max(active);
        assert!(active <= 2, "{phases:?}");
    }
    assert!(most >= 1);
    let done = job_condition(&api, "idx", "Complete").await;
    assert_eq!(done["status"]["completedIndexes"], "0-2");
    assert_eq!(done["status"]["succeeded"], 3);
    assert!(condition(&done, "SuccessCriteriaMet").is_some());
    assert!(done["status"]["completionTime"].is_string());
    for p in api
        .items(&format!("{PODS}?labelSelector=job-name%3Didx"))
        .await
    {
        let index = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"],
            index.as_str()
        );
        let name = p["metadata"]["name"].as_str().unwrap();
        assert!(
            name.starts_with(&format!("idx-{index}-"))
                && name.len() == format!("idx-{index}-").len() + 5,
            "{name}"
        );
        let (_, out) = api
            .send_text("GET", &format!("{PODS}/{name}/log"), None, "")
            .await;
        assert_eq!(out, format!("index {index}\n"));
    }
}

#[tokio::test]
async fn watch_from_a_list_version_sees_added_modified_deleted() {
    let (_standin, api, _dir) = start().await;
    let (_, list) = api.get(JOBS).await;
    let rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut watch = api
        .watch(&format!(
            "{JOBS}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=60"
        ))
        .await;
    assert_eq!(api.post(JOBS, job("watched", "exit 0")).await.0, 201);

    let mut seen = Vec::new();
    let mut last = rv;
    let mut deleted = false;
    while let Some(event) = watch.next().await {
        let version: u64 = event["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(version > last, "versions only grow: {version} after {last}");
        last = version;
        let kind = event["type"].as_str().unwrap().to_string();
        assert_eq!(event["object"]["metadata"]["name"], "watched");
        if kind == "MODIFIED" && condition(&event["object"], "Complete").is_some() && !deleted {
            assert_eq!(
                api.delete(&format!("{JOBS}/watched?propagationPolicy=Foreground"))
                    .await
                    .0,
                200
            );
            deleted = true;
        }
        let done = kind == "DELETED";
        seen.push(kind);
        if done {
            break;
        }
    }
    assert_eq!(seen.first().map(String::as_str), Some("ADDED"), "{seen:?}");
    assert!(seen.iter().any(|k| k == "MODIFIED"), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("DELETED"), "{seen:?}");

    // Without a version, a watch starts with the current objects.
    assert_eq!(api.post(JOBS, job("second", "sleep 30")).await.0, 201);
    let mut fresh = api.watch(&format!("{JOBS}?watch=1&timeoutSeconds=5")).await;
    let first = fresh.next().await.unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("second"))
    );
}

#[tokio::test]
async fn watch_with_a_label_selector_sends_deleted_when_an_object_stops_matching() {
    let (_standin, api, _dir) = start().await;
    assert_eq!(api.post(PODS, pod("labelled", "sleep 30")).await.0, 201);
    let (_, list) = api.get(&format!("{PODS}?labelSelector=team%3Da")).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap();
    let mut watch = api
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={rv}&labelSelector=team%3Da"
        ))
        .await;
    let (code, patched) = api
        .merge_patch(
            &format!("{PODS}/labelled"),
            json!({"metadata": {"labels": {"team": "b"}}}),
        )
        .await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["metadata"]["labels"]["team"], "b");
    loop {
        let event = watch.next().await.expect("an event");
        if event["type"] == "DELETED" {
            assert_eq!(event["object"]["metadata"]["name"], "labelled");
            break;
        }
        assert_eq!(
            event["object"]["metadata"]["labels"]["team"], "a",
            "{event}"
        );
    }
}

#[tokio::test]
async fn eviction_marks_the_pod_as_disrupted_and_an_ignore_rule_replaces_it() {
    let (_standin, api, _dir) = start().await;
    let mut j = job("evicted", "sleep 60");
    j["spec"]["podFailurePolicy"] = json!({"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]});
    assert_eq!(api.post(JOBS, j).await.0, 201);
    let first = until("a running pod", || async {
        let pods = api
            .items(&format!(
                "{PODS}?labelSelector=job-name%3Devicted&fieldSelector=status.phase%3DRunning"
            ))
            .await;
        pods.first()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
    })
    .await;
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": first, "namespace": NS}});
    let (code, status) = api
        .post(&format!("{PODS}/{first}/eviction"), eviction)
        .await;
    assert_eq!(code, 201, "{status}");

    let (_, evicted) = api.get(&format!("{PODS}/{first}")).await;
    assert_eq!(evicted["status"]["phase"], "Failed");
    let disruption = condition(&evicted, "DisruptionTarget").expect("DisruptionTarget");
    assert_eq!(disruption["reason"], "EvictionByEvictionAPI");
    assert_eq!(
        evicted["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        137
    );
    let replacement = until("a replacement pod", || async {
        let pods = api
            .items(&format!(
                "{PODS}?labelSelector=job-name%3Devicted&fieldSelector=metadata.name!%3D{first}"
            ))
            .await;
        pods.first().cloned()
    })
    .await;
    assert_ne!(replacement["metadata"]["name"], first.as_str());
    let (_, j) = api.get(&format!("{JOBS}/evicted")).await;
    assert!(
        condition(&j, "Failed").is_none(),
        "ignored failures do not fail the job: {j}"
    );
    assert!(j["status"].get("failed").is_none(), "nor count: {j}");
}

#[tokio::test]
async fn active_deadlines_fail_jobs_and_pods() {
    let (_standin, api, _dir) = start().await;
    let mut j = job("slow", "sleep 60");
    j["spec"]["activeDeadlineSeconds"] = json!(1);
    assert_eq!(api.post(JOBS, j).await.0, 201);
    let failed = job_condition(&api, "slow", "Failed").await;
    let cond = condition(&failed, "Failed").unwrap();
    assert_eq!(cond["reason"], "DeadlineExceeded");
    assert_eq!(
        cond["message"],
        "Job was active longer than specified deadline"
    );
    let pods = api
        .items(&format!("{PODS}?labelSelector=job-name%3Dslow"))
        .await;
    assert!(
        pods.iter().all(|p| p["status"]["phase"] == "Failed"),
        "{pods:?}"
    );

    let mut p = pod("slow-pod", "sleep 60");
    p["spec"]["activeDeadlineSeconds"] = json!(1);
    assert_eq!(api.post(PODS, p).await.0, 201);
    let done = until("the pod's deadline", || async {
        let (_, p) = api.get(&format!("{PODS}/slow-pod")).await;
        (p["status"]["phase"] == "Failed").then_some(p)
    })
    .await;
    assert_eq!(done["status"]["reason"], "DeadlineExceeded");
    assert_eq!(
        done["status"]["message"],
        "Pod was active on the node longer than the specified deadline"
    );
    assert_eq!(
        done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        137
    );
}

#[tokio::test]
async fn ttl_after_finished_deletes_the_job_and_its_pods() {
    let (standin, api, _dir) = start().await;
    let mut j = job("short-lived", "exit 0");
    j["spec"]["ttlSecondsAfterFinished"] = json!(1);
    assert_eq!(api.post(JOBS, j).await.0, 201);
    job_condition(&api, "short-lived", "Complete").await;
    until("the job to go", || async {
        (api.get(&format!("{JOBS}/short-lived")).await.0 == 404).then_some(())
    })
    .await;
    assert!(api
        .items(&format!("{PODS}?labelSelector=job-name%3Dshort-lived"))
        .await
        .is_empty());
    assert_eq!(standin.created("jobs"), 1);
    assert!(standin.objects("jobs").is_empty());
}

#[tokio::test]
async fn deployment_with_a_tcp_readiness_probe_becomes_available_and_scales_down() {
    let (_standin, api, _dir) = start().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
                "name": "server", "image": "python:3",
                "command": ["python3", "-m", "http.server", "$(PORT)", "--bind", "127.0.0.1"],
                "env": [{"name": "PORT", "value": port.to_string()}],
                "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}}]}}}});
    let (code, created) = api.post(DEPLOYMENTS, deployment).await;
    assert_eq!(code, 201, "{created}");
    let ready = until("the deployment to be available", || async {
        let (_, d) = api.get(&format!("{DEPLOYMENTS}/web")).await;
        (d["status"]["readyReplicas"] == 1 && condition(&d, "Available").is_some()).then_some(d)
    })
    .await;
    assert_eq!(ready["status"]["observedGeneration"], 1);
    let pods = api.items(&format!("{PODS}?labelSelector=app%3Dweb")).await;
    assert_eq!(pods.len(), 1);
    let name = pods[0]["metadata"]["name"].as_str().unwrap();
    let hash = pods[0]["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap();
    assert!(
        name.starts_with(&format!("web-{hash}-")) && hash.len() == 10,
        "{name}"
    );
    assert!(condition(&pods[0], "Ready").is_some());
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok());

    let (code, scaled) = api
        .merge_patch(
            &format!("{DEPLOYMENTS}/web"),
            json!({"spec": {"replicas": 0}}),
        )
        .await;
    assert_eq!(code, 200, "{scaled}");
    assert_eq!(scaled["metadata"]["generation"], 2);
    until("the pod to go", || async {
        api.items(&format!("{PODS}?labelSelector=app%3Dweb"))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    until("the server process to stop", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn crashing_containers_of_deployments_restart() {
    let (_standin, api, _dir) = start().await;
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "crashy"},
        "spec": {"selector": {"matchLabels": {"app": "crashy"}},
            "template": {"metadata": {"labels": {"app": "crashy"}}, "spec": {"containers": [{
                "name": "main", "image": "busybox", "command": ["sh", "-c", "exit 2"]}]}}}});
    assert_eq!(api.post(DEPLOYMENTS, deployment).await.0, 201);
    let restarted = until("a restart", || async {
        let pods = api
            .items(&format!("{PODS}?labelSelector=app%3Dcrashy"))
            .await;
        pods.into_iter()
            .find(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(2))
    })
    .await;
    let status = &restarted["status"]["containerStatuses"][0];
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 2);
    assert_eq!(restarted["status"]["phase"], "Running");
}

#[tokio::test]
async fn forbidden_namespaces_and_missing_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options::new(dir.path());
    options.forbidden_namespaces.push("locked".into());
    let standin = StandIn::start(options).await.unwrap();
    let api = Api::new(&standin);
    let (code, status) = api.get("/apis/batch/v1/namespaces/locked/jobs").await;
    assert_eq!(code, 403);
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["message"],
        "jobs.batch is forbidden: User \"system:serviceaccount:meridian:meridian\" cannot list resource \"jobs\" in API group \"batch\" in the namespace \"locked\""
    );
    assert_eq!(
        api.post("/apis/batch/v1/namespaces/locked/jobs", job("x", "true"))
            .await
            .0,
        403
    );
    assert_eq!(api.get("/api/v1/namespaces/locked").await.0, 403);
    assert_eq!(api.get("/api/v1/namespaces/meridian").await.0, 200);
    let (code, status) = api.get("/api/v1/namespaces/elsewhere").await;
    assert_eq!((code, status["reason"].as_str()), (404, Some("NotFound")));
    assert_eq!(
        api.post("/apis/batch/v1/namespaces/elsewhere/jobs", job("x", "true"))
            .await
            .0,
        404
    );

    let anonymous = Api {
        token: None,
        ..Api::new(&standin)
    };
    let (code, status) = anonymous.get(JOBS).await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (401, Some("Unauthorized"))
    );
    let wrong = Api {
        token: Some("guess".into()),
        ..Api::new(&standin)
    };
    assert_eq!(wrong.get(JOBS).await.0, 401);
    assert!(standin.kubeconfig(NS).contains(&standin.url()));
}

#[tokio::test]
async fn the_scheduler_counts_gpus_and_follows_node_affinity() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options::new(dir.path());
    let mut gpu = Node::new("gpu-node", 16, 64 << 30);
    gpu.extended.insert("nvidia.com/gpu".into(), 2);
    gpu.labels.insert(
        "nvidia.com/gpu.product".into(),
        "NVIDIA-H100-80GB-HBM3".into(),
    );
    options.nodes.push(gpu);
    let standin = StandIn::start(options).await.unwrap();
    let api = Api::new(&standin);
    let gpu_pod = |name: &str, gpus: u32| {
        let mut p = pod(name, "sleep 30");
        p["spec"]["containers"][0]["resources"] =
            json!({"limits": {"nvidia.com/gpu": gpus, "memory": "64Mi"}});
        p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}});
        p
    };
    assert_eq!(api.post(PODS, gpu_pod("fits", 2)).await.0, 201);
    let bound = until("binding", || async {
        let (_, p) = api.get(&format!("{PODS}/fits")).await;
        p["spec"]["nodeName"].as_str().map(str::to_string)
    })
    .await;
    assert_eq!(bound, "gpu-node");
    assert_eq!(api.post(PODS, gpu_pod("waits", 1)).await.0, 201);
    let unschedulable = until("the scheduler's verdict", || async {
        let (_, p) = api.get(&format!("{PODS}/waits")).await;
        let conds = p["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conds
            .into_iter()
            .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
    })
    .await;
    assert_eq!(unschedulable["reason"], "Unschedulable");
    let message = unschedulable["message"].as_str().unwrap();
    assert!(
        message.starts_with("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector."),
        "{message}"
    );
    // Freeing the GPUs lets the waiting pod in.
    assert_eq!(api.delete(&format!("{PODS}/fits")).await.0, 200);
    until("the waiting pod to run", || async {
        let (_, p) = api.get(&format!("{PODS}/waits")).await;
        (p["status"]["phase"] == "Running").then_some(())
    })
    .await;
}

#[tokio::test]
async fn pods_without_a_command_or_with_a_missing_image_do_not_run() {
    let (_standin, api, _dir) = start().await;
    let mut missing = pod("pull", "true");
    missing["spec"]["containers"][0]["image"] = json!("registry.example/does-not-exist:1");
    assert_eq!(api.post(PODS, missing).await.0, 201);
    let mut bare = pod("bare", "true");
    bare["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("command");
    assert_eq!(api.post(PODS, bare).await.0, 201);
    let waiting = |name: &'static str, reason: &'static str| {
        let api = &api;
        until(reason, move || async move {
            let (_, p) = api.get(&format!("{PODS}/{name}")).await;
            (p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == reason)
                .then_some(p)
        })
    };
    let pulling = waiting("pull", "ImagePullBackOff").await;
    assert_eq!(pulling["status"]["phase"], "Pending");
    let bare = waiting("bare", "StandInNeedsCommand").await;
    assert_eq!(bare["status"]["phase"], "Failed");
}

#[tokio::test]
async fn a_suspended_job_waits_until_resumed() {
    let (standin, api, _dir) = start().await;
    let mut j = job("later", "exit 0");
    j["spec"]["suspend"] = json!(true);
    assert_eq!(api.post(JOBS, j).await.0, 201);
    let suspended = job_condition(&api, "later", "Suspended").await;
    assert!(
        suspended["status"].get("startTime").is_none(),
        "{suspended}"
    );
    assert!(
        standin.objects("pods").is_empty(),
        "a suspended job makes no pods"
    );
    let (code, resumed) = api
        .merge_patch(
            &format!("{JOBS}/later"),
            json!({"spec": {"suspend": false}}),
        )
        .await;
    assert_eq!(code, 200, "{resumed}");
    assert_eq!(resumed["metadata"]["generation"], 2);
    let done = job_condition(&api, "later", "Complete").await;
    let suspended = done["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Suspended")
        .cloned();
    assert_eq!(suspended.map(|c| c["status"].clone()), Some(json!("False")));
    assert_eq!(done["status"]["succeeded"], 1);
}

#[tokio::test]
async fn an_index_past_its_backoff_limit_fails_the_indexed_job_once_all_are_done() {
    let (_standin, api, _dir) = start().await;
    let mut j = job(
        "per-index",
        "[ \"$JOB_COMPLETION_INDEX\" = 1 ] && exit 3; exit 0",
    );
    j["spec"]["completionMode"] = json!("Indexed");
    j["spec"]["completions"] = json!(3);
    j["spec"]["parallelism"] = json!(3);
    j["spec"]["backoffLimitPerIndex"] = json!(1);
    j["spec"].as_object_mut().unwrap().remove("backoffLimit");
    assert_eq!(api.post(JOBS, j).await.0, 201);
    let failed = job_condition(&api, "per-index", "Failed").await;
    assert_eq!(
        condition(&failed, "Failed").unwrap()["reason"],
        "FailedIndexes"
    );
    assert_eq!(failed["status"]["completedIndexes"], "0,2");
    assert_eq!(failed["status"]["failedIndexes"], "1");
    assert_eq!(
        failed["status"]["failed"], 2,
        "index 1 ran twice: once, and one retry"
    );

    let mut fail_index = job("fail-index", "exit 3");
    fail_index["spec"]["completionMode"] = json!("Indexed");
    fail_index["spec"]["completions"] = json!(2);
    fail_index["spec"]["backoffLimitPerIndex"] = json!(5);
    fail_index["spec"]["podFailurePolicy"] = json!({"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [3]}}]});
    assert_eq!(api.post(JOBS, fail_index).await.0, 201);
    let failed = job_condition(&api, "fail-index", "Failed").await;
    assert_eq!(failed["status"]["failedIndexes"], "0-1");
    assert_eq!(failed["status"]["failed"], 2, "FailIndex retries nothing");
}

#[tokio::test]
async fn claims_bind_at_once_and_services_get_a_cluster_address() {
    let (standin, api, _dir) = start().await;
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let (code, claim) = api
        .post("/api/v1/namespaces/meridian/persistentvolumeclaims", claim)
        .await;
    assert_eq!(code, 201, "{claim}");
    assert_eq!(claim["status"]["phase"], "Bound");
    assert_eq!(claim["status"]["capacity"]["storage"], "1Gi");
    assert_eq!(
        claim["spec"]["volumeName"],
        format!("pvc-{}", claim["metadata"]["uid"].as_str().unwrap())
    );
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}});
    let (code, service) = api
        .post("/api/v1/namespaces/meridian/services", service)
        .await;
    assert_eq!(code, 201, "{service}");
    let ip = service["spec"]["clusterIP"].as_str().unwrap();
    assert!(ip.starts_with("10.96."), "{ip}");
    assert_eq!(service["spec"]["clusterIPs"], json!([ip]));
    assert_eq!(standin.created("persistentvolumeclaims"), 1);
    assert_eq!(standin.created("services"), 1);
    let before = standin.requests();
    assert_eq!(
        api.get("/api/v1/namespaces/meridian/services/web").await.0,
        200
    );
    assert_eq!(standin.requests(), before + 1);
}
