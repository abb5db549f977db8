//! A tenant's placement policy (where its work may run, whatever its workflows ask; the
//! router applies it to every placement after it is set) and its price adjustments
//! (discounts and committed rates, which the ledger applies from their start). Each
//! change is a command on the Tenant aggregate.

use chrono::{DateTime, Utc};
use meridian_eventlog::aggregates::{execute, load, ExecuteError};
use meridian_events::aggregate::tenant::valid_tenant_name;
use meridian_events::aggregate::tenant::Adjustment;
use meridian_events::aggregate::{tenant_id, Tenant, TenantCommand, TenantError};
use meridian_events::vocabulary::tenant::{
    AdjustmentScope, AdjustmentTerms, ChargeKind, Meter, PlacementPolicy,
};
use meridian_events::SiteKind;
use meridian_events::{Envelope, Event, EventContext};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::formats;
use crate::{Action, App, AppError, Principal};

// Request bodies are read field by field (`parse_policy`) so that an error names its
// field; the serde attributes here give the OpenAPI document the same shape and defaults.
/// A tenant's placement policy. Every field is optional; what is left out does not limit.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    /// Sites the tenant may use; empty or absent: any.
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::place_names)]
    pub sites: Vec<String>,
    /// Regions the tenant may use; empty or absent: any.
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::place_names)]
    pub regions: Vec<String>,
    /// The jurisdiction its data must stay in, such as `eu`.
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::optional_place_name)]
    pub residency: Option<String>,
    /// The most one workflow's estimate may be, such as `"500 USD"`.
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::optional_positive_money)]
    pub budget_per_workflow: Option<String>,
    /// Whether workflows that ask for spot capacity may have it; default true.
    #[serde(default = "yes")]
    pub spot_allowed: bool,
    /// Whether workflows that ask to be split across sites may be; default true.
    #[serde(default = "yes")]
    pub split_allowed: bool,
}

fn yes() -> bool {
    true
}

/// The policy in force for a tenant.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantPolicy {
    pub tenant: String,
    /// False when no policy was ever set: the tenant may go anywhere its hints allow.
    pub set: bool,
    pub policy: PolicyDocument,
}

impl From<&PlacementPolicy> for PolicyDocument {
    fn from(p: &PlacementPolicy) -> Self {
        PolicyDocument {
            sites: p.sites.clone(),
            regions: p.regions.clone(),
            residency: p.residency.clone(),
            budget_per_workflow: p
                .budget_per_workflow
                .as_ref()
                .map(|m| format!("{} {}", m.amount, m.currency)),
            spot_allowed: p.spot_allowed,
            split_allowed: p.split_allowed,
        }
    }
}

const FIELDS: [&str; 6] = [
    "sites",
    "regions",
    "residency",
    "budget_per_workflow",
    "spot_allowed",
    "split_allowed",
];

/// The policy a request body describes, or a 400 that names the field at fault.
pub fn parse_policy(bytes: &[u8]) -> Result<PlacementPolicy, AppError> {
    let bad =
        |field: &str, expected: &str| AppError::BadRequest(format!("{field}: expected {expected}"));
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| AppError::BadRequest(format!("the body is not JSON: {e}")))?;
    let serde_json::Value::Object(fields) = value else {
        return Err(AppError::BadRequest(format!(
            "expected a JSON object with the fields {}",
            FIELDS.join(", ")
        )));
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(AppError::BadRequest(format!(
            "{unknown}: unknown field; expected one of {}",
            FIELDS.join(", ")
        )));
    }
    let list = |field: &str| -> Result<Vec<String>, AppError> {
        match fields.get(field) {
            None => Ok(Vec::new()),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|i| match i.as_str() {
                    Some(name) => formats::place_name(field, name),
                    None => Err(bad(field, "a list of names")),
                })
                .collect(),
            Some(_) => Err(bad(field, "a list of names")),
        }
    };
    let text = |field: &str, expected: &str| -> Result<Option<String>, AppError> {
        match fields.get(field) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(t)) => Ok(Some(t.clone())),
            Some(_) => Err(bad(field, expected)),
        }
    };
    let flag = |field: &str| -> Result<bool, AppError> {
        match fields.get(field) {
            None => Ok(true),
            Some(serde_json::Value::Bool(b)) => Ok(*b),
            Some(_) => Err(bad(field, "true or false")),
        }
    };
    Ok(PlacementPolicy {
        sites: list("sites")?,
        regions: list("regions")?,
        residency: text("residency", "a jurisdiction such as \"eu\"")?
            .map(|r| formats::place_name("residency", &r))
            .transpose()?,
        budget_per_workflow: text("budget_per_workflow", "an amount such as \"500 USD\"")?
            .map(|b| formats::positive_money("budget_per_workflow", &b))
            .transpose()?,
        spot_allowed: flag("spot_allowed")?,
        split_allowed: flag("split_allowed")?,
    })
}

