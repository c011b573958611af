//! The free index of the `tlsf` policy: two-level segregated fit (Masmano et al.).
//! First level: power of two; second level: 32 linear slices of it. A request is
//! rounded up to the next slice boundary, so the head of any non-empty list at or above
//! that class fits: two bitmap scans, O(1), no list walk. The price is "good fit" (a
//! fitting run in the request's own slice is not considered). Growth and coalescing
//! are the shared `Fit` policy's.

use super::arena::{Arena, NIL};
use super::fit::FitIndex;
use super::heap::FreeIndex;
use super::metrics::{FreeSummary, FreeTally};

const SL_LOG2: u32 = 5;
const SL: usize = 1 << SL_LOG2;
/// Smallest run: 512 B = 2^9.
const FL_MIN: u32 = 9;
const FL: usize = (64 - FL_MIN) as usize;

/// (first, second) level of a size >= 512.
#[inline]
fn mapping(size: u64) -> (usize, usize) {
    let f = 63 - size.leading_zeros();
    let s = (size >> (f - SL_LOG2)) as usize & (SL - 1);
    ((f - FL_MIN) as usize, s)
}

#[derive(Debug)]
pub(crate) struct TlsfIndex {
    fl_bitmap: u64,
    sl_bitmap: [u32; FL],
    heads: Vec<[u32; SL]>,
    tally: FreeTally,
}

impl Default for TlsfIndex {
    fn default() -> Self {
        TlsfIndex {
            fl_bitmap: 0,
            sl_bitmap: [0; FL],
            heads: vec![[NIL; SL]; FL],
            tally: FreeTally::default(),
        }
    }
}

impl FreeIndex for TlsfIndex {
    fn insert(&mut self, arena: &mut Arena, slot: u32) {
        let size = arena.get(slot).size;
        self.tally.add(size);
        let (f, s) = mapping(size.max(1 << FL_MIN));
        let head = self.heads[f][s];
        let node = arena.get_mut(slot);
        node.link_prev = NIL;
        node.link_next = head;
        if head != NIL {
            arena.get_mut(head).link_prev = slot;
        }
        self.heads[f][s] = slot;
        self.sl_bitmap[f] |= 1 << s;
        self.fl_bitmap |= 1 << f;
    }

    fn remove(&mut self, arena: &mut Arena, slot: u32) {
        let node = arena.get(slot);
        let (size, prev, next) = (node.size, node.link_prev, node.link_next);
        self.tally.remove(size);
        let (f, s) = mapping(size.max(1 << FL_MIN));
        if prev == NIL {
            self.heads[f][s] = next;
            if next == NIL {
                self.sl_bitmap[f] &= !(1 << s);
                if self.sl_bitmap[f] == 0 {
                    self.fl_bitmap &= !(1 << f);
                }
            }
        } else {
            arena.get_mut(prev).link_next = next;
        }
        if next != NIL {
            arena.get_mut(next).link_prev = prev;
        }
    }

    fn summary(&self, arena: &Arena) -> FreeSummary {
        let mut largest = 0;
        if self.fl_bitmap != 0 {
            let f = 63 - self.fl_bitmap.leading_zeros() as usize;
            let s = 31 - self.sl_bitmap[f].leading_zeros() as usize;
            let mut slot = self.heads[f][s];
            while slot != NIL {
                largest = largest.max(arena.get(slot).size);
                slot = arena.get(slot).link_next;
            }
        }
        self.tally.summary(largest)
    }
}

impl FitIndex for TlsfIndex {
    fn find(&self, _arena: &Arena, size: u64) -> Option<u32> {
        let size = size.max(1 << FL_MIN);
        let f = 63 - size.leading_zeros();
        let rounded = size.checked_add((1u64 << (f - SL_LOG2)) - 1)?;
        let (f, s) = mapping(rounded);
        let sl_map = self.sl_bitmap[f] & (!0u32 << s);
        let (f, sl_map) = if sl_map != 0 {
            (f, sl_map)
        } else {
            let fl_map = if f + 1 >= 64 {
                0
            } else {
                self.fl_bitmap & (!0u64 << (f + 1))
            };
            if fl_map == 0 {
                return None;
            }
            let f = fl_map.trailing_zeros() as usize;
            (f, self.sl_bitmap[f])
        };
        Some(self.heads[f][sl_map.trailing_zeros() as usize])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_splits_octaves_in_32() {
        assert_eq!(mapping(512), (0, 0));
        assert_eq!(mapping(1023), (0, 31));
        assert_eq!(mapping(1024), (1, 0));
        assert_eq!(mapping(3 << 20), (12, 16));
        assert_eq!(mapping(u64::MAX), (FL - 1, 31));
    }

    #[test]
    fn found_run_always_fits() {
        let mut arena = Arena::default();
        let mut index = TlsfIndex::default();
        let sizes = [512u64, 1536, 4096, 5120, 1 << 20, (1 << 20) + 512, 7 << 20];
        for (i, &size) in sizes.iter().enumerate() {
            let slot = arena.new_free(i as u64 * (8 << 20), size, 0);
            index.insert(&mut arena, slot);
        }
        for request in (512..(8 << 20)).step_by(4608) {
            if let Some(slot) = index.find(&arena, request) {
                assert!(arena.get(slot).size >= request, "{request}");
            } else {
                assert!(request > (1 << 20) + 512, "{request}");
            }
        }
        assert_eq!(index.summary(&arena).largest, 7 << 20);
    }
}
