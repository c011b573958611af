//! Leak detection end to end: the real linear_leak trace, the probe scenarios through
//! the instrumented allocator (one leaking, two that must stay quiet under every policy),
//! and the pure pieces (mark-and-compare, process trends).

use std::path::Path;

use vramtop::alloc::PolicyKind;
use vramtop::backing::BackingChoice;
use vramtop::leaks::{
    suspects_in_trace, usage_samples, Baseline, BlockRecord, DetectorConfig, LeakDetector,
    ProcessTrend, ProcessWatch, SiteDiff, Suspect, TraceLeakConfig, TrendConfig, UnattributedTrend,
};
use vramtop::probe::{setup, Probe, Scenario};
use vramtop::telemetry::{DeviceSnapshot, HostView, ProcessKind, ProcessSnapshot};
use vramtop::trace::{self, Trace};

const MIB: u64 = 1 << 20;
const LEAK_TAG: &str = "leak: kept output";
const PROBE_CAPACITY: u64 = 1 << 30;

fn linear_leak() -> Trace {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/linear_leak.pickle.gz"
    );
    assert!(
        Path::new(path).exists(),
        "{path} is missing: these tests read the real traces in tests/fixtures"
    );
    match trace::load(Path::new(path)) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

fn tags(suspects: &[Suspect]) -> Vec<&str> {
    suspects.iter().map(|s| s.tag.as_str()).collect()
}

#[test]
fn linear_leak_flags_the_kept_relu_output_only() {
    let trace = linear_leak();
    let suspects = suspects_in_trace(&trace, &TraceLeakConfig::default());
    assert_eq!(tags(&suspects), ["torch_trace.py:68 step"], "{suspects:#?}");
    let s = &suspects[0];
    // One 4 MiB output kept every third step: 20 windows of 3 steps, 4 MiB a window.
    assert_eq!(s.growth_bytes_per_window, 4 * MIB);
    assert_eq!(s.live_bytes, 20 * 4 * MIB);
    assert_eq!(s.live_blocks, 20);
    // The Linear's input (line 67) is saved by the kept output's autograd graph: it
    // grows in lockstep, allocated just before, and is reported as held, not as a leak.
    let held: Vec<&str> = s.retained_with.iter().map(|r| r.tag.as_str()).collect();
    assert_eq!(held, ["torch_trace.py:67 step"]);
}

#[test]
fn linear_leak_is_found_whatever_the_window_count() {
    let trace = linear_leak();
    for windows in [15, 20, 24, 30, 36, 40] {
        let config = TraceLeakConfig {
            windows,
            ..TraceLeakConfig::default()
        };
        let suspects = suspects_in_trace(&trace, &config);
        assert_eq!(
            tags(&suspects),
            ["torch_trace.py:68 step"],
            "{windows} windows: {suspects:#?}"
        );
    }
}

#[test]
fn linear_leak_json_lists_the_evidence() {
    let suspects = suspects_in_trace(&linear_leak(), &TraceLeakConfig::default());
    let json = serde_json::to_value(&suspects).unwrap_or_default();
    let first = &json[0];
    assert_eq!(first["tag"], "torch_trace.py:68 step");
    assert!(first["live_bytes"].as_u64().is_some_and(|b| b > 0));
    assert!(first["growth_bytes_per_window"]
        .as_u64()
        .is_some_and(|b| b > 0));
}

/// When the probe's step counter moved, the step that just began and the detector's
/// verdict: one sample per step, taken at the boundary, when the previous step's
/// transient buffers are all freed.
struct ProbeRun {
    /// The first step at whose start a suspect was reported.
    first_flagged_at: Option<u32>,
    /// Every tag ever reported, in order of first report.
    flagged: Vec<String>,
    steps: u32,
}

/// Steps the probe through its whole plan. `every_op` also samples after every
/// allocator call (the floor of a step then sees its peaks too).
fn run_probe(scenario: &str, policy: PolicyKind, seed: u64, every_op: bool) -> ProbeRun {
    run_probe_with(scenario, policy, seed, every_op, DetectorConfig::default())
}

