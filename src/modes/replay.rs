//! `vramtop replay FILE`: the report (`--report`, `--json`, `--leaks`, or when stdout is
//! not a terminal) and the player in the terminal.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use color_eyre::eyre::Result;
use crossterm::event::KeyEvent;
use ratatui::Frame;

use super::in_terminal;
use super::screen::{self, Screen};
use crate::app::replayer::{capacity_line, ReplayerState};
use crate::app::viewer::{self, ViewerAction};
use crate::app::Exit;
use serde::Serialize;
use vramtop_alloc::remedy::Missing;
use vramtop_alloc::PolicyKind;
use vramtop_trace::replay::{self, remedies, TraceFigures};

impl Screen for ReplayerState<'_> {
    type Action = ViewerAction;

    fn action_for(&self, key: KeyEvent) -> Option<ViewerAction> {
        viewer::viewer_action(key, true)
    }

    fn draw(&self, frame: &mut Frame) {
        crate::ui::replayer::draw(frame, self);
    }

    fn handle(&mut self, action: ViewerAction) {
        ReplayerState::handle(self, action);
    }

    fn exit(&self) -> Option<Exit> {
        self.exit
    }

    fn tick_period(&self) -> Option<Duration> {
        self.playing
            .then(|| Duration::from_secs_f64(1.0 / viewer::FPS))
    }

    fn tick(&mut self, elapsed: Duration) -> bool {
        ReplayerState::tick(self, elapsed)
    }
}

/// The version of `replay --json`'s shape (its `schema`; docs/json.md): 1 was a bare
/// array of policy reports, 2 the object with `capacity`, `policies` and `trace_ooms`.
const REPLAY_SCHEMA: u32 = 2;

/// `vramtop replay --report --json`: the capacity the verdicts assumed, a row per policy,
/// and the trace's own OOMs, each with every remedy's verdict.
#[derive(Serialize)]
struct ReplayJson<'a> {
    /// REPLAY_SCHEMA.
    schema: u32,
    capacity: Option<remedies::CapacityBounds>,
    policies: &'a [replay::ReplayReport],
    trace_ooms: Vec<TraceOomJson<'a>>,
}

#[derive(Serialize)]
struct TraceOomJson<'a> {
    #[serde(flatten)]
    oom: &'a vramtop_trace::ooms::TraceOom,
    line: String,
    remedies: Vec<vramtop_alloc::remedy::RemedyVerdict>,
    #[serde(skip_serializing_if = "Option::is_none")]
    what_would_fit: Option<vramtop_alloc::remedy::WhatWouldFit>,
    /// Why it happened (the first cause's line), and every cause: only for the OOM a
    /// file kept by the hook was kept at (the others have no device figures).
    cause: Option<String>,
    causes: Vec<vramtop_trace::cause::CauseReport>,
}

/// What `vramtop replay` was asked for.
#[derive(Clone, Debug)]
pub struct ReplayArgs {
    pub policies: Vec<PolicyKind>,
    pub capacity: Option<u64>,
    pub report: bool,
    pub json: bool,
    /// Print the leak suspects found over the whole trace instead of a replay.
    pub leaks: bool,
}

/// Suspects as people read them: one line each, with the evidence.
fn leak_table(name: &str, suspects: &[vramtop_alloc::leaks::Suspect]) -> String {
    use vramtop_alloc::human_bytes;
    if suspects.is_empty() {
        return format!("{name}: no leak suspects: no allocation site kept growing\n");
    }
    let mut out = format!("{name}: {} leak suspect(s)\n", suspects.len());
    for s in suspects {
        out.push_str(&format!(
            "  {}  live {} in {} blocks, +{} per window over {} windows, growing since window {}\n",
            s.tag,
            human_bytes(s.live_bytes),
            s.live_blocks,
            human_bytes(s.growth_bytes_per_window),
            s.windows_growing,
            s.first_seen
        ));
        for r in &s.retained_with {
            out.push_str(&format!("    holds {}\n", r.tag));
        }
    }
    out
}

