//! Replays a `Trace` through one of vramtop's allocator policies over a bookkeeping
//! backing (address ranges, no memory), so policies can be compared on a real workload:
//! peak reserved, fragmentation at that peak, backing calls, time per event. Drives the
//! allocator; knows nothing of the UI or of files.
//!
//! How events are replayed:
//! - Blocks live at the start (a model's parameters) are allocated first, in address
//!   order, before any event: they hold memory the policy has to place around. They are
//!   the trace's own (live at its end, never allocated in it) and the blocks whose first
//!   event is a free (allocated before the trace began, freed during it: a model
//!   deleted at the end), with the size and stream their free gives.
//! - `Alloc` -> `alloc(size, stream, tag or "?")`, keyed by the trace address. An alloc
//!   at an address that is still live frees the earlier block first (`allocs_over_live`).
//! - `FreeCompleted` (the memory is really released) -> `free` of the block allocated
//!   for that address. Frees of addresses not live then (freed twice) are ignored and
//!   counted, and so are frees of blocks whose alloc failed (out of memory under
//!   `--capacity`).
//! - `FreeRequested` is stream-ordered intent: the block stays in use until its
//!   `FreeCompleted`, so it changes nothing here and is only counted. (The allocator's
//!   `free_deferred` would draw the block pending-free, but `process_pending` completes
//!   every pending free at once, not the one the trace completes.)
//! - Segment events, `Oom` and `Snapshot` are counted, not replayed: the policy decides
//!   its own segments, which is the point of the comparison.

mod initial;
pub mod remedies;
pub mod report;
pub mod whatif;

pub use crate::error::ReplayError;
use std::fmt;
use std::time::{Duration, Instant};
use vramtop_alloc::hash::{AddrMap, AddrSet};

use serde::Serialize;

pub use super::ooms::CapacitySource;
pub use report::{table, TraceFigures};
pub use whatif::{what_if, what_if_text, ExpandableWhatIf};

use super::{Trace, TraceEvent, TraceEventKind};
use vramtop_alloc::backing::BookkeepingBacking;
use vramtop_alloc::{AllocConfig, AllocError, Allocator, Block, PolicyKind, Stats};

/// Default backing capacity: large enough that no real trace runs out, so the peak
/// reserved is what the policy would ask for, not what a device allowed.
pub const UNLIMITED_CAPACITY: u64 = 1 << 40;
/// Granularity the trace-only live figures are rounded to (PyTorch rounds to 512 B).
pub const TRACE_ROUNDING: u64 = 512;
/// Tag of events the source gave no call site for.
pub const UNTAGGED: &str = "?";
/// Tag of blocks live at the start that have no call site of their own.
pub const INITIAL_TAG: &str = "live at start";

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayOptions {
    /// Bytes the backing may hold at once; past it, allocs fail and are counted.
    pub capacity: u64,
    /// Where `capacity` came from.
    pub source: CapacitySource,
    /// A remedy tried: this `max_split_size` (bytes) instead of the trace's own.
    pub max_split_size: Option<u64>,
    /// `caching`'s `garbage_collection_threshold`. PyTorch acts on it only under a memory
    /// fraction (then `capacity` stands for the fraction), so the caller decides.
    pub gc_threshold: Option<f64>,
    /// A remedy tried: these `roundup_power2_divisions` instead of the trace's own.
    pub roundup_power2_divisions: Option<[u32; 16]>,
    /// A remedy tried: `torch.cuda.empty_cache()` after each of the job's steps (`steps`:
    /// those the hook marked, `KeptOom::steps_us`, else its rounds), just before the first
    /// allocation that follows it.
    pub empty_cache_at_steps: bool,
    /// Where new segments go. Among free blocks of equal size PyTorch takes the lowest
    /// address, so the order of the addresses CUDA hands out decides between them: the
    /// job's own replay takes the trace's; a remedy's run would have got its own, which
    /// no trace tells, so its verdict must hold under each order.
    pub addresses: AddressOrder,
}

/// Where a replay's new segments go (`ReplayOptions::addresses`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum AddressOrder {
    /// At the trace's own address where the trace made a segment of that size just then
    /// (until a remedy has released segments the job kept), else as `Cuda`.
    #[default]
    Trace,
    /// Where CUDA's driver would put each, as its placement shows in GPU-kept traces: in
    /// 32 MiB ranges, gaps in ranges in use filled first, new ranges going down
    /// (`BookkeepingBacking::like_cuda`).
    Cuda,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            capacity: UNLIMITED_CAPACITY,
            source: CapacitySource::Unlimited,
            max_split_size: None,
            gc_threshold: None,
            roundup_power2_divisions: None,
            empty_cache_at_steps: false,
            addresses: AddressOrder::Trace,
        }
    }
}

/// Where a job's steps begin in its events, and how they were found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Steps {
    /// Each step's first event (`step_boundaries`), sorted, each once.
    pub at: Vec<usize>,
    pub by: StepsBy,
}

/// How a job's steps were found (`Steps::by`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepsBy {
    /// The hook marked them: the job's optimizer steps, or `vramtop.step()`.
    Marks,
    /// The hook saw no step and marked the job's passes through its first model that
    /// follow a backward whose gradients were since released or changed
    /// (`KeptOom::passes_us`).
    Passes,
    /// Neither: the rounds the job's memory in use went in (`rounds::inferred`).
    #[default]
    Rounds,
}

impl Steps {
    /// The hook said where they are (marks or passes), rather than the memory's rounds.
    pub fn marked(&self) -> bool {
        self.by != StepsBy::Rounds
    }
}

/// The job's steps: those the hook marked within the history where there are any, else
/// the passes it marked, else the rounds its memory in use went in, where it went in
/// enough of them.
pub fn steps(trace: &Trace) -> Steps {
    let marks = step_boundaries(trace);
    if !marks.is_empty() {
        return Steps {
            at: marks,
            by: StepsBy::Marks,
        };
    }
    let passes = trace
        .stats
        .kept_oom
        .as_ref()
        .map(|k| boundaries_at(trace, &k.passes_us))
        .unwrap_or_default();
    if !passes.is_empty() {
        return Steps {
            at: passes,
            by: StepsBy::Passes,
        };
    }
    Steps {
        at: crate::rounds::inferred(trace),
        by: StepsBy::Rounds,
    }
}

