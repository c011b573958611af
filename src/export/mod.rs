//! Output for machines and pipes: the one-shot table and JSON of `--once`, and the
//! Prometheus and JSON endpoints of `vramtop serve`.

pub mod metrics;
pub mod once;
pub mod serve;
