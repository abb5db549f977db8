//! Verbs about sites and placement: `quote` (price a workflow at every fitting site,
//! offline), `explain` (why a workflow went where it went), and `site` (apply a
//! catalogue file, drain, undrain, cordon and uncordon a device, list) through a running
//! Meridian's API.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use meridian_app::sites::{AppliedCatalog, SiteList};
use meridian_domain::catalog_file::{self, SiteSpec};
use meridian_domain::placement::{decide, Decision};
use meridian_eventlog::EventLog;
use meridian_events::vocabulary::workflow::{Candidate, CostTerms, SplitPlan, Verdict};
use serde_json::{json, Value};

use crate::client::{self, Client, ServerArg};
use crate::Output;

#[derive(Debug, clap::Subcommand)]
pub enum SiteVerb {
    /// Register or update the sites a catalogue file describes (new prices, shapes),
    /// through the API.
    Apply {
        file: PathBuf,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Take a site out of placement; work already there carries on.
    Drain {
        name: String,
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Put a drained site back into placement.
    Undrain {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Read the site's shapes (CPUs, memory, GPUs) from its provider again: the site's
    /// adapter does it at its next heartbeat (within 20 s) and declares what changed.
    /// Prices stay as the catalogue file has them. Sites whose adapter cannot read its
    /// provider's shapes (local, Slurm, PBS, Kubernetes) say so.
    Refresh {
        name: String,
        /// Ask, and return without waiting for the adapter.
        #[arg(long)]
        no_wait: bool,
        /// How long to wait for the adapter, in seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Take one GPU of a site (by the id `meridian site list` shows, `GPU-…`) out of its
    /// work: new jobs get other devices; a job already on it carries on. The site's
    /// health check does this by itself for a device with ECC errors, pages waiting to
    /// be retired, or thermal slowdown.
    Cordon {
        /// The site's name.
        name: String,
        /// The device's id, as `meridian site list` shows it (`GPU-…`).
        device: String,
        /// Why, shown in `meridian site list`.
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Give a cordoned GPU back to its site's work. One whose health check still finds
    /// a fault is cordoned again at the next check (within 30 s).
    Uncordon {
        /// The site's name.
        name: String,
        /// The device's id, as `meridian site list` shows it.
        device: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// The sites, with their state, whether an adapter serves them, shapes and prices,
    /// then each GPU a site reported and why it is cordoned, if it is.
    List {
        #[command(flatten)]
        server: ServerArg,
    },
}

fn load_specs(extra: Option<&Path>) -> anyhow::Result<Vec<SiteSpec>> {
    match extra {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            catalog_file::parse(&text).with_context(|| format!("in {}", path.display()))
        }
        None => Ok(catalog_file::parse(catalog_file::REFERENCE).expect("the reference parses")),
    }
}

fn verdict_text(verdict: &Verdict) -> (String, String) {
    match verdict {
        Verdict::Chosen => ("chosen".to_string(), String::new()),
        Verdict::Fitted => ("fits".to_string(), String::new()),
        Verdict::Rejected { reason } => ("rejected".to_string(), reason.clone()),
    }
}

fn cost_row(site: String, verdict: &Verdict, cost: Option<&CostTerms>) -> Vec<String> {
    let (verdict, reason) = verdict_text(verdict);
    let money = |v: rust_decimal::Decimal| v.round_dp(2).to_string();
    match cost {
        Some(cost) => vec![
            site,
            verdict,
            money(cost.compute),
            money(cost.data_in),
            money(cost.storage),
            money(cost.data_out),
            money(cost.data_between),
            cost.total()
                .map(|t| format!("{} {}", money(t.amount), t.currency))
                .unwrap_or_default(),
            reason,
        ],
        None => {
            let mut row = vec![site, verdict];
            row.extend(std::iter::repeat_n("-".to_string(), 6));
            row.push(reason);
            row
        }
    }
}

/// One row per candidate site, then one for the split plan when there is one.
fn candidate_rows(candidates: &[Candidate], split: Option<&SplitPlan>) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = candidates
        .iter()
        .map(|c| cost_row(c.site.clone(), &c.verdict, c.cost.as_ref()))
        .collect();
    if let Some(plan) = split {
        let sites = plan.sites();
        let name = if sites.is_empty() {
            "split across sites".to_string()
        } else {
            format!("split: {}", sites.join(" + "))
        };
        rows.push(cost_row(name, &plan.verdict, plan.cost.as_ref()));
    }
    rows
}

/// Where each job of a split plan runs, and the volumes it moves.
fn print_split(plan: &SplitPlan) {
    if plan.jobs.is_empty() {
        return;
    }
    println!(
        "
split plan ({}):",
        verdict_text(&plan.verdict).0
    );
    let rows: Vec<Vec<String>> = plan
        .jobs
        .iter()
        .map(|j| {
            vec![
                j.job.clone(),
                j.site.clone(),
                j.offer.clone(),
                j.compute.round_dp(2).to_string(),
            ]
        })
        .collect();
    client::table(&["JOB", "SITE", "OFFER", "COMPUTE"], &rows);
    if !plan.moves.is_empty() {
        let rows: Vec<Vec<String>> = plan
            .moves
            .iter()
            .map(|m| {
                vec![
                    m.volume.clone(),
                    m.from.clone(),
                    m.to.clone(),
                    meridian_spec::Size::from_bytes(m.bytes).to_string(),
                    m.before_job.clone(),
                    m.cost.round_dp(2).to_string(),
                ]
            })
            .collect();
        client::table(&["VOLUME", "FROM", "TO", "SIZE", "BEFORE", "COST"], &rows);
    }
}

const COLUMNS: [&str; 9] = [
    "SITE", "VERDICT", "COMPUTE", "DATA IN", "STORAGE", "DATA OUT", "BETWEEN", "TOTAL", "WHY NOT",
];

/// `meridian quote FILE`: prices a workflow at every site of a catalogue, offline.
pub fn quote(file: &Path, catalog: Option<&Path>, output: Output) -> anyhow::Result<i32> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let spec = match meridian_spec::parse(&text) {
        Ok(spec) => spec,
        Err(errors) => {
            for e in &errors.errors {
                eprintln!("{}: {e}", file.display());
            }
            bail!("{} is not a valid workflow", file.display());
        }
    };
    let sites = load_specs(catalog)?;
    let decision = decide(
        &spec,
        &catalog_file::offline_catalog(&sites),
        chrono::Utc::now(),
    );
    let (value, candidates, code) = match &decision {
        Decision::Placed(p) => (
            json!({
                "site": p.site,
                "region": p.region,
                "estimated_cost": {"amount": p.estimated_cost.amount.to_string(), "currency": p.estimated_cost.currency.to_string()},
                "job_rates": p.job_rates,
                "job_sites": p.job_sites,
                "candidates": p.explanation.candidates,
                "split": p.explanation.split,
            }),
            p.explanation.candidates.clone(),
            0,
        ),
        Decision::Rejected { rejections } | Decision::Waiting { rejections, .. } => (
            json!({"site": null, "rejections": rejections}),
            decision.candidates(),
            1,
        ),
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&value)?),
        Output::Table => {
            let split = match &decision {
                Decision::Placed(p) => p.explanation.split.as_ref(),
                Decision::Rejected { .. } | Decision::Waiting { .. } => None,
            };
            client::table(&COLUMNS, &candidate_rows(&candidates, split));
            match &decision {
                Decision::Placed(p) => {
                    let mut sites = vec![p.site.as_str()];
                    for s in p.job_sites.values() {
                        if !sites.contains(&s.as_str()) {
                            sites.push(s);
                        }
                    }
                    println!(
                        "\ncheapest: {} at {} {} (estimate over the requested walltimes)",
                        sites.join(" + "),
                        p.estimated_cost.amount.round_dp(2),
                        p.estimated_cost.currency
                    );
                    for (job, rate) in &p.job_rates {
                        let at = p.job_sites.get(job).unwrap_or(&p.site);
                        println!("  {job}: {} at {at}", rate.offer);
                    }
                    if let Some(plan) = split {
                        print_split(plan);
                    }
                }
                Decision::Rejected { .. } | Decision::Waiting { .. } => {
                    println!("\nno site can run it")
                }
            }
            if catalog.is_none() {
                eprintln!("(prices from the built-in reference catalogue: list prices with their sources, not yours; --catalog FILE for your own)");
            }
        }
    }
    Ok(code)
}

/// `meridian quote FILE --server URL`: the same, against a deployment's live catalogue.
pub async fn quote_live(
    server: &str,
    tenant: Option<&str>,
    file: &Path,
    output: Output,
) -> anyhow::Result<i32> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let c = Client::new(server)?.for_tenant(tenant);
    let quote = c.post_text("/v1/quotes", text).await?;
    let candidates: Vec<Candidate> =
        serde_json::from_value(quote["candidates"].clone()).unwrap_or_default();
    let split: Option<SplitPlan> = serde_json::from_value(quote["split"].clone()).unwrap_or(None);
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&quote)?),
        Output::Table => {
            client::table(&COLUMNS, &candidate_rows(&candidates, split.as_ref()));
            if let Some(plan) = &split {
                print_split(plan);
            }
            let waiting_for: Vec<&str> = quote["waiting_for"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match quote["site"].as_str() {
                Some(site) => println!(
                    "\ncheapest: {site} at {} {}",
                    quote["estimated_cost"].as_str().unwrap_or("-"),
                    quote["currency"].as_str().unwrap_or("")
                ),
                None if !waiting_for.is_empty() => println!(
                    "\nno connected site can run it; it would wait for {} to connect",
                    waiting_for.join(", ")
                ),
                None => println!("\nno site can run it"),
            }
            let connected: Vec<&str> = quote["connected"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            println!(
                "connected: {}",
                if connected.is_empty() {
                    "none".to_string()
                } else {
                    connected.join(", ")
                }
            );
        }
    }
    Ok(if quote["site"].is_null() { 1 } else { 0 })
}

