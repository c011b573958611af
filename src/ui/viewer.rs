//! The trace viewers' screen: `vramtop snapshot` here, and the map region and footer
//! that `ui::replayer` shares. Draws from a borrowed `SnapshotViewer` (or `MapView` +
//! `MapNav`) only.
//!
//! ```text
//! ┌ snapshot resnet50.pickle.gz · PyTorch memory snapshot · device 0 ─────────────┐
//! │ 121 segments · 595 blocks · reserved 3.8 GiB · allocated 2.1 GiB · frag 0.31   │ CAPTION
//! │ history: 68,861 events (vramtop replay plays them)                             │ NOTE
//! │ 0x7f..  20M ██████▌·····═════██████  ...             │reserved ████▌  3.8 GiB │
//! │ 0x7f..   2M ██▍·········                             │ext frag ███▋    31.2%  │ MAP | PANEL
//! │ 1 cell = 2 MiB  zoom 0  rows 1-38/120  █ used ...    │...                     │
//! └────────────────────────────────────────────────────────────────────────────────┘
//!  q quit  +/- zoom  ↑↓ segment  Enter blocks                                    FOOTER
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

use super::blockmap::{BlockMap, SegmentTable};
use super::fragmentation::FragmentationPanel;
use crate::app::viewer::{MapNav, MapView, SnapshotViewer, VIEWER_BINDINGS};
use vramtop_alloc::human_bytes;
use vramtop_trace::replay::report::thousands;

/// Width of the fragmentation panel beside the map.
pub const PANEL_WIDTH: u16 = 42;
/// Below this width the panel takes a share of the width instead.
pub const SIDE_BY_SIDE_MIN_WIDTH: u16 = 100;
pub const CAPTION_ROWS: u16 = 1;
pub const NOTE_ROWS: u16 = 1;
pub const FOOTER_ROWS: u16 = 1;
/// Below this the screen says it is too small instead of drawing.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 8;

pub fn draw_snapshot(frame: &mut Frame, viewer: &SnapshotViewer) {
    let area = frame.area();
    if too_small(frame, area) {
        return;
    }
    let [main, footer] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(FOOTER_ROWS)]).areas(area);
    let title = format!(
        " snapshot {} · {} · device {} ",
        viewer.name, viewer.source, viewer.device
    );
    let block = Block::new()
        .borders(Borders::ALL)
        .title(Span::styled(title, Style::new().bold()));
    let inner = block.inner(main);
    frame.render_widget(block, main);
    let [caption, note, body] = Layout::vertical([
        Constraint::Length(CAPTION_ROWS),
        Constraint::Length(NOTE_ROWS),
        Constraint::Min(0),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(caption_line(&viewer.view)), caption);
    let note_line = if viewer.no_history {
        Line::from(Span::styled(
            " no allocation history in this snapshot: segments and blocks only",
            Style::new().yellow(),
        ))
    } else {
        Line::from(Span::styled(
            format!(
                " history: {} events (vramtop replay plays them)",
                thousands(viewer.events as u64)
            ),
            Style::new().dark_gray(),
        ))
    };
    frame.render_widget(Paragraph::new(note_line), note);
    draw_map_region(frame, body, &viewer.view, &viewer.nav);
    draw_footer(
        frame,
        footer,
        false,
        viewer.notices.first().map(String::as_str),
    );
}

/// Says the terminal is too small; `true` when it did.
pub fn too_small(frame: &mut Frame, area: Rect) -> bool {
    if area.width >= MIN_WIDTH && area.height >= MIN_HEIGHT {
        return false;
    }
    let text = format!(
        "vramtop: terminal {}x{} is too small; enlarge to at least {MIN_WIDTH}x{MIN_HEIGHT} (q quits)",
        area.width, area.height
    );
    frame.render_widget(
        Paragraph::new(text).wrap(Wrap { trim: true }).yellow(),
        area,
    );
    true
}

/// Segments, blocks and the headline figures of a view, on one line.
pub fn caption_line(view: &MapView) -> Line<'static> {
    let s = &view.stats;
    Line::from(vec![
        Span::raw(format!(
            " {} segments · {} blocks · reserved {} · allocated {} · largest free {} · ",
            thousands(view.layout.segments.len() as u64),
            thousands(s.live_blocks),
            human_bytes(s.reserved_bytes),
            human_bytes(s.allocated_bytes),
            human_bytes(s.largest_free_bytes),
        )),
        Span::styled(
            format!("frag {:.2}", s.external_fragmentation),
            Style::new().bold(),
        ),
    ])
}

