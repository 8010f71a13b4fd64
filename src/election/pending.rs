//! [`Pending`]: a campaign (or a lock, or an acquire) that is waited on in
//! slices and canceled from any thread, keeping its key and its place in
//! the queue between waits.
//!
//! A blocking campaign with a timeout gives its place up at every timeout
//! (the key is withdrawn, and a new campaign queues behind everyone who
//! came meanwhile). Here the campaign is one operation of the election
//! machine (`ElectionInput::Campaign`), started once and answered once;
//! a wait only reads whether the answer came, so slicing a wait writes
//! nothing to etcd. Ending it is the machine's `CancelCampaign`, which
//! withdraws a campaign still waiting and resigns one that already won:
//! a canceled campaign never leaves a leadership behind.
//!
//! The pending campaign keeps the election's turn (one operation at a
//! time, see `ops.rs`) until it is settled, so its answers stay routed to
//! it between waits.

use super::ops::{KeptTurn, Turn};
use super::{election_error, leadership_of, Election, Inner, Leadership, Won};
use crate::deadline::deadline_after;
use crate::driver::Gone;
use crate::error::{Error, Result};
use crate::validate;
use crossbeam_channel::{Receiver, Sender};
use fleetcoord_sm::election::{ElectionError, ElectionInput, ElectionNotice, OpId};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A campaign that waits in the queue while nobody waits on it: started by
/// [`Election::start_campaign`] (`T` = [`Leadership`]),
/// [`ElectionPool::start_campaign`](crate::ElectionPool::start_campaign),
/// [`Mutex::start_lock`](crate::Mutex::start_lock) (`T` =
/// [`MutexGuard`](crate::MutexGuard)) or
/// [`Semaphore::start_acquire`](crate::Semaphore::start_acquire) (`T` =
/// [`SemaphoreGuard`](crate::SemaphoreGuard)).
///
/// Guarantees:
/// * **Its place is kept.** The candidate key is created once; waits that
///   end without a win ([`Pending::wait_timeout`] returning `Ok(None)`,
///   [`Pending::wait_until`] seeing its stop) leave the key and its create
///   revision as they are, so the order of the queue is the order in which
///   campaigns started, however often each is waited on. Between waits
///   nothing is written to etcd (the session's renewals go on, as always).
///   A lost session lease is replaced and the campaign queues again on the
///   new one, as [`Election::campaign`]'s does.
/// * **Cancel from any thread.** [`Pending::cancel`] (or a
///   [`Canceller`], which outlives no `Pending`) withdraws the key: a wait
///   in another thread returns [`Error::Canceled`] at once, and the cancel
///   returns once etcd confirmed the key deleted (a round trip), or with
///   [`Error::Timeout`] after the request timeout, the driver then going on
///   deleting it (or the key goes with its session). A win that crossed
///   the cancel is resigned: a canceled campaign never leaves a leadership
///   behind. A cancel after a wait returned the win does nothing; end
///   that leadership instead.
/// * **Dropping cancels** without waiting: the key is withdrawn in the
///   background, as a dropped [`Leadership`] resigns.
/// * **Closing ends it.** [`Election::close`] (also from another thread),
///   [`ElectionPool::close`](crate::ElectionPool::close),
///   [`Mutex::close`](crate::Mutex::close),
///   [`Semaphore::close`](crate::Semaphore::close) and
///   [`Etcd::close`](crate::Etcd::close) make a wait return
///   [`Error::Closed`] within milliseconds; the key goes with the
///   session's revoke.
///
/// While it is pending, the election runs nothing else: a second campaign
/// of the same election (blocking, `try_`, or another start) fails at once
/// with [`Error::InvalidArgument`] naming `"campaign"`, and other
/// operations of the election wait until this one is settled (won and
/// returned, failed, canceled or dropped). Waits of one `Pending` from
/// several threads take turns. `Pending` is `Send` and `Sync`.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Election, Etcd, EtcdOptions};
/// use std::time::Duration;
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let leader = Election::new(&etcd, "scheduler")?.campaign(b"host-a")?;
/// let election = Election::new(&etcd, "scheduler")?;
/// let pending = election.start_campaign(b"host-b")?; // queued behind host-a
/// assert!(pending.wait_timeout(Duration::from_millis(100))?.is_none()); // still queued
/// leader.resign()?;
/// let leadership = pending.wait()?; // same key, same place: next in line
/// assert!(leadership.is_held());
/// # Ok(()) }
/// ```
#[must_use = "dropping a Pending cancels the campaign at once"]
pub struct Pending<T> {
    shared: Arc<Shared>,
    into: fn(Leadership) -> T,
}

