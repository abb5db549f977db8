//! Running the services: `meridian up` (all of them in one process on the embedded log
//! and store) and `meridian server NAME` (one of them, over NATS JetStream and
//! PostgreSQL). Both start the same tasks; only the log and the store differ.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use meridian_adapter_core::SiteAdapter;
use meridian_adapter_local::{LocalAdapter, LocalConfig};
use meridian_app::WorkflowCredentials;
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_intake::Intake;
use meridian_site_runner::{CallBack, SiteRunner};
use meridian_store::Store;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::sites::{ensure_local_site, LocalPrices};

/// The tasks of one process, stopped together.
pub struct Tasks {
    stop: watch::Sender<bool>,
    set: JoinSet<(String, anyhow::Result<()>)>,
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks {
            stop: watch::channel(false).0,
            set: JoinSet::new(),
        }
    }

    fn shutdown(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    fn spawn<F>(&mut self, name: &str, task: F)
    where
        F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let name = name.to_string();
        self.set.spawn(async move { (name, task.await) });
    }

    pub fn router(&mut self, log: Arc<dyn EventLog>) {
        let stop = self.shutdown();
        self.spawn("router", async move {
            let router = meridian_router::Router::new(log).await?;
            Ok(router.run(stop).await?)
        });
    }

    pub fn accounting(&mut self, log: Arc<dyn EventLog>, store: Store) {
        let stop = self.shutdown();
        self.spawn("accounting", async move {
            Ok(meridian_store::run(store, &*log, &meridian_accounting::Ledger, stop).await?)
        });
    }

    pub fn intake(
        &mut self,
        app: meridian_app::App,
        listener: tokio::net::TcpListener,
        tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    ) {
        let (log, store) = (app.log().clone(), app.store().clone());
        let stop = self.shutdown();
        let projection_store = store.clone();
        let projection_log = log.clone();
        self.spawn("intake status", async move {
            Ok(meridian_store::run(
                projection_store,
                &*projection_log,
                &meridian_intake::StatusProjection,
                stop,
            )
            .await?)
        });
        let mut stop = self.shutdown();
        self.spawn("intake api", async move {
            let intake = Intake::over(app);
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            match tls {
                Some(config) => {
                    meridian_intake::serve_tls(intake, listener, config, stopped).await?
                }
                None => meridian_intake::serve(intake, listener, stopped).await?,
            }
            Ok(())
        });
    }

    pub fn site(
        &mut self,
        name: &str,
        adapter: Arc<dyn meridian_adapter_core::SiteAdapter>,
        log: Arc<dyn EventLog>,
        store: Store,
        call_back: Option<CallBack>,
    ) {
        let stop = self.shutdown();
        let mut runner = SiteRunner::new(name, adapter, log, Some(store));
        if let Some(call_back) = call_back {
            runner = runner.with_call_back(call_back);
        }
        self.spawn(&format!("site {name}"), async move {
            Ok(runner.run(stop).await?)
        });
    }

    /// The data mover, writing into the volumes of `roots` (site → volume root); with
    /// `only`, for those sites alone.
    pub fn datamover(
        &mut self,
        log: Arc<dyn EventLog>,
        roots: std::collections::BTreeMap<String, PathBuf>,
        only: Option<Vec<String>>,
        secrets: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    ) {
        let stop = self.shutdown();
        let mut mover = meridian_datamover::DataMover::new(log, roots).with_secrets(secrets);
        if let Some(sites) = only {
            mover = mover.only(sites);
        }
        self.spawn("data mover", async move { Ok(mover.run(stop).await?) });
    }

    /// `/healthz`, `/readyz` and `/metrics` on `listener`.
    pub fn ops(&mut self, listener: tokio::net::TcpListener, ops: meridian_ops::Ops) {
        let mut stop = self.shutdown();
        self.spawn("health and metrics", async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            Ok(meridian_ops::serve(ops, listener, stopped).await?)
        });
    }

    /// Runs until Ctrl-C (or SIGTERM), or until a task fails; then stops the rest.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut failure = None;
        tokio::select! {
            _ = shutdown_signal() => tracing::info!("stopping"),
            Some(done) = self.set.join_next() => {
                match done {
                    Ok((name, Ok(()))) => failure = Some(anyhow::anyhow!("{name} stopped unexpectedly")),
                    Ok((name, Err(e))) => failure = Some(e.context(format!("{name} failed"))),
                    Err(e) => failure = Some(anyhow::anyhow!("a task panicked: {e}")),
                }
            }
        }
        let _ = self.stop.send(true);
        let drain = async {
            while let Some(done) = self.set.join_next().await {
                if let Ok((name, Err(e))) = done {
                    tracing::warn!(task = %name, error = %format!("{e:#}"), "stopped with an error");
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            tracing::warn!("some tasks did not stop within 10 s");
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install the SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

async fn bind(listen: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen).await.with_context(|| {
        format!("cannot listen on {listen} (is another Meridian running? choose another with --listen)")
    })
}

/// Holds an exclusive lock on the data directory: two processes driving the same local
/// site would run its jobs twice.
pub(crate) fn lock_data_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if file.try_lock().is_err() {
        bail!(
            "{} is in use by another Meridian process; stop it first, or use another --data-dir",
            dir.display()
        );
    }
    Ok(file)
}

/// Fails unless the catalogue has `site`: sites other than local are described by a
/// catalogue file (`meridian site apply`), which gives their shapes and prices.
async fn require_site(log: &dyn EventLog, site: &str) -> anyhow::Result<()> {
    let catalog = meridian_domain::Catalog::load(log).await?;
    if catalog.find(site).is_none() {
        bail!(
            "site {site:?} is not in the catalogue; describe it in a catalogue file and run \
             `meridian site apply FILE` (see catalog/reference.yaml)"
        );
    }
    Ok(())
}

/// `NAME=KIND:FILE`: a site to run in `meridian up` with the adapter of KIND.
#[derive(Debug, Clone)]
pub struct AdapterSpec {
    pub site: String,
    pub kind: String,
    pub config: PathBuf,
}

impl std::str::FromStr for AdapterSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (site, rest) = s
            .split_once('=')
            .ok_or("expected NAME=KIND:FILE, e.g. hpc=slurm:slurm.yaml")?;
        let (kind, config) = rest
            .split_once(':')
            .ok_or("expected NAME=KIND:FILE, e.g. hpc=slurm:slurm.yaml")?;
        crate::adapters::find(kind).map_err(|e| e.to_string())?;
        Ok(AdapterSpec {
            site: site.to_string(),
            kind: kind.to_string(),
            config: PathBuf::from(config),
        })
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Where the embedded log, the read models and the local site's jobs live.
    #[arg(long, env = "MERIDIAN_DATA_DIR", default_value = "meridian-data")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub api: ApiArgs,
    /// Issue a new admin token and rewrite the client profile with it (when the profile
    /// was lost, or is another Meridian's). Earlier tokens keep working.
    #[arg(long)]
    pub new_admin_token: bool,
    /// CPUs the local site offers (default: all of this machine's).
    #[arg(long)]
    pub local_cpus: Option<u32>,
    #[command(flatten)]
    pub prices: LocalPrices,
    /// A catalogue file to apply at start (sites, shapes, prices, data sets).
    #[arg(long, value_name = "FILE")]
    pub catalog: Option<PathBuf>,
    #[command(flatten)]
    pub secrets: SecretsFile,
    /// Also run the site NAME (from the catalogue) with the adapter KIND configured by
    /// FILE, e.g. `hpc=slurm:slurm.yaml`. Repeatable.
    #[arg(long = "adapter", value_name = "NAME=KIND:FILE",
          long_help = format!("Also run the site NAME (from the catalogue) with the adapter KIND configured by FILE, e.g. `hpc=slurm:slurm.yaml`. Repeatable.\n\n{}", crate::adapters::help()))]
    pub adapters: Vec<AdapterSpec>,
    /// Serve /healthz, /readyz and /metrics (Prometheus text format) on this address,
    /// e.g. 127.0.0.1:9464, as each `meridian server` does. See docs/running.md.
    #[arg(long, env = "MERIDIAN_OPS_LISTEN", value_name = "ADDR")]
    pub ops_listen: Option<SocketAddr>,
}

