//! GPUs as every site names them: the catalogue's model names, and one device's state as
//! an adapter reports it (for cordoning faulty devices).

use serde::{Deserialize, Serialize};

/// Models as the catalogue names them, matched against a product or GRES type name word
/// by word, longest first where one begins another (`H100` before `H10`, `L40S` before
/// `L40`).
const MODELS: [&str; 24] = [
    "GH200", "H200", "H100", "B200", "B100", "A100", "A6000", "A40", "A30", "A10G", "A10", "L40S",
    "L40", "L4", "V100", "T4", "MI325X", "MI300X", "MI300A", "MI250X", "MI250", "MI210", "MI100",
    "MI50",
];

/// The catalogue's model in a product name (`NVIDIA H100 80GB HBM3` → `H100`,
/// `AMD Instinct MI300X` → `MI300X`, `Tesla V100-SXM2-32GB` → `V100`, Slurm's GRES type
/// `a100_80g` → `A100`); the name itself when no model the catalogue knows is in it.
pub fn catalogue_model(product: &str) -> String {
    let words: Vec<String> = product
        .split([' ', '-', '_', '.'])
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_uppercase())
        .collect();
    MODELS
        .iter()
        .find(|m| words.iter().any(|w| w == *m))
        .map_or_else(|| product.trim().to_string(), |m| m.to_string())
}

/// One GPU of a site as its adapter sees it now, with what is wrong with it, if anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    /// How the site tells it apart (`GPU-…`, the UUID jobs are given it by).
    pub id: String,
    /// `nvidia` or `amd`.
    pub vendor: String,
    /// The catalogue's model name.
    pub model: String,
    pub memory_bytes: u64,
    /// Why it must get no new work (uncorrectable ECC errors, pages waiting to be
    /// retired, thermal slowdown); `None` when its health signals are fine or unknown.
    pub fault: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_names_become_catalogue_models() {
        for (product, model) in [
            ("NVIDIA H100 80GB HBM3", "H100"),
            ("NVIDIA H100 PCIe", "H100"),
            ("NVIDIA H200", "H200"),
            ("NVIDIA A100-SXM4-80GB", "A100"),
            ("NVIDIA A100 80GB PCIe", "A100"),
            ("NVIDIA L40S", "L40S"),
            ("NVIDIA L4", "L4"),
            ("Tesla V100-SXM2-32GB", "V100"),
            ("Tesla T4", "T4"),
            ("AMD Instinct MI300X", "MI300X"),
            ("AMD Instinct MI250X", "MI250X"),
            ("AMD Instinct MI210", "MI210"),
            ("a100_80g", "A100"),
            ("h100", "H100"),
            ("mi250x", "MI250X"),
            (
                "NVIDIA RTX 6000 Ada Generation",
                "NVIDIA RTX 6000 Ada Generation",
            ),
        ] {
            assert_eq!(catalogue_model(product), model, "{product}");
        }
    }
}