/// Cancels one [`Pending`] campaign from anywhere (a signal handler, a
/// supervisor thread): cloneable, `Send`, `Sync`, `'static`. It does not
/// keep the campaign alive: once the `Pending` is dropped (which cancels
/// it) or settled, [`Canceller::cancel`] does nothing.
#[derive(Clone, Debug)]
pub struct Canceller {
    shared: Weak<Shared>,
}

/// What a [`Pending`] and its [`Canceller`]s share.
struct Shared {
    inner: Arc<Inner>,
    /// The campaign operation, as the machine numbers its answers.
    op: OpId,
    /// Its answers (and resigns' answers, which name no operation).
    answers: Receiver<ElectionNotice>,
    /// Disconnected by a cancel, which wakes every wait at once.
    canceled: Receiver<()>,
    cancel_signal: Mutex<Option<Sender<()>>>,
    /// One thread reads `answers` at a time.
    reader: Mutex<()>,
    /// When the campaign was started, for [`Leadership::waited`].
    started: Instant,
    phase: Mutex<Phase>,
    /// The election's turn, until the campaign is settled.
    turn: Mutex<Option<KeptTurn>>,
}

enum Phase {
    /// In the queue (or waiting for the session's lease).
    Waiting,
    /// A cancel was sent and not yet confirmed; `crossed` is the token of
    /// a win that crossed it, which the machine resigns.
    Canceling { crossed: Option<i64> },
    /// Settled: what every later wait returns.
    Over(End),
}

#[derive(Clone)]
enum End {
    /// A wait returned the win.
    Won,
    /// Canceled or dropped.
    Canceled,
    /// The machine ended the campaign.
    Failed(ElectionError),
    /// The machine task is gone.
    Gone,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("prefix", &self.inner.prefix)
            .field("op", &self.op.0)
            .finish()
    }
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl Election {
    /// Start a campaign with `value` and return at once: the candidate key
    /// is queued (once the session has its lease) and stays queued until
    /// the [`Pending`] is won, canceled, dropped or closed, however it is
    /// waited on. See [`Pending`] for what it guarantees.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = fleetcoord::testing::EtcdServer::start()?;
    /// # let etcd = fleetcoord::Etcd::with_options(&[server.endpoint()], Default::default())?;
    /// use fleetcoord::Election;
    /// use std::time::Duration;
    ///
    /// let election = Election::new(&etcd, "rebalancer")?;
    /// let pending = election.start_campaign(b"host-a")?;
    /// let canceller = pending.canceller(); // e.g. for a signal handler
    /// let leadership = loop {
    ///     match pending.wait_timeout(Duration::from_millis(100))? {
    ///         Some(leadership) => break leadership,
    ///         None => { /* do other work; the place in the queue is kept */ }
    ///     }
    /// };
    /// canceller.cancel()?; // settled already: does nothing
    /// leadership.resign()?;
    /// # Ok(()) }
    /// ```
    pub fn start_campaign(&self, value: &[u8]) -> Result<Pending<Leadership>> {
        crate::blocking::check()?;
        self.start(value, |leadership| leadership)
    }

    /// Campaign with `value` until this candidate leads (`Ok(Some)`) or
    /// `stop` receives a message or is disconnected (`Ok(None)`: the
    /// candidate key was withdrawn, and etcd confirmed it, before the
    /// return). For shutdown: drop the stop channel's sender in the signal
    /// handler, and every wait on it returns. A withdraw etcd did not
    /// confirm within the request timeout is [`Error::Timeout`] (the
    /// driver goes on deleting the key). Errors as
    /// [`Election::campaign`].
    pub fn campaign_until(&self, value: &[u8], stop: &Receiver<()>) -> Result<Option<Leadership>> {
        crate::blocking::check()?;
        self.start_campaign(value)?.until(stop)
    }

    /// [`Election::start_campaign`], handing out the win as `into` makes it.
    pub(crate) fn start<T>(&self, value: &[u8], into: fn(Leadership) -> T) -> Result<Pending<T>> {
        validate::payload("value", value)?;
        if self.inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let turn = self.inner.campaign_turn()?;
        let value = value.to_vec();
        let rank = self.inner.rank;
        let (op, answers) = self
            .inner
            .ops
            .begin(&turn, |op| match rank {
                Some(rank) => ElectionInput::CampaignRanked { op, value, rank },
                None => ElectionInput::Campaign { op, value },
            })
            .map_err(|Gone| self.inner.gone())?;
        let kept = turn.keep();
        let (cancel_signal, canceled) = crossbeam_channel::bounded(0);
        Ok(Pending {
            shared: Arc::new(Shared {
                inner: self.inner.clone(),
                op,
                answers,
                canceled,
                cancel_signal: Mutex::new(Some(cancel_signal)),
                reader: Mutex::new(()),
                started: Instant::now(),
                phase: Mutex::new(Phase::Waiting),
                turn: Mutex::new(Some(kept)),
            }),
            into,
        })
    }
}

