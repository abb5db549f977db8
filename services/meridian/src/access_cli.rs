//! `meridian admin token ...` and `meridian audit`: tokens and the audit trail, through
//! the API (admins only).

use anyhow::{bail, Context};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use meridian_app::audit::AuditList;
use meridian_app::auth::{IssuedTokenSecret, TokenList, TokenView};
use serde_json::json;
use uuid::Uuid;

use crate::client::{json, table, Client, ServerArg};
use crate::Output;

#[derive(clap::Subcommand)]
pub enum TokenVerb {
    /// Issue a token; prints it once on standard output (Meridian keeps only its hash).
    ///
    /// Roles: researcher (its tenant's workflows and bills), finance (bills, exports and
    /// prices: of its tenant, or of every tenant without --tenant), admin (everything),
    /// agent (reads like a researcher; writes only what --grant names).
    Create {
        /// The tenant it acts in; required for researcher and agent.
        #[arg(long)]
        tenant: Option<String>,
        /// researcher, finance, admin or agent.
        #[arg(long)]
        role: String,
        /// For an agent: a write action it may do (submit, cancel). Repeatable.
        #[arg(long = "grant", value_name = "ACTION")]
        grants: Vec<String>,
        /// When it stops holding: a span from now (90m, 12h, 30d) or a date or time
        /// (2027-01-01, RFC 3339, UTC). Default: never.
        #[arg(long)]
        expires: Option<String>,
        /// What it is for; the name it acts under in the log.
        #[arg(long)]
        label: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// List every token issued (never their values).
    List {
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Revoke a token: it is refused from now on.
    Revoke {
        id: Uuid,
        #[command(flatten)]
        server: ServerArg,
    },
}

#[derive(clap::Args)]
pub struct AuditArgs {
    /// Only this tenant's records.
    #[arg(long)]
    tenant: Option<String>,
    /// Only records since then: a span back from now (90m, 12h, 7d) or a date or time.
    #[arg(long)]
    since: Option<String>,
    /// At most this many records.
    #[arg(long, default_value_t = 100)]
    limit: u32,
    #[arg(long, short, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(flatten)]
    server: ServerArg,
}

/// A span (`30d`, `12h`, `90m`) or a date (`2027-01-01`) or an RFC 3339 time.
fn when(flag: &str, text: &str, ahead: bool) -> anyhow::Result<DateTime<Utc>> {
    let span = |n: &str, unit: fn(i64) -> Duration| -> Option<Duration> {
        n.parse::<i64>().ok().filter(|n| *n > 0).map(unit)
    };
    let parsed = if let Some(n) = text.strip_suffix('d') {
        span(n, Duration::days)
    } else if let Some(n) = text.strip_suffix('h') {
        span(n, Duration::hours)
    } else if let Some(n) = text.strip_suffix('m') {
        span(n, Duration::minutes)
    } else {
        None
    };
    if let Some(span) = parsed {
        return Ok(if ahead {
            Utc::now() + span
        } else {
            Utc::now() - span
        });
    }
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(date.and_hms_opt(0, 0, 0).expect("midnight").and_utc());
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .with_context(|| {
            format!("{flag} {text:?}: expected a span (90m, 12h, 30d), a date (2027-01-01) or an RFC 3339 time")
        })
}

fn row(t: &TokenView) -> Vec<String> {
    vec![
        t.id.to_string(),
        t.role.to_string(),
        t.tenant.clone().unwrap_or_else(|| "(every)".into()),
        t.grants
            .iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(","),
        t.expires_at
            .map(|e| e.format("%Y-%m-%d %H:%M").to_string())
            .unwrap_or_else(|| "never".into()),
        if t.revoked { "revoked" } else { "active" }.into(),
        t.label.clone().unwrap_or_default(),
    ]
}

pub async fn token(verb: TokenVerb) -> anyhow::Result<i32> {
    match verb {
        TokenVerb::Create {
            tenant,
            role,
            grants,
            expires,
            label,
            server,
        } => {
            let role: meridian_app::Role =
                role.parse().map_err(|e| anyhow::anyhow!("--role: {e}"))?;
            let grants = grants
                .iter()
                .map(|g| g.parse::<meridian_app::Grant>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow::anyhow!("--grant: {e}"))?;
            let expires_at = expires
                .as_deref()
                .map(|e| when("--expires", e, true))
                .transpose()?;
            let answer = server
                .client()?
                .post(
                    "/v1/tokens",
                    Some(json!({
                        "tenant": tenant,
                        "role": role,
                        "grants": grants,
                        "expires_at": expires_at,
                        "label": label,
                    })),
                )
                .await?;
            let issued: IssuedTokenSecret = Client::decode(answer, "POST /v1/tokens")?;
            let v = &issued.view;
            eprintln!(
                "issued token {} ({} in {}); it is shown once, below: keep it safe",
                v.id,
                v.role,
                v.tenant.as_deref().unwrap_or("every tenant")
            );
            println!("{}", issued.token);
            Ok(0)
        }
        TokenVerb::List { output, server } => {
            let list: TokenList = server.client()?.get_as("/v1/tokens").await?;
            match output {
                Output::Json => json(&list),
                Output::Table => table(
                    &[
                        "ID", "ROLE", "TENANT", "GRANTS", "EXPIRES", "STATE", "LABEL",
                    ],
                    &list.tokens.iter().map(row).collect::<Vec<_>>(),
                ),
            }
            Ok(0)
        }
        TokenVerb::Revoke { id, server } => {
            server
                .client()?
                .post(&format!("/v1/tokens/{id}/revoke"), None)
                .await?;
            println!("{id}: revoked");
            Ok(0)
        }
    }
}

pub async fn audit(args: AuditArgs) -> anyhow::Result<i32> {
    let mut query = vec![format!("limit={}", args.limit)];
    if let Some(t) = &args.tenant {
        query.push(format!("tenant={t}"));
    }
    if let Some(s) = &args.since {
        let since = when("--since", s, false)?;
        query.push(format!(
            "since={}",
            since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    if args.limit == 0 {
        bail!("--limit: expected at least 1");
    }
    let list: AuditList = args
        .server
        .client()?
        .get_as(&format!("/v1/audit?{}", query.join("&")))
        .await?;
    match args.output {
        Output::Json => json(&list),
        Output::Table => table(
            &[
                "AT", "OUTCOME", "ACTION", "TARGET", "ROLE", "TENANT", "TOKEN", "FROM", "DETAIL",
            ],
            &list
                .records
                .iter()
                .map(|r| {
                    vec![
                        r.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                        serde_json::to_value(r.outcome)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default(),
                        r.action.clone(),
                        r.target.clone(),
                        r.role.clone().unwrap_or_else(|| "-".into()),
                        r.tenant.clone().unwrap_or_else(|| "-".into()),
                        r.token_id
                            .map(|t| t.to_string())
                            .unwrap_or_else(|| "-".into()),
                        r.source.clone().unwrap_or_else(|| "-".into()),
                        r.detail.clone().unwrap_or_default(),
                    ]
                })
                .collect::<Vec<_>>(),
        ),
    }
    Ok(0)
}

/// Sets all of a tenant's limits at once: a limit left out is lifted.
#[derive(clap::Args)]
pub struct BudgetSetArgs {
    #[arg(long)]
    tenant: String,
    /// The most the tenant's workflows may cost in one calendar month (UTC), billed and in
    /// flight together, e.g. "1000 USD". Leave it out to lift the budget.
    #[arg(long, value_name = "AMOUNT CURRENCY")]
    money_per_month: Option<String>,
    /// The most of the tenant's workflows placed at once; more wait in submission order,
    /// with the reason in `meridian status`. Leave it out for no limit.
    #[arg(long, value_name = "N")]
    concurrent_workflows: Option<u32>,
    /// The most GPUs the tenant's running jobs and services may hold at once; a task that
    /// would pass it waits. Leave it out for no limit.
    #[arg(long, value_name = "N")]
    concurrent_gpus: Option<u32>,
    /// The most GPU-hours the tenant's workflows may hold in one calendar month (UTC),
    /// used and in flight together; a submission that would pass it is refused.
    #[arg(long, value_name = "HOURS")]
    gpu_hours_per_month: Option<String>,
    #[command(flatten)]
    server: ServerArg,
}

fn print_budget(view: &meridian_app::budgets::BudgetView) {
    if let Some(n) = view.concurrent_workflows {
        println!("{}: at most {n} workflows placed at once", view.tenant);
    }
    if let Some(n) = view.concurrent_gpus {
        println!("{}: at most {n} GPUs in use at once", view.tenant);
    }
    if let Some(budget) = &view.gpu_hours_per_month {
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        println!(
            "{}: {budget} GPU-hours in {}: {} used, {} in flight, {} left",
            view.tenant,
            view.month,
            dash(&view.gpu_hours_used),
            dash(&view.gpu_hours_in_flight),
            dash(&view.gpu_hours_left)
        );
    }
    match &view.money_per_month {
        None => println!("{}: no monthly budget", view.tenant),
        Some(budget) => {
            let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            table(
                &["TENANT", "MONTH", "BUDGET", "BILLED", "IN FLIGHT", "LEFT"],
                &[vec![
                    view.tenant.clone(),
                    view.month.clone(),
                    budget.clone(),
                    dash(&view.spent),
                    dash(&view.in_flight),
                    dash(&view.left),
                ]],
            );
        }
    }
}

/// `meridian admin budget --tenant T [--money-per-month "1000 USD"] [--concurrent-workflows N]`.
pub async fn set_budget(args: BudgetSetArgs) -> anyhow::Result<i32> {
    let answer = args
        .server
        .client()?
        .put(
            &format!("/v1/tenants/{}/budget", args.tenant),
            json!({
                "money_per_month": args.money_per_month,
                "concurrent_workflows": args.concurrent_workflows,
                "concurrent_gpus": args.concurrent_gpus,
                "gpu_hours_per_month": args.gpu_hours_per_month,
            }),
        )
        .await?;
    let view: meridian_app::budgets::BudgetView =
        Client::decode(answer, "PUT /v1/tenants/{tenant}/budget")?;
    print_budget(&view);
    Ok(0)
}

/// `meridian budget --tenant T`: the month's budget, billed, in flight and left.
pub async fn show_budget(c: &Client, tenant: &str, output: Output) -> anyhow::Result<i32> {
    let view: meridian_app::budgets::BudgetView =
        c.get_as(&format!("/v1/tenants/{tenant}/budget")).await?;
    match output {
        Output::Json => json(&view),
        Output::Table => print_budget(&view),
    }
    Ok(0)
}
