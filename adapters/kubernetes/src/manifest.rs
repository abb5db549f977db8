//! What Meridian asks a cluster to create, built as `k8s-openapi` objects from a job
//! request and the site's configuration. Pure: the golden tests pin every case.
//!
//! - a job → one `batch/v1` Job, `backoffLimit: 0` (Meridian owns retries), with a
//!   `podFailurePolicy` so a disruption and the job's own exit code end it with different
//!   reasons;
//! - an array → one Indexed Job whose pods find their task by `JOB_COMPLETION_INDEX`;
//! - a service → a Deployment and a ClusterIP Service;
//! - a workflow volume → a PersistentVolumeClaim.
//!
//! Every object carries Meridian's ids as labels, and a deterministic name, so a restarted
//! adapter finds what it created and a second create of the same thing is refused by the
//! cluster itself.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EnvVar, LocalObjectReference, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    Service, ServicePort, ServiceSpec, TCPSocketAction, Toleration, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use meridian_adapter_core::batch::{quote_with_index, task_table, ArrayTasks};
use meridian_adapter_core::{ArrayRequest, JobRequest};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::{is_label_value, KubernetesConfig};
use crate::gpu::GpuPlacement;

pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const JOB_ID: &str = "meridian.io/job-id";
pub const WORKFLOW_ID: &str = "meridian.io/workflow-id";
pub const BATCH_ID: &str = "meridian.io/batch-id";
pub const TENANT: &str = "meridian.io/tenant";
pub const ROLE: &str = "meridian.io/role";
/// An Indexed Job's tasks, in completion-index order (JSON).
pub const TASKS: &str = "meridian.io/tasks";
/// What was asked for, for the bill (JSON [`Requested`]).
pub const REQUESTED: &str = "meridian.io/requested";
/// A service's restart limit.
pub const MAX_RESTARTS: &str = "meridian.io/max-restarts";
pub const KUEUE_QUEUE: &str = "kueue.x-k8s.io/queue-name";
/// The job completion index the Job controller sets on each pod of an Indexed Job.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The one container of every pod Meridian creates.
pub const CONTAINER: &str = "main";

/// The label selector of everything this adapter creates.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY}=meridian")
}

/// The Job, or the Deployment and Service, of Meridian job `id`.
pub fn object_name(id: Uuid) -> String {
    format!("meridian-{id}")
}

/// The claim that holds `volume` of `workflow` at this site. A volume name that is not
/// already lower-case letters, digits and inner `-` gets a hash of itself appended, so
/// `Data` and `data`, or `a_b` and `a-b`, stay two claims.
pub fn claim_name(workflow: Uuid, volume: &str) -> String {
    let lowered: String = volume
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let tidy = lowered.trim_matches('-');
    if tidy == volume {
        return format!("meridian-{workflow}-{tidy}");
    }
    // FNV-1a: stable across builds, which a claim's name must be.
    let hash = volume.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    match tidy {
        "" => format!("meridian-{workflow}-{hash:08x}"),
        tidy => format!("meridian-{workflow}-{tidy}-{hash:08x}"),
    }
}

/// What a run asked for, kept on its object so a restarted adapter bills it the same.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Requested {
    pub cpus: u32,
    pub memory_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The image reference a pod runs: the spec's `docker://` scheme dropped. An Apptainer
/// image (a `.sif` path, `library://`, `oras://`) cannot run in a pod.
fn image_reference(job: &JobRequest, config: &KubernetesConfig) -> Result<String, String> {
    let Some(image) = job.container_image() else {
        return Ok(config.host_image.clone());
    };
    match image.split_once("://") {
        Some(("docker", reference)) => Ok(reference.to_string()),
        None if !image.starts_with('/') => Ok(image.to_string()),
        _ => Err(format!(
            "a Kubernetes site runs OCI images (docker://…); {image} is not one"
        )),
    }
}

/// Why a request can never run on a Kubernetes site.
fn check(job: &JobRequest) -> Result<(), String> {
    job.check()?;
    if job.resources.nodes > 1 {
        return Err(format!(
            "a Kubernetes site runs a job on one node; this one asks for {} nodes",
            job.resources.nodes
        ));
    }
    Ok(())
}

/// Kubernetes expands `$(VAR)` in commands, arguments and variables, and `$$` to `$`:
/// doubling every `$` keeps what the job wrote exactly as it wrote it, as on every other
/// site.
fn literal(s: &str) -> String {
    s.replace('$', "$$")
}

fn memory_quantity(bytes: u64) -> Quantity {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")];
    for (size, unit) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return Quantity(format!("{}{unit}", bytes / size));
        }
    }
    Quantity(bytes.to_string())
}

fn walltime_seconds(job: &JobRequest) -> i64 {
    (job.resources.walltime.as_secs_f64().ceil() as i64).max(1)
}

