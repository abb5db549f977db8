//! Google Cloud Storage through its JSON API: object metadata and listings, downloads
//! (`alt=media`) and resumable uploads in parts. The `object_store` crate speaks GCS's
//! XML API for reads and writes, which the GCS emulator this project tests against
//! (`gcp-storage-emulator`) does not answer in full (no ETag, no HEAD); the JSON API is
//! served by both it and Google, so this path is the one tested. Credentials still come
//! from `object_store`'s provider (`GOOGLE_APPLICATION_CREDENTIALS`, a service account,
//! or the metadata server); `STORAGE_EMULATOR_HOST` points at an emulator and sends none.

use std::path::Path;

use futures::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::fetch::{Copied, FetchError, Progress, Reach};

/// One upload part: GCS wants multiples of 256 KiB.
const PART: usize = 32 * 256 * 1024;

/// One bucket.
#[derive(Debug)]
pub struct GcsBucket {
    http: reqwest::Client,
    /// `https://storage.googleapis.com`, or the emulator's.
    base: String,
    bucket: String,
    credentials: Option<object_store::gcp::GcpCredentialProvider>,
}

/// What the JSON API says of one object.
#[derive(Debug, Clone)]
pub struct GcsObject {
    pub name: String,
    pub size: u64,
    /// Its etag, generation and update time, which change when it is written.
    pub version: String,
}

