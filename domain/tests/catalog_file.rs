//! The catalogue file: the built-in reference parses, quotes make sense against it, and
//! bad files get errors that name the field.

use meridian_domain::catalog_file::{offline_catalog, parse, REFERENCE};
use meridian_domain::placement::{decide, Decision};

#[test]
fn the_reference_catalogue_covers_every_kind_and_names_every_source() {
    let sites = parse(REFERENCE).unwrap();
    let mut kinds: Vec<&str> = sites.iter().map(|s| s.kind.as_str()).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "aws",
            "azure",
            "coreweave",
            "gcp",
            "kubernetes",
            "oci",
            "pbs",
            "slurm"
        ]
    );
    for site in &sites {
        assert!(
            !site.prices.source.is_empty(),
            "{} names its source",
            site.name
        );
        assert!(!site.shapes.is_empty(), "{} has shapes", site.name);
    }
    // The public clouds publish internet egress in monthly volume bands.
    for name in [
        "aws-us-east-1",
        "azure-eastus",
        "gcp-us-central1",
        "oci-us-ashburn-1",
    ] {
        let site = sites.iter().find(|s| s.name == name).unwrap();
        assert!(
            !site.prices.egress_tiers.is_empty(),
            "{name} has egress tiers"
        );
    }
    // OCI's first 10 TB a month are free: 20 TB out cost 10,000 GB × 0.0085.
    let oci = sites.iter().find(|s| s.name == "oci-us-ashburn-1").unwrap();
    let cost = oci
        .prices
        .egress_tariff()
        .cost_after(
            rust_decimal::Decimal::ZERO,
            rust_decimal::Decimal::from(20_000),
        )
        .unwrap();
    assert_eq!(cost.normalize().to_string(), "85");
    let azure = sites.iter().find(|s| s.name == "azure-eastus").unwrap();
    let mi300x = azure
        .shapes
        .iter()
        .find(|s| s.name.contains("MI300X"))
        .unwrap();
    assert_eq!(mi300x.gpus.as_ref().unwrap().count, 8);
}

#[test]
fn quotes_against_the_reference_pick_by_vendor_and_price() {
    let catalog = offline_catalog(&parse(REFERENCE).unwrap());
    // The example asks for two named sites the reference does not have: rejected, per site.
    let example = meridian_spec::parse(include_str!("../../examples/mi300x.yaml")).unwrap();
    let Decision::Rejected { rejections } = decide(&example, &catalog, chrono::Utc::now()) else {
        panic!("no reference site is in the example's allow-list");
    };
    assert_eq!(rejections.len(), 8);
    assert!(rejections
        .iter()
        .all(|r| r.reason == "not in the workflow's placement.sites"));

    let amd = meridian_spec::parse(
        "version: v1\nname: a\njobs:\n  train: {image: host, command: [\"true\"], resources: {cpus: 64, memory: 512GiB, walltime: 4h, gpus: {count: 8, vendor: amd, model: MI300X}}}\n",
    )
    .unwrap();
    let Decision::Placed(p) = decide(&amd, &catalog, chrono::Utc::now()) else {
        panic!("an MI300X job has somewhere to go");
    };
    let train_shape = p
        .job_rates
        .values()
        .map(|r| r.offer.as_str())
        .collect::<Vec<_>>();
    assert!(
        train_shape.iter().any(|o| o.contains("MI300X")),
        "the AMD job runs on an MI300X shape: {train_shape:?}"
    );
    let h100 = meridian_spec::parse(include_str!("../../examples/train-h100.yaml")).unwrap();
    let Decision::Placed(p) = decide(&h100, &catalog, chrono::Utc::now()) else {
        panic!("an H100 job has somewhere to go");
    };
    for c in &p.explanation.candidates {
        if let Some(cost) = &c.cost {
            assert!(cost.total().is_ok());
        }
    }
}

#[test]
fn a_bad_file_names_the_field() {
    let bad = REFERENCE.replacen(
        "per_instance_hour: \"98.32\"",
        "per_instance_hour: \"lots\"",
        1,
    );
    let e = parse(&bad).unwrap_err();
    assert_eq!(e.path, "sites[0].prices.compute[0].per_instance_hour");
    assert!(e.message.contains("expected a non-negative decimal"), "{e}");

    let bad = REFERENCE.replacen("offer: g6.xlarge, cpus: 4", "offer: g7.xlarge, cpus: 4", 1);
    let e = parse(&bad).unwrap_err();
    assert!(e.path.ends_with(".offer"), "{e}");
    assert!(
        e.message
            .contains("no compute price for offer \"g7.xlarge\""),
        "{e}"
    );
}

