//! The placement decision, pure: given a catalogue (built from Site events, as the
//! router builds it) and a workflow, where does it go and why.

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{TimeZone, Utc};
use meridian_domain::placement::{decide, decide_as_if_connected, decide_for, Decision};
use meridian_domain::Catalog;
use meridian_events::vocabulary::workflow::Verdict;
use meridian_events::{
    AggregateKind, AggregateRef, ComputeOffer, ComputePricing, Currency, Envelope, Event,
    EventContext, PriceSheet, SiteEvent, SiteKind,
};
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
    // Pricing alone: which adapters serve the sites is another test's business.
    catalog.ignore_connections = true;
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
                    egress_by_destination: None,
                    egress_tiers: Vec::new(),
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
fn with_every_job_priced_a_site_names_the_misfit_first_by_name() {
    // A split prices every job and service at every site; where several do not fit, the
    // site's reason is that of the one first by name, services and jobs alike.
    let spec = meridian_spec::parse(
        "version: v1\nname: big\nplacement: {split: true}\njobs:\n  zz: {image: host, command: [\"true\"], resources: {cpus: 128}}\n  mm: {image: host, command: [\"true\"], resources: {cpus: 1}}\nservices:\n  aa: {image: host, command: [\"true\"], port: 80, resources: {cpus: 96}}\n",
    )
    .unwrap();
    let sites = [Site {
        name: "a",
        core_hour: "0.01",
        gpus: 0,
        cpus: 64,
    }];
    let Decision::Rejected { rejections } = decide(&spec, &catalog(&sites, &[]), now()) else {
        panic!("expected a rejection");
    };
    assert_eq!(rejections[0].site, "a");
    assert_eq!(
        rejections[0].reason, "job aa needs 96 CPUs per node; the site offers at most 64",
        "{rejections:?}"
    );
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
        rejections.iter().all(|r| r
            .reason
            .contains("exceeds the workflow's budget of 0.25 USD")),
        "{rejections:?}"
    );
}

/// One shape: (name, GPUs per node, GPU model, max walltime in hours, price per hour).
type ShapeRow<'a> = (&'a str, u32, &'a str, u32, &'a str);

/// Sites that declare shapes, each shape priced per instance-hour.
fn shaped(sites: &[(&str, &[ShapeRow])]) -> Catalog {
    use meridian_events::vocabulary::site::{Shape, ShapeGpus};
    use meridian_events::vocabulary::AcceleratorVendor;
    let mut catalog = Catalog::default();
    // Pricing alone: which adapters serve the sites is another test's business.
    catalog.ignore_connections = true;
    let at = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    for (name, shapes) in sites {
        let id = AggregateRef::new(AggregateKind::Site, Uuid::now_v7());
        let compute = shapes
            .iter()
            .map(|(shape, _, _, _, price)| ComputeOffer {
                offer: shape.to_string(),
                pricing: ComputePricing::Instance {
                    per_instance_hour: d(price),
                },
            })
            .collect();
        let declared = shapes
            .iter()
            .map(|(shape, gpus, vendor, _, _)| Shape {
                name: shape.to_string(),
                offer: shape.to_string(),
                spot_offer: None,
                cpus: 96,
                memory_bytes: 1 << 40,
                gpus: (*gpus > 0).then(|| ShapeGpus {
                    count: *gpus,
                    vendor: if vendor.starts_with("MI") {
                        AcceleratorVendor::Amd
                    } else {
                        AcceleratorVendor::Nvidia
                    },
                    model: vendor.to_string(),
                    memory_bytes: 80 << 30,
                }),
                max_nodes: 1,
                max_walltime_secs: Some(u64::from(shapes[0].3) * 3600),
            })
            .collect();
        let events = vec![
            Event::Site(SiteEvent::Registered {
                name: name.to_string(),
                kind: SiteKind::Aws,
                region: "r".into(),
                jurisdiction: "us".into(),
                credentials_secret: None,
                labels: BTreeMap::new(),
            }),
            Event::Site(SiteEvent::PricesChanged {
                prices: PriceSheet {
                    currency: Currency::USD,
                    effective_from: at,
                    source: "test".into(),
                    compute,
                    storage_per_gib_hour: d("0"),
                    egress_per_gb: d("0"),
                    egress_by_destination: None,
                    egress_tiers: Vec::new(),
                },
            }),
            Event::Site(SiteEvent::ShapesDeclared { shapes: declared }),
        ];
        for e in Envelope::sequence_after(id, 0, &EventContext::new_chain("t"), at, events) {
            catalog.observe(&e);
        }
    }
    catalog
}

