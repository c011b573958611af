//! The allocator region: vramtop's own allocator under a probe workload, drawn as a
//! block map beside its fragmentation figures; with `--compare`, one column per policy
//! at the same scale, so one can be seen failing where another succeeds.
//!
//! ```text
//! ┌ probe checkerboard · caching · host · ▶ 200 ops/s ───────────────────────────────┐
//! │ phase 2/3  Free every other block: half the memory is free again, in 4 MiB holes │
//! │ OOM: needed 24.0 MiB contiguous; 256.0 MiB free in 64 runs, largest 4.0 MiB      │
//! │ 0x7f..  20M ██·██·██·██·██·██·██·█  ...        │ reserved ████████   512 MiB     │
//! │ 0x7f..  20M ██·██·██·██·██·██·██·█  ...        │ external frag  ███░░  0.50      │
//! │ 1 cell = 2 MiB  █ used  · free  ═ largest free │ free runs  ▁▃█                  │
//! └──────────────────────────────────────────────────────────────────────────────────┘
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

use super::blockmap::{needs_overview, BlockMap, BlockOverview, SegmentTable};
use super::fragmentation::FragmentationPanel;
use crate::app::{App, View};
use crate::probe::live::{PolicyView, ProbeView};
use vramtop_alloc::human_bytes;

/// Width of the fragmentation panel beside a single block map.
const PANEL_WIDTH: u16 = 42;
/// Below this width the panel goes under the map instead of beside it.
const SIDE_BY_SIDE_MIN_WIDTH: u16 = 100;
/// Rows of each compare column given to its fragmentation panel, when there is room.
const COMPARE_PANEL_ROWS: u16 = 12;

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    if area.height < 3 {
        return;
    }
    let Some(view) = &app.probe else {
        let block = Block::new().borders(Borders::ALL).title(" allocator ");
        frame.render_widget(
            Paragraph::new(
                " no probe is running. Start one to see vramtop's allocator as a block map: \
                 vramtop --probe checkerboard (or churn, training, leak, streams, steady).",
            )
            .wrap(Wrap { trim: true })
            .dark_gray()
            .block(block),
            area,
        );
        return;
    };
    let Some(first) = view.policies.first() else {
        return;
    };
    let block = Block::new().borders(Borders::ALL).title(title(view, first));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [caption, body] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(inner);
    frame.render_widget(Paragraph::new(caption_line(first)), caption);
    if view.policies.len() == 1 {
        draw_single(frame, body, app, first);
    } else {
        draw_compare(frame, body, app, view);
    }
}

/// The allocator region when nothing feeds it: one line saying how to feed it.
pub fn draw_hint(frame: &mut Frame, area: Rect) {
    const LONG: &str = "no probe running: vramtop --probe checkerboard draws vramtop's \
                        allocator as a block map (also churn, training, leak, streams, steady)";
    const SHORT: &str = "idle: vramtop --probe checkerboard shows a block map";
    let label = " allocator  ";
    let room = (area.width as usize).saturating_sub(label.len());
    let text = if LONG.chars().count() <= room {
        LONG
    } else {
        SHORT
    };
    let line = Line::from(vec![
        Span::styled(label, Style::new().bold()),
        Span::styled(text, Style::new().dark_gray()),
    ]);
    frame.render_widget(Paragraph::new(line), area);
}

fn title(view: &ProbeView, first: &PolicyView) -> Line<'static> {
    let state = if view.done {
        Span::styled(" done ", Style::new().bold().black().on_green())
    } else if view.paused {
        Span::styled(" ❚❚ paused ", Style::new().bold().black().on_yellow())
    } else {
        Span::styled(
            format!(" ▶ {:.0} ops/s ", view.ops_per_s),
            Style::new().bold().green(),
        )
    };
    let policies: Vec<&str> = view
        .policies
        .iter()
        .map(|p| p.report.policy.as_str())
        .collect();
    // The tour plays only on the simulated device, on bookkeeping memory: say so.
    let tour = view
        .tour
        .map(|t| {
            let next = t
                .next_in_s
                .map_or_else(String::new, |s| format!(" · next in {s} s"));
            Span::styled(
                format!(" tour {}/{}{next} (--no-tour) ", t.number, t.count),
                Style::new().black().on_cyan(),
            )
        })
        .unwrap_or_default();
    let recording = view
        .recording
        .as_ref()
        .map(|r| Span::styled(format!(" ● {r} "), Style::new().red()))
        .unwrap_or_default();
    Line::from(vec![
        Span::styled(
            format!(
                " probe {} · {} · {} backing ",
                first.report.scenario,
                policies.join(" vs "),
                first.report.backing
            ),
            Style::new().bold(),
        ),
        state,
        tour,
        recording,
    ])
}

