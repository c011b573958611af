//! The NVML source driven through its seam by a scripted fake: every error the driver can
//! give is tried field by field, and the clock is stepped by hand, so no GPU and no sleep.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vramtop::telemetry::nvml::{
    ApiError, ClockDomain, DeviceApi, GpuProcess, MemoryFigures, NvmlApi, NvmlOptions, NvmlSource,
    PcieDirection, ProcessUtilSample,
};
use vramtop::telemetry::{DeviceHealth, HostView, ProcessKind, SystemSnapshot};

const GIB: u64 = 1 << 30;

/// What one fake GPU answers. Scalar fields answer the same every time; process lists
/// answer from `*_once` first, then `*_steady`.
#[derive(Clone)]
struct Script {
    name: String,
    lost: bool,
    memory: Result<MemoryFigures, ApiError>,
    utilization: Result<(u32, u32), ApiError>,
    temperature: Result<u32, ApiError>,
    power: Result<u32, ApiError>,
    power_limit: Result<u32, ApiError>,
    sm_clock: Result<u32, ApiError>,
    memory_clock: Result<u32, ApiError>,
    pcie: Result<u32, ApiError>,
    fan: Result<u32, ApiError>,
    pstate: Result<u32, ApiError>,
    mig: Result<bool, ApiError>,
    compute_once: VecDeque<Result<Vec<GpuProcess>, ApiError>>,
    compute_steady: Result<Vec<GpuProcess>, ApiError>,
    graphics_once: VecDeque<Result<Vec<GpuProcess>, ApiError>>,
    graphics_steady: Result<Vec<GpuProcess>, ApiError>,
    process_util: Result<Vec<ProcessUtilSample>, ApiError>,
}

/// An idle H100 as trace h100-nvidia-smi-q.xml shows it: no fan (InvalidArg).
fn h100() -> Script {
    Script {
        name: "NVIDIA H100 80GB HBM3".into(),
        lost: false,
        memory: Ok(MemoryFigures {
            total: 81_559 << 20,
            reserved: 480 << 20,
            used: 0,
            free: 81_079 << 20,
        }),
        utilization: Ok((0, 0)),
        temperature: Ok(31),
        power: Ok(127_750),
        power_limit: Ok(700_000),
        sm_clock: Ok(1980),
        memory_clock: Ok(2619),
        pcie: Ok(423),
        fan: Err(ApiError::InvalidArg),
        pstate: Ok(0),
        mig: Ok(false),
        compute_once: VecDeque::new(),
        compute_steady: Ok(Vec::new()),
        graphics_once: VecDeque::new(),
        graphics_steady: Ok(Vec::new()),
        process_util: Err(ApiError::NotFound),
    }
}

#[derive(Default)]
struct FakeState {
    scripts: Vec<Script>,
    /// Calls per (device index, call name).
    calls: HashMap<(u32, &'static str), usize>,
}

#[derive(Clone)]
struct Fake(Arc<Mutex<FakeState>>);

impl Fake {
    fn new(scripts: Vec<Script>) -> Self {
        Fake(Arc::new(Mutex::new(FakeState {
            scripts,
            calls: HashMap::new(),
        })))
    }

    fn state(&self) -> MutexGuard<'_, FakeState> {
        // A test that panicked while holding the lock has already failed.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn script(&self, index: u32, edit: impl FnOnce(&mut Script)) {
        edit(&mut self.state().scripts[index as usize]);
    }

    fn calls(&self, index: u32, call: &'static str) -> usize {
        self.state().calls.get(&(index, call)).copied().unwrap_or(0)
    }

    /// Count the call, then answer from the script (or GpuLost for a lost GPU).
    fn answer<T>(
        &self,
        index: u32,
        call: &'static str,
        pick: impl FnOnce(&mut Script) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let mut state = self.state();
        *state.calls.entry((index, call)).or_default() += 1;
        let script = &mut state.scripts[index as usize];
        if script.lost {
            return Err(ApiError::GpuLost);
        }
        pick(script)
    }
}

struct FakeDevice {
    fake: Fake,
    index: u32,
}

