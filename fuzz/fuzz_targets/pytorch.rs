//! PyTorch snapshots (pickled, or gzipped pickles) through the public reader, then what
//! `vramtop snapshot` and `vramtop replay` do with the result.
#![no_main]
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = vramtop::trace::from_bytes(data, &common::small_limits()) {
        common::exercise(&trace);
    }
});