/// The block map (or the selected segment's block list) beside the fragmentation panel.
pub fn draw_map_region(frame: &mut Frame, area: Rect, view: &MapView, nav: &MapNav) {
    let (map_area, panel_area) = if area.width >= SIDE_BY_SIDE_MIN_WIDTH {
        let [m, p] =
            Layout::horizontal([Constraint::Min(0), Constraint::Length(PANEL_WIDTH)]).areas(area);
        (m, p)
    } else {
        let [m, p] = Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)])
            .areas(area);
        (m, p)
    };
    draw_map_or_list(frame, map_area, view, nav);
    frame.render_widget(
        FragmentationPanel::new(&view.stats, &view.frag_history)
            .block(Block::new().borders(Borders::LEFT)),
        panel_area,
    );
}

fn draw_map_or_list(frame: &mut Frame, area: Rect, view: &MapView, nav: &MapNav) {
    let selected = nav.selected_segment;
    let listed = selected
        .filter(|_| nav.show_segment_list)
        .and_then(|i| view.layout.segments.get(i).map(|s| (i, s)));
    if let Some((i, segment)) = listed {
        let title = format!(
            " segment {i} · {} at {:#x} · Enter closes ",
            human_bytes(segment.size),
            segment.addr
        );
        let mut state = nav.segment_table;
        frame.render_stateful_widget(
            SegmentTable::new(segment, &view.layout.tags, 0)
                .block(Block::new().borders(Borders::ALL).title(title)),
            area,
            &mut state,
        );
        return;
    }
    let mut map = BlockMap::new(&view.layout)
        .zoom(nav.zoom)
        .selected(selected);
    if let Some(seg) = selected {
        let scroll = map.geometry(area).scroll_to_segment(seg);
        map = map.scroll_rows(scroll);
    }
    frame.render_widget(&map, area);
}

/// Key hints from the key table, then a notice if there is one.
pub fn draw_footer(frame: &mut Frame, area: Rect, replay: bool, notice: Option<&str>) {
    let mut spans = Vec::new();
    for binding in VIEWER_BINDINGS
        .iter()
        .filter(|b| !b.keys.is_empty() && (replay || !b.replay_only))
    {
        spans.push(Span::styled(
            format!(" {}", binding.keys),
            Style::new().bold().cyan(),
        ));
        spans.push(Span::raw(format!(" {} ", binding.help)));
    }
    if let Some(notice) = notice {
        spans.push(Span::styled(format!(" {notice}"), Style::new().dark_gray()));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::viewer::ViewerAction;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use vramtop_alloc::{BlockState, Pool};
    use vramtop_trace::{SnapshotBlock, SnapshotSegment, Trace, TraceFormat, TraceStats};

    fn snapshot_trace() -> Trace {
        let block = |addr: u64, size: u64, state| SnapshotBlock {
            addr,
            size,
            requested_size: size,
            state,
            tag: Some("model.py:12 forward".into()),
        };
        Trace {
            source: TraceFormat::PytorchSnapshot,
            device: 0,
            initial: Vec::new(),
            initial_segments: Vec::new(),
            events: Vec::new(),
            segments_at_end: vec![SnapshotSegment {
                addr: 0x7f00_0000_0000,
                total_size: 20 << 20,
                stream: 0,
                pool: Pool::Large,
                is_expandable: false,
                blocks: vec![
                    block(0x7f00_0000_0000, 4 << 20, BlockState::Allocated),
                    block(0x7f00_0040_0000, 16 << 20, BlockState::Free),
                ],
            }],
            settings: Default::default(),
            stats: TraceStats {
                no_history: true,
                ..TraceStats::default()
            },
        }
    }

    fn screen_text(viewer: &SnapshotViewer, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
        terminal.draw(|f| draw_snapshot(f, viewer)).expect("draw");
        let buf = terminal.backend().buffer();
        crate::ui::buffer_text(buf)
    }

    #[test]
    fn a_snapshot_without_history_says_so() {
        let mut viewer = SnapshotViewer::new("s.pickle", &snapshot_trace());
        let text = screen_text(&viewer, 120, 30);
        assert!(text.contains("snapshot s.pickle"), "{text}");
        assert!(text.contains("no allocation history"), "{text}");
        assert!(text.contains("1 segments · 1 blocks"), "{text}");
        assert!(text.contains("q quit"), "{text}");
        assert!(
            !text.contains("showing its"),
            "the note is said twice: {text}"
        );
        assert!(
            !text.contains("space"),
            "replay keys in the snapshot footer: {text}"
        );
        viewer.handle(ViewerAction::Down);
        viewer.handle(ViewerAction::ToggleSegmentList);
        let text = screen_text(&viewer, 120, 30);
        assert!(text.contains("segment 0"), "{text}");
        assert!(text.contains("model.py:12"), "{text}");
        // Too small still draws something legible.
        let text = screen_text(&viewer, 30, 5);
        assert!(text.contains("is too"), "{text}");
    }
}
