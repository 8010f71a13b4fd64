//! Several etcd processes forming one cluster.

use std::thread;
use std::time::{Duration, Instant};

use super::admin::Admin;
use super::server::{pki_for, unique_token, MemberSpec};
use super::{net, EtcdBuilder, EtcdServer, GrpcCounts, TestPki};
use crate::deadline::deadline_after;
use crate::tls::EtcdUser;
use crate::{Error, Result};

/// How many times a cluster start is retried after losing a port race.
const PORT_ATTEMPTS: usize = 3;

/// `call` until it succeeds, for up to 10 s: a member just restarted can
/// answer `/health` while its client port still refuses connections
/// (seen with etcd 3.5.1).
fn retried<T>(mut call: impl FnMut() -> Result<T>) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match call() {
            Ok(v) => return Ok(v),
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(e),
        }
    }
}

/// One member's hash of its keys at a revision ([`EtcdCluster::member_hashes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberHash {
    /// The member's index in the cluster.
    pub member: usize,
    /// The revision hashed: the same for every member of one call.
    pub revision: i64,
    /// etcd's HashKV of the member's keys up to `revision`.
    pub hash: u32,
}

/// An etcd cluster of `n` real processes on loopback, configured with a
/// static `--initial-cluster`.
///
/// Guarantees: after [`EtcdCluster::start`] returns `Ok`, every member
/// answered `/health` with true (so the cluster has a leader). Each member
/// is an [`EtcdServer`] with its own temp dir; dropping the cluster kills
/// every member and removes their directories.
///
/// ```
/// use fleetcoord::testing::EtcdCluster;
///
/// let mut cluster = EtcdCluster::start(3)?;
/// let leader = cluster.leader_index()?;
/// cluster.kill(leader)?;
/// let next = cluster.leader_index()?; // the other two elect a new leader
/// assert_ne!(leader, next);
/// cluster.restart(leader)?;
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
    health_timeout: Duration,
}

impl EtcdCluster {
    /// Starts `n` members with default options and waits until all are
    /// healthy. `n` must be at least 1.
    pub fn start(n: usize) -> Result<EtcdCluster> {
        EtcdBuilder::new().start_cluster(n)
    }