/// `meridian up`: everything in one process, no servers needed.
pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    let _lock = lock_data_dir(&args.data_dir)?;
    args.api.check()?;
    let log: Arc<dyn EventLog> = Arc::new(
        SqliteLog::open(&args.data_dir.join("events.sqlite"))
            .await
            .context("opening the event log")?,
    );
    let first_start = log.head().await.context("reading the event log")? == 0;
    let store = Store::connect(&format!(
        "sqlite://{}",
        args.data_dir.join("meridian.sqlite").display()
    ))
    .await
    .context("opening the read-model store")?;
    let mut config = LocalConfig::new(args.data_dir.join("sites").join("local"));
    if let Some(cpus) = args.local_cpus {
        config.cpus = cpus;
    }
    let (cpus, memory) = (config.cpus, config.memory_bytes);
    let adapter = Arc::new(LocalAdapter::new(config).context("starting the local site")?);
    let gpus = adapter.config().gpus.clone();
    ensure_local_site(&*log, "local", cpus, memory, &gpus, &args.prices).await?;
    if let Some(file) = &args.catalog {
        crate::catalog_cli::apply(&*log, file).await?;
    }
    let mut extra = Vec::new();
    for spec in &args.adapters {
        require_site(&*log, &spec.site).await?;
        extra.push((
            spec.site.clone(),
            crate::adapters::build(
                &spec.kind,
                Some(&spec.config),
                &args.data_dir.join("sites").join(&spec.site),
                &store,
            )?,
        ));
    }
    let listener = bind(args.api.listen).await?;
    let credentials = WorkflowCredentials::load_or_create(&args.data_dir.join("credential.key"))
        .context("reading the workflow credential key")?;
    // The audit trail in a file of its own: each request waits for its record, which
    // in the store's file would queue behind the read models' writes.
    let audit = Store::connect(&format!(
        "sqlite://{}",
        args.data_dir.join("audit.sqlite").display()
    ))
    .await
    .context("opening the audit trail")?;
    let app = meridian_app::App::new(log.clone(), store.clone())
        .with_audit_store(audit)
        .with_workflow_credentials(credentials.clone());
    let server = args.api.url();
    let profile_note = if first_start || args.new_admin_token {
        Some(write_admin_profile(&app, &server).await?)
    } else {
        None
    };
    let call_back = call_back(&server, credentials);

    let mut roots: std::collections::BTreeMap<String, PathBuf> = extra
        .iter()
        .filter_map(|(site, adapter)| Some((site.clone(), adapter.volume_root()?)))
        .collect();
    if let Some(root) = adapter.volume_root() {
        roots.insert("local".into(), root);
    }
    let mut tasks = Tasks::new();
    if let Some(listen) = args.ops_listen {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| {
                format!("cannot listen on {listen} for health and metrics (--ops-listen)")
            })?;
        tasks.ops(
            listener,
            meridian_ops::Ops::new("meridian", log.clone())
                .projection(store.clone(), meridian_intake::PROJECTION_NAME)
                .projection(store.clone(), meridian_accounting::NAME)
                .probe(workflows_probe(store.clone())),
        );
    }
    tasks.datamover(log.clone(), roots, None, args.secrets.load()?);
    for (site, adapter) in extra {
        tasks.site(
            &site,
            adapter,
            log.clone(),
            store.clone(),
            Some(call_back.clone()),
        );
    }
    tasks.intake(app, listener, args.api.tls()?);
    tasks.router(log.clone());
    tasks.accounting(log.clone(), store.clone());
    tasks.site("local", adapter, log, store, Some(call_back));
    let gpus_text = match gpus.len() {
        0 => String::new(),
        n => {
            let mut models: Vec<&str> = gpus.iter().map(|d| d.model.as_str()).collect();
            models.dedup();
            format!(" and {n} GPU(s) ({})", models.join(", "))
        }
    };
    eprintln!(
        "Meridian is up: API on {server}, data in {}, local site with {cpus} CPUs{gpus_text}. Ctrl-C stops it.",
        args.data_dir.display()
    );
    eprintln!(
        "Web console: {}/ (sign in with the token `meridian console` prints).",
        server.trim_end_matches('/')
    );
    match profile_note {
        Some(note) => eprintln!("{note}"),
        None => {
            let profiled = crate::profile::read().is_some_and(|p| p.server == server);
            if !profiled {
                eprintln!(
                    "No client profile points here, so the CLI has no token for {server}: \
                     restart with --new-admin-token to write one, or set MERIDIAN_TOKEN."
                );
            }
        }
    }
    tasks.wait().await
}

