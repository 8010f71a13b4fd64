//! Leader preference (priorities, yielding) and hand-over against a real
//! etcd: who leads next, within what time, and that every change of
//! leader is fenced and overlap-free like a resign.
//!
//! Overlap is checked by a sampler thread that reads `is_held()` of every
//! leadership handed out, about every 200 µs, and fails on any sample
//! where two are held; tokens are checked to grow, and a deposed leader's
//! `txn_if_leader` to be refused by etcd.

mod common;

use common::{connect, etcdctl_keys, start_etcd};
use fleetcoord::{Election, ElectionOptions, Error, Etcd, Leadership, TxnOp};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

fn options() -> ElectionOptions {
    ElectionOptions::default()
        .with_prefix("/test/priority/")
        .with_ttl(Duration::from_secs(5))
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// The leaderships handed out so far, named.
type Handed = Arc<Mutex<Vec<(String, Arc<Leadership>)>>>;

/// Every leadership handed out, sampled for overlap until dropped.
struct Sampler {
    held: Handed,
    overlap: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Sampler {
    fn start() -> Sampler {
        let held: Handed = Arc::default();
        let overlap: Arc<Mutex<Option<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (held, overlap, stop) = (held.clone(), overlap.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let holders: Vec<String> = held
                        .lock()
                        .iter()
                        .filter(|(_, l)| l.is_held())
                        .map(|(name, l)| format!("{name} (token {})", l.fencing_token()))
                        .collect();
                    if holders.len() > 1 {
                        overlap.lock().get_or_insert(holders.join(" and "));
                    }
                    thread::sleep(Duration::from_micros(200));
                }
            })
        };
        Sampler {
            held,
            overlap,
            stop,
            thread: Some(thread),
        }
    }

    fn watch(&self, name: &str, leadership: Leadership) -> Arc<Leadership> {
        let l = Arc::new(leadership);
        self.held.lock().push((name.to_string(), l.clone()));
        l
    }

    fn finish(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().expect("sampler");
        }
        assert_eq!(*self.overlap.lock(), None, "two leaderships held at once");
    }
}

/// A candidate campaigning on its own thread; `join` returns its
/// leadership and the instant it was elected.
fn campaign(election: &Arc<Election>, value: &str) -> thread::JoinHandle<(Instant, Leadership)> {
    let election = election.clone();
    let value = value.as_bytes().to_vec();
    thread::spawn(move || {
        let l = election.campaign(&value).expect("campaign");
        (Instant::now(), l)
    })
}

fn join(etcd: &Etcd, name: &str, options: ElectionOptions) -> Arc<Election> {
    Arc::new(Election::with_options(etcd, name, options).expect("join"))
}

#[test]
fn a_higher_priority_candidate_makes_a_yielding_leader_step_down_within_a_second() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let sampler = Sampler::start();
    let low = options().with_priority(1).with_yield_to_higher(true);
    let a = join(&etcd, "yield", low.clone());
    let w = join(&etcd, "yield", options().with_priority(1));
    let h = join(&etcd, "yield", options().with_priority(5));

    let la = sampler.watch("a", a.campaign(b"a").unwrap());
    let token_a = la.fencing_token();
    // A waiter of the leader's priority: no step-down for a tie.
    let w_won = campaign(&w, "w");
    wait_until("w queued", || {
        etcdctl_keys(&endpoint, a.key_prefix()).len() == 2
    });
    thread::sleep(Duration::from_millis(200));
    assert!(
        la.step_down_requested().try_recv().is_err(),
        "a tie asks nothing"
    );
    assert!(la.is_held());

    let t0 = Instant::now();
    let h_won = campaign(&h, "h");
    let (h_at, lh) = h_won.join().unwrap();
    let lh = sampler.watch("h", lh);
    let latency = h_at.duration_since(t0);
    println!("join of a higher priority -> it leads: {latency:?}");
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    assert!(lh.is_held());
    assert!(lh.fencing_token() > token_a, "tokens only grow");
    assert!(la.step_down_requested().try_recv().is_ok(), "a was told");
    assert!(la.lost().try_recv().is_ok(), "a's leadership ended");
    assert!(!la.is_held());
    assert_eq!(
        la.txn_if_leader([TxnOp::put("/test/fenced", "a")]).unwrap(),
        None,
        "the deposed leader's fenced write is refused"
    );
    assert_eq!(
        a.leader().unwrap().map(|l| l.value),
        Some(b"h".to_vec()),
        "the higher one leads"
    );

    // The bumped waiter kept waiting and gets its turn next.
    let token_h = lh.fencing_token();
    let t1 = Instant::now();
    drop(sampler.held.lock().pop());
    Arc::try_unwrap(lh).expect("one handle").resign().unwrap();
    let (w_at, lw) = w_won.join().unwrap();
    let lw = sampler.watch("w", lw);
    assert!(w_at.duration_since(t1) < Duration::from_secs(1));
    assert!(lw.fencing_token() > token_h);
    sampler.finish();
}

#[test]
fn a_leader_that_does_not_yield_is_only_told() {
    let server = start_etcd();
    let etcd = connect(&server.endpoint());
    let a = join(&etcd, "told", options().with_priority(1));
    let h = join(&etcd, "told", options().with_priority(2));
    let la = a.campaign(b"a").unwrap();
    let h_won = campaign(&h, "h");
    la.step_down_requested()
        .recv_timeout(Duration::from_secs(1))
        .expect("told within a second");
    assert!(la.is_held(), "still leading: stepping down is its choice");
    assert!(la.lost().try_recv().is_err());
    let token = la.fencing_token();
    la.resign().unwrap();
    let (_, lh) = h_won.join().unwrap();
    assert!(lh.fencing_token() > token);
}

