//! How services drive aggregates through the log: load the history, let the pure
//! aggregate decide, append with the expected sequence, and on a conflict (someone else
//! moved the aggregate on) load again and decide again.

use std::sync::Arc;

use chrono::Utc;
use meridian_events::{
    Aggregate, AggregateEvent, AggregateRef, Envelope, Event, EventContext, RawEnvelope,
};
use uuid::Uuid;

use crate::{EncodedCommit, EventLog, LogError};

#[derive(Debug, thiserror::Error)]
pub enum ExecuteError<E: std::error::Error + 'static> {
    /// The aggregate refused the command (an illegal transition): nothing was appended.
    #[error(transparent)]
    Rejected(E),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("event does not decode: {0}")]
    Decode(String),
    #[error("{aggregate} kept changing under {attempts} attempts")]
    Contended {
        aggregate: AggregateRef,
        attempts: u32,
    },
}

/// An aggregate's state as folded from the log, with its last sequence.
pub struct Loaded<A> {
    pub state: A,
    pub sequence: u64,
    pub history: Vec<Envelope<Event>>,
}

/// Decodes raw envelopes into typed events.
pub fn decode_all(raw: Vec<RawEnvelope>) -> Result<Vec<Envelope<Event>>, String> {
    raw.into_iter()
        .map(|e| {
            let (aggregate, sequence) = (e.aggregate, e.sequence);
            e.decode_event()
                .map_err(|err| format!("{aggregate} #{sequence}: {err}"))
        })
        .collect()
}

/// Loads aggregate `id` of kind `A::KIND` from the log.
pub async fn load<A>(log: &dyn EventLog, id: Uuid) -> Result<Loaded<A>, LogError>
where
    A: Aggregate,
    A::Event: AggregateEvent,
{
    let aggregate = AggregateRef::new(A::KIND, id);
    fold(log.read_aggregate(aggregate).await?)
}

/// Folds an aggregate's whole history, already read from the log, as [`load`] does.
pub fn fold<A>(raw: Vec<RawEnvelope>) -> Result<Loaded<A>, LogError>
where
    A: Aggregate,
    A::Event: AggregateEvent,
{
    let history = decode_all(raw).map_err(|message| LogError::Corrupt {
        position: 0,
        message,
    })?;
    Ok(fold_decoded(history))
}

/// Folds an aggregate's whole history, read and decoded already.
pub fn fold_decoded<A>(history: Vec<Envelope<Event>>) -> Loaded<A>
where
    A: Aggregate,
    A::Event: AggregateEvent,
{
    let mut state = A::default();
    for envelope in &history {
        if let Some(event) = A::Event::of(&envelope.payload) {
            state.apply(event);
        }
    }
    let sequence = history.last().map_or(0, |e| e.sequence);
    Loaded {
        state,
        sequence,
        history,
    }
}

/// Runs `command` (built afresh from the current state by `make`, so a retry after a
/// conflict decides against what is really there) and appends what it yields. Returns
/// the appended envelopes (empty when the aggregate decided nothing).
pub async fn execute<A, F>(
    log: &dyn EventLog,
    id: Uuid,
    ctx: &EventContext,
    make: F,
) -> Result<Vec<Envelope<Event>>, ExecuteError<A::Error>>
where
    A: Aggregate,
    A::Event: AggregateEvent,
    A::Error: 'static,
    F: FnMut(&A) -> A::Command,
{
    Cached::<A>::load(log, id)
        .await?
        .execute(log, ctx, make)
        .await
}

/// An aggregate kept in memory by a long-running service, so that each new event costs
/// one `apply` rather than a reload of the whole history. The log stays the authority:
/// a gap in what was observed, or a conflict on append, reloads it.
pub struct Cached<A> {
    pub id: Uuid,
    pub state: A,
    pub sequence: u64,
    /// The tenant of the aggregate's first event.
    pub tenant: Option<String>,
    /// The trace context of the aggregate's first event: the trace its work belongs to.
    pub traceparent: Option<String>,
}

