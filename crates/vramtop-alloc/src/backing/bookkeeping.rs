//! A backing of bare address ranges with no memory behind them: it keeps the books
//! (what is held, what is mapped, the capacity) so policies, probes and tests run the
//! same code as on a GPU, at any scale, without touching a byte.

use super::{check_capacity, Backing, BackingError, RangeBook, SegmentBook, DEFAULT_PAGE_SIZE};

/// Where the fake address space starts: far from zero, so a stray 0 stands out.
const BASE_ADDR: u64 = 0x7f00_0000_0000;
/// Where a top-down backing starts handing out segments (downwards from here).
const TOP_ADDR: u64 = 0x7fff_0000_0000;

#[derive(Debug)]
pub struct BookkeepingBacking {
    capacity: u64,
    page_size: u64,
    held: u64,
    /// Next unused address; addresses are never reused, which keeps stale receipts
    /// from aliasing new ranges (except where a replay hints an address the traced
    /// allocator reused: then the trace says it was free).
    next_addr: u64,
    /// The address the next segment of this size should get (`hint_segment`).
    hint: Option<(u64, u64)>,
    /// Segments go downwards from TOP_ADDR, as CUDA's driver tends to place them (the
    /// order of addresses decides which of equal free blocks PyTorch takes); else up.
    /// Reserved ranges always go up from BASE_ADDR.
    top_down: Option<u64>,
    segments: SegmentBook,
    ranges: RangeBook,
}

impl BookkeepingBacking {
    pub fn new(capacity: u64) -> Self {
        Self::with_page_size(capacity, DEFAULT_PAGE_SIZE)
    }

    /// A backing with another mapping granularity; `page_size` is raised to the next
    /// power of two of at least 512 bytes.
    pub fn with_page_size(capacity: u64, page_size: u64) -> Self {
        BookkeepingBacking {
            capacity,
            page_size: page_size.max(512).next_power_of_two(),
            held: 0,
            next_addr: BASE_ADDR,
            hint: None,
            top_down: None,
            segments: SegmentBook::default(),
            ranges: RangeBook::default(),
        }
    }

    /// Segments from the top of the address space downwards (see `top_down`).
    pub fn top_down(mut self) -> Self {
        self.top_down = Some(TOP_ADDR);
        self
    }

    /// The next `size` bytes below the last segment placed top-down, below any segment
    /// in the way.
    fn take_addresses_down(&mut self, below: u64, size: u64) -> Result<u64, BackingError> {
        let exhausted = || BackingError::Failed(format!("address space exhausted ({size} B)"));
        let span = size
            .checked_next_multiple_of(self.page_size)
            .ok_or_else(exhausted)?;
        let mut addr = below.checked_sub(span).ok_or_else(exhausted)?;
        addr -= addr % self.page_size;
        loop {
            // Below a segment in the way, and below the reserved ranges, which grow up
            // from BASE_ADDR to `next_addr`. A replay places a checkpoint's segments where
            // PyTorch had them, which may be below BASE_ADDR: the space under them is
            // free too.
            let in_the_way = match self.segments.overlapping(addr, span) {
                Some((base, _)) => Some(base),
                None if addr < self.next_addr && addr.saturating_add(span) > BASE_ADDR => {
                    Some(BASE_ADDR)
                }
                None => None,
            };
            let Some(base) = in_the_way else { break };
            addr = base.checked_sub(span).ok_or_else(exhausted)?;
            addr -= addr % self.page_size;
        }
        self.top_down = Some(addr);
        Ok(addr)
    }

    /// Hands out the next `size` bytes of address space, page-aligned, past any segment
    /// placed at a hinted address.
    fn take_addresses(&mut self, size: u64) -> Result<u64, BackingError> {
        let exhausted = || BackingError::Failed(format!("address space exhausted ({size} B)"));
        let span = size
            .checked_next_multiple_of(self.page_size)
            .ok_or_else(exhausted)?;
        let mut addr = self.next_addr;
        while let Some(end) = self.segments.overlap_end(addr, span) {
            addr = end
                .checked_next_multiple_of(self.page_size)
                .ok_or_else(exhausted)?;
        }
        self.next_addr = addr.checked_add(span).ok_or_else(exhausted)?;
        Ok(addr)
    }

    /// The hinted address for a segment of `size`, if there is one and it is free.
    fn hinted(&mut self, size: u64) -> Option<u64> {
        let (addr, hinted_size) = self.hint.take()?;
        let free =
            !self.ranges.overlaps(addr, size) && self.segments.overlap_end(addr, size).is_none();
        (hinted_size == size && free && addr != 0).then_some(addr)
    }
}

