//! How reading a pickle fails: what went wrong and at which byte, in words that say
//! what to do.

use std::fmt;

use super::opcode_name;

/// Why a pickle could not be read, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickleError {
    /// Byte offset of the opcode being read.
    pub offset: usize,
    pub kind: PickleErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PickleErrorKind {
    /// The input ended inside an opcode or before STOP.
    Truncated,
    Unsupported {
        opcode: u8,
    },
    Protocol(u8),
    /// A structural error: popping an empty stack, a non-dict under SETITEM, ...
    Malformed(&'static str),
    MemoMissing(u64),
    /// A container that contains itself, or one changed after it was put in another:
    /// Python's pickler never writes either for plain data.
    Recursive,
    LimitExceeded(&'static str),
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.offset;
        match &self.kind {
            PickleErrorKind::Truncated => write!(
                f,
                "pickle ends early (at byte {at}): the file is cut short; copy it again"
            ),
            PickleErrorKind::Unsupported { opcode } => write!(
                f,
                "unsupported pickle opcode 0x{opcode:02x} ({}) at byte {at}: only plain data \
                 (dicts, lists, numbers, strings) as written by torch.cuda.memory._snapshot() \
                 can be read",
                opcode_name(*opcode)
            ),
            PickleErrorKind::Protocol(p) => write!(
                f,
                "pickle protocol {p} at byte {at} is not supported (2 to 5 are)"
            ),
            PickleErrorKind::Malformed(what) => {
                write!(f, "malformed pickle at byte {at}: {what}")
            }
            PickleErrorKind::MemoMissing(i) => write!(
                f,
                "malformed pickle at byte {at}: memo entry {i} is used before it is set"
            ),
            PickleErrorKind::Recursive => write!(
                f,
                "pickle holds a container that contains itself or changes after use \
                 (at byte {at}); snapshots never do, so this is not one"
            ),
            PickleErrorKind::LimitExceeded(what) => write!(
                f,
                "pickle exceeds the reader's limit on {what} at byte {at}; \
                 record a shorter history (smaller max_entries)"
            ),
        }
    }
}

impl std::error::Error for PickleError {}
