//! The `expandable` policy: an ideal page-mapped allocator (CUDA VMM), the lower bound
//! of what expandable segments can do (`pytorch_expandable.rs` follows PyTorch's own
//! rules): one address range of twice the backing's capacity is reserved up front
//! (lazily, at the first allocation) and memory is mapped behind it a page at a time.
//! Blocks are placed best fit in the address range; a page is mapped while any live
//! block touches it and unmapped as soon as none does, so reserved bytes = mapped bytes.
//!
//! "Free" has two meanings here. `Stats` counts free runs on mapped pages only (what
//! the block map draws as free). An OOM report counts what a request could be placed
//! into: free bytes on mapped pages plus unmapped free address space up to the
//! backing's headroom (capacity - held), in as many runs as there are free address
//! ranges; the largest is a whole free range when its unmapped pages fit the headroom,
//! else its largest mapped piece plus the headroom (an upper estimate).

use super::arena::{plain_run, Arena, LiveInfo};
use super::heap::Heap;
use super::metrics::FreeSummary;
use super::policy::{BackingCx, OomView, Placement, Policy, Shortfall};
use super::size_index::SizeIndex;
use super::types::{BlockState, Pool, SegmentLayout};

/// Address space reserved, as a multiple of the backing's capacity.
const RESERVE_FACTOR: u64 = 2;

/// The reserved range and the state of its pages.
#[derive(Debug)]
struct Range {
    base: u64,
    size: u64,
    page: u64,
    /// Live blocks touching each page.
    refs: Vec<u32>,
    /// Whether memory is behind each page (normally refs > 0; a page whose unmap
    /// the backing refused stays mapped).
    mapped: Vec<bool>,
}

impl Range {
    fn pages(&self, addr: u64, size: u64) -> std::ops::RangeInclusive<usize> {
        let first = ((addr - self.base) / self.page) as usize;
        let last = ((addr + size.max(1) - 1 - self.base) / self.page) as usize;
        first..=last
    }

    fn page_addr(&self, p: usize) -> u64 {
        self.base + p as u64 * self.page
    }

    /// Maximal runs of pages in `span` whose mapped state is `want` (and, when
    /// `only_idle`, that no live block touches), as (first page, count).
    fn runs(
        &self,
        span: std::ops::RangeInclusive<usize>,
        want: bool,
        only_idle: bool,
    ) -> Vec<(usize, usize)> {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for p in span {
            if self.mapped[p] != want || (only_idle && self.refs[p] != 0) {
                continue;
            }
            match out.last_mut() {
                Some((start, n)) if *start + *n == p => *n += 1,
                _ => out.push((p, 1)),
            }
        }
        out
    }

    fn unmapped_in(&self, addr: u64, size: u64) -> u64 {
        self.pages(addr, size).filter(|&p| !self.mapped[p]).count() as u64
    }

