//! Leak bookkeeping beside the policies' nodes (which hold each live block's id, tag,
//! stream and birth): interned allocation-site tags, live bytes per tag, and the
//! deferred frees waiting for `process_pending`.

use std::collections::HashMap;

use super::hash::FastBuild;
use super::types::TagId;

/// Interned allocation-site labels and per-tag usage.
#[derive(Debug, Default)]
pub(crate) struct Tags {
    ids: HashMap<String, TagId, FastBuild>,
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

    pub fn add(&mut self, tag: TagId, bytes: u64) {
        if let Some(u) = self.usage.get_mut(tag.0 as usize) {
            u.0 += bytes;
            u.1 += 1;
        }
    }

    pub fn remove(&mut self, tag: TagId, bytes: u64) {
        if let Some(u) = self.usage.get_mut(tag.0 as usize) {
            u.0 -= bytes;
            u.1 -= 1;
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Ledger {
    pub tags: Tags,
    /// Deferred frees as (slot, id), in the order they were requested.
    pub pending: Vec<(u32, u64)>,
}

/// Ids of the `limit` smallest of `ids` (the oldest: ids grow with birth), in order.
pub(crate) fn oldest(mut ids: Vec<(u64, u32)>, limit: usize) -> Vec<(u64, u32)> {
    if limit < ids.len() {
        ids.select_nth_unstable(limit);
        ids.truncate(limit);
    }
    ids.sort_unstable();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_intern_once_and_count_usage() {
        let mut tags = Tags::default();
        let a = tags.intern("a.py:1");
        let b = tags.intern("b.py:2");
        assert_eq!(tags.intern("a.py:1"), a);
        tags.add(a, 512);
        tags.add(a, 1024);
        tags.add(b, 512);
        assert_eq!(tags.usage[a.0 as usize], (1536, 2));
        tags.remove(a, 1024);
        assert_eq!(tags.usage[a.0 as usize], (512, 1));
        assert_eq!(tags.name(b), Some("b.py:2"));
        assert_eq!(tags.name(TagId(9)), None);
    }

    #[test]
    fn oldest_come_first() {
        let ids = [9, 3, 7, 1, 5].iter().map(|&i| (i, 0)).collect::<Vec<_>>();
        let firsts = |v: Vec<(u64, u32)>| v.into_iter().map(|(i, _)| i).collect::<Vec<_>>();
        assert_eq!(firsts(oldest(ids.clone(), 3)), vec![1, 3, 5]);
        assert_eq!(firsts(oldest(ids.clone(), 10)), vec![1, 3, 5, 7, 9]);
        assert!(oldest(ids, 0).is_empty());
    }
}
