//! How a Meridian job becomes a Slurm batch job: the script, and what to ask Slurm for.
//! Both the command line (`sbatch` options) and slurmrestd (a job description) are made
//! from the one [`Plan`], so the two modes run a job the same way.
//!
//! The job's own environment is exported by the script rather than passed with
//! `sbatch --export`: `--export` splits its list at commas with no way to escape one, so
//! a value holding a comma would be cut. Meridian's own variables (`MERIDIAN_JOB_ID`…)
//! never hold commas and go in `--export` too, so prolog and epilog scripts see them.

use std::path::{Path, PathBuf};

use meridian_adapter_core::{AdapterError, ArrayRequest, JobRequest};

use crate::config::SlurmConfig;
use meridian_adapter_core::batch::{array_script, job_script, ArrayTasks, ScriptOptions};

/// The tag on every job Meridian submits (`--comment`), how a restarted adapter finds it.
pub fn tag(job_id: uuid::Uuid) -> String {
    format!("meridian:{job_id}")
}

/// Everything Slurm is asked for one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub name: String,
    pub comment: String,
    pub script: String,
    pub cwd: String,
    /// `--output`/`--error` patterns (`%j` is the Slurm job id).
    pub stdout: String,
    pub stderr: String,
    /// `MERIDIAN_JOB_ID` and friends.
    pub meridian_env: Vec<(String, String)>,
    pub nodes: u32,
    pub cpus_per_task: u32,
    /// Per node, in MiB (`--mem`); the partition's default when `None`.
    pub mem_mb: Option<u64>,
    /// Minutes, rounded up (`--time`); the partition's limit when `None`.
    pub time_minutes: Option<u64>,
    /// `gpu[:type]:N` per node (`--gres`).
    pub gres: Option<String>,
    /// The job's own (`jobs.NAME.slurm.partition`), else the site's.
    pub partition: Option<String>,
    /// `--qos`, when the job asks for one.
    pub qos: Option<String>,
    pub account: Option<String>,
    /// For an array: `--array`, the tasks' Slurm indices and cap (`1-5,9%2`).
    pub array: Option<String>,
}

/// An array as one Slurm submission: its plan, and the Slurm index of each task.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayPlan {
    pub plan: Plan,
    pub indices: Vec<u32>,
}

/// The output file of a job with this Slurm id (`%j`).
pub fn output_path(work_dir: &Path, slurm_job: &str, stream: &str) -> PathBuf {
    work_dir.join(format!("meridian-{slurm_job}.{stream}"))
}

/// A name Slurm and `scontrol -o` output carry safely: no spaces, no separators.
fn job_name(job: &JobRequest) -> String {
    let mut name: String = job
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    if name.is_empty() {
        name = "job".into();
    }
    match job.array_index {
        Some(i) => format!("{name}-{i}"),
        None => name,
    }
}

