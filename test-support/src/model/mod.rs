//! Exhaustive bounded model checking: every schedule of a small world, not
//! a sample of them.
//!
//! A [`World`] is the model etcd, a few real `fleetcoord-sm` machines and an
//! explicit network ([`Wire`]) between them, where every source of
//! non-determinism is an action the world lists: run a request now, deliver
//! a reply, lose one, let a given-up request land late, let time pass to
//! the next deadline, restart a client, compact, and the users' own
//! requests. [`explore`] visits every state reachable within the world's
//! budgets and horizon, depth first, and checks the world's properties on
//! every transition.
//!
//! Rules of the search:
//! 1. **Every transition is checked.** [`World::apply`] checks the safety
//!    properties after each action and returns the first violation; the
//!    explorer stops there with a [`Counterexample`].
//! 2. **A state is visited once.** States are identified by
//!    [`World::fingerprint`], a 64-bit hash of everything that decides the
//!    future (machines, wire, store, remaining budgets, virtual time). A
//!    world may put interchangeable parts (identical candidates) into its
//!    hash in a canonical order, so permutations of them are one state.
//! 3. **Liveness is bounded.** [`World::check_liveness`] runs on every new
//!    state; worlds check it at quiescent states by running a fault-free
//!    fair continuation for a stated bound of virtual time.
//! 4. **Nothing is vacuous.** A world counts the events that make its
//!    properties mean something ([`World::MARKS`], returned by
//!    [`World::take_marks`]); [`Report::require_marks`] fails a check in
//!    which one of them never happened.
//! 5. **A failure is a test.** A [`Counterexample`] prints its actions with
//!    their virtual times as a Rust array, which [`replay`] runs again from
//!    the same initial world.
//! 6. **Exploring within limits is said.** [`Limits::max_states`] caps a
//!    run; a run that hit the cap reports `complete: false`, and callers
//!    that pin state counts require a complete run.

mod wire;

pub mod barrier;
pub mod election;
pub mod keepalive;
pub mod mirror;
pub mod ratelimit;
pub mod renewals;
pub mod session;
pub mod shard;
pub mod stream;
pub mod watch;

pub use wire::{Lane, Wire, WireAction};

use std::collections::HashSet;
use std::fmt::{self, Debug, Write as _};
use std::hash::{DefaultHasher, Hasher};
use std::time::{Duration, Instant};

/// A closed system whose every choice is an action.
pub trait World: Clone {
    /// One choice: a message, a fault, time passing, a user's request.
    type Action: Clone + Debug;

    /// Names of the vacuity marks, bit `i` of [`World::take_marks`] is
    /// `MARKS[i]`.
    const MARKS: &'static [&'static str];

    /// Appends every action enabled in this state to `out`.
    fn actions(&self, out: &mut Vec<Self::Action>);

    /// Takes `action` and checks every safety property on the way;
    /// `Err(what broke)` on the first violation.
    fn apply(&mut self, action: &Self::Action) -> Result<(), String>;

    /// A hash of everything that decides this state's future.
    fn fingerprint(&self) -> u64;

    /// Bounded liveness from this state; `Err(what did not happen)`.
    fn check_liveness(&mut self) -> Result<(), String> {
        Ok(())
    }

    /// Virtual time since the world began, for traces.
    fn elapsed(&self) -> Duration;

    /// The marks set since the last call (bit `i` is `MARKS[i]`).
    fn take_marks(&mut self) -> u32;

    /// The state in a few lines, for a counterexample's reader.
    fn describe(&self) -> String;
}

/// How much of the state space a run may visit.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Stop after this many distinct states (the run is then incomplete).
    pub max_states: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_states: 5_000_000,
        }
    }
}

