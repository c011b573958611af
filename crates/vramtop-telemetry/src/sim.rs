//! A simulated GPU for machines with no NVIDIA driver (this one, CI). It is always
//! labelled as simulated, and it shows no invented processes: the only memory in use is
//! what vramtop's own probe workloads hold, reported through a `WorkloadGauge`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::procfs::ProcSampler;
use super::{
    hostname, now_ms, DeviceHealth, DeviceSnapshot, HostView, ProcessKind, ProcessSnapshot,
    SystemSnapshot, TelemetrySource,
};
use vramtop_alloc::rng::Rng;

pub const SIM_NAME: &str = "simulated H100 80GB";
pub const SIM_SOURCE: &str = "simulated (no NVIDIA driver found)";
/// Figures of an idle H100 80GB HBM3 (tests/fixtures/h100-nvidia-smi-q.xml).
const TOTAL_BYTES: u64 = 81_559 << 20;
const RESERVED_BYTES: u64 = 480 << 20;
/// What a CUDA context costs on an H100 before any allocation: shown only while a
/// workload runs, as a real driver would.
const CONTEXT_BYTES: u64 = 518 << 20;
const POWER_LIMIT_MW: u32 = 700_000;
const IDLE_POWER_MW: f64 = 70_000.0;

/// Bytes held on the simulated device by vramtop's own workloads, shared with the probe
/// runner. Cloning shares the count.
#[derive(Clone, Debug, Default)]
pub struct WorkloadGauge(Arc<AtomicU64>);

impl WorkloadGauge {
    pub fn set(&self, bytes: u64) {
        self.0.store(bytes, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub struct SimSource {
    rng: Rng,
    workload: WorkloadGauge,
    /// Smoothed utilisation, so gauges drift like a real device's instead of jumping.
    util: f64,
    procs: ProcSampler,
    /// Clock for `taken_at_ms`; tests pin it so snapshots are reproducible.
    clock: fn() -> u64,
}

impl SimSource {
    pub fn new(seed: u64, workload: WorkloadGauge) -> Self {
        SimSource {
            rng: Rng::new(seed),
            workload,
            util: 0.0,
            procs: ProcSampler::default(),
            clock: now_ms,
        }
    }

    /// A source whose timestamps are fixed, for reproducible tests and snapshots.
    pub fn with_fixed_clock(mut self) -> Self {
        self.clock = || 0;
        self
    }

    fn device(&mut self) -> DeviceSnapshot {
        let held = self.workload.get();
        let busy = held > 0;
        // A random walk towards a target that depends on whether work is running.
        let target = if busy { 65.0 } else { 0.0 };
        let noise = (self.rng.next_f64() - 0.5) * if busy { 30.0 } else { 2.0 };
        self.util = (self.util * 0.7 + target * 0.3 + noise).clamp(0.0, 100.0);
        let util = self.util.round() as u32;
        let used = if busy { CONTEXT_BYTES + held } else { 0 }.min(TOTAL_BYTES - RESERVED_BYTES);

        let mut d = DeviceSnapshot::unknown(0, SIM_NAME, true);
        d.uuid = Some("SIM-00000000-0000-0000-0000-000000000000".to_string());
        d.health = DeviceHealth::Ok;
        d.memory_total_bytes = Some(TOTAL_BYTES);
        d.memory_reserved_bytes = Some(RESERVED_BYTES);
        d.memory_used_bytes = Some(used);
        d.memory_free_bytes = Some(TOTAL_BYTES - RESERVED_BYTES - used);
        d.gpu_util_pct = Some(util);
        d.memory_util_pct = Some(util / 2);
        d.temperature_c = Some(31 + util * 35 / 100);
        d.power_mw = Some((IDLE_POWER_MW + self.util / 100.0 * 500_000.0) as u32);
        d.power_limit_mw = Some(POWER_LIMIT_MW);
        d.sm_clock_mhz = Some(if busy { 1980 } else { 345 });
        d.memory_clock_mhz = Some(2619);
        d.pcie_rx_kib_s = Some(if busy {
            self.rng.range(1_000, 40_000) as u32
        } else {
            0
        });
        d.pcie_tx_kib_s = Some(if busy {
            self.rng.range(500, 20_000) as u32
        } else {
            0
        });
        // A datacenter H100 has no fan: the real board reports N/A, and so do we.
        d.fan_pct = None;
        d.performance_state = Some(0);
        d.mig_enabled = Some(false);
        if busy {
            let pid = std::process::id();
            let info = self.procs.sample(pid).unwrap_or_default();
            d.processes.push(ProcessSnapshot {
                pid,
                kind: ProcessKind::Compute,
                used_memory_bytes: Some(CONTEXT_BYTES + held),
                sm_util_pct: Some(util),
                user: info.user,
                command: info.command,
                cpu_pct: info.cpu_pct,
                rss_bytes: info.rss_bytes,
                host_view: HostView::Visible,
                cgroup: info.cgroup,
                frameworks: info.frameworks,
            });
        }
        d
    }
}

impl TelemetrySource for SimSource {
    fn poll(&mut self) -> SystemSnapshot {
        let device = self.device();
        SystemSnapshot {
            hostname: hostname(),
            source: SIM_SOURCE.to_string(),
            driver_version: None,
            cuda_version: None,
            devices: vec![device],
            taken_at_ms: (self.clock)(),
            warnings: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges(source: &mut SimSource) -> Vec<(Option<u32>, Option<u32>)> {
        (0..10)
            .map(|_| {
                let d = source.poll().devices.remove(0);
                (d.gpu_util_pct, d.power_mw)
            })
            .collect()
    }

    #[test]
    fn same_seed_same_readings() {
        let w = WorkloadGauge::default();
        w.set(1 << 30);
        let a = gauges(&mut SimSource::new(3, w.clone()));
        let b = gauges(&mut SimSource::new(3, w.clone()));
        let c = gauges(&mut SimSource::new(4, w));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn idle_sim_invents_no_processes() {
        let mut s = SimSource::new(1, WorkloadGauge::default());
        let snap = s.poll();
        assert_eq!(snap.devices.len(), 1);
        let d = &snap.devices[0];
        assert!(d.simulated);
        assert!(d.processes.is_empty());
        assert_eq!(d.memory_used_bytes, Some(0));
        assert_eq!(d.fan_pct, None);
        assert!(snap.source.contains("simulated"));
    }

    #[test]
    fn workload_memory_is_ours_and_adds_up() {
        let w = WorkloadGauge::default();
        let mut s = SimSource::new(1, w.clone());
        w.set(3 << 30);
        let d = s.poll().devices.remove(0);
        assert_eq!(d.processes.len(), 1);
        assert_eq!(d.processes[0].pid, std::process::id());
        assert_eq!(d.unattributed_bytes(), Some(0));
        let total = d.memory_total_bytes.unwrap();
        assert_eq!(
            d.memory_used_bytes.unwrap()
                + d.memory_free_bytes.unwrap()
                + d.memory_reserved_bytes.unwrap(),
            total
        );
    }
}
