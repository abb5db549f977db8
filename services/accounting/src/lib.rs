//! Accounting: the ledger is a projection of billable events into priced lines, one
//! line per event that caused it (its event id is the line's key, so a redelivered
//! event never bills twice), and bills are sums over those lines. Amounts are exact
//! decimals kept as text; nothing is rounded here (rounding belongs to exports).
//!
//! Today it bills compute: every finished, failed or cancelled job run that started,
//! at the rate captured when it was dispatched, for the time it ran.

use std::collections::BTreeMap;
use std::str::FromStr;

use async_trait::async_trait;
use meridian_eventlog::Commit;
use meridian_events::{Event, JobEvent, RawEnvelope};
use meridian_store::{Projection, Store, StoreError, Tx};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::Row;
use uuid::Uuid;

pub struct Ledger;

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS ledger_lines (
        event_id TEXT PRIMARY KEY,
        position BIGINT NOT NULL,
        tenant TEXT NOT NULL,
        workflow_id TEXT NOT NULL,
        job_id TEXT NOT NULL,
        site TEXT NOT NULL,
        category TEXT NOT NULL,
        description TEXT NOT NULL,
        offer TEXT NOT NULL,
        quantity TEXT NOT NULL,
        unit TEXT NOT NULL,
        amount TEXT NOT NULL,
        currency TEXT NOT NULL,
        started_at TEXT NOT NULL,
        ended_at TEXT NOT NULL,
        price_source TEXT NOT NULL,
        price_effective_from TEXT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS ledger_lines_workflow ON ledger_lines (workflow_id)",
    "CREATE TABLE IF NOT EXISTS ledger_jobs (
        job_id TEXT PRIMARY KEY,
        job TEXT NOT NULL,
        array_index BIGINT,
        attempt BIGINT NOT NULL
    )",
];

fn apply_error(position: u64, message: impl Into<String>) -> StoreError {
    StoreError::Apply {
        projection: "ledger".into(),
        position,
        message: message.into(),
    }
}

#[async_trait]
impl Projection for Ledger {
    fn name(&self) -> &'static str {
        "ledger"
    }

    fn schema(&self) -> &'static [&'static str] {
        SCHEMA
    }

    fn tables(&self) -> &'static [&'static str] {
        &["ledger_lines", "ledger_jobs"]
    }

    async fn apply(&self, tx: &mut Tx, commit: &Commit) -> Result<(), StoreError> {
        for raw in &commit.events {
            if raw.aggregate.kind != meridian_events::AggregateKind::Job {
                continue;
            }
            let envelope = raw
                .clone()
                .decode::<Event>()
                .map_err(|e| apply_error(commit.position, e.to_string()))?;
            let Event::Job(event) = &envelope.payload else {
                continue;
            };
            if let JobEvent::Dispatched {
                job,
                index,
                attempt,
                ..
            } = event
            {
                // Names for descriptions; the ids stay the key.
                sqlx::query(
                    "INSERT INTO ledger_jobs (job_id, job, array_index, attempt) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (job_id) DO NOTHING",
                )
                .bind(raw.aggregate.id.to_string())
                .bind(job)
                .bind(index.map(i64::from))
                .bind(i64::from(*attempt))
                .execute(&mut **tx)
                .await?;
                continue;
            }
            if let Some(line) = line_for(raw, event)
                .transpose()
                .map_err(|e| apply_error(commit.position, e))?
            {
                insert_line(tx, commit.position, &line).await?;
            }
        }
        Ok(())
    }
}

/// One priced line, before it is stored.
struct NewLine {
    event_id: Uuid,
    tenant: String,
    workflow_id: Uuid,
    job_id: Uuid,
    site: String,
    offer: String,
    hours: Decimal,
    amount: Decimal,
    currency: String,
    started_at: String,
    ended_at: String,
    price_source: String,
    price_effective_from: String,
    outcome: &'static str,
}

fn line_for(raw: &RawEnvelope, event: &JobEvent) -> Option<Result<NewLine, String>> {
    let (workflow_id, site, rate, started_at, ended_at, outcome) = match event {
        JobEvent::Finished {
            workflow_id,
            site,
            rate,
            started_at,
            ended_at,
            ..
        } => (workflow_id, site, rate, *started_at, *ended_at, "finished"),
        JobEvent::Failed {
            workflow_id,
            site,
            rate,
            started_at: Some(started_at),
            ended_at,
            ..
        } => (workflow_id, site, rate, *started_at, *ended_at, "failed"),
        JobEvent::Cancelled {
            workflow_id,
            site,
            rate,
            started_at: Some(started_at),
            ended_at,
            ..
        } => (workflow_id, site, rate, *started_at, *ended_at, "cancelled"),
        _ => return None,
    };
    let cost = match event.compute_cost()? {
        Ok(cost) => cost,
        Err(e) => return Some(Err(e.to_string())),
    };
    let seconds = meridian_events::money::seconds_between(started_at, ended_at);
    Some(Ok(NewLine {
        event_id: raw.event_id,
        tenant: raw.tenant.clone(),
        workflow_id: *workflow_id,
        job_id: raw.aggregate.id,
        site: site.clone(),
        offer: rate.offer.clone(),
        hours: meridian_events::money::hours(seconds),
        amount: cost.amount,
        currency: cost.currency.to_string(),
        started_at: rfc3339(started_at),
        ended_at: rfc3339(ended_at),
        price_source: rate.source.clone(),
        price_effective_from: rfc3339(rate.effective_from),
        outcome,
    }))
}

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

