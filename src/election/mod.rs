//! [`Election`]: leader election on a name, compatible with Go's
//! `clientv3/concurrency` and `etcdctl elect`.

use crate::deadline::deadline_after;
use crate::driver::{rand_seed, MachineHandle, Notify, WeakInput};
use crate::error::{Error, ErrorKind, Result};
use crate::etcd::{assert_not_async, Etcd};
use crate::liveness::{
    close_outcome, ATTEMPT_TIMEOUT, CLOSE_WAIT, DEFAULT_DRIFT_ALLOWANCE_PPM, DEFAULT_SAFETY_MARGIN,
};
use crate::validate;
use belief::Belief;
use fleetcoord_sm::election::{
    leader_query, Election as ElectionMachine, ElectionConfig, ElectionError, ElectionInput,
    ElectionNotice, OpId,
};
use fleetcoord_sm::keepalive::{trusted_lifetime, LivenessState};
use fleetcoord_sm::{BackoffConfig, KeyValue, Response};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod belief;
mod leadership;
pub(crate) mod mutex;
mod observer;
mod pool;

pub use leadership::Leadership;
pub use observer::LeaderObserver;
pub use pool::ElectionPool;

/// Where elections live unless told otherwise.
pub const DEFAULT_ELECTION_PREFIX: &str = "/coord/election/";

/// Settings for [`Election::with_options`] and [`ElectionPool`].
///
/// Start from [`ElectionOptions::default`] and change what you need with the
/// `with_*` methods; the fields are public for reading. `#[non_exhaustive]`
/// so that new settings are not a breaking change.
///
/// ```
/// use fleetcoord::ElectionOptions;
/// use std::time::Duration;
///
/// // Share elections with `etcdctl elect <name>`, with a 5 s session.
/// let options = ElectionOptions::default().with_prefix("").with_ttl(Duration::from_secs(5));
/// assert_eq!(options.prefix, "");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ElectionOptions {
    /// Prepended to the election name; candidate keys are
    /// `<prefix><name>/<lease id hex>`. Default [`DEFAULT_ELECTION_PREFIX`].
    /// Use `""` to share an election with `etcdctl elect <name>`, whose keys
    /// are `<name>/<lease id hex>`.
    pub prefix: String,
    /// TTL of the session lease. A leader that dies is replaced about this
    /// long after its last renewal. Whole seconds, at least 1. Default 10 s.
    pub ttl: Duration,
    /// How long before etcd can expire the session lease (and elect the
    /// next candidate) this candidate stops believing it leads: room for
    /// acting on an [`Leadership::is_held`] just read (which compares the
    /// caller's own clock with the deadline, so a late driver does not
    /// stretch it) and for [`Leadership::lost`] arriving late. At most half of the TTL less the
    /// drift allowance. Default 250 ms.
    pub safety_margin: Duration,
    /// How much slower than etcd's clock this host's clock may run, in
    /// parts per million: the session trusts its lease for the TTL
    /// shortened by this much, then less the margin. 0 to 100,000 (10 %).
    /// Default 10,000 (1 %, ten times what NTP lets two clocks differ by).
    pub drift_allowance_ppm: u32,
}

impl Default for ElectionOptions {
    fn default() -> Self {
        ElectionOptions {
            prefix: DEFAULT_ELECTION_PREFIX.into(),
            ttl: Duration::from_secs(10),
            safety_margin: DEFAULT_SAFETY_MARGIN,
            drift_allowance_ppm: DEFAULT_DRIFT_ALLOWANCE_PPM,
        }
    }
}

impl ElectionOptions {
    /// These options with [`ElectionOptions::prefix`] set (checked when the
    /// election is joined).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with [`ElectionOptions::ttl`] set (checked when the
    /// election is joined).
    #[must_use]
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// These options with [`ElectionOptions::safety_margin`] set (at most
    /// half of the TTL less the drift allowance, checked when the election
    /// is joined).
    #[must_use]
    pub const fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }

    /// These options with [`ElectionOptions::drift_allowance_ppm`] set (at
    /// most 100,000, checked when the election is joined).
    #[must_use]
    pub const fn with_drift_allowance_ppm(mut self, ppm: u32) -> Self {
        self.drift_allowance_ppm = ppm;
        self
    }

    /// How long a session with these options trusts its lease, counted
    /// from the send of its last acknowledged renewal: the TTL less the
    /// drift allowance, less the safety margin (for the requested TTL; etcd
    /// may grant a longer one, which is then trusted longer). A leader
    /// whose renewals stop holds at most this long; the keepalive renews
    /// every third of it.
    ///
    /// ```
    /// use fleetcoord::ElectionOptions;
    /// use std::time::Duration;
    ///
    /// // 10 s less 1 % less 250 ms.
    /// assert_eq!(ElectionOptions::default().trusted_lifetime(), Duration::from_millis(9_650));
    /// ```
    pub fn trusted_lifetime(&self) -> Duration {
        trusted_lifetime(self.ttl, self.safety_margin, self.drift_allowance_ppm)
    }
}

