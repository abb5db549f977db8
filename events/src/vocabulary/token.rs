//! Events of the Token aggregate: API tokens, issued and revoked. The log holds each
//! token's id and the SHA-256 of its secret part, never the token: a token is 256 random
//! bits, so its hash cannot be turned back into it, and whoever reads the log cannot act
//! with what it finds there.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum TokenEvent {
    #[serde(rename = "token.issued.v1")]
    Issued {
        token_id: Uuid,
        /// The tenant it acts in; `None` for an admin, or for finance over every tenant.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
        role: Role,
        /// Write actions added to what the role may do (an agent's submit, cancel).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        grants: Vec<Grant>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<DateTime<Utc>>,
        /// Hex SHA-256 of the token's secret part.
        secret_sha256: String,
        /// What it is for, in the issuer's words ("ci", "alice's laptop").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        label: Option<String>,
        issued_by: String,
    },

    /// From now on the token is refused.
    #[serde(rename = "token.revoked.v1")]
    Revoked {
        token_id: Uuid,
        revoked_by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl TokenEvent {
    pub fn kind(&self) -> &'static str {
        match self {
            TokenEvent::Issued { .. } => "token.issued.v1",
            TokenEvent::Revoked { .. } => "token.revoked.v1",
        }
    }
}

/// What a caller is to Meridian; each role's rights are in `docs/security.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Submits, follows and cancels its tenant's workflows; quotes; reads its bills.
    Researcher,
    /// Reads bills, exports and prices: of its tenant, or of every tenant.
    Finance,
    /// Sites, catalogues, tenant policies and prices, budgets, tokens, audit: everything.
    Admin,
    /// Reads like a researcher; writes only what its grants name.
    Agent,
    /// A running job, acting for its own workflow (a workflow credential, never issued
    /// as a token).
    Job,
}

impl Role {
    pub const ISSUABLE: [Role; 4] = [Role::Researcher, Role::Finance, Role::Admin, Role::Agent];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Researcher => "researcher",
            Role::Finance => "finance",
            Role::Admin => "admin",
            Role::Agent => "agent",
            Role::Job => "job",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        Role::ISSUABLE
            .into_iter()
            .chain([Role::Job])
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!("unknown role {s:?}: expected researcher, finance, admin or agent")
            })
    }
}

/// A write action a token is granted beyond its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Grant {
    /// Submit workflows.
    Submit,
    /// Cancel workflows.
    Cancel,
}

impl Grant {
    pub fn as_str(self) -> &'static str {
        match self {
            Grant::Submit => "submit",
            Grant::Cancel => "cancel",
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Grant {
    type Err = String;
    fn from_str(s: &str) -> Result<Grant, String> {
        match s {
            "submit" => Ok(Grant::Submit),
            "cancel" => Ok(Grant::Cancel),
            other => Err(format!(
                "unknown grant {other:?}: expected submit or cancel"
            )),
        }
    }
}
