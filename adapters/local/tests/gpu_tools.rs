//! The GPU tools' outputs as they print them (recorded in `tests/gpu_tools/`), read into
//! devices with the catalogue's model names.

use meridian_adapter_local::gpu::{parse_amd_smi, parse_nvidia_smi, Device};

fn read(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/gpu_tools/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn summary(devices: &[Device]) -> Vec<(u32, &str, &str, u64)> {
    devices
        .iter()
        .map(|d| {
            (
                d.index,
                d.vendor.as_str(),
                d.model.as_str(),
                d.memory_bytes >> 20,
            )
        })
        .collect()
}

#[test]
fn eight_h100s_from_nvidia_smi() {
    let devices = parse_nvidia_smi(&read("nvidia-smi-h100x8.csv")).unwrap();
    assert_eq!(devices.len(), 8);
    assert!(devices
        .iter()
        .all(|d| d.model == "H100" && d.memory_bytes == 81559 << 20));
    assert_eq!(devices[7].uuid, "GPU-8f9a0b1c-2d3e-4f5a-6b7c-8d9e0f1a2b18");
    let mut uuids: Vec<&str> = devices.iter().map(|d| d.uuid.as_str()).collect();
    uuids.dedup();
    assert_eq!(uuids.len(), 8);
}

#[test]
fn mixed_models_from_nvidia_smi() {
    let devices = parse_nvidia_smi(&read("nvidia-smi-mixed.csv")).unwrap();
    assert_eq!(
        summary(&devices),
        [
            (0, "nvidia", "A100", 81920),
            (1, "nvidia", "A100", 81920),
            (2, "nvidia", "L40S", 46068),
            (3, "nvidia", "V100", 32768),
        ]
    );
}

#[test]
fn mi300xs_from_amd_smi() {
    let devices = parse_amd_smi(&read("amd-smi-mi300x.json")).unwrap();
    assert_eq!(
        summary(&devices),
        [(0, "amd", "MI300X", 196592), (1, "amd", "MI300X", 196592)]
    );
    assert_eq!(devices[0].uuid, "GPU-8f2c4a1b3d5e6f70");
}

#[test]
fn newer_amd_smi_puts_the_list_under_gpu_data() {
    let devices = parse_amd_smi(&read("amd-smi-mi300x-gpu-data.json")).unwrap();
    assert_eq!(
        summary(&devices),
        [(0, "amd", "MI300X", 196592), (1, "amd", "MI300X", 196592)]
    );
    assert_eq!(devices[1].uuid, "GPU-8a1d07e4b9c23f56");
}

#[test]
fn what_is_not_the_tools_output_is_an_error_not_a_device() {
    assert!(parse_amd_smi("not json").is_err());
    assert!(parse_nvidia_smi(&read("nvidia-smi-no-driver.txt")).is_err());
    assert_eq!(parse_nvidia_smi("").unwrap(), Vec::new());
}
