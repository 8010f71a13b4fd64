//! Fuzz the election machine with arbitrary replies, inputs and time.
//!
//! The target plays a loose etcd: it answers any outstanding request with a
//! reply shaped like the request but with generated data (revisions, keys,
//! succeeded flags, watch deletes), with errors, with replies of the wrong
//! variant, or with arbitrary replies to arbitrary ids; it advances time and
//! breaks streams. A small reference model tracks what the user was told.
//! After every step:
//! * every answer names an open operation, which it closes: `Elected`,
//!   `NotElected`, `CampaignFailed` a campaign, `Proclaimed`,
//!   `ProclaimFailed` a proclaim; so `Elected` never comes after
//!   `SessionLost` (or any other answer) of its campaign, nor for an
//!   operation the user never asked for;
//! * `is_leader()` implies an `Elected` not yet followed by `LeadershipLost`,
//!   `Resign` of its token, `CancelCampaign` of its campaign or `Stop`, a
//!   token equal to the elected one, and a session deadline strictly after
//!   `now` (false from the deadline instant on);
//! * RPC ids are never reused; after `Session(Stopped)` no RPC is issued;
//! * with `permits` N (1 to 4, from the seed's top bits) at most N watches
//!   of candidate keys are open at once: a waiter watches the N keys
//!   nearest ahead of it, a holder its own key, and whatever ends a wait
//!   cancels all of its watches; besides them, only a ranked leader (N = 1:
//!   a semaphore refuses ranked campaigns) watches the priorities, once,
//!   from its `Elected` until its leadership is resigned, canceled,
//!   stopped, lost or handed over (a yield keeps it until its hand-over
//!   ends);
//! * `poll_timeout` is never before `now`; draining commands terminates.

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::election::{
    priority_prefix, Election, ElectionConfig, ElectionInput, ElectionNotice, OpId, Rank,
};
use fleetcoord_sm::keepalive::LivenessState;
use fleetcoord_sm::{
    BackoffConfig, Command, EventKind, KeyRange, KeyValue, Machine, Request, Response, Revision,
    RpcError, RpcId, RpcReply, TxnOp, TxnOpResponse, WatchEvent,
};
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const MAX_COMMANDS_PER_STEP: usize = 1_000;
const PREFIX: &[u8] = b"/e/";

#[derive(Arbitrary, Debug)]
struct Input {
    ttl_secs: i8,
    seed: u64,
    jitter_percent: u8,
    margin_ms: u16,
    drift_allowance_ppm: u32,
    /// 0 sends no copies of unanswered requests.
    attempt_ms: u16,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum User {
    Campaign(u8),
    TryCampaign(u8),
    /// Resign the latest elected token, or (`true`) a stale one.
    Resign(bool),
    Proclaim(u8),
    /// Cancel the operation this many back from the newest (0: the newest).
    CancelCampaign(u8),
    Stop,
    /// A ranked campaign: value, priority, whether it yields.
    CampaignRanked(u8, u8, bool),
    /// Hand the latest elected token over to the candidate with this value.
    HandOver(u8),
    /// A write fenced on the latest elected token, or (`true`) a stale
    /// one, was refused by etcd.
    FenceRefused(bool),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Shape {
    succeeded: bool,
    /// Whether a read finds a key, and whose.
    found: u8,
    revision_step: u8,
    create: u8,
    ttl: u8,
    delete_event: bool,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u16),
    User(User),
    /// Answer outstanding request number `pick` with a plausible reply.
    Reply(u8, Shape),
    /// Fail outstanding request number `pick`.
    Fail(u8, bool),
    /// Answer outstanding request number `pick` with anything at all.
    Raw(u8, Response),
    /// A reply to any id.
    Stray(RpcReply),
    /// Every open watch and renewal fails.
    DropStreams,
}

struct Reference {
    open_campaigns: BTreeSet<OpId>,
    open_proclaims: BTreeSet<OpId>,
    open_hand_overs: BTreeSet<OpId>,
    /// Every operation asked for, newest last.
    ops: Vec<OpId>,
    /// The current leadership and the campaign that won it.
    elected: Option<Revision>,
    elected_by: Option<OpId>,
    /// The latest `Elected` token, kept after the leadership ends.
    last_token: Revision,
    /// Ranked campaigns asked for.
    ranked: BTreeSet<OpId>,
    /// A leadership won by a ranked campaign (its campaign and token),
    /// until nothing of it may watch the priorities any more.
    ranked_lead: Option<(OpId, Revision)>,
    stopped: bool,
}

struct Fuzz {
    machine: Election,
    permits: usize,
    now: Instant,
    outstanding: BTreeMap<RpcId, Request>,
    seen_ids: BTreeSet<RpcId>,
    revision: Revision,
    model: Reference,
}

impl Fuzz {
    fn drain(&mut self) {
        for _ in 0..MAX_COMMANDS_PER_STEP {
            let Some(command) = self.machine.poll_command() else {
                return self.check();
            };
            match command {
                Command::Rpc { id, request } => {
                    assert!(!self.model.stopped, "rpc {request:?} after Stopped");
                    assert!(self.seen_ids.insert(id), "id {id:?} reused");
                    self.outstanding.insert(id, request);
                }
                Command::Cancel { id } => {
                    self.outstanding.remove(&id);
                }
                Command::Notify(n) => self.notice(n),
            }
        }
        panic!("more than {MAX_COMMANDS_PER_STEP} commands in one step");
    }

