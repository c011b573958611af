//! Per-device gauges: a memory bar, utilisation, temperature, power, clocks, and the
//! history of memory used. Given room, each device gets history charts of memory (used
//! and driver-reserved, split as the bar is) and utilisation with a time axis, two
//! devices a row on wide screens; with less, a one-row sparkline; with many devices, all
//! but the selected one compact to a single row so every GPU stays on screen.
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

use super::history_chart::HistoryChart;
use super::membar::{MemoryBar, FREE_COLOR, RESERVED_COLOR, USED_COLOR};
use crate::app::{App, ChartHistory};
use crate::units::{self, bytes, celsius, device_title, mhz, pct};
use vramtop_telemetry::{DeviceHealth, DeviceSnapshot};

/// Rows of a device drawn in full, borders included.
const FULL_ROWS: u16 = 5;
const BAR_LABEL: &str = " mem ";
/// Room kept right of the sparkline for its caption.
const CAPTION_WIDTH: u16 = 26;
/// Width of the bar in a compact row.
const COMPACT_BAR: u16 = 16;
/// Fewest rows of a panel with charts: borders, bar, gauges, caption, 2 chart rows, axis.
const MIN_CHART_PANEL_ROWS: u16 = 9;
/// Rows of a panel with charts past which taller charts tell nothing more.
const MAX_CHART_PANEL_ROWS: u16 = 26;
/// Two devices a row from this width on.
const GRID_MIN_WIDTH: u16 = 160;
/// The utilisation chart goes beside the memory chart from this inner width on.
const SIDE_CHARTS_MIN_WIDTH: u16 = 90;
/// Share of a panel's chart width given to memory when both charts show.
const MEMORY_CHART_PERCENT: u16 = 60;

/// Devices per row of the grid at this width.
fn grid_columns(devices: usize, width: u16) -> usize {
    if devices >= 2 && width >= GRID_MIN_WIDTH {
        2
    } else {
        1
    }
}

/// Of `budget` rows, those the devices draw in: a grid of charted panels uses a whole
/// number of panel heights, so the rest can go to the table below.
pub fn fitted_height(app: &App, width: u16, budget: u16) -> u16 {
    let n = app.device_count();
    if n == 0 {
        return budget;
    }
    let grid_rows = n.div_ceil(grid_columns(n, width)) as u16;
    let per = budget / grid_rows;
    if per >= MIN_CHART_PANEL_ROWS {
        grid_rows * per.min(MAX_CHART_PANEL_ROWS)
    } else {
        height(app, budget)
    }
}

/// Rows the devices would use with the tallest useful charts, at this width.
pub fn wanted_height(app: &App, width: u16) -> u16 {
    let n = app.device_count();
    if n == 0 {
        return 3;
    }
    let grid_rows = n.div_ceil(grid_columns(n, width)) as u16;
    grid_rows.saturating_mul(MAX_CHART_PANEL_ROWS)
}

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
    let columns = grid_columns(snapshot.devices.len(), area.width);
    let grid_rows = snapshot.devices.len().div_ceil(columns) as u16;
    if area.height / grid_rows >= MIN_CHART_PANEL_ROWS {
        draw_grid(frame, area, app, columns);
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

/// Every device as a panel with charts, `columns` to a row, sharing the height evenly.
fn draw_grid(frame: &mut Frame, area: Rect, app: &App, columns: usize) {
    let Some(snapshot) = &app.snapshot else {
        return;
    };
    let n = snapshot.devices.len();
    let grid_rows = n.div_ceil(columns) as u16;
    let height = (area.height / grid_rows).min(MAX_CHART_PANEL_ROWS);
    let width = area.width / columns as u16;
    let empty = ChartHistory::default();
    for (i, device) in snapshot.devices.iter().enumerate() {
        let (row, col) = ((i / columns) as u16, (i % columns) as u16);
        // The last column takes the odd cell left by the division.
        let w = if col + 1 == columns as u16 {
            area.width - col * width
        } else {
            width
        };
        let rect = Rect::new(area.x + col * width, area.y + row * height, w, height);
        let history = app.chart_history.get(i).unwrap_or(&empty);
        let selected = i == app.selected_device && n > 1;
        let inner = panel(frame, rect, device, selected);
        let [bar_row, gauges_row, charts] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(0),
        ])
        .areas(inner);
        draw_bar_row(frame, bar_row, device);
        frame.render_widget(
            Paragraph::new(gauges_line(device, gauges_row.width)),
            gauges_row,
        );
        draw_charts(frame, charts, device, history, app.interval_s);
    }
}

