//! The versioned event vocabulary: one serde-tagged enum per aggregate, the top-level
//! [`Event`] over them, and the small value types they share.
//!
//! Tags are `"<aggregate>.<fact>.v<N>"`. A tag, once written to a log, is forever: change
//! an event's meaning by adding a `.v2` variant next to the old one, never by editing it.
//! Events carry every number a bill or a replay needs and never a secret (only names).

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::envelope::AggregateKind;

pub mod job;
pub mod site;
pub mod tenant;
pub mod token;
pub mod transfer;
pub mod workflow;

pub use job::JobEvent;
pub use site::SiteEvent;
pub use tenant::TenantEvent;
pub use token::TokenEvent;
pub use transfer::TransferEvent;
pub use workflow::WorkflowEvent;

/// One step of a workflow's DAG: a job, or one task of a job's array.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskRef {
    pub job: String,
    /// The array index, for a task of an array job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
}

impl TaskRef {
    pub fn new(job: impl Into<String>, index: Option<u32>) -> TaskRef {
        TaskRef {
            job: job.into(),
            index,
        }
    }
}

/// Tasks of one array released together, to go to their site as one submission (a Slurm
/// `--array`, a PBS `-J`): the site holds them in its queue and runs at most `cap` at
/// once. Every task of the batch carries it, in its release and its dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayBatch {
    /// The same for every task of the batch; the site's submission is tagged with it.
    pub id: uuid::Uuid,
    /// This task's place in the batch, from 0, in index order.
    pub position: u32,
    /// How many tasks the batch holds.
    pub size: u32,
    /// At most this many of them run at once; the site enforces it.
    pub cap: u32,
}

/// The most tasks one batch may hold: each is an event in one commit, and a site's
/// script maps each to its job.
pub const MAX_ARRAY_BATCH: u32 = 1000;

impl fmt::Display for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}[{}]", self.job, i),
            None => f.write_str(&self.job),
        }
    }
}

/// The kinds of site Meridian has adapters for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SiteKind {
    Local,
    Slurm,
    Pbs,
    Kubernetes,
    Coreweave,
    Aws,
    Gcp,
    Azure,
    Oci,
}

impl SiteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SiteKind::Local => "local",
            SiteKind::Slurm => "slurm",
            SiteKind::Pbs => "pbs",
            SiteKind::Kubernetes => "kubernetes",
            SiteKind::Coreweave => "coreweave",
            SiteKind::Aws => "aws",
            SiteKind::Gcp => "gcp",
            SiteKind::Azure => "azure",
            SiteKind::Oci => "oci",
        }
    }
}

impl fmt::Display for SiteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where bytes are: at a federated site, or in a region (an object store's, say
/// `aws:us-east-1`). The data-locality map and egress both speak this.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Location {
    Site { site: String },
    Region { region: String },
}

/// One end of a copy: a URI (`s3://`, `gs://`, `az://`, `https://`) or a path at a site.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Endpoint {
    Uri { uri: String },
    SitePath { site: String, path: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AcceleratorVendor {
    Nvidia,
    Amd,
}

/// Accelerators actually allocated, summed over all nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedGpus {
    pub count: u32,
    pub vendor: AcceleratorVendor,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// What a site actually gave a run, summed over all its nodes: what compute is billed on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub nodes: u32,
    /// Cores over all nodes.
    pub cpus: u32,
    /// Bytes over all nodes.
    pub memory_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<AllocatedGpus>,
}

/// What a run consumed, as far as the site reports it; every field is optional because
/// sites differ in what they measure.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<rust_decimal::Decimal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_seconds: Option<rust_decimal::Decimal>,
    /// The stretch the site bills, when it is not the run's (a cloud instance is billed
    /// from launch to termination, around the task it ran): compute is charged for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billed: Option<BilledInterval>,
}

/// A stretch a site bills: `[from, to)`, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BilledInterval {
    pub from: chrono::DateTime<chrono::Utc>,
    pub to: chrono::DateTime<chrono::Utc>,
}

