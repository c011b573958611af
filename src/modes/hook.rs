//! The job hook's Python files, embedded in the binary: the `vramtop` Python package's
//! `_hook/`, so the wheel and the binary ship the same files. `vramtop run` and `vramtop
//! hook-path` write them beside the sockets for `PYTHONPATH`.

use std::path::{Path, PathBuf};

/// Python runs a `sitecustomize` found on its path at start-up: the bootstrap, which
/// imports the hook itself (the `vramtop_hook` package) once the job imports torch.
/// tests/python_package.rs checks that this list is the package's whole folder.
pub const FILES: [(&str, &str); 12] = [
    (
        "sitecustomize.py",
        include_str!("../../python/vramtop/_hook/sitecustomize.py"),
    ),
    (
        "vramtop_hook/__init__.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/__init__.py"),
    ),
    (
        "vramtop_hook/settings.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/settings.py"),
    ),
    (
        "vramtop_hook/wire.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/wire.py"),
    ),
    (
        "vramtop_hook/sockets.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/sockets.py"),
    ),
    (
        "vramtop_hook/processes.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/processes.py"),
    ),
    (
        "vramtop_hook/history.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/history.py"),
    ),
    (
        "vramtop_hook/roles.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/roles.py"),
    ),
    (
        "vramtop_hook/torch_allocator.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/torch_allocator.py"),
    ),
    (
        "vramtop_hook/running.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/running.py"),
    ),
    (
        "vramtop_hook/oom.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/oom.py"),
    ),
    (
        "vramtop_hook/server.py",
        include_str!("../../python/vramtop/_hook/vramtop_hook/server.py"),
    ),
];

/// Writes the files into `hook-<digest>` under `socket_dir` (when missing or different)
/// and returns that folder; `Err` prints as one line.
pub fn write(socket_dir: &Path) -> Result<PathBuf, vramtop_attach::AttachError> {
    vramtop_attach::hook_files::write_hook_files(socket_dir, &FILES)
}
