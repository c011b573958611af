//! Invariants of every policy under random alloc/free/deferred-free sequences: runs tile
//! segments, nothing overlaps, free neighbours are coalesced, every byte and every
//! metric agrees with a recount from `layout()`, and freeing everything returns to zero.

use std::collections::HashMap;

use proptest::prelude::*;
use vramtop_alloc::backing::BookkeepingBacking;
use vramtop_alloc::{
    AllocConfig, AllocError, Allocator, Block, BlockState, EventKind, Layout, PolicyKind, Pool,
    Stats, HIST_BUCKETS,
};

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 160 * MIB;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: u32 },
    Free(usize),
    Defer(usize),
    Process,
    EmptyCache,
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        6 => 1..8192u64,
        6 => 8192..MIB,
        4 => MIB..(12 * MIB),
        2 => (12 * MIB)..(48 * MIB),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size_strategy(), 0..3u32).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(Op::Free),
        2 => any::<usize>().prop_map(Op::Defer),
        1 => Just(Op::Process),
        1 => Just(Op::EmptyCache),
    ]
}

/// What the test believes is live: id -> (block, pending).
type Live = HashMap<u64, (Block, bool)>;

#[derive(Default)]
struct Recount {
    reserved: u64,
    allocated: u64,
    requested: u64,
    live: u64,
    pending: u64,
    free_runs: u64,
    free_total: u64,
    largest: u64,
    hist: Vec<u64>,
}

fn is_expandable(policy: PolicyKind) -> bool {
    matches!(
        policy,
        PolicyKind::Expandable | PolicyKind::PytorchExpandable
    )
}

/// PyTorch's expandable segments: one pool and stream per segment, shown up to its last
/// mapped page, unmapped runs in whole pages of 2 MiB (small) or 20 MiB (large).
fn check_pytorch_expandable_segment(seg: &vramtop_alloc::SegmentLayout, backing_page: u64) {
    let page = match seg.pool {
        Pool::Small => 2 * MIB,
        Pool::Large => 20 * MIB,
        Pool::Range => panic!("pytorch-expandable has no range segments"),
    }
    .div_ceil(backing_page)
        * backing_page;
    assert_eq!(seg.size % page, 0, "segment not shown in whole pages");
    assert_ne!(seg.runs.last().map(|r| r.state), Some(BlockState::Unmapped));
    for run in &seg.runs {
        match run.state {
            BlockState::Unmapped => {
                assert_eq!((run.addr - seg.addr) % page, 0);
                assert_eq!(run.size % page, 0);
            }
            BlockState::Allocated | BlockState::PendingFree => {
                assert_eq!(run.stream, seg.stream, "block on another stream's segment");
                assert_eq!(
                    seg.pool == Pool::Small,
                    run.size <= MIB,
                    "block in the wrong pool"
                );
            }
            BlockState::Free => {}
        }
    }
}

fn check_segment_shape(policy: PolicyKind, page: u64, seg: &vramtop_alloc::SegmentLayout) {
    if policy == PolicyKind::PytorchExpandable {
        check_pytorch_expandable_segment(seg, page);
        return;
    }
    if policy != PolicyKind::Caching {
        return;
    }
    match seg.pool {
        Pool::Small => assert_eq!(seg.size, 2 * MIB),
        Pool::Large => assert!(
            seg.size == 20 * MIB || (seg.size >= 10 * MIB && seg.size % (2 * MIB) == 0),
            "large segment of {}",
            seg.size
        ),
        Pool::Range => panic!("caching has no range segments"),
    }
    for run in &seg.runs {
        if run.state == BlockState::Allocated || run.state == BlockState::PendingFree {
            assert_eq!(run.stream, seg.stream, "block on another stream's segment");
            if seg.pool == Pool::Small {
                assert!(run.requested <= MIB);
            }
        }
    }
}

