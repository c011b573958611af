//! The trace readers on the two real PyTorch snapshots in tests/fixtures (see its
//! README). Expected numbers were computed once with python3:
//!
//! ```text
//! d = pickle.load(gzip.open(f)); t = d['device_traces'][0]
//! collections.Counter(e['action'] for e in t)        # per-action counts
//! allocated = {e['addr'] for e in t if e['action'] == 'alloc'}
//! [b for s in d['segments'] for b in s['blocks']
//!    if b['state'].startswith('active') and b['address'] not in allocated]   # initial
//! # peak: walk t, alloc adds round_up(size, 512), free_completed removes
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use vramtop_trace::{self as trace, Trace, TraceEventKind, TraceFormat};

const MIB: f64 = 1024.0 * 1024.0;

fn real(name: &str) -> Trace {
    let path =
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(name);
    assert!(
        path.exists(),
        "real trace {} is missing: these tests read the real traces in tests/fixtures \
         (see its README); do not skip them",
        path.display()
    );
    match trace::load(&path) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn kind_count(t: &Trace, kind: TraceEventKind) -> usize {
    t.events.iter().filter(|e| e.kind == kind).count()
}

#[test]
fn resnet_counts_match_the_file() {
    let t = real("resnet50_varbatch_train.pickle.gz");
    assert_eq!(t.source, TraceFormat::PytorchSnapshot);
    assert_eq!(t.device, 0);
    assert_eq!(t.events.len(), 68_861);
    assert_eq!(
        t.stats.actions,
        counts(&[
            ("alloc", 23_027),
            ("free_requested", 22_866),
            ("free_completed", 22_866),
            ("segment_alloc", 102),
        ])
    );
    assert_eq!(kind_count(&t, TraceEventKind::SegmentAlloc), 102);
    assert!(t.stats.unknown_actions.is_empty());
    assert_eq!(t.stats.unknown_frees, 0);
    assert_eq!(t.stats.allocs_over_live, 0);
    assert_eq!(t.segments_at_end.len(), 121);
    let blocks: usize = t.segments_at_end.iter().map(|s| s.blocks.len()).sum();
    assert_eq!(blocks, 595);
    // Parameters allocated before recording began.
    assert_eq!(t.initial.len(), 323);
    assert_eq!(t.stats.initial_live_bytes, 174_302_720);
    assert!(t.events.iter().all(|e| e.time_us.is_some()));
    assert!(t.notices().is_empty(), "{:?}", t.notices());
}

#[test]
fn resnet_live_bytes_peak_matches_the_readme() {
    let t = real("resnet50_varbatch_train.pickle.gz");
    let peak = t.live_bytes_peak(512) as f64 / MIB;
    assert!(
        (peak - 2882.0).abs() <= 2882.0 * 0.01,
        "peak {peak:.1} MiB, README says about 2,882 MiB"
    );
    assert_eq!(t.live_bytes_peak(512), 3_022_003_200);
    // With the parameters live from the start: close to PyTorch's 3,067 MiB peak.
    assert_eq!(t.live_bytes_peak_with_initial(512), 3_196_305_920);
}

#[test]
fn leak_counts_and_tags_match_the_file() {
    let t = real("linear_leak.pickle.gz");
    assert_eq!(t.events.len(), 460);
    assert_eq!(
        t.stats.actions,
        counts(&[
            ("alloc", 180),
            ("free_requested", 140),
            ("free_completed", 140)
        ])
    );
    assert_eq!(t.initial.len(), 5);
    assert_eq!(t.segments_at_end.len(), 4);
    assert_eq!(t.live_bytes_peak_with_initial(512), 315_637_760);

    let mut tags: BTreeMap<Option<&str>, usize> = BTreeMap::new();
    for e in t.events.iter().filter(|e| e.kind == TraceEventKind::Alloc) {
        *tags.entry(e.tag.as_deref()).or_default() += 1;
    }
    let expected: BTreeMap<Option<&str>, usize> = [
        (Some("torch_trace.py:67 step"), 60),
        (Some("torch_trace.py:68 step"), 120),
    ]
    .into_iter()
    .collect();
    assert_eq!(tags, expected);

    // The leak: blocks allocated in the trace and never freed include 20 relu outputs
    // from `y = lin(x).relu()` at torch_trace.py:68.
    let mut live: HashMap<u64, Option<&str>> = HashMap::new();
    for e in &t.events {
        match e.kind {
            TraceEventKind::Alloc => {
                live.insert(e.addr, e.tag.as_deref());
            }
            TraceEventKind::FreeCompleted => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    let leaked_at_68 = live
        .values()
        .filter(|t| **t == Some("torch_trace.py:68 step"))
        .count();
    assert_eq!(live.len(), 40);
    assert_eq!(leaked_at_68, 20);
}

#[test]
fn leak_trace_survives_the_recording_format() {
    let t = real("linear_leak.pickle.gz");
    let text = trace::record::write_trace(Vec::new(), &t).unwrap_or_default();
    let back =
        trace::from_bytes(&text, &trace::LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back.source, TraceFormat::VramtopRecord);
    assert_eq!(back.device, t.device);
    assert_eq!(back.initial, t.initial);
    assert_eq!(back.events, t.events);
    assert_eq!(back.stats.actions, t.stats.actions);
    assert_eq!(back.live_bytes_peak(512), t.live_bytes_peak(512));
}

/// Run with `cargo test -p vramtop-trace --release --test trace_real -- --ignored --nocapture`;
/// `VRAMTOP_TRACES=dir` reads the snapshot from another folder (to time elsewhere).
#[test]
#[ignore = "timing; run in release"]
fn resnet_load_time() {
    let dir = std::env::var_os("VRAMTOP_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
        });
    let path = dir.join("resnet50_varbatch_train.pickle.gz");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let opts = trace::LoadOptions::default();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let t = trace::from_bytes(&bytes, &opts).unwrap_or_else(|e| panic!("{e}"));
        best = best.min(start.elapsed().as_secs_f64());
        assert_eq!(t.events.len(), 68_861);
    }
    println!("resnet50 snapshot: best of 5 loads {:.1} ms", best * 1e3);
}
