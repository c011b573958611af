//! The allocator's contract at its edges: bad input, out-of-memory, the caching
//! policy's PyTorch rules, expandable pages, events, leak queries, threads.

use vramtop_alloc::backing::BookkeepingBacking;
use vramtop_alloc::{AllocConfig, AllocError, Allocator, BlockState, EventKind, PolicyKind, Pool};

const MIB: u64 = 1 << 20;

fn allocator(policy: PolicyKind, capacity: u64) -> Allocator {
    Allocator::new(
        policy,
        Box::new(BookkeepingBacking::new(capacity)),
        AllocConfig::default(),
    )
}

/// Layout without its generation, to compare states.
fn state(a: &Allocator) -> (Vec<vramtop_alloc::SegmentLayout>, u64, u64, u64) {
    let s = a.stats();
    (
        a.layout().segments,
        s.allocated_bytes,
        s.reserved_bytes,
        s.live_blocks,
    )
}

#[test]
fn zero_size_is_a_live_minimum_block() {
    for policy in PolicyKind::ALL {
        let a = allocator(policy, 64 * MIB);
        let b = a.alloc(0, 0, "zero").unwrap();
        assert_eq!((b.size, b.requested), (512, 0), "{policy}");
        assert_eq!(a.stats().allocated_bytes, 512);
        let other = a.alloc(0, 0, "zero").unwrap();
        assert_ne!(
            b.addr, other.addr,
            "{policy}: zero-size blocks share an address"
        );
        a.free(&b).unwrap();
        a.free(&other).unwrap();
        assert_eq!(a.stats().live_blocks, 0);
    }
}

#[test]
fn beyond_capacity_is_typed_oom_and_changes_nothing() {
    for policy in PolicyKind::ALL {
        let a = allocator(policy, 64 * MIB);
        let keep = a.alloc(3 * MIB, 0, "keep").unwrap();
        let before = state(&a);
        for size in [64 * MIB + 1, 1 << 40, u64::MAX] {
            match a.alloc(size, 0, "huge") {
                Err(AllocError::OutOfMemory(r)) => {
                    assert_eq!(r.requested_bytes, size);
                    assert!(r.rounded_bytes >= size);
                    assert_eq!(r.capacity_bytes, 64 * MIB);
                }
                other => panic!("{policy}: {size} gave {other:?}"),
            }
        }
        assert_eq!(state(&a), before, "{policy}");
        let stats = a.stats();
        assert_eq!(stats.ooms, 3);
        assert_eq!(stats.last_oom.map(|r| r.requested_bytes), Some(u64::MAX));
        a.free(&keep).unwrap();
    }
}

#[test]
fn double_free_and_forged_receipts_are_refused() {
    for policy in PolicyKind::ALL {
        let a = allocator(policy, 64 * MIB);
        let b = a.alloc(4096, 0, "t").unwrap();
        let keep = a.alloc(4096, 0, "t").unwrap();
        a.free(&b).unwrap();
        let before = state(&a);
        assert_eq!(a.free(&b), Err(AllocError::DoubleFree { id: b.id }));
        assert_eq!(
            a.free_deferred(&b),
            Err(AllocError::DoubleFree { id: b.id })
        );
        let mut forged = keep.clone();
        forged.addr += 512;
        assert_eq!(a.free(&forged), Err(AllocError::DoubleFree { id: keep.id }));
        assert_eq!(state(&a), before, "{policy}");
        a.free_deferred(&keep).unwrap();
        assert_eq!(a.free(&keep), Err(AllocError::DoubleFree { id: keep.id }));
        assert_eq!(
            a.free_deferred(&keep),
            Err(AllocError::DoubleFree { id: keep.id })
        );
        assert_eq!(a.process_pending(), 1);
        assert_eq!(a.stats().live_blocks, 0);
    }
}

#[test]
fn stale_receipt_does_not_free_the_block_that_took_its_place() {
    for policy in PolicyKind::ALL {
        let a = allocator(policy, 64 * MIB);
        let old = a.alloc(512, 0, "t").unwrap();
        a.free(&old).unwrap();
        let new = a.alloc(512, 0, "t").unwrap();
        assert_eq!(
            (new.addr, new.slot),
            (old.addr, old.slot),
            "{policy}: expected reuse"
        );
        assert_eq!(a.free(&old), Err(AllocError::DoubleFree { id: old.id }));
        assert_eq!(a.stats().live_blocks, 1);
        let mut bogus = new.clone();
        bogus.slot = u32::MAX;
        assert_eq!(a.free(&bogus), Err(AllocError::DoubleFree { id: new.id }));
        a.free(&new).unwrap();
    }
}

