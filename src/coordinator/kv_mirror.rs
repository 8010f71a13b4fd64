//! The bridge between the pure KV-watch mirror (`fleetcoord_sm::mirror`)
//! and a backend's feed: the mirror's notices are [`KvEvent`]s, and
//! [`offer_queued`] is the one loop that offers them to a consumer's feed
//! queue (`feed_queue.rs`) without waiting, putting back the one that did
//! not fit.
//!
//! Every KV watch that is not etcd's (Redis, NATS, memory) keeps one
//! [`KvMirror`] per consumer; its decisions (what to tell after a snapshot,
//! when a gap calls for a resync, how far a slow consumer may fall behind)
//! are the mirror's, stated and fuzzed in `sm/src/mirror.rs`.

use super::KvEvent;
use crate::feed_queue::Offer;
use fleetcoord_sm::mirror::{Mirror, MirrorNotice};

/// A mirror of key → value, the told view of one KV watch.
pub(crate) type KvMirror = Mirror<Vec<u8>>;

/// Offers the mirror's queued notices to `offer` in order until it refuses
/// one; a refused one goes back to the front of the mirror's queue.
/// [`Offer::Taken`] when everything queued went to the consumer,
/// [`Offer::Full`] when its queue filled up (the rest waits in the mirror).
pub(crate) fn offer_queued(
    mirror: &mut KvMirror,
    mut offer: impl FnMut(KvEvent) -> Offer<KvEvent>,
) -> Offer {
    while let Some(notice) = mirror.poll() {
        match offer(event(notice)) {
            Offer::Taken => {}
            Offer::Full(back) => {
                mirror.unpoll(notice_of(back));
                return Offer::Full(());
            }
            Offer::Gone => return Offer::Gone,
        }
    }
    Offer::Taken
}

fn event(notice: MirrorNotice<Vec<u8>>) -> KvEvent {
    match notice {
        MirrorNotice::Put { key, value } => KvEvent::Put { key, value },
        MirrorNotice::Deleted { key } => KvEvent::Deleted { key },
        MirrorNotice::Synced => KvEvent::Synced,
    }
}

fn notice_of(event: KvEvent) -> MirrorNotice<Vec<u8>> {
    match event {
        KvEvent::Put { key, value } => MirrorNotice::Put { key, value },
        KvEvent::Deleted { key } => MirrorNotice::Deleted { key },
        KvEvent::Synced => MirrorNotice::Synced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetcoord_sm::mirror::Order;

    #[test]
    fn a_refused_event_is_the_next_one_handed_over() {
        let mut mirror = KvMirror::new(Order::Contiguous, 8);
        mirror.snapshot(
            1,
            [
                ("a".to_string(), b"1".to_vec()),
                ("b".into(), b"2".to_vec()),
            ],
        );
        let mut got = Vec::new();
        let mut room = 1;
        let handed = offer_queued(&mut mirror, |e| {
            if room == 0 {
                return Offer::Full(e);
            }
            room -= 1;
            got.push(e);
            Offer::Taken
        });
        assert_eq!(handed, Offer::Full(()));
        assert_eq!(mirror.queued(), 2, "b and Synced wait");
        let handed = offer_queued(&mut mirror, |e| {
            got.push(e);
            Offer::Taken
        });
        assert_eq!(handed, Offer::Taken);
        assert_eq!(
            got,
            [
                KvEvent::Put {
                    key: "a".into(),
                    value: b"1".to_vec()
                },
                KvEvent::Put {
                    key: "b".into(),
                    value: b"2".to_vec()
                },
                KvEvent::Synced
            ]
        );
        mirror.snapshot(2, []);
        assert_eq!(offer_queued(&mut mirror, |_| Offer::Gone), Offer::Gone);
    }
}
