//! Registering a site in the log, once: `meridian up` registers its local site, and
//! `meridian server adapter` the site it serves, when the catalogue does not have it.

use std::collections::BTreeMap;
use std::str::FromStr;

use anyhow::Context;
use chrono::Utc;
use meridian_domain::catalog::labels;
use meridian_domain::Catalog;
use meridian_eventlog::aggregates::execute;
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Site, SiteCommand};
use meridian_events::{ComputeOffer, ComputePricing, Currency, EventContext, PriceSheet, SiteKind};
use rust_decimal::Decimal;
use uuid::Uuid;

/// Prices of the local site. The defaults are placeholders that make bills readable,
/// not a real cost of anyone's machine: operators set their own.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalPrices {
    /// Price of one core for one hour at the local site.
    #[arg(long, env = "MERIDIAN_LOCAL_CORE_HOUR", default_value = "0.01")]
    pub core_hour: String,
    /// Price of one GiB of memory for one hour at the local site.
    #[arg(long, env = "MERIDIAN_LOCAL_GIB_HOUR", default_value = "0.001")]
    pub gib_hour: String,
    /// Currency of the local site's prices (ISO 4217).
    #[arg(long, env = "MERIDIAN_LOCAL_CURRENCY", default_value = "USD")]
    pub currency: String,
}

impl LocalPrices {
    pub fn sheet(&self) -> anyhow::Result<PriceSheet> {
        let decimal = |flag: &str, v: &str| {
            Decimal::from_str(v)
                .ok()
                .filter(|d| !d.is_sign_negative())
                .with_context(|| {
                    format!("--{flag}: expected a non-negative decimal such as 0.01; got {v:?}")
                })
        };
        Ok(PriceSheet {
            currency: Currency::from_str(&self.currency)
                .map_err(|e| anyhow::anyhow!("--currency: {e}"))?,
            effective_from: Utc::now(),
            source: "meridian local site defaults (set --core-hour / --gib-hour)".into(),
            compute: vec![ComputeOffer {
                offer: "local".into(),
                pricing: ComputePricing::Resource {
                    per_core_hour: decimal("core-hour", &self.core_hour)?,
                    per_gib_memory_hour: decimal("gib-hour", &self.gib_hour)?,
                    per_gpu_hour: Decimal::ZERO,
                },
            }],
            storage_per_gib_hour: Decimal::ZERO,
            egress_per_gb: Decimal::ZERO,
            egress_by_destination: None,
            egress_tiers: Vec::new(),
        })
    }
}

/// Registers a local site named `name` unless the catalogue already has it.
pub async fn ensure_local_site(
    log: &dyn EventLog,
    name: &str,
    cpus: u32,
    memory_bytes: u64,
    prices: &LocalPrices,
) -> anyhow::Result<()> {
    let catalog = Catalog::load(log)
        .await
        .context("reading the site catalogue")?;
    if catalog.find(name).is_some() {
        return Ok(());
    }
    let sheet = prices.sheet()?;
    let labels = BTreeMap::from([
        (labels::MAX_CPUS.to_string(), cpus.to_string()),
        (
            labels::MAX_MEMORY_BYTES.to_string(),
            memory_bytes.to_string(),
        ),
        (labels::MAX_NODES.to_string(), "1".to_string()),
        (labels::GPUS.to_string(), "0".to_string()),
    ]);
    let ctx = EventContext::new_chain("system");
    execute::<Site, _>(log, Uuid::now_v7(), &ctx, |_| SiteCommand::Register {
        name: name.to_string(),
        kind: SiteKind::Local,
        region: "local".into(),
        jurisdiction: "local".into(),
        credentials_secret: None,
        labels: labels.clone(),
        prices: Some(sheet.clone()),
    })
    .await
    .with_context(|| format!("registering site {name}"))?;
    tracing::info!(site = name, cpus, memory_bytes, "registered the local site");
    Ok(())
}
