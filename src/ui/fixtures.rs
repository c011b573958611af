//! Synthetic layouts and a draw benchmark for the memory widgets: realistic shapes
//! (many segments, live blocks with free holes, pending frees, unmapped tails) built
//! deterministically from a seed, without an allocator. For tests and benches only.

use std::time::{Duration, Instant};

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;

use crate::ui::blockmap::BlockMap;
use crate::ui::fragmentation::FragmentationPanel;
use vramtop_alloc::rng::Rng;
use vramtop_alloc::{
    BlockState, Layout, LayoutRun, PolicyKind, Pool, SegmentLayout, Stats, TagId, HIST_BUCKETS,
};

const MIB: u64 = 1 << 20;
/// Block sizes are rounded to this, as in PyTorch's caching allocator.
const ROUND: u64 = 512;
/// Segments are whole multiples of this (the CUDA VMM page size).
const SEGMENT_GRANULE: u64 = 2 * MIB;
const SITES: [&str; 8] = [
    "train.py:68 forward",
    "train.py:71 backward",
    "optim.py:120 step",
    "model.py:33 attn.qkv",
    "model.py:41 mlp",
    "data.py:12 batch",
    "kv_cache.py:88 grow",
    "eval.py:55 logits",
];

/// A layout of about `blocks` live blocks over many segments: one small-pool segment
/// (2 MiB, small blocks) in five, the others holding 1000..5000 blocks each with free
/// holes between them, one in ten with an unmapped tail as under the expandable policy.
pub fn synthetic_layout(blocks: usize, seed: u64) -> Layout {
    let mut rng = Rng::new(seed);
    let mut builder = SegmentBuilder {
        rng: &mut rng,
        next_id: 0,
        now_ns: 0,
    };
    let mut segments = Vec::new();
    let mut addr = 0x7f00_0000_0000u64;
    let mut live = 0usize;
    while live < blocks {
        let left = (blocks - live) as u64;
        let small = builder.rng.next_f64() < 0.2;
        let segment = if small {
            builder.small_segment(addr, left)
        } else {
            builder.large_segment(addr, left)
        };
        live += segment.runs.iter().filter(|r| r.id.is_some()).count();
        // Segments come from separate cudaMalloc calls: leave address gaps between them.
        addr += segment.size + builder.rng.range(0, 3) * SEGMENT_GRANULE;
        segments.push(segment);
    }
    let capacity = segments.iter().map(|s| s.size).sum::<u64>() * 5 / 4;
    Layout {
        policy: Some(PolicyKind::Caching),
        capacity,
        segments,
        tags: SITES.iter().map(|s| s.to_string()).collect(),
        generation: blocks as u64,
    }
}

struct SegmentBuilder<'r> {
    rng: &'r mut Rng,
    next_id: u64,
    now_ns: u64,
}

impl SegmentBuilder<'_> {
    /// Log-uniform in [lo, hi], rounded up to `ROUND`: many small blocks, few large.
    fn log_size(&mut self, lo: u64, hi: u64) -> u64 {
        let (lo, hi) = (lo.max(1) as f64, hi.max(lo) as f64);
        let size = (lo.ln() + self.rng.next_f64() * (hi.ln() - lo.ln())).exp() as u64;
        size.div_ceil(ROUND).max(1) * ROUND
    }

    fn block(&mut self, addr: u64, size: u64) -> LayoutRun {
        self.next_id += 1;
        self.now_ns += self.rng.range(1_000, 5_000_000);
        let pending = self.rng.next_f64() < 0.03;
        LayoutRun {
            addr,
            size,
            state: if pending {
                BlockState::PendingFree
            } else {
                BlockState::Allocated
            },
            requested: size - self.rng.range(0, ROUND - 1).min(size - 1),
            id: Some(self.next_id),
            tag: Some(TagId(self.rng.range(0, SITES.len() as u64 - 1) as u32)),
            stream: Some(0),
            born_ns: Some(self.now_ns),
        }
    }

    /// Blocks with free holes before a quarter of them, until `max_blocks` or `limit`
    /// bytes; returns the runs and the end address.
    fn fill(&mut self, addr: u64, max_blocks: u64, block_max: u64, limit: u64) -> Vec<LayoutRun> {
        let mut runs = Vec::new();
        let mut pos = addr;
        let mut placed = 0;
        while placed < max_blocks {
            if self.rng.next_f64() < 0.25 {
                let hole = self.log_size(ROUND, block_max);
                if pos + hole > limit {
                    break;
                }
                runs.push(free_run(pos, hole, BlockState::Free));
                pos += hole;
            }
            let size = self.log_size(ROUND, block_max);
            if pos + size > limit {
                break;
            }
            runs.push(self.block(pos, size));
            pos += size;
            placed += 1;
        }
        runs
    }

    fn small_segment(&mut self, addr: u64, left: u64) -> SegmentLayout {
        let size = SEGMENT_GRANULE;
        let count = self.rng.range(4, 40).min(left);
        let mut runs = self.fill(addr, count, 64 << 10, addr + size);
        close_segment(&mut runs, addr, size, None);
        segment(addr, size, Pool::Small, runs)
    }

    fn large_segment(&mut self, addr: u64, left: u64) -> SegmentLayout {
        let count = self.rng.range(1000, 5000).min(left);
        let mut runs = self.fill(addr, count, 8 * MIB, u64::MAX);
        let used = runs.last().map_or(0, |r| r.addr + r.size - addr);
        let mut size = used.div_ceil(SEGMENT_GRANULE).max(10) * SEGMENT_GRANULE;
        let unmapped = if self.rng.next_f64() < 0.1 {
            let tail = size / 4 / SEGMENT_GRANULE * SEGMENT_GRANULE;
            size += tail;
            Some(tail)
        } else {
            None
        };
        close_segment(&mut runs, addr, size, unmapped);
        segment(addr, size, Pool::Large, runs)
    }
}