/// Workflows by state, from the status read model, for `/metrics`.
fn workflows_probe(store: Store) -> meridian_ops::Probe {
    Arc::new(move || {
        let store = store.clone();
        Box::pin(async move {
            match meridian_app::read::count_by_state(&store).await {
                Ok(counts) => vec![(
                    "meridian_workflows",
                    "Workflows by state, from the status read model.",
                    meridian_ops::by("state", counts),
                )],
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: cannot count workflows");
                    Vec::new()
                }
            }
        })
    })
}

/// Issues an admin token and writes the client profile with it; says where, and how to
/// make tokens for others.
async fn write_admin_profile(app: &meridian_app::App, server: &str) -> anyhow::Result<String> {
    let issued = app
        .issue_first_admin("meridian up")
        .await
        .context("issuing the first admin token")?;
    let path = crate::profile::write(&crate::profile::Profile {
        server: server.to_string(),
        token: issued.token,
    })
    .context("writing the client profile")?;
    Ok(format!(
        "Admin token issued; the CLI reads it from {} (mode 0600). Tokens for others: \
         `meridian admin token create --tenant TENANT --role researcher`.",
        path.display()
    ))
}

/// What the site runners start every job with: this API's address and the workflow's
/// credential.
fn call_back(server: &str, credentials: WorkflowCredentials) -> CallBack {
    CallBack {
        server: server.to_string(),
        credential: Arc::new({
            let credentials = credentials.clone();
            move |workflow| credentials.mint(workflow)
        }),
        run_credential: Arc::new(move |job| credentials.mint_run(job)),
    }
}

