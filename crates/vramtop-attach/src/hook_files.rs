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

/// The hook's files, as (path under the hook folder, text): `sitecustomize.py` and the
/// `vramtop_hook/` package's modules.
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
///
/// They are written whole into a private folder beside it and that folder is renamed into
/// place, so a job starting meanwhile finds either no hook folder or all of it, never
/// `sitecustomize.py` without the module it imports. Where the folder is already there
/// but not whole (a vramtop killed while writing it file by file), each missing or
/// different file is written to a temporary name and renamed instead.
pub fn write_hook_files(socket_dir: &Path, files: &HookFiles) -> Result<PathBuf, AttachError> {
    ensure_private_dir(socket_dir)?;
    let dir = hook_dir(socket_dir, files);
    if holds(&dir, files) {
        return Ok(dir);
    }
    if !dir.exists() {
        let temp = socket_dir.join(format!(".hook-{}-{}", digest(files), std::process::id()));
        let _ = fs::remove_dir_all(&temp);
        ensure_private_dir(&temp)?;
        let written = files
            .iter()
            .try_for_each(|(name, text)| write_file(&temp.join(name), text));
        let placed = written.and_then(|()| {
            fs::rename(&temp, &dir).or_else(|source| {
                // Another vramtop placed the same folder first: theirs is as good.
                if holds(&dir, files) {
                    Ok(())
                } else {
                    Err(AttachError::HookFile {
                        path: dir.clone(),
                        source,
                    })
                }
            })
        });
        let _ = fs::remove_dir_all(&temp);
        placed?;
        if holds(&dir, files) {
            return Ok(dir);
        }
    }
    ensure_private_dir(&dir)?;
    for (name, text) in files {
        let path = dir.join(name);
        if fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
            continue;
        }
        let file_name = path.file_name().unwrap_or_default().to_string_lossy();
        let temp = path.with_file_name(format!(".{file_name}.{}", std::process::id()));
        write_file(&temp, text)?;
        if let Err(source) = fs::rename(&temp, &path) {
            let _ = fs::remove_file(&temp);
            return Err(AttachError::HookFile { path, source });
        }
    }
    Ok(dir)
}

/// `dir` holds every file with its text.
fn holds(dir: &Path, files: &HookFiles) -> bool {
    files
        .iter()
        .all(|(name, text)| fs::read(dir.join(name)).is_ok_and(|t| t == text.as_bytes()))
}

fn write_file(path: &Path, text: &str) -> Result<(), AttachError> {
    if let Some(parent) = path.parent() {
        ensure_private_dir(parent)?; // a package's folder, private as the hook folder is
    }
    fs::File::create(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|source| {
            let _ = fs::remove_file(path);
            AttachError::HookFile {
                path: path.to_path_buf(),
                source,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_once_and_named_by_content() {
        let base = std::env::temp_dir().join(format!("vramtop-hookfiles-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let files = [("a.py", "import b\n"), ("b/__init__.py", "x = 1\n")];
        let dir = write_hook_files(&base, &files).unwrap();
        assert_eq!(dir, hook_dir(&base, &files));
        assert_eq!(
            fs::read_to_string(dir.join("b/__init__.py")).unwrap(),
            "x = 1\n"
        );
        // A second call finds them in place; other content gets another folder.
        assert_eq!(write_hook_files(&base, &files).unwrap(), dir);
        let other = [("a.py", "import b\n"), ("b/__init__.py", "x = 2\n")];
        assert_ne!(hook_dir(&base, &other), dir);
        // Nothing is left beside it: the folder was written elsewhere and renamed.
        let names: Vec<String> = fs::read_dir(&base)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec![dir.file_name().unwrap().to_string_lossy().into_owned()]
        );
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn a_folder_left_half_written_is_completed() {
        let base = std::env::temp_dir().join(format!("vramtop-hookhalf-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let files = [("a.py", "import b\n"), ("b/__init__.py", "x = 1\n")];
        let dir = hook_dir(&base, &files);
        fs::create_dir_all(&dir).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        }
        fs::write(dir.join("a.py"), "import b\n").unwrap();
        assert_eq!(write_hook_files(&base, &files).unwrap(), dir);
        assert_eq!(
            fs::read_to_string(dir.join("b/__init__.py")).unwrap(),
            "x = 1\n"
        );
        // Nothing half-named is left in the package's folder.
        let names: Vec<String> = fs::read_dir(dir.join("b"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["__init__.py".to_string()]);
        let _ = fs::remove_dir_all(&base);
    }
}
