//! A self-check of the CUDA backing on a real GPU, and raw `cuMemAlloc`/`cuMemFree`
//! timing. Both live in the library (not only in `#[ignore]`d tests) because the GPU
//! machine has no cargo: the lead wires `self_check` to a hidden CLI subcommand and runs
//! the prebuilt binary there.

use std::fmt::{self, Display};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use cudarc::driver::result as cu;
use cudarc::driver::{CudaContext, DriverError};

use super::{cuda_name, driver_present, panic_text, CudaBacking, CudaOpenError};
use crate::backing::{pattern_word, Backing, BackingError};
use crate::human_bytes;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Lines of "ok   ..." / "FAIL ..." / "     note", and how many failed.
#[derive(Default)]
struct Report {
    lines: Vec<String>,
    failures: usize,
}

impl Report {
    fn check(&mut self, ok: bool, what: impl Display) {
        self.failures += usize::from(!ok);
        self.lines
            .push(format!("{} {what}", if ok { "ok  " } else { "FAIL" }));
    }

    fn note(&mut self, what: impl Display) {
        self.lines.push(format!("     {what}"));
    }
}

/// Why the self-check or the timing stopped before its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckError {
    /// CUDA could not be opened, a driver call failed, or cudarc panicked.
    Cuda(CudaOpenError),
    /// The backing refused a step the check needs (`step`: what the check was doing).
    Backing {
        step: &'static str,
        error: BackingError,
    },
    /// A size this platform's `usize` cannot hold.
    SizeTooLarge(u64),
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Cuda(e) => e.fmt(f),
            CheckError::Backing { step, error } => write!(f, "{step}: {error}"),
            CheckError::SizeTooLarge(size) => write!(f, "{size} bytes do not fit a usize here"),
        }
    }
}

impl std::error::Error for CheckError {}

/// A failed driver call, named.
fn driver(call: &'static str) -> impl Fn(DriverError) -> CheckError {
    move |e| {
        CheckError::Cuda(CudaOpenError::Driver {
            call,
            error: cuda_name(&e),
        })
    }
}

/// A backing step the check could not take.
fn backing(step: &'static str) -> impl Fn(BackingError) -> CheckError {
    move |error| CheckError::Backing { step, error }
}

/// Words of a `len`-byte range filled with seed `written` that `verify` with seed
/// `checked` must count, by the trait's rules (a short tail is one word), computed on
/// the host with the Rust `pattern_word`: so a GPU count that matches also checks the
/// CUDA port of the pattern.
fn expected_mismatches(written: u64, checked: u64, len: u64) -> u64 {
    (0..len.div_ceil(4))
        .filter(|&i| {
            let n = (len - 4 * i).min(4) as usize;
            pattern_word(written, i).to_le_bytes()[..n]
                != pattern_word(checked, i).to_le_bytes()[..n]
        })
        .count() as u64
}

/// What the self-check found: one line per check and a summary line last, and whether
/// every check passed (false too when CUDA is unusable: the report says why).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfCheck {
    pub report: String,
    pub passed: bool,
}

/// Runs every check of the CUDA backing on device `ordinal`, taking at most ~300 MiB.
pub fn self_check(ordinal: usize) -> SelfCheck {
    if !driver_present() {
        return SelfCheck {
            report: CudaOpenError::NoDriver.to_string(),
            passed: false,
        };
    }
    let mut r = Report::default();
    match catch_unwind(AssertUnwindSafe(|| run_checks(ordinal, &mut r))) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => r.check(false, format!("stopped: {e}")),
        Err(p) => r.check(false, format!("panicked: {}", panic_text(p.as_ref()))),
    }
    let summary = if r.failures == 0 {
        "CUDA self-check: all passed".to_string()
    } else {
        format!("CUDA self-check: {} FAILED", r.failures)
    };
    r.lines.push(summary);
    SelfCheck {
        report: r.lines.join("\n"),
        passed: r.failures == 0,
    }
}

