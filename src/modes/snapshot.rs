//! `vramtop snapshot FILE`: a PyTorch snapshot's final segments in the block map, or
//! its summary with `--once` (or when stdout is not a terminal).

use std::io::IsTerminal;
use std::path::Path;

use color_eyre::eyre::Result;
use crossterm::event::KeyEvent;
use ratatui::Frame;

use super::in_terminal;
use super::screen::{self, Screen};
use crate::app::viewer::{display_name, load_trace, viewer_action, SnapshotViewer, ViewerAction};
use crate::app::Exit;
use crate::export::oom_report;
use vramtop_trace::{snapshot, TraceFormat};

impl Screen for SnapshotViewer {
    type Action = ViewerAction;

    fn action_for(&self, key: KeyEvent) -> Option<ViewerAction> {
        viewer_action(key, false)
    }

    fn draw(&self, frame: &mut Frame) {
        crate::ui::viewer::draw_snapshot(frame, self);
    }

    fn handle(&mut self, action: ViewerAction) {
        SnapshotViewer::handle(self, action);
    }

    fn exit(&self) -> Option<Exit> {
        self.exit
    }
}

/// `vramtop snapshot FILE [--once]`: the exit code, after printing any one-line error.
pub fn run(path: &Path, once: bool) -> Result<u8> {
    let trace = match load_trace(path) {
        Ok(t) => t,
        Err(line) => {
            eprintln!("vramtop: {line}");
            return Ok(2);
        }
    };
    if trace.source != TraceFormat::PytorchSnapshot {
        eprintln!(
            "vramtop: {}: a {} has no segments to show; play its events with vramtop replay",
            path.display(),
            trace.source
        );
        return Ok(2);
    }
    for notice in trace.notices() {
        eprintln!("vramtop: {notice}");
    }
    let name = display_name(path);
    let mut viewer = SnapshotViewer::new(&name, &trace);
    // A snapshot kept at an OOM (by the hook, or by PyTorch with history on) says so.
    if once || !std::io::stdout().is_terminal() {
        print!("{}", snapshot::summary(&name, &trace, &viewer.view.layout));
        let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
        let explanation = oom_report::explain(&trace, path, bytes);
        if !explanation.is_empty() {
            println!();
            for line in &explanation {
                println!("{line}");
            }
        }
        return Ok(0);
    }
    // The screen has one line for it, the OOM's figures (no replay needed for that).
    if let Some(oom) = vramtop_trace::ooms::trace_ooms(&trace).last() {
        let asked = trace.stats.kept_oom.as_ref().map(|k| k.requested_bytes);
        viewer
            .notices
            .insert(0, format!("OOM: {}", oom.explain_as_asked(asked)));
    }
    drop(trace);
    let exit = in_terminal(|terminal| screen::run_blocking(terminal, &mut viewer))?;
    Ok(exit.code())
}
