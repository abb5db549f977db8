//! A commit whose events are already written as the JSON the log stores, for writers
//! that decide typed events: encoding a typed event straight to text skips the JSON
//! tree ([`RawEnvelope`]) that [`EventLog::append`](crate::EventLog::append) takes,
//! which the writer would build only for the log to write it out and drop it. In the
//! router that tree (a placement's explanation names every site) was about half of
//! what deciding a workflow cost.
//!
//! A log that hands its readers trees from memory (the SQLite log's tail) still needs
//! them: [`EncodedCommit::encode_shared`] keeps the typed events it was written from,
//! so that those trees are built from them, which costs less than parsing the text.

use std::any::Any;
use std::sync::Arc;

use meridian_events::{AggregateKind, AggregateRef, Envelope, Event, RawEnvelope};
use serde::Serialize;
use uuid::Uuid;

use crate::{check_batch, LogError, MAX_COMMIT_BYTES};

/// The events of one append, each envelope as JSON text; checked as an append is
/// ([`EncodedCommit::encode`]), so a log stores it as it would the same events parsed.
#[derive(Clone)]
pub struct EncodedCommit {
    aggregate: AggregateRef,
    first_sequence: u64,
    ids: Vec<Uuid>,
    /// The first event's trace context: JetStream sends it as a header.
    traceparent: Option<String>,
    events: Vec<String>,
    /// The typed events it was written from, in order, when the writer shared them.
    sources: Option<Vec<Arc<dyn Source>>>,
}

/// Typed events that can be made the log's trees.
trait Source: Send + Sync {
    fn trees(&self) -> Result<Vec<RawEnvelope>, serde_json::Error>;
    /// The events themselves, when they are the log's own vocabulary ([`Event`]).
    fn events(&self) -> Option<&[Envelope<Event>]>;
}

impl<P: Serialize + Send + Sync + 'static> Source for Vec<Envelope<P>> {
    fn trees(&self) -> Result<Vec<RawEnvelope>, serde_json::Error> {
        self.iter().map(Envelope::to_raw).collect()
    }

    fn events(&self) -> Option<&[Envelope<Event>]> {
        (self as &dyn Any)
            .downcast_ref::<Vec<Envelope<Event>>>()
            .map(Vec::as_slice)
    }
}

/// The typed events a commit was written from, kept by the log that publishes it so
/// that its readers on the same connection are handed them rather than decode the
/// commit's text again ([`EncodedCommit::written`]).
#[derive(Clone)]
pub(crate) struct Written {
    pub aggregate: AggregateRef,
    pub last_sequence: u64,
    sources: Vec<Arc<dyn Source>>,
}

impl Written {
    /// The events of `kinds`, as decoding the stored commit would give them.
    pub fn events(&self, kinds: &[AggregateKind]) -> Vec<Envelope<Event>> {
        if !kinds.contains(&self.aggregate.kind) {
            return Vec::new();
        }
        let mut events = Vec::new();
        for source in &self.sources {
            events.extend_from_slice(source.events().expect("checked by written()"));
        }
        events
    }
}

impl std::fmt::Debug for EncodedCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedCommit")
            .field("aggregate", &self.aggregate)
            .field("first_sequence", &self.first_sequence)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// Two commits are equal when they would store the same thing.
impl PartialEq for EncodedCommit {
    fn eq(&self, other: &EncodedCommit) -> bool {
        self.events == other.events
    }
}

