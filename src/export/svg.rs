//! Screens as pictures for slides: a drawn buffer as an SVG of monospace text, one
//! `<tspan>` per run of cells of one style and one `<rect>` per run of one background,
//! on a cell grid so block characters line up whatever the viewer's font.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};
use unicode_width::UnicodeWidthStr;

/// Cell size in SVG user units (pixels): a 14 px monospace font.
pub const CELL_WIDTH: f64 = 8.4;
pub const CELL_HEIGHT: f64 = 17.0;
pub const FONT_SIZE: f64 = 14.0;
const FONT_FAMILY: &str = "'DejaVu Sans Mono', 'Menlo', 'Consolas', 'Liberation Mono', monospace";

/// The 16 ANSI colours as CSS, in the order of `Color::Indexed(0..16)`.
const ANSI: [&str; 16] = [
    "#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
    "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff",
];

/// A colour as CSS; `None` for `Reset` (the default colour).
pub fn css_color(color: Color) -> Option<String> {
    let ansi = |i: usize| Some(ANSI[i].to_string());
    match color {
        Color::Reset => None,
        Color::Black => ansi(0),
        Color::Red => ansi(1),
        Color::Green => ansi(2),
        Color::Yellow => ansi(3),
        Color::Blue => ansi(4),
        Color::Magenta => ansi(5),
        Color::Cyan => ansi(6),
        Color::Gray => ansi(7),
        Color::DarkGray => ansi(8),
        Color::LightRed => ansi(9),
        Color::LightGreen => ansi(10),
        Color::LightYellow => ansi(11),
        Color::LightBlue => ansi(12),
        Color::LightMagenta => ansi(13),
        Color::LightCyan => ansi(14),
        Color::White => ansi(15),
        Color::Indexed(i) if i < 16 => ansi(usize::from(i)),
        Color::Indexed(i) if i < 232 => {
            // The 6x6x6 cube of xterm's 256 colours.
            let level = |v: u8| if v == 0 { 0 } else { 55 + 40 * u32::from(v) };
            let i = i - 16;
            Some(format!(
                "#{:02x}{:02x}{:02x}",
                level(i / 36),
                level(i / 6 % 6),
                level(i % 6)
            ))
        }
        Color::Indexed(i) => {
            let v = 8 + 10 * u32::from(i - 232);
            Some(format!("#{v:02x}{v:02x}{v:02x}"))
        }
        Color::Rgb(r, g, b) => Some(format!("#{r:02x}{g:02x}{b:02x}")),
    }
}

pub fn escape_xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0; a cell should never hold one.
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Block elements drawn as rectangles rather than glyphs, as (left, width) fractions of
/// a cell: fonts leave gaps between rows of '█', and rectangles tile exactly.
fn block_shape(symbol: &str) -> Option<(f64, f64, f64, f64)> {
    // (x, y, width, height) as fractions of the cell.
    Some(match symbol {
        "█" => (0.0, 0.0, 1.0, 1.0),
        "▉" => (0.0, 0.0, 0.875, 1.0),
        "▊" => (0.0, 0.0, 0.75, 1.0),
        "▋" => (0.0, 0.0, 0.625, 1.0),
        "▌" => (0.0, 0.0, 0.5, 1.0),
        "▍" => (0.0, 0.0, 0.375, 1.0),
        "▎" => (0.0, 0.0, 0.25, 1.0),
        "▏" => (0.0, 0.0, 0.125, 1.0),
        "▐" => (0.5, 0.0, 0.5, 1.0),
        "▀" => (0.0, 0.0, 1.0, 0.5),
        "▄" => (0.0, 0.5, 1.0, 0.5),
        _ => return None,
    })
}

/// A filled shape standing for a block element: cell position, shape, colour.
#[derive(Clone, Debug, PartialEq)]
struct Fill {
    x: u16,
    cells: u16,
    shape: (f64, f64, f64, f64),
    color: String,
}

/// A run of cells on one row with one look.
#[derive(Clone, Debug, PartialEq)]
struct Run {
    x: u16,
    cells: u16,
    text: String,
    fg: String,
    bg: Option<String>,
    modifier: Modifier,
}

