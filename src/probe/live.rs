//! Running probes in the background of the live app: a tokio task steps one or more
//! probes (several for `--compare`, in lockstep, same plan) at a controlled rate and
//! publishes what the screen needs (layout, stats, report) as an owned snapshot.
//! Only the latest snapshot is kept: the UI never works through a backlog.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::record::Recorder;
use super::runner::{Probe, ProbeReport};
use super::tour::{Tour, TourStep};
use vramtop_alloc::leaks::{
    usage_samples, Baseline, BlockRecord, DetectorConfig, LeakDetector, SiteDiff, SiteTrend,
    Suspect,
};
use vramtop_alloc::{Layout, LiveBlock, Stats};
use vramtop_telemetry::sim::WorkloadGauge;

/// How often the runner wakes to do work and publish.
const TICK: Duration = Duration::from_millis(50);
/// Fragmentation samples kept for the sparkline.
const FRAG_HISTORY: usize = 300;
pub const DEFAULT_OPS_PER_S: f64 = 200.0;
pub const MIN_OPS_PER_S: f64 = 1.0;
pub const MAX_OPS_PER_S: f64 = 200_000.0;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Control {
    pub paused: bool,
    pub ops_per_s: f64,
    /// Single steps asked for while paused; the runner does one per increment.
    pub steps_requested: u64,
    /// Bumped by each press of the mark key: set a baseline, or clear the one set.
    pub mark_presses: u64,
}

/// One policy's view of the run.
#[derive(Clone, Debug, Default)]
pub struct PolicyView {
    pub layout: Layout,
    pub stats: Stats,
    pub report: ProbeReport,
    /// External fragmentation in per-mille, oldest first.
    pub frag_history: Vec<u64>,
    /// Allocation sites whose live bytes kept growing, with the evidence.
    pub suspects: Vec<Suspect>,
    pub sites: Vec<SiteTrend>,
    /// What was allocated since the mark and is still alive, by site; None when unmarked.
    pub since_mark: Option<Vec<SiteDiff>>,
    /// The oldest live blocks.
    pub oldest: Vec<LiveBlock>,
}

/// Blocks listed as the oldest alive.
const OLDEST_SHOWN: usize = 8;

/// Leak bookkeeping for one probe: a detector fed at every window boundary, and the
/// baseline of the mark-and-compare view.
struct LeakWatch {
    detector: LeakDetector,
    /// The probe's window key last seen, and how many windows have begun: the detector
    /// counts windows 1, 2, 3... so "first seen" reads as a window number.
    window: Option<u64>,
    windows: u64,
    baseline: Option<Baseline>,
}

impl LeakWatch {
    fn new() -> Self {
        LeakWatch {
            detector: LeakDetector::new(DetectorConfig::default()),
            window: None,
            windows: 0,
            baseline: None,
        }
    }

    /// Sample live bytes per site when the probe enters a new window (a training step).
    fn after_step(&mut self, probe: &Probe) {
        let window = probe.window();
        if self.window == Some(window) {
            return;
        }
        self.window = Some(window);
        self.windows += 1;
        let usage = probe.allocator().live_bytes_by_tag();
        self.detector.observe(self.windows, &usage_samples(&usage));
        self.detector.close_window();
    }

    fn toggle_mark(&mut self, probe: &Probe) {
        self.baseline = match self.baseline {
            Some(_) => None,
            None => Some(Baseline::mark(&records(probe))),
        };
    }
}

fn records(probe: &Probe) -> Vec<BlockRecord> {
    probe
        .allocator()
        .live_blocks_by_age(usize::MAX)
        .iter()
        .map(BlockRecord::from)
        .collect()
}

#[derive(Clone, Debug, Default)]
pub struct ProbeView {
    pub policies: Vec<PolicyView>,
    /// "recording to FILE: N events", or why recording stopped; None when not recording.
    pub recording: Option<String>,
    pub paused: bool,
    pub ops_per_s: f64,
    pub done: bool,
    /// Where the simulated device's tour is, when the probe is the tour's.
    pub tour: Option<TourStep>,
}

