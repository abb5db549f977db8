//! Placement beyond one site at a time: a workflow split across sites with the volumes
//! moved between them priced, a tenant's placement policy on top of a workflow's hints,
//! and egress priced through the source's monthly volume tiers.

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use meridian_domain::catalog_file::{offline_catalog, parse};
use meridian_domain::placement::{decide, decide_for, Decision, Placed};
use meridian_domain::Catalog;
use meridian_events::vocabulary::tenant::{PlacementPolicy, TenantEvent};
use meridian_events::vocabulary::workflow::{CostTerms, Verdict};
use meridian_events::vocabulary::{Location, TransferEvent};
use meridian_events::{
    AggregateKind, AggregateRef, Currency, EgressTariff, Envelope, Event, EventContext, Money,
};
use rust_decimal::Decimal;
use uuid::Uuid;

fn d(s: &str) -> Decimal {
    Decimal::from_str(s).unwrap()
}

fn text(d: Decimal) -> String {
    d.normalize().to_string()
}

/// `cpu` and `gpu` share an AWS region (moves between them cost 0.01/GB); `other` is
/// GCP (moves to it from AWS cost AWS's internet price, 0.09/GB). Storage is free so
/// the sums stay readable.
fn three_sites(gpu_has_cpu_shape: bool) -> String {
    let gpu_cpu_shape = if gpu_has_cpu_shape {
        "\n      - {name: c, offer: c, cpus: 192, memory: 384GiB}"
    } else {
        ""
    };
    format!(
        r#"
sites:
  - name: cpu
    kind: aws
    region: us-east-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      egress_per_gb: "0.09"
      egress_within: {{same_region: "0.01", other_region: "0.02"}}
      compute: [{{offer: c, per_instance_hour: "1.00"}}]
    shapes: [{{name: c, offer: c, cpus: 192, memory: 384GiB}}]
  - name: gpu
    kind: aws
    region: us-east-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      egress_per_gb: "0.09"
      egress_within: {{same_region: "0.01", other_region: "0.02"}}
      compute: [{{offer: c, per_instance_hour: "3.00"}}, {{offer: g, per_instance_hour: "20.00"}}]
    shapes:
      - {{name: g, offer: g, cpus: 96, memory: 1TiB, gpus: {{count: 8, vendor: nvidia, model: H100, memory: 80GiB}}}}{gpu_cpu_shape}
  - name: other
    kind: gcp
    region: us-central1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      egress_per_gb: "0.12"
      compute: [{{offer: c, per_instance_hour: "2.50"}}, {{offer: g, per_instance_hour: "30.00"}}]
    shapes:
      - {{name: c, offer: c, cpus: 192, memory: 384GiB}}
      - {{name: g, offer: g, cpus: 96, memory: 1TiB, gpus: {{count: 8, vendor: nvidia, model: H100, memory: 80GiB}}}}
"#
    )
}

/// prep (128 CPUs: more than the GPU shapes have) then train (8 H100s), sharing `data`.
fn pipeline(size: &str, placement: &str) -> meridian_spec::Workflow {
    meridian_spec::parse(&format!(
        r#"
version: v1
name: pipeline
placement: {placement}
volumes:
  data: {{size: {size}}}
jobs:
  prep: {{image: host, command: ["true"], mounts: {{data: /data}}, resources: {{cpus: 128, memory: 32GiB, walltime: 10h}}}}
  train:
    requires: [prep]
    image: host
    command: ["true"]
    mounts: {{data: /data}}
    resources: {{cpus: 32, memory: 256GiB, walltime: 10h, gpus: {{count: 8, vendor: nvidia, model: H100}}}}
"#
    ))
    .unwrap()
}

fn catalog(file: &str) -> Catalog {
    offline_catalog(&parse(file).unwrap())
}

fn placed(decision: Decision) -> Placed {
    match decision {
        Decision::Placed(p) => *p,
        other => panic!("rejected: {:?}", other.rejections()),
    }
}

fn candidate<'p>(
    p: &'p Placed,
    site: &str,
) -> &'p meridian_events::vocabulary::workflow::Candidate {
    p.explanation
        .candidates
        .iter()
        .find(|c| c.site == site)
        .unwrap_or_else(|| panic!("{site} is a candidate"))
}

