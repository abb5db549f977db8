//! The files in `examples/`: every valid one parses and survives a round trip, every file in
//! `examples/invalid/` fails, and the error listing in `docs/workflow-spec.md` is what those
//! files really produce.

use std::fs;
use std::path::{Path, PathBuf};

use meridian_spec::{parse, GpuVendor, Image, Preference, Workflow};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The files (not directories) directly in `dir`, sorted by name.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    out.sort();
    out
}

fn example(name: &str) -> Workflow {
    let path = root().join("examples").join(name);
    let text = fs::read_to_string(&path).unwrap();
    parse(&text).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()))
}

#[test]
fn every_example_parses_and_round_trips() {
    let examples = files(&root().join("examples"));
    assert!(examples.len() >= 6, "only {} examples", examples.len());
    for path in &examples {
        let text = fs::read_to_string(path).unwrap();
        let workflow = parse(&text).unwrap_or_else(|e| panic!("{}:\n{e}", path.display()));

        // Typed → JSON → parse gives the same workflow...
        let json = serde_json::to_string_pretty(&workflow).unwrap();
        let again =
            parse(&json).unwrap_or_else(|e| panic!("{}: JSON:\n{e}\n{json}", path.display()));
        assert_eq!(again, workflow, "{}", path.display());
        // ...and so does serde's derived Deserialize, which trusts its input.
        let derived: Workflow = serde_json::from_str(&json).unwrap();
        assert_eq!(derived, workflow, "{}", path.display());
        // Typed → YAML → parse, too.
        let yaml = serde_saphyr::to_string(&workflow).unwrap();
        let again =
            parse(&yaml).unwrap_or_else(|e| panic!("{}: YAML:\n{e}\n{yaml}", path.display()));
        assert_eq!(again, workflow, "{}", path.display());

        // Every YAML example explains itself in a comment header.
        if path.extension().is_some_and(|e| e == "yaml") {
            assert!(
                text.starts_with('#'),
                "{} has no comment header",
                path.display()
            );
        }
    }
}

#[test]
fn examples_hold_what_they_say() {
    let hello = example("hello.yaml");
    assert_eq!(hello.jobs["hello"].image, Image::Host);
    assert_eq!(hello.jobs["hello"].resources.nodes, 1);
    assert_eq!(hello.jobs["hello"].resources.cpus, 1);
    assert_eq!(hello.jobs["hello"].resources.memory.to_string(), "512MiB");

    let json = example("hello.json");
    assert_eq!(json.job_order(), ["hello"]);

    let train = example("train-h100.yaml");
    assert_eq!(train.job_order(), ["prep", "train", "evaluate"]);
    let gpus = train.jobs["train"].resources.gpus.clone().unwrap();
    assert_eq!((gpus.count, gpus.vendor), (8, GpuVendor::Nvidia));
    assert_eq!(gpus.model.as_deref(), Some("H100"));
    assert_eq!(gpus.memory.unwrap().bytes(), 80 << 30);
    assert_eq!(train.placement.prefer, Preference::Fastest);
    assert_eq!(
        train.placement.budget.as_ref().unwrap().to_string(),
        "2500 USD"
    );

    let sweep = example("sweep.yaml");
    let array = sweep.jobs["sweep"].array.unwrap();
    assert_eq!((array.start, array.end, array.parallelism), (1, 1000, 50));
    assert_eq!(sweep.task_count("sweep"), 1000);
    assert_eq!(sweep.task_count("collect"), 1);
    assert_eq!(sweep.total_tasks(), 1001);
    assert!(sweep.jobs["sweep"]
        .command
        .iter()
        .any(|a| a.contains("${ARRAY_INDEX}")));
    assert!(sweep.placement.spot);

    let serve = example("finetune-serve.yaml");
    assert_eq!(serve.job_order(), ["finetune", "serve"]);
    let service = &serve.services["serve"];
    assert_eq!((service.replicas.min, service.replicas.max), (1, 4));
    assert_eq!(service.port, 8000);
    assert_eq!(serve.placement.residency.as_deref(), Some("eu"));
    assert_eq!(serve.jobs["finetune"].env["EPOCHS"], "3");

    let amd = example("mi300x.yaml");
    let gpus = amd.jobs["pretrain"].resources.gpus.clone().unwrap();
    assert_eq!(gpus.vendor, GpuVendor::Amd);
    assert_eq!(gpus.model.as_deref(), Some("MI300X"));
    assert_eq!(amd.jobs["pretrain"].resources.nodes, 2);
    assert_eq!(amd.jobs["pretrain"].resources.memory.to_string(), "1536GiB");

    let data = example("s3-data.yaml");
    assert_eq!(data.volumes["reads"].ingress.len(), 2);
    assert!(data.volumes["reads"].ingress[0].source.starts_with("s3://"));
    assert!(data.volumes["results"].egress[0]
        .destination
        .starts_with("s3://"));
    assert_eq!(data.volumes["reads"].size.bytes(), 1_500_000_000_000);
    assert_eq!(data.job_order(), ["align", "index"]);
}