/// `vramtop replay FILE ...`: the exit code, after printing any one-line error.
pub fn run(path: &Path, args: &ReplayArgs) -> Result<u8> {
    let trace = match viewer::load_trace(path) {
        Ok(t) => t,
        Err(line) => {
            eprintln!("vramtop: {line}");
            return Ok(2);
        }
    };
    for notice in trace.notices() {
        eprintln!("vramtop: {notice}");
    }
    let name = viewer::display_name(path);
    if args.leaks {
        let suspects = vramtop_trace::leaks::suspects_in_trace(
            &trace,
            &vramtop_trace::leaks::TraceLeakConfig::default(),
        );
        if args.json {
            println!("{}", serde_json::to_string_pretty(&suspects)?);
        } else {
            print!("{}", leak_table(&name, &suspects));
        }
        return Ok(0);
    }
    let policies = if args.policies.is_empty() {
        vec![PolicyKind::Caching]
    } else {
        args.policies.clone()
    };
    if args.report || args.json || !std::io::stdout().is_terminal() {
        let ooms = vramtop_trace::ooms::trace_ooms(&trace);
        let opts = replay::plan_capacity(&trace, args.capacity, &ooms);
        if let Some(line) = capacity_line(opts, ooms.len()).filter(|_| !args.json) {
            eprintln!("vramtop: {line}");
        }
        let rows = match replay::report(&trace, &policies, opts) {
            Ok(rows) => rows,
            Err(e) => {
                eprintln!("vramtop: {}: {e}", path.display());
                return Ok(1);
            }
        };
        let remedies = match remedies::remedies(&trace, &ooms, args.capacity) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("vramtop: {}: remedies: {e}", path.display());
                Vec::new()
            }
        };
        let bounds = remedies::capacity_bounds(&trace, &ooms, args.capacity);
        if args.json {
            let json = ReplayJson {
                schema: REPLAY_SCHEMA,
                capacity: bounds,
                policies: &rows,
                trace_ooms: ooms
                    .iter()
                    .map(|oom| {
                        let at = remedies.iter().find(|r| r.event == oom.event);
                        let causes = if ooms.last().map(|o| o.event) == Some(oom.event) {
                            vramtop_trace::cause::of_kept_file(&trace, oom, at)
                        } else {
                            Vec::new()
                        };
                        TraceOomJson {
                            cause: causes.first().map(|c| c.line()),
                            causes: vramtop_trace::cause::CauseReport::of_all(&causes),
                            oom,
                            line: oom.explain(),
                            remedies: at.map(|r| r.remedies.clone()).unwrap_or_default(),
                            what_would_fit: at.and_then(|r| r.what_would_fit.clone()),
                        }
                    })
                    .collect(),
            };
            println!("{}", serde_json::to_string_pretty(&json)?);
        } else {
            if let Some(b) = bounds.filter(|b| b.low != b.high) {
                eprintln!("vramtop: remedies: {}", b.line());
            }
            print!("{}", replay::table(&name, &TraceFigures::of(&trace), &rows));
            print!("{}", replay::report::oom_table(&ooms, &rows, &remedies));
            let lacking_cap = remedies
                .iter()
                .flat_map(|r| &r.remedies)
                .filter(|v| v.missing == Some(Missing::MemoryCap))
                .count();
            if lacking_cap > 0 {
                eprintln!(
                    "vramtop: remedies: {lacking_cap} verdict(s) turn on the job's memory cap, \
                     which this file does not carry: give it with --capacity BYTES"
                );
            }
            match replay::what_if(&trace, &rows, opts) {
                Ok(w) => print!("\n{}", replay::what_if_text(&w)),
                Err(e) => eprintln!("vramtop: {}: what-if replay: {e}", path.display()),
            }
        }
        return Ok(0);
    }
    let mut state = match ReplayerState::new(&name, &trace, policies[0], args.capacity) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vramtop: {}: {e}", path.display());
            return Ok(1);
        }
    };
    let exit = in_terminal(|terminal| screen::run_blocking(terminal, &mut state))?;
    Ok(exit.code())
}
