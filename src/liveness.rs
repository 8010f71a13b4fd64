//! [`HostLiveness`]: this host's lease-bound key under the hosts prefix.

use crate::driver::handle::WaitError;
use crate::driver::{rand_seed, Finished, MachineHandle, Notify};
use crate::error::{Error, Result};
use crate::etcd::Etcd;
use crate::resume::{HostResume, Resume};
use crate::session::shared::HandOver;
use crate::session::{
    close_outcome, Departure, LivenessState, SessionOptions, ATTEMPT_TIMEOUT, CLOSE_WAIT,
};
use crate::validate;
use fleetcoord_sm::host::{Host, HostConfig, HostInput, HostNotice};
use fleetcoord_sm::keepalive::{self as sm, KeepaliveConfig};
use fleetcoord_sm::registration::{
    Registration, RegistrationConfig, RegistrationInput, RegistrationNotice, RegistrationPoint,
};
use fleetcoord_sm::session::SessionInput;
use fleetcoord_sm::watch::{incarnation_key, leave_marker_key};
use fleetcoord_sm::BackoffConfig;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// State changes kept for a reader that does not keep up.
const MAX_QUEUED_STATES: usize = 1024;

/// Where hosts register unless told otherwise.
pub const DEFAULT_HOSTS_PREFIX: &str = "/coord/hosts/";

/// Settings for [`HostLiveness::with_options`].
///
/// Start from [`LivenessOptions::default`] and change what you need with the
/// `with_*` methods; the fields are public for reading. `#[non_exhaustive]`
/// so that new settings are not a breaking change.
///
/// ```
/// use fleetcoord::LivenessOptions;
/// use std::time::Duration;
///
/// let options = LivenessOptions::default()
///     .with_prefix("/myapp/hosts/")
///     .with_ttl(Duration::from_secs(3));
/// assert_eq!(options.prefix, "/myapp/hosts/");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LivenessOptions {
    /// Key prefix; the host's key is `<prefix><host id>`, and its leave
    /// marker, written on close, `<prefix><host id>/left`. Must start and end
    /// with `/`. Default [`DEFAULT_HOSTS_PREFIX`].
    pub prefix: String,
    /// The lease settings: TTL, safety margin and clock drift allowance,
    /// as every session has them (default TTL 5 s: how long after this
    /// process dies, or is cut off, the fleet sees it `Down`; etcd may round
    /// a short TTL up, 3.4 grants 1 s as 2 s) ([`SessionOptions`]). The `with_ttl`,
    /// `with_safety_margin` and `with_drift_allowance_ppm` builders set
    /// them here.
    pub session: SessionOptions,
    /// How long [`HostLiveness::with_options`] waits for the first
    /// registration before failing. 1 ms to 24 h. Default 10 s.
    pub register_timeout: Duration,
    /// Also publish [`HostLiveness::incarnation`] as the *incarnation key*
    /// `<prefix><host id>/incarnation`, on the same lease and in the same
    /// transaction as every write of the host key, so that watchers and
    /// `list_hosts` report it as [`crate::HostInfo::incarnation`].
    /// Default `false`: the prefix then holds exactly one key per live
    /// host, what every plain reader of it (`etcdctl get --prefix`, a Go
    /// watcher, an operator counting hosts) assumes, and a replay reads
    /// half the keys. With `true` those readers see a second key per host
    /// (take only keys whose last segment is a UUID as hosts); the counter
    /// itself ([`HostLiveness::incarnation`]) is kept either way.
    pub publish_incarnation: bool,
    /// What to do when the host key is already held on another process's
    /// lease. `false` (the default): never write over it. A crashed
    /// predecessor's key (its lease no longer renewed) is waited for,
    /// [`LivenessState::Waiting`] meanwhile, and the host registers once
    /// etcd expires it; a live duplicate's (its lease renewed past its
    /// TTL) fails the registration with [`Error::DuplicateId`]. `true`:
    /// a *first* registration writes over a live holder's key at once and
    /// revokes the holder's lease (everything bound to it goes, its
    /// elections and locks too if it is a session's), so the displaced
    /// process learns it at its next renewal and ends with
    /// [`LivenessState::Duplicate`] and [`Error::DuplicateId`]. Only for
    /// replacing a running process on purpose; a registration that held
    /// the key once never takes it back.
    pub take_over: bool,
}

impl Default for LivenessOptions {
    fn default() -> Self {
        LivenessOptions {
            prefix: DEFAULT_HOSTS_PREFIX.into(),
            session: SessionOptions::default().with_ttl(Duration::from_secs(5)),
            register_timeout: Duration::from_secs(10),
            publish_incarnation: false,
            take_over: false,
        }
    }
}