const TRAIN: &str = r#"
version: v1
name: t
jobs:
  prep: {image: host, command: ["true"], resources: {cpus: 4, memory: 16GiB, walltime: 1h}}
  train:
    requires: [prep]
    image: host
    command: ["true"]
    resources: {cpus: 32, memory: 256GiB, walltime: 2h, gpus: {count: 8, vendor: VENDOR}}
"#;

fn train(vendor: &str) -> meridian_spec::Workflow {
    meridian_spec::parse(&TRAIN.replace("VENDOR", vendor)).unwrap()
}

#[test]
fn each_job_gets_its_cheapest_fitting_shape_and_its_rate_is_recorded() {
    let catalog = shaped(&[(
        "cloud",
        &[
            ("small", 0, "", 24, "1.00"),
            ("h100x8", 8, "H100", 24, "98.32"),
            ("a100x8", 8, "A100", 24, "40.00"),
        ],
    )]);
    let Decision::Placed(placed) = decide(&train("nvidia"), &catalog, now()) else {
        panic!("expected a placement");
    };
    assert_eq!(placed.job_rates["prep"].offer, "small");
    assert_eq!(
        placed.job_rates["train"].offer, "a100x8",
        "the cheaper 8-GPU NVIDIA shape"
    );
    // prep 1 h × 1.00 + train 2 h × 40.00
    assert_eq!(placed.estimated_cost.amount.normalize(), d("81"));
}

#[test]
fn nvidia_and_amd_requests_are_filtered_and_any_considers_both() {
    let catalog = shaped(&[
        (
            "nv",
            &[
                ("small", 0, "", 24, "1.00"),
                ("h100x8", 8, "H100", 24, "98.32"),
            ],
        ),
        (
            "amd",
            &[
                ("small", 0, "", 24, "1.00"),
                ("mi300x8", 8, "MI300X", 24, "48.00"),
            ],
        ),
    ]);
    let Decision::Placed(p) = decide(&train("amd"), &catalog, now()) else {
        panic!()
    };
    assert_eq!(p.site, "amd");
    let Decision::Placed(p) = decide(&train("nvidia"), &catalog, now()) else {
        panic!()
    };
    assert_eq!(p.site, "nv");
    let nv = p
        .explanation
        .candidates
        .iter()
        .find(|c| c.site == "amd")
        .unwrap();
    assert!(
        matches!(&nv.verdict, Verdict::Rejected { reason } if reason.contains("has AMD GPUs, needs nvidia")),
        "{nv:?}"
    );
    let Decision::Placed(p) = decide(&train("any"), &catalog, now()) else {
        panic!()
    };
    assert_eq!(p.site, "amd", "any: both fit, the cheaper wins");
    assert!(p
        .explanation
        .candidates
        .iter()
        .all(|c| !matches!(c.verdict, Verdict::Rejected { .. })));
}

#[test]
fn a_walltime_over_every_shapes_limit_is_a_reason() {
    let catalog = shaped(&[(
        "short",
        &[
            ("small", 0, "", 1, "1.00"),
            ("h100x8", 8, "H100", 1, "98.32"),
        ],
    )]);
    let Decision::Rejected { rejections } = decide(&train("nvidia"), &catalog, now()) else {
        panic!("2 h cannot run where jobs stop at 1 h");
    };
    assert!(
        rejections[0]
            .reason
            .contains("runs jobs of at most 1h, needs 2h"),
        "{rejections:?}"
    );
}

/// Folds `events` into the site `name` of `catalog`, after the three `shaped` gave it.
fn observe_site(catalog: &mut Catalog, name: &str, events: Vec<SiteEvent>) {
    let id = AggregateRef::new(AggregateKind::Site, catalog.sites[name].id);
    let at = Utc.with_ymd_and_hms(2026, 1, 2, 0, 0, 0).unwrap();
    let events = events.into_iter().map(Event::Site).collect();
    for e in Envelope::sequence_after(id, 3, &EventContext::new_chain("t"), at, events) {
        catalog.observe(&e);
    }
}

