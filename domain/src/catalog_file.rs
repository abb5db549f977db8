//! The site catalogue as a file: what an operator writes to describe sites (kind,
//! region, jurisdiction, shapes, prices with their date and source), and how it becomes
//! Site commands in the log — or, offline, a [`Catalog`] to quote against.
//!
//! ```yaml
//! sites:
//!   - name: aws-us-east-1
//!     kind: aws
//!     region: us-east-1
//!     jurisdiction: us
//!     prices:
//!       currency: USD
//!       effective_from: 2026-01-01T00:00:00Z
//!       source: "https://aws.amazon.com/ec2/pricing/on-demand/"
//!       storage_per_gib_hour: "0.000110"
//!       egress_per_gb: "0.09"
//!       compute:
//!         - {offer: g6.xlarge, per_instance_hour: "0.8048"}
//!     shapes:
//!       - {name: g6.xlarge, offer: g6.xlarge, cpus: 4, memory: 16GiB,
//!          gpus: {count: 1, vendor: nvidia, model: L4, memory: 24GiB}}
//! ```
//!
//! Prices are strings so they stay exact. `egress_per_gb` prices data leaving the site for
//! the internet (and for anywhere, alone); `egress_within: {same_region, other_region}`
//! gives the provider's cheaper prices inside its own network; `egress_tiers:
//! [{from_gb, per_gb}]` lowers the internet price as the tenant's monthly volume out of
//! the site grows. A compute offer is priced either
//! `per_instance_hour` (clouds) or `per_core_hour` + `per_gib_hour` + `per_gpu_hour` (HPC).

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use meridian_events::aggregate::SiteCommand;
use meridian_events::money::{EgressByDestination, EgressTier};
use meridian_events::vocabulary::site::{Dataset, Shape, ShapeGpus};
use meridian_events::vocabulary::AcceleratorVendor;
use meridian_events::{
    AggregateKind, AggregateRef, ComputeOffer, ComputePricing, Currency, Envelope, Event,
    EventContext, PriceSheet, SiteEvent, SiteKind,
};
use meridian_spec::Size;
use rust_decimal::Decimal;
use schemars::JsonSchema;
use serde::Deserialize;
use uuid::Uuid;

use crate::Catalog;

/// The built-in reference catalogue: realistic shapes and list prices for every kind of
/// site, each price with its source and date. A starting point, not anyone's real price.
pub const REFERENCE: &str = include_str!("../../catalog/reference.yaml");

#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct CatalogFileError {
    pub path: String,
    pub message: String,
}

fn error(path: impl Into<String>, message: impl Into<String>) -> CatalogFileError {
    CatalogFileError {
        path: path.into(),
        message: message.into(),
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Catalogue")]
struct File {
    sites: Vec<SiteFile>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Site")]
struct SiteFile {
    name: String,
    #[schemars(schema_with = "site_kind_schema")]
    kind: SiteKind,
    region: String,
    jurisdiction: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    prices: PricesFile,
    #[serde(default)]
    shapes: Vec<ShapeFile>,
    #[serde(default)]
    datasets: Vec<DatasetFile>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Dataset")]
struct DatasetFile {
    uri: String,
    digest: String,
    size: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Prices")]
struct PricesFile {
    currency: String,
    #[schemars(with = "String", extend("format" = "date-time"))]
    effective_from: DateTime<Utc>,
    source: String,
    #[serde(default)]
    storage_per_gib_hour: Option<String>,
    #[serde(default)]
    egress_per_gb: Option<String>,
    /// Cheaper egress inside the provider: to the same region, to its other regions.
    #[serde(default)]
    egress_within: Option<EgressWithinFile>,
    /// Internet egress by monthly volume: `[{from_gb, per_gb}]`, `from_gb` increasing.
    #[serde(default)]
    egress_tiers: Vec<EgressTierFile>,
    compute: Vec<OfferFile>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "EgressTier")]
struct EgressTierFile {
    from_gb: String,
    per_gb: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "EgressWithin")]
struct EgressWithinFile {
    same_region: String,
    other_region: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Offer")]
struct OfferFile {
    offer: String,
    per_instance_hour: Option<String>,
    per_core_hour: Option<String>,
    per_gib_hour: Option<String>,
    per_gpu_hour: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Shape")]
struct ShapeFile {
    name: String,
    offer: String,
    #[serde(default)]
    spot_offer: Option<String>,
    cpus: u32,
    memory: String,
    #[serde(default)]
    gpus: Option<GpusFile>,
    #[serde(default)]
    max_nodes: Option<u32>,
    #[serde(default)]
    max_walltime: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Gpus")]
struct GpusFile {
    count: u32,
    #[schemars(schema_with = "vendor_schema")]
    vendor: AcceleratorVendor,
    model: String,
    memory: String,
}

fn site_kind_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "enum": ["local", "slurm", "pbs", "kubernetes", "coreweave", "aws", "gcp", "azure", "oci"]
    })
}

fn vendor_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"enum": ["nvidia", "amd"]})
}