impl LivenessOptions {
    /// The checks [`HostLiveness::with_options`] makes of `host_id` and
    /// these options before sending anything (not the nil UUID; the
    /// prefix, the session's TTL and trust settings, the register
    /// timeout), without a connection: `Ok` here means they will not be
    /// refused as [`crate::Error::InvalidArgument`].
    pub fn check(&self, host_id: Uuid) -> crate::Result<()> {
        validate::prefix("prefix", &self.prefix)?;
        self.session.validate()?;
        validate::timeout("register_timeout", self.register_timeout)?;
        if host_id.is_nil() {
            return Err(Error::invalid("host_id", "the nil UUID is not a host id"));
        }
        Ok(())
    }

    /// These options with [`LivenessOptions::prefix`] set (checked by
    /// [`HostLiveness::with_options`]).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with [`LivenessOptions::publish_incarnation`] set:
    /// whether watchers learn the restart counter at the cost of a second
    /// key per host under the prefix.
    #[must_use]
    pub const fn with_published_incarnation(mut self, publish: bool) -> Self {
        self.publish_incarnation = publish;
        self
    }

    /// These options with [`LivenessOptions::take_over`] set: whether a
    /// first registration writes over another live process's key with the
    /// same host id (and revokes its lease) instead of failing with
    /// [`Error::DuplicateId`].
    #[must_use]
    pub const fn with_take_over(mut self, take_over: bool) -> Self {
        self.take_over = take_over;
        self
    }

    /// These options with the lease's TTL ([`SessionOptions::ttl`]) set
    /// (checked by [`HostLiveness::with_options`]).
    #[must_use]
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.session.ttl = ttl;
        self
    }

    /// These options with [`LivenessOptions::register_timeout`] set (1 ms
    /// to 24 h, checked by [`HostLiveness::with_options`]).
    #[must_use]
    pub const fn with_register_timeout(mut self, timeout: Duration) -> Self {
        self.register_timeout = timeout;
        self
    }

    /// These options with the lease's safety margin
    /// ([`SessionOptions::safety_margin`]) set (at most half of the TTL less
    /// the drift allowance, checked by [`HostLiveness::with_options`]): how
    /// long before etcd can expire the lease this host gives it up.
    #[must_use]
    pub const fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.session.safety_margin = margin;
        self
    }

    /// These options with the lease's drift allowance
    /// ([`SessionOptions::drift_allowance_ppm`]) set (at most 100,000,
    /// checked by [`HostLiveness::with_options`]).
    #[must_use]
    pub const fn with_drift_allowance_ppm(mut self, ppm: u32) -> Self {
        self.session.drift_allowance_ppm = ppm;
        self
    }
}

/// This host's registration: a key `<prefix><host id>` holding its metadata,
/// bound to a lease that a background keepalive renews.
///
/// Guarantees:
/// * While the state is [`LivenessState::Registered`], the key exists: the
///   state turns [`LivenessState::Lost`] at a local deadline that passes at
///   least [`SessionOptions::safety_margin`](crate::SessionOptions::safety_margin) before etcd can expire the
///   lease, provided this host's clock runs no slower than
///   [`SessionOptions::drift_allowance_ppm`](crate::SessionOptions::drift_allowance_ppm) allows.
/// * The keepalive heals itself: when renewals fail it retries on the same
///   lease until the local deadline, then (or when etcd says the lease is
///   gone) grants a new lease and writes the key again, with jittered
///   exponential backoff. Each step is reported on [`HostLiveness::states`].
/// * [`HostLiveness::close`] (and `Drop`) announce the leave, then revoke
///   the lease, so watchers see the host
///   [`Down(_, Left)`](crate::DownReason::Left) one round trip after the
///   call instead of `Down(_, Expired)` after the TTL. The announcement is
///   one transaction that writes the *leave marker*
///   `<prefix><host id>/left` (empty value) on the host's lease and deletes
///   the host key at one revision, provided the key is still as this
///   registration wrote it; it is waited for at most 500 ms (less with a
///   shorter request timeout). The revoke follows its answer and removes
///   the marker; if the leave fails or times out the revoke goes ahead
///   anyway and the host reads as `Expired`. A process that dies between
///   the two leaves a marker that expires with the lease. Nothing is ever
///   left behind. A host that never got its key written (still
///   registering) announces nothing.
/// * A host key held on another process's lease is never written over
///   (unless [`LivenessOptions::take_over`]): while that lease lives the
///   state is [`LivenessState::Waiting`]; when etcd expires it (a crashed
///   predecessor) the host registers, within that lease's remaining TTL
///   plus about a second; when it is renewed past its TTL (a live
///   duplicate) registering fails with [`Error::DuplicateId`], and a
///   registration displaced later says [`LivenessState::Duplicate`] and
///   never claims a leave.
/// * [`HostLiveness::detach`] instead hands the registration to the next
///   process ([`HostLiveness::resume`]): nothing is announced or revoked,
///   so a restart within the TTL shows watchers at most an
///   [`Updated`](crate::HostEvent::Updated), and one past it exactly
///   `Down(_, Expired)` and `Up`. Only the registration is carried over,
///   never a leadership or a lock.
///
/// **Dropping** is a graceful leave too: it hands the leave marker and the
/// revoke to the driver and returns at once, also when etcd is unreachable;
/// if the revoke fails the lease expires after its TTL. Closing or dropping the [`Etcd`] handle still lets a pending revoke
/// finish within its grace period, so a process that drops its guards and
/// exits is seen `Down` at once. [`HostLiveness::close`] is the blocking call
/// that reports the outcome.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Etcd, EtcdOptions, HostLiveness, LivenessState};
/// use std::time::Duration;
///
/// let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default())?;
/// let host = HostLiveness::register(&etcd, uuid::Uuid::new_v4(), br#"{"zone":"a"}"#, Duration::from_secs(5))?;
/// assert!(matches!(host.state(), LivenessState::Registered { .. }));
/// host.set_metadata(br#"{"zone":"b"}"#)?;
/// host.close()?; // announces the leave (watchers see Down(_, Left) at once), then revokes
/// # Ok(()) }
/// ```
#[must_use = "dropping a HostLiveness revokes the lease: the host is reported Down at once"]
pub struct HostLiveness {
    host_id: Uuid,
    key: String,
    machine: Engine,
    /// The state and trust, under one lock, so a reader never sees a
    /// trust of one lease beside the state of another.
    status: Arc<Mutex<Status>>,
    states: crossbeam_channel::Receiver<LivenessState>,
    /// Signalled when the leave transaction applied (see `close`).
    left: crossbeam_channel::Receiver<()>,
    /// Told the registration handed over by a detach (see `detach`).
    detached: crossbeam_channel::Receiver<RegistrationPoint>,
    /// Which process of this registration this is (see `incarnation`).
    incarnation: u64,
    /// Whether the registration is a resumed one (see `resumed`).
    resumed: bool,
    ttl: Duration,
    etcd: Etcd,
}

