//! The help overlay (`?`): every key binding, from the same table the keys use.
//!
//! ```text
//!        ┌ keys ─────────────────────┐
//!        │ q        quit             │
//!        │ ?        show / hide help │
//!        └───────────────────────────┘
//! ```

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::Frame;

use crate::app::action::BINDINGS;

/// Width of one column of bindings.
const WIDTH: u16 = 44;

pub fn draw(frame: &mut Frame, area: Rect) {
    let lines: Vec<Line> = BINDINGS
        .iter()
        .filter(|b| !b.keys.is_empty())
        .map(|b| {
            Line::from(vec![
                Span::styled(format!(" {:<10}", b.keys), Style::new().bold().cyan()),
                Span::raw(b.help),
            ])
        })
        .collect();
    // One column when it fits the height, else two side by side (80x24 holds them all).
    let columns: usize = if lines.len() as u16 + 2 <= area.height {
        1
    } else {
        2
    };
    let per_column = lines.len().div_ceil(columns);
    let width = (WIDTH * columns as u16).min(area.width);
    let height = (per_column as u16 + 2).min(area.height);
    let [row] = Layout::vertical([Constraint::Length(height)])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::horizontal([Constraint::Length(width)])
        .flex(Flex::Center)
        .areas(row);
    frame.render_widget(Clear, popup);
    let block = Block::new()
        .borders(Borders::ALL)
        .title(" keys · Esc or ? closes ");
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    let cols = Layout::horizontal(vec![Constraint::Ratio(1, columns as u32); columns]).split(inner);
    for (chunk, col) in lines.chunks(per_column.max(1)).zip(cols.iter()) {
        frame.render_widget(Paragraph::new(chunk.to_vec()), *col);
    }
}
