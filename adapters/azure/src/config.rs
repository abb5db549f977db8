//! An Azure site's configuration file, checked before anything is contacted; every error
//! names its field.

use meridian_adapter_cloud::config::{self, Images};
use meridian_adapter_cloud::LifecycleConfig;
use serde::Deserialize;

/// An Azure site: where VMs go, from which images, in which subnet.
///
/// ```yaml
/// subscription: 00000000-0000-0000-0000-000000000000
/// resource_group: meridian-jobs
/// location: eastus
/// zones: ["1", "2", "3"]
/// subnet: /subscriptions/…/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/jobs/subnets/default
/// images:
///   x86_64: Canonical:ubuntu-24_04-lts:server:latest
///   x86_64-nvidia: /subscriptions/…/providers/Microsoft.Compute/galleries/meridian/images/nvidia/versions/latest
/// ssh_public_key: ssh-ed25519 AAAA… ops
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureConfig {
    pub subscription: String,
    pub resource_group: String,
    /// The region, e.g. `eastus`.
    pub location: String,
    /// Availability zones to launch in, in order of preference; none: no zone.
    #[serde(default)]
    pub zones: Vec<String>,
    /// The subnet's resource id: each VM gets a NIC there, without a public address.
    pub subnet: String,
    /// The image by architecture and GPU vendor: a marketplace URN
    /// (`publisher:offer:sku:version`) or an image's resource id.
    pub images: Images,
    /// The VMs' administrator (SSH key only; no password).
    #[serde(default = "admin")]
    pub admin_username: String,
    /// The key that may log in to a VM, to look at it. Azure wants one for a Linux VM
    /// without a password.
    pub ssh_public_key: String,
    /// The OS disk's storage (`Standard_LRS`, `Premium_LRS`, `StandardSSD_LRS`).
    #[serde(default = "disk")]
    pub os_disk_type: String,
    /// Another Resource Manager endpoint (a sovereign cloud, or a local test server).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Another Microsoft Entra ID endpoint (a sovereign cloud, or a test server).
    #[serde(default)]
    pub authority_url: Option<String>,
    /// Another instance metadata endpoint (tests).
    #[serde(default)]
    pub metadata_url: Option<String>,
    /// How long a create waits for ARM's answer (the site runner waits with it); a VM
    /// still creating after it is followed as a booting one.
    #[serde(default = "operation_timeout")]
    pub operation_timeout_seconds: u64,
    /// Reads the site's shapes from the location's VM sizes when the adapter starts.
    #[serde(default)]
    pub refresh_shapes: bool,
    #[serde(default)]
    pub lifecycle: LifecycleConfig,
}

fn admin() -> String {
    "meridian".into()
}

fn disk() -> String {
    "Standard_LRS".into()
}

fn operation_timeout() -> u64 {
    180
}

const ARCHITECTURES: &[&str] = &["x86_64", "arm64"];
const DISKS: &[&str] = &[
    "Standard_LRS",
    "StandardSSD_LRS",
    "Premium_LRS",
    "StandardSSD_ZRS",
    "Premium_ZRS",
];

/// A marketplace URN (`publisher:offer:sku:version`) or a resource id.
pub fn is_image(image: &str) -> bool {
    image.starts_with("/subscriptions/")
        || (image.split(':').count() == 4 && image.split(':').all(|p| !p.is_empty()))
}

fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.()".contains(c))
}

impl AzureConfig {
    /// What is wrong with it, naming the field.
    pub fn check(&self) -> Result<(), String> {
        let uuid = |s: &str| uuid::Uuid::try_parse(s).is_ok();
        if !uuid(&self.subscription) {
            return Err(format!(
                "subscription: expected a subscription id such as 00000000-0000-0000-0000-000000000000; got {:?}",
                self.subscription
            ));
        }
        if !name_ok(&self.resource_group) {
            return Err(format!(
                "resource_group: expected a resource group name; got {:?}",
                self.resource_group
            ));
        }
        config::check_region(&self.location, "eastus")
            .map_err(|e| e.replacen("region:", "location:", 1))?;
        for (i, zone) in self.zones.iter().enumerate() {
            if !matches!(zone.as_str(), "1" | "2" | "3") {
                return Err(format!("zones[{i}]: expected 1, 2 or 3; got {zone:?}"));
            }
        }
        if !self.subnet.starts_with("/subscriptions/") || !self.subnet.contains("/subnets/") {
            return Err(format!(
                "subnet: expected a subnet's resource id (/subscriptions/…/virtualNetworks/NET/subnets/NAME); got {:?}",
                self.subnet
            ));
        }
        self.images.check(
            ARCHITECTURES,
            is_image,
            "Canonical:ubuntu-24_04-lts:server:latest",
        )?;
        if !self.ssh_public_key.starts_with("ssh-") && !self.ssh_public_key.starts_with("ecdsa-") {
            return Err("ssh_public_key: expected a public key such as ssh-ed25519 AAAA…".into());
        }
        if !DISKS.contains(&self.os_disk_type.as_str()) {
            return Err(format!(
                "os_disk_type: expected one of {}; got {:?}",
                DISKS.join(", "),
                self.os_disk_type
            ));
        }
        for (field, url) in [
            ("endpoint_url", &self.endpoint_url),
            ("authority_url", &self.authority_url),
            ("metadata_url", &self.metadata_url),
        ] {
            config::check_endpoint(url.as_deref())
                .map_err(|e| e.replacen("endpoint_url", field, 1))?;
        }
        self.lifecycle.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "subscription: 6f3c1a52-9d1e-4b7a-8c2f-0e5d4a3b2c1d\nresource_group: jobs\nlocation: eastus\nzones: ['1', '2']\nsubnet: /subscriptions/6f3c1a52-9d1e-4b7a-8c2f-0e5d4a3b2c1d/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/s\nimages: {x86_64: 'Canonical:ubuntu-24_04-lts:server:latest'}\nssh_public_key: ssh-ed25519 AAAAC3 ops\n";

    fn parse(text: &str) -> Result<AzureConfig, String> {
        let config: AzureConfig =
            meridian_adapter_core::registry::parse_config(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn a_good_file_parses_with_its_defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(
            (c.admin_username.as_str(), c.os_disk_type.as_str()),
            ("meridian", "Standard_LRS")
        );
        assert_eq!(c.zones, ["1", "2"]);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                GOOD.replace(
                    "6f3c1a52-9d1e-4b7a-8c2f-0e5d4a3b2c1d\nresource",
                    "mine\nresource",
                ),
                "subscription:",
            ),
            (
                GOOD.replace("location: eastus", "location: East US"),
                "location:",
            ),
            (GOOD.replace("['1', '2']", "['4']"), "zones[0]"),
            (GOOD.replace("/subnets/s", "/s"), "subnet:"),
            (
                GOOD.replace("Canonical:ubuntu-24_04-lts:server:latest", "ubuntu"),
                "images.x86_64",
            ),
            (
                GOOD.replace("ssh-ed25519 AAAAC3 ops", "hunter2"),
                "ssh_public_key",
            ),
            (format!("{GOOD}os_disk_type: fast\n"), "os_disk_type"),
            (format!("{GOOD}authority_url: login\n"), "authority_url"),
            (format!("{GOOD}size: x\n"), "size"),
        ];
        for (text, expected) in cases {
            let error = parse(&text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }
}
