//! Placement benchmarks:
//! 1. decision latency (p50/p99) of `placement::decide` for a three-job workflow against
//!    catalogues of 10, 100 and 1,000 sites with 50 shapes each, placed whole and with
//!    `placement.split` (which adds a per-job pass over the sites);
//! 2. sustained placements per second through the router service over JetStream (a
//!    real nats-server; submissions appended as fast as the log takes them).
//!
//! `cargo bench -p meridian-router --bench placement [-- --quick] [--latency-only]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use meridian_domain::catalog_file::{offline_catalog, SiteSpec};
use meridian_domain::placement::decide;
use meridian_eventlog::aggregates::execute;
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::testkit::{nats_url_or_start, NatsCluster};
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Site, SiteCommand, Workflow, WorkflowCommand};
use meridian_events::vocabulary::site::{Shape, ShapeGpus};
use meridian_events::vocabulary::AcceleratorVendor;
use meridian_events::{ComputeOffer, ComputePricing, Currency, EventContext, PriceSheet, SiteKind};
use meridian_router::Router;
use rust_decimal::Decimal;
use uuid::Uuid;

const WORKFLOW: &str = r#"
version: v1
name: bench
jobs:
  prep: {image: host, command: ["true"], resources: {cpus: 8, memory: 32GiB, walltime: 1h}}
  train:
    requires: [prep]
    image: host
    command: ["true"]
    resources: {cpus: 64, memory: 512GiB, walltime: 8h, gpus: {count: 8, vendor: nvidia, model: H100}}
  eval: {requires: [train], image: host, command: ["true"], resources: {cpus: 16, memory: 64GiB, walltime: 1h, gpus: {count: 1, vendor: any}}}
"#;

