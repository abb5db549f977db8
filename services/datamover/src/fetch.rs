//! Copies one ingress step into a volume directory: a `file://` path (a file or a whole
//! tree), an `http(s)://` object, an `s3://` object or prefix (through the
//! `object_store` crate), or a model repository (`hf://`), streamed, never held in
//! memory, each file written
//! beside its final name and renamed into place once whole. Every copy yields its bytes
//! and a digest: the file's SHA-256, or for a tree the SHA-256 of its manifest (each
//! file's digest and path, sorted).

use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one copy moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub bytes: u64,
    /// `sha256:<hex>`.
    pub digest: String,
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

/// Copies `source` to `destination` (a path in the volume; ending in `/`, a directory
/// the source goes into under its own name).
pub async fn copy(
    http: &reqwest::Client,
    source: &str,
    volume_dir: &Path,
    destination_path: &str,
) -> Result<Copied, FetchError> {
    let into_dir = destination_path.ends_with('/');
    let target = destination(volume_dir, destination_path)?;
    if let Some(path) = source.strip_prefix("file://") {
        let from = PathBuf::from(path);
        let meta = tokio::fs::metadata(&from)
            .await
            .map_err(|e| FetchError::Source(format!("{source}: {e}")))?;
        if meta.is_dir() {
            return copy_tree(&from, &target).await;
        }
        let to = match into_dir {
            true => target.join(from.file_name().unwrap_or_default()),
            false => target,
        };
        let file = tokio::fs::File::open(&from)
            .await
            .map_err(|e| FetchError::Source(format!("{source}: {e}")))?;
        return write_file(file, &to, source).await;
    }
    if source.starts_with("https://") || source.starts_with("http://") {
        let response = http
            .get(source)
            .send()
            .await
            .map_err(|e| FetchError::Unreachable(format!("{source}: {e}")))?;
        let status = response.status();
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(FetchError::Unreachable(format!(
                "{source}: the server answered {status}"
            )));
        }
        if !status.is_success() {
            return Err(FetchError::Source(format!(
                "{source}: the server answered {status}"
            )));
        }
        let name = response
            .url()
            .path_segments()
            .and_then(|mut s| s.next_back().map(str::to_string))
            .filter(|n| !n.is_empty() && n != "." && n != "..")
            .unwrap_or_else(|| "index".into());
        let to = match into_dir {
            true => target.join(name),
            false => target,
        };
        use futures::TryStreamExt;
        let chunks = response
            .bytes_stream()
            .map_err(|e| FetchError::Unreachable(format!("{source}: {e}")));
        return write_chunks(chunks, &to).await;
    }
    if let Some(rest) = source.strip_prefix("s3://") {
        return copy_s3(source, rest, &target, into_dir).await;
    }
    if let Some(rest) = source.strip_prefix("hf://") {
        return copy_hf(http, source, rest, &target).await;
    }
    let scheme = source.split_once("://").map_or(source, |(s, _)| s);
    Err(FetchError::Invalid(format!(
        "{source}: {scheme}:// sources are not supported by this data mover yet (file://, http://, https://, s3:// and hf:// are)"
    )))
}

/// An S3 bucket, with the credentials, region and endpoint of the standard `AWS_*`
/// environment (`AWS_ENDPOINT_URL` for a server of one's own; plain HTTP is allowed
/// to an `http://` endpoint).
fn s3_bucket(bucket: &str) -> Result<object_store::aws::AmazonS3, FetchError> {
    let mut builder = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
    if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
        builder = builder
            .with_allow_http(endpoint.starts_with("http://"))
            .with_endpoint(endpoint);
    }
    builder
        .build()
        .map_err(|e| FetchError::Invalid(format!("s3://{bucket}: {e}")))
}

/// `s3://bucket/key` (one object) or `s3://bucket/prefix/` (every object under it, laid
/// out by the rest of its key).
async fn copy_s3(
    source: &str,
    rest: &str,
    target: &Path,
    into_dir: bool,
) -> Result<Copied, FetchError> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;

    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(FetchError::Invalid(format!("{source}: no bucket")));
    }
    let store = s3_bucket(bucket)?;
    let failed = |e: object_store::Error| match e {
        object_store::Error::NotFound { path, .. } => {
            FetchError::Source(format!("{source}: no object s3://{bucket}/{path}"))
        }
        object_store::Error::Generic { .. } => FetchError::Unreachable(format!("{source}: {e}")),
        e => FetchError::Source(format!("{source}: {e}")),
    };
    if !key.is_empty() && !key.ends_with('/') {
        let path = object_store::path::Path::from(key);
        let to = match into_dir {
            true => target.join(path.filename().unwrap_or("object")),
            false => target.to_path_buf(),
        };
        let got = store.get(&path).await.map_err(failed)?;
        return write_chunks(got.into_stream().map_err(failed), &to).await;
    }
    let prefix = object_store::path::Path::from(key.trim_end_matches('/'));
    let mut objects: Vec<object_store::ObjectMeta> = store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(failed)?;
    if objects.is_empty() {
        return Err(FetchError::Source(format!("{source}: no objects under it")));
    }
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    let mut manifest = Sha256::new();
    let mut bytes = 0u64;
    for object in objects {
        let relative: Vec<String> = object
            .location
            .prefix_match(&prefix)
            .map(|parts| parts.map(|p| p.as_ref().to_string()).collect())
            .unwrap_or_default();
        let rel = relative.join("/");
        let to = destination(target, &rel)?;
        let got = store.get(&object.location).await.map_err(failed)?;
        let copied = write_chunks(got.into_stream().map_err(failed), &to).await?;
        bytes += copied.bytes;
        manifest.update(format!("{}  {rel}\n", copied.digest).as_bytes());
    }
    Ok(Copied {
        bytes,
        digest: format!("sha256:{:x}", manifest.finalize()),
    })
}

