//! `vramtop bench ...`: vramtop's own costs, measured the same way every time.

use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use crate::app::App;
use crate::telemetry::sim::{SimSource, WorkloadGauge};
use crate::telemetry::TelemetrySource;

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