/// An object name as one path segment of a URL.
fn encode(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl GcsBucket {
    /// The bucket `bucket`, at `STORAGE_EMULATOR_HOST` without credentials when that is
    /// set, else at Google with the credentials of the standard environment (or of the
    /// step's secret).
    pub fn from_env(uri: &str, bucket: &str, reach: &Reach) -> Result<GcsBucket, FetchError> {
        let http = reach.http().clone();
        if let Some(host) = reach.var("STORAGE_EMULATOR_HOST") {
            let base = match host.contains("://") {
                true => host,
                false => format!("http://{host}"),
            };
            return Ok(GcsBucket {
                http,
                base: base.trim_end_matches('/').to_string(),
                bucket: bucket.to_string(),
                credentials: None,
            });
        }
        let mut builder =
            object_store::gcp::GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
        for (key, value) in reach.store_config("GOOGLE_") {
            if let Ok(key) = key.parse() {
                builder = builder.with_config(key, value);
            }
        }
        let store = builder
            .build()
            .map_err(|e| FetchError::Invalid(format!("{uri}: {e}")))?;
        Ok(GcsBucket {
            http,
            base: "https://storage.googleapis.com".into(),
            bucket: bucket.to_string(),
            credentials: Some(store.credentials().clone()),
        })
    }

    async fn request(
        &self,
        uri: &str,
        method: reqwest::Method,
        url: String,
    ) -> Result<reqwest::RequestBuilder, FetchError> {
        let request = self.http.request(method, url);
        match &self.credentials {
            None => Ok(request),
            Some(provider) => {
                let credential = provider.get_credential().await.map_err(|e| {
                    FetchError::Unreachable(format!("{uri}: Google credentials: {e}"))
                })?;
                Ok(request.bearer_auth(&credential.bearer))
            }
        }
    }

    /// Sends, and reads the status: 404 names `what`; 5xx and 429 may pass if asked
    /// again.
    async fn send(
        uri: &str,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, FetchError> {
        let response = request
            .send()
            .await
            .map_err(|e| FetchError::Unreachable(format!("{uri}: {e}")))?;
        let status = response.status();
        if status.as_u16() == 404 {
            return Err(FetchError::Source(format!("{uri}: no object {what}")));
        }
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(FetchError::Unreachable(format!(
                "{uri}: Google Cloud Storage answered {status}"
            )));
        }
        if !status.is_success() && status.as_u16() != 308 {
            let body = response.text().await.unwrap_or_default();
            return Err(FetchError::Source(format!(
                "{uri}: Google Cloud Storage answered {status}: {}",
                body.chars().take(300).collect::<String>()
            )));
        }
        Ok(response)
    }

    fn object(v: &serde_json::Value) -> Option<GcsObject> {
        Some(GcsObject {
            name: v["name"].as_str()?.to_string(),
            size: v["size"].as_str()?.parse().ok()?,
            version: format!(
                "{} {} {}",
                v["etag"].as_str().unwrap_or_default(),
                v["generation"].as_str().unwrap_or_default(),
                v["updated"].as_str().unwrap_or_default()
            ),
        })
    }

    fn object_url(&self, name: &str) -> String {
        format!(
            "{}/storage/v1/b/{}/o/{}",
            self.base,
            encode(&self.bucket),
            encode(name)
        )
    }

    /// A JSON answer of the API at `url`; a 404 names `what`.
    async fn get_json(
        &self,
        uri: &str,
        what: &str,
        url: String,
    ) -> Result<serde_json::Value, FetchError> {
        let request = self.request(uri, reqwest::Method::GET, url).await?;
        Self::send(uri, what, request)
            .await?
            .json()
            .await
            .map_err(|e| FetchError::Unreachable(format!("{uri}: {e}")))
    }

    /// One object's metadata.
    pub async fn head(&self, uri: &str, name: &str) -> Result<GcsObject, FetchError> {
        let what = format!("gs://{}/{name}", self.bucket);
        let v = self.get_json(uri, &what, self.object_url(name)).await?;
        Self::object(&v)
            .ok_or_else(|| FetchError::Source(format!("{uri}: an object without a name or size")))
    }

    /// Every object whose name starts with `prefix`, page by page.
    pub async fn list(&self, uri: &str, prefix: &str) -> Result<Vec<GcsObject>, FetchError> {
        let mut objects = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut url = format!(
                "{}/storage/v1/b/{}/o?prefix={}",
                self.base,
                encode(&self.bucket),
                encode(prefix)
            );
            if let Some(token) = &page {
                url.push_str(&format!("&pageToken={}", encode(token)));
            }
            let v = self
                .get_json(uri, &format!("gs://{}", self.bucket), url)
                .await?;
            objects.extend(
                v["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Self::object),
            );
            match v["nextPageToken"].as_str() {
                Some(token) if !token.is_empty() => page = Some(token.to_string()),
                _ => return Ok(objects),
            }
        }
    }

    /// The object's bytes from `offset` on, as they arrive, and whether they start there
    /// (a server that ignores the range sends them all).
    pub async fn get(
        &self,
        uri: &str,
        name: &str,
        offset: u64,
    ) -> Result<
        (
            futures::stream::BoxStream<'static, Result<bytes::Bytes, FetchError>>,
            bool,
        ),
        FetchError,
    > {
        let what = format!("gs://{}/{name}", self.bucket);
        let url = format!("{}?alt=media", self.object_url(name));
        let mut request = self.request(uri, reqwest::Method::GET, url).await?;
        if offset > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={offset}-"));
        }
        let response = Self::send(uri, &what, request).await?;
        let from_offset = offset == 0 || response.status() == reqwest::StatusCode::PARTIAL_CONTENT;
        let uri = uri.to_string();
        let chunks = response
            .bytes_stream()
            .map_err(move |e| FetchError::Unreachable(format!("{uri}: {e}")))
            .boxed();
        Ok((chunks, from_offset))
    }

    /// Uploads the file at `path` as `name` in a resumable upload, part by part, hashing
    /// and counting as it goes.
    pub async fn put_file(
        &self,
        uri: &str,
        name: &str,
        path: &Path,
        progress: &Progress,
    ) -> Result<Copied, FetchError> {
        let local = |e: std::io::Error| FetchError::Io {
            what: path.display().to_string(),
            source: e,
        };
        let mut file = tokio::fs::File::open(path).await.map_err(local)?;
        let size = file.metadata().await.map_err(local)?.len();
        let what = format!("gs://{}/{name}", self.bucket);
        let start = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=resumable&name={}",
            self.base,
            encode(&self.bucket),
            encode(name)
        );
        let started = Self::send(
            uri,
            &what,
            self.request(uri, reqwest::Method::POST, start)
                .await?
                .header("content-type", "application/json")
                .body("{}"),
        )
        .await?;
        let session = started
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| FetchError::Source(format!("{uri}: no upload session was given")))?
            .to_string();
        let mut hash = Sha256::new();
        let mut sent = 0u64;
        let mut part = vec![0u8; PART];
        loop {
            let mut filled = 0;
            while filled < PART {
                let n = file.read(&mut part[filled..]).await.map_err(local)?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            let last = sent + filled as u64 >= size;
            let range = match (filled, last) {
                (0, _) => format!("bytes */{size}"),
                (_, true) => format!("bytes {sent}-{}/{size}", sent + filled as u64 - 1),
                (_, false) => format!("bytes {sent}-{}/*", sent + filled as u64 - 1),
            };
            hash.update(&part[..filled]);
            Self::send(
                uri,
                &what,
                self.request(uri, reqwest::Method::PUT, session.clone())
                    .await?
                    .header("content-range", range)
                    .body(part[..filled].to_vec()),
            )
            .await?;
            sent += filled as u64;
            progress.advance(filled as u64);
            if last {
                break;
            }
        }
        Ok(Copied {
            bytes: sent,
            digest: format!("sha256:{:x}", hash.finalize()),
            tree: false,
            files: Vec::new(),
        })
    }
}
