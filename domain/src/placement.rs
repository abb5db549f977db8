//! The placement decision, pure: filter the sites the workflow's hints and its tenant's
//! policy allow, price the whole workflow at each site that can run every job (compute
//! on the cheapest fitting shape, inputs moved from where they are, storage, results
//! moved out, egress through the source's monthly volume tiers), and, when the workflow
//! may be split, a plan that runs each job where it costs least counting the volumes
//! moved between sites. Choose, and explain every candidate. Ties go to reliability,
//! queue depth, then the site name, so decisions are repeatable.

use chrono::{DateTime, Utc};
use meridian_events::money::Destination;
use meridian_events::vocabulary::site::Shape;
use meridian_events::vocabulary::tenant::PlacementPolicy;
use meridian_events::vocabulary::workflow::{
    Candidate, CostTerms, JobPlacement, PlacementExplanation, SiteRejection, SplitPlan, Verdict,
    VolumeMove,
};
use meridian_events::vocabulary::AcceleratorVendor;
use meridian_events::{Allocation, ComputeRate, Money, StorageRate};
use meridian_spec::{GpuVendor, Resources, Size, Walltime, Workflow};
use rust_decimal::Decimal;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use uuid::Uuid;

use crate::catalog::{labels, Catalog, SiteEntry};
use crate::shape_index::ShapeIndex;

#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// The site of the first job (all of them, unless split).
    pub site: String,
    pub region: String,
    /// Jobs that run away from `site`, when the workflow is split.
    pub job_sites: BTreeMap<String, String>,
    /// The storage rate at each of those other sites.
    pub storage_rates: BTreeMap<String, StorageRate>,
    /// The rate of the first job's shape; `job_rates` holds every job's.
    pub rate: ComputeRate,
    pub job_rates: BTreeMap<String, ComputeRate>,
    pub storage_rate: StorageRate,
    pub estimated_cost: Money,
    pub explanation: PlacementExplanation,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Placed(Box<Placed>),
    Rejected {
        rejections: Vec<SiteRejection>,
    },
    /// No connected site fits, but these sites would if an adapter served them: the
    /// workflow waits for one to connect. `rejections` say why each site is out now.
    Waiting {
        sites: Vec<String>,
        rejections: Vec<SiteRejection>,
    },
}

/// Why a site that no adapter serves is left out.
pub const NOT_CONNECTED: &str = "not connected: no adapter serves it";

impl Decision {
    /// Why each site was left out, for a decision that placed nothing.
    pub fn rejections(&self) -> &[SiteRejection] {
        match self {
            Decision::Placed(_) => &[],
            Decision::Rejected { rejections } | Decision::Waiting { rejections, .. } => rejections,
        }
    }

    /// Every site as a candidate: the explanation's when placed, else each rejected
    /// with its reason.
    pub fn candidates(&self) -> Vec<Candidate> {
        match self {
            Decision::Placed(p) => p.explanation.candidates.clone(),
            other => other
                .rejections()
                .iter()
                .map(|r| Candidate {
                    site: r.site.clone(),
                    verdict: Verdict::Rejected {
                        reason: r.reason.clone(),
                    },
                    cost: None,
                })
                .collect(),
        }
    }
}

/// Every (job, resources, task count) of the workflow: services count as one task.
fn workloads(spec: &Workflow) -> Vec<(String, &Resources, u32)> {
    let jobs = spec.jobs.iter().map(|(name, job)| {
        let tasks = job.array.map_or(1, |a| a.len());
        (name.clone(), &job.resources, tasks)
    });
    let services = spec
        .services
        .iter()
        .map(|(name, s)| (name.clone(), &s.resources, s.replicas.max));
    jobs.chain(services).collect()
}

/// How many of the workflow's GPU jobs would find too few free GPUs of their model at
/// `site`, by its last capacity report. Only sites that count free GPUs by model (typed
/// GRES, the local site's devices) say; at others it is 0: a cloud launches what it is
/// asked for, and a count without models says nothing of the one wanted.
fn gpu_shortfall(site: &SiteEntry, work: &[(String, &Resources, u32)]) -> usize {
    let Some(by_model) = site
        .capacity
        .as_ref()
        .map(|c| &c.free_gpus_by_model)
        .filter(|m| !m.is_empty())
    else {
        return 0;
    };
    work.iter()
        .filter(|(_, r, _)| {
            let Some(g) = &r.gpus else {
                return false;
            };
            let wanted = |model: &str| {
                g.model.as_ref().is_none_or(|m| {
                    model
                        .to_ascii_lowercase()
                        .starts_with(&m.to_ascii_lowercase())
                })
            };
            let free: u32 = by_model
                .iter()
                .filter(|(model, _)| wanted(model))
                .map(|(_, n)| *n)
                .sum();
            free < g.count.saturating_mul(r.nodes)
        })
        .count()
}

/// The allocation a task of `resources` asks for, summed over its nodes.
pub fn allocation(resources: &Resources) -> Allocation {
    Allocation {
        nodes: resources.nodes,
        cpus: resources.cpus * resources.nodes,
        memory_bytes: resources.memory.bytes() * u64::from(resources.nodes),
        gpus: resources.gpus.as_ref().map(|g| {
            meridian_events::vocabulary::AllocatedGpus {
                count: g.count * resources.nodes,
                vendor: match g.vendor {
                    GpuVendor::Amd => meridian_events::vocabulary::AcceleratorVendor::Amd,
                    // `any` bills like NVIDIA until the site says what it gave.
                    _ => meridian_events::vocabulary::AcceleratorVendor::Nvidia,
                },
                model: g.model.clone(),
            }
        }),
    }
}

/// Why `site` cannot run `resources`, if it cannot.
fn misfit(site: &SiteEntry, job: &str, resources: &Resources) -> Option<String> {
    let checks: [(&str, u64, u64); 3] = [
        (labels::MAX_CPUS, u64::from(resources.cpus), u64::MAX),
        (labels::MAX_MEMORY_BYTES, resources.memory.bytes(), u64::MAX),
        (labels::MAX_NODES, u64::from(resources.nodes), 1),
    ];
    for (label, wanted, default) in checks {
        let limit = site.label_u64(label).unwrap_or(default);
        if wanted > limit {
            let what = match label {
                labels::MAX_CPUS => format!("{wanted} CPUs per node"),
                labels::MAX_MEMORY_BYTES => format!("{} of memory per node", resources.memory),
                _ => format!("{wanted} nodes"),
            };
            return Some(format!(
                "job {job} needs {what}; the site offers at most {}",
                match label {
                    labels::MAX_MEMORY_BYTES => meridian_spec::Size::from_bytes(limit).to_string(),
                    _ => limit.to_string(),
                }
            ));
        }
    }
    if let Some(gpus) = &resources.gpus {
        let have = site.label_u64(labels::GPUS).unwrap_or(0);
        if u64::from(gpus.count) > have {
            return Some(format!(
                "job {job} needs {} GPU(s) per node; the site has {have}",
                gpus.count
            ));
        }
    }
    None
}

