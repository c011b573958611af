//! Public value types of the allocator: what callers hold (`Block`), what they read
//! (`Stats`, `Layout`, `Event`) and what an OOM looked like (`OomReport`; the error itself is
//! `crate::error::AllocError`).
//! Plain data only: no locking, no policy logic, no UI, no CUDA.

use std::fmt;

/// The granule every block size is a multiple of: 512 B, as in PyTorch.
pub(crate) const GRAIN: u64 = 512;

/// Requests are rounded up to 512 B; 0 B gets the minimum block (see the crate docs).
pub fn round_size(size: u64) -> Option<u64> {
    size.max(1).checked_next_multiple_of(GRAIN)
}

/// A stream id, as in CUDA streams: blocks are cached per stream.
pub type StreamId = u32;

/// Set in the stream id of a private memory pool (PyTorch's `segment_pool_id` other than
/// (0, 0): each `torch.cuda.graph` capture, torch.compile's CUDA graphs and a `MemPool`
/// allocate into one). A pool is cached apart, as a stream is, and PyTorch never gives its
/// free segments back while its graph (or pool) lives: not to an OOM's retry, not to
/// `empty_cache()`, not to the garbage collector.
pub const GRAPH_POOL: StreamId = 1 << 30;

/// Whether `stream` is a CUDA graph's private pool (`GRAPH_POOL`).
pub fn in_graph_pool(stream: StreamId) -> bool {
    stream & GRAPH_POOL != 0
}

/// An interned allocation-site label ("train.py:68 step"); `Layout::tags` and
/// `Allocator::tag_name` turn it back into text. Interning keeps `layout()` cheap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct TagId(pub u32);

/// A live allocation handed to a caller. It is a receipt, not a smart pointer: the
/// caller returns it with `Allocator::free`. `owner` names the allocator that issued it,
/// so a block from another allocator is refused rather than corrupting state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub id: u64,
    pub owner: u64,
    pub addr: u64,
    /// Bytes reserved for this block after the policy's rounding.
    pub size: u64,
    /// Bytes the caller asked for.
    pub requested: u64,
    pub stream: StreamId,
    pub tag: TagId,
    /// Where the issuing allocator keeps its books on this block: lets `free` find
    /// them without a lookup table. Only a hint; `id` and `addr` are checked against it.
    pub slot: u32,
}

/// The allocator policies, chosen by name with `--policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    Caching,
    BestFit,
    FirstFit,
    Tlsf,
    /// The ideal page-mapped allocator: the lower bound of what expandable segments can do.
    Expandable,
    /// PyTorch's own expandable segments, rule for rule: what PyTorch would reserve.
    PytorchExpandable,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Caching,
        PolicyKind::BestFit,
        PolicyKind::FirstFit,
        PolicyKind::Tlsf,
        PolicyKind::Expandable,
        PolicyKind::PytorchExpandable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Caching => "caching",
            PolicyKind::BestFit => "best-fit",
            PolicyKind::FirstFit => "first-fit",
            PolicyKind::Tlsf => "tlsf",
            PolicyKind::Expandable => "expandable",
            PolicyKind::PytorchExpandable => "pytorch-expandable",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
                format!("unknown policy '{s}'; known policies: {}", known.join(", "))
            })
    }
}

/// What a byte range inside a segment is doing right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockState {
    Allocated,
    Free,
    /// Freed by the caller but still in use by a stream (stream-ordered free):
    /// counted as allocated until the stream catches up.
    PendingFree,
    /// Reserved address space with no memory behind it (the expandable policies).
    Unmapped,
}

/// Which pool a segment belongs to. Policies with one address range use `Range`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pool {
    Small,
    Large,
    Range,
}

/// One run of bytes in a segment: a block (allocated or pending-free), a free run, or
/// an unmapped run. Runs of a segment tile it exactly, in address order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LayoutRun {
    pub addr: u64,
    pub size: u64,
    pub state: BlockState,
    /// Requested bytes for allocated and pending-free runs, 0 otherwise.
    pub requested: u64,
    /// Allocation id for allocated and pending-free runs.
    pub id: Option<u64>,
    pub tag: Option<TagId>,
    pub stream: Option<StreamId>,
    /// Nanoseconds since the allocator was created, at the block's birth.
    pub born_ns: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SegmentLayout {
    pub addr: u64,
    pub size: u64,
    pub pool: Pool,
    pub stream: Option<StreamId>,
    pub runs: Vec<LayoutRun>,
}

/// Everything the block map needs, in address order. Built by `Allocator::layout()`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Layout {
    pub policy: Option<PolicyKind>,
    pub capacity: u64,
    pub segments: Vec<SegmentLayout>,
    /// Tag names indexed by `TagId.0`.
    pub tags: Vec<String>,
    /// Bumped on every change, so a drawer can skip work when nothing moved.
    pub generation: u64,
}

