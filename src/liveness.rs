//! [`HostLiveness`]: this host's lease-bound key under the hosts prefix.

use crate::driver::handle::WaitError;
use crate::driver::{rand_seed, Finished, MachineHandle, Notify};
use crate::error::{etcd_kind, Error, ErrorKind, Result};
use crate::etcd::{assert_not_async, Etcd};
use crate::validate;
use fleetcoord_sm::keepalive::{
    self as sm, Binding, Keepalive, KeepaliveConfig, KeepaliveInput, KeepaliveNotice,
};
use fleetcoord_sm::watch::leave_marker_key;
use fleetcoord_sm::BackoffConfig;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Where a lease-bound registration stands: this host's
/// ([`HostLiveness::states`]) or an election's session
/// ([`crate::Election::session`]). Consecutive states reported on
/// [`HostLiveness::states`] always differ.
///
/// fleetcoord's own type, not the state machine's: what it shows is the
/// registration's life cycle, which stays put when the machines' internal
/// vocabulary changes. `#[non_exhaustive]`: match the states you act on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LivenessState {
    /// Granting a lease or writing the key; nothing is registered yet.
    Registering,
    /// The lease is held (and the key written, for a [`HostLiveness`]).
    Registered {
        /// The lease.
        lease: i64,
    },
    /// Renewals are failing; the lease may still be alive, and renewals are
    /// retried until the local deadline.
    Suspended {
        /// The lease.
        lease: i64,
    },
    /// The lease is gone (the local deadline passed, or etcd said so); a new
    /// one is being granted.
    Lost {
        /// The lease that was lost.
        lease: i64,
    },
    /// etcd refused the grant or the write in a way no retry fixes
    /// (permission denied); the registration is stopping and `Stopped`
    /// follows.
    Refused {
        /// What kind of refusal, as in [`Error::Etcd`].
        kind: ErrorKind,
        /// What etcd said, for people.
        message: String,
    },
    /// Final. `revoked` is false when there was no lease to revoke or the
    /// revoke failed (the lease then expires on its own).
    Stopped {
        /// Whether etcd confirmed the revoke.
        revoked: bool,
    },
}

impl LivenessState {
    /// The machine's state as the user sees it. A crate-private function,
    /// not a `From` impl, so that the machine's type stays out of the
    /// public API. The match is exhaustive on purpose: a new machine state
    /// must fail this build rather than be reported as something else.
    pub(crate) fn from_sm(state: &sm::LivenessState) -> Self {
        match state {
            sm::LivenessState::Registering => LivenessState::Registering,
            sm::LivenessState::Registered { lease } => LivenessState::Registered { lease: *lease },
            sm::LivenessState::Suspended { lease } => LivenessState::Suspended { lease: *lease },
            sm::LivenessState::Lost { lease } => LivenessState::Lost { lease: *lease },
            sm::LivenessState::Refused { error } => LivenessState::Refused {
                kind: etcd_kind(error),
                message: error.to_string(),
            },
            sm::LivenessState::Stopped { revoked } => LivenessState::Stopped { revoked: *revoked },
        }
    }
}

/// State changes kept for a reader that does not keep up.
const MAX_QUEUED_STATES: usize = 1024;

/// Where hosts register unless told otherwise.
pub const DEFAULT_HOSTS_PREFIX: &str = "/coord/hosts/";

/// Default safety margin of every session (liveness and election): how long
/// before etcd can expire a lease the local side gives it up. The
/// keepalive's deadline already counts from the *send* of the last
/// acknowledged renewal, which covers the network; the margin covers what
/// happens on this host after the deadline: the driver thread firing it
/// late (tens of milliseconds on a loaded 2-core machine, more under
/// memory pressure) and a user acting right after checking
/// `is_held()`. 250 ms is well above the first and leaves room for a short
/// second, while costing a 10 s session only 2.5 % of its lifetime; it is
/// also small enough for the 1 s minimum TTL (at most half the TTL may go).
/// It replaces what used to be an accident: etcd's expiry loop runs every
/// 500 ms, so leases die up to 0.5 s late, but nothing promises that.
pub(crate) const DEFAULT_SAFETY_MARGIN: Duration = Duration::from_millis(250);

