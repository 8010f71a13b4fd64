//! A model etcd and a harness that runs `fleetcoord-sm` machines against it
//! on a virtual clock, with faults. `fleetcoord-sm`'s simulation
//! (`sm/tests/sim.rs`) and the fuzz targets share it, so there is one
//! faithful etcd model to trust and to fix.
//!
//! Everything is re-exported at the root; `use fleetcoord_test_support::*`.
//!
//! * [`ModelEtcd`] ([`etcd`]) — in-memory etcd v3: revisions, leases on the
//!   virtual clock, watch history, compaction, pause/resume, leader change.
//!   `execute(now, &request) -> Result<Response, RpcError>` runs one request
//!   exactly as etcd would (except `Request::Watch`, which the harness
//!   serves). Inspection: `revision()`, `get(key)`, `range_prefix(prefix)`,
//!   `lease_exists(lease)`, `lease_deadline(lease)`, `leases()`,
//!   `next_deadline()`, `watch_history(range, from)`.
//! * [`Faults`] ([`faults`]) — probabilities of a failed request / lost
//!   reply / unary request landing late, the reply latency range and how
//!   late a held-up request lands; `Faults::none()`, `Faults::moderate()`.
//! * [`Harness<M>`] ([`harness`]) — one machine plus everything on the wire
//!   for it: replies in flight, active watches, requests queued while etcd
//!   is paused, held-up requests still to land, notifications
//!   (`pub notifications: Vec<(Instant, N)>`). `pump`, `fire_timeout`,
//!   `deliver_due`, `next_event_time`, `drop_streams(now)`,
//!   `lose_all_inflight()`; `held()` and `late_landed` count the held-up
//!   requests still to land and those landed; `pass_held_to(other)` leaves
//!   them on the wire for a machine's replacement.
//! * [`Node`] ([`world`]) — the object-safe face of a harness, so machines
//!   of different types can be stepped together: [`step`] processes one
//!   instant for all of them in the required order, [`world_next_time`]
//!   finds the next instant, [`run_until`] loops the two. [`next_time`] is
//!   the minimum of options; [`next_due`] is the next instant of a one-node
//!   world up to a bound; [`ms`] spells virtual durations.
//! * [`StreamLedger`] ([`ledger`]) — the ground truth of a stream test:
//!   every entry ever written to one stream, read from the model's history,
//!   checked as it is read (no payload twice; in turn while every reply was
//!   truthful).
//! * [`model`] — exhaustive bounded model checking: [`model::explore`]
//!   visits every schedule of a small world (the model etcd, real machines,
//!   an explicit [`model::Wire`] per machine on which every run, delivery,
//!   loss and late landing of a request is an action), checking safety on
//!   every transition and bounded liveness from every quiescent state;
//!   [`model::replay`] runs a counterexample's trace again. The worlds
//!   (`model::election`, ...) state their properties.
//! * Seeded randomness for schedules ([`random`]): [`rng`], [`chance`],
//!   [`pick`] (a number in `0..n`).
//! * [`Drifting<M>`] ([`drift`]) — a machine whose clock runs at another
//!   rate than the world's (etcd's), through a [`DriftClock`]: its `now` is
//!   the world's instant seen through that clock, its deadlines are turned
//!   back into world instants. Wrap a machine in it before the harness.
//!
//! Ordering at one instant (what [`step`] does, and what hand-written loops
//! must do): `etcd.advance(now)` (leases expire first), then every due
//! `handle_timeout`, then every due late landing and reply delivery (each
//! harness lands its held-up requests before it delivers its replies), then
//! pump every harness until no new write happens (so each watch sees every
//! other harness's writes). Timeouts before deliveries is the point: a
//! leader's local deadline fires before anyone else can learn that its key
//! is gone.
//!
//! Requests are executed when the harness pumps them (the send instant);
//! replies arrive after a latency drawn from `faults.latency`. The
//! exception is a unary request held up with probability `faults.land_late`:
//! its client is answered `Unavailable` after the usual latency, and the
//! request runs at etcd `faults.late_by` after its send instant (if etcd is
//! paused then, at the first pump after it resumes), whether its client has
//! since retried, canceled it or stopped; its result is dropped. Watch
//! batches are one per revision and never reordered; keepalive replies of
//! one harness are never reordered (they share one stream).
//!
//! A fuzz target that answers requests itself (in any order, at any time)
//! uses [`ModelEtcd`] alone: `execute` for the truth, then lies on top of it
//! where the target means to play a loose etcd.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod drift;
pub mod etcd;
pub mod faults;
pub mod harness;
pub mod incarnations;
pub mod ledger;
pub mod model;
pub mod random;
pub mod world;

pub use drift::{DriftClock, Drifting};
pub use etcd::{ModelEtcd, MAX_LEASE_TTL_SECS, MAX_TXN_OPS};
pub use faults::Faults;
pub use harness::{next_time, Harness};
pub use incarnations::Incarnations;
pub use ledger::{StreamLedger, Written};
pub use random::{chance, pick, rng, ChaCha8Rng, RngCore, SeedableRng};
pub use world::{ms, next_due, run_until, settle, step, world_next_time, Node};

/// Work allowed at one instant before the harness or the world declares a
/// livelock: far above any real protocol's burst, far below "hangs forever".
const LIVELOCK_LIMIT: usize = 100_000;
