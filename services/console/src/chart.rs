//! Bar charts as inline SVG, drawn on the server: no script, no library, readable by
//! screen readers through their titles. Heights are for the eye only; the exact amounts
//! are in each bar's title and in the tables beside the chart.

use rust_decimal::prelude::ToPrimitive;
use rust_decimal::Decimal;

/// Bars of `values` (label, amount), in order, with `unit` in the titles.
pub(crate) fn bars(id: &str, caption: &str, values: &[(String, Decimal)], unit: &str) -> String {
    let width = 720.0_f64;
    let height = 180.0_f64;
    let top = 10.0;
    let bottom = 40.0;
    let max = values
        .iter()
        .map(|(_, v)| *v)
        .max()
        .unwrap_or(Decimal::ZERO)
        .to_f64()
        .unwrap_or(0.0);
    let n = values.len().max(1) as f64;
    let slot = width / n;
    // Bars at most 48 wide, so that one bar does not look like a wall.
    let bar = (slot * 0.7).clamp(1.0, 48.0);
    let mut svg = format!(
        "<svg id=\"{}\" class=\"chart\" role=\"img\" aria-label=\"{}\" viewBox=\"0 0 {width} {height}\" width=\"100%\">",
        escape(id),
        escape(caption)
    );
    let area = height - top - bottom;
    for (i, (label, value)) in values.iter().enumerate() {
        // Credits (negative days) draw no bar; their amount is in the title and tables.
        let v = value.to_f64().unwrap_or(0.0).max(0.0);
        let h = if max > 0.0 { area * v / max } else { 0.0 };
        let x = i as f64 * slot + (slot - bar) / 2.0;
        let y = top + area - h;
        svg.push_str(&format!(
            "<g><title>{} {} {}</title><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bar:.1}\" height=\"{h:.1}\"></rect>",
            escape(label),
            value.normalize(),
            escape(unit)
        ));
        // Label every bar when few, else about every fifth.
        if values.len() <= 12 || i % (values.len() / 6).max(1) == 0 {
            svg.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                x + bar / 2.0,
                height - bottom + 16.0,
                escape(label)
            ));
        }
        svg.push_str("</g>");
    }
    svg.push_str("</svg>");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tallest_bar_fills_the_area_and_labels_are_escaped() {
        let svg = bars(
            "c",
            "spend",
            &[
                ("a<b".into(), Decimal::new(5, 0)),
                ("b".into(), Decimal::new(10, 0)),
            ],
            "USD",
        );
        assert!(svg.contains("height=\"130.0\""), "{svg}");
        assert!(svg.contains("height=\"65.0\""), "{svg}");
        assert!(svg.contains("a&lt;b 5 USD"), "{svg}");
        assert!(!svg.contains("a<b"));
    }
}
