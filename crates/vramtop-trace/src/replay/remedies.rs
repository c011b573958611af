//! The remedies at each of a trace's own OOMs, answered from the job's history: the trace
//! replayed through `caching` (PyTorch's rules) with each `max_split_size_mb` tried, and
//! through `pytorch-expandable`, asked at each OOM whether the same request would have
//! fit. A trace kept at an OOM with no history (one state) gets the live view's own
//! answers (`vramtop_alloc::remedy::one_state`): the same state, the same verdicts.
//!
//! A replay needs a capacity. Given (`--capacity`), it is one figure. Otherwise the trace
//! bounds it, and only verdicts that hold across those bounds are given:
//! - at least the most the job ever reserved (it had that);
//! - where the device itself was out of room (its free memory less than the request's
//!   new segment), what the job held plus what the device had free: what it had then;
//! - under a memory fraction (the device had room), less than what the job held plus the
//!   request's new segment (PyTorch's cap check refused exactly that).
//!
//! A remedy that fits at the low bound fits; one that fails at the high bound fails;
//! between them the verdict is `cannot_tell`, and `--capacity` settles it. A replay that
//! does not itself fail where PyTorch failed (no remedy) gives no verdicts at all.

use serde::Serialize;

use super::{replay, AddressOrder, OomCheck, ReplayError, ReplayOptions};
use crate::ooms::{CapacitySource, TraceOom};
use crate::{snapshot, Trace, TraceEventKind};
use vramtop_alloc::remedy::{
    self, beyond_any_setting, empty_cache_verdict, gc_threshold_verdict, JobSettings, OomScene,
    RemedyVerdict, Verdict, WhatWouldFit,
};
use vramtop_alloc::{human_bytes, round_size, segment_size_for, PolicyKind};

/// The `max_split_size_mb` values tried, in MiB (PyTorch takes nothing under 20).
pub const MAX_SPLIT_TRIED_MB: [u64; 8] = [20, 64, 128, 256, 512, 1024, 2048, 4096];

const MIB: u64 = 1 << 20;

/// One trace OOM and every remedy's verdict for it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OomRemedies {
    /// Index of the `oom` event in `Trace::events`.
    pub event: usize,
    pub remedies: Vec<RemedyVerdict>,
    /// The verdicts replay the trace's history (else they are the one state's at the OOM).
    #[serde(skip)]
    pub from_history: bool,
    /// From one state only (a trace kept at the OOM without history).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_would_fit: Option<WhatWouldFit>,
}

/// The capacities a replay is asked at: equal when given or known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CapacityBounds {
    pub low: u64,
    pub high: u64,
    pub source: CapacitySource,
}

impl CapacityBounds {
    /// "capacity 5.9 GiB to 7.9 GiB (bounded by the trace's OOMs; --capacity settles it)"
    pub fn line(&self) -> String {
        if self.low == self.high {
            return format!("capacity {}", human_bytes(self.low));
        }
        format!(
            "capacity between {} and {} as the trace's OOM(s) bound it (--capacity settles \
             the verdicts that depend on it)",
            human_bytes(self.low),
            human_bytes(self.high)
        )
    }
}

/// What the trace bounds the capacity to; `None` without OOMs and without `given`.
pub fn capacity_bounds(
    trace: &Trace,
    ooms: &[TraceOom],
    given: Option<u64>,
) -> Option<CapacityBounds> {
    if let Some(c) = given {
        return Some(CapacityBounds {
            low: c,
            high: c,
            source: CapacitySource::Given,
        });
    }
    let (mut low, mut high) = (crate::ooms::peak_reserved(trace), u64::MAX);
    for oom in ooms {
        let segment = segment_size_for(round_size(oom.requested_bytes).unwrap_or(u64::MAX));
        if oom.device_free_bytes < segment {
            // The device itself: what the job held plus what it had free then.
            let had = oom.reserved_bytes.saturating_add(oom.device_free_bytes);
            low = low.max(had.min(high));
            high = high.min(had);
        } else {
            high = high.min(oom.reserved_bytes.saturating_add(segment).saturating_sub(1));
        }
    }
    if ooms.is_empty() {
        return None;
    }
    let low = low.min(high);
    Some(CapacityBounds {
        low,
        high,
        source: CapacitySource::Inferred,
    })
}

/// The cap PyTorch enforced, where a file the hook kept at an OOM under a memory fraction
/// names it (what PyTorch passed its OOM observer): no need to bound it then.
pub fn kept_cap(trace: &Trace) -> Option<u64> {
    trace.stats.kept_oom.as_ref().and_then(|k| {
        let needed = round_size(k.requested_bytes).unwrap_or(k.requested_bytes);
        let capped = k.device_free_bytes >= segment_size_for(needed);
        (capped && k.device_total_bytes > 0).then_some(k.device_total_bytes)
    })
}

