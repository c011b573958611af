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

const WIDTH: u16 = 48;

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
    let height = lines.len() as u16 + 2;
    let [row] = Layout::vertical([Constraint::Length(height)])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::horizontal([Constraint::Length(WIDTH)])
        .flex(Flex::Center)
        .areas(row);
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::new()
                .borders(Borders::ALL)
                .title(" keys · Esc or ? closes "),
        ),
        popup,
    );
}
