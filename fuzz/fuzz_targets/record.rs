//! vramtop's own JSON-lines recordings (`--record`), through the public reader.
#![no_main]
use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(trace) = vramtop::trace::record::read(text) {
            common::exercise(&trace);
        }
    }
    if let Ok(trace) = vramtop::trace::from_bytes(data, &common::small_limits()) {
        common::exercise(&trace);
    }
});
