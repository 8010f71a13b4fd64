//! fleetcoord names and keys as NATS subjects, KV keys and stream names.
//!
//! fleetcoord accepts any single segment of up to 255 bytes: spaces, `*`,
//! `>`, `.`, non-ASCII. NATS does not: a `.` splits a subject into tokens,
//! `*`/`>` inside a published subject are taken literally while the server
//! silently drops publishes to `a..b`, KV keys must match
//! `[-/_=.a-zA-Z0-9]+` and bucket names `[a-zA-Z0-9_-]+` (docs/backend-notes.md,
//! "Core subjects", "Key and subject alphabets").
//!
//! # Topics, streams and buckets: [`token`]
//!
//! One reversible encoding, [`token`], serves every name that becomes
//! part of a subject or a stream name: ASCII letters, digits and `-` stand
//! for themselves, every other byte (`_` included) is `_` plus two
//! upper-case hex digits. Its alphabet `[A-Za-z0-9_-]` is a subset of
//! every alphabet above, the result is never empty and never contains
//! `.`, and decoding is unambiguous because a literal `_` is always
//! escaped.
//!
//! # KV keys: [`kv_key`] and [`decode_kv_key`]
//!
//! KV keys are what other NATS clients (`nats kv get`, async-nats,
//! nats.go) name entries by, so under [`NatsKeyEncoding::Nats`] (the
//! default) a key is stored as it is whenever NATS can store it, and only
//! other keys are escaped. A *plain* key is one that
//!
//! * is not empty and consists only of `[-/_=.A-Za-z0-9]` (async-nats'
//!   and nats.go's key alphabet),
//! * neither starts nor ends with `.`, and contains no `..` (an empty
//!   subject token: the clients refuse the first two, the server drops
//!   publishes to the third),
//! * and does not start with [`KEY_MARKER`] (`=`).
//!
//! The invariant, checked exhaustively by the tests below:
//!
//! * **write**: a plain key is stored as it is; every other key is stored
//!   as `=` followed by its [`token`]. The result is always a valid NATS
//!   key (the token alphabet has no `.`, and `=` is no `.`).
//! * **read**: a stored key that is plain is that key; one that starts
//!   with `=` is the key whose token follows, provided that decodes and
//!   the key it decodes to is neither plain nor empty; anything else
//!   (`=`, `=abc`, `=_zz`, a raw subject outside the alphabet such as `é`)
//!   decodes to nothing, and the watch logs it (once per key) and skips it.
//! * so `decode_kv_key(kv_key(k)) == k` for every (non-empty) key, and
//!   `kv_key(decode_kv_key(s)) == s` whenever `s` decodes: two fleetcoord
//!   keys never share an entry, and two entries never show as one key.
//!   Plain keys cannot collide with escaped ones because no plain key
//!   starts with `=`, which is why a plain-alphabet key that starts with
//!   `=` (`=x`) is stored escaped (`=_3Dx`).
//!
//! A key another client stored that fleetcoord itself would refuse to
//! write (one with `/`, or longer than 255 bytes) is still plain, so a
//! watch reports it as it is.
//!
//! [`NatsKeyEncoding::Legacy`] keeps the encoding fleetcoord used before:
//! every key stored as its [`token`], read back with [`decode_token`], so
//! a deployment whose buckets were written that way reads them unchanged.
//!
//! # Long stream and bucket names
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

use super::NatsKeyEncoding;
use crate::coordinator::escape::{self, hex_digit, Alphabet};
use sha2::{Digest, Sha256};
use std::collections::HashSet;

/// The longest JetStream stream name used (see the module docs).
pub(crate) const MAX_STREAM_NAME: usize = 255;

/// Prefix of the JetStream stream behind a coordinator stream.
const STREAM_PREFIX: &str = "COORD_S_";
/// Prefix JetStream KV gives a bucket's stream.
const KV_STREAM_PREFIX: &str = "KV_";

/// Hex digits of the hash that ends a shortened name (128 bits).
const HASH_HEX: usize = 32;

/// Letters, digits and `-` are in every NATS alphabet above; `_` escapes.
const TOKEN_ALPHABET: Alphabet = Alphabet {
    escape: b'_',
    plain: |b| b.is_ascii_alphanumeric() || b == b'-',
};

