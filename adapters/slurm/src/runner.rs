//! The one way the adapter runs a command: here, or on a login node over SSH. Tests can
//! put their own [`CommandRunner`] in its place.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;

use crate::config::SshTarget;

/// A command to run: a program, its arguments, what to add to its environment, and what
/// to write to its stdin.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Command {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<String>,
}

impl Command {
    pub fn new(program: &str) -> Self {
        Command {
            program: program.into(),
            ..Command::default()
        }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn stdin(mut self, input: impl Into<String>) -> Self {
        self.stdin = Some(input.into());
        self
    }

    /// Slurm prints times in local time without a zone: make the local time UTC, in one
    /// fixed format whatever the user's profile sets.
    pub fn utc_times(self) -> Self {
        self.env("TZ", "UTC")
            .env("SLURM_TIME_FORMAT", "%Y-%m-%dT%H:%M:%S")
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.program)?;
        for arg in &self.args {
            write!(f, " {}", shell_quote(arg))?;
        }
        Ok(())
    }
}

/// What a command did. `code` is `None` when a signal ended it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs commands for the adapter. `Err` means the command could not be run at all (not
/// found, SSH unreachable, timed out); a command that ran and failed is an `Ok` output.
#[async_trait]
pub trait CommandRunner: Send + Sync + fmt::Debug {
    async fn run(&self, command: &Command) -> std::io::Result<Output>;
}

/// Runs commands on this machine, each with a deadline.
#[derive(Debug, Clone)]
pub struct LocalRunner {
    pub bin_dir: Option<PathBuf>,
    pub timeout: Duration,
}

#[async_trait]
impl CommandRunner for LocalRunner {
    async fn run(&self, command: &Command) -> std::io::Result<Output> {
        let program = resolve(self.bin_dir.as_deref(), &command.program);
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&command.args);
        for (k, v) in &command.env {
            cmd.env(k, v);
        }
        execute(
            cmd,
            command.stdin.as_deref(),
            self.timeout,
            &command.to_string(),
        )
        .await
    }
}

/// Runs commands on a login node: `ssh -i key -p port user@host -- <quoted command>`.
#[derive(Debug, Clone)]
pub struct SshRunner {
    pub target: SshTarget,
    /// Where the Slurm commands are on the remote host; its `PATH` when unset.
    pub bin_dir: Option<PathBuf>,
    pub timeout: Duration,
}

impl SshRunner {
    /// The `ssh` argument list for `command` (ssh joins everything after the host into one
    /// remote shell command line, so each word is quoted).
    pub fn ssh_args(&self, command: &Command) -> Vec<String> {
        let mut args = vec![
            "-o".to_string(),
            "BatchMode=yes".into(),
            "-o".into(),
            format!("ConnectTimeout={}", self.timeout.as_secs().clamp(1, 60)),
        ];
        if let Some(key) = &self.target.key_path {
            args.extend(["-i".into(), key.display().to_string()]);
        }
        if let Some(port) = self.target.port {
            args.extend(["-p".into(), port.to_string()]);
        }
        args.push(match &self.target.user {
            Some(user) => format!("{user}@{}", self.target.host),
            None => self.target.host.clone(),
        });
        args.push("--".into());
        let mut remote = Vec::new();
        if !command.env.is_empty() {
            remote.push("env".to_string());
            for (k, v) in &command.env {
                remote.push(shell_quote(&format!("{k}={v}")));
            }
        }
        let program = resolve(self.bin_dir.as_deref(), &command.program);
        remote.push(shell_quote(&program.display().to_string()));
        remote.extend(command.args.iter().map(|a| shell_quote(a)));
        args.push(remote.join(" "));
        args
    }
}

#[async_trait]
impl CommandRunner for SshRunner {
    async fn run(&self, command: &Command) -> std::io::Result<Output> {
        let mut cmd = tokio::process::Command::new("ssh");
        cmd.args(self.ssh_args(command));
        let out = execute(
            cmd,
            command.stdin.as_deref(),
            self.timeout,
            &command.to_string(),
        )
        .await?;
        // 255 is ssh's own failure (unreachable, refused key), not the remote command's.
        if out.code == Some(255) {
            return Err(std::io::Error::other(format!(
                "ssh to {} failed: {}",
                self.target.host,
                out.stderr.trim()
            )));
        }
        Ok(out)
    }
}

fn resolve(bin_dir: Option<&Path>, program: &str) -> PathBuf {
    match bin_dir {
        Some(dir) if !program.contains('/') => dir.join(program),
        _ => PathBuf::from(program),
    }
}

async fn execute(
    mut cmd: tokio::process::Command,
    stdin: Option<&str>,
    timeout: Duration,
    what: &str,
) -> std::io::Result<Output> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run {what}: {e}")))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).await?;
        drop(pipe);
    }
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{what} took longer than {timeout:?}"),
            )
        })??;
    let out = Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    tracing::debug!(command = what, code = ?out.code, "ran");
    Ok(out)
}

pub use meridian_adapter_core::batch::shell_quote;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_the_shell() {
        for s in [
            "plain",
            "",
            "two words",
            "it's",
            "$HOME `x` \"q\" \\ ; | & > *",
            "line\nbreak",
            "cell-${ARRAY_INDEX}",
        ] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_quote(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
        assert_eq!(shell_quote("a/b-c.d"), "a/b-c.d");
    }

    #[test]
    fn ssh_command_lines_quote_every_word() {
        let runner = SshRunner {
            target: SshTarget {
                host: "login1".into(),
                user: Some("alice".into()),
                key_path: Some("/keys/id_ed25519".into()),
                port: Some(2222),
            },
            bin_dir: None,
            timeout: Duration::from_secs(10),
        };
        let cmd = Command::new("squeue").arg("-o").arg("%i %k").utc_times();
        assert_eq!(
            runner.ssh_args(&cmd),
            [
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
                "-i",
                "/keys/id_ed25519",
                "-p",
                "2222",
                "alice@login1",
                "--",
                "env TZ=UTC SLURM_TIME_FORMAT=%Y-%m-%dT%H:%M:%S squeue -o '%i %k'"
            ]
        );
    }

    #[tokio::test]
    async fn local_commands_get_stdin_env_and_a_deadline() {
        let runner = LocalRunner {
            bin_dir: None,
            timeout: Duration::from_secs(5),
        };
        let out = runner
            .run(
                &Command::new("sh")
                    .args(["-c", "cat; echo \"$TZ\" >&2; exit 4"])
                    .stdin("in")
                    .utc_times(),
            )
            .await
            .unwrap();
        assert_eq!(out.code, Some(4));
        assert_eq!(out.stdout, "in");
        assert_eq!(out.stderr, "UTC\n");
        let slow = LocalRunner {
            bin_dir: None,
            timeout: Duration::from_millis(100),
        };
        let err = slow.run(&Command::new("sleep").arg("5")).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    }
}