impl std::fmt::Debug for HostLiveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLiveness")
            .field("key", &self.key)
            .field("state", &self.state())
            .finish()
    }
}

impl HostLiveness {
    /// Register `host_id` with `metadata` under the default prefix, with a
    /// lease of `ttl`. Blocks until the key is written (or fails after
    /// [`LivenessOptions::register_timeout`]); a refusal no retry fixes, such
    /// as [`crate::ErrorKind::PermissionDenied`] for a user without a
    /// grant on the prefix, fails at once with that error.
    pub fn register(
        etcd: &Etcd,
        host_id: Uuid,
        metadata: &[u8],
        ttl: Duration,
    ) -> Result<HostLiveness> {
        crate::blocking::check()?;
        Self::with_options(
            etcd,
            host_id,
            metadata,
            LivenessOptions::default().with_ttl(ttl),
        )
    }

    /// [`HostLiveness::register`] with every setting explicit.
    pub fn with_options(
        etcd: &Etcd,
        host_id: Uuid,
        metadata: &[u8],
        options: LivenessOptions,
    ) -> Result<HostLiveness> {
        crate::blocking::check()?;
        Self::start(etcd, host_id, metadata, options, None, 1)
    }

    /// Takes over the registration an earlier process handed over with
    /// [`HostLiveness::detach`], writing `metadata`, so that watchers see
    /// no `Down` and no `Up` for a restart within the TTL: at most an
    /// [`Updated`](crate::HostEvent::Updated) (the key is written again,
    /// on the same lease).
    ///
    /// Resuming proves, before it reports `Registered`, that the lease is
    /// alive (one renewal answered with a TTL above zero) and that the key
    /// is as the earlier process left it: one transaction, guarded on the
    /// key's mod revision being the one in `resume` (a mod revision names
    /// one write, so also one incarnation of the key), writes the new
    /// metadata on the lease. If
    /// anything refuses — the lease expired or was revoked, the key was
    /// deleted, re-created or written by anyone since, or `resume` is for
    /// another key than `options` make (another host id or prefix) — the
    /// host registers afresh, on a new lease, exactly as
    /// [`HostLiveness::with_options`] does (watchers then see the earlier
    /// process's `Down(_, Expired)` when its lease expires, and an `Up`),
    /// and the saved lease, if it may still be alive, is revoked once the
    /// new key is written. [`HostLiveness::resumed`] tells which happened.
    ///
    /// Only the registration is carried over: leaderships, locks and
    /// sessions of the earlier process are never resumed; they end with
    /// their leases.
    pub fn resume(
        etcd: &Etcd,
        resume: Resume,
        metadata: &[u8],
        options: LivenessOptions,
    ) -> Result<HostLiveness> {
        crate::blocking::check()?;
        let key = format!("{}{}", options.prefix, resume.host_id.hyphenated());
        let point = (key == resume.key).then_some(RegistrationPoint {
            lease: resume.lease,
            mod_revision: resume.mod_revision,
            create_revision: resume.create_revision,
        });
        let incarnation = resume.incarnation.saturating_add(1);
        Self::start(etcd, resume.host_id, metadata, options, point, incarnation)
    }

