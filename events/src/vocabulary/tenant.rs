//! Events of the Tenant aggregate: the terms a tenant is billed on beyond the sites' list
//! prices. An adjustment is a fact with an effective window; the ledger prices every
//! charge that starts inside the window at the contracted price it sets, and keeps the
//! list price next to it.

use std::fmt;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::SiteKind;
use crate::money::{Currency, Money};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum TenantEvent {
    /// From `effective_from` (until `effective_until`, if given) the tenant's charges in
    /// `scope` are priced by `terms`.
    #[serde(rename = "tenant.adjustment_granted.v1")]
    AdjustmentGranted {
        adjustment_id: Uuid,
        /// The tenant's name, as stamped on its events' envelopes.
        tenant: String,
        scope: AdjustmentScope,
        terms: AdjustmentTerms,
        effective_from: DateTime<Utc>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        effective_until: Option<DateTime<Utc>>,
        granted_by: String,
        /// A contract or ticket reference, for finance.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reference: Option<String>,
    },

    /// The adjustment no longer applies to charges starting at or after `effective_at`.
    #[serde(rename = "tenant.adjustment_revoked.v1")]
    AdjustmentRevoked {
        adjustment_id: Uuid,
        effective_at: DateTime<Utc>,
        revoked_by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },

    /// From now on the tenant's workflows are placed within `policy`, on top of each
    /// workflow's own hints. Replaces any earlier policy whole.
    #[serde(rename = "tenant.policy_set.v1")]
    PolicySet {
        tenant: String,
        policy: PlacementPolicy,
        set_by: String,
    },

    /// From now on the tenant's submissions are held to `limits`. Replaces any earlier
    /// limits whole.
    #[serde(rename = "tenant.limits_set.v1")]
    LimitsSet {
        tenant: String,
        limits: TenantLimits,
        set_by: String,
    },

    /// A submission's estimate counts against the tenant's monthly budget while the
    /// workflow runs (in flight); once it ends, its bill counts instead.
    #[serde(rename = "tenant.budget_reserved.v1")]
    BudgetReserved {
        workflow_id: Uuid,
        /// `YYYY-MM` (UTC): the month it counts in.
        month: String,
        estimate: Money,
        /// The most GPU-hours it can hold: each task's GPUs over its walltime.
        #[serde(default, skip_serializing_if = "Decimal::is_zero")]
        gpu_hours: Decimal,
    },

    /// A reservation for a submission that was never appended, given back.
    #[serde(rename = "tenant.budget_released.v1")]
    BudgetReleased { workflow_id: Uuid },
}

/// What a tenant may spend. Absent limits do not limit.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TenantLimits {
    /// The most its workflows may cost in one calendar month (UTC), billed and in
    /// flight together, in the tenant's currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub money_per_month: Option<Money>,
    /// The most of its workflows placed and not yet ended at once; more wait, queued in
    /// submission order, and are placed as others end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_workflows: Option<u32>,
    /// The most GPUs its running jobs and services may hold at once; a task that would
    /// pass it is held back, and released as others end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_gpus: Option<u32>,
    /// The most GPU-hours its workflows may hold in one calendar month (UTC), used and
    /// in flight together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_hours_per_month: Option<Decimal>,
}

/// Where a tenant's work may run, whatever its workflows ask: the stricter of this and
/// a workflow's `placement` hints applies. The default is [`PlacementPolicy::open`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementPolicy {
    /// Sites the tenant may use; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<String>,
    /// Regions the tenant may use; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    /// The jurisdiction its data must stay in, such as `eu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residency: Option<String>,
    /// The most one workflow's estimate may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_per_workflow: Option<Money>,
    /// Whether its workflows may run on spot (preemptible) capacity when they ask to.
    #[serde(default = "yes")]
    pub spot_allowed: bool,
    /// Whether its workflows may be split across sites when they ask to.
    #[serde(default = "yes")]
    pub split_allowed: bool,
}

fn yes() -> bool {
    true
}

impl PlacementPolicy {
    /// A policy that allows everything: what a tenant without one gets.
    pub fn open() -> PlacementPolicy {
        PlacementPolicy {
            sites: Vec::new(),
            regions: Vec::new(),
            residency: None,
            budget_per_workflow: None,
            spot_allowed: true,
            split_allowed: true,
        }
    }
}

impl Default for PlacementPolicy {
    fn default() -> Self {
        PlacementPolicy::open()
    }
}

impl TenantEvent {
    /// The versioned tag this event serializes with.
    pub fn kind(&self) -> &'static str {
        match self {
            TenantEvent::AdjustmentGranted { .. } => "tenant.adjustment_granted.v1",
            TenantEvent::AdjustmentRevoked { .. } => "tenant.adjustment_revoked.v1",
            TenantEvent::PolicySet { .. } => "tenant.policy_set.v1",
            TenantEvent::LimitsSet { .. } => "tenant.limits_set.v1",
            TenantEvent::BudgetReserved { .. } => "tenant.budget_reserved.v1",
            TenantEvent::BudgetReleased { .. } => "tenant.budget_released.v1",
        }
    }
}

