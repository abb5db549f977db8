//! The Google Cloud site: the cloud VM lifecycle of `meridian-adapter-cloud` over Compute
//! Engine, with Google's own client (`google-cloud-compute-v1`, only its `instances` and
//! `machine-types` clients) and credentials (Application Default Credentials, a
//! credentials file, or none for a test server). This crate is only Compute Engine's
//! calls (insert followed through its zone operation, aggregated list, get, delete, the
//! zone's machine types) and the mapping of its states and error codes onto the lifecycle.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use google_cloud_compute_v1::client::{Instances, MachineTypes};
use google_cloud_compute_v1::model;
use meridian_adapter_cloud::{
    build_site, listed, CloudProvider, Instance, InstanceState, Launch, ProviderError,
};
use meridian_adapter_core::gpu::catalogue_model;
use meridian_adapter_core::registry::parse_config;
use meridian_adapter_core::{GpuFacts, ShapeFacts};
use tokio::sync::OnceCell;
use uuid::Uuid;

mod config;

pub use config::{is_image, Credentials, GcpConfig};

/// The registry's entry for `gcp` sites.
pub const REGISTRATION: meridian_adapter_core::Registration = meridian_adapter_core::Registration {
    kind: "gcp",
    about: "Google Cloud: a Compute Engine instance of the placed machine type per run, Spot when placement allows",
    needs_config: true,
    build: |text, context| {
        let config: GcpConfig = parse_config(text)?;
        let (lifecycle, refresh) = (config.lifecycle.clone(), config.refresh_shapes);
        build_site(Gce::new(config), lifecycle, refresh, context)
    },
};

/// How long the site's health check waits for Compute Engine.
const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// Compute Engine takes up to 256 KB in one metadata value.
const MAX_STARTUP_SCRIPT: usize = 256 * 1024;

/// How much longer than its walltime an instance may live before Compute Engine deletes
/// it itself (`maxRunDuration`): the lifecycle ends it at walltime plus its grace; this
/// is the backstop for when Meridian is not there to.
const RUN_DURATION_MARGIN: Duration = Duration::from_secs(3600);

/// Operation error codes for a zone without the capacity asked for now.
const CAPACITY_CODES: &[&str] = &[
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
    "insufficientCapacity",
];

/// Codes for a quota of the project (regional, or `GPUS_ALL_REGIONS`): no zone of the
/// site will do.
const QUOTA_CODES: &[&str] = &["QUOTA_EXCEEDED", "quotaExceeded"];

/// Codes for a request Compute Engine will never take as it is.
const REJECTED_CODES: &[&str] = &[
    "invalid",
    "badRequest",
    "notFound",
    "forbidden",
    "required",
    "RESOURCE_NOT_FOUND",
    "INVALID_FIELD_VALUE",
    "UNSUPPORTED_OPERATION",
    "PERMISSIONS_ERROR",
];

/// Codes for a call to try again later, whatever its HTTP status.
const TRANSIENT_CODES: &[&str] = &[
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "backendError",
    "RESOURCE_NOT_READY",
];

/// Compute Engine, as the lifecycle's provider.
pub struct Gce {
    config: GcpConfig,
    credentials: google_cloud_auth::credentials::Credentials,
    /// Made at first use: making a client is async, building a site is not.
    instances: OnceCell<Instances>,
    machine_types: OnceCell<MachineTypes>,
    /// Instances seen: a deleted instance vanishes from Compute Engine at once.
    seen: listed::Seen,
    listing: listed::Cache,
}

/// What Compute Engine said went wrong: the HTTP status where there was one, its codes
/// (an operation's `errors[].code`, a response's `errors[].reason`) and its message.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    http: Option<u16>,
    codes: Vec<String>,
    message: String,
}

