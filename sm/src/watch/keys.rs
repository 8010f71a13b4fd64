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
            KeyRule::HostId => parse_host_id(suffix).is_some(),
        }
    }
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
