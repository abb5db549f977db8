//! The site catalogue: list the sites, apply a catalogue document, drain and undrain,
//! and quote a workflow against the live catalogue. Every change is a command on a Site
//! aggregate; reads come from the catalogue read model, caught up at each use.

use meridian_domain::catalog_file;
use meridian_domain::placement::{decide_for, Decision};
use meridian_domain::Catalog;
use meridian_eventlog::aggregates::{execute, ExecuteError};
use meridian_events::aggregate::{Site, SiteCommand, SiteError};
use meridian_events::vocabulary::workflow::{Candidate, SplitPlan};
use meridian_events::EventContext;
use serde::{Deserialize, Serialize};

use crate::api::FieldErrorBody;
use crate::{Action, App, AppError, Principal};

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SiteSummary {
    pub name: String,
    pub kind: String,
    pub region: String,
    pub jurisdiction: String,
    /// `ok`, `drained` or `unhealthy`.
    pub state: String,
    /// Why the site is unhealthy, as its adapter said at its last report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether an adapter serves the site now (its heartbeat holds); placement chooses
    /// only connected sites.
    #[serde(default)]
    pub connected: bool,
    /// (runs not failed by the site + 1) / (runs + devices its health check cordoned + 2).
    pub reliability: f64,
    pub shapes: Vec<String>,
    /// The GPUs of its machine, as its adapter last reported them (the local site), with
    /// those that get no new work and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceSummary>,
    /// The price sheet in force: currency, since when, and its source.
    pub prices: Option<PricesSummary>,
    /// The last refresh of its shapes from the provider (`meridian site refresh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shapes_refresh: Option<ShapesRefreshSummary>,
}

/// One GPU of a site's machine.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeviceSummary {
    /// The UUID jobs are given it by (`GPU-…`): what `cordon` and `uncordon` name.
    pub id: String,
    /// `nvidia` or `amd`.
    pub vendor: String,
    pub model: String,
    pub memory_bytes: u64,
    /// Set when it gets no new work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned: Option<CordonSummary>,
}

/// Why a device gets no new work: its health check's finding, or an admin's reason.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CordonSummary {
    pub reason: String,
    /// `health check`, or the admin who cordoned it.
    pub by: String,
    /// RFC 3339, UTC.
    pub at: String,
}

/// An admin's cordon of one device.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CordonRequest {
    /// Why it gets no new work, shown in `meridian site list`: not blank.
    #[schema(min_length = 1, pattern = r"\S")]
    pub reason: String,
}

