//! vramtop-trace: allocation logs in and out. PyTorch CUDA memory snapshots (the pickle
//! `torch.cuda.memory._snapshot()` returns, read by a streaming pickle reader of our own,
//! since no Rust crate reads them), RMM logging-adaptor CSV and vramtop's own JSON-lines
//! recordings, all read into one `Trace` (an initial state plus an event stream); the
//! replay of a trace through vramtop's allocator policies (`replay`), a snapshot's final
//! state as a block-map `Layout` (`snapshot`), the trace's own OOMs (`ooms`) and leak
//! suspects by call site (`leaks`).
//!
//! Depends on `vramtop-alloc` only: no tokio, no ratatui, no clap, no CUDA.
//!
//! ```no_run
//! use std::path::Path;
//! use vramtop_alloc::PolicyKind;
//! use vramtop_trace::replay::{self, ReplayOptions};
//!
//! // A file written by `pickle.dump(torch.cuda.memory._snapshot(), f)` (gzipped or not).
//! let trace = vramtop_trace::load(Path::new("snapshot.pickle")).map_err(|e| e.to_string())?;
//! println!("{} events on device {}", trace.events.len(), trace.device);
//! // Would PyTorch's expandable segments have fitted what the caching allocator did?
//! let policies = [PolicyKind::Caching, PolicyKind::PytorchExpandable];
//! let rows = replay::report(&trace, &policies, ReplayOptions::default())
//!     .map_err(|e| e.to_string())?;
//! for row in &rows {
//!     println!(
//!         "{}: peak reserved {} B, {} OOMs, largest free at the peak {} B",
//!         row.policy.name(),
//!         row.peak_reserved_bytes,
//!         row.ooms,
//!         row.largest_free_at_peak_bytes
//!     );
//! }
//! # Ok::<(), String>(())
//! ```

pub mod cause;
mod checkpoint;
mod error;
mod graph_pools;
mod history;
mod initial;
pub mod leaks;
pub mod ooms;
pub mod pickle;
mod pytorch;
pub mod record;
pub mod replay;
mod rmm;
pub mod roles;
mod rounds;
pub mod snapshot;
pub mod step_rest;
mod units;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use error::{ReplayError, TraceError, TraceErrorKind};
use vramtop_alloc::hash::{AddrMap, AddrSet};
use vramtop_alloc::{BlockState, Pool, StreamId, GRAPH_POOL};

/// Where a trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// `torch.cuda.memory._snapshot()`, pickled (optionally gzipped).
    PytorchSnapshot,
    /// RMM `logging_resource_adaptor` CSV.
    RmmCsv,
    /// vramtop's JSON-lines recording (`record`).
    VramtopRecord,
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceFormat::PytorchSnapshot => "PyTorch memory snapshot",
            TraceFormat::RmmCsv => "RMM log",
            TraceFormat::VramtopRecord => "vramtop recording",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceEventKind {
    Alloc,
    /// The caller freed the block; its memory may still be in use by a stream.
    FreeRequested,
    /// The memory is really released. RMM frees are immediate and appear only as this.
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    /// An allocation failed: `size` is the request; `addr` holds the device's free bytes
    /// (PyTorch's `device_free`), since an OOM has no address.
    Oom,
    /// A snapshot was taken at this point (no memory change).
    Snapshot,
}

/// One entry of the event stream, in the order the source logged it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    pub kind: TraceEventKind,
    pub addr: u64,
    pub size: u64,
    /// Streams are numbered by first appearance; the default stream (0) stays 0.
    pub stream: StreamId,
    /// The call site of this event ("file:line function"), when the source has one.
    /// Interned: every event of one site shares the string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<Arc<str>>,
    /// Microseconds. PyTorch: since the epoch. RMM: since the epoch, or since the
    /// midnight before the log began when it has times of day (what the adaptor writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
}

/// A block that was live before the trace began (a model's parameters, typically).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveAtStart {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<Arc<str>>,
}