impl EncodedCommit {
    /// Checks `events` as an append (one aggregate, sequences without gaps, ids
    /// distinct) and writes each envelope as JSON.
    pub fn encode<P: Serialize>(events: &[Envelope<P>]) -> Result<EncodedCommit, LogError> {
        let (aggregate, expected) = check_batch(events)?;
        let texts = events
            .iter()
            .map(serde_json::to_string)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LogError::InvalidAppend(e.to_string()))?;
        Ok(EncodedCommit {
            aggregate,
            first_sequence: expected + 1,
            ids: events.iter().map(|e| e.event_id).collect(),
            traceparent: events[0].traceparent.clone(),
            events: texts,
            sources: None,
        })
    }

    /// [`EncodedCommit::encode`], keeping `events` for a log that also wants them as
    /// trees ([`EncodedCommit::decode`]).
    pub fn encode_shared<P: Serialize + Send + Sync + 'static>(
        events: Arc<Vec<Envelope<P>>>,
    ) -> Result<EncodedCommit, LogError> {
        let mut commit = EncodedCommit::encode(&events)?;
        commit.sources = Some(vec![events]);
        Ok(commit)
    }

    pub fn aggregate(&self) -> AggregateRef {
        self.aggregate
    }

    /// The sequence the aggregate must have for this commit to be appended.
    pub fn expected(&self) -> u64 {
        self.first_sequence - 1
    }

    /// The aggregate's sequence once this commit is stored.
    pub fn last_sequence(&self) -> u64 {
        self.expected() + self.events.len() as u64
    }

    pub fn first_id(&self) -> Uuid {
        self.ids[0]
    }

    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// Each envelope's JSON, in sequence order.
    pub fn texts(&self) -> &[String] {
        &self.events
    }

    /// Each envelope's JSON, given up.
    pub fn into_texts(self) -> Vec<String> {
        self.events
    }

    /// How many events it holds (at least one).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Never true: [`EncodedCommit::encode`] refuses an empty commit.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Its size as one JSON array of envelopes: what both logs measure against
    /// [`MAX_COMMIT_BYTES`].
    pub fn size(&self) -> usize {
        self.events.iter().map(String::len).sum::<usize>() + self.events.len() + 1
    }

    /// Refuses a commit over [`MAX_COMMIT_BYTES`], as both logs do.
    pub fn fits(&self) -> Result<(), LogError> {
        let size = self.size();
        if size > MAX_COMMIT_BYTES {
            return Err(LogError::TooLarge {
                size,
                limit: MAX_COMMIT_BYTES,
            });
        }
        Ok(())
    }

    /// The events as one JSON array: a JetStream message's payload.
    pub fn to_array(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size());
        out.push(b'[');
        for (i, text) in self.events.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(text.as_bytes());
        }
        out.push(b']');
        out
    }

    /// The typed events this commit was written from, when the writer shared them
    /// ([`EncodedCommit::encode_shared`]) and they are [`Event`]s.
    pub(crate) fn written(&self) -> Option<Written> {
        let sources = self.sources.as_ref()?;
        if !sources.iter().all(|s| s.events().is_some()) {
            return None;
        }
        Some(Written {
            aggregate: self.aggregate,
            last_sequence: self.last_sequence(),
            sources: sources.clone(),
        })
    }

    /// The events as trees, as [`EventLog::append`](crate::EventLog::append) takes
    /// them: made from the typed events where the writer shared them, else parsed.
    pub fn decode(&self) -> Result<Vec<RawEnvelope>, LogError> {
        let trees = match &self.sources {
            Some(sources) => sources.iter().try_fold(Vec::new(), |mut all, source| {
                all.extend(source.trees()?);
                Ok(all)
            }),
            None => self
                .events
                .iter()
                .map(|text| serde_json::from_str(text))
                .collect(),
        };
        trees.map_err(|e: serde_json::Error| LogError::InvalidAppend(e.to_string()))
    }

    /// Takes `next` in when it continues this commit's aggregate, its ids are new to
    /// it, and both fit in one append ([`MAX_COMMIT_BYTES`]); otherwise hands it back.
    /// The joined commit is stored or refused whole.
    pub fn join(&mut self, next: EncodedCommit) -> Option<EncodedCommit> {
        let continues =
            next.aggregate == self.aggregate && next.first_sequence == self.last_sequence() + 1;
        let fits = self.size() + next.size() - 1 <= MAX_COMMIT_BYTES;
        if !continues || !fits || next.ids.iter().any(|id| self.ids.contains(id)) {
            return Some(next);
        }
        self.ids.extend(next.ids);
        self.events.extend(next.events);
        self.sources = match (self.sources.take(), next.sources) {
            (Some(mut mine), Some(theirs)) => {
                mine.extend(theirs);
                Some(mine)
            }
            // Trees for part of it only: all are parsed.
            _ => None,
        };
        None
    }
}

#[cfg(test)]
mod tests {
    use meridian_events::{AggregateKind, EventContext};
    use serde_json::json;

    use super::*;

    fn events(id: Uuid, after: u64, n: usize, bytes: usize) -> Vec<RawEnvelope> {
        let ctx = EventContext::new_chain("t");
        let payloads = (0..n).map(|_| json!({"type": "test.v1", "pad": "x".repeat(bytes)}));
        // A fixed time: a commit's size then depends on `bytes` alone.
        let at = chrono::DateTime::from_timestamp(1_790_000_000, 0).unwrap();
        Envelope::sequence_after(
            AggregateRef::new(AggregateKind::Workflow, id),
            after,
            &ctx,
            at,
            payloads.collect(),
        )
    }

    #[test]
    fn an_encoded_commit_is_the_json_array_of_its_envelopes() {
        let raw = events(Uuid::now_v7(), 2, 3, 10);
        let commit = EncodedCommit::encode(&raw).unwrap();
        assert_eq!(commit.expected(), 2);
        assert_eq!(commit.last_sequence(), 5);
        assert_eq!(commit.first_id(), raw[0].event_id);
        let array = commit.to_array();
        assert_eq!(array, serde_json::to_vec(&raw).unwrap());
        assert_eq!(commit.size(), array.len());
        assert_eq!(commit.decode().unwrap(), raw);
    }

