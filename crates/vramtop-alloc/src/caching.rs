//! The `caching` policy, after PyTorch's CUDA caching allocator
//! (c10/cuda/CUDACachingAllocator.cpp): a small pool (requests <= 1 MiB, 2 MiB
//! segments) and a large pool (20 MiB segments below 10 MiB, else the request rounded
//! to 2 MiB), best fit keyed by (stream, size), split rules and `max_split_size` as
//! there, coalescing only within a segment, segments cached until `empty_cache`.
//!
//! With `garbage_collection_threshold` (PyTorch acts on it only under a memory fraction;
//! the backing's capacity is then the allowed maximum), a request that finds no cached
//! block first releases wholly free large segments, the longest unused first, as
//! `garbage_collect_cached_blocks` does.
//!
//! Among free blocks of equal size PyTorch takes the lowest address, and so does this
//! (`SizeIndex::lowest_address_first`); which block is lowest follows the backing's
//! addresses, which a replay takes from the trace where it can (`Backing::hint_segment`).

use crate::hash::AddrMap;

use super::arena::{Arena, LiveInfo, NIL};
use super::heap::{FreeIndex, Heap};
use super::metrics::FreeSummary;
use super::policy::{BackingCx, Placement, Policy, Shortfall};
use super::size_index::SizeIndex;
use super::types::GRAIN;
use super::types::{Pool, SegmentLayout, StreamId};

const MIB: u64 = 1 << 20;
/// Largest request served from the small pool (kSmallSize).
pub(crate) const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool (kSmallBuffer).
pub(crate) const SMALL_BUFFER: u64 = 2 * MIB;
/// Segment size for large requests under `MIN_LARGE_ALLOC` (kLargeBuffer).
pub(crate) const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests from here on get a segment of their own size (kMinLargeAlloc).
pub(crate) const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding of such segments (kRoundLarge).
pub(crate) const ROUND_LARGE: u64 = 2 * MIB;

