//! Bills read from the ledger: one workflow's lines and totals, and one tenant's month.
//! Amounts are exact sums of exact lines; one total per currency, never a sum across
//! currencies.

use std::collections::BTreeMap;
use std::str::FromStr;

use meridian_store::{Store, StoreError};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::Row;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::ledger::{decimal, COLUMNS, NAME, SCHEMA};
use crate::period::Period;

/// One line of the ledger: one priced dimension (cores, memory, GPUs, instances, GiB of
/// storage, GB of egress, one egress tier) of one charge within one billing period.
/// `list_cost = list_unit_price × quantity` and `contracted_cost =
/// contracted_unit_price × quantity`, exactly; `amount` is what is billed, the
/// contracted cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BillLine {
    /// The event that caused the line; with `item`, the line's key.
    pub event_id: String,
    /// The dimension, period and tier within the event, e.g. `gpu_hours/2026-11`.
    pub item: String,
    /// The log position of the commit that held the event.
    pub position: i64,
    pub tenant: String,
    pub workflow_id: String,
    /// `compute`, `storage` or `egress`.
    pub category: String,
    /// `instance_hours`, `core_hours`, `memory_gib_hours`, `gpu_hours`,
    /// `storage_gib_hours` or `egress_gb`.
    pub meter: String,
    /// The unit of `quantity` and of the unit prices, as FOCUS writes it (`Core-Hours`).
    pub unit: String,
    /// The billing period, `YYYY-MM`.
    pub period: String,
    /// Start of the charged stretch (inclusive): a run's start, or a month's start when
    /// the run began in an earlier month.
    #[schema(format = DateTime)]
    pub started_at: String,
    /// End of the charged stretch (exclusive).
    #[schema(format = DateTime)]
    pub ended_at: String,
    /// The site; for egress, the site or region the data left.
    pub site: String,
    pub site_kind: Option<String>,
    pub region: Option<String>,
    /// A run's Job id, a volume's `workflow/class/name@site`, a transfer's id.
    pub resource_id: String,
    pub resource_name: String,
    pub resource_type: String,
    pub job_id: Option<String>,
    /// The job's name in the spec, for compute lines.
    pub job: Option<String>,
    pub index: Option<i64>,
    /// Which run of the task this was (re-runs after a site's fault count up).
    pub attempt: Option<i64>,
    /// What was priced: the compute offer, `storage:volume`, `egress`.
    pub offer: String,
    /// The egress tier (0: the tariff's base price).
    pub band: Option<i64>,
    pub description: String,
    pub quantity: String,
    pub list_unit_price: String,
    pub contracted_unit_price: String,
    pub list_cost: String,
    pub contracted_cost: String,
    /// What is billed: the contracted cost.
    pub amount: String,
    pub currency: String,
    /// The tenant adjustment that set the contracted price, if any.
    pub adjustment_id: Option<String>,
    pub price_source: String,
    #[schema(format = DateTime)]
    pub price_effective_from: String,
}

fn line(r: &AnyRow) -> BillLine {
    let text = |c: &str| r.get::<String, _>(c);
    let opt = |c: &str| r.try_get::<Option<String>, _>(c).ok().flatten();
    let int = |c: &str| r.try_get::<Option<i64>, _>(c).ok().flatten();
    BillLine {
        event_id: text("event_id"),
        item: text("item"),
        position: r.get("position"),
        tenant: text("tenant"),
        workflow_id: text("workflow_id"),
        category: text("category"),
        meter: text("meter"),
        unit: text("unit"),
        period: text("period"),
        started_at: text("charge_start"),
        ended_at: text("charge_end"),
        site: text("site"),
        site_kind: opt("site_kind"),
        region: opt("region"),
        resource_id: text("resource_id"),
        resource_name: text("resource_name"),
        resource_type: text("resource_type"),
        job_id: opt("job_id"),
        job: opt("job"),
        index: int("array_index"),
        attempt: int("attempt"),
        offer: text("sku"),
        band: int("band"),
        description: text("description"),
        quantity: text("quantity"),
        list_unit_price: text("list_unit_price"),
        contracted_unit_price: text("contracted_unit_price"),
        list_cost: text("list_cost"),
        amount: text("contracted_cost"),
        contracted_cost: text("contracted_cost"),
        currency: text("currency"),
        adjustment_id: opt("adjustment_id"),
        price_source: text("price_source"),
        price_effective_from: text("price_effective_from"),
    }
}