/// Every remedy at each of the trace's OOMs (`ooms` is `ooms::trace_ooms(trace)`).
pub fn remedies(
    trace: &Trace,
    ooms: &[TraceOom],
    given: Option<u64>,
) -> Result<Vec<OomRemedies>, ReplayError> {
    let Some(bounds) = capacity_bounds(trace, ooms, given.or(kept_cap(trace))) else {
        return Ok(Vec::new());
    };
    // What came before the trace began: blocks live at its start. A replay places them
    // packed in address order (caching adopts PyTorch's own segments), so it starts from
    // a state made under the job's own settings, not the remedy's.
    let live_at_start = super::initial::live_before_trace(trace).0.len().max(
        trace
            .initial_segments
            .iter()
            .map(|s| s.blocks.len())
            .sum::<usize>(),
    );
    let checkpoint = trace
        .stats
        .kept_oom
        .as_ref()
        .and_then(|kept| kept.checkpoint.clone());
    let kept_without_whole_history = trace.stats.kept_oom.as_ref().is_some_and(|kept| {
        !kept.ring_complete
            || match &kept.checkpoint {
                // Its blocks are the checkpoint's; a replay that contradicts it is not the job's.
                Some(cp) => cp.contradictions > 0,
                None => live_at_start > 0,
            }
    });
    if trace.stats.no_history || kept_without_whole_history {
        // A file kept at the OOM without the job's whole history (no event ring, or one
        // that was full and forgot the job's start): its segments are the state at the
        // OOM, so the live view's own answers for that state.
        return Ok(one_state(trace, ooms));
    }
    let settings = &trace.settings;
    // PyTorch acts on a GC threshold only under a memory fraction: the job's own counts
    // in every run where an OOM shows one, and the tried one only there.
    let capped_any = ooms.iter().any(under_a_cap);
    let own_gc = settings.garbage_collection_threshold.filter(|_| capped_any);
    // The GC acts at a share of the cap itself, so a replay that fails at one capacity may
    // fit at a higher one and fail again higher still: its verdict needs the cap, not
    // bounds.
    let gc_cap = (bounds.low == bounds.high).then_some(bounds.low);
    // From a checkpoint, the blocks live then were laid out under the job's own settings,
    // not the remedy's: each run starts from both ends (`Start`), and a verdict is given
    // only where they agree.
    let starts = Starts::of(trace, checkpoint.is_some());
    // The job's optimizer steps, where the hook marked them within the history.
    let step_marks = super::step_boundaries(trace);
    let steps_marked = !step_marks.is_empty();
    let at = |run: Run| {
        let opts = ReplayOptions {
            capacity: run.capacity,
            source: bounds.source,
            max_split_size: run.max_split,
            gc_threshold: if run.gc_tried { Some(GC_TRIED) } else { own_gc },
            roundup_power2_divisions: run.roundup.map(|n| [n; 16]),
            empty_cache_at_steps: run.empty_steps,
            addresses: run.addresses,
        };
        replay(starts.trace(trace, run.start), run.policy, opts).map(|run| run.oom_checks)
    };
    // Each run on a thread of its own: they share nothing but the trace.
    // The job's own settings, replayed as PyTorch had it: every run is this and a remedy.
    let plain = Run {
        policy: PolicyKind::Caching,
        capacity: bounds.low,
        max_split: None,
        gc_tried: false,
        roundup: None,
        empty_steps: false,
        start: Start::AsFound,
        addresses: AddressOrder::Trace,
    };
    let mut asked: Vec<Run> = Vec::new();
    for capacity in [bounds.low, bounds.high] {
        let run = Run { capacity, ..plain };
        asked.push(run);
        if !settings.expandable_segments {
            asked.push(Run {
                policy: PolicyKind::PytorchExpandable,
                ..run
            });
        }
        for mb in MAX_SPLIT_TRIED_MB {
            if settings.max_split_size != Some(mb * MIB) {
                asked.push(Run {
                    max_split: Some(mb * MIB),
                    ..run
                });
            }
        }
        if settings.roundup_power2_divisions == [0; 16] {
            asked.push(Run {
                roundup: Some(ROUNDUP_TRIED),
                ..run
            });
        }
        if steps_marked {
            asked.push(Run {
                empty_steps: true,
                ..run
            });
        }
        if bounds.low == bounds.high {
            break;
        }
    }
    if let Some(cap) = gc_cap.filter(|_| capped_any && own_gc.is_none()) {
        asked.push(Run {
            capacity: cap,
            gc_tried: true,
            ..plain
        });
    }
    // Each remedy's run from every start and under every address order (the job's own
    // run stays as PyTorch had it: it must fail where PyTorch failed).
    let others: Vec<Run> = asked
        .iter()
        .flat_map(|&r| starts.variants(r).into_iter().skip(1))
        .collect();
    asked.extend(others);
    // A hundred runs or more from a checkpoint: as many threads at once as there are
    // cores (this runs on a viewer's reader thread at a live OOM too).
    let workers = std::thread::available_parallelism().map_or(4, |n| n.get());
    let mut answers: Vec<Result<Vec<OomCheck>, ReplayError>> = Vec::with_capacity(asked.len());
    for batch in asked.chunks(workers) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|&run| scope.spawn(move || at(run)))
                .collect();
            answers.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Ok(Vec::new()))),
            );
        });
    }
    let mut runs = Vec::with_capacity(asked.len());
    for (key, answer) in asked.into_iter().zip(answers) {
        runs.push((key, answer?));
    }
    // Would a job run so have died by the OOM at `event`: there, or at an allocation
    // before it that the run could not place (PyTorch's own run placed them all)?
    let fails = |event: usize, run: Run| -> Option<bool> {
        runs.iter()
            .find(|(k, _)| *k == run)
            .and_then(|(_, checks)| checks.iter().find(|c| c.event == event))
            .map(|c| c.fails || c.failed_before > 0)
    };
    // Fits only where it fits at the low capacity in every variant; fails only where it
    // fails at the high capacity in every variant.
    let verdict_of = |event: usize, run: Run| -> Verdict {
        let variants = starts.variants(run);
        let at = |capacity: u64| {
            variants
                .iter()
                .map(move |&v| fails(event, Run { capacity, ..v }))
        };
        if at(bounds.low).all(|f| f == Some(false)) {
            Verdict::Fits
        } else if at(bounds.high).all(|f| f == Some(true)) {
            Verdict::Fails
        } else {
            Verdict::CannotTell
        }
    };
    // Why variants of a run disagree, at some capacity: the start (where the blocks live
    // at a checkpoint would have been), or the addresses (where CUDA would have put the
    // remedy's new segments).
    let disagreement = |event: usize, run: Run| -> Option<Disagreement> {
        let variants = starts.variants(run);
        let split = |same: &dyn Fn(&Run) -> bool| {
            [bounds.low, bounds.high].iter().any(|&capacity| {
                let mut seen = variants
                    .iter()
                    .filter(|v| same(v))
                    .map(|&v| fails(event, Run { capacity, ..v }));
                let first = seen.next().flatten();
                seen.any(|f| f != first)
            })
        };
        if split(&|v| v.addresses == AddressOrder::Trace) {
            Some(Disagreement::Start)
        } else if split(&|v| v.start == Start::AsFound) {
            Some(Disagreement::Addresses)
        } else {
            None
        }
    };
    let mut out = Vec::new();
    for oom in ooms {
        let event = oom.event;
        let needed = round_size(oom.requested_bytes).unwrap_or(oom.requested_bytes);
        let capped = under_a_cap(oom);
        let beyond = beyond_any_setting(oom.allocated_bytes.saturating_add(needed), bounds.high);
        let released = released_before(trace, event);
        let mut remedies = Vec::new();
        // What a replayed verdict says of where it came from: a checkpoint, and for one left
        // open, what its variants disagree on.
        let from_checkpoint = |r: RemedyVerdict, runs: &[Run]| -> RemedyVerdict {
            let mut r = r;
            let since = event.min(trace.events.len());
            let split = runs.iter().find_map(|&run| disagreement(event, run));
            if r.verdict == Verdict::CannotTell {
                match (split, &checkpoint) {
                    (Some(Disagreement::Start), Some(cp)) => {
                        r.reason = format!(
                            "the blocks live at the hook's checkpoint ({}) decide it: the \
                             {since} events since, replayed with those blocks where PyTorch \
                             had them and with them packed anew, give different answers",
                            checkpoint_age(cp, trace)
                        );
                    }
                    (Some(Disagreement::Addresses), _) => {
                        r.reason = "it turns on where CUDA would place the new segments \
                                    (PyTorch takes the lowest of equal free blocks): the \
                                    replays under different address orders give different \
                                    answers, and so may PyTorch from run to run"
                            .to_string();
                    }
                    _ => {}
                }
            } else if let Some(cp) = &checkpoint {
                r.reason = format!(
                    "{} (from the hook's checkpoint {} and the {since} events since, with \
                     the blocks live then where PyTorch had them and packed anew alike)",
                    r.reason,
                    checkpoint_age(cp, trace)
                );
            }
            r
        };
        // The replay must fail where PyTorch failed before its answers mean anything.
        let replay_fails_there = fails(event, plain) == Some(true);
        if !replay_fails_there {
            let why = "vramtop's replay of this trace does not fail where PyTorch failed, so \
                       it cannot judge remedies here";
            remedies.push(RemedyVerdict::new(
                "expandable_segments:True",
                Verdict::CannotTell,
                why,
            ));
            remedies.push(RemedyVerdict::new(
                "max_split_size_mb:N",
                Verdict::CannotTell,
                why,
            ));
        } else {
            let partial = live_at_start > 0 && checkpoint.is_none();
            let run = Run {
                policy: PolicyKind::PytorchExpandable,
                ..plain
            };
            remedies.push(from_checkpoint(
                expandable(settings.expandable_segments, partial, || {
                    verdict_of(event, run)
                }),
                &[run],
            ));
            if partial {
                remedies.push(RemedyVerdict::new(
                    "max_split_size_mb:N",
                    Verdict::CannotTell,
                    format!(
                        "the trace begins with {live_at_start} blocks already live, placed \
                         under the job's own setting: record the job from its start"
                    ),
                ));
            } else {
                let split_run = |mb: u64| Run {
                    max_split: Some(mb * MIB),
                    ..plain
                };
                let runs: Vec<Run> = MAX_SPLIT_TRIED_MB.iter().map(|&mb| split_run(mb)).collect();
                remedies.push(from_checkpoint(
                    max_split(&|mb| verdict_of(event, split_run(mb))),
                    &runs,
                ));
            }
            if !partial && settings.roundup_power2_divisions == [0; 16] {
                let run = Run {
                    roundup: Some(ROUNDUP_TRIED),
                    ..plain
                };
                remedies.push(from_checkpoint(roundup(verdict_of(event, run)), &[run]));
            }
        }
        let history_gc = (replay_fails_there
            && capped
            && beyond.is_none()
            && (live_at_start == 0 || checkpoint.is_some()))
        .then(|| {
            let run = gc_cap.map(|cap| Run {
                capacity: cap,
                gc_tried: true,
                ..plain
            });
            let verdict = run.map_or(Verdict::CannotTell, |run| verdict_of(event, run));
            let judged = gc_threshold(own_gc, verdict);
            match run {
                Some(run) if own_gc.is_none() => from_checkpoint(judged, &[run]),
                _ => judged,
            }
        });
        remedies.push(history_gc.unwrap_or_else(|| gc_threshold_verdict(capped, beyond.clone())));
        // Expandable segments with the GC threshold as well: PyTorch unmaps every free page
        // and retries before it raises, so at the OOM the threshold changes nothing that
        // expandable segments alone would not; its verdict is theirs.
        if let Some(alone) = remedies
            .iter()
            .find(|r| r.remedy == "expandable_segments:True" && !settings.expandable_segments)
            .cloned()
        {
            remedies.push(RemedyVerdict::new(
                "expandable_segments:True,garbage_collection_threshold:0.6",
                alone.verdict,
                format!(
                    "as expandable_segments:True alone (PyTorch unmaps every free page and \
                     retries before it raises, whatever the threshold): {}",
                    alone.reason
                ),
            ));
        }
        remedies.push(empty_cache_verdict(Some(released)));
        let marks_before = step_marks.iter().filter(|&&at| at < event).count();
        let between = (replay_fails_there && beyond.is_none() && marks_before > 0).then(|| {
            let run = Run {
                empty_steps: true,
                ..plain
            };
            from_checkpoint(between_steps(verdict_of(event, run), marks_before), &[run])
        });
        remedies.push(between.unwrap_or_else(|| {
            remedy::empty_cache_between_steps(beyond_any_setting(
                oom.allocated_bytes.saturating_add(needed),
                bounds.high,
            ))
        }));
        out.push(OomRemedies {
            event,
            remedies,
            from_history: true,
            what_would_fit: None,
        });
    }
    Ok(out)
}

