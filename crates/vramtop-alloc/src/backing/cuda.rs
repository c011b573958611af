//! The CUDA backing: segments from `cuMemAlloc`, expandable pages from the CUDA virtual
//! memory calls (`cuMemAddressReserve` + `cuMemCreate`/`cuMemMap`), and fill/verify by
//! two small kernels (kernels/probe.cu in this crate) that NVRTC compiles once at `open`.
//!
//! Everything goes through cudarc with dynamic loading, which panics when libcuda or
//! libnvrtc is missing. So `open` first checks that the library loads (with cudarc's own
//! candidate list, the one its loader uses) and every driver-facing entry point runs
//! under `catch_unwind`: a machine without CUDA gets a one-line error, never a panic.
//!
//! Threads: the allocator may call from any tokio worker, and CUDA keeps the current
//! context per thread, so every method binds the context first (`cuCtxGetCurrent`, plus
//! `cuCtxSetCurrent` only when it differs: cheap).
//!
//! Errors: a driver out-of-memory (`CUDA_ERROR_OUT_OF_MEMORY` from `cuMemAlloc` or
//! `cuMemCreate`) is `BackingError::Exhausted`; anything else is `Failed` with the CUDA
//! error name. A kernel fault (e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`) is sticky in CUDA: the
//! context is unusable afterwards and every later call fails with that name.

pub mod check;
mod support;

pub use check::{self_check, time_alloc_free, CheckError};
pub use support::{
    default_probe_limit, device_memory, device_memory_checked, device_memory_on, driver_present,
    nvrtc_present, CudaOpenError, PROBE_HEADROOM, PROBE_KERNELS,
};

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, PushKernelArg};

use super::{check_capacity, Backing, BackingError, RangeBook, SegmentBook, DEFAULT_PAGE_SIZE};
use support::{
    alloc_prop, check_ordinal, compile_error_text, cuda_name, failed, guarded, launch_cfg,
    panic_text, to_usize, vmm_granularity,
};

type Handle = sys::CUmemGenericAllocationHandle;

/// The compiled probe kernels and the device word `verify` counts mismatches into.
#[derive(Debug)]
struct Kernels {
    fill: CudaFunction,
    verify: CudaFunction,
    counter: sys::CUdeviceptr,
}

#[derive(Debug)]
pub struct CudaBacking {
    ordinal: usize,
    device_name: String,
    capacity: u64,
    page_size: u64,
    held: u64,
    segments: SegmentBook,
    ranges: RangeBook,
    /// base -> size of every live segment and every reserved range: the shared books
    /// do not list their contents, and Drop must give these back.
    live_segments: BTreeMap<u64, u64>,
    reserved: BTreeMap<u64, u64>,
    /// One `cuMemCreate` handle per mapped page, keyed by page address.
    handles: BTreeMap<u64, Handle>,
    /// Why `reserve_range` cannot work on this device, when it cannot.
    vmm_error: Option<String>,
    kernels: Option<Kernels>,
    kernel_status: String,
    /// The legacy default stream: kernels on it are ordered with the synchronous
    /// memset/memcpy calls `verify` uses, so no events are needed.
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

/// The CUDA error name (`CUDA_ERROR_OUT_OF_MEMORY`), or the raw code if even that fails.
impl CudaBacking {
    /// Opens device `ordinal` (its primary context) with `capacity` bytes at most held.
    /// Compiles the probe kernels; if NVRTC is missing or fails, the backing still
    /// opens and `kernel_status` says why fill/verify are off.
    pub fn open(ordinal: usize, capacity: u64) -> Result<CudaBacking, CudaOpenError> {
        if !driver_present() {
            return Err(CudaOpenError::NoDriver);
        }
        catch_unwind(|| Self::open_inner(ordinal, capacity))
            .unwrap_or_else(|p| Err(CudaOpenError::Panicked(panic_text(p.as_ref()))))
    }

    fn open_inner(ordinal: usize, capacity: u64) -> Result<CudaBacking, CudaOpenError> {
        let driver = |call: &'static str| {
            move |e: DriverError| CudaOpenError::Driver {
                call,
                error: cuda_name(&e),
            }
        };
        check_ordinal(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let device_name = ctx
            .name()
            .unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        let (page_size, vmm_error) = match vmm_granularity(&ctx) {
            Ok(g) => (g, None),
            Err(why) => (DEFAULT_PAGE_SIZE, Some(why.to_string())),
        };
        let stream = ctx.default_stream();
        let mut backing = CudaBacking {
            ordinal,
            device_name,
            capacity,
            page_size,
            held: 0,
            segments: SegmentBook::default(),
            ranges: RangeBook::default(),
            live_segments: BTreeMap::new(),
            reserved: BTreeMap::new(),
            handles: BTreeMap::new(),
            vmm_error,
            kernels: None,
            kernel_status: String::new(),
            stream,
            ctx,
        };
        // Built after the backing exists so Drop frees the counter if a later step fails.
        match backing.load_kernels() {
            Ok((kernels, ms)) => {
                backing.kernels = Some(kernels);
                backing.kernel_status = format!("probe kernels ready (NVRTC {ms:.0} ms)");
            }
            Err(why) => backing.kernel_status = why.to_string(),
        }
        Ok(backing)
    }