/// Lines matching `filter` (SQL after WHERE, with `$1`, `$2` bound to `args`), in a
/// database-independent order: by charge start, then event and item, byte for byte.
async fn lines_where(
    store: &Store,
    filter: &str,
    args: &[&str],
) -> Result<Vec<BillLine>, StoreError> {
    store.migrate(SCHEMA).await?;
    let sql = format!(
        "SELECT {} FROM ledger_charges WHERE {filter}",
        COLUMNS.join(", ")
    );
    let mut query = sqlx::query(&sql);
    for a in args {
        query = query.bind(*a);
    }
    let rows = query.fetch_all(store.pool()).await?;
    let mut lines: Vec<BillLine> = rows.iter().map(line).collect();
    // Sorted here, not by SQL: PostgreSQL's collation and SQLite's differ.
    lines.sort_by(|a, b| {
        (&a.tenant, &a.started_at, &a.event_id, &a.item).cmp(&(
            &b.tenant,
            &b.started_at,
            &b.event_id,
            &b.item,
        ))
    });
    Ok(lines)
}

/// Every line of a workflow, every attempt and site included.
pub async fn workflow_lines(store: &Store, workflow_id: Uuid) -> Result<Vec<BillLine>, StoreError> {
    lines_where(store, "workflow_id = $1", &[&workflow_id.to_string()]).await
}

/// Every line of a billing period, of one tenant or of all.
pub async fn period_lines(
    store: &Store,
    period: Period,
    tenant: Option<&str>,
) -> Result<Vec<BillLine>, StoreError> {
    let period = period.to_string();
    match tenant {
        Some(t) => lines_where(store, "period = $1 AND tenant = $2", &[&period, t]).await,
        None => lines_where(store, "period = $1", &[&period]).await,
    }
}

/// An exact sum in one currency: what is billed (`amount`, contracted) and what it
/// lists at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Total {
    pub currency: String,
    pub amount: String,
    pub list_amount: String,
}

/// A total of one charge category in one currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CategoryTotal {
    pub category: String,
    pub currency: String,
    pub amount: String,
    pub list_amount: String,
}

/// A total at one site (for egress, the site or region the data left), in one currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SiteTotal {
    pub site: String,
    pub currency: String,
    pub amount: String,
    pub list_amount: String,
}

/// A workflow's bill: every line (every run, attempt and site), and totals per
/// currency, per category and per site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Bill {
    pub workflow_id: Uuid,
    pub lines: Vec<BillLine>,
    /// One total per currency: amounts in different currencies are never summed.
    pub totals: Vec<Total>,
    pub by_category: Vec<CategoryTotal>,
    pub by_site: Vec<SiteTotal>,
    /// The ledger position the bill includes.
    pub as_of_position: u64,
}

/// One workflow's share of a tenant's month.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkflowTotal {
    pub workflow_id: String,
    pub currency: String,
    pub amount: String,
    pub list_amount: String,
    pub lines: u64,
}

/// A tenant's bill for one month: totals, and each workflow's share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantBill {
    pub tenant: String,
    /// `YYYY-MM`.
    pub period: String,
    #[schema(format = DateTime)]
    pub billing_period_start: String,
    /// Exclusive.
    #[schema(format = DateTime)]
    pub billing_period_end: String,
    pub lines: u64,
    pub totals: Vec<Total>,
    pub by_category: Vec<CategoryTotal>,
    pub by_site: Vec<SiteTotal>,
    pub workflows: Vec<WorkflowTotal>,
    pub as_of_position: u64,
}

#[derive(Default)]
struct Sums<K: Ord> {
    map: BTreeMap<(K, String), (Decimal, Decimal, u64)>,
}

impl<K: Ord> Sums<K> {
    fn add(&mut self, key: K, currency: &str, list: Decimal, amount: Decimal) {
        let e = self.map.entry((key, currency.to_string())).or_insert((
            Decimal::ZERO,
            Decimal::ZERO,
            0,
        ));
        e.0 += list;
        e.1 += amount;
        e.2 += 1;
    }
}

fn parse(text: &str, position: u64) -> Result<Decimal, StoreError> {
    Decimal::from_str(text).map_err(|e| StoreError::Apply {
        projection: NAME.into(),
        position,
        message: format!("stored amount {text:?} is not a decimal: {e}"),
    })
}

struct Summary {
    totals: Vec<Total>,
    by_category: Vec<CategoryTotal>,
    by_site: Vec<SiteTotal>,
    workflows: Vec<WorkflowTotal>,
}

