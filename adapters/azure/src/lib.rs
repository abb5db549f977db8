//! The Azure site: the cloud VM lifecycle of `meridian-adapter-cloud` over Azure Resource
//! Manager's REST API. This crate is only ARM's calls (a NIC and a VM created, followed
//! through `Azure-AsyncOperation`, listed, deleted with their disk and NIC; the
//! location's VM sizes) and the mapping of ARM's states and error codes onto the
//! lifecycle. Tokens come from Microsoft Entra ID ([`credential`]); ADR 0012 says why
//! not `azure_mgmt_compute`.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use chrono::{DateTime, Utc};
use meridian_adapter_cloud::{
    build_site, listed, tags, CloudProvider, Instance, InstanceState, Launch, ProviderError,
};
use meridian_adapter_core::gpu::catalogue_model;
use meridian_adapter_core::registry::parse_config;
use meridian_adapter_core::{GpuFacts, ShapeFacts};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

mod config;
pub mod credential;

pub use config::{is_image, AzureConfig};
use credential::{Credential, Source};

/// The registry's entry for `azure` sites.
pub const REGISTRATION: meridian_adapter_core::Registration = meridian_adapter_core::Registration {
    kind: "azure",
    about: "Azure: a VM of the placed size per run, Spot when placement allows",
    needs_config: true,
    build: |text, context| {
        let config: AzureConfig = parse_config(text)?;
        let (lifecycle, refresh) = (config.lifecycle.clone(), config.refresh_shapes);
        let source = Source::from_env(|k| std::env::var(k).ok());
        build_site(Arm::new(config, source), lifecycle, refresh, context)
    },
};

const COMPUTE_API: &str = "2024-07-01";
const NETWORK_API: &str = "2024-05-01";
const SKUS_API: &str = "2021-07-01";

/// Azure takes at most 64 KB of custom data, base64-encoded.
const MAX_CUSTOM_DATA: usize = 48 * 1024;

/// ARM's codes for a zone or location without the capacity asked for now.
const CAPACITY_CODES: &[&str] = &[
    "AllocationFailed",
    "ZonalAllocationFailed",
    "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest",
    "SkuNotAvailable",
];

/// ARM's codes for the subscription's quotas.
const QUOTA_CODES: &[&str] = &[
    "QuotaExceeded",
    "SpotQuotaExceeded",
    "LowPriorityQuotaExceeded",
];

/// Azure, as the lifecycle's provider.
pub struct Arm {
    config: AzureConfig,
    credential: Credential,
    http: reqwest::Client,
    base: String,
    /// VMs seen: a deleted VM vanishes from ARM at once.
    seen: listed::Seen,
    listing: listed::Cache,
}

/// An error ARM answered.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    code: String,
    message: String,
}

impl Arm {
    pub fn new(config: AzureConfig, source: Source) -> Result<Arm, String> {
        config.check()?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        let credential = Credential::new(
            source,
            config
                .authority_url
                .as_deref()
                .unwrap_or("https://login.microsoftonline.com"),
            config
                .metadata_url
                .as_deref()
                .unwrap_or("http://169.254.169.254"),
            http.clone(),
        );
        let base = config
            .endpoint_url
            .clone()
            .unwrap_or_else(|| "https://management.azure.com".into())
            .trim_end_matches('/')
            .to_string();
        Ok(Arm {
            config,
            credential,
            http,
            base,
            seen: listed::Seen::default(),
            listing: listed::Cache::new(Duration::from_secs(2)),
        })
    }

    /// Lists the resource group again when the last list is older than `every` (2 s by
    /// default; tests that step the stand-in look by look use zero).
    pub fn listing_every(mut self, every: Duration) -> Arm {
        self.listing = listed::Cache::new(every);
        self
    }

