//! The AWS EC2 site: the cloud VM lifecycle of `meridian-adapter-cloud` over
//! `aws-sdk-ec2`. This crate is only EC2's calls (RunInstances, DescribeInstances,
//! TerminateInstances, DescribeInstanceTypes) and the mapping of EC2's states and error
//! codes onto the lifecycle; credentials come from AWS's standard chain and never enter
//! Meridian's log.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    Filter, IamInstanceProfileSpecification, InstanceInterruptionBehavior,
    InstanceMarketOptionsRequest, InstanceStateName, InstanceType, MarketType, Placement,
    ResourceType, ShutdownBehavior, SpotInstanceType, SpotMarketOptions, Tag, TagSpecification,
};
use aws_sdk_ec2::Client;
use chrono::{DateTime, NaiveDateTime, Utc};
use meridian_adapter_cloud::{
    build_site, tags, CloudProvider, Instance, InstanceState, Launch, ProviderError,
};
use meridian_adapter_core::registry::parse_config;
use meridian_adapter_core::{GpuFacts, ShapeFacts};
use tokio::sync::OnceCell;
use uuid::Uuid;

mod config;
mod shapes;

/// The SDK this adapter speaks, for tests and tools that look at what it launched.
pub use aws_sdk_ec2;
pub use config::{AwsConfig, Subnet};
pub use shapes::InstanceTypeFacts;

/// The registry's entry for `aws` sites.
pub const REGISTRATION: meridian_adapter_core::Registration = meridian_adapter_core::Registration {
    kind: "aws",
    about: "AWS EC2: an instance of the placed type per run, spot when placement allows",
    needs_config: true,
    build: |text, context| {
        let config: AwsConfig = parse_config(text)?;
        let (lifecycle, refresh) = (config.lifecycle.clone(), config.refresh_shapes);
        build_site(Ec2::new(config), lifecycle, refresh, context)
    },
};

/// EC2's limit on user data, before base64.
const MAX_USER_DATA: usize = 16 * 1024;

/// The codes EC2 answers when a zone has no capacity now: another zone may.
const CAPACITY_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "UnfulfillableCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    // The type is not offered in this zone.
    "Unsupported",
];

/// The codes of the account's limits: no zone of the region will do.
const QUOTA_CODES: &[&str] = &[
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "RequestLimitExceeded",
];

/// The code of a spot instance taken back, in its state reason.
const SPOT_RECLAIM: &str = "Server.SpotInstanceTermination";

/// EC2, as the lifecycle's provider.
pub struct Ec2 {
    config: AwsConfig,
    client: OnceCell<Client>,
    /// Instance type → its architecture (`x86_64`, `arm64`), read once each.
    architectures: Mutex<HashMap<String, String>>,
}

impl Ec2 {
    /// Checks `config`; the client is made at the first call (loading AWS's credential
    /// chain is asynchronous).
    pub fn new(config: AwsConfig) -> Result<Ec2, String> {
        config.check()?;
        Ok(Ec2 {
            config,
            client: OnceCell::new(),
            architectures: Mutex::new(HashMap::new()),
        })
    }

    /// The EC2 client: the standard credential chain, the configured region and, for
    /// tests and private endpoints, `endpoint_url`.
    pub async fn client(&self) -> &Client {
        self.client
            .get_or_init(|| async {
                use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
                let https = aws_smithy_http_client::Builder::new()
                    .tls_provider(Provider::Rustls(CryptoMode::Ring))
                    .build_https();
                let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
                    .http_client(https)
                    .region(aws_config::Region::new(self.config.region.clone()));
                if let Some(url) = &self.config.endpoint_url {
                    loader = loader.endpoint_url(url);
                }
                Client::new(&loader.load().await)
            })
            .await
    }

