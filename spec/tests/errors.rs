//! Broken documents and the exact messages they must produce. Messages are part of the user
//! interface, so they are pinned here word for word.

use meridian_spec::{from_value, parse, FieldError, SpecErrors};

/// Every error of a document that must fail, as `path: message` lines.
fn errors(doc: &str) -> Vec<String> {
    match parse(doc) {
        Ok(w) => panic!("expected errors, but the document parsed: {w:?}"),
        Err(e) => e.errors.iter().map(ToString::to_string).collect(),
    }
}

/// The single error of a document that must fail with exactly one.
fn error(doc: &str) -> String {
    let all = errors(doc);
    assert_eq!(all.len(), 1, "expected exactly one error, got {all:#?}");
    all.into_iter().next().unwrap_or_default()
}

/// A workflow with one job `x`; `fields` are extra YAML lines for the job, indented 4.
fn job(fields: &str) -> String {
    format!("version: v1\nname: t\njobs:\n  x:\n    image: host\n    command: [run]\n{fields}")
}

/// A workflow with one job `x` whose resources are `resources` (a YAML flow mapping).
fn resources(resources: &str) -> String {
    job(&format!("    resources: {resources}\n"))
}

const UNITS: &str = "B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB";

// --- The messages the design guide and the brief spell out -----------------------------------

#[test]
fn vendor_typo() {
    let doc = "version: v1\nname: t\njobs:\n  train:\n    image: host\n    command: [run]\n    resources:\n      gpus: {count: 8, vendor: nvidai}\n";
    assert_eq!(
        error(doc),
        r#"jobs.train.resources.gpus.vendor: expected one of nvidia, amd, any; got "nvidai""#
    );
}

#[test]
fn unknown_requires_lists_the_jobs() {
    let doc = r#"
version: v1
name: t
jobs:
  prep: {image: host, command: [a]}
  train: {requires: [prepp], image: host, command: [b]}
  eval: {requires: [train], image: host, command: [c]}
"#;
    assert_eq!(
        error(doc),
        r#"jobs.train.requires[0]: unknown job "prepp"; jobs are: eval, prep, train"#
    );
}

#[test]
fn unknown_requires_with_services_lists_both() {
    let doc = r#"
version: v1
name: t
jobs:
  train: {image: host, command: [b]}
services:
  serve: {requires: [trian], image: host, command: [s], port: 80}
"#;
    assert_eq!(
        error(doc),
        r#"services.serve.requires[0]: unknown job or service "trian"; jobs are: train; services are: serve"#
    );
}

#[test]
fn three_cycle_is_reported_once_in_order() {
    let doc = r#"
version: v1
name: t
jobs:
  c: {requires: [a], image: host, command: [c]}
  b: {requires: [c], image: host, command: [b]}
  a: {requires: [b], image: host, command: [a]}
"#;
    assert_eq!(error(doc), "jobs.a.requires: cycle a → b → c → a");
}

#[test]
fn a_job_requiring_itself_is_a_cycle() {
    let doc = "version: v1\nname: t\njobs:\n  a: {requires: [a], image: host, command: [a]}\n";
    assert_eq!(error(doc), "jobs.a.requires: cycle a → a");
}

#[test]
fn separate_cycles_are_each_reported_and_cycles_through_services_name_the_service() {
    let doc = r#"
version: v1
name: t
jobs:
  a: {requires: [b], image: host, command: [a]}
  b: {requires: [a], image: host, command: [b]}
  d: {requires: [zz], image: host, command: [d]}
services:
  zz: {requires: [d], image: host, command: [s], port: 80}
  m: {requires: [m], image: host, command: [s], port: 81}
"#;
    assert_eq!(
        errors(doc),
        [
            "jobs.a.requires: cycle a → b → a",
            "jobs.d.requires: cycle d → zz → d",
            "services.m.requires: cycle m → m",
        ]
    );
}

#[test]
fn bare_number_size_asks_for_a_unit() {
    assert_eq!(
        error(&resources("{memory: 16}")),
        format!("jobs.x.resources.memory: expected a size such as 16GiB or 500MB; got 16 (a unit is required; accepted units are {UNITS})")
    );
}

