//! Reading what the Slurm commands print: job ids, `scontrol -o` key=value lines, sacct's
//! `|`-separated rows, TRES strings, times and durations. Pure functions, tested on the
//! outputs Slurm 22.05 prints.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use meridian_adapter_core::{AdapterError, BackendJobId, JobReport, JobState, Usage};

use crate::state::{map_state, ExitStatus};

/// A Slurm job id as Meridian keeps it: `4242`, or `4242;cluster` on a multi-cluster site
/// (the form `sbatch --parsable` prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmId {
    /// `4242`, or `4242_7` for an array task.
    pub job: String,
    pub cluster: Option<String>,
}

impl SlurmId {
    /// Reads a backend id; anything else names no Slurm job.
    pub fn parse(text: &str) -> Option<SlurmId> {
        let text = text.trim();
        let (job, cluster) = match text.split_once(';') {
            Some((job, cluster)) => (job, Some(cluster)),
            None => (text, None),
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let job_ok = match job.split_once('_') {
            Some((a, b)) => digits(a) && digits(b),
            None => digits(job),
        };
        let cluster_ok = cluster.is_none_or(|c| {
            !c.is_empty()
                && c.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
        });
        (job_ok && cluster_ok).then(|| SlurmId {
            job: job.to_string(),
            cluster: cluster.map(str::to_string),
        })
    }

    pub fn from_backend(id: &BackendJobId) -> Result<SlurmId, AdapterError> {
        SlurmId::parse(&id.0).ok_or_else(|| AdapterError::UnknownJob(id.0.clone()))
    }

    /// `-M cluster` for the commands, when the id names one.
    pub fn cluster_args(&self) -> Vec<String> {
        match &self.cluster {
            Some(c) => vec!["-M".into(), c.clone()],
            None => Vec::new(),
        }
    }
}

impl fmt::Display for SlurmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cluster {
            Some(c) => write!(f, "{};{c}", self.job),
            None => f.write_str(&self.job),
        }
    }
}

/// The job id `sbatch --parsable` printed: `4242` or `4242;cluster` (warnings may come
/// first on their own lines).
pub fn parse_sbatch(stdout: &str) -> Option<SlurmId> {
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
    SlurmId::parse(line)
}

/// One `scontrol -o show …` line as keys and values. Values may hold spaces (a job name,
/// `OS=Linux 6.1 #1 SMP`): a word that is not `Key=…` belongs to the value before it.
pub fn parse_kv(line: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let mut last: Option<String> = None;
    for word in line.split_whitespace() {
        let key = word.split_once('=').map(|(k, _)| k).filter(|k| {
            k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_:/".contains(c))
        });
        match key {
            Some(key) => {
                let value = &word[key.len() + 1..];
                map.insert(key.to_string(), value.to_string());
                last = Some(key.to_string());
            }
            None => {
                if let Some(value) = last.as_ref().and_then(|k| map.get_mut(k)) {
                    value.push(' ');
                    value.push_str(word);
                }
            }
        }
    }
    map
}

/// A time as Slurm prints it with `SLURM_TIME_FORMAT=%Y-%m-%dT%H:%M:%S` and `TZ=UTC`;
/// `Unknown`, `None`, `N/A` and blanks are no time.
pub fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    let text = text.trim();
    let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S").ok()?;
    Some(Utc.from_utc_datetime(&naive))
}

/// Epoch seconds (slurmrestd); 0 is no time.
pub fn epoch(secs: i64) -> Option<DateTime<Utc>> {
    (secs > 0).then(|| Utc.timestamp_opt(secs, 0).single())?
}

/// A size as Slurm prints it (`64M`, `32G`, `1.50T`, `1024K`), in bytes; a bare number is
/// `default_unit` bytes each (megabytes in TRES and `--mem`).
pub fn parse_size(text: &str, default_unit: u64) -> Option<u64> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&text[..i], &text[i..]),
        None => (text, ""),
    };
    let unit = match unit.to_ascii_uppercase().as_str() {
        "" => default_unit,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        "P" => 1 << 50,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    (value >= 0.0).then(|| (value * unit as f64).round() as u64)
}

