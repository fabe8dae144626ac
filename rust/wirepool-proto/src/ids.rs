//! A cheap hasher for the maps keyed by request id, shared by the core and both drivers.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// Request ids are sequential: a multiplicative (Fibonacci) hash spreads them over a hash
/// table's control bits at a fraction of SipHash's cost. Not DoS-resistant, which is fine for
/// ids the local peer hands out. Byte input (e.g. a few short method names) is mixed eight
/// bytes per multiply.
///
/// ```
/// let mut m: wirepool_proto::IdMap<&str> = Default::default();
/// m.insert(7, "seven");
/// assert_eq!(m[&7], "seven");
/// ```
#[derive(Default, Clone, Copy, Debug)]
pub struct IdHasher(u64);

/// The `BuildHasher` of [`IdHasher`].
pub type IdBuildHasher = BuildHasherDefault<IdHasher>;

/// A map keyed by request id, hashed with [`IdHasher`].
pub type IdMap<V> = HashMap<u64, V, IdBuildHasher>;

impl IdHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(23) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.mix(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let mut tail = [0u8; 8];
        let rest = words.remainder();
        tail[..rest.len()].copy_from_slice(rest);
        self.mix(u64::from_le_bytes(tail) ^ ((rest.len() as u64) << 56));
    }
    fn write_u8(&mut self, b: u8) {
        // `str`'s terminator: one mix, not a padded word.
        self.mix(b as u64);
    }
    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