/// `bytes` encoded into `[A-Za-z0-9_-]` (see the module docs).
pub(crate) fn token(name: &str) -> String {
    escape::encode(&TOKEN_ALPHABET, name)
}

/// The name [`token`] encoded; `None` for text no token decodes from
/// (a foreign key in a bucket).
pub(crate) fn decode_token(token: &str) -> Option<String> {
    escape::decode(&TOKEN_ALPHABET, token)
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

/// The first character of every escaped KV key (see the module docs).
pub(crate) const KEY_MARKER: char = '=';

/// Whether `b` is in NATS' KV key alphabet `[-/_=.A-Za-z0-9]`.
fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_' | b'=' | b'.')
}

/// Whether `key` is stored as it is under [`NatsKeyEncoding::Nats`] (the
/// module docs say why each rule is there).
pub(crate) fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && key.bytes().all(is_key_byte)
        && !key.starts_with('.')
        && !key.ends_with('.')
        && !key.contains("..")
        && !key.starts_with(KEY_MARKER)
}

/// The NATS KV key fleetcoord key `key` is stored under.
pub(crate) fn kv_key(encoding: NatsKeyEncoding, key: &str) -> String {
    match encoding {
        NatsKeyEncoding::Legacy => token(key),
        NatsKeyEncoding::Nats if is_plain_key(key) => key.to_owned(),
        NatsKeyEncoding::Nats => format!("{KEY_MARKER}{}", token(key)),
    }
}

/// The fleetcoord key stored under NATS KV key `stored`; `None` for a key
/// [`kv_key`] cannot have written.
pub(crate) fn decode_kv_key(encoding: NatsKeyEncoding, stored: &str) -> Option<String> {
    let key = match encoding {
        NatsKeyEncoding::Legacy => decode_token(stored)?,
        NatsKeyEncoding::Nats if is_plain_key(stored) => return Some(stored.to_owned()),
        NatsKeyEncoding::Nats => {
            let key = decode_token(stored.strip_prefix(KEY_MARKER)?)?;
            // A plain key is never escaped: `=abc` would otherwise be a
            // second entry showing as key `abc`.
            if is_plain_key(&key) {
                return None;
            }
            key
        }
    };
    // No key is empty: a bare `=` is no key either.
    (!key.is_empty()).then_some(key)
}

/// The subject a KV key of a bucket is stored under.
pub(crate) fn key_subject(bucket_name: &str, encoding: NatsKeyEncoding, key: &str) -> String {
    format!("$KV.{bucket_name}.{}", kv_key(encoding, key))
}

/// The key of a subject from [`key_subject`], if it is one.
pub(crate) fn subject_key(
    bucket_name: &str,
    encoding: NatsKeyEncoding,
    subject: &str,
) -> Option<String> {
    let rest = subject.strip_prefix("$KV.")?.strip_prefix(bucket_name)?;
    decode_kv_key(encoding, rest.strip_prefix('.')?)
}

/// The most undecodable keys one watch remembers having logged: a bucket
/// full of foreign entries must not grow a watch without bound.
const MAX_LOGGED: usize = 1024;

/// The subjects of one watch's bucket that decode to no key, each logged
/// once: a foreign entry is reported, not silently skipped, and a bucket
/// re-read after every reconnect does not repeat the warning.
#[derive(Default)]
pub(crate) struct Undecodable {
    logged: HashSet<String>,
    /// Whether "further ones are not logged" was said.
    silenced: bool,
}

