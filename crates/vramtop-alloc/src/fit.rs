//! The `best-fit`, `first-fit` and (with its own index) `tlsf` policies: one growing
//! address range, taken from the backing in segments of max(request rounded to 2 MiB,
//! 20 MiB). Each segment keeps its own free runs (segments need not be adjacent), but
//! the search runs across all of them; a free block coalesces with its free neighbours.
//! Split whenever the remainder is at least 512 B. Wholly free segments go back to the
//! backing on `empty_cache` and before an out-of-memory is reported.

use std::collections::BTreeMap;

use super::arena::{Arena, LiveInfo};
use super::heap::{FreeIndex, Heap};
use super::metrics::{FreeSummary, FreeTally};
use super::policy::{BackingCx, Placement, Policy, Shortfall};
use super::size_index::SizeIndex;
use super::types::{Pool, SegmentLayout};

const MIB: u64 = 1 << 20;
/// Growth step: segments are at least this large...
pub(crate) const GROW_MIN: u64 = 20 * MIB;
/// ...and otherwise the request rounded up to this.
pub(crate) const GROW_ROUND: u64 = 2 * MIB;

pub(crate) fn grow_size(size: u64) -> u64 {
    size.div_ceil(GROW_ROUND)
        .saturating_mul(GROW_ROUND)
        .max(GROW_MIN)
}

/// A free index that can also search.
pub(crate) trait FitIndex: FreeIndex + Default + Send {
    /// A free run of at least `size` bytes, per the policy's rule.
    fn find(&self, arena: &Arena, size: u64) -> Option<u32>;
}

impl FitIndex for SizeIndex {
    fn find(&self, arena: &Arena, size: u64) -> Option<u32> {
        SizeIndex::find(self, arena, size)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Fit<I> {
    heap: Heap<I>,
}

impl<I: FitIndex> Policy for Fit<I> {
    fn alloc(
        &mut self,
        size: u64,
        live: LiveInfo,
        cx: &mut BackingCx<'_>,
    ) -> Result<Placement, Shortfall> {
        let slot = match self.heap.index.find(&self.heap.arena, size) {
            Some(slot) => slot,
            None => {
                let segment = grow_size(size);
                let addr = cx.alloc_segment(segment)?;
                self.heap.add_segment(addr, segment, Pool::Range, None, 0)
            }
        };
        Ok(self.heap.take(slot, 0, size, true, live))
    }

    fn free(&mut self, node: u32, _cx: &mut BackingCx<'_>) {
        self.heap.give_back(node);
    }

    fn set_pending(&mut self, node: u32) {
        self.heap.set_pending(node);
    }

    fn release_cached(&mut self, cx: &mut BackingCx<'_>) -> u64 {
        self.heap.release_free_segments(cx)
    }

    fn free_summary(&self) -> FreeSummary {
        self.heap.free_summary()
    }

    fn layout(&self, out: &mut Vec<SegmentLayout>) {
        self.heap.segments.layout(&self.heap.arena, out);
    }

    fn arena(&self) -> &Arena {
        &self.heap.arena
    }
}

/// First fit: free runs by address within power-of-two size classes. Every run of a
/// higher class fits, so the answer is the lowest of those classes' first runs or an
/// earlier fitting run of the request's own class.
#[derive(Debug)]
pub(crate) struct AddrIndex {
    /// Per class: addr -> (size, node).
    classes: Vec<BTreeMap<u64, (u64, u32)>>,
    nonempty: u64,
    tally: FreeTally,
}

impl Default for AddrIndex {
    fn default() -> Self {
        AddrIndex {
            classes: vec![BTreeMap::new(); 64],
            nonempty: 0,
            tally: FreeTally::default(),
        }
    }
}

#[inline]
fn log2_class(size: u64) -> usize {
    63 - size.max(1).leading_zeros() as usize
}

impl FreeIndex for AddrIndex {
    fn insert(&mut self, arena: &mut Arena, slot: u32) {
        let node = arena.get(slot);
        let c = log2_class(node.size);
        self.tally.add(node.size);
        self.classes[c].insert(node.addr, (node.size, slot));
        self.nonempty |= 1 << c;
    }

    fn remove(&mut self, arena: &mut Arena, slot: u32) {
        let node = arena.get(slot);
        let c = log2_class(node.size);
        self.tally.remove(node.size);
        self.classes[c].remove(&node.addr);
        if self.classes[c].is_empty() {
            self.nonempty &= !(1 << c);
        }
    }

    fn summary(&self, _arena: &Arena) -> FreeSummary {
        let largest = match self.nonempty {
            0 => 0,
            bits => {
                let top = log2_class(bits);
                self.classes[top]
                    .values()
                    .map(|&(size, _)| size)
                    .max()
                    .unwrap_or(0)
            }
        };
        self.tally.summary(largest)
    }
}

impl FitIndex for AddrIndex {
    fn find(&self, _arena: &Arena, size: u64) -> Option<u32> {
        let c = log2_class(size);
        let mut best: Option<(u64, u32)> = None;
        let mut higher = if c >= 63 {
            0
        } else {
            self.nonempty & (!0u64 << (c + 1))
        };
        while higher != 0 {
            let k = higher.trailing_zeros() as usize;
            if let Some((&addr, &(_, slot))) = self.classes[k].first_key_value() {
                if best.is_none_or(|(b, _)| addr < b) {
                    best = Some((addr, slot));
                }
            }
            higher &= higher - 1;
        }
        let limit = best.map_or(u64::MAX, |(addr, _)| addr);
        let own = self.classes[c]
            .range(..limit)
            .find(|(_, &(run, _))| run >= size)
            .map(|(&addr, &(_, slot))| (addr, slot));
        own.or(best).map(|(_, slot)| slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_in_twenty_mib_or_rounded_request() {
        assert_eq!(grow_size(512), 20 * MIB);
        assert_eq!(grow_size(21 * MIB), 22 * MIB);
        assert!(grow_size(u64::MAX) >= GROW_MIN);
    }

    #[test]
    fn first_fit_takes_lowest_address() {
        let mut arena = Arena::default();
        let mut index = AddrIndex::default();
        for (addr, size) in [(0x9000, 8192), (0x1000, 1024), (0x5000, 4096)] {
            let slot = arena.new_free(addr, size, 0);
            index.insert(&mut arena, slot);
        }
        let addr_of = |s: Option<u32>, a: &Arena| s.map(|s| a.get(s).addr);
        assert_eq!(addr_of(index.find(&arena, 512), &arena), Some(0x1000));
        assert_eq!(addr_of(index.find(&arena, 2048), &arena), Some(0x5000));
        assert_eq!(addr_of(index.find(&arena, 4608), &arena), Some(0x9000));
        assert_eq!(index.find(&arena, 9000), None);
        assert_eq!(index.summary(&arena).largest, 8192);
    }
}
