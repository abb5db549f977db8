//! The site catalogue as the router sees it: a projection of Site, Transfer, Job and
//! Tenant events (tenants' placement policies and month-to-date egress), kept in
//! memory. Every decision reads prices from here and copies them into its event.
//!
//! It is an incremental read model: it remembers the last log [`Catalog::position`] it
//! folded in, and [`Catalog::catch_up`] reads only the commits after it, so a long-lived
//! copy (the intake's, the router's) pays for what was appended since, not for the whole
//! log. [`Catalog::load`] is a catch-up from its snapshot (or an empty catalogue) up to
//! the head it found. Job events count too:
//! each site's runs and faults (its reliability) come from job terminal events.

use std::collections::BTreeMap;

use meridian_eventlog::{snapshot, EventLog, LogError, StoredCommit};
use meridian_events::vocabulary::site::{Capacity, Dataset, Device, Shape};
use meridian_events::vocabulary::{Endpoint, Location, TransferEvent};
use meridian_events::JobEvent;
use meridian_events::{
    AggregateKind, Envelope, Event, PriceSheet, SiteEvent, SiteKind, TextEnvelope,
};
use uuid::Uuid;

/// Labels a site registers with to describe the biggest job it can run, until sites
/// carry full shapes: `max_cpus`, `max_memory_bytes`, `max_nodes`, `gpus` (per node).
pub mod labels {
    pub const MAX_CPUS: &str = "max_cpus";
    pub const MAX_MEMORY_BYTES: &str = "max_memory_bytes";
    pub const MAX_NODES: &str = "max_nodes";
    pub const GPUS: &str = "gpus";
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SiteEntry {
    pub id: Uuid,
    pub name: String,
    pub kind: SiteKind,
    pub region: String,
    pub jurisdiction: String,
    pub labels: BTreeMap<String, String>,
    /// Every sheet, oldest first; the one in force is the last whose date has come.
    pub prices: Vec<PriceSheet>,
    pub drained: bool,
    pub healthy: bool,
    /// Why the site said it is unhealthy, at its last report.
    pub health_message: Option<String>,
    pub capacity: Option<Capacity>,
    /// Set for one decision only: why this site may not be chosen now.
    pub excluded: Option<String>,
    /// Runs that ended, and how many of them the site failed (node failure, preemption,
    /// lost); with the devices its health check cordoned, they make the reliability
    /// score: (ok + 1) / (runs + device faults + 2).
    pub runs: u64,
    pub faults: u64,
    /// Devices its health check found at fault (each cordon counted once).
    pub device_faults: u64,
    /// The GPUs its adapter last reported (the local site).
    pub devices: Vec<Device>,
    /// Devices that get no new work, by id: why, and who said so.
    pub cordoned: BTreeMap<String, DeviceCordon>,
    /// Declared shapes; a site without any is judged by its labels.
    pub shapes: Vec<Shape>,
    /// Data sets it declared it holds at origin.
    pub datasets: Vec<Dataset>,
    /// The adapter process serving it and until when its last heartbeat holds; `None`
    /// when no adapter ever said it serves the site, or the last one disconnected.
    pub connection: Option<(Uuid, chrono::DateTime<chrono::Utc>)>,
    /// The most tasks of an array its adapter takes as one submission, as its last
    /// heartbeat said; `None`: one task at a time.
    pub arrays: Option<u32>,
    /// The last refresh of its shapes from the provider, asked for or done.
    pub shapes_refresh: Option<ShapesRefresh>,
}

/// Why a device of a site gets no new work.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceCordon {
    pub model: String,
    pub reason: String,
    /// `health check`, or the admin who cordoned it.
    pub by: String,
    pub at: chrono::DateTime<chrono::Utc>,
}

/// A refresh of a site's shapes from its provider (`meridian site refresh`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShapesRefresh {
    pub requested_by: Option<String>,
    pub requested_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the adapter last did one, and what came of it.
    pub refreshed_at: Option<chrono::DateTime<chrono::Utc>>,
    pub outcome: Option<String>,
}

impl SiteEntry {
    pub fn label_u64(&self, key: &str) -> Option<u64> {
        self.labels.get(key).and_then(|v| v.parse().ok())
    }

    /// The share of runs it did not fail, smoothed so that a new site starts at 0.5.
    pub fn reliability(&self) -> f64 {
        (self.runs.saturating_sub(self.faults) + 1) as f64
            / (self.runs + self.device_faults + 2) as f64
    }

