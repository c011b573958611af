//! The remedies users are told to try at a CUDA OOM, each with a verdict for THIS OOM:
//! `expandable_segments:True`, `max_split_size_mb:N`, `garbage_collection_threshold:X`
//! and `torch.cuda.empty_cache()`, and, when none fits, what would (the largest request
//! that fits now, the live blocks in the way of this one).
//!
//! Here the verdicts come from one state (the segments at the OOM, as the live view and a
//! kept OOM file have them): what PyTorch 2.11 (c10/cuda/CUDACachingAllocator.cpp) does
//! decides each, and where that depends on the order the job allocated and freed in,
//! which one state does not hold, the verdict is `cannot_tell` with what would settle it.
//! `vramtop_trace::replay::remedies` answers the same questions from a trace's history
//! and uses these rules where history cannot help (`empty_cache()`, the GC threshold).

use serde::Serialize;

use crate::whatif::{expandable_fits, LiveSpan};
use crate::{human_bytes, round_size, BlockState, Layout};

/// A remedy's verdict for one OOM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// With this remedy PyTorch would have served the request.
    Fits,
    /// With it PyTorch would still have raised.
    Fails,
    /// The evidence at hand does not decide it (the reason says what would).
    CannotTell,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Fits => "fits",
            Verdict::Fails => "fails",
            Verdict::CannotTell => "cannot tell",
        })
    }
}

/// The `garbage_collection_threshold` users are told to try (PyTorch's docs' example).
pub const GC_THRESHOLD_TRIED: f64 = 0.6;

/// A remedy users are told to try at a CUDA OOM, with the values that make it one
/// setting. It prints, and goes into JSON, as the user writes it: a
/// `PYTORCH_CUDA_ALLOC_CONF` entry (`expandable_segments:True`, `max_split_size_mb:512`)
/// or a call (`empty_cache()`). Verdicts from one state (here), from a history
/// (`vramtop_trace::replay::remedies`) and from other processes
/// (`vramtop_attach::other_caches`) meet on this type.
#[derive(Clone, Debug, PartialEq)]
pub enum Remedy {
    /// `expandable_segments:True`
    ExpandableSegments,
    /// `max_split_size_mb:N`: `Some(mib)`, the value that fits; `None`, no one value named.
    MaxSplitSizeMb(Option<u64>),
    /// `roundup_power2_divisions:N`, the same N for every size interval: `Some(n)`, the
    /// value that fits; `None`, no one value named.
    RoundupPower2Divisions(Option<u32>),
    /// `garbage_collection_threshold:X`
    GarbageCollectionThreshold(f64),
    /// `expandable_segments:True,garbage_collection_threshold:X`
    ExpandableWithGc(f64),
    /// `torch.cuda.empty_cache()` right before the failing request.
    EmptyCache,
    /// `torch.cuda.empty_cache()` after each of the job's steps.
    EmptyCacheBetweenSteps,
    /// `torch.cuda.empty_cache()` in another process on the same GPU.
    EmptyCacheElsewhere { pid: u32, command: String },
}

impl std::fmt::Display for Remedy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Remedy::ExpandableSegments => f.write_str("expandable_segments:True"),
            Remedy::MaxSplitSizeMb(Some(mb)) => write!(f, "max_split_size_mb:{mb}"),
            Remedy::MaxSplitSizeMb(None) => f.write_str("max_split_size_mb:N"),
            Remedy::RoundupPower2Divisions(Some(n)) => write!(f, "roundup_power2_divisions:{n}"),
            Remedy::RoundupPower2Divisions(None) => f.write_str("roundup_power2_divisions:N"),
            Remedy::GarbageCollectionThreshold(x) => write!(f, "garbage_collection_threshold:{x}"),
            Remedy::ExpandableWithGc(x) => {
                write!(
                    f,
                    "expandable_segments:True,garbage_collection_threshold:{x}"
                )
            }
            Remedy::EmptyCache => f.write_str("empty_cache()"),
            Remedy::EmptyCacheBetweenSteps => f.write_str("empty_cache() between steps"),
            Remedy::EmptyCacheElsewhere { pid, command } => {
                write!(f, "empty_cache() in pid {pid} ({command})")
            }
        }
    }
}

