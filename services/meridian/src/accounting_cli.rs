//! The accounting and tenant verbs: `bill` (one workflow), `bills` (a tenant's month),
//! `export focus`, the tenant price adjustments (`admin discount`, `admin committed-rate`,
//! `admin revoke-adjustment`, `admin adjustments`) and placement policies (`admin
//! policy`) through the API; only `admin rebuild accounting`, which runs with the
//! server stopped, works on the log and the database directly, embedded (`--data-dir`)
//! or distributed (`--nats-url`, `--database-url`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{bail, Context};
use chrono::{DateTime, NaiveDate, Utc};
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::tenant::valid_tenant_name;
use meridian_events::vocabulary::tenant::{
    AdjustmentScope, AdjustmentTerms, ChargeKind, Meter, PlacementPolicy,
};
use meridian_events::{Currency, Money, SiteKind};
use meridian_store::Store;
use rust_decimal::Decimal;
use serde_json::Value;
use uuid::Uuid;

use crate::client::{json, table, Client, ServerArg};
use crate::{Output, Remote};
use meridian_app::tenants::{AdjustmentList, AdjustmentView, PolicyDocument, TenantPolicy};

// ---------------------------------------------------------------------------------
// Bills and exports, through the API.

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("-")
}

fn items(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Totals by category and by site, then per currency: list and billed side by side.
/// How many decimal places tables show: enough to see a fraction of a cent on a
/// second's run, few enough to read. `--output json` has the exact decimals.
const SHOWN_PLACES: u32 = 6;

/// An exact decimal (as the API writes it) rounded for reading; text that is not a
/// decimal is shown as it is.
fn readable(text: &str) -> String {
    match Decimal::from_str(text) {
        Ok(d) => d.round_dp(SHOWN_PLACES).normalize().to_string(),
        Err(_) => text.to_string(),
    }
}

fn print_totals(bill: &Value) {
    let rows = |key: &str, name: &str| -> Vec<Vec<String>> {
        items(bill, key)
            .iter()
            .map(|t| {
                vec![
                    s(t, name).to_string(),
                    s(t, "currency").to_string(),
                    readable(s(t, "list_amount")),
                    readable(s(t, "amount")),
                ]
            })
            .collect()
    };
    println!();
    table(
        &["CATEGORY", "CURRENCY", "LIST", "BILLED"],
        &rows("by_category", "category"),
    );
    println!();
    table(
        &["SITE", "CURRENCY", "LIST", "BILLED"],
        &rows("by_site", "site"),
    );
    println!();
    for t in items(bill, "totals") {
        println!(
            "total {} {} (list {})",
            readable(s(&t, "amount")),
            s(&t, "currency"),
            readable(s(&t, "list_amount"))
        );
    }
    println!(
        "(shown to {SHOWN_PLACES} decimal places; the ledger keeps exact amounts, in --output json, never summed across currencies; ledger position {})",
        bill.get("as_of_position").and_then(Value::as_u64).unwrap_or(0)
    );
}

/// `meridian bill ID`: every line (each run, attempt and site), then totals by category
/// and site.
pub async fn bill(server: &str, id: &str, output: Output) -> anyhow::Result<i32> {
    let c = Client::new(server)?;
    let bill = c.get(&format!("/v1/workflows/{id}/bill")).await?;
    match output {
        Output::Json => json(&bill),
        Output::Table => {
            let rows: Vec<Vec<String>> = items(&bill, "lines")
                .iter()
                .map(|l| {
                    let run = match (l.get("job").and_then(Value::as_str), l.get("attempt")) {
                        (Some(job), Some(Value::Number(a))) => {
                            let index = l
                                .get("index")
                                .and_then(Value::as_i64)
                                .map_or(String::new(), |i| format!("[{i}]"));
                            format!("{job}{index} #{a}")
                        }
                        _ => s(l, "resource_name").to_string(),
                    };
                    vec![
                        s(l, "period").to_string(),
                        s(l, "category").to_string(),
                        s(l, "site").to_string(),
                        run,
                        format!("{} {}", readable(s(l, "quantity")), s(l, "unit")),
                        readable(s(l, "contracted_unit_price")),
                        format!("{} {}", readable(s(l, "amount")), s(l, "currency")),
                    ]
                })
                .collect();
            table(
                &[
                    "PERIOD",
                    "CATEGORY",
                    "SITE",
                    "WHAT",
                    "QUANTITY",
                    "UNIT PRICE",
                    "AMOUNT",
                ],
                &rows,
            );
            print_totals(&bill);
        }
    }
    Ok(0)
}

#[derive(clap::Args)]
pub struct BillsArgs {
    /// The month, YYYY-MM (UTC).
    #[arg(long)]
    period: String,
    #[command(flatten)]
    remote: Remote,
}

/// `meridian bills --tenant T --period YYYY-MM`: a tenant's month.
pub async fn bills(args: BillsArgs) -> anyhow::Result<i32> {
    let Some(tenant) = args.remote.tenant.as_deref() else {
        bail!("--tenant is required: whose bills (or set MERIDIAN_TENANT)");
    };
    let c = Client::new(&args.remote.url())?.for_tenant(Some(tenant));
    let bill = c
        .get(&format!(
            "/v1/tenants/{tenant}/bills?period={}",
            args.period
        ))
        .await?;
    match args.remote.output {
        Output::Json => json(&bill),
        Output::Table => {
            println!(
                "tenant {}, {} ({} to {}), {} lines",
                s(&bill, "tenant"),
                s(&bill, "period"),
                s(&bill, "billing_period_start"),
                s(&bill, "billing_period_end"),
                bill.get("lines").and_then(Value::as_u64).unwrap_or(0)
            );
            println!();
            let rows: Vec<Vec<String>> = items(&bill, "workflows")
                .iter()
                .map(|w| {
                    vec![
                        s(w, "workflow_id").to_string(),
                        s(w, "currency").to_string(),
                        readable(s(w, "list_amount")),
                        readable(s(w, "amount")),
                        w.get("lines").map_or(String::new(), Value::to_string),
                    ]
                })
                .collect();
            table(&["WORKFLOW", "CURRENCY", "LIST", "BILLED", "LINES"], &rows);
            print_totals(&bill);
        }
    }
    Ok(0)
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Csv,
    Json,
}

#[derive(clap::Subcommand)]
pub enum Export {
    /// A month's charges as FinOps FOCUS 1.2 rows (CSV or JSON), one per ledger line.
    ///
    /// The same ledger always gives the same bytes. Quantities are rounded to 10
    /// decimal places and costs computed from them exactly (see docs/accounting.md).
    Focus {
        /// The billing period, YYYY-MM (UTC).
        #[arg(long)]
        period: String,
        /// Only this tenant's charges.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, value_enum, default_value_t = Format::Csv)]
        format: Format,
        /// Write to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// `meridian export focus`: fetches the export and writes it as it came, byte for byte.
pub async fn export(which: Export) -> anyhow::Result<i32> {
    let Export::Focus {
        period,
        tenant,
        format,
        out,
        server,
    } = which;
    let client = server.client()?;
    let mut url = format!(
        "/v1/exports/focus?period={period}&format={}",
        match format {
            Format::Csv => "csv",
            Format::Json => "json",
        }
    );
    if let Some(t) = &tenant {
        url.push_str(&format!("&tenant={t}"));
    }
    let response = client
        .send_raw(
            client
                .http()
                .get(client.url(&url))
                .timeout(std::time::Duration::from_secs(300)),
        )
        .await?;
    let status = response.status();
    let position = response
        .headers()
        .get(meridian_intake::LEDGER_POSITION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    let body = response.bytes().await.context("reading the export")?;
    if !status.is_success() {
        let answer = serde_json::from_slice::<Value>(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        return Err(client.explain(status, &answer));
    }
    match out {
        Some(path) => {
            std::fs::write(&path, &body)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "wrote the FOCUS export of {period} to {} (ledger position {position})",
                path.display()
            );
        }
        None => {
            use std::io::Write;
            std::io::stdout()
                .write_all(&body)
                .context("writing the export")?;
        }
    }
    Ok(0)
}

// ---------------------------------------------------------------------------------
// Administration, against the log and the database directly.

/// Where the log is.
#[derive(Clone, clap::Args)]
pub struct Target {
    /// Embedded: the data directory of `meridian up`.
    #[arg(long, conflicts_with = "nats_url")]
    data_dir: Option<PathBuf>,
    /// Distributed: the NATS server holding the log.
    #[arg(long)]
    nats_url: Option<String>,
    /// JetStream stream that holds the log.
    #[arg(long, default_value = "MERIDIAN_EVENTS")]
    stream: String,
    /// Subject prefix of the log's stream.
    #[arg(long, default_value = "meridian.events")]
    subject_prefix: String,
}

/// Where the log and the ledger are.
#[derive(Clone, clap::Args)]
pub struct RebuildTarget {
    #[command(flatten)]
    log: Target,
    /// Distributed: the PostgreSQL database of the read models.
    #[arg(long, conflicts_with = "data_dir")]
    database_url: Option<String>,
}

impl Target {
    fn embedded_log_path(dir: &Path) -> anyhow::Result<PathBuf> {
        let path = dir.join("events.sqlite");
        if !path.is_file() {
            bail!(
                "{} holds no Meridian event log (events.sqlite); give the --data-dir of `meridian up`",
                dir.display()
            );
        }
        Ok(path)
    }

    async fn log(&self) -> anyhow::Result<Arc<dyn EventLog>> {
        match (&self.data_dir, &self.nats_url) {
            (Some(dir), _) => {
                let path = Self::embedded_log_path(dir)?;
                Ok(Arc::new(
                    SqliteLog::open(&path)
                        .await
                        .with_context(|| format!("opening {}", path.display()))?,
                ))
            }
            (None, Some(url)) => Ok(Arc::new(
                NatsLog::connect(NatsConfig {
                    url: url.clone(),
                    stream: self.stream.clone(),
                    subject_prefix: self.subject_prefix.clone(),
                    ..NatsConfig::default()
                })
                .await
                .with_context(|| format!("connecting to the event log at {url}"))?,
            )),
            (None, None) => bail!(
                "say where the log is: --data-dir DIR (embedded) or --nats-url URL (distributed)"
            ),
        }
    }
}

#[derive(clap::Subcommand)]
pub enum Admin {
    /// Create every table of Meridian's services in the database (read models, ledger,
    /// job output, run reports, idempotency keys, audit trail), then exit. Services create
    /// their own at start too; this lets a deployment do it first, once, with a role
    /// that may create tables, and run the services with one that may not.
    Migrate {
        /// The database (PostgreSQL, or sqlite://PATH).
        #[arg(long, env = "MERIDIAN_DATABASE_URL")]
        database_url: String,
    },
    /// Drop a read model and rebuild it from the log.
    #[command(subcommand)]
    Rebuild(Rebuild),
    /// Grant a tenant a percent discount off list prices, from now or a later date.
    Discount {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Percent off list, more than 0 and at most 100.
        #[arg(long)]
        percent: String,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Grant a tenant a committed unit price for one meter (e.g. GPU-hours at a site).
    CommittedRate {
        #[command(flatten)]
        scope: ScopeArgs,
        /// What is priced: instance-hours, core-hours, memory-gib-hours, gpu-hours,
        /// storage-gib-hours or egress-gb.
        #[arg(long)]
        meter: String,
        /// The unit price, e.g. 1.80.
        #[arg(long)]
        price: String,
        /// Its currency; it applies only to lines billed in this currency.
        #[arg(long)]
        currency: String,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// End an adjustment from now (or a later date); what was billed stays billed.
    RevokeAdjustment {
        #[arg(long)]
        tenant: String,
        /// The adjustment's id (see `meridian admin adjustments`).
        id: Uuid,
        /// When it stops applying (YYYY-MM-DD or RFC 3339, UTC); default now.
        #[arg(long)]
        at: Option<String>,
        #[arg(long, default_value = "admin")]
        by: String,
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// List a tenant's adjustments.
    Adjustments {
        #[arg(long)]
        tenant: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Set or show where a tenant's work may run (on top of each workflow's hints).
    #[command(subcommand)]
    Policy(PolicyVerb),
    /// Issue, list and revoke API tokens.
    #[command(subcommand)]
    Token(crate::access_cli::TokenVerb),
    /// Set a tenant's limits, all at once (a limit left out is lifted): monthly money and
    /// GPU-hour budgets (submissions that would pass them are refused with the numbers),
    /// concurrent workflows and GPUs (more wait).
    Budget(crate::access_cli::BudgetSetArgs),
}

#[derive(clap::Subcommand)]
pub enum PolicyVerb {
    /// Replace the tenant's placement policy. The stricter of it and a workflow's own
    /// `placement` hints applies to every placement from now on; workflows already
    /// placed stay where they are. With no limits given, the tenant may go anywhere.
    Set {
        #[arg(long)]
        tenant: String,
        /// A site the tenant may use (repeat for more); none: any site.
        #[arg(long = "site")]
        sites: Vec<String>,
        /// A region the tenant may use (repeat for more); none: any region.
        #[arg(long = "region")]
        regions: Vec<String>,
        /// The jurisdiction its data must stay in, such as eu.
        #[arg(long)]
        residency: Option<String>,
        /// The most one workflow's estimate may be, such as "500 USD".
        #[arg(long)]
        budget_per_workflow: Option<String>,
        /// Never run on spot capacity, even when a workflow asks.
        #[arg(long)]
        no_spot: bool,
        /// Never split a workflow across sites, even when it asks.
        #[arg(long)]
        no_split: bool,
        #[arg(long, default_value = "admin")]
        by: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Show the tenant's placement policy.
    Show {
        #[arg(long)]
        tenant: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

#[derive(clap::Subcommand)]
pub enum Rebuild {
    /// The ledger: drops it and replays the whole log into it. Embedded: with
    /// `meridian up` stopped. Distributed: stop `meridian server accounting` first so
    /// that the rebuild writes every page itself, at full speed (one left up bills
    /// nothing twice and follows the rebuild; see docs/accounting.md).
    Accounting {
        #[command(flatten)]
        target: RebuildTarget,
    },
}

#[derive(clap::Args)]
pub struct ScopeArgs {
    /// The tenant.
    #[arg(long)]
    tenant: String,
    /// Only charges at this site.
    #[arg(long, conflicts_with = "site_kind")]
    site: Option<String>,
    /// Only charges at sites of this kind (slurm, pbs, kubernetes, aws, ...).
    #[arg(long)]
    site_kind: Option<String>,
    /// Only this kind of charge: compute, storage or egress.
    #[arg(long)]
    category: Option<String>,
}

#[derive(clap::Args)]
pub struct GrantArgs {
    /// When it starts (YYYY-MM-DD for midnight UTC, or RFC 3339); default now. Never in
    /// the past: what was billed is never re-priced.
    #[arg(long)]
    from: Option<String>,
    /// When it ends (exclusive); default never.
    #[arg(long)]
    until: Option<String>,
    /// A contract or ticket reference, kept with the adjustment.
    #[arg(long)]
    reference: Option<String>,
    /// Who grants it.
    #[arg(long, default_value = "admin")]
    by: String,
    #[command(flatten)]
    server: ServerArg,
}

fn parse_time(flag: &str, text: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map(|d| d.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc())
        .map_err(|_| {
            anyhow::anyhow!("--{flag} {text:?}: expected a date (2026-12-01) or an RFC 3339 time")
        })
}

fn decimal(flag: &str, text: &str) -> anyhow::Result<Decimal> {
    Decimal::from_str(text)
        .map_err(|_| anyhow::anyhow!("--{flag} {text:?}: expected a decimal such as 12.5"))
}

fn scope(args: &ScopeArgs) -> anyhow::Result<AdjustmentScope> {
    if !valid_tenant_name(&args.tenant) {
        bail!(
            "--tenant {:?}: expected 1 to 63 of a-z, 0-9, '-', '_'",
            args.tenant
        );
    }
    let site_kind = args
        .site_kind
        .as_deref()
        .map(|k| {
            serde_json::from_value::<SiteKind>(Value::String(k.to_string())).map_err(|_| {
                anyhow::anyhow!(
                    "--site-kind {k:?}: expected one of local, slurm, pbs, kubernetes, coreweave, aws, gcp, azure, oci"
                )
            })
        })
        .transpose()?;
    let charge = args
        .category
        .as_deref()
        .map(|c| {
            ChargeKind::parse(c).ok_or_else(|| {
                anyhow::anyhow!("--category {c:?}: expected compute, storage or egress")
            })
        })
        .transpose()?;
    Ok(AdjustmentScope {
        site: args.site.clone(),
        site_kind,
        charge,
    })
}

async fn grant(
    scope_args: &ScopeArgs,
    terms: AdjustmentTerms,
    args: &GrantArgs,
) -> anyhow::Result<i32> {
    let scope = scope(scope_args)?;
    let from = args
        .from
        .as_deref()
        .map(|t| parse_time("from", t))
        .transpose()?;
    let until = args
        .until
        .as_deref()
        .map(|t| parse_time("until", t))
        .transpose()?;
    let tenant = &scope_args.tenant;
    let answer = args
        .server
        .client()?
        .acting_as(&args.by)
        .post(
            &format!("/v1/tenants/{tenant}/adjustments"),
            Some(serde_json::json!({
                "scope": scope,
                "terms": terms,
                "effective_from": from,
                "effective_until": until,
                "reference": args.reference,
            })),
        )
        .await
        .map_err(|e| e.context("nothing was recorded"))?;
    let granted: AdjustmentView = Client::decode(answer, "the grant")?;
    println!(
        "{}: {} of tenant {tenant}, from {}{}",
        granted.id,
        granted.description,
        time(granted.effective_from),
        granted
            .effective_until
            .map_or(String::new(), |u| format!(" until {}", time(u)))
    );
    Ok(0)
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn meter(text: &str) -> anyhow::Result<Meter> {
    Meter::parse(&text.replace('-', "_")).ok_or_else(|| {
        anyhow::anyhow!(
            "--meter {text:?}: expected instance-hours, core-hours, memory-gib-hours, gpu-hours, storage-gib-hours or egress-gb"
        )
    })
}

/// `meridian admin ...`.
pub async fn admin(which: Admin) -> anyhow::Result<i32> {
    match which {
        Admin::Migrate { database_url } => migrate(&database_url).await,
        Admin::Rebuild(Rebuild::Accounting { target }) => rebuild(target).await,
        Admin::Token(verb) => crate::access_cli::token(verb).await,
        Admin::Budget(args) => crate::access_cli::set_budget(args).await,
        Admin::Discount {
            scope,
            percent,
            grant: args,
        } => {
            let terms = AdjustmentTerms::PercentDiscount {
                percent: decimal("percent", &percent)?,
            };
            grant(&scope, terms, &args).await
        }
        Admin::CommittedRate {
            scope,
            meter: m,
            price,
            currency,
            grant: args,
        } => {
            let terms = AdjustmentTerms::CommittedRate {
                meter: meter(&m)?,
                unit_price: decimal("price", &price)?,
                currency: Currency::from_str(&currency)
                    .map_err(|e| anyhow::anyhow!("--currency: {e}"))?,
            };
            grant(&scope, terms, &args).await
        }
        Admin::RevokeAdjustment {
            tenant,
            id,
            at,
            by,
            reason,
            server,
        } => {
            let at = at.as_deref().map(|t| parse_time("at", t)).transpose()?;
            server
                .client()?
                .acting_as(&by)
                .post(
                    &format!("/v1/tenants/{tenant}/adjustments/{id}/revoke"),
                    Some(serde_json::json!({"at": at, "reason": reason})),
                )
                .await
                .map_err(|e| e.context("nothing was recorded"))?;
            println!("{id}: revoked");
            Ok(0)
        }
        Admin::Policy(verb) => policy(verb).await,
        Admin::Adjustments { tenant, server } => {
            let list: AdjustmentList = server
                .client()?
                .get_as(&format!("/v1/tenants/{tenant}/adjustments"))
                .await?;
            let rows: Vec<Vec<String>> = list
                .adjustments
                .iter()
                .map(|a| {
                    vec![
                        a.id.to_string(),
                        a.terms.to_string(),
                        a.scope.to_string(),
                        time(a.effective_from),
                        a.effective_until.map_or("-".into(), time),
                        a.reference.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            table(
                &["ID", "TERMS", "SCOPE", "FROM", "UNTIL", "REFERENCE"],
                &rows,
            );
            Ok(0)
        }
    }
}

fn print_policy(tenant: &str, policy: Option<&PolicyDocument>) {
    let Some(p) = policy else {
        println!("{tenant}: no placement policy; its workflows may run anywhere their hints allow");
        return;
    };
    let list = |items: &[String]| {
        if items.is_empty() {
            "any".to_string()
        } else {
            items.join(", ")
        }
    };
    let yes_no = |b: bool| if b { "allowed" } else { "never" };
    let rows = vec![
        vec!["sites".to_string(), list(&p.sites)],
        vec!["regions".to_string(), list(&p.regions)],
        vec![
            "residency".to_string(),
            p.residency.clone().unwrap_or_else(|| "any".into()),
        ],
        vec![
            "budget per workflow".to_string(),
            p.budget_per_workflow
                .clone()
                .unwrap_or_else(|| "none".into()),
        ],
        vec!["spot".to_string(), yes_no(p.spot_allowed).to_string()],
        vec![
            "split across sites".to_string(),
            yes_no(p.split_allowed).to_string(),
        ],
    ];
    println!("placement policy of {tenant}:");
    table(&["LIMIT", "VALUE"], &rows);
}

async fn policy(verb: PolicyVerb) -> anyhow::Result<i32> {
    match verb {
        PolicyVerb::Set {
            tenant,
            sites,
            regions,
            residency,
            budget_per_workflow,
            no_spot,
            no_split,
            by,
            server,
        } => {
            if !valid_tenant_name(&tenant) {
                bail!("--tenant {tenant:?}: expected 1 to 63 of a-z, 0-9, '-', '_'");
            }
            let policy = PlacementPolicy {
                sites,
                regions,
                residency,
                budget_per_workflow: budget_per_workflow
                    .as_deref()
                    .map(|b| {
                        b.parse::<Money>()
                            .map_err(|e| anyhow::anyhow!("--budget-per-workflow {b:?}: {e}"))
                    })
                    .transpose()?,
                spot_allowed: !no_spot,
                split_allowed: !no_split,
            };
            let document = PolicyDocument::from(&policy);
            let answer = server
                .client()?
                .acting_as(&by)
                .put(
                    &format!("/v1/tenants/{tenant}/policy"),
                    serde_json::to_value(&document)?,
                )
                .await
                .map_err(|e| e.context("nothing was recorded"))?;
            let now: TenantPolicy = Client::decode(answer, "the policy")?;
            print_policy(&tenant, Some(&now.policy));
            Ok(0)
        }
        PolicyVerb::Show { tenant, server } => {
            let now: TenantPolicy = server
                .client()?
                .get_as(&format!("/v1/tenants/{tenant}/policy"))
                .await?;
            print_policy(&tenant, now.set.then_some(&now.policy));
            Ok(0)
        }
    }
}

/// `meridian admin rebuild accounting`.
async fn rebuild(target: RebuildTarget) -> anyhow::Result<i32> {
    let RebuildTarget {
        log: target,
        database_url,
    } = target;
    let (log, store, _lock) = match (&target.data_dir, &database_url, &target.nats_url) {
        (Some(dir), _, _) => {
            Target::embedded_log_path(dir)?;
            // `meridian up` holds this lock while it runs: its ledger consumer would
            // race the rebuild, and an embedded store is not meant for two processes.
            let lock = crate::run::lock_data_dir(dir)?;
            let log = target.log().await?;
            let url = format!("sqlite://{}", dir.join("meridian.sqlite").display());
            let store = Store::connect(&url)
                .await
                .with_context(|| format!("opening {url}"))?;
            (log, store, Some(lock))
        }
        (None, Some(db), Some(_)) => {
            let log = target.log().await?;
            let store = Store::connect(db)
                .await
                .with_context(|| format!("connecting to the database {db}"))?;
            (log, store, None)
        }
        _ => bail!(
            "say where Meridian keeps its data: --data-dir DIR (embedded, with `meridian up` stopped), \
             or --database-url URL and --nats-url URL (distributed)"
        ),
    };
    let head = log.head().await.context("reading the log's head")?;
    eprintln!("rebuilding the ledger from {head} log positions…");
    let started = std::time::Instant::now();
    let rebuilt = meridian_accounting::rebuild(&store, &*log)
        .await
        .context("rebuilding the ledger")?;
    println!(
        "rebuilt the ledger: {} lines, log position {}, in {:.1} s",
        rebuilt.lines,
        rebuilt.position,
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// `meridian admin migrate`: every service's tables, in one run.
async fn migrate(database_url: &str) -> anyhow::Result<i32> {
    use meridian_store::Projection;
    let store = meridian_store::Store::connect(database_url)
        .await
        .with_context(|| format!("connecting to the database {database_url}"))?;
    let steps: [(&str, Vec<&'static str>); 2] = [
        (
            "intake: idempotency keys, audit trail, status read model",
            meridian_app::schema(),
        ),
        (
            "accounting: the ledger",
            meridian_accounting::Ledger.schema().to_vec(),
        ),
    ];
    for (what, statements) in steps {
        store
            .migrate(&statements)
            .await
            .with_context(|| format!("creating the tables of {what}"))?;
        eprintln!("created (or found) the tables of {what}");
    }
    meridian_store::job_logs::migrate(&store)
        .await
        .context("creating the job output table")?;
    meridian_store::run_reports::migrate(&store)
        .await
        .context("creating the run reports table")?;
    eprintln!("created (or found) the tables of the adapters: job output, run reports");
    Ok(0)
}
