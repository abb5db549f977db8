//! Meridian's event vocabulary: the envelope every event travels in, the versioned
//! events of the Workflow, Job, Site, Transfer, Tenant and Token aggregates, and the
//! aggregates' pure decision logic (command → validate against state → events). No I/O
//! here.

pub mod aggregate;
pub mod envelope;
pub mod money;
pub mod vocabulary;

pub use aggregate::Aggregate;
pub use envelope::{
    AggregateKind, AggregateRef, Envelope, EventContext, RawEnvelope, TextEnvelope,
};
pub use money::{
    ComputeOffer, ComputePricing, ComputeRate, Currency, EgressTariff, EgressTier, Money,
    MoneyError, PriceSheet, StorageRate,
};
pub use vocabulary::{
    AggregateEvent, Allocation, ArrayBatch, Event, FailureReason, JobEvent, JobOutcome, SiteEvent,
    SiteKind, TaskRef, TenantEvent, TokenEvent, TransferEvent, WorkflowEvent,
};
