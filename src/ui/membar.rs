//! A memory bar split into used / driver-reserved / free, as one line of cells.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::widgets::Widget;

pub const USED_COLOR: Color = Color::Green;
pub const RESERVED_COLOR: Color = Color::Magenta;
pub const FREE_COLOR: Color = Color::DarkGray;

/// Draws `[used|reserved|free]` across its area's first row. Inputs are clamped so that
/// a device reporting used > total still draws inside the bar.
#[derive(Default)]
pub struct MemoryBar {
    used: u64,
    reserved: u64,
    total: u64,
}

impl MemoryBar {
    pub fn used(mut self, bytes: u64) -> Self {
        self.used = bytes;
        self
    }
    pub fn reserved(mut self, bytes: u64) -> Self {
        self.reserved = bytes;
        self
    }
    pub fn total(mut self, bytes: u64) -> Self {
        self.total = bytes;
        self
    }
}

impl Widget for MemoryBar {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.width == 0 || area.height == 0 {
            return;
        }
        let width = area.width as u64;
        let cells = |bytes: u64| {
            if self.total == 0 {
                0
            } else {
                (bytes.min(self.total) as u128 * width as u128).div_ceil(self.total as u128) as u64
            }
        };
        let used = cells(self.used);
        let reserved = cells(self.reserved).min(width - used.min(width));
        for i in 0..area.width {
            let x = i as u64;
            let (symbol, color) = if x < used {
                ("█", USED_COLOR)
            } else if x < used + reserved {
                ("▓", RESERVED_COLOR)
            } else {
                ("░", FREE_COLOR)
            };
            if let Some(cell) = buf.cell_mut((area.x + i, area.y)) {
                cell.set_symbol(symbol).set_style(Style::new().fg(color));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(bar: MemoryBar, width: u16) -> String {
        let area = Rect::new(0, 0, width, 1);
        let mut buf = Buffer::empty(area);
        bar.render(area, &mut buf);
        (0..width)
            .map(|x| buf[(x, 0)].symbol().to_string())
            .collect()
    }

    #[test]
    fn splits_used_reserved_free() {
        let bar = MemoryBar::default().used(50).reserved(10).total(100);
        assert_eq!(row(bar, 10), "█████▓░░░░");
    }

    #[test]
    fn clamps_overfull_and_empty_devices() {
        assert_eq!(
            row(MemoryBar::default().used(500).reserved(10).total(100), 4),
            "████"
        );
        assert_eq!(row(MemoryBar::default().total(0), 3), "░░░");
        row(MemoryBar::default().used(1).total(1), 0);
    }
}
