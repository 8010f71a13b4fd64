//! The one bounded queue behind every feed: the driver's sink for
//! watch-fed receivers (`driver/handle.rs`), the bus feeds of NATS and
//! Redis (`coordinator/bridge.rs`) and the memory hub
//! (`coordinator/memory.rs`).
//!
//! The rule is the same everywhere ("Slow consumers" in the coordinator
//! docs): an offer never waits; a queue at its bound hands the item back
//! ([`Offer::Full`]) and its producer pauses, keeping only where it was;
//! the producer resumes once the consumer has read the queue down to half
//! ([`FeedQueue::has_room`]), so that it does not wake for every item read.
//!
//! The channel is crossbeam's list flavour with the bound kept here: the
//! queue is its only sender, so a length checked below the bound stays
//! below it until this sender adds. A `bounded(4096)` channel allocates
//! and touches every slot up front, hundreds of KiB per feed and as many
//! page faults before its first item; the list allocates a block of 31
//! slots as items arrive and frees it once they are read.

use crossbeam_channel::{Receiver, Sender};
use std::time::Duration;

/// How often a paused producer looks at its consumer's queue: a crossbeam
/// channel cannot signal free space, so this polls, and only while a
/// consumer is behind.
pub(crate) const RELIEF_POLL: Duration = Duration::from_millis(10);

/// What became of an offer.
///
/// For one item, `Offer<T>` hands the item back when it did not fit. For a
/// batch or a standing state (`Offer<()>`), `Taken` means everything went
/// to the consumer (or it may be sent more), `Full` that something is
/// still waiting, `Gone` that the consumer is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Offer<T = ()> {
    /// Queued for the consumer.
    Taken,
    /// The queue is at its bound: here is the item back. Hold it (or where
    /// it came from) and wait for [`FeedQueue::has_room`].
    Full(T),
    /// The consumer dropped its receiver: stop producing.
    Gone,
}

impl<T> Offer<T> {
    /// Whether the item was queued. (Only the bus backends' feeds, which
    /// hand a held item back once relieved, ask.)
    #[cfg(any(feature = "nats", feature = "redis", test))]
    pub(crate) fn is_taken(&self) -> bool {
        matches!(self, Offer::Taken)
    }

    /// The same outcome without the item handed back.
    pub(crate) fn outcome(self) -> Offer {
        match self {
            Offer::Taken => Offer::Taken,
            Offer::Full(_) => Offer::Full(()),
            Offer::Gone => Offer::Gone,
        }
    }
}

/// The producer's end of a feed's queue: at most `capacity` items, never
/// waiting. There is exactly one per queue (it is not `Clone`), which is
/// what keeps the bound.
pub(crate) struct FeedQueue<T> {
    tx: Sender<T>,
    capacity: usize,
}

impl<T> FeedQueue<T> {
    /// A queue of `capacity` items (at least 1) and the consumer's end.
    /// Nothing is allocated until items arrive.
    pub(crate) fn new(capacity: usize) -> (FeedQueue<T>, Receiver<T>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (
            FeedQueue {
                tx,
                capacity: capacity.max(1),
            },
            rx,
        )
    }

    /// The bound.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether the queue is at its bound (it never holds more).
    pub(crate) fn is_full(&self) -> bool {
        self.tx.len() >= self.capacity
    }

    /// Whether a paused producer may resume: the consumer has read the
    /// queue down to half its bound (the relief mark).
    pub(crate) fn has_room(&self) -> bool {
        self.tx.len() <= self.capacity / 2
    }

    /// Queues `item` unless the queue is at its bound or the consumer is
    /// gone. Never waits.
    pub(crate) fn offer(&self, item: T) -> Offer<T> {
        if self.is_full() {
            return Offer::Full(item);
        }
        match self.tx.send(item) {
            Ok(()) => Offer::Taken,
            Err(_) => Offer::Gone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_stop_at_the_bound_and_hand_the_item_back() {
        let (queue, rx) = FeedQueue::new(3);
        for i in 0..3 {
            assert_eq!(queue.offer(i), Offer::Taken);
        }
        assert!(queue.is_full());
        assert_eq!(queue.offer(3), Offer::Full(3));
        assert_eq!(rx.len(), 3);
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(queue.offer(3), Offer::Taken);
    }

    #[test]
    fn room_returns_only_at_half() {
        let (queue, rx) = FeedQueue::new(4);
        for i in 0..4 {
            assert!(queue.offer(i).is_taken());
        }
        assert!(!queue.has_room());
        rx.recv().expect("queued");
        assert!(!queue.has_room(), "three of four: above half");
        assert!(!queue.is_full());
        rx.recv().expect("queued");
        assert!(queue.has_room(), "two of four: half");
    }

    #[test]
    fn a_dropped_receiver_is_gone_even_with_room() {
        let (queue, rx) = FeedQueue::new(2);
        drop(rx);
        assert_eq!(queue.offer(1), Offer::Gone);
    }

    #[test]
    fn a_capacity_of_zero_is_one() {
        let (queue, _rx) = FeedQueue::new(0);
        assert_eq!(queue.capacity(), 1);
        assert_eq!(queue.offer('a'), Offer::Taken);
        assert_eq!(queue.offer('b'), Offer::Full('b'));
        assert!(!queue.has_room(), "one of one");
    }

    #[test]
    fn outcomes_drop_the_item() {
        assert_eq!(Offer::Full(7).outcome(), Offer::Full(()));
        assert_eq!(Offer::<u8>::Taken.outcome(), Offer::Taken);
        assert_eq!(Offer::<u8>::Gone.outcome(), Offer::Gone);
    }
}