    /// The image for `instance_type`: by its architecture and the GPU vendor of its
    /// shape (`x86_64-nvidia`), else by its architecture alone.
    async fn image_for(
        &self,
        instance_type: &str,
        gpu_vendor: Option<&str>,
    ) -> Result<String, ProviderError> {
        let known = self
            .architectures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(instance_type)
            .cloned();
        let architecture = match known {
            Some(a) => a,
            None => {
                let facts = self.instance_types(&[instance_type.to_string()]).await?;
                let a = facts
                    .into_iter()
                    .next()
                    .map(|f| f.architecture)
                    .ok_or_else(|| {
                        ProviderError::Rejected(format!(
                            "EC2 does not know instance type {instance_type:?} in {}",
                            self.config.region
                        ))
                    })?;
                self.architectures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(instance_type.to_string(), a.clone());
                a
            }
        };
        self.config
            .images
            .for_shape(instance_type, &architecture, gpu_vendor)
    }

    /// What EC2 says of these instance types (vCPUs, memory, GPUs, architecture).
    pub async fn instance_types(
        &self,
        names: &[String],
    ) -> Result<Vec<InstanceTypeFacts>, ProviderError> {
        let client = self.client().await;
        let mut out = Vec::new();
        // DescribeInstanceTypes takes at most 100 names a call.
        for chunk in names.chunks(100) {
            let mut next: Option<String> = None;
            loop {
                let answer = client
                    .describe_instance_types()
                    .set_instance_types(Some(
                        chunk
                            .iter()
                            .map(|n| InstanceType::from(n.as_str()))
                            .collect(),
                    ))
                    .set_next_token(next.take())
                    .send()
                    .await;
                let answer = match answer {
                    Ok(a) => a,
                    // An unknown name fails the whole call: say which.
                    Err(e) if e.code() == Some("InvalidInstanceType") => {
                        return Err(ProviderError::Rejected(format!(
                            "EC2 does not know one of {}: {}",
                            chunk.join(", "),
                            e.message().unwrap_or_default()
                        )))
                    }
                    Err(e) => return Err(provider_error(&e)),
                };
                out.extend(answer.instance_types().iter().map(shapes::facts));
                match answer.next_token() {
                    Some(t) if !t.is_empty() => next = Some(t.to_string()),
                    _ => break,
                }
            }
        }
        Ok(out)
    }

    async fn describe_filtered(
        &self,
        filters: Vec<Filter>,
    ) -> Result<Vec<Instance>, ProviderError> {
        let client = self.client().await;
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let answer = client
                .describe_instances()
                .set_filters(Some(filters.clone()))
                .set_next_token(next.take())
                .send()
                .await
                .map_err(|e| provider_error(&e))?;
            for reservation in answer.reservations() {
                out.extend(reservation.instances().iter().map(instance_of));
            }
            match answer.next_token() {
                Some(t) if !t.is_empty() => next = Some(t.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }
}

fn filter(name: &str, values: &[&str]) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.iter().map(|v| v.to_string()).collect()))
        .build()
}

/// Any SDK error in the lifecycle's terms: a capacity code is the zone's, a limit the
/// account's, a request EC2 can never take is rejected, anything else may pass.
fn provider_error<E, R>(e: &aws_sdk_ec2::error::SdkError<E, R>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let message = e
        .message()
        .map(str::to_string)
        .unwrap_or_else(|| aws_sdk_ec2::error::DisplayErrorContext(e).to_string());
    match e.code() {
        Some(code) if CAPACITY_CODES.contains(&code) => ProviderError::Capacity {
            code: code.to_string(),
            message,
        },
        Some(code) if QUOTA_CODES.contains(&code) => ProviderError::Quota {
            code: code.to_string(),
            message,
        },
        Some(code)
            if code.starts_with("InvalidAMIID")
                || code.starts_with("InvalidParameter")
                || code == "InvalidInstanceType"
                || code.starts_with("InvalidSubnet")
                || code.starts_with("InvalidGroup")
                || code == "MissingParameter" =>
        {
            ProviderError::Rejected(format!("{code}: {message}"))
        }
        Some(code) => ProviderError::Unavailable(format!("{code}: {message}")),
        None => ProviderError::Unavailable(message),
    }
}

