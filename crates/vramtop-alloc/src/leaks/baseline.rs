//! Mark and compare: remember which blocks were live at a mark, and later list what was
//! allocated since and is still alive, per site (a heap-snapshot diff). Pure functions
//! over block records the caller passes in.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::LiveBlock;

/// A live block as the leak tools need it: `Allocator::live_blocks_by_age` gives these,
/// and so does a trace walk (id = allocation order, born = event index or time).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRecord {
    pub id: u64,
    pub tag: String,
    pub size: u64,
    /// When the block was allocated, in any unit that increases (ns, event index).
    pub born: u64,
}

impl From<&LiveBlock> for BlockRecord {
    fn from(block: &LiveBlock) -> Self {
        BlockRecord {
            id: block.id,
            tag: block.tag_name.clone(),
            size: block.size,
            born: block.born_ns,
        }
    }
}

/// Bytes and blocks of one site that appeared since the mark.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteDiff {
    pub tag: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// The blocks live at a mark. Ids identify blocks (an allocator never reuses one), so a
/// block freed and another allocated at the same address is still new.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Baseline {
    ids: HashSet<u64>,
    bytes: u64,
    /// Latest birth among the marked blocks, for "marked 12 s ago".
    newest_born: Option<u64>,
}

impl Baseline {
    /// Pass every live block (`live_blocks_by_age(usize::MAX)`): a block left out
    /// here will show up in every diff as new.
    pub fn mark(blocks: &[BlockRecord]) -> Self {
        Baseline {
            ids: blocks.iter().map(|b| b.id).collect(),
            bytes: blocks.iter().map(|b| b.size).sum(),
            newest_born: blocks.iter().map(|b| b.born).max(),
        }
    }

    pub fn marked_blocks(&self) -> usize {
        self.ids.len()
    }

    pub fn marked_bytes(&self) -> u64 {
        self.bytes
    }

    pub fn newest_born(&self) -> Option<u64> {
        self.newest_born
    }

    /// What in `current` was not live at the mark, per site, most bytes first.
    pub fn diff(&self, current: &[BlockRecord]) -> Vec<SiteDiff> {
        let mut by_tag: HashMap<&str, (u64, u64)> = HashMap::new();
        for block in current.iter().filter(|b| !self.ids.contains(&b.id)) {
            let entry = by_tag.entry(block.tag.as_str()).or_default();
            entry.0 = entry.0.saturating_add(block.size);
            entry.1 += 1;
        }
        let mut out: Vec<SiteDiff> = by_tag
            .into_iter()
            .map(|(tag, (bytes, blocks))| SiteDiff {
                tag: tag.to_string(),
                bytes,
                blocks,
            })
            .collect();
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.tag.cmp(&b.tag)));
        out
    }
}
