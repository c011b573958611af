//! A PyTorch snapshot's final state (`Trace::segments_at_end`) as a block-map `Layout`,
//! and the text summary `vramtop snapshot --once` prints. Plain data; no UI.

use std::collections::HashMap;

use super::{SnapshotSegment, Trace};
use crate::units::{mib, thousands};
use vramtop_alloc::metrics::layout_stats;
use vramtop_alloc::{human_bytes, BlockState, Layout, LayoutRun, Pool, SegmentLayout, TagId};

/// Segments in address order, each tiled by its blocks: gaps between the snapshot's
/// blocks (and free blocks) become free runs, adjacent free runs merge, and blocks that
/// overlap an earlier one or stick out of their segment are clipped.
pub fn layout_at_end(trace: &Trace) -> Layout {
    layout_of(&trace.segments_at_end)
}

/// Segments as a `Layout`, whoever read them (a snapshot file, an attached job's hook).
pub fn layout_of(segments: &[SnapshotSegment]) -> Layout {
    let mut tags = TagTable::default();
    let mut segments: Vec<&SnapshotSegment> = segments.iter().collect();
    segments.sort_by_key(|s| s.addr);
    let mut next_id = 1u64;
    let segments: Vec<SegmentLayout> = segments
        .into_iter()
        .map(|s| segment_layout(s, &mut tags, &mut next_id))
        .collect();
    Layout {
        policy: None,
        capacity: segments.iter().map(|s| s.size).sum(),
        segments,
        tags: tags.names,
        generation: 0,
    }
}

#[derive(Default)]
struct TagTable {
    names: Vec<String>,
    ids: HashMap<String, TagId>,
}

impl TagTable {
    fn intern(&mut self, name: &str) -> TagId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = TagId(self.names.len() as u32);
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }
}

fn segment_layout(seg: &SnapshotSegment, tags: &mut TagTable, next_id: &mut u64) -> SegmentLayout {
    let end = seg.addr.saturating_add(seg.total_size);
    let mut blocks: Vec<_> = seg.blocks.iter().collect();
    blocks.sort_by_key(|b| b.addr);
    let mut runs: Vec<LayoutRun> = Vec::with_capacity(blocks.len() + 1);
    let mut cursor = seg.addr;
    for block in blocks {
        let start = block.addr.max(cursor);
        let stop = block.addr.saturating_add(block.size).min(end);
        if stop <= start {
            continue;
        }
        push_free(&mut runs, cursor, start - cursor);
        if block.state == BlockState::Free {
            push_free(&mut runs, start, stop - start);
        } else {
            runs.push(LayoutRun {
                addr: start,
                size: stop - start,
                state: block.state,
                requested: block.requested_size,
                id: Some(*next_id),
                tag: block.tag.as_deref().map(|t| tags.intern(t)),
                stream: Some(seg.stream),
                born_ns: None,
            });
            *next_id += 1;
        }
        cursor = stop;
    }
    push_free(&mut runs, cursor, end.saturating_sub(cursor));
    SegmentLayout {
        addr: seg.addr,
        size: seg.total_size,
        pool: seg.pool,
        stream: Some(seg.stream),
        runs,
    }
}

fn push_free(runs: &mut Vec<LayoutRun>, addr: u64, size: u64) {
    if size == 0 {
        return;
    }
    if let Some(last) = runs.last_mut() {
        if last.state == BlockState::Free && last.addr + last.size == addr {
            last.size += size;
            return;
        }
    }
    runs.push(LayoutRun {
        addr,
        size,
        state: BlockState::Free,
        requested: 0,
        id: None,
        tag: None,
        stream: None,
        born_ns: None,
    });
}

/// The `--once` text: segments, blocks, reserved, allocated, largest free, fragmentation.
pub fn summary(name: &str, trace: &Trace, layout: &Layout) -> String {
    let stats = layout_stats(layout);
    let pools = |pool: Pool| layout.segments.iter().filter(|s| s.pool == pool).count();
    let lines = [
        format!("{name}: {}, device {}", trace.source, trace.device),
        format!(
            "segments       {} (small pool {}, large pool {})",
            thousands(layout.segments.len() as u64),
            pools(Pool::Small),
            pools(Pool::Large)
        ),
        format!(
            "blocks         {} live ({} pending free)",
            thousands(stats.live_blocks),
            thousands(stats.pending_free_blocks)
        ),
        format!("reserved       {}", mib(stats.reserved_bytes)),
        format!("allocated      {}", mib(stats.allocated_bytes)),
        format!("requested      {}", mib(stats.requested_bytes)),
        format!(
            "free           {} in {} runs, largest {}",
            human_bytes(stats.total_free_bytes),
            thousands(stats.free_runs),
            human_bytes(stats.largest_free_bytes)
        ),
        format!(
            "fragmentation  {:.3} (1 - largest free / total free)",
            stats.external_fragmentation
        ),
        if trace.stats.no_history {
            "history        none: segments only".to_string()
        } else {
            format!(
                "history        {} events (vramtop replay shows them)",
                thousands(trace.events.len() as u64)
            )
        },
    ];
    lines.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SnapshotBlock, TraceFormat, TraceStats};

    fn block(addr: u64, size: u64, state: BlockState) -> SnapshotBlock {
        SnapshotBlock {
            addr,
            size,
            requested_size: size,
            state,
            tag: Some("m.py:3 fwd".into()),
        }
    }

    fn snapshot(segments: Vec<SnapshotSegment>) -> Trace {
        Trace {
            source: TraceFormat::PytorchSnapshot,
            device: 0,
            initial: Vec::new(),
            initial_segments: Vec::new(),
            events: Vec::new(),
            segments_at_end: segments,
            settings: Default::default(),
            stats: TraceStats {
                no_history: true,
                ..TraceStats::default()
            },
        }
    }

    #[test]
    fn gaps_become_free_and_runs_tile_the_segment() {
        let seg = SnapshotSegment {
            addr: 0x1000,
            total_size: 0x1000,
            stream: 0,
            pool: Pool::Large,
            is_expandable: false,
            blocks: vec![
                block(0x1600, 0x200, BlockState::Free),
                block(0x1200, 0x200, BlockState::Allocated),
                // Overlaps the block before: clipped.
                block(0x1300, 0x200, BlockState::PendingFree),
                // Sticks out of the segment: clipped.
                block(0x1e00, 0x400, BlockState::Allocated),
            ],
        };
        let layout = layout_at_end(&snapshot(vec![seg]));
        let runs = &layout.segments[0].runs;
        let shape: Vec<(u64, u64, BlockState)> =
            runs.iter().map(|r| (r.addr, r.size, r.state)).collect();
        assert_eq!(
            shape,
            vec![
                (0x1000, 0x200, BlockState::Free),
                (0x1200, 0x200, BlockState::Allocated),
                (0x1400, 0x100, BlockState::PendingFree),
                (0x1500, 0x900, BlockState::Free),
                (0x1e00, 0x200, BlockState::Allocated),
            ]
        );
        assert_eq!(layout.tags, vec!["m.py:3 fwd".to_string()]);
        assert_eq!(runs[1].tag, Some(TagId(0)));
        let stats = layout_stats(&layout);
        assert_eq!(stats.reserved_bytes, 0x1000);
        assert_eq!(stats.largest_free_bytes, 0x900);
        let text = summary("s.pickle", &snapshot(Vec::new()), &layout);
        assert!(
            text.contains("segments       1 (small pool 0, large pool 1)"),
            "{text}"
        );
        assert!(text.contains("history        none"), "{text}");
    }
}
