//! The OpenAPI document, generated from the handlers' annotations and the types in
//! [`crate::api`]. The checked-in copy is `schemas/openapi.json`; a test keeps the two
//! equal (`MERIDIAN_UPDATE_SCHEMAS=1` rewrites it).

use utoipa::OpenApi;

use crate::api;
use crate::handlers;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Meridian federation API",
        description = "Submit a workflow once; Meridian places it on the best site, runs it and bills it. \
            Every error is `{\"error\": \"<message>\"}` with the status that fits.",
        license(name = "Apache-2.0"),
    ),
    paths(
        handlers::submit,
        handlers::list,
        handlers::status,
        handlers::cancel,
        handlers::events,
        handlers::retry_egress,
        handlers::release_outputs,
        handlers::health,
        handlers::report_run,
        handlers::report_run_output,
        crate::reports::bill,
        crate::reports::logs,
        crate::sites::list,
        crate::sites::apply,
        crate::sites::drain,
        crate::sites::undrain,
        crate::sites::refresh,
        crate::sites::cordon,
        crate::sites::uncordon,
        crate::sites::quote,
        crate::tenants::get_policy,
        crate::tenants::set_policy,
        crate::tenants::list_adjustments,
        crate::tenants::grant_adjustment,
        crate::tenants::revoke_adjustment,
        crate::tenants::get_budget,
        crate::tenants::set_budget,
        crate::reports::tenant_bill,
        crate::reports::focus_export,
        crate::access::issue,
        crate::access::list,
        crate::access::revoke,
        crate::access::audit,
    ),
    components(schemas(
        api::Accepted,
        api::CancelAccepted,
        api::OutputsAccepted,
        api::CancelRequest,
        api::ErrorBody,
        api::EventList,
        api::FieldErrorBody,
        api::Health,
        api::JobRun,
        api::TransferState,
        api::TransferStatus,
        api::RunState,
        api::TaskCounts,
        api::WorkflowPage,
        api::WorkflowState,
        api::WorkflowStatus,
        api::WorkflowSummary,
        meridian_accounting::Bill,
        meridian_accounting::BillLine,
        meridian_accounting::Total,
        meridian_accounting::CategoryTotal,
        meridian_accounting::SiteTotal,
        meridian_accounting::TenantBill,
        meridian_accounting::WorkflowTotal,
        meridian_app::reports::LogList,
        meridian_app::sites::SiteList,
        meridian_app::sites::SiteSummary,
        meridian_app::sites::ShapesRefreshSummary,
        meridian_app::sites::DeviceSummary,
        meridian_app::sites::CordonSummary,
        meridian_app::sites::CordonRequest,
        meridian_app::runs::RunReportBody,
        meridian_app::runs::RunReportKept,
        meridian_app::sites::PricesSummary,
        meridian_app::sites::AppliedCatalog,
        meridian_app::sites::AppliedSite,
        meridian_app::sites::DrainRequest,
        meridian_app::sites::SiteState,
        meridian_app::sites::Quote,
        meridian_app::tenants::PolicyDocument,
        meridian_app::tenants::TenantPolicy,
        meridian_app::tenants::GrantRequest,
        meridian_app::tenants::RevokeRequest,
        meridian_app::tenants::AdjustmentView,
        meridian_app::tenants::AdjustmentList,
        meridian_store::job_logs::JobLog,
        meridian_app::budgets::BudgetDocument,
        meridian_app::budgets::BudgetView,
        meridian_app::auth::TokenRequest,
        meridian_app::auth::TokenView,
        meridian_app::auth::IssuedTokenSecret,
        meridian_app::auth::TokenList,
        meridian_app::audit::AuditRecord,
        meridian_app::audit::AuditList,
        meridian_app::audit::Outcome,
    )),
    modifiers(&Authentication, &ClosedVariants),
    security(("bearer" = [])),
    tags(
        (name = "workflows", description = "Submit, watch and cancel workflows"),
        (name = "billing", description = "Bills from the ledger and FinOps FOCUS exports"),
        (name = "sites", description = "The site catalogue, and quotes against it"),
        (name = "tenants", description = "Where each tenant's work may run"),
        (name = "access", description = "API tokens and the audit trail (admins)"),
        (name = "service", description = "The service itself"),
        (name = "runs", description = "Runs reporting themselves (a cloud instance's bootstrap)"),
    )
)]
pub struct ApiDoc;

/// Every route but health takes `Authorization: Bearer TOKEN` and may answer 401 (no
/// credentials that hold) or 403 (a role that may not); said once here, not per route.
struct Authentication;

impl utoipa::Modify for Authentication {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token (`meridian admin token create`) or a workflow credential",
                    ))
                    .build(),
            ),
        );
        let error = |text: &str| {
            ResponseBuilder::new()
                .description(text)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for (path, item) in doc.paths.paths.iter_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                if path == "/v1/health" {
                    // Health answers anyone: load balancers carry no tokens.
                    operation.security = Some(vec![Default::default()]);
                    continue;
                }
                let responses = &mut operation.responses.responses;
                responses.insert(
                    "401".into(),
                    error("No credentials, or ones that do not hold").into(),
                );
                if path.starts_with("/v1/runs/") {
                    // A run's credential has no role: it holds for its run or not at all.
                    continue;
                }
                responses.insert(
                    "403".into(),
                    error("The caller's role may not do this").into(),
                );
            }
        }
    }
}

/// Tagged enums (a `oneOf` of inline objects): the API's all refuse unknown fields
/// (`#[serde(tag = …, deny_unknown_fields)]`), and utoipa closes structs that do so but
/// not an enum's variants, so each variant is closed here. Schemathesis holds the
/// document to the server: an enum that took extra fields would fail it.
struct ClosedVariants;

impl utoipa::Modify for ClosedVariants {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{AdditionalProperties, Schema};
        use utoipa::openapi::RefOr;
        let Some(components) = doc.components.as_mut() else {
            return;
        };
        for schema in components.schemas.values_mut() {
            let RefOr::T(Schema::OneOf(one_of)) = schema else {
                continue;
            };
            let tagged = one_of
                .items
                .iter()
                .all(|v| matches!(v, RefOr::T(Schema::Object(_))));
            if !tagged {
                continue;
            }
            for variant in &mut one_of.items {
                if let RefOr::T(Schema::Object(object)) = variant {
                    object.additional_properties =
                        Some(Box::new(AdditionalProperties::FreeForm(false)));
                }
            }
        }
    }
}

/// The OpenAPI document.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The OpenAPI document as the checked-in file holds it: pretty JSON and a newline.
pub fn openapi_json() -> String {
    let mut text = openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    text.push('\n');
    text
}