/// `hf://ORG/MODEL[@REVISION]`: every file of a model repository at a revision (`main`
/// by default), through the Hub's HTTP file API at `HF_ENDPOINT` (by default
/// `https://huggingface.co`, so a mirror or a stand-in can serve), with `HF_TOKEN` as a
/// bearer token when it is set. Files keep their paths in the repository.
async fn copy_hf(
    http: &reqwest::Client,
    source: &str,
    rest: &str,
    target: &Path,
) -> Result<Copied, FetchError> {
    use futures::TryStreamExt;

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
    let endpoint = std::env::var("HF_ENDPOINT")
        .unwrap_or_else(|_| "https://huggingface.co".into())
        .trim_end_matches('/')
        .to_string();
    let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
    let get = |url: String| {
        let request = http.get(url);
        match &token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    };
    let answer = |what: &str, status: reqwest::StatusCode| -> FetchError {
        let why = format!("{source}: {what}: the Hub answered {status}");
        match status.is_server_error() || status.as_u16() == 429 {
            true => FetchError::Unreachable(why),
            false => FetchError::Source(why),
        }
    };
    let listing = get(format!(
        "{endpoint}/api/models/{repo}/tree/{revision}?recursive=true"
    ))
    .send()
    .await
    .map_err(|e| FetchError::Unreachable(format!("{source}: {e}")))?;
    if !listing.status().is_success() {
        return Err(answer("listing its files", listing.status()));
    }
    let entries: Vec<serde_json::Value> = listing.json().await.map_err(|e| {
        FetchError::Source(format!(
            "{source}: the file list is not what the Hub sends: {e}"
        ))
    })?;
    let mut files: Vec<String> = entries
        .iter()
        .filter(|e| e["type"] == "file")
        .filter_map(|e| e["path"].as_str().map(str::to_string))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(FetchError::Source(format!(
            "{source}: the repository has no files"
        )));
    }
    let mut manifest = Sha256::new();
    let mut bytes = 0u64;
    for path in files {
        let to = destination(target, &path)?;
        let response = get(format!("{endpoint}/{repo}/resolve/{revision}/{path}"))
            .send()
            .await
            .map_err(|e| FetchError::Unreachable(format!("{source}: {path}: {e}")))?;
        if !response.status().is_success() {
            return Err(answer(&path, response.status()));
        }
        let chunks = response
            .bytes_stream()
            .map_err(|e| FetchError::Unreachable(format!("{source}: {path}: {e}")));
        let copied = write_chunks(chunks, &to).await?;
        bytes += copied.bytes;
        manifest.update(format!("{}  {path}\n", copied.digest).as_bytes());
    }
    Ok(Copied {
        bytes,
        digest: format!("sha256:{:x}", manifest.finalize()),
    })
}

/// Writes a stream of chunks to `to`, hashing as it goes.
async fn write_chunks<S>(mut chunks: S, to: &Path) -> Result<Copied, FetchError>
where
    S: futures::Stream<Item = Result<bytes::Bytes, FetchError>> + Unpin,
{
    use futures::StreamExt;
    let (mut out, part) = create(to).await?;
    let mut hash = Sha256::new();
    let mut bytes = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        hash.update(&chunk);
        bytes += chunk.len() as u64;
        out.write_all(&chunk)
            .await
            .map_err(io(part.display().to_string()))?;
    }
    finish(out, &part, to).await?;
    Ok(Copied {
        bytes,
        digest: format!("sha256:{:x}", hash.finalize()),
    })
}

/// The file's part name while it is written: renamed to its own once whole.
fn part_of(to: &Path) -> PathBuf {
    let mut name = to.file_name().unwrap_or_default().to_os_string();
    name.push(".meridian-part");
    to.with_file_name(name)
}