impl NvmlApi for Fake {
    type Device = FakeDevice;
    fn driver_version(&self) -> Result<String, ApiError> {
        Ok("580.159.04".into())
    }
    fn cuda_driver_version(&self) -> Result<i32, ApiError> {
        Ok(13000)
    }
    fn device_count(&self) -> Result<u32, ApiError> {
        Ok(self.state().scripts.len() as u32)
    }
    fn device_by_index(&self, index: u32) -> Result<FakeDevice, ApiError> {
        self.answer(index, "device_by_index", |_| Ok(()))?;
        Ok(FakeDevice {
            fake: self.clone(),
            index,
        })
    }
}

impl DeviceApi for FakeDevice {
    fn name(&self) -> Result<String, ApiError> {
        self.fake.answer(self.index, "name", |s| Ok(s.name.clone()))
    }
    fn uuid(&self) -> Result<String, ApiError> {
        let uuid = format!("GPU-0000000{}", self.index);
        self.fake.answer(self.index, "uuid", |_| Ok(uuid))
    }
    fn memory_info(&self) -> Result<MemoryFigures, ApiError> {
        self.fake
            .answer(self.index, "memory_info", |s| s.memory.clone())
    }
    fn utilization(&self) -> Result<(u32, u32), ApiError> {
        self.fake
            .answer(self.index, "utilization", |s| s.utilization.clone())
    }
    fn temperature_c(&self) -> Result<u32, ApiError> {
        self.fake
            .answer(self.index, "temperature", |s| s.temperature.clone())
    }
    fn power_usage_mw(&self) -> Result<u32, ApiError> {
        self.fake.answer(self.index, "power", |s| s.power.clone())
    }
    fn power_limit_mw(&self) -> Result<u32, ApiError> {
        self.fake
            .answer(self.index, "power_limit", |s| s.power_limit.clone())
    }
    fn clock_mhz(&self, domain: ClockDomain) -> Result<u32, ApiError> {
        self.fake.answer(self.index, "clock", |s| match domain {
            ClockDomain::Sm => s.sm_clock.clone(),
            ClockDomain::Memory => s.memory_clock.clone(),
        })
    }
    fn pcie_kib_s(&self, _direction: PcieDirection) -> Result<u32, ApiError> {
        self.fake.answer(self.index, "pcie", |s| s.pcie.clone())
    }
    fn fan_pct(&self) -> Result<u32, ApiError> {
        self.fake.answer(self.index, "fan", |s| s.fan.clone())
    }
    fn performance_state(&self) -> Result<u32, ApiError> {
        self.fake.answer(self.index, "pstate", |s| s.pstate.clone())
    }
    fn mig_enabled(&self) -> Result<bool, ApiError> {
        self.fake.answer(self.index, "mig", |s| s.mig.clone())
    }
    fn compute_processes(&self) -> Result<Vec<GpuProcess>, ApiError> {
        self.fake.answer(self.index, "compute_processes", |s| {
            s.compute_once
                .pop_front()
                .unwrap_or_else(|| s.compute_steady.clone())
        })
    }
    fn graphics_processes(&self) -> Result<Vec<GpuProcess>, ApiError> {
        self.fake.answer(self.index, "graphics_processes", |s| {
            s.graphics_once
                .pop_front()
                .unwrap_or_else(|| s.graphics_steady.clone())
        })
    }
    fn process_utilization(&self, _since_us: u64) -> Result<Vec<ProcessUtilSample>, ApiError> {
        self.fake.answer(self.index, "process_utilization", |s| {
            s.process_util.clone()
        })
    }
}

/// A /proc of our own making, removed when the test ends.
struct FakeProc(PathBuf);

