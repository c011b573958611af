//! Prompts of the process actions: the confirmation before a signal is sent (naming the
//! pid and command), and the filter being typed, drawn in the footer row.
//!
//! ```text
//!      ┌ send SIGTERM? ─────────────────────────────────────────┐
//!      │ Send SIGTERM to pid 41235 (python train.py --rank 0)?  │
//!      │ It may clean up first, or ignore it.                   │
//!      │ y / Enter  send       n / Esc  cancel                  │
//!      └────────────────────────────────────────────────────────┘
//!  / python▏   Enter keeps the filter · Esc clears it
//! ```

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};
use ratatui::Frame;

use crate::app::process_actions::confirmation_question;
use crate::app::signal::{KillRequest, Signal};

/// Widest the dialog gets; narrower terminals get their whole width.
const DIALOG_WIDTH: u16 = 72;
const DIALOG_ROWS: u16 = 6;

pub fn draw_confirmation(frame: &mut Frame, area: Rect, request: &KillRequest) {
    let width = DIALOG_WIDTH.min(area.width);
    let [row] = Layout::vertical([Constraint::Length(DIALOG_ROWS.min(area.height))])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::horizontal([Constraint::Length(width)])
        .flex(Flex::Center)
        .areas(row);
    frame.render_widget(Clear, popup);
    let block = Block::new()
        .borders(Borders::ALL)
        .border_style(Style::new().red().bold())
        .title(format!(" send {}? ", request.signal.name()));
    let consequence = match request.signal {
        Signal::Term => "It may clean up first, or ignore it.",
        Signal::Kill => "It ends at once and cannot clean up: unsaved work is lost.",
    };
    let key = |k: &'static str| Span::styled(k, Style::new().bold().cyan());
    let lines = vec![
        Line::from(confirmation_question(request)).bold(),
        Line::from(consequence).dark_gray(),
        Line::from(vec![
            key(" y / Enter"),
            Span::raw("  send      "),
            key("n / Esc"),
            Span::raw("  cancel"),
        ]),
    ];
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: true }).block(block),
        popup,
    );
}

/// The footer while the filter is typed: the text, a cursor, and what the keys do.
pub fn filter_line(text: &str) -> Line<'static> {
    Line::from(vec![
        Span::styled(" / ", Style::new().bold().black().on_cyan()),
        Span::styled(format!(" {text}▏"), Style::new().bold()),
        Span::styled(
            "   Enter keeps the filter · Esc clears it",
            Style::new().dark_gray(),
        ),
    ])
}
