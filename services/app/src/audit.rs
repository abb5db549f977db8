//! The audit trail: every write action, whatever its outcome, and every refused request
//! (no or bad credentials, a role that may not, another tenant's things), with who (token,
//! tenant, role), what, when, from where, and how it ended.
//!
//! It lives in the database, not the event log: a refused request must append nothing to
//! the log, and one that nobody authenticated must not be able to grow it. Token values
//! never enter it; the token's id does.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use uuid::Uuid;

use crate::principal::{Action, Principal};
use crate::projection::timestamp;
use crate::{App, AppError};

pub(crate) const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS audit_records (
        id TEXT PRIMARY KEY,
        at TEXT NOT NULL,
        token_id TEXT,
        tenant TEXT,
        role TEXT,
        user_name TEXT,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        source TEXT,
        outcome TEXT NOT NULL,
        detail TEXT
    )",
    "CREATE INDEX IF NOT EXISTS audit_records_at ON audit_records (at)",
];

/// Writes audit records in groups: one task takes every record waiting when it is free
/// and inserts them in one transaction, so that concurrent requests share a commit (and
/// an fsync on SQLite) instead of queueing for the database's write lock one by one.
/// Each request still waits for its own record's commit before it is answered.
pub(crate) struct AuditWriter {
    records: tokio::sync::mpsc::UnboundedSender<(AuditRecord, Written)>,
}

type Written = tokio::sync::oneshot::Sender<Result<(), String>>;

/// Records in one transaction at most.
const GROUP: usize = 256;

impl AuditWriter {
    /// Starts the writer's task; it ends when the last handle to the writer is dropped.
    fn start(store: meridian_store::Store) -> AuditWriter {
        let (records, mut waiting) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut group = Vec::with_capacity(GROUP);
            while waiting.recv_many(&mut group, GROUP).await > 0 {
                if insert_group(&store, &group).await.is_ok() {
                    for (_, written) in group.drain(..) {
                        let _ = written.send(Ok(()));
                    }
                    continue;
                }
                // One record's failure must not cost the others theirs: each alone.
                for one in group.drain(..) {
                    let outcome = insert_group(&store, std::slice::from_ref(&one)).await;
                    let _ = one.1.send(outcome.map_err(|e| e.to_string()));
                }
            }
        });
        AuditWriter { records }
    }

    async fn write(&self, record: AuditRecord) -> Result<(), String> {
        let (written, answer) = tokio::sync::oneshot::channel();
        self.records
            .send((record, written))
            .map_err(|_| "the audit writer has stopped".to_string())?;
        answer
            .await
            .map_err(|_| "the audit writer has stopped".to_string())?
    }
}

const COLUMNS: &str =
    "id, at, token_id, tenant, role, user_name, action, target, source, outcome, detail";

/// Skips a record already there: a move cut short runs again (ids are fresh otherwise).
static INSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO audit_records ({COLUMNS})
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (id) DO NOTHING"
    )
});