fn labels(config: &KubernetesConfig, job: &JobRequest, role: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (MANAGED_BY.to_string(), "meridian".to_string()),
        (ROLE.to_string(), role.to_string()),
        (WORKFLOW_ID.to_string(), job.workflow_id.to_string()),
    ]);
    if let Some(tenant) = job.tenant.as_deref().filter(|t| is_label_value(t)) {
        labels.insert(TENANT.into(), tenant.into());
    }
    if let Some(queue) = &config.kueue_queue {
        labels.insert(KUEUE_QUEUE.into(), queue.clone());
    }
    labels
}

fn annotations(job: &JobRequest, gpu: Option<&GpuPlacement>) -> BTreeMap<String, String> {
    let requested = Requested {
        cpus: job.resources.cpus,
        memory_bytes: job.resources.memory_bytes,
        gpus: gpu.map_or(0, |g| g.count),
        gpu_vendor: gpu.map(|g| g.vendor.as_str().to_string()),
        gpu_model: gpu.and_then(|g| g.model.clone()),
    };
    let mut annotations = BTreeMap::from([(
        REQUESTED.to_string(),
        serde_json::to_string(&requested).expect("plain data"),
    )]);
    if let Some(tenant) = &job.tenant {
        annotations.insert(TENANT.into(), tenant.clone());
    }
    annotations
}

/// How the pod's one container starts: its command (or the image's own when `None`),
/// and the variables Meridian adds.
struct Start {
    command: Option<Vec<String>>,
    env: BTreeMap<String, String>,
}

fn start_of(job: &JobRequest) -> Start {
    let mut env = job.env.clone();
    for (volume, at) in &job.mounts {
        env.insert(meridian_adapter_core::volume_variable(volume), at.clone());
    }
    if let Some(port) = job.service_port() {
        env.insert("MERIDIAN_SERVICE_PORT".into(), port.to_string());
    }
    env.extend(job.meridian_env());
    let command = job.task_command();
    Start {
        command: (!command.is_empty()).then_some(command),
        env,
    }
}

/// An array's tasks share the template's start, behind a shell that sets each task's ids
/// from `JOB_COMPLETION_INDEX` (the n-th task has completion index n).
fn array_start(array: &ArrayRequest) -> Result<Start, String> {
    let template = &array.template;
    if template.command.is_empty() {
        return Err(
            "an array on a Kubernetes site needs a command: a shell in the image \
             sets each task's ids before it runs"
                .into(),
        );
    }
    let mut start = start_of(template);
    for own in ["MERIDIAN_JOB_ID", "MERIDIAN_ARRAY_INDEX", "ARRAY_INDEX"] {
        start.env.remove(own);
    }
    let tasks = ArrayTasks {
        index_var: "JOB_COMPLETION_INDEX",
        tasks: array
            .tasks
            .iter()
            .enumerate()
            .map(|(n, task)| (n as u32, task))
            .collect(),
    };
    let line: Vec<String> = template
        .command
        .iter()
        .map(|a| quote_with_index(a))
        .collect();
    let script = format!("{}exec {}\n", task_table(&tasks), line.join(" "));
    start.command = Some(vec!["/bin/sh".into(), "-c".into(), script]);
    Ok(start)
}