/// Where the job's marked steps (`KeptOom::steps_us`) fall in its events
/// (`boundaries_at`).
pub fn step_boundaries(trace: &Trace) -> Vec<usize> {
    trace
        .stats
        .kept_oom
        .as_ref()
        .map(|k| boundaries_at(trace, &k.steps_us))
        .unwrap_or_default()
}

/// Where the marks `times` (microseconds, the trace's clock) fall in the job's events: for
/// each, the first request after it, served or refused (a loop frees its gradients
/// between the step and the next batch, so "after the step" is that first request).
/// Sorted, each once.
fn boundaries_at(trace: &Trace, times: &[i64]) -> Vec<usize> {
    let events = &trace.events;
    let Some(first) = events.iter().find_map(|e| e.time_us) else {
        return Vec::new(); // no times to place the steps by
    };
    let mut steps: Vec<i64> = times.iter().copied().filter(|&s| s >= first).collect();
    steps.sort_unstable();
    // One pass: events without a time, or a time a little behind the one before (PyTorch's
    // timestamps are approximate), never move a step back.
    let mut out: Vec<usize> = Vec::new();
    let mut at = 0;
    for step in steps {
        while at < events.len() && events[at].time_us.is_none_or(|t| t <= step) {
            at += 1;
        }
        // The step begins at its first request.
        out.extend(crate::first_request(events, at));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// What the replay did with the trace's events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplayCounts {
    /// Blocks live at the start, allocated before the first event.
    pub initial_blocks: u64,
    /// Of those, the blocks whose first event is a free (allocated before the trace).
    pub initial_from_frees: u64,
    pub allocs: u64,
    pub frees: u64,
    /// `FreeRequested` events: counted, not replayed (see the module docs).
    pub free_requests: u64,
    /// `FreeCompleted` of an address with no live block: ignored.
    pub unknown_frees: u64,
    /// `FreeCompleted` of a block whose alloc ran out of memory: ignored.
    pub frees_after_oom: u64,
    /// `Alloc` at an address still live: the earlier block was freed first.
    pub allocs_over_live: u64,
    /// Allocs (initial blocks included) that failed for want of capacity.
    pub ooms: u64,
    /// The trace's own segment alloc/free/map/unmap events: counted, not replayed.
    pub segment_events: u64,
    /// OOMs the trace itself recorded.
    pub trace_ooms: u64,
    pub snapshots: u64,
}

/// A replay in progress: one policy, stepped event by event (the TUI) or run to the
/// end (the report).
pub struct Replay<'t> {
    trace: &'t Trace,
    allocator: Allocator,
    /// Live blocks by trace address.
    live: AddrMap<Block>,
    /// Trace addresses whose alloc ran out of memory and was not since replaced.
    failed: AddrSet,
    /// Index of the next event to apply.
    next: usize,
    counts: ReplayCounts,
    /// Bytes the allocator holds (after its rounding) for blocks the events allocated.
    held_bytes: u64,
    peak_held_bytes: u64,
    peak_reserved_bytes: u64,
    /// The allocator's stats at the first moment reserved reached its peak.
    stats_at_peak: Option<Stats>,
    /// The trace's own OOMs, each asked of this policy in turn.
    oom_checks: Vec<OomCheck>,
    /// A segment address is hinted to the backing for the next alloc.
    hinted: bool,
    /// The remedy released segments the job kept (`empty_cache_at_steps`): from then on
    /// the trace's segment addresses no longer say where CUDA would put new ones, and
    /// are not hinted.
    hints_stale: bool,
    addresses: AddressOrder,
    /// Event indices before which the cache is emptied (`empty_cache_at_steps`), in
    /// order, and the next of them.
    empty_at: Vec<usize>,
    empty_next: usize,
    /// Event indices where the job emptied the cache itself (`emptied_by_the_job`), in
    /// order, and the next of them: every replay empties it there too.
    job_empties: Vec<usize>,
    job_empty_next: usize,
    /// The job's own settings, no remedy: the replay of what PyTorch did (`check_oom`).
    as_traced: bool,
}

/// Where the job emptied PyTorch's cache itself: the runs of `segment_free` entries
/// (`CacheRelease`) that PyTorch had no reason of its own for: not followed at once by
/// the retry's new segment or an `oom` entry (`CacheRelease::retried`), or the segment it
/// took next fitting beside what it held under the job's own limit (the kept file's, else
/// `capacity`). A run right before an `oom` entry, or right before a segment that would
/// not have fitted, is PyTorch's own release, which a replay makes where it runs short
/// itself. None where the garbage collector was on (its releases look alike).
///
/// A batch-size finder on an H200 (a GPT-2 tried at batch 64, halved at each caught OOM,
/// `empty_cache()` in its `except`) emptied the cache under a tight cap twice with only
/// its own frees after; taken for PyTorch's releases, the replay kept those segments and
/// served the batch-8 request PyTorch refused, and judged nothing.
fn emptied_by_the_job(trace: &Trace, capacity: u64) -> Vec<usize> {
    if trace
        .settings
        .garbage_collection_threshold
        .is_some_and(|t| t > 0.0)
    {
        return Vec::new();
    }
    let limit = trace
        .stats
        .kept_oom
        .as_ref()
        .map(|k| k.device_total_bytes)
        .filter(|&l| l > 0)
        .unwrap_or(capacity);
    trace
        .stats
        .cache_releases
        .iter()
        .filter(|r| {
            !r.retried
                || r.next_segment
                    .is_some_and(|next| r.reserved_before.saturating_add(next) <= limit)
        })
        .map(|r| r.at)
        .collect()
}

/// A trace OOM asked of a policy: would it have failed on the same request?
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OomCheck {
    /// Index of the trace's `oom` event.
    pub event: usize,
    pub requested_bytes: u64,
    /// True when this policy, in the state the replay had reached, could not place it.
    pub fails: bool,
    /// Allocations of the trace that this policy could not place before it got here: a
    /// job run so would have died of one of those first.
    pub failed_before: u64,
    /// What the policy held when asked.
    pub reserved_bytes: u64,
    /// Its largest free run then (inside what it held).
    pub largest_free_bytes: u64,
}

impl fmt::Debug for Replay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("policy", &self.allocator.policy())
            .field("position", &self.next)
            .field("events", &self.trace.events.len())
            .finish_non_exhaustive()
    }
}

