//! What EC2 says an instance type is (DescribeInstanceTypes): the figures a catalogue
//! shape carries. Prices are not here: they stay in the catalogue file.

use aws_sdk_ec2::types::InstanceTypeInfo;
use serde::Serialize;

/// One instance type's figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceTypeFacts {
    pub name: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    /// `x86_64`, `arm64`.
    pub architecture: String,
    pub gpus: Option<GpuFacts>,
}

/// The accelerators of one instance type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuFacts {
    pub count: u32,
    /// `nvidia` or `amd`, or the maker's name as EC2 gives it for others.
    pub vendor: String,
    pub model: String,
    pub memory_bytes: u64,
}

const MIB: u64 = 1 << 20;

pub(crate) fn facts(info: &InstanceTypeInfo) -> InstanceTypeFacts {
    let gpus = info.gpu_info().and_then(|g| {
        let first = g.gpus().first()?;
        let maker = first.manufacturer().unwrap_or_default();
        let vendor = match maker.to_ascii_lowercase().as_str() {
            "nvidia" => "nvidia".to_string(),
            "amd" => "amd".to_string(),
            other => other.to_string(),
        };
        Some(GpuFacts {
            count: g
                .gpus()
                .iter()
                .filter_map(|d| d.count())
                .sum::<i32>()
                .max(0) as u32,
            vendor,
            model: first.name().unwrap_or_default().to_string(),
            memory_bytes: first
                .memory_info()
                .and_then(|m| m.size_in_mib())
                .map_or(0, |m| m.max(0) as u64 * MIB),
        })
    });
    InstanceTypeFacts {
        name: info
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        cpus: info
            .v_cpu_info()
            .and_then(|v| v.default_v_cpus())
            .map_or(0, |v| v.max(0) as u32),
        memory_bytes: info
            .memory_info()
            .and_then(|m| m.size_in_mib())
            .map_or(0, |m| m.max(0) as u64 * MIB),
        architecture: info
            .processor_info()
            .and_then(|p| p.supported_architectures().first())
            .map(|a| a.as_str().to_string())
            .unwrap_or_else(|| "x86_64".into()),
        gpus,
    }
}