/// One row of `buf`: runs of equal style (wide characters taking their cells), and the
/// block elements to fill, merged where equal blocks touch.
#[derive(Default)]
struct Row {
    runs: Vec<Run>,
    fills: Vec<Fill>,
}

fn rows(buf: &Buffer, default_fg: &str) -> Vec<Row> {
    let area = buf.area;
    let mut rows = Vec::with_capacity(usize::from(area.height));
    for y in 0..area.height {
        let mut row = Row::default();
        let mut x = 0u16;
        while x < area.width {
            let cell = &buf[(area.x + x, area.y + y)];
            let mut symbol = cell.symbol();
            let width = (symbol.width().max(1) as u16).min(area.width - x);
            let (mut fg, mut bg) = (cell.fg, cell.bg);
            if cell.modifier.contains(Modifier::REVERSED) {
                std::mem::swap(&mut fg, &mut bg);
            }
            let fg = css_color(fg).unwrap_or_else(|| default_fg.to_string());
            let bg = css_color(bg);
            let modifier = cell.modifier & !Modifier::REVERSED;
            if let Some(shape) = block_shape(symbol) {
                match row.fills.last_mut() {
                    Some(f)
                        if f.x + f.cells == x
                            && f.shape == shape
                            && shape.2 == 1.0
                            && f.color == fg =>
                    {
                        f.cells += width
                    }
                    _ => row.fills.push(Fill {
                        x,
                        cells: width,
                        shape,
                        color: fg.clone(),
                    }),
                }
                symbol = " ";
            }
            let runs = &mut row.runs;
            match runs.last_mut() {
                Some(run) if run.fg == fg && run.bg == bg && run.modifier == modifier => {
                    run.cells += width;
                    run.text.push_str(symbol);
                }
                _ => runs.push(Run {
                    x,
                    cells: width,
                    text: symbol.to_string(),
                    fg,
                    bg,
                    modifier,
                }),
            }
            x += width;
        }
        rows.push(row);
    }
    rows
}

/// Writes `buf` as `dir/stem.svg` (or `stem-2.svg` and on: a picture never overwrites
/// another) and returns where it went; the error names the file it could not write.
pub fn save(
    buf: &Buffer,
    dir: &Path,
    stem: &str,
    (default_fg, default_bg): (&str, &str),
    title: &str,
) -> std::io::Result<PathBuf> {
    let path = free_path(dir, stem);
    match std::fs::write(&path, buffer_to_svg(buf, default_fg, default_bg, title)) {
        Ok(()) => Ok(path),
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("{}: {e}", path.display()),
        )),
    }
}

