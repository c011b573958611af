//! The `pytorch-expandable` policy: PyTorch's caching allocator run with
//! `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, rule for rule, so a replay
//! predicts what PyTorch itself would reserve. (`expandable` is the ideal page-mapped
//! allocator, the lower bound: it unmaps every idle page at once.) Each rule names the
//! function of c10/cuda/CUDACachingAllocator.cpp it comes from (later PyTorch keeps the
//! same code in c10/core/CachingDeviceAllocator.h):
//!
//! 1. Requests are rounded up to 512 B (`round_size`, without roundup_power2_divisions)
//!    and served from the small pool up to 1 MiB, else the large pool (`get_pool`). Both
//!    pools are expandable: `alloc_block` calls `try_allocate_expandable_block` for
//!    either.
//! 2. One expandable segment per pool and stream (`find_expandable_block` makes one for
//!    the request's stream; `BlockPool::unmapped` is ordered by stream, then address).
//!    Its address range is 1 1/8 of the device's memory (here: of the backing's
//!    capacity), in pages of 2 MiB for the small pool and 20 MiB for the large pool
//!    (`segment_size = pool->is_small ? kSmallBuffer : kLargeBuffer`, the
//!    `ExpandableSegment` constructor). No memory is mapped until a request needs it.
//! 3. A request first looks for a cached block (`get_free_block`): the smallest mapped
//!    free block of its pool and stream that fits, the lowest address among equal sizes
//!    (`BlockComparatorSize`); from there it moves on to larger blocks while the next
//!    one's expandable size (its size plus the unmapped block right after it) is smaller,
//!    which keeps the free block at the end of the mapped memory for requests that can
//!    grow into it. With `max_split_size` set, its two oversize rules apply.
//! 4. Otherwise the segment grows (`alloc_block` -> `try_allocate_expandable_block`):
//!    at the lowest-addressed unmapped block of the pool and stream, starting from the
//!    free block just before it if there is one, whose run of free and unmapped blocks
//!    has room (`find_expandable_block`), mapping just the pages the rounded request
//!    still lacks, not `get_allocation_size` (`map_block`, `ExpandableSegment::map`:
//!    whole pages from the unmapped block's start); new pages merge with free mapped
//!    neighbours. A new segment is made only when no unmapped block has room.
//! 5. The block is cut from the start of what was found and the rest split off whenever
//!    512 B or more remain, in both pools (`should_split` with expandable segments on,
//!    `alloc_found_block`).
//! 6. A free merges with free mapped neighbours and unmaps nothing (`free_block`;
//!    `try_merge_blocks` never merges a mapped block with an unmapped one).
//! 7. Pages are unmapped only by `empty_cache` and by the release-and-retry after a map
//!    failed for want of memory (`release_cached_blocks` -> `release_blocks` ->
//!    `unmap_block`): the whole pages inside each free block, large pool first; the
//!    partial pages at its ends stay mapped as free blocks. A segment left with one
//!    unmapped block is given back (`release_expandable_segment`).
//! 8. Reserved bytes are mapped pages (`map_block` and `unmap_block` keep
//!    `reserved_bytes`), which is what `memory_stats` and `memory_snapshot` report: the
//!    snapshot lists one segment per mapped range (`snapshot()`).
//!
//! The block map shows each segment from its start up to its last mapped page; pages that
//! `empty_cache` unmapped inside that span show as unmapped.
//!
//! Not modelled: CUDA graph pools, `recordStream` events (a deferred free stays held,
//! pending-free, until it completes; PyTorch's `empty_cache` would wait for it first),
//! `garbage_collection_threshold` and `roundup_power2_divisions`.

use std::collections::{BTreeMap, BTreeSet};

use super::arena::{plain_run, Arena, LiveInfo, NodeState, NIL};
use super::caching::{oversize_refused, pool_of, LARGE_BUFFER, SMALL_BUFFER};
use super::metrics::{FreeSummary, FreeTally};
use super::policy::{BackingCx, Placement, Policy, Shortfall};
use super::types::GRAIN;
use super::types::{BlockState, Pool, SegmentLayout, StreamId};

