//! What fleetcoord records through the [`metrics`](https://docs.rs/metrics)
//! facade (cargo feature `metrics`). The library records; the application
//! installs the recorder and exporter it likes (Prometheus, StatsD, ...).
//! Without a recorder, or without the feature, recording costs nothing.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `fleetcoord_request_duration_seconds` | histogram | `kind` | etcd request round trip (`grant`, `revoke`, `put`, `range`, `delete`, `txn`, `lease_ttl`, `keepalive`) — `keepalive` is the renewal round trip |
//! | `fleetcoord_request_errors_total` | counter | `kind`, `error` | failed etcd requests by kind and error (`unavailable`, `rejected`, `lease_not_found`, `compacted`, `permission_denied`, `unauthenticated`) |
//! | `fleetcoord_liveness_registered` | gauge | `key` | 1 while the HostLiveness of `key` is `Registered`, else 0 |
//! | `fleetcoord_liveness_transitions_total` | counter | `key`, `state` | state changes of that liveness (`registering`, `registered`, `suspended`, `lost`, `stopped`) |
//! | `fleetcoord_election_held` | gauge | `election` | 1 while this process leads (or holds the lock) under that key prefix |
//! | `fleetcoord_election_token` | gauge | `election` | the fencing token of the current or last leadership |
//! | `fleetcoord_election_transitions_total` | counter | `election`, `event` | `elected`, `lost`, `resigned` |
//! | `fleetcoord_wait_seconds` | histogram | `election` | how long each won campaign, lock or permit waited, from the call that started it to the win ([`crate::Leadership::waited`]) |
//! | `fleetcoord_contended_total` | counter | `election` | wins that found another holder ahead and waited for it to go ([`crate::Leadership::contended`]) |
//! | `fleetcoord_hold_seconds` | histogram | `election` | how long each leadership, lock or permit was held, from the win to its resign or loss |
//! | `fleetcoord_fence_refused_total` | counter | `election` | fenced writes (`txn_if_leader`, `txn_if_held`) etcd refused because the holder's key was gone |
//! | `fleetcoord_refused_total` | counter | `election` | tries (`try_campaign`, `try_lock`, `try_acquire`) refused because another candidate led or held every permit |
//! | `fleetcoord_host_events_total` | counter | `prefix`, `event`, `reason` | HostWatcher events delivered: `up`, `updated`, `down`, `synced`; `reason` is `left` or `expired` for `down` ([`crate::DownReason`]), empty otherwise |
//! | `fleetcoord_watch_streams_opened_total` | counter | — | etcd watch streams opened by any watcher: the first, then one per resume or resync |
//! | `fleetcoord_etcd_server_info` | gauge | `server_version` | 1, labelled with the etcd version a member reported when an [`crate::Etcd`] connected (see [`crate::Etcd::server_version`]); not recorded when the version cannot be read |
//!
//! The `election` label of the election, lock, semaphore and pool metrics
//! (the contention telemetry: waits, holds, contended wins, losses,
//! refusals) is the key prefix of one election, lock, semaphore or pool
//! name (`/coord/elections/NAME/`, `/coord/locks/NAME/`, …; a read-write
//! lock's readers and writers wait apart and are labelled apart,
//! `/coord/rwlock/NAME/read/` and `/coord/rwlock/NAME/write/`, two names
//! of the bound below). Its
//! cardinality is bounded per process: the first [`MAX_NAMES`] names a
//! process uses get a label of their own, every later one is recorded
//! under the fixed label `other` (a prefix always starts with `/`, so no
//! name is confused with it), so a process that makes a lock per job id
//! cannot grow the exporter without bound; keep names per role where
//! the per-name series matter. Lost leaderships are
//! `fleetcoord_election_transitions_total` with `event="lost"`.
//!
//! An exporter that prints help text (Prometheus's `# HELP`) learns it from
//! [`describe`], called once after the recorder is installed; without it
//! `promtool check metrics` warns "no help text" for every family.

/// How a metric is recorded.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Set to the current value.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

