//! The real NVML behind the `NvmlApi` seam: nvml-wrapper 0.13, which loads
//! libnvidia-ml.so.1 at run time, so vramtop builds and runs on machines with no driver.

use std::fmt;
use std::sync::OnceLock;

use nvml_wrapper::enum_wrappers::device::{
    Clock, PcieUtilCounter, PerformanceState, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::api::{
    ApiError, ClockDomain, DeviceApi, GpuProcess, MemoryFigures, NvmlApi, PcieDirection,
    ProcessUtilSample,
};

/// The library NVML lives in; nvml-wrapper loads this name on Linux.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// NVML initialised once per process: `Nvml::init` costs about 13 ms, and a `Device`
/// borrows the `Nvml` it came from, so the library must outlive every handle. A static
/// gives both; the driver cleans up when the process exits.
static NVML: OnceLock<Nvml> = OnceLock::new();

/// Why NVML could not be opened. Its `Display` is one line that names the cause and
/// what to do, fit for a status bar or a `--device nvml` error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvmlOpenError {
    /// libnvidia-ml.so.1 is not on this machine (no NVIDIA driver): the usual case off GPU
    /// machines, where `--device auto` falls back to the simulated device.
    LibraryNotLoaded(String),
    /// The library loaded but lacks a function vramtop calls: a driver too old.
    MissingFunction(String),
    DriverNotLoaded,
    VersionMismatch,
    NoPermission,
    /// NVML works but lists no GPU.
    NoDevices,
    Other(String),
}

impl fmt::Display for NvmlOpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvmlOpenError::LibraryNotLoaded(_) => write!(
                f,
                "NVML not available: {NVML_LIBRARY} could not be loaded (is the NVIDIA driver installed?)"
            ),
            NvmlOpenError::MissingFunction(what) => write!(
                f,
                "NVML not available: {NVML_LIBRARY} is too old, a function is missing (update the NVIDIA driver): {}",
                one_line(what)
            ),
            NvmlOpenError::DriverNotLoaded => write!(
                f,
                "NVML not available: {NVML_LIBRARY} loaded but the NVIDIA kernel driver is not running (check `nvidia-smi`; load the module or reboot)"
            ),
            NvmlOpenError::VersionMismatch => f.write_str(
                "NVML driver/library version mismatch: reload the NVIDIA kernel module or reboot",
            ),
            NvmlOpenError::NoPermission => f.write_str(
                "NVML not available: no permission to talk to the NVIDIA driver (check access to /dev/nvidia*)",
            ),
            NvmlOpenError::NoDevices => {
                f.write_str("NVML not available: the driver reports no GPU (check `nvidia-smi`)")
            }
            NvmlOpenError::Other(why) => {
                write!(f, "NVML not available: initialisation failed: {}", one_line(why))
            }
        }
    }
}

impl std::error::Error for NvmlOpenError {}

impl From<ApiError> for NvmlOpenError {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::LibraryNotLoaded(why) => NvmlOpenError::LibraryNotLoaded(why),
            ApiError::MissingFunction(what) => NvmlOpenError::MissingFunction(what),
            ApiError::DriverNotLoaded => NvmlOpenError::DriverNotLoaded,
            ApiError::VersionMismatch => NvmlOpenError::VersionMismatch,
            ApiError::NoPermission => NvmlOpenError::NoPermission,
            other => NvmlOpenError::Other(other.to_string()),
        }
    }
}

/// Loader messages can span lines; a status line cannot.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Reduce nvml-wrapper's error to what the source acts on.
pub fn map_nvml_error(e: NvmlError) -> ApiError {
    match e {
        NvmlError::NotSupported => ApiError::NotSupported,
        NvmlError::InvalidArg => ApiError::InvalidArg,
        NvmlError::NoPermission => ApiError::NoPermission,
        NvmlError::InsufficientSize(_) => ApiError::InsufficientSize,
        NvmlError::NotFound | NvmlError::NoData => ApiError::NotFound,
        NvmlError::GpuLost => ApiError::GpuLost,
        NvmlError::ResetRequired => ApiError::ResetRequired,
        NvmlError::DriverNotLoaded => ApiError::DriverNotLoaded,
        NvmlError::LibRmVersionMismatch => ApiError::VersionMismatch,
        NvmlError::LibloadingError(e) => ApiError::LibraryNotLoaded(one_line(&e.to_string())),
        NvmlError::LibraryNotFound => ApiError::LibraryNotLoaded("library not found".into()),
        NvmlError::FailedToLoadSymbol(what) => ApiError::MissingFunction(one_line(&what)),
        NvmlError::FunctionNotFound => ApiError::MissingFunction("a function".into()),
        // A value newer than nvml-wrapper knows (a new P-state, say): not usable here.
        NvmlError::UnexpectedVariant(_) => ApiError::NotSupported,
        other => ApiError::Other(other.to_string()),
    }
}

