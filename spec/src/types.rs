//! The typed workflow spec v1. These types are what a valid document becomes; the
//! JSON Schema in `schemas/workflow.schema.json` is generated from them.
//!
//! They derive `Deserialize` for callers that trust their input (for example a workflow read
//! back from the event log), but user documents go through [`crate::parse`], which checks
//! every rule and reports every problem with its field path.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::units::{Money, Size, Walltime};

/// A whole workflow document, `version: v1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [
    {"required": ["jobs"], "properties": {"jobs": {"minProperties": 1}}},
    {"required": ["services"], "properties": {"services": {"minProperties": 1}}}
]))]
pub struct Workflow {
    /// Always `v1` for this shape.
    pub version: SpecVersion,
    /// A short name: letters, digits, `-`, `_` and `.`, at most 63 characters.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[A-Za-z0-9._-]+$"))]
    pub name: String,
    /// Free-form labels carried onto events and bills. Keys: 1 to 63 letters, digits, `.`,
    /// `_`, `-` or `/`; values: at most 255 characters (numbers and booleans are taken as text).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "propertyNames" = {"pattern": "^[A-Za-z0-9._/-]{1,63}$"},
        "additionalProperties" = {"type": ["string", "number", "boolean"]}
    ))]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub placement: Placement,
    /// Named volumes that jobs and services mount.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"pattern": "^[A-Za-z0-9_-]{1,63}$"}))]
    pub volumes: BTreeMap<String, Volume>,
    /// Batch jobs by name. Job and service names share one namespace.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"pattern": "^[A-Za-z0-9_-]{1,63}$"}))]
    pub jobs: BTreeMap<String, Job>,
    /// Long-running services by name. A workflow has at least one job or service.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("propertyNames" = {"pattern": "^[A-Za-z0-9_-]{1,63}$"}))]
    pub services: BTreeMap<String, Service>,
}

/// The spec version a document is written against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SpecVersion {
    #[serde(rename = "v1")]
    V1,
}

/// Placement hints for the whole workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    #[serde(default)]
    pub prefer: Preference,
    /// Allow-list of site names; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)))]
    pub sites: Vec<String>,
    /// Allow-list of regions; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)))]
    pub regions: Vec<String>,
    /// Data must stay in this jurisdiction (for example `eu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub residency: Option<String>,
    /// A cap on the whole workflow's cost, such as `500 USD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Money>,
    /// May run on preemptible (spot) capacity.
    #[serde(default)]
    pub spot: bool,
    /// Jobs may run at different sites, each where it costs least counting the volumes
    /// it must receive from the sites of the jobs before it. Chosen only when cheaper than
    /// any one site, or when no one site can run every job.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub split: bool,
}

/// What placement optimises for: total estimated cost, or expected time to finish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Preference {
    #[default]
    Cheapest,
    Fastest,
}

/// A named volume with the data steps that fill and drain it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Volume {
    /// Capacity to provision; greater than zero.
    pub size: Size,
    /// Copied in before any job that mounts the volume starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<DataStep>,
    /// Copied out after the last job that mounts the volume ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<DataStep>,
}

/// One copy: a URI (`s3://`, `gs://`, `az://`, `hf://`, `https://`, `http://`, `file://`) to an
/// absolute path in the volume (ingress), or an absolute path in the volume to a URI (egress).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataStep {
    #[schemars(length(min = 1))]
    pub source: String,
    #[schemars(length(min = 1))]
    pub destination: String,
    /// The secret that holds this copy's credentials, by its name in the data mover's
    /// secrets file (`meridian up --secrets FILE`); without one, the data mover's own
    /// environment. The secret's values never enter the workflow or the log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,63}$"))]
    pub credentials: Option<String>,
}

/// A batch job: runs to completion, optionally as a task array.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Jobs (or services) that must finish (or be up) first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[A-Za-z0-9_-]{1,63}$")))]
    pub requires: Vec<String>,
    /// `host`, or an image reference such as `docker://python:3.12`.
    pub image: Image,
    /// The program and its arguments, as a list. `${ARRAY_INDEX}` is replaced by the task's
    /// index in its array.
    #[schemars(length(min = 1), extend("prefixItems" = [{"type": "string", "minLength": 1}]))]
    pub command: Vec<String>,
    /// Environment variables. Numbers and booleans are taken as their text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "propertyNames" = {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "additionalProperties" = {"type": ["string", "number", "boolean"]}
    ))]
    pub env: BTreeMap<String, String>,
    /// Working directory; an absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^/"))]
    pub cwd: Option<String>,
    /// Volume name → absolute mount path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "propertyNames" = {"pattern": "^[A-Za-z0-9_-]{1,63}$"},
        "additionalProperties" = {"type": "string", "pattern": "^/"}
    ))]
    pub mounts: BTreeMap<String, String>,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<TaskArray>,
    /// Options for a Slurm site: used when the job runs at one, ignored by every other
    /// kind of site (placement does not choose by them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmOptions>,
}