fn sum(terms: &CostTerms) -> Decimal {
    terms.compute + terms.data_in + terms.storage + terms.data_out + terms.data_between
}

#[test]
fn a_split_is_chosen_when_it_beats_every_single_site_and_its_terms_add_up() {
    let catalog = catalog(&three_sites(true));
    let p = placed(decide(
        &pipeline("100GB", "{split: true}"),
        &catalog,
        Utc::now(),
    ));
    // One site: gpu runs prep on c (10 h × 3) and train on g (10 h × 20): 230; other:
    // 25 + 300 = 325; cpu has no GPUs. Split: prep at cpu (10), train at gpu (200) plus
    // 100 GB moved within the region at 0.01: 211.
    assert_eq!(p.site, "cpu");
    assert_eq!(p.job_sites.get("train").map(String::as_str), Some("gpu"));
    assert!(!p.job_sites.contains_key("prep"));
    assert!(p.storage_rates.contains_key("gpu"));
    assert_eq!(text(p.estimated_cost.amount), "211");
    assert_eq!(p.job_rates["prep"].offer, "c");
    assert_eq!(p.job_rates["train"].offer, "g");

    let plan = p.explanation.split.as_ref().unwrap();
    assert_eq!(plan.verdict, Verdict::Chosen);
    assert!(
        p.explanation
            .candidates
            .iter()
            .all(|c| c.verdict != Verdict::Chosen),
        "no single site is chosen when the split is"
    );
    let terms = plan.cost.as_ref().unwrap();
    assert_eq!(text(terms.data_between), "1");
    assert_eq!(sum(terms), p.estimated_cost.amount);
    let per_job: Decimal = plan.jobs.iter().map(|j| j.compute).sum();
    assert_eq!(per_job, terms.compute);
    assert_eq!(plan.moves.len(), 1);
    let m = &plan.moves[0];
    assert_eq!(
        (m.volume.as_str(), m.from.as_str(), m.to.as_str()),
        ("data", "cpu", "gpu")
    );
    assert_eq!(m.before_job, "train");
    assert_eq!(m.bytes, 100_000_000_000);
    assert_eq!(m.cost, terms.data_between);

    let gpu = candidate(&p, "gpu");
    assert_eq!(gpu.verdict, Verdict::Fitted);
    assert_eq!(text(sum(gpu.cost.as_ref().unwrap())), "230");
}

#[test]
fn moving_a_big_volume_between_sites_keeps_the_workflow_at_one_site() {
    let catalog = catalog(&three_sites(true));
    // 5,000 GB moved at 0.01 adds 50: the split's 260 loses to gpu's 230.
    let p = placed(decide(
        &pipeline("5000GB", "{split: true}"),
        &catalog,
        Utc::now(),
    ));
    assert_eq!(p.site, "gpu");
    assert!(p.job_sites.is_empty());
    let plan = p.explanation.split.as_ref().unwrap();
    assert_eq!(plan.verdict, Verdict::Fitted);
    assert_eq!(text(sum(plan.cost.as_ref().unwrap())), "260");
    assert_eq!(text(p.estimated_cost.amount), "230");
}

#[test]
fn without_split_or_with_prefer_fastest_the_workflow_stays_at_one_site() {
    let catalog = catalog(&three_sites(true));
    let p = placed(decide(&pipeline("100GB", "{}"), &catalog, Utc::now()));
    assert_eq!(p.site, "gpu");
    assert!(p.explanation.split.is_none(), "no split was asked for");
    let p = placed(decide(
        &pipeline("100GB", "{split: true, prefer: fastest}"),
        &catalog,
        Utc::now(),
    ));
    assert!(
        p.job_sites.is_empty(),
        "fastest keeps one site when one fits"
    );
}

