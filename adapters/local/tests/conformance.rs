//! The local adapter against the shared conformance kit, with real processes: each check
//! on a new state directory, every `open` a new adapter instance on it (a restart).

use std::sync::Arc;

use meridian_adapter_core::conformance::{ConformanceOptions, Harness, Open};
use meridian_adapter_core::SiteAdapter;
use meridian_adapter_local::{LocalAdapter, LocalConfig};

mod common;

fn fresh() -> Harness {
    let tmp = tempfile::tempdir().expect("tempdir");
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir(&scratch).expect("scratch dir");
    let root = tmp.path().join("site");
    // Dropped with the harness when the check ends: jobs first, then the directory.
    let state = Arc::new((common::KillLeftovers { root: root.clone() }, tmp));
    let open: Open = Arc::new(move || {
        let (_state, root) = (state.clone(), root.clone());
        Box::pin(async move {
            let adapter = LocalAdapter::new(LocalConfig::new(root)).expect("open local site");
            Arc::new(adapter) as Arc<dyn SiteAdapter>
        })
    });
    Harness {
        open,
        options: ConformanceOptions::new(scratch),
    }
}

meridian_adapter_core::conformance_suite!(fresh());
