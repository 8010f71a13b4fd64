//! Connecting: every endpoint is probed on its own, so a member that hangs
//! cannot stall the start and each failure is reported in words (unknown
//! CA, a certificate for another name, a missing client certificate);
//! meanwhile the one shared client is built and logs in, so that both
//! connections are set up at once, and it ends up on the members that
//! answered their probes.
//!
//! Nothing here formats a password or key: errors are built from
//! etcd-client's errors, which carry neither (docs/etcd-notes.md,
//! "TLS and auth failures"), and from our own words.

use super::explain::{explain, foreign_greeting, greeting, hung_up, is_status};
use super::health::{etcd_answered, Probe, ProbeOutcome, STRAGGLER_GRACE};
use super::EtcdTarget;
use crate::tls::Tls;
use etcd_client as ec;
use std::time::Duration;
use tokio::time::Instant;

/// The longest a [`greeting`] may take, within the connect timeout: a
/// server that answers at all does so within a round trip.
const GREETING_WAIT: Duration = Duration::from_secs(1);

/// What a successful connect hands the driver.
pub(crate) struct Connected {
    /// The shared client, balancing over the members that answered.
    pub client: ec::Client,
    /// One probe per endpoint (for the health monitor) and whether each
    /// answered at connect time, in endpoint order.
    pub probes: Vec<(Probe, bool)>,
    /// What each member that answered its probe with its status said of
    /// itself, in endpoint order.
    pub statuses: Vec<super::ServerStatus>,
}

/// The options of the shared client; no credentials. HTTP/2 pings only
/// while a stream is open: etcd counts every ping on a connection without
/// one as abuse and closes it after the third (`too_many_pings`), and a
/// unary call already has its own timeout.
pub(crate) fn base_options(settings: &EtcdTarget) -> ec::ConnectOptions {
    probe_options(settings)
        .with_keep_alive(settings.keepalive_interval, settings.keepalive_interval)
        .with_keep_alive_while_idle(false)
}

/// The options of a probe client: no pings at all (a probe is one status
/// call with its own timeout; its connection is otherwise idle).
pub(crate) fn probe_options(settings: &EtcdTarget) -> ec::ConnectOptions {
    let options = ec::ConnectOptions::new().with_connect_timeout(settings.connect_timeout);
    match &settings.tls {
        // A handshake that never completes (a blackholed member) must not
        // stall a connection forever.
        Some(tls) => options.with_tls(tls_options(tls).timeout(settings.connect_timeout)),
        None => options,
    }
}

