//! GPUs on Kubernetes: which vendor's device-plugin resource a job asks for, and which
//! node label values name the model it wants. Pure: the nodes come in as data.

use std::collections::{BTreeMap, BTreeSet};

use meridian_adapter_core::Gpus;

use crate::config::{KubernetesConfig, Profile};

/// A GPU vendor the adapter can place on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    Nvidia,
    Amd,
}

impl Vendor {
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
        }
    }

    /// The device plugin's extended resource.
    pub fn resource(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia.com/gpu",
            Vendor::Amd => "amd.com/gpu",
        }
    }

    fn label(self, config: &KubernetesConfig) -> &str {
        match self {
            Vendor::Nvidia => config.nvidia_label(),
            Vendor::Amd => config.amd_label(),
        }
    }
}

/// What a node offers, as far as GPUs go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeGpus {
    pub labels: BTreeMap<String, String>,
    /// Allocatable `nvidia.com/gpu` and `amd.com/gpu`.
    pub nvidia: u32,
    pub amd: u32,
}

impl NodeGpus {
    fn count(&self, vendor: Vendor) -> u32 {
        match vendor {
            Vendor::Nvidia => self.nvidia,
            Vendor::Amd => self.amd,
        }
    }
}

/// Where a GPU job goes: the vendor's resource, and a node affinity on the model's label
/// (`values` empty: any model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPlacement {
    pub vendor: Vendor,
    pub count: u32,
    pub label_key: String,
    pub values: Vec<String>,
    /// The model asked for, as the catalogue names it.
    pub model: Option<String>,
}

/// CoreWeave's `gpu.nvidia.com/class` values for the catalogue's model names.
const COREWEAVE_CLASSES: &[(&str, &[&str])] = &[
    (
        "A100",
        &[
            "A100_NVLINK",
            "A100_NVLINK_80GB",
            "A100_PCIE_40GB",
            "A100_PCIE_80GB",
        ],
    ),
    ("A40", &["A40"]),
    ("GH200", &["GH200_480GB"]),
    ("H100", &["H100_NVLINK_80GB", "H100_PCIE"]),
    ("H200", &["H200_NVLINK_141GB"]),
    ("L40", &["L40"]),
    ("L40S", &["L40S"]),
    ("RTX A5000", &["RTX_A5000"]),
    ("RTX A6000", &["RTX_A6000"]),
    ("V100", &["Tesla_V100_NVLINK"]),
];

/// The label values that name `model` on this site: the configured ones, CoreWeave's
/// classes with that profile, else every value the nodes carry whose words include the
/// model's (`NVIDIA-H100-80GB-HBM3` and `H100_NVLINK_80GB` name an `H100`; `L40S` is
/// not an `L4`).
pub fn model_values(
    config: &KubernetesConfig,
    vendor: Vendor,
    model: &str,
    nodes: &[NodeGpus],
) -> Vec<String> {
    let wanted = model.to_ascii_lowercase();
    if let Some((_, values)) = config
        .gpu_models
        .iter()
        .find(|(m, _)| m.to_ascii_lowercase() == wanted)
    {
        return values.clone();
    }
    if config.profile == Profile::Coreweave && vendor == Vendor::Nvidia {
        if let Some((_, classes)) = COREWEAVE_CLASSES
            .iter()
            .find(|(m, _)| m.to_ascii_lowercase() == wanted)
        {
            return classes.iter().map(|c| c.to_string()).collect();
        }
    }
    let key = vendor.label(config);
    let words: Vec<String> = words(&wanted);
    let found: BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| n.labels.get(key))
        .filter(|value| {
            let have = words_of(value);
            words.iter().all(|w| have.contains(w))
        })
        .cloned()
        .collect();
    found.into_iter().collect()
}

fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect()
}

fn words_of(value: &str) -> BTreeSet<String> {
    words(value).into_iter().collect()
}

/// Where `gpus` can go on a site with `nodes`: `vendor: any` takes the first vendor
/// (NVIDIA, then AMD) some node has enough of, in the model asked for. `Err` says why no
/// node of this site can take it now.
pub fn place(
    gpus: &Gpus,
    config: &KubernetesConfig,
    nodes: &[NodeGpus],
) -> Result<GpuPlacement, String> {
    let vendors: &[Vendor] = match gpus.vendor.as_str() {
        "nvidia" => &[Vendor::Nvidia],
        "amd" => &[Vendor::Amd],
        "any" | "" => &[Vendor::Nvidia, Vendor::Amd],
        other => return Err(format!("GPU vendor {other:?} is not nvidia, amd or any")),
    };
    let mut why = Vec::new();
    for &vendor in vendors {
        let values = match &gpus.model {
            Some(model) => model_values(config, vendor, model, nodes),
            None => Vec::new(),
        };
        let key = vendor.label(config).to_string();
        let fits = nodes.iter().any(|n| {
            n.count(vendor) >= gpus.count
                && (gpus.model.is_none() || n.labels.get(&key).is_some_and(|v| values.contains(v)))
        });
        // A fixed vendor is placed even when no node fits now: the cluster may scale up,
        // and the pod then waits as Pending with the scheduler's reason.
        if fits || (vendors.len() == 1 && (gpus.model.is_none() || !values.is_empty())) {
            return Ok(GpuPlacement {
                vendor,
                count: gpus.count,
                label_key: key,
                values,
                model: gpus.model.clone(),
            });
        }
        why.push(match &gpus.model {
            Some(model) => format!(
                "no node has {} {} GPU(s) labelled {key} as a {model}",
                gpus.count,
                vendor.as_str()
            ),
            None => format!("no node has {} {} GPU(s)", gpus.count, vendor.as_str()),
        });
    }
    Err(why.join("; "))
}

