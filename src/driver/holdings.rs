//! [`Holdings`]: the keys this [`crate::Etcd`] handle holds (a leadership,
//! a lock, a permit), so that a watch of the handle *other* than the
//! holder's own can end a holding when it sees the holder's key deleted.
//!
//! Every watch of a handle is its own etcd watch, and etcd orders events
//! within one watch only: an observer, a host watcher or a bus watch on
//! the same prefix can receive the delete of a holder's key before the
//! holder's own watch does. Its consumer would then read "no leader" (or
//! the key gone) while the holder in the same process still believed it
//! led. So each watch, before it hands a response on, shows its events to
//! this registry, which ends every holding those events end (the rule is
//! the machine's: [`fleetcoord_sm::election::ends_holding`]). The holder's
//! own consumer hears of it no later than any other watch's consumer.
//!
//! Guarantees:
//! 1. A holding registered before a watch of the handle delivers the
//!    delete (or re-creation) of its key at a revision after its token is
//!    ended (its `end` runs) before that watch's response reaches its
//!    machine.
//! 2. `end` runs at most once per registration, and never after the
//!    registration was dropped (the holding ended some other way).
//! 3. Cost when nothing is held: one atomic load per watch response; the
//!    registry holds one entry per live registration, no more.
//!
//! `end` runs on the driver thread with the registry locked: it must not
//! block or take a lock that is held while a registration is dropped.

use fleetcoord_sm::election::ends_holding;
use fleetcoord_sm::WatchEvent;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// What ends one holding: called at most once.
type End = Box<dyn FnOnce() + Send>;

struct Entry {
    id: u64,
    token: i64,
    end: Option<End>,
}

/// The holdings of one handle, by key. See the module docs.
#[derive(Default)]
pub(crate) struct Holdings {
    next_id: AtomicU64,
    /// How many registrations are live: the watch's fast path.
    live: AtomicUsize,
    by_key: Mutex<HashMap<Vec<u8>, Vec<Entry>>>,
}

/// One holding in the registry; dropping it takes the holding out.
pub(crate) struct Registration {
    holdings: Weak<Holdings>,
    key: Vec<u8>,
    id: u64,
}

impl Holdings {
    /// Registers the holding of `key` with fencing `token`; `end` runs
    /// when a watch of this handle shows it over, unless the returned
    /// registration was dropped first.
    pub(crate) fn register(
        self: &Arc<Self>,
        key: &[u8],
        token: i64,
        end: impl FnOnce() + Send + 'static,
    ) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.by_key
            .lock()
            .entry(key.to_vec())
            .or_default()
            .push(Entry {
                id,
                token,
                end: Some(Box::new(end)),
            });
        self.live.fetch_add(1, Ordering::SeqCst);
        Registration {
            holdings: Arc::downgrade(self),
            key: key.to_vec(),
            id,
        }
    }

    /// A watch of this handle is about to hand `events` on: end every
    /// holding they end.
    pub(crate) fn saw(&self, events: &[WatchEvent]) {
        if self.live.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut by_key = self.by_key.lock();
        for event in events {
            let Some(entries) = by_key.get_mut(&event.kv.key) else {
                continue;
            };
            for entry in entries.iter_mut() {
                if ends_holding(&event.kv.key, entry.token, event) {
                    if let Some(end) = entry.end.take() {
                        end();
                    }
                }
            }
        }
    }

    fn remove(&self, key: &[u8], id: u64) {
        let mut by_key = self.by_key.lock();
        let Some(entries) = by_key.get_mut(key) else {
            return;
        };
        let before = entries.len();
        entries.retain(|e| e.id != id);
        let removed = before - entries.len();
        if entries.is_empty() {
            by_key.remove(key);
        }
        self.live.fetch_sub(removed, Ordering::SeqCst);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(holdings) = self.holdings.upgrade() {
            holdings.remove(&self.key, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetcoord_sm::{EventKind, KeyValue};
    use std::sync::atomic::AtomicU32;

    fn delete(key: &[u8], revision: i64) -> WatchEvent {
        WatchEvent {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: key.to_vec(),
                mod_revision: revision,
                ..KeyValue::default()
            },
            prev_kv: None,
        }
    }

    fn counter() -> (Arc<AtomicU32>, impl FnOnce() + Send + 'static) {
        let count = Arc::new(AtomicU32::new(0));
        let c = count.clone();
        (count, move || {
            c.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[test]
    fn a_later_delete_ends_the_holding_once() {
        let holdings = Arc::new(Holdings::default());
        let (ended, end) = counter();
        let _held = holdings.register(b"/e/1", 5, end);
        holdings.saw(&[delete(b"/e/2", 9)]);
        assert_eq!(ended.load(Ordering::SeqCst), 0, "another key");
        holdings.saw(&[delete(b"/e/1", 4)]);
        assert_eq!(ended.load(Ordering::SeqCst), 0, "an older incarnation");
        holdings.saw(&[delete(b"/e/1", 9)]);
        holdings.saw(&[delete(b"/e/1", 10)]);
        assert_eq!(ended.load(Ordering::SeqCst), 1, "ended once");
    }

    #[test]
    fn a_dropped_registration_is_never_ended_and_leaves_nothing() {
        let holdings = Arc::new(Holdings::default());
        let (ended, end) = counter();
        let held = holdings.register(b"/e/1", 5, end);
        drop(held);
        holdings.saw(&[delete(b"/e/1", 9)]);
        assert_eq!(ended.load(Ordering::SeqCst), 0);
        assert!(holdings.by_key.lock().is_empty());
        assert_eq!(holdings.live.load(Ordering::SeqCst), 0);
    }
}