/// What a passing run visited.
#[derive(Clone, Debug)]
pub struct Report {
    /// Distinct states visited.
    pub states: usize,
    /// Actions taken (transitions checked), including those into states
    /// already visited.
    pub transitions: u64,
    /// The longest action sequence followed.
    pub max_depth: usize,
    /// Every reachable state within the budgets was visited.
    pub complete: bool,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// How often each mark was set, in [`World::MARKS`] order.
    pub marks: Vec<(&'static str, u64)>,
}

impl Report {
    /// `Err` naming the first of `names` that never happened in this run.
    pub fn require_marks(&self, names: &[&str]) -> Result<(), String> {
        for name in names {
            let count = self
                .marks
                .iter()
                .find(|(mark, _)| mark == name)
                .map(|(_, count)| *count);
            match count {
                Some(c) if c > 0 => {}
                Some(_) => return Err(format!("vacuous: `{name}` never happened")),
                None => return Err(format!("no mark named `{name}`")),
            }
        }
        Ok(())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states, {} transitions, depth {}, {:.1} s{}",
            self.states,
            self.transitions,
            self.max_depth,
            self.elapsed.as_secs_f64(),
            if self.complete { "" } else { " (INCOMPLETE)" }
        )?;
        for (name, count) in &self.marks {
            write!(f, "; {name} {count}")?;
        }
        Ok(())
    }
}

/// A property broken on a path from the initial world.
#[derive(Clone, Debug)]
pub struct Counterexample<A> {
    /// What broke.
    pub message: String,
    /// The state the last action led to ([`World::describe`]).
    pub state: String,
    /// The actions from the initial world, each with the virtual time
    /// (since the world began) it was taken at.
    pub trace: Vec<(Duration, A)>,
}

impl<A: Debug> fmt::Display for Counterexample<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.message)?;
        writeln!(f, "state reached:\n{}", self.state)?;
        writeln!(
            f,
            "after {} actions; replay with `replay(initial, &trace)`:",
            self.trace.len()
        )?;
        writeln!(f, "let trace = [")?;
        for (at, action) in &self.trace {
            writeln!(f, "    {action:?}, // +{} ms", at.as_millis())?;
        }
        write!(f, "];")
    }
}

/// Visits every state reachable from `initial`, checking every transition
/// (see the module's rules). `Err` holds the first violation found.
pub fn explore<W: World>(
    initial: W,
    limits: &Limits,
) -> Result<Report, Box<Counterexample<W::Action>>> {
    struct Frame<W: World> {
        world: W,
        actions: Vec<W::Action>,
        next: usize,
    }
    let started = Instant::now();
    let mut marks = vec![0u64; W::MARKS.len()];
    let mut visited: HashSet<u64> = HashSet::new();
    let mut report = Report {
        states: 1,
        transitions: 0,
        max_depth: 0,
        complete: true,
        elapsed: Duration::ZERO,
        marks: Vec::new(),
    };
    let mut initial = initial;
    count_marks(initial.take_marks(), &mut marks);
    visited.insert(initial.fingerprint());
    let live = initial.check_liveness();
    count_marks(initial.take_marks(), &mut marks);
    if let Err(message) = live {
        return Err(Box::new(Counterexample {
            message,
            state: initial.describe(),
            trace: Vec::new(),
        }));
    }
    let mut actions = Vec::new();
    initial.actions(&mut actions);
    let mut stack = vec![Frame {
        world: initial,
        actions,
        next: 0,
    }];
    let mut path: Vec<(Duration, W::Action)> = Vec::new();
    while let Some(top) = stack.last_mut() {
        let Some(action) = top.actions.get(top.next).cloned() else {
            stack.pop();
            path.pop();
            continue;
        };
        top.next += 1;
        let mut world = top.world.clone();
        report.transitions += 1;
        let applied = world.apply(&action);
        count_marks(world.take_marks(), &mut marks);
        let fail = |message: String, path: &[(Duration, W::Action)], world: &W| {
            let mut trace = path.to_vec();
            trace.push((world.elapsed(), action.clone()));
            Box::new(Counterexample {
                message,
                state: world.describe(),
                trace,
            })
        };
        if let Err(message) = applied {
            return Err(fail(message, &path, &world));
        }
        if !visited.insert(world.fingerprint()) {
            continue;
        }
        report.states += 1;
        let live = world.check_liveness();
        // Marks of the check itself, counted once here rather than again
        // in every clone of this state.
        count_marks(world.take_marks(), &mut marks);
        if let Err(message) = live {
            return Err(fail(message, &path, &world));
        }
        if report.states >= limits.max_states {
            report.complete = false;
            break;
        }
        let mut actions = Vec::new();
        world.actions(&mut actions);
        path.push((world.elapsed(), action));
        report.max_depth = report.max_depth.max(path.len());
        stack.push(Frame {
            world,
            actions,
            next: 0,
        });
    }
    report.elapsed = started.elapsed();
    report.marks = W::MARKS.iter().copied().zip(marks).collect();
    Ok(report)
}

