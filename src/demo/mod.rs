//! Talk mode, `vramtop demo [NAME]`: scripted stories of allocator behaviour played on
//! a presenter screen (`ui::presenter`), stepped by the speaker, optionally recorded as
//! an asciicast and saved as SVG pictures for slides. Stories run on bookkeeping or host
//! memory, never the GPU, and play the same under the same seed.
//!
//! `story` (the TOML format) -> `player` (steps, no terminal); the command and its loop
//! are `modes::demo`.

pub mod keys;
pub mod player;
pub mod story;
