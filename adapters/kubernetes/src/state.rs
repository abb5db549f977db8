//! What a Job, its pods or a Deployment say, in Meridian's job model. Pure: the objects
//! come in as the API gave them.
//!
//! | Kubernetes | Meridian |
//! |---|---|
//! | no pod yet, pod `Pending` (unscheduled, pulling) | `pending` |
//! | container running | `running` (its `startedAt`) |
//! | Job `Complete`, pod `Succeeded`, index in `completedIndexes` | `succeeded` |
//! | container exited non-zero | `failed`, `exit_code` |
//! | container `OOMKilled` | `failed`, `out_of_memory` |
//! | Job `DeadlineExceeded`, pod `DeadlineExceeded` | `failed`, `timeout` |
//! | pod condition `DisruptionTarget` (preemption, eviction, node pressure) | `failed`, `preempted` (a site fault: re-placed) |
//! | `DisruptionTarget` by taint manager or pod GC (node lost) | `failed`, `node_failure` (re-placed) |
//! | `InvalidImageName`, `ErrImageNeverPull`; a pull the registry refused (not found, denied) | `failed`, `image_unavailable` |
//! | pod refused by the kubelet at admission (`OutOfcpu`, …) | `failed`, `site_refused` (re-placed) |
//! | Job `Suspended` (Kueue) | `pending` |
//! | object deleted by a cancel | `cancelled` |

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use meridian_adapter_core::{FailureReason, JobState};

use crate::manifest::CONTAINER;

pub fn time(t: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

fn main_container(pod: &Pod) -> Option<&ContainerStatus> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses
        .iter()
        .find(|s| s.name == CONTAINER)
        .or(statuses.first())
}

fn terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    main_container(pod)?.state.as_ref()?.terminated.as_ref()
}

/// When the pod's container started, if it did.
pub fn started_at(pod: &Pod) -> Option<DateTime<Utc>> {
    let status = main_container(pod)?;
    let state = status.state.as_ref()?;
    state
        .running
        .as_ref()
        .and_then(|r| r.started_at.as_ref())
        .or_else(|| {
            state
                .terminated
                .as_ref()
                .and_then(|t| t.started_at.as_ref())
        })
        .map(time)
}

/// When the pod's container ended, if it did.
pub fn finished_at(pod: &Pod) -> Option<DateTime<Utc>> {
    terminated(pod)?.finished_at.as_ref().map(time)
}

fn condition_true<'a>(
    pod: &'a Pod,
    kind: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")
}

/// The site fault a `DisruptionTarget` condition names, if the pod has one.
pub fn disruption(pod: &Pod) -> Option<FailureReason> {
    let condition = condition_true(pod, "DisruptionTarget")?;
    Some(match condition.reason.as_deref() {
        Some("DeletionByTaintManager") | Some("DeletionByPodGC") => FailureReason::NodeFailure,
        _ => FailureReason::Preempted,
    })
}

/// Why the pod can never start, when its image cannot be had. A failed pull is final
/// only when the registry said the image is not there or not ours to pull; otherwise
/// (a timeout, a rate limit) the kubelet keeps trying and the run is still pending.
fn image_failure(pod: &Pod) -> Option<FailureReason> {
    let waiting = main_container(pod)?.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    let message = waiting.message.as_deref().unwrap_or("");
    let lowered = message.to_ascii_lowercase();
    let final_pull = [
        "not found",
        "manifest unknown",
        "unauthorized",
        "denied",
        "forbidden",
    ]
    .iter()
    .any(|m| lowered.contains(m));
    let failed = match reason {
        "InvalidImageName" | "ErrImageNeverPull" => true,
        "ErrImagePull" | "ImagePullBackOff" => final_pull,
        _ => false,
    };
    failed.then(|| FailureReason::ImageUnavailable {
        message: format!(
            "{reason}: {}",
            if message.is_empty() {
                "the image cannot be pulled"
            } else {
                message
            }
        ),
    })
}

