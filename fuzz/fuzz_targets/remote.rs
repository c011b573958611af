//! The `--remote` decoder: a host's `/api/snapshot` body into a `SystemSnapshot` (through
//! `remote::decode`, the function `--remote` uses, schema check included), then the
//! figures the live view derives from it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramtop::telemetry::remote::decode;

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = decode(data) {
        for device in &snapshot.devices {
            let _ = device.unattributed_bytes();
        }
    }
});