impl Remedy {
    /// The same remedy with no value named: a setting tried at several values
    /// (`max_split_size_mb`, `roundup_power2_divisions`) names one only beside "fits".
    pub fn unnamed(self) -> Remedy {
        match self {
            Remedy::MaxSplitSizeMb(_) => Remedy::MaxSplitSizeMb(None),
            Remedy::RoundupPower2Divisions(_) => Remedy::RoundupPower2Divisions(None),
            other => other,
        }
    }

    /// Whether this remedy names one of several values tried (its verdict is "fits").
    pub fn names_a_value(&self) -> bool {
        matches!(
            self,
            Remedy::MaxSplitSizeMb(Some(_)) | Remedy::RoundupPower2Divisions(Some(_))
        )
    }
}

impl Serialize for Remedy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What a verdict or a cause lacked to be decided. The libraries name it; the
/// application says how a user gives it (a flag, a rerun), so no library message names a
/// command-line flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Missing {
    /// The job's memory cap, which the file replayed does not carry.
    MemoryCap,
    /// The job's allocation sites, recorded only when asked for.
    AllocationSites,
}

/// Whether `remedies` were judged and each fails: no allocator setting gets the job
/// through, as far as what judged them says.
pub fn none_fits(remedies: &[RemedyVerdict]) -> bool {
    !remedies.is_empty() && remedies.iter().all(|r| r.verdict == Verdict::Fails)
}

/// One remedy, its verdict and one line of why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RemedyVerdict {
    pub remedy: Remedy,
    pub verdict: Verdict,
    pub reason: String,
    /// What would have decided a `cannot tell`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<Missing>,
}

impl RemedyVerdict {
    pub fn new(remedy: Remedy, verdict: Verdict, reason: impl Into<String>) -> Self {
        RemedyVerdict {
            remedy,
            verdict,
            reason: reason.into(),
            missing: None,
        }
    }

    /// The same verdict, saying what would have decided it.
    pub fn lacking(mut self, missing: Missing) -> Self {
        self.missing = Some(missing);
        self
    }

    /// "expandable_segments:True: fails: ..."
    pub fn line(&self) -> String {
        format!("{}: {}: {}", self.remedy, self.verdict, self.reason)
    }
}

/// Live blocks whose freeing would leave a free run the request fits in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InTheWay {
    /// Where the run would start.
    pub address: u64,
    pub blocks: u64,
    pub bytes: u64,
    /// Their allocation sites, most bytes first (empty without `--history`).
    pub sites: Vec<String>,
}

/// What would fit when nothing does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WhatWouldFit {
    /// The largest request PyTorch would serve now: the largest free run, or a new
    /// segment in the room the job has left.
    pub largest_request_bytes: u64,
    /// The fewest live bytes to free for this request to fit in place.
    pub in_the_way: Option<InTheWay>,
}

/// The allocator settings the job ran with, as far as they matter to the remedies.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct JobSettings {
    pub expandable_segments: bool,
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
}

/// One OOM as one state shows it.
#[derive(Clone, Copy, Debug)]
pub struct OomScene<'a> {
    /// The job's segments and blocks when PyTorch raised.
    pub layout: &'a Layout,
    /// The request, rounded as PyTorch rounds it.
    pub needed: u64,
    /// Room the job had to grow: up to its cap, no further than the device had free.
    pub headroom: u64,
    /// The driver had room for the request's segment: a per-process memory fraction
    /// stopped it (PyTorch passes the cap to its OOM observers only then).
    pub capped: bool,
    pub settings: JobSettings,
    /// What PyTorch released of wholly free cached segments just before it raised, when
    /// the trace shows it.
    pub released_bytes: Option<u64>,
}

impl OomScene<'_> {
    fn reserved(&self) -> u64 {
        self.layout.segments.iter().map(|s| s.size).sum()
    }

    /// What the job may hold: reserved now plus its room to grow.
    pub fn budget(&self) -> u64 {
        self.reserved().saturating_add(self.headroom)
    }

    /// The least any allocator setting would need for the live tensors and the request:
    /// each live tensor at PyTorch's rounding of what it asked for, packed tight. The job
    /// runs the same code under every setting, so these tensors are live there too.
    pub fn live_floor(&self) -> u64 {
        let live: u64 = live_runs(self.layout)
            .map(|r| {
                if r.requested > 0 {
                    round_size(r.requested).unwrap_or(r.size)
                } else {
                    r.size
                }
            })
            .fold(0, u64::saturating_add);
        live.saturating_add(self.needed)
    }

    /// No allocator setting fits it: the live tensors and the request exceed the budget.
    fn beyond_any_setting(&self) -> Option<String> {
        beyond_any_setting(self.live_floor(), self.budget())
    }
}