/// Where and how the API listens.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Address of the HTTP API. Any address but loopback needs --tls-cert and --tls-key,
    /// or --behind-tls-proxy.
    #[arg(long, env = "MERIDIAN_LISTEN", default_value = "127.0.0.1:7373")]
    pub listen: SocketAddr,
    /// Serve HTTPS with this certificate chain (PEM).
    #[arg(
        long,
        env = "MERIDIAN_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(
        long,
        env = "MERIDIAN_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// The API's address as clients and jobs reach it (default: from --listen).
    #[arg(long, env = "MERIDIAN_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// A TLS proxy in front of the API terminates TLS: allows a non-loopback --listen
    /// without --tls-cert. Tokens cross the network; never serve them in the clear.
    #[arg(long)]
    pub behind_tls_proxy: bool,
}

impl ApiArgs {
    /// Refuses to send tokens in the clear beyond this machine.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.listen.ip().is_loopback() && !self.behind_tls_proxy && self.tls_cert.is_none() {
            bail!(
                "--listen {} is reachable from other machines, and tokens would cross the network \
                 in the clear: give --tls-cert and --tls-key, or put a TLS proxy in front and pass \
                 --behind-tls-proxy, or listen on 127.0.0.1",
                self.listen
            );
        }
        Ok(())
    }

    /// The TLS settings, when the API serves HTTPS itself.
    pub fn tls(&self) -> anyhow::Result<Option<Arc<tokio_rustls::rustls::ServerConfig>>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(meridian_intake::tls_config(cert, key)?)),
            _ => Ok(None),
        }
    }

    pub fn url(&self) -> String {
        if let Some(url) = &self.public_url {
            return url.trim_end_matches('/').to_string();
        }
        let scheme = if self.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        let port = self.listen.port();
        if self.listen.ip().is_unspecified() {
            format!("{scheme}://127.0.0.1:{port}")
        } else {
            format!("{scheme}://{}", self.listen)
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct Distributed {
    /// NATS server with JetStream (2.10 or newer).
    #[arg(
        long,
        env = "MERIDIAN_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,
    /// JetStream stream that holds the log.
    #[arg(long, env = "MERIDIAN_STREAM", default_value = "MERIDIAN_EVENTS")]
    pub stream: String,
    /// Subject prefix of the log's stream.
    #[arg(
        long,
        env = "MERIDIAN_SUBJECT_PREFIX",
        default_value = "meridian.events"
    )]
    pub subject_prefix: String,
    /// Stream replicas when the stream is created (3 in a production cluster).
    #[arg(long, env = "MERIDIAN_REPLICAS", default_value_t = 1)]
    pub replicas: usize,
}