/// "3.2 s before the OOM", or "before the OOM" where the times are not known.
fn checkpoint_age(cp: &crate::Checkpoint, trace: &Trace) -> String {
    let at = trace.stats.kept_oom.as_ref().map_or(0, |k| k.time_us);
    if cp.time_us > 0 && at >= cp.time_us {
        format!("{:.1} s before the OOM", (at - cp.time_us) as f64 / 1e6)
    } else {
        "before the OOM".to_string()
    }
}

/// The `roundup_power2_divisions` tried (PyTorch's value for every size interval).
const ROUNDUP_TRIED: u32 = 4;

/// Where a replay from a checkpoint starts: the blocks live then, where PyTorch had them
/// (`AsFound`: its segments adopted, free parts and all); packed into a fresh allocator in
/// address order (`Packed`); or, for expandable segments, each large block grown to whole
/// pages plus one (`Padded`: a block can touch at most that many pages wherever it lies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    AsFound,
    Packed,
    Padded,
}

/// The traces each `Start` replays (only made for a trace that begins at a checkpoint).
struct Starts {
    packed: Option<Trace>,
    padded: Option<Trace>,
}

impl Starts {
    fn of(trace: &Trace, from_checkpoint: bool) -> Starts {
        if !from_checkpoint {
            return Starts {
                packed: None,
                padded: None,
            };
        }
        let packed = Trace {
            initial_segments: Vec::new(),
            ..trace.clone()
        };
        let mut padded = packed.clone();
        for b in &mut padded.initial {
            if b.size >= EXPANDABLE_PAGE / 2 {
                b.size = (b.size.div_ceil(EXPANDABLE_PAGE) + 1) * EXPANDABLE_PAGE;
            }
        }
        Starts {
            packed: Some(packed),
            padded: Some(padded),
        }
    }

