//! Copies one ingress step into a volume directory, or one egress step out of it: a
//! `file://` path (a file or a whole tree), an `http(s)://` object, an object or prefix in
//! an object store (`s3://`, `gs://`, `az://`, all through the `object_store` crate), or
//! a model repository (`hf://`), streamed, never held in memory, each file written
//! beside its final name and renamed into place once whole. Every copy yields its bytes
//! and a digest: the file's SHA-256, or for a tree the SHA-256 of its manifest (each
//! file's digest and path, sorted), and counts its bytes into a [`Progress`] as they go.
//!
//! [`fingerprint`] asks a source, cheaply, which version of its data it holds (an ETag,
//! a size and modification time, a model's file ids), so that the site cache
//! ([`crate::cache`]) can tell that the data it kept is still what the source holds.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use object_store::ObjectStore;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one copy moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub bytes: u64,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Whether the source was a tree (its digest is that of its manifest).
    pub tree: bool,
    /// Each file written with its own digest, by its path under the step's target (`""`:
    /// the target itself), for the site cache to keep. Empty for copies out.
    pub files: Vec<(String, String)>,
}

/// Bytes done and expected of the copy under way, counted by the copy and read by
/// whoever reports its progress.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    /// Bytes found in parts an earlier copy left, kept rather than fetched again.
    resumed: AtomicU64,
    total: AtomicU64,
    total_known: AtomicBool,
}

impl Progress {
    /// Bytes copied so far, and the bytes expected when the source said.
    pub fn now(&self) -> (u64, Option<u64>) {
        let done = self.done.load(Ordering::Relaxed);
        let total = self
            .total_known
            .load(Ordering::Relaxed)
            .then(|| self.total.load(Ordering::Relaxed));
        (done, total)
    }

    /// Bytes kept from parts an earlier copy left (counted in [`Progress::now`] too).
    pub fn resumed(&self) -> u64 {
        self.resumed.load(Ordering::Relaxed)
    }

