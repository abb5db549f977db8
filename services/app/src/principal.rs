//! Who is asking, and what they may ask. A transport learns the caller from its
//! credentials ([`crate::App::authenticate`]); the application decides what the caller
//! may do ([`crate::App::authorize`] and the tenant checks), in one place, whatever the
//! transport.

use uuid::Uuid;

pub use meridian_events::vocabulary::token::{Grant, Role};

/// The caller of a command or query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant it acts in: where its submissions go, whose policy applies.
    pub tenant: String,
    /// Whether it may see every tenant (an admin; finance with no tenant), or only
    /// [`Principal::tenant`].
    pub every_tenant: bool,
    /// Who it is, as recorded in the log (`submitted_by`, `drained by`).
    pub user: String,
    pub role: Role,
    /// Write actions its token adds to its role (an agent's).
    pub grants: Vec<Grant>,
    /// The token it presented; `None` for a workflow credential or Meridian itself.
    pub token_id: Option<Uuid>,
    /// For a workflow credential: the workflow whose job is asking.
    pub workflow: Option<Uuid>,
    /// Where the request came from (the peer's address), for the audit trail.
    pub source: Option<String>,
}

impl Principal {
    /// Meridian itself (or a test) acting as an admin: may do everything.
    pub fn trusted(tenant: impl Into<String>, user: impl Into<String>) -> Principal {
        Principal {
            tenant: tenant.into(),
            every_tenant: true,
            user: user.into(),
            role: Role::Admin,
            grants: Vec::new(),
            token_id: None,
            workflow: None,
            source: None,
        }
    }

    /// Whether it may see what belongs to `tenant`.
    pub fn sees_tenant(&self, tenant: &str) -> bool {
        self.every_tenant || self.tenant == tenant
    }

    /// The one table of who may do what: whether its role (and grants) allow `action`.
    /// Which tenant's things it may touch is checked apart, by [`Principal::sees_tenant`].
    pub fn may(&self, action: Action) -> bool {
        use Action::*;
        match self.role {
            Role::Admin => true,
            Role::Researcher => {
                matches!(action, SubmitWorkflow | CancelWorkflow | RetryEgress)
                    || tenant_reader(action)
            }
            Role::Finance => matches!(
                action,
                ReadBill
                    | ReadTenantBill
                    | ExportCharges
                    | ReadSites
                    | ReadAdjustments
                    | ReadBudget
                    | ReadHealth
            ),
            Role::Agent => match action {
                SubmitWorkflow => self.grants.contains(&Grant::Submit),
                CancelWorkflow => self.grants.contains(&Grant::Cancel),
                other => tenant_reader(other),
            },
            Role::Job => matches!(
                action,
                SubmitWorkflow | ReadWorkflow | CancelWorkflow | ReadHealth
            ),
        }
    }
}

/// What a researcher and an agent may read of their tenant.
fn tenant_reader(action: Action) -> bool {
    use Action::*;
    matches!(
        action,
        ReadWorkflow
            | ListWorkflows
            | ReadBill
            | ReadTenantBill
            | Quote
            | ReadSites
            | ReadPolicy
            | ReadBudget
            | ReadHealth
    )
}

/// Everything a caller can ask of Meridian, for [`crate::App::authorize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    SubmitWorkflow,
    ReadWorkflow,
    /// All workflows of a tenant, as a list.
    ListWorkflows,
    CancelWorkflow,
    /// Copy out again a workflow's outputs kept after their copy out failed.
    RetryEgress,
    /// Give back outputs kept after their copy out failed (their storage stops).
    ReleaseOutputs,
    ReadBill,
    ReadTenantBill,
    ExportCharges,
    Quote,
    ReadSites,
    ChangeSites,
    ReadPolicy,
    ChangePolicy,
    ReadAdjustments,
    ChangeAdjustments,
    ManageTokens,
    ReadAudit,
    ReadBudget,
    ChangeBudget,
    ReadHealth,
}

impl Action {
    /// Its name in the audit trail.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::SubmitWorkflow => "submit_workflow",
            Action::ReadWorkflow => "read_workflow",
            Action::ListWorkflows => "list_workflows",
            Action::CancelWorkflow => "cancel_workflow",
            Action::RetryEgress => "retry_egress",
            Action::ReleaseOutputs => "release_outputs",
            Action::ReadBill => "read_bill",
            Action::ReadTenantBill => "read_tenant_bill",
            Action::ExportCharges => "export_charges",
            Action::Quote => "quote",
            Action::ReadSites => "read_sites",
            Action::ChangeSites => "change_sites",
            Action::ReadPolicy => "read_policy",
            Action::ChangePolicy => "change_policy",
            Action::ReadAdjustments => "read_adjustments",
            Action::ChangeAdjustments => "change_adjustments",
            Action::ManageTokens => "manage_tokens",
            Action::ReadAudit => "read_audit",
            Action::ReadBudget => "read_budget",
            Action::ChangeBudget => "change_budget",
            Action::ReadHealth => "read_health",
        }
    }

    /// Whether it changes anything: every write is audited, whatever its outcome.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Action::SubmitWorkflow
                | Action::CancelWorkflow
                | Action::RetryEgress
                | Action::ReleaseOutputs
                | Action::ChangeSites
                | Action::ChangePolicy
                | Action::ChangeAdjustments
                | Action::ManageTokens
                | Action::ChangeBudget
        )
    }
}
