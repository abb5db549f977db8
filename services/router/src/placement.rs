//! The placement decision, pure: filter the sites that can run every job, price the
//! whole workflow at each, choose the cheapest, and explain every candidate.
//!
//! Minimal today: compute cost only (data and storage terms are zero until datasets
//! and tariffs are modelled), fit judged from the site's labels (see
//! [`crate::catalog::labels`]). Ties go to the site name, so decisions are repeatable.

use chrono::{DateTime, Utc};
use meridian_events::money::Destination;
use meridian_events::vocabulary::site::Shape;
use meridian_events::vocabulary::workflow::{
    Candidate, CostTerms, PlacementExplanation, SiteRejection, Verdict,
};
use meridian_events::vocabulary::AcceleratorVendor;
use meridian_events::{Allocation, ComputeRate, Money, StorageRate};
use meridian_spec::{GpuVendor, Resources, Size, Walltime, Workflow};
use rust_decimal::Decimal;

use crate::catalog::{labels, Catalog, SiteEntry};

#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub site: String,
    pub region: String,
    /// The rate of the first job's shape; `job_rates` holds every job's.
    pub rate: ComputeRate,
    pub job_rates: std::collections::BTreeMap<String, ComputeRate>,
    pub storage_rate: StorageRate,
    pub estimated_cost: Money,
    pub explanation: PlacementExplanation,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Placed(Box<Placed>),
    Rejected { rejections: Vec<SiteRejection> },
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

/// Why `shape` cannot run a task of `resources`, if it cannot.
fn shape_misfit(shape: &Shape, resources: &Resources) -> Option<String> {
    if resources.cpus > shape.cpus {
        return Some(format!(
            "{} has {} CPUs, needs {}",
            shape.name, shape.cpus, resources.cpus
        ));
    }
    if resources.memory.bytes() > shape.memory_bytes {
        return Some(format!(
            "{} has {} of memory, needs {}",
            shape.name,
            Size::from_bytes(shape.memory_bytes),
            resources.memory
        ));
    }
    if resources.nodes > shape.max_nodes {
        return Some(format!(
            "{} runs at most {} node(s) per job, needs {}",
            shape.name, shape.max_nodes, resources.nodes
        ));
    }
    if let Some(limit) = shape.max_walltime_secs {
        if resources.walltime.secs() > limit {
            return Some(format!(
                "{} runs jobs of at most {}, needs {}",
                shape.name,
                Walltime::from_secs(limit),
                resources.walltime
            ));
        }
    }
    let Some(want) = &resources.gpus else {
        return None;
    };
    let Some(have) = &shape.gpus else {
        return Some(format!("{} has no GPUs, needs {}", shape.name, want.count));
    };
    let vendor_ok = match want.vendor {
        GpuVendor::Any => true,
        GpuVendor::Nvidia => have.vendor == AcceleratorVendor::Nvidia,
        GpuVendor::Amd => have.vendor == AcceleratorVendor::Amd,
    };
    let vendor_name = |v: AcceleratorVendor| match v {
        AcceleratorVendor::Nvidia => "NVIDIA",
        AcceleratorVendor::Amd => "AMD",
    };
    if !vendor_ok {
        return Some(format!(
            "{} has {} GPUs, needs {}",
            shape.name,
            vendor_name(have.vendor),
            want.vendor.as_str()
        ));
    }
    if let Some(model) = &want.model {
        if !have
            .model
            .to_ascii_lowercase()
            .starts_with(&model.to_ascii_lowercase())
        {
            return Some(format!("{} has {}, needs {model}", shape.name, have.model));
        }
    }
    if want.count > have.count {
        return Some(format!(
            "{} has {} GPUs per node, needs {}",
            shape.name, have.count, want.count
        ));
    }
    if let Some(memory) = want.memory {
        if memory.bytes() > have.memory_bytes {
            return Some(format!(
                "{}'s GPUs have {}, need {memory}",
                shape.name,
                Size::from_bytes(have.memory_bytes)
            ));
        }
    }
    None
}

/// The cheapest way to run `tasks` tasks of `resources` on one of `site`'s shapes: the
/// rate and the compute cost, or why no shape fits.
fn cheapest_shape(
    site: &SiteEntry,
    sheet: &meridian_events::PriceSheet,
    job: &str,
    resources: &Resources,
    tasks: u32,
    spot: bool,
) -> Result<(ComputeRate, Decimal), String> {
    let seconds = Decimal::from(resources.walltime.secs()) * Decimal::from(tasks);
    let mut best: Option<(ComputeRate, Decimal)> = None;
    let mut misfits = Vec::new();
    for shape in &site.shapes {
        if let Some(why) = shape_misfit(shape, resources) {
            misfits.push(why);
            continue;
        }
        let offers = std::iter::once(&shape.offer)
            .chain(spot.then_some(shape.spot_offer.as_ref()).flatten());
        for offer in offers {
            let Some(rate) = sheet.compute_rate(offer) else {
                misfits.push(format!("{} has no price for offer {offer}", shape.name));
                continue;
            };
            let Ok(cost) = rate.cost(&allocation(resources), seconds) else {
                continue;
            };
            if best.as_ref().is_none_or(|(_, c)| cost.amount < *c) {
                best = Some((rate, cost.amount));
            }
        }
    }
    best.ok_or_else(|| {
        let shown: Vec<String> = misfits.iter().take(3).cloned().collect();
        let more = misfits.len().saturating_sub(3);
        format!(
            "no shape fits job {job}: {}{}",
            shown.join("; "),
            if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        )
    })
}