/// A refresh of a site's shapes from its provider: asked for by whom and when, and
/// when its adapter last did one and what came of it (RFC 3339 times, UTC).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ShapesRefreshSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refreshed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PricesSummary {
    pub currency: String,
    pub effective_from: String,
    pub source: String,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SiteList {
    pub sites: Vec<SiteSummary>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AppliedSite {
    pub site: String,
    /// `registered`, `updated` or `unchanged`.
    pub outcome: String,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AppliedCatalog {
    pub sites: Vec<AppliedSite>,
}

#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SiteState {
    pub site: String,
    pub state: String,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Quote {
    /// The chosen site; null when no site can run the workflow.
    pub site: Option<String>,
    /// The estimate at the chosen site, exact, as text.
    pub estimated_cost: Option<String>,
    pub currency: Option<String>,
    /// Every site, with its verdict and cost terms, or why it was rejected.
    #[schema(value_type = Vec<Object>)]
    pub candidates: Vec<Candidate>,
    /// Jobs that would run away from `site`, when the workflow is split across sites.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub job_sites: std::collections::BTreeMap<String, String>,
    /// The plan that runs the jobs at different sites, when `placement.split` asks for
    /// one: each job's site, the volumes moved and its cost terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub split: Option<SplitPlan>,
    /// Sites that would fit but that no adapter serves: a submission waits for one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<String>,
    /// The sites an adapter serves now; placement chooses only among them.
    #[serde(default)]
    pub connected: Vec<String>,
}

impl App {
    /// The sites in the catalogue, with their state, shapes and prices in force.
    pub async fn sites(&self, who: &Principal) -> Result<SiteList, AppError> {
        self.authorize(who, Action::ReadSites).await?;
        let catalog = self.catalog().await?;
        let now = chrono::Utc::now();
        Ok(SiteList {
            sites: catalog
                .sites
                .values()
                .map(|s| SiteSummary {
                    name: s.name.clone(),
                    kind: s.kind.as_str().to_string(),
                    region: s.region.clone(),
                    jurisdiction: s.jurisdiction.clone(),
                    state: if s.drained {
                        "drained"
                    } else if !s.healthy {
                        "unhealthy"
                    } else {
                        "ok"
                    }
                    .to_string(),
                    reason: s.health_message.clone().filter(|_| !s.healthy),
                    connected: s.connected_at(now),
                    reliability: s.reliability(),
                    shapes: s.shapes.iter().map(|x| x.name.clone()).collect(),
                    devices: device_summaries(s),
                    prices: s.prices_at(now).map(|p| PricesSummary {
                        currency: p.currency.to_string(),
                        effective_from: p.effective_from.to_rfc3339(),
                        source: p.source.clone(),
                    }),
                    shapes_refresh: s.shapes_refresh.as_ref().map(|r| {
                        let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
                            t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                        };
                        ShapesRefreshSummary {
                            requested_by: r.requested_by.clone(),
                            requested_at: time(r.requested_at),
                            refreshed_at: time(r.refreshed_at),
                            outcome: r.outcome.clone(),
                        }
                    }),
                })
                .collect(),
        })
    }

    /// Registers or updates the sites a catalogue document describes (YAML or JSON; the
    /// format of `catalog/reference.yaml`). Sites it does not name are left as they are.
    pub async fn apply_catalog(
        &self,
        who: &Principal,
        document: &str,
    ) -> Result<AppliedCatalog, AppError> {
        self.authorize(who, Action::ChangeSites).await?;
        let result = async {
            let specs = catalog_file::parse(document).map_err(|e| {
                AppError::InvalidCatalog(vec![FieldErrorBody {
                    path: e.path,
                    message: e.message,
                }])
            })?;
            // A copy, so that the lock is not held while the changes are appended.
            let current = Catalog::clone(&*self.catalog().await?);
            let applied = catalog_file::apply_to(&*self.log, &current, &specs, &who.user)
                .await
                .map_err(|e| match e {
                    catalog_file::ApplyError::Log(e) => {
                        AppError::from_log("applying the catalogue", e)
                    }
                    site => AppError::Conflict(site.to_string()),
                })?;
            Ok(AppliedCatalog {
                sites: applied
                    .into_iter()
                    .map(|(site, outcome)| AppliedSite {
                        site,
                        outcome: match outcome {
                            catalog_file::Applied::Registered => "registered",
                            catalog_file::Applied::Updated => "updated",
                            catalog_file::Applied::Unchanged => "unchanged",
                        }
                        .to_string(),
                    })
                    .collect(),
            })
        }
        .await;
        self.audited(who, Action::ChangeSites, &String::from("catalogue"), result)
            .await
    }

    /// Takes a site out of placement; work already there carries on.
    pub async fn drain(
        &self,
        who: &Principal,
        site: &str,
        reason: Option<String>,
    ) -> Result<SiteState, AppError> {
        let command = SiteCommand::Drain {
            by: who.user.clone(),
            reason,
        };
        self.on_site(who, site, command, "drained").await
    }

    /// Takes one of a site's devices out of its work (new jobs get others); work already
    /// on it carries on.
    pub async fn cordon_device(
        &self,
        who: &Principal,
        site: &str,
        device: &str,
        reason: &str,
    ) -> Result<SiteState, AppError> {
        if reason.trim().is_empty() {
            self.authorize(who, Action::ChangeSites).await?;
            return Err(AppError::BadRequest(
                "reason: a cordon needs a reason (shown in `meridian site list`)".into(),
            ));
        }
        let command = SiteCommand::CordonDevice {
            device: device.to_string(),
            reason: reason.to_string(),
            by: who.user.clone(),
            fault: false,
        };
        self.on_site(who, site, command, "device cordoned").await
    }

    /// Gives a cordoned device back to its site's work. A device whose health check
    /// still finds a fault is cordoned again at the next check.
    pub async fn uncordon_device(
        &self,
        who: &Principal,
        site: &str,
        device: &str,
    ) -> Result<SiteState, AppError> {
        let command = SiteCommand::UncordonDevice {
            device: device.to_string(),
            by: who.user.clone(),
        };
        self.on_site(who, site, command, "device back in use").await
    }

    /// Puts a drained site back into placement.
    pub async fn undrain(&self, who: &Principal, site: &str) -> Result<SiteState, AppError> {
        let command = SiteCommand::Undrain {
            by: who.user.clone(),
        };
        self.on_site(who, site, command, "ok").await
    }

    /// Asks the site's adapter to read its shapes from the provider again.
    pub async fn refresh_shapes(&self, who: &Principal, site: &str) -> Result<SiteState, AppError> {
        let command = SiteCommand::RequestShapesRefresh {
            by: who.user.clone(),
        };
        self.on_site(who, site, command, "refresh requested").await
    }

    async fn on_site(
        &self,
        who: &Principal,
        name: &str,
        command: SiteCommand,
        state: &str,
    ) -> Result<SiteState, AppError> {
        self.authorize(who, Action::ChangeSites).await?;
        let result = async {
            let id = self
                .catalog()
                .await?
                .find(name)
                .map(|site| site.id)
                .ok_or_else(|| AppError::NotFound(format!("no site {name}")))?;
            let ctx = EventContext::new_chain(who.user.clone());
            match execute::<Site, _>(&*self.log, id, &ctx, |_| command.clone()).await {
                Ok(_) => Ok(SiteState {
                    site: name.to_string(),
                    state: state.to_string(),
                }),
                Err(ExecuteError::Rejected(e @ SiteError::UnknownDevice { .. })) => {
                    Err(AppError::NotFound(format!("{name}: {e}")))
                }
                Err(ExecuteError::Rejected(
                    e @ (SiteError::AlreadyDrained
                    | SiteError::NotDrained
                    | SiteError::AlreadyCordoned { .. }
                    | SiteError::NotCordoned { .. }),
                )) => Err(AppError::Conflict(format!("{name}: {e}"))),
                Err(ExecuteError::Log(e)) => Err(AppError::from_log("changing the site", e)),
                Err(e) => Err(AppError::Conflict(format!("{name}: {e}"))),
            }
        }
        .await;
        self.audited(who, Action::ChangeSites, &format!("site/{name}"), result)
            .await
    }

    /// Prices a workflow at every site of the live catalogue, without submitting it,
    /// under the caller's tenant's placement policy.
    pub async fn quote(
        &self,
        who: &Principal,
        spec: &meridian_spec::Workflow,
    ) -> Result<Quote, AppError> {
        self.authorize(who, Action::Quote).await?;
        let catalog = self.catalog().await?;
        let now = chrono::Utc::now();
        let connected: Vec<String> = catalog
            .sites
            .values()
            .filter(|s| s.connected_at(now))
            .map(|s| s.name.clone())
            .collect();
        Ok(match decide_for(spec, Some(&who.tenant), &catalog, now) {
            Decision::Placed(p) => Quote {
                site: Some(p.site),
                estimated_cost: Some(p.estimated_cost.amount.to_string()),
                currency: Some(p.estimated_cost.currency.to_string()),
                candidates: p.explanation.candidates,
                job_sites: p.job_sites,
                split: p.explanation.split,
                waiting_for: Vec::new(),
                connected,
            },
            decision @ (Decision::Rejected { .. } | Decision::Waiting { .. }) => Quote {
                site: None,
                estimated_cost: None,
                currency: None,
                job_sites: Default::default(),
                split: None,
                connected,
                waiting_for: match &decision {
                    Decision::Waiting { sites, .. } => sites.clone(),
                    _ => Vec::new(),
                },
                candidates: decision.candidates(),
            },
        })
    }
}

/// A site's devices with their cordons, in the order its adapter reported them; a
/// cordoned device no longer reported is listed too, so its cordon stays in sight.
fn device_summaries(site: &meridian_domain::catalog::SiteEntry) -> Vec<DeviceSummary> {
    let cordon = |id: &str| {
        site.cordoned.get(id).map(|c| CordonSummary {
            reason: c.reason.clone(),
            by: c.by.clone(),
            at: c.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        })
    };
    let mut devices: Vec<DeviceSummary> = site
        .devices
        .iter()
        .map(|d| DeviceSummary {
            id: d.id.clone(),
            vendor: match d.vendor {
                meridian_events::vocabulary::AcceleratorVendor::Nvidia => "nvidia",
                meridian_events::vocabulary::AcceleratorVendor::Amd => "amd",
            }
            .to_string(),
            model: d.model.clone(),
            memory_bytes: d.memory_bytes,
            cordoned: cordon(&d.id),
        })
        .collect();
    for (id, c) in &site.cordoned {
        if !site.devices.iter().any(|d| &d.id == id) {
            devices.push(DeviceSummary {
                id: id.clone(),
                vendor: String::new(),
                model: c.model.clone(),
                memory_bytes: 0,
                cordoned: cordon(id),
            });
        }
    }
    devices
}
