//! The process table: every GPU process on every device, filtered, sorted by any column,
//! scrollable. Columns that do not fit the width are left out whole, least useful first;
//! GROUP appears only when some process runs in a container, pod or unit, FRAMEWORK only
//! when some process's mapped libraries name one ("-": none, "?": its maps not readable).
//!
//! ```text
//! ┌ processes · by memory · 3 ──────────────────────────────────────────────────────────────────┐
//! │ GPU PID     USER     GPU MEM    TREND    SM%  CPU%   RSS      GROUP        FRAMEWORK  COMMAND │
//! │ 0   41235   alice    12.0 GiB   +8.0M/s↑ 87%  101%   3.1 GiB  docker 3f2a… PyTorch    python… │
//! └──────────────────────────────────────────────────────────────────────────────────────────────┘
//! ```

use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

use crate::app::{App, ProcessRow, SortKey};
use crate::units::{bytes, pct, NA};
use vramtop_alloc::framework::{label, Framework};
use vramtop_telemetry::HostView;

/// A column: its header, its width, and how readily it is left out when space is short
/// (higher goes first; 0 never).
struct Column {
    key: SortKey,
    header: &'static str,
    width: u16,
    drop_rank: u8,
}

const fn col(key: SortKey, header: &'static str, width: u16, drop_rank: u8) -> Column {
    Column {
        key,
        header,
        width,
        drop_rank,
    }
}

/// In display order. COMMAND takes what is left, at least `COMMAND_MIN`. FRAMEWORK fits
/// every single name ("ONNX Runtime"); it is left out right after RSS, before the rest,
/// so an 80-column terminal keeps the columns it had.
const COLUMNS: [Column; 11] = [
    col(SortKey::Gpu, "GPU", 3, 3),
    col(SortKey::Pid, "PID", 8, 0),
    col(SortKey::User, "USER", 9, 4),
    col(SortKey::Memory, "GPU MEM", 10, 0),
    col(SortKey::Trend, "TREND", 9, 2),
    col(SortKey::SmUtil, "SM%", 4, 5),
    col(SortKey::Cpu, "CPU%", 5, 6),
    col(SortKey::Rss, "RSS", 10, 8),
    col(SortKey::Group, "GROUP", 20, 1),
    col(SortKey::Framework, "FRAMEWORK", FRAMEWORK_WIDTH, 7),
    col(SortKey::Command, "COMMAND", 0, 0),
];
const COMMAND_MIN: u16 = 14;
const FRAMEWORK_WIDTH: u16 = 12;
const SPACING: u16 = 1;

pub fn draw(frame: &mut Frame, area: Rect, app: &App) {
    let block = Block::new().borders(Borders::ALL).title(title(app));
    if app.rows.is_empty() {
        let simulated = app
            .snapshot
            .as_ref()
            .is_some_and(|s| s.devices.iter().any(|d| d.simulated));
        let text = if !app.filter.is_empty() && app.process_count > 0 {
            format!(
                " no process matches '{}' (/ to change the filter, Esc in it to clear)",
                app.filter
            )
        } else if simulated {
            " no processes: the simulated device shows only vramtop's own probe workloads"
                .to_string()
        } else {
            " no GPU processes".to_string()
        };
        frame.render_widget(Paragraph::new(text).dark_gray().block(block), area);
        return;
    }
    let mut nothing_to_show = Vec::new();
    if !app.rows.iter().any(|r| r.group().is_some()) {
        nothing_to_show.push(SortKey::Group);
    }
    if !app.rows.iter().any(|r| r.framework_label().is_some()) {
        nothing_to_show.push(SortKey::Framework);
    }
    let shown = columns_for(
        area.width.saturating_sub(2),
        &nothing_to_show,
        app.columns.as_deref(),
    );
    let header = Row::new(shown.iter().map(|c| {
        let cell = Cell::from(c.header);
        if c.key == app.sort {
            cell.cyan()
        } else {
            cell
        }
    }))
    .style(Style::new().bold().underlined());
    let widths: Vec<Constraint> = shown
        .iter()
        .map(|c| match c.key {
            SortKey::Command => Constraint::Min(COMMAND_MIN),
            _ => Constraint::Length(c.width),
        })
        .collect();
    let rows = app.rows.iter().map(|r| row(r, &shown));
    let table = Table::new(rows, widths)
        .header(header)
        .column_spacing(SPACING)
        .block(block)
        .row_highlight_style(Style::new().reversed());
    // TableState lives in the app; drawing works on a copy so `draw` stays read-only.
    let mut state = app.table;
    frame.render_stateful_widget(table, area, &mut state);
}

