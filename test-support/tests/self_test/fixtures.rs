//! What the model's own tests share: request shorthands and [`Probe`], a
//! machine that sends exactly what a test queues and records every reply,
//! so the harness can be tested without any real protocol in the way.

use fleetcoord_sm::{
    Command, KeyValue, LeaseId, Machine, Request, Response, RpcError, RpcId, RpcIds, RpcReply,
};
use fleetcoord_test_support::ModelEtcd;
use std::collections::VecDeque;
use std::time::Instant;

pub fn put(key: &str, value: &str, lease: LeaseId) -> Request {
    Request::Put {
        key: key.into(),
        value: value.into(),
        lease,
    }
}

pub fn grant(etcd: &mut ModelEtcd, now: Instant, ttl_secs: i64) -> (LeaseId, i64) {
    match etcd.execute(now, &Request::Grant { ttl_secs }).unwrap() {
        Response::Granted { lease, ttl_secs } => (lease, ttl_secs),
        other => panic!("unexpected {other:?}"),
    }
}

pub fn kvs(response: Response) -> Vec<KeyValue> {
    match response {
        Response::Range { kvs, .. } => kvs,
        other => panic!("unexpected {other:?}"),
    }
}

pub fn keys(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8(kv.key.clone()).unwrap())
        .collect()
}

/// A machine that sends what the test queues and records what it gets.
#[derive(Default)]
pub struct Probe {
    pub ids: RpcIds,
    pub out: VecDeque<Command<String>>,
    pub log: Vec<(Instant, String)>,
    pub replies: Vec<(Instant, RpcReply)>,
    pub timer: Option<Instant>,
}

impl Probe {
    pub fn send(&mut self, request: Request) -> RpcId {
        let id = self.ids.next_id();
        self.out.push_back(Command::Rpc { id, request });
        id
    }
    pub fn replies_for(&self, id: RpcId) -> Vec<(Instant, Result<Response, RpcError>)> {
        self.replies
            .iter()
            .filter(|(_, r)| r.id == id)
            .map(|(t, r)| (*t, r.result.clone()))
            .collect()
    }
}

impl Machine for Probe {
    type Input = RpcReply;
    type Notice = String;
    fn stop_input() -> RpcReply {
        // The probe has no stop; this reply to nothing is ignored.
        RpcReply {
            id: RpcId(u64::MAX),
            result: Err(RpcError::Unavailable("stop".into())),
        }
    }
    fn is_finished(&self) -> bool {
        false
    }
    fn handle(&mut self, now: Instant, input: RpcReply) {
        self.log.push((now, format!("reply {}", input.id.0)));
        self.replies.push((now, input));
    }
    fn handle_timeout(&mut self, now: Instant) {
        if self.timer.is_some_and(|t| t <= now) {
            self.timer = None;
            self.log.push((now, "timeout".into()));
            self.out.push_back(Command::Notify("timed out".into()));
        }
    }
    fn poll_command(&mut self) -> Option<Command<String>> {
        self.out.pop_front()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.timer
    }
}