/// What one pod says of its run; `None` while it has not started.
pub fn pod_state(pod: &Pod, now: DateTime<Utc>) -> Option<JobState> {
    let started = started_at(pod);
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let ended = || finished_at(pod).unwrap_or(now);
    if let Some(failure) = disruption(pod) {
        if phase == "Failed" || terminated(pod).is_some() {
            return Some(JobState::Failed {
                started_at: started,
                ended_at: ended(),
                exit_code: terminated(pod).map(|t| t.exit_code),
                failure,
            });
        }
    }
    if let Some(failure) = image_failure(pod) {
        return Some(JobState::Failed {
            started_at: None,
            ended_at: now,
            exit_code: None,
            failure,
        });
    }
    match phase {
        "Succeeded" => Some(JobState::Succeeded {
            started_at: started.unwrap_or_else(ended),
            ended_at: ended(),
        }),
        "Failed" => {
            let t = terminated(pod);
            let pod_reason = status.and_then(|s| s.reason.as_deref());
            let failure = if pod_reason == Some("DeadlineExceeded") {
                FailureReason::Timeout
            } else if let (None, Some(reason)) = (t, pod_reason) {
                // The kubelet refused the pod at admission (OutOfcpu, NodeAffinity,
                // UnexpectedAdmissionError): the node's doing, not the job's.
                FailureReason::SiteRefused {
                    message: format!(
                        "{reason}: {}",
                        status.and_then(|s| s.message.as_deref()).unwrap_or("")
                    ),
                }
            } else if t.and_then(|t| t.reason.as_deref()) == Some("OOMKilled") {
                FailureReason::OutOfMemory
            } else {
                match t.map(|t| t.exit_code) {
                    Some(code) => FailureReason::ExitCode { code },
                    None => FailureReason::Other {
                        message: status
                            .and_then(|s| s.message.clone())
                            .unwrap_or_else(|| "the pod failed".into()),
                    },
                }
            };
            Some(JobState::Failed {
                started_at: started,
                ended_at: ended(),
                exit_code: t.map(|t| t.exit_code),
                failure,
            })
        }
        _ => started.map(|started_at| JobState::Running { started_at }),
    }
}

fn job_condition<'a>(
    job: &'a Job,
    kind: &str,
) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")
}

/// Whether the Job is suspended (held by Kueue, or preempted by it): its pods are
/// being deleted and it will run again when admitted.
fn suspended(job: &Job) -> bool {
    job_condition(job, "Suspended").is_some()
}

/// The pods that speak for a Job that has not ended: one being deleted was stopped by
/// the Job controller (a suspension), and its failure is not the job's.
fn live_pods<'a>(job: &Job, pods: &[&'a Pod]) -> Vec<&'a Pod> {
    let ended = job_condition(job, "Complete").is_some() || job_condition(job, "Failed").is_some();
    pods.iter()
        .copied()
        .filter(|p| ended || p.metadata.deletion_timestamp.is_none() || disruption(p).is_some())
        .collect()
}

/// A plain Job's state, from the Job and its pods (newest last).
pub fn job_state(job: &Job, pods: &[&Pod], now: DateTime<Utc>) -> JobState {
    let pods = live_pods(job, pods);
    let pod = pods.last().copied();
    let from_pod = pod.and_then(|p| pod_state(p, now));
    let started = pod.and_then(started_at);
    if let Some(failed) = job_condition(job, "Failed") {
        let ended_at = failed
            .last_transition_time
            .as_ref()
            .map(time)
            .unwrap_or(now);
        match failed.reason.as_deref() {
            Some("DeadlineExceeded") => {
                return JobState::Failed {
                    started_at: started,
                    ended_at: pod.and_then(finished_at).unwrap_or(ended_at),
                    exit_code: pod.and_then(terminated).map(|t| t.exit_code),
                    failure: FailureReason::Timeout,
                }
            }
            _ => {
                if let Some(state @ JobState::Failed { .. }) = from_pod {
                    return state;
                }
                // The pod is gone: the controller's message still says which rule matched.
                let message = failed.message.clone().unwrap_or_default();
                let failure = if message.contains("DisruptionTarget") {
                    FailureReason::Preempted
                } else {
                    FailureReason::Other {
                        message: format!(
                            "{}: {message}",
                            failed.reason.as_deref().unwrap_or("Failed")
                        ),
                    }
                };
                return JobState::Failed {
                    started_at: started,
                    ended_at,
                    exit_code: None,
                    failure,
                };
            }
        }
    }
    if let Some(complete) = job_condition(job, "Complete") {
        let ended_at = pod
            .and_then(finished_at)
            .or_else(|| complete.last_transition_time.as_ref().map(time))
            .unwrap_or(now);
        return JobState::Succeeded {
            started_at: started.unwrap_or(ended_at),
            ended_at,
        };
    }
    if suspended(job) {
        return JobState::Pending;
    }
    from_pod.unwrap_or(JobState::Pending)
}

