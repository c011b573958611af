//! The allocator region for an attached PyTorch job: its real segments in the same block
//! map and fragmentation panel the snapshot viewer draws (`ui::viewer::draw_map_region`),
//! its last OOM in the one-line form probes use beside what PyTorch said, and each remedy
//! users are told to try with its verdict for this OOM. Also the pane with the last lines
//! of a `vramtop run` job's output.
//!
//! ```text
//! ┌ job 4242 · python train.py · torch 2.11.0 · ⚓ hooked · ended (exit 1) ──────┐
//! │ OOM: needed 1.0 GiB contiguous; 4.3 GiB free in 306 runs, largest 6.0 MiB  │ HEAD
//! │ PyTorch: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has ...     │
//! │ cannot tell  expandable_segments:True one state does not settle it (run …  │
//! │ fails        empty_cache() PyTorch releases every wholly free cached ...   │
//! │ what would: a request of at most 6.0 MiB fits now; freeing 2 live ...     │
//! │ 135 segments · 442 blocks · reserved 3.8 GiB · allocated 2.1 GiB · frag .. │ CAPTION
//! │ 0x7f..  20M ██████▌·····═════██████  ...         │reserved ████▌  3.8 GiB  │ MAP | PANEL
//! └────────────────────────────────────────────────────────────────────────────┘
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

use super::viewer::{caption_line, draw_map_region};
use crate::advice::line_with;
use crate::app::viewer::MapNav;
use crate::app::{App, RunView, View};
use vramtop_alloc::human_bytes;
use vramtop_alloc::remedy::Verdict;
use vramtop_attach::JobView;
use vramtop_trace::roles::RoleBreakdown;

/// Rows PyTorch's own message may take under the OOM line.
const PYTORCH_ROWS: u16 = 2;
/// Cells of the job's role bar.
const ROLE_BAR_CELLS: usize = 24;
/// Rows a cause line, the role line or the knobs line may wrap to (another process's
/// cause carries its framework's switch; the knobs line names each knob's bytes).
const WRAPPED_ROWS: u16 = 3;

/// The marker a hooked process carries in the process table.
pub const HOOKED: &str = "⚓";

pub fn draw(frame: &mut Frame, area: Rect, app: &App, job: &JobView) {
    if area.height < 3 {
        return;
    }
    let block = Block::new().borders(Borders::ALL).title(title(job));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let head = head_lines(job, inner.width);
    let [head_area, caption, body] = Layout::vertical([
        Constraint::Length(head_rows(&head)),
        Constraint::Length(1),
        Constraint::Min(0),
    ])
    .areas(inner);
    draw_head(frame, head_area, head);
    if job.blocks_untracked() {
        // Its empty map would read as "0 B reserved": the head says what there is.
        return;
    }
    let Some(map) = job.map() else {
        let why = match (&job.hello, &job.last_drop) {
            (_, Some(reason)) => format!(" not attached: {reason}"),
            (Some(h), None) if !h.cuda_ready => {
                " hooked: waiting for the job to initialise CUDA".to_string()
            }
            _ => " attaching...".to_string(),
        };
        frame.render_widget(Paragraph::new(why).dark_gray(), caption);
        return;
    };
    frame.render_widget(Paragraph::new(caption_line(map)), caption);
    let nav = MapNav {
        zoom: app.map_zoom,
        selected_segment: app.selected_segment,
        show_segment_list: app.views.contains(View::SegmentList),
        segment_table: app.segment_table,
    };
    draw_map_region(frame, body, map, &nav);
}

