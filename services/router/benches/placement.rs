//! Placement benchmarks:
//! 1. decision latency (p50/p99) of `placement::decide` for a three-job workflow against
//!    catalogues of 10, 100 and 1,000 sites with 50 shapes each, placed whole and with
//!    `placement.split` (which adds a per-job pass over the sites);
//!    Then the same on the full-size catalogue: every EC2 instance type (moto's copy of
//!    `DescribeInstanceTypes`, benches/data) in 30 regions, GCP-, Azure- and OCI-like
//!    families of the same order, and HPC sites;
//! 2. sustained placements per second through the router service over JetStream (a
//!    real nats-server; submissions appended as fast as the log takes them, each as the
//!    intake appends one, with no read of the new workflow first), and over
//!    the embedded default's SQLite log, each beside the log's own ceiling measured in
//!    the same run (raw JetStream publishes; fsynced SQLite appends from 16 writers).
//!
//!    The rows submitted while the router runs also give each workflow's wait from
//!    submission to placement (p50, p99, max), from the events' own times.
//!
//! `cargo bench -p meridian-router --bench placement [-- --quick] [--latency-only | --throughput-only] [--workflows N]`
//! (`--workflows`: how many the throughput rows place, 2,000 unless given).

// The allocator the `meridian` binary runs the router with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use meridian_domain::catalog_file::{offline_catalog, SiteSpec};
use meridian_domain::placement::decide;
use meridian_eventlog::aggregates::{execute, Cached};
use meridian_eventlog::nats::{NatsConfig, NatsLog};
use meridian_eventlog::sqlite::SqliteLog;
use meridian_eventlog::testkit::{
    ceiling, count_in, nats_url_or_start, CountingAppends, NatsCluster, NatsServer,
};
use meridian_eventlog::EventLog;
use meridian_events::aggregate::{Site, SiteCommand, Workflow, WorkflowCommand};
use meridian_events::vocabulary::site::{Shape, ShapeGpus};
use meridian_events::vocabulary::AcceleratorVendor;
use meridian_events::{ComputeOffer, ComputePricing, Currency, EventContext, PriceSheet, SiteKind};
use meridian_router::Router;
use rust_decimal::Decimal;
use uuid::Uuid;

const PLACED: &str = "workflow.placement_decided.v1";
const REJECTED: &str = "workflow.placement_rejected.v1";

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
    spec(
        format!("site-{i:04}"),
        SiteKind::Aws,
        &format!("region-{}", i % 20),
        compute,
        shapes,
    )
}

/// A site of the benchmark's catalogues: its shapes and their offers, in US dollars.
fn spec(
    name: String,
    kind: SiteKind,
    region: &str,
    compute: Vec<ComputeOffer>,
    shapes: Vec<Shape>,
) -> SiteSpec {
    SiteSpec {
        name,
        kind,
        region: region.to_string(),
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

/// One machine shape of the full-size catalogue.
struct Machine {
    name: String,
    cpus: u32,
    memory_mib: u64,
    gpus: Option<(u32, AcceleratorVendor, String, u64)>,
}

/// Every EC2 instance type (benches/data/ec2-instance-types.tsv, from moto's copy of
/// `DescribeInstanceTypes`) and the 30 regions moto records offerings for. Accelerators
/// Meridian does not schedule (Habana, Inferentia, Trainium) count as none.
fn ec2() -> (Vec<&'static str>, Vec<Machine>) {
    const TYPES: &str = include_str!("data/ec2-instance-types.tsv");
    let regions = TYPES
        .lines()
        .find_map(|l| l.strip_prefix("# The regions those offerings come from: "))
        .expect("the regions line")
        .split(' ')
        .collect();
    let machines = TYPES
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let vendor = match f[4] {
                "NVIDIA" => Some(AcceleratorVendor::Nvidia),
                "AMD" => Some(AcceleratorVendor::Amd),
                _ => None,
            };
            let count: u32 = f[3].parse().unwrap();
            Machine {
                name: f[0].to_string(),
                cpus: f[1].parse().unwrap(),
                memory_mib: f[2].parse().unwrap(),
                gpus: vendor
                    .filter(|_| count > 0)
                    .map(|v| (count, v, f[5].to_string(), f[6].parse().unwrap())),
            }
        })
        .collect();
    (regions, machines)
}

