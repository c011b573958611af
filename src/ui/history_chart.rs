//! A history chart several rows tall: one column per sample, newest at the right, each
//! column a stack of up to two series in eighth-cell steps (memory used, then the
//! driver's reservation above it, as the memory bar splits them), a caption row above
//! and a time axis below.
//!
//! ```text
//!  memory used █ driver ▓  of 79.6 GiB
//!                    ▃▅███
//!              ▂▄▆███████
//! -2m              -1m                                now
//! ```

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::Widget;

/// Cell symbols for 1..=8 eighths of a cell, filled from the bottom.
const EIGHTHS: [&str; 8] = ["▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];

/// One sample: the lower series and the upper one stacked on it; None where unknown.
pub type Sample = (Option<u64>, Option<u64>);

pub struct HistoryChart<'a> {
    samples: &'a [Sample],
    max: u64,
    colors: (Color, Color),
    caption: Line<'a>,
    interval_s: f64,
}

impl<'a> HistoryChart<'a> {
    pub fn new(samples: &'a [Sample], max: u64) -> Self {
        HistoryChart {
            samples,
            max: max.max(1),
            colors: (Color::Green, Color::Magenta),
            caption: Line::default(),
            interval_s: 1.0,
        }
    }

    pub fn colors(mut self, lower: Color, upper: Color) -> Self {
        self.colors = (lower, upper);
        self
    }

    pub fn caption(mut self, caption: impl Into<Line<'a>>) -> Self {
        self.caption = caption.into();
        self
    }

    /// Seconds between samples, for the time axis.
    pub fn interval(mut self, seconds: f64) -> Self {
        self.interval_s = if seconds.is_finite() && seconds > 0.0 {
            seconds
        } else {
            1.0
        };
        self
    }

    /// Height in eighths of `value` over `rows` rows, rounded so a non-zero value shows.
    fn eighths(&self, value: u64, rows: u16) -> u32 {
        let total = u128::from(rows) * 8;
        let scaled = u128::from(value.min(self.max)) * total / u128::from(self.max);
        let nonzero_floor = u128::from(value > 0);
        scaled.max(nonzero_floor) as u32
    }

    fn draw_column(&self, buf: &mut Buffer, x: u16, plot: Rect, sample: Sample) {
        let (lower, upper) = sample;
        let Some(lower) = lower else {
            return;
        };
        let low = self.eighths(lower, plot.height);
        let top = self.eighths(lower.saturating_add(upper.unwrap_or(0)), plot.height);
        for k in 0..u32::from(plot.height) {
            let y = plot.bottom() - 1 - k as u16;
            let (from, to) = (k * 8, k * 8 + 8);
            let cell = &mut buf[(x, y)];
            if low >= to {
                cell.set_symbol(EIGHTHS[7]).set_fg(self.colors.0);
            } else if low > from {
                cell.set_symbol(EIGHTHS[(low - from - 1) as usize])
                    .set_fg(self.colors.0);
                if top >= to {
                    cell.set_bg(self.colors.1);
                }
            } else if top >= to {
                cell.set_symbol(EIGHTHS[7]).set_fg(self.colors.1);
            } else if top > from {
                cell.set_symbol(EIGHTHS[(top - from - 1) as usize])
                    .set_fg(self.colors.1);
            }
        }
    }
}

/// "-90s", "-2m", "-1h30m": a point in the past, short.
pub fn ago(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0 => "now".to_string(),
        s if s < 120 => format!("-{s}s"),
        s if s < 7200 => format!("-{}m", s / 60),
        s => format!("-{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Widget for HistoryChart<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height < 3 || area.width < 8 {
            return;
        }
        let caption = Rect::new(area.x, area.y, area.width, 1);
        let plot = Rect::new(area.x, area.y + 1, area.width, area.height - 2);
        let axis = Rect::new(area.x, area.bottom() - 1, area.width, 1);
        self.caption.clone().render(caption, buf);

        let width = plot.width as usize;
        let shown = &self.samples[self.samples.len().saturating_sub(width)..];
        let first_x = plot.right() - shown.len() as u16;
        for (i, &sample) in shown.iter().enumerate() {
            self.draw_column(buf, first_x + i as u16, plot, sample);
        }

        // The axis spans the whole width (what the chart will hold), labelled at the left
        // end, the middle and "now" at the right.
        let dim = Style::new().fg(Color::DarkGray);
        let span_s = width as f64 * self.interval_s;
        let left = ago(span_s);
        let middle = ago(span_s / 2.0);
        let now = "now";
        buf.set_string(axis.x, axis.y, &left, dim);
        let mid_x = axis.x + axis.width / 2 - (middle.len() as u16) / 2;
        if mid_x > axis.x + left.len() as u16 + 1 {
            buf.set_string(mid_x, axis.y, &middle, dim);
        }
        buf.set_string(axis.right() - now.len() as u16, axis.y, now, dim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::buffer_text;

    #[test]
    fn columns_stack_lower_then_upper_newest_at_the_right() {
        // 2 plot rows = 16 eighths; max 16: values map one to one onto eighths.
        let samples = [(Some(16), Some(0)), (Some(4), Some(8)), (None, None)];
        let area = Rect::new(0, 0, 10, 4);
        let mut buf = Buffer::empty(area);
        HistoryChart::new(&samples, 16)
            .caption("mem")
            .interval(1.0)
            .render(area, &mut buf);
        let text = buffer_text(&buf);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("mem"));
        // Newest (unknown) at x=9 is blank; (4, 8) at x=8: lower half-cell, upper fills
        // the rest of row one and half of row two; (16, 0) at x=7 fills both rows.
        assert_eq!(&lines[1].chars().skip(7).collect::<String>(), "█▄ ");
        assert_eq!(&lines[2].chars().skip(7).collect::<String>(), "█▄ ");
        assert_eq!(buf[(8, 2)].fg, Color::Green);
        assert_eq!(
            buf[(8, 2)].bg,
            Color::Magenta,
            "the rest of the cell is the upper series"
        );
        assert_eq!(buf[(8, 1)].fg, Color::Magenta);
        assert!(lines[3].starts_with("-10s") && lines[3].ends_with("now"));
    }

    #[test]
    fn small_values_still_show_and_overflow_is_clamped() {
        let samples = [(Some(1), None), (Some(u64::MAX), Some(u64::MAX))];
        let area = Rect::new(0, 0, 8, 3);
        let mut buf = Buffer::empty(area);
        HistoryChart::new(&samples, 1 << 30).render(area, &mut buf);
        assert_eq!(buf[(6, 1)].symbol(), "▁");
        assert_eq!(buf[(7, 1)].symbol(), "█");
    }

    #[test]
    fn time_labels_are_short() {
        assert_eq!(ago(0.0), "now");
        assert_eq!(ago(90.0), "-90s");
        assert_eq!(ago(600.0), "-10m");
        assert_eq!(ago(5400.0 * 2.0), "-3h00m");
    }
}
