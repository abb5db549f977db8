//! The adapter registry's entry: each adapter crate describes its kind once (its name,
//! one line of help, and how to build it from its YAML configuration), and the binary
//! lists the entries in one table. `meridian up --adapter`, `meridian server adapter
//! --kind` and their `--help` come from that table, so a new adapter is one crate plus
//! one line there.

use std::path::PathBuf;
use std::sync::Arc;

use crate::{AdapterError, RunReports, SiteAdapter};

/// What the binary knows when it builds an adapter.
#[derive(Clone)]
pub struct BuildContext {
    /// A directory the adapter may keep state in when its configuration names none.
    pub state_dir: PathBuf,
    /// The runs' own reports, for sites whose machines report through the API (the
    /// cloud sites); none where this process keeps no store.
    pub run_reports: Option<Arc<dyn RunReports>>,
}

impl std::fmt::Debug for BuildContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildContext")
            .field("state_dir", &self.state_dir)
            .field("run_reports", &self.run_reports.is_some())
            .finish()
    }
}

/// Why an adapter could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The configuration does not parse; the message names the field.
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Adapter(#[from] AdapterError),
}

/// Builds an adapter from the text of its YAML configuration.
pub type Build = fn(&str, &BuildContext) -> Result<Arc<dyn SiteAdapter>, BuildError>;

/// One kind of site adapter.
#[derive(Clone, Copy)]
pub struct Registration {
    /// The kind's name, as in `--adapter NAME=KIND:FILE` and `--kind KIND`.
    pub kind: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    /// Whether it needs a configuration file (a cluster's address, credentials...).
    pub needs_config: bool,
    /// Builds the adapter from the text of its YAML configuration (empty when none was
    /// given and it needs none).
    pub build: Build,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("kind", &self.kind)
            .field("needs_config", &self.needs_config)
            .finish()
    }
}

/// Parses an adapter's YAML configuration into its config type; errors name the field.
pub fn parse_config<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, BuildError> {
    let text = if text.trim().is_empty() { "{}" } else { text };
    serde_saphyr::from_str(text).map_err(|e| BuildError::Config(e.to_string()))
}
