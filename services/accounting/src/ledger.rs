//! The ledger projection: billable events in, priced lines out, in the same transaction
//! as the projection's position (see `meridian_store::run`).
//!
//! What it reads:
//! - `job.finished|failed|cancelled.v1` of a run that started: compute lines;
//! - `workflow.volume_released.v1`: storage lines;
//! - `transfer.completed.v1` with an egress tariff: egress lines, tiered by the tenant's
//!   cumulative volume out of the same source in the month (`ledger_egress_volume`);
//! - `job.dispatched.v1`, `site.registered.v1`, `tenant.adjustment_*.v1`: the names,
//!   site kinds and regions, and price adjustments that lines are described and priced
//!   with.
//!
//! Lines are keyed by (event id, item) and inserted with `ON CONFLICT DO NOTHING`: a
//! redelivered event, or one applied by a second replica at the same moment, changes
//! nothing (its items depend only on the event). Egress also adds to the month's volume
//! counter, so an egress event is first claimed in `ledger_applied`: whoever claims it
//! second (or waits for the first claim's transaction) skips it, and the volume is never
//! counted twice.
//!
//! Everything a line needs besides its event (the job's name, the site's kind and
//! region, the tenant's adjustments, the month's egress volume) comes from one query.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use meridian_eventlog::Commit;
use meridian_events::vocabulary::tenant::{ChargeKind, Meter};
use meridian_events::vocabulary::transfer::TransferEvent;
use meridian_events::vocabulary::workflow::WorkflowEvent;
use meridian_events::vocabulary::Location;
use meridian_events::{
    AggregateKind, Allocation, ComputeRate, Event, JobEvent, RawEnvelope, SiteEvent, SiteKind,
    TenantEvent,
};
use meridian_ops::trace;
use meridian_store::{Projection, StoreError, Tx};
use rust_decimal::Decimal;
use sqlx::Row;
use tracing::Instrument;
use uuid::Uuid;

use crate::period::Period;
use crate::pricing::{self, AdjustmentRule, Metered, Priced};

/// The projection's name (its position is kept under it). Version 2 replaced the one
/// line per run of version 1 by one line per priced dimension and period; the new name
/// makes an old database rebuild itself from the log.
pub const NAME: &str = "ledger.v2";

/// Only `ledger_charges` has secondary indexes: on PostgreSQL `CREATE INDEX IF NOT
/// EXISTS` takes a share lock on its table even when the index exists, and a migration
/// locking two tables could deadlock with a consumer writing them in the other order
/// (replicas starting while others run). Adjustments are few per tenant: no index.
pub(crate) const SCHEMA: &[&str] = &[
    // Version 1's table and position: replaced, rebuilt under the new names.
    "DROP TABLE IF EXISTS ledger_lines",
    "DELETE FROM projection_positions WHERE name = 'ledger'",
    "CREATE TABLE IF NOT EXISTS ledger_charges (
        event_id TEXT NOT NULL,
        item TEXT NOT NULL,
        position BIGINT NOT NULL,
        tenant TEXT NOT NULL,
        workflow_id TEXT NOT NULL,
        category TEXT NOT NULL,
        meter TEXT NOT NULL,
        unit TEXT NOT NULL,
        period TEXT NOT NULL,
        charge_start TEXT NOT NULL,
        charge_end TEXT NOT NULL,
        site TEXT NOT NULL,
        site_kind TEXT,
        region TEXT,
        resource_id TEXT NOT NULL,
        resource_name TEXT NOT NULL,
        resource_type TEXT NOT NULL,
        job_id TEXT,
        job TEXT,
        array_index BIGINT,
        attempt BIGINT,
        sku TEXT NOT NULL,
        band BIGINT,
        description TEXT NOT NULL,
        quantity TEXT NOT NULL,
        list_unit_price TEXT NOT NULL,
        contracted_unit_price TEXT NOT NULL,
        list_cost TEXT NOT NULL,
        contracted_cost TEXT NOT NULL,
        currency TEXT NOT NULL,
        adjustment_id TEXT,
        price_source TEXT NOT NULL,
        price_effective_from TEXT NOT NULL,
        PRIMARY KEY (event_id, item)
    )",
    "CREATE INDEX IF NOT EXISTS ledger_charges_workflow ON ledger_charges (workflow_id)",
    "CREATE INDEX IF NOT EXISTS ledger_charges_period ON ledger_charges (period, tenant)",
    "CREATE TABLE IF NOT EXISTS ledger_applied (
        event_id TEXT PRIMARY KEY,
        position BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS ledger_jobs (
        job_id TEXT PRIMARY KEY,
        job TEXT NOT NULL,
        array_index BIGINT,
        attempt BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS ledger_sites (
        name TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        region TEXT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS ledger_adjustments (
        adjustment_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        position BIGINT NOT NULL,
        scope TEXT NOT NULL,
        terms TEXT NOT NULL,
        effective_from TEXT NOT NULL,
        effective_until TEXT
    )",
    "CREATE TABLE IF NOT EXISTS ledger_egress_volume (
        tenant TEXT NOT NULL,
        source TEXT NOT NULL,
        period TEXT NOT NULL,
        gb TEXT NOT NULL,
        PRIMARY KEY (tenant, source, period)
    )",
];