    pub(crate) fn advance(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn expect(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
        self.total_known.store(true, Ordering::Relaxed);
    }

    /// Starts the count again (a copy tried again from its start).
    pub fn restart(&self) {
        self.done.store(0, Ordering::Relaxed);
        self.resumed.store(0, Ordering::Relaxed);
        self.total.store(0, Ordering::Relaxed);
        self.total_known.store(false, Ordering::Relaxed);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The step can never work as written (a scheme not supported, a path that leaves
    /// the volume).
    #[error("{0}")]
    Invalid(String),
    /// The source is not there, or refused us.
    #[error("{0}")]
    Source(String),
    /// The source did not answer (a connection that failed, a server error): the same
    /// copy may work later.
    #[error("{0}")]
    Unreachable(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> FetchError {
    let what = what.into();
    move |source| FetchError::Io { what, source }
}

/// How a copy reaches its far side: the HTTP client, and the variables of the secret
/// the step names (`credentials` in the workflow), which stand over the process's own
/// environment for that step alone.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    http: reqwest::Client,
    secret: Option<std::sync::Arc<std::collections::BTreeMap<String, String>>>,
}

impl Reach {
    pub fn new(http: reqwest::Client) -> Reach {
        Reach { http, secret: None }
    }

    /// The same, with a secret's variables (`AWS_ACCESS_KEY_ID`, `HF_TOKEN`, …).
    pub fn with_secret(
        &self,
        vars: std::sync::Arc<std::collections::BTreeMap<String, String>>,
    ) -> Reach {
        Reach {
            http: self.http.clone(),
            secret: Some(vars),
        }
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A variable: the secret's, else the process environment's.
    pub(crate) fn var(&self, key: &str) -> Option<String> {
        self.secret
            .as_ref()
            .and_then(|s| s.get(key).cloned())
            .or_else(|| std::env::var(key).ok())
    }

    /// The secret's variables that start with `prefix` (`AWS_`), as `object_store`
    /// configuration keys (lower case) with their values.
    pub(crate) fn store_config(&self, prefix: &str) -> Vec<(String, String)> {
        self.secret
            .iter()
            .flat_map(|s| s.iter())
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect()
    }
}

fn sha256_hex(hash: Sha256) -> String {
    format!("sha256:{:x}", hash.finalize())
}

/// Where an ingress destination (an absolute path in the volume, `/data/` or
/// `/data/x.bin`) is under `volume_dir`; a path that would leave the volume is refused.
pub fn destination(volume_dir: &Path, path: &str) -> Result<PathBuf, FetchError> {
    let mut out = volume_dir.to_path_buf();
    for part in Path::new(path).components() {
        match part {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(p) => out.push(p),
            _ => {
                return Err(FetchError::Invalid(format!(
                    "destination {path:?} leaves the volume"
                )))
            }
        }
    }
    Ok(out)
}

/// Sums files copied one by one into the copy of a tree.
#[derive(Default)]
struct Tree {
    manifest: Sha256,
    bytes: u64,
    files: Vec<(String, String)>,
}

impl Tree {
    fn add(&mut self, rel: &str, copied: Copied) {
        self.bytes += copied.bytes;
        self.manifest
            .update(format!("{}  {rel}\n", copied.digest).as_bytes());
        self.files.push((rel.to_string(), copied.digest));
    }

    fn done(self) -> Copied {
        Copied {
            bytes: self.bytes,
            digest: sha256_hex(self.manifest),
            tree: true,
            files: self.files,
        }
    }
}

/// One file's copy, named by its path under the step's target.
fn one(rel: impl Into<String>, copied: Copied) -> Copied {
    Copied {
        files: vec![(rel.into(), copied.digest.clone())],
        ..copied
    }
}

/// Copies `source` to `destination` (a path in the volume; ending in `/`, a directory
/// the source goes into under its own name).
pub async fn copy(
    reach: &Reach,
    source: &str,
    volume_dir: &Path,
    destination_path: &str,
    progress: &Progress,
) -> Result<Copied, FetchError> {
    let into_dir = destination_path.ends_with('/');
    let target = destination(volume_dir, destination_path)?;
    if let Some(path) = source.strip_prefix("file://") {
        let from = PathBuf::from(path);
        let meta = tokio::fs::metadata(&from)
            .await
            .map_err(|e| FetchError::Source(format!("{source}: {e}")))?;
        if meta.is_dir() {
            return copy_tree(&from, &target, progress).await;
        }
        progress.expect(meta.len());
        let rel = match into_dir {
            true => from
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            false => String::new(),
        };
        let file = tokio::fs::File::open(&from)
            .await
            .map_err(|e| FetchError::Source(format!("{source}: {e}")))?;
        let copied = write_file(file, &under(&target, &rel), source, progress).await?;
        return Ok(one(rel, copied));
    }
    if source.starts_with("https://") || source.starts_with("http://") {
        // Named by the URL's last path segment.
        let name = reqwest::Url::parse(source)
            .ok()
            .and_then(|u| u.path_segments()?.next_back().map(str::to_string))
            .filter(|n| !n.is_empty() && n != "." && n != "..")
            .unwrap_or_else(|| "index".into());
        let rel = match into_dir {
            true => name,
            false => String::new(),
        };
        let copied = get_resumable(
            (source, "the server"),
            || reach.http().get(source),
            &under(&target, &rel),
            progress,
        )
        .await?;
        return Ok(one(rel, copied));
    }
    if let Some(located) = object_store_for(source, reach)? {
        return copy_objects(source, located, &target, into_dir, progress).await;
    }
    if let Some(rest) = source.strip_prefix("hf://") {
        return copy_hf(reach, source, rest, &target, progress).await;
    }
    let scheme = source.split_once("://").map_or(source, |(s, _)| s);
    Err(FetchError::Invalid(format!(
        "{source}: {scheme}:// sources are not supported by this data mover (file://, http://, https://, s3://, gs://, az:// and hf:// are)"
    )))
}

/// `rel` under `target`; `""` is the target itself.
fn under(target: &Path, rel: &str) -> PathBuf {
    match rel.is_empty() {
        true => target.to_path_buf(),
        false => target.join(rel),
    }
}

/// A response whose status says the body is there; a server error or 429 may pass if
/// asked again, anything else is the source's answer. `peer` names who answered
/// ("the server", "the Hub").
fn answered(
    what: &str,
    peer: &str,
    response: reqwest::Response,
) -> Result<reqwest::Response, FetchError> {
    let status = response.status();
    let why = format!("{what}: {peer} answered {status}");
    match status {
        s if s.is_server_error() || s.as_u16() == 429 => Err(FetchError::Unreachable(why)),
        s if !s.is_success() => Err(FetchError::Source(why)),
        _ => Ok(response),
    }
}

/// Where a bucket's objects are read and written.
enum Bucket {
    /// S3 and Azure Blob, through the `object_store` crate.
    Store(Box<dyn ObjectStore>),
    /// Google Cloud Storage, through its JSON API ([`crate::gcs`]).
    Gcs(crate::gcs::GcsBucket),
}

/// An object store a URL names, with the key in it.
pub struct Located {
    bucket: Bucket,
    /// `s3://bucket`, `gs://bucket`, `az://container`: how its objects are named back.
    root: String,
    key: String,
}

/// One object a URL names, with its path under the URL's prefix.
struct Listed {
    rel: String,
    key: String,
    size: u64,
    /// What changes when the object is written again (ETag, version, time).
    version: String,
}

/// The store behind an `s3://`, `gs://` or `az://` URL, configured from each ecosystem's
/// standard environment; `None` for other schemes.
///
/// - S3: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, and
///   `AWS_ENDPOINT_URL` for a server of one's own (plain HTTP allowed to an `http://` one).
/// - Google Cloud Storage: `GOOGLE_APPLICATION_CREDENTIALS` (or `GOOGLE_SERVICE_ACCOUNT`);
///   `STORAGE_EMULATOR_HOST`, as Google's own libraries read it, for an emulator, which
///   takes no credentials.
/// - Azure Blob: `AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCOUNT_KEY` (or a SAS,
///   or a service principal); `AZURE_STORAGE_USE_EMULATOR=true` for Azurite, at
///   `AZURITE_BLOB_STORAGE_URL` (default `http://127.0.0.1:10000`).
pub fn object_store_for(uri: &str, reach: &Reach) -> Result<Option<Located>, FetchError> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Ok(None);
    };
    if !matches!(scheme, "s3" | "gs" | "az") {
        return Ok(None);
    }
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(FetchError::Invalid(format!(
            "{uri}: no {}",
            match scheme {
                "az" => "container",
                _ => "bucket",
            }
        )));
    }
    let invalid = |e: object_store::Error| FetchError::Invalid(format!("{uri}: {e}"));
    let bucket_of = match scheme {
        "s3" => {
            let mut builder =
                object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
            for (key, value) in reach.store_config("AWS_") {
                if let Ok(key) = key.parse() {
                    builder = builder.with_config(key, value);
                }
            }
            if let Some(endpoint) = reach.var("AWS_ENDPOINT_URL") {
                builder = builder
                    .with_allow_http(endpoint.starts_with("http://"))
                    .with_endpoint(endpoint);
            }
            Bucket::Store(Box::new(builder.build().map_err(invalid)?))
        }
        "gs" => Bucket::Gcs(crate::gcs::GcsBucket::from_env(uri, bucket, reach)?),
        _ => {
            let mut builder =
                object_store::azure::MicrosoftAzureBuilder::from_env().with_container_name(bucket);
            for (key, value) in reach.store_config("AZURE_") {
                if let Ok(key) = key.parse() {
                    builder = builder.with_config(key, value);
                }
            }
            Bucket::Store(Box::new(builder.build().map_err(invalid)?))
        }
    };
    Ok(Some(Located {
        bucket: bucket_of,
        root: format!("{scheme}://{bucket}"),
        key: key.to_string(),
    }))
}

type Chunks = futures::stream::BoxStream<'static, Result<bytes::Bytes, FetchError>>;

impl Located {
    /// Whether the URL names one object (else every object under a prefix).
    fn single(&self) -> bool {
        !self.key.is_empty() && !self.key.ends_with('/')
    }

    /// How an object store's error reads, and whether asking again may help.
    fn failed(&self, uri: &str) -> impl Fn(object_store::Error) -> FetchError {
        let (uri, root) = (uri.to_string(), self.root.clone());
        move |e| match e {
            object_store::Error::NotFound { path, .. } => {
                FetchError::Source(format!("{uri}: no object {root}/{path}"))
            }
            object_store::Error::Generic { .. } => FetchError::Unreachable(format!("{uri}: {e}")),
            e => FetchError::Source(format!("{uri}: {e}")),
        }
    }

    /// The objects the URL names: the one object (by its file name), or every object
    /// under the prefix, sorted, each by its path under the prefix.
    async fn objects(&self, source: &str) -> Result<Vec<Listed>, FetchError> {
        use futures::TryStreamExt;
        let file_name = |key: &str| key.rsplit('/').next().unwrap_or("object").to_string();
        let mut objects = match (&self.bucket, self.single()) {
            (Bucket::Gcs(gcs), true) => {
                let o = gcs.head(source, &self.key).await?;
                vec![Listed {
                    rel: file_name(&o.name),
                    key: o.name,
                    size: o.size,
                    version: o.version,
                }]
            }
            (Bucket::Gcs(gcs), false) => gcs
                .list(source, &self.key)
                .await?
                .into_iter()
                .filter(|o| !o.name.ends_with('/'))
                .map(|o| Listed {
                    rel: o.name[self.key.len()..].to_string(),
                    key: o.name,
                    size: o.size,
                    version: o.version,
                })
                .collect(),
            (Bucket::Store(store), true) => {
                let path = object_store::path::Path::from(self.key.as_str());
                let o = store.head(&path).await.map_err(self.failed(source))?;
                vec![Listed {
                    rel: file_name(&self.key),
                    key: self.key.clone(),
                    size: o.size,
                    version: store_version(&o),
                }]
            }
            (Bucket::Store(store), false) => {
                let prefix = object_store::path::Path::from(self.key.trim_end_matches('/'));
                let listed: Vec<object_store::ObjectMeta> = store
                    .list(Some(&prefix))
                    .try_collect()
                    .await
                    .map_err(self.failed(source))?;
                listed
                    .into_iter()
                    .map(|o| {
                        let rel: Vec<String> = o
                            .location
                            .prefix_match(&prefix)
                            .map(|parts| parts.map(|p| p.as_ref().to_string()).collect())
                            .unwrap_or_default();
                        Listed {
                            rel: rel.join("/"),
                            key: o.location.to_string(),
                            size: o.size,
                            version: store_version(&o),
                        }
                    })
                    .collect()
            }
        };
        if objects.is_empty() {
            return Err(FetchError::Source(format!("{source}: no objects under it")));
        }
        objects.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(objects)
    }

    /// One object's bytes from `offset` on, as they arrive, and whether the store sent
    /// them from there (else from the start).
    async fn get(
        &self,
        source: &str,
        key: &str,
        offset: u64,
    ) -> Result<(Chunks, bool), FetchError> {
        use futures::{StreamExt, TryStreamExt};
        match &self.bucket {
            Bucket::Gcs(gcs) => {
                let (chunks, from_offset) = gcs.get(source, key, offset).await?;
                Ok((chunks, from_offset))
            }
            Bucket::Store(store) => {
                let failed = self.failed(source);
                let options = object_store::GetOptions {
                    range: (offset > 0).then_some(object_store::GetRange::Offset(offset)),
                    ..Default::default()
                };
                let got = store
                    .get_opts(&object_store::path::Path::from(key), options)
                    .await
                    .map_err(&failed)?;
                let from_offset = got.range.start == offset;
                Ok((got.into_stream().map_err(failed).boxed(), from_offset))
            }
        }
    }

    /// Uploads one file to `key`, in parts, hashing and counting as it goes.
    async fn put_file(
        &self,
        uri: &str,
        key: &str,
        path: &Path,
        progress: &Progress,
    ) -> Result<Copied, FetchError> {
        if key.is_empty() {
            return Err(FetchError::Invalid(format!(
                "{uri}: a key is needed after the bucket or container"
            )));
        }
        let store = match &self.bucket {
            Bucket::Gcs(gcs) => return gcs.put_file(uri, key, path, progress).await,
            Bucket::Store(store) => store,
        };
        let failed = self.failed(uri);
        let upload = store
            .put_multipart(&object_store::path::Path::from(key))
            .await
            .map_err(&failed)?;
        let mut writer = object_store::WriteMultipart::new(upload);
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| FetchError::Source(format!("{}: {e}", path.display())))?;
        let mut hash = Sha256::new();
        let mut bytes = 0u64;
        let mut chunks = file_chunks(file, path.display().to_string());
        while let Some(chunk) = futures::TryStreamExt::try_next(&mut chunks).await? {
            let n = chunk.len() as u64;
            hash.update(&chunk);
            bytes += n;
            writer.wait_for_capacity(4).await.map_err(&failed)?;
            writer.put(chunk);
            progress.advance(n);
        }
        writer.finish().await.map_err(&failed)?;
        Ok(Copied {
            bytes,
            digest: sha256_hex(hash),
            tree: false,
            files: Vec::new(),
        })
    }
}

fn store_version(o: &object_store::ObjectMeta) -> String {
    format!(
        "{} {} {}",
        o.e_tag.as_deref().unwrap_or_default(),
        o.version.as_deref().unwrap_or_default(),
        o.last_modified.timestamp_micros()
    )
}

/// One object (into `target`, or under it by its name when `into_dir`) or every object
/// under a prefix (laid out by the rest of its key).
async fn copy_objects(
    source: &str,
    located: Located,
    target: &Path,
    into_dir: bool,
    progress: &Progress,
) -> Result<Copied, FetchError> {
    let single = located.single();
    let objects = located.objects(source).await?;
    progress.expect(objects.iter().map(|o| o.size).sum());
    let mut tree = Tree::default();
    for object in objects {
        let rel = match (single, into_dir) {
            (true, false) => String::new(),
            _ => object.rel,
        };
        let to = match rel.is_empty() {
            true => target.to_path_buf(),
            false => destination(target, &rel)?,
        };
        // A part left by a copy that stopped is continued while the object is unchanged.
        let version = format!("{} {}", object.size, object.version);
        let mut part = Part::open(&to, Some(&version), progress).await?;
        // A part of the object's whole size was fetched but not yet renamed.
        if part.bytes == object.size && object.size > 0 {
            let copied = part.finish().await?;
            match single {
                true => return Ok(one(rel, copied)),
                false => {
                    tree.add(&rel, copied);
                    continue;
                }
            }
        }
        let offset = match part.bytes < object.size {
            true => part.bytes,
            false => {
                part.restart(progress).await?;
                0
            }
        };
        let (chunks, from_offset) = located.get(source, &object.key, offset).await?;
        if !from_offset && offset > 0 {
            part.restart(progress).await?;
        }
        part.write(chunks, progress).await?;
        let copied = part.finish().await?;
        if single {
            return Ok(one(rel, copied));
        }
        tree.add(&rel, copied);
    }
    Ok(tree.done())
}

/// The file list of `hf://ORG/MODEL[@REVISION]`: the Hub's endpoint, the repository, the
/// revision (`main` by default), and each file's entry in the Hub's tree listing.
struct HfListing {
    endpoint: String,
    repo: String,
    revision: String,
    files: Vec<serde_json::Value>,
}

fn hf_request(reach: &Reach, url: String) -> reqwest::RequestBuilder {
    let request = reach.http().get(url);
    match reach.var("HF_TOKEN").filter(|t| !t.is_empty()) {
        Some(token) => request.bearer_auth(token),
        None => request,
    }
}

/// Lists a model repository through the Hub's HTTP file API at `HF_ENDPOINT` (by
/// default `https://huggingface.co`, so a mirror or a stand-in can serve), with
/// `HF_TOKEN` as a bearer token when it is set.
async fn hf_listing(reach: &Reach, source: &str, rest: &str) -> Result<HfListing, FetchError> {
    let (repo, revision) = rest.split_once('@').unwrap_or((rest, "main"));
    let valid = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            && !s.split('/').any(|p| p.is_empty() || p == "." || p == "..")
    };
    if !valid(repo) || repo.split('/').count() != 2 || !valid(revision) {
        return Err(FetchError::Invalid(format!(
            "{source}: expected hf://ORG/MODEL or hf://ORG/MODEL@REVISION"
        )));
    }
    let endpoint = reach
        .var("HF_ENDPOINT")
        .unwrap_or_else(|| "https://huggingface.co".into())
        .trim_end_matches('/')
        .to_string();
    let listing = hf_request(
        reach,
        format!("{endpoint}/api/models/{repo}/tree/{revision}?recursive=true"),
    )
    .send()
    .await
    .map_err(|e| FetchError::Unreachable(format!("{source}: {e}")))?;
    let listing = answered(&format!("{source}: listing its files"), "the Hub", listing)?;
    let entries: Vec<serde_json::Value> = listing.json().await.map_err(|e| {
        FetchError::Source(format!(
            "{source}: the file list is not what the Hub sends: {e}"
        ))
    })?;
    let mut files: Vec<serde_json::Value> = entries
        .into_iter()
        .filter(|e| e["type"] == "file" && e["path"].is_string())
        .collect();
    files.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
    if files.is_empty() {
        return Err(FetchError::Source(format!(
            "{source}: the repository has no files"
        )));
    }
    Ok(HfListing {
        endpoint,
        repo: repo.to_string(),
        revision: revision.to_string(),
        files,
    })
}

