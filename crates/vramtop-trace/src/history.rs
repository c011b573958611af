//! A history kept in pieces (hook 1.5): before each checkpoint cleared PyTorch's ring, the
//! hook read it whole (`events`) and, just after, the allocator's state (`state`), each as
//! PyTorch pickles a snapshot. Stitched, they are the job's events from its first
//! allocation (`from_start`: the first piece is events) or from an older checkpoint (the
//! first piece is that checkpoint's state), up to the last checkpoint, from which the
//! file's own ring goes on.
//!
//! Between the ring's read and its clearing the job went on allocating: those events are
//! in no piece. On an H100 the gap lasted 26 to 92 ms where a trace dates it (a state's
//! own entries follow the clearing), 136 to 776 entries at GPT-2's pace. The next `state`
//! holds what they did, so the stitch puts in the difference: a free for each block live
//! before that the state no longer holds, a `segment_free` for each segment gone (an unmap
//! for each range of an expandable segment), a `segment_alloc` for each new one (a map), an
//! alloc for each block it holds that was not live, in that order. (Without the segments,
//! what PyTorch held at the OOM, and the cap inferred from it, was off by those the gap
//! released: 1.4 GiB in one GPT-2 history.)
//!
//! What is lost: the order within the gap, and blocks both allocated and freed in it. The
//! replay re-decides where blocks go, so that changes little while the job's allocator kept
//! its segments through the gap. Where it took or gave some back there (a cap reached, the
//! cache released, a new segment for a block since freed), its own decisions are lost with
//! them; the last such gap is kept (`Stitched::restart`), so that a verdict is given only
//! where the history as filled and the history begun again at that state agree (a GPT-2
//! history whose gap hid 26 segments released and 3 taken gave, filled,
//! `garbage_collection_threshold:0.6` "fits" where PyTorch failed; begun again there,
//! `max_split_size_mb` "fits" with N = 64 and 128 only, where PyTorch fitted with 20, 200
//! and 1000). Each events piece begins
//! with the entries the state before it already holds; as for a checkpoint
//! (`checkpoint::reconcile`), they go up to the state's own `snapshot` entry.

