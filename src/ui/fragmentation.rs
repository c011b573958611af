//! The fragmentation panel: how much memory is held, used and asked for, how broken up
//! the free part is, and the last request that failed because of it. Draws from a
//! borrowed `Stats` and a history of external fragmentation; no allocator, no app state.
//!
//! ```text
//! ┌ optional Block ───────────────────────────────────────┐
//! │reserved  ████████████████████████████▌····  20.0 GiB  │ USAGE (3 rows, one scale)
//! │allocated ████████████████████▍············  14.1 GiB  │
//! │requested ██████████████████▏··············  12.9 GiB  │
//! │ext frag  ████████▋··························     31.2%  │ FRAG (gauge)
//! │history   ▁▁▂▃▃▅▆▇█▇▆▅▅▄▃▂▂▂▃▄▅▆▇▇▇█                  │ HISTORY (sparkline)
//! │largest   ████▊·······  1.1 GiB / 5.3 GiB              │ LARGEST (of total free)
//! │free runs ▁ ▃ █ ▅ ▂ ▁   ▁                              │ HISTOGRAM (log2 buckets)
//! │          512B    8K      1M          1G               │
//! │OOMs 3  retries 12  free runs 214                      │ COUNTERS
//! │last OOM: needed 2.0 GiB contiguous; 5.3 GiB free in   │ LAST OOM (red, wraps)
//! │214 runs, largest 1.1 GiB                              │
//! └───────────────────────────────────────────────────────┘
//!  <-LABEL_WIDTH-><------------ bar ------------><-value->
//! ```
//!
//! Sections are drawn top to bottom in that order, but when rows are short they are
//! kept by `PRIORITY`: the fragmentation gauge and a failed request first.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Sparkline, Widget};

use crate::ui::theme;
use vramtop_alloc::{human_bytes, Stats};

pub const LABEL_WIDTH: u16 = 10;
/// Labels are dropped before a bar gets narrower than this.
pub const MIN_BAR_WIDTH: u16 = 4;
pub const USAGE_ROWS: u16 = 3;
pub const HISTORY_ROWS: u16 = 2;
pub const HIST_BAR_ROWS: u16 = 3;
pub const HIST_LABEL_ROWS: u16 = 1;
/// Widest column per histogram bucket: wider bars only spread the labels out.
pub const HIST_MAX_COLUMN: u16 = 3;
pub const OOM_MAX_ROWS: u16 = 3;
/// Fragmentation history is in per-mille: a full-height sparkline bar is 100 %.
pub const HISTORY_SCALE: u64 = 1000;

const RESERVED_COLOR: Color = Color::LightBlue;
const ALLOCATED_COLOR: Color = Color::Cyan;
const REQUESTED_COLOR: Color = Color::Magenta;
const HIST_COLOR: Color = Color::Cyan;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Usage,
    Frag,
    History,
    Largest,
    Histogram,
    Counters,
    LastOom,
}

const DISPLAY_ORDER: [Section; 7] = [
    Section::Usage,
    Section::Frag,
    Section::History,
    Section::Largest,
    Section::Histogram,
    Section::Counters,
    Section::LastOom,
];

/// What survives a short area: the gauge and the failed request tell the story alone.
const PRIORITY: [Section; 7] = [
    Section::Frag,
    Section::LastOom,
    Section::Largest,
    Section::Usage,
    Section::Counters,
    Section::History,
    Section::Histogram,
];

#[derive(Clone, Debug)]
pub struct FragmentationPanel<'a> {
    stats: &'a Stats,
    history: &'a [u64],
    block: Option<Block<'a>>,
}

impl<'a> FragmentationPanel<'a> {
    /// `history` is external fragmentation in per-mille, oldest first; values above
    /// 1000 are drawn as 1000.
    pub fn new(stats: &'a Stats, history: &'a [u64]) -> Self {
        FragmentationPanel {
            stats,
            history,
            block: None,
        }
    }

    pub fn block(mut self, block: Block<'a>) -> Self {
        self.block = Some(block);
        self
    }

    fn external_fragmentation(&self) -> f64 {
        clamp_ratio(self.stats.external_fragmentation)
    }

    fn oom_text(&self) -> String {
        match &self.stats.last_oom {
            Some(report) => format!("last OOM: {report}"),
            None => "last OOM: none".to_string(),
        }
    }

