//! The Tenant aggregate: price adjustments granted and revoked, given events / when a
//! command / then events or an error.

mod common;

use chrono::Duration;
use common::*;
use meridian_events::aggregate::testing::given;
use meridian_events::aggregate::{tenant_id, Tenant, TenantCommand, TenantError};
use meridian_events::vocabulary::tenant::{
    AdjustmentScope, AdjustmentTerms, ChargeKind, Meter, PlacementPolicy,
};
use meridian_events::{Currency, SiteKind, TenantEvent};

fn discount(percent: &str, site: Option<&str>) -> TenantCommand {
    TenantCommand::GrantAdjustment {
        tenant: "physics".into(),
        adjustment_id: id(1),
        scope: AdjustmentScope {
            site: site.map(Into::into),
            ..AdjustmentScope::default()
        },
        terms: AdjustmentTerms::PercentDiscount {
            percent: dec(percent),
        },
        effective_from: Some(at(12, 0)),
        effective_until: None,
        granted_by: "finance".into(),
        reference: Some("contract 2025-7".into()),
    }
}

fn granted(percent: &str) -> TenantEvent {
    TenantEvent::AdjustmentGranted {
        adjustment_id: id(1),
        tenant: "physics".into(),
        scope: AdjustmentScope {
            site: Some("hpc-eu".into()),
            ..AdjustmentScope::default()
        },
        terms: AdjustmentTerms::PercentDiscount {
            percent: dec(percent),
        },
        effective_from: at(12, 0),
        effective_until: None,
        granted_by: "finance".into(),
        reference: Some("contract 2025-7".into()),
    }
}

#[test]
fn a_discount_is_granted_from_a_future_moment() {
    let state = given::<Tenant>([])
        .when(discount("10", Some("hpc-eu")), at(9, 0))
        .then(vec![granted("10")]);
    assert_eq!(state.name(), Some("physics"));
    assert_eq!(state.in_force_at(at(11, 59)).count(), 0);
    assert_eq!(state.in_force_at(at(12, 0)).count(), 1);
}

#[test]
fn without_a_date_it_starts_now_and_backdating_is_refused() {
    let mut cmd = discount("10", None);
    if let TenantCommand::GrantAdjustment { effective_from, .. } = &mut cmd {
        *effective_from = None;
    }
    let (events, _) = given::<Tenant>([]).when(cmd, at(9, 30)).then_ok();
    let TenantEvent::AdjustmentGranted { effective_from, .. } = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!(*effective_from, at(9, 30));

    let err = given::<Tenant>([])
        .when(discount("10", None), at(12, 1))
        .then_err(|e| matches!(e, TenantError::Backdated { .. }));
    assert!(err.to_string().contains("in the past"), "{err}");
}