/// A segment as the snapshot saw it when it was taken (the end of the trace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSegment {
    pub addr: u64,
    pub total_size: u64,
    pub stream: StreamId,
    pub pool: Pool,
    pub is_expandable: bool,
    pub blocks: Vec<SnapshotBlock>,
}

impl SnapshotSegment {
    /// The bytes of each free run, in address order: free blocks side by side are one run.
    pub fn free_runs(&self) -> Vec<u64> {
        let mut runs = Vec::new();
        let mut run = 0u64;
        for block in &self.blocks {
            if block.state == BlockState::Free {
                run += block.size;
            } else if run > 0 {
                runs.push(run);
                run = 0;
            }
        }
        if run > 0 {
            runs.push(run);
        }
        runs
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotBlock {
    pub addr: u64,
    pub size: u64,
    pub requested_size: u64,
    /// `active_allocated` is Allocated, `active_pending_free` PendingFree, the rest Free.
    pub state: BlockState,
    pub tag: Option<Arc<str>>,
}

/// A segment the traced allocator held before the trace began (its address is never
/// allocated by a `segment_alloc` before it is used or freed), with the blocks live in it
/// then, in address order. PyTorch snapshots only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitialSegment {
    pub addr: u64,
    pub size: u64,
    pub pool: Pool,
    pub stream: StreamId,
    pub blocks: Vec<LiveAtStart>,
}

/// The traced allocator's settings, from the snapshot's `allocator_settings`
/// (`PYTORCH_CUDA_ALLOC_CONF`); `Default` is PyTorch's defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AllocatorSettings {
    /// `max_split_size_mb`, in bytes; None: unlimited.
    pub max_split_size: Option<u64>,
    /// `roundup_power2_divisions` per size interval: index 0 is sizes up to 2 MiB, then
    /// one power of two per index, up to 32 GiB and beyond (PyTorch's 16 intervals);
    /// 0 or 1: plain 512 B rounding.
    pub roundup_power2_divisions: [u32; 16],
    /// `garbage_collection_threshold`; PyTorch acts on it only under a memory fraction.
    pub garbage_collection_threshold: Option<f64>,
    pub expandable_segments: bool,
    /// The configuration string as the job set it, when the snapshot has it.
    pub conf: Option<String>,
}

/// What the importer counted while reading; the replayer and the UI report it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceStats {
    /// Events per action, as the source spells it ("alloc", "free_completed", "free").
    pub actions: BTreeMap<String, u64>,
    /// Events whose action is unknown to us, per action: counted in `actions` too, and
    /// left out of `events`.
    pub unknown_actions: BTreeMap<String, u64>,
    /// FreeCompleted events for an address that was not live at that point.
    pub unknown_frees: u64,
    /// Alloc events at an address that was already live (the earlier block is replaced).
    pub allocs_over_live: u64,
    pub initial_live_bytes: u64,
    /// Trace entries skipped as malformed (a required field missing or mistyped).
    pub malformed: u64,
    /// Where the first malformed entry is and what is wrong with it.
    pub first_malformed: Option<String>,
    /// Devices whose snapshot trace is not empty (PyTorch only).
    pub devices_with_traces: Vec<i64>,
    /// A snapshot without allocation history: segments only, no events (an `oom` entry
    /// the vramtop hook added to such a snapshot does not count as history).
    pub no_history: bool,
    /// What the vramtop hook added to a snapshot it kept at an OOM (`vramtop_oom`).
    pub kept_oom: Option<KeptOom>,
    /// Each run of `segment_free` entries in the trace, in order (`CacheRelease`).
    pub cache_releases: Vec<CacheRelease>,
}

/// A run of `segment_free` entries: PyTorch gave cached segments back, either of its own
/// accord (a request that did not fit under what it may hold: the release before the
/// retry, or before raising) or because the job called `empty_cache()` (and
/// `torch.cuda.graph` calls it before each capture). The replay tells them apart by the
/// figures here (`replay::emptied_by_the_job`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheRelease {
    /// Index of the run's first entry.
    pub at: usize,
    /// What the traced allocator held just before it.
    pub reserved_before: u64,
    /// The size of the next segment it took, where it took one before any `oom` entry.
    pub next_segment: Option<u64>,
    /// Whether the run is followed at once (markers aside) by a new segment or an `oom`
    /// entry, as PyTorch's own release is: it releases while it holds its lock, and then
    /// retries (the retry's segment) or raises. A run the job's own frees follow came
    /// from the job: `empty_cache()` in a batch-size finder's `except`, say.
    pub retried: bool,
}