/// Why a pending run waits, as the cluster says: a suspended Job (Kueue holds it), a
/// pod no node can take yet (the scheduler's message), a container not started yet
/// (pulling its image, creating it).
pub fn waiting_reason(job: Option<&Job>, pods: &[&Pod]) -> Option<String> {
    if job.is_some_and(suspended) {
        return Some("the Job is suspended until its queue admits it (Kueue)".into());
    }
    let pod = pods.last()?;
    let status = pod.status.as_ref()?;
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(c) = unscheduled {
        return Some(format!(
            "{}: {}",
            c.reason.as_deref().unwrap_or("Unscheduled"),
            c.message
                .as_deref()
                .unwrap_or("no node can take the pod yet")
        ));
    }
    let waiting = main_container(pod)?.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    Some(match waiting.message.as_deref() {
        Some(message) if !message.is_empty() => format!("{reason}: {message}"),
        _ => reason.to_string(),
    })
}

/// Whether `index` is in an interval list such as `"0-3,5"`.
pub fn in_intervals(list: Option<&str>, index: u32) -> bool {
    list.unwrap_or("").split(',').any(|part| {
        let part = part.trim();
        match part.split_once('-') {
            Some((a, b)) => matches!((a.parse::<u32>(), b.parse::<u32>()), (Ok(a), Ok(b)) if a <= index && index <= b),
            None => part.parse::<u32>() == Ok(index),
        }
    })
}

/// The state of the task with completion `index` of an Indexed Job, from its pods
/// (newest last).
pub fn task_state(job: &Job, index: u32, pods: &[&Pod], now: DateTime<Utc>) -> JobState {
    let pods = live_pods(job, pods);
    let pod = pods.last().copied();
    let pod_says = pod.and_then(|p| pod_state(p, now));
    if suspended(job) && !pod_says.as_ref().is_some_and(JobState::is_terminal) {
        return JobState::Pending;
    }
    if let Some(state) = pod_says {
        if state.is_terminal() {
            return state;
        }
        // A running task of a Job that failed as a whole (its deadline) is stopped.
        if let Some(failed) = job_condition(job, "Failed") {
            if failed.reason.as_deref() == Some("DeadlineExceeded") {
                return JobState::Failed {
                    started_at: pod.and_then(started_at),
                    ended_at: now,
                    exit_code: None,
                    failure: FailureReason::Timeout,
                };
            }
        }
        return state;
    }
    let status = job.status.as_ref();
    let done_at = || {
        status
            .and_then(|s| s.completion_time.as_ref())
            .map(time)
            .unwrap_or(now)
    };
    if in_intervals(status.and_then(|s| s.completed_indexes.as_deref()), index) {
        let at = done_at();
        return JobState::Succeeded {
            started_at: at,
            ended_at: at,
        };
    }
    if in_intervals(status.and_then(|s| s.failed_indexes.as_deref()), index) {
        return JobState::Failed {
            started_at: None,
            ended_at: done_at(),
            exit_code: None,
            // While its Job exists, a pod goes early only with its node (pod garbage
            // collection): the site lost the task.
            failure: FailureReason::Lost,
        };
    }
    if job_condition(job, "Failed").is_some() || job_condition(job, "Complete").is_some() {
        // The Job ended before this index ran.
        return JobState::Failed {
            started_at: None,
            ended_at: done_at(),
            exit_code: None,
            failure: FailureReason::Other {
                message: "the Job ended before this task ran".into(),
            },
        };
    }
    JobState::Pending
}

