//! The placement decision, pure: given a catalogue (built from Site events, as the
//! router builds it) and a workflow, where does it go and why.

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{TimeZone, Utc};
use meridian_events::vocabulary::workflow::Verdict;
use meridian_events::{
    AggregateKind, AggregateRef, ComputeOffer, ComputePricing, Currency, Envelope, Event,
    EventContext, PriceSheet, SiteEvent, SiteKind,
};
use meridian_router::placement::{decide, Decision};
use meridian_router::Catalog;
use rust_decimal::Decimal;
use uuid::Uuid;

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

struct Site<'a> {
    name: &'a str,
    core_hour: &'a str,
    gpus: u32,
    cpus: u32,
}

fn catalog(sites: &[Site], drained: &[&str]) -> Catalog {
    let mut catalog = Catalog::default();
    let at = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    for s in sites {
        let id = AggregateRef::new(AggregateKind::Site, Uuid::now_v7());
        let mut events = vec![
            Event::Site(SiteEvent::Registered {
                name: s.name.into(),
                kind: SiteKind::Slurm,
                region: format!("{}-region", s.name),
                jurisdiction: "eu".into(),
                credentials_secret: None,
                labels: BTreeMap::from([
                    ("max_cpus".into(), s.cpus.to_string()),
                    ("gpus".into(), s.gpus.to_string()),
                ]),
            }),
            Event::Site(SiteEvent::PricesChanged {
                prices: PriceSheet {
                    currency: Currency::USD,
                    effective_from: at,
                    source: "test".into(),
                    compute: vec![ComputeOffer {
                        offer: "node".into(),
                        pricing: ComputePricing::Resource {
                            per_core_hour: d(s.core_hour),
                            per_gib_memory_hour: d("0"),
                            per_gpu_hour: d("2.5"),
                        },
                    }],
                    storage_per_gib_hour: d("0"),
                    egress_per_gb: d("0"),
                },
            }),
        ];
        if drained.contains(&s.name) {
            events.push(Event::Site(SiteEvent::Drained {
                by: "admin".into(),
                reason: None,
                drained_at: at,
            }));
        }
        for e in Envelope::sequence_after(id, 0, &EventContext::new_chain("t"), at, events) {
            catalog.observe(&e);
        }
    }
    catalog
}

const TWO_JOBS: &str = r#"
version: v1
name: w
jobs:
  a: {image: host, command: ["true"], resources: {cpus: 4, memory: 1GiB, walltime: 2h}}
  b: {image: host, command: ["true"], array: {start: 1, end: 10, parallelism: 2}, resources: {cpus: 1, memory: 1GiB, walltime: 30m}}
"#;

fn now() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap()
}

#[test]
fn the_cheapest_fitting_site_is_chosen_and_its_estimate_adds_up() {
    let spec = meridian_spec::parse(TWO_JOBS).unwrap();
    let sites = [
        Site {
            name: "pricey",
            core_hour: "0.10",
            gpus: 0,
            cpus: 64,
        },
        Site {
            name: "cheap",
            core_hour: "0.02",
            gpus: 0,
            cpus: 64,
        },
    ];
    let Decision::Placed(placed) = decide(&spec, &catalog(&sites, &[]), now()) else {
        panic!("expected a placement");
    };
    assert_eq!(placed.site, "cheap");
    // a: 4 cores × 2 h; b: 10 tasks × 1 core × 0.5 h → 13 core-hours × 0.02 = 0.26.
    assert_eq!(placed.estimated_cost.amount.normalize(), d("0.26"));
    let chosen = placed
        .explanation
        .candidates
        .iter()
        .find(|c| c.site == "cheap")
        .unwrap();
    assert_eq!(chosen.verdict, Verdict::Chosen);
    let terms = chosen.cost.as_ref().unwrap();
    assert_eq!(terms.total().unwrap().amount, placed.estimated_cost.amount);
    let other = placed
        .explanation
        .candidates
        .iter()
        .find(|c| c.site == "pricey")
        .unwrap();
    assert_eq!(other.verdict, Verdict::Fitted);
    assert_eq!(other.cost.as_ref().unwrap().compute.normalize(), d("1.3"));
}

