//! The soak's `RwLock` workload (issue 49): [`ACTORS`] handles of one
//! read-write lock, each on a candidate's connection (or the churner's),
//! so the nemesis's partitions and resets reach them, take a read or the
//! write at random with a bounded wait, hold a random while with a fenced
//! write every 20 ms (a writer puts its token on [`FENCE_KEY`], a reader
//! on a key of its own, each reading back the revision it landed at),
//! release, and after a loss try one more fenced write with the stale
//! guard. Once the nemesis has stopped, each takes the write and then a
//! read once more, bounded ([`FINAL`]).
//!
//! [`check`] lists every violation of, apart:
//! * **effects safety** (strict: etcd's fence decides, no server early
//!   revocation excuses it): ordered by the revision etcd applied them at,
//!   no fenced write of a hold lands between two of a writer's in the
//!   wrong token order. A writer holds only once every older key of the
//!   lock is gone, and a younger reader or writer only once the writer's
//!   key is gone, so every fenced write with a smaller token than a
//!   writer's lands before each of the writer's, every one with a greater
//!   token after. A stale token let through shows up here;
//! * **belief safety** (`../common/belief.rs`): no writer's belief (from
//!   the acquire's return to the last `is_held() == true`) overlaps any
//!   other holder's, unless the stale one is a holder whose key etcd
//!   deleted while its session was still trusted (a server early
//!   revocation: printed with its evidence, not failed); no belief seen
//!   after the holder's own fenced call was refused (10 ms); and in
//!   acquisition order, the tokens of two holds one of which is a writer's
//!   rise (the older key holds first);
//! * **readers share**: at least once two readers believed at the same
//!   time (else the lock serialized readers, or the workload never
//!   tested sharing);
//! * **liveness**: every bounded acquire returned within its bound + 1 s
//!   (the soak's `Timed`, checked with the others), and once the faults
//!   stopped, every final acquire succeeded within [`FINAL`].

use crate::belief::{self, Belief, Overlap};
use crate::liveness::Timed;
use crate::raw_history::Change;
use crate::{between, connect, Shared, CAMPAIGN, REQUEST_TIMEOUT, TTL};
use fleetcoord::{LockOptions, RwLock, RwLockGuard, RwMode, TxnOp, TxnOpResponse};
use parking_lot::Mutex;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The lock's name, and how many handles contend for it.
pub const NAME: &str = "soak";
pub const ACTORS: usize = 4;
/// Where writers put their tokens; readers put theirs under
/// [`READER_KEYS`].
pub const FENCE_KEY: &str = "/soak/rw/fence";
const READER_KEYS: &str = "/soak/rw/reader-";
/// The bound of each final acquire once the faults stopped: the
/// election's bound for a free lock (2 × TTL + 2 s: a holder's lease cut
/// off by the last fault may live a TTL more, its successor's session
/// may need one to come back), the others' final holds being short.
pub const FINAL: Duration = Duration::from_secs(6);
/// How long holds take at most (ms).
const HOLD_MS: (u64, u64) = (50, 900);

/// One hold as its actor saw it.
#[derive(Clone, Debug)]
pub struct Hold {
    pub actor: usize,
    pub mode: RwMode,
    pub token: i64,
    pub key: String,
    pub from: Instant,
    pub last_held_at: Instant,
    pub lost: bool,
    pub trusted: Vec<(Instant, Option<Instant>)>,
    pub first_refusal: Option<Instant>,
}

impl Hold {
    pub fn belief(&self) -> Belief {
        let side = match self.mode {
            RwMode::Read => "reader",
            RwMode::Write => "writer",
        };
        Belief {
            who: format!("rw actor {} ({side})", self.actor),
            token: self.token,
            key: self.key.clone(),
            from: self.from,
            last_held_at: self.last_held_at,
            lost: self.lost,
            trusted: self.trusted.clone(),
            first_refusal: self.first_refusal,
        }
    }

    fn open_together(&self, other: &Hold) -> bool {
        self.from < other.last_held_at && other.from < self.last_held_at
    }
}

