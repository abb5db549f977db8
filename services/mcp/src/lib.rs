//! The MCP face of Meridian: an agent's tools (list sites, validate, quote, submit, list,
//! status, logs, events, explain, bill, cancel) over the application layer, served as
//! streamable HTTP at `/mcp` on the API port. Each call acts as the caller of its
//! request: the API's token layer authenticates it, and the application decides what
//! that caller may do, as for every other transport. Read tools need only an agent
//! token; `submit` and `cancel` need the token's grants, and a refusal names the grant.

use std::sync::Arc;

use meridian_app::{AppError, Grant, Principal, Role};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use uuid::Uuid;

/// A workflow, as an agent may hand it over: the document's text (YAML or JSON, as
/// `meridian validate` and `POST /v1/workflows` read it) or the document as a JSON object.
/// Its input schema is the API's: the workflow spec's JSON Schema
/// (`schemas/workflow.schema.json`, generated from `meridian_spec::Workflow`).
#[derive(Debug)]
pub struct WorkflowDocument {
    text: String,
    json: bool,
}

impl<'de> Deserialize<'de> for WorkflowDocument {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(text) => Ok(WorkflowDocument { text, json: false }),
            object @ serde_json::Value::Object(_) => Ok(WorkflowDocument {
                text: object.to_string(),
                json: true,
            }),
            other => Err(serde::de::Error::custom(format!(
                "workflow: expected the document as text (YAML or JSON) or as a JSON object; got {}",
                match other {
                    serde_json::Value::Null => "null",
                    serde_json::Value::Bool(_) => "a boolean",
                    serde_json::Value::Number(_) => "a number",
                    _ => "a list",
                }
            ))),
        }
    }
}

impl schemars::JsonSchema for WorkflowDocument {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "WorkflowDocument".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let spec = generator.subschema_for::<meridian_spec::Workflow>();
        schemars::json_schema!({
            "description": "The workflow: a spec v1 document as YAML or JSON text, or as a JSON object",
            "anyOf": [
                {"type": "string", "description": "The document's text, YAML or JSON"},
                spec
            ]
        })
    }
}

/// A workflow document.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Document {
    pub workflow: WorkflowDocument,
}

/// A submission.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Submit {
    pub workflow: WorkflowDocument,
    /// The same key and document again returns the first submission (a retry is safe).
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// One workflow.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Workflow {
    /// The workflow's id, as `submit` or `list` gave it.
    pub id: String,
}

/// A workflow's output.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Logs {
    /// The workflow's id.
    pub id: String,
    /// Only this job's output.
    #[serde(default)]
    pub job: Option<String>,
}

/// A cancel: the workflow, and the API's cancel request (`POST /v1/workflows/{id}/cancel`).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Cancel {
    /// The workflow's id.
    pub id: String,
    #[serde(flatten)]
    pub request: meridian_app::api::CancelRequest,
}

/// The workflows to list.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct List {
    /// Only those in this state: submitted, waiting, placed, running, finished, failed,
    /// cancelling, cancelled, rejected.
    #[serde(default)]
    pub state: Option<String>,
    /// At most this many, newest first (default 50, at most 500).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// The tools, over one application.
#[derive(Clone)]
pub struct Tools {
    app: Arc<meridian_app::App>,
    tool_router: ToolRouter<Tools>,
}

/// `/mcp`: the tools as streamable HTTP, for the API's router (inside its token layer,
/// which puts the caller in each request's extensions).
pub fn router(app: meridian_app::App) -> axum::Router {
    let app = Arc::new(app);
    let service: StreamableHttpService<Tools, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(Tools::new(app.clone())),
        Default::default(),
        // Every request carries a token the API checks, so the Host header is not what
        // keeps a browser's forged request out; the API may be reached by any name.
        StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_sse_keep_alive(None),
    );
    axum::Router::new().nest_service("/mcp", service)
}

/// The caller of the request a tool serves, as the API's token layer found it.
fn caller(ctx: &RequestContext<RoleServer>) -> Result<Principal, ErrorData> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
        .ok_or_else(|| ErrorData::invalid_request("no authenticated caller for this request", None))
}

fn id_of(text: &str) -> Result<Uuid, String> {
    Uuid::try_parse(text.trim())
        .map_err(|_| format!("id: expected a workflow id (a UUID); got {text:?}"))
}

