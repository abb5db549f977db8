//! The GPUs of this machine: found with the vendors' own tools (`nvidia-smi`, `amd-smi`),
//! named as the catalogue names models, and handed out whole to one job at a time.
//!
//! No tool on `PATH`, or a tool that finds no device (no driver), means no GPUs: that is
//! said once in the log and is not an error.

use std::process::Command;

use serde::{Deserialize, Serialize};

/// One device of this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// `nvidia` or `amd`.
    pub vendor: String,
    /// The catalogue's name for the model (`H100`, `MI300X`), or the product name the
    /// tool reported when it is none the catalogue knows.
    pub model: String,
    /// The tool's index of the device.
    pub index: u32,
    /// Its UUID (`GPU-…` for NVIDIA), how a job is given it.
    pub uuid: String,
    pub memory_bytes: u64,
}

/// Models as the catalogue names them, matched against a product name word by word,
/// longest first where one begins another (`H100` before `H10`, `L40S` before `L40`).
const MODELS: [&str; 24] = [
    "GH200", "H200", "H100", "B200", "B100", "A100", "A6000", "A40", "A30", "A10G", "A10", "L40S",
    "L40", "L4", "V100", "T4", "MI325X", "MI300X", "MI300A", "MI250X", "MI250", "MI210", "MI100",
    "MI50",
];

/// The catalogue's model in a product name (`NVIDIA H100 80GB HBM3` → `H100`,
/// `AMD Instinct MI300X` → `MI300X`, `Tesla V100-SXM2-32GB` → `V100`, `A100-SXM4-80GB` →
/// `A100`); the product name itself when none is in it.
pub fn model_of(product: &str) -> String {
    let words: Vec<String> = product
        .split([' ', '-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_uppercase())
        .collect();
    MODELS
        .iter()
        .find(|m| words.iter().any(|w| w == *m))
        .map_or_else(|| product.trim().to_string(), |m| m.to_string())
}

/// The arguments of the `nvidia-smi` query [`parse_nvidia_smi`] reads.
pub const NVIDIA_SMI_QUERY: [&str; 2] = [
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader,nounits",
];

/// Devices from `nvidia-smi --query-gpu=index,uuid,name,memory.total
/// --format=csv,noheader,nounits`: one line a device, `0, GPU-…, NVIDIA H100 80GB HBM3,
/// 81559` (memory in MiB).
pub fn parse_nvidia_smi(text: &str) -> Result<Vec<Device>, String> {
    let mut devices = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, uuid, name, memory] = fields.as_slice() else {
            return Err(format!(
                "line {}: expected index, uuid, name, memory.total; got {line:?}",
                n + 1
            ));
        };
        let index = index
            .parse()
            .map_err(|_| format!("line {}: index {index:?} is not a number", n + 1))?;
        let mib: u64 = memory
            .parse()
            .map_err(|_| format!("line {}: memory {memory:?} is not MiB", n + 1))?;
        if !uuid.starts_with("GPU-") {
            return Err(format!("line {}: uuid {uuid:?} is not a GPU UUID", n + 1));
        }
        devices.push(Device {
            vendor: "nvidia".into(),
            model: model_of(name),
            index,
            uuid: uuid.to_string(),
            memory_bytes: mib.saturating_mul(1 << 20),
        });
    }
    Ok(devices)
}

/// The arguments of the `amd-smi` query [`parse_amd_smi`] reads.
pub const AMD_SMI_QUERY: [&str; 4] = ["static", "--asic", "--vram", "--json"];

