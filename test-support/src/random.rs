//! Seeded randomness for schedules and faults. Everything a simulation or a
//! fuzz run decides by chance comes from one ChaCha8 stream, the RNG sm's
//! machines use too, so a seed replays a run exactly.

pub use rand_chacha::ChaCha8Rng;
pub use rand_core::{RngCore, SeedableRng};

/// A seeded simulation RNG.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// True with probability `p`.
pub fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    if p <= 0.0 {
        return false;
    }
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    unit < p
}

/// A uniform-enough pick in `0..n` (`n` > 0).
pub fn pick(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    rng.next_u64() % n
}
