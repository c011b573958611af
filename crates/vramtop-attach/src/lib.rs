//! vramtop-attach: live attach to PyTorch jobs. The protocol spoken with the Python hook
//! inside a job (its files are the Python package's, `python/vramtop/_hook/`, which the
//! binary embeds and this crate writes where jobs find them), discovery of hooked jobs by
//! their sockets, one connection per job on a thread of its own, the state kept per job (a
//! block map through the snapshot reader's layout code, the OOM explained as a probe's,
//! leak suspects by site), `vramtop run`'s launcher, and what `vramtop attach` and
//! `--once` say of each job (JSON reports, one-line summaries).
//!
//! Depends on `vramtop-alloc` and `vramtop-trace` only: no ratatui, no clap, nothing of
//! the application.

pub mod async_oom;
pub mod client;
pub mod discovery;
pub mod error;
pub mod hook_files;
pub mod job;
pub mod launch;
pub mod oom_files;
pub mod other_caches;
pub mod protocol;
pub mod ranks;
pub mod report;
pub mod summary;
pub mod watcher;

/// The environment variable that names the socket directory.
pub const SOCKET_DIR_ENV: &str = "VRAMTOP_SOCKET_DIR";

pub use error::AttachError;
pub use job::{JobFigures, JobView};
pub use ranks::RankGroup;
pub use report::JobReport;
pub use watcher::{collect_once, AttachedJobs, Attacher};