/// Why no allocator setting fits a request when the live tensors and it (`floor`) need
/// more than the job may hold (`budget`); `None` when they do not.
pub fn beyond_any_setting(floor: u64, budget: u64) -> Option<String> {
    (floor > budget).then(|| {
        format!(
            "the live tensors and the request need {} even packed tight, more than the {} \
             the job may hold",
            human_bytes(floor),
            human_bytes(budget)
        )
    })
}

fn live_runs(layout: &Layout) -> impl Iterator<Item = &crate::LayoutRun> {
    layout
        .segments
        .iter()
        .flat_map(|s| &s.runs)
        .filter(|r| matches!(r.state, BlockState::Allocated | BlockState::PendingFree))
}

/// Every remedy's verdict from one state, in the order users are told to try them;
/// `expandable` is `expandable(scene)`, which callers keep too (it replays the live
/// tensors through two allocators: done once).
pub fn one_state(scene: &OomScene<'_>, expandable: &ExpandableVerdict) -> Vec<RemedyVerdict> {
    vec![
        expandable.remedy(),
        max_split_size(scene),
        garbage_collection_threshold(scene),
        empty_cache(scene),
        empty_cache_between_steps(scene.beyond_any_setting()),
    ]
}

/// `torch.cuda.empty_cache()` called earlier (between steps), as users sprinkle it: it
/// hands cached segments back, so later requests get fresh segments instead of splitting
/// cached ones. On an H100 that let a growing GPT-2 step and a torch.cat KV cache fit.
pub fn empty_cache_between_steps(beyond: Option<String>) -> RemedyVerdict {
    const NAME: Remedy = Remedy::EmptyCacheBetweenSteps;
    match beyond {
        Some(why) => RemedyVerdict::new(NAME, Verdict::Fails, why),
        None => RemedyVerdict::new(
            NAME,
            Verdict::CannotTell,
            "it changes which cached blocks later requests split; one state does not settle \
             it",
        ),
    }
}

/// `expandable_segments:True`, from one state.
pub fn expandable(scene: &OomScene<'_>) -> ExpandableVerdict {
    expandable_would_fit(
        scene.layout,
        scene.needed,
        scene.headroom,
        scene.settings.expandable_segments,
    )
}

/// `max_split_size_mb:N` from one state. The setting changes which cached blocks earlier
/// requests split (`get_free_block` refuses oversize blocks to small requests, and large
/// requests blocks of more than their size plus 20 MiB), so the state at the OOM would
/// have been another one: only the history settles it, or a floor no setting fits.
pub fn max_split_size(scene: &OomScene<'_>) -> RemedyVerdict {
    const NAME: Remedy = Remedy::MaxSplitSizeMb(None);
    if let Some(why) = scene.beyond_any_setting() {
        return RemedyVerdict::new(NAME, Verdict::Fails, format!("no value fits: {why}"));
    }
    RemedyVerdict::new(
        NAME,
        Verdict::CannotTell,
        "it changes which cached blocks earlier requests split, which one state does not \
         show, and no history of the job's allocations came with this OOM",
    )
}

/// `garbage_collection_threshold:X`. PyTorch acts on it only under
/// `set_per_process_memory_fraction`, and then only when no cached block fits a request
/// (`garbage_collect_cached_blocks` before `alloc_block`), where it frees wholly free
/// cached segments, oldest first: the same segments `release_cached_blocks` frees anyway
/// before PyTorch raises.
pub fn garbage_collection_threshold(scene: &OomScene<'_>) -> RemedyVerdict {
    gc_threshold_verdict(scene.capped, scene.beyond_any_setting())
}

/// The GC threshold's verdict: `capped`, a memory fraction stopped the request;
/// `beyond`, why no setting fits it, if none does.
pub fn gc_threshold_verdict(capped: bool, beyond: Option<String>) -> RemedyVerdict {
    const NAME: Remedy = Remedy::GarbageCollectionThreshold(GC_THRESHOLD_TRIED);
    if let Some(why) = beyond {
        return RemedyVerdict::new(NAME, Verdict::Fails, why);
    }
    if !capped {
        return RemedyVerdict::new(
            NAME,
            Verdict::Fails,
            "PyTorch acts on it only under set_per_process_memory_fraction, and the device \
             itself was out of room here",
        );
    }
    // Under a cap it frees wholly free cached segments earlier than PyTorch's own release
    // before raising, so later requests find other blocks: on an H100 that let a growing
    // GPT-2 step fit. Which way it goes is the history's to say.
    RemedyVerdict::new(
        NAME,
        Verdict::CannotTell,
        "under a memory fraction it releases free cached segments earlier, which changes \
         where later tensors go; one state does not settle it",
    )
}

