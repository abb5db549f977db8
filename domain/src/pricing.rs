//! Pure pricing: from what a billable event says to metered quantities, and from a
//! metered quantity and the tenant's adjustments to a priced line. No I/O, no clock:
//! the same inputs give the same lines forever.
//!
//! Every charge is cut at month boundaries first ([`crate::period::split`]), then into
//! one quantity per priced dimension (a meter): a run on an HPC site gives core-hours,
//! GiB-hours of memory and GPU-hours; a cloud run gives instance-hours. Quantities are
//! exact decimals; the only inexact step is one division by 3600 (and by 2^30 for GiB),
//! at 28 significant digits. Costs are `unit price × quantity`, nothing is rounded.

use chrono::{DateTime, Utc};
use meridian_events::money::{
    gib_hours, seconds_between, BYTES_PER_GB, BYTES_PER_GIB, SECONDS_PER_HOUR,
};
use meridian_events::vocabulary::tenant::{AdjustmentScope, AdjustmentTerms, Meter};
use meridian_events::{Allocation, ComputePricing, ComputeRate, Currency, EgressTariff, SiteKind};
use meridian_events::{MoneyError, StorageRate};
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::period::{share_by_time, split, Period, Piece};

/// One dimension of one charge within one billing period, at list price.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metered {
    pub meter: Meter,
    pub piece: Piece,
    pub quantity: Decimal,
    pub list_unit_price: Decimal,
    pub currency: Currency,
    /// The price band of a tiered egress charge (0: the tariff's base price).
    pub band: Option<usize>,
}

impl Metered {
    /// The line's key within its event: meter, period and band, e.g.
    /// `gpu_hours/2026-11` or `egress_gb/2026-11/band1`.
    pub fn item(&self) -> String {
        match self.band {
            Some(b) => format!("{}/{}/band{b}", self.meter, self.piece.period),
            None => format!("{}/{}", self.meter, self.piece.period),
        }
    }
}

fn mul(a: Decimal, b: impl Into<Decimal>) -> Result<Decimal, MoneyError> {
    a.checked_mul(b.into()).ok_or(MoneyError::Overflow)
}

fn div(a: Decimal, b: impl Into<Decimal>) -> Result<Decimal, MoneyError> {
    a.checked_div(b.into()).ok_or(MoneyError::Overflow)
}

/// `count × seconds / per`: a count held for a time, in units of `per` seconds·count.
fn held(count: impl Into<Decimal>, seconds: Decimal, per: u64) -> Result<Decimal, MoneyError> {
    div(mul(count.into(), seconds)?, per)
}

/// The compute a run used: `allocated` from `started_at` to `ended_at`, at `rate`.
///
/// A run too short for the clock (started and ended at one instant) still gets its
/// lines, at zero: the bill shows every run. A dimension it was not given (no GPUs)
/// gets none.
pub fn compute(
    rate: &ComputeRate,
    allocated: &Allocation,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
) -> Result<Vec<Metered>, MoneyError> {
    let dimensions: Vec<(Meter, u64, u64, Decimal)> = match &rate.pricing {
        ComputePricing::Instance { per_instance_hour } => vec![(
            Meter::InstanceHours,
            allocated.nodes.into(),
            SECONDS_PER_HOUR,
            *per_instance_hour,
        )],
        ComputePricing::Resource {
            per_core_hour,
            per_gib_memory_hour,
            per_gpu_hour,
        } => vec![
            (
                Meter::CoreHours,
                allocated.cpus.into(),
                SECONDS_PER_HOUR,
                *per_core_hour,
            ),
            (
                Meter::MemoryGibHours,
                allocated.memory_bytes,
                BYTES_PER_GIB * SECONDS_PER_HOUR,
                *per_gib_memory_hour,
            ),
            (
                Meter::GpuHours,
                allocated.gpus.as_ref().map_or(0, |g| g.count).into(),
                SECONDS_PER_HOUR,
                *per_gpu_hour,
            ),
        ],
    };
    let mut out = Vec::new();
    for piece in split(started_at, ended_at) {
        let seconds = seconds_between(piece.start, piece.end);
        for (meter, count, per, price) in &dimensions {
            if *count > 0 {
                out.push(Metered {
                    meter: *meter,
                    piece,
                    quantity: held(*count, seconds, *per)?,
                    list_unit_price: *price,
                    currency: rate.currency,
                    band: None,
                });
            }
        }
    }
    Ok(out)
}

