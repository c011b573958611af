//! Drawing only, from a borrowed `&App`: one module per screen region. Nothing here
//! reads a source or changes state, so a frozen or replayed state draws the same.
//!
//! ```text
//! +-------------------------------------------------------------+
//! | header: vramtop · host · driver · devices · source           |
//! +-------------------------------------------------------------+
//! | devices: memory bar, gauges, history charts sized to the     |
//! | room (a sparkline, or compact rows, when space is short)     |
//! +-------------------------------------------------------------+
//! | processes table: what is left                                |
//! +-------------------------------------------------------------+
//! | allocator region: block map when a probe feeds it, else one  |
//! | hint line                                                    |
//! +-------------------------------------------------------------+
//! | footer: key hints                                            |
//! +-------------------------------------------------------------+
//! ```

pub mod allocator;
pub mod attached;
pub mod bigdigits;
pub mod blockmap;
pub mod devices;
#[doc(hidden)]
pub mod fixtures;
pub mod fragmentation;
pub mod header;
pub mod help;
pub mod history_chart;
pub mod leaks;
pub mod membar;
pub mod presenter;
pub mod process_prompt;
pub mod process_screen;
pub mod processes;
pub mod ranks;
pub mod replayer;
pub mod screen_theme;
pub mod theme;
pub mod viewer;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

use crate::app::{App, View};

/// Below this size the layout cannot show a device and its processes legibly.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;
const HEADER_ROWS: u16 = 1;
const FOOTER_ROWS: u16 = 1;
/// Rows the process table gets at most, borders included, before the allocator region.
const MAX_PROCESS_ROWS: u16 = 12;
const MIN_PROCESS_ROWS: u16 = 5;
/// Rows of the `vramtop run` output pane, borders included.
const LOG_ROWS: u16 = 8;
/// Without a probe, the devices' charts may take at most this share of the rows the
/// process table would like, so processes are never squeezed out by history.
const MAX_DEVICE_PERCENT: u16 = 55;
/// The process table's borders, header and one row.
const MIN_TABLE_ROWS: u16 = 4;

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        draw_too_small(frame, area);
        return;
    }
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(HEADER_ROWS),
        Constraint::Min(0),
        Constraint::Length(FOOTER_ROWS),
    ])
    .areas(area);
    header::draw(frame, header, app);
    let body = match &app.run {
        Some(run) if body.height > LOG_ROWS * 3 => {
            let [above, log] =
                Layout::vertical([Constraint::Min(0), Constraint::Length(LOG_ROWS)]).areas(body);
            attached::draw_log(frame, log, run);
            above
        }
        _ => body,
    };

    // The allocator panel shows only when something feeds it: a probe or an attached job.
    let over_table = app.views.contains(View::Leaks) || app.views.contains(View::Process);
    if app.probe.is_none() && app.shown_job().is_none() && !over_table {
        draw_without_allocator(frame, body, app);
    } else {
        let device_rows = devices::height(app, body.height / 2);
        let process_rows = (app.rows.len() as u16 + 3).clamp(MIN_PROCESS_ROWS, MAX_PROCESS_ROWS);
        let [devices_area, processes_area, allocator_area] = Layout::vertical([
            Constraint::Length(device_rows),
            Constraint::Length(process_rows),
            Constraint::Min(0),
        ])
        .areas(body);
        devices::draw(frame, devices_area, app);
        if over_table {
            let [_, below] =
                Layout::vertical([Constraint::Length(device_rows), Constraint::Min(0)]).areas(body);
            // The view opened last is drawn.
            match app.views.focus() {
                Some(View::Process) => process_screen::draw(frame, below, app),
                _ if app.views.contains(View::Leaks) => draw_leaks(frame, below, app),
                _ => process_screen::draw(frame, below, app),
            }
        } else {
            processes::draw(frame, processes_area, app);
            match (app.shown_job(), app.shown_ranks()) {
                (Some(job), Some(group)) => ranks::draw(frame, allocator_area, app, &group, job),
                (Some(job), None) => attached::draw(frame, allocator_area, app, job),
                (None, _) => allocator::draw(frame, allocator_area, app),
            }
        }
    }
    if app.views.focus() == Some(View::Filter) {
        frame.render_widget(
            Paragraph::new(process_prompt::filter_line(&app.filter)),
            footer,
        );
    } else {
        draw_footer(frame, footer, app);
    }
    if let (true, Some(request)) = (app.views.contains(View::ConfirmSignal), &app.pending_signal) {
        process_prompt::draw_confirmation(frame, area, request);
    }
    if app.views.contains(View::Help) {
        help::draw(frame, area);
    }
}

