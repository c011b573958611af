//! The trace's own out-of-memory errors, each with the traced allocator's state at that
//! moment (reserved, allocated, free in how many runs, largest run), and the capacity a
//! replay should assume when the user gives none: the traced allocator gave up there.
//! Walks the events once over the segments and blocks the trace itself describes, each
//! block sized as PyTorch sized it (the trace names the size asked); at the OOM a file
//! was kept for, the segments kept there, PyTorch's own state, give the figures.

use std::collections::BTreeMap;

use serde::Serialize;

use vramtop_alloc::{in_graph_pool, pytorch_round_size, round_size, BlockState, Pool, StreamId};

use super::{Trace, TraceEvent, TraceEventKind};
use crate::graph_pools::GraphPoolSplit;

/// One `oom` entry of the trace, and the traced allocator's state when it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceOom {
    /// Index of the `oom` event in `Trace::events`.
    pub event: usize,
    pub time_us: Option<i64>,
    /// The request that failed (as PyTorch recorded it: before rounding).
    pub requested_bytes: u64,
    /// What the driver said was free on the device (PyTorch's `device_free`).
    pub device_free_bytes: u64,
    /// Segments the traced allocator held.
    pub reserved_bytes: u64,
    /// Bytes in live blocks (allocated, or freed but not yet completed), each as PyTorch
    /// sized it: the request rounded by the job's settings, with any end left unsplit.
    pub allocated_bytes: u64,
    /// The live blocks' requests at 512 B rounding alone: what any setting must hold.
    pub live_bytes: u64,
    /// Reserved but not in a live block, in how many runs, and the largest.
    pub free_bytes: u64,
    pub free_runs: u64,
    pub largest_free_bytes: u64,
    /// Where CUDA graphs' private pools held segments: the free bytes above split between
    /// the pools and the job's own cache, which alone could serve the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_pools: Option<GraphPoolSplit>,
}

impl TraceOom {
    /// "needed 1.0 GiB contiguous; 4.3 GiB free in 306 runs, largest 6.0 MiB": the
    /// probes' wording; the job's own runs where graphs' pools held memory too.
    pub fn explain(&self) -> String {
        use vramtop_alloc::human_bytes;
        if let Some(split) = &self.graph_pools {
            return split.oom_line(self.requested_bytes);
        }
        format!(
            "needed {} contiguous; {} free in {} runs, largest {}",
            human_bytes(self.requested_bytes),
            human_bytes(self.free_bytes),
            self.free_runs,
            human_bytes(self.largest_free_bytes)
        )
    }
}

impl TraceOom {
    /// As `explain`, with the request as PyTorch's message gave it (`asked`, what it passed
    /// its OOM observers: "Tried to allocate", the size it asked CUDA for, a whole number
    /// of 2 MiB, or a 2 or 20 MiB segment for a small request) where the OOM's kept
    /// figures give it: the trace's entry holds the request before that rounding, and the
    /// live view's line and PyTorch's own then read alike ("needed 1000.0 MiB" beside
    /// PyTorch's "Tried to allocate 1000.00 MiB", not 998.5 MiB).
    pub fn explain_as_asked(&self, asked: Option<u64>) -> String {
        let mut shown = self.clone();
        if let Some(asked) = asked.filter(|&a| a >= self.requested_bytes) {
            shown.requested_bytes = asked;
        }
        shown.explain()
    }
}

/// How the capacity of a replay was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// `--capacity`.
    Given,
    /// From the trace's OOMs (see `inferred_capacity`).
    Inferred,
    /// The cap PyTorch enforced (a memory fraction), named in the file the hook kept at
    /// the OOM (`replay::remedies::kept_cap`): the capacity the remedies are judged at.
    Kept,
    /// No limit: the trace has no OOM and none was given.
    Unlimited,
}