    fn group(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}",
            self.config.subscription, self.config.resource_group
        )
    }

    fn vm_path(&self, name: &str) -> String {
        format!(
            "{}/providers/Microsoft.Compute/virtualMachines/{name}",
            self.group()
        )
    }

    fn nic_path(&self, name: &str) -> String {
        format!(
            "{}/providers/Microsoft.Network/networkInterfaces/{name}",
            self.group()
        )
    }

    /// One call: `url` a path under the ARM endpoint (with its api-version) or an
    /// absolute URL ARM gave. The answer's JSON and its `Azure-AsyncOperation`.
    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value, Option<String>, Option<u64>), Answer> {
        let token = self.credential.token().await.map_err(|message| Answer {
            status: StatusCode::UNAUTHORIZED,
            code: "NoToken".into(),
            message,
        })?;
        let url = if url.starts_with("http") {
            url.to_string()
        } else {
            format!("{}{url}", self.base)
        };
        let mut request = self.http.request(method, &url).bearer_auth(token);
        if let Some(b) = body {
            request = request.json(b);
        }
        let unreachable = |e: reqwest::Error| Answer {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "Unreachable".into(),
            message: e.without_url().to_string(),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED {
            // A revoked or expired token: the next call gets a new one.
            self.credential.forget().await;
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let operation = header("azure-asyncoperation");
        let retry_after = header("retry-after").and_then(|s| s.parse().ok());
        let text = response.text().await.map_err(unreachable)?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok((status, value, operation, retry_after));
        }
        Err(Answer {
            status,
            code: value["error"]["code"].as_str().unwrap_or("").to_string(),
            message: value["error"]["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or(text),
        })
    }

    /// Follows a long-running operation to its end: `Ok` when it succeeded, its error
    /// when it failed.
    async fn follow(&self, operation: &str, first_wait: Option<u64>) -> Result<(), Answer> {
        let deadline = tokio::time::Instant::now()
            + Duration::from_secs(self.config.operation_timeout_seconds);
        let mut wait = first_wait;
        loop {
            // ARM says how long to wait; a stand-in may say 0.
            tokio::time::sleep(Duration::from_millis(
                wait.map_or(2000, |s| (s * 1000).max(50)),
            ))
            .await;
            let (_, v, _, retry) = match self.call(Method::GET, operation, None).await {
                Ok(answer) => answer,
                // A throttle or a hiccup while following: look again.
                Err(a)
                    if (a.status.is_server_error()
                        || a.status == StatusCode::TOO_MANY_REQUESTS)
                        && tokio::time::Instant::now() < deadline =>
                {
                    wait = None;
                    continue;
                }
                Err(a) => return Err(a),
            };
            match v["status"].as_str().unwrap_or("") {
                "Succeeded" => return Ok(()),
                "Failed" | "Canceled" => {
                    return Err(Answer {
                        status: StatusCode::OK,
                        code: v["error"]["code"].as_str().unwrap_or("Failed").to_string(),
                        message: v["error"]["message"].as_str().unwrap_or("").to_string(),
                    })
                }
                _ if tokio::time::Instant::now() > deadline => {
                    return Err(Answer {
                        status: StatusCode::GATEWAY_TIMEOUT,
                        code: "OperationTimedOut".into(),
                        message: format!(
                            "not done after {} s (operation_timeout_seconds)",
                            self.config.operation_timeout_seconds
                        ),
                    })
                }
                _ => wait = retry,
            }
        }
    }

    /// A create (PUT) followed to its end.
    async fn put(&self, path: &str, api: &str, body: &Value) -> Result<Value, Answer> {
        let (_, value, operation, retry) = self
            .call(
                Method::PUT,
                &format!("{path}?api-version={api}"),
                Some(body),
            )
            .await?;
        if let Some(op) = operation {
            self.follow(&op, retry).await?;
        }
        Ok(value)
    }

    /// Deletes a resource, following the deletion to its end when `wait`; gone already
    /// is done.
    async fn delete(&self, path: &str, api: &str, wait: bool) -> Result<(), Answer> {
        match self
            .call(Method::DELETE, &format!("{path}?api-version={api}"), None)
            .await
        {
            Ok((_, _, Some(operation), retry)) if wait => self.follow(&operation, retry).await,
            Ok(_) => Ok(()),
            Err(a) if a.status == StatusCode::NOT_FOUND => Ok(()),
            Err(a) => Err(a),
        }
    }

    /// Every VM of the resource group, from the last list while it is fresh.
    async fn vms(&self) -> Result<Vec<Instance>, ProviderError> {
        self.listing.get(|| self.list_vms()).await
    }

    /// Every VM of the resource group, Meridian's with their power state; Meridian's VMs
    /// seen before that ARM no longer has are there too, terminated.
    async fn list_vms(&self) -> Result<Vec<Instance>, ProviderError> {
        let mut url = format!(
            "{}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_API}",
            self.group()
        );
        let mut listed = Vec::new();
        loop {
            let (_, page, _, _) = self
                .call(Method::GET, &url, None)
                .await
                .map_err(provider_error)?;
            listed.extend(page["value"].as_array().cloned().unwrap_or_default());
            match page["nextLink"].as_str() {
                Some(next) if !next.is_empty() => url = next.to_string(),
                _ => break,
            }
        }
        let mut out = Vec::new();
        for vm in &listed {
            let name = vm["name"].as_str().unwrap_or_default();
            let managed = vm["tags"][tags::MANAGED].as_str() == Some("true");
            // Only Meridian's VMs are asked for their power state.
            let power = if managed {
                match self
                    .call(
                        Method::GET,
                        &format!(
                            "{}/instanceView?api-version={COMPUTE_API}",
                            self.vm_path(name)
                        ),
                        None,
                    )
                    .await
                {
                    Ok((_, view, _, _)) => power_state(&view),
                    Err(a) if a.status == StatusCode::NOT_FOUND => Some("deleted".into()),
                    Err(a) => return Err(provider_error(a)),
                }
            } else {
                None
            };
            out.push(seen_of(vm, power.as_deref()));
        }
        // Meridian's VMs seen before and missing from this list: gone only when ARM says
        // so for that VM (a list can lag a create).
        let listed_now: Vec<Instance> = out.iter().map(|(i, _)| i.clone()).collect();
        let mut gone = Vec::new();
        for name in self.seen.missing(&listed_now).into_iter().map(|vm| vm.id) {
            match self
                .call(
                    Method::GET,
                    &format!("{}?api-version={COMPUTE_API}", self.vm_path(&name)),
                    None,
                )
                .await
            {
                Err(a) if a.status == StatusCode::NOT_FOUND => gone.push(name),
                Err(a) => return Err(provider_error(a)),
                Ok(_) => {}
            }
        }
        Ok(self.seen.merge(out, &gone))
    }
}

/// The power state in an instance view (`PowerState/running` → `running`).
fn power_state(view: &Value) -> Option<String> {
    view["statuses"].as_array()?.iter().find_map(|s| {
        s["code"]
            .as_str()?
            .strip_prefix("PowerState/")
            .map(str::to_string)
    })
}

/// A VM as an instance, and whether it is a Spot VM.
fn seen_of(vm: &Value, power: Option<&str>) -> (Instance, bool) {
    let p = &vm["properties"];
    let state = match (p["provisioningState"].as_str().unwrap_or(""), power) {
        ("Deleting", _) => InstanceState::Terminating,
        // A failed update of a running VM leaves it running.
        ("Failed", Some("running")) => InstanceState::Running,
        // A VM whose creation failed runs nothing: ended like a stopped one.
        ("Failed", _) => InstanceState::Stopped,
        (_, Some("running")) => InstanceState::Running,
        (_, Some("stopping" | "deallocating")) => InstanceState::Stopping,
        (_, Some("stopped" | "deallocated")) => InstanceState::Stopped,
        (_, Some("deleted")) => InstanceState::Terminated,
        _ => InstanceState::Pending,
    };
    let instance = Instance {
        id: vm["name"].as_str().unwrap_or_default().to_string(),
        state,
        zone: vm["zones"][0].as_str().map(str::to_string),
        launched_at: p["timeCreated"]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc)),
        ended_at: None,
        reclaimed: false,
        reason: None,
        address: None,
        tags: vm["tags"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect::<BTreeMap<_, _>>()
            })
            .unwrap_or_default(),
    };
    (instance, p["priority"].as_str() == Some("Spot"))
}