/// `hf://ORG/MODEL[@REVISION]`: every file of a model repository at a revision, each
/// through `resolve` (following the Hub's redirects), keeping its path in the repository.
async fn copy_hf(
    reach: &Reach,
    source: &str,
    rest: &str,
    target: &Path,
    progress: &Progress,
) -> Result<Copied, FetchError> {
    let listing = hf_listing(reach, source, rest).await?;
    progress.expect(
        listing
            .files
            .iter()
            .filter_map(|f| f["size"].as_u64())
            .sum(),
    );
    let mut tree = Tree::default();
    for file in &listing.files {
        let path = file["path"].as_str().unwrap_or_default();
        let to = destination(target, path)?;
        let url = format!(
            "{}/{}/resolve/{}/{path}",
            listing.endpoint, listing.repo, listing.revision
        );
        let what = format!("{source}: {path}");
        let request = || hf_request(reach, url.clone());
        let copied = get_resumable((&what, "the Hub"), request, &to, progress).await?;
        tree.add(path, copied);
    }
    Ok(tree.done())
}

/// A file being written beside its name (`NAME.meridian-part`), renamed once whole.
/// With the version of the source it is read from (`NAME.meridian-part.version`), a part
/// left by a copy that stopped is continued rather than started again, when the source
/// still holds that version.
struct Part {
    file: tokio::fs::File,
    path: PathBuf,
    to: PathBuf,
    hash: Sha256,
    /// Bytes in it so far.
    bytes: u64,
}