/// Probe every endpoint and, at the same time, build the shared client on
/// all of them and prove it (log in, or make sure etcd wants no user):
/// both dial at once, so a connect costs one connection set-up and one
/// round trip, not the probes' and then the shared client's in turn. The
/// probes decide: an endpoint that did not answer its probe is taken out
/// of the shared client (the health monitor lets it back in), and when
/// the shared client's proof is still waiting on a member whose probe
/// failed, it is dropped and the client built again on those that
/// answered, so a hanging member cannot stall the start. The error is one
/// line.
pub(crate) async fn connect(settings: &EtcdTarget) -> Result<Connected, String> {
    let deadline = Instant::now() + settings.connect_timeout;
    let tls = settings.tls.as_ref();
    let mut probes = Vec::with_capacity(settings.endpoints.len());
    for url in &settings.endpoints {
        probes.push(Probe::new(url, probe_options(settings), tls).await?);
    }
    let early = prove(&settings.endpoints, settings);
    tokio::pin!(early);
    let mut proven = None;
    let (outcomes, statuses) = {
        let probing = probe_all(&probes, settings.connect_timeout, deadline);
        tokio::pin!(probing);
        loop {
            tokio::select! {
                found = &mut probing => break found,
                result = &mut early, if proven.is_none() => proven = Some(result),
            }
        }
    };
    let answered: Vec<String> = probes
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| matches!(o, Some(ProbeOutcome::Answered)))
        .map(|(p, _)| p.url().to_string())
        .collect();
    if answered.is_empty() {
        let outcomes = tell_hang_ups(&probes, outcomes, tls.is_none(), deadline).await;
        return Err(summarize(&probes, &outcomes, settings.connect_timeout));
    }
    let every_one = answered.len() == probes.len();
    let early = match proven {
        Some(result) => Some(result),
        // Every member answered its probe: the proof is on its way.
        None if every_one => match tokio::time::timeout_at(deadline, &mut early).await {
            Ok(result) => Some(result),
            Err(_) => return Err(format!("no answer within {:?}", settings.connect_timeout)),
        },
        // It may be waiting on a member that does not answer.
        None => None,
    };
    let client = match early {
        Some(Ok(client)) => {
            for (probe, outcome) in probes.iter().zip(&outcomes) {
                if !matches!(outcome, Some(ProbeOutcome::Answered)) {
                    // Starts out unused, as if never added (a failure here
                    // means the balancer is gone; the first call says so).
                    let _ = client.remove_endpoint(probe.url()).await;
                }
            }
            client
        }
        // etcd itself said no (a wrong password, a user missing): no other
        // member would say otherwise.
        Some(Err(Failure::Refused(why))) => return Err(why),
        // Sent to a member that failed (its probe said so, or it broke
        // since): again, on those that answered.
        Some(Err(Failure::Unreachable(_))) | None => {
            match tokio::time::timeout_at(deadline, prove(&answered, settings)).await {
                Ok(Ok(client)) => client,
                Ok(Err(Failure::Refused(why) | Failure::Unreachable(why))) => return Err(why),
                Err(_) => return Err(format!("no answer within {:?}", settings.connect_timeout)),
            }
        }
    };
    // What each member that answered with its status said of itself; an
    // answer that was an error of etcd's own says nothing.
    let statuses = statuses.into_iter().flatten().collect();
    let probes = probes
        .into_iter()
        .zip(outcomes)
        .map(|(p, o)| (p, matches!(o, Some(ProbeOutcome::Answered))))
        .collect();
    Ok(Connected {
        client,
        probes,
        statuses,
    })
}

/// Over plain text, a server that hung up on a probe may be no etcd at
/// all (an HTTP/1 server, a TLS port) that answered and closed before
/// the client read the answer: each such endpoint gets a [`greeting`] of
/// its own, within the connect deadline, and its reason says what
/// answered when that was not HTTP/2 ([`foreign_greeting`]).
async fn tell_hang_ups(
    probes: &[Probe],
    mut outcomes: Vec<Option<ProbeOutcome>>,
    plain: bool,
    deadline: Instant,
) -> Vec<Option<ProbeOutcome>> {
    if !plain {
        return outcomes;
    }
    for (probe, outcome) in probes.iter().zip(outcomes.iter_mut()) {
        let Some(ProbeOutcome::Failed(why)) = outcome else {
            continue;
        };
        let Some(address) = probe.url().strip_prefix("http://") else {
            continue;
        };
        if !hung_up(why) {
            continue;
        }
        let within = deadline
            .saturating_duration_since(Instant::now())
            .min(GREETING_WAIT);
        let answer = greeting(address, within).await;
        if let Some(foreign) = answer.and_then(|first| foreign_greeting(&first, why)) {
            *why = foreign;
        }
    }
    outcomes
}

/// Why the shared client could not be proven.
enum Failure {
    /// etcd answered, and refused: a wrong password, or no user where etcd
    /// wants one.
    Refused(String),
    /// No answer (refused connection, TLS, a timeout).
    Unreachable(String),
}

/// The shared client on `endpoints`, proven: logged in with the user
/// (etcd-client does so as it connects), or, without one, a read that
/// etcd refuses when it has authentication enabled — said now rather than
/// at the first call.
async fn prove(endpoints: &[String], settings: &EtcdTarget) -> Result<ec::Client, Failure> {
    let tls = settings.tls.as_ref();
    let mut options = base_options(settings).with_auto_token_refresh(true);
    if let Some(user) = &settings.user {
        options = options.with_user(user.name(), user.password());
    }
    let mut client = ec::Client::connect(endpoints, Some(options))
        .await
        .map_err(|e| {
            let why = login_reason(&e, settings, tls);
            if etcd_answered(&e) {
                Failure::Refused(why)
            } else {
                Failure::Unreachable(why)
            }
        })?;
    if settings.user.is_none() {
        let read = ec::GetOptions::new().with_serializable().with_keys_only();
        match client.get(vec![0u8], Some(read)).await {
            Ok(_) => {}
            Err(e) if is_user_missing(&e) => {
                return Err(Failure::Refused(
                    "etcd has authentication enabled and no user was given \
                     (EtcdOptions::with_user, --user)"
                        .to_string(),
                ))
            }
            // Any other answer of etcd's own still proves it answers.
            Err(e) if etcd_answered(&e) => {}
            Err(e) => return Err(Failure::Unreachable(explain(&e, tls))),
        }
    }
    Ok(client)
}

