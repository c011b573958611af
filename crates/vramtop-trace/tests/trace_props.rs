//! Property tests: truncated and mutated pickles (a hand-built snapshot, and the real
//! linear_leak snapshot decompressed) always end in an error or a trace, never a panic
//! or a hang. A few hundred cases in all, to stay fast.

#[path = "../../../tests/support/trace_support.rs"]
mod support;

use std::io::{Read, Write};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use vramtop_trace::{self as trace, pickle, LoadOptions};

/// Every input parses in linear time; a second is far beyond any of them.
const TOO_SLOW: Duration = Duration::from_secs(1);

fn small() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| support::pickle(&support::small_snapshot()))
}

fn small_gz() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(small()).unwrap_or_default();
        enc.finish().unwrap_or_default()
    })
}

fn leak() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/linear_leak.pickle.gz"
        );
        let file = std::fs::File::open(path)
            .unwrap_or_else(|e| panic!("real trace {path} is missing ({e}); do not skip"));
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(file)
            .read_to_end(&mut out)
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        out
    })
}

/// `base` cut at `cut` (a fraction of its length) with some bytes xored.
fn mutate(base: &[u8], cut: f64, flips: &[(usize, u8)]) -> Vec<u8> {
    let len = ((base.len() as f64) * cut) as usize;
    let mut bytes = base[..len.min(base.len())].to_vec();
    if !bytes.is_empty() {
        for &(at, xor) in flips {
            let i = at % bytes.len();
            bytes[i] ^= xor;
        }
    }
    bytes
}

fn survive(bytes: &[u8]) {
    let start = Instant::now();
    let _ = pickle::from_slice(bytes);
    let _ = trace::from_bytes(bytes, &LoadOptions::default());
    assert!(start.elapsed() < TOO_SLOW, "took {:?}", start.elapsed());
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn mutated_small_snapshots_end_cleanly(
        cut in 0.0f64..=1.0,
        flips in vec((any::<usize>(), 1u8..=255), 0..6),
    ) {
        survive(&mutate(small(), cut, &flips));
        survive(&mutate(small_gz(), cut, &flips));
    }
}

proptest! {
    #![proptest_config(config(100))]

    #[test]
    fn mutated_leak_snapshot_ends_cleanly(
        cut in 0.0f64..=1.0,
        flips in vec((any::<usize>(), 1u8..=255), 0..4),
    ) {
        survive(&mutate(leak(), cut, &flips));
    }

    #[test]
    fn random_bytes_after_a_pickle_header_end_cleanly(body in vec(any::<u8>(), 0..512)) {
        let mut bytes = vec![0x80, 4];
        bytes.extend_from_slice(&body);
        survive(&bytes);
    }
}

#[test]
fn untouched_inputs_still_load() {
    assert!(trace::from_bytes(small(), &LoadOptions::default()).is_ok());
    assert!(trace::from_bytes(small_gz(), &LoadOptions::default()).is_ok());
    let leak = trace::from_bytes(leak(), &LoadOptions::default());
    assert_eq!(leak.map(|t| t.events.len()).ok(), Some(460));
}

/// One generated trace entry: an action PyTorch writes or one it may write some day, with
/// any of its fields left out.
fn entry() -> impl Strategy<Value = support::P> {
    use support::{dict, s, P};
    let actions = prop::sample::select(vec![
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
        "oom",
        "snapshot",
        "workspace_snapshot",
        "future_action",
    ]);
    (actions, 0u64..64, 1u64..8, any::<u8>()).prop_map(|(action, slot, mib, drop)| {
        let mut fields: Vec<(&str, P)> = vec![("action", s(action))];
        let keep = |bit: u8| drop & (1 << bit) == 0;
        if keep(0) {
            fields.push(("addr", P::Int((0x7f00_0000_0000 + slot * (8 << 20)) as i64)));
        }
        if keep(1) {
            fields.push(("size", P::Int((mib << 20) as i64)));
        }
        if keep(2) {
            fields.push(("stream", P::Int(0)));
        }
        if keep(3) {
            fields.push(("time_us", P::Int(1_795_321_078_558_603)));
        }
        if keep(4) {
            fields.push((
                "frames",
                P::List(vec![support::frame("train.py", 7, "step")]),
            ));
        }
        if keep(5) && action == "oom" {
            fields.push(("device_free", P::Int(1 << 30)));
        }
        dict(fields)
    })
}

proptest! {
    #![proptest_config(config(150))]

    /// Any prefix of a trace, any unknown action, any missing field: the snapshot loads
    /// (skipped entries counted, each notice one line), and every policy replays it (or
    /// says why in one line), never a panic.
    #[test]
    fn any_entries_load_and_replay(entries in vec(entry(), 0..40), cut in 0usize..40) {
        let entries: Vec<_> = entries.into_iter().take(cut).collect();
        let bytes = support::pickle(&support::snapshot(Vec::new(), vec![entries]));
        let t = trace::from_bytes(&bytes, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("a snapshot with odd entries must load: {e}"));
        for notice in t.notices() {
            prop_assert!(!notice.contains('\n'), "{notice}");
        }
        let ooms = trace::ooms::trace_ooms(&t);
        let opts = trace::replay::plan_capacity(&t, None, &ooms);
        match trace::replay::report(&t, &vramtop_alloc::PolicyKind::ALL, opts) {
            Ok(rows) => prop_assert_eq!(rows.len(), vramtop_alloc::PolicyKind::ALL.len()),
            Err(e) => prop_assert!(!e.to_string().contains('\n')),
        }
    }
}
