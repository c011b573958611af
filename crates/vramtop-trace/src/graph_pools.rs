//! CUDA graphs' private memory pools. Each `torch.cuda.graph` capture (and each of
//! torch.compile's CUDA graphs) allocates into a pool of its own: segments that only its
//! graph uses, kept while the graph lives. PyTorch's snapshot names each segment's pool
//! (`segment_pool_id`: (0, 0) for the allocator's own), but its trace entries name only the
//! stream. So the events inside a private pool's segments are given the pool's stream id
//! (`GRAPH_POOL` set, `StreamIds::in_pool`), and a replay caches them apart, as PyTorch
//! does, and never hands their free memory to the rest of the job. Without it the job's
//! own replay served the request PyTorch had refused, and no remedy could be judged (an
//! MLP trained by six captured graphs under a 16 GiB cap: 11.9 GiB free in their pools,
//! 53 MiB in the job's own).
//!
//! A private segment is known from the snapshots the trace carries (its end, and its
//! start when it begins at a checkpoint); one freed before the end (its graph deleted) is
//! not, and its events stay in the job's own pools.

use std::collections::{BTreeMap, HashMap, HashSet};

use vramtop_alloc::{in_graph_pool, StreamId};

use super::{InitialSegment, SnapshotSegment, TraceEvent, TraceEventKind};

/// Gives the events inside a private pool's segments that pool's stream id: from the
/// start for a segment the trace did not see taken, else from its `segment_alloc` to its
/// `segment_free`.
pub(crate) fn separate(
    events: &mut [TraceEvent],
    initial: &[InitialSegment],
    at_end: &[SnapshotSegment],
) {
    // start -> (end, the pool's stream id)
    let private: BTreeMap<u64, (u64, StreamId)> = at_end
        .iter()
        .map(|s| (s.addr, s.total_size, s.stream))
        .chain(initial.iter().map(|s| (s.addr, s.size, s.stream)))
        .filter(|&(_, _, stream)| in_graph_pool(stream))
        .map(|(addr, size, stream)| (addr, (addr.saturating_add(size), stream)))
        .collect();
    if private.is_empty() {
        return;
    }
    // The last `segment_alloc` at a private segment's start took it for the pool; an
    // earlier one there was another segment, since given back.
    let mut taken_at: HashMap<u64, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if e.kind == TraceEventKind::SegmentAlloc && private.contains_key(&e.addr) {
            taken_at.insert(e.addr, i);
        }
    }
    let mut live: HashSet<u64> = private
        .keys()
        .copied()
        .filter(|start| !taken_at.contains_key(start))
        .collect();
    for (i, e) in events.iter_mut().enumerate() {
        match e.kind {
            TraceEventKind::SegmentAlloc if taken_at.get(&e.addr) == Some(&i) => {
                live.insert(e.addr);
            }
            TraceEventKind::Oom | TraceEventKind::Snapshot => continue,
            _ => {}
        }
        let Some((&start, &(end, stream))) = private.range(..=e.addr).next_back() else {
            continue;
        };
        if e.addr < end && live.contains(&start) {
            e.stream = stream;
            if e.kind == TraceEventKind::SegmentFree && e.addr == start {
                live.remove(&start);
            }
        }
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

    #[test]
    fn without_private_pools_nothing_changes() {
        let mut events = vec![TraceEvent::bare(TraceEventKind::Alloc, 1 << 20, 512)];
        separate(&mut events, &[], &[segment(1 << 20, 2 << 20, 3)]);
        assert_eq!(events[0].stream, 0);
    }
}