fn title(job: &JobView) -> Line<'static> {
    let mut spans = vec![Span::styled(
        format!(
            " job {} · {} ",
            job.pid,
            job.command().unwrap_or_else(|| "?".to_string())
        ),
        Style::new().bold(),
    )];
    if let Some(torch) = job.hello.as_ref().and_then(|h| h.torch_version.as_deref()) {
        spans.push(Span::raw(format!("· torch {torch} ")));
    }
    if job.hello.as_ref().is_some_and(|h| h.history) {
        // A fast allocator is recorded for part of each second (PROTOCOL.md): say so, as
        // sites then hold only the recorded share of their blocks.
        match job.frame.as_ref().and_then(|f| f.history_share) {
            Some(share) if share < 1.0 => spans.push(Span::raw(format!(
                "· history {:.0}% sampled ",
                share * 100.0
            ))),
            _ => spans.push(Span::raw("· history ")),
        }
    }
    // The hook sends stats alone while reading the segments would mean converting a long
    // event ring (hook 1.3): the map is then that of an earlier state.
    if job.map_is_the_oom() {
        spans.push(Span::raw("· map at the OOM "));
    } else if let Some(f) = job.frame.as_ref() {
        // 0: no state of this connection had segments yet (the map is empty, not old).
        let age = f.time_s - f.map_time_s;
        if f.map_time_s > 0.0 && age >= 2.0 {
            spans.push(Span::raw(format!("· map {age:.0} s old ")));
        }
    }
    spans.push(Span::styled(
        format!("{HOOKED} hooked "),
        Style::new().bold().cyan(),
    ));
    if job.ended {
        let ended = match job.exit_code {
            Some(code) => format!(" ended (exit {code}) "),
            None => " ended ".to_string(),
        };
        spans.push(Span::styled(ended, Style::new().bold().black().on_yellow()));
    } else if !job.connected {
        let why = job
            .last_drop
            .as_deref()
            .map_or_else(|| " not connected ".to_string(), |r| format!(" {r} "));
        spans.push(Span::styled(why, Style::new().red()));
    }
    Line::from(spans)
}

/// A job under another allocator than PyTorch's own (`backend:cudaMallocAsync`):
/// PyTorch's totals, and why there is no more. An empty map with "no OOM" under it would
/// say the job holds nothing and never ran out.
fn untracked_lines(job: &JobView, width: u16) -> Vec<(Line<'static>, u16)> {
    let (allocated, reserved) = job.torch_totals_shown();
    let totals = Line::from(Span::styled(
        format!(
            " backend:{} · allocated {allocated} · reserved {reserved} (PyTorch's totals)",
            job.allocator_backend().unwrap_or("?"),
        ),
        Style::new().bold(),
    ));
    let why = Line::from(Span::styled(
        format!(" {}", vramtop_attach::async_oom::UNTRACKED_WHY),
        Style::new().dark_gray(),
    ));
    let mut lines = vec![(totals, 1)];
    // Its OOM: PyTorch's exception is all this backend leaves (no observer, no blocks):
    // the one it died of, else the latest it went on from (a batch-size finder's, say).
    let went_on = job.untracked_oom_went_on();
    let which = match went_on {
        Some((oom, true)) => format!(" {} (the job caught it)", oom.number),
        Some((oom, false)) => format!(" {}", oom.number),
        None => String::new(),
    };
    if let Some(oom) = job.async_oom() {
        let line = Line::from(Span::styled(
            format!(
                " OOM{which}: needed {} · cause: {}",
                oom.needed(),
                oom.cause()
            ),
            Style::new().bold().red(),
        ));
        let rows = wrapped_rows(&line, width, WRAPPED_ROWS);
        lines.push((line, rows));
    } else if went_on.is_some() {
        // A pluggable allocator's words give no figures: which OOM, and PyTorch's words.
        let line = Line::from(Span::styled(
            format!(" OOM{which}"),
            Style::new().bold().red(),
        ));
        lines.push((line, 1));
    }
    // PyTorch's words of the OOM shown, and the error the job died of where that is
    // another (it caught the OOM and then died of something else).
    if let Some((oom, _)) = went_on {
        lines.push(pytorch_line(&oom.message, width));
    }
    if let Some(error) = &job.error {
        lines.push(pytorch_line(&error.message, width));
    }
    let rows = wrapped_rows(&why, width, WRAPPED_ROWS);
    lines.push((why, rows));
    lines
}

/// PyTorch's own words (its exception, or the OOM's summary) on one line, with the rows
/// it takes wrapped into `width` cells (at most PYTORCH_ROWS).
fn pytorch_line(text: &str, width: u16) -> (Line<'static>, u16) {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = Line::from(vec![
        Span::styled(" PyTorch: ", Style::new().bold()),
        Span::raw(text),
    ]);
    let rows = wrapped_rows(&line, width, PYTORCH_ROWS);
    (line, rows)
}

