//! What a workflow cost, what a tenant owes for a month, the FOCUS export, and what
//! jobs printed: read from the ledger (kept by the accounting service) and from the
//! output the site runners keep when runs end.

use meridian_accounting::{focus, Bill, Period, TenantBill};
use meridian_store::job_logs::{self, JobLog};
use serde::Serialize;
use uuid::Uuid;

use crate::{Action, App, AppError, Principal};

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LogList {
    /// One entry per run that ended, in job, index and attempt order.
    pub logs: Vec<JobLog>,
}

/// `tenant`, unless it is no tenant's name.
pub fn check_tenant(tenant: &str) -> Result<(), AppError> {
    crate::tenants::check_tenant_named(tenant, "")
}

impl App {
    /// A workflow's bill: every line, exact amounts, totals per currency, category and
    /// site. The ledger follows the log by a moment: `as_of_position` says how far.
    pub async fn bill(&self, who: &Principal, id: Uuid) -> Result<Bill, AppError> {
        self.authorize(who, Action::ReadBill).await?;
        self.visible_workflow(who, Action::ReadBill, id).await?;
        meridian_accounting::bill(&self.store, id)
            .await
            .map_err(|e| AppError::from_store("reading the ledger", e))
    }

    /// The captured output of a workflow's runs (of one job's, with `job`).
    pub async fn logs(
        &self,
        who: &Principal,
        id: Uuid,
        job: Option<&str>,
    ) -> Result<LogList, AppError> {
        self.authorize(who, Action::ReadWorkflow).await?;
        self.visible_workflow(who, Action::ReadWorkflow, id).await?;
        let logs = job_logs::read(&self.store, &id.to_string(), job)
            .await
            .map_err(|e| AppError::from_store("reading job output", e))?;
        Ok(LogList { logs })
    }

    /// A tenant's bill for one month.
    pub async fn tenant_bill(
        &self,
        who: &Principal,
        tenant: &str,
        period: Period,
    ) -> Result<TenantBill, AppError> {
        self.authorize(who, Action::ReadTenantBill).await?;
        check_tenant(tenant)?;
        self.visible_tenant(who, Action::ReadTenantBill, tenant, || {
            crate::tenants::no_tenant(tenant)
        })
        .await?;
        meridian_accounting::tenant_bill(&self.store, tenant, period)
            .await
            .map_err(|e| AppError::from_store("reading the ledger", e))
    }

    /// The FinOps FOCUS rows of one month (of one tenant's charges, with `tenant`).
    pub async fn export_focus(
        &self,
        who: &Principal,
        period: Period,
        tenant: Option<&str>,
    ) -> Result<focus::Export, AppError> {
        self.authorize(who, Action::ExportCharges).await?;
        if let Some(t) = tenant {
            check_tenant(t)?;
            self.visible_tenant(who, Action::ExportCharges, t, || {
                crate::tenants::no_tenant(t)
            })
            .await?;
        }
        // One tenant's caller exports its own tenant's rows, whatever it asked.
        let tenant = if who.every_tenant {
            tenant
        } else {
            Some(who.tenant.as_str())
        };
        focus::export(&self.store, period, tenant)
            .await
            .map_err(|e| match e {
                focus::ExportError::Store(e) => AppError::from_store("reading the ledger", e),
                other => AppError::internal("exporting FOCUS rows", other),
            })
    }
}
