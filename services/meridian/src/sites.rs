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
use meridian_events::vocabulary::site::{Shape, ShapeGpus};
use meridian_events::vocabulary::AcceleratorVendor;
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
    /// Price of one GPU for one hour at the local site (its GPUs are found with
    /// nvidia-smi and amd-smi when it starts).
    #[arg(long, env = "MERIDIAN_LOCAL_GPU_HOUR", default_value = "0.50")]
    pub gpu_hour: String,
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
            source: "meridian local site defaults (set --core-hour / --gib-hour / --gpu-hour)"
                .into(),
            compute: vec![ComputeOffer {
                offer: "local".into(),
                pricing: ComputePricing::Resource {
                    per_core_hour: decimal("core-hour", &self.core_hour)?,
                    per_gib_memory_hour: decimal("gib-hour", &self.gib_hour)?,
                    per_gpu_hour: decimal("gpu-hour", &self.gpu_hour)?,
                },
            }],
            storage_per_gib_hour: Decimal::ZERO,
            egress_per_gb: Decimal::ZERO,
            egress_by_destination: None,
            egress_tiers: Vec::new(),
        })
    }
}

/// Registers a local site named `name` unless the catalogue already has it, and keeps
/// its shapes to the GPUs found on this machine: none without GPUs (the site is judged by
/// its labels, as ever); with GPUs, a CPU-only shape and one per GPU model, each with all
/// of the machine's CPUs and memory.
pub async fn ensure_local_site(
    log: &dyn EventLog,
    name: &str,
    cpus: u32,
    memory_bytes: u64,
    gpus: &[meridian_adapter_local::gpu::Device],
    prices: &LocalPrices,
) -> anyhow::Result<()> {
    let catalog = Catalog::load(log)
        .await
        .context("reading the site catalogue")?;
    let shapes = local_shapes(cpus, memory_bytes, gpus);
    let site_id = match catalog.find(name) {
        // Shapes a catalogue file gave the site are the operator's: left alone.
        Some(site)
            if site.kind != SiteKind::Local
                || site.shapes == shapes
                || !site.shapes.iter().all(is_local_shape) =>
        {
            return Ok(())
        }
        Some(site) => site.id,
        None => {
            let id = Uuid::now_v7();
            register_local_site(log, id, name, cpus, memory_bytes, gpus, prices).await?;
            if shapes.is_empty() {
                return Ok(());
            }
            id
        }
    };
    // The machine's GPUs changed since the shapes were declared (none left: no shapes).
    let ctx = EventContext::new_chain("system");
    execute::<Site, _>(log, site_id, &ctx, |_| SiteCommand::DeclareShapes {
        shapes: shapes.clone(),
    })
    .await
    .with_context(|| format!("declaring the GPUs of site {name}"))?;
    tracing::info!(
        site = name,
        gpus = gpus.len(),
        "declared the local site's GPUs"
    );
    Ok(())
}

/// Whether `shape` is one [`local_shapes`] makes.
fn is_local_shape(shape: &Shape) -> bool {
    shape.offer == "local" && (shape.name == "local" || shape.name.starts_with("local-"))
}

/// The local site's shapes: none without GPUs; else `local` (no GPU) and `local-<model>`
/// for each model, with as many of it as the machine has.
fn local_shapes(
    cpus: u32,
    memory_bytes: u64,
    gpus: &[meridian_adapter_local::gpu::Device],
) -> Vec<Shape> {
    if gpus.is_empty() {
        return Vec::new();
    }
    let shape = |name: String, gpus: Option<ShapeGpus>| Shape {
        name,
        offer: "local".into(),
        spot_offer: None,
        cpus,
        memory_bytes,
        gpus,
        max_nodes: 1,
        max_walltime_secs: None,
    };
    let mut models: BTreeMap<(String, String), (u32, u64)> = BTreeMap::new();
    for d in gpus {
        let entry = models
            .entry((d.vendor.clone(), d.model.clone()))
            .or_insert((0, d.memory_bytes));
        entry.0 += 1;
        entry.1 = entry.1.min(d.memory_bytes);
    }
    let mut shapes = vec![shape("local".into(), None)];
    for ((vendor, model), (count, memory)) in models {
        let vendor = match vendor.as_str() {
            "amd" => AcceleratorVendor::Amd,
            _ => AcceleratorVendor::Nvidia,
        };
        let slug: String = model
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        shapes.push(shape(
            format!("local-{slug}"),
            Some(ShapeGpus {
                count,
                vendor,
                model,
                memory_bytes: memory,
            }),
        ));
    }
    shapes
}

async fn register_local_site(
    log: &dyn EventLog,
    id: Uuid,
    name: &str,
    cpus: u32,
    memory_bytes: u64,
    gpus: &[meridian_adapter_local::gpu::Device],
    prices: &LocalPrices,
) -> anyhow::Result<()> {
    let sheet = prices.sheet()?;
    let labels = BTreeMap::from([
        (labels::MAX_CPUS.to_string(), cpus.to_string()),
        (
            labels::MAX_MEMORY_BYTES.to_string(),
            memory_bytes.to_string(),
        ),
        (labels::MAX_NODES.to_string(), "1".to_string()),
        (labels::GPUS.to_string(), gpus.len().to_string()),
    ]);
    let ctx = EventContext::new_chain("system");
    execute::<Site, _>(log, id, &ctx, |_| SiteCommand::Register {
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
    tracing::info!(
        site = name,
        cpus,
        memory_bytes,
        gpus = gpus.len(),
        "registered the local site"
    );
    Ok(())
}
