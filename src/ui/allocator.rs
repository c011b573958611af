//! The allocator region: vramtop's own allocator, drawn as a block map while a probe
//! workload runs.
//!
//! ```text
//! ┌ allocator ───────────────────────────────────────────┐
//! │ (block map and fragmentation panel)                   │
//! └───────────────────────────────────────────────────────┘
//! ```

use ratatui::layout::Rect;
use ratatui::style::Stylize;
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

use crate::app::App;

pub fn draw(frame: &mut Frame, area: Rect, _app: &App) {
    if area.height < 3 {
        return;
    }
    let block = Block::new().borders(Borders::ALL).title(" allocator ");
    frame.render_widget(
        Paragraph::new(" no allocator workload is running. The block map of vramtop's own allocator appears here when a probe runs (vramtop --probe SCENARIO).")
            .wrap(Wrap { trim: true })
            .dark_gray()
            .block(block),
        area,
    );
}