/// Nothing feeds the allocator panel: devices get history charts as tall as the room
/// allows, the process table takes what is left, and the allocator is one hint line.
fn draw_without_allocator(frame: &mut Frame, body: Rect, app: &App) {
    let [main, hint] = Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(body);
    let process_wants = (app.rows.len() as u16 + 3).max(MIN_PROCESS_ROWS);
    let process_floor = process_wants.min(main.height * MAX_DEVICE_PERCENT / 100);
    // Never fewer rows than it takes to show every device (compact rows), while the
    // table keeps room for its header and one process.
    let device_rows = devices::wanted_height(app, main.width)
        .min(main.height.saturating_sub(process_floor))
        .max(devices::height(
            app,
            main.height.saturating_sub(MIN_TABLE_ROWS),
        ));
    let device_rows = devices::fitted_height(app, main.width, device_rows);
    let [devices_area, processes_area] =
        Layout::vertical([Constraint::Length(device_rows), Constraint::Min(0)]).areas(main);
    devices::draw(frame, devices_area, app);
    processes::draw(frame, processes_area, app);
    allocator::draw_hint(frame, hint);
}

/// The leaks view: suspects of the (first) probe, what is alive since the mark, sites,
/// oldest blocks, and process memory trends from telemetry.
fn draw_leaks(frame: &mut Frame, area: Rect, app: &App) {
    use ratatui::widgets::{Block, Borders};
    if let Some(job) = app.shown_job() {
        return draw_job_leaks(frame, area, app, job);
    }
    let policy = app.probe.as_ref().and_then(|p| p.policies.first());
    let empty_suspects = Vec::new();
    let empty_sites = Vec::new();
    let (suspects, sites) =
        policy.map_or((&empty_suspects, &empty_sites), |p| (&p.suspects, &p.sites));
    let trends: Vec<_> = app.process_watch.iter().flat_map(|w| w.trends()).collect();
    let unattributed = app
        .process_watch
        .get(app.selected_device)
        .map(|w| w.unattributed());
    let title = match policy {
        Some(p) => format!(
            " leaks · probe {} · {} · M marks, L returns ",
            p.report.scenario, p.report.policy
        ),
        None => " leaks · process memory trends (run a probe for allocation sites) · L returns "
            .to_string(),
    };
    let view = leaks::LeaksView::new(suspects, sites)
        .since_mark(policy.and_then(|p| p.since_mark.as_deref()))
        .oldest_blocks(policy.map_or(&[], |p| p.oldest.as_slice()))
        .processes(&trends)
        .unattributed(
            unattributed.as_ref(),
            vramtop_telemetry::trend::TrendConfig::default().unattributed_bytes,
        )
        .block(Block::new().borders(Borders::ALL).title(title));
    frame.render_widget(view, area);
}

