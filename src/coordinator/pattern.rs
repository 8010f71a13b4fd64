//! Glob patterns for KV watches: `*` matches any run of characters
//! (including none), `?` exactly one character, everything else itself.
//! `"*"` matches every key. There is no escaping: a key containing `*` or
//! `?` is matched by those characters as wildcards.

use crate::error::{Error, Result};

/// Longest pattern accepted, in bytes.
pub const MAX_PATTERN: usize = 1024;

/// Checks a watch pattern: non-empty, at most [`MAX_PATTERN`] bytes, no NUL.
/// Errors name the field `"pattern"`.
pub fn validate(pattern: &str) -> Result<()> {
    if pattern.is_empty() {
        return Err(Error::invalid(
            "pattern",
            "must not be empty; use \"*\" for every key",
        ));
    }
    if pattern.len() > MAX_PATTERN {
        return Err(Error::invalid(
            "pattern",
            format!(
                "is {} bytes long; at most {MAX_PATTERN} are allowed",
                pattern.len()
            ),
        ));
    }
    if pattern.contains('\0') {
        return Err(Error::invalid("pattern", "contains a NUL character"));
    }
    Ok(())
}

/// Whether `key` matches `pattern`, character by character (not byte).
///
/// Iterative with single-star backtracking: O(len(pattern) × len(key)) in
/// the worst case, no recursion, so hostile patterns such as `"*a*a*a*b"`
/// cannot blow the stack or take exponential time.
pub fn matches(pattern: &str, key: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let k: Vec<char> = key.chars().collect();
    let (mut pi, mut ki) = (0, 0);
    // Where the last `*` was, and the key position it currently absorbs up to.
    let mut star: Option<(usize, usize)> = None;
    while ki < k.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ki));
                pi += 1;
            }
            Some(&c) if c == '?' || c == k[ki] => {
                pi += 1;
                ki += 1;
            }
            _ => match star {
                // Let the last star absorb one more character and retry.
                Some((sp, sk)) => {
                    star = Some((sp, sk + 1));
                    pi = sp + 1;
                    ki = sk + 1;
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_matches_everything() {
        for key in ["", "a", "app.one", "ünïcode", "*?"] {
            assert!(matches("*", key), "{key:?}");
        }
    }

    #[test]
    fn literal_matches_only_itself() {
        assert!(matches("other", "other"));
        assert!(!matches("other", "others"));
        assert!(!matches("other", "othe"));
        assert!(!matches("other", "Other"));
    }

    #[test]
    fn question_mark_is_exactly_one_char() {
        assert!(matches("ap?.one", "app.one"));
        assert!(matches("ap?.one", "apx.one"));
        assert!(!matches("ap?.one", "ap.one"));
        assert!(!matches("ap?.one", "appp.one"));
        assert!(matches("?", "ü"), "one character, not one byte");
        assert!(!matches("??", "ü"));
    }

    #[test]
    fn star_runs_including_empty() {
        assert!(matches("app.*", "app."));
        assert!(matches("app.*", "app.two"));
        assert!(!matches("app.*", "apx.two"));
        assert!(matches("*.one", "app.one"));
        assert!(matches("a*b*c", "abc"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(!matches("a*b*c", "axxbyy"));
        assert!(matches("**", ""));
        assert!(matches("a*?", "ab"));
        assert!(!matches("a*?", "a"));
        assert!(matches("*ab", "aab"), "needs backtracking");
    }

    #[test]
    fn hostile_pattern_is_fast() {
        let key = "a".repeat(5000);
        let pattern = format!("{}b", "*a".repeat(200));
        let started = std::time::Instant::now();
        assert!(!matches(&pattern, &key));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn validation() {
        assert!(validate("*").is_ok());
        for bad in ["", "a\0", &"x".repeat(MAX_PATTERN + 1)] {
            assert!(
                matches!(
                    validate(bad),
                    Err(Error::InvalidArgument {
                        what: "pattern",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }
}
