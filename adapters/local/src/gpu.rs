//! The GPUs of this machine: found with the vendors' own tools (`nvidia-smi`, `amd-smi`),
//! named as the catalogue names models, and handed out whole to one job at a time.
//!
//! No tool on `PATH`, or a tool that finds no device (no driver), means no GPUs: that is
//! said once in the log and is not an error. The same tools read each device's health
//! signals; the site runner cordons a device at fault.

use std::collections::BTreeMap;
use std::process::Command;

use meridian_adapter_core::gpu::catalogue_model;
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

/// The arguments of the `nvidia-smi` query [`parse_nvidia_smi`] reads.
pub const NVIDIA_SMI_QUERY: [&str; 2] = [
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader,nounits",
];

/// The rows of `nvidia-smi --format=csv,noheader`'s output, each with its line number
/// and exactly `N` fields, or which line has not (`expected` names the fields).
fn csv_rows<const N: usize>(
    text: &str,
    expected: &str,
) -> Result<Vec<(usize, [String; N])>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, line)| {
            let fields: Vec<String> = line.split(',').map(|f| f.trim().to_string()).collect();
            let fields: [String; N] = fields
                .try_into()
                .map_err(|_| format!("line {}: expected {expected}; got {line:?}", n + 1))?;
            Ok((n + 1, fields))
        })
        .collect()
}

/// Devices from `nvidia-smi --query-gpu=index,uuid,name,memory.total
/// --format=csv,noheader,nounits`: one line a device, `0, GPU-…, NVIDIA H100 80GB HBM3,
/// 81559` (memory in MiB).
pub fn parse_nvidia_smi(text: &str) -> Result<Vec<Device>, String> {
    let mut devices = Vec::new();
    for (n, [index, uuid, name, memory]) in csv_rows(text, "index, uuid, name, memory.total")? {
        let index = index
            .parse()
            .map_err(|_| format!("line {n}: index {index:?} is not a number"))?;
        let mib: u64 = memory
            .parse()
            .map_err(|_| format!("line {n}: memory {memory:?} is not MiB"))?;
        if !uuid.starts_with("GPU-") {
            return Err(format!("line {n}: uuid {uuid:?} is not a GPU UUID"));
        }
        devices.push(Device {
            vendor: "nvidia".into(),
            model: catalogue_model(&name),
            index,
            uuid,
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
                model: catalogue_model(&g.asic.market_name),
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

/// The arguments of the `rocm-smi` query [`parse_rocm_smi`] reads (older ROCm, where
/// `amd-smi` is not installed).
pub const ROCM_SMI_QUERY: [&str; 5] = [
    "--showproductname",
    "--showuniqueid",
    "--showmeminfo",
    "vram",
    "--json",
];

/// Devices from `rocm-smi --showproductname --showuniqueid --showmeminfo vram --json`:
/// `{"card0": {"Card Series": "AMD Instinct MI250X", "Unique ID": "0x…", "VRAM Total
/// Memory (B)": "68702699520", …}, …}`. Key case differs between ROCm releases (`Card
/// series`), so keys are matched ignoring it. The unique ID, prefixed `GPU-`, is the
/// device's UUID, as with `amd-smi`.
pub fn parse_rocm_smi(text: &str) -> Result<Vec<Device>, String> {
    let cards: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("not rocm-smi's JSON: {e}"))?;
    let mut devices = Vec::new();
    for (card, fields) in cards.iter().filter(|(k, _)| k.starts_with("card")) {
        let index: u32 = card["card".len()..]
            .parse()
            .map_err(|_| format!("{card}: not a card number"))?;
        let field = |name: &str| {
            fields.as_object().and_then(|o| {
                o.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .and_then(|(_, v)| v.as_str().map(str::trim))
                    .filter(|v| !v.is_empty() && *v != "N/A")
            })
        };
        let product = field("Card Series")
            .or_else(|| field("Card Model"))
            .ok_or_else(|| format!("{card}: no Card Series to name it"))?;
        let unique =
            field("Unique ID").ok_or_else(|| format!("{card}: no Unique ID to tell it apart"))?;
        let memory = field("VRAM Total Memory (B)")
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("{card}: no VRAM Total Memory (B)"))?;
        devices.push(Device {
            vendor: "amd".into(),
            model: catalogue_model(product),
            index,
            uuid: format!(
                "GPU-{}",
                unique.trim_start_matches("0x").to_ascii_lowercase()
            ),
            memory_bytes: memory,
        });
    }
    devices.sort_by_key(|d| d.index);
    Ok(devices)
}

/// What discovery found, and what to say of it.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    pub devices: Vec<Device>,
    /// The vendors whose tool answered: only their devices can be said to be missing.
    pub answered: Vec<String>,
    /// Tools that were not there or failed, for the log.
    pub notes: Vec<String>,
}

/// How long a vendor's tool may take: a GPU in trouble can hang it, and the health check
/// must not hang with it.
const TOOL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Runs `tool` with `args` from `PATH`: its output, or why there is none (not there,
/// failed, or killed after [`TOOL_TIMEOUT`]).
fn run_tool(tool: &str, args: &[&str]) -> Result<std::process::Output, std::io::Error> {
    use std::io::Read;
    let mut child = Command::new(tool)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut stdout = child.stdout.take().expect("piped");
    // Read beside the wait, so that a full pipe cannot stall the tool.
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let deadline = std::time::Instant::now() + TOOL_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer in {} s; stopped", TOOL_TIMEOUT.as_secs()),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Ok(std::process::Output {
        status,
        stdout: reader.join().unwrap_or_default(),
        stderr: Vec::new(),
    })
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
        ("rocm-smi", &ROCM_SMI_QUERY[..], parse_rocm_smi),
    ] {
        // rocm-smi only where amd-smi, its successor, is missing: the same devices.
        if tool == "rocm-smi" && !found.notes.iter().any(|n| n == "amd-smi is not on PATH") {
            continue;
        }
        match run_tool(tool, args) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                found.notes.push(format!("{tool} is not on PATH"));
            }
            Err(e) => found.notes.push(format!("{tool} could not run: {e}")),
            Ok(out) if !out.status.success() => found.notes.push(format!(
                "{tool} found no device: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            )),
            Ok(out) => match parse(&String::from_utf8_lossy(&out.stdout)) {
                Ok(mut devices) => {
                    let vendor = if tool == "nvidia-smi" {
                        "nvidia"
                    } else {
                        "amd"
                    };
                    found.answered.push(vendor.to_string());
                    found.devices.append(&mut devices);
                }
                Err(e) => found.notes.push(format!("{tool}: {e}")),
            },
        }
    }
    found
}

