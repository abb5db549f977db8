//! The Transfer aggregate: one copy of data, requested, then completed or failed.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Aggregate;
use crate::envelope::AggregateKind;
use crate::money::{Destination, EgressTariff};
use crate::vocabulary::{Endpoint, Location, TransferEvent};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferState {
    Requested,
    Completed,
    Failed,
}

impl fmt::Display for TransferState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransferState::Requested => "requested",
            TransferState::Completed => "completed",
            TransferState::Failed => "failed",
        })
    }
}

#[derive(Debug, Clone)]
pub enum TransferCommand {
    Request {
        workflow_id: Uuid,
        source: Endpoint,
        destination: Endpoint,
        bytes_expected: Option<u64>,
    },
    /// How far the copy has got.
    Progress {
        bytes_done: u64,
        bytes_total: Option<u64>,
    },
    Complete {
        bytes: u64,
        digest: String,
        from: Location,
        to: Location,
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
        egress: Option<EgressTariff>,
        /// Copied from the site's own cache rather than fetched.
        cached: bool,
        /// The boundary the bytes crossed; `None` within a site.
        class: Option<Destination>,
    },
    /// Stamped with `now`.
    Fail { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("the transfer was already requested")]
    AlreadyRequested,
    #[error("the transfer was never requested")]
    NotRequested,
    #[error("the transfer is already {state}")]
    AlreadyTerminal { state: TransferState },
    #[error("digest {digest:?} is not of the form <algorithm>:<hex>")]
    InvalidDigest { digest: String },
    #[error("the copy ends at {ended_at}, before it started at {started_at}")]
    EndsBeforeStart {
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
    },
    #[error("the egress tariff is invalid: {reason}")]
    InvalidTariff { reason: String },
}

#[derive(Debug, Clone, Default)]
pub struct Transfer {
    state: Option<TransferState>,
    workflow_id: Option<Uuid>,
    source: Option<Endpoint>,
    destination: Option<Endpoint>,
    bytes: Option<u64>,
    digest: Option<String>,
}

impl Transfer {
    pub fn state(&self) -> Option<TransferState> {
        self.state
    }

    pub fn workflow_id(&self) -> Option<Uuid> {
        self.workflow_id
    }

    pub fn source(&self) -> Option<&Endpoint> {
        self.source.as_ref()
    }

    pub fn destination(&self) -> Option<&Endpoint> {
        self.destination.as_ref()
    }

    /// Bytes moved, once completed.
    pub fn bytes(&self) -> Option<u64> {
        self.bytes
    }

    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    fn open(&self) -> Result<Uuid, TransferError> {
        match (self.state, self.workflow_id) {
            (Some(TransferState::Requested), Some(id)) => Ok(id),
            (Some(state), _) => Err(TransferError::AlreadyTerminal { state }),
            (None, _) => Err(TransferError::NotRequested),
        }
    }
}

/// `<algorithm>:<hex>`, with a lowercase alphanumeric algorithm name.
fn valid_digest(digest: &str) -> bool {
    match digest.split_once(':') {
        Some((algo, hex)) => {
            !algo.is_empty()
                && algo
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && !hex.is_empty()
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        }
        None => false,
    }
}

impl Aggregate for Transfer {
    const KIND: AggregateKind = AggregateKind::Transfer;
    type Command = TransferCommand;
    type Event = TransferEvent;
    type Error = TransferError;

    fn handle(
        &self,
        cmd: TransferCommand,
        now: DateTime<Utc>,
    ) -> Result<Vec<TransferEvent>, TransferError> {
        match cmd {
            TransferCommand::Request {
                workflow_id,
                source,
                destination,
                bytes_expected,
            } => {
                if self.state.is_some() {
                    return Err(TransferError::AlreadyRequested);
                }
                Ok(vec![TransferEvent::Requested {
                    workflow_id,
                    source,
                    destination,
                    bytes_expected,
                }])
            }
            TransferCommand::Progress {
                bytes_done,
                bytes_total,
            } => {
                let workflow_id = self.open()?;
                Ok(vec![TransferEvent::Progressed {
                    workflow_id,
                    bytes_done,
                    bytes_total,
                }])
            }
            TransferCommand::Complete {
                bytes,
                digest,
                from,
                to,
                started_at,
                ended_at,
                egress,
                cached,
                class,
            } => {
                let workflow_id = self.open()?;
                if !valid_digest(&digest) {
                    return Err(TransferError::InvalidDigest { digest });
                }
                if ended_at < started_at {
                    return Err(TransferError::EndsBeforeStart {
                        started_at,
                        ended_at,
                    });
                }
                if let Some(tariff) = &egress {
                    tariff
                        .validate()
                        .map_err(|e| TransferError::InvalidTariff { reason: e.0 })?;
                }
                Ok(vec![TransferEvent::Completed {
                    workflow_id,
                    bytes,
                    digest,
                    from,
                    to,
                    started_at,
                    ended_at,
                    egress,
                    cached,
                    class,
                }])
            }
            TransferCommand::Fail { reason } => {
                let workflow_id = self.open()?;
                Ok(vec![TransferEvent::Failed {
                    workflow_id,
                    reason,
                    failed_at: now,
                }])
            }
        }
    }

    fn apply(&mut self, event: &TransferEvent) {
        match event {
            TransferEvent::Requested {
                workflow_id,
                source,
                destination,
                ..
            } => {
                self.state = Some(TransferState::Requested);
                self.workflow_id = Some(*workflow_id);
                self.source = Some(source.clone());
                self.destination = Some(destination.clone());
            }
            TransferEvent::Completed { bytes, digest, .. } => {
                self.state = Some(TransferState::Completed);
                self.bytes = Some(*bytes);
                self.digest = Some(digest.clone());
            }
            TransferEvent::Failed { .. } => self.state = Some(TransferState::Failed),
            TransferEvent::Progressed { .. } => {}
        }
    }
}
