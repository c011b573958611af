//! Screens as a terminal recording: each drawn buffer serialised to ANSI (cursor home,
//! each row positioned, SGR codes where the style changes) and written as an asciicast
//! v2 file (https://docs.asciinema.org/manual/asciicast/v2/): a header object, then one
//! `[seconds, "o", data]` event per frame that differs from the one before.

use std::fmt::Write as _;
use std::io::Write;

use ratatui::buffer::{Buffer, CellDiffOption};
use ratatui::style::{Color, Modifier};
use unicode_width::UnicodeWidthStr;

/// The ANSI text that paints `buf` on a terminal of its size, from any state: every row
/// is positioned explicitly, so nothing depends on line wrapping.
pub fn buffer_to_ansi(buf: &Buffer) -> String {
    let mut out = String::with_capacity(buf.content.len() * 2);
    out.push_str("\x1b[0m\x1b[H");
    let area = buf.area;
    for y in 0..area.height {
        let _ = write!(out, "\x1b[{};1H", y + 1);
        let mut current: Option<(Color, Color, Modifier)> = None;
        let mut skip = 0usize;
        for x in 0..area.width {
            let cell = &buf[(area.x + x, area.y + y)];
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if cell.diff_option == CellDiffOption::Skip {
                // Someone else paints this cell: step over it.
                out.push_str("\x1b[1C");
                continue;
            }
            let style = (cell.fg, cell.bg, cell.modifier);
            if current != Some(style) {
                out.push_str(&sgr(cell.fg, cell.bg, cell.modifier));
                current = Some(style);
            }
            let symbol = cell.symbol();
            out.push_str(symbol);
            skip = symbol.width().saturating_sub(1);
        }
        out.push_str("\x1b[0m");
    }
    out
}

/// One SGR sequence that resets and then sets exactly this style.
fn sgr(fg: Color, bg: Color, modifier: Modifier) -> String {
    let mut codes = vec!["0".to_string()];
    for (flag, code) in [
        (Modifier::BOLD, "1"),
        (Modifier::DIM, "2"),
        (Modifier::ITALIC, "3"),
        (Modifier::UNDERLINED, "4"),
        (Modifier::SLOW_BLINK, "5"),
        (Modifier::RAPID_BLINK, "6"),
        (Modifier::REVERSED, "7"),
        (Modifier::HIDDEN, "8"),
        (Modifier::CROSSED_OUT, "9"),
    ] {
        if modifier.contains(flag) {
            codes.push(code.to_string());
        }
    }
    if let Some(c) = color_code(fg, false) {
        codes.push(c);
    }
    if let Some(c) = color_code(bg, true) {
        codes.push(c);
    }
    format!("\x1b[{}m", codes.join(";"))
}

fn color_code(color: Color, background: bool) -> Option<String> {
    let base = if background { 40 } else { 30 };
    let bright = if background { 100 } else { 90 };
    let named = |i: u8, light: bool| Some(format!("{}", if light { bright } else { base } + i));
    match color {
        Color::Reset => None,
        Color::Black => named(0, false),
        Color::Red => named(1, false),
        Color::Green => named(2, false),
        Color::Yellow => named(3, false),
        Color::Blue => named(4, false),
        Color::Magenta => named(5, false),
        Color::Cyan => named(6, false),
        Color::Gray => named(7, false),
        Color::DarkGray => named(0, true),
        Color::LightRed => named(1, true),
        Color::LightGreen => named(2, true),
        Color::LightYellow => named(3, true),
        Color::LightBlue => named(4, true),
        Color::LightMagenta => named(5, true),
        Color::LightCyan => named(6, true),
        Color::White => named(7, true),
        Color::Indexed(i) => Some(format!("{};5;{i}", base + 8)),
        Color::Rgb(r, g, b) => Some(format!("{};2;{r};{g};{b}", base + 8)),
    }
}

/// Writes frames to an asciicast v2 stream as they are drawn.
pub struct CastRecorder<W: Write> {
    out: W,
    last: Option<Buffer>,
    last_time: f64,
}

impl<W: Write> CastRecorder<W> {
    /// Writes the header line. `timestamp` is Unix seconds; `title` names the recording.
    pub fn new(
        mut out: W,
        width: u16,
        height: u16,
        timestamp: u64,
        title: &str,
    ) -> std::io::Result<Self> {
        // Written by hand to keep the keys in the order the format's documentation uses.
        let title = serde_json::Value::from(title);
        writeln!(
            out,
            "{{\"version\": 2, \"width\": {width}, \"height\": {height}, \"timestamp\": {timestamp}, \"title\": {title}, \"env\": {{\"TERM\": \"xterm-256color\"}}}}"
        )?;
        Ok(CastRecorder {
            out,
            last: None,
            last_time: 0.0,
        })
    }

    /// Records `buf` at `time_s` seconds from the start, unless it shows what the last
    /// frame showed. Times never go backwards in the file. Returns whether it wrote.
    pub fn frame(&mut self, time_s: f64, buf: &Buffer) -> std::io::Result<bool> {
        if self.last.as_ref() == Some(buf) {
            return Ok(false);
        }
        let mut data = String::new();
        if self.last.as_ref().is_none_or(|l| l.area != buf.area) {
            // First frame or a new size: start from a clean screen without a cursor.
            data.push_str("\x1b[?25l\x1b[2J");
        }
        data.push_str(&buffer_to_ansi(buf));
        let time = if time_s.is_finite() {
            time_s.max(self.last_time)
        } else {
            self.last_time
        };
        let event = serde_json::json!([(time * 1e6).round() / 1e6, "o", data]);
        writeln!(self.out, "{event}")?;
        self.last = Some(buf.clone());
        self.last_time = time;
        Ok(true)
    }

    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::layout::Rect;
    use ratatui::style::Style;

    #[test]
    fn ansi_positions_rows_and_colours_runs() {
        let mut buf = Buffer::empty(Rect::new(0, 0, 3, 2));
        buf.set_string(0, 0, "ab", Style::new().fg(Color::Red));
        let ansi = buffer_to_ansi(&buf);
        assert!(
            ansi.starts_with("\x1b[0m\x1b[H\x1b[1;1H\x1b[0;31mab\x1b[0m "),
            "{ansi:?}"
        );
        assert!(ansi.contains("\x1b[2;1H"));
    }

    #[test]
    fn unchanged_frames_are_not_written() {
        let buf = Buffer::empty(Rect::new(0, 0, 2, 1));
        let mut rec = CastRecorder::new(Vec::new(), 2, 1, 0, "t").unwrap_or_else(|e| panic!("{e}"));
        assert!(rec.frame(0.5, &buf).unwrap_or(false));
        assert!(!rec.frame(0.7, &buf).unwrap_or(true));
        let out = rec.finish().unwrap_or_default();
        assert_eq!(String::from_utf8_lossy(&out).lines().count(), 2);
    }
}
