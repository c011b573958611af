//! Counters every policy shares, the free-run tally policies keep incrementally, and
//! the assembly of `Stats` from both.

use super::types::{BlockState, Layout, OomReport, PolicyKind, Stats, HIST_BUCKETS};

/// Log2 bucket of a free-run size (bucket i holds [2^i, 2^(i+1))).
#[inline]
pub(crate) fn hist_bucket(size: u64) -> usize {
    (63 - size.max(1).leading_zeros() as usize).min(HIST_BUCKETS - 1)
}

/// Free runs summed up: count, bytes, largest, histogram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FreeSummary {
    pub runs: u64,
    pub total: u64,
    pub largest: u64,
    pub hist: [u64; HIST_BUCKETS],
}

impl Default for FreeSummary {
    fn default() -> Self {
        FreeSummary {
            runs: 0,
            total: 0,
            largest: 0,
            hist: [0; HIST_BUCKETS],
        }
    }
}

impl FreeSummary {
    pub fn add(&mut self, size: u64) {
        self.runs += 1;
        self.total += size;
        self.largest = self.largest.max(size);
        self.hist[hist_bucket(size)] += 1;
    }

    pub fn merge(&mut self, other: &FreeSummary) {
        self.runs += other.runs;
        self.total += other.total;
        self.largest = self.largest.max(other.largest);
        for (a, b) in self.hist.iter_mut().zip(other.hist.iter()) {
            *a += b;
        }
    }
}

/// Incremental count of free runs (everything but the largest, which the index
/// that owns the runs knows better).
#[derive(Clone, Debug)]
pub(crate) struct FreeTally {
    pub runs: u64,
    pub total: u64,
    pub hist: [u64; HIST_BUCKETS],
}

impl Default for FreeTally {
    fn default() -> Self {
        FreeTally {
            runs: 0,
            total: 0,
            hist: [0; HIST_BUCKETS],
        }
    }
}

impl FreeTally {
    #[inline]
    pub fn add(&mut self, size: u64) {
        self.runs += 1;
        self.total += size;
        self.hist[hist_bucket(size)] += 1;
    }

    #[inline]
    pub fn remove(&mut self, size: u64) {
        self.runs -= 1;
        self.total -= size;
        self.hist[hist_bucket(size)] -= 1;
    }

    pub fn summary(&self, largest: u64) -> FreeSummary {
        FreeSummary {
            runs: self.runs,
            total: self.total,
            largest,
            hist: self.hist,
        }
    }
}

/// Running counters kept by the allocator core and the backing wrapper.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    pub reserved: u64,
    pub allocated: u64,
    pub requested: u64,
    pub live_blocks: u64,
    pub pending_blocks: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    pub peak_requested: u64,
    pub allocs: u64,
    pub frees: u64,
    pub segment_allocs: u64,
    pub segment_frees: u64,
    pub page_maps: u64,
    pub page_unmaps: u64,
    pub ooms: u64,
    pub retries: u64,
    pub last_oom: Option<OomReport>,
}

impl Counters {
    pub fn add_reserved(&mut self, bytes: u64) {
        self.reserved += bytes;
        self.peak_reserved = self.peak_reserved.max(self.reserved);
    }

    pub fn add_live(&mut self, size: u64, requested: u64) {
        self.allocated += size;
        self.requested += requested;
        self.live_blocks += 1;
        self.allocs += 1;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        self.peak_requested = self.peak_requested.max(self.requested);
    }

    pub fn remove_live(&mut self, size: u64, requested: u64) {
        self.allocated -= size;
        self.requested -= requested;
        self.live_blocks -= 1;
        self.frees += 1;
    }

    pub fn stats(&self, policy: PolicyKind, capacity: u64, free: &FreeSummary) -> Stats {
        Stats {
            policy: Some(policy),
            capacity_bytes: capacity,
            reserved_bytes: self.reserved,
            allocated_bytes: self.allocated,
            requested_bytes: self.requested,
            live_blocks: self.live_blocks,
            pending_free_blocks: self.pending_blocks,
            free_runs: free.runs,
            total_free_bytes: free.total,
            largest_free_bytes: free.largest,
            external_fragmentation: external_fragmentation(free.largest, free.total),
            reserved_over_allocated: (self.allocated > 0)
                .then(|| self.reserved as f64 / self.allocated as f64),
            free_run_histogram: free.hist.to_vec(),
            peak_reserved_bytes: self.peak_reserved,
            peak_allocated_bytes: self.peak_allocated,
            peak_requested_bytes: self.peak_requested,
            allocs: self.allocs,
            frees: self.frees,
            segment_allocs: self.segment_allocs,
            segment_frees: self.segment_frees,
            page_maps: self.page_maps,
            page_unmaps: self.page_unmaps,
            ooms: self.ooms,
            retries: self.retries,
            last_oom: self.last_oom.clone(),
        }
    }
}

