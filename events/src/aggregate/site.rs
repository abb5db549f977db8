//! The Site aggregate: a federated site's registration, prices, health, drain flag, and
//! the GPUs of its machine with those cordoned.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;

use super::Aggregate;
use crate::envelope::AggregateKind;
use crate::money::{ComputePricing, PriceSheet};
use crate::vocabulary::site::Capacity;
use crate::vocabulary::{SiteEvent, SiteKind};

#[derive(Debug, Clone)]
pub enum SiteCommand {
    /// Registers the site, with its first price sheet when given.
    Register {
        name: String,
        kind: SiteKind,
        region: String,
        jurisdiction: String,
        credentials_secret: Option<String>,
        labels: BTreeMap<String, String>,
        prices: Option<PriceSheet>,
    },
    ChangePrices {
        prices: PriceSheet,
    },
    /// Stamped with `now` as the observation time.
    ReportHealth {
        healthy: bool,
        capacity: Capacity,
        message: Option<String>,
    },
    /// Declares the data sets the site holds at origin (replacing earlier ones).
    DeclareDatasets {
        datasets: Vec<crate::vocabulary::site::Dataset>,
    },
    /// Declares the shapes the site offers now (replacing earlier ones).
    DeclareShapes {
        shapes: Vec<crate::vocabulary::site::Shape>,
    },
    /// Asks the site's adapter to read its shapes from the provider again.
    RequestShapesRefresh {
        by: String,
    },
    /// The adapter read its shapes: `shapes` when it could (declared when they
    /// changed), and what came of it.
    RecordShapesRefresh {
        shapes: Option<Vec<crate::vocabulary::site::Shape>>,
        outcome: String,
    },
    /// The GPUs the adapter found on the site's machine now (an event only when they
    /// changed).
    ReportDevices {
        devices: Vec<crate::vocabulary::site::Device>,
    },
    /// Takes one reported device out of the site's work: `fault` when its health check
    /// failed (it counts against the site's reliability), not when an admin does it.
    CordonDevice {
        device: String,
        reason: String,
        by: String,
        fault: bool,
    },
    /// Gives a cordoned device back to the site's work.
    UncordonDevice {
        device: String,
        by: String,
    },
    Drain {
        by: String,
        reason: Option<String>,
    },
    Undrain {
        by: String,
    },
    /// An adapter process says it serves the site, stamped with `now`; it must say so
    /// again within `ttl_secs` for the site to stay connected.
    Heartbeat {
        adapter: String,
        instance: uuid::Uuid,
        ttl_secs: u64,
        /// The most tasks of an array the adapter takes as one submission, if it takes
        /// arrays at all.
        arrays: Option<u32>,
    },
    /// The adapter process `instance` stops serving the site (a clean shutdown).
    Disconnect {
        instance: uuid::Uuid,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SiteError {
    #[error("the site is already registered")]
    AlreadyRegistered,
    #[error("the site is not registered")]
    NotRegistered,
    #[error("a site needs a name")]
    EmptyName,
    #[error("prices effective from {proposed} precede those in force since {current}")]
    PricesPredateCurrent {
        current: DateTime<Utc>,
        proposed: DateTime<Utc>,
    },
    #[error("invalid price sheet: {reason}")]
    InvalidPrices { reason: String },
    #[error("the site is already drained")]
    AlreadyDrained,
    #[error("invalid shapes or data sets: {reason}")]
    InvalidShapes { reason: String },
    #[error("the site is not drained")]
    NotDrained,
    #[error("a heartbeat needs a time to live of at least one second")]
    ZeroTtl,
    #[error("adapter instance {instance} is not the one serving the site")]
    NotServing { instance: uuid::Uuid },
    #[error("the site has no device {device}; its devices: {known}")]
    UnknownDevice { device: String, known: String },
    #[error("device {device} is already cordoned: {reason}")]
    AlreadyCordoned { device: String, reason: String },
    #[error("device {device} is not cordoned")]
    NotCordoned { device: String },
    #[error("a cordon needs a reason")]
    NoReason,
}

/// Why a device gets no new work, and who said so.
#[derive(Debug, Clone, PartialEq)]
pub struct Cordon {
    pub model: String,
    pub reason: String,
    pub by: String,
    /// Whether its health check found a fault (not an admin's choice).
    pub fault: bool,
    pub at: DateTime<Utc>,
}

/// The adapter process serving a site, from its last heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    pub adapter: String,
    pub instance: uuid::Uuid,
    pub observed_at: DateTime<Utc>,
    pub ttl_secs: u64,
}

impl Connection {
    /// Until when the site counts as connected without another heartbeat.
    pub fn until(&self) -> DateTime<Utc> {
        connected_until(self.observed_at, self.ttl_secs)
    }
}

/// Until when a heartbeat observed at `observed_at` and valid `ttl_secs` holds.
pub fn connected_until(observed_at: DateTime<Utc>, ttl_secs: u64) -> DateTime<Utc> {
    let ttl = i64::try_from(ttl_secs).unwrap_or(i64::MAX);
    observed_at
        .checked_add_signed(chrono::Duration::try_seconds(ttl).unwrap_or(chrono::Duration::MAX))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthReport {
    pub healthy: bool,
    pub capacity: Capacity,
    pub message: Option<String>,
    pub observed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default)]
pub struct Site {
    registered: bool,
    name: String,
    kind: Option<SiteKind>,
    region: String,
    jurisdiction: String,
    /// Every sheet in log order; effective dates never go backwards.
    prices: Vec<PriceSheet>,
    health: Option<HealthReport>,
    drained: bool,
    shapes: Vec<crate::vocabulary::site::Shape>,
    datasets: Vec<crate::vocabulary::site::Dataset>,
    connection: Option<Connection>,
    refresh_requested_at: Option<DateTime<Utc>>,
    refreshed_at: Option<DateTime<Utc>>,
    devices: Vec<crate::vocabulary::site::Device>,
    cordoned: BTreeMap<String, Cordon>,
}

impl Site {
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Whether a refresh of its shapes was asked for and not yet done.
    pub fn shapes_refresh_pending(&self) -> bool {
        match (self.refresh_requested_at, self.refreshed_at) {
            (Some(asked), Some(done)) => asked > done,
            (Some(_), None) => true,
            _ => false,
        }
    }