pub struct LiveProbe {
    control: watch::Sender<Control>,
    /// Shared, not copied: a view holds whole layouts, and the UI takes one per update.
    pub views: watch::Receiver<Arc<ProbeView>>,
    cancel: CancellationToken,
}

impl LiveProbe {
    /// Start stepping `probes` on the current tokio runtime. `gauge` receives the bytes
    /// the first probe's backing holds, so a simulated device can show them as used.
    pub fn spawn(
        probes: Vec<Probe>,
        gauge: Option<WorkloadGauge>,
        ops_per_s: f64,
        recorder: Option<(Recorder, String)>,
    ) -> LiveProbe {
        Self::spawn_task(probes, None, gauge, ops_per_s, recorder)
    }

    /// Start the simulated device's tour: its stories one after another, each held on
    /// screen for the tour's hold once it is done.
    pub fn spawn_tour(tour: Tour, gauge: Option<WorkloadGauge>, ops_per_s: f64) -> LiveProbe {
        let first = tour.probe();
        Self::spawn_task(vec![first], Some(tour), gauge, ops_per_s, None)
    }

    fn spawn_task(
        probes: Vec<Probe>,
        tour: Option<Tour>,
        gauge: Option<WorkloadGauge>,
        ops_per_s: f64,
        recorder: Option<(Recorder, String)>,
    ) -> LiveProbe {
        let initial = Control {
            paused: false,
            ops_per_s: ops_per_s.clamp(MIN_OPS_PER_S, MAX_OPS_PER_S),
            steps_requested: 0,
            mark_presses: 0,
        };
        let (control_tx, control_rx) = watch::channel(initial);
        let (view_tx, view_rx) = watch::channel(Arc::new(ProbeView::default()));
        let cancel = CancellationToken::new();
        let task = Task {
            probes,
            tour,
            gauge,
            recorder,
        };
        tokio::spawn(run(task, control_rx, view_tx, cancel.clone()));
        LiveProbe {
            control: control_tx,
            views: view_rx,
            cancel,
        }
    }

    pub fn toggle_pause(&self) {
        self.control.send_modify(|c| c.paused = !c.paused);
    }

    pub fn step(&self) {
        self.control.send_modify(|c| {
            c.paused = true;
            c.steps_requested += 1;
        });
    }

    pub fn toggle_mark(&self) {
        self.control.send_modify(|c| c.mark_presses += 1);
    }

    pub fn faster(&self) {
        self.control
            .send_modify(|c| c.ops_per_s = (c.ops_per_s * 2.0).min(MAX_OPS_PER_S));
    }

    pub fn slower(&self) {
        self.control
            .send_modify(|c| c.ops_per_s = (c.ops_per_s / 2.0).max(MIN_OPS_PER_S));
    }
}