/// Default clock drift allowance of every session, in parts per million
/// (1 %): a leader measures its lease on its own monotonic clock while etcd
/// expires it on etcd's, so a clock running slow would let a leader
/// believe past the expiry. The kernel's NTP discipline changes a clock's
/// rate by at most 500 ppm, so two disciplined hosts differ by at most
/// 1,000 ppm; 1 % is ten times that, for undisciplined clocks and virtual machines, at the cost of
/// 100 ms of a 10 s session (client-go's leader election is far more
/// cautious, giving up a third of its lease, because there the *followers'*
/// clocks time the lease; here etcd does).
pub(crate) const DEFAULT_DRIFT_ALLOWANCE_PPM: u32 = 10_000;

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
    /// Lease TTL: how long after this process dies (or is cut off) the fleet
    /// sees it `Down`. Whole seconds, at least 1 s; etcd may round a short
    /// TTL up (3.4 grants 1 s as 2 s). Default 5 s.
    pub ttl: Duration,
    /// How long [`HostLiveness::with_options`] waits for the first
    /// registration before failing. 1 ms to 24 h. Default 10 s.
    pub register_timeout: Duration,
    /// How long before etcd can expire the lease this host gives it up
    /// (reports [`LivenessState::Lost`] and registers again): room for a
    /// late timer and for acting on a state just read. At most half of the
    /// TTL less the drift allowance. Default 250 ms.
    pub safety_margin: Duration,
    /// How much slower than etcd's clock this host's clock may run, in
    /// parts per million; the lease is trusted for the TTL shortened by
    /// this much (then less the margin). 0 to 100,000 (10 %). Default
    /// 10,000 (1 %, ten times what NTP lets two clocks differ by).
    pub drift_allowance_ppm: u32,
}

impl Default for LivenessOptions {
    fn default() -> Self {
        LivenessOptions {
            prefix: DEFAULT_HOSTS_PREFIX.into(),
            ttl: Duration::from_secs(5),
            register_timeout: Duration::from_secs(10),
            safety_margin: DEFAULT_SAFETY_MARGIN,
            drift_allowance_ppm: DEFAULT_DRIFT_ALLOWANCE_PPM,
        }
    }
}

impl LivenessOptions {
    /// These options with [`LivenessOptions::prefix`] set (checked by
    /// [`HostLiveness::with_options`]).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// These options with [`LivenessOptions::ttl`] set (checked by
    /// [`HostLiveness::with_options`]).
    #[must_use]
    pub const fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// These options with [`LivenessOptions::register_timeout`] set (1 ms
    /// to 24 h, checked by [`HostLiveness::with_options`]).
    #[must_use]
    pub const fn with_register_timeout(mut self, timeout: Duration) -> Self {
        self.register_timeout = timeout;
        self
    }

    /// These options with [`LivenessOptions::safety_margin`] set (at most
    /// half of the TTL less the drift allowance, checked by
    /// [`HostLiveness::with_options`]).
    #[must_use]
    pub const fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }

    /// These options with [`LivenessOptions::drift_allowance_ppm`] set (at
    /// most 100,000, checked by [`HostLiveness::with_options`]).
    #[must_use]
    pub const fn with_drift_allowance_ppm(mut self, ppm: u32) -> Self {
        self.drift_allowance_ppm = ppm;
        self
    }
}