/// Devices from `amd-smi static --asic --vram --json`: a list of
/// `{"gpu": 0, "asic": {"market_name": "AMD Instinct MI300X", "asic_serial": "0x…", …},
/// "vram": {"size": {"value": 196592, "unit": "MB"}, …}}`. ROCm takes the serial,
/// prefixed `GPU-`, as the device's UUID in `ROCR_VISIBLE_DEVICES`.
pub fn parse_amd_smi(text: &str) -> Result<Vec<Device>, String> {
    #[derive(Deserialize)]
    struct Gpu {
        gpu: u32,
        asic: Asic,
        vram: Vram,
    }
    #[derive(Deserialize)]
    struct Asic {
        market_name: String,
        #[serde(default)]
        asic_serial: Option<String>,
    }
    #[derive(Deserialize)]
    struct Vram {
        size: Amount,
    }
    #[derive(Deserialize)]
    struct Amount {
        value: serde_json::Value,
        unit: String,
    }
    // Older amd-smi prints the list; newer ones put it under `gpu_data`.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Output {
        List(Vec<Gpu>),
        Wrapped { gpu_data: Vec<Gpu> },
    }
    let gpus = match serde_json::from_str(text).map_err(|e| format!("not amd-smi's JSON: {e}"))? {
        Output::List(gpus) | Output::Wrapped { gpu_data: gpus } => gpus,
    };
    gpus.into_iter()
        .map(|g| {
            let value = match &g.vram.size.value {
                serde_json::Value::Number(n) => n.as_u64(),
                serde_json::Value::String(s) => s.parse().ok(),
                _ => None,
            }
            .ok_or_else(|| {
                format!(
                    "gpu {}: vram size {} is not a number",
                    g.gpu, g.vram.size.value
                )
            })?;
            let unit: u64 = match g.vram.size.unit.as_str() {
                "MB" | "MiB" => 1 << 20,
                "GB" | "GiB" => 1 << 30,
                "B" => 1,
                other => return Err(format!("gpu {}: vram unit {other:?} is unknown", g.gpu)),
            };
            let serial = g
                .asic
                .asic_serial
                .filter(|s| !s.is_empty() && s != "N/A")
                .ok_or_else(|| format!("gpu {}: no asic_serial to tell it apart", g.gpu))?;
            Ok(Device {
                vendor: "amd".into(),
                model: model_of(&g.asic.market_name),
                index: g.gpu,
                uuid: format!(
                    "GPU-{}",
                    serial.trim_start_matches("0x").to_ascii_lowercase()
                ),
                memory_bytes: value.saturating_mul(unit),
            })
        })
        .collect()
}

/// What discovery found, and what to say of it.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    pub devices: Vec<Device>,
    /// Tools that were not there or failed, for the log.
    pub notes: Vec<String>,
}

/// Runs each vendor's tool from `PATH` and gathers the devices.
pub fn discover() -> Discovery {
    let mut found = Discovery::default();
    for (tool, args, parse) in [
        (
            "nvidia-smi",
            &NVIDIA_SMI_QUERY[..],
            parse_nvidia_smi as fn(&str) -> Result<Vec<Device>, String>,
        ),
        ("amd-smi", &AMD_SMI_QUERY[..], parse_amd_smi),
    ] {
        match Command::new(tool).args(args).output() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                found.notes.push(format!("{tool} is not on PATH"));
            }
            Err(e) => found.notes.push(format!("{tool} could not run: {e}")),
            Ok(out) if !out.status.success() => found.notes.push(format!(
                "{tool} found no device: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            )),
            Ok(out) => match parse(&String::from_utf8_lossy(&out.stdout)) {
                Ok(mut devices) => found.devices.append(&mut devices),
                Err(e) => found.notes.push(format!("{tool}: {e}")),
            },
        }
    }
    found
}

/// The environment that gives a job exactly `devices` (all of one vendor).
pub fn visible(devices: &[Device]) -> Vec<(String, String)> {
    let Some(first) = devices.first() else {
        return Vec::new();
    };
    let uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    let list = uuids.join(",");
    match first.vendor.as_str() {
        "amd" => {
            // HIP numbers the devices ROCR lets through from 0.
            let hip: Vec<String> = (0..devices.len()).map(|i| i.to_string()).collect();
            vec![
                ("ROCR_VISIBLE_DEVICES".into(), list),
                ("HIP_VISIBLE_DEVICES".into(), hip.join(",")),
            ]
        }
        _ => vec![
            ("CUDA_VISIBLE_DEVICES".into(), list),
            ("NVIDIA_VISIBLE_DEVICES".into(), uuids.join(",")),
        ],
    }
}

