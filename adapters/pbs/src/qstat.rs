//! Reading `qstat -f -F json` and `pbsnodes -a -F json`. PBS prints attribute values as
//! JSON strings or numbers depending on the attribute, the version and the hooks that set
//! them (`"ncpus":4` or `"ncpus":"4"`, a `Variable_List` value as a bare number), so every
//! reader here accepts both.

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use meridian_adapter_core::{Capacity, Usage};
use serde_json::Value;

use crate::state::Observed;

/// A value as text, whether PBS printed a string or a number.
pub fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A value as an integer, whether PBS printed a number or a numeric string.
pub fn number(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A PBS size (`16gb`, `4194304kb`, `0b`, a bare number of bytes) in bytes. PBS units
/// are binary (`kb` = 1024 bytes); `w` units are 8-byte words.
pub fn size(v: &Value) -> Option<u64> {
    if let Value::Number(n) = v {
        return n.as_u64();
    }
    let s = v.as_str()?.trim().to_ascii_lowercase();
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num: u64 = num.parse().ok()?;
    let (scale, word) = match unit.strip_suffix('w') {
        Some(prefix) => (prefix, 8),
        None => (unit.strip_suffix('b').unwrap_or(unit), 1),
    };
    let factor: u64 = match scale {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        "p" => 1 << 50,
        _ => return None,
    };
    num.checked_mul(factor)?.checked_mul(word)
}

/// A duration, `[[HH:]MM:]SS` or a bare number of seconds, in seconds.
pub fn seconds(v: &Value) -> Option<u64> {
    if let Some(n) = number(v).filter(|_| !v.as_str().is_some_and(|s| s.contains(':'))) {
        return u64::try_from(n).ok();
    }
    let s = v.as_str()?;
    s.split(':').try_fold(0u64, |acc, part| {
        Some(acc * 60 + part.trim().parse::<u64>().ok()?)
    })
}

/// A time as qstat prints it (`Tue Oct  4 21:23:20 2022`), read as UTC: the adapter runs
/// qstat with `TZ=UTC`.
pub fn time(v: &Value) -> Option<DateTime<Utc>> {
    let s = v.as_str()?;
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    let naive = NaiveDateTime::parse_from_str(&s, "%a %b %d %H:%M:%S %Y").ok()?;
    Some(Utc.from_utc_datetime(&naive))
}

/// The jobs of a `qstat -f -F json` answer, by id (none when the key is absent, as on a
/// server with no jobs).
pub fn jobs(stdout: &str) -> Result<Vec<(String, Value)>, String> {
    let v: Value = serde_json::from_str(stdout)
        .map_err(|e| format!("qstat printed something that is not JSON ({e})"))?;
    Ok(v["Jobs"]
        .as_object()
        .map(|jobs| jobs.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default())
}

/// One job as the adapter reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobInfo {
    pub observed: Observed,
    pub usage: Usage,
    /// The Meridian job id in its `Variable_List` (the adapter's tag).
    pub meridian_job_id: Option<String>,
    /// For an array submitted as one, the batch it carries (its tag).
    pub meridian_batch_id: Option<String>,
    /// Where its output is delivered, without the `host:` prefix.
    pub output_path: Option<String>,
    pub error_path: Option<String>,
    /// The first host of `exec_host` (`node17/0*2+node18/0*2`): where the job's script
    /// runs, once it runs.
    pub exec_host: Option<String>,
}

fn path(v: &Value) -> Option<String> {
    let p = v.as_str()?;
    // `host:/path`; a path with no host has no colon before its first slash.
    Some(match p.split_once(':') {
        Some((host, rest)) if !host.contains('/') => rest.to_string(),
        _ => p.to_string(),
    })
}

/// Reads one job of `qstat -f -F json -x`.
pub fn job_info(job: &Value) -> JobInfo {
    let limits = &job["Resource_List"];
    let used = &job["resources_used"];
    let started_at = time(&job["stime"]);
    let walltime_exceeded = match (seconds(&used["walltime"]), seconds(&limits["walltime"])) {
        (Some(used), Some(limit)) => limit > 0 && used >= limit,
        _ => false,
    };
    let observed = Observed {
        state: text(&job["job_state"]).unwrap_or_default(),
        exit_status: number(&job["Exit_status"]),
        started_at,
        ended_at: time(&job["obittime"]).or_else(|| time(&job["mtime"])),
        walltime_exceeded,
        cancel_requested: false,
    };
    let usage = if started_at.is_some() {
        Usage {
            gpu_vendor: None,
            gpu_model: None,
            billed: None,
            nodes: number(&limits["nodect"]).unwrap_or(1).max(0) as u32,
            cpus: number(&limits["ncpus"])
                .or_else(|| number(&used["ncpus"]))
                .unwrap_or(0)
                .max(0) as u32,
            memory_bytes: size(&limits["mem"]).unwrap_or(0),
            gpus: number(&limits["ngpus"]).unwrap_or(0).max(0) as u32,
            cpu_seconds: seconds(&used["cput"]).map(|s| s as f64),
            max_rss_bytes: size(&used["mem"]),
        }
    } else {
        Usage::default()
    };
    JobInfo {
        observed,
        usage,
        meridian_job_id: text(&job["Variable_List"]["MERIDIAN_JOB_ID"]),
        meridian_batch_id: text(&job["Variable_List"]["MERIDIAN_BATCH_ID"]),
        output_path: path(&job["Output_Path"]),
        error_path: path(&job["Error_Path"]),
        exec_host: text(&job["exec_host"])
            .and_then(|h| h.split(['/', '+']).next().map(str::to_string))
            .filter(|h| !h.is_empty()),
    }
}

/// Capacity from `pbsnodes -a -F json`, counting only nodes that take jobs in the free
/// figures, and only nodes of `queue` when a node names its queue; free GPUs by model
/// where nodes carry a `gpu_model` (or `gpu_type`) resource.
pub fn capacity(nodes: &Value, queue: Option<&str>) -> Capacity {
    let mut c = Capacity {
        healthy: true,
        ..Capacity::default()
    };
    let down = [
        "offline",
        "down",
        "state-unknown",
        "stale",
        "unresolvable",
        "sleep",
        "maintenance",
        "provisioning",
        "wait-provisioning",
        "initializing",
    ];
    for node in nodes["nodes"]
        .as_object()
        .into_iter()
        .flat_map(|n| n.values())
    {
        if node.get("Error").is_some() {
            continue;
        }
        if let (Some(q), Some(node_queue)) = (queue, text(&node["queue"])) {
            if node_queue != q {
                continue;
            }
        }
        let avail = &node["resources_available"];
        let assigned = &node["resources_assigned"];
        let cpus = number(&avail["ncpus"]).unwrap_or(0).max(0) as u32;
        let mem = size(&avail["mem"]).unwrap_or(0);
        c.total_cpus += cpus;
        c.total_memory_bytes += mem;
        let state = text(&node["state"]).unwrap_or_default();
        if state.split(',').any(|s| down.contains(&s.trim())) {
            continue;
        }
        let used_cpus = number(&assigned["ncpus"]).unwrap_or(0).max(0) as u32;
        c.free_cpus += cpus.saturating_sub(used_cpus);
        c.free_memory_bytes += mem.saturating_sub(size(&assigned["mem"]).unwrap_or(0));
        let gpus = number(&avail["ngpus"]).unwrap_or(0).max(0) as u32;
        let free = gpus.saturating_sub(number(&assigned["ngpus"]).unwrap_or(0).max(0) as u32);
        c.free_gpus += free;
        // PBS has no standard name for a GPU's model: sites that tell models apart add a
        // string resource, `gpu_model` or `gpu_type`, to their nodes.
        if let Some(model) = text(&avail["gpu_model"]).or_else(|| text(&avail["gpu_type"])) {
            if gpus > 0 {
                *c.free_gpus_by_model
                    .entry(meridian_adapter_core::gpu::catalogue_model(&model))
                    .or_insert(0) += free;
            }
        }
        if state.trim() == "free" && used_cpus == 0 {
            c.idle_nodes += 1;
        }
    }
    c
}

/// Jobs waiting, from a `state_count` (`Transit:0 Queued:5 Held:0 Waiting:1 …`): queued,
/// waiting and in transit.
pub fn pending(state_count: &str) -> u32 {
    state_count
        .split_whitespace()
        .filter_map(|item| item.split_once(':'))
        .filter(|(k, _)| matches!(*k, "Queued" | "Waiting" | "Transit"))
        .filter_map(|(_, v)| v.parse::<u32>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_may_be_strings_or_numbers() {
        assert_eq!(number(&json!(4)), Some(4));
        assert_eq!(number(&json!("4")), Some(4));
        assert_eq!(number(&json!("-29")), Some(-29));
        assert_eq!(text(&json!(4294967296u64)).as_deref(), Some("4294967296"));
        assert_eq!(size(&json!("16gb")), Some(16 << 30));
        assert_eq!(size(&json!("4194304kb")), Some(4 << 30));
        assert_eq!(size(&json!("0b")), Some(0));
        assert_eq!(size(&json!("2mw")), Some(16 << 20));
        assert_eq!(size(&json!(4294967296u64)), Some(4 << 30));
        assert_eq!(size(&json!("lots")), None);
        assert_eq!(seconds(&json!("01:02:03")), Some(3723));
        assert_eq!(seconds(&json!("00:00:00")), Some(0));
        assert_eq!(seconds(&json!(60)), Some(60));
        assert_eq!(seconds(&json!("60")), Some(60));
        assert_eq!(
            time(&json!("Tue Oct  4 21:23:20 2022"))
                .unwrap()
                .to_rfc3339(),
            "2022-10-04T21:23:20+00:00"
        );
        assert_eq!(time(&json!("yesterday")), None);
    }

    #[test]
    fn paths_lose_their_host() {
        assert_eq!(
            path(&json!("login1:/scratch/a.out")).as_deref(),
            Some("/scratch/a.out")
        );
        assert_eq!(
            path(&json!("/scratch/a.out")).as_deref(),
            Some("/scratch/a.out")
        );
        assert_eq!(path(&json!("/odd:name")).as_deref(), Some("/odd:name"));
    }

    #[test]
    fn state_counts() {
        assert_eq!(
            pending("Transit:1 Queued:5 Held:2 Waiting:1 Running:2 Exiting:0 Begun:0 "),
            7
        );
        assert_eq!(pending(""), 0);
    }
}
