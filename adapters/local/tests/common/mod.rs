//! Test hygiene: a check that fails midway leaves its jobs running (the adapter never kills
//! jobs when it is dropped). [`KillLeftovers`] kills them when the test's state goes away.

use std::path::PathBuf;

/// Kills, on drop, every job under `root` that is still running.
pub struct KillLeftovers {
    pub root: PathBuf,
}

impl Drop for KillLeftovers {
    fn drop(&mut self) {
        let Ok(jobs) = std::fs::read_dir(self.root.join("jobs")) else {
            return;
        };
        for dir in jobs.flatten().map(|e| e.path()) {
            let Some(pid) = std::fs::read_to_string(dir.join("pid"))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
            else {
                continue;
            };
            // Only our wrapper: a process group leader whose command line names this job
            // directory (the pid may have been reused by now).
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy());
            if pid > 1 && ours {
                // SAFETY: kill(2) on the process group of a job this test started.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        }
    }
}