fn recount(policy: PolicyKind, page: u64, layout: &Layout, live: &Live) -> Recount {
    let mut r = Recount {
        hist: vec![0; HIST_BUCKETS],
        ..Recount::default()
    };
    let mut prev_end = 0;
    for seg in &layout.segments {
        assert!(seg.addr >= prev_end, "segments overlap or are unordered");
        prev_end = seg.addr + seg.size;
        check_segment_shape(policy, page, seg);
        let mut cursor = seg.addr;
        let mut prev_state = None;
        for run in &seg.runs {
            assert_eq!(run.addr, cursor, "runs do not tile the segment");
            assert!(run.size > 0 && run.addr % 512 == 0 && run.size % 512 == 0);
            cursor += run.size;
            match run.state {
                BlockState::Free => {
                    assert_ne!(prev_state, Some(BlockState::Free), "uncoalesced free runs");
                    r.free_runs += 1;
                    r.free_total += run.size;
                    r.largest = r.largest.max(run.size);
                    r.hist[(63 - run.size.leading_zeros() as usize).min(HIST_BUCKETS - 1)] += 1;
                }
                BlockState::Unmapped => {
                    assert!(is_expandable(policy));
                    assert_ne!(prev_state, Some(BlockState::Unmapped));
                    assert_eq!((run.addr - seg.addr) % page, 0);
                    assert_eq!(run.size % page, 0);
                }
                BlockState::Allocated | BlockState::PendingFree => {
                    let id = run.id.expect("live run without id");
                    let (block, pending) = live.get(&id).expect("layout shows a block we freed");
                    assert_eq!((block.addr, block.size), (run.addr, run.size));
                    assert_eq!(block.requested, run.requested);
                    assert_eq!(*pending, run.state == BlockState::PendingFree);
                    assert!(block.size >= block.requested.max(1));
                    r.live += 1;
                    r.pending += u64::from(*pending);
                    r.allocated += run.size;
                    r.requested += run.requested;
                }
            }
            if run.state != BlockState::Unmapped && is_expandable(policy) {
                r.reserved += run.size;
            }
            prev_state = Some(run.state);
        }
        assert_eq!(cursor, seg.addr + seg.size, "runs do not cover the segment");
        if !is_expandable(policy) {
            r.reserved += seg.size;
        }
    }
    r
}

fn check(a: &Allocator, page: u64, live: &Live) -> Stats {
    let layout = a.layout();
    let stats = a.stats();
    let r = recount(a.policy(), page, &layout, live);
    assert_eq!(
        r.live,
        live.len() as u64,
        "a live block is missing from the layout"
    );
    assert_eq!(stats.reserved_bytes, r.reserved);
    assert_eq!(stats.allocated_bytes, r.allocated);
    assert_eq!(stats.requested_bytes, r.requested);
    assert_eq!(stats.live_blocks, r.live);
    assert_eq!(stats.pending_free_blocks, r.pending);
    assert_eq!(stats.free_runs, r.free_runs);
    assert_eq!(stats.total_free_bytes, r.free_total);
    assert_eq!(stats.largest_free_bytes, r.largest);
    assert_eq!(stats.free_run_histogram, r.hist);
    let frag = if r.free_total == 0 {
        0.0
    } else {
        1.0 - r.largest as f64 / r.free_total as f64
    };
    assert!((stats.external_fragmentation - frag).abs() < 1e-12);
    assert!(stats.reserved_bytes <= CAPACITY);
    assert!(stats.peak_reserved_bytes >= stats.reserved_bytes);
    assert!(stats.peak_allocated_bytes >= stats.allocated_bytes);
    stats
}

fn pick(live: &Live, i: usize) -> Option<Block> {
    let mut ids: Vec<u64> = live.keys().copied().collect();
    ids.sort_unstable();
    (!ids.is_empty()).then(|| live[&ids[i % ids.len()]].0.clone())
}

fn apply(a: &Allocator, live: &mut Live, op: &Op) {
    match *op {
        Op::Alloc { size, stream } => match a.alloc(size, stream, "prop") {
            Ok(b) => {
                assert!(live.insert(b.id, (b, false)).is_none());
            }
            Err(AllocError::OutOfMemory(report)) => {
                assert!(report.rounded_bytes >= size);
            }
            Err(e) => panic!("unexpected error {e}"),
        },
        Op::Free(i) => {
            if let Some(b) = pick(live, i) {
                let pending = live[&b.id].1;
                let result = a.free(&b);
                if pending {
                    assert!(matches!(result, Err(AllocError::DoubleFree { .. })));
                } else {
                    assert_eq!(result, Ok(()));
                    live.remove(&b.id);
                    assert!(matches!(a.free(&b), Err(AllocError::DoubleFree { .. })));
                }
            }
        }
        Op::Defer(i) => {
            if let Some(b) = pick(live, i) {
                let result = a.free_deferred(&b);
                if let Some(entry) = live.get_mut(&b.id) {
                    assert_eq!(result.is_ok(), !entry.1);
                    entry.1 = true;
                }
            }
        }
        Op::Process => {
            let pending = live.values().filter(|(_, p)| *p).count() as u64;
            assert_eq!(a.process_pending(), pending);
            live.retain(|_, (_, p)| !*p);
        }
        Op::EmptyCache => a.empty_cache(),
    }
}

fn run_sequence(policy: PolicyKind, config: AllocConfig, ops: &[Op]) {
    run_paged(policy, config, 2 * MIB, ops);
}

