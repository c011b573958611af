//! The leaks view: which allocation sites keep growing (red), what is alive since the
//! mark, live bytes per site with their trend, the oldest live blocks, and processes
//! whose device memory only goes up. Draws from borrowed detector output; computes
//! nothing but layout.
//!
//! ```text
//! ┌ optional Block ─────────────────────────────────────────────────────────────┐
//! │leak suspects                           live  growth/win  growing  first seen│ SUSPECTS
//! │torch_trace.py:68 step              80.0 MiB    +4.0 MiB       19          w1│  red rows,
//! │  ↳ holds torch_trace.py:67 step    80.0 MiB    +4.0 MiB                     │  held sites
//! │since mark: +120.0 MiB in 40 blocks at torch_trace.py:68 step                │ MARK (≤ 3 rows,
//! │            +512.0 KiB in 1 block at optim.py:120 step                       │  when set)
//! │live by site          live  blocks trend       │block  oldest live blocks  age│ SITES | OLDEST
//! │torch_trace.py:68 80.0 MiB      20 ▁▁▂▂▃▄▄▅▆▆▇█│#1     transformers/…   12m34s│ (stacked below
//! │(no user frame)   96.0 MiB       3 ▁▁▁▁▁▁▁▁▁▁▁▁│#9     torch_trace.py…   5m12s│  SPLIT_MIN_WIDTH)
//! │process           now  high-water         slope                              │ PROCESSES
//! │4242         12.3 GiB    12.3 GiB    +8.0 MiB/s growing                      │  (growing: red)
//! │unattributed 448.0 MiB, above 256.0 MiB for 60 samples                       │  (flagged: red)
//! └─────────────────────────────────────────────────────────────────────────────┘
//!  <-- site column: what is left --><---- fixed columns, dropped right first --->
//! ```
//!
//! Sections are drawn in that order; when rows are short they are kept by `PRIORITY`
//! (suspects first, then process flags, the mark, the tables). One row left shows a
//! one-line summary; columns are dropped right to left before the site column gets
//! narrower than `MIN_SITE_WIDTH`.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Block, Widget};

use crate::ui::theme;
use crate::units::{truncate, NA};
use vramtop_alloc::leaks::{SiteDiff, SiteTrend, Suspect};
use vramtop_alloc::{human_bytes, LiveBlock};
use vramtop_telemetry::trend::{ProcessTrend, UnattributedTrend};

/// Rows of the since-mark section at most.
pub const MARK_MAX_ROWS: u16 = 3;
/// Floors shown in a site's trend.
pub const TREND_WIDTH: u16 = 12;
/// Below this width the two tables are stacked.
pub const SPLIT_MIN_WIDTH: u16 = 100;
/// Columns are dropped before the site column gets narrower than this.
pub const MIN_SITE_WIDTH: u16 = 12;
/// A table section needs its header and one row.
const MIN_TABLE_ROWS: u16 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Suspects,
    Mark,
    Tables,
    Processes,
}

const DISPLAY_ORDER: [Section; 4] = [
    Section::Suspects,
    Section::Mark,
    Section::Tables,
    Section::Processes,
];

/// What survives a short area: the verdict, then the driver's view, then the details.
const PRIORITY: [Section; 4] = [
    Section::Suspects,
    Section::Processes,
    Section::Mark,
    Section::Tables,
];

/// A table column; width 0 is the site column, which takes what is left.
#[derive(Clone, Copy, Debug)]
struct Col {
    title: &'static str,
    width: u16,
    right: bool,
}

const fn col(title: &'static str, width: u16, right: bool) -> Col {
    Col {
        title,
        width,
        right,
    }
}

const SUSPECT_COLS: [Col; 5] = [
    col("leak suspects", 0, false),
    col("live", 11, true),
    col("growth/win", 12, true),
    col("growing", 9, true),
    col("first seen", 12, true),
];
const SITE_COLS: [Col; 4] = [
    col("live by site", 0, false),
    col("live", 11, true),
    col("blocks", 8, true),
    col("trend", TREND_WIDTH + 1, false),
];
const OLDEST_COLS: [Col; 4] = [
    col("block", 9, false),
    col("oldest live blocks", 0, false),
    col("size", 11, true),
    col("age", 8, true),
];
const PROCESS_COLS: [Col; 5] = [
    col("process", 10, false),
    col("now", 11, true),
    col("high-water", 12, true),
    col("slope", 14, true),
    col("", 10, false),
];