    fn trace<'a>(&'a self, own: &'a Trace, start: Start) -> &'a Trace {
        match start {
            Start::AsFound => own,
            Start::Packed => self.packed.as_ref().unwrap_or(own),
            Start::Padded => self.padded.as_ref().unwrap_or(own),
        }
    }

    /// The variants of `run` its verdict must agree across, `run` itself first: the job's
    /// own run is only as PyTorch had it; a remedy's from every start (from a checkpoint)
    /// under every address order.
    fn variants(&self, run: Run) -> Vec<Run> {
        if run.is_plain() {
            return vec![run];
        }
        let starts: &[Start] = match (&self.packed, run.policy) {
            (None, _) => &[Start::AsFound],
            // It cannot adopt PyTorch's segments: its own start is the packed one.
            (Some(_), PolicyKind::PytorchExpandable) => &[Start::AsFound, Start::Padded],
            (Some(_), _) => &[Start::AsFound, Start::Packed],
        };
        let mut out = vec![Run {
            start: Start::AsFound,
            addresses: AddressOrder::Trace,
            ..run
        }];
        for &start in starts {
            for addresses in ADDRESS_ORDERS {
                let v = Run {
                    start,
                    addresses,
                    ..run
                };
                if !out.contains(&v) {
                    out.push(v);
                }
            }
        }
        out
    }
}

