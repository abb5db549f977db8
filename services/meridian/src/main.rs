//! `meridian`: the one binary. `meridian up` runs everything in one process on the
//! embedded log; `meridian server NAME` runs one service over NATS and PostgreSQL; the
//! other verbs are the CLI, talking to a Meridian API.

// Meridian's services build and parse many small JSON trees (every event is one):
// mimalloc does that in about three quarters of the time glibc's malloc takes
// (BENCHMARKS.md, "The router's start keeps the backlog it read"). Built not to ask
// for transparent huge pages: see the workspace's Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod access_cli;
mod accounting_cli;
mod adapters;
mod catalog_cli;
mod client;
mod import_cli;
mod mcp_cli;
mod profile;
mod run;
mod sites;
mod validate;

#[derive(Parser)]
#[command(
    name = "meridian",
    version,
    about = "Meridian: submit a workflow once; it runs on the best site and comes back with one exact bill.",
    after_help = "Start with `meridian up` in one terminal and `meridian submit examples/hello.yaml --wait` in another."
)]
struct Cli {
    /// The API token to send (default: the client profile's, for its server). Prefer
    /// MERIDIAN_TOKEN: a flag shows in the process list.
    #[arg(long, env = "MERIDIAN_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns, for people.
    #[default]
    Table,
    /// The API's JSON, for programs.
    Json,
}

#[derive(clap::Args)]
struct Remote {
    /// The Meridian API to talk to (default: the client profile's, else
    /// http://127.0.0.1:7373).
    #[arg(long, env = "MERIDIAN_SERVER", global = true)]
    server: Option<String>,
    /// Act for this tenant (sent as X-Meridian-Tenant): its workflows, its placement
    /// policy. Default: the server's default tenant.
    #[arg(long, env = "MERIDIAN_TENANT", global = true)]
    tenant: Option<String>,
    #[arg(long, short, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
}

impl Remote {
    fn client(&self) -> anyhow::Result<client::Client> {
        Ok(client::Client::new(&self.url())?.for_tenant(self.tenant.as_deref()))
    }

    fn url(&self) -> String {
        profile::server(self.server.as_deref())
    }
}