use std::collections::BTreeMap;
use std::ops::Range;

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
    /// The last gap in which the job's allocator took or gave back segments: where in
    /// `events` the state after it applies, and that state.
    pub restart: Option<(usize, Vec<SnapshotSegment>)>,
    /// Where in `events` each gap's put-in events are.
    pub gaps: Vec<Range<usize>>,
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
    let mut held = Held::default();
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
                    held.apply(e);
                }
                out.events.extend(events);
            }
            Piece::State(segments) if !expect_events => {
                let now = live_blocks(&segments);
                let now_held = Held::of(&segments);
                if i == 0 {
                    out.base = Some(segments.clone());
                } else {
                    let hidden = hides_decisions(&live, &now, &held, &now_held);
                    let from = out.events.len();
                    out.filled += fill_gap(&live, &now, &held, &now_held, &mut out.events);
                    if out.events.len() > from {
                        out.gaps.push(from..out.events.len());
                    }
                    if hidden {
                        out.restart = Some((out.events.len(), segments.clone()));
                    }
                }
                live = now;
                held = now_held;
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

/// The device memory PyTorch held: whole segments by address, and the mapped ranges of
/// expandable segments (which grow and shrink by pages, so they are compared as ranges).
#[derive(Clone, Debug, Default, PartialEq)]
struct Held {
    segments: BTreeMap<u64, (u64, StreamId)>,
    mapped: Ranges,
}

impl Held {
    fn of(segments: &[SnapshotSegment]) -> Self {
        let mut held = Held::default();
        for s in segments {
            if s.is_expandable {
                held.mapped.add(s.addr..s.addr + s.total_size, s.stream);
            } else {
                held.segments.insert(s.addr, (s.total_size, s.stream));
            }
        }
        held
    }

    fn apply(&mut self, e: &TraceEvent) {
        match e.kind {
            TraceEventKind::SegmentAlloc => {
                self.segments.insert(e.addr, (e.size, e.stream));
            }
            TraceEventKind::SegmentFree => {
                self.segments.remove(&e.addr);
            }
            TraceEventKind::SegmentMap => self.mapped.add(e.addr..e.addr + e.size, e.stream),
            TraceEventKind::SegmentUnmap => self.mapped.remove(e.addr..e.addr + e.size),
            _ => {}
        }
    }
}

/// Whether a gap hid the job's allocator's own decisions: it released segments (a cap
/// reached, the cache emptied, the garbage collector), or took one that holds no block
/// allocated in the gap (so a block since freed made it). A segment taken for a block the
/// state shows is no decision lost: the replay sees that block's alloc and decides anew.
fn hides_decisions(
    was: &BTreeMap<u64, (u64, StreamId)>,
    now: &BTreeMap<u64, (u64, StreamId)>,
    held_was: &Held,
    held_now: &Held,
) -> bool {
    let released = held_was
        .segments
        .iter()
        .any(|(a, s)| !unchanged(held_now.segments.get(a), s))
        || !held_was.mapped.minus(&held_now.mapped).is_empty();
    let new_block_in = |range: Range<u64>| {
        now.range(range)
            .any(|(addr, block)| !unchanged(was.get(addr), block))
    };
    let taken_for_nothing = held_now
        .segments
        .iter()
        .filter(|(a, s)| !unchanged(held_was.segments.get(a), s))
        .any(|(&a, &(size, _))| !new_block_in(a..a + size))
        || held_now
            .mapped
            .minus(&held_was.mapped)
            .into_iter()
            .any(|(range, _)| !new_block_in(range));
    released || taken_for_nothing
}

/// Whether a block or segment (size, stream) is the one `had` at the same address: the
/// same size and stream, or the same size where either side names a CUDA graph's pool.
/// A pool's stream cannot be compared: the pieces are stitched before
/// `graph_pools::separate` gives a pool's events its pool's stream id, so the ring's
/// entries carry the raw stream while the state names the pool (`segment_pool_id`).
/// Compared with it, every block and segment of a torch.compile job's pool (cudagraph
/// trees, H200) read as given back and taken again at every gap, its events before that
/// stayed in the job's own cache (which the job's next `torch.cuda.graph` then emptied in
/// the replay, 1.4 GiB of the pool with it), and every verdict was "cannot tell".
fn unchanged(had: Option<&(u64, StreamId)>, is: &(u64, StreamId)) -> bool {
    had.is_some_and(|had| {
        let pooled = vramtop_alloc::in_graph_pool(had.1) || vramtop_alloc::in_graph_pool(is.1);
        had.0 == is.0 && (had.1 == is.1 || pooled)
    })
}

/// Byte ranges, each with its stream: start -> (end, stream), disjoint, neighbours of one
/// stream merged.
#[derive(Clone, Debug, Default, PartialEq)]
struct Ranges(BTreeMap<u64, (u64, StreamId)>);

impl Ranges {
    fn add(&mut self, range: Range<u64>, stream: StreamId) {
        self.remove(range.clone());
        let (mut start, mut end) = (range.start, range.end);
        if let Some((&s, &(e, st))) = self.0.range(..start).next_back() {
            if e == start && st == stream {
                self.0.remove(&s);
                start = s;
            }
        }
        if let Some(&(e, st)) = self.0.get(&end) {
            if st == stream {
                self.0.remove(&end);
                end = e;
            }
        }
        if start < end {
            self.0.insert(start, (end, stream));
        }
    }

    fn remove(&mut self, range: Range<u64>) {
        let overlapping: Vec<(u64, u64, StreamId)> = self
            .0
            .range(..range.end)
            .filter(|(_, &(e, _))| e > range.start)
            .map(|(&s, &(e, st))| (s, e, st))
            .collect();
        for (s, e, st) in overlapping {
            self.0.remove(&s);
            if s < range.start {
                self.0.insert(s, (range.start, st));
            }
            if e > range.end {
                self.0.insert(range.end, (e, st));
            }
        }
    }

    /// The parts of `self` that `other` does not cover, with `self`'s streams.
    fn minus(&self, other: &Ranges) -> Vec<(Range<u64>, StreamId)> {
        let mut left = self.clone();
        for (&s, &(e, _)) in &other.0 {
            left.remove(s..e);
        }
        left.0.into_iter().map(|(s, (e, st))| (s..e, st)).collect()
    }
}

/// Appends to `events` what turns `was` into `now` (live blocks, and the memory `held`):
/// block frees, segment frees and unmaps, segment allocs and maps, block allocs, each in
/// address order; returns how many.
fn fill_gap(
    was: &BTreeMap<u64, (u64, StreamId)>,
    now: &BTreeMap<u64, (u64, StreamId)>,
    held_was: &Held,
    held_now: &Held,
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
        if !unchanged(now.get(&addr), &block) {
            events.push(event(TraceEventKind::FreeCompleted, addr, block));
        }
    }
    let (segs_was, segs_now) = (&held_was.segments, &held_now.segments);
    for (&addr, &seg) in segs_was {
        if !unchanged(segs_now.get(&addr), &seg) {
            events.push(event(TraceEventKind::SegmentFree, addr, seg));
        }
    }
    for (range, stream) in held_was.mapped.minus(&held_now.mapped) {
        let size = range.end - range.start;
        events.push(event(
            TraceEventKind::SegmentUnmap,
            range.start,
            (size, stream),
        ));
    }
    for (&addr, &seg) in segs_now {
        if !unchanged(segs_was.get(&addr), &seg) {
            events.push(event(TraceEventKind::SegmentAlloc, addr, seg));
        }
    }
    for (range, stream) in held_now.mapped.minus(&held_was.mapped) {
        let size = range.end - range.start;
        events.push(event(
            TraceEventKind::SegmentMap,
            range.start,
            (size, stream),
        ));
    }
    for (&addr, &block) in now {
        if !unchanged(was.get(&addr), &block) {
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
            // From the job's start: its segment, A and B allocated, B freed.
            Piece::Events(vec![
                ev(SegmentAlloc, a, 20 * MIB),
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
                (SegmentAlloc, a),
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
        assert_eq!(s.restart, None, "the segment was kept through the gap");
    }

    #[test]
    fn a_gap_that_changed_the_jobs_segments_is_filled_and_kept_as_a_restart() {
        use TraceEventKind::*;
        let (s1, s2) = (0x1000_0000, 0x4000_0000);
        let with_segment = |addr: u64, live: &[(u64, u64)]| {
            let mut seg = state(live);
            seg[0].addr = addr;
            seg
        };
        let pieces = vec![
            Piece::Events(vec![ev(SegmentAlloc, s1, 20 * MIB), ev(Alloc, s1, 4 * MIB)]),
            Piece::State(with_segment(s1, &[(s1, 4)])),
            Piece::Events(vec![ev(Snapshot, 0, 0), ev(FreeCompleted, s1, 4 * MIB)]),
            // In the gap: the cache released s1, a new segment s2 holds a block.
            Piece::State(with_segment(s2, &[(s2, 4)])),
        ];
        let s = stitch(pieces).expect("stitched");
        let kinds: Vec<(TraceEventKind, u64)> = s.events.iter().map(|e| (e.kind, e.addr)).collect();
        assert_eq!(
            kinds,
            vec![
                (SegmentAlloc, s1),
                (Alloc, s1),
                (FreeCompleted, s1),
                (SegmentFree, s1),
                (SegmentAlloc, s2),
                (Alloc, s2),
            ]
        );
        assert_eq!(s.filled, 3);
        let (at, segments) = s.restart.expect("the gap changed the segments");
        assert_eq!((at, segments[0].addr), (s.events.len(), s2));
    }

    #[test]
    fn a_segment_taken_in_a_gap_for_a_block_the_state_shows_hides_no_decision() {
        use TraceEventKind::*;
        let (s1, s2) = (0x1000_0000, 0x4000_0000);
        let mut both = state(&[(s1, 4)]);
        let mut second = state(&[(s2, 30)]);
        second[0].addr = s2;
        second[0].total_size = 30 * MIB;
        both.append(&mut second);
        let pieces = vec![
            Piece::Events(vec![ev(SegmentAlloc, s1, 20 * MIB), ev(Alloc, s1, 4 * MIB)]),
            Piece::State(state(&[(s1, 4)])),
            Piece::Events(vec![ev(Snapshot, 0, 0)]),
            // In the gap: a 30 MiB block, in a segment of its own.
            Piece::State(both),
        ];
        let s = stitch(pieces).expect("stitched");
        let kinds: Vec<(TraceEventKind, u64)> = s.events.iter().map(|e| (e.kind, e.addr)).collect();
        assert_eq!(kinds[2..], [(SegmentAlloc, s2), (Alloc, s2)]);
        assert_eq!(
            s.restart, None,
            "the replay sees the block's alloc and decides anew"
        );
    }

    #[test]
    fn a_graph_pools_segment_kept_through_a_gap_is_neither_freed_nor_a_restart() {
        use TraceEventKind::*;
        let a = 0x1000_0000;
        // The ring's entries carry the raw stream (1); the state names the segment's pool,
        // a stream id with GRAPH_POOL set.
        let raw = |kind, addr, size| TraceEvent {
            stream: 1,
            ..ev(kind, addr, size)
        };
        let mut pooled = state(&[(a, 4)]);
        pooled[0].stream = vramtop_alloc::GRAPH_POOL | 1;
        let pieces = vec![
            Piece::Events(vec![raw(SegmentAlloc, a, 20 * MIB), raw(Alloc, a, 4 * MIB)]),
            Piece::State(pooled.clone()),
            Piece::Events(vec![ev(Snapshot, 0, 4 * MIB)]),
            Piece::State(pooled),
        ];
        let s = stitch(pieces).expect("stitched");
        assert_eq!(s.filled, 0, "nothing changed in the gap: {:?}", s.events);
        assert_eq!(s.restart, None);
    }

    #[test]
    fn a_segment_another_stream_took_at_the_same_address_in_a_gap_is_still_a_change() {
        use TraceEventKind::*;
        let a = 0x1000_0000;
        let on = |stream: StreamId, kind, addr, size| TraceEvent {
            stream,
            ..ev(kind, addr, size)
        };
        let mut other = state(&[(a, 4)]);
        other[0].stream = 2;
        let pieces = vec![
            Piece::Events(vec![
                on(1, SegmentAlloc, a, 20 * MIB),
                on(1, Alloc, a, 4 * MIB),
            ]),
            Piece::State({
                let mut first = state(&[(a, 4)]);
                first[0].stream = 1;
                first
            }),
            Piece::Events(vec![ev(Snapshot, 0, 4 * MIB)]),
            // In the gap: stream 1's segment given back, stream 2's taken at its address.
            Piece::State(other),
        ];
        let s = stitch(pieces).expect("stitched");
        let kinds: Vec<(TraceEventKind, StreamId)> =
            s.events[2..].iter().map(|e| (e.kind, e.stream)).collect();
        assert_eq!(
            kinds,
            vec![
                (FreeCompleted, 1),
                (SegmentFree, 1),
                (SegmentAlloc, 2),
                (Alloc, 2)
            ]
        );
        assert!(s.restart.is_some(), "the gap released a segment");
    }

    #[test]
    fn an_expandable_segment_grown_in_a_gap_is_mapped_by_the_difference() {
        use TraceEventKind::*;
        let base = 0x7000_0000;
        let expandable = |mib: u64| {
            let mut seg = state(&[]);
            seg[0].addr = base;
            seg[0].total_size = mib * MIB;
            seg[0].is_expandable = true;
            seg
        };
        // Mapped page by page in the trace; one run of 40 MiB in the state: the same.
        let pieces = vec![
            Piece::Events(vec![
                ev(SegmentMap, base, 20 * MIB),
                ev(SegmentMap, base + 20 * MIB, 20 * MIB),
            ]),
            Piece::State(expandable(40)),
            Piece::Events(vec![ev(Snapshot, 0, 0)]),
            Piece::State(expandable(60)),
        ];
        let s = stitch(pieces).expect("stitched");
        let last = s.events.last().expect("filled");
        assert_eq!(
            (last.kind, last.addr, last.size),
            (SegmentMap, base + 40 * MIB, 20 * MIB)
        );
        assert_eq!(s.filled, 1);
        assert!(s.restart.is_some());
    }

    #[test]
    fn ranges_merge_neighbours_of_one_stream_and_split_on_removal() {
        let mut r = Ranges::default();
        r.add(0..10, 0);
        r.add(10..20, 0);
        r.add(20..30, 1);
        assert_eq!(r.0.len(), 2, "{r:?}");
        r.remove(5..8);
        let runs: Vec<(u64, u64)> = r.0.iter().map(|(&s, &(e, _))| (s, e)).collect();
        assert_eq!(runs, vec![(0, 5), (8, 20), (20, 30)]);
        let mut other = Ranges::default();
        other.add(0..30, 0);
        assert_eq!(r.minus(&other), vec![]);
        assert_eq!(other.minus(&r), vec![(5..8, 0)]);
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
            Piece::Events(vec![ev(SegmentAlloc, a, 20 * MIB), ev(Alloc, a, 1000)]),
            Piece::State(at_checkpoint.clone()),
            Piece::Events(vec![ev(Snapshot, 0, 1024), ev(FreeCompleted, a, 1000)]),
            Piece::State(state(&[])),
        ];
        let s = stitch(pieces).expect("stitched");
        assert_eq!((s.filled, s.contradictions), (0, 0), "{:?}", s.events);
        assert_eq!(s.events.len(), 3);
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