#[test]
fn blocks_of_another_allocator_are_refused() {
    let a = allocator(PolicyKind::BestFit, 64 * MIB);
    let b = allocator(PolicyKind::BestFit, 64 * MIB);
    let from_a = a.alloc(1024, 0, "a").unwrap();
    let from_b = b.alloc(1024, 0, "b").unwrap();
    assert_eq!((from_a.id, from_a.addr), (from_b.id, from_b.addr));
    let before = state(&b);
    assert_eq!(
        b.free(&from_a),
        Err(AllocError::ForeignBlock { id: from_a.id })
    );
    assert!(matches!(
        b.fill_block(&from_a, 1),
        Err(AllocError::ForeignBlock { .. })
    ));
    assert_eq!(state(&b), before);
    b.free(&from_b).unwrap();
    a.free(&from_a).unwrap();
}

#[test]
fn any_stream_id_works_and_caching_keeps_streams_apart() {
    for policy in PolicyKind::ALL {
        let a = allocator(policy, 64 * MIB);
        let x = a.alloc(4096, u32::MAX, "s").unwrap();
        let y = a.alloc(4096, 7, "s").unwrap();
        assert_eq!(x.stream, u32::MAX);
        if policy == PolicyKind::Caching {
            let layout = a.layout();
            assert_eq!(layout.segments.len(), 2, "one small segment per stream");
            assert!(layout.segments.iter().all(|s| s.pool == Pool::Small));
        }
        a.free(&x).unwrap();
        a.free(&y).unwrap();
    }
}

#[test]
fn caching_releases_cached_segments_and_retries_once() {
    let a = allocator(PolicyKind::Caching, 22 * MIB);
    let small = a.alloc(MIB, 0, "small").unwrap();
    a.free(&small).unwrap();
    assert_eq!(
        a.stats().reserved_bytes,
        2 * MIB,
        "freed segments stay cached"
    );
    let big = a.alloc(21 * MIB, 0, "big").unwrap();
    let stats = a.stats();
    assert_eq!((stats.retries, stats.segment_frees), (1, 1));
    assert_eq!(stats.reserved_bytes, 22 * MIB);
    assert_eq!(
        big.size,
        22 * MIB,
        "large pool keeps remainders up to 1 MiB"
    );
    // Nothing left to release: now a real OOM, with the report's numbers.
    match a.alloc(MIB, 0, "more") {
        Err(AllocError::OutOfMemory(r)) => {
            assert_eq!(r.reserved_bytes, 22 * MIB);
            assert_eq!(r.rounded_bytes, MIB);
        }
        other => panic!("expected OOM, got {other:?}"),
    }
    assert_eq!(a.stats().retries, 1);
}

#[test]
fn caching_pools_segments_and_splits_like_pytorch() {
    let a = allocator(PolicyKind::Caching, 512 * MIB);
    let tiny = a.alloc(100, 0, "t").unwrap();
    assert_eq!(tiny.size, 512);
    let mid = a.alloc(3 * MIB, 0, "t").unwrap();
    let big = a.alloc(17 * MIB + 512, 0, "t").unwrap();
    let sizes: Vec<(Pool, u64)> = a
        .layout()
        .segments
        .iter()
        .map(|s| (s.pool, s.size))
        .collect();
    assert!(sizes.contains(&(Pool::Small, 2 * MIB)));
    assert!(sizes.contains(&(Pool::Large, 20 * MIB)));
    assert!(sizes.contains(&(Pool::Large, 18 * MIB)));
    assert_eq!(mid.size, 3 * MIB, "17 MiB remainder is split off");
    assert_eq!(
        big.size,
        18 * MIB,
        "a remainder under 1 MiB is not split (large pool)"
    );
    // A freed block merges with its free neighbours, and the cached segment serves
    // the next request of the same stream.
    a.free(&mid).unwrap();
    let again = a.alloc(2 * MIB, 0, "t").unwrap();
    assert_eq!(again.addr, mid.addr);
    assert_eq!(a.stats().segment_allocs, 3);
}