const TWO_SITES: &str = r#"
sites:
  - name: cheap
    kind: aws
    region: us-east-1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      egress_per_gb: "0.09"
      compute: [{offer: c, per_instance_hour: "1.00"}]
    shapes: [{name: c, offer: c, cpus: 16, memory: 64GiB}]
    datasets: [DATASETS_CHEAP]
  - name: pricey
    kind: gcp
    region: us-central1
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      egress_per_gb: "0.12"
      compute: [{offer: c, per_instance_hour: "3.00"}]
    shapes: [{name: c, offer: c, cpus: 16, memory: 64GiB}]
    datasets: [DATASETS_PRICEY]
"#;

const DATA_JOB: &str = r#"
version: v1
name: d
volumes:
  data:
    size: 600GiB
    ingress: [{source: "gs://corpus/v2/shards/", destination: /in/}]
jobs:
  crunch:
    image: host
    command: ["true"]
    mounts: {data: /data}
    resources: {cpus: 8, memory: 32GiB, walltime: 10h}
"#;

fn place_with(cheap: &str, pricey: &str) -> meridian_domain::placement::Placed {
    let file = TWO_SITES
        .replace("DATASETS_CHEAP", cheap)
        .replace("DATASETS_PRICEY", pricey);
    let catalog = offline_catalog(&parse(&file).unwrap());
    let spec = meridian_spec::parse(DATA_JOB).unwrap();
    match decide(&spec, &catalog, chrono::Utc::now()) {
        Decision::Placed(p) => *p,
        other => panic!("{:?}", other.rejections()),
    }
}

#[test]
fn a_dataset_held_at_a_pricier_site_flips_the_choice_when_egress_outweighs_the_price() {
    let corpus = r#"{uri: "gs://corpus/v2/", digest: "sha256:aa", size: 500GB}"#;
    // Compute: cheap 10 h × 1.00 = 10; pricey 10 h × 3.00 = 30. Moving 500 GB out of
    // pricey costs 500 × 0.12 = 60 more at cheap, so the data's site wins: 30 < 70.
    let p = place_with("", corpus);
    assert_eq!(p.site, "pricey");
    let cheap = p
        .explanation
        .candidates
        .iter()
        .find(|c| c.site == "cheap")
        .unwrap();
    let terms = cheap.cost.as_ref().unwrap();
    assert_eq!(terms.data_in.normalize().to_string(), "60");
    assert_eq!(terms.total().unwrap().amount.normalize().to_string(), "70");
    let chosen = p
        .explanation
        .candidates
        .iter()
        .find(|c| c.site == "pricey")
        .unwrap();
    assert_eq!(
        chosen
            .cost
            .as_ref()
            .unwrap()
            .data_in
            .normalize()
            .to_string(),
        "0"
    );
    assert_eq!(p.estimated_cost.amount.normalize().to_string(), "30");

    // A small data set does not outweigh the compute difference: 5 GB × 0.12 = 0.6.
    let small = r#"{uri: "gs://corpus/v2/", digest: "sha256:bb", size: 5GB}"#;
    assert_eq!(place_with("", small).site, "cheap");
    // Held at both: no data term anywhere, the cheaper compute wins.
    assert_eq!(place_with(corpus, corpus).site, "cheap");
}

#[test]
fn a_finished_transfer_puts_the_bytes_at_its_destination() {
    use meridian_events::vocabulary::{Location, TransferEvent};
    use meridian_events::{AggregateKind, AggregateRef, Envelope, Event, EventContext};
    let corpus = r#"{uri: "gs://corpus/v2/", digest: "sha256:aa", size: 500GB}"#;
    let file = TWO_SITES
        .replace("DATASETS_CHEAP", "")
        .replace("DATASETS_PRICEY", corpus);
    let mut catalog = offline_catalog(&parse(&file).unwrap());
    let spec = meridian_spec::parse(DATA_JOB).unwrap();
    let Decision::Placed(p) = decide(&spec, &catalog, chrono::Utc::now()) else {
        panic!()
    };
    assert_eq!(p.site, "pricey");

    let now = chrono::Utc::now();
    let copied = Event::Transfer(TransferEvent::Completed {
        workflow_id: uuid::Uuid::now_v7(),
        bytes: 500_000_000_000,
        digest: "sha256:aa".into(),
        from: Location::Site {
            site: "pricey".into(),
        },
        to: Location::Site {
            site: "cheap".into(),
        },
        started_at: now,
        ended_at: now,
        egress: None,
        cached: false,
        class: None,
    });
    let aggregate = AggregateRef::new(AggregateKind::Transfer, uuid::Uuid::now_v7());
    for e in Envelope::sequence_after(
        aggregate,
        0,
        &EventContext::new_chain("t"),
        now,
        vec![copied],
    ) {
        catalog.observe(&e);
    }
    let Decision::Placed(p) = decide(&spec, &catalog, chrono::Utc::now()) else {
        panic!()
    };
    assert_eq!(
        p.site, "cheap",
        "the bytes are at cheap now: no data term there"
    );
}

