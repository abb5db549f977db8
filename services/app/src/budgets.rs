//! Budgets: what a tenant may spend in a calendar month (UTC). A submission is refused,
//! with the numbers, when its estimate and what is billed and in flight would together
//! pass the budget; the Tenant aggregate decides, so two racing submissions cannot
//! together overrun it.
//!
//! The estimate is the placement's at the cheapest site that fits, connected or not
//! (work held for a site still runs there). In flight: each running reserved workflow's
//! estimate less what it has been billed so far.

use std::collections::{BTreeMap, BTreeSet};

use chrono::Utc;
use meridian_eventlog::aggregates::ExecuteError;
use meridian_events::aggregate::{TenantCommand, TenantError};
use meridian_events::vocabulary::tenant::TenantLimits;
use meridian_events::{EventContext, Money};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use uuid::Uuid;

use meridian_accounting::Period;
use meridian_domain::placement::{decide_as_if_connected, Decision};

use crate::tenants::{check_tenant_path, no_tenant};
use crate::{Action, App, AppError, Principal};

/// The limits to set for a tenant. Every field is optional; what is left out does not
/// limit.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetDocument {
    /// The most its workflows may cost in one calendar month (UTC), such as `"1000 USD"`.
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::optional_positive_money)]
    pub money_per_month: Option<String>,
    /// The most of its workflows placed and not yet ended at once; more wait, in
    /// submission order, with the reason in their status.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub concurrent_workflows: Option<u32>,
    /// The most GPUs its running jobs and services may hold at once; a task that would
    /// pass it waits, with the reason in its workflow's status.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub concurrent_gpus: Option<u32>,
    /// The most GPU-hours its workflows may hold in one calendar month (UTC), used and in
    /// flight together, such as `"500"`. A workflow counts each task's GPUs over its
    /// walltime until it ends, then what its runs held.
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::optional_hours)]
    pub gpu_hours_per_month: Option<String>,
}

/// A tenant's budget this month, and where it stands.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BudgetView {
    pub tenant: String,
    /// `YYYY-MM` (UTC).
    pub month: String,
    /// `None`: no budget; nothing is held to one.
    pub money_per_month: Option<String>,
    /// Billed this month so far, in the budget's currency.
    pub spent: Option<String>,
    /// The estimates of reserved workflows still running, less what they were billed.
    pub in_flight: Option<String>,
    /// What is left for new submissions.
    pub left: Option<String>,
    /// The most of its workflows placed at once; `None`: no limit.
    pub concurrent_workflows: Option<u32>,
    /// The most GPUs its running work may hold at once; `None`: no limit.
    pub concurrent_gpus: Option<u32>,
    /// The month's GPU-hour budget, and what was used, is in flight and is left.
    pub gpu_hours_per_month: Option<String>,
    pub gpu_hours_used: Option<String>,
    pub gpu_hours_in_flight: Option<String>,
    pub gpu_hours_left: Option<String>,
}

/// The limits a request body describes, or a 400 that names the field at fault.
pub fn parse_budget(bytes: &[u8]) -> Result<TenantLimits, AppError> {
    let doc: BudgetDocument = crate::formats::json_body(bytes, "budget")?;
    let money_per_month = doc
        .money_per_month
        .map(|m| crate::formats::positive_money("money_per_month", &m))
        .transpose()?;
    let gpu_hours_per_month = doc
        .gpu_hours_per_month
        .map(|h| crate::formats::hours("gpu_hours_per_month", &h))
        .transpose()?;
    // What the document states (`int32`): larger counts mean nothing here anyway.
    for (field, n) in [
        ("concurrent_workflows", doc.concurrent_workflows),
        ("concurrent_gpus", doc.concurrent_gpus),
    ] {
        if n.is_some_and(|n| n > i32::MAX as u32) {
            return Err(AppError::BadRequest(format!(
                "{field}: expected at most {}",
                i32::MAX
            )));
        }
    }
    Ok(TenantLimits {
        gpu_hours_per_month,
        money_per_month,
        concurrent_workflows: doc.concurrent_workflows,
        concurrent_gpus: doc.concurrent_gpus,
    })
}

/// What the ledger and the status read model say of a tenant's month.
struct Standing {
    spent: Money,
    billed: BTreeMap<Uuid, Decimal>,
    concluded: BTreeSet<Uuid>,
    gpu_hours_used: Decimal,
    gpu_hours_by_workflow: BTreeMap<Uuid, Decimal>,
}

