//! The application's errors: one type for every command and query, whatever the
//! transport. Failures of the log or the database are logged here with their detail and
//! answered without it. With the `http` feature, each variant renders as its HTTP status
//! and `{"error": "<message>", ...}`.

use meridian_eventlog::aggregates::ExecuteError;
use meridian_eventlog::LogError;
use meridian_store::StoreError;

use crate::api::FieldErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The workflow document does not parse or validate; carries every problem.
    #[error("invalid workflow")]
    InvalidWorkflow(Vec<FieldErrorBody>),
    /// The catalogue document does not parse or validate; carries the problem found.
    #[error("invalid catalogue")]
    InvalidCatalog(Vec<FieldErrorBody>),
    #[error("{0}")]
    BadRequest(String),
    /// No credentials, or ones that do not hold.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is known and may not do this.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    /// The tenant's budget does not cover it; the message has the numbers.
    #[error("{0}")]
    OverBudget(String),
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

impl AppError {
    pub fn no_workflow(id: impl std::fmt::Display) -> AppError {
        AppError::NotFound(format!("no workflow {id}"))
    }

    /// A failure on our side: the detail goes to the server's log, the client gets
    /// `context` (what we were doing) and a 500.
    pub fn internal(context: &str, detail: impl std::fmt::Display) -> AppError {
        tracing::error!(error = %detail, "{context}");
        AppError::Internal(context.to_string())
    }

    /// Maps a log failure; `context` says what we were doing, for the server's log.
    pub fn from_log(context: &str, e: LogError) -> AppError {
        match e {
            LogError::Unavailable(_) => {
                tracing::warn!(error = %e, "{context}: event log unavailable");
                AppError::Unavailable("the event log is unavailable; retry later".into())
            }
            LogError::TooLarge { size, limit } => AppError::PayloadTooLarge(format!(
                "the workflow makes an event of {size} bytes; the event log takes at most {limit}"
            )),
            other => AppError::internal(context, other),
        }
    }

    pub fn from_store(context: &str, e: StoreError) -> AppError {
        match e {
            StoreError::Log(log) => AppError::from_log(context, log),
            StoreError::Database(db) => AppError::from_db(context, db),
            other => AppError::internal(context, other),
        }
    }

    /// A database that cannot be reached is worth a retry (503); any other database
    /// error is ours (500).
    pub fn from_db(context: &str, e: sqlx::Error) -> AppError {
        match e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_) => {
                tracing::warn!(error = %e, "{context}: database unavailable");
                AppError::Unavailable("the database is unavailable; retry later".into())
            }
            other => AppError::internal(context, other),
        }
    }

    /// Maps what `execute` reports apart from the aggregate's refusal, which each
    /// command interprets itself.
    pub fn from_execute<E: std::error::Error + 'static>(
        context: &str,
        e: ExecuteError<E>,
    ) -> Result<E, AppError> {
        match e {
            ExecuteError::Rejected(refusal) => Ok(refusal),
            ExecuteError::Log(log) => Err(AppError::from_log(context, log)),
            ExecuteError::Contended { .. } => Err(AppError::Unavailable(
                "the workflow is changing too fast; retry".into(),
            )),
            ExecuteError::Decode(message) => Err(AppError::internal(context, message)),
        }
    }
}

impl From<meridian_spec::SpecErrors> for AppError {
    fn from(errors: meridian_spec::SpecErrors) -> AppError {
        AppError::InvalidWorkflow(
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

#[cfg(feature = "http")]
mod http {
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::Json;

    use super::AppError;
    use crate::api::ErrorBody;

    impl AppError {
        pub fn status(&self) -> StatusCode {
            match self {
                AppError::InvalidWorkflow(_)
                | AppError::InvalidCatalog(_)
                | AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
                AppError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
                AppError::Forbidden(_) => StatusCode::FORBIDDEN,
                AppError::NotFound(_) => StatusCode::NOT_FOUND,
                AppError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
                AppError::Conflict(_) => StatusCode::CONFLICT,
                AppError::OverBudget(_) => StatusCode::PAYMENT_REQUIRED,
                AppError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                AppError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                AppError::IdempotencyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
                AppError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            }
        }
    }

    impl IntoResponse for AppError {
        fn into_response(self) -> Response {
            let status = self.status();
            let self_message = self.to_string();
            let body = match self {
                AppError::InvalidWorkflow(errors) | AppError::InvalidCatalog(errors) => ErrorBody {
                    error: self_message,
                    errors: Some(errors),
                },
                other => ErrorBody {
                    error: other.to_string(),
                    errors: None,
                },
            };
            let mut response = (status, Json(body)).into_response();
            if status == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer realm=\"meridian\""),
                );
            }
            response
        }
    }
}