/// A fenced write etcd applied: the hold's token and side, and the
/// revision it landed at.
#[derive(Clone, Copy, Debug)]
pub struct Effect {
    pub token: i64,
    pub mode: RwMode,
    pub revision: i64,
}

/// What the actors did.
#[derive(Default)]
pub struct Record {
    pub holds: Vec<Hold>,
    pub effects: Vec<Effect>,
    /// Fenced writes tried with a guard after it was lost: refused, and
    /// let through (those are in `effects` too, for the ordering check).
    pub stale_refused: usize,
    pub stale_applied: usize,
    /// Each final acquire: actor, side, how long it took or why it failed.
    pub finals: Vec<(usize, RwMode, Result<Duration, String>)>,
}

/// Shared between the run and its actors.
pub struct Control {
    pub record: Mutex<Record>,
    /// Set once the nemesis stopped: each actor then does its final
    /// acquires and counts itself in `finished`.
    pub final_phase: AtomicBool,
    pub finished: AtomicUsize,
}

impl Control {
    pub fn new() -> Control {
        Control {
            record: Mutex::new(Record::default()),
            final_phase: AtomicBool::new(false),
            finished: AtomicUsize::new(0),
        }
    }
}

/// The lock's root, for the raw history.
pub fn prefix() -> String {
    format!("{}{NAME}/", fleetcoord::DEFAULT_RWLOCK_PREFIX)
}

fn side_name(mode: RwMode) -> &'static str {
    match mode {
        RwMode::Read => "read",
        RwMode::Write => "write",
    }
}