/// The JSON Schema of a catalogue file: its shape (fields, types, which are required).
/// Values are checked further when a catalogue is read: amounts are decimals, each
/// shape names an offer of its site's prices, sizes carry units; [`parse`] says what is
/// wrong, by path. The checked-in copy is `schemas/catalog.schema.json`.
pub fn json_schema() -> serde_json::Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(File)).expect("a schema is JSON");
    schema["title"] = "Meridian site catalogue".into();
    schema
}

/// One site as the file describes it, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteSpec {
    pub name: String,
    pub kind: SiteKind,
    pub region: String,
    pub jurisdiction: String,
    pub labels: BTreeMap<String, String>,
    pub prices: PriceSheet,
    pub shapes: Vec<Shape>,
    pub datasets: Vec<Dataset>,
}

fn decimal(path: &str, text: &str) -> Result<Decimal, CatalogFileError> {
    Decimal::from_str(text.trim())
        .ok()
        .filter(|d| !d.is_sign_negative())
        .ok_or_else(|| {
            error(
                path,
                format!("expected a non-negative decimal such as \"0.05\"; got {text:?}"),
            )
        })
}

fn size(path: &str, text: &str) -> Result<u64, CatalogFileError> {
    Size::from_str(text)
        .map(|s| s.bytes())
        .map_err(|e| error(path, format!("{e}; got {text:?}")))
}