#[test]
fn bad_size_unit() {
    assert_eq!(
        error(&resources("{memory: 16Gb}")),
        format!("jobs.x.resources.memory: expected a size such as 16GiB or 500MB; got \"16Gb\" (unknown unit \"Gb\"; accepted units are {UNITS})")
    );
    assert_eq!(
        error(&resources("{memory: 0.5B}")),
        "jobs.x.resources.memory: expected a size such as 16GiB or 500MB; got \"0.5B\" (it is not a whole number of bytes)"
    );
    assert_eq!(
        error(&resources("{memory: 0GiB}")),
        "jobs.x.resources.memory: expected a size such as 16GiB or 500MB; got \"0GiB\" (it must be greater than zero)"
    );
    assert_eq!(
        error(&resources("{memory: 16 GiB}")),
        "jobs.x.resources.memory: expected a size such as 16GiB or 500MB; got \"16 GiB\" (write it without spaces, such as 16GiB)"
    );
}

#[test]
fn bad_duration() {
    assert_eq!(
        error(&resources("{walltime: 90}")),
        "jobs.x.resources.walltime: expected a duration such as 30m, 2h30m or 1d; got 90 (a unit is required; accepted units are d, h, m, s, as in 2h30m)"
    );
    assert_eq!(
        error(&resources("{walltime: 30m2h}")),
        "jobs.x.resources.walltime: expected a duration such as 30m, 2h30m or 1d; got \"30m2h\" (units must appear at most once each, in the order d, h, m, s, as in 1d12h)"
    );
    assert_eq!(
        error(&resources("{walltime: 2hours}")),
        "jobs.x.resources.walltime: expected a duration such as 30m, 2h30m or 1d; got \"2hours\" (unknown unit \"hours\"; accepted units are d, h, m, s, as in 2h30m)"
    );
    assert_eq!(
        error(&resources("{walltime: 1.5h}")),
        "jobs.x.resources.walltime: expected a duration such as 30m, 2h30m or 1d; got \"1.5h\" (durations take whole numbers; write 1h30m rather than 1.5h)"
    );
    assert_eq!(
        error(&resources("{walltime: 0s}")),
        "jobs.x.resources.walltime: expected a duration such as 30m, 2h30m or 1d; got \"0s\" (it must be longer than zero)"
    );
}

#[test]
fn unknown_field_lists_the_fields() {
    let doc = "version: v1\nname: t\njobs:\n  prep:\n    image: host\n    command: [a]\n    comand: [a]\n";
    assert_eq!(
        error(doc),
        "jobs.prep.comand: unknown field; expected one of requires, image, command, env, cwd, mounts, resources, array, slurm"
    );
}

#[test]
fn slurm_options_are_names_and_nothing_else() {
    let job = |slurm: &str| {
        format!("version: v1\nname: t\njobs:\n  x:\n    image: host\n    command: [a]\n    slurm: {slurm}\n")
    };
    assert!(meridian_spec::parse(&job("{partition: gpu-a100, qos: high}")).is_ok());
    assert_eq!(
        error(&job("{partition: \"gpu a100\"}")),
        "jobs.x.slurm.partition: expected a Slurm name: 1 to 63 letters, digits, \".\", \"-\" or \"_\"; got \"gpu a100\""
    );
    assert_eq!(
        error(&job("{queue: gpu}")),
        "jobs.x.slurm.queue: unknown field; expected one of partition, qos"
    );
}

#[test]
fn missing_image_says_what_it_should_be() {
    let doc = "version: v1\nname: t\njobs:\n  prep:\n    command: [a]\n";
    assert_eq!(
        error(doc),
        r#"jobs.prep.image: required; expected "host", an image reference such as docker://python:3.12, or an absolute path to a .sif file"#
    );
}

