//! Per-device gauges: a memory bar, utilisation, temperature, power, clocks and a
//! sparkline of memory used. With many devices, all but the selected one compact to a
//! single row so every GPU stays on screen.
//!
//! ```text
//! ┌ gpu0  NVIDIA H100 80GB HBM3 ─────────────────────────────────────────────┐
//! │ mem ████████▓░░░░░░░░░  used 12.0 GiB  driver 480 MiB  free 67.2 GiB / 79.6 │
//! │ util 65%  mem 32%  53°C  395/700 W  sm 1980 MHz  mem 2619 MHz  pcie …      │
//! │ ▁▂▃▄▅▆▇█▇▆  memory used, last 10 min                                      │
//! └──────────────────────────────────────────────────────────────────────────┘
//!  gpu1 H100 ████░░░░ 12.0/79.6 GiB util 65% 53°C 395/700 W     (compact row)
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline};
use ratatui::Frame;

use super::format::{self, bytes, celsius, mhz, pct};
use super::membar::{MemoryBar, FREE_COLOR, RESERVED_COLOR, USED_COLOR};
use crate::app::App;
use crate::telemetry::{DeviceHealth, DeviceSnapshot};

/// Rows of a device drawn in full, borders included.
const FULL_ROWS: u16 = 5;
const BAR_LABEL: &str = " mem ";
/// Room kept right of the sparkline for its caption.
const CAPTION_WIDTH: u16 = 26;
/// Width of the bar in a compact row.
const COMPACT_BAR: u16 = 16;

/// Rows the device section needs, given at most `max` rows.
pub fn height(app: &App, max: u16) -> u16 {
    let n = app.device_count() as u16;
    if n == 0 {
        return 3.min(max);
    }
    let all_full = n * FULL_ROWS;
    let one_full = FULL_ROWS + (n - 1);
    if all_full <= max {
        all_full
    } else {
        one_full.min(max.max(FULL_ROWS))
    }
}

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let Some(snapshot) = &app.snapshot else {
        let block = Block::new().borders(Borders::ALL).title(" devices ");
        frame.render_widget(Paragraph::new(" polling…").block(block), area);
        return;
    };
    if snapshot.devices.is_empty() {
        let block = Block::new().borders(Borders::ALL).title(" devices ");
        frame.render_widget(Paragraph::new(" no GPU found").block(block), area);
        return;
    }
    let n = snapshot.devices.len() as u16;
    let all_full = n * FULL_ROWS <= area.height;
    let mut y = area.y;
    for (i, device) in snapshot.devices.iter().enumerate() {
        let full = all_full || i == app.selected_device;
        let rows = if full { FULL_ROWS } else { 1 };
        if y + rows > area.bottom() {
            break;
        }
        let rect = Rect::new(area.x, y, area.width, rows);
        let history = app
            .memory_history
            .get(i)
            .map(|h| h.last(rect.width as usize))
            .unwrap_or_default();
        if full {
            draw_full(
                frame,
                rect,
                device,
                &history,
                i == app.selected_device && n > 1,
                app.interval_s,
            );
        } else {
            draw_compact(frame, rect, device);
        }
        y += rows;
    }
}

/// The device's title, which always says when the device is simulated.
pub fn title(device: &DeviceSnapshot) -> String {
    if device.simulated {
        format!(
            "sim{}  {}  (no NVIDIA driver found)",
            device.index, device.name
        )
    } else {
        format!("gpu{}  {}", device.index, device.name)
    }
}

fn health_span(device: &DeviceSnapshot) -> Option<Span<'static>> {
    match &device.health {
        DeviceHealth::Ok => None,
        DeviceHealth::Stale => Some(Span::styled(
            " STALE ",
            Style::new().bold().black().on_yellow(),
        )),
        DeviceHealth::Lost(why) => Some(Span::styled(
            format!(" LOST: {why} "),
            Style::new().bold().white().on_red(),
        )),
    }
}