fn run_probe_with(
    scenario: &str,
    policy: PolicyKind,
    seed: u64,
    every_op: bool,
    config: DetectorConfig,
) -> ProbeRun {
    let scenario = Scenario::load(scenario).unwrap_or_else(|e| panic!("{e}"));
    let set = setup::build(
        &scenario,
        &[policy],
        BackingChoice::Bookkeeping,
        Some(PROBE_CAPACITY),
        seed,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut probe: Probe = set
        .probes
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no probe"));
    let mut detector = LeakDetector::new(config);
    let mut run = ProbeRun {
        first_flagged_at: None,
        flagged: Vec::new(),
        steps: 0,
    };
    let mut step = probe.report().step;
    while probe.step() {
        let now = probe.report().step;
        let window = now.map_or(0, |(s, _)| u64::from(s));
        if now != step {
            step = now;
            let usage = probe.allocator().live_bytes_by_tag();
            detector.observe(window, &usage_samples(&usage));
            if !every_op {
                // The boundary sample is this window's only one: close it now.
                detector.close_window();
            }
            run.steps = now.map_or(0, |(s, _)| s);
            let suspects = detector.suspects();
            if !suspects.is_empty() && run.first_flagged_at.is_none() {
                run.first_flagged_at = now.map(|(s, _)| s);
            }
            for s in suspects {
                if !run.flagged.contains(&s.tag) {
                    run.flagged.push(s.tag);
                }
            }
        } else if every_op {
            let usage = probe.allocator().live_bytes_by_tag();
            detector.observe(window, &usage_samples(&usage));
        }
    }
    let report = probe.report();
    assert_eq!(report.ooms, 0, "{policy}: the probe ran out of memory");
    assert!(
        report.backing_errors.is_empty(),
        "{:?}",
        report.backing_errors
    );
    run
}

#[test]
fn the_leak_scenario_is_flagged_three_steps_after_the_leak_begins() {
    for policy in PolicyKind::ALL {
        let run = run_probe("leak", policy, 7, false);
        // The first buffer is kept in step 1. Window k is the sample when step k begins
        // (the end of step k-1): the floor rises in windows 2, 3 and 4, so the leak is
        // named when step 4 begins, after three leaking steps: the least N = 3 allows.
        assert_eq!(run.first_flagged_at, Some(4), "{policy}");
        assert_eq!(run.flagged, [LEAK_TAG], "{policy}");
        assert_eq!(run.steps, 60);
    }
}

#[test]
fn the_leak_scenario_is_flagged_with_samples_inside_steps_too() {
    let run = run_probe("leak", PolicyKind::Caching, 11, true);
    // Windows close only when the next step's first sample arrives: one step later.
    assert_eq!(run.first_flagged_at, Some(5));
    assert_eq!(run.flagged, [LEAK_TAG]);
}

#[test]
fn training_and_steady_raise_no_alarm() {
    for scenario in ["training", "steady"] {
        for policy in PolicyKind::ALL {
            for seed in [1, 2, 3] {
                let run = run_probe(scenario, policy, seed, false);
                assert!(run.steps >= 60, "{scenario} ran only {} steps", run.steps);
                assert!(
                    run.flagged.is_empty(),
                    "{scenario} {policy} seed {seed}: false alarm {:?}",
                    run.flagged
                );
            }
        }
    }
}

#[test]
fn training_sampled_inside_steps_raises_no_alarm() {
    // Peaks inside a step grow and shrink with the random batch; the floor does not.
    // Without the new-blocks guard, so that the floor alone has to hold.
    let floor_only = DetectorConfig {
        require_new_blocks: false,
        ..DetectorConfig::default()
    };
    for seed in [1, 2, 3, 4] {
        let run = run_probe("training", PolicyKind::Caching, seed, true);
        assert!(run.flagged.is_empty(), "seed {seed}: {:?}", run.flagged);
        let run = run_probe_with(
            "training",
            PolicyKind::Caching,
            seed,
            true,
            floor_only.clone(),
        );
        assert!(
            run.flagged.is_empty(),
            "floor only, seed {seed}: {:?}",
            run.flagged
        );
    }
    let run = run_probe("steady", PolicyKind::Tlsf, 5, true);
    assert!(run.flagged.is_empty(), "steady: {:?}", run.flagged);
}

fn record(id: u64, tag: &str, size: u64) -> BlockRecord {
    BlockRecord {
        id,
        tag: tag.to_string(),
        size,
        born: id * 10,
    }
}

#[test]
fn baseline_lists_what_was_allocated_since_the_mark_and_is_still_alive() {
    let at_mark = [
        record(1, "params", 64 * MIB),
        record(2, "act", 8 * MIB),
        record(3, "act", 8 * MIB),
    ];
    let baseline = Baseline::mark(&at_mark);
    assert_eq!(baseline.marked_blocks(), 3);
    assert_eq!(baseline.marked_bytes(), 80 * MIB);
    // Block 2 freed; 4 and 6 new at "kept"; 5 new and freed already; 7 new at "act".
    let now = [
        record(1, "params", 64 * MIB),
        record(3, "act", 8 * MIB),
        record(4, "kept", 4 * MIB),
        record(6, "kept", 4 * MIB),
        record(7, "act", 2 * MIB),
    ];
    let diff = baseline.diff(&now);
    let expect = [
        SiteDiff {
            tag: "kept".into(),
            bytes: 8 * MIB,
            blocks: 2,
        },
        SiteDiff {
            tag: "act".into(),
            bytes: 2 * MIB,
            blocks: 1,
        },
    ];
    assert_eq!(diff, expect);
    assert!(baseline.diff(&at_mark).is_empty());
    assert_eq!(Baseline::mark(&[]).diff(&now).len(), 3);
}

#[test]
fn process_trend_flags_a_rising_floor_not_a_warm_up() {
    let config = TrendConfig::default();
    let second = |s: u64| s * 1000;
    // 1 GiB leaking 8 MiB a second, sampled every second for 40 s.
    let leaking: Vec<(u64, u64)> = (0..=40)
        .map(|i| (second(i), 1024 * MIB + i * 8 * MIB))
        .collect();
    let t = ProcessTrend::compute(42, &leaking, &config).unwrap_or_else(|| panic!("empty"));
    assert!(t.growing);
    assert_eq!(t.high_water_bytes, 1344 * MIB);
    let slope = t.slope_bytes_per_s.unwrap_or_default();
    assert!((slope - 8.0 * MIB as f64).abs() < 1.0, "{slope}");
    // Too short a history says nothing yet (a job's first half minute is its warm-up).
    assert!(!ProcessTrend::compute(42, &leaking[..25], &config).is_some_and(|t| t.growing));

    // A warm-up: the same growth for 15 s, then level at its high-water mark.
    let warm: Vec<(u64, u64)> = (0..=40)
        .map(|i| (second(i), 1024 * MIB + i.min(15) * 8 * MIB))
        .collect();
    assert!(!ProcessTrend::compute(42, &warm, &config).is_some_and(|t| t.growing));
    // One step up later (a larger batch seen once) is not a leak either.
    let step: Vec<(u64, u64)> = (0..=40)
        .map(|i| (second(i), if i < 30 { 2048 * MIB } else { 2560 * MIB }))
        .collect();
    assert!(!ProcessTrend::compute(42, &step, &config).is_some_and(|t| t.growing));
    // A leak too slow to clear the threshold (1 MiB/s: 13 MiB a part, 21 needed).
    let slow: Vec<(u64, u64)> = (0..=40)
        .map(|i| (second(i), 1024 * MIB + i * MIB))
        .collect();
    assert!(!ProcessTrend::compute(42, &slow, &config).is_some_and(|t| t.growing));
    // A leak with the caching allocator's ups and downs on top still has a rising floor.
    let noisy: Vec<(u64, u64)> = (0..=40)
        .map(|i| (second(i), 1024 * MIB + i * 8 * MIB + (i % 3) * 40 * MIB))
        .collect();
    assert!(ProcessTrend::compute(42, &noisy, &config).is_some_and(|t| t.growing));

    // Flat memory: no growth, zero slope; a single sample: no slope at all.
    let flat: Vec<(u64, u64)> = (0..6).map(|i| (i * 500, 512 * MIB)).collect();
    let t = ProcessTrend::compute(7, &flat, &config).unwrap_or_else(|| panic!("empty"));
    assert!(!t.growing);
    assert_eq!(t.slope_bytes_per_s, Some(0.0));
    let one = ProcessTrend::compute(7, &flat[..1], &config).unwrap_or_else(|| panic!("empty"));
    assert_eq!(one.slope_bytes_per_s, None);
    assert_eq!(ProcessTrend::compute(7, &[], &config), None);
}

/// Real series (tests/fixtures/process_series.json): four jobs side by side on an H100,
/// NVML's figure for each every second for 200 s, one of them leaking 8 MiB/s from its
/// 71st second. Fed to the process watch second by second, as the live view does.
#[test]
fn real_jobs_warm_up_unflagged_and_the_real_leak_is_flagged_within_a_minute() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/process_series.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let onset = fixture["leak_onset_ms"].as_u64().expect("onset");
    let series = fixture["series"].as_object().expect("series");
    let mut flagged_at: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for (name, samples) in series {
        let mut watch = ProcessWatch::new(TrendConfig::default());
        for sample in samples.as_array().expect("samples") {
            let (t, bytes) = (
                sample[0].as_u64().expect("t"),
                sample[1].as_u64().expect("b"),
            );
            let mut device = DeviceSnapshot::unknown(0, "gpu", false);
            device.processes = vec![process(1, Some(bytes))];
            watch.observe(t, &device);
            if watch.trends().first().is_some_and(|trend| trend.growing) {
                flagged_at.entry(name.clone()).or_default().push(t);
            }
        }
    }
    for warm in ["gpt2", "resnet", "ddp-rank1", "ddp-rank2"] {
        assert!(
            !flagged_at.contains_key(warm),
            "{warm} flagged at {:?} ms",
            flagged_at[warm]
        );
    }
    let leak = flagged_at.get("leak").expect("the leak is flagged");
    let first = leak[0];
    assert!(first > onset, "flagged before the leak began: {first} ms");
    assert!(
        first - onset <= 60_000,
        "flagged {} s after onset",
        (first - onset) / 1000
    );
    // And it stays flagged while it leaks.
    let last = series["leak"].as_array().expect("leak")[..]
        .last()
        .expect("samples")[0]
        .as_u64()
        .expect("t");
    assert_eq!(leak.last(), Some(&last));
}

