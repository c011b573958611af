//! The presenter screen of talk mode, drawn from a borrowed `DemoView`: three big
//! figures, the caption, what the last request came to, and the block map. Laid out to
//! read at 80x24; from `BIG_MIN_WIDTH`x`BIG_MIN_HEIGHT` (a projector at a large font
//! still leaves that much) the figures double in height.
//!
//! ```text
//!  vramtop demo · Out of memory, with memory free      act 1/2 caching · step 4/4  TITLE
//!  FREE of 120.0 MiB          LARGEST FREE RUN           FRAGMENTATION             FIGURES
//!  ██████ ██████              ██  ██                     ██████ ██████ ██  ██        label row,
//!  ██     ██  ██              ██  ██                     ██  ██     ██     ██        then 5 rows
//!  ██████ ██  ██              ██████                     ██████ ██████   ██          of pixels
//!  ██  ██ ██  ██                  ██                         ██     ██ ██            (x2 when
//!  ██████ ██████ MiB              ██ MiB                 ██████ ██████ ██  ██        large)
//!                                                                                  GAP
//!  ▌ Ask for 24 MiB, less than half of what is free: out of memory. No hole is     CAPTION
//!  ▌ larger than 4 MiB, and there is no room for a new segment.                      1-3 rows
//!   ✗ OUT OF MEMORY  asked 24.0 MiB · free 60.0 MiB · largest 4.0 MiB              OUTCOME
//!  block map · caching · bookkeeping 120.0 MiB ─────────────────────────────────   MAP (rest)
//! 0x7f0000000000   20M ════════████████········████████········
//! 0x7f0001400000   20M ████████········████████········████████
//! 1 cell = 512 KiB  █ used  ▌ part  ░ pending  · free  ═ largest free  ╌ unmapped
//!  → next step               space pause  →/n next  ←/p back  +/- speed  r restart  STATUS
//! ```
//!
//! Colours come from the dark palette; `Palette::apply` then maps the finished buffer
//! to the chosen theme or strips colours for NO_COLOR.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Widget, Wrap};
use ratatui::Frame;

use super::bigdigits::{BigText, GLYPH_ROWS};
use super::blockmap::{BlockMap, LEGEND_ROWS};
use super::screen_theme::Palette;
use super::theme;
use crate::demo::keys::DEMO_BINDINGS;
use crate::demo::player::{DemoView, PlayState, RequestOutcome};
use vramtop_alloc::{human_bytes, Layout as AllocLayout, Pool, SegmentLayout};

pub const TITLE_ROWS: u16 = 1;
pub const GAP_ROWS: u16 = 1;
pub const MAX_CAPTION_ROWS: u16 = 3;
pub const OUTCOME_ROWS: u16 = 1;
pub const STATUS_ROWS: u16 = 1;
/// Figures double in size from this terminal size on.
pub const BIG_MIN_WIDTH: u16 = 110;
pub const BIG_MIN_HEIGHT: u16 = 36;
/// Below this the screen asks to be enlarged instead of drawing a mess.
pub const MIN_WIDTH: u16 = 50;
pub const MIN_HEIGHT: u16 = 16;
/// From this many map rows on, the story's scale is fitted to half of them.
const TALL_MAP_ROWS: u16 = 16;
/// Columns left of the caption for its marker.
const CAPTION_INDENT: u16 = 3;

const TITLE_STYLE: Style = Style::new()
    .fg(Color::Black)
    .bg(Color::Cyan)
    .add_modifier(Modifier::BOLD);
const FREE_COLOR: Color = Color::Cyan;
const LARGEST_COLOR: Color = Color::Green;

/// What the runtime adds to the view: the theme and a passing message.
#[derive(Clone, Debug, Default)]
pub struct Chrome {
    pub palette: Palette,
    /// A one-line message for the status row, such as where an SVG went.
    pub message: Option<String>,
}

pub fn draw(frame: &mut Frame, view: &DemoView, chrome: &Chrome) {
    let area = frame.area();
    render(area, frame.buffer_mut(), view, chrome);
}

