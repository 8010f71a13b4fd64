//! Running a command only while holding leadership or a lock
//! (`elect NAME -- CMD`, `lock NAME -- CMD`).
//!
//! The contract for the child: it starts only once etcd has granted the
//! leadership/lock, with `FLEETCOORD_FENCING_TOKEN` in its environment, and
//! it is dead before anyone else can be granted it:
//! * renewals failing (session `Suspended`) → SIGTERM, then SIGKILL after
//!   `--kill-grace`, but never later than [`suspended_kill_bound`] — a point
//!   before the local leadership deadline, which itself precedes etcd's
//!   lease expiry;
//! * the local deadline passing anyway (leadership `lost`, or `is_held`
//!   false by this process's clock, whichever is seen first) → SIGKILL at
//!   once;
//! * SIGINT/SIGTERM/SIGHUP to fleetcoord → SIGTERM to the child, SIGKILL
//!   after `--kill-grace`; fleetcoord then exits 0 if the child obeyed
//!   (exited 0 or died of that SIGTERM), else with its status
//!   ([`finish_stopped`]);
//! * fleetcoord dying without cleaning up (SIGKILL, OOM kill, crash) →
//!   SIGKILL to the child's process group at once, on Linux
//!   ([`crate::tether`]): the lease outlives fleetcoord by up to a TTL,
//!   the child must not;
//!
//! * the child exiting → whatever it left running in its process group is
//!   SIGKILLed (on Linux), then resign/unlock, and fleetcoord exits with
//!   the child's status (`--restart`: campaign again and rerun it).
//!
//! Signals go to the child's process group (it runs in its own), so what a
//! `sh -c` wrapper starts is stopped too.

use crate::output::{event, Out};
use crate::tether::{self, Tether};
use crate::CliError;
use crossbeam_channel::{select, Receiver};
use fleetcoord::LivenessState;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The variable the child finds its fencing token in.
pub const TOKEN_VAR: &str = "FLEETCOORD_FENCING_TOKEN";

/// How often the supervisor looks at the child and the session. Bounds how
/// late a SIGTERM after `Suspended` can be.
const TICK: Duration = Duration::from_millis(10);

/// Kept free before the local deadline when killing after `Suspended`:
/// delivering SIGKILL and reaping the child takes a few milliseconds, a
/// loaded machine more.
const KILL_MARGIN: Duration = Duration::from_millis(200);

/// The latest moment to SIGKILL after the session turned `Suspended` at
/// `suspended`, for a session that trusts its lease for `trusted`
/// ([`fleetcoord::ElectionOptions::trusted_lifetime`]: the TTL less the
/// drift allowance and the safety margin). The keepalive sends a renewal a
/// third of that after the last acknowledged one and declares it failed at
/// the latest at the midpoint of the lifetime left, so at `Suspended` at
/// least a third of it remains before the local deadline (which comes at
/// least the safety margin before etcd's own expiry). Minus [`KILL_MARGIN`]
/// for the kill itself.
pub fn suspended_kill_bound(suspended: Instant, trusted: Duration) -> Instant {
    suspended + (trusted / 3).saturating_sub(KILL_MARGIN)
}

/// The options every gated command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct GateArgs {
    /// After SIGTERM, how long the command may take to exit before SIGKILL
    /// (capped so that it is dead before the leadership/lock can pass on).
    #[arg(long, default_value = "10s", value_parser = crate::duration::timeout, requires = "command")]
    pub kill_grace: Duration,
    /// When the command exits or is killed, campaign again and rerun it
    /// instead of exiting.
    #[arg(long, requires = "command")]
    pub restart: bool,
    /// The command to run while held, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What the supervisor needs of a held leadership or lock.
pub trait Held {
    fn token(&self) -> i64;
    fn lost(&self) -> &Receiver<()>;
    /// Whether it may still be believed, by the calling thread's clock.
    fn is_held(&self) -> bool;
    /// Resign or unlock, waiting for etcd.
    fn release(self: Box<Self>) -> Result<(), fleetcoord::Error>;
    /// Fires when a candidate of a higher priority waits (never for a lock).
    fn step_down(&self) -> Receiver<()> {
        crossbeam_channel::never()
    }
    /// The candidate an operator asked this holder to hand over to.
    fn hand_over_requested(&self) -> Option<Vec<u8>> {
        None
    }
    /// Forget the request just read (acted on, or naming this holder).
    fn clear_hand_over_request(&self) {}
    /// Whether `to` names this holder (its key).
    fn is_named(&self, _to: &[u8]) -> bool {
        false
    }
    /// Hand over to `to`; a holder that cannot releases instead.
    fn hand_over(self: Box<Self>, _to: &[u8]) -> Result<(), fleetcoord::Error> {
        self.release()
    }
}