#[test]
fn terms_and_scopes_are_checked() {
    for bad in ["0", "-5", "100.01"] {
        given::<Tenant>([])
            .when(discount(bad, None), at(9, 0))
            .then_err(|e| matches!(e, TenantError::InvalidPercent(_)));
    }
    // 100 % is a free tier: allowed.
    given::<Tenant>([])
        .when(discount("100", None), at(9, 0))
        .then_ok();
    let both = TenantCommand::GrantAdjustment {
        tenant: "physics".into(),
        adjustment_id: id(2),
        scope: AdjustmentScope {
            site: Some("hpc-eu".into()),
            site_kind: Some(SiteKind::Slurm),
            charge: None,
        },
        terms: AdjustmentTerms::PercentDiscount { percent: dec("5") },
        effective_from: None,
        effective_until: None,
        granted_by: "finance".into(),
        reference: None,
    };
    given::<Tenant>([])
        .when(both, at(9, 0))
        .then_err(|e| matches!(e, TenantError::InvalidScope(_)));
    let wrong_charge = TenantCommand::GrantAdjustment {
        tenant: "physics".into(),
        adjustment_id: id(2),
        scope: AdjustmentScope {
            charge: Some(ChargeKind::Egress),
            ..AdjustmentScope::default()
        },
        terms: AdjustmentTerms::CommittedRate {
            meter: Meter::GpuHours,
            unit_price: dec("1.80"),
            currency: Currency::USD,
        },
        effective_from: None,
        effective_until: None,
        granted_by: "finance".into(),
        reference: None,
    };
    given::<Tenant>([])
        .when(wrong_charge, at(9, 0))
        .then_err(|e| matches!(e, TenantError::InvalidScope(_)));
    let negative = TenantCommand::GrantAdjustment {
        tenant: "physics".into(),
        adjustment_id: id(2),
        scope: AdjustmentScope::default(),
        terms: AdjustmentTerms::CommittedRate {
            meter: Meter::GpuHours,
            unit_price: dec("-1"),
            currency: Currency::USD,
        },
        effective_from: None,
        effective_until: None,
        granted_by: "finance".into(),
        reference: None,
    };
    given::<Tenant>([])
        .when(negative, at(9, 0))
        .then_err(|e| matches!(e, TenantError::NegativePrice(_)));
    let mut empty = discount("10", None);
    if let TenantCommand::GrantAdjustment {
        effective_until, ..
    } = &mut empty
    {
        *effective_until = Some(at(12, 0));
    }
    given::<Tenant>([])
        .when(empty, at(9, 0))
        .then_err(|e| matches!(e, TenantError::EmptyWindow { .. }));
    let mut bad_name = discount("10", None);
    if let TenantCommand::GrantAdjustment { tenant, .. } = &mut bad_name {
        *tenant = "Physics Dept".into();
    }
    given::<Tenant>([])
        .when(bad_name, at(9, 0))
        .then_err(|e| matches!(e, TenantError::InvalidName(_)));
}

#[test]
fn one_aggregate_per_tenant_and_ids_are_unique() {
    given::<Tenant>([granted("10")])
        .when(discount("20", Some("hpc-eu")), at(9, 0))
        .then_err(|e| *e == TenantError::DuplicateAdjustment(id(1)));
    let mut other = discount("20", None);
    if let TenantCommand::GrantAdjustment {
        tenant,
        adjustment_id,
        ..
    } = &mut other
    {
        *tenant = "chemistry".into();
        *adjustment_id = id(2);
    }
    given::<Tenant>([granted("10")])
        .when(other, at(9, 0))
        .then_err(|e| matches!(e, TenantError::WrongTenant { .. }));
    // The aggregate id is the name's, stable and distinct per name.
    assert_eq!(tenant_id("physics"), tenant_id("physics"));
    assert_ne!(tenant_id("physics"), tenant_id("chemistry"));
    assert_eq!(tenant_id("physics").get_version_num(), 8);
}

#[test]
fn a_revocation_cuts_the_window_from_now_on() {
    let revoke = |at_: Option<chrono::DateTime<chrono::Utc>>| TenantCommand::RevokeAdjustment {
        adjustment_id: id(1),
        effective_at: at_,
        revoked_by: "finance".into(),
        reason: Some("contract ended".into()),
    };
    let state = given::<Tenant>([granted("10")])
        .when(revoke(None), at(14, 0))
        .then(vec![TenantEvent::AdjustmentRevoked {
            adjustment_id: id(1),
            effective_at: at(14, 0),
            revoked_by: "finance".into(),
            reason: Some("contract ended".into()),
        }]);
    let a = state.adjustment(id(1)).unwrap();
    assert!(a.in_force_at(at(13, 59)));
    assert!(!a.in_force_at(at(14, 0)));
    // Not again, not backwards, not for what does not exist.
    meridian_events::aggregate::testing::given_state(state)
        .when(revoke(None), at(15, 0))
        .then_err(|e| matches!(e, TenantError::AlreadyEnded { .. }));
    given::<Tenant>([granted("10")])
        .when(revoke(Some(at(13, 0))), at(14, 0))
        .then_err(|e| matches!(e, TenantError::Backdated { .. }));
    given::<Tenant>([])
        .when(revoke(None), at(14, 0))
        .then_err(|e| *e == TenantError::NoAdjustments);
    let mut unknown = revoke(None);
    if let TenantCommand::RevokeAdjustment { adjustment_id, .. } = &mut unknown {
        *adjustment_id = id(9);
    }
    given::<Tenant>([granted("10")])
        .when(unknown, at(14, 0))
        .then_err(|e| *e == TenantError::UnknownAdjustment(id(9)));
    // Revoking one that has not started leaves it an empty window.
    let state = given::<Tenant>([granted("10")])
        .when(revoke(None), at(10, 0))
        .then_ok()
        .1;
    let a = state.adjustment(id(1)).unwrap();
    assert_eq!(a.effective_until, Some(at(12, 0)));
    assert!(!a.in_force_at(at(12, 0)));
    assert!(!a.in_force_at(at(12, 0) + Duration::hours(5)));
}

