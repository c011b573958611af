//! The trace's own OOMs, on real snapshots taken right after a "CUDA out of memory" on an
//! H100 (tests/fixtures, see its README): they load, each OOM is explained with the traced
//! allocator's state, the capacity is inferred from them, and each policy says whether it
//! fails on the same request.

use std::path::PathBuf;

use vramtop_alloc::PolicyKind;
use vramtop_trace::ooms::{inferred_capacity, trace_ooms};
use vramtop_trace::replay::{self, CapacitySource};
use vramtop_trace::{self as trace, TraceEventKind};

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(name)
}

#[test]
fn an_oom_snapshot_loads_and_explains_each_oom_with_pytorchs_figures() {
    let t = trace::load(&fixture("oom_cap.pickle.gz")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.events.len(), 4053);
    let ooms = trace_ooms(&t);
    assert_eq!(ooms.len(), 2);
    assert!(ooms
        .iter()
        .all(|o| t.events[o.event].kind == TraceEventKind::Oom));
    // The fill loop's last 6 MiB tensor needed a new 20 MiB segment past the cap.
    assert_eq!(ooms[0].requested_bytes, 6 * MIB);
    assert_eq!(ooms[0].reserved_bytes, 8100 * MIB);
    // The 1 GiB request: PyTorch said 3.55 GiB allocated and 7.89 GiB reserved
    // (3,812,622,336 and 8,472,494,080 bytes, read in the job).
    let big = &ooms[1];
    assert_eq!(big.requested_bytes, 1 << 30);
    assert_eq!(big.reserved_bytes, 8_472_494_080);
    assert_eq!(big.allocated_bytes, 3_812_622_336);
    assert_eq!(big.free_bytes, big.reserved_bytes - big.allocated_bytes);
    assert!(big.largest_free_bytes < big.requested_bytes);
    assert!(
        big.free_bytes > big.requested_bytes,
        "free memory, no room: {big:?}"
    );
    assert!(big
        .explain()
        .starts_with("needed 1.0 GiB contiguous; 4.3 GiB free in "));
    // The device had room: a cap was in force, so the capacity is what PyTorch held.
    assert_eq!(inferred_capacity(&t, &ooms), Some(8100 * MIB));
}

#[test]
fn caching_fails_where_pytorch_did_and_expandable_fits() {
    let t = trace::load(&fixture("oom_cap.pickle.gz")).unwrap_or_else(|e| panic!("{e}"));
    let opts = replay::plan_capacity(&t, None, &trace_ooms(&t));
    assert_eq!(opts.source, CapacitySource::Inferred);
    assert_eq!(opts.capacity, 8100 * MIB);
    let rows = replay::report(&t, &[PolicyKind::Caching, PolicyKind::Expandable], opts)
        .unwrap_or_else(|e| panic!("{e}"));
    let caching = &rows[0];
    assert_eq!(caching.capacity_bytes, Some(8100 * MIB));
    assert_eq!(caching.trace_ooms.len(), 2);
    assert!(
        caching.trace_ooms.iter().all(|c| c.fails),
        "{:?}",
        caching.trace_ooms
    );
    // PyTorch's own reserved peak, to the byte.
    assert_eq!(caching.peak_reserved_bytes, 8100 * MIB);
    let expandable = &rows[1];
    assert!(
        !expandable.trace_ooms[1].fails,
        "{:?}",
        expandable.trace_ooms
    );
    // Given a capacity, it is used and said so.
    let given = replay::plan_capacity(&t, Some(80 << 30), &[]);
    assert_eq!(given.source, CapacitySource::Given);
}

#[test]
fn pytorch_with_expandable_segments_failed_too_and_pytorch_expandable_agrees() {
    let t = trace::load(&fixture("oom_cap_expandable.pickle.gz")).unwrap_or_else(|e| panic!("{e}"));
    assert!(t.settings.expandable_segments);
    let ooms = trace_ooms(&t);
    assert_eq!(ooms.len(), 2);
    // PyTorch: 3.95 GiB allocated, 7.91 GiB reserved (4,240,441,344 and 8,493,465,600).
    assert_eq!(ooms[1].allocated_bytes, 4_240_441_344);
    assert_eq!(ooms[1].reserved_bytes, 8_493_465_600);
    // The mapped pages are one extent: what is free is exactly reserved but unallocated
    // ("3.96 GiB is reserved by PyTorch but unallocated"), in the 6 MiB holes between
    // live tensors, not in 810 page-sized pieces.
    for oom in &ooms {
        assert_eq!(
            oom.free_bytes,
            oom.reserved_bytes - oom.allocated_bytes,
            "{oom:?}"
        );
    }
    // The fill's OOM: every mapped byte held a live tensor (PyTorch: reserved = allocated).
    assert_eq!(
        (ooms[0].free_bytes, ooms[0].free_runs),
        (0, 0),
        "{:?}",
        ooms[0]
    );
    // Holes of one or two freed 6 MiB tensors: none near the 1 GiB asked for.
    assert!(ooms[1].largest_free_bytes <= 12 * MIB, "{:?}", ooms[1]);
    assert!(
        ooms[1].free_runs * 6 * MIB <= ooms[1].free_bytes,
        "{:?}",
        ooms[1]
    );
    let opts = replay::plan_capacity(&t, None, &ooms);
    let rows = replay::report(&t, &[PolicyKind::PytorchExpandable], opts)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(rows[0].trace_ooms[1].fails, "{:?}", rows[0].trace_ooms);
}
