//! Big figures for the back of the room: numbers drawn in a 3x5 block font of our own
//! (digits, '.', '%', '-'), each pixel `pixel_w` x `pixel_h` cells of full blocks, so
//! they read on any terminal and with NO_COLOR. Draws from a borrowed `&str` only.
//!
//! ```text
//! ██████ ██████     pixel 2x1 (square on a terminal, whose cells are twice as tall as
//! ██  ██     ██     wide): 6 columns and 5 rows per glyph, glyphs `gap` columns apart
//! ██████ ██████     (half a pixel, at least 1). Characters the font lacks are skipped.
//!     ██     ██
//! ██████ ██████
//! ```

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;

pub const GLYPH_ROWS: u16 = 5;
/// Largest pixel side in cells.
pub const MAX_PIXEL: u16 = 8;

/// Rows of a glyph, `#` for a lit pixel. Every row of one glyph has the same width.
fn glyph(c: char) -> Option<[&'static str; 5]> {
    Some(match c {
        '0' => ["###", "# #", "# #", "# #", "###"],
        '1' => [" # ", "## ", " # ", " # ", "###"],
        '2' => ["###", "  #", "###", "#  ", "###"],
        '3' => ["###", "  #", "###", "  #", "###"],
        '4' => ["# #", "# #", "###", "  #", "  #"],
        '5' => ["###", "#  ", "###", "  #", "###"],
        '6' => ["###", "#  ", "###", "# #", "###"],
        '7' => ["###", "  #", "  #", "  #", "  #"],
        '8' => ["###", "# #", "###", "# #", "###"],
        '9' => ["###", "# #", "###", "  #", "###"],
        '.' => [" ", " ", " ", " ", "#"],
        '%' => ["# #", "  #", " # ", "#  ", "# #"],
        '-' => ["   ", "   ", "###", "   ", "   "],
        ' ' => [" ", " ", " ", " ", " "],
        _ => return None,
    })
}

/// A number in the block font.
#[derive(Clone, Debug)]
pub struct BigText<'a> {
    text: &'a str,
    pixel_w: u16,
    pixel_h: u16,
    style: Style,
}

impl<'a> BigText<'a> {
    pub fn new(text: &'a str) -> Self {
        BigText {
            text,
            pixel_w: 1,
            pixel_h: 1,
            style: Style::new(),
        }
    }

    /// Each pixel becomes `w` columns by `h` rows of cells (1 to `MAX_PIXEL` each).
    pub fn pixel(mut self, w: u16, h: u16) -> Self {
        self.pixel_w = w.clamp(1, MAX_PIXEL);
        self.pixel_h = h.clamp(1, MAX_PIXEL);
        self
    }

    /// Blank columns between glyphs.
    fn gap(&self) -> u16 {
        self.pixel_w.div_ceil(2)
    }

    pub fn style(mut self, style: Style) -> Self {
        self.style = style;
        self
    }

    /// Columns the text takes: glyph widths and the gaps between glyphs.
    pub fn width(&self) -> u16 {
        let glyphs: Vec<u16> = self
            .text
            .chars()
            .filter_map(glyph)
            .map(|g| g[0].len() as u16)
            .collect();
        glyphs.iter().sum::<u16>() * self.pixel_w
            + glyphs.len().saturating_sub(1) as u16 * self.gap()
    }

    pub fn height(&self) -> u16 {
        GLYPH_ROWS * self.pixel_h
    }
}

impl Widget for BigText<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let area = area.intersection(buf.area);
        let (pw, ph) = (self.pixel_w, self.pixel_h);
        let gap = self.gap();
        let mut x0 = area.x;
        for g in self.text.chars().filter_map(glyph) {
            let w = g[0].len() as u16;
            for (row, pixels) in g.iter().enumerate() {
                for (col, p) in pixels.bytes().enumerate() {
                    if p != b'#' {
                        continue;
                    }
                    for dy in 0..ph {
                        for dx in 0..pw {
                            let x = x0 + col as u16 * pw + dx;
                            let y = area.y + row as u16 * ph + dy;
                            if x < area.right() && y < area.bottom() {
                                if let Some(cell) = buf.cell_mut((x, y)) {
                                    cell.set_symbol("█").set_style(self.style);
                                }
                            }
                        }
                    }
                }
            }
            x0 = x0.saturating_add(w * pw + gap);
            if x0 >= area.right() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(buf: &Buffer) -> Vec<String> {
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    #[test]
    fn draws_digits_and_a_point() {
        let text = BigText::new("4.5");
        assert_eq!(text.width(), 9);
        let mut buf = Buffer::empty(Rect::new(0, 0, 9, 5));
        text.render(buf.area, &mut buf);
        assert_eq!(
            lines(&buf),
            [
                "█ █   ███",
                "█ █   █  ",
                "███   ███",
                "  █     █",
                "  █ █ ███",
            ]
        );
    }

    #[test]
    fn wide_pixels_and_clipping() {
        let wide = BigText::new("11").pixel(2, 1);
        assert_eq!((wide.width(), wide.height()), (13, 5));
        let text = BigText::new("1").pixel(2, 2);
        assert_eq!((text.width(), text.height()), (6, 10));
        let mut buf = Buffer::empty(Rect::new(0, 0, 4, 3));
        text.render(buf.area, &mut buf);
        assert_eq!(lines(&buf), ["  ██", "  ██", "████"]);
    }
}