async fn insert_group(
    store: &meridian_store::Store,
    group: &[(AuditRecord, Written)],
) -> Result<(), meridian_store::StoreError> {
    let mut tx = store.begin().await?;
    for (r, _) in group {
        sqlx::query(&INSERT)
            .bind(r.id.to_string())
            .bind(timestamp(r.at))
            .bind(r.token_id.map(|t| t.to_string()))
            .bind(r.tenant.clone())
            .bind(r.role.clone())
            .bind(r.user.clone())
            .bind(r.action.clone())
            .bind(r.target.clone())
            .bind(r.source.clone())
            .bind(r.outcome.as_str())
            .bind(r.detail.clone())
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Moves the records `from` holds into `to` (a deployment that kept its audit trail in
/// the store before it had one of its own), then drops `from`'s table. Each step can be
/// cut short and run again: records already in `to` are skipped, and the table is
/// dropped only once every record is in `to`.
pub(crate) async fn move_records(
    from: &meridian_store::Store,
    to: &meridian_store::Store,
) -> Result<(), meridian_store::StoreError> {
    if !from.has_table("audit_records").await? {
        return Ok(());
    }
    let (mut after, mut moved) = (String::new(), 0usize);
    loop {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM audit_records WHERE id > $1 ORDER BY id LIMIT 1000"
        ))
        .bind(after.clone())
        .fetch_all(from.pool())
        .await?;
        let Some(last) = rows.last() else { break };
        after = last.try_get("id")?;
        let mut tx = to.begin().await?;
        for row in &rows {
            let mut insert = sqlx::query(&INSERT);
            for column in COLUMNS.split(", ") {
                insert = insert.bind(row.try_get::<Option<String>, _>(column)?);
            }
            insert.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        moved += rows.len();
    }
    sqlx::query("DROP TABLE audit_records")
        .execute(from.writer())
        .await?;
    tracing::info!(records = moved, "moved the audit trail to its own database");
    Ok(())
}

/// How a request ended, as the audit trail says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Done.
    Ok,
    /// No credentials, or ones that do not hold (401).
    Unauthenticated,
    /// The caller's role may not do this (403).
    Forbidden,
    /// Another tenant's thing, answered as if it did not exist (404).
    Hidden,
    /// Refused for what was asked (bad input, a conflict, over budget).
    Refused,
    /// Failed on Meridian's side.
    Failed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::Forbidden => "forbidden",
            Outcome::Hidden => "hidden",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Outcome> {
        [
            Outcome::Ok,
            Outcome::Unauthenticated,
            Outcome::Forbidden,
            Outcome::Hidden,
            Outcome::Refused,
            Outcome::Failed,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }

    /// The outcome an error stands for.
    pub(crate) fn of(error: &AppError) -> Outcome {
        match error {
            AppError::Unauthenticated(_) => Outcome::Unauthenticated,
            AppError::Forbidden(_) => Outcome::Forbidden,
            AppError::Unavailable(_) | AppError::Internal(_) => Outcome::Failed,
            _ => Outcome::Refused,
        }
    }
}

/// One entry of the audit trail.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditRecord {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    /// The token presented, when one was and it was known.
    pub token_id: Option<Uuid>,
    pub tenant: Option<String>,
    pub role: Option<String>,
    pub user: Option<String>,
    /// What was asked: an action (`submit_workflow`), or the request for one refused
    /// before its caller was known (`POST /v1/workflows`).
    pub action: String,
    /// What it was asked of: `workflow/ID`, `site/NAME`, `tenant/NAME/policy`, ...
    pub target: String,
    /// The peer's address.
    pub source: Option<String>,
    pub outcome: Outcome,
    /// Why it was refused or failed.
    pub detail: Option<String>,
}

/// Which records to list.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    pub tenant: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub limit: u32,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditList {
    /// Oldest first.
    pub records: Vec<AuditRecord>,
}

/// A caller before it is known: what the transport can say of a refused request.
#[derive(Debug, Clone, Default)]
pub struct Unknown {
    pub request: String,
    pub source: Option<String>,
    pub token_id: Option<Uuid>,
}

impl App {
    /// Records what `who` asked and how it ended. A failure to record is logged and
    /// does not change the answer: the request's own outcome stands.
    pub(crate) async fn audit(
        &self,
        who: &Principal,
        action: Action,
        target: &str,
        outcome: Outcome,
        detail: Option<&str>,
    ) {
        self.audit_named(who, action.as_str(), target, outcome, detail)
            .await;
    }

    /// [`App::audit`] of a request that names no action (`GET /v1/workflows`).
    pub(crate) async fn audit_named(
        &self,
        who: &Principal,
        action: &str,
        target: &str,
        outcome: Outcome,
        detail: Option<&str>,
    ) {
        let record = AuditRecord {
            id: Uuid::now_v7(),
            at: Utc::now(),
            token_id: who.token_id,
            tenant: Some(who.tenant.clone()),
            role: Some(who.role.to_string()),
            user: Some(who.user.clone()),
            action: action.into(),
            target: target.into(),
            source: who.source.clone(),
            outcome,
            detail: detail.map(str::to_string),
        };
        self.insert_audit(record).await;
    }