/// `Stats` read off a layout alone, for layouts no allocator stands behind (a PyTorch
/// snapshot's segments): current figures only, so the peaks equal them and the
/// counters of calls and OOMs are 0. Adjacent free runs of a segment count as one run.
pub fn layout_stats(layout: &Layout) -> Stats {
    let mut s = Stats {
        policy: layout.policy,
        capacity_bytes: layout.capacity,
        ..Stats::default()
    };
    let mut free = FreeSummary::default();
    for segment in &layout.segments {
        let mut open_free: u64 = 0;
        for run in &segment.runs {
            if run.state == BlockState::Free {
                open_free += run.size;
                continue;
            }
            if open_free > 0 {
                free.add(open_free);
                open_free = 0;
            }
            match run.state {
                BlockState::Allocated | BlockState::PendingFree => {
                    s.reserved_bytes += run.size;
                    s.allocated_bytes += run.size;
                    s.requested_bytes += run.requested;
                    s.live_blocks += 1;
                    if run.state == BlockState::PendingFree {
                        s.pending_free_blocks += 1;
                    }
                }
                BlockState::Free | BlockState::Unmapped => {}
            }
        }
        if open_free > 0 {
            free.add(open_free);
        }
    }
    s.reserved_bytes += free.total;
    s.free_runs = free.runs;
    s.total_free_bytes = free.total;
    s.largest_free_bytes = free.largest;
    s.external_fragmentation = external_fragmentation(free.largest, free.total);
    s.reserved_over_allocated =
        (s.allocated_bytes > 0).then(|| s.reserved_bytes as f64 / s.allocated_bytes as f64);
    s.free_run_histogram = free.hist.to_vec();
    s.peak_reserved_bytes = s.reserved_bytes;
    s.peak_allocated_bytes = s.allocated_bytes;
    s.peak_requested_bytes = s.requested_bytes;
    s
}

/// 1 - largest / total; 0 when nothing is free.
pub fn external_fragmentation(largest: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        1.0 - largest as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2() {
        assert_eq!(hist_bucket(1), 0);
        assert_eq!(hist_bucket(512), 9);
        assert_eq!(hist_bucket(1023), 9);
        assert_eq!(hist_bucket(1024), 10);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn fragmentation_formula() {
        assert_eq!(external_fragmentation(0, 0), 0.0);
        assert_eq!(external_fragmentation(10, 10), 0.0);
        assert!((external_fragmentation(1, 4) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn layout_stats_merge_adjacent_free_runs() {
        use crate::{LayoutRun, Pool, SegmentLayout};
        let run = |addr: u64, size: u64, state: BlockState| LayoutRun {
            addr,
            size,
            state,
            requested: if state == BlockState::Free {
                0
            } else {
                size - 10
            },
            id: None,
            tag: None,
            stream: None,
            born_ns: None,
        };
        let layout = Layout {
            capacity: 10_000,
            segments: vec![SegmentLayout {
                addr: 0,
                size: 5120,
                pool: Pool::Large,
                stream: Some(0),
                runs: vec![
                    run(0, 512, BlockState::Free),
                    run(512, 512, BlockState::Free),
                    run(1024, 1024, BlockState::Allocated),
                    run(2048, 2048, BlockState::Free),
                    run(4096, 512, BlockState::PendingFree),
                    run(4608, 512, BlockState::Unmapped),
                ],
            }],
            ..Layout::default()
        };
        let s = layout_stats(&layout);
        assert_eq!((s.reserved_bytes, s.allocated_bytes), (4608, 1536));
        assert_eq!(
            (s.requested_bytes, s.live_blocks, s.pending_free_blocks),
            (1516, 2, 1)
        );
        assert_eq!(
            (s.free_runs, s.total_free_bytes, s.largest_free_bytes),
            (2, 3072, 2048)
        );
        assert!((s.external_fragmentation - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.free_run_histogram[10] + s.free_run_histogram[11], 2);
    }

    #[test]
    fn tally_add_remove_balances() {
        let mut t = FreeTally::default();
        t.add(512);
        t.add(4096);
        t.remove(512);
        let s = t.summary(4096);
        assert_eq!((s.runs, s.total, s.largest), (1, 4096, 4096));
        assert_eq!(s.hist[12], 1);
        assert_eq!(s.hist.iter().sum::<u64>(), 1);
    }
}
