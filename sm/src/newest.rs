//! The keep-newest rule of live-only pub/sub: while a consumer's queue is
//! full, one message is held, the newest; each newer one replaces it and
//! is counted, so the consumer, once it has room again, gets the latest
//! message and a warning says how many it missed.
//!
//! Every backend's subscription applies it (Redis, NATS, memory), so a
//! slow consumer of any backend ends with the same message.

/// At most one held item, the newest offered, and how many it replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Newest<T> {
    held: Option<T>,
    replaced: u64,
}

impl<T> Default for Newest<T> {
    fn default() -> Self {
        Newest {
            held: None,
            replaced: 0,
        }
    }
}

impl<T> Newest<T> {
    /// Nothing held, nothing replaced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds `item` as the newest; one held before is replaced and counted.
    pub fn hold(&mut self, item: T) {
        if self.held.replace(item).is_some() {
            self.replaced = self.replaced.saturating_add(1);
        }
    }

    /// Whether an item waits for the consumer.
    pub fn is_holding(&self) -> bool {
        self.held.is_some()
    }

    /// The held item, to send now; nothing is held afterwards.
    pub fn take(&mut self) -> Option<T> {
        self.held.take()
    }

    /// How many held items were replaced since the last call: each was
    /// never delivered.
    pub fn take_replaced(&mut self) -> u64 {
        std::mem::take(&mut self.replaced)
    }
}