fn caption_line(p: &PolicyView) -> Line<'static> {
    let mut spans = Vec::new();
    if let Some((step, of)) = p.report.step {
        spans.push(Span::styled(
            format!(" step {step}/{of} "),
            Style::new().bold().cyan(),
        ));
    }
    spans.push(Span::raw(format!(
        " {}",
        p.report.phase.clone().unwrap_or_default()
    )));
    if p.report.verify_mismatches > 0 {
        spans.push(Span::styled(
            format!("  VERIFY MISMATCHES: {} words", p.report.verify_mismatches),
            Style::new().bold().white().on_red(),
        ));
    }
    Line::from(spans)
}

fn oom_line(p: &PolicyView) -> Line<'static> {
    match &p.report.last_oom {
        Some(oom) => Line::from(Span::styled(
            format!(" OOM: {oom}"),
            Style::new().bold().red(),
        )),
        None => Line::from(Span::styled(
            format!(
                " no OOM · reserved {} · largest free {}",
                human_bytes(p.stats.reserved_bytes),
                human_bytes(p.stats.largest_free_bytes)
            ),
            Style::new().dark_gray(),
        )),
    }
}

fn draw_single(frame: &mut Frame, area: Rect, app: &App, p: &PolicyView) {
    let [oom, rest] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    frame.render_widget(Paragraph::new(oom_line(p)), oom);
    if app.views.contains(View::SegmentList) {
        // The block list needs the width for addresses, tags and ages.
        draw_map_or_list(frame, rest, app, p, None);
        return;
    }
    let (map_area, panel_area) = if rest.width >= SIDE_BY_SIDE_MIN_WIDTH {
        let [m, s] =
            Layout::horizontal([Constraint::Min(0), Constraint::Length(PANEL_WIDTH)]).areas(rest);
        (m, s)
    } else {
        let [m, s] = Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)])
            .areas(rest);
        (m, s)
    };
    draw_map_or_list(frame, map_area, app, p, None);
    frame.render_widget(
        FragmentationPanel::new(&p.stats, &p.frag_history)
            .block(Block::new().borders(Borders::LEFT)),
        panel_area,
    );
}

fn draw_compare(frame: &mut Frame, area: Rect, app: &App, view: &ProbeView) {
    let n = view.policies.len() as u32;
    let [scale_row, area] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let columns = Layout::horizontal((0..n).map(|_| Constraint::Ratio(1, n)))
        .spacing(2)
        .split(area);
    let with_panel = area.height >= COMPARE_PANEL_ROWS + 8;
    let split = |col: Rect| {
        let panel_rows = if with_panel { COMPARE_PANEL_ROWS } else { 0 };
        let [head, oom, map, panel] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(0),
            Constraint::Length(panel_rows),
        ])
        .areas(col);
        (head, oom, map, panel)
    };
    // One scale for all columns: the coarsest any of them needs to fit, unless that
    // would hide a column's holes; then fine enough for its largest hole to span two
    // cells (the maps scroll).
    let fit = view
        .policies
        .iter()
        .zip(columns.iter())
        .map(|(p, col)| BlockMap::new(&p.layout).fitted_bytes_per_cell(split(*col).2))
        .max()
        .unwrap_or(1);
    let holes = view.policies.iter().map(|p| p.stats.largest_free_bytes);
    let (scale, why) = compare_scale(fit, holes);
    frame.render_widget(
        Paragraph::new(format!(
            " same scale in every column: 1 cell = {} ({why})",
            human_bytes(scale)
        ))
        .dark_gray(),
        scale_row,
    );
    for (p, col) in view.policies.iter().zip(columns.iter()) {
        let (head, oom, map, panel) = split(*col);
        let head_style = if p.report.last_oom.is_some() {
            Style::new().bold().white().on_red()
        } else {
            Style::new().bold().black().on_green()
        };
        let verdict = if p.report.last_oom.is_some() {
            "OOM"
        } else {
            "ok"
        };
        frame.render_widget(
            Paragraph::new(Line::from(vec![
                Span::styled(format!(" {} · {verdict} ", p.report.policy), head_style),
                Span::raw(format!(
                    " reserved {}  frag {:.2}",
                    human_bytes(p.stats.reserved_bytes),
                    p.stats.external_fragmentation
                )),
            ])),
            head,
        );
        frame.render_widget(Paragraph::new(oom_line(p)), oom);
        draw_map_or_list(frame, map, app, p, Some(scale));
        if with_panel {
            frame.render_widget(
                FragmentationPanel::new(&p.stats, &p.frag_history)
                    .block(Block::new().borders(Borders::TOP)),
                panel,
            );
        }
    }
}