/// The trace's OOMs in order, with the traced state at each: PyTorch's own figures at an
/// OOM the hook kept, the walk's (`walked_ooms`) elsewhere.
pub fn trace_ooms(trace: &Trace) -> Vec<TraceOom> {
    let (mut out, live_blocks) = walk(trace);
    // A file the hook kept at its OOM holds PyTorch's own segments at that moment: where
    // the walk reached the same segments and as many live blocks, their figures stand
    // (the walk cannot tell how much of a large block's end was left unsplit where a
    // free block follows it).
    if let (Some(_), Some(last)) = (&trace.stats.kept_oom, out.last_mut()) {
        // Asked on the stream the `oom` entry names (a pool's, where it was one's).
        let asked = trace.events.get(last.event).map_or(0, |e| e.stream);
        let kept = KeptFigures::of(&trace.segments_at_end, asked);
        if kept.reserved == last.reserved_bytes && kept.live_blocks == live_blocks {
            last.allocated_bytes = kept.allocated;
            last.free_bytes = kept.free;
            last.free_runs = kept.runs;
            last.largest_free_bytes = kept.largest;
            last.graph_pools = kept.graph_pools;
        }
    }
    out
}

/// The trace's OOMs with the state the walk over its events reached at each: blocks as
/// PyTorch sized them from the requests, a large block's end left unsplit where 1 MiB or
/// less follows it. Exact where the history is whole and no large block's unsplit end
/// has a free block after it.
pub fn walked_ooms(trace: &Trace) -> Vec<TraceOom> {
    walk(trace).0
}

/// The walk, and how many blocks were live at its end.
fn walk(trace: &Trace) -> (Vec<TraceOom>, usize) {
    if !trace.events.iter().any(|e| e.kind == TraceEventKind::Oom) {
        return (Vec::new(), 0);
    }
    let mut state = TracedState::at_start(trace);
    let mut out = Vec::new();
    for (i, event) in trace.events.iter().enumerate() {
        match event.kind {
            TraceEventKind::Alloc => {
                // The trace gives the size asked; the block is PyTorch's rounding of it.
                let block = pytorch_round_size(event.size, &state.divisions);
                let least = round_size(event.size).unwrap_or(event.size);
                state
                    .blocks
                    .insert(event.addr, (block.unwrap_or(event.size), least));
            }
            TraceEventKind::FreeCompleted => {
                state.blocks.remove(&event.addr);
            }
            TraceEventKind::SegmentAlloc => state.add_range(event.addr, event.size, event.stream),
            // Pages mapped into an expandable segment extend one contiguous range: a block
            // may run across a page boundary.
            TraceEventKind::SegmentMap => state.map_pages(event.addr, event.size, event.stream),
            TraceEventKind::SegmentFree | TraceEventKind::SegmentUnmap => {
                state.remove_range(event.addr, event.size)
            }
            TraceEventKind::Oom => out.push(state.oom(i, event)),
            TraceEventKind::FreeRequested | TraceEventKind::Snapshot => {}
        }
    }
    (out, state.blocks.len())
}

/// The figures of a snapshot's segments: what PyTorch held, in live blocks and free runs.
struct KeptFigures {
    reserved: u64,
    allocated: u64,
    live_blocks: usize,
    free: u64,
    runs: u64,
    largest: u64,
    graph_pools: Option<GraphPoolSplit>,
}

impl KeptFigures {
    fn of(segments: &[crate::SnapshotSegment], asked: StreamId) -> KeptFigures {
        let mut figures = KeptFigures {
            reserved: 0,
            allocated: 0,
            live_blocks: 0,
            free: 0,
            runs: 0,
            largest: 0,
            graph_pools: GraphPoolSplit::of(segments, asked),
        };
        for seg in segments {
            figures.reserved += seg.total_size;
            for block in seg.blocks.iter().filter(|b| b.state != BlockState::Free) {
                figures.allocated += block.size;
                figures.live_blocks += 1;
            }
            for run in seg.free_runs() {
                figures.free += run;
                figures.runs += 1;
                figures.largest = figures.largest.max(run);
            }
        }
        figures
    }
}

