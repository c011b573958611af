//! The rules of `pytorch-expandable`, one small story each, through the public
//! allocator over a bookkeeping backing (2 MiB backing pages).

use super::*;
use crate::backing::BookkeepingBacking;
use crate::{AllocConfig, Allocator, Block, PolicyKind};

const MIB: u64 = 1 << 20;

fn allocator(capacity: u64) -> Allocator {
    Allocator::new(
        PolicyKind::PytorchExpandable,
        Box::new(BookkeepingBacking::new(capacity)),
        AllocConfig::default(),
    )
}

fn alloc(a: &Allocator, size: u64, stream: StreamId) -> Block {
    a.alloc(size, stream, "t").expect("alloc")
}

/// (offset from the segment base, size, state) of every run of segment `i`.
fn runs(a: &Allocator, i: usize) -> Vec<(u64, u64, BlockState)> {
    let layout = a.layout();
    let seg = &layout.segments[i];
    seg.runs
        .iter()
        .map(|r| ((r.addr - seg.addr) / MIB, r.size / MIB, r.state))
        .collect()
}

fn base(a: &Allocator, i: usize) -> u64 {
    a.layout().segments[i].addr
}

use BlockState::{Allocated as A, Free as F, Unmapped as U};

#[test]
fn pages_are_2_mib_small_and_20_mib_large_whatever_the_backing_page() {
    assert_eq!(page_for(Pool::Small, 2 * MIB), 2 * MIB);
    assert_eq!(page_for(Pool::Large, 2 * MIB), 20 * MIB);
    assert_eq!(page_for(Pool::Large, 64 << 10), 20 * MIB);
    // A backing page that does not divide 20 MiB: the next multiple of it.
    assert_eq!(page_for(Pool::Large, 8 * MIB), 24 * MIB);
}

#[test]
fn large_requests_map_whole_20_mib_pages_and_reuse_the_rest() {
    let a = allocator(1 << 30);
    let first = alloc(&a, 30 * MIB, 0);
    assert_eq!(a.reserved_bytes(), 40 * MIB, "30 MiB maps two 20 MiB pages");
    assert_eq!(runs(&a, 0), vec![(0, 30, A), (30, 10, F)]);
    let second = alloc(&a, 5 * MIB, 0);
    assert_eq!(
        a.reserved_bytes(),
        40 * MIB,
        "the cached 10 MiB serves 5 MiB"
    );
    assert_eq!(second.addr, first.addr + 30 * MIB);
    let layout = a.layout();
    assert_eq!(layout.segments.len(), 1);
    assert_eq!(layout.segments[0].pool, Pool::Large);
    assert_eq!(
        layout.segments[0].size,
        40 * MIB,
        "shown up to the last mapped page"
    );
}

#[test]
fn small_requests_grow_their_own_segment_in_2_mib_pages() {
    let a = allocator(1 << 30);
    let b1 = alloc(&a, 1000, 0);
    assert_eq!(a.reserved_bytes(), 2 * MIB);
    let b2 = alloc(&a, MIB, 0);
    assert_eq!(b2.addr, b1.addr + 1024, "packed after the first block");
    assert_eq!(a.reserved_bytes(), 2 * MIB);
    // 1 MiB - 1 KiB is left at the end: the next 1 MiB grows into one more page.
    let b3 = alloc(&a, MIB, 0);
    assert_eq!(
        b3.addr,
        b2.addr + MIB,
        "grown in place, across the page boundary"
    );
    assert_eq!(a.reserved_bytes(), 4 * MIB);
    let layout = a.layout();
    assert_eq!(layout.segments.len(), 1);
    assert_eq!(layout.segments[0].pool, Pool::Small);
    // A large request opens the large pool's segment beside it.
    alloc(&a, 2 * MIB, 0);
    assert_eq!(a.layout().segments.len(), 2);
    assert_eq!(a.reserved_bytes(), 24 * MIB);
}

#[test]
fn frees_unmap_nothing_until_empty_cache() {
    let a = allocator(1 << 30);
    let blocks: Vec<Block> = (0..3).map(|_| alloc(&a, 30 * MIB, 0)).collect();
    assert_eq!(a.reserved_bytes(), 100 * MIB);
    for b in &blocks {
        a.free(b).unwrap();
    }
    assert_eq!(
        a.reserved_bytes(),
        100 * MIB,
        "freed pages stay mapped (cached)"
    );
    assert_eq!(runs(&a, 0), vec![(0, 100, F)]);
    a.empty_cache();
    assert_eq!(a.reserved_bytes(), 0);
    assert!(
        a.layout().segments.is_empty(),
        "the empty segment was given back"
    );
    assert_eq!(a.stats().page_unmaps, 1);
}

/// A at [0,25), B at [25,50), C at [50,75) MiB: 80 MiB mapped in four pages.
fn three_blocks(a: &Allocator) -> (Block, Block, Block) {
    let blocks = (
        alloc(a, 25 * MIB, 0),
        alloc(a, 25 * MIB, 0),
        alloc(a, 25 * MIB, 0),
    );
    assert_eq!(a.reserved_bytes(), 80 * MIB);
    assert_eq!(
        runs(a, 0),
        vec![(0, 25, A), (25, 25, A), (50, 25, A), (75, 5, F)]
    );
    blocks
}