/// Parses a catalogue file (YAML or JSON), checking every field.
pub fn parse(text: &str) -> Result<Vec<SiteSpec>, CatalogFileError> {
    let file: File =
        serde_saphyr::from_str(text).map_err(|e| error("(document)", e.to_string()))?;
    let mut names = std::collections::BTreeSet::new();
    let mut sites = Vec::new();
    for (i, site) in file.sites.into_iter().enumerate() {
        let at = format!("sites[{i}]");
        if !names.insert(site.name.clone()) {
            return Err(error(
                format!("{at}.name"),
                format!("site {} is listed twice", site.name),
            ));
        }
        let p = &site.prices;
        let currency = Currency::new(&p.currency)
            .map_err(|e| error(format!("{at}.prices.currency"), e.to_string()))?;
        let mut compute = Vec::new();
        for (j, offer) in p.compute.iter().enumerate() {
            let here = format!("{at}.prices.compute[{j}]");
            let pricing = match (&offer.per_instance_hour, &offer.per_core_hour) {
                (Some(instance), None) if offer.per_gib_hour.is_none() && offer.per_gpu_hour.is_none() => {
                    ComputePricing::Instance {
                        per_instance_hour: decimal(&format!("{here}.per_instance_hour"), instance)?,
                    }
                }
                (None, Some(core)) => ComputePricing::Resource {
                    per_core_hour: decimal(&format!("{here}.per_core_hour"), core)?,
                    per_gib_memory_hour: decimal(
                        &format!("{here}.per_gib_hour"),
                        offer.per_gib_hour.as_deref().unwrap_or("0"),
                    )?,
                    per_gpu_hour: decimal(
                        &format!("{here}.per_gpu_hour"),
                        offer.per_gpu_hour.as_deref().unwrap_or("0"),
                    )?,
                },
                _ => {
                    return Err(error(
                        here,
                        "expected either per_instance_hour, or per_core_hour with optional per_gib_hour and per_gpu_hour",
                    ))
                }
            };
            compute.push(ComputeOffer {
                offer: offer.offer.clone(),
                pricing,
            });
        }
        let prices = PriceSheet {
            currency,
            effective_from: p.effective_from,
            source: p.source.clone(),
            compute,
            storage_per_gib_hour: decimal(
                &format!("{at}.prices.storage_per_gib_hour"),
                p.storage_per_gib_hour.as_deref().unwrap_or("0"),
            )?,
            egress_per_gb: decimal(
                &format!("{at}.prices.egress_per_gb"),
                p.egress_per_gb.as_deref().unwrap_or("0"),
            )?,
            egress_by_destination: match &p.egress_within {
                None => None,
                Some(w) => Some(EgressByDestination {
                    same_region: decimal(
                        &format!("{at}.prices.egress_within.same_region"),
                        &w.same_region,
                    )?,
                    other_region: decimal(
                        &format!("{at}.prices.egress_within.other_region"),
                        &w.other_region,
                    )?,
                }),
            },
            egress_tiers: p
                .egress_tiers
                .iter()
                .enumerate()
                .map(|(k, t)| {
                    let here = format!("{at}.prices.egress_tiers[{k}]");
                    Ok(EgressTier {
                        from_gb: decimal(&format!("{here}.from_gb"), &t.from_gb)?,
                        per_gb: decimal(&format!("{here}.per_gb"), &t.per_gb)?,
                    })
                })
                .collect::<Result<_, CatalogFileError>>()?,
        };
        if let Err(e) = prices.egress_tariff().validate() {
            return Err(error(
                format!("{at}.prices.egress_tiers"),
                format!(
                    "{}; expected from_gb above 0 and increasing, prices not negative",
                    e.0
                ),
            ));
        }
        if p.source.trim().is_empty() {
            return Err(error(
                format!("{at}.prices.source"),
                "every price names its source",
            ));
        }
        let mut shapes = Vec::new();
        for (j, shape) in site.shapes.iter().enumerate() {
            let here = format!("{at}.shapes[{j}]");
            for offer in std::iter::once(&shape.offer).chain(shape.spot_offer.as_ref()) {
                if prices.compute.iter().all(|o| &o.offer != offer) {
                    return Err(error(
                        format!("{here}.offer"),
                        format!("no compute price for offer {offer:?} in {at}.prices.compute"),
                    ));
                }
            }
            shapes.push(Shape {
                name: shape.name.clone(),
                offer: shape.offer.clone(),
                spot_offer: shape.spot_offer.clone(),
                cpus: shape.cpus,
                memory_bytes: size(&format!("{here}.memory"), &shape.memory)?,
                gpus: match &shape.gpus {
                    Some(g) => Some(ShapeGpus {
                        count: g.count,
                        vendor: g.vendor,
                        model: g.model.clone(),
                        memory_bytes: size(&format!("{here}.gpus.memory"), &g.memory)?,
                    }),
                    None => None,
                },
                max_nodes: shape.max_nodes.unwrap_or(1),
                max_walltime_secs: match &shape.max_walltime {
                    Some(w) => Some(
                        meridian_spec::Walltime::from_str(w)
                            .map_err(|e| {
                                error(format!("{here}.max_walltime"), format!("{e}; got {w:?}"))
                            })?
                            .secs(),
                    ),
                    None => None,
                },
            });
        }
        let mut datasets = Vec::new();
        for (j, d) in site.datasets.iter().enumerate() {
            let here = format!("{at}.datasets[{j}]");
            if !d.digest.contains(':') {
                return Err(error(
                    format!("{here}.digest"),
                    format!(
                        "expected \"<algorithm>:<hex>\" such as sha256:9f86d0…; got {:?}",
                        d.digest
                    ),
                ));
            }
            datasets.push(Dataset {
                uri: d.uri.clone(),
                digest: d.digest.clone(),
                bytes: size(&format!("{here}.size"), &d.size)?,
            });
        }
        sites.push(SiteSpec {
            name: site.name,
            kind: site.kind,
            region: site.region,
            jurisdiction: site.jurisdiction,
            labels: site.labels,
            prices,
            shapes,
            datasets,
        });
    }
    Ok(sites)
}

