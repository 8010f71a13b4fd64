//! Which keys under a watched prefix are acceptable, and which of them are
//! leave markers.
//!
//! Host key layout (under the hosts prefix, [`KeyRule::HostId`]):
//!
//! * `<prefix><host id>` — the host's key: its metadata, bound to its lease.
//! * `<prefix><host id>/left` — its *leave marker*
//!   ([`leave_marker_key`]), written with an empty value on the host's
//!   lease by a graceful close just before the lease is revoked. The revoke
//!   deletes both keys at one revision, which is how a watcher tells a leave
//!   from an expiry (see the [watch module](super)); a close that dies
//!   after writing the marker still leaves nothing behind, since the marker
//!   expires with the lease.
//! * `<prefix><host id>/incarnation` — its *incarnation key*
//!   ([`incarnation_key`]): which process of the registration wrote the
//!   host key (decimal, 1 for a fresh registration, one more per resumed
//!   restart), put on the host's lease in the same transaction as every
//!   write of the host key, so both carry one mod revision and die with
//!   the lease; only by hosts that publish it (fleetcoord's
//!   `LivenessOptions::publish_incarnation`, off by default, so that the
//!   prefix holds one key per host). Never reported as a key, never
//!   invalid.

/// What the part of a key after the watched prefix must look like.
///
/// Keys that fail the rule are reported once as
/// [`WatchNotice::InvalidKey`](super::WatchNotice::InvalidKey) and otherwise
/// ignored, so a stray key written by hand can never crash a watcher or reach
/// a consumer that expects host ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "fuzzing", derive(arbitrary::Arbitrary))]
#[non_exhaustive]
pub enum KeyRule {
    /// Every key under the prefix is accepted (KV watch, election observe).
    #[default]
    Any,
    /// The rest of the key must be a canonical host id: a lowercase,
    /// hyphenated UUID (`8-4-4-4-12` hex digits) and nothing else — or
    /// such an id followed by [`LEAVE_MARKER_SUFFIX`], which is that host's
    /// leave marker: never reported as a key, never invalid.
    HostId,
}

/// What follows a host's key in its leave marker's key.
pub const LEAVE_MARKER_SUFFIX: &[u8] = b"/left";

/// The leave marker key of the host whose key is `host_key`:
/// `<host_key>/left`.
pub fn leave_marker_key(host_key: &[u8]) -> Vec<u8> {
    let mut key = host_key.to_vec();
    key.extend_from_slice(LEAVE_MARKER_SUFFIX);
    key
}

/// What follows a host's key in its incarnation key's key.
pub const INCARNATION_SUFFIX: &[u8] = b"/incarnation";

/// The incarnation key of the host whose key is `host_key`:
/// `<host_key>/incarnation`.
pub fn incarnation_key(host_key: &[u8]) -> Vec<u8> {
    let mut key = host_key.to_vec();
    key.extend_from_slice(INCARNATION_SUFFIX);
    key
}

/// The host id whose incarnation key `suffix` (a key with the hosts prefix
/// removed) is: `Some` exactly for `<canonical host id>/incarnation`.
pub fn parse_incarnation_key(suffix: &[u8]) -> Option<[u8; 16]> {
    parse_host_id(suffix.strip_suffix(INCARNATION_SUFFIX)?)
}

/// What a key under the watched prefix is, by a [`KeyRule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyClass {
    /// A key the consumer is told about.
    Entry,
    /// The leave marker of the entry whose key is this one without the last
    /// `marker_len` bytes ([`LEAVE_MARKER_SUFFIX`]).
    LeaveMarker {
        /// How many trailing bytes make this key a marker.
        marker_len: usize,
    },
    /// A host's incarnation key ([`incarnation_key`]): neither reported
    /// nor invalid (only under [`KeyRule::HostId`]).
    Incarnation,
    /// None of these: reported once, then ignored.
    Invalid,
}

impl KeyRule {
    /// Whether `suffix` (the key with the watched prefix removed) satisfies
    /// the rule.
    pub fn accepts(&self, suffix: &[u8]) -> bool {
        match self {
            KeyRule::Any => true,
            KeyRule::HostId => parse_host_id(suffix).is_some(),
        }
    }

