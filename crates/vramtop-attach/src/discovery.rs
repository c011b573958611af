//! Where hooked jobs listen: the socket directory (as PROTOCOL.md resolves it), made
//! private to the user, and the `vramtop-<pid>.sock` sockets in it. A socket whose pid
//! is gone is stale: it is removed so it is not tried again.

use super::error::{AttachError, DirProblem};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use crate::SOCKET_DIR_ENV;

/// The socket directory: `$VRAMTOP_SOCKET_DIR`, else `$XDG_RUNTIME_DIR/vramtop` when that
/// is a directory, else `/tmp/vramtop-<uid>`.
pub fn socket_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(SOCKET_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if runtime.is_dir() {
            return runtime.join("vramtop");
        }
    }
    PathBuf::from(format!("/tmp/vramtop-{}", current_uid()))
}

pub fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Creates `dir` (mode 0700) when missing and checks that only this user can use it:
/// another user's directory in /tmp could hand us their sockets.
pub fn ensure_private_dir(dir: &Path) -> Result<(), AttachError> {
    let problem = |problem| AttachError::Dir {
        dir: dir.to_path_buf(),
        problem,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| problem(DirProblem::Create(e)))?;
    let meta = fs::symlink_metadata(dir).map_err(|e| problem(DirProblem::Read(e)))?;
    if !meta.is_dir() {
        return Err(problem(DirProblem::NotADirectory));
    }
    if meta.uid() != current_uid() {
        return Err(problem(DirProblem::OtherUser(meta.uid())));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        // Ours, but opened up: close it again rather than refuse.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| problem(DirProblem::MakePrivate(e)))?;
    }
    Ok(())
}

/// One hooked job's socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSocket {
    pub pid: u32,
    pub path: PathBuf,
    /// Which file it is: a job that ended and the process that gets its pid bind sockets
    /// of the same name, never the same file.
    pub file: FileId,
}

/// A file's inode and the time it changed (ns): the inode alone is handed to the next new
/// file as soon as one is removed.
pub type FileId = (u64, i64, i64);

/// The pid a socket name stands for: `vramtop-<pid>.sock`.
pub fn pid_of_socket(name: &str) -> Option<u32> {
    pid_between(name, "vramtop-", ".sock")
}

/// The pid of a socket the hook has bound but not yet renamed into place: `.vt-<pid>.new`
/// (the hook's `listen`). One is left behind when its job dies in between.
fn pid_of_unready_socket(name: &str) -> Option<u32> {
    pid_between(name, ".vt-", ".new")
}

/// The positive pid written between `prefix` and `suffix` in `name`.
fn pid_between(name: &str, prefix: &str, suffix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
        .filter(|&pid| pid > 0)
}

/// Sockets in `dir`, by pid. Stale ones (their pid is gone) are removed and left out, and
/// so are half-made ones of jobs that are gone.
/// A missing directory is no jobs, not an error; another user's directory is refused
/// (its sockets could pose as our jobs).
pub fn scan(dir: &Path) -> io::Result<Vec<JobSocket>> {
    // Another user's directory is refused: its sockets could pose as our jobs (and a row
    // invites `t`/`K` on a pid of the planter's choosing). Root may look at one only when
    // it names it itself in VRAMTOP_SOCKET_DIR (to see that user's jobs); its default
    // directory, /tmp/vramtop-0, must be its own, as anyone could have made it first.
    let named = std::env::var_os(SOCKET_DIR_ENV).is_some_and(|d| Path::new(&d) == dir);
    let may_look_at_others = current_uid() == 0 && named;
    let mut owner = current_uid();
    match fs::metadata(dir) {
        Ok(meta) if meta.uid() != current_uid() && !may_look_at_others => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "permission denied: the directory belongs to uid {}, not to you: remove it or set {SOCKET_DIR_ENV}",
                    meta.uid()
                ),
            ))
        }
        Ok(meta) => owner = meta.uid(),
        Err(_) => {}
    }
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut sockets = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if let Some(pid) = pid_of_unready_socket(name) {
            if !pid_alive(pid) {
                let _ = fs::remove_file(entry.path());
            }
            continue;
        }
        let Some(pid) = pid_of_socket(name) else {
            continue;
        };
        let path = entry.path();
        // One that cannot be looked at is going (a hook unlinks its socket at exit, after
        // its bye): listed with no file to tell it by, it was taken for another process's
        // and its ended job forgotten. The next scan sees it, or not.
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        // A socket of another user than the directory's is not one of its jobs: skip it
        // quietly (its hook would refuse us anyway).
        if meta.uid() != owner {
            continue;
        }
        let file = (meta.ino(), meta.ctime(), meta.ctime_nsec());
        if !pid_alive(pid) {
            // The job died without removing its socket (SIGKILL, a crash).
            let _ = fs::remove_file(&path);
            continue;
        }
        sockets.push(JobSocket { pid, path, file });
    }
    sockets.sort_by_key(|s| s.pid);
    Ok(sockets)
}

/// Whether a process with this pid exists (ours or not).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names() {
        assert_eq!(pid_of_socket("vramtop-123.sock"), Some(123));
        assert_eq!(pid_of_socket("vramtop-0.sock"), None);
        assert_eq!(pid_of_socket("vramtop-x.sock"), None);
        assert_eq!(pid_of_socket("other-1.sock"), None);
        assert_eq!(pid_of_socket(".vt-123.new"), None);
        assert_eq!(pid_of_unready_socket(".vt-123.new"), Some(123));
        assert_eq!(pid_of_unready_socket("vramtop-123.sock"), None);
    }

    #[test]
    fn stale_sockets_are_removed_live_ones_listed() {
        let dir = std::env::temp_dir().join(format!("vramtop-scan-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        ensure_private_dir(&dir).unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let me = std::process::id();
        // A pid far above pid_max (4194304) cannot be alive.
        let dead = 99_999_999u32;
        fs::write(dir.join(format!("vramtop-{me}.sock")), "").unwrap();
        fs::write(dir.join(format!("vramtop-{dead}.sock")), "").unwrap();
        fs::write(dir.join("notes.txt"), "").unwrap();
        // Half-made sockets: a live job's is its business, a dead one's is cleared.
        fs::write(dir.join(format!(".vt-{me}.new")), "").unwrap();
        fs::write(dir.join(format!(".vt-{dead}.new")), "").unwrap();
        let found = scan(&dir).unwrap();
        assert_eq!(found.iter().map(|s| s.pid).collect::<Vec<_>>(), vec![me]);
        assert!(!dir.join(format!("vramtop-{dead}.sock")).exists());
        assert!(dir.join(format!(".vt-{me}.new")).exists());
        assert!(!dir.join(format!(".vt-{dead}.new")).exists());
        let _ = fs::remove_dir_all(&dir);
    }
}
