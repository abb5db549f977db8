//! The Oracle Cloud (OCI) site: the cloud VM lifecycle of `meridian-adapter-cloud` over
//! OCI's Core Services REST API, signed by Meridian's own request signer ([`signer`]).
//! This crate is only OCI's calls (LaunchInstance, ListInstances, TerminateInstance,
//! ListShapes) and the mapping of OCI's states and errors onto the lifecycle. The SDK
//! that would do this for Rust is AGPL-3.0 and is not linked (see ADR 0011).

use std::collections::BTreeMap;

use async_trait::async_trait;
use base64::Engine;
use chrono::{DateTime, Utc};
use meridian_adapter_cloud::{
    build_site, listed, CloudProvider, Instance, InstanceState, Launch, ProviderError,
};
use meridian_adapter_core::gpu::catalogue_model;
use meridian_adapter_core::registry::parse_config;
use meridian_adapter_core::{GpuFacts, ShapeFacts};
use reqwest::{Method, StatusCode, Url};
use serde_json::{json, Value};

mod config;
pub mod signer;

pub use config::{parse_profile, ApiKey, AvailabilityDomain, Credentials, OciConfig};
use signer::{Body, Signer};

/// The registry's entry for `oci` sites.
pub const REGISTRATION: meridian_adapter_core::Registration = meridian_adapter_core::Registration {
    kind: "oci",
    about:
        "Oracle Cloud: an instance of the placed shape per run, preemptible when placement allows",
    needs_config: true,
    build: |text, context| {
        let config: OciConfig = parse_config(text)?;
        let (lifecycle, refresh) = (config.lifecycle.clone(), config.refresh_shapes);
        build_site(Oci::new(config), lifecycle, refresh, context)
    },
};

/// The Core Services API version in every path.
const API: &str = "/20160918";

/// OCI takes at most 32,000 bytes of instance metadata; the bootstrap goes in base64.
const MAX_USER_DATA: usize = 23 * 1024;

/// OCI, as the lifecycle's provider.
pub struct Oci {
    config: OciConfig,
    signer: Signer,
    http: reqwest::Client,
    base: Url,
    listing: listed::Cache,
}

/// An error OCI answered: its HTTP status, `code` and `message`.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    code: String,
    message: String,
}

impl Oci {
    /// Checks `config` and reads its API key (the profile of OCI's config file).
    pub fn new(config: OciConfig) -> Result<Oci, String> {
        config.check()?;
        let key = config.credentials.read()?;
        let pem = std::fs::read_to_string(&key.key_file).map_err(|e| {
            format!(
                "credentials: cannot read the key_file {} of profile [{}]: {e}",
                key.key_file.display(),
                config.credentials.profile
            )
        })?;
        let signer = Signer::new(&key.tenancy, &key.user, &key.fingerprint, &pem)
            .map_err(|e| format!("credentials: {}: {e}", key.key_file.display()))?;
        Oci::with_signer(config, signer)
    }

    /// With a signer made elsewhere (tests).
    pub fn with_signer(config: OciConfig, signer: Signer) -> Result<Oci, String> {
        config.check()?;
        let base = config
            .endpoint_url
            .clone()
            .unwrap_or_else(|| format!("https://iaas.{}.oraclecloud.com", config.region));
        let base = Url::parse(&base).map_err(|e| format!("endpoint_url: {e}"))?;
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        Ok(Oci {
            config,
            signer,
            http,
            base,
            listing: listed::Cache::new(std::time::Duration::from_secs(2)),
        })
    }

    /// Lists the compartment again when the last list is older than `every` (2 s by
    /// default; tests that step the stand-in look by look use zero).
    pub fn listing_every(mut self, every: std::time::Duration) -> Oci {
        self.listing = listed::Cache::new(every);
        self
    }