/// An answer in the lifecycle's terms: an allocation failure is the zone's, a quota the
/// subscription's, a request ARM can never take is rejected, anything else may pass.
fn provider_error(a: Answer) -> ProviderError {
    let text = format!("{}: {}", a.code, a.message);
    if CAPACITY_CODES.contains(&a.code.as_str()) {
        return ProviderError::Capacity {
            code: a.code,
            message: a.message,
        };
    }
    let quota = a.message.to_ascii_lowercase().contains("quota");
    if QUOTA_CODES.contains(&a.code.as_str()) || (a.code == "OperationNotAllowed" && quota) {
        return ProviderError::Quota {
            code: a.code,
            message: a.message,
        };
    }
    match a.code.as_str() {
        "InvalidParameter"
        | "InvalidTemplate"
        | "InvalidRequestFormat"
        | "ImageNotFound"
        | "PlatformImageNotFound"
        | "InvalidResourceReference"
        | "AuthorizationFailed"
        | "LinkedAuthorizationFailed"
        | "InvalidSubscriptionId"
        | "ResourceGroupNotFound"
        | "SubscriptionNotFound" => ProviderError::Rejected(text),
        _ => ProviderError::Unavailable(format!("{} {text}", a.status.as_u16())),
    }
}

/// The VM's name from its run: ARM creates by name, so the same run is the same VM (a
/// repeated PUT changes nothing), whatever the zone, and a restarted adapter knows the
/// VM of a run from the run alone (`instance_id_of`).
fn vm_name(job_id: Uuid) -> String {
    format!("mer-{}", job_id.simple())
}

