//! What `--once --json` and `vramtop attach --json` say of a hooked job: plain data,
//! built from a `JobView`.

use serde::Serialize;

use super::job::{ExpandableVerdict, JobView};
use super::protocol::{AllocatorSettings, ErrorReport, TorchStats, UntrackedOom};
use vramtop_alloc::leaks::Suspect;
use vramtop_alloc::remedy::{RemedyVerdict, WhatWouldFit};
use vramtop_trace::cause::CauseReport;
use vramtop_trace::roles::RoleBreakdown;

/// The version of the shape of `vramtop attach --json`'s lines (its `schema`;
/// docs/json.md): bumped when a field of a line or of a `JobReport` is removed, renamed or
/// changes type or meaning, not when one is added.
pub const ATTACH_SCHEMA: u32 = 1;

/// The `attached` entry of `--once --json` and `vramtop attach --json`.
#[derive(Clone, Debug, Serialize)]
pub struct JobReport {
    pub pid: u32,
    pub ppid: Option<u32>,
    /// The launcher's `RANK`, `LOCAL_RANK` and `WORLD_SIZE` (torchrun); null when unset.
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// A launcher (torchrun): hooked, never initialised CUDA, parent of hooked ranks; the
    /// job's parent, on no GPU. Only known beside the other jobs (`JobReport::of_all`).
    pub launcher: bool,
    pub argv: Vec<String>,
    pub torch_version: Option<String>,
    pub hook_version: Option<String>,
    pub cuda_ready: bool,
    pub history: bool,
    /// The share of allocations whose sites were recorded at the last state (see
    /// PROTOCOL.md, `history_share`); null without history.
    pub history_share: Option<f64>,
    pub missing: Vec<String>,
    /// PyTorch's allocator backend (`native`, `cudaMallocAsync`); null from older hooks.
    pub allocator_backend: Option<String>,
    pub connected: bool,
    pub ended: bool,
    pub exit_code: Option<i64>,
    pub last_drop: Option<String>,
    pub states: u64,
    pub device: Option<i64>,
    /// The hook's `memory_stats()` figures, as PyTorch counts them.
    pub stats: Option<TorchStats>,
    pub settings: Option<AllocatorSettings>,
    pub segments: usize,
    pub blocks: u64,
    /// Read off the segments, as the block map shows them.
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub free_runs: u64,
    pub largest_free_bytes: u64,
    pub external_fragmentation: f64,
    pub truncated: bool,
    pub last_oom: Option<OomJson>,
    pub last_error: Option<ErrorReport>,
    /// The latest OOM under a backend that tracks no blocks, caught or not (hook 1.11).
    pub last_untracked_oom: Option<UntrackedOom>,
    pub leak_suspects: Vec<Suspect>,
    /// The sites holding most now (with history), largest first.
    pub top_sites: Vec<SiteJson>,
    /// What the memory is for (hook 1.4): parameters, gradients, optimizer state, the
    /// allocated bytes no role claims (activations, temporaries), and the cache; null
    /// where the hook found no model or optimizer.
    pub roles: Option<RoleBreakdown>,
}

/// Sites listed in JSON.
const TOP_SITES: usize = 5;

#[derive(Clone, Debug, Serialize)]
pub struct SiteJson {
    pub site: String,
    pub live_bytes: u64,
    pub live_blocks: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct OomJson {
    pub time_s: f64,
    pub line: String,
    pub requested_bytes: u64,
    pub rounded_bytes: u64,
    pub free_bytes: u64,
    pub free_runs: u64,
    pub largest_free_bytes: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    pub expandable: ExpandableVerdict,
    pub expandable_line: String,
    /// Every remedy with `fits`, `fails` or `cannot_tell` and why.
    pub remedies: Vec<RemedyVerdict>,
    /// The remedies come from replaying this many of the job's own events (the hook's
    /// event ring held its whole history); null: from the one state at the OOM.
    pub history_events: Option<usize>,
    pub what_would_fit: WhatWouldFit,
    pub pytorch_summary: Option<String>,
    /// The first cause's line: why it happened; null when the figures say nothing.
    pub cause: Option<String>,
    /// Every cause that applies, the most bytes first (`kind`, its figures, `line`).
    pub causes: Vec<CauseReport>,
    /// What the memory was for at the OOM, as `roles` above.
    pub roles: Option<RoleBreakdown>,
    /// For an OOM a smaller job would settle: what each knob would give back (halving
    /// the batch is an estimate and says so; the rest are measured roles).
    pub knobs: Option<String>,
}

impl JobReport {
    /// Every job's report, launchers marked as such.
    pub fn of_all(views: &[JobView]) -> Vec<Self> {
        views
            .iter()
            .map(|view| JobReport {
                launcher: super::ranks::is_launcher(views, view.pid),
                ..JobReport::of(view)
            })
            .collect()
    }

