//! Helpers every machine's exact-sequence tests share.

use fleetcoord_sm::{Command, EventKind, KeyValue, Machine, Revision, WatchEvent};

/// Every command the machine has queued, in order.
pub fn drain<M: Machine>(m: &mut M) -> Vec<Command<M::Notice>> {
    std::iter::from_fn(|| m.poll_command()).collect()
}

/// A watch event writing `kv`.
pub fn put_event(kv: KeyValue) -> WatchEvent {
    WatchEvent {
        kind: EventKind::Put,
        kv,
        prev_kv: None,
    }
}

/// A watch event deleting `key` at `revision`.
pub fn delete_event(key: Vec<u8>, revision: Revision) -> WatchEvent {
    let kv = KeyValue {
        key,
        mod_revision: revision,
        ..KeyValue::default()
    };
    WatchEvent {
        kind: EventKind::Delete,
        kv,
        prev_kv: None,
    }
}