/// The process-wide NVML, initialised on first use.
pub struct RealNvml {
    nvml: &'static Nvml,
}

impl RealNvml {
    pub fn init() -> Result<Self, ApiError> {
        if let Some(nvml) = NVML.get() {
            return Ok(RealNvml { nvml });
        }
        let fresh = Nvml::init().map_err(map_nvml_error)?;
        // If another thread won the race, its instance is kept and ours is dropped.
        let _ = NVML.set(fresh);
        match NVML.get() {
            Some(nvml) => Ok(RealNvml { nvml }),
            None => Err(ApiError::Other("NVML initialisation was lost".into())),
        }
    }
}

impl NvmlApi for RealNvml {
    type Device = RealDevice;

    fn driver_version(&self) -> Result<String, ApiError> {
        self.nvml.sys_driver_version().map_err(map_nvml_error)
    }

    fn cuda_driver_version(&self) -> Result<i32, ApiError> {
        self.nvml.sys_cuda_driver_version().map_err(map_nvml_error)
    }

    fn device_count(&self) -> Result<u32, ApiError> {
        self.nvml.device_count().map_err(map_nvml_error)
    }

    fn device_by_index(&self, index: u32) -> Result<RealDevice, ApiError> {
        self.nvml
            .device_by_index(index)
            .map(RealDevice)
            .map_err(map_nvml_error)
    }
}

/// A device handle; a newtype so our trait's method names do not shadow nvml-wrapper's.
pub struct RealDevice(Device<'static>);

fn process(p: nvml_wrapper::struct_wrappers::device::ProcessInfo) -> GpuProcess {
    GpuProcess {
        pid: p.pid,
        used_bytes: match p.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        },
    }
}

impl DeviceApi for RealDevice {
    fn name(&self) -> Result<String, ApiError> {
        self.0.name().map_err(map_nvml_error)
    }

    fn uuid(&self) -> Result<String, ApiError> {
        self.0.uuid().map_err(map_nvml_error)
    }

    fn memory_info(&self) -> Result<MemoryFigures, ApiError> {
        // nvml-wrapper 0.13 calls nvmlDeviceGetMemoryInfo_v2, which has `reserved`.
        let m = self.0.memory_info().map_err(map_nvml_error)?;
        Ok(MemoryFigures {
            total: m.total,
            reserved: m.reserved,
            used: m.used,
            free: m.free,
        })
    }

    fn utilization(&self) -> Result<(u32, u32), ApiError> {
        let u = self.0.utilization_rates().map_err(map_nvml_error)?;
        Ok((u.gpu, u.memory))
    }

    fn temperature_c(&self) -> Result<u32, ApiError> {
        self.0
            .temperature(TemperatureSensor::Gpu)
            .map_err(map_nvml_error)
    }

    fn power_usage_mw(&self) -> Result<u32, ApiError> {
        self.0.power_usage().map_err(map_nvml_error)
    }

    fn power_limit_mw(&self) -> Result<u32, ApiError> {
        // The enforced limit is the one that caps draw: the management limit, or lower
        // where another constraint applies.
        self.0.enforced_power_limit().map_err(map_nvml_error)
    }

    fn clock_mhz(&self, domain: ClockDomain) -> Result<u32, ApiError> {
        let clock = match domain {
            ClockDomain::Sm => Clock::SM,
            ClockDomain::Memory => Clock::Memory,
        };
        self.0.clock_info(clock).map_err(map_nvml_error)
    }

