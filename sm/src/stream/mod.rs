//! Append-only, sequence-numbered streams on etcd keys.
//!
//! # Layout
//!
//! A stream `<name>` under a root `<root>` is two kinds of keys:
//!
//! * `<root>/stream/<name>/head` holds the last sequence number handed out,
//!   in decimal (absent = 0);
//! * `<root>/stream/<name>/e/<seq as 20 digits>` holds entry `seq`'s payload.
//!   Zero-padding to the width of `u64::MAX` makes key order sequence order.
//!
//! IDs are these sequence numbers, never etcd revisions: they count 1, 2, 3…
//! per stream, whatever else the cluster writes. [`StreamKeys`] owns the
//! layout; the request builders in [`requests`] are the only code that
//! shapes a stream's etcd requests.
//!
//! # Appending ([`Append`])
//!
//! One transaction per attempt, guarded on the head key's mod revision: if
//! the head is still the one just read, bump it to `seq + 1`, write the
//! entry, and (with a maximum length `n`) delete entry `seq + 1 - n`, the
//! one that falls out; if not, read the head instead. Of two appenders that
//! read the same head, exactly one wins; the loser's answer carries the
//! head it lost to, so it waits a jittered, capped backoff and retries on
//! that head without reading again, a bounded number of times, then fails
//! with [`StreamError::Contended`]. An append given the head an earlier one
//! left ([`AppendConfig::head`]) skips the first read too: one round trip
//! per append for a writer that appends in turn. Waiting is a timer the driver sleeps on
//! ([`crate::Machine::poll_timeout`]); the machine never blocks.
//!
//! Appends queued on one machine while its transaction is in flight go
//! together in the next one (a group: consecutive IDs, the head moved once
//! to the last, one entry trimmed per entry written, up to
//! [`AppendConfig::max_group`] entries and never more than the maximum
//! length). Writers sharing a machine therefore never race each other, and
//! a busy stream costs one transaction per round trip, not one per
//! append. A group applies whole or not at all, so everything below holds
//! for it as for one append.
//!
//! A transaction whose reply is lost may or may not have been applied. It
//! is sent again, unchanged, after the backoff ([`requests::resend`]): the
//! copies share one guard, so at most one of them can apply, and none
//! applies twice. A resend whose guard holds writes the entry (the lost
//! attempt did not); one whose guard fails reads entry `seq` (every entry
//! of a group) in the same transaction and settles it ([`requests::resend_outcome`]): our payload
//! there means the lost attempt wrote it (`Appended`, once); another
//! payload, or a head short of `seq`, means it did not (retry on the new
//! head, as after a lost race). Only when that cannot be known in time —
//! every resend fails until the patience runs out, the entry was trimmed
//! before it could be read, or the machine is stopped with a transaction
//! in flight — does the append fail with [`StreamError::Indeterminate`],
//! naming the one sequence number it may have been stored under.
//!
//! Payloads carry no identity: if another appender takes the same `seq`
//! with a byte-identical payload while our attempt is unanswered, the
//! resend takes that entry for ours, and both appends are answered with
//! the one entry. Appenders that need every append counted make payloads
//! unique (a writer id and counter in them).
//!
//! # Reading ([`Reader`], [`Cursor`])
//!
//! Read from the position (one read, at one revision), deliver every entry
//! after it in order, say [`ReaderNotice::Live`], then watch the entry
//! prefix from the next revision. After a watch failure, a compaction or a
//! paused consumer, read again and deliver only what comes after the last
//! delivered ID — so each entry is delivered at most once and in order, and
//! the only entries a reader ever skips are those trimmed away before the
//! read that would have found them.

mod append;
mod place;
mod read;
pub mod requests;

pub use append::{Append, AppendConfig, AppendInput, AppendNotice};
pub use place::{Offered, Place};
pub use read::{Batch, Cursor, ReadFrom, Reader, ReaderConfig, ReaderInput, ReaderNotice, PAGE};

use crate::rpc::{Revision, RpcError};
use std::fmt;

/// Width of an entry key's sequence number: the digits of `u64::MAX`, so
/// every sequence number fits and key order equals numeric order.
const SEQ_DIGITS: usize = 20;

/// The etcd keys of one stream.
///
/// `root` and `name` are used as given: the caller validates them. `name`
/// must not contain `/`, or one stream's entry prefix could cover another
/// stream's keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct StreamKeys {
    head: Vec<u8>,
    entries: Vec<u8>,
}

impl StreamKeys {
    /// The keys of stream `name` under `root` (no trailing `/`).
    pub fn new(root: &str, name: &str) -> Self {
        StreamKeys {
            head: format!("{root}/stream/{name}/head").into_bytes(),
            entries: format!("{root}/stream/{name}/e/").into_bytes(),
        }
    }

    /// The head key: the last sequence number handed out.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// The prefix every entry key starts with.
    pub fn entry_prefix(&self) -> &[u8] {
        &self.entries
    }