    fn notice(&mut self, n: ElectionNotice) {
        let m = &mut self.model;
        match n {
            ElectionNotice::Elected { op, token, .. } => {
                assert!(m.open_campaigns.remove(&op), "Elected for {op:?}, not open");
                m.elected = Some(token);
                m.elected_by = Some(op);
                m.last_token = token;
                m.ranked_lead = m.ranked.contains(&op).then_some((op, token));
            }
            ElectionNotice::NotElected { op, .. } | ElectionNotice::CampaignFailed { op, .. } => {
                assert!(
                    m.open_campaigns.remove(&op),
                    "campaign answer for {op:?}, not open"
                );
            }
            ElectionNotice::Proclaimed { op } | ElectionNotice::ProclaimFailed { op, .. } => {
                assert!(
                    m.open_proclaims.remove(&op),
                    "proclaim answer for {op:?}, not open"
                );
            }
            ElectionNotice::HandedOver { op, token, .. } => {
                // A user's hand-over, or a yield, which names the campaign
                // that won.
                assert!(
                    m.open_hand_overs.remove(&op) || m.elected_by == Some(op),
                    "HandedOver for {op:?}, not open"
                );
                assert_eq!(token, m.last_token, "handed over what it did not lead");
                m.elected = None;
                m.ranked_lead = None;
            }
            ElectionNotice::HandOverFailed { op, .. } => {
                assert!(
                    m.open_hand_overs.remove(&op),
                    "hand-over answer for {op:?}, not open"
                );
            }
            // Belief ends with the notice of a yield.
            ElectionNotice::StepDownRequested { yielding: true, .. } => m.elected = None,
            ElectionNotice::LeadershipLost { .. } => {
                m.elected = None;
                m.ranked_lead = None;
            }
            ElectionNotice::Resigned { token }
                if m.ranked_lead.is_some_and(|(_, t)| t == token) =>
            {
                m.ranked_lead = None;
            }
            ElectionNotice::Session(LivenessState::Stopped { .. }) => m.stopped = true,
            _ => {}
        }
    }

