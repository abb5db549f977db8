//! PBS job states and exit statuses as Meridian sees them: the one place that decides
//! what every `job_state` letter and every `Exit_status` means.
//!
//! PBS has no "cancelled" state: a deleted job finishes (`F`) like any other, usually
//! with `Exit_status` 271 (256 + SIGTERM) when it was running. The adapter therefore
//! records its own `qdel` (a marker file, which survives restarts) and passes it in as
//! [`Observed::cancel_requested`]. Older servers report a walltime kill as 271 too, so a
//! signal exit on a job that used its whole walltime is a timeout
//! ([`Observed::walltime_exceeded`]); newer ones say `-29` (`JOB_EXEC_KILL_WALLTIME`).

use chrono::{DateTime, Utc};
use meridian_adapter_core::{FailureReason, JobState};

/// What the adapter observed of one job.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observed {
    /// The `job_state` letter.
    pub state: String,
    /// `Exit_status`, once the job ended.
    pub exit_status: Option<i64>,
    /// `stime`.
    pub started_at: Option<DateTime<Utc>>,
    /// `obittime` (or `mtime` on servers without it).
    pub ended_at: Option<DateTime<Utc>>,
    /// `resources_used.walltime` reached `Resource_List.walltime`.
    pub walltime_exceeded: bool,
    /// This site's adapter deleted the job (`qdel`).
    pub cancel_requested: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("unknown PBS job state {0:?}")]
    Unknown(String),
    #[error("PBS reports the job in state {state} but gives no {what}")]
    Missing { state: String, what: &'static str },
}

/// What a finished job's `Exit_status` means (`src/include/job.h`, `JOB_EXEC_*`).
pub fn exit_failure(
    exit_status: i64,
    walltime_exceeded: bool,
) -> Option<(FailureReason, Option<i32>)> {
    let no_code = |f: FailureReason| Some((f, None));
    let refused = |what: &str| {
        Some((
            FailureReason::Other {
                message: format!("PBS: {what} (Exit_status {exit_status})"),
            },
            None,
        ))
    };
    match exit_status {
        0 => None,
        // The script's own exit code (128 + N when its shell saw signal N).
        1..=255 => {
            if walltime_exceeded && exit_status >= 128 {
                no_code(FailureReason::Timeout)
            } else {
                let code = exit_status as i32;
                Some((FailureReason::ExitCode { code }, Some(code)))
            }
        }
        // 256 + N: PBS killed the job's top process with signal N.
        256.. => {
            if walltime_exceeded {
                no_code(FailureReason::Timeout)
            } else {
                let code = 128 + (exit_status - 256) as i32;
                Some((FailureReason::ExitCode { code }, Some(code)))
            }
        }
        -29 | -28 => no_code(FailureReason::Timeout), // KILL_WALLTIME, KILL_CPUT
        -27 | -26 => no_code(FailureReason::OutOfMemory), // KILL_MEM, KILL_VMEM
        -25 | -24 => refused("killed for using more CPUs than it requested"), // KILL_NCPUS_*
        -12 => no_code(FailureReason::Preempted),     // CHKP: checkpointed and killed
        // FAILHOOK_DELETE, HOOK_DELETE: the site's policy would not run it; another may.
        -17 | -19 => no_code(FailureReason::SiteRefused {
            message: format!("PBS: a site hook deleted the job (Exit_status {exit_status})"),
        }),
        // FAIL1, FAIL2, RETRY, INITABT, INITRST, INITRMG, BADRESRT, FAILUID, RERUN,
        // FAIL_PASSWORD, RERUN_SIS_FAIL, QUERST, FAILHOOK_RERUN, HOOK_RERUN,
        // RERUN_MS_FAIL, FAIL_SECURITY, HOOKERROR, FAIL_KRB5, JOINJOB: the site could not
        // start or keep the job going.
        _ => no_code(FailureReason::BootFailure),
    }
}