    /// The key of entry `seq`.
    pub fn entry_key(&self, seq: u64) -> Vec<u8> {
        let mut key = self.entries.clone();
        key.extend_from_slice(format!("{seq:0width$}", width = SEQ_DIGITS).as_bytes());
        key
    }

    /// The sequence number of entry key `key`; `None` for any key that is
    /// not exactly the entry prefix plus 20 decimal digits within `u64`.
    pub fn entry_seq(&self, key: &[u8]) -> Option<u64> {
        let digits = key.strip_prefix(self.entries.as_slice())?;
        if digits.len() != SEQ_DIGITS {
            return None;
        }
        parse_seq(digits)
    }
}

/// Parses a sequence number as written in the head key: ASCII decimal
/// digits only (no sign, no spaces), within `u64`. `None` for anything else,
/// so garbage written by hand is reported, never trusted.
pub fn parse_seq(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// The head as read from etcd: the last sequence number and the head key's
/// mod revision, which guards the next append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Head {
    /// Last sequence number handed out; 0 for a new stream.
    pub seq: u64,
    /// Mod revision of the head key; 0 when it does not exist (etcd
    /// compares a missing key's mod revision as 0).
    pub mod_revision: Revision,
}

/// One stream entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
pub struct Entry {
    /// Its sequence number (its ID).
    pub seq: u64,
    /// The appended bytes, unchanged.
    pub payload: Vec<u8>,
}

/// Why an append or a read failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamError {
    /// Every attempt lost the race for the head to another appender; nothing
    /// was written.
    Contended {
        /// Transactions tried (all lost).
        attempts: u32,
    },
    /// The head key holds something that is not a sequence number; nothing
    /// was written.
    BadHead {
        /// What it holds.
        value: Vec<u8>,
    },
    /// The head is at `u64::MAX`: no sequence number is left; nothing was
    /// written.
    Exhausted,
    /// A request failed and nothing was written (a read failed, or etcd
    /// refused the transaction). Safe to retry.
    Rpc(RpcError),
    /// The append's outcome is unknown: its transaction failed in flight
    /// and could not be settled before the patience ran out (every resend
    /// failed too, or the entry that would tell was trimmed), or the machine
    /// was stopped while a transaction was in flight. If the payload was
    /// stored, it is entry `seq` and nowhere else.
    Indeterminate {
        /// The only sequence number the append can have been stored under.
        seq: u64,
        /// The last failure.
        error: RpcError,
    },
    /// etcd answered with something that does not fit the request (a driver
    /// bug). For an append transaction, whether it was applied is unknown.
    Unexpected(String),
    /// The machine was stopped before the request that would write was
    /// sent; nothing was written.
    Stopped,
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Contended { attempts } => {
                write!(f, "append lost {attempts} races in a row")
            }
            StreamError::BadHead { value } => write!(
                f,
                "stream head holds {:?}, not a sequence number",
                String::from_utf8_lossy(value)
            ),
            StreamError::Exhausted => write!(f, "stream sequence numbers are exhausted"),
            StreamError::Rpc(e) => write!(f, "{e}"),
            StreamError::Indeterminate { seq, error } => write!(
                f,
                "{error} (the append may or may not have been applied; if it was, it is entry {seq})"
            ),
            StreamError::Unexpected(what) => write!(f, "unexpected answer from etcd: {what}"),
            StreamError::Stopped => write!(f, "stopped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_are_twenty_digits_and_parse_back_strictly() {
        let keys = StreamKeys::new("/coord", "jobs");
        assert_eq!(keys.head(), b"/coord/stream/jobs/head");
        assert_eq!(keys.entry_prefix(), b"/coord/stream/jobs/e/");
        assert_eq!(
            keys.entry_key(42),
            b"/coord/stream/jobs/e/00000000000000000042".to_vec()
        );
        for seq in [0, 1, 42, u64::MAX] {
            assert_eq!(keys.entry_seq(&keys.entry_key(seq)), Some(seq));
        }
        assert!(
            keys.entry_key(9) < keys.entry_key(10),
            "key order = seq order"
        );
        let bad: [&[u8]; 6] = [
            b"/coord/stream/jobs/e/42",
            b"/coord/stream/jobs/e/99999999999999999999",
            b"/coord/stream/jobs/e/0000000000000000004x",
            b"/coord/stream/jobs/e/+0000000000000000042",
            b"/coord/stream/jobs/e/000000000000000000042",
            b"/coord/stream/other/e/00000000000000000042",
        ];
        for key in bad {
            assert_eq!(
                keys.entry_seq(key),
                None,
                "{}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn head_values_parse_only_as_plain_decimal() {
        assert_eq!(parse_seq(b"0"), Some(0));
        assert_eq!(parse_seq(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"18446744073709551616",
            b"+1",
            b"-1",
            b" 1",
            b"1\n",
            b"x",
        ] {
            assert_eq!(parse_seq(bad), None, "{bad:?}");
        }
    }
}