#[test]
fn unattributed_memory_is_flagged_only_when_it_stays_high() {
    let config = TrendConfig {
        min_samples: 3,
        unattributed_bytes: 100 * MIB,
        ..TrendConfig::default()
    };
    let high: Vec<(u64, Option<u64>)> = (0..4).map(|i| (i * 1000, Some(300 * MIB))).collect();
    assert!(UnattributedTrend::compute(&high, &config).flagged);
    let mut dipped = high.clone();
    dipped[1].1 = Some(50 * MIB);
    let t = UnattributedTrend::compute(&dipped, &config);
    assert!(!t.flagged);
    assert_eq!(t.min_bytes, Some(50 * MIB));
    let mut unknown = high.clone();
    unknown[2].1 = None;
    assert!(!UnattributedTrend::compute(&unknown, &config).flagged);
    assert!(!UnattributedTrend::compute(&high[..2], &config).flagged);
}

fn process(pid: u32, used: Option<u64>) -> ProcessSnapshot {
    ProcessSnapshot {
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: used,
        sm_util_pct: None,
        user: None,
        command: None,
        cpu_pct: None,
        rss_bytes: None,
        host_view: HostView::Visible,
        cgroup: None,
        frameworks: None,
    }
}

#[test]
fn process_watch_follows_snapshots() {
    let config = TrendConfig {
        window: 4,
        min_samples: 3,
        span_ms: 4_000,
        min_span_ms: 2_000,
        windows: 2,
        min_growth_bytes: MIB,
        unattributed_bytes: 100 * MIB,
    };
    let mut watch = ProcessWatch::new(config);
    for i in 0..6u64 {
        let mut device = DeviceSnapshot::unknown(0, "sim", true);
        device.memory_used_bytes = Some(2048 * MIB + i * 10 * MIB);
        device.processes = vec![
            process(100, Some(1024 * MIB + i * 10 * MIB)),
            process(200, Some(512 * MIB)),
            process(300, None),
        ];
        if i < 5 {
            device.processes.push(process(400, Some(64 * MIB)));
        }
        watch.observe(i * 1000, &device);
    }
    let trends = watch.trends();
    let pids: Vec<u32> = trends.iter().map(|t| t.pid).collect();
    // 300 never reported its memory; 400 is gone.
    assert_eq!(pids, [100, 200]);
    assert!(trends[0].growing);
    assert_eq!(trends[0].samples, 5, "the last 4 s are kept");
    assert!(!trends[1].growing);
    let u = watch.unattributed();
    assert_eq!(u.current_bytes, Some(512 * MIB));
    assert!(u.flagged);
}