#[test]
fn a_workflow_no_one_site_can_run_is_placed_across_two_when_it_may_split() {
    // Without `c` at gpu, prep (128 CPUs) fits only cpu and other; train only gpu and
    // other. `other` alone can run both; drop it with an allow-list.
    let catalog = catalog(&three_sites(false));
    let hints = "{split: true, sites: [cpu, gpu]}";
    let p = placed(decide(&pipeline("100GB", hints), &catalog, Utc::now()));
    assert_eq!(p.site, "cpu");
    assert_eq!(p.job_sites["train"], "gpu");

    let Decision::Rejected { rejections } = decide(
        &pipeline("100GB", "{sites: [cpu, gpu]}"),
        &catalog,
        Utc::now(),
    ) else {
        panic!("no one site can run both jobs")
    };
    let gpu = rejections.iter().find(|r| r.site == "gpu").unwrap();
    assert!(
        gpu.reason.contains("no shape fits job prep"),
        "{}",
        gpu.reason
    );
}

fn observe(catalog: &mut Catalog, tenant: &str, kind: AggregateKind, event: Event) {
    let at = Utc::now();
    let aggregate = AggregateRef::new(kind, Uuid::now_v7());
    for e in Envelope::sequence_after(
        aggregate,
        0,
        &EventContext::new_chain(tenant),
        at,
        vec![event],
    ) {
        catalog.observe(&e);
    }
}

fn set_policy(catalog: &mut Catalog, tenant: &str, policy: PlacementPolicy) {
    let event = Event::Tenant(TenantEvent::PolicySet {
        tenant: tenant.into(),
        policy,
        set_by: "admin".into(),
    });
    observe(catalog, tenant, AggregateKind::Tenant, event);
}

#[test]
fn a_tenant_policy_narrows_placement_on_top_of_the_workflows_hints() {
    let mut catalog = catalog(&three_sites(true));
    set_policy(
        &mut catalog,
        "physics",
        PlacementPolicy {
            regions: vec!["us-central1".into()],
            ..PlacementPolicy::open()
        },
    );
    let spec = pipeline("100GB", "{}");
    let p = placed(decide_for(&spec, Some("physics"), &catalog, Utc::now()));
    assert_eq!(p.site, "other");
    let gpu = candidate(&p, "gpu");
    assert_eq!(
        gpu.verdict,
        Verdict::Rejected {
            reason: "region us-east-1 is not among the regions the tenant's policy allows".into()
        }
    );
    // Another tenant, and a quote without a tenant, are not bound by it.
    assert_eq!(
        placed(decide_for(&spec, Some("chemistry"), &catalog, Utc::now())).site,
        "gpu"
    );
    assert_eq!(placed(decide(&spec, &catalog, Utc::now())).site, "gpu");
}

#[test]
fn a_tenant_budget_and_a_ban_on_splitting_reject_with_the_policy_named() {
    let mut catalog = catalog(&three_sites(false));
    set_policy(
        &mut catalog,
        "physics",
        PlacementPolicy {
            split_allowed: false,
            ..PlacementPolicy::open()
        },
    );
    let spec = pipeline("100GB", "{split: true, sites: [cpu, gpu]}");
    let Decision::Rejected { rejections } =
        decide_for(&spec, Some("physics"), &catalog, Utc::now())
    else {
        panic!("splitting is not allowed and no one site fits")
    };
    let split = rejections
        .iter()
        .find(|r| r.site == "(split across sites)")
        .unwrap();
    assert_eq!(
        split.reason,
        "the tenant's policy does not allow splitting a workflow"
    );

    set_policy(
        &mut catalog,
        "physics",
        PlacementPolicy {
            budget_per_workflow: Some(Money::new(d("100"), Currency::USD)),
            ..PlacementPolicy::open()
        },
    );
    let Decision::Rejected { rejections } =
        decide_for(&spec, Some("physics"), &catalog, Utc::now())
    else {
        panic!("the split costs 211, over the tenant's 100")
    };
    let split = rejections
        .iter()
        .find(|r| r.site == "(split across sites)")
        .unwrap();
    assert!(
        split
            .reason
            .contains("exceeds the tenant's budget per workflow of 100 USD"),
        "{}",
        split.reason
    );
}