/// The shared scale of the compare columns, and why it was chosen: `fit` (every column
/// fits) unless a column's largest hole would then span fewer than two cells, in which
/// case the largest power of two at which it spans two.
pub(super) fn compare_scale(fit: u64, largest_holes: impl Iterator<Item = u64>) -> (u64, String) {
    let smallest_hole = largest_holes.filter(|&b| b > 0).min();
    match smallest_hole {
        Some(hole) if fit.saturating_mul(2) > hole => {
            let half = (hole / 2).max(1);
            let scale = 1u64 << (63 - half.leading_zeros());
            (
                scale,
                format!(
                    "largest hole of every column, at least {}, spans 2 cells or more; maps scroll",
                    human_bytes(hole)
                ),
            )
        }
        Some(hole) => (
            fit,
            format!(
                "all columns fit; the smallest largest hole, {}, spans {} cells",
                human_bytes(hole),
                hole / fit.max(1)
            ),
        ),
        None => (fit, "all columns fit; no free hole".to_string()),
    }
}

/// The block map, or the selected segment's block list when it is open (first map only).
fn draw_map_or_list(frame: &mut Frame, area: Rect, app: &App, p: &PolicyView, scale: Option<u64>) {
    let is_first = app
        .probe
        .as_ref()
        .and_then(|v| v.policies.first())
        .is_some_and(|f| std::ptr::eq(f, p));
    let selected = if is_first { app.selected_segment } else { None };
    if let (true, Some(seg)) = (app.views.contains(View::SegmentList) && is_first, selected) {
        if let Some(segment) = p.layout.segments.get(seg) {
            let now_ns = (p.report.elapsed_s * 1e9) as u64;
            let mut state = app.segment_table;
            let title = format!(
                " segment {seg} · {} at {:#x} · Enter closes ",
                human_bytes(segment.size),
                segment.addr
            );
            frame.render_stateful_widget(
                SegmentTable::new(segment, &p.layout.tags, now_ns)
                    .block(Block::new().borders(Borders::ALL).title(title)),
                area,
                &mut state,
            );
            return;
        }
    }
    // More segments than rows: packed, partly used cells keep the holes visible; zooming
    // in or selecting a segment goes back to one band per segment.
    if selected.is_none() && needs_overview(&p.layout, area.height, app.map_zoom) {
        frame.render_widget(BlockOverview::new(&p.layout), area);
        return;
    }
    let mut map = BlockMap::new(&p.layout)
        .zoom(app.map_zoom)
        .selected(selected);
    if let Some(bytes) = scale {
        map = map.scale(bytes);
    }
    if let Some(seg) = selected {
        let scroll = map.geometry(area).scroll_to_segment(seg);
        map = map.scroll_rows(scroll);
    }
    frame.render_widget(&map, area);
}

#[cfg(test)]
mod tests {
    use super::compare_scale;

    const MIB: u64 = 1 << 20;

    #[test]
    fn compare_keeps_the_fitted_scale_while_holes_span_two_cells() {
        let (scale, why) = compare_scale(MIB, [4 * MIB, 8 * MIB].into_iter());
        assert_eq!(scale, MIB);
        assert!(why.contains("spans 4 cells"), "{why}");
    }

    #[test]
    fn compare_refines_the_scale_when_a_hole_would_hide() {
        // At GPU scale the fit was 16 MiB a cell with 4 MiB holes: every row `██`.
        let (scale, why) = compare_scale(16 * MIB, [4 * MIB, 6 * MIB, 0].into_iter());
        assert_eq!(scale, 2 * MIB);
        assert!(why.contains("maps scroll"), "{why}");
        assert_eq!(compare_scale(MIB, [0].into_iter()).0, MIB);
    }
}
