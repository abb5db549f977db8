//! Who is asking: a tenant, a user within it, and a role. Authentication (which issue
//! decides how a caller proves it) fills these in; until then every transport builds
//! the principal from what the caller says of itself.

/// What a caller is to Meridian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Researcher,
    Finance,
    Admin,
    Agent,
    /// A running job, acting for its own workflow.
    Job,
}

/// The caller of a command or query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant it acts in: its workflows, its policy.
    pub tenant: String,
    /// Who it is, as recorded in the log (`submitted_by`, `drained by`).
    pub user: String,
    pub role: Role,
}

impl Principal {
    /// A caller that may do everything, as every caller may until authentication.
    pub fn trusted(tenant: impl Into<String>, user: impl Into<String>) -> Principal {
        Principal {
            tenant: tenant.into(),
            user: user.into(),
            role: Role::Admin,
        }
    }
}

/// Everything a caller can ask of Meridian, for [`crate::App::authorize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    SubmitWorkflow,
    ReadWorkflow,
    CancelWorkflow,
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
    ReadHealth,
}
