//! Idempotency keys for submissions, kept in the store for good.
//!
//! JetStream forgets message ids after its duplicate window, and a client may retry a
//! submission much later (a laptop waking up). So the key is reserved in
//! `intake_idempotency` *before* the workflow is appended: a second request with the
//! same tenant and key finds the reservation and answers with that workflow — or, if
//! the first request died between the reservation and the append, appends it then,
//! under the id that was reserved. The table is not a projection: it is not rebuilt
//! from the log and `Store::reset` leaves it alone.

use chrono::Utc;
use meridian_store::Store;
use sqlx::Row;
use uuid::Uuid;

use crate::projection::timestamp;

pub(crate) const SCHEMA: &[&str] = &["CREATE TABLE IF NOT EXISTS intake_idempotency (
        tenant TEXT NOT NULL,
        key TEXT NOT NULL,
        workflow_id TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (tenant, key)
    )"];

/// What reserving a key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reservation {
    /// The key is new and now reserved for this workflow id.
    Reserved,
    /// The key was reserved before, for this workflow and body digest.
    Existing {
        workflow_id: Uuid,
        body_sha256: String,
    },
}

/// Reserves `key` for `workflow_id`, unless it already is reserved.
pub(crate) async fn reserve(
    store: &Store,
    tenant: &str,
    key: &str,
    workflow_id: Uuid,
    body_sha256: &str,
) -> Result<Reservation, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO intake_idempotency (tenant, key, workflow_id, body_sha256, created_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (tenant, key) DO NOTHING",
    )
    .bind(tenant)
    .bind(key)
    .bind(workflow_id.to_string())
    .bind(body_sha256)
    .bind(timestamp(Utc::now()))
    .execute(store.writer())
    .await?
    .rows_affected();
    if inserted == 1 {
        return Ok(Reservation::Reserved);
    }
    let row = sqlx::query(
        "SELECT workflow_id, body_sha256 FROM intake_idempotency WHERE tenant = $1 AND key = $2",
    )
    .bind(tenant)
    .bind(key)
    .fetch_one(store.pool())
    .await?;
    let id: String = row.try_get("workflow_id")?;
    Ok(Reservation::Existing {
        workflow_id: Uuid::parse_str(&id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        body_sha256: row.try_get("body_sha256")?,
    })
}

/// Releases a reservation whose workflow the aggregate refused, so the key does not
/// stay bound to a workflow that will never exist.
pub(crate) async fn release(
    store: &Store,
    tenant: &str,
    key: &str,
    workflow_id: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "DELETE FROM intake_idempotency WHERE tenant = $1 AND key = $2 AND workflow_id = $3",
    )
    .bind(tenant)
    .bind(key)
    .bind(workflow_id.to_string())
    .execute(store.writer())
    .await?;
    Ok(())
}
