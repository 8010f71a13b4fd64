//! Requests carried through a cluster's failover (and, for the stream
//! append, through a standalone server's restart): what each answer of the
//! cluster means for a retry, and the one line said when giving up. What
//! is repeated, the pauses and when to stop are decided by sm's retry
//! policy (`fleetcoord_sm::retry`); the loop here only sends and sleeps.

use super::target::Target;
use crate::coordinator::retry::{self, Decision, GiveUp, LastPause, Sign};
use crate::error::{Error, ErrorKind, Result};
use redis::{RedisError, RedisResult};
use std::future::Future;
use std::time::Duration;

/// Whether running a request twice is the same as running it once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Reads, and KV writes (the same value set again, a delete of what is
    /// gone): retried after any transient failure.
    Safe,
    /// An append (stored twice) or a publish (delivered twice): retried
    /// only after an answer proving it did not run. It carries what to say
    /// when a lost connection leaves its outcome unknown.
    Unsafe(&'static str),
}

impl Repeat {
    fn policy(self) -> retry::Repeat {
        match self {
            Repeat::Safe => retry::Repeat::Safe,
            Repeat::Unsafe(_) => retry::Repeat::Once,
        }
    }
}

/// Which failures [`retried`] waits out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Through {
    /// A cluster's failover; on a standalone server nothing is retried
    /// (its command connection reconnects by itself).
    Failover,
    /// Also a standalone server's restart: for a request that must not
    /// fail on a blip and carries its own dedupe (the stream append).
    Restart,
}

/// What a cluster answers while a master fails over, as far as a retry is
/// concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `MOVED`/`ASK` to `addr`: the node asked does not serve the slot. In
    /// a failover it points at the dead master until its replica took
    /// over. Not run.
    Redirected { addr: String },
    /// `CLUSTERDOWN`: with `cluster-require-full-coverage yes` (Redis'
    /// default) every node refuses every slot while one slot has no
    /// reachable master. Not run.
    ClusterDown,
    /// `TRYAGAIN`: the slot is being migrated. Not run.
    TryAgain,
    /// `MASTERDOWN`, `READONLY` (a master demoted to replica), `LOADING`:
    /// the node cannot serve the write yet. Not run.
    NotReady,
    /// Connection refused, or the crate has no connection for the slot:
    /// nothing was sent.
    Unreachable,
    /// The connection broke or went silent mid-request: the command may
    /// have run.
    Lost,
}

impl Answer {
    /// The answer `e` is of a failover, or `None` for any other failure.
    pub(crate) fn of(e: &RedisError) -> Option<Answer> {
        use redis::{ErrorKind, ServerErrorKind as S};
        if e.is_connection_refusal() {
            return Some(Answer::Unreachable);
        }
        match e.kind() {
            ErrorKind::Server(S::Moved | S::Ask) => Some(Answer::Redirected {
                addr: e.redirect_node().map(|(addr, _)| addr.to_string())?,
            }),
            ErrorKind::Server(S::ClusterDown) => Some(Answer::ClusterDown),
            ErrorKind::Server(S::TryAgain) => Some(Answer::TryAgain),
            ErrorKind::Server(S::MasterDown | S::ReadOnly | S::BusyLoading) => {
                Some(Answer::NotReady)
            }
            ErrorKind::ClusterConnectionNotFound => Some(Answer::Unreachable),
            _ if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                Some(Answer::Lost)
            }
            _ => None,
        }
    }

    /// What it says to the retry policy: only a lost connection leaves
    /// the request possibly run.
    fn sign(&self) -> Sign {
        match self {
            Answer::Lost => Sign::MaybeRun,
            _ => Sign::NotRun,
        }
    }
}

/// What the retries of one request saw, for the message when they give up.
#[derive(Debug, Default)]
struct Seen {
    /// The address the cluster last named as the slot's master.
    master: Option<String>,
    last: Option<Answer>,
}