/// `torch.cuda.empty_cache()` right before the failing request: PyTorch's `malloc` already called
/// `release_cached_blocks` (every wholly free segment, or every free page with
/// expandable segments) and retried before it raised, unless a CUDA graph was capturing,
/// when neither it nor `empty_cache()` may release anything.
pub fn empty_cache(scene: &OomScene<'_>) -> RemedyVerdict {
    empty_cache_verdict(scene.released_bytes)
}

/// `released`: what PyTorch released just before it raised, when known.
pub fn empty_cache_verdict(released: Option<u64>) -> RemedyVerdict {
    let released = match released {
        Some(0) => "; it had none to release here".to_string(),
        Some(bytes) => format!("; here it released {}", human_bytes(bytes)),
        None => String::new(),
    };
    RemedyVerdict::new(
        Remedy::EmptyCache,
        Verdict::Fails,
        format!(
            "PyTorch releases every wholly free cached segment itself and retries before it \
             raises{released}"
        ),
    )
}

/// The largest request that fits now, and the live blocks in the way of this one.
pub fn what_would_fit(scene: &OomScene<'_>) -> WhatWouldFit {
    let largest_free = scene
        .layout
        .segments
        .iter()
        .flat_map(|s| &s.runs)
        .filter(|r| r.state == BlockState::Free)
        .map(|r| r.size)
        .max()
        .unwrap_or(0);
    WhatWouldFit {
        largest_request_bytes: largest_free.max(largest_new_segment_request(scene.headroom)),
        in_the_way: in_the_way(scene.layout, scene.needed),
    }
}

/// The largest request whose new segment fits in `headroom`: requests of 10 MiB or more
/// get a segment of their own size rounded up to 2 MiB; smaller large-pool requests a
/// 20 MiB one, small-pool requests (1 MiB and under) a 2 MiB one.
fn largest_new_segment_request(headroom: u64) -> u64 {
    let rounded_down = headroom - headroom % (2 << 20);
    if rounded_down >= 10 << 20 {
        rounded_down
    } else if headroom >= 2 << 20 {
        1 << 20
    } else {
        0
    }
}

/// The window of runs inside one segment, at least `needed` long, holding the fewest live
/// bytes: what freeing those blocks would leave room for.
fn in_the_way(layout: &Layout, needed: u64) -> Option<InTheWay> {
    let mut best: Option<(u64, u64, usize, usize, usize)> = None; // (live, addr, seg, from, to)
    for (s, segment) in layout.segments.iter().enumerate() {
        let runs = &segment.runs;
        let (mut from, mut span, mut live) = (0usize, 0u64, 0u64);
        for to in 0..runs.len() {
            span += runs[to].size;
            if runs[to].state != BlockState::Free {
                live += runs[to].size;
            }
            // Shrink from the left while the window stays long enough.
            while from < to && span - runs[from].size >= needed {
                span -= runs[from].size;
                if runs[from].state != BlockState::Free {
                    live -= runs[from].size;
                }
                from += 1;
            }
            if span >= needed && best.is_none_or(|b| live < b.0) {
                best = Some((live, runs[from].addr, s, from, to));
            }
        }
    }
    let (bytes, address, s, from, to) = best?;
    let runs = &layout.segments[s].runs[from..=to];
    let mut by_site: std::collections::BTreeMap<&str, u64> = Default::default();
    let mut blocks = 0;
    for run in runs.iter().filter(|r| r.state != BlockState::Free) {
        blocks += 1;
        if let Some(tag) = run.tag {
            *by_site.entry(layout.tag_name(tag)).or_default() += run.size;
        }
    }
    let mut sites: Vec<(&str, u64)> = by_site.into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    Some(InTheWay {
        address,
        blocks,
        bytes,
        sites: sites.into_iter().map(|(s, _)| s.to_string()).collect(),
    })
}

