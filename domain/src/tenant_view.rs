//! What placement knows per tenant, folded from the log: the placement policy and the
//! limits an admin set, and how many GB of billable egress left each source for it this month (where
//! its next copies fall in the source's volume tiers).

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Utc};
use meridian_events::vocabulary::tenant::{PlacementPolicy, TenantEvent, TenantLimits};
use meridian_events::vocabulary::{Location, TransferEvent};
use meridian_events::{Envelope, Event};
use rust_decimal::Decimal;

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TenantView {
    policies: BTreeMap<String, PlacementPolicy>,
    limits: BTreeMap<String, TenantLimits>,
    /// (tenant, source site or region) → (year, month, GB moved that month). Only the
    /// latest month is kept: tiers restart each calendar month (UTC).
    #[serde(with = "pairs")]
    egress: BTreeMap<(String, String), (i32, u32, Decimal)>,
}

/// A map whose keys are not strings, as a list of pairs (JSON keys must be strings).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K: Serialize, V: Serialize, S: Serializer>(
        map: &BTreeMap<K, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(map)
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

impl TenantView {
    /// The policy set for `tenant`, if any.
    pub fn policy(&self, tenant: &str) -> Option<&PlacementPolicy> {
        self.policies.get(tenant)
    }

    /// The limits set for `tenant`, if any.
    pub fn limits(&self, tenant: &str) -> Option<&TenantLimits> {
        self.limits.get(tenant)
    }

    /// GB of billable egress out of `source` for `tenant` in the month of `now`.
    pub fn egress_so_far(&self, tenant: &str, source: &str, now: DateTime<Utc>) -> Decimal {
        match self.egress.get(&(tenant.to_string(), source.to_string())) {
            Some((year, month, gb)) if (*year, *month) == (now.year(), now.month()) => *gb,
            _ => Decimal::ZERO,
        }
    }

    /// Folds in a policy change or a billable finished transfer; ignores anything else.
    pub fn observe(&mut self, envelope: &Envelope<Event>) {
        match &envelope.payload {
            Event::Tenant(TenantEvent::PolicySet { tenant, policy, .. }) => {
                self.policies.insert(tenant.clone(), policy.clone());
            }
            Event::Tenant(TenantEvent::LimitsSet { tenant, limits, .. }) => {
                self.limits.insert(tenant.clone(), limits.clone());
            }
            Event::Transfer(TransferEvent::Completed {
                bytes,
                from,
                started_at,
                ended_at,
                egress: Some(_),
                ..
            }) => {
                let source = match from {
                    Location::Site { site } => site.clone(),
                    Location::Region { region } => region.clone(),
                };
                let gb = Decimal::from(*bytes) / Decimal::from(1_000_000_000u64);
                // The ledger counts only the share of a copy that falls in each month
                // towards that month's tiers; the latest month's share is what counts now.
                let month = (ended_at.year(), ended_at.month());
                let share = share_in_last_month(*started_at, *ended_at, gb);
                let entry = self
                    .egress
                    .entry((envelope.tenant.clone(), source))
                    .or_insert((month.0, month.1, Decimal::ZERO));
                if (entry.0, entry.1) < month {
                    *entry = (month.0, month.1, Decimal::ZERO);
                }
                if (entry.0, entry.1) == month {
                    entry.2 += share;
                }
            }
            _ => {}
        }
    }
}

/// The part of `gb` moved from `start` to `end` that falls in `end`'s calendar month,
/// shared by time as the ledger shares a copy across months.
fn share_in_last_month(start: DateTime<Utc>, end: DateTime<Utc>, gb: Decimal) -> Decimal {
    crate::period::share_by_time(start, end, gb)
        .ok()
        .and_then(|shares| shares.last().map(|(_, share)| *share))
        .unwrap_or(gb)
}
