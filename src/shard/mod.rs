//! [`ShardMap`]: a fleet's work spread over its live members, every shard
//! owned by at most one member at a time, fenced, and handed over without
//! overlap.

// This file is the facade: the public handle and what each call asks of
// the member. Each other job has its own file: the options and checks
// (options.rs), the events and read results (events.rs), and what the
// user may believe, judged by its own clock (belief.rs). The machine it
// runs, the map composed with its session, is `fleetcoord_sm::shard::member`:
// the one the shard simulation drives.

use crate::driver::{rand_seed, MachineHandle, Notify};
use crate::error::{Error, ErrorKind, Result};
use crate::etcd::Etcd;
use crate::session::{close_outcome, Attachment, Session, ATTEMPT_TIMEOUT, CLOSE_WAIT};
use crate::txn::{check_ops, TxnOp, TxnOpResponse};
use belief::Beliefs;
use fleetcoord_sm::keepalive::KeepaliveConfig;
use fleetcoord_sm::shard::member::{Member, MemberInput, MemberNotice};
use fleetcoord_sm::shard::{keys, ShardConfig};
use fleetcoord_sm::{BackoffConfig, KeyRange, KeyValue, RangeRequest, Request, Response};
use std::sync::Arc;
use std::time::Instant;

mod belief;
mod events;
mod options;

pub use events::{ShardEvent, ShardMember, ShardOwner};
pub use options::{ShardOptions, DEFAULT_SHARDS_PREFIX, MAX_SHARDS};

/// This process's membership of a shard map: `shards` numbered shards
/// (`0..shards`) spread over the live members of the map by weighted
/// rendezvous hashing, so that a join or a leave moves only the shards of
/// the member that joined or left (about `shards / members` of them).
///
/// Guarantees (README, "Shard maps"):
/// * Per shard, at most one member believes it owns it at any instant:
///   a shard key is created only while absent; an owner's belief ends
///   before it deletes the key, and, when its lease expires instead, at
///   its session's local deadline, which passes before etcd can expire
///   the lease and let another member create the key. Belief
///   ([`ShardMap::owned`], [`ShardMap::token`],
///   [`ShardMap::txn_if_owner`]) is judged by the calling thread's clock
///   against that deadline, so a driver thread that reports late cannot
///   stretch it. This holds while the clock runs no slower than the
///   session's drift allowance
///   ([`SessionOptions::drift_allowance_ppm`](crate::SessionOptions::drift_allowance_ppm))
///   permits; the fencing token covers the rest.
/// * Every new owner's token is greater than every earlier owner's, and a
///   write fenced by [`ShardMap::txn_if_owner`] applies only while the
///   shard key is the one created with that token.
/// * Once membership stays stable and etcd answers, every shard is owned
///   by its placed member within the old owner's drain or its lease's
///   expiry, plus a round trip; a shard whose placed member owns it never
///   moves.
///
/// Events ([`ShardMap::events`]) go to an unbounded channel: each is one
/// ownership change of this member (at most three per ownership), so a
/// consumer that never reads holds three events per change, no more.
///
/// **Dropping** a `ShardMap` leaves as [`ShardMap::leave`] does, without
/// waiting: every belief ends, the shard keys and the member key are
/// deleted and the lease revoked (its own; a shared session's stays) in
/// the background; unreachable, they go
/// with the lease after its TTL.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = fleetcoord::testing::EtcdServer::start()?;
/// use fleetcoord::{Etcd, ShardEvent, ShardMap, ShardOptions, TxnOp};
/// use std::time::Duration;
///
/// let etcd = Etcd::connect(&server.endpoint())?;
/// let map = ShardMap::join(&etcd, "jobs", 8, ShardOptions::default().with_member("host-a"))?;
/// // Alone in the map, this member acquires every shard.
/// let mut owned = 0;
/// while owned < 8 {
///     match map.events().recv_timeout(Duration::from_secs(10))? {
///         ShardEvent::Acquired { shard, token } => {
///             owned += 1;
///             // A write that applies only while this member owns the shard.
///             let key = format!("/jobs/{shard}/state");
///             assert!(map.txn_if_owner(shard, [TxnOp::put(key, "running")])?.is_some());
///             assert!(token > 0);
///         }
///         other => panic!("unexpected {other:?}"),
///     }
/// }
/// assert_eq!(map.owner_of(3)?.map(|o| o.member), Some("host-a".to_string()));
/// map.leave()?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a ShardMap leaves the map at once"]
pub struct ShardMap {
    etcd: Etcd,
    prefix: String,
    member: String,
    shards: u32,
    beliefs: Arc<Beliefs>,
    events: crossbeam_channel::Receiver<ShardEvent>,
    machine: MachineHandle<Member>,
    /// The member's place on a shared session; `None` with its own.
    attachment: Option<Attachment>,
}