fn version_of_part(part: &Path) -> PathBuf {
    let mut name = part.file_name().unwrap_or_default().to_os_string();
    name.push(".version");
    part.with_file_name(name)
}

impl Part {
    /// The part of `to`: continued when `version` is what an earlier copy left it for
    /// (its bytes are hashed again and counted as done), else started empty.
    async fn open(
        to: &Path,
        version: Option<&str>,
        progress: &Progress,
    ) -> Result<Part, FetchError> {
        if let Some(dir) = to.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(io(dir.display().to_string()))?;
        }
        let path = part_of(to);
        let marker = version_of_part(&path);
        let left = match version {
            Some(v) => tokio::fs::read_to_string(&marker)
                .await
                .is_ok_and(|left| left == v),
            None => false,
        };
        if left {
            if let (Ok(kept), Ok(file)) = (
                tokio::fs::File::open(&path).await,
                tokio::fs::OpenOptions::new().append(true).open(&path).await,
            ) {
                use futures::TryStreamExt;
                let mut hash = Sha256::new();
                let mut bytes = 0u64;
                let mut chunks = file_chunks(kept, path.display().to_string());
                while let Some(chunk) = chunks.try_next().await? {
                    hash.update(&chunk);
                    bytes += chunk.len() as u64;
                }
                progress.advance(bytes);
                progress.resumed.fetch_add(bytes, Ordering::Relaxed);
                return Ok(Part {
                    file,
                    path,
                    to: to.to_path_buf(),
                    hash,
                    bytes,
                });
            }
        }
        let file = tokio::fs::File::create(&path)
            .await
            .map_err(io(path.display().to_string()))?;
        match version {
            Some(v) => tokio::fs::write(&marker, v)
                .await
                .map_err(io(marker.display().to_string()))?,
            None => {
                let _ = tokio::fs::remove_file(&marker).await;
            }
        }
        Ok(Part {
            file,
            path,
            to: to.to_path_buf(),
            hash: Sha256::new(),
            bytes: 0,
        })
    }

    /// Empties it (the source sent the whole object after all).
    async fn restart(&mut self, progress: &Progress) -> Result<(), FetchError> {
        self.file = tokio::fs::File::create(&self.path)
            .await
            .map_err(io(self.path.display().to_string()))?;
        // What this part counted is not done after all.
        let uncount = |n: &AtomicU64| {
            n.fetch_sub(self.bytes.min(n.load(Ordering::Relaxed)), Ordering::Relaxed)
        };
        uncount(&progress.done);
        uncount(&progress.resumed);
        self.hash = Sha256::new();
        self.bytes = 0;
        Ok(())
    }

    /// Appends a stream of chunks, hashing and counting as it goes.
    async fn write<S>(&mut self, mut chunks: S, progress: &Progress) -> Result<(), FetchError>
    where
        S: futures::Stream<Item = Result<bytes::Bytes, FetchError>> + Unpin,
    {
        use futures::StreamExt;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            self.hash.update(&chunk);
            self.bytes += chunk.len() as u64;
            self.file
                .write_all(&chunk)
                .await
                .map_err(io(self.path.display().to_string()))?;
            progress.advance(chunk.len() as u64);
        }
        Ok(())
    }

    /// Renames it to its own name, once flushed to disk.
    async fn finish(self) -> Result<Copied, FetchError> {
        finish(self.file, &self.path, &self.to).await?;
        let _ = tokio::fs::remove_file(version_of_part(&self.path)).await;
        Ok(Copied {
            bytes: self.bytes,
            digest: sha256_hex(self.hash),
            tree: false,
            files: Vec::new(),
        })
    }
}