#[derive(Clone, Debug)]
pub struct LeaksView<'a> {
    suspects: &'a [Suspect],
    sites: &'a [SiteTrend],
    since_mark: Option<&'a [SiteDiff]>,
    oldest: &'a [LiveBlock],
    processes: &'a [ProcessTrend],
    unattributed: Option<&'a UnattributedTrend>,
    unattributed_threshold: Option<u64>,
    block: Option<Block<'a>>,
}

impl<'a> LeaksView<'a> {
    /// `sites` as `LeakDetector::sites()` gives them (largest first).
    pub fn new(suspects: &'a [Suspect], sites: &'a [SiteTrend]) -> Self {
        LeaksView {
            suspects,
            sites,
            since_mark: None,
            oldest: &[],
            processes: &[],
            unattributed: None,
            unattributed_threshold: None,
            block: None,
        }
    }

    /// `Baseline::diff` of the current blocks, when a mark is set.
    pub fn since_mark(mut self, diff: Option<&'a [SiteDiff]>) -> Self {
        self.since_mark = diff;
        self
    }

    /// Oldest first, as `live_blocks_by_age` gives them.
    pub fn oldest_blocks(mut self, blocks: &'a [LiveBlock]) -> Self {
        self.oldest = blocks;
        self
    }

    pub fn processes(mut self, trends: &'a [ProcessTrend]) -> Self {
        self.processes = trends;
        self
    }

    /// The device's unattributed memory and the threshold it was judged against.
    pub fn unattributed(mut self, trend: Option<&'a UnattributedTrend>, threshold: u64) -> Self {
        self.unattributed = trend;
        self.unattributed_threshold = Some(threshold);
        self
    }

    pub fn block(mut self, block: Block<'a>) -> Self {
        self.block = Some(block);
        self
    }

    fn suspect_rows(&self) -> u16 {
        let rows: usize = self
            .suspects
            .iter()
            .map(|s| 1 + s.retained_with.len())
            .sum();
        clamp_rows(1 + rows.max(1))
    }

    fn mark_rows(&self) -> u16 {
        match self.since_mark {
            Some(diff) => clamp_rows(diff.len().max(1)).min(MARK_MAX_ROWS),
            None => 0,
        }
    }

    fn process_rows(&self) -> u16 {
        let unattributed = usize::from(self.unattributed.is_some());
        if self.processes.is_empty() && unattributed == 0 {
            return 0;
        }
        clamp_rows(1 + self.processes.len().max(1) + unattributed)
    }

    fn table_rows(&self, width: u16) -> u16 {
        let (sites, oldest) = (self.sites.len().max(1), self.oldest.len().max(1));
        if width >= SPLIT_MIN_WIDTH {
            clamp_rows(1 + sites.max(oldest))
        } else {
            clamp_rows(2 + sites + oldest)
        }
    }

    /// Heights by priority, each section whole down to its minimum or not at all.
    fn plan(&self, area: Rect) -> Vec<(Section, Rect)> {
        let mut heights = [0u16; DISPLAY_ORDER.len()];
        let mut left = area.height;
        for section in PRIORITY {
            let (want, least) = match section {
                Section::Suspects => (self.suspect_rows(), MIN_TABLE_ROWS),
                Section::Mark => (self.mark_rows(), 1),
                Section::Processes => (self.process_rows(), MIN_TABLE_ROWS),
                Section::Tables => (self.table_rows(area.width), MIN_TABLE_ROWS),
            };
            if want == 0 || left < least {
                continue;
            }
            let height = want.min(left);
            left -= height;
            if let Some(i) = DISPLAY_ORDER.iter().position(|s| *s == section) {
                heights[i] = height;
            }
        }
        crate::ui::stack_sections(area, &DISPLAY_ORDER, &heights)
    }

    fn render_summary(&self, area: Rect, buf: &mut Buffer) {
        let text = match self.suspects.first() {
            Some(first) => format!(
                "{} leak suspect{}: {} +{}/window",
                self.suspects.len(),
                if self.suspects.len() == 1 { "" } else { "s" },
                first.tag,
                human_bytes(first.growth_bytes_per_window)
            ),
            None => "no leak suspects".to_string(),
        };
        let style = if self.suspects.is_empty() {
            theme::dim_style()
        } else {
            theme::alert_style()
        };
        put(buf, area, 0, &text, style);
    }