    /// Stops renewing *without* leaving, and returns what the next process
    /// needs to [`resume`](HostLiveness::resume) this registration: no
    /// leave marker is written, nothing deleted, the lease not revoked.
    /// Until it is resumed the key stays (watchers see nothing); when no
    /// process resumes it within the lease's TTL, etcd expires the lease
    /// and watchers see [`Down(_, Expired)`](crate::DownReason::Expired).
    ///
    /// Fails, after leaving as [`HostLiveness::close`] does, when there is
    /// no registration to hand over: the key not written with the current
    /// lease (registering, lost) or the keepalive already stopped.
    pub fn detach(self) -> Result<Resume> {
        crate::blocking::check()?;
        let Engine::Own(machine) = &self.machine else {
            self.stop_and_wait()?;
            return Err(Error::invalid(
                "detach",
                "a registration on a shared Session is handed over with its session \
                 (Session::detach), not alone; the host left instead",
            ));
        };
        machine
            .send(HostInput::Detach)
            .map_err(|_| self.etcd.gone())?;
        let point = crossbeam_channel::select! {
            recv(self.detached) -> point => point.ok(),
            recv(self.machine.finished()) -> _ => self.detached.try_recv().ok(),
            default(CLOSE_WAIT) => None,
        };
        match point {
            Some(point) => Ok(Resume {
                host_id: self.host_id,
                key: self.key.clone(),
                lease: point.lease,
                create_revision: point.create_revision,
                mod_revision: point.mod_revision,
                incarnation: self.incarnation,
                ttl: self.ttl,
            }),
            None => {
                // Stopped as a close does, leave and revoke: report how.
                self.stop_and_wait()?;
                Err(Error::invalid(
                    "detach",
                    "no registration to hand over (not registered); the host left instead",
                ))
            }
        }
    }

    /// Which process of this registration this is: 1 for one made by
    /// [`HostLiveness::with_options`], one more than the detached one's for
    /// a [`HostLiveness::resume`] (also when the resume fell back to a
    /// fresh registration) or a host taken over from a saved session
    /// ([`Session::resume`](crate::Session::resume)). Local to the
    /// processes that hand it on;
    /// watchers learn it only from hosts that publish it
    /// ([`LivenessOptions::publish_incarnation`]).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Whether [`HostLiveness::resume`] took the earlier registration over
    /// (same lease, same key incarnation), rather than registering afresh;
    /// for a host on a resumed session, whether its key was taken over on
    /// the saved lease. Always false for [`HostLiveness::with_options`].
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    fn start(
        etcd: &Etcd,
        host_id: Uuid,
        metadata: &[u8],
        options: LivenessOptions,
        resume: Option<RegistrationPoint>,
        incarnation: u64,
    ) -> Result<HostLiveness> {
        crate::blocking::check()?;
        validate::prefix("prefix", &options.prefix)?;
        options.session.validate()?;
        validate::timeout("register_timeout", options.register_timeout)?;
        validate::payload("metadata", metadata)?;
        if host_id.is_nil() {
            return Err(Error::invalid("host_id", "the nil UUID is not a host id"));
        }
        let key = format!("{}{}", options.prefix, host_id.hyphenated());
        let config = HostConfig {
            lease: KeepaliveConfig {
                ttl_secs: options.session.ttl.as_secs() as i64,
                backoff: BackoffConfig::default(),
                safety_margin: options.session.safety_margin,
                drift_allowance_ppm: options.session.drift_allowance_ppm,
                attempt_timeout: ATTEMPT_TIMEOUT.min(etcd.options().request_timeout),
                // For `trusted_until`: one notice per renewal, stored below.
                announce_trust: true,
            },
            key: key.clone().into_bytes(),
            value: metadata.to_vec(),
            // Every stop announces the leave, so watchers can tell it
            // from a crash (see `DownReason`).
            leave_marker: Some(leave_marker_key(key.as_bytes())),
            // Written with every write of the key, so a watcher reads
            // both at one revision (see `HostInfo::incarnation`); only
            // on request, since it is a second key under the prefix.
            companion: companion(&options, &key, incarnation),
            take_over: options.take_over,
            backoff: BackoffConfig::default(),
        };
        let mut machine = match resume {
            Some(point) => Host::resume(config, Instant::now(), rand_seed(), point),
            None => Host::new(config, Instant::now(), rand_seed()),
        };
        machine.set_renewal_grid(Some(etcd.renewal_grid()));
        let (mut sink, first, left, status, states) = StateSink::new(key.clone());
        let (detached_tx, detached) = crossbeam_channel::bounded::<RegistrationPoint>(1);
        let shared_status = status.clone();
        let machine = etcd.run(
            machine,
            Notify(move |notice: HostNotice| {
                match notice {
                    HostNotice::State(state) => sink.state(state),
                    HostNotice::Trusted { lease, until } => {
                        let mut status = shared_status.lock();
                        status.trust = Some((lease, until));
                        // A grant answered: no failure stands.
                        status.grant_failure = None;
                    }
                    HostNotice::GrantFailed { error } => {
                        shared_status.lock().grant_failure = Some(error);
                    }
                    HostNotice::Left { .. } => sink.left(),
                    HostNotice::Detached(point) => {
                        let _ = detached_tx.try_send(point);
                    }
                }
                true
            }),
        )?;
        let mut host = HostLiveness {
            host_id,
            key,
            machine: Engine::Own(machine),
            status,
            states,
            left,
            detached,
            incarnation,
            resumed: false,
            ttl: options.session.ttl,
            etcd: etcd.clone(),
        };
        let first = host.first_outcome(&first, options.register_timeout, options.session.ttl)?;
        host.resumed = matches!((first, resume),
            (sm::LivenessState::Registered { lease }, Some(point)) if lease == point.lease);
        Ok(host)
    }

