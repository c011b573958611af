//! The player of `vramtop replay`: where the replay is, the event just applied, and the
//! chosen policy's block map and fragmentation panel (shared with `ui::viewer`). Draws
//! from a borrowed `ReplayerState` only.
//!
//! ```text
//! ┌ replay resnet50.pickle.gz · caching · ▶ 1,148 events/s ──────────────────────┐
//! │ event 12,345 / 68,861  ██████████▌·····························  17.9 %       │ PROGRESS
//! │ alloc 2.0 MiB · stream 0 · resnet.py:68 forward                               │ EVENT
//! │ 20 segments · 310 blocks · reserved 1.2 GiB · ... · frag 0.31                 │ CAPTION
//! │ block map                                           │ fragmentation panel    │ MAP | PANEL
//! └───────────────────────────────────────────────────────────────────────────────┘
//!  q quit  space play/pause  . step  [ ] speed  ←→ seek 1 %  ...                   FOOTER
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

use super::viewer::{caption_line, draw_footer, draw_map_region, too_small, FOOTER_ROWS};
use crate::app::replayer::ReplayerState;
use vramtop_alloc::human_bytes;
use vramtop_trace::replay::report::thousands;
use vramtop_trace::{TraceEvent, TraceEventKind};

pub const PROGRESS_ROWS: u16 = 1;
pub const EVENT_ROWS: u16 = 1;
pub const CAPTION_ROWS: u16 = 1;
/// Columns of the progress bar at most; the counters take the rest.
const MAX_BAR_WIDTH: u16 = 60;

