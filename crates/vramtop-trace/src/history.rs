//! A history kept in pieces (hook 1.5): before each checkpoint cleared PyTorch's ring, the
//! hook read it whole (`events`) and, just after, the allocator's state (`state`), each as
//! PyTorch pickles a snapshot. Stitched, they are the job's events from its first
//! allocation (`from_start`: the first piece is events) or from an older checkpoint (the
//! first piece is that checkpoint's state), up to the last checkpoint, from which the
//! file's own ring goes on.
//!
//! Between the ring's read and its clearing the job went on allocating (microseconds, at
//! most a few hundred events): those events are in no piece. The next `state` holds what
//! they did, so the stitch puts in the difference: a free for each block live before that
//! the state no longer holds, an alloc for each block it holds that was not live, frees
//! first. Their order within the gap is lost, nothing else. Each events piece begins
//! with the entries the state before it already holds; as for a checkpoint
//! (`checkpoint::reconcile`), they go up to the state's own `snapshot` entry.

use std::collections::BTreeMap;

use super::checkpoint::{is_live, reconcile};
use super::{SnapshotSegment, StreamId, TraceEvent, TraceEventKind};

/// One piece of a kept history, read for the OOM's device.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Piece {
    /// The ring as read before a checkpoint: every event since the one before.
    Events(Vec<TraceEvent>),
    /// The allocator's segments at a checkpoint.
    State(Vec<SnapshotSegment>),
}

/// The pieces stitched into one history.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Stitched {
    /// The segments the history starts from: none when it starts at the job's first
    /// allocation.
    pub base: Option<Vec<SnapshotSegment>>,
    /// Every event from there to the last state, the gaps filled.
    pub events: Vec<TraceEvent>,
    /// The last state: where the file's own ring goes on from.
    pub last: Vec<SnapshotSegment>,
    /// Events put in for the gaps.
    pub filled: u64,
    /// Events that contradict the state before them: a replay of this is not the job's.
    pub contradictions: u64,
    /// Pieces stitched.
    pub pieces: usize,
}

/// Stitches `pieces` (events and states alternating, ending with a state); `None` when
/// they are not in that order (the history then starts at the last checkpoint).
pub(super) fn stitch(pieces: Vec<Piece>) -> Option<Stitched> {
    if !matches!(pieces.last(), Some(Piece::State(_))) {
        return None;
    }
    let mut out = Stitched {
        pieces: pieces.len(),
        ..Stitched::default()
    };
    let mut live: BTreeMap<u64, (u64, StreamId)> = BTreeMap::new();
    let mut before: Option<Vec<SnapshotSegment>> = None;
    let mut expect_events = matches!(pieces.first(), Some(Piece::Events(_)));
    for (i, piece) in pieces.into_iter().enumerate() {
        match piece {
            Piece::Events(mut events) if expect_events => {
                if let Some(state) = &before {
                    let (_, contradictions) = reconcile(state, &mut events);
                    out.contradictions += contradictions;
                }
                // Every block freed must have been live, every one allocated free: a
                // ring that dropped its oldest entries (it was full) shows here.
                for e in &events {
                    let consistent = match e.kind {
                        TraceEventKind::Alloc => live.insert(e.addr, (e.size, e.stream)).is_none(),
                        TraceEventKind::FreeCompleted => live.remove(&e.addr).is_some(),
                        _ => true,
                    };
                    out.contradictions += u64::from(!consistent);
                }
                out.events.extend(events);
            }
            Piece::State(segments) if !expect_events => {
                let now = live_blocks(&segments);
                if i == 0 {
                    out.base = Some(segments.clone());
                } else {
                    out.filled += fill_gap(&live, &now, &mut out.events);
                }
                live = now;
                before = Some(segments);
            }
            _ => return None,
        }
        expect_events = !expect_events;
    }
    out.last = before.unwrap_or_default();
    Some(out)
}

/// The same blocks live in both (the last piece of a history must be the checkpoint's
/// state).
pub(super) fn same_live(a: &[SnapshotSegment], b: &[SnapshotSegment]) -> bool {
    live_blocks(a) == live_blocks(b)
}

/// The live blocks of `segments`, by address, each with the size its `alloc` entry
/// carries: what the job asked for (PyTorch's trace records the request, not the block).
fn live_blocks(segments: &[SnapshotSegment]) -> BTreeMap<u64, (u64, StreamId)> {
    segments
        .iter()
        .flat_map(|s| {
            s.blocks.iter().filter(|b| is_live(b.state)).map(move |b| {
                let asked = if b.requested_size > 0 {
                    b.requested_size
                } else {
                    b.size
                };
                (b.addr, (asked, s.stream))
            })
        })
        .collect()
}

