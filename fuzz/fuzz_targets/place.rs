//! Fuzz a bus stream reader's place (`fleetcoord_sm::stream::Place`)
//! against a model stream that can be recreated under its reader.
//!
//! The model is one stream: entries with sequences 1, 2, … and, in epoch
//! mode (Redis), the epoch of its creation on every entry; a recreation
//! (a server restarted without its data) empties it and starts a new
//! epoch with sequences from 1 again. The reader behaves as the Redis and
//! NATS readers do: it reads the entries after its place from the stream
//! as it is now and offers them in order (stopping at a `Recreated`),
//! offers entries again (a read retried after a lost answer), and looks at
//! the head (as readers do when a read comes back empty). After every
//! step:
//! * within one epoch, deliveries are in increasing sequence order, each
//!   sequence at most once (deliver-once);
//! * an entry at or below the last delivered one is a `Repeat`; a
//!   `Recreated` only when the stream really was recreated since the
//!   entries the place last took;
//! * `last()` never exceeds the head of the stream it belongs to.
//!
//! At the end the reader catches up (looks at the head, reads until
//! nothing is left): in epoch mode it has then delivered every entry of
//! the current epoch from where it entered it (the start of `open`, or
//! the first entry once it noticed a recreation) — nothing of the new
//! stream is missed. Without epochs (a head that cannot tell a recreation
//! that has already grown past the place) that holds while the stream was
//! never recreated.

#![no_main]

use arbitrary::Arbitrary;
use fleetcoord_sm::stream::{Offered, Place, ReadFrom};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;

#[derive(Arbitrary, Debug)]
enum Op {
    /// Append `n % 8 + 1` entries.
    Append { n: u8 },
    /// The stream is recreated empty, in a new epoch.
    Recreate,
    /// Read up to `max % 8 + 1` entries after the place and offer them.
    Read { max: u8 },
    /// Offer an entry again: `back` entries below the place's last one.
    Repeat { back: u8 },
    /// Look at the head.
    CheckHead,
    /// Look at a head whose sequence does not parse (an odd id).
    CheckOddHead,
}

#[derive(Arbitrary, Debug)]
struct Input {
    epochs: bool,
    /// 0: `Start`, 1: `End`, else `After(after)`.
    from: u8,
    after: u8,
    initial: u8,
    ops: Vec<Op>,
}

struct Model {
    epochs: bool,
    /// The current epoch's number; its entries are `1..=head`.
    epoch: u32,
    head: u64,
    /// The stream was recreated since the place took its last entry, and
    /// the place has not noticed yet.
    recreated_since: bool,
    recreated_ever: bool,
}

impl Model {
    fn tag(&self, epoch: u32) -> Option<Vec<u8>> {
        self.epochs.then(|| epoch.to_be_bytes().to_vec())
    }

    fn head(&self) -> Option<(u64, Option<Vec<u8>>)> {
        (self.head > 0).then(|| (self.head, self.tag(self.epoch)))
    }
}

struct Reader {
    place: Place,
    /// Delivered sequences, per epoch number.
    delivered: Vec<BTreeSet<u64>>,
    /// Where the reader entered the current epoch: deliveries are owed
    /// from above this.
    entered_at: u64,
    /// The epoch the place belongs to (by the model's count).
    epoch: u32,
}

impl Reader {
    fn delivered(&mut self, epoch: u32) -> &mut BTreeSet<u64> {
        let i = epoch as usize;
        while self.delivered.len() <= i {
            self.delivered.push(BTreeSet::new());
        }
        &mut self.delivered[i]
    }

    /// The place started over: it now belongs to the current epoch, from
    /// its first entry.
    fn restarted(&mut self, m: &mut Model) {
        assert!(m.recreated_since, "started over without a recreation");
        assert_eq!(self.place.last(), 0, "a restart is from the first entry");
        m.recreated_since = false;
        self.epoch = m.epoch;
        self.entered_at = 0;
    }

