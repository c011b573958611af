//! The CUDA backing's plumbing: whether the libraries load, the open error, driver
//! error names, panic guarding, the VMM allocation properties, launch shapes, and the
//! device-memory helpers behind the `--probe-limit` default.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, LaunchConfig};

use crate::backing::BackingError;

/// Source of the `fill` and `verify` kernels.
pub const PROBE_KERNELS: &str = include_str!("../../../kernels/probe.cu");

/// Free memory `default_probe_limit` always leaves on the device.
pub const PROBE_HEADROOM: u64 = 1 << 30;

/// Why `CudaBacking::open` failed; `Display` is one line for the status bar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaOpenError {
    /// libcuda (the driver library) could not be loaded.
    NoDriver,
    /// The driver is there but CUDA sees no device of this ordinal; `visible_devices` is
    /// `CUDA_VISIBLE_DEVICES` when set, the usual reason for a device CUDA does not see.
    NoDevice {
        ordinal: usize,
        count: usize,
        visible_devices: Option<String>,
    },
    /// A driver call failed; `error` is the CUDA error name.
    Driver { call: &'static str, error: String },
    /// cudarc panicked (a missing symbol in an old driver, say).
    Panicked(String),
}

impl fmt::Display for CudaOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaOpenError::NoDriver => f.write_str(
                "CUDA not available: libcuda.so.1 could not be loaded (is the NVIDIA driver installed?)",
            ),
            CudaOpenError::NoDevice {
                ordinal,
                count,
                visible_devices,
            } => {
                write!(f, "CUDA device {ordinal} not found: CUDA sees {count} device(s)")?;
                if let Some(v) = visible_devices {
                    write!(f, " with CUDA_VISIBLE_DEVICES={v:?}")?;
                }
                match (count, visible_devices) {
                    (0, Some(_)) => f.write_str(
                        "; unset CUDA_VISIBLE_DEVICES or set it to a GPU index or UUID that nvidia-smi lists",
                    ),
                    (0, None) => f.write_str("; check `nvidia-smi`"),
                    (n, _) => write!(f, "; its devices are numbered 0 to {}", n - 1),
                }
            }
            CudaOpenError::Driver { call, error } => {
                write!(f, "CUDA not available: {call} failed with {error}")
            }
            CudaOpenError::Panicked(msg) => {
                write!(f, "CUDA not available: the CUDA library panicked: {msg}")
            }
        }
    }
}

impl std::error::Error for CudaOpenError {}

pub(super) fn cuda_name(e: &DriverError) -> String {
    match e.error_name() {
        Ok(name) => name.to_string_lossy().into_owned(),
        Err(_) => format!("{:?}", e.0),
    }
}

pub(super) fn failed(call: &str, e: DriverError) -> BackingError {
    BackingError::Failed(format!("{call} failed: {}", cuda_name(&e)))
}

pub(super) fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs a driver-facing body, turning a cudarc panic into `Failed`.
pub(super) fn guarded<T>(
    what: &str,
    body: impl FnOnce() -> Result<T, BackingError>,
) -> Result<T, BackingError> {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|p| {
        Err(BackingError::Failed(format!(
            "{what}: the CUDA library panicked: {}",
            panic_text(p.as_ref())
        )))
    })
}

/// True when libcuda can be loaded, so cudarc's loader will not panic.
pub fn driver_present() -> bool {
    // SAFETY: loading libcuda runs its initialisers, as any CUDA program does; cudarc's
    // probe tries the same names as the loader it guards.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// True when libnvrtc can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as for `driver_present`.
    catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false)
}

pub(super) fn to_usize(v: u64) -> Result<usize, BackingError> {
    usize::try_from(v).map_err(|_| BackingError::Failed(format!("{v} B does not fit a usize")))
}

