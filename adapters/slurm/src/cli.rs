//! The command-line backend: `sbatch`, `scontrol`, `squeue`, `sacct`, `scancel`, run
//! through the [`CommandRunner`] (here or over SSH). Every command that prints times runs
//! with `TZ=UTC` and a fixed `SLURM_TIME_FORMAT` (Slurm prints local time with no zone).
//!
//! Where a job's state comes from: `scontrol -o show job` while slurmctld still holds it
//! (running jobs, and finished ones for `MinJobAge`, 300 s by default); after that
//! `sacct` from slurmdbd, or, on a site without slurmdbd, `sacct -c` from the
//! jobcomp/filetxt log.

use std::sync::Arc;

use chrono::Utc;
use meridian_adapter_core::{AdapterError, BackendJobId, Capacity, JobReport, Usage};

use crate::config::SlurmConfig;
use crate::parse::{
    add_free_by_model, parse_kv, parse_sbatch, parse_tres, sacct_record, scontrol_record,
    task_string_holds, tres_gpus_by_model, Record, SlurmId, SACCT_FORMAT, SACCT_JOBCOMP_FORMAT,
};
use crate::runner::{Command, CommandRunner, Output};
use crate::script::{sbatch_args, Plan};

#[derive(Debug)]
pub(crate) struct Cli {
    pub runner: Arc<dyn CommandRunner>,
    pub config: Arc<SlurmConfig>,
}

/// What slurmctld says about a job id it does not hold.
const INVALID_JOB: &str = "Invalid job id specified";
const NO_ACCOUNTING: &str = "accounting storage is disabled";

impl Cli {
    async fn run(&self, command: Command) -> Result<Output, AdapterError> {
        self.runner
            .run(&command)
            .await
            .map_err(|e| AdapterError::Unavailable(e.to_string()))
    }

    fn failed(what: &str, out: &Output) -> AdapterError {
        AdapterError::Unavailable(format!(
            "{what} failed ({}): {}",
            out.code.map_or("killed".into(), |c| format!("exit {c}")),
            out.stderr.trim()
        ))
    }

    pub async fn submit(&self, plan: &Plan) -> Result<BackendJobId, AdapterError> {
        let out = self
            .run(
                Command::new("sbatch")
                    .args(sbatch_args(plan))
                    .stdin(plan.script.clone()),
            )
            .await?;
        if !out.success() {
            return Err(submit_error(&out));
        }
        let id = parse_sbatch(&out.stdout).ok_or_else(|| {
            AdapterError::Unavailable(format!("sbatch printed no job id: {:?}", out.stdout.trim()))
        })?;
        tracing::info!(slurm_job = %id, comment = %plan.comment, "submitted to Slurm");
        Ok(BackendJobId(id.to_string()))
    }

    /// The job tagged `tag`: first among the jobs slurmctld holds, then in accounting.
    /// With its job `name` known (at submit), the accounting search asks slurmdbd for
    /// that name only, which keeps a submit cheap on a busy cluster.
    pub async fn find(
        &self,
        tag: &str,
        name: Option<&str>,
    ) -> Result<Option<BackendJobId>, AdapterError> {
        self.find_tagged(tag, name, false).await
    }

    /// The array job tagged `tag` (named `name`), by the array's own id: pending tasks of
    /// an array are one line (`4242_[3-9%2]`), and accounting lists each task (`4242_7`).
    pub async fn find_array(
        &self,
        tag: &str,
        name: &str,
    ) -> Result<Option<BackendJobId>, AdapterError> {
        self.find_tagged(tag, Some(name), true).await
    }

