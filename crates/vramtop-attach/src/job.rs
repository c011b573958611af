//! One hooked job as vramtop keeps it: its last state drawn as a block map (through the
//! snapshot viewer's layout code: the hook's segments become `SnapshotSegment`s), its
//! fragmentation history, its last OOM explained the way a probe's is, what PyTorch
//! said, leak suspects by allocation site, and whether it has ended.

use std::sync::Arc;

use vramtop_alloc::remedy::{self, JobSettings, OomScene, Remedy, RemedyVerdict, WhatWouldFit};
pub use vramtop_alloc::remedy::{expandable_would_fit, Answer, ExpandableVerdict};

use super::protocol::{
    AllocatorSettings, Bye, ErrorReport, Hello, HookSegment, JobState, OomState, TorchStats,
    UntrackedOom,
};
use vramtop_alloc::leaks::{DetectorConfig, LeakDetector, SiteTrend, Suspect};
use vramtop_alloc::metrics::layout_stats;
use vramtop_alloc::{human_bytes, round_size, BlockState, MapView, OomReport, Pool, Stats};
use vramtop_trace::cause::{self, Cause, OomFacts};
use vramtop_trace::replay::remedies::{open_inside_accumulating, OomRemedies};
use vramtop_trace::roles::RoleBreakdown;
use vramtop_trace::{snapshot, SnapshotBlock, SnapshotSegment};

/// PyTorch's own caching allocator, the one backend that tracks blocks and segments.
pub const NATIVE_BACKEND: &str = "native";

/// Fragmentation samples kept per job (five minutes at 1 s).
pub const FRAG_HISTORY: usize = 300;
/// Seconds of states per leak window, and the fewest states a window holds: a site is a
/// suspect when its floor (the least it held in a window) rose across the detector's
/// windows, and a floor of one sample would follow every transient tensor.
pub const LEAK_WINDOW_S: f64 = 1.0;
pub const LEAK_WINDOW_MIN_STATES: u64 = 2;

/// The hook's segments as the snapshot importer would have read them.
pub fn snapshot_segments(segments: &[HookSegment]) -> Vec<SnapshotSegment> {
    segments
        .iter()
        .map(|s| SnapshotSegment {
            addr: s.address,
            total_size: s.total_size,
            stream: u32::try_from(s.stream).unwrap_or(u32::MAX),
            pool: if s.segment_type == "small" {
                Pool::Small
            } else {
                Pool::Large
            },
            is_expandable: s.is_expandable,
            blocks: s
                .blocks
                .iter()
                .map(|b| SnapshotBlock {
                    addr: b.address,
                    size: b.size,
                    requested_size: b.requested_size,
                    state: match b.state.as_str() {
                        "active_allocated" => BlockState::Allocated,
                        "active_pending_free" => BlockState::PendingFree,
                        _ => BlockState::Free,
                    },
                    tag: b.site.as_deref().map(Into::into),
                })
                .collect(),
        })
        .collect()
}

/// The fragmentation panel's counters, which come from PyTorch, not from the layout:
/// its OOMs and retries, and the last OOM the job had (then at least one OOM, whatever
/// PyTorch's counter said when it was read).
fn count_ooms(stats: &mut Stats, torch: Option<&TorchStats>, last: Option<&OomReport>) {
    let counted = torch.and_then(|t| t.num_ooms).unwrap_or(0);
    stats.ooms = counted.max(u64::from(last.is_some()));
    stats.retries = torch.and_then(|t| t.num_alloc_retries).unwrap_or(0);
    stats.last_oom = last.cloned();
}

/// A block map of the hook's segments, with its stats.
pub fn map_of(segments: &[HookSegment]) -> MapView {
    let layout = snapshot::layout_of(&snapshot_segments(segments));
    MapView {
        stats: layout_stats(&layout),
        layout,
        frag_history: Vec::new(),
    }
}

/// Live bytes and blocks per allocation site (blocks without a site are left out).
pub fn site_usage(segments: &[HookSegment]) -> Vec<(String, u64, u64)> {
    let mut usage: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for block in segments.iter().flat_map(|s| &s.blocks) {
        if block.state != "active_allocated" {
            continue;
        }
        if let Some(site) = &block.site {
            let entry = usage.entry(site.as_str()).or_default();
            entry.0 = entry.0.saturating_add(block.size);
            entry.1 += 1;
        }
    }
    usage
        .into_iter()
        .map(|(site, (bytes, blocks))| (site.to_string(), bytes, blocks))
        .collect()
}

