//! numpy's legacy `RandomState` (MT19937) seeded as gym ≤ 0.21 seeds it, so that `rm-replay`
//! draws the same evaluation windows as RLScheduler (SC'20), whose published FCFS figures
//! are measured on windows chosen by `gym.utils.seeding.np_random(seed)` and
//! `RandomState.randint`. Only what that protocol needs: seeding, 32-bit output, bounded
//! integers.
//!
//! * gym: `hash_seed(seed)` = the first 8 bytes of SHA-512 of the seed's decimal text, read
//!   little-endian; split into 32-bit words, low first (`_int_list_from_bigint`), which
//!   seed the generator through `init_by_array`.
//! * MT19937: Matsumoto and Nishimura's reference `init_by_array` and `genrand_int32`.
//! * numpy's legacy `randint(low, high)`: masked rejection sampling, one 32-bit draw per
//!   try for ranges below 2³².

use sha2::{Digest, Sha512};

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER_MASK: u32 = 0x8000_0000;
const LOWER_MASK: u32 = 0x7fff_ffff;

/// The Mersenne Twister MT19937 (32-bit).
#[derive(Clone)]
pub struct Mt19937 {
    mt: [u32; N],
    mti: usize,
}

impl Mt19937 {
    fn init_genrand(s: u32) -> Self {
        let mut mt = [0u32; N];
        mt[0] = s;
        for i in 1..N {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { mt, mti: N }
    }

    /// The reference `init_by_array` (what numpy's `RandomState.seed(array)` runs).
    pub fn init_by_array(key: &[u32]) -> Self {
        let mut g = Self::init_genrand(19_650_218);
        let mt = &mut g.mt;
        let key: &[u32] = if key.is_empty() { &[0] } else { key };
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        g.mti = N;
        g
    }

    /// `genrand_int32`.
    pub fn next_u32(&mut self) -> u32 {
        if self.mti >= N {
            let mag = |y: u32| if y & 1 == 0 { 0 } else { MATRIX_A };
            for k in 0..N {
                let y = (self.mt[k] & UPPER_MASK) | (self.mt[(k + 1) % N] & LOWER_MASK);
                self.mt[k] = self.mt[(k + M) % N] ^ (y >> 1) ^ mag(y);
            }
            self.mti = 0;
        }
        let mut y = self.mt[self.mti];
        self.mti += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }
}

/// numpy's legacy `RandomState` as far as RLScheduler's window protocol uses it.
#[derive(Clone)]
pub struct NumpyRandomState(Mt19937);

impl NumpyRandomState {
    /// `gym.utils.seeding.np_random(seed)` of gym ≤ 0.21.
    pub fn gym_seeded(seed: u64) -> Self {
        let digest = Sha512::digest(seed.to_string().as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        let big = u64::from_le_bytes(first);
        let (lo, hi) = (big as u32, (big >> 32) as u32);
        let key: Vec<u32> = if hi != 0 { vec![lo, hi] } else { vec![lo] };
        NumpyRandomState(Mt19937::init_by_array(&key))
    }

    pub fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    /// `randint(low, high)`: uniform in `[low, high)` by masked rejection sampling (numpy's
    /// legacy bounded integers). `low` when the range is empty.
    pub fn randint(&mut self, low: u64, high: u64) -> u64 {
        if high <= low + 1 {
            return low;
        }
        let range = high - 1 - low;
        if range > u64::from(u32::MAX) {
            // Not needed by the window protocol (ranges are job counts); numpy would draw
            // 64-bit values here.
            let mut mask = range;
            for s in [1, 2, 4, 8, 16, 32] {
                mask |= mask >> s;
            }
            loop {
                let v = ((u64::from(self.next_u32()) << 32) | u64::from(self.next_u32())) & mask;
                if v <= range {
                    return low + v;
                }
            }
        }
        let range = range as u32;
        let mut mask = range;
        for s in [1, 2, 4, 8, 16] {
            mask |= mask >> s;
        }
        loop {
            let v = self.next_u32() & mask;
            if v <= range {
                return low + u64::from(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors taken from numpy 2.4 `RandomState` seeded by gym 0.17.3's
    /// `seeding.np_random(1)` (both agree with this port).
    #[test]
    fn matches_numpy_seeded_by_gym() {
        let mut r = NumpyRandomState::gym_seeded(1);
        assert_eq!(&r.0.mt[..3], &[2_147_483_648, 1_649_661_643, 2_204_385_595]);
        let raw: Vec<u32> = (0..12).map(|_| r.next_u32()).collect();
        assert_eq!(
            raw,
            [
                3_467_715_517,
                3_833_094_096,
                2_209_760_964,
                3_082_874_059,
                820_846_226,
                118_958_324,
                802_621_082,
                2_685_710_444,
                3_317_955_154,
                3_748_866_998,
                222_599_085,
                3_484_525_774
            ]
        );
        // RLScheduler's window starts for 10,000 jobs and windows of 1,024.
        let mut r = NumpyRandomState::gym_seeded(1);
        let starts: Vec<u64> = (0..10)
            .map(|_| r.randint(1024, 10_000 - 1024 - 1))
            .collect();
        assert_eq!(
            starts,
            [1981, 2756, 4299, 8850, 3316, 2714, 5228, 7762, 4022, 7085]
        );
    }

    #[test]
    fn randint_stays_in_range() {
        let mut r = NumpyRandomState::gym_seeded(7);
        for _ in 0..10_000 {
            let v = r.randint(5, 12);
            assert!((5..12).contains(&v));
        }
        assert_eq!(r.randint(3, 4), 3);
        assert_eq!(r.randint(3, 3), 3);
    }
}
