//! The crate's errors, in one place: a trace that could not be read (`TraceError`, with
//! its file, and `TraceErrorKind`, the why) and a replay the allocator refused
//! (`ReplayError`). The pickle reader's own (`pickle::PickleError`) lives with it and is
//! carried here as `TraceErrorKind::Pickle`.

use std::fmt;
use std::path::PathBuf;

use vramtop_alloc::AllocError;

use crate::pickle;

/// A trace that could not be read: which file, and why in one line.
#[derive(Debug)]
pub struct TraceError {
    pub path: Option<PathBuf>,
    pub kind: TraceErrorKind,
}

#[derive(Debug)]
#[non_exhaustive]
pub enum TraceErrorKind {
    Io(std::io::Error),
    Empty,
    TooLarge {
        limit: u64,
    },
    GzipTruncated,
    GzipCorrupt(String),
    UnknownFormat,
    Pickle(pickle::PickleError),
    /// A pickle, but not of a memory snapshot (or a snapshot with a malformed part).
    NotASnapshot(String),
    Csv {
        row: usize,
        message: String,
    },
    Record {
        line: usize,
        message: String,
    },
}

impl fmt::Display for TraceErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceErrorKind::Io(e) => write!(f, "cannot read the file: {e}"),
            TraceErrorKind::Empty => f.write_str(
                "the file is empty; pass a snapshot from torch.cuda.memory._dump_snapshot(), \
                 an RMM log or a vramtop recording",
            ),
            TraceErrorKind::TooLarge { limit } => write!(
                f,
                "the trace is larger than {} (the reader's limit); record a shorter history",
                vramtop_alloc::human_bytes(*limit)
            ),
            TraceErrorKind::GzipTruncated => f.write_str(
                "the gzip stream is cut short (was the file copied while being written?); \
                 copy it again",
            ),
            TraceErrorKind::GzipCorrupt(e) => write!(f, "corrupt gzip data ({e}); copy it again"),
            TraceErrorKind::UnknownFormat => f.write_str(
                "not a trace vramtop knows: expected a PyTorch memory snapshot \
                 (.pickle or .pickle.gz), an RMM logging_resource_adaptor CSV \
                 or a vramtop recording",
            ),
            TraceErrorKind::Pickle(e) => write!(f, "{e}"),
            TraceErrorKind::NotASnapshot(what) => f.write_str(what),
            TraceErrorKind::Csv { row, message } => {
                write!(f, "RMM log row {row}: {message}; fix or delete that row")
            }
            TraceErrorKind::Record { line, message } => {
                write!(f, "recording line {line}: {message}")
            }
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}: {}", path.display(), self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            TraceErrorKind::Io(e) => Some(e),
            TraceErrorKind::Pickle(e) => Some(e),
            _ => None,
        }
    }
}

/// The allocator refused something no trace should make it refuse (a backing failure).
#[derive(Debug)]
pub struct ReplayError {
    /// Index of the event; `None` while allocating the blocks live at the start.
    pub event: Option<usize>,
    pub error: AllocError,
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.event {
            Some(i) => write!(f, "replaying event {}: {}", i + 1, self.error),
            None => write!(f, "placing the blocks live at the start: {}", self.error),
        }
    }
}

impl std::error::Error for ReplayError {}