    pub fn shapes(&self) -> &[crate::vocabulary::site::Shape] {
        &self.shapes
    }

    /// The GPUs its adapter last reported.
    pub fn devices(&self) -> &[crate::vocabulary::site::Device] {
        &self.devices
    }

    /// The devices that get no new work, by id.
    pub fn cordoned(&self) -> &BTreeMap<String, Cordon> {
        &self.cordoned
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> Option<SiteKind> {
        self.kind
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    pub fn jurisdiction(&self) -> &str {
        &self.jurisdiction
    }

    /// The latest price sheet, which may take effect only in the future.
    pub fn latest_prices(&self) -> Option<&PriceSheet> {
        self.prices.last()
    }

    /// The price sheet in force at `at`: the latest one effective by then.
    pub fn prices_at(&self, at: DateTime<Utc>) -> Option<&PriceSheet> {
        self.prices.iter().rev().find(|p| p.effective_from <= at)
    }

    pub fn health(&self) -> Option<&HealthReport> {
        self.health.as_ref()
    }

    pub fn is_drained(&self) -> bool {
        self.drained
    }

    /// The adapter that last said it serves the site, unless it disconnected.
    pub fn connection(&self) -> Option<&Connection> {
        self.connection.as_ref()
    }

    /// Whether an adapter serves the site at `at`.
    pub fn is_connected_at(&self, at: DateTime<Utc>) -> bool {
        self.connection.as_ref().is_some_and(|c| c.until() > at)
    }

    fn registered(&self) -> Result<(), SiteError> {
        if self.registered {
            Ok(())
        } else {
            Err(SiteError::NotRegistered)
        }
    }

    fn check_prices(&self, prices: &PriceSheet) -> Result<(), SiteError> {
        if let Some(current) = self.prices.last() {
            if prices.effective_from < current.effective_from {
                return Err(SiteError::PricesPredateCurrent {
                    current: current.effective_from,
                    proposed: prices.effective_from,
                });
            }
        }
        let invalid = |reason: String| Err(SiteError::InvalidPrices { reason });
        let mut offers = BTreeSet::new();
        for offer in &prices.compute {
            if !offers.insert(offer.offer.as_str()) {
                return invalid(format!("offer {:?} is listed twice", offer.offer));
            }
            let amounts: &[Decimal] = match &offer.pricing {
                ComputePricing::Instance { per_instance_hour } => &[*per_instance_hour],
                ComputePricing::Resource {
                    per_core_hour,
                    per_gib_memory_hour,
                    per_gpu_hour,
                } => &[*per_core_hour, *per_gib_memory_hour, *per_gpu_hour],
            };
            if amounts.iter().any(Decimal::is_sign_negative) {
                return invalid(format!("offer {:?} has a negative price", offer.offer));
            }
        }
        if prices.storage_per_gib_hour.is_sign_negative() || prices.egress_per_gb.is_sign_negative()
        {
            return invalid("storage and egress prices cannot be negative".to_owned());
        }
        Ok(())
    }
}

impl Aggregate for Site {
    const KIND: AggregateKind = AggregateKind::Site;
    type Command = SiteCommand;
    type Event = SiteEvent;
    type Error = SiteError;

    fn handle(&self, cmd: SiteCommand, now: DateTime<Utc>) -> Result<Vec<SiteEvent>, SiteError> {
        match cmd {
            SiteCommand::Register {
                name,
                kind,
                region,
                jurisdiction,
                credentials_secret,
                labels,
                prices,
            } => {
                if self.registered {
                    return Err(SiteError::AlreadyRegistered);
                }
                if name.trim().is_empty() {
                    return Err(SiteError::EmptyName);
                }
                if let Some(p) = &prices {
                    self.check_prices(p)?;
                }
                let mut events = vec![SiteEvent::Registered {
                    name,
                    kind,
                    region,
                    jurisdiction,
                    credentials_secret,
                    labels,
                }];
                events.extend(prices.map(|prices| SiteEvent::PricesChanged { prices }));
                Ok(events)
            }
            SiteCommand::ChangePrices { prices } => {
                self.registered()?;
                self.check_prices(&prices)?;
                Ok(vec![SiteEvent::PricesChanged { prices }])
            }
            SiteCommand::ReportHealth {
                healthy,
                capacity,
                message,
            } => {
                self.registered()?;
                Ok(vec![SiteEvent::HealthReported {
                    healthy,
                    capacity,
                    message,
                    observed_at: now,
                }])
            }
            SiteCommand::DeclareDatasets { datasets } => {
                self.registered()?;
                if let Some(d) = datasets
                    .iter()
                    .find(|d| d.uri.is_empty() || !d.digest.contains(':'))
                {
                    return Err(SiteError::InvalidShapes {
                        reason: format!(
                            "data set {:?} needs a URI and a digest such as sha256:<hex>",
                            d.uri
                        ),
                    });
                }
                if self.datasets == datasets {
                    return Ok(Vec::new());
                }
                Ok(vec![SiteEvent::DatasetsDeclared { datasets }])
            }
            SiteCommand::DeclareShapes { shapes } => {
                self.registered()?;
                check_shapes(&shapes)?;
                if self.shapes == shapes {
                    return Ok(Vec::new());
                }
                Ok(vec![SiteEvent::ShapesDeclared { shapes }])
            }
            SiteCommand::RequestShapesRefresh { by } => {
                self.registered()?;
                Ok(vec![SiteEvent::ShapesRefreshRequested {
                    by,
                    requested_at: now,
                }])
            }
            SiteCommand::RecordShapesRefresh { shapes, outcome } => {
                self.registered()?;
                let mut events = Vec::new();
                if let Some(shapes) = shapes {
                    check_shapes(&shapes)?;
                    if self.shapes != shapes {
                        events.push(SiteEvent::ShapesDeclared { shapes });
                    }
                }
                events.push(SiteEvent::ShapesRefreshed {
                    outcome,
                    refreshed_at: now,
                });
                Ok(events)
            }
            SiteCommand::ReportDevices { devices } => {
                self.registered()?;
                if self.devices == devices {
                    return Ok(Vec::new());
                }
                Ok(vec![SiteEvent::DevicesReported { devices }])
            }
            SiteCommand::CordonDevice {
                device,
                reason,
                by,
                fault,
            } => {
                self.registered()?;
                if reason.trim().is_empty() {
                    return Err(SiteError::NoReason);
                }
                let Some(known) = self.devices.iter().find(|d| d.id == device) else {
                    let known: Vec<&str> = self.devices.iter().map(|d| d.id.as_str()).collect();
                    return Err(SiteError::UnknownDevice {
                        device,
                        known: if known.is_empty() {
                            "none reported".into()
                        } else {
                            known.join(", ")
                        },
                    });
                };
                if let Some(c) = self.cordoned.get(&device) {
                    return Err(SiteError::AlreadyCordoned {
                        device,
                        reason: c.reason.clone(),
                    });
                }
                Ok(vec![SiteEvent::DeviceCordoned {
                    model: known.model.clone(),
                    device,
                    reason,
                    by,
                    fault,
                    cordoned_at: now,
                }])
            }
            SiteCommand::UncordonDevice { device, by } => {
                self.registered()?;
                if !self.cordoned.contains_key(&device) {
                    return Err(SiteError::NotCordoned { device });
                }
                Ok(vec![SiteEvent::DeviceUncordoned {
                    device,
                    by,
                    uncordoned_at: now,
                }])
            }
            SiteCommand::Drain { by, reason } => {
                self.registered()?;
                if self.drained {
                    return Err(SiteError::AlreadyDrained);
                }
                Ok(vec![SiteEvent::Drained {
                    by,
                    reason,
                    drained_at: now,
                }])
            }
            SiteCommand::Undrain { by } => {
                self.registered()?;
                if !self.drained {
                    return Err(SiteError::NotDrained);
                }
                Ok(vec![SiteEvent::Undrained {
                    by,
                    undrained_at: now,
                }])
            }
            SiteCommand::Heartbeat {
                adapter,
                instance,
                ttl_secs,
                arrays,
            } => {
                self.registered()?;
                if ttl_secs == 0 {
                    return Err(SiteError::ZeroTtl);
                }
                Ok(vec![SiteEvent::Heartbeat {
                    adapter,
                    instance,
                    ttl_secs,
                    observed_at: now,
                    // An array of one is no array.
                    arrays: arrays.filter(|n| *n > 1),
                }])
            }
            SiteCommand::Disconnect { instance } => {
                self.registered()?;
                // Another process took over since: its heartbeat stands.
                if self.connection.as_ref().map(|c| c.instance) != Some(instance) {
                    return Err(SiteError::NotServing { instance });
                }
                Ok(vec![SiteEvent::Disconnected {
                    instance,
                    observed_at: now,
                }])
            }
        }
    }

    fn apply(&mut self, event: &SiteEvent) {
        match event {
            SiteEvent::Registered {
                name,
                kind,
                region,
                jurisdiction,
                ..
            } => {
                self.registered = true;
                self.name = name.clone();
                self.kind = Some(*kind);
                self.region = region.clone();
                self.jurisdiction = jurisdiction.clone();
            }
            SiteEvent::PricesChanged { prices } => self.prices.push(prices.clone()),
            SiteEvent::HealthReported {
                healthy,
                capacity,
                message,
                observed_at,
            } => {
                self.health = Some(HealthReport {
                    healthy: *healthy,
                    capacity: capacity.clone(),
                    message: message.clone(),
                    observed_at: *observed_at,
                });
            }
            SiteEvent::ShapesDeclared { shapes } => self.shapes = shapes.clone(),
            SiteEvent::DatasetsDeclared { datasets } => self.datasets = datasets.clone(),
            SiteEvent::ShapesRefreshRequested { requested_at, .. } => {
                self.refresh_requested_at = Some(*requested_at)
            }
            SiteEvent::ShapesRefreshed { refreshed_at, .. } => {
                self.refreshed_at = Some(*refreshed_at)
            }
            SiteEvent::DevicesReported { devices } => self.devices = devices.clone(),
            SiteEvent::DeviceCordoned {
                device,
                model,
                reason,
                by,
                fault,
                cordoned_at,
            } => {
                self.cordoned.insert(
                    device.clone(),
                    Cordon {
                        model: model.clone(),
                        reason: reason.clone(),
                        by: by.clone(),
                        fault: *fault,
                        at: *cordoned_at,
                    },
                );
            }
            SiteEvent::DeviceUncordoned { device, .. } => {
                self.cordoned.remove(device);
            }
            SiteEvent::Drained { .. } => self.drained = true,
            SiteEvent::Undrained { .. } => self.drained = false,
            SiteEvent::Heartbeat {
                adapter,
                instance,
                ttl_secs,
                observed_at,
                ..
            } => {
                self.connection = Some(Connection {
                    adapter: adapter.clone(),
                    instance: *instance,
                    observed_at: *observed_at,
                    ttl_secs: *ttl_secs,
                });
            }
            SiteEvent::Disconnected { instance, .. } => {
                if self.connection.as_ref().map(|c| c.instance) == Some(*instance) {
                    self.connection = None;
                }
            }
        }
    }
}

/// Shapes with unique names, each with a CPU, some memory and a node.
fn check_shapes(shapes: &[crate::vocabulary::site::Shape]) -> Result<(), SiteError> {
    let mut names = BTreeSet::new();
    for shape in shapes {
        if !names.insert(shape.name.as_str()) {
            return Err(SiteError::InvalidShapes {
                reason: format!("shape {} is declared twice", shape.name),
            });
        }
        if shape.cpus == 0 || shape.memory_bytes == 0 || shape.max_nodes == 0 {
            return Err(SiteError::InvalidShapes {
                reason: format!(
                    "shape {} needs at least one CPU, some memory and one node",
                    shape.name
                ),
            });
        }
    }
    Ok(())
}