    fn load_kernels(&self) -> Result<(Kernels, f64), BackingError> {
        if !nvrtc_present() {
            return Err(BackingError::Failed(
                "NVRTC not available: libnvrtc.so could not be loaded; fill/verify are off".into(),
            ));
        }
        let start = Instant::now();
        let ptx = catch_unwind(|| cudarc::nvrtc::compile_ptx(PROBE_KERNELS))
            .map_err(|p| {
                BackingError::Failed(format!("NVRTC panicked: {}", panic_text(p.as_ref())))
            })?
            .map_err(|e| {
                BackingError::Failed(format!("NVRTC failed: {}", compile_error_text(&e)))
            })?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let load = |e: DriverError| {
            BackingError::Failed(format!(
                "loading the probe kernels failed: {}",
                cuda_name(&e)
            ))
        };
        let module = self.ctx.load_module(ptx).map_err(load)?;
        let fill = module.load_function("fill").map_err(load)?;
        let verify = module.load_function("verify").map_err(load)?;
        // SAFETY: an 8-byte device buffer only ever written by memset and `verify`.
        let counter = unsafe { cu::malloc_sync(8) }.map_err(load)?;
        Ok((
            Kernels {
                fill,
                verify,
                counter,
            },
            ms,
        ))
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// "probe kernels ready (...)", or why fill/verify are off (NVRTC's log included).
    pub fn kernel_status(&self) -> &str {
        &self.kernel_status
    }

    pub fn kernels_ready(&self) -> bool {
        self.kernels.is_some()
    }

    /// Why `reserve_range` fails on this device, if it does.
    pub fn vmm_error(&self) -> Option<&str> {
        self.vmm_error.as_deref()
    }

    /// (free, total) bytes of this device now, by `cuMemGetInfo`.
    pub fn mem_info(&self) -> Result<(u64, u64), BackingError> {
        guarded("cuMemGetInfo", || {
            let (free, total) = self
                .ctx
                .mem_get_info()
                .map_err(|e| failed("cuMemGetInfo", e))?;
            Ok((free as u64, total as u64))
        })
    }

    fn bind(&self) -> Result<(), BackingError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| failed("cuCtxSetCurrent", e))
    }