/// The address orders a remedy's verdict must hold under: the trace's, CUDA's usual
/// top-down, bottom-up, and two scattered at random.
const ADDRESS_ORDERS: [AddressOrder; 5] = [
    AddressOrder::Trace,
    AddressOrder::Down,
    AddressOrder::Up,
    AddressOrder::Scattered(1),
    AddressOrder::Scattered(2),
];

/// PyTorch's page for expandable segments (the large pool's granularity).
const EXPANDABLE_PAGE: u64 = 2 << 20;

/// `empty_cache()` between steps, from the history replayed with the cache emptied after
/// each of the `steps` optimizer steps the hook marked before the OOM.
fn between_steps(verdict: Verdict, steps: usize) -> RemedyVerdict {
    let reason = match verdict {
        Verdict::Fits => format!(
            "the job's history replayed with the cache emptied after each of its {steps} \
             optimizer steps serves the request"
        ),
        Verdict::Fails => format!(
            "the job's history replayed with the cache emptied after each of its {steps} \
             optimizer steps still fails the request"
        ),
        Verdict::CannotTell => format!(
            "replayed with the cache emptied after each of its {steps} optimizer steps, it \
             fits at the trace's lower capacity bound only"
        ),
    };
    RemedyVerdict::new("empty_cache() between steps", verdict, reason)
}

/// `roundup_power2_divisions:4`: requests rounded up to the next quarter of a power of
/// two, so that varying sizes reuse the same blocks.
fn roundup(verdict: Verdict) -> RemedyVerdict {
    let name = format!("roundup_power2_divisions:{ROUNDUP_TRIED}");
    let reason = match verdict {
        Verdict::Fits => {
            "the job's history replayed with requests rounded as PyTorch rounds them \
                          under it serves the request"
        }
        Verdict::Fails => {
            "the job's history replayed with requests rounded as PyTorch rounds \
                           them under it still fails the request"
        }
        Verdict::CannotTell => {
            "the replay fits it at the trace's lower capacity bound only, or \
                                from one start of the checkpoint only"
        }
    };
    RemedyVerdict::new(name, verdict, reason)
}

/// The threshold tried for `garbage_collection_threshold` (the value users are told).
const GC_TRIED: f64 = 0.6;

/// One replay asked for: a policy at a capacity, with a remedy's setting.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Run {
    policy: PolicyKind,
    capacity: u64,
    max_split: Option<u64>,
    /// With `garbage_collection_threshold:0.6` (else the job's own threshold).
    gc_tried: bool,
    /// With `roundup_power2_divisions:N` for every interval (else the job's own).
    roundup: Option<u32>,
    /// With `torch.cuda.empty_cache()` after each of the job's optimizer steps.
    empty_steps: bool,
    start: Start,
    addresses: AddressOrder,
}

/// What the variants of a run disagree on (see `Starts::variants`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Disagreement {
    Start,
    Addresses,
}

impl Run {
    /// The job's own settings: the run that must fail where PyTorch failed.
    fn is_plain(&self) -> bool {
        self.policy == PolicyKind::Caching
            && self.max_split.is_none()
            && !self.gc_tried
            && self.roundup.is_none()
            && !self.empty_steps
    }
}

