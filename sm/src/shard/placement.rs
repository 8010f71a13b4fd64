//! Where a shard belongs: weighted rendezvous (highest-random-weight)
//! hashing of a shard over the live members.
//!
//! Every member, and any process that wants to predict the map, computes
//! the same owner from the same member set: the hash and the score are
//! fixed here, bit for bit, using only integer arithmetic and correctly
//! rounded IEEE-754 operations (`+ - * /`), so no platform's `libm` or
//! hasher seed changes the answer.
//!
//! * `hash(member, shard) = mix(fnv1a64(member) ^ mix(shard))`, where
//!   `fnv1a64` is 64-bit FNV-1a (offset `0xcbf29ce484222325`, prime
//!   `0x100000001b3`) over the member id's bytes and `mix` is SplitMix64's
//!   finalizer (`z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27;
//!   z *= 0x94d049bb133111eb; z ^= z >> 31`, wrapping).
//! * With equal weights the member with the greatest hash wins (ties, which
//!   need equal 64-bit hashes, go to the greatest member id).
//! * With weights: `u = (top 53 bits of hash + 0.5) / 2^53` lies in (0, 1)
//!   and the score is `w / -ln(u)` (greater wins; a member's share of the
//!   shards is then proportional to its weight); `ln` is [`ln_unit`].
//!   Weight 0 is never placed.
//!
//! Adding a member moves exactly the shards it now wins, all to it;
//! removing one moves exactly its shards, spread over the others: no other
//! shard changes owner ([`owner`] depends on each member's score alone).

