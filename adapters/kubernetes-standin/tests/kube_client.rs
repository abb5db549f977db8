//! The real kube-rs client against the stand-in: what the Kubernetes adapter will do.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, LogParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config};
use meridian_kube_standin::{Options, StandIn};
use serde_json::json;

async fn client(standin: &StandIn) -> Client {
    let kubeconfig =
        Kubeconfig::from_yaml(&standin.kubeconfig("meridian")).expect("kubeconfig parses");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    assert_eq!(config.default_namespace, "meridian");
    Client::try_from(config).expect("client")
}

fn job(name: &str, script: &str) -> Job {
    serde_json::from_value(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "kube-rs"}}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}]}}}}))
    .unwrap()
}

#[tokio::test]
async fn kube_rs_drives_jobs_watches_logs_and_evictions() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options::new(dir.path());
    options.forbidden_namespaces.push("locked".into());
    let standin = StandIn::start(options).await.unwrap();
    let client = client(&standin).await;
    let jobs: Api<Job> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());

    // A watcher (list, then watch from the list's version) sees the job finish.
    let stream =
        watcher(jobs.clone(), watcher::Config::default().labels("team=kube")).applied_objects();
    let watched = tokio::spawn(async move {
        let mut finished = stream
            .try_filter(|j: &Job| {
                futures::future::ready(j.status.as_ref().and_then(|s| s.succeeded) == Some(1))
            })
            .boxed();
        finished.try_next().await
    });

    let mut j = job("hello", "echo hello from $HOSTNAME");
    j.metadata.labels = Some([("team".to_string(), "kube".to_string())].into());
    let created = jobs
        .create(&PostParams::default(), &j)
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some());
    let err = jobs
        .create(&PostParams::default(), &j)
        .await
        .expect_err("exists");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{err:?}"
    );

    let done = tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(jobs.clone(), "hello", conditions::is_job_completed()),
    )
    .await
    .expect("in time")
    .expect("no error")
    .expect("the job");
    assert_eq!(done.status.as_ref().and_then(|s| s.succeeded), Some(1));
    let seen = tokio::time::timeout(Duration::from_secs(60), watched)
        .await
        .expect("in time")
        .unwrap()
        .expect("watch");
    assert_eq!(seen.and_then(|j| j.metadata.name).as_deref(), Some("hello"));

    let listed = pods
        .list(&ListParams::default().labels("job-name=hello"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    let pod_name = listed.items[0].metadata.name.clone().unwrap();
    let log = pods
        .logs(
            &pod_name,
            &LogParams {
                container: Some("main".into()),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(log, format!("hello from {pod_name}\n"));

    let patch = json!({"metadata": {"annotations": {"meridian/attempt": "1"}}});
    let patched = jobs
        .patch("hello", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.annotations.unwrap()["meridian/attempt"],
        "1"
    );

    let sleeper: Pod = serde_json::from_value(
        json!({"metadata": {"name": "sleeper"}, "spec": {"restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "60"]}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &sleeper).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(pods.clone(), "sleeper", conditions::is_pod_running()),
    )
    .await
    .expect("in time")
    .unwrap();
    pods.evict("sleeper", &EvictParams::default())
        .await
        .expect("evicted");
    let evicted = pods.get("sleeper").await.unwrap();
    let status = evicted.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert!(status
        .conditions
        .unwrap()
        .iter()
        .any(|c| c.type_ == "DisruptionTarget" && c.status == "True"));

    let gone = jobs
        .delete("hello", &DeleteParams::background())
        .await
        .unwrap();
    assert!(gone.left().is_some(), "the deleted object comes back");
    tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(pods.clone(), &pod_name, conditions::is_deleted("")),
    )
    .await
    .expect("pod deleted in time")
    .unwrap();

    let locked: Api<Job> = Api::namespaced(client, "locked");
    let err = locked
        .list(&ListParams::default())
        .await
        .expect_err("forbidden");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err:?}"
    );
}
