//! A real Slurm for tests: finds one running on this machine, or starts the test
//! cluster with `infra/slurm/start.sh` (once per process, under a lock file shared by
//! every test binary). Used by this crate's tests and by Meridian's end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sh(cmd: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run sh")
}

/// slurmctld answers, the node takes jobs, and slurmrestd listens.
pub fn slurm_ready() -> bool {
    let ping = sh("scontrol ping 2>/dev/null");
    let nodes = sh("sinfo -h -N -o %t 2>/dev/null");
    String::from_utf8_lossy(&ping.stdout).contains("is UP")
        && String::from_utf8_lossy(&nodes.stdout)
            .lines()
            .any(|s| ["idle", "mix", "alloc"].iter().any(|p| s.starts_with(p)))
        && std::net::TcpStream::connect("127.0.0.1:6820").is_ok()
}

/// Makes sure Slurm runs, starting it if needed; the error says why it could not.
pub fn ensure_slurm() -> Result<(), String> {
    static STARTED: OnceLock<Result<(), String>> = OnceLock::new();
    STARTED
        .get_or_init(|| {
            // Other test binaries may be starting it too: one at a time.
            let lock =
                std::fs::File::create(std::env::temp_dir().join("meridian-slurm-start.lock"))
                    .map_err(|e| format!("lock file: {e}"))?;
            lock.lock().map_err(|e| format!("lock file: {e}"))?;
            if slurm_ready() {
                return Ok(());
            }
            let script = repo_root().join("infra/slurm/start.sh");
            let out = Command::new("bash")
                .arg(&script)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} failed ({}):\n{}",
                    script.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            if !slurm_ready() {
                return Err(format!(
                    "{} succeeded but Slurm is still not ready:\n{}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(())
        })
        .clone()
}