/// `dir/stem.svg`, or `dir/stem-2.svg` and so on when that exists: never overwrite.
fn free_path(dir: &Path, stem: &str) -> PathBuf {
    let first = dir.join(format!("{stem}.svg"));
    if !first.exists() {
        return first;
    }
    (2u32..)
        .map(|n| dir.join(format!("{stem}-{n}.svg")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

/// The buffer as a standalone SVG document. `default_fg`/`default_bg` are the CSS
/// colours of cells left at `Color::Reset`.
pub fn buffer_to_svg(buf: &Buffer, default_fg: &str, default_bg: &str, title: &str) -> String {
    let width = f64::from(buf.area.width) * CELL_WIDTH;
    let height = f64::from(buf.area.height) * CELL_HEIGHT;
    let mut out = String::new();
    let _ = writeln!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.1} {height:.1}\" font-family=\"{FONT_FAMILY}\" font-size=\"{FONT_SIZE}\" shape-rendering=\"crispEdges\" \
         xml:space=\"preserve\">"
    );
    let _ = writeln!(out, "<title>{}</title>", escape_xml(title));
    let _ = writeln!(
        out,
        "<rect width=\"100%\" height=\"100%\" fill=\"{default_bg}\"/>"
    );
    let rows = rows(buf, default_fg);
    for (y, row) in rows.iter().enumerate() {
        let top = y as f64 * CELL_HEIGHT;
        for run in &row.runs {
            if let Some(bg) = &run.bg {
                let _ = writeln!(
                    out,
                    "<rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{CELL_HEIGHT}\" fill=\"{bg}\"/>",
                    f64::from(run.x) * CELL_WIDTH,
                    f64::from(run.cells) * CELL_WIDTH
                );
            }
        }
        for fill in &row.fills {
            let (fx, fy, fw, fh) = fill.shape;
            let _ = writeln!(
                out,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
                (f64::from(fill.x) + fx) * CELL_WIDTH,
                top + fy * CELL_HEIGHT,
                (f64::from(fill.cells) - 1.0 + fw) * CELL_WIDTH,
                fh * CELL_HEIGHT,
                fill.color
            );
        }
    }
    for (y, row) in rows.iter().enumerate() {
        let spans: Vec<&Run> = row
            .runs
            .iter()
            .filter(|r| !r.text.trim().is_empty())
            .collect();
        if spans.is_empty() {
            continue;
        }
        // Text sits on a baseline about four fifths down the cell.
        let baseline = y as f64 * CELL_HEIGHT + CELL_HEIGHT * 0.78;
        let _ = write!(out, "<text y=\"{baseline:.1}\">");
        for run in spans {
            let _ = write!(
                out,
                "<tspan x=\"{:.1}\" textLength=\"{:.1}\" lengthAdjust=\"spacingAndGlyphs\" fill=\"{}\"{}>{}</tspan>",
                f64::from(run.x) * CELL_WIDTH,
                f64::from(run.cells) * CELL_WIDTH,
                run.fg,
                attributes(run.modifier),
                escape_xml(&run.text)
            );
        }
        let _ = writeln!(out, "</text>");
    }
    out.push_str("</svg>\n");
    out
}

fn attributes(modifier: Modifier) -> String {
    let mut out = String::new();
    if modifier.contains(Modifier::BOLD) {
        out.push_str(" font-weight=\"bold\"");
    }
    if modifier.contains(Modifier::ITALIC) {
        out.push_str(" font-style=\"italic\"");
    }
    if modifier.contains(Modifier::DIM) {
        out.push_str(" opacity=\"0.6\"");
    }
    if modifier.contains(Modifier::UNDERLINED) {
        out.push_str(" text-decoration=\"underline\"");
    }
    if modifier.contains(Modifier::CROSSED_OUT) {
        out.push_str(" text-decoration=\"line-through\"");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::layout::Rect;
    use ratatui::style::Style;

    #[test]
    fn runs_of_one_style_become_one_tspan() {
        let mut buf = Buffer::empty(Rect::new(0, 0, 6, 1));
        buf.set_string(0, 0, "ab", Style::new().fg(Color::Red));
        buf.set_string(2, 0, "<&", Style::new().fg(Color::Red).bg(Color::Blue));
        let svg = buffer_to_svg(&buf, "#eeeeee", "#111111", "t");
        assert_eq!(svg.matches("<tspan").count(), 2, "{svg}");
        assert!(svg.contains(">ab</tspan>"));
        assert!(svg.contains(">&lt;&amp;</tspan>"));
        assert!(svg.contains("fill=\"#2472c8\""));
    }

    #[test]
    fn blocks_become_rectangles() {
        let mut buf = Buffer::empty(Rect::new(0, 0, 4, 1));
        buf.set_string(0, 0, "██▌x", Style::new().fg(Color::Cyan));
        let svg = buffer_to_svg(&buf, "#eeeeee", "#111111", "t");
        assert!(
            svg.contains("width=\"16.8\" height=\"17.0\" fill=\"#11a8cd\""),
            "{svg}"
        );
        assert!(svg.contains("width=\"4.2\""), "{svg}");
        assert!(svg.contains(">   x</tspan>"), "{svg}");
    }

    #[test]
    fn cube_and_grey_colours() {
        assert_eq!(css_color(Color::Indexed(196)).as_deref(), Some("#ff0000"));
        assert_eq!(css_color(Color::Indexed(232)).as_deref(), Some("#080808"));
        assert_eq!(css_color(Color::Reset), None);
    }

    #[test]
    fn pictures_never_overwrite() {
        let dir = std::env::temp_dir().join(format!("vramtop-svg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let buf = Buffer::empty(ratatui::layout::Rect::new(0, 0, 2, 1));
        let colors = ("#eeeeee", "#111111");
        let first = save(&buf, &dir, "s", colors, "t").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first, dir.join("s.svg"));
        let second = save(&buf, &dir, "s", colors, "t").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(second, dir.join("s-2.svg"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