/// `meridian explain ID`: the placement decisions recorded in a workflow's history.
pub async fn explain(c: &Client, id: &str, output: Output) -> anyhow::Result<()> {
    let events = c.get(&format!("/v1/workflows/{id}/events")).await?;
    let faults = site_faults(&events);
    let decisions: Vec<Value> = events["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            matches!(
                e["payload"]["type"].as_str(),
                Some("workflow.placement_decided.v1" | "workflow.placement_rejected.v1")
            )
        })
        .collect();
    if output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"decisions": decisions}))?
        );
        return Ok(());
    }
    if decisions.is_empty() {
        println!("{id} has not been placed yet");
    }
    let times: Vec<String> = decisions
        .iter()
        .map(|d| d["occurred_at"].as_str().unwrap_or("").to_string())
        .collect();
    for (n, d) in decisions.into_iter().enumerate() {
        // The site faults that ended this attempt: after it, before the next.
        let next = times.get(n + 1).map(String::as_str);
        let ended: Vec<&(String, String)> = faults
            .iter()
            .filter(|(at, _)| *at >= times[n] && next.is_none_or(|next| at.as_str() < next))
            .collect();
        let print_faults = || {
            for (_, fault) in &ended {
                println!("  then {fault}");
            }
        };
        let p = &d["payload"];
        let attempt = p["attempt"].as_u64().unwrap_or(1);
        let when = d["occurred_at"].as_str().unwrap_or("-");
        if p["type"] == "workflow.placement_rejected.v1" {
            println!("attempt {attempt} at {when}: no site could take it");
            let rows: Vec<Vec<String>> = p["rejections"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|r| {
                    vec![
                        r["site"].as_str().unwrap_or("-").to_string(),
                        r["reason"].as_str().unwrap_or("").to_string(),
                    ]
                })
                .collect();
            client::table(&["SITE", "WHY NOT"], &rows);
            print_faults();
            continue;
        }
        let mut sites = vec![p["site"].as_str().unwrap_or("-").to_string()];
        for s in p["job_sites"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            let s = s.as_str().unwrap_or("-").to_string();
            if !sites.contains(&s) {
                sites.push(s);
            }
        }
        let place = if sites.len() > 1 {
            format!("split across {}", sites.join(" + "))
        } else {
            format!("{} ({})", sites[0], p["region"].as_str().unwrap_or("-"))
        };
        println!(
            "attempt {attempt} at {when}: {place}, estimated {} {}",
            p["estimated_cost"]["amount"].as_str().unwrap_or("-"),
            p["estimated_cost"]["currency"].as_str().unwrap_or(""),
        );
        let candidates: Vec<Candidate> =
            serde_json::from_value(p["explanation"]["candidates"].clone()).unwrap_or_default();
        let split: Option<SplitPlan> =
            serde_json::from_value(p["explanation"]["split"].clone()).unwrap_or(None);
        client::table(&COLUMNS, &candidate_rows(&candidates, split.as_ref()));
        if let Some(plan) = &split {
            print_split(plan);
        }
        println!(
            "prices in force: {} from {} (source: {})",
            p["rate"]["offer"].as_str().unwrap_or("-"),
            p["rate"]["effective_from"].as_str().unwrap_or("-"),
            p["rate"]["source"].as_str().unwrap_or("-"),
        );
        print_faults();
    }
    Ok(())
}

