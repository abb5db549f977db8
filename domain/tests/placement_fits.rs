//! Placement remembers each site's cheapest fit per request between decisions
//! (`FitCache`), and finds a fit it has not learnt through the site's shape index. On
//! random catalogues and workflows, a catalogue that has decided many workflows before —
//! and has seen shapes re-declared, new price sheets and GPUs cordoned since — and a
//! fresh one using the index both decide exactly as a fresh catalogue built from the
//! same events that scans every shape: same site, same cost terms, same explanation.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use meridian_domain::placement::{decide, Decision};
use meridian_domain::Catalog;
use meridian_events::vocabulary::site::{Device, Shape, ShapeGpus};
use meridian_events::vocabulary::AcceleratorVendor;
use meridian_events::{
    AggregateKind, AggregateRef, ComputeOffer, ComputePricing, Currency, Envelope, Event,
    EventContext, PriceSheet, SiteEvent, SiteKind,
};
use rust_decimal::Decimal;
use uuid::Uuid;

/// xorshift64*: enough randomness for test inputs, the same on every run of a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const MODELS: [(&str, AcceleratorVendor); 4] = [
    ("H100", AcceleratorVendor::Nvidia),
    ("A100", AcceleratorVendor::Nvidia),
    ("L4", AcceleratorVendor::Nvidia),
    ("MI300X", AcceleratorVendor::Amd),
];

fn cents(rng: &mut Rng, most: u64) -> Decimal {
    Decimal::new(rng.below(most) as i64 + 1, 2)
}

/// A site's shapes and the sheet pricing them (some offers left unpriced, some spot).
fn shapes_and_sheet(rng: &mut Rng, at: DateTime<Utc>) -> (Vec<Shape>, PriceSheet) {
    let mut shapes = Vec::new();
    let mut compute = Vec::new();
    for j in 0..rng.below(40) + 1 {
        // Shared offers and prices make ties, which the index must break as a scan does.
        let offer = format!("offer-{}", rng.below(30));
        let gpus = rng.chance(60).then(|| {
            let (model, vendor) = *rng.pick(&MODELS);
            ShapeGpus {
                count: *rng.pick(&[1, 2, 4, 8]),
                vendor,
                model: model.to_string(),
                memory_bytes: *rng.pick(&[24u64, 40, 80, 192]) << 30,
            }
        });
        let spot_offer = rng.chance(30).then(|| format!("{offer}-spot"));
        shapes.push(Shape {
            name: format!("shape-{j}"),
            offer: offer.clone(),
            spot_offer: spot_offer.clone(),
            cpus: *rng.pick(&[2, 8, 32, 96, 192]),
            memory_bytes: *rng.pick(&[8u64, 64, 256, 1024, 2048]) << 30,
            max_nodes: *rng.pick(&[1, 1, 4]),
            max_walltime_secs: rng.chance(30).then(|| rng.below(24) * 3600 + 3600),
            gpus,
        });
        for name in std::iter::once(offer).chain(spot_offer) {
            if rng.chance(90) {
                let pricing = if rng.chance(50) {
                    ComputePricing::Instance {
                        per_instance_hour: cents(rng, 500),
                    }
                } else {
                    ComputePricing::Resource {
                        per_core_hour: cents(rng, 10),
                        per_gib_memory_hour: cents(rng, 3),
                        per_gpu_hour: cents(rng, 400),
                    }
                };
                compute.push(ComputeOffer {
                    offer: name,
                    pricing,
                });
            }
        }
    }
    let sheet = PriceSheet {
        currency: Currency::USD,
        effective_from: at,
        source: "test".into(),
        compute,
        storage_per_gib_hour: Decimal::ZERO,
        egress_per_gb: Decimal::ZERO,
        egress_by_destination: None,
        egress_tiers: Vec::new(),
    };
    (shapes, sheet)
}

/// A random workflow of one to four jobs, perhaps split, perhaps on spot.
fn workflow(rng: &mut Rng) -> meridian_spec::Workflow {
    let mut text = String::from("version: v1\nname: w\n");
    if rng.chance(30) || rng.chance(20) {
        text.push_str(&format!(
            "placement: {{split: {}, spot: {}}}\n",
            rng.chance(50),
            rng.chance(50)
        ));
    }
    text.push_str("jobs:\n");
    for j in 0..rng.below(4) + 1 {
        let gpus = if rng.chance(50) {
            let vendor = rng.pick(&["any", "nvidia", "amd"]);
            let model = if rng.chance(50) {
                format!(
                    ", model: {}",
                    rng.pick(&["H100", "A100", "h1", "MI300X", "L4"])
                )
            } else {
                String::new()
            };
            format!(
                ", gpus: {{count: {}, vendor: {vendor}{model}}}",
                rng.pick(&[1, 2, 4, 8])
            )
        } else {
            String::new()
        };
        text.push_str(&format!(
            "  j{j}: {{image: host, command: [\"true\"], resources: {{cpus: {}, memory: {}GiB, walltime: {}h{gpus}}}}}\n",
            rng.pick(&[1, 4, 16, 64, 128]),
            rng.pick(&[1, 16, 128, 512]),
            rng.below(30) + 1,
        ));
    }
    meridian_spec::parse(&text).unwrap_or_else(|e| panic!("{text}: {e:?}"))
}