#[test]
fn between_equal_sites_the_one_with_the_wanted_gpus_free_wins() {
    use meridian_events::vocabulary::site::Capacity;
    let mut catalog = shaped(&[
        (
            "a",
            &[
                ("small", 0, "", 24, "1.00"),
                ("h100x8", 8, "H100", 24, "98.32"),
            ],
        ),
        (
            "b",
            &[
                ("small", 0, "", 24, "1.00"),
                ("h100x8", 8, "H100", 24, "98.32"),
            ],
        ),
    ]);
    let report = |h100: u32| SiteEvent::HealthReported {
        healthy: true,
        capacity: Capacity {
            free_gpus: 8,
            free_gpus_by_model: BTreeMap::from([("H100".to_string(), h100)]),
            ..Capacity::default()
        },
        message: None,
        observed_at: Utc.with_ymd_and_hms(2026, 1, 2, 0, 0, 0).unwrap(),
    };
    // Without reports the name breaks the tie.
    let Decision::Placed(p) = decide(&train("nvidia"), &catalog, now()) else {
        panic!()
    };
    assert_eq!(p.site, "a");
    observe_site(&mut catalog, "a", vec![report(2)]);
    observe_site(&mut catalog, "b", vec![report(8)]);
    let Decision::Placed(p) = decide(&train("nvidia"), &catalog, now()) else {
        panic!()
    };
    assert_eq!(p.site, "b", "b has the 8 H100s free, a only 2");
}

#[test]
fn a_cordoned_device_takes_its_gpus_out_of_the_shape_and_lowers_reliability() {
    use meridian_events::vocabulary::site::Device;
    use meridian_events::vocabulary::AcceleratorVendor;
    let mut catalog = shaped(&[(
        "box",
        &[
            ("small", 0, "", 24, "1.00"),
            ("h100x8", 8, "H100", 24, "98.32"),
        ],
    )]);
    let before = catalog.sites["box"].reliability();
    let devices = (0..8)
        .map(|i| Device {
            id: format!("GPU-{i}"),
            vendor: AcceleratorVendor::Nvidia,
            model: "H100".into(),
            memory_bytes: 80 << 30,
        })
        .collect();
    observe_site(
        &mut catalog,
        "box",
        vec![
            SiteEvent::DevicesReported { devices },
            SiteEvent::DeviceCordoned {
                device: "GPU-3".into(),
                model: "H100".into(),
                reason: "2 uncorrectable ECC errors".into(),
                by: "health check".into(),
                fault: true,
                cordoned_at: now(),
            },
        ],
    );
    assert!(catalog.sites["box"].reliability() < before);
    let Decision::Rejected { rejections } = decide(&train("nvidia"), &catalog, now()) else {
        panic!("8 GPUs cannot run where one of 8 is cordoned");
    };
    assert!(
        rejections[0]
            .reason
            .contains("h100x8 has 8 GPUs, 1 of them cordoned, needs 8"),
        "{rejections:?}"
    );
    // Given back: the job fits again.
    observe_site(
        &mut catalog,
        "box",
        vec![SiteEvent::DeviceUncordoned {
            device: "GPU-3".into(),
            by: "admin".into(),
            uncordoned_at: now(),
        }],
    );
    assert!(matches!(
        decide(&train("nvidia"), &catalog, now()),
        Decision::Placed(_)
    ));
}

#[test]
fn an_estimate_as_if_connected_prices_sites_no_adapter_serves_yet() {
    let spec = meridian_spec::parse(TWO_JOBS).unwrap();
    let sites = [Site {
        name: "only",
        core_hour: "0.02",
        gpus: 0,
        cpus: 64,
    }];
    let priced_anywhere = catalog(&sites, &[]);
    let mut served_only = priced_anywhere.clone();
    served_only.ignore_connections = false;

    // No adapter has connected the site: placement waits for one.
    let waiting = decide_for(&spec, None, &served_only, now());
    assert!(
        matches!(&waiting, Decision::Waiting { sites, .. } if sites == &["only".to_string()]),
        "{waiting:?}"
    );
    // A budget's estimate is the price it would run at once one does.
    let Decision::Placed(estimate) = decide_as_if_connected(&spec, None, &served_only, now())
    else {
        panic!("the estimate places the workflow");
    };
    let Decision::Placed(anywhere) = decide(&spec, &priced_anywhere, now()) else {
        panic!("placed when connections are ignored");
    };
    assert_eq!(estimate.site, "only");
    assert_eq!(estimate.estimated_cost, anywhere.estimated_cost);
}
