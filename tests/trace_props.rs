//! Property tests: truncated and mutated pickles (a hand-built snapshot, and the real
//! linear_leak snapshot decompressed) always end in an error or a trace, never a panic
//! or a hang. A few hundred cases in all, to stay fast.

#[path = "trace_support.rs"]
mod support;

use std::io::{Read, Write};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use vramtop::trace::{self, pickle, LoadOptions};

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
            "/../shared/traces/linear_leak.pickle.gz"
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