    fn check(&self) {
        if let Some(at) = self.machine.poll_timeout() {
            assert!(at >= self.now, "poll_timeout before now");
        }
        if self.machine.is_leader() {
            assert!(self.model.elected.is_some(), "leader without Elected");
            assert_eq!(self.machine.token(), self.model.elected);
            let deadline = self.machine.session_deadline();
            assert!(
                deadline.is_some_and(|d| d > self.now),
                "leader past the local deadline"
            );
        } else {
            assert_eq!(self.machine.token(), None);
        }
        // The permits bound the watches of candidate keys (the semaphore's
        // fan-out). A ranked leader holds one watch more, of the
        // priorities, beside its own key's: that is the design (module
        // docs, README "Cost"), not a leak, so it is counted apart and
        // allowed only to the leadership that may hold it, once.
        let priorities = KeyRange::Prefix(priority_prefix(PREFIX));
        let (of_priorities, of_candidates): (Vec<&Request>, Vec<&Request>) = self
            .outstanding
            .values()
            .filter(|r| matches!(r, Request::Watch { .. }))
            .partition(|r| matches!(r, Request::Watch { range, .. } if *range == priorities));
        assert!(
            of_candidates.len() <= self.permits,
            "{} watches open with {} permits: {of_candidates:?}",
            of_candidates.len(),
            self.permits
        );
        let allowed = usize::from(self.model.ranked_lead.is_some());
        assert!(
            of_priorities.len() <= allowed,
            "{} watches of the priorities open, {allowed} allowed (ranked leadership {:?})",
            of_priorities.len(),
            self.model.ranked_lead
        );
    }

    fn pick(&self, pick: u8) -> Option<(RpcId, Request)> {
        if self.outstanding.is_empty() {
            return None;
        }
        let index = usize::from(pick) % self.outstanding.len();
        self.outstanding
            .iter()
            .nth(index)
            .map(|(id, r)| (*id, r.clone()))
    }

    fn deliver(&mut self, id: RpcId, result: Result<Response, RpcError>) {
        let keep = matches!(
            (self.outstanding.get(&id), &result),
            (
                Some(Request::Watch { .. }),
                Ok(Response::WatchEvents { .. })
            )
        );
        if !keep {
            self.outstanding.remove(&id);
        }
        self.machine
            .handle(self.now, RpcReply { id, result }.into());
    }

    fn kv(&self, range: &KeyRange, s: Shape) -> Vec<KeyValue> {
        let key = match (range, s.found % 3) {
            (_, 0) => return Vec::new(),
            (KeyRange::Key(k), _) => k.clone(),
            (KeyRange::Prefix(p), 1) => [p.as_slice(), b"1"].concat(),
            (KeyRange::Prefix(_), _) => self.machine.my_key().unwrap_or_default(),
            // The election never reads a prefix from a key on.
            (KeyRange::PrefixFrom { from, .. } | KeyRange::PrefixSpan { from, .. }, _) => {
                from.clone()
            }
        };
        let create = i64::from(s.create).min(self.revision);
        vec![KeyValue {
            key,
            value: vec![s.found],
            create_revision: create,
            mod_revision: self.revision,
            version: 1,
            lease: 1,
        }]
    }