#[test]
fn inputs_are_priced_by_where_they_travel() {
    let site = |name: &str, kind: &str, region: &str, datasets: &str| {
        format!(
            r#"
  - name: {name}
    kind: {kind}
    region: {region}
    jurisdiction: us
    prices:
      currency: USD
      effective_from: 2026-01-01T00:00:00Z
      source: test
      egress_per_gb: "0.09"
      egress_within: {{same_region: "0.01", other_region: "0.02"}}
      compute: [{{offer: c, per_instance_hour: "1.00"}}]
    shapes: [{{name: c, offer: c, cpus: 16, memory: 64GiB}}]
    datasets: [{datasets}]"#
        )
    };
    let corpus = r#"{uri: "gs://corpus/v2/", digest: "sha256:aa", size: 500GB}"#;
    let file = format!(
        "sites:{}{}{}{}",
        site("holder", "aws", "us-east-1", corpus),
        site("neighbour", "aws", "us-east-1", ""),
        site("far", "aws", "us-west-2", ""),
        site("elsewhere", "gcp", "us-east1", ""),
    );
    let catalog = offline_catalog(&parse(&file).unwrap());
    let spec = meridian_spec::parse(DATA_JOB).unwrap();
    let Decision::Placed(p) = decide(&spec, &catalog, chrono::Utc::now()) else {
        panic!()
    };
    assert_eq!(p.site, "holder", "the data is there");
    let data_in = |site: &str| {
        p.explanation
            .candidates
            .iter()
            .find(|c| c.site == site)
            .unwrap()
            .cost
            .as_ref()
            .unwrap()
            .data_in
            .normalize()
            .to_string()
    };
    assert_eq!(data_in("holder"), "0");
    assert_eq!(data_in("neighbour"), "5", "500 GB × 0.01 within the region");
    assert_eq!(
        data_in("far"),
        "10",
        "500 GB × 0.02 to another region of the provider"
    );
    assert_eq!(
        data_in("elsewhere"),
        "45",
        "500 GB × 0.09 over the internet"
    );
}

#[test]
fn data_the_mover_brought_in_from_a_url_is_known_where_it_landed() {
    use meridian_events::vocabulary::{Endpoint, Location, TransferEvent};
    use meridian_events::{AggregateKind, AggregateRef, Envelope, Event, EventContext};
    // No site declares the corpus: placement does not know its size or where it is.
    let file = TWO_SITES
        .replace("DATASETS_CHEAP", "")
        .replace("DATASETS_PRICEY", "");
    let mut catalog = offline_catalog(&parse(&file).unwrap());
    let spec = meridian_spec::parse(DATA_JOB).unwrap();
    let place =
        |catalog: &meridian_domain::Catalog| match decide(&spec, catalog, chrono::Utc::now()) {
            Decision::Placed(p) => p.site,
            other => panic!("{:?}", other.rejections()),
        };
    assert_eq!(place(&catalog), "cheap");

    // An earlier workflow's ingress brought it to pricey.
    let now = chrono::Utc::now();
    let workflow_id = uuid::Uuid::now_v7();
    let events = vec![
        Event::Transfer(TransferEvent::Requested {
            workflow_id,
            source: Endpoint::Uri {
                uri: "gs://corpus/v2/shards/".into(),
            },
            destination: Endpoint::SitePath {
                site: "pricey".into(),
                path: "data:/in/".into(),
            },
            bytes_expected: None,
        }),
        Event::Transfer(TransferEvent::Completed {
            workflow_id,
            bytes: 500_000_000_000,
            digest: "sha256:cc".into(),
            from: Location::Region {
                region: "internet".into(),
            },
            to: Location::Site {
                site: "pricey".into(),
            },
            started_at: now,
            ended_at: now,
            egress: None,
            cached: false,
            class: None,
        }),
    ];
    let aggregate = AggregateRef::new(AggregateKind::Transfer, uuid::Uuid::now_v7());
    for e in Envelope::sequence_after(aggregate, 0, &EventContext::new_chain("t"), now, events) {
        catalog.observe(&e);
    }
    assert_eq!(
        catalog.dataset_for("gs://corpus/v2/shards/"),
        Some(("sha256:cc", 500_000_000_000))
    );
    // Moving 500 GB out of pricey (60 USD) now outweighs the cheaper compute (20 USD).
    assert_eq!(place(&catalog), "pricey");
}
