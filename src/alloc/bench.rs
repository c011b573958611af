//! Allocation speed per policy: fill an allocator (bookkeeping backing, ample
//! capacity) to N live blocks of mixed sizes with some churn, then time steady-state
//! pairs of "allocate a new block, free a random live one", in batches; report the
//! median and 90th percentile over batches. Run it in release
//! (`cargo run --release --example alloc_bench`); debug figures mean nothing.

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
    /// State after the timed phase, for context.
    pub reserved_bytes: u64,
    pub free_runs: u64,
    pub external_fragmentation: f64,
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

/// Times one batch of pairs; ns per pair.
fn batch(a: &Allocator, live: &mut [Block], len: usize, rng: &mut Rng) -> f64 {
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
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
            batch(&a, &mut live, batch_len, &mut rng); // warm-up
            let mut times: Vec<f64> = (0..pairs.div_ceil(batch_len).max(1))
                .map(|_| batch(&a, &mut live, batch_len, &mut rng))
                .collect();
            times.sort_by(f64::total_cmp);
            let stats = a.stats();
            rows.push(BenchRow {
                policy,
                live_blocks: n,
                pairs,
                ns_per_pair_median: percentile(&times, 0.5),
                ns_per_pair_p90: percentile(&times, 0.9),
                reserved_bytes: stats.reserved_bytes,
                free_runs: stats.free_runs,
                external_fragmentation: stats.external_fragmentation,
            });
        }
    }
    rows
}

/// The rows as a Markdown table.
pub fn table(rows: &[BenchRow]) -> String {
    let mut out = String::from(
        "| policy | live blocks | ns/pair median | ns/pair p90 | reserved | free runs | ext. frag |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {} | {} | {:.2} |\n",
            r.policy,
            r.live_blocks,
            r.ns_per_pair_median,
            r.ns_per_pair_p90,
            super::human_bytes(r.reserved_bytes),
            r.free_runs,
            r.external_fragmentation
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
        assert_eq!(rows.len(), 5);
        for r in &rows {
            assert!(r.ns_per_pair_median > 0.0, "{r:?}");
            assert!(r.reserved_bytes > 0);
        }
        assert!(table(&rows).contains("| tlsf | 300 |"));
    }
}