/// Probe all at once; stop at `deadline`, or [`STRAGGLER_GRACE`] after the
/// first answer (those that miss it start out unused and join once the
/// health monitor hears from them). `None` for a probe cut short; beside each, what the
/// member said of itself when it answered with its status.
async fn probe_all(
    probes: &[Probe],
    timeout: Duration,
    deadline: Instant,
) -> (Vec<Option<ProbeOutcome>>, Vec<Option<super::ServerStatus>>) {
    let mut running = tokio::task::JoinSet::new();
    for (i, probe) in probes.iter().enumerate() {
        let probe = probe.clone();
        running.spawn(async move { (i, probe.check_status(timeout).await) });
    }
    let mut outcomes: Vec<Option<ProbeOutcome>> = vec![None; probes.len()];
    let mut statuses: Vec<Option<super::ServerStatus>> = vec![None; probes.len()];
    let mut stop_at = deadline;
    loop {
        match tokio::time::timeout_at(stop_at, running.join_next()).await {
            Ok(Some(Ok((i, (outcome, status))))) => {
                if matches!(outcome, ProbeOutcome::Answered) {
                    stop_at = stop_at.min(Instant::now() + STRAGGLER_GRACE);
                }
                if let Some(slot) = outcomes.get_mut(i) {
                    *slot = Some(outcome);
                }
                if let Some(slot) = statuses.get_mut(i) {
                    *slot = status;
                }
            }
            // A probe task panicked: that endpoint stays unknown.
            Ok(Some(Err(_))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    running.abort_all();
    (outcomes, statuses)
}

/// etcd-client's TLS options for `tls`: its CA, client identity and
/// server name, nothing else.
pub(crate) fn tls_options(tls: &Tls) -> ec::TlsOptions {
    let mut options = ec::TlsOptions::new().ca_certificate(ec::Certificate::from_pem(tls.ca_pem()));
    if let Some((cert, key)) = tls.client_identity_pem() {
        options = options.identity(ec::Identity::from_pem(cert, key));
    }
    if let Some(name) = tls.server_name() {
        options = options.domain_name(name.to_owned());
    }
    options
}

/// Why no endpoint answered: the reason alone when there is one endpoint
/// or all failed alike, else each endpoint with its reason.
fn summarize(probes: &[Probe], outcomes: &[Option<ProbeOutcome>], timeout: Duration) -> String {
    let reasons: Vec<(String, String)> = probes
        .iter()
        .zip(outcomes)
        .map(|(p, o)| {
            let why = match o {
                Some(ProbeOutcome::Failed(why)) => why.clone(),
                _ => format!("no answer within {timeout:?}"),
            };
            (p.url().to_string(), why)
        })
        .collect();
    match reasons.first() {
        Some((_, first)) if reasons.iter().all(|(_, why)| why == first) => first.clone(),
        _ => reasons
            .iter()
            .map(|(url, why)| format!("{url}: {why}"))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

/// Why logging in failed, naming the user (never the password).
fn login_reason(e: &ec::Error, settings: &EtcdTarget, tls: Option<&Tls>) -> String {
    let reason = explain(e, tls);
    match &settings.user {
        Some(user) if is_status(e, tonic::Code::InvalidArgument) => {
            format!("authentication as {:?} failed: {reason}", user.name())
        }
        _ => reason,
    }
}

/// etcd's `ErrGRPCUserEmpty`: auth is on and the request had no token.
fn is_user_missing(e: &ec::Error) -> bool {
    matches!(e, ec::Error::GRpcStatus(s)
        if s.code() == tonic::Code::InvalidArgument && s.message() == "etcdserver: user name is empty")
}