/// The device had room for the request's new segment: a memory fraction refused it.
fn under_a_cap(oom: &TraceOom) -> bool {
    let needed = round_size(oom.requested_bytes).unwrap_or(oom.requested_bytes);
    oom.device_free_bytes >= segment_size_for(needed)
}

/// `garbage_collection_threshold:0.6` under a memory fraction, from the history replayed
/// with PyTorch's garbage collector (`own`: the job already ran with a threshold).
fn gc_threshold(own: Option<f64>, verdict: Verdict) -> RemedyVerdict {
    const NAME: &str = "garbage_collection_threshold:0.6";
    if let Some(own) = own {
        // Its replay (the plain one) failed where PyTorch did.
        let (verdict, reason) = if own == GC_TRIED {
            (
                Verdict::Fails,
                "already on: the job ran with it".to_string(),
            )
        } else {
            (
                Verdict::CannotTell,
                format!(
                    "the job ran with garbage_collection_threshold:{own}; 0.6 was not replayed"
                ),
            )
        };
        return RemedyVerdict::new(NAME, verdict, reason);
    }
    let (verdict, reason) = match verdict {
        Verdict::Fits => (
            Verdict::Fits,
            "the job's history replayed with PyTorch's garbage collector (free cached \
             segments released once reserved passes 60 % of the cap) serves the request",
        ),
        Verdict::Fails => (
            Verdict::Fails,
            "the job's history replayed with PyTorch's garbage collector (free cached \
             segments released once reserved passes 60 % of the cap) still fails the request",
        ),
        Verdict::CannotTell => (
            Verdict::CannotTell,
            "it acts at a share of the memory cap, which this trace only bounds: give --capacity",
        ),
    };
    RemedyVerdict::new(NAME, verdict, reason)
}

/// `partial`: the trace began with blocks already live, which the replay packs (the best
/// case): then its "fits" is no answer.
fn expandable(already_on: bool, partial: bool, verdict: impl Fn() -> Verdict) -> RemedyVerdict {
    const NAME: &str = "expandable_segments:True";
    if already_on {
        return RemedyVerdict::new(
            NAME,
            Verdict::Fails,
            "already on: PyTorch unmapped every free page and retried before it raised",
        );
    }
    let (verdict, reason) = match verdict() {
        Verdict::Fits if partial => (
            Verdict::CannotTell,
            "it fits only with the blocks live at the trace's start packed tight (the best \
             case): record the job from its start",
        ),
        Verdict::Fits => (
            Verdict::Fits,
            "the job's own history replayed with PyTorch's expandable rules (20 MiB pages) \
             serves the request",
        ),
        Verdict::Fails => (
            Verdict::Fails,
            "the job's own history replayed with PyTorch's expandable rules (20 MiB pages) \
             still fails the request",
        ),
        Verdict::CannotTell => (
            Verdict::CannotTell,
            "the replay fits it at the trace's lower capacity bound only: give --capacity",
        ),
    };
    RemedyVerdict::new(NAME, verdict, reason)
}

/// The largest `max_split_size_mb` that fits for sure, else whether any might.
///
/// The values that fit are trusted when they form one run of neighbouring tried values
/// (a smaller N splits fewer large blocks: fitting below some N and failing above is what
/// the allocator's rules give). Where they are scattered, fitting, failing and fitting
/// again as N grows, a value that fits with both neighbours failing turns on the exact
/// order of the job's allocations, which is not the same from run to run: on the H100
/// PyTorch's own reruns of one seeded GPT-2 job with `max_split_size_mb:512` (the
/// replay's fits were 20 and 512) fitted once and failed once. Only a value beside
/// another that fits is then trusted.
fn max_split(verdict: &dyn Fn(u64) -> Verdict) -> RemedyVerdict {
    let verdicts: Vec<(u64, Verdict)> = MAX_SPLIT_TRIED_MB
        .iter()
        .map(|&mb| (mb, verdict(mb)))
        .collect();
    let tried = format!(
        "tried {} to {} MiB",
        MAX_SPLIT_TRIED_MB[0],
        MAX_SPLIT_TRIED_MB[MAX_SPLIT_TRIED_MB.len() - 1]
    );
    let fits = |i: usize| verdicts.get(i).is_some_and(|(_, v)| *v == Verdict::Fits);
    let fitting: Vec<String> = verdicts
        .iter()
        .filter(|(_, v)| *v == Verdict::Fits)
        .map(|(mb, _)| mb.to_string())
        .collect();
    // Runs of neighbouring values that fit: one run is trusted whole.
    let runs = (0..verdicts.len())
        .filter(|&i| fits(i) && (i == 0 || !fits(i - 1)))
        .count();
    let steady = (0..verdicts.len())
        .rev()
        .find(|&i| fits(i) && (runs == 1 || (i > 0 && fits(i - 1)) || fits(i + 1)));
    if let Some(i) = steady {
        return RemedyVerdict::new(
            format!("max_split_size_mb:{}", verdicts[i].0),
            Verdict::Fits,
            format!(
                "the job's history replayed with it serves the request (fits with N = {}; {tried})",
                fitting.join(", ")
            ),
        );
    }
    if !fitting.is_empty() {
        return RemedyVerdict::new(
            "max_split_size_mb:N",
            Verdict::CannotTell,
            format!(
                "the job's history replayed serves the request with N = {} alone, each \
                 between values that fail: the outcome turns on the exact order of the \
                 job's allocations, which varies from run to run ({tried})",
                fitting.join(", ")
            ),
        );
    }
    if verdicts.iter().any(|(_, v)| *v == Verdict::CannotTell) {
        return RemedyVerdict::new(
            "max_split_size_mb:N",
            Verdict::CannotTell,
            format!(
                "some N fit only at the trace's lower capacity bound: give --capacity ({tried})"
            ),
        );
    }
    RemedyVerdict::new(
        "max_split_size_mb:N",
        Verdict::Fails,
        format!("no value fits: the job's history replayed with each still fails ({tried})"),
    )
}

