//! Leak bookkeeping: which blocks are live (by allocation id), interned tags, and live
//! bytes per tag. The policies keep each block's details in their nodes; the ledger
//! only maps ids to nodes so a receipt can be checked before anything is touched.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::types::TagId;

/// A fast multiplicative hasher for ids and short tag strings (FxHash's mix); keys
/// come from us, not from an attacker, so SipHash's armour buys nothing here.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.hash = (self.hash.rotate_left(5) ^ n).wrapping_mul(SEED);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

/// Where a live block is, as the allocator knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LiveRef {
    pub node: u32,
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub tag: TagId,
    pub pending: bool,
}

/// Interned allocation-site labels and per-tag usage.
#[derive(Debug, Default)]
pub(crate) struct Tags {
    ids: HashMap<String, TagId, FxBuild>,
    pub names: Vec<String>,
    /// (live bytes, live blocks) per tag, indexed by TagId.
    pub usage: Vec<(u64, u64)>,
}

impl Tags {
    pub fn intern(&mut self, name: &str) -> TagId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = TagId(self.names.len() as u32);
        self.ids.insert(name.to_owned(), id);
        self.names.push(name.to_owned());
        self.usage.push((0, 0));
        id
    }

    pub fn name(&self, tag: TagId) -> Option<&str> {
        self.names.get(tag.0 as usize).map(String::as_str)
    }

    fn add(&mut self, tag: TagId, bytes: u64) {
        if let Some(u) = self.usage.get_mut(tag.0 as usize) {
            u.0 += bytes;
            u.1 += 1;
        }
    }

    fn remove(&mut self, tag: TagId, bytes: u64) {
        if let Some(u) = self.usage.get_mut(tag.0 as usize) {
            u.0 -= bytes;
            u.1 -= 1;
        }
    }
}

/// Live blocks by id, plus the ids waiting in `process_pending`.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    pub live: HashMap<u64, LiveRef, FxBuild>,
    pub pending: Vec<u64>,
    pub tags: Tags,
}

impl Ledger {
    pub fn insert(&mut self, id: u64, live: LiveRef) {
        self.tags.add(live.tag, live.size);
        self.live.insert(id, live);
    }

    pub fn remove(&mut self, id: u64) -> Option<LiveRef> {
        let live = self.live.remove(&id)?;
        self.tags.remove(live.tag, live.size);
        Some(live)
    }

    /// Ids of the `limit` oldest live blocks, oldest first (ids grow with birth).
    pub fn oldest_ids(&self, limit: usize) -> Vec<u64> {
        let mut ids: Vec<u64> = self.live.keys().copied().collect();
        if limit < ids.len() {
            ids.select_nth_unstable(limit);
            ids.truncate(limit);
        }
        ids.sort_unstable();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(tag: TagId, size: u64) -> LiveRef {
        LiveRef {
            node: 0,
            addr: 0,
            size,
            requested: size,
            tag,
            pending: false,
        }
    }

    #[test]
    fn tags_intern_once_and_count_usage() {
        let mut ledger = Ledger::default();
        let a = ledger.tags.intern("a.py:1");
        let b = ledger.tags.intern("b.py:2");
        assert_eq!(ledger.tags.intern("a.py:1"), a);
        ledger.insert(1, live(a, 512));
        ledger.insert(2, live(a, 1024));
        ledger.insert(3, live(b, 512));
        assert_eq!(ledger.tags.usage[a.0 as usize], (1536, 2));
        assert!(ledger.remove(2).is_some());
        assert!(ledger.remove(2).is_none());
        assert_eq!(ledger.tags.usage[a.0 as usize], (512, 1));
        assert_eq!(ledger.tags.name(b), Some("b.py:2"));
    }

    #[test]
    fn oldest_ids_come_first() {
        let mut ledger = Ledger::default();
        let t = ledger.tags.intern("t");
        for id in [9, 3, 7, 1, 5] {
            ledger.insert(id, live(t, 512));
        }
        assert_eq!(ledger.oldest_ids(3), vec![1, 3, 5]);
        assert_eq!(ledger.oldest_ids(10), vec![1, 3, 5, 7, 9]);
        assert_eq!(ledger.oldest_ids(0), Vec::<u64>::new());
    }
}
