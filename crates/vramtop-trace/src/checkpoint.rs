//! A history that begins at a checkpoint (hook 1.3): the allocator's segments at a moment
//! the hook took them, then every event of PyTorch's ring since. The hook restarts the ring
//! there instead of reading it, so that its state reads never pay for converting it.
//!
//! PyTorch's `_snapshot()` reads a device's trace, then its segments, each under the
//! allocator's lock but not both under one: an event in between is in the checkpoint's
//! segments and also after the entries the hook skipped. But reading the segments writes
//! a `snapshot` entry to the ring under that same lock (`DeviceCachingAllocator::
//! snapshot`), so the checkpoint's own `snapshot` entry is exactly where it was read:
//! `reconcile` drops every event up to it. That entry carries the active bytes the read
//! found, the checkpoint's live blocks summed, which tells it from another read's just
//! before (a wav2vec history of 41 pieces had one 3 ms ahead, with three allocations
//! between; taken for the mark, they contradicted the state and the whole history was
//! dropped for the last checkpoint's 0.3 s, H100, 2026-11-27); where no entry carries
//! that size, the first is the mark. A ring without one (a PyTorch that does
//! not write it) falls back on matching: in the first `RACE_WINDOW` events, an alloc of a
//! block the checkpoint already holds live, or a free of one it no longer holds (and the
//! same for segments), is dropped. Anywhere later, such an event is a contradiction: a
//! replay from this checkpoint is not the job's, and `remedies` gives no verdict from it.

use std::collections::HashMap;

use super::{InitialSegment, LiveAtStart, SnapshotSegment, TraceEvent, TraceEventKind};
use vramtop_alloc::hash::AddrSet;
use vramtop_alloc::BlockState;

/// Events after the skipped entries that may have happened between PyTorch's read of the
/// trace and of the segments (microseconds apart: a handful at most).
const RACE_WINDOW: usize = 64;

/// Drops the events at the head of `events` that the checkpoint already holds; returns
/// how many were dropped and how many later events contradict it.
pub(super) fn reconcile(
    at_checkpoint: &[SnapshotSegment],
    events: &mut Vec<TraceEvent>,
) -> (u64, u64) {
    let mut live = AddrSet::default();
    let mut segments = AddrSet::default();
    for seg in at_checkpoint {
        segments.insert(seg.addr);
        for b in &seg.blocks {
            if is_live(b.state) {
                live.insert(b.addr);
            }
        }
    }
    let (mut dropped, mut contradictions) = (0u64, 0u64);
    // The checkpoint's own `snapshot` entry: the first, or one sized as its live blocks
    // (PyTorch's `total_active`) a few events after it, where every event between is one
    // the checkpoint already holds (so dropping them loses nothing of the job's).
    let active: u64 = at_checkpoint
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|b| is_live(b.state))
        .map(|b| b.size)
        .sum();
    let first = events
        .iter()
        .position(|e| e.kind == TraceEventKind::Snapshot);
    let marked = first.map(|first| {
        events
            .iter()
            .enumerate()
            .skip(first)
            .take(RACE_WINDOW + 1)
            .take_while(|(_, e)| {
                e.kind == TraceEventKind::Snapshot || held_already(e, &live, &segments)
            })
            .find(|(_, e)| e.kind == TraceEventKind::Snapshot && e.size == active)
            .map_or(first, |(at, _)| at)
    });
    if let Some(at) = marked {
        events.drain(..=at);
        dropped = at as u64 + 1;
    }
    let window = if marked.is_some() { 0 } else { RACE_WINDOW };
    let mut index = 0usize;
    events.retain(|event| {
        let seen_twice = held_already(event, &live, &segments);
        let head = index < window;
        index += 1;
        if seen_twice && head {
            dropped += 1;
            return false;
        }
        if seen_twice {
            contradictions += 1;
        }
        match event.kind {
            TraceEventKind::Alloc => {
                live.insert(event.addr);
            }
            TraceEventKind::FreeCompleted => {
                live.remove(&event.addr);
            }
            TraceEventKind::SegmentAlloc => {
                segments.insert(event.addr);
            }
            TraceEventKind::SegmentFree => {
                segments.remove(&event.addr);
            }
            _ => {}
        }
        true
    });
    (dropped, contradictions)
}

