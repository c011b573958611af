//! The traced allocator's state when a PyTorch trace began, inferred from the trace and
//! the snapshot's final segments: which blocks were live (a model's parameters, or
//! anything allocated before the history ring's oldest entry) and which segments were
//! already held, with those blocks at their places. A replay that starts from this state
//! places the blocks where PyTorch had them instead of where a fresh allocator would.
//!
//! - A block was live at the start when the trace frees an address it has not allocated
//!   (the free's size is the block's), or when it is live at the end and never allocated.
//! - A segment was held at the start when the trace frees (or unmaps) a segment it did not
//!   allocate, or when it is in the final snapshot and never allocated by the trace.
//! - Blocks that lie in no such segment, or overlap another, stay loose: a replay
//!   allocates them first, as before.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{InitialSegment, LiveAtStart, SnapshotSegment, TraceEvent, TraceEventKind};
use vramtop_alloc::{BlockState, Pool};

/// PyTorch's small-pool segment size: segments of this size hold small blocks.
const SMALL_SEGMENT: u64 = 2 << 20;

/// Blocks live at the start (all of them, in address order) and the segments held then.
pub(super) fn infer(
    segments_at_end: &[SnapshotSegment],
    events: &[TraceEvent],
) -> (Vec<LiveAtStart>, Vec<InitialSegment>) {
    let mut blocks: HashMap<u64, LiveAtStart> = HashMap::new();
    let mut segments: BTreeMap<u64, InitialSegment> = BTreeMap::new();
    let mut allocated: HashSet<u64> = HashSet::new();
    let mut segments_allocated: HashSet<u64> = HashSet::new();
    let mut expandable = false;
    for event in events {
        match event.kind {
            TraceEventKind::Alloc => {
                allocated.insert(event.addr);
            }
            TraceEventKind::FreeRequested | TraceEventKind::FreeCompleted => {
                if !allocated.contains(&event.addr) {
                    blocks.entry(event.addr).or_insert_with(|| LiveAtStart {
                        addr: event.addr,
                        size: event.size,
                        stream: event.stream,
                        tag: event.tag.clone(),
                    });
                }
            }
            TraceEventKind::SegmentAlloc => {
                segments_allocated.insert(event.addr);
            }
            TraceEventKind::SegmentMap | TraceEventKind::SegmentUnmap => expandable = true,
            TraceEventKind::SegmentFree => {
                if !segments_allocated.contains(&event.addr) {
                    segments
                        .entry(event.addr)
                        .or_insert_with(|| InitialSegment {
                            addr: event.addr,
                            size: event.size,
                            pool: pool_of_size(event.size),
                            stream: event.stream,
                            blocks: Vec::new(),
                        });
                }
            }
            TraceEventKind::Oom | TraceEventKind::Snapshot => {}
        }
    }
    for seg in segments_at_end {
        expandable |= seg.is_expandable;
        for b in &seg.blocks {
            let live = matches!(b.state, BlockState::Allocated | BlockState::PendingFree);
            if live && !allocated.contains(&b.addr) {
                blocks.entry(b.addr).or_insert_with(|| LiveAtStart {
                    addr: b.addr,
                    size: b.size,
                    stream: seg.stream,
                    tag: b.tag.clone(),
                });
            }
        }
        if !segments_allocated.contains(&seg.addr) {
            segments.entry(seg.addr).or_insert_with(|| InitialSegment {
                addr: seg.addr,
                size: seg.total_size,
                pool: seg.pool,
                stream: seg.stream,
                blocks: Vec::new(),
            });
        }
    }
    let mut all: Vec<LiveAtStart> = blocks.into_values().collect();
    all.sort_by_key(|b| b.addr);
    // Expandable segments grow by mapping pages: their layout at the start cannot be
    // told from the events, so their blocks stay loose.
    if expandable {
        return (all, Vec::new());
    }
    for block in &all {
        let Some((_, seg)) = segments.range_mut(..=block.addr).next_back() else {
            continue;
        };
        let inside = block
            .addr
            .checked_add(block.size)
            .is_some_and(|end| end <= seg.addr + seg.size);
        let after_last = seg
            .blocks
            .last()
            .is_none_or(|b| b.addr + b.size <= block.addr);
        if inside && after_last {
            seg.blocks.push(block.clone());
        }
    }
    (all, segments.into_values().collect())
}

fn pool_of_size(size: u64) -> Pool {
    if size == SMALL_SEGMENT {
        Pool::Small
    } else {
        Pool::Large
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SnapshotBlock;

    const MIB: u64 = 1 << 20;

    fn ev(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::bare(kind, addr, size)
    }

    #[test]
    fn frees_of_unknown_blocks_and_segments_are_the_state_at_the_start() {
        use TraceEventKind::*;
        let base = 0x7000_0000_0000;
        let events = [
            ev(Alloc, base + 4 * MIB, MIB),
            ev(FreeCompleted, base + 4 * MIB, MIB),
            // A parameter freed at the end of the job: live at the start.
            ev(FreeRequested, base, 2 * MIB),
            ev(FreeCompleted, base, 2 * MIB),
            ev(SegmentFree, base, 20 * MIB),
            ev(SegmentAlloc, base + 40 * MIB, 20 * MIB),
        ];
        let at_end = [SnapshotSegment {
            addr: base + 40 * MIB,
            total_size: 20 * MIB,
            stream: 0,
            pool: Pool::Large,
            is_expandable: false,
            blocks: vec![SnapshotBlock {
                addr: base + 40 * MIB,
                size: 20 * MIB,
                requested_size: 20 * MIB,
                state: BlockState::Free,
                tag: None,
            }],
        }];
        let (blocks, segments) = infer(&at_end, &events);
        assert_eq!(blocks.len(), 1);
        assert_eq!((blocks[0].addr, blocks[0].size), (base, 2 * MIB));
        assert_eq!(
            segments.len(),
            1,
            "the traced segment is not one of the start"
        );
        assert_eq!((segments[0].addr, segments[0].size), (base, 20 * MIB));
        assert_eq!(segments[0].blocks, blocks);
    }
}
