//! Live attach to PyTorch jobs: the protocol spoken with the Python hook inside a job
//! (assets/hook/), discovery of hooked jobs by their sockets, one connection per job on a
//! thread of its own, the state kept per job (a block map through the snapshot viewer's
//! layout code, the OOM explained as a probe's, leak suspects by site), `vramtop run`'s
//! launcher and the headless `vramtop attach`. No ratatui here.

pub mod client;
pub mod discovery;
pub mod headless;
pub mod hook_files;
pub mod job;
pub mod launch;
pub mod protocol;
pub mod report;
pub mod watcher;

pub use job::JobView;
pub use report::JobReport;
pub use watcher::{collect_once, AttachedJobs, Attacher};
