//! Aggregates the application reads on every request (the caller's token, its tenant),
//! held for a moment so that a burst of requests reads each once rather than once each.
//!
//! What this process changes through [`App`](crate::App) it forgets at once, so a token it
//! revoked is refused on the next request. A change made by another process holding the
//! same log (another API replica) is seen within [`HOLD`]: the same bound the log's
//! subscriptions give for another process's commits.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a value read from the log is used without reading it again.
pub(crate) const HOLD: Duration = Duration::from_millis(200);

/// Past this many entries, expired ones are dropped; past it again, all are (each
/// request may name a different token id, and ids that do not exist are held too).
const MOST: usize = 4096;

/// Values read from the log, each used for [`HOLD`] after its read began.
pub(crate) struct Held<K, V> {
    inner: Mutex<Inner<K, V>>,
}

struct Inner<K, V> {
    entries: HashMap<K, (Instant, V)>,
    /// Moves on every `forget`; a read notes it when it begins.
    generation: u64,
    /// The generation at which each key was last forgotten: a read of that key begun
    /// before it must not be kept. Other keys' reads are unaffected, so a tenant's
    /// budget reservations do not stop every other tenant from being held.
    forgotten: HashMap<K, u64>,
    /// Reads begun before this generation are not kept (set when `forgotten` is
    /// cleared to bound it).
    floor: u64,
}

/// Where a read began: when, and at which generation.
struct ReadStart {
    at: Instant,
    generation: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> Held<K, V> {
    pub(crate) fn new() -> Held<K, V> {
        Held {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                generation: 0,
                forgotten: HashMap::new(),
                floor: 0,
            }),
        }
    }

    /// The value held for `key`, or `read`'s (held from now on unless `key` is forgotten
    /// while it reads).
    pub(crate) async fn get_or_read<E, F>(&self, key: K, read: F) -> Result<V, E>
    where
        F: std::future::Future<Output = Result<V, E>>,
    {
        let start = match self.get(&key) {
            Ok(value) => return Ok(value),
            Err(start) => start,
        };
        let value = read.await?;
        self.keep(key, value.clone(), start);
        Ok(value)
    }

    /// The value held for `key` if its read began less than [`HOLD`] ago; otherwise
    /// where a new read begins, to give to [`Held::keep`].
    fn get(&self, key: &K) -> Result<V, ReadStart> {
        let inner = self.inner.lock().expect("held values");
        let now = Instant::now();
        match inner.entries.get(key) {
            Some((at, value)) if now.duration_since(*at) < HOLD => Ok(value.clone()),
            _ => Err(ReadStart {
                at: now,
                generation: inner.generation,
            }),
        }
    }

    /// Holds `value`, read from `start`, unless `key` was forgotten meanwhile (the read
    /// may predate that change).
    fn keep(&self, key: K, value: V, start: ReadStart) {
        let mut inner = self.inner.lock().expect("held values");
        let changed = inner
            .forgotten
            .get(&key)
            .is_some_and(|at| *at > start.generation);
        if changed || start.generation < inner.floor {
            return;
        }
        if inner.entries.len() >= MOST {
            let now = Instant::now();
            inner
                .entries
                .retain(|_, (at, _)| now.duration_since(*at) < HOLD);
            if inner.entries.len() >= MOST {
                inner.entries.clear();
            }
        }
        inner.entries.insert(key, (start.at, value));
    }

    /// Drops what is held for `key`, and any read of it begun before now.
    pub(crate) fn forget(&self, key: &K) {
        let mut inner = self.inner.lock().expect("held values");
        inner.entries.remove(key);
        inner.generation += 1;
        let generation = inner.generation;
        if inner.forgotten.len() >= MOST {
            inner.forgotten.clear();
            inner.floor = generation;
        }
        inner.forgotten.insert(key.clone(), generation);
    }

    /// Forgets `key` when dropped: made before a change to it, so that the change is
    /// forgotten even when the request making it is cancelled once it is appended.
    pub(crate) fn forget_after<'a>(&'a self, key: &K) -> ForgetAfter<'a, K, V> {
        ForgetAfter {
            held: self,
            key: key.clone(),
        }
    }
}

/// See [`Held::forget_after`].
pub(crate) struct ForgetAfter<'a, K: Hash + Eq + Clone, V: Clone> {
    held: &'a Held<K, V>,
    key: K,
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for ForgetAfter<'_, K, V> {
    fn drop(&mut self) {
        self.held.forget(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_held_until_forgotten() {
        let held = Held::<u32, &str>::new();
        let start = held.get(&1).expect_err("nothing held yet");
        held.keep(1, "issued", start);
        assert_eq!(held.get(&1).ok(), Some("issued"));
        held.forget(&1);
        assert!(held.get(&1).is_err());
    }

    #[test]
    fn a_read_begun_before_a_change_is_not_kept() {
        let held = Held::<u32, &str>::new();
        let start = held.get(&1).expect_err("nothing held yet");
        // The token is revoked while the read is on its way.
        held.forget(&1);
        held.keep(1, "issued", start);
        assert!(held.get(&1).is_err(), "the stale read was kept");
    }

    #[test]
    fn forgetting_one_key_keeps_reads_of_the_others() {
        let held = Held::<u32, &str>::new();
        let start = held.get(&2).expect_err("nothing held yet");
        held.forget(&1);
        held.keep(2, "other tenant", start);
        assert_eq!(held.get(&2).ok(), Some("other tenant"));
    }

    #[test]
    fn a_change_is_forgotten_when_its_request_is_dropped() {
        let held = Held::<u32, &str>::new();
        let start = held.get(&1).expect_err("nothing held yet");
        held.keep(1, "issued", start);
        {
            let _forget = held.forget_after(&1);
            // The change is appended, then the request is cancelled here.
        }
        assert!(held.get(&1).is_err(), "still held after the change");
    }

    #[test]
    fn a_value_is_read_again_after_the_hold() {
        let held = Held::<u32, &str>::new();
        let start = held.get(&1).expect_err("nothing held yet");
        let old = ReadStart {
            at: start.at - HOLD,
            generation: start.generation,
        };
        held.keep(1, "issued", old);
        assert!(held.get(&1).is_err(), "held past its time");
    }

    #[test]
    fn many_keys_do_not_grow_it_without_bound() {
        let held = Held::<usize, ()>::new();
        for key in 0..3 * MOST {
            let start = held.get(&key).expect_err("a new key");
            held.keep(key, (), start);
            held.forget(&(key + 1));
        }
        let inner = held.inner.lock().unwrap();
        assert!(inner.entries.len() <= MOST && inner.forgotten.len() <= MOST);
    }
}
