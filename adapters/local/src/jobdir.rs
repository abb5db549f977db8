//! One job's directory, whose files are the job's whole state, and the job state derived
//! from them. The adapter keeps nothing it needs only in memory: a restarted adapter (or a
//! second one on the same root) reads the same files and reaches the same answer.
//!
//! Writes are atomic (a temporary file renamed into place) except the wrapper's
//! `exit_code`, which a reader treats as absent until it parses. `outcome.json` is
//! published with link(2), which fails if it exists: the first of cancel, timeout,
//! refusal or loss to be decided wins, and later ones see it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use meridian_adapter_core::{FailureReason, JobRequest, JobState, Usage};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::launch::Launch;
use crate::process::{self, Identity};

pub(crate) const REQUEST: &str = "request.json";
pub(crate) const SUBMIT_LOCK: &str = ".submit.lock";
pub(crate) const STDOUT: &str = "stdout";
pub(crate) const STDERR: &str = "stderr";
pub(crate) const LAUNCH: &str = "launch.json";
/// The GPUs the job was given (a JSON list of devices), written before it is claimed, so
/// a restarted adapter gives them to no one else while it runs.
pub(crate) const DEVICES: &str = "devices.json";
pub(crate) const PID_IDENTITY: &str = "pid_identity";
pub(crate) const PID: &str = "pid";
pub(crate) const STARTED_AT: &str = "started_at";
pub(crate) const EXIT_CODE: &str = "exit_code";
pub(crate) const TIMES: &str = "times";
pub(crate) const OUTCOME: &str = "outcome.json";

/// An end the adapter decided, rather than the command's own exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OutcomeKind {
    Cancelled,
    Timeout,
    Refused,
    BootFailure,
    Lost,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Outcome {
    pub kind: OutcomeKind,
    /// When it was decided.
    pub at: DateTime<Utc>,
    /// When the job's processes were gone, if that came later (a kill takes a while).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Outcome {
    pub fn now(kind: OutcomeKind, message: Option<String>) -> Outcome {
        Outcome {
            kind,
            at: Utc::now(),
            ended_at: None,
            message,
        }
    }
}

/// A job's state as its files tell it.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub request: JobRequest,
    pub state: JobState,
    /// The wrapper process, once recorded.
    pub identity: Option<Identity>,
    pub usage: Usage,
}