/// The leader of an election as etcd has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The leader's candidate key.
    pub key: String,
    /// The value the leader campaigned or proclaimed with.
    pub value: Vec<u8>,
    /// The leader's session lease.
    pub lease: i64,
    /// The key's create revision: the leader's fencing token.
    pub token: i64,
}

impl LeaderInfo {
    pub(crate) fn from_kv(kv: &KeyValue) -> LeaderInfo {
        LeaderInfo {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            value: kv.value.clone(),
            lease: kv.lease,
            token: kv.create_revision,
        }
    }
}

/// Outcome of [`Election::try_campaign`].
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): a try either elects
/// this candidate or it does not; there is no third outcome to add.
#[derive(Debug)]
#[must_use = "TryCampaign::Elected holds a Leadership that resigns when dropped"]
pub enum TryCampaign {
    /// This candidate leads now.
    Elected(Leadership),
    /// Somebody else leads (`None`: the queue emptied meanwhile); this
    /// candidate's key was removed again.
    NotElected(Option<LeaderInfo>),
}

/// One election, with its own session (a lease kept alive in the
/// background; it self-heals like [`crate::liveness::HostLiveness`]).
///
/// Guarantees:
/// * At most one candidate holds a [`Leadership`] with
///   [`Leadership::is_held`] true at any instant, and none once etcd has
///   expired its session lease: a leader stops believing at its session's
///   local deadline, [`ElectionOptions::trusted_lifetime`] after the send
///   of its last acknowledged renewal, which passes at least
///   [`ElectionOptions::safety_margin`] before etcd can expire the lease and
///   let the next one in. This holds while the leader's clock runs no
///   slower than [`ElectionOptions::drift_allowance_ppm`] permits relative
///   to etcd's, and while its process is not paused for longer than the
///   margin between deadline and action (the fencing token covers the
///   rest); it does not rely on how late etcd's expiry loop runs, nor on
///   how soon the driver thread runs: `is_held` reads the calling thread's
///   clock against the deadline of the last answered renewal.
/// * Operations are numbered: an answer that arrives late for an operation
///   that gave up (a campaign that timed out while its withdraw was still
///   going) is never taken for a later operation's answer, and a late win
///   of such a campaign is resigned, never left held by nobody.
/// * Leadership is reported only after the own key was read back (unlike
///   Go's client, etcd #19597); a campaign whose session is lost while it
///   waits joins the queue again on the session's next lease.
/// * Liveness: timed calls return at their bound, requests etcd dropped in
///   a raft leader change are sent again, and a key that cannot be deleted
///   goes with its session (README, "Liveness under faults").
/// * Fencing tokens (the key's create revision) strictly increase from one
///   leader to the next.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Election, Etcd, EtcdOptions};
///
/// let etcd = Etcd::connect(&[server.endpoint()], EtcdOptions::default())?;
/// let election = Election::new(&etcd, "db-primary")?;
/// let leadership = election.campaign(b"host-a")?;
/// println!("leading with fencing token {}", leadership.fencing_token());
/// assert_eq!(election.leader()?.map(|l| l.value), Some(b"host-a".to_vec()));
/// leadership.resign()?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the last handle of an Election leaves it (revokes its session)"]
pub struct Election {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("prefix", &self.inner.prefix)
            .finish()
    }
}

struct Inner {
    etcd: Etcd,
    prefix: String,
    machine: MachineHandle<ElectionMachine>,
    /// One user operation at a time; the machine would answer `Busy`.
    op: Mutex<()>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// The operation waiting for its answer: only answers naming it (and
    /// every `Resigned`, which resigns match by token) reach it.
    waiter: Option<(OpId, crossbeam_channel::Sender<ElectionNotice>)>,
    /// The id of the last operation begun.
    last_op: u64,
    /// Resigns a leadership nobody waits for (see [`handle_notice`]); set
    /// once the machine runs. Weak, so that it does not keep the machine
    /// running after the last handle is gone.
    resigner: Option<WeakInput<ElectionMachine>>,
    held: Option<Held>,
    session: Option<LivenessState>,
    /// The machine task has ended; no answer will ever come.
    driver_gone: bool,
}