    async fn find_tagged(
        &self,
        tag: &str,
        name: Option<&str>,
        array: bool,
    ) -> Result<Option<BackendJobId>, AdapterError> {
        let format = if array { "%F|%k" } else { "%i|%k" };
        let out = self
            .run(Command::new("squeue").args(["--me", "-h", "-t", "all", "-o", format]))
            .await?;
        if !out.success() {
            return Err(Self::failed("squeue", &out));
        }
        if let Some(id) = lowest_tagged(&out.stdout, tag) {
            return Ok(Some(id));
        }
        let since = Utc::now()
            - chrono::Duration::from_std(self.config.poll.find_lookback)
                .unwrap_or(chrono::Duration::days(30));
        let mut sacct = Command::new("sacct")
            .args(["-P", "-n", "-X", "--format=JobID,Comment"])
            .arg(format!("--starttime={}", since.format("%Y-%m-%dT%H:%M:%S")));
        if let Some(name) = name {
            sacct = sacct.arg(format!("--name={name}"));
        }
        let out = self.run(sacct.utc_times()).await?;
        if !out.success() {
            if out.stderr.contains(NO_ACCOUNTING) {
                // The jobcomp log keeps no comment: without slurmdbd a job is found only
                // while slurmctld holds it (see docs/site-slurm.md).
                return Ok(None);
            }
            return Err(Self::failed("sacct", &out));
        }
        if !array {
            return Ok(lowest_tagged(&out.stdout, tag));
        }
        // `4242_7` or `4242_[3-9]`: the array is what comes before the `_`.
        let arrays: String = out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(id, comment)| {
                let job = id.split(['_', ';']).next().unwrap_or(id);
                format!("{job}|{comment}\n")
            })
            .collect();
        Ok(lowest_tagged(&arrays, tag))
    }

    pub async fn status(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        let sid = SlurmId::from_backend(id)?;
        let out = self
            .run(
                Command::new("scontrol")
                    .args(sid.cluster_args())
                    .args(["-o", "show", "job", &sid.job])
                    .utc_times(),
            )
            .await?;
        if out.success() {
            let line = out.stdout.lines().find(|l| l.contains("JobState="));
            if let Some(record) = line.and_then(scontrol_record) {
                let mut report = record.report(id)?;
                if report.state.is_terminal() {
                    // CPU time is only in accounting; best effort, the state is settled.
                    if let Ok(Some(acct)) = self.sacct(&sid, false).await {
                        report.usage.cpu_seconds = acct.usage.cpu_seconds;
                    }
                }
                return Ok(report);
            }
        } else if !out.stderr.contains(INVALID_JOB) {
            return Err(Self::failed("scontrol show job", &out));
        }
        // slurmctld no longer holds it: accounting, else the jobcomp log.
        let record = match self.sacct(&sid, false).await? {
            Some(record) => Some(record),
            None => self.sacct(&sid, true).await?,
        };
        match record {
            Some(record) => record.report(id),
            None => Err(AdapterError::UnknownJob(id.0.clone())),
        }
    }

    /// What one `scontrol show job <array>` per array says of its tasks among `ids` (it
    /// lists each started task and the pending rest as one line): a report for each task
    /// still waiting or running; `None` for the rest, a task that ended included (its
    /// CPU time is in accounting), to be asked for alone.
    pub async fn array_statuses(&self, ids: &[BackendJobId]) -> Vec<Option<JobReport>> {
        let mut out: Vec<Option<JobReport>> = ids.iter().map(|_| None).collect();
        for (array, tasks) in array_tasks(ids) {
            let Ok(shown) = self
                .run(
                    Command::new("scontrol")
                        .args(array.cluster_args())
                        .args(["-o", "show", "job", &array.job])
                        .utc_times(),
                )
                .await
            else {
                continue;
            };
            if !shown.success() {
                continue;
            }
            let lines: Vec<(String, &str)> = shown
                .stdout
                .lines()
                .map(|l| (parse_kv(l).remove("ArrayTaskId").unwrap_or_default(), l))
                .collect();
            for (i, task) in tasks {
                let own = lines.iter().find(|(t, _)| *t == task.to_string());
                let queued = || lines.iter().find(|(t, _)| task_string_holds(t, task));
                let report = own
                    .or_else(queued)
                    .and_then(|(_, line)| scontrol_record(line))
                    .map(|record| record.report(&ids[i]));
                // An ended task's CPU time is in accounting: it is asked for alone.
                if let Some(Ok(report)) =
                    report.filter(|r| r.as_ref().is_ok_and(|r| !r.state.is_terminal()))
                {
                    out[i] = Some(report);
                }
            }
        }
        out
    }

    /// One job's accounting record: slurmdbd's, or with `jobcomp` the jobcomp log's.
    /// `Ok(None)` when that source has no such job or is not configured.
    async fn sacct(&self, sid: &SlurmId, jobcomp: bool) -> Result<Option<Record>, AdapterError> {
        let mut cmd = Command::new("sacct").args(sid.cluster_args());
        cmd = if jobcomp {
            cmd.args(["-c", "-P", "-n", "-j", &sid.job])
                .arg(format!("--format={SACCT_JOBCOMP_FORMAT}"))
        } else {
            cmd.args(["-P", "-n", "-X", "-j", &sid.job])
                .arg(format!("--format={SACCT_FORMAT}"))
        };
        let out = self.run(cmd.utc_times()).await?;
        if !out.success() {
            if out.stderr.contains(NO_ACCOUNTING) {
                return Ok(None);
            }
            return Err(Self::failed("sacct", &out));
        }
        Ok(sacct_record(&out.stdout, jobcomp))
    }

    pub async fn cancel(&self, id: &BackendJobId) -> Result<(), AdapterError> {
        let report = self.status(id).await?;
        if report.state.is_terminal() {
            return Ok(());
        }
        let sid = SlurmId::from_backend(id)?;
        let out = self
            .run(
                Command::new("scancel")
                    .args(sid.cluster_args())
                    .arg(&sid.job),
            )
            .await?;
        if out.success()
            || out.stderr.contains("already completing or completed")
            || out.stderr.contains(INVALID_JOB)
        {
            tracing::info!(slurm_job = %id, "cancelled");
            return Ok(());
        }
        Err(Self::failed("scancel", &out))
    }

    pub async fn capacity(&self) -> Capacity {
        match self.try_capacity().await {
            Ok(capacity) => capacity,
            Err(e) => Capacity {
                healthy: false,
                message: Some(e.to_string()),
                ..Capacity::default()
            },
        }
    }

    async fn try_capacity(&self) -> Result<Capacity, AdapterError> {
        let ping = self.run(Command::new("scontrol").arg("ping")).await?;
        if !ping.stdout.contains("is UP") {
            return Ok(Capacity {
                healthy: false,
                message: Some(format!(
                    "slurmctld does not answer: {}",
                    format!("{} {}", ping.stdout.trim(), ping.stderr.trim()).trim()
                )),
                ..Capacity::default()
            });
        }
        let nodes = self
            .run(Command::new("scontrol").args(["-o", "show", "node"]))
            .await?;
        if !nodes.success() {
            return Err(Self::failed("scontrol show node", &nodes));
        }
        let mut capacity = nodes_capacity(&nodes.stdout, self.config.partition.as_deref());
        let mut squeue = Command::new("squeue").args(["-h", "-t", "PD", "-o", "%i"]);
        if let Some(p) = &self.config.partition {
            squeue = squeue.args(["-p", p]);
        }
        let pending = self.run(squeue).await?;
        if !pending.success() {
            return Err(Self::failed("squeue", &pending));
        }
        capacity.pending = pending
            .stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count() as u32;
        Ok(capacity)
    }
}

