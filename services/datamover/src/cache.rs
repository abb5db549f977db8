//! The site cache: what the data mover fetched into a site's volumes, kept by content at
//! that site (`<volume root>/.meridian-cache`), so that the same input asked for again
//! is copied from there rather than fetched again.
//!
//! An entry is found by the source's URL and whether the step copies into a directory,
//! and holds only while the source's [`crate::fetch::fingerprint`] is unchanged; its files
//! are kept under their digest (`content/<sha256>/…`), so two sources with the same bytes
//! share them. A hit is copied into the volume, never linked (a job may write to its
//! inputs), and its digest is checked as it is copied: an entry that no longer matches
//! is dropped and the source is fetched.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::fetch::{self, Copied, FetchError, Progress};

/// One site's cache.
#[derive(Debug, Clone)]
pub struct SiteCache {
    dir: PathBuf,
}

/// What the cache holds for one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub digest: String,
    pub bytes: u64,
    tree: bool,
    /// (path under the step's target, digest).
    files: Vec<(String, String)>,
}

/// The name a file is kept under in its content directory: a tree's files by their
/// paths, a single file (whatever it is called in the volume) as `_`.
fn kept_name(tree: bool, rel: &str) -> &str {
    match tree {
        true => rel,
        false => "_",
    }
}

impl SiteCache {
    /// The cache of the site whose volumes live under `volume_root`.
    pub fn at(volume_root: &Path) -> SiteCache {
        SiteCache {
            dir: volume_root.join(".meridian-cache"),
        }
    }

    fn index(&self, source: &str, into_dir: bool) -> PathBuf {
        let key = Sha256::digest(format!("{source}\n{into_dir}").as_bytes());
        self.dir.join("index").join(format!("{key:x}.json"))
    }

    fn content(&self, digest: &str) -> PathBuf {
        self.dir.join("content").join(digest.replace(':', "-"))
    }

    /// The entry for `source` while the source still holds what it was fetched from
    /// (`fingerprint`), and its content is still here.
    pub async fn find(&self, source: &str, into_dir: bool, fingerprint: &str) -> Option<Entry> {
        let text = tokio::fs::read(self.index(source, into_dir)).await.ok()?;
        let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
        if v["source"] != source || v["fingerprint"] != fingerprint {
            return None;
        }
        let entry = Entry {
            digest: v["digest"].as_str()?.to_string(),
            bytes: v["bytes"].as_u64()?,
            tree: v["tree"].as_bool()?,
            files: v["files"]
                .as_array()?
                .iter()
                .map(|f| Some((f[0].as_str()?.to_string(), f[1].as_str()?.to_string())))
                .collect::<Option<Vec<_>>>()?,
        };
        tokio::fs::metadata(self.content(&entry.digest))
            .await
            .ok()?;
        Some(entry)
    }

    /// Copies the entry into `target`, checking each file's digest; a mismatch drops the
    /// entry and answers an error (the caller fetches instead).
    pub async fn restore(
        &self,
        source: &str,
        into_dir: bool,
        entry: &Entry,
        target: &Path,
        progress: &Progress,
    ) -> Result<Copied, FetchError> {
        progress.expect(entry.bytes);
        let content = self.content(&entry.digest);
        let mut copied = Vec::new();
        for (rel, digest) in &entry.files {
            let from = content.join(kept_name(entry.tree, rel));
            let to = match rel.is_empty() {
                true => target.to_path_buf(),
                false => fetch::destination(target, rel)?,
            };
            let file = tokio::fs::File::open(&from).await.map_err(|e| {
                FetchError::Source(format!("{} in the site cache: {e}", from.display()))
            })?;
            let one = fetch::write_file(file, &to, &from.display().to_string(), progress).await?;
            if one.digest != *digest {
                let _ = tokio::fs::remove_file(self.index(source, into_dir)).await;
                let _ = tokio::fs::remove_dir_all(&content).await;
                return Err(FetchError::Source(format!(
                    "{} in the site cache no longer holds {digest}; dropped",
                    from.display()
                )));
            }
            copied.push((rel.clone(), one));
        }
        let bytes = copied.iter().map(|(_, c)| c.bytes).sum();
        let digest = match entry.tree {
            true => {
                let mut manifest = Sha256::new();
                for (rel, c) in &copied {
                    manifest.update(format!("{}  {rel}\n", c.digest).as_bytes());
                }
                format!("sha256:{:x}", manifest.finalize())
            }
            false => copied
                .first()
                .map(|(_, c)| c.digest.clone())
                .unwrap_or_default(),
        };
        if digest != entry.digest {
            return Err(FetchError::Source(format!(
                "the site cache's copy of {source} is not {}",
                entry.digest
            )));
        }
        Ok(Copied {
            bytes,
            digest,
            tree: entry.tree,
            files: entry.files.clone(),
        })
    }

    /// Keeps what a fetch of `source` wrote under `target`, by its digest, and files it
    /// under the source's URL and `fingerprint`.
    pub async fn keep(
        &self,
        source: &str,
        into_dir: bool,
        fingerprint: &str,
        target: &Path,
        copied: &Copied,
    ) -> Result<(), FetchError> {
        let io = |what: &Path| {
            let what = what.display().to_string();
            move |source| FetchError::Io { what, source }
        };
        let content = self.content(&copied.digest);
        if tokio::fs::metadata(&content).await.is_err() {
            // Filled beside its name and renamed once whole, as files are.
            let part = content.with_extension("meridian-part");
            let _ = tokio::fs::remove_dir_all(&part).await;
            for (rel, _) in &copied.files {
                let from = match rel.is_empty() {
                    true => target.to_path_buf(),
                    false => target.join(rel),
                };
                let file = tokio::fs::File::open(&from).await.map_err(io(&from))?;
                let to = part.join(kept_name(copied.tree, rel));
                fetch::write_file(file, &to, &from.display().to_string(), &Progress::default())
                    .await?;
            }
            tokio::fs::create_dir_all(&part).await.map_err(io(&part))?;
            tokio::fs::rename(&part, &content)
                .await
                .map_err(io(&content))?;
        }
        let index = self.index(source, into_dir);
        let record = serde_json::json!({
            "source": source,
            "fingerprint": fingerprint,
            "digest": copied.digest,
            "bytes": copied.bytes,
            "tree": copied.tree,
            "files": copied.files,
        });
        if let Some(dir) = index.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(io(dir))?;
        }
        let part = index.with_extension("meridian-part");
        tokio::fs::write(&part, record.to_string())
            .await
            .map_err(io(&part))?;
        tokio::fs::rename(&part, &index).await.map_err(io(&index))
    }
}
