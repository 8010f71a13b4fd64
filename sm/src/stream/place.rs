//! Where a reader of a bus stream stands ([`Place`]): the delivery rule of
//! every reader ([`Cursor`]: strictly after the last delivered sequence,
//! each once), where a new reader starts ([`Cursor::at`]), and — for a
//! stream that can be recreated under its reader (a Redis server restarted
//! without its data: the same key, sequences from 1 again) — the
//! stream's *epoch*, an opaque token every entry carries from the
//! stream's creation on.
//!
//! The Redis and NATS readers keep one `Place` each and ask it about
//! every entry they read and every stream head they look at; the etcd
//! reader ([`super::Reader`]) keeps a bare [`Cursor`].
//!
//! Rules, each tested in `sm/tests/unit/stream.rs`, and together by the
//! `place` fuzz target against a model stream that is recreated under its
//! reader (deliver-once within a stream, nothing of a new stream missed
//! where epochs tell it):
//!
//! * **start**: `Start` reads from the first entry, `End` after the head
//!   as it is when the reader opens, `After(n)` after `n` but never beyond
//!   the head (an `n` past the head waits for the next append instead of
//!   skipping appends until the sequences reach it);
//! * **deliver**: an entry is delivered iff its sequence is above the last
//!   one delivered; it then becomes the last, and its epoch the place's;
//! * **recreated**: the stream is taken to have been recreated when its
//!   head is gone while entries were delivered, when the head is below the
//!   last delivered sequence, or when an entry or the head carries another
//!   epoch than the place's; the place then starts again from the first
//!   entry (sequence 0, no epoch), so nothing of the new stream is missed.

use super::read::{Cursor, ReadFrom};

/// A reader's place in one stream (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    cursor: Cursor,
    epoch: Option<Vec<u8>>,
}

/// What [`Place::offer`] decided about one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Deliver it: it is the next one.
    Deliver,
    /// At or below the last one delivered: a repeat, drop it.
    Repeat,
    /// It belongs to another epoch: the stream was recreated, and the
    /// place starts again from the first entry; read again from there.
    Recreated,
}

impl Cursor {
    /// Where a reader opened at `from` starts, given the sequence of the
    /// stream's head now (0 for an empty stream).
    pub fn at(from: ReadFrom, head: u64) -> Cursor {
        Cursor::new(match from {
            ReadFrom::Start => 0,
            ReadFrom::End => head,
            ReadFrom::After(seq) => seq.min(head),
        })
    }
}

impl Place {
    /// The place of a reader opened at `from`, given the stream's head now:
    /// its sequence and epoch, `None` for an empty stream.
    pub fn open(from: ReadFrom, head: Option<(u64, Option<Vec<u8>>)>) -> Place {
        let (head_seq, head_epoch) = head.unwrap_or((0, None));
        let cursor = Cursor::at(from, head_seq);
        // An epoch is known only once the place is inside the stream.
        let epoch = if cursor.last() > 0 { head_epoch } else { None };
        Place { cursor, epoch }
    }

    /// The last sequence delivered (or skipped over by the start).
    pub fn last(&self) -> u64 {
        self.cursor.last()
    }

    /// Looks at the stream's head: its sequence (`None` when it does not
    /// read as one) and epoch, or `None` for no entry at all. `true` when
    /// the stream was recreated below the place, which then starts over.
    pub fn check_head(&mut self, head: Option<(Option<u64>, Option<&[u8]>)>) -> bool {
        let recreated = match head {
            None => self.last() > 0,
            Some((seq, epoch)) => {
                let behind = seq.is_some_and(|seq| seq < self.last());
                behind || self.other_epoch(epoch)
            }
        };
        if recreated {
            self.restart();
        }
        recreated
    }

    /// One entry read at sequence `seq`, carrying `epoch`.
    pub fn offer(&mut self, seq: u64, epoch: Option<&[u8]>) -> Offered {
        if self.other_epoch(epoch) {
            self.restart();
            return Offered::Recreated;
        }
        if !self.cursor.admit(seq) {
            return Offered::Repeat;
        }
        self.epoch = epoch.map(<[u8]>::to_vec);
        Offered::Deliver
    }

    fn other_epoch(&self, epoch: Option<&[u8]>) -> bool {
        self.epoch.is_some() && epoch != self.epoch.as_deref()
    }

    fn restart(&mut self) {
        self.cursor = Cursor::new(0);
        self.epoch = None;
    }
}
