//! How figures read, on screen and in `--once`'s table alike: N/A for what a device cannot
//! report, never 0. Below `ui` and `export`, which both use it; imports neither.

use vramtop_alloc::human_bytes;
use vramtop_telemetry::DeviceSnapshot;

pub const NA: &str = "N/A";

pub fn bytes(value: Option<u64>) -> String {
    value.map_or_else(|| NA.to_string(), human_bytes)
}

pub fn pct(value: Option<u32>) -> String {
    value.map_or_else(|| NA.to_string(), |v| format!("{v}%"))
}

pub fn celsius(value: Option<u32>) -> String {
    value.map_or_else(|| NA.to_string(), |v| format!("{v}°C"))
}

pub fn mhz(value: Option<u32>) -> String {
    value.map_or_else(|| NA.to_string(), |v| format!("{v} MHz"))
}

/// Power as "395/700 W"; either side may be unknown.
pub fn power(draw_mw: Option<u32>, limit_mw: Option<u32>) -> String {
    let w = |v: Option<u32>| v.map_or_else(|| NA.to_string(), |mw| format!("{}", mw / 1000));
    format!("{}/{} W", w(draw_mw), w(limit_mw))
}

pub fn kib_per_s(value: Option<u32>) -> String {
    value.map_or_else(
        || NA.to_string(),
        |v| format!("{}/s", human_bytes(v as u64 * 1024)),
    )
}

/// A device's name as titles and tables show it, saying when it is the simulated one.
pub fn device_title(device: &DeviceSnapshot) -> String {
    if device.simulated {
        format!(
            "sim{}  {}  (no NVIDIA driver found)",
            device.index, device.name
        )
    } else {
        format!("gpu{}  {}", device.index, device.name)
    }
}

/// Text cut to `width` characters with an ellipsis, for table cells.
pub fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_is_na_not_zero() {
        assert_eq!(pct(None), "N/A");
        assert_eq!(pct(Some(0)), "0%");
        assert_eq!(power(Some(395_000), None), "395/N/A W");
        assert_eq!(truncate("python train.py", 8), "python …");
    }
}