/// Whether `event` is one a state with these live blocks and segments already holds: an
/// alloc of a live block, a free of one not live (and the same for segments).
fn held_already(event: &TraceEvent, live: &AddrSet, segments: &AddrSet) -> bool {
    match event.kind {
        TraceEventKind::Alloc => live.contains(&event.addr),
        TraceEventKind::FreeRequested | TraceEventKind::FreeCompleted => {
            !live.contains(&event.addr)
        }
        TraceEventKind::SegmentAlloc => segments.contains(&event.addr),
        TraceEventKind::SegmentFree => !segments.contains(&event.addr),
        // Expandable segments map and unmap pages inside one range: nothing to match.
        TraceEventKind::SegmentMap
        | TraceEventKind::SegmentUnmap
        | TraceEventKind::Oom
        | TraceEventKind::Snapshot => false,
    }
}

/// The replay's starting state: the checkpoint's live blocks (in address order) and its
/// segments with those blocks at their places. Expandable segments grow by mapping pages,
/// which `caching` cannot adopt: their blocks stay loose, as `initial::infer` leaves them.
pub(super) fn initial_state(
    at_checkpoint: &[SnapshotSegment],
) -> (Vec<LiveAtStart>, Vec<InitialSegment>) {
    let mut blocks = Vec::new();
    let mut segments = Vec::new();
    let mut by_addr: HashMap<u64, ()> = HashMap::new();
    for seg in at_checkpoint {
        let live: Vec<LiveAtStart> = seg
            .blocks
            .iter()
            .filter(|b| is_live(b.state) && by_addr.insert(b.addr, ()).is_none())
            .map(|b| LiveAtStart {
                addr: b.addr,
                size: b.size,
                stream: seg.stream,
                tag: b.tag.clone(),
            })
            .collect();
        blocks.extend(live.iter().cloned());
        segments.push(InitialSegment {
            addr: seg.addr,
            size: seg.total_size,
            pool: seg.pool,
            stream: seg.stream,
            blocks: live,
        });
    }
    blocks.sort_by_key(|b| b.addr);
    segments.sort_by_key(|s| s.addr);
    if at_checkpoint.iter().any(|s| s.is_expandable) {
        segments.clear();
    }
    (blocks, segments)
}

