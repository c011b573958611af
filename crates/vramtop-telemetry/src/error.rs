//! The crate's one error type: what went wrong opening a source, reading a token or
//! starting a thread, with what it went wrong on. The application names its own flags
//! around these (`--device nvml: ...`, `--token-file PATH: ...`); nothing here knows them.

use std::fmt;
use std::path::PathBuf;

use super::nvml::NvmlOpenError;

#[derive(Debug)]
pub enum TelemetryError {
    /// NVML was required and could not be opened.
    Nvml(NvmlOpenError),
    /// A thread of ours could not be started (`what` says which).
    Thread {
        what: &'static str,
        source: std::io::Error,
    },
    /// A bearer token's file could not be read.
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A bearer token that is not one (`why` says what is wrong and what to do), with
    /// the file it came from.
    Token {
        path: Option<PathBuf>,
        why: &'static str,
    },
}

impl fmt::Display for TelemetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TelemetryError::Nvml(e) => write!(f, "{e}"),
            TelemetryError::Thread { what, source } => {
                write!(f, "could not start the {what} thread: {source}")
            }
            TelemetryError::TokenFile { path, source } => write!(f, "{}: {source}", path.display()),
            TelemetryError::Token { path: None, why } => write!(f, "the token {why}"),
            TelemetryError::Token {
                path: Some(path),
                why,
            } => write!(f, "{}: the token {why}", path.display()),
        }
    }
}

impl std::error::Error for TelemetryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TelemetryError::Thread { source, .. } | TelemetryError::TokenFile { source, .. } => {
                Some(source)
            }
            TelemetryError::Nvml(_) | TelemetryError::Token { .. } => None,
        }
    }
}