/// The pool a rounded request is served from (PyTorch: small up to 1 MiB, else large).
pub(crate) fn pool_of(size: u64) -> Pool {
    if size <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// PyTorch's `max_split_size` rules in get_free_block: a cached block of `found` bytes is
/// refused to a request of `size` when it is oversize and the request is not, or when both
/// are oversize and the block is larger by a large buffer (20 MiB) or more.
pub(crate) fn oversize_refused(size: u64, found: u64, max_split_size: u64) -> bool {
    (size < max_split_size && found >= max_split_size)
        || (size >= max_split_size && found >= size.saturating_add(LARGE_BUFFER))
}

/// Segment size PyTorch asks cudaMalloc for, given a rounded request.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// One best-fit index per (pool, stream); a node's `home` names its index.
#[derive(Debug, Default)]
pub(crate) struct PoolIndex {
    keys: Vec<(Pool, StreamId)>,
    subs: Vec<SizeIndex>,
}

impl PoolIndex {
    fn home(&mut self, pool: Pool, stream: StreamId) -> u32 {
        if let Some(i) = self.keys.iter().position(|&k| k == (pool, stream)) {
            return i as u32;
        }
        // Nodes keep `home` in 30 bits; a billion (pool, stream) indexes would take
        // 32 TB of bitmaps first.
        self.keys.push((pool, stream));
        self.subs.push(SizeIndex::lowest_address_first());
        (self.keys.len() - 1) as u32
    }
}

impl FreeIndex for PoolIndex {
    fn insert(&mut self, arena: &mut Arena, slot: u32) {
        let home = arena.get(slot).home() as usize;
        self.subs[home].insert(arena, slot);
    }

    fn remove(&mut self, arena: &mut Arena, slot: u32) {
        let home = arena.get(slot).home() as usize;
        self.subs[home].remove(arena, slot);
    }

    fn summary(&self, arena: &Arena) -> FreeSummary {
        let mut total = FreeSummary::default();
        for sub in &self.subs {
            total.merge(&sub.summary(arena));
        }
        total
    }
}

#[derive(Debug)]
pub(crate) struct Caching {
    heap: Heap<PoolIndex>,
    /// Blocks at least this large are never split (u64::MAX: unlimited).
    max_split_size: u64,
    /// roundup_power2_divisions per interval (all 0: plain 512 B rounding).
    divisions: [u32; 16],
    /// The garbage collector, when a threshold is set.
    gc: Option<GarbageCollector>,
}

/// PyTorch's `garbage_collect_cached_blocks`: a block's age is how many searches of the
/// large pool (`get_free_blocks_call_count`) went by since it was last put back.
#[derive(Debug)]
struct GarbageCollector {
    threshold: f64,
    searches: u64,
    /// Wholly free large segments by address: the search count when they became free.
    freed_at: AddrMap<u64>,
}

/// PyTorch's round_size: 512 B granules, or with `roundup_power2_divisions` the next of
/// `divisions` equal steps between two powers of two (CUDACachingAllocator.cpp
/// `round_size`, `roundup_power2_next_division`, `CUDAAllocatorConfig::
/// roundup_power2_divisions`: 16 intervals from 1 MiB up).
pub fn round_size(size: u64, divisions: &[u32; 16]) -> Option<u64> {
    if size < GRAIN {
        return Some(GRAIN);
    }
    let log_size = 63 - u64::from(size.leading_zeros());
    let index = (log_size.saturating_sub(20) as usize).min(divisions.len() - 1);
    let d = u64::from(divisions[index]);
    if d > 1 && size > GRAIN.saturating_mul(d) {
        if size.is_power_of_two() {
            return Some(size);
        }
        let floor = 1u64 << log_size;
        let step = floor >> (63 - d.leading_zeros());
        if step == 0 {
            return floor.checked_mul(2);
        }
        let down = size & !(step - 1);
        return if down == size {
            Some(size)
        } else {
            down.checked_add(step)
        };
    }
    size.checked_next_multiple_of(GRAIN)
}

impl Caching {
    /// A segment of its own for the request (PyTorch's `alloc_block`), and the block in it.
    fn new_segment(
        &mut self,
        size: u64,
        live: LiveInfo,
        cx: &mut BackingCx<'_>,
    ) -> Result<Placement, Shortfall> {
        let pool = pool_of(size);
        let home = self.heap.index.home(pool, live.stream);
        let segment = allocation_size(size);
        let addr = cx.alloc_segment(segment)?;
        let slot = self
            .heap
            .add_segment(addr, segment, pool, Some(live.stream), home);
        Ok(self.take(slot, pool, size, live))
    }

    pub fn new(max_split_size: Option<u64>) -> Self {
        Caching {
            heap: Heap::default(),
            max_split_size: max_split_size.unwrap_or(u64::MAX),
            divisions: [0; 16],
            gc: None,
        }
    }

    /// PyTorch's `garbage_collection_threshold` (0 < t < 1), for a job under a memory
    /// fraction: the backing's capacity stands for the allowed maximum.
    pub fn with_gc_threshold(mut self, threshold: Option<f64>) -> Self {
        self.gc = threshold
            .filter(|t| *t > 0.0 && *t < 1.0)
            .map(|threshold| GarbageCollector {
                threshold,
                searches: 0,
                freed_at: AddrMap::default(),
            });
        self
    }

    /// garbage_collect_cached_blocks: once reserved passes threshold x allowed, release
    /// the wholly free large segments at least as old as their average, again and again,
    /// until what was released covers the excess or nothing more goes. Each pass releases
    /// all it picks (PyTorch does not stop mid-pass), so their order does not matter.
    fn collect_garbage(&mut self, cx: &mut BackingCx<'_>) {
        let Some(gc) = &self.gc else { return };
        let limit = (gc.threshold * cx.backing.capacity() as f64) as u64;
        let reserved = cx.counters.reserved;
        if reserved <= limit {
            return;
        }
        let target = reserved - limit;
        let mut freeable: Vec<_> = self
            .heap
            .idle_segments()
            .into_iter()
            .filter(|(_, rec)| rec.pool != Pool::Small && !rec.in_graph_pool())
            .map(|(addr, rec)| {
                let age = gc.searches - gc.freed_at.get(&addr).copied().unwrap_or(0);
                (addr, rec, age)
            })
            .collect();
        let mut reclaimed = 0;
        while reclaimed < target && !freeable.is_empty() {
            let total: u64 = freeable.iter().map(|f| f.2).sum();
            let average = total as f64 / freeable.len() as f64;
            let (old, young): (Vec<_>, Vec<_>) =
                freeable.into_iter().partition(|f| f.2 as f64 >= average);
            let mut freed_any = false;
            for (addr, rec, _) in old {
                if self.heap.release_segment(addr, rec, cx) {
                    reclaimed += rec.size;
                    freed_any = true;
                }
            }
            freeable = young;
            if !freed_any {
                break;
            }
        }
    }

    /// A free large block that covers its whole segment starts its age now.
    fn note_free(&mut self, slot: u32) {
        let Some(gc) = &mut self.gc else { return };
        let node = self.heap.arena.get(slot);
        let whole = node.prev == NIL && node.next == NIL;
        let large = self
            .heap
            .segments
            .map
            .get(&node.addr)
            .is_some_and(|rec| rec.pool != Pool::Small);
        if whole && large {
            gc.freed_at.insert(node.addr, gc.searches);
        }
    }

    pub fn with_roundup(mut self, divisions: [u32; 16]) -> Self {
        self.divisions = divisions;
        self
    }

    /// get_free_block: the smallest cached block of this stream and pool that fits,
    /// unless max_split_size rules it out.
    fn find(&self, home: u32, size: u64) -> Option<u32> {
        let slot = self.heap.index.subs[home as usize].find(&self.heap.arena, size)?;
        let found = self.heap.arena.get(slot).size;
        (!oversize_refused(size, found, self.max_split_size)).then_some(slot)
    }

    /// should_split: small pool keeps remainders >= 512 B, large pool > 1 MiB, and
    /// requests of max_split_size or more never split.
    fn should_split(&self, pool: Pool, size: u64, found: u64) -> bool {
        let remaining = found - size;
        match pool {
            Pool::Small => remaining >= GRAIN,
            _ => size < self.max_split_size && remaining > SMALL_SIZE,
        }
    }

    fn take(&mut self, slot: u32, pool: Pool, size: u64, live: LiveInfo) -> Placement {
        let split = self.should_split(pool, size, self.heap.arena.get(slot).size);
        self.heap.take(slot, 0, size, split, live)
    }
}

impl Policy for Caching {
    fn round(&self, size: u64) -> Option<u64> {
        round_size(size, &self.divisions)
    }

    fn alloc(
        &mut self,
        size: u64,
        live: LiveInfo,
        cx: &mut BackingCx<'_>,
    ) -> Result<Placement, Shortfall> {
        let pool = pool_of(size);
        let home = self.heap.index.home(pool, live.stream);
        // PyTorch counts the searches of each pool apart (`get_free_blocks_call_count`), and
        // its collector ages the job's own large blocks by their pool's count: a search of
        // a CUDA graph's private pool ages none of them.
        let own_large = pool == Pool::Large && !crate::types::in_graph_pool(live.stream);
        if let Some(gc) = self.gc.as_mut().filter(|_| own_large) {
            gc.searches += 1;
        }
        if let Some(slot) = self.find(home, size) {
            return Ok(self.take(slot, pool, size, live));
        }
        self.collect_garbage(cx);
        self.new_segment(size, live, cx)
    }

    /// No second search and no second collection: PyTorch searches the pool (counting it
    /// for the GC's ages) and collects garbage once a request, before its first cudaMalloc.
    fn alloc_after_release(
        &mut self,
        size: u64,
        live: LiveInfo,
        cx: &mut BackingCx<'_>,
    ) -> Result<Placement, Shortfall> {
        self.new_segment(size, live, cx)
    }

    fn free(&mut self, node: u32, _cx: &mut BackingCx<'_>) {
        let slot = self.heap.give_back(node);
        self.note_free(slot);
    }

    fn set_pending(&mut self, node: u32) {
        self.heap.set_pending(node);
    }

    fn release_cached(&mut self, cx: &mut BackingCx<'_>) -> u64 {
        self.heap.release_free_segments(cx)
    }

    /// `release_available_cached_blocks`: the smallest cached oversize segment of the
    /// request's pool and stream that holds max(size, max_split_size); failing one, the
    /// largest ones down until they add up to that (released even when they do not).
    fn release_available(&mut self, size: u64, stream: StreamId, cx: &mut BackingCx<'_>) -> bool {
        if self.max_split_size == u64::MAX {
            return false;
        }
        let key = size.max(self.max_split_size);
        let pool = pool_of(size);
        // Oversize blocks are never split: the free ones are wholly free segments.
        let mut oversize: Vec<(u64, crate::arena::SegmentRec)> = self
            .heap
            .idle_segments()
            .into_iter()
            .filter(|(_, rec)| {
                rec.pool == pool && rec.stream == Some(stream) && rec.size >= self.max_split_size
            })
            .collect();
        oversize.sort_by_key(|&(addr, rec)| (rec.size, addr));
        if let Some(&(addr, rec)) = oversize.iter().find(|(_, rec)| rec.size >= key) {
            return self.heap.release_segment(addr, rec, cx);
        }
        let mut released = 0u64;
        for &(addr, rec) in oversize.iter().rev() {
            if released >= key {
                break;
            }
            if self.heap.release_segment(addr, rec, cx) {
                released += rec.size;
            }
        }
        released >= key
    }

    fn free_summary(&self) -> FreeSummary {
        self.heap.free_summary()
    }

    fn layout(&self, out: &mut Vec<SegmentLayout>) {
        self.heap.segments.layout(&self.heap.arena, out);
    }

    fn adopt(
        &mut self,
        addr: u64,
        size: u64,
        pool: Pool,
        stream: StreamId,
        blocks: &[(u64, u64, LiveInfo)],
    ) -> Option<Vec<Placement>> {
        let home = self.heap.index.home(pool, stream);
        Some(
            self.heap
                .adopt(addr, size, pool, Some(stream), home, blocks),
        )
    }

    fn can_adopt(&self) -> bool {
        true
    }

    fn arena(&self) -> &Arena {
        &self.heap.arena
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a 1,000 MiB cap with the GC at 0.6: A (150 MiB) freed long ago and B
    /// (100 MiB) freed recently are both cached when the next request finds no cached block
    /// (the first small one). Reserved (650) is 50 past the threshold (600): PyTorch
    /// releases the blocks at least as old as their average age first, and stops once that
    /// covers the excess: A goes, B stays.
    #[test]
    fn garbage_collection_releases_the_oldest_free_segments_first() {
        use crate::backing::BookkeepingBacking;
        use crate::{AllocConfig, Allocator, PolicyKind};
        let run = |gc: Option<f64>| {
            let config = AllocConfig {
                garbage_collection_threshold: gc,
                ..AllocConfig::default()
            };
            let backing = Box::new(BookkeepingBacking::new(1000 * MIB));
            let a = Allocator::new(PolicyKind::Caching, backing, config);
            let block_a = a.alloc(150 * MIB, 0, "a").unwrap();
            let block_b = a.alloc(100 * MIB, 0, "b").unwrap();
            a.free(&block_a).unwrap(); // age counted from search 2
            let _e = a.alloc(200 * MIB, 0, "e").unwrap();
            let _f = a.alloc(200 * MIB, 0, "f").unwrap();
            a.free(&block_b).unwrap(); // from search 4
            let small: Vec<_> = (0..8).map(|_| a.alloc(512, 0, "s").unwrap()).collect();
            let _h = a.alloc(160 * MIB, 0, "h").unwrap();
            let free_segments: Vec<u64> = a
                .layout()
                .segments
                .iter()
                .filter(|s| s.runs.iter().all(|r| r.state == crate::BlockState::Free))
                .map(|s| s.size / MIB)
                .collect();
            drop(small);
            (a.stats().reserved_bytes / MIB, free_segments)
        };
        // 150 + 100 + 200 + 200 + 2 (small pool) - 150 + 160
        assert_eq!(run(Some(0.6)), (662, vec![100]));
        // Without it both stay cached: 812 reserved.
        assert_eq!(run(None), (812, vec![150, 100]));
    }

    /// The collector's ages count the job's own large-pool searches only. A (150 MiB) is
    /// freed, then a CUDA graph's pool is searched 20 times, then B (100) and, after two
    /// more requests, C (50) are freed; a 160 MiB request finds no cached block with 710
    /// MiB reserved under 1,000 at 0.6 (110 over). By the job's own searches A and B are
    /// equally old (3) and C younger (1): A and B go in one pass. Counting the pool's
    /// searches made A far older than B (23 against 3), and A alone went.
    #[test]
    fn a_graph_pools_searches_do_not_age_the_jobs_blocks() {
        use crate::backing::BookkeepingBacking;
        use crate::{AllocConfig, Allocator, PolicyKind, GRAPH_POOL};
        let config = AllocConfig {
            garbage_collection_threshold: Some(0.6),
            ..AllocConfig::default()
        };
        let a = Allocator::new(
            PolicyKind::Caching,
            Box::new(BookkeepingBacking::new(1000 * MIB)),
            config,
        );
        let block_a = a.alloc(150 * MIB, 0, "a").unwrap();
        let block_b = a.alloc(100 * MIB, 0, "b").unwrap();
        let block_c = a.alloc(50 * MIB, 0, "c").unwrap();
        a.free(&block_a).unwrap();
        for _ in 0..20 {
            let in_pool = a.alloc(10 * MIB, GRAPH_POOL | 1, "graph").unwrap();
            a.free(&in_pool).unwrap();
        }
        a.free(&block_b).unwrap();
        let _d = a.alloc(200 * MIB, 0, "d").unwrap();
        let _e = a.alloc(200 * MIB, 0, "e").unwrap();
        a.free(&block_c).unwrap();
        let _h = a.alloc(160 * MIB, 0, "h").unwrap();
        let cached: Vec<u64> = a
            .layout()
            .segments
            .iter()
            .filter(|s| s.runs.iter().all(|r| r.state == crate::BlockState::Free))
            .map(|s| s.size / MIB)
            .filter(|&mib| mib >= 50)
            .collect();
        // 150 + 100 + 50 + 10 (the pool's) + 200 + 200 - 150 - 100 + 160
        assert_eq!((a.stats().reserved_bytes / MIB, cached), (620, vec![50]));
    }

    /// Under a 1,000 MiB cap with max_split_size_mb:100: 400 and 300 MiB segments cached,
    /// 250 MiB live, 720 MiB asked. No cached oversize segment holds it, so PyTorch's
    /// release_available_cached_blocks frees the largest down (400, then 300) and, 700 MiB
    /// being short of 720, answers false; release_cached_blocks then answers true with
    /// nothing left to free, and the retried cudaMalloc fits (250 + 720). A replay that
    /// gave up when that last release freed nothing failed this request where PyTorch
    /// served it (gpt2mixed with max_split_size_mb:1024, replayed from its own history).
    #[test]
    fn oversize_segments_released_short_of_the_request_still_make_room() {
        use crate::backing::BookkeepingBacking;
        use crate::{AllocConfig, Allocator, PolicyKind};
        let config = AllocConfig {
            max_split_size: Some(100 * MIB),
            ..AllocConfig::default()
        };
        let backing = Box::new(BookkeepingBacking::new(1000 * MIB));
        let a = Allocator::new(PolicyKind::Caching, backing, config);
        let first = a.alloc(400 * MIB, 0, "a").unwrap();
        let second = a.alloc(300 * MIB, 0, "b").unwrap();
        let _kept = a.alloc(250 * MIB, 0, "c").unwrap();
        a.free(&first).unwrap();
        a.free(&second).unwrap();
        let served = a.alloc(720 * MIB, 0, "d");
        assert!(served.is_ok(), "{served:?}");
        assert_eq!(a.stats().reserved_bytes, 970 * MIB);
    }

    /// A CUDA graph's private pool (`GRAPH_POOL`) keeps its free segments while its graph
    /// lives: under a 1,000 MiB cap with 600 MiB cached in a graph's pool, a 500 MiB
    /// request of the job's own finds no room (PyTorch releases the default pools only),
    /// and `empty_cache()` leaves the pool's segment where it was. A stream's cache is
    /// released as before.
    #[test]
    fn a_graphs_pool_keeps_its_free_segments() {
        use crate::backing::BookkeepingBacking;
        use crate::{AllocConfig, Allocator, PolicyKind, GRAPH_POOL};
        for policy in [PolicyKind::Caching, PolicyKind::PytorchExpandable] {
            for (stream, served) in [(GRAPH_POOL | 1, false), (7, true)] {
                let backing = Box::new(BookkeepingBacking::new(1000 * MIB));
                let a = Allocator::new(policy, backing, AllocConfig::default());
                let captured = a.alloc(600 * MIB, stream, "captured").unwrap();
                a.free(&captured).unwrap();
                let asked = a.alloc(500 * MIB, 0, "job");
                assert_eq!(asked.is_ok(), served, "{policy:?} {stream}: {asked:?}");
                if let Ok(block) = asked {
                    a.free(&block).unwrap();
                }
                a.empty_cache();
                let left = a.stats().reserved_bytes;
                assert_eq!(left >= 600 * MIB, !served, "{policy:?} {stream}: {left}");
            }
        }
    }

    /// A request into a graph's pool is made while the graph is captured, and PyTorch
    /// releases no cached segment then (`captures_underway`): 600 MiB cached by the job
    /// stays, and 500 MiB asked into the pool under a 1,000 MiB cap runs out; asked on
    /// another stream, the cache is released and it is served.
    #[test]
    fn a_request_made_while_a_graph_is_captured_releases_nothing() {
        use crate::backing::BookkeepingBacking;
        use crate::{AllocConfig, Allocator, PolicyKind, GRAPH_POOL};
        for (stream, served) in [(GRAPH_POOL | 1, false), (7, true)] {
            let backing = Box::new(BookkeepingBacking::new(1000 * MIB));
            let a = Allocator::new(PolicyKind::Caching, backing, AllocConfig::default());
            let cached = a.alloc(600 * MIB, 0, "job").unwrap();
            a.free(&cached).unwrap();
            let asked = a.alloc(500 * MIB, stream, "captured");
            assert_eq!(asked.is_ok(), served, "{stream}: {asked:?}");
        }
    }

    /// PyTorch searches the pool once a request (`get_free_block`, the GC's clock) and
    /// collects garbage once, before its first cudaMalloc; the retries after releasing
    /// cached segments are cudaMalloc alone. A second search would age every cached block
    /// one step more than PyTorch does.
    #[test]
    fn a_retry_after_releasing_cached_segments_neither_searches_nor_collects_again() {
        use crate::arena::LiveInfo;
        use crate::backing::BookkeepingBacking;
        use crate::events::EventRing;
        use crate::metrics::Counters;
        let mut policy = Caching::new(None).with_gc_threshold(Some(0.6));
        let mut backing = BookkeepingBacking::new(1000 * MIB);
        let mut counters = Counters::default();
        let events = EventRing::new(16);
        let mut cx = BackingCx {
            backing: &mut backing,
            counters: &mut counters,
            events: &events,
            now_ns: 0,
            stream: 0,
        };
        let live = LiveInfo {
            id: 1,
            requested: 100 * MIB,
            stream: 0,
            tag: crate::types::TagId(0),
            born_ns: 0,
        };
        let searches = |p: &Caching| p.gc.as_ref().map(|gc| gc.searches);
        policy.alloc(100 * MIB, live, &mut cx).unwrap();
        assert_eq!(searches(&policy), Some(1));
        policy
            .alloc_after_release(100 * MIB, LiveInfo { id: 2, ..live }, &mut cx)
            .unwrap();
        assert_eq!(searches(&policy), Some(1), "a retry is not a search");
        assert_eq!(cx.counters.reserved, 200 * MIB);
    }

    #[test]
    fn segment_sizes_follow_pytorch() {
        assert_eq!(allocation_size(512), SMALL_BUFFER);
        assert_eq!(allocation_size(MIB), SMALL_BUFFER);
        assert_eq!(allocation_size(MIB + 512), LARGE_BUFFER);
        assert_eq!(allocation_size(10 * MIB - 512), LARGE_BUFFER);
        assert_eq!(allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(allocation_size(11 * MIB), 12 * MIB);
    }

    #[test]
    fn rounding_follows_pytorch() {
        let plain = [0; 16];
        assert_eq!(round_size(1, &plain), Some(512));
        assert_eq!(round_size(1000, &plain), Some(1024));
        let four = [4; 16];
        // 1.3 MiB with 4 divisions between 1 and 2 MiB: the next quarter, 1.5 MiB.
        assert_eq!(round_size(1_363_148, &four), Some(MIB + MIB / 2));
        assert_eq!(round_size(MIB + MIB / 4, &four), Some(MIB + MIB / 4));
        assert_eq!(round_size(2 * MIB, &four), Some(2 * MIB));
        // At or below 512 B x divisions the plain rule holds.
        assert_eq!(round_size(1500, &four), Some(1536));
        assert_eq!(round_size(3000, &four), Some(3072));
    }

    #[test]
    fn split_rules_follow_pytorch() {
        let unlimited = Caching::new(None);
        assert!(unlimited.should_split(Pool::Small, 512, 1024));
        assert!(!unlimited.should_split(Pool::Small, 512, 512));
        assert!(!unlimited.should_split(Pool::Large, 2 * MIB, 3 * MIB));
        assert!(unlimited.should_split(Pool::Large, 2 * MIB, 3 * MIB + 512));
        let capped = Caching::new(Some(8 * MIB));
        assert!(!capped.should_split(Pool::Large, 8 * MIB, 20 * MIB));
        assert!(capped.should_split(Pool::Large, 4 * MIB, 20 * MIB));
    }
}