    /// Waits for the first outcome of registering: `Registered`, or the
    /// error of a refusal, of a live duplicate or of a timeout (the host
    /// then leaves). While the key's previous holder is waited for
    /// (`Waiting`), the wait is extended to two of this registration's
    /// TTLs plus `timeout` from then: the machine decides within the
    /// holder's remaining TTL plus about a second, and a process with the
    /// same host id normally runs with the same TTL.
    fn first_outcome(
        &self,
        first: &crossbeam_channel::Receiver<sm::LivenessState>,
        timeout: Duration,
        ttl: Duration,
    ) -> Result<sm::LivenessState> {
        let mut deadline = Instant::now().checked_add(timeout);
        let mut extended = false;
        loop {
            let wait = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            match first.recv_timeout(wait) {
                // Permission denied, say: no retry helps, so no waiting either.
                Ok(sm::LivenessState::Refused { error }) => {
                    let _ = self.stop_and_wait();
                    return Err(Error::rpc_in(format!("registering {}", self.key), error));
                }
                Ok(sm::LivenessState::Duplicate { holder }) => {
                    let _ = self.stop_and_wait();
                    return Err(Error::DuplicateId {
                        key: self.key.clone(),
                        holder,
                    });
                }
                Ok(sm::LivenessState::Waiting { holder }) => {
                    log::info!(
                        "{}: held by lease {holder:x} of another process; waiting for it to \
                         expire (a crashed predecessor) or to be renewed (a duplicate)",
                        self.key
                    );
                    if !extended {
                        extended = true;
                        deadline = ttl
                            .checked_mul(2)
                            .and_then(|t| t.checked_add(timeout))
                            .and_then(|t| Instant::now().checked_add(t));
                    }
                }
                Ok(first) => return Ok(first),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let _ = self.stop_and_wait();
                    // Out of space is not a slow etcd: say so, under its
                    // own kind (issue 48, item 3).
                    let failure = self.status.lock().grant_failure.take();
                    return Err(Error::no_lease_within(
                        format_args!("registering {}", self.key),
                        timeout,
                        failure,
                        self.etcd.endpoints(),
                    ));
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(self.etcd.gone())
                }
            }
        }
    }

    /// Register `host_id` with `metadata` on `session`: the host key
    /// (`<prefix><host id>`, from `options`) is bound to the session's
    /// lease, so the host costs etcd no renewals of its own, and is written
    /// again whenever the session comes back on a new lease (watchers see
    /// `Down(_, Expired)` when the old lease expires and `Up` again). The
    /// session's lease settings apply; the TTL, safety margin and drift
    /// allowance of `options` are ignored. Blocks until the key is written,
    /// at most [`LivenessOptions::register_timeout`].
    ///
    /// [`HostLiveness::close`] announces the leave as on an own lease (the
    /// marker is written on the session's lease and goes when the session
    /// does) and leaves the session running. It is not
    /// [`detach`](HostLiveness::detach)ed alone: [`Session::detach`](crate::Session::detach)
    /// hands it over with the session's lease. On a session made by
    /// [`Session::resume`](crate::Session::resume) whose saved hosts
    /// include this key, the registration is taken over: its first write
    /// is guarded on the key being as the earlier process left it
    /// ([`HostLiveness::resumed`] says whether it stayed on the saved
    /// lease; [`HostLiveness::incarnation`] counts one more). Close the
    /// host before the session to show watchers a leave: closing the
    /// session revokes its lease, which watchers see as `Down(_, Expired)`.
    pub fn with_session(
        session: &crate::Session,
        host_id: Uuid,
        metadata: &[u8],
        options: LivenessOptions,
    ) -> Result<HostLiveness> {
        crate::blocking::check()?;
        validate::prefix("prefix", &options.prefix)?;
        validate::timeout("register_timeout", options.register_timeout)?;
        validate::payload("metadata", metadata)?;
        if host_id.is_nil() {
            return Err(Error::invalid("host_id", "the nil UUID is not a host id"));
        }
        if session.is_closed() {
            return Err(Error::Closed);
        }
        let etcd = session.etcd().clone();
        let key = format!("{}{}", options.prefix, host_id.hyphenated());
        let ttl = session.options().ttl;
        // Saved by the process before this one, if the session was resumed.
        let saved = session.take_host_resume(&key);
        let incarnation = saved
            .as_ref()
            .map_or(1, |(_, host)| host.incarnation.saturating_add(1));
        let config = RegistrationConfig {
            key: key.clone().into_bytes(),
            value: metadata.to_vec(),
            leave_marker: Some(leave_marker_key(key.as_bytes())),
            // As with an own lease (see `HostInfo::incarnation`).
            companion: companion(&options, &key, incarnation),
            backoff: BackoffConfig::default(),
            give_up: ttl,
            take_over: options.take_over,
        };
        let machine = match &saved {
            Some((lease, host)) => Registration::resume(
                config,
                Instant::now(),
                rand_seed(),
                RegistrationPoint {
                    lease: *lease,
                    mod_revision: host.mod_revision,
                    // Not saved with a session's hosts; told, never guarded on.
                    create_revision: 0,
                },
            ),
            None => Registration::new(config, Instant::now(), rand_seed()),
        };
        let (mut sink, first, left, status, states) = StateSink::new(key.clone());
        let requests_to = session.clone();
        let (detached_tx, detached) = crossbeam_channel::bounded::<RegistrationPoint>(1);
        let machine = etcd.run(
            machine,
            Notify(move |notice: RegistrationNotice| {
                match notice {
                    RegistrationNotice::State(state) => sink.state(state),
                    RegistrationNotice::Left { .. } => sink.left(),
                    RegistrationNotice::SessionRequest(request) => requests_to.request(request),
                    RegistrationNotice::Detached(point) => {
                        let _ = detached_tx.try_send(point);
                    }
                }
                true
            }),
        )?;
        let hand_over = {
            let input = machine.downgrade();
            let finished = machine.finished().clone();
            let host = HostResume {
                host_id,
                key: key.clone(),
                mod_revision: 0,
                incarnation,
            };
            let hand_over: HandOver = Arc::new(move |deadline: Instant| {
                input.send(RegistrationInput::Detach).ok()?;
                let wait = deadline.saturating_duration_since(Instant::now());
                let point = crossbeam_channel::select! {
                    recv(detached) -> point => point.ok(),
                    recv(finished) -> _ => detached.try_recv().ok(),
                    default(wait) => None,
                }?;
                Some((
                    point.lease,
                    HostResume {
                        mod_revision: point.mod_revision,
                        ..host.clone()
                    },
                ))
            });
            hand_over
        };
        let shared_status = status.clone();
        let input = machine.downgrade();
        let attachment = session.attach(
            &key,
            move |fact| {
                if let SessionInput::Trusted { lease, until } = &fact {
                    shared_status.lock().trust = Some((*lease, *until));
                }
                input.send(RegistrationInput::Session(fact)).is_ok()
            },
            // A registration holds no belief a lost lease must end at once:
            // its state says `Lost` when the session tells it.
            |_, _| {},
            Departure::HandOver(hand_over),
        )?;
        let mut host = HostLiveness {
            host_id,
            key,
            machine: Engine::Shared(machine, attachment),
            status,
            states,
            left,
            detached: crossbeam_channel::never(),
            incarnation,
            resumed: false,
            ttl,
            etcd,
        };
        let first = host.first_outcome(&first, options.register_timeout, ttl)?;
        host.resumed = matches!((first, &saved),
            (sm::LivenessState::Registered { lease }, Some((saved, _))) if lease == *saved);
        Ok(host)
    }

    /// The host id this registration is for.
    pub fn host_id(&self) -> Uuid {
        self.host_id
    }

    /// The etcd key holding this host's metadata.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The latest state.
    pub fn state(&self) -> LivenessState {
        self.status.lock().state.clone()
    }

    /// The lease currently believed alive, if any.
    pub fn lease(&self) -> Option<i64> {
        match self.state() {
            LivenessState::Registered { lease } | LivenessState::Suspended { lease } => Some(lease),
            _ => None,
        }
    }

    /// Until when this host's registration is trusted: the local deadline
    /// of its lease as of the last answered renewal, which passes before
    /// etcd can let the lease expire (the rules above). It moves forward
    /// at every answered renewal, about every third of the TTL; `None`
    /// unless the state is `Registered` or `Suspended`.
    ///
    /// For a watchdog: while it keeps moving, this process renews its
    /// lease; `fleetcoord agent` tells systemd `WATCHDOG=1` each time it
    /// moves.
    pub fn trusted_until(&self) -> Option<Instant> {
        let status = self.status.lock();
        let lease = match status.state {
            LivenessState::Registered { lease } | LivenessState::Suspended { lease } => lease,
            _ => return None,
        };
        match status.trust {
            Some((trusted, until)) if trusted == lease => Some(until),
            _ => None,
        }
    }

    /// Every state change, in order (the newest 1,024 are kept when nobody
    /// reads them), starting with the state
    /// [`register`](HostLiveness::register) returned: the `Registering`
    /// before it is over and not replayed.
    pub fn states(&self) -> &crossbeam_channel::Receiver<LivenessState> {
        &self.states
    }

    /// Replace this host's metadata. Written at once when registered, and
    /// used for every later re-registration.
    pub fn set_metadata(&self, metadata: &[u8]) -> Result<()> {
        crate::blocking::check()?;
        validate::payload("metadata", metadata)?;
        let sent = match &self.machine {
            Engine::Own(m) => m.send(HostInput::SetValue(metadata.to_vec())),
            Engine::Shared(m, _) => m.send(RegistrationInput::SetValue(metadata.to_vec())),
        };
        sent.map_err(|_| self.etcd.gone())
    }

    /// Announce the leave and stop renewing: one transaction writes the
    /// leave marker and deletes the key (watchers see
    /// [`Down(_, Left)`](crate::DownReason::Left) at once), then the lease
    /// is revoked. Returns as soon as etcd confirmed the leave, one round
    /// trip, without waiting for the revoke, which goes on in the
    /// background and removes the marker (should it fail, the marker
    /// expires with the lease; the final
    /// [`Stopped { revoked }`](LivenessState::Stopped) on a clone of
    /// [`HostLiveness::states`] tells which). When the leave could not be
    /// written (etcd unreachable, or the key is not this registration's any
    /// more) the revoke is waited for instead, and an error is returned
    /// when it could not be confirmed: the key then disappears when the
    /// lease expires after its TTL, and watchers see `Expired`. When the
    /// key turned out to be another live process's (it took the key over,
    /// or holds the same host id: the state went
    /// [`Duplicate`](LivenessState::Duplicate)), watchers saw nothing of
    /// this registration's end, and the error is [`Error::DuplicateId`].
    pub fn close(self) -> Result<()> {
        crate::blocking::check()?;
        self.stop_and_wait()
    }

    /// [`HostLiveness::close`], telling what watchers saw: `Ok(true)` when
    /// the leave was written (they see
    /// [`Down(_, Left)`](crate::DownReason::Left)), `Ok(false)` when it
    /// could not be (the key had moved on, or the leave got no answer in
    /// time, a member having gone silent, say) and the revoke was confirmed
    /// instead: the key is gone just as soon, but watchers read it as
    /// [`Expired`](crate::DownReason::Expired). On a shared session,
    /// `Ok(false)` means the registration stopped without its leave being
    /// confirmed. Errors as `close`'s.
    pub fn leave(self) -> Result<bool> {
        crate::blocking::check()?;
        self.stop_and_tell()
    }

    fn stop_and_wait(&self) -> Result<()> {
        self.stop_and_tell().map(|_| ())
    }

    /// Stops, and waits for the leave or, failing that, the revoke; `true`
    /// when the leave was written.
    fn stop_and_tell(&self) -> Result<bool> {
        self.machine.stop();
        let finished = crossbeam_channel::select! {
            recv(self.left) -> left => match left {
                // The key is gone and watchers saw a leave; the revoke
                // (of the lease, now holding only the marker) goes on in
                // the background.
                Ok(()) => return Ok(true),
                // The notice handler is gone: the machine task ended.
                Err(_) => self.machine.wait_finished(CLOSE_WAIT),
            },
            recv(self.machine.finished()) -> finished => Ok(finished.unwrap_or(Finished::Abandoned)),
            default(CLOSE_WAIT) => Err(WaitError::Timeout(CLOSE_WAIT)),
        };
        // The machine may have told the leave just before it finished.
        let left = self.left.try_recv().is_ok();
        // The key was another process's (taken over, or a duplicate): no
        // leave of this one's can have been seen, whatever was revoked.
        if let Some(holder) = self.status.lock().displaced {
            return Err(Error::DuplicateId {
                key: self.key.clone(),
                holder,
            });
        }
        if let (Engine::Shared(..), Ok(_)) = (&self.machine, &finished) {
            // The lease is the session's: stopped is all there is to it.
            return Ok(left);
        }
        let revoked = match self.state() {
            LivenessState::Stopped { revoked } => Some(revoked),
            _ => None,
        };
        close_outcome(
            finished,
            revoked,
            || self.etcd.gone(),
            self.etcd.endpoints(),
        )
        .map(|()| left)
    }
}

