//! vramtop: watch GPU memory live and make fragmentation and leaks visible.
//!
//! Data flows one way: sources (`telemetry`, `alloc`, `probe`, `trace`) produce owned
//! snapshots, `app` keeps them in its state, and `ui` draws from a borrowed state.

pub mod alloc;
pub mod app;
pub mod attach;
pub mod backing;
pub mod bench;
pub mod cli;
pub mod config;
pub mod demo;
pub mod docs;
pub mod export;
pub mod leaks;
pub mod probe;
pub mod rng;
pub mod telemetry;
pub mod trace;
pub mod ui;
