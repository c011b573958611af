//! RMM logging_resource_adaptor CSV. The header row is supplied, so every mutation lands
//! on the rows (the format is chosen by the header; a mangled one is only "unknown").
#![no_main]
use libfuzzer_sys::fuzz_target;

mod common;

const HEADER: &[u8] = b"Thread,Time,Action,Pointer,Size,Stream\n";

fuzz_target!(|data: &[u8]| {
    let mut input = HEADER.to_vec();
    input.extend_from_slice(data);
    if let Ok(trace) = vramtop::trace::from_bytes(&input, &common::small_limits()) {
        common::exercise(&trace);
    }
    // The fuzzer's own header too: column order and extra columns vary in real logs.
    if let Ok(trace) = vramtop::trace::from_bytes(data, &common::small_limits()) {
        common::exercise(&trace);
    }
});
