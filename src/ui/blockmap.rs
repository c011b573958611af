//! The block map: every segment of the allocator drawn as a band of cells in address
//! order, so free holes between live blocks (the cause of "out of memory despite free
//! memory") can be seen. Draws from a borrowed `Layout` only; no allocator, no app state.
//!
//! ```text
//! ┌ optional Block ──────────────────────────────────────────────────────┐
//! │ 0x7f0000000000  20M ████████▌·····════════════██████░░░░█████▋······ │ <- band: segment 0
//! │                     ██████████████·······╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌             │    (wraps rows)
//! │ 0x7f0001400000   2M ██▍·········                                     │ <- segment 1
//! │ ...                                            rows scroll (scroll_rows) │
//! │ 1 cell = 64 KiB  zoom +1  rows 1-38/120  █ used ▌ part ░ pending ... │ <- legend (1 row)
//! └──────────────────────────────────────────────────────────────────────┘
//!  <---- gutter ----> <------------------ cells_per_row ------------------>
//! ```
//!
//! Each segment starts on a new row. The gutter (address and size) is drawn only where
//! at least `MIN_CELLS_PER_ROW` cells remain beside it. A cell stands for
//! `bytes_per_cell` bytes, a power of two chosen so the whole layout fits at zoom 0.
//! Drawing walks only the runs under visible cells, once: O(visible runs + cells).

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::{Block, Widget};

use crate::ui::theme;
use vramtop_alloc::{BlockState, Layout, SegmentLayout, TagId};

mod legend;
mod overview;
mod segment_table;
pub use legend::BlockMapLegend;
pub use overview::{needs_overview, BlockOverview};
pub use segment_table::SegmentTable;

/// Below this many cells per row, labels cost more than they tell: drop the gutter.
pub const MIN_CELLS_PER_ROW: u16 = 16;
/// Columns of the size part of a label ("1023K" is the widest compact form).
pub const SIZE_LABEL_WIDTH: u16 = 5;
/// The gutter never takes more than this, whatever the addresses look like.
pub const MAX_GUTTER: u16 = 24;
pub const LEGEND_ROWS: u16 = 1;
/// Bytes per cell stays within 2^0 ..= 2^MAX_CELL_EXP whatever the zoom.
pub const MAX_CELL_EXP: i32 = 62;

/// The rows one segment's band occupies in the (unscrolled) map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRows {
    /// Index into `Layout::segments`.
    pub segment: usize,
    pub first_row: usize,
    pub rows: usize,
    /// Cells of the band: ceil(segment size / bytes per cell).
    pub cells: u64,
}

/// Where everything goes for one area: computed by `BlockMap::geometry`, used by render
/// and by the app to map a selected segment to a scroll position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapGeometry {
    pub bytes_per_cell: u64,
    /// Zoom actually applied after clamping.
    pub zoom: i32,
    /// Label columns left of the cells; 0 when labels do not fit.
    pub gutter: u16,
    pub cells_per_row: u16,
    /// Rows available to bands (the area less the block border and the legend).
    pub visible_rows: u16,
    /// Rows all bands need together.
    pub total_rows: usize,
    /// The scroll applied after clamping to the content.
    pub scroll_rows: usize,
    pub bands: Vec<SegmentRows>,
}

impl MapGeometry {
    /// The segment whose band covers map row `row` (0 = first band row, unscrolled).
    pub fn segment_at_row(&self, row: usize) -> Option<usize> {
        let i = self
            .bands
            .partition_point(|b| b.first_row.saturating_add(b.rows) <= row);
        self.bands
            .get(i)
            .filter(|b| b.first_row <= row)
            .map(|b| b.segment)
    }

    /// A scroll that shows the start of `segment`'s band, keeping the current one when
    /// the band is already in view.
    pub fn scroll_to_segment(&self, segment: usize) -> usize {
        let Some(band) = self.bands.iter().find(|b| b.segment == segment) else {
            return self.scroll_rows;
        };
        let view = usize::from(self.visible_rows.max(1));
        if band.first_row >= self.scroll_rows
            && band.first_row < self.scroll_rows.saturating_add(view)
        {
            self.scroll_rows
        } else {
            band.first_row
        }
    }
}

