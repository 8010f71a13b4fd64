//! Endpoint health: which members the shared client may send to.
//!
//! etcd-client's balancer has no notion of health: it keeps handing calls
//! to a member that accepts connections but never answers, and each such
//! call costs a whole request timeout (etcd-client#39; measured: 8 of 20
//! calls time out with one real and two hanging members). So each endpoint
//! gets its own probe client, and a member that misses its probe (no answer
//! within [`PROBE_TIMEOUT`], or [`STRAGGLER_GRACE`] after another member's)
//! is taken out of the shared client (`remove_endpoint`) and put back
//! (`add_endpoint`) when it answers again. The last member in use is never
//! taken out: etcd-client then hangs every call, even with a timeout
//! (both measured: docs/etcd-notes.md, "Endpoint health"). Reads and
//! revokes that were waiting when a member went out of use are sent again
//! ([`routed`]): they may have gone to it.
//!
//! Probes cost etcd an RPC each, so they go out on suspicion only: every
//! endpoint once a call went unanswered for [`SUSPECT_AFTER`], a renewal
//! timed out or a stream broke (at most one round per [`PROBE_INTERVAL`]),
//! and an endpoint out of use every
//! [`PROBE_INTERVAL`] until it answers. While every member answers, etcd
//! sees no probe at all; a connection that dies silently under an open
//! stream is noticed by the HTTP/2 pings (`connect::base_options`), which
//! cost no RPC. The decisions are [`Policy`]'s, a plain value tested on its
//! own.

use super::explain::explain;
use crate::tls::Tls;
use etcd_client as ec;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

/// The shortest time between two rounds of probes, and how often an
/// endpoint out of use is probed until it answers.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// A status request to one endpoint, on a client of its own (same TLS as
/// the shared client, no pings, no credentials: any answer from etcd, even
/// a refusal, proves the member answers).
#[derive(Clone)]
pub(crate) struct Probe {
    url: String,
    client: ec::Client,
    tls: Option<Tls>,
}

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProbeOutcome {
    /// etcd answered (perhaps with an error status of its own).
    Answered,
    /// No answer in time, or the connection failed; why, in one line.
    Failed(String),
}

impl Probe {
    /// A probe of `url`; etcd-client connects lazily, so this only fails
    /// for options it refuses outright.
    pub(crate) async fn new(
        url: &str,
        options: ec::ConnectOptions,
        tls: Option<&Tls>,
    ) -> Result<Probe, String> {
        let client = ec::Client::connect([url], Some(options))
            .await
            .map_err(|e| explain(&e, tls))?;
        Ok(Probe {
            url: url.to_string(),
            client,
            tls: tls.cloned(),
        })
    }

    /// The endpoint's URL, exactly as the shared client was given it
    /// (`remove_endpoint` of any other spelling is a silent no-op).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Ask for a status within `timeout`: the outcome, with what the
    /// member said of itself when it answered with its status (not with an
    /// error of its own).
    pub(crate) async fn check_status(
        &self,
        timeout: Duration,
    ) -> (ProbeOutcome, Option<super::ServerStatus>) {
        let mut client = self.client.clone();
        match tokio::time::timeout(timeout, client.status()).await {
            Ok(Ok(status)) => (
                ProbeOutcome::Answered,
                Some(super::ServerStatus {
                    version: status.version().to_string(),
                    member_id: status.header().map_or(0, |h| h.member_id()),
                }),
            ),
            Ok(Err(e)) if etcd_answered(&e) => (ProbeOutcome::Answered, None),
            Ok(Err(e)) => (ProbeOutcome::Failed(explain(&e, self.tls.as_ref())), None),
            Err(_) => (
                ProbeOutcome::Failed(format!("no answer within {timeout:?}")),
                None,
            ),
        }
    }
}