/// A site with 50 shapes: a spread of CPU-only and GPU shapes of both vendors.
fn site(i: usize) -> SiteSpec {
    let models = [
        ("H100", AcceleratorVendor::Nvidia),
        ("A100", AcceleratorVendor::Nvidia),
        ("L4", AcceleratorVendor::Nvidia),
        ("MI300X", AcceleratorVendor::Amd),
    ];
    let mut shapes = Vec::new();
    let mut compute = Vec::new();
    for j in 0..50usize {
        let name = format!("shape-{j}");
        let gpus = (j % 5 != 0).then(|| {
            let (model, vendor) = models[(j / 4) % models.len()];
            ShapeGpus {
                count: [1, 2, 4, 8][j % 4],
                vendor,
                model: model.to_string(),
                memory_bytes: 80 << 30,
            }
        });
        compute.push(ComputeOffer {
            offer: name.clone(),
            pricing: ComputePricing::Instance {
                per_instance_hour: Decimal::from(1 + (i * 7 + j * 13) % 97),
            },
        });
        shapes.push(Shape {
            name: name.clone(),
            offer: name,
            spot_offer: None,
            cpus: [8, 16, 64, 96, 192][j % 5],
            memory_bytes: [32u64, 64, 512, 1024, 2048][j % 5] << 30,
            gpus,
            max_nodes: 1,
            max_walltime_secs: None,
        });
    }
    SiteSpec {
        name: format!("site-{i:04}"),
        kind: SiteKind::Aws,
        region: format!("region-{}", i % 20),
        jurisdiction: "us".into(),
        labels: Default::default(),
        prices: PriceSheet {
            currency: Currency::USD,
            effective_from: Utc::now() - chrono::Duration::days(1),
            source: "bench".into(),
            compute,
            storage_per_gib_hour: Decimal::ZERO,
            egress_per_gb: Decimal::new(9, 2),
            egress_by_destination: None,
            egress_tiers: Vec::new(),
        },
        shapes,
        datasets: Vec::new(),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

fn latency(quick: bool) {
    let whole = meridian_spec::parse(WORKFLOW).unwrap();
    let split = meridian_spec::parse(
        &WORKFLOW.replace("name: bench\n", "name: bench\nplacement: {split: true}\n"),
    )
    .unwrap();
    assert!(split.placement.split);
    println!("| workflow | sites × shapes | decisions | p50 ms | p99 ms | per site-shape µs | first decision ms |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
    for (label, spec) in [("one site", &whole), ("split: true", &split)] {
        for sites in [10usize, 100, 1000] {
            let catalog = offline_catalog(&(0..sites).map(site).collect::<Vec<_>>());
            let runs = if quick {
                5
            } else {
                (20_000 / sites).clamp(30, 1000)
            };
            let mut times = Vec::with_capacity(runs);
            // The first decision learns each site's fits; it is measured on its own below.
            std::hint::black_box(decide(spec, &catalog, Utc::now()));
            for _ in 0..runs {
                let t = Instant::now();
                let decision = std::hint::black_box(decide(spec, &catalog, Utc::now()));
                times.push(t.elapsed());
                assert!(
                    matches!(decision, meridian_domain::placement::Decision::Placed(_)),
                    "the bench workflow must be placeable"
                );
            }
            times.sort();
            let p50 = percentile(&times, 0.5);
            // A catalogue's first decision, before it remembers any fit (a copy starts
            // with none): the median of five.
            let mut first: Vec<Duration> = (0..5)
                .map(|_| {
                    let fresh = catalog.clone();
                    let t = Instant::now();
                    std::hint::black_box(decide(spec, &fresh, Utc::now()));
                    t.elapsed()
                })
                .collect();
            first.sort();
            println!(
                "| {label} | {sites} × 50 | {runs} | {p50:.3} | {:.3} | {:.3} | {:.3} |",
                percentile(&times, 0.99),
                p50 * 1e3 / (sites as f64 * 50.0),
                percentile(&first, 0.5)
            );
        }
    }
}

/// Workflows submitted to placed per second, through the router, on the log at `url`
/// with the stream at `replicas`.
async fn throughput(quick: bool, url: String, replicas: usize) -> (usize, Duration) {
    let unique = Uuid::now_v7().simple().to_string();
    let log: Arc<dyn EventLog> = Arc::new(
        NatsLog::connect(NatsConfig {
            url,
            stream: format!("BENCH_{unique}"),
            subject_prefix: format!("bench.{unique}"),
            replicas,
            ..NatsConfig::default()
        })
        .await
        .unwrap(),
    );
    for i in 0..10 {
        let s = site(i);
        execute::<Site, _>(
            &*log,
            Uuid::now_v7(),
            &EventContext::new_chain("bench"),
            |_| SiteCommand::Register {
                name: s.name.clone(),
                kind: s.kind,
                region: s.region.clone(),
                jurisdiction: s.jurisdiction.clone(),
                credentials_secret: None,
                labels: Default::default(),
                prices: Some(s.prices.clone()),
            },
        )
        .await
        .unwrap();
    }
    let catalog_sites: Vec<SiteSpec> = (0..10).map(site).collect();
    let catalog = meridian_domain::Catalog::load(&*log).await.unwrap();
    for s in &catalog_sites {
        let id = catalog.find(&s.name).unwrap().id;
        execute::<Site, _>(&*log, id, &EventContext::new_chain("bench"), |_| {
            SiteCommand::DeclareShapes {
                shapes: s.shapes.clone(),
            }
        })
        .await
        .unwrap(); // Served by an adapter for the whole run.
        execute::<Site, _>(&*log, id, &EventContext::new_chain("bench"), |_| {
            SiteCommand::Heartbeat {
                adapter: "bench".into(),
                instance: Uuid::now_v7(),
                ttl_secs: 86_400,
                arrays: None,
            }
        })
        .await
        .unwrap();
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let router_log = log.clone();
    let router =
        tokio::spawn(async move { Router::new(router_log).await.unwrap().run(stopped).await });

    let workflows = if quick { 50 } else { 2_000 };
    let spec = meridian_spec::parse(WORKFLOW).unwrap();
    let start = Instant::now();
    let mut submitters = Vec::new();
    for chunk in 0..8 {
        let (log, spec) = (log.clone(), spec.clone());
        submitters.push(tokio::spawn(async move {
            for _ in (chunk..workflows).step_by(8) {
                let id = Uuid::now_v7();
                execute::<Workflow, _>(&*log, id, &EventContext::new_chain("bench"), |_| {
                    WorkflowCommand::Submit {
                        workflow_id: id,
                        spec: spec.clone(),
                        submitted_by: "bench".into(),
                        idempotency_key: None,
                        parent_workflow_id: None,
                    }
                })
                .await
                .unwrap();
            }
        }));
    }
    for s in submitters {
        s.await.unwrap();
    }
    // Count decisions as the router makes them.
    let mut tail = log.tail(0).await.unwrap();
    let mut placed = 0;
    while placed < workflows {
        for commit in tail.next(512, Duration::from_secs(30)).await.unwrap() {
            for e in &commit.events {
                match e.payload["type"].as_str() {
                    Some("workflow.placement_decided.v1") => placed += 1,
                    Some("workflow.placement_rejected.v1") => {
                        panic!("the bench workflow was rejected: {}", e.payload)
                    }
                    _ => {}
                }
            }
        }
    }
    let elapsed = start.elapsed();
    let _ = stop.send(true);
    let _ = router.await;
    (workflows, elapsed)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    latency(quick);
    if std::env::args().any(|a| a == "--latency-only") {
        return;
    }
    // One server (R1), then the production shape: three servers run from
    // infra/nats/cluster.conf on this machine, the stream at R3.
    let (url, _server) = nats_url_or_start().expect("a nats-server");
    let single = throughput(quick, url, 1).await;
    drop(_server);
    let config =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra/nats/cluster.conf");
    let cluster = NatsCluster::start(&config, 3).expect("a three-server cluster");
    let three = throughput(quick, cluster.urls(), 3).await;
    println!("\n| router over JetStream, 10 sites × 50 shapes, submit → placement_decided (plus the first release and dispatch) | workflows | seconds | placements/s |\n| --- | ---: | ---: | ---: |");
    for (label, (workflows, elapsed)) in [
        ("one server, R1", single),
        ("three servers on this machine, R3", three),
    ] {
        println!(
            "| {label} | {workflows} | {:.2} | {:.0} |",
            elapsed.as_secs_f64(),
            workflows as f64 / elapsed.as_secs_f64()
        );
    }
}