/// Pinned device memory on `device`, no export handles: the plain kind of VMM page.
pub(super) fn alloc_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// Minimum VMM granularity of the device, or why VMM cannot be used there.
pub(super) fn vmm_granularity(ctx: &CudaContext) -> Result<u64, BackingError> {
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED;
    match ctx.attribute(attr) {
        Ok(0) => {
            return Err(BackingError::Failed(
                "the device does not support CUDA virtual memory".into(),
            ))
        }
        Ok(_) => {}
        Err(e) => {
            return Err(BackingError::Failed(format!(
                "cuDeviceGetAttribute failed: {}",
                cuda_name(&e)
            )))
        }
    }
    let prop = alloc_prop(ctx.cu_device());
    let mut granularity = 0usize;
    let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: both pointers are to live locals for the duration of the call.
    unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, flag) }
        .result()
        .map_err(|e| {
            BackingError::Failed(format!(
                "cuMemGetAllocationGranularity failed: {}",
                cuda_name(&e)
            ))
        })?;
    let g = granularity as u64;
    if g == 0 || !g.is_power_of_two() {
        return Err(BackingError::Failed(format!("odd VMM granularity {g} B")));
    }
    Ok(g)
}

/// NVRTC's complaint, log first: that is what a user can act on.
pub(super) fn compile_error_text(e: &cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
            format!("{:?}: {}", nvrtc, log.to_string_lossy().trim())
        }
        other => format!("{other:?}"),
    }
}

/// Grid-stride launch: 256 threads a block, at most 4096 blocks (an H100 keeps about
/// 1,000 such blocks resident, so more would only queue).
pub(super) fn launch_cfg(len: u64) -> LaunchConfig {
    const THREADS: u64 = 256;
    const MAX_BLOCKS: u64 = 4096;
    let blocks = len.div_ceil(4).div_ceil(THREADS).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Default `--probe-limit`: a quarter of the free memory, but never so much that less
/// than `PROBE_HEADROOM` (1 GiB) stays free. `free` above `total` is taken as `total`.
pub fn default_probe_limit(free: u64, total: u64) -> u64 {
    let free = free.min(total);
    (free / 4).min(free.saturating_sub(PROBE_HEADROOM))
}

/// `CUDA_VISIBLE_DEVICES` as set, for error messages.
fn visible_devices() -> Option<String> {
    std::env::var("CUDA_VISIBLE_DEVICES").ok()
}

/// `cuInit`, then whether CUDA sees device `ordinal`. "No device" reads the same whichever
/// call finds it: `cuInit` itself fails with CUDA_ERROR_NO_DEVICE when
/// `CUDA_VISIBLE_DEVICES` names no GPU of this machine.
pub(super) fn check_ordinal(ordinal: usize) -> Result<(), CudaOpenError> {
    let no_device = |count| CudaOpenError::NoDevice {
        ordinal,
        count,
        visible_devices: visible_devices(),
    };
    let driver = |call: &'static str| {
        move |e: DriverError| CudaOpenError::Driver {
            call,
            error: cuda_name(&e),
        }
    };
    match cudarc::driver::result::init() {
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => return Err(no_device(0)),
        other => other.map_err(driver("cuInit"))?,
    }
    let count = cudarc::driver::result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
    let count = usize::try_from(count).unwrap_or(0);
    if ordinal >= count {
        return Err(no_device(count));
    }
    Ok(())
}

/// (free, total) bytes of device `ordinal`, or why CUDA cannot say: what a probe checks
/// before it sizes itself, so a missing device is one clear line.
pub fn device_memory_checked(ordinal: usize) -> Result<(u64, u64), CudaOpenError> {
    if !driver_present() {
        return Err(CudaOpenError::NoDriver);
    }
    catch_unwind(|| {
        check_ordinal(ordinal)?;
        let failed = |call: &'static str| {
            move |e: DriverError| CudaOpenError::Driver {
                call,
                error: cuda_name(&e),
            }
        };
        let ctx = CudaContext::new(ordinal).map_err(failed("cuDevicePrimaryCtxRetain"))?;
        let (free, total) = ctx.mem_get_info().map_err(failed("cuMemGetInfo"))?;
        Ok((free as u64, total as u64))
    })
    .unwrap_or_else(|p| Err(CudaOpenError::Panicked(panic_text(p.as_ref()))))
}

/// (free, total) bytes of device 0 by `cuMemGetInfo`; `None` without CUDA.
pub fn device_memory() -> Option<(u64, u64)> {
    device_memory_on(0)
}