impl SiteSpec {
    /// The commands that bring a site with this history up to the file: register it,
    /// change its prices when the sheet differs, declare its shapes when they differ.
    pub fn commands(&self, current: Option<&crate::catalog::SiteEntry>) -> Vec<SiteCommand> {
        let Some(site) = current else {
            return vec![
                SiteCommand::Register {
                    name: self.name.clone(),
                    kind: self.kind,
                    region: self.region.clone(),
                    jurisdiction: self.jurisdiction.clone(),
                    credentials_secret: None,
                    labels: self.labels.clone(),
                    prices: Some(self.prices.clone()),
                },
                SiteCommand::DeclareShapes {
                    shapes: self.shapes.clone(),
                },
                SiteCommand::DeclareDatasets {
                    datasets: self.datasets.clone(),
                },
            ];
        };
        let mut commands = Vec::new();
        if site.prices.last() != Some(&self.prices) {
            commands.push(SiteCommand::ChangePrices {
                prices: self.prices.clone(),
            });
        }
        if site.shapes != self.shapes {
            commands.push(SiteCommand::DeclareShapes {
                shapes: self.shapes.clone(),
            });
        }
        if site.datasets != self.datasets {
            commands.push(SiteCommand::DeclareDatasets {
                datasets: self.datasets.clone(),
            });
        }
        commands
    }
}

/// A catalogue built straight from specs, for quoting offline.
pub fn offline_catalog(specs: &[SiteSpec]) -> Catalog {
    // No adapter connects to a catalogue file: every site is priced.
    let mut catalog = Catalog::default();
    catalog.ignore_connections = true;
    let ctx = EventContext::new_chain("offline");
    for spec in specs {
        let events = vec![
            Event::Site(SiteEvent::Registered {
                name: spec.name.clone(),
                kind: spec.kind,
                region: spec.region.clone(),
                jurisdiction: spec.jurisdiction.clone(),
                credentials_secret: None,
                labels: spec.labels.clone(),
            }),
            Event::Site(SiteEvent::PricesChanged {
                prices: spec.prices.clone(),
            }),
            Event::Site(SiteEvent::ShapesDeclared {
                shapes: spec.shapes.clone(),
            }),
            Event::Site(SiteEvent::DatasetsDeclared {
                datasets: spec.datasets.clone(),
            }),
        ];
        let aggregate = AggregateRef::new(AggregateKind::Site, Uuid::now_v7());
        for e in Envelope::sequence_after(aggregate, 0, &ctx, spec.prices.effective_from, events) {
            catalog.observe(&e);
        }
    }
    catalog
}

/// What applying a catalogue did to one site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    Registered,
    Updated,
    Unchanged,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Log(#[from] meridian_eventlog::LogError),
    #[error("site {site}: {message}")]
    Site { site: String, message: String },
}

/// Brings the log's catalogue up to `specs`: registers new sites, records changed prices,
/// shapes and data sets. Sites not in `specs` are left as they are.
pub async fn apply(
    log: &dyn meridian_eventlog::EventLog,
    specs: &[SiteSpec],
    by: &str,
) -> Result<Vec<(String, Applied)>, ApplyError> {
    let catalog = Catalog::load(log).await?;
    apply_to(log, &catalog, specs, by).await
}

/// [`apply`] against a catalogue the caller already holds, caught up with `log` (the
/// intake keeps one, so that it need not read the whole log).
pub async fn apply_to(
    log: &dyn meridian_eventlog::EventLog,
    catalog: &Catalog,
    specs: &[SiteSpec],
    by: &str,
) -> Result<Vec<(String, Applied)>, ApplyError> {
    use meridian_eventlog::aggregates::execute;
    let mut outcome = Vec::new();
    for spec in specs {
        let current = catalog.find(&spec.name);
        let commands = spec.commands(current);
        if commands.is_empty() {
            outcome.push((spec.name.clone(), Applied::Unchanged));
            continue;
        }
        let id = current.map_or_else(Uuid::now_v7, |s| s.id);
        for command in commands {
            execute::<meridian_events::aggregate::Site, _>(
                log,
                id,
                &EventContext::new_chain(by),
                |_| command.clone(),
            )
            .await
            .map_err(|e| ApplyError::Site {
                site: spec.name.clone(),
                message: e.to_string(),
            })?;
        }
        outcome.push((
            spec.name.clone(),
            if current.is_some() {
                Applied::Updated
            } else {
                Applied::Registered
            },
        ));
    }
    Ok(outcome)
}