fn pod_spec(
    config: &KubernetesConfig,
    job: &JobRequest,
    gpu: Option<&GpuPlacement>,
    start: Start,
    restart_policy: &str,
) -> Result<PodSpec, String> {
    let image = image_reference(job, config)?;
    let mut limits = BTreeMap::from([
        ("cpu".to_string(), Quantity(job.resources.cpus.to_string())),
        (
            "memory".to_string(),
            memory_quantity(job.resources.memory_bytes),
        ),
    ]);
    let requests = limits.clone();
    let mut affinity = None;
    let mut tolerations = None;
    if let Some(gpu) = gpu {
        limits.insert(
            gpu.vendor.resource().to_string(),
            Quantity(gpu.count.to_string()),
        );
        if !gpu.values.is_empty() {
            affinity = Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: gpu.label_key.clone(),
                                operator: "In".into(),
                                values: Some(gpu.values.clone()),
                            }]),
                            ..Default::default()
                        }],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        // GPU nodes are commonly tainted with their resource's name so that only pods
        // asking for GPUs land there.
        tolerations = Some(vec![Toleration {
            key: Some(gpu.vendor.resource().into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
    }
    let (volumes, mounts): (Vec<Volume>, Vec<VolumeMount>) = job
        .mounts
        .iter()
        .enumerate()
        .map(|(n, (volume, at))| {
            let name = format!("volume-{n}");
            (
                Volume {
                    name: name.clone(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim_name(job.workflow_id, volume),
                        read_only: None,
                    }),
                    ..Default::default()
                },
                VolumeMount {
                    name,
                    mount_path: at.clone(),
                    ..Default::default()
                },
            )
        })
        .unzip();
    let readiness = job.service_port().map(|port| Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(port.into()),
            host: None,
        }),
        period_seconds: Some(2),
        ..Default::default()
    });
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image),
        command: start
            .command
            .map(|c| c.iter().map(|a| literal(a)).collect()),
        env: Some(
            start
                .env
                .iter()
                .map(|(name, value)| EnvVar {
                    name: name.clone(),
                    value: Some(literal(value)),
                    value_from: None,
                })
                .collect(),
        ),
        working_dir: job.cwd.clone(),
        resources: Some(ResourceRequirements {
            limits: Some(limits),
            requests: Some(requests),
            ..Default::default()
        }),
        ports: job.service_port().map(|port| {
            vec![ContainerPort {
                container_port: port.into(),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]
        }),
        readiness_probe: readiness,
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        ..Default::default()
    };
    Ok(PodSpec {
        containers: vec![container],
        restart_policy: Some(restart_policy.into()),
        service_account_name: config.service_account.clone(),
        image_pull_secrets: (!config.image_pull_secrets.is_empty()).then(|| {
            config
                .image_pull_secrets
                .iter()
                .map(|name| LocalObjectReference { name: name.clone() })
                .collect()
        }),
        priority_class_name: config.priority_class.clone(),
        affinity,
        tolerations,
        volumes: (!volumes.is_empty()).then_some(volumes),
        // Every Service in the namespace would otherwise add its variables to every pod:
        // with many services, more than a process's environment can hold.
        enable_service_links: Some(false),
        ..Default::default()
    })
}

fn failure_policy(action: &str) -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            // A disruption (preemption, eviction, a lost node) is the site's doing: the
            // adapter reports it as a site fault and Meridian places the work again.
            PodFailurePolicyRule {
                action: action.into(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                }]),
                on_exit_codes: None,
            },
            // The job's own non-zero exit ends it at once with that code.
            PodFailurePolicyRule {
                action: action.into(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(CONTAINER.into()),
                    operator: "NotIn".into(),
                    values: vec![0],
                }),
                on_pod_conditions: None,
            },
        ],
    }
}

fn meta(
    name: String,
    config: &KubernetesConfig,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(config.namespace.clone()),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    }
}

/// The Job that runs `job`.
pub fn job(
    config: &KubernetesConfig,
    job: &JobRequest,
    gpu: Option<&GpuPlacement>,
) -> Result<Job, String> {
    check(job)?;
    let mut labels = labels(config, job, "job");
    labels.insert(JOB_ID.into(), job.job_id.to_string());
    let mut pod_labels = labels.clone();
    pod_labels.remove(KUEUE_QUEUE);
    Ok(Job {
        metadata: meta(
            object_name(job.job_id),
            config,
            labels,
            annotations(job, gpu),
        ),
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            pod_failure_policy: Some(failure_policy("FailJob")),
            ttl_seconds_after_finished: Some(config.ttl_seconds_after_finished as i32),
            suspend: config.kueue_queue.as_ref().map(|_| true),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    // On the pod, not the Job: a Job's deadline counts from its start,
                    // time spent unscheduled included, and would fail a job for waiting.
                    active_deadline_seconds: Some(walltime_seconds(job)),
                    ..pod_spec(config, job, gpu, start_of(job), "Never")?
                }),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// One task of an Indexed Job, as kept in its [`TASKS`] annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEntry {
    pub index: u32,
    pub job_id: Uuid,
}