/// Owned by the notification handler, so it is dropped exactly when the
/// machine task ends: it then drops the waiter's sender, and a blocked
/// operation wakes with `DriverGone` instead of polling for it.
struct EndOfNotices(Arc<Mutex<State>>);

impl Drop for EndOfNotices {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.driver_gone = true;
        state.waiter = None;
    }
}

/// The leadership the machine last reported, registered by the driver's
/// notification handler the moment `Elected` arrives — before the waiting
/// user thread sees it — so a `LeadershipLost` that follows at once is
/// never missed.
struct Held {
    token: i64,
    belief: Arc<Belief>,
    lost: crossbeam_channel::Sender<()>,
    lost_rx: crossbeam_channel::Receiver<()>,
}

impl Election {
    /// Join the election `name` with default options.
    ///
    /// # Names
    ///
    /// `name` is one key segment: non-empty, at most 255 bytes, no `/`, no
    /// control characters; anything else is [`Error::InvalidArgument`]
    /// naming `"name"`. A `/` is refused because it would nest elections:
    /// the candidates of `a/b` (keys `<prefix>a/b/<lease hex>`) lie inside
    /// the key range `<prefix>a/` of election `a`, which would then report
    /// the leader of `a/b` as its own and make its campaigns wait for it.
    /// Elections with different names under one prefix are therefore
    /// independent. Names without `/` keep the key layout of Go's
    /// `concurrency` package, so `etcdctl elect <name>` still shares an
    /// election with a prefix of `""`. Keep prefixes of different elections
    /// from nesting in the same way (`/x/` with name `a` and `/x/a/` with
    /// name `b`), since the prefix is not checked against other prefixes.
    pub fn new(etcd: &Etcd, name: &str) -> Result<Election> {
        Self::with_options(etcd, name, ElectionOptions::default())
    }

    /// Join the election `name` (one key segment, see "Names" on
    /// [`Election::new`]). Starts the session at once; campaigns wait for
    /// it.
    pub fn with_options(etcd: &Etcd, name: &str, options: ElectionOptions) -> Result<Election> {
        assert_not_async();
        let prefix = election_prefix(name, &options)?;
        validate::ttl("ttl", options.ttl)?;
        validate::trust(
            options.ttl,
            options.safety_margin,
            options.drift_allowance_ppm,
        )?;
        let config = ElectionConfig {
            prefix: prefix.clone().into_bytes(),
            ttl_secs: options.ttl.as_secs() as i64,
            backoff: BackoffConfig::default(),
            safety_margin: options.safety_margin,
            drift_allowance_ppm: options.drift_allowance_ppm,
            attempt_timeout: ATTEMPT_TIMEOUT.min(etcd.options().request_timeout),
        };
        let machine = ElectionMachine::new(config, Instant::now(), rand_seed());
        let state = Arc::new(Mutex::new(State::default()));
        let handler_state = EndOfNotices(state.clone());
        let metrics_prefix = prefix.clone();
        let machine = etcd.run(
            machine,
            Notify(move |notice| {
                match &notice {
                    ElectionNotice::Elected { token, .. } => {
                        crate::metrics::election(&metrics_prefix, "elected", *token)
                    }
                    ElectionNotice::LeadershipLost { token } => {
                        crate::metrics::election(&metrics_prefix, "lost", *token)
                    }
                    ElectionNotice::Resigned { token } => {
                        crate::metrics::election(&metrics_prefix, "resigned", *token)
                    }
                    _ => {}
                }
                handle_notice(&handler_state.0, notice);
                true
            }),
        )?;
        state.lock().resigner = Some(machine.downgrade());
        Ok(Election {
            inner: Arc::new(Inner {
                etcd: etcd.clone(),
                prefix,
                machine,
                op: Mutex::new(()),
                state,
            }),
        })
    }

    /// The current leader of election `name`, without joining it (no
    /// session, no lease): one linearizable read.
    pub fn leader_of(
        etcd: &Etcd,
        name: &str,
        options: &ElectionOptions,
    ) -> Result<Option<LeaderInfo>> {
        assert_not_async();
        current_leader(etcd, &election_prefix(name, options)?)
    }