/// Machine families in the manner of GCP, Azure and OCI, of the same order of count as
/// theirs: general, compute and memory families in several generations and sizes, and
/// their GPU shapes.
fn families(
    prefix: &str,
    generations: &[&str],
    gpus: &[(&str, AcceleratorVendor, &[u32])],
) -> Vec<Machine> {
    let mut out = Vec::new();
    for generation in generations {
        for (kind, gib_per_cpu) in [
            ("standard", 4u64),
            ("highmem", 8),
            ("highcpu", 1),
            ("megamem", 16),
        ] {
            for cpus in [2u32, 4, 8, 16, 32, 48, 64, 96, 128, 192] {
                out.push(Machine {
                    name: format!("{prefix}-{generation}-{kind}-{cpus}"),
                    cpus,
                    memory_mib: u64::from(cpus) * gib_per_cpu * 1024,
                    gpus: None,
                });
            }
        }
    }
    for (model, vendor, counts) in gpus {
        for count in *counts {
            out.push(Machine {
                name: format!("{prefix}-gpu-{}-{count}", model.to_lowercase()),
                cpus: 12 * count,
                memory_mib: u64::from(*count) * 85 * 1024,
                gpus: Some((*count, *vendor, model.to_string(), 80 * 1024)),
            });
        }
    }
    out
}

fn gpu_hour(model: &str) -> Decimal {
    Decimal::new(
        match model {
            m if m.contains("B200") || m.contains("B300") => 900,
            m if m.contains("H100") || m.contains("H200") || m.contains("MI300") => 700,
            m if m.contains("A100") => 400,
            m if m.contains("L40") || m.contains("A10") => 150,
            _ => 60,
        },
        2,
    )
}

/// A cloud region offering `machines` at instance prices, `factor` percent of base.
fn cloud_site(
    kind: SiteKind,
    name: String,
    region: &str,
    machines: &[Machine],
    factor: i64,
) -> SiteSpec {
    let mut shapes = Vec::with_capacity(machines.len());
    let mut compute = Vec::with_capacity(machines.len());
    for m in machines {
        let gpu = m.gpus.as_ref().map_or(Decimal::ZERO, |(n, _, model, _)| {
            gpu_hour(model) * Decimal::from(*n)
        });
        let base = Decimal::new(4, 2) * Decimal::from(m.cpus)
            + Decimal::new(5, 3) * Decimal::from(m.memory_mib / 1024)
            + gpu;
        compute.push(ComputeOffer {
            offer: m.name.clone(),
            pricing: ComputePricing::Instance {
                per_instance_hour: base * Decimal::new(factor, 2),
            },
        });
        shapes.push(Shape {
            name: m.name.clone(),
            offer: m.name.clone(),
            spot_offer: None,
            cpus: m.cpus,
            memory_bytes: m.memory_mib << 20,
            gpus: m
                .gpus
                .as_ref()
                .map(|(count, vendor, model, mib)| ShapeGpus {
                    count: *count,
                    vendor: *vendor,
                    model: model.clone(),
                    memory_bytes: mib << 20,
                }),
            max_nodes: 1,
            max_walltime_secs: None,
        });
    }
    spec(name, kind, region, compute, shapes)
}