impl Snapshot {
    /// When a running job must be killed; `None` when not running or without a walltime.
    pub fn deadline(&self) -> Option<DateTime<Utc>> {
        let JobState::Running { started_at } = self.state else {
            return None;
        };
        let walltime = self.request.resources.walltime;
        if walltime.is_zero() {
            return None;
        }
        // A walltime too large to add is no limit at all.
        started_at.checked_add_signed(chrono::Duration::from_std(walltime).ok()?)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct JobDir {
    path: PathBuf,
}

impl JobDir {
    pub fn new(path: PathBuf) -> JobDir {
        JobDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GPUs the job was given; none when it asked for none.
    pub fn devices(&self) -> io::Result<Vec<crate::gpu::Device>> {
        match fs::read(self.file(DEVICES)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn exists(&self) -> bool {
        self.path.is_dir()
    }

    /// Writes `name` whole or not at all.
    pub fn write_atomic(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        write_atomic(&self.path, name, bytes)
    }

    fn read_optional(&self, name: &str) -> io::Result<Option<String>> {
        match fs::read_to_string(self.file(name)) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn request(&self) -> io::Result<JobRequest> {
        let text = fs::read_to_string(self.file(REQUEST))?;
        serde_json::from_str(&text).map_err(|e| corrupt(&self.file(REQUEST), e))
    }

    pub fn launch(&self) -> io::Result<Option<Launch>> {
        self.read_optional(LAUNCH)?
            .map(|text| serde_json::from_str(&text).map_err(|e| corrupt(&self.file(LAUNCH), e)))
            .transpose()
    }

    pub fn started_at(&self) -> io::Result<Option<DateTime<Utc>>> {
        let Some(text) = self.read_optional(STARTED_AT)? else {
            return Ok(None);
        };
        DateTime::parse_from_rfc3339(text.trim())
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|e| corrupt(&self.file(STARTED_AT), e))
    }

    /// The wrapper process; `pid` is written after `pid_identity`, so `pid` present means
    /// both are.
    pub fn identity(&self) -> io::Result<Option<Identity>> {
        let Some(pid) = self.read_optional(PID)? else {
            return Ok(None);
        };
        let pid: u32 = pid
            .trim()
            .parse()
            .map_err(|e| corrupt(&self.file(PID), e))?;
        let text = fs::read_to_string(self.file(PID_IDENTITY))?;
        let identity: Identity =
            serde_json::from_str(&text).map_err(|e| corrupt(&self.file(PID_IDENTITY), e))?;
        if identity.pid != pid {
            return Err(corrupt(&self.file(PID), "pid and pid_identity disagree"));
        }
        Ok(Some(identity))
    }

    /// The command's exit status and when it was written, once the wrapper wrote it whole.
    pub fn exit(&self) -> io::Result<Option<(i32, DateTime<Utc>)>> {
        let path = self.file(EXIT_CODE);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        // Written with a trailing newline: without it the write is not finished.
        let Some(code) = text.strip_suffix('\n').and_then(|t| t.trim().parse().ok()) else {
            return Ok(None);
        };
        let written = file.metadata()?.modified()?;
        Ok(Some((code, DateTime::<Utc>::from(written))))
    }

    /// CPU seconds of the command and its waited-for children, from the wrapper's `times`.
    pub fn cpu_seconds(&self) -> Option<f64> {
        parse_times(&self.read_optional(TIMES).ok()??)
    }

    pub fn outcome(&self) -> io::Result<Option<Outcome>> {
        self.read_optional(OUTCOME)?
            .map(|text| serde_json::from_str(&text).map_err(|e| corrupt(&self.file(OUTCOME), e)))
            .transpose()
    }

    /// Publishes `outcome` unless one exists: true when this one won.
    pub fn publish_outcome(&self, outcome: &Outcome) -> io::Result<bool> {
        let tmp = self.file(&format!(".{OUTCOME}.{}.tmp", Uuid::now_v7()));
        fs::write(
            &tmp,
            serde_json::to_vec(outcome).expect("outcome serializes"),
        )?;
        let linked = fs::hard_link(&tmp, self.file(OUTCOME));
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Records when the processes of a job whose outcome we published were gone.
    pub fn set_outcome_ended(&self, ended_at: DateTime<Utc>) -> io::Result<()> {
        if let Some(mut outcome) = self.outcome()? {
            outcome.ended_at = Some(ended_at);
            self.write_atomic(OUTCOME, &serde_json::to_vec(&outcome).expect("serializes"))?;
        }
        Ok(())
    }

    /// True while a submit holds the job's lock: it has not finished starting the job.
    pub fn submit_in_progress(&self) -> io::Result<bool> {
        process::is_locked(&self.file(SUBMIT_LOCK))
    }

    /// Appends a line from Meridian (not the job) to the job's stderr.
    pub fn note_stderr(&self, line: &str) {
        let write = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.file(STDERR))
            .and_then(|mut f| writeln!(f, "meridian: {line}"));
        if let Err(e) = write {
            tracing::warn!(dir = %self.path.display(), error = %e, "cannot write to the job's stderr");
        }
    }

    /// The last `cap` bytes of `name` ("" when missing), with a note when cut.
    pub fn tail(&self, name: &str, cap: u64) -> io::Result<String> {
        let mut file = match File::open(self.file(name)) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(String::new()),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        let skipped = len.saturating_sub(cap);
        file.seek(SeekFrom::Start(skipped))?;
        let mut bytes = Vec::new();
        file.take(cap).read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes);
        Ok(if skipped > 0 {
            format!("[meridian: the first {skipped} bytes are left out]\n{text}")
        } else {
            text.into_owned()
        })
    }

    /// Cheap test for a job that has ended: no need to read anything else.
    pub fn is_finished(&self) -> bool {
        self.file(OUTCOME).exists() || matches!(self.exit(), Ok(Some(_)))
    }

    /// Derives the job's state from its files. A job whose process is gone without an exit
    /// status or an outcome is published as `Lost` here, so its end time stays fixed.
    pub fn snapshot(&self) -> io::Result<Snapshot> {
        let request = self.request()?;
        // A second pass follows a change we caused (Lost) or raced with (a late exit).
        for _ in 0..3 {
            let started_at = self.started_at()?;
            let identity = self.identity()?;
            let usage = |cpu_seconds| usage(&request, started_at.is_some(), cpu_seconds);
            if let Some(outcome) = self.outcome()? {
                let state = outcome_state(outcome, started_at);
                return Ok(Snapshot {
                    usage: usage(None),
                    request,
                    state,
                    identity,
                });
            }
            if let Some((code, written)) = self.exit()? {
                let started_at = started_at.unwrap_or(written);
                // The file's time comes from the kernel's coarse clock, which may lag the
                // clock that took started_at by a few milliseconds.
                let ended_at = written.max(started_at);
                let state = if code == 0 {
                    JobState::Succeeded {
                        started_at,
                        ended_at,
                    }
                } else {
                    JobState::Failed {
                        started_at: Some(started_at),
                        ended_at,
                        exit_code: Some(code),
                        failure: FailureReason::ExitCode { code },
                    }
                };
                let on_host = self.launch()?.is_some_and(|l| l.on_host());
                let cpu = if on_host { self.cpu_seconds() } else { None };
                return Ok(Snapshot {
                    usage: usage(cpu),
                    request,
                    state,
                    identity,
                });
            }
            if self.submit_in_progress()? {
                return Ok(Snapshot {
                    usage: usage(None),
                    request,
                    state: JobState::Pending,
                    identity,
                });
            }
            if let (Some(id), Some(started_at)) = (&identity, started_at) {
                if id.is_alive() {
                    return Ok(Snapshot {
                        usage: usage(None),
                        request,
                        state: JobState::Running { started_at },
                        identity,
                    });
                }
            }
            // Gone, or never started by a submit that died. It may have ended just now:
            // look once more before calling it lost.
            if self.exit()?.is_some() || self.file(OUTCOME).exists() {
                continue;
            }
            tracing::warn!(dir = %self.path.display(), "job process is gone without an exit status: lost");
            self.publish_outcome(&Outcome::now(
                OutcomeKind::Lost,
                Some("the job's process is gone without an exit status".into()),
            ))?;
        }
        Err(io::Error::other(format!(
            "the state of {} kept changing while read",
            self.path.display()
        )))
    }
}

fn outcome_state(outcome: Outcome, started_at: Option<DateTime<Utc>>) -> JobState {
    let mut ended_at = outcome.ended_at.unwrap_or(outcome.at);
    if let Some(started_at) = started_at {
        ended_at = ended_at.max(started_at);
    }
    let failed = |failure| JobState::Failed {
        started_at,
        ended_at,
        exit_code: None,
        failure,
    };
    match outcome.kind {
        OutcomeKind::Cancelled => JobState::Cancelled {
            started_at,
            ended_at,
        },
        OutcomeKind::Timeout => failed(FailureReason::Timeout),
        OutcomeKind::Refused => failed(FailureReason::Other {
            message: outcome.message.unwrap_or_default(),
        }),
        OutcomeKind::BootFailure => failed(FailureReason::BootFailure),
        OutcomeKind::Lost => failed(FailureReason::Lost),
    }
}

/// What a job held: its request, if it started; nothing if it never did.
fn usage(request: &JobRequest, started: bool, cpu_seconds: Option<f64>) -> Usage {
    if !started {
        return Usage::default();
    }
    Usage {
        nodes: 1,
        cpus: request.resources.cpus,
        memory_bytes: request.resources.memory_bytes,
        gpus: 0,
        cpu_seconds,
        max_rss_bytes: None,
        gpu_vendor: None,
        gpu_model: None,
        billed: None,
    }
}

pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.{}.tmp", Uuid::now_v7()));
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, dir.join(name)).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

fn corrupt(path: &Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {e}", path.display()),
    )
}

/// Sums the children's user and system time from the output of the shell's `times`
/// (second line, e.g. `0m1.250000s 0m0.030000s`; bash may use a decimal comma).
fn parse_times(text: &str) -> Option<f64> {
    let line = text.lines().nth(1)?;
    let mut total = 0.0;
    let mut fields = 0;
    for field in line.split_whitespace() {
        let (minutes, seconds) = field.strip_suffix('s')?.split_once('m')?;
        let seconds: f64 = seconds.replace(',', ".").parse().ok()?;
        total += minutes.parse::<f64>().ok()? * 60.0 + seconds;
        fields += 1;
    }
    (fields == 2).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_times_of_dash_and_bash() {
        let dash = "0m0.001000s 0m0.002000s\n1m2.500000s 0m0.250000s\n";
        assert_eq!(parse_times(dash), Some(62.75));
        let bash = "0m0,001s 0m0,002s\n0m1,500s 0m0,500s\n";
        assert_eq!(parse_times(bash), Some(2.0));
        assert_eq!(parse_times("garbage"), None);
        assert_eq!(parse_times("0m0s 0m0s\n0m1s\n"), None);
    }

    #[test]
    fn the_first_outcome_wins() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JobDir::new(tmp.path().to_path_buf());
        let cancelled = Outcome::now(OutcomeKind::Cancelled, None);
        assert!(dir.publish_outcome(&cancelled).unwrap());
        assert!(!dir
            .publish_outcome(&Outcome::now(OutcomeKind::Timeout, None))
            .unwrap());
        assert_eq!(dir.outcome().unwrap(), Some(cancelled));
        let leftovers: Vec<_> = fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary files remain");
    }

    #[test]
    fn a_half_written_exit_code_is_not_an_exit() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JobDir::new(tmp.path().to_path_buf());
        assert_eq!(dir.exit().unwrap(), None);
        fs::write(dir.file(EXIT_CODE), "").unwrap();
        assert_eq!(dir.exit().unwrap(), None);
        fs::write(dir.file(EXIT_CODE), "12").unwrap();
        assert_eq!(dir.exit().unwrap(), None);
        fs::write(dir.file(EXIT_CODE), "12\n").unwrap();
        assert_eq!(dir.exit().unwrap().map(|(code, _)| code), Some(12));
    }

    #[test]
    fn tail_caps_from_the_end() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JobDir::new(tmp.path().to_path_buf());
        assert_eq!(dir.tail(STDOUT, 4).unwrap(), "");
        fs::write(dir.file(STDOUT), "0123456789").unwrap();
        assert_eq!(
            dir.tail(STDOUT, 4).unwrap(),
            "[meridian: the first 6 bytes are left out]\n6789"
        );
        assert_eq!(dir.tail(STDOUT, 10).unwrap(), "0123456789");
    }
}