fn time(t: &aws_sdk_ec2::primitives::DateTime) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.secs(), t.subsec_nanos())
}

/// When an instance ended, from its state transition reason
/// (`User initiated (2026-12-03 08:00:00 GMT)`), where EC2 says.
fn ended_at(reason: &str) -> Option<DateTime<Utc>> {
    let inside = reason.rsplit_once('(')?.1.strip_suffix(')')?;
    // EC2 writes GMT; some implementations UTC.
    let text = inside
        .strip_suffix(" GMT")
        .or_else(|| inside.strip_suffix(" UTC"))?;
    NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
        .ok()
        .map(|t| t.and_utc())
}

fn instance_of(i: &aws_sdk_ec2::types::Instance) -> Instance {
    let state = match i.state().and_then(|s| s.name()) {
        Some(InstanceStateName::Pending) => InstanceState::Pending,
        Some(InstanceStateName::Running) => InstanceState::Running,
        Some(InstanceStateName::Stopping) => InstanceState::Stopping,
        Some(InstanceStateName::Stopped) => InstanceState::Stopped,
        Some(InstanceStateName::ShuttingDown) => InstanceState::Terminating,
        Some(InstanceStateName::Terminated) => InstanceState::Terminated,
        // A state this SDK does not name yet: still there, so treat it as booting.
        _ => InstanceState::Pending,
    };
    let reason = i.state_reason().and_then(|r| r.code()).map(str::to_string);
    Instance {
        id: i.instance_id().unwrap_or_default().to_string(),
        state,
        zone: i
            .placement()
            .and_then(|p| p.availability_zone())
            .map(str::to_string),
        launched_at: i.launch_time().and_then(time),
        ended_at: (state == InstanceState::Terminated)
            .then(|| i.state_transition_reason().and_then(ended_at))
            .flatten(),
        reclaimed: reason.as_deref() == Some(SPOT_RECLAIM),
        reason,
        address: i.private_ip_address().map(str::to_string),
        tags: i
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value()?.to_string())))
            .collect::<BTreeMap<_, _>>(),
    }
}