/// Why the nodes' GPUs cannot be told apart by model, if they cannot: nodes offer a
/// vendor's GPUs but none carries the label key configured for it.
pub fn label_problem(config: &KubernetesConfig, nodes: &[NodeGpus]) -> Option<String> {
    for (vendor, field) in [
        (Vendor::Nvidia, "gpu_labels.nvidia"),
        (Vendor::Amd, "gpu_labels.amd"),
    ] {
        let key = vendor.label(config);
        let with_gpus: Vec<&NodeGpus> = nodes.iter().filter(|n| n.count(vendor) > 0).collect();
        if !with_gpus.is_empty() && !with_gpus.iter().any(|n| n.labels.contains_key(key)) {
            let seen: BTreeSet<&str> = with_gpus
                .iter()
                .flat_map(|n| n.labels.keys())
                .map(String::as_str)
                .filter(|k| k.contains("gpu") || k.contains("nvidia") || k.contains("amd"))
                .collect();
            return Some(format!(
                "{field}: {} node(s) offer {} but none carries the label {key:?}, so no job \
                 can ask for a GPU model (GPU labels seen: {}); install the vendor's \
                 labeller or set {field}",
                with_gpus.len(),
                vendor.resource(),
                if seen.is_empty() {
                    "none".to_string()
                } else {
                    seen.into_iter().collect::<Vec<_>>().join(", ")
                }
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(label: (&str, &str), nvidia: u32, amd: u32) -> NodeGpus {
        NodeGpus {
            labels: [(label.0.to_string(), label.1.to_string())].into(),
            nvidia,
            amd,
        }
    }

    fn gpus(vendor: &str, model: Option<&str>) -> Gpus {
        Gpus {
            count: 1,
            vendor: vendor.into(),
            model: model.map(str::to_string),
        }
    }

    #[test]
    fn a_model_matches_whole_words_of_the_label_values() {
        let c = KubernetesConfig::new("m");
        let nodes = [
            node(("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"), 8, 0),
            node(("nvidia.com/gpu.product", "NVIDIA-L40S"), 4, 0),
            node(("nvidia.com/gpu.product", "NVIDIA-L4"), 1, 0),
        ];
        assert_eq!(
            model_values(&c, Vendor::Nvidia, "H100", &nodes),
            ["NVIDIA-H100-80GB-HBM3"]
        );
        assert_eq!(
            model_values(&c, Vendor::Nvidia, "L4", &nodes),
            ["NVIDIA-L4"]
        );
        let placed = place(&gpus("nvidia", Some("L40S")), &c, &nodes).unwrap();
        assert_eq!(placed.values, ["NVIDIA-L40S"]);
        assert_eq!(placed.label_key, "nvidia.com/gpu.product");
    }

    #[test]
    fn coreweave_classes_name_the_catalogue_models() {
        let mut c = KubernetesConfig::new("m");
        c.profile = Profile::Coreweave;
        let placed = place(&gpus("nvidia", Some("H100")), &c, &[]).unwrap();
        assert_eq!(placed.label_key, "gpu.nvidia.com/class");
        assert_eq!(placed.values, ["H100_NVLINK_80GB", "H100_PCIE"]);
    }

    #[test]
    fn vendor_any_takes_what_the_cluster_has() {
        let c = KubernetesConfig::new("m");
        let nodes = [node(
            ("amd.com/gpu.product-name", "AMD_Instinct_MI300X"),
            0,
            8,
        )];
        let placed = place(&gpus("any", Some("MI300X")), &c, &nodes).unwrap();
        assert_eq!(placed.vendor, Vendor::Amd);
        assert_eq!(placed.values, ["AMD_Instinct_MI300X"]);
        let err = place(&gpus("any", Some("H100")), &c, &nodes).unwrap_err();
        assert!(
            err.contains("labelled nvidia.com/gpu.product as a H100"),
            "{err}"
        );
    }

    #[test]
    fn unlabelled_gpu_nodes_are_a_problem_named_by_field() {
        let c = KubernetesConfig::new("m");
        let nodes = [node(("example.com/accelerator", "h100"), 8, 0)];
        let problem = label_problem(&c, &nodes).unwrap();
        assert!(problem.starts_with("gpu_labels.nvidia:"), "{problem}");
        assert!(label_problem(&c, &[node(("nvidia.com/gpu.product", "X"), 1, 0)]).is_none());
    }
}
