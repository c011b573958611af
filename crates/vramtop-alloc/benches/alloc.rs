//! Criterion bench of an alloc+free pair per policy at 1k, 10k and 100k live blocks of
//! mixed sizes (512 B to 4 MiB), the same setting as `vramtop bench alloc`.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};

use vramtop_alloc::bench::{mixed_size, populated};
use vramtop_alloc::rng::Rng;
use vramtop_alloc::PolicyKind;

fn alloc_free_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc+free pair");
    for policy in PolicyKind::ALL {
        for live in [1_000usize, 10_000, 100_000] {
            let (allocator, _blocks) = populated(policy, live, 1);
            let mut rng = Rng::new(7);
            group.bench_with_input(BenchmarkId::new(policy.name(), live), &live, |b, _| {
                b.iter(|| {
                    if let Ok(block) = allocator.alloc(black_box(mixed_size(&mut rng)), 0, "bench")
                    {
                        let _ = allocator.free(&block);
                    }
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, alloc_free_pair);
criterion_main!(benches);