/// One site's history, as the catalogue observes it.
struct SiteLog {
    id: AggregateRef,
    events: Vec<Event>,
}

fn build(sites: &[SiteLog], at: DateTime<Utc>) -> Catalog {
    let mut catalog = Catalog::default();
    catalog.ignore_connections = true;
    for site in sites {
        for e in Envelope::sequence_after(
            site.id,
            0,
            &EventContext::new_chain("t"),
            at,
            site.events.clone(),
        ) {
            catalog.observe(&e);
        }
    }
    catalog
}

fn observe(catalog: &mut Catalog, site: &mut SiteLog, event: SiteEvent, at: DateTime<Utc>) {
    let sequence = site.events.len() as u64;
    site.events.push(Event::Site(event.clone()));
    for e in Envelope::sequence_after(
        site.id,
        sequence,
        &EventContext::new_chain("t"),
        at,
        vec![Event::Site(event)],
    ) {
        catalog.observe(&e);
    }
}

#[test]
fn catalogues_that_remember_fits_or_use_the_index_decide_as_one_that_scans_every_shape() {
    let at = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let now = Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap();
    let (mut compared, mut placed) = (0, 0);
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut sites: Vec<SiteLog> = (0..rng.below(6) + 2)
            .map(|i| {
                let (shapes, sheet) = shapes_and_sheet(&mut rng, at);
                SiteLog {
                    id: AggregateRef::new(AggregateKind::Site, Uuid::now_v7()),
                    events: vec![
                        Event::Site(SiteEvent::Registered {
                            name: format!("site-{i}"),
                            kind: SiteKind::Aws,
                            region: "r".into(),
                            jurisdiction: "us".into(),
                            credentials_secret: None,
                            labels: BTreeMap::new(),
                        }),
                        Event::Site(SiteEvent::PricesChanged { prices: sheet }),
                        Event::Site(SiteEvent::ShapesDeclared { shapes }),
                    ],
                }
            })
            .collect();
        let mut warm = build(&sites, at);
        for round in 0..6 {
            // The same workflows twice: the second time every fit is remembered.
            let workflows: Vec<_> = (0..8).map(|_| workflow(&mut rng)).collect();
            for spec in workflows.iter().chain(&workflows) {
                let remembered = decide(spec, &warm, now);
                let indexed = decide(spec, &build(&sites, at), now);
                let mut scanning = build(&sites, at);
                scanning.scan_every_shape = true;
                let searched = decide(spec, &scanning, now);
                assert_eq!(remembered, searched, "seed {seed}, round {round}");
                assert_eq!(indexed, searched, "seed {seed}, round {round}");
                compared += 1;
                placed += usize::from(matches!(searched, Decision::Placed(_)));
            }
            // Then the catalogue changes under what was remembered.
            let i = rng.below(sites.len() as u64) as usize;
            let when = at + Duration::days(round + 1);
            match rng.below(3) {
                0 => {
                    let (shapes, _) = shapes_and_sheet(&mut rng, when);
                    observe(
                        &mut warm,
                        &mut sites[i],
                        SiteEvent::ShapesDeclared { shapes },
                        when,
                    );
                }
                1 => {
                    // New prices for the offers the site has.
                    let (_, mut sheet) = shapes_and_sheet(&mut rng, when);
                    let offers: Vec<String> = build(&sites, at).sites[&format!("site-{i}")]
                        .shapes
                        .iter()
                        .flat_map(|s| std::iter::once(s.offer.clone()).chain(s.spot_offer.clone()))
                        .collect();
                    for (offer, priced) in offers.iter().zip(sheet.compute.iter_mut()) {
                        priced.offer = offer.clone();
                    }
                    observe(
                        &mut warm,
                        &mut sites[i],
                        SiteEvent::PricesChanged { prices: sheet },
                        when,
                    );
                }
                _ => {
                    // Devices of one model reported, and one of them cordoned.
                    let (model, vendor) = *rng.pick(&MODELS);
                    let devices: Vec<Device> = (0..8)
                        .map(|d| Device {
                            id: format!("GPU-{model}-{d}"),
                            vendor,
                            model: model.to_string(),
                            memory_bytes: 80 << 30,
                        })
                        .collect();
                    observe(
                        &mut warm,
                        &mut sites[i],
                        SiteEvent::DevicesReported { devices },
                        when,
                    );
                    observe(
                        &mut warm,
                        &mut sites[i],
                        SiteEvent::DeviceCordoned {
                            device: format!("GPU-{model}-0"),
                            model: model.to_string(),
                            reason: "ECC".into(),
                            by: "health check".into(),
                            fault: true,
                            cordoned_at: when,
                        },
                        when,
                    );
                }
            }
        }
    }
    assert_eq!(compared, 40 * 6 * 16);
    // Most random workflows find a site; the rest are refused with every site's reason.
    assert!(placed > compared / 3, "{placed} of {compared} placed");
}
