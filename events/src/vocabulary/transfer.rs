//! Events of the Transfer aggregate: one copy of data for a workflow.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Endpoint, Location};
use crate::money::{Destination, EgressTariff, Money, MoneyError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum TransferEvent {
    #[serde(rename = "transfer.requested.v1")]
    Requested {
        workflow_id: Uuid,
        source: Endpoint,
        destination: Endpoint,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes_expected: Option<u64>,
    },

    /// How far a copy under way has got: sent at a modest rate (seconds apart) while
    /// bytes move, for `meridian status` and `--wait`; nothing is billed from it.
    #[serde(rename = "transfer.progressed.v1")]
    Progressed {
        workflow_id: Uuid,
        bytes_done: u64,
        /// The bytes expected, when the source said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes_total: Option<u64>,
    },

    /// The bytes arrived. The data-locality map reads this as "`digest` is now at `to`";
    /// accounting bills `bytes` at `egress` when it crossed a billable boundary.
    #[serde(rename = "transfer.completed.v1")]
    Completed {
        workflow_id: Uuid,
        bytes: u64,
        /// `"<algorithm>:<hex>"`, e.g. `"sha256:9f86d0…"`.
        digest: String,
        from: Location,
        to: Location,
        started_at: DateTime<Utc>,
        ended_at: DateTime<Utc>,
        /// The source's tariff in force; absent when the copy crossed no billable boundary.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        egress: Option<EgressTariff>,
        /// The site already held these bytes (its cache): they were copied there, not
        /// fetched from the source again.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cached: bool,
        /// The boundary the bytes crossed, as egress prices class it (`same_region`,
        /// `other_region`, `internet`); absent for a copy within a site.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        class: Option<Destination>,
    },

    #[serde(rename = "transfer.failed.v1")]
    Failed {
        workflow_id: Uuid,
        reason: String,
        failed_at: DateTime<Utc>,
    },
}

impl TransferEvent {
    /// The versioned tag this event serializes with.
    pub fn kind(&self) -> &'static str {
        match self {
            TransferEvent::Requested { .. } => "transfer.requested.v1",
            TransferEvent::Progressed { .. } => "transfer.progressed.v1",
            TransferEvent::Completed { .. } => "transfer.completed.v1",
            TransferEvent::Failed { .. } => "transfer.failed.v1",
        }
    }

    /// The egress this event bills; `None` when it bills nothing.
    pub fn egress_cost(&self) -> Option<Result<Money, MoneyError>> {
        match self {
            TransferEvent::Completed {
                bytes,
                egress: Some(tariff),
                ..
            } => Some(tariff.cost(*bytes)),
            _ => None,
        }
    }
}