// ---------------------------------------------------------------------------------
// Price adjustments: discounts and committed rates, granted and revoked through the API
// like the CLI's `meridian admin discount|committed-rate|revoke-adjustment`.

/// A discount or committed rate to grant a tenant. `terms` is
/// `{"kind": "percent_discount", "percent": "10"}` or
/// `{"kind": "committed_rate", "meter": "gpu_hours", "unit_price": "1.80", "currency": "USD"}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    /// Which charges it covers: `site`, `site_kind` and `charge` (compute, storage,
    /// egress) each narrow it; none covers all.
    #[serde(default)]
    pub scope: ScopeDocument,
    pub terms: TermsDocument,
    /// From when (RFC 3339, UTC); default now, never in the past.
    #[serde(default)]
    pub effective_from: Option<DateTime<Utc>>,
    /// Until when (exclusive); default never.
    #[serde(default)]
    pub effective_until: Option<DateTime<Utc>>,
    /// A contract or ticket reference kept with it.
    #[serde(default)]
    pub reference: Option<String>,
}

/// Which charges an adjustment covers, as the API takes it: each field narrows it.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScopeDocument {
    /// Only this site's charges.
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::optional_place_name)]
    pub site: Option<String>,
    /// Only charges at sites of this kind (not with `site`).
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::optional_site_kind)]
    pub site_kind: Option<SiteKind>,
    /// Only compute, storage or egress charges.
    #[serde(default)]
    #[schema(schema_with = crate::formats::schema::optional_charge)]
    pub charge: Option<ChargeKind>,
}

/// How an adjustment prices what it covers, as the API takes it.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TermsDocument {
    /// The list price less `percent` percent (above 0, at most 100), such as `"10"`.
    PercentDiscount {
        #[schema(schema_with = crate::formats::schema::decimal)]
        percent: String,
    },
    /// A negotiated unit price for one meter, in one currency.
    CommittedRate {
        #[schema(schema_with = crate::formats::schema::meter)]
        meter: Meter,
        #[schema(schema_with = crate::formats::schema::decimal)]
        unit_price: String,
        #[schema(schema_with = crate::formats::schema::currency)]
        currency: String,
    },
}

impl ScopeDocument {
    fn scope(&self) -> Result<AdjustmentScope, AppError> {
        Ok(AdjustmentScope {
            site: self
                .site
                .as_deref()
                .map(|s| formats::place_name("scope.site", s))
                .transpose()?,
            site_kind: self.site_kind,
            charge: self.charge,
        })
    }
}

impl TermsDocument {
    fn terms(&self) -> Result<AdjustmentTerms, AppError> {
        Ok(match self {
            TermsDocument::PercentDiscount { percent } => AdjustmentTerms::PercentDiscount {
                percent: formats::decimal("terms.percent", percent)?,
            },
            TermsDocument::CommittedRate {
                meter,
                unit_price,
                currency,
            } => AdjustmentTerms::CommittedRate {
                meter: *meter,
                unit_price: formats::decimal("terms.unit_price", unit_price)?,
                currency: formats::currency("terms.currency", currency)?,
            },
        })
    }
}

/// Ends an adjustment.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    /// When it stops applying (RFC 3339, UTC); default now, never in the past.
    #[serde(default)]
    pub at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// One adjustment as it stands.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdjustmentView {
    pub id: Uuid,
    pub tenant: String,
    #[schema(value_type = Object)]
    pub scope: AdjustmentScope,
    #[schema(value_type = Object)]
    pub terms: AdjustmentTerms,
    /// The terms and scope in words, e.g. `10% off list for site hpc-eu`.
    pub description: String,
    pub effective_from: DateTime<Utc>,
    pub effective_until: Option<DateTime<Utc>>,
    pub granted_by: String,
    pub reference: Option<String>,
}

