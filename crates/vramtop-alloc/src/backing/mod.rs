//! Where arena bytes come from: a `Backing` hands out and takes back address ranges,
//! either whole segments (cudaMalloc-style) or pages of one reserved range (CUDA VMM).
//! Backings know nothing of policies, events or the UI; they only keep their books.
//!
//! The trait is shaped so a CUDA backing fits it directly:
//!
//! | trait call      | CUDA driver call(s)                                            |
//! |-----------------|----------------------------------------------------------------|
//! | `alloc_segment` | `cuMemAlloc`                                                   |
//! | `free_segment`  | `cuMemFree`                                                    |
//! | `reserve_range` | `cuMemAddressReserve` (alignment = `page_size`)                |
//! | `release_range` | `cuMemAddressFree`                                             |
//! | `map_pages`     | per page: `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`        |
//! | `unmap_pages`   | per page: `cuMemUnmap` + `cuMemRelease`                        |
//! | `page_size`     | `cuMemGetAllocationGranularity`                                |
//! | `held`          | the backing's own count of the above (no driver call)          |
//! | `fill`/`verify` | a pattern kernel over the range (or `Ok(false)`/`Ok(None)`)    |
//!
//! `capacity` bounds the bytes a backing holds at once (segments plus mapped pages;
//! reserved address space is free), so out-of-memory is real for every backing.

pub mod bookkeeping;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;

pub use crate::error::{BackingError, UnknownBacking};
pub use bookkeeping::BookkeepingBacking;
pub use host::HostBacking;

/// Where a probe's memory comes from (`--backing`, `VRAMTOP_BACKING`, the settings file's
/// `backing`): the command line and the settings file convert into this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackingChoice {
    /// The GPU through CUDA when libcuda loads, else host memory.
    Auto,
    /// Real host memory.
    Host,
    /// Real device memory through CUDA (cuMemAlloc, or cuMemCreate pages for expandable).
    Cuda,
    /// Address ranges only, no memory behind them (fastest; nothing to verify).
    Bookkeeping,
}

impl BackingChoice {
    pub const ALL: [BackingChoice; 4] = [
        BackingChoice::Auto,
        BackingChoice::Host,
        BackingChoice::Cuda,
        BackingChoice::Bookkeeping,
    ];

    /// The spelling on the command line and in the settings file.
    pub fn name(self) -> &'static str {
        match self {
            BackingChoice::Auto => "auto",
            BackingChoice::Host => "host",
            BackingChoice::Cuda => "cuda",
            BackingChoice::Bookkeeping => "bookkeeping",
        }
    }
}

impl std::str::FromStr for BackingChoice {
    type Err = UnknownBacking;

    fn from_str(s: &str) -> Result<Self, UnknownBacking> {
        BackingChoice::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownBacking(s.to_string()))
    }
}

/// Default page (mapping granularity) of the backings: 2 MiB, CUDA's usual granularity.
pub const DEFAULT_PAGE_SIZE: u64 = 2 << 20;

