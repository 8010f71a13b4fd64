//! [`Election`]: leader election on a name, compatible with Go's
//! `clientv3/concurrency` and `etcdctl elect`.

// This file is the facade: the public election types and what each call
// asks of the machine. Each other job has its own file: the options
// (options.rs), numbering operations and routing their answers (ops.rs),
// what the driver does with each notice (notices.rs), belief in a
// leadership (belief.rs), and the other public types (leadership.rs,
// observer.rs, pool.rs, mutex.rs).

use crate::driver::{rand_seed, Gone, Notify};
use crate::error::{Error, ErrorKind, Result};
use crate::etcd::Etcd;
use crate::session::{close_outcome, ATTEMPT_TIMEOUT, CLOSE_WAIT};
use crate::validate;
use belief::Belief;
use fleetcoord_sm::election::{
    hand_over_request_key, leader_query, leader_value_query, Election as ElectionMachine,
    ElectionConfig, ElectionError, ElectionInput, ElectionNotice, OpId, Rank,
};
use fleetcoord_sm::keepalive::LivenessState;
use fleetcoord_sm::{BackoffConfig, KeyValue, Response};
use notices::{handle_notice, resign_unwanted, State};
use ops::{Ops, Outcome, Turn};
use options::election_prefix;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod belief;
mod leadership;
mod lock_options;
pub(crate) mod mutex;
mod notices;
mod observer;
mod ops;
mod options;
mod pending;
mod pool;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