    /// What `suffix` (the key with the watched prefix removed) is: an entry
    /// exactly when [`KeyRule::accepts`] says so; a leave marker when it is
    /// an accepted host id followed by [`LEAVE_MARKER_SUFFIX`] (only under
    /// [`KeyRule::HostId`]: under [`KeyRule::Any`] every key is an entry).
    pub fn classify(&self, suffix: &[u8]) -> KeyClass {
        if self.accepts(suffix) {
            return KeyClass::Entry;
        }
        match self {
            KeyRule::HostId if parse_leave_marker(suffix).is_some() => KeyClass::LeaveMarker {
                marker_len: LEAVE_MARKER_SUFFIX.len(),
            },
            KeyRule::HostId if parse_incarnation_key(suffix).is_some() => KeyClass::Incarnation,
            _ => KeyClass::Invalid,
        }
    }
}

/// The host id whose leave marker `suffix` (a key with the hosts prefix
/// removed) is: `Some` exactly for `<canonical host id>/left`. A listing of
/// the hosts skips these keys, as the watch does.
pub fn parse_leave_marker(suffix: &[u8]) -> Option<[u8; 16]> {
    parse_host_id(suffix.strip_suffix(LEAVE_MARKER_SUFFIX)?)
}

/// The host id a key names, given the key with the hosts prefix removed:
/// the 16 bytes of the UUID when `suffix` is its canonical spelling
/// (lowercase, hyphenated `8-4-4-4-12` hex digits, nothing else), `None`
/// for anything else.
///
/// The one rule for host keys: [`KeyRule::HostId`] is this function, and a
/// one-shot listing of the hosts must use it too, so that a listing and a
/// watch agree on which keys are hosts. Only one spelling per id is
/// accepted, so one host can never appear under two keys (`3f2c…` beside
/// `3f2c1d4e-…`, or upper- beside lowercase) and be counted twice.
pub fn parse_host_id(suffix: &[u8]) -> Option<[u8; 16]> {
    // Every key of every snapshot page goes through here (twice: the
    // machine's key rule and the watcher's id), so this is a table lookup
    // per digit rather than a match per byte.
    let s: &[u8; 36] = suffix.try_into().ok()?;
    if s[8] != b'-' || s[13] != b'-' || s[18] != b'-' || s[23] != b'-' {
        return None;
    }
    let mut id = [0u8; 16];
    // Any byte that is not a lowercase hex digit reads as 0xff, whose high
    // bits survive the `|` below.
    let mut invalid = 0u8;
    for (byte, at) in id.iter_mut().zip(DIGIT_PAIRS) {
        let (hi, lo) = (HEX[usize::from(s[at])], HEX[usize::from(s[at + 1])]);
        invalid |= hi | lo;
        *byte = ((hi & 0x0f) << 4) | (lo & 0x0f);
    }
    (invalid & 0xf0 == 0).then_some(id)
}

/// Where each byte's two hex digits start in a canonical UUID spelling
/// (`8-4-4-4-12`, dashes at 8, 13, 18 and 23).
const DIGIT_PAIRS: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];