fn run_paged(policy: PolicyKind, config: AllocConfig, page: u64, ops: &[Op]) {
    let backing = BookkeepingBacking::with_page_size(CAPACITY, page);
    let a = Allocator::new(policy, Box::new(backing), config);
    let mut rx = a.subscribe();
    let mut live = Live::new();
    let mut before = check(&a, page, &live);
    for op in ops {
        apply(&a, &mut live, op);
        let after = check(&a, page, &live);
        if policy == PolicyKind::PytorchExpandable {
            check_pytorch_unmaps(op, &before, &after);
        }
        before = after;
    }
    a.process_pending();
    live.retain(|_, (_, p)| !*p);
    for (b, _) in live.values() {
        assert_eq!(a.free(b), Ok(()));
    }
    live.clear();
    let stats = check(&a, page, &live);
    assert_eq!((stats.allocated_bytes, stats.requested_bytes), (0, 0));
    assert_eq!(stats.live_blocks, 0);
    if policy == PolicyKind::Expandable {
        assert_eq!(stats.reserved_bytes, 0, "idle pages stay mapped");
    }
    a.empty_cache();
    let stats = check(&a, page, &live);
    assert_eq!(
        stats.reserved_bytes, 0,
        "empty_cache kept a wholly free segment"
    );
    check_events(&mut rx, &stats);
}

/// PyTorch unmaps pages only on `empty_cache` or the release-and-retry of an alloc:
/// frees keep them mapped (cached).
fn check_pytorch_unmaps(op: &Op, before: &Stats, after: &Stats) {
    let released = match op {
        Op::EmptyCache => true,
        Op::Alloc { .. } => after.retries > before.retries || after.ooms > before.ooms,
        _ => false,
    };
    if !released {
        assert_eq!(
            after.page_unmaps, before.page_unmaps,
            "{op:?} unmapped pages"
        );
        assert!(after.reserved_bytes >= before.reserved_bytes);
    }
}

/// The event stream alone retells the story: gapless, and allocs minus frees is zero.
fn check_events(rx: &mut vramtop_alloc::EventReceiver, stats: &Stats) {
    let mut events = Vec::new();
    assert_eq!(rx.drain(&mut events), 0);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64);
    }
    let count = |k: EventKind| events.iter().filter(|e| e.kind == k).count() as u64;
    assert_eq!(count(EventKind::Alloc), stats.allocs);
    assert_eq!(count(EventKind::Free), stats.frees);
    assert_eq!(stats.allocs, stats.frees);
    assert_eq!(count(EventKind::SegmentAlloc), stats.segment_allocs);
    assert_eq!(count(EventKind::SegmentFree), stats.segment_frees);
    assert_eq!(count(EventKind::PageMap), stats.page_maps);
    assert_eq!(count(EventKind::PageUnmap), stats.page_unmaps);
    assert_eq!(count(EventKind::Oom), stats.ooms);
    let mapped: i128 = events
        .iter()
        .map(|e| match e.kind {
            EventKind::SegmentAlloc | EventKind::PageMap => e.size as i128,
            EventKind::SegmentFree | EventKind::PageUnmap => -(e.size as i128),
            _ => 0,
        })
        .sum();
    assert_eq!(mapped, stats.reserved_bytes as i128);
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op_strategy(), 1..160)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn caching_invariants(ops in ops()) {
        run_sequence(PolicyKind::Caching, AllocConfig::default(), &ops);
    }

    #[test]
    fn caching_with_max_split_invariants(ops in ops()) {
        let config = AllocConfig { max_split_size: Some(6 * MIB), ..AllocConfig::default() };
        run_sequence(PolicyKind::Caching, config, &ops);
    }

    #[test]
    fn best_fit_invariants(ops in ops()) {
        run_sequence(PolicyKind::BestFit, AllocConfig::default(), &ops);
    }

    #[test]
    fn first_fit_invariants(ops in ops()) {
        run_sequence(PolicyKind::FirstFit, AllocConfig::default(), &ops);
    }

    #[test]
    fn tlsf_invariants(ops in ops()) {
        run_sequence(PolicyKind::Tlsf, AllocConfig::default(), &ops);
    }

    #[test]
    fn expandable_invariants(ops in ops()) {
        run_sequence(PolicyKind::Expandable, AllocConfig::default(), &ops);
    }

    #[test]
    fn expandable_small_pages_invariants(ops in ops()) {
        run_paged(PolicyKind::Expandable, AllocConfig::default(), 64 << 10, &ops);
    }

    #[test]
    fn pytorch_expandable_invariants(ops in ops()) {
        run_sequence(PolicyKind::PytorchExpandable, AllocConfig::default(), &ops);
    }

    #[test]
    fn pytorch_expandable_with_max_split_invariants(ops in ops()) {
        let config = AllocConfig { max_split_size: Some(6 * MIB), ..AllocConfig::default() };
        run_sequence(PolicyKind::PytorchExpandable, config, &ops);
    }

    #[test]
    fn pytorch_expandable_small_pages_invariants(ops in ops()) {
        run_paged(PolicyKind::PytorchExpandable, AllocConfig::default(), 64 << 10, &ops);
    }
}