    pub(crate) fn start_with(builder: &EtcdBuilder, n: usize) -> Result<EtcdCluster> {
        if n == 0 {
            return Err(Error::invalid("n", "a cluster needs at least one member"));
        }
        let pki = pki_for(builder)?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let ports = (0..n)
                .map(|_| Ok((net::free_port()?, net::free_port()?)))
                .collect::<std::io::Result<Vec<(u16, u16)>>>()?;
            let initial_cluster = ports
                .iter()
                .enumerate()
                .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
                .collect::<Vec<_>>()
                .join(",");
            let token = unique_token();
            // All members must run before any can become healthy: quorum.
            let mut members = ports
                .iter()
                .enumerate()
                .map(|(i, &(client_port, peer_port))| {
                    EtcdServer::spawn(&MemberSpec {
                        name: format!("m{i}"),
                        client_port,
                        peer_port,
                        initial_cluster: initial_cluster.clone(),
                        token: token.clone(),
                        builder,
                        pki: pki.clone(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            match members.iter_mut().try_for_each(EtcdServer::wait_healthy) {
                Ok(()) => {
                    let cluster = EtcdCluster {
                        members,
                        health_timeout: builder.health_timeout,
                    };
                    if builder.auth {
                        cluster
                            .admin(None)?
                            .enable_auth(EtcdServer::ROOT_PASSWORD)?;
                    }
                    return Ok(cluster);
                }
                Err(e) if members.iter().any(EtcdServer::lost_port_race) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::invalid("n", "no start attempt was made")))
    }

    /// The harness's administrator on every member.
    fn admin(&self, root: Option<EtcdUser>) -> Result<Admin> {
        let mut admin = self.members[0].admin(root)?;
        admin.endpoints = self.endpoints();
        Ok(admin)
    }

    /// [`EtcdServer::create_user`] for the whole cluster.
    pub fn create_user(
        &self,
        name: &str,
        password: &str,
        prefix: Option<&str>,
    ) -> Result<EtcdUser> {
        self.admin(self.root()?)?
            .create_user(name, password, prefix)?;
        EtcdUser::new(name, password)
    }

    /// The test certificates when the members speak TLS.
    pub fn pki(&self) -> Option<&TestPki> {
        self.members[0].pki()
    }

    /// Number of members, running or not.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The client endpoints of all members, killed ones included (clients
    /// are expected to fail over between them).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// Member `i` (0-based), for its endpoint, pid or log.
    ///
    /// # Panics
    /// If `i >= self.len()`, like slice indexing.
    pub fn member(&self, i: usize) -> &EtcdServer {
        &self.members[i]
    }

    /// All members in index order.
    pub fn members(&self) -> &[EtcdServer] {
        &self.members
    }

    fn member_mut(&mut self, i: usize) -> Result<&mut EtcdServer> {
        let len = self.members.len();
        self.members
            .get_mut(i)
            .ok_or_else(|| Error::invalid("i", format!("member {i} of a {len}-member cluster")))
    }

    /// SIGKILLs member `i` (see [`EtcdServer::kill`]).
    pub fn kill(&mut self, i: usize) -> Result<()> {
        self.member_mut(i)?.kill()
    }

    /// Restarts member `i` with its data and waits until it is healthy,
    /// which needs quorum (see [`EtcdServer::restart`]).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.member_mut(i)?.restart()
    }

    /// SIGSTOPs member `i` (see [`EtcdServer::pause`]).
    pub fn pause(&mut self, i: usize) -> Result<()> {
        self.member_mut(i)?.pause()
    }

    /// SIGCONTs member `i` (see [`EtcdServer::resume`]).
    pub fn resume(&mut self, i: usize) -> Result<()> {
        self.member_mut(i)?.resume()
    }

    /// Each running member's hash of its keys at one revision, to check
    /// that they hold the same data: etcd's HashKV on every member at the
    /// lowest revision all of them have reached. Members that agree give
    /// equal hashes; a member whose data diverged (etcd 3.5.0–3.5.2 can,
    /// after a crash: etcd-io/etcd#13766) gives another. Killed members
    /// are left out; a paused one does not answer, so the call fails after
    /// 20 s. Writes may go on meanwhile.
    ///
    /// ```
    /// use fleetcoord::testing::EtcdCluster;
    ///
    /// let cluster = EtcdCluster::start(3)?;
    /// let hashes = cluster.member_hashes()?;
    /// assert_eq!(hashes.len(), 3);
    /// assert!(hashes.iter().all(|h| h.hash == hashes[0].hash));
    /// # Ok::<(), fleetcoord::Error>(())
    /// ```
    pub fn member_hashes(&self) -> Result<Vec<MemberHash>> {
        let running: Vec<(usize, Admin)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.pid().is_some())
            .map(|(i, m)| Ok((i, m.admin(self.root()?)?)))
            .collect::<Result<_>>()?;
        let mut revision = i64::MAX;
        for (_, admin) in &running {
            revision = revision.min(retried(|| admin.revision())?);
        }
        running
            .iter()
            .map(|(member, admin)| {
                Ok(MemberHash {
                    member: *member,
                    revision,
                    hash: retried(|| admin.hash_kv(revision))?,
                })
            })
            .collect()
    }

    /// [`EtcdServer::grpc_counts`] summed over the running members: what
    /// the cluster as a whole has served (killed members are left out).
    pub fn grpc_counts(&self) -> Result<GrpcCounts> {
        let mut total = GrpcCounts::default();
        for member in self.members.iter().filter(|m| m.pid().is_some()) {
            total.add(&member.grpc_counts()?);
        }
        Ok(total)
    }

    fn root(&self) -> Result<Option<EtcdUser>> {
        self.members[0]
            .auth_enabled()
            .then(|| self.members[0].root_user())
            .transpose()
    }

    /// The index of the raft leader: asks every running member for its
    /// status (etcd's `/v3/maintenance/status`, a few hundred bytes, each
    /// member at the same time, 2 s each) until the members
    /// that answered at the highest raft term name one leader that is
    /// among them, retrying for up to the health timeout (20 s by
    /// default). Paused or killed members answer nothing, so a stale
    /// leader that is paused is never returned. When none is found, the
    /// error gives each member's last answer (or why it had none).
    ///
    /// It used to ask each member's `/metrics` page (160 KB) with half a
    /// second per member: on a loaded machine no page came back in time,
    /// and no leader was found for 20 s although there was one.
    pub fn leader_index(&self) -> Result<usize> {
        let deadline = deadline_after(self.health_timeout);
        loop {
            let answers: Vec<std::result::Result<Status, String>> = thread::scope(|scope| {
                let asks: Vec<_> = self
                    .members
                    .iter()
                    .map(|m| scope.spawn(move || status(m)))
                    .collect();
                asks.into_iter()
                    .map(|ask| ask.join().unwrap_or_else(|_| Err("panicked".into())))
                    .collect()
            });
            if let Some(leader) = leader_of(&answers) {
                return Ok(leader);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let told: Vec<String> = answers
                    .iter()
                    .enumerate()
                    .map(|(i, a)| match a {
                        Ok(s) => format!(
                            "member {i}: id {}, term {}, leader {}",
                            s.member_id, s.raft_term, s.leader
                        ),
                        Err(e) => format!("member {i}: {e}"),
                    })
                    .collect();
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no raft leader found within {:?}; last answers: {}",
                        self.health_timeout,
                        told.join("; ")
                    ),
                )));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// How long [`EtcdCluster::leader_index`] waits for one member's status.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// What a member said of the raft in its status.
#[derive(Debug)]
struct Status {
    member_id: u64,
    raft_term: u64,
    /// The leader's member id as this member knows it; 0 for none.
    leader: u64,
}

/// `member`'s status, or why there is none.
fn status(member: &EtcdServer) -> std::result::Result<Status, String> {
    if member.pid().is_none() {
        return Err("not running".into());
    }
    let (code, body) = net::http(
        member.http_addr(),
        "POST",
        "/v3/maintenance/status",
        "{}",
        STATUS_TIMEOUT,
    )
    .map_err(|e| format!("no status: {e}"))?;
    if code != 200 {
        return Err(format!("status answered HTTP {code}: {body}"));
    }
    let field =
        |name: &str| json_number(&body, name).ok_or_else(|| format!("no {name} in status {body}"));
    Ok(Status {
        member_id: field("member_id")?,
        raft_term: field("raft_term")?,
        leader: json_number(&body, "leader").unwrap_or(0),
    })
}

/// The member that the answers at the highest raft term name leader, if
/// it answered at that term itself.
fn leader_of(answers: &[std::result::Result<Status, String>]) -> Option<usize> {
    let term = answers.iter().flatten().map(|s| s.raft_term).max()?;
    let current: Vec<(usize, &Status)> = answers
        .iter()
        .enumerate()
        .filter_map(|(i, a)| a.as_ref().ok().map(|s| (i, s)))
        .filter(|(_, s)| s.raft_term == term)
        .collect();
    let leader = current.iter().map(|(_, s)| s.leader).find(|l| *l != 0)?;
    if current
        .iter()
        .any(|(_, s)| s.leader != 0 && s.leader != leader)
    {
        return None;
    }
    current
        .iter()
        .find(|(_, s)| s.member_id == leader)
        .map(|(i, _)| *i)
}

/// The unsigned number `"name":"123"` (or `"name":123`) in etcd's JSON:
/// grpc-gateway writes 64-bit integers as strings. The first occurrence.
fn json_number(body: &str, name: &str) -> Option<u64> {
    let quoted = format!("\"{name}\"");
    let at = body.find(&quoted)? + quoted.len();
    let rest = body[at..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_etcd_status_numbers() {
        let body = r#"{"header":{"cluster_id":"1", "member_id":"137", "revision":"1", "raft_term":"2"}, "leader":"137", "raftTerm":"2"}"#;
        assert_eq!(json_number(body, "member_id"), Some(137));
        assert_eq!(json_number(body, "raft_term"), Some(2));
        assert_eq!(json_number(body, "leader"), Some(137));
        assert_eq!(json_number(body, "absent"), None);
    }

    fn at(member_id: u64, raft_term: u64, leader: u64) -> std::result::Result<Status, String> {
        Ok(Status {
            member_id,
            raft_term,
            leader,
        })
    }

    #[test]
    fn the_leader_is_the_one_named_at_the_highest_term_and_answering() {
        // A resumed ex-leader still at term 2 names itself; term 3 wins.
        let answers = [at(10, 2, 10), at(20, 3, 30), at(30, 3, 30)];
        assert_eq!(leader_of(&answers), Some(2));
        // The leader named did not answer (paused): none yet.
        let answers = [at(10, 3, 30), at(20, 3, 30), Err("paused".into())];
        assert_eq!(leader_of(&answers), None);
        // Mid-election: no leader named.
        assert_eq!(leader_of(&[at(10, 4, 0), at(20, 4, 0)]), None);
        assert_eq!(leader_of(&[Err("x".into())]), None);
    }
}
