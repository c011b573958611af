//! One GPU as the NVML source tracks it between polls: its handle, the figures it has said
//! it cannot give (not asked again), the slow figures' caches, and lost-GPU backoff.

use std::time::{Duration, Instant};

use super::api::{ApiError, ClockDomain, DeviceApi, GpuProcess, NvmlApi, PcieDirection};
use super::processes::{merge_process_lists, HostTracker, MergedProcess, ProcessUtilCache};
use super::{NvmlOptions, LOST_RETRY_FIRST, LOST_RETRY_MAX};
use crate::timing::Laps;
use crate::{DeviceHealth, DeviceSnapshot, ProcessSnapshot};

/// How often a process list is asked again when processes start between NVML's count
/// call and its list call (nvml-wrapper leaves room for 5 more; a burst can exceed it).
const LIST_ATTEMPTS: usize = 3;

/// How long a figure that said "not supported" goes unasked. Support can change under a
/// live handle (MIG mode switched on a reset GPU turns utilisation off and on), so the
/// list is forgotten now and then; one failed call a minute costs nothing.
const UNSUPPORTED_RECHECK: Duration = Duration::from_secs(60);

/// MIG mode changes only with a GPU reset, and reading it costs about 110 us on an H100
/// (driver 580), more than the rest of a poll together: read it twice a minute.
const MIG_INTERVAL: Duration = Duration::from_secs(30);

/// The figures read from a device, one bit each in `Slot::unsupported`.
#[derive(Clone, Copy, Debug)]
enum Field {
    Memory,
    Utilization,
    Temperature,
    Power,
    PowerLimit,
    SmClock,
    MemoryClock,
    PcieRx,
    PcieTx,
    Fan,
    PerformanceState,
    Mig,
    ComputeProcesses,
    GraphicsProcesses,
}

impl Field {
    fn bit(self) -> u32 {
        1 << self as u32
    }

    fn label(self) -> &'static str {
        match self {
            Field::Memory => "memory",
            Field::Utilization => "utilisation",
            Field::Temperature => "temperature",
            Field::Power => "power draw",
            Field::PowerLimit => "power limit",
            Field::SmClock => "SM clock",
            Field::MemoryClock => "memory clock",
            Field::PcieRx => "PCIe rx",
            Field::PcieTx => "PCIe tx",
            Field::Fan => "fan",
            Field::PerformanceState => "performance state",
            Field::Mig => "MIG mode",
            Field::ComputeProcesses => "compute process list",
            Field::GraphicsProcesses => "graphics process list",
        }
    }

    fn is_process_list(self) -> bool {
        matches!(self, Field::ComputeProcesses | Field::GraphicsProcesses)
    }
}

/// Reads one field at a time so each fails on its own: unsupported becomes `None` and is
/// remembered, a lost GPU stops the device's poll (the `Err`), anything else becomes
/// `None` with a warning.
struct FieldReader<'a> {
    index: u32,
    unsupported: &'a mut u32,
    warnings: &'a mut Vec<String>,
}

impl FieldReader<'_> {
    fn read<T>(
        &mut self,
        field: Field,
        call: impl FnOnce() -> Result<T, ApiError>,
    ) -> Result<Option<T>, ApiError> {
        if *self.unsupported & field.bit() != 0 {
            return Ok(None);
        }
        match call() {
            Ok(value) => Ok(Some(value)),
            Err(e) if e.is_lost() => Err(e),
            Err(e) if e.is_unsupported() => {
                // Support does not change while the handle lives: skip the call from now on.
                *self.unsupported |= field.bit();
                Ok(None)
            }
            Err(ApiError::NotFound) => Ok(None),
            Err(e) => {
                self.warn(field, &e);
                Ok(None)
            }
        }
    }

    fn warn(&mut self, field: Field, e: &ApiError) {
        let text = match e {
            ApiError::NoPermission if field.is_process_list() => format!(
                "GPU {}: process list needs permission: run as the GPU's owner or root",
                self.index
            ),
            ApiError::InsufficientSize if field.is_process_list() => format!(
                "GPU {}: {}: processes kept starting while it was read; read again next poll",
                self.index,
                field.label()
            ),
            e => format!("GPU {}: {}: {e}", self.index, field.label()),
        };
        // Both process lists fail alike; one line says it.
        if !self.warnings.contains(&text) {
            self.warnings.push(text);
        }
    }
}

/// Ask for a process list again while it grows faster than the buffer NVML was given.
fn list_with_retry(
    mut call: impl FnMut() -> Result<Vec<GpuProcess>, ApiError>,
) -> Result<Vec<GpuProcess>, ApiError> {
    let mut last = Err(ApiError::InsufficientSize);
    for _ in 0..LIST_ATTEMPTS {
        last = call();
        if last != Err(ApiError::InsufficientSize) {
            break;
        }
    }
    last
}

/// A figure too slow to read on every poll, read every `interval` and reused in between.
#[derive(Debug)]
struct Throttled<T> {
    interval: Duration,
    last_query: Option<Instant>,
    value: T,
}

