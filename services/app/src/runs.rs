//! Runs that report themselves: a cloud instance's bootstrap tells Meridian when its
//! job started, how it ended and what it printed, with a credential good for that one
//! run (`mer_run_…`, see [`crate::WorkflowCredentials::mint_run`]). The report is kept
//! in the store, where the cloud site's adapter reads it beside the provider's view.

use chrono::{SecondsFormat, Utc};
use meridian_store::run_reports;
use serde::Deserialize;
use uuid::Uuid;

use crate::{App, AppError, Credentials};

/// The most of each of stdout and stderr a report keeps: the last 1 MiB, as the sites'
/// own logs.
pub const OUTPUT_CAP_BYTES: usize = 1 << 20;

/// What a run reports. Times are the API's own, taken when the report arrives, so an
/// instance's clock does not matter.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum RunReportBody {
    /// The job's command is starting now.
    Started {},
    /// The command ended with this exit code (its output is sent before, to
    /// `PUT /v1/runs/{job}/output/{stream}`).
    Exited { exit_code: i32 },
}

pub use meridian_store::run_reports::Stream;

/// What the API answers a run's report with.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct RunReportKept {
    /// The run's job id.
    pub job: Uuid,
}

/// The last `cap` bytes of `text`, cut at a character boundary.
fn tail(text: &str, cap: usize) -> &str {
    if text.len() <= cap {
        return text;
    }
    let mut start = text.len() - cap;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

impl App {
    /// Keeps what run `job` reports of itself (`body`: a [`RunReportBody`] as JSON).
    /// Only `job`'s run credential may: any other credential (an API token, a workflow
    /// credential, another run's) is refused before the body is read.
    pub async fn report_run(
        &self,
        credentials: &Credentials,
        job: Uuid,
        body: &[u8],
    ) -> Result<(), AppError> {
        self.check_run_credential(credentials, job).await?;
        let report: RunReportBody = crate::formats::json_body(body, "run report")?;
        let store = self.store();
        let id = job.to_string();
        let now = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        match report {
            RunReportBody::Started {} => run_reports::started(store, &id, &now).await,
            RunReportBody::Exited { exit_code } => {
                run_reports::exited(store, &id, &now, i64::from(exit_code)).await
            }
        }
        .map_err(|e| AppError::from_store("keeping the run's report", e))
    }

    /// Keeps run `job`'s output on `stream` (`stdout` or `stderr`; its last
    /// [`OUTPUT_CAP_BYTES`]), replacing what it sent before; bytes that are not UTF-8
    /// are kept as U+FFFD. Only `job`'s run credential may, as for [`App::report_run`].
    pub async fn report_run_output(
        &self,
        credentials: &Credentials,
        job: Uuid,
        stream: &str,
        bytes: &[u8],
    ) -> Result<(), AppError> {
        self.check_run_credential(credentials, job).await?;
        let stream = match stream {
            "stdout" => Stream::Stdout,
            "stderr" => Stream::Stderr,
            other => {
                return Err(AppError::BadRequest(format!(
                    "stream: expected stdout or stderr; got {other:?}"
                )))
            }
        };
        let text = String::from_utf8_lossy(bytes);
        run_reports::output(
            self.store(),
            &job.to_string(),
            stream,
            tail(&text, OUTPUT_CAP_BYTES),
        )
        .await
        .map_err(|e| AppError::from_store("keeping the run's output", e))
    }

    async fn check_run_credential(
        &self,
        credentials: &Credentials,
        job: Uuid,
    ) -> Result<(), AppError> {
        let holds = match (&self.workflow_credentials, credentials.bearer.as_deref()) {
            (Some(key), Some(bearer)) => key.verify_run(bearer, job),
            _ => false,
        };
        if holds {
            return Ok(());
        }
        self.refused_unknown(
            &credentials.request,
            "a run report without that run's credential",
        )
        .await;
        Err(AppError::Unauthenticated(format!(
            "a run reports with its own run credential (mer_run_…, MERIDIAN_RUN_TOKEN on its machine); this one is not run {job}'s"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end_at_a_character_boundary() {
        assert_eq!(tail("abcdef", 3), "def");
        assert_eq!(tail("ab", 3), "ab");
        // "é" is two bytes: a cut inside it moves past it.
        assert_eq!(tail("aéb", 2), "b");
    }

    #[test]
    fn a_report_names_its_event_and_refuses_unknown_fields() {
        let exited: RunReportBody =
            serde_json::from_str(r#"{"event":"exited","exit_code":3}"#).unwrap();
        assert!(matches!(exited, RunReportBody::Exited { exit_code: 3 }));
        let unknown = serde_json::from_str::<RunReportBody>(r#"{"event":"started","code":1}"#)
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("code"), "{unknown}");
        let bad = serde_json::from_str::<RunReportBody>(r#"{"event":"finished"}"#)
            .unwrap_err()
            .to_string();
        assert!(bad.contains("finished"), "{bad}");
    }
}