async fn write_file(
    mut from: tokio::fs::File,
    to: &Path,
    source: &str,
) -> Result<Copied, FetchError> {
    let (mut out, part) = create(to).await?;
    let mut hash = Sha256::new();
    let mut bytes = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = from
            .read(&mut buf)
            .await
            .map_err(|e| FetchError::Source(format!("{source}: {e}")))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
        out.write_all(&buf[..n])
            .await
            .map_err(io(part.display().to_string()))?;
    }
    finish(out, &part, to).await?;
    Ok(Copied {
        bytes,
        digest: format!("sha256:{:x}", hash.finalize()),
    })
}

async fn create(to: &Path) -> Result<(tokio::fs::File, PathBuf), FetchError> {
    if let Some(dir) = to.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(io(dir.display().to_string()))?;
    }
    let part = part_of(to);
    let file = tokio::fs::File::create(&part)
        .await
        .map_err(io(part.display().to_string()))?;
    Ok((file, part))
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
async fn copy_tree(from: &Path, to: &Path) -> Result<Copied, FetchError> {
    let files = files_under(from).await?;
    let mut manifest = Sha256::new();
    let mut bytes = 0u64;
    for rel in &files {
        let source = from.join(rel);
        let file = tokio::fs::File::open(&source)
            .await
            .map_err(|e| FetchError::Source(format!("{}: {e}", source.display())))?;
        let copied = write_file(file, &to.join(rel), &source.display().to_string()).await?;
        bytes += copied.bytes;
        manifest.update(format!("{}  {}\n", copied.digest, rel.display()).as_bytes());
    }
    Ok(Copied {
        bytes,
        digest: format!("sha256:{:x}", manifest.finalize()),
    })
}

/// Copies `source_path` in the volume (a file, or a directory and all under it) out to
/// `destination` (`file://…` or `s3://bucket/key`; ending in `/`, or for a directory, a
/// place the files go under by their path in it).
pub async fn copy_out(
    volume_dir: &Path,
    source_path: &str,
    destination_uri: &str,
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
    let mut manifest = Sha256::new();
    let mut total = 0u64;
    let mut last = None;
    for (rel, path) in &files {
        let copied = if let Some(root) = destination_uri.strip_prefix("file://") {
            let to = match into_dir {
                true => destination(Path::new(root), rel)?,
                false => PathBuf::from(root),
            };
            let file = tokio::fs::File::open(path)
                .await
                .map_err(|e| FetchError::Source(format!("{}: {e}", path.display())))?;
            write_file(file, &to, &path.display().to_string()).await?
        } else if let Some(rest) = destination_uri.strip_prefix("s3://") {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            let key = match into_dir {
                true => format!("{}/{rel}", key.trim_end_matches('/'))
                    .trim_start_matches('/')
                    .to_string(),
                false => key.to_string(),
            };
            put_s3(destination_uri, bucket, &key, path).await?
        } else {
            let scheme = destination_uri
                .split_once("://")
                .map_or(destination_uri, |(s, _)| s);
            return Err(FetchError::Invalid(format!(
                "{destination_uri}: {scheme}:// destinations are not supported by this data mover yet (file:// and s3:// are)"
            )));
        };
        total += copied.bytes;
        manifest.update(format!("{}  {rel}\n", copied.digest).as_bytes());
        last = Some(copied);
    }
    match (meta.is_dir(), last) {
        (false, Some(one)) => Ok(one),
        _ => Ok(Copied {
            bytes: total,
            digest: format!("sha256:{:x}", manifest.finalize()),
        }),
    }
}

/// Uploads one file to `s3://bucket/key` in parts, hashing as it goes.
async fn put_s3(uri: &str, bucket: &str, key: &str, path: &Path) -> Result<Copied, FetchError> {
    use object_store::ObjectStore;
    if bucket.is_empty() || key.is_empty() {
        return Err(FetchError::Invalid(format!(
            "{uri}: a bucket and a key are needed"
        )));
    }
    let store = s3_bucket(bucket)?;
    let failed = |e: object_store::Error| match e {
        object_store::Error::Generic { .. } => FetchError::Unreachable(format!("{uri}: {e}")),
        e => FetchError::Source(format!("{uri}: {e}")),
    };
    let upload = store
        .put_multipart(&object_store::path::Path::from(key))
        .await
        .map_err(failed)?;
    let mut writer = object_store::WriteMultipart::new(upload);
    let mut file = tokio::fs::File::open(path)
        .await
        .map_err(|e| FetchError::Source(format!("{}: {e}", path.display())))?;
    let mut hash = Sha256::new();
    let mut bytes = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(io(path.display().to_string()))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        bytes += n as u64;
        writer.wait_for_capacity(4).await.map_err(failed)?;
        writer.write(&buf[..n]);
    }
    writer.finish().await.map_err(failed)?;
    Ok(Copied {
        bytes,
        digest: format!("sha256:{:x}", hash.finalize()),
    })
}

/// Every file under `dir`, by its path relative to it, sorted.
async fn files_under(dir: &Path) -> Result<Vec<PathBuf>, FetchError> {
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
            } else if kind.is_file() && !path.to_string_lossy().ends_with(".meridian-part") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}
