//! Block map, segment table and fragmentation panel drawn into buffers from hand-built
//! layouts: snapshots for how they look, assertions for what must hold.

use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::widgets::{Block, StatefulWidget, TableState, Widget};
use ratatui::Terminal;
use vramtop::alloc::{BlockState, Layout, LayoutRun, OomReport, Pool, SegmentLayout, TagId};
use vramtop::ui::blockmap::{needs_overview, BlockMap, BlockOverview, SegmentTable};
use vramtop::ui::fixtures::{stats_from_layout, synthetic_layout};
use vramtop::ui::fragmentation::FragmentationPanel;
use vramtop::ui::theme;

const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;

fn run(addr: u64, size: u64, state: BlockState, tag: Option<u32>) -> LayoutRun {
    let live = matches!(state, BlockState::Allocated | BlockState::PendingFree);
    LayoutRun {
        addr,
        size,
        state,
        requested: if live { size - size / 8 } else { 0 },
        id: live.then_some(addr),
        tag: tag.map(TagId),
        stream: live.then_some(0),
        born_ns: live.then_some(addr - BASE),
    }
}

/// A segment tiled by `parts` (size, state, tag) in order.
fn segment(addr: u64, parts: &[(u64, BlockState, Option<u32>)]) -> SegmentLayout {
    let mut pos = addr;
    let runs = parts
        .iter()
        .map(|&(size, state, tag)| {
            let r = run(pos, size, state, tag);
            pos += size;
            r
        })
        .collect();
    SegmentLayout {
        addr,
        size: pos - addr,
        pool: Pool::Large,
        stream: Some(0),
        runs,
    }
}

fn layout(segments: Vec<SegmentLayout>) -> Layout {
    Layout {
        capacity: segments.iter().map(|s| s.size).sum::<u64>() * 2,
        segments,
        tags: vec!["forward".into(), "backward".into(), "optim".into()],
        ..Layout::default()
    }
}

fn one_full_segment() -> Layout {
    layout(vec![segment(
        BASE,
        &[(20 * MIB, BlockState::Allocated, Some(0))],
    )])
}

fn checkerboard() -> Layout {
    let parts: Vec<_> = (0..32)
        .map(|i| {
            if i % 2 == 0 {
                (2 * MIB, BlockState::Allocated, Some(i % 3))
            } else {
                (2 * MIB, BlockState::Free, None)
            }
        })
        .collect();
    layout(vec![segment(BASE, &parts)])
}

/// 10k blocks of 512 B..2 KiB over four segments, a 1.5 KiB hole after every 7th.
fn tiny_blocks() -> Layout {
    let mut segments = Vec::new();
    let mut addr = BASE;
    for s in 0..4u32 {
        let mut parts = Vec::new();
        for i in 0..2500u32 {
            parts.push((
                512 << (i % 3),
                BlockState::Allocated,
                Some((i / 50 + s) % 3),
            ));
            if i % 7 == 6 {
                parts.push((1536, BlockState::Free, None));
            }
        }
        let seg = segment(addr, &parts);
        addr += seg.size.div_ceil(2 * MIB) * 2 * MIB + 2 * MIB;
        segments.push(seg);
    }
    layout(segments)
}

/// An expandable segment: 1 GiB of address space, the first 384 MiB mapped.
fn expandable() -> Layout {
    use BlockState::*;
    let parts = [
        (96 * MIB, Allocated, Some(0)),
        (32 * MIB, Free, None),
        (64 * MIB, PendingFree, Some(1)),
        (40 * MIB, Allocated, Some(2)),
        (24 * MIB, Free, None),
        (128 * MIB, Allocated, Some(0)),
        (640 * MIB, Unmapped, None),
    ];
    layout(vec![segment(BASE, &parts)])
}