impl Layout {
    pub fn tag_name(&self, tag: TagId) -> &str {
        self.tags
            .get(tag.0 as usize)
            .map(String::as_str)
            .unwrap_or("?")
    }
}

/// What a map region shows, whoever stands behind it (a probe, a snapshot, a replay,
/// an attached job): a layout, its stats, and fragmentation history in per-mille
/// (empty where there is no history).
#[derive(Clone, Debug, Default)]
pub struct MapView {
    pub layout: Layout,
    pub stats: Stats,
    pub frag_history: Vec<u64>,
}

/// Number of buckets of the free-run histogram: bucket i holds runs of size in
/// [2^i, 2^(i+1)).
pub const HIST_BUCKETS: usize = 48;

/// Metrics with the same meaning for every policy.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    pub policy: Option<PolicyKind>,
    pub capacity_bytes: u64,
    /// Bytes the backing currently holds for us (segments, or mapped pages).
    pub reserved_bytes: u64,
    /// Bytes in live blocks after rounding (pending-free blocks included).
    pub allocated_bytes: u64,
    /// Bytes callers asked for in live blocks.
    pub requested_bytes: u64,
    pub live_blocks: u64,
    pub pending_free_blocks: u64,
    /// Free runs inside reserved memory (not counting unmapped address space).
    pub free_runs: u64,
    pub total_free_bytes: u64,
    pub largest_free_bytes: u64,
    /// 1 - largest_free / total_free; 0 when nothing is free.
    pub external_fragmentation: f64,
    /// reserved / allocated; None when nothing is allocated.
    pub reserved_over_allocated: Option<f64>,
    /// Log2 histogram of free-run sizes (see `HIST_BUCKETS`).
    pub free_run_histogram: Vec<u64>,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_requested_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
    pub segment_allocs: u64,
    pub segment_frees: u64,
    pub page_maps: u64,
    pub page_unmaps: u64,
    pub ooms: u64,
    /// Allocations that succeeded only after releasing cached segments.
    pub retries: u64,
    pub last_oom: Option<OomReport>,
}

impl Stats {
    /// Calls made to the backing: segment alloc/free and page map/unmap.
    pub fn backing_calls(&self) -> u64 {
        self.segment_allocs + self.segment_frees + self.page_maps + self.page_unmaps
    }
}

/// Free memory as the next request sees it: the figures an out-of-memory report would
/// give now (for expandable, unmapped address space up to the backing's headroom too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FreeForRequests {
    pub runs: u64,
    pub total_bytes: u64,
    pub largest_bytes: u64,
}

/// The facts behind an out-of-memory error: what was asked, and why it did not fit.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OomReport {
    pub requested_bytes: u64,
    /// The request after the policy's rounding: what had to be contiguous.
    pub rounded_bytes: u64,
    pub total_free_bytes: u64,
    pub largest_free_bytes: u64,
    pub free_runs: u64,
    pub reserved_bytes: u64,
    pub capacity_bytes: u64,
    pub stream: StreamId,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "needed {} contiguous; {} free in {} runs, largest {}",
            human_bytes(self.rounded_bytes),
            human_bytes(self.total_free_bytes),
            self.free_runs,
            human_bytes(self.largest_free_bytes)
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Alloc,
    Free,
    FreeRequested,
    SegmentAlloc,
    SegmentFree,
    PageMap,
    PageUnmap,
    Oom,
}

/// One change in the allocator, as observers see it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Event {
    /// Position in the allocator's event sequence, starting at 0, without gaps.
    pub seq: u64,
    /// Nanoseconds since the allocator was created.
    pub time_ns: u64,
    pub kind: EventKind,
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub tag: Option<TagId>,
    pub alloc_id: Option<u64>,
}

/// Bytes as people read them: "512 B", "2.0 MiB", "5.3 GiB".
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2 << 20), "2.0 MiB");
        assert_eq!(human_bytes(5_690_000_000), "5.3 GiB");
    }

    #[test]
    fn oom_report_spells_out_the_paradox() {
        let r = OomReport {
            requested_bytes: 2 << 30,
            rounded_bytes: 2 << 30,
            total_free_bytes: 5_690_000_000,
            largest_free_bytes: 1_181_116_006,
            free_runs: 214,
            reserved_bytes: 0,
            capacity_bytes: 0,
            stream: 0,
        };
        assert_eq!(
            r.to_string(),
            "needed 2.0 GiB contiguous; 5.3 GiB free in 214 runs, largest 1.1 GiB"
        );
    }

    #[test]
    fn policy_names_round_trip() {
        for p in PolicyKind::ALL {
            assert_eq!(p.name().parse::<PolicyKind>(), Ok(p));
        }
        assert!("nope"
            .parse::<PolicyKind>()
            .unwrap_err()
            .contains("caching"));
    }
}