/// Why sbatch refused: `Rejected` when the request can never run (bad partition, more
/// than the site has), `Unavailable` when trying again later may work.
fn submit_error(out: &Output) -> AdapterError {
    let stderr = out.stderr.trim();
    let transient = [
        "temporarily",
        "Unable to contact",
        "Socket timed out",
        "Connection refused",
        "Zero Bytes",
        "timed out",
        "communication",
        "job submit limit",
    ];
    let lower = stderr.to_ascii_lowercase();
    if stderr.contains("Batch job submission failed")
        && !transient
            .iter()
            .any(|t| lower.contains(&t.to_ascii_lowercase()))
    {
        AdapterError::Rejected(stderr.to_string())
    } else {
        Cli::failed("sbatch", out)
    }
}

/// The job among `id|comment` lines whose comment is `tag`; the first submitted (lowest
/// id) if, against the lock, there are several.
/// The array tasks among `ids` (`4242_7`), by array: each task's place in `ids` and its
/// index.
pub(crate) fn array_tasks(ids: &[BackendJobId]) -> Vec<(SlurmId, Vec<(usize, u32)>)> {
    let mut arrays: Vec<(SlurmId, Vec<(usize, u32)>)> = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let Some(sid) = SlurmId::parse(&id.0) else {
            continue;
        };
        let Some((job, task)) = sid.job.split_once('_') else {
            continue;
        };
        let Ok(task) = task.parse() else { continue };
        let array = SlurmId {
            job: job.to_string(),
            cluster: sid.cluster.clone(),
        };
        match arrays.iter_mut().find(|(a, _)| *a == array) {
            Some((_, tasks)) => tasks.push((i, task)),
            None => arrays.push((array, vec![(i, task)])),
        }
    }
    arrays
}

