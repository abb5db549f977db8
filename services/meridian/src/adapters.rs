//! The adapter registry: every kind of site this binary can run, one line each. A new
//! adapter crate exports its `REGISTRATION`; adding it here (behind its cargo feature
//! when it brings a heavy SDK) is all the binary needs. `docs/writing-a-site-adapter.md`
//! walks through it.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use meridian_adapter_core::{
    AdapterError, BuildContext, Logs, Registration, RunReport, RunReports, SiteAdapter,
};
use meridian_store::{run_reports, Store};
use uuid::Uuid;

/// The kinds this build can run.
pub fn registry() -> Vec<Registration> {
    #[allow(unused_mut)] // extended below by features
    let mut kinds = vec![
        meridian_adapter_local::REGISTRATION,
        meridian_adapter_slurm::REGISTRATION,
        meridian_adapter_pbs::REGISTRATION,
    ];
    // A kind with a heavy SDK joins behind its feature.
    #[cfg(feature = "site-kubernetes")]
    kinds.push(meridian_adapter_kubernetes::REGISTRATION);
    #[cfg(feature = "site-aws")]
    kinds.push(meridian_adapter_aws::REGISTRATION);
    #[cfg(feature = "site-oci")]
    kinds.push(meridian_adapter_oci::REGISTRATION);
    #[cfg(feature = "site-azure")]
    kinds.push(meridian_adapter_azure::REGISTRATION);
    #[cfg(feature = "site-gcp")]
    kinds.push(meridian_adapter_gcp::REGISTRATION);
    kinds
}

/// The registration of `kind`, or an error listing the kinds there are.
pub fn find(kind: &str) -> anyhow::Result<Registration> {
    registry()
        .into_iter()
        .find(|r| r.kind == kind)
        .with_context(|| {
            // The kinds that sit behind a cargo feature, so that the error says how to get them.
            let feature = match kind {
                "kubernetes" => Some("site-kubernetes"),
                "aws" => Some("site-aws"),
                "oci" => Some("site-oci"),
                "azure" => Some("site-azure"),
                "gcp" => Some("site-gcp"),
                _ => None,
            };
            format!(
                "no adapter of kind {kind:?} in this build; the kinds are: {}{}",
                names().join(", "),
                feature
                    .map(|f| format!(
                        " ({kind} needs a build with `cargo build --release -p meridian --features {f}`)"
                    ))
                    .unwrap_or_default()
            )
        })
}

pub fn names() -> Vec<&'static str> {
    registry().iter().map(|r| r.kind).collect()
}

/// The kinds with a line each, for `--help`.
pub fn help() -> String {
    let mut text = String::from("The adapter kinds of this build:");
    for r in registry() {
        let config = if r.needs_config {
            "needs a configuration file"
        } else {
            "configuration file optional"
        };
        text.push_str(&format!("\n  {:<10} {} ({config})", r.kind, r.about));
    }
    text
}

/// Builds an adapter of `kind` from its configuration file, if any. An adapter that
/// keeps state and whose file names no place for it keeps it in `state_dir`.
pub fn build(
    kind: &str,
    config: Option<&Path>,
    state_dir: &Path,
    store: &Store,
) -> anyhow::Result<Arc<dyn SiteAdapter>> {
    let registration = find(kind)?;
    let text = match config {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        None if registration.needs_config => anyhow::bail!(
            "a {kind} site needs its adapter's configuration file (see docs/site-{kind}.md)"
        ),
        None => String::new(),
    };
    let context = BuildContext {
        state_dir: state_dir.to_path_buf(),
        run_reports: Some(Arc::new(StoreRunReports(store.clone()))),
    };
    (registration.build)(&text, &context).with_context(|| match config {
        Some(path) => format!(
            "{}: not a valid {kind} adapter configuration",
            path.display()
        ),
        None => format!("building the {kind} adapter"),
    })
}

/// The runs' own reports, as the API keeps them in the store.
struct StoreRunReports(Store);

#[async_trait]
impl RunReports for StoreRunReports {
    async fn read(&self, job_id: Uuid) -> Result<Option<RunReport>, AdapterError> {
        let row = run_reports::read(&self.0, &job_id.to_string())
            .await
            .map_err(|e| AdapterError::Unavailable(format!("reading the run's report: {e}")))?;
        let time = |t: Option<String>| {
            t.and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                .map(|t| t.with_timezone(&Utc))
        };
        Ok(row.map(|row| RunReport {
            started_at: time(row.started_at),
            ended_at: time(row.ended_at),
            exit_code: row.exit_code.and_then(|c| i32::try_from(c).ok()),
            logs: Logs {
                stdout: row.stdout,
                stderr: row.stderr,
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_with_its_help() {
        let names = names();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for name in ["local", "slurm", "pbs"] {
            assert!(names.contains(&name), "{names:?}");
            assert!(help().contains(name));
        }
        let err = find("nomad").unwrap_err().to_string();
        assert!(err.contains("local, slurm, pbs"), "{err}");
        assert_eq!(
            names.contains(&"kubernetes"),
            cfg!(feature = "site-kubernetes"),
            "{names:?}"
        );
        assert_eq!(
            names.contains(&"aws"),
            cfg!(feature = "site-aws"),
            "{names:?}"
        );
        assert_eq!(
            names.contains(&"oci"),
            cfg!(feature = "site-oci"),
            "{names:?}"
        );
        assert_eq!(
            names.contains(&"azure"),
            cfg!(feature = "site-azure"),
            "{names:?}"
        );
        assert_eq!(
            names.contains(&"gcp"),
            cfg!(feature = "site-gcp"),
            "{names:?}"
        );
    }

    #[tokio::test]
    async fn a_kind_that_needs_a_configuration_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::connect(&format!(
            "sqlite://{}",
            tmp.path().join("s.sqlite").display()
        ))
        .await
        .unwrap();
        let err = match build("slurm", None, tmp.path(), &store) {
            Ok(_) => panic!("built a slurm adapter without its configuration"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("needs its adapter's configuration"), "{err}");
    }
}
