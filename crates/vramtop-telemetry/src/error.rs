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
    /// A device source name that is none of ours.
    UnknownDeviceSource(String),
    /// One fetch of a `vramtop serve` host, and where it failed.
    Fetch(FetchError),
}

/// Why one fetch of a `vramtop serve` host's `/api/snapshot` failed, said in a few words on
/// the host's row.
#[derive(Debug)]
pub enum FetchError {
    Connect(std::io::Error),
    /// The HTTP exchange itself (handshake, request).
    Http(hyper::Error),
    Request(hyper::http::Error),
    Status(u16),
    /// The answer's body could not be read whole (or passed the size limit).
    Body(Box<dyn std::error::Error + Send + Sync>),
    Timeout(std::time::Duration),
    NotASnapshot(serde_json::Error),
    /// The host serves a newer snapshot shape than this vramtop reads.
    NewerSchema {
        served: u32,
        read: u32,
    },
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::Connect(e) => write!(f, "{e}"),
            FetchError::Http(e) => write!(f, "{e}"),
            FetchError::Request(e) => write!(f, "building the request: {e}"),
            FetchError::Status(code) => write!(f, "HTTP {code}"),
            FetchError::Body(e) => write!(f, "reading the answer: {e}"),
            FetchError::Timeout(t) => write!(f, "no answer within {} s", t.as_secs_f64()),
            FetchError::NotASnapshot(e) => write!(f, "not a vramtop snapshot ({e})"),
            FetchError::NewerSchema { served, read } => write!(
                f,
                "serves snapshot schema {served}, newer than the {read} this vramtop reads: \
                 upgrade vramtop here"
            ),
        }
    }
}

impl std::error::Error for FetchError {}

impl From<FetchError> for TelemetryError {
    fn from(e: FetchError) -> Self {
        TelemetryError::Fetch(e)
    }
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
            TelemetryError::UnknownDeviceSource(name) => {
                write!(f, "no device source '{name}'; use auto, nvml or sim")
            }
            TelemetryError::Fetch(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TelemetryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TelemetryError::Thread { source, .. } | TelemetryError::TokenFile { source, .. } => {
                Some(source)
            }
            TelemetryError::Fetch(e) => Some(e),
            TelemetryError::Nvml(_)
            | TelemetryError::Token { .. }
            | TelemetryError::UnknownDeviceSource(_) => None,
        }
    }
}
