//! [`Leadership`]: proof of leadership, its fence and its hand-over.

use super::belief::Belief;
use super::ops::Outcome;
use super::{election_error, Inner};
use crate::error::{Error, Result};
use crate::txn::{TxnOp, TxnOpResponse};
use crate::validate;
use fleetcoord_sm::election::{
    fenced_txn, hand_over_request_key, ElectionError, ElectionInput, ElectionNotice,
};
use fleetcoord_sm::Response;
use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use super::Election;
#[cfg(doc)]
use crate::etcd::Etcd;
#[cfg(doc)]
use crate::LeaderObserver;

/// Proof of leadership, returned by a successful campaign.
///
/// [`Leadership::lost`] fires (and [`Leadership::is_held`] turns false)
/// when leadership ends without a resign, at the first evidence: the
/// session's local deadline passed, a renewal was answered "lease not
/// found", the election's watch showed the candidate key deleted (or any
/// other watch of the same [`Etcd`] handle did: a [`LeaderObserver`]
/// reporting the leader gone finds this already over), or etcd refused a
/// [`Leadership::txn_if_leader`] (then before that call returns). etcd can revoke a lease before its TTL (see the README's
/// guarantees), so belief is bounded by that evidence; exclusivity of
/// effects comes from the fence, which holds whatever this process
/// believes.
///
/// **Dropping** a `Leadership` resigns without waiting: `is_held` turns
/// false, the resign is handed to the driver and `drop` returns at once,
/// also when etcd is unreachable. If the resign cannot be done, the key
/// goes with the session's lease after its TTL. A campaign started right
/// after the drop waits until the old key is deleted. Closing or dropping
/// the [`Etcd`] handle still lets a pending resign finish within its grace
/// period, so a process that drops its guards and exits hands over at once.
/// [`Leadership::resign`] is the blocking call that reports the outcome.
///
/// Discarding it by mistake is a compile-time warning (`#[must_use]`), an
/// error under `#![deny(unused_must_use)]`:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// fn lead(election: &fleetcoord::Election) -> fleetcoord::Result<()> {
///     election.campaign(b"me")?; // would resign at once
///     Ok(())
/// }
/// ```
///
/// while keeping it compiles:
///
/// ```no_run
/// #![deny(unused_must_use)]
/// fn lead(election: &fleetcoord::Election) -> fleetcoord::Result<()> {
///     let _leadership = election.campaign(b"me")?;
///     Ok(())
/// }
/// ```
#[must_use = "dropping a Leadership resigns at once; keep it for as long as you lead"]
pub struct Leadership {
    pub(super) inner: Arc<Inner>,
    pub(super) won: Won,
    pub(super) token: i64,
    pub(super) lease: i64,
    pub(super) key: String,
    pub(super) belief: Arc<Belief>,
    pub(super) lost: crossbeam_channel::Receiver<()>,
    pub(super) step_down: crossbeam_channel::Receiver<()>,
    pub(super) resigned: bool,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish()
    }
}

/// How a leadership was won, for [`Leadership::waited`] and
/// [`Leadership::contended`] and the wait metrics.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Won {
    pub(super) waited: Duration,
    pub(super) contended: bool,
    pub(super) attempts: u32,
}

impl Leadership {
    /// How long the campaign that won this leadership took: from the call
    /// that started it (`campaign*`, `start_campaign`, `lock*`,
    /// `acquire*`) to the win, by the calling process's clock. With the
    /// `metrics` feature it is also recorded in
    /// `fleetcoord_wait_seconds` ([`crate::metrics`]).
    pub fn waited(&self) -> Duration {
        self.won.waited
    }

    /// Whether that campaign found another candidate (a leader, a holder
    /// of a lock or permit) ahead of it and waited for it to go, rather
    /// than winning on its first look at the queue: contention, counted
    /// in `fleetcoord_contended_total`.
    pub fn contended(&self) -> bool {
        self.won.contended
    }

    /// How often the campaign that won this leadership joined the queue:
    /// 1, plus one for each time it started over (its session's lease was
    /// lost while it waited, or its key vanished before it led). Counted
    /// by the election machine; with [`Leadership::waited`], how hard the
    /// win was to get.
    pub fn attempts(&self) -> u32 {
        self.won.attempts
    }

    /// The fencing token: the candidate key's create revision. Strictly
    /// greater than every earlier leader's token of this election. Pass it
    /// along with writes so stale leaders can be refused.
    pub fn fencing_token(&self) -> i64 {
        self.token
    }

    /// The candidate key (`<prefix><name>/<lease hex>`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The session lease the key is bound to.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Whether this candidate may still act as leader: it has not resigned
    /// or lost, and the calling thread's clock is before the session's
    /// local deadline as of its last answered renewal (which comes before
    /// etcd can let the lease expire). Judged by the caller's clock, it
    /// turns false on time even when the driver thread is starved or late
    /// to report the loss.
    pub fn is_held(&self) -> bool {
        self.belief.holds()
    }