fn free_run(addr: u64, size: u64, state: BlockState) -> LayoutRun {
    LayoutRun {
        addr,
        size,
        state,
        requested: 0,
        id: None,
        tag: None,
        stream: None,
        born_ns: None,
    }
}

/// Tiles the rest of the segment: a free run up to the unmapped tail, then the tail.
fn close_segment(runs: &mut Vec<LayoutRun>, addr: u64, size: u64, unmapped: Option<u64>) {
    let end = addr + size;
    let mapped_end = end - unmapped.unwrap_or(0);
    let pos = runs.last().map_or(addr, |r| r.addr + r.size);
    if pos < mapped_end {
        runs.push(free_run(pos, mapped_end - pos, BlockState::Free));
    }
    if mapped_end < end {
        runs.push(free_run(
            mapped_end.max(pos),
            end - mapped_end.max(pos),
            BlockState::Unmapped,
        ));
    }
}

fn segment(addr: u64, size: u64, pool: Pool, runs: Vec<LayoutRun>) -> SegmentLayout {
    SegmentLayout {
        addr,
        size,
        pool,
        stream: Some(0),
        runs,
    }
}

/// The `Stats` an allocator would report for `layout`, so tests and benches draw
/// consistent numbers.
pub fn stats_from_layout(layout: &Layout) -> Stats {
    let mut stats = Stats {
        policy: layout.policy,
        capacity_bytes: layout.capacity,
        free_run_histogram: vec![0; HIST_BUCKETS],
        ..Stats::default()
    };
    for run in layout.segments.iter().flat_map(|s| &s.runs) {
        if run.state != BlockState::Unmapped {
            stats.reserved_bytes += run.size;
        }
        match run.state {
            BlockState::Allocated | BlockState::PendingFree => {
                stats.allocated_bytes += run.size;
                stats.requested_bytes += run.requested;
                stats.live_blocks += 1;
                stats.pending_free_blocks += u64::from(run.state == BlockState::PendingFree);
            }
            BlockState::Free => {
                stats.free_runs += 1;
                stats.total_free_bytes += run.size;
                stats.largest_free_bytes = stats.largest_free_bytes.max(run.size);
                let bucket = (63 - run.size.max(1).leading_zeros()) as usize;
                if let Some(n) = stats.free_run_histogram.get_mut(bucket) {
                    *n += 1;
                }
            }
            BlockState::Unmapped => {}
        }
    }
    if stats.total_free_bytes > 0 {
        stats.external_fragmentation =
            1.0 - stats.largest_free_bytes as f64 / stats.total_free_bytes as f64;
    }
    stats.reserved_over_allocated = (stats.allocated_bytes > 0)
        .then(|| stats.reserved_bytes as f64 / stats.allocated_bytes as f64);
    stats
}

/// Panel size in the bench: what a side panel gets on a wide screen.
const BENCH_PANEL: (u16, u16) = (60, 24);

/// Times `iterations` frames of a `width` x `height` screen over a layout of `blocks`
/// live blocks: each frame resets the buffer, draws the `BlockMap` over the whole area
/// and the `FragmentationPanel` into its top-right corner. One duration per frame.
pub fn bench_draw(blocks: usize, width: u16, height: u16, iterations: usize) -> Vec<Duration> {
    let layout = synthetic_layout(blocks, 42);
    let stats = stats_from_layout(&layout);
    let history: Vec<u64> = (0..240u64).map(|i| (i * 37) % 1000).collect();
    let area = Rect::new(0, 0, width, height);
    let panel = Rect::new(
        width.saturating_sub(BENCH_PANEL.0),
        0,
        BENCH_PANEL.0.min(width),
        BENCH_PANEL.1.min(height),
    );
    let mut buf = Buffer::empty(area);
    (0..iterations)
        .map(|_| {
            let start = Instant::now();
            buf.reset();
            BlockMap::new(&layout).render(area, &mut buf);
            FragmentationPanel::new(&stats, &history).render(panel, &mut buf);
            start.elapsed()
        })
        .collect()
}
