//! `s3://` ingress against a real S3 server (moto's, started here on a free port;
//! `scripts/test` installs it with `pip install 'moto[server]'`): one object and a whole
//! prefix land in the volume through the `object_store` crate, with the credentials and
//! endpoint of the standard `AWS_*` environment; a missing object fails with its name.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use meridian_datamover::fetch::{copy, FetchError};
use object_store::ObjectStore;
use sha2::{Digest, Sha256};

/// A moto server for this test binary, stopped when dropped.
struct Moto {
    child: Child,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto_binary() -> String {
    if let Ok(path) = std::env::var("MERIDIAN_MOTO_SERVER") {
        return path;
    }
    let on_path = Command::new("sh")
        .args(["-c", "command -v moto_server"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    on_path.unwrap_or_else(|| {
        panic!(
            "these tests need moto's S3 server (moto_server): install it with \
             `python3 -m pip install 'moto[server]'` (scripts/test does), or set MERIDIAN_MOTO_SERVER"
        )
    })
}

async fn moto() -> Moto {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(moto_binary())
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start moto_server");
    let url = format!("http://127.0.0.1:{port}");
    let moto = Moto { child, url };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while reqwest::get(&moto.url).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "moto_server did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    moto
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_and_prefixes_come_in_from_s3_and_a_missing_one_is_named() {
    let moto = moto().await;
    // The standard environment, as a site's operator would set it.
    std::env::set_var("AWS_ENDPOINT_URL", &moto.url);
    std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
    std::env::set_var("AWS_REGION", "us-east-1");
    let http = reqwest::Client::new();
    let made = http
        .put(format!("{}/datasets", moto.url))
        .send()
        .await
        .unwrap();
    assert!(made.status().is_success(), "{made:?}");
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name("datasets")
        .with_endpoint(&moto.url)
        .with_allow_http(true)
        .build()
        .unwrap();
    // A file large enough to arrive in several chunks.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    for (key, body) in [
        ("cells/a.csv", b"a,b\n1,2\n".to_vec()),
        ("cells/deep/b.csv", b"c\n3\n".to_vec()),
        ("weights.bin", big.clone()),
    ] {
        store
            .put(&object_store::path::Path::from(key), body.into())
            .await
            .unwrap();
    }
    let volume = tempfile::tempdir().unwrap();

    let one = copy(&http, "s3://datasets/weights.bin", volume.path(), "/model/")
        .await
        .expect("one object");
    assert_eq!(one.bytes, big.len() as u64);
    assert_eq!(one.digest, sha256(&big));
    assert_eq!(read(volume.path(), "model/weights.bin"), big);

    let tree = copy(&http, "s3://datasets/cells/", volume.path(), "/in/")
        .await
        .expect("a prefix");
    assert_eq!(read(volume.path(), "in/a.csv"), b"a,b\n1,2\n");
    assert_eq!(read(volume.path(), "in/deep/b.csv"), b"c\n3\n");
    let manifest = format!(
        "{}  a.csv\n{}  deep/b.csv\n",
        sha256(b"a,b\n1,2\n"),
        sha256(b"c\n3\n")
    );
    assert_eq!((tree.bytes, tree.digest), (12, sha256(manifest.as_bytes())));

    let missing = copy(&http, "s3://datasets/nothing.csv", volume.path(), "/in/").await;
    match missing {
        Err(FetchError::Source(why)) => {
            assert!(why.contains("s3://datasets/nothing.csv"), "{why}")
        }
        other => panic!("a missing object is the source's fault: {other:?}"),
    }
}

fn read(dir: &Path, rel: &str) -> Vec<u8> {
    std::fs::read(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}