impl Distributed {
    /// Connects to the log, trying again for up to two minutes while it is unavailable
    /// (a cluster electing a leader, a server restarting), and saying so each time.
    async fn log(&self) -> anyhow::Result<Arc<dyn EventLog>> {
        let config = NatsConfig {
            url: self.nats_url.clone(),
            stream: self.stream.clone(),
            subject_prefix: self.subject_prefix.clone(),
            replicas: self.replicas,
            ..NatsConfig::default()
        };
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
        let mut pause = std::time::Duration::from_millis(500);
        loop {
            match NatsLog::connect(config.clone()).await {
                Ok(log) => return Ok(Arc::new(log)),
                Err(e @ meridian_eventlog::LogError::Unavailable(_))
                    if tokio::time::Instant::now() + pause < deadline =>
                {
                    tracing::warn!(url = %self.nats_url, error = %e, retry_in = ?pause, "the event log is not available yet");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(5));
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("connecting to the event log at {}", self.nats_url)
                    })
                }
            }
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct Database {
    /// PostgreSQL database for read models (also takes sqlite://PATH).
    #[arg(
        long,
        env = "MERIDIAN_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meridian"
    )]
    pub database_url: String,
}

impl Database {
    async fn store(&self) -> anyhow::Result<Store> {
        Store::connect(&self.database_url)
            .await
            .with_context(|| format!("connecting to the database {}", self.database_url))
    }
}

/// `meridian server [--ops-listen ADDR] SERVICE`.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// Serve /healthz, /readyz and /metrics (Prometheus text format) on this address,
    /// e.g. 127.0.0.1:9464: liveness, readiness (the log answers and each read model is
    /// caught up) and figures for monitoring. See docs/running.md.
    #[arg(long, global = true, env = "MERIDIAN_OPS_LISTEN", value_name = "ADDR")]
    pub ops_listen: Option<SocketAddr>,
    #[command(subcommand)]
    pub which: Server,
}

#[derive(Debug, clap::Subcommand)]
pub enum Server {
    /// The federation API and its status read model.
    Intake {
        #[command(flatten)]
        log: Distributed,
        #[command(flatten)]
        db: Database,
        #[command(flatten)]
        api: ApiArgs,
        #[command(flatten)]
        key: CredentialKey,
        /// When FILE does not exist: issue an admin token and write it there (mode 0600),
        /// the deployment's first. An existing FILE is left as it is.
        #[arg(long, env = "MERIDIAN_ADMIN_TOKEN_FILE", value_name = "FILE")]
        admin_token_file: Option<PathBuf>,
    },
    /// Placement, and the release of each workflow's jobs.
    Router {
        #[command(flatten)]
        log: Distributed,
    },
    /// The ledger.
    Accounting {
        #[command(flatten)]
        log: Distributed,
        #[command(flatten)]
        db: Database,
    },
    /// Runs one site's jobs.
    Adapter {
        /// The site's name in the catalogue.
        #[arg(long)]
        site: String,
        /// The site's adapter kind (see below).
        #[arg(long, default_value = "local", long_help = format!("The site's adapter kind.\n\n{}", crate::adapters::help()),
              value_parser = clap::builder::PossibleValuesParser::new(crate::adapters::names()))]
        kind: String,
        /// The adapter's configuration file (YAML); required by the kinds that say so.
        #[arg(long, value_name = "FILE")]
        adapter_config: Option<PathBuf>,
        /// State directory of a local site.
        #[arg(long, env = "MERIDIAN_SITE_ROOT")]
        root: Option<PathBuf>,
        /// CPUs a local site offers (default: all of this machine's).
        #[arg(long)]
        cpus: Option<u32>,
        #[command(flatten)]
        prices: LocalPrices,
        #[command(flatten)]
        log: Distributed,
        #[command(flatten)]
        db: Database,
        #[command(flatten)]
        key: CredentialKey,
        /// The API's address as this site's jobs reach it, given to them as
        /// MERIDIAN_SERVER with their workflow credential (needs --credential-key-file).
        #[arg(long, env = "MERIDIAN_SERVER", requires = "credential_key_file")]
        server: Option<String>,
        #[command(flatten)]
        secrets: SecretsFile,
    },
}