pub(crate) const TABLES: &[&str] = &[
    "ledger_charges",
    "ledger_applied",
    "ledger_jobs",
    "ledger_sites",
    "ledger_adjustments",
    "ledger_egress_volume",
];

/// The columns of `ledger_charges`, in table order.
pub(crate) const COLUMNS: [&str; 33] = [
    "event_id",
    "item",
    "position",
    "tenant",
    "workflow_id",
    "category",
    "meter",
    "unit",
    "period",
    "charge_start",
    "charge_end",
    "site",
    "site_kind",
    "region",
    "resource_id",
    "resource_name",
    "resource_type",
    "job_id",
    "job",
    "array_index",
    "attempt",
    "sku",
    "band",
    "description",
    "quantity",
    "list_unit_price",
    "contracted_unit_price",
    "list_cost",
    "contracted_cost",
    "currency",
    "adjustment_id",
    "price_source",
    "price_effective_from",
];

/// The ledger projection. Stateless: everything it needs is in its tables.
pub struct Ledger;

/// Times as the ledger stores them: RFC 3339 UTC with microseconds, so that text order
/// is time order.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Exact decimals as the ledger stores them: no trailing zeros, no exponent.
pub fn decimal(d: Decimal) -> String {
    d.normalize().to_string()
}

fn apply_error(position: u64, message: impl Into<String>) -> StoreError {
    StoreError::Apply {
        projection: NAME.into(),
        position,
        message: message.into(),
    }
}

/// The tags the ledger reads; everything else is skipped without being decoded.
const READS: [&str; 9] = [
    "job.dispatched.v1",
    "job.finished.v1",
    "job.failed.v1",
    "job.cancelled.v1",
    "site.registered.v1",
    "tenant.adjustment_granted.v1",
    "tenant.adjustment_revoked.v1",
    "workflow.volume_released.v1",
    "transfer.completed.v1",
];

#[async_trait]
impl Projection for Ledger {
    fn name(&self) -> &'static str {
        NAME
    }

    fn schema(&self) -> &'static [&'static str] {
        SCHEMA
    }

    fn tables(&self) -> &'static [&'static str] {
        TABLES
    }

    async fn apply(&self, tx: &mut Tx, commit: &Commit) -> Result<(), StoreError> {
        for raw in &commit.events {
            let tag = raw.payload.get("type").and_then(|t| t.as_str());
            if !tag.is_some_and(|t| READS.contains(&t)) {
                continue;
            }
            let event: Event = serde_json::from_value(raw.payload.clone())
                .map_err(|e| apply_error(commit.position, format!("{}: {e}", raw.event_id)))?;
            // What is charged shows in the workflow's trace, under the span that
            // recorded it (a job's end, a volume's release, a transfer).
            let span = match &event {
                Event::Job(JobEvent::Dispatched { .. }) | Event::Site(_) | Event::Tenant(_) => {
                    tracing::Span::none()
                }
                _ => {
                    let span = trace::child_of("bill", raw.traceparent.as_deref());
                    if raw.aggregate.kind == AggregateKind::Job {
                        trace::mark_job(&span, raw.aggregate.id);
                    }
                    span
                }
            };
            apply_event(tx, commit.position, raw, event)
                .instrument(span)
                .await?;
        }
        Ok(())
    }
}

