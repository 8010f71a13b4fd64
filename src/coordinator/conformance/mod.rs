//! The public conformance suite every [`Coordinator`] backend must pass,
//! including third-party ones:
//!
//! ```no_run
//! // In tests/conformance_mine.rs, inside a #[test] function:
//! use fleetcoord::coordinator::MemoryCoordinator;
//!
//! let hub = MemoryCoordinator::new();
//! let report = fleetcoord::conformance::run(|| Box::new(hub.clone()));
//! assert!(report.skipped.is_empty());
//! ```
//!
//! **The factory.** Each call must return a new, independent handle onto
//! *the same* backing store — as two processes connected to the same server
//! would be — because several cases check that what one handle writes
//! another sees. Closing one handle must not affect the others. Each case
//! opens its own handles and closes them at its end; names carry a random
//! suffix, so cases never see each other's data even on a shared server.
//!
//! **Restarts.** [`run_with_restart`] also takes a hook that restarts the
//! backend's server (kill it, start it again on the same address with its
//! data); the case "stream appends across a restart are stored exactly
//! once" calls it three times while two threads append, retrying retryable
//! errors, then checks that every `Ok` is stored exactly once and every
//! retryable failure not at all ([`Error::Indeterminate`](crate::Error::Indeterminate)
//! is the only failure that may have been stored). [`run`] runs that case
//! without restarts. The `fleetcoord::testing` servers restart this way.
//!
//! **Asynchronous backends.** Every expected delivery may take up to
//! [`WAIT`]; absence is checked for at most [`QUIET`], or not at all where
//! per-topic, per-stream or per-bucket ordering lets a later item prove that
//! an earlier one was never sent.
//!
//! **Declarations.** Cases a backend declares it cannot pass (through
//! [`Coordinator::capabilities`]) are skipped, and each skip is printed as
//! `skipped: <case> (backend declares ...)` on standard error, bypassing the
//! test harness's output capture so it is always visible.
//!
//! **Unsupported.** A case whose call the backend answers with an error of
//! kind [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) (a
//! backend keeping the trait's default for compare-and-set, a server
//! version that cannot expire single keys) is not failed and not skipped
//! silently: it still checks that the refusal came at once and wrote
//! nothing, is printed as `unsupported: <case> (<why>)` and listed in
//! [`Report::unsupported`]. [`Report::assert_nothing_skipped`] fails on it.
//!
//! **Compare-and-set.** The case of 8 threads incrementing one key makes
//! 100 increments per thread, or `FLEETCOORD_CAS_INCREMENTS` (the full
//! size, 1,000, takes about 100 s on a single etcd member).
//!
//! **Failure kinds.** The same failure is the same [`ErrorKind`](crate::ErrorKind)
//! on every backend (case "one kind per failure"); [`run_refused_connect`]
//! checks that a refused connect is [`Error::Connect`](crate::Error::Connect)
//! of kind `Unavailable` for a backend that connects.
//!
//! [`run`] runs every case, then panics listing each failed case and why.

mod case;
mod expect;
mod kinds;
mod kv;
mod kv_cas;
mod lifecycle;
mod payload;
mod pubsub;
mod restart;
#[cfg(test)]
mod self_test;
mod slow;
mod stream;

pub use kinds::run_refused_connect;
pub use slow::CAPACITY as SLOW_CAPACITY;

use super::{Capabilities, Coordinator};
use case::{Case, Ctx};
use std::cell::RefCell;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// How long one expected item may take to arrive. Generous on purpose:
/// networked backends deliver in tens of milliseconds, but CI machines
/// stall for seconds, and a slow pass is better than a flaky failure. A
/// passing run never waits this long.
pub const WAIT: Duration = Duration::from_secs(5);

/// How long the suite watches for an item that must not arrive. Short,
/// because every passing run pays it.
pub const QUIET: Duration = Duration::from_millis(200);