impl WhatWouldFit {
    /// "a request of at most 8.0 MiB fits now; freeing 2 live blocks (12.0 MiB) at
    /// 0x7f.. would make room for this one"
    pub fn line(&self) -> String {
        let mut out = format!(
            "a request of at most {} fits now",
            human_bytes(self.largest_request_bytes)
        );
        if self.in_the_way.is_none() {
            out += "; no segment is large enough for this one: it needs a new segment";
        }
        if let Some(w) = &self.in_the_way {
            out += &format!(
                "; freeing {} live block(s) ({}) at {:#x} would make room for this one",
                w.blocks,
                human_bytes(w.bytes),
                w.address
            );
            if !w.sites.is_empty() {
                out += &format!(" ({})", w.sites.join(", "));
            }
        }
        out
    }
}

/// What `expandable_segments:True` would have done with a failed request, said only as
/// far as one state can tell (PyTorch 2.11, c10/cuda/CUDACachingAllocator.cpp):
/// - already on: `malloc` released every free page (`release_cached_blocks` ->
///   `release_blocks` -> `unmap_block`, whole pages only) and retried before it raised,
///   so it did not fit;
/// - off: with it on, the same job would have put its tensors one after another into one
///   mapped extent of pages (20 MiB in the large pool, 2 MiB in the small), and a page
///   stays mapped while any live tensor touches it. Which pages the live tensors would
///   touch depends on the order the job allocated and freed in, which one state does not
///   hold. So: packed tight (the best case) and still over the budget: it would not fit;
///   every live tensor on pages of its own (the worst case) and still within it: it
///   would fit; between the two: cannot tell from one state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExpandableVerdict {
    pub answer: Answer,
    /// PyTorch's expandable segments would fit it (`answer` is `fits`).
    pub would_fit: bool,
    /// An ideal page-mapped allocator, live tensors packed tight (the best case), fits it.
    pub ideal_would_fit: bool,
    pub needed_bytes: u64,
    /// Pages the live tensors hold packed tight, and with each on pages of its own.
    pub best_case_bytes: u64,
    pub worst_case_bytes: u64,
    /// What the job may hold: reserved now plus its room to grow.
    pub budget_bytes: u64,
    /// The job ran with expandable segments on.
    pub already_on: bool,
}

impl ExpandableVerdict {
    /// What `expandable_segments:True` would have done, in one line with its reason.
    pub fn line(&self) -> String {
        self.remedy().line()
    }