#[derive(Subcommand)]
enum OutputsCommand {
    /// Copy out again the outputs of VOLUME that workflow ID kept after a failed copy
    /// out (fix the destination's access first); once out they are given back.
    Retry {
        id: String,
        volume: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Give back the outputs of VOLUME that workflow ID kept after a failed copy out:
    /// their storage stops being billed and nothing will copy them out. Admins only.
    Release {
        id: String,
        volume: String,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run everything in one process: embedded log and store, a local site, the API.
    Up(run::UpArgs),
    /// Run one service of a distributed deployment (NATS JetStream + PostgreSQL).
    Server(run::ServerArgs),
    /// Serve Meridian's MCP tools on stdin/stdout, for an AI agent that starts MCP servers
    /// as local processes.
    ///
    /// Each call goes to the API's /mcp with this profile's token (or MERIDIAN_TOKEN), so
    /// the agent can do exactly what that token may: give it an agent token
    /// (`meridian admin token create --tenant T --role agent [--grant submit] [--grant
    /// cancel]`). An agent that speaks streamable HTTP can use http://HOST:7373/mcp
    /// directly instead. See docs/mcp.md.
    Mcp {
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// Print the web console's address and the token to sign in with (this profile's, or
    /// MERIDIAN_TOKEN). The console is served by the API at its root; see docs/console.md.
    Console {
        #[command(flatten)]
        server: client::ServerArg,
    },
    /// Submit a workflow; with --wait, follow it to the end and exit non-zero unless it finished.
    ///
    /// FILE is a workflow (YAML or JSON), or an sbatch script or a Fuzzfile, which is
    /// imported first as `meridian import` would (and says so).
    Submit {
        file: PathBuf,
        #[arg(long)]
        wait: bool,
        /// Makes a retried submission return the original workflow.
        #[arg(long)]
        idempotency_key: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a workflow's state and its jobs.
    Status {
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List workflows, newest first.
    List {
        /// Only workflows in this state (submitted, placed, running, finished, failed, cancelling, cancelled, rejected).
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print the captured output of a workflow's jobs (or of one job).
    Logs {
        id: String,
        job: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancel a workflow: running jobs are stopped, nothing new starts.
    Cancel {
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Outputs kept at a site after their copy out failed: copy them out again, or give
    /// them back (admins). `meridian status` says which are kept.
    #[command(subcommand)]
    Outputs(OutputsCommand),
    /// Print a workflow's events (and its jobs'), oldest first.
    Events {
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print a workflow's bill: every line (each run, attempt and site), totals by
    /// category, site and currency.
    Bill {
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print a tenant's bill for a month: totals, and each workflow's share.
    Bills(accounting_cli::BillsArgs),
    /// A tenant's budget this month: billed, in flight, left.
    Budget {
        #[command(flatten)]
        remote: Remote,
    },
    /// The audit trail: every write and every refused request (admins).
    Audit(access_cli::AuditArgs),
    /// Export charges for finance tools.
    #[command(subcommand)]
    Export(accounting_cli::Export),
    /// Administration: tokens, tenant prices and policies (through the API); read-model
    /// rebuilds (against the database).
    #[command(subcommand)]
    Admin(accounting_cli::Admin),
    /// Price a workflow at every site of a catalogue, without submitting it (offline).
    Quote {
        file: PathBuf,
        /// A catalogue file (default: the built-in reference catalogue).
        #[arg(long, conflicts_with = "server")]
        catalog: Option<PathBuf>,
        /// Quote against a running Meridian's live catalogue instead of a file.
        #[arg(long)]
        server: Option<String>,
        /// With --server: quote under this tenant's placement policy.
        #[arg(long, env = "MERIDIAN_TENANT", requires = "server")]
        tenant: Option<String>,
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Why a workflow runs where it runs: every candidate site and each cost term.
    Explain {
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Manage the site catalogue: apply a catalogue file, drain, undrain, cordon a GPU, list.
    Site {
        #[command(subcommand)]
        verb: catalog_cli::SiteVerb,
        #[arg(long, short, value_enum, default_value_t = Output::Table, global = true)]
        output: Output,
    },
    /// Turn an sbatch script or a Fuzzfile into a workflow, and print it.
    #[command(subcommand)]
    Import(import_cli::ImportCommand),
    /// Check workflow documents (YAML or JSON, `version: v1`) without submitting them.
    ///
    /// Prints every error with its field path. Exits 0 when every file is valid, 1 when
    /// any is not, 2 when a file cannot be read.
    Validate {
        /// Files to check; `-` reads standard input.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Print a JSON Schema Meridian generates from its own types.
    Schema {
        #[arg(value_enum, default_value_t = SchemaKind::Workflow)]
        kind: SchemaKind,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum SchemaKind {
    /// The workflow spec v1.
    Workflow,
    /// The HTTP API (OpenAPI 3).
    Openapi,
}

/// Logs to stderr, and traces to an OpenTelemetry collector when the standard
/// `OTEL_EXPORTER_OTLP_ENDPOINT` says where; keep what it returns until the process
/// ends (dropping it sends the last spans).
fn init_tracing(service: &str) -> Option<meridian_ops::trace::Exporting> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("MERIDIAN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,async_nats=warn"));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: no escapes in files and journals.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let (traces, exporting, refused) = match meridian_ops::trace::export_layer(service) {
        Ok(Some((layer, exporting))) => (Some(layer), Some(exporting), None),
        Ok(None) => (None, None, None),
        Err(e) => (None, None, Some(e)),
    };
    // One filter for both layers: with a filter per layer, spans during which sqlx
    // logged PostgreSQL notices were never closed for the exporter, so never sent.
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(traces)
        .init();
    if let Some(e) = refused {
        tracing::warn!(error = %e, "traces are not exported");
    }
    if exporting.is_some() {
        tracing::info!(service, "exporting traces over OTLP/HTTP");
    }
    exporting
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("start the async runtime")
}

fn finish(result: anyhow::Result<i32>) -> ExitCode {
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(code) => ExitCode::from(code.clamp(1, 255) as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    profile::set_token(cli.token.clone());
    if !matches!(cli.command, Command::Up(_) | Command::Server(_)) {
        quiet_on_closed_pipe();
    }
    match cli.command {
        Command::Validate { files, output } => validate::validate(&files, output),
        Command::Import(which) => import_cli::run(which),
        Command::Schema { kind } => {
            match kind {
                SchemaKind::Workflow => println!(
                    "{}",
                    serde_json::to_string_pretty(&meridian_spec::json_schema())
                        .expect("schema serializes")
                ),
                SchemaKind::Openapi => print!("{}", meridian_intake::openapi_json()),
            }
            ExitCode::SUCCESS
        }
        Command::Up(args) => {
            let _traces = init_tracing("meridian");
            finish(runtime().block_on(run::up(args)).map(|_| 0))
        }
        Command::Server(which) => {
            let _traces = init_tracing(which.which.trace_name());
            finish(runtime().block_on(run::server(which)).map(|_| 0))
        }
        // Logs go to stderr at most: stdout is the protocol.
        Command::Mcp { server } => finish(runtime().block_on(mcp_cli::serve(&server))),
        Command::Console { server } => finish(console(&server)),
        Command::Admin(which) => {
            let _traces = init_tracing("meridian-admin");
            finish(runtime().block_on(accounting_cli::admin(which)))
        }
        Command::Quote {
            file,
            catalog,
            server: Some(server),
            tenant,
            output,
        } => {
            let _ = catalog;
            finish(runtime().block_on(catalog_cli::quote_live(
                &server,
                tenant.as_deref(),
                &file,
                output,
            )))
        }
        Command::Quote {
            file,
            catalog,
            server: None,
            output,
            ..
        } => finish(catalog_cli::quote(&file, catalog.as_deref(), output)),
        Command::Site { verb, output } => {
            finish(runtime().block_on(catalog_cli::site(verb, output)))
        }
        verb => finish(runtime().block_on(remote(verb))),
    }
}

async fn remote(verb: Command) -> anyhow::Result<i32> {
    match verb {
        Command::Submit {
            file,
            wait,
            idempotency_key,
            remote,
        } => {
            let c = remote.client()?;
            client::submit(&c, &file, wait, idempotency_key.as_deref(), remote.output).await
        }
        Command::Status { id, remote } => {
            let c = remote.client()?;
            client::status(&c, &id, remote.output).await.map(|_| 0)
        }
        Command::List {
            state,
            limit,
            remote,
        } => {
            let c = remote.client()?;
            client::list(&c, state.as_deref(), limit, remote.output)
                .await
                .map(|_| 0)
        }
        Command::Logs { id, job, remote } => {
            let c = remote.client()?;
            client::logs(&c, &id, job.as_deref(), remote.output)
                .await
                .map(|_| 0)
        }
        Command::Cancel { id, remote } => {
            let c = remote.client()?;
            client::cancel(&c, &id, remote.output).await.map(|_| 0)
        }
        Command::Outputs(which) => {
            let (id, volume, remote, action) = match which {
                OutputsCommand::Retry { id, volume, remote } => (id, volume, remote, "export"),
                OutputsCommand::Release { id, volume, remote } => (id, volume, remote, "release"),
            };
            let c = remote.client()?;
            client::outputs(&c, &id, &volume, action, remote.output)
                .await
                .map(|_| 0)
        }
        Command::Events { id, remote } => {
            let c = remote.client()?;
            client::events(&c, &id, remote.output).await.map(|_| 0)
        }
        Command::Explain { id, remote } => {
            let c = remote.client()?;
            catalog_cli::explain(&c, &id, remote.output)
                .await
                .map(|_| 0)
        }
        Command::Bill { id, remote } => {
            accounting_cli::bill(&remote.url(), &id, remote.output).await
        }
        Command::Bills(args) => accounting_cli::bills(args).await,
        Command::Export(which) => accounting_cli::export(which).await,
        Command::Audit(args) => access_cli::audit(args).await,
        Command::Budget { remote } => {
            let Some(tenant) = remote.tenant.as_deref() else {
                anyhow::bail!("--tenant is required: whose budget (or set MERIDIAN_TENANT)");
            };
            access_cli::show_budget(&remote.client()?, tenant, remote.output).await
        }
        Command::Up(_)
        | Command::Server(_)
        | Command::Mcp { .. }
        | Command::Console { .. }
        | Command::Admin(_)
        | Command::Validate { .. }
        | Command::Import(_)
        | Command::Schema { .. }
        | Command::Quote { .. }
        | Command::Site { .. } => {
            unreachable!("handled in main")
        }
    }
}

/// A reader that goes away (`meridian explain ID | head`) ends a client command quietly,
/// as it does any Unix filter, instead of a panic in `println!`. Not for the services:
/// they must outlive their clients' connections.
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: called once at start, before any thread exists; restores the default
    // disposition the Rust runtime replaced.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `meridian console`: where the console is and what to sign in with.
fn console(server: &client::ServerArg) -> anyhow::Result<i32> {
    let url = profile::server(server.server.as_deref());
    let url = url.trim_end_matches('/');
    println!("Open {url}/ in a browser.");
    match profile::token_for(url) {
        Some(token) => println!("Sign in with this token (keep it to yourself): {token}"),
        None => println!(
            "No token for {url} here: sign in with one an admin issued \
             (`meridian admin token create --tenant TENANT --role researcher`)."
        ),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    /// Clap checks its definitions only when a subcommand is used; check them all here, so
    /// that two arguments of one name (a global one and a local one) fail the build's tests
    /// rather than a user's command.
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