impl Undecodable {
    /// Logs that `subject` of JetStream stream `stream` is skipped, unless
    /// it was logged before.
    pub(crate) fn skip(&mut self, stream: &str, subject: &str, encoding: NatsKeyEncoding) {
        if self.logged.contains(subject) {
            return;
        }
        if self.logged.len() >= MAX_LOGGED {
            if !self.silenced {
                self.silenced = true;
                log::warn!(
                    "fleetcoord nats: more entries of {stream} decode to no key; \
                     further ones are skipped without a warning"
                );
            }
            return;
        }
        log::warn!(
            "fleetcoord nats: skipping {subject:?} in {stream}: it decodes to no key \
             under the {encoding:?} key encoding"
        );
        self.logged.insert(subject.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

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
        for encoding in [NatsKeyEncoding::Nats, NatsKeyEncoding::Legacy] {
            assert_eq!(
                subject_key("b1", encoding, &key_subject("b1", encoding, "app.one")).as_deref(),
                Some("app.one")
            );
        }
        assert_eq!(
            key_subject("b1", NatsKeyEncoding::Nats, "app.one"),
            "$KV.b1.app.one"
        );
        assert_eq!(
            key_subject("b1", NatsKeyEncoding::Legacy, "app.one"),
            "$KV.b1.app_2Eone"
        );
    }

    #[test]
    fn foreign_tokens_do_not_decode() {
        for bad in ["a.b", "a_", "a_4", "a_zz", "_41", "a b", "a_2e"] {
            assert_eq!(decode_token(bad), None, "{bad}");
        }
        for encoding in [NatsKeyEncoding::Nats, NatsKeyEncoding::Legacy] {
            assert_eq!(subject_key("b1", encoding, "$KV.b2.k"), None);
            assert_eq!(subject_key("b1", encoding, "$KV.b1x.k"), None);
            assert_eq!(subject_key("b1", encoding, "$KV.b1"), None);
        }
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

    /// Whether NATS stores `key` as a KV key: async-nats' and nats.go's
    /// check (the alphabet, no leading or trailing `.`) plus the server's
    /// (no empty subject token).
    fn nats_accepts(key: &str) -> bool {
        !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-/_=.".contains(&b))
            && !key.starts_with('.')
            && !key.ends_with('.')
            && !key.contains("..")
    }

    /// Every string of 1 to `max` characters from `alphabet`.
    fn all_strings(alphabet: &[char], max: usize) -> Vec<String> {
        let mut all = Vec::new();
        let mut last = vec![String::new()];
        for _ in 0..max {
            let next: Vec<String> = last
                .iter()
                .flat_map(|s| {
                    alphabet.iter().map(move |c| {
                        let mut s = s.clone();
                        s.push(*c);
                        s
                    })
                })
                .collect();
            all.extend(next.iter().cloned());
            last = next;
        }
        all
    }

    #[test]
    fn kv_key_examples() {
        let nats = |k| kv_key(NatsKeyEncoding::Nats, k);
        for plain in ["svc.a_b", "a/b=c", "a=", "x-Y_9", "a.b.c", "_", "-", "/"] {
            assert_eq!(nats(plain), plain);
        }
        for (key, stored) in [
            ("=", "=_3D"),
            ("=x", "=_3Dx"),
            ("a b", "=a_20b"),
            ("*", "=_2A"),
            (">", "=_3E"),
            (".", "=_2E"),
            (".lead", "=_2Elead"),
            ("trail.", "=trail_2E"),
            ("a..b", "=a_2E_2Eb"),
            ("é", "=_C3_A9"),
            ("svc.a b", "=svc_2Ea_20b"),
        ] {
            assert_eq!(nats(key), stored, "{key:?}");
        }
        assert_eq!(kv_key(NatsKeyEncoding::Legacy, "svc.a_b"), "svc_2Ea_5Fb");
    }

    #[test]
    fn foreign_kv_keys() {
        let nats = |s| decode_kv_key(NatsKeyEncoding::Nats, s);
        // Plain keys any client writes read as they are.
        for plain in ["svc.x_y", "a/b=c", "KV_x", "_5F", "a_2Eb", "x="] {
            assert_eq!(nats(plain).as_deref(), Some(plain));
        }
        // Marked keys kv_key cannot have written, and raw subjects outside
        // the key alphabet, decode to nothing.
        for bad in [
            "=", "=abc", "=a_2Eb", "=_zz", "=_2e", "=_41", "=_", "==", "=a.b", "é", "a b", "a..b",
            ".a", "a.", "*", ">",
        ] {
            assert_eq!(nats(bad), None, "{bad:?}");
        }
        // The legacy encoding reads its own keys, not NATS ones.
        assert_eq!(
            decode_kv_key(NatsKeyEncoding::Legacy, "svc_2Ea").as_deref(),
            Some("svc.a")
        );
        assert_eq!(decode_kv_key(NatsKeyEncoding::Legacy, "svc.a"), None);
    }

    /// Characters that are plain, escaped, the marker, the token escape,
    /// hex digits and multi-byte: every rule of the encoding meets every
    /// other one in strings of up to three.
    const KEY_CHARS: &[char] = &['a', 'Z', '2', 'E', '.', '_', '=', '/', '-', ' ', '*', 'é'];

    #[test]
    fn every_short_key_round_trips_to_a_valid_distinct_nats_key() {
        for encoding in [NatsKeyEncoding::Nats, NatsKeyEncoding::Legacy] {
            let mut seen = HashMap::new();
            for key in all_strings(KEY_CHARS, 3) {
                let stored = kv_key(encoding, &key);
                assert!(nats_accepts(&stored), "{key:?} -> {stored:?}");
                assert_eq!(
                    decode_kv_key(encoding, &stored).as_deref(),
                    Some(key.as_str()),
                    "{encoding:?} {key:?} -> {stored:?}"
                );
                if let Some(other) = seen.insert(stored.clone(), key.clone()) {
                    panic!("{key:?} and {other:?} are both stored as {stored:?}");
                }
                if encoding == NatsKeyEncoding::Nats {
                    // Stored as it is exactly when NATS takes it as it is
                    // and it does not look escaped.
                    let as_is = nats_accepts(&key) && !key.starts_with(KEY_MARKER);
                    assert_eq!(stored == key, as_is, "{key:?} -> {stored:?}");
                    assert_eq!(is_plain_key(&key), as_is, "{key:?}");
                }
            }
        }
    }

    #[test]
    fn every_short_stored_key_that_decodes_is_what_kv_key_writes() {
        // Stored keys: the key alphabet, hex digits, and bytes outside it.
        let stored_chars = ['a', '2', '3', 'D', 'E', '.', '_', '=', '/', '-', ' ', 'é'];
        for encoding in [NatsKeyEncoding::Nats, NatsKeyEncoding::Legacy] {
            for stored in all_strings(&stored_chars, 4) {
                match decode_kv_key(encoding, &stored) {
                    Some(key) => assert_eq!(kv_key(encoding, &key), stored, "{encoding:?}"),
                    None => {
                        // Only escaped-looking or non-NATS keys are refused
                        // by the default encoding.
                        if encoding == NatsKeyEncoding::Nats {
                            assert!(
                                !nats_accepts(&stored) || stored.starts_with(KEY_MARKER),
                                "{stored:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn legacy_keys_read_as_their_stored_text() {
        // What a legacy handle stored is a plain key: the default encoding
        // shows it as it is (the migration in the NATS module docs relies
        // on this), never as an error.
        for key in all_strings(KEY_CHARS, 2) {
            let legacy = kv_key(NatsKeyEncoding::Legacy, &key);
            assert!(is_plain_key(&legacy), "{legacy:?}");
            assert_eq!(
                decode_kv_key(NatsKeyEncoding::Nats, &legacy).as_deref(),
                Some(legacy.as_str())
            );
        }
    }

    #[test]
    fn undecodable_keys_are_remembered_once_and_bounded() {
        let mut u = Undecodable::default();
        u.skip("KV_b", "$KV.b.=x", NatsKeyEncoding::Nats);
        u.skip("KV_b", "$KV.b.=x", NatsKeyEncoding::Nats);
        assert_eq!(u.logged.len(), 1);
        assert!(!u.silenced);
        for i in 0..2 * MAX_LOGGED {
            u.skip("KV_b", &format!("$KV.b.={i}"), NatsKeyEncoding::Nats);
        }
        assert_eq!(u.logged.len(), MAX_LOGGED);
        assert!(u.silenced);
    }

    proptest! {
        #[test]
        fn kv_keys_round_trip(key in "\\PC{1,80}") {
            for encoding in [NatsKeyEncoding::Nats, NatsKeyEncoding::Legacy] {
                let stored = kv_key(encoding, &key);
                prop_assert!(nats_accepts(&stored));
                prop_assert_eq!(decode_kv_key(encoding, &stored), Some(key.clone()));
            }
        }

        #[test]
        fn stored_kv_keys_decode_canonically(stored in "[-/_=.a-fA-F0-9 ]{1,24}") {
            for encoding in [NatsKeyEncoding::Nats, NatsKeyEncoding::Legacy] {
                if let Some(key) = decode_kv_key(encoding, &stored) {
                    prop_assert_eq!(kv_key(encoding, &key), stored.clone());
                }
            }
        }

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