/// What a run did. Failed cases make [`run`] panic instead of returning.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Report {
    /// What the backend declared.
    pub capabilities: Capabilities,
    /// Cases that ran and passed.
    pub passed: Vec<&'static str>,
    /// Cases skipped by declaration, with the declaration.
    pub skipped: Vec<(&'static str, &'static str)>,
    /// Cases the backend answered with an error of kind
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) (a
    /// capability its server version lacks), with what it said: each is
    /// printed as `unsupported: <case> (<reason>)`. Such a case still
    /// checked that the refusal came at once and wrote nothing; it is not
    /// in `passed`.
    pub unsupported: Vec<(&'static str, String)>,
}

impl Report {
    /// Panics unless every case selected ran and passed: none was skipped
    /// by declaration or answered as unsupported, and at least one ran.
    /// For a backend that declares every capability, the check that
    /// closes its conformance test.
    pub fn assert_nothing_skipped(&self) {
        assert!(
            self.skipped.is_empty(),
            "cases skipped by declaration: {:?}",
            self.skipped
        );
        assert!(
            self.unsupported.is_empty(),
            "cases the backend does not support: {:?}",
            self.unsupported
        );
        assert!(!self.passed.is_empty(), "no case ran");
    }
}

/// Runs every case against handles from `factory` (see the module docs for
/// what the factory must return). Panics, after running all cases, with the
/// name and failure of each case that failed.
pub fn run<F: Fn() -> Box<dyn Coordinator>>(factory: F) -> Report {
    run_selected(&factory, None, None, cases(), |_| true)
}

/// The slow-consumer cases: the contract in the coordinator docs ("Slow
/// consumers"), on feeds of [`SLOW_CAPACITY`] items. `with_capacity(n)`
/// must return a new handle onto the same backing store (as [`run`]'s
/// factory does) whose feeds hold `n` items, or the backend's error for a
/// capacity it refuses — every backend refuses the same bounds, with
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming
/// `feed_capacity`. Panics, after running all cases, listing each failure.
///
/// ```no_run
/// use fleetcoord::coordinator::{Coordinator, EtcdCoordinator, EtcdCoordinatorOptions};
/// use fleetcoord::{Etcd, EtcdOptions};
///
/// let etcd = Etcd::with_options(&["127.0.0.1:2379"], EtcdOptions::default())?;
/// fleetcoord::conformance::run_slow_consumers(|capacity| {
///     let options = EtcdCoordinatorOptions::default().with_feed_capacity(capacity);
///     Ok(Box::new(EtcdCoordinator::on_etcd_with_options(&etcd, options)?) as Box<dyn Coordinator>)
/// });
/// # Ok::<(), fleetcoord::Error>(())
/// ```
pub fn run_slow_consumers<F>(with_capacity: F) -> Report
where
    F: Fn(usize) -> crate::Result<Box<dyn Coordinator>>,
{
    let factory = || match with_capacity(SLOW_CAPACITY) {
        Ok(handle) => handle,
        Err(e) => panic!("a handle with feed capacity {SLOW_CAPACITY}: {e}"),
    };
    run_selected(
        &factory,
        None,
        Some(&with_capacity),
        slow::CASES.iter(),
        |_| true,
    )
}

/// [`run`], with `restart` restarting the backend's server (all of its
/// nodes, for a cluster) and returning once it serves again, keeping its
/// data and address: the restart case then restarts it while appending.
///
/// ```no_run
/// use fleetcoord::coordinator::{Coordinator, EtcdCoordinator};
/// use fleetcoord::testing::EtcdServer;
/// use std::sync::Mutex;
///
/// let server = Mutex::new(EtcdServer::start()?);
/// let endpoint = server.lock().unwrap().endpoint();
/// fleetcoord::conformance::run_with_restart(
///     || Box::new(EtcdCoordinator::connect(&endpoint).expect("connect")) as Box<dyn Coordinator>,
///     || server.lock().unwrap().restart(),
/// );
/// # Ok::<(), fleetcoord::Error>(())
/// ```
pub fn run_with_restart<F, R>(factory: F, restart: R) -> Report
where
    F: Fn() -> Box<dyn Coordinator>,
    R: Fn() -> crate::Result<()>,
{
    run_selected(&factory, Some(&restart), None, cases(), |_| true)
}

/// Every case, one concern after another.
fn cases() -> impl Iterator<Item = &'static Case> {
    [
        lifecycle::CASES,
        pubsub::CASES,
        stream::CASES,
        restart::CASES,
        kv::CASES,
        kv_cas::CASES,
        payload::CASES,
        kinds::CASES,
    ]
    .into_iter()
    .flatten()
}

/// Runs the `cases` whose name `select` accepts.
fn run_selected<'a>(
    factory: &dyn Fn() -> Box<dyn Coordinator>,
    restart: Option<&dyn Fn() -> crate::Result<()>>,
    with_capacity: Option<&dyn Fn(usize) -> crate::Result<Box<dyn Coordinator>>>,
    cases: impl Iterator<Item = &'a Case>,
    select: impl Fn(&str) -> bool,
) -> Report {
    let capabilities = {
        let probe = factory();
        let caps = probe.capabilities();
        let _ = probe.close();
        caps
    };
    let mut report = Report {
        capabilities,
        ..Report::default()
    };
    let mut failures = Vec::new();
    for case in cases.filter(|c| select(c.name)) {
        if let Some(reason) = case.needs.unmet(&capabilities) {
            let _ = writeln!(
                std::io::stderr().lock(),
                "skipped: {} (backend declares {reason})",
                case.name
            );
            report.skipped.push((case.name, reason));
            continue;
        }
        let ctx = Ctx {
            factory,
            with_capacity,
            restart,
            caps: capabilities,
            opened: RefCell::new(Vec::new()),
            unsupported: RefCell::new(None),
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| (case.run)(&ctx)));
        for c in ctx.opened.borrow().iter() {
            let _ = c.close();
        }
        match (outcome, ctx.unsupported.into_inner()) {
            (Ok(()), Some(why)) => {
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "unsupported: {} ({why})",
                    case.name
                );
                report.unsupported.push((case.name, why));
            }
            (Ok(()), None) => report.passed.push(case.name),
            (Err(panic), _) => failures.push(format!("{}: {}", case.name, panic_text(&*panic))),
        }
    }
    let _ = writeln!(
        std::io::stderr().lock(),
        "conformance suite: {} case(s) ok, {} skipped by declaration, {} unsupported, {} failing",
        report.passed.len(),
        report.skipped.len(),
        report.unsupported.len(),
        failures.len()
    );
    if !failures.is_empty() {
        panic!(
            "{} conformance case(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    }
    report
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked".to_owned()
    }
}