/// (free, total) bytes of device `ordinal`; `None` without CUDA or on any error.
pub fn device_memory_on(ordinal: usize) -> Option<(u64, u64)> {
    if !driver_present() {
        return None;
    }
    catch_unwind(|| {
        let ctx = CudaContext::new(ordinal).ok()?;
        let (free, total) = ctx.mem_get_info().ok()?;
        Some((free as u64, total as u64))
    })
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_limit_is_a_quarter_of_free_with_a_gib_of_headroom() {
        const GIB: u64 = 1 << 30;
        assert_eq!(default_probe_limit(80 * GIB, 80 * GIB), 20 * GIB);
        assert_eq!(default_probe_limit(40 * GIB, 80 * GIB), 10 * GIB);
        // 1.2 GiB free: a quarter (0.3 GiB) would leave less than 1 GiB.
        assert_eq!(default_probe_limit(GIB + GIB / 5, 80 * GIB), GIB / 5);
        assert_eq!(default_probe_limit(GIB, 80 * GIB), 0);
        assert_eq!(default_probe_limit(GIB / 2, 80 * GIB), 0);
        assert_eq!(default_probe_limit(0, 0), 0);
        // A free figure above the total is clamped to the total.
        assert_eq!(default_probe_limit(100 * GIB, 8 * GIB), 2 * GIB);
        // The crossover: a quarter equals free - 1 GiB at 4/3 GiB.
        let free = 4 * GIB / 3 + 3;
        let limit = default_probe_limit(free, u64::MAX);
        assert!(limit <= free / 4 && free - limit >= GIB);
    }

    #[test]
    fn kernel_source_ports_pattern_word_exactly() {
        // The constants and steps of `crate::backing::pattern_word`, spelled as in C.
        for needle in [
            "u64 z = seed ^ (index * 0x9E3779B97F4A7C15ULL);",
            "z = (z ^ (z >> 32)) * 0xD6E8FEB86659FD93ULL;",
            "return (u32)(z >> 32);",
            "typedef unsigned int u32;",
            "typedef unsigned long long u64;",
            "extern \"C\" __global__ void fill(unsigned char* p, u64 len, u64 seed)",
            "extern \"C\" __global__ void verify(const unsigned char* p, u64 len, u64 seed, u64* mismatches)",
        ] {
            assert!(PROBE_KERNELS.contains(needle), "probe.cu lacks {needle:?}");
        }
        // And the Rust side still uses the same constants.
        assert_eq!(crate::backing::pattern_word(0, 1), {
            let z: u64 = 0x9E37_79B9_7F4A_7C15;
            ((z ^ (z >> 32)).wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 32) as u32
        });
    }

    #[test]
    fn launch_covers_every_word_with_bounded_grid() {
        assert_eq!(launch_cfg(1).grid_dim.0, 1);
        assert_eq!(launch_cfg(4 * 256).grid_dim.0, 1);
        assert_eq!(launch_cfg(4 * 256 + 1).grid_dim.0, 2);
        assert_eq!(launch_cfg(1 << 40).grid_dim.0, 4096);
    }

    #[test]
    fn open_errors_read_as_one_line() {
        let errs = [
            CudaOpenError::NoDriver,
            CudaOpenError::NoDevice {
                ordinal: 3,
                count: 1,
                visible_devices: None,
            },
            CudaOpenError::NoDevice {
                ordinal: 0,
                count: 0,
                visible_devices: Some("7".into()),
            },
            CudaOpenError::Driver {
                call: "cuInit",
                error: "CUDA_ERROR_NO_DEVICE".into(),
            },
            CudaOpenError::Panicked("Expected symbol in library".into()),
        ];
        for e in errs {
            let line = e.to_string();
            assert!(!line.is_empty() && !line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn a_missing_device_says_what_to_do() {
        let out_of_range = CudaOpenError::NoDevice {
            ordinal: 3,
            count: 1,
            visible_devices: None,
        };
        assert_eq!(
            out_of_range.to_string(),
            "CUDA device 3 not found: CUDA sees 1 device(s); its devices are numbered 0 to 0"
        );
        let hidden = CudaOpenError::NoDevice {
            ordinal: 0,
            count: 0,
            visible_devices: Some("7".into()),
        };
        let line = hidden.to_string();
        assert!(
            line.contains("CUDA_VISIBLE_DEVICES=\"7\"") && line.contains("unset"),
            "{line}"
        );
    }
}