/// The buffer as text, one line per row, trailing blanks cut.
fn text(buf: &Buffer) -> String {
    let area = buf.area;
    (area.top()..area.bottom())
        .map(|y| {
            let row: String = (area.left()..area.right())
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect();
            row.trim_end().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn draw(widget: impl Widget, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    terminal
        .draw(|frame| frame.render_widget(widget, frame.area()))
        .expect("draw");
    terminal.backend().buffer().clone()
}

fn snapshot_map(name: &str, layout: &Layout) {
    for (width, height) in [(120, 40), (80, 24)] {
        let buf = draw(BlockMap::new(layout), width, height);
        insta::assert_snapshot!(format!("{name}_{width}x{height}"), text(&buf));
    }
}

#[test]
fn map_empty() {
    snapshot_map("map_empty", &Layout::default());
}

#[test]
fn map_one_full_segment() {
    snapshot_map("map_one_full_segment", &one_full_segment());
}

#[test]
fn map_checkerboard() {
    snapshot_map("map_checkerboard", &checkerboard());
}

#[test]
fn map_tiny_blocks() {
    snapshot_map("map_tiny_blocks", &tiny_blocks());
}

#[test]
fn map_expandable() {
    snapshot_map("map_expandable", &expandable());
}

#[test]
fn map_in_a_block_zoomed_and_scrolled() {
    let layout = expandable();
    let map = BlockMap::new(&layout)
        .block(Block::bordered().title(" Block map "))
        .zoom(2)
        .scroll_rows(3)
        .selected(Some(0));
    insta::assert_snapshot!(text(&draw(map, 80, 12)));
}

/// Cells of the map area (no gutter, no legend) with their symbols and styles.
fn cells_of(layout: &Layout, width: u16, height: u16) -> (Buffer, u16) {
    let map = BlockMap::new(layout).legend(false);
    let gutter = map.geometry(Rect::new(0, 0, width, height)).gutter;
    (draw(map, width, height), gutter)
}

#[test]
fn largest_free_run_is_highlighted() {
    use BlockState::*;
    // 16 MiB at 40 columns without a gutter: exactly 1 MiB per cell (16 cells).
    let layout = layout(vec![segment(
        BASE,
        &[
            (4 * MIB, Allocated, Some(0)),
            (2 * MIB, Free, None),
            (2 * MIB, Allocated, Some(1)),
            (6 * MIB, Free, None),
            (2 * MIB, Allocated, Some(2)),
        ],
    )]);
    let area = Rect::new(0, 0, 16, 1);
    let geo = BlockMap::new(&layout).legend(false).geometry(area);
    assert_eq!((geo.gutter, geo.bytes_per_cell), (0, MIB));
    let (buf, _) = cells_of(&layout, 16, 1);
    let row: String = (0..16).map(|x| buf[(x, 0)].symbol().to_string()).collect();
    assert_eq!(row, "████··██══════██");
    for x in 8..14 {
        assert_eq!(buf[(x, 0)].bg, theme::LARGEST_FREE_BG, "cell {x}");
    }
    assert_ne!(buf[(4, 0)].bg, theme::LARGEST_FREE_BG);
    // Tag colours are per tag id, stable.
    assert_eq!(buf[(0, 0)].fg, theme::tag_color(Some(TagId(0))));
    assert_eq!(buf[(6, 0)].fg, theme::tag_color(Some(TagId(1))));
}

#[test]
fn partly_used_cells_use_left_eighths() {
    use BlockState::*;
    // 8 cells of 1 MiB: a half-used cell, a 1/8 cell, a 7/8 cell, pending, the largest
    // free run, unmapped.
    let layout = layout(vec![segment(
        BASE,
        &[
            (MIB / 2, Allocated, Some(0)),
            (MIB / 2 + MIB - MIB / 8, Free, None),
            (MIB / 8, Allocated, Some(1)),
            (MIB / 8, Free, None),
            (MIB - MIB / 8, Allocated, Some(2)),
            (MIB, PendingFree, Some(0)),
            (2 * MIB, Free, None),
            (2 * MIB, Unmapped, None),
        ],
    )]);
    let (buf, gutter) = cells_of(&layout, 8, 1);
    assert_eq!(gutter, 0);
    let row: String = (0..8).map(|x| buf[(x, 0)].symbol().to_string()).collect();
    assert_eq!(row, "▌▏▉░══╌╌");
    assert_eq!(buf[(4, 0)].bg, theme::LARGEST_FREE_BG);
    // A smaller free run behind a partly used cell is not highlighted.
    assert_ne!(buf[(0, 0)].bg, theme::LARGEST_FREE_BG);
}

#[test]
fn pending_free_and_unmapped_are_distinct() {
    let (buf, gutter) = cells_of(&expandable(), 80, 4);
    let symbols: String = (gutter..80)
        .map(|x| buf[(x, 0)].symbol().to_string())
        .collect();
    assert!(symbols.contains(theme::SYM_PENDING_FREE), "{symbols}");
    assert!(symbols.contains(theme::SYM_UNMAPPED), "{symbols}");
    assert!(symbols.contains(theme::SYM_LARGEST_FREE), "{symbols}");
}

#[test]
fn zoom_halves_and_doubles_the_cell() {
    let layout = checkerboard();
    let area = Rect::new(0, 0, 80, 24);
    let fit = BlockMap::new(&layout).geometry(area);
    assert!(fit.bytes_per_cell.is_power_of_two());
    assert!(fit.total_rows <= usize::from(fit.visible_rows));
    // At half the cell size it would not fit: the fit is the smallest that does.
    let zoomed = BlockMap::new(&layout).zoom(1).geometry(area);
    assert_eq!(zoomed.bytes_per_cell, fit.bytes_per_cell / 2);
    assert!(zoomed.total_rows > usize::from(zoomed.visible_rows) || fit.bytes_per_cell == 1);
    let out = BlockMap::new(&layout).zoom(-1).geometry(area);
    assert_eq!(out.bytes_per_cell, fit.bytes_per_cell * 2);
}

#[test]
fn segment_rows_map_rows_to_segments() {
    let layout = tiny_blocks();
    let area = Rect::new(0, 0, 80, 24);
    let map = BlockMap::new(&layout).zoom(3);
    let geo = map.geometry(area);
    let bands = map.segment_rows(area);
    assert_eq!(bands.len(), 4);
    let mut next = 0;
    for (i, band) in bands.iter().enumerate() {
        assert_eq!((band.segment, band.first_row), (i, next));
        assert!(band.rows >= 1);
        assert_eq!(geo.segment_at_row(band.first_row), Some(i));
        assert_eq!(geo.segment_at_row(band.first_row + band.rows - 1), Some(i));
        next += band.rows;
    }
    assert_eq!(geo.segment_at_row(next), None);
    assert_eq!(geo.total_rows, next);
    // Selecting the last segment scrolls to its band; the scroll is clamped on render.
    let scroll = geo.scroll_to_segment(3);
    assert_eq!(scroll, bands[3].first_row);
    let scrolled = BlockMap::new(&layout)
        .zoom(3)
        .scroll_rows(usize::MAX)
        .geometry(area);
    assert_eq!(
        scrolled.scroll_rows,
        geo.total_rows - usize::from(geo.visible_rows)
    );
}

#[test]
fn tiny_and_odd_areas_never_panic() {
    let layouts = [
        Layout::default(),
        one_full_segment(),
        checkerboard(),
        expandable(),
        synthetic_layout(2_000, 1),
    ];
    let sizes = [(0, 0), (1, 1), (10, 3), (3, 10), (1, 40), (200, 1), (25, 2)];
    for layout in &layouts {
        let stats = stats_from_layout(layout);
        let history = [0, 500, 2000, 999];
        for (w, h) in sizes {
            for zoom in [-100, -1, 0, 5, 100] {
                let map = BlockMap::new(layout).zoom(zoom).scroll_rows(usize::MAX / 2);
                draw(map.block(Block::bordered()), w, h);
            }
            draw(FragmentationPanel::new(&stats, &history), w, h);
            if let Some(seg) = layout.segments.first() {
                let mut state = TableState::new().with_selected(Some(usize::MAX));
                let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
                let table = SegmentTable::new(seg, &layout.tags, 0);
                table.render(buf.area, &mut buf, &mut state);
            }
        }
    }
    // An area outside the buffer is clipped, not indexed.
    let mut buf = Buffer::empty(Rect::new(0, 0, 10, 3));
    BlockMap::new(&checkerboard()).render(Rect::new(5, 1, 50, 50), &mut buf);
}

fn oom() -> OomReport {
    OomReport {
        requested_bytes: 2 << 30,
        rounded_bytes: 2 << 30,
        total_free_bytes: 5_690_000_000,
        largest_free_bytes: 1_181_116_006,
        free_runs: 214,
        reserved_bytes: 0,
        capacity_bytes: 0,
        stream: 0,
    }
}

fn history() -> Vec<u64> {
    (0..120u64).map(|i| (i * i * 7 + i * 13) % 1000).collect()
}

#[test]
fn panel_without_oom() {
    let stats = stats_from_layout(&checkerboard());
    let history = history();
    let panel =
        FragmentationPanel::new(&stats, &history).block(Block::bordered().title(" Fragmentation "));
    insta::assert_snapshot!(text(&draw(panel, 60, 16)));
}

#[test]
fn panel_with_oom_is_red() {
    let mut stats = stats_from_layout(&synthetic_layout(5_000, 3));
    stats.ooms = 3;
    stats.retries = 12;
    stats.last_oom = Some(oom());
    let history = history();
    let buf = draw(FragmentationPanel::new(&stats, &history), 60, 16);
    let screen = text(&buf);
    insta::assert_snapshot!(screen);
    let (y, line) = screen
        .lines()
        .enumerate()
        .find(|(_, l)| l.starts_with("last OOM: needed 2.0 GiB contiguous"))
        .expect("the failed request is spelled out");
    assert!(line.len() > 10);
    assert_eq!(buf[(0, y as u16)].fg, Color::Red);
    // Short of rows, the gauge and the failed request are what is left.
    let short = text(&draw(FragmentationPanel::new(&stats, &history), 60, 3));
    assert!(
        short.contains("ext frag") && short.contains("last OOM: needed"),
        "{short}"
    );
}

#[test]
fn segment_table_lists_blocks() {
    let layout = expandable();
    let seg = &layout.segments[0];
    let mut state = TableState::new().with_selected(Some(2));
    let mut terminal = Terminal::new(TestBackend::new(80, 9)).expect("test backend");
    let now = 200 * MIB;
    terminal
        .draw(|frame| {
            let table = SegmentTable::new(seg, &layout.tags, now).block(Block::bordered());
            frame.render_stateful_widget(table, frame.area(), &mut state);
        })
        .expect("draw");
    insta::assert_snapshot!(text(terminal.backend().buffer()));
}

#[test]
fn segment_table_scrolls_to_the_selection() {
    let layout = tiny_blocks();
    let seg = &layout.segments[0];
    let mut state = TableState::new().with_selected(Some(500));
    let mut buf = Buffer::empty(Rect::new(0, 0, 80, 11));
    SegmentTable::new(seg, &layout.tags, 0).render(buf.area, &mut buf, &mut state);
    // 10 rows under the header: the selection is the last row in view.
    assert_eq!(state.offset(), 491);
    let last = text(&buf).lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("▶ 0x"), "{last}");
    assert!(
        last.contains(&format!("{:#x}", seg.runs[500].addr)),
        "{last}"
    );
}

/// PyTorch's expandable segments after `empty_cache`: the whole pages of a free run are
/// unmapped, the partial page at its end stays mapped (cached) and is drawn as free, apart
/// from the unmapped space before it. The layout comes from the real policy.
#[test]
fn pytorch_expandable_mapped_free_pages_are_drawn_apart_from_unmapped() {
    use vramtop::alloc::{AllocConfig, Allocator, PolicyKind};
    use vramtop::backing::BookkeepingBacking;
    let a = Allocator::new(
        PolicyKind::PytorchExpandable,
        Box::new(BookkeepingBacking::new(1 << 30)),
        AllocConfig::default(),
    );
    let blocks: Vec<_> = (0..3)
        .map(|_| a.alloc(25 * MIB, 0, "t").expect("alloc"))
        .collect();
    a.free(&blocks[0]).expect("free");
    a.free(&blocks[1]).expect("free");
    a.empty_cache();
    // [0,40) unmapped, [40,50) mapped and free, [50,75) live, [75,80) mapped and free.
    let layout = a.layout();
    let seg = &layout.segments[0];
    assert_eq!(seg.size, 80 * MIB);
    let map = BlockMap::new(&layout).legend(false);
    let area = Rect::new(0, 0, 100, 1);
    let geo = map.geometry(area);
    let buf = draw(map, 100, 1);
    let expect = |offset: u64| match offset / MIB {
        0..40 => theme::SYM_UNMAPPED,
        40..50 => theme::SYM_LARGEST_FREE,
        50..75 => theme::SYM_ALLOCATED,
        _ => theme::SYM_FREE,
    };
    let mut checked = 0;
    for x in 0..geo.cells_per_row {
        let (lo, hi) = (
            u64::from(x) * geo.bytes_per_cell,
            u64::from(x + 1) * geo.bytes_per_cell,
        );
        if hi > seg.size || expect(lo) != expect(hi - 1) {
            continue;
        }
        assert_eq!(
            buf[(geo.gutter + x, 0)].symbol(),
            expect(lo),
            "cell {x} at {} MiB",
            lo / MIB
        );
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} cells checked");
}

/// GPU scale: 700 segments of 20 MiB, each 4 MiB used then 4 MiB free in turn (the
/// checkerboard after its free phase). More segments than rows: the overview packs them,
/// and the holes show as partly used cells instead of rows of `██`.
#[test]
fn overview_keeps_holes_visible_when_segments_outnumber_rows() {
    let segments: Vec<_> = (0..700u64)
        .map(|i| {
            let parts: Vec<_> = (0..5)
                .map(|k| {
                    if k % 2 == 0 {
                        (4 * MIB, BlockState::Allocated, Some(0))
                    } else {
                        (4 * MIB, BlockState::Free, None)
                    }
                })
                .collect();
            segment(BASE + i * 20 * MIB, &parts)
        })
        .collect();
    let layout = layout(segments);
    let area = Rect::new(0, 0, 60, 12);
    assert!(needs_overview(&layout, area.height, 0));
    assert!(
        !needs_overview(&layout, area.height, 1),
        "zoom walks to single segments"
    );
    let mut buf = Buffer::empty(area);
    BlockOverview::new(&layout).render(area, &mut buf);
    let text = vramtop::ui::buffer_text(&buf);
    let cells: String = text.lines().take(11).collect();
    let full = cells.matches('█').count();
    let partial = cells.chars().filter(|c| "▏▎▍▌▋▊▉".contains(*c)).count();
    assert!(
        partial > full,
        "holes must show: {partial} partial vs {full} full\n{text}"
    );
    assert!(text.contains("overview: 700 segments packed"), "{text}");
    // 14000 MiB in 660 cells: 32 MiB a cell, each 12/20 used.
    assert!(text.contains("1 cell = 32M"), "{text}");
}
