//! Allocation speed per policy: fill an allocator (bookkeeping backing, ample
//! capacity) to N live blocks of mixed sizes with some churn, then time, in batches:
//! - pairs: allocate a block of a random size and free it again, N blocks resident;
//! - churn: allocate a block and free a random *other* live block (steady state at N),
//!   which touches cold metadata all over and so measures the memory system as much
//!   as the algorithm.
//!
//! Median and 90th percentile over batches. Run it in release
//! (`cargo run --release -p vramtop-alloc --example alloc_bench`); debug figures mean nothing.

use std::time::Instant;

use super::{AllocConfig, Allocator, Block, PolicyKind};
use crate::backing::BookkeepingBacking;
use crate::rng::Rng;

const MIN_SIZE: f64 = 512.0;
const MAX_SIZE: f64 = (4u64 << 20) as f64;
const TAGS: [&str; 4] = [
    "bench.weights",
    "bench.activations",
    "bench.grads",
    "bench.workspace",
];

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BenchRow {
    pub policy: PolicyKind,
    pub live_blocks: usize,
    pub pairs: usize,
    pub ns_per_pair_median: f64,
    pub ns_per_pair_p90: f64,
    pub ns_per_churn_median: f64,
    pub ns_per_churn_p90: f64,
    /// State after the timed phase, for context.
    pub reserved_bytes: u64,
    pub free_runs: u64,
    pub external_fragmentation: f64,
    /// Median microseconds of one `layout()` / `stats()` call at this state.
    pub layout_us: f64,
    pub stats_us: f64,
}

/// Log-uniform in [512 B, 4 MiB].
pub fn mixed_size(rng: &mut Rng) -> u64 {
    let (lo, hi) = (MIN_SIZE.ln(), MAX_SIZE.ln());
    (lo + rng.next_f64() * (hi - lo)).exp() as u64
}

fn fresh(policy: PolicyKind, live: usize) -> Allocator {
    // Room for every block at its largest plus fragmentation.
    let capacity = (live as u64 + 1024) * (8 << 20);
    Allocator::new(
        policy,
        Box::new(BookkeepingBacking::new(capacity)),
        AllocConfig::default(),
    )
}

/// An allocator over a bookkeeping backing holding `live` blocks of mixed sizes, as the
/// benchmarks start from (the criterion bench in benches/alloc.rs uses it too).
pub fn populated(policy: PolicyKind, live: usize, seed: u64) -> (Allocator, Vec<Block>) {
    let mut rng = Rng::new(seed ^ live as u64);
    let a = fresh(policy, live.max(1));
    let blocks = fill(&a, live.max(1), &mut rng);
    (a, blocks)
}

/// Allocates until `n` blocks are live, freeing a random one a quarter of the time.
fn fill(a: &Allocator, n: usize, rng: &mut Rng) -> Vec<Block> {
    let mut live: Vec<Block> = Vec::with_capacity(n + 1);
    while live.len() < n {
        if !live.is_empty() && rng.next_f64() < 0.25 {
            let i = rng.range(0, live.len() as u64 - 1) as usize;
            let _ = a.free(&live.swap_remove(i));
        } else if let Ok(b) = a.alloc(mixed_size(rng), 0, TAGS[live.len() % TAGS.len()]) {
            live.push(b);
        }
    }
    live
}

/// Times one batch of alloc-then-free pairs; ns per pair.
fn pair_batch(a: &Allocator, len: usize, rng: &mut Rng) -> f64 {
    let sizes: Vec<u64> = (0..len).map(|_| mixed_size(rng)).collect();
    let start = Instant::now();
    for (i, &size) in sizes.iter().enumerate() {
        if let Ok(b) = a.alloc(size, 0, TAGS[i % TAGS.len()]) {
            let _ = a.free(&b);
        }
    }
    start.elapsed().as_nanos() as f64 / len as f64
}

