//! [`Session`]: one lease shared by a process's primitives, as Go's
//! `concurrency.Session` lets elections, mutexes and semaphores share one.

use super::{
    close_outcome, LivenessState, ATTEMPT_TIMEOUT, CLOSE_WAIT, DEFAULT_DRIFT_ALLOWANCE_PPM,
    DEFAULT_SAFETY_MARGIN,
};
use crate::driver::{rand_seed, Finished, MachineHandle, Notify, WeakInput};
use crate::error::{Error, ErrorKind, Result};
use crate::etcd::Etcd;
use crate::resume::{HostResume, SessionResume};
use crate::validate;
use fleetcoord_sm::keepalive::{
    self as sm, Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice, ResumePoint,
};
use fleetcoord_sm::session::{
    AttachError, DetachError, HubCommand, MemberId, SessionHub, SessionInput, SessionRequest,
};
use fleetcoord_sm::{BackoffConfig, LeaseId, Machine};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// State changes kept for a reader that does not keep up.
const MAX_QUEUED_STATES: usize = 1024;

/// The lease settings of a session: [`Session::with_options`].
///
/// Start from [`SessionOptions::default`] and change what you need with the
/// `with_*` methods. `#[non_exhaustive]` so that new settings are not a
/// breaking change.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionOptions {
    /// Lease TTL: how long after this process dies (or is cut off) etcd
    /// frees what it holds. Whole seconds, at least 1 s. Default 10 s.
    pub ttl: Duration,
    /// How long before etcd can expire the lease this process stops
    /// believing in it (every leadership and lock on it ends). At most half
    /// of the TTL less the drift allowance. Default 250 ms.
    pub safety_margin: Duration,
    /// How much slower than etcd's clock this host's clock may run, in
    /// parts per million; the lease is trusted for the TTL shortened by
    /// this much (then less the margin). 0 to 100,000. Default 10,000.
    pub drift_allowance_ppm: u32,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: Duration::from_secs(10),
            safety_margin: DEFAULT_SAFETY_MARGIN,
            drift_allowance_ppm: DEFAULT_DRIFT_ALLOWANCE_PPM,
        }
    }
}

impl SessionOptions {
    /// These options with [`SessionOptions::ttl`] set.
    #[must_use]
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// These options with [`SessionOptions::safety_margin`] set.
    #[must_use]
    pub const fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }

    /// These options with [`SessionOptions::drift_allowance_ppm`] set.
    #[must_use]
    pub const fn with_drift_allowance_ppm(mut self, ppm: u32) -> Self {
        self.drift_allowance_ppm = ppm;
        self
    }

    /// How long a session with these settings trusts its lease after the
    /// send of its last acknowledged renewal: the TTL shortened by the
    /// drift allowance, less the safety margin. Every primitive's belief
    /// (a leadership, a lock, an owned shard) lasts at most this long
    /// without an answered renewal.
    pub fn trusted_lifetime(&self) -> Duration {
        fleetcoord_sm::keepalive::trusted_lifetime(
            self.ttl,
            self.safety_margin,
            self.drift_allowance_ppm,
        )
    }

    /// Checks every setting, naming the first one out of range.
    pub(crate) fn validate(&self) -> Result<()> {
        validate::ttl("ttl", self.ttl)?;
        validate::trust(self.ttl, self.safety_margin, self.drift_allowance_ppm)
    }
}