/// The free blocks of one pool and stream: PyTorch's `BlockPool` sets, restricted to
/// that stream (its comparators order by stream first).
#[derive(Debug)]
struct SubPool {
    pool: Pool,
    stream: StreamId,
    /// Mapped free blocks as (size, address, node): `BlockPool::blocks`.
    blocks: BTreeSet<(u64, u64, u32)>,
    /// Unmapped blocks by address: `BlockPool::unmapped`.
    unmapped: BTreeMap<u64, u32>,
}

/// One expandable segment: its reserved address range.
#[derive(Clone, Copy, Debug)]
struct SegmentRec {
    size: u64,
    /// The node at the segment's first byte (merges keep the lower node, so it stays).
    head: u32,
    /// Mapping granularity: 2 MiB (small pool) or 20 MiB (large pool).
    page: u64,
}

#[derive(Debug)]
pub(crate) struct PytorchExpandable {
    arena: Arena,
    /// Indexed by a node's `home`.
    subs: Vec<SubPool>,
    segments: BTreeMap<u64, SegmentRec>,
    /// Mapped free blocks, for `Stats`.
    tally: FreeTally,
    /// `max_split_size` (u64::MAX: unlimited, PyTorch's default).
    max_split_size: u64,
}

/// Page of a pool's segments: PyTorch's, raised to a multiple of the backing's page.
fn page_for(pool: Pool, backing_page: u64) -> u64 {
    let want = if pool == Pool::Small {
        SMALL_BUFFER
    } else {
        LARGE_BUFFER
    };
    let unit = backing_page.max(1);
    want.div_ceil(unit) * unit
}

impl PytorchExpandable {
    pub fn new(max_split_size: Option<u64>) -> Self {
        PytorchExpandable {
            arena: Arena::default(),
            subs: Vec::new(),
            segments: BTreeMap::new(),
            tally: FreeTally::default(),
            max_split_size: max_split_size.unwrap_or(u64::MAX),
        }
    }

    fn home(&mut self, pool: Pool, stream: StreamId) -> u32 {
        if let Some(i) = self
            .subs
            .iter()
            .position(|s| s.pool == pool && s.stream == stream)
        {
            return i as u32;
        }
        self.subs.push(SubPool {
            pool,
            stream,
            blocks: BTreeSet::new(),
            unmapped: BTreeMap::new(),
        });
        (self.subs.len() - 1) as u32
    }

    fn sub(&self, slot: u32) -> &SubPool {
        &self.subs[self.arena.get(slot).home() as usize]
    }

    fn is_unmapped(&self, slot: u32) -> bool {
        let node = self.arena.get(slot);
        node.state() == NodeState::Free && self.sub(slot).unmapped.get(&node.addr) == Some(&slot)
    }

    /// Not allocated and not held by a stream: mapped or not (`allocatable` in
    /// `find_expandable_block`).
    fn allocatable(&self, slot: u32) -> bool {
        slot != NIL && self.arena.get(slot).state() == NodeState::Free
    }

    fn is_free_mapped(&self, slot: u32) -> bool {
        self.allocatable(slot) && !self.is_unmapped(slot)
    }

    fn index_insert(&mut self, slot: u32) {
        let node = self.arena.get(slot);
        let (size, addr, home) = (node.size, node.addr, node.home() as usize);
        self.subs[home].blocks.insert((size, addr, slot));
        self.tally.add(size);
    }

    fn index_remove(&mut self, slot: u32) {
        let node = self.arena.get(slot);
        let (size, addr, home) = (node.size, node.addr, node.home() as usize);
        if self.subs[home].blocks.remove(&(size, addr, slot)) {
            self.tally.remove(size);
        }
    }

    /// A free block's size plus the unmapped block right after it.
    fn expandable_size(&self, slot: u32) -> u64 {
        let node = self.arena.get(slot);
        let grow = if node.next != NIL && self.is_unmapped(node.next) {
            self.arena.get(node.next).size
        } else {
            0
        };
        node.size + grow
    }

