//! The API's errors: one type, each variant with its HTTP status, every one rendered as
//! `{"error": "<message>", ...}`. Failures of the log or the database are logged here
//! with their detail and answered without it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use meridian_eventlog::aggregates::ExecuteError;
use meridian_eventlog::LogError;
use meridian_store::StoreError;

use crate::api::{ErrorBody, FieldErrorBody};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The workflow document does not parse or validate; carries every problem.
    #[error("invalid workflow")]
    InvalidWorkflow(Vec<FieldErrorBody>),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("idempotency key reused with a different body")]
    IdempotencyMismatch,
    /// The log or the database cannot be reached now; the client may retry.
    #[error("{0}")]
    Unavailable(String),
    /// Something on our side broke; the detail goes to the log, not the client.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidWorkflow(_) | ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::IdempotencyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub(crate) fn no_workflow(id: impl std::fmt::Display) -> ApiError {
        ApiError::NotFound(format!("no workflow {id}"))
    }

    /// A failure on our side: the detail goes to the server's log, the client gets
    /// `context` (what we were doing) and a 500.
    pub(crate) fn internal(context: &str, detail: impl std::fmt::Display) -> ApiError {
        tracing::error!(error = %detail, "{context}");
        ApiError::Internal(context.to_string())
    }

    /// Maps a log failure; `context` says what we were doing, for the server's log.
    pub(crate) fn from_log(context: &str, e: LogError) -> ApiError {
        match e {
            LogError::Unavailable(_) => {
                tracing::warn!(error = %e, "{context}: event log unavailable");
                ApiError::Unavailable("the event log is unavailable; retry later".into())
            }
            LogError::TooLarge { size, limit } => ApiError::PayloadTooLarge(format!(
                "the workflow makes an event of {size} bytes; the event log takes at most {limit}"
            )),
            other => ApiError::internal(context, other),
        }
    }

    pub(crate) fn from_store(context: &str, e: StoreError) -> ApiError {
        match e {
            StoreError::Log(log) => ApiError::from_log(context, log),
            StoreError::Database(db) => ApiError::from_db(context, db),
            other => ApiError::internal(context, other),
        }
    }

    /// A database that cannot be reached is worth a retry (503); any other database
    /// error is ours (500).
    pub(crate) fn from_db(context: &str, e: sqlx::Error) -> ApiError {
        match e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_) => {
                tracing::warn!(error = %e, "{context}: database unavailable");
                ApiError::Unavailable("the database is unavailable; retry later".into())
            }
            other => ApiError::internal(context, other),
        }
    }

    /// Maps what `execute` reports apart from the aggregate's refusal, which each
    /// command interprets itself.
    pub(crate) fn from_execute<E: std::error::Error + 'static>(
        context: &str,
        e: ExecuteError<E>,
    ) -> Result<E, ApiError> {
        match e {
            ExecuteError::Rejected(refusal) => Ok(refusal),
            ExecuteError::Log(log) => Err(ApiError::from_log(context, log)),
            ExecuteError::Contended { .. } => Err(ApiError::Unavailable(
                "the workflow is changing too fast; retry".into(),
            )),
            ExecuteError::Decode(message) => Err(ApiError::internal(context, message)),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = match self {
            ApiError::InvalidWorkflow(errors) => ErrorBody {
                error: "invalid workflow".into(),
                errors: Some(errors),
            },
            other => ErrorBody {
                error: other.to_string(),
                errors: None,
            },
        };
        (status, Json(body)).into_response()
    }
}

impl From<meridian_spec::SpecErrors> for ApiError {
    fn from(errors: meridian_spec::SpecErrors) -> ApiError {
        ApiError::InvalidWorkflow(
            errors
                .errors
                .into_iter()
                .map(|e| FieldErrorBody {
                    path: e.path,
                    message: e.message,
                })
                .collect(),
        )
    }
}