/// One lease, kept alive in the background, that elections, pools,
/// mutexes, semaphores (`with_session` on each) and shard maps
/// ([`ShardMap::with_session`](crate::ShardMap::with_session))
/// of this process share:
/// etcd then renews one lease for all of them instead of one each.
///
/// Guarantees:
/// * Self-healing as every session: renewals that fail are retried on the
///   same lease until its local deadline (which passes at least
///   [`SessionOptions::safety_margin`] before etcd can expire it); past
///   it, or when etcd says the lease is gone, a new lease is granted with
///   backoff. Each step is reported on [`Session::states`].
/// * **One fate.** A lost lease ends every leadership and lock on the
///   session at once: each one's `is_held()` turns false and its `lost()`
///   fires before this process acts on a new lease, and no later than the
///   local deadline whatever the driver does. Campaigns and acquires still
///   waiting join their queues again on the next lease.
/// * **One key per name.** Keys stay compatible with Go and `etcdctl`:
///   `<prefix><name>/<lease in hex>`, the lease being the session's. Two
///   primitives on one session with the same key prefix would share a key,
///   so the second is refused with [`Error::InvalidArgument`].
/// * A primitive that cannot delete one of its keys (see the election's
///   liveness rules) gives the *shared* lease up: everything on the session
///   starts over on a new lease, as after a loss.
/// * [`Session::close`] ends every primitive on it (calls on them fail with
///   [`Error::Closed`], beliefs end first), then revokes the lease, which
///   deletes every key on it. Dropping the last handle of the session and
///   of every primitive on it does the same without waiting.
/// * **A restart need not be a flap.** [`Session::detach`] ends every
///   leadership, lock and shard ownership on it (deleting their keys) and
///   hands the lease, with the host registrations on it, to the next
///   process ([`Session::resume`]): watchers see `Updated` for a restart
///   within the TTL, exactly `Down(_, Expired)` + `Up` past it.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Election, Etcd, EtcdOptions, Mutex, Session};
/// use std::time::Duration;
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let session = Session::new(&etcd, Duration::from_secs(5))?;
/// let election = Election::with_session(&session, "db-primary", Default::default())?;
/// let lock = Mutex::with_session(&session, "backup", Default::default())?;
/// let leadership = election.campaign(b"host-a")?;
/// let guard = lock.lock()?;
/// // One lease for both: etcd renews it once for the whole process.
/// let lease = session.lease().expect("granted");
/// assert_eq!(leadership.lease(), lease);
/// assert!(guard.key().ends_with(&format!("/{lease:x}")));
/// # drop(guard); drop(leadership);
/// session.close()?; // ends both, then revokes the lease
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "dropping every handle of a Session revokes its lease"]
pub struct Session {
    inner: Arc<SessionInner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("state", &self.state())
            .finish()
    }
}

struct SessionInner {
    etcd: Etcd,
    machine: MachineHandle<Keepalive>,
    hub: Arc<Mutex<Hub>>,
    states: crossbeam_channel::Receiver<LivenessState>,
    /// Told the lease handed over by a detach (see `detach`).
    detached: crossbeam_channel::Receiver<ResumePoint>,
    options: SessionOptions,
    closed: AtomicBool,
    /// Set once a detach handed the lease over: a later close has nothing
    /// of this process's to revoke.
    handed_over: AtomicBool,
}

/// What the session's notice handler and the primitives on it share: the
/// sm hub, which decides every order and every end of belief
/// (`fleetcoord_sm::session::hub`), and what executes its commands.
struct Hub {
    sm: SessionHub,
    members: BTreeMap<MemberId, Member>,
    /// The keepalive, for the hub's `Keepalive` commands; set once it runs.
    keepalive: Option<WeakInput<Keepalive>>,
    states_tx: crossbeam_channel::Sender<LivenessState>,
    /// The states' receiving end, to drop the oldest when nobody reads.
    oldest: crossbeam_channel::Receiver<LivenessState>,
    detached_tx: crossbeam_channel::Sender<ResumePoint>,
    /// The lease a resume asked for and the host registrations it carried,
    /// until a `HostLiveness::with_session` takes each over.
    resumed: Option<(i64, Vec<HostResume>)>,
}

/// A primitive on the session, as the hub's commands reach it.
struct Member {
    /// Feeds its machine a session fact; `false` once its machine is gone.
    input: Box<dyn Fn(SessionInput) -> bool + Send>,
    /// Ends every belief of the primitive at once, on the calling thread,
    /// founded on the lease given (marked dead), for good or not (the
    /// hub's `EndBeliefs`).
    end_belief: Box<dyn Fn(Option<LeaseId>, bool) + Send>,
    departure: Departure,
}

/// How a primitive leaves a session that is detached (handed to the next
/// process, [`Session::detach`]).
#[derive(Clone)]
pub(crate) enum Departure {
    /// It ends: its machine is stopped, which on a shared session deletes
    /// its keys (a leadership, a lock, a shard ownership is never handed
    /// over), and `finished` tells when that is done.
    End {
        stop: Arc<dyn Fn() + Send + Sync>,
        finished: crossbeam_channel::Receiver<Finished>,
    },
    /// It is handed over (a host registration): detaches its machine,
    /// waiting until the instant given, and says on which lease its key
    /// stands and how the next process takes it over.
    HandOver(HandOver),
}

/// See [`Departure::HandOver`].
pub(crate) type HandOver = Arc<dyn Fn(Instant) -> Option<(i64, HostResume)> + Send + Sync>;

