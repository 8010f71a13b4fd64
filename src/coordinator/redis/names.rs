//! The key layout: which Redis keys and channels hold a bucket, a stream, a
//! topic. Every name is escaped into a hash tag, so one name's keys always
//! share a cluster slot and no name can reach into another's keys.
//!
//! Escaping: bytes outside `[A-Za-z0-9._-]` become `%XX` (uppercase hex),
//! `%` included. The result never contains `{`, `}` or `:` (so the first
//! `{…}` of a key is exactly the escaped name, Redis' hash-tag rule), is
//! never empty for a valid (non-empty) name (an empty tag `{}` would hash the
//! whole key instead), and decodes back to the name: two names never share
//! a key.

use crate::coordinator::escape::{self, Alphabet};

/// The hash of a KV bucket: field = key, value = value.
pub(crate) fn kv_hash(bucket: &str) -> String {
    format!("coord:kv:{{{}}}", escape(bucket))
}

/// The channel a bucket's writes are announced on.
pub(crate) fn kv_channel(bucket: &str) -> String {
    format!("coord:kvn:{{{}}}", escape(bucket))
}

/// The bucket's version: incremented by every write that changes it.
pub(crate) fn kv_version(bucket: &str) -> String {
    format!("coord:kvv:{{{}}}", escape(bucket))
}

/// Each key's revision: field = key, value = the bucket version of the
/// write that set it.
pub(crate) fn kv_revisions(bucket: &str) -> String {
    format!("coord:kvr:{{{}}}", escape(bucket))
}

/// The deadlines of keys set with a TTL: member = key, score = the
/// server's clock in milliseconds when it expires.
pub(crate) fn kv_expiries(bucket: &str) -> String {
    format!("coord:kvx:{{{}}}", escape(bucket))
}

/// The token of each key's last conditional write: field = key, so that a
/// conditional write sent again after a lost answer recognises itself.
pub(crate) fn kv_tokens(bucket: &str) -> String {
    format!("coord:kvw:{{{}}}", escape(bucket))
}

/// The Redis stream holding a stream's entries.
pub(crate) fn stream_key(stream: &str) -> String {
    format!("coord:stream:{{{}}}", escape(stream))
}

/// The epoch of a stream: a token set by the first append of the stream's
/// life and stored in every entry, so a reader can tell a recreated stream.
pub(crate) fn stream_epoch(stream: &str) -> String {
    format!("coord:streame:{{{}}}", escape(stream))
}

/// The recent append tokens of a stream (hash token -> entry id), so a
/// retried append returns the entry its first attempt stored.
pub(crate) fn stream_tokens(stream: &str) -> String {
    format!("coord:streamt:{{{}}}", escape(stream))
}

/// The same tokens in append order (a list), to forget the oldest.
pub(crate) fn stream_token_order(stream: &str) -> String {
    format!("coord:streamto:{{{}}}", escape(stream))
}

/// The channel of a pub/sub topic.
pub(crate) fn topic_channel(topic: &str) -> String {
    format!("coord:topic:{{{}}}", escape(topic))
}

/// Redis keys and channels take any bytes, but `{`, `}` and `:` shape
/// them (hash tags, the `coord:` layout), so only `[A-Za-z0-9._-]` is
/// plain; `%` escapes.
const ALPHABET: Alphabet = Alphabet {
    escape: b'%',
    plain: |b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'),
};

/// `name` with every byte outside `[A-Za-z0-9._-]` as `%XX`.
pub(crate) fn escape(name: &str) -> String {
    escape::encode(&ALPHABET, name)
}

/// The name [`escape`] made `escaped` from; `None` for text it cannot
/// have made.
#[cfg(test)]
pub(crate) fn unescape(escaped: &str) -> Option<String> {
    escape::decode(&ALPHABET, escaped)
}

/// The part of `key` Redis Cluster hashes to pick its slot: the text
/// between the first `{` and the next `}` when non-empty, else the key.
#[cfg(test)]
pub(crate) fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const AWKWARD: &[&str] = &[
        "plain",
        "a{b}",
        "{",
        "}",
        "{}",
        "}{",
        "a:b",
        "coord:kv:{x}",
        "%",
        "%7B",
        "%%",
        "sp ace",
        "ünï",
        "日本",
        "a\u{7f}b",
        "x.y_z-0",
        "*?[]",
        "\\",
    ];

    #[test]
    fn round_trip() {
        for name in AWKWARD {
            let e = escape(name);
            assert_eq!(unescape(&e).as_deref(), Some(*name), "{name:?} -> {e:?}");
        }
    }

    #[test]
    fn no_collisions() {
        let mut seen = HashMap::new();
        for name in AWKWARD {
            if let Some(other) = seen.insert(escape(name), *name) {
                panic!("{name:?} and {other:?} escape alike");
            }
        }
        // Exhaustively over all two-character names from an alphabet that
        // mixes plain, escaped and escape-looking characters.
        let alphabet = ['a', 'A', '%', '7', 'B', '{', '}', ':', 'é'];
        let mut seen = HashMap::new();
        for x in alphabet {
            for y in alphabet {
                let name: String = [x, y].iter().collect();
                if let Some(other) = seen.insert(escape(&name), name.clone()) {
                    panic!("{name:?} and {other:?} escape alike");
                }
            }
        }
    }

    #[test]
    fn escaped_names_are_safe_tags() {
        for name in AWKWARD {
            let e = escape(name);
            assert!(!e.is_empty());
            assert!(!e.contains(['{', '}', ':']), "{e:?}");
        }
    }

    #[test]
    fn hash_tag_is_exactly_the_escaped_name() {
        for name in AWKWARD {
            let e = escape(name);
            for key in [
                kv_hash(name),
                kv_channel(name),
                kv_version(name),
                stream_key(name),
                stream_epoch(name),
                stream_tokens(name),
                stream_token_order(name),
                topic_channel(name),
            ] {
                assert_eq!(hash_tag(&key), e, "{key:?}");
            }
        }
        assert_eq!(kv_hash("a{b}"), "coord:kv:{a%7Bb%7D}");
        assert_eq!(kv_channel("cfg"), "coord:kvn:{cfg}");
        assert_eq!(kv_version("cfg"), "coord:kvv:{cfg}");
    }

    #[test]
    fn foreign_text_does_not_unescape() {
        for bad in ["%", "%4", "%zz", "%7b", "%41", "a{b", "a b"] {
            assert_eq!(unescape(bad), None, "{bad:?}");
        }
    }
}