/// A tenant's adjustments, in grant order.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AdjustmentList {
    pub tenant: String,
    pub adjustments: Vec<AdjustmentView>,
}

fn view(tenant: &str, a: &Adjustment) -> AdjustmentView {
    AdjustmentView {
        id: a.id,
        tenant: tenant.to_string(),
        scope: a.scope.clone(),
        terms: a.terms.clone(),
        description: format!("{} for {}", a.terms, a.scope),
        effective_from: a.effective_from,
        effective_until: a.effective_until,
        granted_by: a.granted_by.clone(),
        reference: a.reference.clone(),
    }
}

/// What refusing an adjustment command answers: the caller's mistake is a bad request,
/// a missing adjustment not found, one already ended a conflict.
fn adjustment_refused(e: ExecuteError<TenantError>) -> AppError {
    match AppError::from_execute("recording the adjustment", e) {
        Err(app) => app,
        Ok(TenantError::UnknownAdjustment(id)) => AppError::NotFound(format!("no adjustment {id}")),
        Ok(e @ TenantError::NoAdjustments) => AppError::NotFound(e.to_string()),
        Ok(e @ TenantError::AlreadyEnded { .. }) => AppError::Conflict(e.to_string()),
        Ok(e) => AppError::BadRequest(e.to_string()),
    }
}

/// `tenant` as a path names it, or why it names no tenant.
pub fn check_tenant_path(tenant: &str) -> Result<(), AppError> {
    check_tenant_named(tenant, " in the path")
}

/// Why `tenant` is no tenant's name, if it is not; `place` says where it was given.
pub(crate) fn check_tenant_named(tenant: &str, place: &str) -> Result<(), AppError> {
    if valid_tenant_name(tenant) {
        Ok(())
    } else {
        Err(AppError::BadRequest(format!(
            "invalid tenant {tenant:?}{place}: expected 1 to 63 of a-z, 0-9, '-' and '_'"
        )))
    }
}

impl App {
    /// `tenant` as the log has it, read at most once per [`HOLD`](crate::held::HOLD)
    /// (every submission asks whether its tenant has a budget).
    pub(crate) async fn tenant_state(&self, tenant: &str) -> Result<Tenant, AppError> {
        let read = async {
            load::<Tenant>(&*self.log, tenant_id(tenant))
                .await
                .map(|loaded| loaded.state)
                .map_err(|e| AppError::from_log("reading the tenant", e))
        };
        self.tenants.get_or_read(tenant.to_string(), read).await
    }

    /// A command on `tenant`; what was held of it is forgotten (even when the request
    /// is cancelled once the command is appended), so this process's next read sees
    /// the change.
    pub(crate) async fn execute_tenant<F>(
        &self,
        tenant: &str,
        ctx: &EventContext,
        make: F,
    ) -> Result<Vec<Envelope<Event>>, ExecuteError<TenantError>>
    where
        F: FnMut(&Tenant) -> TenantCommand,
    {
        let _forget = self.tenants.forget_after(&tenant.to_string());
        execute::<Tenant, _>(&*self.log, tenant_id(tenant), ctx, make).await
    }

    /// The placement policy in force for `tenant`.
    pub async fn policy(&self, who: &Principal, tenant: &str) -> Result<TenantPolicy, AppError> {
        self.authorize(who, Action::ReadPolicy).await?;
        check_tenant_path(tenant)?;
        self.visible_tenant(who, Action::ReadPolicy, tenant, || no_tenant(tenant))
            .await?;
        let policy = self.tenant_state(tenant).await?.policy().cloned();
        Ok(TenantPolicy {
            tenant: tenant.to_string(),
            set: policy.is_some(),
            policy: PolicyDocument::from(&policy.unwrap_or_else(PlacementPolicy::open)),
        })
    }