fn capped(max_split: u64) -> Allocator {
    let config = AllocConfig {
        max_split_size: Some(max_split),
        ..AllocConfig::default()
    };
    Allocator::new(
        PolicyKind::Caching,
        Box::new(BookkeepingBacking::new(512 * MIB)),
        config,
    )
}

#[test]
fn caching_honours_max_split_size() {
    let a = capped(4 * MIB);
    let oversize = a.alloc(6 * MIB, 0, "o").unwrap();
    assert_eq!(oversize.size, 20 * MIB, "oversize blocks are not split");
    a.free(&oversize).unwrap();
    let below = a.alloc(2 * MIB, 0, "b").unwrap();
    assert_ne!(
        below.addr, oversize.addr,
        "oversize cached block served a small request"
    );
    assert_eq!(below.size, 2 * MIB);
    let above = a.alloc(19 * MIB, 0, "a").unwrap();
    assert_eq!(
        above.addr, oversize.addr,
        "oversize request reuses the cached block"
    );
    assert_eq!(above.size, 20 * MIB);

    // A cached oversize block at least 20 MiB larger than the request is left alone.
    let a = capped(4 * MIB);
    let huge = a.alloc(40 * MIB, 0, "h").unwrap();
    a.free(&huge).unwrap();
    let twelve = a.alloc(12 * MIB, 0, "t").unwrap();
    assert_ne!(twelve.addr, huge.addr);
    let big = a.alloc(24 * MIB, 0, "b").unwrap();
    assert_eq!((big.addr, big.size), (huge.addr, 40 * MIB));
}

#[test]
fn oom_report_tells_the_fragmentation_paradox() {
    let a = allocator(PolicyKind::BestFit, 20 * MIB);
    let blocks: Vec<_> = (0..20).map(|_| a.alloc(MIB, 0, "f").unwrap()).collect();
    for b in blocks.iter().step_by(2) {
        a.free(b).unwrap();
    }
    match a.alloc(2 * MIB, 0, "needs two") {
        Err(AllocError::OutOfMemory(r)) => {
            assert_eq!(
                r.to_string(),
                "needed 2.0 MiB contiguous; 10.0 MiB free in 10 runs, largest 1.0 MiB"
            );
        }
        other => panic!("expected OOM, got {other:?}"),
    }
    let stats = a.stats();
    assert!((stats.external_fragmentation - 0.9).abs() < 1e-9);
    assert_eq!(stats.free_runs, 10);
}

#[test]
fn expandable_maps_pages_while_touched() {
    let a = allocator(PolicyKind::Expandable, 16 * MIB);
    let x = a.alloc(3 * MIB, 0, "x").unwrap();
    let stats = a.stats();
    assert_eq!(stats.reserved_bytes, 4 * MIB);
    assert_eq!(
        stats.free_runs, 1,
        "the rest of the second page is free and mapped"
    );
    let y = a.alloc(MIB, 0, "y").unwrap();
    assert_eq!(a.stats().reserved_bytes, 4 * MIB, "fits the mapped tail");
    a.free(&x).unwrap();
    assert_eq!(
        a.stats().reserved_bytes,
        2 * MIB,
        "first page idle, unmapped"
    );
    let layout = a.layout();
    let states: Vec<BlockState> = layout.segments[0].runs.iter().map(|r| r.state).collect();
    assert_eq!(states[0], BlockState::Unmapped);
    assert!(states.contains(&BlockState::Allocated));
    a.free(&y).unwrap();
    let stats = a.stats();
    assert_eq!(
        (stats.reserved_bytes, stats.page_maps, stats.page_unmaps),
        (0, 1, 2)
    );
}

#[test]
fn expandable_places_past_the_holes_and_ooms_only_when_memory_runs_out() {
    let a = allocator(PolicyKind::Expandable, 8 * MIB);
    let blocks: Vec<_> = (0..4).map(|_| a.alloc(2 * MIB, 0, "p").unwrap()).collect();
    a.free(&blocks[1]).unwrap();
    a.free(&blocks[3]).unwrap();
    assert_eq!(a.stats().reserved_bytes, 4 * MIB);
    // No hole is 4 MiB, but address space reaches past the capacity: the pages the holes
    // gave back are mapped again, contiguously, past the live blocks.
    let big = a
        .alloc(4 * MIB, 0, "x")
        .expect("expandable needs no contiguous hole");
    assert!(
        big.addr >= blocks[3].addr,
        "placed in the free tail, not a hole"
    );
    assert_eq!(a.stats().reserved_bytes, 8 * MIB);
    match a.alloc(2 * MIB, 0, "over") {
        Err(AllocError::OutOfMemory(r)) => {
            assert_eq!(r.reserved_bytes, 8 * MIB);
            assert_eq!(r.largest_free_bytes, 0, "{r}");
        }
        other => panic!("expected OOM, got {other:?}"),
    }
    a.free(&blocks[0]).unwrap();
    assert!(a.alloc(2 * MIB, 0, "fits").is_ok());
}