/// What a TRES string (`cpu=8,mem=32G,node=1,billing=8,gres/gpu=1`) allocates.
pub fn parse_tres(text: &str) -> Usage {
    let mut usage = Usage::default();
    let mut typed_gpus = 0u32;
    let mut plain_gpus = None;
    for item in text.split(',') {
        let Some((key, value)) = item.trim().split_once('=') else {
            continue;
        };
        match key {
            "cpu" => usage.cpus = value.parse().unwrap_or(0),
            "mem" => usage.memory_bytes = parse_size(value, 1 << 20).unwrap_or(0),
            "node" => usage.nodes = value.parse().unwrap_or(0),
            "gres/gpu" => plain_gpus = value.parse().ok(),
            // `gres/gpu:a100=2` repeats, by type, what `gres/gpu` counts.
            k if k.starts_with("gres/gpu:") => {
                typed_gpus += value.parse().unwrap_or(0);
                // The type names the model the site gave (`a100`), for vendor `any`.
                let model = &k["gres/gpu:".len()..];
                if !model.is_empty() {
                    usage.gpu_model = Some(model.to_ascii_uppercase());
                }
            }
            _ => {}
        }
    }
    usage.gpus = plain_gpus.unwrap_or(typed_gpus);
    usage
}

/// GPUs by the catalogue's model in a TRES string, from its typed entries
/// (`gres/gpu:a100=2,gres/gpu:h100_80g=4` → A100: 2, H100: 4); untyped GPUs are in no
/// model.
pub fn tres_gpus_by_model(text: &str) -> BTreeMap<String, u32> {
    let mut models = BTreeMap::new();
    for item in text.split(',') {
        let Some((key, value)) = item.trim().split_once('=') else {
            continue;
        };
        let Some(kind) = key.strip_prefix("gres/gpu:").filter(|k| !k.is_empty()) else {
            continue;
        };
        *models
            .entry(meridian_adapter_core::gpu::catalogue_model(kind))
            .or_insert(0) += value.parse::<u32>().unwrap_or(0);
    }
    models
}

/// Adds what each model has free (`have` less `used`) to `free`.
pub fn add_free_by_model(
    free: &mut BTreeMap<String, u32>,
    have: &BTreeMap<String, u32>,
    used: &BTreeMap<String, u32>,
) {
    for (model, n) in have {
        *free.entry(model.clone()).or_insert(0) +=
            n.saturating_sub(used.get(model).copied().unwrap_or(0));
    }
}

/// A Slurm duration, `[DD-[HH:]]MM:SS[.mmm]` (sacct `TotalCPU`, `Elapsed`), in seconds.
pub fn parse_duration(text: &str) -> Option<f64> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<f64>().ok()?, rest),
        None => (0.0, text),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let nums: Option<Vec<f64>> = parts.iter().map(|p| p.parse::<f64>().ok()).collect();
    let nums = nums?;
    let secs = match nums.as_slice() {
        [s] => *s,
        [m, s] => m * 60.0 + s,
        [h, m, s] => h * 3600.0 + m * 60.0 + s,
        _ => return None,
    };
    Some(days * 86400.0 + secs)
}

/// A node list that names nodes (not `None assigned`, `(null)` or blank): the job had an
/// allocation, so it started.
pub fn has_nodes(node_list: &str) -> bool {
    let n = node_list.trim();
    !(n.is_empty() || n == "(null)" || n.starts_with("None"))
}

/// What the adapter learnt of one job, from whichever source.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub state: String,
    pub exit: ExitStatus,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// What it was allocated (ignored until it starts: a pending job's TRES are a request).
    pub usage: Usage,
    /// The node its batch script runs on, once it runs.
    pub batch_host: Option<String>,
    /// Why Slurm holds it pending (`Priority`, `Resources`, `QOSMaxGRESPerUser`…).
    pub pending_reason: Option<String>,
}

/// Slurm's pending reason as Meridian shows it; `None` and an empty one say nothing.
pub fn pending_reason(state: &str, reason: &str) -> Option<String> {
    let reason = reason.trim();
    (state.starts_with("PENDING") && !reason.is_empty() && reason != "None")
        .then(|| format!("Slurm: {reason}"))
}

impl Record {
    pub fn report(&self, id: &BackendJobId) -> Result<JobReport, AdapterError> {
        let state = map_state(&self.state, self.exit, self.started_at, self.ended_at)
            .map_err(|e| AdapterError::Unavailable(format!("job {id}: {e}")))?;
        let usage = if self.started_at.is_some() {
            self.usage.clone()
        } else {
            Usage::default()
        };
        Ok(JobReport {
            address: None,
            host: self
                .batch_host
                .clone()
                .filter(|_| matches!(state, JobState::Running { .. })),
            waiting: self
                .pending_reason
                .clone()
                .filter(|_| matches!(state, JobState::Pending)),
            backend_id: id.clone(),
            state,
            usage,
        })
    }
}