/// Draws the whole presenter screen into `buf` (also used headless and for pictures).
pub fn render(area: Rect, buf: &mut Buffer, view: &DemoView, chrome: &Chrome) {
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "vramtop demo: terminal {}x{} is too small; enlarge to at least {MIN_WIDTH}x{MIN_HEIGHT} (q quits)",
            area.width, area.height
        );
        Paragraph::new(text)
            .wrap(Wrap { trim: true })
            .style(Style::new().fg(Color::Yellow))
            .render(area, buf);
        chrome.palette.apply(buf);
        return;
    }
    let pixel_h = if area.width >= BIG_MIN_WIDTH && area.height >= BIG_MIN_HEIGHT {
        2
    } else {
        1
    };
    let caption_lines = wrap(&view.caption, area.width.saturating_sub(CAPTION_INDENT + 1));
    let caption_rows = (caption_lines.len() as u16).clamp(1, MAX_CAPTION_ROWS);
    let [title, figures, _gap, caption, outcome, map, status] = Layout::vertical([
        Constraint::Length(TITLE_ROWS),
        Constraint::Length(1 + GLYPH_ROWS * pixel_h),
        Constraint::Length(GAP_ROWS),
        Constraint::Length(caption_rows),
        Constraint::Length(OUTCOME_ROWS),
        Constraint::Min(0),
        Constraint::Length(STATUS_ROWS),
    ])
    .areas(area);
    render_title(title, buf, view);
    render_figures(figures, buf, view, pixel_h);
    render_caption(caption, buf, &caption_lines);
    render_outcome(outcome, buf, view);
    let block = Block::new()
        .borders(Borders::TOP)
        .border_style(theme::dim_style())
        .title(Span::styled(
            format!(
                " block map · {} · {} ",
                view.acts[view.act].policy, view.backing_label
            ),
            Style::new().add_modifier(Modifier::BOLD),
        ));
    let scale = story_scale(view, map, &block);
    BlockMap::new(&view.layout)
        .block(block)
        .scale(scale)
        .render(map, buf);
    render_status(status, buf, view, chrome);
    chrome.palette.apply(buf);
}

/// One cell stands for the same bytes in every act, so acts compare at a glance: the
/// scale that fits twice the device (what expandable reserves) in one range, unless
/// this act's own layout needs a coarser one. A tall map fits it in half its rows:
/// coarser cells read better from the back of a room, and segments keep to one row.
fn story_scale(view: &DemoView, area: Rect, block: &Block) -> u64 {
    let fit_area = if area.height >= TALL_MAP_ROWS {
        // Half the rows of bands; the border and legend rows come on top.
        let chrome = area.height - block.inner(area).height + LEGEND_ROWS;
        Rect {
            height: (area.height - chrome) / 2 + chrome,
            ..area
        }
    } else {
        area
    };
    let twice_the_device = AllocLayout {
        policy: None,
        capacity: view.capacity,
        segments: vec![SegmentLayout {
            addr: view
                .layout
                .segments
                .first()
                .map_or(0x7f00_0000_0000, |s| s.addr),
            size: view.capacity.saturating_mul(2),
            pool: Pool::Range,
            stream: None,
            runs: Vec::new(),
        }],
        tags: Vec::new(),
        generation: 0,
    };
    let story = BlockMap::new(&twice_the_device)
        .block(block.clone())
        .fitted_bytes_per_cell(fit_area);
    let own = BlockMap::new(&view.layout)
        .block(block.clone())
        .fitted_bytes_per_cell(area);
    story.max(own)
}

fn render_title(area: Rect, buf: &mut Buffer, view: &DemoView) {
    buf.set_style(area, TITLE_STYLE);
    let act = &view.acts[view.act];
    let right = format!(
        " act {}/{} {} · step {}/{} ",
        view.act + 1,
        view.acts.len(),
        act.policy,
        view.step_in_act + 1,
        view.steps_in_act
    );
    let right_width = right.chars().count() as u16;
    let left = format!(" vramtop demo · {}", view.story_title);
    let left_width = area.width.saturating_sub(right_width + 1);
    buf.set_stringn(area.x, area.y, left, usize::from(left_width), TITLE_STYLE);
    if right_width <= area.width {
        buf.set_string(area.right() - right_width, area.y, right, TITLE_STYLE);
    }
}

/// A byte count as a figure and its unit: "60" "MiB", "1.5" "GiB".
pub fn figure_bytes(bytes: u64) -> (String, &'static str) {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let number = if value >= 9.95 || value.fract() < 0.05 || value.fract() > 0.95 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    };
    (number, UNITS[unit])
}

struct Figure {
    label: &'static str,
    note: String,
    number: String,
    unit: &'static str,
    color: Color,
}

