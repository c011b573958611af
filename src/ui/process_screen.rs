//! One process over time (`Enter` on a process): the GPU memory the driver says it holds,
//! on the device history chart's scale (the device's total), and for a hooked job
//! PyTorch's allocated and reserved on the same scale and time axis, with the polls at
//! which it ran out of memory (✖) or was first flagged for a leak (L) marked under them.
//!
//! ```text
//! ┌ process 4101 · rank 0 · python3 train.py · gpu 0 · Enter/Esc returns ────────────┐
//! │ GPU memory (driver) █  now 3.4 GiB · peak 3.6 GiB · of 79.6 GiB                  │
//! │                          ▂▄▆████████████                                         │
//! │ -10m                    -5m                                               now    │
//! │ PyTorch allocated █ reserved ▓  now 2.0 GiB / 3.1 GiB                            │
//! │                          ▂▄▆███████▓▓▓▓▓                                         │
//! │ -10m                    -5m                                               now    │
//! │                                    ✖         L                                   │
//! │ ✖ out of memory at -2m · L leak suspects flagged at -40s                         │
//! └──────────────────────────────────────────────────────────────────────────────────┘
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use super::history_chart::{ago, HistoryChart, Sample};
use crate::app::process_history::{Mark, ProcessHistory};
use crate::app::App;
use vramtop_alloc::human_bytes;

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let Some(pid) = app.process_screen else {
        return;
    };
    let history = app.process_history.get(pid);
    let block = Block::new()
        .borders(Borders::ALL)
        .title(title(app, pid, history));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(history) = history else {
        frame.render_widget(
            Paragraph::new(" no samples of this process yet: it shows from the next poll")
                .dark_gray(),
            inner,
        );
        return;
    };
    let total = history
        .device
        .and_then(|d| {
            app.snapshot
                .as_ref()?
                .devices
                .iter()
                .find(|dev| dev.index == d)?
                .memory_total_bytes
        })
        .unwrap_or(0);
    let memory: Vec<Sample> = history
        .memory
        .last(inner.width as usize)
        .into_iter()
        .map(|m| (m, None))
        .collect();
    let torch = history.torch.last(inner.width as usize);
    // The device chart's scale; without a total (the device is gone), the largest sample.
    let peak = |samples: &[Sample]| {
        samples
            .iter()
            .map(|(a, b)| a.unwrap_or(0).saturating_add(b.unwrap_or(0)))
            .max()
            .unwrap_or(0)
    };
    let scale = if total > 0 {
        total
    } else {
        peak(&memory).max(peak(&torch))
    };
    let marks = history.marks.last(inner.width as usize);
    let has_marks = marks.iter().any(|m| *m != Mark::None);
    let chart_rows = |n: u16| {
        let spare = inner.height.saturating_sub(2 * u16::from(has_marks));
        (spare / n).max(3)
    };
    let n = if history.hooked { 2 } else { 1 };
    let [memory_area, torch_area, marks_row, legend_row] = Layout::vertical([
        Constraint::Length(chart_rows(n)),
        Constraint::Length(if history.hooked { chart_rows(n) } else { 0 }),
        Constraint::Length(u16::from(has_marks)),
        Constraint::Length(u16::from(has_marks)),
    ])
    .areas(inner);
    let now = |s: &[Sample]| s.last().and_then(|(a, _)| *a);
    let memory_caption = Line::from(vec![
        Span::styled(" GPU memory (driver) █ ", Style::new().bold()),
        Span::raw(format!(
            " now {} · peak {} · of {}",
            now(&memory).map_or_else(|| "N/A".into(), human_bytes),
            if memory.iter().any(|(m, _)| m.is_some()) {
                human_bytes(peak(&memory))
            } else {
                "N/A".into()
            },
            if total > 0 {
                human_bytes(total)
            } else {
                "N/A".into()
            }
        )),
    ]);
    frame.render_widget(
        HistoryChart::new(&memory, scale)
            .colors(Color::Green, Color::Green)
            .caption(memory_caption)
            .interval(app.interval_s),
        memory_area,
    );
    if history.hooked {
        let last = torch.last().copied().unwrap_or((None, None));
        let reserved = last.0.map(|a| a + last.1.unwrap_or(0));
        let caption = Line::from(vec![
            Span::styled(" PyTorch allocated █ reserved ▓ ", Style::new().bold()),
            Span::raw(format!(
                " now {} / {}",
                last.0.map_or_else(|| "N/A".into(), human_bytes),
                reserved.map_or_else(|| "N/A".into(), human_bytes)
            )),
        ]);
        frame.render_widget(
            HistoryChart::new(&torch, scale)
                .colors(Color::Cyan, Color::Magenta)
                .caption(caption)
                .interval(app.interval_s),
            torch_area,
        );
    }
    if has_marks {
        draw_marks(frame, marks_row, legend_row, &marks, app.interval_s);
    }
}

fn title(app: &App, pid: u32, history: Option<&ProcessHistory>) -> Line<'static> {
    let row = app.rows.iter().find(|r| r.process.pid == pid);
    let mut text = format!(" process {pid} ");
    if let Some(rank) = row.and_then(|r| r.rank) {
        text.push_str(&format!("· rank {rank} "));
    }
    if let Some(command) = row.map(|r| r.command_text()).filter(|c| !c.is_empty()) {
        text.push_str(&format!("· {command} "));
    }
    if let Some(device) = history.and_then(|h| h.device) {
        text.push_str(&format!("· gpu {device} "));
    }
    if row.is_none() {
        text.push_str("· no longer listed ");
    }
    Line::from(vec![
        Span::styled(text, Style::new().bold()),
        Span::styled("· Enter/Esc returns ", Style::new().dark_gray()),
    ])
}

/// The marks under the charts, in the charts' columns (newest at the right), and a line
/// saying when each kind last happened.
fn draw_marks(frame: &mut Frame, row: Rect, legend: Rect, marks: &[Mark], interval_s: f64) {
    // A short terminal squeezes the row away: nothing to write into.
    if row.height == 0 || marks.len() > usize::from(row.width) {
        return;
    }
    let buf = frame.buffer_mut();
    let first_x = row.right() - marks.len() as u16;
    for (i, mark) in marks.iter().enumerate() {
        let (symbol, style) = match mark {
            Mark::None => continue,
            Mark::Oom => ("✖", Style::new().bold().red()),
            Mark::Leak => ("L", Style::new().bold().yellow()),
        };
        buf.set_string(first_x + i as u16, row.y, symbol, style);
    }
    let last_ago = |kind: Mark| {
        marks
            .iter()
            .rposition(|m| *m == kind)
            .map(|i| ago((marks.len() - 1 - i) as f64 * interval_s))
    };
    let mut spans = Vec::new();
    if let Some(when) = last_ago(Mark::Oom) {
        spans.push(Span::styled(
            format!(" ✖ out of memory at {when} "),
            Style::new().red(),
        ));
    }
    if let Some(when) = last_ago(Mark::Leak) {
        spans.push(Span::styled(
            format!(" L leak suspects flagged at {when} "),
            Style::new().yellow(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), legend);
}
