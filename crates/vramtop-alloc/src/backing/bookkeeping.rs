//! A backing of bare address ranges with no memory behind them: it keeps the books
//! (what is held, what is mapped, the capacity) so policies, probes and tests run the
//! same code as on a GPU, at any scale, without touching a byte.

use super::{check_capacity, Backing, BackingError, RangeBook, SegmentBook, DEFAULT_PAGE_SIZE};

/// Where the fake address space starts: far from zero, so a stray 0 stands out.
const BASE_ADDR: u64 = 0x7f00_0000_0000;

#[derive(Debug)]
pub struct BookkeepingBacking {
    capacity: u64,
    page_size: u64,
    held: u64,
    /// Next unused address; addresses are never reused, which keeps stale receipts
    /// from aliasing new ranges.
    next_addr: u64,
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
            segments: SegmentBook::default(),
            ranges: RangeBook::default(),
        }
    }

    /// Hands out the next `size` bytes of address space, page-aligned.
    fn take_addresses(&mut self, size: u64) -> Result<u64, BackingError> {
        let addr = self.next_addr;
        let span = size
            .checked_next_multiple_of(self.page_size)
            .and_then(|s| addr.checked_add(s))
            .ok_or_else(|| BackingError::Failed(format!("address space exhausted ({size} B)")))?;
        self.next_addr = span;
        Ok(addr)
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
        let addr = self.take_addresses(size)?;
        self.segments.insert(addr, size);
        self.held += size;
        Ok(addr)
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