/// The full-size catalogue: every EC2 instance type in each of 30 AWS regions; GCP-,
/// Azure- and OCI-like families across 40, 60 and 40 regions; 20 HPC sites (the
/// reference catalogue's 50-shape sites stand in for them).
fn full_catalog() -> Vec<SiteSpec> {
    use AcceleratorVendor::{Amd, Nvidia};
    let (regions, machines) = ec2();
    let mut sites: Vec<SiteSpec> = regions
        .iter()
        .enumerate()
        .map(|(i, r)| {
            cloud_site(
                SiteKind::Aws,
                format!("aws-{r}"),
                r,
                &machines,
                100 + (i as i64 % 7) * 3,
            )
        })
        .collect();
    let gcp = families(
        "gcp",
        &["e2", "n2", "n2d", "n4", "c3", "c3d", "c4", "m3"],
        &[
            ("A100", Nvidia, &[1, 2, 4, 8, 16]),
            ("H100", Nvidia, &[8]),
            ("L4", Nvidia, &[1, 2, 4, 8]),
        ],
    );
    let azure = families(
        "azure",
        &[
            "d-v4", "d-v5", "d-v6", "e-v4", "e-v5", "e-v6", "f-v2", "l-v3", "m-v2",
        ],
        &[
            ("T4", Nvidia, &[1, 4]),
            ("A100", Nvidia, &[1, 2, 4, 8]),
            ("H100", Nvidia, &[1, 2, 8]),
            ("MI300X", Amd, &[8]),
        ],
    );
    let oci = families(
        "oci",
        &["e4", "e5", "a1", "x9"],
        &[
            ("A10", Nvidia, &[1, 2, 4]),
            ("A100", Nvidia, &[8]),
            ("H100", Nvidia, &[8]),
            ("MI300X", Amd, &[8]),
        ],
    );
    for (kind, prefix, machines, regions) in [
        (SiteKind::Gcp, "gcp", &gcp, 40),
        (SiteKind::Azure, "azure", &azure, 60),
        (SiteKind::Oci, "oci", &oci, 40),
    ] {
        for r in 0..regions {
            let region = format!("{prefix}-region-{r:02}");
            sites.push(cloud_site(
                kind,
                region.clone(),
                &region,
                machines,
                95 + (r as i64 % 11) * 2,
            ));
        }
    }
    for i in 0..20 {
        let mut hpc = site(5000 + i);
        hpc.kind = SiteKind::Slurm;
        sites.push(hpc);
    }
    sites
}

/// p50/p99 of the reference workflows on the full-size catalogue, and a fresh
/// catalogue's first decision.
fn full_size(quick: bool) {
    let sites = full_catalog();
    let shapes: usize = sites.iter().map(|s| s.shapes.len()).sum();
    let catalog = offline_catalog(&sites);
    let whole = meridian_spec::parse(WORKFLOW).unwrap();
    let split = meridian_spec::parse(
        &WORKFLOW.replace("name: bench\n", "name: bench\nplacement: {split: true}\n"),
    )
    .unwrap();
    println!("\n| workflow, full-size catalogue | sites | shapes | decisions | p50 ms | p99 ms | first decision: every shape scanned ms | building the indexes ms | indexes built ms | new requests, indexes built: p50 / p99 ms |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (label, spec) in [("one site", &whole), ("split: true", &split)] {
        let runs = if quick { 5 } else { 200 };
        std::hint::black_box(decide(spec, &catalog, Utc::now()));
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let decision = std::hint::black_box(decide(spec, &catalog, Utc::now()));
            times.push(t.elapsed());
            assert!(matches!(
                decision,
                meridian_domain::placement::Decision::Placed(_)
            ));
        }
        times.sort();
        let [scan, build, built] = [First::Scan, First::Build, First::Built]
            .map(|how| first_decisions(spec, &sites, 3, how));
        let new = new_requests(spec, &catalog, if quick { 5 } else { 50 });
        println!(
            "| {label} | {} | {shapes} | {runs} | {:.3} | {:.3} | {:.1} | {:.1} | {:.2} | {:.3} / {:.3} |",
            sites.len(),
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            percentile(&scan, 0.5),
            percentile(&build, 0.5),
            percentile(&built, 0.5),
            percentile(&new, 0.5),
            percentile(&new, 0.99),
        );
    }
}