impl<T: Copy + Default> Throttled<T> {
    fn new(interval: Duration) -> Self {
        Throttled {
            interval,
            last_query: None,
            value: T::default(),
        }
    }

    /// The last value, read afresh first if `interval` has passed.
    fn get<E>(&mut self, now: Instant, read: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let due = self
            .last_query
            .is_none_or(|at| now.saturating_duration_since(at) >= self.interval);
        if due {
            self.last_query = Some(now);
            self.value = read()?;
        }
        Ok(self.value)
    }

    fn forget(&mut self) {
        self.last_query = None;
        self.value = T::default();
    }
}

/// Why a device is lost, and when its handle is next asked for.
#[derive(Debug)]
struct Lost {
    reason: String,
    retry_at: Instant,
}

pub struct Slot<D> {
    index: u32,
    handle: Option<D>,
    name: String,
    uuid: Option<String>,
    unsupported: u32,
    unsupported_since: Option<Instant>,
    lost: Option<Lost>,
    /// The wait after the next loss: doubles per failure up to `LOST_RETRY_MAX`, and is
    /// reset by a poll that completes.
    next_backoff: Duration,
    process_util: ProcessUtilCache,
    /// (rx, tx) KiB/s.
    pcie: Throttled<(Option<u32>, Option<u32>)>,
    mig: Throttled<Option<bool>>,
    compute: Vec<GpuProcess>,
    graphics: Vec<GpuProcess>,
    merged: Vec<MergedProcess>,
    /// PCIe throughput and per-process utilisation are read at all (off in one-shot runs).
    slow_fields: bool,
}

impl<D: DeviceApi> Slot<D> {
    pub fn open<A: NvmlApi<Device = D>>(
        api: &A,
        index: u32,
        options: &NvmlOptions,
        now: Instant,
    ) -> Self {
        let mut slot = Slot {
            index,
            handle: None,
            name: format!("GPU {index}"),
            uuid: None,
            unsupported: 0,
            unsupported_since: None,
            lost: None,
            next_backoff: LOST_RETRY_FIRST,
            process_util: ProcessUtilCache::new(options.process_util_interval),
            pcie: Throttled::new(options.pcie_interval),
            mig: Throttled::new(MIG_INTERVAL),
            compute: Vec::new(),
            graphics: Vec::new(),
            merged: Vec::new(),
            slow_fields: options.slow_fields,
        };
        if let Err(e) = slot.acquire(api) {
            slot.mark_lost(&e, now);
        }
        slot
    }

    /// Get a fresh handle and the figures that do not change while it lives.
    fn acquire<A: NvmlApi<Device = D>>(&mut self, api: &A) -> Result<(), ApiError> {
        let handle = api.device_by_index(self.index)?;
        match handle.name() {
            Ok(name) => self.name = name,
            Err(e) if e.is_lost() => return Err(e),
            Err(_) => {}
        }
        match handle.uuid() {
            Ok(uuid) => self.uuid = Some(uuid),
            Err(e) if e.is_lost() => return Err(e),
            Err(_) => {}
        }
        self.handle = Some(handle);
        // A new handle may be a reset or replaced board: learn its abilities afresh.
        self.unsupported = 0;
        self.unsupported_since = None;
        self.process_util = ProcessUtilCache::new(self.process_util.interval());
        self.pcie.forget();
        self.mig.forget();
        Ok(())
    }

    fn mark_lost(&mut self, e: &ApiError, now: Instant) {
        let reason = match e {
            ApiError::GpuLost => "the GPU has fallen off the bus".to_string(),
            ApiError::ResetRequired => "the GPU needs a reset".to_string(),
            other => format!("cannot open the GPU: {other}"),
        };
        self.handle = None;
        self.lost = Some(Lost {
            reason,
            retry_at: now + self.next_backoff,
        });
        self.next_backoff = (self.next_backoff * 2).min(LOST_RETRY_MAX);
    }

    fn lost_snapshot(&self) -> DeviceSnapshot {
        let mut d = DeviceSnapshot::unknown(self.index, self.name.clone(), false);
        d.uuid = self.uuid.clone();
        let reason = self.lost.as_ref().map(|l| l.reason.clone());
        d.health = DeviceHealth::Lost(reason.unwrap_or_else(|| "no device handle".into()));
        d
    }

    /// Poll this device. A lost device is asked for a new handle once its backoff has
    /// passed; until then it costs no NVML call.
    pub fn poll<A: NvmlApi<Device = D>>(
        &mut self,
        api: &A,
        now: Instant,
        hosts: &mut HostTracker,
        warnings: &mut Vec<String>,
        laps: &mut Laps,
    ) -> DeviceSnapshot {
        if let Some(lost) = &self.lost {
            if now < lost.retry_at {
                return self.lost_snapshot();
            }
            if let Err(e) = self.acquire(api) {
                self.mark_lost(&e, now);
                return self.lost_snapshot();
            }
        }
        match self.read(now, hosts, warnings, laps) {
            Ok(snapshot) => {
                self.lost = None;
                self.next_backoff = LOST_RETRY_FIRST;
                snapshot
            }
            Err(e) => {
                self.mark_lost(&e, now);
                self.lost_snapshot()
            }
        }
    }