/// The capacity at which the traced allocator gave up: at least the most it ever
/// reserved; where the device itself had room for the request (a cap such as
/// `set_per_process_memory_fraction` was in force), what it held then, else what it held
/// plus what the device had free. `None` without OOMs.
pub fn inferred_capacity(trace: &Trace, ooms: &[TraceOom]) -> Option<u64> {
    let limit = ooms
        .iter()
        .map(|o| {
            if o.device_free_bytes >= o.requested_bytes {
                o.reserved_bytes
            } else {
                o.reserved_bytes.saturating_add(o.device_free_bytes)
            }
        })
        .min()?;
    Some(limit.max(peak_reserved(trace)))
}

/// The most the traced allocator held at once, walking its segment events from the
/// segments held at the start.
pub(crate) fn peak_reserved(trace: &Trace) -> u64 {
    let mut current: u64 = trace.initial_segments.iter().map(|s| s.size).sum();
    let mut peak = current;
    for event in &trace.events {
        match event.kind {
            TraceEventKind::SegmentAlloc | TraceEventKind::SegmentMap => {
                current = current.saturating_add(event.size);
                peak = peak.max(current);
            }
            TraceEventKind::SegmentFree | TraceEventKind::SegmentUnmap => {
                current = current.saturating_sub(event.size)
            }
            _ => {}
        }
    }
    peak
}

/// Reserved ranges (start -> size, and the stream id of the pool they belong to) and live
/// blocks (their size, and their request at 512 B rounding), by address, with the
/// settings that decide how large PyTorch made each block.
struct TracedState {
    ranges: BTreeMap<u64, Range>,
    blocks: BTreeMap<u64, (u64, u64)>,
    divisions: [u32; 16],
    /// Blocks at least this large were never split (`max_split_size_mb`).
    max_split: u64,
    expandable: bool,
}

#[derive(Clone, Copy)]
struct Range {
    size: u64,
    stream: StreamId,
    /// A segment of the small pool (2 MiB).
    small: bool,
}

/// A small-pool segment: PyTorch's `kSmallBuffer`; no large-pool segment has this size
/// (`get_allocation_size`: requests under 10 MiB get 20 MiB, larger ones their size
/// rounded up to 2 MiB, 10 MiB and up).
const SMALL_SEGMENT: u64 = 2 << 20;
/// PyTorch's `kSmallSize`: a large block splits only where more than this is left over.
const SMALL_SIZE: u64 = 1 << 20;

impl TracedState {
    fn at_start(trace: &Trace) -> Self {
        let settings = &trace.settings;
        let mut state = TracedState {
            ranges: BTreeMap::new(),
            // A block read from a free event has the size asked, not the block's.
            blocks: trace
                .initial
                .iter()
                .map(|b| {
                    let size = round_size(b.size).unwrap_or(b.size);
                    (b.addr, (size, size))
                })
                .collect(),
            divisions: settings.roundup_power2_divisions,
            max_split: settings.max_split_size.unwrap_or(u64::MAX),
            expandable: settings.expandable_segments,
        };
        for seg in &trace.initial_segments {
            state.ranges.insert(
                seg.addr,
                Range {
                    size: seg.size,
                    stream: seg.stream,
                    small: seg.pool == Pool::Small,
                },
            );
        }
        state
    }

    fn add_range(&mut self, addr: u64, size: u64, stream: StreamId) {
        let small = size == SMALL_SEGMENT;
        self.ranges.insert(
            addr,
            Range {
                size,
                stream,
                small,
            },
        );
    }