#[async_trait]
impl CloudProvider for Ec2 {
    fn kind(&self) -> &'static str {
        "aws"
    }

    fn zones(&self) -> Vec<String> {
        self.config.subnets.iter().map(|s| s.zone.clone()).collect()
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
        let image = self.image_for(launch.instance_type, gpu_vendor).await?;
        let client = self.client().await;
        let tags: Vec<Tag> = launch
            .tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .chain(std::iter::once(
                Tag::builder()
                    .key("Name")
                    .value(format!("meridian-{}", launch.job.name))
                    .build(),
            ))
            .collect();
        let mut request = client
            .run_instances()
            .image_id(image)
            .instance_type(InstanceType::from(launch.instance_type))
            .min_count(1)
            .max_count(1)
            .client_token(launch.client_token)
            .user_data(aws_smithy_types::base64::encode(launch.user_data))
            .instance_initiated_shutdown_behavior(ShutdownBehavior::Terminate)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Instance)
                    .set_tags(Some(tags.clone()))
                    .build(),
            )
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Volume)
                    .set_tags(Some(tags))
                    .build(),
            );
        if let Some(zone) = launch.zone {
            let subnet = self.config.subnets.iter().find(|s| s.zone == zone);
            match subnet {
                Some(s) => request = request.subnet_id(&s.subnet),
                None => {
                    request =
                        request.placement(Placement::builder().availability_zone(zone).build())
                }
            }
        }
        if !self.config.security_groups.is_empty() {
            request = request.set_security_group_ids(Some(self.config.security_groups.clone()));
        }
        if let Some(profile) = &self.config.instance_profile {
            let spec = if profile.starts_with("arn:") {
                IamInstanceProfileSpecification::builder().arn(profile)
            } else {
                IamInstanceProfileSpecification::builder().name(profile)
            };
            request = request.iam_instance_profile(spec.build());
        }
        if let Some(key) = &self.config.key_name {
            request = request.key_name(key);
        }
        if launch.spot {
            request = request.instance_market_options(
                InstanceMarketOptionsRequest::builder()
                    .market_type(MarketType::Spot)
                    .spot_options(
                        SpotMarketOptions::builder()
                            .spot_instance_type(SpotInstanceType::OneTime)
                            .instance_interruption_behavior(InstanceInterruptionBehavior::Terminate)
                            .build(),
                    )
                    .build(),
            );
        }
        // One attempt: EC2 answers capacity errors as server errors (500), which the
        // SDK would retry in the same zone; the lifecycle tries the next zone instead,
        // and a retry of the whole launch reuses its client token.
        let answer = request
            .customize()
            .config_override(aws_sdk_ec2::config::Builder::default().retry_config(
                aws_sdk_ec2::config::retry::RetryConfig::standard().with_max_attempts(1),
            ))
            .send()
            .await
            .map_err(|e| provider_error(&e))?;
        answer
            .instances()
            .first()
            .map(instance_of)
            .ok_or_else(|| ProviderError::Unavailable("RunInstances answered no instance".into()))
    }

    async fn describe(&self, ids: &[String]) -> Result<Vec<Instance>, ProviderError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // By filter, not InstanceIds: one id EC2 has forgotten (an hour after its
        // termination) fails a whole InstanceIds call, but only drops out of a filter.
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        self.describe_filtered(vec![filter("instance-id", &ids)])
            .await
    }

    async fn find(&self, job_id: Uuid) -> Result<Vec<Instance>, ProviderError> {
        let id = job_id.to_string();
        self.describe_filtered(vec![
            filter(&format!("tag:{}", tags::JOB_ID), &[&id]),
            filter(&format!("tag:{}", tags::MANAGED), &["true"]),
        ])
        .await
    }

    async fn owned(&self) -> Result<Vec<Instance>, ProviderError> {
        self.describe_filtered(vec![
            filter(&format!("tag:{}", tags::MANAGED), &["true"]),
            filter(
                "instance-state-name",
                &["pending", "running", "shutting-down", "stopping", "stopped"],
            ),
        ])
        .await
    }

    async fn terminate(&self, ids: &[String]) -> Result<(), ProviderError> {
        if ids.is_empty() {
            return Ok(());
        }
        let client = self.client().await;
        match client
            .terminate_instances()
            .set_instance_ids(Some(ids.to_vec()))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => Ok(()),
            Err(e) => Err(provider_error(&e)),
        }
    }

    async fn shapes(&self, names: &[String]) -> Result<Vec<ShapeFacts>, ProviderError> {
        Ok(self
            .instance_types(names)
            .await?
            .into_iter()
            .map(|f| ShapeFacts {
                name: f.name,
                cpus: f.cpus,
                memory_bytes: f.memory_bytes,
                gpus: f.gpus.map(|g| GpuFacts {
                    count: g.count,
                    vendor: g.vendor,
                    model: g.model,
                    memory_bytes: g.memory_bytes,
                }),
            })
            .collect())
    }

    async fn check(&self) -> Result<(), ProviderError> {
        let client = self.client().await;
        client
            .describe_instances()
            .filters(filter(&format!("tag:{}", tags::MANAGED), &["true"]))
            .max_results(5)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| provider_error(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_an_instance_is_read_from_its_transition_reason() {
        assert_eq!(
            ended_at("User initiated (2026-12-03 08:00:05 GMT)"),
            Some(DateTime::from_timestamp(1796284805, 0).unwrap())
        );
        assert_eq!(ended_at("Service initiated"), None);
    }
}