    /// One signed call: `path` under the API version, `query` pairs, a JSON body. The
    /// answer's JSON and its `opc-next-page`.
    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
        retry_token: Option<&str>,
    ) -> Result<(Value, Option<String>), Answer> {
        let mut url = self.base.clone();
        url.set_path(&format!("{API}{path}"));
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let target = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let host = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            _ => String::new(),
        };
        let bytes = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
        let date = Utc::now().format("%a, %d %b %Y %H:%M:%S GMT").to_string();
        let signed = self.signer.sign(
            method.as_str(),
            &target,
            &host,
            &date,
            bytes.as_deref().map(|bytes| Body {
                bytes,
                content_type: "application/json",
            }),
        );
        let mut request = self
            .http
            .request(method, url)
            .header("date", &signed.date)
            .header("authorization", &signed.authorization)
            .header("accept", "application/json");
        if let Some(sha) = &signed.content_sha256 {
            request = request
                .header("x-content-sha256", sha)
                .header("content-type", "application/json");
        }
        if let Some(token) = retry_token {
            request = request.header("opc-retry-token", token);
        }
        if let Some(bytes) = bytes {
            request = request.body(bytes);
        }
        let unreachable = |e: reqwest::Error| Answer {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "Unreachable".into(),
            message: e.to_string(),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let next = response
            .headers()
            .get("opc-next-page")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = response.text().await.map_err(unreachable)?;
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            return Ok((value, next));
        }
        Err(Answer {
            status,
            code: value["code"].as_str().unwrap_or("").to_string(),
            message: value["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string()),
        })
    }

    /// Every page of a list call.
    async fn list(&self, path: &str, query: &[(&str, &str)]) -> Result<Vec<Value>, ProviderError> {
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut q: Vec<(&str, &str)> = query.to_vec();
            q.push(("limit", "100"));
            if let Some(p) = &page {
                q.push(("page", p));
            }
            let (value, next) = self
                .call(Method::GET, path, &q, None, None)
                .await
                .map_err(provider_error)?;
            out.extend(value.as_array().cloned().unwrap_or_default());
            match next {
                Some(n) if !n.is_empty() => page = Some(n),
                _ => return Ok(out),
            }
        }
    }

    /// Every instance of the compartment OCI still lists (terminated ones for a while).
    async fn instances(&self) -> Result<Vec<Instance>, ProviderError> {
        self.listing
            .get(|| async {
                Ok(self
                    .list("/instances", &[("compartmentId", &self.config.compartment)])
                    .await?
                    .iter()
                    .map(instance_of)
                    .collect())
            })
            .await
    }

    /// The image for `shape`, by its architecture and GPU vendor.
    fn image_for(&self, shape: &str, gpu_vendor: Option<&str>) -> Result<String, ProviderError> {
        self.config
            .images
            .for_shape(shape, architecture(shape), gpu_vendor)
    }
}

/// Ampere shapes (`VM.Standard.A1.Flex`, `BM.Standard.A1.160`) are aarch64; the rest x86_64.
fn architecture(shape: &str) -> &'static str {
    // The Ampere series is its own part of the name: `A1`, not `A10` (an NVIDIA A10).
    if shape.split('.').any(|p| p == "A1" || p == "A2") {
        "aarch64"
    } else {
        "x86_64"
    }
}

/// An answer in the lifecycle's terms: "Out of host capacity" is the domain's, a limit
/// or quota the tenancy's, a request OCI can never take is rejected, anything else may
/// pass.
fn provider_error(a: Answer) -> ProviderError {
    let text = format!("{} {}: {}", a.status.as_u16(), a.code, a.message);
    let message = a.message.to_ascii_lowercase();
    if message.contains("out of host capacity") || a.code == "OutOfHostCapacity" {
        return ProviderError::Capacity {
            code: if a.code.is_empty() {
                "InternalError".into()
            } else {
                a.code
            },
            message: a.message,
        };
    }
    if matches!(a.code.as_str(), "LimitExceeded" | "QuotaExceeded")
        || (a.code == "InvalidParameter" && message.contains("limit"))
    {
        return ProviderError::Quota {
            code: a.code,
            message: a.message,
        };
    }
    match (a.status.as_u16(), a.code.as_str()) {
        (400, "InvalidParameter" | "MissingParameter" | "CannotParseRequest")
        | (404, "NotAuthorizedOrNotFound")
        | (409, "NotAuthorizedOrResourceAlreadyExists") => ProviderError::Rejected(text),
        _ => ProviderError::Unavailable(text),
    }
}

fn instance_of(v: &Value) -> Instance {
    let state = match v["lifecycleState"].as_str().unwrap_or("") {
        "PROVISIONING" | "STARTING" => InstanceState::Pending,
        "RUNNING" | "CREATING_IMAGE" | "MOVING" => InstanceState::Running,
        "STOPPING" => InstanceState::Stopping,
        "STOPPED" => InstanceState::Stopped,
        "TERMINATING" => InstanceState::Terminating,
        "TERMINATED" => InstanceState::Terminated,
        // A state not documented yet: still there, so treat it as booting.
        _ => InstanceState::Pending,
    };
    let preemptible = v["preemptibleInstanceConfig"].is_object();
    Instance {
        id: v["id"].as_str().unwrap_or_default().to_string(),
        state,
        zone: v["availabilityDomain"].as_str().map(str::to_string),
        launched_at: v["timeCreated"]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc)),
        // OCI says when an instance was created, not when it ended: the lifecycle
        // takes the time it first saw it terminated.
        ended_at: None,
        // A preemptible instance that ended without Meridian ending it was taken back;
        // the lifecycle asks only when Meridian did not end it.
        reclaimed: preemptible
            && matches!(
                state,
                InstanceState::Terminating | InstanceState::Terminated
            ),
        reason: None,
        address: None,
        tags: v["freeformTags"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect::<BTreeMap<_, _>>()
            })
            .unwrap_or_default(),
    }
}