/// The most GPU-hours `spec` can hold: each task's GPUs over its walltime (a service's
/// walltime bounds it too).
pub fn gpu_hours_of(spec: &meridian_spec::Workflow) -> Decimal {
    let hours = |r: &meridian_spec::Resources, tasks: u32| {
        Decimal::from(r.gpus_total()) * Decimal::from(r.walltime.secs()) / Decimal::from(3600)
            * Decimal::from(tasks)
    };
    let jobs: Decimal = spec
        .jobs
        .values()
        .map(|j| hours(&j.resources, j.array.map_or(1, |a| a.len())))
        .sum();
    let services: Decimal = spec
        .services
        .values()
        .map(|s| hours(&s.resources, s.replicas.max.max(1)))
        .sum();
    jobs + services
}

impl App {
    /// `tenant`'s budget and where this month stands.
    pub async fn budget(&self, who: &Principal, tenant: &str) -> Result<BudgetView, AppError> {
        self.authorize(who, Action::ReadBudget).await?;
        check_tenant_path(tenant)?;
        self.visible_tenant(who, Action::ReadBudget, tenant, || no_tenant(tenant))
            .await?;
        let state = self.tenant_state(tenant).await?;
        let period = Period::of(Utc::now());
        let month = period.to_string();
        let limits = state.limits().clone();
        let currency = limits
            .money_per_month
            .as_ref()
            .map_or(meridian_events::Currency::USD, |m| m.currency);
        let standing = self.standing(tenant, period, currency).await?;
        let mut view = BudgetView {
            tenant: tenant.into(),
            month: month.clone(),
            money_per_month: None,
            spent: None,
            in_flight: None,
            left: None,
            concurrent_workflows: limits.concurrent_workflows,
            concurrent_gpus: limits.concurrent_gpus,
            gpu_hours_per_month: None,
            gpu_hours_used: None,
            gpu_hours_in_flight: None,
            gpu_hours_left: None,
        };
        if let Some(budget) = &limits.money_per_month {
            let in_flight = state.in_flight(&month, &standing.billed, &standing.concluded);
            let left = (budget.amount - standing.spent.amount - in_flight).max(Decimal::ZERO);
            let money = |amount| Money::new(amount, budget.currency).to_string();
            view.money_per_month = Some(budget.to_string());
            view.spent = Some(standing.spent.to_string());
            view.in_flight = Some(money(in_flight));
            view.left = Some(money(left));
        }
        if let Some(budget) = limits.gpu_hours_per_month {
            let in_flight = state.gpu_hours_in_flight(
                &month,
                &standing.gpu_hours_by_workflow,
                &standing.concluded,
            );
            let left = (budget - standing.gpu_hours_used - in_flight).max(Decimal::ZERO);
            view.gpu_hours_per_month = Some(budget.to_string());
            view.gpu_hours_used = Some(standing.gpu_hours_used.to_string());
            view.gpu_hours_in_flight = Some(in_flight.to_string());
            view.gpu_hours_left = Some(left.to_string());
        }
        Ok(view)
    }

