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
    /// nvidia-smi and amd-smi): one price (`0.50`), or prices by model with one for the
    /// rest (`H100=2.20,MI300X=1.90,0.50`).
    #[arg(long, env = "MERIDIAN_LOCAL_GPU_HOUR", default_value = "0.50")]
    pub gpu_hour: String,
    /// Currency of the local site's prices (ISO 4217).
    #[arg(long, env = "MERIDIAN_LOCAL_CURRENCY", default_value = "USD")]
    pub currency: String,
}

/// Where the local site's price sheet came from when `meridian up` made it: a sheet
/// with another source (a catalogue file's) is the operator's and is left alone.
const LOCAL_PRICES_SOURCE: &str =
    "meridian local site defaults (set --core-hour / --gib-hour / --gpu-hour)";

fn decimal(flag: &str, v: &str) -> anyhow::Result<Decimal> {
    Decimal::from_str(v.trim())
        .ok()
        .filter(|d| !d.is_sign_negative())
        .with_context(|| {
            format!("--{flag}: expected a non-negative decimal such as 0.01; got {v:?}")
        })
}

/// GPU-hour prices: one for every model without its own, and those by model (upper-cased).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuHour {
    pub default: Decimal,
    pub by_model: BTreeMap<String, Decimal>,
}

impl LocalPrices {
    /// `--gpu-hour`: `0.50`, or `H100=2.20,MI300X=1.90,0.50`.
    pub fn gpu_hour(&self) -> anyhow::Result<GpuHour> {
        let mut default = None;
        let mut by_model = BTreeMap::new();
        for item in self
            .gpu_hour
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
        {
            match item.split_once('=') {
                Some((model, price)) => {
                    let model = model.trim().to_ascii_uppercase();
                    if model.is_empty() {
                        anyhow::bail!("--gpu-hour: {item:?} names no model (expected MODEL=PRICE such as H100=2.20)");
                    }
                    if by_model.insert(model.clone(), decimal("gpu-hour", price)?).is_some() {
                        anyhow::bail!("--gpu-hour: model {model} is priced twice");
                    }
                }
                None if default.is_some() => anyhow::bail!(
                    "--gpu-hour: {item:?} is a second price for every model; give one, and others as MODEL=PRICE"
                ),
                None => default = Some(decimal("gpu-hour", item)?),
            }
        }
        Ok(GpuHour {
            default: default.unwrap_or_else(|| Decimal::new(50, 2)),
            by_model,
        })
    }

    /// The local site's sheet: offer `local` for CPU-only work and GPUs of a model
    /// without its own price, and `local-<model>` for each model of `models` that has one.
    pub fn sheet(&self, models: &[String]) -> anyhow::Result<PriceSheet> {
        let gpu = self.gpu_hour()?;
        let (core, gib) = (
            decimal("core-hour", &self.core_hour)?,
            decimal("gib-hour", &self.gib_hour)?,
        );
        let offer = |offer: String, gpu_hour: Decimal| ComputeOffer {
            offer,
            pricing: ComputePricing::Resource {
                per_core_hour: core,
                per_gib_memory_hour: gib,
                per_gpu_hour: gpu_hour,
            },
        };
        let mut compute = vec![offer("local".into(), gpu.default)];
        for model in models {
            if let Some(price) = gpu.by_model.get(&model.to_ascii_uppercase()) {
                compute.push(offer(shape_name(model), *price));
            }
        }
        compute.dedup_by(|a, b| a.offer == b.offer);
        Ok(PriceSheet {
            currency: Currency::from_str(&self.currency)
                .map_err(|e| anyhow::anyhow!("--currency: {e}"))?,
            effective_from: Utc::now(),
            source: LOCAL_PRICES_SOURCE.into(),
            compute,
            storage_per_gib_hour: Decimal::ZERO,
            egress_per_gb: Decimal::ZERO,
            egress_by_destination: None,
            egress_tiers: Vec::new(),
        })
    }
}

/// `local-<model>`, the shape (and, when the model has its own price, the offer) of a
/// GPU model at the local site.
fn shape_name(model: &str) -> String {
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
    format!("local-{slug}")
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
    let mut models: Vec<String> = gpus.iter().map(|d| d.model.clone()).collect();
    models.sort();
    models.dedup();
    let sheet = prices.sheet(&models)?;
    // The offers of the sheet in force: a catalogue file's prices are left as they are,
    // so a GPU shape may name only an offer they have.
    let in_force = catalog
        .find(name)
        .and_then(|s| s.prices.last())
        .filter(|p| p.source != LOCAL_PRICES_SOURCE)
        .unwrap_or(&sheet);
    let priced: Vec<&str> = in_force.compute.iter().map(|o| o.offer.as_str()).collect();
    let shapes = local_shapes(cpus, memory_bytes, gpus, &priced);
    if let Some(site) = catalog.find(name) {
        update_local_prices(log, site, &sheet).await?;
    }
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
            register_local_site(log, id, name, cpus, memory_bytes, gpus, sheet).await?;
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
    (shape.offer == "local" || shape.offer == shape.name)
        && (shape.name == "local" || shape.name.starts_with("local-"))
}