/// The block map widget. `zoom` > 0 halves bytes per cell per step (zoom in).
#[derive(Clone, Debug)]
pub struct BlockMap<'a> {
    layout: &'a Layout,
    zoom: i32,
    scroll_rows: usize,
    selected: Option<usize>,
    legend: bool,
    block: Option<Block<'a>>,
    /// log2 of bytes per cell at zoom 0 when fixed by the caller (side-by-side maps
    /// share one scale); None fits the layout to the area.
    fixed_exp: Option<i32>,
}

impl<'a> BlockMap<'a> {
    pub fn new(layout: &'a Layout) -> Self {
        BlockMap {
            layout,
            zoom: 0,
            scroll_rows: 0,
            selected: None,
            legend: true,
            block: None,
            fixed_exp: None,
        }
    }

    /// Use this many bytes per cell at zoom 0 (rounded up to a power of two) instead of
    /// fitting the layout, so maps drawn side by side share one scale.
    pub fn scale(mut self, bytes_per_cell: u64) -> Self {
        let exp = 64 - bytes_per_cell.max(1).saturating_sub(1).leading_zeros() as i32;
        self.fixed_exp = Some(exp.min(MAX_CELL_EXP));
        self
    }

    /// Bytes per cell that fit the whole layout into `area` at zoom 0.
    pub fn fitted_bytes_per_cell(&self, area: Rect) -> u64 {
        let inner = self.map_area(area);
        let cols = u64::from(
            inner
                .width
                .saturating_sub(gutter_width(self.layout, inner.width))
                .max(1),
        );
        1u64 << fit_cell_exp(&self.layout.segments, cols, usize::from(inner.height))
            .clamp(0, MAX_CELL_EXP)
    }

    /// Zoom steps: +1 halves the bytes per cell, -1 doubles them. Clamped so a cell stays
    /// between 1 byte and 2^62 bytes.
    pub fn zoom(mut self, zoom: i32) -> Self {
        self.zoom = zoom.clamp(-MAX_CELL_EXP, MAX_CELL_EXP);
        self
    }

    /// First map row shown; clamped at render so the last row stays at the bottom.
    pub fn scroll_rows(mut self, rows: usize) -> Self {
        self.scroll_rows = rows;
        self
    }

    /// Highlights this segment's label (index into `Layout::segments`).
    pub fn selected(mut self, segment: Option<usize>) -> Self {
        self.selected = segment;
        self
    }

    /// Whether the bottom row shows the legend (default on).
    pub fn legend(mut self, show: bool) -> Self {
        self.legend = show;
        self
    }

    pub fn block(mut self, block: Block<'a>) -> Self {
        self.block = Some(block);
        self
    }

    /// Where bands, gutter and legend go when drawn into `area` (the same area given to
    /// render, border included).
    pub fn geometry(&self, area: Rect) -> MapGeometry {
        let inner = self.map_area(area);
        let gutter = gutter_width(self.layout, inner.width);
        let cells_per_row = inner.width.saturating_sub(gutter);
        let cols = u64::from(cells_per_row.max(1));
        let fit_exp = self.fixed_exp.unwrap_or_else(|| {
            fit_cell_exp(&self.layout.segments, cols, usize::from(inner.height))
        });
        let exp = (fit_exp - self.zoom).clamp(0, MAX_CELL_EXP);
        let bytes_per_cell = 1u64 << exp;
        let mut bands = Vec::with_capacity(self.layout.segments.len());
        let mut next_row = 0usize;
        for (segment, seg) in self.layout.segments.iter().enumerate() {
            let cells = seg.size.div_ceil(bytes_per_cell);
            let rows = band_rows(seg.size, bytes_per_cell, cols);
            bands.push(SegmentRows {
                segment,
                first_row: next_row,
                rows,
                cells,
            });
            next_row = next_row.saturating_add(rows);
        }
        let visible_rows = inner.height;
        let max_scroll = next_row.saturating_sub(usize::from(visible_rows));
        MapGeometry {
            bytes_per_cell,
            zoom: fit_exp - exp,
            gutter,
            cells_per_row,
            visible_rows,
            total_rows: next_row,
            scroll_rows: self.scroll_rows.min(max_scroll),
            bands,
        }
    }

