//! GPU type names as schedulers and device plugins write them (`a100`, `h100_80gb`,
//! `nvidia_a100-sxm4-80gb`, `mi300x`) mapped to a vendor and the catalogue's model.

use meridian_spec::{GpuVendor, Size};

/// Models by vendor, longest first where one is a prefix of another (`L40S` before
/// `L40` before `L4`), as the catalogue names them.
const MODELS: [(&str, GpuVendor); 27] = [
    ("GH200", GpuVendor::Nvidia),
    ("H200", GpuVendor::Nvidia),
    ("H100", GpuVendor::Nvidia),
    ("B200", GpuVendor::Nvidia),
    ("B100", GpuVendor::Nvidia),
    ("A100", GpuVendor::Nvidia),
    ("A6000", GpuVendor::Nvidia),
    ("A5000", GpuVendor::Nvidia),
    ("A4000", GpuVendor::Nvidia),
    ("A40", GpuVendor::Nvidia),
    ("A30", GpuVendor::Nvidia),
    ("A10G", GpuVendor::Nvidia),
    ("A10", GpuVendor::Nvidia),
    ("L40S", GpuVendor::Nvidia),
    ("L40", GpuVendor::Nvidia),
    ("L4", GpuVendor::Nvidia),
    ("V100", GpuVendor::Nvidia),
    ("P100", GpuVendor::Nvidia),
    ("T4", GpuVendor::Nvidia),
    ("MI325X", GpuVendor::Amd),
    ("MI300X", GpuVendor::Amd),
    ("MI300A", GpuVendor::Amd),
    ("MI250X", GpuVendor::Amd),
    ("MI250", GpuVendor::Amd),
    ("MI210", GpuVendor::Amd),
    ("MI100", GpuVendor::Amd),
    ("MI50", GpuVendor::Amd),
];

/// What a GPU type names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuType {
    pub vendor: GpuVendor,
    pub model: String,
    /// When the name carries it (`a100_80gb`): the least memory per GPU.
    pub memory: Option<Size>,
}

/// The GPU `raw` names, or why it names none: a vendor word (`nvidia`, `tesla`, `amd`,
/// `instinct`) may come first, a form factor (`sxm4`, `pcie`, `nvl`) and a memory
/// (`80gb`) after the model.
pub(crate) fn gpu_type(raw: &str) -> Result<GpuType, String> {
    let lower = raw.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(['_', '-', ' ', '.'])
        .filter(|w| !w.is_empty())
        .collect();
    let words: Vec<&str> = words
        .into_iter()
        .skip_while(|w| {
            matches!(
                *w,
                "nvidia" | "tesla" | "amd" | "instinct" | "geforce" | "rtx"
            )
        })
        .collect();
    let Some(first) = words.first() else {
        return Err(format!("unknown GPU type {raw:?}"));
    };
    let upper = first.to_ascii_uppercase();
    let Some((model, vendor)) = MODELS.iter().find(|(model, _)| upper == *model) else {
        return Err(format!(
            "unknown GPU type {raw:?}; known: {}",
            MODELS
                .iter()
                .map(|(m, _)| m.to_ascii_lowercase())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let mut memory = None;
    for word in &words[1..] {
        if let Some(gb) = word.strip_suffix("gb").and_then(|n| n.parse::<u64>().ok()) {
            let bytes = gb
                .checked_mul(1 << 30)
                .ok_or_else(|| format!("{raw:?}: {gb} GB is more memory than any GPU has"))?;
            memory = Some(Size::from_bytes(bytes));
        } else if !matches!(
            *word,
            "sxm" | "sxm2" | "sxm4" | "sxm5" | "pcie" | "nvl" | "nvlink" | "hbm3" | "hbm2e" | "oam"
        ) {
            return Err(format!(
                "unknown GPU type {raw:?}: {word:?} after {} is neither a memory (80gb) nor a form factor (sxm4, pcie)",
                model.to_ascii_lowercase()
            ));
        }
    }
    Ok(GpuType {
        vendor: *vendor,
        model: model.to_string(),
        memory,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_sites_write_them_map_to_the_catalogue_model() {
        for (raw, model, vendor) in [
            ("a100", "A100", GpuVendor::Nvidia),
            ("H100", "H100", GpuVendor::Nvidia),
            ("nvidia_a100-sxm4-80gb", "A100", GpuVendor::Nvidia),
            ("tesla_v100", "V100", GpuVendor::Nvidia),
            ("l40s", "L40S", GpuVendor::Nvidia),
            ("l4", "L4", GpuVendor::Nvidia),
            ("mi250", "MI250", GpuVendor::Amd),
            ("mi300x", "MI300X", GpuVendor::Amd),
            ("amd_instinct_mi250x", "MI250X", GpuVendor::Amd),
        ] {
            let got = gpu_type(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert_eq!((got.model.as_str(), got.vendor), (model, vendor), "{raw}");
        }
        assert_eq!(
            gpu_type("a100_80gb").unwrap().memory,
            Some(Size::from_bytes(80 << 30))
        );
    }

    #[test]
    fn an_unknown_type_is_named_in_the_error() {
        let e = gpu_type("a10o").unwrap_err();
        assert!(e.contains("unknown GPU type \"a10o\""), "{e}");
        assert!(gpu_type("a100_fast").unwrap_err().contains("fast"));
        assert!(gpu_type("").is_err());
    }
}