/// The GPU type Slurm's gres names use: the model, lowercased (`H100` → `h100`).
fn gpu_type(model: &str) -> String {
    model
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Plans `job` for `config`'s site, or says why it can never run there.
pub fn plan(job: &JobRequest, config: &SlurmConfig) -> Result<Plan, AdapterError> {
    job.check().map_err(AdapterError::Rejected)?;
    let cwd = work_cwd(job, config);
    let script = job_script(job, &script_options(&job_name(job), config, &cwd))
        .map_err(AdapterError::Rejected)?;
    Ok(plan_with(job, config, script, job.meridian_env()))
}

/// Plans `array` as one `sbatch --array` for `config`'s site. Each task keeps its
/// workflow index as its Slurm index when every index is below the site's
/// `max_array_size`; otherwise the tasks are numbered from 0 in order.
pub fn array_plan(array: &ArrayRequest, config: &SlurmConfig) -> Result<ArrayPlan, AdapterError> {
    let mut job = array.template.clone();
    job.array_index = None;
    job.check().map_err(AdapterError::Rejected)?;
    let n = array.tasks.len() as u32;
    if n == 0 || n > config.max_array_size {
        return Err(AdapterError::Rejected(format!(
            "an array of {n} tasks; this site takes 1 to {} (max_array_size)",
            config.max_array_size
        )));
    }
    let own = array.tasks.iter().all(|t| t.index < config.max_array_size);
    let indices: Vec<u32> = match own {
        true => array.tasks.iter().map(|t| t.index).collect(),
        false => (0..n).collect(),
    };
    let cwd = work_cwd(&job, config);
    let script = array_script(
        array,
        &script_options(&job_name(&job), config, &cwd),
        &ArrayTasks {
            index_var: "SLURM_ARRAY_TASK_ID",
            tasks: indices.iter().copied().zip(&array.tasks).collect(),
        },
    )
    .map_err(AdapterError::Rejected)?;
    let env = vec![(
        "MERIDIAN_WORKFLOW_ID".to_string(),
        job.workflow_id.to_string(),
    )];
    let mut plan = plan_with(&job, config, script, env);
    plan.comment = tag(array.batch_id);
    plan.stdout = output_path(&config.work_dir, "%A_%a", "out")
        .display()
        .to_string();
    plan.stderr = output_path(&config.work_dir, "%A_%a", "err")
        .display()
        .to_string();
    plan.array = Some(format!("{}%{}", ranges(&indices), array.cap.max(1)));
    Ok(ArrayPlan { plan, indices })
}

/// Ascending indices as Slurm writes them: `1-5,9,11-12`.
pub fn ranges(indices: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let start = indices[i];
        let mut end = start;
        while i + 1 < indices.len() && indices[i + 1] == end + 1 {
            i += 1;
            end = indices[i];
        }
        out.push(match start == end {
            true => start.to_string(),
            false => format!("{start}-{end}"),
        });
        i += 1;
    }
    out.join(",")
}

fn work_cwd(job: &JobRequest, config: &SlurmConfig) -> PathBuf {
    match &job.cwd {
        Some(cwd) => config.work_dir.join(cwd),
        None => config.work_dir.clone(),
    }
}

fn script_options<'a>(title: &'a str, config: &'a SlurmConfig, cwd: &'a Path) -> ScriptOptions<'a> {
    ScriptOptions {
        title,
        cd_to: None,
        cwd,
        container_runtime: config.container_runtime.as_deref(),
        scheduler: "Slurm",
        volume_root: config.volume_root.as_deref(),
    }
}

fn plan_with(
    job: &JobRequest,
    config: &SlurmConfig,
    script: String,
    meridian_env: Vec<(String, String)>,
) -> Plan {
    let cwd = work_cwd(job, config);

    let r = &job.resources;
    let mem_mb = (r.memory_bytes > 0).then(|| r.memory_bytes.div_ceil(1 << 20));
    let secs = r.walltime.as_secs() + u64::from(r.walltime.subsec_nanos() > 0);
    let time_minutes = (secs > 0).then(|| secs.div_ceil(60).max(1));
    let gres = r.gpus.as_ref().filter(|g| g.count > 0).map(|g| {
        match g.model.as_deref().map(gpu_type).filter(|t| !t.is_empty()) {
            Some(t) => format!("gpu:{t}:{}", g.count),
            None => format!("gpu:{}", g.count),
        }
    });
    let work_dir = &config.work_dir;
    Plan {
        name: job_name(job),
        comment: tag(job.job_id),
        script,
        cwd: cwd.display().to_string(),
        stdout: output_path(work_dir, "%j", "out").display().to_string(),
        stderr: output_path(work_dir, "%j", "err").display().to_string(),
        meridian_env,
        nodes: r.nodes.max(1),
        cpus_per_task: r.cpus.max(1),
        mem_mb,
        time_minutes,
        gres,
        partition: job
            .slurm
            .as_ref()
            .and_then(|s| s.partition.clone())
            .or_else(|| config.partition.clone()),
        qos: job.slurm.as_ref().and_then(|s| s.qos.clone()),
        account: config.account.clone(),
        array: None,
    }
}