    fn section_height(&self, section: Section, width: u16) -> u16 {
        match section {
            Section::Usage => USAGE_ROWS,
            Section::Frag | Section::Largest | Section::Counters => 1,
            Section::History => HISTORY_ROWS,
            Section::Histogram => HIST_BAR_ROWS + HIST_LABEL_ROWS,
            Section::LastOom => {
                let lines = wrap_words(&self.oom_text(), width).len();
                u16::try_from(lines)
                    .unwrap_or(u16::MAX)
                    .clamp(1, OOM_MAX_ROWS)
            }
        }
    }

    /// Sections that fit, by priority, laid out in display order.
    fn plan(&self, area: Rect) -> Vec<(Section, Rect)> {
        let mut heights = [0u16; DISPLAY_ORDER.len()];
        let mut left = area.height;
        for section in PRIORITY {
            let height = self.section_height(section, area.width);
            if height <= left {
                left -= height;
                if let Some(i) = DISPLAY_ORDER.iter().position(|s| *s == section) {
                    heights[i] = height;
                }
            }
        }
        crate::ui::stack_sections(area, &DISPLAY_ORDER, &heights)
    }

    fn render_usage(&self, area: Rect, buf: &mut Buffer) {
        let s = self.stats;
        let scale = [
            s.capacity_bytes,
            s.reserved_bytes,
            s.allocated_bytes,
            s.requested_bytes,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
        .max(1);
        let rows = [
            ("reserved", s.reserved_bytes, RESERVED_COLOR),
            ("allocated", s.allocated_bytes, ALLOCATED_COLOR),
            ("requested", s.requested_bytes, REQUESTED_COLOR),
        ];
        let values: Vec<String> = rows.iter().map(|r| human_bytes(r.1)).collect();
        let value_width = values.iter().map(|v| v.len()).max().unwrap_or(0) as u16;
        for (i, ((label, bytes, color), value)) in rows.into_iter().zip(&values).enumerate() {
            let row = Rect::new(area.x, area.y + i as u16, area.width, 1).intersection(area);
            let ratio = bytes as f64 / scale as f64;
            let bar = BarRow::new(label, ratio, value, Style::new().fg(color));
            bar.value_width(value_width).render(row, buf);
        }
    }

    fn render_frag(&self, area: Rect, buf: &mut Buffer) {
        let ratio = self.external_fragmentation();
        let value = format!("{:.1}%", ratio * 100.0);
        let style = Style::new().fg(theme::severity_color(ratio));
        BarRow::new("ext frag", ratio, &value, style).render(area, buf);
    }

    fn render_history(&self, area: Rect, buf: &mut Buffer) {
        let (label_width, spark) = split_label(area, 0);
        put(
            buf,
            area.x,
            area.y,
            "history",
            usize::from(label_width),
            theme::label_style(),
        );
        let width = usize::from(spark.width);
        let tail = &self.history[self.history.len().saturating_sub(width)..];
        let data: Vec<u64> = tail.iter().map(|v| (*v).min(HISTORY_SCALE)).collect();
        let last = data
            .last()
            .map_or(0.0, |v| *v as f64 / HISTORY_SCALE as f64);
        Sparkline::default()
            .data(&data)
            .max(HISTORY_SCALE)
            .style(Style::new().fg(theme::severity_color(last)))
            .render(spark, buf);
    }

    fn render_largest(&self, area: Rect, buf: &mut Buffer) {
        let s = self.stats;
        let ratio = if s.total_free_bytes == 0 {
            0.0
        } else {
            clamp_ratio(s.largest_free_bytes as f64 / s.total_free_bytes as f64)
        };
        let value = format!(
            "{} / {}",
            human_bytes(s.largest_free_bytes),
            human_bytes(s.total_free_bytes)
        );
        // A largest run that is most of the free memory is good news: colour by the
        // fragmentation it implies, not by the ratio itself.
        let style = Style::new().fg(theme::severity_color(1.0 - ratio));
        BarRow::new("largest", ratio, &value, style).render(area, buf);
    }

    fn render_counters(&self, area: Rect, buf: &mut Buffer) {
        let s = self.stats;
        let count_style = |n: u64, hot: Style| if n > 0 { hot } else { theme::label_style() };
        let line = Line::from(vec![
            Span::styled("OOMs ", theme::label_style()),
            Span::styled(
                s.ooms.to_string(),
                count_style(s.ooms, theme::alert_style()),
            ),
            Span::raw("  "),
            Span::styled("retries ", theme::label_style()),
            Span::styled(
                s.retries.to_string(),
                count_style(s.retries, Style::new().fg(Color::Yellow)),
            ),
            Span::raw("  "),
            Span::styled("free runs ", theme::label_style()),
            Span::raw(s.free_runs.to_string()),
        ]);
        buf.set_line(area.x, area.y, &line, area.width);
    }

    fn render_last_oom(&self, area: Rect, buf: &mut Buffer) {
        let style = if self.stats.last_oom.is_some() {
            theme::alert_style()
        } else {
            theme::dim_style()
        };
        let lines = wrap_words(&self.oom_text(), area.width);
        for (y, line) in (area.y..area.bottom()).zip(lines) {
            put(buf, area.x, y, line, usize::from(area.width), style);
        }
    }
}

impl FragmentationPanel<'_> {
    /// Vertical bars, one column group per log2 bucket, over the span of buckets that
    /// hold runs; labels under them wherever the previous label left room.
    fn render_histogram(&self, area: Rect, buf: &mut Buffer) {
        let (label_width, bars) = split_label(area, 0);
        put(
            buf,
            area.x,
            area.y,
            "free runs",
            usize::from(label_width),
            theme::label_style(),
        );
        if bars.is_empty() {
            return;
        }
        // Bucket i holds runs of [2^i, 2^(i+1)): past 63 the bound is not a u64.
        let hist = &self.stats.free_run_histogram[..self.stats.free_run_histogram.len().min(64)];
        let (Some(lo), Some(hi)) = (
            hist.iter().position(|&n| n > 0),
            hist.iter().rposition(|&n| n > 0),
        ) else {
            put(
                buf,
                bars.x,
                bars.y,
                "no free runs",
                usize::from(bars.width),
                theme::dim_style(),
            );
            return;
        };
        // Too many buckets for the width: keep the large ones, they decide what fits.
        let lo = lo.max((hi + 1).saturating_sub(usize::from(bars.width)));
        let buckets = &hist[lo..=hi];
        let column = (bars.width / buckets.len().max(1) as u16).clamp(1, HIST_MAX_COLUMN);
        let bar_rows = bars.height.saturating_sub(HIST_LABEL_ROWS).max(1);
        let max = buckets.iter().copied().max().unwrap_or(1).max(1);
        for (i, &count) in buckets.iter().enumerate() {
            let x = bars.x + i as u16 * column;
            let style = Style::new().fg(self.bucket_color(lo + i));
            let levels = bar_levels(count, max, bar_rows);
            // Leave a gap between wide columns so neighbouring buckets stay apart.
            let bar_width = if column > 1 { column - 1 } else { 1 };
            for row in 0..bar_rows {
                let filled = levels.saturating_sub(u64::from(row) * 8).min(8) as usize;
                let y = bars.y + bar_rows - 1 - row;
                for dx in 0..bar_width {
                    if let Some(cell) = buf.cell_mut((x + dx, y)) {
                        cell.set_symbol(theme::LOWER_EIGHTHS[filled])
                            .set_style(style);
                    }
                }
            }
        }
        if bars.height > bar_rows {
            draw_bucket_labels(buf, bars, lo, buckets.len(), column);
        }
    }