/// What a registration's machine runs on: its own keepalive, or a shared
/// session (with its place there).
enum Engine {
    Own(MachineHandle<Host>),
    /// The attachment is held for its lifetime: dropping it frees the
    /// host key's place on the session.
    Shared(
        MachineHandle<Registration>,
        #[allow(dead_code)] crate::session::Attachment,
    ),
}

impl Engine {
    fn stop(&self) {
        match self {
            Engine::Own(m) => m.stop(),
            Engine::Shared(m, _) => m.stop(),
        }
    }

    fn finished(&self) -> &crossbeam_channel::Receiver<Finished> {
        match self {
            Engine::Own(m) => m.finished(),
            Engine::Shared(m, _) => m.finished(),
        }
    }

    fn wait_finished(&self, wait: Duration) -> std::result::Result<Finished, WaitError> {
        match self {
            Engine::Own(m) => m.wait_finished(wait),
            Engine::Shared(m, _) => m.wait_finished(wait),
        }
    }
}

/// Where a registration's states go, on the driver: the latest state,
/// `states()`, the first outcome `register` waits for, and the leave.
struct StateSink {
    key: String,
    status: Arc<Mutex<Status>>,
    states_tx: crossbeam_channel::Sender<LivenessState>,
    oldest: crossbeam_channel::Receiver<LivenessState>,
    first_tx: Option<crossbeam_channel::Sender<sm::LivenessState>>,
    left_tx: Option<crossbeam_channel::Sender<()>>,
}

