//! The Tenant aggregate: the price adjustments a tenant has been granted, and the
//! placement policy its work runs under.
//!
//! A tenant's history lives under one aggregate whose id is derived from its name
//! ([`tenant_id`]), so anyone can find it without a directory. Adjustments take effect
//! from now on, never backwards: the ledger prices each charge once, as it arrives, so a
//! backdated discount would silently miss what was already billed. (A refund for the
//! past is a credit, which is not modelled yet.)

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::Aggregate;
use crate::envelope::AggregateKind;
use crate::money::Money;
use crate::vocabulary::tenant::{
    AdjustmentScope, AdjustmentTerms, PlacementPolicy, TenantEvent, TenantLimits,
};

/// The id of tenant `name`'s aggregate: a UUIDv8 from the first 16 bytes of
/// SHA-256("meridian/tenant/" + name). Deterministic, so the log needs no name → id index;
/// the one place Meridian does not use UUIDv7, because the key is the name.
pub fn tenant_id(name: &str) -> Uuid {
    let digest = Sha256::digest(format!("meridian/tenant/{name}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// Whether `name` is a valid tenant name: 1 to 63 of `a-z`, `0-9`, `-`, `_` (the rule
/// the API applies to `X-Meridian-Tenant`).
pub fn valid_tenant_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

#[derive(Debug, Clone)]
pub enum TenantCommand {
    /// `effective_from` defaults to now and may not be earlier.
    GrantAdjustment {
        tenant: String,
        adjustment_id: Uuid,
        scope: AdjustmentScope,
        terms: AdjustmentTerms,
        effective_from: Option<DateTime<Utc>>,
        effective_until: Option<DateTime<Utc>>,
        granted_by: String,
        reference: Option<String>,
    },
    /// `effective_at` defaults to now and may not be earlier.
    RevokeAdjustment {
        adjustment_id: Uuid,
        effective_at: Option<DateTime<Utc>>,
        revoked_by: String,
        reason: Option<String>,
    },
    /// Replaces the tenant's placement policy.
    SetPolicy {
        tenant: String,
        policy: PlacementPolicy,
        set_by: String,
    },
    /// Replaces the tenant's limits.
    SetLimits {
        tenant: String,
        limits: TenantLimits,
        set_by: String,
    },
    /// Counts a submission's estimate against this month's budget, or refuses it with
    /// the numbers. What the ledger knows comes with the command; what is in flight is
    /// this aggregate's own reservations, so two racing submissions are decided one
    /// after the other (the second append sees the first's reservation).
    ReserveBudget {
        tenant: String,
        workflow_id: Uuid,
        /// `YYYY-MM`.
        month: String,
        estimate: Money,
        /// The tenant's bill for the month so far.
        spent: Money,
        /// What each reserved workflow has been billed this month so far.
        billed: BTreeMap<Uuid, Decimal>,
        /// Reserved workflows that have ended: their bill is in `spent` instead.
        concluded: BTreeSet<Uuid>,
        /// The most GPU-hours it can hold.
        gpu_hours: Decimal,
        /// GPU-hours the tenant's runs held this month so far.
        gpu_hours_used: Decimal,
        /// What each reserved workflow's runs held this month so far.
        gpu_hours_by_workflow: BTreeMap<Uuid, Decimal>,
    },
    /// Gives back a reservation whose submission was never appended.
    ReleaseBudget { workflow_id: Uuid },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    #[error("invalid tenant name {0:?}: expected 1 to 63 of a-z, 0-9, '-', '_'")]
    InvalidName(String),
    #[error("this aggregate holds tenant {held:?}, not {given:?}")]
    WrongTenant { held: String, given: String },
    #[error("the tenant has no adjustments")]
    NoAdjustments,
    #[error("adjustment {0} already exists")]
    DuplicateAdjustment(Uuid),
    #[error("no adjustment {0}")]
    UnknownAdjustment(Uuid),
    #[error("adjustment {id} already ends at {until}")]
    AlreadyEnded { id: Uuid, until: DateTime<Utc> },
    #[error(
        "{what} {at} is in the past (now is {now}); adjustments apply from now on, because \
         what was already billed is never re-priced"
    )]
    Backdated {
        what: &'static str,
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    #[error("the adjustment would end at {until}, not after it starts at {from}")]
    EmptyWindow {
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    },
    #[error("invalid discount {0}%: expected more than 0 and at most 100")]
    InvalidPercent(Decimal),
    #[error("invalid committed price {0}: a price cannot be negative")]
    NegativePrice(Decimal),
    #[error("invalid scope: {0}")]
    InvalidScope(String),
    #[error("invalid policy: {field}: {message}")]
    InvalidPolicy {
        field: &'static str,
        message: String,
    },
    #[error("invalid limits: {0}")]
    InvalidLimits(String),
    #[error(
        "over budget: the tenant's budget for {month} is {budget}; {spent} is billed and \
         {in_flight} is in flight, so this estimate of {estimate} would bring it to {total}"
    )]
    OverBudget {
        month: String,
        budget: Money,
        spent: Money,
        in_flight: Money,
        estimate: Money,
        total: Money,
    },
    #[error(
        "over the GPU-hour budget: the tenant may hold {budget} GPU-hours in {month}; {used} \
         were used and {in_flight} are in flight, so this workflow's {estimate} would bring it \
         to {total}"
    )]
    OverGpuHours {
        month: String,
        budget: Decimal,
        used: Decimal,
        in_flight: Decimal,
        estimate: Decimal,
        total: Decimal,
    },
    #[error(
        "the estimate is in {estimate} and the budget in {budget}: Meridian has no exchange \
         rates, so it cannot hold this workflow to the budget"
    )]
    CurrencyMismatch {
        budget: crate::money::Currency,
        estimate: crate::money::Currency,
    },
}