impl<'t> Replay<'t> {
    /// A fresh allocator of `policy` with the trace's initial blocks placed.
    pub fn new(
        trace: &'t Trace,
        policy: PolicyKind,
        opts: ReplayOptions,
    ) -> Result<Replay<'t>, ReplayError> {
        let empty_at = if opts.empty_cache_at_steps {
            steps(trace).at
        } else {
            Vec::new()
        };
        Replay::emptying_at(trace, policy, opts, empty_at)
    }

    /// As `new`, with the cache emptied before each of `empty_at` where
    /// `opts.empty_cache_at_steps` (the job's steps, found once by a caller that replays
    /// the trace many times: `steps` reads the whole history).
    pub fn emptying_at(
        trace: &'t Trace,
        policy: PolicyKind,
        opts: ReplayOptions,
        empty_at: Vec<usize>,
    ) -> Result<Replay<'t>, ReplayError> {
        // Both orders place segments as CUDA's driver would; the trace's takes PyTorch's
        // own address where it has one to give (`apply`), and falls back on CUDA's where
        // it has none (a segment the job did not make then, or hints gone stale).
        let backing = BookkeepingBacking::new(opts.capacity).like_cuda();
        // The traced allocator's own settings: `caching` models them (PyTorch's
        // max_split_size_mb and roundup_power2_divisions); the other policies ignore them.
        let config = AllocConfig {
            max_split_size: opts.max_split_size.or(trace.settings.max_split_size),
            roundup_power2_divisions: opts
                .roundup_power2_divisions
                .unwrap_or(trace.settings.roundup_power2_divisions),
            garbage_collection_threshold: opts.gc_threshold,
            clock: false,
            ..AllocConfig::default()
        };
        let mut replay = Replay {
            trace,
            allocator: Allocator::new(policy, Box::new(backing), config),
            live: AddrMap::with_capacity_and_hasher(trace.initial.len() + 4096, Default::default()),
            failed: AddrSet::default(),
            next: 0,
            counts: ReplayCounts::default(),
            held_bytes: 0,
            peak_held_bytes: 0,
            peak_reserved_bytes: 0,
            stats_at_peak: None,
            oom_checks: Vec::new(),
            hinted: false,
            hints_stale: false,
            addresses: opts.addresses,
            empty_at: if opts.empty_cache_at_steps {
                empty_at
            } else {
                Vec::new()
            },
            empty_next: 0,
            job_empties: emptied_by_the_job(trace, opts.capacity),
            job_empty_next: 0,
            as_traced: policy == PolicyKind::Caching
                && opts.max_split_size.is_none()
                && opts.roundup_power2_divisions.is_none()
                && !opts.empty_cache_at_steps
                && opts.gc_threshold == trace.settings.garbage_collection_threshold,
        };
        let adopted = replay.adopt_initial_segments()?;
        // Blocks freed before any alloc in formats whose importer does not infer them
        // (RMM logs, recordings) join the trace's own; the adopted ones are placed.
        let (initial, from_frees) = initial::live_before_trace(trace);
        replay.counts.initial_from_frees = from_frees;
        let initial: Vec<_> = initial
            .iter()
            .filter(|b| !adopted.contains(&b.addr))
            .collect();
        for block in initial {
            let tag = block.tag.as_deref().unwrap_or(INITIAL_TAG);
            match replay.allocator.alloc(block.size, block.stream, tag) {
                Ok(placed) => {
                    replay.counts.initial_blocks += 1;
                    replay.live.insert(block.addr, placed);
                    replay.note_reserved();
                }
                Err(AllocError::OutOfMemory(_)) => {
                    replay.counts.ooms += 1;
                    replay.failed.insert(block.addr);
                }
                Err(error) => return Err(ReplayError { event: None, error }),
            }
        }
        // Initial blocks are not the trace's own: its held figure starts from here.
        replay.held_bytes = 0;
        Ok(replay)
    }

    /// Where the policy can (`caching`), books the segments the traced allocator held
    /// when the trace began, with the blocks live then at their own places: the replay
    /// starts from PyTorch's state, not from a fresh allocator's. Returns the addresses
    /// of the blocks placed so.
    fn adopt_initial_segments(&mut self) -> Result<AddrSet, ReplayError> {
        let mut adopted = AddrSet::default();
        if self.trace.initial_segments.is_empty() || !self.allocator.can_adopt() {
            return Ok(adopted);
        }
        for seg in &self.trace.initial_segments {
            let blocks: Vec<(u64, u64, &str)> = seg
                .blocks
                .iter()
                .map(|b| {
                    let tag = b.tag.as_deref().unwrap_or(INITIAL_TAG);
                    (b.addr - seg.addr, b.size, tag)
                })
                .collect();
            // At PyTorch's own address: equal free blocks are taken lowest address first.
            // (Every order keeps the blocks live then where they were.)
            self.allocator.hint_segment(seg.addr, seg.size);
            let placed = match self
                .allocator
                .adopt_segment(seg.size, seg.pool, seg.stream, &blocks)
            {
                Ok(Some(placed)) => placed,
                // A layout the policy cannot take: its blocks are placed by alloc.
                Ok(None) => continue,
                Err(AllocError::OutOfMemory(_)) => {
                    self.counts.ooms += 1;
                    continue;
                }
                Err(error) => return Err(ReplayError { event: None, error }),
            };
            for (block, placed) in seg.blocks.iter().zip(placed) {
                adopted.insert(block.addr);
                self.live.insert(block.addr, placed);
                self.counts.initial_blocks += 1;
            }
            self.note_reserved();
        }
        Ok(adopted)
    }

    pub fn policy(&self) -> PolicyKind {
        self.allocator.policy()
    }

    pub fn trace(&self) -> &'t Trace {
        self.trace
    }

    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    pub fn counts(&self) -> &ReplayCounts {
        &self.counts
    }

    /// Events applied so far.
    pub fn position(&self) -> usize {
        self.next
    }

    /// Events in the trace.
    pub fn len(&self) -> usize {
        self.trace.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.trace.events.is_empty()
    }

    pub fn is_done(&self) -> bool {
        self.next >= self.trace.events.len()
    }

    /// The event applied last.
    pub fn last_event(&self) -> Option<&'t TraceEvent> {
        self.next
            .checked_sub(1)
            .and_then(|i| self.trace.events.get(i))
    }

    /// Applies the next event; `None` at the end.
    pub fn step(&mut self) -> Result<Option<&'t TraceEvent>, ReplayError> {
        let Some(event) = self.trace.events.get(self.next) else {
            return Ok(None);
        };
        let index = self.next;
        self.next += 1;
        while self
            .job_empties
            .get(self.job_empty_next)
            .is_some_and(|&at| at <= index)
        {
            // As the job did: CUDA's free ranges stay the job's, so hints hold.
            self.job_empty_next += 1;
            self.allocator.empty_cache();
        }
        while self
            .empty_at
            .get(self.empty_next)
            .is_some_and(|&at| at <= index)
        {
            self.empty_next += 1;
            let before = self.allocator.reserved_bytes();
            self.allocator.empty_cache();
            // CUDA's free ranges now differ from the job's: it placed its next segments
            // knowing ranges this run has given back.
            self.hints_stale |= self.allocator.reserved_bytes() < before;
            if self.hints_stale && self.hinted {
                // Given for the alloc this emptying comes just before (its segment_alloc
                // entry precedes it in the trace).
                self.allocator.hint_segment(0, 0);
                self.hinted = false;
            }
        }
        self.apply(event).map_err(|error| ReplayError {
            event: Some(index),
            error,
        })?;
        Ok(Some(event))
    }

    /// Applies events until `position` of them have been applied (forward only; a
    /// position behind the current one changes nothing).
    pub fn run_to(&mut self, position: usize) -> Result<(), ReplayError> {
        let target = position.min(self.trace.events.len());
        while self.next < target {
            self.step()?;
        }
        Ok(())
    }

    fn apply(&mut self, event: &TraceEvent) -> Result<(), AllocError> {
        match event.kind {
            TraceEventKind::Alloc => {
                self.alloc(event)?;
                if self.hinted {
                    // A hint the alloc did not take is not for a later one.
                    self.allocator.hint_segment(0, 0);
                    self.hinted = false;
                }
            }
            TraceEventKind::FreeCompleted => self.free(event.addr)?,
            TraceEventKind::FreeRequested => self.counts.free_requests += 1,
            TraceEventKind::SegmentAlloc => {
                // The segment PyTorch made for the alloc that follows: where the policy
                // makes one too, at the same address, so that address order is PyTorch's.
                self.counts.segment_events += 1;
                if self.addresses == AddressOrder::Trace && !self.hints_stale {
                    self.allocator.hint_segment(event.addr, event.size);
                    self.hinted = true;
                }
            }
            TraceEventKind::SegmentFree
            | TraceEventKind::SegmentMap
            | TraceEventKind::SegmentUnmap => self.counts.segment_events += 1,
            TraceEventKind::Oom => self.check_oom(event)?,
            TraceEventKind::Snapshot => self.counts.snapshots += 1,
        }
        Ok(())
    }

    fn alloc(&mut self, event: &TraceEvent) -> Result<(), AllocError> {
        if self.live.contains_key(&event.addr) {
            self.counts.allocs_over_live += 1;
            self.release(event.addr)?;
        }
        let tag = event.tag.as_deref().unwrap_or(UNTAGGED);
        match self.allocator.alloc(event.size, event.stream, tag) {
            Ok(block) => {
                self.counts.allocs += 1;
                self.failed.remove(&event.addr);
                self.held_bytes += block.size;
                self.peak_held_bytes = self.peak_held_bytes.max(self.held_bytes);
                self.live.insert(event.addr, block);
                self.note_reserved();
                Ok(())
            }
            Err(AllocError::OutOfMemory(_)) => {
                self.counts.ooms += 1;
                self.failed.insert(event.addr);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Asks the policy for what the traced allocator refused, then gives it back (a job
    /// that caught the OOM went on without it). Refused, the policy has released its
    /// cached segments first, as PyTorch's release_cached_blocks did before it raised
    /// (nothing during a graph's capture). Served under a remedy, the job run so did not
    /// run out here, and PyTorch would have released nothing: its cache stays as it was.
    /// (Releasing it whatever the answer gave a remedy that served a job's caught OOMs an
    /// emptied cache at each: a Mask R-CNN whose cuDNN workspaces were refused 240 times
    /// was told GC 0.6 and max_split 128 fit, and PyTorch failed both.) Served by the
    /// job's own settings, the replay has strayed from PyTorch, which did refuse it and
    /// release: it releases too, to stay as near PyTorch's state as it can.
    fn check_oom(&mut self, event: &TraceEvent) -> Result<(), AllocError> {
        self.counts.trace_ooms += 1;
        let index = self.next.saturating_sub(1);
        let stats = self.allocator.stats();
        let fails = match self.allocator.alloc(event.size, event.stream, "trace oom") {
            Ok(block) => {
                self.allocator.free(&block)?;
                false
            }
            Err(AllocError::OutOfMemory(_)) => true,
            Err(e) => return Err(e),
        };
        if !fails && self.as_traced && !vramtop_alloc::in_graph_pool(event.stream) {
            self.allocator.empty_cache();
        }
        self.oom_checks.push(OomCheck {
            event: index,
            requested_bytes: event.size,
            fails,
            failed_before: self.counts.ooms,
            reserved_bytes: stats.reserved_bytes,
            largest_free_bytes: stats.largest_free_bytes,
        });
        Ok(())
    }

    /// The trace's OOMs asked of this policy so far.
    pub fn oom_checks(&self) -> &[OomCheck] {
        &self.oom_checks
    }

    fn free(&mut self, addr: u64) -> Result<(), AllocError> {
        if self.live.contains_key(&addr) {
            self.counts.frees += 1;
            self.release(addr)
        } else {
            if self.failed.remove(&addr) {
                self.counts.frees_after_oom += 1;
            } else {
                self.counts.unknown_frees += 1;
            }
            Ok(())
        }
    }

    fn release(&mut self, addr: u64) -> Result<(), AllocError> {
        let Some(block) = self.live.remove(&addr) else {
            return Ok(());
        };
        self.allocator.free(&block)?;
        // Initial blocks were never counted in `held_bytes`.
        self.held_bytes = self.held_bytes.saturating_sub(block.size);
        Ok(())
    }

    /// Keeps the stats of the moment reserved first reached its peak. Only allocs grow
    /// reserved memory, so this runs after each; full stats are taken only on a new peak.
    fn note_reserved(&mut self) {
        let reserved = self.allocator.reserved_bytes();
        if reserved > self.peak_reserved_bytes {
            self.peak_reserved_bytes = reserved;
            self.stats_at_peak = Some(self.allocator.stats());
        }
    }

    /// The figures of this run so far; `elapsed` is the time spent applying events.
    pub fn run_figures(&self, elapsed: Duration) -> PolicyRun {
        let stats = self.allocator.stats();
        let events = self.next as u64;
        let at_peak = self.stats_at_peak.as_ref().unwrap_or(&stats);
        PolicyRun {
            policy: self.allocator.policy(),
            events,
            peak_held_bytes: self.peak_held_bytes,
            peak_allocated_bytes: stats.peak_allocated_bytes,
            peak_requested_bytes: stats.peak_requested_bytes,
            peak_reserved_bytes: stats.peak_reserved_bytes,
            external_fragmentation_at_peak: at_peak.external_fragmentation,
            largest_free_at_peak_bytes: at_peak.largest_free_bytes,
            ooms: self.counts.ooms,
            backing_calls: stats.backing_calls(),
            ns_per_event: if events == 0 {
                0.0
            } else {
                elapsed.as_nanos() as f64 / events as f64
            },
            counts: self.counts,
            oom_checks: self.oom_checks.clone(),
        }
    }
}

/// What one policy did with a whole trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyRun {
    pub policy: PolicyKind,
    pub events: u64,
    /// Peak of the bytes the allocator held (after this policy's rounding) for blocks
    /// the trace's events allocated; blocks live at the start are left out.
    pub peak_held_bytes: u64,
    /// The allocator's peak of allocated bytes, blocks live at the start included.
    pub peak_allocated_bytes: u64,
    /// The allocator's peak of requested bytes, blocks live at the start included.
    pub peak_requested_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// External fragmentation (1 - largest free / total free) when reserved peaked.
    pub external_fragmentation_at_peak: f64,
    pub largest_free_at_peak_bytes: u64,
    pub ooms: u64,
    /// Segment allocs/frees and page maps/unmaps the policy asked of the backing.
    pub backing_calls: u64,
    /// Wall time of the event loop divided by the events.
    pub ns_per_event: f64,
    pub counts: ReplayCounts,
    pub oom_checks: Vec<OomCheck>,
}

/// Replays the whole trace through `policy`, timing the event loop.
pub fn replay(
    trace: &Trace,
    policy: PolicyKind,
    opts: ReplayOptions,
) -> Result<PolicyRun, ReplayError> {
    finish(Replay::new(trace, policy, opts)?)
}

/// `replay` with the job's steps already found (`Replay::emptying_at`).
pub(crate) fn replay_emptying_at(
    trace: &Trace,
    policy: PolicyKind,
    opts: ReplayOptions,
    empty_at: &[usize],
) -> Result<PolicyRun, ReplayError> {
    finish(Replay::emptying_at(trace, policy, opts, empty_at.to_vec())?)
}

/// Every event of `run` replayed, and its figures.
fn finish(mut run: Replay<'_>) -> Result<PolicyRun, ReplayError> {
    let start = Instant::now();
    while run.step()?.is_some() {}
    let elapsed = start.elapsed();
    Ok(run.run_figures(elapsed))
}

/// One report row: a policy's run beside the trace's own figures. Field names are the
/// JSON keys of `vramtop replay --report --json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayReport {
    pub policy: PolicyKind,
    pub events: u64,
    /// Peak of live bytes over the trace's own events, sizes rounded up to 512 B, blocks
    /// live at the start left out: the trace-only figure (`Trace::live_bytes_peak`),
    /// the same for every policy. The allocator's own figures follow.
    pub peak_live_bytes: u64,
    /// As `peak_live_bytes`, with the blocks live at the start counted.
    pub peak_live_bytes_with_initial: u64,
    pub peak_held_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_requested_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Peak reserved / `peak_live_bytes_with_initial`: both count the blocks live at the
    /// start, which occupy reserved memory too. `None` when nothing was live.
    pub reserved_over_live: Option<f64>,
    pub external_fragmentation_at_peak: f64,
    pub largest_free_at_peak_bytes: u64,
    pub ooms: u64,
    pub backing_calls: u64,
    pub ns_per_event: f64,
    /// PyTorch snapshots: the sum of segment sizes when the snapshot was taken.
    pub trace_reserved_at_end_bytes: Option<u64>,
    /// PyTorch snapshots: the peak of the trace's own reserved bytes (segments at the
    /// start, plus segment_alloc/map, minus segment_free/unmap).
    pub trace_reserved_peak_bytes: Option<u64>,
    /// `peak_reserved_bytes / trace_reserved_peak_bytes`: how near the policy lands to
    /// what the traced allocator reserved.
    pub reserved_vs_trace: Option<f64>,
    /// The capacity the replay ran under, and where it came from.
    pub capacity_bytes: Option<u64>,
    pub capacity_source: CapacitySource,
    /// The trace's own OOMs, each asked of this policy: does it fail on the same request?
    pub trace_ooms: Vec<OomCheck>,
    pub counts: ReplayCounts,
}

impl ReplayReport {
    pub fn new(run: &PolicyRun, trace: &TraceFigures, opts: ReplayOptions) -> Self {
        let ratio = |num: u64, den: u64| (den > 0).then(|| num as f64 / den as f64);
        ReplayReport {
            policy: run.policy,
            events: run.events,
            peak_live_bytes: trace.live_peak_bytes,
            peak_live_bytes_with_initial: trace.live_peak_with_initial_bytes,
            peak_held_bytes: run.peak_held_bytes,
            peak_allocated_bytes: run.peak_allocated_bytes,
            peak_requested_bytes: run.peak_requested_bytes,
            peak_reserved_bytes: run.peak_reserved_bytes,
            reserved_over_live: ratio(run.peak_reserved_bytes, trace.live_peak_with_initial_bytes),
            external_fragmentation_at_peak: run.external_fragmentation_at_peak,
            largest_free_at_peak_bytes: run.largest_free_at_peak_bytes,
            ooms: run.ooms,
            backing_calls: run.backing_calls,
            ns_per_event: run.ns_per_event,
            trace_reserved_at_end_bytes: trace.reserved_at_end_bytes,
            trace_reserved_peak_bytes: trace.reserved_peak_bytes,
            reserved_vs_trace: trace
                .reserved_peak_bytes
                .and_then(|peak| ratio(run.peak_reserved_bytes, peak)),
            capacity_bytes: (opts.source != CapacitySource::Unlimited).then_some(opts.capacity),
            capacity_source: opts.source,
            trace_ooms: run.oom_checks.clone(),
            counts: run.counts,
        }
    }
}

/// Replays the trace through each policy, on a thread each (the policies share nothing
/// but the trace): one report row per policy, in the order asked.
pub fn report(
    trace: &Trace,
    policies: &[PolicyKind],
    opts: ReplayOptions,
) -> Result<Vec<ReplayReport>, ReplayError> {
    let figures = TraceFigures::of(trace);
    let runs: Vec<Result<PolicyRun, ReplayError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = policies
            .iter()
            .map(|&policy| scope.spawn(move || replay(trace, policy, opts)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ReplayError {
                        event: None,
                        error: AllocError::Backing("a replay thread panicked".to_string()),
                    })
                })
            })
            .collect()
    });
    runs.into_iter()
        .map(|run| run.map(|run| ReplayReport::new(&run, &figures, opts)))
        .collect()
}

