//! A Google Cloud site's configuration file, checked before anything is contacted; every
//! error names its field.

use std::path::PathBuf;

use meridian_adapter_cloud::config::{self, Images};
use meridian_adapter_cloud::LifecycleConfig;
use serde::Deserialize;

/// A Google Cloud site: which project, which zones, which images.
///
/// ```yaml
/// project: my-research-project
/// region: us-central1
/// zones: [us-central1-a, us-central1-b]      # in order of preference
/// images:
///   x86_64: projects/debian-cloud/global/images/family/debian-12
///   x86_64-nvidia: projects/my-research-project/global/images/family/meridian-cuda
/// subnetwork: projects/my-research-project/regions/us-central1/subnetworks/jobs
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpConfig {
    /// The project instances are created in and billed to.
    pub project: String,
    /// The region: every zone must be in it.
    pub region: String,
    /// The zones to launch in, in order of preference.
    pub zones: Vec<String>,
    /// The image by architecture and GPU vendor: `projects/P/global/images/NAME` or
    /// `projects/P/global/images/family/FAMILY`.
    pub images: Images,
    /// The subnetwork instances get an address in; default: the project's `default`
    /// network.
    #[serde(default)]
    pub subnetwork: Option<String>,
    /// Gives each instance an ephemeral public address. Off by default: instances then
    /// reach Meridian's API and image registries through Cloud NAT or a private route.
    #[serde(default)]
    pub external_ip: bool,
    /// The boot disk's size, when not the image's.
    #[serde(default)]
    pub boot_disk_gb: Option<u32>,
    /// The boot disk's type (`pd-balanced`, `pd-ssd`, `hyperdisk-balanced`); default:
    /// the machine type's default.
    #[serde(default)]
    pub boot_disk_type: Option<String>,
    /// The service account instances run as (for data buckets); default: none.
    #[serde(default)]
    pub service_account: Option<String>,
    /// Whose credentials the adapter calls with.
    #[serde(default)]
    pub credentials: Credentials,
    /// Another Compute Engine endpoint (a private endpoint, or a local test server).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// How long a create waits for its zone operation (the site runner waits with it);
    /// an instance still being created after it is followed as a booting one.
    #[serde(default = "operation_timeout")]
    pub operation_timeout_seconds: u64,
    /// Reads the site's shapes (vCPUs, memory, bundled GPUs) from the machine types of
    /// the first zone when the adapter starts.
    #[serde(default)]
    pub refresh_shapes: bool,
    #[serde(default)]
    pub lifecycle: LifecycleConfig,
}

/// Where the adapter's credentials come from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Credentials {
    /// Application Default Credentials: `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's
    /// application-default login, or the metadata server of the machine Meridian runs on.
    #[default]
    Adc,
    /// A credentials JSON file: a service account key, an `authorized_user` file, or an
    /// external account (workload identity federation) configuration.
    File(PathBuf),
    /// No credentials (a local emulator or test server only).
    Anonymous,
}

fn operation_timeout() -> u64 {
    180
}

const ARCHITECTURES: &[&str] = &["x86_64", "arm64"];