impl Departure {
    /// A primitive that ends with its machine `machine`.
    pub(crate) fn end<M: Machine + 'static>(machine: &MachineHandle<M>) -> Departure
    where
        M::Input: Send,
    {
        let weak = machine.downgrade();
        Departure::End {
            stop: Arc::new(move || weak.stop()),
            finished: machine.finished().clone(),
        }
    }
}

/// A primitive's place on a session; leaving it frees its key prefix.
pub(crate) struct Attachment {
    session: Session,
    id: MemberId,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut hub = self.session.inner.hub.lock();
        hub.sm.leave(self.id);
        hub.members.remove(&self.id);
    }
}

impl Attachment {
    /// The session this place is on.
    pub(crate) fn session(&self) -> &Session {
        &self.session
    }
}

impl Hub {
    /// Executes every command the sm hub queued, in order, deciding
    /// nothing; returns the members whose machine is gone (they have left
    /// the hub by then).
    fn run(&mut self) -> Vec<MemberId> {
        let mut gone = Vec::new();
        while let Some(command) = self.sm.poll_command() {
            match command {
                HubCommand::EndBeliefs {
                    member,
                    lease,
                    for_good,
                } => {
                    if let Some(m) = self.members.get(&member) {
                        (m.end_belief)(lease, for_good);
                    }
                }
                HubCommand::Tell { member, fact } => {
                    if let Some(m) = self.members.get(&member) {
                        if !(m.input)(fact) {
                            self.members.remove(&member);
                            self.sm.leave(member);
                            gone.push(member);
                        }
                    }
                }
                HubCommand::Keepalive(input) => {
                    // Gone: the session is closing, and its revoke ends
                    // the lease.
                    if let Some(keepalive) = &self.keepalive {
                        let _ = keepalive.send(input);
                    }
                }
                HubCommand::State(state) => {
                    if self.states_tx.len() >= MAX_QUEUED_STATES {
                        let _ = self.oldest.try_recv();
                    }
                    let _ = self.states_tx.send(LivenessState::from_sm(&state));
                }
                HubCommand::Detached(point) => {
                    let _ = self.detached_tx.try_send(point);
                }
            }
        }
        gone
    }
}

/// The error of a detach that could not hand the lease over (see
/// [`Session::detach`]): `why`, and what became of the session.
fn not_handed_over(why: &str) -> Error {
    Error::etcd(
        ErrorKind::Unavailable,
        format!(
            "the session's lease was not handed over: {why}; the session is closed \
             (its lease revoked, or left to expire: watchers see its host Down); start \
             the next process with a new session"
        ),
    )
}

impl Session {
    /// A session whose lease has `ttl` (other settings default). Returns at
    /// once; primitives on it wait for the first lease.
    pub fn new(etcd: &Etcd, ttl: Duration) -> Result<Session> {
        crate::blocking::check()?;
        Self::with_options(etcd, SessionOptions::default().with_ttl(ttl))
    }

    /// A session with every lease setting explicit (checked here:
    /// [`Error::InvalidArgument`] names the first one out of range).
    pub fn with_options(etcd: &Etcd, options: SessionOptions) -> Result<Session> {
        crate::blocking::check()?;
        Self::start(etcd, options, None)
    }