/// Storage held: `bytes` from `allocated_at` to `released_at`, at `rate`, in GiB-hours
/// (a zero-length hold is one line at zero, like a zero-length run).
pub fn storage(
    rate: &StorageRate,
    bytes: u64,
    allocated_at: DateTime<Utc>,
    released_at: DateTime<Utc>,
) -> Result<Vec<Metered>, MoneyError> {
    let mut out = Vec::new();
    if bytes == 0 {
        return Ok(out);
    }
    for piece in split(allocated_at, released_at) {
        let seconds = seconds_between(piece.start, piece.end);
        out.push(Metered {
            meter: Meter::StorageGibHours,
            piece,
            quantity: gib_hours(bytes, seconds)?,
            list_unit_price: rate.per_gib_hour,
            currency: rate.currency,
            band: None,
        });
    }
    Ok(out)
}

/// Egress: `bytes` moved from `started_at` to `ended_at` at `tariff`. A copy that spans
/// a month's end is shared between the months in proportion to the time in each (the
/// last month takes the remainder, so the parts add up to the bytes exactly). Within a
/// month, each part is cut into the tariff's bands given the volume that already left
/// the same source that month, which `already` answers (the caller adds this copy's
/// volume afterwards; the parts of one copy all fall in different months).
pub fn egress(
    tariff: &EgressTariff,
    bytes: u64,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
    already: &mut dyn FnMut(Period) -> Decimal,
) -> Result<Vec<Metered>, MoneyError> {
    let total_gb = div(Decimal::from(bytes), BYTES_PER_GB)?;
    let mut out = Vec::new();
    for (piece, gb) in share_by_time(started_at, ended_at, total_gb)? {
        if gb.is_zero() {
            continue;
        }
        let before = already(piece.period);
        for band in tariff.bands(before, gb)? {
            out.push(Metered {
                meter: Meter::EgressGb,
                piece,
                quantity: band.gb,
                list_unit_price: band.per_gb,
                currency: tariff.currency,
                band: Some(band.band),
            });
        }
    }
    Ok(out)
}

/// An adjustment as the ledger keeps it: its terms, window and grant order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdjustmentRule {
    pub id: Uuid,
    pub scope: AdjustmentScope,
    pub terms: AdjustmentTerms,
    pub effective_from: DateTime<Utc>,
    pub effective_until: Option<DateTime<Utc>>,
    /// Later grants win ties: the log position of the grant.
    pub order: u64,
}

impl AdjustmentRule {
    fn in_force_at(&self, at: DateTime<Utc>) -> bool {
        self.effective_from <= at && self.effective_until.is_none_or(|u| at < u)
    }
}

/// A metered quantity with its contracted price and both costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Priced {
    pub metered: Metered,
    pub contracted_unit_price: Decimal,
    pub list_cost: Decimal,
    pub contracted_cost: Decimal,
    /// The adjustment that set the contracted price; `None`: contracted is list.
    pub adjustment: Option<Uuid>,
}

/// The adjustment that prices `line`, charged at `site` (of `site_kind` when known):
/// among those in force when the line's period starts and covering it, the most
/// specific scope wins; at equal scope a committed rate (for the line's meter and in
/// its currency) beats a percentage; then the later grant wins.
pub fn applicable<'a>(
    line: &Metered,
    site: &str,
    site_kind: Option<SiteKind>,
    rules: &'a [AdjustmentRule],
) -> Option<&'a AdjustmentRule> {
    rules
        .iter()
        .filter(|r| r.in_force_at(line.piece.start))
        .filter(|r| r.scope.covers(site, site_kind, line.meter.charge()))
        .filter(|r| match &r.terms {
            AdjustmentTerms::PercentDiscount { .. } => true,
            AdjustmentTerms::CommittedRate {
                meter, currency, ..
            } => *meter == line.meter && *currency == line.currency,
        })
        .max_by_key(|r| {
            let committed = matches!(r.terms, AdjustmentTerms::CommittedRate { .. });
            (r.scope.specificity(), committed, r.order)
        })
}