    /// Replaces `tenant`'s limits.
    pub async fn set_budget(
        &self,
        who: &Principal,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<BudgetView, AppError> {
        self.authorize(who, Action::ChangeBudget).await?;
        check_tenant_path(tenant)?;
        let result = async {
            let ctx = EventContext::new_chain(tenant.to_string());
            self.execute_tenant(tenant, &ctx, |_| TenantCommand::SetLimits {
                tenant: tenant.to_string(),
                limits: limits.clone(),
                set_by: who.user.clone(),
            })
            .await
            .map_err(|e| budget_error("recording the budget", e))?;
            self.budget(who, tenant).await
        }
        .await;
        self.audited(
            who,
            Action::ChangeBudget,
            &format!("tenant/{tenant}/budget"),
            result,
        )
        .await
    }

    /// Counts `spec`'s estimate against `tenant`'s budget for workflow `id`, or refuses
    /// it (402) with the numbers. Nothing is reserved when the tenant has no budget.
    pub(crate) async fn reserve_budget(
        &self,
        tenant: &str,
        id: Uuid,
        spec: &meridian_spec::Workflow,
    ) -> Result<(), AppError> {
        let state = self.tenant_state(tenant).await?;
        let limits = state.limits();
        if limits.money_per_month.is_none() && limits.gpu_hours_per_month.is_none() {
            return Ok(());
        }
        let currency = limits
            .money_per_month
            .as_ref()
            .map_or(meridian_events::Currency::USD, |m| m.currency);
        let estimate = {
            let catalog = self.catalog().await?;
            match decide_as_if_connected(spec, Some(tenant), &catalog, Utc::now()) {
                Decision::Placed(p) => p.estimated_cost,
                // Nowhere to run it: placement will reject it, and it costs nothing.
                _ => Money::new(Decimal::ZERO, currency),
            }
        };
        let gpu_hours = gpu_hours_of(spec);
        let period = Period::of(Utc::now());
        let standing = self.standing(tenant, period, currency).await?;
        let ctx = EventContext::new_chain(tenant.to_string());
        self.execute_tenant(tenant, &ctx, |_| TenantCommand::ReserveBudget {
            tenant: tenant.to_string(),
            workflow_id: id,
            month: period.to_string(),
            estimate: estimate.clone(),
            spent: standing.spent.clone(),
            billed: standing.billed.clone(),
            concluded: standing.concluded.clone(),
            gpu_hours,
            gpu_hours_used: standing.gpu_hours_used,
            gpu_hours_by_workflow: standing.gpu_hours_by_workflow.clone(),
        })
        .await
        .map_err(|e| budget_error("reserving the budget", e))?;
        Ok(())
    }

    /// Gives back the reservation of a submission that was never appended.
    pub(crate) async fn release_budget(&self, tenant: &str, id: Uuid) -> Result<(), AppError> {
        let ctx = EventContext::new_chain(tenant.to_string());
        self.execute_tenant(tenant, &ctx, |_| TenantCommand::ReleaseBudget {
            workflow_id: id,
        })
        .await
        .map_err(|e| budget_error("releasing the budget", e))?;
        Ok(())
    }

    async fn standing(
        &self,
        tenant: &str,
        period: Period,
        currency: meridian_events::Currency,
    ) -> Result<Standing, AppError> {
        let bill = meridian_accounting::tenant_bill(&self.store, tenant, period)
            .await
            .map_err(|e| AppError::from_store("reading the ledger", e))?;
        let currency_code = currency.to_string();
        let amount = |text: &str| {
            text.parse::<Decimal>()
                .map_err(|e| AppError::internal("reading the ledger", e))
        };
        let mut spent = Decimal::ZERO;
        for total in bill.totals.iter().filter(|t| t.currency == currency_code) {
            spent += amount(&total.amount)?;
        }
        let mut billed = BTreeMap::new();
        for w in bill
            .workflows
            .iter()
            .filter(|w| w.currency == currency_code)
        {
            if let Ok(id) = w.workflow_id.parse::<Uuid>() {
                *billed.entry(id).or_insert(Decimal::ZERO) += amount(&w.amount)?;
            }
        }
        self.migrate().await?;
        let rows = sqlx::query(
            "SELECT id FROM intake_workflows
             WHERE tenant = $1 AND state IN ('finished', 'failed', 'cancelled', 'rejected')",
        )
        .bind(tenant)
        .fetch_all(self.store.pool())
        .await
        .map_err(|e| AppError::from_db("reading the tenant's workflows", e))?;
        let concluded = rows
            .iter()
            .filter_map(|r| r.try_get::<String, _>("id").ok()?.parse().ok())
            .collect();
        let rows = sqlx::query(
            "SELECT workflow_id, gpu_hours FROM intake_gpu_hours WHERE tenant = $1 AND period = $2",
        )
        .bind(tenant)
        .bind(period.to_string())
        .fetch_all(self.store.pool())
        .await
        .map_err(|e| AppError::from_db("reading the tenant's GPU-hours", e))?;
        let mut gpu_hours_used = Decimal::ZERO;
        let mut gpu_hours_by_workflow = BTreeMap::new();
        for row in rows {
            let workflow: String = row.try_get("workflow_id").unwrap_or_default();
            let hours: String = row.try_get("gpu_hours").unwrap_or_default();
            let hours = amount(&hours)?;
            gpu_hours_used += hours;
            if let Ok(id) = workflow.parse::<Uuid>() {
                *gpu_hours_by_workflow.entry(id).or_insert(Decimal::ZERO) += hours;
            }
        }
        Ok(Standing {
            spent: Money::new(spent, currency),
            billed,
            concluded,
            gpu_hours_used,
            gpu_hours_by_workflow,
        })
    }
}

fn budget_error(context: &str, e: ExecuteError<TenantError>) -> AppError {
    match AppError::from_execute(context, e) {
        Err(app) => app,
        Ok(
            over @ (TenantError::OverBudget { .. }
            | TenantError::OverGpuHours { .. }
            | TenantError::CurrencyMismatch { .. }),
        ) => AppError::OverBudget(over.to_string()),
        Ok(other) => AppError::BadRequest(other.to_string()),
    }
}