impl From<google_cloud_compute_v1::Error> for Answer {
    fn from(e: google_cloud_compute_v1::Error) -> Answer {
        use google_cloud_gax::error::rpc::StatusDetails;
        let http = e.http_status_code();
        match e.status() {
            Some(status) => Answer {
                http,
                codes: status
                    .details
                    .iter()
                    .filter_map(|d| match d {
                        StatusDetails::ErrorInfo(info) if !info.reason.is_empty() => {
                            Some(info.reason.clone())
                        }
                        _ => None,
                    })
                    .collect(),
                message: status.message.clone(),
            },
            None => Answer {
                http,
                codes: Vec::new(),
                message: with_sources(&e),
            },
        }
    }
}

/// An error and what caused it, as one line (the client's errors say little alone:
/// "cannot create the authentication headers").
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

impl Answer {
    fn not_found(&self) -> bool {
        self.http == Some(404)
    }
}

impl Gce {
    /// Checks `config` and reads its credentials (nothing is contacted yet).
    pub fn new(config: GcpConfig) -> Result<Gce, String> {
        config.check()?;
        // Google's client is built without a crypto provider of its own (ADR 0013): the
        // process's is ring, as for every other TLS client here.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let credentials = credentials(&config.credentials)?;
        Ok(Gce {
            config,
            credentials,
            instances: OnceCell::new(),
            machine_types: OnceCell::new(),
            seen: listed::Seen::default(),
            listing: listed::Cache::new(Duration::from_secs(2)),
        })
    }

    /// Lists the project again when the last list is older than `every` (2 s by default;
    /// tests that step the stand-in look by look use zero).
    pub fn listing_every(mut self, every: Duration) -> Gce {
        self.listing = listed::Cache::new(every);
        self
    }

    async fn instances(&self) -> Result<&Instances, ProviderError> {
        self.instances
            .get_or_try_init(|| async {
                let mut builder = Instances::builder().with_credentials(self.credentials.clone());
                if let Some(url) = &self.config.endpoint_url {
                    builder = builder.with_endpoint(url.trim_end_matches('/'));
                }
                builder.build().await
            })
            .await
            .map_err(|e| {
                ProviderError::Unavailable(format!("cannot make a Compute Engine client: {e}"))
            })
    }

