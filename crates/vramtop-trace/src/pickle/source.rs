//! Where the unpickler's bytes come from: a slice held whole, or a stream read through a
//! buffer that keeps only what the opcode being read needs (a gunzipped snapshot is
//! never held whole). Both count the bytes taken, which error offsets and the
//! input-scaled limits use.

use std::io::Read;

use super::ReadError;

pub(super) trait Source {
    /// The next `n` bytes, or `None` when the input ends first (or the stream failed).
    fn take(&mut self, n: usize) -> Option<&[u8]>;
    /// Bytes taken so far.
    fn position(&self) -> usize;
}

pub(super) struct SliceSource<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> SliceSource<'a> {
    pub(super) fn new(input: &'a [u8]) -> Self {
        SliceSource { input, pos: 0 }
    }
}

impl Source for SliceSource<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.input.len())?;
        let bytes = &self.input[self.pos..end];
        self.pos = end;
        Some(bytes)
    }

    fn position(&self) -> usize {
        self.pos
    }
}

/// Bytes read from the stream at a time.
const CHUNK: usize = 1 << 20;

pub(super) struct ReadSource<R> {
    reader: R,
    buf: Vec<u8>,
    /// Start of the unread bytes in `buf`.
    start: usize,
    /// Bytes dropped from the front of `buf` so far.
    dropped: usize,
    max_bytes: u64,
    read_total: u64,
    failure: Option<ReadError>,
}

impl<R: Read> ReadSource<R> {
    pub(super) fn new(reader: R, max_bytes: u64) -> Self {
        ReadSource {
            reader,
            buf: Vec::new(),
            start: 0,
            dropped: 0,
            max_bytes,
            read_total: 0,
            failure: None,
        }
    }

    /// What stopped the stream early, if anything did.
    pub(super) fn take_failure(&mut self) -> Option<ReadError> {
        self.failure.take()
    }

    /// Reads the stream to its end (bytes after STOP are ignored, as Python does), so a
    /// gzip stream's own check at its end runs and a cut or corrupt file is noticed.
    pub(super) fn finish(&mut self) {
        self.buf.clear();
        self.start = 0;
        while self.failure.is_none() && self.fill(CHUNK) {
            self.dropped += self.buf.len();
            self.buf.clear();
        }
    }

    /// Reads until `n` unread bytes are buffered; false at the end of the stream.
    fn fill(&mut self, n: usize) -> bool {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.dropped += self.start;
            self.start = 0;
        }
        while self.buf.len() - self.start < n {
            if self.failure.is_some() {
                return false;
            }
            // A chunk at a time, whatever length an opcode claims: a lying length reads
            // to the end of the stream (bounded by `max_bytes`), never allocates it.
            let have = self.buf.len();
            self.buf.resize(have + CHUNK, 0);
            match self.reader.read(&mut self.buf[have..]) {
                Ok(0) => {
                    self.buf.truncate(have);
                    return false;
                }
                Ok(got) => {
                    self.buf.truncate(have + got);
                    self.read_total += got as u64;
                    if self.read_total > self.max_bytes {
                        self.failure = Some(ReadError::TooLarge);
                        return false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    self.buf.truncate(have);
                }
                Err(e) => {
                    self.buf.truncate(have);
                    self.failure = Some(ReadError::Io(e));
                    return false;
                }
            }
        }
        true
    }
}

impl<R: Read> Source for ReadSource<R> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.buf.len() - self.start < n && !self.fill(n) {
            return None;
        }
        let bytes = &self.buf[self.start..self.start + n];
        self.start += n;
        Some(bytes)
    }

    fn position(&self) -> usize {
        self.dropped + self.start
    }
}