/// What kind of charge a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeKind {
    Compute,
    Storage,
    Egress,
}

impl ChargeKind {
    pub const ALL: [ChargeKind; 3] = [ChargeKind::Compute, ChargeKind::Storage, ChargeKind::Egress];

    pub fn as_str(self) -> &'static str {
        match self {
            ChargeKind::Compute => "compute",
            ChargeKind::Storage => "storage",
            ChargeKind::Egress => "egress",
        }
    }

    pub fn parse(s: &str) -> Option<ChargeKind> {
        ChargeKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for ChargeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one ledger line measures and is priced per: one dimension of a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Meter {
    /// Cloud instances (nodes) × hours.
    InstanceHours,
    /// Cores × hours (HPC, Kubernetes, local).
    CoreHours,
    /// GiB of memory × hours.
    MemoryGibHours,
    /// GPUs × hours.
    GpuHours,
    /// GiB of a volume or cache × hours.
    StorageGibHours,
    /// Decimal GB moved out of a site or region.
    EgressGb,
}

impl Meter {
    pub const ALL: [Meter; 6] = [
        Meter::InstanceHours,
        Meter::CoreHours,
        Meter::MemoryGibHours,
        Meter::GpuHours,
        Meter::StorageGibHours,
        Meter::EgressGb,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Meter::InstanceHours => "instance_hours",
            Meter::CoreHours => "core_hours",
            Meter::MemoryGibHours => "memory_gib_hours",
            Meter::GpuHours => "gpu_hours",
            Meter::StorageGibHours => "storage_gib_hours",
            Meter::EgressGb => "egress_gb",
        }
    }

    pub fn parse(s: &str) -> Option<Meter> {
        Meter::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// The unit as FOCUS writes it (`PricingUnit`, `ConsumedUnit`).
    pub fn unit(self) -> &'static str {
        match self {
            Meter::InstanceHours => "Hours",
            Meter::CoreHours => "Core-Hours",
            Meter::MemoryGibHours | Meter::StorageGibHours => "GiB-Hours",
            Meter::GpuHours => "GPU-Hours",
            Meter::EgressGb => "GB",
        }
    }

    /// The kind of charge this meter belongs to.
    pub fn charge(self) -> ChargeKind {
        match self {
            Meter::InstanceHours | Meter::CoreHours | Meter::MemoryGibHours | Meter::GpuHours => {
                ChargeKind::Compute
            }
            Meter::StorageGibHours => ChargeKind::Storage,
            Meter::EgressGb => ChargeKind::Egress,
        }
    }
}

impl fmt::Display for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of a tenant's charges an adjustment covers. Every field narrows it; none
/// covers everything. A site and a site kind are not given together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AdjustmentScope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_kind: Option<SiteKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<ChargeKind>,
}

impl AdjustmentScope {
    /// Whether a charge of `charge` at `site` (of `site_kind`, when known) is covered.
    pub fn covers(&self, site: &str, site_kind: Option<SiteKind>, charge: ChargeKind) -> bool {
        self.site.as_deref().is_none_or(|s| s == site)
            && self.site_kind.is_none_or(|k| Some(k) == site_kind)
            && self.charge.is_none_or(|c| c == charge)
    }

    /// How narrow the scope is: a site beats a site kind beats the whole tenant, and at
    /// each of those a charge kind narrows further. The most specific adjustment wins.
    pub fn specificity(&self) -> u8 {
        let place = if self.site.is_some() {
            2
        } else if self.site_kind.is_some() {
            1
        } else {
            0
        };
        place * 2 + u8::from(self.charge.is_some())
    }
}

impl fmt::Display for AdjustmentScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(site) = &self.site {
            parts.push(format!("site {site}"));
        }
        if let Some(kind) = self.site_kind {
            parts.push(format!("{kind} sites"));
        }
        if let Some(charge) = self.charge {
            parts.push(format!("{charge} charges"));
        }
        if parts.is_empty() {
            f.write_str("every charge")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// How an adjustment prices what it covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AdjustmentTerms {
    /// The list unit price less `percent` percent (0 < percent ≤ 100).
    PercentDiscount { percent: Decimal },
    /// A negotiated unit price for one meter, in one currency; it applies only to lines
    /// of that meter billed in that currency (nothing is ever converted).
    CommittedRate {
        meter: Meter,
        unit_price: Decimal,
        currency: Currency,
    },
}

impl fmt::Display for AdjustmentTerms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdjustmentTerms::PercentDiscount { percent } => write!(f, "{percent}% off list"),
            AdjustmentTerms::CommittedRate {
                meter,
                unit_price,
                currency,
            } => write!(
                f,
                "committed {unit_price} {currency} per {}",
                meter.unit().trim_end_matches('s')
            ),
        }
    }
}
