//! Every policy over real host memory: blocks filled with their own pattern read back
//! intact after neighbours come and go (no overlap in real bytes, no lost mapping).

use vramtop_alloc::backing::{BookkeepingBacking, HostBacking};
use vramtop_alloc::rng::Rng;
use vramtop_alloc::{AllocConfig, AllocError, Allocator, Block, PolicyKind};

const MIB: u64 = 1 << 20;

fn verify_all(a: &Allocator, live: &[Block]) {
    for b in live {
        assert_eq!(
            a.verify_block(b, b.id),
            Ok(Some(0)),
            "{} block #{}",
            a.policy(),
            b.id
        );
    }
}

#[test]
fn filled_blocks_survive_churn_on_host_memory() {
    for policy in PolicyKind::ALL {
        let a = Allocator::new(
            policy,
            Box::new(HostBacking::new(96 * MIB)),
            AllocConfig::default(),
        );
        let mut rng = Rng::new(11);
        let mut live: Vec<Block> = Vec::new();
        for round in 0..90 {
            if !live.is_empty() && rng.range(0, 2) == 0 {
                let i = rng.range(0, live.len() as u64 - 1) as usize;
                let b = live.swap_remove(i);
                assert_eq!(a.verify_block(&b, b.id), Ok(Some(0)));
                if round % 5 == 0 {
                    a.free_deferred(&b).unwrap();
                    a.process_pending();
                } else {
                    a.free(&b).unwrap();
                }
                assert!(a.fill_block(&b, 1).is_err(), "fill after free must fail");
            } else {
                let size = 1 << rng.range(6, 21);
                if let Ok(b) = a.alloc(size, (round % 2) as u32, "host") {
                    assert_eq!(a.fill_block(&b, b.id), Ok(true));
                    live.push(b);
                }
            }
        }
        verify_all(&a, &live);
        for b in &live {
            a.free(b).unwrap();
        }
        a.empty_cache();
        assert_eq!(a.stats().reserved_bytes, 0, "{policy}");
    }
}

#[test]
fn bookkeeping_has_nothing_to_check() {
    let a = Allocator::new(
        PolicyKind::Caching,
        Box::new(BookkeepingBacking::new(64 * MIB)),
        AllocConfig::default(),
    );
    let b = a.alloc(4096, 0, "b").unwrap();
    assert_eq!(a.fill_block(&b, 3), Ok(false));
    assert_eq!(a.verify_block(&b, 3), Ok(None));
    a.free(&b).unwrap();
    assert_eq!(
        a.verify_block(&b, 3),
        Err(AllocError::DoubleFree { id: b.id })
    );
}