    /// The verdict as one of the remedies.
    pub fn remedy(&self) -> RemedyVerdict {
        let v = self;
        let budget = human_bytes(v.budget_bytes);
        let (verdict, reason) = match v.answer {
            Answer::DoesNotFit if v.already_on => (
                Verdict::Fails,
                "already on: PyTorch unmapped every free page and retried before it raised"
                    .to_string(),
            ),
            Answer::DoesNotFit => (
                Verdict::Fails,
                format!(
                    "even packed tight on 20 MiB pages the live tensors and the request need \
                     more than the {budget} allowed"
                ),
            ),
            Answer::Fits => (
                Verdict::Fits,
                format!(
                    "even with every live tensor on pages of its own ({}) the request fits in \
                     the {budget} allowed",
                    human_bytes(v.worst_case_bytes)
                ),
            ),
            Answer::CannotTell => (
                Verdict::CannotTell,
                format!(
                    "one state does not settle it (no history of the job's allocations came \
                     with this OOM): it fits packed tight ({}), not if each live tensor keeps \
                     its pages mapped ({}; a 20 MiB page stays while any tensor touches it)",
                    human_bytes(v.best_case_bytes),
                    human_bytes(v.worst_case_bytes)
                ),
            ),
        };
        RemedyVerdict::new(Remedy::ExpandableSegments, verdict, reason)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Fits,
    DoesNotFit,
    CannotTell,
}

/// PyTorch's expandable page for a block of `size` bytes (`kSmallBuffer` for the small
/// pool's blocks of up to 1 MiB, else `kLargeBuffer`).
fn page_for(size: u64) -> u64 {
    if size <= 1 << 20 {
        2 << 20
    } else {
        20 << 20
    }
}

/// The one place this verdict is computed. `already_on`: the job's segments are
/// expandable ones.
pub fn expandable_would_fit(
    layout: &Layout,
    needed: u64,
    headroom: u64,
    already_on: bool,
) -> ExpandableVerdict {
    let live: Vec<LiveSpan> = live_runs(layout)
        .map(|r| LiveSpan {
            addr: r.addr,
            size: r.size,
            stream: 0,
        })
        .collect();
    let reserved: u64 = layout.segments.iter().map(|s| s.size).sum();
    let budget = reserved.saturating_add(headroom);
    let what_if = expandable_fits(&live, needed, 0, budget);
    // Packed tight, through PyTorch's own rules (`pytorch-expandable`): the best case.
    let best_case = what_if
        .faithful
        .reserved_after_bytes
        .max(what_if.faithful.reserved_before_bytes);
    // Each live tensor on pages of its own: one more page where it may straddle two.
    let worst_case = live
        .iter()
        .map(|b| {
            let page = page_for(b.size);
            (b.size.div_ceil(page) + 1).saturating_mul(page)
        })
        .fold(0u64, u64::saturating_add);
    let request_pages = needed
        .div_ceil(page_for(needed))
        .saturating_mul(page_for(needed));
    let answer = if already_on || !what_if.faithful.fits {
        Answer::DoesNotFit
    } else if worst_case.saturating_add(request_pages) <= budget {
        Answer::Fits
    } else {
        Answer::CannotTell
    };
    ExpandableVerdict {
        answer,
        would_fit: answer == Answer::Fits,
        ideal_would_fit: what_if.ideal.fits,
        needed_bytes: needed,
        best_case_bytes: best_case,
        worst_case_bytes: worst_case,
        budget_bytes: budget,
        already_on,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LayoutRun, Pool, SegmentLayout, TagId};

    const MIB: u64 = 1 << 20;

    fn run(addr: u64, size: u64, state: BlockState, tag: Option<u32>) -> LayoutRun {
        LayoutRun {
            addr,
            size,
            state,
            requested: if state == BlockState::Free { 0 } else { size },
            id: None,
            tag: tag.map(TagId),
            stream: Some(0),
            born_ns: None,
        }
    }

    /// Segments of `size` MiB, each tiled by `pattern` (MiB, live or free).
    fn layout(segments: usize, pattern: &[(u64, bool)]) -> Layout {
        let mut addr = 0x7f00_0000_0000;
        let mut out = Vec::new();
        for _ in 0..segments {
            let start = addr;
            let runs = pattern
                .iter()
                .map(|&(mib, live)| {
                    let state = if live {
                        BlockState::Allocated
                    } else {
                        BlockState::Free
                    };
                    let r = run(addr, mib * MIB, state, live.then_some(0));
                    addr += mib * MIB;
                    r
                })
                .collect();
            out.push(SegmentLayout {
                addr: start,
                size: addr - start,
                pool: Pool::Large,
                stream: Some(0),
                runs,
            });
        }
        Layout {
            policy: None,
            capacity: 0,
            segments: out,
            tags: vec!["train.py:9 step".into()],
            generation: 0,
        }
    }

    fn scene(layout: &Layout, needed: u64, headroom: u64, capped: bool) -> OomScene<'_> {
        OomScene {
            layout,
            needed,
            headroom,
            capped,
            settings: JobSettings::default(),
            released_bytes: None,
        }
    }

    #[test]
    fn a_checkerboard_at_its_cap_fails_every_remedy() {
        // 20 MiB segments of 6 live, 6 free, 6 live, 2 free: 12 MiB live of 20; 1 GiB
        // asked with no room left. Live floor 12 x 100 + 1024 MiB > 2000 MiB.
        let l = layout(100, &[(6, true), (6, false), (6, true), (2, false)]);
        let s = scene(&l, 1024 * MIB, 0, true);
        let verdicts = one_state(&s, &expandable(&s));
        assert_eq!(verdicts.len(), 5);
        assert!(
            verdicts.iter().all(|v| v.verdict == Verdict::Fails),
            "{verdicts:?}"
        );
        assert!(verdicts[1].reason.starts_with("no value fits"));
    }

