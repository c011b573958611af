//! Side tables of the policies: a slab of block nodes linked in address order within
//! their segment (for O(1) coalescing) plus spare links for a policy's free lists, and
//! the table of segments. Metadata never lives in the memory it describes.

use std::collections::BTreeMap;

use super::types::{BlockState, LayoutRun, Pool, SegmentLayout, StreamId, TagId};

/// "No node": the end of a list.
pub(crate) const NIL: u32 = u32::MAX;

/// What a live block carries for leak bookkeeping and the block map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LiveInfo {
    pub id: u64,
    pub requested: u64,
    pub stream: StreamId,
    pub tag: TagId,
    pub born_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeState {
    Free,
    Allocated,
    PendingFree,
    /// A recycled slot describing nothing.
    Vacant,
}

impl NodeState {
    pub fn is_live(self) -> bool {
        matches!(self, NodeState::Allocated | NodeState::PendingFree)
    }
}

/// One run of a segment. Exactly one cache line: a free touches the freed node and its
/// two neighbours, and at 100k live blocks each of those is a cache miss, so a node
/// that straddles two lines costs twice.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub(crate) struct Node {
    pub addr: u64,
    pub size: u64,
    /// Address-order neighbours inside the same segment (NIL at segment ends), so
    /// coalescing can never cross a segment boundary.
    pub prev: u32,
    pub next: u32,
    /// Free-list links of the policy's index (unused while allocated).
    pub link_prev: u32,
    pub link_next: u32,
    /// home << 2 | state. Home: which free index of the policy this node's segment
    /// feeds (caching: pool and stream); inherited on split.
    home_state: u32,
    /// size - requested, for live nodes (policies never leave 4 GiB of slack).
    slack: u32,
    id: u64,
    born_ns: u64,
    stream: StreamId,
    tag: TagId,
}

const STATES: [NodeState; 4] = [
    NodeState::Free,
    NodeState::Allocated,
    NodeState::PendingFree,
    NodeState::Vacant,
];

impl Node {
    pub fn free(addr: u64, size: u64, prev: u32, next: u32, home: u32) -> Node {
        Node {
            addr,
            size,
            prev,
            next,
            link_prev: NIL,
            link_next: NIL,
            home_state: home << 2,
            slack: 0,
            id: 0,
            born_ns: 0,
            stream: 0,
            tag: TagId(0),
        }
    }

    #[inline]
    pub fn state(&self) -> NodeState {
        STATES[(self.home_state & 3) as usize]
    }

    #[inline]
    pub fn set_state(&mut self, state: NodeState) {
        self.home_state = (self.home_state & !3) | state as u32;
    }

    #[inline]
    pub fn home(&self) -> u32 {
        self.home_state >> 2
    }

    pub fn live(&self) -> LiveInfo {
        LiveInfo {
            id: self.id,
            requested: self.size - u64::from(self.slack),
            stream: self.stream,
            tag: self.tag,
            born_ns: self.born_ns,
        }
    }

    /// Records the block living in this node; call once its size is final.
    pub fn set_live(&mut self, live: LiveInfo) {
        self.id = live.id;
        self.slack = u32::try_from(self.size.saturating_sub(live.requested)).unwrap_or(u32::MAX);
        self.stream = live.stream;
        self.tag = live.tag;
        self.born_ns = live.born_ns;
    }
}

/// A slab of nodes with recycled slots.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    nodes: Vec<Node>,
    spare: Vec<u32>,
}

impl Arena {
    pub fn insert(&mut self, node: Node) -> u32 {
        if let Some(slot) = self.spare.pop() {
            self.nodes[slot as usize] = node;
            slot
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    pub fn release(&mut self, slot: u32) {
        self.nodes[slot as usize].set_state(NodeState::Vacant);
        self.spare.push(slot);
    }

    /// The node in `slot`, if the slot exists (it may be free or recycled).
    pub fn try_get(&self, slot: u32) -> Option<&Node> {
        self.nodes.get(slot as usize)
    }

    /// Every live (allocated or pending-free) node, in slot order.
    pub fn live_nodes(&self) -> impl Iterator<Item = (u32, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.state().is_live())
            .map(|(i, n)| (i as u32, n))
    }

    /// Every free run's node, in slot order.
    pub fn free_nodes(&self) -> impl Iterator<Item = (u32, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.state() == NodeState::Free)
            .map(|(i, n)| (i as u32, n))
    }

