//! The three object stores against real servers started here on free ports: S3 (moto's
//! server), Google Cloud Storage (`gcp-storage-emulator`) and Azure Blob (Azurite);
//! `scripts/test` installs them. Each store gets the same checks, through the
//! `object_store` crate and each ecosystem's standard environment: one object and a
//! whole prefix land in the volume, with progress counted against the size the store
//! gave; a volume's outputs go out in parts and come back the same; a missing object
//! fails with its name; an object's fingerprint holds until it is written again.

use std::path::Path;
use std::sync::Arc;

use meridian_datamover::fetch::{copy, copy_out, fingerprint, FetchError, Progress, Reach};
use meridian_datamover::testkit::{Azurite, GcsEmulator, Moto};
use object_store::ObjectStore;
use sha2::{Digest, Sha256};

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn read(dir: &Path, rel: &str) -> Vec<u8> {
    std::fs::read(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A client of the test's bucket made apart from the data mover's: it puts objects and
/// reads them back.
#[async_trait::async_trait]
trait Seed: Send + Sync {
    async fn put(&self, key: &str, body: Vec<u8>);
    async fn get(&self, key: &str) -> Vec<u8>;
}

/// A bucket through `object_store`, as a store's own SDK would reach it.
struct Store(Arc<dyn ObjectStore>);

#[async_trait::async_trait]
impl Seed for Store {
    async fn put(&self, key: &str, body: Vec<u8>) {
        self.0
            .put(&object_store::path::Path::from(key), body.into())
            .await
            .unwrap_or_else(|e| panic!("seeding {key}: {e}"));
    }
    async fn get(&self, key: &str) -> Vec<u8> {
        let got = self.0.get(&object_store::path::Path::from(key)).await;
        got.unwrap_or_else(|e| panic!("{key}: {e}"))
            .bytes()
            .await
            .unwrap()
            .to_vec()
    }
}

/// The GCS emulator's bucket `datasets`, through its JSON API.
struct Emulated(GcsEmulator);

#[async_trait::async_trait]
impl Seed for Emulated {
    async fn put(&self, key: &str, body: Vec<u8>) {
        self.0.put("datasets", key, &body)
    }
    async fn get(&self, key: &str) -> Vec<u8> {
        self.0
            .get("datasets", key)
            .unwrap_or_else(|| panic!("no {key}"))
    }
}

/// The checks every store gets; `root` is `s3://datasets` or the like.
async fn check(root: &str, seed: &dyn Seed) {
    let http = Reach::default();
    // A file large enough to arrive in several chunks.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    seed.put("cells/a.csv", b"a,b\n1,2\n".to_vec()).await;
    seed.put("cells/deep/b.csv", b"c\n3\n".to_vec()).await;
    seed.put("weights.bin", big.clone()).await;
    let volume = tempfile::tempdir().unwrap();
    let url = |key: &str| format!("{root}/{key}");

    let progress = Progress::default();
    let one = copy(
        &http,
        &url("weights.bin"),
        volume.path(),
        "/model/",
        &progress,
    )
    .await
    .expect("one object");
    assert_eq!(one.bytes, big.len() as u64);
    assert_eq!(one.digest, sha256(&big));
    assert_eq!(read(volume.path(), "model/weights.bin"), big);
    assert_eq!(progress.now(), (big.len() as u64, Some(big.len() as u64)));

    let none = Progress::default;
    let tree = copy(&http, &url("cells/"), volume.path(), "/in/", &none())
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

    // Out again, to another prefix and to one key (every upload is a multipart one).
    let out = copy_out(&http, volume.path(), "/in/", &url("copied/"), &none())
        .await
        .expect("out to a prefix");
    assert_eq!((out.bytes, out.digest), (12, sha256(manifest.as_bytes())));
    let big_out = copy_out(
        &http,
        volume.path(),
        "/model/weights.bin",
        &url("out/w.bin"),
        &none(),
    )
    .await
    .expect("one file out");
    assert_eq!(big_out.digest, sha256(&big));
    assert_eq!(sha256(&seed.get("out/w.bin").await), sha256(&big));
    let back = tempfile::tempdir().unwrap();
    copy(&http, &url("copied/"), back.path(), "/again/", &none())
        .await
        .unwrap();
    assert_eq!(read(back.path(), "again/deep/b.csv"), b"c\n3\n");

    // A copy stopped part-way is continued from where it stopped, not from its start.
    let large: Vec<u8> = (0..24_000_000u32).map(|i| (i % 241) as u8).collect();
    seed.put("large.bin", large.clone()).await;
    let stopped = Progress::default();
    let large_url = url("large.bin");
    tokio::select! {
        _ = copy(&http, &large_url, volume.path(), "/large.bin", &stopped) => {
            panic!("the copy was to be stopped part-way")
        }
        _ = async {
            while stopped.now().0 < 4_000_000 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        } => {}
    }
    // Writes the stopped copy handed off land before the part is read again; then the
    // part is cut to what a process killed at 5 MB would have left.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let part = volume.path().join("large.bin.meridian-part");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&part)
        .expect("the stopped copy left its part")
        .set_len(5_000_000)
        .unwrap();
    let again = Progress::default();
    let resumed = copy(
        &http,
        &url("large.bin"),
        volume.path(),
        "/large.bin",
        &again,
    )
    .await
    .expect("the rest of it");
    assert_eq!(
        resumed.digest,
        sha256(&large),
        "the whole object, checked end to end"
    );
    assert_eq!(resumed.bytes, large.len() as u64);
    assert_eq!(
        again.resumed(),
        5_000_000,
        "the stopped copy's bytes were kept"
    );
    assert!(!volume.path().join("large.bin.meridian-part").exists());

    match copy(&http, &url("nothing.csv"), volume.path(), "/in/", &none()).await {
        Err(FetchError::Source(why)) => assert!(why.contains(&url("nothing.csv")), "{why}"),
        other => panic!("a missing object is the source's fault: {other:?}"),
    }

    // A fingerprint holds until the object is written again.
    let object = url("cells/a.csv");
    let first = fingerprint(&http, &object)
        .await
        .unwrap()
        .expect("a fingerprint");
    assert_eq!(
        fingerprint(&http, &object).await.unwrap(),
        Some(first.clone())
    );
    let prefix = fingerprint(&http, &url("cells/")).await.unwrap();
    assert!(prefix.is_some());
    // Stores keep modification times to the second.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    seed.put("cells/a.csv", b"a,b\n1,9\n".to_vec()).await;
    assert_ne!(fingerprint(&http, &object).await.unwrap(), Some(first));
    assert_ne!(fingerprint(&http, &url("cells/")).await.unwrap(), prefix);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_with_moto() {
    let moto = Moto::start();
    // The standard environment, as a site's operator would set it.
    for (key, value) in moto.env() {
        std::env::set_var(key, value);
    }
    moto.bucket("datasets");
    let seed = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name("datasets")
        .with_endpoint(moto.url())
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .unwrap();
    check("s3://datasets", &Store(Arc::new(seed))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn google_cloud_storage_with_its_emulator() {
    let gcs = GcsEmulator::start();
    for (key, value) in gcs.env() {
        std::env::set_var(key, value);
    }
    gcs.bucket("datasets");
    check("gs://datasets", &Emulated(gcs)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_blob_with_azurite() {
    let azurite = Azurite::start();
    for (key, value) in azurite.env() {
        std::env::set_var(key, value);
    }
    azurite.container("datasets");
    let seed = object_store::azure::MicrosoftAzureBuilder::new()
        .with_container_name("datasets")
        // At AZURITE_BLOB_STORAGE_URL, set above.
        .with_use_emulator(true)
        .build()
        .unwrap();
    check("az://datasets", &Store(Arc::new(seed))).await;
}