/// A submission's estimate, counted against a month's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub month: String,
    pub estimate: Money,
    pub gpu_hours: Decimal,
}

/// One adjustment as the tenant's history has it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    pub id: Uuid,
    pub scope: AdjustmentScope,
    pub terms: AdjustmentTerms,
    pub effective_from: DateTime<Utc>,
    /// The end of its window (exclusive): its own `effective_until` or its revocation.
    pub effective_until: Option<DateTime<Utc>>,
    pub granted_by: String,
    pub reference: Option<String>,
}

impl Adjustment {
    /// Whether it applies to a charge starting at `at`.
    pub fn in_force_at(&self, at: DateTime<Utc>) -> bool {
        self.effective_from <= at && self.effective_until.is_none_or(|u| at < u)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Tenant {
    name: Option<String>,
    /// In grant order.
    adjustments: BTreeMap<Uuid, Adjustment>,
    order: Vec<Uuid>,
    policy: Option<PlacementPolicy>,
    limits: TenantLimits,
    reservations: BTreeMap<Uuid, Reservation>,
}

impl Tenant {
    /// `None` until the first event.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Every adjustment ever granted, oldest grant first (revoked ones included, with
    /// their window cut short).
    pub fn adjustments(&self) -> impl Iterator<Item = &Adjustment> {
        self.order.iter().map(|id| &self.adjustments[id])
    }

    /// The placement policy set for the tenant, if any.
    pub fn policy(&self) -> Option<&PlacementPolicy> {
        self.policy.as_ref()
    }

    pub fn limits(&self) -> &TenantLimits {
        &self.limits
    }

    /// The reservations of `month`, by workflow.
    pub fn reservations_in<'a>(
        &'a self,
        month: &'a str,
    ) -> impl Iterator<Item = (Uuid, &'a Reservation)> + 'a {
        self.reservations
            .iter()
            .filter(move |(_, r)| r.month == month)
            .map(|(id, r)| (*id, r))
    }

    /// What is in flight in `month`: each running reserved workflow's estimate less what
    /// it has been billed so far (never below zero).
    pub fn in_flight(
        &self,
        month: &str,
        billed: &BTreeMap<Uuid, Decimal>,
        concluded: &BTreeSet<Uuid>,
    ) -> Decimal {
        self.reservations_in(month)
            .filter(|(id, _)| !concluded.contains(id))
            .map(|(id, r)| {
                (r.estimate.amount - billed.get(&id).copied().unwrap_or_default())
                    .max(Decimal::ZERO)
            })
            .sum()
    }

    /// GPU-hours in flight in `month`, as [`Tenant::in_flight`] counts money.
    pub fn gpu_hours_in_flight(
        &self,
        month: &str,
        used: &BTreeMap<Uuid, Decimal>,
        concluded: &BTreeSet<Uuid>,
    ) -> Decimal {
        self.reservations_in(month)
            .filter(|(id, _)| !concluded.contains(id))
            .map(|(id, r)| {
                (r.gpu_hours - used.get(&id).copied().unwrap_or_default()).max(Decimal::ZERO)
            })
            .sum()
    }

    pub fn adjustment(&self, id: Uuid) -> Option<&Adjustment> {
        self.adjustments.get(&id)
    }

    /// The adjustments in force at `at`, oldest grant first.
    pub fn in_force_at(&self, at: DateTime<Utc>) -> impl Iterator<Item = &Adjustment> {
        self.adjustments().filter(move |a| a.in_force_at(at))
    }
}

impl Tenant {
    /// `tenant` may act on this aggregate: a valid name, and the one it already holds.
    fn check_tenant(&self, tenant: &str) -> Result<(), TenantError> {
        if !valid_tenant_name(tenant) {
            return Err(TenantError::InvalidName(tenant.to_string()));
        }
        match &self.name {
            Some(held) if held != tenant => Err(TenantError::WrongTenant {
                held: held.clone(),
                given: tenant.to_string(),
            }),
            _ => Ok(()),
        }
    }
}

fn check_policy(policy: &PlacementPolicy) -> Result<(), TenantError> {
    let invalid = |field, message: &str| {
        Err(TenantError::InvalidPolicy {
            field,
            message: message.into(),
        })
    };
    if policy.sites.iter().any(|s| s.trim().is_empty()) {
        return invalid("sites", "a site name is empty");
    }
    if policy.regions.iter().any(|s| s.trim().is_empty()) {
        return invalid("regions", "a region is empty");
    }
    if policy
        .residency
        .as_deref()
        .is_some_and(|r| r.trim().is_empty())
    {
        return invalid("residency", "expected a jurisdiction such as eu");
    }
    if let Some(budget) = &policy.budget_per_workflow {
        if budget.amount <= Decimal::ZERO {
            return invalid("budget_per_workflow", "expected an amount above zero");
        }
    }
    Ok(())
}

fn check_scope(scope: &AdjustmentScope, terms: &AdjustmentTerms) -> Result<(), TenantError> {
    if scope.site.is_some() && scope.site_kind.is_some() {
        return Err(TenantError::InvalidScope(
            "give a site or a site kind, not both".into(),
        ));
    }
    if scope.site.as_deref() == Some("") {
        return Err(TenantError::InvalidScope("the site name is empty".into()));
    }
    match terms {
        AdjustmentTerms::PercentDiscount { percent } => {
            if *percent <= Decimal::ZERO || *percent > Decimal::ONE_HUNDRED {
                return Err(TenantError::InvalidPercent(*percent));
            }
        }
        AdjustmentTerms::CommittedRate {
            meter, unit_price, ..
        } => {
            if unit_price.is_sign_negative() {
                return Err(TenantError::NegativePrice(*unit_price));
            }
            if let Some(charge) = scope.charge {
                if charge != meter.charge() {
                    return Err(TenantError::InvalidScope(format!(
                        "a committed rate for {meter} covers {} charges, not {charge}",
                        meter.charge()
                    )));
                }
            }
        }
    }
    Ok(())
}

impl Aggregate for Tenant {
    const KIND: AggregateKind = AggregateKind::Tenant;
    type Command = TenantCommand;
    type Event = TenantEvent;
    type Error = TenantError;

    fn handle(
        &self,
        cmd: TenantCommand,
        now: DateTime<Utc>,
    ) -> Result<Vec<TenantEvent>, TenantError> {
        match cmd {
            TenantCommand::GrantAdjustment {
                tenant,
                adjustment_id,
                scope,
                terms,
                effective_from,
                effective_until,
                granted_by,
                reference,
            } => {
                self.check_tenant(&tenant)?;
                if self.adjustments.contains_key(&adjustment_id) {
                    return Err(TenantError::DuplicateAdjustment(adjustment_id));
                }
                check_scope(&scope, &terms)?;
                let from = effective_from.unwrap_or(now);
                if from < now {
                    return Err(TenantError::Backdated {
                        what: "effective_from",
                        at: from,
                        now,
                    });
                }
                if let Some(until) = effective_until {
                    if until <= from {
                        return Err(TenantError::EmptyWindow { from, until });
                    }
                }
                Ok(vec![TenantEvent::AdjustmentGranted {
                    adjustment_id,
                    tenant,
                    scope,
                    terms,
                    effective_from: from,
                    effective_until,
                    granted_by,
                    reference,
                }])
            }
            TenantCommand::RevokeAdjustment {
                adjustment_id,
                effective_at,
                revoked_by,
                reason,
            } => {
                if self.name.is_none() {
                    return Err(TenantError::NoAdjustments);
                }
                let adjustment = self
                    .adjustments
                    .get(&adjustment_id)
                    .ok_or(TenantError::UnknownAdjustment(adjustment_id))?;
                let at = effective_at.unwrap_or(now);
                if at < now {
                    return Err(TenantError::Backdated {
                        what: "effective_at",
                        at,
                        now,
                    });
                }
                if let Some(until) = adjustment.effective_until {
                    if until <= at {
                        return Err(TenantError::AlreadyEnded {
                            id: adjustment_id,
                            until,
                        });
                    }
                }
                // Revoking one that has not started yet ends it before it began: an empty
                // window, which is what the admin meant.
                let at = at.max(adjustment.effective_from);
                Ok(vec![TenantEvent::AdjustmentRevoked {
                    adjustment_id,
                    effective_at: at,
                    revoked_by,
                    reason,
                }])
            }
            TenantCommand::SetPolicy {
                tenant,
                policy,
                set_by,
            } => {
                self.check_tenant(&tenant)?;
                check_policy(&policy)?;
                if self.policy.as_ref() == Some(&policy) {
                    return Ok(Vec::new());
                }
                Ok(vec![TenantEvent::PolicySet {
                    tenant,
                    policy,
                    set_by,
                }])
            }
            TenantCommand::SetLimits {
                tenant,
                limits,
                set_by,
            } => {
                self.check_tenant(&tenant)?;
                if let Some(m) = &limits.money_per_month {
                    if m.amount.is_sign_negative() {
                        return Err(TenantError::InvalidLimits(
                            "money_per_month: expected an amount of zero or more".into(),
                        ));
                    }
                }
                if limits
                    .gpu_hours_per_month
                    .is_some_and(|h| h.is_sign_negative())
                {
                    return Err(TenantError::InvalidLimits(
                        "gpu_hours_per_month: expected zero or more".into(),
                    ));
                }
                for (field, value) in [
                    ("concurrent_workflows", limits.concurrent_workflows),
                    ("concurrent_gpus", limits.concurrent_gpus),
                ] {
                    if value == Some(0) {
                        return Err(TenantError::InvalidLimits(format!(
                            "{field}: expected 1 or more (leave it out for no limit)"
                        )));
                    }
                }
                if self.limits == limits {
                    return Ok(Vec::new());
                }
                Ok(vec![TenantEvent::LimitsSet {
                    tenant,
                    limits,
                    set_by,
                }])
            }
            TenantCommand::ReserveBudget {
                tenant,
                workflow_id,
                month,
                estimate,
                spent,
                billed,
                concluded,
                gpu_hours,
                gpu_hours_used,
                gpu_hours_by_workflow,
            } => {
                self.check_tenant(&tenant)?;
                let (money, gpu_budget) = (
                    self.limits.money_per_month.clone(),
                    self.limits.gpu_hours_per_month,
                );
                if (money.is_none() && gpu_budget.is_none())
                    || self.reservations.contains_key(&workflow_id)
                {
                    return Ok(Vec::new());
                }
                if let Some(budget) = &money {
                    for currency in [estimate.currency, spent.currency] {
                        if currency != budget.currency {
                            return Err(TenantError::CurrencyMismatch {
                                budget: budget.currency,
                                estimate: currency,
                            });
                        }
                    }
                    let in_flight = self.in_flight(&month, &billed, &concluded);
                    let total = spent.amount + in_flight + estimate.amount;
                    if total > budget.amount {
                        let money = |amount| Money::new(amount, budget.currency);
                        return Err(TenantError::OverBudget {
                            month,
                            budget: budget.clone(),
                            spent,
                            in_flight: money(in_flight),
                            estimate,
                            total: money(total),
                        });
                    }
                }
                if let Some(budget) = gpu_budget {
                    let in_flight =
                        self.gpu_hours_in_flight(&month, &gpu_hours_by_workflow, &concluded);
                    let total = gpu_hours_used + in_flight + gpu_hours;
                    if gpu_hours > Decimal::ZERO && total > budget {
                        return Err(TenantError::OverGpuHours {
                            month,
                            budget,
                            used: gpu_hours_used,
                            in_flight,
                            estimate: gpu_hours,
                            total,
                        });
                    }
                }
                Ok(vec![TenantEvent::BudgetReserved {
                    workflow_id,
                    month,
                    estimate,
                    gpu_hours,
                }])
            }
            TenantCommand::ReleaseBudget { workflow_id } => {
                if !self.reservations.contains_key(&workflow_id) {
                    return Ok(Vec::new());
                }
                Ok(vec![TenantEvent::BudgetReleased { workflow_id }])
            }
        }
    }

    fn apply(&mut self, event: &TenantEvent) {
        match event {
            TenantEvent::AdjustmentGranted {
                adjustment_id,
                tenant,
                scope,
                terms,
                effective_from,
                effective_until,
                granted_by,
                reference,
            } => {
                self.name.get_or_insert_with(|| tenant.clone());
                if self
                    .adjustments
                    .insert(
                        *adjustment_id,
                        Adjustment {
                            id: *adjustment_id,
                            scope: scope.clone(),
                            terms: terms.clone(),
                            effective_from: *effective_from,
                            effective_until: *effective_until,
                            granted_by: granted_by.clone(),
                            reference: reference.clone(),
                        },
                    )
                    .is_none()
                {
                    self.order.push(*adjustment_id);
                }
            }
            TenantEvent::AdjustmentRevoked {
                adjustment_id,
                effective_at,
                ..
            } => {
                if let Some(a) = self.adjustments.get_mut(adjustment_id) {
                    a.effective_until = Some(
                        a.effective_until
                            .map_or(*effective_at, |u| u.min(*effective_at)),
                    );
                }
            }
            TenantEvent::PolicySet { tenant, policy, .. } => {
                self.name.get_or_insert_with(|| tenant.clone());
                self.policy = Some(policy.clone());
            }
            TenantEvent::LimitsSet { tenant, limits, .. } => {
                self.name.get_or_insert_with(|| tenant.clone());
                self.limits = limits.clone();
            }
            TenantEvent::BudgetReserved {
                workflow_id,
                month,
                estimate,
                gpu_hours,
            } => {
                self.reservations.insert(
                    *workflow_id,
                    Reservation {
                        month: month.clone(),
                        estimate: estimate.clone(),
                        gpu_hours: *gpu_hours,
                    },
                );
            }
            TenantEvent::BudgetReleased { workflow_id } => {
                self.reservations.remove(workflow_id);
            }
        }
    }
}