/// The value of each lowercase hex digit, 0xff for every other byte.
const HEX: [u8; 256] = {
    let mut table = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_id_accepts_only_canonical_lowercase_uuids() {
        let rule = KeyRule::HostId;
        assert!(rule.accepts(b"0f8fad5b-d9cb-469f-a165-70867728950e"));
        assert!(!rule.accepts(b"0F8FAD5B-D9CB-469F-A165-70867728950E"));
        assert!(!rule.accepts(b"0f8fad5bd9cb469fa16570867728950e"));
        assert!(!rule.accepts(b"0f8fad5b-d9cb-469f-a165-70867728950e/x"));
        assert!(!rule.accepts(b"0f8fad5b-d9cb-469f-a165-70867728950"));
        assert!(!rule.accepts(b"0f8fad5b-d9cb-469f-a165_70867728950e"));
        assert!(!rule.accepts(b"0g8fad5b-d9cb-469f-a165-70867728950e"));
        assert!(!rule.accepts(b""));
        assert!(KeyRule::Any.accepts(b""));
        assert!(KeyRule::Any.accepts(b"anything/at all"));
    }

    #[test]
    fn a_leave_marker_is_a_host_id_and_left_only_under_host_id() {
        let id = b"0f8fad5b-d9cb-469f-a165-70867728950e";
        let marker = [&id[..], LEAVE_MARKER_SUFFIX].concat();
        assert_eq!(leave_marker_key(id), marker);
        assert_eq!(KeyRule::HostId.classify(id), KeyClass::Entry);
        assert_eq!(
            KeyRule::HostId.classify(&marker),
            KeyClass::LeaveMarker { marker_len: 5 }
        );
        assert!(!KeyRule::HostId.accepts(&marker));
        assert_eq!(parse_leave_marker(&marker), parse_host_id(id));
        assert_eq!(KeyRule::Any.classify(&marker), KeyClass::Entry);
        for other in [
            &b"0f8fad5b-d9cb-469f-a165-70867728950e/left/left"[..],
            b"0f8fad5b-d9cb-469f-a165-70867728950e/lefT",
            b"0F8FAD5B-D9CB-469F-A165-70867728950E/left",
            b"/left",
            b"0f8fad5b-d9cb-469f-a165-70867728950e/",
        ] {
            assert_eq!(KeyRule::HostId.classify(other), KeyClass::Invalid);
            assert_eq!(parse_leave_marker(other), None);
        }
    }

    #[test]
    fn an_incarnation_key_is_neither_a_host_nor_invalid_under_host_id() {
        let id = b"0f8fad5b-d9cb-469f-a165-70867728950e";
        let key = incarnation_key(id);
        assert_eq!(key, [&id[..], b"/incarnation"].concat());
        assert_eq!(KeyRule::HostId.classify(&key), KeyClass::Incarnation);
        assert!(!KeyRule::HostId.accepts(&key));
        assert_eq!(parse_incarnation_key(&key), parse_host_id(id));
        assert_eq!(parse_leave_marker(&key), None);
        assert_eq!(KeyRule::Any.classify(&key), KeyClass::Entry);
        for other in [
            &b"0f8fad5b-d9cb-469f-a165-70867728950e/incarnation/left"[..],
            b"0f8fad5b-d9cb-469f-a165-70867728950e/Incarnation",
            b"0F8FAD5B-D9CB-469F-A165-70867728950E/incarnation",
            b"/incarnation",
        ] {
            assert_eq!(KeyRule::HostId.classify(other), KeyClass::Invalid);
            assert_eq!(parse_incarnation_key(other), None);
        }
    }

    /// The rule spelled out byte by byte, to hold the table-driven parser
    /// to.
    fn reference(suffix: &[u8]) -> Option<[u8; 16]> {
        if suffix.len() != 36 {
            return None;
        }
        let mut id = [0u8; 16];
        let mut digits = 0;
        for (i, &c) in suffix.iter().enumerate() {
            let nibble = match (i, c) {
                (8 | 13 | 18 | 23, b'-') => continue,
                (8 | 13 | 18 | 23, _) => return None,
                (_, b'0'..=b'9') => c - b'0',
                (_, b'a'..=b'f') => c - b'a' + 10,
                _ => return None,
            };
            id[digits / 2] |= nibble << if digits % 2 == 0 { 4 } else { 0 };
            digits += 1;
        }
        Some(id)
    }

    #[test]
    fn parse_host_id_agrees_with_the_rule_for_every_byte_at_every_position() {
        let valid = *b"0f8fad5b-d9cb-469f-a165-70867728950e";
        for at in 0..valid.len() {
            for byte in 0..=255u8 {
                let mut key = valid;
                key[at] = byte;
                assert_eq!(parse_host_id(&key), reference(&key), "{at}: {byte}");
            }
        }
        // Every digit in every place.
        let key = *b"01234567-89ab-cdef-0123-456789abcdef";
        assert_eq!(parse_host_id(&key), reference(&key));
        assert!(parse_host_id(&key).is_some());
        assert_eq!(parse_host_id(&valid[..35]), None);
        assert_eq!(parse_host_id(&[&valid[..], b"0"].concat()), None);
    }

    #[test]
    fn parse_host_id_reads_the_canonical_spelling_only() {
        assert_eq!(
            parse_host_id(b"00112233-4455-6677-8899-aabbccddeeff"),
            Some([
                0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
                0xee, 0xff
            ])
        );
        for other in [
            &b"3f2c1d4e5a6b4c7d8e9f0a1b2c3d4e5f"[..],
            b"3F2C1D4E-5A6B-4C7D-8E9F-0A1B2C3D4E5F",
            b"{3f2c1d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f}",
            b"urn:uuid:3f2c1d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f",
            b"3f2c1d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f ",
            b"3f2c1d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5",
            b"3f2c1d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5-",
            b"3f2c1d4e+5a6b-4c7d-8e9f-0a1b2c3d4e5f",
        ] {
            assert_eq!(
                parse_host_id(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }
}