    pub fn of(view: &JobView) -> Self {
        let hello = view.hello.as_ref();
        let frame = view.frame.as_deref();
        let stats = frame.map(|f| &f.map.stats);
        JobReport {
            pid: view.pid,
            ppid: hello.and_then(|h| h.ppid),
            rank: view.rank(),
            local_rank: view.local_rank(),
            world_size: view.world_size(),
            launcher: false,
            argv: hello.map(|h| h.argv.clone()).unwrap_or_default(),
            torch_version: hello.and_then(|h| h.torch_version.clone()),
            hook_version: hello.map(|h| h.hook_version.clone()),
            cuda_ready: hello.is_some_and(|h| h.cuda_ready) || frame.is_some(),
            history: hello.is_some_and(|h| h.history),
            history_share: frame.and_then(|f| f.history_share),
            missing: hello.map(|h| h.missing.clone()).unwrap_or_default(),
            allocator_backend: view.allocator_backend().map(str::to_string),
            connected: view.connected,
            ended: view.ended,
            exit_code: view.exit_code,
            last_drop: view.last_drop.clone(),
            states: view.states,
            device: frame.map(|f| f.device),
            stats: frame.and_then(|f| f.torch.clone()),
            settings: frame.map(|f| f.settings.clone()),
            segments: frame.map_or(0, |f| f.map.layout.segments.len()),
            blocks: stats.map_or(0, |s| s.live_blocks),
            reserved_bytes: stats.map_or(0, |s| s.reserved_bytes),
            allocated_bytes: stats.map_or(0, |s| s.allocated_bytes),
            free_bytes: stats.map_or(0, |s| s.total_free_bytes),
            free_runs: stats.map_or(0, |s| s.free_runs),
            largest_free_bytes: stats.map_or(0, |s| s.largest_free_bytes),
            external_fragmentation: stats.map_or(0.0, |s| s.external_fragmentation),
            truncated: frame.is_some_and(|f| f.truncated),
            last_oom: view.oom.as_deref().map(|o| OomJson {
                time_s: o.time_s,
                line: o.line(),
                requested_bytes: o.report.requested_bytes,
                rounded_bytes: o.report.rounded_bytes,
                free_bytes: o.report.total_free_bytes,
                free_runs: o.report.free_runs,
                largest_free_bytes: o.report.largest_free_bytes,
                reserved_bytes: o.map.stats.reserved_bytes,
                allocated_bytes: o.map.stats.allocated_bytes,
                device_free_bytes: o.device_free_bytes,
                device_total_bytes: o.device_total_bytes,
                expandable: o.expandable.clone(),
                expandable_line: o.expandable_line(),
                remedies: o.remedies.clone(),
                history_events: o.history_events,
                what_would_fit: o.what_would_fit.clone(),
                pytorch_summary: o.summary.clone(),
                cause: o.causes.first().map(|c| c.line()),
                causes: CauseReport::of_all(&o.causes),
                roles: o.roles,
                knobs: o.knobs_line(),
            }),
            last_error: view.error.clone(),
            last_untracked_oom: view.untracked_oom.clone(),
            leak_suspects: view.suspects.clone(),
            top_sites: view
                .sites
                .iter()
                .filter(|s| s.live_bytes > 0)
                .take(TOP_SITES)
                .map(|s| SiteJson {
                    site: s.tag.clone(),
                    live_bytes: s.live_bytes,
                    live_blocks: s.live_blocks,
                })
                .collect(),
            roles: frame.and_then(|f| f.roles),
        }
    }
}
