//! A site's shapes arranged for placement's search, so a request's cheapest fit is found
//! without pricing every shape of a full cloud catalogue. Built once per site and price
//! sheet (placement keeps it beside the fits it remembers, and drops both when the site
//! changes).
//!
//! Every (shape, offer) the sheet prices is an entry. Entries priced per instance are
//! kept cheapest first: a task's cost there grows with the hourly price alone (nodes and
//! seconds are the request's), so the first entry that fits holds the cheapest cost and
//! the search stops at the first entry that costs more. Entries priced per resource cost
//! the same on every shape that fits (the allocation is the request's), so each is priced;
//! they are few (HPC partitions, Kubernetes pools). A request for GPUs looks only at
//! shapes with GPUs. Shapes whose offer has no price are no entry: when nothing fits, the
//! caller scans every shape to say why, as before.

use std::collections::HashMap;

use meridian_events::vocabulary::site::Shape;
use meridian_events::{Allocation, ComputePricing, PriceSheet};
use rust_decimal::Decimal;

/// One way to run a task: a shape, and one of its offers (on demand or spot).
#[derive(Clone, Copy)]
struct Entry {
    /// The shape's place in the site's list: ties go to the earlier shape.
    shape: u32,
    /// 0: its on-demand offer; 1: its spot offer.
    slot: u8,
    /// The offer's place in the sheet's compute list.
    offer: u32,
}

/// A site's priced entries, for one price sheet.
pub(crate) struct ShapeIndex {
    /// Priced per instance, by hourly price, then shape and slot: every shape.
    per_instance: Vec<Entry>,
    /// The same, shapes with GPUs only.
    per_instance_gpu: Vec<Entry>,
    /// Priced per resource, in shape order.
    per_resource: Vec<Entry>,
}

/// The cheapest entry that fits: its offer's place in the sheet and the compute cost.
pub(crate) struct Cheapest {
    pub offer: usize,
    pub cost: Decimal,
}

impl ShapeIndex {
    pub(crate) fn build(shapes: &[Shape], sheet: &PriceSheet) -> ShapeIndex {
        // The sheet's offers by name; the first of a name counts, as `compute_rate` finds it.
        let by_offer: HashMap<&str, usize> = sheet
            .compute
            .iter()
            .enumerate()
            .rev()
            .map(|(i, o)| (o.offer.as_str(), i))
            .collect();
        let mut index = ShapeIndex {
            per_instance: Vec::new(),
            per_instance_gpu: Vec::new(),
            per_resource: Vec::new(),
        };
        for (shape_at, shape) in shapes.iter().enumerate() {
            let offers = std::iter::once(Some(&shape.offer)).chain([shape.spot_offer.as_ref()]);
            for (slot, name) in offers.enumerate() {
                let Some(&offer) = name.and_then(|n| by_offer.get(n.as_str())) else {
                    continue;
                };
                let entry = Entry {
                    shape: shape_at as u32,
                    slot: slot as u8,
                    offer: offer as u32,
                };
                match sheet.compute[offer].pricing {
                    ComputePricing::Instance { .. } => {
                        index.per_instance.push(entry);
                        if shape.gpus.is_some() {
                            index.per_instance_gpu.push(entry);
                        }
                    }
                    ComputePricing::Resource { .. } => index.per_resource.push(entry),
                }
            }
        }
        // Each offer's hourly price, read once.
        let hourly: Vec<Decimal> = sheet
            .compute
            .iter()
            .map(|o| match o.pricing {
                ComputePricing::Instance { per_instance_hour } => per_instance_hour,
                ComputePricing::Resource { .. } => Decimal::ZERO,
            })
            .collect();
        for list in [&mut index.per_instance, &mut index.per_instance_gpu] {
            list.sort_unstable_by(|a, b| {
                hourly[a.offer as usize]
                    .cmp(&hourly[b.offer as usize])
                    .then(a.shape.cmp(&b.shape))
                    .then(a.slot.cmp(&b.slot))
            });
        }
        index
    }

    /// The cheapest entry whose shape `fits` (and whose slot `spot` allows), with what
    /// it costs for `allocation` over `seconds`; on equal costs the earlier shape, then
    /// its on-demand offer — the choice a scan of every shape in order makes. `None`
    /// when no priced entry fits.
    pub(crate) fn cheapest(
        &self,
        sheet: &PriceSheet,
        (allocation, seconds): (&Allocation, Decimal),
        gpus: bool,
        spot: bool,
        mut fits: impl FnMut(usize) -> bool,
    ) -> Option<Cheapest> {
        let mut best: Option<(Decimal, Entry)> = None;
        let mut consider = |entry: &Entry| -> Option<Decimal> {
            if entry.slot == 1 && !spot || !fits(entry.shape as usize) {
                return None;
            }
            let cost = sheet.compute[entry.offer as usize]
                .pricing
                .amount(allocation, seconds)
                .ok()?;
            let better = best.is_none_or(|(c, b)| {
                cost < c || cost == c && (entry.shape, entry.slot) < (b.shape, b.slot)
            });
            if better {
                best = Some((cost, *entry));
            }
            Some(cost)
        };
        let by_price = if gpus {
            &self.per_instance_gpu
        } else {
            &self.per_instance
        };
        let mut floor: Option<Decimal> = None;
        for entry in by_price {
            if let Some(cost) = consider(entry) {
                // Costs only grow along the list (rounding included): past the first
                // that costs more than the first fit, none can win or tie.
                match floor {
                    None => floor = Some(cost),
                    Some(first) if cost > first => break,
                    Some(_) => {}
                }
            }
        }
        for entry in &self.per_resource {
            consider(entry);
        }
        best.map(|(cost, entry)| Cheapest {
            offer: entry.offer as usize,
            cost,
        })
    }
}
