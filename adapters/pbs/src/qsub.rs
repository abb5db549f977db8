//! How a Meridian job becomes a PBS job: job ids, the script, the `qsub` arguments, and
//! the `-J` (arrays) and `-W depend=` helpers.
//!
//! An array released as one batch goes as one `qsub -J 0-<n-1> -W max_run_subjobs=<cap>`
//! ([`array_plan`]). Meridian submits a job only once the jobs it requires have
//! succeeded, so the adapter never uses `-W depend=`; [`depend_arg`] exists for tools
//! that want it. Their syntax is tested against the qsub man page.
//!
//! The job's own environment is exported by the script, not passed with `-v`: `-v`
//! splits its list at commas, so a value holding one would be cut. Meridian's own
//! variables go in `-v` too, where `qstat` shows them (`Variable_List`): that is the
//! tag `find` looks for.

use std::fmt;
use std::path::{Path, PathBuf};

use meridian_adapter_core::{AdapterError, ArrayRequest, BackendJobId, JobRequest};

use crate::config::PbsConfig;
use meridian_adapter_core::batch::{array_script, job_script, ArrayTasks, ScriptOptions};

/// A PBS job id: `<seq>[.<server>]`, an array `<seq>[]`, or a subjob `<seq>[<index>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PbsId {
    pub seq: u64,
    /// `Some(None)` for an array job (`123[]`), `Some(Some(i))` for a subjob (`123[7]`).
    pub array: Option<Option<u32>>,
    pub server: Option<String>,
}

impl PbsId {
    pub fn parse(text: &str) -> Option<PbsId> {
        let text = text.trim();
        let (head, server) = match text.split_once('.') {
            Some((head, server)) => (head, Some(server)),
            None => (text, None),
        };
        let (seq, array) = match head.split_once('[') {
            Some((seq, rest)) => {
                let index = rest.strip_suffix(']')?;
                let index = if index.is_empty() {
                    None
                } else {
                    Some(index.parse().ok()?)
                };
                (seq, Some(index))
            }
            None => (head, None),
        };
        let server_ok = server.is_none_or(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        });
        if !server_ok || seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(PbsId {
            seq: seq.parse().ok()?,
            array,
            server: server.map(str::to_string),
        })
    }

    pub fn from_backend(id: &BackendJobId) -> Result<PbsId, AdapterError> {
        PbsId::parse(&id.0).ok_or_else(|| AdapterError::UnknownJob(id.0.clone()))
    }
}

impl fmt::Display for PbsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.seq)?;
        match self.array {
            Some(Some(i)) => write!(f, "[{i}]")?,
            Some(None) => f.write_str("[]")?,
            None => {}
        }
        if let Some(server) = &self.server {
            write!(f, ".{server}")?;
        }
        Ok(())
    }
}

/// The id `qsub` printed (the last non-blank line).
pub fn parse_qsub(stdout: &str) -> Option<PbsId> {
    PbsId::parse(stdout.lines().rev().find(|l| !l.trim().is_empty())?)
}

/// `-J` for an array of subjobs `start..=end` every `step`, with at most `max_running`
/// running at once (`-W max_run_subjobs`, PBS Professional 2020.1 and later).
pub fn array_args(
    start: u32,
    end: u32,
    step: Option<u32>,
    max_running: Option<u32>,
) -> Vec<String> {
    let mut range = format!("{start}-{end}");
    if let Some(step) = step.filter(|s| *s > 1) {
        range.push_str(&format!(":{step}"));
    }
    let mut args = vec!["-J".to_string(), range];
    if let Some(n) = max_running {
        args.extend(["-W".to_string(), format!("max_run_subjobs={n}")]);
    }
    args
}

/// The dependency kinds `qsub -W depend=` takes.
pub const DEPEND_KINDS: [&str; 8] = [
    "after",
    "afterok",
    "afternotok",
    "afterany",
    "before",
    "beforeok",
    "beforenotok",
    "beforeany",
];

/// `depend=<kind>:<id>[:<id>…]`, the value of `qsub -W`, e.g. `depend=afterok:12.srv:13.srv`.
pub fn depend_arg(kind: &str, ids: &[PbsId]) -> Result<String, AdapterError> {
    if !DEPEND_KINDS.contains(&kind) {
        return Err(AdapterError::Rejected(format!(
            "{kind:?} is not a PBS dependency kind (one of {DEPEND_KINDS:?})"
        )));
    }
    if ids.is_empty() {
        return Err(AdapterError::Rejected(
            "a dependency needs at least one job".into(),
        ));
    }
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    Ok(format!("depend={kind}:{}", ids.join(":")))
}

/// Everything PBS is asked for one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub script: String,
    pub script_path: PathBuf,
    pub args: Vec<String>,
}

/// A name PBS takes: starts with a letter, no blanks or separators, at most 236 chars.
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
        .collect();
    if let Some(i) = job.array_index {
        name = format!("{name}-{i}");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        name = format!("m{name}");
    }
    name.chars().take(200).collect()
}

