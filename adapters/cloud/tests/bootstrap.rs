//! The bootstrap run for real by `sh`, as an instance would run it, for a job with an
//! image. No container engine runs here, so `container_runtime` is a recording stand-in
//! that runs the command after the image on the host; a small HTTP listener plays
//! Meridian's API and keeps every request. What this proves: the generated `docker run`
//! line is valid shell with its quoting intact; the runtime gets the vendor's flags, the
//! job's environment and its volume; the reports, the output and the exit code reach the
//! API with the run credential; and the power-off runs last.
//! (The host-command path runs against the real API in meridian's `e2e_aws`.)

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use meridian_adapter_cloud::bootstrap::{script, BootstrapSettings};
use meridian_adapter_core::{JobRequest, ReportTo};

/// One request the stand-in API received.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    authorization: String,
    body: String,
}

/// Answers every request with 200 and keeps it.
fn api() -> (String, Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let kept = Arc::new(Mutex::new(Vec::new()));
    let into = kept.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut parts = request_line.split_whitespace();
            let method = parts.next().unwrap_or_default().to_string();
            let path = parts.next().unwrap_or_default().to_string();
            let (mut length, mut authorization) = (0usize, String::new());
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                let header = header.trim_end();
                if header.is_empty() {
                    break;
                }
                let (name, value) = header.split_once(':').unwrap();
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap(),
                    "authorization" => authorization = value.trim().to_string(),
                    _ => {}
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            into.lock().unwrap().push(Received {
                method,
                path,
                authorization,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (url, kept)
}

/// A container runtime that writes its arguments, one per line, to `argv` beside it and
/// runs the command after the image on the host, with the `--env=NAME=VALUE` it was
/// given (`--env=NAME` passes the caller's, as Docker does).
fn recording_runtime(dir: &Path) -> String {
    let path = dir.join("runtime");
    std::fs::write(
        &path,
        r#"#!/bin/sh
here=$(dirname "$0")
: >"$here/argv"
for a in "$@"; do printf '%s\n' "$a" >>"$here/argv"; done
shift
while [ $# -gt 0 ]; do
  case "$1" in
    --env=*=*) export "${1#--env=}" ;;
    --*) ;;
    *) shift; break ;;
  esac
  shift
done
exec "$@"
"#,
    )
    .unwrap();
    let made = Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    assert!(made.success());
    path.display().to_string()
}

fn job() -> JobRequest {
    JobRequest {
        image: Some("docker://pytorch/pytorch:2.5".into()),
        env: BTreeMap::from([("GREETING".into(), "a b".into())]),
        mounts: BTreeMap::from([("data".into(), "/data".into())]),
        ..JobRequest::new(
            "train",
            &[
                "sh",
                "-c",
                "echo \"it's $GREETING in $MERIDIAN_VOLUME_DATA\"; echo oops >&2; exit 3",
            ],
        )
    }
}

#[test]
fn a_container_job_runs_reports_its_output_and_exit_code_and_powers_off() {
    let dir = tempfile::tempdir().unwrap();
    let (url, received) = api();
    let job = job();
    let work = dir.path().join("work");
    let powered_off = dir.path().join("powered-off");
    let settings = BootstrapSettings {
        work_dir: work.display().to_string(),
        power_off_command: format!("touch '{}'", powered_off.display()),
        container_runtime: recording_runtime(dir.path()),
        output_every_secs: 1,
    };
    let credential = format!("mer_run_{}_mac", job.job_id.simple());
    let to = ReportTo {
        server: format!("{url}/"),
        credential: credential.clone(),
    };
    let text = script(&job, Some("nvidia"), &to, &settings);
    let ran = Command::new("sh").arg("-c").arg(&text).output().unwrap();
    assert!(ran.status.success(), "{ran:?}\n{text}");
    assert!(powered_off.exists(), "the power-off command never ran");

    // The runtime was asked for the image with the vendor's flags, the job's
    // environment and its volume at its mount path.
    let argv = std::fs::read_to_string(dir.path().join("argv")).unwrap();
    let argv: Vec<&str> = argv.lines().collect();
    let volume = work.join("volumes").join("data");
    for expected in [
        "run",
        "--rm",
        "--gpus=all",
        "--env=GREETING",
        "--env=MERIDIAN_JOB_ID",
        &format!("--volume={}:/data", volume.display()),
        "--env=MERIDIAN_VOLUME_DATA=/data",
        "pytorch/pytorch:2.5",
    ] {
        assert!(argv.contains(&expected), "{expected} not in {argv:#?}");
    }
    assert!(volume.is_dir(), "the volume's directory was not made");

    let received = received.lock().unwrap().clone();
    assert!(
        received
            .iter()
            .all(|r| r.authorization == format!("Bearer {credential}")),
        "{received:#?}"
    );
    let report_path = format!("/v1/runs/{}/report", job.job_id);
    let reports: Vec<&str> = received
        .iter()
        .filter(|r| r.method == "POST" && r.path == report_path)
        .map(|r| r.body.as_str())
        .collect();
    assert_eq!(
        reports,
        [
            r#"{"event":"started"}"#,
            r#"{"event":"exited","exit_code":3}"#
        ],
        "{received:#?}"
    );
    let last_output = |stream: &str| {
        let path = format!("/v1/runs/{}/output/{stream}", job.job_id);
        received
            .iter()
            .rfind(|r| r.method == "PUT" && r.path == path)
            .map(|r| r.body.clone())
            .unwrap_or_else(|| panic!("no {stream} sent: {received:#?}"))
    };
    assert_eq!(last_output("stdout"), "it's a b in /data\n");
    assert_eq!(last_output("stderr"), "oops\n");
}