    async fn machine_types(&self) -> Result<&MachineTypes, ProviderError> {
        self.machine_types
            .get_or_try_init(|| async {
                let mut builder =
                    MachineTypes::builder().with_credentials(self.credentials.clone());
                if let Some(url) = &self.config.endpoint_url {
                    builder = builder.with_endpoint(url.trim_end_matches('/'));
                }
                builder.build().await
            })
            .await
            .map_err(|e| {
                ProviderError::Unavailable(format!("cannot make a Compute Engine client: {e}"))
            })
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let client = self.instances().await?;
        let mut found = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut call = client
                .aggregated_list()
                .set_project(&self.config.project)
                .set_filter(format!(
                    "labels.{} = \"true\"",
                    meridian_adapter_cloud::tags::MANAGED
                ))
                .set_max_results(500u32);
            if let Some(p) = &page {
                call = call.set_page_token(p);
            }
            let list = call.send().await.map_err(|e| provider_error(e.into()))?;
            for scoped in list.items.into_values() {
                found.extend(scoped.instances.iter().map(instance_of));
            }
            match list.next_page_token {
                Some(next) if !next.is_empty() => page = Some(next),
                _ => break,
            }
        }
        let now_listed: Vec<Instance> = found.iter().map(|(i, _)| i.clone()).collect();
        let mut gone = Vec::new();
        for missing in self.seen.missing(&now_listed) {
            let zone = missing.zone.clone().unwrap_or_default();
            match self.get(&zone, &missing.id).await? {
                // Not in the list yet (a list can lag an insert), but there.
                Some(there) => found.push(there),
                None => gone.push(missing.id),
            }
        }
        Ok(self.seen.merge(found, &gone))
    }

    /// Instance `name` of `zone`; `None` when Compute Engine has none.
    async fn get(&self, zone: &str, name: &str) -> Result<Option<(Instance, bool)>, ProviderError> {
        if zone.is_empty() {
            return Ok(None);
        }
        match self
            .instances()
            .await?
            .get()
            .set_project(&self.config.project)
            .set_zone(zone)
            .set_instance(name)
            .send()
            .await
        {
            Ok(instance) => Ok(Some(instance_of(&instance))),
            Err(e) => {
                let answer = Answer::from(e);
                if answer.not_found() {
                    Ok(None)
                } else {
                    Err(provider_error(answer))
                }
            }
        }
    }

    /// Follows a zone operation until it is done or `timeout` has passed: `Ok(true)` done,
    /// `Ok(false)` still running, `Err` what it failed with.
    async fn follow(
        &self,
        zone: &str,
        operation: model::Operation,
        timeout: Duration,
    ) -> Result<bool, Answer> {
        let started = std::time::Instant::now();
        let mut op = operation;
        let mut pause = Duration::from_millis(500);
        loop {
            if let Some(error) = &op.error {
                return Err(operation_answer(error, op.http_error_status_code));
            }
            if op.status == Some(model::operation::Status::Done) {
                return Ok(true);
            }
            if started.elapsed() >= timeout {
                return Ok(false);
            }
            let Some(name) = op.name.clone() else {
                return Err(Answer {
                    http: None,
                    codes: Vec::new(),
                    message: "Compute Engine answered an operation without a name".into(),
                });
            };
            op = self
                .instances()
                .await
                .map_err(|e| Answer {
                    http: None,
                    codes: Vec::new(),
                    message: e.to_string(),
                })?
                .get_operation()
                .set_project(&self.config.project)
                .set_zone(zone)
                .set_operation(name)
                .send()
                .await
                .map_err(Answer::from)?;
            if op.status != Some(model::operation::Status::Done) {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }

    /// The request body of `launch` in `zone`.
    fn body(
        &self,
        launch: &Launch<'_>,
        zone: &str,
        name: &str,
    ) -> Result<model::Instance, ProviderError> {
        let shape = MachineShape::parse(launch.instance_type)?;
        let gpu_vendor = launch
            .job
            .shape
            .as_ref()
            .and_then(|s| s.gpu_vendor.as_deref());
        let image = self.config.images.for_shape(
            launch.instance_type,
            architecture(&shape.machine_type),
            gpu_vendor,
        )?;

        let mut params = model::AttachedDiskInitializeParams::default();
        params.source_image = Some(image);
        params.disk_size_gb = self.config.boot_disk_gb.map(i64::from);
        params.disk_type = self
            .config
            .boot_disk_type
            .as_ref()
            .map(|t| format!("zones/{zone}/diskTypes/{t}"));
        let mut disk = model::AttachedDisk::default();
        disk.boot = Some(true);
        // The boot disk goes with the instance: nothing is left billing.
        disk.auto_delete = Some(true);
        disk.initialize_params = Some(params);

        let mut nic = model::NetworkInterface::default();
        match &self.config.subnetwork {
            Some(subnet) => nic.subnetwork = Some(subnet.clone()),
            None => nic.network = Some("global/networks/default".into()),
        }
        if self.config.external_ip {
            let mut access = model::AccessConfig::default();
            access.name = Some("External NAT".into());
            nic.access_configs.push(access);
        }

        let mut script = model::metadata::Items::default();
        script.key = Some("startup-script".into());
        script.value = Some(launch.user_data.to_string());
        let mut metadata = model::Metadata::default();
        metadata.items.push(script);

        let mut scheduling = model::Scheduling::default();
        scheduling.provisioning_model = Some(if launch.spot {
            model::scheduling::ProvisioningModel::Spot
        } else {
            model::scheduling::ProvisioningModel::Standard
        });
        // A preempted Spot instance, and one past its maxRunDuration, is deleted, not
        // kept stopped with its disk.
        scheduling.instance_termination_action =
            Some(model::scheduling::InstanceTerminationAction::Delete);
        let mut run = model::Duration::default();
        run.seconds = Some((launch.job.resources.walltime + RUN_DURATION_MARGIN).as_secs() as i64);
        scheduling.max_run_duration = Some(run);
        scheduling.automatic_restart = Some(false);
        if shape.accelerator.is_some() || gpu_vendor.is_some() || launch.spot {
            // GPU instances cannot live-migrate; Spot ones may not either.
            scheduling.on_host_maintenance = Some(model::scheduling::OnHostMaintenance::Terminate);
        }

        let mut instance = model::Instance::default();
        instance.name = Some(name.to_string());
        instance.machine_type = Some(format!("zones/{zone}/machineTypes/{}", shape.machine_type));
        instance.disks.push(disk);
        instance.network_interfaces.push(nic);
        instance.metadata = Some(metadata);
        instance.scheduling = Some(scheduling);
        instance.labels = launch
            .tags
            .iter()
            .map(|(k, v)| (k.clone(), label_value(v)))
            .collect();
        if let Some((accelerator, count)) = &shape.accelerator {
            let mut a = model::AcceleratorConfig::default();
            a.accelerator_type = Some(format!("zones/{zone}/acceleratorTypes/{accelerator}"));
            a.accelerator_count = Some(*count as i32);
            instance.guest_accelerators.push(a);
        }
        if let Some(email) = &self.config.service_account {
            let mut sa = model::ServiceAccount::default();
            sa.email = Some(email.clone());
            sa.scopes = vec!["https://www.googleapis.com/auth/cloud-platform".into()];
            instance.service_accounts.push(sa);
        }
        Ok(instance)
    }
}

/// The adapter's credentials from its configuration.
fn credentials(
    source: &Credentials,
) -> Result<google_cloud_auth::credentials::Credentials, String> {
    use google_cloud_auth::credentials as c;
    match source {
        Credentials::Adc => c::Builder::default()
            .build()
            .map_err(|e| format!("credentials: Application Default Credentials: {e}")),
        Credentials::Anonymous => Ok(c::anonymous::Builder::new().build()),
        Credentials::File(path) => {
            let field = format!("credentials.file: {}", path.display());
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("{field}: cannot read it: {e}"))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format!("{field}: not JSON: {e}"))?;
            let built = match json["type"].as_str().unwrap_or("") {
                "service_account" => c::service_account::Builder::new(json).build(),
                "authorized_user" => c::user_account::Builder::new(json).build(),
                "external_account" => c::external_account::Builder::new(json).build(),
                "impersonated_service_account" => c::impersonated::Builder::new(json).build(),
                other => {
                    return Err(format!(
                        "{field}: expected a credentials file of type service_account, authorized_user, external_account or impersonated_service_account; got {other:?}"
                    ))
                }
            };
            built.map_err(|e| format!("{field}: {e}"))
        }
    }
}