/// How a first decision finds each site's fits.
#[derive(Clone, Copy, PartialEq)]
enum First {
    /// Every shape scanned, as before the shape index.
    Scan,
    /// Each site's index built, then searched.
    Build,
    /// The indexes already built (the router's catalogue after its first decision).
    Built,
}

/// `n` first decisions on catalogues from `sites` that remember no fit, sorted.
fn first_decisions(
    spec: &meridian_spec::Workflow,
    sites: &[SiteSpec],
    n: usize,
    how: First,
) -> Vec<Duration> {
    let built = offline_catalog(sites);
    std::hint::black_box(decide(spec, &built, Utc::now()));
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            // A copy shares the built indexes, not the fits.
            let mut fresh = match how {
                First::Built => built.clone(),
                First::Scan | First::Build => offline_catalog(sites),
            };
            fresh.scan_every_shape = how == First::Scan;
            let t = Instant::now();
            std::hint::black_box(decide(spec, &fresh, Utc::now()));
            t.elapsed()
        })
        .collect();
    times.sort();
    times
}

/// `n` decisions on `catalog` once its shape indexes are built, each for requests it has
/// not seen (every job's walltime a minute longer than the last's), sorted: a new kind
/// of workflow arriving at a running router.
fn new_requests(
    spec: &meridian_spec::Workflow,
    catalog: &meridian_domain::Catalog,
    n: usize,
) -> Vec<Duration> {
    let catalog = catalog.clone();
    std::hint::black_box(decide(spec, &catalog, Utc::now()));
    let mut times: Vec<Duration> = (1..=n as u64)
        .map(|i| {
            let mut spec = spec.clone();
            for job in spec.jobs.values_mut() {
                let secs = job.resources.walltime.secs() + 60 * i;
                job.resources.walltime = meridian_spec::Walltime::from_secs(secs);
            }
            let t = Instant::now();
            std::hint::black_box(decide(&spec, &catalog, Utc::now()));
            t.elapsed()
        })
        .collect();
    times.sort();
    times
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
    println!("| workflow | sites × shapes | decisions | p50 ms | p99 ms | per site-shape µs | first decision: every shape scanned ms | building the indexes ms | indexes built ms |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (label, spec) in [("one site", &whole), ("split: true", &split)] {
        for sites in [10usize, 100, 1000] {
            let specs: Vec<SiteSpec> = (0..sites).map(site).collect();
            let catalog = offline_catalog(&specs);
            let runs = if quick {
                5
            } else {
                // At least 200, so that p99 is not simply the slowest decision.
                (20_000 / sites).clamp(200, 1000)
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
            let [scan, build, built] = [First::Scan, First::Build, First::Built]
                .map(|how| first_decisions(spec, &specs, 5, how));
            println!(
                "| {label} | {sites} × 50 | {runs} | {p50:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                percentile(&times, 0.99),
                p50 * 1e3 / (sites as f64 * 50.0),
                percentile(&scan, 0.5),
                percentile(&build, 0.5),
                percentile(&built, 0.5)
            );
        }
    }
}

/// A fresh stream on the JetStream at `url`, at `replicas`.
async fn jetstream(url: String, replicas: usize) -> Arc<dyn EventLog> {
    let unique = Uuid::now_v7().simple().to_string();
    Arc::new(
        NatsLog::connect(NatsConfig {
            url,
            stream: format!("BENCH_{unique}"),
            subject_prefix: format!("bench.{unique}"),
            replicas,
            ..NatsConfig::default()
        })
        .await
        .unwrap(),
    )
}

/// Workflows submitted to placed per second, through the router, on `log`.
/// CPU seconds (user and system) a process has used, from `/proc/PID/stat`: the
/// machine is shared, and the CPU each phase took varies less than its rate. `None`
/// where there is no such file (not Linux).
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state is the first, utime the
    // 12th and stime the 13th, in clock ticks of 1/100 s.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some((ticks(11)? + ticks(12)?) as f64 / 100.0)
}

