//! Side tables of the policies: a slab of block nodes linked in address order within
//! their segment (for O(1) coalescing) plus spare links for a policy's free lists, and
//! the table of segments. Metadata never lives in the memory it describes.

use std::collections::BTreeMap;

use super::types::{BlockState, LayoutRun, Pool, SegmentLayout, StreamId, TagId};

/// "No node": the end of a list.
pub(crate) const NIL: u32 = u32::MAX;

/// What a live block carries for leak bookkeeping and the block map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
}

#[derive(Clone, Debug)]
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
    /// Which free index of the policy this node's segment feeds (caching: pool and
    /// stream); inherited on split.
    pub home: u32,
    pub state: NodeState,
    pub live: LiveInfo,
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
        self.spare.push(slot);
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
        self.insert(Node {
            addr,
            size,
            prev: NIL,
            next: NIL,
            link_prev: NIL,
            link_next: NIL,
            home,
            state: NodeState::Free,
            live: LiveInfo::default(),
        })
    }

    /// Cuts `slot` to `size` bytes; the rest becomes a new free node after it.
    pub fn split(&mut self, slot: u32, size: u64) -> u32 {
        let node = self.get(slot);
        let (rest_addr, rest_size) = (node.addr + size, node.size - size);
        let (next, home) = (node.next, node.home);
        let rest = self.insert(Node {
            addr: rest_addr,
            size: rest_size,
            prev: slot,
            next,
            link_prev: NIL,
            link_next: NIL,
            home,
            state: NodeState::Free,
            live: LiveInfo::default(),
        });
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
            NodeState::Free => BlockState::Free,
        };
        if state == NodeState::Free {
            return plain_run(addr, size, block_state);
        }
        LayoutRun {
            addr,
            size,
            state: block_state,
            requested: node.live.requested,
            id: Some(node.live.id),
            tag: Some(node.live.tag),
            stream: Some(node.live.stream),
            born_ns: Some(node.live.born_ns),
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

/// The segments a policy holds from the backing, by address.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    pub map: BTreeMap<u64, SegmentRec>,
}

impl Segments {
    /// Layout of every segment, walking each one's node chain.
    pub fn layout(&self, arena: &Arena, out: &mut Vec<SegmentLayout>) {
        for (&addr, rec) in &self.map {
            let mut runs = Vec::new();
            let mut slot = rec.head;
            while slot != NIL {
                let node = arena.get(slot);
                runs.push(arena.live_run(slot, node.addr, node.size, node.state));
                slot = node.next;
            }
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
