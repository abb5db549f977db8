//! An OCI site's configuration file, and the API key it reads from OCI's own config
//! file; checked before anything is contacted, every error naming its field.

use std::collections::BTreeMap;
use std::path::PathBuf;

use meridian_adapter_cloud::config::{self, Images};
use meridian_adapter_cloud::LifecycleConfig;
use serde::Deserialize;

/// An OCI site: where to launch, from which images, in which subnets, as whom.
///
/// ```yaml
/// region: us-ashburn-1
/// compartment: ocid1.compartment.oc1..aaaa…
/// images:                        # by architecture, and architecture-GPU vendor
///   x86_64: ocid1.image.oc1.iad.aaaa…
///   x86_64-nvidia: ocid1.image.oc1.iad.bbbb…
/// availability_domains:          # in order of preference, a subnet each
///   - {name: "Uocm:US-ASHBURN-AD-1", subnet: ocid1.subnet.oc1.iad.aaaa…}
/// credentials: {config_file: ~/.oci/config, profile: DEFAULT}
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OciConfig {
    pub region: String,
    /// Another Core Services endpoint (a private endpoint, or a local test server);
    /// default `https://iaas.<region>.oraclecloud.com`.
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// The compartment instances are launched in and listed from.
    pub compartment: String,
    /// The image OCID by `ARCH` or `ARCH-VENDOR`: `x86_64`, `aarch64`, `x86_64-nvidia`,
    /// `x86_64-amd`.
    pub images: Images,
    /// Where to launch, in order of preference: OCI needs an availability domain and a
    /// subnet for every instance.
    pub availability_domains: Vec<AvailabilityDomain>,
    /// The boot volume's size, when not the image's.
    #[serde(default)]
    pub boot_volume_gbs: Option<u32>,
    #[serde(default)]
    pub credentials: Credentials,
    /// Reads the site's shapes (OCPUs, memory, GPUs) from ListShapes when the adapter
    /// starts, and declares them in the catalogue.
    #[serde(default)]
    pub refresh_shapes: bool,
    #[serde(default)]
    pub lifecycle: LifecycleConfig,
}

/// An availability domain, and the subnet instances get there.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AvailabilityDomain {
    pub name: String,
    pub subnet: String,
}

/// Where the API key is: a profile of OCI's config file (the CLI's and SDKs'), whose
/// `user`, `fingerprint`, `tenancy` and `key_file` are read at start. The key never
/// leaves the adapter's memory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Credentials {
    pub config_file: PathBuf,
    pub profile: String,
}

impl Default for Credentials {
    fn default() -> Self {
        Credentials {
            config_file: PathBuf::from("~/.oci/config"),
            profile: "DEFAULT".into(),
        }
    }
}

/// A profile of OCI's config file, as the signer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub tenancy: String,
    pub user: String,
    pub fingerprint: String,
    pub key_file: PathBuf,
}

const ARCHITECTURES: &[&str] = &["x86_64", "aarch64"];

fn ocid(value: &str, kind: &str) -> bool {
    value.starts_with(&format!("ocid1.{kind}."))
}

impl OciConfig {
    /// What is wrong with it, naming the field.
    pub fn check(&self) -> Result<(), String> {
        config::check_region(&self.region, "us-ashburn-1")?;
        config::check_endpoint(self.endpoint_url.as_deref())?;
        if !ocid(&self.compartment, "compartment") && !ocid(&self.compartment, "tenancy") {
            return Err(format!(
                "compartment: expected a compartment OCID such as ocid1.compartment.oc1..aaaa…; got {:?}",
                self.compartment
            ));
        }
        self.images.check(
            ARCHITECTURES,
            |image| ocid(image, "image"),
            "ocid1.image.oc1.iad.aaaa…",
        )?;
        if self.availability_domains.is_empty() {
            return Err("availability_domains: expected at least one, such as {name: \"Uocm:US-ASHBURN-AD-1\", subnet: ocid1.subnet.oc1.iad.aaaa…}".into());
        }
        for (i, ad) in self.availability_domains.iter().enumerate() {
            if ad.name.trim().is_empty() {
                return Err(format!(
                    "availability_domains[{i}].name: expected a name such as Uocm:US-ASHBURN-AD-1"
                ));
            }
            if !ocid(&ad.subnet, "subnet") {
                return Err(format!(
                    "availability_domains[{i}].subnet: expected a subnet OCID such as ocid1.subnet.oc1.iad.aaaa…; got {:?}",
                    ad.subnet
                ));
            }
            if self.availability_domains[..i]
                .iter()
                .any(|a| a.name == ad.name)
            {
                return Err(format!(
                    "availability_domains[{i}].name: {} is listed twice",
                    ad.name
                ));
            }
        }
        if self.boot_volume_gbs.is_some_and(|g| g < 50) {
            return Err(
                "boot_volume_gbs: expected at least 50 (OCI's smallest boot volume)".into(),
            );
        }
        self.lifecycle.check()
    }

