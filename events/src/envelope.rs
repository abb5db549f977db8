//! The envelope every event travels in: who it is about, where it sits in its
//! aggregate's history, when it happened, and what caused it.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The kinds of aggregate whose histories make up the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AggregateKind {
    Workflow,
    Job,
    Site,
    Transfer,
    Tenant,
    Token,
}

impl AggregateKind {
    pub const ALL: [AggregateKind; 6] = [
        AggregateKind::Workflow,
        AggregateKind::Job,
        AggregateKind::Site,
        AggregateKind::Transfer,
        AggregateKind::Tenant,
        AggregateKind::Token,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AggregateKind::Workflow => "workflow",
            AggregateKind::Job => "job",
            AggregateKind::Site => "site",
            AggregateKind::Transfer => "transfer",
            AggregateKind::Tenant => "tenant",
            AggregateKind::Token => "token",
        }
    }

    pub fn parse(s: &str) -> Option<AggregateKind> {
        AggregateKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for AggregateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One aggregate instance: its kind and its UUIDv7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AggregateRef {
    pub kind: AggregateKind,
    pub id: Uuid,
}

impl AggregateRef {
    pub fn new(kind: AggregateKind, id: Uuid) -> Self {
        AggregateRef { kind, id }
    }
}

impl fmt::Display for AggregateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.id)
    }
}

/// The metadata around one event. `P` is the payload: a typed [`crate::Event`] inside
/// services, or raw JSON inside the log, which never needs to understand payloads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<P> {
    /// UUIDv7; also the idempotency key of the append.
    pub event_id: Uuid,
    pub aggregate: AggregateRef,
    /// 1-based position within the aggregate's own history.
    pub sequence: u64,
    pub occurred_at: DateTime<Utc>,
    pub tenant: String,
    /// The event (or command id) that directly caused this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<Uuid>,
    /// Shared by everything that stems from one submission.
    pub correlation_id: Uuid,
    /// W3C trace context, so one trace follows a workflow across services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    pub payload: P,
}

/// An envelope whose payload is kept as JSON: what the log stores and returns.
pub type RawEnvelope = Envelope<serde_json::Value>;

/// Where an event sits within its aggregate and its causal chain; everything of the
/// envelope except the payload and the event's own id.
#[derive(Debug, Clone, PartialEq)]
pub struct EventContext {
    pub tenant: String,
    pub causation_id: Option<Uuid>,
    pub correlation_id: Uuid,
    pub traceparent: Option<String>,
}

impl EventContext {
    /// A fresh context for a new chain of events (a submission, an admin action).
    pub fn new_chain(tenant: impl Into<String>) -> Self {
        EventContext {
            tenant: tenant.into(),
            causation_id: None,
            correlation_id: Uuid::now_v7(),
            traceparent: None,
        }
    }

    /// The context for events caused by `cause`: same tenant, correlation and trace.
    pub fn caused_by<P>(cause: &Envelope<P>) -> Self {
        EventContext {
            tenant: cause.tenant.clone(),
            causation_id: Some(cause.event_id),
            correlation_id: cause.correlation_id,
            traceparent: cause.traceparent.clone(),
        }
    }
}

impl<P> Envelope<P> {
    /// Wraps `payloads` as the next events of `aggregate`, whose last stored sequence is
    /// `last_sequence`. Each gets a new UUIDv7 and the same `occurred_at`.
    pub fn sequence_after(
        aggregate: AggregateRef,
        last_sequence: u64,
        ctx: &EventContext,
        occurred_at: DateTime<Utc>,
        payloads: Vec<P>,
    ) -> Vec<Envelope<P>> {
        payloads
            .into_iter()
            .enumerate()
            .map(|(i, payload)| Envelope {
                event_id: Uuid::now_v7(),
                aggregate,
                sequence: last_sequence + 1 + i as u64,
                occurred_at,
                tenant: ctx.tenant.clone(),
                causation_id: ctx.causation_id,
                correlation_id: ctx.correlation_id,
                traceparent: ctx.traceparent.clone(),
                payload,
            })
            .collect()
    }