impl FakeProc {
    fn new(test: &str) -> Self {
        let root = std::env::temp_dir().join(format!("vramtop-nvml-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("temp dir");
        FakeProc(root)
    }

    fn add(&self, pid: u32, command: &str) {
        let dir = self.0.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("fake pid dir");
        let stat =
            format!("{pid} (python) S 1 {pid} {pid} 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0 1 1 1");
        std::fs::write(dir.join("stat"), stat).expect("stat");
        std::fs::write(dir.join("cmdline"), format!("{command}\0train.py\0")).expect("cmdline");
        std::fs::write(dir.join("statm"), "1000 256 0 0 0 0 0").expect("statm");
        std::fs::write(dir.join("status"), "Name:\tpython\nUid:\t0\t0\t0\t0\n").expect("status");
    }

    fn remove(&self, pid: u32) {
        std::fs::remove_dir_all(self.0.join(pid.to_string())).expect("remove fake pid");
    }
}

impl Drop for FakeProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn source(fake: &Fake, proc_root: PathBuf) -> NvmlSource<Fake> {
    let options = NvmlOptions {
        proc_root,
        ..NvmlOptions::default()
    };
    NvmlSource::new(fake.clone(), options).expect("fake NVML opens")
}

/// A source whose /proc is empty: every pid is another namespace's.
fn source_no_proc(fake: &Fake) -> NvmlSource<Fake> {
    source(fake, PathBuf::from("/nonexistent-vramtop-proc"))
}

fn gp(pid: u32, used: Option<u64>) -> GpuProcess {
    GpuProcess {
        pid,
        used_bytes: used,
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn health(snap: &SystemSnapshot, i: usize) -> &DeviceHealth {
    &snap.devices[i].health
}

#[test]
fn an_idle_h100_reports_every_figure_and_no_fan() {
    let fake = Fake::new(vec![h100()]);
    let mut src = source_no_proc(&fake);
    let t0 = Instant::now();
    let snap = src.poll_at(t0);
    assert_eq!(snap.source, "NVML");
    assert_eq!(snap.driver_version.as_deref(), Some("580.159.04"));
    assert_eq!(snap.cuda_version.as_deref(), Some("13.0"));
    assert!(snap.warnings.is_empty(), "{:?}", snap.warnings);
    let d = &snap.devices[0];
    assert_eq!(d.name, "NVIDIA H100 80GB HBM3");
    assert_eq!(d.uuid.as_deref(), Some("GPU-00000000"));
    assert_eq!(d.health, DeviceHealth::Ok);
    assert!(!d.simulated);
    assert_eq!(d.memory_total_bytes, Some(81_559 << 20));
    assert_eq!(d.memory_reserved_bytes, Some(480 << 20));
    assert_eq!(d.memory_used_bytes, Some(0));
    assert_eq!(d.memory_free_bytes, Some(81_079 << 20));
    assert_eq!((d.gpu_util_pct, d.memory_util_pct), (Some(0), Some(0)));
    assert_eq!(
        (d.temperature_c, d.power_mw, d.power_limit_mw),
        (Some(31), Some(127_750), Some(700_000))
    );
    assert_eq!(
        (d.sm_clock_mhz, d.memory_clock_mhz),
        (Some(1980), Some(2619))
    );
    assert_eq!((d.pcie_rx_kib_s, d.pcie_tx_kib_s), (Some(423), Some(423)));
    assert_eq!(d.fan_pct, None, "no fan is None, never 0");
    assert_eq!((d.performance_state, d.mig_enabled), (Some(0), Some(false)));
    assert!(d.processes.is_empty());

    // A board without a fan has none later either: it is not asked again.
    src.poll_at(t0 + secs(1.0));
    src.poll_at(t0 + secs(2.0));
    assert_eq!(fake.calls(0, "fan"), 1);
    assert_eq!(fake.calls(0, "memory_info"), 3);
    // MIG mode costs ~110 us and changes only with a reset: read twice a minute.
    assert_eq!(fake.calls(0, "mig"), 1);
    // ... until a minute has passed, in case support changed (MIG switched, say).
    src.poll_at(t0 + secs(61.0));
    assert_eq!(fake.calls(0, "fan"), 2);
    assert_eq!(fake.calls(0, "mig"), 2);
}

#[test]
fn each_failing_field_becomes_none_on_its_own() {
    let mut script = h100();
    script.temperature = Err(ApiError::NotSupported);
    script.power = Err(ApiError::MissingFunction("nvmlDeviceGetPowerUsage".into()));
    script.sm_clock = Err(ApiError::Other("an internal driver error occurred".into()));
    script.pstate = Err(ApiError::NotFound);
    script.mig = Err(ApiError::NotSupported);
    let fake = Fake::new(vec![script]);
    let mut src = source_no_proc(&fake);
    let snap = src.poll_at(Instant::now());
    let d = &snap.devices[0];
    assert_eq!(d.health, DeviceHealth::Ok);
    assert_eq!(
        (d.temperature_c, d.power_mw, d.sm_clock_mhz),
        (None, None, None)
    );
    assert_eq!((d.performance_state, d.mig_enabled), (None, None));
    // Neighbours of a failing field still read.
    assert_eq!(
        (d.power_limit_mw, d.memory_clock_mhz),
        (Some(700_000), Some(2619))
    );
    assert!(d.memory_used_bytes.is_some());
    // Unsupported is silent; an unexpected error says which GPU and figure.
    assert_eq!(
        snap.warnings,
        vec!["GPU 0: SM clock: an internal driver error occurred"]
    );
}

#[test]
fn no_permission_on_processes_warns_once_and_keeps_the_device() {
    let mut script = h100();
    script.compute_steady = Err(ApiError::NoPermission);
    script.graphics_steady = Err(ApiError::NoPermission);
    let fake = Fake::new(vec![script]);
    let mut src = source_no_proc(&fake);
    let snap = src.poll_at(Instant::now());
    assert_eq!(
        snap.warnings,
        vec!["GPU 0: process list needs permission: run as the GPU's owner or root"]
    );
    let d = &snap.devices[0];
    assert_eq!(d.health, DeviceHealth::Ok);
    assert!(d.memory_total_bytes.is_some() && d.processes.is_empty());
}

#[test]
fn a_list_that_grows_while_read_is_asked_again() {
    let mut script = h100();
    script.compute_once = VecDeque::from([
        Err(ApiError::InsufficientSize),
        Ok(vec![gp(101, Some(2 * GIB)), gp(102, Some(GIB))]),
    ]);
    let fake = Fake::new(vec![script]);
    let mut src = source_no_proc(&fake);
    let snap = src.poll_at(Instant::now());
    assert!(snap.warnings.is_empty(), "{:?}", snap.warnings);
    let pids: Vec<_> = snap.devices[0].processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![101, 102]);
    assert_eq!(fake.calls(0, "compute_processes"), 2);

    // A list that never settles gives up after a few tries, with a warning, this poll only.
    fake.script(0, |s| s.compute_steady = Err(ApiError::InsufficientSize));
    let snap = src.poll_at(Instant::now());
    assert_eq!(fake.calls(0, "compute_processes"), 5);
    assert!(snap.devices[0].processes.is_empty());
    assert_eq!(snap.warnings.len(), 1);
    assert!(
        snap.warnings[0].contains("read again next poll"),
        "{:?}",
        snap.warnings
    );
}

#[test]
fn compute_and_graphics_entries_of_one_pid_merge_to_c_plus_g() {
    let mut script = h100();
    script.compute_steady = Ok(vec![gp(7, Some(3 * GIB)), gp(8, None)]);
    script.graphics_steady = Ok(vec![gp(7, Some(3 * GIB)), gp(9, Some(GIB))]);
    let fake = Fake::new(vec![script]);
    let mut src = source_no_proc(&fake);
    let d = src.poll_at(Instant::now()).devices.remove(0);
    let rows: Vec<_> = d
        .processes
        .iter()
        .map(|p| (p.pid, p.kind, p.used_memory_bytes, p.host_view))
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                7,
                ProcessKind::Both,
                Some(3 * GIB),
                HostView::OtherNamespace
            ),
            (8, ProcessKind::Compute, None, HostView::OtherNamespace),
            (
                9,
                ProcessKind::Graphics,
                Some(GIB),
                HostView::OtherNamespace
            ),
        ]
    );
}