fn title(app: &App) -> Line<'static> {
    let direction = if app.sort_reversed { " (reversed)" } else { "" };
    let count = if app.filter.is_empty() {
        app.rows.len().to_string()
    } else {
        format!("{} of {}", app.rows.len(), app.process_count)
    };
    let mut spans = vec![Span::raw(format!(
        " processes · {}{direction} · {count} ",
        app.sort.label()
    ))];
    if !app.filter.is_empty() {
        spans.push(Span::styled(
            format!("filter '{}' ", app.filter),
            Style::new().bold().black().on_cyan(),
        ));
    }
    Line::from(spans)
}

/// The columns that fit `width`: the ones `wanted` names (the settings file's `columns`;
/// None or empty: all) less those no row has anything for (`nothing_to_show`), least
/// useful dropped first when they do not fit.
fn columns_for(
    width: u16,
    nothing_to_show: &[SortKey],
    wanted: Option<&[SortKey]>,
) -> Vec<&'static Column> {
    let wanted = wanted.filter(|w| !w.is_empty());
    let mut shown: Vec<&Column> = COLUMNS
        .iter()
        .filter(|c| !nothing_to_show.contains(&c.key))
        .filter(|c| wanted.is_none_or(|w| w.contains(&c.key)))
        .collect();
    let needed = |cols: &[&Column]| -> u16 {
        cols.iter()
            .map(|c| match c.key {
                SortKey::Command => COMMAND_MIN,
                _ => c.width,
            })
            .sum::<u16>()
            + SPACING * cols.len().saturating_sub(1) as u16
    };
    while needed(&shown) > width {
        let Some((i, _)) = shown
            .iter()
            .enumerate()
            .filter(|(_, c)| c.drop_rank > 0)
            .max_by_key(|(_, c)| c.drop_rank)
        else {
            break;
        };
        shown.remove(i);
    }
    shown
}

fn row(r: &ProcessRow, shown: &[&Column]) -> Row<'static> {
    Row::new(shown.iter().map(|c| cell(r, c.key)).collect::<Vec<_>>())
}

fn cell(r: &ProcessRow, key: SortKey) -> Cell<'static> {
    let p = &r.process;
    match key {
        SortKey::Gpu => Cell::from(r.device.to_string()),
        SortKey::Pid => Cell::from(p.pid.to_string()),
        SortKey::User => Cell::from(match p.host_view {
            HostView::Visible => p.user.clone().unwrap_or_else(|| NA.to_string()),
            HostView::OtherNamespace => "?".to_string(),
            HostView::Exited => "-".to_string(),
        }),
        SortKey::Memory => Cell::from(Line::from(bytes(p.used_memory_bytes)).bold()),
        SortKey::Trend => trend_cell(r),
        SortKey::SmUtil => Cell::from(pct(p.sm_util_pct)),
        SortKey::Cpu => Cell::from(
            p.cpu_pct
                .map_or_else(|| NA.to_string(), |c| format!("{c:.0}%")),
        ),
        SortKey::Rss => Cell::from(bytes(p.rss_bytes)),
        SortKey::Group => Cell::from(r.group().unwrap_or_default()),
        SortKey::Framework => {
            Cell::from(framework_text(r.frameworks(), usize::from(FRAMEWORK_WIDTH)))
        }
        SortKey::Command => {
            let text = r.command_text();
            let text = if text.is_empty() {
                NA.to_string()
            } else {
                text
            };
            Cell::from(if r.hooked {
                // A rank says which: the command lines of a job's ranks are the same.
                let rank = r.rank.map_or_else(String::new, |n| format!("rank {n} "));
                Line::from(vec![
                    Span::styled(
                        format!("{} {rank}", super::attached::HOOKED),
                        Style::new().bold().cyan(),
                    ),
                    Span::raw(text),
                ])
            } else {
                Line::from(text)
            })
        }
    }
}

