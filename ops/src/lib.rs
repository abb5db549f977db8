//! A Meridian service's operational face, on an address of its own (`--ops-listen`):
//! `/healthz` (the process serves), `/readyz` (it reaches the event log, and each read
//! model it keeps is caught up within a bound) and `/metrics` (the Prometheus text
//! format). Figures are read when scraped — the log's head, each read model's recorded
//! position and the age of the first commit it has not applied, and whatever a service
//! adds as a [`Probe`] — so nothing is counted twice and a restarted process reports
//! the truth at once; beside them, what the process [`counted`] as it worked. [`trace`]
//! carries each workflow's trace across the services.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use meridian_eventlog::EventLog;
use meridian_store::Store;

pub mod counted;
pub mod trace;

/// A service's own figures, read at each scrape: `(name, help, labels → value)`, all
/// gauges.
pub type Probe = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Vec<(&'static str, &'static str, Samples)>> + Send>>
        + Send
        + Sync,
>;

/// A metric's samples by their labels (`[("state", "running")]` → 3).
pub type Samples = Vec<(Vec<(&'static str, String)>, f64)>;

/// Ready only while each read model is at most this many commits behind the log.
pub const DEFAULT_MAX_LAG: u64 = 1000;

/// How long a readiness or metrics read of the log may take before it counts as
/// unreachable.
const LOG_TIMEOUT: Duration = Duration::from_secs(2);

/// What a service's operational face reads.
#[derive(Clone)]
pub struct Ops {
    service: &'static str,
    log: Arc<dyn EventLog>,
    store: Option<Store>,
    projections: Vec<&'static str>,
    probes: Vec<Probe>,
    max_lag: u64,
}

impl Ops {
    pub fn new(service: &'static str, log: Arc<dyn EventLog>) -> Ops {
        Ops {
            service,
            log,
            store: None,
            projections: Vec::new(),
            probes: Vec::new(),
            max_lag: DEFAULT_MAX_LAG,
        }
    }

    /// The service keeps the read model `name` in `store`: its lag is reported, and
    /// bounds readiness.
    pub fn projection(mut self, store: Store, name: &'static str) -> Ops {
        self.store = Some(store);
        self.projections.push(name);
        self
    }

    pub fn probe(mut self, probe: Probe) -> Ops {
        self.probes.push(probe);
        self
    }

    pub fn max_lag(mut self, commits: u64) -> Ops {
        self.max_lag = commits;
        self
    }

    /// `/healthz`, `/readyz` and `/metrics`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self)
    }

    async fn head(&self) -> Result<u64, String> {
        match tokio::time::timeout(LOG_TIMEOUT, self.log.head()).await {
            Ok(Ok(head)) => Ok(head),
            Ok(Err(e)) => Err(format!("the event log: {e}")),
            Err(_) => Err(format!(
                "the event log did not answer within {} s",
                LOG_TIMEOUT.as_secs()
            )),
        }
    }

    /// Each read model's position, and how far behind the log it is.
    async fn lags(&self, head: u64) -> Result<Vec<Lag>, String> {
        let Some(store) = &self.store else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for name in &self.projections {
            let position = store
                .position(name)
                .await
                .map_err(|e| format!("the database: {e}"))?;
            let behind = head.saturating_sub(position);
            let seconds = if behind == 0 {
                0.0
            } else {
                match self.log.read_from(position, 1).await {
                    Ok(commits) => commits
                        .first()
                        .and_then(|c| c.events.first())
                        .map(|e| {
                            (chrono::Utc::now() - e.occurred_at)
                                .num_milliseconds()
                                .max(0) as f64
                                / 1000.0
                        })
                        .unwrap_or(0.0),
                    Err(e) => return Err(format!("the event log: {e}")),
                }
            };
            out.push(Lag {
                name,
                position,
                behind,
                seconds,
            });
        }
        Ok(out)
    }
}

/// A read model's position and how far behind the log it is: in commits, and in seconds
/// since the first commit it has not applied was written.
struct Lag {
    name: &'static str,
    position: u64,
    behind: u64,
    seconds: f64,
}

async fn readyz(State(ops): State<Ops>) -> Response {
    let head = match ops.head().await {
        Ok(h) => h,
        Err(e) => {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")).into_response()
        }
    };
    match ops.lags(head).await {
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")).into_response(),
        Ok(lags) => {
            let behind: Vec<String> = lags
                .iter()
                .filter(|l| l.behind > ops.max_lag)
                .map(|l| {
                    format!(
                        "{} is {} commits behind the log (at {} of {head}; ready within {})",
                        l.name, l.behind, l.position, ops.max_lag
                    )
                })
                .collect();
            if behind.is_empty() {
                (StatusCode::OK, "ready\n").into_response()
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", behind.join("; ")),
                )
                    .into_response()
            }
        }
    }
}