    /// Forget which figures said "not supported" once a minute, in case that changed.
    fn recheck_unsupported(&mut self, now: Instant) {
        match self.unsupported_since {
            Some(since) if now.saturating_duration_since(since) >= UNSUPPORTED_RECHECK => {
                self.unsupported = 0;
                self.unsupported_since = Some(now);
            }
            None => self.unsupported_since = Some(now),
            Some(_) => {}
        }
    }

    /// Every figure, each on its own; `Err` only when the GPU is lost.
    fn read(
        &mut self,
        now: Instant,
        hosts: &mut HostTracker,
        warnings: &mut Vec<String>,
        laps: &mut Laps,
    ) -> Result<DeviceSnapshot, ApiError> {
        self.recheck_unsupported(now);
        let Some(dev) = self.handle.as_ref() else {
            return Err(ApiError::Other("no device handle".into()));
        };
        let gpu = self.index;
        let mut r = FieldReader {
            index: self.index,
            unsupported: &mut self.unsupported,
            warnings,
        };
        let mut d = DeviceSnapshot::unknown(self.index, self.name.clone(), false);
        d.uuid = self.uuid.clone();
        read_figures(dev, &mut r, &mut d)?;
        laps.lap(|| format!("gpu{gpu}: memory, utilisation, temperature, power, clocks"));
        d.mig_enabled = self
            .mig
            .get(now, || r.read(Field::Mig, || dev.mig_enabled()))?;
        laps.lap(|| format!("gpu{gpu}: MIG mode"));
        if self.slow_fields {
            (d.pcie_rx_kib_s, d.pcie_tx_kib_s) = self.pcie.get(now, || {
                let rx = r.read(Field::PcieRx, || dev.pcie_kib_s(PcieDirection::Rx))?;
                let tx = r.read(Field::PcieTx, || dev.pcie_kib_s(PcieDirection::Tx))?;
                Ok((rx, tx))
            })?;
            laps.lap(|| format!("gpu{gpu}: PCIe throughput (rx, tx)"));
        }

        // A failed list counts as empty: its warning says why.
        self.compute = r
            .read(Field::ComputeProcesses, || {
                list_with_retry(|| dev.compute_processes())
            })?
            .unwrap_or_default();
        self.graphics = r
            .read(Field::GraphicsProcesses, || {
                list_with_retry(|| dev.graphics_processes())
            })?
            .unwrap_or_default();
        merge_process_lists(&self.compute, &self.graphics, &mut self.merged);
        laps.lap(|| format!("gpu{gpu}: compute and graphics process lists"));

        if self.slow_fields && self.process_util.due(now, !self.merged.is_empty()) {
            let since = self.process_util.since_us();
            self.process_util
                .record(now, dev.process_utilization(since))?;
            laps.lap(|| format!("gpu{gpu}: per-process utilisation"));
        }

        d.processes.reserve(self.merged.len());
        for p in &self.merged {
            let (host_view, info) = hosts.lookup(p.pid);
            d.processes.push(ProcessSnapshot {
                pid: p.pid,
                kind: p.kind,
                used_memory_bytes: p.used_bytes,
                sm_util_pct: self.process_util.sm_util(p.pid),
                user: info.user,
                command: info.command,
                cpu_pct: info.cpu_pct,
                rss_bytes: info.rss_bytes,
                host_view,
                cgroup: info.cgroup,
                frameworks: info.frameworks,
            });
        }
        laps.lap(|| format!("gpu{gpu}: /proc for {} process(es)", self.merged.len()));
        Ok(d)
    }
}

/// The cheap figures, read on every poll (each well under a microsecond on an H100, memory
/// about 6 us).
fn read_figures<D: DeviceApi>(
    dev: &D,
    r: &mut FieldReader<'_>,
    d: &mut DeviceSnapshot,
) -> Result<(), ApiError> {
    if let Some(m) = r.read(Field::Memory, || dev.memory_info())? {
        d.memory_total_bytes = Some(m.total);
        d.memory_reserved_bytes = Some(m.reserved);
        d.memory_used_bytes = Some(m.used);
        d.memory_free_bytes = Some(m.free);
    }
    if let Some((gpu, memory)) = r.read(Field::Utilization, || dev.utilization())? {
        d.gpu_util_pct = Some(gpu);
        d.memory_util_pct = Some(memory);
    }
    d.temperature_c = r.read(Field::Temperature, || dev.temperature_c())?;
    d.power_mw = r.read(Field::Power, || dev.power_usage_mw())?;
    d.power_limit_mw = r.read(Field::PowerLimit, || dev.power_limit_mw())?;
    d.sm_clock_mhz = r.read(Field::SmClock, || dev.clock_mhz(ClockDomain::Sm))?;
    d.memory_clock_mhz = r.read(Field::MemoryClock, || dev.clock_mhz(ClockDomain::Memory))?;
    d.fan_pct = r.read(Field::Fan, || dev.fan_pct())?;
    d.performance_state = r.read(Field::PerformanceState, || dev.performance_state())?;
    Ok(())
}