/// The frameworks in at most `width` characters: "PyTorch + CuPy" when it fits, else the
/// first and how many more ("PyTorch +1"); "-" for none, "?" when not known.
fn framework_text(frameworks: Option<&[Framework]>, width: usize) -> String {
    let Some(frameworks) = frameworks else {
        return "?".to_string();
    };
    let Some(first) = frameworks.first() else {
        return "-".to_string();
    };
    let all = label(frameworks);
    if all.chars().count() <= width {
        return all;
    }
    let more = if frameworks.len() > 1 {
        format!(" +{}", frameworks.len() - 1)
    } else {
        String::new()
    };
    let room = width.saturating_sub(more.chars().count());
    let name = first.name();
    if name.chars().count() <= room {
        format!("{name}{more}")
    } else {
        let cut: String = name.chars().take(room.saturating_sub(1)).collect();
        format!("{cut}…{more}")
    }
}

/// GPU memory slope, `+8.0M/s`; `↑` in red when its floor keeps rising (`ProcessTrend::growing`).
fn trend_cell(r: &ProcessRow) -> Cell<'static> {
    let Some(slope) = r.trend_bytes_per_s else {
        return Cell::from("·").dark_gray();
    };
    let text = rate(slope);
    if r.growing {
        Cell::from(Line::from(vec![
            Span::raw(text),
            Span::styled("↑", Style::new().bold().red()),
        ]))
    } else {
        Cell::from(text)
    }
}