#[test]
fn a_drained_site_is_never_chosen_and_the_reason_is_recorded() {
    let spec = meridian_spec::parse(TWO_JOBS).unwrap();
    let sites = [
        Site {
            name: "pricey",
            core_hour: "0.10",
            gpus: 0,
            cpus: 64,
        },
        Site {
            name: "cheap",
            core_hour: "0.02",
            gpus: 0,
            cpus: 64,
        },
    ];
    let Decision::Placed(placed) = decide(&spec, &catalog(&sites, &["cheap"]), now()) else {
        panic!("expected a placement");
    };
    assert_eq!(placed.site, "pricey");
    let cheap = placed
        .explanation
        .candidates
        .iter()
        .find(|c| c.site == "cheap")
        .unwrap();
    assert!(matches!(&cheap.verdict, Verdict::Rejected { reason } if reason.contains("drained")));
}

#[test]
fn gpu_jobs_only_go_where_there_are_enough_gpus() {
    let spec = meridian_spec::parse(
        "version: v1\nname: g\njobs:\n  t: {image: host, command: [\"true\"], resources: {gpus: {count: 4}}}\n",
    )
    .unwrap();
    let sites = [
        Site {
            name: "cpu-only",
            core_hour: "0.01",
            gpus: 0,
            cpus: 64,
        },
        Site {
            name: "gpu",
            core_hour: "0.05",
            gpus: 8,
            cpus: 64,
        },
    ];
    let Decision::Placed(placed) = decide(&spec, &catalog(&sites, &[]), now()) else {
        panic!("expected a placement");
    };
    assert_eq!(placed.site, "gpu");
}

#[test]
fn an_impossible_request_is_rejected_with_a_reason_per_site() {
    let spec = meridian_spec::parse(
        "version: v1\nname: big\njobs:\n  t: {image: host, command: [\"true\"], resources: {cpus: 128}}\n",
    )
    .unwrap();
    let sites = [
        Site {
            name: "a",
            core_hour: "0.01",
            gpus: 0,
            cpus: 64,
        },
        Site {
            name: "b",
            core_hour: "0.01",
            gpus: 0,
            cpus: 32,
        },
    ];
    let Decision::Rejected { rejections } = decide(&spec, &catalog(&sites, &[]), now()) else {
        panic!("expected a rejection");
    };
    assert_eq!(rejections.len(), 2);
    assert_eq!(rejections[0].site, "a");
    assert_eq!(
        rejections[0].reason,
        "job t needs 128 CPUs per node; the site offers at most 64"
    );
    assert!(
        rejections[1].reason.contains("at most 32"),
        "{rejections:?}"
    );

    let Decision::Rejected { rejections } = decide(&spec, &Catalog::default(), now()) else {
        panic!("expected a rejection");
    };
    assert_eq!(rejections[0].reason, "no sites are registered");
}

#[test]
fn placement_hints_and_the_budget_filter_sites() {
    let mut spec = meridian_spec::parse(TWO_JOBS).unwrap();
    let sites = [
        Site {
            name: "pricey",
            core_hour: "0.10",
            gpus: 0,
            cpus: 64,
        },
        Site {
            name: "cheap",
            core_hour: "0.02",
            gpus: 0,
            cpus: 64,
        },
    ];
    spec.placement.sites = vec!["pricey".into()];
    let Decision::Placed(placed) = decide(&spec, &catalog(&sites, &[]), now()) else {
        panic!("expected a placement");
    };
    assert_eq!(placed.site, "pricey", "the allow-list wins over price");

    spec.placement.sites.clear();
    spec.placement.budget = Some("0.25 USD".parse().unwrap());
    let Decision::Rejected { rejections } = decide(&spec, &catalog(&sites, &[]), now()) else {
        panic!("0.26 at the cheapest site exceeds a budget of 0.25");
    };
    assert!(
        rejections
            .iter()
            .all(|r| r.reason.contains("exceeds the budget of 0.25 USD")),
        "{rejections:?}"
    );
}