/// The arguments of the `nvidia-smi` health query [`parse_nvidia_health`] reads: fields
/// every driver since R418 answers (`[N/A]` where a device has no such signal).
pub const NVIDIA_SMI_HEALTH: [&str; 2] = [
    "--query-gpu=uuid,ecc.errors.uncorrected.volatile.total,retired_pages.pending,clocks_throttle_reasons.hw_thermal_slowdown",
    "--format=csv,noheader,nounits",
];

/// Faults by device UUID from [`NVIDIA_SMI_HEALTH`]'s output: uncorrectable ECC errors
/// since the driver loaded, memory pages waiting to be retired (the device needs a
/// reset), and hardware thermal slowdown (over its slowdown temperature). A device whose
/// signals are fine, or that has none (`[N/A]`, `[Not Supported]`), is not in it.
pub fn parse_nvidia_health(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut faults = BTreeMap::new();
    let rows = csv_rows(
        text,
        "uuid, ECC errors, pending retirement, thermal slowdown",
    )?;
    for (_, [uuid, ecc, pending, thermal]) in rows {
        let mut wrong = Vec::new();
        if let Ok(errors) = ecc.parse::<u64>() {
            if errors > 0 {
                wrong.push(format!("{errors} uncorrectable ECC error(s)"));
            }
        }
        if pending.eq_ignore_ascii_case("yes") {
            wrong.push("memory pages waiting to be retired (a reset is due)".to_string());
        }
        if thermal.eq_ignore_ascii_case("active") {
            wrong.push("hardware thermal slowdown (over its slowdown temperature)".to_string());
        }
        if !wrong.is_empty() {
            faults.insert(uuid.to_string(), wrong.join("; "));
        }
    }
    Ok(faults)
}

/// The arguments of the `amd-smi` health query [`parse_amd_health`] reads.
pub const AMD_SMI_HEALTH: [&str; 3] = ["metric", "--ecc", "--json"];

/// Faults by device UUID from `amd-smi metric --ecc --json` (the list, or under
/// `gpu_data`): uncorrectable ECC errors, for the `devices` its `gpu` indexes name.
pub fn parse_amd_health(
    text: &str,
    devices: &[Device],
) -> Result<BTreeMap<String, String>, String> {
    #[derive(Deserialize)]
    struct Gpu {
        gpu: u32,
        #[serde(default)]
        ecc: Option<serde_json::Value>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Output {
        List(Vec<Gpu>),
        Wrapped { gpu_data: Vec<Gpu> },
    }
    let gpus = match serde_json::from_str(text).map_err(|e| format!("not amd-smi's JSON: {e}"))? {
        Output::List(gpus) | Output::Wrapped { gpu_data: gpus } => gpus,
    };
    let mut faults = BTreeMap::new();
    for g in gpus {
        let errors = g
            .ecc
            .as_ref()
            .map(|e| &e["total_uncorrectable_count"])
            .and_then(|v| {
                v.as_u64()
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            })
            .unwrap_or(0);
        let device = devices
            .iter()
            .find(|d| d.vendor == "amd" && d.index == g.gpu);
        if let (true, Some(d)) = (errors > 0, device) {
            faults.insert(
                d.uuid.clone(),
                format!("{errors} uncorrectable ECC error(s)"),
            );
        }
    }
    Ok(faults)
}

/// Reads the health signals of `devices` with their vendors' tools: faults by UUID, and
/// what could not be read (for the log).
pub fn health(devices: &[Device]) -> (BTreeMap<String, String>, Vec<String>) {
    let mut faults = BTreeMap::new();
    let mut notes = Vec::new();
    let has = |vendor: &str| devices.iter().any(|d| d.vendor == vendor);
    let run = |tool: &str, args: &[&str]| match run_tool(tool, args) {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).to_string()),
        Ok(out) => Err(format!(
            "{tool} could not read health: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        )),
        Err(e) => Err(format!("{tool} could not run: {e}")),
    };
    if has("nvidia") {
        match run("nvidia-smi", &NVIDIA_SMI_HEALTH)
            .and_then(|text| parse_nvidia_health(&text).map_err(|e| format!("nvidia-smi: {e}")))
        {
            Ok(found) => faults.extend(found),
            Err(e) => notes.push(e),
        }
    }
    if has("amd") {
        match run("amd-smi", &AMD_SMI_HEALTH)
            .and_then(|text| parse_amd_health(&text, devices).map_err(|e| format!("amd-smi: {e}")))
        {
            Ok(found) => faults.extend(found),
            Err(e) => notes.push(e),
        }
    }
    (faults, notes)
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