    /// Receives `()` once if leadership is lost (not on resign).
    pub fn lost(&self) -> &crossbeam_channel::Receiver<()> {
        &self.lost
    }

    /// Receives `()` once when a ranked candidate with a higher priority
    /// than this leader's waits (only for elections joined with
    /// [`ElectionOptions::with_priority`] or
    /// [`ElectionOptions::with_yield_to_higher`]; never fires otherwise).
    /// With `with_yield_to_higher(true)` the leadership has already ended
    /// when it fires ([`Leadership::lost`] fires too); otherwise stepping
    /// down is the holder's choice: [`Leadership::resign`] or
    /// [`Leadership::hand_over`].
    ///
    /// [`ElectionOptions::with_priority`]: crate::ElectionOptions::with_priority
    /// [`ElectionOptions::with_yield_to_higher`]: crate::ElectionOptions::with_yield_to_higher
    pub fn step_down_requested(&self) -> &crossbeam_channel::Receiver<()> {
        &self.step_down
    }

    /// Make the waiting candidate named by `to` (its candidate key, or the
    /// value it campaigned with; the first in line if several match) lead
    /// next, and end this leadership. One read of the queue, then one
    /// transaction guarded by this leadership's token, by the target's
    /// create revision and by every key ahead of it: it deletes this
    /// leader's key and the keys of the candidates ahead of the target,
    /// which join the queue again at the back (behind the target, so the
    /// others keep waiting and get their turn). The target leads about
    /// two round trips after the call.
    ///
    /// [`Leadership::is_held`] turns false when the call starts, before
    /// anything is deleted, so there is no overlap with the target; it
    /// turns true again if the hand-over fails with the leadership kept:
    /// * no waiting candidate matches `to`, or it left meanwhile →
    ///   [`Error::InvalidArgument`] (`what` = `"to"`), nothing deleted;
    /// * a candidate ahead of the target joined without a priority (it
    ///   may be a Go or `etcdctl` client, which would not notice losing
    ///   its place) → [`Error::InvalidArgument`], nothing deleted;
    /// * this leadership is over → [`Error::NotLeader`]; if it ended while
    ///   the hand-over ran, [`Leadership::lost`] has fired before this
    ///   returns.
    ///
    /// After `Ok(())` this handle is spent: `is_held` is false and drop
    /// does nothing. No answer within three request timeouts →
    /// [`Error::Timeout`], and the leadership is resigned (its outcome was
    /// unknown; it is not believed again).
    pub fn hand_over(&self, to: impl AsRef<[u8]>) -> Result<()> {
        crate::blocking::check()?;
        let to = to.as_ref().to_vec();
        if to.is_empty() {
            return Err(Error::invalid("to", "must not be empty"));
        }
        validate::payload("to", &to)?;
        if !self.is_held() {
            return Err(Error::NotLeader);
        }
        let turn = self.inner.ops.turn();
        if !self.is_current() {
            return Err(Error::NotLeader);
        }
        // Before the machine can send the delete: no belief overlaps the
        // target's.
        self.belief.pause();
        let bound = self.inner.etcd.options().request_timeout.saturating_mul(3);
        let token = self.token;
        let outcome = self.inner.call(
            &turn,
            |op| ElectionInput::HandOver { op, token, to },
            Some(bound),
            |notice| match notice {
                ElectionNotice::HandedOver { .. } => Some(Ok(())),
                ElectionNotice::HandOverFailed { error, .. } => Some(Err(error)),
                _ => None,
            },
        );
        match outcome {
            Ok(Outcome::Answered(Ok(()))) => {
                self.belief.end();
                Ok(())
            }
            Ok(Outcome::Answered(Err(ElectionError::NotLeader))) => {
                self.belief.end();
                Err(Error::NotLeader)
            }
            Ok(Outcome::Answered(Err(error))) => {
                self.belief.resume();
                Err(election_error(error).with_endpoints(self.inner.etcd.endpoints()))
            }
            Ok(Outcome::TimedOut { .. }) => {
                self.belief.end();
                let _ = self
                    .inner
                    .ops
                    .machine()
                    .send(ElectionInput::Resign { token });
                Err(Error::Timeout(bound))
            }
            Err(e) => {
                self.belief.end();
                Err(e)
            }
        }
    }