    /// The subnet of availability domain `name`.
    pub fn subnet(&self, name: &str) -> Option<&str> {
        self.availability_domains
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.subnet.as_str())
    }
}

impl Credentials {
    /// Reads the profile from the config file (`~` is the home directory); errors name
    /// the file, the profile and the key that is missing.
    pub fn read(&self) -> Result<ApiKey, String> {
        let path = expand(&self.config_file);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "credentials.config_file: cannot read {}: {e}",
                path.display()
            )
        })?;
        parse_profile(&text, &self.profile).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// `~/x` as the home directory's `x`.
fn expand(path: &std::path::Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => path.to_path_buf(),
    }
}

/// A profile of OCI's INI-style config file: `[NAME]` sections of `key=value` lines;
/// `#` starts a comment.
pub fn parse_profile(text: &str, profile: &str) -> Result<ApiKey, String> {
    let mut section = None::<String>;
    let mut found = BTreeMap::new();
    let mut seen = false;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.trim().to_string());
            seen |= name.trim() == profile;
            continue;
        }
        if section.as_deref() != Some(profile) {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            found.insert(key.trim().to_string(), value.trim().to_string());
        }
    }
    if !seen {
        return Err(format!("no profile [{profile}]"));
    }
    let get = |key: &str| {
        found
            .get(key)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| format!("profile [{profile}] has no {key}"))
    };
    Ok(ApiKey {
        tenancy: get("tenancy")?,
        user: get("user")?,
        fingerprint: get("fingerprint")?,
        key_file: expand(std::path::Path::new(&get("key_file")?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "region: us-ashburn-1\ncompartment: ocid1.compartment.oc1..c\nimages: {x86_64: ocid1.image.oc1.iad.a, x86_64-amd: ocid1.image.oc1.iad.b}\navailability_domains: [{name: 'Uocm:US-ASHBURN-AD-1', subnet: ocid1.subnet.oc1.iad.s}]\n";

    fn parse(text: &str) -> Result<OciConfig, String> {
        let config: OciConfig =
            meridian_adapter_core::registry::parse_config(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn a_good_file_parses_and_picks_images_by_vendor() {
        let c = parse(GOOD).unwrap();
        assert_eq!(
            c.images.find("x86_64", Some("amd")).as_deref(),
            Some("ocid1.image.oc1.iad.b")
        );
        assert_eq!(
            c.subnet("Uocm:US-ASHBURN-AD-1"),
            Some("ocid1.subnet.oc1.iad.s")
        );
        assert_eq!(c.credentials.profile, "DEFAULT");
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (GOOD.replace("us-ashburn-1", "US East"), "region:"),
            (
                GOOD.replace("ocid1.compartment.oc1..c", "c"),
                "compartment:",
            ),
            (
                GOOD.replace("x86_64-amd", "x86_64-intel"),
                "images.x86_64-intel",
            ),
            (
                GOOD.replace("ocid1.image.oc1.iad.a", "ami-1"),
                "images.x86_64: expected an image id such as ocid1.image.",
            ),
            (
                GOOD.replace("ocid1.subnet.oc1.iad.s", "subnet-1"),
                "availability_domains[0].subnet",
            ),
            (format!("{GOOD}boot_volume_gbs: 10\n"), "boot_volume_gbs"),
            (
                format!("{GOOD}lifecycle: {{work_dir: tmp}}\n"),
                "lifecycle.work_dir",
            ),
            (format!("{GOOD}shape: x\n"), "shape"),
        ];
        for (text, expected) in cases {
            let error = parse(&text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }

    #[test]
    fn the_profile_is_read_from_ocis_config_file() {
        let text = "[DEFAULT]\nuser=ocid1.user.oc1..u\nfingerprint=20:3b\ntenancy=ocid1.tenancy.oc1..t\nregion=us-ashburn-1\nkey_file=/keys/oci.pem\n\n[OTHER]\n# a comment\nuser = ocid1.user.oc1..o\nfingerprint = aa:bb\ntenancy = ocid1.tenancy.oc1..t\nkey_file = /keys/other.pem\n";
        let key = parse_profile(text, "OTHER").unwrap();
        assert_eq!(key.user, "ocid1.user.oc1..o");
        assert_eq!(key.key_file, PathBuf::from("/keys/other.pem"));
        assert_eq!(parse_profile(text, "DEFAULT").unwrap().fingerprint, "20:3b");
        assert_eq!(
            parse_profile(text, "NONE").unwrap_err(),
            "no profile [NONE]"
        );
        let e = parse_profile("[DEFAULT]\nuser=u\n", "DEFAULT").unwrap_err();
        assert_eq!(e, "profile [DEFAULT] has no tenancy");
    }
}
