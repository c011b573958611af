//! Replays of the two real PyTorch snapshots in tests/fixtures (see its README)
//! through vramtop's policies: fidelity of `caching` to what PyTorch reserved, and the
//! trace-only live peak the README quotes.

use std::path::PathBuf;
use std::time::Instant;

use vramtop_alloc::PolicyKind;
use vramtop_trace::replay::{self, ReplayOptions, ReplayReport, TraceFigures};
use vramtop_trace::{self as trace, Trace};

const MIB: f64 = 1024.0 * 1024.0;
/// PyTorch's peak reserved for the resnet50 run (README table).
const PYTORCH_RESERVED_MIB: f64 = 3940.0;

/// The fixtures; the timing test alone may read another folder (`VRAMTOP_TRACES`), so a
/// variable set for fuzzing with larger traces never changes what the checks read.
fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
}

fn timing_dir() -> PathBuf {
    std::env::var_os("VRAMTOP_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(fixtures)
}

fn real(name: &str) -> Trace {
    let path = fixtures().join(name);
    assert!(
        path.exists(),
        "real trace {} is missing: these tests read the real traces in tests/fixtures \
         (see its README); do not skip them",
        path.display()
    );
    trace::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn caching_report(t: &Trace) -> ReplayReport {
    let rows = replay::report(t, &[PolicyKind::Caching], ReplayOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    rows.into_iter().next().expect("one row")
}

#[test]
fn resnet_caching_lands_near_pytorch() {
    let t = real("resnet50_varbatch_train.pickle.gz");
    let row = caching_report(&t);
    println!(
        "{}",
        replay::table(
            "resnet50",
            &TraceFigures::of(&t),
            std::slice::from_ref(&row)
        )
    );
    assert_eq!(row.events, 68_861);
    // The README's trace-only figure, exactly: blocks live at the start left out.
    assert_eq!(row.peak_live_bytes, t.live_bytes_peak(512));
    let live = row.peak_live_bytes as f64 / MIB;
    assert!(
        (live - 2882.0).abs() <= 2882.0 * 0.01,
        "peak live {live:.1} MiB"
    );
    assert_eq!(row.peak_live_bytes_with_initial, 3_196_305_920);
    // What PyTorch itself reserved, read off the trace's segment events.
    let trace_peak = row
        .trace_reserved_peak_bytes
        .expect("a snapshot has segments") as f64;
    assert!(
        (trace_peak / MIB - PYTORCH_RESERVED_MIB).abs() < 1.0,
        "{trace_peak}"
    );
    let reserved = row.peak_reserved_bytes as f64 / MIB;
    let off = reserved / PYTORCH_RESERVED_MIB - 1.0;
    println!(
        "caching peak reserved {reserved:.1} MiB: {:+.2} % vs PyTorch",
        off * 100.0
    );
    // Issue 14's bar: within 1 % of PyTorch's own peak (it lands on it: blocks live at
    // the start are placed where PyTorch had them, in the segments it held then).
    assert!(
        off.abs() <= 0.01,
        "caching reserved {reserved:.1} MiB, {off:+.3} off"
    );
    assert_eq!((row.ooms, row.counts.unknown_frees), (0, 0));
    assert_eq!(row.counts.initial_blocks, 323);
    assert!(row.peak_held_bytes >= row.peak_live_bytes);
    assert!(row.external_fragmentation_at_peak > 0.0 && row.external_fragmentation_at_peak < 1.0);
}

#[test]
fn resnet_every_policy_replays_without_ooms() {
    let t = real("resnet50_varbatch_train.pickle.gz");
    let rows = replay::report(&t, &PolicyKind::ALL, ReplayOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{}",
        replay::table("resnet50", &TraceFigures::of(&t), &rows)
    );
    for row in &rows {
        assert_eq!(row.ooms, 0, "{row:?}");
        assert!(
            row.peak_reserved_bytes >= row.peak_allocated_bytes,
            "{row:?}"
        );
        assert!(row.backing_calls > 0, "{row:?}");
    }
}

#[test]
fn leak_replays_and_keeps_its_leak() {
    let t = real("linear_leak.pickle.gz");
    let row = caching_report(&t);
    assert_eq!(row.events, 460);
    assert_eq!(row.counts.allocs, 180);
    assert_eq!(row.counts.frees, 140);
    assert_eq!(row.counts.free_requests, 140);
    assert_eq!(row.peak_live_bytes, t.live_bytes_peak(512));
}

/// Run with `cargo test -p vramtop-trace --release --test replay_real -- --ignored --nocapture`.
#[test]
#[ignore = "timing; run in release"]
fn resnet_load_and_replay_time() {
    let path = timing_dir().join("resnet50_varbatch_train.pickle.gz");
    let start = Instant::now();
    let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let load = start.elapsed();
    let start = Instant::now();
    let rows = replay::report(&t, &PolicyKind::ALL, ReplayOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let all = start.elapsed();
    println!(
        "{}",
        replay::table("resnet50", &TraceFigures::of(&t), &rows)
    );
    println!(
        "resnet50 ({} events): load {:.1} ms; replay through all {} policies {:.1} ms \
         (trace figures included); load + replay {:.1} ms",
        t.events.len(),
        load.as_secs_f64() * 1e3,
        rows.len(),
        all.as_secs_f64() * 1e3,
        (load + all).as_secs_f64() * 1e3
    );
}