/// Records `sheet` as the local site's prices when its compute offers differ from those
/// in force and `meridian up` made those (a catalogue file's prices are left alone): a
/// changed `--core-hour` or `--gpu-hour`, or a GPU model that came with its own price.
async fn update_local_prices(
    log: &dyn EventLog,
    site: &meridian_domain::catalog::SiteEntry,
    sheet: &PriceSheet,
) -> anyhow::Result<()> {
    let Some(current) = site.prices.last() else {
        return Ok(());
    };
    if site.kind != SiteKind::Local
        || current.source != LOCAL_PRICES_SOURCE
        || (current.compute == sheet.compute && current.currency == sheet.currency)
    {
        return Ok(());
    }
    let ctx = EventContext::new_chain("system");
    match execute::<Site, _>(log, site.id, &ctx, |_| SiteCommand::ChangePrices {
        prices: sheet.clone(),
    })
    .await
    {
        Ok(_) => tracing::info!(site = %site.name, "the local site's prices changed"),
        // Refused (this machine's clock is behind the sheet in force): the old prices
        // stay, and Meridian starts anyway.
        Err(meridian_eventlog::aggregates::ExecuteError::Rejected(e)) => {
            tracing::warn!(site = %site.name, error = %e, "the local site's new prices were not recorded")
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context(format!("recording the new prices of site {}", site.name)))
        }
    }
    Ok(())
}

/// The local site's shapes: none without GPUs; else `local` (no GPU) and `local-<model>`
/// for each model, with as many of it as the machine has, priced by the offer of its
/// name when `priced` has one, else by `local`.
fn local_shapes(
    cpus: u32,
    memory_bytes: u64,
    gpus: &[meridian_adapter_local::gpu::Device],
    priced: &[&str],
) -> Vec<Shape> {
    if gpus.is_empty() {
        return Vec::new();
    }
    let shape = |name: String, gpus: Option<ShapeGpus>| Shape {
        offer: if priced.contains(&name.as_str()) {
            name.clone()
        } else {
            "local".into()
        },
        name,
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
        shapes.push(shape(
            shape_name(&model),
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
    sheet: PriceSheet,
) -> anyhow::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn prices(gpu_hour: &str) -> LocalPrices {
        LocalPrices {
            core_hour: "0.01".into(),
            gib_hour: "0.001".into(),
            gpu_hour: gpu_hour.into(),
            currency: "USD".into(),
        }
    }

    fn device(model: &str, uuid: &str) -> meridian_adapter_local::gpu::Device {
        meridian_adapter_local::gpu::Device {
            vendor: "nvidia".into(),
            model: model.into(),
            index: 0,
            uuid: uuid.into(),
            memory_bytes: 80 << 30,
        }
    }

    #[test]
    fn gpu_hours_are_one_price_or_prices_by_model() {
        let one = prices("0.75").gpu_hour().unwrap();
        assert_eq!((one.default, one.by_model.len()), (Decimal::new(75, 2), 0));
        let many = prices("h100=2.20, MI300X=1.90,0.40").gpu_hour().unwrap();
        assert_eq!(many.default, Decimal::new(40, 2));
        assert_eq!(many.by_model["H100"], Decimal::new(220, 2));
        assert_eq!(many.by_model["MI300X"], Decimal::new(190, 2));
        // Only by model: the rest keep the default.
        assert_eq!(
            prices("H100=2").gpu_hour().unwrap().default,
            Decimal::new(50, 2)
        );
        for (bad, says) in [
            ("0.5,0.6", "second price"),
            ("H100=1,h100=2", "priced twice"),
            ("=1", "names no model"),
            ("H100=-1", "non-negative decimal"),
            ("cheap", "non-negative decimal"),
        ] {
            let e = prices(bad).gpu_hour().unwrap_err().to_string();
            assert!(
                e.starts_with("--gpu-hour") && e.contains(says),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_model_with_its_own_price_gets_its_own_offer_and_shape() {
        let gpus = [
            device("H100", "GPU-a"),
            device("H100", "GPU-b"),
            device("L40S", "GPU-c"),
        ];
        let sheet = prices("H100=2.20,0.50")
            .sheet(&["H100".into(), "L40S".into()])
            .unwrap();
        let offers: Vec<(&str, Decimal)> = sheet
            .compute
            .iter()
            .map(|o| match &o.pricing {
                ComputePricing::Resource { per_gpu_hour, .. } => (o.offer.as_str(), *per_gpu_hour),
                ComputePricing::Instance { .. } => unreachable!(),
            })
            .collect();
        assert_eq!(
            offers,
            [
                ("local", Decimal::new(50, 2)),
                ("local-h100", Decimal::new(220, 2))
            ]
        );
        let priced: Vec<&str> = sheet.compute.iter().map(|o| o.offer.as_str()).collect();
        let shapes = local_shapes(16, 64 << 30, &gpus, &priced);
        let by_name: Vec<(&str, &str, u32)> = shapes
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.offer.as_str(),
                    s.gpus.as_ref().map_or(0, |g| g.count),
                )
            })
            .collect();
        assert_eq!(
            by_name,
            [
                ("local", "local", 0),
                ("local-h100", "local-h100", 2),
                ("local-l40s", "local", 1)
            ]
        );
        assert!(shapes.iter().all(is_local_shape));
    }
}
