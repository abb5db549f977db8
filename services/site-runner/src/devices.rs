//! A site's GPUs as the log records them, from what its adapter reports.

use meridian_adapter_core::gpu::DeviceStatus;
use meridian_events::vocabulary::site::Device;
use meridian_events::vocabulary::AcceleratorVendor;

/// Who cordons a device whose health check found a fault.
pub const HEALTH_CHECK: &str = "health check";

/// The devices to record: those of a vendor the catalogue knows (NVIDIA, AMD).
pub fn listed(devices: &[DeviceStatus]) -> Vec<Device> {
    devices
        .iter()
        .filter_map(|d| {
            let vendor = match d.vendor.as_str() {
                "nvidia" => AcceleratorVendor::Nvidia,
                "amd" => AcceleratorVendor::Amd,
                _ => return None,
            };
            Some(Device {
                id: d.id.clone(),
                vendor,
                model: d.model.clone(),
                memory_bytes: d.memory_bytes,
            })
        })
        .collect()
}
