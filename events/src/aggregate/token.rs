//! The Token aggregate: one API token, from issue to revocation. It decides what may be
//! issued (a role that exists, a tenant for the roles that need one, grants only for an
//! agent, an expiry in the future) and whether it still holds at a given moment.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::tenant::valid_tenant_name;
use super::Aggregate;
use crate::envelope::AggregateKind;
use crate::vocabulary::token::{Grant, Role, TokenEvent};

#[derive(Debug, Clone)]
pub enum TokenCommand {
    Issue {
        token_id: Uuid,
        tenant: Option<String>,
        role: Role,
        grants: Vec<Grant>,
        expires_at: Option<DateTime<Utc>>,
        secret_sha256: String,
        label: Option<String>,
        issued_by: String,
    },
    Revoke {
        revoked_by: String,
        reason: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token already issued")]
    AlreadyIssued,
    #[error("no such token")]
    NotIssued,
    #[error("the token is already revoked")]
    AlreadyRevoked,
    #[error(
        "role job: workflow credentials are made by Meridian for each workflow's jobs, not issued"
    )]
    JobRole,
    #[error("role {0} acts in one tenant: give --tenant")]
    TenantRequired(Role),
    #[error("an admin acts in every tenant: leave out --tenant (a tenant's own administration is not a role yet)")]
    AdminIsGlobal,
    #[error("invalid tenant name {0:?}: expected 1 to 63 of a-z, 0-9, '-', '_'")]
    InvalidTenant(String),
    #[error("grants add write actions to an agent token; role {0} has its own rights")]
    GrantsOnlyForAgents(Role),
    #[error("expiry {at} is not in the future (now is {now})")]
    ExpiryInPast {
        at: DateTime<Utc>,
        now: DateTime<Utc>,
    },
    #[error("invalid secret hash: expected 64 lowercase hex digits")]
    InvalidHash,
}

/// A token as its history has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub id: Uuid,
    pub tenant: Option<String>,
    pub role: Role,
    pub grants: Vec<Grant>,
    pub expires_at: Option<DateTime<Utc>>,
    pub secret_sha256: String,
    pub label: Option<String>,
    pub issued_by: String,
    pub revoked: bool,
}

