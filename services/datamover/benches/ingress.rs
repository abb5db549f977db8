//! Throughput and memory of an S3 ingress, against boto3 on the same server in the same
//! run: `cargo bench -p meridian-datamover --bench ingress` (needs moto_server, as the
//! tests do; `MERIDIAN_BENCH_MIB` sets the object's size, 1024 by default).
//!
//! It uploads one object of that size to a local moto server, then times the data
//! mover's copy of it into a directory (`fetch::copy`, what an ingress step runs) and
//! boto3's `download_file` of the same object, and reads the peak resident memory of
//! the copy (reset before it through `/proc/self/clear_refs`).

use std::io::Write;
use std::time::Instant;

use meridian_datamover::fetch::{copy, Progress, Reach};
use meridian_datamover::testkit::Moto;
use object_store::ObjectStore;

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn reset_peak_rss() {
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/clear_refs")
        .and_then(|mut f| f.write_all(b"5"));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mib: usize = std::env::var("MERIDIAN_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let moto = Moto::start();
    for (key, value) in moto.env() {
        std::env::set_var(key, value);
    }
    moto.bucket("bench");
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name("bench")
        .with_endpoint(moto.url())
        .with_allow_http(true)
        .build()
        .unwrap();
    // The object, uploaded in parts from one reused buffer.
    let upload = store
        .put_multipart(&object_store::path::Path::from("big.bin"))
        .await
        .unwrap();
    let mut writer = object_store::WriteMultipart::new(upload);
    let chunk: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
    for _ in 0..mib / 8 {
        writer.wait_for_capacity(2).await.unwrap();
        writer.write(&chunk);
    }
    writer.finish().await.unwrap();
    let bytes = (mib / 8 * 8) as f64 * 1024.0 * 1024.0;

    let dir = tempfile::tempdir().unwrap();
    let http = Reach::default();
    reset_peak_rss();
    let before = peak_rss_kib();
    let started = Instant::now();
    let copied = copy(
        &http,
        "s3://bench/big.bin",
        dir.path(),
        "/big.bin",
        &Progress::default(),
    )
    .await
    .unwrap();
    let ours = started.elapsed().as_secs_f64();
    let peak = peak_rss_kib();
    assert_eq!(copied.bytes as f64, bytes);
    std::fs::remove_file(dir.path().join("big.bin")).unwrap();

    // boto3 twice: one streamed GET, as the data mover does, and its transfer manager
    // (`download_file`: ranged GETs on ten threads).
    let boto3 = |how: &str| -> f64 {
        let target = dir.path().join("boto3.bin");
        let copy = match how {
            "get" => format!(
                "b = s3.get_object(Bucket='bench', Key='big.bin')['Body']\nf = open('{}', 'wb')\nfor c in b.iter_chunks(1 << 20): f.write(c)\nf.close()",
                target.display()
            ),
            _ => format!("s3.download_file('bench', 'big.bin', '{}')", target.display()),
        };
        let script = format!(
            "import boto3, time\ns3 = boto3.client('s3')\nt = time.time()\n{copy}\nprint(time.time() - t)"
        );
        let out = std::process::Command::new("python3")
            .args(["-c", &script])
            .output()
            .expect("python3 with boto3");
        assert!(
            out.status.success(),
            "boto3: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::remove_file(&target);
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let get = boto3("get");
    let manager = boto3("download_file");
    let mb = bytes / 1e6;
    println!("ingress of {mib} MiB from moto's S3 server:");
    for (what, secs) in [
        ("data mover (fetch::copy)", ours),
        ("boto3 get_object, streamed", get),
        ("boto3 download_file", manager),
    ] {
        println!("  {what:<28} {secs:7.2} s  {:7.1} MB/s", mb / secs);
    }
    println!(
        "  ratio, data mover / boto3 streamed GET: {:.2}",
        get / ours
    );
    println!(
        "  peak resident memory during the copy: {} MiB (process, after reset; {} MiB before)",
        peak / 1024,
        before / 1024
    );
}