/// A signed rate in 1024 steps, short enough for the column: `+8.0M/s`, `-512K/s`, `0`.
pub fn rate(bytes_per_s: f64) -> String {
    let magnitude = bytes_per_s.abs();
    if magnitude < 1024.0 {
        return "0".to_string();
    }
    let sign = if bytes_per_s > 0.0 { '+' } else { '-' };
    let units = ["K", "M", "G", "T"];
    let mut value = magnitude / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value >= 100.0 {
        format!("{sign}{value:.0}{}/s", units[unit])
    } else {
        format!("{sign}{value:.1}{}/s", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_short_and_signed() {
        assert_eq!(rate(8.0 * 1024.0 * 1024.0), "+8.0M/s");
        assert_eq!(rate(-512.0 * 1024.0), "-512K/s");
        assert_eq!(rate(100.0), "0");
        assert_eq!(rate(3.5 * (1u64 << 30) as f64), "+3.5G/s");
    }

    #[test]
    fn narrow_tables_drop_the_least_useful_columns_first() {
        let wide: Vec<_> = columns_for(200, &[], None)
            .iter()
            .map(|c| c.header)
            .collect();
        assert_eq!(wide.len(), COLUMNS.len());
        let narrow: Vec<_> = columns_for(78, &[SortKey::Group], None)
            .iter()
            .map(|c| c.header)
            .collect();
        assert!(narrow.contains(&"PID") && narrow.contains(&"GPU MEM"));
        assert!(narrow.contains(&"TREND") && narrow.contains(&"COMMAND"));
        assert!(!narrow.contains(&"RSS"), "{narrow:?}");
        assert!(!narrow.contains(&"GROUP"), "no group known: no column");
        let tiny: Vec<_> = columns_for(30, &[], None)
            .iter()
            .map(|c| c.header)
            .collect();
        assert_eq!(tiny, ["PID", "GPU MEM", "COMMAND"]);
        // The settings file's `columns` keeps only those named, in the table's order.
        let chosen = [SortKey::Command, SortKey::Pid];
        let picked: Vec<_> = columns_for(200, &[], Some(&chosen))
            .iter()
            .map(|c| c.header)
            .collect();
        assert_eq!(picked, ["PID", "COMMAND"]);
    }

    fn headers(width: u16, nothing_to_show: &[SortKey]) -> Vec<&'static str> {
        columns_for(width, nothing_to_show, None)
            .iter()
            .map(|c| c.header)
            .collect()
    }

    #[test]
    fn framework_column_gives_way_after_rss_and_before_the_rest() {
        // An 80-column terminal (78 inside the border) shows what it showed before.
        assert_eq!(
            headers(78, &[SortKey::Group]),
            headers(78, &[SortKey::Group, SortKey::Framework])
        );
        assert!(!headers(78, &[SortKey::Group]).contains(&"FRAMEWORK"));
        // A little wider, it takes RSS's place.
        let wider = headers(88, &[SortKey::Group]);
        assert!(
            wider.contains(&"FRAMEWORK") && wider.contains(&"CPU%"),
            "{wider:?}"
        );
        assert!(!wider.contains(&"RSS"), "{wider:?}");
        assert_eq!(wider.last(), Some(&"COMMAND"));
        assert!(!headers(200, &[SortKey::Framework]).contains(&"FRAMEWORK"));
    }

    #[test]
    fn framework_cells_are_short_and_say_unknown_apart_from_none() {
        let w = usize::from(FRAMEWORK_WIDTH);
        assert_eq!(framework_text(None, w), "?");
        assert_eq!(framework_text(Some(&[]), w), "-");
        assert_eq!(framework_text(Some(&[Framework::Jax]), w), "JAX/XLA");
        assert_eq!(
            framework_text(Some(&[Framework::OnnxRuntime]), w),
            "ONNX Runtime"
        );
        let torch_cupy = [Framework::PyTorch, Framework::CuPy];
        assert_eq!(framework_text(Some(&torch_cupy), 20), "PyTorch + CuPy");
        assert_eq!(framework_text(Some(&torch_cupy), w), "PyTorch +1");
        let long = [Framework::OnnxRuntime, Framework::TensorRt];
        assert_eq!(framework_text(Some(&long), w), "ONNX Run… +1");
        for (framework, _) in vramtop_alloc::framework::MARKERS {
            let text = framework_text(Some(&[framework, Framework::CuPy]), w);
            assert!(text.chars().count() <= w, "{text}");
        }
    }

    mod rendering {
        use super::*;
        use ratatui::backend::TestBackend;
        use ratatui::Terminal;
        use vramtop_telemetry::{ProcessKind, ProcessSnapshot};

        fn row(pid: u32, frameworks: Option<Vec<Framework>>) -> ProcessRow {
            ProcessRow {
                device: 0,
                process: ProcessSnapshot {
                    pid,
                    kind: ProcessKind::Compute,
                    used_memory_bytes: Some(u64::from(pid) << 20),
                    sm_util_pct: None,
                    user: Some("alice".into()),
                    command: Some(format!("python job{pid}.py")),
                    cpu_pct: None,
                    rss_bytes: None,
                    host_view: HostView::Visible,
                    cgroup: None,
                    frameworks,
                },
                trend_bytes_per_s: None,
                growing: false,
                hooked: false,
                rank: None,
            }
        }

        fn screen(app: &App, width: u16) -> String {
            let mut terminal = Terminal::new(TestBackend::new(width, 8)).expect("test backend");
            terminal.draw(|f| draw(f, f.area(), app)).expect("draw");
            crate::ui::buffer_text(terminal.backend().buffer())
        }

        /// The table line that holds `needle`.
        fn line_of<'a>(text: &'a str, needle: &str) -> &'a str {
            text.lines()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no line holds {needle}: {text}"))
        }

        #[test]
        fn each_process_names_its_framework() {
            let mut app = App::new(1.0);
            app.rows = vec![
                row(101, Some(vec![Framework::Jax])),
                row(102, Some(vec![Framework::PyTorch, Framework::CuPy])),
                row(103, Some(vec![])),
                row(104, None),
            ];
            let text = screen(&app, 120);
            assert!(line_of(&text, "PID").contains("FRAMEWORK"), "{text}");
            assert!(line_of(&text, "job101").contains("JAX/XLA"), "{text}");
            assert!(line_of(&text, "job102").contains("PyTorch +1"), "{text}");
            // The framework cell sits just before the command.
            assert!(
                line_of(&text, "job103").contains(" -            python job103"),
                "{text}"
            );
            assert!(
                line_of(&text, "job104").contains(" ?            python job104"),
                "{text}"
            );
            // 80 columns: the column gives way, the command keeps its room.
            let narrow = screen(&app, 80);
            assert!(!narrow.contains("FRAMEWORK"), "{narrow}");
            assert!(!narrow.contains("JAX/XLA"), "{narrow}");
            assert!(
                line_of(&narrow, "101").contains("python job101.py"),
                "{narrow}"
            );
        }

        #[test]
        fn no_framework_named_anywhere_means_no_column() {
            let mut app = App::new(1.0);
            app.rows = vec![row(201, Some(vec![])), row(202, None)];
            let text = screen(&app, 160);
            assert!(!text.contains("FRAMEWORK"), "{text}");
            assert!(line_of(&text, "PID").contains("COMMAND"), "{text}");
        }
    }
}