/// What a job asks of a Slurm site beyond its resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmOptions {
    /// The partition (`sbatch --partition`), instead of the site's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,63}$"))]
    pub partition: Option<String>,
    /// The quality of service (`sbatch --qos`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,63}$"))]
    pub qos: Option<String>,
}

/// A long-running endpoint, such as an inference server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// Jobs (or services) that must finish (or be up) first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[A-Za-z0-9_-]{1,63}$")))]
    pub requires: Vec<String>,
    /// `host`, or an image reference such as `docker://vllm/vllm-openai:latest`.
    pub image: Image,
    /// The program and its arguments, as a list.
    #[schemars(length(min = 1), extend("prefixItems" = [{"type": "string", "minLength": 1}]))]
    pub command: Vec<String>,
    /// Environment variables. Numbers and booleans are taken as their text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "propertyNames" = {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "additionalProperties" = {"type": ["string", "number", "boolean"]}
    ))]
    pub env: BTreeMap<String, String>,
    /// Working directory; an absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^/"))]
    pub cwd: Option<String>,
    /// Volume name → absolute mount path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "propertyNames" = {"pattern": "^[A-Za-z0-9_-]{1,63}$"},
        "additionalProperties" = {"type": "string", "pattern": "^/"}
    ))]
    pub mounts: BTreeMap<String, String>,
    /// The TCP port the service listens on.
    #[schemars(range(min = 1))]
    pub port: u16,
    #[serde(default)]
    pub replicas: Replicas,
    #[serde(default)]
    pub resources: Resources,
}

/// `host` runs the command on the site's host; anything else is a container image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    Host,
    /// Full reference with its scheme, e.g. `docker://python:3.12`.
    Container(String),
}

/// How many copies of a service run: at least `min`, scaled up to `max` (`min ≤ max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Replicas {
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub min: u32,
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub max: u32,
}

impl Default for Replicas {
    fn default() -> Self {
        Replicas { min: 1, max: 1 }
    }
}

/// `{start, end, parallelism}`: tasks `start..=end`, at most `parallelism` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskArray {
    /// First index, inclusive.
    #[schemars(range(max = 4294967295u32))]
    pub start: u32,
    /// Last index, inclusive; at least `start`, and at most 1,000,000 tasks in all.
    #[schemars(range(max = 4294967295u32))]
    pub end: u32,
    /// Most tasks running at once.
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub parallelism: u32,
}

impl TaskArray {
    /// Number of tasks, `end - start + 1`. Saturates rather than overflowing so that a
    /// hand-built array that `parse` would reject cannot panic here.
    pub fn len(&self) -> u32 {
        if self.end < self.start {
            0
        } else {
            (self.end - self.start).saturating_add(1)
        }
    }

    /// True only for a hand-built array with `end < start`; `parse` never yields one.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Nodes, each with the resources below.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub nodes: u32,
    /// CPUs per node.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub cpus: u32,
    /// Memory per node.
    #[serde(default = "default_memory")]
    pub memory: Size,
    /// Longest a task may run.
    #[serde(default = "default_walltime")]
    pub walltime: Walltime,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Gpus>,
}

fn one() -> u32 {
    1
}
fn default_memory() -> Size {
    Size::from_bytes(2 * 1024 * 1024 * 1024)
}
fn default_walltime() -> Walltime {
    Walltime::from_secs(3600)
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            nodes: 1,
            cpus: 1,
            memory: default_memory(),
            walltime: default_walltime(),
            gpus: None,
        }
    }
}

/// Accelerators per node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gpus {
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub count: u32,
    #[serde(default)]
    pub vendor: GpuVendor,
    /// e.g. `H100`, `A100`, `MI300X`; any model when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub model: Option<String>,
    /// Minimum memory per GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Size>,
}

/// Accelerator vendor: `nvidia` (CUDA), `amd` (ROCm), or `any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum GpuVendor {
    Nvidia,
    Amd,
    #[default]
    Any,
}

// ---------------------------------------------------------------------------------------------
// Image: one string in the document, `host` or a reference with its scheme.
// ---------------------------------------------------------------------------------------------

/// Schemes an image reference may use.
pub const IMAGE_SCHEMES: [&str; 3] = ["docker://", "oras://", "library://"];

/// Why a string is not an [`Image`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("an image cannot be empty")]
    Empty,
    #[error("it has no scheme; did you mean {0:?}?")]
    NoScheme(String),
    #[error("unsupported scheme {0:?}; images use docker://, oras:// or library://")]
    UnknownScheme(String),
    #[error("nothing follows the scheme {0:?}")]
    MissingReference(String),
    #[error("an image reference cannot contain spaces or control characters")]
    Whitespace,
    #[error("a .sif image must be an absolute path, such as /images/pytorch.sif")]
    RelativeSif,
}

impl Image {
    /// The text as written in a document: `host` or the full reference.
    pub fn as_str(&self) -> &str {
        match self {
            Image::Host => "host",
            Image::Container(reference) => reference,
        }
    }

    pub fn is_host(&self) -> bool {
        matches!(self, Image::Host)
    }
}

impl FromStr for Image {
    type Err = ImageError;