async fn insert_line(tx: &mut Tx, position: u64, line: &NewLine) -> Result<(), StoreError> {
    let name: Option<(String, Option<i64>, i64)> =
        sqlx::query("SELECT job, array_index, attempt FROM ledger_jobs WHERE job_id = $1")
            .bind(line.job_id.to_string())
            .fetch_optional(&mut **tx)
            .await?
            .map(|r| (r.get(0), r.get(1), r.get(2)));
    let what = match &name {
        Some((job, Some(i), _)) => format!("{job}[{i}]"),
        Some((job, None, _)) => job.clone(),
        None => line.job_id.to_string(),
    };
    let attempt = match &name {
        Some((_, _, a)) if *a > 1 => format!(", attempt {a}"),
        _ => String::new(),
    };
    let description = format!(
        "compute: {what} on {} ({}{attempt}, {})",
        line.site, line.offer, line.outcome
    );
    sqlx::query(
        "INSERT INTO ledger_lines (event_id, position, tenant, workflow_id, job_id, site, category,
            description, offer, quantity, unit, amount, currency, started_at, ended_at,
            price_source, price_effective_from)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(line.event_id.to_string())
    .bind(position as i64)
    .bind(&line.tenant)
    .bind(line.workflow_id.to_string())
    .bind(line.job_id.to_string())
    .bind(&line.site)
    .bind("compute")
    .bind(description)
    .bind(&line.offer)
    .bind(line.hours.normalize().to_string())
    .bind("Hours")
    .bind(line.amount.normalize().to_string())
    .bind(&line.currency)
    .bind(&line.started_at)
    .bind(&line.ended_at)
    .bind(&line.price_source)
    .bind(&line.price_effective_from)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// One line of a bill, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BillLine {
    pub event_id: String,
    pub job_id: String,
    pub site: String,
    pub category: String,
    pub description: String,
    pub offer: String,
    /// Run time in hours, exact.
    pub quantity: String,
    pub unit: String,
    pub amount: String,
    pub currency: String,
    pub started_at: String,
    pub ended_at: String,
    pub price_source: String,
    pub price_effective_from: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Total {
    pub currency: String,
    pub amount: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Bill {
    pub workflow_id: Uuid,
    pub lines: Vec<BillLine>,
    /// One total per currency: amounts in different currencies are never summed.
    pub totals: Vec<Total>,
    /// The ledger position the bill includes.
    pub as_of_position: u64,
}

/// The bill of one workflow, as of what the ledger has applied.
pub async fn bill(store: &Store, workflow_id: Uuid) -> Result<Bill, StoreError> {
    let as_of_position = store.position("ledger").await?;
    store.migrate(SCHEMA).await?;
    let rows = sqlx::query(
        "SELECT event_id, job_id, site, category, description, offer, quantity, unit, amount,
                currency, started_at, ended_at, price_source, price_effective_from
         FROM ledger_lines WHERE workflow_id = $1 ORDER BY started_at, position, event_id",
    )
    .bind(workflow_id.to_string())
    .fetch_all(store.pool())
    .await?;
    let lines: Vec<BillLine> = rows
        .iter()
        .map(|r| BillLine {
            event_id: r.get(0),
            job_id: r.get(1),
            site: r.get(2),
            category: r.get(3),
            description: r.get(4),
            offer: r.get(5),
            quantity: r.get(6),
            unit: r.get(7),
            amount: r.get(8),
            currency: r.get(9),
            started_at: r.get(10),
            ended_at: r.get(11),
            price_source: r.get(12),
            price_effective_from: r.get(13),
        })
        .collect();
    let mut sums: BTreeMap<String, Decimal> = BTreeMap::new();
    for line in &lines {
        let amount = Decimal::from_str(&line.amount).map_err(|e| StoreError::Apply {
            projection: "ledger".into(),
            position: as_of_position,
            message: format!("stored amount {:?} is not a decimal: {e}", line.amount),
        })?;
        *sums.entry(line.currency.clone()).or_default() += amount;
    }
    Ok(Bill {
        workflow_id,
        lines,
        totals: sums
            .into_iter()
            .map(|(currency, amount)| Total {
                currency,
                amount: amount.normalize().to_string(),
            })
            .collect(),
        as_of_position,
    })
}