pub(super) fn is_live(state: BlockState) -> bool {
    matches!(state, BlockState::Allocated | BlockState::PendingFree)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SnapshotBlock;
    use vramtop_alloc::Pool;

    const MIB: u64 = 1 << 20;

    fn ev(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::bare(kind, addr, size)
    }

    fn segment(addr: u64, blocks: &[(u64, u64, BlockState)]) -> SnapshotSegment {
        SnapshotSegment {
            addr,
            total_size: blocks.iter().map(|b| b.1).sum(),
            stream: 0,
            pool: Pool::Large,
            is_expandable: false,
            blocks: blocks
                .iter()
                .map(|&(addr, size, state)| SnapshotBlock {
                    addr,
                    size,
                    requested_size: size,
                    state,
                    tag: None,
                })
                .collect(),
        }
    }

    #[test]
    fn the_checkpoints_own_snapshot_entry_marks_where_it_was_read() {
        use BlockState::*;
        use TraceEventKind::*;
        let base = 0x7000_0000_0000;
        let cp = [segment(
            base,
            &[(base, 2 * MIB, Free), (base + 2 * MIB, 2 * MIB, Allocated)],
        )];
        // A freed and B allocated before the segments were read; then A again, after.
        let mut events = vec![
            ev(FreeCompleted, base, 2 * MIB),
            ev(Alloc, base + 2 * MIB, 2 * MIB),
            ev(Snapshot, 0, 2 * MIB),
            ev(Alloc, base, 2 * MIB),
            ev(Snapshot, 0, 4 * MIB), // a later read: not the checkpoint's
            ev(FreeCompleted, base, 2 * MIB),
        ];
        assert_eq!(reconcile(&cp, &mut events), (3, 0));
        assert_eq!(
            events.iter().map(|e| e.kind).collect::<Vec<_>>(),
            vec![Alloc, Snapshot, FreeCompleted]
        );
        // An event before the mark that the checkpoint contradicts (it holds A free, and
        // A is freed again after the mark) is counted, not hidden.
        let mut wrong = vec![ev(Snapshot, 0, 0), ev(FreeCompleted, base, 2 * MIB)];
        assert_eq!(reconcile(&cp, &mut wrong), (1, 1));
    }

    /// Another read's `snapshot` entry just ahead of the checkpoint's own: the mark is the
    /// one sized as the checkpoint's live blocks (PyTorch writes its `total_active`).
    #[test]
    fn the_mark_is_the_snapshot_entry_sized_as_the_checkpoints_live_blocks() {
        use BlockState::*;
        use TraceEventKind::*;
        let base = 0x7000_0000_0000;
        let cp = [segment(
            base,
            &[
                (base, 2 * MIB, Allocated),
                (base + 2 * MIB, 2 * MIB, PendingFree),
                (base + 4 * MIB, 2 * MIB, Free),
            ],
        )];
        // A viewer's read (2 MiB active), then A's allocation, then the checkpoint's read.
        let mut events = vec![
            ev(Snapshot, 0, 2 * MIB),
            ev(Alloc, base, 2 * MIB),
            ev(Snapshot, 0, 4 * MIB),
            ev(Alloc, base + 4 * MIB, 2 * MIB),
        ];
        assert_eq!(reconcile(&cp, &mut events), (3, 0));
        assert_eq!(events, vec![ev(Alloc, base + 4 * MIB, 2 * MIB)]);
        // An event between that the checkpoint does not hold (C allocated, not live in
        // it): the sized entry is no mark, the first is, and C's life is kept.
        let c = base + 4 * MIB;
        let mut events = vec![
            ev(Snapshot, 0, 2 * MIB),
            ev(Alloc, c, 2 * MIB),
            ev(Snapshot, 0, 4 * MIB),
            ev(FreeCompleted, c, 2 * MIB),
        ];
        assert_eq!(reconcile(&cp, &mut events), (1, 0));
        assert_eq!(events.len(), 3, "{events:?}");
    }

    #[test]
    fn without_a_mark_events_the_checkpoint_already_holds_are_dropped_at_the_head_only() {
        use BlockState::*;
        use TraceEventKind::*;
        let base = 0x7000_0000_0000;
        // B (at +2 MiB) was allocated and A freed between PyTorch's read of the trace and
        // of the segments: the checkpoint holds both changes, the ring has them after.
        let cp = [segment(
            base,
            &[(base, 2 * MIB, Free), (base + 2 * MIB, 2 * MIB, Allocated)],
        )];
        let mut events = vec![
            ev(FreeRequested, base, 2 * MIB),
            ev(FreeCompleted, base, 2 * MIB),
            ev(Alloc, base + 2 * MIB, 2 * MIB),
            ev(Alloc, base, 2 * MIB),
            ev(FreeCompleted, base + 2 * MIB, 2 * MIB),
        ];
        assert_eq!(reconcile(&cp, &mut events), (3, 0));
        assert_eq!(
            events.iter().map(|e| (e.kind, e.addr)).collect::<Vec<_>>(),
            vec![(Alloc, base), (FreeCompleted, base + 2 * MIB)]
        );
        // Past the head, the same mismatch is the checkpoint being wrong, not a race.
        let mut late: Vec<TraceEvent> = (0..RACE_WINDOW as u64)
            .flat_map(|i| {
                [
                    ev(Alloc, base + 64 * MIB + i, MIB),
                    ev(FreeCompleted, base + 64 * MIB + i, MIB),
                ]
            })
            .collect();
        late.push(ev(FreeCompleted, base, 2 * MIB));
        let n = late.len();
        assert_eq!(reconcile(&cp, &mut late), (0, 1));
        assert_eq!(late.len(), n);
    }

    #[test]
    fn the_initial_state_is_the_checkpoints_live_blocks_in_their_segments() {
        use BlockState::*;
        let base = 0x7000_0000_0000;
        let cp = [
            segment(base + 20 * MIB, &[(base + 20 * MIB, 20 * MIB, PendingFree)]),
            segment(
                base,
                &[(base, 4 * MIB, Allocated), (base + 4 * MIB, 16 * MIB, Free)],
            ),
        ];
        let (blocks, segments) = initial_state(&cp);
        assert_eq!(
            blocks.iter().map(|b| (b.addr, b.size)).collect::<Vec<_>>(),
            vec![(base, 4 * MIB), (base + 20 * MIB, 20 * MIB)]
        );
        assert_eq!(segments.len(), 2);
        assert_eq!((segments[0].addr, segments[0].size), (base, 20 * MIB));
        assert_eq!(segments[0].blocks.len(), 1);
        let mut expandable = cp.clone();
        expandable[0].is_expandable = true;
        assert!(initial_state(&expandable).1.is_empty());
    }
}