#[test]
fn scopes_cover_and_rank() {
    let site = AdjustmentScope {
        site: Some("hpc-eu".into()),
        ..AdjustmentScope::default()
    };
    let kind = AdjustmentScope {
        site_kind: Some(SiteKind::Slurm),
        ..AdjustmentScope::default()
    };
    let compute = AdjustmentScope {
        charge: Some(ChargeKind::Compute),
        ..AdjustmentScope::default()
    };
    let all = AdjustmentScope::default();
    assert!(site.covers("hpc-eu", None, ChargeKind::Egress));
    assert!(!site.covers("aws", Some(SiteKind::Aws), ChargeKind::Compute));
    assert!(kind.covers("hpc-eu", Some(SiteKind::Slurm), ChargeKind::Storage));
    assert!(!kind.covers("hpc-eu", None, ChargeKind::Storage));
    assert!(compute.covers("x", None, ChargeKind::Compute));
    assert!(!compute.covers("x", None, ChargeKind::Egress));
    assert!(all.covers("x", None, ChargeKind::Egress));
    assert!(site.specificity() > kind.specificity());
    assert!(kind.specificity() > compute.specificity());
    assert!(compute.specificity() > all.specificity());
    assert_eq!(site.to_string(), "site hpc-eu");
    assert_eq!(all.to_string(), "every charge");
}

fn set_policy(tenant: &str, policy: PlacementPolicy) -> TenantCommand {
    TenantCommand::SetPolicy {
        tenant: tenant.into(),
        policy,
        set_by: "admin".into(),
    }
}

fn eu_only() -> PlacementPolicy {
    PlacementPolicy {
        regions: vec!["eu-central".into()],
        residency: Some("eu".into()),
        budget_per_workflow: Some(meridian_events::Money::new(dec("500"), Currency::EUR)),
        ..PlacementPolicy::open()
    }
}

#[test]
fn a_placement_policy_is_set_replaced_whole_and_a_repeat_records_nothing() {
    let state = given::<Tenant>([])
        .when(set_policy("physics", eu_only()), at(9, 0))
        .then(vec![TenantEvent::PolicySet {
            tenant: "physics".into(),
            policy: eu_only(),
            set_by: "admin".into(),
        }]);
    assert_eq!(state.name(), Some("physics"));
    assert_eq!(state.policy(), Some(&eu_only()));

    let set = TenantEvent::PolicySet {
        tenant: "physics".into(),
        policy: eu_only(),
        set_by: "admin".into(),
    };
    given::<Tenant>([set.clone()])
        .when(set_policy("physics", eu_only()), at(10, 0))
        .then(vec![]);
    let open = given::<Tenant>([set.clone()])
        .when(set_policy("physics", PlacementPolicy::open()), at(10, 0))
        .then(vec![TenantEvent::PolicySet {
            tenant: "physics".into(),
            policy: PlacementPolicy::open(),
            set_by: "admin".into(),
        }]);
    assert_eq!(open.policy(), Some(&PlacementPolicy::open()));
    given::<Tenant>([set])
        .when(set_policy("chemistry", PlacementPolicy::open()), at(10, 0))
        .then_err(|e| matches!(e, TenantError::WrongTenant { .. }));
}

