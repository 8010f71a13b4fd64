//! What a member knows of the map: the members' and owners' keys as of
//! one revision, from one read and the watch that follows it.

use super::keys;
use crate::rpc::{EventKind, KeyValue, LeaseId, Revision, WatchEvent};
use std::collections::BTreeMap;

/// A key of the map as last seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub value: Vec<u8>,
    pub lease: LeaseId,
    pub create_revision: Revision,
    pub mod_revision: Revision,
}

impl Seen {
    pub fn of(kv: &KeyValue) -> Self {
        Seen {
            value: kv.value.clone(),
            lease: kv.lease,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
        }
    }
}

/// The map at `revision`: members by id, owners' keys by shard. Keys under
/// the prefix that are neither are ignored.
#[derive(Clone, Debug)]
pub(crate) struct View {
    /// The revision of the newest change applied.
    pub revision: Revision,
    /// The read's revision: the watch delivers what came after it.
    read_revision: Revision,
    pub members: BTreeMap<Vec<u8>, Seen>,
    pub shards: BTreeMap<u32, Seen>,
    members_prefix: Vec<u8>,
    shards_prefix: Vec<u8>,
    shard_count: u32,
}

impl View {
    /// The view of one read's keys at `revision`.
    pub fn read(prefix: &[u8], shard_count: u32, revision: Revision, kvs: &[KeyValue]) -> Self {
        let mut view = View {
            revision,
            read_revision: revision,
            members: BTreeMap::new(),
            shards: BTreeMap::new(),
            members_prefix: keys::members_prefix(prefix),
            shards_prefix: keys::shards_prefix(prefix),
            shard_count,
        };
        for kv in kvs {
            view.put(kv);
        }
        view
    }

    fn put(&mut self, kv: &KeyValue) {
        if let Some(member) = kv.key.strip_prefix(self.members_prefix.as_slice()) {
            self.members.insert(member.to_vec(), Seen::of(kv));
        } else if let Some(shard) = self.shard_of(&kv.key) {
            self.shards.insert(shard, Seen::of(kv));
        }
    }

    fn shard_of(&self, key: &[u8]) -> Option<u32> {
        let suffix = key.strip_prefix(self.shards_prefix.as_slice())?;
        keys::parse_shard(suffix, self.shard_count)
    }

    /// Applies one watch event; returns whether membership changed. Events
    /// at or below the read's revision (the read showed them) change
    /// nothing; one txn's events share a revision, so only the read's
    /// revision is the bound.
    pub fn apply(&mut self, event: &WatchEvent) -> bool {
        if event.kv.mod_revision <= self.read_revision {
            return false;
        }
        self.revision = self.revision.max(event.kv.mod_revision);
        let is_member = event.kv.key.starts_with(&self.members_prefix);
        match event.kind {
            EventKind::Put => {
                let before = is_member.then(|| self.member_weight_of(&event.kv.key));
                self.put(&event.kv);
                is_member && before != Some(self.member_weight_of(&event.kv.key))
            }
            EventKind::Delete => {
                if let Some(member) = event.kv.key.strip_prefix(self.members_prefix.as_slice()) {
                    self.members.remove(member).is_some()
                } else {
                    if let Some(shard) = self.shard_of(&event.kv.key) {
                        self.shards.remove(&shard);
                    }
                    false
                }
            }
        }
    }

    fn member_weight_of(&self, key: &[u8]) -> Option<u32> {
        let member = key.strip_prefix(self.members_prefix.as_slice())?;
        self.members
            .get(member)
            .map(|s| keys::parse_weight(&s.value))
    }

    /// The live members with their weights, for placement.
    pub fn weights(&self) -> impl Iterator<Item = (&[u8], u32)> + Clone {
        self.members
            .iter()
            .map(|(m, s)| (m.as_slice(), keys::parse_weight(&s.value)))
    }
}