fn run_checks(ordinal: usize, r: &mut Report) -> Result<(), CheckError> {
    // Holding our own reference to the primary context keeps it alive when the backing
    // drops, so the free-memory figures below show what Drop gave back, not a context
    // teardown.
    let keep = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
    let mem = |keep: &CudaContext| {
        keep.mem_get_info()
            .map(|(f, t)| (f as u64, t as u64))
            .map_err(driver("cuMemGetInfo"))
    };
    let (free0, total) = mem(&keep)?;
    r.note(format!(
        "device {ordinal}: {}, {} free of {}",
        keep.name().unwrap_or_default(),
        human_bytes(free0),
        human_bytes(total)
    ));

    let start = Instant::now();
    let mut b = CudaBacking::open(ordinal, 64 * MIB).map_err(CheckError::Cuda)?;
    r.note(format!(
        "open: {:.0} ms; {}",
        start.elapsed().as_secs_f64() * 1e3,
        b.kernel_status()
    ));
    r.check(b.kernels_ready(), "NVRTC compiled and loaded probe.cu");
    r.check(
        b.vmm_error().is_none() && b.page_size().is_power_of_two(),
        format!(
            "VMM page size {} ({})",
            human_bytes(b.page_size()),
            b.vmm_error().unwrap_or("supported")
        ),
    );

    check_segments(r, &mut b, &keep)?;
    check_pages(r, &mut b)?;

    // Real out-of-memory from the driver: more than the whole device in one cuMemAlloc
    // fails at once without taking anything.
    let mut big = CudaBacking::open(ordinal, u64::MAX).map_err(CheckError::Cuda)?;
    let huge = (total + GIB).next_multiple_of(512);
    let got = big.alloc_segment(huge);
    r.check(
        matches!(got, Err(BackingError::Exhausted { .. })),
        format!(
            "cuMemAlloc of {} -> Exhausted (got {got:?})",
            human_bytes(huge)
        ),
    );
    time_fill(r, &mut big)?;

    // Drop gives everything back: leave a segment and mapped pages held, drop. The
    // baseline is taken with both backings open (kernels loaded), so only what the
    // backings allocated since counts.
    let (free_base, _) = mem(&keep)?;
    let a = b.alloc_segment(16 * MIB).map_err(backing("alloc"))?;
    let range = b
        .reserve_range(4 * b.page_size())
        .map_err(backing("reserve"))?;
    b.map_pages(range, 2 * b.page_size())
        .map_err(backing("map"))?;
    b.fill(a, 16 * MIB, 3).map_err(backing("fill"))?;
    let (free_mid, _) = mem(&keep)?;
    drop(b);
    drop(big);
    let (free_end, _) = mem(&keep)?;
    r.note(format!(
        "free: {} before open, {} before holding, {} while holding, {} after drop",
        human_bytes(free0),
        human_bytes(free_base),
        human_bytes(free_mid),
        human_bytes(free_end)
    ));
    r.check(
        free_mid + 16 * MIB <= free_base,
        "held memory shows in cuMemGetInfo (other GPU users can disturb this)",
    );
    r.check(
        free_end + 8 * MIB >= free_base,
        "drop gave back everything, within 8 MiB (other GPU users can disturb this)",
    );

    for (size, us) in time_alloc_free(ordinal, &[512, 2 * MIB, 64 * MIB, GIB], 50)? {
        r.note(format!(
            "cuMemAlloc+cuMemFree {}: {us:.1} us median of 50",
            human_bytes(size)
        ));
    }
    Ok(())
}