    /// Rows of each segment's band for this area: (segment, first row, rows).
    pub fn segment_rows(&self, area: Rect) -> Vec<SegmentRows> {
        self.geometry(area).bands
    }

    /// The area bands are drawn in: inside the block, above the legend.
    fn map_area(&self, area: Rect) -> Rect {
        let inner = self.block.as_ref().map_or(area, |b| b.inner(area));
        let legend_rows = if self.legend && inner.height > LEGEND_ROWS {
            LEGEND_ROWS
        } else {
            0
        };
        Rect {
            height: inner.height - legend_rows,
            ..inner
        }
    }

    fn legend_area(&self, area: Rect) -> Option<Rect> {
        let inner = self.block.as_ref().map_or(area, |b| b.inner(area));
        let map = self.map_area(area);
        (map.height < inner.height).then(|| Rect {
            y: map.bottom(),
            height: LEGEND_ROWS,
            ..inner
        })
    }
}

/// Bands needed at `bytes_per_cell`: each segment takes at least one row (its label).
fn band_rows(size: u64, bytes_per_cell: u64, cols: u64) -> usize {
    let rows = size.div_ceil(bytes_per_cell).div_ceil(cols).max(1);
    usize::try_from(rows).unwrap_or(usize::MAX)
}

/// The smallest power of two (as an exponent) at which all bands fit in `rows`. With
/// more segments than rows nothing fits; then every segment gets one row and the map
/// scrolls.
fn fit_cell_exp(segments: &[SegmentLayout], cols: u64, rows: usize) -> i32 {
    let target = rows.max(segments.len());
    (0..=MAX_CELL_EXP)
        .find(|&exp| {
            let total = segments
                .iter()
                .map(|s| band_rows(s.size, 1u64 << exp, cols))
                .fold(0usize, usize::saturating_add);
            total <= target
        })
        .unwrap_or(MAX_CELL_EXP)
}

fn address_label(addr: u64) -> String {
    format!("{addr:#x}")
}

/// Widest address, a space, the size, a space before the cells; 0 if labels don't fit.
fn gutter_width(layout: &Layout, width: u16) -> u16 {
    let widest = layout
        .segments
        .iter()
        .map(|s| address_label(s.addr).len())
        .max()
        .unwrap_or(0);
    if widest == 0 {
        return 0;
    }
    let gutter = u16::try_from(widest)
        .unwrap_or(u16::MAX)
        .saturating_add(SIZE_LABEL_WIDTH + 2)
        .min(MAX_GUTTER);
    if width >= gutter + MIN_CELLS_PER_ROW {
        gutter
    } else {
        0
    }
}

/// What lies under one cell, summed over the runs it overlaps.
#[derive(Clone, Copy, Debug, Default)]
struct CellAcc {
    /// Allocated and pending-free bytes: both hold memory.
    used: u64,
    pending: u64,
    free: u64,
    unmapped: u64,
    /// Tag of the allocated run that put the most bytes into this cell: exact dominance
    /// would need a map per cell; the largest contributor is the same in practice.
    tag: Option<TagId>,
    tag_bytes: u64,
    largest_free: bool,
}

impl CellAcc {
    fn add(&mut self, state: BlockState, tag: Option<TagId>, bytes: u64, largest: bool) {
        match state {
            BlockState::Allocated | BlockState::PendingFree => {
                self.used += bytes;
                if state == BlockState::PendingFree {
                    self.pending += bytes;
                }
                if bytes > self.tag_bytes {
                    self.tag = tag;
                    self.tag_bytes = bytes;
                }
            }
            BlockState::Free => {
                self.free += bytes;
                self.largest_free |= largest;
            }
            BlockState::Unmapped => self.unmapped += bytes,
        }
    }