impl Seen {
    fn note(&mut self, answer: Answer) {
        if let Answer::Redirected { addr } = &answer {
            self.master = Some(addr.clone());
        }
        self.last = Some(answer);
    }
}

/// Pauses between attempts through a failover: a slot whose master died is
/// refused for 1.5 to 3.5 s after a kill (measured on a cluster with a 1 s
/// `cluster-node-timeout`), so short steps, 20 ms doubling to 400 ms;
/// jittered, so that the callers refused together do not all retry
/// together.
const FAILOVER_PAUSES: (Duration, Duration) =
    (Duration::from_millis(20), Duration::from_millis(400));

/// Runs `attempt` until it succeeds, fails for a reason a failover does
/// not explain, or the request timeout passes; on a cluster, answers of a
/// failover are retried (see [`Answer`] and [`Repeat`]), on a standalone
/// server nothing is. `key` (any key of the request) names its slot in the
/// message; `describe` turns a failure that is not a failover's into the
/// user's error.
///
/// Guarantee: it returns within the request timeout of `target` (plus
/// scheduling), with the last failure said in one line.
pub(crate) async fn with_failover<T, F, Fut>(
    target: &Target,
    context: &str,
    key: Option<&str>,
    repeat: Repeat,
    attempt: F,
    describe: impl FnOnce(&RedisError) -> Error,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    retried(
        target,
        context,
        key,
        repeat,
        Through::Failover,
        attempt,
        describe,
    )
    .await
    .map_err(|(e, _)| e)
}

/// [`with_failover`], also through `through`'s failures, saying on failure
/// whether an attempt may have run unanswered (a failure the retries did
/// not explain is judged by `describe`'s caller).
///
/// Which failures are repeated, the pauses and when to stop are the
/// decisions of one [`retry`] policy; this loop only sends and sleeps.
pub(crate) async fn retried<T, F, Fut>(
    target: &Target,
    context: &str,
    key: Option<&str>,
    repeat: Repeat,
    through: Through,
    mut attempt: F,
    describe: impl FnOnce(&RedisError) -> Error,
) -> std::result::Result<T, (Error, bool)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let mut policy = retry::policy(
        target.request_timeout,
        last_attempt_reserve(target.request_timeout),
        FAILOVER_PAUSES,
        LastPause::Shorten,
        repeat.policy(),
    );
    let deadline = retry::on_runtime(policy.deadline());
    let mut seen = Seen::default();
    let gave_up = |seen: &Seen, policy: &retry::Retry| {
        let elapsed = retry::now().saturating_duration_since(policy.started());
        let message = gave_up(context, key, seen, elapsed, repeat);
        (
            target.failure(ErrorKind::Unavailable, message),
            policy.in_doubt(),
        )
    };
    let waits = target.cluster || through == Through::Restart;
    loop {
        let e = match tokio::time::timeout_at(deadline, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => e,
            Err(_) => {
                // Cut off by the deadline: it may have run, and the
                // policy ends the request.
                let first = policy.failures() == 0;
                let _ = policy.on_error(retry::now(), Sign::MaybeRun);
                if first {
                    return Err((Error::Timeout(target.request_timeout), true));
                }
                return Err(gave_up(&seen, &policy));
            }
        };
        let answer = Answer::of(&e);
        let sign = match &answer {
            Some(answer) if waits => answer.sign(),
            _ => Sign::Final,
        };
        let first = policy.failures() == 0;
        match policy.on_error(retry::now(), sign) {
            Decision::Retry(pause) => {
                if let Some(answer) = answer {
                    seen.note(answer);
                }
                // No attempt is begun without time to hear its answer (the
                // policy's reserve): the crate hands a command to its
                // connection task at once, so an attempt cut off by the
                // deadline may still be sent, and an append that until then
                // only met refusals (provably not run, so retryable) would
                // end in doubt for nothing.
                tokio::time::sleep(pause).await;
            }
            Decision::GiveUp(GiveUp::Final) => {
                let error = describe(&e);
                // A write whose connection broke: it may be stored.
                return Err(if answer == Some(Answer::Lost) {
                    (outcome_unknown(error, repeat), true)
                } else {
                    (error, policy.in_doubt())
                });
            }
            Decision::GiveUp(GiveUp::Unrepeatable) if first => {
                return Err((outcome_unknown(describe(&e), repeat), true));
            }
            Decision::GiveUp(_) => {
                if let Some(answer) = answer {
                    seen.note(answer);
                }
                return Err(gave_up(&seen, &policy));
            }
        }
    }
}

