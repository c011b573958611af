//! Whole-screen themes for talk mode: dark (as drawn), light and high-contrast, and
//! NO_COLOR. Widgets draw in the dark palette; a theme then maps every cell's colours
//! of a finished buffer, so the block map and the panels need not know about themes.
//! States stay apart without colour because every widget marks them with symbols too.

use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ScreenTheme {
    /// Light text on a dark background
    #[default]
    Dark,
    /// Dark text on a white background, for bright rooms
    Light,
    /// White and bright colours on black, nothing dim
    HighContrast,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Palette {
    pub theme: ScreenTheme,
    /// NO_COLOR (https://no-color.org): no colours at all, attributes kept.
    pub no_color: bool,
}

/// Whether NO_COLOR asks for no colours: set and not empty.
pub fn no_color_from_env() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

impl Palette {
    pub fn new(theme: ScreenTheme, no_color: bool) -> Self {
        Palette { theme, no_color }
    }

    /// Maps the colours of every cell of a drawn buffer to the theme.
    pub fn apply(&self, buf: &mut Buffer) {
        if self.theme == ScreenTheme::Dark && !self.no_color {
            return;
        }
        for cell in buf.content.iter_mut() {
            if self.no_color {
                cell.fg = Color::Reset;
                cell.bg = Color::Reset;
                continue;
            }
            match self.theme {
                ScreenTheme::Dark => {}
                ScreenTheme::Light => {
                    cell.fg = light_fg(cell.fg);
                    cell.bg = light_bg(cell.bg);
                }
                ScreenTheme::HighContrast => {
                    cell.fg = contrast_fg(cell.fg);
                    cell.bg = contrast_bg(cell.bg);
                    cell.modifier.remove(Modifier::DIM);
                }
            }
        }
    }

    /// Foreground and background of cells left at `Color::Reset`, as CSS colours, for
    /// pictures of the screen.
    pub fn default_colors(&self) -> (&'static str, &'static str) {
        match self.theme {
            ScreenTheme::Dark => ("#e5e5e5", "#1e1e1e"),
            ScreenTheme::Light => ("#000000", "#ffffff"),
            ScreenTheme::HighContrast => ("#ffffff", "#000000"),
        }
    }
}

/// Dark-palette colours that wash out on white, swapped for darker neighbours.
fn light_fg(c: Color) -> Color {
    match c {
        Color::Reset | Color::White | Color::Gray => Color::Black,
        Color::DarkGray => Color::Indexed(242),
        Color::Yellow | Color::LightYellow => Color::Indexed(136),
        Color::Cyan => Color::Indexed(30),
        Color::LightCyan => Color::Indexed(31),
        Color::LightBlue | Color::Indexed(75) => Color::Blue,
        Color::LightMagenta => Color::Magenta,
        Color::Green | Color::LightGreen => Color::Indexed(28),
        Color::LightRed => Color::Red,
        Color::Indexed(180) => Color::Indexed(130),
        Color::Indexed(141) => Color::Indexed(91),
        Color::Indexed(208) => Color::Indexed(166),
        other => other,
    }
}

fn light_bg(c: Color) -> Color {
    match c {
        Color::Reset | Color::Black => Color::White,
        Color::White | Color::Gray => Color::Indexed(252),
        Color::Green | Color::LightGreen => Color::Indexed(120),
        Color::Yellow | Color::LightYellow => Color::Indexed(228),
        Color::Cyan | Color::LightCyan => Color::Indexed(117),
        other => other,
    }
}

/// Every colour at its brightest; greys become white.
fn contrast_fg(c: Color) -> Color {
    match c {
        Color::Reset | Color::Gray | Color::DarkGray => Color::White,
        Color::Red => Color::LightRed,
        Color::Green => Color::LightGreen,
        Color::Yellow => Color::LightYellow,
        Color::Blue => Color::LightBlue,
        Color::Magenta => Color::LightMagenta,
        Color::Cyan => Color::LightCyan,
        other => other,
    }
}

fn contrast_bg(c: Color) -> Color {
    match c {
        Color::Reset => Color::Black,
        Color::Green => Color::LightGreen,
        Color::Yellow => Color::LightYellow,
        Color::Cyan => Color::LightCyan,
        Color::Red => Color::Red,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::layout::Rect;
    use ratatui::style::Style;

    fn one_cell(style: Style) -> Buffer {
        let mut buf = Buffer::empty(Rect::new(0, 0, 1, 1));
        buf.set_string(0, 0, "█", style);
        buf
    }

    #[test]
    fn no_color_strips_colours_and_keeps_symbols_and_bold() {
        let mut buf = one_cell(Style::new().red().on_green().bold());
        Palette::new(ScreenTheme::Light, true).apply(&mut buf);
        let cell = &buf[(0, 0)];
        assert_eq!((cell.fg, cell.bg), (Color::Reset, Color::Reset));
        assert!(cell.modifier.contains(Modifier::BOLD));
        assert_eq!(cell.symbol(), "█");
    }

    #[test]
    fn light_puts_dark_text_on_white() {
        let mut buf = one_cell(Style::new().white());
        Palette::new(ScreenTheme::Light, false).apply(&mut buf);
        assert_eq!(
            (buf[(0, 0)].fg, buf[(0, 0)].bg),
            (Color::Black, Color::White)
        );
    }

    #[test]
    fn high_contrast_drops_dim() {
        let mut buf = one_cell(Style::new().dark_gray().dim());
        Palette::new(ScreenTheme::HighContrast, false).apply(&mut buf);
        let cell = &buf[(0, 0)];
        assert_eq!((cell.fg, cell.bg), (Color::White, Color::Black));
        assert!(!cell.modifier.contains(Modifier::DIM));
    }
}