#[test]
fn invalid_examples_fail_and_say_why() {
    let invalid = files(&root().join("examples/invalid"));
    assert!(
        (3..=5).contains(&invalid.len()),
        "{} invalid examples",
        invalid.len()
    );
    for path in &invalid {
        let text = fs::read_to_string(path).unwrap();
        assert!(
            text.starts_with('#'),
            "{} has no comment saying what is wrong",
            path.display()
        );
        assert!(parse(&text).is_err(), "{} parsed", path.display());
    }
}

/// Small broken documents, one per rule, whose errors the docs list under the examples'.
const SAMPLES: &[&str] = &[
    "version: v1\nname: t\njobs:\n  prep: {image: host, command: [a], comand: [a]}\n",
    "version: v1\nname: t\njobs:\n  x: {image: host, command: [a], resources: {walltime: 30m2h}}\n",
    "version: v1\nname: t\njobs:\n  x: {image: host, command: [a], resources: {cpus: '4'}}\n",
    "version: v1\nname: t\njobs:\n  x: {image: host, command: [echo, '${ARRAY_INDEX}']}\n",
    "version: v1\nname: t\njobs:\n  x: {image: host, command: [a], array: {start: 0, end: 1000000, parallelism: 8}}\n",
    "version: v1\nname: t\njobs:\n  x: {image: host, command: [a], mounts: {data: /data}}\n",
    "version: v1\nname: t\nplacement: {spot: yes}\njobs:\n  x: {image: host, command: [a]}\n",
    "version: v1\nname: t\njobs:\n  prep: {image: host, command: [a]}\nservices:\n  prep: {image: host, command: [a], port: 80}\n",
    "version: v1\nname: t\nservices:\n  s: {image: host, command: [a], port: 70000}\n",
    "- version: v1\n",
    "version: v1\nname: [unclosed\n",
    "{\"version\": \"v1\", \"name\": \"a\", \"name\": \"b\"}",
];

/// A generated section of the docs: a marker line, the content, and an end marker.
struct Section {
    name: &'static str,
    content: String,
}

/// `FILE: path: message` for every error of every invalid example, as a fenced block.
fn invalid_listing() -> String {
    let mut out = String::from("```text\n");
    for path in files(&root().join("examples/invalid")) {
        let text = fs::read_to_string(&path).unwrap();
        let name = path.strip_prefix(root()).unwrap().display().to_string();
        for error in parse(&text).unwrap_err() {
            out.push_str(&format!("{name}: {error}\n"));
        }
    }
    out.push_str("```\n");
    out
}

/// The errors of [`SAMPLES`] and of two documents too big to inline, as a fenced block.
fn sample_listing() -> String {
    let deep = "[".repeat(100_000);
    let big = format!(
        "version: v1\n#{}",
        "x".repeat(meridian_spec::MAX_DOCUMENT_BYTES)
    );
    let mut out = String::from("```text\n");
    for doc in SAMPLES.iter().copied().chain([deep.as_str(), big.as_str()]) {
        for error in parse(doc).unwrap_err() {
            out.push_str(&format!("{error}\n"));
        }
    }
    out.push_str("```\n");
    out
}

const END: &str = "<!-- END GENERATED -->";

fn begin(name: &str) -> String {
    format!("<!-- BEGIN GENERATED: {name} (cargo test -p meridian-spec --test examples) -->\n")
}

#[test]
fn docs_show_the_errors_that_are_really_produced() {
    let path = root().join("docs/workflow-spec.md");
    let mut doc = fs::read_to_string(&path).unwrap();
    let sections = [
        Section {
            name: "invalid examples",
            content: invalid_listing(),
        },
        Section {
            name: "more errors",
            content: sample_listing(),
        },
    ];
    let mut stale = Vec::new();
    for section in &sections {
        let marker = begin(section.name);
        let Some(start) = doc.find(&marker).map(|i| i + marker.len()) else {
            panic!("{} lacks the marker {marker}", path.display());
        };
        let Some(end) = doc[start..].find(END).map(|i| i + start) else {
            panic!("{} lacks {END} after {marker}", path.display());
        };
        if doc[start..end] != section.content {
            stale.push(format!("{}:\n{}", section.name, section.content));
            doc.replace_range(start..end, &section.content);
        }
    }
    if stale.is_empty() {
        return;
    }
    if std::env::var("MERIDIAN_UPDATE_DOCS").as_deref() == Ok("1") {
        fs::write(&path, doc).unwrap();
    } else {
        panic!(
            "docs/workflow-spec.md shows stale errors; regenerate with\n  \
             MERIDIAN_UPDATE_DOCS=1 cargo test -p meridian-spec --test examples\n\
             expected:\n{}",
            stale.join("\n")
        );
    }
}
