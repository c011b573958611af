//! vramtop: watch GPU memory live and make fragmentation and leaks visible. This is the
//! application crate: the command line, the settings file, the live view's state (`app`)
//! and its drawing (`ui`), the probes, talk mode, the exporters and the modes that run
//! them. The layers below are crates of their own, so an upward import does not compile:
//!
//! ```text
//! vramtop: main -> modes -> config -> cli -> ui -> app, demo, export -> probe -> units
//!   -> vramtop-attach -> vramtop-trace -> vramtop-alloc
//!   -> vramtop-telemetry ----------------> vramtop-alloc
//! ```
//!
//! (`scripts/check-layers.py` checks the binary's own order, top first.)
//!
//! Data flows one way: sources (telemetry, probes, hooked jobs, traces) produce owned
//! snapshots, `app` keeps them in its state, and `ui` draws from a borrowed state; the
//! `modes` run the loop and call draw. Nothing imports a layer above its own.
//!
//! The lower crates are re-exported under their domain names (`vramtop::alloc`,
//! `vramtop::trace`, ...) for the tests and tools built on this crate.

pub mod advice;
pub mod app;
pub mod cli;
pub mod config;
pub mod demo;
pub mod docs;
pub mod export;
pub mod modes;
pub mod probe;
pub mod ui;
pub mod units;

pub use vramtop_alloc as alloc;
pub use vramtop_alloc::{backing, rng};
pub use vramtop_attach as attach;
pub use vramtop_telemetry as telemetry;
pub use vramtop_trace as trace;

/// Leak detection, wherever its samples come from: allocation sites of a live allocator
/// (`vramtop-alloc`), of a recorded trace (`vramtop-trace`), and processes' device memory
/// (`vramtop-telemetry`).
pub mod leaks {
    pub use vramtop_alloc::leaks::*;
    pub use vramtop_telemetry::trend::{
        ProcessTrend, ProcessWatch, TrendConfig, UnattributedTrend,
    };
    pub use vramtop_trace::leaks::{
        detect_in_trace, suspects_in_trace, TraceLeakConfig, UNTAGGED_SITE,
    };
}
