//! The allocator region for a job of several ranks (torchrun, accelerate): a row per
//! rank with the figures that tell ranks apart, then, when the width allows, every rank's
//! block map side by side on one scale (an imbalance shows at a glance), else the chosen
//! rank's own region (`attached::draw`).
//!
//! ```text
//! ┌ 2 ranks (world 2) · launcher 4100 · 0-9/Tab choose · job torchrun --nproc-per-node 2 ┐
//! │ rank 1 (pid 4102) ran out of memory                                                     │
//! │ rank  pid   gpu  reserved  allocated  largest free  ext frag  OOMs  leaks  state        │
//! │ ▶ 0   4101  0    3.1 GiB   2.0 GiB    120.0 MiB     0.12      0     0      running      │
//! │   1   4102  0    5.9 GiB   5.2 GiB    20.0 MiB      0.31      1     0      running      │
//! └─────────────────────────────────────────────────────────────────────────────────────────┘
//!  same scale in every column: 1 cell = 2.0 MiB (...)
//!  rank 0 · pid 4101 · ...               rank 1 · pid 4102 · ...
//!  ██████▌·····═════██████                ██████████████▌····
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::allocator::compare_scale;
use super::attached;
use super::blockmap::{needs_overview, BlockMap, BlockOverview};
use crate::app::{App, RankOom};
use vramtop_alloc::human_bytes;
use vramtop_attach::{JobView, RankGroup};

/// The narrowest column a rank's block map is drawn side by side in; below it, only the
/// chosen rank's map is drawn, full width.
const MIN_MAP_COLUMN: u16 = 60;
/// Side-by-side maps need this many rows to show more than a band or two.
const MIN_MAP_ROWS: u16 = 8;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, group: &RankGroup, shown: &JobView) {
    // The banner speaks of this job's ranks only.
    let rank_oom = app.rank_oom.filter(|o| group.position(o.pid).is_some());
    let oom_rows = u16::from(rank_oom.is_some());
    let table_rows = group.ranks.len() as u16 + 1;
    let overview_rows = (2 + oom_rows + table_rows).min(area.height);
    let [overview, below] =
        Layout::vertical([Constraint::Length(overview_rows), Constraint::Min(0)]).areas(area);
    draw_overview(frame, overview, rank_oom, group, shown);
    let n = group.ranks.len() as u16;
    let all_mapped = group.ranks.iter().all(|j| j.map().is_some());
    // Side by side when every rank has a map and there is room for them under the
    // chosen rank's OOM lines; else the chosen rank's own region.
    let head = (all_mapped && below.width >= n.saturating_mul(MIN_MAP_COLUMN))
        .then(|| attached::head_lines(shown, below.width))
        .filter(|head| below.height >= attached::head_rows(head) + 2 + MIN_MAP_ROWS);
    match head {
        Some(head) => draw_side_by_side(frame, below, group, shown, head),
        None => attached::draw(frame, below, app, shown),
    }
}

fn draw_overview(
    frame: &mut Frame,
    area: Rect,
    rank_oom: Option<RankOom>,
    group: &RankGroup,
    shown: &JobView,
) {
    if area.height < 3 {
        return;
    }
    // Counts first: a long command is what the border cuts.
    let world = group
        .world_size()
        .map_or_else(String::new, |w| format!(" (world {w})"));
    let mut title = vec![Span::styled(
        format!(" {} ranks{world} ", group.ranks.len()),
        Style::new().bold(),
    )];
    if let Some(pid) = group.parent_pid.filter(|_| group.launcher.is_some()) {
        title.push(Span::raw(format!("· launcher {pid} ")));
    }
    title.push(Span::styled("· 0-9/Tab choose ", Style::new().dark_gray()));
    title.push(Span::styled(
        format!("· job {} ", group.command().unwrap_or_else(|| "?".into())),
        Style::new().bold(),
    ));
    let block = Block::new().borders(Borders::ALL).title(Line::from(title));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let mut table_area = inner;
    if let Some(oom) = rank_oom {
        let [line, rest] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(inner);
        frame.render_widget(
            Paragraph::new(format!(
                " rank {} (pid {}) ran out of memory",
                oom.rank, oom.pid
            ))
            .bold()
            .red(),
            line,
        );
        table_area = rest;
    }
    let header = Row::new(
        [
            "rank",
            "pid",
            "gpu",
            "reserved",
            "allocated",
            "largest free",
            "ext frag",
            "OOMs",
            "leaks",
            "params / grads / optim / act",
            "state",
        ]
        .map(|h| Cell::from(h).bold()),
    );
    let rows = group
        .ranks
        .iter()
        .map(|job| rank_row(job, job.pid == shown.pid));
    let widths = [
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Length(4),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(13),
        Constraint::Length(9),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(ROLES_WIDTH),
        Constraint::Min(8),
    ];
    frame.render_widget(
        Table::new(rows, widths).header(header).column_spacing(1),
        table_area,
    );
}

/// Cells of the roles column: four sizes such as "311.0 MiB" and their separators.
const ROLES_WIDTH: u16 = 44;