impl Drop for LiveProbe {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// What the runner task steps: the probes, and the tour that replaces them when they are
/// done, if they are the tour's.
struct Task {
    probes: Vec<Probe>,
    tour: Option<Tour>,
    gauge: Option<WorkloadGauge>,
    recorder: Option<(Recorder, String)>,
}

async fn run(
    task: Task,
    mut control: watch::Receiver<Control>,
    views: watch::Sender<Arc<ProbeView>>,
    cancel: CancellationToken,
) {
    let Task {
        mut probes,
        mut tour,
        gauge,
        mut recorder,
    } = task;
    let mut histories: Vec<Vec<u64>> = vec![Vec::new(); probes.len()];
    let mut watches: Vec<LeakWatch> = probes.iter().map(|_| LeakWatch::new()).collect();
    // When the tour's story finished: it is held on screen for the tour's hold from then.
    let mut done_at: Option<tokio::time::Instant> = None;
    let mut tour_shown: Option<TourStep> = None;
    let mut marks_seen = control.borrow().mark_presses;
    let mut credit = 0.0f64;
    let mut steps_done = control.borrow().steps_requested;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut publish = true;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {},
            changed = control.changed() => {
                if changed.is_err() {
                    return;
                }
                publish = true;
            },
        }
        let c = *control.borrow();
        if let Some(t) = tour.as_mut() {
            // A paused tour stays on its story; resumed, the story gets its whole hold.
            if c.paused {
                done_at = None;
            } else if probes.iter().all(Probe::is_done) {
                let since = *done_at.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= t.hold() {
                    probes = vec![t.advance()];
                    histories = vec![Vec::new()];
                    watches = vec![LeakWatch::new()];
                    done_at = None;
                }
            }
            // The countdown in the title moves once a second: publish only then.
            let step = t.step(done_at.map(|d| t.hold().saturating_sub(d.elapsed())));
            if tour_shown != Some(step) {
                tour_shown = Some(step);
                publish = true;
            }
        }
        if c.mark_presses != marks_seen {
            marks_seen = c.mark_presses;
            for (w, p) in watches.iter_mut().zip(&probes) {
                w.toggle_mark(p);
            }
        }
        let mut budget = 0u64;
        if c.paused {
            credit = 0.0;
            budget = c.steps_requested.saturating_sub(steps_done);
            steps_done = c.steps_requested;
        } else {
            steps_done = c.steps_requested;
            credit += c.ops_per_s * TICK.as_secs_f64();
            if credit >= 1.0 {
                budget = credit as u64;
                credit -= budget as f64;
            }
        }
        let mut progressed = false;
        for _ in 0..budget {
            let mut any = false;
            for (p, w) in probes.iter_mut().zip(watches.iter_mut()) {
                any |= p.step();
                w.after_step(p);
            }
            progressed |= any;
            if !any {
                break;
            }
        }
        let mut recording = None;
        if let Some((r, path)) = recorder.as_mut() {
            match r.drain() {
                Ok(()) if r.missed == 0 => {
                    recording = Some(format!("recording to {path}: {} events", r.written))
                }
                Ok(()) => {
                    recording = Some(format!(
                        "recording to {path}: {} events, {} MISSED",
                        r.written, r.missed
                    ))
                }
                Err(e) => {
                    recording = Some(format!("recording to {path} stopped: {e}"));
                    recorder = None;
                }
            }
        }
        if progressed || publish {
            let mut view = snapshot(&probes, &mut histories, &watches, c);
            view.recording = recording;
            view.tour = tour_shown;
            if let (Some(g), Some(first)) = (&gauge, view.policies.first()) {
                g.set(first.stats.reserved_bytes);
            }
            views.send_replace(Arc::new(view));
            publish = false;
        }
    }
}

fn snapshot(
    probes: &[Probe],
    histories: &mut [Vec<u64>],
    watches: &[LeakWatch],
    control: Control,
) -> ProbeView {
    let policies = probes
        .iter()
        .zip(histories.iter_mut())
        .zip(watches)
        .map(|((p, history), watch)| {
            let report = p.report();
            let stats = report.stats.clone();
            history.push((stats.external_fragmentation * 1000.0).round() as u64);
            if history.len() > FRAG_HISTORY {
                history.drain(..history.len() - FRAG_HISTORY);
            }
            PolicyView {
                layout: p.allocator().layout(),
                stats,
                report,
                frag_history: history.clone(),
                suspects: watch.detector.suspects(),
                sites: watch.detector.sites(),
                since_mark: watch.baseline.as_ref().map(|b| b.diff(&records(p))),
                oldest: p.allocator().live_blocks_by_age(OLDEST_SHOWN),
            }
        })
        .collect();
    ProbeView {
        policies,
        paused: control.paused,
        ops_per_s: control.ops_per_s,
        done: probes.iter().all(Probe::is_done),
        recording: None,
        tour: None,
    }
}
