//! Slurm job states as Meridian sees them: the one place that decides what every Slurm
//! state and flag means, so the router can tell a site's failures from a job's own.
//!
//! Slurm reports a base state (`COMPLETED`, `NODE_FAIL`…) and flags (`COMPLETING`,
//! `REQUEUED`…). `squeue` and `scontrol` print a flag *instead of* the base state when one
//! is set; slurmrestd (v0.0.39+) sends both in one array; `sacct` prints the base state,
//! with detail (`CANCELLED by 0`) or a `+` in fixed-width output. [`map_state`] takes any
//! of these forms (array elements joined with commas) and the short codes (`CD`, `NF`…).

use chrono::{DateTime, Utc};
use meridian_adapter_core::{FailureReason, JobState};

/// A job's exit as Slurm prints it, `code:signal` (`ExitCode` in sacct and scontrol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExitStatus {
    pub code: i32,
    pub signal: i32,
}

impl ExitStatus {
    /// Parses `3:0`; a bare `3` is a code without a signal.
    pub fn parse(text: &str) -> Option<ExitStatus> {
        let text = text.trim();
        let (code, signal) = text.split_once(':').unwrap_or((text, "0"));
        Some(ExitStatus {
            code: code.trim().parse().ok()?,
            signal: signal.trim().parse().ok()?,
        })
    }

    /// From a raw `wait(2)` status, as slurmctld keeps it (slurmrestd v0.0.38 `exit_code`).
    pub fn from_wait_status(raw: i64) -> ExitStatus {
        let raw = raw as i32;
        if raw & 0x7f == 0 {
            ExitStatus {
                code: (raw >> 8) & 0xff,
                signal: 0,
            }
        } else {
            ExitStatus {
                code: 0,
                signal: raw & 0x7f,
            }
        }
    }

    /// The code a shell would report: the exit code, or 128 + the signal that killed it.
    pub fn shell_code(&self) -> i32 {
        if self.code != 0 {
            self.code
        } else if self.signal != 0 {
            128 + self.signal
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("unknown Slurm job state {0:?}")]
    Unknown(String),
    #[error("Slurm reports the job {state} but gives no {what}")]
    Missing { state: String, what: &'static str },
}

/// The base states (`doc/html/job_state_codes.shtml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    BootFail,
    Cancelled,
    Completed,
    Deadline,
    Failed,
    NodeFail,
    OutOfMemory,
    Pending,
    Preempted,
    Running,
    Suspended,
    Timeout,
}

/// The state flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
    Completing,
    Configuring,
    LaunchFailed,
    PowerUpNode,
    ReconfigFail,
    Requeued,
    RequeueFed,
    RequeueHold,
    Resizing,
    ResvDelHold,
    Revoked,
    Signaling,
    SpecialExit,
    StageOut,
    Stopped,
    UpdateDb,
}

enum Word {
    Base(Base),
    Flag(Flag),
}

fn word(token: &str) -> Option<Word> {
    use Base::*;
    use Flag::*;
    Some(match token {
        "BOOT_FAIL" | "BF" => Word::Base(BootFail),
        "CANCELLED" | "CA" => Word::Base(Cancelled),
        "COMPLETED" | "CD" => Word::Base(Completed),
        "DEADLINE" | "DL" => Word::Base(Deadline),
        "FAILED" | "F" => Word::Base(Failed),
        "NODE_FAIL" | "NF" => Word::Base(NodeFail),
        "OUT_OF_MEMORY" | "OOM" => Word::Base(OutOfMemory),
        "PENDING" | "PD" => Word::Base(Pending),
        "PREEMPTED" | "PR" => Word::Base(Preempted),
        "RUNNING" | "R" => Word::Base(Running),
        "SUSPENDED" | "S" => Word::Base(Suspended),
        "TIMEOUT" | "TO" => Word::Base(Timeout),
        "COMPLETING" | "CG" => Word::Flag(Completing),
        "CONFIGURING" | "CF" => Word::Flag(Configuring),
        "LAUNCH_FAILED" => Word::Flag(LaunchFailed),
        "POWER_UP_NODE" => Word::Flag(PowerUpNode),
        "RECONFIG_FAIL" => Word::Flag(ReconfigFail),
        "REQUEUED" | "RQ" => Word::Flag(Requeued),
        "REQUEUE_FED" | "RF" => Word::Flag(RequeueFed),
        "REQUEUE_HOLD" | "RH" => Word::Flag(RequeueHold),
        "RESIZING" | "RS" => Word::Flag(Resizing),
        "RESV_DEL_HOLD" | "RD" => Word::Flag(ResvDelHold),
        "REVOKED" | "RV" => Word::Flag(Revoked),
        "SIGNALING" | "SI" => Word::Flag(Signaling),
        "SPECIAL_EXIT" | "SE" => Word::Flag(SpecialExit),
        "STAGE_OUT" | "SO" => Word::Flag(StageOut),
        "STOPPED" | "ST" => Word::Flag(Stopped),
        "UPDATE_DB" => Word::Flag(UpdateDb),
        _ => return None,
    })
}