    fn render_suspects(&self, area: Rect, buf: &mut Buffer) {
        let cols = fit(&SUSPECT_COLS, area.width);
        header(buf, area, &SUSPECT_COLS, &cols);
        let mut y = 1;
        if self.suspects.is_empty() {
            put(
                buf,
                area,
                y,
                "none: no site's floor has kept rising",
                theme::dim_style(),
            );
            return;
        }
        let held_style = Style::new().fg(Color::Red);
        for s in self.suspects {
            if y >= area.height {
                return;
            }
            let cells = [
                s.tag.clone(),
                human_bytes(s.live_bytes),
                format!("+{}", human_bytes(s.growth_bytes_per_window)),
                s.windows_growing.to_string(),
                format!("w{}", s.first_seen),
            ];
            row(
                buf,
                area,
                y,
                &SUSPECT_COLS,
                &cols,
                &cells,
                theme::alert_style(),
            );
            y += 1;
            for held in &s.retained_with {
                if y >= area.height {
                    return;
                }
                let cells = [
                    format!("  ↳ holds {}", held.tag),
                    human_bytes(held.live_bytes),
                    format!("+{}", human_bytes(held.growth_bytes_per_window)),
                    String::new(),
                    String::new(),
                ];
                row(buf, area, y, &SUSPECT_COLS, &cols, &cells, held_style);
                y += 1;
            }
        }
    }

    fn render_mark(&self, area: Rect, buf: &mut Buffer) {
        let Some(diff) = self.since_mark else {
            return;
        };
        if diff.is_empty() {
            put(
                buf,
                area,
                0,
                "since mark: nothing new is alive",
                theme::dim_style(),
            );
            return;
        }
        for (i, d) in diff.iter().take(usize::from(area.height)).enumerate() {
            let prefix = if i == 0 {
                "since mark: "
            } else {
                "            "
            };
            let text = format!(
                "{prefix}+{} in {} block{} at {}",
                human_bytes(d.bytes),
                d.blocks,
                if d.blocks == 1 { "" } else { "s" },
                d.tag
            );
            put(buf, area, i as u16, &text, Style::new().fg(Color::Yellow));
        }
    }

    fn render_tables(&self, area: Rect, buf: &mut Buffer) {
        if area.width >= SPLIT_MIN_WIDTH {
            let left_width = area.width / 2;
            let sites = Rect::new(area.x, area.y, left_width.saturating_sub(1), area.height);
            self.render_sites(sites, buf);
            for y in 0..area.height {
                put(
                    buf,
                    Rect::new(area.x + left_width - 1, area.y + y, 1, 1),
                    0,
                    "│",
                    theme::dim_style(),
                );
            }
            let oldest = Rect::new(
                area.x + left_width,
                area.y,
                area.width - left_width,
                area.height,
            );
            self.render_oldest(oldest, buf);
        } else if area.height >= 2 * MIN_TABLE_ROWS {
            // Each table as tall as its rows when both fit, else halves with the spare
            // rows of a short one going to the other.
            let h = area.height;
            let want_top = clamp_rows(1 + self.sites.len().max(1));
            let want_bottom = clamp_rows(1 + self.oldest.len().max(1));
            let top = if want_top.saturating_add(want_bottom) <= h {
                want_top
            } else {
                h.div_ceil(2)
                    .max(h.saturating_sub(want_bottom))
                    .min(want_top)
                    .clamp(MIN_TABLE_ROWS, h - MIN_TABLE_ROWS)
            };
            self.render_sites(
                Rect {
                    height: top,
                    ..area
                },
                buf,
            );
            self.render_oldest(
                Rect {
                    y: area.y + top,
                    height: area.height - top,
                    ..area
                },
                buf,
            );
        } else {
            self.render_sites(area, buf);
        }
    }