    /// Whether the reserved bytes after a live block of `block` bytes, up to the next
    /// block or the segment's end (`gap`), are that block's: PyTorch leaves a large
    /// block unsplit where 1 MiB or less would be left over, and a block of
    /// `max_split_size` or more unsplit whatever is left, so in a large cudaMalloc
    /// segment no free block is that small (expandable segments split at 512 B).
    fn unsplit(&self, range: Range, block: u64, gap: u64) -> bool {
        !self.expandable && !range.small && (gap <= SMALL_SIZE || block >= self.max_split)
    }

    /// Adds mapped pages, joined with the mapped range they touch on either side: in an
    /// expandable segment the mapped extent is one run of address space, and a free run
    /// or a block may span pages. (Separate segments are never joined: PyTorch cannot
    /// place one block across two cudaMalloc segments, even adjacent ones.)
    fn map_pages(&mut self, addr: u64, size: u64, stream: StreamId) {
        let mut start = addr;
        let mut end = addr.saturating_add(size);
        if let Some((&before, before_range)) = self.ranges.range(..addr).next_back() {
            if before.saturating_add(before_range.size) == addr {
                self.ranges.remove(&before);
                start = before;
            }
        }
        if let Some(after) = self.ranges.remove(&end) {
            end = end.saturating_add(after.size);
        }
        let size = end - start;
        self.ranges.insert(
            start,
            Range {
                size,
                stream,
                small: false,
            },
        );
    }

    /// Removes [addr, addr+size) from the reserved ranges, splitting one where needed
    /// (an unmap of pages inside an expandable segment).
    fn remove_range(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        let overlapping: Vec<(u64, Range)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(&a, r)| a.saturating_add(r.size) > addr)
            .map(|(&a, &r)| (a, r))
            .collect();
        for (a, r) in overlapping {
            self.ranges.remove(&a);
            let e = a + r.size;
            if a < addr {
                self.ranges.insert(
                    a,
                    Range {
                        size: addr - a,
                        ..r
                    },
                );
            }
            if e > end {
                self.ranges.insert(end, Range { size: e - end, ..r });
            }
        }
    }

    /// The state at the `oom` entry `asked` (index `event`): its `size` is the request,
    /// its `addr` the device's free bytes, its stream the pool it was asked of.
    fn oom(&self, event: usize, asked: &TraceEvent) -> TraceOom {
        let (requested, device_free, time_us) = (asked.size, asked.addr, asked.time_us);
        let reserved: u64 = self.ranges.values().map(|r| r.size).sum();
        let (mut allocated, mut live) = (0, 0);
        let (mut free, mut runs, mut largest) = (0u64, 0u64, 0u64);
        let mut split = GraphPoolSplit::asking(asked.stream);
        let mut pools = std::collections::BTreeSet::new();
        for (&start, &range) in &self.ranges {
            let pooled = in_graph_pool(range.stream);
            if pooled {
                pools.insert(range.stream);
            }
            let end = start + range.size;
            // Each stretch between blocks: free, or the unsplit end of the block before.
            let mut stretches = Vec::new();
            let mut cursor = start;
            let mut before: Option<u64> = None;
            for (&addr, &(len, least)) in self.blocks.range(start..end) {
                if addr > cursor {
                    stretches.push((addr - cursor, before));
                }
                allocated += len;
                live += least;
                before = Some(len);
                cursor = cursor.max(addr.saturating_add(len));
            }
            if end > cursor {
                stretches.push((end - cursor, before));
            }
            for (gap, before) in stretches {
                if before.is_some_and(|block| self.unsplit(range, block, gap)) {
                    allocated += gap;
                    continue;
                }
                free += gap;
                runs += 1;
                largest = largest.max(gap);
                split.add_run(gap, range.stream);
            }
        }
        split.pools = pools.len() as u64;
        TraceOom {
            event,
            time_us,
            requested_bytes: requested,
            device_free_bytes: device_free,
            reserved_bytes: reserved,
            allocated_bytes: allocated,
            live_bytes: live,
            free_bytes: free,
            free_runs: runs,
            largest_free_bytes: largest,
            graph_pools: (split.pools > 0).then_some(split),
        }
    }
}