/// Picks `count` free devices of `vendor` (`nvidia`, `amd` or `any`) and `model` (any
/// when `None`) from `devices`, none of them in `taken`; all of one vendor. `None` when
/// there are not enough.
pub fn pick<'d>(
    devices: &'d [Device],
    taken: &[String],
    count: u32,
    vendor: &str,
    model: Option<&str>,
) -> Option<Vec<&'d Device>> {
    let fits = |d: &&Device| {
        (vendor == "any" || d.vendor == vendor)
            && model.is_none_or(|m| d.model.eq_ignore_ascii_case(m))
    };
    for maker in ["nvidia", "amd"] {
        let free: Vec<&Device> = devices
            .iter()
            .filter(fits)
            .filter(|d| d.vendor == maker && !taken.contains(&d.uuid))
            .take(count as usize)
            .collect();
        if free.len() == count as usize {
            return Some(free);
        }
    }
    None
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
            (
                "NVIDIA RTX 6000 Ada Generation",
                "NVIDIA RTX 6000 Ada Generation",
            ),
        ] {
            assert_eq!(model_of(product), model, "{product}");
        }
    }

    #[test]
    fn a_bad_line_says_which() {
        let e = parse_nvidia_smi("0, GPU-1, H100, 80\n1, x, H100\n").unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        let e = parse_nvidia_smi("0, 1234, H100, 80\n").unwrap_err();
        assert!(e.contains("not a GPU UUID"), "{e}");
    }

    fn device(vendor: &str, model: &str, uuid: &str) -> Device {
        Device {
            vendor: vendor.into(),
            model: model.into(),
            index: 0,
            uuid: uuid.into(),
            memory_bytes: 1,
        }
    }

    #[test]
    fn a_job_gets_free_devices_of_its_kind_or_none() {
        let devices = [
            device("nvidia", "A100", "GPU-a"),
            device("nvidia", "A100", "GPU-b"),
            device("nvidia", "L40S", "GPU-c"),
            device("amd", "MI300X", "GPU-d"),
        ];
        let uuids = |p: Option<Vec<&Device>>| {
            p.map(|d| d.iter().map(|d| d.uuid.clone()).collect::<Vec<_>>())
        };
        assert_eq!(
            uuids(pick(&devices, &[], 2, "nvidia", Some("a100"))),
            Some(vec!["GPU-a".into(), "GPU-b".into()])
        );
        assert_eq!(
            uuids(pick(&devices, &["GPU-a".into()], 1, "nvidia", Some("A100"))),
            Some(vec!["GPU-b".into()])
        );
        assert_eq!(
            pick(&devices, &["GPU-a".into()], 2, "nvidia", Some("A100")),
            None
        );
        // Any vendor, but never a mix of two.
        assert_eq!(
            uuids(pick(
                &devices,
                &["GPU-a".into(), "GPU-b".into(), "GPU-c".into()],
                1,
                "any",
                None
            )),
            Some(vec!["GPU-d".into()])
        );
        assert_eq!(pick(&devices, &[], 4, "any", None), None);
    }

    #[test]
    fn a_job_sees_only_its_devices() {
        let env = visible(&[
            device("nvidia", "H100", "GPU-a"),
            device("nvidia", "H100", "GPU-b"),
        ]);
        assert!(env.contains(&("CUDA_VISIBLE_DEVICES".into(), "GPU-a,GPU-b".into())));
        let env = visible(&[device("amd", "MI300X", "GPU-d")]);
        assert!(env.contains(&("ROCR_VISIBLE_DEVICES".into(), "GPU-d".into())));
        assert!(env.contains(&("HIP_VISIBLE_DEVICES".into(), "0".into())));
    }
}