async fn apply_event(
    tx: &mut Tx,
    position: u64,
    raw: &RawEnvelope,
    event: Event,
) -> Result<(), StoreError> {
    match event {
        Event::Job(JobEvent::Dispatched {
            job,
            index,
            attempt,
            ..
        }) => {
            sqlx::query(
                "INSERT INTO ledger_jobs (job_id, job, array_index, attempt) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (job_id) DO NOTHING",
            )
            .bind(raw.aggregate.id.to_string())
            .bind(job)
            .bind(index.map(i64::from))
            .bind(i64::from(attempt))
            .execute(&mut **tx)
            .await?;
        }
        Event::Job(event) => {
            if let Some(run) = Run::of(&event) {
                compute_charge(tx, position, raw, run).await?;
            }
        }
        Event::Site(SiteEvent::Registered {
            name, kind, region, ..
        }) => {
            sqlx::query(
                "INSERT INTO ledger_sites (name, kind, region) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, region = excluded.region",
            )
            .bind(name)
            .bind(kind.as_str())
            .bind(region)
            .execute(&mut **tx)
            .await?;
        }
        Event::Tenant(TenantEvent::AdjustmentGranted {
            adjustment_id,
            tenant,
            scope,
            terms,
            effective_from,
            effective_until,
            ..
        }) => {
            let json =
                |v: serde_json::Result<String>| v.map_err(|e| apply_error(position, e.to_string()));
            sqlx::query(
                "INSERT INTO ledger_adjustments
                    (adjustment_id, tenant, position, scope, terms, effective_from, effective_until)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (adjustment_id) DO NOTHING",
            )
            .bind(adjustment_id.to_string())
            .bind(tenant)
            .bind(position as i64)
            .bind(json(serde_json::to_string(&scope))?)
            .bind(json(serde_json::to_string(&terms))?)
            .bind(timestamp(effective_from))
            .bind(effective_until.map(timestamp))
            .execute(&mut **tx)
            .await?;
        }
        Event::Tenant(TenantEvent::AdjustmentRevoked {
            adjustment_id,
            effective_at,
            ..
        }) => {
            // The window only ever shrinks, so applying this twice changes nothing.
            let at = timestamp(effective_at);
            sqlx::query(
                "UPDATE ledger_adjustments SET effective_until = $1
                 WHERE adjustment_id = $2 AND (effective_until IS NULL OR effective_until > $3)",
            )
            .bind(&at)
            .bind(adjustment_id.to_string())
            .bind(&at)
            .execute(&mut **tx)
            .await?;
        }
        Event::Workflow(WorkflowEvent::VolumeReleased {
            volume,
            class,
            site,
            bytes,
            rate,
            allocated_at,
            released_at,
        }) => {
            let metered = pricing::storage(&rate, bytes, allocated_at, released_at)
                .map_err(|e| apply_error(position, e.to_string()))?;
            let ctx = context(tx, position, &raw.tenant, None, Some(&site), None).await?;
            let place = ctx.site;
            let workflow_id = raw.aggregate.id;
            let gib = Decimal::from(bytes) / Decimal::from(meridian_events::money::BYTES_PER_GIB);
            let charge = Charge {
                category: ChargeKind::Storage,
                workflow_id,
                site: site.clone(),
                site_kind: place.kind,
                region: place.region,
                resource_id: format!("{workflow_id}/{}/{volume}@{site}", class.as_str()),
                resource_name: volume.clone(),
                resource_type: match class {
                    meridian_events::vocabulary::workflow::StorageClass::Volume => "Volume",
                    meridian_events::vocabulary::workflow::StorageClass::Cache => "Cache",
                },
                job: None,
                sku: format!("storage:{}", class.as_str()),
                what: format!(
                    "{} {volume} on {site}, {} GiB held from {} to {}",
                    class.as_str(),
                    decimal(gib),
                    timestamp(allocated_at),
                    timestamp(released_at),
                ),
                price_source: rate.source.clone(),
                price_effective_from: rate.effective_from,
            };
            insert(tx, position, raw, &charge, &ctx.rules, metered).await?;
        }
        Event::Transfer(TransferEvent::Completed {
            workflow_id,
            bytes,
            from,
            to,
            started_at,
            ended_at,
            egress: Some(tariff),
            ..
        }) => {
            if !claim(tx, position, raw.event_id).await? {
                return Ok(());
            }
            let (source, site) = match &from {
                Location::Site { site } => (site.clone(), Some(site.as_str())),
                Location::Region { region } => (region.clone(), None),
            };
            let tenant = raw.tenant.clone();
            let ctx = context(tx, position, &tenant, None, site, Some(&source)).await?;
            let place = match &from {
                Location::Site { .. } => ctx.site,
                Location::Region { region } => SiteInfo {
                    kind: None,
                    region: Some(region.clone()),
                },
            };
            // The month's volume so far, per period this copy touches.
            let before: Vec<(Period, Decimal)> = crate::period::split(started_at, ended_at)
                .into_iter()
                .map(|piece| {
                    let gb = ctx
                        .volumes
                        .iter()
                        .find(|(p, _)| *p == piece.period)
                        .map_or(Decimal::ZERO, |(_, gb)| *gb);
                    (piece.period, gb)
                })
                .collect();
            let mut already = |p: Period| {
                before
                    .iter()
                    .find(|(q, _)| *q == p)
                    .map_or(Decimal::ZERO, |(_, gb)| *gb)
            };
            let metered = pricing::egress(&tariff, bytes, started_at, ended_at, &mut already)
                .map_err(|e| apply_error(position, e.to_string()))?;
            for (period, gb) in &before {
                let moved: Decimal = metered
                    .iter()
                    .filter(|m| m.piece.period == *period)
                    .map(|m| m.quantity)
                    .sum();
                if !moved.is_zero() {
                    set_egress_volume(tx, &tenant, &source, *period, *gb + moved).await?;
                }
            }
            let to_label = match &to {
                Location::Site { site } => site.clone(),
                Location::Region { region } => region.clone(),
            };
            let charge = Charge {
                category: ChargeKind::Egress,
                workflow_id,
                site: source.clone(),
                site_kind: place.kind,
                region: place.region,
                resource_id: raw.aggregate.id.to_string(),
                resource_name: format!("{source} to {to_label}"),
                resource_type: "Data Transfer",
                job: None,
                sku: "egress".into(),
                what: format!("{bytes} bytes from {source} to {to_label}"),
                price_source: tariff.source.clone(),
                price_effective_from: tariff.effective_from,
            };
            insert(tx, position, raw, &charge, &ctx.rules, metered).await?;
        }
        _ => {}
    }
    Ok(())
}

