//! How a Slurm site is reached and what it is asked for. Secrets never sit in the config:
//! a REST token is named by the environment variable or the file that holds it.

use meridian_adapter_core::seconds;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One Slurm site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlurmConfig {
    /// The command line (`sbatch`, `squeue`, `sacct`…) or slurmrestd.
    pub mode: Mode,
    /// `--partition`; the cluster's default partition when unset. Capacity counts only
    /// this partition's nodes when it is set.
    #[serde(default)]
    pub partition: Option<String>,
    /// `--account`; the user's default account when unset.
    #[serde(default)]
    pub account: Option<String>,
    /// Run the commands on a login node over SSH instead of on this machine. In REST mode
    /// it is used only to read the jobs' output files.
    #[serde(default)]
    pub ssh: Option<SshTarget>,
    /// Where job scripts run from and their output goes (`meridian-<slurm id>.out` and
    /// `.err`): a directory every compute node and the adapter (or its SSH host) share.
    pub work_dir: PathBuf,
    /// Where the Slurm commands are; `PATH` when unset.
    #[serde(default)]
    pub bin_dir: Option<PathBuf>,
    /// The apptainer (or singularity) command that runs jobs naming an image, e.g.
    /// `apptainer`. Without one, a job with an image is rejected.
    #[serde(default)]
    pub container_runtime: Option<String>,
    /// Where the submit locks live (a local directory). Defaults to `<work_dir>/.meridian-locks`
    /// for a local site and a directory under the system temp dir for an SSH one.
    #[serde(default)]
    pub lock_dir: Option<PathBuf>,
    #[serde(default)]
    pub poll: PollConfig,
    /// The cluster's `MaxArraySize` (`scontrol show config`; Slurm's default is 1001):
    /// an array's tasks go to the site as one `sbatch --array` of up to this many (at
    /// most 1000), which holds them to the array's cap. 0 or 1 sends each task alone.
    #[serde(default = "default_max_array_size")]
    pub max_array_size: u32,
    /// A directory every compute node shares (a parallel file system) that holds the
    /// site's volumes, each at `<volume_root>/<workflow>/<volume>`. The data mover writes
    /// a job's inputs there before it starts and copies its outputs out from there (for
    /// a site driven from this machine; over SSH it cannot reach it). Without one, a job
    /// that mounts a volume is refused.
    #[serde(default)]
    pub volume_root: Option<PathBuf>,
}

fn default_max_array_size() -> u32 {
    1001
}

/// How the site is spoken to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mode {
    /// `sbatch`, `squeue`, `scontrol`, `sacct`, `scancel`, `sinfo`.
    Cli,
    /// slurmrestd.
    Rest(RestConfig),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestConfig {
    /// e.g. `http://127.0.0.1:6820`.
    pub url: String,
    /// e.g. `v0.0.38`; discovered from the site when unset.
    #[serde(default)]
    pub api_version: Option<String>,
    /// Sent as `X-SLURM-USER-NAME`; the jobs run as this user.
    pub user: String,
    /// Where the JWT (`X-SLURM-USER-TOKEN`) is read, at every request so it can rotate.
    pub token: TokenSource,
}

/// Where a secret is: never the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The name of an environment variable, e.g. `SLURM_JWT`.
    Env(String),
    /// A file holding the token (`scontrol token` output, `SLURM_JWT=…`, is accepted too).
    File(PathBuf),
}

/// A login node reached with `ssh -i key -p port user@host`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshTarget {
    pub host: String,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub key_path: Option<PathBuf>,
    #[serde(default)]
    pub port: Option<u16>,
}

/// Timeouts and windows of the adapter's own calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PollConfig {
    /// The longest one command (or HTTP request) may take before the site counts as
    /// unavailable (seconds in a config file).
    #[serde(with = "seconds")]
    pub command_timeout: Duration,
    /// How far back accounting is searched when finding a job by its Meridian id.
    #[serde(with = "seconds")]
    pub find_lookback: Duration,
}

impl Default for PollConfig {
    fn default() -> Self {
        PollConfig {
            command_timeout: Duration::from_secs(30),
            find_lookback: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

impl SlurmConfig {
    /// A site driven by the Slurm commands on this machine.
    pub fn cli(work_dir: impl Into<PathBuf>) -> Self {
        SlurmConfig {
            mode: Mode::Cli,
            partition: None,
            account: None,
            ssh: None,
            work_dir: work_dir.into(),
            bin_dir: None,
            container_runtime: None,
            lock_dir: None,
            poll: PollConfig::default(),
            max_array_size: default_max_array_size(),
            volume_root: None,
        }
    }

    /// A site driven through slurmrestd at `url` as `user`.
    pub fn rest(
        url: impl Into<String>,
        user: impl Into<String>,
        token: TokenSource,
        work_dir: impl Into<PathBuf>,
    ) -> Self {
        SlurmConfig {
            mode: Mode::Rest(RestConfig {
                url: url.into(),
                api_version: None,
                user: user.into(),
                token,
            }),
            ..SlurmConfig::cli(work_dir)
        }
    }

    pub(crate) fn lock_dir(&self) -> PathBuf {
        if let Some(dir) = &self.lock_dir {
            return dir.clone();
        }
        match &self.ssh {
            None => self.work_dir.join(".meridian-locks"),
            Some(ssh) => std::env::temp_dir().join(format!("meridian-slurm-locks-{}", ssh.host)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rest_config_names_its_token_and_never_holds_it() {
        let text = r#"{
            "mode": {"kind": "rest", "url": "http://login:6820", "user": "alice",
                     "token": {"env": "SLURM_JWT"}},
            "work_dir": "/scratch/meridian", "partition": "gpu",
            "ssh": {"host": "login", "user": "alice", "key_path": "/keys/id", "port": 2222}
        }"#;
        let config: SlurmConfig = serde_json::from_str(text).unwrap();
        let Mode::Rest(rest) = &config.mode else {
            panic!("{config:?}")
        };
        assert_eq!(rest.token, TokenSource::Env("SLURM_JWT".into()));
        assert_eq!(rest.api_version, None);
        assert_eq!(config.poll, PollConfig::default());
        assert_eq!(config.ssh.as_ref().unwrap().port, Some(2222));
        let cli: SlurmConfig =
            serde_json::from_str(r#"{"mode": {"kind": "cli"}, "work_dir": "/w"}"#).unwrap();
        assert_eq!(cli, SlurmConfig::cli("/w"));
        assert_eq!(cli.lock_dir(), PathBuf::from("/w/.meridian-locks"));
    }
}