/// One fenced write with `guard`; true when etcd refused it.
fn fenced(i: usize, guard: &RwLockGuard, control: &Control) -> bool {
    let token = guard.fencing_token();
    let key = match guard.mode() {
        RwMode::Write => FENCE_KEY.to_string(),
        RwMode::Read => format!("{READER_KEYS}{i}"),
    };
    match guard.txn_if_held([
        TxnOp::put(key.as_str(), token.to_string()),
        TxnOp::get(key.as_str()),
    ]) {
        Ok(Some(responses)) => {
            if let Some(TxnOpResponse::Get { kvs }) = responses.get(1) {
                if let Some(kv) = kvs.first() {
                    control.record.lock().effects.push(Effect {
                        token,
                        mode: guard.mode(),
                        revision: kv.mod_revision,
                    });
                }
            }
            false
        }
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Holds `guard` until `until` (or its loss), sampling the belief and
/// writing fenced every 20 ms, then records the hold.
fn hold(
    i: usize,
    lock: &RwLock,
    guard: &RwLockGuard,
    from: Instant,
    until: Instant,
    shared: &Shared,
    control: &Control,
) {
    let mut last_held_at = from;
    let mut trusted = Vec::new();
    let mut first_refusal = None;
    let mut lost = false;
    loop {
        // Taken before the check: the flag only ever turns false.
        let t = Instant::now();
        let held = guard.is_held();
        crate::sample(&mut trusted, t, lock.session_trusted_until());
        if !held {
            lost = true;
            break;
        }
        last_held_at = t;
        if fenced(i, guard, control) && first_refusal.is_none() {
            first_refusal = Some(Instant::now());
        }
        if shared.stop.load(Ordering::SeqCst) || Instant::now() >= until {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    if lost {
        // The stale guard: etcd must refuse it unless no newer holder
        // has written yet (the checker orders the effects by revision).
        let before = control.record.lock().effects.len();
        let refused = fenced(i, guard, control);
        let mut record = control.record.lock();
        if refused {
            record.stale_refused += 1;
        } else if record.effects.len() > before {
            record.stale_applied += 1;
        }
    }
    control.record.lock().holds.push(Hold {
        actor: i,
        mode: guard.mode(),
        token: guard.fencing_token(),
        key: guard.key().to_string(),
        from,
        last_held_at,
        lost,
        trusted,
        first_refusal,
    });
}

/// One actor: random sides, bounded waits, random holds; the final
/// acquires once the nemesis stopped.
pub fn actor(
    i: usize,
    endpoints: Vec<String>,
    shared: Arc<Shared>,
    control: Arc<Control>,
    seed: u64,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let options = LockOptions::default().with_ttl(TTL);
    let mut finals_done = false;
    'client: while !shared.stop.load(Ordering::SeqCst) {
        let Some(etcd) = connect(&endpoints, &shared.stop) else {
            break;
        };
        let lock = match RwLock::with_options(&etcd, NAME, options.clone()) {
            Ok(l) => l,
            Err(_) => {
                thread::sleep(Duration::from_millis(100));
                continue 'client;
            }
        };
        while !shared.stop.load(Ordering::SeqCst) {
            if finals_done {
                thread::sleep(Duration::from_millis(50));
                continue;
            }
            if control.final_phase.load(Ordering::SeqCst) {
                for mode in [RwMode::Write, RwMode::Read] {
                    let asked = Instant::now();
                    let outcome = match lock.lock(mode, Some(FINAL)) {
                        Ok(guard) => {
                            let took = asked.elapsed();
                            let now = Instant::now();
                            hold(i, &lock, &guard, now, now, &shared, &control);
                            let _ = guard.unlock();
                            Ok(took)
                        }
                        Err(e) => Err(format!("{e} after {:.2?}", asked.elapsed())),
                    };
                    control.record.lock().finals.push((i, mode, outcome));
                }
                finals_done = true;
                control.finished.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            // Three reads for two writes: enough readers to share often,
            // enough writers to exclude them often.
            let mode = if rng.next_u64() % 5 < 3 {
                RwMode::Read
            } else {
                RwMode::Write
            };
            let asked = Instant::now();
            let result = lock.lock(mode, Some(CAMPAIGN));
            let returned = Instant::now();
            shared.timeline.lock().timed.push(Timed {
                what: match mode {
                    RwMode::Read => "rwlock read_timeout(1s)",
                    RwMode::Write => "rwlock write_timeout(1s)",
                },
                took: returned - asked,
                bound: CAMPAIGN,
            });
            let Ok(guard) = result else {
                thread::sleep(Duration::from_millis(50));
                continue;
            };
            let until = returned + between(&mut rng, HOLD_MS.0, HOLD_MS.1);
            hold(i, &lock, &guard, returned, until, &shared, &control);
            let released_at = Instant::now();
            let _ = guard.unlock();
            shared.timeline.lock().timed.push(Timed {
                what: "rwlock unlock",
                took: released_at.elapsed(),
                bound: REQUEST_TIMEOUT,
            });
        }
        let _ = lock.close();
    }
    if !finals_done {
        // Stopped before the final phase reached it (a connection that
        // never came back): counted, so the run does not wait for it; the
        // missing finals are a violation of their own.
        control.finished.fetch_add(1, Ordering::SeqCst);
    }
}

/// The workload's figures and violations.
pub struct Report {
    pub overlaps: Vec<Overlap>,
    pub beliefs: Vec<Belief>,
    pub violations: Vec<String>,
    pub summary: String,
}

/// Checks the record (see the module docs); `changes` is the raw history,
/// `origin` the run's clock zero.
pub fn check(record: &Record, changes: &[Change], origin: Instant) -> Report {
    let mut violations = Vec::new();
    let mut holds = record.holds.clone();
    holds.sort_by_key(|h| (h.from, h.token));
    let beliefs: Vec<Belief> = holds.iter().map(Hold::belief).collect();

    // Belief safety: each pair with a writer in it, open together.
    let mut overlaps = Vec::new();
    let mut reader_pairs = 0usize;
    for (a, x) in holds.iter().enumerate() {
        for (b, y) in holds.iter().enumerate().skip(a + 1) {
            if !x.open_together(y) {
                continue;
            }
            if x.mode == RwMode::Read && y.mode == RwMode::Read {
                reader_pairs += 1;
                continue;
            }
            let pair = [beliefs[a].clone(), beliefs[b].clone()];
            for mut o in belief::overlaps(&pair, 1, changes, origin) {
                o.newest = if o.newest == 0 { a } else { b };
                o.holders = vec![a, b];
                if !o.early_revocation {
                    violations.push(format!(
                        "overlap of rwlock holds (fleetcoord bug): {}",
                        o.report
                    ));
                }
                overlaps.push(o);
            }
        }
    }
    violations.extend(belief::outlived_refusal(
        &beliefs,
        crate::history::EVIDENCE_BOUND,
        origin,
    ));
    // Tokens in acquisition order, where a writer is involved and the two
    // did not believe together (those are the overlaps above).
    for (a, x) in holds.iter().enumerate() {
        for y in holds.iter().skip(a + 1) {
            let writer = x.mode == RwMode::Write || y.mode == RwMode::Write;
            if writer && !x.open_together(y) && y.token < x.token {
                violations.push(format!(
                    "rwlock token order: {:?} token {} acquired after {:?} token {}",
                    y.mode, y.token, x.mode, x.token
                ));
            }
        }
    }
    if reader_pairs == 0 {
        violations.push(format!(
            "rwlock: no two readers ever held together ({} read holds)",
            holds.iter().filter(|h| h.mode == RwMode::Read).count()
        ));
    }

    // Effects safety, by revision.
    violations.extend(effect_order(&record.effects));

    // Liveness once the faults stopped.
    let mut final_times = Vec::new();
    for (actor, mode, outcome) in &record.finals {
        match outcome {
            Ok(took) if *took <= FINAL => final_times.push(*took),
            Ok(took) => violations.push(format!(
                "rwlock actor {actor}: final {} took {took:.2?} (bound {FINAL:?})",
                side_name(*mode)
            )),
            Err(e) => violations.push(format!(
                "rwlock actor {actor}: final {} failed: {e} (bound {FINAL:?})",
                side_name(*mode)
            )),
        }
    }
    if record.finals.len() != ACTORS * 2 {
        violations.push(format!(
            "rwlock: {} final acquires of {} ran",
            record.finals.len(),
            ACTORS * 2
        ));
    }
    let max_readers = max_concurrent_readers(&holds);
    let early = overlaps.iter().filter(|o| o.early_revocation).count();
    let slowest = final_times.iter().max().copied().unwrap_or_default();
    let summary = format!(
        "rwlock: {} holds ({} read, {} write), {} fenced writes applied; {} reader pairs held \
         together (at most {max_readers} readers at once); {} writer overlaps ({early} server \
         early revocation, {} fleetcoord bug); stale guards: {} refused, {} let through (checked \
         by order); final acquires slowest {slowest:.2?}",
        holds.len(),
        holds.iter().filter(|h| h.mode == RwMode::Read).count(),
        holds.iter().filter(|h| h.mode == RwMode::Write).count(),
        record.effects.len(),
        reader_pairs,
        overlaps.len(),
        overlaps.len() - early,
        record.stale_refused,
        record.stale_applied,
    );
    Report {
        overlaps,
        beliefs,
        violations,
        summary,
    }
}

/// The most read holds believed at one instant.
fn max_concurrent_readers(holds: &[Hold]) -> usize {
    let mut edges: Vec<(Instant, i32)> = holds
        .iter()
        .filter(|h| h.mode == RwMode::Read && h.from < h.last_held_at)
        .flat_map(|h| [(h.from, 1), (h.last_held_at, -1)])
        .collect();
    // Ends before starts at one instant: touching is not together.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most.max(0) as usize
}

/// Every fenced write that lands on the wrong side of a writer's, by
/// revision (see the module docs), at most 20 lines.
pub fn effect_order(effects: &[Effect]) -> Vec<String> {
    let mut effects = effects.to_vec();
    effects.sort_by_key(|e| e.revision);
    let n = effects.len();
    // The greatest token before each position, the smallest after.
    let mut before = vec![i64::MIN; n];
    let mut after = vec![i64::MAX; n];
    for k in 1..n {
        before[k] = before[k - 1].max(effects[k - 1].token);
    }
    for k in (0..n.saturating_sub(1)).rev() {
        after[k] = after[k + 1].min(effects[k + 1].token);
    }
    let mut found = Vec::new();
    for (k, e) in effects.iter().enumerate() {
        if e.mode != RwMode::Write {
            continue;
        }
        if before[k] > e.token {
            let stale = effects[..k].iter().rev().find(|x| x.token == before[k]);
            found.push(format!(
                "rwlock effects: writer token {} applied at revision {} after token {} ({:?}) \
                 at revision {}",
                e.token,
                e.revision,
                before[k],
                stale.map(|x| x.mode),
                stale.map_or(0, |x| x.revision)
            ));
        }
        if after[k] < e.token {
            let stale = effects[k + 1..].iter().find(|x| x.token == after[k]);
            found.push(format!(
                "rwlock effects: token {} ({:?}) applied at revision {} after writer token {} \
                 at revision {}",
                after[k],
                stale.map(|x| x.mode),
                stale.map_or(0, |x| x.revision),
                e.token,
                e.revision
            ));
        }
        if found.len() >= 20 {
            break;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(actor: usize, mode: RwMode, token: i64, from: u64, to: u64, t0: Instant) -> Hold {
        let at = |ms| t0 + Duration::from_millis(ms);
        Hold {
            actor,
            mode,
            token,
            key: format!("/rw/{token}"),
            from: at(from),
            last_held_at: at(to),
            lost: false,
            trusted: vec![(at(from), Some(at(from + 1500)))],
            first_refusal: None,
        }
    }

    fn effect(token: i64, mode: RwMode, revision: i64) -> Effect {
        Effect {
            token,
            mode,
            revision,
        }
    }

    fn finals() -> Vec<(usize, RwMode, Result<Duration, String>)> {
        (0..ACTORS)
            .flat_map(|i| [RwMode::Write, RwMode::Read].map(|m| (i, m, Ok(Duration::ZERO))))
            .collect()
    }

    #[test]
    fn readers_together_then_a_writer_pass() {
        let t0 = Instant::now();
        let record = Record {
            holds: vec![
                hold(0, RwMode::Read, 10, 0, 100, t0),
                hold(1, RwMode::Read, 11, 50, 150, t0),
                hold(2, RwMode::Write, 12, 150, 300, t0),
                hold(0, RwMode::Read, 20, 300, 400, t0),
            ],
            effects: vec![
                effect(10, RwMode::Read, 13),
                effect(11, RwMode::Read, 14),
                effect(10, RwMode::Read, 15),
                effect(12, RwMode::Write, 17),
                effect(12, RwMode::Write, 18),
                effect(20, RwMode::Read, 21),
            ],
            finals: finals(),
            ..Record::default()
        };
        let report = check(&record, &[], t0);
        assert_eq!(report.violations, Vec::<String>::new());
    }

    #[test]
    fn every_kind_of_violation_is_found() {
        let t0 = Instant::now();
        let mut f = finals();
        f[0].2 = Err("timed out".into());
        let record = Record {
            holds: vec![
                hold(0, RwMode::Read, 10, 0, 100, t0),
                // A writer beside a reader.
                hold(2, RwMode::Write, 12, 50, 300, t0),
                // A reader acquired after a writer with an older token.
                hold(1, RwMode::Read, 9, 400, 500, t0),
            ],
            effects: vec![
                effect(12, RwMode::Write, 17),
                // An older reader's write after the writer's.
                effect(10, RwMode::Read, 18),
            ],
            finals: f,
            ..Record::default()
        };
        let found = check(&record, &[], t0).violations.join("\n");
        for what in [
            "overlap of rwlock holds (fleetcoord bug)",
            "rwlock token order",
            "no two readers ever held together",
            "rwlock effects: token 10",
            "final write failed",
        ] {
            assert!(found.contains(what), "{what} not found in:\n{found}");
        }
    }

    #[test]
    fn a_writer_after_a_younger_write_is_found() {
        let found = effect_order(&[effect(20, RwMode::Read, 5), effect(12, RwMode::Write, 6)]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("writer token 12"), "{found:?}");
    }
}
