//! `s3://` against a real S3 server (moto's, started here on a free port;
//! `scripts/test` installs it with `pip install 'moto[server]'`): one object and a whole
//! prefix land in the volume through the `object_store` crate, with the credentials and
//! endpoint of the standard `AWS_*` environment; a missing object fails with its name;
//! a volume's outputs go out to a prefix in parts, and come back the same.

use std::path::Path;

use meridian_datamover::fetch::{copy, copy_out, FetchError};
use meridian_datamover::testkit::Moto;
use object_store::ObjectStore;
use sha2::{Digest, Sha256};

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_and_prefixes_come_in_from_s3_and_a_missing_one_is_named() {
    let moto = Moto::start();
    // The standard environment, as a site's operator would set it.
    for (key, value) in moto.env() {
        std::env::set_var(key, value);
    }
    let http = reqwest::Client::new();
    moto.bucket("datasets");
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

    // Out again, to another prefix (every upload is a multipart one).
    let out = copy_out(volume.path(), "/in/", "s3://datasets/copied/")
        .await
        .expect("out to a prefix");
    assert_eq!(
        (out.bytes, out.digest.clone()),
        (12, sha256(manifest.as_bytes()))
    );
    let big_out = copy_out(
        volume.path(),
        "/model/weights.bin",
        "s3://datasets/out/w.bin",
    )
    .await
    .expect("one file out");
    assert_eq!(big_out.digest, sha256(&big));
    let back = tempfile::tempdir().unwrap();
    copy(&http, "s3://datasets/copied/", back.path(), "/again/")
        .await
        .unwrap();
    assert_eq!(read(back.path(), "again/deep/b.csv"), b"c\n3\n");
    let big_back = copy(&http, "s3://datasets/out/w.bin", back.path(), "/w.bin")
        .await
        .unwrap();
    assert_eq!(big_back.digest, sha256(&big));

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