/// Maps what Slurm says of a job to its Meridian state.
///
/// - `state`: a state as squeue, scontrol, sacct or slurmrestd print it; several words
///   (slurmrestd's array) joined with commas.
/// - `exit`: its `ExitCode`.
/// - `started_at`: when it started, `None` when it never had nodes (a job cancelled while
///   pending has a start time in Slurm but no node list).
/// - `ended_at`: when it ended, for final states.
///
/// The rules: a job whose processes are still being cleaned up (`COMPLETING`, `STAGE_OUT`,
/// `SIGNALING`) is not final yet, so a final state is reported once its processes are
/// gone. A job Slurm itself will run again (`REQUEUED`, `REQUEUE_HOLD`, `LAUNCH_FAILED`,
/// and `CONFIGURING` or `POWER_UP_NODE` before its script starts) is pending: reporting it
/// failed would make Meridian place it elsewhere while Slurm reruns it. Site faults
/// (`NODE_FAIL`, `PREEMPTED`, `BOOT_FAIL`, `RECONFIG_FAIL`, `REVOKED`) map to the
/// failures the router re-places; `FAILED` carries the job's exit code (`128 + signal`
/// when a signal killed it).
pub fn map_state(
    state: &str,
    exit: ExitStatus,
    started_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
) -> Result<JobState, StateError> {
    let mut base = None;
    let mut flags = Vec::new();
    for item in state.split(',') {
        // `CANCELLED by 0` and `CANCELLED+`: only the first word names the state.
        let token = item.split_whitespace().next().unwrap_or("");
        let token = token.trim_end_matches('+').to_ascii_uppercase();
        if token.is_empty() {
            continue;
        }
        match word(&token) {
            Some(Word::Base(b)) => base = base.or(Some(b)),
            Some(Word::Flag(f)) => flags.push(f),
            None => return Err(StateError::Unknown(state.to_string())),
        }
    }
    if base.is_none() && flags.is_empty() {
        return Err(StateError::Unknown(state.to_string()));
    }
    let has = |f: Flag| flags.contains(&f);
    let running = || match started_at {
        Some(started_at) => JobState::Running { started_at },
        None => JobState::Pending,
    };
    let ended = |what_state: &str| {
        ended_at.ok_or_else(|| StateError::Missing {
            state: what_state.to_string(),
            what: "end time",
        })
    };
    let failed = |failure: FailureReason| -> Result<JobState, StateError> {
        let code = exit.shell_code();
        Ok(JobState::Failed {
            started_at,
            ended_at: ended(state)?,
            exit_code: (code != 0).then_some(code),
            failure,
        })
    };
    let exit_failure = || match exit.shell_code() {
        0 => FailureReason::Other {
            message: format!("Slurm reports the job {state} with exit code 0:0"),
        },
        code => FailureReason::ExitCode { code },
    };

    if has(Flag::ReconfigFail) {
        return failed(FailureReason::BootFailure);
    }
    if has(Flag::Revoked) {
        // A federation sibling runs it now: from this cluster it is gone.
        return failed(FailureReason::Lost);
    }
    if has(Flag::Completing) || has(Flag::StageOut) || has(Flag::Signaling) {
        return Ok(running());
    }
    let requeued = [
        Flag::Requeued,
        Flag::RequeueFed,
        Flag::RequeueHold,
        Flag::ResvDelHold,
        Flag::LaunchFailed,
        Flag::Configuring,
        Flag::PowerUpNode,
    ];
    if requeued.iter().any(|f| has(*f)) {
        return Ok(JobState::Pending);
    }
    if has(Flag::SpecialExit) {
        return failed(exit_failure());
    }
    // Left: Resizing, Stopped and UpdateDb, which change nothing about the base state.
    let Some(base) = base else {
        return Ok(running());
    };
    match base {
        Base::Pending => Ok(JobState::Pending),
        Base::Running | Base::Suspended => match started_at {
            Some(started_at) => Ok(JobState::Running { started_at }),
            None => Err(StateError::Missing {
                state: state.to_string(),
                what: "start time",
            }),
        },
        Base::Completed => {
            let ended_at = ended(state)?;
            Ok(JobState::Succeeded {
                started_at: started_at.unwrap_or(ended_at),
                ended_at,
            })
        }
        Base::Cancelled => Ok(JobState::Cancelled {
            started_at,
            ended_at: ended(state)?,
        }),
        Base::Failed => failed(exit_failure()),
        Base::Timeout | Base::Deadline => failed(FailureReason::Timeout),
        Base::OutOfMemory => failed(FailureReason::OutOfMemory),
        Base::NodeFail => failed(FailureReason::NodeFailure),
        Base::Preempted => failed(FailureReason::Preempted),
        Base::BootFail => failed(FailureReason::BootFailure),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    #[derive(Debug)]
    enum Want {
        Pending,
        Running,
        Succeeded,
        Cancelled,
        Failed(FailureReason, Option<i32>),
        Unknown,
    }

    #[test]
    fn every_state_and_flag_maps() {
        use Want::*;
        let ok = ExitStatus::default();
        let exit = |code, signal| ExitStatus { code, signal };
        let cases: Vec<(&str, ExitStatus, Want)> = vec![
            // base states
            ("PENDING", ok, Pending),
            ("RUNNING", ok, Running),
            ("SUSPENDED", ok, Running),
            ("COMPLETED", ok, Succeeded),
            ("CANCELLED", exit(0, 15), Cancelled),
            ("CANCELLED by 0", ok, Cancelled),
            ("CANCELLED+", ok, Cancelled),
            (
                "FAILED",
                exit(3, 0),
                Failed(FailureReason::ExitCode { code: 3 }, Some(3)),
            ),
            (
                "FAILED",
                exit(0, 9),
                Failed(FailureReason::ExitCode { code: 137 }, Some(137)),
            ),
            (
                "FAILED",
                ok,
                Failed(
                    FailureReason::Other {
                        message: "Slurm reports the job FAILED with exit code 0:0".into(),
                    },
                    None,
                ),
            ),
            (
                "TIMEOUT",
                exit(0, 15),
                Failed(FailureReason::Timeout, Some(143)),
            ),
            ("DEADLINE", ok, Failed(FailureReason::Timeout, None)),
            (
                "OUT_OF_MEMORY",
                exit(0, 125),
                Failed(FailureReason::OutOfMemory, Some(253)),
            ),
            ("NODE_FAIL", ok, Failed(FailureReason::NodeFailure, None)),
            ("PREEMPTED", ok, Failed(FailureReason::Preempted, None)),
            ("BOOT_FAIL", ok, Failed(FailureReason::BootFailure, None)),
            // flags, alone as squeue and scontrol print them
            ("COMPLETING", ok, Running),
            ("CONFIGURING", ok, Pending),
            ("LAUNCH_FAILED", ok, Pending),
            ("POWER_UP_NODE", ok, Pending),
            (
                "RECONFIG_FAIL",
                ok,
                Failed(FailureReason::BootFailure, None),
            ),
            ("REQUEUED", ok, Pending),
            ("REQUEUE_FED", ok, Pending),
            ("REQUEUE_HOLD", ok, Pending),
            ("RESIZING", ok, Running),
            ("RESV_DEL_HOLD", ok, Pending),
            ("REVOKED", ok, Failed(FailureReason::Lost, None)),
            ("SIGNALING", ok, Running),
            (
                "SPECIAL_EXIT",
                exit(42, 0),
                Failed(FailureReason::ExitCode { code: 42 }, Some(42)),
            ),
            ("STAGE_OUT", ok, Running),
            ("STOPPED", ok, Running),
            ("UPDATE_DB", ok, Running),
            // base and flags together, as slurmrestd v0.0.39+ sends them
            ("RUNNING,COMPLETING", ok, Running),
            ("COMPLETED,COMPLETING", ok, Running),
            ("CANCELLED,COMPLETING", ok, Running),
            ("PENDING,REQUEUED", ok, Pending),
            ("NODE_FAIL,REQUEUED", ok, Pending),
            ("PENDING,REQUEUE_HOLD", ok, Pending),
            ("RUNNING,CONFIGURING", ok, Pending),
            ("RUNNING,RESIZING", ok, Running),
            ("COMPLETED,UPDATE_DB", ok, Succeeded),
            (
                "FAILED,SPECIAL_EXIT",
                exit(5, 0),
                Failed(FailureReason::ExitCode { code: 5 }, Some(5)),
            ),
            // sacct and squeue short codes
            ("CD", ok, Succeeded),
            ("CA", ok, Cancelled),
            (
                "F",
                exit(1, 0),
                Failed(FailureReason::ExitCode { code: 1 }, Some(1)),
            ),
            ("TO", ok, Failed(FailureReason::Timeout, None)),
            ("PD", ok, Pending),
            ("R", ok, Running),
            ("NF", ok, Failed(FailureReason::NodeFailure, None)),
            ("OOM", ok, Failed(FailureReason::OutOfMemory, None)),
            ("PR", ok, Failed(FailureReason::Preempted, None)),
            ("RQ", ok, Pending),
            ("RF", ok, Pending),
            ("RH", ok, Pending),
            ("RD", ok, Pending),
            ("CF", ok, Pending),
            ("SI", ok, Running),
            (
                "SE",
                exit(2, 0),
                Failed(FailureReason::ExitCode { code: 2 }, Some(2)),
            ),
            ("SO", ok, Running),
            ("ST", ok, Running),
            ("RS", ok, Running),
            ("RV", ok, Failed(FailureReason::Lost, None)),
            ("S", ok, Running),
            ("DL", ok, Failed(FailureReason::Timeout, None)),
            ("BF", ok, Failed(FailureReason::BootFailure, None)),
            ("CG", ok, Running),
            // lower case, as some slurmrestd versions print node-ish states
            ("completed", ok, Succeeded),
            // nonsense
            ("EXPLODED", ok, Unknown),
            ("", ok, Unknown),
            ("RUNNING,EXPLODED", ok, Unknown),
        ];
        for (state, exit, want) in cases {
            let got = map_state(state, exit, Some(t(1)), Some(t(5)));
            let matches = match (&want, &got) {
                (Pending, Ok(JobState::Pending)) => true,
                (Running, Ok(JobState::Running { started_at })) => *started_at == t(1),
                (
                    Succeeded,
                    Ok(JobState::Succeeded {
                        started_at,
                        ended_at,
                    }),
                ) => (*started_at, *ended_at) == (t(1), t(5)),
                (
                    Cancelled,
                    Ok(JobState::Cancelled {
                        started_at,
                        ended_at,
                    }),
                ) => (*started_at, *ended_at) == (Some(t(1)), t(5)),
                (
                    Failed(failure, code),
                    Ok(JobState::Failed {
                        started_at,
                        ended_at,
                        exit_code,
                        failure: got,
                    }),
                ) => {
                    failure == got
                        && exit_code == code
                        && (*started_at, *ended_at) == (Some(t(1)), t(5))
                }
                (Unknown, Err(StateError::Unknown(_))) => true,
                _ => false,
            };
            assert!(matches, "{state:?} {exit:?}: want {want:?}, got {got:?}");
        }
    }

    #[test]
    fn site_faults_are_the_sites() {
        let fault = |state| match map_state(state, ExitStatus::default(), Some(t(0)), Some(t(1))) {
            Ok(JobState::Failed { failure, .. }) => failure.is_site_fault(),
            other => panic!("{state}: {other:?}"),
        };
        for state in [
            "NODE_FAIL",
            "PREEMPTED",
            "BOOT_FAIL",
            "RECONFIG_FAIL",
            "REVOKED",
        ] {
            assert!(fault(state), "{state} is the site's fault");
        }
        for state in ["FAILED", "TIMEOUT", "DEADLINE", "OUT_OF_MEMORY"] {
            assert!(!fault(state), "{state} is the job's own");
        }
    }

    #[test]
    fn times_follow_what_slurm_knows() {
        let ok = ExitStatus::default();
        // Cancelled while pending: no nodes, so no start.
        assert_eq!(
            map_state("CANCELLED by 0", ok, None, Some(t(3))),
            Ok(JobState::Cancelled {
                started_at: None,
                ended_at: t(3)
            })
        );
        // A flag on a job that never started is still pending.
        assert_eq!(
            map_state("COMPLETING", ok, None, None),
            Ok(JobState::Pending)
        );
        assert!(matches!(
            map_state("RUNNING", ok, None, None),
            Err(StateError::Missing { .. })
        ));
        assert!(matches!(
            map_state("COMPLETED", ok, Some(t(1)), None),
            Err(StateError::Missing { .. })
        ));
    }

    #[test]
    fn exit_codes_parse_in_both_forms() {
        assert_eq!(
            ExitStatus::parse("3:0"),
            Some(ExitStatus { code: 3, signal: 0 })
        );
        assert_eq!(
            ExitStatus::parse("0:15"),
            Some(ExitStatus {
                code: 0,
                signal: 15
            })
        );
        assert_eq!(ExitStatus::parse("7").map(|e| e.shell_code()), Some(7));
        assert_eq!(ExitStatus::parse("x:1"), None);
        assert_eq!(ExitStatus::from_wait_status(512).shell_code(), 2);
        assert_eq!(ExitStatus::from_wait_status(9).shell_code(), 137);
        assert_eq!(ExitStatus::from_wait_status(0).shell_code(), 0);
    }
}
