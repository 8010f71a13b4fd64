//! Connecting: every endpoint is probed on its own first, so a member that
//! hangs cannot stall the start and each failure is reported in words
//! (unknown CA, a certificate for another name, a missing client
//! certificate); then the one shared client is built on the members that
//! answered and logs in.
//!
//! Nothing here formats a password or key: errors are built from
//! etcd-client's errors, which carry neither (docs/etcd-notes.md,
//! "TLS and auth failures"), and from our own words.

use super::health::{Probe, ProbeOutcome};
use super::ConnectSettings;
use crate::tls::refusal::{self, ClientSide};
use crate::tls::Tls;
use etcd_client as ec;
use std::time::Duration;
use tokio::time::Instant;

/// How long the other endpoints may still answer once one has: a healthy
/// member answers a status in a few milliseconds, even with a TLS handshake.
/// Those that miss it start out unused and join once the health monitor
/// hears from them.
const STRAGGLER_GRACE: Duration = Duration::from_millis(500);

/// What a successful connect hands the driver.
pub(crate) struct Connected {
    /// The shared client, balancing over the members that answered.
    pub client: ec::Client,
    /// One probe per endpoint (for the health monitor) and whether each
    /// answered at connect time, in endpoint order.
    pub probes: Vec<(Probe, bool)>,
    /// What the member that answered the proving status request said of
    /// itself.
    pub status: super::ServerStatus,
}

/// The options of the shared client; no credentials. HTTP/2 pings only
/// while a stream is open: etcd counts every ping on a connection without
/// one as abuse and closes it after the third (`too_many_pings`), and a
/// unary call already has its own timeout.
pub(crate) fn base_options(settings: &ConnectSettings) -> ec::ConnectOptions {
    probe_options(settings)
        .with_keep_alive(settings.keepalive_interval, settings.keepalive_interval)
        .with_keep_alive_while_idle(false)
}

/// The options of a probe client: no pings at all (a probe is one status
/// call with its own timeout; its connection is otherwise idle).
pub(crate) fn probe_options(settings: &ConnectSettings) -> ec::ConnectOptions {
    let options = ec::ConnectOptions::new().with_connect_timeout(settings.connect_timeout);
    match &settings.tls {
        // A handshake that never completes (a blackholed member) must not
        // stall a connection forever.
        Some(tls) => options.with_tls(tls.to_client().timeout(settings.connect_timeout)),
        None => options,
    }
}

/// Probe every endpoint, build the shared client on those that answered,
/// log in, and prove it with a request. The error is one line.
pub(crate) async fn connect(settings: &ConnectSettings) -> Result<Connected, String> {
    let deadline = Instant::now() + settings.connect_timeout;
    let base = base_options(settings);
    let tls = settings.tls.as_ref();
    let mut probes = Vec::with_capacity(settings.endpoints.len());
    for url in &settings.endpoints {
        probes.push(Probe::new(url, probe_options(settings), tls).await?);
    }
    let outcomes = probe_all(&probes, settings.connect_timeout, deadline).await;
    let answered: Vec<String> = probes
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| matches!(o, Some(ProbeOutcome::Answered)))
        .map(|(p, _)| p.url().to_string())
        .collect();
    if answered.is_empty() {
        return Err(summarize(&probes, &outcomes, settings.connect_timeout));
    }
    let mut options = base.with_auto_token_refresh(true);
    if let Some(user) = &settings.user {
        options = options.with_user(user.name(), user.password());
    }
    let attempt = async {
        let mut client = ec::Client::connect(&answered, Some(options))
            .await
            .map_err(|e| login_reason(&e, settings, tls))?;
        let status = client.status().await.map_err(|e| explain(&e, tls))?;
        let status = super::ServerStatus {
            version: status.version().to_string(),
            member_id: status.header().map_or(0, |h| h.member_id()),
        };
        if settings.user.is_none() {
            // etcd with auth enabled answers a status without a user, but
            // refuses every key: say so now rather than at the first call.
            let probe = ec::GetOptions::new().with_serializable().with_keys_only();
            if let Err(e) = client.get(vec![0u8], Some(probe)).await {
                if is_user_missing(&e) {
                    return Err("etcd has authentication enabled and no user was given \
                         (EtcdOptions::with_user, --user)"
                        .to_string());
                }
            }
        }
        Ok::<_, String>((client, status))
    };
    let (client, status) = match tokio::time::timeout_at(deadline, attempt).await {
        Ok(result) => result?,
        Err(_) => return Err(format!("no answer within {:?}", settings.connect_timeout)),
    };
    let probes = probes
        .into_iter()
        .zip(outcomes)
        .map(|(p, o)| (p, matches!(o, Some(ProbeOutcome::Answered))))
        .collect();
    Ok(Connected {
        client,
        probes,
        status,
    })
}