    fn pcie_kib_s(&self, direction: PcieDirection) -> Result<u32, ApiError> {
        let counter = match direction {
            PcieDirection::Rx => PcieUtilCounter::Receive,
            PcieDirection::Tx => PcieUtilCounter::Send,
        };
        self.0.pcie_throughput(counter).map_err(map_nvml_error)
    }

    fn fan_pct(&self) -> Result<u32, ApiError> {
        self.0.fan_speed(0).map_err(map_nvml_error)
    }

    fn performance_state(&self) -> Result<u32, ApiError> {
        use PerformanceState::*;
        let state = self.0.performance_state().map_err(map_nvml_error)?;
        let level = match state {
            Zero => 0,
            One => 1,
            Two => 2,
            Three => 3,
            Four => 4,
            Five => 5,
            Six => 6,
            Seven => 7,
            Eight => 8,
            Nine => 9,
            Ten => 10,
            Eleven => 11,
            Twelve => 12,
            Thirteen => 13,
            Fourteen => 14,
            Fifteen => 15,
            // NVML's "unknown" state: no figure this time, but no reason to stop asking.
            Unknown => return Err(ApiError::NotFound),
        };
        Ok(level)
    }

    fn mig_enabled(&self) -> Result<bool, ApiError> {
        // NVML_DEVICE_MIG_ENABLE is 1.
        let mode = self.0.mig_mode().map_err(map_nvml_error)?;
        Ok(mode.current == 1)
    }

    fn compute_processes(&self) -> Result<Vec<GpuProcess>, ApiError> {
        let list = self.0.running_compute_processes().map_err(map_nvml_error)?;
        Ok(list.into_iter().map(process).collect())
    }

    fn graphics_processes(&self) -> Result<Vec<GpuProcess>, ApiError> {
        let list = self
            .0
            .running_graphics_processes()
            .map_err(map_nvml_error)?;
        Ok(list.into_iter().map(process).collect())
    }

    fn process_utilization(&self, since_us: u64) -> Result<Vec<ProcessUtilSample>, ApiError> {
        let samples = self
            .0
            .process_utilization_stats(since_us)
            .map_err(map_nvml_error)?;
        Ok(samples
            .into_iter()
            .map(|s| ProcessUtilSample {
                pid: s.pid,
                timestamp_us: s.timestamp,
                sm_util_pct: s.sm_util,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_errors_are_one_line_and_say_what_to_do() {
        let cases = [
            NvmlOpenError::LibraryNotLoaded("libnvidia-ml.so.1: cannot open\nshared object".into()),
            NvmlOpenError::MissingFunction("nvmlInit_v2".into()),
            NvmlOpenError::DriverNotLoaded,
            NvmlOpenError::VersionMismatch,
            NvmlOpenError::NoPermission,
            NvmlOpenError::NoDevices,
            NvmlOpenError::Other("weird\nthing".into()),
        ];
        for case in cases {
            let text = case.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(text.starts_with("NVML"), "{text}");
        }
        assert_eq!(
            NvmlOpenError::VersionMismatch.to_string(),
            "NVML driver/library version mismatch: reload the NVIDIA kernel module or reboot"
        );
        assert_eq!(
            NvmlOpenError::LibraryNotLoaded(String::new()).to_string(),
            "NVML not available: libnvidia-ml.so.1 could not be loaded (is the NVIDIA driver installed?)"
        );
    }

    #[test]
    fn nvml_errors_map_to_what_the_source_acts_on() {
        assert_eq!(map_nvml_error(NvmlError::GpuLost), ApiError::GpuLost);
        assert!(map_nvml_error(NvmlError::InvalidArg).is_unsupported());
        assert!(map_nvml_error(NvmlError::FailedToLoadSymbol("x".into())).is_unsupported());
        assert_eq!(map_nvml_error(NvmlError::NoData), ApiError::NotFound);
        assert_eq!(
            map_nvml_error(NvmlError::InsufficientSize(Some(3))),
            ApiError::InsufficientSize
        );
        assert_eq!(
            NvmlOpenError::from(map_nvml_error(NvmlError::LibRmVersionMismatch)),
            NvmlOpenError::VersionMismatch
        );
        assert_eq!(
            NvmlOpenError::from(map_nvml_error(NvmlError::DriverNotLoaded)),
            NvmlOpenError::DriverNotLoaded
        );
    }
}
