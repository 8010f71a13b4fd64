//! Which keys under a watched prefix are acceptable.

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
    /// hyphenated UUID (`8-4-4-4-12` hex digits) and nothing else.
    HostId,
}

impl KeyRule {
    /// Whether `suffix` (the key with the watched prefix removed) satisfies
    /// the rule.
    pub fn accepts(&self, suffix: &[u8]) -> bool {
        match self {
            KeyRule::Any => true,
            KeyRule::HostId => is_canonical_uuid(suffix),
        }
    }
}

/// Only one spelling per id is accepted, so one host can never appear under
/// two keys (upper- and lowercase) and be counted twice.
fn is_canonical_uuid(s: &[u8]) -> bool {
    s.len() == 36
        && s.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
        })
}

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
}