/// GETs `url` (built by `request`) into `to`, continuing a part left by a copy that
/// stopped: with `Range` from its end and `If-Range` on the version it was read at (the
/// response's ETag, else its Last-Modified), so a source that changed since sends the
/// whole object again, which starts the part afresh. A source with neither header is
/// fetched whole each time.
async fn get_resumable(
    (what, peer): (&str, &str),
    request: impl Fn() -> reqwest::RequestBuilder,
    to: &Path,
    progress: &Progress,
) -> Result<Copied, FetchError> {
    use futures::TryStreamExt;
    let part_path = part_of(to);
    let left = tokio::fs::read_to_string(version_of_part(&part_path))
        .await
        .ok();
    let mut part = Part::open(to, left.as_deref(), progress).await?;
    let mut get = request();
    if part.bytes > 0 {
        get = get
            .header(reqwest::header::RANGE, format!("bytes={}-", part.bytes))
            .header(reqwest::header::IF_RANGE, left.clone().unwrap_or_default());
    }
    let mut response = get
        .send()
        .await
        .map_err(|e| FetchError::Unreachable(format!("{what}: {e}")))?;
    if response.status() == reqwest::StatusCode::RANGE_NOT_SATISFIABLE && part.bytes > 0 {
        // The part holds the whole object already, or more: fetch it all again.
        part.restart(progress).await?;
        response = request()
            .send()
            .await
            .map_err(|e| FetchError::Unreachable(format!("{what}: {e}")))?;
    }
    let response = answered(what, peer, response)?;
    let resumed = part.bytes > 0 && response.status() == reqwest::StatusCode::PARTIAL_CONTENT;
    if part.bytes > 0 && !resumed {
        part.restart(progress).await?;
    }
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok())
            .map(str::to_string)
    };
    let version = header(reqwest::header::ETAG)
        .filter(|e| !e.starts_with("W/"))
        .or_else(|| header(reqwest::header::LAST_MODIFIED));
    // What the part is read at, for a copy that picks it up after a stop.
    let marker = version_of_part(&part_path);
    match &version {
        Some(v) if !resumed => tokio::fs::write(&marker, v)
            .await
            .map_err(io(marker.display().to_string()))?,
        _ => {}
    }
    if let Some(length) = response.content_length() {
        progress.expect(length + part.bytes);
    }
    let what = what.to_string();
    let chunks = response
        .bytes_stream()
        .map_err(move |e| FetchError::Unreachable(format!("{what}: {e}")));
    part.write(chunks, progress).await?;
    part.finish().await
}