/// A status sent by etcd itself rather than made up by the transport: no
/// underlying cause, and not one of the codes tonic uses for a broken or
/// refused connection.
pub(crate) fn etcd_answered(e: &ec::Error) -> bool {
    use tonic::Code;
    match e {
        ec::Error::GRpcStatus(s) => {
            std::error::Error::source(s).is_none()
                && !matches!(
                    s.code(),
                    Code::Cancelled | Code::Unknown | Code::DeadlineExceeded | Code::Unavailable
                )
        }
        _ => false,
    }
}

/// A change to the shared client's endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Stop sending to endpoint `i`.
    Remove(usize),
    /// Send to endpoint `i` again.
    Add(usize),
}

/// Which endpoints are in use, and what a probe result changes.
///
/// Rules: one missed probe takes an endpoint out, one answer brings it
/// back; the last endpoint in use stays whatever its probes say.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    in_use: Vec<bool>,
}

impl Policy {
    /// Endpoint `i` starts in use when `in_use[i]`.
    pub(crate) fn new(in_use: Vec<bool>) -> Policy {
        Policy { in_use }
    }

    /// Whether endpoint `i` is in use.
    pub(crate) fn in_use(&self, i: usize) -> bool {
        self.in_use.get(i).copied().unwrap_or(false)
    }

    /// The endpoints a round probes: every one when something is
    /// suspected, else those out of use (waiting to be let back in). Empty
    /// when there is nothing to probe.
    pub(crate) fn to_probe(&self, suspected: bool) -> Vec<usize> {
        (0..self.in_use.len())
            .filter(|i| suspected || !self.in_use(*i))
            .collect()
    }

    /// Endpoint `i` answered its probe, or not; the change to make, if any.
    pub(crate) fn observe(&mut self, i: usize, answered: bool) -> Option<Change> {
        let in_use_count = self.in_use.iter().filter(|u| **u).count();
        let slot = self.in_use.get_mut(i)?;
        match (*slot, answered) {
            (false, true) => {
                *slot = true;
                Some(Change::Add(i))
            }
            (true, false) if in_use_count > 1 => {
                *slot = false;
                Some(Change::Remove(i))
            }
            _ => None,
        }
    }
}

/// How long a call may go unanswered before the members are probed (the
/// call itself goes on waiting, up to its own timeout): a healthy member
/// answers in milliseconds, and a hanging one is then out of use a
/// [`STRAGGLER_GRACE`] later (a [`PROBE_TIMEOUT`] when no member answers)
/// instead of a whole request timeout. Reads and revokes in flight are
/// then sent again elsewhere ([`routed`]), so the first read that meets a
/// silent member takes about this plus the grace. Shorter than the
/// machines' attempt timeout (500 ms, `session::ATTEMPT_TIMEOUT`), after
/// which a machine sends a copy of its request and may stop waiting for
/// the first: a call given up on before this would raise no suspicion, and
/// every close would pay that attempt timeout to the silent member.
pub(crate) const SUSPECT_AFTER: Duration = Duration::from_millis(250);

/// The longest a health probe (one status request, answered from the
/// member's memory) may take before its member counts as silent, unless
/// the request timeout or the keepalive interval is shorter. A member that
/// is merely slow and misses it is out of use until its next answer, a
/// [`PROBE_INTERVAL`] later; the last member in use is never taken out.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// `call` within `timeout` (`None` once it passed). Suspicion is raised
/// once the call is still unanswered after [`SUSPECT_AFTER`], or at the
/// timeout when that comes first.
#[cfg(test)]
pub(crate) async fn watched<T>(
    suspicion: &Suspicion,
    timeout: Duration,
    call: impl std::future::Future<Output = T>,
) -> Option<T> {
    match watched_or_moved(suspicion, None, timeout, call).await {
        Routed::Answer(answer) => Some(answer),
        Routed::TimedOut | Routed::Moved => None,
    }
}

/// How a call watched by [`watched_or_moved`] ended.
pub(crate) enum Routed<T> {
    /// Its own answer.
    Answer(T),
    /// No answer within its timeout.
    TimedOut,
    /// The health monitor took an endpoint out of use first; the call was
    /// dropped (it may have been sent to that endpoint).
    Moved,
}

