//! The adapter's view of its namespace: one watch each on Jobs, Pods and Deployments
//! labelled as Meridian's, kept in kube-runtime reflector caches and listed again every
//! resync period in case an event was missed. A second task stops the pods of array
//! tasks that were cancelled before they started (an Indexed Job cannot skip an index).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use meridian_adapter_core::AdapterError;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use crate::manifest::{self, COMPLETION_INDEX, JOB_ID};
use crate::{state, tasks_of, Cancelled};

/// The tasks of an Indexed Job that were cancelled, by completion index (JSON map of
/// index → when), so a restarted adapter still reports them cancelled.
pub const CANCELLED_TASKS: &str = "meridian.io/cancelled-tasks";

/// How long the first listing may take before calls fail as unavailable.
const FIRST_SYNC: Duration = Duration::from_secs(20);

pub struct Watches {
    pub jobs: Store<Job>,
    pub pods: Store<Pod>,
    pub deployments: Store<Deployment>,
    problems: Arc<Mutex<BTreeMap<&'static str, String>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Watches {
    pub fn start(
        client: &Client,
        namespace: &str,
        resync: Duration,
        cancelled: Arc<Mutex<HashMap<String, Cancelled>>>,
    ) -> Watches {
        let problems = Arc::new(Mutex::new(BTreeMap::new()));
        let (jobs, job_task) = follow::<Job>(
            Api::namespaced(client.clone(), namespace),
            "Jobs",
            resync,
            problems.clone(),
        );
        let (pods, pod_task) = follow::<Pod>(
            Api::namespaced(client.clone(), namespace),
            "Pods",
            resync,
            problems.clone(),
        );
        let (deployments, deployment_task) = follow::<Deployment>(
            Api::namespaced(client.clone(), namespace),
            "Deployments",
            resync,
            problems.clone(),
        );
        let reaper = tokio::spawn(reap(
            Api::namespaced(client.clone(), namespace),
            jobs.clone(),
            pods.clone(),
            cancelled,
        ));
        Watches {
            jobs,
            pods,
            deployments,
            problems,
            tasks: vec![job_task, pod_task, deployment_task, reaper],
        }
    }

    /// Waits until every cache has listed once; `Unavailable` with the watches' last
    /// error when the cluster does not answer.
    pub async fn ready(&self) -> Result<(), AdapterError> {
        let all = async {
            let _ = self.jobs.wait_until_ready().await;
            let _ = self.pods.wait_until_ready().await;
            let _ = self.deployments.wait_until_ready().await;
        };
        tokio::time::timeout(FIRST_SYNC, all).await.map_err(|_| {
            AdapterError::Unavailable(
                self.problem()
                    .unwrap_or_else(|| "the cluster has not answered the first listing".into()),
            )
        })
    }