impl Usage {
    /// What compute is charged for: the stretch its site bills when it gave one, else the
    /// run's own; nothing for a run that never started and that its site does not bill
    /// (a cloud instance that booted and was cancelled is billed, a queued batch job is
    /// not).
    pub fn charged(
        &self,
        started_at: Option<chrono::DateTime<chrono::Utc>>,
        ended_at: chrono::DateTime<chrono::Utc>,
    ) -> Option<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> {
        match (self.billed, started_at) {
            (Some(b), _) => Some((b.from, b.to)),
            (None, Some(started_at)) => Some((started_at, ended_at)),
            (None, None) => None,
        }
    }
}

/// Why a run failed. The split that matters is [`FailureReason::is_site_fault`]: a
/// site's fault sends the work back to placement, a job's fault fails the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FailureReason {
    /// The program exited non-zero.
    ExitCode { code: i32 },
    /// It ran past its walltime.
    Timeout,
    /// It used more memory than it asked for.
    OutOfMemory,
    /// A node under it died.
    NodeFailure,
    /// The site took the capacity back (spot reclaim, higher-priority job).
    Preempted,
    /// The node, VM or container never came up.
    BootFailure,
    /// The site no longer knows the job.
    Lost,
    /// The site would not take the job (capacity, quota, policy).
    SiteRefused { message: String },
    /// The job's image could not be pulled or found.
    ImageUnavailable { message: String },
    /// Anything else the site reported; treated as the job's fault so it is not retried
    /// forever.
    Other { message: String },
}

impl FailureReason {
    /// True when the failure is the site's, not the job's: the work should be re-placed.
    pub fn is_site_fault(&self) -> bool {
        match self {
            FailureReason::NodeFailure
            | FailureReason::Preempted
            | FailureReason::BootFailure
            | FailureReason::Lost
            | FailureReason::SiteRefused { .. } => true,
            FailureReason::ExitCode { .. }
            | FailureReason::Timeout
            | FailureReason::OutOfMemory
            | FailureReason::ImageUnavailable { .. }
            | FailureReason::Other { .. } => false,
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureReason::ExitCode { code } => write!(f, "exited with code {code}"),
            FailureReason::Timeout => f.write_str("ran past its walltime"),
            FailureReason::OutOfMemory => f.write_str("ran out of memory"),
            FailureReason::NodeFailure => f.write_str("a node failed"),
            FailureReason::Preempted => f.write_str("preempted by the site"),
            FailureReason::BootFailure => f.write_str("its node or container never came up"),
            FailureReason::Lost => f.write_str("the site lost track of it"),
            FailureReason::SiteRefused { message } => write!(f, "the site refused it: {message}"),
            FailureReason::ImageUnavailable { message } => {
                write!(f, "its image is unavailable: {message}")
            }
            FailureReason::Other { message } => f.write_str(message),
        }
    }
}

/// How one run of a job ended, as the workflow sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum JobOutcome {
    Succeeded,
    Failed { reason: FailureReason },
    Cancelled,
}

/// Any event of any aggregate. Serializes as the inner event (`{"type": "...", ...}`);
/// deserializes by the tag's aggregate prefix, so errors name the right enum.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Workflow(WorkflowEvent),
    Job(JobEvent),
    Site(SiteEvent),
    Transfer(TransferEvent),
    Tenant(TenantEvent),
    Token(TokenEvent),
}

impl Event {
    /// The versioned tag, e.g. `"workflow.submitted.v1"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Workflow(e) => e.kind(),
            Event::Job(e) => e.kind(),
            Event::Site(e) => e.kind(),
            Event::Transfer(e) => e.kind(),
            Event::Tenant(e) => e.kind(),
            Event::Token(e) => e.kind(),
        }
    }

    /// The kind of aggregate whose history this event belongs to.
    pub fn aggregate_kind(&self) -> AggregateKind {
        match self {
            Event::Workflow(_) => AggregateKind::Workflow,
            Event::Job(_) => AggregateKind::Job,
            Event::Site(_) => AggregateKind::Site,
            Event::Transfer(_) => AggregateKind::Transfer,
            Event::Tenant(_) => AggregateKind::Tenant,
            Event::Token(_) => AggregateKind::Token,
        }
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Event::Workflow(e) => e.serialize(serializer),
            Event::Job(e) => e.serialize(serializer),
            Event::Site(e) => e.serialize(serializer),
            Event::Transfer(e) => e.serialize(serializer),
            Event::Tenant(e) => e.serialize(serializer),
            Event::Token(e) => e.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Read once as JSON, then hand the whole object to the enum its tag names; an
        // untagged enum would only say "did not match any variant".
        let value = serde_json::Value::deserialize(deserializer)?;
        Event::from_payload(&value).map_err(D::Error::custom)
    }
}

