//! The crate's one error type: what went wrong preparing the socket directory, writing
//! the hook's files or starting a job, with the path or program it went wrong on. Each
//! prints as one line; the application adds nothing but its `vramtop:` prefix.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::SOCKET_DIR_ENV;

#[derive(Debug)]
pub enum AttachError {
    /// A directory vramtop needs private (the sockets', the hook's) cannot be made so.
    Dir { dir: PathBuf, problem: DirProblem },
    /// One of the hook's files could not be written.
    HookFile { path: PathBuf, source: io::Error },
    /// `launch::spawn` was given no command.
    NoCommand,
    /// The job's log file could not be handed to both its stdout and stderr.
    Log(io::Error),
    /// The command could not be started.
    Start { program: String, source: io::Error },
}

/// What is wrong with a directory that must be private.
#[derive(Debug)]
pub enum DirProblem {
    Create(io::Error),
    Read(io::Error),
    NotADirectory,
    /// It belongs to this other uid: it could hand us another user's sockets.
    OtherUser(u32),
    MakePrivate(io::Error),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Dir { dir, problem } => {
                let dir = dir.display();
                match problem {
                    DirProblem::Create(e) => write!(f, "cannot create {dir}: {e}"),
                    DirProblem::Read(e) => write!(f, "{dir}: {e}"),
                    DirProblem::NotADirectory => write!(f, "{dir} is not a directory"),
                    DirProblem::OtherUser(uid) => write!(
                        f,
                        "{dir} belongs to uid {uid}, not to you: remove it or set {SOCKET_DIR_ENV}"
                    ),
                    DirProblem::MakePrivate(e) => write!(f, "cannot make {dir} private: {e}"),
                }
            }
            AttachError::HookFile { path, source } => {
                write!(f, "cannot write {}: {source}", path.display())
            }
            AttachError::NoCommand => write!(f, "no command to run"),
            AttachError::Log(e) => write!(f, "cannot share the log file: {e}"),
            AttachError::Start { program, source } => match source.kind() {
                io::ErrorKind::NotFound => write!(f, "{program}: command not found"),
                io::ErrorKind::PermissionDenied => write!(f, "{program}: permission denied"),
                _ => write!(f, "cannot start {program}: {source}"),
            },
        }
    }
}

impl std::error::Error for AttachError {}