/// A snapshot the vramtop hook kept at an OOM says which OOM, of which process, and the
/// figures PyTorch had then that a snapshot alone does not hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeptOom {
    /// 1 for the process's first OOM; the hook keeps the first 3 and the latest.
    pub number: u64,
    pub pid: u64,
    /// The job's command line.
    pub argv: Vec<String>,
    pub time_us: i64,
    pub device: i64,
    pub requested_bytes: u64,
    pub device_free_bytes: u64,
    /// The device's total, or the per-process cap when `set_per_process_memory_fraction`
    /// was in force (what PyTorch passes its OOM observers).
    pub device_total_bytes: u64,
    /// PyTorch's figures in PyTorch's words ("Tried to allocate ...").
    pub summary: String,
    /// The allocation history was dropped to keep the file under the hook's size cap.
    pub history_left_out: bool,
    /// The hook's event ring held the job's whole history: it began before the job's
    /// first allocation and was never full (`vramtop_oom.ring.complete`, hook 1.2), or
    /// it holds every event since `checkpoint` (hook 1.3).
    pub ring_complete: bool,
    /// Hook 1.3: the ring was restarted at a checkpoint, and the trace's initial state is
    /// the allocator's segments then (`vramtop_oom.checkpoint`), not an empty allocator.
    pub checkpoint: Option<Checkpoint>,
    /// Hook 1.3: when the job's optimizers stepped, in the trace's clock (microseconds
    /// since the epoch), the last few thousand (`vramtop_oom.steps`).
    pub steps_us: Vec<i64>,
    /// Hook 1.14: where the job marked no step, when its passes through its first model
    /// began, in the same clock (`vramtop_oom.passes`; the hook's `PassMarks`): a forward
    /// after a backward whose gradients were since released, replaced or changed in place.
    /// They stand for its steps.
    pub passes_us: Vec<i64>,
    /// Hook 1.14: how many times the job's model ran its forward again after a backward
    /// whose gradients it left untouched, where no step or pass was marked: the job was
    /// accumulating gradients inside its first step (`vramtop_oom.accumulating`). 0
    /// otherwise.
    pub accumulating: u64,
    /// Hook 1.4: the device's own total (`device_total_bytes` is the cap when one is set).
    pub physical_total_bytes: Option<u64>,
    /// Hook 1.4: the job's allocated bytes over its life, sampled in time and just after
    /// optimizer steps: a leak shows there without the allocation history.
    pub series: Option<cause::AllocatedSeries>,
    pub step_series: Option<cause::AllocatedSeries>,
    /// Hook 1.4: every process NVML listed on the GPU at the OOM; None where NVML could
    /// not say.
    pub gpu_processes: Option<cause::GpuProcesses>,
    /// Hook 1.4: what the live memory was for at the OOM (parameters, gradients,
    /// optimizer state), read off the job's tensors; None where the hook found none.
    pub roles: Option<roles::Roles>,
    /// Hook 1.5: the history before the checkpoint, kept in pieces and stitched on
    /// (`vramtop_oom.history`); None where there was none or it could not be used.
    pub history: Option<KeptHistory>,
    /// Hook 1.10: the process's rank and the job's world size where a launcher set them
    /// (torchrun, accelerate, deepspeed: RANK, WORLD_SIZE).
    pub rank: Option<(u64, Option<u64>)>,
}