#[test]
fn process_utilisation_is_slow_so_it_is_asked_every_five_seconds() {
    let mut script = h100();
    script.compute_steady = Ok(vec![gp(7, Some(GIB)), gp(8, Some(GIB))]);
    script.process_util = Ok(vec![ProcessUtilSample {
        pid: 7,
        timestamp_us: 1_000,
        sm_util_pct: 93,
    }]);
    let fake = Fake::new(vec![script]);
    let mut src = source_no_proc(&fake);
    let t0 = Instant::now();
    for tick in 0..10 {
        let d = src.poll_at(t0 + secs(tick as f64)).devices.remove(0);
        // Reused between queries; a pid with no sample has no data, not 0 %.
        assert_eq!(d.processes[0].sm_util_pct, Some(93), "tick {tick}");
        assert_eq!(d.processes[1].sm_util_pct, None, "tick {tick}");
    }
    assert_eq!(
        fake.calls(0, "process_utilization"),
        2,
        "at 0 s and 5 s only"
    );

    // NotFound: no samples in the window, so no data (and no warning).
    fake.script(0, |s| s.process_util = Err(ApiError::NotFound));
    let snap = src.poll_at(t0 + secs(10.0));
    assert!(snap.warnings.is_empty());
    assert!(snap.devices[0]
        .processes
        .iter()
        .all(|p| p.sm_util_pct.is_none()));
}

