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
            // and releases nothing before it raises).
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
}

impl GraphPoolSplit {
    /// None where no segment is a pool's (then the figures stand as they are).
    pub fn of(segments: &[SnapshotSegment]) -> Option<GraphPoolSplit> {
        let mut pools = std::collections::BTreeSet::new();
        let mut split = GraphPoolSplit::default();
        for seg in segments {
            let pooled = vramtop_alloc::in_graph_pool(seg.stream);
            if pooled {
                pools.insert(seg.stream);
            }
            for run in seg.free_runs() {
                split.add_run(run, pooled);
            }
        }
        split.pools = pools.len() as u64;
        (split.pools > 0).then_some(split)
    }

    /// Counts one free run, in a pool's segment or the job's own.
    pub(crate) fn add_run(&mut self, bytes: u64, pooled: bool) {
        if pooled {
            self.pool_free_bytes += bytes;
        } else {
            self.own_free_bytes += bytes;
            self.own_free_runs += 1;
            self.own_largest_free_bytes = self.own_largest_free_bytes.max(bytes);
        }
    }

    /// The OOM's first line where graphs' pools hold free memory: the job's own cache is
    /// what the request could have used, so its runs are the ones counted. "needed 64.0
    /// MiB contiguous; 53.0 MiB free in 12 runs, largest 20.0 MiB, and 11.9 GiB in 6 CUDA
    /// graphs' pools"
    pub fn oom_line(&self, needed_bytes: u64) -> String {
        format!(
            "needed {} contiguous; {} free in {} runs, largest {}, and {} in {} CUDA graphs' \
             pools",
            human_bytes(needed_bytes),
            human_bytes(self.own_free_bytes),
            self.own_free_runs,
            human_bytes(self.own_largest_free_bytes),
            human_bytes(self.pool_free_bytes),
            self.pools
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