fn check_segments(
    r: &mut Report,
    b: &mut CudaBacking,
    keep: &CudaContext,
) -> Result<(), CheckError> {
    let len = 16 * MIB;
    let a = b.alloc_segment(len).map_err(backing("alloc_segment"))?;
    r.check(
        b.held() == len,
        format!("held {} after a 16 MiB segment", b.held()),
    );
    r.check(b.fill(a, len, 1) == Ok(true), "fill 16 MiB");
    let got = b.verify(a, len, 1);
    r.check(got == Ok(Some(0)), format!("verify after fill: {got:?}"));

    // Bit-for-bit: read words back and compare with the Rust pattern_word, so the
    // fill kernel is checked independently of the verify kernel.
    let mut head = vec![0u32; 4096];
    let mut last = [0u32; 1];
    keep.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: both reads lie inside the live 16 MiB segment `a`; fill synchronized.
    unsafe {
        cu::memcpy_dtoh_sync(&mut head, a).map_err(driver("cuMemcpyDtoH"))?;
        cu::memcpy_dtoh_sync(&mut last, a + len - 4).map_err(driver("cuMemcpyDtoH"))?;
    }
    let head_ok = head
        .iter()
        .enumerate()
        .all(|(i, &w)| w == pattern_word(1, i as u64));
    let last_ok = last[0] == pattern_word(1, len / 4 - 1);
    r.check(
        head_ok && last_ok,
        "GPU pattern equals Rust pattern_word (first 4096 words, last word)",
    );

    b.fill(a, len / 2, 2).map_err(backing("fill"))?;
    let want = expected_mismatches(2, 1, len / 2);
    let got = b.verify(a, len, 1);
    r.check(
        got == Ok(Some(want)),
        format!("half refilled with another seed: {got:?}, want {want}"),
    );

    // Misaligned start and a 3-byte tail: the byte-wise path of both kernels.
    let ok = b.fill(a + 1, 4099, 7) == Ok(true) && b.verify(a + 1, 4099, 7) == Ok(Some(0));
    let want = expected_mismatches(7, 8, 4099);
    let got = b.verify(a + 1, 4099, 8);
    r.check(
        ok && got == Ok(Some(want)),
        format!("misaligned 4099 B: clean, then {got:?} with another seed, want {want}"),
    );
    r.check(
        b.fill(a + len - 2, 4, 1).is_err(),
        "fill past a segment is refused",
    );

    b.free_segment(a, len).map_err(backing("free_segment"))?;
    r.check(b.held() == 0, format!("held {} after free", b.held()));
    r.check(
        b.fill(a, 4, 1).is_err(),
        "fill of a freed segment is refused",
    );
    let got = b.alloc_segment(65 * MIB);
    r.check(
        matches!(got, Err(BackingError::Exhausted { .. })),
        format!("65 MiB over a 64 MiB capacity -> Exhausted (got {got:?})"),
    );
    Ok(())
}

fn check_pages(r: &mut Report, b: &mut CudaBacking) -> Result<(), CheckError> {
    let p = b.page_size();
    let base = b.reserve_range(8 * p).map_err(backing("reserve_range"))?;
    r.check(b.held() == 0, "a reserved range holds nothing");
    r.check(
        b.fill(base, 16, 1).is_err(),
        "fill of unmapped pages is refused",
    );
    b.map_pages(base + p, 2 * p).map_err(backing("map_pages"))?;
    r.check(
        b.held() == 2 * p,
        format!("held {} after mapping 2 pages", b.held()),
    );
    let ok = b.fill(base + p, 2 * p, 5) == Ok(true) && b.verify(base + p, 2 * p, 5) == Ok(Some(0));
    r.check(ok, "fill + verify across two mapped pages");
    r.check(b.map_pages(base + p, p).is_err(), "double map is refused");

    // Unmap the first page of the run alone: the second keeps its contents.
    b.fill(base + 2 * p, p, 6).map_err(backing("fill"))?;
    b.unmap_pages(base + p, p).map_err(backing("unmap_pages"))?;
    r.check(
        b.held() == p,
        format!("held {} after unmapping 1 page", b.held()),
    );
    let got = b.verify(base + 2 * p, p, 6);
    r.check(
        got == Ok(Some(0)),
        format!("surviving page intact: {got:?}"),
    );
    r.check(
        b.verify(base + p, 4, 5).is_err(),
        "verify of an unmapped page is refused",
    );

    b.map_pages(base + p, p).map_err(backing("map_pages"))?;
    let ok = b.fill(base + p, p, 9) == Ok(true) && b.verify(base + p, p, 9) == Ok(Some(0));
    r.check(ok, "remapped page fills and verifies");
    r.check(
        b.release_range(base, 8 * p).is_err(),
        "release with mapped pages is refused",
    );
    b.unmap_pages(base + p, 2 * p)
        .map_err(backing("unmap_pages"))?;
    let released = b.release_range(base, 8 * p);
    r.check(
        released.is_ok() && b.held() == 0,
        format!("unmap all + release: {released:?}, held {}", b.held()),
    );
    Ok(())
}

