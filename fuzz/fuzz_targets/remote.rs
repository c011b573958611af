//! The `--remote` decoder: a host's `/api/snapshot` body into a `SystemSnapshot`, then the
//! figures the live view derives from it. crates/vramtop-telemetry/src/remote.rs decodes with exactly
//! this call; if it gains its own decode function, point the one line below at it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramtop::telemetry::SystemSnapshot;

fuzz_target!(|data: &[u8]| {
    let decoded = serde_json::from_slice::<SystemSnapshot>(data);
    if let Ok(snapshot) = decoded {
        for device in &snapshot.devices {
            let _ = device.unattributed_bytes();
        }
    }
});