/// The leaks view of an attached job: its sites (with `--history`) and process trends.
fn draw_job_leaks(frame: &mut Frame, area: Rect, app: &App, job: &vramtop_attach::JobView) {
    use ratatui::widgets::{Block, Borders};
    let trends: Vec<_> = app.process_watch.iter().flat_map(|w| w.trends()).collect();
    let history = job.hello.as_ref().is_some_and(|h| h.history);
    let title = if history {
        format!(
            " leaks · job {} · allocation sites from the hook · L returns ",
            job.pid
        )
    } else {
        format!(
            " leaks · job {} · no allocation sites: start it with vramtop run --history · L returns ",
            job.pid
        )
    };
    let view = leaks::LeaksView::new(&job.suspects, &job.sites)
        .processes(&trends)
        .block(Block::new().borders(Borders::ALL).title(title));
    frame.render_widget(view, area);
}

/// Panels that drop sections when rows run short (fragmentation, leaks) choose heights by
/// priority; this stacks the chosen ones top to bottom in display order.
pub fn stack_sections<S: Copy>(area: Rect, order: &[S], heights: &[u16]) -> Vec<(S, Rect)> {
    let mut y = area.y;
    let mut stacked = Vec::new();
    for (&section, &height) in order.iter().zip(heights) {
        if height > 0 {
            stacked.push((section, Rect::new(area.x, y, area.width, height)));
            y = y.saturating_add(height);
        }
    }
    stacked
}

/// A drawn buffer as plain text, one line per row: what tests and snapshots compare.
pub fn buffer_text(buf: &ratatui::buffer::Buffer) -> String {
    let mut text = String::with_capacity(buf.area.area() as usize + buf.area.height as usize);
    for y in buf.area.top()..buf.area.bottom() {
        for x in buf.area.left()..buf.area.right() {
            text.push_str(buf[(x, y)].symbol());
        }
        text.push('\n');
    }
    text
}

fn draw_too_small(frame: &mut Frame, area: Rect) {
    let text = format!(
        "vramtop: terminal {}x{} is too small; enlarge to at least {MIN_WIDTH}x{MIN_HEIGHT} (q quits)",
        area.width, area.height
    );
    frame.render_widget(
        Paragraph::new(text).wrap(Wrap { trim: true }).yellow(),
        area,
    );
}

fn draw_footer(frame: &mut Frame, area: Rect, app: &App) {
    let key = |k: &'static str| Span::styled(k, Style::new().bold().cyan());
    let mut spans = vec![
        key(" q"),
        Span::raw(" quit  "),
        key("?"),
        Span::raw(" help  "),
        key("s/r"),
        Span::raw(" sort  "),
        key("/"),
        Span::raw(" filter  "),
        key("t/K"),
        Span::raw(" term/kill  "),
        key("f"),
        Span::raw(" freeze"),
    ];
    if let Some(status) = &app.status {
        let style = if status.ok {
            Style::new().green()
        } else {
            Style::new().bold().red()
        };
        spans.push(Span::styled(format!("  {}", status.text), style));
    } else if let Some(notice) = &app.notice {
        spans.push(Span::styled(
            format!("  {notice}"),
            Style::new().dark_gray(),
        ));
    }
    if app.frozen {
        spans.push(Span::styled(
            "  FROZEN",
            Style::new().bold().black().on_yellow(),
        ));
    }
    if let Some(run) = app.run.as_ref().filter(|r| r.quit_asked) {
        spans.push(Span::styled(
            format!(
                "  job {} still runs: q again leaves it running (output: {}) · Ctrl-C interrupts it · Esc stays",
                run.pid,
                run.log_path.display()
            ),
            Style::new().bold().black().on_yellow(),
        ));
    } else if let Some(run) = app.run.as_ref().filter(|r| !r.running()) {
        spans.push(Span::styled(
            format!(
                "  job ended (exit {}): q quits with its code",
                run.exit_code.unwrap_or(0)
            ),
            Style::new().bold(),
        ));
    }
    if let Some(error) = &app.attached.scan_error {
        spans.push(Span::styled(format!("  {error}"), Style::new().red()));
    }
    if app.stale {
        spans.push(Span::styled(
            "  STALE: telemetry not answering",
            Style::new().bold().red(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}
