//! Accounting: the ledger is a projection of billable events into priced lines, and
//! bills and FinOps FOCUS exports are read from it.
//!
//! - [`Ledger`] (in [`ledger`]) is the projection. Each line is keyed by the event that
//!   caused it and the priced dimension and period within it, and is written in the same
//!   transaction as the projection's position, so a redelivered event never bills twice
//!   and a rebuild ([`rebuild`]) is a replay from position 0.
//! - [`pricing`] (in `meridian-domain`, shared with placement) turns an event into lines, purely: compute per instance-hour (clouds)
//!   or per core-hour, GiB-hour and GPU-hour (HPC), storage per GiB-hour, egress per GB
//!   tiered by the tenant's monthly volume at the source; every charge split at month
//!   boundaries; tenant adjustments (discounts, committed rates) set a contracted price
//!   next to the list price.
//! - [`bills`] sums lines per workflow and per tenant and month: one total per currency,
//!   never a sum across currencies.
//! - [`focus`] writes FOCUS 1.2 rows, the one place where anything is rounded.
//!
//! Money is `rust_decimal::Decimal`, stored as text; times are UTC.

pub mod bills;
pub mod focus;
pub mod ledger;
pub mod synthetic;

use meridian_eventlog::EventLog;
use meridian_store::{Store, StoreError};

pub use bills::{
    bill, snapshot, tenant_bill, Bill, BillLine, CategoryTotal, SiteTotal, Snapshot, TenantBill,
    Total, WorkflowTotal,
};
pub use ledger::{Ledger, Replay, NAME};
pub use meridian_domain::period::{self, InvalidPeriod, Period};
pub use meridian_domain::pricing;

/// What a rebuild did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rebuilt {
    /// The log position the new ledger has applied.
    pub position: u64,
    /// Lines in the new ledger.
    pub lines: u64,
}

/// Drops the ledger's tables and position and replays the whole log into them, each
/// page of the log priced while the page before it is written.
pub async fn rebuild(store: &Store, log: &dyn EventLog) -> Result<Rebuilt, StoreError> {
    rebuild_with(store, log, Replay::default()).await
}

/// [`rebuild`], replaying the log as `how` says.
pub async fn rebuild_with(
    store: &Store,
    log: &dyn EventLog,
    how: Replay,
) -> Result<Rebuilt, StoreError> {
    store.reset(&Ledger).await?;
    let position = ledger::replay(store, log, how).await?;
    let lines: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger_charges")
        .fetch_one(store.pool())
        .await?;
    Ok(Rebuilt {
        position,
        lines: lines as u64,
    })
}