/// Explores `world` completely and holds it to what a pinned world of a
/// test promises: it passes, visits `pinned` states ±20 % (a collapse means
/// the world stopped exploring, a blow-up that a change multiplied the
/// schedules) and sets every mark of `marks`. Prints the report; panics,
/// failing the test, otherwise.
pub fn check_pinned<W: World>(name: &str, world: W, pinned: usize, marks: &[&str]) -> Report {
    let report = match explore(world, &Limits::default()) {
        Ok(report) => report,
        Err(counterexample) => panic!("{name}: {counterexample}"),
    };
    println!("{name}: {report}");
    assert!(report.complete, "{name}: not explored completely");
    let (low, high) = (pinned - pinned / 5, pinned + pinned / 5);
    assert!(
        (low..=high).contains(&report.states),
        "{name}: {} states, pinned at {pinned} ±20 %: re-pin only if the change \
         means to change the schedules",
        report.states
    );
    if let Err(message) = report.require_marks(marks) {
        panic!("{name}: {message}");
    }
    report
}

/// Explores `world`, which must fail with a message containing `expected`
/// (a teeth test: the world or its check is bent). Panics, failing the
/// test, when it passes or fails otherwise.
pub fn check_fails<W: World>(name: &str, world: W, expected: &str) {
    match explore(world, &Limits::default()) {
        Ok(report) => panic!("{name}: passed ({report}), but must fail with `{expected}`"),
        Err(counterexample) => {
            println!(
                "{name}: failed as it must, after {} actions: {}",
                counterexample.trace.len(),
                counterexample.message
            );
            assert!(
                counterexample.message.contains(expected),
                "{name}: must fail with `{expected}`, failed with {counterexample}"
            );
        }
    }
}

fn count_marks(bits: u32, counts: &mut [u64]) {
    for (i, count) in counts.iter_mut().enumerate() {
        if bits & (1 << i) != 0 {
            *count += 1;
        }
    }
}

/// Takes `trace` from `initial` again, checking as [`explore`] does;
/// `Err((index of the failing action, what broke))`, or the final world.
pub fn replay<W: World>(initial: W, trace: &[W::Action]) -> Result<W, (usize, String)> {
    let mut world = initial;
    for (i, action) in trace.iter().enumerate() {
        let mut enabled = Vec::new();
        world.actions(&mut enabled);
        let wanted = format!("{action:?}");
        if !enabled.iter().any(|a| format!("{a:?}") == wanted) {
            return Err((i, format!("action {wanted} is not enabled here")));
        }
        world.apply(action).map_err(|m| (i, m))?;
        world.check_liveness().map_err(|m| (i, m))?;
    }
    Ok(world)
}

/// A [`fmt::Write`] that feeds a hasher: fingerprints from `Debug` output
/// without building the string.
struct HashWriter<'a>(&'a mut DefaultHasher);

impl fmt::Write for HashWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

/// Adds `value`'s `Debug` form to `hasher`. Every machine derives `Debug`
/// over its whole state, so equal forms are equal states.
pub fn hash_debug(hasher: &mut DefaultHasher, value: &impl Debug) {
    // Writing into a hasher cannot fail.
    let _ = write!(HashWriter(hasher), "{value:?}");
    hasher.write_u8(0xff);
}

/// The hash of `value`'s `Debug` form alone.
pub fn debug_hash(value: &impl Debug) -> u64 {
    let mut hasher = DefaultHasher::new();
    hash_debug(&mut hasher, value);
    hasher.finish()
}