    /// The candidate an operator asked this leader to hand over to
    /// ([`Election::request_hand_over`]), read fenced: `Ok(None)` when
    /// nobody asked, or when this leadership is over. One etcd read per
    /// call; the caller decides how often to ask.
    pub fn hand_over_requested(&self) -> Result<Option<Vec<u8>>> {
        crate::blocking::check()?;
        let key = hand_over_request_key(self.inner.prefix.as_bytes());
        let Some(responses) = self.txn_if_leader([TxnOp::get(key)])? else {
            return Ok(None);
        };
        Ok(responses.into_iter().find_map(|r| match r {
            TxnOpResponse::Get { kvs } => kvs.into_iter().next().map(|kv| kv.value),
            _ => None,
        }))
    }

    /// Remove the hand-over request this leader acted on (done or
    /// failed), so that it is not acted on again; fenced like every
    /// leader's write.
    pub fn clear_hand_over_request(&self) -> Result<()> {
        crate::blocking::check()?;
        let key = hand_over_request_key(self.inner.prefix.as_bytes());
        self.txn_if_leader([TxnOp::delete(key)])?;
        Ok(())
    }

    /// Refuse the hand-over request this leader read, saying why: in one
    /// fenced transaction, remove the request (as
    /// [`Leadership::clear_hand_over_request`]) and record `reason`
    /// (typically the error of a failed [`Leadership::hand_over`]) where
    /// [`Election::hand_over_refusal`] reads it, on this session's lease.
    /// The operator who asked then learns at once why, instead of waiting
    /// for a leader that will not change. Does nothing once this
    /// leadership is over.
    pub fn refuse_hand_over(&self, reason: &str) -> Result<()> {
        crate::blocking::check()?;
        validate::payload("reason", reason.as_bytes())?;
        let prefix = self.inner.prefix.as_bytes();
        self.txn_if_leader([
            TxnOp::delete(hand_over_request_key(prefix)),
            TxnOp::put_with_lease(
                fleetcoord_sm::election::hand_over_refusal_key(prefix),
                reason,
                self.lease(),
            ),
        ])?;
        Ok(())
    }

    /// Replace the leader's value (what [`Election::leader`] and observers
    /// see). Fails with [`Error::NotLeader`] when leadership is gone.
    pub fn proclaim(&self, value: &[u8]) -> Result<()> {
        crate::blocking::check()?;
        validate::payload("value", value)?;
        if !self.is_held() {
            return Err(Error::NotLeader);
        }
        let turn = self.inner.ops.turn();
        let value = value.to_vec();
        // One guarded put, retried by the machine while the session holds;
        // bounded so a dead etcd cannot block the caller (and every other
        // operation on this election) forever.
        let bound = self.inner.etcd.options().request_timeout.saturating_mul(3);
        // Only this proclaim's answer arrives here: a late answer to an
        // earlier proclaim that timed out names that one.
        let outcome = self.inner.call(
            &turn,
            |op| ElectionInput::Proclaim { op, value },
            Some(bound),
            |notice| match notice {
                ElectionNotice::Proclaimed { .. } => Some(Ok(())),
                ElectionNotice::ProclaimFailed { error, .. } => Some(Err(
                    election_error(error).with_endpoints(self.inner.etcd.endpoints())
                )),
                _ => None,
            },
        )?;
        match outcome {
            Outcome::Answered(answer) => answer,
            Outcome::TimedOut { .. } => Err(Error::Timeout(bound)),
        }
    }

    /// Run `ops` in one etcd transaction only if this leadership is still
    /// current in etcd: the transaction is guarded on the candidate key
    /// still having this fencing token as its create revision. This is the
    /// fence: a deposed leader's write is refused by etcd itself, whatever
    /// the deposed process believes (even while [`Leadership::is_held`]
    /// still says true, e.g. right after a long pause).
    ///
    /// Returns `Ok(Some(responses))` when the ops ran, one
    /// [`TxnOpResponse`] per op in the order given, all applied atomically;
    /// `Ok(None)` when this leadership is over and nothing was applied:
    /// * etcd refused the transaction: the key with this token is gone.
    ///   That is evidence the leadership ended (etcd may revoke a lease
    ///   early, see the README's guarantees), so the leadership ends before
    ///   this call returns: [`Leadership::is_held`] is false and
    ///   [`Leadership::lost`] has fired, even if the election's own watch
    ///   has not shown the delete yet;
    /// * [`Leadership::is_held`] was already false: nothing is sent.
    ///
    /// The call waits at most until the leadership's trusted deadline (or
    /// the request timeout, if that comes first), since past it nothing
    /// may be believed: [`Error::Timeout`] then, and the transaction, if it
    /// reached etcd, applied only while the key still carried this token.
    /// An empty `ops` is a linearizable "do I still lead?" check. Fails with [`Error::InvalidArgument`] for an empty key or
    /// prefix, or ops larger than one etcd request; etcd also limits the
    /// number of ops per transaction (128 by default), which comes back as
    /// [`Error::Backend`]. It does not wait for [`Election`] operations and may
    /// run concurrently with them.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = fleetcoord::testing::EtcdServer::start()?;
    /// use fleetcoord::{Election, Etcd, EtcdOptions, TxnOp, TxnOpResponse};
    ///
    /// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
    /// let election = Election::new(&etcd, "scheduler")?;
    /// let leadership = election.campaign(b"host-a")?;
    ///
    /// let ops = [TxnOp::put("/jobs/owner", "host-a"), TxnOp::get("/jobs/owner")];
    /// match leadership.txn_if_leader(ops)? {
    ///     Some(responses) => {
    ///         assert_eq!(responses[0], TxnOpResponse::Put);
    ///         let TxnOpResponse::Get { kvs } = &responses[1] else { unreachable!() };
    ///         assert_eq!(kvs[0].value, b"host-a");
    ///     }
    ///     None => println!("no longer leader: nothing was written"),
    /// }
    /// leadership.resign()?;
    /// # Ok(()) }
    /// ```
    pub fn txn_if_leader(
        &self,
        ops: impl IntoIterator<Item = TxnOp>,
    ) -> Result<Option<Vec<TxnOpResponse>>> {
        crate::blocking::check()?;
        let ops = crate::txn::check_ops(ops)?;
        let Some(left) = self.belief.remaining() else {
            return Ok(None);
        };
        let txn = fenced_txn(self.key.as_bytes(), self.token, ops);
        let response = self.inner.etcd.request_within(txn, left)?;
        self.fenced_answer(response)
    }

