//! Runs the PBS commands (`qsub`, `qstat`, `qdel`, `pbsnodes`) on this machine, from
//! `bin_dir` when one is configured (the contract tests put stand-ins there), each with a
//! deadline and `TZ=UTC` (qstat prints local times without a zone).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

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

#[derive(Debug, Clone)]
pub struct Runner {
    pub bin_dir: Option<PathBuf>,
    pub timeout: Duration,
}

impl Runner {
    fn program(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => Path::new(name).to_path_buf(),
        }
    }

    /// Runs `name args…`. `Err` means it could not run at all (missing, timed out).
    pub async fn run(&self, name: &str, args: &[String]) -> std::io::Result<Output> {
        let program = self.program(name);
        let what = format!("{} {}", program.display(), args.join(" "));
        let child = tokio::process::Command::new(&program)
            .args(args)
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run {what}: {e}")))?;
        let output = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{what} took longer than {:?}", self.timeout),
                )
            })??;
        let out = Output {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        tracing::debug!(command = %what, code = ?out.code, "ran");
        Ok(out)
    }
}

pub use meridian_adapter_core::batch::shell_quote;