/// A local file's bytes, a MiB at a time.
fn file_chunks(
    file: tokio::fs::File,
    what: String,
) -> impl futures::Stream<Item = Result<bytes::Bytes, FetchError>> + Unpin {
    Box::pin(futures::stream::try_unfold(file, move |mut file| {
        let what = what.clone();
        async move {
            // Read into spare capacity: nothing is zeroed first.
            let mut buf = bytes::BytesMut::with_capacity(1 << 20);
            let n = file
                .read_buf(&mut buf)
                .await
                .map_err(|e| FetchError::Source(format!("{what}: {e}")))?;
            Ok((n > 0).then(|| (buf.freeze(), file)))
        }
    }))
}

/// The file's part name while it is written: renamed to its own once whole.
fn part_of(to: &Path) -> PathBuf {
    let mut name = to.file_name().unwrap_or_default().to_os_string();
    name.push(".meridian-part");
    to.with_file_name(name)
}

/// Copies one local file to `to`, hashing and counting as it goes.
pub(crate) async fn write_file(
    from: tokio::fs::File,
    to: &Path,
    source: &str,
    progress: &Progress,
) -> Result<Copied, FetchError> {
    let mut part = Part::open(to, None, progress).await?;
    part.write(file_chunks(from, source.to_string()), progress)
        .await?;
    part.finish().await
}

