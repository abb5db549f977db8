//! The FinOps FOCUS 1.2 export: one row per ledger line of a billing period, CSV or JSON.
//!
//! Rounding happens here and only here: `PricingQuantity` (= `ConsumedQuantity`) is
//! rounded to [`QUANTITY_DECIMALS`] places, half away from zero, and the costs are then
//! computed from it and the exact unit prices without further rounding, so that
//! `ListCost = ListUnitPrice × PricingQuantity` and `ContractedCost =
//! ContractedUnitPrice × PricingQuantity` hold digit for digit on every row. Unit prices
//! are written as captured in the events (they are finite decimals), and nothing else
//! depends on when the export runs: the same ledger always yields the same bytes.

use std::fmt::Write as _;

use chrono::{DateTime, DurationRound, SecondsFormat, TimeDelta, Utc};
use meridian_store::{Store, StoreError};
use rust_decimal::{Decimal, RoundingStrategy};
use serde_json::{Map, Value};

use crate::bills::{period_lines, BillLine};
use crate::ledger::NAME;
use crate::period::Period;

/// Decimal places of `PricingQuantity` and `ConsumedQuantity` in exports: 10⁻¹⁰ of a
/// core-hour is 0.36 µs, finer than the microseconds events record.
pub const QUANTITY_DECIMALS: u32 = 10;

/// Who issues the invoice: Meridian's operator, charging tenants back.
pub const INVOICE_ISSUER: &str = "Meridian";

/// The FOCUS columns, then Meridian's `x_` columns, in the order written.
pub const COLUMNS: [&str; 47] = [
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ListUnitPrice",
    "ContractedUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ServiceCategory",
    "ServiceSubcategory",
    "ServiceName",
    "ProviderName",
    "PublisherName",
    "InvoiceIssuerName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "RegionId",
    "RegionName",
    "SkuId",
    "Tags",
    "x_WorkflowId",
    "x_JobId",
    "x_JobName",
    "x_Attempt",
    "x_Site",
    "x_SiteKind",
    "x_Meter",
    "x_EgressTier",
    "x_AdjustmentId",
    "x_PriceSource",
    "x_PriceEffectiveFrom",
    "x_LedgerEventId",
    "x_LedgerItem",
];

/// Columns holding decimals: written as bare numbers in JSON.
pub const DECIMAL_COLUMNS: [&str; 8] = [
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ListUnitPrice",
    "ContractedUnitPrice",
    "PricingQuantity",
    "ConsumedQuantity",
];

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("ledger line {event_id}/{item} cannot be exported: {message}")]
    Line {
        event_id: String,
        item: String,
        message: String,
    },
}

/// One row: a value (or null) per [`COLUMNS`] entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row(pub Vec<Option<String>>);

impl Row {
    pub fn get(&self, column: &str) -> Option<&str> {
        let i = COLUMNS.iter().position(|c| *c == column)?;
        self.0[i].as_deref()
    }
}

/// An export: the rows of one period (and tenant), as of a ledger position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    pub period: Period,
    pub tenant: Option<String>,
    pub as_of_position: u64,
    pub rows: Vec<Row>,
}

/// FOCUS's date-time format: UTC, whole seconds, `Z`.
pub fn focus_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn time(text: &str) -> Result<DateTime<Utc>, String> {
    text.parse()
        .map_err(|e| format!("stored time {text:?} does not parse: {e}"))
}

fn dec(text: &str) -> Result<Decimal, String> {
    text.parse()
        .map_err(|e| format!("stored decimal {text:?} does not parse: {e}"))
}

fn product(a: Decimal, b: Decimal) -> Result<Decimal, String> {
    let p = a
        .checked_mul(b)
        .ok_or_else(|| format!("{a} × {b} overflows"))?;
    // rust_decimal keeps 28 decimal places at most: make sure nothing was cut.
    if a.scale() + b.scale() > 28 {
        return Err(format!("{a} × {b} has more than 28 decimal places"));
    }
    Ok(p)
}

fn service(line: &BillLine) -> (&'static str, &'static str, &'static str) {
    match line.category.as_str() {
        "compute" => (
            "Compute",
            match line.site_kind.as_deref() {
                Some("aws" | "gcp" | "azure" | "oci") => "Virtual Machines",
                Some("kubernetes" | "coreweave") => "Containers",
                _ => "Other (Compute)",
            },
            "Meridian Compute",
        ),
        "storage" => (
            "Storage",
            if line.resource_type == "Volume" {
                "Files"
            } else {
                "Other (Storage)"
            },
            "Meridian Storage",
        ),
        _ => ("Networking", "Data Transfer", "Meridian Data Transfer"),
    }
}

fn tags(line: &BillLine) -> String {
    let mut tags = Map::new();
    tags.insert("workflow".into(), Value::String(line.workflow_id.clone()));
    if let Some(job) = &line.job {
        let name = match line.index {
            Some(i) => format!("{job}[{i}]"),
            None => job.clone(),
        };
        tags.insert("job".into(), Value::String(name));
    } else if let Some(id) = &line.job_id {
        tags.insert("job".into(), Value::String(id.clone()));
    }
    tags.insert("tenant".into(), Value::String(line.tenant.clone()));
    tags.insert("site".into(), Value::String(line.site.clone()));
    Value::Object(tags).to_string()
}

