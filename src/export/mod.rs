//! Output for machines, pipes and slides: the one-shot table and JSON of `--once`, the
//! Prometheus and JSON endpoints of `vramtop serve`, and drawn screens as asciicast
//! recordings and SVG pictures.

pub mod cast;
pub mod http;
pub mod labels;
pub mod metrics;
pub mod once;
pub mod oom_report;
pub mod serve;
pub mod svg;
pub mod torch_metrics;