/// How long before the request deadline [`with_failover`] begins its last
/// attempt: a refusal comes back within a millisecond on a healthy network,
/// so 100 ms leaves room for a slow one, and a tenth of short timeouts
/// keeps most of them for waiting out the failover.
fn last_attempt_reserve(request_timeout: Duration) -> Duration {
    (request_timeout / 10).min(Duration::from_millis(100))
}

/// `e` saying that the request it failed may have had its effect.
fn outcome_unknown(e: Error, repeat: Repeat) -> Error {
    let Repeat::Unsafe(unknown) = repeat else {
        return e;
    };
    match e {
        Error::Backend {
            backend,
            endpoints,
            kind,
            message,
        } => Error::Backend {
            backend,
            endpoints,
            kind,
            message: format!("{message} ({unknown})"),
        },
        other => other,
    }
}

/// The one line a request retried through a failover ends with.
fn gave_up(
    context: &str,
    key: Option<&str>,
    seen: &Seen,
    elapsed: Duration,
    repeat: Repeat,
) -> String {
    let slot = match key {
        Some(key) => format!("slot {}", key_slot(key.as_bytes())),
        None => "a slot".to_string(),
    };
    let master = match &seen.master {
        Some(addr) => format!("{slot}'s master {addr}"),
        None => format!("{slot}'s master"),
    };
    let what = match seen.last {
        Some(Answer::ClusterDown) => format!(
            "{slot} is refused: the cluster is down (CLUSTERDOWN) until a failed master is replaced"
        ),
        Some(Answer::TryAgain) => format!("{slot} is being migrated (TRYAGAIN)"),
        Some(Answer::NotReady) => format!("{master} is not ready for writes"),
        _ => format!("{master} is unreachable"),
    };
    let unknown = match (&seen.last, repeat) {
        (Some(Answer::Lost), Repeat::Unsafe(unknown)) => format!(" ({unknown})"),
        _ => String::new(),
    };
    format!("{context}: {what}: failover in progress (gave up after {elapsed:.1?}){unknown}")
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes
/// between the first `{` and the next `}`, when not empty) or of the whole
/// key, modulo 16,384, as Redis Cluster computes it.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::redis::options::RedisOptions;
    use crate::coordinator::redis::test_util::server;

    #[test]
    fn slots_are_redis_clusters() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"{a}x"), 15495);
        assert_eq!(key_slot(b"a"), 15495);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"123456789"), 12739);
        // An empty or unclosed tag hashes the whole key; only the first
        // tag counts.
        assert_eq!(key_slot(b"{}foo"), 9500);
        assert_eq!(key_slot(b"{foo"), 13308);
        assert_eq!(key_slot(b"a{b}"), 3300);
        assert_eq!(key_slot(b"x{}{y}"), 14166);
        assert_eq!(key_slot(b"coord:kv:{b}"), key_slot(b"coord:kvn:{b}"));
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn failover_answers_are_told_from_other_failures() {
        use redis::ServerErrorKind as S;
        let ours = redis::make_extension_error("x".into(), None);
        assert_eq!(Answer::of(&ours), None);
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(Answer::of(&refused), Some(Answer::Unreachable));
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(Answer::of(&reset), Some(Answer::Lost));
        for (kind, sign) in [
            (S::ClusterDown, Answer::ClusterDown),
            (S::TryAgain, Answer::TryAgain),
            (S::MasterDown, Answer::NotReady),
            (S::ReadOnly, Answer::NotReady),
            (S::BusyLoading, Answer::NotReady),
        ] {
            assert_eq!(Answer::of(&server(kind)), Some(sign), "{kind:?}");
        }
        for kind in [S::ResponseError, S::NoScript, S::CrossSlot, S::NoPerm] {
            assert_eq!(Answer::of(&server(kind)), None, "{kind:?}");
        }
        // Not run: retried for every request; may have run: only for those
        // that can be repeated (the policy's rule 2).
        assert_eq!(Answer::ClusterDown.sign(), Sign::NotRun);
        assert_eq!(Answer::Unreachable.sign(), Sign::NotRun);
        assert_eq!(Answer::Lost.sign(), Sign::MaybeRun);
        assert_eq!(
            Repeat::Unsafe("it may have been applied").policy(),
            retry::Repeat::Once
        );
        assert_eq!(Repeat::Safe.policy(), retry::Repeat::Safe);
    }

    #[test]
    fn no_attempt_through_a_failover_is_cut_off_by_the_deadline() {
        // Every attempt is refused after 5 ms (a dead master): all of them
        // must end with their answer, so that the caller knows none ran.
        let target = Target::parse(
            "redis://127.0.0.1:1,redis://127.0.0.1:2",
            &RedisOptions::default().with_request_timeout(Duration::from_millis(300)),
        )
        .expect("a cluster target");
        let (begun, answered) = (
            std::sync::atomic::AtomicU32::new(0),
            std::sync::atomic::AtomicU32::new(0),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let started = std::time::Instant::now();
        let result: Result<()> = runtime.block_on(with_failover(
            &target,
            "append to stream \"s\"",
            Some("coord:stream:{s}"),
            Repeat::Safe,
            || async {
                begun.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::ConnectionRefused,
                )))
            },
            |_| unreachable!("a refusal is a failover's"),
        ));
        let took = started.elapsed();
        let e = result.expect_err("refused throughout");
        assert!(e.is_retryable(), "{e}");
        assert!(
            e.to_string()
                .contains("is unreachable: failover in progress"),
            "{e}"
        );
        assert!(took <= Duration::from_millis(300), "took {took:?}");
        let begun = begun.load(std::sync::atomic::Ordering::Relaxed);
        assert!(begun > 3, "retried through the failover: {begun} attempts");
        assert_eq!(
            answered.load(std::sync::atomic::Ordering::Relaxed),
            begun,
            "an attempt was begun without time for its answer"
        );
    }

    #[test]
    fn giving_up_says_which_slot_and_master_and_why() {
        let mut seen = Seen::default();
        seen.note(Answer::Redirected {
            addr: "127.0.0.1:39195".into(),
        });
        seen.note(Answer::Unreachable);
        let after = Duration::from_millis(5000);
        assert_eq!(
            gave_up(
                "set \"k\" in bucket \"b\"",
                Some("coord:kv:{b}"),
                &seen,
                after,
                Repeat::Safe
            ),
            format!(
                "set \"k\" in bucket \"b\": slot {}'s master 127.0.0.1:39195 is unreachable: \
                 failover in progress (gave up after 5.0s)",
                key_slot(b"b")
            )
        );
        let down = Seen {
            master: None,
            last: Some(Answer::ClusterDown),
        };
        assert_eq!(
            gave_up("ping", None, &down, after, Repeat::Safe),
            "ping: a slot is refused: the cluster is down (CLUSTERDOWN) until a failed master is \
             replaced: failover in progress (gave up after 5.0s)"
        );
        let lost = Seen {
            master: None,
            last: Some(Answer::Lost),
        };
        let once = Repeat::Unsafe("the append may or may not have been applied");
        let text = gave_up("append", Some("s"), &lost, after, once);
        assert!(
            text.ends_with("(gave up after 5.0s) (the append may or may not have been applied)"),
            "{text}"
        );
        let migrating = Seen {
            master: None,
            last: Some(Answer::TryAgain),
        };
        assert!(gave_up("x", Some("s"), &migrating, after, Repeat::Safe).contains("(TRYAGAIN)"));
    }
}