impl std::fmt::Debug for ShardMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardMap")
            .field("prefix", &self.prefix)
            .field("member", &self.member)
            .field("shards", &self.shards)
            .finish()
    }
}

impl ShardMap {
    /// Join the shard map `name` (one key segment) of `shards` shards
    /// (1 to [`MAX_SHARDS`]; every member must use the same number) as a
    /// new member with its own session lease. Returns at once; shards come
    /// as [`ShardEvent::Acquired`] once the session is granted and the map
    /// read. Bad names, counts or options are
    /// [`Error::InvalidArgument`] naming the field.
    pub fn join(etcd: &Etcd, name: &str, shards: u32, options: ShardOptions) -> Result<ShardMap> {
        crate::blocking::check()?;
        let (prefix, member, map) = member_config(etcd, name, shards, &options)?;
        options.check_settings()?;
        let session = KeepaliveConfig {
            ttl_secs: options.session.ttl.as_secs() as i64,
            backoff: BackoffConfig::default(),
            safety_margin: options.session.safety_margin,
            drift_allowance_ppm: options.session.drift_allowance_ppm,
            attempt_timeout: map.attempt_timeout,
            // Every renewal moves the deadline belief is judged by.
            announce_trust: true,
        };
        let (events_tx, events) = crossbeam_channel::unbounded();
        let beliefs = Arc::new(Beliefs::new(events_tx));
        let handler = beliefs.clone();
        let machine = Member::new(
            session,
            map,
            Some(etcd.renewal_grid()),
            Instant::now(),
            rand_seed(),
        );
        let machine = etcd.run(machine, Notify(move |notice| handler.apply(notice)))?;
        Ok(ShardMap {
            etcd: etcd.clone(),
            prefix,
            member,
            shards,
            beliefs,
            events,
            machine,
            attachment: None,
        })
    }

    /// Join the shard map `name` as [`ShardMap::join`] does, but on
    /// `session`'s lease, shared with the elections, locks and other
    /// primitives on it; `options.session` is not used (the session's
    /// settings are). The session's guarantees hold for the map too:
    /// * Ownership is believed only until the session's local deadline as
    ///   last told, and ends at once when the session loses or gives up
    ///   its lease, is refused or closed: every owned shard is told
    ///   [`ShardEvent::Lost`] before this process acts on a new lease, in
    ///   the same step that ends the session's leaderships and locks. The
    ///   member then joins again on the next lease.
    /// * etcd answering a request of the map with "lease not found" is a
    ///   loss at once: the map's beliefs end and the session is told, so
    ///   every primitive on it learns it now rather than at its next
    ///   renewal.
    /// * [`ShardMap::leave`] (or dropping the map) deletes the member key
    ///   and every owned shard key; the session lease stays.
    /// * One map per name per session: a second join of `name` on the
    ///   same session (same prefix) is [`Error::InvalidArgument`]; on a
    ///   closed session [`Error::Closed`].
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = fleetcoord::testing::EtcdServer::start()?;
    /// use fleetcoord::{Election, Etcd, Session, ShardEvent, ShardMap, ShardOptions};
    /// use std::time::Duration;
    ///
    /// let etcd = Etcd::connect(&server.endpoint())?;
    /// let session = Session::new(&etcd, Duration::from_secs(5))?;
    /// let election = Election::with_session(&session, "scheduler", Default::default())?;
    /// let map = ShardMap::with_session(&session, "jobs", 4, ShardOptions::default())?;
    /// // One lease for the election and the map: both end together.
    /// let leadership = election.campaign(b"host-a")?;
    /// for _ in 0..4 {
    ///     let event = map.events().recv_timeout(Duration::from_secs(10))?;
    ///     assert!(matches!(event, ShardEvent::Acquired { .. }));
    /// }
    /// assert_eq!(ShardMap::members_of(&etcd, "jobs", &ShardOptions::default())?[0].lease,
    ///            leadership.lease());
    /// # drop(leadership);
    /// map.leave()?; // deletes the map's keys; the session lease stays
    /// session.close()?;
    /// # Ok(()) }
    /// ```
    pub fn with_session(
        session: &Session,
        name: &str,
        shards: u32,
        options: ShardOptions,
    ) -> Result<ShardMap> {
        crate::blocking::check()?;
        if session.is_closed() {
            return Err(Error::Closed);
        }
        let etcd = session.etcd();
        let (prefix, member, map) = member_config(etcd, name, shards, &options)?;
        options.check_member()?;
        let (events_tx, events) = crossbeam_channel::unbounded();
        let beliefs = Arc::new(Beliefs::new(events_tx));
        let handler = beliefs.clone();
        // Requests for the shared lease go to the session before the
        // beliefs are locked: the session ends every primitive's beliefs.
        let requests_to = session.clone();
        let machine = Member::on_session(map, Instant::now(), rand_seed());
        let machine = etcd.run(
            machine,
            Notify(move |notice| {
                if let MemberNotice::SessionRequest(request) = notice {
                    requests_to.request(request);
                    return true;
                }
                handler.apply(notice)
            }),
        )?;
        let input = machine.downgrade();
        let lose = beliefs.clone();
        let attachment = session.attach(
            &prefix,
            move |fact| input.send(MemberInput::Session(fact)).is_ok(),
            move |lease, for_good| lose.end_on_session(lease, for_good),
            crate::session::Departure::end(&machine),
        )?;
        Ok(ShardMap {
            etcd: etcd.clone(),
            prefix,
            member,
            shards,
            beliefs,
            events,
            machine,
            attachment: Some(attachment),
        })
    }

