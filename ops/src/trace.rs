//! Traces: one per workflow, across every service that handles it. The trace context
//! travels in each event's envelope (`traceparent`, W3C Trace Context) — and so as the
//! `traceparent` header of every NATS message — and each service that handles an event
//! opens a span whose parent is the span that recorded the event. Spans are exported
//! over OTLP/HTTP (protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, as OpenTelemetry's SDKs do; otherwise
//! spans are only `tracing`'s and cost next to nothing.

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::registry::LookupSpan;

/// The standard variables that turn export on.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Keeps the exporter running; dropping it sends what is still buffered (at most a few
/// seconds' wait), so a process that exits normally loses no span.
pub struct Exporting {
    provider: SdkTracerProvider,
}

impl Drop for Exporting {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "could not send the last spans");
        }
    }
}

/// Why traces cannot be exported as configured.
#[derive(Debug, thiserror::Error)]
#[error("OpenTelemetry export ({variable}): {reason}")]
pub struct ExportError {
    variable: &'static str,
    reason: String,
}

/// The layer that exports this process's spans, when the standard variables ask for
/// it; `service` names the process (`meridian-router`) unless `OTEL_SERVICE_NAME` does.
#[allow(clippy::type_complexity)]
pub fn export_layer<S>(
    service: &str,
) -> Result<
    Option<(
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
        Exporting,
    )>,
    ExportError,
>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let Some(variable) = ENDPOINT_VARIABLES
        .into_iter()
        .find(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
    else {
        return Ok(None);
    };
    // The exporter's blocking HTTP client may speak TLS to a collector; ring is the
    // process's one crypto provider (no aws-lc in the tree).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| ExportError {
            variable,
            reason: e.to_string(),
        })?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service.to_string());
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("meridian");
    Ok(Some((
        tracing_opentelemetry::layer().with_tracer(tracer),
        Exporting { provider },
    )))
}

/// A span for handling something recorded under `traceparent` (an event's envelope, an
/// incoming request's header): a child of that span, in the same trace. `name` is what
/// the span is called in the trace (`place workflow`, `bill`).
pub fn child_of(name: &'static str, traceparent: Option<&str>) -> Span {
    let span = tracing::info_span!(
        "handle",
        otel.name = name,
        meridian.workflow.id = tracing::field::Empty,
        meridian.job.id = tracing::field::Empty,
    );
    if let Some(parent) = traceparent.and_then(parse) {
        let _ = span.set_parent(Context::new().with_remote_span_context(parent));
    }
    span
}

/// Names the workflow a span of [`child_of`] worked for (`meridian.workflow.id`), so a
/// trace can be found by the workflow's id.
pub fn mark_workflow(span: &Span, workflow: uuid::Uuid) {
    span.record("meridian.workflow.id", tracing::field::display(workflow));
}

/// Names the job a span of [`child_of`] worked for (`meridian.job.id`).
pub fn mark_job(span: &Span, job: uuid::Uuid) {
    span.record("meridian.job.id", tracing::field::display(job));
}

/// The trace context to record on events written inside `span`: the span's own when
/// it is traced, else `inherited` (traces off, or the span not sampled), so the chain
/// is never broken.
pub fn traceparent_of(span: &Span, inherited: Option<&str>) -> Option<String> {
    let context = span.context();
    let own = context.span().span_context().clone();
    if own.is_valid() {
        Some(format(&own))
    } else {
        inherited.map(str::to_string)
    }
}

/// [`traceparent_of`] the current span.
pub fn traceparent_now(inherited: Option<&str>) -> Option<String> {
    traceparent_of(&Span::current(), inherited)
}

/// Reads a W3C `traceparent` (version 00): `00-<32 hex trace id>-<16 hex span id>-<2 hex
/// flags>`. All-zero ids are invalid.
pub fn parse(traceparent: &str) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Lower-case hex only, as the W3C recommendation writes it.
    let hex =
        |s: &str, len| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if version != "00" || parts.next().is_some() || !hex(trace, 32) || !hex(span, 16) {
        return None;
    }
    if !hex(flags, 2) {
        return None;
    }
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

fn format(context: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let written = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse(written).expect("valid");
        assert_eq!(
            context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(context.is_sampled());
        assert_eq!(format(&context), written);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn without_an_exporter_the_inherited_context_is_kept() {
        let inherited = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let span = child_of("test", Some(inherited));
        assert_eq!(
            traceparent_of(&span, Some(inherited)).as_deref(),
            Some(inherited)
        );
        assert_eq!(traceparent_of(&span, None), None);
    }
}
