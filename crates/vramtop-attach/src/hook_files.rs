//! The directory the hook's Python files are written to for `PYTHONPATH`: a
//! `hook-<digest>` directory beside the sockets, private to the user, named after the
//! content so that different vramtop versions never mix files. The files themselves are
//! the `vramtop` Python package's `_hook/`, which the binary crate embeds (they live beside
//! it, for the wheel), so this crate packages without them.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::discovery::ensure_private_dir;
use super::error::AttachError;

/// The hook's files, as (file name, text).
pub type HookFiles<'a> = [(&'a str, &'a str)];

/// FNV-1a over the files: a name that changes when the content does.
fn digest(files: &HookFiles) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, text) in files {
        for byte in name.bytes().chain(text.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// `<socket dir>/hook-<digest>`.
pub fn hook_dir(socket_dir: &Path, files: &HookFiles) -> PathBuf {
    socket_dir.join(format!("hook-{}", digest(files)))
}

/// Writes the hook files when missing or different and returns their directory.
/// Each file is written to a temporary name and renamed, so a job starting meanwhile
/// never imports half a file.
pub fn write_hook_files(socket_dir: &Path, files: &HookFiles) -> Result<PathBuf, AttachError> {
    ensure_private_dir(socket_dir)?;
    let dir = hook_dir(socket_dir, files);
    ensure_private_dir(&dir)?;
    for (name, text) in files {
        let path = dir.join(name);
        if fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
            continue;
        }
        let temp = dir.join(format!(".{name}.{}", std::process::id()));
        let written = fs::File::create(&temp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|()| fs::rename(&temp, &path));
        if let Err(source) = written {
            let _ = fs::remove_file(&temp);
            return Err(AttachError::HookFile { path, source });
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
        let files = [("a.py", "import b\n"), ("b.py", "x = 1\n")];
        let dir = write_hook_files(&base, &files).unwrap();
        assert_eq!(dir, hook_dir(&base, &files));
        assert_eq!(fs::read_to_string(dir.join("b.py")).unwrap(), "x = 1\n");
        // A second call finds them in place; other content gets another folder.
        assert_eq!(write_hook_files(&base, &files).unwrap(), dir);
        let other = [("a.py", "import b\n"), ("b.py", "x = 2\n")];
        assert_ne!(hook_dir(&base, &other), dir);
        let _ = fs::remove_dir_all(&base);
    }
}