/// This host's registration: a key `<prefix><host id>` holding its metadata,
/// bound to a lease that a background keepalive renews.
///
/// Guarantees:
/// * While the state is [`LivenessState::Registered`], the key exists: the
///   state turns [`LivenessState::Lost`] at a local deadline that passes at
///   least [`LivenessOptions::safety_margin`] before etcd can expire the
///   lease, provided this host's clock runs no slower than
///   [`LivenessOptions::drift_allowance_ppm`] allows.
/// * The keepalive heals itself: when renewals fail it retries on the same
///   lease until the local deadline, then (or when etcd says the lease is
///   gone) grants a new lease and writes the key again, with jittered
///   exponential backoff. Each step is reported on [`HostLiveness::states`].
/// * [`HostLiveness::close`] (and `Drop`) announce the leave, then revoke
///   the lease, so watchers see the host
///   [`Down(_, Left)`](crate::DownReason::Left) within milliseconds instead
///   of `Down(_, Expired)` after the TTL. The announcement is one put of the
///   *leave marker* `<prefix><host id>/left` (empty value) on the host's
///   lease, waited for at most 500 ms (less with a shorter request
///   timeout); if it fails or times out the revoke goes ahead anyway and
///   the host reads as `Expired`. The revoke removes marker and host key
///   together; a process that dies between the two leaves a marker that
///   expires with the lease (and still reads as `Left`). Nothing is ever
///   left behind. A host that never got its key written (still
///   registering) announces nothing.
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
/// host.close()?; // announces the leave and revokes: watchers see Down(_, Left) at once
/// # Ok(()) }
/// ```
#[must_use = "dropping a HostLiveness revokes the lease: the host is reported Down at once"]
pub struct HostLiveness {
    host_id: Uuid,
    key: String,
    machine: MachineHandle<Keepalive>,
    state: Arc<Mutex<LivenessState>>,
    /// The lease last told trusted, and until when.
    trust: Arc<Mutex<Option<(i64, Instant)>>>,
    states: crossbeam_channel::Receiver<LivenessState>,
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
        Self::with_options(
            etcd,
            host_id,
            metadata,
            LivenessOptions::default().with_ttl(ttl),
        )
    }

    /// [`HostLiveness::register`] with every setting explicit.
    #[deprecated(
        note = "renamed `HostLiveness::with_options`, the constructor name used across the crate"
    )]
    pub fn register_with(
        etcd: &Etcd,
        host_id: Uuid,
        metadata: &[u8],
        options: LivenessOptions,
    ) -> Result<HostLiveness> {
        Self::with_options(etcd, host_id, metadata, options)
    }

    /// [`HostLiveness::register`] with every setting explicit.
    pub fn with_options(
        etcd: &Etcd,
        host_id: Uuid,
        metadata: &[u8],
        options: LivenessOptions,
    ) -> Result<HostLiveness> {
        assert_not_async();
        validate::prefix("prefix", &options.prefix)?;
        validate::ttl("ttl", options.ttl)?;
        validate::trust(
            options.ttl,
            options.safety_margin,
            options.drift_allowance_ppm,
        )?;
        validate::timeout("register_timeout", options.register_timeout)?;
        validate::payload("metadata", metadata)?;
        if host_id.is_nil() {
            return Err(Error::invalid("host_id", "the nil UUID is not a host id"));
        }
        let key = format!("{}{}", options.prefix, host_id.hyphenated());
        let config = KeepaliveConfig {
            ttl_secs: options.ttl.as_secs() as i64,
            binding: Some(Binding {
                key: key.clone().into_bytes(),
                value: metadata.to_vec(),
                // Every stop announces the leave, so watchers can tell it
                // from a crash (see `DownReason`).
                leave_marker: Some(leave_marker_key(key.as_bytes())),
            }),
            backoff: BackoffConfig::default(),
            safety_margin: options.safety_margin,
            drift_allowance_ppm: options.drift_allowance_ppm,
            attempt_timeout: ATTEMPT_TIMEOUT.min(etcd.options().request_timeout),
            // For `trusted_until`: one notice per renewal, stored below.
            announce_trust: true,
        };
        let mut machine = Keepalive::new(config, Instant::now(), rand_seed());
        machine.set_renewal_grid(Some(etcd.renewal_grid()));
        let state = Arc::new(Mutex::new(LivenessState::Registering));
        // Unbounded, with the bound kept below by hand: a `bounded(1024)`
        // channel allocates and touches all of its slots up front, 40 KiB
        // per host whether or not a state is ever queued (measured with a
        // counting allocator: 41 of the 84 KiB each HostLiveness cost).
        // The list channel allocates a block of 31 slots as states arrive.
        let (states_tx, states) = crossbeam_channel::unbounded();
        let oldest = states.clone();
        // The first outcome keeps the machine's own state: a refusal's
        // `RpcError` becomes the error `with_options` returns.
        let (first_tx, first) = crossbeam_channel::bounded::<sm::LivenessState>(1);
        let shared_state = state.clone();
        let trust = Arc::new(Mutex::new(None));
        let shared_trust = trust.clone();
        let mut first_tx = Some(first_tx);
        let metrics_key = key.clone();
        let machine = etcd.run(
            machine,
            Notify(move |notice: KeepaliveNotice| {
                let machine_state = match notice {
                    KeepaliveNotice::State(state) => state,
                    KeepaliveNotice::Trusted { lease, until } => {
                        *shared_trust.lock() = Some((lease, until));
                        return true;
                    }
                };
                crate::metrics::liveness(&metrics_key, &machine_state);
                let s = LivenessState::from_sm(&machine_state);
                *shared_state.lock() = s.clone();
                if let sm::LivenessState::Registered { .. } | sm::LivenessState::Refused { .. } =
                    machine_state
                {
                    if let Some(tx) = first_tx.take() {
                        let _ = tx.send(machine_state);
                    }
                }
                // A user who ignores state changes must not keep them in
                // memory forever, and the driver must never wait for a
                // reader: past the bound the newest are kept (the receiver
                // is ours too, so it never disconnects).
                // This closure is the only sender, so the queue can only
                // shrink between the check and the send.
                if states_tx.len() >= MAX_QUEUED_STATES {
                    let _ = oldest.try_recv();
                }
                let _ = states_tx.send(s);
                true
            }),
        )?;
        let host = HostLiveness {
            host_id,
            key,
            machine,
            state,
            trust,
            states,
            etcd: etcd.clone(),
        };
        match first.recv_timeout(options.register_timeout) {
            // Permission denied, say: no retry helps, so no waiting either.
            Ok(sm::LivenessState::Refused { error }) => {
                let _ = host.stop_and_wait();
                Err(Error::rpc_in(format!("registering {}", host.key), error))
            }
            Ok(_) => Ok(host),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                let _ = host.stop_and_wait();
                Err(Error::Timeout(options.register_timeout))
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(etcd.gone()),
        }
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
        self.state.lock().clone()
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
        let lease = self.lease()?;
        match *self.trust.lock() {
            Some((trusted, until)) if trusted == lease => Some(until),
            _ => None,
        }
    }

    /// Every state change, in order (the newest 1,024 are kept when nobody
    /// reads them).
    pub fn states(&self) -> &crossbeam_channel::Receiver<LivenessState> {
        &self.states
    }

    /// Replace this host's metadata. Written at once when registered, and
    /// used for every later re-registration.
    pub fn set_metadata(&self, metadata: &[u8]) -> Result<()> {
        validate::payload("metadata", metadata)?;
        self.machine
            .send(KeepaliveInput::SetValue(metadata.to_vec()))
            .map_err(|_| self.etcd.gone())
    }

    /// Announce the leave (the leave marker, see the type's docs), revoke
    /// the lease (the key disappears, watchers see
    /// [`Down(_, Left)`](crate::DownReason::Left) at once) and stop
    /// renewing. Returns an error when the revoke could not be confirmed;
    /// the keepalive stops either way and the lease then expires after its
    /// TTL. A marker that could not be written is no error: the host then
    /// reads as `Expired`, as after a crash.
    pub fn close(self) -> Result<()> {
        self.stop_and_wait()
    }

    fn stop_and_wait(&self) -> Result<()> {
        let finished = self.machine.stop_and_wait(CLOSE_WAIT);
        let revoked = match self.state() {
            LivenessState::Stopped { revoked } => Some(revoked),
            _ => None,
        };
        close_outcome(finished, revoked, || self.etcd.gone())
    }
}