fn summarize(lines: &[BillLine], position: u64) -> Result<Summary, StoreError> {
    let mut totals: Sums<()> = Sums::default();
    let mut categories: Sums<String> = Sums::default();
    let mut sites: Sums<String> = Sums::default();
    let mut workflows: Sums<String> = Sums::default();
    for l in lines {
        let (list, amount) = (parse(&l.list_cost, position)?, parse(&l.amount, position)?);
        totals.add((), &l.currency, list, amount);
        categories.add(l.category.clone(), &l.currency, list, amount);
        sites.add(l.site.clone(), &l.currency, list, amount);
        workflows.add(l.workflow_id.clone(), &l.currency, list, amount);
    }
    Ok(Summary {
        totals: totals
            .map
            .into_iter()
            .map(|((_, currency), (list, amount, _))| Total {
                currency,
                amount: decimal(amount),
                list_amount: decimal(list),
            })
            .collect(),
        by_category: categories
            .map
            .into_iter()
            .map(|((category, currency), (list, amount, _))| CategoryTotal {
                category,
                currency,
                amount: decimal(amount),
                list_amount: decimal(list),
            })
            .collect(),
        by_site: sites
            .map
            .into_iter()
            .map(|((site, currency), (list, amount, _))| SiteTotal {
                site,
                currency,
                amount: decimal(amount),
                list_amount: decimal(list),
            })
            .collect(),
        workflows: workflows
            .map
            .into_iter()
            .map(
                |((workflow_id, currency), (list, amount, n))| WorkflowTotal {
                    workflow_id,
                    currency,
                    amount: decimal(amount),
                    list_amount: decimal(list),
                    lines: n,
                },
            )
            .collect(),
    })
}

/// The bill of one workflow, as of what the ledger has applied.
pub async fn bill(store: &Store, workflow_id: Uuid) -> Result<Bill, StoreError> {
    let as_of_position = store.position(NAME).await?;
    let lines = workflow_lines(store, workflow_id).await?;
    let summary = summarize(&lines, as_of_position)?;
    Ok(Bill {
        workflow_id,
        lines,
        totals: summary.totals,
        by_category: summary.by_category,
        by_site: summary.by_site,
        as_of_position,
    })
}

/// A tenant's bill for `period`, as of what the ledger has applied. A tenant with no
/// charges has an empty bill, not an error.
pub async fn tenant_bill(
    store: &Store,
    tenant: &str,
    period: Period,
) -> Result<TenantBill, StoreError> {
    let as_of_position = store.position(NAME).await?;
    let lines = period_lines(store, period, Some(tenant)).await?;
    let summary = summarize(&lines, as_of_position)?;
    Ok(TenantBill {
        tenant: tenant.to_string(),
        period: period.to_string(),
        billing_period_start: crate::ledger::timestamp(period.start()),
        billing_period_end: crate::ledger::timestamp(period.end()),
        lines: lines.len() as u64,
        totals: summary.totals,
        by_category: summary.by_category,
        by_site: summary.by_site,
        workflows: summary.workflows,
        as_of_position,
    })
}

/// Everything the ledger holds, in key order, for comparing two ledgers line for line
/// (a live one against a rebuild).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub position: u64,
    /// Every column of every line, by (event id, item).
    pub lines: Vec<Vec<Option<String>>>,
    /// (tenant, source, period, GB) of the egress volume counters.
    pub egress_volume: Vec<(String, String, String, String)>,
    /// Billed event ids.
    pub applied: Vec<String>,
    /// (id, effective_from, effective_until) of the adjustments.
    pub adjustments: Vec<(String, String, Option<String>)>,
}

pub async fn snapshot(store: &Store) -> Result<Snapshot, StoreError> {
    store.migrate(SCHEMA).await?;
    let position = store.position(NAME).await?;
    let cols: Vec<String> = COLUMNS
        .iter()
        .map(|c| match *c {
            "position" | "array_index" | "attempt" | "band" => {
                format!("CAST({c} AS TEXT) AS {c}")
            }
            other => other.to_string(),
        })
        .collect();
    let rows = sqlx::query(&format!("SELECT {} FROM ledger_charges", cols.join(", ")))
        .fetch_all(store.pool())
        .await?;
    let mut lines: Vec<Vec<Option<String>>> = rows
        .iter()
        .map(|r| {
            (0..COLUMNS.len())
                .map(|i| r.try_get::<Option<String>, _>(i).ok().flatten())
                .collect()
        })
        .collect();
    lines.sort();
    let mut egress_volume: Vec<(String, String, String, String)> =
        sqlx::query("SELECT tenant, source, period, gb FROM ledger_egress_volume")
            .fetch_all(store.pool())
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect();
    egress_volume.sort();
    let mut applied: Vec<String> = sqlx::query("SELECT event_id FROM ledger_applied")
        .fetch_all(store.pool())
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    applied.sort();
    let mut adjustments: Vec<(String, String, Option<String>)> = sqlx::query(
        "SELECT adjustment_id, effective_from, effective_until FROM ledger_adjustments",
    )
    .fetch_all(store.pool())
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect();
    adjustments.sort();
    Ok(Snapshot {
        position,
        lines,
        egress_volume,
        applied,
        adjustments,
    })
}