/// What a kept history in pieces gave (hook 1.5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeptHistory {
    /// Pieces read (rings and the states after them).
    pub pieces: usize,
    /// It begins at the job's first allocation (else at an older checkpoint).
    pub from_start: bool,
    /// Events put in where a ring's read and its clearing left a gap.
    pub filled: u64,
    /// Events stitched in before the file's own ring.
    pub events: usize,
    /// The last gap in which the job's allocator took or gave back segments: a verdict
    /// replayed over it must agree with one begun again after it.
    pub restart: Option<GapRestart>,
    /// Where in `Trace::events` each gap's put-in events are.
    pub gaps: Vec<std::ops::Range<usize>>,
}

/// Where a kept history may begin again after a gap that changed the job's segments: the
/// index in `Trace::events` at which the state after the gap applies, and that state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GapRestart {
    pub event: usize,
    pub segments: Vec<SnapshotSegment>,
}

/// Where a kept file's history begins when it is not the job's start: the allocator's
/// segments at a moment the hook took them, then every event since.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint {
    pub time_us: i64,
    /// Entries at the head of the ring that the checkpoint's segments already hold.
    pub skipped: u64,
    /// Events just after those that its segments held too (PyTorch reads a device's trace
    /// before its segments): dropped when the replay would see them twice.
    pub reconciled: u64,
    /// Events later on that contradict the checkpoint: a replay from it is not the job's.
    pub contradictions: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub source: TraceFormat,
    /// CUDA device ordinal the events belong to (0 where the source does not say).
    pub device: i64,
    pub initial: Vec<LiveAtStart>,
    /// PyTorch only: the segments held before the trace began, with the blocks of
    /// `initial` that lie in them at their places (a replay can start from them).
    pub initial_segments: Vec<InitialSegment>,
    pub events: Vec<TraceEvent>,
    /// PyTorch only: segments and blocks when the snapshot was taken.
    pub segments_at_end: Vec<SnapshotSegment>,
    /// PyTorch only: the allocator settings the trace was recorded under.
    pub settings: AllocatorSettings,
    pub stats: TraceStats,
}

/// The first request (an allocation, or one refused) at or after event `from`: where a
/// step begins, marked (`replay::step_boundaries`) or found (`rounds::inferred`). An OOM
/// on the first request after a step is the next step's, not the last one's.
pub(crate) fn first_request(events: &[TraceEvent], from: usize) -> Option<usize> {
    (from..events.len())
        .find(|&i| matches!(events[i].kind, TraceEventKind::Alloc | TraceEventKind::Oom))
}

#[cfg(test)]
impl TraceEvent {
    /// An event on stream 0 with no tag and no time, as the crate's tests write them.
    pub(crate) fn bare(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            kind,
            addr,
            size,
            stream: 0,
            tag: None,
            time_us: None,
        }
    }
}

#[cfg(test)]
impl Trace {
    /// A PyTorch trace of `events` after the blocks `initial`, nothing else known, as the
    /// crate's tests write them.
    pub(crate) fn bare(initial: Vec<LiveAtStart>, events: Vec<TraceEvent>) -> Trace {
        Trace {
            source: TraceFormat::PytorchSnapshot,
            device: 0,
            initial,
            initial_segments: Vec::new(),
            events,
            segments_at_end: Vec::new(),
            settings: Default::default(),
            stats: TraceStats::default(),
        }
    }
}

impl Trace {
    /// Peak of live bytes over the trace's own events: Alloc adds a block, FreeCompleted
    /// removes it, sizes rounded up to `round_to` (0 or 1: no rounding). Blocks live
    /// from the start are not counted: this is the figure the shared traces' README
    /// quotes ("summing live bytes over the trace alone"); see `live_bytes_peak_with_initial`.
    pub fn live_bytes_peak(&self, round_to: u64) -> u64 {
        self.peak_from(&[], round_to)
    }

    /// As `live_bytes_peak`, starting from the blocks live before the trace began:
    /// what the device really held for live blocks at the peak.
    pub fn live_bytes_peak_with_initial(&self, round_to: u64) -> u64 {
        self.peak_from(&self.initial, round_to)
    }

