//! A backing of real host memory, for probes that fill and verify bytes without a GPU.
//! Segments are anonymous mmaps; a reserved range is a PROT_NONE mapping whose pages
//! get memory with mprotect(READ|WRITE) and lose it with madvise(MADV_DONTNEED) plus
//! mprotect(NONE), the host analogue of cuMemMap/cuMemUnmap. Linux/Unix only (libc).

use super::{
    check_capacity, pattern_word, Backing, BackingError, RangeBook, SegmentBook, DEFAULT_PAGE_SIZE,
};

#[derive(Debug)]
pub struct HostBacking {
    capacity: u64,
    page_size: u64,
    held: u64,
    segments: SegmentBook,
    ranges: RangeBook,
    /// Every live mmap (segments and reserved ranges), unmapped on drop.
    mappings: std::collections::BTreeMap<u64, u64>,
}

fn os_error(what: &str, addr: u64, size: u64) -> BackingError {
    BackingError::Failed(format!(
        "{what} of {size} B at {addr:#x} failed: {}",
        std::io::Error::last_os_error()
    ))
}

fn os_page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

impl HostBacking {
    pub fn new(capacity: u64) -> Self {
        Self::with_page_size(capacity, DEFAULT_PAGE_SIZE)
    }

    /// `page_size` is raised to a power of two and to at least the OS page size, so
    /// mprotect works on whole pages.
    pub fn with_page_size(capacity: u64, page_size: u64) -> Self {
        HostBacking {
            capacity,
            page_size: page_size.max(os_page_size()).next_power_of_two(),
            held: 0,
            segments: SegmentBook::default(),
            ranges: RangeBook::default(),
            mappings: Default::default(),
        }
    }

    fn mmap(&mut self, size: u64, prot: libc::c_int) -> Result<u64, BackingError> {
        let len = usize::try_from(size)
            .map_err(|_| BackingError::Failed(format!("{size} B does not fit usize")))?;
        if len == 0 {
            return Err(BackingError::Failed("zero-size mapping".into()));
        }
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing
        // aliases nothing.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(os_error("mmap", 0, size));
        }
        let addr = ptr as u64;
        self.mappings.insert(addr, size);
        Ok(addr)
    }

    fn munmap(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        // SAFETY: callers pass a whole mapping this backing made and still holds.
        let rc = unsafe { libc::munmap(addr as *mut libc::c_void, size as usize) };
        if rc != 0 {
            return Err(os_error("munmap", addr, size));
        }
        self.mappings.remove(&addr);
        Ok(())
    }

    fn protect(&self, addr: u64, size: u64, prot: libc::c_int) -> Result<(), BackingError> {
        // SAFETY: [addr, addr+size) is whole pages of a reserved range we hold.
        let rc = unsafe { libc::mprotect(addr as *mut libc::c_void, size as usize, prot) };
        if rc != 0 {
            return Err(os_error("mprotect", addr, size));
        }
        Ok(())
    }

    /// The bytes of `[addr, addr+len)` if all of them are memory we hold and can touch.
    fn bytes_mut(&mut self, addr: u64, len: u64) -> Result<&mut [u8], BackingError> {
        if len == 0 {
            return Ok(&mut []);
        }
        if !self.segments.contains(addr, len) && !self.ranges.is_mapped(addr, len, self.page_size) {
            return Err(BackingError::Failed(format!(
                "{len} B at {addr:#x} is not memory this host backing holds"
            )));
        }
        // SAFETY: the range lies in a live read-write mapping owned by this backing,
        // and `&mut self` keeps any other slice of it from existing meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) })
    }
}

impl Drop for HostBacking {
    fn drop(&mut self) {
        for (addr, size) in std::mem::take(&mut self.mappings) {
            // SAFETY: each entry is a whole mapping made by this backing.
            unsafe { libc::munmap(addr as *mut libc::c_void, size as usize) };
        }
    }
}

impl Backing for HostBacking {
    fn name(&self) -> &str {
        "host"
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
        let addr = self.mmap(size, libc::PROT_READ | libc::PROT_WRITE)?;
        self.segments.insert(addr, size);
        self.held += size;
        Ok(addr)
    }

    fn free_segment(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.segments.remove(addr, size)?;
        self.held -= size;
        self.munmap(addr, size)
    }