/// `HH:MM:SS`, rounded up to the second.
pub fn walltime(d: std::time::Duration) -> String {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// The files of a Meridian job in the work dir.
pub fn job_file(work_dir: &Path, job_id: uuid::Uuid, ext: &str) -> PathBuf {
    work_dir.join(format!("meridian-{job_id}.{ext}"))
}

fn work_cwd(job: &JobRequest, config: &PbsConfig) -> PathBuf {
    match &job.cwd {
        Some(cwd) => config.work_dir.join(cwd),
        None => config.work_dir.clone(),
    }
}

/// PBS starts jobs in the home directory: the script goes where the job asked.
fn script_options<'a>(title: &'a str, config: &'a PbsConfig, cwd: &'a Path) -> ScriptOptions<'a> {
    ScriptOptions {
        title,
        cd_to: Some(cwd),
        cwd,
        container_runtime: config.container_runtime.as_deref(),
        scheduler: "PBS",
        volume_root: config.volume_root.as_deref(),
    }
}

/// Plans `job` for `config`'s site, or says why it can never run there.
pub fn plan(job: &JobRequest, config: &PbsConfig) -> Result<Plan, AdapterError> {
    job.check().map_err(AdapterError::Rejected)?;
    let cwd = work_cwd(job, config);
    let script = job_script(job, &script_options(&job_name(job), config, &cwd))
        .map_err(AdapterError::Rejected)?;
    let work = &config.work_dir;
    let mut args = vec![
        "-N".to_string(),
        job_name(job),
        "-o".into(),
        job_file(work, job.job_id, "out").display().to_string(),
        "-e".into(),
        job_file(work, job.job_id, "err").display().to_string(),
    ];
    args.extend(resource_args(job, config));
    let vars: Vec<String> = job
        .meridian_env()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    args.extend(["-v".into(), vars.join(",")]);
    let script_path = job_file(work, job.job_id, "sh");
    args.push(script_path.display().to_string());
    Ok(Plan {
        script,
        script_path,
        args,
    })
}

/// Where PBS puts a subjob's index in an array's `-o` and `-e` paths.
pub const ARRAY_INDEX_TOKEN: &str = "^array_index^";

/// Plans `array` (two tasks or more) as one `qsub -J 0-<n-1>` held to its cap with
/// `-W max_run_subjobs`, tagged `MERIDIAN_BATCH_ID`. PBS ranges take no gaps, so the
/// subjobs are numbered from 0 in task order and the script maps each to its task.
pub fn array_plan(array: &ArrayRequest, config: &PbsConfig) -> Result<Plan, AdapterError> {
    let mut job = array.template.clone();
    job.array_index = None;
    job.check().map_err(AdapterError::Rejected)?;
    let n = array.tasks.len() as u32;
    if n < 2 || n > config.max_array_size {
        return Err(AdapterError::Rejected(format!(
            "an array of {n} tasks; this site takes 2 to {} in one qsub -J (max_array_size)",
            config.max_array_size
        )));
    }
    let cwd = work_cwd(&job, config);
    let script = array_script(
        array,
        &script_options(&job_name(&job), config, &cwd),
        &ArrayTasks {
            index_var: "PBS_ARRAY_INDEX",
            tasks: (0..n).zip(&array.tasks).collect(),
        },
    )
    .map_err(AdapterError::Rejected)?;
    let work = &config.work_dir;
    let output = |ext: &str| {
        work.join(format!(
            "meridian-{}.{ARRAY_INDEX_TOKEN}.{ext}",
            array.batch_id
        ))
        .display()
        .to_string()
    };
    let mut args = vec![
        "-N".to_string(),
        job_name(&job),
        "-o".into(),
        output("out"),
        "-e".into(),
        output("err"),
    ];
    args.extend(resource_args(&job, config));
    args.extend(array_args(0, n - 1, None, Some(array.cap.max(1))));
    args.extend([
        "-v".into(),
        format!(
            "MERIDIAN_WORKFLOW_ID={},MERIDIAN_BATCH_ID={}",
            job.workflow_id, array.batch_id
        ),
    ]);
    let script_path = job_file(work, array.batch_id, "sh");
    args.push(script_path.display().to_string());
    Ok(Plan {
        script,
        script_path,
        args,
    })
}

