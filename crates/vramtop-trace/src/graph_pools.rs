//! CUDA graphs' private memory pools. Each `torch.cuda.graph` capture (and each of
//! torch.compile's CUDA graphs) allocates into a pool of its own: segments that only its
//! graph uses, kept while the graph lives. PyTorch's snapshot names each segment's pool
//! (`segment_pool_id`: (0, 0) for the allocator's own), but its trace entries name only the
//! stream. So the events inside a private pool's segments are given the pool's stream id
//! (`GRAPH_POOL` set, `StreamIds::in_pool`), and a replay caches them apart, as PyTorch
//! does, and never hands their free memory to the rest of the job. Without it the job's
//! own replay served the request PyTorch had refused, and no remedy could be judged (an
//! MLP trained by six captured graphs under a 16 GiB cap: 11.9 GiB free in their pools,
//! 54 MiB in the job's own).
//!
//! A private segment is known from the snapshots the trace carries (its end, and its
//! start when it begins at a checkpoint); one freed before the end (its graph deleted) is
//! not, and its events stay in the job's own pools.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use vramtop_alloc::{human_bytes, in_graph_pool, StreamId};

use super::{InitialSegment, SnapshotSegment, TraceEvent, TraceEventKind};

/// Gives the events inside a private pool's segments that pool's stream id: a segment the
/// snapshot at the end shows from its last `segment_alloc` on (from the start where the
/// trace did not see it taken); one the state at the start shows (a checkpoint's) from
/// the start to its first `segment_free`. CUDA hands a freed address out again, so the
/// same address may be a pool's at the start and the job's (or another pool's) later.
pub(crate) fn separate(
    events: &mut [TraceEvent],
    initial: &[InitialSegment],
    at_end: &[SnapshotSegment],
) {
    let at_end_private = private(at_end.iter().map(|s| (s.addr, s.total_size, s.stream)));
    let at_start_private = private(initial.iter().map(|s| (s.addr, s.size, s.stream)));
    if at_end_private.is_empty() && at_start_private.is_empty() {
        return;
    }
    // The last `segment_alloc` at a private segment's start took it for the pool; an
    // earlier one there was another segment, since given back.
    let mut taken_at: HashMap<u64, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if e.kind == TraceEventKind::SegmentAlloc && at_end_private.contains_key(&e.addr) {
            taken_at.insert(e.addr, i);
        }
    }
    let mut live_at_end: HashSet<u64> = at_end_private
        .keys()
        .copied()
        .filter(|start| !taken_at.contains_key(start))
        .collect();
    let mut live_at_start: HashSet<u64> = at_start_private.keys().copied().collect();
    // Each stream's last allocation, where it went: a private pool while a capture runs
    // on that stream (PyTorch's `get_pool`).
    let mut last_alloc: HashMap<StreamId, StreamId> = HashMap::new();
    for (i, e) in events.iter_mut().enumerate() {
        match e.kind {
            TraceEventKind::SegmentAlloc if taken_at.get(&e.addr) == Some(&i) => {
                live_at_end.insert(e.addr);
            }
            // An OOM names no address: it was asked of the pool the stream's allocations
            // went to last, a graph's during its capture (there PyTorch searches the pool
            // and releases nothing before it raises). Not told apart: a capture whose very
            // first request fails (its pool has no block yet; torch.cuda.graph captures
            // every graph on one stream, so the last allocation there was the graph
            // before's), and an eager request failing on a stream just used by a graph.
            TraceEventKind::Oom => {
                if let Some(&pool) = last_alloc.get(&e.stream) {
                    e.stream = pool;
                }
                continue;
            }
            TraceEventKind::Snapshot => continue,
            _ => {}
        }
        let raw = e.stream;
        for (segments, live) in [
            (&at_end_private, &mut live_at_end),
            (&at_start_private, &mut live_at_start),
        ] {
            let Some((&start, &(end, stream))) = segments.range(..=e.addr).next_back() else {
                continue;
            };
            if e.addr < end && live.contains(&start) {
                e.stream = stream;
                if e.kind == TraceEventKind::SegmentFree && e.addr == start {
                    live.remove(&start);
                }
                break;
            }
        }
        if e.kind == TraceEventKind::Alloc {
            last_alloc.insert(raw, e.stream);
        }
    }
}

/// The private pools' segments among (address, size, stream id): start -> (end, the
/// pool's stream id).
fn private(segments: impl Iterator<Item = (u64, u64, StreamId)>) -> BTreeMap<u64, (u64, StreamId)> {
    segments
        .filter(|&(_, _, stream)| in_graph_pool(stream))
        .map(|(addr, size, stream)| (addr, (addr.saturating_add(size), stream)))
        .collect()
}