#[test]
fn empty_cache_unmaps_whole_pages_only() {
    let a = allocator(1 << 30);
    let (first, middle, _last) = three_blocks(&a);
    a.free(&middle).unwrap();
    a.empty_cache();
    // [25,50) holds no whole 20 MiB page, nor does [75,80).
    assert_eq!(a.reserved_bytes(), 80 * MIB);
    a.free(&first).unwrap();
    a.empty_cache();
    // [0,50) is free: the pages [0,20) and [20,40) go, [40,50) stays mapped.
    assert_eq!(a.reserved_bytes(), 40 * MIB);
    assert_eq!(
        runs(&a, 0),
        vec![(0, 40, U), (40, 10, F), (50, 25, A), (75, 5, F)]
    );
    let stats = a.stats();
    assert_eq!(stats.free_runs, 2, "unmapped space is not a free run");
    assert_eq!(stats.total_free_bytes, 15 * MIB);
}

#[test]
fn growth_fills_the_lowest_unmapped_hole_first() {
    let a = allocator(1 << 30);
    let (first, middle, _last) = three_blocks(&a);
    a.free(&first).unwrap();
    a.free(&middle).unwrap();
    a.empty_cache();
    assert_eq!(runs(&a, 0)[..2], [(0, 40, U), (40, 10, F)]);
    // 30 MiB fits no cached block: it maps the hole at the segment's start (two pages,
    // merging with the free [40,50)) rather than growing the end.
    let d = alloc(&a, 30 * MIB, 0);
    assert_eq!(d.addr, base(&a, 0));
    assert_eq!(a.reserved_bytes(), 80 * MIB);
    assert_eq!(runs(&a, 0)[..2], [(0, 30, A), (30, 20, F)]);
}

#[test]
fn best_fit_leaves_the_growing_end_for_requests_that_need_it() {
    let a = allocator(1 << 30);
    let hole = alloc(&a, 40 * MIB, 0);
    let _pin = alloc(&a, 10 * MIB, 0);
    a.free(&hole).unwrap();
    assert_eq!(runs(&a, 0), vec![(0, 40, F), (40, 10, A), (50, 10, F)]);
    // Best fit by size is the 10 MiB at the end, but it can grow into the unmapped
    // rest of the segment: the 40 MiB hole is the better fit by expandable size.
    let b = alloc(&a, 8 * MIB, 0);
    assert_eq!(b.addr, base(&a, 0));
    assert_eq!(a.reserved_bytes(), 60 * MIB);
}

#[test]
fn each_stream_has_its_own_segment() {
    let a = allocator(1 << 30);
    let s0 = alloc(&a, 5 * MIB, 0);
    let s1 = alloc(&a, 5 * MIB, 1);
    assert_eq!(a.reserved_bytes(), 40 * MIB);
    a.free(&s0).unwrap();
    // Stream 0's free 20 MiB is not stream 1's: this fits stream 1's own rest.
    let again = alloc(&a, 12 * MIB, 1);
    assert_eq!(again.addr, s1.addr + 5 * MIB);
    assert_eq!(a.reserved_bytes(), 40 * MIB);
    let layout = a.layout();
    let streams: Vec<_> = layout.segments.iter().map(|s| s.stream).collect();
    assert_eq!(streams.len(), 2);
    assert!(streams.contains(&Some(0)) && streams.contains(&Some(1)));
}

#[test]
fn a_failed_map_releases_cached_pages_and_retries() {
    let a = allocator(100 * MIB);
    let s0 = alloc(&a, 60 * MIB, 0);
    a.free(&s0).unwrap();
    // Stream 1 needs 60 MiB of its own; 60 are held as stream 0's cache.
    let s1 = alloc(&a, 60 * MIB, 1);
    let stats = a.stats();
    assert_eq!(stats.retries, 1);
    assert_eq!(stats.reserved_bytes, 60 * MIB);
    assert_eq!(
        a.layout().segments.len(),
        1,
        "stream 0's segment was given back"
    );
    assert_eq!(a.layout().segments[0].stream, Some(1));
    // With nothing left to release it is a real out-of-memory.
    assert!(a.alloc(60 * MIB, 1, "t").is_err());
    a.free(&s1).unwrap();
}

#[test]
fn pending_frees_are_neither_reused_nor_unmapped() {
    let a = allocator(1 << 30);
    let b = alloc(&a, 40 * MIB, 0);
    a.free_deferred(&b).unwrap();
    a.empty_cache();
    assert_eq!(a.reserved_bytes(), 40 * MIB);
    let c = alloc(&a, 40 * MIB, 0);
    assert_eq!(c.addr, b.addr + 40 * MIB);
    assert_eq!(a.process_pending(), 1);
    a.free(&c).unwrap();
    a.empty_cache();
    assert_eq!(a.reserved_bytes(), 0);
}
