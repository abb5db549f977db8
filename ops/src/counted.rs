//! Figures a service counts as it works — counters and histograms kept in this process
//! (they start again from zero when it restarts, which Prometheus's `rate()` and
//! `increase()` expect of counters) — shown on `/metrics` beside the figures read at
//! each scrape.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// A metric's labels, in the order given.
type Labels = Vec<(&'static str, String)>;

/// Upper bounds of the histograms' buckets, in seconds: from half a millisecond (a
/// placement on a small catalogue) to ten seconds.
pub const SECONDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

enum Figure {
    Counter(BTreeMap<Labels, f64>),
    Histogram(BTreeMap<Labels, Histogram>),
}

#[derive(Clone, Default)]
struct Histogram {
    /// Observations at most each bound of [`SECONDS`] (not yet cumulative).
    buckets: [u64; SECONDS.len()],
    count: u64,
    sum: f64,
}

static FIGURES: Mutex<BTreeMap<&'static str, (&'static str, Figure)>> = Mutex::new(BTreeMap::new());

fn labels(given: &[(&'static str, &str)]) -> Labels {
    given.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// Adds `by` to the counter `name` (which should end in `_total`) with `labels`.
pub fn count(name: &'static str, help: &'static str, given: &[(&'static str, &str)], by: f64) {
    let mut figures = FIGURES.lock().unwrap_or_else(|e| e.into_inner());
    let (_, figure) = figures
        .entry(name)
        .or_insert_with(|| (help, Figure::Counter(BTreeMap::new())));
    if let Figure::Counter(samples) = figure {
        *samples.entry(labels(given)).or_default() += by;
    }
}

/// Records one observation of `seconds` in the histogram `name` with `labels`.
pub fn observe(
    name: &'static str,
    help: &'static str,
    given: &[(&'static str, &str)],
    seconds: f64,
) {
    let mut figures = FIGURES.lock().unwrap_or_else(|e| e.into_inner());
    let (_, figure) = figures
        .entry(name)
        .or_insert_with(|| (help, Figure::Histogram(BTreeMap::new())));
    if let Figure::Histogram(samples) = figure {
        let histogram = samples.entry(labels(given)).or_default();
        if let Some(i) = SECONDS.iter().position(|bound| seconds <= *bound) {
            histogram.buckets[i] += 1;
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }
}

/// Writes every figure in the text format, each sample with `service`'s labels first.
pub(crate) fn write(out: &mut String, service: &[(&'static str, String)]) {
    let figures = FIGURES.lock().unwrap_or_else(|e| e.into_inner());
    for (name, (help, figure)) in figures.iter() {
        let with = |labels: &Labels, extra: Option<(&'static str, String)>| {
            let all: Vec<String> = service
                .iter()
                .chain(labels)
                .chain(extra.as_ref())
                .map(|(k, v)| format!("{k}=\"{}\"", crate::escape(v)))
                .collect();
            format!("{{{}}}", all.join(","))
        };
        match figure {
            Figure::Counter(samples) => {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
                for (labels, value) in samples {
                    out.push_str(&format!("{name}{} {value}\n", with(labels, None)));
                }
            }
            Figure::Histogram(samples) => {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
                for (labels, h) in samples {
                    let mut cumulative = 0;
                    for (bound, n) in SECONDS.iter().zip(h.buckets) {
                        cumulative += n;
                        let le = Some(("le", bound.to_string()));
                        out.push_str(&format!("{name}_bucket{} {cumulative}\n", with(labels, le)));
                    }
                    let le = Some(("le", "+Inf".to_string()));
                    out.push_str(&format!("{name}_bucket{} {}\n", with(labels, le), h.count));
                    out.push_str(&format!("{name}_sum{} {}\n", with(labels, None), h.sum));
                    out.push_str(&format!("{name}_count{} {}\n", with(labels, None), h.count));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_are_written_in_the_text_format() {
        count("test_things_total", "Things.", &[("site", "a")], 2.0);
        count("test_things_total", "Things.", &[("site", "a")], 1.0);
        count("test_things_total", "Things.", &[("site", "b\"")], 1.0);
        observe("test_wait_seconds", "Waits.", &[], 0.003);
        observe("test_wait_seconds", "Waits.", &[], 0.2);
        observe("test_wait_seconds", "Waits.", &[], 60.0);
        let mut out = String::new();
        write(&mut out, &[("service", "router".to_string())]);
        assert!(out.contains(
            "# TYPE test_things_total counter\n\
             test_things_total{service=\"router\",site=\"a\"} 3\n\
             test_things_total{service=\"router\",site=\"b\\\"\"} 1\n"
        ));
        assert!(out.contains("# TYPE test_wait_seconds histogram\n"));
        for line in [
            "test_wait_seconds_bucket{service=\"router\",le=\"0.0025\"} 0\n",
            "test_wait_seconds_bucket{service=\"router\",le=\"0.005\"} 1\n",
            "test_wait_seconds_bucket{service=\"router\",le=\"0.25\"} 2\n",
            "test_wait_seconds_bucket{service=\"router\",le=\"10\"} 2\n",
            "test_wait_seconds_bucket{service=\"router\",le=\"+Inf\"} 3\n",
            "test_wait_seconds_count{service=\"router\"} 3\n",
        ] {
            assert!(out.contains(line), "{line} in {out}");
        }
        assert!(out.contains("test_wait_seconds_sum{service=\"router\"} 60.2"));
    }
}