    /// This member's ownership changes, in order (see [`ShardEvent`]).
    pub fn events(&self) -> &crossbeam_channel::Receiver<ShardEvent> {
        &self.events
    }

    /// This member's id (its member key's last segment, its shard keys'
    /// value).
    pub fn member_id(&self) -> &str {
        &self.member
    }

    /// The map's key prefix (`<prefix><name>/`): members under
    /// `members/<id>`, owners under `shards/<shard>`.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// How many shards the map has.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shards this member may believe it owns at this instant, with
    /// their tokens, in shard order: acquired, not lost, not handed back,
    /// and the session's local deadline and any release deadline still
    /// ahead by the calling thread's clock.
    pub fn owned(&self) -> Vec<(u32, i64)> {
        self.beliefs.owned()
    }

    /// The session's local deadline as of its last answered renewal:
    /// no shard is believed owned from then on unless a renewal moves it.
    /// `None` while no session is trusted (before the first grant, after a
    /// loss, after leaving).
    pub fn session_trusted_until(&self) -> Option<Instant> {
        self.beliefs.trusted_until()
    }

    /// The token of `shard` while this member may believe it owns it (as
    /// [`ShardMap::owned`] judges), else `None`.
    pub fn token(&self, shard: u32) -> Option<i64> {
        self.beliefs.remaining(shard).map(|(token, _)| token)
    }

    /// Hand `shard` back after [`ShardEvent::Release`]: this member's
    /// belief ends before this returns, then the member deletes the shard
    /// key (guarded on its token) so the placed member can take it. For a
    /// shard not being released this changes nothing. A shard outside the
    /// map is [`Error::InvalidArgument`].
    pub fn release(&self, shard: u32) -> Result<()> {
        crate::blocking::check()?;
        self.check_shard(shard)?;
        if self.beliefs.hand_back(shard) {
            self.machine
                .send(MemberInput::Release(shard))
                .map_err(|_| self.etcd.gone())?;
        }
        Ok(())
    }

    /// Leave the map and wait for it: every belief ends before anything is
    /// sent (stop the shards' work first), every owned shard is handed
    /// back at once, the member key deleted, then the session lease
    /// revoked. Returns once etcd confirmed the revoke, or with
    /// [`Error::Timeout`] after 10 s; the keys then go with the lease
    /// after its TTL.
    pub fn leave(self) -> Result<()> {
        crate::blocking::check()?;
        self.beliefs.end_all();
        self.machine
            .send(MemberInput::Leave)
            .map_err(|_| self.etcd.gone())?;
        let finished = self.machine.wait_finished(CLOSE_WAIT);
        if let Some(holder) = self.beliefs.duplicate() {
            return Err(Error::DuplicateId {
                key: format!("{}members/{}", self.prefix, self.member),
                holder,
            });
        }
        if self.attachment.is_some() {
            // The session's lease stays: nothing was revoked.
            return close_outcome(
                finished,
                Some(true),
                || self.etcd.gone(),
                self.etcd.endpoints(),
            );
        }
        if let Some(why) = self.beliefs.refused() {
            return Err(Error::etcd(
                ErrorKind::PermissionDenied,
                format!("etcd refused the session: {why}"),
            )
            .with_endpoints(self.etcd.endpoints()));
        }
        close_outcome(
            finished,
            self.beliefs.revoked(),
            || self.etcd.gone(),
            self.etcd.endpoints(),
        )
    }

    /// The owner of `shard` as etcd has it now (one linearizable read), or
    /// `None` while nobody owns it.
    pub fn owner_of(&self, shard: u32) -> Result<Option<ShardOwner>> {
        crate::blocking::check()?;
        self.check_shard(shard)?;
        let key = keys::shard_key(self.prefix.as_bytes(), shard);
        let kvs = read(&self.etcd, KeyRange::Key(key))?;
        Ok(kvs.first().map(|kv| owner(shard, kv)))
    }

