//! The crate's errors, in one place: how an allocation fails (`AllocError`), how a
//! backing fails (`BackingError`), and a backing name that is none (`UnknownBacking`).
//! The CUDA backing's own (`CudaOpenError`, `CheckError`) live with it, behind the `cuda`
//! feature. Each fallible function returns the narrowest of them: `AllocError` is on every
//! allocation's path and stays small.

use std::fmt;

use crate::types::OomReport;

/// How an allocation fails.
#[derive(Clone, Debug, PartialEq)]
pub enum AllocError {
    OutOfMemory(Box<OomReport>),
    /// The block was already freed (or its id is unknown to this allocator).
    DoubleFree {
        id: u64,
    },
    /// The block was issued by a different allocator.
    ForeignBlock {
        id: u64,
    },
    /// The backing failed for a reason other than capacity (a driver error, say).
    Backing(String),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory(r) => write!(f, "out of memory: {r}"),
            AllocError::DoubleFree { id } => {
                write!(
                    f,
                    "block #{id} is not live in this allocator (double free?)"
                )
            }
            AllocError::ForeignBlock { id } => {
                write!(f, "block #{id} belongs to another allocator")
            }
            AllocError::Backing(msg) => write!(f, "backing failed: {msg}"),
        }
    }
}

impl std::error::Error for AllocError {}

/// How a backing fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackingError {
    /// The request would take the backing past its capacity.
    Exhausted {
        requested: u64,
        held: u64,
        capacity: u64,
    },
    /// Anything else: a bad address, a driver or OS error.
    Failed(String),
}

impl fmt::Display for BackingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackingError::Exhausted {
                requested,
                held,
                capacity,
            } => write!(
                f,
                "backing exhausted: asked for {}, holding {} of {}",
                crate::human_bytes(*requested),
                crate::human_bytes(*held),
                crate::human_bytes(*capacity)
            ),
            BackingError::Failed(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for BackingError {}

/// A backing name that is none of `BackingChoice`'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownBacking(pub String);

impl fmt::Display for UnknownBacking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'{}' is not a backing; use auto, host, cuda or bookkeeping",
            self.0
        )
    }
}

impl std::error::Error for UnknownBacking {}