/// The Indexed Job that runs `array`: its n-th task has completion index n, each index
/// fails alone (`backoffLimitPerIndex: 0`), and each pod has the walltime.
pub fn array_job(
    config: &KubernetesConfig,
    array: &ArrayRequest,
    gpu: Option<&GpuPlacement>,
) -> Result<Job, String> {
    let template = &array.template;
    check(template)?;
    if array.tasks.is_empty() {
        return Err("an array with no tasks".into());
    }
    let start = array_start(array)?;
    let mut labels = labels(config, template, "array");
    labels.insert(BATCH_ID.into(), array.batch_id.to_string());
    let mut pod_labels = labels.clone();
    pod_labels.remove(KUEUE_QUEUE);
    let mut annotations = annotations(template, gpu);
    let tasks: Vec<TaskEntry> = array
        .tasks
        .iter()
        .map(|t| TaskEntry {
            index: t.index,
            job_id: t.job_id,
        })
        .collect();
    annotations.insert(
        TASKS.into(),
        serde_json::to_string(&tasks).expect("plain data"),
    );
    let spec = PodSpec {
        active_deadline_seconds: Some(walltime_seconds(template)),
        ..pod_spec(config, template, gpu, start, "Never")?
    };
    let count = array.tasks.len() as i32;
    Ok(Job {
        metadata: meta(object_name(array.batch_id), config, labels, annotations),
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(count),
            parallelism: Some((array.cap.max(1) as i32).min(count)),
            backoff_limit_per_index: Some(0),
            pod_failure_policy: Some(failure_policy("FailIndex")),
            ttl_seconds_after_finished: Some(config.ttl_seconds_after_finished as i32),
            suspend: config.kueue_queue.as_ref().map(|_| true),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(spec),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// The Deployment and ClusterIP Service of a service job.
pub fn service(
    config: &KubernetesConfig,
    job: &JobRequest,
    gpu: Option<&GpuPlacement>,
) -> Result<(Deployment, Service), String> {
    check(job)?;
    let Some(request) = &job.service else {
        return Err("not a service".into());
    };
    let mut labels = labels(config, job, "service");
    labels.remove(KUEUE_QUEUE);
    labels.insert(JOB_ID.into(), job.job_id.to_string());
    let selector = BTreeMap::from([(JOB_ID.to_string(), job.job_id.to_string())]);
    let mut annotations = annotations(job, gpu);
    annotations.insert(MAX_RESTARTS.into(), request.max_restarts.to_string());
    let name = object_name(job.job_id);
    let deployment = Deployment {
        metadata: meta(name.clone(), config, labels.clone(), annotations.clone()),
        spec: Some(DeploymentSpec {
            replicas: Some(request.min_replicas.max(1) as i32),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..Default::default()
                }),
                spec: Some(pod_spec(config, job, gpu, start_of(job), "Always")?),
            },
            ..Default::default()
        }),
        status: None,
    };
    let service = Service {
        metadata: meta(name, config, labels, annotations),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("service".into()),
                port: request.port.into(),
                target_port: Some(IntOrString::Int(request.port.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    };
    Ok((deployment, service))
}

/// The claims of the volumes `job` mounts: one per workflow volume, of its declared size.
pub fn claims(
    config: &KubernetesConfig,
    job: &JobRequest,
) -> Result<Vec<PersistentVolumeClaim>, String> {
    job.mounts
        .keys()
        .map(|volume| {
            let Some(&size) = job.volume_sizes.get(volume) else {
                return Err(format!(
                    "volume {volume} has no declared size, so no claim can be made for it"
                ));
            };
            let mut labels = labels(config, job, "volume");
            labels.remove(KUEUE_QUEUE);
            Ok(PersistentVolumeClaim {
                metadata: meta(
                    claim_name(job.workflow_id, volume),
                    config,
                    labels,
                    BTreeMap::from([("meridian.io/volume".to_string(), volume.clone())]),
                ),
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec![config.volume_access_mode.clone()]),
                    storage_class_name: config.storage_class.clone(),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".to_string(),
                            memory_quantity(size),
                        )])),
                        limits: None,
                    }),
                    ..Default::default()
                }),
                status: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_use_binary_units_when_exact() {
        assert_eq!(memory_quantity(64 << 20).0, "64Mi");
        assert_eq!(memory_quantity(2 << 30).0, "2Gi");
        assert_eq!(memory_quantity(1000).0, "1000");
    }

    #[test]
    fn dollars_reach_the_job_as_written() {
        assert_eq!(
            literal("echo $HOME $(date) $$"),
            "echo $$HOME $$(date) $$$$"
        );
    }

    #[test]
    fn images_lose_their_docker_scheme_and_apptainer_ones_are_refused() {
        let config = KubernetesConfig::new("m");
        let mut job =
            meridian_adapter_core::conformance::ConformanceOptions::new("/tmp").job("x", &["true"]);
        for (image, expected) in [
            (None, Ok("docker.io/library/busybox:1.37".to_string())),
            (Some("docker://python:3.12"), Ok("python:3.12".to_string())),
            (Some("ghcr.io/x/y:1"), Ok("ghcr.io/x/y:1".to_string())),
        ] {
            job.image = image.map(str::to_string);
            assert_eq!(image_reference(&job, &config), expected);
        }
        for image in ["/images/x.sif", "library://x/y", "oras://x/y"] {
            job.image = Some(image.into());
            let err = image_reference(&job, &config).unwrap_err();
            assert!(err.contains("OCI images"), "{err}");
        }
    }

    #[test]
    fn claim_names_are_object_names() {
        let w = Uuid::nil();
        assert_eq!(
            claim_name(w, "scratch-data"),
            "meridian-00000000-0000-0000-0000-000000000000-scratch-data"
        );
        let names =
            ["Scratch_Data", "scratch_data", "scratch-data", "_", "-"].map(|v| claim_name(w, v));
        let distinct: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert!(
            names.iter().all(|n| crate::config::is_dns_subdomain(n)),
            "{names:?}"
        );
    }
}