/// The receivers a [`StateSink`] feeds: the first outcome, the leave, the
/// latest state and every state.
type SinkEnds = (
    StateSink,
    crossbeam_channel::Receiver<sm::LivenessState>,
    crossbeam_channel::Receiver<()>,
    Arc<Mutex<Status>>,
    crossbeam_channel::Receiver<LivenessState>,
);

/// A registration's latest state and the lease last told trusted (with
/// until when).
struct Status {
    state: LivenessState,
    trust: Option<(i64, Instant)>,
    /// The lease of another process told holding this host's key
    /// (`Duplicate`), if any.
    displaced: Option<i64>,
    /// Why the last lease grant failed, while none has succeeded since:
    /// what a registration that gives up waiting reports (etcd out of
    /// space refuses every grant, yet not for good).
    grant_failure: Option<fleetcoord_sm::RpcError>,
}

impl StateSink {
    fn new(key: String) -> SinkEnds {
        let status = Arc::new(Mutex::new(Status {
            state: LivenessState::Registering,
            trust: None,
            grant_failure: None,
            displaced: None,
        }));
        // Unbounded, with the bound kept below by hand: a `bounded(1024)`
        // channel allocates and touches all of its slots up front, 40 KiB
        // per host whether or not a state is ever queued (measured with a
        // counting allocator: 41 of the 84 KiB each HostLiveness cost).
        // The list channel allocates a block of 31 slots as states arrive.
        let (states_tx, states) = crossbeam_channel::unbounded();
        let oldest = states.clone();
        // The first outcome keeps the machine's own state: a refusal's
        // `RpcError` becomes the error `with_options` returns.
        let (first_tx, first) = crossbeam_channel::bounded::<sm::LivenessState>(4);
        // Told once, when the leave transaction applied (`close`).
        let (left_tx, left) = crossbeam_channel::bounded::<()>(1);
        let sink = StateSink {
            key,
            status: status.clone(),
            states_tx,
            oldest,
            first_tx: Some(first_tx),
            left_tx: Some(left_tx),
        };
        (sink, first, left, status, states)
    }