    /// What etcd's answer to this leadership's fenced transaction means; a
    /// refusal ends the leadership here, before the caller hears of it.
    fn fenced_answer(&self, response: Response) -> Result<Option<Vec<TxnOpResponse>>> {
        crate::txn::fenced_answer(response, || {
            self.belief.end();
            self.inner.fence_refused(self.token);
        })
    }

    /// Step down: delete the candidate key so the next candidate leads.
    /// `is_held` turns false before the request is sent. Returns once etcd
    /// confirmed the delete, or with [`Error::Timeout`](crate::Error::Timeout)
    /// after the request timeout; the driver then goes on resending the
    /// delete until etcd confirms it (or the session ends, which deletes the
    /// key too), so a resign that timed out never leaves the key queued.
    pub fn resign(mut self) -> Result<()> {
        crate::blocking::check()?;
        // `resign` consumes the handle, and only it and `drop` set
        // `resigned`: it is always false here.
        self.resigned = true;
        self.belief.end();
        if !self.is_current() {
            return Ok(());
        }
        let turn = self.inner.ops.turn();
        if !self.is_current() {
            return Ok(());
        }
        self.inner.resign(&turn, self.token)
    }

    /// Whether the machine last reported this leadership as held. A stale
    /// handle skips its resign; the machine would ignore it anyway (the
    /// resign carries the token), this only saves the round trip.
    fn is_current(&self) -> bool {
        self.inner
            .state
            .lock()
            .held
            .as_ref()
            .is_some_and(|h| h.token == self.token)
    }
}

// Drop never waits for etcd; see "Dropping" in the type's docs.
impl Drop for Leadership {
    fn drop(&mut self) {
        if !self.resigned {
            self.resigned = true;
            self.belief.end();
            if self.is_current() {
                // Fire and forget: the answer (`Resigned` with this token)
                // is ignored by whichever operation is waiting then.
                let _ = self
                    .inner
                    .ops
                    .machine()
                    .send(ElectionInput::Resign { token: self.token });
            }
        }
        if Arc::strong_count(&self.inner) == 1 {
            self.inner.stop();
        }
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use crate::testing::EtcdServer;
    use crate::{Election, Etcd, EtcdOptions};
    use fleetcoord_sm::Response;
    use std::time::Duration;

    /// A refusal ends the leadership on the caller's thread, without
    /// waiting for the election's watch: here etcd never deleted the key
    /// (the refusal is made up), so nothing but the refusal can end it.
    #[test]
    fn a_refusal_ends_the_leadership_before_the_call_returns() {
        let server = EtcdServer::start().expect("etcd");
        let etcd =
            Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
        let election = Election::new(&etcd, "refused").expect("election");
        let leadership = election.campaign(b"a").expect("campaign");
        let refused = Response::Txn {
            revision: 1,
            succeeded: false,
            responses: Vec::new(),
        };
        assert_eq!(leadership.fenced_answer(refused).expect("answer"), None);
        assert!(!leadership.is_held());
        assert_eq!(leadership.lost().try_recv(), Ok(()), "lost() fired");
        // The machine was told too: it no longer leads, so a new campaign
        // is not refused as busy (its key, still there, leads again).
        let again = election
            .campaign_timeout(b"b", Duration::from_secs(10))
            .expect("campaign again");
        assert!(again.is_held());
        assert!(leadership.lost().try_recv().is_err(), "fired once");
    }
}