    fn from_str(s: &str) -> Result<Self, ImageError> {
        if s.is_empty() {
            return Err(ImageError::Empty);
        }
        if s == "host" {
            return Ok(Image::Host);
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ImageError::Whitespace);
        }
        if let Some(scheme) = IMAGE_SCHEMES.iter().find(|p| s.starts_with(*p)) {
            if s.len() == scheme.len() {
                return Err(ImageError::MissingReference(scheme.to_string()));
            }
            return Ok(Image::Container(s.to_string()));
        }
        // An absolute path is a path, whatever it holds.
        if s.starts_with('/') && s.ends_with(".sif") && s.len() > "/.sif".len() {
            return Ok(Image::Container(s.to_string()));
        }
        if let Some(at) = s.find("://") {
            return Err(ImageError::UnknownScheme(s[..at + 3].to_string()));
        }
        if s.ends_with(".sif") {
            return Err(ImageError::RelativeSif);
        }
        Err(ImageError::NoScheme(format!("docker://{s}")))
    }
}

impl fmt::Display for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Image {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Image {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        text.parse().map_err(de::Error::custom)
    }
}

impl JsonSchema for Image {
    fn schema_name() -> Cow<'static, str> {
        "Image".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": r"^(host|(docker|oras|library)://[^\s\x00-\x1f\x7f-\x9f]+|/[^\s\x00-\x1f\x7f-\x9f]+\.sif)$",
            "description": "`host` to run on the site's host, an image reference with its scheme (docker://, oras://, library://), or an absolute path to a .sif file.",
            "examples": ["host", "docker://python:3.12", "oras://ghcr.io/org/image:1.0", "/images/pytorch.sif"],
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

impl Workflow {
    /// All job and service names in an order that respects `requires`: everything a step
    /// requires comes before it. Among steps that are ready at the same time the order is by
    /// name, so the result is deterministic.
    ///
    /// A workflow from [`crate::parse`] has no cycles. For a hand-built one that does, the
    /// steps on or behind a cycle come last, by name, so every step is still listed once.
    pub fn job_order(&self) -> Vec<&str> {
        let graph: BTreeMap<&str, Vec<&str>> = self
            .jobs
            .iter()
            .map(|(name, job)| (name.as_str(), &job.requires))
            .chain(self.services.iter().map(|(n, s)| (n.as_str(), &s.requires)))
            .map(|(name, requires)| (name, requires.iter().map(String::as_str).collect()))
            .collect();
        crate::graph::topological_order(&graph)
    }

    /// The names a job or service requires, or `None` when there is no step by that name.
    pub fn requires_of(&self, name: &str) -> Option<&[String]> {
        self.jobs
            .get(name)
            .map(|job| job.requires.as_slice())
            .or_else(|| self.services.get(name).map(|s| s.requires.as_slice()))
    }

    /// The volumes a job or service mounts, by name (none for an unknown step).
    pub fn mounts_of(&self, name: &str) -> impl Iterator<Item = &str> {
        self.jobs
            .get(name)
            .map(|job| &job.mounts)
            .or_else(|| self.services.get(name).map(|s| &s.mounts))
            .into_iter()
            .flat_map(|m| m.keys().map(String::as_str))
    }

    /// How many tasks a job runs: its array's length, or 1. Zero when there is no job by that
    /// name (services are not counted as tasks).
    pub fn task_count(&self, job: &str) -> u32 {
        self.jobs.get(job).map_or(0, Job::task_count)
    }

    /// Tasks across all jobs.
    pub fn total_tasks(&self) -> u64 {
        self.jobs
            .values()
            .map(|job| u64::from(job.task_count()))
            .sum()
    }
}

impl FromStr for Workflow {
    type Err = crate::SpecErrors;

    /// Same as [`crate::parse`].
    fn from_str(doc: &str) -> Result<Self, crate::SpecErrors> {
        crate::parse(doc)
    }
}

impl Job {
    /// Its array's length, or 1 for a plain job.
    pub fn task_count(&self) -> u32 {
        self.array.as_ref().map_or(1, TaskArray::len)
    }
}

impl Resources {
    /// GPUs per node, zero when none are requested.
    pub fn gpus_per_node(&self) -> u32 {
        self.gpus.as_ref().map_or(0, |g| g.count)
    }

    /// GPUs over all its nodes.
    pub fn gpus_total(&self) -> u32 {
        self.nodes.saturating_mul(self.gpus_per_node())
    }
}

impl GpuVendor {
    pub const ALL: [GpuVendor; 3] = [GpuVendor::Nvidia, GpuVendor::Amd, GpuVendor::Any];

    /// The spelling used in documents.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuVendor::Nvidia => "nvidia",
            GpuVendor::Amd => "amd",
            GpuVendor::Any => "any",
        }
    }
}

impl Preference {
    pub const ALL: [Preference; 2] = [Preference::Cheapest, Preference::Fastest];

    /// The spelling used in documents.
    pub fn as_str(self) -> &'static str {
        match self {
            Preference::Cheapest => "cheapest",
            Preference::Fastest => "fastest",
        }
    }
}