/// Memory chart, and utilisation beside it when the panel is wide enough.
fn draw_charts(
    frame: &mut Frame,
    area: Rect,
    device: &DeviceSnapshot,
    history: &ChartHistory,
    interval_s: f64,
) {
    let (memory_area, util_area) = if area.width >= SIDE_CHARTS_MIN_WIDTH {
        let [m, _, u] = Layout::horizontal([
            Constraint::Percentage(MEMORY_CHART_PERCENT),
            Constraint::Length(2),
            Constraint::Min(0),
        ])
        .areas(area);
        (m, Some(u))
    } else {
        (area, None)
    };
    let dim = Style::new().fg(Color::DarkGray);
    let unattributed = device
        .unattributed_bytes()
        .filter(|&b| b > 0)
        .map(|b| format!("  unattributed {}", bytes(Some(b))))
        .unwrap_or_default();
    let caption = Line::from(vec![
        Span::styled(" memory: used ", dim),
        Span::styled("█", Style::new().fg(USED_COLOR)),
        Span::styled(" driver ", dim),
        Span::styled("█", Style::new().fg(RESERVED_COLOR)),
        Span::styled(format!(" of {}", bytes(device.memory_total_bytes)), dim),
        Span::styled(unattributed, Style::new().yellow()),
    ]);
    let samples = history.memory.last(memory_area.width as usize);
    frame.render_widget(
        HistoryChart::new(&samples, device.memory_total_bytes.unwrap_or(0))
            .colors(USED_COLOR, RESERVED_COLOR)
            .caption(caption)
            .interval(interval_s),
        memory_area,
    );
    if let Some(util_area) = util_area {
        let samples = history.util.last(util_area.width as usize);
        let caption = Line::from(vec![
            Span::styled(" GPU utilisation, 0-100 %  now ", dim),
            Span::raw(pct(device.gpu_util_pct)),
        ]);
        frame.render_widget(
            HistoryChart::new(&samples, 100)
                .colors(Color::Cyan, Color::Cyan)
                .caption(caption)
                .interval(interval_s),
            util_area,
        );
    }
}

/// The device's title, which always says when the device is simulated.
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

/// The bordered panel of one device with its title; returns the inside.
fn panel(frame: &mut Frame, area: Rect, device: &DeviceSnapshot, selected: bool) -> Rect {
    let mut title = vec![Span::styled(
        format!(" {} ", device_title(device)),
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
    inner
}

/// " mem ████▓░░░  used 12.0 GiB  driver 480 MiB  free 67.2 GiB / 79.6 GiB"
fn draw_bar_row(frame: &mut Frame, bar_row: Rect, device: &DeviceSnapshot) {
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
}

fn draw_full(
    frame: &mut Frame,
    area: Rect,
    device: &DeviceSnapshot,
    history: &[u64],
    selected: bool,
    interval_s: f64,
) {
    let inner = panel(frame, area, device, selected);
    let [bar_row, gauges_row, spark_row] =
        Layout::vertical([Constraint::Length(1); 3]).areas(inner);
    draw_bar_row(frame, bar_row, device);
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
            units::power(device.power_mw, device.power_limit_mw),
        ),
        ("sm", mhz(device.sm_clock_mhz)),
        ("mem", mhz(device.memory_clock_mhz)),
        ("fan", pct(device.fan_pct)),
        ("pcie rx", units::kib_per_s(device.pcie_rx_kib_s)),
        ("tx", units::kib_per_s(device.pcie_tx_kib_s)),
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
    let name = units::truncate(&device_title(device), 28);
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
        units::power(device.power_mw, device.power_limit_mw),
    ))];
    spans.extend(health_span(device));
    frame.render_widget(Paragraph::new(Line::from(spans)), text);
}