    /// `get_free_block`: best fit, then on to larger blocks while their expandable size
    /// shrinks; the max_split_size rules last.
    fn get_free_block(&self, home: u32, size: u64) -> Option<u32> {
        let mut fits = self.subs[home as usize].blocks.range((size, 0, 0)..);
        let mut best = *fits.next()?;
        for &next in fits {
            if self.expandable_size(next.2) < self.expandable_size(best.2) {
                best = next;
            } else {
                break;
            }
        }
        (!oversize_refused(size, best.0, self.max_split_size)).then_some(best.2)
    }

    /// Folds free mapped neighbours into `slot` (free, mapped, not indexed); returns the
    /// surviving node, not indexed either.
    fn merge_free(&mut self, slot: u32) -> u32 {
        let mut slot = slot;
        let next = self.arena.get(slot).next;
        if self.is_free_mapped(next) {
            self.index_remove(next);
            self.arena.absorb_next(slot);
        }
        let prev = self.arena.get(slot).prev;
        if self.is_free_mapped(prev) {
            self.index_remove(prev);
            self.arena.absorb_next(prev);
            slot = prev;
        }
        slot
    }

    /// `has_available_address_space`: free and unmapped blocks from `start` on add up
    /// to `size`.
    fn has_room(&self, start: u32, size: u64) -> bool {
        let (mut bytes, mut slot) = (0u64, start);
        while bytes < size && self.allocatable(slot) {
            let node = self.arena.get(slot);
            bytes += node.size;
            slot = node.next;
        }
        bytes >= size
    }

    /// `find_expandable_block`: the lowest-addressed place with room, else a new segment.
    fn find_expandable_block(
        &mut self,
        home: u32,
        size: u64,
        cx: &mut BackingCx<'_>,
    ) -> Result<u32, Shortfall> {
        let found = self.subs[home as usize]
            .unmapped
            .values()
            .map(|&slot| {
                let prev = self.arena.get(slot).prev;
                if self.allocatable(prev) {
                    prev
                } else {
                    slot
                }
            })
            .find(|&start| self.has_room(start, size));
        if let Some(start) = found {
            return Ok(start);
        }
        let page = page_for(self.subs[home as usize].pool, cx.page_size());
        let capacity = cx.capacity();
        let span = capacity.saturating_add(capacity / 8).max(size);
        let reserve = span.div_ceil(page).saturating_mul(page);
        let base = cx.reserve_range(reserve)?;
        let slot = self.arena.new_free(base, reserve, home);
        self.subs[home as usize].unmapped.insert(base, slot);
        self.segments.insert(
            base,
            SegmentRec {
                size: reserve,
                head: slot,
                page,
            },
        );
        Ok(slot)
    }

    fn segment_at(&self, addr: u64) -> Option<(u64, SegmentRec)> {
        self.segments
            .range(..=addr)
            .next_back()
            .map(|(&base, &rec)| (base, rec))
    }

    /// `map_block`: maps the whole pages covering the first `size` bytes of unmapped
    /// `slot`, splits off the unmapped rest, merges with free mapped neighbours and
    /// indexes the result, which it returns.
    fn map_block(
        &mut self,
        slot: u32,
        size: u64,
        cx: &mut BackingCx<'_>,
    ) -> Result<u32, Shortfall> {
        let (addr, have) = {
            let node = self.arena.get(slot);
            (node.addr, node.size)
        };
        let page = self
            .segment_at(addr)
            .map(|(_, rec)| rec.page)
            .ok_or_else(|| Shortfall::Backing(format!("no segment holds {addr:#x}")))?;
        let mapped = size.div_ceil(page).saturating_mul(page).min(have);
        cx.map_pages(addr, mapped)?;
        let home = self.arena.get(slot).home() as usize;
        self.subs[home].unmapped.remove(&addr);
        if mapped < have {
            let rest = self.arena.split(slot, mapped);
            self.subs[home].unmapped.insert(addr + mapped, rest);
        }
        let merged = self.merge_free(slot);
        self.index_insert(merged);
        Ok(merged)
    }

