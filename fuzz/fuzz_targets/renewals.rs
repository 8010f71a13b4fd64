//! Fuzz the renewals machine (`fleetcoord_sm::renewals::Renewals`) with
//! any sequence of renewals, forgets, stream events and time, in any
//! order: replies that match nothing, open results with no opening, a
//! stream that breaks while none is open. The target plays the driver: it
//! keeps the stream the machine asked for, writes while the stream has
//! room, and fires due timers before every input. After every step:
//! * every renewal is answered at most once, and never after its deadline
//!   (taken + the request timeout);
//! * no renewal taken before a forget of its lease is written after it,
//!   nor answered with a TTL above zero;
//! * `Open` only when no stream is open or being opened, `Drop` only of one
//!   that is;
//! * `poll_timeout` is never earlier than the last `now`.
//!
//! At the end `Stop` answers every renewal still waiting.

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::renewals::{Renewals, RenewalsCommand, RenewalsInput};
use fleetcoord_sm::{LeaseId, RpcError};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(100);

#[derive(Arbitrary, Debug)]
enum Op {
    /// Renew lease `lease % 4`.
    Renew {
        lease: u8,
    },
    /// Forget lease `lease % 4`.
    Forget {
        lease: u8,
    },
    /// Let `ms % 128` milliseconds pass, firing each timer at its deadline.
    Advance {
        ms: u8,
    },
    /// The stream being opened (or none) opened.
    Opened,
    /// The opening failed: lease missing, or another error.
    OpenFailed {
        missing: bool,
    },
    /// Write up to `n % 4` renewals.
    Room {
        n: u8,
    },
    /// A reply for lease `lease % 4`.
    Reply {
        lease: u8,
        ttl: i8,
    },
    Ended,
    Failed,
    Closed,
}

#[derive(Clone, Copy, PartialEq)]
enum Stream {
    None,
    Opening,
    Open,
}

struct Driver {
    machine: Renewals<u64>,
    now: Instant,
    stream: Stream,
    /// Renewals not yet answered, in the order taken.
    waiting: BTreeMap<u64, Waiting>,
}

struct Waiting {
    lease: LeaseId,
    deadline: Instant,
    /// Its lease was forgotten after it was taken.
    forgotten: bool,
    written: bool,
}

impl Driver {
    fn feed(&mut self, input: RenewalsInput<u64>) {
        if self.machine.poll_timeout().is_some_and(|at| at <= self.now) {
            self.machine.handle_timeout(self.now);
            self.execute();
        }
        if let RenewalsInput::Forget { lease } = input {
            for w in self.waiting.values_mut().filter(|w| w.lease == lease) {
                w.forgotten = true;
            }
        }
        self.machine.handle(self.now, input);
        self.execute();
    }

    fn execute(&mut self) {
        while let Some(command) = self.machine.poll_command() {
            match command {
                RenewalsCommand::Open { .. } => {
                    assert!(self.stream == Stream::None, "a second stream");
                    self.stream = Stream::Opening;
                }
                RenewalsCommand::Drop => {
                    assert!(self.stream != Stream::None, "no stream to drop");
                    self.stream = Stream::None;
                }
                RenewalsCommand::Suspect => {}
                RenewalsCommand::Answer { token, ttl } => {
                    let w = self
                        .waiting
                        .remove(&token)
                        .expect("answered once, and only what was asked");
                    assert!(self.now <= w.deadline, "answered after its deadline");
                    // Guarantee 6: the reply may predate the revoke.
                    assert!(
                        !(w.forgotten && matches!(ttl, Ok(t) if t > 0)),
                        "a renewal of lease {} taken before its forget answered {ttl:?}",
                        w.lease
                    );
                }
            }
        }
        if let Some(at) = self.machine.poll_timeout() {
            assert!(at >= self.now, "a deadline in the past");
        }
    }

    fn write(&mut self, n: u8) {
        for _ in 0..n % 4 {
            let Some(lease) = self.machine.poll_write() else {
                return;
            };
            assert!(self.stream == Stream::Open, "a write with no open stream");
            // Writes go in the order renewals were taken: the one written
            // is the oldest waiting renewal not yet written.
            let w = self
                .waiting
                .values_mut()
                .find(|w| !w.written)
                .expect("a write of a renewal that waits");
            assert_eq!(w.lease, lease, "written out of order");
            assert!(!w.forgotten, "lease {lease} written after its forget");
            w.written = true;
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let t0 = Instant::now();
    let mut d = Driver {
        machine: Renewals::new(TIMEOUT, t0),
        now: t0,
        stream: Stream::None,
        waiting: BTreeMap::new(),
    };
    let mut next_token = 0;
    for op in ops {
        match op {
            Op::Renew { lease } => {
                next_token += 1;
                let lease = LeaseId::from(lease % 4);
                let w = Waiting {
                    lease,
                    deadline: d.now + TIMEOUT,
                    forgotten: false,
                    written: false,
                };
                d.waiting.insert(next_token, w);
                d.feed(RenewalsInput::Renew {
                    lease,
                    token: next_token,
                });
            }
            Op::Forget { lease } => d.feed(RenewalsInput::Forget {
                lease: LeaseId::from(lease % 4),
            }),
            Op::Advance { ms } => {
                // As a driver sleeps: to each deadline on the way, in turn.
                let until = d.now + Duration::from_millis(u64::from(ms % 128));
                while let Some(at) = d.machine.poll_timeout().filter(|at| *at <= until) {
                    d.now = at;
                    d.machine.handle_timeout(at);
                    d.execute();
                    let next = d.machine.poll_timeout();
                    assert!(next.is_none_or(|n| n > at), "a timer that does not fire");
                }
                d.now = until;
            }
            Op::Opened => {
                if d.stream == Stream::Opening {
                    d.stream = Stream::Open;
                }
                d.feed(RenewalsInput::Opened);
            }
            Op::OpenFailed { missing } => {
                if d.stream == Stream::Opening {
                    d.stream = Stream::None;
                }
                let error = if missing {
                    RpcError::LeaseNotFound
                } else {
                    RpcError::Unavailable("refused".into())
                };
                d.feed(RenewalsInput::OpenFailed { error });
            }
            Op::Room { n } => d.write(n),
            Op::Reply { lease, ttl } => d.feed(RenewalsInput::Reply {
                lease: LeaseId::from(lease % 4),
                ttl_secs: i64::from(ttl),
            }),
            Op::Ended => d.feed(RenewalsInput::Ended),
            Op::Failed => d.feed(RenewalsInput::Failed {
                error: RpcError::Unavailable("reset".into()),
            }),
            Op::Closed => d.feed(RenewalsInput::Closed),
        }
    }
    d.feed(RenewalsInput::Stop);
    assert!(d.waiting.is_empty(), "Stop answers everything");
    assert_eq!(d.machine.waiting(), 0);
});
