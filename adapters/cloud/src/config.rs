//! What every cloud site's configuration file has: a region, perhaps another endpoint,
//! and images by architecture and GPU vendor; checked the same way for each, every error
//! naming its field.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::ProviderError;

/// The GPU vendors an image can be for.
const VENDORS: &[&str] = &["nvidia", "amd"];

/// `region`: lower case, digits and `-` (`us-east-1`, `us-ashburn-1`, `eastus`).
pub fn check_region(region: &str, example: &str) -> Result<(), String> {
    let ok = !region.is_empty()
        && region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "region: expected a region such as {example}; got {region:?}"
        ))
    }
}

/// `endpoint_url`, when given: an http:// or https:// URL.
pub fn check_endpoint(url: Option<&str>) -> Result<(), String> {
    match url {
        Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => Err(format!(
            "endpoint_url: expected an http:// or https:// URL; got {url:?}"
        )),
        _ => Ok(()),
    }
}

/// A cloud site's images by `ARCH` or `ARCH-VENDOR` (`x86_64`, `x86_64-nvidia`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Images(pub BTreeMap<String, String>);

impl Images {
    /// At least one; each key an architecture of `architectures`, optionally with a GPU
    /// vendor; each value an image id `is_image` takes, like `example`.
    pub fn check(
        &self,
        architectures: &[&str],
        is_image: impl Fn(&str) -> bool,
        example: &str,
    ) -> Result<(), String> {
        if self.0.is_empty() {
            return Err(format!(
                "images: expected at least one image, such as {}: {example}",
                architectures[0]
            ));
        }
        for (key, image) in &self.0 {
            let (arch, vendor) = key
                .split_once('-')
                .map_or((key.as_str(), None), |(a, v)| (a, Some(v)));
            if !architectures.contains(&arch) || vendor.is_some_and(|v| !VENDORS.contains(&v)) {
                return Err(format!(
                    "images.{key}: expected an architecture ({}), optionally with -nvidia or -amd",
                    architectures.join(", ")
                ));
            }
            if !is_image(image) {
                return Err(format!(
                    "images.{key}: expected an image id such as {example}; got {image:?}"
                ));
            }
        }
        Ok(())
    }

    /// The image for `architecture` with GPUs of `vendor`: `ARCH-VENDOR` first, then
    /// `ARCH`.
    pub fn find(&self, architecture: &str, vendor: Option<&str>) -> Option<String> {
        vendor
            .and_then(|v| self.0.get(&format!("{architecture}-{v}")))
            .or_else(|| self.0.get(architecture))
            .cloned()
    }

    /// [`Images::find`], or the refusal that names the key to add.
    pub fn for_shape(
        &self,
        shape: &str,
        architecture: &str,
        vendor: Option<&str>,
    ) -> Result<String, ProviderError> {
        self.find(architecture, vendor).ok_or_else(|| {
            ProviderError::Rejected(format!(
                "images: no image for {shape} ({architecture}{}); add images.{architecture}{} to the site's configuration",
                vendor.map(|v| format!(", {v} GPUs")).unwrap_or_default(),
                vendor.map(|v| format!("-{v}")).unwrap_or_default(),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(pairs: &[(&str, &str)]) -> Images {
        Images(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn images_are_checked_and_found_by_vendor_then_architecture() {
        let ami = |s: &str| s.starts_with("ami-");
        let good = images(&[("x86_64", "ami-1"), ("x86_64-nvidia", "ami-2")]);
        good.check(&["x86_64", "arm64"], ami, "ami-0123").unwrap();
        assert_eq!(
            good.find("x86_64", Some("nvidia")).as_deref(),
            Some("ami-2")
        );
        assert_eq!(good.find("x86_64", Some("amd")).as_deref(), Some("ami-1"));
        assert_eq!(good.find("arm64", None), None);
        let e = good
            .for_shape("g6.xlarge", "arm64", Some("nvidia"))
            .unwrap_err();
        assert!(e.to_string().contains("add images.arm64-nvidia"), "{e}");
        for (bad, says) in [
            (images(&[]), "images: expected at least one"),
            (images(&[("x86_64-intel", "ami-1")]), "images.x86_64-intel"),
            (
                images(&[("x86_64", "img-1")]),
                "images.x86_64: expected an image id such as ami-0123",
            ),
        ] {
            let e = bad.check(&["x86_64"], ami, "ami-0123").unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        assert!(check_region("US East", "us-east-1")
            .unwrap_err()
            .starts_with("region:"));
        assert!(check_endpoint(Some("ftp://x"))
            .unwrap_err()
            .starts_with("endpoint_url:"));
        assert!(check_endpoint(None).is_ok());
    }
}