#[test]
fn several_errors_are_reported_together() {
    let doc = r#"
version: v2
name: "has spaces"
jobs:
  prep:
    image: python:3.12
    comand: [python, prep.py]
  train:
    requires: [prep, missing]
    image: host
    command: python train.py
    resources: {cpus: 0, memory: 16, gpus: {vendor: NVIDIA}}
services:
  prep: {image: host, command: [s], port: 0}
"#;
    let found = parse(doc).unwrap_err();
    let paths: Vec<&str> = found.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "version",
            "name",
            "jobs.prep.comand",
            "jobs.prep.image",
            "jobs.prep.command",
            "jobs.train.requires[1]",
            "jobs.train.command",
            "jobs.train.resources.cpus",
            "jobs.train.resources.memory",
            "jobs.train.resources.gpus.count",
            "jobs.train.resources.gpus.vendor",
            "services.prep.port",
            "services.prep",
        ],
        "{found}"
    );
    assert_eq!(found.len(), 13);
    let text = found.to_string();
    assert_eq!(text.lines().count(), 13);
    assert!(
        text.contains(r#"version: expected "v1"; got "v2""#),
        "{text}"
    );
    assert!(text.contains(r#"jobs.train.resources.gpus.vendor: expected one of nvidia, amd, any; got "NVIDIA" (names are lowercase)"#), "{text}");
    assert!(text.contains(r#"services.prep: "prep" is already the name of a job; jobs and services share one namespace"#), "{text}");
}

// --- Each remaining rule, one message each -----------------------------------------------------

#[test]
fn version_and_name() {
    let doc = "name: t\njobs:\n  x: {image: host, command: [a]}\n";
    assert_eq!(error(doc), r#"version: required; expected "v1""#);
    let doc = "version: 1\nname: t\njobs:\n  x: {image: host, command: [a]}\n";
    assert_eq!(error(doc), r#"version: expected "v1"; got 1"#);
    let doc = format!(
        "version: v1\nname: {}\njobs:\n  x: {{image: host, command: [a]}}\n",
        "n".repeat(64)
    );
    assert!(error(&doc)
        .starts_with(r#"name: expected 1 to 63 letters, digits, ".", "-" or "_"; got "nnnn"#));
    let doc = "version: v1\nname: run.v2_final-3\njobs:\n  x: {image: host, command: [a]}\n";
    assert!(parse(doc).is_ok());
}

#[test]
fn step_names() {
    let doc = "version: v1\nname: t\njobs:\n  my job: {image: host, command: [a]}\n";
    assert_eq!(
        error(doc),
        r#"jobs["my job"]: expected a name of 1 to 63 letters, digits, "-" or "_"; got "my job""#
    );
    let doc = "version: v1\nname: t\njobs:\n  a.b: {image: host, command: [a]}\n";
    assert_eq!(
        error(doc),
        r#"jobs["a.b"]: expected a name of 1 to 63 letters, digits, "-" or "_"; got "a.b""#
    );
}

#[test]
fn at_least_one_job_or_service() {
    assert_eq!(
        error("version: v1\nname: t\n"),
        "jobs: a workflow needs at least one job or service; found none"
    );
    assert_eq!(
        error("version: v1\nname: t\njobs: {}\nservices: {}\n"),
        "jobs: a workflow needs at least one job or service; found none"
    );
    let only_service =
        "version: v1\nname: t\nservices:\n  s: {image: host, command: [a], port: 8080}\n";
    assert!(parse(only_service).is_ok());
}

#[test]
fn images() {
    let cases = [
        (
            "docker://",
            r#"got "docker://" (nothing follows the scheme "docker://")"#,
        ),
        (
            "http://example.com/x",
            r#"got "http://example.com/x" (unsupported scheme "http://"; images use docker://, oras:// or library://)"#,
        ),
        (
            "images/torch.sif",
            r#"got "images/torch.sif" (a .sif image must be an absolute path, such as /images/pytorch.sif)"#,
        ),
        (
            "ubuntu",
            r#"got "ubuntu" (it has no scheme; did you mean "docker://ubuntu"?)"#,
        ),
        (
            "\"docker://a b\"",
            r#"got "docker://a b" (an image reference cannot contain spaces or control characters)"#,
        ),
    ];
    for (image, got) in cases {
        let doc =
            format!("version: v1\nname: t\njobs:\n  x:\n    image: {image}\n    command: [a]\n");
        assert_eq!(
            error(&doc),
            format!(
                r#"jobs.x.image: expected "host", an image reference such as docker://python:3.12, or an absolute path to a .sif file; {got}"#
            )
        );
    }
    for image in [
        "host",
        "docker://python:3.12",
        "oras://ghcr.io/org/img:1",
        "library://sylabs/default/alpine:3.19",
        "/images/pytorch.sif",
    ] {
        let doc =
            format!("version: v1\nname: t\njobs:\n  x:\n    image: {image}\n    command: [a]\n");
        let w = parse(&doc).unwrap();
        assert_eq!(w.jobs["x"].image.as_str(), image);
    }
}

#[test]
fn commands() {
    let doc = "version: v1\nname: t\njobs:\n  x:\n    image: host\n    command: hostname\n";
    assert_eq!(
        error(doc),
        r#"jobs.x.command: expected a list of strings such as [python, train.py]; got "hostname" (write it as a list: ["hostname"])"#
    );
    let doc = "version: v1\nname: t\njobs:\n  x:\n    image: host\n    command: []\n";
    assert_eq!(
        error(doc),
        "jobs.x.command: expected at least the program to run; got an empty list"
    );
    let doc =
        "version: v1\nname: t\njobs:\n  x:\n    image: host\n    command: [sleep, 10, {a: 1}]\n";
    assert_eq!(
        errors(doc),
        [
            r#"jobs.x.command[1]: expected a string; got 10 (quote it: "10")"#,
            "jobs.x.command[2]: expected a string; got a mapping",
        ]
    );
    let doc = "version: v1\nname: t\njobs:\n  x:\n    image: host\n    command: ['', a]\n";
    assert_eq!(
        error(doc),
        "jobs.x.command[0]: the program to run cannot be empty"
    );
}

#[test]
fn array_index_needs_an_array() {
    let doc = "version: v1\nname: t\njobs:\n  x:\n    image: host\n    command: [echo, '${ARRAY_INDEX}']\n";
    assert_eq!(
        error(doc),
        "jobs.x.command[1]: uses ${ARRAY_INDEX}, but the job has no array; add array: {start, end, parallelism} or remove it"
    );
    let doc = "version: v1\nname: t\nservices:\n  s:\n    image: host\n    command: [echo, 'x${ARRAY_INDEX}']\n    port: 80\n";
    assert_eq!(
        error(doc),
        "services.s.command[1]: uses ${ARRAY_INDEX}, but services have no task array"
    );
}

#[test]
fn env() {
    let doc = job("    env: {SEED: 1, RATE: 0.5, DEBUG: true, NAME: x, ANSWER: yes}\n");
    let w = parse(&doc).unwrap();
    let env = &w.jobs["x"].env;
    assert_eq!(env["SEED"], "1");
    assert_eq!(env["RATE"], "0.5");
    assert_eq!(env["DEBUG"], "true");
    assert_eq!(env["NAME"], "x");
    // YAML 1.2: `yes` is a string, not a boolean.
    assert_eq!(env["ANSWER"], "yes");

    let doc = job("    env: {1BAD: a, GOOD: [1, 2], MERIDIAN_ARRAY_INDEX: '3', NUL: ~}\n");
    assert_eq!(
        errors(&doc),
        [
            r#"jobs.x.env.1BAD: expected a variable name of letters, digits and "_", not starting with a digit; got "1BAD""#,
            "jobs.x.env.GOOD: expected a string, number or boolean; got a list",
            "jobs.x.env.MERIDIAN_ARRAY_INDEX: names starting with MERIDIAN_ are set by Meridian (such as MERIDIAN_ARRAY_INDEX) and cannot be set here",
            "jobs.x.env.NUL: expected a string, number or boolean; got null",
        ]
    );
}

#[test]
fn paths_and_mounts() {
    let doc = r#"
version: v1
name: t
volumes:
  data: {size: 1GiB}
  scratch: {size: 1GiB}
jobs:
  x:
    image: host
    command: [a]
    cwd: work
    mounts: {data: /data, scratch: /data, dta: /d, tmp: relative}
"#;
    assert_eq!(
        errors(doc),
        [
            r#"jobs.x.cwd: expected an absolute path such as /data; got "work""#,
            r#"jobs.x.mounts.scratch: "/data" is already the mount path of volume "data""#,
            r#"jobs.x.mounts.dta: unknown volume "dta"; volumes are: data, scratch"#,
            r#"jobs.x.mounts.tmp: unknown volume "tmp"; volumes are: data, scratch"#,
            r#"jobs.x.mounts.tmp: expected an absolute path such as /data; got "relative""#,
        ]
    );
    let doc = job("    mounts: {data: /data}\n");
    assert_eq!(
        error(&doc),
        r#"jobs.x.mounts.data: unknown volume "data"; no volumes are declared; add it under volumes"#
    );
}

#[test]
fn counts() {
    let at_least_one = "expected an integer of at least 1";
    let cases = [
        ("{nodes: 0}", "nodes", format!("{at_least_one}; got 0")),
        ("{nodes: -2}", "nodes", format!("{at_least_one}; got -2")),
        ("{cpus: 1.5}", "cpus", format!("{at_least_one}; got 1.5")),
        (
            "{cpus: '4'}",
            "cpus",
            format!("{at_least_one}; got \"4\" (write it without quotes)"),
        ),
        (
            "{cpus: four}",
            "cpus",
            format!("{at_least_one}; got \"four\""),
        ),
        (
            "{cpus: 5000000000}",
            "cpus",
            format!("{at_least_one}; got 5000000000 (the largest accepted is 4294967295)"),
        ),
        (
            "{gpus: {count: 0}}",
            "gpus.count",
            format!("{at_least_one}; got 0"),
        ),
        (
            "{gpus: {vendor: amd}}",
            "gpus.count",
            "required; expected an integer of at least 1".to_string(),
        ),
    ];
    for (res, path, message) in cases {
        assert_eq!(
            error(&resources(res)),
            format!("jobs.x.resources.{path}: {message}")
        );
    }
    // A whole number written with a fraction of zero is still a whole number.
    let w = parse(&resources("{cpus: 4.0}")).unwrap();
    assert_eq!(w.jobs["x"].resources.cpus, 4);
}

#[test]
fn arrays() {
    let a = |array: &str| job(&format!("    array: {array}\n"));
    assert_eq!(
        error(&a("{start: 10, end: 1, parallelism: 2}")),
        "jobs.x.array.end: expected an integer of at least start (10); got 1"
    );
    assert_eq!(
        error(&a("{start: 0, end: 1000000, parallelism: 2}")),
        "jobs.x.array: an array has at most 1000000 tasks; 0 to 1000000 is 1000001"
    );
    assert_eq!(
        error(&a("{start: 1, end: 5, parallelism: 0}")),
        "jobs.x.array.parallelism: expected an integer of at least 1; got 0"
    );
    assert_eq!(
        error(&a("{start: 1, end: 5}")),
        "jobs.x.array.parallelism: required; expected an integer of at least 1"
    );
    assert_eq!(
        error(&a("{start: -1, end: 5, parallelism: 1}")),
        "jobs.x.array.start: expected a whole number (0 or more); got -1"
    );
    let w = parse(&a("{start: 0, end: 999999, parallelism: 100}")).unwrap();
    assert_eq!(w.task_count("x"), 1_000_000);
}

#[test]
fn services() {
    let s = |fields: &str| {
        format!(
            "version: v1\nname: t\nservices:\n  s:\n    image: host\n    command: [a]\n{fields}"
        )
    };
    assert_eq!(
        error(&s("")),
        "services.s.port: required; expected an integer from 1 to 65535"
    );
    assert_eq!(
        error(&s("    port: 0\n")),
        "services.s.port: expected an integer from 1 to 65535; got 0"
    );
    assert_eq!(
        error(&s("    port: 70000\n")),
        "services.s.port: expected an integer from 1 to 65535; got 70000 (the largest accepted is 65535)"
    );
    assert_eq!(
        error(&s("    port: 80\n    replicas: {min: 3, max: 2}\n")),
        "services.s.replicas.max: expected an integer of at least min (3); got 2"
    );
    assert_eq!(
        error(&s("    port: 80\n    replicas: {min: 0, max: 2}\n")),
        "services.s.replicas.min: expected an integer of at least 1; got 0"
    );
    assert_eq!(
        error(&s("    port: 80\n    array: {start: 1, end: 2, parallelism: 1}\n")),
        "services.s.array: unknown field; expected one of requires, image, command, env, cwd, mounts, port, replicas, resources"
    );
}

#[test]
fn placement() {
    let p = |placement: &str| {
        format!("version: v1\nname: t\nplacement: {placement}\njobs:\n  x: {{image: host, command: [a]}}\n")
    };
    assert_eq!(
        error(&p("{prefer: cheap}")),
        r#"placement.prefer: expected one of cheapest, fastest; got "cheap""#
    );
    assert_eq!(
        error(&p("{spot: yes}")),
        r#"placement.spot: expected true or false; got "yes""#
    );
    assert_eq!(
        error(&p("{split: 2}")),
        r#"placement.split: expected true or false; got 2"#
    );
    assert_eq!(
        error(&p("{sites: lumi}")),
        r#"placement.sites: expected a list of site names; got "lumi""#
    );
    assert_eq!(
        error(&p("{regions: [eu-west-1, eu-west-1]}")),
        r#"placement.regions[1]: "eu-west-1" is already listed at placement.regions[0]"#
    );
    assert_eq!(
        error(&p("{residency: ''}")),
        r#"placement.residency: expected a non-empty string; got """#
    );
    assert_eq!(
        error(&p("{budget: 500}")),
        "placement.budget: expected an amount and a currency such as \"500 USD\"; got 500 (a currency code is required, such as USD)"
    );
    assert_eq!(
        error(&p("{budget: 500 usd}")),
        "placement.budget: expected an amount and a currency such as \"500 USD\"; got \"500 usd\" (\"usd\" is not a currency code; use three capital letters such as USD, EUR or GBP)"
    );
    assert_eq!(
        error(&p("{budget: 0 USD}")),
        "placement.budget: expected an amount and a currency such as \"500 USD\"; got \"0 USD\" (the amount must be greater than zero)"
    );
    assert_eq!(
        error(&p("{budget: -5 USD}")),
        "placement.budget: expected an amount and a currency such as \"500 USD\"; got \"-5 USD\" (\"-5\" is not an amount; write digits with an optional fraction, such as 500 or 99.50)"
    );
    assert_eq!(
        error(&p("[cheapest]")),
        "placement: expected a mapping with the fields prefer, sites, regions, residency, budget, spot, split; got a list"
    );
}

#[test]
fn volumes() {
    let v = |volume: &str| {
        format!("version: v1\nname: t\nvolumes:\n  data: {volume}\njobs:\n  x: {{image: host, command: [a]}}\n")
    };
    assert_eq!(
        error(&v("{ingress: []}")),
        "volumes.data.size: required; expected a size such as 16GiB or 500MB"
    );
    let uri = "a URI starting with s3://, gs://, az://, hf://, https://, http:// or file://";
    assert_eq!(
        errors(&v(
            "{size: 1GiB, ingress: [{source: ftp://x/y, destination: in}], egress: [{source: s3://a/b, destination: s3://}]}"
        )),
        [
            format!(r#"volumes.data.ingress[0].source: expected {uri}; got "ftp://x/y""#),
            r#"volumes.data.ingress[0].destination: expected an absolute path such as /data; got "in""#.to_string(),
            r#"volumes.data.egress[0].source: expected an absolute path such as /data; got "s3://a/b""#.to_string(),
            format!(r#"volumes.data.egress[0].destination: expected {uri}; got "s3://" (nothing follows s3://)"#),
        ]
    );
    assert_eq!(
        error(&v("{size: 1GiB, ingress: [{source: s3://a/b}]}")),
        "volumes.data.ingress[0].destination: required; expected an absolute path such as /data"
    );
    assert_eq!(
        error(&v(
            "{size: 1GiB, ingress: [{source: s3://a/b, destination: /in/, credentials: 'lab s3'}]}"
        )),
        r#"volumes.data.ingress[0].credentials: expected a secret's name: 1 to 63 letters, digits, ".", "-" or "_"; got "lab s3""#
    );
}

#[test]
fn requires_shapes() {
    let doc = r#"
version: v1
name: t
jobs:
  a: {image: host, command: [a]}
  b: {requires: a, image: host, command: [b]}
  c: {requires: [a, a, 3], image: host, command: [c]}
"#;
    assert_eq!(
        errors(doc),
        [
            r#"jobs.b.requires: expected a list of job or service names such as [prep]; got "a" (write it as a list: [a])"#,
            r#"jobs.c.requires[2]: expected a string; got 3 (quote it: "3")"#,
        ]
    );
    let doc = "version: v1\nname: t\njobs:\n  a: {image: host, command: [a]}\n  c: {requires: [a, a], image: host, command: [c]}\n";
    assert_eq!(
        error(doc),
        r#"jobs.c.requires[1]: "a" is already listed at jobs.c.requires[0]"#
    );
}

#[test]
fn labels() {
    let doc = "version: v1\nname: t\nlabels: {team.name/x: a, run: 17, 'bad key': b}\njobs:\n  x: {image: host, command: [a]}\n";
    assert_eq!(
        error(doc),
        r#"labels["bad key"]: expected a label name of 1 to 63 letters, digits, ".", "/", "-" or "_"; got "bad key""#
    );
}

#[test]
fn null_means_absent_only_for_optional_fields() {
    let doc = job("    cwd: ~\n    array: null\n    resources: {gpus: ~}\n");
    let w = parse(&doc).unwrap();
    assert_eq!(w.jobs["x"].cwd, None);
    assert_eq!(w.jobs["x"].array, None);
    let doc = job("    env: ~\n");
    assert_eq!(
        error(&doc),
        "jobs.x.env: expected a mapping of variable names to values; got null"
    );
}

#[test]
fn top_level_shapes() {
    assert_eq!(
        error("- a\n- b\n"),
        "expected a mapping at the top level; got a list"
    );
    assert_eq!(
        error("just words"),
        r#"expected a mapping at the top level; got "just words""#
    );
    assert_eq!(error("42"), "expected a mapping at the top level; got 42");
    let e = errors("version: v1\nname: t\njob:\n  x: {image: host, command: [a]}\n");
    assert_eq!(
        e,
        [
            "job: unknown field; expected one of version, name, labels, placement, volumes, jobs, services",
            "jobs: a workflow needs at least one job or service; found none",
        ]
    );
}

// --- The error types themselves -----------------------------------------------------------

#[test]
fn display_and_serialize() {
    let errors = SpecErrors::from(vec![
        FieldError::document("document is empty"),
        FieldError::new("jobs.x.image", "required"),
    ]);
    assert_eq!(
        errors.to_string(),
        "document is empty\njobs.x.image: required"
    );
    assert_eq!(
        serde_json::to_value(&errors).unwrap(),
        serde_json::json!({"errors": [
            {"path": "", "message": "document is empty"},
            {"path": "jobs.x.image", "message": "required"},
        ]})
    );
    let boxed: Box<dyn std::error::Error> = Box::new(errors);
    assert!(boxed.to_string().contains("required"));
}

#[test]
fn from_value_applies_the_same_rules() {
    let value = serde_json::json!({
        "version": "v1",
        "name": "t",
        "jobs": {"train": {"image": "host", "command": ["a"], "resources": {"gpus": {"count": 1, "vendor": "nvidai"}}}}
    });
    let e = from_value(&value).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"jobs.train.resources.gpus.vendor: expected one of nvidia, amd, any; got "nvidai""#
    );
    assert_eq!(
        from_value(&serde_json::json!([1])).unwrap_err().to_string(),
        "expected a mapping at the top level; got a list"
    );
}