/// Rows the head lines take together.
pub(super) fn head_rows(head: &[(Line<'static>, u16)]) -> u16 {
    head.iter().map(|(_, rows)| rows).sum()
}

/// The head lines one under the other, each wrapped within its rows, cut at `area`.
pub(super) fn draw_head(frame: &mut Frame, area: Rect, head: Vec<(Line<'static>, u16)>) {
    let mut y = area.y;
    for (line, rows) in head {
        let rows = rows.min(area.bottom().saturating_sub(y));
        let at = Rect::new(area.x, y, area.width, rows);
        frame.render_widget(Paragraph::new(line).wrap(Wrap { trim: true }), at);
        y += rows;
    }
}

/// "memory: parameters 1.2 GiB · gradients ... · cache 1.5 GiB", each part in its colour
/// (the same as the job's role bar would use).
fn roles_line(roles: &RoleBreakdown) -> Line<'static> {
    const COLOURS: [Color; 5] = [
        Color::Blue,
        Color::Cyan,
        Color::Magenta,
        Color::Yellow,
        Color::DarkGray,
    ];
    let mut spans = vec![Span::styled(" memory ", Style::new().bold())];
    // The bar: each part's share of what the job holds, in cells (a part that has any
    // bytes gets at least one).
    let parts = roles.parts();
    let total = parts
        .iter()
        .fold(0u64, |sum, (_, b)| sum.saturating_add(*b));
    if total > 0 {
        for ((_, bytes), colour) in parts.iter().zip(COLOURS) {
            let cells =
                match (*bytes as f64 / total as f64 * ROLE_BAR_CELLS as f64).round() as usize {
                    0 if *bytes > 0 => 1,
                    n => n,
                };
            spans.push(Span::styled("█".repeat(cells), Style::new().fg(colour)));
        }
        spans.push(Span::raw(" "));
    }
    for (i, ((name, bytes), colour)) in parts.into_iter().zip(COLOURS).enumerate() {
        if i > 0 {
            spans.push(Span::raw(" · "));
        }
        spans.push(Span::styled("■ ", Style::new().fg(colour)));
        spans.push(Span::raw(format!("{name} {}", human_bytes(bytes))));
        if name == "parameters" && roles.frozen > 0 {
            spans.push(Span::raw(format!(
                " ({} frozen)",
                human_bytes(roles.frozen)
            )));
        }
    }
    Line::from(spans)
}

/// Rows `line` takes when wrapped into `width` cells as `draw_head` wraps it (ratatui's
/// own count), at least 1 and at most `max` (the rest is cut).
fn wrapped_rows(line: &Line<'static>, width: u16, max: u16) -> u16 {
    let rows = Paragraph::new(line.clone())
        .wrap(Wrap { trim: true })
        .line_count(width.max(1));
    u16::try_from(rows).unwrap_or(u16::MAX).clamp(1, max.max(1))
}

/// The lines above the map, each with the rows it takes wrapped into `width` cells.
pub(super) fn head_lines(job: &JobView, width: u16) -> Vec<(Line<'static>, u16)> {
    if job.blocks_untracked() {
        return untracked_lines(job, width);
    }
    let Some(oom) = &job.oom else {
        let roles = job.frame.as_deref().and_then(|f| f.roles);
        let line = match job.map() {
            Some(map) => Line::from(Span::styled(
                format!(
                    " no OOM · reserved {} · largest free {}",
                    human_bytes(map.stats.reserved_bytes),
                    human_bytes(map.stats.largest_free_bytes)
                ),
                Style::new().dark_gray(),
            )),
            None => Line::default(),
        };
        let mut lines = vec![(line, 1)];
        if let Some(roles) = roles {
            let line = roles_line(&roles);
            let rows = wrapped_rows(&line, width, WRAPPED_ROWS);
            lines.push((line, rows));
        }
        return lines;
    };
    let mut lines = vec![(
        Line::from(Span::styled(
            format!(" OOM: {}", oom.line()),
            Style::new().bold().red(),
        )),
        1,
    )];
    // Why, before PyTorch's figures and the remedies: the cause with most bytes first.
    for (i, cause) in oom.causes.iter().enumerate() {
        let head = if i == 0 { "cause" } else { "also" };
        let line = format!("{head}: {}", line_with(&cause.line(), cause.missing()));
        let style = if i == 0 {
            Style::new().bold().magenta()
        } else {
            Style::new().magenta()
        };
        let line = Line::from(Span::styled(format!(" {line}"), style));
        let rows = wrapped_rows(&line, width, WRAPPED_ROWS);
        lines.push((line, rows));
    }
    if let Some(roles) = &oom.roles {
        let line = roles_line(roles);
        let rows = wrapped_rows(&line, width, WRAPPED_ROWS);
        lines.push((line, rows));
    }
    if let Some(knobs) = oom.knobs_line() {
        let line = Line::from(Span::styled(
            format!(" knobs: {knobs}"),
            Style::new().cyan(),
        ));
        let rows = wrapped_rows(&line, width, WRAPPED_ROWS);
        lines.push((line, rows));
    }
    let pytorch = job
        .error
        .as_ref()
        .map(|e| e.message.clone())
        .or_else(|| oom.summary.clone());
    if let Some(text) = pytorch {
        lines.push(pytorch_line(&text, width));
    }
    // Each remedy users are told to try, with PyTorch's answer for this OOM.
    if let Some(events) = oom.history_events {
        lines.push((
            Line::from(Span::styled(
                format!(
                    " remedies from the job's whole history: {events} events replayed under each"
                ),
                Style::new().italic(),
            )),
            1,
        ));
    }
    for remedy in &oom.remedies {
        let style = match remedy.verdict {
            Verdict::Fits => Style::new().green(),
            Verdict::Fails => Style::new().red(),
            Verdict::CannotTell => Style::new().yellow(),
        };
        lines.push((
            Line::from(vec![
                Span::styled(format!(" {:<12}", remedy.verdict.to_string()), style.bold()),
                Span::styled(format!("{} ", remedy.remedy), Style::new().bold()),
                Span::styled(line_with(&remedy.reason, remedy.missing), style),
            ]),
            1,
        ));
    }
    if !oom.remedies.iter().any(|r| r.verdict == Verdict::Fits) {
        lines.push((
            Line::from(Span::styled(
                format!(" what would: {}", oom.what_would_fit.line()),
                Style::new().cyan(),
            )),
            1,
        ));
    }
    lines
}

/// The last lines of a `vramtop run` job's output, with where the whole log is.
pub fn draw_log(frame: &mut Frame, area: Rect, run: &RunView) {
    let state = match run.exit_code {
        Some(code) => format!("ended, exit {code}"),
        None => "running".to_string(),
    };
    let block = Block::new().borders(Borders::ALL).title(format!(
        " output of pid {} ({state}) · {} ",
        run.pid,
        run.log_path.display()
    ));
    let rows = block.inner(area).height as usize;
    let first = run.lines.len().saturating_sub(rows);
    let lines: Vec<Line> = run.lines[first..]
        .iter()
        .map(|l| Line::from(l.clone()))
        .collect();
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_word_wrap() {
        let line = |text: &str| Line::from(text.to_string());
        assert_eq!(wrapped_rows(&line("short"), 80, 3), 1);
        assert_eq!(wrapped_rows(&line(""), 80, 3), 1);
        // "aaaa bbbb" fills 9 cells: one row at 9, two at 8.
        assert_eq!(wrapped_rows(&line("aaaa bbbb"), 9, 3), 1);
        assert_eq!(wrapped_rows(&line("aaaa bbbb"), 8, 3), 2);
        // A word longer than the width is broken over rows of its own.
        assert_eq!(wrapped_rows(&line("ab cdefghijkl"), 4, 9), 4);
        assert_eq!(wrapped_rows(&line("abcdefgh"), 4, 9), 2);
        assert_eq!(wrapped_rows(&line("abcdefghi"), 4, 9), 3);
        // At most `max` rows; the rest is cut.
        assert_eq!(wrapped_rows(&line(&"word ".repeat(100)), 20, 3), 3);
        // Spans are one text.
        let spans = Line::from(vec![Span::raw("aaaa "), Span::raw("bbbb")]);
        assert_eq!(wrapped_rows(&spans, 8, 3), 2);
    }
}