/// Why a shape cannot run a task: kept as the facts, written out only when shown (a
/// full catalogue has thousands of shapes that do not fit, and most reasons are never
/// read).
enum Misfit<'a> {
    Cpus(&'a Shape, u32),
    Memory(&'a Shape, Size),
    Nodes(&'a Shape, u32),
    Walltime(&'a Shape, u64, Walltime),
    NoGpus(&'a Shape, u32),
    Vendor(&'a Shape, AcceleratorVendor, GpuVendor),
    Model(&'a Shape, &'a str, &'a str),
    GpuCount(&'a Shape, u32, u32),
    Cordoned(&'a Shape, u32, u32, u32),
    GpuMemory(&'a Shape, u64, Size),
}

impl std::fmt::Display for Misfit<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vendor_name = |v: AcceleratorVendor| match v {
            AcceleratorVendor::Nvidia => "NVIDIA",
            AcceleratorVendor::Amd => "AMD",
        };
        match self {
            Misfit::Cpus(s, need) => write!(f, "{} has {} CPUs, needs {need}", s.name, s.cpus),
            Misfit::Memory(s, need) => write!(
                f,
                "{} has {} of memory, needs {need}",
                s.name,
                Size::from_bytes(s.memory_bytes)
            ),
            Misfit::Nodes(s, need) => write!(
                f,
                "{} runs at most {} node(s) per job, needs {need}",
                s.name, s.max_nodes
            ),
            Misfit::Walltime(s, limit, need) => write!(
                f,
                "{} runs jobs of at most {}, needs {need}",
                s.name,
                Walltime::from_secs(*limit)
            ),
            Misfit::NoGpus(s, need) => write!(f, "{} has no GPUs, needs {need}", s.name),
            Misfit::Vendor(s, have, want) => write!(
                f,
                "{} has {} GPUs, needs {}",
                s.name,
                vendor_name(*have),
                want.as_str()
            ),
            Misfit::Model(s, have, want) => write!(f, "{} has {have}, needs {want}", s.name),
            Misfit::GpuCount(s, have, want) => {
                write!(f, "{} has {have} GPUs per node, needs {want}", s.name)
            }
            Misfit::Cordoned(s, have, cordoned, want) => write!(
                f,
                "{} has {have} GPUs, {cordoned} of them cordoned, needs {want}",
                s.name
            ),
            Misfit::GpuMemory(s, have, want) => write!(
                f,
                "{}'s GPUs have {}, need {want}",
                s.name,
                Size::from_bytes(*have)
            ),
        }
    }
}

/// Why `shape` cannot run a task of `resources`, if it cannot.
/// `cordoned`: how many of the shape's GPUs its site has cordoned (the local site's
/// faulty devices), which no job gets.
fn shape_misfit<'a>(
    shape: &'a Shape,
    resources: &'a Resources,
    cordoned: u32,
) -> Option<Misfit<'a>> {
    if resources.cpus > shape.cpus {
        return Some(Misfit::Cpus(shape, resources.cpus));
    }
    if resources.memory.bytes() > shape.memory_bytes {
        return Some(Misfit::Memory(shape, resources.memory));
    }
    if resources.nodes > shape.max_nodes {
        return Some(Misfit::Nodes(shape, resources.nodes));
    }
    if let Some(limit) = shape.max_walltime_secs {
        if resources.walltime.secs() > limit {
            return Some(Misfit::Walltime(shape, limit, resources.walltime));
        }
    }
    let Some(want) = &resources.gpus else {
        return None;
    };
    let Some(have) = &shape.gpus else {
        return Some(Misfit::NoGpus(shape, want.count));
    };
    let vendor_ok = match want.vendor {
        GpuVendor::Any => true,
        GpuVendor::Nvidia => have.vendor == AcceleratorVendor::Nvidia,
        GpuVendor::Amd => have.vendor == AcceleratorVendor::Amd,
    };
    if !vendor_ok {
        return Some(Misfit::Vendor(shape, have.vendor, want.vendor));
    }
    if let Some(model) = &want.model {
        let prefix = have
            .model
            .get(..model.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(model));
        if !prefix {
            return Some(Misfit::Model(shape, &have.model, model));
        }
    }
    if want.count > have.count {
        return Some(Misfit::GpuCount(shape, have.count, want.count));
    }
    if want.count > have.count.saturating_sub(cordoned) {
        return Some(Misfit::Cordoned(shape, have.count, cordoned, want.count));
    }
    if let Some(memory) = want.memory {
        if memory.bytes() > have.memory_bytes {
            return Some(Misfit::GpuMemory(shape, have.memory_bytes, memory));
        }
    }
    None
}

/// Each site's cheapest fit for a request, kept between decisions: pricing every shape
/// of a full cloud catalogue again for each workflow was most of a decision's time. An
/// entry holds while its site's shapes, price sheets and cordons stay as they were: the
/// catalogue forgets a site's entries at every event that changes them, and an entry
/// names the price sheet it was priced with. A copy of the catalogue starts with no fit.
#[derive(Default)]
pub struct FitCache {
    /// Request → site → its fit.
    fits: std::sync::Mutex<std::collections::HashMap<Request, SiteFits>>,
    /// Site → its shape index, and the price sheet it was built with.
    indexes: std::sync::Mutex<std::collections::HashMap<String, SheetIndex>>,
}

/// A site's shape index and the date of the price sheet it was built for.
type SheetIndex = (DateTime<Utc>, Arc<ShapeIndex>);

/// Fits kept at most; past it the cache starts again (a guard against a stream of
/// requests that never repeat).
const FITS_KEPT: usize = 100_000;

impl FitCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Request, SiteFits>> {
        self.fits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is known for each of `requests`, by site, taken out for one decision (a
    /// decision made meanwhile on the same catalogue learns afresh).
    fn take(&self, requests: &[Request]) -> Vec<SiteFits> {
        let mut fits = self.lock();
        requests
            .iter()
            .map(|r| fits.remove(r).unwrap_or_default())
            .collect()
    }

    /// Puts back what [`FitCache::take`] took, with what the decision learnt.
    fn put_back(&self, requests: Vec<Request>, known: Vec<SiteFits>) {
        let mut fits = self.lock();
        if fits.values().map(|sites| sites.len()).sum::<usize>() >= FITS_KEPT {
            fits.clear();
        }
        for (request, sites) in requests.into_iter().zip(known) {
            fits.insert(request, sites);
        }
    }

    /// Drops what was learnt of `site`: its shapes, prices or cordons changed.
    pub(crate) fn forget(&self, site: &SiteEntry) {
        for sites in self.lock().values_mut() {
            sites.remove(&site.id);
        }
        self.indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&site.name);
    }

    /// `site`'s shape index for `sheet`, built on first use.
    fn index(&self, site: &SiteEntry, sheet: &meridian_events::PriceSheet) -> Arc<ShapeIndex> {
        let kept = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, index)) = kept
            .get(&site.name)
            .filter(|(at, _)| *at == sheet.effective_from)
        {
            return index.clone();
        }
        drop(kept);
        let index = Arc::new(ShapeIndex::build(&site.shapes, sheet));
        self.indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(site.name.clone(), (sheet.effective_from, index.clone()));
        index
    }

    /// How many fits are kept.
    pub fn len(&self) -> usize {
        self.lock().values().map(|sites| sites.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Clone for FitCache {
    /// A copy remembers no fit, but shares the shape indexes built so far: they hang on
    /// nothing but the site's shapes and sheet, the same in the copy until it forgets them.
    fn clone(&self) -> Self {
        FitCache {
            fits: Default::default(),
            indexes: std::sync::Mutex::new(
                self.indexes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
            ),
        }
    }
}

impl std::fmt::Debug for FitCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FitCache({} fits)", self.len())
    }
}

/// What a decision knows of each site for one request, by the site's id: a site's
/// entry keeps the id it was first registered with, and ids hash cheaply where names
/// would be hashed and compared at every site of every decision.
type SiteFits = std::collections::HashMap<Uuid, Fit, std::hash::BuildHasherDefault<SiteIdHasher>>;

/// Hashes a site's id by folding its bytes and mixing the result, not through SipHash:
/// the ids are not chosen by whoever submits work. The mixing matters: ids made in the
/// same millisecond differ only in a counter and a few random bytes, and hashbrown takes
/// a key's bucket from the low bits and its tag from the top seven.
#[derive(Default)]
struct SiteIdHasher(u64);

impl std::hash::Hasher for SiteIdHasher {
    fn finish(&self) -> u64 {
        // SplitMix64's finaliser: every input bit reaches both ends of the hash.
        let mut h = self.0;
        h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^ (h >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
        }
    }
}

/// What a shape search depends on besides the site (its shapes, cordons and sheet):
/// one job's request, made once per decision.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Request {
    nodes: u32,
    cpus: u32,
    memory: u64,
    walltime: u64,
    gpus: Option<(u32, &'static str, Option<String>, Option<u64>)>,
    tasks: u32,
    spot: bool,
}

impl Request {
    fn new(resources: &Resources, tasks: u32, spot: bool) -> Request {
        Request {
            nodes: resources.nodes,
            cpus: resources.cpus,
            memory: resources.memory.bytes(),
            walltime: resources.walltime.secs(),
            gpus: resources.gpus.as_ref().map(|g| {
                (
                    g.count,
                    g.vendor.as_str(),
                    g.model.clone(),
                    g.memory.map(|m| m.bytes()),
                )
            }),
            tasks,
            spot,
        }
    }
}

/// A shape search's outcome, with the price sheet it was priced with: the rate and cost
/// of the cheapest fit, or the first three reasons shapes did not fit and how many more
/// there were.
#[derive(Clone)]
struct Fit {
    sheet: DateTime<Utc>,
    found: Found,
}

type Found = Result<(Arc<ComputeRate>, Decimal), Arc<(Vec<String>, usize)>>;

/// A shape search's answer: the cheapest fit's rate and compute cost, or the first three
/// reasons shapes did not fit and how many more there were.
type Searched = Result<(ComputeRate, Decimal), (Vec<String>, usize)>;

/// How a decision searches a site's shapes for what it has not learnt yet: through the
/// site's [`ShapeIndex`], or (`Catalog::scan_every_shape`) shape by shape.
#[derive(Clone, Copy)]
struct Search<'c> {
    cache: &'c FitCache,
    scan_every_shape: bool,
}

impl Search<'_> {
    fn run(
        self,
        site: &SiteEntry,
        sheet: &meridian_events::PriceSheet,
        resources: &Resources,
        tasks: u32,
        spot: bool,
    ) -> Searched {
        if self.scan_every_shape {
            return search_shapes(site, sheet, resources, tasks, spot);
        }
        let index = self.cache.index(site, sheet);
        let seconds = Decimal::from(resources.walltime.secs()) * Decimal::from(tasks);
        let fits = |i: usize| {
            let shape = &site.shapes[i];
            let cordoned = shape
                .gpus
                .as_ref()
                .map_or(0, |g| site.cordoned_of(&g.model));
            shape_misfit(shape, resources, cordoned).is_none()
        };
        match index.cheapest(
            sheet,
            (&allocation(resources), seconds),
            resources.gpus.is_some(),
            spot,
            fits,
        ) {
            Some(found) => {
                // The first offer of its name, as `PriceSheet::compute_rate` would find.
                let offer = &sheet.compute[found.offer];
                let rate = ComputeRate {
                    offer: offer.offer.clone(),
                    pricing: offer.pricing.clone(),
                    currency: sheet.currency,
                    effective_from: sheet.effective_from,
                    source: sheet.source.clone(),
                };
                Ok((rate, found.cost))
            }
            // Nothing fits: every shape's reason, as the scan gives them.
            None => search_shapes(site, sheet, resources, tasks, spot),
        }
    }
}

/// The compute cost of the cheapest way to run `tasks` tasks of `resources` on one of
/// `site`'s shapes, or why no shape fits. Learnt once per site, request and price sheet:
/// `known` is what the [`FitCache`] holds for this request, by site, and keeps the rate
/// ([`SiteOffer::rate`]). Only the cost is copied out: every site is priced at every
/// decision, and the rate is wanted of the chosen ones alone.
fn cheapest_shape(
    site: &SiteEntry,
    sheet: &meridian_events::PriceSheet,
    job: &str,
    (resources, tasks, spot): (&Resources, u32, bool),
    (search, known): (Search<'_>, &mut SiteFits),
) -> Result<Decimal, String> {
    let learn = || Fit {
        sheet: sheet.effective_from,
        found: match search.run(site, sheet, resources, tasks, spot) {
            Ok((rate, cost)) => Ok((Arc::new(rate), cost)),
            Err(why) => Err(Arc::new(why)),
        },
    };
    // One lookup: kept, learnt again when priced with an older sheet, or learnt now.
    let fit = known
        .entry(site.id)
        .and_modify(|kept| {
            if kept.sheet != sheet.effective_from {
                *kept = learn();
            }
        })
        .or_insert_with(learn);
    fit.found.as_ref().map(|(_, cost)| *cost).map_err(|why| {
        let (shown, more) = &**why;
        format!(
            "no shape fits job {job}: {}{}",
            shown.join("; "),
            if *more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        )
    })
}

/// Every shape of `site` against `resources`: the cheapest fitting offer, priced.
fn search_shapes(
    site: &SiteEntry,
    sheet: &meridian_events::PriceSheet,
    resources: &Resources,
    tasks: u32,
    spot: bool,
) -> Searched {
    let seconds = Decimal::from(resources.walltime.secs()) * Decimal::from(tasks);
    let allocation = allocation(resources);
    // The sheet's offers by name; the first of a name counts, as `compute_rate` finds it.
    let by_offer: std::collections::HashMap<&str, &meridian_events::ComputeOffer> = sheet
        .compute
        .iter()
        .rev()
        .map(|o| (o.offer.as_str(), o))
        .collect();
    let mut best: Option<(&str, Decimal)> = None;
    let (mut shown, mut misfits) = (Vec::new(), 0usize);
    let mut note = |why: &dyn std::fmt::Display| {
        if shown.len() < 3 {
            shown.push(why.to_string());
        }
        misfits += 1;
    };
    for shape in &site.shapes {
        let cordoned = shape
            .gpus
            .as_ref()
            .map_or(0, |g| site.cordoned_of(&g.model));
        if let Some(why) = shape_misfit(shape, resources, cordoned) {
            note(&why);
            continue;
        }
        let offers = std::iter::once(&shape.offer)
            .chain(spot.then_some(shape.spot_offer.as_ref()).flatten());
        for offer in offers {
            let Some(priced) = by_offer.get(offer.as_str()) else {
                note(&format_args!(
                    "{} has no price for offer {offer}",
                    shape.name
                ));
                continue;
            };
            let Ok(cost) = priced.pricing.amount(&allocation, seconds) else {
                continue;
            };
            if best.is_none_or(|(_, c)| cost < c) {
                best = Some((priced.offer.as_str(), cost));
            }
        }
    }
    match best {
        Some((offer, cost)) => Ok((
            sheet
                .compute_rate(offer)
                .expect("the offer comes from this sheet"),
            cost,
        )),
        None => Err((shown, misfits.saturating_sub(3))),
    }
}

/// Decides where `spec` runs at `now` among the catalogue's sites, with no tenant policy
/// beyond the workflow's own hints (offline quotes). The router uses [`decide_for`].
pub fn decide(spec: &Workflow, catalog: &Catalog, now: DateTime<Utc>) -> Decision {
    decide_for(spec, None, catalog, now)
}

/// What one site offers a workflow: each job's cheapest compute cost there, or why the
/// job does not fit, in the order of the workflow's work (a job past the first that does
/// not fit is left out unless every job was priced).
struct SiteOffer<'c> {
    site: &'c SiteEntry,
    sheet: &'c meridian_events::PriceSheet,
    jobs: Vec<Result<Decimal, String>>,
}

impl SiteOffer<'_> {
    /// The rate the cost of the `job`th of the work was priced at, if it fits: the
    /// sheet's first offer at a site without shapes, else its fit in `known`.
    fn rate(&self, job: usize, known: &[SiteFits]) -> Option<ComputeRate> {
        self.jobs.get(job)?.as_ref().ok()?;
        if self.site.shapes.is_empty() {
            let first = self.sheet.compute.first()?;
            return self.sheet.compute_rate(&first.offer);
        }
        let (rate, _) = known.get(job)?.get(&self.site.id)?.found.as_ref().ok()?;
        Some(ComputeRate::clone(rate))
    }
}

/// Egress estimates through volume tiers: the tenant's month so far out of each source,
/// plus what this estimate already moved from it.
struct EgressMeter<'c> {
    catalog: &'c Catalog,
    tenant: Option<&'c str>,
    now: DateTime<Utc>,
    moved_gb: BTreeMap<String, Decimal>,
}