#[test]
fn a_policy_with_an_empty_name_or_a_zero_budget_is_refused_naming_the_field() {
    let bad = |policy: PlacementPolicy| {
        given::<Tenant>([])
            .when(set_policy("physics", policy), at(9, 0))
            .then_err(|e| matches!(e, TenantError::InvalidPolicy { .. }))
            .to_string()
    };
    assert_eq!(
        bad(PlacementPolicy {
            sites: vec![" ".into()],
            ..PlacementPolicy::open()
        }),
        "invalid policy: sites: a site name is empty"
    );
    assert_eq!(
        bad(PlacementPolicy {
            budget_per_workflow: Some(meridian_events::Money::new(dec("0"), Currency::USD)),
            ..PlacementPolicy::open()
        }),
        "invalid policy: budget_per_workflow: expected an amount above zero"
    );
    given::<Tenant>([])
        .when(set_policy("Not A Name", PlacementPolicy::open()), at(9, 0))
        .then_err(|e| matches!(e, TenantError::InvalidName(_)));
}

#[test]
fn a_policy_written_without_the_allow_flags_allows_spot_and_splitting() {
    let policy: PlacementPolicy =
        serde_json::from_value(serde_json::json!({"regions": ["eu"]})).unwrap();
    assert!(policy.spot_allowed && policy.split_allowed);
}

// ---------------------------------------------------------------------------------
// Budgets: a month's money, billed and in flight together.

fn usd(amount: &str) -> meridian_events::Money {
    meridian_events::Money::new(dec(amount), Currency::USD)
}

fn limits_set(budget: &str) -> TenantEvent {
    TenantEvent::LimitsSet {
        tenant: "physics".into(),
        limits: meridian_events::vocabulary::tenant::TenantLimits {
            money_per_month: Some(usd(budget)),
            concurrent_workflows: None,
            concurrent_gpus: None,
            gpu_hours_per_month: None,
        },
        set_by: "admin".into(),
    }
}

fn reserved(n: u128, estimate: &str) -> TenantEvent {
    TenantEvent::BudgetReserved {
        workflow_id: id(n),
        month: "2025-03".into(),
        estimate: usd(estimate),
        gpu_hours: Default::default(),
    }
}

fn reserve(
    n: u128,
    estimate: &str,
    spent: &str,
    billed: &[(u128, &str)],
    concluded: &[u128],
) -> TenantCommand {
    TenantCommand::ReserveBudget {
        tenant: "physics".into(),
        workflow_id: id(n),
        month: "2025-03".into(),
        estimate: usd(estimate),
        spent: usd(spent),
        billed: billed.iter().map(|(n, a)| (id(*n), dec(a))).collect(),
        concluded: concluded.iter().map(|n| id(*n)).collect(),
        gpu_hours: Default::default(),
        gpu_hours_used: Default::default(),
        gpu_hours_by_workflow: Default::default(),
    }
}

#[test]
fn a_submission_within_the_budget_is_reserved_once() {
    let state = given::<Tenant>([limits_set("100")])
        .when(reserve(1, "60", "10", &[], &[]), at(9, 0))
        .then(vec![reserved(1, "60")]);
    // The same workflow again (a retried submission) reserves nothing more.
    given::<Tenant>([limits_set("100"), reserved(1, "60")])
        .when(reserve(1, "60", "10", &[], &[]), at(9, 0))
        .then(vec![]);
    assert_eq!(state.reservations_in("2025-03").count(), 1);
}

#[test]
fn over_budget_is_refused_with_the_numbers_and_the_second_of_two_racers_sees_the_first() {
    // The first of two submissions of 60 passes; the second, decided on the state the
    // first left (as a contended append is retried), does not.
    let after_first = given::<Tenant>([limits_set("100")])
        .when(reserve(1, "60", "10", &[], &[]), at(9, 0))
        .then(vec![reserved(1, "60")]);
    let err = meridian_events::aggregate::testing::given_state(after_first)
        .when(reserve(2, "60", "10", &[], &[]), at(9, 0))
        .then_err(|e| matches!(e, TenantError::OverBudget { .. }));
    assert_eq!(
        err.to_string(),
        "over budget: the tenant's budget for 2025-03 is 100 USD; 10 USD is billed and 60 USD \
         is in flight, so this estimate of 60 USD would bring it to 130 USD"
    );
}