    /// How many of its `model` GPUs it reports are cordoned.
    pub fn cordoned_of(&self, model: &str) -> u32 {
        // Only devices the site still reports: a cordon of one gone since (its shape
        // re-declared without it) must not take it away twice.
        let n = self
            .cordoned
            .iter()
            .filter(|(id, c)| {
                c.model.eq_ignore_ascii_case(model) && self.devices.iter().any(|d| &d.id == *id)
            })
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Whether an adapter serves the site at `at`.
    pub fn connected_at(&self, at: chrono::DateTime<chrono::Utc>) -> bool {
        self.connection.is_some_and(|(_, until)| until > at)
    }

    pub fn prices_at(&self, at: chrono::DateTime<chrono::Utc>) -> Option<&PriceSheet> {
        self.prices.iter().rev().find(|p| p.effective_from <= at)
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Catalog {
    pub sites: BTreeMap<String, SiteEntry>,
    by_id: BTreeMap<Uuid, String>,
    /// Known data sets: URI → (digest, bytes).
    pub datasets: BTreeMap<String, (String, u64)>,
    /// The locality map: digest → the sites holding those bytes.
    pub holdings: BTreeMap<String, std::collections::BTreeSet<String>>,
    /// Copies from a URL under way (transfer → its source): once one completes, its
    /// URL is a known data set with the digest and bytes it brought.
    copying_from: BTreeMap<Uuid, String>,
    /// Tenants' placement policies and their egress so far this month.
    pub tenants: crate::tenant_view::TenantView,
    /// Price every site whether or not an adapter serves it: for offline quotes against a
    /// catalogue file, where no adapter ever connects.
    #[serde(skip)]
    pub ignore_connections: bool,
    /// The last log position folded in (0: none yet).
    position: u64,
    /// The aggregate sequence of the last event folded in from the commit at `position`;
    /// `u64::MAX` once that whole commit is in. With `position` it orders every event
    /// in the log, so [`Catalog::observe_at`] can tell one it already counted.
    sequence: u64,
    /// Search every shape of a site for a request instead of its shape index: the
    /// reference the index is tested and benchmarked against. Decisions are the same.
    #[serde(skip)]
    pub scan_every_shape: bool,
    /// Placement's memory of each site's cheapest fit per request; forgotten for a site
    /// whenever its shapes, prices or cordons change.
    #[serde(skip)]
    pub(crate) fits: crate::placement::FitCache,
}

/// The name the catalogue's snapshot is kept under, and its format: bump the format
/// whenever what the catalogue keeps (or how an event folds into it) changes, so that
/// an older snapshot is ignored and the catalogue folded again from the log.
pub const SNAPSHOT: &str = "catalog";
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Commits read from the log at a time while catching up. A page is a round trip or two
/// (over JetStream, a consumer made for it): at 512 a start that read 30,000 commits
/// spent a fifth of its reading on them.
const PAGE: usize = 2048;

impl Catalog {
    /// Builds the catalogue from the log: from its last snapshot and the commits after
    /// it up to the log's head when it began, or from the whole log when there is none
    /// (or none that matches). Saves a new snapshot when it had to read
    /// [`snapshot::SAVE_AFTER`] commits or more.
    pub async fn load(log: &dyn EventLog) -> Result<Catalog, LogError> {
        let mut catalog = snapshot::load::<Catalog>(log, SNAPSHOT, SNAPSHOT_FORMAT)
            .await?
            .map(|(_, catalog)| catalog)
            .unwrap_or_default();
        let until = log.head().await?;
        let read = catalog.catch_up_to(log, until, |_| {}).await?;
        if read >= snapshot::SAVE_AFTER {
            if let Err(e) =
                snapshot::save(log, SNAPSHOT, SNAPSHOT_FORMAT, catalog.position, &catalog).await
            {
                tracing::warn!(error = %e, "could not save the catalogue's snapshot");
            }
        }
        Ok(catalog)
    }

    /// The catalogue folded from the whole log, showing `visit` every event on the way
    /// (its payload still text), so a service that rebuilds other state at start reads
    /// the log once. No snapshot is read or saved: such a service keeps its own, with
    /// the catalogue in it.
    pub async fn load_with(
        log: &dyn EventLog,
        visit: impl FnMut(&TextEnvelope<'_>),
    ) -> Result<Catalog, LogError> {
        let mut catalog = Catalog::default();
        catalog.catch_up_visiting(log, visit).await?;
        Ok(catalog)
    }

    /// The last log position folded in (0 for an empty catalogue).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Moves [`Catalog::position`] on to `position` (never back): for a catalogue fed
    /// by a subscription, which shows [`Catalog::observe_at`] the events that concern it
    /// from every commit up to `position` and skips the others, so that its position,
    /// and a snapshot of it, is the subscription's.
    pub fn passed(&mut self, position: u64) {
        if (position, u64::MAX) > (self.position, self.sequence) {
            (self.position, self.sequence) = (position, u64::MAX);
        }
    }

    /// Reads the commits appended after [`Catalog::position`] and folds them in. On an
    /// error the commits before the failing one stay folded in, and the next call
    /// resumes there. Saves no snapshot: [`Catalog::load`] (a start) does, so that a
    /// catalogue kept up to date on a request path never pays for one.
    pub async fn catch_up(&mut self, log: &dyn EventLog) -> Result<(), LogError> {
        self.catch_up_visiting(log, |_| {}).await.map(|_| ())
    }

    /// [`Catalog::catch_up`], showing `visit` every event read (its payload still
    /// text); returns how many commits it read. The next page is read while this one
    /// is folded: over JetStream the server sends it on its own core meanwhile.
    pub async fn catch_up_visiting(
        &mut self,
        log: &dyn EventLog,
        visit: impl FnMut(&TextEnvelope<'_>),
    ) -> Result<u64, LogError> {
        self.catch_up_to(log, u64::MAX, visit).await
    }

    /// [`Catalog::catch_up_visiting`] that stops once it has folded position `until`
    /// (it may fold a little past it: the rest of the page that holds it; it reads
    /// nothing when it has folded `until` already). A start
    /// folds up to the head it found when it began: following the head instead, it
    /// kept reading while writers appended, and under a stream of submissions it did
    /// not serve until they stopped.
    pub async fn catch_up_to(
        &mut self,
        log: &dyn EventLog,
        until: u64,
        mut visit: impl FnMut(&TextEnvelope<'_>),
    ) -> Result<u64, LogError> {
        if self.sequence == u64::MAX && self.position >= until {
            return Ok(0);
        }
        // A commit only partly folded in by `observe_at` is read again for the rest.
        let after = if self.sequence == u64::MAX {
            self.position
        } else {
            self.position.saturating_sub(1)
        };
        // Read as text: a start's fold decodes few of the events it reads, and building
        // every one as a JSON tree was most of its time.
        let mut commits = log.read_text_from(after, PAGE).await?;
        let mut read = 0;
        while let Some(last) = commits.last().map(|c| c.position) {
            read += commits.len() as u64;
            if last >= until {
                self.fold_page(commits, &mut visit).await?;
                break;
            }
            // A fold that fails does not wait for the read (it stops between commits).
            let ((), next) = tokio::try_join!(
                self.fold_page(commits, &mut visit),
                log.read_text_from(last, PAGE)
            )?;
            commits = next;
        }
        Ok(read)
    }

    /// Folds in one page of [`Catalog::catch_up_visiting`], letting the read of the
    /// next page run now and then.
    async fn fold_page(
        &mut self,
        commits: Vec<StoredCommit>,
        visit: &mut impl FnMut(&TextEnvelope<'_>),
    ) -> Result<(), LogError> {
        for (i, commit) in commits.into_iter().enumerate() {
            if i % 128 == 127 {
                tokio::task::yield_now().await;
            }
            let corrupt = |e: serde_json::Error| LogError::Corrupt {
                position: commit.position,
                message: e.to_string(),
            };
            // Decoding is the costly part: only the kinds the catalogue folds in.
            let mut events = Vec::new();
            for text in &commit.events {
                let read = TextEnvelope::parse(text).map_err(corrupt)?;
                visit(&read);
                if Catalog::may_fold(&read) {
                    events.push(read.decode_event().map_err(corrupt)?);
                }
            }
            // A whole commit or nothing, so that a corrupt one is met again next time.
            for envelope in &events {
                self.observe_at(commit.position, envelope);
            }
            self.position = commit.position;
            self.sequence = u64::MAX;
        }
        Ok(())
    }

    /// Whether [`Catalog::observe`] may fold `read` in, read from its kind and type
    /// alone: decoding is the costly part of a start's fold, and most of a log's job
    /// events (a dispatch carries its task) say nothing about a site's reliability.
    fn may_fold(read: &TextEnvelope<'_>) -> bool {
        match read.envelope.aggregate.kind {
            AggregateKind::Site | AggregateKind::Transfer | AggregateKind::Tenant => true,
            AggregateKind::Job => matches!(
                &*read.kind,
                "job.finished.v1" | "job.failed.v1" | "job.cancelled.v1"
            ),
            _ => false,
        }
    }

    /// The placement policy of `tenant`, if an admin set one.
    pub fn policy(
        &self,
        tenant: &str,
    ) -> Option<&meridian_events::vocabulary::tenant::PlacementPolicy> {
        self.tenants.policy(tenant)
    }

    /// GB of billable egress that left `source` for `tenant` in the month of `now`.
    pub fn egress_so_far(
        &self,
        tenant: &str,
        source: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> rust_decimal::Decimal {
        self.tenants.egress_so_far(tenant, source, now)
    }

    pub fn find(&self, name: &str) -> Option<&SiteEntry> {
        self.sites.get(name)
    }

    /// Keeps `site` out of decisions made on this copy of the catalogue.
    pub fn exclude(&mut self, site: &str, reason: String) {
        if let Some(s) = self.sites.get_mut(site) {
            s.excluded = Some(reason);
        }
    }

    /// The data set a workflow names by `uri` (the longest declared prefix of it).
    pub fn dataset_for(&self, uri: &str) -> Option<(&str, u64)> {
        self.datasets
            .iter()
            .filter(|(known, _)| uri.starts_with(known.as_str()))
            .max_by_key(|(known, _)| known.len())
            .map(|(_, (digest, bytes))| (digest.as_str(), *bytes))
    }

    /// [`Catalog::observe`] for an event delivered from the commit at log `position`
    /// (a subscription's), unless this catalogue already folded it in: a catalogue
    /// loaded up to the head and then fed by a subscription that resumes from an older
    /// acknowledgement sees those commits twice, and counting a job's end twice would
    /// skew its site's reliability. Returns whether the event was folded in.
    pub fn observe_at(&mut self, position: u64, envelope: &Envelope<Event>) -> bool {
        if (position, envelope.sequence) <= (self.position, self.sequence) {
            return false;
        }
        self.observe(envelope);
        self.position = position;
        self.sequence = envelope.sequence;
        true
    }

    /// Folds in one event: Site events, finished transfers for the locality map (a
    /// finished transfer means those bytes are now at that site, and a billable one counts
    /// towards its tenant's egress tiers), job ends for each site's reliability, and
    /// tenants' placement policies. Others are ignored. Nothing guards against folding the same
    /// event twice (use [`Catalog::observe_at`] for events that may come again), and
    /// [`Catalog::position`] does not move.
    pub fn observe(&mut self, envelope: &Envelope<Event>) {
        self.tenants.observe(envelope);
        if let Event::Job(job) = &envelope.payload {
            let site = match job {
                JobEvent::Finished { site, .. }
                | JobEvent::Failed { site, .. }
                | JobEvent::Cancelled { site, .. } => site,
                _ => return,
            };
            if let Some(s) = self.sites.get_mut(site) {
                s.runs += 1;
                if matches!(job, JobEvent::Failed { reason, .. } if reason.is_site_fault()) {
                    s.faults += 1;
                }
            }
            return;
        }
        if let Event::Transfer(TransferEvent::Requested {
            source: Endpoint::Uri { uri },
            ..
        }) = &envelope.payload
        {
            self.copying_from.insert(envelope.aggregate.id, uri.clone());
            return;
        }
        if let Event::Transfer(TransferEvent::Failed { .. }) = &envelope.payload {
            self.copying_from.remove(&envelope.aggregate.id);
            return;
        }
        if let Event::Transfer(TransferEvent::Completed {
            digest, to, bytes, ..
        }) = &envelope.payload
        {
            // What the data mover brought in from a URL is a data set placement can
            // price and find again; one the catalogue declares keeps its declaration.
            if let Some(uri) = self.copying_from.remove(&envelope.aggregate.id) {
                self.datasets
                    .entry(uri)
                    .or_insert_with(|| (digest.clone(), *bytes));
            }
            let sites: Vec<String> = match to {
                Location::Site { site } => vec![site.clone()],
                Location::Region { region } => self
                    .sites
                    .values()
                    .filter(|s| &s.region == region)
                    .map(|s| s.name.clone())
                    .collect(),
            };
            self.holdings
                .entry(digest.clone())
                .or_default()
                .extend(sites);
            return;
        }
        let Event::Site(event) = &envelope.payload else {
            return;
        };
        let id = envelope.aggregate.id;
        if let SiteEvent::Registered {
            name,
            kind,
            region,
            jurisdiction,
            labels,
            ..
        } = event
        {
            self.by_id.insert(id, name.clone());
            self.sites.entry(name.clone()).or_insert(SiteEntry {
                id,
                name: name.clone(),
                kind: *kind,
                region: region.clone(),
                jurisdiction: jurisdiction.clone(),
                labels: labels.clone(),
                prices: Vec::new(),
                drained: false,
                healthy: true,
                health_message: None,
                capacity: None,
                excluded: None,
                runs: 0,
                faults: 0,
                device_faults: 0,
                devices: Vec::new(),
                cordoned: BTreeMap::new(),
                shapes: Vec::new(),
                datasets: Vec::new(),
                connection: None,
                arrays: None,
                shapes_refresh: None,
            });
            return;
        }
        let Some(site) = self
            .by_id
            .get(&id)
            .and_then(|name| self.sites.get_mut(name))
        else {
            return;
        };
        // What placement learnt of the site holds until its shapes, prices or devices
        // change; reports of health and heartbeats change none of them.
        if !matches!(
            event,
            SiteEvent::Heartbeat { .. } | SiteEvent::HealthReported { .. }
        ) {
            self.fits.forget(site);
        }
        match event {
            SiteEvent::Registered { .. } => {}
            SiteEvent::PricesChanged { prices } => {
                site.prices.push(prices.clone());
                site.prices.sort_by_key(|p| p.effective_from);
            }
            SiteEvent::HealthReported {
                healthy,
                capacity,
                message,
                ..
            } => {
                site.healthy = *healthy;
                site.health_message = message.clone().filter(|_| !*healthy);
                site.capacity = Some(capacity.clone());
            }
            SiteEvent::ShapesDeclared { shapes } => site.shapes = shapes.clone(),
            SiteEvent::DatasetsDeclared { datasets } => {
                site.datasets = datasets.clone();
                let name = site.name.clone();
                for d in datasets {
                    self.datasets
                        .insert(d.uri.clone(), (d.digest.clone(), d.bytes));
                    self.holdings
                        .entry(d.digest.clone())
                        .or_default()
                        .insert(name.clone());
                }
            }
            SiteEvent::ShapesRefreshRequested { by, requested_at } => {
                let refresh = site.shapes_refresh.get_or_insert(ShapesRefresh {
                    requested_by: None,
                    requested_at: None,
                    refreshed_at: None,
                    outcome: None,
                });
                refresh.requested_by = Some(by.clone());
                refresh.requested_at = Some(*requested_at);
            }
            SiteEvent::ShapesRefreshed {
                outcome,
                refreshed_at,
            } => {
                let refresh = site.shapes_refresh.get_or_insert(ShapesRefresh {
                    requested_by: None,
                    requested_at: None,
                    refreshed_at: None,
                    outcome: None,
                });
                refresh.refreshed_at = Some(*refreshed_at);
                refresh.outcome = Some(outcome.clone());
            }
            SiteEvent::DevicesReported { devices } => site.devices = devices.clone(),
            SiteEvent::DeviceCordoned {
                device,
                model,
                reason,
                by,
                fault,
                cordoned_at,
            } => {
                site.device_faults += u64::from(*fault);
                site.cordoned.insert(
                    device.clone(),
                    DeviceCordon {
                        model: model.clone(),
                        reason: reason.clone(),
                        by: by.clone(),
                        at: *cordoned_at,
                    },
                );
            }
            SiteEvent::DeviceUncordoned { device, .. } => {
                site.cordoned.remove(device);
            }
            SiteEvent::Drained { .. } => site.drained = true,
            SiteEvent::Undrained { .. } => site.drained = false,
            SiteEvent::Heartbeat {
                instance,
                ttl_secs,
                observed_at,
                arrays,
                ..
            } => {
                let until =
                    meridian_events::aggregate::site::connected_until(*observed_at, *ttl_secs);
                site.connection = Some((*instance, until));
                site.arrays = *arrays;
            }
            SiteEvent::Disconnected { instance, .. } => {
                if site.connection.is_some_and(|(i, _)| i == *instance) {
                    site.connection = None;
                    site.arrays = None;
                }
            }
        }
    }
}