/// Times one batch of alloc + free-a-random-victim; ns per pair.
fn churn_batch(a: &Allocator, live: &mut [Block], len: usize, rng: &mut Rng) -> f64 {
    let sizes: Vec<u64> = (0..len).map(|_| mixed_size(rng)).collect();
    let victims: Vec<usize> = (0..len)
        .map(|_| rng.range(0, live.len() as u64 - 1) as usize)
        .collect();
    let start = Instant::now();
    for (i, (&size, &victim)) in sizes.iter().zip(&victims).enumerate() {
        if let Ok(b) = a.alloc(size, 0, TAGS[i % TAGS.len()]) {
            let old = std::mem::replace(&mut live[victim], b);
            let _ = a.free(&old);
        }
    }
    start.elapsed().as_nanos() as f64 / len as f64
}

/// Median microseconds of `f` over a few calls.
fn median_us(mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_nanos() as f64 / 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    percentile(&times, 0.5)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Median and p90 of `batches` timings of `f`, after one warm-up call.
fn timed(batches: usize, mut f: impl FnMut() -> f64) -> (f64, f64) {
    f();
    let mut times: Vec<f64> = (0..batches.max(1)).map(|_| f()).collect();
    times.sort_by(f64::total_cmp);
    (percentile(&times, 0.5), percentile(&times, 0.9))
}

pub fn run(
    policies: &[PolicyKind],
    live_counts: &[usize],
    pairs: usize,
    seed: u64,
) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    for &policy in policies {
        for &n in live_counts {
            let n = n.max(1);
            let mut rng = Rng::new(seed ^ n as u64);
            let a = fresh(policy, n);
            let mut live = fill(&a, n, &mut rng);
            let batch_len = (pairs / 20).clamp(1, 2000);
            let batches = pairs.div_ceil(batch_len);
            let pair = timed(batches, || pair_batch(&a, batch_len, &mut rng));
            let churn = timed(batches, || churn_batch(&a, &mut live, batch_len, &mut rng));
            let stats = a.stats();
            rows.push(BenchRow {
                policy,
                live_blocks: n,
                pairs,
                ns_per_pair_median: pair.0,
                ns_per_pair_p90: pair.1,
                ns_per_churn_median: churn.0,
                ns_per_churn_p90: churn.1,
                reserved_bytes: stats.reserved_bytes,
                free_runs: stats.free_runs,
                external_fragmentation: stats.external_fragmentation,
                layout_us: median_us(|| drop(std::hint::black_box(a.layout()))),
                stats_us: median_us(|| drop(std::hint::black_box(a.stats()))),
            });
        }
    }
    rows
}

/// The rows as a Markdown table.
pub fn table(rows: &[BenchRow]) -> String {
    let mut out = String::from(
        "| policy | live blocks | pair ns (median) | pair ns (p90) | churn ns (median) \
         | churn ns (p90) | reserved | free runs | ext. frag | layout() µs | stats() µs |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {:.2} | {:.0} | {:.0} |\n",
            r.policy,
            r.live_blocks,
            r.ns_per_pair_median,
            r.ns_per_pair_p90,
            r.ns_per_churn_median,
            r.ns_per_churn_p90,
            super::human_bytes(r.reserved_bytes),
            r.free_runs,
            r.external_fragmentation,
            r.layout_us,
            r.stats_us
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_stay_in_range() {
        let mut rng = Rng::new(3);
        for _ in 0..1000 {
            let s = mixed_size(&mut rng);
            assert!((512..=4 << 20).contains(&s));
        }
    }

    #[test]
    fn runs_every_policy_small() {
        let rows = run(&PolicyKind::ALL, &[300], 200, 1);
        assert_eq!(rows.len(), PolicyKind::ALL.len());
        for r in &rows {
            assert!(r.ns_per_pair_median > 0.0, "{r:?}");
            assert!(r.reserved_bytes > 0);
        }
        assert!(table(&rows).contains("| tlsf | 300 |"));
    }
}