    /// Run `ops` as one etcd transaction only while this member owns
    /// `shard` with the token it acquired it with: the transaction is
    /// guarded on the shard key's create revision, so it applies only
    /// while that key is the one this ownership created, whatever this
    /// process believes. `Ok(None)`: not owned (nothing was sent), or etcd
    /// refused the guard (nothing ran; the ownership is over, and
    /// [`ShardEvent::Lost`] is told before this returns). The request is
    /// given up when belief would end first ([`Error::Timeout`]; it may
    /// still apply, but only while the guard holds). Ops are checked as
    /// for [`Leadership::txn_if_leader`](crate::Leadership::txn_if_leader).
    pub fn txn_if_owner(
        &self,
        shard: u32,
        ops: impl IntoIterator<Item = TxnOp>,
    ) -> Result<Option<Vec<TxnOpResponse>>> {
        crate::blocking::check()?;
        self.check_shard(shard)?;
        let ops = check_ops(ops)?;
        let Some((token, left)) = self.beliefs.remaining(shard) else {
            return Ok(None);
        };
        let key = keys::shard_key(self.prefix.as_bytes(), shard);
        let txn = fleetcoord_sm::election::fenced_txn(&key, token, ops);
        let response = self.etcd.request_within(txn, left)?;
        crate::txn::fenced_answer(response, || self.beliefs.fence_refused(shard, token))
    }

    /// Every owned shard of map `name` as etcd has it now (one
    /// linearizable read, without joining), in shard order. `shards` is
    /// the map's shard count: keys beyond it are not shards of the map.
    pub fn owners_of(
        etcd: &Etcd,
        name: &str,
        shards: u32,
        options: &ShardOptions,
    ) -> Result<Vec<ShardOwner>> {
        crate::blocking::check()?;
        let prefix = options::map_prefix(name, options)?;
        options::shard_count(shards)?;
        let owners_prefix = format!("{prefix}shards/");
        let mut owners: Vec<ShardOwner> =
            read(etcd, KeyRange::Prefix(owners_prefix.clone().into_bytes()))?
                .iter()
                .filter_map(|kv| {
                    let suffix = kv.key.strip_prefix(owners_prefix.as_bytes())?;
                    let shard = keys::parse_shard(suffix, shards)?;
                    Some(owner(shard, kv))
                })
                .collect();
        owners.sort_by_key(|o| o.shard);
        Ok(owners)
    }

    /// The live members of map `name` as etcd has them now (one
    /// linearizable read, without joining), in id order.
    pub fn members_of(etcd: &Etcd, name: &str, options: &ShardOptions) -> Result<Vec<ShardMember>> {
        crate::blocking::check()?;
        let prefix = options::map_prefix(name, options)?;
        let members_prefix = format!("{prefix}members/");
        Ok(
            read(etcd, KeyRange::Prefix(members_prefix.clone().into_bytes()))?
                .iter()
                .filter_map(|kv| {
                    let id = kv.key.strip_prefix(members_prefix.as_bytes())?;
                    Some(ShardMember {
                        member: String::from_utf8_lossy(id).into_owned(),
                        weight: keys::parse_weight(&kv.value),
                        lease: kv.lease,
                    })
                })
                .collect(),
        )
    }

    fn check_shard(&self, shard: u32) -> Result<()> {
        if shard >= self.shards {
            return Err(Error::invalid(
                "shard",
                format!("{shard} is not below the map's {} shards", self.shards),
            ));
        }
        Ok(())
    }
}

/// The map's prefix, the member id and the map machine's settings, after
/// checking the name and shard count.
fn member_config(
    etcd: &Etcd,
    name: &str,
    shards: u32,
    options: &ShardOptions,
) -> Result<(String, String, ShardConfig)> {
    let prefix = options::map_prefix(name, options)?;
    options::shard_count(shards)?;
    let member = options
        .member
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().hyphenated().to_string());
    let map = ShardConfig {
        prefix: prefix.clone().into_bytes(),
        member: member.clone().into_bytes(),
        weight: options.weight,
        shards,
        backoff: BackoffConfig::default(),
        attempt_timeout: ATTEMPT_TIMEOUT.min(etcd.options().request_timeout),
        drain: options.drain,
    };
    Ok((prefix, member, map))
}

/// One linearizable read of `range`.
fn read(etcd: &Etcd, range: KeyRange) -> Result<Vec<KeyValue>> {
    match etcd.request(Request::Range(RangeRequest::all(range)))? {
        Response::Range { kvs, .. } => Ok(kvs),
        other => Err(Error::unexpected(other)),
    }
}

fn owner(shard: u32, kv: &KeyValue) -> ShardOwner {
    ShardOwner {
        shard,
        member: String::from_utf8_lossy(&kv.value).into_owned(),
        token: kv.create_revision,
        lease: kv.lease,
    }
}