    /// Nodes in use grouped by segment and in address order within each: segment `i`
    /// (of the ascending `bases`) owns `order[starts[i]..starts[i + 1]]`, as
    /// (addr, slot). Walking each segment's chain would cost one dependent cache miss
    /// per node; a scan of the slab and small sorts let the loads overlap instead.
    pub fn in_address_order(&self, bases: &[u64]) -> (Vec<usize>, Vec<(u64, u32)>) {
        let mut seg_of: Vec<u32> = Vec::with_capacity(self.nodes.len());
        let mut starts = vec![0usize; bases.len() + 1];
        for node in &self.nodes {
            let seg = match bases.partition_point(|&b| b <= node.addr).checked_sub(1) {
                Some(s) if node.state() != NodeState::Vacant => s,
                _ => {
                    seg_of.push(u32::MAX);
                    continue;
                }
            };
            seg_of.push(seg as u32);
            starts[seg + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let mut order = vec![(0u64, 0u32); starts[bases.len()]];
        let mut cursor = starts.clone();
        for (slot, (&seg, node)) in seg_of.iter().zip(&self.nodes).enumerate() {
            if seg != u32::MAX {
                let at = &mut cursor[seg as usize];
                order[*at] = (node.addr, slot as u32);
                *at += 1;
            }
        }
        for w in starts.windows(2) {
            order[w[0]..w[1]].sort_unstable_by_key(|&(addr, _)| addr);
        }
        (starts, order)
    }

    #[inline]
    pub fn get(&self, slot: u32) -> &Node {
        &self.nodes[slot as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, slot: u32) -> &mut Node {
        &mut self.nodes[slot as usize]
    }

    /// A fresh free node covering a whole segment.
    pub fn new_free(&mut self, addr: u64, size: u64, home: u32) -> u32 {
        self.insert(Node::free(addr, size, NIL, NIL, home))
    }

    /// Cuts `slot` to `size` bytes; the rest becomes a new free node after it.
    pub fn split(&mut self, slot: u32, size: u64) -> u32 {
        let node = self.get(slot);
        let (rest_addr, rest_size) = (node.addr + size, node.size - size);
        let (next, home) = (node.next, node.home());
        let rest = self.insert(Node::free(rest_addr, rest_size, slot, next, home));
        if next != NIL {
            self.get_mut(next).prev = rest;
        }
        let node = self.get_mut(slot);
        node.size = size;
        node.next = rest;
        rest
    }

    /// Folds the address-order successor of `slot` into it and recycles the
    /// successor's slot. The lower node survives, so a segment's head stays valid.
    pub fn absorb_next(&mut self, slot: u32) {
        let next = self.get(slot).next;
        let (size, after) = {
            let n = self.get(next);
            (n.size, n.next)
        };
        let node = self.get_mut(slot);
        node.size += size;
        node.next = after;
        if after != NIL {
            self.get_mut(after).prev = slot;
        }
        self.release(next);
    }

    /// The block-map run for `[addr, addr+size)` of node `slot` in `state`.
    pub fn live_run(&self, slot: u32, addr: u64, size: u64, state: NodeState) -> LayoutRun {
        let node = self.get(slot);
        let block_state = match state {
            NodeState::Allocated => BlockState::Allocated,
            NodeState::PendingFree => BlockState::PendingFree,
            NodeState::Free | NodeState::Vacant => BlockState::Free,
        };
        if !state.is_live() {
            return plain_run(addr, size, block_state);
        }
        LayoutRun {
            addr,
            size,
            state: block_state,
            requested: node.size - u64::from(node.slack),
            id: Some(node.id),
            tag: Some(node.tag),
            stream: Some(node.stream),
            born_ns: Some(node.born_ns),
        }
    }
}

/// A run with no block behind it (free or unmapped).
pub(crate) fn plain_run(addr: u64, size: u64, state: BlockState) -> LayoutRun {
    LayoutRun {
        addr,
        size,
        state,
        requested: 0,
        id: None,
        tag: None,
        stream: None,
        born_ns: None,
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentRec {
    pub size: u64,
    pub pool: Pool,
    pub stream: Option<StreamId>,
    /// The node at the segment's first byte.
    pub head: u32,
}

impl SegmentRec {
    /// Held by a CUDA graph's private pool (`crate::types::GRAPH_POOL`): never released.
    pub fn in_graph_pool(&self) -> bool {
        self.stream.is_some_and(crate::types::in_graph_pool)
    }
}

/// The segments a policy holds from the backing, by address.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    pub map: BTreeMap<u64, SegmentRec>,
}

impl Segments {
    /// Layout of every segment.
    pub fn layout(&self, arena: &Arena, out: &mut Vec<SegmentLayout>) {
        let bases: Vec<u64> = self.map.keys().copied().collect();
        let (starts, order) = arena.in_address_order(&bases);
        out.reserve(bases.len());
        for (i, (&addr, rec)) in self.map.iter().enumerate() {
            let runs = order[starts[i]..starts[i + 1]]
                .iter()
                .map(|&(_, slot)| {
                    let node = arena.get(slot);
                    arena.live_run(slot, node.addr, node.size, node.state())
                })
                .collect();
            out.push(SegmentLayout {
                addr,
                size: rec.size,
                pool: rec.pool,
                stream: rec.stream,
                runs,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Node>(), 64);
        let mut node = Node::free(0, 4096, NIL, NIL, 5);
        node.set_state(NodeState::PendingFree);
        assert_eq!((node.home(), node.state()), (5, NodeState::PendingFree));
        node.set_live(LiveInfo {
            id: 9,
            requested: 4000,
            stream: 3,
            tag: TagId(2),
            born_ns: 77,
        });
        assert_eq!(node.live().requested, 4000);
        assert_eq!(node.state(), NodeState::PendingFree);
    }

    #[test]
    fn split_then_absorb_restores_one_node() {
        let mut arena = Arena::default();
        let a = arena.new_free(0x1000, 4096, 0);
        let b = arena.split(a, 1024);
        let c = arena.split(b, 1024);
        assert_eq!(arena.get(a).next, b);
        assert_eq!(arena.get(c).prev, b);
        assert_eq!(arena.get(c).addr, 0x1000 + 2048);
        arena.absorb_next(a);
        assert_eq!(arena.get(a).size, 2048);
        assert_eq!(arena.get(c).prev, a);
        arena.absorb_next(a);
        assert_eq!(arena.get(a).size, 4096);
        assert_eq!(arena.get(a).next, NIL);
        // Slots are recycled.
        let d = arena.new_free(0, 512, 0);
        assert!(d == b || d == c);
    }
}
