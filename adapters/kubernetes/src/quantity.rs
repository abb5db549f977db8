//! Kubernetes resource quantities (`500m`, `16Gi`, `1e3`) as numbers, and a site's free
//! capacity: the nodes' allocatable resources less what their running pods request.
//! Capacity is a hint for placement, so plain floating point is enough here.

use k8s_openapi::api::core::v1::{Node, Pod};
use meridian_adapter_core::Capacity;

/// The value of a quantity in base units (cores, bytes, devices); `None` when it is not
/// one.
pub fn parse(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => 10f64.powi(exponent[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * scale)
}

fn usable(node: &Node) -> bool {
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_none_or(|conditions| {
            conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .is_none_or(|c| c.status == "True")
        });
    !cordoned && ready
}

/// What `pod` requests of `resource` (a container's limit stands in for a missing
/// request, as the API server defaults it).
fn requested(pod: &Pod, resource: &str) -> f64 {
    let Some(spec) = &pod.spec else { return 0.0 };
    spec.containers
        .iter()
        .filter_map(|c| {
            let r = c.resources.as_ref()?;
            let q = r
                .requests
                .as_ref()
                .and_then(|m| m.get(resource))
                .or_else(|| r.limits.as_ref().and_then(|m| m.get(resource)))?;
            parse(&q.0)
        })
        .sum()
}

/// Free capacity of the usable nodes (Ready, not cordoned), with `pods` the cluster's
/// pods that are neither Succeeded nor Failed.
pub fn capacity(nodes: &[Node], pods: &[Pod]) -> Capacity {
    let mut c = Capacity {
        healthy: true,
        ..Capacity::default()
    };
    let mut total_cpus = 0.0;
    let mut free_cpus = 0.0;
    let mut total_memory = 0.0;
    let mut free_memory = 0.0;
    let mut free_gpus = 0.0;
    for node in nodes.iter().filter(|n| usable(n)) {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        let allocatable = |resource: &str| {
            node.status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(resource))
                .and_then(|q| parse(&q.0))
                .unwrap_or(0.0)
        };
        let on_node: Vec<&Pod> = pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
            .collect();
        let used = |resource: &str| on_node.iter().map(|p| requested(p, resource)).sum::<f64>();
        let (cpus, memory) = (allocatable("cpu"), allocatable("memory"));
        total_cpus += cpus;
        total_memory += memory;
        free_cpus += (cpus - used("cpu")).max(0.0);
        free_memory += (memory - used("memory")).max(0.0);
        for gpu in ["nvidia.com/gpu", "amd.com/gpu"] {
            free_gpus += (allocatable(gpu) - used(gpu)).max(0.0);
        }
        if used("cpu") == 0.0 {
            c.idle_nodes += 1;
        }
    }
    c.total_cpus = total_cpus.floor() as u32;
    c.free_cpus = free_cpus.floor() as u32;
    c.total_memory_bytes = total_memory as u64;
    c.free_memory_bytes = free_memory as u64;
    c.free_gpus = free_gpus.floor() as u32;
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_in_every_notation() {
        assert_eq!(parse("500m"), Some(0.5));
        assert_eq!(parse("2"), Some(2.0));
        assert_eq!(parse("16Gi"), Some(16.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse("129e6"), Some(129e6));
        assert_eq!(parse("1.5k"), Some(1500.0));
        assert_eq!(parse("12Qi"), None);
        assert_eq!(parse(""), None);
    }
}