    /// Stream the leader of election `name` without joining it; see
    /// [`Election::observe`].
    pub fn observe_of(
        etcd: &Etcd,
        name: &str,
        options: &ElectionOptions,
    ) -> Result<LeaderObserver> {
        assert_not_async();
        LeaderObserver::start(etcd, &election_prefix(name, options)?)
    }

    /// The key prefix candidates of this election use (`<prefix><name>/`).
    pub fn key_prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// Campaign with `value` and block until this candidate leads.
    ///
    /// When the session lease is lost while waiting (etcd unreachable for
    /// longer than the TTL, or it expired the lease), the campaign joins
    /// the queue again on the session's next lease, as [`HostLiveness`]
    /// re-registers; it fails only when etcd refuses the session for good
    /// (permission denied), and with [`Error::Closed`] after
    /// [`Election::close`].
    ///
    /// [`HostLiveness`]: crate::HostLiveness
    pub fn campaign(&self, value: &[u8]) -> Result<Leadership> {
        self.campaign_inner(value, None)
    }

    /// [`Election::campaign`], giving up after `timeout`: returns
    /// [`Error::Timeout`] at the deadline, whatever etcd does, and the
    /// driver removes the candidate key in the background (retrying until
    /// etcd confirms, or the session ends and the key with it), so a
    /// candidate that gave up never holds the queue. A campaign started
    /// while that removal is still going waits for it. Any duration is
    /// accepted; one too long to add to the current time (such as
    /// `Duration::MAX`) means no timeout, as in [`Election::campaign`].
    pub fn campaign_timeout(&self, value: &[u8], timeout: Duration) -> Result<Leadership> {
        self.campaign_inner(value, Some(timeout))
    }

    fn campaign_inner(&self, value: &[u8], timeout: Option<Duration>) -> Result<Leadership> {
        validate::payload("value", value)?;
        let _op = self.inner.op.lock();
        let value = value.to_vec();
        let operation = self
            .inner
            .begin(|op| ElectionInput::Campaign { op, value })?;
        // A timeout too large for an `Instant` (`Duration::MAX`) means none.
        let deadline = timeout.and_then(deadline_after);
        loop {
            match self.inner.wait(&operation, deadline)? {
                Some(ElectionNotice::Elected {
                    token, lease, key, ..
                }) => {
                    return Ok(self.leadership(token, lease, key));
                }
                Some(ElectionNotice::CampaignFailed { error, .. }) => {
                    return Err(election_error(error))
                }
                Some(_) => continue,
                None => {
                    self.inner.give_up(operation);
                    return Err(Error::Timeout(timeout.unwrap_or_default()));
                }
            }
        }
    }

    /// Become leader only if nobody else leads; never waits for other
    /// candidates. It may wait for the session to be granted, at most three
    /// request timeouts, then fails with [`Error::Timeout`] leaving nothing
    /// behind.
    pub fn try_campaign(&self, value: &[u8]) -> Result<TryCampaign> {
        validate::payload("value", value)?;
        let _op = self.inner.op.lock();
        let value = value.to_vec();
        let operation = self
            .inner
            .begin(|op| ElectionInput::TryCampaign { op, value })?;
        let bound = self.inner.etcd.options().request_timeout.saturating_mul(3);
        let deadline = deadline_after(bound);
        loop {
            let Some(notice) = self.inner.wait(&operation, deadline)? else {
                self.inner.give_up(operation);
                return Err(Error::Timeout(bound));
            };
            match notice {
                ElectionNotice::Elected {
                    token, lease, key, ..
                } => {
                    return Ok(TryCampaign::Elected(self.leadership(token, lease, key)));
                }
                ElectionNotice::NotElected { leader, .. } => {
                    return Ok(TryCampaign::NotElected(
                        leader.as_ref().map(LeaderInfo::from_kv),
                    ));
                }
                ElectionNotice::CampaignFailed { error, .. } => return Err(election_error(error)),
                _ => continue,
            }
        }
    }

    /// The current leader, read from etcd (one linearizable read).
    pub fn leader(&self) -> Result<Option<LeaderInfo>> {
        current_leader(&self.inner.etcd, &self.inner.prefix)
    }

    /// Stream the leader of this election: the current one first, then every
    /// change, `None` when no candidate remains.
    pub fn observe(&self) -> Result<LeaderObserver> {
        LeaderObserver::start(&self.inner.etcd, &self.inner.prefix)
    }

    /// The session's state (granting, registered, suspended, lost), `None`
    /// before the session has reported one.
    pub fn session(&self) -> Option<crate::LivenessState> {
        self.inner
            .state
            .lock()
            .session
            .as_ref()
            .map(crate::LivenessState::from_sm)
    }

