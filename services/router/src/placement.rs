//! The placement decision, pure: filter the sites that can run every job, price the
//! whole workflow at each, choose the cheapest, and explain every candidate.
//!
//! Minimal today: compute cost only (data and storage terms are zero until datasets
//! and tariffs are modelled), fit judged from the site's labels (see
//! [`crate::catalog::labels`]). Ties go to the site name, so decisions are repeatable.

use chrono::{DateTime, Utc};
use meridian_events::vocabulary::workflow::{
    Candidate, CostTerms, PlacementExplanation, SiteRejection, Verdict,
};
use meridian_events::{Allocation, ComputeRate, Money, StorageRate};
use meridian_spec::{GpuVendor, Resources, Workflow};
use rust_decimal::Decimal;

use crate::catalog::{labels, Catalog, SiteEntry};

#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub site: String,
    pub region: String,
    pub rate: ComputeRate,
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

/// Decides where `spec` runs at `now` among the catalogue's sites.
pub fn decide(spec: &Workflow, catalog: &Catalog, now: DateTime<Utc>) -> Decision {
    let work = workloads(spec);
    let mut candidates = Vec::new();
    let mut priced: Vec<(Money, &SiteEntry, ComputeRate, StorageRate)> = Vec::new();
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
        if !site.healthy {
            candidates.push(reject("unhealthy at its last report".into()));
            continue;
        }
        let Some(sheet) = site.prices_at(now) else {
            candidates.push(reject("has no prices in force".into()));
            continue;
        };
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
        let mut compute = Decimal::ZERO;
        let mut overflow = false;
        for (_, resources, tasks) in &work {
            let seconds = Decimal::from(resources.walltime.secs()) * Decimal::from(*tasks);
            match rate.cost(&allocation(resources), seconds) {
                Ok(cost) => compute += cost.amount,
                Err(_) => overflow = true,
            }
        }
        if overflow {
            candidates.push(reject("the estimate overflows".into()));
            continue;
        }
        let terms = CostTerms {
            currency: rate.currency,
            compute,
            data_in: Decimal::ZERO,
            storage: Decimal::ZERO,
            data_out: Decimal::ZERO,
        };
        let total = terms.total().expect("no overflow on zero terms");
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
        priced.push((total, site, rate, sheet.storage_rate()));
    }

    // Cheapest first; sites priced in different currencies are not compared by amount
    // alone (no exchange rates yet), so currency orders first, then amount, then name.
    priced.sort_by(|a, b| {
        (a.0.currency.to_string(), a.0.amount, &a.1.name).cmp(&(
            b.0.currency.to_string(),
            b.0.amount,
            &b.1.name,
        ))
    });
    let Some((total, site, rate, storage_rate)) = priced.into_iter().next() else {
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
        storage_rate,
        estimated_cost: total,
        explanation: PlacementExplanation { candidates },
    }))
}
