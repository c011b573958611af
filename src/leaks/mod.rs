//! Leak detection: which allocation sites keep growing, what was allocated since a mark
//! and is still alive, and which processes' device memory only ever goes up. Pure
//! functions and small state machines fed by samples the caller takes; no UI, no app,
//! no allocator locking here (the app passes `live_bytes_by_tag()`, `live_blocks_by_age()`
//! and telemetry snapshots in).
//!
//! ```text
//! LeakDetector::new(DetectorConfig) -> LeakDetector
//!   observe(window, &[(tag, live_bytes, live_blocks)]); close_window()
//!   suspects() -> Vec<Suspect>; sites() -> Vec<SiteTrend>; windows_closed() -> u64
//! usage_samples(&[TagUsage]) -> Vec<(&str, u64, u64)>
//! Baseline::mark(&[BlockRecord]) -> Baseline;  diff(&[BlockRecord]) -> Vec<SiteDiff>
//! ProcessTrend::compute(pid, &[(time_ms, bytes)], &TrendConfig) -> Option<ProcessTrend>
//! UnattributedTrend::compute(&[(time_ms, Option<bytes>)], &TrendConfig) -> UnattributedTrend
//! ProcessWatch::new(TrendConfig); observe(time_ms, &DeviceSnapshot); trends(); unattributed()
//! suspects_in_trace(&Trace, &TraceLeakConfig) -> Vec<Suspect>;  detect_in_trace(..) -> LeakDetector
//! ```
//!
//! The detection rule, and why, is in `detector.rs`.

mod baseline;
mod detector;
mod process;
mod trace;

pub use baseline::{Baseline, BlockRecord, SiteDiff};
pub use detector::{usage_samples, DetectorConfig, LeakDetector, RetainedSite, SiteTrend, Suspect};
pub use process::{ProcessTrend, ProcessWatch, TrendConfig, UnattributedTrend};
pub use trace::{detect_in_trace, suspects_in_trace, TraceLeakConfig, UNTAGGED_SITE};