/// CPU seconds used so far by this process and by the log's servers.
fn cpu_now(servers: &[u32]) -> (f64, f64) {
    let server = servers
        .iter()
        .filter_map(|pid| cpu_seconds(&pid.to_string()))
        .sum();
    (cpu_seconds("self").unwrap_or(f64::NAN), server)
}

/// The CPU seconds this process and the servers used since `before` ([`cpu_now`]).
fn cpu_since(before: (f64, f64), servers: &[u32]) -> (f64, f64) {
    let now = cpu_now(servers);
    (now.0 - before.0, now.1 - before.1)
}

/// `servers`: the process ids of the log's servers, whose CPU time is counted beside
/// this process's (none for SQLite, which runs in this process).
async fn throughput(quick: bool, log: Arc<dyn EventLog>, servers: &[u32]) -> Throughput {
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
    let workflows = match workflows_asked() {
        Some(n) => n,
        None if quick => 50,
        None => 2_000,
    };
    let spec = meridian_spec::parse(WORKFLOW).unwrap();

    // 1. Submitted while the router runs: the submitters' pace is part of it.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let counting = CountingAppends::new(log.clone(), PLACED, REJECTED);
    let router_log: Arc<dyn EventLog> = counting.clone();
    let mut router =
        tokio::spawn(async move { Router::new(router_log).await.unwrap().run(stopped).await });
    let from = log.head().await.unwrap();
    let start = Instant::now();
    let cpu = cpu_now(servers);
    submit(&log, &spec, workflows).await;
    placed_while_it_runs(&counting, from, workflows, &mut router).await;
    let live = start.elapsed();
    let live_cpu = cpu_since(cpu, servers);
    assert_eq!(count_in(&*log, from, PLACED, REJECTED).await, workflows);
    let _ = stop.send(true);
    let _ = router.await;
    let live_waits = submit_to_placed(&*log, from).await;

    // 2. A backlog: the workflows are in the log before the router starts, so that only
    // the router's pace (its start included) is measured.
    // Timed too: the submitters' own pace bounds the first measure.
    let from = log.head().await.unwrap();
    let start = Instant::now();
    submit(&log, &spec, workflows).await;
    let submitted = start.elapsed();
    // What the start has to read: the log past the last snapshot the first router saved
    // (where that fell varies from run to run, and so does the start).
    let snapshot_at = log
        .load_snapshot(meridian_router::SNAPSHOT)
        .await
        .unwrap()
        .map_or(0, |s| s.position);
    let start_reads = log.head().await.unwrap() - snapshot_at;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let counting = CountingAppends::new(log.clone(), PLACED, REJECTED);
    let router_log: Arc<dyn EventLog> = counting.clone();
    let start = Instant::now();
    let cpu = cpu_now(servers);
    let mut router =
        tokio::spawn(async move { Router::new(router_log).await.unwrap().run(stopped).await });
    placed_while_it_runs(&counting, from, workflows, &mut router).await;
    let backlog = start.elapsed();
    let backlog_cpu = cpu_since(cpu, servers);
    assert_eq!(count_in(&*log, from, PLACED, REJECTED).await, workflows);
    let _ = stop.send(true);
    let _ = router.await;
    Throughput {
        workflows,
        live,
        live_waits,
        live_cpu,
        submitted,
        backlog,
        backlog_cpu,
        start_reads,
    }
}

/// Waits until the router's log acknowledged `workflows` placements (a rejection ends
/// the bench); a router that stops first (an error, a panic) ends the bench with what
/// stopped it, rather than leave it waiting for placements that will not come. Counted
/// as the router appends them, not by reading the log back while it runs: each read of
/// a JetStream log is a consumer its server makes and fills beside the router's (the
/// caller checks the count by reading the log once the row is timed).
async fn placed_while_it_runs(
    counting: &CountingAppends,
    from: u64,
    workflows: usize,
    router: &mut tokio::task::JoinHandle<Result<(), meridian_router::RouterError>>,
) {
    tokio::select! {
        _ = counting.until(from, workflows) => {}
        stopped = router => panic!("the router stopped before it placed every workflow: {stopped:?}"),
    }
}

