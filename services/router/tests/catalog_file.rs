//! The catalogue file: the built-in reference parses, quotes make sense against it, and
//! bad files get errors that name the field.

use meridian_router::catalog_file::{offline_catalog, parse, REFERENCE};
use meridian_router::placement::{decide, Decision};

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
    let example = meridian_spec::parse(include_str!("../../../examples/mi300x.yaml")).unwrap();
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
    let h100 = meridian_spec::parse(include_str!("../../../examples/train-h100.yaml")).unwrap();
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