fn render_figures(area: Rect, buf: &mut Buffer, view: &DemoView, pixel_h: u16) {
    let (free, free_unit) = figure_bytes(view.free_bytes());
    let (largest, largest_unit) = figure_bytes(view.largest_free_bytes());
    let frag = view.fragmentation();
    let figures = [
        Figure {
            label: "FREE",
            note: format!("of {}", human_bytes(view.capacity)),
            number: free,
            unit: free_unit,
            color: FREE_COLOR,
        },
        Figure {
            label: "LARGEST FREE RUN",
            note: "in one piece".to_string(),
            number: largest,
            unit: largest_unit,
            color: LARGEST_COLOR,
        },
        Figure {
            label: "FRAGMENTATION",
            note: "1 - largest/free".to_string(),
            number: format!("{:.0}%", frag * 100.0),
            unit: "",
            color: theme::severity_color(frag),
        },
    ];
    let columns = Layout::horizontal([Constraint::Ratio(1, 3); 3])
        .spacing(1)
        .split(area);
    let room = columns
        .iter()
        .map(|c| c.width)
        .min()
        .unwrap_or(0)
        .saturating_sub(1);
    let pixel = pixel_size(view, pixel_h, room);
    for (figure, column) in figures.iter().zip(columns.iter()) {
        render_figure(*column, buf, figure, pixel);
    }
}

/// Square pixels (twice as wide as tall, as terminal cells are) when the widest figure
/// the story can show fits `room` columns with its unit, else narrower ones. Chosen for
/// the whole story, so the figures keep their size from step to step.
fn pixel_size(view: &DemoView, pixel_h: u16, room: u16) -> (u16, u16) {
    let (widest, unit) = figure_bytes(view.capacity);
    let fits = |w: u16| {
        let digits = BigText::new(&widest).pixel(w, pixel_h).width();
        let unit = unit.chars().count() as u16 + 1;
        digits + unit <= room && BigText::new("99%").pixel(w, pixel_h).width() <= room
    };
    let w = [2 * pixel_h, pixel_h + pixel_h.div_ceil(2)]
        .into_iter()
        .find(|&w| fits(w))
        .unwrap_or(pixel_h);
    (w, pixel_h)
}

