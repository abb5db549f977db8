//! The GPU tools' outputs as they print them (recorded in `tests/gpu_tools/`), read into
//! devices with the catalogue's model names, and into faults by device.

use meridian_adapter_local::gpu::{
    parse_amd_health, parse_amd_smi, parse_nvidia_health, parse_nvidia_smi, parse_rocm_smi, Device,
};

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

#[test]
fn nvidia_health_signals_name_each_fault() {
    let faults = parse_nvidia_health(&read("nvidia-smi-health.csv")).unwrap();
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert_eq!(
        faults["GPU-9e2f1a6b-3c4d-8e7f-0a1b-2c3d4e5f6a72"],
        "2 uncorrectable ECC error(s); memory pages waiting to be retired (a reset is due)"
    );
    assert_eq!(
        faults["GPU-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c63"],
        "hardware thermal slowdown (over its slowdown temperature)"
    );
    // A device without such signals ([N/A]) and a healthy one are not faults.
    assert!(!faults.contains_key("GPU-5d6e7f8a-9b0c-1d2e-3f4a-5b6c7d8e9f04"));
    assert!(parse_nvidia_health("GPU-1, 0\n")
        .unwrap_err()
        .starts_with("line 1:"));
}

#[test]
fn amd_uncorrectable_ecc_errors_are_faults_correctable_ones_are_not() {
    let devices = parse_amd_smi(&read("amd-smi-mi300x.json")).unwrap();
    let faults = parse_amd_health(&read("amd-smi-metric-ecc.json"), &devices).unwrap();
    assert_eq!(
        faults.into_iter().collect::<Vec<_>>(),
        [(
            devices[1].uuid.clone(),
            "3 uncorrectable ECC error(s)".to_string()
        )]
    );
    let wrapped = format!("{{\"gpu_data\": {}}}", read("amd-smi-metric-ecc.json"));
    assert_eq!(parse_amd_health(&wrapped, &devices).unwrap().len(), 1);
    assert!(parse_amd_health("[", &devices).is_err());
}

#[test]
fn mi250xs_from_rocm_smi_where_amd_smi_is_missing() {
    let devices = parse_rocm_smi(&read("rocm-smi-mi250x.json")).unwrap();
    assert_eq!(
        summary(&devices),
        [(0, "amd", "MI250X", 65520), (1, "amd", "MI250X", 65520)]
    );
    assert_eq!(devices[0].uuid, "GPU-5e8bf4f3d7a1c0b2");
    // Another ROCm release spells the key in lower case.
    let lower = read("rocm-smi-mi250x.json").replace("Card Series", "Card series");
    assert_eq!(parse_rocm_smi(&lower).unwrap()[1].model, "MI250X");
    let e = parse_rocm_smi(r#"{"card0": {"Card Series": "AMD Instinct MI210"}}"#).unwrap_err();
    assert!(e.contains("card0: no Unique ID"), "{e}");
}

/// Printed by a real H200 (driver 580, `scripts/gpu-check` on 2026-12-04): discovery,
/// and health where the driver has no retired-pages count for HBM3e (`[N/A]`).
#[test]
fn a_real_h200_is_found_and_healthy() {
    let devices = parse_nvidia_smi(&read("nvidia-smi-h200-real.csv")).unwrap();
    assert_eq!(summary(&devices), [(0, "nvidia", "H200", 143771)]);
    assert_eq!(devices[0].uuid, "GPU-0b804062-14c7-5e81-ab52-d5349d69fbd9");
    let faults = parse_nvidia_health(&read("nvidia-smi-health-h200-real.csv")).unwrap();
    assert!(faults.is_empty(), "{faults:?}");
}