/// The catalogue's figures of an OCI shape from ListShapes: OCPUs are two vCPUs on x86,
/// one on Ampere; GPU models from `gpuDescription` (`NVIDIA® H100`, `AMD Instinct
/// MI300X`).
pub fn shape_facts(v: &Value) -> Option<ShapeFacts> {
    let name = v["shape"].as_str()?.to_string();
    // A flexible shape's `ocpus` and `memoryInGBs` are its default size, not what it can
    // be: its largest, where ListShapes says, else 0 (the catalogue's figure stays).
    let flexible = v["isFlexible"].as_bool() == Some(true);
    let (ocpus, memory_gbs) = if flexible {
        (
            v["ocpuOptions"]["max"].as_f64().unwrap_or(0.0),
            v["memoryOptions"]["maxInGBs"].as_f64().unwrap_or(0.0),
        )
    } else {
        (
            v["ocpus"].as_f64().unwrap_or(0.0),
            v["memoryInGBs"].as_f64().unwrap_or(0.0),
        )
    };
    let per_ocpu = if architecture(&name) == "aarch64" {
        1.0
    } else {
        2.0
    };
    let gpus = v["gpus"].as_u64().unwrap_or(0) as u32;
    let description = v["gpuDescription"].as_str().unwrap_or("");
    Some(ShapeFacts {
        cpus: (ocpus * per_ocpu).round() as u32,
        memory_bytes: (memory_gbs * (1u64 << 30) as f64) as u64,
        gpus: (gpus > 0).then(|| GpuFacts {
            count: gpus,
            vendor: if description.to_ascii_uppercase().contains("AMD") {
                "amd".into()
            } else {
                "nvidia".into()
            },
            model: catalogue_model(&description.replace('®', "")),
            // ListShapes does not say: the catalogue's figure stays.
            memory_bytes: 0,
        }),
        name,
    })
}