/// How long a grant, put, revoke or election request may go unanswered
/// before the machine sends it again (`attempt_timeout` of the `sm`
/// configs): etcd elects a new raft leader 0.9–2.7 s after losing one
/// (measured with default flags), and drops the writes forwarded meanwhile
/// without answering them. Half a second puts a copy out within that much
/// of the new leader; three copies later the wait doubles, so a slow server
/// is not flooded.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a close waits for its lease's revoke to be confirmed: the
/// revoke's request timeout plus the driver's stop slack, generously.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// What `close` reports once a lease-holding machine has stopped: `revoked`
/// is what its final `Stopped` state said, if it got that far, and `gone`
/// the error for a driver that stopped first ([`Etcd::gone`]).
pub(crate) fn close_outcome(
    finished: std::result::Result<Finished, WaitError>,
    revoked: Option<bool>,
    gone: impl FnOnce() -> Error,
) -> Result<()> {
    match (finished, revoked) {
        (Ok(_), Some(true)) => Ok(()),
        // The machine does not say why; etcd being unreachable is the
        // usual reason, and the lease expires by itself either way.
        (Ok(_), Some(false)) => Err(Error::etcd(
            ErrorKind::Unavailable,
            "the lease could not be revoked; it will expire after its TTL",
        )),
        // Cut short by the driver's shutdown before the revoke was answered.
        (Ok(_), None) => Err(gone()),
        (Err(WaitError::Timeout(after)), _) => Err(Error::Timeout(after)),
    }
}

// Dropping the `MachineHandle` stops the keepalive without waiting; see
// "Dropping" in the type's docs.

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Finished;

    #[test]
    fn close_reports_whether_the_revoke_was_confirmed() {
        assert!(close_outcome(Ok(Finished::Done), Some(true), || Error::DriverGone).is_ok());
        match close_outcome(Ok(Finished::Done), Some(false), || Error::DriverGone) {
            Err(Error::Etcd { kind, message }) => {
                assert_eq!(kind, ErrorKind::Unavailable);
                assert!(message.contains("expire after its TTL"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            close_outcome(Ok(Finished::Abandoned), None, || Error::DriverGone),
            Err(Error::DriverGone)
        ));
        let after = Duration::from_secs(10);
        assert!(matches!(
            close_outcome(Err(WaitError::Timeout(after)), Some(true), || Error::DriverGone),
            Err(Error::Timeout(t)) if t == after
        ));
    }
}