#[test]
fn no_processes_no_slow_call_and_pcie_is_read_every_two_seconds() {
    let fake = Fake::new(vec![h100()]);
    let mut src = source_no_proc(&fake);
    let t0 = Instant::now();
    for tick in 0..4 {
        let d = src.poll_at(t0 + secs(tick as f64)).devices.remove(0);
        assert_eq!(d.pcie_rx_kib_s, Some(423), "reused between reads");
    }
    assert_eq!(fake.calls(0, "process_utilization"), 0);
    assert_eq!(fake.calls(0, "pcie"), 4, "rx and tx at 0 s and 2 s");
}

#[test]
fn a_lost_gpu_is_marked_and_the_other_keeps_updating() {
    let fake = Fake::new(vec![h100(), h100()]);
    let mut src = source_no_proc(&fake);
    let t0 = Instant::now();
    assert_eq!(src.poll_at(t0).devices.len(), 2);

    fake.script(1, |s| s.lost = true);
    fake.script(0, |s| {
        if let Ok(m) = &mut s.memory {
            m.used = 5 * GIB;
        }
    });
    let before = fake.calls(1, "memory_info");
    let snap = src.poll_at(t0 + secs(0.5));
    assert_eq!(health(&snap, 0), &DeviceHealth::Ok);
    assert_eq!(snap.devices[0].memory_used_bytes, Some(5 * GIB));
    assert_eq!(
        health(&snap, 1),
        &DeviceHealth::Lost("the GPU has fallen off the bus".into())
    );
    let lost = &snap.devices[1];
    assert_eq!(
        lost.name, "NVIDIA H100 80GB HBM3",
        "a lost GPU keeps its name"
    );
    assert_eq!(lost.memory_used_bytes, None);
    // The poll of a lost GPU stops at the first GpuLost: no more calls to it.
    assert_eq!(fake.calls(1, "memory_info"), before + 1);
    assert_eq!(fake.calls(1, "utilization"), 1);
}

#[test]
fn a_lost_gpu_is_asked_for_again_with_backoff_and_recovers() {
    let fake = Fake::new(vec![h100(), h100()]);
    let mut src = source_no_proc(&fake);
    let t0 = Instant::now();
    fake.script(1, |s| s.lost = true);
    src.poll_at(t0); // lost at 0 s: retry at 1 s, then 1+2, 3+4 ...
    let attempts = |f: &Fake| f.calls(1, "device_by_index") - 1;

    src.poll_at(t0 + secs(0.5));
    assert_eq!(attempts(&fake), 0, "no retry before 1 s");
    let snap = src.poll_at(t0 + secs(1.0));
    assert_eq!(attempts(&fake), 1);
    assert!(matches!(health(&snap, 1), DeviceHealth::Lost(_)));
    src.poll_at(t0 + secs(2.0));
    assert_eq!(attempts(&fake), 1, "next retry waits 2 s");

    fake.script(1, |s| s.lost = false);
    let snap = src.poll_at(t0 + secs(3.0));
    assert_eq!(attempts(&fake), 2);
    assert_eq!(health(&snap, 1), &DeviceHealth::Ok);
    assert_eq!(snap.devices[1].memory_total_bytes, Some(81_559 << 20));
    assert_eq!(health(&snap, 0), &DeviceHealth::Ok);
}

#[test]
fn backoff_doubles_to_a_thirty_second_cap() {
    let fake = Fake::new(vec![h100()]);
    let mut src = source_no_proc(&fake);
    let t0 = Instant::now();
    fake.script(0, |s| s.lost = true);
    // Poll every 0.25 s for 2 minutes and note when a handle was asked for.
    let mut retries = Vec::new();
    for q in 0..=480 {
        let at = q as f64 * 0.25;
        let before = fake.calls(0, "device_by_index");
        src.poll_at(t0 + secs(at));
        if fake.calls(0, "device_by_index") > before {
            retries.push(at);
        }
    }
    let gaps: Vec<f64> = retries.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(retries[0], 1.0);
    assert_eq!(&gaps[..5], &[2.0, 4.0, 8.0, 16.0, 30.0]);
    assert!(gaps.iter().all(|&g| g <= 30.0));
}

