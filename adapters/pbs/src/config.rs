//! How a PBS site is reached and what it is asked for.

use meridian_adapter_core::seconds;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One OpenPBS or PBS Professional site, driven through its commands on this machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PbsConfig {
    /// Where job scripts are written and output is delivered (`meridian-<job id>.sh`,
    /// `.out`, `.err`): a directory the execution hosts can deliver to and this machine
    /// reads.
    pub work_dir: PathBuf,
    /// `-q`; the server's default queue when unset. Pending depth counts this queue only.
    #[serde(default)]
    pub queue: Option<String>,
    /// `-A` (the account string).
    #[serde(default)]
    pub account: Option<String>,
    /// Where `qsub`, `qstat`, `qdel` and `pbsnodes` are (e.g. `/opt/pbs/bin`); `PATH`
    /// when unset.
    #[serde(default)]
    pub bin_dir: Option<PathBuf>,
    /// The apptainer (or singularity) command that runs jobs naming an image. Without one,
    /// a job with an image is rejected.
    #[serde(default)]
    pub container_runtime: Option<String>,
    /// The site's custom chunk resource that names a GPU model (e.g. `gpu_model`), if it
    /// has one: PBS has no standard one, so the model is only sent when this is set.
    #[serde(default)]
    pub gpu_model_resource: Option<String>,
    /// Where the submit locks live; `<work_dir>/.meridian-locks` when unset.
    #[serde(default)]
    pub lock_dir: Option<PathBuf>,
    /// The longest one command may take before the site counts as unavailable (seconds
    /// in a config file).
    #[serde(default = "default_timeout", with = "seconds")]
    pub command_timeout: Duration,
    /// The server's `max_array_size` (`qstat -B -f`; PBS's default is 10000): an array's
    /// tasks go to the site as one `qsub -J` of up to this many (at most 1000), held to
    /// the array's cap with `-W max_run_subjobs` (PBS Professional 2020.1 and later).
    /// 0 or 1 sends each task alone.
    #[serde(default = "default_max_array_size")]
    pub max_array_size: u32,
    /// A directory every execution host and this machine share (a parallel file system)
    /// that holds the site's volumes, each at `<volume_root>/<workflow>/<volume>`. The
    /// data mover writes a job's inputs there before it starts and copies its outputs out
    /// from there. Without one, a job that mounts a volume is refused.
    #[serde(default)]
    pub volume_root: Option<PathBuf>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_max_array_size() -> u32 {
    10_000
}

impl PbsConfig {
    /// A site whose jobs write under `work_dir`, with the server's defaults for the rest.
    pub fn new(work_dir: impl Into<PathBuf>) -> Self {
        PbsConfig {
            work_dir: work_dir.into(),
            queue: None,
            account: None,
            bin_dir: None,
            container_runtime: None,
            gpu_model_resource: None,
            lock_dir: None,
            command_timeout: default_timeout(),
            max_array_size: default_max_array_size(),
            volume_root: None,
        }
    }

    pub(crate) fn lock_dir(&self) -> PathBuf {
        self.lock_dir
            .clone()
            .unwrap_or_else(|| self.work_dir.join(".meridian-locks"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_a_config_file_leaves_out() {
        let config: PbsConfig =
            serde_json::from_str(r#"{"work_dir": "/scratch/m", "queue": "workq"}"#).unwrap();
        assert_eq!(config.queue.as_deref(), Some("workq"));
        assert_eq!(config.command_timeout, Duration::from_secs(30));
        assert_eq!(
            config.lock_dir(),
            PathBuf::from("/scratch/m/.meridian-locks")
        );
    }
}