/// A job as `scontrol -o show job` describes it.
pub fn scontrol_record(line: &str) -> Option<Record> {
    let kv = parse_kv(line);
    let get = |k: &str| kv.get(k).map(String::as_str).unwrap_or("");
    let state = get("JobState");
    if state.is_empty() {
        return None;
    }
    let ran = has_nodes(get("NodeList"));
    let mut usage = parse_tres(get("TRES"));
    if let Ok(nodes) = get("NumNodes").parse() {
        usage.nodes = nodes;
    }
    Some(Record {
        state: state.to_string(),
        exit: ExitStatus::parse(get("ExitCode")).unwrap_or_default(),
        started_at: ran.then(|| parse_time(get("StartTime"))).flatten(),
        ended_at: parse_time(get("EndTime")),
        usage,
        batch_host: Some(get("BatchHost"))
            .filter(|h| has_nodes(h))
            .map(str::to_string),
        pending_reason: pending_reason(state, get("Reason")),
    })
}

/// The sacct fields the adapter asks slurmdbd for, in this order.
pub const SACCT_FORMAT: &str =
    "JobID,State,ExitCode,ElapsedRaw,Start,End,AllocTRES,NodeList,TotalCPU";

/// The fields the jobcomp log (`sacct -c`) can give, in this order: it has no TRES.
pub const SACCT_JOBCOMP_FORMAT: &str =
    "JobID,State,ExitCode,ElapsedRaw,Start,End,NodeList,NNodes,NCPUS";

/// The last row of `sacct -P -n -X --format=SACCT_FORMAT` for one job id (ids can repeat
/// when a cluster's state was wiped; the last is the newest).
pub fn sacct_record(stdout: &str, jobcomp: bool) -> Option<Record> {
    let line = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
    let f: Vec<&str> = line.split('|').collect();
    let field = |i: usize| f.get(i).copied().unwrap_or("");
    let state = field(1);
    if state.is_empty() {
        return None;
    }
    let (node_list, usage) = if jobcomp {
        let usage = Usage {
            nodes: field(7).parse().unwrap_or(0),
            cpus: field(8).parse().unwrap_or(0),
            ..Usage::default()
        };
        (field(6), usage)
    } else {
        let mut usage = parse_tres(field(6));
        usage.cpu_seconds = parse_duration(field(8));
        (field(7), usage)
    };
    let ran = has_nodes(node_list);
    Some(Record {
        state: state.to_string(),
        exit: ExitStatus::parse(field(2)).unwrap_or_default(),
        started_at: ran.then(|| parse_time(field(4))).flatten(),
        ended_at: parse_time(field(5)),
        usage,
        // Accounting answers for jobs that ended: no service is running there.
        batch_host: None,
        pending_reason: None,
    })
}