fn lowest_tagged(lines: &str, tag: &str) -> Option<BackendJobId> {
    lines
        .lines()
        .filter_map(|l| l.split_once('|'))
        .filter(|(_, comment)| comment.trim() == tag)
        .filter_map(|(id, _)| SlurmId::parse(id))
        .min_by_key(|id| {
            let n: u64 = id
                .job
                .split('_')
                .next()
                .unwrap_or("")
                .parse()
                .unwrap_or(u64::MAX);
            n
        })
        .map(|id| BackendJobId(id.to_string()))
}

/// Capacity from `scontrol -o show node` lines, counting only nodes in `partition` when
/// one is set. Free resources count only nodes that take jobs (not down, drained, …).
pub(crate) fn nodes_capacity(text: &str, partition: Option<&str>) -> Capacity {
    let mut c = Capacity {
        healthy: true,
        ..Capacity::default()
    };
    for line in text.lines().filter(|l| l.contains("NodeName=")) {
        let kv = parse_kv(line);
        let get = |k: &str| kv.get(k).map(String::as_str).unwrap_or("");
        if let Some(p) = partition {
            if !get("Partitions").split(',').any(|x| x == p) {
                continue;
            }
        }
        let num = |k: &str| get(k).parse::<u64>().unwrap_or(0);
        let cpus = num("CPUTot") as u32;
        let mem = num("RealMemory") << 20;
        c.total_cpus += cpus;
        c.total_memory_bytes += mem;
        let (up, idle) = node_takes_jobs(get("State"));
        if up {
            c.free_cpus += cpus.saturating_sub(num("CPUAlloc") as u32);
            c.free_memory_bytes += mem.saturating_sub(num("AllocMem") << 20);
            let gpus: Usage = parse_tres(get("CfgTRES"));
            let used: Usage = parse_tres(get("AllocTRES"));
            c.free_gpus += gpus.gpus.saturating_sub(used.gpus);
            add_free_by_model(
                &mut c.free_gpus_by_model,
                &tres_gpus_by_model(get("CfgTRES")),
                &tres_gpus_by_model(get("AllocTRES")),
            );
            if idle {
                c.idle_nodes += 1;
            }
        }
    }
    c
}