    /// A driver OOM is `Exhausted` (real out-of-memory), anything else `Failed`.
    fn alloc_error(&self, call: &str, requested: u64, e: DriverError) -> BackingError {
        if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            BackingError::Exhausted {
                requested,
                held: self.held,
                capacity: self.capacity,
            }
        } else {
            failed(call, e)
        }
    }

    fn check_held(&self, addr: u64, len: u64) -> Result<(), BackingError> {
        if self.segments.contains(addr, len) || self.ranges.is_mapped(addr, len, self.page_size) {
            Ok(())
        } else {
            Err(BackingError::Failed(format!(
                "{len} B at {addr:#x} is not memory this CUDA backing holds"
            )))
        }
    }

    /// `cuMemCreate` + `cuMemMap` of one page at `at`; its handle.
    fn map_one(
        &self,
        at: u64,
        prop: &sys::CUmemAllocationProp,
        run: u64,
    ) -> Result<Handle, BackingError> {
        let page = to_usize(self.page_size)?;
        let mut handle: Handle = 0;
        // SAFETY: pointers to live locals; `prop` describes plain device memory.
        unsafe { sys::cuMemCreate(&mut handle, page, prop, 0) }
            .result()
            .map_err(|e| self.alloc_error("cuMemCreate", run, e))?;
        // SAFETY: `at` is a page of a range we reserved and have not mapped (the
        // RangeBook checked), and `handle` is exactly one page.
        if let Err(e) = unsafe { sys::cuMemMap(at, page, 0, handle, 0) }.result() {
            // SAFETY: the handle is ours and mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(handle) }.result();
            return Err(failed("cuMemMap", e));
        }
        Ok(handle)
    }

    /// Maps `[addr, addr+size)` page by page (so any page can later be unmapped on its
    /// own: `cuMemUnmap` cannot split a mapping), then grants read/write access to the
    /// whole run in one `cuMemSetAccess`. On failure, undoes what it did.
    fn map_run(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        let prop = alloc_prop(self.ctx.cu_device());
        let page = self.page_size;
        let mut mapped: Vec<(u64, Handle)> = Vec::new();
        let mut result = Ok(());
        let mut at = addr;
        while at < addr + size {
            match self.map_one(at, &prop, size) {
                Ok(h) => mapped.push((at, h)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            at += page;
        }
        if result.is_ok() {
            let desc = sys::CUmemAccessDesc {
                location: prop.location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the run is fully mapped just above; `desc` is a live local.
            result = unsafe { sys::cuMemSetAccess(addr, to_usize(size)?, &desc, 1) }
                .result()
                .map_err(|e| failed("cuMemSetAccess", e));
        }
        match result {
            Ok(()) => {
                self.handles.extend(mapped);
                Ok(())
            }
            Err(e) => {
                for (at, h) in mapped {
                    // SAFETY: pages mapped by this call, nothing has used them yet.
                    unsafe {
                        let _ = sys::cuMemUnmap(at, page as usize).result();
                        let _ = sys::cuMemRelease(h).result();
                    }
                }
                Err(e)
            }
        }
    }

    /// Gives everything back to the driver; errors are ignored (nothing to report
    /// them to in Drop, and a dead context frees it all anyway).
    fn release_all(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        // SAFETY: every address below was allocated by this backing and is given back
        // exactly once (the books are emptied as they go); no kernel is in flight after
        // the synchronize above.
        unsafe {
            for (addr, _) in std::mem::take(&mut self.live_segments) {
                let _ = cu::free_sync(addr);
            }
            for (at, h) in std::mem::take(&mut self.handles) {
                let _ = sys::cuMemUnmap(at, self.page_size as usize).result();
                let _ = sys::cuMemRelease(h).result();
            }
            for (base, size) in std::mem::take(&mut self.reserved) {
                let _ = sys::cuMemAddressFree(base, size as usize).result();
            }
            if let Some(k) = self.kernels.take() {
                let _ = cu::free_sync(k.counter);
            }
        }
        self.segments = SegmentBook::default();
        self.ranges = RangeBook::default();
        self.held = 0;
    }
}

impl Drop for CudaBacking {
    fn drop(&mut self) {
        let _ = catch_unwind(AssertUnwindSafe(|| self.release_all()));
    }
}

impl Backing for CudaBacking {
    fn name(&self) -> &str {
        "cuda"
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
        guarded("alloc_segment", || {
            check_capacity(self.held, size, self.capacity)?;
            let bytes = to_usize(size)?;
            self.bind()?;
            // SAFETY: a plain allocation; only our kernels ever touch it.
            let addr = unsafe { cu::malloc_sync(bytes) }
                .map_err(|e| self.alloc_error("cuMemAlloc", size, e))?;
            self.segments.insert(addr, size);
            self.live_segments.insert(addr, size);
            self.held += size;
            Ok(addr)
        })
    }

    fn free_segment(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        guarded("free_segment", || {
            self.bind()?;
            self.segments.remove(addr, size)?;
            // SAFETY: a live segment of ours (the book just said so), freed once; fill
            // and verify synchronize, so no kernel is using it.
            if let Err(e) = unsafe { cu::free_sync(addr) } {
                self.segments.insert(addr, size);
                return Err(failed("cuMemFree", e));
            }
            self.live_segments.remove(&addr);
            self.held -= size;
            Ok(())
        })
    }

    fn reserve_range(&mut self, size: u64) -> Result<u64, BackingError> {
        guarded("reserve_range", || {
            if let Some(why) = &self.vmm_error {
                return Err(BackingError::Failed(format!(
                    "cannot reserve address space: {why}"
                )));
            }
            let page = self.page_size;
            if size == 0 || size % page != 0 {
                return Err(BackingError::Failed(format!(
                    "reserve of {size} B is not a whole number of {page} B pages"
                )));
            }
            self.bind()?;
            let mut base: sys::CUdeviceptr = 0;
            // SAFETY: `base` is a live local; address space only, no memory behind it.
            unsafe { sys::cuMemAddressReserve(&mut base, to_usize(size)?, page as usize, 0, 0) }
                .result()
                .map_err(|e| failed("cuMemAddressReserve", e))?;
            self.ranges.insert(base, size, page);
            self.reserved.insert(base, size);
            Ok(base)
        })
    }

    fn release_range(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        guarded("release_range", || {
            self.bind()?;
            // Checks the range is ours and has no mapped pages left.
            self.ranges.remove(addr, size)?;
            // SAFETY: a whole range we reserved, nothing mapped in it.
            if let Err(e) = unsafe { sys::cuMemAddressFree(addr, to_usize(size)?) }.result() {
                self.ranges.insert(addr, size, self.page_size);
                return Err(failed("cuMemAddressFree", e));
            }
            self.reserved.remove(&addr);
            Ok(())
        })
    }

    fn map_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        guarded("map_pages", || {
            check_capacity(self.held, size, self.capacity)?;
            self.bind()?;
            // Checks alignment, that the run lies in one reserved range, none mapped.
            self.ranges.set_mapped(addr, size, self.page_size, true)?;
            if let Err(e) = self.map_run(addr, size) {
                self.ranges.set_mapped(addr, size, self.page_size, false)?;
                return Err(e);
            }
            self.held += size;
            Ok(())
        })
    }

    fn unmap_pages(&mut self, addr: u64, size: u64) -> Result<(), BackingError> {
        guarded("unmap_pages", || {
            self.bind()?;
            let page = self.page_size;
            // Checks every page of the run is mapped.
            self.ranges.set_mapped(addr, size, page, false)?;
            let mut release_error = None;
            let mut at = addr;
            while at < addr + size {
                let Some(&handle) = self.handles.get(&at) else {
                    return Err(BackingError::Failed(format!(
                        "no CUDA handle for the mapped page at {at:#x}"
                    )));
                };
                // SAFETY: one whole page mapped by `map_one`; fill/verify synchronize,
                // so no kernel is using it.
                if let Err(e) = unsafe { sys::cuMemUnmap(at, page as usize) }.result() {
                    // Pages from `at` on stay mapped: put them back in the books.
                    self.ranges.set_mapped(at, addr + size - at, page, true)?;
                    return Err(failed("cuMemUnmap", e));
                }
                self.handles.remove(&at);
                self.held -= page;
                // SAFETY: unmapped just above; releasing returns the physical memory.
                // A failure here leaks one handle but the page is unmapped all the
                // same, so carry on (the books stay true) and report it at the end.
                if let Err(e) = unsafe { sys::cuMemRelease(handle) }.result() {
                    release_error.get_or_insert(failed("cuMemRelease", e));
                }
                at += page;
            }
            release_error.map_or(Ok(()), Err)
        })
    }

    fn fill(&mut self, addr: u64, len: u64, seed: u64) -> Result<bool, BackingError> {
        guarded("fill", || {
            if len == 0 {
                return Ok(self.kernels.is_some());
            }
            self.check_held(addr, len)?;
            let Some(k) = &self.kernels else {
                return Ok(false);
            };
            self.bind()?;
            let mut launch = self.stream.launch_builder(&k.fill);
            launch.arg(&addr).arg(&len).arg(&seed);
            // SAFETY: matches `fill(unsigned char*, u64, u64)` (a device pointer is 64
            // bits), and it writes only [addr, addr+len), device memory we hold.
            unsafe { launch.launch(launch_cfg(len)) }
                .map_err(|e| failed("cuLaunchKernel(fill)", e))?;
            // Synchronous, so a fault is reported here and timings cover the work.
            self.stream
                .synchronize()
                .map_err(|e| failed("fill kernel", e))?;
            Ok(true)
        })
    }

    fn verify(&mut self, addr: u64, len: u64, seed: u64) -> Result<Option<u64>, BackingError> {
        guarded("verify", || {
            if len == 0 {
                return Ok(self.kernels.as_ref().map(|_| 0));
            }
            self.check_held(addr, len)?;
            let Some(k) = &self.kernels else {
                return Ok(None);
            };
            self.bind()?;
            // SAFETY: the 8-byte counter allocated in `load_kernels`.
            unsafe { cu::memset_d8_sync(k.counter, 0, 8) }.map_err(|e| failed("cuMemsetD8", e))?;
            let mut launch = self.stream.launch_builder(&k.verify);
            launch.arg(&addr).arg(&len).arg(&seed).arg(&k.counter);
            // SAFETY: matches `verify(const unsigned char*, u64, u64, u64*)`; it reads
            // only [addr, addr+len), memory we hold, and writes only the counter.
            unsafe { launch.launch(launch_cfg(len)) }
                .map_err(|e| failed("cuLaunchKernel(verify)", e))?;
            self.stream
                .synchronize()
                .map_err(|e| failed("verify kernel", e))?;
            let mut mismatches = [0u64; 1];
            // SAFETY: reads the 8-byte counter into an 8-byte host slot.
            unsafe { cu::memcpy_dtoh_sync(&mut mismatches, k.counter) }
                .map_err(|e| failed("cuMemcpyDtoH", e))?;
            Ok(Some(mismatches[0]))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_without_a_driver_is_a_clear_error_not_a_panic() {
        if driver_present() {
            return; // a CUDA machine: the #[ignore]d GPU tests cover it.
        }
        let err = CudaBacking::open(0, 1 << 30).expect_err("no libcuda here");
        assert_eq!(err, CudaOpenError::NoDriver);
        let line = err.to_string();
        assert!(line.contains("libcuda.so.1 could not be loaded"), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(device_memory(), None);
        assert!(!self_check(0).passed);
        assert!(time_alloc_free(0, &[512], 2).is_err());
    }
}