pub fn draw(frame: &mut Frame, state: &ReplayerState<'_>) {
    let area = frame.area();
    if too_small(frame, area) {
        return;
    }
    let [main, footer] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(FOOTER_ROWS)]).areas(area);
    let block = Block::new().borders(Borders::ALL).title(title(state));
    let inner = block.inner(main);
    frame.render_widget(block, main);
    let [progress, event, caption, body] = Layout::vertical([
        Constraint::Length(PROGRESS_ROWS),
        Constraint::Length(EVENT_ROWS),
        Constraint::Length(CAPTION_ROWS),
        Constraint::Min(0),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(progress_line(state, progress)), progress);
    frame.render_widget(Paragraph::new(event_line(state)), event);
    let mut caption_spans = caption_line(&state.view).spans;
    let ooms = state.counts().ooms;
    if ooms > 0 {
        caption_spans.push(Span::styled(
            format!("  OOMs {}", thousands(ooms)),
            Style::new().bold().red(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(caption_spans)), caption);
    draw_map_region(frame, body, &state.view, &state.nav);
    draw_footer(
        frame,
        footer,
        true,
        state.notices.first().map(String::as_str),
    );
}

fn title(state: &ReplayerState<'_>) -> Line<'static> {
    let mut spans = vec![Span::styled(
        format!(" replay {} · {} ", state.name, state.policy()),
        Style::new().bold(),
    )];
    if let Some(capacity) = state.capacity {
        let how = match state.capacity_source {
            vramtop_trace::replay::CapacitySource::Inferred => " (inferred from the trace's OOM)",
            vramtop_trace::replay::CapacitySource::Kept => " (the job's cap)",
            _ => "",
        };
        spans.push(Span::raw(format!(
            "· capacity {}{how} ",
            human_bytes(capacity)
        )));
    }
    spans.push(if state.error.is_some() {
        Span::styled(" stopped ", Style::new().bold().white().on_red())
    } else if state.is_done() {
        Span::styled(" done ", Style::new().bold().black().on_green())
    } else if state.playing {
        Span::styled(
            format!(" ▶ {} events/s ", thousands(state.speed as u64)),
            Style::new().bold().green(),
        )
    } else {
        Span::styled(
            format!(" ❚❚ paused · {} events/s ", thousands(state.speed as u64)),
            Style::new().bold().black().on_yellow(),
        )
    });
    Line::from(spans)
}

fn progress_line(state: &ReplayerState<'_>, area: Rect) -> Line<'static> {
    let (position, len) = (state.position(), state.len());
    let counter = format!(
        " event {} / {}  ",
        thousands(position as u64),
        thousands(len as u64)
    );
    let fraction = if len == 0 {
        1.0
    } else {
        position as f64 / len as f64
    };
    let pct = format!("  {:.1} %", fraction * 100.0);
    let room = area
        .width
        .saturating_sub((counter.chars().count() + pct.len()) as u16)
        .min(MAX_BAR_WIDTH);
    let filled = ((f64::from(room) * fraction).round() as u16).min(room);
    Line::from(vec![
        Span::styled(counter, Style::new().bold()),
        Span::styled("█".repeat(usize::from(filled)), Style::new().cyan()),
        Span::styled(
            "·".repeat(usize::from(room - filled)),
            Style::new().dark_gray(),
        ),
        Span::raw(pct),
    ])
}

fn event_line(state: &ReplayerState<'_>) -> Line<'static> {
    if let Some(error) = &state.error {
        return Line::from(Span::styled(format!(" {error}"), Style::new().bold().red()));
    }
    let Some(event) = state.current_event() else {
        return Line::from(Span::styled(
            " before the first event: blocks live at the start are placed",
            Style::new().dark_gray(),
        ));
    };
    if let Some((oom, check)) = state.oom_here() {
        let verdict = match check {
            Some(c) if c.fails => format!("{} fails too", state.policy()),
            Some(_) => format!("{} would fit it", state.policy()),
            None => String::new(),
        };
        return Line::from(vec![
            Span::styled(" trace OOM: ", Style::new().bold().red()),
            Span::raw(format!(
                "{}; PyTorch held {} reserved, {} allocated · ",
                oom.explain(),
                human_bytes(oom.reserved_bytes),
                human_bytes(oom.allocated_bytes)
            )),
            Span::styled(verdict, Style::new().bold()),
        ]);
    }
    Line::from(vec![
        Span::styled(format!(" {}", event_summary(event)), Style::new().bold()),
        Span::raw(format!(
            " · {}",
            event.tag.as_deref().unwrap_or("no call site")
        )),
    ])
}

/// "alloc 2.0 MiB · stream 0", "free completed 2.0 MiB · stream 1", ...
pub fn event_summary(event: &TraceEvent) -> String {
    let action = match event.kind {
        TraceEventKind::Alloc => "alloc",
        TraceEventKind::FreeRequested => "free requested",
        TraceEventKind::FreeCompleted => "free completed",
        TraceEventKind::SegmentAlloc => "segment alloc (not replayed)",
        TraceEventKind::SegmentFree => "segment free (not replayed)",
        TraceEventKind::SegmentMap => "segment map (not replayed)",
        TraceEventKind::SegmentUnmap => "segment unmap (not replayed)",
        TraceEventKind::Oom => "OOM in the trace",
        TraceEventKind::Snapshot => "snapshot taken",
    };
    format!(
        "{action} {} · stream {}",
        human_bytes(event.size),
        event.stream
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::viewer::ViewerAction;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use vramtop_alloc::PolicyKind;
    use vramtop_trace::{Trace, TraceFormat, TraceStats};

    fn screen_text(state: &ReplayerState<'_>) -> String {
        let mut terminal = Terminal::new(TestBackend::new(120, 30)).expect("test backend");
        terminal.draw(|f| draw(f, state)).expect("draw");
        let buf = terminal.backend().buffer();
        crate::ui::buffer_text(buf)
    }

    #[test]
    fn progress_and_current_tag_are_shown() {
        let events = (0..12_345u64)
            .map(|i| TraceEvent {
                kind: TraceEventKind::Alloc,
                addr: 0x1000 + i * 0x1000,
                size: 4096,
                stream: 0,
                tag: Some(format!("train.py:{i} step").into()),
                time_us: None,
            })
            .collect();
        let t = Trace {
            source: TraceFormat::VramtopRecord,
            device: 0,
            initial: Vec::new(),
            initial_segments: Vec::new(),
            events,
            segments_at_end: Vec::new(),
            settings: Default::default(),
            stats: TraceStats::default(),
        };
        let mut s = ReplayerState::new("t.jsonl", &t, PolicyKind::Caching, None).unwrap();
        let text = screen_text(&s);
        assert!(text.contains("event 0 / 12,345"), "{text}");
        assert!(text.contains("paused"), "{text}");
        assert!(text.contains("space play/pause"), "{text}");
        s.seek(1234);
        let text = screen_text(&s);
        assert!(text.contains("event 1,234 / 12,345"), "{text}");
        assert!(text.contains("10.0 %"), "{text}");
        assert!(
            text.contains("alloc 4.0 KiB · stream 0 · train.py:1233 step"),
            "{text}"
        );
        s.handle(ViewerAction::End);
        assert!(screen_text(&s).contains(" done "));
    }
}