    fn peak_from(&self, initial: &[LiveAtStart], round_to: u64) -> u64 {
        let round = |size: u64| match round_to {
            0 | 1 => size,
            r => size.div_ceil(r).saturating_mul(r),
        };
        let mut live: AddrMap<u64> =
            AddrMap::with_capacity_and_hasher(initial.len() + 1024, Default::default());
        let mut current: u64 = 0;
        for block in initial {
            let size = round(block.size);
            if let Some(old) = live.insert(block.addr, size) {
                current = current.saturating_sub(old);
            }
            current = current.saturating_add(size);
        }
        let mut peak = current;
        for event in &self.events {
            match event.kind {
                TraceEventKind::Alloc => {
                    let size = round(event.size);
                    if let Some(old) = live.insert(event.addr, size) {
                        current = current.saturating_sub(old);
                    }
                    current = current.saturating_add(size);
                    peak = peak.max(current);
                }
                TraceEventKind::FreeCompleted => {
                    if let Some(old) = live.remove(&event.addr) {
                        current = current.saturating_sub(old);
                    }
                }
                _ => {}
            }
        }
        peak
    }

    /// One line per thing a user should know about this trace (empty when all is well).
    pub fn notices(&self) -> Vec<String> {
        let mut out = Vec::new();
        let s = &self.stats;
        if s.no_history {
            out.push(
                "no allocation history in this snapshot: showing its segments only; record one \
                 with torch.cuda.memory._record_memory_history() before taking the snapshot"
                    .to_string(),
            );
        }
        if s.devices_with_traces.len() > 1 {
            let list: Vec<String> = s
                .devices_with_traces
                .iter()
                .map(|d| d.to_string())
                .collect();
            out.push(format!(
                "snapshot has traces for devices {}; showing device {}",
                list.join(", "),
                self.device
            ));
        }
        if !s.unknown_actions.is_empty() {
            let total: u64 = s.unknown_actions.values().sum();
            let names: Vec<&str> = s.unknown_actions.keys().map(String::as_str).collect();
            out.push(format!(
                "{total} event(s) with unknown actions were skipped ({})",
                names.join(", ")
            ));
        }
        if s.malformed > 0 {
            out.push(format!(
                "{} malformed trace entr{} skipped; the first: {}",
                s.malformed,
                if s.malformed == 1 {
                    "y was"
                } else {
                    "ies were"
                },
                s.first_malformed.as_deref().unwrap_or("?")
            ));
        }
        if s.unknown_frees > 0 {
            out.push(format!(
                "{} free(s) of addresses not live at the time (allocated before the trace began?)",
                s.unknown_frees
            ));
        }
        out
    }

    /// Fills `unknown_frees`, `allocs_over_live` and `initial_live_bytes` by walking
    /// the events once; every importer calls it last.
    fn tally(&mut self) {
        let mut live: AddrSet = self.initial.iter().map(|b| b.addr).collect();
        let (mut unknown_frees, mut over_live) = (0, 0);
        for event in &self.events {
            let (addr, kind) = (event.addr, event.kind);
            if kind == TraceEventKind::Alloc && !live.insert(addr) {
                over_live += 1;
            } else if kind == TraceEventKind::FreeCompleted && !live.remove(&addr) {
                unknown_frees += 1;
            }
        }
        self.stats.unknown_frees = unknown_frees;
        self.stats.allocs_over_live = over_live;
        self.stats.initial_live_bytes = self.initial.iter().map(|b| b.size).sum();
        self.stats.cache_releases = self.cache_releases();
    }

