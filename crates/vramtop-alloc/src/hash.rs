//! One fast hasher for the maps on the allocator's and the replay's hot paths: keyed by
//! device addresses (one lookup or more per event of a history of millions) and by
//! allocation-site tags. SipHash's armour against chosen keys buys nothing for keys a
//! trace, a backing or our own callers hand out, and cost a quarter of a replay's time.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A multiplicative hash of one u64 (Fibonacci hashing), folded so that the low bits,
/// which pick the bucket, depend on every bit of the address: addresses are 512-byte
/// aligned, so a plain product would leave its low 9 bits zero.
#[derive(Default, Clone, Copy)]
pub struct FastHasher {
    hash: u64,
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Strings (tags), word by word.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.hash = (self.hash ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash ^ (self.hash >> 29)
    }
}

pub type FastBuild = BuildHasherDefault<FastHasher>;
/// A map from device addresses.
pub type AddrMap<V> = HashMap<u64, V, FastBuild>;
/// A set of device addresses.
pub type AddrSet = HashSet<u64, FastBuild>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        // 4,096 addresses 512 bytes apart land in most of 4,096 buckets.
        let build = FastBuild::default();
        let mut buckets = HashSet::new();
        for i in 0..4096u64 {
            buckets.insert(build.hash_one(0x7f00_0000_0000 + i * 512) & 4095);
        }
        assert!(buckets.len() > 2500, "{} buckets of 4096", buckets.len());
    }
}
