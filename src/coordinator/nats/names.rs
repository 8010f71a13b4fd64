//! fleetcoord names and keys as NATS subjects, KV keys and stream names.
//!
//! fleetcoord accepts any single segment of up to 255 bytes: spaces, `*`,
//! `>`, `.`, non-ASCII. NATS does not: a `.` splits a subject into tokens,
//! `*`/`>` inside a published subject are taken literally while the server
//! silently drops publishes to `a..b` (BACKEND-NOTES, "Core subjects"), KV
//! keys must match `[-/_=.a-zA-Z0-9]+` and bucket names `[a-zA-Z0-9_-]+`
//! ("Key and subject alphabets").
//!
//! One reversible encoding, [`token`], serves them all: ASCII letters,
//! digits and `-` stand for themselves, every other byte (`_` included) is
//! `_` plus two upper-case hex digits. Its alphabet `[A-Za-z0-9_-]` is a
//! subset of every alphabet above, the result is never empty and never
//! contains `.`, and decoding is unambiguous because a literal `_` is
//! always escaped.
//!
//! Stream and bucket names become JetStream stream names, which
//! nats-server 2.9.10 caps at 255 characters (measured: 255 is created,
//! 256 fails with error 10052 "stream name is too long, maximum allowed is
//! 255"; `tests/nats_names.rs` uses names at that bound). A token can
//! be 765 characters (255 escaped bytes), so a name whose token does not
//! fit keeps a readable head and ends in `__` plus 32 hex digits of the
//! SHA-256 of the whole name. `__` never occurs in a token (a literal `_`
//! is `_5F`), so after the prefix a shortened name contains `__` and a
//! full one does not: they never equal each other; two shortened
//! names collide only if their 128-bit hashes do.

use sha2::{Digest, Sha256};

/// The longest JetStream stream name used (see the module docs).
pub(crate) const MAX_STREAM_NAME: usize = 255;

/// Prefix of the JetStream stream behind a coordinator stream.
const STREAM_PREFIX: &str = "COORD_S_";
/// Prefix JetStream KV gives a bucket's stream.
const KV_STREAM_PREFIX: &str = "KV_";

/// Hex digits of the hash that ends a shortened name (128 bits).
const HASH_HEX: usize = 32;

/// `bytes` encoded into `[A-Za-z0-9_-]` (see the module docs).
pub(crate) fn token(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push('_');
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b & 0x0F));
        }
    }
    out
}

fn hex_digit(nibble: u8) -> char {
    char::from(b"0123456789ABCDEF"[usize::from(nibble & 0x0F)])
}