/// `argv` without a leading `python3` and with the program's path cut to its file name:
/// `/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 2 train.py` reads
/// `torchrun --nproc-per-node 2 train.py`.
pub fn short_command(argv: &[String]) -> String {
    let name = |a: &String| {
        std::path::Path::new(a)
            .file_name()
            .map_or_else(|| a.clone(), |n| n.to_string_lossy().into_owned())
    };
    let mut args = argv.iter().peekable();
    if argv.len() > 1 && args.peek().is_some_and(|a| name(a).starts_with("python")) {
        args.next();
        // `python -m torch.distributed.run`: the module is the program.
        while args
            .peek()
            .is_some_and(|a| a.starts_with('-') && *a != "-m")
        {
            args.next();
        }
        if args.peek().is_some_and(|a| *a == "-m") {
            args.next();
        }
    }
    let mut words: Vec<String> = Vec::new();
    if let Some(program) = args.next() {
        words.push(name(program));
    }
    words.extend(args.cloned());
    words.join(" ")
}

/// One `state`, converted off the UI task.
#[derive(Clone, Debug)]
pub struct JobFrame {
    pub seq: u64,
    pub time_s: f64,
    pub device: i64,
    pub device_uuid: Option<String>,
    pub torch: Option<TorchStats>,
    pub settings: AllocatorSettings,
    pub truncated: bool,
    pub collect_ms: Option<f64>,
    pub history_share: Option<f64>,
    pub map: MapView,
    pub site_usage: Vec<(String, u64, u64)>,
    /// When the segments behind `map` were read (the state's own time, unless the hook
    /// sent stats only: then the last state's that had segments).
    pub map_time_s: f64,
    /// What the memory is for, beside PyTorch's own figures of the same state.
    pub roles: Option<RoleBreakdown>,
}

impl JobFrame {
    pub fn from_state(state: &JobState) -> Self {
        JobFrame {
            seq: state.seq,
            time_s: state.time_s,
            device: state.device,
            device_uuid: state.device_uuid.clone(),
            torch: state.stats.clone(),
            settings: state.settings.clone(),
            truncated: state.truncated,
            collect_ms: state.collect_ms,
            history_share: state.history_share,
            map: map_of(&state.segments),
            site_usage: site_usage(&state.segments),
            map_time_s: state.time_s,
            roles: state.roles.as_ref().and_then(|roles| {
                let stats = state.stats.as_ref()?;
                Some(RoleBreakdown::of(
                    roles,
                    stats.allocated_bytes?,
                    stats.reserved_bytes?,
                ))
            }),
        }
    }
}

/// An `oom` explained as vramtop explains a probe's: the same `OomReport` line.
#[derive(Clone, Debug)]
pub struct OomExplained {
    pub time_s: f64,
    pub device: i64,
    pub device_uuid: Option<String>,
    pub report: OomReport,
    pub expandable: ExpandableVerdict,
    /// Every remedy's verdict: from the job's whole history when `history_events` is
    /// set, else from this one state (`expandable` among them).
    pub remedies: Vec<RemedyVerdict>,
    /// The remedies come from replaying this many of the job's own events (the hook's
    /// event ring held its whole history); None: from the one state at the OOM.
    pub history_events: Option<usize>,
    pub what_would_fit: WhatWouldFit,
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    pub torch: Option<TorchStats>,
    pub truncated: bool,
    /// PyTorch's own figures in its words, when the hook caught them.
    pub summary: Option<String>,
    pub map: MapView,
    /// Why it happened, the cause accounting for most bytes first (see `cause`).
    pub causes: Vec<Cause>,
    /// What the memory was for at the OOM (hook 1.4), beside the segments' figures.
    pub roles: Option<RoleBreakdown>,
    /// The free memory split between CUDA graphs' private pools and the job's own cache,
    /// where the kept file's segments name pools.
    pub graph_pools: Option<cause::GraphPoolSplit>,
}

