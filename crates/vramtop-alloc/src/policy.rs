//! The seam between the allocator core and its policies: the `Policy` trait, and
//! `BackingCx`, the only way a policy reaches the backing, so every segment and page
//! change is counted and announced the same way whatever the policy.

use super::arena::{Arena, LiveInfo};
use super::events::{EventData, EventRing};
use super::metrics::{Counters, FreeSummary};
use super::types::{EventKind, Pool, SegmentLayout, StreamId};
use crate::backing::{Backing, BackingError};

/// Where a policy put a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    pub node: u32,
    pub addr: u64,
    pub size: u64,
}

/// Why a policy could not place a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Shortfall {
    /// No free run fits and the backing is at capacity: try releasing cached memory.
    Exhausted,
    /// The backing failed otherwise.
    Backing(String),
}

impl From<BackingError> for Shortfall {
    fn from(e: BackingError) -> Self {
        match e {
            BackingError::Exhausted { .. } => Shortfall::Exhausted,
            BackingError::Failed(msg) => Shortfall::Backing(msg),
        }
    }
}

/// What the OOM report counts as free (see `Policy::oom_view`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OomView {
    pub runs: u64,
    pub total: u64,
    pub largest: u64,
}

pub(crate) trait Policy: Send {
    /// The size a request of `size` bytes is booked at (512 B rounding by default).
    fn round(&self, size: u64) -> Option<u64> {
        super::types::round_size(size)
    }
    /// Places `size` bytes (already rounded to 512) for the block described by `live`.
    fn alloc(
        &mut self,
        size: u64,
        live: LiveInfo,
        cx: &mut BackingCx<'_>,
    ) -> Result<Placement, Shortfall>;
    /// `alloc` again after cached segments were released for it. PyTorch's retries are
    /// cudaMalloc alone (`alloc_block`): releasing wholly free segments makes no free block
    /// fit, so only a policy whose search counts for something (the GC's ages) skips it.
    fn alloc_after_release(
        &mut self,
        size: u64,
        live: LiveInfo,
        cx: &mut BackingCx<'_>,
    ) -> Result<Placement, Shortfall> {
        self.alloc(size, live, cx)
    }
    /// Returns an allocated or pending node to the free runs.
    fn free(&mut self, node: u32, cx: &mut BackingCx<'_>);
    /// Marks an allocated node pending-free: still held, shown as such.
    fn set_pending(&mut self, node: u32);
    /// Gives wholly free segments back to the backing; returns how many.
    fn release_cached(&mut self, cx: &mut BackingCx<'_>) -> u64;
    /// Before releasing every cached segment, what PyTorch tries first under
    /// `max_split_size_mb` (`release_available_cached_blocks`): just enough of the cached
    /// oversize segments for a request of `size` on `stream`. True when they sufficed.
    fn release_available(
        &mut self,
        _size: u64,
        _stream: StreamId,
        _cx: &mut BackingCx<'_>,
    ) -> bool {
        false
    }
    /// Free runs as `Stats` counts them: inside reserved memory.
    fn free_summary(&self) -> FreeSummary;
    /// Free space a request could be placed into, for OOM reports; by default the free
    /// runs inside reserved memory.
    fn oom_view(&self, _headroom: u64) -> OomView {
        let s = self.free_summary();
        OomView {
            runs: s.runs,
            total: s.total,
            largest: s.largest,
        }
    }
    fn layout(&self, out: &mut Vec<SegmentLayout>);
    /// Books a segment the backing gave out at `addr`, with live blocks already at the
    /// given (offset, size) places, checked by the caller: how a replay starts from the
    /// traced allocator's own state. `None`: this policy cannot, and the caller places
    /// the blocks with `alloc` instead (before booking anything).
    fn adopt(
        &mut self,
        _addr: u64,
        _size: u64,
        _pool: Pool,
        _stream: StreamId,
        _blocks: &[(u64, u64, LiveInfo)],
    ) -> Option<Vec<Placement>> {
        None
    }
    /// Whether `adopt` works for this policy.
    fn can_adopt(&self) -> bool {
        false
    }
    /// The policy's nodes, for receipt checks and leak queries.
    fn arena(&self) -> &Arena;
}

/// The backing, seen through the counters and the event ring.
pub(crate) struct BackingCx<'a> {
    pub backing: &'a mut dyn Backing,
    pub counters: &'a mut Counters,
    pub events: &'a EventRing,
    pub now_ns: u64,
    /// Stream of the request being served (0 outside a request).
    pub stream: StreamId,
}

impl BackingCx<'_> {
    fn announce(&self, kind: EventKind, addr: u64, size: u64) {
        self.events.push(EventData {
            time_ns: self.now_ns,
            kind,
            addr,
            size,
            stream: self.stream,
            tag: None,
            alloc_id: None,
        });
    }

    pub fn alloc_segment(&mut self, size: u64) -> Result<u64, BackingError> {
        let addr = self.backing.alloc_segment(size)?;
        self.counters.segment_allocs += 1;
        self.counters.add_reserved(size);
        self.announce(EventKind::SegmentAlloc, addr, size);
        Ok(addr)
    }

    pub fn free_segment(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.backing.free_segment(addr, size)?;
        self.counters.segment_frees += 1;
        self.counters.reserved -= size;
        self.announce(EventKind::SegmentFree, addr, size);
        Ok(())
    }

    pub fn map_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.backing.map_pages(addr, size)?;
        self.counters.page_maps += 1;
        self.counters.add_reserved(size);
        self.announce(EventKind::PageMap, addr, size);
        Ok(())
    }

    pub fn unmap_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.backing.unmap_pages(addr, size)?;
        self.counters.page_unmaps += 1;
        self.counters.reserved -= size;
        self.announce(EventKind::PageUnmap, addr, size);
        Ok(())
    }

    /// Address space only: not reserved bytes, no event.
    pub fn reserve_range(&mut self, size: u64) -> Result<u64, BackingError> {
        self.backing.reserve_range(size)
    }

    pub fn capacity(&self) -> u64 {
        self.backing.capacity()
    }

    pub fn page_size(&self) -> u64 {
        self.backing.page_size()
    }

    pub fn headroom(&self) -> u64 {
        self.backing.capacity().saturating_sub(self.backing.held())
    }
}
