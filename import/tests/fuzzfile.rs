//! Fuzzfiles that cannot be imported name the field; defaults merge under each job.

use meridian_import::{import, Format};

fn errors(text: &str) -> Vec<String> {
    match import(Format::Fuzzfile, text, "flow.yaml") {
        Ok(i) => panic!("imported: {:#?}", i.workflow),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn what_has_no_equivalent_is_refused_naming_its_field() {
    let got = errors(
        r#"
version: v1
files:
  config: "x = 1"
jobs:
  a.b:
    image: {uri: docker://alpine}
    command: [true]
  a-b:
    image: {uri: "alpine"}
    command: [true]
    env: ["TOKEN=secret://user/tok"]
    resource:
      devices: {example.com/fpga: 1}
      memory: {size: 4 gigs}
    task-array: {start: 5, end: 1}
    policy: {timeout: {execute: 90}}
"#,
    );
    for expected in [
        "files: inline files have no equivalent",
        "jobs.a-b: \"a-b\" and \"a.b\" are both \"a-b\"",
        "jobs.a-b.image.uri: it has no scheme",
        "jobs.a-b.env[0]: TOKEN takes its value from secret://user/tok",
        "jobs.a-b.resource.devices.example.com/fpga: only GPUs are carried over",
        "jobs.a-b.resource.memory.size: expected a size such as 4GiB",
        "jobs.a-b.task-array: end 1 is before start 5",
        "jobs.a-b.policy.timeout.execute: expected a duration",
    ] {
        assert!(
            got.iter().any(|e| e.starts_with(expected)),
            "{expected}\n{got:#?}"
        );
    }
    let got =
        errors("version: v4\njobs:\n  a:\n    image: {uri: docker://alpine}\n    command: [x]\n");
    assert!(
        got[0].starts_with("version: Fuzzfile version \"v4\" is not supported"),
        "{got:?}"
    );
}

#[test]
fn defaults_merge_under_each_job_and_the_job_wins() {
    let imported = import(
        Format::Fuzzfile,
        r#"
version: v1
defaults:
  job:
    env: [A=default, B=default]
    resource:
      cpu: {cores: 4}
      memory: {size: 8GiB}
    policy: {timeout: {execute: 2h}}
jobs:
  one:
    image: {uri: docker://alpine}
    command: [env]
    env: [B=own]
    resource:
      memory: {size: 1GiB, by-core: true}
"#,
        "flow.yaml",
    )
    .unwrap();
    let job = &imported.workflow.jobs["one"];
    assert_eq!(job.env["A"], "default");
    assert_eq!(job.env["B"], "own");
    assert_eq!(job.resources.cpus, 4);
    assert_eq!(
        job.resources.memory.bytes(),
        4 << 30,
        "1GiB by core × 4 cores"
    );
    assert_eq!(job.resources.walltime.secs(), 7_200);
}