/// The `sbatch` arguments for `plan`; the script goes on stdin.
pub fn sbatch_args(plan: &Plan) -> Vec<String> {
    let mut export = String::from("ALL");
    for (k, v) in &plan.meridian_env {
        export.push_str(&format!(",{k}={v}"));
    }
    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name={}", plan.name),
        format!("--comment={}", plan.comment),
        format!("--output={}", plan.stdout),
        format!("--error={}", plan.stderr),
        format!("--chdir={}", plan.cwd),
        format!("--export={export}"),
        format!("--nodes={}", plan.nodes),
        "--ntasks-per-node=1".into(),
        format!("--cpus-per-task={}", plan.cpus_per_task),
    ];
    if let Some(mb) = plan.mem_mb {
        args.push(format!("--mem={mb}"));
    }
    if let Some(minutes) = plan.time_minutes {
        args.push(format!("--time={minutes}"));
    }
    if let Some(gres) = &plan.gres {
        args.push(format!("--gres={gres}"));
    }
    if let Some(p) = &plan.partition {
        args.push(format!("--partition={p}"));
    }
    if let Some(q) = &plan.qos {
        args.push(format!("--qos={q}"));
    }
    if let Some(a) = &plan.account {
        args.push(format!("--account={a}"));
    }
    if let Some(array) = &plan.array {
        args.push(format!("--array={array}"));
    }
    args
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use meridian_adapter_core::{Gpus, Resources};
    use uuid::Uuid;

    use super::*;

    fn job() -> JobRequest {
        JobRequest {
            job_id: Uuid::nil(),
            workflow_id: Uuid::max(),
            name: "train model".into(),
            array_index: None,
            image: None,
            command: vec![
                "sh".into(),
                "-c".into(),
                "echo \"$GREETING\"; exit 3".into(),
            ],
            env: BTreeMap::from([("GREETING".into(), "hello, world's".into())]),
            cwd: None,
            resources: Resources {
                nodes: 2,
                cpus: 8,
                memory_bytes: (32 << 30) + 1,
                walltime: Duration::from_secs(61),
                gpus: Some(Gpus {
                    count: 4,
                    vendor: "nvidia".into(),
                    model: Some("H100".into()),
                }),
            },
            service: None,
            mounts: Default::default(),
            volume_sizes: Default::default(),
            tenant: None,
            shape: None,
            report_to: None,
            slurm: None,
        }
    }

    #[test]
    fn sbatch_gets_every_resource() {
        let mut config = SlurmConfig::cli("/scratch/m");
        config.partition = Some("gpu".into());
        config.account = Some("phys".into());
        let plan = plan(&job(), &config).unwrap();
        let nil = Uuid::nil();
        let max = Uuid::max();
        assert_eq!(
            sbatch_args(&plan),
            [
                "--parsable".to_string(),
                "--job-name=train_model".into(),
                format!("--comment=meridian:{nil}"),
                "--output=/scratch/m/meridian-%j.out".into(),
                "--error=/scratch/m/meridian-%j.err".into(),
                "--chdir=/scratch/m".into(),
                format!("--export=ALL,MERIDIAN_JOB_ID={nil},MERIDIAN_WORKFLOW_ID={max}"),
                "--nodes=2".into(),
                "--ntasks-per-node=1".into(),
                "--cpus-per-task=8".into(),
                "--mem=32769".into(),
                "--time=2".into(),
                "--gres=gpu:h100:4".into(),
                "--partition=gpu".into(),
                "--account=phys".into(),
            ]
        );
    }

    #[test]
    fn the_jobs_own_partition_and_qos_win_over_the_sites() {
        let mut config = SlurmConfig::cli("/w");
        config.partition = Some("cpu".into());
        let mut j = job();
        j.slurm = Some(meridian_adapter_core::SlurmOptions {
            partition: Some("gpu".into()),
            qos: Some("high".into()),
        });
        let args = sbatch_args(&plan(&j, &config).unwrap());
        assert!(args.contains(&"--partition=gpu".to_string()), "{args:?}");
        assert!(args.contains(&"--qos=high".to_string()), "{args:?}");
        assert!(!args.contains(&"--partition=cpu".to_string()), "{args:?}");
        j.slurm = Some(meridian_adapter_core::SlurmOptions {
            partition: None,
            qos: Some("low".into()),
        });
        let args = sbatch_args(&plan(&j, &config).unwrap());
        assert!(args.contains(&"--partition=cpu".to_string()), "{args:?}");
    }

    #[test]
    fn the_script_runs_the_command_as_given() {
        let mut j = job();
        j.array_index = Some(7);
        j.command = vec!["echo".into(), "cell-${ARRAY_INDEX}".into(), "$HOME".into()];
        j.resources.gpus = None;
        j.resources.walltime = Duration::ZERO;
        j.resources.memory_bytes = 0;
        let p = plan(&j, &SlurmConfig::cli("/w")).unwrap();
        assert_eq!(p.name, "train_model-7");
        assert_eq!((p.gres, p.time_minutes, p.mem_mb), (None, None, None));
        assert!(
            p.script.contains("export GREETING='hello, world'\\''s'\n"),
            "{}",
            p.script
        );
        assert!(p.script.contains("export ARRAY_INDEX=7\n"));
        assert!(
            p.script.ends_with("exec echo cell-7 '$HOME'\n"),
            "{}",
            p.script
        );
        // The script really says what it should.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(
                p.script
                    .replace("exec echo", "exec printf '%s|%s|%s|%s' \"$GREETING\""),
            )
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "hello, world's|cell-7|$HOME|"
        );
    }

    #[test]
    fn what_can_never_run_is_rejected() {
        let mut j = job();
        j.env.insert("BAD NAME".into(), "x".into());
        assert!(matches!(
            plan(&j, &SlurmConfig::cli("/w")),
            Err(AdapterError::Rejected(_))
        ));
        let mut j = job();
        j.image = Some("docker://busybox".into());
        assert!(matches!(
            plan(&j, &SlurmConfig::cli("/w")),
            Err(AdapterError::Rejected(_))
        ));
        let mut config = SlurmConfig::cli("/w");
        config.container_runtime = Some("apptainer".into());
        j.cwd = Some("data".into());
        let p = plan(&j, &config).unwrap();
        assert!(
            p.script
                .contains("exec apptainer exec --pwd /w/data docker://busybox sh -c"),
            "{}",
            p.script
        );
        assert_eq!(p.cwd, "/w/data");
        let mut j = job();
        j.command.clear();
        assert!(plan(&j, &SlurmConfig::cli("/w")).is_err());
    }

    #[test]
    fn volumes_live_on_the_shared_path_or_the_job_is_refused() {
        let mut j = job();
        j.mounts = BTreeMap::from([("train-data".into(), "/data".into())]);
        match plan(&j, &SlurmConfig::cli("/w")) {
            Err(AdapterError::Rejected(why)) => assert!(
                why.contains("volume_root") && why.contains("train-data"),
                "{why}"
            ),
            other => panic!("a volume with nowhere to live: {other:?}"),
        }
        let mut config = SlurmConfig::cli("/w");
        config.volume_root = Some("/shared/vols".into());
        config.container_runtime = Some("apptainer".into());
        let host = format!("/shared/vols/{}/train-data", Uuid::max());
        let p = plan(&j, &config).unwrap();
        assert!(
            p.script.contains(&format!("mkdir -p {host} || exit 1\n")),
            "{}",
            p.script
        );
        assert!(
            p.script
                .contains(&format!("export MERIDIAN_VOLUME_TRAIN_DATA={host}\n")),
            "{}",
            p.script
        );
        // In a container the volume is bound at its mount path.
        j.image = Some("docker://busybox".into());
        let p = plan(&j, &config).unwrap();
        assert!(
            p.script.contains(&format!(
                "exec apptainer exec --bind {host}:/data docker://busybox"
            )),
            "{}",
            p.script
        );
        assert!(
            !p.script.contains("export MERIDIAN_VOLUME_"),
            "{}",
            p.script
        );
    }

    #[test]
    fn gpus_without_a_model_ask_for_any_gpu() {
        let mut j = job();
        j.resources.gpus = Some(Gpus {
            count: 1,
            vendor: "amd".into(),
            model: None,
        });
        assert_eq!(
            plan(&j, &SlurmConfig::cli("/w")).unwrap().gres.as_deref(),
            Some("gpu:1")
        );
        j.resources.gpus.as_mut().unwrap().model = Some("MI300X".into());
        assert_eq!(
            plan(&j, &SlurmConfig::cli("/w")).unwrap().gres.as_deref(),
            Some("gpu:mi300x:1")
        );
    }
}