/// A state's free memory split between CUDA graphs' private pools (segments whose stream
/// id has `GRAPH_POOL`: `graph_pools`) and the job's own cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GraphPoolSplit {
    pub pool_free_bytes: u64,
    /// Pools holding any segment.
    pub pools: u64,
    /// Free bytes in the job's own segments, in how many runs, and the largest.
    pub own_free_bytes: u64,
    pub own_free_runs: u64,
    pub own_largest_free_bytes: u64,
    /// Where the request was asked of a pool (during its graph's capture, or in
    /// torch.compile's CUDA graphs' pool): that pool's free memory, the only memory it
    /// could have used. None: asked of the job's own cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked_pool: Option<FreeRuns>,
    /// The pool's stream id `asked_pool` counts.
    #[serde(skip)]
    asked: Option<StreamId>,
}

/// Free memory in runs: bytes, how many runs, the largest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FreeRuns {
    pub free_bytes: u64,
    pub free_runs: u64,
    pub largest_free_bytes: u64,
}

impl FreeRuns {
    /// What a pool the request was asked of had: "3.2 GiB free there in 58 runs, largest
    /// 2.1 GiB", or "none of it free". The OOM's line and its cause both say it.
    pub fn there(&self) -> String {
        if self.free_runs == 0 {
            return "none of it free".to_string();
        }
        format!(
            "{} free there in {} runs, largest {}",
            human_bytes(self.free_bytes),
            self.free_runs,
            human_bytes(self.largest_free_bytes)
        )
    }

    fn add(&mut self, bytes: u64) {
        self.free_bytes += bytes;
        self.free_runs += 1;
        self.largest_free_bytes = self.largest_free_bytes.max(bytes);
    }
}

impl GraphPoolSplit {
    /// None where no segment is a pool's (then the figures stand as they are). `asked`:
    /// the stream id the request was asked on (the trace's `oom` entry's, a pool's after
    /// `separate`).
    pub fn of(segments: &[SnapshotSegment], asked: StreamId) -> Option<GraphPoolSplit> {
        let mut pools = std::collections::BTreeSet::new();
        let mut split = GraphPoolSplit::asking(asked);
        for seg in segments {
            if in_graph_pool(seg.stream) {
                pools.insert(seg.stream);
            }
            for run in seg.free_runs() {
                split.add_run(run, seg.stream);
            }
        }
        split.pools = pools.len() as u64;
        (split.pools > 0).then_some(split)
    }

    /// An empty split for a request asked on `asked`.
    pub(crate) fn asking(asked: StreamId) -> GraphPoolSplit {
        GraphPoolSplit {
            asked_pool: in_graph_pool(asked).then(FreeRuns::default),
            asked: in_graph_pool(asked).then_some(asked),
            ..GraphPoolSplit::default()
        }
    }

    /// Counts one free run of a segment of `stream`: a pool's (the asked one's too where
    /// it is that pool) or the job's own. Runs count per pool by the segment's stream id,
    /// one id a pool (`StreamIds::in_pool`).
    pub(crate) fn add_run(&mut self, bytes: u64, stream: StreamId) {
        if !in_graph_pool(stream) {
            self.own_free_bytes += bytes;
            self.own_free_runs += 1;
            self.own_largest_free_bytes = self.own_largest_free_bytes.max(bytes);
            return;
        }
        self.pool_free_bytes += bytes;
        if self.asked == Some(stream) {
            if let Some(asked) = &mut self.asked_pool {
                asked.add(bytes);
            }
        }
    }

