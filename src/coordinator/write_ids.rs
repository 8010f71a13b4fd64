//! Ids for a server's duplicate detection: JetStream drops a publish whose
//! `Nats-Msg-Id` it saw within the stream's duplicate window, and the Redis
//! append script answers a token it recorded with the entry it stored. So
//! an id must never repeat across writers, or a write is lost.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where every write's id comes from: 128 random bits drawn once per handle
/// and a count of the handle's writes. As unique as a fresh UUID per write,
/// without a system call per write for its randomness.
pub(crate) struct WriteIds {
    prefix: String,
    next: AtomicU64,
}

impl WriteIds {
    /// Ids no other handle draws.
    pub(crate) fn new() -> Self {
        WriteIds {
            prefix: uuid::Uuid::new_v4().simple().to_string(),
            next: AtomicU64::new(0),
        }
    }

    /// An id no other write (of this handle or any other) gets.
    pub(crate) fn next(&self) -> String {
        // 2^64 writes of one handle would take longer than any duplicate
        // window by far; wrapping there could not meet an id still held.
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n:x}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_never_repeat_within_or_across_handles() {
        let (a, b) = (WriteIds::new(), WriteIds::new());
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(a.next()));
            assert!(seen.insert(b.next()));
        }
        assert_ne!(a.prefix, b.prefix, "each handle draws its own");
    }
}