/// Whether a node in this state takes jobs, and whether it is idle. States look like
/// `IDLE`, `MIXED`, `IDLE+DRAIN`, `DOWN*` (`*`: not responding).
fn node_takes_jobs(state: &str) -> (bool, bool) {
    let mut words = state.split('+');
    let base = words
        .next()
        .unwrap_or("")
        .trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-']);
    let bad_flags = [
        "DRAIN",
        "FAIL",
        "MAINT",
        "NOT_RESPONDING",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "REBOOT_ISSUED",
        "REBOOT_REQUESTED",
        "INVALID_REG",
    ];
    let flagged = words.any(|w| bad_flags.contains(&w)) || state.contains('*');
    let up = matches!(base, "IDLE" | "MIXED" | "ALLOCATED" | "COMPLETING") && !flagged;
    (up, up && base == "IDLE")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_jobs_are_found_by_their_comment() {
        let lines = "12|meridian:a\n9|meridian:b\n15|meridian:b\n3|\n";
        assert_eq!(
            lowest_tagged(lines, "meridian:b"),
            Some(BackendJobId("9".into()))
        );
        assert_eq!(lowest_tagged(lines, "meridian:c"), None);
        assert_eq!(lowest_tagged("", "meridian:c"), None);
    }

    #[test]
    fn capacity_counts_nodes_that_take_jobs() {
        let text = "\
NodeName=a CPUAlloc=2 CPUTot=8 RealMemory=1000 AllocMem=200 State=MIXED Partitions=gpu,debug CfgTRES=cpu=8,mem=1000M,gres/gpu=4 AllocTRES=cpu=2,gres/gpu=1
NodeName=b CPUAlloc=0 CPUTot=8 RealMemory=1000 AllocMem=0 State=IDLE Partitions=debug CfgTRES=cpu=8 AllocTRES=
NodeName=c CPUAlloc=0 CPUTot=8 RealMemory=1000 AllocMem=0 State=IDLE+DRAIN Partitions=debug CfgTRES=cpu=8 AllocTRES=
NodeName=d CPUAlloc=0 CPUTot=8 RealMemory=1000 AllocMem=0 State=DOWN* Partitions=debug CfgTRES=cpu=8 AllocTRES=
";
        let c = nodes_capacity(text, None);
        assert_eq!(
            (c.total_cpus, c.free_cpus, c.idle_nodes, c.free_gpus),
            (32, 14, 1, 3)
        );
        assert_eq!(c.total_memory_bytes, 4000 << 20);
        assert_eq!(c.free_memory_bytes, 1800 << 20);
        // Typed GRES counts by model too (an untyped GPU only in the total).
        let typed = "NodeName=g CPUAlloc=2 CPUTot=8 RealMemory=1000 AllocMem=0 State=MIXED Partitions=gpu CfgTRES=cpu=8,gres/gpu=4,gres/gpu:a100=2,gres/gpu:l40s=2 AllocTRES=cpu=2,gres/gpu=1,gres/gpu:l40s=1\n";
        let c = nodes_capacity(typed, None);
        assert_eq!(c.free_gpus, 3);
        assert_eq!(
            c.free_gpus_by_model,
            [("A100".into(), 2), ("L40S".into(), 1)].into()
        );
        let gpu = nodes_capacity(text, Some("gpu"));
        assert_eq!((gpu.total_cpus, gpu.free_cpus, gpu.idle_nodes), (8, 6, 0));
    }

    #[test]
    fn sbatch_errors_say_whether_to_retry() {
        let out = |stderr: &str| Output {
            code: Some(1),
            stdout: String::new(),
            stderr: stderr.into(),
        };
        assert!(matches!(
            submit_error(&out(
                "sbatch: error: Batch job submission failed: Invalid partition name specified"
            )),
            AdapterError::Rejected(_)
        ));
        assert!(matches!(
            submit_error(&out(
                "sbatch: error: Batch job submission failed: Requested node configuration is not available"
            )),
            AdapterError::Rejected(_)
        ));
        assert!(matches!(
            submit_error(&out(
                "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
            )),
            AdapterError::Unavailable(_)
        ));
        assert!(matches!(
            submit_error(&out(
                "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying"
            )),
            AdapterError::Unavailable(_)
        ));
    }
}