impl Held for fleetcoord::Leadership {
    fn token(&self) -> i64 {
        self.fencing_token()
    }
    fn lost(&self) -> &Receiver<()> {
        fleetcoord::Leadership::lost(self)
    }
    fn is_held(&self) -> bool {
        fleetcoord::Leadership::is_held(self)
    }
    fn release(self: Box<Self>) -> Result<(), fleetcoord::Error> {
        self.resign()
    }
    fn step_down(&self) -> Receiver<()> {
        self.step_down_requested().clone()
    }
    fn hand_over_requested(&self) -> Option<Vec<u8>> {
        fleetcoord::Leadership::hand_over_requested(self)
            .ok()
            .flatten()
    }
    fn clear_hand_over_request(&self) {
        let _ = fleetcoord::Leadership::clear_hand_over_request(self);
    }
    fn is_named(&self, to: &[u8]) -> bool {
        self.key().as_bytes() == to
    }
    fn hand_over(self: Box<Self>, to: &[u8]) -> Result<(), fleetcoord::Error> {
        let result = fleetcoord::Leadership::hand_over(&self, to);
        if let Err(e) = &result {
            // The operator who asked learns why at once. The command is
            // already stopped: give the lead up rather than hold it
            // without one; the campaign starts over.
            let reason = format!("{e}; its command was stopped first, so it resigned");
            let _ = self.refuse_hand_over(&reason);
            return self.resign().and(result);
        }
        result
    }
}

impl Held for fleetcoord::MutexGuard {
    fn token(&self) -> i64 {
        self.fencing_token()
    }
    fn lost(&self) -> &Receiver<()> {
        fleetcoord::MutexGuard::lost(self)
    }
    fn is_held(&self) -> bool {
        fleetcoord::MutexGuard::is_held(self)
    }
    fn release(self: Box<Self>) -> Result<(), fleetcoord::Error> {
        self.unlock()
    }
}

impl Held for fleetcoord::RwLockGuard {
    fn token(&self) -> i64 {
        self.fencing_token()
    }
    fn lost(&self) -> &Receiver<()> {
        fleetcoord::RwLockGuard::lost(self)
    }
    fn is_held(&self) -> bool {
        fleetcoord::RwLockGuard::is_held(self)
    }
    fn release(self: Box<Self>) -> Result<(), fleetcoord::Error> {
        self.unlock()
    }
}

impl Held for fleetcoord::SemaphoreGuard {
    fn token(&self) -> i64 {
        self.fencing_token()
    }
    fn lost(&self) -> &Receiver<()> {
        fleetcoord::SemaphoreGuard::lost(self)
    }
    fn is_held(&self) -> bool {
        fleetcoord::SemaphoreGuard::is_held(self)
    }
    fn release(self: Box<Self>) -> Result<(), fleetcoord::Error> {
        (*self).release()
    }
}

/// How one run of the command ended.
pub enum Ended {
    /// The command exited by itself (or after a signal we forwarded on
    /// shutdown); the hold is released.
    Exited { status: ExitStatus, shutdown: bool },
    /// The hold was lost or could not be kept; the command is dead.
    Lost,
    /// The command was stopped (as on a signal) to step down: for a
    /// higher priority (`handed_to` None: resigned) or for an operator's
    /// hand-over request; `outcome` says whether the release worked.
    SteppedDown {
        status: ExitStatus,
        handed_to: Option<Vec<u8>>,
        outcome: Result<(), fleetcoord::Error>,
    },
}

/// When a leader steps down without a signal (`elect --yield-to-higher`,
/// `--accept-hand-over`).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepDown {
    /// Stop the command and resign when a higher priority waits.
    pub on_higher: bool,
    /// Look for hand-over requests every [`HAND_OVER_POLL`].
    pub hand_over_requests: bool,
}

/// How often a leader that accepts hand-over requests reads the request
/// key: one fenced read, only while leading with `--accept-hand-over`.
pub const HAND_OVER_POLL: Duration = Duration::from_millis(250);

/// Microseconds since the Unix epoch: comparable across processes on one
/// machine, which is what the hand-over tests measure with. `started`
/// reports the time just before the spawn, `exited` the time just after
/// the child was reaped, so a gap between one instance's `exited` and the
/// next one's `started` is never overstated.
pub fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// Signals the child's whole process group: a `sh -c` wrapper's own
/// children must stop too, or "the command is dead" would be a lie.
fn signal(child: &Child, signal: Signal) {
    // A pid that does not fit is impossible on Linux; std's kill of the
    // child itself still follows then.
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = killpg(Pid::from_raw(pid), signal);
    }
}