/// `publisher:offer:sku:version`, or an image's resource id.
fn image_reference(image: &str) -> Value {
    match image.split(':').collect::<Vec<_>>().as_slice() {
        [publisher, offer, sku, version] if !image.starts_with('/') => {
            json!({"publisher": publisher, "offer": offer, "sku": sku, "version": version})
        }
        _ => json!({"id": image}),
    }
}

/// Arm64 sizes carry a `p` among the letters after their vCPU count (`Standard_D4ps_v5`).
fn architecture(size: &str) -> &'static str {
    let family = size
        .trim_start_matches("Standard_")
        .split('_')
        .next()
        .unwrap_or("");
    let features = family.trim_start_matches(|c: char| c.is_ascii_alphabetic());
    let features = features.trim_start_matches(|c: char| c.is_ascii_digit());
    if features.contains('p') {
        "arm64"
    } else {
        "x86_64"
    }
}

/// The catalogue's figures of a VM size from the resource SKUs list: vCPUs, memory, GPUs
/// (the model from the size's name: `Standard_ND96isr_H100_v5` → H100,
/// `Standard_ND96isr_MI300X_v5` → MI300X).
pub fn size_facts(sku: &Value) -> Option<ShapeFacts> {
    let name = sku["name"].as_str()?.to_string();
    let capability = |key: &str| {
        sku["capabilities"].as_array()?.iter().find_map(|c| {
            (c["name"].as_str() == Some(key)).then(|| c["value"].as_str()?.parse::<f64>().ok())?
        })
    };
    let gpus = capability("GPUs").unwrap_or(0.0) as u32;
    let model = name
        .split('_')
        .skip(2)
        .map(catalogue_model)
        .find(|m| !m.starts_with('v') && m.chars().any(|c| c.is_ascii_digit()))
        .unwrap_or_default();
    Some(ShapeFacts {
        cpus: capability("vCPUs").unwrap_or(0.0) as u32,
        memory_bytes: (capability("MemoryGB").unwrap_or(0.0) * (1u64 << 30) as f64) as u64,
        gpus: (gpus > 0).then(|| GpuFacts {
            count: gpus,
            vendor: if model.starts_with("MI") {
                "amd".into()
            } else {
                "nvidia".into()
            },
            model,
            // The SKU list does not say: the catalogue's figure stays.
            memory_bytes: 0,
        }),
        name,
    })
}