/// Maps what PBS says of a job to its Meridian state.
///
/// | letter | PBS meaning | Meridian |
/// | --- | --- | --- |
/// | Q, H, W, T | queued, held, waiting, transiting | pending |
/// | R, S, U, E, B | running, suspended, user-suspended, exiting, array begun | running (pending if it never started) |
/// | F, X | finished, finished subjob | by `Exit_status` ([`exit_failure`]); cancelled when deleted by us or before it ran |
/// | M | moved to another server | failed, lost (a site fault) |
pub fn map_state(o: &Observed) -> Result<JobState, StateError> {
    let letter = o.state.trim();
    let missing = |what| StateError::Missing {
        state: letter.to_string(),
        what,
    };
    let running = || match o.started_at {
        Some(started_at) => JobState::Running { started_at },
        None => JobState::Pending,
    };
    match letter {
        "Q" | "H" | "W" | "T" => Ok(JobState::Pending),
        "R" | "S" | "U" => o
            .started_at
            .map(|started_at| JobState::Running { started_at })
            .ok_or_else(|| missing("start time (stime)")),
        // Exiting: its processes are being cleaned up and its files staged out; final
        // only once that is done, so output is in place when Meridian sees the end.
        "E" | "B" => Ok(running()),
        "M" => Ok(JobState::Failed {
            started_at: o.started_at,
            ended_at: o.ended_at.ok_or_else(|| missing("end time"))?,
            exit_code: None,
            failure: FailureReason::Lost,
        }),
        "F" | "X" => {
            let ended_at = o.ended_at.ok_or_else(|| missing("end time (obittime)"))?;
            if o.cancel_requested {
                return Ok(JobState::Cancelled {
                    started_at: o.started_at,
                    ended_at,
                });
            }
            let Some(exit_status) = o.exit_status else {
                // Deleted before it ever ran (by someone else): it never had an exit.
                return Ok(match o.started_at {
                    None => JobState::Cancelled {
                        started_at: None,
                        ended_at,
                    },
                    Some(_) => JobState::Failed {
                        started_at: o.started_at,
                        ended_at,
                        exit_code: None,
                        failure: FailureReason::Lost,
                    },
                });
            };
            Ok(match exit_failure(exit_status, o.walltime_exceeded) {
                None => JobState::Succeeded {
                    started_at: o.started_at.unwrap_or(ended_at),
                    ended_at,
                },
                Some((failure, exit_code)) => JobState::Failed {
                    started_at: o.started_at,
                    ended_at,
                    exit_code,
                    failure,
                },
            })
        }
        _ => Err(StateError::Unknown(o.state.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    fn observed(state: &str, exit_status: Option<i64>) -> Observed {
        Observed {
            state: state.into(),
            exit_status,
            started_at: Some(t(1)),
            ended_at: Some(t(9)),
            walltime_exceeded: false,
            cancel_requested: false,
        }
    }

    #[test]
    fn every_letter_maps() {
        let running = JobState::Running { started_at: t(1) };
        let cases: Vec<(&str, Option<i64>, Result<JobState, ()>)> = vec![
            ("Q", None, Ok(JobState::Pending)),
            ("H", None, Ok(JobState::Pending)),
            ("W", None, Ok(JobState::Pending)),
            ("T", None, Ok(JobState::Pending)),
            ("R", None, Ok(running.clone())),
            ("S", None, Ok(running.clone())),
            ("U", None, Ok(running.clone())),
            ("E", Some(0), Ok(running.clone())),
            ("B", None, Ok(running.clone())),
            (
                "F",
                Some(0),
                Ok(JobState::Succeeded {
                    started_at: t(1),
                    ended_at: t(9),
                }),
            ),
            (
                "X",
                Some(0),
                Ok(JobState::Succeeded {
                    started_at: t(1),
                    ended_at: t(9),
                }),
            ),
            (
                "F",
                Some(3),
                Ok(JobState::Failed {
                    started_at: Some(t(1)),
                    ended_at: t(9),
                    exit_code: Some(3),
                    failure: FailureReason::ExitCode { code: 3 },
                }),
            ),
            (
                "M",
                None,
                Ok(JobState::Failed {
                    started_at: Some(t(1)),
                    ended_at: t(9),
                    exit_code: None,
                    failure: FailureReason::Lost,
                }),
            ),
            ("Z", None, Err(())),
            ("", None, Err(())),
        ];
        for (letter, exit, want) in cases {
            let got = map_state(&observed(letter, exit)).map_err(|_| ());
            assert_eq!(got, want, "{letter} {exit:?}");
        }
    }

    #[test]
    fn exit_statuses_map() {
        let f = |exit, walltime| exit_failure(exit, walltime).map(|(f, _)| f);
        assert_eq!(f(0, false), None);
        assert_eq!(f(1, false), Some(FailureReason::ExitCode { code: 1 }));
        assert_eq!(f(137, false), Some(FailureReason::ExitCode { code: 137 }));
        assert_eq!(f(143, true), Some(FailureReason::Timeout));
        assert_eq!(f(265, false), Some(FailureReason::ExitCode { code: 137 }));
        assert_eq!(f(271, false), Some(FailureReason::ExitCode { code: 143 }));
        assert_eq!(f(271, true), Some(FailureReason::Timeout));
        assert_eq!(f(-29, false), Some(FailureReason::Timeout));
        assert_eq!(f(-28, false), Some(FailureReason::Timeout));
        assert_eq!(f(-27, false), Some(FailureReason::OutOfMemory));
        assert_eq!(f(-26, false), Some(FailureReason::OutOfMemory));
        assert_eq!(f(-12, false), Some(FailureReason::Preempted));
        assert!(matches!(f(-25, false), Some(FailureReason::Other { .. })));
        assert!(matches!(
            f(-17, false),
            Some(FailureReason::SiteRefused { .. })
        ));
        for site in [
            -1, -2, -3, -4, -5, -6, -7, -10, -11, -13, -14, -15, -16, -18, -20, -21, -22, -23, -30,
        ] {
            assert_eq!(f(site, false), Some(FailureReason::BootFailure), "{site}");
            assert!(FailureReason::BootFailure.is_site_fault());
        }
        assert_eq!(exit_failure(265, false).unwrap().1, Some(137));
        assert_eq!(exit_failure(-29, false).unwrap().1, None);
    }

    #[test]
    fn deleted_jobs_are_cancelled() {
        let mut o = observed("F", Some(271));
        o.cancel_requested = true;
        assert_eq!(
            map_state(&o),
            Ok(JobState::Cancelled {
                started_at: Some(t(1)),
                ended_at: t(9)
            })
        );
        // Deleted while queued, by anyone: no start, no exit.
        let mut o = observed("F", None);
        o.started_at = None;
        assert_eq!(
            map_state(&o),
            Ok(JobState::Cancelled {
                started_at: None,
                ended_at: t(9)
            })
        );
    }

    #[test]
    fn what_is_missing_is_an_error_not_a_guess() {
        let mut o = observed("R", None);
        o.started_at = None;
        assert!(matches!(map_state(&o), Err(StateError::Missing { .. })));
        let mut o = observed("F", Some(0));
        o.ended_at = None;
        assert!(matches!(map_state(&o), Err(StateError::Missing { .. })));
        // Exiting or array-begun without a start yet: still pending.
        let mut o = observed("B", None);
        o.started_at = None;
        assert_eq!(map_state(&o), Ok(JobState::Pending));
    }
}