/// What PyTorch released just before it raised: the segment frees and unmaps the trace
/// recorded right before the `oom` event (`release_cached_blocks` in `malloc`).
fn released_before(trace: &Trace, event: usize) -> u64 {
    trace.events[..event.min(trace.events.len())]
        .iter()
        .rev()
        .take_while(|e| {
            matches!(
                e.kind,
                TraceEventKind::SegmentFree | TraceEventKind::SegmentUnmap
            )
        })
        .map(|e| e.size)
        .sum()
}

/// A trace of one state kept at an OOM: the live view's answers for the state it holds.
fn one_state(trace: &Trace, ooms: &[TraceOom]) -> Vec<OomRemedies> {
    let (Some(kept), Some(last)) = (&trace.stats.kept_oom, ooms.last()) else {
        return Vec::new();
    };
    let layout = snapshot::layout_at_end(trace);
    let reserved: u64 = layout.segments.iter().map(|s| s.size).sum();
    let needed = round_size(kept.requested_bytes).unwrap_or(kept.requested_bytes);
    let scene = OomScene {
        layout: &layout,
        needed,
        // Room to grow, as the live view counts it: up to the allowed maximum, no
        // further than the device had free.
        headroom: kept
            .device_free_bytes
            .min(kept.device_total_bytes.saturating_sub(reserved)),
        capped: kept.device_free_bytes >= segment_size_for(needed),
        settings: JobSettings {
            expandable_segments: trace.settings.expandable_segments
                || trace.segments_at_end.iter().any(|s| s.is_expandable),
            max_split_size: trace.settings.max_split_size,
            garbage_collection_threshold: trace.settings.garbage_collection_threshold,
        },
        released_bytes: None,
    };
    vec![OomRemedies {
        event: last.event,
        remedies: remedy::one_state(&scene, &remedy::expandable(&scene)),
        from_history: false,
        what_would_fit: Some(remedy::what_would_fit(&scene)),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LiveAtStart, TraceEvent, TraceFormat, TraceStats};

    #[test]
    fn a_max_split_that_fits_alone_between_failures_is_not_a_verdict() {
        use Verdict::{Fails, Fits};
        let only =
            |set: &'static [u64]| move |mb: u64| if set.contains(&mb) { Fits } else { Fails };
        // Alone between 256 and 1024, which fail: the order of the job's allocations
        // decides it (PyTorch fitted and failed in two runs of such a job).
        let lone = max_split(&only(&[20, 512]));
        assert_eq!(lone.verdict, Verdict::CannotTell, "{lone:?}");
        assert!(lone.reason.contains("N = 20, 512 alone"), "{lone:?}");
        // Scattered fits: the largest beside another that fits.
        let pair = max_split(&only(&[256, 512, 2048]));
        assert_eq!(
            (pair.verdict, pair.remedy.as_str()),
            (Fits, "max_split_size_mb:512")
        );
        // One run of fits, however short, is trusted whole.
        let top = max_split(&only(&[2048, 4096]));
        assert_eq!(top.remedy, "max_split_size_mb:4096");
        let smallest = max_split(&only(&[20]));
        assert_eq!(
            (smallest.verdict, smallest.remedy.as_str()),
            (Fits, "max_split_size_mb:20")
        );
        assert_eq!(max_split(&only(&[256])).verdict, Fits);
        assert_eq!(max_split(&only(&[])).verdict, Fails);
    }

    fn event(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::bare(kind, addr, size)
    }

    fn trace(initial: Vec<LiveAtStart>, events: Vec<TraceEvent>) -> Trace {
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

    /// The split-cache workload of the A/B table, recorded from its start: a 6 GiB block
    /// cached, split by 20 tensors of 304 MiB, every other freed, then 2.5 GiB asked
    /// under a 7.9 GiB cap (the device had 70 GiB free).
    fn split_cache() -> Trace {
        use TraceEventKind::*;
        let mut events = vec![
            event(Alloc, 0x1000, 6 << 30),
            event(FreeCompleted, 0x1000, 6 << 30),
        ];
        for i in 0..20u64 {
            events.push(event(Alloc, 0x10_0000 + i, 304 * MIB));
        }
        for i in (0..20u64).step_by(2) {
            events.push(event(FreeCompleted, 0x10_0000 + i, 304 * MIB));
        }
        events.push(event(Oom, 70 << 30, 2560 * MIB));
        trace(Vec::new(), events)
    }

    #[test]
    fn a_split_cache_fits_with_expandable_and_max_split_as_pytorch_did() {
        let t = split_cache();
        let ooms = crate::ooms::trace_ooms(&t);
        assert_eq!(ooms.len(), 1);
        let cap = 7900 * MIB;
        let all = remedies(&t, &ooms, Some(cap)).unwrap();
        let v: Vec<(String, Verdict)> = all[0]
            .remedies
            .iter()
            .map(|r| (r.remedy.clone(), r.verdict))
            .collect();
        // PyTorch 2.11 on an H100: expandable fits; max_split_size_mb:200 and :1000 fit;
        // garbage_collection_threshold:0.6 and empty_cache() do not. The GC never runs
        // here: every request but the last finds a cached block.
        assert_eq!(
            v[0],
            ("expandable_segments:True".into(), Verdict::Fits),
            "{v:?}"
        );
        assert_eq!(v[1].1, Verdict::Fits, "{v:?}");
        assert_eq!(v[2].1, Verdict::Fails, "{v:?}");
        assert_eq!(v[3].1, Verdict::Fails, "{v:?}");
    }

    /// Under a 1,000 MiB cap: X (300 MiB) cached whole; Y (350) and Z (320) find no block.
    /// At Z reserved (650) is past 60 % of the cap, so PyTorch's GC releases X before it
    /// maps Z's segment; without it X stays cached, the 10 MiB S splits it, and the last
    /// 300 MiB request finds no room that release_cached_blocks could make.
    fn gc_helps() -> Trace {
        use TraceEventKind::*;
        let events = vec![
            event(Alloc, 0x1, 300 * MIB),
            event(FreeCompleted, 0x1, 300 * MIB),
            event(Alloc, 0x2, 350 * MIB),
            event(Alloc, 0x3, 320 * MIB),
            event(Alloc, 0x4, 10 * MIB),
            event(Oom, 70 << 30, 300 * MIB),
        ];
        trace(Vec::new(), events)
    }

    #[test]
    fn the_gc_threshold_is_judged_by_replaying_pytorchs_garbage_collector() {
        let t = gc_helps();
        let ooms = crate::ooms::trace_ooms(&t);
        let gc = |all: &[OomRemedies]| {
            all[0]
                .remedies
                .iter()
                .find(|r| r.remedy == "garbage_collection_threshold:0.6")
                .map(|r| r.verdict)
        };
        let capped = remedies(&t, &ooms, Some(1000 * MIB)).unwrap();
        assert_eq!(gc(&capped), Some(Verdict::Fits), "{capped:?}");
        // A file the hook kept names the cap PyTorch enforced.
        let mut kept = gc_helps();
        kept.stats.kept_oom = Some(crate::KeptOom {
            requested_bytes: 300 * MIB,
            device_free_bytes: 70 << 30,
            device_total_bytes: 1000 * MIB,
            ring_complete: true,
            ..Default::default()
        });
        let ooms = crate::ooms::trace_ooms(&kept);
        let from_kept = remedies(&kept, &ooms, None).unwrap();
        assert_eq!(gc(&from_kept), Some(Verdict::Fits), "{from_kept:?}");
        // The device itself full (no memory fraction): PyTorch never runs its GC.
        let mut full = gc_helps();
        full.events.last_mut().unwrap().addr = 0;
        let ooms = crate::ooms::trace_ooms(&full);
        let uncapped = remedies(&full, &ooms, Some(1000 * MIB)).unwrap();
        assert_eq!(gc(&uncapped), Some(Verdict::Fails), "{uncapped:?}");
    }

    #[test]
    fn blocks_live_at_the_start_make_a_packed_fit_no_answer() {
        let mut t = split_cache();
        t.initial = vec![LiveAtStart {
            addr: 0x9000_0000,
            size: 8 * MIB,
            stream: 0,
            tag: None,
        }];
        let ooms = crate::ooms::trace_ooms(&t);
        let all = remedies(&t, &ooms, Some(7900 * MIB)).unwrap();
        let r = &all[0].remedies;
        assert_eq!(r[0].verdict, Verdict::CannotTell, "{r:?}");
        assert_eq!(r[1].verdict, Verdict::CannotTell, "{r:?}");
    }
}
