//! Output for machines and pipes: the one-shot table and JSON of `--once`.

pub mod once;