/// A run that bills: it started, and its allocation is known. Its stretch is what the
/// site bills: the run's, or the billed interval the site reported.
struct Run<'a> {
    workflow_id: Uuid,
    site: &'a str,
    rate: &'a ComputeRate,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
    allocated: &'a Allocation,
    outcome: String,
}

impl<'a> Run<'a> {
    fn of(event: &'a JobEvent) -> Option<Run<'a>> {
        let (workflow_id, site, rate, started_at, ended_at, allocated, usage, outcome) = match event
        {
            JobEvent::Finished {
                workflow_id,
                site,
                rate,
                started_at,
                ended_at,
                allocated,
                usage,
                ..
            } => (
                workflow_id,
                site,
                rate,
                Some(*started_at),
                ended_at,
                allocated,
                usage,
                "finished".to_string(),
            ),
            JobEvent::Failed {
                workflow_id,
                site,
                rate,
                started_at,
                ended_at,
                allocated: Some(allocated),
                reason,
                usage,
                ..
            } => (
                workflow_id,
                site,
                rate,
                *started_at,
                ended_at,
                allocated,
                usage,
                format!("failed: {reason}"),
            ),
            JobEvent::Cancelled {
                workflow_id,
                site,
                rate,
                started_at,
                ended_at,
                allocated: Some(allocated),
                usage,
                ..
            } => (
                workflow_id,
                site,
                rate,
                *started_at,
                ended_at,
                allocated,
                usage,
                "cancelled".to_string(),
            ),
            _ => return None,
        };
        // A run that never started is charged only for what its site bills (a cloud
        // instance's life); one its site does not bill is not charged at all.
        let (from, to) = usage.charged(started_at, *ended_at)?;
        Some(Run {
            workflow_id: *workflow_id,
            site,
            rate,
            started_at: from,
            ended_at: to,
            allocated,
            outcome,
        })
    }
}

async fn compute_charge(
    tx: &mut Tx,
    position: u64,
    raw: &RawEnvelope,
    run: Run<'_>,
) -> Result<(), StoreError> {
    let metered = pricing::compute(run.rate, run.allocated, run.started_at, run.ended_at)
        .map_err(|e| apply_error(position, e.to_string()))?;
    let job_id = raw.aggregate.id;
    let ctx = context(
        tx,
        position,
        &raw.tenant,
        Some(job_id),
        Some(run.site),
        None,
    )
    .await?;
    let (job, place) = (ctx.job, ctx.site);
    let task = match &job {
        Some(j) => match j.index {
            Some(i) => format!("{}[{i}]", j.name),
            None => j.name.clone(),
        },
        None => job_id.to_string(),
    };
    let attempt = match &job {
        Some(j) if j.attempt > 1 => format!(", attempt {}", j.attempt),
        _ => String::new(),
    };
    let charge = Charge {
        category: ChargeKind::Compute,
        workflow_id: run.workflow_id,
        site: run.site.to_string(),
        site_kind: place.kind,
        region: place.region,
        resource_id: job_id.to_string(),
        resource_name: format!("{task}{attempt}"),
        resource_type: "Job Run",
        sku: run.rate.offer.clone(),
        what: format!(
            "{task} on {} ({}{attempt}, {})",
            run.site, run.rate.offer, run.outcome
        ),
        job: Some(JobRef {
            id: job_id,
            info: job,
        }),
        price_source: run.rate.source.clone(),
        price_effective_from: run.rate.effective_from,
    };
    insert(tx, position, raw, &charge, &ctx.rules, metered).await
}

/// Marks `event_id` as billed; false when it already was (a redelivery).
async fn claim(tx: &mut Tx, position: u64, event_id: Uuid) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO ledger_applied (event_id, position) VALUES ($1, $2)
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(event_id.to_string())
    .bind(position as i64)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

struct JobInfo {
    name: String,
    index: Option<i64>,
    attempt: i64,
}

struct JobRef {
    id: Uuid,
    info: Option<JobInfo>,
}

struct SiteInfo {
    kind: Option<SiteKind>,
    region: Option<String>,
}

/// What pricing and describing a charge needs besides its event.
struct Context {
    job: Option<JobInfo>,
    site: SiteInfo,
    /// The tenant's adjustments, in grant order.
    rules: Vec<AdjustmentRule>,
    /// The tenant's egress volume out of the source, per month.
    volumes: Vec<(Period, Decimal)>,
}

/// Reads the context of a charge in one round trip: the job (when `job_id`), the site
/// (when `site`), the tenant's adjustments, and its egress volumes out of `source`.
async fn context(
    tx: &mut Tx,
    position: u64,
    tenant: &str,
    job_id: Option<Uuid>,
    site: Option<&str>,
    source: Option<&str>,
) -> Result<Context, StoreError> {
    // One shape for every row: a kind, then six texts.
    let rows = sqlx::query(
        "SELECT 'job' AS k, job AS a, CAST(array_index AS TEXT) AS b, CAST(attempt AS TEXT) AS c,
                CAST(NULL AS TEXT) AS d, CAST(NULL AS TEXT) AS e, CAST(NULL AS TEXT) AS f
           FROM ledger_jobs WHERE job_id = $1
         UNION ALL
         SELECT 'site', kind, region, NULL, NULL, NULL, NULL FROM ledger_sites WHERE name = $2
         UNION ALL
         SELECT 'adjustment', adjustment_id, CAST(position AS TEXT), scope, terms,
                effective_from, effective_until
           FROM ledger_adjustments WHERE tenant = $3
         UNION ALL
         SELECT 'volume', period, gb, NULL, NULL, NULL, NULL
           FROM ledger_egress_volume WHERE tenant = $4 AND source = $5",
    )
    .bind(job_id.map_or(String::new(), |j| j.to_string()))
    .bind(site.unwrap_or_default())
    .bind(tenant)
    .bind(tenant)
    .bind(source.unwrap_or_default())
    .fetch_all(&mut **tx)
    .await?;
    let bad = |what: &str, e: String| apply_error(position, format!("stored {what}: {e}"));
    let time = |s: String| {
        s.parse::<DateTime<Utc>>()
            .map_err(|e| bad("time", e.to_string()))
    };
    let mut ctx = Context {
        job: None,
        site: SiteInfo {
            kind: None,
            region: None,
        },
        rules: Vec::new(),
        volumes: Vec::new(),
    };
    for r in &rows {
        let text = |i: usize| r.try_get::<Option<String>, _>(i).ok().flatten();
        let int = |i: usize| -> Result<Option<i64>, StoreError> {
            text(i)
                .map(|t| t.parse::<i64>().map_err(|e| bad("number", e.to_string())))
                .transpose()
        };
        let kind: String = r.get(0);
        match kind.as_str() {
            "job" => {
                ctx.job = Some(JobInfo {
                    name: text(1).unwrap_or_default(),
                    index: int(2)?,
                    attempt: int(3)?.unwrap_or(1),
                })
            }
            "site" => {
                ctx.site = SiteInfo {
                    kind: text(1)
                        .and_then(|k| serde_json::from_value(serde_json::Value::String(k)).ok()),
                    region: text(2),
                }
            }
            "adjustment" => ctx.rules.push(AdjustmentRule {
                id: Uuid::parse_str(&text(1).unwrap_or_default())
                    .map_err(|e| bad("adjustment id", e.to_string()))?,
                order: int(2)?.unwrap_or(0) as u64,
                scope: serde_json::from_str(&text(3).unwrap_or_default())
                    .map_err(|e| bad("adjustment scope", e.to_string()))?,
                terms: serde_json::from_str(&text(4).unwrap_or_default())
                    .map_err(|e| bad("adjustment terms", e.to_string()))?,
                effective_from: time(text(5).unwrap_or_default())?,
                effective_until: text(6).map(time).transpose()?,
            }),
            "volume" => {
                let period = text(1)
                    .unwrap_or_default()
                    .parse::<Period>()
                    .map_err(|e| bad("period", e.to_string()))?;
                let gb = text(2).unwrap_or_default();
                let gb = Decimal::from_str(&gb).map_err(|e| bad("egress volume", e.to_string()))?;
                ctx.volumes.push((period, gb));
            }
            _ => {}
        }
    }
    ctx.rules.sort_by_key(|r| (r.order, r.id));
    Ok(ctx)
}

async fn set_egress_volume(
    tx: &mut Tx,
    tenant: &str,
    source: &str,
    period: Period,
    gb: Decimal,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO ledger_egress_volume (tenant, source, period, gb) VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant, source, period) DO UPDATE SET gb = excluded.gb",
    )
    .bind(tenant)
    .bind(source)
    .bind(period.to_string())
    .bind(decimal(gb))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// What every line of one billable event shares.
