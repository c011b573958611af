//! Leak detection over live bytes per allocation site: which sites keep growing, and what
//! was allocated since a mark and is still alive. Pure functions and small state machines
//! fed by samples the caller takes (`Allocator::live_bytes_by_tag()`,
//! `live_blocks_by_age()`, or sums over a trace); no allocator locking here.
//!
//! ```text
//! LeakDetector::new(DetectorConfig) -> LeakDetector
//!   observe(window, &[(tag, live_bytes, live_blocks)]); close_window()
//!   suspects() -> Vec<Suspect>; sites() -> Vec<SiteTrend>; windows_closed() -> u64
//! usage_samples(&[TagUsage]) -> Vec<(&str, u64, u64)>
//! Baseline::mark(&[BlockRecord]) -> Baseline;  diff(&[BlockRecord]) -> Vec<SiteDiff>
//! ```
//!
//! The detection rule, and why, is in `detector.rs`. Over a recorded trace it is
//! `vramtop_trace::leaks`; over processes' device memory, `vramtop_telemetry::trend`.

mod baseline;
mod detector;

pub use baseline::{Baseline, BlockRecord, SiteDiff};
pub use detector::{usage_samples, DetectorConfig, LeakDetector, RetainedSite, SiteTrend, Suspect};
