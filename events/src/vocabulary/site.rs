//! Events of the Site aggregate: what the federation knows of one site, and its prices.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::SiteKind;
use crate::money::PriceSheet;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum SiteEvent {
    #[serde(rename = "site.registered.v1")]
    Registered {
        name: String,
        kind: SiteKind,
        region: String,
        /// The legal jurisdiction its data sits in (e.g. `eu`), for residency rules.
        jurisdiction: String,
        /// The name of the secret holding its credentials; never the secret itself.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credentials_secret: Option<String>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        labels: BTreeMap<String, String>,
    },

    /// A new price sheet applies from its `effective_from`; earlier decisions keep the
    /// rates they captured.
    #[serde(rename = "site.prices_changed.v1")]
    PricesChanged { prices: PriceSheet },

    #[serde(rename = "site.health_reported.v1")]
    HealthReported {
        healthy: bool,
        capacity: Capacity,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        observed_at: DateTime<Utc>,
    },

    /// The shapes (instance types, partitions) the site offers now; replaces the set
    /// declared before. Placement fits each job to one of them.
    #[serde(rename = "site.shapes_declared.v1")]
    ShapesDeclared { shapes: Vec<Shape> },

    /// An admin asked the site's adapter to read its shapes' figures (CPUs, memory,
    /// GPUs) from the provider again (`meridian site refresh`).
    #[serde(rename = "site.shapes_refresh_requested.v1")]
    ShapesRefreshRequested {
        by: String,
        requested_at: DateTime<Utc>,
    },

    /// The adapter read its shapes from the provider: what changed, or why it could
    /// not. Changed shapes are declared in a `site.shapes_declared.v1` before this.
    #[serde(rename = "site.shapes_refreshed.v1")]
    ShapesRefreshed {
        outcome: String,
        refreshed_at: DateTime<Utc>,
    },

    /// Data sets the site holds at origin (a bucket in its region, a shared file
    /// system); replaces the set declared before. Copies made later are known from
    /// `transfer.completed.v1`.
    #[serde(rename = "site.datasets_declared.v1")]
    DatasetsDeclared { datasets: Vec<Dataset> },

    /// The GPUs the site's adapter found on its machine (the local site), when they
    /// changed; replaces the list before.
    #[serde(rename = "site.devices_reported.v1")]
    DevicesReported { devices: Vec<Device> },

    /// A device gets no new work: its health check found a fault (`fault`: it counts
    /// against the site's reliability), or an admin (`by`) took it out.
    #[serde(rename = "site.device_cordoned.v1")]
    DeviceCordoned {
        device: String,
        model: String,
        reason: String,
        by: String,
        fault: bool,
        cordoned_at: DateTime<Utc>,
    },

    /// An admin gave a cordoned device back to the site's work.
    #[serde(rename = "site.device_uncordoned.v1")]
    DeviceUncordoned {
        device: String,
        by: String,
        uncordoned_at: DateTime<Utc>,
    },

    /// An admin took the site out of placement.
    #[serde(rename = "site.drained.v1")]
    Drained {
        by: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        drained_at: DateTime<Utc>,
    },

    #[serde(rename = "site.undrained.v1")]
    Undrained {
        by: String,
        undrained_at: DateTime<Utc>,
    },

    /// An adapter process serves the site now and will say so again within `ttl_secs`:
    /// until then the site is connected. Placement only chooses connected sites.
    #[serde(rename = "site.heartbeat.v1")]
    Heartbeat {
        /// The adapter kind serving it (`local`, `slurm`, ...).
        adapter: String,
        /// The adapter process, new at each start.
        instance: uuid::Uuid,
        ttl_secs: u64,
        observed_at: DateTime<Utc>,
        /// The most tasks of an array the adapter takes as one submission (the site
        /// then enforces the array's cap); `None`: one task at a time.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arrays: Option<u32>,
    },

    /// The adapter process that served the site stopped cleanly.
    #[serde(rename = "site.disconnected.v1")]
    Disconnected {
        instance: uuid::Uuid,
        observed_at: DateTime<Utc>,
    },
}

impl SiteEvent {
    /// The versioned tag this event serializes with.
    pub fn kind(&self) -> &'static str {
        match self {
            SiteEvent::Registered { .. } => "site.registered.v1",
            SiteEvent::PricesChanged { .. } => "site.prices_changed.v1",
            SiteEvent::HealthReported { .. } => "site.health_reported.v1",
            SiteEvent::ShapesDeclared { .. } => "site.shapes_declared.v1",
            SiteEvent::DatasetsDeclared { .. } => "site.datasets_declared.v1",
            SiteEvent::ShapesRefreshRequested { .. } => "site.shapes_refresh_requested.v1",
            SiteEvent::ShapesRefreshed { .. } => "site.shapes_refreshed.v1",
            SiteEvent::DevicesReported { .. } => "site.devices_reported.v1",
            SiteEvent::DeviceCordoned { .. } => "site.device_cordoned.v1",
            SiteEvent::DeviceUncordoned { .. } => "site.device_uncordoned.v1",
            SiteEvent::Drained { .. } => "site.drained.v1",
            SiteEvent::Undrained { .. } => "site.undrained.v1",
            SiteEvent::Heartbeat { .. } => "site.heartbeat.v1",
            SiteEvent::Disconnected { .. } => "site.disconnected.v1",
        }
    }
}

/// A site's free capacity when it reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    pub idle_nodes: u32,
    pub free_cpus: u64,
    pub free_gpus: u32,
    /// Free GPUs by the catalogue's model name, where the site tells models apart.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub free_gpus_by_model: BTreeMap<String, u32>,
    /// Jobs queued at the site, ours and others'.
    pub pending_jobs: u32,
}

/// One kind of node a site offers: a cloud instance type, or an HPC partition's node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// The site's name for it: `p5.48xlarge`, `gpu` (a partition).
    pub name: String,
    /// The compute offer in the site's price sheet that prices it.
    pub offer: String,
    /// Its spot (preemptible) offer, where the site has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_offer: Option<String>,
    pub cpus: u32,
    pub memory_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<ShapeGpus>,
    /// How many of these nodes one job may use.
    #[serde(default = "one")]
    pub max_nodes: u32,
    /// The longest job it runs, when limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_walltime_secs: Option<u64>,
}

fn one() -> u32 {
    1
}

/// The accelerators on one node of a shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeGpus {
    pub count: u32,
    pub vendor: super::AcceleratorVendor,
    pub model: String,
    pub memory_bytes: u64,
}

/// One GPU of a site's machine, as its adapter found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// How the site tells it apart: the UUID jobs are given it by (`GPU-…`).
    pub id: String,
    pub vendor: super::AcceleratorVendor,
    /// The catalogue's model name (`H100`), or the product name for one it does not know.
    pub model: String,
    pub memory_bytes: u64,
}

/// A data set known by where it can be read from and what its bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dataset {
    /// Where workflows name it from, e.g. `s3://datasets/imagenet-mini/`.
    pub uri: String,
    /// `"<algorithm>:<hex>"`: the same bytes anywhere have the same digest.
    pub digest: String,
    pub bytes: u64,
}
