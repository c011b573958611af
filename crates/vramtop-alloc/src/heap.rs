//! The machinery every policy shares: segments carved into address-linked nodes, a
//! free index to find runs, split on take, coalesce with free neighbours of the same
//! segment on give-back, and release of wholly free segments.

use super::arena::{Arena, LiveInfo, NodeState, SegmentRec, Segments, NIL};
use super::metrics::FreeSummary;
use super::policy::{BackingCx, Placement};
use super::types::{Pool, StreamId};

/// How a policy finds free runs; the heap tells it which runs come and go.
pub(crate) trait FreeIndex {
    fn insert(&mut self, arena: &mut Arena, slot: u32);
    fn remove(&mut self, arena: &mut Arena, slot: u32);
    fn summary(&self, arena: &Arena) -> FreeSummary;
}

#[derive(Debug, Default)]
pub(crate) struct Heap<I> {
    pub arena: Arena,
    pub segments: Segments,
    pub index: I,
}

impl<I: FreeIndex> Heap<I> {
    /// Books a new segment as one free run; returns its node.
    pub fn add_segment(
        &mut self,
        addr: u64,
        size: u64,
        pool: Pool,
        stream: Option<StreamId>,
        home: u32,
    ) -> u32 {
        let slot = self.arena.new_free(addr, size, home);
        self.segments.map.insert(
            addr,
            SegmentRec {
                size,
                pool,
                stream,
                head: slot,
            },
        );
        self.index.insert(&mut self.arena, slot);
        slot
    }

    /// Books a segment the backing gave out at `addr` with live blocks already at the
    /// given offsets (a replay's state at the start of a trace): `blocks` are in offset
    /// order, do not overlap and lie inside the segment (the caller checks).
    pub fn adopt(
        &mut self,
        addr: u64,
        size: u64,
        pool: Pool,
        stream: Option<StreamId>,
        home: u32,
        blocks: &[(u64, u64, LiveInfo)],
    ) -> Vec<Placement> {
        let mut free = self.add_segment(addr, size, pool, stream, home);
        let mut placed = Vec::with_capacity(blocks.len());
        for &(offset, block_size, live) in blocks {
            let into = addr + offset - self.arena.get(free).addr;
            let p = self.take(free, into, block_size, true, live);
            placed.push(p);
            free = self.arena.get(p.node).next;
            if free == NIL {
                break;
            }
        }
        placed
    }

    /// Takes `size` bytes at `offset` into free node `slot` for a live block. The
    /// bytes before stay free; the bytes after are split off when `split_rest`,
    /// otherwise they go with the block.
    pub fn take(
        &mut self,
        slot: u32,
        offset: u64,
        size: u64,
        split_rest: bool,
        live: LiveInfo,
    ) -> Placement {
        self.index.remove(&mut self.arena, slot);
        let mut target = slot;
        if offset > 0 {
            target = self.arena.split(slot, offset);
            self.index.insert(&mut self.arena, slot);
        }
        if split_rest && self.arena.get(target).size > size {
            let rest = self.arena.split(target, size);
            self.index.insert(&mut self.arena, rest);
        }
        let node = self.arena.get_mut(target);
        node.set_state(NodeState::Allocated);
        node.set_live(live);
        Placement {
            node: target,
            addr: node.addr,
            size: node.size,
        }
    }

    /// Frees a live node and merges it with free neighbours of its segment; returns
    /// the surviving free node.
    pub fn give_back(&mut self, slot: u32) -> u32 {
        let mut slot = slot;
        self.arena.get_mut(slot).set_state(NodeState::Free);
        let next = self.arena.get(slot).next;
        if next != NIL && self.arena.get(next).state() == NodeState::Free {
            self.index.remove(&mut self.arena, next);
            self.arena.absorb_next(slot);
        }
        let prev = self.arena.get(slot).prev;
        if prev != NIL && self.arena.get(prev).state() == NodeState::Free {
            self.index.remove(&mut self.arena, prev);
            self.arena.absorb_next(prev);
            slot = prev;
        }
        self.index.insert(&mut self.arena, slot);
        slot
    }

    pub fn set_pending(&mut self, slot: u32) {
        self.arena.get_mut(slot).set_state(NodeState::PendingFree);
    }

    /// Gives every wholly free segment back to the backing, but a CUDA graph's pool's
    /// (`GRAPH_POOL`). A segment the backing refuses to take stays booked (and cached).
    pub fn release_free_segments(&mut self, cx: &mut BackingCx<'_>) -> u64 {
        let mut released = 0;
        for (addr, rec) in self
            .idle_segments()
            .into_iter()
            .filter(|(_, rec)| !rec.in_graph_pool())
        {
            if self.release_segment(addr, rec, cx) {
                released += 1;
            }
        }
        released
    }

    /// The wholly free segments (PyTorch: the free blocks that are not split).
    pub fn idle_segments(&self) -> Vec<(u64, SegmentRec)> {
        self.segments
            .map
            .iter()
            .filter(|(_, rec)| {
                let head = self.arena.get(rec.head);
                head.state() == NodeState::Free && head.next == NIL
            })
            .map(|(&addr, rec)| (addr, *rec))
            .collect()
    }

    /// Gives one wholly free segment back; false if the backing refused it.
    pub fn release_segment(&mut self, addr: u64, rec: SegmentRec, cx: &mut BackingCx<'_>) -> bool {
        if cx.free_segment(addr, rec.size).is_err() {
            return false;
        }
        self.index.remove(&mut self.arena, rec.head);
        self.arena.release(rec.head);
        self.segments.map.remove(&addr);
        true
    }

    pub fn free_summary(&self) -> FreeSummary {
        self.index.summary(&self.arena)
    }
}