/// A catalogue shape at Compute Engine: a machine type, with GPUs attached to it where
/// its name says (`n1-standard-8+nvidia-tesla-t4:2`); machine types with GPUs of their
/// own (`a3-highgpu-8g`, `g2-standard-4`) need nothing more.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MachineShape {
    machine_type: String,
    accelerator: Option<(String, u32)>,
}

impl MachineShape {
    fn parse(shape: &str) -> Result<MachineShape, ProviderError> {
        let bad = || {
            ProviderError::Rejected(format!(
                "shape {shape:?}: expected a machine type (a3-highgpu-8g), or one with GPUs attached (n1-standard-8+nvidia-tesla-t4:2)"
            ))
        };
        let (machine_type, accelerator) = match shape.split_once('+') {
            None => (shape, None),
            Some((machine, attached)) => {
                let (kind, count) = match attached.split_once(':') {
                    None => (attached, 1),
                    Some((kind, count)) => (kind, count.parse::<u32>().map_err(|_| bad())?),
                };
                if kind.is_empty() || count == 0 {
                    return Err(bad());
                }
                (machine, Some((kind.to_string(), count)))
            }
        };
        if machine_type.is_empty()
            || !machine_type
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(bad());
        }
        Ok(MachineShape {
            machine_type: machine_type.to_string(),
            accelerator,
        })
    }
}

/// Arm machine families (`t2a`, `c4a`, `n4a`, `a4x`) are arm64; the rest x86_64.
fn architecture(machine_type: &str) -> &'static str {
    let family = machine_type.split('-').next().unwrap_or("");
    if matches!(family, "t2a" | "c4a" | "n4a" | "a4x") {
        "arm64"
    } else {
        "x86_64"
    }
}