impl Inner {
    /// The turn for a campaign: refused at once while another campaign is
    /// pending, which the machine would refuse as busy anyway (and whose
    /// owner may be the calling thread, which would then wait for ever),
    /// and while this election's leadership is still believed: the machine
    /// holds a campaign asked while it leads until that leadership ends
    /// (its end may have been seen here first, on the session's loss),
    /// which a leadership the caller still holds never does by itself.
    pub(super) fn campaign_turn(&self) -> Result<Turn<'_>> {
        let turn = self.ops.turn_unless_kept().ok_or_else(|| {
            Error::invalid(
                "campaign",
                "another campaign of this election is pending \
                 (start_campaign, start_lock or start_acquire): wait on it, \
                 or cancel or drop it, first",
            )
        })?;
        if let Some(token) = self
            .state
            .lock()
            .held
            .as_ref()
            .filter(|h| h.belief.holds())
            .map(|h| h.token)
        {
            return Err(Error::invalid(
                "campaign",
                format!(
                    "this election is held already, with fencing token {token} \
                     (a Leadership, MutexGuard or SemaphoreGuard of it is still held): \
                     resign, unlock, release or drop it first"
                ),
            ));
        }
        Ok(turn)
    }
}

impl<T> Pending<T> {
    /// Wait until the campaign wins. [`Error::Canceled`] once it was
    /// canceled (from any thread), [`Error::Closed`] once its election or
    /// [`Etcd`](crate::Etcd) was closed, else the errors of
    /// [`Election::campaign`]. After a wait returned the win, every later
    /// wait is [`Error::InvalidArgument`] naming `"campaign"`.
    pub fn wait(&self) -> Result<T> {
        crate::blocking::check()?;
        loop {
            if let Some(won) = self.shared.wait(None, &crossbeam_channel::never())? {
                return Ok((self.into)(won));
            }
        }
    }

    /// Wait at most `timeout` (from the call): `Ok(Some)` once the
    /// campaign won, `Ok(None)` when the timeout passed first, the
    /// candidate still queued with the same key and place. Returns at the
    /// deadline whatever etcd does. A timeout too long to add to the
    /// current time (`Duration::MAX`) waits as [`Pending::wait`]. Errors as
    /// [`Pending::wait`].
    pub fn wait_timeout(&self, timeout: Duration) -> Result<Option<T>> {
        crate::blocking::check()?;
        let deadline = deadline_after(timeout);
        Ok(self
            .shared
            .wait(deadline, &crossbeam_channel::never())?
            .map(self.into))
    }