#[test]
fn events_tell_every_change_in_order() {
    let a = allocator(PolicyKind::Caching, 64 * MIB);
    let mut rx = a.subscribe();
    let b = a.alloc(1000, 3, "site").unwrap();
    a.free_deferred(&b).unwrap();
    a.process_pending();
    a.empty_cache();
    let mut events = Vec::new();
    assert_eq!(rx.drain(&mut events), 0);
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![
            EventKind::SegmentAlloc,
            EventKind::Alloc,
            EventKind::FreeRequested,
            EventKind::Free,
            EventKind::SegmentFree
        ]
    );
    assert_eq!(events[1].alloc_id, Some(b.id));
    assert_eq!(events[1].tag, Some(b.tag));
    assert_eq!(
        (events[1].addr, events[1].size, events[1].stream),
        (b.addr, 1024, 3)
    );
    assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    assert_eq!(a.layout().generation, 5);
}

#[test]
fn slow_observer_learns_what_it_missed_and_resyncs() {
    let config = AllocConfig {
        event_ring: 16,
        ..AllocConfig::default()
    };
    let a = Allocator::new(
        PolicyKind::Tlsf,
        Box::new(BookkeepingBacking::new(64 * MIB)),
        config,
    );
    let mut rx = a.subscribe();
    let blocks: Vec<_> = (0..40).map(|_| a.alloc(512, 0, "t").unwrap()).collect();
    let mut events = Vec::new();
    let missed = rx.drain(&mut events);
    assert_eq!(
        missed + events.len() as u64,
        41,
        "40 allocs and one segment"
    );
    assert!(missed > 0);
    let layout = a.layout();
    assert_eq!(layout.generation, rx.next_seq());
    assert_eq!(blocks.len(), 40);
}

#[test]
fn leak_queries_rank_by_age_and_tag() {
    let a = allocator(PolicyKind::BestFit, 256 * MIB);
    let old = a.alloc(MIB, 0, "model.py:10 weights").unwrap();
    let mid = a.alloc(4 * MIB, 0, "train.py:68 step").unwrap();
    let new = a.alloc(2 * MIB, 0, "train.py:68 step").unwrap();
    let ages = a.live_blocks_by_age(2);
    assert_eq!(
        ages.iter().map(|b| b.id).collect::<Vec<_>>(),
        vec![old.id, mid.id]
    );
    assert_eq!(ages[0].tag_name, "model.py:10 weights");
    assert!(ages[0].age_ns >= ages[1].age_ns);
    let tags = a.live_bytes_by_tag();
    assert_eq!(tags[0].tag_name, "train.py:68 step");
    assert_eq!((tags[0].bytes, tags[0].blocks), (6 * MIB, 2));
    assert_eq!((tags[1].bytes, tags[1].blocks), (MIB, 1));
    assert_eq!(a.tag_name(old.tag).as_deref(), Some("model.py:10 weights"));
    a.free(&mid).unwrap();
    a.free(&new).unwrap();
    assert_eq!(a.live_bytes_by_tag().len(), 1);
    assert_eq!(a.layout().tag_name(old.tag), "model.py:10 weights");
}

#[test]
fn threads_share_one_allocator() {
    let a = std::sync::Arc::new(allocator(PolicyKind::Tlsf, 1 << 30));
    let handles: Vec<_> = (0..4u32)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..300u64 {
                    if let Ok(b) = a.alloc(512 + (i * 4099 + u64::from(t)) % 300_000, t, "thr") {
                        mine.push(b);
                    }
                    if i % 3 == 0 {
                        if let Some(b) = mine.pop() {
                            a.free(&b).unwrap();
                        }
                    }
                }
                for b in mine {
                    a.free(&b).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let stats = a.stats();
    assert_eq!((stats.live_blocks, stats.allocated_bytes), (0, 0));
    assert_eq!(stats.allocs, stats.frees);
}