#[test]
fn what_is_in_flight_shrinks_as_it_is_billed_and_ends_with_its_workflow() {
    let history = [limits_set("100"), reserved(1, "60")];
    // Billed 50 of its 60: 10 still in flight, and the 50 is in `spent`.
    given::<Tenant>(history.clone())
        .when(reserve(2, "40", "50", &[(1, "50")], &[]), at(9, 0))
        .then(vec![reserved(2, "40")]);
    // Ended: its bill is in `spent`, nothing in flight.
    given::<Tenant>(history.clone())
        .when(reserve(2, "45", "55", &[(1, "55")], &[1]), at(9, 0))
        .then(vec![reserved(2, "45")]);
    // A reservation given back no longer counts.
    given::<Tenant>([
        limits_set("100"),
        reserved(1, "60"),
        TenantEvent::BudgetReleased { workflow_id: id(1) },
    ])
    .when(reserve(2, "90", "0", &[], &[]), at(9, 0))
    .then(vec![reserved(2, "90")]);
    // Without a budget nothing is reserved; another currency cannot be compared.
    given::<Tenant>([])
        .when(reserve(2, "1000", "0", &[], &[]), at(9, 0))
        .then(vec![]);
    let eur = TenantCommand::ReserveBudget {
        tenant: "physics".into(),
        workflow_id: id(3),
        month: "2025-03".into(),
        estimate: meridian_events::Money::new(dec("1"), Currency::EUR),
        spent: usd("0"),
        billed: Default::default(),
        concluded: Default::default(),
        gpu_hours: Default::default(),
        gpu_hours_used: Default::default(),
        gpu_hours_by_workflow: Default::default(),
    };
    given::<Tenant>(history)
        .when(eur, at(9, 0))
        .then_err(|e| matches!(e, TenantError::CurrencyMismatch { .. }));
}

#[test]
fn gpu_hours_are_held_to_their_own_monthly_budget() {
    let limits = TenantEvent::LimitsSet {
        tenant: "physics".into(),
        limits: meridian_events::vocabulary::tenant::TenantLimits {
            gpu_hours_per_month: Some(dec("10")),
            ..Default::default()
        },
        set_by: "admin".into(),
    };
    let reserve_gpu = |n: u128, hours: &str, used: &str, by: &[(u128, &str)], done: &[u128]| {
        TenantCommand::ReserveBudget {
            tenant: "physics".into(),
            workflow_id: id(n),
            month: "2025-03".into(),
            estimate: usd("0"),
            spent: usd("0"),
            billed: Default::default(),
            concluded: done.iter().map(|n| id(*n)).collect(),
            gpu_hours: dec(hours),
            gpu_hours_used: dec(used),
            gpu_hours_by_workflow: by.iter().map(|(n, h)| (id(*n), dec(h))).collect(),
        }
    };
    let first = TenantEvent::BudgetReserved {
        workflow_id: id(1),
        month: "2025-03".into(),
        estimate: usd("0"),
        gpu_hours: dec("6"),
    };
    given::<Tenant>([limits.clone()])
        .when(reserve_gpu(1, "6", "0", &[], &[]), at(9, 0))
        .then(vec![first.clone()]);
    let err = given::<Tenant>([limits.clone(), first.clone()])
        .when(reserve_gpu(2, "6", "0", &[], &[]), at(9, 0))
        .then_err(|e| matches!(e, TenantError::OverGpuHours { .. }));
    assert_eq!(
        err.to_string(),
        "over the GPU-hour budget: the tenant may hold 10 GPU-hours in 2025-03; 0 were used \
         and 6 are in flight, so this workflow's 6 would bring it to 12"
    );
    // The first ended having used 2: 2 used, nothing in flight, 6 more fit.
    given::<Tenant>([limits, first])
        .when(reserve_gpu(2, "6", "2", &[(1, "2")], &[1]), at(9, 0))
        .then_ok();
}
