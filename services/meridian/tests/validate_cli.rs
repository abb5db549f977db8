//! `meridian validate` as a user runs it: real files, real exit codes, real output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn meridian(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run meridian")
}

fn examples(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(repo().join(dir))
        .expect("examples dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| p.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    files.sort();
    files
}

#[test]
fn every_example_is_valid_and_exits_zero() {
    let files = examples("examples");
    assert!(files.len() >= 6, "at least six examples: {files:?}");
    let args: Vec<&str> = std::iter::once("validate")
        .chain(files.iter().map(String::as_str))
        .collect();
    let out = meridian(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in &files {
        assert!(
            stdout.contains(&format!("{f}: ok")),
            "{f} reported ok: {stdout}"
        );
    }
}

#[test]
fn a_broken_document_prints_every_error_with_its_path_and_exits_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.yaml");
    std::fs::write(
        &file,
        "version: v1\nname: broken\njobs:\n  train:\n    image: host\n    command: [true]\n    \
         requires: [prepp]\n    resources:\n      gpus: {count: 8, vendor: nvidai}\n",
    )
    .unwrap();
    let path = file.display().to_string();
    let out = meridian(&["validate", &path]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "{path}: jobs.train.resources.gpus.vendor: expected one of nvidia, amd, any; got \"nvidai\""
        )),
        "{stdout}"
    );
    assert!(stdout.contains("jobs.train.requires[0]"), "{stdout}");

    let out = meridian(&["validate", "--output", "json", &path]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(report[0]["file"], path.as_str());
    assert_eq!(report[0]["valid"], false);
    let paths: Vec<&str> = report[0]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"jobs.train.resources.gpus.vendor"),
        "{paths:?}"
    );
    assert!(paths.contains(&"jobs.train.requires[0]"), "{paths:?}");
}

#[test]
fn the_invalid_examples_all_fail() {
    let files = examples("examples/invalid");
    assert!(!files.is_empty());
    for f in files {
        let out = meridian(&["validate", &f]);
        assert_eq!(out.status.code(), Some(1), "{f} must be rejected");
        assert!(!out.stdout.is_empty(), "{f} says why");
    }
}

#[test]
fn an_unreadable_file_exits_two_and_says_so() {
    let out = meridian(&["validate", "no/such/file.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot read no/such/file.yaml"), "{stderr}");
}

#[test]
fn stdin_is_read_with_a_dash() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["validate", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"version\": \"v1\", \"name\": \"x\", \"jobs\": {\"a\": {\"image\": \"host\", \"command\": [\"true\"]}}}")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("<stdin>: ok"));
}

#[test]
fn the_checked_in_schema_is_what_the_binary_prints() {
    let out = meridian(&["schema", "workflow"]);
    assert!(out.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checked_in: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("schemas/workflow.schema.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        printed, checked_in,
        "regenerate with `meridian schema workflow`"
    );
}

#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    // The reader (`true`) is gone before the command starts writing, so every write
    // meets a closed pipe, as after `| head -1`: that must not become a panic.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "(sleep 0.3; '{}' quote examples/train-h100.yaml) | true",
            env!("CARGO_BIN_EXE_meridian")
        ))
        .current_dir(repo())
        .output()
        .expect("run sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