/// The capacity to replay under: the one given, else the cap the hook kept at the job's
/// OOM (`remedies::kept_cap`), else the one the trace's OOMs show
/// (`ooms::inferred_capacity`; `ooms` is `ooms::trace_ooms(trace)`, which callers also
/// show), else none.
pub fn plan_capacity(
    trace: &Trace,
    given: Option<u64>,
    ooms: &[super::ooms::TraceOom],
) -> ReplayOptions {
    if let Some(capacity) = given {
        return ReplayOptions {
            capacity,
            source: CapacitySource::Given,
            max_split_size: None,
            gc_threshold: None,
            roundup_power2_divisions: None,
            empty_cache_at_steps: false,
            addresses: AddressOrder::Trace,
        };
    }
    // The cap the job ran under, where the hook kept it, as the remedies are judged
    // (`remedies::capacity_bounds`): the capacity inferred from the trace may be less, and
    // a replay there could fail a request the remedies serve (a SegFormer under 16 GiB:
    // "pytorch-expandable fails too" at 15.3 GiB above "expandable_segments:True: fits",
    // which PyTorch bore out).
    if let Some(capacity) = remedies::kept_cap(trace) {
        return ReplayOptions {
            capacity,
            source: CapacitySource::Kept,
            ..ReplayOptions::default()
        };
    }
    match super::ooms::inferred_capacity(trace, ooms) {
        Some(capacity) if capacity > 0 => ReplayOptions {
            capacity,
            source: CapacitySource::Inferred,
            max_split_size: None,
            gc_threshold: None,
            roundup_power2_divisions: None,
            empty_cache_at_steps: false,
            addresses: AddressOrder::Trace,
        },
        _ => ReplayOptions::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LiveAtStart, TraceFormat};

    const MIB: u64 = 1 << 20;

    fn event(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent {
            tag: Some("t.py:1 f".into()),
            ..TraceEvent::bare(kind, addr, size)
        }
    }

    fn trace(initial: Vec<LiveAtStart>, events: Vec<TraceEvent>) -> Trace {
        Trace {
            source: TraceFormat::VramtopRecord,
            ..Trace::bare(initial, events)
        }
    }

    use TraceEventKind::*;

    #[test]
    fn allocs_and_completed_frees_are_replayed_requests_are_not() {
        let t = trace(
            vec![LiveAtStart {
                addr: 0x9000,
                size: 3 * MIB,
                stream: 0,
                tag: None,
            }],
            vec![
                event(Alloc, 0x1000, 4 * MIB),
                event(FreeRequested, 0x1000, 4 * MIB),
                event(Alloc, 0x2000, 1000),
                event(FreeCompleted, 0x1000, 4 * MIB),
                event(FreeCompleted, 0x5555, 512),
                event(SegmentAlloc, 0x1000, 20 * MIB),
                event(Snapshot, 0, 0),
            ],
        );
        let mut r = Replay::new(&t, PolicyKind::BestFit, ReplayOptions::default()).unwrap();
        // The trace's initial block, and 0x5555, first seen being freed: allocated
        // before the trace began.
        assert_eq!(r.allocator().stats().live_blocks, 2);
        r.run_to(2).unwrap();
        // The free was only requested: the block is still held.
        assert_eq!(r.allocator().stats().allocated_bytes, 7 * MIB + 512);
        r.run_to(usize::MAX).unwrap();
        assert!(r.is_done());
        let c = *r.counts();
        assert_eq!((c.initial_blocks, c.initial_from_frees), (2, 1));
        assert_eq!((c.allocs, c.frees), (2, 2));
        assert_eq!((c.free_requests, c.unknown_frees), (1, 0));
        assert_eq!((c.segment_events, c.snapshots), (1, 1));
        let stats = r.allocator().stats();
        assert_eq!(stats.allocated_bytes, 3 * MIB + 1024);
        let fig = r.run_figures(Duration::from_micros(7));
        assert_eq!(fig.peak_held_bytes, 4 * MIB + 1024);
        assert_eq!(fig.peak_allocated_bytes, 7 * MIB + 1024 + 512);
        assert!((fig.ns_per_event - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn a_capacity_counts_ooms_and_ignores_their_frees() {
        // first-fit grows in segments of at least 20 MiB: room for one 16 MiB block.
        let t = trace(
            Vec::new(),
            vec![
                event(Alloc, 0x1000, 16 * MIB),
                event(Alloc, 0x2000, 16 * MIB),
                event(FreeCompleted, 0x2000, 16 * MIB),
                event(FreeCompleted, 0x1000, 16 * MIB),
                event(Alloc, 0x2000, 16 * MIB),
            ],
        );
        let opts = ReplayOptions {
            capacity: 30 * MIB,
            source: CapacitySource::Given,
            max_split_size: None,
            gc_threshold: None,
            roundup_power2_divisions: None,
            empty_cache_at_steps: false,
            addresses: AddressOrder::Trace,
        };
        let run = replay(&t, PolicyKind::FirstFit, opts).unwrap();
        assert_eq!(run.ooms, 1);
        assert_eq!(run.counts.frees_after_oom, 1);
        assert_eq!(run.counts.unknown_frees, 0);
        assert_eq!(run.counts.allocs, 2);
        assert!(run.peak_reserved_bytes <= 30 * MIB);
    }

    /// A 100 MiB segment given back with nothing to make room for (the next, 60 MiB, fits
    /// beside it under the cap): the job called `empty_cache()` (`torch.cuda.graph` does,
    /// before each capture), and every replay empties the cache there, so the 60 MiB
    /// block gets a segment of its own. Under a cap the next would not have fitted
    /// beside, it is PyTorch's own release, and the replay keeps the cached segment until
    /// it runs short itself.
    #[test]
    fn the_jobs_own_empty_cache_is_replayed_and_pytorchs_own_release_is_not() {
        let events = vec![
            event(SegmentAlloc, 0x1000_0000, 100 * MIB),
            event(Alloc, 0x1000_0000, 100 * MIB),
            event(FreeCompleted, 0x1000_0000, 100 * MIB),
            event(SegmentFree, 0x1000_0000, 100 * MIB),
            event(SegmentAlloc, 0x2000_0000, 60 * MIB),
            event(Alloc, 0x2000_0000, 60 * MIB),
        ];
        for (cap, held) in [(300 * MIB, 60 * MIB), (150 * MIB, 100 * MIB)] {
            let mut t = trace(Vec::new(), events.clone());
            t.tally();
            let opts = ReplayOptions {
                capacity: cap,
                source: CapacitySource::Given,
                ..ReplayOptions::default()
            };
            let mut r = Replay::new(&t, PolicyKind::Caching, opts).unwrap();
            r.run_to(usize::MAX).unwrap();
            assert_eq!(r.allocator().stats().reserved_bytes, held, "cap {cap}");
        }
    }

    /// Under a cap the next segment would not have fitted beside, a release PyTorch made
    /// itself is followed at once by the retry's segment; one followed by the job's own
    /// frees came from the job (`empty_cache()` in a batch-size finder's `except`), and
    /// the replay empties the cache there too: the 60 MiB block then gets a segment of
    /// its own (20 + 60 MiB held) instead of a piece of the cached 100 MiB one (120).
    #[test]
    fn a_release_the_jobs_frees_follow_is_the_jobs_even_under_a_tight_cap() {
        let release = [
            event(SegmentAlloc, 0x3000_0000, 20 * MIB),
            event(Alloc, 0x3000_0000, 4 * MIB),
            event(SegmentAlloc, 0x1000_0000, 100 * MIB),
            event(Alloc, 0x1000_0000, 100 * MIB),
            event(FreeCompleted, 0x1000_0000, 100 * MIB),
            event(SegmentFree, 0x1000_0000, 100 * MIB),
        ];
        let free_small = event(FreeCompleted, 0x3000_0000, 4 * MIB);
        let big = [
            event(SegmentAlloc, 0x2000_0000, 60 * MIB),
            event(Alloc, 0x2000_0000, 60 * MIB),
        ];
        let jobs = [&release[..], std::slice::from_ref(&free_small), &big[..]].concat();
        let pytorchs = [&release[..], &big[..], &[free_small]].concat();
        for (events, held, retried) in [(jobs, 80 * MIB, false), (pytorchs, 120 * MIB, true)] {
            let mut t = trace(Vec::new(), events);
            t.tally();
            assert_eq!(t.stats.cache_releases.len(), 1);
            assert_eq!(t.stats.cache_releases[0].retried, retried);
            let opts = ReplayOptions {
                capacity: 150 * MIB,
                source: CapacitySource::Given,
                ..ReplayOptions::default()
            };
            let mut r = Replay::new(&t, PolicyKind::Caching, opts).unwrap();
            r.run_to(usize::MAX).unwrap();
            assert_eq!(
                r.allocator().stats().reserved_bytes,
                held,
                "retried {retried}"
            );
        }
    }

    #[test]
    fn an_alloc_over_a_live_address_replaces_the_block() {
        let t = trace(
            Vec::new(),
            vec![event(Alloc, 0x1000, 512), event(Alloc, 0x1000, 1024)],
        );
        let run = replay(&t, PolicyKind::Tlsf, ReplayOptions::default()).unwrap();
        assert_eq!(run.counts.allocs_over_live, 1);
        assert_eq!(run.peak_held_bytes, 1024);
    }

    #[test]
    fn fragmentation_is_taken_when_reserved_peaks() {
        // Caching: 20 MiB large segment, filled with 4 MiB blocks, every other one freed,
        // then a 12 MiB request needs a new segment: reserved peaks with holes open.
        let mut events = Vec::new();
        for i in 0..5 {
            events.push(event(Alloc, 0x1000 * (i + 1), 4 * MIB));
        }
        for i in [0, 2] {
            events.push(event(FreeCompleted, 0x1000 * (i + 1), 4 * MIB));
        }
        events.push(event(Alloc, 0x9_0000, 12 * MIB));
        events.push(event(FreeCompleted, 0x9_0000, 12 * MIB));
        let t = trace(Vec::new(), events);
        let figures = TraceFigures::of(&t);
        let rows = report(&t, &PolicyKind::ALL, ReplayOptions::default()).unwrap();
        assert_eq!(rows.len(), PolicyKind::ALL.len());
        // PyTorch's expandable segments: the 4 MiB holes cannot take 12 MiB, so the
        // segment grows by a whole 20 MiB page past the five blocks' first page.
        let pytorch = rows
            .iter()
            .find(|r| r.policy == PolicyKind::PytorchExpandable);
        assert_eq!(pytorch.map(|r| r.peak_reserved_bytes), Some(40 * MIB));
        let caching = &rows[0];
        assert_eq!(caching.policy, PolicyKind::Caching);
        assert_eq!(caching.peak_reserved_bytes, 32 * MIB);
        assert_eq!(caching.largest_free_at_peak_bytes, 4 * MIB);
        assert!((caching.external_fragmentation_at_peak - 0.5).abs() < 1e-9);
        for row in &rows {
            assert_eq!(row.peak_live_bytes, figures.live_peak_bytes);
            assert_eq!(row.events, 9);
            assert!(row.peak_reserved_bytes >= 20 * MIB, "{row:?}");
        }
    }

    #[test]
    fn a_step_whose_first_request_was_refused_begins_at_the_oom() {
        use TraceEventKind::*;
        let timed = |kind, t: i64| TraceEvent {
            time_us: Some(t),
            ..event(kind, 1, MIB)
        };
        let mut t = trace(
            Vec::new(),
            vec![
                timed(Alloc, 100),
                timed(FreeCompleted, 200),
                timed(Oom, 300),
            ],
        );
        t.stats.kept_oom = Some(crate::KeptOom {
            steps_us: vec![250],
            ..Default::default()
        });
        assert_eq!(step_boundaries(&t), vec![2]);
    }

    #[test]
    fn the_passes_stand_for_steps_only_where_none_is_marked() {
        use TraceEventKind::*;
        let timed = |kind, addr, t: i64| TraceEvent {
            time_us: Some(t),
            ..event(kind, addr, MIB)
        };
        let mut t = trace(
            Vec::new(),
            vec![
                timed(Alloc, 1, 100),
                timed(FreeCompleted, 1, 200),
                timed(Alloc, 2, 300),
                timed(FreeCompleted, 2, 400),
                timed(Alloc, 3, 500),
            ],
        );
        t.stats.kept_oom = Some(crate::KeptOom {
            passes_us: vec![250, 450],
            ..Default::default()
        });
        let found = steps(&t);
        assert_eq!(
            (found.at.as_slice(), found.by),
            (&[2, 4][..], StepsBy::Passes)
        );
        assert!(found.marked());
        // One optimizer step marked in the history: the marks alone say where steps are.
        t.stats.kept_oom.as_mut().unwrap().steps_us = vec![450];
        let found = steps(&t);
        assert_eq!((found.at.as_slice(), found.by), (&[4][..], StepsBy::Marks));
    }

    #[test]
    fn a_step_falls_before_the_first_allocation_after_it() {
        use TraceEventKind::*;
        // Block 3 (4 MiB) takes a large segment; block 1 (1 MiB) a small one, cached
        // once freed unless the cache is emptied.
        let timed = |kind, addr, t: i64| TraceEvent {
            time_us: Some(t),
            ..event(kind, addr, if addr == 3 { 4 * MIB } else { MIB })
        };
        let mut t = trace(
            Vec::new(),
            vec![
                timed(Alloc, 1, 100),         // 0
                timed(FreeCompleted, 1, 200), // 1: the step at 250 is after it
                timed(FreeCompleted, 2, 260), // 2: zero_grad's frees
                timed(Alloc, 3, 255),         // 3: a time a little behind: still after
                timed(Alloc, 4, 400),         // 4
            ],
        );
        t.stats.kept_oom = Some(crate::KeptOom {
            // One before the history began, two in it, one past its end.
            steps_us: vec![50, 250, 390, 900],
            ..Default::default()
        });
        assert_eq!(step_boundaries(&t), vec![3, 4]);
        // Emptied there, the cache holds nothing of the first block when the next comes.
        let opts = ReplayOptions {
            empty_cache_at_steps: true,
            ..ReplayOptions::default()
        };
        let mut r = Replay::new(&t, PolicyKind::Caching, opts).unwrap();
        r.run_to(3).unwrap();
        assert!(r.allocator().reserved_bytes() > 0, "cached until the step");
        r.run_to(4).unwrap();
        assert_eq!(
            r.allocator().reserved_bytes(),
            20 * MIB,
            "only the new block's segment"
        );
        let mut kept = Replay::new(&t, PolicyKind::Caching, ReplayOptions::default()).unwrap();
        kept.run_to(4).unwrap();
        assert_eq!(
            kept.allocator().reserved_bytes(),
            22 * MIB,
            "without: the cache stays"
        );
    }

    #[test]
    fn the_traces_addresses_are_not_hinted_once_an_emptied_cache_gave_back_the_jobs_segments() {
        // Block 1 gets the job's segment at S1; at the step (250) the emptied cache gives
        // S1 back when block 1 was freed before it, which the job never did. The job's
        // next segment (S2) was placed by CUDA knowing S1 still held: not hinted then.
        const S1: u64 = 0x7f10_0000_0000;
        const S2: u64 = 0x7f20_0000_0000;
        let timed = |kind, addr, size, t: i64| TraceEvent {
            time_us: Some(t),
            ..event(kind, addr, size)
        };
        let segment_of_block_2 = |freed_before_the_step: bool| {
            let mut events = vec![
                timed(SegmentAlloc, S1, 20 * MIB, 100),
                timed(Alloc, S1, 4 * MIB, 100),
            ];
            if freed_before_the_step {
                events.push(timed(FreeCompleted, S1, 4 * MIB, 200));
            }
            events.push(timed(SegmentAlloc, S2, 18 * MIB, 300)); // its size rounded to 2 MiB
            events.push(timed(Alloc, S2, 16 * MIB + 1, 300));
            let mut t = trace(Vec::new(), events);
            t.stats.kept_oom = Some(crate::KeptOom {
                steps_us: vec![250],
                ..Default::default()
            });
            let opts = ReplayOptions {
                empty_cache_at_steps: true,
                ..ReplayOptions::default()
            };
            let mut r = Replay::new(&t, PolicyKind::Caching, opts).unwrap();
            r.run_to(t.events.len()).unwrap();
            let layout = r.allocator().layout();
            let addrs: Vec<u64> = layout.segments.iter().map(|s| s.addr).collect();
            (addrs.contains(&S1), addrs.contains(&S2))
        };
        // Nothing given back: both segments where the job had them.
        assert_eq!(segment_of_block_2(false), (true, true));
        // S1 given back at the step: block 2's segment goes elsewhere (top-down).
        assert_eq!(segment_of_block_2(true), (false, false));
    }

    #[test]
    fn an_empty_trace_replays_to_zeroes() {
        let t = trace(Vec::new(), Vec::new());
        let run = replay(&t, PolicyKind::Expandable, ReplayOptions::default()).unwrap();
        assert_eq!(
            (run.events, run.peak_reserved_bytes, run.ns_per_event),
            (0, 0, 0.0)
        );
    }
}
