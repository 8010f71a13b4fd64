//! What the user of a [`ShardMap`](super::ShardMap) may believe it owns,
//! judged by the calling thread's clock, and the one place its events are
//! sent from.
//!
//! The driver thread reports ownership changes, but a driver starved of
//! CPU reports them late; so, as for an election's `Belief`, a shard is
//! believed while its ownership has not ended (a `Lost`, a hand-back, a
//! refused fence) *and* the session's belief
//! (`fleetcoord_sm::session::SessionBelief`, which keeps the dead-lease
//! rule and belief by the caller's clock) has time left for it, counting
//! its release deadline. A late notice can only make belief end early,
//! never late. Events are sent under the same lock as the state they
//! describe changes, so the order a consumer reads them in is the order
//! beliefs changed in.

use super::events::ShardEvent;
use crossbeam_channel::Sender;
use fleetcoord_sm::session::SessionBelief;
use fleetcoord_sm::shard::member::MemberNotice;
use fleetcoord_sm::shard::ShardNotice;
use fleetcoord_sm::LeaseId;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
struct Held {
    token: i64,
    /// Set by `Release`: ownership ends then at the latest.
    release: Option<Instant>,
}

struct State {
    /// What the session lets the user believe (its local deadline, the
    /// lease it ended beliefs on).
    session: SessionBelief,
    held: BTreeMap<u32, Held>,
    events: Sender<ShardEvent>,
    /// Why etcd refused the session, once it did.
    refused: Option<String>,
    /// The lease of a live process with the same member id, once found.
    duplicate: Option<i64>,
    /// Whether the session's revoke was confirmed, once it stopped.
    revoked: Option<bool>,
}

/// Shared by the member's notice handler (driver thread) and the
/// [`ShardMap`](super::ShardMap) handle (user threads).
pub(crate) struct Beliefs(Mutex<State>);

impl Beliefs {
    pub(crate) fn new(events: Sender<ShardEvent>) -> Self {
        Beliefs(Mutex::new(State {
            session: SessionBelief::new(),
            held: BTreeMap::new(),
            events,
            refused: None,
            duplicate: None,
            revoked: None,
        }))
    }

    /// Applies one notice of the member; `false` once the consumer is
    /// gone (the runner then stops the member, which leaves).
    pub(crate) fn apply(&self, notice: MemberNotice) -> bool {
        let mut s = self.0.lock();
        let event = match notice {
            MemberNotice::Trusted { lease, until } => {
                s.session.trusted(lease, until);
                None
            }
            // The facade's notice handler passes it to the session.
            MemberNotice::SessionRequest(_) => None,
            MemberNotice::SessionLost => {
                s.session.lost();
                None
            }
            MemberNotice::Stopped { revoked } => {
                s.session.lost();
                s.revoked = Some(revoked);
                None
            }
            MemberNotice::Refused(error) => {
                s.refused = Some(error.to_string());
                None
            }
            // A late win on a lease the shared session has lost already:
            // the map hears the loss next and ends it; the user never
            // believes it.
            MemberNotice::Shard(ShardNotice::Acquired { .. }) if !s.session.admits_current() => {
                None
            }
            MemberNotice::Shard(ShardNotice::Acquired { shard, token }) => {
                s.held.insert(
                    shard,
                    Held {
                        token,
                        release: None,
                    },
                );
                Some(ShardEvent::Acquired { shard, token })
            }
            MemberNotice::Shard(ShardNotice::Release { shard, deadline }) => {
                match s.held.get_mut(&shard) {
                    Some(held) => {
                        held.release = Some(deadline);
                        Some(ShardEvent::Release { shard, deadline })
                    }
                    // Its ownership already ended here (a refused fence):
                    // the user was told `Lost`.
                    None => None,
                }
            }
            // Told only for a shard whose ownership has not ended here
            // already (handed back, or a refused fence told `Lost`).
            MemberNotice::Shard(ShardNotice::Lost { shard }) => {
                s.held.remove(&shard).map(|_| ShardEvent::Lost { shard })
            }
            MemberNotice::Shard(ShardNotice::Waiting { holder }) => {
                Some(ShardEvent::Waiting { holder })
            }
            MemberNotice::Shard(ShardNotice::Duplicate { holder }) => {
                s.duplicate = Some(holder);
                Some(ShardEvent::Duplicate { holder })
            }
        };
        match event {
            Some(event) => s.events.send(event).is_ok(),
            None => true,
        }
    }

    /// How long `shard` may still be believed owned with `token`, from
    /// now; `None` when it may not be.
    pub(crate) fn remaining(&self, shard: u32) -> Option<(i64, Duration)> {
        let s = self.0.lock();
        let held = s.held.get(&shard)?;
        s.session
            .left(Instant::now(), held.release)
            .map(|left| (held.token, left))
    }

    /// The session's local deadline as last announced; `None` while no
    /// session is trusted.
    pub(crate) fn trusted_until(&self) -> Option<Instant> {
        self.0.lock().session.until()
    }

    /// Every shard believed owned now, with its token.
    pub(crate) fn owned(&self) -> Vec<(u32, i64)> {
        let shards: Vec<u32> = self.0.lock().held.keys().copied().collect();
        shards
            .into_iter()
            .filter_map(|shard| self.remaining(shard).map(|(token, _)| (shard, token)))
            .collect()
    }

    /// The user handed `shard` back after its `Release`: belief ends now,
    /// before the member deletes the key. `false` when no release of it
    /// was under way (nothing changes then).
    pub(crate) fn hand_back(&self, shard: u32) -> bool {
        let mut s = self.0.lock();
        if s.held.get(&shard).is_some_and(|h| h.release.is_some()) {
            s.held.remove(&shard);
            true
        } else {
            false
        }
    }

