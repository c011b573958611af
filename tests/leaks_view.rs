//! The leaks view drawn from hand-built detector output: snapshots at the two common
//! terminal sizes, and every size down to nothing without a panic.

use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::Color;
use ratatui::widgets::{Block, Widget};
use ratatui::Terminal;
use vramtop::alloc::{LiveBlock, TagId};
use vramtop::leaks::{
    ProcessTrend, RetainedSite, SiteDiff, SiteTrend, Suspect, TrendConfig, UnattributedTrend,
};
use vramtop::ui::leaks::LeaksView;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const SECOND: u64 = 1_000_000_000;

struct Data {
    suspects: Vec<Suspect>,
    sites: Vec<SiteTrend>,
    diff: Vec<SiteDiff>,
    oldest: Vec<LiveBlock>,
    processes: Vec<ProcessTrend>,
    unattributed: UnattributedTrend,
}

fn floors(step: u64, n: u64) -> Vec<u64> {
    (0..n).map(|i| i * step).collect()
}

fn live_block(id: u64, tag: &str, size: u64, age_s: u64) -> LiveBlock {
    LiveBlock {
        id,
        addr: 0x7f00_0000_0000 + id * 4 * MIB,
        size,
        requested: size,
        stream: 0,
        tag: TagId(0),
        tag_name: tag.to_string(),
        born_ns: 0,
        age_ns: age_s * SECOND,
        pending_free: false,
    }
}

fn data() -> Data {
    let suspects = vec![
        Suspect {
            tag: "torch_trace.py:68 step".into(),
            live_bytes: 80 * MIB,
            live_blocks: 20,
            floor_bytes: 76 * MIB,
            growth_bytes_per_window: 4 * MIB,
            windows_growing: 19,
            first_seen: 1,
            retained_with: vec![RetainedSite {
                tag: "torch_trace.py:67 step".into(),
                live_bytes: 80 * MIB,
                live_blocks: 20,
                growth_bytes_per_window: 4 * MIB,
            }],
        },
        Suspect {
            tag: "data/loader.py:212 collate_and_pin_memory_for_the_next_batch".into(),
            live_bytes: 3 * MIB,
            live_blocks: 6,
            floor_bytes: 3 * MIB,
            growth_bytes_per_window: 512 * 1024,
            windows_growing: 4,
            first_seen: 15,
            retained_with: Vec::new(),
        },
    ];
    let sites = vec![
        SiteTrend {
            tag: "(no user frame)".into(),
            live_bytes: 96 * MIB,
            live_blocks: 3,
            floors: vec![96 * MIB; 20],
        },
        SiteTrend {
            tag: "torch_trace.py:68 step".into(),
            live_bytes: 80 * MIB,
            live_blocks: 20,
            floors: floors(4 * MIB, 20),
        },
        SiteTrend {
            tag: "torch_trace.py:67 step".into(),
            live_bytes: 80 * MIB,
            live_blocks: 20,
            floors: floors(4 * MIB, 20),
        },
        SiteTrend {
            tag: "transformers/pytorch_utils.py:119 forward".into(),
            live_bytes: 33 * MIB,
            live_blocks: 2,
            floors: vec![33 * MIB; 20],
        },
        SiteTrend {
            tag: "data/loader.py:212 collate_and_pin_memory_for_the_next_batch".into(),
            live_bytes: 3 * MIB,
            live_blocks: 6,
            floors: vec![
                0,
                0,
                0,
                MIB / 2,
                MIB,
                3 * MIB / 2,
                2 * MIB,
                5 * MIB / 2,
                3 * MIB,
            ],
        },
    ];
    let diff = vec![
        SiteDiff {
            tag: "torch_trace.py:68 step".into(),
            bytes: 120 * MIB,
            blocks: 40,
        },
        SiteDiff {
            tag: "torch_trace.py:67 step".into(),
            bytes: 80 * MIB,
            blocks: 20,
        },
        SiteDiff {
            tag: "optim.py:120 step".into(),
            bytes: 512 * 1024,
            blocks: 1,
        },
    ];
    let oldest = vec![
        live_block(
            1,
            "transformers/pytorch_utils.py:119 forward",
            32 * MIB,
            754,
        ),
        live_block(2, "transformers/pytorch_utils.py:119 forward", MIB, 754),
        live_block(9, "torch_trace.py:67 step", 4 * MIB, 312),
        live_block(11, "torch_trace.py:68 step", 4 * MIB, 311),
        live_block(30, "torch_trace.py:67 step", 4 * MIB, 290),
        live_block(32, "torch_trace.py:68 step", 4 * MIB, 289),
        live_block(51, "torch_trace.py:67 step", 4 * MIB, 268),
        live_block(53, "torch_trace.py:68 step", 4 * MIB, 267),
        live_block(72, "torch_trace.py:67 step", 4 * MIB, 246),
        live_block(74, "torch_trace.py:68 step", 4 * MIB, 245),
    ];
    let processes = vec![
        ProcessTrend {
            pid: 4242,
            samples: 60,
            current_bytes: 12 * GIB + 300 * MIB,
            high_water_bytes: 12 * GIB + 300 * MIB,
            slope_bytes_per_s: Some(8.0 * MIB as f64),
            growing: true,
            of_allocated: true,
        },
        ProcessTrend {
            pid: 5151,
            samples: 60,
            current_bytes: 2 * GIB,
            high_water_bytes: 3 * GIB,
            slope_bytes_per_s: Some(-1024.0),
            growing: false,
            of_allocated: false,
        },
        ProcessTrend {
            pid: 77,
            samples: 1,
            current_bytes: 300 * MIB,
            high_water_bytes: 300 * MIB,
            slope_bytes_per_s: None,
            growing: false,
            of_allocated: false,
        },
    ];
    let unattributed = UnattributedTrend {
        samples: 60,
        current_bytes: Some(448 * MIB),
        min_bytes: Some(440 * MIB),
        flagged: true,
    };
    Data {
        suspects,
        sites,
        diff,
        oldest,
        processes,
        unattributed,
    }
}