/// Decides where `spec` runs at `now` among the catalogue's sites.
pub fn decide(spec: &Workflow, catalog: &Catalog, now: DateTime<Utc>) -> Decision {
    let work = workloads(spec);
    let mut candidates = Vec::new();
    #[allow(clippy::type_complexity)]
    let mut priced: Vec<(
        Money,
        &SiteEntry,
        ComputeRate,
        StorageRate,
        std::collections::BTreeMap<String, ComputeRate>,
    )> = Vec::new();
    for site in catalog.sites.values() {
        let reject = |reason: String| Candidate {
            site: site.name.clone(),
            verdict: Verdict::Rejected { reason },
            cost: None,
        };
        if !spec.placement.sites.is_empty() && !spec.placement.sites.contains(&site.name) {
            candidates.push(reject("not in the workflow's placement.sites".into()));
            continue;
        }
        if !spec.placement.regions.is_empty() && !spec.placement.regions.contains(&site.region) {
            candidates.push(reject(format!(
                "region {} is not in the workflow's placement.regions",
                site.region
            )));
            continue;
        }
        if let Some(residency) = &spec.placement.residency {
            if &site.jurisdiction != residency {
                candidates.push(reject(format!(
                    "jurisdiction {} does not satisfy residency {residency}",
                    site.jurisdiction
                )));
                continue;
            }
        }
        if site.drained {
            candidates.push(reject("drained by an admin".into()));
            continue;
        }
        if let Some(reason) = &site.excluded {
            candidates.push(reject(reason.clone()));
            continue;
        }
        if !site.healthy {
            candidates.push(reject("unhealthy at its last report".into()));
            continue;
        }
        let Some(sheet) = site.prices_at(now) else {
            candidates.push(reject("has no prices in force".into()));
            continue;
        };
        let mut job_rates = std::collections::BTreeMap::new();
        let mut compute = Decimal::ZERO;
        let mut misfit_reason = None;
        if site.shapes.is_empty() {
            // A site without declared shapes is judged by its labels and first offer.
            let Some(offer) = sheet.compute.first() else {
                candidates.push(reject("its price sheet has no compute offer".into()));
                continue;
            };
            if let Some(reason) = work.iter().find_map(|(job, r, _)| misfit(site, job, r)) {
                candidates.push(reject(reason));
                continue;
            }
            let rate = sheet
                .compute_rate(&offer.offer)
                .expect("the offer comes from this sheet");
            for (job, resources, tasks) in &work {
                let seconds = Decimal::from(resources.walltime.secs()) * Decimal::from(*tasks);
                match rate.cost(&allocation(resources), seconds) {
                    Ok(cost) => compute += cost.amount,
                    Err(_) => misfit_reason = Some("the estimate overflows".to_string()),
                }
                job_rates.insert(job.clone(), rate.clone());
            }
        } else {
            for (job, resources, tasks) in &work {
                match cheapest_shape(site, sheet, job, resources, *tasks, spec.placement.spot) {
                    Ok((rate, cost)) => {
                        compute += cost;
                        job_rates.insert(job.clone(), rate);
                    }
                    Err(reason) => {
                        misfit_reason = Some(reason);
                        break;
                    }
                }
            }
        }
        if let Some(reason) = misfit_reason {
            candidates.push(reject(reason));
            continue;
        }
        let Some(rate) = job_rates.values().next().cloned() else {
            candidates.push(reject("the workflow has nothing to run".into()));
            continue;
        };
        if job_rates.values().any(|r| r.currency != rate.currency) {
            candidates.push(reject("its offers are priced in several currencies".into()));
            continue;
        }
        let storage = storage_estimate(spec, sheet);
        let data_in = ingress_estimate(spec, catalog, site, now);
        let data_out = egress_estimate(spec, sheet);
        let terms = CostTerms {
            currency: rate.currency,
            compute,
            data_in,
            storage,
            data_out,
        };
        let Ok(total) = terms.total() else {
            candidates.push(reject("the estimate overflows".into()));
            continue;
        };
        if let Some(budget) = &spec.placement.budget {
            if budget.currency == rate.currency.to_string() && total.amount > budget.amount {
                candidates.push(Candidate {
                    site: site.name.clone(),
                    verdict: Verdict::Rejected {
                        reason: format!(
                            "estimated {} {} exceeds the budget of {budget}",
                            total.amount, total.currency
                        ),
                    },
                    cost: Some(terms),
                });
                continue;
            }
        }
        candidates.push(Candidate {
            site: site.name.clone(),
            verdict: Verdict::Fitted,
            cost: Some(terms),
        });
        priced.push((total, site, rate, sheet.storage_rate(), job_rates));
    }

    // Sites priced in different currencies are not compared by amount alone (there are
    // no exchange rates yet): currency orders first. `prefer: cheapest` then takes the
    // lowest estimate, ties going to the more reliable site, then the shorter queue;
    // `prefer: fastest` takes the shortest queue, then reliability, then the estimate.
    // The site's name breaks what is left, so decisions repeat.
    let queue = |s: &SiteEntry| s.capacity.as_ref().map_or(0, |c| c.pending_jobs);
    let unreliability = |s: &SiteEntry| ((1.0 - s.reliability()) * 1e6) as u64;
    priced.sort_by(|a, b| {
        let currency = a.0.currency.to_string().cmp(&b.0.currency.to_string());
        let by_cost = a.0.amount.cmp(&b.0.amount);
        let by_speed = queue(a.1)
            .cmp(&queue(b.1))
            .then(unreliability(a.1).cmp(&unreliability(b.1)));
        let order = match spec.placement.prefer {
            meridian_spec::Preference::Cheapest => by_cost.then(
                unreliability(a.1)
                    .cmp(&unreliability(b.1))
                    .then(queue(a.1).cmp(&queue(b.1))),
            ),
            meridian_spec::Preference::Fastest => by_speed.then(by_cost),
        };
        currency.then(order).then(a.1.name.cmp(&b.1.name))
    });
    let Some((total, site, rate, storage_rate, job_rates)) = priced.into_iter().next() else {
        let rejections = candidates
            .into_iter()
            .map(|c| SiteRejection {
                site: c.site,
                reason: match c.verdict {
                    Verdict::Rejected { reason } => reason,
                    _ => "not chosen".into(),
                },
            })
            .collect::<Vec<_>>();
        let rejections = if rejections.is_empty() {
            vec![SiteRejection {
                site: "(none)".into(),
                reason: "no sites are registered".into(),
            }]
        } else {
            rejections
        };
        return Decision::Rejected { rejections };
    };
    for c in &mut candidates {
        if c.site == site.name {
            c.verdict = Verdict::Chosen;
        }
    }
    Decision::Placed(Box::new(Placed {
        site: site.name.clone(),
        region: site.region.clone(),
        rate,
        job_rates,
        storage_rate,
        estimated_cost: total,
        explanation: PlacementExplanation { candidates },
    }))
}