pub use leadership::Leadership;
use leadership::Won;
pub use lock_options::LockOptions;
pub use observer::LeaderObserver;
pub use options::{ElectionOptions, DEFAULT_ELECTION_PREFIX};
pub use pending::{Canceller, Pending};
pub use pool::ElectionPool;

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
///   [`SessionOptions::safety_margin`](crate::SessionOptions::safety_margin) before etcd can expire the lease and
///   let the next one in. This holds while the leader's clock runs no
///   slower than [`SessionOptions::drift_allowance_ppm`](crate::SessionOptions::drift_allowance_ppm) permits relative
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
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
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
    ops: Ops<ElectionMachine>,
    state: Arc<Mutex<State>>,
    /// How campaigns join: `None` plain, else ranked.
    rank: Option<Rank>,
    /// Its contention metrics, under its bounded label.
    contention: crate::metrics::Contention,
    /// [`Election::close`] was called: calls fail with [`Error::Closed`].
    closed: AtomicBool,
    /// Its place on a shared session, if it runs on one (taken when the
    /// close is done, which frees its name on the session).
    attachment: Mutex<Option<crate::session::Attachment>>,
    /// Whether it runs on a shared session.
    shared: bool,
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
        crate::blocking::check()?;
        Self::with_options(etcd, name, ElectionOptions::default())
    }

    /// Join the election `name` (one key segment, see "Names" on
    /// [`Election::new`]). Starts the session at once; campaigns wait for
    /// it.
    pub fn with_options(etcd: &Etcd, name: &str, options: ElectionOptions) -> Result<Election> {
        crate::blocking::check()?;
        Self::with_permits(etcd, name, options, 1)
    }

    /// Join the election `name` on `session`: the candidate key is bound
    /// to the session's lease (`<prefix><name>/<session lease in hex>`, as
    /// Go's `concurrency.NewElection(session, ...)`), and no lease of its
    /// own is granted or renewed. The session's lease settings apply; the
    /// TTL, safety margin and drift allowance of `options` are ignored.
    ///
    /// A lost session lease ends the leadership at once (as every
    /// leadership on the session); a waiting campaign joins the queue again
    /// on the session's next lease. [`Election::close`] deletes this
    /// candidate's key and leaves the session running;
    /// [`Session::close`](crate::Session::close) ends this election too.
    /// A second primitive on the same session with the same key prefix is
    /// refused with [`Error::InvalidArgument`]: both would use one key.
    pub fn with_session(
        session: &crate::Session,
        name: &str,
        options: ElectionOptions,
    ) -> Result<Election> {
        Self::open(session.etcd(), Some(session), name, options, 1, None)
    }

    /// [`Election::with_options`] where `permits` candidates hold at once
    /// (the [`Semaphore`](crate::Semaphore)'s machinery; 1 is the election).
    pub(crate) fn with_permits(
        etcd: &Etcd,
        name: &str,
        options: ElectionOptions,
        permits: u32,
    ) -> Result<Election> {
        Self::open(etcd, None, name, options, permits, None)
    }

    /// The election, on its own session or on `session`; with `rw`, one
    /// side of the read-write lock whose root is `<prefix><name>/` (its
    /// keys, metrics and place on the session are those of the side's
    /// directory, `<root>read/` or `<root>write/`).
    pub(crate) fn open(
        etcd: &Etcd,
        session: Option<&crate::Session>,
        name: &str,
        options: ElectionOptions,
        permits: u32,
        rw: Option<fleetcoord_sm::election::RwRole>,
    ) -> Result<Election> {
        crate::blocking::check()?;
        let options_permits = permits.max(1);
        let prefix = election_prefix(name, &options)?;
        let place = match rw {
            None => prefix.clone(),
            Some(fleetcoord_sm::election::RwRole::Read) => format!("{prefix}read/"),
            Some(fleetcoord_sm::election::RwRole::Write) => format!("{prefix}write/"),
        };
        let rank = options.rank();
        let (ttl, safety_margin, drift_allowance_ppm) = match session {
            Some(session) => {
                if session.is_closed() {
                    return Err(Error::Closed);
                }
                let o = session.options();
                (o.ttl, o.safety_margin, o.drift_allowance_ppm)
            }
            None => (
                options.session.ttl,
                options.session.safety_margin,
                options.session.drift_allowance_ppm,
            ),
        };
        validate::ttl("ttl", ttl)?;
        validate::trust(ttl, safety_margin, drift_allowance_ppm)?;
        let config = ElectionConfig {
            prefix: prefix.clone().into_bytes(),
            ttl_secs: ttl.as_secs() as i64,
            backoff: BackoffConfig::default(),
            safety_margin,
            drift_allowance_ppm,
            attempt_timeout: ATTEMPT_TIMEOUT.min(etcd.options().request_timeout),
            // For `session_trusted_until`: one notice per renewal.
            announce_session_trust: true,
            permits: options_permits,
            rw,
        };
        let machine = match session {
            Some(_) => ElectionMachine::on_session(config, Instant::now(), rand_seed(), 0),
            None => {
                let mut machine = ElectionMachine::new(config, Instant::now(), rand_seed());
                machine.set_session_renewal_grid(Some(etcd.renewal_grid()));
                machine
            }
        };
        let state = Arc::new(Mutex::new(State::default()));
        let handler_state = state.clone();
        let (router, routes) = ops::routes();
        // A read-write lock's sides count apart (their keys' places).
        let contention = crate::metrics::Contention::new(&place);
        let recorder = contention.clone();
        // Since when the leadership of this token is held, for its hold
        // time: the notices come in order on one thread.
        let mut held_since: Option<(i64, Instant)> = None;
        // Where the machine's requests for the shared lease go (taken
        // before the election's own state is locked: the session locks
        // every primitive's state to end its beliefs).
        let requests_to = session.cloned();
        let machine = etcd.run(
            machine,
            Notify(move |notice| {
                if let ElectionNotice::SessionRequest(request) = notice {
                    if let Some(session) = &requests_to {
                        session.request(request);
                    }
                    return true;
                }
                match &notice {
                    ElectionNotice::Elected { token, .. } => {
                        held_since = Some((*token, Instant::now()));
                        recorder.transition("elected", *token)
                    }
                    ElectionNotice::LeadershipLost { token } => {
                        if let Some((_, since)) = held_since.take_if(|(t, _)| t == token) {
                            recorder.held(since.elapsed());
                        }
                        recorder.transition("lost", *token)
                    }
                    ElectionNotice::Resigned { token }
                    | ElectionNotice::HandedOver { token, .. } => {
                        if let Some((_, since)) = held_since.take_if(|(t, _)| t == token) {
                            recorder.held(since.elapsed());
                        }
                        recorder.transition("resigned", *token)
                    }
                    // The machine's word: another candidate leads (or holds
                    // every permit), and the try's key is withdrawn.
                    ElectionNotice::NotElected { .. } => recorder.refused(),
                    _ => {}
                }
                handle_notice(&handler_state, &router, notice);
                true
            }),
        )?;
        {
            let mut state = state.lock();
            state.resigner = Some(machine.downgrade());
            state.holdings = Some(etcd.holdings().clone());
        }
        let attachment = match session {
            Some(session) => {
                let input = machine.downgrade();
                let beliefs = state.clone();
                Some(session.attach(
                    &place,
                    move |fact| input.send(ElectionInput::Session(fact)).is_ok(),
                    move |lease, for_good| {
                        notices::end_on_session(&mut beliefs.lock(), lease, for_good)
                    },
                    crate::session::Departure::end(&machine),
                )?)
            }
            None => None,
        };
        Ok(Election {
            inner: Arc::new(Inner {
                etcd: etcd.clone(),
                prefix,
                ops: Ops::new(machine, routes),
                state,
                rank,
                contention,
                closed: AtomicBool::new(false),
                shared: attachment.is_some(),
                attachment: Mutex::new(attachment),
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
        crate::blocking::check()?;
        current_leader(etcd, &election_prefix(name, options)?)
    }

    /// Stream the leader of election `name` without joining it; see
    /// [`Election::observe`].
    pub fn observe_of(
        etcd: &Etcd,
        name: &str,
        options: &ElectionOptions,
    ) -> Result<LeaderObserver> {
        crate::blocking::check()?;
        LeaderObserver::start(etcd, &election_prefix(name, options)?)
    }

    /// Ask the leader of election `name` to hand over to the waiting
    /// candidate `to` (its key or value), without joining: writes one
    /// request key beside the election (outside the candidate prefix). A
    /// leader that accepts requests (`fleetcoord elect
    /// --accept-hand-over`, or a program polling
    /// [`Leadership::hand_over_requested`]) stops what it runs as leader,
    /// then calls [`Leadership::hand_over`] and removes the request. This
    /// never deletes a candidate key itself, so no leader is deposed while
    /// it may still act. See [`Election::withdraw_hand_over_request`].
    pub fn request_hand_over(
        etcd: &Etcd,
        name: &str,
        options: &ElectionOptions,
        to: &[u8],
    ) -> Result<()> {
        crate::blocking::check()?;
        if to.is_empty() {
            return Err(Error::invalid("to", "must not be empty"));
        }
        validate::payload("to", to)?;
        let prefix = election_prefix(name, options)?;
        // A refusal of an earlier request must not answer this one.
        etcd.request(fleetcoord_sm::Request::Delete(
            fleetcoord_sm::KeyRange::Key(fleetcoord_sm::election::hand_over_refusal_key(
                prefix.as_bytes(),
            )),
        ))?;
        etcd.request(fleetcoord_sm::Request::Put {
            key: hand_over_request_key(prefix.as_bytes()),
            value: to.to_vec(),
            lease: 0,
        })?;
        Ok(())
    }

    /// Why the leader of election `name` refused the last
    /// [`Election::request_hand_over`] ([`Leadership::refuse_hand_over`]),
    /// or `None` while no refusal is recorded: one linearizable read,
    /// without joining. Refusals are removed by the next request, by
    /// [`Election::withdraw_hand_over_request`], and with the session of
    /// the leader that wrote them.
    pub fn hand_over_refusal(
        etcd: &Etcd,
        name: &str,
        options: &ElectionOptions,
    ) -> Result<Option<String>> {
        crate::blocking::check()?;
        let prefix = election_prefix(name, options)?;
        let key = fleetcoord_sm::election::hand_over_refusal_key(prefix.as_bytes());
        let read = fleetcoord_sm::RangeRequest::all(fleetcoord_sm::KeyRange::Key(key));
        match etcd.request(fleetcoord_sm::Request::Range(read))? {
            Response::Range { kvs, .. } => Ok(kvs
                .first()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())),
            other => Err(Error::unexpected(other)),
        }
    }

    /// Remove a request of [`Election::request_hand_over`] (done or not),
    /// and the leader's refusal of it if there is one.
    pub fn withdraw_hand_over_request(
        etcd: &Etcd,
        name: &str,
        options: &ElectionOptions,
    ) -> Result<()> {
        crate::blocking::check()?;
        let prefix = election_prefix(name, options)?;
        etcd.request(fleetcoord_sm::Request::Delete(
            fleetcoord_sm::KeyRange::Key(hand_over_request_key(prefix.as_bytes())),
        ))?;
        etcd.request(fleetcoord_sm::Request::Delete(
            fleetcoord_sm::KeyRange::Key(fleetcoord_sm::election::hand_over_refusal_key(
                prefix.as_bytes(),
            )),
        ))?;
        Ok(())
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
    /// (permission denied), and with [`Error::Closed`] once
    /// [`Election::close`], [`ElectionPool::close`] or
    /// [`Etcd::close`] is called, also from another thread while this one
    /// waits (it returns within milliseconds, its key removed with the
    /// session's revoke). To wait in slices, or be canceled from another
    /// thread without closing, see [`Election::start_campaign`].
    ///
    /// A campaign asked while a [`Leadership`] of this election is still
    /// held ([`Leadership::is_held`]) fails at once with
    /// [`Error::InvalidArgument`] naming `"campaign"`: resign or drop it
    /// first. One asked the instant that leadership ends (its `lost()`
    /// fired, or `is_held` turned false, before the driver has reported the
    /// loss) is not refused: it waits for the loss and queues on the
    /// session's next lease.
    ///
    /// [`HostLiveness`]: crate::HostLiveness
    pub fn campaign(&self, value: &[u8]) -> Result<Leadership> {
        crate::blocking::check()?;
        self.campaign_inner(value, None)
    }

    /// [`Election::campaign`], giving up after `timeout`: returns
    /// [`Error::Timeout`] at the deadline, whatever etcd does (or, on a
    /// session of the election's own whose lease grants etcd refused for
    /// want of space meanwhile, an error of kind
    /// [`ErrorKind::NoSpace`](crate::ErrorKind::NoSpace) that says so), and the
    /// driver removes the candidate key in the background (retrying until
    /// etcd confirms, or the session ends and the key with it), so a
    /// candidate that gave up never holds the queue. A campaign started
    /// while that removal is still going waits for it. Any duration is
    /// accepted; one too long to add to the current time (such as
    /// `Duration::MAX`) means no timeout, as in [`Election::campaign`].
    pub fn campaign_timeout(&self, value: &[u8], timeout: Duration) -> Result<Leadership> {
        crate::blocking::check()?;
        self.campaign_inner(value, Some(timeout))
    }

    fn campaign_inner(&self, value: &[u8], timeout: Option<Duration>) -> Result<Leadership> {
        validate::payload("value", value)?;
        let turn = self.inner.campaign_turn()?;
        let value = value.to_vec();
        let rank = self.inner.rank;
        let started = Instant::now();
        let outcome = self.inner.call(
            &turn,
            |op| match rank {
                Some(rank) => ElectionInput::CampaignRanked { op, value, rank },
                None => ElectionInput::Campaign { op, value },
            },
            timeout,
            |notice| match notice {
                ElectionNotice::Elected {
                    token,
                    lease,
                    key,
                    waited,
                    attempts,
                    ..
                } => {
                    let won = Won {
                        waited: started.elapsed(),
                        contended: waited,
                        attempts,
                    };
                    Some(Ok(self.leadership(won, token, lease, key)))
                }
                ElectionNotice::CampaignFailed { error, .. } => Some(Err(
                    election_error(error).with_endpoints(self.inner.etcd.endpoints())
                )),
                _ => None,
            },
        )?;
        match outcome {
            Outcome::Answered(answer) => answer,
            Outcome::TimedOut { op, unread } => {
                self.inner.give_up(op, unread);
                Err(self.inner.campaign_timed_out(timeout.unwrap_or_default()))
            }
        }
    }

    /// Become leader only if nobody else leads; never waits for other
    /// candidates. It may wait for the session to be granted, at most three
    /// request timeouts, then fails with [`Error::Timeout`] leaving nothing
    /// behind.
    pub fn try_campaign(&self, value: &[u8]) -> Result<TryCampaign> {
        crate::blocking::check()?;
        validate::payload("value", value)?;
        let turn = self.inner.campaign_turn()?;
        let value = value.to_vec();
        let bound = self.inner.etcd.options().request_timeout.saturating_mul(3);
        let started = Instant::now();
        let outcome = self.inner.call(
            &turn,
            |op| ElectionInput::TryCampaign { op, value },
            Some(bound),
            |notice| match notice {
                ElectionNotice::Elected {
                    token,
                    lease,
                    key,
                    attempts,
                    ..
                } => {
                    // A try never waits behind anyone.
                    let won = Won {
                        waited: started.elapsed(),
                        contended: false,
                        attempts,
                    };
                    Some(Ok(TryCampaign::Elected(
                        self.leadership(won, token, lease, key),
                    )))
                }
                ElectionNotice::NotElected { leader, .. } => Some(Ok(TryCampaign::NotElected(
                    leader.as_ref().map(LeaderInfo::from_kv),
                ))),
                ElectionNotice::CampaignFailed { error, .. } => Some(Err(
                    election_error(error).with_endpoints(self.inner.etcd.endpoints())
                )),
                _ => None,
            },
        )?;
        match outcome {
            Outcome::Answered(answer) => answer,
            Outcome::TimedOut { op, unread } => {
                self.inner.give_up(op, unread);
                Err(self.inner.campaign_timed_out(bound))
            }
        }
    }

    /// The current leader, read from etcd (one linearizable read).
    pub fn leader(&self) -> Result<Option<LeaderInfo>> {
        crate::blocking::check()?;
        current_leader(&self.inner.etcd, &self.inner.prefix)
    }

    /// Stream the leader of this election: the current one first, then every
    /// change, `None` when no candidate remains.
    pub fn observe(&self) -> Result<LeaderObserver> {
        crate::blocking::check()?;
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

    /// Until when this candidate's session is trusted: the local deadline
    /// of its lease as of the last answered renewal, which passes before
    /// etcd can let the lease expire. It moves forward at every answered
    /// renewal (about every third of the TTL), leading or waiting; `None`
    /// unless the session is `Registered` or `Suspended`. While leading,
    /// [`Leadership::is_held`] turns false at the same instant.
    ///
    /// For a watchdog: while it keeps moving, this process renews its
    /// session; `fleetcoord elect` and `lock` tell systemd `WATCHDOG=1`
    /// each time it moves.
    pub fn session_trusted_until(&self) -> Option<Instant> {
        let state = self.inner.state.lock();
        let lease = match state.session.as_ref()? {
            LivenessState::Registered { lease } | LivenessState::Suspended { lease } => *lease,
            _ => return None,
        };
        match state.session_trust {
            Some((trusted, until)) if trusted == lease => Some(until),
            _ => None,
        }
    }

    /// Leave the election: stop leading or campaigning and revoke the
    /// session lease (which deletes the candidate key). Waits until etcd
    /// confirmed the revoke; an error means the lease will instead expire
    /// after its TTL. Outstanding [`Leadership`]s report `is_held() == false`.
    ///
    /// Takes `&self`, so one thread can end what another waits on: a
    /// campaign or [`Pending`] wait in another thread returns
    /// [`Error::Closed`] at once (before the revoke is confirmed), and so
    /// does every later call on this election. Closing again is harmless.
    pub fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        self.begin_close();
        self.wait_closed()
    }

    /// Ask the session to stop without waiting (see [`Election::close`]).
    pub(crate) fn begin_close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.stop();
    }

    /// Wait for a stop asked for earlier to be confirmed.
    pub(crate) fn wait_closed(&self) -> Result<()> {
        let finished = self.inner.ops.machine().wait_finished(CLOSE_WAIT);
        let revoked = match self.inner.state.lock().session {
            // On a shared session the lease is the session's to revoke:
            // this election's stop deleted its keys (or gave the lease up).
            Some(LivenessState::Stopped { .. }) if self.inner.shared => Some(true),
            Some(LivenessState::Stopped { revoked }) => Some(revoked),
            _ => None,
        };
        if finished.is_ok() {
            // Its keys are gone: the name is free on the session again.
            self.inner.attachment.lock().take();
        }
        close_outcome(
            finished,
            revoked,
            || self.inner.etcd.gone(),
            self.inner.etcd.endpoints(),
        )
    }

    fn leadership(&self, won: Won, token: i64, lease: i64, key: Vec<u8>) -> Leadership {
        leadership_of(&self.inner, won, token, lease, key)
    }
}

/// The [`Leadership`] the machine reported as won with `token`, as the
/// notice handler registered it (or one that says it is over, when it was
/// lost again before the caller got here).
fn leadership_of(inner: &Arc<Inner>, won: Won, token: i64, lease: i64, key: Vec<u8>) -> Leadership {
    inner.contention.won(won.waited, won.contended);
    let (belief, lost, step_down) = {
        let state = inner.state.lock();
        match state.held.as_ref().filter(|h| h.token == token) {
            Some(h) => (h.belief.clone(), h.lost_rx.clone(), h.step_down_rx.clone()),
            None => {
                // Lost again before we got here: hand out a leadership
                // that says so.
                let (tx, rx) = crossbeam_channel::bounded(1);
                let _ = tx.send(());
                (Arc::new(Belief::over()), rx, crossbeam_channel::never())
            }
        }
    };
    Leadership {
        inner: inner.clone(),
        won,
        token,
        lease,
        key: String::from_utf8_lossy(&key).into_owned(),
        belief,
        lost,
        step_down,
        resigned: false,
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

impl Inner {
    /// The error of a campaign that waited `bound` in vain: etcd out of
    /// space when that is why the session has no lease (its grants were
    /// refused for it: [`ErrorKind::NoSpace`](crate::ErrorKind::NoSpace),
    /// naming the election), else [`Error::Timeout`].
    fn campaign_timed_out(&self, bound: Duration) -> Error {
        let failure = self.state.lock().grant_failure.clone();
        Error::no_lease_within(
            format_args!("campaigning in election {:?}: its session", self.prefix),
            bound,
            failure,
            self.etcd.endpoints(),
        )
    }

    /// [`Ops::call`], with a machine that ended reported as this handle's
    /// error ([`Error::Closed`] after a close, else [`Error::DriverGone`]).
    fn call<T>(
        &self,
        turn: &Turn<'_>,
        make_input: impl FnOnce(OpId) -> ElectionInput,
        timeout: Option<Duration>,
        answer: impl FnMut(ElectionNotice) -> Option<T>,
    ) -> Result<Outcome<T, ElectionNotice>> {
        self.ops
            .call(turn, make_input, timeout, answer)
            .map_err(|Gone| self.gone())
    }

    /// The error for a machine that ended: [`Error::Closed`] after
    /// [`Election::close`], else what the [`Etcd`] handle says.
    fn gone(&self) -> Error {
        let session_closed = self
            .attachment
            .lock()
            .as_ref()
            .is_some_and(|a| a.session().is_closed());
        if self.closed.load(Ordering::SeqCst) || session_closed {
            Error::Closed
        } else {
            self.etcd.gone()
        }
    }

    fn stop(&self) {
        self.ops.machine().stop();
    }

    /// After campaign `op` timed out: cancel it without waiting. The
    /// machine withdraws the key on its own (resending the delete until
    /// etcd confirms it), and resigns a win that crossed the cancel; a late
    /// answer goes to nobody, since the call unregistered `op`:
    /// `handle_notice` then resigns a late `Elected` too. One among the
    /// `unread` answers that reached the call is resigned here.
    fn give_up(&self, op: OpId, unread: Vec<ElectionNotice>) {
        let _ = self
            .ops
            .machine()
            .send(ElectionInput::CancelCampaign { op });
        for notice in unread {
            if let ElectionNotice::Elected { token, .. } = notice {
                resign_unwanted(&mut self.state.lock(), token);
            }
        }
    }

    /// Resign the leadership `token` and wait for the answer, at most the
    /// request timeout: past it the machine goes on deleting the key (it
    /// resends the delete until etcd confirms it or the session ends), and
    /// the caller gets [`Error::Timeout`].
    /// etcd refused a write fenced on the leadership `token`: its key is
    /// gone. The leadership ends here, on the caller's thread, before the
    /// call that saw the refusal returns (`is_held` false, `lost()` fired);
    /// the machine is told so that it stops leading too, as its own watch
    /// would have told it, possibly later.
    fn fence_refused(&self, token: i64) {
        self.contention.fence_refused();
        notices::lose(&mut self.state.lock(), token);
        // Gone: the election is closing, and its stop ends the leadership.
        let _ = self
            .ops
            .machine()
            .send(ElectionInput::FenceRefused { token });
    }

    fn resign(&self, turn: &Turn<'_>, token: i64) -> Result<()> {
        let bound = self.etcd.options().request_timeout;
        let outcome = self.call(
            turn,
            // A resign carries no operation id: its answer names the token.
            |_| ElectionInput::Resign { token },
            Some(bound),
            |notice| match notice {
                // A dropped handle's resign may be answered here too.
                ElectionNotice::Resigned { token: t } if t == token => Some(()),
                _ => None,
            },
        )?;
        match outcome {
            Outcome::Answered(()) => Ok(()),
            Outcome::TimedOut { .. } => Err(Error::Timeout(bound)),
        }
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
        ElectionError::NoSuchCandidate => Error::invalid(
            "to",
            "no waiting candidate of this election has that key or value \
             (or it left before the hand-over); the leadership is kept",
        ),
        ElectionError::NotRanked(key) => Error::invalid(
            "to",
            format!(
                "candidate {} waits ahead of the target but joined without a priority \
                 (it may be a Go or etcdctl client, which would not notice losing its place); \
                 nothing was changed and the leadership is kept",
                String::from_utf8_lossy(&key)
            ),
        ),
        ElectionError::TooManyAhead => Error::invalid(
            "to",
            "more candidates wait ahead of the target than one etcd transaction can move; \
             the leadership is kept",
        ),
        ElectionError::NotWithPermits => Error::invalid(
            "priority",
            "priorities and hand-overs order a single leader; a semaphore refuses them",
        ),
        // A proclaim or hand-over asked while an earlier one, which timed
        // out for its caller, is still waiting for etcd's answer (the
        // machine goes on sending it). Campaigns never meet it: one runs
        // at a time, and one asked while the machine still leads waits for
        // that leadership to end.
        ElectionError::Busy => Error::etcd(
            ErrorKind::Unavailable,
            "an earlier proclaim or hand-over of this leadership timed out and is \
             still waiting for etcd's answer; try again once it is answered",
        ),
        // Every answer the machine gives today is named above; one added
        // later is this library's gap, not etcd's failure, and says so.
        other => Error::etcd(
            ErrorKind::Unexpected,
            format!(
                "the election machine answered {other:?}, which this facade does not \
                 name (a fleetcoord bug; please report it)"
            ),
        ),
    }
}

/// How often [`current_leader`] names a leader whose key is gone before
/// its value is read, before it gives up: only a queue changing leader
/// faster than two reads exhausts it.
const LEADER_READ_ATTEMPTS: usize = 8;

/// The first-created key under `prefix`, i.e. the leader, with its value.
/// Two reads that each cost etcd a bounded amount whatever the queue's
/// length: the leader's key (keys only), then its value by a point read;
/// the pair is the leader's as long as the create revision matches,
/// otherwise the leadership moved in between and the lookup starts again.
pub(crate) fn current_leader(etcd: &Etcd, prefix: &str) -> Result<Option<LeaderInfo>> {
    for _ in 0..LEADER_READ_ATTEMPTS {
        let leader = match etcd.request(leader_query(prefix.as_bytes()))? {
            Response::Range { kvs, .. } => kvs.into_iter().next(),
            other => return Err(Error::unexpected(other)),
        };
        let Some(leader) = leader else {
            return Ok(None);
        };
        let read = match etcd.request(leader_value_query(&leader.key))? {
            Response::Range { kvs, .. } => kvs.into_iter().next(),
            other => return Err(Error::unexpected(other)),
        };
        if let Some(kv) = read.filter(|kv| kv.create_revision == leader.create_revision) {
            return Ok(Some(LeaderInfo::from_kv(&kv)));
        }
    }
    Err(Error::etcd(
        ErrorKind::Unavailable,
        "the election's leader changed between every read of its key and of its value; try again",
    )
    .with_endpoints(etcd.endpoints()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Never the opaque `election: Busy` of a request etcd failed.
        let busy = election_error(ElectionError::Busy);
        assert_eq!(busy.kind(), ErrorKind::Unavailable);
        assert!(busy.is_retryable());
        assert!(busy.to_string().contains("still waiting"), "{busy}");
    }
}
