//! A site's shapes brought up to date with what its provider says of them (`meridian
//! site refresh`): CPUs, memory and GPUs change; names, offers, node and walltime limits
//! stay as the catalogue has them.

use meridian_adapter_core::ShapeFacts;
use meridian_events::vocabulary::site::{Shape, ShapeGpus};
use meridian_events::vocabulary::AcceleratorVendor;

fn gib(bytes: u64) -> String {
    let whole = bytes >> 30;
    if whole << 30 == bytes {
        format!("{whole} GiB")
    } else {
        format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
    }
}

fn gpus_text(gpus: &Option<ShapeGpus>) -> String {
    match gpus {
        None => "none".into(),
        Some(g) => format!("{}x {} ({})", g.count, g.model, gib(g.memory_bytes)),
    }
}

/// `current` with each shape's figures as the provider gives them in `facts`, and a
/// line saying what changed (or that nothing did, and what the provider did not know).
pub fn refreshed(current: &[Shape], facts: &[ShapeFacts]) -> (Vec<Shape>, String) {
    let mut changes = Vec::new();
    let mut unknown = Vec::new();
    let shapes = current
        .iter()
        .map(|shape| {
            let Some(fact) = facts.iter().find(|f| f.name == shape.name) else {
                unknown.push(shape.name.clone());
                return shape.clone();
            };
            let vendor = |v: &str| match v {
                "nvidia" => Some(AcceleratorVendor::Nvidia),
                "amd" => Some(AcceleratorVendor::Amd),
                _ => None,
            };
            let gpus = match &fact.gpus {
                Some(g) => match vendor(&g.vendor) {
                    Some(vendor) => Some(ShapeGpus {
                        count: g.count,
                        vendor,
                        // A provider that names no model (an older size's name): the
                        // catalogue's stays.
                        model: if g.model.is_empty() {
                            shape
                                .gpus
                                .as_ref()
                                .map_or_else(String::new, |s| s.model.clone())
                        } else {
                            g.model.clone()
                        },
                        // A provider that does not say (OCI's ListShapes): the
                        // catalogue's figure stays.
                        memory_bytes: if g.memory_bytes > 0 {
                            g.memory_bytes
                        } else {
                            shape.gpus.as_ref().map_or(0, |s| s.memory_bytes)
                        },
                    }),
                    // Accelerators placement cannot place on: as the catalogue has them.
                    None => shape.gpus.clone(),
                },
                None => None,
            };
            let mut next = shape.clone();
            let mut what = Vec::new();
            if fact.cpus > 0 && fact.cpus != shape.cpus {
                what.push(format!("cpus {} -> {}", shape.cpus, fact.cpus));
                next.cpus = fact.cpus;
            }
            if fact.memory_bytes > 0 && fact.memory_bytes != shape.memory_bytes {
                what.push(format!(
                    "memory {} -> {}",
                    gib(shape.memory_bytes),
                    gib(fact.memory_bytes)
                ));
                next.memory_bytes = fact.memory_bytes;
            }
            if gpus != shape.gpus {
                what.push(format!(
                    "gpus {} -> {}",
                    gpus_text(&shape.gpus),
                    gpus_text(&gpus)
                ));
                next.gpus = gpus;
            }
            if !what.is_empty() {
                changes.push(format!("{}: {}", shape.name, what.join(", ")));
            }
            next
        })
        .collect();
    let mut outcome = if changes.is_empty() {
        format!(
            "{} shape(s) as the provider says; nothing changed",
            current.len()
        )
    } else {
        format!(
            "{} of {} shape(s) changed: {}",
            changes.len(),
            current.len(),
            changes.join("; ")
        )
    };
    if !unknown.is_empty() {
        outcome.push_str(&format!(
            "; the provider does not know {}",
            unknown.join(", ")
        ));
    }
    (shapes, outcome)
}

#[cfg(test)]
mod tests {
    use meridian_adapter_core::GpuFacts;

    use super::*;

    fn shape(name: &str, cpus: u32, memory_gib: u64) -> Shape {
        Shape {
            name: name.into(),
            offer: name.into(),
            spot_offer: Some(format!("{name}-spot")),
            cpus,
            memory_bytes: memory_gib << 30,
            gpus: None,
            max_nodes: 2,
            max_walltime_secs: Some(3600),
        }
    }

    #[test]
    fn figures_change_and_the_catalogue_keeps_the_rest() {
        let current = vec![
            shape("p4d.24xlarge", 96, 1024),
            shape("c7i.4xlarge", 16, 32),
        ];
        let facts = vec![
            ShapeFacts {
                name: "p4d.24xlarge".into(),
                cpus: 96,
                memory_bytes: 1152 << 30,
                gpus: Some(GpuFacts {
                    count: 8,
                    vendor: "nvidia".into(),
                    model: "A100".into(),
                    memory_bytes: 40 << 30,
                }),
            },
            ShapeFacts {
                name: "c7i.4xlarge".into(),
                cpus: 16,
                memory_bytes: 32 << 30,
                gpus: None,
            },
        ];
        let (shapes, outcome) = refreshed(&current, &facts);
        assert_eq!(shapes[0].memory_bytes, 1152 << 30);
        assert_eq!(shapes[0].gpus.as_ref().unwrap().count, 8);
        assert_eq!(shapes[0].spot_offer.as_deref(), Some("p4d.24xlarge-spot"));
        assert_eq!(
            (shapes[0].max_nodes, shapes[0].max_walltime_secs),
            (2, Some(3600))
        );
        assert_eq!(shapes[1], current[1]);
        assert_eq!(
            outcome,
            "1 of 2 shape(s) changed: p4d.24xlarge: memory 1024 GiB -> 1152 GiB, gpus none -> 8x A100 (40 GiB)"
        );
    }

    #[test]
    fn what_the_provider_does_not_know_is_kept_and_said() {
        let current = vec![shape("mystery", 4, 8)];
        let (shapes, outcome) = refreshed(&current, &[]);
        assert_eq!(shapes, current);
        assert!(outcome.contains("nothing changed"), "{outcome}");
        assert!(outcome.contains("does not know mystery"), "{outcome}");
    }

    #[test]
    fn a_gpu_memory_the_provider_does_not_give_stays_the_catalogues() {
        let mut current = shape("BM.GPU.H100.8", 224, 2048);
        current.gpus = Some(ShapeGpus {
            count: 8,
            vendor: AcceleratorVendor::Nvidia,
            model: "H100".into(),
            memory_bytes: 80 << 30,
        });
        let facts = [ShapeFacts {
            name: "BM.GPU.H100.8".into(),
            cpus: 224,
            memory_bytes: 2048 << 30,
            gpus: Some(GpuFacts {
                count: 8,
                vendor: "nvidia".into(),
                model: "H100".into(),
                memory_bytes: 0,
            }),
        }];
        let (shapes, outcome) = refreshed(std::slice::from_ref(&current), &facts);
        assert_eq!(shapes, vec![current]);
        assert!(outcome.contains("nothing changed"), "{outcome}");
    }
}
