//! The block map's legend: the cell scale, zoom and scroll position, and a key to the
//! cell symbols. Drawn by `BlockMap` on its bottom row, or on its own where the app wants.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;

use crate::ui::theme;

/// Columns between legend items.
pub const LEGEND_GAP: u16 = 2;

/// One row: the scale first, then scroll position, then the symbol key, each item drawn
/// only if it fits whole, so a narrow legend loses the key before the scale.
#[derive(Clone, Debug)]
pub struct BlockMapLegend {
    bytes_per_cell: u64,
    zoom: i32,
    rows: Option<(usize, usize, usize)>,
}

/// One legend entry: an optional state symbol in that state's style, then text.
struct LegendItem {
    symbol: Option<(&'static str, Style)>,
    text: String,
    style: Style,
}

impl LegendItem {
    fn text(text: String, style: Style) -> Self {
        LegendItem {
            symbol: None,
            text,
            style,
        }
    }

    fn width(&self) -> u16 {
        let symbol = self.symbol.map_or(0, |(s, _)| s.chars().count() + 1);
        u16::try_from(symbol + self.text.chars().count()).unwrap_or(u16::MAX)
    }
}

impl BlockMapLegend {
    pub fn new(bytes_per_cell: u64) -> Self {
        BlockMapLegend {
            bytes_per_cell: bytes_per_cell.max(1),
            zoom: 0,
            rows: None,
        }
    }

    pub fn zoom(mut self, zoom: i32) -> Self {
        self.zoom = zoom;
        self
    }

    /// (first shown, shown, total) rows; the position shows only when the map scrolls.
    pub fn rows(mut self, scroll: usize, visible: usize, total: usize) -> Self {
        self.rows = (total > visible).then_some((scroll, visible, total));
        self
    }

    fn items(&self) -> Vec<LegendItem> {
        let scale = format!("1 cell = {}", theme::pow2_bytes(self.bytes_per_cell));
        let mut items = vec![LegendItem::text(scale, theme::scale_style())];
        if self.zoom != 0 {
            let zoom = format!("zoom {:+}", self.zoom);
            items.push(LegendItem::text(zoom, theme::label_style()));
        }
        if let Some((scroll, visible, total)) = self.rows {
            let last = (scroll + visible).min(total);
            let rows = format!("rows {}-{last}/{total}", scroll + 1);
            items.push(LegendItem::text(rows, theme::label_style()));
        }
        let used = Style::new().fg(theme::UNTAGGED);
        let key = [
            (theme::SYM_ALLOCATED, "used", used),
            (theme::LEFT_EIGHTHS[4], "part", used),
            (theme::SYM_PENDING_FREE, "pending", used),
            (theme::SYM_FREE, "free", theme::free_style()),
            (
                theme::SYM_LARGEST_FREE,
                "largest free",
                theme::largest_free_style(),
            ),
            (theme::SYM_UNMAPPED, "unmapped", theme::unmapped_style()),
        ];
        items.extend(key.into_iter().map(|(symbol, text, style)| LegendItem {
            symbol: Some((symbol, style)),
            text: text.to_string(),
            style: theme::label_style(),
        }));
        items
    }
}

impl Widget for BlockMapLegend {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let area = area.intersection(buf.area);
        if area.is_empty() {
            return;
        }
        let mut x = area.x;
        for item in self.items() {
            let gap = if x > area.x { LEGEND_GAP } else { 0 };
            if u32::from(x) + u32::from(gap) + u32::from(item.width()) > u32::from(area.right()) {
                break;
            }
            x += gap;
            if let Some((symbol, style)) = item.symbol {
                buf.set_string(x, area.y, symbol, style);
                x += symbol.chars().count() as u16 + 1;
            }
            buf.set_string(x, area.y, &item.text, item.style);
            x += item.text.chars().count() as u16;
        }
    }
}