#[test]
fn a_tenant_that_may_not_use_spot_gets_on_demand_prices() {
    let file = r#"
sites:
  - name: spotty
    kind: aws
    region: us-east-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      compute: [{offer: c, per_instance_hour: "1.00"}, {offer: c-spot, per_instance_hour: "0.30"}]
    shapes: [{name: c, offer: c, spot_offer: c-spot, cpus: 16, memory: 64GiB}]
"#;
    let mut catalog = catalog(file);
    let spec = meridian_spec::parse(
        "version: v1\nname: s\nplacement: {spot: true}\njobs:\n  a: {image: host, command: [\"true\"]}\n",
    )
    .unwrap();
    assert_eq!(
        placed(decide_for(&spec, Some("physics"), &catalog, Utc::now()))
            .rate
            .offer,
        "c-spot"
    );
    set_policy(
        &mut catalog,
        "physics",
        PlacementPolicy {
            spot_allowed: false,
            ..PlacementPolicy::open()
        },
    );
    assert_eq!(
        placed(decide_for(&spec, Some("physics"), &catalog, Utc::now()))
            .rate
            .offer,
        "c"
    );
}

const TIERED: &str = r#"
sites:
  - name: holder
    kind: aws
    region: us-east-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      egress_per_gb: "0.09"
      egress_tiers: [{from_gb: "10", per_gb: "0.05"}, {from_gb: "1000", per_gb: "0.01"}]
      compute: [{offer: c, per_instance_hour: "9.00"}]
    shapes: [{name: c, offer: c, cpus: 16, memory: 64GiB}]
    datasets: [{uri: "s3://corpus/", digest: "sha256:cc", size: 20GB}]
  - name: consumer
    kind: gcp
    region: us-central1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      compute: [{offer: c, per_instance_hour: "1.00"}]
    shapes: [{name: c, offer: c, cpus: 16, memory: 64GiB}]
"#;

const READS_CORPUS: &str = r#"
version: v1
name: r
volumes:
  data:
    size: 50GB
    ingress: [{source: "s3://corpus/part-1/", destination: /in/}]
jobs:
  a: {image: host, command: ["true"], mounts: {data: /data}, resources: {walltime: 1h}}
"#;

fn data_in_at_consumer(catalog: &Catalog, tenant: &str, now: DateTime<Utc>) -> String {
    let spec = meridian_spec::parse(READS_CORPUS).unwrap();
    let p = placed(decide_for(&spec, Some(tenant), catalog, now));
    assert_eq!(p.site, "consumer");
    let c = candidate(&p, "consumer");
    text(c.cost.as_ref().unwrap().data_in)
}

fn copied_out_of_holder(
    catalog: &mut Catalog,
    tenant: &str,
    gb: u64,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
) {
    let tariff = EgressTariff::flat(d("0.09"), Currency::USD, ended_at, "test");
    let event = Event::Transfer(TransferEvent::Completed {
        workflow_id: Uuid::now_v7(),
        bytes: gb * 1_000_000_000,
        digest: "sha256:other".into(),
        from: Location::Site {
            site: "holder".into(),
        },
        to: Location::Region {
            region: "internet".into(),
        },
        started_at,
        ended_at,
        egress: Some(tariff),
        cached: false,
        class: None,
    });
    observe(catalog, tenant, AggregateKind::Transfer, event);
}

#[test]
fn input_egress_is_priced_through_the_holders_volume_tiers_for_the_month() {
    let mut catalog = catalog(TIERED);
    // The middle of a month, so that "this month" holds still during the test.
    let now = Utc.with_ymd_and_hms(2026, 12, 15, 12, 0, 0).unwrap();
    // 20 GB in a fresh month: 10 at 0.09, then 10 at 0.05.
    assert_eq!(data_in_at_consumer(&catalog, "physics", now), "1.4");

    // A copy last month does not count; 100 GB this month moves the next 20 to 0.05.
    let last_month = now - chrono::Duration::days(40);
    copied_out_of_holder(&mut catalog, "physics", 500, last_month, last_month);
    assert_eq!(data_in_at_consumer(&catalog, "physics", now), "1.4");
    copied_out_of_holder(&mut catalog, "physics", 100, now, now);
    assert_eq!(data_in_at_consumer(&catalog, "physics", now), "1");
    // 990 GB so far: 10 GB at 0.05, then 10 at 0.01.
    copied_out_of_holder(&mut catalog, "physics", 890, now, now);
    assert_eq!(data_in_at_consumer(&catalog, "physics", now), "0.6");
    // Tiers count per tenant.
    assert_eq!(data_in_at_consumer(&catalog, "chemistry", now), "1.4");
}