    /// etcd refused a fenced transaction on `shard` with `token`: that key
    /// is gone or replaced, so this ownership is over. Tells `Lost` now
    /// (unless it ended meanwhile); the member's own `Lost` for it, when
    /// its view catches up, is then not told again.
    pub(crate) fn fence_refused(&self, shard: u32, token: i64) {
        let mut s = self.0.lock();
        if s.held.get(&shard).is_some_and(|h| h.token == token) {
            s.held.remove(&shard);
            let _ = s.events.send(ShardEvent::Lost { shard });
        }
    }

    /// Every belief ends (the user leaves).
    pub(crate) fn end_all(&self) {
        let mut s = self.0.lock();
        s.held.clear();
        s.session.lost();
    }

    /// The shared session ended every belief on `lease` (for good or not:
    /// its hub's `EndBeliefs`): each owned shard is told `Lost` now (the
    /// map's own `Lost` for it, when it hears the loss, is then not told
    /// again).
    pub(crate) fn end_on_session(&self, lease: Option<LeaseId>, for_good: bool) {
        let mut s = self.0.lock();
        s.session.end(lease, for_good);
        let held = std::mem::take(&mut s.held);
        for shard in held.into_keys() {
            let _ = s.events.send(ShardEvent::Lost { shard });
        }
    }

    /// Whether the session's revoke was confirmed; `None` before it
    /// stopped.
    pub(crate) fn revoked(&self) -> Option<bool> {
        self.0.lock().revoked
    }

    /// Why etcd refused the session, if it did.
    pub(crate) fn refused(&self) -> Option<String> {
        self.0.lock().refused.clone()
    }

    /// The lease of a live process found with the same member id.
    pub(crate) fn duplicate(&self) -> Option<i64> {
        self.0.lock().duplicate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    fn beliefs() -> (Beliefs, crossbeam_channel::Receiver<ShardEvent>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let b = Beliefs::new(tx);
        assert!(b.apply(MemberNotice::Trusted {
            lease: 1,
            until: Instant::now() + LONG
        }));
        (b, rx)
    }

    fn acquire(b: &Beliefs, shard: u32, token: i64) {
        assert!(b.apply(MemberNotice::Shard(ShardNotice::Acquired { shard, token })));
    }

    #[test]
    fn a_refused_fence_ends_belief_and_tells_lost_once() {
        let (b, rx) = beliefs();
        acquire(&b, 3, 10);
        assert_eq!(
            rx.try_recv(),
            Ok(ShardEvent::Acquired {
                shard: 3,
                token: 10
            })
        );
        b.fence_refused(3, 10);
        assert_eq!(
            b.remaining(3),
            None,
            "belief ended before the caller returns"
        );
        assert_eq!(rx.try_recv(), Ok(ShardEvent::Lost { shard: 3 }));
        // The member's own view catches up later: not told again, and a
        // `Release` for it is not told either.
        b.apply(MemberNotice::Shard(ShardNotice::Release {
            shard: 3,
            deadline: Instant::now() + LONG,
        }));
        b.apply(MemberNotice::Shard(ShardNotice::Lost { shard: 3 }));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_refusal_for_an_earlier_ownership_changes_nothing() {
        let (b, rx) = beliefs();
        acquire(&b, 3, 10);
        b.apply(MemberNotice::Shard(ShardNotice::Lost { shard: 3 }));
        acquire(&b, 3, 12);
        let _: Vec<_> = rx.try_iter().collect();
        b.fence_refused(3, 10);
        assert_eq!(b.remaining(3).map(|r| r.0), Some(12));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn belief_ends_at_the_session_deadline_without_any_notice() {
        let (tx, _rx) = crossbeam_channel::unbounded();
        let b = Beliefs::new(tx);
        b.apply(MemberNotice::Trusted {
            lease: 1,
            until: Instant::now() + Duration::from_millis(30),
        });
        acquire(&b, 1, 5);
        assert_eq!(b.owned(), vec![(1, 5)]);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.owned(), vec![], "the caller's clock ends it");
        // A session loss ends it too, whatever the deadline said.
        b.apply(MemberNotice::Trusted {
            lease: 1,
            until: Instant::now() + LONG,
        });
        assert_eq!(b.owned(), vec![(1, 5)]);
        b.apply(MemberNotice::SessionLost);
        assert_eq!(b.owned(), vec![]);
    }

    #[test]
    fn a_release_ends_at_its_deadline_or_at_the_hand_back() {
        let (b, rx) = beliefs();
        acquire(&b, 1, 5);
        acquire(&b, 2, 6);
        assert!(!b.hand_back(1), "no release under way: nothing changes");
        assert_eq!(b.owned(), vec![(1, 5), (2, 6)]);
        b.apply(MemberNotice::Shard(ShardNotice::Release {
            shard: 1,
            deadline: Instant::now() + Duration::from_millis(30),
        }));
        b.apply(MemberNotice::Shard(ShardNotice::Release {
            shard: 2,
            deadline: Instant::now() + LONG,
        }));
        assert!(b.hand_back(2));
        assert_eq!(b.owned(), vec![(1, 5)]);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(b.owned(), vec![], "the release deadline ends it");
        // Told in order: two acquisitions, two releases; no `Lost` for a
        // shard handed back.
        b.apply(MemberNotice::Shard(ShardNotice::Lost { shard: 2 }));
        assert_eq!(rx.try_iter().count(), 4);
    }

    #[test]
    fn a_consumer_gone_stops_the_member() {
        let (b, rx) = beliefs();
        drop(rx);
        assert!(!b.apply(MemberNotice::Shard(ShardNotice::Acquired {
            shard: 0,
            token: 1
        })));
    }
}
