//! The hook's Python source (the `vramtop` Python package's `_hook/`, so the wheel and the
//! binary ship the same files), embedded in the binary, and the directory it is written
//! to for `PYTHONPATH`: a `hook-<digest>` directory beside the sockets, private to the
//! user, named after the content so that different vramtop versions never mix files.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::discovery::ensure_private_dir;

/// Python runs a `sitecustomize` found on its path at start-up: the bootstrap.
pub const SITECUSTOMIZE: &str = include_str!("../../../python/vramtop/_hook/sitecustomize.py");
/// The hook itself, which the bootstrap imports once the job imports torch.
pub const HOOK: &str = include_str!("../../../python/vramtop/_hook/vramtop_hook.py");

const FILES: [(&str, &str); 2] = [
    ("sitecustomize.py", SITECUSTOMIZE),
    ("vramtop_hook.py", HOOK),
];

/// FNV-1a over both files: a name that changes when the content does.
fn digest() -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, text) in FILES {
        for byte in name.bytes().chain(text.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// `<socket dir>/hook-<digest>`.
pub fn hook_dir(socket_dir: &Path) -> PathBuf {
    socket_dir.join(format!("hook-{}", digest()))
}

/// Writes the hook files when missing or different and returns their directory.
/// Each file is written to a temporary name and renamed, so a job starting meanwhile
/// never imports half a file. `Err` is one line.
pub fn write_hook_files(socket_dir: &Path) -> Result<PathBuf, String> {
    ensure_private_dir(socket_dir)?;
    let dir = hook_dir(socket_dir);
    ensure_private_dir(&dir)?;
    for (name, text) in FILES {
        let path = dir.join(name);
        if fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
            continue;
        }
        let temp = dir.join(format!(".{name}.{}", std::process::id()));
        let written = fs::File::create(&temp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|()| fs::rename(&temp, &path));
        if let Err(e) = written {
            let _ = fs::remove_file(&temp);
            return Err(format!("cannot write {}: {e}", path.display()));
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_once_and_named_by_content() {
        let base = std::env::temp_dir().join(format!("vramtop-hookfiles-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let dir = write_hook_files(&base).unwrap();
        assert_eq!(dir, hook_dir(&base));
        let text = fs::read_to_string(dir.join("vramtop_hook.py")).unwrap();
        assert_eq!(text, HOOK);
        assert!(SITECUSTOMIZE.contains("vramtop_hook"));
        // A second call finds them in place.
        assert_eq!(write_hook_files(&base).unwrap(), dir);
        let _ = fs::remove_dir_all(&base);
    }
}