impl Event {
    /// Decodes a payload the log already parsed, reading it in place: the enum its tag
    /// names deserializes straight from it. Reading every event at a start or a rebuild
    /// goes through here, so it must not copy the payload (as `from_value` would).
    pub fn from_payload(payload: &serde_json::Value) -> Result<Event, serde_json::Error> {
        let tag = payload
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or_else(|| serde_json::Error::missing_field("type"))?;
        Event::of_type(tag, payload)
    }

    /// The `type` of a payload given as JSON text, read without decoding the rest: what
    /// a reader checks before deciding to decode it with [`Event::from_json`].
    pub fn type_of_json(payload: &str) -> Result<std::borrow::Cow<'_, str>, serde_json::Error> {
        #[derive(Deserialize)]
        struct Tagged<'a> {
            #[serde(rename = "type", borrow)]
            kind: std::borrow::Cow<'a, str>,
        }
        serde_json::from_str::<Tagged<'_>>(payload).map(|t| t.kind)
    }

    /// Decodes a payload given as JSON text whose `type` is `tag` (see
    /// [`Event::type_of_json`]): straight from the text, with no generic JSON value
    /// in between.
    pub fn from_json(tag: &str, payload: &str) -> Result<Event, serde_json::Error> {
        let mut json = serde_json::Deserializer::from_str(payload);
        let event = Event::of_type(tag, &mut json)?;
        json.end()?;
        Ok(event)
    }

    /// Decodes `payload` as the enum of the aggregate its type `tag` names.
    fn of_type<'de, D>(tag: &str, payload: D) -> Result<Event, serde_json::Error>
    where
        D: Deserializer<'de, Error = serde_json::Error>,
    {
        let prefix = tag.split('.').next().unwrap_or_default();
        let kind = AggregateKind::parse(prefix)
            .ok_or_else(|| serde_json::Error::custom(format!("unknown event type {tag:?}")))?;
        match kind {
            AggregateKind::Workflow => WorkflowEvent::deserialize(payload).map(Event::Workflow),
            AggregateKind::Job => JobEvent::deserialize(payload).map(Event::Job),
            AggregateKind::Site => SiteEvent::deserialize(payload).map(Event::Site),
            AggregateKind::Transfer => TransferEvent::deserialize(payload).map(Event::Transfer),
            AggregateKind::Tenant => TenantEvent::deserialize(payload).map(Event::Tenant),
            AggregateKind::Token => TokenEvent::deserialize(payload).map(Event::Token),
        }
    }
}

/// One aggregate's events, seen inside an [`Event`] where it holds one: folding a
/// delivered event borrows it rather than copy it (a submission carries its whole spec).
pub trait AggregateEvent: Sized {
    fn of(event: &Event) -> Option<&Self>;
}

macro_rules! event_conversions {
    ($($variant:ident => $ty:ty),* $(,)?) => {$(
        impl From<$ty> for Event {
            fn from(e: $ty) -> Event {
                Event::$variant(e)
            }
        }

        impl TryFrom<Event> for $ty {
            /// The event back, when it belongs to another aggregate.
            type Error = Event;
            fn try_from(e: Event) -> Result<$ty, Event> {
                match e {
                    Event::$variant(e) => Ok(e),
                    other => Err(other),
                }
            }
        }

        impl AggregateEvent for $ty {
            fn of(e: &Event) -> Option<&$ty> {
                match e {
                    Event::$variant(e) => Some(e),
                    _ => None,
                }
            }
        }
    )*};
}

event_conversions! {
    Workflow => WorkflowEvent,
    Job => JobEvent,
    Site => SiteEvent,
    Transfer => TransferEvent,
    Tenant => TenantEvent,
    Token => TokenEvent,
}
