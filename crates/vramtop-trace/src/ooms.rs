//! The trace's own out-of-memory errors, each with the traced allocator's state at that
//! moment (reserved, allocated, free in how many runs, largest run), and the capacity a
//! replay should assume when the user gives none: the traced allocator gave up there.
//! Walks the events once over the segments and blocks the trace itself describes.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Trace, TraceEventKind};

/// One `oom` entry of the trace, and the traced allocator's state when it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceOom {
    /// Index of the `oom` event in `Trace::events`.
    pub event: usize,
    pub time_us: Option<i64>,
    /// The request that failed (as PyTorch recorded it: before rounding).
    pub requested_bytes: u64,
    /// What the driver said was free on the device (PyTorch's `device_free`).
    pub device_free_bytes: u64,
    /// Segments the traced allocator held.
    pub reserved_bytes: u64,
    /// Bytes in live blocks (allocated, or freed but not yet completed).
    pub allocated_bytes: u64,
    /// Reserved but not in a live block, in how many runs, and the largest.
    pub free_bytes: u64,
    pub free_runs: u64,
    pub largest_free_bytes: u64,
}

impl TraceOom {
    /// "needed 1.0 GiB contiguous; 4.3 GiB free in 306 runs, largest 6.0 MiB": the
    /// probes' wording.
    pub fn explain(&self) -> String {
        use vramtop_alloc::human_bytes;
        format!(
            "needed {} contiguous; {} free in {} runs, largest {}",
            human_bytes(self.requested_bytes),
            human_bytes(self.free_bytes),
            self.free_runs,
            human_bytes(self.largest_free_bytes)
        )
    }
}

/// How the capacity of a replay was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// `--capacity`.
    Given,
    /// From the trace's OOMs (see `inferred_capacity`).
    Inferred,
    /// No limit: the trace has no OOM and none was given.
    Unlimited,
}

/// The trace's OOMs in order, with the traced state at each.
pub fn trace_ooms(trace: &Trace) -> Vec<TraceOom> {
    if !trace.events.iter().any(|e| e.kind == TraceEventKind::Oom) {
        return Vec::new();
    }
    let mut state = TracedState::at_start(trace);
    let mut out = Vec::new();
    for (i, event) in trace.events.iter().enumerate() {
        match event.kind {
            TraceEventKind::Alloc => {
                state.blocks.insert(event.addr, event.size);
            }
            TraceEventKind::FreeCompleted => {
                state.blocks.remove(&event.addr);
            }
            TraceEventKind::SegmentAlloc => state.add_range(event.addr, event.size),
            // Pages mapped into an expandable segment extend one contiguous range: a block
            // may run across a page boundary.
            TraceEventKind::SegmentMap => state.map_pages(event.addr, event.size),
            TraceEventKind::SegmentFree | TraceEventKind::SegmentUnmap => {
                state.remove_range(event.addr, event.size)
            }
            TraceEventKind::Oom => out.push(state.oom(i, event.size, event.addr, event.time_us)),
            TraceEventKind::FreeRequested | TraceEventKind::Snapshot => {}
        }
    }
    out
}

/// The capacity at which the traced allocator gave up: at least the most it ever
/// reserved; where the device itself had room for the request (a cap such as
/// `set_per_process_memory_fraction` was in force), what it held then, else what it held
/// plus what the device had free. `None` without OOMs.
pub fn inferred_capacity(trace: &Trace, ooms: &[TraceOom]) -> Option<u64> {
    let limit = ooms
        .iter()
        .map(|o| {
            if o.device_free_bytes >= o.requested_bytes {
                o.reserved_bytes
            } else {
                o.reserved_bytes.saturating_add(o.device_free_bytes)
            }
        })
        .min()?;
    Some(limit.max(peak_reserved(trace)))
}

/// The most the traced allocator held at once, walking its segment events from the
/// segments held at the start.
pub(crate) fn peak_reserved(trace: &Trace) -> u64 {
    let mut current: u64 = trace.initial_segments.iter().map(|s| s.size).sum();
    let mut peak = current;
    for event in &trace.events {
        match event.kind {
            TraceEventKind::SegmentAlloc | TraceEventKind::SegmentMap => {
                current = current.saturating_add(event.size);
                peak = peak.max(current);
            }
            TraceEventKind::SegmentFree | TraceEventKind::SegmentUnmap => {
                current = current.saturating_sub(event.size)
            }
            _ => {}
        }
    }
    peak
}

/// Reserved ranges and live blocks, by address.
struct TracedState {
    ranges: BTreeMap<u64, u64>,
    blocks: BTreeMap<u64, u64>,
}

impl TracedState {
    fn at_start(trace: &Trace) -> Self {
        let mut state = TracedState {
            ranges: BTreeMap::new(),
            blocks: trace.initial.iter().map(|b| (b.addr, b.size)).collect(),
        };
        for seg in &trace.initial_segments {
            state.add_range(seg.addr, seg.size);
        }
        state
    }

    fn add_range(&mut self, addr: u64, size: u64) {
        self.ranges.insert(addr, size);
    }

    /// Adds mapped pages, joined with the mapped range they touch on either side: in an
    /// expandable segment the mapped extent is one run of address space, and a free run
    /// or a block may span pages. (Separate segments are never joined: PyTorch cannot
    /// place one block across two cudaMalloc segments, even adjacent ones.)
    fn map_pages(&mut self, addr: u64, size: u64) {
        let mut start = addr;
        let mut end = addr.saturating_add(size);
        if let Some((&before, &len)) = self.ranges.range(..addr).next_back() {
            if before.saturating_add(len) == addr {
                self.ranges.remove(&before);
                start = before;
            }
        }
        if let Some(len) = self.ranges.remove(&end) {
            end = end.saturating_add(len);
        }
        self.ranges.insert(start, end - start);
    }

    /// Removes [addr, addr+size) from the reserved ranges, splitting one where needed
    /// (an unmap of pages inside an expandable segment).
    fn remove_range(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(&a, &s)| a.saturating_add(s) > addr)
            .map(|(&a, &s)| (a, s))
            .collect();
        for (a, s) in overlapping {
            self.ranges.remove(&a);
            let e = a + s;
            if a < addr {
                self.ranges.insert(a, addr - a);
            }
            if e > end {
                self.ranges.insert(end, e - end);
            }
        }
    }

    fn oom(
        &self,
        event: usize,
        requested: u64,
        device_free: u64,
        time_us: Option<i64>,
    ) -> TraceOom {
        let reserved: u64 = self.ranges.values().sum();
        let mut allocated = 0;
        let (mut free, mut runs, mut largest) = (0u64, 0u64, 0u64);
        for (&start, &size) in &self.ranges {
            let end = start + size;
            let mut cursor = start;
            for (&addr, &len) in self.blocks.range(start..end) {
                if addr > cursor {
                    let gap = addr - cursor;
                    free += gap;
                    runs += 1;
                    largest = largest.max(gap);
                }
                allocated += len;
                cursor = cursor.max(addr.saturating_add(len));
            }
            if end > cursor {
                let gap = end - cursor;
                free += gap;
                runs += 1;
                largest = largest.max(gap);
            }
        }
        TraceOom {
            event,
            time_us,
            requested_bytes: requested,
            device_free_bytes: device_free,
            reserved_bytes: reserved,
            allocated_bytes: allocated,
            free_bytes: free,
            free_runs: runs,
            largest_free_bytes: largest,
        }
    }
}