    /// Symbol and style for a cell of `cell_bytes` bytes.
    fn look(&self, cell_bytes: u64) -> (&'static str, Style) {
        if self.used == 0 {
            return if self.largest_free {
                (theme::SYM_LARGEST_FREE, theme::largest_free_style())
            } else if self.unmapped > self.free {
                (theme::SYM_UNMAPPED, theme::unmapped_style())
            } else if self.free > 0 {
                (theme::SYM_FREE, theme::free_style())
            } else {
                (" ", Style::new())
            };
        }
        let fg = Style::new().fg(theme::tag_color(self.tag));
        // Pending-free memory is the notable part of a cell: it is about to come back.
        if self.pending * 2 > self.used {
            return (theme::SYM_PENDING_FREE, fg);
        }
        if self.used >= cell_bytes {
            return (theme::SYM_ALLOCATED, fg);
        }
        // At least one eighth so a tiny block is never invisible, at most seven so a
        // partly used cell never looks full.
        let eighths = (u128::from(self.used) * 8 + u128::from(cell_bytes / 2))
            / u128::from(cell_bytes.max(1));
        let eighths = (eighths as usize).clamp(1, 7);
        let style = if self.largest_free {
            fg.bg(theme::LARGEST_FREE_BG)
        } else {
            fg
        };
        (theme::LEFT_EIGHTHS[eighths], style)
    }
}

/// The largest free run of the layout as (segment, run) indices; the first on ties.
fn largest_free_run(layout: &Layout) -> Option<(usize, usize)> {
    let mut best: Option<((usize, usize), u64)> = None;
    for (si, seg) in layout.segments.iter().enumerate() {
        for (ri, run) in seg.runs.iter().enumerate() {
            if run.state == BlockState::Free && best.is_none_or(|(_, size)| run.size > size) {
                best = Some(((si, ri), run.size));
            }
        }
    }
    best.map(|(at, _)| at)
}

/// Sums the runs of `seg` into cells `first_cell..first_cell + acc.len()`, walking each
/// overlapping run once and each covered cell once.
fn accumulate(
    seg: &SegmentLayout,
    bytes_per_cell: u64,
    first_cell: u64,
    largest_run: Option<usize>,
    acc: &mut [CellAcc],
) {
    let seg_end = seg.addr.saturating_add(seg.size);
    let lo = seg
        .addr
        .saturating_add(first_cell.saturating_mul(bytes_per_cell));
    let hi = lo
        .saturating_add((acc.len() as u64).saturating_mul(bytes_per_cell))
        .min(seg_end);
    let start = seg
        .runs
        .partition_point(|r| r.addr.saturating_add(r.size) <= lo);
    for (ri, run) in seg.runs.iter().enumerate().skip(start) {
        if run.addr >= hi {
            break;
        }
        let is_largest = largest_run == Some(ri);
        let mut pos = run.addr.max(lo);
        let end = run.addr.saturating_add(run.size).min(hi);
        while pos < end {
            let cell = (pos - seg.addr) / bytes_per_cell;
            let cell_end = seg
                .addr
                .saturating_add(cell.saturating_add(1).saturating_mul(bytes_per_cell));
            let chunk_end = end.min(cell_end);
            // Runs that do not tile their segment (bad input) land outside: skip them.
            let slot = cell
                .checked_sub(first_cell)
                .and_then(|i| usize::try_from(i).ok());
            if let Some(cell_acc) = slot.and_then(|i| acc.get_mut(i)) {
                cell_acc.add(run.state, run.tag, chunk_end - pos, is_largest);
            }
            pos = chunk_end;
        }
    }
}

/// Everything render needs that is computed once per frame.
struct Frame<'g> {
    geo: &'g MapGeometry,
    map: Rect,
    largest: Option<(usize, usize)>,
}