/// Probe all at once; stop at `deadline`, or [`STRAGGLER_GRACE`] after the
/// first answer. `None` for a probe cut short.
async fn probe_all(
    probes: &[Probe],
    timeout: Duration,
    deadline: Instant,
) -> Vec<Option<ProbeOutcome>> {
    let mut running = tokio::task::JoinSet::new();
    for (i, probe) in probes.iter().enumerate() {
        let probe = probe.clone();
        running.spawn(async move { (i, probe.check(timeout).await) });
    }
    let mut outcomes: Vec<Option<ProbeOutcome>> = vec![None; probes.len()];
    let mut stop_at = deadline;
    loop {
        match tokio::time::timeout_at(stop_at, running.join_next()).await {
            Ok(Some(Ok((i, outcome)))) => {
                if matches!(outcome, ProbeOutcome::Answered) {
                    stop_at = stop_at.min(Instant::now() + STRAGGLER_GRACE);
                }
                if let Some(slot) = outcomes.get_mut(i) {
                    *slot = Some(outcome);
                }
            }
            // A probe task panicked: that endpoint stays unknown.
            Ok(Some(Err(_))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    running.abort_all();
    outcomes
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
fn login_reason(e: &ec::Error, settings: &ConnectSettings, tls: Option<&Tls>) -> String {
    let reason = explain(e, tls);
    match &settings.user {
        Some(user) if is_status(e, tonic::Code::InvalidArgument) => {
            format!("authentication as {:?} failed: {reason}", user.name())
        }
        _ => reason,
    }
}

fn is_status(e: &ec::Error, code: tonic::Code) -> bool {
    matches!(e, ec::Error::GRpcStatus(s) if s.code() == code)
}

/// etcd's `ErrGRPCUserEmpty`: auth is on and the request had no token.
fn is_user_missing(e: &ec::Error) -> bool {
    matches!(e, ec::Error::GRpcStatus(s)
        if s.code() == tonic::Code::InvalidArgument && s.message() == "etcdserver: user name is empty")
}

/// One line saying what failed; TLS failures say which check failed and
/// what to change. The certificate checks are told apart by rustls's words
/// at the root of the error chain (docs/etcd-notes.md, "TLS and auth
/// failures": they all arrive as `Unavailable`, like a network failure).
pub(crate) fn explain(e: &ec::Error, tls: Option<&Tls>) -> String {
    let root = connect_reason(e);
    let Some(tls) = tls else {
        return root;
    };
    if refusal::untrusted_server(&root) {
        return format!("TLS: the server's certificate is not signed by the given CA ({root})");
    }
    if refusal::wrong_name(&root) {
        return format!(
            "TLS: the server's certificate is not valid for the name dialled; \
             dial a name it was issued for or set the TLS server name ({root})"
        );
    }
    let alert = refusal::refused_by_alert(&root);
    // Without an alert the client sees only the server hanging up, in one
    // of several words depending on where its request was (measured: the
    // shapes vary from run to run against the same server).
    let closed = is_status(e, tonic::Code::Cancelled)
        || [
            "transport error",
            "connection closed",
            "broken pipe",
            "connection reset",
        ]
        .iter()
        .any(|w| root.contains(w));
    if !(alert || closed) {
        return root;
    }
    let invalid_now = || tls.client_cert_invalid_at(refusal::unix_now());
    match refusal::client_side(tls.has_client_identity(), invalid_now) {
        ClientSide::Missing => format!(
            "TLS: the server closed the connection right after the handshake; it most \
             likely requires a client certificate, and none was given (--cert/--key) ({root})"
        ),
        ClientSide::Invalid(why) => {
            format!("TLS: the server refused the client certificate: {why} ({root})")
        }
        ClientSide::Refused => format!(
            "TLS: the server closed the connection right after the handshake; it most \
             likely refused the client certificate (is it signed by a CA the server \
             trusts?) ({root})"
        ),
    }
}

/// Why connecting failed, as one line for an operator. The Display of
/// etcd-client's error embeds tonic's `Status`, whose Display appends its
/// cause with `{:?}` — a struct dump. The root cause of the `source()`
/// chain says it plainly ("connection refused", a DNS failure), so that is
/// what the message carries.
pub(crate) fn connect_reason(e: &ec::Error) -> String {
    use std::error::Error as _;
    let reason = match e {
        ec::Error::GRpcStatus(status) => match status.source() {
            Some(cause) => root_cause(cause),
            // etcd (or something at that address) answered with a status.
            None if !status.message().is_empty() => status.message().to_string(),
            None => status.code().to_string(),
        },
        ec::Error::TransportError(t) => root_cause(t),
        ec::Error::IoError(io) => root_cause(io),
        other => other.to_string(),
    };
    // Display impls may still contain line breaks; the message is one line.
    reason.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The Display of the innermost error, in the lowercase style of the rest
/// of the message: an OS error's "(os error N)" suffix is dropped, since
/// the text before it says the same.
fn root_cause(mut e: &(dyn std::error::Error + 'static)) -> String {
    while let Some(next) = e.source() {
        e = next;
    }
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    };
    // "Connection refused" reads "connection refused"; "DNS ..." stays.
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if first.is_uppercase() && second.is_lowercase() => {
            first.to_lowercase().chain(text.chars().skip(1)).collect()
        }
        _ => text,
    }
}