    #[test]
    fn room_for_the_request_in_a_tighter_packing_is_not_a_firm_no() {
        // 10 MiB live of every 20 MiB segment: packed tight the 200 MiB request fits the
        // 2000 MiB held; each tensor on its own pages it would not.
        let l = layout(100, &[(5, true), (5, false), (5, true), (5, false)]);
        let s = scene(&l, 200 * MIB, 0, true);
        let v = one_state(&s, &expandable(&s));
        assert_eq!(v[0].verdict, Verdict::CannotTell, "{v:?}");
        assert_eq!(v[1].verdict, Verdict::CannotTell);
        // Under a cap the GC threshold releases segments earlier: the history decides.
        assert_eq!(v[2].verdict, Verdict::CannotTell);
        assert_eq!(v[3].verdict, Verdict::Fails);
        assert_eq!(v[4].verdict, Verdict::CannotTell);
    }

    #[test]
    fn gc_threshold_does_nothing_without_a_memory_fraction() {
        let l = layout(10, &[(5, true), (15, false)]);
        let s = scene(&l, 30 * MIB, 0, false);
        let gc = garbage_collection_threshold(&s);
        assert_eq!(gc.verdict, Verdict::Fails);
        assert!(
            gc.reason.contains("set_per_process_memory_fraction"),
            "{}",
            gc.reason
        );
    }

    #[test]
    fn empty_cache_says_what_pytorch_released() {
        let l = layout(1, &[(5, true), (15, false)]);
        let mut s = scene(&l, 30 * MIB, 0, false);
        s.released_bytes = Some(40 * MIB);
        let v = empty_cache(&s);
        assert_eq!(v.verdict, Verdict::Fails);
        assert!(v.reason.contains("released 40.0 MiB"), "{}", v.reason);
    }

    #[test]
    fn the_blocks_in_the_way_are_the_cheapest_window() {
        // Two segments: [6 live, 6 free, 6 live, 2 free] and [1 live, 18 free, 1 live].
        let mut l = layout(1, &[(6, true), (6, false), (6, true), (2, false)]);
        let other = layout(1, &[(1, true), (18, false), (1, true)]);
        let mut seg = other.segments[0].clone();
        let shift = 0x1000_0000;
        seg.addr += shift;
        for r in &mut seg.runs {
            r.addr += shift;
        }
        l.segments.push(seg);
        let s = scene(&l, 19 * MIB, 0, true);
        let w = what_would_fit(&s);
        assert_eq!(w.largest_request_bytes, 18 * MIB);
        let way = w.in_the_way.as_ref().expect("a window");
        assert_eq!((way.blocks, way.bytes), (1, MIB));
        assert_eq!(way.sites, vec!["train.py:9 step".to_string()]);
        assert!(
            w.line().contains("freeing 1 live block(s) (1.0 MiB)"),
            "{}",
            w.line()
        );
    }

    #[test]
    fn a_remedy_prints_as_the_user_writes_it() {
        let spelled = [
            (Remedy::ExpandableSegments, "expandable_segments:True"),
            (Remedy::MaxSplitSizeMb(Some(512)), "max_split_size_mb:512"),
            (Remedy::MaxSplitSizeMb(None), "max_split_size_mb:N"),
            (
                Remedy::RoundupPower2Divisions(Some(4)),
                "roundup_power2_divisions:4",
            ),
            (
                Remedy::RoundupPower2Divisions(None),
                "roundup_power2_divisions:N",
            ),
            (
                Remedy::GarbageCollectionThreshold(GC_THRESHOLD_TRIED),
                "garbage_collection_threshold:0.6",
            ),
            (
                Remedy::ExpandableWithGc(0.6),
                "expandable_segments:True,garbage_collection_threshold:0.6",
            ),
            (Remedy::EmptyCache, "empty_cache()"),
            (
                Remedy::EmptyCacheBetweenSteps,
                "empty_cache() between steps",
            ),
            (
                Remedy::EmptyCacheElsewhere {
                    pid: 42,
                    command: "python holder.py".into(),
                },
                "empty_cache() in pid 42 (python holder.py)",
            ),
        ];
        for (remedy, text) in spelled {
            assert_eq!(remedy.to_string(), text);
            // JSON carries the same spelling, as a string.
            assert_eq!(
                serde_json::to_value(&remedy).unwrap(),
                serde_json::Value::String(text.into())
            );
        }
    }

    #[test]
    fn room_to_grow_is_a_request_that_fits() {
        assert_eq!(largest_new_segment_request(100 * MIB + 5), 100 * MIB);
        assert_eq!(largest_new_segment_request(15 * MIB), 14 * MIB);
        assert_eq!(largest_new_segment_request(5 * MIB), MIB);
        assert_eq!(largest_new_segment_request(0), 0);
    }
}