#[async_trait]
impl CloudProvider for Oci {
    fn kind(&self) -> &'static str {
        "oci"
    }

    fn zones(&self) -> Vec<String> {
        self.config
            .availability_domains
            .iter()
            .map(|a| a.name.clone())
            .collect()
    }

    fn max_user_data_bytes(&self) -> usize {
        MAX_USER_DATA
    }

    async fn launch(&self, launch: &Launch<'_>) -> Result<Instance, ProviderError> {
        let gpu_vendor = launch
            .job
            .shape
            .as_ref()
            .and_then(|s| s.gpu_vendor.as_deref());
        let image = self.image_for(launch.instance_type, gpu_vendor)?;
        let ad = launch
            .zone
            .map(str::to_string)
            .unwrap_or_else(|| self.config.availability_domains[0].name.clone());
        let subnet = self.config.subnet(&ad).ok_or_else(|| {
            ProviderError::Rejected(format!("availability domain {ad} has no subnet configured"))
        })?;
        let tags: serde_json::Map<String, Value> = launch
            .tags
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let mut source = json!({"sourceType": "image", "imageId": image});
        if let Some(gbs) = self.config.boot_volume_gbs {
            source["bootVolumeSizeInGBs"] = json!(gbs);
        }
        let mut body = json!({
            "availabilityDomain": ad,
            "compartmentId": self.config.compartment,
            "displayName": format!("meridian-{}", launch.job.name),
            "shape": launch.instance_type,
            "sourceDetails": source,
            "createVnicDetails": {"subnetId": subnet, "assignPublicIp": false},
            "metadata": {
                "user_data": base64::engine::general_purpose::STANDARD.encode(launch.user_data),
            },
            "freeformTags": tags,
        });
        // A flexible shape is sized to the job: an OCPU is two vCPUs on x86.
        if launch.instance_type.ends_with(".Flex") {
            let r = &launch.job.resources;
            let per_ocpu = if architecture(launch.instance_type) == "aarch64" {
                1
            } else {
                2
            };
            body["shapeConfig"] = json!({
                "ocpus": r.cpus.div_ceil(per_ocpu).max(1),
                "memoryInGBs": r.memory_bytes.div_ceil(1 << 30).max(1),
            });
        }
        if launch.spot {
            body["preemptibleInstanceConfig"] =
                json!({"preemptionAction": {"type": "TERMINATE", "preserveBootVolume": false}});
        }
        self.listing.forget().await;
        // The retry token makes a launch sent again (a restart mid-call) the same launch.
        let (value, _) = self
            .call(
                Method::POST,
                "/instances",
                &[],
                Some(&body),
                Some(launch.client_token),
            )
            .await
            .map_err(provider_error)?;
        Ok(instance_of(&value))
    }

    /// One list for every look: OCI has no call that takes several ids.
    async fn listed(&self) -> Result<Vec<Instance>, ProviderError> {
        self.instances().await
    }

    async fn terminate(&self, ids: &[String]) -> Result<(), ProviderError> {
        self.listing.forget().await;
        for id in ids {
            // The boot volume goes with it: nothing is left billing.
            match self
                .call(
                    Method::DELETE,
                    &format!("/instances/{id}"),
                    &[("preserveBootVolume", "false")],
                    None,
                    None,
                )
                .await
            {
                Ok(_) => {}
                Err(a) if a.status == StatusCode::NOT_FOUND => {}
                Err(a) => return Err(provider_error(a)),
            }
        }
        Ok(())
    }

    async fn check(&self) -> Result<(), ProviderError> {
        self.call(
            Method::GET,
            "/instances",
            &[("compartmentId", &self.config.compartment), ("limit", "1")],
            None,
            None,
        )
        .await
        .map(|_| ())
        .map_err(provider_error)
    }

    async fn shapes(&self, names: &[String]) -> Result<Vec<ShapeFacts>, ProviderError> {
        let all = self
            .list("/shapes", &[("compartmentId", &self.config.compartment)])
            .await?;
        let mut out: Vec<ShapeFacts> = Vec::new();
        // ListShapes lists a shape once per availability domain.
        for facts in all.iter().filter_map(shape_facts) {
            if names.contains(&facts.name) && !out.iter().any(|f| f.name == facts.name) {
                out.push(facts);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, code: &str, message: &str) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            code: code.into(),
            message: message.into(),
        }
    }

    #[test]
    fn ocis_errors_map_onto_the_lifecycle() {
        assert!(matches!(
            provider_error(answer(500, "InternalError", "Out of host capacity.")),
            ProviderError::Capacity { .. }
        ));
        assert!(matches!(
            provider_error(answer(
                400,
                "LimitExceeded",
                "The following service limits were exceeded: gpu-h100-count"
            )),
            ProviderError::Quota { .. }
        ));
        assert!(matches!(
            provider_error(answer(
                404,
                "NotAuthorizedOrNotFound",
                "Authorization failed or requested resource not found."
            )),
            ProviderError::Rejected(_)
        ));
        assert!(matches!(
            provider_error(answer(429, "TooManyRequests", "slow down")),
            ProviderError::Unavailable(_)
        ));
        assert!(matches!(
            provider_error(answer(500, "InternalError", "something else")),
            ProviderError::Unavailable(_)
        ));
    }

    #[test]
    fn shapes_read_ocpus_as_vcpus_and_name_gpu_models() {
        let h100 = shape_facts(&json!({"shape": "BM.GPU.H100.8", "ocpus": 112.0,
            "memoryInGBs": 2048.0, "gpus": 8, "gpuDescription": "NVIDIA® H100"}))
        .unwrap();
        assert_eq!((h100.cpus, h100.memory_bytes >> 30), (224, 2048));
        let g = h100.gpus.unwrap();
        assert_eq!(
            (g.count, g.vendor.as_str(), g.model.as_str()),
            (8, "nvidia", "H100")
        );
        let mi = shape_facts(&json!({"shape": "BM.GPU.MI300X.8", "ocpus": 112.0,
            "memoryInGBs": 2048.0, "gpus": 8, "gpuDescription": "AMD Instinct MI300X"}))
        .unwrap();
        assert_eq!(mi.gpus.unwrap().vendor, "amd");
        let arm = shape_facts(&json!({"shape": "VM.Standard.A1.Flex", "ocpus": 1.0,
            "memoryInGBs": 6.0, "gpus": 0}))
        .unwrap();
        assert_eq!((arm.cpus, arm.gpus), (1, None));
        let flex = shape_facts(&json!({"shape": "VM.Standard.E5.Flex", "ocpus": 1.0,
            "memoryInGBs": 12.0, "isFlexible": true, "gpus": 0,
            "ocpuOptions": {"min": 1.0, "max": 94.0},
            "memoryOptions": {"minInGBs": 1.0, "maxInGBs": 1049.0}}))
        .unwrap();
        assert_eq!((flex.cpus, flex.memory_bytes >> 30), (188, 1049));
        assert_eq!(architecture("BM.Standard.A1.160"), "aarch64");
        assert_eq!(architecture("VM.GPU.A10.1"), "x86_64");
    }
}