    /// Replaces `tenant`'s placement policy. The stricter of it and a workflow's own
    /// `placement` hints applies to every placement from now on; placed work stays put.
    pub async fn set_policy(
        &self,
        who: &Principal,
        tenant: &str,
        policy: PlacementPolicy,
    ) -> Result<TenantPolicy, AppError> {
        self.authorize(who, Action::ChangePolicy).await?;
        let result = async {
            check_tenant_path(tenant)?;
            let ctx = EventContext::new_chain(tenant.to_string());
            match self
                .execute_tenant(tenant, &ctx, |_| TenantCommand::SetPolicy {
                    tenant: tenant.to_string(),
                    policy: policy.clone(),
                    set_by: who.user.clone(),
                })
                .await
            {
                Ok(_) => {}
                Err(ExecuteError::Rejected(e @ TenantError::InvalidPolicy { .. })) => {
                    return Err(AppError::BadRequest(e.to_string()))
                }
                Err(ExecuteError::Rejected(e)) => return Err(AppError::Conflict(e.to_string())),
                Err(ExecuteError::Log(e)) => {
                    return Err(AppError::from_log("recording the policy", e))
                }
                Err(other) => return Err(AppError::internal("recording the policy", other)),
            }
            self.policy(who, tenant).await
        }
        .await;
        self.audited(
            who,
            Action::ChangePolicy,
            &format!("tenant/{tenant}/policy"),
            result,
        )
        .await
    }

    /// `tenant`'s discounts and committed rates, in grant order.
    pub async fn adjustments(
        &self,
        who: &Principal,
        tenant: &str,
    ) -> Result<AdjustmentList, AppError> {
        self.authorize(who, Action::ReadAdjustments).await?;
        check_tenant_path(tenant)?;
        self.visible_tenant(who, Action::ReadAdjustments, tenant, || no_tenant(tenant))
            .await?;
        let state = self.tenant_state(tenant).await?;
        Ok(AdjustmentList {
            adjustments: state.adjustments().map(|a| view(tenant, a)).collect(),
            tenant: tenant.to_string(),
        })
    }

    /// Grants `tenant` a discount or a committed rate, from now or a later time: what
    /// was billed is never re-priced.
    pub async fn grant_adjustment(
        &self,
        who: &Principal,
        tenant: &str,
        request: GrantRequest,
    ) -> Result<AdjustmentView, AppError> {
        self.authorize(who, Action::ChangeAdjustments).await?;
        let result = async {
            check_tenant_path(tenant)?;
            let scope = request.scope.scope()?;
            let terms = request.terms.terms()?;
            let adjustment_id = Uuid::now_v7();
            let ctx = EventContext::new_chain(tenant.to_string());
            self.execute_tenant(tenant, &ctx, |_| TenantCommand::GrantAdjustment {
                tenant: tenant.to_string(),
                adjustment_id,
                scope: scope.clone(),
                terms: terms.clone(),
                effective_from: request.effective_from,
                effective_until: request.effective_until,
                granted_by: who.user.clone(),
                reference: request.reference.clone(),
            })
            .await
            .map_err(adjustment_refused)?;
            let state = self.tenant_state(tenant).await?;
            let granted = state
                .adjustment(adjustment_id)
                .ok_or_else(|| AppError::internal("reading the adjustment back", adjustment_id))?;
            Ok(view(tenant, granted))
        }
        .await;
        self.audited(
            who,
            Action::ChangeAdjustments,
            &format!("tenant/{tenant}/adjustments"),
            result,
        )
        .await
    }

    /// Ends an adjustment from now (or a later time); what was billed stays billed.
    pub async fn revoke_adjustment(
        &self,
        who: &Principal,
        tenant: &str,
        id: Uuid,
        request: RevokeRequest,
    ) -> Result<AdjustmentView, AppError> {
        self.authorize(who, Action::ChangeAdjustments).await?;
        let result = async {
            check_tenant_path(tenant)?;
            let ctx = EventContext::new_chain(tenant.to_string());
            self.execute_tenant(tenant, &ctx, |_| TenantCommand::RevokeAdjustment {
                adjustment_id: id,
                effective_at: request.at,
                revoked_by: who.user.clone(),
                reason: request.reason.clone(),
            })
            .await
            .map_err(adjustment_refused)?;
            let state = self.tenant_state(tenant).await?;
            let revoked = state
                .adjustment(id)
                .ok_or_else(|| AppError::internal("reading the adjustment back", id))?;
            Ok(view(tenant, revoked))
        }
        .await;
        self.audited(
            who,
            Action::ChangeAdjustments,
            &format!("tenant/{tenant}/adjustments/{id}"),
            result,
        )
        .await
    }
}

/// What a caller that may not see `tenant` is told: what it would be told of a tenant
/// that does not exist, were there such a thing.
pub(crate) fn no_tenant(tenant: &str) -> AppError {
    AppError::NotFound(format!("no tenant {tenant}"))
}
