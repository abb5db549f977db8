//! `meridian mcp`: Meridian's MCP tools on stdin/stdout, for an agent that starts its MCP
//! servers as local processes. It is a bridge, not a second server: each list and call
//! goes to the API's `/mcp` with this profile's token (or `MERIDIAN_TOKEN`), so the
//! agent can do exactly what that token may, as over HTTP.

use anyhow::Context;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler, ServiceExt};

use crate::client::ServerArg;

/// The agent's session, served from the API's.
struct Bridge {
    upstream: RunningService<RoleClient, ()>,
}

fn lost(e: rmcp::service::ServiceError) -> ErrorData {
    ErrorData::internal_error(format!("the Meridian API's /mcp: {e}"), None)
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        // What the API's server says of itself: its tools, its name, its instructions.
        let mut config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        if let Some(peer) = self.upstream.peer_info() {
            if let Some(info) = &peer.server_info {
                config = config.with_server_info(info.clone());
            }
            if let Some(text) = &peer.instructions {
                config = config.with_instructions(text.clone());
            }
        }
        config
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.upstream.list_tools(request).await.map_err(lost)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.upstream
            .call_tool(request)
            .await
            .map(CallToolResponse::Complete)
            .map_err(lost)
    }
}

/// Bridges stdin/stdout to `server`'s `/mcp` until the agent closes its end.
pub async fn serve(server: &ServerArg) -> anyhow::Result<i32> {
    let base = crate::profile::server(server.server.as_deref());
    let base = base.trim_end_matches('/').to_string();
    let token = crate::profile::token_for(&base).with_context(|| {
        format!("no token for {base}: set MERIDIAN_TOKEN to an agent token (`meridian admin token create --role agent …`), or sign in this profile")
    })?;
    // The HTTP client brings no TLS crypto of its own: ring, as for every other client.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp")).auth_header(token),
    );
    let upstream = ().serve(transport).await.with_context(|| format!("connecting to {base}/mcp"))?;
    let session = Bridge { upstream }
        .serve(rmcp::transport::stdio())
        .await
        .context("serving MCP on stdin/stdout")?;
    session.waiting().await.context("the MCP session")?;
    Ok(0)
}