    /// Wait until the campaign wins (`Ok(Some)`) or `stop` receives a
    /// message or is disconnected (`Ok(None)`; the candidate stays queued,
    /// cancel or drop it to leave). Errors as [`Pending::wait`].
    pub fn wait_until(&self, stop: &Receiver<()>) -> Result<Option<T>> {
        crate::blocking::check()?;
        Ok(self.shared.wait(None, stop)?.map(self.into))
    }

    /// Withdraw the candidate key; see "Cancel from any thread" on
    /// [`Pending`]. `Ok(())` once etcd confirmed it gone (or the campaign
    /// was settled already: then nothing is done), [`Error::Timeout`]
    /// after the request timeout.
    pub fn cancel(&self) -> Result<()> {
        crate::blocking::check()?;
        self.shared.cancel()
    }

    /// A handle that cancels this campaign from anywhere.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Wait until won or `stop`; on a stop, cancel and wait for the withdraw.
    pub(super) fn until(self, stop: &Receiver<()>) -> Result<Option<T>> {
        match self.wait_until(stop)? {
            Some(won) => Ok(Some(won)),
            None => {
                self.cancel()?;
                Ok(None)
            }
        }
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        self.shared.abandon();
    }
}

impl Canceller {
    /// [`Pending::cancel`] of the campaign this was made from; `Ok(())`
    /// without doing anything once that `Pending` is dropped or settled.
    pub fn cancel(&self) -> Result<()> {
        crate::blocking::check()?;
        match self.shared.upgrade() {
            Some(shared) => shared.cancel(),
            None => Ok(()),
        }
    }
}

impl Shared {
    /// Wait until the campaign wins (`Some`), `deadline` passes or `stop`
    /// fires (`None`), or it ends otherwise (the error).
    fn wait(&self, deadline: Option<Instant>, stop: &Receiver<()>) -> Result<Option<Leadership>> {
        crate::blocking::check()?;
        let _reader = match deadline {
            Some(at) => match self.reader.try_lock_until(at) {
                Some(reader) => reader,
                // Another thread waits on this campaign: report what is known.
                None => return self.settled().map(|()| None),
            },
            None => self.reader.lock(),
        };
        let timer = deadline.map_or_else(crossbeam_channel::never, crossbeam_channel::at);
        loop {
            self.settled()?;
            crossbeam_channel::select! {
                recv(self.answers) -> notice => match notice {
                    Ok(notice) => {
                        if let Some(won) = self.take(notice)? {
                            return Ok(Some(won));
                        }
                    }
                    Err(_) => return Err(self.end(End::Gone)),
                },
                // Only ever disconnected, by a cancel: `settled` says so.
                recv(self.canceled) -> _ => {}
                recv(stop) -> _ => return Ok(None),
                recv(timer) -> _ => return Ok(None),
            }
        }
    }

    /// `Ok(())` while the campaign waits; else what ended it.
    fn settled(&self) -> Result<()> {
        match &*self.phase.lock() {
            Phase::Waiting => Ok(()),
            Phase::Canceling { .. } => Err(Error::Canceled),
            Phase::Over(end) => Err(self.error(end)),
        }
    }

    fn error(&self, end: &End) -> Error {
        match end {
            End::Won => Error::invalid(
                "campaign",
                "this campaign was won and an earlier wait returned its leadership",
            ),
            End::Canceled => Error::Canceled,
            End::Failed(error) => {
                election_error(error.clone()).with_endpoints(self.inner.etcd.endpoints())
            }
            End::Gone => self.inner.gone(),
        }
    }

    /// What one answer means to a wait: the win (`Some`), nothing yet
    /// (`None`), or the end of the campaign (the error).
    fn take(&self, notice: ElectionNotice) -> Result<Option<Leadership>> {
        match notice {
            ElectionNotice::Elected {
                op,
                token,
                lease,
                key,
                waited,
                attempts,
                ..
            } if op == self.op => {
                let mut phase = self.phase.lock();
                match &mut *phase {
                    Phase::Waiting => {
                        *phase = Phase::Over(End::Won);
                        drop(phase);
                        let how = Won {
                            waited: self.started.elapsed(),
                            contended: waited,
                            attempts,
                        };
                        let won = leadership_of(&self.inner, how, token, lease, key);
                        self.settle();
                        Ok(Some(won))
                    }
                    // The machine resigns it for the cancel.
                    Phase::Canceling { crossed } => {
                        *crossed = Some(token);
                        Err(Error::Canceled)
                    }
                    Phase::Over(end) => Err(self.error(end)),
                }
            }
            ElectionNotice::CampaignFailed { op, error } if op == self.op => {
                let canceling = matches!(*self.phase.lock(), Phase::Canceling { .. });
                Err(self.end(if canceling {
                    End::Canceled
                } else {
                    End::Failed(error)
                }))
            }
            _ => Ok(None),
        }
    }