#[test]
fn resnet_training_with_random_batches_has_no_suspect() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/resnet50_varbatch_train.pickle.gz"
    );
    let trace = trace::load(Path::new(path)).unwrap_or_else(|e| panic!("{e}"));
    for windows in [10, 20, 40] {
        let config = TraceLeakConfig {
            windows,
            ..TraceLeakConfig::default()
        };
        let suspects = suspects_in_trace(&trace, &config);
        assert!(suspects.is_empty(), "{windows} windows: {suspects:#?}");
    }
}

/// An attached job: the driver sees what PyTorch reserved, the hook what it allocated.
/// Reserved creeping up with tensors steady (fragmentation, a cache settling) is no leak.
#[test]
fn an_attached_job_is_flagged_only_when_its_allocated_floor_rises_too() {
    let config = TrendConfig::default();
    let run = |reserved: &dyn Fn(u64) -> u64, allocated: &dyn Fn(u64) -> u64| {
        let mut watch = ProcessWatch::new(config.clone());
        let mut last = None;
        for s in 0..90u64 {
            let mut device = DeviceSnapshot::unknown(0, "gpu", false);
            device.processes = vec![process(1, Some(reserved(s)))];
            watch.observe(s * 1000, &device);
            watch.observe_allocated(s * 1000, &[(1, s, allocated(s)), (2, s, 5 * MIB)]);
            last = watch.trends().first().cloned();
        }
        last.expect("a trend")
    };
    // 8 MiB/s of tensors kept, and the cache growing with them.
    let leak = run(&|s| 2048 * MIB + s * 8 * MIB, &|s| 1024 * MIB + s * 8 * MIB);
    assert!(leak.growing && leak.of_allocated, "{leak:?}");
    // Reserved creeping up 2 MiB/s, tensors steady.
    let frag = run(&|s| 2048 * MIB + s * 2 * MIB, &|_| 1024 * MIB);
    assert!(!frag.growing && frag.of_allocated, "{frag:?}");
    // Without the hook's figure the driver's decides, as before.
    let mut watch = ProcessWatch::new(config.clone());
    for s in 0..90u64 {
        let mut device = DeviceSnapshot::unknown(0, "gpu", false);
        device.processes = vec![process(1, Some(2048 * MIB + s * 2 * MIB))];
        watch.observe(s * 1000, &device);
    }
    let driver = watch.trends()[0].clone();
    assert!(driver.growing && !driver.of_allocated, "{driver:?}");
    // A hook that went quiet repeats its last state: no flat series hides the driver's
    // leak once its last figure is older than a part of the history.
    let quiet = run(&|s| 2048 * MIB + s * 8 * MIB, &|_| 1024 * MIB);
    assert!(!quiet.growing, "{quiet:?}");
    let mut watch = ProcessWatch::new(config.clone());
    for s in 0..90u64 {
        let mut device = DeviceSnapshot::unknown(0, "gpu", false);
        device.processes = vec![process(1, Some(2048 * MIB + s * 8 * MIB))];
        watch.observe(s * 1000, &device);
        watch.observe_allocated(s * 1000, &[(1, s.min(10), 1024 * MIB)]);
    }
    let stale = watch.trends()[0].clone();
    assert!(stale.growing && !stale.of_allocated, "{stale:?}");
}