struct Throughput {
    workflows: usize,
    live: Duration,
    /// Each workflow's wait from its submission to its placement while the writers
    /// submitted, sorted.
    live_waits: Vec<Duration>,
    /// CPU seconds this process (writers, router, counting) and the log's servers used
    /// while the writers submitted and the router placed.
    live_cpu: (f64, f64),
    /// The 8 writers submitting the backlog, no router running.
    submitted: Duration,
    backlog: Duration,
    /// CPU seconds this process and the servers used while the router placed the backlog.
    backlog_cpu: (f64, f64),
    /// Log positions past the router's snapshot when the backlog's router starts.
    start_reads: u64,
}

/// How long each workflow placed after `from` waited from its submission to its
/// placement, sorted: both times as the events record them (one clock, this process's).
async fn submit_to_placed(log: &dyn EventLog, from: u64) -> Vec<Duration> {
    let mut submitted = std::collections::HashMap::new();
    let mut waits = Vec::new();
    let mut after = from;
    loop {
        let commits = log.read_text_from(after, 4096).await.unwrap();
        let Some(last) = commits.last() else { break };
        after = last.position;
        for text in commits.iter().flat_map(|c| &c.events) {
            let read = meridian_events::TextEnvelope::parse(text).unwrap();
            let (id, at) = (read.envelope.aggregate.id, read.envelope.occurred_at);
            match &*read.kind {
                "workflow.submitted.v1" => {
                    submitted.insert(id, at);
                }
                PLACED => {
                    if let Some(wait) = submitted.get(&id).and_then(|s| (at - *s).to_std().ok()) {
                        waits.push(wait);
                    }
                }
                _ => {}
            }
        }
    }
    waits.sort();
    waits
}

