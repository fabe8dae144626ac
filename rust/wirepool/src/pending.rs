//! The table of a worker's requests, keyed by request id.
//!
//! The protocol core hands out sequential ids, and at most `max_in_flight` requests are in
//! flight, so almost every id finds its entry at `id % capacity` in a fixed array: no hashing
//! and no allocation per call. An id whose place is still held by a much older request (one
//! that outlived `capacity` later ones) goes to a small overflow map instead, so correctness
//! never depends on how long requests live.

/// Most entries of the direct array, whatever `max_in_flight` is: the array is scanned by the
/// housekeeping tick, and what does not fit goes to the overflow map.
const MAX_DIRECT: usize = 1024;

type Overflow<T> = wirepool_proto::IdMap<T>;

pub(crate) struct Pending<T> {
    direct: Box<[Option<(u64, T)>]>,
    mask: u64,
    overflow: Overflow<T>,
}

impl<T> Pending<T> {
    /// A table sized for `max_in_flight` requests (twice that, rounded up to a power of two,
    /// so ids that live a little longer than their neighbours still find their place free).
    pub fn new(max_in_flight: u32) -> Self {
        let cap = (max_in_flight as usize)
            .saturating_mul(2)
            .next_power_of_two()
            .clamp(16, MAX_DIRECT);
        Pending {
            direct: (0..cap).map(|_| None).collect(),
            mask: cap as u64 - 1,
            overflow: Overflow::default(),
        }
    }

    /// Ids are never reused, so `id` is not in the table yet.
    pub fn insert(&mut self, id: u64, value: T) {
        let place = &mut self.direct[(id & self.mask) as usize];
        if place.is_none() {
            *place = Some((id, value));
        } else {
            self.overflow.insert(id, value);
        }
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        match &mut self.direct[(id & self.mask) as usize] {
            Some((at, v)) if *at == id => Some(v),
            _ if self.overflow.is_empty() => None,
            _ => self.overflow.get_mut(&id),
        }
    }

    pub fn remove(&mut self, id: u64) -> Option<T> {
        let place = &mut self.direct[(id & self.mask) as usize];
        match place {
            Some((at, _)) if *at == id => place.take().map(|(_, v)| v),
            _ if self.overflow.is_empty() => None,
            _ => self.overflow.remove(&id),
        }
    }

    /// Every entry, in no particular order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut T)> {
        self.direct
            .iter_mut()
            .filter_map(|p| p.as_mut().map(|(id, v)| (*id, v)))
            .chain(self.overflow.iter_mut().map(|(id, v)| (*id, v)))
    }

    /// Keeps the entries for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &mut T) -> bool) {
        for place in self.direct.iter_mut() {
            if let Some((id, v)) = place {
                if !keep(*id, v) {
                    *place = None;
                }
            }
        }
        self.overflow.retain(|id, v| keep(*id, v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_lived_id_and_its_successors_share_the_table() {
        let mut t = Pending::new(4); // 16 direct places
        t.insert(1, "old");
        for id in 2..100u64 {
            t.insert(id, "new");
            assert_eq!(t.remove(id), Some("new"));
        }
        // 17, 33, ... landed on the old one's place and went to the overflow map.
        t.insert(17 + 16 * 10, "clash");
        assert_eq!(t.iter_mut().count(), 2);
        assert_eq!(t.get_mut(1).copied(), Some("old"));
        assert_eq!(t.get_mut(17 + 16 * 10).copied(), Some("clash"));
        assert_eq!(t.get_mut(2), None);
        assert_eq!(t.remove(1), Some("old"));
        assert_eq!(t.remove(1), None);
        t.retain(|id, _| id != 17 + 16 * 10);
        assert_eq!(t.iter_mut().count(), 0);
    }

    #[test]
    fn direct_size_is_bounded() {
        let t: Pending<()> = Pending::new(u32::MAX);
        assert_eq!(t.direct.len(), MAX_DIRECT);
        let t: Pending<()> = Pending::new(1);
        assert_eq!(t.direct.len(), 16);
    }
}