#[test]
fn hand_over_elects_the_named_candidate_while_two_others_wait() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let sampler = Sampler::start();
    let ranked = options().with_priority(0);
    let a = join(&etcd, "hand", ranked.clone());
    let b = join(&etcd, "hand", ranked.clone());
    let c = join(&etcd, "hand", ranked.clone());
    let d = join(&etcd, "hand", ranked);
    let la = sampler.watch("a", a.campaign(b"a").unwrap());
    let mut waiting = Vec::new();
    for (n, (e, v)) in [(&b, "b"), (&c, "c"), (&d, "d")].into_iter().enumerate() {
        waiting.push(campaign(e, v));
        wait_until("queued", || {
            etcdctl_keys(&endpoint, a.key_prefix()).len() == n + 2
        });
    }
    let d_won = waiting.pop().unwrap();

    // A candidate nobody is: refused, leadership kept.
    match la.hand_over("nobody") {
        Err(Error::InvalidArgument { what: "to", .. }) => {}
        other => panic!("expected InvalidArgument(to), got {other:?}"),
    }
    assert!(la.is_held(), "kept after a failed hand-over");
    assert!(
        la.txn_if_leader([]).unwrap().is_some(),
        "and still current in etcd"
    );

    let token_a = la.fencing_token();
    let t0 = Instant::now();
    la.hand_over("d").unwrap();
    assert!(!la.is_held());
    let (d_at, ld) = d_won.join().unwrap();
    let ld = sampler.watch("d", ld);
    let latency = d_at.duration_since(t0);
    println!("hand_over -> target leads: {latency:?}");
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    assert!(ld.fencing_token() > token_a);
    assert_eq!(la.txn_if_leader([]).unwrap(), None, "a is fenced off");
    assert_eq!(a.leader().unwrap().map(|l| l.value), Some(b"d".to_vec()));
    // b and c still wait (queued again behind d).
    thread::sleep(Duration::from_millis(200));
    assert!(
        waiting.iter().all(|t| !t.is_finished()),
        "b and c keep waiting"
    );
    wait_until("b and c queued again", || {
        etcdctl_keys(&endpoint, a.key_prefix()).len() == 3
    });

    // Then each gets its turn; hand over by key this time.
    let next_key = {
        let queue = etcdctl_keys(&endpoint, a.key_prefix());
        queue
            .into_iter()
            .find(|k| k != ld.key())
            .expect("a waiting key")
    };
    let mut token = ld.fencing_token();
    ld.hand_over(&next_key).unwrap();
    let mut remaining = waiting;
    let mut turns = 0;
    while !remaining.is_empty() {
        wait_until("one of b, c leads", || {
            remaining.iter().any(|t| t.is_finished())
        });
        let i = remaining.iter().position(|t| t.is_finished()).unwrap();
        let (_, l) = remaining.swap_remove(i).join().unwrap();
        if turns == 0 {
            assert_eq!(l.key(), next_key, "the key named leads");
        }
        assert!(l.fencing_token() > token);
        token = l.fencing_token();
        let l = sampler.watch("next", l);
        thread::sleep(Duration::from_millis(20));
        drop(sampler.held.lock().pop());
        Arc::try_unwrap(l).expect("one handle").resign().unwrap();
        turns += 1;
    }
    sampler.finish();
}

#[test]
fn plain_candidates_keep_their_place() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let a = join(&etcd, "plain", options().with_priority(0));
    let p = join(&etcd, "plain", options());
    let h = join(&etcd, "plain", options().with_priority(9));
    let la = a.campaign(b"a").unwrap();
    let p_won = campaign(&p, "p");
    wait_until("p queued", || {
        etcdctl_keys(&endpoint, a.key_prefix()).len() == 2
    });
    let h_won = campaign(&h, "h");
    wait_until("h queued", || {
        etcdctl_keys(&endpoint, a.key_prefix()).len() == 3
    });
    // A hand-over past a candidate that did not opt in is refused.
    match la.hand_over("h") {
        Err(Error::InvalidArgument { what: "to", why }) => {
            assert!(why.contains("without a priority"), "{why}")
        }
        other => panic!("expected InvalidArgument(to), got {other:?}"),
    }
    assert!(la.is_held());
    // The plain waiter was not bumped by the higher priority: it is next.
    la.resign().unwrap();
    let (_, lp) = p_won.join().unwrap();
    assert_eq!(p.leader().unwrap().map(|l| l.value), Some(b"p".to_vec()));
    lp.resign().unwrap();
    let (_, lh) = h_won.join().unwrap();
    lh.resign().unwrap();
}

#[test]
fn priority_keys_stay_outside_the_candidate_prefix() {
    let server = start_etcd();
    let endpoint = server.endpoint();
    let etcd = connect(&endpoint);
    let a = join(&etcd, "side", options().with_priority(3));
    let la = a.campaign(b"a").unwrap();
    // etcdctl (and Go) read the prefix: one candidate, no side key.
    assert_eq!(
        etcdctl_keys(&endpoint, a.key_prefix()),
        vec![la.key().to_string()]
    );
    assert_eq!(a.leader().unwrap().map(|l| l.value), Some(b"a".to_vec()));
    la.resign().unwrap();
    // The resign removed the side key too.
    assert!(etcdctl_keys(&endpoint, "/test/priority/").is_empty());
}
