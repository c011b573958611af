//! Talk-mode story TOML (`vramtop demo FILE.toml`): parsed and checked, never played.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = vramtop::demo::story::Story::from_toml(text, "fuzz");
    }
});