fn render_figure(area: Rect, buf: &mut Buffer, figure: &Figure, pixel: (u16, u16)) {
    let [label, digits] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let mut spans = vec![Span::styled(
        format!(" {}", figure.label),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    // The note goes whole or not at all: half a note reads as a typo.
    if figure.label.chars().count() + figure.note.chars().count() + 2 <= usize::from(label.width) {
        spans.push(Span::styled(
            format!(" {}", figure.note),
            theme::dim_style(),
        ));
    }
    let line = Line::from(spans);
    buf.set_line(label.x, label.y, &line, label.width);
    let style = Style::new().fg(figure.color).add_modifier(Modifier::BOLD);
    let digits = Rect {
        x: digits.x + 1,
        width: digits.width.saturating_sub(1),
        ..digits
    };
    let big = BigText::new(&figure.number)
        .pixel(pixel.0, pixel.1)
        .style(style);
    let unit_width = figure.unit.chars().count() as u16 + 1;
    if big.width() + unit_width > digits.width || big.height() > digits.height {
        // Too narrow for the block font: the same figure in plain bold.
        let text = format!("{} {}", figure.number, figure.unit);
        buf.set_stringn(digits.x, digits.y, text, usize::from(digits.width), style);
        return;
    }
    let width = big.width();
    let bottom = digits.y + big.height() - 1;
    big.render(digits, buf);
    buf.set_string(digits.x + width + 1, bottom, figure.unit, style);
}

/// Greedy word wrap to `width` columns.
pub fn wrap(text: &str, width: u16) -> Vec<String> {
    let width = usize::from(width.max(1));
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let len = line.chars().count();
        if len > 0 && len + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

fn render_caption(area: Rect, buf: &mut Buffer, lines: &[String]) {
    let marker = Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD);
    let text = Style::new().fg(Color::White).add_modifier(Modifier::BOLD);
    for (row, line) in lines.iter().take(usize::from(area.height)).enumerate() {
        let y = area.y + row as u16;
        buf.set_string(area.x + 1, y, "▌", marker);
        let last = row + 1 == usize::from(area.height) && lines.len() > usize::from(area.height);
        let shown = if last {
            format!("{line} …")
        } else {
            line.clone()
        };
        buf.set_stringn(
            area.x + CAPTION_INDENT,
            y,
            shown,
            usize::from(area.width.saturating_sub(CAPTION_INDENT)),
            text,
        );
    }
}

fn outcome_spans(outcome: &RequestOutcome) -> Vec<Span<'static>> {
    match outcome {
        RequestOutcome::OutOfMemory(oom) => vec![
            Span::styled(
                " ✗ OUT OF MEMORY ",
                Style::new()
                    .fg(Color::White)
                    .bg(Color::Red)
                    .add_modifier(Modifier::BOLD),
            ),
            Span::styled(
                format!(
                    " asked {} · free {} · largest {}",
                    human_bytes(oom.requested_bytes),
                    human_bytes(oom.total_free_bytes),
                    human_bytes(oom.largest_free_bytes)
                ),
                theme::alert_style(),
            ),
        ],
        RequestOutcome::Placed { bytes } => vec![
            Span::styled(
                " ✓ FITS ",
                Style::new()
                    .fg(Color::Black)
                    .bg(Color::Green)
                    .add_modifier(Modifier::BOLD),
            ),
            Span::styled(
                format!(" {} placed in one piece", human_bytes(*bytes)),
                Style::new().fg(Color::Green).add_modifier(Modifier::BOLD),
            ),
        ],
    }
}

/// The request's outcome, or, between requests, how each act has come out so far.
fn render_outcome(area: Rect, buf: &mut Buffer, view: &DemoView) {
    let spans = match &view.outcome {
        Some(outcome) => {
            let mut spans = vec![Span::raw(" ")];
            spans.extend(outcome_spans(outcome));
            spans
        }
        None => {
            let mut spans = Vec::new();
            for (i, act) in view.acts.iter().enumerate() {
                let (mark, style) = match &act.outcome {
                    Some(RequestOutcome::OutOfMemory(_)) => {
                        ("✗ out of memory", theme::alert_style())
                    }
                    Some(RequestOutcome::Placed { .. }) => (
                        "✓ fits",
                        Style::new().fg(Color::Green).add_modifier(Modifier::BOLD),
                    ),
                    None if i == view.act => ("▶ now", Style::new().add_modifier(Modifier::BOLD)),
                    None => ("· to come", theme::dim_style()),
                };
                spans.push(Span::styled(
                    format!("  act {} {}: ", i + 1, act.policy),
                    theme::label_style(),
                ));
                spans.push(Span::styled(mark, style));
            }
            spans
        }
    };
    buf.set_line(area.x, area.y, &Line::from(spans), area.width);
}

fn speed_label(speed: f64) -> String {
    if speed >= 1.0 {
        format!("×{speed:.0}")
    } else {
        format!("×1/{:.0}", 1.0 / speed)
    }
}

fn render_status(area: Rect, buf: &mut Buffer, view: &DemoView, chrome: &Chrome) {
    let badge = |text: String, bg: Color| {
        Span::styled(
            text,
            Style::new()
                .fg(Color::Black)
                .bg(bg)
                .add_modifier(Modifier::BOLD),
        )
    };
    let state = match view.state {
        PlayState::Finished => badge(" ■ the end: r restarts ".to_string(), Color::Cyan),
        _ if view.paused => badge(" ❚❚ paused ".to_string(), Color::Yellow),
        PlayState::Waiting => badge(" → next step ".to_string(), Color::Green),
        PlayState::Holding { left_s } => badge(
            format!(
                " ▶ next in {:.0} s {} ",
                left_s.ceil(),
                speed_label(view.speed)
            ),
            Color::Green,
        ),
        PlayState::Running => badge(
            format!(" ▶ playing {} ", speed_label(view.speed)),
            Color::Green,
        ),
    };
    let mut left = vec![state];
    if let Some(message) = &chrome.message {
        left.push(Span::styled(
            format!(" {message}"),
            Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        ));
    }
    let left_width: usize = left.iter().map(Span::width).sum();
    buf.set_line(area.x, area.y, &Line::from(left), area.width);
    // Key hints, right-aligned, as many as fit whole after the state and message.
    let mut hints: Vec<Span> = Vec::new();
    let mut width = 0usize;
    let room = usize::from(area.width).saturating_sub(left_width + 1);
    for b in DEMO_BINDINGS.iter().filter(|b| !b.keys.is_empty()) {
        let w = b.keys.chars().count() + b.hint.chars().count() + 3;
        if width + w > room {
            break;
        }
        width += w;
        hints.push(Span::styled(
            format!("  {}", b.keys),
            Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD),
        ));
        hints.push(Span::styled(format!(" {}", b.hint), theme::label_style()));
    }
    let x = area.right().saturating_sub(width as u16);
    buf.set_line(x, area.y, &Line::from(hints), width as u16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_short() {
        assert_eq!(figure_bytes(60 << 20), ("60".to_string(), "MiB"));
        assert_eq!(figure_bytes(4 << 20), ("4".to_string(), "MiB"));
        assert_eq!(figure_bytes(3 << 29), ("1.5".to_string(), "GiB"));
        assert_eq!(figure_bytes(0), ("0".to_string(), "B"));
    }

    #[test]
    fn wrap_keeps_words_whole() {
        assert_eq!(wrap("one two three", 7), ["one two", "three"]);
        assert_eq!(wrap("", 5), [""]);
    }
}