#[test]
fn a_copy_across_a_month_end_counts_its_share_in_each_month() {
    let mut catalog = catalog(TIERED);
    let month_start = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
    let now = month_start + chrono::Duration::days(3);
    // 20 GB from an hour before the month's start to an hour after: 10 GB this month,
    // as the ledger splits it, so the next 20 GB pay 0.05 from the start.
    copied_out_of_holder(
        &mut catalog,
        "physics",
        20,
        month_start - chrono::Duration::hours(1),
        month_start + chrono::Duration::hours(1),
    );
    assert_eq!(data_in_at_consumer(&catalog, "physics", now), "1");
}

#[test]
fn egress_tiers_in_a_catalogue_file_must_grow() {
    let bad = TIERED.replace(
        r#"[{from_gb: "10", per_gb: "0.05"}, {from_gb: "1000", per_gb: "0.01"}]"#,
        r#"[{from_gb: "10", per_gb: "0.05"}, {from_gb: "5", per_gb: "0.01"}]"#,
    );
    let err = parse(&bad).unwrap_err().to_string();
    assert!(
        err.starts_with("sites[0].prices.egress_tiers:"),
        "the error names the field: {err}"
    );
    assert!(err.contains("tier 1 starts at 5 GB"), "{err}");
    let bad = TIERED.replace(r#"per_gb: "0.05""#, r#"per_gb: "-0.05""#);
    let err = parse(&bad).unwrap_err().to_string();
    assert!(
        err.starts_with("sites[0].prices.egress_tiers[0].per_gb:"),
        "{err}"
    );
}

#[test]
fn a_shared_volume_is_held_at_each_site_of_a_split_for_the_whole_span() {
    let file = three_sites(true).replace(
        "source: test\n      egress_per_gb",
        "source: test\n      storage_per_gib_hour: \"0.001\"\n      egress_per_gb",
    );
    let catalog = catalog(&file);
    let p = placed(decide(
        &pipeline("100GB", "{split: true}"),
        &catalog,
        Utc::now(),
    ));
    let split = p.explanation.split.as_ref().unwrap();
    assert_eq!(split.verdict, Verdict::Chosen);
    let at_gpu = candidate(&p, "gpu");
    // One site holds `data` for the span, prep then train: 20 h at 0.001 per GiB-hour.
    let one = at_gpu.cost.as_ref().unwrap().storage;
    let expected =
        Decimal::from(100_000_000_000u64) / Decimal::from(1u64 << 30) * d("20") * d("0.001");
    assert!(
        (one - expected).abs() < d("0.000000000001"),
        "{one} vs {expected}"
    );
    // The split holds it at cpu and at gpu, as the router does.
    let two = split.cost.as_ref().unwrap().storage;
    assert!(
        (two - one * d("2")).abs() < d("0.000000000001"),
        "{two} vs 2 × {one}"
    );
    assert_eq!(sum(split.cost.as_ref().unwrap()), p.estimated_cost.amount);
}

#[test]
fn a_budget_in_another_currency_keeps_sites_out_rather_than_going_unchecked() {
    let mut catalog = catalog(&three_sites(true));
    set_policy(
        &mut catalog,
        "physics",
        PlacementPolicy {
            budget_per_workflow: Some(Money::new(d("100000"), Currency::EUR)),
            ..PlacementPolicy::open()
        },
    );
    let Decision::Rejected { rejections } = decide_for(
        &pipeline("100GB", "{}"),
        Some("physics"),
        &catalog,
        Utc::now(),
    ) else {
        panic!("every site is priced in USD")
    };
    let gpu = rejections.iter().find(|r| r.site == "gpu").unwrap();
    assert_eq!(
        gpu.reason,
        "priced in USD, which the tenant's budget per workflow of 100000 EUR cannot be compared with (no exchange rates)"
    );
}