/// Submits `workflows` workflows from 8 writers at once.
async fn submit(log: &Arc<dyn EventLog>, spec: &meridian_spec::Workflow, workflows: usize) {
    let mut submitters = Vec::new();
    for chunk in 0..8 {
        let (log, spec) = (log.clone(), spec.clone());
        submitters.push(tokio::spawn(async move {
            for _ in (chunk..workflows).step_by(8) {
                // As the intake submits: an id made here has no history to read first.
                let id = Uuid::now_v7();
                Cached::<Workflow>::fresh(id)
                    .execute(&*log, &EventContext::new_chain("bench"), |_| {
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
}

/// The log's own ceiling, measured in the same run: appends (or raw publishes) a second.
struct Ceiling {
    what: &'static str,
    per_second: f64,
}

async fn raw_publish_ceiling(quick: bool, url: &str, replicas: usize) -> Ceiling {
    let count = if quick { 2_000 } else { 50_000 };
    let (elapsed, _) = ceiling::raw_publish(url, replicas, count, 256).await;
    Ceiling {
        what: "raw async publish, 128 B, 256 in flight",
        per_second: count as f64 / elapsed.as_secs_f64(),
    }
}

/// `--workflows N`, if given.
fn workflows_asked() -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == "--workflows")?;
    let n = args.get(at + 1).and_then(|n| n.parse().ok());
    Some(n.expect("--workflows takes a number of workflows"))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    if !std::env::args().any(|a| a == "--throughput-only") {
        latency(quick);
        full_size(quick);
    }
    if std::env::args().any(|a| a == "--latency-only") {
        return;
    }
    // One server (R1), then the production shape: three servers run from
    // infra/nats/cluster.conf on this machine, the stream at R3. Each log's ceiling is
    // measured on the same servers just before the router runs on them.
    let (url, _server) = nats_url_or_start().expect("a nats-server");
    let single_ceiling = raw_publish_ceiling(quick, &url, 1).await;
    let pids: Vec<u32> = _server.iter().filter_map(NatsServer::pid).collect();
    let single = throughput(quick, jetstream(url, 1).await, &pids).await;
    drop(_server);
    let config =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra/nats/cluster.conf");
    let cluster = NatsCluster::start(&config, 3).expect("a three-server cluster");
    let three_ceiling = raw_publish_ceiling(quick, &cluster.urls(), 3).await;
    let three = throughput(quick, jetstream(cluster.urls(), 3).await, &cluster.pids()).await;
    drop(cluster);
    // The embedded default's log: a SQLite file, every commit fsynced. Its ceiling:
    // single-event appends from 16 writers to a file of its own.
    let dir = tempfile::tempdir().unwrap();
    let per_writer = if quick { 20 } else { 300 };
    let embedded_ceiling = Ceiling {
        what: "fsynced appends from 16 writers",
        per_second: ceiling::sqlite_appends_per_second(
            &dir.path().join("ceiling.sqlite"),
            16,
            per_writer,
        )
        .await,
    };
    let sqlite = SqliteLog::open(&dir.path().join("events.sqlite"))
        .await
        .unwrap();
    let embedded = throughput(quick, Arc::new(sqlite), &[]).await;
    println!("\n| router, 10 sites × 50 shapes, three-job workflows, submit → placement_decided (plus the first release and dispatch) | workflows | seconds | placements/s | the log's ceiling, same run | ceiling/s | placements ÷ ceiling |\n| --- | ---: | ---: | ---: | --- | ---: | ---: |");
    let rows = [
        ("JetStream, one server, R1", single, single_ceiling),
        (
            "JetStream, three servers on this machine, R3",
            three,
            three_ceiling,
        ),
        ("SQLite (synchronous=FULL)", embedded, embedded_ceiling),
    ];
    for (label, t, ceiling) in &rows {
        let backlog = format!(
            "a backlog, the router alone (its start included: {} positions past its snapshot)",
            t.start_reads
        );
        for (how, elapsed) in [
            ("submitted by 8 writers while the router runs", t.live),
            (
                "the 8 writers alone, no router (submissions/s: the row above's bound)",
                t.submitted,
            ),
            (backlog.as_str(), t.backlog),
        ] {
            let rate = t.workflows as f64 / elapsed.as_secs_f64();
            println!(
                "| {label}: {how} | {} | {:.2} | {rate:.0} | {} | {:.0} | {:.1} % |",
                t.workflows,
                elapsed.as_secs_f64(),
                ceiling.what,
                ceiling.per_second,
                100.0 * rate / ceiling.per_second,
            );
        }
    }
    // The CPU each placement took, all processes of the row together: on a shared
    // machine it varies less than the rate.
    println!("\n| CPU while placing | bench process s (writers, router, counting) | log servers s | CPU ms per workflow |\n| --- | ---: | ---: | ---: |");
    for (label, t, _) in &rows {
        for (how, (own, server)) in [
            ("submitted while the router runs", t.live_cpu),
            ("a backlog, the router alone", t.backlog_cpu),
        ] {
            println!(
                "| {label}: {how} | {own:.2} | {server:.2} | {:.3} |",
                1e3 * (own + server) / t.workflows as f64
            );
        }
    }
    // What a submitter waits for while the writers submit: the latency beside the rate.
    println!("\n| submitted while the router runs: submission → placement | placed | p50 ms | p99 ms | max ms |\n| --- | ---: | ---: | ---: | ---: |");
    for (label, t, _) in &rows {
        let at = |q: f64| {
            let waits = &t.live_waits;
            waits
                .get(((waits.len() as f64 * q) as usize).min(waits.len().saturating_sub(1)))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        println!(
            "| {label} | {} | {:.1} | {:.1} | {:.1} |",
            t.live_waits.len(),
            at(0.5),
            at(0.99),
            at(1.0),
        );
    }
}
