//! Draw time of the block map and fragmentation panel over a large synthetic layout.
//! The timing is meaningful only in release:
//! `cargo test --release --test blockmap_bench -- --ignored --nocapture`.

use std::time::Duration;

use ratatui::layout::Rect;
use vramtop::ui::blockmap::BlockMap;
use vramtop::ui::fixtures::{bench_draw, synthetic_layout};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

#[test]
fn synthetic_layout_is_well_formed_and_deterministic() {
    let layout = synthetic_layout(20_000, 7);
    assert_eq!(layout, synthetic_layout(20_000, 7));
    let live = layout
        .segments
        .iter()
        .flat_map(|s| &s.runs)
        .filter(|r| r.id.is_some())
        .count();
    assert_eq!(live, 20_000);
    for pair in layout.segments.windows(2) {
        assert!(pair[0].addr + pair[0].size <= pair[1].addr);
    }
    for seg in &layout.segments {
        let mut pos = seg.addr;
        for run in &seg.runs {
            assert_eq!(run.addr, pos, "runs tile their segment");
            assert!(run.size > 0);
            pos += run.size;
        }
        assert_eq!(pos, seg.addr + seg.size);
    }
}

#[test]
fn bench_draw_runs() {
    assert_eq!(bench_draw(2_000, 80, 24, 2).len(), 2);
}

#[test]
#[ignore = "timing: run in release"]
fn draw_100k_blocks_at_200x60() {
    // Every segment must be in view, or the bench would skip most runs.
    let layout = synthetic_layout(100_000, 42);
    let geo = BlockMap::new(&layout).geometry(Rect::new(0, 0, 200, 60));
    println!(
        "{} segments, {} rows of {} in view, 1 cell = {} B",
        layout.segments.len(),
        geo.total_rows,
        geo.visible_rows,
        geo.bytes_per_cell
    );
    assert!(geo.total_rows <= usize::from(geo.visible_rows));
    let samples = bench_draw(100_000, 200, 60, 300);
    let median = median(samples);
    println!("median frame (100k blocks, 200x60): {median:?}");
    assert!(median < Duration::from_millis(5), "{median:?}");
}
