//! Probe workloads: scenarios played against vramtop's allocator in the background, so
//! the block map has something real to show. A scenario (data) becomes a plan (a list of
//! operations drawn from the seed), which a `Probe` executes one allocator call at a time.

pub mod live;
pub mod plan;
pub mod record;
pub mod runner;
pub mod scenario;
pub mod setup;
pub mod tour;

pub use runner::{Probe, ProbeReport};
pub use scenario::Scenario;