    /// Takes over the lease an earlier process handed over with
    /// [`Session::detach`], so that watchers see no `Down` and no `Up` for
    /// a restart within the TTL. Returns at once, like
    /// [`Session::with_options`]; `options` are this session's from now on
    /// (the lease keeps the TTL it was granted with).
    ///
    /// The lease is first proven alive by one renewal answered with a TTL
    /// above zero, and only then reported `Registered` (until then the
    /// session is `Registering` and primitives on it wait). If it is gone —
    /// expired past its TTL, revoked — a new lease is granted, exactly as
    /// for a new session; if the renewal fails otherwise, the saved lease
    /// (which may still be alive) is revoked in the background and a new
    /// one granted.
    ///
    /// Host registrations on the saved lease are taken over by
    /// [`HostLiveness::with_session`](crate::HostLiveness::with_session)
    /// on this session with the same host id and prefix: its first write is
    /// guarded on the key being as the earlier process left it, so on the
    /// resumed lease the key stays (watchers see at most
    /// [`Updated`](crate::HostEvent::Updated)); if the lease expired, the
    /// key went with it (watchers saw
    /// [`Down(_, Expired)`](crate::DownReason::Expired)) and the host comes
    /// back [`Up`](crate::HostEvent::Up). A saved host that nobody takes
    /// over keeps its key, with its old metadata, for as long as the lease
    /// lives. Leaderships, locks and shard ownerships were never carried:
    /// campaign, lock and join again.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = fleetcoord::testing::EtcdServer::start()?;
    /// use fleetcoord::{Etcd, HostLiveness, LivenessOptions, Session, SessionOptions, SessionResume};
    /// use std::time::Duration;
    ///
    /// let options = SessionOptions::default().with_ttl(Duration::from_secs(5));
    /// let host_id = uuid::Uuid::new_v4();
    /// // The process that stops:
    /// let etcd = Etcd::connect(&[server.endpoint()])?;
    /// let session = Session::with_options(&etcd, options.clone())?;
    /// let host = HostLiveness::with_session(&session, host_id, b"v1", LivenessOptions::default())?;
    /// let saved = session.detach()?.to_string(); // e.g. into a state file
    /// drop(host);
    /// drop(etcd);
    /// // The next process, within the TTL:
    /// let etcd = Etcd::connect(&[server.endpoint()])?;
    /// let saved: SessionResume = saved.parse()?;
    /// let session = Session::resume(&etcd, saved.clone(), options)?;
    /// let host = HostLiveness::with_session(&session, host_id, b"v2", LivenessOptions::default())?;
    /// assert!(host.resumed()); // same lease, same key: watchers saw no Down
    /// assert_eq!(host.lease(), Some(saved.lease));
    /// # host.close()?;
    /// # session.close()?;
    /// # Ok(()) }
    /// ```
    pub fn resume(etcd: &Etcd, resume: SessionResume, options: SessionOptions) -> Result<Session> {
        crate::blocking::check()?;
        Self::start(etcd, options, Some(resume))
    }

    fn start(
        etcd: &Etcd,
        options: SessionOptions,
        resume: Option<SessionResume>,
    ) -> Result<Session> {
        options.validate()?;
        let config = KeepaliveConfig {
            ttl_secs: options.ttl.as_secs() as i64,
            backoff: BackoffConfig::default(),
            safety_margin: options.safety_margin,
            drift_allowance_ppm: options.drift_allowance_ppm,
            attempt_timeout: ATTEMPT_TIMEOUT.min(etcd.options().request_timeout),
            announce_trust: true,
        };
        let mut machine = match &resume {
            Some(r) => Keepalive::resume(
                config,
                Instant::now(),
                rand_seed(),
                0,
                ResumePoint { lease: r.lease },
            ),
            None => Keepalive::new(config, Instant::now(), rand_seed()),
        };
        machine.set_renewal_grid(Some(etcd.renewal_grid()));
        let (detached_tx, detached) = crossbeam_channel::bounded::<ResumePoint>(1);
        let (states_tx, states) = crossbeam_channel::unbounded();
        let hub = Arc::new(Mutex::new(Hub {
            sm: SessionHub::new(),
            members: BTreeMap::new(),
            keepalive: None,
            states_tx,
            oldest: states.clone(),
            detached_tx,
            resumed: resume.map(|r| (r.lease, r.hosts)),
        }));
        let handler_hub = hub.clone();
        let machine = etcd.run(
            machine,
            Notify(move |notice: KeepaliveNotice| {
                let mut hub = handler_hub.lock();
                hub.sm.keepalive(notice);
                hub.run();
                true
            }),
        )?;
        hub.lock().keepalive = Some(machine.downgrade());
        Ok(Session {
            inner: Arc::new(SessionInner {
                etcd: etcd.clone(),
                machine,
                hub,
                states,
                detached,
                options,
                closed: AtomicBool::new(false),
                handed_over: AtomicBool::new(false),
            }),
        })
    }

    /// The latest state of the session's lease.
    pub fn state(&self) -> LivenessState {
        LivenessState::from_sm(self.inner.hub.lock().sm.state())
    }

    /// The lease currently believed alive, if any: the lease id every key
    /// of a primitive on this session is bound to.
    pub fn lease(&self) -> Option<i64> {
        self.inner.hub.lock().sm.lease()
    }

    /// Until when the lease is trusted: its local deadline as of the last
    /// answered renewal, which passes before etcd can expire it. `None`
    /// unless the state is `Registered` or `Suspended`.
    pub fn trusted_until(&self) -> Option<Instant> {
        self.inner.hub.lock().sm.trusted_until()
    }

