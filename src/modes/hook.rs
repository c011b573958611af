//! The job hook's Python files, embedded in the binary: the `vramtop` Python package's
//! `_hook/`, so the wheel and the binary ship the same files. `vramtop run` and `vramtop
//! hook-path` write them beside the sockets for `PYTHONPATH`.

use std::path::{Path, PathBuf};

/// Python runs a `sitecustomize` found on its path at start-up: the bootstrap, which
/// imports the hook itself once the job imports torch.
pub const FILES: [(&str, &str); 2] = [
    (
        "sitecustomize.py",
        include_str!("../../python/vramtop/_hook/sitecustomize.py"),
    ),
    (
        "vramtop_hook.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook.py"),
    ),
];

/// Writes the files into `hook-<digest>` under `socket_dir` (when missing or different)
/// and returns that folder; `Err` prints as one line.
pub fn write(socket_dir: &Path) -> Result<PathBuf, vramtop_attach::AttachError> {
    vramtop_attach::hook_files::write_hook_files(socket_dir, &FILES)
}
