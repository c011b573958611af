//! The process table: every GPU process on every device, sortable and scrollable.
//!
//! ```text
//! ┌ processes · by memory · 3 ─────────────────────────────────────────────┐
//! │ GPU   PID     USER   TYPE  GPU MEM    SM%  CPU%   RSS       COMMAND    │
//! │ 0     41235   alice  C     12.0 GiB   87%  101%   3.1 GiB   python … │
//! └────────────────────────────────────────────────────────────────────────┘
//! ```

use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::format::{bytes, pct, NA};
use crate::app::{App, ProcessRow, SortKey};
use crate::telemetry::HostView;

const HEADER: [&str; 9] = [
    "GPU", "PID", "USER", "TYPE", "GPU MEM", "SM%", "CPU%", "RSS", "COMMAND",
];
const WIDTHS: [Constraint; 9] = [
    Constraint::Length(4),
    Constraint::Length(8),
    Constraint::Length(10),
    Constraint::Length(4),
    Constraint::Length(10),
    Constraint::Length(5),
    Constraint::Length(6),
    Constraint::Length(10),
    Constraint::Min(10),
];

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let sort = match app.sort {
        SortKey::Memory => "by memory",
        SortKey::Pid => "by pid",
    };
    let block = Block::new()
        .borders(Borders::ALL)
        .title(format!(" processes · {sort} · {} ", app.rows.len()));
    if app.rows.is_empty() {
        let simulated = app
            .snapshot
            .as_ref()
            .is_some_and(|s| s.devices.iter().any(|d| d.simulated));
        let text = if simulated {
            " no processes: the simulated device shows only vramtop's own probe workloads"
        } else {
            " no GPU processes"
        };
        frame.render_widget(Paragraph::new(text).dark_gray().block(block), area);
        return;
    }
    let header = Row::new(HEADER).style(Style::new().bold().underlined());
    let rows = app.rows.iter().map(row);
    let table = Table::new(rows, WIDTHS)
        .header(header)
        .block(block)
        .row_highlight_style(Style::new().reversed());
    // TableState lives in the app; drawing works on a copy so `draw` stays read-only.
    let mut state = app.table;
    frame.render_stateful_widget(table, area, &mut state);
}

fn row(r: &ProcessRow) -> Row<'static> {
    let p = &r.process;
    let (user, command) = match p.host_view {
        HostView::Visible => (
            p.user.clone().unwrap_or_else(|| NA.to_string()),
            p.command.clone().unwrap_or_else(|| NA.to_string()),
        ),
        HostView::OtherNamespace => ("?".to_string(), "(not in our PID namespace)".to_string()),
        HostView::Exited => ("-".to_string(), "(exited)".to_string()),
    };
    Row::new(vec![
        Cell::from(r.device.to_string()),
        Cell::from(p.pid.to_string()),
        Cell::from(user),
        Cell::from(p.kind.label()),
        Cell::from(Line::from(bytes(p.used_memory_bytes)).bold()),
        Cell::from(pct(p.sm_util_pct)),
        Cell::from(
            p.cpu_pct
                .map_or_else(|| NA.to_string(), |c| format!("{c:.0}%")),
        ),
        Cell::from(bytes(p.rss_bytes)),
        Cell::from(if r.hooked {
            Line::from(vec![
                Span::styled(
                    format!("{} ", super::attached::HOOKED),
                    Style::new().bold().cyan(),
                ),
                Span::raw(command),
            ])
        } else {
            Line::from(command)
        }),
    ])
}