    /// After an OOM, buckets too small to have served the failed request are red.
    fn bucket_color(&self, bucket: usize) -> Color {
        match &self.stats.last_oom {
            Some(oom) if bucket < 63 && (1u64 << (bucket + 1)) <= oom.rounded_bytes => Color::Red,
            Some(_) => Color::Green,
            None => HIST_COLOR,
        }
    }
}

/// Eighths of height for `count` on a scale where `max` fills `rows` rows; a non-empty
/// bucket gets at least one eighth so a lone large run never vanishes.
fn bar_levels(count: u64, max: u64, rows: u16) -> u64 {
    if count == 0 {
        return 0;
    }
    let full = u128::from(rows) * 8;
    let levels = (u128::from(count) * full + u128::from(max) / 2) / u128::from(max.max(1));
    levels.clamp(1, full) as u64
}

/// Size labels ("512B", "1M") under their bucket, skipping any that would overlap.
fn draw_bucket_labels(buf: &mut Buffer, bars: Rect, lo: usize, count: usize, column: u16) {
    let y = bars.bottom() - 1;
    let mut free_from = bars.x;
    for i in 0..count {
        let x = bars.x + i as u16 * column;
        let label = theme::compact_bytes(1u64 << (lo + i));
        let width = label.len() as u16;
        if x >= free_from && u32::from(x) + u32::from(width) <= u32::from(bars.right()) {
            buf.set_string(x, y, &label, theme::label_style());
            free_from = x + width + 1;
        }
    }
}

impl Widget for FragmentationPanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        Widget::render(&self, area, buf);
    }
}