impl Backing for BookkeepingBacking {
    fn name(&self) -> &str {
        "bookkeeping"
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn page_size(&self) -> u64 {
        self.page_size
    }

    fn held(&self) -> u64 {
        self.held
    }

    fn alloc_segment(&mut self, size: u64) -> Result<u64, BackingError> {
        check_capacity(self.held, size, self.capacity)?;
        let addr = match (self.hinted(size), self.top_down) {
            (Some(addr), below) => {
                // Later segments go below this one too.
                if below.is_some_and(|b| addr < b) {
                    self.top_down = Some(addr);
                }
                addr
            }
            (None, Some(below)) => self.take_addresses_down(below, size)?,
            (None, None) => self.take_addresses(size)?,
        };
        self.segments.insert(addr, size);
        self.held += size;
        Ok(addr)
    }

    fn hint_segment(&mut self, addr: u64, size: u64) {
        self.hint = Some((addr, size));
    }

    fn free_segment(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.segments.remove(addr, size)?;
        self.held -= size;
        Ok(())
    }

    fn reserve_range(&mut self, size: u64) -> Result<u64, BackingError> {
        if size % self.page_size != 0 {
            return Err(BackingError::Failed(format!(
                "reserve of {size} B is not a multiple of the {} B page",
                self.page_size
            )));
        }
        let addr = self.take_addresses(size)?;
        self.ranges.insert(addr, size, self.page_size);
        Ok(addr)
    }

    fn release_range(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.ranges.remove(addr, size)
    }

    fn map_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        check_capacity(self.held, size, self.capacity)?;
        self.ranges.set_mapped(addr, size, self.page_size, true)?;
        self.held += size;
        Ok(())
    }

    fn unmap_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.ranges.set_mapped(addr, size, self.page_size, false)?;
        self.held -= size;
        Ok(())
    }

    fn fill(&mut self, _addr: u64, _len: u64, _seed: u64) -> Result<bool, BackingError> {
        Ok(false)
    }

    fn verify(&mut self, _addr: u64, _len: u64, _seed: u64) -> Result<Option<u64>, BackingError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_count_against_capacity() {
        let mut b = BookkeepingBacking::new(8 << 20);
        let a = b.alloc_segment(4 << 20).unwrap();
        let c = b.alloc_segment(4 << 20).unwrap();
        assert_ne!(a, c);
        assert!(matches!(
            b.alloc_segment(512),
            Err(BackingError::Exhausted { .. })
        ));
        b.free_segment(a, 4 << 20).unwrap();
        assert!(b.free_segment(a, 4 << 20).is_err());
        assert_eq!(b.held(), 4 << 20);
    }

    #[test]
    fn a_hinted_address_is_taken_when_free_and_skipped_by_later_segments() {
        let mut b = BookkeepingBacking::new(1 << 30);
        b.hint_segment(BASE_ADDR + (8 << 20), 4 << 20);
        assert_eq!(b.alloc_segment(4 << 20).unwrap(), BASE_ADDR + (8 << 20));
        // Not for another size, and only once.
        b.hint_segment(BASE_ADDR + (64 << 20), 4 << 20);
        let other = b.alloc_segment(2 << 20).unwrap();
        assert_eq!(other, BASE_ADDR);
        // The bump skips the hinted segment.
        let next = b.alloc_segment(8 << 20).unwrap();
        assert_eq!(next, BASE_ADDR + (12 << 20));
        // A hint over a live segment is ignored.
        b.hint_segment(BASE_ADDR, 2 << 20);
        assert_ne!(b.alloc_segment(2 << 20).unwrap(), BASE_ADDR);
    }

    /// A replay places a checkpoint's segments where PyTorch had them, which may be below
    /// BASE_ADDR; later segments then go below those (an H100 job's kept file failed its
    /// replay with "address space exhausted" here).
    #[test]
    fn top_down_segments_go_below_hinted_ones_under_the_ranges() {
        let mut b = BookkeepingBacking::new(1 << 30).top_down();
        let range = b.reserve_range(64 << 20).unwrap();
        let low = BASE_ADDR - (256 << 20);
        b.hint_segment(low, 4 << 20);
        assert_eq!(b.alloc_segment(4 << 20).unwrap(), low);
        let next = b.alloc_segment(8 << 20).unwrap();
        assert_eq!(next, low - (8 << 20));
        // Top-down placement that reaches the ranges jumps below them, never into them.
        let mut b = BookkeepingBacking::new(1 << 30).top_down();
        let range_b = b.reserve_range(64 << 20).unwrap();
        b.hint_segment(range_b + (128 << 20), 4 << 20);
        b.alloc_segment(4 << 20).unwrap();
        let under = b.alloc_segment(128 << 20).unwrap();
        assert!(
            under + (128 << 20) <= BASE_ADDR,
            "{under:#x} overlaps the ranges"
        );
        assert_eq!(range, range_b);
    }

    #[test]
    fn pages_count_reserve_does_not() {
        let mut b = BookkeepingBacking::new(4 << 20);
        let r = b.reserve_range(64 << 20).unwrap();
        assert_eq!(b.held(), 0);
        b.map_pages(r, 4 << 20).unwrap();
        assert!(b.map_pages(r + (4 << 20), 2 << 20).is_err());
        b.unmap_pages(r, 2 << 20).unwrap();
        assert_eq!(b.held(), 2 << 20);
        assert!(b.release_range(r, 64 << 20).is_err());
        b.unmap_pages(r + (2 << 20), 2 << 20).unwrap();
        b.release_range(r, 64 << 20).unwrap();
        assert_eq!(b.fill(r, 16, 1), Ok(false));
        assert_eq!(b.verify(r, 16, 1), Ok(None));
    }
}