    /// Each run of `segment_free` entries (`CacheRelease`): one pass over the events,
    /// counting what the traced allocator held from its initial segments on.
    fn cache_releases(&self) -> Vec<CacheRelease> {
        // A gap's put-in events say what changed, not when nor why: none is a release.
        let gaps: &[std::ops::Range<usize>] = self
            .stats
            .kept_oom
            .as_ref()
            .and_then(|k| k.history.as_ref())
            .map_or(&[], |h| &h.gaps);
        let mut reserved: u64 = self.initial_segments.iter().map(|s| s.size).sum();
        let mut out: Vec<CacheRelease> = Vec::new();
        // The last run, while its next segment (or an OOM first) is still to come.
        let mut open = false;
        // The last run, while the entry right after it is still to come.
        let mut unfollowed = false;
        let mut previous = None;
        for (i, event) in self.events.iter().enumerate() {
            if unfollowed
                && !matches!(
                    event.kind,
                    TraceEventKind::SegmentFree | TraceEventKind::Snapshot
                )
            {
                if let Some(last) = out.last_mut() {
                    last.retried = matches!(
                        event.kind,
                        TraceEventKind::SegmentAlloc | TraceEventKind::Oom
                    );
                }
                unfollowed = false;
            }
            match event.kind {
                TraceEventKind::SegmentFree => {
                    let put_in = gaps.iter().any(|g| g.contains(&i));
                    if previous != Some(TraceEventKind::SegmentFree) && !put_in {
                        out.push(CacheRelease {
                            at: i,
                            reserved_before: reserved,
                            next_segment: None,
                            retried: false,
                        });
                        open = true;
                        unfollowed = true;
                    }
                    reserved = reserved.saturating_sub(event.size);
                }
                TraceEventKind::SegmentAlloc => {
                    if open {
                        if let Some(last) = out.last_mut() {
                            last.next_segment = Some(event.size);
                        }
                        open = false;
                    }
                    reserved = reserved.saturating_add(event.size);
                }
                TraceEventKind::Oom => open = false,
                _ => {}
            }
            previous = Some(event.kind);
        }
        out
    }
}

impl TraceStats {
    pub(crate) fn note_malformed(&mut self, what: String) {
        self.malformed += 1;
        self.first_malformed.get_or_insert(what);
    }
}

/// Adds one to `counts[name]`.
pub(crate) fn bump(counts: &mut BTreeMap<String, u64>, name: &str) {
    match counts.get_mut(name) {
        Some(n) => *n += 1,
        None => {
            counts.insert(name.to_string(), 1);
        }
    }
}

/// Raw stream handles (CUDA stream pointers) to small ids, in order of first appearance;
/// a CUDA graph's private pool on a stream to an id of its own, with `GRAPH_POOL` set.
#[derive(Default)]
pub(crate) struct StreamIds {
    ids: HashMap<u64, StreamId>,
    pools: HashMap<(u64, i64, i64), StreamId>,
}

impl StreamIds {
    pub(crate) fn id(&mut self, raw: u64) -> StreamId {
        if raw == 0 {
            return 0;
        }
        let next = StreamId::try_from(self.ids.len() + 1).unwrap_or(StreamId::MAX);
        *self.ids.entry(raw).or_insert(next)
    }

    /// The id of `stream`'s blocks in the pool PyTorch names `pool` (`segment_pool_id`):
    /// the stream's own for the default pool (0, 0), else the private pool's.
    pub(crate) fn in_pool(&mut self, raw: u64, pool: (i64, i64)) -> StreamId {
        if pool == (0, 0) {
            return self.id(raw);
        }
        let next = StreamId::try_from(self.pools.len() + 1).unwrap_or(GRAPH_POOL - 1) | GRAPH_POOL;
        *self.pools.entry((raw, pool.0, pool.1)).or_insert(next)
    }
}

/// How much `load` reads, and which device it picks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Bytes read from the file, and bytes after gunzip.
    pub max_bytes: u64,
    /// PyTorch: the device to read; None picks the first device with a trace.
    pub device: Option<i64>,
    pub pickle_limits: pickle::Limits,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_bytes: 512 << 20,
            device: None,
            pickle_limits: pickle::Limits::default(),
        }
    }
}

/// Reads a trace of any supported format with the default options.
pub fn load(path: &Path) -> Result<Trace, TraceError> {
    load_with(path, &LoadOptions::default())
}

/// Reads a trace file, streaming it: a gzipped pickle is unzipped and unpickled as it is
/// read, never held whole.
pub fn load_with(path: &Path, opts: &LoadOptions) -> Result<Trace, TraceError> {
    let with_path = |kind| TraceError {
        path: Some(path.to_path_buf()),
        kind,
    };
    let file = std::fs::File::open(path).map_err(|e| with_path(TraceErrorKind::Io(e)))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size > opts.max_bytes {
        return Err(with_path(TraceErrorKind::TooLarge {
            limit: opts.max_bytes,
        }));
    }
    parse_reader(BufReader::new(file.take(opts.max_bytes)), opts).map_err(with_path)
}