    /// `try_allocate_expandable_block`: a free mapped node (taken out of the index) of
    /// at least `size` bytes, mapping pages as needed.
    fn try_allocate_expandable_block(
        &mut self,
        home: u32,
        size: u64,
        cx: &mut BackingCx<'_>,
    ) -> Result<u32, Shortfall> {
        let mut candidate = self.find_expandable_block(home, size, cx)?;
        if self.is_unmapped(candidate) {
            let have = self.arena.get(candidate).size;
            candidate = self.map_block(candidate, have.min(size), cx)?;
        }
        while self.arena.get(candidate).size < size {
            let remaining = size - self.arena.get(candidate).size;
            let next = self.arena.get(candidate).next;
            if next == NIL || !self.is_unmapped(next) {
                return Err(Shortfall::Backing(
                    "expandable segment: no unmapped block after a free one that had room"
                        .to_string(),
                ));
            }
            let want = remaining.min(self.arena.get(next).size);
            candidate = self.map_block(next, want, cx)?;
        }
        self.index_remove(candidate);
        Ok(candidate)
    }

    /// `alloc_found_block`: the block at the start of free node `slot` (not indexed),
    /// the rest split off when 512 B or more remain.
    fn take(&mut self, slot: u32, size: u64, live: LiveInfo) -> Placement {
        if self.arena.get(slot).size - size >= GRAIN {
            let rest = self.arena.split(slot, size);
            self.index_insert(rest);
        }
        let node = self.arena.get_mut(slot);
        node.set_state(NodeState::Allocated);
        node.set_live(live);
        Placement {
            node: slot,
            addr: node.addr,
            size: node.size,
        }
    }

    /// `unmap_block`: unmaps the whole pages inside free mapped `slot`; the partial
    /// pages at its ends stay as free blocks. Returns the unmapped node after merging
    /// with unmapped neighbours, or `None` when no whole page was inside (or the
    /// backing refused, which leaves the block mapped and cached).
    fn unmap_block(&mut self, slot: u32, cx: &mut BackingCx<'_>) -> Option<u32> {
        let (addr, size, home) = {
            let node = self.arena.get(slot);
            (node.addr, node.size, node.home() as usize)
        };
        let (base, rec) = self.segment_at(addr)?;
        let offset = addr - base;
        let begin = base + offset.div_ceil(rec.page) * rec.page;
        let end = base + (offset + size) / rec.page * rec.page;
        if begin >= end || cx.unmap_pages(begin, end - begin).is_err() {
            return None;
        }
        self.index_remove(slot);
        let mut target = slot;
        if begin > addr {
            target = self.arena.split(slot, begin - addr);
            self.index_insert(slot);
        }
        if end < addr + size {
            let after = self.arena.split(target, end - begin);
            self.index_insert(after);
        }
        self.subs[home].unmapped.insert(begin, target);
        let next = self.arena.get(target).next;
        if next != NIL && self.is_unmapped(next) {
            let next_addr = self.arena.get(next).addr;
            self.subs[home].unmapped.remove(&next_addr);
            self.arena.absorb_next(target);
        }
        let prev = self.arena.get(target).prev;
        if prev != NIL && self.is_unmapped(prev) {
            self.subs[home].unmapped.remove(&begin);
            self.arena.absorb_next(prev);
            target = prev;
        }
        Some(target)
    }

    /// `release_expandable_segment`: gives back a segment that is one unmapped block.
    fn release_segment(&mut self, slot: u32, cx: &mut BackingCx<'_>) -> bool {
        let node = self.arena.get(slot);
        if node.prev != NIL || node.next != NIL {
            return false;
        }
        let (base, size, home) = (node.addr, node.size, node.home() as usize);
        let whole = self.segments.get(&base).is_some_and(|rec| rec.size == size);
        if !whole || cx.backing.release_range(base, size).is_err() {
            return false;
        }
        self.subs[home].unmapped.remove(&base);
        self.arena.release(slot);
        self.segments.remove(&base);
        true
    }