    /// The OOM's first line where graphs' pools hold free memory: the memory the request
    /// could have used comes first. Asked of the job's own cache: "needed 64.0 MiB
    /// contiguous; 53.0 MiB free in 12 runs, largest 20.0 MiB, and 11.9 GiB in 6 CUDA
    /// graphs' pools". Asked of a pool: "needed 2.7 GiB contiguous in a CUDA graph's pool;
    /// 3.2 GiB free there in 58 runs, largest 2.1 GiB (646.0 MiB in the job's own cache)",
    /// or "...in a CUDA graph's pool, none of it free (36.5 MiB in the job's own cache,
    /// 21.8 GiB in 11 other pools)".
    pub fn oom_line(&self, needed_bytes: u64) -> String {
        let Some(asked) = self.asked_pool else {
            return format!(
                "needed {} contiguous; {} free in {} runs, largest {}, and {} in {} CUDA \
                 graphs' pools",
                human_bytes(needed_bytes),
                human_bytes(self.own_free_bytes),
                self.own_free_runs,
                human_bytes(self.own_largest_free_bytes),
                human_bytes(self.pool_free_bytes),
                self.pools
            );
        };
        let there = format!(
            "{}{}",
            if asked.free_runs == 0 { ", " } else { "; " },
            asked.there()
        );
        let mut elsewhere = format!(
            "{} in the job's own cache",
            human_bytes(self.own_free_bytes)
        );
        if self.pools > 1 {
            let others = self.pool_free_bytes.saturating_sub(asked.free_bytes);
            elsewhere.push_str(&format!(
                ", {} in {} other pool{}",
                human_bytes(others),
                self.pools - 1,
                if self.pools == 2 { "" } else { "s" }
            ));
        }
        format!(
            "needed {} contiguous in a CUDA graph's pool{there} ({elsewhere})",
            human_bytes(needed_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_alloc::{Pool, GRAPH_POOL};

    fn segment(addr: u64, size: u64, stream: StreamId) -> SnapshotSegment {
        SnapshotSegment {
            addr,
            total_size: size,
            stream,
            pool: Pool::Large,
            is_expandable: false,
            blocks: Vec::new(),
        }
    }

    #[test]
    fn events_in_a_graphs_pool_take_its_stream_from_its_segment_alloc_on() {
        use TraceEventKind::{Alloc, FreeCompleted, SegmentAlloc, SegmentFree};
        let pool = GRAPH_POOL | 1;
        let mb = 1 << 20;
        let mut events = vec![
            // The range, before the graph's pool took it: the job's own segment.
            TraceEvent::bare(SegmentAlloc, 100 * mb, 20 * mb),
            TraceEvent::bare(Alloc, 100 * mb, 8 * mb),
            TraceEvent::bare(FreeCompleted, 100 * mb, 8 * mb),
            TraceEvent::bare(SegmentFree, 100 * mb, 20 * mb),
            // Taken again by the pool (the snapshot at the end says so).
            TraceEvent::bare(SegmentAlloc, 100 * mb, 20 * mb),
            TraceEvent::bare(Alloc, 104 * mb, 8 * mb),
            // Another segment of the job's, after it: untouched.
            TraceEvent::bare(SegmentAlloc, 120 * mb, 20 * mb),
            TraceEvent::bare(Alloc, 120 * mb, 2 * mb),
            // A pool segment the trace never saw taken: the pool's from the start.
            TraceEvent::bare(Alloc, 200 * mb, 2 * mb),
        ];
        let at_end = [
            segment(100 * mb, 20 * mb, pool),
            segment(120 * mb, 20 * mb, 0),
            segment(200 * mb, 20 * mb, pool),
        ];
        separate(&mut events, &[], &at_end);
        let streams: Vec<StreamId> = events.iter().map(|e| e.stream).collect();
        assert_eq!(streams, [0, 0, 0, 0, pool, pool, 0, 0, pool]);
    }

    /// An OOM is asked of the pool its stream's last allocation went to: a graph's while
    /// its capture runs, the job's own once the stream allocates there again.
    #[test]
    fn an_oom_during_a_capture_is_the_graphs_pools() {
        use TraceEventKind::{Alloc, Oom};
        let pool = GRAPH_POOL | 1;
        let mb = 1 << 20;
        let on = |kind, addr, size, stream| TraceEvent {
            stream,
            ..TraceEvent::bare(kind, addr, size)
        };
        let mut events = vec![
            on(Alloc, 100 * mb, 8 * mb, 5),
            on(Oom, 0, 64 * mb, 5),
            on(Alloc, 120 * mb, 2 * mb, 5),
            on(Oom, 0, 64 * mb, 5),
            on(Oom, 0, 64 * mb, 6),
        ];
        separate(&mut events, &[], &[segment(100 * mb, 20 * mb, pool)]);
        let streams: Vec<StreamId> = events.iter().map(|e| e.stream).collect();
        assert_eq!(streams, [pool, pool, 5, 5, 6]);
    }

    /// A checkpoint's private segment is the pool's until its first `segment_free`; the
    /// job's segment CUDA puts at the same address after is the job's, though the state at
    /// the start said the address was a pool's.
    #[test]
    fn an_address_a_pool_gave_back_is_the_jobs_when_it_takes_it() {
        use TraceEventKind::{Alloc, FreeCompleted, SegmentAlloc, SegmentFree};
        let pool = GRAPH_POOL | 1;
        let mb = 1 << 20;
        let mut events = vec![
            TraceEvent::bare(FreeCompleted, 100 * mb, 8 * mb),
            TraceEvent::bare(SegmentFree, 100 * mb, 20 * mb),
            TraceEvent::bare(SegmentAlloc, 100 * mb, 20 * mb),
            TraceEvent::bare(Alloc, 100 * mb, 8 * mb),
        ];
        let initial = [InitialSegment {
            addr: 100 * mb,
            size: 20 * mb,
            pool: Pool::Large,
            stream: pool,
            blocks: Vec::new(),
        }];
        separate(&mut events, &initial, &[segment(100 * mb, 20 * mb, 0)]);
        let streams: Vec<StreamId> = events.iter().map(|e| e.stream).collect();
        assert_eq!(streams, [pool, pool, 0, 0]);
    }

    #[test]
    fn without_private_pools_nothing_changes() {
        let mut events = vec![TraceEvent::bare(TraceEventKind::Alloc, 1 << 20, 512)];
        separate(&mut events, &[], &[segment(1 << 20, 2 << 20, 3)]);
        assert_eq!(events[0].stream, 0);
    }
}
