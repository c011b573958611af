//! The block map's overview, for layouts with more segments than rows (a probe or a job
//! at GPU scale: hundreds of 20 MiB segments): segments packed end to end in address
//! order, each cell drawn by the part of it in use (`▏`..`█`, free `·`), so holes stay
//! visible instead of every row reading `██`. Zooming in (`+`) goes back to one band per
//! segment.
//!
//! ```text
//! ▌▌▌▌▌▌▌▌████▌▌▌▌▌▌▌▌····▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌
//! ▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌▌
//! overview: 714 segments packed · 1 cell = 16 MiB · ▌ part used · + for single segments
//! ```

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;

use super::{largest_free_run, CellAcc, LEGEND_ROWS, MAX_CELL_EXP};
use crate::ui::theme;
use vramtop_alloc::Layout;

/// Segments per map row past which the overview replaces one band per segment. A few
/// more segments than rows scroll legibly with their addresses; hundreds do not.
const OVERVIEW_SEGMENTS_PER_ROW: usize = 2;

/// Whether `layout` needs the overview in `rows` rows at zoom `zoom`: far more segments
/// than rows (one band each would scroll through hundreds), and not zoomed in.
pub fn needs_overview(layout: &Layout, rows: u16, zoom: i32) -> bool {
    let map_rows = usize::from(rows.saturating_sub(LEGEND_ROWS));
    zoom <= 0 && layout.segments.len() > map_rows * OVERVIEW_SEGMENTS_PER_ROW
}

pub struct BlockOverview<'a> {
    layout: &'a Layout,
}

impl<'a> BlockOverview<'a> {
    pub fn new(layout: &'a Layout) -> Self {
        BlockOverview { layout }
    }

    /// The smallest power-of-two cell at which every segment fits in `cells` cells.
    pub fn bytes_per_cell(&self, cells: u64) -> u64 {
        let total: u64 = self
            .layout
            .segments
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.size));
        let exp = (0..=MAX_CELL_EXP)
            .find(|&e| total.div_ceil(1u64 << e) <= cells.max(1))
            .unwrap_or(MAX_CELL_EXP);
        1u64 << exp
    }

    /// What lies under each cell, walking every run once.
    fn accumulate(&self, bytes_per_cell: u64, cells: usize) -> Vec<CellAcc> {
        let mut acc = vec![CellAcc::default(); cells];
        let largest = largest_free_run(self.layout);
        let mut offset = 0u64;
        for (si, seg) in self.layout.segments.iter().enumerate() {
            for (ri, run) in seg.runs.iter().enumerate() {
                let is_largest = largest == Some((si, ri));
                let start = offset.saturating_add(run.addr.saturating_sub(seg.addr));
                let end = start.saturating_add(run.size);
                let mut pos = start;
                while pos < end {
                    let cell = pos / bytes_per_cell;
                    let chunk_end = end.min(cell.saturating_add(1).saturating_mul(bytes_per_cell));
                    if let Some(c) = usize::try_from(cell).ok().and_then(|i| acc.get_mut(i)) {
                        c.add(run.state, run.tag, chunk_end - pos, is_largest);
                    }
                    pos = chunk_end;
                }
            }
            offset = offset.saturating_add(seg.size);
        }
        acc
    }
}

impl Widget for BlockOverview<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let area = area.intersection(buf.area);
        if area.height <= LEGEND_ROWS || area.width == 0 {
            return;
        }
        let rows = area.height - LEGEND_ROWS;
        let cells = usize::from(rows) * usize::from(area.width);
        let bytes_per_cell = self.bytes_per_cell(cells as u64);
        let acc = self.accumulate(bytes_per_cell, cells);
        let total: u64 = self.layout.segments.iter().map(|s| s.size).sum();
        let used_cells = total.div_ceil(bytes_per_cell) as usize;
        for (i, cell) in acc.iter().enumerate().take(used_cells) {
            let cell_start = i as u64 * bytes_per_cell;
            let cell_bytes = bytes_per_cell.min(total.saturating_sub(cell_start));
            let (symbol, style) = cell.look(cell_bytes);
            let x = area.x + (i % usize::from(area.width)) as u16;
            let y = area.y + (i / usize::from(area.width)) as u16;
            buf[(x, y)].set_symbol(symbol).set_style(style);
        }
        let legend = format!(
            "overview: {} segments packed · 1 cell = {} · ▏..▉ part used · + for single segments",
            self.layout.segments.len(),
            theme::compact_bytes(bytes_per_cell)
        );
        buf.set_stringn(
            area.x,
            area.bottom() - LEGEND_ROWS,
            legend,
            usize::from(area.width),
            theme::dim_style(),
        );
    }
}
