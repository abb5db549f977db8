//! The adapter's configuration file, checked before anything is contacted: every error
//! names the field and what was expected.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which kind of cluster: plain Kubernetes, or CoreWeave's (the same API, its own GPU
/// labels and class names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    #[default]
    Kubernetes,
    Coreweave,
}

/// How the site's logs come back. Kubernetes keeps a container's stdout and stderr in one
/// stream; only clusters with the `PodLogsQuerySplitStreams` feature (1.32 and later)
/// give them apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStreams {
    /// Both streams, interleaved, as the job's stdout; its stderr is left empty.
    #[default]
    Combined,
    /// Asked for one at a time (`stream=Stdout`, `stream=Stderr`).
    Split,
}

/// The node label keys that name a GPU's model, per vendor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuLabels {
    /// Default `nvidia.com/gpu.product` (NVIDIA's GPU feature discovery), or
    /// `gpu.nvidia.com/class` with the CoreWeave profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvidia: Option<String>,
    /// Default `amd.com/gpu.product-name` (AMD's node labeller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amd: Option<String>,
}

/// One Kubernetes (or CoreWeave) site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    #[serde(default)]
    pub profile: Profile,
    /// The kubeconfig file; default `$KUBECONFIG`, then `~/.kube/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// The context in it; default its current context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Use the pod's service account instead of a kubeconfig (Meridian runs in the cluster).
    #[serde(default)]
    pub in_cluster: bool,
    /// Where Meridian creates everything.
    pub namespace: String,
    /// The service account the pods run as; default the namespace's `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// Image pull secrets, by name, given to every pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// The storage class of the workflow volumes' claims; default the cluster's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// The access mode of those claims: `ReadWriteOnce` (default; the jobs that share a
    /// volume then run on one node) or `ReadWriteMany` when the storage class has it.
    #[serde(default = "default_access_mode")]
    pub volume_access_mode: String,
    #[serde(default)]
    pub gpu_labels: GpuLabels,
    /// A catalogue model → the label values that name it, when matching the model's name
    /// against the nodes' label values is not enough (see `docs/site-kubernetes.md`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_models: BTreeMap<String, Vec<String>>,
    /// A Kueue LocalQueue: Jobs are created suspended with its label, and Kueue admits them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kueue_queue: Option<String>,
    /// The image a job without one (`image: host`) runs in: a pod always needs an image.
    #[serde(default = "default_host_image")]
    pub host_image: String,
    /// How long Kubernetes keeps a finished Job and its pods before deleting them.
    #[serde(default = "default_ttl")]
    pub ttl_seconds_after_finished: u32,
    #[serde(default)]
    pub log_streams: LogStreams,
    /// How often the watches list everything again, in case an event was missed.
    #[serde(default = "default_resync")]
    pub resync_seconds: u64,
}

fn default_access_mode() -> String {
    "ReadWriteOnce".into()
}

fn default_host_image() -> String {
    "docker.io/library/busybox:1.37".into()
}

fn default_ttl() -> u32 {
    3600
}

fn default_resync() -> u64 {
    300
}

pub const NVIDIA_LABEL: &str = "nvidia.com/gpu.product";
pub const COREWEAVE_LABEL: &str = "gpu.nvidia.com/class";
pub const AMD_LABEL: &str = "amd.com/gpu.product-name";

impl KubernetesConfig {
    /// A configuration for `namespace` with every default.
    pub fn new(namespace: impl Into<String>) -> Self {
        KubernetesConfig {
            profile: Profile::default(),
            kubeconfig: None,
            context: None,
            in_cluster: false,
            namespace: namespace.into(),
            service_account: None,
            image_pull_secrets: Vec::new(),
            priority_class: None,
            storage_class: None,
            volume_access_mode: default_access_mode(),
            gpu_labels: GpuLabels::default(),
            gpu_models: BTreeMap::new(),
            kueue_queue: None,
            host_image: default_host_image(),
            ttl_seconds_after_finished: default_ttl(),
            log_streams: LogStreams::default(),
            resync_seconds: default_resync(),
        }
    }

    /// The label key that names an NVIDIA GPU's model on this site's nodes.
    pub fn nvidia_label(&self) -> &str {
        match (&self.gpu_labels.nvidia, self.profile) {
            (Some(key), _) => key,
            (None, Profile::Kubernetes) => NVIDIA_LABEL,
            (None, Profile::Coreweave) => COREWEAVE_LABEL,
        }
    }

