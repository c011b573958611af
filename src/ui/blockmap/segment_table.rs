//! The block list of one segment, shown on `Enter` in the block map: one row per run
//! (blocks, free runs, unmapped ranges) in address order. Draws from a borrowed
//! `SegmentLayout` and tag names; selection and scroll live in the app's `TableState`.
//!
//! ```text
//! ┌ optional Block ─────────────────────────────────────────────────────┐
//! │  address           size       requested  state     tag       age    │ <- header
//! │▶ 0x7f0000000000    2.0 MiB    1.9 MiB    alloc     fwd:attn  12.3s  │ <- selected
//! │  0x7f0000200000    512.0 KiB  -          free      -         -      │
//! │  ...                                                                │
//! └─────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! Only the rows in view are built each frame, so a segment of 100k blocks costs what a
//! screenful costs.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, HighlightSpacing, Row, StatefulWidget, Table, TableState, Widget};

use crate::ui::theme;
use vramtop_alloc::{human_bytes, BlockState, LayoutRun, SegmentLayout};

pub const HEADER: [&str; 6] = ["address", "size", "requested", "state", "tag", "age"];
/// Column widths; the tag takes what is left because site labels are long.
pub const COLUMNS: [Constraint; 6] = [
    Constraint::Length(16),
    Constraint::Length(10),
    Constraint::Length(10),
    Constraint::Length(8),
    Constraint::Fill(1),
    Constraint::Length(7),
];
pub const HEADER_ROWS: u16 = 1;
pub const HIGHLIGHT_SYMBOL: &str = "▶ ";

#[derive(Clone, Debug)]
pub struct SegmentTable<'a> {
    segment: &'a SegmentLayout,
    tags: &'a [String],
    now_ns: u64,
    block: Option<Block<'a>>,
}

impl<'a> SegmentTable<'a> {
    /// `tags` is `Layout::tags`; `now_ns` is on the allocator's clock (as `born_ns`), so
    /// ages are `now_ns - born_ns`.
    pub fn new(segment: &'a SegmentLayout, tags: &'a [String], now_ns: u64) -> Self {
        SegmentTable {
            segment,
            tags,
            now_ns,
            block: None,
        }
    }

    pub fn block(mut self, block: Block<'a>) -> Self {
        self.block = Some(block);
        self
    }

    fn row(&self, run: &LayoutRun) -> Row<'static> {
        let live = matches!(run.state, BlockState::Allocated | BlockState::PendingFree);
        let dash = || "-".to_string();
        let requested = if live {
            human_bytes(run.requested)
        } else {
            dash()
        };
        let tag = run
            .tag
            .map(|t| self.tags.get(t.0 as usize).map_or("?", String::as_str))
            .unwrap_or("-");
        let age = run
            .born_ns
            .map(|born| theme::human_age(self.now_ns.saturating_sub(born)))
            .unwrap_or_else(dash);
        let (state, style) = match run.state {
            BlockState::Allocated => ("alloc", Style::new().fg(theme::tag_color(run.tag))),
            BlockState::PendingFree => ("pending", Style::new().fg(theme::tag_color(run.tag))),
            BlockState::Free => ("free", theme::free_style()),
            BlockState::Unmapped => ("unmapped", theme::unmapped_style()),
        };
        Row::new([
            format!("{:#x}", run.addr),
            human_bytes(run.size),
            requested,
            state.to_string(),
            tag.to_string(),
            age,
        ])
        .style(style)
    }
}

/// The first row to show so that `selected` is in a window of `height` rows, moving the
/// previous offset as little as possible (as ratatui's own Table does).
fn window_offset(offset: usize, selected: Option<usize>, height: usize, len: usize) -> usize {
    let mut offset = offset.min(len.saturating_sub(height));
    if let Some(sel) = selected {
        if sel < offset {
            offset = sel;
        } else if sel >= offset + height {
            offset = sel + 1 - height;
        }
    }
    offset
}

impl StatefulWidget for SegmentTable<'_> {
    type State = TableState;

    fn render(self, area: Rect, buf: &mut Buffer, state: &mut TableState) {
        let area = area.intersection(buf.area);
        if area.is_empty() {
            return;
        }
        if let Some(block) = &self.block {
            block.render(area, buf);
        }
        let inner = self.block.as_ref().map_or(area, |b| b.inner(area));
        let runs = &self.segment.runs;
        let height = usize::from(inner.height.saturating_sub(HEADER_ROWS)).max(1);
        let selected = state
            .selected()
            .map(|s| s.min(runs.len().saturating_sub(1)));
        let selected = selected.filter(|_| !runs.is_empty());
        let offset = window_offset(state.offset(), selected, height, runs.len());
        let end = (offset + height).min(runs.len());
        let rows: Vec<Row> = runs[offset..end].iter().map(|r| self.row(r)).collect();
        let header = Row::new(HEADER).style(Style::new().add_modifier(Modifier::BOLD));
        let table = Table::new(rows, COLUMNS)
            .header(header)
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .highlight_symbol(HIGHLIGHT_SYMBOL)
            // Always reserve the symbol's columns so they don't jump when a row is picked.
            .highlight_spacing(HighlightSpacing::Always);
        let mut window = TableState::new().with_selected(selected.map(|s| s - offset));
        StatefulWidget::render(table, inner, buf, &mut window);
        state.select(selected);
        *state.offset_mut() = offset;
    }
}