/// SplitMix64's finalizer: a bijection of `u64` that mixes every bit.
fn mix(mut z: u64) -> u64 {
    z ^= z >> 30;
    z = z.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^= z >> 27;
    z = z.wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of `bytes`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The rendezvous hash of `member` for `shard` (see the module docs).
pub fn hash(member: &[u8], shard: u32) -> u64 {
    mix(fnv1a64(member) ^ mix(u64::from(shard)))
}

/// `ln(u)` for `u` in (0, 1], from correctly rounded operations only:
/// `u = m × 2^e` with `m` in [1, 2), `ln u = e × ln 2 + 2 atanh(s)` with
/// `s = (m − 1)/(m + 1)` below 1/3, the series summed to 20 terms
/// (`s^41 / 41` is below 2^-60). The same bits on every platform.
pub fn ln_unit(u: f64) -> f64 {
    const LN_2: f64 = std::f64::consts::LN_2;
    let mut m = u;
    let mut e = 0i32;
    while m < 1.0 && e > -1100 {
        m *= 2.0;
        e -= 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut term = s;
    let mut sum = 0.0;
    for k in 0..20 {
        sum += term / f64::from(2 * k + 1);
        term *= s2;
    }
    f64::from(e) * LN_2 + 2.0 * sum
}

/// The weighted score of `member` (weight `weight` > 0) for `shard`.
fn score(member: &[u8], weight: u32, shard: u32) -> f64 {
    // The top 53 bits fit an f64 exactly; + 0.5 keeps u off 0 and 1.
    let top = (hash(member, shard) >> 11) as f64;
    let u = (top + 0.5) / 9_007_199_254_740_992.0;
    f64::from(weight) / -ln_unit(u)
}

/// The member `shard` belongs to among `members` (id, weight), or `None`
/// when no member has a weight above 0. Equal weights compare hashes as
/// integers; otherwise scores, ties going to the greater hash, then to
/// the greater id.
pub fn owner<'a, I>(members: I, shard: u32) -> Option<&'a [u8]>
where
    I: IntoIterator<Item = (&'a [u8], u32)> + Clone,
{
    let mut weights = members.clone().into_iter().filter(|(_, w)| *w > 0);
    let first = weights.next()?.1;
    let uniform = weights.all(|(_, w)| w == first);
    let mut best: Option<(f64, u64, &'a [u8])> = None;
    for (member, weight) in members.into_iter().filter(|(_, w)| *w > 0) {
        let h = hash(member, shard);
        let s = if uniform {
            0.0
        } else {
            score(member, weight, shard)
        };
        let better = match best {
            None => true,
            Some((bs, bh, bm)) => (s, h, member) > (bs, bh, bm),
        };
        if better {
            best = Some((s, h, member));
        }
    }
    best.map(|(_, _, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<(Vec<u8>, u32)> {
        (0..n)
            .map(|i| (format!("host-{i}").into_bytes(), 1))
            .collect()
    }

    fn place(members: &[(Vec<u8>, u32)], shards: u32) -> Vec<Option<Vec<u8>>> {
        (0..shards)
            .map(|s| owner(members.iter().map(|(m, w)| (m.as_slice(), *w)), s).map(<[u8]>::to_vec))
            .collect()
    }

    /// The hash is pinned: a change of it moves every fleet's shards.
    #[test]
    fn hash_is_pinned() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(mix(0), 0);
        assert_eq!(hash(b"host-0", 0), mix(fnv1a64(b"host-0")));
    }

    #[test]
    fn ln_unit_matches_the_math() {
        for u in [1e-300, 1e-9, 0.001, 0.1, 0.25, 0.5, 0.75, 0.999_999, 1.0] {
            let ours = ln_unit(u);
            let std = u.ln();
            assert!(
                (ours - std).abs() <= 1e-12 * std.abs().max(1.0),
                "{u}: {ours} vs {std}"
            );
        }
    }

    /// A join moves only shards to the joiner, and a leave only the
    /// leaver's shards, each about M/N; measured for N in 1..=20, M 256.
    #[test]
    fn a_join_or_leave_moves_about_m_over_n_and_nothing_else() {
        const M: u32 = 256;
        let mut worst = 0.0f64;
        for n in 1..=20usize {
            let before = members(n);
            let after = members(n + 1);
            let joiner = after[n].0.clone();
            let (a, b) = (place(&before, M), place(&after, M));
            let mut moved = 0u32;
            for (x, y) in a.iter().zip(&b) {
                if x != y {
                    moved += 1;
                    // Everything that moves, moves to the joiner: read
                    // backwards, this is the leave of the joiner too.
                    assert_eq!(y.as_deref(), Some(joiner.as_slice()), "n={n}");
                }
            }
            let fair = f64::from(M) / (n + 1) as f64;
            worst = worst.max(f64::from(moved) / fair);
            // Binomial spread: within 4 standard deviations of M/(N+1).
            let p = 1.0 / (n + 1) as f64;
            let sd = (f64::from(M) * p * (1.0 - p)).sqrt();
            assert!(
                (f64::from(moved) - fair).abs() <= 4.0 * sd + 1.0,
                "n={n}: {moved} moved, fair {fair}"
            );
        }
        assert!(worst < 1.6, "worst move ratio {worst}");
    }

    /// Weights shift shares in proportion and keep the move rule.
    #[test]
    fn weights_shift_shares_in_proportion() {
        const M: u32 = 4096;
        let mut ms = members(4);
        ms[0].1 = 3;
        let counts = place(&ms, M).into_iter().fold([0u32; 4], |mut c, o| {
            let i = ms.iter().position(|(m, _)| Some(m) == o.as_ref()).unwrap();
            c[i] += 1;
            c
        });
        // Expected 2048 / 682.7 each.
        assert!((1900..=2200).contains(&counts[0]), "{counts:?}");
        for c in &counts[1..] {
            assert!((580..=790).contains(c), "{counts:?}");
        }
        let mut more = ms.clone();
        more.push((b"host-new".to_vec(), 2));
        for (x, y) in place(&ms, M).iter().zip(&place(&more, M)) {
            if x != y {
                assert_eq!(y.as_deref(), Some(&b"host-new"[..]));
            }
        }
    }

    #[test]
    fn weight_zero_and_no_members_place_nothing() {
        let none: Vec<(&[u8], u32)> = Vec::new();
        assert_eq!(owner(none, 1), None);
        let zero: Vec<(&[u8], u32)> = vec![(b"a", 0)];
        assert_eq!(owner(zero, 1), None);
        let mixed: Vec<(&[u8], u32)> = vec![(b"a", 0), (b"b", 5)];
        assert_eq!(owner(mixed, 1), Some(&b"b"[..]));
    }
}