/// A source of address ranges with a capacity. Addresses are plain `u64`s: the
/// allocator never dereferences them, only `fill`/`verify` touch memory, and only
/// inside ranges the backing itself handed out and still holds.
pub trait Backing: Send {
    fn name(&self) -> &str;
    /// Most bytes held at once (segments + mapped pages).
    fn capacity(&self) -> u64;
    /// Mapping granularity of `map_pages`/`unmap_pages`; a power of two.
    fn page_size(&self) -> u64;
    /// Bytes held now (segments + mapped pages).
    fn held(&self) -> u64;
    /// A new segment of `size` bytes (a multiple of 512); its base address.
    fn alloc_segment(&mut self, size: u64) -> Result<u64, BackingError>;
    /// Where the next segment of `size` bytes should go, if the backing can choose: a
    /// replay gives the address the traced allocator got, so that its policy's address
    /// order (PyTorch takes the lowest of equal free blocks) is the trace's. Backings
    /// that cannot choose ignore it.
    fn hint_segment(&mut self, _addr: u64, _size: u64) {}
    fn free_segment(&mut self, addr: u64, size: u64) -> Result<(), BackingError>;
    /// Reserve `size` bytes of address space (a multiple of `page_size`) with nothing
    /// behind it; costs no capacity.
    fn reserve_range(&mut self, size: u64) -> Result<u64, BackingError>;
    /// Give a reserved range back; its pages must be unmapped first.
    fn release_range(&mut self, addr: u64, size: u64) -> Result<(), BackingError>;
    /// Put memory behind `[addr, addr+size)`, page-aligned within a reserved range,
    /// none of it mapped yet. Counts against capacity.
    fn map_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError>;
    /// Take the memory behind mapped pages away again.
    fn unmap_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError>;
    /// Write the pattern of `seed` over `[addr, addr+len)`: 32-bit word `i` (counted
    /// from `addr`) gets `pattern_word(seed, i)`. `Ok(false)` when no memory is behind
    /// the range (a bookkeeping backing); an error when the range is not held.
    fn fill(&mut self, addr: u64, len: u64, seed: u64) -> Result<bool, BackingError>;
    /// Count the 32-bit words of `[addr, addr+len)` that differ from `fill`'s pattern
    /// (a short tail counts as one word); `None` when there is nothing to check.
    fn verify(&mut self, addr: u64, len: u64, seed: u64) -> Result<Option<u64>, BackingError>;
}

/// The fill pattern: a cheap mix of seed and word index, so a block filled with one
/// seed and read back with another, or shifted by any number of words, mismatches.
pub fn pattern_word(seed: u64, index: u64) -> u32 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (z >> 32) as u32
}

/// Capacity check shared by the backings.
pub(crate) fn check_capacity(held: u64, size: u64, capacity: u64) -> Result<(), BackingError> {
    match held.checked_add(size) {
        Some(total) if total <= capacity => Ok(()),
        _ => Err(BackingError::Exhausted {
            requested: size,
            held,
            capacity,
        }),
    }
}

/// Book of reserved ranges and which of their pages are mapped, shared by backings
/// that support `reserve_range`.
#[derive(Debug, Default)]
pub(crate) struct RangeBook {
    /// base -> (size, one flag per page)
    ranges: std::collections::BTreeMap<u64, (u64, Vec<bool>)>,
}

impl RangeBook {
    /// True when a reserved range overlaps `[addr, addr+len)`.
    pub(crate) fn overlaps(&self, addr: u64, len: u64) -> bool {
        self.ranges
            .range(..addr.saturating_add(len))
            .next_back()
            .is_some_and(|(&base, (size, _))| base.saturating_add(*size) > addr)
    }

    pub(crate) fn insert(&mut self, base: u64, size: u64, page: u64) {
        self.ranges
            .insert(base, (size, vec![false; (size / page) as usize]));
    }

    /// Removes a range; fails if it is unknown or still has mapped pages.
    pub(crate) fn remove(&mut self, base: u64, size: u64) -> Result<(), BackingError> {
        match self.ranges.get(&base) {
            Some((s, pages)) if *s == size => {
                if pages.contains(&true) {
                    return Err(BackingError::Failed(format!(
                        "range {base:#x} still has mapped pages; unmap them first"
                    )));
                }
            }
            _ => {
                return Err(BackingError::Failed(format!(
                    "no reserved range of {size} bytes at {base:#x}"
                )))
            }
        }
        self.ranges.remove(&base);
        Ok(())
    }

    /// Sets pages of `[addr, addr+size)` to `mapped`; every page must currently be
    /// `!mapped`, and the range page-aligned inside one reserved range.
    pub(crate) fn set_mapped(
        &mut self,
        addr: u64,
        size: u64,
        page: u64,
        mapped: bool,
    ) -> Result<(), BackingError> {
        let bad = |why: &str| {
            BackingError::Failed(format!(
                "cannot {} {size} bytes at {addr:#x}: {why}",
                if mapped { "map" } else { "unmap" }
            ))
        };
        let (&base, (rsize, pages)) = self
            .ranges
            .range_mut(..=addr)
            .next_back()
            .ok_or_else(|| bad("not in a reserved range"))?;
        let off = addr - base;
        if size == 0
            || off % page != 0
            || size % page != 0
            || off.checked_add(size).is_none_or(|end| end > *rsize)
        {
            return Err(bad("not whole pages inside the reserved range"));
        }
        let (first, count) = ((off / page) as usize, (size / page) as usize);
        let slice = &mut pages[first..first + count];
        if slice.contains(&mapped) {
            return Err(bad(if mapped {
                "some pages are already mapped"
            } else {
                "some pages are not mapped"
            }));
        }
        slice.iter_mut().for_each(|m| *m = mapped);
        Ok(())
    }

