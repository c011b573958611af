//! Prints the allocator benchmark table. Release only:
//! `cargo run --release -p vramtop-alloc --example alloc_bench -- [pairs] [live,live,...] [policy,...]`

use vramtop_alloc::{bench, PolicyKind};

fn main() {
    let mut args = std::env::args().skip(1);
    let pairs = args.next().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let live: Vec<usize> = args
        .next()
        .map(|s| s.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000, 100_000]);
    let policies: Vec<PolicyKind> = args
        .next()
        .map(|s| s.split(',').filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_else(|| PolicyKind::ALL.to_vec());
    let rows = bench::run(&policies, &live, pairs, 42);
    print!("{}", bench::table(&rows));
}