impl OomExplained {
    pub fn from_oom(oom: &OomState) -> Self {
        let map = map_of(&oom.segments);
        let stats = &map.stats;
        // PyTorch rounds a request up to 512 B; that block had to be contiguous.
        let rounded = round_size(oom.requested_bytes).unwrap_or(oom.requested_bytes);
        let report = OomReport {
            requested_bytes: oom.requested_bytes,
            rounded_bytes: rounded,
            total_free_bytes: stats.total_free_bytes,
            largest_free_bytes: stats.largest_free_bytes,
            free_runs: stats.free_runs,
            reserved_bytes: stats.reserved_bytes,
            capacity_bytes: oom.device_total_bytes.unwrap_or(0),
            stream: 0,
        };
        // Room to grow: up to the allowed maximum (the per-process cap when one is set)
        // and no further than the device has free. Unknown figures count as no room.
        let headroom = match (oom.device_free_bytes, oom.device_total_bytes) {
            (Some(free), Some(allowed)) => free.min(allowed.saturating_sub(stats.reserved_bytes)),
            _ => 0,
        };
        let settings = JobSettings {
            // The segments say so even where the hook could not read the settings.
            expandable_segments: oom.settings.expandable_segments == Some(true)
                || oom.segments.iter().any(|s| s.is_expandable),
            max_split_size: oom.settings.max_split_size,
            garbage_collection_threshold: oom.settings.garbage_collection_threshold,
        };
        let scene = OomScene {
            layout: &map.layout,
            needed: rounded,
            headroom,
            capped: capped(oom.device_free_bytes, rounded),
            settings,
            released_bytes: None,
        };
        let expandable = remedy::expandable(&scene);
        let what_would_fit = remedy::what_would_fit(&scene);
        // The file the hook kept at this OOM: its history decides the remedies when the
        // ring held all of it, and names the sites a leak left.
        let kept = kept_trace(oom);
        let whole_history = kept
            .as_ref()
            .filter(|_| oom.ring.is_some_and(|ring| ring.complete));
        // The step cut short, as the replay measured it for the verdicts (`step_rest`).
        let (remedies, history_events, step) = match whole_history.and_then(history_remedies) {
            Some((at, events)) => (at.remedies, Some(events), at.step),
            None => {
                // Inside a first step accumulating gradients, as the replay leaves it.
                let micro = kept
                    .as_ref()
                    .and_then(|t| t.stats.kept_oom.as_ref())
                    .filter(|k| k.steps_us.is_empty() && k.passes_us.is_empty())
                    .map_or(0, |k| k.accumulating);
                let one = remedy::one_state(&scene, &expandable);
                (open_inside_accumulating(one, micro), None, None)
            }
        };
        let remedy_that_fits = remedies
            .iter()
            .find(|r| r.verdict == remedy::Verdict::Fits)
            .map(|r| r.remedy.clone());
        // Only where the job's history was replayed: one state's verdicts replay nothing.
        let no_setting_fits = history_events.is_some() && remedy::none_fits(&remedies);
        // PyTorch's own totals where the hook sent them: the segments on the wire may have
        // been cut to fit a frame, the kept file's never are.
        let torch = oom.stats.as_ref();
        // The kept file's segments name CUDA graphs' pools; the wire's do not. Its last
        // `oom` entry names the pool the request was asked of, where it was one's.
        let split = kept.as_ref().and_then(|t| {
            let asked = t
                .events
                .iter()
                .rev()
                .find(|e| e.kind == vramtop_trace::TraceEventKind::Oom)
                .map_or(0, |e| e.stream);
            cause::GraphPoolSplit::of(&t.segments_at_end, asked)
        });
        let facts = OomFacts {
            time_s: oom.time_s,
            requested_bytes: rounded,
            allocated_bytes: torch
                .and_then(|t| t.allocated_bytes)
                .unwrap_or(stats.allocated_bytes),
            reserved_bytes: torch
                .and_then(|t| t.reserved_bytes)
                .unwrap_or(stats.reserved_bytes),
            free_runs: split.map_or(stats.free_runs, |s| s.own_free_runs),
            largest_free_bytes: split
                .map_or(stats.largest_free_bytes, |s| s.own_largest_free_bytes),
            graph_pool_free_bytes: split.map_or(0, |s| s.pool_free_bytes),
            graph_pools: split.map_or(0, |s| s.pools),
            asked_pool: split.and_then(|s| s.asked_pool),
            device_free_bytes: oom.device_free_bytes,
            limit_bytes: oom.device_total_bytes,
            physical_total_bytes: oom.physical_total_bytes,
            processes: oom.gpu_processes.as_ref(),
            series: oom.series.as_ref(),
            step_series: oom.step_series.as_ref(),
            remedy_that_fits,
            no_setting_fits,
            leak_sites: kept.as_ref().map_or_else(Vec::new, cause::leak_sites),
            steps_us: kept
                .as_ref()
                .and_then(|t| t.stats.kept_oom.as_ref())
                .map_or(&[][..], |k| &k.steps_us[..]),
            history_recorded: kept.as_ref().is_some_and(cause::sites_recorded),
            step,
        };
        let causes = cause::causes(&facts);
        let roles = oom
            .roles
            .as_ref()
            .map(|r| RoleBreakdown::of(r, stats.allocated_bytes, stats.reserved_bytes));
        // The map drawn after the job ended is this state: its panel counts this OOM as
        // the live frames' panel does.
        let mut map = map;
        count_ooms(&mut map.stats, oom.stats.as_ref(), Some(&report));
        OomExplained {
            time_s: oom.time_s,
            device: oom.device,
            device_uuid: oom.device_uuid.clone(),
            report,
            expandable,
            remedies,
            history_events,
            what_would_fit,
            device_free_bytes: oom.device_free_bytes,
            device_total_bytes: oom.device_total_bytes,
            torch: oom.stats.clone(),
            truncated: oom.truncated,
            summary: oom.summary.clone(),
            roles,
            map,
            causes,
            graph_pools: split,
        }
    }

    /// "knobs: 1.1 GiB short; would give back: ..." when a smaller job would settle it
    /// (its cap, too big) and the roles are known.
    pub fn knobs_line(&self) -> Option<String> {
        let shortfall = self.causes.iter().find_map(Cause::shortfall)?;
        self.roles?.knobs_line(shortfall, self.report.rounded_bytes)
    }