    /// Calls `f(addr, len, mapped)` for the maximal pieces of a free run that lie on
    /// mapped and unmapped pages.
    fn pieces(&self, addr: u64, size: u64, mut f: impl FnMut(u64, u64, bool)) {
        if size == 0 {
            return;
        }
        let end = addr + size;
        let last = ((end - 1 - self.base) / self.page) as usize;
        let mut cur = addr;
        while cur < end {
            let p = ((cur - self.base) / self.page) as usize;
            let mapped = self.mapped[p];
            // The run's last page, found by scanning the flags alone: stats walk every free
            // run, and a run over the unmapped rest of the range is tens of thousands of
            // pages (a replay asks for stats at each new peak).
            let run_last = self.mapped[p + 1..=last]
                .iter()
                .position(|&m| m != mapped)
                .map_or(last, |n| p + n);
            let stop = end.min(self.page_addr(run_last + 1));
            f(cur, stop - cur, mapped);
            cur = stop;
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Expandable {
    heap: Heap<SizeIndex>,
    range: Option<Range>,
}

impl Expandable {
    fn ensure_range(&mut self, cx: &mut BackingCx<'_>) -> Result<(), Shortfall> {
        if self.range.is_some() {
            return Ok(());
        }
        let page = cx.page_size().max(1);
        // Address space is cheap and memory is not: like PyTorch's expandable segments,
        // reserve more address space than the memory it may ever map, so a request can
        // always be placed in one contiguous range past the holes that frees left, with
        // pages unmapped from those holes mapped again at the end.
        let size = cx.capacity().saturating_mul(RESERVE_FACTOR) / page * page;
        if size == 0 {
            return Err(Shortfall::Exhausted);
        }
        let base = cx.reserve_range(size)?;
        self.heap.add_segment(base, size, Pool::Range, None, 0);
        let pages = (size / page) as usize;
        self.range = Some(Range {
            base,
            size,
            page,
            refs: vec![0; pages],
            mapped: vec![false; pages],
        });
        Ok(())
    }

    /// Maps the unmapped pages of a new block and counts it on every page it touches.
    fn map_span(
        range: &mut Range,
        addr: u64,
        size: u64,
        cx: &mut BackingCx<'_>,
    ) -> Result<(), Shortfall> {
        let runs = range.runs(range.pages(addr, size), false, false);
        let need: u64 = runs.iter().map(|&(_, n)| n as u64 * range.page).sum();
        if need > cx.headroom() {
            return Err(Shortfall::Exhausted);
        }
        for (i, &(first, n)) in runs.iter().enumerate() {
            if let Err(e) = cx.map_pages(range.page_addr(first), n as u64 * range.page) {
                for &(f, m) in &runs[..i] {
                    if cx
                        .unmap_pages(range.page_addr(f), m as u64 * range.page)
                        .is_ok()
                    {
                        range.mapped[f..f + m].iter_mut().for_each(|b| *b = false);
                    }
                }
                return Err(e.into());
            }
            range.mapped[first..first + n]
                .iter_mut()
                .for_each(|b| *b = true);
        }
        for p in range.pages(addr, size) {
            range.refs[p] += 1;
        }
        Ok(())
    }

    /// Uncounts a freed block and unmaps the pages no live block touches any more.
    fn unmap_span(range: &mut Range, addr: u64, size: u64, cx: &mut BackingCx<'_>) {
        for p in range.pages(addr, size) {
            range.refs[p] -= 1;
        }
        for (first, n) in range.runs(range.pages(addr, size), true, true) {
            if cx
                .unmap_pages(range.page_addr(first), n as u64 * range.page)
                .is_ok()
            {
                range.mapped[first..first + n]
                    .iter_mut()
                    .for_each(|b| *b = false);
            }
        }
    }

    /// When the best fit needs more new pages than the backing has left: the free
    /// run and offset (its start or its end) needing the fewest new pages, if those
    /// fit. O(free runs); only on the way to an out-of-memory.
    fn fallback(&self, range: &Range, size: u64, headroom: u64) -> Option<(u32, u64)> {
        let mut best: Option<(u64, u32, u64)> = None;
        for (slot, node) in self.heap.arena.free_nodes() {
            if node.size < size {
                continue;
            }
            for offset in [0, node.size - size] {
                let pages = range.unmapped_in(node.addr + offset, size);
                if best.is_none_or(|(b, _, _)| pages < b) {
                    best = Some((pages, slot, offset));
                }
            }
        }
        best.filter(|&(pages, _, _)| pages * range.page <= headroom)
            .map(|(_, slot, offset)| (slot, offset))
    }
}

impl Policy for Expandable {
    fn alloc(
        &mut self,
        size: u64,
        live: LiveInfo,
        cx: &mut BackingCx<'_>,
    ) -> Result<Placement, Shortfall> {
        self.ensure_range(cx)?;
        let Some(range) = self.range.as_ref() else {
            return Err(Shortfall::Exhausted);
        };
        let headroom = cx.headroom();
        let best = self
            .heap
            .index
            .find(&self.heap.arena, size)
            .filter(|&slot| {
                let addr = self.heap.arena.get(slot).addr;
                range.unmapped_in(addr, size) * range.page <= headroom
            });
        let (slot, offset) = match best {
            Some(slot) => (slot, 0),
            None => self
                .fallback(range, size, headroom)
                .ok_or(Shortfall::Exhausted)?,
        };
        let addr = self.heap.arena.get(slot).addr + offset;
        let Some(range) = self.range.as_mut() else {
            return Err(Shortfall::Exhausted);
        };
        Self::map_span(range, addr, size, cx)?;
        Ok(self.heap.take(slot, offset, size, true, live))
    }

    fn free(&mut self, node: u32, cx: &mut BackingCx<'_>) {
        let (addr, size) = {
            let n = self.heap.arena.get(node);
            (n.addr, n.size)
        };
        self.heap.give_back(node);
        if let Some(range) = self.range.as_mut() {
            Self::unmap_span(range, addr, size, cx);
        }
    }

    fn set_pending(&mut self, node: u32) {
        self.heap.set_pending(node);
    }

    /// Pages are unmapped as soon as they are idle: nothing is cached.
    fn release_cached(&mut self, _cx: &mut BackingCx<'_>) -> u64 {
        0
    }

    fn free_summary(&self) -> FreeSummary {
        let mut summary = FreeSummary::default();
        let Some(range) = &self.range else {
            return summary;
        };
        for (_, node) in self.heap.arena.free_nodes() {
            range.pieces(node.addr, node.size, |_, len, mapped| {
                if mapped {
                    summary.add(len);
                }
            });
        }
        summary
    }

    fn oom_view(&self, headroom: u64) -> OomView {
        let mut view = OomView::default();
        let Some(range) = &self.range else {
            return view;
        };
        let headroom_pages = headroom / range.page * range.page;
        let (mut mapped_total, mut unmapped_total) = (0, 0);
        for (_, node) in self.heap.arena.free_nodes() {
            let (mut mapped, mut unmapped, mut piece) = (0, 0, 0);
            range.pieces(node.addr, node.size, |_, len, is_mapped| {
                if is_mapped {
                    mapped += len;
                    piece = piece.max(len);
                } else {
                    unmapped += len;
                }
            });
            let usable = if unmapped <= headroom_pages {
                node.size
            } else {
                (piece + headroom_pages).min(node.size)
            };
            view.runs += 1;
            view.largest = view.largest.max(usable);
            mapped_total += mapped;
            unmapped_total += unmapped;
        }
        view.total = mapped_total + unmapped_total.min(headroom_pages);
        view
    }

    fn layout(&self, out: &mut Vec<SegmentLayout>) {
        let Some(range) = &self.range else { return };
        let (_, order) = self.heap.arena.in_address_order(&[range.base]);
        let mut runs = Vec::with_capacity(order.len() + 16);
        for (_, slot) in order {
            let node = self.heap.arena.get(slot);
            if node.state().is_live() {
                runs.push(
                    self.heap
                        .arena
                        .live_run(slot, node.addr, node.size, node.state()),
                );
                continue;
            }
            range.pieces(node.addr, node.size, |addr, len, mapped| {
                let state = if mapped {
                    BlockState::Free
                } else {
                    BlockState::Unmapped
                };
                runs.push(plain_run(addr, len, state));
            });
        }
        out.push(SegmentLayout {
            addr: range.base,
            size: range.size,
            pool: Pool::Range,
            stream: None,
            runs,
        });
    }

    fn arena(&self) -> &Arena {
        &self.heap.arena
    }
}