/// SIGKILL to the child's process group, then to the child itself.
fn kill_now(child: &mut Child) {
    signal(child, Signal::SIGKILL);
    let _ = child.kill();
}

/// Runs `args.command` while `held` is held, as the module docs describe.
pub fn run(
    out: &Out,
    what: &str,
    args: &GateArgs,
    held: Box<dyn Held>,
    trusted: Duration,
    session: &dyn Fn() -> Option<LivenessState>,
    shutdown: &Receiver<()>,
) -> Result<Ended, CliError> {
    run_stepping(
        out,
        what,
        args,
        held,
        trusted,
        session,
        shutdown,
        StepDown::default(),
    )
}

/// [`run`], also stepping down as `stepping` says: the command is stopped
/// exactly as on a signal (SIGTERM, SIGKILL after `--kill-grace`), and
/// only once it is dead is the leadership resigned or handed over, so the
/// next leader's command never overlaps this one.
#[allow(clippy::too_many_arguments)]
pub fn run_stepping(
    out: &Out,
    what: &str,
    args: &GateArgs,
    held: Box<dyn Held>,
    trusted: Duration,
    session: &dyn Fn() -> Option<LivenessState>,
    shutdown: &Receiver<()>,
    stepping: StepDown,
) -> Result<Ended, CliError> {
    let token = held.token();
    let Some((program, rest)) = args.command.split_first() else {
        return Err(CliError::Message("no command to run".into()));
    };
    // Taken before the spawn: the child cannot start earlier, so a
    // hand-over gap measured from it is never overstated.
    let starting_at = unix_micros();
    let tether = Tether::new().map_err(|e| {
        CliError::Message(format!(
            "cannot start {program:?}: cannot fork its watchdog: {e}"
        ))
    })?;
    // Its own process group, so that signals reach everything it starts.
    // A terminal's Ctrl-C then reaches only fleetcoord, which forwards it.
    let mut command = Command::new(program);
    command
        .args(rest)
        .env(TOKEN_VAR, token.to_string())
        .process_group(0);
    // Should fleetcoord die without cleaning up, the group dies with it.
    tether.arm(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            // Reaped by the failed spawn: nothing for the watchdog to kill.
            tether.disarm();
            return Err(CliError::Message(format!("cannot start {program:?}: {e}")));
        }
    };
    out.emit(
        format!(
            "{what}: started {program} (pid {}) with fencing token {token}",
            child.id()
        ),
        event(
            "started",
            [
                ("pid", json!(child.id())),
                ("token", json!(token)),
                ("at_unix_us", json!(starting_at as u64)),
            ],
        ),
    )?;

    let mut kill_at: Option<Instant> = None;
    let mut termed = false;
    let mut lost = false;
    let mut stopping = false;
    // `Some(None)`: resign for a higher priority; `Some(Some(to))`: hand over.
    let mut step: Option<Option<Vec<u8>>> = None;
    let mut next_poll = Instant::now() + HAND_OVER_POLL;
    let step_down = if stepping.on_higher {
        held.step_down()
    } else {
        crossbeam_channel::never()
    };
    let status = loop {
        select! {
            recv(step_down) -> _ => {
                if !termed {
                    termed = true;
                    step = Some(None);
                    signal(&child, Signal::SIGTERM);
                    kill_at = Some(Instant::now() + args.kill_grace);
                    out.emit(
                        format!("{what}: a higher priority waits; sent SIGTERM to {program}"),
                        event("stepping_down", [("token", json!(token))]),
                    )?;
                }
            }
            recv(held.lost()) -> _ => {
                // The local deadline passed: not a moment longer.
                lost = true;
                kill_now(&mut child);
            }
            recv(shutdown) -> _ => {
                stopping = true;
                if !termed {
                    termed = true;
                    signal(&child, Signal::SIGTERM);
                    kill_at = Some(Instant::now() + args.kill_grace);
                }
            }
            default(TICK) => {}
        }
        // Whatever the command left running in its group dies with it:
        // the hold is released right after.
        if let Some(status) = tether::try_wait_clearing_group(&mut child)
            .map_err(|e| CliError::Message(format!("cannot wait for {program:?}: {e}")))?
        {
            break status;
        }
        if stepping.hand_over_requests && !termed && Instant::now() >= next_poll {
            next_poll = Instant::now() + HAND_OVER_POLL;
            if let Some(to) = held.hand_over_requested() {
                if held.is_named(&to) {
                    held.clear_hand_over_request();
                } else {
                    termed = true;
                    signal(&child, Signal::SIGTERM);
                    kill_at = Some(Instant::now() + args.kill_grace);
                    out.emit(
                        format!(
                            "{what}: asked to hand over to {}; sent SIGTERM to {program}",
                            String::from_utf8_lossy(&to)
                        ),
                        event("handing_over", [("token", json!(token))]),
                    )?;
                    step = Some(Some(to));
                }
            }
        }
        if !lost && !held.is_held() {
            // The deadline passed by this thread's clock, before the
            // driver said so (it may be starved): not a moment longer.
            lost = true;
            kill_now(&mut child);
        }
        if !termed && matches!(session(), Some(LivenessState::Suspended { .. })) {
            termed = true;
            let now = Instant::now();
            signal(&child, Signal::SIGTERM);
            kill_at = Some((now + args.kill_grace).min(suspended_kill_bound(now, trusted)));
            out.emit(
                format!("{what}: renewals failing; sent SIGTERM to {program}"),
                event("suspended", [("token", json!(token))]),
            )?;
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            kill_at = None;
            kill_now(&mut child);
        }
    };
    // Reaped. An early return above drops the tether armed instead: the
    // command is abandoned, so its watchdog kills it.
    tether.disarm();
    out.emit(
        format!("{what}: {program} exited ({status})"),
        event(
            "exited",
            [
                ("code", json!(status.code())),
                ("token", json!(token)),
                ("at_unix_us", json!(unix_micros() as u64)),
            ],
        ),
    )?;
    // Killed because renewals failed: the hold is as good as gone, even if
    // the session recovers; give it up rather than keep it without a child.
    if let (false, false, Some(step)) = (lost, stopping, step) {
        let outcome = match &step {
            None => held.release(),
            Some(to) => held.hand_over(to),
        };
        return Ok(Ended::SteppedDown {
            status,
            handed_to: step,
            outcome,
        });
    }
    if lost || (termed && !stopping) {
        drop(held);
        return Ok(Ended::Lost);
    }
    held.release()?;
    Ok(Ended::Exited {
        status,
        shutdown: stopping,
    })
}