impl Widget for &FragmentationPanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let area = area.intersection(buf.area);
        if area.is_empty() {
            return;
        }
        if let Some(block) = &self.block {
            block.render(area, buf);
        }
        let inner = self.block.as_ref().map_or(area, |b| b.inner(area));
        if inner.is_empty() {
            return;
        }
        for (section, rect) in self.plan(inner) {
            match section {
                Section::Usage => self.render_usage(rect, buf),
                Section::Frag => self.render_frag(rect, buf),
                Section::History => self.render_history(rect, buf),
                Section::Largest => self.render_largest(rect, buf),
                Section::Histogram => self.render_histogram(rect, buf),
                Section::Counters => self.render_counters(rect, buf),
                Section::LastOom => self.render_last_oom(rect, buf),
            }
        }
    }
}

/// Text clipped to `max` columns; nothing at all when it has no room, because ratatui
/// panics on a start position outside the buffer even for zero columns.
fn put(buf: &mut Buffer, x: u16, y: u16, text: impl AsRef<str>, max: usize, style: Style) {
    if max > 0 && buf.area.contains(ratatui::layout::Position::new(x, y)) {
        buf.set_stringn(x, y, text, max, style);
    }
}

/// NaN and out-of-range ratios (a stats bug, or 0/0) draw as empty or full, never panic.
fn clamp_ratio(ratio: f64) -> f64 {
    if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, 1.0)
    }
}

/// Label columns and the rest of a row; the label goes first when the row is too narrow
/// for it, `reserve` more columns and a minimal bar.
fn split_label(area: Rect, reserve: u16) -> (u16, Rect) {
    let label = if area.width >= LABEL_WIDTH + reserve + MIN_BAR_WIDTH {
        LABEL_WIDTH
    } else {
        0
    };
    let rest = Rect {
        x: area.x + label,
        width: area.width - label,
        ..area
    };
    (label, rest)
}

/// Greedy word wrap to `width` columns; a word longer than a line is cut.
fn wrap_words(text: &str, width: u16) -> Vec<String> {
    let width = usize::from(width.max(1));
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let needed = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if !line.is_empty() && needed > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// "label  ████▌····  value": a labelled horizontal bar with 1/8-cell resolution.
struct BarRow<'t> {
    label: &'t str,
    ratio: f64,
    value: &'t str,
    value_width: u16,
    style: Style,
}

impl<'t> BarRow<'t> {
    fn new(label: &'t str, ratio: f64, value: &'t str, style: Style) -> Self {
        let value_width = u16::try_from(value.chars().count()).unwrap_or(u16::MAX);
        BarRow {
            label,
            ratio: clamp_ratio(ratio),
            value,
            value_width,
            style,
        }
    }

    /// Aligns values (and so bar ends) across rows that share a scale.
    fn value_width(mut self, width: u16) -> Self {
        self.value_width = self.value_width.max(width);
        self
    }

    fn render(&self, area: Rect, buf: &mut Buffer) {
        if area.is_empty() {
            return;
        }
        let (label_width, rest) = split_label(area, self.value_width + 1);
        let label_style = theme::label_style();
        put(
            buf,
            area.x,
            area.y,
            self.label,
            usize::from(label_width),
            label_style,
        );
        // The number beats the bar when there is room for only one of them.
        let value_width = self.value_width.min(rest.width);
        let bar_width = rest.width.saturating_sub(value_width + 1);
        draw_bar(
            buf,
            Rect {
                width: bar_width,
                ..rest
            },
            self.ratio,
            self.style,
        );
        let value = format!("{:>w$}", self.value, w = usize::from(value_width));
        let x = rest.right() - value_width;
        let bold = Style::new().add_modifier(Modifier::BOLD);
        put(buf, x, area.y, value, usize::from(value_width), bold);
    }
}

/// Filled part in `style`, the rest as a dim track so empty bars still show their scale.
fn draw_bar(buf: &mut Buffer, area: Rect, ratio: f64, style: Style) {
    let eighths = (ratio * f64::from(area.width) * 8.0).round() as u32;
    for i in 0..u32::from(area.width) {
        let filled = eighths.saturating_sub(i * 8).min(8) as usize;
        let (symbol, cell_style) = if filled == 0 {
            (theme::SYM_FREE, theme::free_style())
        } else {
            (theme::LEFT_EIGHTHS[filled], style)
        };
        if let Some(cell) = buf.cell_mut((area.x + i as u16, area.y)) {
            cell.set_symbol(symbol).set_style(cell_style);
        }
    }
}