/// Whether an array's task string (`5,8-10%2`, `1-9:2`) holds task `task`.
pub fn task_string_holds(text: &str, task: u32) -> bool {
    let text = text.split('%').next().unwrap_or("");
    text.split(',').any(|part| {
        let (range, step) = match part.split_once(':') {
            Some((r, s)) => (r, s.trim().parse::<u32>().unwrap_or(1).max(1)),
            None => (part, 1),
        };
        let (a, b) = match range.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>(), b.trim().parse::<u32>()),
            None => (range.trim().parse::<u32>(), range.trim().parse::<u32>()),
        };
        match (a, b) {
            (Ok(a), Ok(b)) => (a..=b).contains(&task) && (task - a).is_multiple_of(step),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_strings_say_which_tasks_they_hold() {
        assert!(task_string_holds("5,8%2", 8));
        assert!(!task_string_holds("5,8%2", 6));
        assert!(task_string_holds("3-9%2", 3) && task_string_holds("3-9", 9));
        assert!(!task_string_holds("3-9", 10));
        assert!(task_string_holds("1-9:2", 5) && !task_string_holds("1-9:2", 4));
        assert!(!task_string_holds("", 0) && !task_string_holds("x-y", 1));
    }

    #[test]
    fn sbatch_ids_with_and_without_a_cluster() {
        assert_eq!(parse_sbatch("4242\n").unwrap().to_string(), "4242");
        let id = parse_sbatch("sbatch: warning: x\n4242;clusterA\n").unwrap();
        assert_eq!(id.job, "4242");
        assert_eq!(id.cluster.as_deref(), Some("clusterA"));
        assert_eq!(id.cluster_args(), ["-M", "clusterA"]);
        assert_eq!(id.to_string(), "4242;clusterA");
        assert_eq!(SlurmId::parse("12_3").unwrap().job, "12_3");
        for bad in [
            "",
            "abc",
            "12;",
            "1 2",
            "0197a3c4-6d2e-7c1a-9b1e-3f2d1c0b9a87",
            "12;a b",
        ] {
            assert_eq!(SlurmId::parse(bad), None, "{bad:?}");
        }
        assert!(parse_sbatch("sbatch: error: Batch job submission failed\n").is_none());
    }

    #[test]
    fn scontrol_lines_keep_values_with_spaces() {
        let line = "JobId=5 JobName=t1 UserId=root(0) JobState=FAILED Reason=NonZeroExitCode \
                    ExitCode=3:0 StartTime=2026-11-29T22:19:57 EndTime=2026-11-29T22:19:58 \
                    NodeList=vm NumNodes=1 NumCPUs=1 TRES=cpu=1,mem=64M,node=1,billing=1 \
                    OS=Linux 6.1 #1 SMP Comment=meridian:abc  StdOut=/tmp/o-5.out";
        let kv = parse_kv(line);
        assert_eq!(kv["OS"], "Linux 6.1 #1 SMP");
        assert_eq!(kv["TRES"], "cpu=1,mem=64M,node=1,billing=1");
        assert_eq!(kv["Comment"], "meridian:abc");
        let record = scontrol_record(line).unwrap();
        assert_eq!(record.state, "FAILED");
        assert_eq!(record.exit, ExitStatus { code: 3, signal: 0 });
        assert_eq!(record.started_at, parse_time("2026-11-29T22:19:57"));
        assert_eq!(record.usage.memory_bytes, 64 << 20);
        assert_eq!(record.usage.nodes, 1);
        // Pending: an expected start time, no nodes.
        let pending = scontrol_record(
            "JobId=6 JobState=PENDING Reason=BeginTime StartTime=2026-11-29T22:30:07 \
             EndTime=Unknown NodeList= TRES=cpu=1,mem=64M,node=1",
        )
        .unwrap();
        assert_eq!(pending.started_at, None);
        assert_eq!(pending.ended_at, None);
        let report = pending.report(&BackendJobId("6".into())).unwrap();
        assert_eq!(report.usage, Usage::default());
        assert_eq!(report.waiting.as_deref(), Some("Slurm: BeginTime"));
        assert_eq!(
            record.pending_reason, None,
            "a failed job waits for nothing"
        );
    }

    #[test]
    fn sacct_rows_from_slurmdbd_and_jobcomp() {
        let r = sacct_record(
            "9|CANCELLED by 0|0:0|0|None|2026-11-29T22:20:08|None assigned||\n",
            false,
        )
        .unwrap();
        assert_eq!((r.started_at, r.state.as_str()), (None, "CANCELLED by 0"));
        let r = sacct_record(
            "7|COMPLETED|0:0|12|2026-11-29T22:00:00|2026-11-29T22:00:12|\
             billing=8,cpu=8,gres/gpu=1,mem=32G,node=1|gpu01|00:01:30.500\n",
            false,
        )
        .unwrap();
        assert_eq!(r.usage.cpus, 8);
        assert_eq!(r.usage.gpus, 1);
        assert_eq!(r.usage.memory_bytes, 32 << 30);
        assert_eq!(r.usage.cpu_seconds, Some(90.5));
        let r = sacct_record(
            "2|TIMEOUT|0:0|61|2026-11-29T22:20:05|2026-11-29T22:21:06|vm|1|2\n",
            true,
        )
        .unwrap();
        assert_eq!((r.usage.nodes, r.usage.cpus), (1, 2));
        assert_eq!(sacct_record("", false), None);
    }

    #[test]
    fn tres_sizes_and_durations() {
        let u = parse_tres("cpu=8,mem=32G,node=1,billing=8,gres/gpu=1");
        assert_eq!(
            (u.cpus, u.memory_bytes, u.nodes, u.gpus),
            (8, 32 << 30, 1, 1)
        );
        let u = parse_tres("cpu=2,mem=1.50G,node=2,gres/gpu:a100=2,gres/gpu:v100=1");
        assert_eq!((u.memory_bytes, u.gpus), (1610612736, 3));
        assert_eq!(parse_tres("").cpus, 0);
        assert_eq!(parse_size("1024", 1 << 20), Some(1 << 30));
        assert_eq!(parse_size("512K", 1), Some(512 << 10));
        assert_eq!(parse_size("2T", 1), Some(2 << 40));
        assert_eq!(parse_size("lots", 1), None);
        assert_eq!(parse_duration("00:00.002"), Some(0.002));
        assert_eq!(parse_duration("1-02:03:04"), Some(93784.0));
        assert_eq!(parse_duration("02:03:04"), Some(7384.0));
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_time("Unknown"), None);
        assert_eq!(parse_time("None"), None);
        assert_eq!(
            parse_time("2026-11-29T22:19:57").unwrap().to_rfc3339(),
            "2026-11-29T22:19:57+00:00"
        );
        assert_eq!(epoch(0), None);
        assert!(!has_nodes("None assigned"));
        assert!(!has_nodes("(null)"));
        assert!(has_nodes("node[01-04]"));
    }
}