/// The name [`token`] encoded; `None` for text no token decodes from
/// (a foreign key in a bucket).
pub(crate) fn decode_token(token: &str) -> Option<String> {
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'_' {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            let decoded = (hi << 4) | lo;
            // Letters, digits and '-' are never escaped: an escaped one
            // is not something `token` wrote.
            if decoded.is_ascii_alphanumeric() || decoded == b'-' {
                return None;
            }
            out.push(decoded);
            i += 3;
        } else if b.is_ascii_alphanumeric() || b == b'-' {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// `prefix` + [`token`] of `name`, shortened to [`MAX_STREAM_NAME`] with a
/// hash when it does not fit.
fn bounded(prefix: &str, name: &str) -> String {
    let full = format!("{prefix}{}", token(name));
    if full.len() <= MAX_STREAM_NAME {
        return full;
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest
        .iter()
        .take(HASH_HEX / 2)
        .flat_map(|b| [hex_digit(b >> 4), hex_digit(b & 0x0F)])
        .collect::<String>()
        .to_ascii_lowercase();
    // Cut at a character boundary of the token, never inside an escape:
    // hex digits are never `_`, so an escape starts one or two bytes back.
    let bytes = full.as_bytes();
    let mut cut = MAX_STREAM_NAME - 2 - HASH_HEX;
    if bytes.get(cut - 1) == Some(&b'_') {
        cut -= 1;
    } else if bytes.get(cut - 2) == Some(&b'_') {
        cut -= 2;
    }
    format!("{}__{hash}", &full[..cut])
}

/// The subject a topic is published on.
pub(crate) fn topic_subject(topic: &str) -> String {
    format!("coord.topic.{}", token(topic))
}

/// The JetStream stream behind coordinator stream `stream`.
pub(crate) fn stream_name(stream: &str) -> String {
    bounded(STREAM_PREFIX, stream)
}

/// The one subject of that stream. Subjects have no length limit short of
/// the control line (4 KiB), so the full token keeps it unique.
pub(crate) fn stream_subject(stream: &str) -> String {
    format!("coord.stream.{}", token(stream))
}

/// The KV bucket name of `bucket`; its stream is `KV_<name>`.
pub(crate) fn bucket_name(bucket: &str) -> String {
    let name = bounded(KV_STREAM_PREFIX, bucket);
    name[KV_STREAM_PREFIX.len()..].to_owned()
}

/// The stream behind a bucket name from [`bucket_name`].
pub(crate) fn bucket_stream(bucket_name: &str) -> String {
    format!("{KV_STREAM_PREFIX}{bucket_name}")
}

/// The subject a KV key of a bucket is stored under.
pub(crate) fn key_subject(bucket_name: &str, key: &str) -> String {
    format!("$KV.{bucket_name}.{}", token(key))
}

/// The key of a subject from [`key_subject`], if it is one.
pub(crate) fn subject_key(bucket_name: &str, subject: &str) -> Option<String> {
    let rest = subject.strip_prefix("$KV.")?.strip_prefix(bucket_name)?;
    decode_token(rest.strip_prefix('.')?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn alphabet_ok(s: &str) -> bool {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }

    #[test]
    fn examples() {
        assert_eq!(token("deploys"), "deploys");
        assert_eq!(token("a.b"), "a_2Eb");
        assert_eq!(token("a_b"), "a_5Fb");
        assert_eq!(token("a b*>"), "a_20b_2A_3E");
        assert_eq!(token("é"), "_C3_A9");
        assert_eq!(decode_token("a_2Eb").as_deref(), Some("a.b"));
        assert_eq!(
            subject_key("b1", &key_subject("b1", "app.one")).as_deref(),
            Some("app.one")
        );
    }

    #[test]
    fn foreign_tokens_do_not_decode() {
        for bad in ["a.b", "a_", "a_4", "a_zz", "_41", "a b", "a_2e"] {
            assert_eq!(decode_token(bad), None, "{bad}");
        }
        assert_eq!(subject_key("b1", "$KV.b2.k"), None);
        assert_eq!(subject_key("b1", "$KV.b1x.k"), None);
    }

    #[test]
    fn every_suite_name_works() {
        let long = "é".repeat(127);
        for name in ["x", "a b", "*", ">", ".", "a..b", "ünï", long.as_str()] {
            for encoded in [stream_name(name), bucket_name(name)] {
                assert!(alphabet_ok(&encoded), "{name:?} -> {encoded:?}");
                assert!(encoded.len() <= MAX_STREAM_NAME);
            }
            assert!(bucket_stream(&bucket_name(name)).len() <= MAX_STREAM_NAME);
            assert_eq!(decode_token(&token(name)).as_deref(), Some(name));
        }
    }

    #[test]
    fn long_names_are_shortened_distinctly() {
        let a = "x".repeat(255);
        let mut b = "x".repeat(254);
        b.push('y');
        let (sa, sb) = (stream_name(&a), stream_name(&b));
        assert_ne!(sa, sb);
        assert_eq!(sa.len(), MAX_STREAM_NAME);
        assert!(sa.contains("__"));
        // A name whose token fits is never shortened, so never contains "__".
        assert!(!stream_name(&"x".repeat(200)).contains("__"));
        // Escapes are never cut in half.
        let escaped = ".".repeat(255);
        let s = stream_name(&escaped);
        let (head, _) = s.rsplit_once("__").unwrap();
        assert!(decode_token(&head[STREAM_PREFIX.len()..]).is_some(), "{s}");
    }

    proptest! {
        #[test]
        fn round_trip_and_alphabet(name in "\\PC{1,80}") {
            let t = token(&name);
            prop_assert!(alphabet_ok(&t));
            prop_assert!(!t.contains('.'));
            prop_assert_eq!(decode_token(&t), Some(name));
        }

        #[test]
        fn no_collisions(a in "\\PC{1,40}", b in "\\PC{1,40}") {
            prop_assume!(a != b);
            prop_assert_ne!(token(&a), token(&b));
            prop_assert_ne!(stream_name(&a), stream_name(&b));
            prop_assert_ne!(bucket_name(&a), bucket_name(&b));
        }

        #[test]
        fn bounded_names_fit(name in "\\PC{100,255}") {
            // `\PC` counts characters; keep to at most 255 bytes.
            let name: String = name.chars().scan(0usize, |n, c| {
                *n += c.len_utf8();
                (*n <= 255).then_some(c)
            }).collect();
            let s = stream_name(&name);
            prop_assert!(s.len() <= MAX_STREAM_NAME);
            prop_assert!(alphabet_ok(&s));
        }
    }
}