    /// Leave the election: stop leading or campaigning and revoke the
    /// session lease (which deletes the candidate key). Waits until etcd
    /// confirmed the revoke; an error means the lease will instead expire
    /// after its TTL. Outstanding [`Leadership`]s report `is_held() == false`.
    pub fn close(self) -> Result<()> {
        self.inner.stop();
        self.wait_closed()
    }

    /// Ask the session to stop without waiting (see [`Election::close`]).
    pub(crate) fn begin_close(&self) {
        self.inner.stop();
    }

    /// Wait for a stop asked for earlier to be confirmed.
    pub(crate) fn wait_closed(&self) -> Result<()> {
        let finished = self.inner.machine.wait_finished(CLOSE_WAIT);
        let revoked = match self.inner.state.lock().session {
            Some(LivenessState::Stopped { revoked }) => Some(revoked),
            _ => None,
        };
        close_outcome(finished, revoked, || self.inner.etcd.gone())
    }

    fn leadership(&self, token: i64, lease: i64, key: Vec<u8>) -> Leadership {
        let (belief, lost) = {
            let state = self.inner.state.lock();
            match state.held.as_ref().filter(|h| h.token == token) {
                Some(h) => (h.belief.clone(), h.lost_rx.clone()),
                None => {
                    // Lost again before we got here: hand out a leadership
                    // that says so.
                    let (tx, rx) = crossbeam_channel::bounded(1);
                    let _ = tx.send(());
                    (Arc::new(Belief::over()), rx)
                }
            }
        };
        Leadership {
            inner: self.inner.clone(),
            token,
            lease,
            key: String::from_utf8_lossy(&key).into_owned(),
            belief,
            lost,
            resigned: false,
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        // Leaderships hold the inner state too; only the last owner stops.
        if Arc::strong_count(&self.inner) == 1 {
            self.inner.stop();
        }
    }
}

/// One operation in progress: its id and where its answers arrive.
struct Operation {
    op: OpId,
    answers: crossbeam_channel::Receiver<ElectionNotice>,
}

impl Inner {
    /// Number the next operation, register it as the one waiting for
    /// answers, then send the input `make` builds for its id.
    fn begin(&self, make: impl FnOnce(OpId) -> ElectionInput) -> Result<Operation> {
        let (tx, answers) = crossbeam_channel::unbounded();
        let op = {
            let mut state = self.state.lock();
            if state.driver_gone {
                return Err(self.etcd.gone());
            }
            state.last_op = state.last_op.wrapping_add(1);
            let op = OpId(state.last_op);
            state.waiter = Some((op, tx));
            op
        };
        self.machine.send(make(op)).map_err(|_| self.etcd.gone())?;
        Ok(Operation { op, answers })
    }