    /// Every state change of the lease, in order (the newest 1,024 are
    /// kept when nobody reads them). A [`LivenessState::Lost`] here means
    /// every leadership and lock on the session has ended.
    pub fn states(&self) -> &crossbeam_channel::Receiver<LivenessState> {
        &self.inner.states
    }

    /// The settings the lease was made with.
    pub fn options(&self) -> &SessionOptions {
        &self.inner.options
    }

    /// The etcd handle this session runs on.
    pub(crate) fn etcd(&self) -> &Etcd {
        &self.inner.etcd
    }

    /// Whether [`Session::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// End every primitive on the session, then revoke the lease (which
    /// deletes every key on it) and wait until etcd confirmed it; an error
    /// means the lease will instead expire after its TTL. Beliefs end
    /// before the revoke is sent. Primitives on the session answer every
    /// later call with [`Error::Closed`]. Closing again is harmless, and so
    /// is closing after [`Session::detach`] handed the lease over (it is
    /// then the next process's, and left alone).
    pub fn close(&self) -> Result<()> {
        crate::blocking::check()?;
        if self.inner.handed_over.load(Ordering::SeqCst) {
            return Ok(());
        }
        {
            let mut hub = self.inner.hub.lock();
            self.inner.closed.store(true, Ordering::SeqCst);
            hub.sm.close();
            hub.run();
        }
        let finished = self.inner.machine.stop_and_wait(CLOSE_WAIT);
        let revoked = match *self.inner.hub.lock().sm.state() {
            sm::LivenessState::Stopped { revoked } => Some(revoked),
            _ => None,
        };
        close_outcome(
            finished,
            revoked,
            || self.inner.etcd.gone(),
            self.inner.etcd.endpoints(),
        )
    }

    /// Hands the session's lease to the next process instead of revoking
    /// it: what the process calls before it exits to be restarted, so that
    /// watchers see no `Down` (give the result to [`Session::resume`]).
    ///
    /// In order, before it returns:
    /// 1. Every leadership, lock and shard ownership on the session ends
    ///    (`is_held()` false, `lost()` fired), and no new primitive may
    ///    join the session.
    /// 2. Every election, pool, mutex, semaphore and shard map on it stops
    ///    and deletes its keys, as their `close` does; none is carried
    ///    over, so the next process campaigns, locks and joins again.
    ///    Later calls on them fail with [`Error::Closed`].
    /// 3. Every host registration on it
    ///    ([`HostLiveness::with_session`](crate::HostLiveness::with_session))
    ///    stops *without* leaving: its key stays, on the lease, and watchers
    ///    see nothing.
    /// 4. Renewals stop; the lease is left to expire after its TTL unless
    ///    the next process resumes it first.
    ///
    /// Errors:
    /// * [`Error::SessionLost`] (retryable) when the session holds no lease
    ///   at the call (it is being granted, or was just lost and is being
    ///   granted again): nothing is changed, and a detach once the session
    ///   is `Registered` again can succeed.
    /// * [`ErrorKind::Unavailable`] (retryable, with a new session) when
    ///   the lease could not be handed over after all: a primitive could
    ///   not delete its keys within 10 s (handing the lease over would
    ///   carry them; etcd is unreachable, say), or the lease was lost or
    ///   given up meanwhile. The session is closed by then and its lease
    ///   revoked or left to expire (watchers see the host
    ///   `Down(_, Expired)`); start the next process with a new session.
    ///   Returns within about 20 s.
    /// * The refusal itself (e.g. [`ErrorKind::PermissionDenied`]) for a
    ///   session etcd refused for good.
    /// * [`Error::Closed`] for a session closed or detached already.
    pub fn detach(&self) -> Result<SessionResume> {
        crate::blocking::check()?;
        let departures: Vec<Departure> = {
            let mut hub = self.inner.hub.lock();
            let members = match hub.sm.detach() {
                Ok(members) => members,
                Err(DetachError::Closed) => return Err(Error::Closed),
                // For good: no retry gets this session a lease.
                Err(DetachError::Refused(error)) => {
                    return Err(Error::rpc(error).with_endpoints(self.inner.etcd.endpoints()))
                }
                Err(DetachError::NoLease) => return Err(Error::SessionLost),
            };
            self.inner.closed.store(true, Ordering::SeqCst);
            // Nothing on the lease is believed in this process from here
            // on, whoever holds it next.
            hub.run();
            members
                .iter()
                .filter_map(|id| hub.members.get(id).map(|m| m.departure.clone()))
                .collect()
        };
        let deadline = Instant::now() + CLOSE_WAIT;
        for departure in &departures {
            if let Departure::End { stop, .. } = departure {
                stop();
            }
        }
        let ended = departures.iter().all(|departure| match departure {
            // Disconnected: the machine task is gone already.
            Departure::End { finished, .. } => !matches!(
                finished.recv_deadline(deadline),
                Ok(Finished::Abandoned) | Err(crossbeam_channel::RecvTimeoutError::Timeout)
            ),
            Departure::HandOver(_) => true,
        });
        if !ended {
            let _ = self.inner.machine.stop_and_wait(CLOSE_WAIT);
            return Err(not_handed_over(
                "an election, lock or shard map on the session could not delete its keys \
                 within 10 s, and handing the lease over would carry them",
            )
            .with_endpoints(self.inner.etcd.endpoints()));
        }
        let hosts: Vec<(i64, HostResume)> = departures
            .iter()
            .filter_map(|departure| match departure {
                Departure::HandOver(hand_over) => hand_over(deadline),
                Departure::End { .. } => None,
            })
            .collect();
        // Gone: the driver stopped, and the wait below says so.
        let _ = self.inner.machine.send(KeepaliveInput::Detach);
        let point = crossbeam_channel::select! {
            recv(self.inner.detached) -> point => point.ok(),
            recv(self.inner.machine.finished()) -> _ => self.inner.detached.try_recv().ok(),
            default(deadline.saturating_duration_since(Instant::now())) => None,
        };
        let Some(point) = point else {
            // The machine stopped as a close does: the lease was lost, or
            // given up by a primitive that could not delete its keys.
            return Err(not_handed_over(
                "the session's lease was lost or given up while the session was handed over \
                 (a key that could not be deleted gives the lease up)",
            )
            .with_endpoints(self.inner.etcd.endpoints()));
        };
        self.inner.handed_over.store(true, Ordering::SeqCst);
        Ok(SessionResume {
            lease: point.lease,
            ttl: self.inner.options.ttl,
            hosts: hosts
                .into_iter()
                .filter(|(lease, _)| *lease == point.lease)
                .map(|(_, host)| host)
                .collect(),
        })
    }

