//! The pickle reader alone: any bytes must end in a value or an error, never a panic,
//! a hang or unbounded memory.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = vramtop::trace::pickle::from_slice(data);
});