/// `-l select=…`, placement, walltime, queue and account.
fn resource_args(job: &JobRequest, config: &PbsConfig) -> Vec<String> {
    let r = &job.resources;
    let mut chunk = format!("{}:ncpus={}", r.nodes.max(1), r.cpus.max(1));
    if r.memory_bytes > 0 {
        chunk.push_str(&format!(":mem={}mb", r.memory_bytes.div_ceil(1 << 20)));
    }
    if let Some(g) = r.gpus.as_ref().filter(|g| g.count > 0) {
        chunk.push_str(&format!(":ngpus={}", g.count));
        if let (Some(res), Some(model)) = (&config.gpu_model_resource, &g.model) {
            chunk.push_str(&format!(":{res}={}", model.trim().to_ascii_lowercase()));
        }
    }
    let mut args = vec!["-l".to_string(), format!("select={chunk}")];
    if r.nodes > 1 {
        // One chunk per host: `nodes` means distinct machines.
        args.extend(["-l".into(), "place=scatter".into()]);
    }
    if !r.walltime.is_zero() {
        args.extend(["-l".into(), format!("walltime={}", walltime(r.walltime))]);
    }
    if let Some(q) = &config.queue {
        args.extend(["-q".into(), q.clone()]);
    }
    if let Some(a) = &config.account {
        args.extend(["-A".into(), a.clone()]);
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
            name: "7 train".into(),
            array_index: None,
            image: None,
            command: vec!["sh".into(), "-c".into(), "echo \"$GREETING\"".into()],
            env: BTreeMap::from([("GREETING".into(), "a, b".into())]),
            cwd: None,
            resources: Resources {
                nodes: 2,
                cpus: 4,
                memory_bytes: 16 << 30,
                walltime: Duration::from_secs(5400),
                gpus: Some(Gpus {
                    count: 1,
                    vendor: "nvidia".into(),
                    model: Some("A100".into()),
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
    fn ids_plain_array_and_subjob() {
        let id = PbsId::parse("1234.pbs-server.example.org").unwrap();
        assert_eq!(
            (id.seq, id.array, id.server.as_deref()),
            (1234, None, Some("pbs-server.example.org"))
        );
        let id = PbsId::parse("1234[].pbs").unwrap();
        assert_eq!(id.array, Some(None));
        assert_eq!(id.to_string(), "1234[].pbs");
        let id = PbsId::parse("1234[7].pbs").unwrap();
        assert_eq!(id.array, Some(Some(7)));
        assert_eq!(PbsId::parse("99").unwrap().to_string(), "99");
        for bad in [
            "",
            "x.pbs",
            "12[.pbs",
            "12[a].pbs",
            "12.",
            "0197a3c4-6d2e-7c1a-9b1e-3f2d1c0b9a87",
        ] {
            assert_eq!(PbsId::parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse_qsub("1234.pbs\n").unwrap().seq, 1234);
    }

    #[test]
    fn helpers_speak_the_man_page() {
        assert_eq!(
            array_args(1, 1000, None, Some(50)),
            ["-J", "1-1000", "-W", "max_run_subjobs=50"]
        );
        assert_eq!(array_args(0, 10, Some(2), None), ["-J", "0-10:2"]);
        let ids = [
            PbsId::parse("12.srv").unwrap(),
            PbsId::parse("13[].srv").unwrap(),
        ];
        assert_eq!(
            depend_arg("afterok", &ids).unwrap(),
            "depend=afterok:12.srv:13[].srv"
        );
        assert!(depend_arg("whenever", &ids).is_err());
        assert!(depend_arg("afterany", &[]).is_err());
        assert_eq!(walltime(Duration::from_millis(90_500)), "00:01:31");
        assert_eq!(walltime(Duration::from_secs(100 * 3600)), "100:00:00");
    }

    #[test]
    fn qsub_gets_every_resource() {
        let mut config = PbsConfig::new("/scratch/m");
        config.queue = Some("gpu".into());
        config.account = Some("phys".into());
        config.gpu_model_resource = Some("gpu_model".into());
        let p = plan(&job(), &config).unwrap();
        let nil = Uuid::nil();
        let max = Uuid::max();
        assert_eq!(
            p.args,
            [
                "-N".to_string(),
                "m7_train".into(),
                "-o".into(),
                format!("/scratch/m/meridian-{nil}.out"),
                "-e".into(),
                format!("/scratch/m/meridian-{nil}.err"),
                "-l".into(),
                "select=2:ncpus=4:mem=16384mb:ngpus=1:gpu_model=a100".into(),
                "-l".into(),
                "place=scatter".into(),
                "-l".into(),
                "walltime=01:30:00".into(),
                "-q".into(),
                "gpu".into(),
                "-A".into(),
                "phys".into(),
                "-v".into(),
                format!("MERIDIAN_JOB_ID={nil},MERIDIAN_WORKFLOW_ID={max}"),
                format!("/scratch/m/meridian-{nil}.sh"),
            ]
        );
        assert!(
            p.script.contains("cd /scratch/m || exit 1\n"),
            "{}",
            p.script
        );
        assert!(
            p.script.contains("export GREETING='a, b'\n"),
            "{}",
            p.script
        );
    }

    #[test]
    fn what_can_never_run_is_rejected() {
        let mut j = job();
        j.image = Some("busybox".into());
        assert!(matches!(
            plan(&j, &PbsConfig::new("/w")),
            Err(AdapterError::Rejected(_))
        ));
        let mut config = PbsConfig::new("/w");
        config.container_runtime = Some("apptainer".into());
        let p = plan(&j, &config).unwrap();
        assert!(
            p.script
                .contains("exec apptainer exec docker://busybox sh -c"),
            "{}",
            p.script
        );
        let mut j = job();
        j.env.insert("1BAD".into(), "x".into());
        assert!(plan(&j, &PbsConfig::new("/w")).is_err());
    }
}