/// A service's state from its Deployment and pods: running once a container runs,
/// failed once a container has restarted more than `max_restarts` times and is down.
/// The flag says whether a replica is ready (answers its readiness probe).
pub fn service_state(
    deployment: &Deployment,
    pods: &[&Pod],
    max_restarts: u32,
    now: DateTime<Utc>,
) -> (JobState, bool) {
    let ready = deployment
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0)
        > 0;
    let first_start = pods.iter().filter_map(|p| started_at(p)).min();
    for pod in pods {
        if let Some(failure) = image_failure(pod) {
            return (
                JobState::Failed {
                    started_at: None,
                    ended_at: now,
                    exit_code: None,
                    failure,
                },
                false,
            );
        }
        let Some(status) = main_container(pod) else {
            continue;
        };
        let down = status.state.as_ref().is_some_and(|s| s.running.is_none());
        if status.restart_count as i64 > max_restarts as i64 && down {
            let last = status
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .or_else(|| status.state.as_ref().and_then(|s| s.terminated.as_ref()));
            let code = last.map(|t| t.exit_code);
            return (
                JobState::Failed {
                    started_at: first_start,
                    ended_at: last
                        .and_then(|t| t.finished_at.as_ref())
                        .map(time)
                        .unwrap_or(now),
                    exit_code: code,
                    failure: match code {
                        Some(code) => FailureReason::ExitCode { code },
                        None => FailureReason::Other {
                            message: "the service kept crashing".into(),
                        },
                    },
                },
                false,
            );
        }
    }
    match first_start {
        Some(started_at) => (JobState::Running { started_at }, ready),
        None => (JobState::Pending, false),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    fn job(status: serde_json::Value) -> Job {
        serde_json::from_value(json!({"metadata": {"name": "meridian-x"}, "status": status}))
            .unwrap()
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "meridian-x-abcde"}, "status": status}))
            .unwrap()
    }

    fn waiting(reason: &str, message: &str) -> Pod {
        pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "main", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}}}]}))
    }

    #[test]
    fn a_pull_is_final_only_when_the_registry_refused_it() {
        let j = job(json!({}));
        let busy = waiting("ImagePullBackOff", "Back-off pulling image \"x\"");
        assert_eq!(job_state(&j, &[&busy], now()), JobState::Pending);
        let missing = waiting(
            "ErrImagePull",
            "failed to pull and unpack image \"x\": x: not found",
        );
        assert!(matches!(
            job_state(&j, &[&missing], now()),
            JobState::Failed {
                failure: FailureReason::ImageUnavailable { .. },
                ..
            }
        ));
    }

    #[test]
    fn a_pod_the_kubelet_refused_is_the_sites_fault() {
        let refused = pod(json!({"phase": "Failed", "reason": "OutOfcpu",
            "message": "Node didn't have enough resource: cpu"}));
        match pod_state(&refused, now()).unwrap() {
            JobState::Failed { failure, .. } => {
                assert!(failure.is_site_fault(), "{failure:?}");
                assert!(matches!(failure, FailureReason::SiteRefused { .. }));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_suspended_job_waits_whatever_its_deleted_pods_say() {
        let j = job(json!({"conditions": [{"type": "Suspended", "status": "True"}]}));
        let mut stopped = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "main", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}]}));
        stopped.metadata.deletion_timestamp = Some(Time("2026-12-02T12:00:00Z".parse().unwrap()));
        assert_eq!(job_state(&j, &[&stopped], now()), JobState::Pending);
        assert_eq!(task_state(&j, 0, &[&stopped], now()), JobState::Pending);
    }

    #[test]
    fn a_failed_index_whose_pod_is_gone_was_lost_by_the_site() {
        let j = job(json!({"failedIndexes": "1", "completedIndexes": "0,2-3"}));
        match task_state(&j, 1, &[], now()) {
            JobState::Failed { failure, .. } => assert_eq!(failure, FailureReason::Lost),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            task_state(&j, 3, &[], now()),
            JobState::Succeeded { .. }
        ));
        assert_eq!(task_state(&j, 4, &[], now()), JobState::Pending);
    }
}