    fn offer(&mut self, m: &mut Model, seq: u64) -> Offered {
        let tag = m.tag(m.epoch);
        let last = self.place.last();
        let offered = self.place.offer(seq, tag.as_deref());
        match offered {
            Offered::Deliver => {
                assert!(seq > last, "delivered {seq} at or below {last}");
                if m.recreated_since {
                    // Only without epochs can an entry of a new stream be
                    // taken as the next of the old one.
                    assert!(!m.epochs, "an entry of another epoch delivered");
                    m.recreated_since = false;
                    self.epoch = m.epoch;
                    self.entered_at = last;
                }
                let epoch = self.epoch;
                let fresh = self.delivered(epoch).insert(seq);
                assert!(fresh, "{seq} delivered twice in epoch {epoch}");
                assert_eq!(self.place.last(), seq);
            }
            Offered::Repeat => {
                assert!(seq <= last, "{seq} above {last} taken as a repeat");
                assert_eq!(self.place.last(), last);
            }
            Offered::Recreated => self.restarted(m),
        }
        offered
    }

    fn read(&mut self, m: &mut Model, max: u64) {
        let from = self.place.last() + 1;
        let to = m.head.min(from.saturating_add(max - 1));
        for seq in from..=to {
            if self.offer(m, seq) == Offered::Recreated {
                return;
            }
        }
    }

    fn check_head(&mut self, m: &mut Model, odd: bool) {
        let tag = m.tag(m.epoch);
        let head = m
            .head()
            .map(|(seq, _)| ((!odd).then_some(seq), tag.as_deref()));
        let last = self.place.last();
        if self.place.check_head(head) {
            self.restarted(m);
        } else if m.recreated_since && m.epochs && m.head > 0 {
            // A head of another epoch always tells a recreation, as long
            // as the place knows its own epoch (it took an entry).
            assert!(last == 0, "a head of another epoch went unnoticed");
        }
    }
}

fuzz_target!(|input: Input| {
    let mut m = Model {
        epochs: input.epochs,
        epoch: 0,
        head: u64::from(input.initial % 16),
        recreated_since: false,
        recreated_ever: false,
    };
    let from = match input.from % 3 {
        0 => ReadFrom::Start,
        1 => ReadFrom::End,
        _ => ReadFrom::After(u64::from(input.after % 32)),
    };
    let place = Place::open(from, m.head());
    let entered_at = place.last();
    assert!(entered_at <= m.head, "opened beyond the head");
    let mut r = Reader {
        place,
        delivered: Vec::new(),
        entered_at,
        epoch: 0,
    };
    for op in input.ops.iter().take(256) {
        match op {
            Op::Append { n } => m.head += u64::from(n % 8) + 1,
            Op::Recreate => {
                m.epoch += 1;
                m.head = 0;
                m.recreated_ever = true;
                if r.place.last() == 0 {
                    // A place at the very start is at the start of any
                    // stream: nothing to notice, nothing missed.
                    r.epoch = m.epoch;
                    r.entered_at = 0;
                } else {
                    m.recreated_since = true;
                }
            }
            Op::Read { max } => r.read(&mut m, u64::from(max % 8) + 1),
            Op::Repeat { back } => {
                let last = r.place.last();
                if last > 0 && r.epoch == m.epoch && !m.recreated_since {
                    let seq = last.saturating_sub(u64::from(back % 4)).max(1);
                    let offered = r.offer(&mut m, seq);
                    assert_eq!(offered, Offered::Repeat, "{seq} again");
                }
            }
            Op::CheckHead => r.check_head(&mut m, false),
            Op::CheckOddHead => r.check_head(&mut m, true),
        }
        if r.epoch == m.epoch && !m.recreated_since {
            assert!(r.place.last() <= m.head, "the place is beyond the head");
        }
    }

    // Catch up: look at the head, then read until nothing is left.
    r.check_head(&mut m, false);
    for _ in 0..1024 {
        let before = (r.place.last(), r.epoch);
        r.read(&mut m, 8);
        if (r.place.last(), r.epoch) == before {
            break;
        }
    }
    if m.epochs || !m.recreated_ever {
        assert_eq!(
            r.epoch, m.epoch,
            "the reader never reached the current stream"
        );
        assert!(!m.recreated_since, "a recreation went unnoticed");
        let owed: BTreeSet<u64> = (r.entered_at + 1..=m.head).collect();
        let epoch = r.epoch;
        assert_eq!(
            r.delivered(epoch).clone(),
            owed,
            "epoch {epoch}: delivered vs owed from {}",
            r.entered_at
        );
    }
});