/// The FOCUS row of one ledger line.
pub fn row(line: &BillLine) -> Result<Row, ExportError> {
    row_inner(line).map_err(|message| ExportError::Line {
        event_id: line.event_id.clone(),
        item: line.item.clone(),
        message,
    })
}

fn row_inner(line: &BillLine) -> Result<Row, String> {
    let period: Period = line.period.parse().map_err(|e| format!("{e}"))?;
    let quantity = dec(&line.quantity)?
        .round_dp_with_strategy(QUANTITY_DECIMALS, RoundingStrategy::MidpointAwayFromZero)
        .normalize();
    let list_unit = dec(&line.list_unit_price)?.normalize();
    let contracted_unit = dec(&line.contracted_unit_price)?.normalize();
    let list_cost = product(list_unit, quantity)?.normalize();
    let contracted_cost = product(contracted_unit, quantity)?.normalize();
    // Whole seconds that contain the charge, inside its billing period (whose bounds
    // are whole seconds); an instant becomes its own second.
    let start = time(&line.started_at)?
        .duration_trunc(TimeDelta::seconds(1))
        .map_err(|e| e.to_string())?;
    let end_exact = time(&line.ended_at)?;
    let mut end = end_exact
        .duration_trunc(TimeDelta::seconds(1))
        .map_err(|e| e.to_string())?;
    if end < end_exact {
        end += TimeDelta::seconds(1);
    }
    if end <= start {
        end = start + TimeDelta::seconds(1);
    }
    let (category, subcategory, service_name) = service(line);
    let job_name = line.job.as_ref().map(|j| match line.index {
        Some(i) => format!("{j}[{i}]"),
        None => j.clone(),
    });
    let s = |v: &str| Some(v.to_string());
    let values: Vec<Option<String>> = vec![
        s(&line.tenant),
        s(&line.tenant),
        s(&line.currency),
        s(&focus_time(period.start())),
        s(&focus_time(period.end())),
        s("Usage"),
        None,
        s(&line.description),
        s("Usage-Based"),
        s(&focus_time(start)),
        s(&focus_time(end)),
        s(&contracted_cost.to_string()),
        s(&contracted_cost.to_string()),
        s(&list_cost.to_string()),
        s(&contracted_cost.to_string()),
        s(&list_unit.to_string()),
        s(&contracted_unit.to_string()),
        s(&quantity.to_string()),
        s(&line.unit),
        s(&quantity.to_string()),
        s(&line.unit),
        s(category),
        s(subcategory),
        s(service_name),
        s(&line.site),
        s(&line.site),
        s(INVOICE_ISSUER),
        s(&line.resource_id),
        s(&line.resource_name),
        s(&line.resource_type),
        line.region.clone(),
        line.region.clone(),
        s(&format!("{}:{}", line.offer, line.meter)),
        Some(tags(line)),
        s(&line.workflow_id),
        line.job_id.clone(),
        job_name,
        line.attempt.map(|a| a.to_string()),
        s(&line.site),
        line.site_kind.clone(),
        s(&line.meter),
        line.band.map(|b| b.to_string()),
        line.adjustment_id.clone(),
        s(&line.price_source),
        Some(focus_time(time(&line.price_effective_from)?)),
        s(&line.event_id),
        s(&line.item),
    ];
    debug_assert_eq!(values.len(), COLUMNS.len());
    // FOCUS: a null is a null, never an empty string.
    Ok(Row(values
        .into_iter()
        .map(|v| v.filter(|s| !s.is_empty()))
        .collect()))
}

/// The export of `period` (one tenant's, or everyone's), as of what the ledger holds.
pub async fn export(
    store: &Store,
    period: Period,
    tenant: Option<&str>,
) -> Result<Export, ExportError> {
    let as_of_position = store.position(NAME).await?;
    let lines = period_lines(store, period, tenant).await?;
    let rows = lines.iter().map(row).collect::<Result<Vec<_>, _>>()?;
    Ok(Export {
        period,
        tenant: tenant.map(str::to_string),
        as_of_position,
        rows,
    })
}

fn csv_field(out: &mut String, value: &str) {
    if value.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(value);
    }
}

/// RFC 4180 CSV with a header line; lines end with `\n`; a null is an empty field.
pub fn to_csv(rows: &[Row]) -> String {
    let mut out = COLUMNS.join(",");
    out.push('\n');
    for row in rows {
        for (i, v) in row.0.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if let Some(v) = v {
                csv_field(&mut out, v);
            }
        }
        out.push('\n');
    }
    out
}

/// A JSON array of objects, keys in column order, one object per line. Decimals are
/// bare JSON numbers written digit for digit (never through a float), `Tags` an object,
/// nulls `null`.
pub fn to_json(rows: &[Row]) -> String {
    let mut out = String::from("[");
    for (n, row) in rows.iter().enumerate() {
        out.push_str(if n == 0 { "\n{" } else { ",\n{" });
        for (i, (column, v)) in COLUMNS.iter().zip(&row.0).enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{}:", Value::String(column.to_string()));
            match v {
                None => out.push_str("null"),
                Some(v) if DECIMAL_COLUMNS.contains(column) => out.push_str(v),
                Some(v) if *column == "Tags" => out.push_str(v),
                Some(v) => out.push_str(&Value::String(v.clone()).to_string()),
            }
        }
        out.push('}');
    }
    out.push_str(if rows.is_empty() { "]\n" } else { "\n]\n" });
    out
}