/// Prices `line` for a tenant with `rules`.
pub fn price(
    line: Metered,
    site: &str,
    site_kind: Option<SiteKind>,
    rules: &[AdjustmentRule],
) -> Result<Priced, MoneyError> {
    let rule = applicable(&line, site, site_kind, rules);
    let contracted_unit_price = match rule.map(|r| &r.terms) {
        None => line.list_unit_price,
        Some(AdjustmentTerms::PercentDiscount { percent }) => div(
            mul(line.list_unit_price, Decimal::ONE_HUNDRED - *percent)?,
            100u64,
        )?,
        Some(AdjustmentTerms::CommittedRate { unit_price, .. }) => *unit_price,
    };
    Ok(Priced {
        list_cost: mul(line.list_unit_price, line.quantity)?,
        contracted_cost: mul(contracted_unit_price, line.quantity)?,
        contracted_unit_price,
        adjustment: rule.map(|r| r.id),
        metered: line,
    })
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use meridian_events::vocabulary::tenant::ChargeKind;
    use meridian_events::vocabulary::{AcceleratorVendor, AllocatedGpus};

    use super::*;

    fn d(s: &str) -> Decimal {
        Decimal::from_str(s).unwrap()
    }

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn rate(pricing: ComputePricing) -> ComputeRate {
        ComputeRate {
            offer: "o".into(),
            pricing,
            currency: Currency::USD,
            effective_from: t("2026-01-01T00:00:00Z"),
            source: "s".into(),
        }
    }

    #[test]
    fn an_hpc_run_is_three_lines_a_cloud_run_one() {
        let hpc = rate(ComputePricing::Resource {
            per_core_hour: d("0.05"),
            per_gib_memory_hour: d("0.01"),
            per_gpu_hour: d("2.00"),
        });
        let alloc = Allocation {
            nodes: 2,
            cpus: 8,
            memory_bytes: 32 << 30,
            gpus: Some(AllocatedGpus {
                count: 2,
                vendor: AcceleratorVendor::Amd,
                model: None,
            }),
        };
        let lines = compute(
            &hpc,
            &alloc,
            t("2026-11-02T09:00:00Z"),
            t("2026-11-02T10:30:00Z"),
        )
        .unwrap();
        let q: Vec<_> = lines.iter().map(|l| (l.meter, l.quantity)).collect();
        assert_eq!(
            q,
            vec![
                (Meter::CoreHours, d("12")),
                (Meter::MemoryGibHours, d("48")),
                (Meter::GpuHours, d("3")),
            ]
        );
        let cloud = rate(ComputePricing::Instance {
            per_instance_hour: d("98.32"),
        });
        let lines = compute(
            &cloud,
            &alloc,
            t("2026-11-02T09:00:00Z"),
            t("2026-11-02T10:30:00Z"),
        )
        .unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].meter, Meter::InstanceHours);
        assert_eq!(lines[0].quantity, d("3"));
    }

    #[test]
    fn the_most_specific_adjustment_wins() {
        let line = Metered {
            meter: Meter::GpuHours,
            piece: split(t("2026-11-02T09:00:00Z"), t("2026-11-02T10:00:00Z"))[0],
            quantity: d("2"),
            list_unit_price: d("2.50"),
            currency: Currency::USD,
            band: None,
        };
        let rule = |n: u64, scope: AdjustmentScope, terms: AdjustmentTerms| AdjustmentRule {
            id: Uuid::from_u128(n as u128),
            scope,
            terms,
            effective_from: t("2026-11-01T00:00:00Z"),
            effective_until: None,
            order: n,
        };
        let pct = |p: &str| AdjustmentTerms::PercentDiscount { percent: d(p) };
        let everything = rule(1, AdjustmentScope::default(), pct("10"));
        let slurm = rule(
            2,
            AdjustmentScope {
                site_kind: Some(SiteKind::Slurm),
                ..AdjustmentScope::default()
            },
            pct("20"),
        );
        let committed_eur = rule(
            3,
            AdjustmentScope::default(),
            AdjustmentTerms::CommittedRate {
                meter: Meter::GpuHours,
                unit_price: d("1"),
                currency: Currency::EUR,
            },
        );
        let committed_all = rule(
            4,
            AdjustmentScope {
                charge: Some(ChargeKind::Compute),
                ..AdjustmentScope::default()
            },
            AdjustmentTerms::CommittedRate {
                meter: Meter::GpuHours,
                unit_price: d("1.80"),
                currency: Currency::USD,
            },
        );
        let rules = vec![
            everything.clone(),
            slurm.clone(),
            committed_eur,
            committed_all.clone(),
        ];
        // At a Slurm site the kind-wide 20 % beats the tenant-wide committed rate.
        let p = price(line.clone(), "hpc", Some(SiteKind::Slurm), &rules).unwrap();
        assert_eq!(p.adjustment, Some(slurm.id));
        assert_eq!(p.contracted_unit_price, d("2.00"));
        assert_eq!(p.contracted_cost, d("4.00"));
        assert_eq!(p.list_cost, d("5.00"));
        // Elsewhere the compute-scoped committed rate beats the unscoped discount; the
        // EUR one never applies to a USD line.
        let p = price(line.clone(), "aws", Some(SiteKind::Aws), &rules).unwrap();
        assert_eq!(p.adjustment, Some(committed_all.id));
        assert_eq!(p.contracted_unit_price, d("1.80"));
        // Nothing in force before November.
        let mut early = line.clone();
        early.piece = split(t("2026-10-30T09:00:00Z"), t("2026-10-30T10:00:00Z"))[0];
        let p = price(early, "aws", None, &rules).unwrap();
        assert_eq!(p.adjustment, None);
        assert_eq!(p.contracted_unit_price, d("2.50"));
        // A 100 % discount makes it free, and says so.
        let free = vec![rule(9, AdjustmentScope::default(), pct("100"))];
        let p = price(line, "aws", None, &free).unwrap();
        assert_eq!(p.contracted_cost, Decimal::ZERO);
        assert_eq!(p.list_cost, d("5.00"));
    }
}