impl IssuedToken {
    /// Whether it may be used at `now`: not revoked, not expired.
    pub fn holds_at(&self, now: DateTime<Utc>) -> bool {
        !self.revoked && self.expires_at.is_none_or(|at| now < at)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Token {
    token: Option<IssuedToken>,
}

impl Token {
    pub fn issued(&self) -> Option<&IssuedToken> {
        self.token.as_ref()
    }
}

impl Aggregate for Token {
    const KIND: AggregateKind = AggregateKind::Token;
    type Command = TokenCommand;
    type Event = TokenEvent;
    type Error = TokenError;

    fn handle(&self, cmd: TokenCommand, now: DateTime<Utc>) -> Result<Vec<TokenEvent>, TokenError> {
        match cmd {
            TokenCommand::Issue {
                token_id,
                tenant,
                role,
                mut grants,
                expires_at,
                secret_sha256,
                label,
                issued_by,
            } => {
                if self.token.is_some() {
                    return Err(TokenError::AlreadyIssued);
                }
                if role == Role::Job {
                    return Err(TokenError::JobRole);
                }
                match &tenant {
                    Some(_) if role == Role::Admin => return Err(TokenError::AdminIsGlobal),
                    Some(t) if !valid_tenant_name(t) => {
                        return Err(TokenError::InvalidTenant(t.clone()))
                    }
                    None if matches!(role, Role::Researcher | Role::Agent) => {
                        return Err(TokenError::TenantRequired(role))
                    }
                    _ => {}
                }
                if !grants.is_empty() && role != Role::Agent {
                    return Err(TokenError::GrantsOnlyForAgents(role));
                }
                if let Some(at) = expires_at {
                    if at <= now {
                        return Err(TokenError::ExpiryInPast { at, now });
                    }
                }
                if secret_sha256.len() != 64
                    || !secret_sha256
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(TokenError::InvalidHash);
                }
                grants.sort();
                grants.dedup();
                Ok(vec![TokenEvent::Issued {
                    token_id,
                    tenant,
                    role,
                    grants,
                    expires_at,
                    secret_sha256,
                    label,
                    issued_by,
                }])
            }
            TokenCommand::Revoke { revoked_by, reason } => {
                let token = self.token.as_ref().ok_or(TokenError::NotIssued)?;
                if token.revoked {
                    return Err(TokenError::AlreadyRevoked);
                }
                Ok(vec![TokenEvent::Revoked {
                    token_id: token.id,
                    revoked_by,
                    reason,
                }])
            }
        }
    }

    fn apply(&mut self, event: &TokenEvent) {
        match event {
            TokenEvent::Issued {
                token_id,
                tenant,
                role,
                grants,
                expires_at,
                secret_sha256,
                label,
                issued_by,
            } => {
                self.token = Some(IssuedToken {
                    id: *token_id,
                    tenant: tenant.clone(),
                    role: *role,
                    grants: grants.clone(),
                    expires_at: *expires_at,
                    secret_sha256: secret_sha256.clone(),
                    label: label.clone(),
                    issued_by: issued_by.clone(),
                    revoked: false,
                });
            }
            TokenEvent::Revoked { .. } => {
                if let Some(t) = &mut self.token {
                    t.revoked = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::aggregate::testing::given;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap()
    }

    fn issue(role: Role, tenant: Option<&str>, grants: Vec<Grant>) -> TokenCommand {
        TokenCommand::Issue {
            token_id: Uuid::from_u128(7),
            tenant: tenant.map(str::to_string),
            role,
            grants,
            expires_at: None,
            secret_sha256: "ab".repeat(32),
            label: None,
            issued_by: "admin".into(),
        }
    }

    fn issued() -> TokenEvent {
        TokenEvent::Issued {
            token_id: Uuid::from_u128(7),
            tenant: Some("lab".into()),
            role: Role::Agent,
            grants: vec![Grant::Submit],
            expires_at: None,
            secret_sha256: "ab".repeat(32),
            label: None,
            issued_by: "admin".into(),
        }
    }

    #[test]
    fn an_agent_token_is_issued_with_its_grants_sorted_and_once() {
        given::<Token>([])
            .when(
                issue(Role::Agent, Some("lab"), vec![Grant::Submit, Grant::Submit]),
                now(),
            )
            .then(vec![issued()]);
        given::<Token>([issued()])
            .when(issue(Role::Agent, Some("lab"), vec![]), now())
            .then_err(|e| *e == TokenError::AlreadyIssued);
    }

    #[test]
    fn what_cannot_be_issued_is_refused() {
        let refused = |cmd, err: TokenError| {
            given::<Token>([]).when(cmd, now()).then_err(|e| *e == err);
        };
        refused(issue(Role::Job, Some("lab"), vec![]), TokenError::JobRole);
        refused(
            issue(Role::Researcher, None, vec![]),
            TokenError::TenantRequired(Role::Researcher),
        );
        refused(
            issue(Role::Admin, Some("lab"), vec![]),
            TokenError::AdminIsGlobal,
        );
        refused(
            issue(Role::Finance, Some("Bad Name"), vec![]),
            TokenError::InvalidTenant("Bad Name".into()),
        );
        refused(
            issue(Role::Researcher, Some("lab"), vec![Grant::Cancel]),
            TokenError::GrantsOnlyForAgents(Role::Researcher),
        );
        let past = TokenCommand::Issue {
            token_id: Uuid::from_u128(7),
            tenant: None,
            role: Role::Admin,
            grants: vec![],
            expires_at: Some(now()),
            secret_sha256: "ab".repeat(32),
            label: None,
            issued_by: "admin".into(),
        };
        refused(
            past,
            TokenError::ExpiryInPast {
                at: now(),
                now: now(),
            },
        );
    }

    #[test]
    fn a_revoked_token_no_longer_holds_and_is_revoked_once() {
        let revoke = || TokenCommand::Revoke {
            revoked_by: "admin".into(),
            reason: None,
        };
        given::<Token>([])
            .when(revoke(), now())
            .then_err(|e| *e == TokenError::NotIssued);
        let revoked = TokenEvent::Revoked {
            token_id: Uuid::from_u128(7),
            revoked_by: "admin".into(),
            reason: None,
        };
        given::<Token>([issued()])
            .when(revoke(), now())
            .then(vec![revoked.clone()]);
        let state = Token::load(&[issued(), revoked.clone()]);
        assert!(!state.issued().unwrap().holds_at(now()));
        assert!(Token::load(&[issued()]).issued().unwrap().holds_at(now()));
        given::<Token>([issued(), revoked])
            .when(revoke(), now())
            .then_err(|e| *e == TokenError::AlreadyRevoked);
    }
}