impl<'c> EgressMeter<'c> {
    fn new(catalog: &'c Catalog, tenant: Option<&'c str>, now: DateTime<Utc>) -> Self {
        EgressMeter {
            catalog,
            tenant,
            now,
            moved_gb: BTreeMap::new(),
        }
    }

    /// What `bytes` leaving `from` for `destination` would cost now, without counting them.
    fn price(&self, from: &SiteEntry, destination: Destination, bytes: u64) -> Option<Decimal> {
        let tariff = from.prices_at(self.now)?.egress_tariff_to(destination);
        let already = self.already_gb(&from.name);
        tariff.cost_after(already, gb(bytes)).ok()
    }

    fn already_gb(&self, source: &str) -> Decimal {
        let before = self.tenant.map_or(Decimal::ZERO, |t| {
            self.catalog.egress_so_far(t, source, self.now)
        });
        before + self.moved_gb.get(source).copied().unwrap_or_default()
    }

    /// Prices `bytes` leaving `from` and counts them towards its later tiers.
    fn charge(&mut self, from: &SiteEntry, destination: Destination, bytes: u64) -> Decimal {
        let cost = self.price(from, destination, bytes).unwrap_or_default();
        *self.moved_gb.entry(from.name.clone()).or_default() += gb(bytes);
        cost
    }
}