    /// True when every byte of `[addr, addr+len)` lies on mapped pages of one range.
    pub(crate) fn is_mapped(&self, addr: u64, len: u64, page: u64) -> bool {
        let Some((&base, (rsize, pages))) = self.ranges.range(..=addr).next_back() else {
            return false;
        };
        let off = addr - base;
        if len == 0 || off.saturating_add(len) > *rsize {
            return false;
        }
        let first = (off / page) as usize;
        let last = ((off + len - 1) / page) as usize;
        pages[first..=last].iter().all(|&m| m)
    }
}

/// Book of live segments, shared by the backings.
#[derive(Debug, Default)]
pub(crate) struct SegmentBook {
    segments: std::collections::BTreeMap<u64, u64>,
}

impl SegmentBook {
    pub(crate) fn insert(&mut self, addr: u64, size: u64) {
        self.segments.insert(addr, size);
    }

    pub(crate) fn remove(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        match self.segments.get(&addr) {
            Some(&s) if s == size => {
                self.segments.remove(&addr);
                Ok(())
            }
            _ => Err(BackingError::Failed(format!(
                "no segment of {size} bytes at {addr:#x}"
            ))),
        }
    }

    /// The end of a live segment that overlaps `[addr, addr+len)`, if one does.
    pub(crate) fn overlap_end(&self, addr: u64, len: u64) -> Option<u64> {
        self.overlapping(addr, len)
            .map(|(base, size)| base.saturating_add(size))
    }

    /// A live segment (base, size) that overlaps `[addr, addr+len)`, if one does.
    pub(crate) fn overlapping(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let end = addr.saturating_add(len);
        self.segments
            .range(..end)
            .next_back()
            .map(|(&base, &size)| (base, size))
            .filter(|&(base, size)| base.saturating_add(size) > addr)
    }

    /// The live segments (base, size), in address order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segments.iter().map(|(&base, &size)| (base, size))
    }

    /// True when `[addr, addr+len)` lies inside one live segment.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        match self.segments.range(..=addr).next_back() {
            Some((&base, &size)) => addr.saturating_add(len) <= base + size,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_seed_and_index() {
        assert_ne!(pattern_word(1, 0), pattern_word(2, 0));
        assert_ne!(pattern_word(1, 0), pattern_word(1, 1));
        assert_eq!(pattern_word(7, 9), pattern_word(7, 9));
    }

    #[test]
    fn range_book_refuses_double_map_and_strays() {
        let mut book = RangeBook::default();
        book.insert(0x1000_0000, 8 << 20, DEFAULT_PAGE_SIZE);
        let p = DEFAULT_PAGE_SIZE;
        assert!(book.set_mapped(0x1000_0000, p, p, true).is_ok());
        assert!(book.set_mapped(0x1000_0000, p, p, true).is_err());
        assert!(book.set_mapped(0x1000_0000 + p, p, p, false).is_err());
        assert!(book.set_mapped(0x1000_0000 + 512, p, p, true).is_err());
        assert!(book.set_mapped(0x0fff_0000, p, p, true).is_err());
        assert!(book.is_mapped(0x1000_0000, p, p));
        assert!(!book.is_mapped(0x1000_0000, p + 1, p));
        assert!(book.remove(0x1000_0000, 8 << 20).is_err());
        assert!(book.set_mapped(0x1000_0000, p, p, false).is_ok());
        assert!(book.remove(0x1000_0000, 8 << 20).is_ok());
    }

    #[test]
    fn capacity_check_is_exact() {
        assert!(check_capacity(10, 5, 15).is_ok());
        assert!(check_capacity(10, 6, 15).is_err());
        assert!(check_capacity(u64::MAX, 1, u64::MAX).is_err());
    }
}
