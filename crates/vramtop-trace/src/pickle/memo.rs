//! The unpickler's memo: what PUT/MEMOIZE stored, by index, for GET to push again.
//!
//! A snapshot memoizes nearly everything it writes (5.3 million entries in a
//! 2-million-event trace), so the dense part is kept in chunks of a fixed size: past the
//! first it grows by one chunk at a time, where a `Vec` would double and copy, holding up
//! to twice the entries (and, while it moves, three times) at the peak. The first chunk
//! grows as a `Vec` does, so a small pickle does not pay for a whole chunk.

use std::collections::HashMap;

/// Entries per chunk of the dense part.
const CHUNK: usize = 1 << 16;

/// Indices 0..len in chunks (the usual case: MEMOIZE numbers entries in order), and a
/// sparse overflow for the odd BINPUT far past the end.
pub(super) struct Memo<T> {
    /// Each full but the last; all but the first allocated whole.
    chunks: Vec<Vec<Option<T>>>,
    dense_len: usize,
    sparse: HashMap<u64, T>,
    /// Entries set, dense and sparse.
    len: usize,
}

impl<T> Memo<T> {
    pub(super) fn new() -> Self {
        Memo {
            chunks: Vec::new(),
            dense_len: 0,
            sparse: HashMap::new(),
            len: 0,
        }
    }

    /// Entries set so far: the index MEMOIZE gives the next one.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Entries in the sparse overflow.
    pub(super) fn sparse_len(&self) -> usize {
        self.sparse.len()
    }

    /// Whether `put(index, ..)` would store it in the sparse overflow.
    pub(super) fn is_sparse(&self, index: u64) -> bool {
        usize::try_from(index).map_or(true, |i| i > self.dense_len)
    }

    pub(super) fn get(&self, index: u64) -> Option<&T> {
        match usize::try_from(index) {
            Ok(i) if i < self.dense_len => self.chunks[i / CHUNK][i % CHUNK].as_ref(),
            _ => self.sparse.get(&index),
        }
    }

    pub(super) fn get_mut(&mut self, index: u64) -> Option<&mut T> {
        match usize::try_from(index) {
            Ok(i) if i < self.dense_len => self.chunks[i / CHUNK][i % CHUNK].as_mut(),
            _ => self.sparse.get_mut(&index),
        }
    }

    /// Sets entry `index`; the caller has checked it against the memo limit.
    pub(super) fn put(&mut self, index: u64, value: T) {
        let dense = usize::try_from(index).ok().filter(|&i| i <= self.dense_len);
        let replaced = match dense {
            Some(i) if i < self.dense_len => {
                self.chunks[i / CHUNK][i % CHUNK].replace(value).is_some()
            }
            Some(i) => {
                if i % CHUNK == 0 {
                    let capacity = if i == 0 { 0 } else { CHUNK };
                    self.chunks.push(Vec::with_capacity(capacity));
                }
                self.chunks[i / CHUNK].push(Some(value));
                self.dense_len += 1;
                // An entry set sparsely before the dense part reached it moves over.
                self.sparse.remove(&index).is_some()
            }
            None => self.sparse.insert(index, value).is_some(),
        };
        if !replaced {
            self.len += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_entries_cross_chunks_and_sparse_ones_are_kept_apart() {
        let mut memo = Memo::new();
        for i in 0..(CHUNK as u64 * 2 + 5) {
            memo.put(i, i * 10);
        }
        memo.put(1 << 40, 7);
        assert_eq!(memo.len(), CHUNK * 2 + 6);
        assert_eq!(memo.sparse_len(), 1);
        assert_eq!(memo.get(CHUNK as u64 + 3), Some(&((CHUNK as u64 + 3) * 10)));
        assert_eq!(memo.get(1 << 40), Some(&7));
        assert_eq!(memo.get(CHUNK as u64 * 2 + 5), None);
        // Replacing an entry does not count it twice.
        memo.put(3, 99);
        *memo.get_mut(4).unwrap() = 98;
        assert_eq!((memo.get(3), memo.get(4)), (Some(&99), Some(&98)));
        assert_eq!(memo.len(), CHUNK * 2 + 6);
    }

    #[test]
    fn a_sparse_entry_the_dense_part_reaches_is_counted_once() {
        let mut memo = Memo::new();
        memo.put(2, 'c');
        memo.put(0, 'a');
        memo.put(1, 'b');
        assert_eq!(memo.len(), 3);
        assert_eq!(memo.get(2), Some(&'c'));
        memo.put(2, 'C');
        assert_eq!(
            (memo.len(), memo.sparse_len(), memo.get(2)),
            (3, 0, Some(&'C'))
        );
    }
}