impl<A> Cached<A>
where
    A: Aggregate,
    A::Event: AggregateEvent,
    A::Error: 'static,
{
    pub async fn load(log: &dyn EventLog, id: Uuid) -> Result<Cached<A>, LogError> {
        let loaded = load::<A>(log, id).await?;
        Ok(Cached {
            id,
            tenant: loaded.history.first().map(|e| e.tenant.clone()),
            traceparent: loaded.history.first().and_then(|e| e.traceparent.clone()),
            state: loaded.state,
            sequence: loaded.sequence,
        })
    }

    /// An aggregate with no history yet: for one this process is about to create, or
    /// whose first event it is looking at, so nothing needs reading from the log.
    pub fn fresh(id: Uuid) -> Cached<A> {
        Cached {
            id,
            state: A::default(),
            sequence: 0,
            tenant: None,
            traceparent: None,
        }
    }

    /// Folds in events of this aggregate as they are delivered. Events already folded are
    /// skipped; returns false on a gap (the caller reloads).
    pub fn observe(&mut self, envelope: &Envelope<Event>) -> bool {
        if envelope.sequence <= self.sequence {
            return true;
        }
        if envelope.sequence != self.sequence + 1 {
            return false;
        }
        if let Some(event) = A::Event::of(&envelope.payload) {
            self.state.apply(event);
        }
        self.sequence = envelope.sequence;
        self.tenant.get_or_insert_with(|| envelope.tenant.clone());
        if envelope.sequence == 1 {
            self.traceparent.clone_from(&envelope.traceparent);
        }
        true
    }

    /// What `command` yields against the cached state, as envelopes following its last
    /// sequence and as the commit to append (none when it yields nothing); nothing is
    /// folded in or appended (see [`Cached::fold`]).
    #[allow(clippy::type_complexity)]
    pub fn decide(
        &self,
        ctx: &EventContext,
        command: A::Command,
    ) -> Result<(Arc<Vec<Envelope<Event>>>, Option<EncodedCommit>), ExecuteError<A::Error>> {
        let events = self
            .state
            .handle(command, Utc::now())
            .map_err(ExecuteError::Rejected)?;
        if events.is_empty() {
            return Ok((Arc::default(), None));
        }
        let envelopes = Envelope::sequence_after(
            AggregateRef::new(A::KIND, self.id),
            self.sequence,
            ctx,
            Utc::now(),
            events.into_iter().map(Into::into).collect::<Vec<Event>>(),
        );
        // Written straight from the typed events: no JSON tree in between (the commit
        // shares them, for a log that wants trees too).
        let envelopes = Arc::new(envelopes);
        let commit = EncodedCommit::encode_shared(envelopes.clone())
            .map_err(|e| ExecuteError::Decode(e.to_string()))?;
        Ok((envelopes, Some(commit)))
    }

    /// Folds in envelopes this process decided (before or after appending them).
    pub fn fold(&mut self, envelopes: &[Envelope<Event>]) {
        for e in envelopes {
            self.observe(e);
        }
    }

    /// Decides `make(state)` against the cached state and appends the outcome; on a
    /// conflict reloads and decides again. The appended events are folded in.
    pub async fn execute<F>(
        &mut self,
        log: &dyn EventLog,
        ctx: &EventContext,
        mut make: F,
    ) -> Result<Vec<Envelope<Event>>, ExecuteError<A::Error>>
    where
        F: FnMut(&A) -> A::Command,
    {
        const ATTEMPTS: u32 = 8;
        let aggregate = AggregateRef::new(A::KIND, self.id);
        for _ in 0..ATTEMPTS {
            let (envelopes, Some(commit)) = self.decide(ctx, make(&self.state))? else {
                return Ok(Vec::new());
            };
            match log.append_encoded(commit).await {
                Ok(_) => {
                    self.fold(&envelopes);
                    // Unshared once the log has let go of the commit; a JetStream log
                    // read in this process keeps a share for its readers, and then the
                    // events are copied.
                    return Ok(Arc::try_unwrap(envelopes).unwrap_or_else(|e| (*e).clone()));
                }
                Err(LogError::Conflict { .. }) => {
                    *self = Cached::load(log, self.id).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(ExecuteError::Contended {
            aggregate,
            attempts: ATTEMPTS,
        })
    }
}