async fn finish(mut out: tokio::fs::File, part: &Path, to: &Path) -> Result<(), FetchError> {
    out.flush().await.map_err(io(part.display().to_string()))?;
    out.sync_all()
        .await
        .map_err(io(part.display().to_string()))?;
    drop(out);
    tokio::fs::rename(part, to)
        .await
        .map_err(io(to.display().to_string()))
}

/// Copies every file under `from` to the same place under `to`.
async fn copy_tree(from: &Path, to: &Path, progress: &Progress) -> Result<Copied, FetchError> {
    let files = files_under(from).await?;
    let mut sizes = 0;
    for rel in &files {
        sizes += tokio::fs::metadata(from.join(rel))
            .await
            .map(|m| m.len())
            .unwrap_or(0);
    }
    progress.expect(sizes);
    let mut tree = Tree::default();
    for rel in &files {
        let source = from.join(rel);
        let file = tokio::fs::File::open(&source)
            .await
            .map_err(|e| FetchError::Source(format!("{}: {e}", source.display())))?;
        let copied =
            write_file(file, &to.join(rel), &source.display().to_string(), progress).await?;
        tree.add(&rel.display().to_string(), copied);
    }
    Ok(tree.done())
}

/// Copies `source_path` in the volume (a file, or a directory and all under it) out to
/// `destination` (`file://…`, or an object store's `s3://`, `gs://` or `az://` URL;
/// ending in `/`, or for a directory, a place the files go under by their path in it).
pub async fn copy_out(
    reach: &Reach,
    volume_dir: &Path,
    source_path: &str,
    destination_uri: &str,
    progress: &Progress,
) -> Result<Copied, FetchError> {
    let from = destination(volume_dir, source_path)?;
    let meta = tokio::fs::metadata(&from)
        .await
        .map_err(|e| FetchError::Source(format!("{source_path} in the volume: {e}")))?;
    let into_dir = destination_uri.ends_with('/') || meta.is_dir();
    let files: Vec<(String, PathBuf)> = match meta.is_dir() {
        true => files_under(&from)
            .await?
            .into_iter()
            .map(|rel| (rel.display().to_string(), from.join(rel)))
            .collect(),
        false => vec![(
            from.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            from.clone(),
        )],
    };
    let store = object_store_for(destination_uri, reach)?;
    if store.is_none() && !destination_uri.starts_with("file://") {
        let scheme = destination_uri
            .split_once("://")
            .map_or(destination_uri, |(s, _)| s);
        return Err(FetchError::Invalid(format!(
            "{destination_uri}: {scheme}:// destinations are not supported by this data mover (file://, s3://, gs:// and az:// are)"
        )));
    }
    for (_, path) in &files {
        progress.expect(
            tokio::fs::metadata(path)
                .await
                .map(|m| m.len())
                .unwrap_or(0),
        );
    }
    let mut tree = Tree::default();
    let mut last = None;
    for (rel, path) in &files {
        let copied = match (&store, destination_uri.strip_prefix("file://")) {
            (None, Some(root)) => {
                let to = match into_dir {
                    true => destination(Path::new(root), rel)?,
                    false => PathBuf::from(root),
                };
                let file = tokio::fs::File::open(path)
                    .await
                    .map_err(|e| FetchError::Source(format!("{}: {e}", path.display())))?;
                write_file(file, &to, &path.display().to_string(), progress).await?
            }
            (Some(located), _) => {
                let key = match into_dir {
                    true => format!("{}/{rel}", located.key.trim_end_matches('/'))
                        .trim_start_matches('/')
                        .to_string(),
                    false => located.key.clone(),
                };
                located
                    .put_file(destination_uri, &key, path, progress)
                    .await?
            }
            (None, None) => unreachable!("refused above"),
        };
        last = Some(copied.clone());
        tree.add(rel, copied);
    }
    match (meta.is_dir(), last) {
        (false, Some(one)) => Ok(one),
        _ => Ok(Copied {
            files: Vec::new(),
            ..tree.done()
        }),
    }
}

