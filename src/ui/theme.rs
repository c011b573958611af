//! How the memory widgets look: the symbols and colours of block states, a stable colour
//! per allocation tag, and the short number forms that fit in a cell-sized label.
//! Pure values: nothing here reads state or draws.

use ratatui::style::{Color, Modifier, Style};

use vramtop_alloc::TagId;

/// Left-eighths, indexed by eighths filled: a partly used cell shows its used fraction
/// at 1/8 resolution, so a cell standing for 2 MiB still tells 256 KiB from 1.75 MiB.
pub const LEFT_EIGHTHS: [&str; 9] = [" ", "▏", "▎", "▍", "▌", "▋", "▊", "▉", "█"];
/// Lower-eighths for vertical bars (histogram), same indexing as `LEFT_EIGHTHS`.
pub const LOWER_EIGHTHS: [&str; 9] = [" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];

pub const SYM_ALLOCATED: &str = "█";
pub const SYM_PENDING_FREE: &str = "░";
pub const SYM_FREE: &str = "·";
/// The largest free run gets its own symbol as well as a colour, so it stays visible on
/// monochrome terminals, projectors that wash out green, and in text snapshots.
pub const SYM_LARGEST_FREE: &str = "═";
pub const SYM_UNMAPPED: &str = "╌";

/// Tag colours: saturated, readable on dark backgrounds and projectors. Green and red are
/// left out on purpose: green marks the largest free run and red marks failures.
pub const TAG_PALETTE: [Color; 12] = [
    Color::Cyan,
    Color::Magenta,
    Color::Yellow,
    Color::LightBlue,
    Color::Indexed(208), // orange
    Color::LightMagenta,
    Color::Indexed(75),  // sky blue
    Color::Indexed(180), // tan
    Color::LightCyan,
    Color::Indexed(141), // lavender
    Color::LightYellow,
    Color::Indexed(167), // salmon
];

/// Allocated bytes with no allocation-site label.
pub const UNTAGGED: Color = Color::White;
pub const LARGEST_FREE_BG: Color = Color::Green;

/// The same tag keeps the same colour across frames and runs: it depends on the id only.
pub fn tag_color(tag: Option<TagId>) -> Color {
    match tag {
        Some(TagId(id)) => TAG_PALETTE[id as usize % TAG_PALETTE.len()],
        None => UNTAGGED,
    }
}

pub fn free_style() -> Style {
    Style::new().fg(Color::DarkGray)
}

pub fn largest_free_style() -> Style {
    Style::new()
        .fg(Color::Black)
        .bg(LARGEST_FREE_BG)
        .add_modifier(Modifier::BOLD)
}

pub fn unmapped_style() -> Style {
    Style::new().fg(Color::DarkGray).add_modifier(Modifier::DIM)
}

pub fn label_style() -> Style {
    Style::new().fg(Color::Gray)
}

pub fn selected_label_style() -> Style {
    Style::new()
        .fg(Color::Black)
        .bg(Color::White)
        .add_modifier(Modifier::BOLD)
}

/// The "1 cell = 2 MiB" scale: without it the map cannot be read, so it stands out.
pub fn scale_style() -> Style {
    Style::new().fg(Color::White).add_modifier(Modifier::BOLD)
}

pub fn dim_style() -> Style {
    Style::new().fg(Color::DarkGray)
}

pub fn alert_style() -> Style {
    Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
}

/// Green, yellow, red by how bad a 0..=1 badness ratio is (fragmentation, say).
pub fn severity_color(ratio: f64) -> Color {
    if ratio >= 0.6 {
        Color::Red
    } else if ratio >= 0.3 {
        Color::Yellow
    } else {
        Color::Green
    }
}

const COMPACT_UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];

/// Bytes in at most 5 columns ("512B", "1.5G", "20M", "1023K"), for labels beside cells.
pub fn compact_bytes(bytes: u64) -> String {
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < COMPACT_UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit > 0 && value < 9.95 && value.fract() >= 0.05 {
        format!("{value:.1}{}", COMPACT_UNITS[unit])
    } else {
        format!("{}{}", value.round() as u64, COMPACT_UNITS[unit])
    }
}

/// A power of two of bytes, exactly ("2 MiB", "512 B"): the scale of a cell never needs
/// a fraction, and "2.0 MiB" would suggest it could have one.
pub fn pow2_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let exp = 63 - bytes.max(1).leading_zeros() as usize;
    let unit = (exp / 10).min(UNITS.len() - 1);
    format!("{} {}", bytes >> (unit * 10), UNITS[unit])
}

/// Elapsed nanoseconds as a short age: "850ms", "12.3s", "5m12s", "2h03m", "3d04h".
pub fn human_age(ns: u64) -> String {
    let ms = ns / 1_000_000;
    let secs = ns / 1_000_000_000;
    match secs {
        0 => format!("{ms}ms"),
        1..=59 => format!("{:.1}s", ns as f64 / 1e9),
        60..=3599 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..=86_399 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_forms_fit_five_columns() {
        assert_eq!(compact_bytes(512), "512B");
        assert_eq!(compact_bytes(1024), "1K");
        assert_eq!(compact_bytes(20 << 20), "20M");
        assert_eq!(compact_bytes(3 << 29), "1.5G");
        assert_eq!(compact_bytes(1023 << 10), "1023K");
        for shift in 0..64 {
            assert!(compact_bytes(1u64 << shift).len() <= 5);
            assert!(compact_bytes((1u64 << shift) - 1).len() <= 5, "{shift}");
        }
    }

    #[test]
    fn powers_of_two_print_exactly() {
        assert_eq!(pow2_bytes(1), "1 B");
        assert_eq!(pow2_bytes(512), "512 B");
        assert_eq!(pow2_bytes(2 << 20), "2 MiB");
        assert_eq!(pow2_bytes(1 << 30), "1 GiB");
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(human_age(850_000_000), "850ms");
        assert_eq!(human_age(12_300_000_000), "12.3s");
        assert_eq!(human_age(312_000_000_000), "5m12s");
        assert_eq!(human_age(7_380_000_000_000), "2h03m");
    }
}