/// The runs a site failed (refused, reclaimed, lost…), which send work back to
/// placement: `(when, "job J at SITE: why")`, oldest first.
fn site_faults(events: &Value) -> Vec<(String, String)> {
    let all = events["events"].as_array().cloned().unwrap_or_default();
    let name_of = |aggregate: &Value| {
        all.iter()
            .find(|e| e["aggregate"] == *aggregate && e["payload"]["type"] == "job.dispatched.v1")
            .map(|e| {
                let job = e["payload"]["job"].as_str().unwrap_or("-");
                match e["payload"]["index"].as_u64() {
                    Some(i) => format!("{job}[{i}]"),
                    None => job.to_string(),
                }
            })
            .unwrap_or_else(|| "-".into())
    };
    all.iter()
        .filter(|e| e["payload"]["type"] == "job.failed.v1")
        .filter_map(|e| {
            let reason: meridian_events::FailureReason =
                serde_json::from_value(e["payload"]["reason"].clone()).ok()?;
            reason.is_site_fault().then(|| {
                (
                    e["occurred_at"].as_str().unwrap_or("").to_string(),
                    format!(
                        "job {} at {}: {reason}",
                        name_of(&e["aggregate"]),
                        e["payload"]["site"].as_str().unwrap_or("-")
                    ),
                )
            })
        })
        .collect()
}

