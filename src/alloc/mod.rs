//! The instrumented allocator: policies over a `Backing`, with events, metrics and leak
//! bookkeeping. No UI and no CUDA here: metadata lives outside the memory it manages.

pub mod types;

pub use types::*;