fn gb(bytes: u64) -> Decimal {
    Decimal::from(bytes) / Decimal::from(1_000_000_000u64)
}

/// How egress prices class a copy from `from` to `to`.
pub fn destination(from: &SiteEntry, to: &SiteEntry) -> Destination {
    if from.region == to.region {
        Destination::SameRegion
    } else if from.kind == to.kind {
        Destination::OtherRegion
    } else {
        Destination::Internet
    }
}

/// Why the workflow's hints or the tenant's policy keep `site` out, if they do.
fn not_allowed(
    site: &SiteEntry,
    spec: &Workflow,
    policy: &PlacementPolicy,
    disconnected: &BTreeSet<&str>,
) -> Option<String> {
    let hints = &spec.placement;
    if !hints.sites.is_empty() && !hints.sites.contains(&site.name) {
        return Some("not in the workflow's placement.sites".into());
    }
    if !policy.sites.is_empty() && !policy.sites.contains(&site.name) {
        return Some("not among the sites the tenant's policy allows".into());
    }
    if !hints.regions.is_empty() && !hints.regions.contains(&site.region) {
        return Some(format!(
            "region {} is not in the workflow's placement.regions",
            site.region
        ));
    }
    if !policy.regions.is_empty() && !policy.regions.contains(&site.region) {
        return Some(format!(
            "region {} is not among the regions the tenant's policy allows",
            site.region
        ));
    }
    for (residency, whose) in [
        (&hints.residency, "the workflow's"),
        (&policy.residency, "the tenant's"),
    ] {
        if let Some(residency) = residency {
            if &site.jurisdiction != residency {
                return Some(format!(
                    "jurisdiction {} does not satisfy {whose} residency {residency}",
                    site.jurisdiction
                ));
            }
        }
    }
    if site.drained {
        return Some("drained by an admin".into());
    }
    if let Some(reason) = &site.excluded {
        return Some(reason.clone());
    }
    if !site.healthy {
        return Some(match &site.health_message {
            Some(why) => format!("unhealthy at its last report: {why}"),
            None => "unhealthy at its last report".into(),
        });
    }
    if disconnected.contains(site.name.as_str()) {
        return Some(NOT_CONNECTED.into());
    }
    None
}