#[async_trait]
impl CloudProvider for Arm {
    fn kind(&self) -> &'static str {
        "azure"
    }

    fn zones(&self) -> Vec<String> {
        self.config.zones.clone()
    }

    fn max_user_data_bytes(&self) -> usize {
        MAX_CUSTOM_DATA
    }

    async fn launch(&self, launch: &Launch<'_>) -> Result<Instance, ProviderError> {
        let gpu_vendor = launch
            .job
            .shape
            .as_ref()
            .and_then(|s| s.gpu_vendor.as_deref());
        let image = self.config.images.for_shape(
            launch.instance_type,
            architecture(launch.instance_type),
            gpu_vendor,
        )?;
        let name = vm_name(launch.job.job_id);
        let nic_name = format!("{name}-nic");
        let tags: serde_json::Map<String, Value> = launch
            .tags
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let nic = json!({
            "location": self.config.location,
            "tags": tags,
            "properties": {"ipConfigurations": [{
                "name": "primary",
                "properties": {"subnet": {"id": self.config.subnet}, "privateIPAllocationMethod": "Dynamic"},
            }]},
        });
        let nic_path = self.nic_path(&nic_name);
        self.put(&nic_path, NETWORK_API, &nic)
            .await
            .map_err(provider_error)?;
        let user = &self.config.admin_username;
        let mut vm = json!({
            "location": self.config.location,
            "tags": tags,
            "properties": {
                "hardwareProfile": {"vmSize": launch.instance_type},
                "storageProfile": {
                    "imageReference": image_reference(&image),
                    // The disk and the NIC go with the VM: nothing is left billing.
                    "osDisk": {"createOption": "FromImage", "deleteOption": "Delete",
                               "managedDisk": {"storageAccountType": self.config.os_disk_type}},
                },
                "osProfile": {
                    "computerName": name,
                    "adminUsername": user,
                    "customData": base64::engine::general_purpose::STANDARD.encode(launch.user_data),
                    "linuxConfiguration": {
                        "disablePasswordAuthentication": true,
                        "ssh": {"publicKeys": [{"path": format!("/home/{user}/.ssh/authorized_keys"),
                                                "keyData": self.config.ssh_public_key}]},
                    },
                },
                "networkProfile": {"networkInterfaces": [{
                    "id": nic_path,
                    "properties": {"primary": true, "deleteOption": "Delete"},
                }]},
            },
        });
        if let Some(zone) = launch.zone {
            vm["zones"] = json!([zone]);
        }
        if launch.spot {
            vm["properties"]["priority"] = json!("Spot");
            vm["properties"]["evictionPolicy"] = json!("Delete");
            // Up to the on-demand price: evicted for capacity, never for price.
            vm["properties"]["billingProfile"] = json!({"maxPrice": -1});
        }
        let vm_path = self.vm_path(&name);
        self.listing.forget().await;
        match self.put(&vm_path, COMPUTE_API, &vm).await {
            Ok(_) => {}
            // Still creating after operation_timeout_seconds: no answer either way yet.
            // The VM is followed as any other; a create that fails later ends its run as
            // a failure of the site, and the work is placed again.
            Err(a) if a.code == "OperationTimedOut" => {
                tracing::warn!(vm = %name, "the VM's creation is still under way; following it as a booting VM");
            }
            Err(a) => {
                // What creation left: a failed VM (its disk and NIC go with it) or, when ARM
                // refused at once, the NIC alone.
                let cleanup = match self.delete(&vm_path, COMPUTE_API, true).await {
                    Ok(()) => self.delete(&nic_path, NETWORK_API, true).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = cleanup {
                    tracing::warn!(vm = %name, error = ?e, "could not clean up after a failed create; the leak sweep will");
                    // The next zone's create would meet this VM under the same name: no
                    // next zone now; the run is tried again later.
                    return Err(ProviderError::Unavailable(format!(
                        "{}: {} (and the failed VM {name} could not be removed yet: {}: {})",
                        a.code, a.message, e.code, e.message
                    )));
                }
                return Err(provider_error(a));
            }
        }
        let (_, created, _, _) = self
            .call(
                Method::GET,
                &format!("{vm_path}?api-version={COMPUTE_API}&$expand=instanceView"),
                None,
            )
            .await
            .map_err(provider_error)?;
        let (instance, spot) = seen_of(
            &created,
            power_state(&created["properties"]["instanceView"]).as_deref(),
        );
        self.seen.remember(&instance, spot);
        Ok(instance)
    }

    /// One list for every look: ARM has no call that takes several VMs.
    async fn listed(&self) -> Result<Vec<Instance>, ProviderError> {
        self.vms().await
    }

    fn instance_id_of(&self, job_id: Uuid) -> Option<String> {
        Some(vm_name(job_id))
    }

    fn job_of_instance_id(&self, id: &str) -> Option<Uuid> {
        id.strip_prefix("mer-")
            .and_then(|simple| Uuid::try_parse(simple).ok())
    }

    async fn terminate(&self, ids: &[String]) -> Result<(), ProviderError> {
        self.listing.forget().await;
        for name in ids {
            // Not followed: the lifecycle sees it Deleting, then gone.
            self.delete(&self.vm_path(name), COMPUTE_API, false)
                .await
                .map_err(provider_error)?;
        }
        Ok(())
    }

    async fn check(&self) -> Result<(), ProviderError> {
        self.call(
            Method::GET,
            &format!(
                "{}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_API}",
                self.group()
            ),
            None,
        )
        .await
        .map(|_| ())
        .map_err(provider_error)
    }

    async fn shapes(&self, names: &[String]) -> Result<Vec<ShapeFacts>, ProviderError> {
        let url = format!(
            "/subscriptions/{}/providers/Microsoft.Compute/skus?api-version={SKUS_API}&$filter=location%20eq%20'{}'",
            self.config.subscription, self.config.location
        );
        let (_, skus, _, _) = self
            .call(Method::GET, &url, None)
            .await
            .map_err(provider_error)?;
        Ok(skus["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["resourceType"].as_str() == Some("virtualMachines"))
            .filter_map(size_facts)
            .filter(|f| names.contains(&f.name))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: &str, message: &str) -> Answer {
        Answer {
            status: StatusCode::CONFLICT,
            code: code.into(),
            message: message.into(),
        }
    }

    #[test]
    fn arms_errors_map_onto_the_lifecycle() {
        for code in CAPACITY_CODES {
            assert!(
                matches!(
                    provider_error(answer(code, "x")),
                    ProviderError::Capacity { .. }
                ),
                "{code}"
            );
        }
        assert!(matches!(
            provider_error(answer("OperationNotAllowed", "Operation could not be completed as it results in exceeding approved Total Regional Cores quota.")),
            ProviderError::Quota { .. }
        ));
        assert!(matches!(
            provider_error(answer("QuotaExceeded", "x")),
            ProviderError::Quota { .. }
        ));
        assert!(matches!(
            provider_error(answer("ImageNotFound", "x")),
            ProviderError::Rejected(_)
        ));
        assert!(matches!(
            provider_error(answer("InternalServerError", "x")),
            ProviderError::Unavailable(_)
        ));
    }

    #[test]
    fn names_images_and_architectures() {
        let job = Uuid::try_parse("0192f7a1-b2c3-d4e5-f607-18293a4b5c6d").unwrap();
        let name = vm_name(job);
        assert_eq!(name, "mer-0192f7a1b2c3d4e5f60718293a4b5c6d");
        assert!(name.len() <= 64);
        let arm = Arm::new(
            meridian_adapter_core::registry::parse_config(
                "subscription: 6f3c1a52-9d1e-4b7a-8c2f-0e5d4a3b2c1d\nresource_group: jobs\nlocation: eastus\nsubnet: /subscriptions/6f3c1a52-9d1e-4b7a-8c2f-0e5d4a3b2c1d/resourceGroups/n/providers/Microsoft.Network/virtualNetworks/v/subnets/s\nimages: {x86_64: 'Canonical:ubuntu-24_04-lts:server:latest'}\nssh_public_key: ssh-ed25519 AAAA ops\n",
            )
            .unwrap(),
            credential::Source::ManagedIdentity { client: None },
        )
        .unwrap();
        assert_eq!(arm.instance_id_of(job).as_deref(), Some(name.as_str()));
        assert_eq!(arm.job_of_instance_id(&name), Some(job));
        assert_eq!(arm.job_of_instance_id("web-1"), None);
        assert_eq!(
            image_reference("Canonical:ubuntu-24_04-lts:server:latest")["offer"],
            "ubuntu-24_04-lts"
        );
        assert_eq!(
            image_reference("/subscriptions/s/images/i")["id"],
            "/subscriptions/s/images/i"
        );
        assert_eq!(architecture("Standard_D4ps_v5"), "arm64");
        assert_eq!(architecture("Standard_ND96isr_H100_v5"), "x86_64");
        assert_eq!(architecture("Standard_NC24ads_A100_v4"), "x86_64");
    }

    #[test]
    fn sizes_name_their_gpu_models() {
        let sku = |name: &str, gpus: &str| {
            json!({"resourceType": "virtualMachines", "name": name, "capabilities": [
                {"name": "vCPUs", "value": "96"}, {"name": "MemoryGB", "value": "1900"},
                {"name": "GPUs", "value": gpus}]})
        };
        let h100 = size_facts(&sku("Standard_ND96isr_H100_v5", "8")).unwrap();
        let g = h100.gpus.unwrap();
        assert_eq!(
            (h100.cpus, g.count, g.model.as_str(), g.vendor.as_str()),
            (96, 8, "H100", "nvidia")
        );
        let mi = size_facts(&sku("Standard_ND96isr_MI300X_v5", "8"))
            .unwrap()
            .gpus
            .unwrap();
        assert_eq!((mi.model.as_str(), mi.vendor.as_str()), ("MI300X", "amd"));
        assert_eq!(size_facts(&sku("Standard_D4s_v5", "0")).unwrap().gpus, None);
    }
}