    /// A copy of its header around another payload.
    pub fn with_payload<Q>(&self, payload: Q) -> Envelope<Q> {
        Envelope {
            event_id: self.event_id,
            aggregate: self.aggregate,
            sequence: self.sequence,
            occurred_at: self.occurred_at,
            tenant: self.tenant.clone(),
            causation_id: self.causation_id,
            correlation_id: self.correlation_id,
            traceparent: self.traceparent.clone(),
            payload,
        }
    }

    pub fn map_payload<Q>(self, f: impl FnOnce(P) -> Q) -> Envelope<Q> {
        Envelope {
            event_id: self.event_id,
            aggregate: self.aggregate,
            sequence: self.sequence,
            occurred_at: self.occurred_at,
            tenant: self.tenant,
            causation_id: self.causation_id,
            correlation_id: self.correlation_id,
            traceparent: self.traceparent,
            payload: f(self.payload),
        }
    }

    pub fn try_map_payload<Q, E>(
        self,
        f: impl FnOnce(P) -> Result<Q, E>,
    ) -> Result<Envelope<Q>, E> {
        let Envelope {
            event_id,
            aggregate,
            sequence,
            occurred_at,
            tenant,
            causation_id,
            correlation_id,
            traceparent,
            payload,
        } = self;
        Ok(Envelope {
            event_id,
            aggregate,
            sequence,
            occurred_at,
            tenant,
            causation_id,
            correlation_id,
            traceparent,
            payload: f(payload)?,
        })
    }
}

impl<P: Serialize> Envelope<P> {
    /// The same envelope with its payload as JSON, ready for the log.
    pub fn to_raw(&self) -> Result<RawEnvelope, serde_json::Error> {
        Ok(self.with_payload(serde_json::to_value(&self.payload)?))
    }
}

impl RawEnvelope {
    /// Reads the payload as a typed event.
    pub fn decode<P: serde::de::DeserializeOwned>(self) -> Result<Envelope<P>, serde_json::Error> {
        self.try_map_payload(serde_json::from_value)
    }

    /// Reads the payload as an [`Event`](crate::Event): what `decode::<Event>()` gives,
    /// read in place ([`Event::from_payload`](crate::Event::from_payload)), so that the
    /// readers of one commit can share it.
    pub fn decode_event(&self) -> Result<Envelope<crate::Event>, serde_json::Error> {
        Ok(self.with_payload(crate::Event::from_payload(&self.payload)?))
    }
}

/// An envelope read from the log's text with its payload left as text, and the
/// payload's type: for a reader that decodes few of the events it reads (a start's
/// fold of the log), so that the rest are only scanned, never built as JSON trees.
#[derive(Debug, Clone)]
pub struct TextEnvelope<'a> {
    /// The whole envelope's JSON, as read.
    pub text: &'a str,
    pub envelope: Envelope<&'a serde_json::value::RawValue>,
    /// The payload's versioned type, as `"workflow.submitted.v1"`; empty when the
    /// payload names none (it then decodes as no event).
    pub kind: std::borrow::Cow<'a, str>,
}

impl<'a> TextEnvelope<'a> {
    /// Reads one envelope's JSON, as the log stores it.
    pub fn parse(text: &'a str) -> Result<TextEnvelope<'a>, serde_json::Error> {
        let envelope: Envelope<&serde_json::value::RawValue> = serde_json::from_str(text)?;
        let kind = crate::Event::type_of_json(envelope.payload.get()).unwrap_or_default();
        Ok(TextEnvelope {
            text,
            envelope,
            kind,
        })
    }

    /// The payload as an [`Event`](crate::Event), decoded from its text.
    pub fn decode_event(&self) -> Result<Envelope<crate::Event>, serde_json::Error> {
        let payload = self.envelope.payload.get();
        if self.kind.is_empty() {
            // Say what is wrong with the type, not that "" is unknown.
            crate::Event::type_of_json(payload)?;
        }
        let event = crate::Event::from_json(&self.kind, payload)?;
        Ok(self.envelope.with_payload(event))
    }
}