    /// The next answer; `Ok(None)` when `deadline` passed.
    fn wait(
        &self,
        operation: &Operation,
        deadline: Option<Instant>,
    ) -> Result<Option<ElectionNotice>> {
        let rx = &operation.answers;
        let received = match deadline {
            Some(d) => rx.recv_deadline(d),
            None => rx
                .recv()
                .map_err(|_| crossbeam_channel::RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(notice) => Ok(Some(notice)),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Ok(None),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(self.etcd.gone()),
        }
    }

    fn stop(&self) {
        self.machine.stop();
    }

    /// After a campaign or try-campaign timed out: cancel it without
    /// waiting. The machine withdraws the key on its own (resending the
    /// delete until etcd confirms it), and resigns a win that crossed the
    /// cancel; a late answer goes to nobody, since the waiter is
    /// unregistered first: `handle_notice` then resigns a late `Elected`
    /// too. One already queued for this operation is resigned here. The
    /// caller holds `op`.
    fn give_up(&self, operation: Operation) {
        self.unregister(&operation);
        let _ = self
            .machine
            .send(ElectionInput::CancelCampaign { op: operation.op });
        for notice in operation.answers.try_iter() {
            if let ElectionNotice::Elected { token, .. } = notice {
                resign_unwanted(&mut self.state.lock(), token);
            }
        }
    }

    /// Resign the leadership `token` and wait for the answer, at most the
    /// request timeout: past it the machine goes on deleting the key (it
    /// resends the delete until etcd confirms it or the session ends), and
    /// the caller gets [`Error::Timeout`]. The caller holds `op`.
    fn resign_locked(&self, token: i64) -> Result<()> {
        let bound = self.etcd.options().request_timeout;
        // A resign carries no operation id: its answer names the token.
        let operation = self.begin(|_| ElectionInput::Resign { token })?;
        let deadline = deadline_after(bound);
        loop {
            match self.wait(&operation, deadline)? {
                // A dropped handle's resign may be answered here too.
                Some(ElectionNotice::Resigned { token: t }) if t == token => return Ok(()),
                Some(_) => continue,
                None => {
                    self.unregister(&operation);
                    return Err(Error::Timeout(bound));
                }
            }
        }
    }

    /// Nobody waits for `operation`'s answers any more.
    fn unregister(&self, operation: &Operation) {
        let mut state = self.state.lock();
        if state
            .waiter
            .as_ref()
            .is_some_and(|(op, _)| *op == operation.op)
        {
            state.waiter = None;
        }
    }
}

/// The operation an answer is for; `None` for notices that answer none.
fn answers(notice: &ElectionNotice) -> Option<OpId> {
    match notice {
        ElectionNotice::Elected { op, .. }
        | ElectionNotice::NotElected { op, .. }
        | ElectionNotice::CampaignFailed { op, .. }
        | ElectionNotice::Proclaimed { op }
        | ElectionNotice::ProclaimFailed { op, .. } => Some(*op),
        _ => None,
    }
}

/// Runs on the driver for every notice, in order. Answers go to the
/// operation they name only; an answer to any other operation is one that
/// operation gave up on. Such an `Elected` (a campaign that timed out, its
/// cancel unconfirmed, winning after all) is resigned here, so the machine
/// never leads for nobody.
fn handle_notice(state: &Mutex<State>, notice: ElectionNotice) {
    let mut state = state.lock();
    match &notice {
        ElectionNotice::LeadershipLost { token } => {
            if state.held.as_ref().is_some_and(|h| h.token == *token) {
                if let Some(held) = state.held.take() {
                    held.belief.end();
                    let _ = held.lost.try_send(());
                }
            }
            return;
        }
        ElectionNotice::Trusted { token, until } => {
            if let Some(held) = state.held.as_ref().filter(|h| h.token == *token) {
                held.belief.trust_until(*until);
            }
            return;
        }
        ElectionNotice::Session(s) => {
            if let LivenessState::Stopped { .. } = s {
                if let Some(held) = state.held.take() {
                    held.belief.end();
                    let _ = held.lost.try_send(());
                }
            }
            state.session = Some(s.clone());
            return;
        }
        // Only the resigned leadership ends: a dropped handle's late resign
        // is answered even when a newer leadership holds.
        ElectionNotice::Resigned { token }
            if state.held.as_ref().is_some_and(|h| h.token == *token) =>
        {
            if let Some(held) = state.held.take() {
                held.belief.end();
            }
        }
        _ => {}
    }
    let waiting = state.waiter.as_ref().map(|(op, _)| *op);
    let answer = answers(&notice);
    if answer.is_some() && answer != waiting {
        if let ElectionNotice::Elected { token, .. } = notice {
            resign_unwanted(&mut state, token);
        }
        return;
    }
    if let ElectionNotice::Elected {
        token,
        trusted_until,
        ..
    } = &notice
    {
        // Registered before the waiter sees it, so a `LeadershipLost`
        // right behind it is never missed.
        if let Some(old) = state.held.take() {
            old.belief.end();
        }
        let (lost, lost_rx) = crossbeam_channel::bounded(1);
        state.held = Some(Held {
            token: *token,
            belief: Arc::new(Belief::until(*trusted_until)),
            lost,
            lost_rx,
        });
    }
    let token = match &notice {
        ElectionNotice::Elected { token, .. } => Some(*token),
        _ => None,
    };
    let delivered = state
        .waiter
        .as_ref()
        .is_some_and(|(_, tx)| tx.send(notice).is_ok());
    // The waiting operation gave up just now (its caller returned): the
    // win is nobody's.
    if let (Some(token), false) = (token, delivered) {
        resign_unwanted(&mut state, token);
    }
}

/// Ends the leadership `token` that no operation waits for: nothing will
/// hand it to a user, so it must not hold the election.
fn resign_unwanted(state: &mut State, token: i64) {
    if let Some(held) = state.held.take_if(|h| h.token == token) {
        held.belief.end();
    }
    if let Some(resigner) = &state.resigner {
        // Gone: the election is closing and its stop revokes the session.
        let _ = resigner.send(ElectionInput::Resign { token });
    }
}

fn election_error(e: ElectionError) -> Error {
    match e {
        ElectionError::SessionLost => Error::SessionLost,
        // Only a timed-out campaign cancels, and it reports its own
        // `Error::Timeout`; this is for a cancel that reaches a caller anyway.
        ElectionError::Canceled => Error::Canceled,
        ElectionError::NotLeader => Error::NotLeader,
        ElectionError::Stopped => Error::Closed,
        ElectionError::Rejected(e) => Error::rpc(e),
        // `Busy` cannot reach a caller: one operation runs at a time.
        other => Error::etcd(ErrorKind::Unexpected, format!("election: {other:?}")),
    }
}

/// `<prefix><name>/`, after checking both. The name is one segment (no
/// `/`): that is what keeps elections under one prefix independent, see
/// [`Election::new`].
fn election_prefix(name: &str, options: &ElectionOptions) -> Result<String> {
    validate::election_name("name", name)?;
    if !options.prefix.is_empty() {
        validate::prefix("prefix", &options.prefix)?;
    }
    Ok(format!("{}{}/", options.prefix, name))
}

/// The first-created key under `prefix`, i.e. the leader.
pub(crate) fn current_leader(etcd: &Etcd, prefix: &str) -> Result<Option<LeaderInfo>> {
    match etcd.request(leader_query(prefix.as_bytes()))? {
        Response::Range { kvs, .. } => Ok(kvs.first().map(LeaderInfo::from_kv)),
        other => Err(Error::unexpected(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::handle::Control;
    use fleetcoord_sm::election::OpId;

    /// A state whose resigns land in the returned receiver.
    fn state() -> (
        Mutex<State>,
        MachineHandle<ElectionMachine>,
        tokio::sync::mpsc::UnboundedReceiver<Control<ElectionInput>>,
    ) {
        let (input, inputs) = tokio::sync::mpsc::unbounded_channel();
        let (_finished_tx, finished) = crossbeam_channel::bounded(1);
        let machine = MachineHandle::new(input, finished);
        let state = State {
            resigner: Some(machine.downgrade()),
            ..State::default()
        };
        (Mutex::new(state), machine, inputs)
    }

    fn wait_for(state: &Mutex<State>, op: u64) -> crossbeam_channel::Receiver<ElectionNotice> {
        let (tx, rx) = crossbeam_channel::unbounded();
        state.lock().waiter = Some((OpId(op), tx));
        rx
    }

    /// One instant for every test notice, so that equal notices compare equal.
    static TRUSTED_UNTIL: std::sync::LazyLock<Instant> =
        std::sync::LazyLock::new(|| Instant::now() + Duration::from_secs(3600));

    fn elected(op: u64, token: i64) -> ElectionNotice {
        ElectionNotice::Elected {
            op: OpId(op),
            key: b"/e/1".to_vec(),
            token,
            lease: 1,
            trusted_until: *TRUSTED_UNTIL,
        }
    }

    fn resigned(
        inputs: &mut tokio::sync::mpsc::UnboundedReceiver<Control<ElectionInput>>,
    ) -> Vec<i64> {
        std::iter::from_fn(|| inputs.try_recv().ok())
            .filter_map(|c| match c {
                Control::Input(ElectionInput::Resign { token }) => Some(token),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn answers_reach_only_the_operation_they_name() {
        let (state, _machine, mut inputs) = state();
        let rx = wait_for(&state, 2);
        // Operation 1 gave up; its late answers go nowhere.
        handle_notice(
            &state,
            ElectionNotice::CampaignFailed {
                op: OpId(1),
                error: ElectionError::Canceled,
            },
        );
        handle_notice(&state, ElectionNotice::Proclaimed { op: OpId(1) });
        assert!(rx.try_recv().is_err());
        // Operation 2's answer arrives, with its leadership registered.
        handle_notice(&state, elected(2, 8));
        assert_eq!(rx.try_recv().ok(), Some(elected(2, 8)));
        assert_eq!(state.lock().held.as_ref().map(|h| h.token), Some(8));
        // Resigns match by token, so they always get through.
        handle_notice(&state, ElectionNotice::Resigned { token: 3 });
        assert_eq!(
            rx.try_recv().ok(),
            Some(ElectionNotice::Resigned { token: 3 })
        );
        assert!(resigned(&mut inputs).is_empty());
    }

    #[test]
    fn a_win_nobody_waits_for_is_resigned_not_held() {
        let (state, _machine, mut inputs) = state();
        let rx = wait_for(&state, 2);
        // The win of operation 1, which timed out and was given up.
        handle_notice(&state, elected(1, 7));
        assert!(rx.try_recv().is_err());
        assert!(state.lock().held.is_none());
        assert_eq!(resigned(&mut inputs), vec![7]);
        // The operation waiting was abandoned just now (its caller returned).
        drop(rx);
        handle_notice(&state, elected(2, 9));
        assert!(state.lock().held.is_none());
        assert_eq!(resigned(&mut inputs), vec![9]);
    }

    #[test]
    fn a_stopped_session_ends_the_held_leadership() {
        let (state, _machine, _inputs) = state();
        let rx = wait_for(&state, 1);
        handle_notice(&state, elected(1, 5));
        assert_eq!(rx.try_recv().ok(), Some(elected(1, 5)));
        let (belief, lost) = {
            let s = state.lock();
            let held = s.held.as_ref().expect("held");
            (held.belief.clone(), held.lost_rx.clone())
        };
        assert!(belief.holds());
        handle_notice(
            &state,
            ElectionNotice::Session(LivenessState::Stopped { revoked: true }),
        );
        assert!(!belief.holds(), "is_held turns false");
        assert_eq!(lost.try_recv(), Ok(()), "lost() fires");
        assert!(state.lock().held.is_none());
        assert_eq!(
            state.lock().session,
            Some(LivenessState::Stopped { revoked: true })
        );
    }

    /// A driver that reports nothing after `Elected` (starved, or its
    /// loss notice not handled yet) cannot extend belief: it ends at the
    /// announced deadline by the reader's clock, and only a `Trusted` for
    /// the same token moves it.
    #[test]
    fn belief_ends_at_the_announced_deadline_unless_moved() {
        let (state, _machine, _inputs) = state();
        let rx = wait_for(&state, 1);
        let soon = Instant::now() + Duration::from_millis(50);
        let mut notice = elected(1, 5);
        if let ElectionNotice::Elected { trusted_until, .. } = &mut notice {
            *trusted_until = soon;
        }
        handle_notice(&state, notice);
        assert!(rx.try_recv().is_ok());
        let belief = state.lock().held.as_ref().expect("held").belief.clone();
        assert!(belief.holds());
        let later = Instant::now() + Duration::from_secs(60);
        handle_notice(
            &state,
            ElectionNotice::Trusted {
                token: 4,
                until: later,
            },
        );
        std::thread::sleep(Duration::from_millis(60));
        assert!(!belief.holds(), "another token's deadline moves nothing");
        handle_notice(
            &state,
            ElectionNotice::Trusted {
                token: 5,
                until: later,
            },
        );
        assert!(belief.holds(), "an answered renewal moves it");
    }

    #[test]
    fn a_newer_leadership_replaces_the_one_held() {
        let (state, _machine, mut inputs) = state();
        let _first = wait_for(&state, 1);
        handle_notice(&state, elected(1, 5));
        let old = state.lock().held.as_ref().expect("held").belief.clone();
        let second = wait_for(&state, 2);
        handle_notice(&state, elected(2, 9));
        assert_eq!(second.try_recv().ok(), Some(elected(2, 9)));
        assert!(!old.holds(), "the old belief ends");
        assert_eq!(state.lock().held.as_ref().map(|h| h.token), Some(9));
        assert!(resigned(&mut inputs).is_empty());
    }

    #[test]
    fn election_errors_map_to_their_own_kinds() {
        assert!(matches!(
            election_error(ElectionError::SessionLost),
            Error::SessionLost
        ));
        assert!(matches!(
            election_error(ElectionError::Canceled),
            Error::Canceled
        ));
        assert!(matches!(
            election_error(ElectionError::NotLeader),
            Error::NotLeader
        ));
        assert!(matches!(
            election_error(ElectionError::Stopped),
            Error::Closed
        ));
        let rejected = election_error(ElectionError::Rejected(
            fleetcoord_sm::RpcError::PermissionDenied("etcdserver: permission denied".into()),
        ));
        assert_eq!(
            rejected.to_string(),
            Error::rpc(fleetcoord_sm::RpcError::PermissionDenied(
                "etcdserver: permission denied".into()
            ))
            .to_string()
        );
        match election_error(ElectionError::Busy) {
            Error::Etcd { kind, message, .. } => {
                assert_eq!(kind, ErrorKind::Unexpected);
                assert!(message.contains("Busy"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
