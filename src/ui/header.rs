//! The header line: host, driver, device count and where the figures come from.
//!
//! ```text
//!  vramtop  host gpu-box  driver 580.159.04  CUDA 13.0  1 device  NVML
//! ```

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use crate::app::App;
use crate::units::NA;

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let mut spans = vec![Span::styled(
        " vramtop ",
        Style::new().bold().black().on_cyan(),
    )];
    match &app.snapshot {
        None => spans.push(Span::raw("  waiting for the first poll…")),
        Some(s) => {
            let n = s.devices.len();
            let simulated = s.devices.iter().any(|d| d.simulated);
            // The source goes first so a narrow terminal never cuts the "simulated" label.
            spans.extend([
                Span::raw(" "),
                Span::styled(
                    format!(" {} ", s.source),
                    if simulated {
                        Style::new().bold().black().on_yellow()
                    } else {
                        Style::new().bold().green()
                    },
                ),
                Span::raw(format!("  {n} device{}", if n == 1 { "" } else { "s" })),
                Span::raw(format!("  host {}", s.hostname)),
                Span::raw(format!(
                    "  driver {}",
                    s.driver_version.as_deref().unwrap_or(NA)
                )),
                Span::raw(format!(
                    "  CUDA {}",
                    s.cuda_version.as_deref().unwrap_or(NA)
                )),
            ]);
            if let Some(w) = s.warnings.first() {
                spans.push(Span::styled(format!("  ⚠ {w}"), Style::new().yellow()));
            }
        }
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}