/// Every metric fleetcoord records: its name, kind and help text (the
/// table above, in the order given there).
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub const METRICS: &[(&str, Kind, &str)] = &[
    (
        "fleetcoord_request_duration_seconds",
        Kind::Histogram,
        "etcd request round trip in seconds, by kind (keepalive: one lease renewal)",
    ),
    (
        "fleetcoord_request_errors_total",
        Kind::Counter,
        "failed etcd requests, by kind and error",
    ),
    (
        "fleetcoord_liveness_registered",
        Kind::Gauge,
        "1 while the HostLiveness of key is registered, else 0",
    ),
    (
        "fleetcoord_liveness_transitions_total",
        Kind::Counter,
        "state changes of the HostLiveness of key",
    ),
    (
        "fleetcoord_election_held",
        Kind::Gauge,
        "1 while this process leads (or holds the lock) under the election prefix",
    ),
    (
        "fleetcoord_election_token",
        Kind::Gauge,
        "the fencing token of the current or last leadership under the election prefix",
    ),
    (
        "fleetcoord_election_transitions_total",
        Kind::Counter,
        "leaderships elected, lost and resigned under the election prefix",
    ),
    (
        "fleetcoord_wait_seconds",
        Kind::Histogram,
        "seconds each won campaign, lock or permit waited, from its call to the win",
    ),
    (
        "fleetcoord_contended_total",
        Kind::Counter,
        "wins that found another holder ahead and waited for it to go",
    ),
    (
        "fleetcoord_hold_seconds",
        Kind::Histogram,
        "seconds each leadership, lock or permit was held, from the win to its end",
    ),
    (
        "fleetcoord_fence_refused_total",
        Kind::Counter,
        "fenced writes etcd refused because the holder's key was gone",
    ),
    (
        "fleetcoord_refused_total",
        Kind::Counter,
        "tries refused because another candidate led or held every permit",
    ),
    (
        "fleetcoord_host_events_total",
        Kind::Counter,
        "HostWatcher events delivered, by prefix, event and (for down) reason",
    ),
    (
        "fleetcoord_watch_streams_opened_total",
        Kind::Counter,
        "etcd watch streams opened by any watcher: the first, then one per resume or resync",
    ),
    (
        "fleetcoord_etcd_server_info",
        Kind::Gauge,
        "1, labelled with the etcd server version a member reported at connect",
    ),
];