    /// Typed events, as a service decides them: a cancel request by each of `by`.
    fn typed(id: Uuid, after: u64, by: &[&str]) -> Vec<Envelope<meridian_events::Event>> {
        use meridian_events::vocabulary::workflow::WorkflowEvent;
        let events = by.iter().map(|by| {
            WorkflowEvent::CancelRequested {
                by: by.to_string(),
                reason: Some("é ✓ \"quoted\"".into()),
                requested_at: chrono::Utc::now(),
            }
            .into()
        });
        Envelope::sequence_after(
            AggregateRef::new(AggregateKind::Workflow, id),
            after,
            &EventContext::new_chain("t"),
            chrono::Utc::now(),
            events.collect(),
        )
    }

    #[test]
    fn a_shared_commit_decodes_from_its_typed_events_as_the_text_would() {
        let id = Uuid::now_v7();
        let (a, b) = (typed(id, 0, &["a"]), typed(id, 1, &["b", "c"]));
        let mut shared = EncodedCommit::encode_shared(Arc::new(a.clone())).unwrap();
        assert!(shared
            .join(EncodedCommit::encode_shared(Arc::new(b.clone())).unwrap())
            .is_none());
        let mut plain = EncodedCommit::encode(&a).unwrap();
        assert!(plain.join(EncodedCommit::encode(&b).unwrap()).is_none());
        assert_eq!(shared, plain, "the same text");
        // Built from the typed events, and parsed from the text: the same trees.
        let trees = shared.decode().unwrap();
        assert!(shared.sources.is_some() && plain.sources.is_none());
        assert_eq!(trees, plain.decode().unwrap());
        let raw: Vec<RawEnvelope> = [a, b]
            .concat()
            .iter()
            .map(|e| e.to_raw().unwrap())
            .collect();
        assert_eq!(trees, raw);
        // Joined with a commit that shares nothing: every tree is parsed.
        let mut mixed = EncodedCommit::encode_shared(Arc::new(typed(id, 0, &["a"]))).unwrap();
        assert!(mixed
            .join(EncodedCommit::encode(&typed(id, 1, &["b"])).unwrap())
            .is_none());
        assert!(mixed.sources.is_none());
        assert_eq!(mixed.decode().unwrap().len(), 2);
    }

    #[test]
    fn encoding_refuses_what_an_append_refuses() {
        let mut gap = events(Uuid::now_v7(), 0, 2, 1);
        gap[1].sequence = 3;
        assert!(matches!(
            EncodedCommit::encode(&gap),
            Err(LogError::InvalidAppend(m)) if m.contains("without gaps")
        ));
        assert!(matches!(
            EncodedCommit::encode::<serde_json::Value>(&[]),
            Err(LogError::InvalidAppend(_))
        ));
    }

    #[test]
    fn commits_join_only_when_they_continue_and_fit() {
        let id = Uuid::now_v7();
        let mut first = EncodedCommit::encode(&events(id, 0, 1, 10)).unwrap();
        // Another aggregate, or a gap: handed back.
        let other = EncodedCommit::encode(&events(Uuid::now_v7(), 1, 1, 10)).unwrap();
        assert_eq!(first.join(other.clone()), Some(other));
        let gap = EncodedCommit::encode(&events(id, 2, 1, 10)).unwrap();
        assert_eq!(first.join(gap.clone()), Some(gap));
        // The next sequence: joined, and the array is both commits' events.
        let second = events(id, 1, 2, 10);
        assert_eq!(first.join(EncodedCommit::encode(&second).unwrap()), None);
        assert_eq!(first.len(), 3);
        assert_eq!(first.decode().unwrap()[1..], second[..]);
        assert_eq!(first.size(), first.to_array().len());
        // Too large together by one byte: handed back, and the first is unchanged; at
        // the limit exactly: joined.
        let bare = EncodedCommit::encode(&events(id, 3, 1, 0)).unwrap().size();
        let pad = MAX_COMMIT_BYTES + 1 - first.size() - bare;
        let over = EncodedCommit::encode(&events(id, 3, 1, pad + 1)).unwrap();
        assert_eq!(first.size() + over.size() - 1, MAX_COMMIT_BYTES + 1);
        assert_eq!(first.join(over.clone()), Some(over));
        assert_eq!(first.len(), 3);
        let exact = EncodedCommit::encode(&events(id, 3, 1, pad)).unwrap();
        assert_eq!(first.join(exact), None);
        assert_eq!(first.size(), MAX_COMMIT_BYTES);
        assert_eq!(first.to_array().len(), MAX_COMMIT_BYTES);
    }
}