/// Whether `status` is the command's answer to the SIGTERM fleetcoord
/// forwarded when it was itself asked to stop: exiting 0, dying of that
/// SIGTERM, or exiting 143 (128 + SIGTERM, as a shell wrapper reports a
/// child killed by it). Anything else (its own failure code, 137 after
/// the SIGKILL of `--kill-grace`) says the stop did not go cleanly.
pub fn stopped_as_asked(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let sigterm = Signal::SIGTERM as i32;
    status.success() || status.signal() == Some(sigterm) || status.code() == Some(128 + sigterm)
}

/// The exit status after fleetcoord was asked to stop (SIGINT, SIGTERM,
/// SIGHUP) and stopped the command: 0 when it stopped as asked
/// ([`stopped_as_asked`]), as for a command without one, so that
/// `systemctl stop` leaves the unit inactive rather than failed;
/// otherwise the command's status, passed on as [`exit_code`] says.
pub fn finish_stopped(status: ExitStatus) -> Result<(), CliError> {
    if stopped_as_asked(status) {
        return Ok(());
    }
    match exit_code(status) {
        0 => Ok(()),
        code => Err(CliError::Exit(code)),
    }
}

/// The exit code that passes the command's status on: its code, or
/// 128 + the signal that killed it, as shells report.
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
        (None, None) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kill_bound_leaves_a_third_of_the_trusted_lifetime_minus_the_margin() {
        let t = Instant::now();
        assert_eq!(
            suspended_kill_bound(t, Duration::from_secs(3)),
            t + Duration::from_millis(800)
        );
        // A TTL so short that the margin eats the third: kill at once.
        assert_eq!(suspended_kill_bound(t, Duration::from_millis(300)), t);
    }

    #[test]
    fn a_stop_asked_for_is_clean_only_if_the_command_obeyed() {
        use std::os::unix::process::ExitStatusExt;
        for clean in [0, 15, 143 << 8] {
            assert!(stopped_as_asked(ExitStatus::from_raw(clean)), "{clean}");
        }
        // SIGKILL after --kill-grace, a failure of its own, SIGINT.
        for unclean in [9, 1 << 8, 3 << 8, 2, 137 << 8] {
            assert!(
                !stopped_as_asked(ExitStatus::from_raw(unclean)),
                "{unclean}"
            );
        }
    }

    #[test]
    fn exit_codes_pass_through() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
    }
}