/// Gives the installed recorder the help text of every metric in
/// [`METRICS`]. Call it once, after installing the recorder (a recorder
/// installed later never hears it); calling it again changes nothing.
///
/// ```
/// // With no recorder installed this does nothing, and costs nothing.
/// fleetcoord::metrics::describe();
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe() {
    for (name, kind, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
}

/// How many distinct names (election, lock, semaphore and pool key
/// prefixes) one process records contention metrics under; later names
/// share the label `other` (see the module docs).
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub const MAX_NAMES: usize = 64;

/// The contention telemetry of one named primitive: what an election, a
/// mutex, a semaphore or a pool name records, and what any other
/// primitive that waits for and holds a key records the same way. Built
/// once per primitive, it holds its `election` label, bounded as the
/// module docs say. It only records: whether a win was contended, and
/// whether a try was refused, is the protocol machine's word
/// (`ElectionNotice::Elected { waited, .. }`, `ElectionNotice::NotElected`).
#[derive(Clone, Debug)]
pub(crate) struct Contention {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    label: String,
}

impl Contention {
    /// The telemetry of the primitive with key prefix `name`.
    pub(crate) fn new(name: &str) -> Contention {
        Contention {
            label: on::bounded_label(name),
        }
    }

    /// A wait (campaign, lock, acquire) won after `waited`; `contended`
    /// when it found another holder ahead and waited for it to go.
    pub(crate) fn won(&self, waited: std::time::Duration, contended: bool) {
        on::won(&self.label, waited, contended);
    }

    /// A holding of `held` ended (resigned, released, handed over, lost).
    pub(crate) fn held(&self, held: std::time::Duration) {
        on::held(&self.label, held);
    }

    /// A holding with fencing `token` changed: `elected`, `lost`, `resigned`.
    pub(crate) fn transition(&self, event: &'static str, token: i64) {
        on::election(&self.label, event, token);
    }

    /// A try was refused: another candidate led, or held every permit.
    pub(crate) fn refused(&self) {
        on::refused(&self.label);
    }

    /// etcd refused a fenced write: the holder's key was gone.
    pub(crate) fn fence_refused(&self) {
        on::fence_refused(&self.label);
    }
}

#[cfg(feature = "metrics")]
mod on {
    use fleetcoord_sm::keepalive::LivenessState;
    use fleetcoord_sm::{Request, RpcError};
    use std::time::Duration;

    /// The `kind` label of a request.
    pub(crate) fn kind(request: &Request) -> &'static str {
        match request {
            Request::Grant { .. } => "grant",
            Request::Revoke { .. } => "revoke",
            Request::Put { .. } => "put",
            Request::Range(_) => "range",
            Request::Delete(_) => "delete",
            Request::Txn(_) => "txn",
            Request::LeaseTimeToLive { .. } => "lease_ttl",
            Request::KeepAlive { .. } => "keepalive",
            Request::Watch { .. } => "watch",
            #[allow(unreachable_patterns)]
            _ => "other",
        }
    }

    fn error_label(e: &RpcError) -> &'static str {
        match e {
            RpcError::Unavailable(_) => "unavailable",
            RpcError::Rejected(_) => "rejected",
            RpcError::LeaseNotFound => "lease_not_found",
            RpcError::Compacted { .. } => "compacted",
            RpcError::PermissionDenied(_) => "permission_denied",
            RpcError::Unauthenticated(_) => "unauthenticated",
            #[allow(unreachable_patterns)]
            _ => "other",
        }
    }

    pub(crate) fn request<T>(kind: &'static str, elapsed: Duration, result: &Result<T, RpcError>) {
        metrics::histogram!("fleetcoord_request_duration_seconds", "kind" => kind)
            .record(elapsed.as_secs_f64());
        if let Err(e) = result {
            metrics::counter!(
                "fleetcoord_request_errors_total",
                "kind" => kind,
                "error" => error_label(e)
            )
            .increment(1);
        }
    }

    pub(crate) fn liveness(key: &str, state: &LivenessState) {
        let name = match state {
            LivenessState::Registering => "registering",
            LivenessState::Registered { .. } => "registered",
            LivenessState::Suspended { .. } => "suspended",
            LivenessState::Lost { .. } => "lost",
            LivenessState::Stopped { .. } => "stopped",
            LivenessState::Refused { .. } => "refused",
            LivenessState::Waiting { .. } => "waiting",
            LivenessState::Duplicate { .. } => "duplicate",
        };
        let registered = matches!(state, LivenessState::Registered { .. });
        metrics::gauge!("fleetcoord_liveness_registered", "key" => key.to_string())
            .set(if registered { 1.0 } else { 0.0 });
        metrics::counter!(
            "fleetcoord_liveness_transitions_total",
            "key" => key.to_string(),
            "state" => name
        )
        .increment(1);
    }

    pub(crate) fn election(prefix: &str, event: &'static str, token: i64) {
        let held = event == "elected";
        metrics::gauge!("fleetcoord_election_held", "election" => prefix.to_string())
            .set(if held { 1.0 } else { 0.0 });
        if held {
            // Tokens are etcd revisions: exact in an f64 up to 2^53.
            metrics::gauge!("fleetcoord_election_token", "election" => prefix.to_string())
                .set(token as f64);
        }
        metrics::counter!(
            "fleetcoord_election_transitions_total",
            "election" => prefix.to_string(),
            "event" => event
        )
        .increment(1);
    }

    pub(crate) fn host_event(prefix: &str, event: &'static str, reason: &'static str) {
        metrics::counter!(
            "fleetcoord_host_events_total",
            "prefix" => prefix.to_string(),
            "event" => event,
            "reason" => reason
        )
        .increment(1);
    }

    pub(crate) fn watch_stream_opened() {
        metrics::counter!("fleetcoord_watch_streams_opened_total").increment(1);
    }

    /// A campaign, lock or acquire won after `waited`, `contended` if it
    /// waited behind another holder.
    pub(crate) fn won(prefix: &str, waited: Duration, contended: bool) {
        metrics::histogram!("fleetcoord_wait_seconds", "election" => prefix.to_string())
            .record(waited.as_secs_f64());
        if contended {
            metrics::counter!("fleetcoord_contended_total", "election" => prefix.to_string())
                .increment(1);
        }
    }

    /// A leadership, lock or permit held for `held` ended.
    pub(crate) fn held(prefix: &str, held: Duration) {
        metrics::histogram!("fleetcoord_hold_seconds", "election" => prefix.to_string())
            .record(held.as_secs_f64());
    }

    /// The names given a label of their own so far (at most `MAX_NAMES`).
    static NAMED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

    /// `name` if it has a label of its own (already, or as one of the
    /// first `MAX_NAMES`), else `other`.
    pub(crate) fn bounded_label(name: &str) -> String {
        let mut named = NAMED.lock().unwrap_or_else(|e| e.into_inner());
        if named.iter().any(|n| n == name) {
            return name.to_string();
        }
        if named.len() < super::MAX_NAMES {
            named.push(name.to_string());
            return name.to_string();
        }
        "other".to_string()
    }

    /// A try refused because another candidate led or held every permit.
    pub(crate) fn refused(prefix: &str) {
        metrics::counter!("fleetcoord_refused_total", "election" => prefix.to_string())
            .increment(1);
    }

    /// etcd refused a fenced write: the holder's key was gone.
    pub(crate) fn fence_refused(prefix: &str) {
        metrics::counter!("fleetcoord_fence_refused_total", "election" => prefix.to_string())
            .increment(1);
    }

    pub(crate) fn server_version(version: &str) {
        metrics::gauge!("fleetcoord_etcd_server_info", "server_version" => version.to_string())
            .set(1.0);
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use fleetcoord_sm::keepalive::LivenessState;
    use fleetcoord_sm::{Request, RpcError};
    use std::time::Duration;

    pub(crate) fn kind(_: &Request) -> &'static str {
        ""
    }
    pub(crate) fn request<T>(_: &'static str, _: Duration, _: &Result<T, RpcError>) {}
    pub(crate) fn liveness(_: &str, _: &LivenessState) {}
    pub(crate) fn election(_: &str, _: &'static str, _: i64) {}
    pub(crate) fn host_event(_: &str, _: &'static str, _: &'static str) {}
    pub(crate) fn watch_stream_opened() {}
    pub(crate) fn server_version(_: &str) {}
    pub(crate) fn won(_: &str, _: Duration, _: bool) {}
    pub(crate) fn held(_: &str, _: Duration) {}
    pub(crate) fn fence_refused(_: &str) {}
    pub(crate) fn refused(_: &str) {}
    pub(crate) fn bounded_label(_: &str) -> String {
        String::new()
    }
}

pub(crate) use on::*;

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;

    /// Past `MAX_NAMES` distinct names, new names share `other`; a name
    /// that got a label keeps it. (Other tests of this binary may have
    /// taken labels already, so only the bound is exact.)
    #[test]
    fn labels_are_bounded_per_process() {
        let names: Vec<String> = (0..=MAX_NAMES).map(|i| format!("/bounded/{i}/")).collect();
        let labels: Vec<String> = names.iter().map(|n| on::bounded_label(n)).collect();
        assert_eq!(labels.last().map(String::as_str), Some("other"));
        let own = labels.iter().zip(&names).filter(|(l, n)| l == n).count();
        assert!(own <= MAX_NAMES);
        for (label, name) in labels.iter().zip(&names) {
            assert!(label == name || label == "other");
            assert_eq!(&on::bounded_label(name), label, "a label is stable");
        }
    }
}