impl BlockMap<'_> {
    fn render_band(
        &self,
        frame: &Frame,
        band: &SegmentRows,
        acc: &mut Vec<CellAcc>,
        buf: &mut Buffer,
    ) {
        let geo = frame.geo;
        let Some(seg) = self.layout.segments.get(band.segment) else {
            return;
        };
        let view_start = geo.scroll_rows;
        let view_end = view_start.saturating_add(usize::from(geo.visible_rows));
        let first = band.first_row.max(view_start);
        let last = band.first_row.saturating_add(band.rows).min(view_end);
        if first >= last {
            return;
        }
        let y0 = frame.map.y + (first - view_start) as u16;
        self.render_label(frame, band, seg, y0, last - first, buf);
        let cols = u64::from(geo.cells_per_row);
        let first_cell = (first - band.first_row) as u64 * cols;
        let end_cell = ((last - band.first_row) as u64 * cols).min(band.cells);
        if cols == 0 || first_cell >= end_cell {
            return;
        }
        acc.clear();
        acc.resize((end_cell - first_cell) as usize, CellAcc::default());
        let largest_run = frame
            .largest
            .filter(|(s, _)| *s == band.segment)
            .map(|(_, r)| r);
        accumulate(seg, geo.bytes_per_cell, first_cell, largest_run, acc);
        let x0 = frame.map.x + geo.gutter;
        for (i, cell) in acc.iter().enumerate() {
            let index = first_cell + i as u64;
            let cell_start = index.saturating_mul(geo.bytes_per_cell);
            let cell_bytes = geo.bytes_per_cell.min(seg.size.saturating_sub(cell_start));
            let (symbol, style) = cell.look(cell_bytes);
            let x = x0 + (i as u64 % cols) as u16;
            let y = y0 + (i as u64 / cols) as u16;
            if let Some(c) = buf.cell_mut((x, y)) {
                c.set_symbol(symbol).set_style(style);
            }
        }
    }

    /// Address and size on the band's first visible row; the whole gutter of a selected
    /// band is highlighted so the selection shows even when its first row is scrolled off.
    fn render_label(
        &self,
        frame: &Frame,
        band: &SegmentRows,
        seg: &SegmentLayout,
        y: u16,
        rows: usize,
        buf: &mut Buffer,
    ) {
        let gutter = frame.geo.gutter;
        if gutter == 0 {
            return;
        }
        let selected = self.selected == Some(band.segment);
        let style = if selected {
            theme::selected_label_style()
        } else {
            theme::label_style()
        };
        let addr_width = usize::from(gutter.saturating_sub(SIZE_LABEL_WIDTH + 2));
        let text = format!(
            "{:>addr_width$} {:>size$} ",
            address_label(seg.addr),
            theme::compact_bytes(seg.size),
            size = usize::from(SIZE_LABEL_WIDTH)
        );
        buf.set_stringn(frame.map.x, y, text, usize::from(gutter), style);
        if selected {
            let rest = Rect::new(frame.map.x, y, gutter, rows as u16).intersection(frame.map);
            buf.set_style(rest, style);
        }
    }
}

impl Widget for BlockMap<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        Widget::render(&self, area, buf);
    }
}

impl Widget for &BlockMap<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let area = area.intersection(buf.area);
        if area.is_empty() {
            return;
        }
        if let Some(block) = &self.block {
            block.render(area, buf);
        }
        if self.layout.segments.is_empty() {
            // No scale to speak of: say why the map is blank instead.
            let map = self.map_area(area);
            if !map.is_empty() {
                let text = "no segments reserved";
                let width = usize::from(map.width);
                buf.set_stringn(map.x, map.y, text, width, theme::dim_style());
            }
            return;
        }
        let geo = self.geometry(area);
        let frame = Frame {
            geo: &geo,
            map: self.map_area(area),
            largest: largest_free_run(self.layout),
        };
        let mut acc = Vec::new();
        let view_end = geo
            .scroll_rows
            .saturating_add(usize::from(geo.visible_rows));
        let start = geo
            .bands
            .partition_point(|b| b.first_row.saturating_add(b.rows) <= geo.scroll_rows);
        for band in geo.bands[start..]
            .iter()
            .take_while(|b| b.first_row < view_end)
        {
            self.render_band(&frame, band, &mut acc, buf);
        }
        if let Some(legend_area) = self.legend_area(area) {
            BlockMapLegend::new(geo.bytes_per_cell)
                .zoom(geo.zoom)
                .rows(
                    geo.scroll_rows,
                    usize::from(geo.visible_rows),
                    geo.total_rows,
                )
                .render(legend_area, buf);
        }
    }
}