fn draw_full(
    frame: &mut Frame,
    area: Rect,
    device: &DeviceSnapshot,
    history: &[u64],
    selected: bool,
    interval_s: f64,
) {
    let mut title = vec![Span::styled(
        format!(" {} ", title(device)),
        Style::new().bold(),
    )];
    title.extend(health_span(device));
    let border = if selected {
        Style::new().cyan()
    } else {
        Style::new()
    };
    let block = Block::new()
        .borders(Borders::ALL)
        .border_style(border)
        .title(Line::from(title));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [bar_row, gauges_row, spark_row] =
        Layout::vertical([Constraint::Length(1); 3]).areas(inner);

    let summary = format!(
        "  used {}  driver {}  free {} / {}",
        bytes(device.memory_used_bytes),
        bytes(device.memory_reserved_bytes),
        bytes(device.memory_free_bytes),
        bytes(device.memory_total_bytes),
    );
    let bar_width = bar_row
        .width
        .saturating_sub(BAR_LABEL.len() as u16 + summary.chars().count() as u16)
        .max(8);
    let [label, bar, text] = Layout::horizontal([
        Constraint::Length(BAR_LABEL.len() as u16),
        Constraint::Length(bar_width),
        Constraint::Min(0),
    ])
    .areas(bar_row);
    frame.render_widget(Paragraph::new(BAR_LABEL), label);
    frame.render_widget(
        MemoryBar::default()
            .used(device.memory_used_bytes.unwrap_or(0))
            .reserved(device.memory_reserved_bytes.unwrap_or(0))
            .total(device.memory_total_bytes.unwrap_or(0)),
        bar,
    );
    frame.render_widget(Paragraph::new(summary_line(device)), text);
    frame.render_widget(
        Paragraph::new(gauges_line(device, gauges_row.width)),
        gauges_row,
    );

    // Memory no listed process accounts for answers "where did my memory go?".
    let unattributed = device
        .unattributed_bytes()
        .filter(|&b| b > 0)
        .map(|b| format!(" unattributed {} ·", bytes(Some(b))))
        .unwrap_or_default();
    let spark_width = spark_row
        .width
        .saturating_sub(CAPTION_WIDTH + unattributed.chars().count() as u16);
    let caption = history_caption(history.len().min(spark_width as usize), interval_s);
    let [spark, cap] =
        Layout::horizontal([Constraint::Length(spark_width), Constraint::Min(0)]).areas(spark_row);
    let max = device.memory_total_bytes.unwrap_or(0).max(1);
    let shown = &history[history.len().saturating_sub(spark_width as usize)..];
    frame.render_widget(
        Sparkline::default()
            .data(shown)
            .max(max)
            .style(Style::new().fg(USED_COLOR)),
        spark,
    );
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(unattributed, Style::new().yellow()),
            Span::styled(caption, Style::new().dark_gray()),
        ])),
        cap,
    );
}

fn summary_line(device: &DeviceSnapshot) -> Line<'static> {
    Line::from(vec![
        Span::raw("  used "),
        Span::styled(
            bytes(device.memory_used_bytes),
            Style::new().fg(USED_COLOR).bold(),
        ),
        Span::raw("  driver "),
        Span::styled(
            bytes(device.memory_reserved_bytes),
            Style::new().fg(RESERVED_COLOR),
        ),
        Span::raw("  free "),
        Span::styled(
            bytes(device.memory_free_bytes),
            Style::new().fg(Color::Gray),
        ),
        Span::styled(
            format!(" / {}", bytes(device.memory_total_bytes)),
            Style::new().fg(FREE_COLOR),
        ),
    ])
}

/// Gauges in order of importance; those that do not fit the width are left out whole
/// rather than cut mid-word.
fn gauges_line(device: &DeviceSnapshot, width: u16) -> Line<'static> {
    let gauges = [
        ("util", pct(device.gpu_util_pct)),
        ("mem util", pct(device.memory_util_pct)),
        ("temp", celsius(device.temperature_c)),
        (
            "power",
            format::power(device.power_mw, device.power_limit_mw),
        ),
        ("sm", mhz(device.sm_clock_mhz)),
        ("mem", mhz(device.memory_clock_mhz)),
        ("fan", pct(device.fan_pct)),
        ("pcie rx", format::kib_per_s(device.pcie_rx_kib_s)),
        ("tx", format::kib_per_s(device.pcie_tx_kib_s)),
    ];
    let mut spans = Vec::new();
    let mut used = 0usize;
    for (label, value) in gauges {
        let len = label.len() + value.chars().count() + 3;
        if used + len > width as usize {
            break;
        }
        used += len;
        spans.push(Span::styled(format!(" {label} "), Style::new().dark_gray()));
        spans.push(Span::raw(format!("{value} ")));
    }
    Line::from(spans)
}

/// "memory used, last 2 min", from how many samples fit and the poll interval.
fn history_caption(samples: usize, interval_s: f64) -> String {
    let secs = (samples as f64 * interval_s).round() as u64;
    if secs >= 120 {
        format!(" memory used, last {} min", secs / 60)
    } else {
        format!(" memory used, last {secs} s")
    }
}

fn draw_compact(frame: &mut Frame, area: Rect, device: &DeviceSnapshot) {
    let name = format::truncate(&title(device), 28);
    let [label, bar, text] = Layout::horizontal([
        Constraint::Length(30),
        Constraint::Length(COMPACT_BAR),
        Constraint::Min(0),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(format!(" {name}")), label);
    frame.render_widget(
        MemoryBar::default()
            .used(device.memory_used_bytes.unwrap_or(0))
            .reserved(device.memory_reserved_bytes.unwrap_or(0))
            .total(device.memory_total_bytes.unwrap_or(0)),
        bar,
    );
    let mut spans = vec![Span::raw(format!(
        " {}/{}  util {}  {}  {}",
        bytes(device.memory_used_bytes),
        bytes(device.memory_total_bytes),
        pct(device.gpu_util_pct),
        celsius(device.temperature_c),
        format::power(device.power_mw, device.power_limit_mw),
    ))];
    spans.extend(health_span(device));
    frame.render_widget(Paragraph::new(Line::from(spans)), text);
}