    fn render_sites(&self, area: Rect, buf: &mut Buffer) {
        let cols = fit(&SITE_COLS, area.width);
        header(buf, area, &SITE_COLS, &cols);
        if self.sites.is_empty() {
            put(buf, area, 1, "no live memory", theme::dim_style());
            return;
        }
        for (i, site) in self.sites.iter().enumerate() {
            let y = i as u16 + 1;
            if y >= area.height {
                break;
            }
            let suspect = self.suspects.iter().any(|s| s.tag == site.tag);
            let style = if suspect {
                Style::new().fg(Color::Red)
            } else {
                Style::new()
            };
            let cells = [
                site.tag.clone(),
                human_bytes(site.live_bytes),
                site.live_blocks.to_string(),
                trend(&site.floors, usize::from(TREND_WIDTH)),
            ];
            row(buf, area, y, &SITE_COLS, &cols, &cells, style);
        }
    }

    fn render_oldest(&self, area: Rect, buf: &mut Buffer) {
        let cols = fit(&OLDEST_COLS, area.width);
        header(buf, area, &OLDEST_COLS, &cols);
        if self.oldest.is_empty() {
            put(buf, area, 1, "no live blocks", theme::dim_style());
            return;
        }
        for (i, b) in self.oldest.iter().enumerate() {
            let y = i as u16 + 1;
            if y >= area.height {
                break;
            }
            let cells = [
                format!("#{}", b.id),
                b.tag_name.clone(),
                human_bytes(b.size),
                theme::human_age(b.age_ns),
            ];
            row(buf, area, y, &OLDEST_COLS, &cols, &cells, Style::new());
        }
    }

    fn render_processes(&self, area: Rect, buf: &mut Buffer) {
        let cols = fit(&PROCESS_COLS, area.width);
        header(buf, area, &PROCESS_COLS, &cols);
        let mut y = 1;
        if self.processes.is_empty() {
            put(buf, area, y, "no process memory listed", theme::dim_style());
            y += 1;
        }
        for p in self.processes {
            if y >= area.height {
                return;
            }
            let cells = [
                p.pid.to_string(),
                human_bytes(p.current_bytes),
                human_bytes(p.high_water_bytes),
                slope_text(p.slope_bytes_per_s),
                if p.growing { "growing" } else { "" }.to_string(),
            ];
            let style = if p.growing {
                theme::alert_style()
            } else {
                Style::new()
            };
            row(buf, area, y, &PROCESS_COLS, &cols, &cells, style);
            y += 1;
        }
        if let Some(u) = self.unattributed {
            if y < area.height {
                let (text, style) = unattributed_text(u, self.unattributed_threshold);
                put(buf, area, y, &text, style);
            }
        }
    }
}

fn clamp_rows(rows: usize) -> u16 {
    u16::try_from(rows).unwrap_or(u16::MAX)
}

fn unattributed_text(u: &UnattributedTrend, threshold: Option<u64>) -> (String, Style) {
    let now = u.current_bytes.map_or_else(|| NA.to_string(), human_bytes);
    let limit = threshold.map_or_else(String::new, |t| format!(" {}", human_bytes(t)));
    if u.flagged {
        (
            format!("unattributed {now}, above{limit} for {} samples", u.samples),
            theme::alert_style(),
        )
    } else {
        (format!("unattributed {now}"), theme::dim_style())
    }
}

fn slope_text(slope: Option<f64>) -> String {
    match slope {
        None => NA.to_string(),
        Some(s) if !s.is_finite() => NA.to_string(),
        Some(s) => {
            let sign = if s < 0.0 { "-" } else { "+" };
            format!("{sign}{}/s", human_bytes(s.abs().round() as u64))
        }
    }
}

/// The last `width` floors as lower-eighth bars between their least and greatest.
fn trend(floors: &[u64], width: usize) -> String {
    let shown = &floors[floors.len().saturating_sub(width)..];
    let (Some(&lo), Some(&hi)) = (shown.iter().min(), shown.iter().max()) else {
        return String::new();
    };
    shown
        .iter()
        .map(|&f| {
            let level = if hi == lo {
                1
            } else {
                1 + ((f - lo) as u128 * 7 / (hi - lo) as u128) as usize
            };
            theme::LOWER_EIGHTHS[level.min(8)]
        })
        .collect()
}