/// Why `total` breaks a budget of the workflow or the tenant, if it does. A budget in
/// another currency cannot be checked (there are no exchange rates), so it keeps the
/// site out rather than letting the estimate past unchecked.
fn over_budget(total: &Money, spec: &Workflow, policy: &PlacementPolicy) -> Option<String> {
    let budgets = [
        spec.placement
            .budget
            .as_ref()
            .map(|b| ("the workflow's budget", b.amount, b.currency.clone())),
        policy.budget_per_workflow.as_ref().map(|b| {
            (
                "the tenant's budget per workflow",
                b.amount,
                b.currency.to_string(),
            )
        }),
    ];
    for (whose, amount, currency) in budgets.into_iter().flatten() {
        if currency != total.currency.to_string() {
            return Some(format!(
                "priced in {}, which {whose} of {amount} {currency} cannot be compared with (no exchange rates)",
                total.currency
            ));
        }
        if total.amount > amount {
            return Some(format!(
                "estimated {} {} exceeds {whose} of {amount} {currency}",
                total.amount, total.currency
            ));
        }
    }
    None
}

/// Each job's cheapest way to run at `site`. Unless `every_job` (a split plan needs to
/// know each job's fit), pricing stops at the first job that does not fit.
fn offer<'c>(
    site: &'c SiteEntry,
    sheet: &'c meridian_events::PriceSheet,
    work: &'c [(String, &Resources, u32)],
    spot: bool,
    every_job: bool,
    (search, known): (Search<'_>, &mut [SiteFits]),
) -> Result<SiteOffer<'c>, String> {
    let mut jobs = Vec::with_capacity(work.len());
    if site.shapes.is_empty() {
        // A site without declared shapes is judged by its labels and first offer.
        let offer = sheet
            .compute
            .first()
            .ok_or("its price sheet has no compute offer")?;
        for (job, resources, tasks) in work {
            let priced = match misfit(site, job, resources) {
                Some(reason) => Err(reason),
                None => {
                    let seconds = Decimal::from(resources.walltime.secs()) * Decimal::from(*tasks);
                    offer
                        .pricing
                        .amount(&allocation(resources), seconds)
                        .map_err(|_| "the estimate overflows".to_string())
                }
            };
            let misfit = priced.is_err();
            jobs.push(priced);
            if misfit && !every_job {
                break;
            }
        }
    } else {
        for ((job, resources, tasks), known) in work.iter().zip(known) {
            let priced =
                cheapest_shape(site, sheet, job, (resources, *tasks, spot), (search, known));
            let misfit = priced.is_err();
            jobs.push(priced);
            if misfit && !every_job {
                break;
            }
        }
    }
    Ok(SiteOffer { site, sheet, jobs })
}