    /// The run the block map draws for node `slot`.
    fn run_of(&self, slot: u32) -> super::types::LayoutRun {
        let node = self.arena.get(slot);
        if node.state().is_live() {
            self.arena
                .live_run(slot, node.addr, node.size, node.state())
        } else if self.is_unmapped(slot) {
            plain_run(node.addr, node.size, BlockState::Unmapped)
        } else {
            plain_run(node.addr, node.size, BlockState::Free)
        }
    }
}

impl Policy for PytorchExpandable {
    fn alloc(
        &mut self,
        size: u64,
        live: LiveInfo,
        cx: &mut BackingCx<'_>,
    ) -> Result<Placement, Shortfall> {
        let pool = pool_of(size);
        let home = self.home(pool, live.stream);
        let slot = match self.get_free_block(home, size) {
            Some(slot) => {
                self.index_remove(slot);
                slot
            }
            None => self.try_allocate_expandable_block(home, size, cx)?,
        };
        Ok(self.take(slot, size, live))
    }

    fn free(&mut self, node: u32, _cx: &mut BackingCx<'_>) {
        self.arena.get_mut(node).set_state(NodeState::Free);
        let merged = self.merge_free(node);
        self.index_insert(merged);
    }

    fn set_pending(&mut self, node: u32) {
        self.arena.get_mut(node).set_state(NodeState::PendingFree);
    }

    /// `release_cached_blocks`: unmaps the whole pages of every free block, large pool
    /// first, each pool's blocks in (stream, size, address) order; returns the unmapped
    /// ranges plus the segments given back. A CUDA graph's pool keeps its pages.
    fn release_cached(&mut self, cx: &mut BackingCx<'_>) -> u64 {
        let mut order: Vec<(u8, StreamId, u64, u64, u32)> = Vec::new();
        for sub in self
            .subs
            .iter()
            .filter(|s| !crate::types::in_graph_pool(s.stream))
        {
            let rank = u8::from(sub.pool == Pool::Small);
            order.extend(
                sub.blocks
                    .iter()
                    .map(|&(size, addr, slot)| (rank, sub.stream, size, addr, slot)),
            );
        }
        order.sort_unstable();
        let mut released = 0;
        for (_, _, _, _, slot) in order {
            // Unmapping only merges unmapped nodes, so every slot gathered here is
            // still the free mapped block it was.
            if let Some(unmapped) = self.unmap_block(slot, cx) {
                released += 1;
                released += u64::from(self.release_segment(unmapped, cx));
            }
        }
        released
    }

    fn free_summary(&self) -> FreeSummary {
        let largest = self
            .subs
            .iter()
            .filter_map(|s| s.blocks.iter().next_back().map(|&(size, _, _)| size))
            .max()
            .unwrap_or(0);
        self.tally.summary(largest)
    }

    fn layout(&self, out: &mut Vec<SegmentLayout>) {
        for (&base, rec) in &self.segments {
            let mut runs = Vec::new();
            let mut mapped_runs = 0;
            let mut slot = rec.head;
            while slot != NIL {
                let run = self.run_of(slot);
                let mapped = run.state != BlockState::Unmapped;
                runs.push(run);
                if mapped {
                    mapped_runs = runs.len();
                }
                slot = self.arena.get(slot).next;
            }
            // Up to the last mapped page, as `memory_snapshot` reports the segment.
            runs.truncate(mapped_runs);
            let Some(last) = runs.last() else { continue };
            let sub = self.sub(rec.head);
            out.push(SegmentLayout {
                addr: base,
                size: last.addr + last.size - base,
                pool: sub.pool,
                stream: Some(sub.stream),
                runs,
            });
        }
    }

    fn arena(&self) -> &Arena {
        &self.arena
    }
}

#[cfg(test)]
mod tests;
