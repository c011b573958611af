//! Probe scenario TOML (`--probe FILE.toml`): parsed and checked, never run.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(scenario) = vramtop::probe::scenario::Scenario::from_toml(text, "fuzz") {
            for phase in &scenario.phases {
                let _ = phase.pacing();
            }
        }
    }
});