/// The Prometheus text exposition format, version 0.0.4.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn gauge(&mut self, name: &str, help: &str, samples: &[(Vec<(&str, String)>, f64)]) {
        self.text
            .push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (labels, value) in samples {
            self.text.push_str(name);
            if !labels.is_empty() {
                let inner: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                self.text.push_str(&format!("{{{}}}", inner.join(",")));
            }
            self.text.push_str(&format!(" {value}\n"));
        }
    }
}

/// A label value as the format writes it: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

async fn metrics(State(ops): State<Ops>) -> Response {
    let mut out = Exposition::default();
    let service = vec![("service", ops.service.to_string())];
    let head = ops.head().await;
    out.gauge(
        "meridian_log_reachable",
        "1 when the event log answered this scrape, else 0.",
        &[(service.clone(), if head.is_ok() { 1.0 } else { 0.0 })],
    );
    if let Ok(head) = head {
        out.gauge(
            "meridian_log_head",
            "The position of the log's last commit.",
            &[(service.clone(), head as f64)],
        );
        if let Ok(lags) = ops.lags(head).await {
            if !lags.is_empty() {
                let with = |name: &str| {
                    let mut l = service.clone();
                    l.push(("projection", name.to_string()));
                    l
                };
                let rows = |f: &dyn Fn(&Lag) -> f64| {
                    lags.iter()
                        .map(|l| (with(l.name), f(l)))
                        .collect::<Vec<_>>()
                };
                out.gauge(
                    "meridian_projection_position",
                    "The last log position a read model applied (the ledger's is the ledger position).",
                    &rows(&|l| l.position as f64),
                );
                out.gauge(
                    "meridian_projection_lag_events",
                    "Commits in the log a read model has not applied yet.",
                    &rows(&|l| l.behind as f64),
                );
                out.gauge(
                    "meridian_projection_lag_seconds",
                    "Age of the oldest commit a read model has not applied yet (0 when caught up).",
                    &rows(&|l| l.seconds),
                );
            }
        }
    }
    for probe in &ops.probes {
        for (name, help, samples) in probe().await {
            let samples: Vec<(Vec<(&str, String)>, f64)> = samples
                .into_iter()
                .map(|(labels, v)| {
                    let mut all = service.clone();
                    all.extend(labels);
                    (all, v)
                })
                .collect();
            out.gauge(name, help, &samples);
        }
    }
    counted::write(&mut out.text, &service);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out.text,
    )
        .into_response()
}

/// Serves `ops` on `listener` until `shutdown` completes.
pub async fn serve(
    ops: Ops,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, service = ops.service, "health and metrics listening");
    }
    axum::serve(listener, ops.router())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Counts by a key, as a probe's samples: `[("state", "running")] → 3`.
pub fn by(label: &'static str, counts: BTreeMap<String, u64>) -> Samples {
    counts
        .into_iter()
        .map(|(k, v)| (vec![(label, k)], v as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_written_in_the_text_format_with_labels_escaped() {
        let mut out = Exposition::default();
        out.gauge(
            "meridian_x",
            "An example.",
            &[
                (vec![("site", "a\"b\\c\nd".to_string())], 2.5),
                (vec![], 1.0),
            ],
        );
        assert_eq!(
            out.text,
            "# HELP meridian_x An example.\n# TYPE meridian_x gauge\nmeridian_x{site=\"a\\\"b\\\\c\\nd\"} 2.5\nmeridian_x 1\n"
        );
    }
}