impl Server {
    /// The service's name in traces (`meridian-router`).
    pub fn trace_name(&self) -> &'static str {
        match self {
            Server::Intake { .. } => "meridian-intake",
            Server::Router { .. } => "meridian-router",
            Server::Accounting { .. } => "meridian-accounting",
            Server::Adapter { .. } => "meridian-adapter",
        }
    }
}

/// The secrets a workflow's data steps may name for their credentials.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SecretsFile {
    /// A YAML file of named secrets that workflows' data steps may name
    /// (`credentials: NAME`): each maps the variables (AWS_*, GOOGLE_*, AZURE_*,
    /// STORAGE_EMULATOR_HOST, HF_TOKEN, HF_ENDPOINT) that stand over this process's
    /// environment for those steps. Keep it readable by Meridian alone (mode 0600); its
    /// values never enter the log.
    #[arg(long = "secrets", env = "MERIDIAN_SECRETS_FILE", value_name = "FILE")]
    pub secrets: Option<PathBuf>,
}

impl SecretsFile {
    fn load(
        &self,
    ) -> anyhow::Result<
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    > {
        let Some(path) = &self.secrets else {
            return Ok(Default::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the secrets file {}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)?.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(
                    file = %path.display(),
                    mode = format!("{:o}", mode & 0o777),
                    "the secrets file can be read by others; chmod 600 it"
                );
            }
        }
        let secrets: std::collections::BTreeMap<
            String,
            std::collections::BTreeMap<String, String>,
        > = meridian_adapter_core::registry::parse_config(&text).with_context(|| {
            format!(
                "{}: expected a map of secret names to maps of variables, e.g. \
                     `lab-s3: {{AWS_ACCESS_KEY_ID: ..., AWS_SECRET_ACCESS_KEY: ...}}`",
                path.display()
            )
        })?;
        tracing::info!(file = %path.display(), names = ?secrets.keys().collect::<Vec<_>>(), "secrets loaded");
        Ok(secrets)
    }
}

/// The key workflow credentials are made and checked with.
#[derive(Debug, Clone, clap::Args)]
pub struct CredentialKey {
    /// The key of the workflow credentials jobs carry (64 hex digits; created, mode 0600,
    /// when absent). The intake and every adapter of a deployment share one. Without it,
    /// jobs get no credential and the API refuses workflow credentials.
    #[arg(long, env = "MERIDIAN_CREDENTIAL_KEY_FILE", value_name = "FILE")]
    pub credential_key_file: Option<PathBuf>,
}

impl CredentialKey {
    fn load(&self) -> anyhow::Result<Option<WorkflowCredentials>> {
        self.credential_key_file
            .as_deref()
            .map(|path| {
                WorkflowCredentials::load_or_create(path)
                    .with_context(|| format!("reading the credential key {}", path.display()))
            })
            .transpose()
    }
}