/// Appends to `events` what turns `was` into `now`: frees first, then allocs, each in
/// address order; returns how many.
fn fill_gap(
    was: &BTreeMap<u64, (u64, StreamId)>,
    now: &BTreeMap<u64, (u64, StreamId)>,
    events: &mut Vec<TraceEvent>,
) -> u64 {
    let at = events.last().and_then(|e| e.time_us);
    let event = |kind, addr, (size, stream): (u64, StreamId)| TraceEvent {
        kind,
        addr,
        size,
        stream,
        tag: None,
        time_us: at,
    };
    let before = events.len();
    for (&addr, &block) in was {
        if now.get(&addr) != Some(&block) {
            events.push(event(TraceEventKind::FreeCompleted, addr, block));
        }
    }
    for (&addr, &block) in now {
        if was.get(&addr) != Some(&block) {
            events.push(event(TraceEventKind::Alloc, addr, block));
        }
    }
    (events.len() - before) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SnapshotBlock;
    use vramtop_alloc::{BlockState, Pool};

    const MIB: u64 = 1 << 20;

    fn ev(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::bare(kind, addr, size)
    }

    /// One 20 MiB segment at 0x1000_0000 holding `live` blocks (address, MiB).
    fn state(live: &[(u64, u64)]) -> Vec<SnapshotSegment> {
        vec![SnapshotSegment {
            addr: 0x1000_0000,
            total_size: 20 * MIB,
            stream: 0,
            pool: Pool::Large,
            is_expandable: false,
            blocks: live
                .iter()
                .map(|&(addr, mib)| SnapshotBlock {
                    addr,
                    size: mib * MIB,
                    requested_size: mib * MIB,
                    state: BlockState::Allocated,
                    tag: None,
                })
                .collect(),
        }]
    }

    #[test]
    fn pieces_from_the_start_stitch_with_their_gaps_filled() {
        use TraceEventKind::*;
        let a = 0x1000_0000;
        let b = a + 4 * MIB;
        let c = a + 8 * MIB;
        let pieces = vec![
            // From the job's start: A and B allocated, B freed.
            Piece::Events(vec![
                ev(Alloc, a, 4 * MIB),
                ev(Alloc, b, 4 * MIB),
                ev(FreeCompleted, b, 4 * MIB),
            ]),
            // In the gap: A freed, C allocated.
            Piece::State(state(&[(c, 4)])),
            // The next ring: what the state read saw, its `snapshot` entry, then on.
            Piece::Events(vec![
                ev(Alloc, c, 4 * MIB),
                ev(Snapshot, 0, 4 * MIB),
                ev(FreeCompleted, c, 4 * MIB),
            ]),
            Piece::State(state(&[])),
        ];
        let s = stitch(pieces).expect("stitched");
        assert_eq!(s.base, None);
        let kinds: Vec<(TraceEventKind, u64)> = s.events.iter().map(|e| (e.kind, e.addr)).collect();
        assert_eq!(
            kinds,
            vec![
                (Alloc, a),
                (Alloc, b),
                (FreeCompleted, b),
                (FreeCompleted, a),
                (Alloc, c),
                (FreeCompleted, c),
            ]
        );
        assert_eq!((s.filled, s.contradictions), (2, 0));
        assert!(s.last[0].blocks.is_empty());
    }

    #[test]
    fn pieces_from_a_checkpoint_start_at_its_state() {
        use TraceEventKind::*;
        let a = 0x1000_0000;
        let pieces = vec![
            Piece::State(state(&[(a, 4)])),
            Piece::Events(vec![ev(Snapshot, 0, 0), ev(FreeCompleted, a, 4 * MIB)]),
            Piece::State(state(&[])),
        ];
        let s = stitch(pieces).expect("stitched");
        assert_eq!(s.base.as_ref().map(|b| b[0].blocks.len()), Some(1));
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.filled, 0);
    }

    #[test]
    fn a_block_live_across_a_checkpoint_is_left_alone() {
        use TraceEventKind::*;
        let a = 0x1000_0000;
        // The job asked 1,000 bytes; the block is 1,024 (PyTorch's trace has the former).
        let mut at_checkpoint = state(&[]);
        at_checkpoint[0].blocks.push(SnapshotBlock {
            addr: a,
            size: 1024,
            requested_size: 1000,
            state: BlockState::Allocated,
            tag: None,
        });
        let pieces = vec![
            Piece::Events(vec![ev(Alloc, a, 1000)]),
            Piece::State(at_checkpoint.clone()),
            Piece::Events(vec![ev(Snapshot, 0, 1024), ev(FreeCompleted, a, 1000)]),
            Piece::State(state(&[])),
        ];
        let s = stitch(pieces).expect("stitched");
        assert_eq!((s.filled, s.contradictions), (0, 0), "{:?}", s.events);
        assert_eq!(s.events.len(), 2);
    }

    #[test]
    fn a_ring_that_forgot_its_oldest_entries_contradicts_itself() {
        use TraceEventKind::*;
        // The alloc of 0x2000 fell off the ring's head: its free has nothing to free.
        let pieces = vec![
            Piece::Events(vec![ev(FreeCompleted, 0x2000, MIB), ev(Alloc, 0x3000, MIB)]),
            Piece::State(state(&[])),
        ];
        let s = stitch(pieces).expect("stitched");
        assert_eq!(s.contradictions, 1);
    }

    #[test]
    fn pieces_out_of_order_are_no_history() {
        assert_eq!(stitch(vec![Piece::Events(Vec::new())]), None);
        assert_eq!(
            stitch(vec![Piece::State(state(&[])), Piece::State(state(&[]))]),
            None
        );
    }
}
