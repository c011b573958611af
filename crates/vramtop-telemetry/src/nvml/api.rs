//! The seam between vramtop and NVML: the handful of driver calls the NVML source makes,
//! as two traits with our own small error enum. The real implementation wraps
//! nvml-wrapper (`real.rs`); tests drive the same source code through a fake.

use std::fmt;

/// How an NVML call failed, reduced to what the source acts on differently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiError {
    /// The device or driver does not offer this figure (also: a driver too old to have
    /// the function). The field becomes `None` and is not asked for again.
    NotSupported,
    /// An argument the device rejects, e.g. fan 0 on a board with no fan (an H100 says
    /// this for `fan_speed(0)`). Handled like `NotSupported` for a field.
    InvalidArg,
    NoPermission,
    /// A buffer was too small: processes appeared between NVML's count and list calls.
    InsufficientSize,
    /// Nothing to report (process utilisation with no samples in the window).
    NotFound,
    /// The GPU has fallen off the bus.
    GpuLost,
    /// The GPU needs a reset before it can be used again.
    ResetRequired,
    DriverNotLoaded,
    /// libnvidia-ml.so.1 could not be loaded; the text is the loader's.
    LibraryNotLoaded(String),
    /// The library lacks a function we call (an old driver); the text names it.
    MissingFunction(String),
    /// The user-space library and the kernel module are of different versions.
    VersionMismatch,
    Other(String),
}

impl ApiError {
    /// The figure cannot be had from this device handle: stop asking for it.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            ApiError::NotSupported | ApiError::InvalidArg | ApiError::MissingFunction(_)
        )
    }

    /// The device is gone until its handle is re-acquired.
    pub fn is_lost(&self) -> bool {
        matches!(self, ApiError::GpuLost | ApiError::ResetRequired)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::NotSupported => f.write_str("not supported on this device"),
            ApiError::InvalidArg => f.write_str("invalid argument"),
            ApiError::NoPermission => f.write_str("no permission"),
            ApiError::InsufficientSize => f.write_str("buffer too small"),
            ApiError::NotFound => f.write_str("no data"),
            ApiError::GpuLost => f.write_str("the GPU has fallen off the bus"),
            ApiError::ResetRequired => f.write_str("the GPU needs a reset"),
            ApiError::DriverNotLoaded => f.write_str("the NVIDIA driver is not loaded"),
            ApiError::LibraryNotLoaded(why) => write!(f, "library not loaded: {why}"),
            ApiError::MissingFunction(why) => write!(f, "function missing from NVML: {why}"),
            ApiError::VersionMismatch => f.write_str("driver/library version mismatch"),
            ApiError::Other(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ApiError {}

/// Memory figures of NVML's memory_info v2: `total = reserved + used + free`, and `used`
/// excludes what the driver reserves for itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryFigures {
    pub total: u64,
    pub reserved: u64,
    pub used: u64,
    pub free: u64,
}

/// One entry of NVML's compute or graphics process list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where NVML reports "not available" (no permission under MIG, WDDM).
    pub used_bytes: Option<u64>,
}

/// One sample of NVML's per-process utilisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessUtilSample {
    pub pid: u32,
    /// CPU timestamp of the sample, microseconds.
    pub timestamp_us: u64,
    pub sm_util_pct: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockDomain {
    Sm,
    Memory,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PcieDirection {
    Rx,
    Tx,
}

/// Library-wide calls. `Device` is a handle that stays valid until the GPU is lost.
pub trait NvmlApi: Send {
    type Device: DeviceApi;

    fn driver_version(&self) -> Result<String, ApiError>;
    /// CUDA driver version as NVML encodes it: 13000 for 13.0.
    fn cuda_driver_version(&self) -> Result<i32, ApiError>;
    fn device_count(&self) -> Result<u32, ApiError>;
    fn device_by_index(&self, index: u32) -> Result<Self::Device, ApiError>;
}

/// Per-device calls, each a single NVML query (two for the process lists: count, then
/// list). Units are NVML's: milliwatts, MHz, KiB/s, percent.
pub trait DeviceApi: Send {
    fn name(&self) -> Result<String, ApiError>;
    fn uuid(&self) -> Result<String, ApiError>;
    fn memory_info(&self) -> Result<MemoryFigures, ApiError>;
    /// (GPU, memory) utilisation, percent.
    fn utilization(&self) -> Result<(u32, u32), ApiError>;
    fn temperature_c(&self) -> Result<u32, ApiError>;
    fn power_usage_mw(&self) -> Result<u32, ApiError>;
    fn power_limit_mw(&self) -> Result<u32, ApiError>;
    fn clock_mhz(&self, domain: ClockDomain) -> Result<u32, ApiError>;
    fn pcie_kib_s(&self, direction: PcieDirection) -> Result<u32, ApiError>;
    fn fan_pct(&self) -> Result<u32, ApiError>;
    /// 0 (fastest) to 15; unknown states are an error.
    fn performance_state(&self) -> Result<u32, ApiError>;
    fn mig_enabled(&self) -> Result<bool, ApiError>;
    fn compute_processes(&self) -> Result<Vec<GpuProcess>, ApiError>;
    fn graphics_processes(&self) -> Result<Vec<GpuProcess>, ApiError>;
    /// Samples newer than `since_us` (0: all the driver holds). Slow: about 2.5 ms on
    /// an H100, so the source calls it every few seconds only.
    fn process_utilization(&self, since_us: u64) -> Result<Vec<ProcessUtilSample>, ApiError>;
}