/// Fill and verify bandwidth over 1 GiB (a note only; anchors.md has 0.358 ms a fill).
fn time_fill(r: &mut Report, b: &mut CudaBacking) -> Result<(), CheckError> {
    let a = b.alloc_segment(GIB).map_err(backing("alloc 1 GiB"))?;
    b.fill(a, GIB, 1).map_err(backing("fill"))?; // warm-up
    let t = Instant::now();
    b.fill(a, GIB, 2).map_err(backing("fill"))?;
    let fill_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let got = b.verify(a, GIB, 2).map_err(backing("verify"))?;
    let verify_ms = t.elapsed().as_secs_f64() * 1e3;
    r.check(got == Some(0), format!("verify 1 GiB: {got:?}"));
    r.note(format!(
        "1 GiB: fill {fill_ms:.3} ms ({:.0} GB/s), verify {verify_ms:.3} ms",
        GIB as f64 / fill_ms / 1e6
    ));
    b.free_segment(a, GIB).map_err(backing("free 1 GiB"))
}

/// Median microseconds of a raw `cuMemAlloc` + `cuMemFree` pair for each size, over
/// `pairs` pairs (at least 1) after one warm-up pair; the figure anchors.md compares.
pub fn time_alloc_free(
    ordinal: usize,
    sizes: &[u64],
    pairs: usize,
) -> Result<Vec<(u64, f64)>, CheckError> {
    if !driver_present() {
        return Err(CheckError::Cuda(CudaOpenError::NoDriver));
    }
    let run = || -> Result<Vec<(u64, f64)>, CheckError> {
        let ctx = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let pairs = pairs.max(1);
        let mut out = Vec::with_capacity(sizes.len());
        for &size in sizes {
            let bytes = usize::try_from(size).map_err(|_| CheckError::SizeTooLarge(size))?;
            let mut times = Vec::with_capacity(pairs);
            for k in 0..=pairs {
                let t = Instant::now();
                // SAFETY: allocate and free at once; the memory is never touched.
                unsafe {
                    let p = cu::malloc_sync(bytes).map_err(driver("cuMemAlloc"))?;
                    cu::free_sync(p).map_err(driver("cuMemFree"))?;
                }
                if k > 0 {
                    times.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            times.sort_by(f64::total_cmp);
            let mid = times.len() / 2;
            let median = if times.len() % 2 == 0 {
                (times[mid - 1] + times[mid]) / 2.0
            } else {
                times[mid]
            };
            out.push((size, median));
        }
        Ok(out)
    };
    catch_unwind(run).unwrap_or_else(|p| {
        Err(CheckError::Cuda(CudaOpenError::Panicked(panic_text(
            p.as_ref(),
        ))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_mismatches_follows_the_trait_rules() {
        assert_eq!(expected_mismatches(1, 1, 4099), 0);
        assert_eq!(expected_mismatches(7, 8, 0), 0);
        // Seeds this close still differ in every word of a short range, tail included.
        assert_eq!(expected_mismatches(7, 8, 4099), 1025);
        assert_eq!(expected_mismatches(7, 8, 3), 1);
    }
}