    /// Settle the campaign with `end`; its error.
    fn end(&self, end: End) -> Error {
        let error = self.error(&end);
        *self.phase.lock() = Phase::Over(end);
        self.settle();
        error
    }

    /// Nothing waits for this campaign's answers any more (late ones are
    /// stale: a late win is resigned by the notice handler) and the
    /// election's next operation may run. Idempotent.
    fn settle(&self) {
        self.inner.ops.forget(self.op);
        if let Some(turn) = self.turn.lock().take() {
            self.inner.ops.give_back(turn);
        }
    }

    /// Send the cancel, once; `false` when it was sent already or the
    /// campaign is settled.
    fn begin_cancel(&self) -> bool {
        {
            let mut phase = self.phase.lock();
            if !matches!(*phase, Phase::Waiting) {
                return false;
            }
            *phase = Phase::Canceling { crossed: None };
        }
        // Wakes every wait, which then reads `Canceling`.
        self.cancel_signal.lock().take();
        if self
            .inner
            .ops
            .machine()
            .send(ElectionInput::CancelCampaign { op: self.op })
            .is_err()
        {
            // The machine ended: its session's revoke took the key.
            self.end(End::Canceled);
        }
        true
    }

    fn cancel(&self) -> Result<()> {
        self.begin_cancel();
        if matches!(*self.phase.lock(), Phase::Over(_)) {
            return Ok(());
        }
        let bound = self.inner.etcd.options().request_timeout;
        let timed_out = || {
            self.end(End::Canceled);
            Err(Error::Timeout(bound))
        };
        let Some(deadline) = deadline_after(bound) else {
            return timed_out();
        };
        // A wait in another thread lets go of the answers at once.
        let Some(_reader) = self.reader.try_lock_until(deadline) else {
            return timed_out();
        };
        let timer = crossbeam_channel::at(deadline);
        loop {
            let crossed = match &*self.phase.lock() {
                Phase::Canceling { crossed } => *crossed,
                // Confirmed while another thread read the answers.
                _ => return Ok(()),
            };
            crossbeam_channel::select! {
                recv(self.answers) -> notice => match notice {
                    Ok(ElectionNotice::CampaignFailed { op, .. }) if op == self.op => {
                        self.end(End::Canceled);
                        return Ok(());
                    }
                    Ok(ElectionNotice::Elected { op, token, .. }) if op == self.op => {
                        if let Phase::Canceling { crossed } = &mut *self.phase.lock() {
                            *crossed = Some(token);
                        }
                    }
                    Ok(ElectionNotice::Resigned { token }) if crossed == Some(token) => {
                        self.end(End::Canceled);
                        return Ok(());
                    }
                    Ok(_) => {}
                    // The machine ended: its session's revoke took the key.
                    Err(_) => {
                        self.end(End::Canceled);
                        return Ok(());
                    }
                },
                recv(timer) -> _ => return timed_out(),
            }
        }
    }

    /// The `Pending` is dropped: cancel without waiting.
    fn abandon(&self) {
        self.begin_cancel();
        let canceling = matches!(*self.phase.lock(), Phase::Canceling { .. });
        if canceling {
            // The machine withdraws on its own; its answer is stale now.
            *self.phase.lock() = Phase::Over(End::Canceled);
        }
        self.settle();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.settle();
        // As for a dropped `Leadership`: the last owner stops the session.
        if Arc::strong_count(&self.inner) == 1 {
            self.inner.stop();
        }
    }
}