/// Decides where `spec` of `tenant` runs at `now`: the stricter of the workflow's hints
/// and the tenant's placement policy apply, and only sites an adapter serves are chosen
/// (unless the catalogue ignores connections). When only sites no adapter serves would
/// fit, the decision is to wait for one of them.
pub fn decide_for(
    spec: &Workflow,
    tenant: Option<&str>,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> Decision {
    let disconnected: BTreeSet<&str> = if catalog.ignore_connections {
        BTreeSet::new()
    } else {
        catalog
            .sites
            .values()
            .filter(|s| !s.connected_at(now))
            .map(|s| s.name.as_str())
            .collect()
    };
    let decision = decide_among(spec, tenant, catalog, now, &disconnected);
    let Decision::Rejected { rejections } = decision else {
        return decision;
    };
    let waiting_for = |placed: &Placed| -> Vec<String> {
        let mut sites: Vec<String> = placed
            .explanation
            .candidates
            .iter()
            .filter(|c| !matches!(c.verdict, Verdict::Rejected { .. }))
            .map(|c| c.site.clone())
            .chain(placed.job_sites.values().cloned())
            .chain([placed.site.clone()])
            .filter(|s| disconnected.contains(s.as_str()))
            .collect();
        sites.sort();
        sites.dedup();
        sites
    };
    if disconnected.is_empty() {
        return Decision::Rejected { rejections };
    }
    match decide_among(spec, tenant, catalog, now, &BTreeSet::new()) {
        Decision::Placed(placed) => Decision::Waiting {
            sites: waiting_for(&placed),
            rejections,
        },
        _ => Decision::Rejected { rejections },
    }
}

/// What [`decide_for`] would decide were every site served by an adapter: an estimate
/// (a budget's) that does not depend on which adapters are connected now.
pub fn decide_as_if_connected(
    spec: &Workflow,
    tenant: Option<&str>,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> Decision {
    decide_among(spec, tenant, catalog, now, &BTreeSet::new())
}

fn decide_among(
    spec: &Workflow,
    tenant: Option<&str>,
    catalog: &Catalog,
    now: DateTime<Utc>,
    disconnected: &BTreeSet<&str>,
) -> Decision {
    let open = PlacementPolicy::open();
    let policy = tenant.and_then(|t| catalog.policy(t)).unwrap_or(&open);
    let work = workloads(spec);
    let spot = spec.placement.spot && policy.spot_allowed;
    let may_split = spec.placement.split && work.len() > 1;
    let requests: Vec<Request> = work
        .iter()
        .map(|(_, resources, tasks)| Request::new(resources, *tasks, spot))
        .collect();
    let mut known = catalog.fits.take(&requests);
    // The workflow's span, for storage at every site.
    let span = Decimal::from(span_seconds(spec));
    let mut candidates = Vec::with_capacity(catalog.sites.len());
    let mut offers: Vec<SiteOffer> = Vec::with_capacity(catalog.sites.len());
    // Each site that can run the whole workflow: its total, the site, and its offer's
    // place in `offers` (rates are copied out for the chosen site only).
    let mut priced: Vec<(Money, &SiteEntry, usize)> = Vec::with_capacity(catalog.sites.len());
    for site in catalog.sites.values() {
        let reject = |reason: String| Candidate {
            site: site.name.clone(),
            verdict: Verdict::Rejected { reason },
            cost: None,
        };
        if let Some(reason) = not_allowed(site, spec, policy, disconnected) {
            candidates.push(reject(reason));
            continue;
        }
        let Some(sheet) = site.prices_at(now) else {
            candidates.push(reject("has no prices in force".into()));
            continue;
        };
        let search = Search {
            cache: &catalog.fits,
            scan_every_shape: catalog.scan_every_shape,
        };
        let site_offer = match offer(site, sheet, &work, spot, may_split, (search, &mut known)) {
            Ok(o) => o,
            Err(reason) => {
                candidates.push(reject(reason));
                continue;
            }
        };
        // Every rate of a site comes from its sheet in force, so in the sheet's currency.
        // When several jobs do not fit (a split prices them all), the reason given is
        // that of the job first by name.
        let misfit = site_offer
            .jobs
            .iter()
            .zip(&work)
            .filter_map(|(cost, (job, ..))| cost.as_ref().err().map(|why| (job, why)))
            .min_by_key(|(job, _)| *job);
        let whole = match misfit {
            Some((_, why)) => Err(why.clone()),
            None => Ok(site_offer.jobs.iter().flatten().sum::<Decimal>()),
        };
        let nothing_to_run = site_offer.jobs.is_empty();
        // What fits here counts for the split plan too.
        offers.push(site_offer);
        let offer_at = offers.len() - 1;
        let compute = match whole {
            Ok(_) if nothing_to_run => {
                candidates.push(reject("the workflow has nothing to run".into()));
                continue;
            }
            Ok(compute) => compute,
            Err(reason) => {
                candidates.push(reject(reason));
                continue;
            }
        };
        let currency = sheet.currency;
        let mut meter = EgressMeter::new(catalog, tenant, now);
        let data_in = spec
            .volumes
            .values()
            .map(|v| ingress_cost(v, catalog, site, &mut meter))
            .sum();
        let terms = CostTerms {
            currency,
            compute,
            data_in,
            storage: storage_estimate(spec, span, sheet),
            data_out: egress_estimate(spec, site, &mut meter),
            data_between: Decimal::ZERO,
        };
        let Ok(total) = terms.total() else {
            candidates.push(reject("the estimate overflows".into()));
            continue;
        };
        if let Some(reason) = over_budget(&total, spec, policy) {
            candidates.push(Candidate {
                site: site.name.clone(),
                verdict: Verdict::Rejected { reason },
                cost: Some(terms),
            });
            continue;
        }
        candidates.push(Candidate {
            site: site.name.clone(),
            verdict: Verdict::Fitted,
            cost: Some(terms),
        });
        priced.push((total, site, offer_at));
    }

    // Sites priced in different currencies are not compared by amount alone (there are
    // no exchange rates yet): currency orders first. `prefer: cheapest` then takes the
    // lowest estimate, ties going to the more reliable site, then the one with the free
    // GPUs of the models wanted, then the shorter queue; `prefer: fastest` takes the site
    // with those GPUs free, then the shortest queue, then reliability, then the
    // estimate. The site's name breaks what is left, so decisions repeat.
    let queue = |s: &SiteEntry| s.capacity.as_ref().map_or(0, |c| c.pending_jobs);
    let unreliability = |s: &SiteEntry| ((1.0 - s.reliability()) * 1e6) as u64;
    let short = |s: &SiteEntry| gpu_shortfall(s, &work);
    // Each site's shortfall, queue and unreliability, worked out once rather than at
    // every comparison.
    let keyed = priced
        .into_iter()
        .map(|p| ((short(p.1), queue(p.1), unreliability(p.1)), p));
    // Only the first in that order is wanted: the least, not a sort of them all.
    let first = keyed.min_by(|(ka, a), (kb, b)| {
        let (short_a, queue_a, unreliable_a) = ka;
        let (short_b, queue_b, unreliable_b) = kb;
        let currency = a.0.currency.cmp(&b.0.currency);
        let by_cost = a.0.amount.cmp(&b.0.amount);
        let by_speed = short_a
            .cmp(short_b)
            .then(queue_a.cmp(queue_b))
            .then(unreliable_a.cmp(unreliable_b));
        let order = match spec.placement.prefer {
            meridian_spec::Preference::Cheapest => by_cost.then(
                unreliable_a
                    .cmp(unreliable_b)
                    .then(short_a.cmp(short_b))
                    .then(queue_a.cmp(queue_b)),
            ),
            meridian_spec::Preference::Fastest => by_speed.then(by_cost),
        };
        currency.then(order).then(a.1.name.cmp(&b.1.name))
    });
    // The chosen site's rates: what fits there, every job.
    let best = first.map(|(_, (total, site, at))| {
        let offer = &offers[at];
        let job_rates: BTreeMap<String, ComputeRate> = work
            .iter()
            .enumerate()
            .map(|(at, (job, ..))| {
                let rate = offer.rate(at, &known);
                (
                    job.clone(),
                    rate.expect("a priced site has a rate for every job"),
                )
            })
            .collect();
        (total, site, offer.sheet.storage_rate(), job_rates)
    });

    let split = may_split.then(|| {
        if !policy.split_allowed {
            return Err(Box::new(SplitPlan {
                verdict: Verdict::Rejected {
                    reason: "the tenant's policy does not allow splitting a workflow".into(),
                },
                jobs: Vec::new(),
                moves: Vec::new(),
                cost: None,
            }));
        }
        let currency = best.as_ref().map(|b| b.0.currency);
        split_plan(
            spec,
            &work,
            (&offers, &known),
            currency,
            catalog,
            tenant,
            now,
            policy,
        )
    });
    catalog.fits.put_back(requests, known);
    let mut split_explained = None;
    let mut chosen_split = None;
    match split {
        None => {}
        Some(Err(plan)) => split_explained = Some(*plan),
        Some(Ok(planned)) => {
            let take = match &best {
                None => true,
                Some((total, ..)) => {
                    spec.placement.prefer == meridian_spec::Preference::Cheapest
                        && planned.total.currency == total.currency
                        && planned.total.amount < total.amount
                }
            };
            if take {
                chosen_split = Some(planned);
            } else {
                let mut plan = planned.plan;
                plan.verdict = Verdict::Fitted;
                split_explained = Some(plan);
            }
        }
    }

    if let Some(mut planned) = chosen_split {
        planned.plan.verdict = Verdict::Chosen;
        let home = planned.plan.jobs[0].site.clone();
        let home_entry = catalog.find(&home).expect("planned at a known site");
        let job_sites: BTreeMap<String, String> = planned
            .plan
            .jobs
            .iter()
            .filter(|j| j.site != home)
            .map(|j| (j.job.clone(), j.site.clone()))
            .collect();
        let storage_rates = planned
            .sheets
            .iter()
            .filter(|(site, _)| **site != home)
            .map(|(site, rate)| (site.clone(), rate.clone()))
            .collect();
        let first_job = planned.plan.jobs[0].job.clone();
        return Decision::Placed(Box::new(Placed {
            site: home.clone(),
            region: home_entry.region.clone(),
            job_sites,
            storage_rates,
            rate: planned.job_rates[&first_job].clone(),
            job_rates: planned.job_rates,
            storage_rate: planned.sheets[&home].clone(),
            estimated_cost: planned.total,
            explanation: PlacementExplanation {
                candidates,
                split: Some(planned.plan),
            },
        }));
    }

    let Some((total, site, storage_rate, job_rates)) = best else {
        let mut rejections = candidates
            .into_iter()
            .map(|c| SiteRejection {
                site: c.site,
                reason: match c.verdict {
                    Verdict::Rejected { reason } => reason,
                    _ => "not chosen".into(),
                },
            })
            .collect::<Vec<_>>();
        if rejections.is_empty() {
            rejections.push(SiteRejection {
                site: "(none)".into(),
                reason: "no sites are registered".into(),
            });
        }
        if let Some(SplitPlan {
            verdict: Verdict::Rejected { reason },
            ..
        }) = &split_explained
        {
            rejections.push(SiteRejection {
                site: "(split across sites)".into(),
                reason: reason.clone(),
            });
        }
        return Decision::Rejected { rejections };
    };
    for c in &mut candidates {
        if c.site == site.name {
            c.verdict = Verdict::Chosen;
        }
    }
    let rate = work
        .first()
        .and_then(|(job, ..)| job_rates.get(job))
        .cloned()
        .expect("a priced site has a rate for every job");
    Decision::Placed(Box::new(Placed {
        site: site.name.clone(),
        region: site.region.clone(),
        job_sites: BTreeMap::new(),
        storage_rates: BTreeMap::new(),
        rate,
        job_rates,
        storage_rate,
        estimated_cost: total,
        explanation: PlacementExplanation {
            candidates,
            split: split_explained,
        },
    }))
}

/// A priced split plan, with what the placement event needs.
struct PlannedSplit {
    plan: SplitPlan,
    total: Money,
    job_rates: BTreeMap<String, ComputeRate>,
    /// The storage rate at every site the plan uses.
    sheets: BTreeMap<String, StorageRate>,
}

/// Places each job in `requires` order at the site where it costs least: its compute
/// there, plus bringing each volume it mounts from where the job before left it (or its
/// inputs, for the first job to mount it). Greedy, so not always the cheapest split, but
/// linear in jobs × sites and explainable term by term. `Err` carries the reason no
/// split works.
#[allow(clippy::too_many_arguments)]
fn split_plan(
    spec: &Workflow,
    work: &[(String, &Resources, u32)],
    (offers, known): (&[SiteOffer], &[SiteFits]),
    currency: Option<meridian_events::Currency>,
    catalog: &Catalog,
    tenant: Option<&str>,
    now: DateTime<Utc>,
    policy: &PlacementPolicy,
) -> Result<PlannedSplit, Box<SplitPlan>> {
    // One currency, as there are no exchange rates: the best single site's, else each
    // currency any job fits in, by code, until one gives a plan.
    let currencies = match currency {
        Some(c) => vec![c],
        None => {
            let mut codes: Vec<_> = offers
                .iter()
                .filter(|o| o.jobs.iter().any(Result::is_ok))
                .map(|o| o.sheet.currency)
                .collect();
            codes.sort_by_key(|c| c.to_string());
            codes.dedup();
            codes
        }
    };
    let mut last = None;
    for currency in currencies {
        match split_plan_in(
            spec,
            work,
            (offers, known),
            currency,
            catalog,
            tenant,
            now,
            policy,
        ) {
            Ok(plan) => return Ok(plan),
            Err(plan) => last = Some(plan),
        }
    }
    Err(last.unwrap_or_else(|| rejected("no allowed site can run any of its jobs".into())))
}

fn rejected(reason: String) -> Box<SplitPlan> {
    Box::new(SplitPlan {
        verdict: Verdict::Rejected { reason },
        jobs: Vec::new(),
        moves: Vec::new(),
        cost: None,
    })
}

/// [`split_plan`] among the sites priced in `currency`.
#[allow(clippy::too_many_arguments)]
fn split_plan_in(
    spec: &Workflow,
    work: &[(String, &Resources, u32)],
    (offers, known): (&[SiteOffer], &[SiteFits]),
    currency: meridian_events::Currency,
    catalog: &Catalog,
    tenant: Option<&str>,
    now: DateTime<Utc>,
    policy: &PlacementPolicy,
) -> Result<PlannedSplit, Box<SplitPlan>> {
    let offers: Vec<&SiteOffer> = offers
        .iter()
        .filter(|o| o.sheet.currency == currency)
        .collect();
    let mut meter = EgressMeter::new(catalog, tenant, now);
    let mut volume_at: BTreeMap<&str, &SiteEntry> = BTreeMap::new();
    // Each volume is held at every site whose jobs mount it, as the router holds it.
    let mut held_at: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    let mut jobs = Vec::new();
    let mut moves = Vec::new();
    let mut job_rates = BTreeMap::new();
    let mut sheets = BTreeMap::new();
    let mut terms = CostTerms {
        currency,
        compute: Decimal::ZERO,
        data_in: Decimal::ZERO,
        storage: Decimal::ZERO,
        data_out: Decimal::ZERO,
        data_between: Decimal::ZERO,
    };
    let order = spec.job_order();
    for job in order.iter().copied() {
        // Where the job's offers are in each site's.
        let Some(at) = work.iter().position(|(name, ..)| name == job) else {
            continue;
        };
        let mounted: Vec<&str> = spec.mounts_of(job).collect();
        // What running `job` at `o` would add: compute, plus its volumes' arrival.
        let cost_at = |o: &SiteOffer| -> Option<Decimal> {
            let compute = o.jobs.get(at)?.as_ref().ok()?;
            let mut sum = *compute;
            for volume in &mounted {
                sum += match volume_at.get(volume) {
                    Some(at) if at.name == o.site.name => Decimal::ZERO,
                    Some(at) => {
                        let bytes = spec.volumes.get(*volume).map_or(0, |v| v.size.bytes());
                        meter.price(at, destination(at, o.site), bytes)?
                    }
                    None => spec
                        .volumes
                        .get(*volume)
                        .map_or(Decimal::ZERO, |v| ingress_price(v, catalog, o.site, &meter)),
                };
            }
            Some(sum)
        };
        let used: Vec<&str> = jobs
            .iter()
            .map(|j: &JobPlacement| j.site.as_str())
            .collect();
        let choice = offers
            .iter()
            .filter_map(|o| cost_at(o).map(|c| (c, *o)))
            .min_by(|a, b| {
                a.0.cmp(&b.0)
                    // Equal cost: stay where earlier jobs run, then by name.
                    .then(
                        (!used.contains(&a.1.site.name.as_str()))
                            .cmp(&!used.contains(&b.1.site.name.as_str())),
                    )
                    .then(a.1.site.name.cmp(&b.1.site.name))
            });
        let Some((_, chosen)) = choice else {
            let why = offers
                .iter()
                .filter_map(|o| match o.jobs.get(at) {
                    Some(Err(reason)) => Some(format!("{}: {reason}", o.site.name)),
                    _ => None,
                })
                .take(3)
                .collect::<Vec<_>>()
                .join("; ");
            return Err(rejected(format!(
                "job {job} fits no allowed site priced in {currency}{}",
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                }
            )));
        };
        let compute = chosen.jobs[at].as_ref().expect("chosen where it fits");
        let rate = chosen.rate(at, known).expect("chosen where it fits");
        terms.compute += *compute;
        for volume in &mounted {
            let Some(declared) = spec.volumes.get(*volume) else {
                continue;
            };
            match volume_at.get(volume).copied() {
                Some(at) if at.name == chosen.site.name => {}
                Some(at) => {
                    let bytes = declared.size.bytes();
                    let cost = meter.charge(at, destination(at, chosen.site), bytes);
                    terms.data_between += cost;
                    moves.push(VolumeMove {
                        volume: volume.to_string(),
                        from: at.name.clone(),
                        to: chosen.site.name.clone(),
                        bytes,
                        before_job: job.to_string(),
                        cost,
                    });
                }
                None => terms.data_in += ingress_cost(declared, catalog, chosen.site, &mut meter),
            }
            volume_at.insert(volume, chosen.site);
            held_at
                .entry(*volume)
                .or_default()
                .insert(chosen.site.name.as_str());
        }
        sheets.insert(chosen.site.name.clone(), chosen.sheet.storage_rate());
        jobs.push(JobPlacement {
            job: job.to_string(),
            site: chosen.site.name.clone(),
            offer: rate.offer.clone(),
            compute: *compute,
        });
        job_rates.insert(job.to_string(), rate);
    }
    let Some(home) = jobs.first().map(|j| j.site.clone()) else {
        return Err(rejected("the workflow has nothing to run".into()));
    };
    let home = catalog.find(&home).expect("planned at a known site");
    // Volumes no job mounts are filled and held at the first job's site; results leave
    // from where the last job to use each volume ran.
    let span = span_seconds(spec);
    for (name, volume) in &spec.volumes {
        if !volume_at.contains_key(name.as_str()) {
            terms.data_in += ingress_cost(volume, catalog, home, &mut meter);
        }
        let sites = held_at.get(name.as_str()).cloned().unwrap_or_default();
        let sites = if sites.is_empty() {
            std::collections::BTreeSet::from([home.name.as_str()])
        } else {
            sites
        };
        for site in sites {
            let cost = offers.iter().find(|o| o.site.name == site).and_then(|o| {
                o.sheet
                    .storage_rate()
                    .cost(volume.size.bytes(), Decimal::from(span))
                    .ok()
            });
            terms.storage += cost.map_or(Decimal::ZERO, |c| c.amount);
        }
        if !volume.egress.is_empty() {
            let from = volume_at.get(name.as_str()).copied().unwrap_or(home);
            terms.data_out += meter.charge(from, Destination::Internet, volume.size.bytes());
        }
    }
    let mut plan = SplitPlan {
        verdict: Verdict::Fitted,
        jobs,
        moves,
        cost: None,
    };
    let total = match terms.total() {
        Ok(t) => t,
        Err(_) => {
            plan.verdict = Verdict::Rejected {
                reason: "the estimate overflows".into(),
            };
            return Err(Box::new(plan));
        }
    };
    plan.cost = Some(terms);
    if plan.sites().len() < 2 {
        plan.verdict = Verdict::Rejected {
            reason: format!(
                "every job is cheapest at {}, so the plan is that site's",
                home.name
            ),
        };
        return Err(Box::new(plan));
    }
    if let Some(reason) = over_budget(&total, spec, policy) {
        plan.verdict = Verdict::Rejected { reason };
        return Err(Box::new(plan));
    }
    Ok(PlannedSplit {
        plan,
        total,
        job_rates,
        sheets,
    })
}

/// How long the workflow runs if nothing waits in a queue: the longest path through
/// `requires`, each step taking its walltime once per wave of its array (tasks over
/// parallelism, rounded up). Volumes are held from placement to the end, so storage is
/// estimated over this span.
fn span_seconds(spec: &Workflow) -> u64 {
    let mut finish: BTreeMap<&str, u64> = BTreeMap::new();
    for step in spec.job_order() {
        let duration = match (spec.jobs.get(step), spec.services.get(step)) {
            (Some(job), _) => {
                let waves = job
                    .array
                    .map_or(1, |a| a.len().div_ceil(a.parallelism.max(1)));
                job.resources.walltime.secs() * u64::from(waves)
            }
            (None, Some(service)) => service.resources.walltime.secs(),
            (None, None) => 0,
        };
        let start = spec
            .requires_of(step)
            .unwrap_or_default()
            .iter()
            .filter_map(|r| finish.get(r.as_str()))
            .max()
            .copied()
            .unwrap_or(0);
        finish.insert(step, start.saturating_add(duration));
    }
    finish.values().max().copied().unwrap_or(0)
}

/// Storage: every volume held from placement until the workflow ends, estimated over
/// its span without queue waits ([`span_seconds`]), at the site's storage rate.
fn storage_estimate(
    spec: &Workflow,
    span: Decimal,
    sheet: &meridian_events::PriceSheet,
) -> Decimal {
    if spec.volumes.is_empty() {
        return Decimal::ZERO;
    }
    let rate = sheet.storage_rate();
    spec.volumes
        .values()
        .filter_map(|v| rate.cost(v.size.bytes(), span).ok())
        .map(|cost| cost.amount)
        .sum()
}

/// Results leaving the site: each volume with egress steps, at most its size, at the
/// site's internet egress through its volume tiers.
fn egress_estimate(spec: &Workflow, site: &SiteEntry, meter: &mut EgressMeter) -> Decimal {
    spec.volumes
        .values()
        .filter(|v| !v.egress.is_empty())
        .map(|v| meter.charge(site, Destination::Internet, v.size.bytes()))
        .sum()
}

/// The cheapest holder of the data set `uri` names, for a copy to `site`, with its price;
/// `None` when the data is already there or its size is not known.
fn cheapest_holder<'c>(
    uri: &str,
    catalog: &'c Catalog,
    site: &SiteEntry,
    meter: &EgressMeter,
) -> Option<(&'c SiteEntry, u64, Decimal)> {
    let (digest, bytes) = catalog.dataset_for(uri)?;
    let holders = catalog.holdings.get(digest);
    if holders.is_some_and(|h| h.contains(&site.name)) {
        return None;
    }
    holders
        .into_iter()
        .flatten()
        .filter_map(|h| {
            let holder = catalog.find(h)?;
            let price = meter.price(holder, destination(holder, site), bytes)?;
            Some((holder, bytes, price))
        })
        .min_by(|a, b| a.2.cmp(&b.2).then(a.0.name.cmp(&b.0.name)))
}

/// What filling `volume` at `site` would cost, without counting it in `meter`.
fn ingress_price(
    volume: &meridian_spec::Volume,
    catalog: &Catalog,
    site: &SiteEntry,
    meter: &EgressMeter,
) -> Decimal {
    volume
        .ingress
        .iter()
        .filter_map(|step| cheapest_holder(&step.source, catalog, site, meter))
        .map(|(_, _, price)| price)
        .sum()
}

/// Inputs not already at `site`: each ingress source that names a known data set costs
/// its bytes at the cheapest holder's egress for the destination class (the holder's
/// same-region price when the site shares its region, its other-region price when it is
/// the same provider, else its internet price), through the holder's volume tiers.
/// Sources that name no known data set cost nothing here: their size is not known.
fn ingress_cost(
    volume: &meridian_spec::Volume,
    catalog: &Catalog,
    site: &SiteEntry,
    meter: &mut EgressMeter,
) -> Decimal {
    let mut total = Decimal::ZERO;
    for step in &volume.ingress {
        if let Some((holder, bytes, _)) = cheapest_holder(&step.source, catalog, site, meter) {
            total += meter.charge(holder, destination(holder, site), bytes);
        }
    }
    total
}