/// Every file under `dir`, by its path relative to it, sorted.
pub(crate) async fn files_under(dir: &Path) -> Result<Vec<PathBuf>, FetchError> {
    let mut files = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let mut entries = tokio::fs::read_dir(dir.join(&rel))
            .await
            .map_err(io(dir.join(&rel).display().to_string()))?;
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(io(dir.join(&rel).display().to_string()))?
        {
            let kind = entry
                .file_type()
                .await
                .map_err(io(entry.path().display().to_string()))?;
            let path = rel.join(entry.file_name());
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() && !path.to_string_lossy().contains(".meridian-part") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Which version of its data `source` holds now, asked cheaply (metadata, no content):
/// for a file or tree its sizes and modification times, for HTTP the ETag or
/// Last-Modified with the length, for an object store each object's ETag, size and
/// modification time, for a model each file's id in the Hub. `None` when the source
/// cannot say (an HTTP server with neither header): such a source is always fetched.
pub async fn fingerprint(reach: &Reach, source: &str) -> Result<Option<String>, FetchError> {
    let mut lines = Sha256::new();
    if let Some(path) = source.strip_prefix("file://") {
        let from = PathBuf::from(path);
        let meta = tokio::fs::metadata(&from)
            .await
            .map_err(|e| FetchError::Source(format!("{source}: {e}")))?;
        let files = match meta.is_dir() {
            true => files_under(&from).await?,
            false => vec![PathBuf::new()],
        };
        for rel in files {
            let meta = tokio::fs::metadata(from.join(&rel))
                .await
                .map_err(io(from.join(&rel).display().to_string()))?;
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            lines.update(format!("{}\t{}\t{modified}\n", rel.display(), meta.len()).as_bytes());
        }
    } else if source.starts_with("https://") || source.starts_with("http://") {
        let response = reach
            .http()
            .head(source)
            .send()
            .await
            .map_err(|e| FetchError::Unreachable(format!("{source}: {e}")))?;
        let response = answered(source, "the server", response)?;
        let header = |name: reqwest::header::HeaderName| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (etag, modified) = (
            header(reqwest::header::ETAG),
            header(reqwest::header::LAST_MODIFIED),
        );
        if etag.is_none() && modified.is_none() {
            return Ok(None);
        }
        lines.update(
            format!(
                "{}\t{}\t{}\n",
                etag.unwrap_or_default(),
                modified.unwrap_or_default(),
                header(reqwest::header::CONTENT_LENGTH).unwrap_or_default()
            )
            .as_bytes(),
        );
    } else if let Some(located) = object_store_for(source, reach)? {
        for o in located.objects(source).await? {
            lines.update(format!("{}\t{}\t{}\n", o.rel, o.size, o.version).as_bytes());
        }
    } else if let Some(rest) = source.strip_prefix("hf://") {
        for file in hf_listing(reach, source, rest).await?.files {
            lines.update(
                format!(
                    "{}\t{}\t{}\t{}\n",
                    file["path"].as_str().unwrap_or_default(),
                    file["oid"].as_str().unwrap_or_default(),
                    file["lfs"]["oid"].as_str().unwrap_or_default(),
                    file["size"].as_u64().unwrap_or_default()
                )
                .as_bytes(),
            );
        }
    } else {
        return Ok(None);
    }
    Ok(Some(sha256_hex(lines)))
}
