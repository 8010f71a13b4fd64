//! The one reversible escape every networked backend uses to put any
//! fleetcoord name into a server's narrower alphabet: bytes of the
//! backend's *plain* set stand for themselves, every other byte — the
//! escape character included — is the escape character plus two
//! upper-case hex digits.
//!
//! Invariants, for every [`Alphabet`] (tested exhaustively below):
//!
//! * the output uses only plain bytes and the escape character, and is
//!   empty only for an empty name;
//! * [`decode`] inverts [`encode`], and accepts only text `encode` can
//!   write: an escaped plain byte, lower-case hex, a stray escape
//!   character or a byte outside the alphabet is refused, so two names
//!   never share an encoding and foreign text is recognised as such.
//!
//! Each backend states its alphabet, and what else it needs (cluster hash
//! tags, subject tokens, length bounds), in its own `names.rs`.

/// What a backend's server accepts as-is, and the byte that escapes.
pub(crate) struct Alphabet {
    /// The escape character; never plain.
    pub(crate) escape: u8,
    /// Whether a byte stands for itself.
    pub(crate) plain: fn(u8) -> bool,
}

/// `name` with every byte outside the plain set as escape + two hex digits.
pub(crate) fn encode(alphabet: &Alphabet, name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if (alphabet.plain)(b) {
            out.push(char::from(b));
        } else {
            out.push(char::from(alphabet.escape));
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b & 0x0F));
        }
    }
    out
}

/// The name [`encode`] made `text` from; `None` for text it cannot have
/// made.
#[cfg_attr(not(feature = "nats"), allow(dead_code))] // Redis decodes only in its tests.
pub(crate) fn decode(alphabet: &Alphabet, text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == alphabet.escape {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            let decoded = (hi << 4) | lo;
            if (alphabet.plain)(decoded) {
                return None;
            }
            out.push(decoded);
            i += 3;
        } else if (alphabet.plain)(b) {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// One upper-case hex digit of `nibble`'s low four bits.
pub(crate) fn hex_digit(nibble: u8) -> char {
    char::from(b"0123456789ABCDEF"[usize::from(nibble & 0x0F)])
}

#[cfg_attr(not(feature = "nats"), allow(dead_code))]
fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn letters_digits_dash(b: u8) -> bool {
        b.is_ascii_alphanumeric() || b == b'-'
    }

    fn with_dot_underscore(b: u8) -> bool {
        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
    }

    const ALPHABETS: [Alphabet; 2] = [
        Alphabet {
            escape: b'_',
            plain: letters_digits_dash,
        },
        Alphabet {
            escape: b'%',
            plain: with_dot_underscore,
        },
    ];

    /// Every name of up to two characters from a mix of plain bytes, both
    /// escape characters, hex-looking letters and multi-byte UTF-8.
    fn names() -> Vec<String> {
        let chars = [
            'a',
            'F',
            '7',
            '-',
            '_',
            '%',
            '.',
            ' ',
            '{',
            'é',
            '\u{1F600}',
        ];
        let mut out = vec![String::new()];
        for x in chars {
            out.push(x.to_string());
            for y in chars {
                out.push([x, y].iter().collect());
            }
        }
        out
    }

    #[test]
    fn every_short_name_round_trips_in_the_alphabet_and_distinct() {
        for alphabet in &ALPHABETS {
            let mut seen = HashMap::new();
            for name in names() {
                let text = encode(alphabet, &name);
                assert_eq!(text.is_empty(), name.is_empty());
                assert!(
                    text.bytes()
                        .all(|b| (alphabet.plain)(b) || b == alphabet.escape),
                    "{text:?}"
                );
                assert_eq!(decode(alphabet, &text).as_deref(), Some(name.as_str()));
                if let Some(other) = seen.insert(text.clone(), name.clone()) {
                    panic!("{name:?} and {other:?} both encode to {text:?}");
                }
            }
        }
    }

    #[test]
    fn every_short_text_that_decodes_is_what_encode_writes() {
        // All texts of up to three bytes over the alphabet's edges.
        let bytes = [b'a', b'F', b'f', b'7', b'-', b'_', b'%', b'.', b' ', 0xC3];
        for alphabet in &ALPHABETS {
            for x in bytes {
                for y in bytes {
                    for z in bytes {
                        let Ok(text) = String::from_utf8(vec![x, y, z]) else {
                            continue;
                        };
                        if let Some(name) = decode(alphabet, &text) {
                            assert_eq!(encode(alphabet, &name), text, "{text:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn foreign_text_does_not_decode() {
        let [underscore, percent] = &ALPHABETS;
        for bad in ["_", "_4", "_zz", "_2e", "_41", "a b", "a.b"] {
            assert_eq!(decode(underscore, bad), None, "{bad:?}");
        }
        for bad in ["%", "%4", "%zz", "%7b", "%41", "a{b", "a b"] {
            assert_eq!(decode(percent, bad), None, "{bad:?}");
        }
    }
}