fn rank_row(job: &JobView, selected: bool) -> Row<'static> {
    let rank = job.rank().map_or_else(|| "?".into(), |r| r.to_string());
    let marker = if selected { "▶ " } else { "  " };
    let state = if job.ended {
        match job.exit_code {
            Some(code) => format!("ended (exit {code})"),
            None => "ended".into(),
        }
    } else if !job.connected {
        job.last_drop
            .clone()
            .unwrap_or_else(|| "not connected".into())
    } else if !job.cuda_ready() {
        "waiting for CUDA".into()
    } else {
        "running".into()
    };
    let mut cells = vec![format!("{marker}{rank}"), job.pid.to_string()];
    match job.figures() {
        // No segments under another backend than PyTorch's own: nothing to say of free
        // runs, rather than "0 B" and "0.00".
        Some(f) if job.blocks_untracked() => {
            let (allocated, reserved) = job.torch_totals_shown();
            cells.extend([
                f.device.to_string(),
                reserved,
                allocated,
                "-".to_string(),
                "-".to_string(),
                f.ooms.to_string(),
                f.leak_suspects.to_string(),
            ]);
        }
        Some(f) => cells.extend([
            f.device.to_string(),
            human_bytes(f.reserved_bytes),
            human_bytes(f.allocated_bytes),
            human_bytes(f.largest_free_bytes),
            format!("{:.2}", f.external_fragmentation),
            f.ooms.to_string(),
            f.leak_suspects.to_string(),
        ]),
        None => cells.extend(["-"; 7].map(String::from)),
    }
    // What each rank's memory is for (hook 1.4): the ranks of one job should agree on
    // parameters and optimizer state; a rank that differs holds something the others
    // do not.
    cells.push(job.frame.as_deref().and_then(|f| f.roles).map_or_else(
        || "-".to_string(),
        |r| {
            [r.parameters, r.gradients, r.optimizer_state, r.other]
                .map(human_bytes)
                .join(" / ")
        },
    ));
    cells.push(state);
    let failed = job.oom.is_some();
    let style = match (selected, failed) {
        (true, true) => Style::new().bold().white().on_red(),
        (true, false) => Style::new().bold().reversed(),
        (false, true) => Style::new().red(),
        (false, false) => Style::new(),
    };
    Row::new(cells).style(style)
}

/// Every rank's block map in its own column, one scale for all, with the chosen rank's
/// OOM lines (and remedies) above them.
fn draw_side_by_side(
    frame: &mut Frame,
    area: Rect,
    group: &RankGroup,
    shown: &JobView,
    head: Vec<(Line<'static>, u16)>,
) {
    let [head_area, scale_row, maps] = Layout::vertical([
        Constraint::Length(attached::head_rows(&head)),
        Constraint::Length(1),
        Constraint::Min(0),
    ])
    .areas(area);
    attached::draw_head(frame, head_area, head);
    let n = group.ranks.len() as u32;
    let columns = Layout::horizontal((0..n).map(|_| Constraint::Ratio(1, n)))
        .spacing(2)
        .split(maps);
    let split = |col: Rect| {
        let [head, map] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(col);
        (head, map)
    };
    let views: Vec<_> = group.ranks.iter().filter_map(|j| j.map()).collect();
    let fit = views
        .iter()
        .zip(columns.iter())
        .map(|(m, col)| BlockMap::new(&m.layout).fitted_bytes_per_cell(split(*col).1))
        .max()
        .unwrap_or(1);
    let (scale, why) = compare_scale(fit, views.iter().map(|m| m.stats.largest_free_bytes));
    frame.render_widget(
        Paragraph::new(format!(
            " ranks side by side, same scale: 1 cell = {} ({why})",
            human_bytes(scale)
        ))
        .dark_gray(),
        scale_row,
    );
    for (job, col) in group.ranks.iter().zip(columns.iter()) {
        let (Some(map), Some(figures)) = (job.map(), job.figures()) else {
            continue;
        };
        let (head, map_area) = split(*col);
        let style = match (job.pid == shown.pid, job.oom.is_some()) {
            (_, true) => Style::new().bold().white().on_red(),
            (true, false) => Style::new().bold().reversed(),
            (false, false) => Style::new().bold(),
        };
        let rank = job.rank().map_or_else(|| "?".into(), |r| r.to_string());
        frame.render_widget(
            Paragraph::new(Line::from(vec![
                Span::styled(format!(" rank {rank} · pid {} ", job.pid), style),
                Span::raw(format!(
                    " reserved {}  allocated {}  frag {:.2}",
                    human_bytes(figures.reserved_bytes),
                    human_bytes(figures.allocated_bytes),
                    figures.external_fragmentation
                )),
            ])),
            head,
        );
        // More segments than rows: packed cells keep the holes visible.
        if needs_overview(&map.layout, map_area.height, 0) {
            frame.render_widget(BlockOverview::new(&map.layout), map_area);
        } else {
            frame.render_widget(BlockMap::new(&map.layout).scale(scale), map_area);
        }
    }
}