/// Real series (tests/fixtures/allocated_series.json): five hooked processes side by side
/// on an H100 for 200 s, each second PyTorch's allocated bytes (from the hook) and NVML's
/// figure; one keeps 8 MiB a second from 76 s. Fed to the process watch second by second,
/// as the live view does for attached jobs.
#[test]
fn real_attached_jobs_warm_up_unflagged_and_the_real_leak_is_flagged_within_a_minute() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/allocated_series.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let onset = fixture["leak_onset_ms"].as_u64().expect("onset");
    let series = fixture["series"].as_object().expect("series");
    assert_eq!(series.len(), 5);
    let flags = |use_allocated: bool| {
        let mut flagged_at: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
        for (name, samples) in series {
            let mut watch = ProcessWatch::new(TrendConfig::default());
            for sample in samples.as_array().expect("samples") {
                let n = |i: usize| sample[i].as_u64().expect("a figure");
                let mut device = DeviceSnapshot::unknown(0, "gpu", false);
                device.processes = vec![process(1, Some(n(2)))];
                watch.observe(n(0), &device);
                if use_allocated {
                    watch.observe_allocated(n(0), &[(1, n(0), n(1))]);
                }
                let trend = watch.trends()[0].clone();
                assert_eq!(trend.of_allocated, use_allocated);
                if trend.growing {
                    flagged_at.entry(name.clone()).or_default().push(n(0));
                }
            }
        }
        flagged_at
    };
    for use_allocated in [true, false] {
        let flagged_at = flags(use_allocated);
        for warm in ["gpt2", "resnet", "ddp-rank0", "ddp-rank1"] {
            assert!(
                !flagged_at.contains_key(warm),
                "{warm} flagged at {:?} ms",
                flagged_at[warm]
            );
        }
        let leak = flagged_at.get("leak").expect("the leak is flagged");
        eprintln!(
            "allocated floor too: {use_allocated}; leak flagged {} ms after onset",
            leak[0].saturating_sub(onset)
        );
        assert!(
            leak[0] > onset,
            "flagged before the leak began: {} ms",
            leak[0]
        );
        assert!(
            leak[0] - onset <= 60_000,
            "flagged {} s after onset",
            (leak[0] - onset) / 1000
        );
    }
}

/// The same test on the allocated floor alone would flag a ResNet-50 loop that does not
/// leak: its floors, read once a second at random points of its step, wander (the reason
/// an attached job needs both floors to rise).
#[test]
fn the_allocated_floor_alone_would_flag_a_real_resnet_loop() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/allocated_series.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let samples: Vec<(u64, u64)> = fixture["series"]["resnet"]
        .as_array()
        .expect("resnet")
        .iter()
        .map(|s| (s[0].as_u64().unwrap(), s[1].as_u64().unwrap()))
        .collect();
    let config = TrendConfig::default();
    let oldest = |end: usize| {
        let t = samples[end].0.saturating_sub(config.span_ms);
        samples.iter().position(|s| s.0 >= t).unwrap_or(0)
    };
    let flagged = (0..samples.len()).any(|end| {
        ProcessTrend::compute(1, &samples[oldest(end)..=end], &config).is_some_and(|t| t.growing)
    });
    assert!(
        flagged,
        "the allocated floor alone no longer flags it: the AND may be moot"
    );
}