    /// "cause: another process held 59.9 GiB of this GPU: ..." for the first cause, and
    /// "also: ..." for each other; empty when the figures say nothing.
    pub fn cause_lines(&self) -> Vec<String> {
        self.causes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let head = if i == 0 { "cause" } else { "also" };
                format!("{head}: {}", c.line())
            })
            .collect()
    }

    /// "needed 1.0 GiB contiguous; 4.3 GiB free in 306 runs, largest 6.0 MiB"; where
    /// graphs' pools held memory, the job's own runs, and the pools' bytes after.
    pub fn line(&self) -> String {
        match &self.graph_pools {
            Some(split) => split.oom_line(self.report.rounded_bytes),
            None => self.report.to_string(),
        }
    }

    /// What `expandable_segments:True` would have done, in one line with its reason: the
    /// history's verdict when the remedies come from it, else this one state's.
    pub fn expandable_line(&self) -> String {
        let from_history = self
            .remedies
            .iter()
            .find(|r| r.remedy == Remedy::ExpandableSegments)
            .filter(|_| self.history_events.is_some());
        match from_history {
            Some(r) => r.line(),
            None => self.expandable.line(),
        }
    }
}

/// The remedies from the job's whole history, when the hook's event ring held all of it:
/// the file it kept at this OOM replayed under each remedy, by the same function
/// `vramtop replay` answers that file with. Runs on the connection's reader thread (a
/// ring of 8,192 events replays in milliseconds). None, and the one-state answers, when
/// there is no such file or it cannot be read: the OOM is still explained.
fn history_remedies(trace: &vramtop_trace::Trace) -> Option<(OomRemedies, usize)> {
    if !trace.stats.kept_oom.as_ref()?.ring_complete {
        return None;
    }
    let ooms = vramtop_trace::ooms::trace_ooms(trace);
    let last = ooms.last()?.event;
    let answers = vramtop_trace::replay::remedies::remedies(trace, &ooms, None).ok()?;
    let at = answers.into_iter().find(|r| r.event == last)?;
    // A file that turned out not to hold the whole history got one-state answers there.
    let events = trace.events.len();
    at.from_history.then_some((at, events))
}

/// The file the hook kept at this OOM, read for its device; None when there is none, it
/// cannot be read, or it is a later OOM's (after its third the hook rewrites one file).
fn kept_trace(oom: &OomState) -> Option<vramtop_trace::Trace> {
    let bytes = read_kept_file(std::path::Path::new(oom.kept_path.as_deref()?))?;
    let opts = vramtop_trace::LoadOptions {
        device: Some(oom.device),
        ..Default::default()
    };
    let trace = vramtop_trace::from_bytes(&bytes, &opts).ok()?;
    let kept = trace.stats.kept_oom.as_ref()?;
    ((kept.time_us - (oom.time_s * 1e6) as i64).abs() <= 1).then_some(trace)
}

/// Most bytes read of a kept file (the hook caps them at 64 MiB unless told otherwise).
const KEPT_FILE_MAX: u64 = 256 << 20;