    fn reserve_range(&mut self, size: u64) -> Result<u64, BackingError> {
        if size % self.page_size != 0 {
            return Err(BackingError::Failed(format!(
                "reserve of {size} B is not a multiple of the {} B page",
                self.page_size
            )));
        }
        let addr = self.mmap(size, libc::PROT_NONE)?;
        self.ranges.insert(addr, size, self.page_size);
        Ok(addr)
    }

    fn release_range(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.ranges.remove(addr, size)?;
        self.munmap(addr, size)
    }

    fn map_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        check_capacity(self.held, size, self.capacity)?;
        self.ranges.set_mapped(addr, size, self.page_size, true)?;
        if let Err(e) = self.protect(addr, size, libc::PROT_READ | libc::PROT_WRITE) {
            self.ranges.set_mapped(addr, size, self.page_size, false)?;
            return Err(e);
        }
        self.held += size;
        Ok(())
    }

    fn unmap_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        self.ranges.set_mapped(addr, size, self.page_size, false)?;
        // SAFETY: whole pages of a reserved range we hold; dropping their contents is
        // the point.
        let rc = unsafe {
            libc::madvise(
                addr as *mut libc::c_void,
                size as usize,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(os_error("madvise(DONTNEED)", addr, size));
        }
        self.protect(addr, size, libc::PROT_NONE)?;
        self.held -= size;
        Ok(())
    }

    fn fill(&mut self, addr: u64, len: u64, seed: u64) -> Result<bool, BackingError> {
        let bytes = self.bytes_mut(addr, len)?;
        let mut words = bytes.chunks_exact_mut(4);
        let mut index = 0u64;
        for word in &mut words {
            word.copy_from_slice(&pattern_word(seed, index).to_le_bytes());
            index += 1;
        }
        let tail = words.into_remainder();
        let last = pattern_word(seed, index).to_le_bytes();
        tail.copy_from_slice(&last[..tail.len()]);
        Ok(true)
    }

    fn verify(&mut self, addr: u64, len: u64, seed: u64) -> Result<Option<u64>, BackingError> {
        let bytes = self.bytes_mut(addr, len)?;
        let mut words = bytes.chunks_exact(4);
        let mut index = 0u64;
        let mut bad = 0u64;
        for word in &mut words {
            bad += u64::from(word != pattern_word(seed, index).to_le_bytes());
            index += 1;
        }
        let tail = words.remainder();
        let last = pattern_word(seed, index).to_le_bytes();
        bad += u64::from(tail != &last[..tail.len()]);
        Ok(Some(bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_fill_and_verify_round_trip() {
        let mut b = HostBacking::new(8 << 20);
        let a = b.alloc_segment(1 << 20).unwrap();
        assert_eq!(b.fill(a, 4099, 42), Ok(true));
        assert_eq!(b.verify(a, 4099, 42), Ok(Some(0)));
        assert_eq!(b.verify(a, 4096, 43), Ok(Some(1024)));
        // Word 3 corrupted by an overlapping writer.
        b.fill(a + 12, 4, 99).unwrap();
        assert_eq!(b.verify(a, 4099, 42), Ok(Some(1)));
        assert!(b.fill(a + (1 << 20) - 2, 4, 1).is_err());
        b.free_segment(a, 1 << 20).unwrap();
        assert!(b.fill(a, 4, 1).is_err());
    }

    #[test]
    fn pages_get_memory_only_while_mapped() {
        let page = DEFAULT_PAGE_SIZE;
        let mut b = HostBacking::new(2 * page);
        let r = b.reserve_range(8 * page).unwrap();
        assert!(b.fill(r, 16, 1).is_err());
        b.map_pages(r + page, 2 * page).unwrap();
        assert!(matches!(
            b.map_pages(r, page),
            Err(BackingError::Exhausted { .. })
        ));
        assert_eq!(b.fill(r + page, 2 * page, 5), Ok(true));
        assert_eq!(b.verify(r + page, 2 * page, 5), Ok(Some(0)));
        b.unmap_pages(r + page, page).unwrap();
        assert!(b.verify(r + page, 16, 5).is_err());
        b.map_pages(r + page, page).unwrap();
        // Fresh memory after an unmap: the old pattern is gone (zeros now).
        assert_eq!(b.verify(r + page, 4, 5), Ok(Some(1)));
        assert_eq!(b.held(), 2 * page);
    }
}