/// What a refusal says: for an agent without the grant, which grant it lacks.
fn refused(who: &Principal, grant: Option<Grant>, e: AppError) -> CallToolResult {
    let text = match (&e, grant) {
        (AppError::Forbidden(_), Some(g))
            if who.role == Role::Agent && !who.grants.contains(&g) =>
        {
            format!(
                "refused: this agent token lacks the `{g}` grant (an admin issues a token with it: `meridian admin token create --tenant TENANT --role agent --grant {g}`)"
            )
        }
        (AppError::InvalidWorkflow(errors), _) => {
            let lines: Vec<String> = errors
                .iter()
                .map(|f| {
                    if f.path.is_empty() {
                        f.message.clone()
                    } else {
                        format!("{}: {}", f.path, f.message)
                    }
                })
                .collect();
            format!("invalid workflow:\n{}", lines.join("\n"))
        }
        _ => e.to_string(),
    };
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// A value as the tool's answer: pretty JSON.
fn answer<T: serde::Serialize>(value: &T) -> CallToolResult {
    match serde_json::to_string_pretty(value) {
        Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
        Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
            "cannot write the answer: {e}"
        ))]),
    }
}

fn answered<T: serde::Serialize>(
    who: &Principal,
    grant: Option<Grant>,
    result: Result<T, AppError>,
) -> CallToolResult {
    match result {
        Ok(value) => answer(&value),
        Err(e) => refused(who, grant, e),
    }
}