    fn plausible(&mut self, request: &Request, s: Shape) -> Response {
        self.revision += i64::from(s.revision_step % 4);
        match request {
            Request::LeaseTimeToLive { .. } => Response::LeaseTimeToLive {
                ttl_secs: -1,
                granted_secs: 0,
            },
            Request::Grant { .. } => Response::Granted {
                lease: 0x100 + i64::from(s.create),
                ttl_secs: i64::from(s.ttl % 12),
            },
            Request::KeepAlive { .. } => Response::KeptAlive {
                ttl_secs: i64::from(s.ttl % 12),
            },
            Request::Revoke { .. } => Response::Revoked,
            Request::Put { .. } => Response::Put {
                revision: self.revision,
            },
            Request::Delete(_) => Response::Deleted {
                revision: self.revision,
                deleted: i64::from(s.succeeded),
            },
            Request::Range(r) => Response::Range {
                revision: self.revision,
                kvs: self.kv(&r.range, s),
            },
            Request::Watch { range, .. } => {
                let events = if s.delete_event {
                    let key = match range {
                        KeyRange::Key(k) | KeyRange::Prefix(k) => k.clone(),
                        KeyRange::PrefixFrom { from, .. } | KeyRange::PrefixSpan { from, .. } => {
                            from.clone()
                        }
                    };
                    let kv = KeyValue {
                        key,
                        mod_revision: self.revision,
                        ..KeyValue::default()
                    };
                    vec![WatchEvent {
                        kind: EventKind::Delete,
                        kv,
                        prev_kv: None,
                    }]
                } else {
                    Vec::new()
                };
                Response::WatchEvents { events }
            }
            Request::Txn(t) => {
                let branch = if s.succeeded { &t.success } else { &t.failure };
                let responses = branch
                    .iter()
                    .map(|op| match op {
                        TxnOp::Put { .. } => TxnOpResponse::Put,
                        TxnOp::Delete(_) => TxnOpResponse::Delete { deleted: 1 },
                        TxnOp::Range(r) => TxnOpResponse::Range {
                            kvs: self.kv(&r.range, s),
                        },
                    })
                    .collect();
                Response::Txn {
                    revision: self.revision,
                    succeeded: s.succeeded,
                    responses,
                }
            }
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Advance(ms) => {
                self.now += Duration::from_millis(u64::from(ms));
                self.machine.handle_timeout(self.now);
            }
            Op::User(u) => {
                let op = OpId(self.model.ops.len() as u64 + 1);
                let input = match u {
                    User::Campaign(v) => ElectionInput::Campaign { op, value: vec![v] },
                    User::TryCampaign(v) => ElectionInput::TryCampaign { op, value: vec![v] },
                    User::Resign(stale) => {
                        let latest = self.model.last_token;
                        ElectionInput::Resign {
                            token: if stale {
                                latest.saturating_sub(1)
                            } else {
                                latest
                            },
                        }
                    }
                    User::Proclaim(v) => ElectionInput::Proclaim { op, value: vec![v] },
                    User::CancelCampaign(back) => {
                        let ops = &self.model.ops;
                        let index = ops.len().checked_sub(1 + usize::from(back));
                        ElectionInput::CancelCampaign {
                            op: index.map_or(OpId(0), |i| ops[i]),
                        }
                    }
                    User::Stop => ElectionInput::Stop,
                    User::CampaignRanked(v, priority, yield_to_higher) => {
                        ElectionInput::CampaignRanked {
                            op,
                            value: vec![v],
                            rank: Rank {
                                priority: u32::from(priority % 4),
                                yield_to_higher,
                            },
                        }
                    }
                    User::HandOver(v) => ElectionInput::HandOver {
                        op,
                        token: self.model.last_token,
                        to: vec![v],
                    },
                    User::FenceRefused(stale) => {
                        let latest = self.model.last_token;
                        ElectionInput::FenceRefused {
                            token: if stale {
                                latest.saturating_sub(1)
                            } else {
                                latest
                            },
                        }
                    }
                };
                // A refusal for the leadership held ends it at once, unless
                // a hand-over is deleting the key (its answer decides).
                let refuses_leadership = matches!(
                    &input,
                    ElectionInput::FenceRefused { token } if self.model.elected == Some(*token)
                        && self.model.open_hand_overs.is_empty()
                );
                let cancels_leadership = matches!(
                    &input,
                    ElectionInput::CancelCampaign { op } if self.model.elected_by == Some(*op)
                        && self.model.elected.is_some()
                );
                match &input {
                    ElectionInput::Campaign { op, .. }
                    | ElectionInput::TryCampaign { op, .. }
                    | ElectionInput::CampaignRanked { op, .. } => {
                        self.model.open_campaigns.insert(*op);
                        self.model.ops.push(*op);
                        if matches!(input, ElectionInput::CampaignRanked { .. }) {
                            self.model.ranked.insert(*op);
                        }
                    }
                    ElectionInput::HandOver { op, .. } => {
                        self.model.open_hand_overs.insert(*op);
                        self.model.ops.push(*op);
                    }
                    ElectionInput::Proclaim { op, .. } => {
                        self.model.open_proclaims.insert(*op);
                        self.model.ops.push(*op);
                    }
                    // Canceling the campaign that won resigns its leadership.
                    ElectionInput::CancelCampaign { .. } if cancels_leadership => {
                        self.model.elected = None
                    }
                    // Belief ends before anything is sent, for the
                    // resigned token only: a stale resign ends nothing.
                    ElectionInput::Resign { token } if self.model.elected == Some(*token) => {
                        self.model.elected = None
                    }
                    ElectionInput::Stop => self.model.elected = None,
                    ElectionInput::FenceRefused { .. } if refuses_leadership => {
                        self.model.elected = None
                    }
                    _ => {}
                }
                // These end a ranked leadership's watch of the priorities
                // in the step (a resign or cancel of it, even while it
                // yields, or a stop); a refusal only when it ends the
                // leadership.
                let ends_ranks = self.model.ranked_lead.is_some_and(|(o, t)| match &input {
                    ElectionInput::Resign { token } => *token == t,
                    ElectionInput::CancelCampaign { op } => *op == o,
                    ElectionInput::Stop => true,
                    ElectionInput::FenceRefused { .. } => refuses_leadership,
                    _ => false,
                });
                if ends_ranks {
                    self.model.ranked_lead = None;
                }
                self.machine.handle(self.now, input);
                if matches!(u, User::Stop)
                    || matches!(u, User::Resign(false))
                    || cancels_leadership
                    || refuses_leadership
                {
                    assert!(
                        !self.machine.is_leader(),
                        "leader right after resign/cancel/stop"
                    );
                }
            }
            Op::Reply(pick, shape) => {
                if let Some((id, request)) = self.pick(pick) {
                    let response = self.plausible(&request, shape);
                    self.deliver(id, Ok(response));
                }
            }
            Op::Fail(pick, rejected) => {
                if let Some((id, _)) = self.pick(pick) {
                    let error = if rejected {
                        RpcError::Rejected("no".into())
                    } else {
                        RpcError::Unavailable("down".into())
                    };
                    self.deliver(id, Err(error));
                }
            }
            Op::Raw(pick, response) => {
                if let Some((id, _)) = self.pick(pick) {
                    self.deliver(id, Ok(response));
                }
            }
            Op::Stray(reply) => {
                let id = reply.id;
                self.deliver(id, reply.result);
            }
            Op::DropStreams => {
                let streams: Vec<RpcId> = self
                    .outstanding
                    .iter()
                    .filter(|(_, r)| matches!(r, Request::Watch { .. } | Request::KeepAlive { .. }))
                    .map(|(id, _)| *id)
                    .collect();
                for id in streams {
                    self.deliver(id, Err(RpcError::Unavailable("stream dropped".into())));
                    self.drain();
                }
            }
        }
        self.drain();
    }
}

fuzz_target!(|input: Input| {
    let now = Instant::now();
    let config = ElectionConfig {
        prefix: PREFIX.to_vec(),
        ttl_secs: i64::from(input.ttl_secs),
        backoff: BackoffConfig {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
            multiplier: 2,
            jitter_percent: input.jitter_percent,
        },
        safety_margin: Duration::from_millis(u64::from(input.margin_ms)),
        drift_allowance_ppm: input.drift_allowance_ppm,
        attempt_timeout: Duration::from_millis(u64::from(input.attempt_ms)),
        // From a field the input has, so the committed corpus keeps its
        // meaning.
        announce_session_trust: input.attempt_ms % 2 == 1,
        // From the seed's top bits: a quarter of the inputs run the
        // election (1 permit), the rest a semaphore of 2 to 4.
        permits: 1 + (input.seed >> 62) as u32,
        rw: None,
    };
    let permits = 1 + (input.seed >> 62) as usize;
    let mut fuzz = Fuzz {
        machine: Election::new(config, now, input.seed),
        permits,
        now,
        outstanding: BTreeMap::new(),
        seen_ids: BTreeSet::new(),
        revision: 1,
        model: Reference {
            open_campaigns: BTreeSet::new(),
            open_proclaims: BTreeSet::new(),
            open_hand_overs: BTreeSet::new(),
            ops: Vec::new(),
            elected: None,
            elected_by: None,
            last_token: 0,
            ranked: BTreeSet::new(),
            ranked_lead: None,
            stopped: false,
        },
    };
    fuzz.drain();
    for op in input.ops.into_iter().take(256) {
        fuzz.step(op);
    }
});