struct Charge {
    category: ChargeKind,
    workflow_id: Uuid,
    /// The site, or the region egress left.
    site: String,
    site_kind: Option<SiteKind>,
    region: Option<String>,
    resource_id: String,
    resource_name: String,
    resource_type: &'static str,
    job: Option<JobRef>,
    sku: String,
    /// What was charged for, for the line's description.
    what: String,
    price_source: String,
    price_effective_from: DateTime<Utc>,
}

fn meter_label(meter: Meter) -> &'static str {
    match meter {
        Meter::InstanceHours => "instances",
        Meter::CoreHours => "cores",
        Meter::MemoryGibHours => "memory",
        Meter::GpuHours => "GPUs",
        Meter::StorageGibHours => "space",
        Meter::EgressGb => "data",
    }
}

/// Prices `metered` with the tenant's adjustments and inserts the lines in one
/// statement.
async fn insert(
    tx: &mut Tx,
    position: u64,
    raw: &RawEnvelope,
    charge: &Charge,
    rules: &[AdjustmentRule],
    metered: Vec<Metered>,
) -> Result<(), StoreError> {
    if metered.is_empty() {
        return Ok(());
    }
    let priced: Vec<Priced> = metered
        .into_iter()
        .map(|m| pricing::price(m, &charge.site, charge.site_kind, rules))
        .collect::<Result<_, _>>()
        .map_err(|e| apply_error(position, e.to_string()))?;
    let mut sql = format!(
        "INSERT INTO ledger_charges ({}) VALUES ",
        COLUMNS.join(", ")
    );
    for i in 0..priced.len() {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for c in 0..COLUMNS.len() {
            if c > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&format!("${}", i * COLUMNS.len() + c + 1));
        }
        sql.push(')');
    }
    sql.push_str(" ON CONFLICT (event_id, item) DO NOTHING");
    let mut query = sqlx::query(&sql);
    let (job_id, job, index, attempt) = match &charge.job {
        Some(j) => (
            Some(j.id.to_string()),
            j.info.as_ref().map(|i| i.name.clone()),
            j.info.as_ref().and_then(|i| i.index),
            j.info.as_ref().map(|i| i.attempt),
        ),
        None => (None, None, None, None),
    };
    for p in &priced {
        let m = &p.metered;
        let description = match (charge.category, m.band) {
            (ChargeKind::Compute, _) => {
                format!("compute, {}: {}", meter_label(m.meter), charge.what)
            }
            (ChargeKind::Egress, Some(band)) if band > 0 => {
                format!("egress: {} (tier {band})", charge.what)
            }
            (category, _) => format!("{category}: {}", charge.what),
        };
        query = query
            .bind(raw.event_id.to_string())
            .bind(m.item())
            .bind(position as i64)
            .bind(raw.tenant.clone())
            .bind(charge.workflow_id.to_string())
            .bind(charge.category.as_str())
            .bind(m.meter.as_str())
            .bind(m.meter.unit())
            .bind(m.piece.period.to_string())
            .bind(timestamp(m.piece.start))
            .bind(timestamp(m.piece.end))
            .bind(charge.site.clone())
            .bind(charge.site_kind.map(|k| k.as_str()))
            .bind(charge.region.clone())
            .bind(charge.resource_id.clone())
            .bind(charge.resource_name.clone())
            .bind(charge.resource_type)
            .bind(job_id.clone())
            .bind(job.clone())
            .bind(index)
            .bind(attempt)
            .bind(charge.sku.clone())
            .bind(m.band.map(|b| b as i64))
            .bind(description)
            .bind(decimal(m.quantity))
            .bind(decimal(m.list_unit_price))
            .bind(decimal(p.contracted_unit_price))
            .bind(decimal(p.list_cost))
            .bind(decimal(p.contracted_cost))
            .bind(m.currency.to_string())
            .bind(p.adjustment.map(|a| a.to_string()))
            .bind(charge.price_source.clone())
            .bind(timestamp(charge.price_effective_from));
    }
    query.execute(&mut **tx).await?;
    Ok(())
}
