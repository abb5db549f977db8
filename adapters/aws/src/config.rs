//! An AWS site's configuration file, checked before anything is contacted; every error
//! names its field.

use meridian_adapter_cloud::config::{self, Images};
use meridian_adapter_cloud::LifecycleConfig;
use serde::Deserialize;

/// An AWS site: where to launch, from which images, with what network and role.
///
/// ```yaml
/// region: us-east-1
/// images:                      # by architecture, and architecture-GPU vendor
///   x86_64: ami-0aaa…          # Docker and curl on it
///   x86_64-nvidia: ami-0bbb…   # plus the NVIDIA driver and container toolkit
/// subnets:                     # one per zone, in order of preference
///   - {zone: us-east-1a, subnet: subnet-0123…}
///   - {zone: us-east-1b, subnet: subnet-4567…}
/// security_groups: [sg-0123…]
/// instance_profile: meridian-jobs
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsConfig {
    pub region: String,
    /// Another EC2 endpoint (a VPC endpoint, or a local test server).
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// The image (AMI) by `ARCH` or `ARCH-VENDOR`: `x86_64`, `arm64`, `x86_64-nvidia`,
    /// `x86_64-amd`.
    pub images: Images,
    /// The subnets to launch in, one per zone, in order of preference. None: the
    /// default VPC, in the zone EC2 chooses.
    #[serde(default)]
    pub subnets: Vec<Subnet>,
    #[serde(default)]
    pub security_groups: Vec<String>,
    /// The instance profile (name or ARN) jobs run with: what data they may read.
    #[serde(default)]
    pub instance_profile: Option<String>,
    /// A key pair, for logging in to an instance to debug it.
    #[serde(default)]
    pub key_name: Option<String>,
    /// Reads the site's shapes (vCPUs, memory, GPUs) from DescribeInstanceTypes when
    /// the adapter starts, and declares them in the catalogue.
    #[serde(default)]
    pub refresh_shapes: bool,
    #[serde(default)]
    pub lifecycle: LifecycleConfig,
}

/// A subnet, and the zone it is in.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subnet {
    pub zone: String,
    pub subnet: String,
}

const ARCHITECTURES: &[&str] = &["x86_64", "arm64", "i386", "x86_64_mac", "arm64_mac"];

impl AwsConfig {
    /// What is wrong with it, naming the field.
    pub fn check(&self) -> Result<(), String> {
        config::check_region(&self.region, "us-east-1")?;
        config::check_endpoint(self.endpoint_url.as_deref())?;
        self.images.check(
            ARCHITECTURES,
            |image| image.starts_with("ami-"),
            "ami-0123456789abcdef0",
        )?;
        for (i, subnet) in self.subnets.iter().enumerate() {
            if !subnet.zone.starts_with(&self.region) {
                return Err(format!(
                    "subnets[{i}].zone: expected a zone of {} such as {}a; got {:?}",
                    self.region, self.region, subnet.zone
                ));
            }
            if !subnet.subnet.starts_with("subnet-") {
                return Err(format!(
                    "subnets[{i}].subnet: expected a subnet id such as subnet-0123456789abcdef0; got {:?}",
                    subnet.subnet
                ));
            }
            if self.subnets[..i].iter().any(|s| s.zone == subnet.zone) {
                return Err(format!(
                    "subnets[{i}].zone: {} is listed twice; give one subnet per zone",
                    subnet.zone
                ));
            }
        }
        for (i, group) in self.security_groups.iter().enumerate() {
            if !group.starts_with("sg-") {
                return Err(format!(
                    "security_groups[{i}]: expected a security group id such as sg-0123456789abcdef0; got {group:?}"
                ));
            }
        }
        self.lifecycle.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AwsConfig, String> {
        let config: AwsConfig =
            meridian_adapter_core::registry::parse_config(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn a_good_file_parses_and_picks_images_by_vendor() {
        let c = parse(
            "region: us-east-1\nimages: {x86_64: ami-1, x86_64-nvidia: ami-2}\nsubnets: [{zone: us-east-1a, subnet: subnet-1}]\n",
        )
        .unwrap();
        assert_eq!(
            c.images.find("x86_64", Some("nvidia")).as_deref(),
            Some("ami-2")
        );
        assert_eq!(c.lifecycle.walltime_grace.as_secs(), 300);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("region: US East\nimages: {x86_64: ami-1}\n", "region:"),
            ("region: us-east-1\nimages: {}\n", "images:"),
            ("region: us-east-1\nimages: {x86_64-intel: ami-1}\n", "images.x86_64-intel"),
            ("region: us-east-1\nimages: {x86_64: img-1}\n", "images.x86_64: expected an image id such as ami-"),
            (
                "region: us-east-1\nimages: {x86_64: ami-1}\nsubnets: [{zone: eu-west-1a, subnet: subnet-1}]\n",
                "subnets[0].zone",
            ),
            (
                "region: us-east-1\nimages: {x86_64: ami-1}\nsecurity_groups: [default]\n",
                "security_groups[0]",
            ),
            (
                "region: us-east-1\nimages: {x86_64: ami-1}\nlifecycle: {work_dir: tmp}\n",
                "lifecycle.work_dir",
            ),
            ("region: us-east-1\nimages: {x86_64: ami-1}\nzone: a\n", "zone"),
        ];
        for (text, expected) in cases {
            let error = parse(text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }
}