fn bad_input(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

impl Tools {
    /// A tool on one workflow: the caller, the id checked, then `call`'s answer (or its
    /// refusal, naming `grant` when the caller lacks it).
    async fn on_workflow<T, Fut>(
        &self,
        ctx: &RequestContext<RoleServer>,
        id: &str,
        grant: Option<Grant>,
        call: impl FnOnce(Arc<meridian_app::App>, Principal, Uuid) -> Fut,
    ) -> Result<CallToolResult, ErrorData>
    where
        T: serde::Serialize,
        Fut: std::future::Future<Output = Result<T, AppError>>,
    {
        let who = caller(ctx)?;
        Ok(match id_of(id) {
            Ok(id) => answered(&who, grant, call(self.app.clone(), who.clone(), id).await),
            Err(e) => bad_input(e),
        })
    }
}

#[tool_router]
impl Tools {
    pub fn new(app: Arc<meridian_app::App>) -> Tools {
        Tools {
            app,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "The sites Meridian federates: kind, region, connected or not, health, shapes and prices, GPUs by model.",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_sites(
        &self,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let who = caller(&ctx)?;
        Ok(answered(&who, None, self.app.sites(&who).await))
    }

    #[tool(
        description = "Checks a workflow document without submitting it: every problem, each at its field (jobs.train.resources.gpus.count).",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn validate(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(doc): Parameters<Document>,
    ) -> Result<CallToolResult, ErrorData> {
        let who = caller(&ctx)?;
        Ok(match meridian_spec::parse(&doc.workflow.text) {
            Ok(spec) => answer(&serde_json::json!({
                "valid": true,
                "name": spec.name,
                "jobs": spec.jobs.keys().collect::<Vec<_>>(),
            })),
            Err(e) => refused(&who, None, AppError::from(e)),
        })
    }

    #[tool(
        description = "Prices a workflow at every connected site, under the caller's tenant's policy, without submitting it: where it would go, why, and what it would cost.",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn quote(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(doc): Parameters<Document>,
    ) -> Result<CallToolResult, ErrorData> {
        let who = caller(&ctx)?;
        Ok(match meridian_spec::parse(&doc.workflow.text) {
            Ok(spec) => answered(&who, None, self.app.quote(&who, &spec).await),
            Err(e) => refused(&who, None, AppError::from(e)),
        })
    }

    #[tool(
        description = "Submits a workflow for the caller's tenant; Meridian places and runs it. Needs the `submit` grant on an agent token. With an idempotency_key, a retry returns the first submission.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn submit(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(s): Parameters<Submit>,
    ) -> Result<CallToolResult, ErrorData> {
        let who = caller(&ctx)?;
        let submission = meridian_app::workflows::Submission {
            document: s.workflow.text,
            declared_json: s.workflow.json,
            idempotency_key: s.idempotency_key,
            traceparent: None,
        };
        Ok(answered(
            &who,
            Some(Grant::Submit),
            self.app.submit(&who, submission).await.map(|s| s.accepted),
        ))
    }

    #[tool(
        description = "The caller's workflows, newest first, optionally in one state.",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(l): Parameters<List>,
    ) -> Result<CallToolResult, ErrorData> {
        let who = caller(&ctx)?;
        let state = match l.state.as_deref() {
            None => None,
            Some(s) => match serde_json::from_value(serde_json::Value::String(s.to_string())) {
                Ok(state) => Some(state),
                Err(_) => return Ok(bad_input(format!(
                    "state: expected one of submitted, waiting, placed, running, finished, failed, cancelling, cancelled, rejected; got {s:?}"
                ))),
            },
        };
        let query = meridian_app::read::ListQuery {
            state,
            tenant: None,
            limit: l.limit.unwrap_or(50).clamp(1, 500),
            after: None,
        };
        Ok(answered(&who, None, self.app.list(&who, &query).await))
    }

    #[tool(
        description = "A workflow's state: each job's state, site and attempts, its services and their addresses, why it waits if it does.",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn status(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(w): Parameters<Workflow>,
    ) -> Result<CallToolResult, ErrorData> {
        self.on_workflow(&ctx, &w.id, None, |app, who, id| async move {
            app.status(&who, id).await
        })
        .await
    }

    #[tool(
        description = "What a workflow's jobs printed (stdout and stderr, the last MiB of each), or one job's with `job`.",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn logs(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(l): Parameters<Logs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.on_workflow(&ctx, &l.id, None, |app, who, id| async move {
            app.logs(&who, id, l.job.as_deref()).await
        })
        .await
    }

    #[tool(
        description = "A workflow's history: every event recorded for it, in order.",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn events(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(w): Parameters<Workflow>,
    ) -> Result<CallToolResult, ErrorData> {
        self.on_workflow(&ctx, &w.id, None, |app, who, id| async move {
            app.events(&who, id).await
        })
        .await
    }

    #[tool(
        description = "Why a workflow went where it went: each placement decision (workflow.placement_decided.v1 or _rejected.v1), with every site's verdict and cost terms, and the failures that were a site's fault (job.failed.v1), each of which sent the work to be placed again.",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn explain(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(w): Parameters<Workflow>,
    ) -> Result<CallToolResult, ErrorData> {
        let who = caller(&ctx)?;
        let id = match id_of(&w.id) {
            Ok(id) => id,
            Err(e) => return Ok(bad_input(e)),
        };
        Ok(match self.app.events(&who, id).await {
            Ok(list) => {
                let all = serde_json::to_value(&list).unwrap_or_default();
                let events = all["events"].as_array().cloned().unwrap_or_default();
                let of_type =
                    |e: &serde_json::Value| e["payload"]["type"].as_str().unwrap_or("").to_string();
                let decisions: Vec<&serde_json::Value> = events
                    .iter()
                    .filter(|e| of_type(e).starts_with("workflow.placement_"))
                    .collect();
                // The failures that were the site's (a refusal, a lost node, a
                // preemption): each sent the work to be placed again.
                let site_faults: Vec<&serde_json::Value> = events
                    .iter()
                    .filter(|e| of_type(e) == "job.failed.v1")
                    .filter(|e| {
                        serde_json::from_value::<meridian_events::FailureReason>(
                            e["payload"]["reason"].clone(),
                        )
                        .is_ok_and(|r| r.is_site_fault())
                    })
                    .collect();
                answer(&serde_json::json!({
                    "workflow": id,
                    "decisions": decisions,
                    "site_faults": site_faults,
                }))
            }
            Err(e) => refused(&who, None, e),
        })
    }

    #[tool(
        description = "A workflow's bill: compute, storage and egress lines, each with its site, meter, quantity, unit price and the price sheet in force when the work ran.",
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn bill(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(w): Parameters<Workflow>,
    ) -> Result<CallToolResult, ErrorData> {
        self.on_workflow(&ctx, &w.id, None, |app, who, id| async move {
            app.bill(&who, id).await
        })
        .await
    }

    #[tool(
        description = "Cancels a workflow: its jobs and services are stopped where they run, and what ran is billed. Needs the `cancel` grant on an agent token.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn cancel(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(c): Parameters<Cancel>,
    ) -> Result<CallToolResult, ErrorData> {
        self.on_workflow(
            &ctx,
            &c.id,
            Some(Grant::Cancel),
            |app, who, id| async move { app.cancel(&who, id, c.request.reason, None).await },
        )
        .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("meridian", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Meridian places workflows on the federation's sites (HPC and cloud), runs them and bills them. \
                 validate and quote before submit; follow with status, logs and explain; bill when done.",
            )
    }
}
