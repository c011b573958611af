//! `vramtop bench ...`: vramtop's own costs, measured the same way every time.

use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use crate::app::App;
use vramtop_telemetry::sim::{SimSource, WorkloadGauge};
use vramtop_telemetry::TelemetrySource;

#[derive(Debug, serde::Serialize)]
pub struct RenderFigures {
    pub live_blocks: usize,
    pub width: u16,
    pub height: u16,
    pub frames: usize,
    pub median_us: f64,
    pub p90_us: f64,
    pub max_us: f64,
}

/// Draw the full screen `frames` times into an off-screen buffer of the given size and
/// report the median and tail draw times. The state is a seeded simulated device with
/// history, as the live app has after some minutes.
pub fn render(
    width: u16,
    height: u16,
    frames: usize,
    blocks: usize,
) -> color_eyre::Result<RenderFigures> {
    let workload = WorkloadGauge::default();
    workload.set(6 << 30);
    let mut source = SimSource::new(1, workload);
    let mut app = App::new(1.0);
    for _ in 0..crate::app::HISTORY_SAMPLES {
        app.apply_snapshot(source.poll());
    }
    if blocks > 0 {
        // A probe view as the live app has it: a layout of `blocks` live blocks with
        // holes, over many segments, and the fragmentation history full.
        let layout = crate::ui::fixtures::synthetic_layout(blocks, 1);
        let stats = crate::ui::fixtures::stats_from_layout(&layout);
        let report = crate::probe::ProbeReport {
            scenario: "bench".to_string(),
            policy: "caching".to_string(),
            backing: "synthetic".to_string(),
            phase: Some("synthetic layout for the render benchmark".to_string()),
            ..Default::default()
        };
        app.apply_probe(crate::probe::live::ProbeView {
            policies: vec![crate::probe::live::PolicyView {
                layout,
                stats,
                report,
                frag_history: (0..300).map(|i| (i * 7 % 1000) as u64).collect(),
                ..Default::default()
            }],
            paused: false,
            ops_per_s: 200.0,
            done: false,
            recording: None,
            tour: None,
        });
    }
    let mut terminal = Terminal::new(TestBackend::new(width, height))?;
    let mut times: Vec<Duration> = Vec::with_capacity(frames);
    for _ in 0..frames.max(1) {
        let start = Instant::now();
        terminal.draw(|f| crate::ui::draw(f, &app))?;
        times.push(start.elapsed());
    }
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    Ok(RenderFigures {
        live_blocks: blocks,
        width,
        height,
        frames: times.len(),
        median_us: at(0.5),
        p90_us: at(0.9),
        max_us: at(1.0),
    })
}

/// What `vramtop bench replay` measured: one load of the file, then one replay through
/// all the policies asked (in parallel, as `replay --report` does), with this process's
/// peak RSS (VmHWM) after each.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReplayFigures {
    pub file: String,
    pub events: u64,
    pub load_s: f64,
    pub rss_after_load_bytes: Option<u64>,
    pub replay_s: f64,
    pub policies: Vec<vramtop_alloc::PolicyKind>,
    /// Events per second of the replay, over all policies together: events x policies /
    /// replay time.
    pub events_per_s: f64,
    pub peak_rss_bytes: Option<u64>,
}

impl ReplayFigures {
    pub fn table(&self) -> String {
        use vramtop_trace::replay::report::thousands;
        let mib = |b: Option<u64>| b.map_or("N/A".to_string(), |b| format!("{} MiB", b >> 20));
        format!(
            "{}: {} events\nload {:.2} s (peak RSS {})\nreplay through {} policies {:.2} s \
             ({} events/s over all)\ntotal {:.2} s, peak RSS {}\n",
            self.file,
            thousands(self.events),
            self.load_s,
            mib(self.rss_after_load_bytes),
            self.policies.len(),
            self.replay_s,
            thousands(self.events_per_s as u64),
            self.load_s + self.replay_s,
            mib(self.peak_rss_bytes)
        )
    }
}

/// Loads `path` and replays it through `policies`; the error is one line.
pub fn replay(
    path: &std::path::Path,
    policies: &[vramtop_alloc::PolicyKind],
) -> Result<ReplayFigures, String> {
    use vramtop_trace::replay;
    let start = std::time::Instant::now();
    let trace = vramtop_trace::load(path).map_err(|e| e.to_string())?;
    let load_s = start.elapsed().as_secs_f64();
    let rss_after_load_bytes = peak_rss_bytes();
    let opts = replay::plan_capacity(&trace, None, &vramtop_trace::ooms::trace_ooms(&trace));
    let start = std::time::Instant::now();
    replay::report(&trace, policies, opts).map_err(|e| format!("{}: {e}", path.display()))?;
    let replay_s = start.elapsed().as_secs_f64();
    let events = trace.events.len() as u64;
    Ok(ReplayFigures {
        file: path.display().to_string(),
        events,
        load_s,
        rss_after_load_bytes,
        replay_s,
        policies: policies.to_vec(),
        events_per_s: (events * policies.len() as u64) as f64 / replay_s.max(1e-9),
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// This process's peak resident set (VmHWM in /proc/self/status), on Linux.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