/// A label value Compute Engine takes: at most 63 lower-case letters, digits, `_` and `-`.
fn label_value(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect()
}

/// The instance's name at Compute Engine (unique in its zone; a letter first).
fn instance_name(job: Uuid) -> String {
    format!("meridian-{}", job.simple())
}

/// The request id of a launch: Compute Engine wants a UUID, the same for the same launch
/// (a retried insert returns the first one's operation); the lifecycle's client token,
/// hashed.
fn request_id(client_token: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(client_token.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// The last part of a Compute Engine URL (`…/zones/us-central1-a` → `us-central1-a`).
fn last_part(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// An instance in the lifecycle's terms, and whether it is a Spot one.
fn instance_of(v: &model::Instance) -> (Instance, bool) {
    use model::instance::Status;
    let state = match &v.status {
        Some(Status::Provisioning | Status::Staging | Status::Pending) => InstanceState::Pending,
        Some(Status::Running | Status::Repairing) => InstanceState::Running,
        Some(
            Status::Stopping | Status::Suspending | Status::PendingStop | Status::Deprovisioning,
        ) => InstanceState::Stopping,
        // Compute Engine's TERMINATED is stopped: the instance and its disk are still
        // there (the disk bills) until it is deleted.
        Some(Status::Terminated | Status::Stopped | Status::Suspended) => InstanceState::Stopped,
        // A state not documented yet: still there, so treat it as booting.
        _ => InstanceState::Pending,
    };
    let spot = v.scheduling.as_ref().is_some_and(|s| {
        s.provisioning_model == Some(model::scheduling::ProvisioningModel::Spot)
            || s.preemptible == Some(true)
    });
    let time = |t: &Option<String>| {
        t.as_deref()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    let zone = v
        .zone
        .as_deref()
        .map(last_part)
        .unwrap_or_default()
        .to_string();
    let instance = Instance {
        // Its name: unique in its zone, and Meridian gives each run one name whatever the
        // zone, so a restarted adapter knows it from the run (`instance_id_of`).
        id: v.name.clone().unwrap_or_default(),
        state,
        zone: Some(zone).filter(|z| !z.is_empty()),
        launched_at: time(&v.creation_timestamp),
        // A stopped instance bills no compute from when it stopped.
        ended_at: (state == InstanceState::Stopped)
            .then(|| time(&v.last_stop_timestamp))
            .flatten(),
        // A Spot instance that stopped without Meridian stopping it was preempted; the
        // lifecycle asks only when Meridian did not end it.
        reclaimed: spot && matches!(state, InstanceState::Stopping | InstanceState::Stopped),
        reason: v.status_message.clone(),
        address: v
            .network_interfaces
            .first()
            .and_then(|n| n.network_ip.clone()),
        tags: v
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
    };
    (instance, spot)
}

/// A failed operation's errors as an answer.
fn operation_answer(error: &model::operation::Error, http: Option<i32>) -> Answer {
    Answer {
        http: http.and_then(|h| u16::try_from(h).ok()),
        codes: error.errors.iter().filter_map(|e| e.code.clone()).collect(),
        message: error
            .errors
            .iter()
            .filter_map(|e| e.message.clone())
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// An answer in the lifecycle's terms: a zone's exhausted resource pool is the zone's, a
/// quota the project's (every quota is regional or global), a request Compute Engine can
/// never take is rejected, anything else may pass.
fn provider_error(a: Answer) -> ProviderError {
    let code = a.codes.first().cloned().unwrap_or_default();
    let has = |set: &[&str]| a.codes.iter().find(|c| set.contains(&c.as_str())).cloned();
    if let Some(code) = has(CAPACITY_CODES) {
        return ProviderError::Capacity {
            code,
            message: a.message,
        };
    }
    if let Some(code) = has(QUOTA_CODES) {
        return ProviderError::Quota {
            code,
            message: a.message,
        };
    }
    let text = match (a.http, code.is_empty()) {
        (Some(h), false) => format!("{h} {code}: {}", a.message),
        (Some(h), true) => format!("{h}: {}", a.message),
        (None, false) => format!("{code}: {}", a.message),
        (None, true) => a.message.clone(),
    };
    if has(TRANSIENT_CODES).is_some() {
        return ProviderError::Unavailable(text);
    }
    if has(REJECTED_CODES).is_some() || matches!(a.http, Some(400 | 403 | 404)) {
        return ProviderError::Rejected(text);
    }
    ProviderError::Unavailable(text)
}

/// The catalogue's figures of a machine type: its vCPUs, memory and bundled GPUs.
fn shape_facts(name: &str, m: &model::MachineType, attached: Option<&(String, u32)>) -> ShapeFacts {
    let bundled = m.accelerators.first().map(|a| {
        (
            a.guest_accelerator_type.clone().unwrap_or_default(),
            a.guest_accelerator_count.unwrap_or(0).max(0) as u32,
        )
    });
    let gpus = attached.cloned().or(bundled).filter(|(_, n)| *n > 0);
    ShapeFacts {
        name: name.to_string(),
        cpus: m.guest_cpus.unwrap_or(0).max(0) as u32,
        memory_bytes: (m.memory_mb.unwrap_or(0).max(0) as u64) << 20,
        gpus: gpus.map(|(kind, count)| GpuFacts {
            count,
            // Compute Engine's accelerators are NVIDIA's (`nvidia-h100-80gb`).
            vendor: if kind.starts_with("amd-") {
                "amd"
            } else {
                "nvidia"
            }
            .into(),
            model: catalogue_model(&kind),
            // The machine type does not say: the catalogue's figure stays.
            memory_bytes: 0,
        }),
    }
}

#[async_trait]
impl CloudProvider for Gce {
    fn kind(&self) -> &'static str {
        "gcp"
    }

    fn zones(&self) -> Vec<String> {
        self.config.zones.clone()
    }

    fn max_user_data_bytes(&self) -> usize {
        MAX_STARTUP_SCRIPT
    }

    async fn launch(&self, launch: &Launch<'_>) -> Result<Instance, ProviderError> {
        let zone = launch
            .zone
            .map(str::to_string)
            .unwrap_or_else(|| self.config.zones[0].clone());
        let name = instance_name(launch.job.job_id);
        let body = self.body(launch, &zone, &name)?;
        let spot = launch.spot;
        self.listing.forget().await;
        let id = name.clone();
        let sent = self
            .instances()
            .await?
            .insert()
            .set_project(&self.config.project)
            .set_zone(&zone)
            .set_request_id(request_id(launch.client_token))
            .set_body(body)
            .send()
            .await;
        let operation = match sent {
            Ok(op) => op,
            Err(e) => {
                let answer = Answer::from(e);
                // Created already (the same launch sent again after its request id
                // expired): that instance.
                if answer.http == Some(409) {
                    if let Some((instance, spot)) = self.get(&zone, &name).await? {
                        self.seen.remember(&instance, spot);
                        return Ok(instance);
                    }
                }
                return Err(provider_error(answer));
            }
        };
        let timeout = Duration::from_secs(self.config.operation_timeout_seconds);
        match self.follow(&zone, operation, timeout).await {
            Ok(done) => match self.get(&zone, &name).await? {
                Some((instance, spot)) => {
                    self.seen.remember(&instance, spot);
                    Ok(instance)
                }
                // Still being created: followed as a booting instance.
                None if !done => {
                    let instance = Instance {
                        id,
                        state: InstanceState::Pending,
                        zone: Some(zone),
                        launched_at: Some(Utc::now()),
                        ended_at: None,
                        reason: None,
                        reclaimed: false,
                        address: None,
                        tags: launch.tags.iter().cloned().collect(),
                    };
                    self.seen.remember(&instance, spot);
                    Ok(instance)
                }
                None => Err(ProviderError::Unavailable(format!(
                    "the insert of {id} ended but Compute Engine has no such instance"
                ))),
            },
            Err(answer) => {
                tracing::info!(instance = %id, codes = ?answer.codes, "insert failed");
                Err(provider_error(answer))
            }
        }
    }

    /// Every instance of Meridian's in the project (one aggregated list, every zone at once),
    /// from the last list while it is fresh; those seen before and now gone are there too,
    /// terminated.
    async fn listed(&self) -> Result<Vec<Instance>, ProviderError> {
        self.listing.get(|| self.list()).await
    }

    fn instance_id_of(&self, job_id: Uuid) -> Option<String> {
        Some(instance_name(job_id))
    }

    fn job_of_instance_id(&self, id: &str) -> Option<Uuid> {
        id.strip_prefix("meridian-")
            .and_then(|simple| Uuid::try_parse(simple).ok())
    }

    async fn terminate(&self, ids: &[String]) -> Result<(), ProviderError> {
        // Where each one is: an instance is deleted in its zone.
        let all = self.listed().await?;
        self.listing.forget().await;
        let client = self.instances().await?;
        let there = all
            .iter()
            .filter(|i| ids.contains(&i.id) && i.state != InstanceState::Terminated);
        for instance in there {
            let Some(zone) = &instance.zone else {
                continue;
            };
            // The delete's operation is not waited for: the lifecycle follows the
            // instance until it is gone.
            match client
                .delete()
                .set_project(&self.config.project)
                .set_zone(zone)
                .set_instance(&instance.id)
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) => {
                    let answer = Answer::from(e);
                    if !answer.not_found() {
                        return Err(provider_error(answer));
                    }
                }
            }
        }
        Ok(())
    }

    async fn check(&self) -> Result<(), ProviderError> {
        let call = async {
            self.instances()
                .await?
                .list()
                .set_project(&self.config.project)
                .set_zone(&self.config.zones[0])
                .set_max_results(1u32)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| provider_error(e.into()))
        };
        // The client retries for up to a minute, and credentials that cannot be had (no
        // metadata server) may take as long to fail: the site's health says so sooner.
        match tokio::time::timeout(CHECK_TIMEOUT, call).await {
            Ok(answer) => answer,
            Err(_) => Err(ProviderError::Unavailable(format!(
                "Compute Engine did not answer within {} s (credentials: {}; are they there, and is the endpoint reachable?)",
                CHECK_TIMEOUT.as_secs(),
                match &self.config.credentials {
                    Credentials::Adc => "Application Default Credentials".to_string(),
                    Credentials::File(path) => path.display().to_string(),
                    Credentials::Anonymous => "none".to_string(),
                }
            ))),
        }
    }

    async fn shapes(&self, names: &[String]) -> Result<Vec<ShapeFacts>, ProviderError> {
        let client = self.machine_types().await?;
        let mut out = Vec::new();
        for name in names {
            let Ok(shape) = MachineShape::parse(name) else {
                continue;
            };
            match client
                .get()
                .set_project(&self.config.project)
                .set_zone(&self.config.zones[0])
                .set_machine_type(&shape.machine_type)
                .send()
                .await
            {
                Ok(m) => out.push(shape_facts(name, &m, shape.accelerator.as_ref())),
                Err(e) => {
                    let answer = Answer::from(e);
                    // Not offered in this zone: the catalogue's figures stay.
                    if !answer.not_found() {
                        return Err(provider_error(answer));
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(http: Option<u16>, code: &str, message: &str) -> Answer {
        Answer {
            http,
            codes: vec![code.to_string()],
            message: message.into(),
        }
    }

    #[test]
    fn compute_engines_errors_map_onto_the_lifecycle() {
        for code in [
            "ZONE_RESOURCE_POOL_EXHAUSTED",
            "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        ] {
            assert!(matches!(
                provider_error(answer(
                    None,
                    code,
                    "The zone does not have enough resources"
                )),
                ProviderError::Capacity { .. }
            ));
        }
        assert!(matches!(
            provider_error(answer(Some(503), "insufficientCapacity", "no capacity")),
            ProviderError::Capacity { .. }
        ));
        assert!(matches!(
            provider_error(answer(
                None,
                "QUOTA_EXCEEDED",
                "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."
            )),
            ProviderError::Quota { .. }
        ));
        assert!(matches!(
            provider_error(answer(
                Some(403),
                "quotaExceeded",
                "Quota 'NVIDIA_H100_GPUS' exceeded."
            )),
            ProviderError::Quota { .. }
        ));
        assert!(matches!(
            provider_error(answer(
                Some(404),
                "notFound",
                "The resource 'machineTypes/x' was not found"
            )),
            ProviderError::Rejected(_)
        ));
        assert!(matches!(
            provider_error(answer(
                Some(403),
                "forbidden",
                "Required 'compute.instances.create' permission"
            )),
            ProviderError::Rejected(_)
        ));
        assert!(matches!(
            provider_error(answer(Some(403), "rateLimitExceeded", "slow down")),
            ProviderError::Unavailable(_)
        ));
        assert!(matches!(
            provider_error(answer(Some(503), "backendError", "try again")),
            ProviderError::Unavailable(_)
        ));
        let e = provider_error(answer(Some(503), "backendError", "try again"));
        assert_eq!(e.to_string(), "503 backendError: try again");
    }

    #[test]
    fn a_shape_is_a_machine_type_with_gpus_attached_where_its_name_says() {
        assert_eq!(
            MachineShape::parse("a3-highgpu-8g").unwrap(),
            MachineShape {
                machine_type: "a3-highgpu-8g".into(),
                accelerator: None
            }
        );
        assert_eq!(
            MachineShape::parse("n1-standard-8+nvidia-tesla-t4:2")
                .unwrap()
                .accelerator,
            Some(("nvidia-tesla-t4".into(), 2))
        );
        assert_eq!(
            MachineShape::parse("n1-standard-8+nvidia-tesla-t4")
                .unwrap()
                .accelerator,
            Some(("nvidia-tesla-t4".into(), 1))
        );
        for bad in [
            "N1-standard",
            "n1-standard-8+",
            "n1-standard-8+t4:x",
            "n1-standard-8+t4:0",
            "",
        ] {
            assert!(MachineShape::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(architecture("c4a-standard-8"), "arm64");
        assert_eq!(architecture("a3-highgpu-8g"), "x86_64");
    }

    #[test]
    fn names_labels_and_request_ids_are_what_compute_engine_takes() {
        let job = Uuid::now_v7();
        let name = instance_name(job);
        assert!(name.len() <= 63 && name.starts_with("meridian-"));
        assert_eq!(label_value("Train.Step 1"), "train_step_1");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
        let one = request_id("meridian-abc-us-central1-a");
        assert_eq!(one, request_id("meridian-abc-us-central1-a"));
        assert_ne!(one, request_id("meridian-abc-us-central1-b"));
        assert!(Uuid::parse_str(&one).is_ok());
    }

    #[test]
    fn machine_types_give_cpus_memory_and_gpus() {
        let mut m = model::MachineType::default();
        m.guest_cpus = Some(208);
        m.memory_mb = Some(1_916_928);
        let mut a = model::machine_type::Accelerators::default();
        a.guest_accelerator_type = Some("nvidia-h100-80gb".into());
        a.guest_accelerator_count = Some(8);
        m.accelerators.push(a);
        let f = shape_facts("a3-highgpu-8g", &m, None);
        assert_eq!((f.cpus, f.memory_bytes >> 30), (208, 1872));
        let g = f.gpus.unwrap();
        assert_eq!(
            (g.count, g.vendor.as_str(), g.model.as_str()),
            (8, "nvidia", "H100")
        );
        let mut n1 = model::MachineType::default();
        n1.guest_cpus = Some(8);
        n1.memory_mb = Some(30_720);
        let t4 = shape_facts(
            "n1-standard-8+nvidia-tesla-t4:2",
            &n1,
            Some(&("nvidia-tesla-t4".into(), 2)),
        );
        assert_eq!(t4.gpus.unwrap().model, "T4");
        assert!(shape_facts("n1-standard-8", &n1, None).gpus.is_none());
    }
}