/// Columns that fit in `total`, in order, with their widths: the site column gets the
/// rest, and fixed columns go from the right until it has `MIN_SITE_WIDTH`.
fn fit(cols: &[Col], total: u16) -> Vec<(usize, u16)> {
    let mut kept: Vec<usize> = (0..cols.len()).collect();
    loop {
        let fixed: u16 = kept.iter().map(|&i| cols[i].width).sum();
        let flex = total.saturating_sub(fixed);
        let droppable = kept.iter().rposition(|&i| cols[i].width > 0 && i > 0);
        match droppable {
            Some(pos) if flex < MIN_SITE_WIDTH => {
                kept.remove(pos);
            }
            _ => {
                let mut left = total;
                return kept
                    .into_iter()
                    .map(|i| {
                        let want = if cols[i].width == 0 {
                            flex
                        } else {
                            cols[i].width
                        };
                        let width = want.min(left);
                        left -= width;
                        (i, width)
                    })
                    .collect();
            }
        }
    }
}

fn header(buf: &mut Buffer, area: Rect, cols: &[Col], kept: &[(usize, u16)]) {
    let titles: Vec<String> = cols.iter().map(|c| c.title.to_string()).collect();
    let style = theme::label_style().add_modifier(Modifier::BOLD);
    row(buf, area, 0, cols, kept, &titles, style);
}

/// One row of cells at `y` inside `area`; every column but the first keeps a blank
/// column on its left, so neighbours never run together.
fn row(
    buf: &mut Buffer,
    area: Rect,
    y: u16,
    cols: &[Col],
    kept: &[(usize, u16)],
    cells: &[String],
    style: Style,
) {
    if y >= area.height {
        return;
    }
    let mut x = area.x;
    for (n, &(i, width)) in kept.iter().enumerate() {
        let gap = u16::from(n > 0).min(width);
        let inner = usize::from(width - gap);
        let text = cells.get(i).map_or("", String::as_str);
        let cell = truncate(text, inner);
        let cell = if cols[i].right {
            format!("{cell:>inner$}")
        } else {
            cell
        };
        put(
            buf,
            Rect::new(x + gap, area.y + y, width - gap, 1),
            0,
            &cell,
            style,
        );
        x += width;
    }
}

/// Text clipped to one row of `area`, never outside it.
fn put(buf: &mut Buffer, area: Rect, y: u16, text: &str, style: Style) {
    let area = area.intersection(buf.area);
    if y < area.height && area.width > 0 {
        buf.set_stringn(area.x, area.y + y, text, usize::from(area.width), style);
    }
}

impl Widget for LeaksView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        (&self).render(area, buf);
    }
}

impl Widget for &LeaksView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let area = area.intersection(buf.area);
        let inner = match &self.block {
            Some(block) => {
                let inner = block.inner(area);
                block.clone().render(area, buf);
                inner
            }
            None => area,
        };
        if inner.width == 0 || inner.height == 0 {
            return;
        }
        if inner.height < MIN_TABLE_ROWS {
            self.render_summary(inner, buf);
            return;
        }
        for (section, rect) in self.plan(inner) {
            match section {
                Section::Suspects => self.render_suspects(rect, buf),
                Section::Mark => self.render_mark(rect, buf),
                Section::Tables => self.render_tables(rect, buf),
                Section::Processes => self.render_processes(rect, buf),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trends_scale_between_least_and_greatest() {
        assert_eq!(trend(&[0, 1, 2, 3, 4, 5, 6, 7], 8), "▁▂▃▄▅▆▇█");
        assert_eq!(trend(&[5, 5, 5], 8), "▁▁▁");
        assert_eq!(trend(&[9, 0, 7], 2), "▁█");
        assert_eq!(trend(&[], 8), "");
    }

    #[test]
    fn columns_drop_from_the_right_to_keep_the_site_readable() {
        let all = fit(&SUSPECT_COLS, 120);
        assert_eq!(all.len(), 5);
        assert_eq!(all[0].1, 120 - 11 - 12 - 9 - 12);
        let narrow = fit(&SUSPECT_COLS, 40);
        assert!(narrow.len() < 5);
        assert!(narrow[0].1 >= MIN_SITE_WIDTH);
        let tiny = fit(&SUSPECT_COLS, 3);
        assert_eq!(tiny, [(0, 3)]);
    }

    #[test]
    fn slopes_carry_a_sign() {
        assert_eq!(slope_text(Some(8.0 * 1048576.0)), "+8.0 MiB/s");
        assert_eq!(slope_text(Some(-512.0)), "-512 B/s");
        assert_eq!(slope_text(None), "N/A");
        assert_eq!(slope_text(Some(f64::NAN)), "N/A");
    }
}