/// A Compute Engine name: lower case, digits and `-`, starting with a letter.
fn is_name(value: &str) -> bool {
    let mut chars = value.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// An image reference: `projects/P/global/images/…`, or its full URL.
pub fn is_image(value: &str) -> bool {
    let path = value
        .strip_prefix("https://www.googleapis.com/compute/v1/")
        .or_else(|| value.strip_prefix("https://compute.googleapis.com/compute/v1/"))
        .unwrap_or(value);
    path.starts_with("projects/") && path.contains("/global/images/")
}

impl GcpConfig {
    /// What is wrong with it, naming the field.
    pub fn check(&self) -> Result<(), String> {
        // A project id: 6 to 30 characters; lower case, digits and `-`.
        if !is_name(&self.project) || self.project.len() < 6 || self.project.len() > 30 {
            return Err(format!(
                "project: expected a project id such as my-research-project (6 to 30 lower-case letters, digits and -); got {:?}",
                self.project
            ));
        }
        config::check_region(&self.region, "us-central1")?;
        config::check_endpoint(self.endpoint_url.as_deref())?;
        if self.zones.is_empty() {
            return Err(format!(
                "zones: expected at least one zone of {}, such as {}-a",
                self.region, self.region
            ));
        }
        for (i, zone) in self.zones.iter().enumerate() {
            let in_region = zone
                .strip_prefix(&self.region)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|letter| !letter.is_empty() && is_name(letter));
            if !in_region {
                return Err(format!(
                    "zones[{i}]: expected a zone of region {} such as {}-a; got {zone:?}",
                    self.region, self.region
                ));
            }
            if self.zones[..i].contains(zone) {
                return Err(format!("zones[{i}]: {zone} is listed twice"));
            }
        }
        self.images.check(
            ARCHITECTURES,
            is_image,
            "projects/debian-cloud/global/images/family/debian-12",
        )?;
        if let Some(subnet) = &self.subnetwork {
            if !(subnet.starts_with("projects/") || subnet.starts_with("https://"))
                || !subnet.contains("/subnetworks/")
            {
                return Err(format!(
                    "subnetwork: expected projects/PROJECT/regions/{}/subnetworks/NAME; got {subnet:?}",
                    self.region
                ));
            }
        }
        if self.boot_disk_gb.is_some_and(|g| g < 10) {
            return Err(
                "boot_disk_gb: expected at least 10 (Compute Engine's smallest boot disk)".into(),
            );
        }
        if let Some(t) = &self.boot_disk_type {
            if !is_name(t) {
                return Err(format!(
                    "boot_disk_type: expected a disk type such as pd-balanced; got {t:?}"
                ));
            }
        }
        if let Some(sa) = &self.service_account {
            if !sa.contains('@') {
                return Err(format!(
                    "service_account: expected an email such as jobs@{}.iam.gserviceaccount.com; got {sa:?}",
                    self.project
                ));
            }
        }
        if self.operation_timeout_seconds == 0 {
            return Err("operation_timeout_seconds: expected at least 1".into());
        }
        self.lifecycle.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "project: physics-lab-1\nregion: us-central1\nzones: [us-central1-a, us-central1-b]\nimages: {x86_64: projects/debian-cloud/global/images/family/debian-12, x86_64-nvidia: projects/physics-lab-1/global/images/cuda}\n";

    fn parse(text: &str) -> Result<GcpConfig, String> {
        let config: GcpConfig =
            meridian_adapter_core::registry::parse_config(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn a_good_file_parses_with_adc_by_default() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.credentials, Credentials::Adc);
        assert_eq!(c.operation_timeout_seconds, 180);
        assert!(!c.external_ip);
        let c = parse(&format!(
            "{GOOD}credentials: {{file: /etc/meridian/gcp.json}}\n"
        ))
        .unwrap();
        assert_eq!(
            c.credentials,
            Credentials::File("/etc/meridian/gcp.json".into())
        );
        let c = parse(&format!("{GOOD}credentials: anonymous\n")).unwrap();
        assert_eq!(c.credentials, Credentials::Anonymous);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (GOOD.replace("physics-lab-1", "Physics Lab"), "project:"),
            (GOOD.replace("region: us-central1", "region: US"), "region:"),
            (GOOD.replace("us-central1-b", "europe-west4-a"), "zones[1]"),
            (GOOD.replace("us-central1-b", "us-central1-a"), "zones[1]"),
            (
                GOOD.replace("zones: [us-central1-a, us-central1-b]", "zones: []"),
                "zones:",
            ),
            (
                GOOD.replace("x86_64-nvidia", "x86_64-intel"),
                "images.x86_64-intel",
            ),
            (
                GOOD.replace(
                    "projects/debian-cloud/global/images/family/debian-12",
                    "debian-12",
                ),
                "images.x86_64",
            ),
            (format!("{GOOD}subnetwork: jobs\n"), "subnetwork:"),
            (format!("{GOOD}boot_disk_gb: 5\n"), "boot_disk_gb"),
            (format!("{GOOD}service_account: jobs\n"), "service_account"),
            (format!("{GOOD}credentials: {{path: x}}\n"), "credentials"),
            (
                format!("{GOOD}operation_timeout_seconds: 0\n"),
                "operation_timeout_seconds",
            ),
            (format!("{GOOD}machine_type: x\n"), "machine_type"),
        ];
        for (text, expected) in cases {
            let error = parse(&text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }
}