    /// The saved registration of host key `key`, if this session was
    /// resumed from one that carried it and nobody took it over yet, with
    /// the lease it was saved on.
    pub(crate) fn take_host_resume(&self, key: &str) -> Option<(i64, HostResume)> {
        let mut hub = self.inner.hub.lock();
        let (lease, hosts) = hub.resumed.as_mut()?;
        let at = hosts.iter().position(|h| h.key == key)?;
        Some((*lease, hosts.swap_remove(at)))
    }

    /// Puts a primitive on the session under `key` (its key prefix):
    /// refused while another primitive on it uses the same prefix, or once
    /// the session is closed. `input` feeds its machine; `end_belief` ends
    /// its beliefs at once (on the lease given, for good or not: see
    /// `HubCommand::EndBeliefs`); `departure` is how it leaves a detach.
    /// The current facts are replayed to it first.
    pub(crate) fn attach(
        &self,
        key: &str,
        input: impl Fn(SessionInput) -> bool + Send + 'static,
        end_belief: impl Fn(Option<LeaseId>, bool) + Send + 'static,
        departure: Departure,
    ) -> Result<Attachment> {
        let mut hub = self.inner.hub.lock();
        let id = match hub.sm.attach(key) {
            Ok(id) => id,
            Err(AttachError::Closed) => return Err(Error::Closed),
            Err(AttachError::KeyInUse) => {
                return Err(Error::invalid(
                    "name",
                    format!(
                        "{key} is already used by another primitive on this session: both \
                         would share the key {key}<lease>; use another name or another session"
                    ),
                ))
            }
        };
        hub.members.insert(
            id,
            Member {
                input: Box::new(input),
                end_belief: Box::new(end_belief),
                departure,
            },
        );
        if hub.run().contains(&id) {
            return Err(self.inner.etcd.gone());
        }
        Ok(Attachment {
            session: self.clone(),
            id,
        })
    }

    /// What a primitive's machine asked of the lease, for the hub to
    /// decide (a replace ends every belief on the session first: its
    /// revoke frees every key on it). Never called with a primitive's own
    /// state locked: ending beliefs locks each.
    pub(crate) fn request(&self, request: SessionRequest) {
        let mut hub = self.inner.hub.lock();
        hub.sm.request(request);
        hub.run();
    }
}