#[test]
fn a_gpu_that_cannot_be_opened_is_listed_lost_and_retried() {
    let fake = Fake::new(vec![h100(), h100()]);
    fake.script(1, |s| s.lost = true);
    let mut src = source_no_proc(&fake);
    let t0 = Instant::now();
    let snap = src.poll_at(t0);
    assert_eq!(snap.devices[1].name, "GPU 1");
    assert!(matches!(health(&snap, 1), DeviceHealth::Lost(_)));
    fake.script(1, |s| s.lost = false);
    let snap = src.poll_at(t0 + secs(1.5));
    assert_eq!(health(&snap, 1), &DeviceHealth::Ok);
    assert_eq!(snap.devices[1].name, "NVIDIA H100 80GB HBM3");
}

#[test]
fn processes_are_visible_other_namespace_or_exited() {
    let proc = FakeProc::new("hostview");
    proc.add(4242, "python3");
    let mut script = h100();
    script.compute_steady = Ok(vec![gp(4242, Some(GIB)), gp(777_777, Some(GIB))]);
    let fake = Fake::new(vec![script.clone(), script]);
    let mut src = source(&fake, proc.0.clone());
    let t0 = Instant::now();

    let snap = src.poll_at(t0);
    let p = &snap.devices[0].processes[0];
    assert_eq!(p.host_view, HostView::Visible);
    assert_eq!(p.command.as_deref(), Some("python3 train.py"));
    assert_eq!(p.user.as_deref(), Some("root"));
    assert!(p.rss_bytes.is_some_and(|b| b > 0));
    assert_eq!(
        snap.devices[0].processes[1].host_view,
        HostView::OtherNamespace
    );
    // The same pid on the second GPU gets the same host facts.
    assert_eq!(snap.devices[1].processes[0].command, p.command);

    // Gone from /proc while NVML still lists it: exited, kept in the list.
    proc.remove(4242);
    let snap = src.poll_at(t0 + secs(1.0));
    let p = &snap.devices[0].processes[0];
    assert_eq!((p.pid, p.host_view), (4242, HostView::Exited));
    assert_eq!(p.used_memory_bytes, Some(GIB));
    assert_eq!(
        snap.devices[0].processes[1].host_view,
        HostView::OtherNamespace
    );
}

/// `--once` without `--all-fields`: the two slow calls are never made, their figures are
/// unknown (not 0), and with timing on every group of driver calls has a named span.
#[test]
fn one_shot_skips_the_slow_fields_and_times_the_rest() {
    use vramtop::telemetry::TelemetrySource;
    let mut script = h100();
    script.compute_steady = Ok(vec![gp(7, Some(GIB))]);
    script.process_util = Ok(vec![ProcessUtilSample {
        pid: 7,
        timestamp_us: 1_000,
        sm_util_pct: 93,
    }]);
    let fake = Fake::new(vec![script]);
    let options = NvmlOptions {
        proc_root: PathBuf::from("/nonexistent-vramtop-proc"),
        slow_fields: false,
        timings: true,
        ..NvmlOptions::default()
    };
    let mut src = NvmlSource::new(fake.clone(), options).expect("fake NVML opens");
    let opening: Vec<String> = src.take_spans().into_iter().map(|s| s.0).collect();
    assert!(
        opening.iter().any(|s| s.starts_with("open 1 device")),
        "{opening:?}"
    );
    let d = src.poll().devices.remove(0);
    assert_eq!(fake.calls(0, "pcie"), 0);
    assert_eq!(fake.calls(0, "process_utilization"), 0);
    assert_eq!((d.pcie_rx_kib_s, d.pcie_tx_kib_s), (None, None));
    assert_eq!(d.processes[0].sm_util_pct, None);
    assert_eq!(d.memory_total_bytes, Some(81_559 << 20), "the rest is read");
    let polling: Vec<String> = src.take_spans().into_iter().map(|s| s.0).collect();
    for part in [
        "memory, utilisation",
        "MIG mode",
        "process lists",
        "/proc for 1",
    ] {
        assert!(
            polling.iter().any(|s| s.contains(part)),
            "{part}: {polling:?}"
        );
    }
    assert!(!polling.iter().any(|s| s.contains("PCIe")), "{polling:?}");
}