    /// The watches' current trouble, if any.
    pub fn problem(&self) -> Option<String> {
        let problems = self.problems.lock().expect("problems");
        (!problems.is_empty()).then(|| {
            problems
                .iter()
                .map(|(what, e)| format!("{what}: {e}"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// The pods of Job `name` (of one completion index, for a task), oldest first.
    pub fn pods_of(&self, name: &str, index: Option<u32>) -> Vec<Arc<Pod>> {
        let index = index.map(|i| i.to_string());
        sorted(self.pods.state_filter(|pod| {
            let labels = pod.labels();
            let of_job = labels
                .get("batch.kubernetes.io/job-name")
                .map(String::as_str)
                == Some(name)
                || labels.get("job-name").map(String::as_str) == Some(name);
            of_job
                && index.as_ref().is_none_or(|i| {
                    labels.get(COMPLETION_INDEX) == Some(i)
                        || pod.annotations().get(COMPLETION_INDEX) == Some(i)
                })
        }))
    }

    /// The pods of the service whose Deployment is `name`, oldest first.
    pub fn service_pods(&self, name: &str) -> Vec<Arc<Pod>> {
        let Some(id) = name.strip_prefix("meridian-") else {
            return Vec::new();
        };
        sorted(self.pods.state_filter(|pod| {
            pod.labels().get(JOB_ID).map(String::as_str) == Some(id)
                && pod.labels().get(manifest::ROLE).map(String::as_str) == Some("service")
        }))
    }
}

fn sorted(mut pods: Vec<Arc<Pod>>) -> Vec<Arc<Pod>> {
    pods.sort_by(|a, b| {
        (a.creation_timestamp(), a.name_any()).cmp(&(b.creation_timestamp(), b.name_any()))
    });
    pods
}

/// Keeps a cache of the objects of `api` labelled as Meridian's, listing again every
/// `resync`; the last error of each watch is kept in `problems` until it recovers.
fn follow<K>(
    api: Api<K>,
    what: &'static str,
    resync: Duration,
    problems: Arc<Mutex<BTreeMap<&'static str, String>>>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, mut writer) = reflector::store::<K>();
    let task = tokio::spawn(async move {
        loop {
            let config = watcher::Config::default().labels(&manifest::managed_selector());
            let mut events = watcher(api.clone(), config).default_backoff().boxed();
            let until = tokio::time::Instant::now() + resync;
            loop {
                match tokio::time::timeout_at(until, events.next()).await {
                    Ok(Some(Ok(event))) => {
                        writer.apply_watcher_event(&event);
                        if matches!(event, watcher::Event::InitDone) {
                            problems.lock().expect("problems").remove(what);
                        }
                    }
                    Ok(Some(Err(e))) => {
                        tracing::warn!(what, error = %e, "watching the Kubernetes namespace");
                        problems
                            .lock()
                            .expect("problems")
                            .insert(what, e.to_string());
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
    });
    (reader, task)
}

/// Whether the Job has ended (Complete or Failed).
pub fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// The completion indexes cancelled on this Job, and when.
pub fn cancelled_tasks(job: &Job) -> BTreeMap<u32, chrono::DateTime<Utc>> {
    job.annotations()
        .get(CANCELLED_TASKS)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// Marks task `index` of Job `name` cancelled on the Job itself.
pub async fn mark_cancelled(jobs: &Api<Job>, name: &str, index: u32) -> Result<(), AdapterError> {
    // Read, add, write with the read's resourceVersion: two cancels at once cannot lose
    // each other's mark (the second is refused with a conflict and tried again).
    for _ in 0..5 {
        let job = match jobs.get_opt(name).await {
            Ok(Some(job)) => job,
            Ok(None) => return Ok(()),
            Err(e) => return Err(crate::api_error("reading the Job", e)),
        };
        let mut marks = cancelled_tasks(&job);
        if marks.contains_key(&index) {
            return Ok(());
        }
        marks.insert(index, Utc::now());
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": job.resource_version(),
                "annotations": {CANCELLED_TASKS: serde_json::to_string(&marks).expect("plain data")},
            }
        });
        match jobs
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(e) => return Err(crate::api_error("marking a task cancelled", e)),
        }
    }
    Err(AdapterError::Unavailable(
        "marking a task cancelled: the Job kept changing".into(),
    ))
}

/// Whether every task of an Indexed Job has ended or been cancelled, so the Job can go.
pub fn all_tasks_settled(job: &Job, cancelled: &HashMap<String, Cancelled>) -> bool {
    let name = job.name_any();
    let marks = cancelled_tasks(job);
    let status = job.status.as_ref();
    let count = tasks_of(job).map_or(0, |t| t.len() as u32);
    (0..count).all(|n| {
        marks.contains_key(&n)
            || cancelled.contains_key(&format!("{name}/{n}"))
            || state::in_intervals(status.and_then(|s| s.completed_indexes.as_deref()), n)
            || state::in_intervals(status.and_then(|s| s.failed_indexes.as_deref()), n)
    })
}

/// Stops, once a second, the pods of cancelled tasks that the Job controller started
/// after the cancel.
async fn reap(
    pods: Api<Pod>,
    jobs: Store<Job>,
    cache: Store<Pod>,
    cancelled: Arc<Mutex<HashMap<String, Cancelled>>>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let mut doomed = Vec::new();
        for job in jobs.state() {
            let name = job.name_any();
            let mut marked: Vec<u32> = cancelled_tasks(&job).into_keys().collect();
            let prefix = format!("{name}/");
            marked.extend(
                cancelled
                    .lock()
                    .expect("cancel map")
                    .keys()
                    .filter_map(|k| k.strip_prefix(&prefix)?.parse::<u32>().ok()),
            );
            if marked.is_empty() {
                continue;
            }
            for pod in cache.state() {
                let labels = pod.labels();
                let running = pod.metadata.deletion_timestamp.is_none()
                    && matches!(
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Pending" | "Running") | None
                    );
                let index = labels
                    .get(COMPLETION_INDEX)
                    .and_then(|i| i.parse::<u32>().ok());
                if running
                    && labels.get("batch.kubernetes.io/job-name") == Some(&name)
                    && index.is_some_and(|i| marked.contains(&i))
                {
                    doomed.push(pod.name_any());
                }
            }
        }
        for pod in doomed {
            if let Err(e) = pods.delete(&pod, &DeleteParams::background()).await {
                // Tried again on the next tick while the pod still runs.
                tracing::warn!(pod, error = %e, "stopping a cancelled task's pod");
            }
        }
    }
}