/// `meridian server NAME`: one service in this process.
pub async fn server(args: ServerArgs) -> anyhow::Result<()> {
    let mut tasks = Tasks::new();
    let mut ops_listener =
        match args.ops_listen {
            Some(listen) => Some(tokio::net::TcpListener::bind(listen).await.with_context(
                || format!("cannot listen on {listen} for health and metrics (--ops-listen)"),
            )?),
            None => None,
        };
    let mut ops = |ops: meridian_ops::Ops, tasks: &mut Tasks| {
        if let Some(listener) = ops_listener.take() {
            tasks.ops(listener, ops);
        }
    };
    match args.which {
        Server::Intake {
            log,
            db,
            api,
            key,
            admin_token_file,
        } => {
            api.check()?;
            let (log, store) = (log.log().await?, db.store().await?);
            let mut app = meridian_app::App::new(log, store);
            if let Some(credentials) = key.load()? {
                app = app.with_workflow_credentials(credentials);
            }
            // A file left from another deployment (a log started afresh) holds a token
            // no one here knows: say so rather than leave its holder with a bare 401.
            if let Some(path) = admin_token_file.as_ref().filter(|p| p.exists()) {
                let token = std::fs::read_to_string(path).unwrap_or_default();
                if !app.knows_token(&token).await.unwrap_or(true) {
                    tracing::warn!(
                        path = %path.display(),
                        "the admin token in this file is not one of this deployment's (a file left \
                         from another?); it is left as it is: delete it and restart to have a new \
                         one written"
                    );
                }
            }
            if let Some(path) = admin_token_file.filter(|p| !p.exists()) {
                let issued = app
                    .issue_first_admin("meridian server intake")
                    .await
                    .context("issuing the first admin token")?;
                meridian_app::auth::write_private(&path, &format!("{}\n", issued.token))
                    .with_context(|| format!("writing {}", path.display()))?;
                tracing::info!(path = %path.display(), "wrote the first admin token");
            }
            let listen = api.listen;
            let store = app.store().clone();
            let workflows = workflows_probe(store.clone());
            ops(
                meridian_ops::Ops::new("intake", app.log().clone())
                    .projection(store, meridian_intake::PROJECTION_NAME)
                    .probe(workflows),
                &mut tasks,
            );
            tasks.intake(app, bind(listen).await?, api.tls()?);
            tracing::info!(%listen, "intake is up");
        }
        Server::Router { log } => {
            let log = log.log().await?;
            ops(meridian_ops::Ops::new("router", log.clone()), &mut tasks);
            tasks.router(log);
        }
        Server::Accounting { log, db } => {
            let (log, store) = (log.log().await?, db.store().await?);
            ops(
                meridian_ops::Ops::new("accounting", log.clone())
                    .projection(store.clone(), meridian_accounting::NAME),
                &mut tasks,
            );
            tasks.accounting(log, store);
        }
        Server::Adapter {
            site,
            kind,
            adapter_config,
            root,
            cpus,
            prices,
            log,
            db,
            key,
            server,
            secrets,
        } => {
            let call_back = match (key.load()?, server) {
                (Some(credentials), Some(server)) => Some(call_back(&server, credentials)),
                (Some(_), None) => bail!(
                    "--credential-key-file needs --server: the API's address as this site's jobs reach it"
                ),
                _ => None,
            };
            if kind != "local" {
                let (log, store) = (log.log().await?, db.store().await?);
                require_site(&*log, &site).await?;
                let adapter = crate::adapters::build(
                    &kind,
                    adapter_config.as_deref(),
                    root.as_deref().unwrap_or(Path::new(".")),
                    &store,
                )?;
                let roots = adapter.volume_root().map(|r| (site.clone(), r));
                tasks.datamover(
                    log.clone(),
                    roots.into_iter().collect(),
                    Some(vec![site.clone()]),
                    secrets.load()?,
                );
                ops(meridian_ops::Ops::new("adapter", log.clone()), &mut tasks);
                tasks.site(&site, adapter, log, store, call_back);
                return tasks.wait().await;
            }
            // A local site's configuration file (as `meridian up --adapter NAME=local:FILE`
            // takes) when given; --root and --cpus stand over it.
            let mut config = match &adapter_config {
                Some(path) => {
                    let text = std::fs::read_to_string(path).with_context(|| {
                        format!("cannot read the adapter configuration {}", path.display())
                    })?;
                    meridian_adapter_core::registry::parse_config::<LocalConfig>(&text)
                        .with_context(|| format!("{}", path.display()))?
                }
                None => LocalConfig::new(PathBuf::new()),
            };
            if let Some(root) = root {
                config.root = root;
            } else if config.root == LocalConfig::default().root
                || config.root.as_os_str().is_empty()
            {
                config.root = PathBuf::from("meridian-data").join("sites").join(&site);
            }
            let _lock = lock_data_dir(&config.root)?;
            if let Some(cpus) = cpus {
                config.cpus = cpus;
            }
            let (log, store) = (log.log().await?, db.store().await?);
            let (cpus, memory) = (config.cpus, config.memory_bytes);
            let adapter = Arc::new(LocalAdapter::new(config)?);
            let gpus = adapter.config().gpus.clone();
            ensure_local_site(&*log, &site, cpus, memory, &gpus, &prices).await?;
            let roots = adapter.volume_root().map(|r| (site.clone(), r));
            tasks.datamover(
                log.clone(),
                roots.into_iter().collect(),
                Some(vec![site.clone()]),
                secrets.load()?,
            );
            ops(meridian_ops::Ops::new("adapter", log.clone()), &mut tasks);
            tasks.site(&site, adapter, log, store, call_back);
            // Keep the lock for as long as the site runs.
            let result = tasks.wait().await;
            drop(_lock);
            return result;
        }
    }
    tasks.wait().await
}
