//! Processes as Linux shows them in `/proc`: telling our job's process from a stranger that
//! reused its pid, signalling a job's process group, and the `flock` that marks a submit in
//! progress.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Who a pid was when we started it: the pid alone may name another process later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Identity {
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
    /// The kernel's boot id: start ticks are only comparable within one boot.
    pub boot_id: Option<String>,
}

impl Identity {
    /// Reads the identity of the running process `pid`.
    pub fn of(pid: u32) -> io::Result<Identity> {
        let stat = Stat::read(pid)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no process {pid}")))?;
        Ok(Identity {
            pid,
            start_ticks: stat.start_ticks,
            boot_id: boot_id(),
        })
    }

    /// True while this very process exists and has not exited (a zombie has exited).
    pub fn is_alive(&self) -> bool {
        if let (Some(recorded), Some(now)) = (&self.boot_id, boot_id()) {
            if *recorded != now {
                return false;
            }
        }
        match Stat::read(self.pid) {
            Ok(Some(stat)) => stat.start_ticks == self.start_ticks && !stat.exited(),
            _ => false,
        }
    }
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// The parts of `/proc/<pid>/stat` we use.
struct Stat {
    state: char,
    pgrp: i64,
    start_ticks: u64,
}

impl Stat {
    fn read(pid: u32) -> io::Result<Option<Stat>> {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(text) => Ok(Stat::parse(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            // ESRCH: the process went away while we read.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn parse(text: &str) -> Option<Stat> {
        // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        let rest = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // fields[0] is field 3 (state); field n is fields[n - 3].
        Some(Stat {
            state: fields.first()?.chars().next()?,
            pgrp: fields.get(2)?.parse().ok()?,
            start_ticks: fields.get(19)?.parse().ok()?,
        })
    }

    fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Sends `signal` to process group `pgid`; false when no process of it could be signalled.
fn signal_group(pgid: u32, signal: i32) -> bool {
    // Never let a bad pid turn into kill(0) (our own group) or kill(-1) (everyone).
    let Ok(pgid) = i32::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// True while some process of group `pgid` has not exited (zombies do not count: they
/// still answer kill(2) until their parent reaps them).
pub(crate) fn group_alive(pgid: u32) -> bool {
    if !signal_group(pgid, 0) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            return false;
        };
        matches!(Stat::read(pid), Ok(Some(stat)) if stat.pgrp == i64::from(pgid) && !stat.exited())
    })
}

/// Stops process group `pgid`: SIGTERM, then SIGKILL to whatever is left after `grace`.
/// Returns once the group is gone, or a while after SIGKILL if something lingers
/// (a process stuck in the kernel).
pub(crate) async fn kill_group(pgid: u32, grace: Duration) {
    if !signal_group(pgid, libc::SIGTERM) {
        return;
    }
    if wait_group_gone(pgid, grace).await {
        return;
    }
    tracing::warn!(pgid, ?grace, "job ignored SIGTERM; sending SIGKILL");
    signal_group(pgid, libc::SIGKILL);
    if !wait_group_gone(pgid, Duration::from_secs(10)).await {
        tracing::error!(pgid, "job survives SIGKILL");
    }
}

async fn wait_group_gone(pgid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if !group_alive(pgid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Takes an exclusive `flock` on `file`, held until the file is closed.
pub(crate) fn lock_exclusive(file: &File) -> io::Result<()> {
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True when someone holds an exclusive `flock` on `path` (a missing file is not locked).
pub(crate) fn is_locked(path: &Path) -> io::Result<bool> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    // SAFETY: flock(2) on a descriptor we own; closing `file` releases what we took.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        return Ok(false);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(true)
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let text = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194304 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 100 18446744073709551615";
        let stat = Stat::parse(text).expect("parse");
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.pgrp, 4242);
        assert_eq!(stat.start_ticks, 987654);
    }

    #[test]
    fn our_own_process_is_alive_and_a_changed_start_time_is_not() {
        let me = Identity::of(std::process::id()).expect("identity");
        assert!(me.is_alive());
        let stranger = Identity {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(!stranger.is_alive(), "a reused pid is not our process");
        let other_boot = Identity {
            boot_id: Some("another-boot".into()),
            ..me
        };
        assert!(!other_boot.is_alive(), "a pid from before a reboot is gone");
    }

    #[test]
    fn never_signals_init_or_everyone() {
        assert!(!signal_group(0, 0));
        assert!(!signal_group(1, 0));
        assert!(!signal_group(u32::MAX, 0));
    }
}