    /// The label key that names an AMD GPU's model.
    pub fn amd_label(&self) -> &str {
        self.gpu_labels.amd.as_deref().unwrap_or(AMD_LABEL)
    }

    /// Why this configuration cannot work, naming the field.
    pub fn check(&self) -> Result<(), String> {
        if !is_dns_label(&self.namespace) {
            return Err(format!(
                "namespace: {:?} is not a Kubernetes namespace name (1 to 63 of a-z, 0-9 \
                 and '-', starting and ending with a letter or digit)",
                self.namespace
            ));
        }
        if self.in_cluster && (self.kubeconfig.is_some() || self.context.is_some()) {
            return Err(
                "in_cluster: true uses the pod's service account; drop kubeconfig \
                 and context, or set in_cluster: false"
                    .into(),
            );
        }
        for (field, key) in [
            ("gpu_labels.nvidia", self.nvidia_label()),
            ("gpu_labels.amd", self.amd_label()),
        ] {
            check_label_key(key).map_err(|why| format!("{field}: {key:?} {why}"))?;
        }
        for (model, values) in &self.gpu_models {
            if let Some(bad) = values.iter().find(|v| v.is_empty() || !is_label_value(v)) {
                return Err(format!(
                    "gpu_models.{model}: {bad:?} is not a label value (up to 63 of A-Z, \
                     a-z, 0-9, '-', '_', '.')"
                ));
            }
        }
        if let Some(queue) = &self.kueue_queue {
            if !is_label_value(queue) || queue.is_empty() {
                return Err(format!(
                    "kueue_queue: {queue:?} is not a LocalQueue name usable as a label value"
                ));
            }
        }
        for (field, name) in [
            ("service_account", &self.service_account),
            ("priority_class", &self.priority_class),
            ("storage_class", &self.storage_class),
        ] {
            if let Some(name) = name {
                if !is_dns_subdomain(name) {
                    return Err(format!("{field}: {name:?} is not a Kubernetes object name"));
                }
            }
        }
        if let Some(bad) = self
            .image_pull_secrets
            .iter()
            .find(|s| !is_dns_subdomain(s))
        {
            return Err(format!("image_pull_secrets: {bad:?} is not a Secret name"));
        }
        if !["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]
            .contains(&self.volume_access_mode.as_str())
        {
            return Err(format!(
                "volume_access_mode: {:?} is not ReadWriteOnce, ReadWriteMany or \
                 ReadWriteOncePod",
                self.volume_access_mode
            ));
        }
        if self.host_image.trim().is_empty() {
            return Err("host_image: must name an image (a pod always runs one)".into());
        }
        if self.resync_seconds == 0 {
            return Err("resync_seconds: must be above zero".into());
        }
        Ok(())
    }
}

/// A DNS-1123 label: what namespaces and many names must be.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain, as Kubernetes checks object names: at most 253 characters,
/// dot-separated parts of a-z, 0-9 and inner '-'.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// A label value: empty, or up to 63 of `[A-Za-z0-9._-]` starting and ending alphanumeric.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric())
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name like a label value.
fn check_label_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Err("has a prefix that is not a DNS subdomain");
    }
    if name.is_empty() || !is_label_value(name) {
        return Err("is not a label key (up to 63 of A-Z, a-z, 0-9, '-', '_', '.')");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_profile() {
        let mut c = KubernetesConfig::new("meridian");
        assert_eq!(c.nvidia_label(), "nvidia.com/gpu.product");
        c.profile = Profile::Coreweave;
        assert_eq!(c.nvidia_label(), "gpu.nvidia.com/class");
        assert_eq!(c.amd_label(), "amd.com/gpu.product-name");
        c.check().unwrap();
    }

    #[test]
    fn bad_fields_are_named() {
        let mut c = KubernetesConfig::new("Not_A_Namespace");
        assert!(c.check().unwrap_err().starts_with("namespace:"));
        c.namespace = "ok".into();
        c.gpu_labels.nvidia = Some("bad key with spaces".into());
        assert!(c.check().unwrap_err().starts_with("gpu_labels.nvidia:"));
        c.gpu_labels.nvidia = None;
        c.in_cluster = true;
        c.context = Some("x".into());
        assert!(c.check().unwrap_err().starts_with("in_cluster:"));
        c.in_cluster = false;
        c.volume_access_mode = "Sometimes".into();
        assert!(c.check().unwrap_err().starts_with("volume_access_mode:"));
    }
}