fn view(d: &Data) -> LeaksView<'_> {
    LeaksView::new(&d.suspects, &d.sites)
        .since_mark(Some(&d.diff))
        .oldest_blocks(&d.oldest)
        .processes(&d.processes)
        .unattributed(
            Some(&d.unattributed),
            TrendConfig::default().unattributed_bytes,
        )
        .block(Block::bordered().title(" Leaks "))
}

fn draw(widget: impl Widget, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    terminal
        .draw(|frame| frame.render_widget(widget, frame.area()))
        .expect("draw");
    terminal.backend().buffer().clone()
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

fn row_of(buf: &Buffer, needle: &str) -> Option<u16> {
    let t = text(buf);
    t.lines().position(|l| l.contains(needle)).map(|y| y as u16)
}

#[test]
fn leaks_view_120x40() {
    let d = data();
    insta::assert_snapshot!(text(&draw(view(&d), 120, 40)));
}

#[test]
fn leaks_view_80x24() {
    let d = data();
    insta::assert_snapshot!(text(&draw(view(&d), 80, 24)));
}

#[test]
fn leaks_view_without_suspects_or_mark() {
    let d = data();
    let quiet = LeaksView::new(&[], &d.sites[3..4])
        .oldest_blocks(&d.oldest[..2])
        .block(Block::bordered().title(" Leaks "));
    insta::assert_snapshot!(text(&draw(quiet, 80, 12)));
}

#[test]
fn suspects_are_red_and_growing_processes_flagged() {
    let d = data();
    let buf = draw(view(&d), 120, 40);
    let y = row_of(&buf, "torch_trace.py:68 step").unwrap_or_else(|| panic!("no suspect row"));
    assert_eq!(buf[(1, y)].fg, Color::Red);
    let y = row_of(&buf, "4242").unwrap_or_else(|| panic!("no process row"));
    assert!(text(&buf)
        .lines()
        .nth(usize::from(y))
        .is_some_and(|l| l.contains("growing")));
    assert_eq!(buf[(1, y)].fg, Color::Red);
    let y = row_of(&buf, "5151").unwrap_or_else(|| panic!("no process row"));
    assert_ne!(buf[(1, y)].fg, Color::Red);
    assert!(text(&buf).contains("since mark: +120.0 MiB in 40 blocks at torch_trace.py:68 step"));
}

#[test]
fn the_verdict_survives_short_areas() {
    let d = data();
    // Four rows inside the border: the suspects keep theirs, the tables go.
    let buf = draw(view(&d), 80, 6);
    let t = text(&buf);
    assert!(t.contains("torch_trace.py:68 step"), "{t}");
    assert!(!t.contains("oldest live"), "{t}");
    // One row: a summary line.
    let buf = draw(view(&d), 80, 3);
    assert!(text(&buf).contains("2 leak suspects: torch_trace.py:68 step +4.0 MiB/window"));
}

#[test]
fn every_size_down_to_nothing_draws_without_panic() {
    let d = data();
    for width in 0..=45u16 {
        for height in 0..=14u16 {
            draw(view(&d), width, height);
            draw(LeaksView::new(&d.suspects, &d.sites), width, height);
        }
    }
    for width in [60, 99, 100, 101, 160, 250] {
        for height in [1, 2, 5, 9, 17, 60] {
            draw(view(&d), width, height);
        }
    }
}
