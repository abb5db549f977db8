//! The aggregates' shape (cqrs-es style): a command is validated against the state folded
//! from past events and yields new events, or a typed error. Pure and synchronous: time
//! comes in as an argument, new ids come in with commands, and nothing here does I/O.

use chrono::{DateTime, Utc};

use crate::envelope::AggregateKind;
use crate::vocabulary::Event;

pub mod job;
pub mod site;
pub mod tenant;
pub mod token;
pub mod transfer;
pub mod workflow;

pub use job::{Job, JobCommand, JobError, JobState};
pub use site::{Site, SiteCommand, SiteError};
pub use tenant::{tenant_id, Adjustment, Tenant, TenantCommand, TenantError};
pub use token::{Token, TokenCommand, TokenError};
pub use transfer::{Transfer, TransferCommand, TransferError, TransferState};
pub use workflow::{VolumeAllocation, Workflow, WorkflowCommand, WorkflowError, WorkflowState};

pub trait Aggregate: Default {
    /// Which histories in the log this aggregate folds.
    const KIND: AggregateKind;
    type Command;
    type Event: Clone + Into<Event>;
    type Error: std::error::Error;

    /// Decides what happens. Must not change `self`: the caller appends the events,
    /// and only then are they applied.
    fn handle(
        &self,
        cmd: Self::Command,
        now: DateTime<Utc>,
    ) -> Result<Vec<Self::Event>, Self::Error>;

    /// Folds one past event in. Never fails: what is in the log has happened.
    fn apply(&mut self, event: &Self::Event);

    /// The state after `events`, oldest first.
    fn load<'a, I>(events: I) -> Self
    where
        I: IntoIterator<Item = &'a Self::Event>,
        Self::Event: 'a,
    {
        let mut state = Self::default();
        for event in events {
            state.apply(event);
        }
        state
    }

    /// Handles `cmd` and applies what it yields: for callers that hold the state in
    /// memory and have already made the append durable, and for tests.
    fn execute(
        &mut self,
        cmd: Self::Command,
        now: DateTime<Utc>,
    ) -> Result<Vec<Self::Event>, Self::Error> {
        let events = self.handle(cmd, now)?;
        for event in &events {
            self.apply(event);
        }
        Ok(events)
    }
}

/// Given-events / when-command / then-events, for testing aggregates here and in the
/// services that drive them.
pub mod testing {
    use std::fmt::Debug;

    use chrono::{DateTime, Utc};

    use super::Aggregate;

    pub fn given<A: Aggregate>(events: impl IntoIterator<Item = A::Event>) -> Given<A> {
        let events: Vec<A::Event> = events.into_iter().collect();
        Given {
            state: A::load(&events),
        }
    }

    /// Starts from a state already built, e.g. by an earlier `then`.
    pub fn given_state<A: Aggregate>(state: A) -> Given<A> {
        Given { state }
    }

    pub struct Given<A> {
        state: A,
    }

    impl<A: Aggregate> Given<A> {
        /// The state folded from the given events, for assertions on queries.
        pub fn state(&self) -> &A {
            &self.state
        }

        pub fn when(self, cmd: A::Command, now: DateTime<Utc>) -> Then<A> {
            let result = self.state.handle(cmd, now);
            Then {
                state: self.state,
                result,
            }
        }
    }

    pub struct Then<A: Aggregate> {
        state: A,
        result: Result<Vec<A::Event>, A::Error>,
    }

    impl<A: Aggregate> Then<A>
    where
        A::Event: PartialEq + Debug,
        A::Error: Debug,
    {
        /// Asserts the command yielded exactly `expected`; returns the state with them
        /// applied, for the next step.
        #[track_caller]
        pub fn then(self, expected: Vec<A::Event>) -> A {
            let events = self.then_ok();
            assert_eq!(events.0, expected, "unexpected events");
            events.1
        }

        /// Asserts the command succeeded; returns its events and the state after them.
        #[track_caller]
        pub fn then_ok(self) -> (Vec<A::Event>, A) {
            let mut state = self.state;
            match self.result {
                Ok(events) => {
                    for e in &events {
                        state.apply(e);
                    }
                    (events, state)
                }
                Err(e) => panic!("expected events, got error {e:?}"),
            }
        }

        /// Asserts the command was refused with an error that `matches`.
        #[track_caller]
        pub fn then_err(self, matches: impl FnOnce(&A::Error) -> bool) -> A::Error {
            match self.result {
                Ok(events) => panic!("expected an error, got events {events:?}"),
                Err(e) if matches(&e) => e,
                Err(e) => panic!("unexpected error {e:?}"),
            }
        }
    }
}