    fn left(&mut self) {
        if let Some(tx) = self.left_tx.take() {
            let _ = tx.send(());
        }
    }

    fn state(&mut self, machine_state: sm::LivenessState) {
        crate::metrics::liveness(&self.key, &machine_state);
        let s = LivenessState::from_sm(&machine_state);
        self.status.lock().state = s.clone();
        let registering = self.first_tx.is_some();
        let outcome = matches!(
            machine_state,
            sm::LivenessState::Registered { .. }
                | sm::LivenessState::Refused { .. }
                | sm::LivenessState::Duplicate { .. }
        );
        if let sm::LivenessState::Duplicate { holder } = machine_state {
            self.status.lock().displaced = Some(holder);
        }
        // Told to `register` as it happens, not an outcome: it extends the
        // wait (see `first_outcome`).
        // At most one queued, so the outcome always finds room.
        if let (Some(tx), sm::LivenessState::Waiting { .. }) = (&self.first_tx, &machine_state) {
            if tx.is_empty() {
                let _ = tx.try_send(machine_state.clone());
            }
        }
        if registering && !outcome {
            // Over before `register` returns: `states()` starts with the
            // state it returned, not a replay.
            return;
        }
        // A user who ignores state changes must not keep them in memory
        // forever, and the driver must never wait for a reader: past the
        // bound the newest are kept (the receiver is ours too, so it never
        // disconnects). This is the only sender, so the queue can only
        // shrink between the check and the send.
        if self.states_tx.len() >= MAX_QUEUED_STATES {
            let _ = self.oldest.try_recv();
        }
        let _ = self.states_tx.send(s);
        // Told after the state is queued: `register` returns on this, and
        // `states()` must already start with it.
        if outcome {
            if let Some(tx) = self.first_tx.take() {
                let _ = tx.try_send(machine_state);
            }
        }
    }
}

// Dropping the `MachineHandle` stops the keepalive without waiting; see
// "Dropping" in the type's docs.

/// The incarnation key and value written with every write of the host
/// key `key`, when `options` publish it (see `HostInfo::incarnation`): one
/// rule for a host on its own lease and one on a session.
fn companion(options: &LivenessOptions, key: &str, incarnation: u64) -> Option<(Vec<u8>, Vec<u8>)> {
    options.publish_incarnation.then(|| {
        (
            incarnation_key(key.as_bytes()),
            incarnation.to_string().into_bytes(),
        )
    })
}