/// Storage: every volume held for the sum of the walltimes of the jobs that mount it
/// (an upper bound: they may overlap), at the site's storage rate.
fn storage_estimate(spec: &Workflow, sheet: &meridian_events::PriceSheet) -> Decimal {
    let mut total = Decimal::ZERO;
    for (name, volume) in &spec.volumes {
        let seconds: u64 = spec
            .jobs
            .values()
            .filter(|j| j.mounts.contains_key(name))
            .map(|j| j.resources.walltime.secs() * u64::from(j.array.map_or(1, |a| a.len())))
            .sum();
        let gib = Decimal::from(volume.size.bytes()) / Decimal::from(1u64 << 30);
        total += gib * Decimal::from(seconds) / Decimal::from(3600) * sheet.storage_per_gib_hour;
    }
    total
}

/// Results leaving the site: each volume with egress steps, at most its size, at the
/// site's egress price per GB.
fn egress_estimate(spec: &Workflow, sheet: &meridian_events::PriceSheet) -> Decimal {
    spec.volumes
        .values()
        .filter(|v| !v.egress.is_empty())
        .map(|v| {
            Decimal::from(v.size.bytes()) / Decimal::from(1_000_000_000u64) * sheet.egress_per_gb
        })
        .sum()
}

/// Inputs not already at `site`: each ingress source that names a known data set costs
/// its bytes at the cheapest egress price among the sites holding it, by destination
/// class: the holder's same-region price when the site shares its region, its
/// other-region price when it is the same provider (kind), else its internet price. Sources that name
/// no known data set cost nothing here: their size is not known.
fn ingress_estimate(
    spec: &Workflow,
    catalog: &Catalog,
    site: &SiteEntry,
    now: DateTime<Utc>,
) -> Decimal {
    let mut total = Decimal::ZERO;
    for volume in spec.volumes.values() {
        for step in &volume.ingress {
            let Some((digest, bytes)) = catalog.dataset_for(&step.source) else {
                continue;
            };
            let holders = catalog.holdings.get(digest);
            if holders.is_some_and(|h| h.contains(&site.name)) {
                continue;
            }
            let cheapest = holders
                .into_iter()
                .flatten()
                .filter_map(|h| {
                    let holder = catalog.find(h)?;
                    let destination = if holder.region == site.region {
                        Destination::SameRegion
                    } else if holder.kind == site.kind {
                        Destination::OtherRegion
                    } else {
                        Destination::Internet
                    };
                    Some(holder.prices_at(now)?.egress_per_gb_to(destination))
                })
                .min();
            if let Some(per_gb) = cheapest {
                total += Decimal::from(bytes) / Decimal::from(1_000_000_000u64) * per_gb;
            }
        }
    }
    total
}
