//! Output for machines, pipes and slides: the one-shot table and JSON of `--once`, and
//! drawn screens as asciicast recordings and SVG pictures.

pub mod cast;
pub mod once;
pub mod svg;