/// [`watched`], and when `removals` is given, ended early as
/// [`Routed::Moved`] by a removal it reports after the call started.
pub(crate) async fn watched_or_moved<T>(
    suspicion: &Suspicion,
    removals: Option<&watch::Receiver<u64>>,
    timeout: Duration,
    call: impl std::future::Future<Output = T>,
) -> Routed<T> {
    let mut removals = removals.cloned();
    if let Some(r) = removals.as_mut() {
        r.borrow_and_update();
    }
    let removed = async move {
        let changed = match removals.as_mut() {
            Some(r) => r.changed().await.is_ok(),
            None => false,
        };
        if !changed {
            // Nothing to wait for (no receiver, or the monitor is gone).
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(removed);
    let deadline = tokio::time::Instant::now() + timeout;
    let call = tokio::time::timeout_at(deadline, call);
    tokio::pin!(call);
    let mut suspect = std::pin::pin!(tokio::time::sleep(SUSPECT_AFTER.min(timeout)));
    let mut raised = false;
    loop {
        tokio::select! {
            done = &mut call => {
                return match done {
                    Ok(answer) => Routed::Answer(answer),
                    Err(_) => {
                        suspicion.raise();
                        Routed::TimedOut
                    }
                };
            }
            _ = &mut suspect, if !raised => {
                raised = true;
                suspicion.raise();
            }
            _ = &mut removed => return Routed::Moved,
        }
    }
}

/// Whether `request` may be sent a second time while the first is
/// unanswered ([`routed`]): whichever copy etcd applies, and in whatever
/// order, the outcome is one copy's. True for a read
/// (`Request::is_read_only`) and for a revoke: a second revoke of a lease
/// the first one ended is answered "lease not found", which every revoke
/// here takes as done, and a lease id is never granted again. Every other
/// write could apply twice.
pub(crate) fn may_send_twice(request: &fleetcoord_sm::Request) -> bool {
    request.is_read_only() || matches!(request, fleetcoord_sm::Request::Revoke { .. })
}

/// `attempt()` within `timeout`, as [`watched`]. When `resend` (a read or
/// a revoke: [`may_send_twice`]) and the health monitor takes an endpoint out
/// of use before the answer came, that attempt is dropped and another made
/// with what is left of the timeout: the first may have gone to the
/// endpoint now out of use, and `attempt` sends on a client that no longer
/// uses it. So a read routes around a silent member on the first slow
/// answer, instead of waiting a whole request timeout for it; so does a
/// leave's revoke. Any other write is never sent twice: it waits for its
/// own answer or its timeout.
pub(crate) async fn routed<T, F, Fut>(
    suspicion: &Suspicion,
    removals: &watch::Receiver<u64>,
    timeout: Duration,
    resend: bool,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let removals = resend.then_some(removals);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match watched_or_moved(suspicion, removals, left, attempt()).await {
            Routed::Answer(answer) => return Some(answer),
            Routed::TimedOut => return None,
            Routed::Moved => {
                log::debug!("a read in flight is sent again: an endpoint went out of use")
            }
        }
    }
}

/// Wakes the monitor for an immediate round of probes: a call just timed
/// out, so some member may have stopped answering.
#[derive(Clone, Default)]
pub(crate) struct Suspicion(Arc<Notify>);

impl Suspicion {
    /// Ask for a round of probes now (coalesced: many calls, one round).
    pub(crate) fn raise(&self) {
        self.0.notify_one();
    }

    pub(super) async fn raised(&self) {
        self.0.notified().await;
    }
}

/// Probe what [`Policy::to_probe`] names, when suspicion is raised or an
/// endpoint is out of use, at most once per [`PROBE_INTERVAL`], and apply
/// [`Policy`]'s changes to `client`, until shutdown.
pub(crate) async fn monitor(
    client: ec::Client,
    probes: Vec<(Probe, bool)>,
    timeout: Duration,
    suspicion: Suspicion,
    in_use: Arc<super::direct::InUse>,
    versions: Arc<crate::server_version::MemberVersions>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut policy = Policy::new(probes.iter().map(|(_, in_use)| *in_use).collect());
    let probes: Vec<Probe> = probes.into_iter().map(|(p, _)| p).collect();
    let mut suspected = false;
    let mut next_round = tokio::time::Instant::now();
    loop {
        // Nothing to probe until something is suspected.
        if !suspected && policy.to_probe(false).is_empty() {
            tokio::select! {
                _ = suspicion.raised() => suspected = true,
                _ = shutdown.changed() => return,
            }
        }
        // Not before the cool-down ends; suspicion raised meanwhile joins
        // this round instead of asking for another.
        loop {
            // Shutdown first: with the cool-down over too, an unbiased
            // pick would start another round half the time.
            tokio::select! {
                biased;
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep_until(next_round) => break,
                _ = suspicion.raised() => suspected = true,
            }
        }
        let targets = policy.to_probe(suspected);
        suspected = false;
        next_round = tokio::time::Instant::now() + PROBE_INTERVAL;
        let mut round = tokio::task::JoinSet::new();
        let mut pending = Vec::with_capacity(targets.len());
        for i in targets {
            let Some(probe) = probes.get(i).cloned() else {
                continue;
            };
            pending.push(i);
            round.spawn(async move { (i, probe.check_status(timeout).await) });
        }
        // Once one member answered, the others get STRAGGLER_GRACE more,
        // as at connect: a healthy member answers a status in
        // milliseconds, so waiting a whole probe timeout for a silent one
        // only keeps calls going to it.
        let mut stragglers_until = None;
        loop {
            // A probe of a silent member takes the whole probe timeout:
            // shutdown must not wait for it (dropping the round aborts it).
            let done = tokio::select! {
                biased;
                _ = shutdown.changed() => return,
                _ = sleep_until_some(stragglers_until) => {
                    round.abort_all();
                    let why = ProbeOutcome::Failed(format!(
                        "no answer within {STRAGGLER_GRACE:?} of another member's"
                    ));
                    for i in std::mem::take(&mut pending) {
                        let _ = apply(i, &why, &mut policy, &probes, &client, &in_use).await;
                    }
                    break;
                }
                done = round.join_next() => done,
            };
            let Some(done) = done else { break };
            let Ok((i, (outcome, status))) = done else {
                continue;
            };
            pending.retain(|j| *j != i);
            if outcome == ProbeOutcome::Answered && stragglers_until.is_none() {
                stragglers_until = Some(tokio::time::Instant::now() + STRAGGLER_GRACE);
            }
            let rejoined = apply(i, &outcome, &mut policy, &probes, &client, &in_use).await;
            // A member back in use may have been upgraded (or downgraded)
            // while it was away: its version is read again.
            if let (true, Some(status)) = (rejoined, status) {
                versions.record(&status);
            }
        }
    }
}

/// How long the other members may still answer a round of probes (or
/// connect's) once one has: a healthy member answers a status in a few
/// milliseconds, even with a TLS handshake.
pub(crate) const STRAGGLER_GRACE: Duration = Duration::from_millis(500);

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What endpoint `i`'s probe found changes in [`Policy`], applied to the
/// shared client and then to the callers' connection ([`super::direct`]).
/// Whether the endpoint was taken back into use.
async fn apply(
    i: usize,
    outcome: &ProbeOutcome,
    policy: &mut Policy,
    probes: &[Probe],
    client: &ec::Client,
    in_use: &super::direct::InUse,
) -> bool {
    let Some(probe) = probes.get(i) else {
        return false;
    };
    let answered = *outcome == ProbeOutcome::Answered;
    let change = policy.observe(i, answered);
    match change {
        Some(Change::Remove(_)) => {
            let why = match outcome {
                ProbeOutcome::Failed(why) => why.as_str(),
                ProbeOutcome::Answered => "",
            };
            log::warn!(
                "etcd endpoint {} did not answer its health probe ({why}); \
                 sending it nothing until it does",
                probe.url()
            );
            if let Err(e) = client.remove_endpoint(probe.url()).await {
                log::warn!("could not stop using {}: {e}", probe.url());
            }
        }
        Some(Change::Add(_)) => {
            log::info!("etcd endpoint {} answers again; using it", probe.url());
            if let Err(e) = client.add_endpoint(probe.url()).await {
                log::warn!("could not use {} again: {e}", probe.url());
            }
        }
        None if !answered && policy.in_use(i) => {
            log::debug!(
                "etcd endpoint {} missed a probe but is the last in use",
                probe.url()
            );
        }
        None => {}
    }
    if change.is_some() {
        // The callers' own connection follows the same set. After the
        // shared client's change, so that a read sent again on a removal
        // ([`routed`]) no longer goes to that endpoint.
        in_use.set(
            probes
                .iter()
                .enumerate()
                .filter(|(j, _)| policy.in_use(*j))
                .map(|(_, p)| p.url().to_string())
                .collect(),
        );
    }
    matches!(change, Some(Change::Add(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_miss_removes_one_answer_restores() {
        let mut p = Policy::new(vec![true, true, true]);
        assert_eq!(p.observe(0, true), None);
        assert_eq!(p.observe(0, false), Some(Change::Remove(0)));
        assert_eq!(p.observe(0, false), None, "already out");
        assert!(!p.in_use(0));
        assert_eq!(p.observe(0, true), Some(Change::Add(0)));
        assert_eq!(p.observe(0, true), None, "already in");
        assert!(p.in_use(0));
    }

    #[test]
    fn the_last_endpoint_in_use_is_never_removed() {
        let mut p = Policy::new(vec![true, true]);
        assert_eq!(p.observe(1, false), Some(Change::Remove(1)));
        assert_eq!(p.observe(0, false), None);
        assert!(p.in_use(0));
        // Endpoint 1 comes back; now 0 may go.
        assert_eq!(p.observe(1, true), Some(Change::Add(1)));
        assert_eq!(p.observe(0, false), Some(Change::Remove(0)));
        let mut single = Policy::new(vec![true]);
        assert_eq!(single.observe(0, false), None);
    }

    /// Whether `s` holds a raised suspicion (taking it).
    async fn was_raised(s: &Suspicion) -> bool {
        tokio::time::timeout(Duration::from_millis(20), s.raised())
            .await
            .is_ok()
    }

    #[test]
    fn a_call_raises_suspicion_when_slow_or_timed_out_and_not_when_quick() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let s = Suspicion::default();
            assert_eq!(
                watched(&s, Duration::from_secs(5), async { 7 }).await,
                Some(7)
            );
            assert!(
                !was_raised(&s).await,
                "a quick answer is no reason to probe"
            );

            let never = std::future::pending::<u8>();
            assert_eq!(watched(&s, Duration::from_millis(200), never).await, None);
            assert!(was_raised(&s).await, "a timeout is");

            let slow = tokio::time::sleep(SUSPECT_AFTER + Duration::from_millis(200));
            assert_eq!(watched(&s, Duration::from_secs(5), slow).await, Some(()));
            assert!(
                was_raised(&s).await,
                "so is an answer slower than SUSPECT_AFTER"
            );
        });
    }

    #[test]
    fn a_read_is_sent_again_on_a_removal_and_a_write_is_not() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let s = Suspicion::default();
            let (removals_tx, removals) = watch::channel(0u64);
            // A removal from before the call started is no reason.
            removals_tx.send_modify(|n| *n += 1);
            let attempts = &std::cell::Cell::new(0u32);
            // The first attempt never answers (sent to the silent member);
            // later ones answer at once.
            let attempt = || {
                attempts.set(attempts.get() + 1);
                let first = attempts.get() == 1;
                async move {
                    if first {
                        std::future::pending::<()>().await;
                    }
                    attempts.get()
                }
            };
            let remove_soon = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                removals_tx.send_modify(|n| *n += 1);
                std::future::pending::<()>().await;
            };
            let read = routed(&s, &removals, Duration::from_secs(5), true, attempt);
            let started = tokio::time::Instant::now();
            let answer = tokio::select! {
                answer = read => answer,
                _ = remove_soon => unreachable!("pending"),
            };
            assert_eq!(answer, Some(2), "answered by the second attempt");
            assert!(started.elapsed() < Duration::from_secs(1));

            let writes = std::cell::Cell::new(0u32);
            let write = || {
                writes.set(writes.get() + 1);
                std::future::pending::<()>()
            };
            let remove_soon = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                removals_tx.send_modify(|n| *n += 1);
                std::future::pending::<()>().await;
            };
            let sent = routed(&s, &removals, Duration::from_millis(300), false, write);
            let answer = tokio::select! {
                answer = sent => answer,
                _ = remove_soon => unreachable!("pending"),
            };
            assert_eq!(answer, None, "the write timed out");
            assert_eq!(writes.get(), 1, "and was sent once");
        });
    }

    #[test]
    fn only_suspicion_or_an_endpoint_out_of_use_calls_for_probes() {
        let mut p = Policy::new(vec![true, true, true]);
        assert_eq!(p.to_probe(false), Vec::<usize>::new(), "all well: no probe");
        assert_eq!(p.to_probe(true), vec![0, 1, 2]);
        assert_eq!(p.observe(1, false), Some(Change::Remove(1)));
        assert_eq!(p.to_probe(false), vec![1], "only the one to let back in");
        assert_eq!(p.to_probe(true), vec![0, 1, 2]);
        assert_eq!(p.observe(1, true), Some(Change::Add(1)));
        assert_eq!(p.to_probe(false), Vec::<usize>::new());
    }

    #[test]
    fn endpoints_that_missed_the_connect_join_when_they_answer() {
        let mut p = Policy::new(vec![true, false, false]);
        assert_eq!(p.observe(1, false), None);
        assert_eq!(p.observe(2, true), Some(Change::Add(2)));
        assert_eq!(p.observe(7, true), None, "no such endpoint");
    }

    #[test]
    fn any_sequence_keeps_one_endpoint_in_use() {
        // A small exhaustive walk: every sequence of 8 observations over 3
        // endpoints starting all in use leaves at least one in use.
        for code in 0u32..(6u32.pow(8)) {
            let mut p = Policy::new(vec![true; 3]);
            let mut c = code;
            for _ in 0..8 {
                let (i, answered) = ((c % 3) as usize, (c / 3) % 2 == 1);
                c /= 6;
                p.observe(i, answered);
                assert!((0..3).any(|i| p.in_use(i)), "sequence {code}");
            }
        }
    }

    #[test]
    fn only_a_status_etcd_sent_itself_proves_an_answer() {
        use tonic::{Code, Status};
        let status = |code| ec::Error::GRpcStatus(Status::new(code, "etcdserver: x"));
        // etcd refused the request, so it is alive.
        for code in [
            Code::PermissionDenied,
            Code::InvalidArgument,
            Code::NotFound,
        ] {
            assert!(etcd_answered(&status(code)), "{code:?}");
        }
        // Made up by the transport: no proof anybody answered.
        for code in [
            Code::Cancelled,
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Unavailable,
        ] {
            assert!(!etcd_answered(&status(code)), "{code:?}");
        }
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let caused = Status::from_error(Box::new(io));
        assert!(!etcd_answered(&ec::Error::GRpcStatus(caused)));
        assert!(!etcd_answered(&ec::Error::InvalidArgs("x".into())));
    }
}