/// The bytes of a file the hook kept (`oom_files`): named as it names them, a regular file
/// once opened, not through a link, never blocking (a FIFO put in its place would hang
/// this reader), at most KEPT_FILE_MAX.
fn read_kept_file(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name()?.to_str()?;
    if !(name.starts_with("vramtop-oom-") && name.ends_with(".pickle")) {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > KEPT_FILE_MAX {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(KEPT_FILE_MAX).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The driver had room for the request's new segment, so a per-process memory fraction
/// stopped it (unknown free memory counts as no cap).
pub fn capped(device_free: Option<u64>, needed: u64) -> bool {
    device_free.is_some_and(|free| free >= vramtop_alloc::segment_size_for(needed))
}

/// Per-site leak watch over an attached job's states.
#[derive(Debug)]
struct LeakWatch {
    detector: LeakDetector,
    states_per_window: u64,
    states: u64,
}

impl LeakWatch {
    fn new(interval_s: f64) -> Self {
        LeakWatch {
            detector: LeakDetector::new(DetectorConfig::default()),
            states_per_window: ((LEAK_WINDOW_S / interval_s.max(0.01)).ceil() as u64)
                .max(LEAK_WINDOW_MIN_STATES),
            states: 0,
        }
    }

    fn observe(&mut self, usage: &[(String, u64, u64)]) {
        let window = self.states / self.states_per_window + 1;
        self.states += 1;
        let samples: Vec<(&str, u64, u64)> = usage
            .iter()
            .map(|(site, bytes, blocks)| (site.as_str(), *bytes, *blocks))
            .collect();
        self.detector.observe(window, &samples);
    }
}

/// One job's figures as a row shows them (see `JobView::figures`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JobFigures {
    /// The CUDA device the hook watches.
    pub device: i64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub largest_free_bytes: u64,
    /// 1 - largest free run / free bytes, over the job's segments (0..1).
    pub external_fragmentation: f64,
    /// OOMs PyTorch counted (`num_ooms`); at least 1 once one was seen.
    pub ooms: u64,
    /// Allocation sites flagged as growing step after step.
    pub leak_suspects: usize,
}

/// What the screen and JSON show of one job; cheap to clone (the maps are shared).
#[derive(Clone, Debug, Default)]
pub struct JobView {
    pub pid: u32,
    pub hello: Option<Hello>,
    /// A viewer connection is up now.
    pub connected: bool,
    /// The job has exited (said bye, or its process is gone).
    pub ended: bool,
    pub exit_code: Option<i64>,
    /// Why the last connection was dropped, in one line.
    pub last_drop: Option<String>,
    /// The last message skipped for a bad field.
    pub last_skip: Option<String>,
    pub frame: Option<Arc<JobFrame>>,
    pub oom: Option<Arc<OomExplained>>,
    pub error: Option<ErrorReport>,
    /// The job's latest OOM under a backend that tracks no blocks (hook 1.11), caught
    /// or not.
    pub untracked_oom: Option<UntrackedOom>,
    pub suspects: Vec<Suspect>,
    pub sites: Vec<SiteTrend>,
    /// States taken in.
    pub states: u64,
}

impl JobView {
    /// The block map on screen: the last state, with its fragmentation history; once a
    /// job that ran out of memory has ended, the state at its OOM (what the hook sent
    /// before the exception unwound), not what was left after it.
    pub fn map(&self) -> Option<&MapView> {
        if let Some(oom) = self.oom.as_ref().filter(|_| self.ended) {
            return Some(&oom.map);
        }
        self.frame.as_ref().map(|f| &f.map)
    }

    /// The map on screen is the state at the job's OOM (see `map`).
    pub fn map_is_the_oom(&self) -> bool {
        self.ended && self.oom.is_some()
    }

    /// PyTorch runs another allocator than its own (`backend:cudaMallocAsync`: CUDA's
    /// pool holds the memory; or a pluggable one): it tracks no blocks or segments (so no
    /// map, no history, no OOM state), and the native allocator's settings do not apply.
    /// The hook sends its totals only.
    pub fn blocks_untracked(&self) -> bool {
        self.allocator_backend()
            .is_some_and(|backend| backend != NATIVE_BACKEND)
    }

    /// The OOM of a job under `backend:cudaMallocAsync`, read from PyTorch's message (the
    /// hook has no observer there): the one it died of, else its latest (hook 1.11 sees
    /// those it catches); `None` for any other job or error.
    pub fn async_oom(&self) -> Option<crate::async_oom::AsyncOom> {
        if !self.blocks_untracked() {
            return None;
        }
        let parse = crate::async_oom::AsyncOom::parse;
        // The OOM shown: the latest seen, where the job did not die of it (its number and
        // its figures alike), else the one it died of.
        match self.untracked_oom_went_on() {
            Some((oom, _)) => parse(&oom.message),
            None => parse(&self.error.as_ref()?.message),
        }
    }

    /// The latest OOM under a backend that tracks no blocks, where it is not the one the
    /// job died of: PyTorch's words and its number in the process, and whether it was
    /// caught: only once the job has ended with exit code 0 (while it runs, the exception
    /// may still be unwinding towards the job's end; a launcher that exits on it without
    /// Python's excepthook, as `mp.spawn`'s workers do, leaves it unmarked).
    pub fn untracked_oom_went_on(&self) -> Option<(&UntrackedOom, bool)> {
        let oom = self.untracked_oom.as_ref()?;
        let died_of_it = self.error.as_ref().is_some_and(|e| {
            e.oom_number == Some(oom.number) || (e.oom_number.is_none() && e.message == oom.message)
        });
        (!died_of_it).then_some((oom, self.ended && self.exit_code == Some(0)))
    }

    /// PyTorch's own totals (allocated, reserved) from the last state, as shown: "?" where
    /// it did not say (a pluggable allocator refuses them). What a job whose blocks are
    /// untracked shows, where a map's figures would read 0.
    pub fn torch_totals_shown(&self) -> (String, String) {
        let torch = self.frame.as_deref().and_then(|f| f.torch.as_ref());
        let shown = |v: Option<u64>| v.map_or_else(|| "?".to_string(), human_bytes);
        (
            shown(torch.and_then(|t| t.allocated_bytes)),
            shown(torch.and_then(|t| t.reserved_bytes)),
        )
    }

    /// PyTorch's allocator backend as the hook read it (`native`, `cudaMallocAsync`).
    pub fn allocator_backend(&self) -> Option<&str> {
        self.hello.as_ref()?.allocator_backend.as_deref()
    }

    /// The launcher's rank (torchrun's `RANK`), when a launcher started this process.
    pub fn rank(&self) -> Option<u32> {
        self.hello.as_ref().and_then(|h| h.rank)
    }

    pub fn local_rank(&self) -> Option<u32> {
        self.hello.as_ref().and_then(|h| h.local_rank)
    }

    pub fn world_size(&self) -> Option<u32> {
        self.hello.as_ref().and_then(|h| h.world_size)
    }

    /// The parent pid the hook reported.
    pub fn ppid(&self) -> Option<u32> {
        self.hello.as_ref().and_then(|h| h.ppid)
    }

    /// The job has initialised CUDA (a launcher such as torchrun never does).
    pub fn cuda_ready(&self) -> bool {
        self.hello.as_ref().is_some_and(|h| h.cuda_ready)
    }

    /// What one row says of the job (the ranks' overview, `attach`'s lines, `serve`'s
    /// series): one function, so every place agrees. None before the first state.
    pub fn figures(&self) -> Option<JobFigures> {
        let frame = self.frame.as_ref()?;
        let stats = &frame.map.stats;
        let torch = frame.torch.clone().unwrap_or_default();
        Some(JobFigures {
            device: frame.device,
            // PyTorch's own counts (memory_reserved / memory_allocated) where the hook
            // sent them; the segments say the same unless the state was truncated.
            reserved_bytes: torch.reserved_bytes.unwrap_or(stats.reserved_bytes),
            allocated_bytes: torch.allocated_bytes.unwrap_or(stats.allocated_bytes),
            largest_free_bytes: stats.largest_free_bytes,
            external_fragmentation: stats.external_fragmentation,
            // Under cudaMallocAsync PyTorch counts none (`num_ooms` stays 0): the hook's
            // numbered OOMs there (hook 1.11).
            ooms: torch
                .num_ooms
                .unwrap_or(0)
                .max(u64::from(self.oom.is_some()))
                .max(self.untracked_oom.as_ref().map_or(0, |o| o.number)),
            leak_suspects: self.suspects.len(),
        })
    }

    /// The script the job runs: the first argument ending in `.py`, else the program's
    /// file name ("train.py" for `python -u train.py --lr 1`).
    pub fn script(&self) -> Option<String> {
        let argv = &self.hello.as_ref()?.argv;
        let script = argv.iter().find(|a| a.ends_with(".py")).or(argv.first())?;
        let name = std::path::Path::new(script).file_name()?.to_string_lossy();
        Some(name.into_owned())
    }

    /// "python train.py" from the hello's argv.
    pub fn command(&self) -> Option<String> {
        self.hello
            .as_ref()
            .filter(|h| !h.argv.is_empty())
            .map(|h| h.argv.join(" "))
    }
}

/// A job and its bookkeeping: what the attacher updates as messages arrive.
#[derive(Debug)]
pub struct AttachedJob {
    pub view: JobView,
    /// The state before `view.frame`: what the job held before another's OOM when its
    /// latest state came after it (states and OOMs arrive on separate connections).
    previous_frame: Option<Arc<JobFrame>>,
    leaks: LeakWatch,
    frag_history: std::collections::VecDeque<u64>,
}

impl AttachedJob {
    pub fn new(pid: u32, interval_s: f64) -> Self {
        AttachedJob {
            view: JobView {
                pid,
                ..JobView::default()
            },
            previous_frame: None,
            leaks: LeakWatch::new(interval_s),
            frag_history: Default::default(),
        }
    }

    pub fn on_hello(&mut self, hello: Hello) {
        self.view.connected = true;
        self.view.last_drop = None;
        self.view.hello = Some(hello);
    }

    pub fn on_frame(&mut self, mut frame: JobFrame) {
        let permille = (frame.map.stats.external_fragmentation * 1000.0).round() as u64;
        if self.frag_history.len() == FRAG_HISTORY {
            self.frag_history.pop_front();
        }
        self.frag_history.push_back(permille);
        frame.map.frag_history = self.frag_history.iter().copied().collect();
        let last = self.view.oom.as_ref().map(|o| &o.report);
        count_ooms(&mut frame.map.stats, frame.torch.as_ref(), last);
        self.leaks.observe(&frame.site_usage);
        self.view.suspects = self.leaks.detector.suspects();
        self.view.sites = self.leaks.detector.sites();
        self.view.states += 1;
        self.previous_frame = self.view.frame.replace(Arc::new(frame));
    }

    /// The latest state taken at or before `time_s`, of the last two.
    pub fn frame_at(&self, time_s: f64) -> Option<&Arc<JobFrame>> {
        [self.view.frame.as_ref(), self.previous_frame.as_ref()]
            .into_iter()
            .flatten()
            .find(|f| f.time_s <= time_s)
    }

    pub fn on_oom(&mut self, oom: OomExplained) {
        if let Some(frame) = &self.view.frame {
            // The map on screen says it too, until the next state does.
            let mut frame = JobFrame::clone(frame);
            let torch = frame.torch.clone();
            count_ooms(&mut frame.map.stats, torch.as_ref(), Some(&oom.report));
            self.view.frame = Some(Arc::new(frame));
        }
        self.view.oom = Some(Arc::new(oom));
    }

    pub fn on_error(&mut self, error: ErrorReport) {
        self.view.error = Some(error);
    }

    pub fn on_untracked_oom(&mut self, oom: UntrackedOom) {
        self.view.untracked_oom = Some(oom);
    }

    pub fn on_bye(&mut self, bye: Bye) {
        self.view.ended = true;
        self.view.exit_code = bye.exit_code;
    }

    pub fn on_skipped(&mut self, why: String) {
        self.view.last_skip = Some(why);
    }

    /// The connection ended: a job that said bye, or whose process is gone, has ended;
    /// otherwise the reason is kept and the next scan reconnects.
    pub fn on_dropped(&mut self, reason: String, process_alive: bool) {
        self.view.connected = false;
        if !process_alive {
            self.view.ended = true;
        }
        if !self.view.ended {
            self.view.last_drop = Some(reason);
        }
    }

    pub fn set_exit_code(&mut self, code: i64) {
        self.view.ended = true;
        self.view.exit_code = Some(code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{AllocatorSettings, HookBlock};

    const MIB: u64 = 1 << 20;

    #[test]
    fn only_regular_files_named_as_the_hook_names_them_are_read() {
        let dir = std::env::temp_dir().join(format!("vramtop-kept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("vramtop-oom-7-1.pickle");
        std::fs::write(&good, b"data").unwrap();
        assert_eq!(super::read_kept_file(&good).as_deref(), Some(&b"data"[..]));
        let misnamed = dir.join("notes.pickle");
        std::fs::write(&misnamed, b"data").unwrap();
        assert_eq!(super::read_kept_file(&misnamed), None);
        // A FIFO in its place would block a plain open for ever.
        let fifo = dir.join("vramtop-oom-7-2.pickle");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(super::read_kept_file(&fifo), None);
        // So would a link to one.
        let link = dir.join("vramtop-oom-7-3.pickle");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert_eq!(super::read_kept_file(&link), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn block(address: u64, size: u64, state: &str, site: Option<&str>) -> HookBlock {
        HookBlock {
            address,
            size,
            requested_size: size,
            state: state.into(),
            site: site.map(str::to_string),
        }
    }

    /// A 20 MiB segment holding 6 MiB tensors at 0 and 12 MiB, free at 6 and 18.
    fn checker_segment(base: u64) -> HookSegment {
        HookSegment {
            address: base,
            total_size: 20 * MIB,
            stream: 0,
            segment_type: "large".into(),
            is_expandable: false,
            blocks: vec![
                block(base, 6 * MIB, "active_allocated", Some("t.py:9 f")),
                block(base + 6 * MIB, 6 * MIB, "inactive", None),
                block(
                    base + 12 * MIB,
                    6 * MIB,
                    "active_allocated",
                    Some("t.py:9 f"),
                ),
                block(base + 18 * MIB, 2 * MIB, "inactive", None),
            ],
        }
    }

    /// 16 MiB asked at `time_s` on a device with nothing free (80 GiB), no history.
    fn device_full_oom(time_s: f64, segments: Vec<HookSegment>) -> OomState {
        OomState {
            time_s,
            device: 0,
            requested_bytes: 16 * MIB,
            device_free_bytes: Some(0),
            device_total_bytes: Some(80 << 30),
            stats: None,
            segments,
            truncated: false,
            summary: None,
            settings: AllocatorSettings::default(),
            ring: None,
            kept_path: None,
            device_uuid: None,
            ..Default::default()
        }
    }

    #[test]
    fn an_oom_is_explained_like_a_probe_and_expandable_would_fit() {
        let segments: Vec<HookSegment> = (0..4)
            .map(|i| checker_segment(0x7f00_0000_0000 + i * 20 * MIB))
            .collect();
        let oom = device_full_oom(1.0, segments);
        let explained = OomExplained::from_oom(&oom);
        // Every remedy, in the order users are told to try them: the device itself was
        // full (0 B free), so the GC threshold, which needs a memory fraction, cannot help.
        let names: Vec<String> = explained
            .remedies
            .iter()
            .map(|r| r.remedy.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "expandable_segments:True",
                "max_split_size_mb:N",
                "garbage_collection_threshold:0.6",
                "empty_cache()",
                "empty_cache() between steps"
            ]
        );
        use vramtop_alloc::remedy::Verdict;
        let verdicts: Vec<Verdict> = explained.remedies.iter().map(|r| r.verdict).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::CannotTell,
                Verdict::CannotTell,
                Verdict::Fails,
                Verdict::Fails,
                Verdict::CannotTell
            ]
        );
        assert!(explained.remedies[2].reason.contains("memory_fraction"));
        // Nothing fits for sure: the largest free run is the largest request that fits,
        // and the two live 6 MiB blocks of one segment stand between its holes and the
        // 16 MiB asked (no window of a 20 MiB segment holds less).
        let would = &explained.what_would_fit;
        assert_eq!(would.largest_request_bytes, 6 * MIB);
        let way = would.in_the_way.as_ref().expect("blocks in the way");
        assert_eq!((way.blocks, way.bytes), (2, 12 * MIB));
        // 6 MiB and 2 MiB holes are separate runs: 4 segments x 2 runs, 32 MiB in all.
        assert_eq!(
            explained.line(),
            "needed 16.0 MiB contiguous; 32.0 MiB free in 8 runs, largest 6.0 MiB"
        );
        // 4 live blocks (6 + 6 MiB in each 20 MiB segment): packed tight 48 MiB, and 16 MiB
        // more in an 80 MiB budget fits; each on pages of its own (2 x 20 MiB apiece) would
        // not: one state cannot tell.
        let v = &explained.expandable;
        assert_eq!(v.answer, Answer::CannotTell, "{v:?}");
        assert!(!v.would_fit);
        assert!(explained
            .expandable_line()
            .contains("cannot tell: one state does not settle it"));
        // No flag is offered: --history records stacks, which decide no remedy.
        assert!(!explained.expandable_line().contains("--history"));
        // Over the budget even packed tight: a firm no.
        let too_big = expandable_would_fit(&explained.map.layout, 40 * MIB, 0, false);
        assert_eq!(too_big.answer, Answer::DoesNotFit);
        // Room for every tensor on pages of its own: a firm yes.
        let roomy = expandable_would_fit(&explained.map.layout, 16 * MIB, 1 << 30, false);
        assert_eq!(roomy.answer, Answer::Fits, "{roomy:?}");
        assert!(roomy.would_fit);
        // Already on: PyTorch released its free pages and retried before raising.
        let on = expandable_would_fit(&explained.map.layout, 16 * MIB, 1 << 30, true);
        assert_eq!(on.answer, Answer::DoesNotFit);
        let on_line = OomExplained {
            expandable: on,
            ..explained.clone()
        }
        .expandable_line();
        assert!(on_line.contains("already on"), "{on_line}");
    }

    #[test]
    fn sites_feed_the_leak_detector() {
        let mut job = AttachedJob::new(7, 1.0);
        for step in 1..=12u64 {
            // One more live 1 MiB block at the leaking site each state.
            let mut leaking = checker_segment(0x2000_0000);
            leaking.blocks = (0..step)
                .map(|i| {
                    let addr = 0x2000_0000 + i * MIB;
                    block(addr, MIB, "active_allocated", Some("leak.py:12 step"))
                })
                .collect();
            let state = JobState {
                seq: step,
                device_uuid: None,
                time_s: step as f64,
                device: 0,
                stats: None,
                settings: AllocatorSettings::default(),
                segments: vec![checker_segment(0x1000_0000), leaking],
                segments_omitted: false,
                truncated: false,
                collect_ms: None,
                history_share: None,
                roles: None,
            };
            job.on_frame(JobFrame::from_state(&state));
        }
        let tags: Vec<&str> = job.view.suspects.iter().map(|s| s.tag.as_str()).collect();
        assert_eq!(tags, vec!["leak.py:12 step"]);
        assert_eq!(job.view.map().map(|m| m.frag_history.len()), Some(12));
    }

    #[test]
    fn once_the_job_ended_its_map_is_the_state_at_its_oom_and_other_caches_see_states_before_it() {
        let state = |seq: u64, time_s: f64, segments: Vec<HookSegment>| JobState {
            seq,
            time_s,
            segments,
            ..JobState::default()
        };
        let mut job = AttachedJob::new(7, 1.0);
        job.on_frame(JobFrame::from_state(&state(
            1,
            1.0,
            vec![checker_segment(0x1000_0000)],
        )));
        let at_oom: Vec<HookSegment> = (0..4)
            .map(|i| checker_segment(0x7f00_0000_0000 + i * 20 * MIB))
            .collect();
        job.on_oom(OomExplained::from_oom(&device_full_oom(2.0, at_oom)));
        // What was left once the exception unwound: one segment.
        job.on_frame(JobFrame::from_state(&state(
            2,
            3.0,
            vec![checker_segment(0x1000_0000)],
        )));
        let segments = |job: &AttachedJob| job.view.map().map(|m| m.layout.segments.len());
        assert_eq!(segments(&job), Some(1), "running: the last state");
        assert!(!job.view.map_is_the_oom());
        job.on_bye(Bye {
            time_s: 4.0,
            exit_code: Some(1),
        });
        assert_eq!(segments(&job), Some(4), "ended: the state at the OOM");
        assert!(job.view.map_is_the_oom());
        // Its panel counts that OOM (the frames' panel does; PyTorch's count was not read).
        let stats = job.view.map().map(|m| m.stats.clone()).unwrap_or_default();
        assert_eq!(stats.ooms, 1);
        assert_eq!(stats.last_oom.map(|r| r.requested_bytes), Some(16 * MIB));
        // Another process's OOM at 2.5 s sees the state of 1.0 s, not the later one.
        assert_eq!(job.frame_at(2.5).map(|f| f.time_s), Some(1.0));
        assert_eq!(job.frame_at(3.5).map(|f| f.time_s), Some(3.0));
        assert!(job.frame_at(0.5).is_none());
    }
}