/// Brings the log's catalogue up to `file`: registers new sites, records changed prices,
/// shapes and data sets. Prints what it did.
pub async fn apply(log: &dyn EventLog, file: &Path) -> anyhow::Result<()> {
    let specs = load_specs(Some(file))?;
    for (site, applied) in catalog_file::apply(log, &specs, "admin").await? {
        let what = match applied {
            catalog_file::Applied::Registered => "registered",
            catalog_file::Applied::Updated => "updated",
            catalog_file::Applied::Unchanged => "unchanged",
        };
        eprintln!("{site}: {what}");
    }
    Ok(())
}

pub async fn site(verb: SiteVerb, output: Output) -> anyhow::Result<i32> {
    let who = std::env::var("USER").unwrap_or_else(|_| "admin".into());
    match verb {
        SiteVerb::Apply { file, server } => {
            // Checked here first: the same errors, with the file's name, and no round trip.
            load_specs(Some(&file))?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let answer = server
                .client()?
                .acting_as(&who)
                .put_text("/v1/sites", text)
                .await?;
            let applied: AppliedCatalog = Client::decode(answer, "PUT /v1/sites")?;
            for site in applied.sites {
                eprintln!("{}: {}", site.site, site.outcome);
            }
            Ok(0)
        }
        SiteVerb::Drain {
            name,
            reason,
            server,
        } => {
            let path = format!("/v1/sites/{}/drain", path_segment(&name));
            server
                .client()?
                .acting_as(&who)
                .post(&path, Some(json!({ "reason": reason })))
                .await?;
            println!("{name}: drained; new work goes elsewhere");
            Ok(0)
        }
        SiteVerb::Cordon {
            name,
            device,
            reason,
            server,
        } => {
            let path = format!(
                "/v1/sites/{}/devices/{}/cordon",
                path_segment(&name),
                path_segment(&device)
            );
            server
                .client()?
                .acting_as(&who)
                .post(&path, Some(json!({ "reason": reason })))
                .await?;
            println!("{name}: {device} cordoned; new work goes to other devices");
            Ok(0)
        }
        SiteVerb::Uncordon {
            name,
            device,
            server,
        } => {
            let path = format!(
                "/v1/sites/{}/devices/{}/uncordon",
                path_segment(&name),
                path_segment(&device)
            );
            server.client()?.acting_as(&who).post(&path, None).await?;
            println!("{name}: {device} back in use");
            Ok(0)
        }
        SiteVerb::Undrain { name, server } => {
            let path = format!("/v1/sites/{}/undrain", path_segment(&name));
            server.client()?.acting_as(&who).post(&path, None).await?;
            println!("{name}: back in placement");
            Ok(0)
        }
        SiteVerb::Refresh {
            name,
            no_wait,
            timeout,
            server,
        } => {
            let path = format!("/v1/sites/{}/refresh", path_segment(&name));
            server.client()?.acting_as(&who).post(&path, None).await?;
            let client = server.client()?;
            if no_wait {
                println!("{name}: refresh asked for; `meridian site list --output json` shows its outcome");
                return Ok(0);
            }
            // The request's time, as the catalogue recorded it.
            let asked = |list: &SiteList| {
                list.sites
                    .iter()
                    .find(|s| s.name == name)
                    .and_then(|s| s.shapes_refresh.as_ref())
                    .map(|r| {
                        (
                            r.requested_at.clone(),
                            r.refreshed_at.clone(),
                            r.outcome.clone(),
                        )
                    })
            };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
            let mut said_waiting = false;
            loop {
                let list: SiteList = client.get_as("/v1/sites").await?;
                let site = list.sites.iter().find(|s| s.name == name);
                if let Some((Some(requested), Some(refreshed), outcome)) = asked(&list) {
                    // RFC 3339 UTC with the same precision: text order is time order.
                    if refreshed >= requested {
                        let outcome = outcome.unwrap_or_default();
                        println!("{name}: {outcome}");
                        return Ok(if outcome.starts_with("could not") {
                            1
                        } else {
                            0
                        });
                    }
                }
                if std::time::Instant::now() > deadline {
                    anyhow::bail!(
                        "{name}: the site's adapter did not refresh its shapes within {timeout} s{}",
                        if site.is_some_and(|s| !s.connected) {
                            " (no adapter serves the site: start one)"
                        } else {
                            ""
                        }
                    );
                }
                if !said_waiting {
                    said_waiting = true;
                    eprintln!(
                        "{name}: asked; waiting for the site's adapter (at its next heartbeat){}",
                        if site.is_some_and(|s| !s.connected) {
                            " — no adapter serves the site now"
                        } else {
                            ""
                        }
                    );
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
        SiteVerb::List { server } => {
            let list: SiteList = server.client()?.get_as("/v1/sites").await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&list)?),
                Output::Table => {
                    let rows: Vec<Vec<String>> = list
                        .sites
                        .iter()
                        .map(|s| {
                            vec![
                                s.name.clone(),
                                s.kind.clone(),
                                s.region.clone(),
                                s.state.clone(),
                                if s.connected { "yes" } else { "no" }.to_string(),
                                s.shapes.join(" "),
                                s.prices.as_ref().map_or("none".into(), |p| {
                                    format!(
                                        "{} since {}",
                                        p.currency,
                                        p.effective_from.get(..10).unwrap_or(&p.effective_from)
                                    )
                                }),
                                s.reason.clone().unwrap_or_default(),
                            ]
                        })
                        .collect();
                    client::table(
                        &[
                            "SITE",
                            "KIND",
                            "REGION",
                            "STATE",
                            "CONNECTED",
                            "SHAPES",
                            "PRICES",
                            "REASON",
                        ],
                        &rows,
                    );
                    let devices: Vec<Vec<String>> = list
                        .sites
                        .iter()
                        .flat_map(|s| {
                            s.devices.iter().map(|d| {
                                vec![
                                    s.name.clone(),
                                    d.id.clone(),
                                    format!("{} {}", d.vendor, d.model).trim().to_string(),
                                    format!("{} GiB", d.memory_bytes >> 30),
                                    d.cordoned.as_ref().map_or("in use".into(), |c| {
                                        format!("cordoned by {} at {}: {}", c.by, c.at, c.reason)
                                    }),
                                ]
                            })
                        })
                        .collect();
                    if !devices.is_empty() {
                        println!();
                        client::table(&["SITE", "DEVICE", "MODEL", "MEMORY", "STATE"], &devices);
                    }
                }
            }
            Ok(0)
        }
    }
}

/// A name as one URL path segment: what is not unreserved is percent-encoded.
pub fn path_segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}