/// Reads a trace held in memory (the file's bytes, gzipped or not).
pub fn from_bytes(bytes: &[u8], opts: &LoadOptions) -> Result<Trace, TraceError> {
    if bytes.len() as u64 > opts.max_bytes {
        return Err(TraceError {
            path: None,
            kind: TraceErrorKind::TooLarge {
                limit: opts.max_bytes,
            },
        });
    }
    parse_reader(bytes, opts).map_err(|kind| TraceError { path: None, kind })
}

fn read_bounded(mut reader: impl Read, limit: u64) -> Result<Vec<u8>, TraceErrorKind> {
    let mut out = Vec::new();
    (&mut reader)
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(TraceErrorKind::Io)?;
    if out.len() as u64 > limit {
        return Err(TraceErrorKind::TooLarge { limit });
    }
    Ok(out)
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const PICKLE_PROTO: u8 = 0x80;

/// The first bytes of a buffered stream, without consuming them (fewer at its end).
fn peek(reader: &mut impl BufRead, n: usize) -> Result<Vec<u8>, std::io::Error> {
    let buf = reader.fill_buf()?;
    Ok(buf[..buf.len().min(n)].to_vec())
}

fn parse_reader(mut reader: impl BufRead, opts: &LoadOptions) -> Result<Trace, TraceErrorKind> {
    let head = peek(&mut reader, 2).map_err(TraceErrorKind::Io)?;
    if head.is_empty() {
        return Err(TraceErrorKind::Empty);
    }
    if head == GZIP_MAGIC {
        // Unzipped bytes are bounded by max_bytes too: a small bomb stops there.
        let inner = flate2::bufread::MultiGzDecoder::new(reader);
        let mut inner = BufReader::with_capacity(1 << 16, GzipErrors(inner));
        let head = peek(&mut inner, 2).map_err(gzip_error)?;
        if head.is_empty() {
            return Err(TraceErrorKind::Empty);
        }
        if head == GZIP_MAGIC {
            return Err(TraceErrorKind::UnknownFormat);
        }
        return parse_plain(inner, opts).map_err(|e| match e {
            TraceErrorKind::Io(e) => gzip_error(e),
            other => other,
        });
    }
    parse_plain(reader, opts)
}

/// Marks the unzipper's errors so they are told apart from the file's own.
struct GzipErrors<R>(R);

impl<R: Read> Read for GzipErrors<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

fn gzip_error(e: std::io::Error) -> TraceErrorKind {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        TraceErrorKind::GzipTruncated
    } else {
        TraceErrorKind::GzipCorrupt(e.to_string())
    }
}

fn parse_plain(mut reader: impl BufRead, opts: &LoadOptions) -> Result<Trace, TraceErrorKind> {
    let head = peek(&mut reader, 1).map_err(TraceErrorKind::Io)?;
    if head.first() == Some(&PICKLE_PROTO) {
        return pytorch::import_reader(reader, opts);
    }
    let bytes = read_bounded(reader, opts.max_bytes)?;
    parse_text(&bytes)
}

fn parse_text(bytes: &[u8]) -> Result<Trace, TraceErrorKind> {
    if bytes.is_empty() {
        return Err(TraceErrorKind::Empty);
    }
    let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let first_line = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let first_line = String::from_utf8_lossy(first_line);
    if record::is_header(&first_line) {
        let text = std::str::from_utf8(text).map_err(|e| TraceErrorKind::Record {
            line: 1 + text[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count(),
            message: "not UTF-8 text".to_string(),
        })?;
        return record::read(text);
    }
    if rmm::is_header(&first_line) {
        return rmm::import(text);
    }
    if first_line.trim().is_empty() && text.iter().all(u8::is_ascii_whitespace) {
        return Err(TraceErrorKind::Empty);
    }
    Err(TraceErrorKind::UnknownFormat)
}