    /// Records a request a transport refused before asking who it was (an `Authorization`
    /// header it cannot read).
    pub async fn refused_unknown(&self, request: &str, detail: &str) {
        let caller = Unknown {
            request: request.to_string(),
            ..Unknown::default()
        };
        self.audit_unknown(&caller, Outcome::Unauthenticated, detail)
            .await;
    }

    /// Records a request refused before its caller was known.
    pub(crate) async fn audit_unknown(&self, caller: &Unknown, outcome: Outcome, detail: &str) {
        let record = AuditRecord {
            id: Uuid::now_v7(),
            at: Utc::now(),
            token_id: caller.token_id,
            tenant: None,
            role: None,
            user: None,
            action: caller.request.clone(),
            target: String::new(),
            source: caller.source.clone(),
            outcome,
            detail: Some(detail.to_string()),
        };
        self.insert_audit(record).await;
    }

    async fn insert_audit(&self, record: AuditRecord) {
        if let Err(e) = self.migrate().await {
            tracing::error!(error = %e, "cannot record an audit entry");
            return;
        }
        let writer = self
            .audit
            .get_or_init(|| AuditWriter::start(self.audit_store.clone()));
        if let Err(e) = writer.write(record).await {
            tracing::error!(error = %e, "cannot record an audit entry");
        }
    }

    /// Records a write's outcome and hands its result back.
    pub(crate) async fn audited<T>(
        &self,
        who: &Principal,
        action: Action,
        target: &str,
        result: Result<T, AppError>,
    ) -> Result<T, AppError> {
        match &result {
            Ok(_) => self.audit(who, action, target, Outcome::Ok, None).await,
            Err(e) => {
                let detail = e.to_string();
                self.audit(who, action, target, Outcome::of(e), Some(&detail))
                    .await
            }
        }
        result
    }

    /// The audit trail, oldest first (admins only).
    pub async fn audit_trail(
        &self,
        who: &Principal,
        query: &AuditQuery,
    ) -> Result<AuditList, AppError> {
        self.authorize(who, Action::ReadAudit).await?;
        self.migrate().await?;
        let mut sql = format!("SELECT {COLUMNS} FROM audit_records WHERE 1 = 1");
        let mut n = 0;
        let mut next = || {
            n += 1;
            format!("${n}")
        };
        if query.tenant.is_some() {
            sql.push_str(&format!(" AND tenant = {}", next()));
        }
        if query.since.is_some() {
            sql.push_str(&format!(" AND at >= {}", next()));
        }
        sql.push_str(&format!(" ORDER BY at, id LIMIT {}", next()));
        let mut q = sqlx::query(&sql);
        if let Some(t) = &query.tenant {
            q = q.bind(t.clone());
        }
        if let Some(s) = query.since {
            q = q.bind(timestamp(s));
        }
        let rows = q
            .bind(i64::from(query.limit.max(1)))
            .fetch_all(self.audit_store.pool())
            .await
            .map_err(|e| AppError::from_db("reading the audit trail", e))?;
        let bad = |m: String| AppError::internal("reading the audit trail", m);
        let mut records = Vec::with_capacity(rows.len());
        for row in rows {
            let text = |c: &str| {
                row.try_get::<Option<String>, _>(c)
                    .map_err(|e| bad(e.to_string()))
            };
            let id: String = text("id")?.unwrap_or_default();
            let at: String = text("at")?.unwrap_or_default();
            let outcome: String = text("outcome")?.unwrap_or_default();
            records.push(AuditRecord {
                id: id.parse().map_err(|e| bad(format!("id {id:?}: {e}")))?,
                at: DateTime::parse_from_rfc3339(&at)
                    .map_err(|e| bad(format!("at {at:?}: {e}")))?
                    .with_timezone(&Utc),
                token_id: text("token_id")?.and_then(|t| t.parse().ok()),
                tenant: text("tenant")?,
                role: text("role")?,
                user: text("user_name")?,
                action: text("action")?.unwrap_or_default(),
                target: text("target")?.unwrap_or_default(),
                source: text("source")?,
                outcome: Outcome::parse(&outcome)
                    .ok_or_else(|| bad(format!("outcome {outcome:?}")))?,
                detail: text("detail")?,
            });
        }
        Ok(AuditList { records })
    }
}
