//! Telemetry from NVIDIA's driver through NVML: memory (v2 figures, with the driver's
//! reservation), utilisation, power, clocks, PCIe, and the processes on each GPU.
//! A figure a device cannot give is `None`; a lost GPU is marked and retried with backoff
//! while the others keep updating. Must not depend on ratatui or on the app.
//!
//! The driver calls go through the `NvmlApi` seam, so tests run this same code on a fake.

pub mod api;
mod device;
mod processes;
mod real;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use api::{
    ApiError, ClockDomain, DeviceApi, GpuProcess, MemoryFigures, NvmlApi, PcieDirection,
    ProcessUtilSample,
};
pub use real::{map_nvml_error, NvmlOpenError, RealDevice, RealNvml, NVML_LIBRARY};

use super::timing::Laps;
use super::{hostname, now_ms, SystemSnapshot, TelemetrySource};
use device::Slot;
use processes::HostTracker;

/// `SystemSnapshot::source` for figures from NVML.
pub const NVML_SOURCE: &str = "NVML";

/// First wait before re-acquiring a lost GPU; it doubles after each failure.
pub const LOST_RETRY_FIRST: Duration = Duration::from_secs(1);
pub const LOST_RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct NvmlOptions {
    /// How often the slow per-process utilisation call (about 2 ms on an H100) is made;
    /// its values are reused between calls.
    pub process_util_interval: Duration,
    /// How often PCIe throughput is read. NVML measures it over a 20 ms window: each of
    /// the two calls (rx, tx) blocks about 20.7 ms on an H100 (little of it CPU), so a
    /// poll that reads it takes about 42 ms. Read less often, reused in between.
    pub pcie_interval: Duration,
    /// Where host-side process facts come from; tests point this at a fake tree.
    pub proc_root: PathBuf,
    /// Read PCIe throughput and per-process SM utilisation at all. A one-shot run turns
    /// them off unless asked (`--all-fields`): together they cost about 45 ms on an H100,
    /// more than the whole rest of `--once`; they are then N/A.
    pub slow_fields: bool,
    /// Record named spans of opening and polling (`--once --timings`).
    pub timings: bool,
}

impl Default for NvmlOptions {
    fn default() -> Self {
        NvmlOptions {
            process_util_interval: Duration::from_secs(5),
            pcie_interval: Duration::from_secs(2),
            proc_root: PathBuf::from("/proc"),
            slow_fields: true,
            timings: false,
        }
    }
}

/// Open NVML (libnvidia-ml.so.1, loaded at run time) with default options. On a machine
/// with no NVIDIA driver this returns `NvmlOpenError::LibraryNotLoaded`, never panics.
pub fn open() -> Result<NvmlSource, NvmlOpenError> {
    open_with(NvmlOptions::default())
}

/// `open` with options: a one-shot run leaves out the slow fields and may time itself.
pub fn open_with(options: NvmlOptions) -> Result<NvmlSource, NvmlOpenError> {
    let started = Instant::now();
    let api = RealNvml::init()?;
    let init = started.elapsed();
    let mut source = NvmlSource::new(api, options)?;
    source
        .laps
        .push_first("load libnvidia-ml.so.1 and nvmlInit", init);
    Ok(source)
}

/// A telemetry source over NVML, generic over the seam so tests can drive it with a fake.
pub struct NvmlSource<A: NvmlApi = RealNvml> {
    api: A,
    hostname: String,
    driver_version: Option<String>,
    cuda_version: Option<String>,
    slots: Vec<Slot<A::Device>>,
    hosts: HostTracker,
    laps: Laps,
}

impl<A: NvmlApi> NvmlSource<A> {
    /// Enumerate the GPUs once. A GPU whose handle cannot be had now is listed as lost and
    /// retried on later polls; only a library that cannot count GPUs, or counts none, fails.
    pub fn new(api: A, options: NvmlOptions) -> Result<Self, NvmlOpenError> {
        let count = api.device_count()?;
        if count == 0 {
            return Err(NvmlOpenError::NoDevices);
        }
        let mut laps = Laps::new(options.timings);
        let now = Instant::now();
        let slots = (0..count)
            .map(|index| Slot::open(&api, index, &options, now))
            .collect();
        laps.lap(|| format!("open {count} device handle(s): name, UUID"));
        let driver_version = api.driver_version().ok();
        let cuda_version = api.cuda_driver_version().ok().map(format_cuda_version);
        laps.lap(|| "driver and CUDA versions".to_string());
        Ok(NvmlSource {
            api,
            hostname: hostname(),
            driver_version,
            cuda_version,
            slots,
            hosts: HostTracker::new(options.proc_root),
            laps,
        })
    }

    pub fn device_count(&self) -> usize {
        self.slots.len()
    }

    /// One poll as of `now`: `poll()` passes the current instant; tests pass their own to
    /// step through intervals and backoff without sleeping.
    pub fn poll_at(&mut self, now: Instant) -> SystemSnapshot {
        let mut warnings = Vec::new();
        self.laps.restart();
        self.hosts.begin_poll();
        let devices = self
            .slots
            .iter_mut()
            .map(|slot| {
                slot.poll(
                    &self.api,
                    now,
                    &mut self.hosts,
                    &mut warnings,
                    &mut self.laps,
                )
            })
            .collect();
        self.hosts.end_poll();
        SystemSnapshot {
            hostname: self.hostname.clone(),
            source: NVML_SOURCE.to_string(),
            driver_version: self.driver_version.clone(),
            cuda_version: self.cuda_version.clone(),
            devices,
            taken_at_ms: now_ms(),
            warnings,
        }
    }
}

impl<A: NvmlApi> TelemetrySource for NvmlSource<A> {
    fn poll(&mut self) -> SystemSnapshot {
        self.poll_at(Instant::now())
    }

    fn take_spans(&mut self) -> Vec<(String, std::time::Duration)> {
        self.laps.take()
    }
}

/// NVML encodes CUDA 13.0 as 13000.
fn format_cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_version_reads_like_nvidia_smi() {
        assert_eq!(format_cuda_version(13000), "13.0");
        assert_eq!(format_cuda_version(12040), "12.4");
    }
}
