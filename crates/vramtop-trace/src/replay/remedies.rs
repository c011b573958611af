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

mod floor;
mod gap;
mod runs;
mod verdicts;

use super::{ReplayError, StepsBy};
use crate::ooms::{CapacitySource, TraceOom};
use crate::step_rest::{self, StepRest};
use crate::{snapshot, Checkpoint, Trace, TraceEventKind};
use runs::{Disagreement, Run, Runs, Starts, ROUNDUP_TRIED};
use vramtop_alloc::remedy::{
    self, beyond_any_setting, empty_cache_verdict, gc_threshold_verdict, JobSettings, OomScene,
    Remedy, RemedyVerdict, Verdict, WhatWouldFit, GC_THRESHOLD_TRIED,
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
    /// Judged at a capacity the user gave (`replay --capacity`), not the job's own.
    #[serde(skip)]
    pub at_given_capacity: bool,
    /// From one state only (a trace kept at the OOM without history).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_would_fit: Option<WhatWouldFit>,
    /// What the job's earlier steps say the step cut short still needed, where the
    /// verdicts replayed a history with its steps marked (`step_rest::of`): measured once,
    /// for the verdicts and the cause alike.
    #[serde(skip)]
    pub step: Option<StepRest>,
    /// The `roundup_power2_divisions` that serve the request here with too little to spare
    /// (`runs::roundup_room`): a "fits" left naming one, once the rest of the step has
    /// been judged, is open (`roundup_with_room`).
    #[serde(skip)]
    pub roundup_close: Vec<u32>,
}

impl OomRemedies {
    /// The first remedy whose verdict is "fits", as the user writes it.
    pub fn first_fit(&self) -> Option<Remedy> {
        self.remedies
            .iter()
            .find(|r| r.verdict == Verdict::Fits)
            .map(|r| r.remedy.clone())
    }

    /// Every remedy was judged and each fails: no allocator setting gets the job through,
    /// as far as its history (or its state) says, at the job's own capacity (verdicts at
    /// one the user gave say nothing of the job as it ran).
    pub fn none_fits(&self) -> bool {
        !self.at_given_capacity && vramtop_alloc::remedy::none_fits(&self.remedies)
    }
}

/// The capacities a replay is asked at: equal when given or known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CapacityBounds {
    pub low: u64,
    pub high: u64,
    pub source: CapacitySource,
}

impl CapacityBounds {
    /// Both bounds raised by `share` of themselves.
    fn with_room(self, share: f64) -> CapacityBounds {
        let raise = |b: u64| b.saturating_add((b as f64 * share) as u64);
        CapacityBounds {
            low: raise(self.low),
            high: raise(self.high),
            ..self
        }
    }

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
    let known = match (given, kept_cap(trace)) {
        (Some(c), _) => Some((c, CapacitySource::Given)),
        (None, Some(c)) => Some((c, CapacitySource::Kept)),
        (None, None) => None,
    };
    if let Some((c, source)) = known {
        return Some(CapacityBounds {
            low: c,
            high: c,
            source,
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
/// names it (what PyTorch passed its OOM observer): no need to bound it then. Not where
/// the job's history reserved more than it (a fraction lowered during the job): a replay
/// at it would stop short of the OOM, so the trace's OOMs bound the capacity instead.
pub fn kept_cap(trace: &Trace) -> Option<u64> {
    trace.stats.kept_oom.as_ref().and_then(|k| {
        let needed = round_size(k.requested_bytes).unwrap_or(k.requested_bytes);
        let capped = k.device_free_bytes >= segment_size_for(needed);
        let held = crate::ooms::peak_reserved(trace);
        (capped && k.device_total_bytes > 0 && k.device_total_bytes >= held)
            .then_some(k.device_total_bytes)
    })
}

/// Every remedy at each of the trace's OOMs (`ooms` is `ooms::trace_ooms(trace)`).
pub fn remedies(
    trace: &Trace,
    ooms: &[TraceOom],
    given: Option<u64>,
) -> Result<Vec<OomRemedies>, ReplayError> {
    let Some(bounds) = capacity_bounds(trace, ooms, given) else {
        return Ok(Vec::new());
    };
    // The job's steps, found once: every run of its judgement empties the cache at them,
    // and the step cut short is carried on from them (`steps` reads the whole history).
    let steps = super::steps(trace);
    let answers = judged(trace, ooms, bounds, None, &steps)?;
    // A kept history whose gap hid the job's own segment decisions: each verdict again from
    // the state after that gap, at the same capacities, and given only where both agree.
    let answers = match gap::begun_after(trace) {
        Some(after) => {
            let after_ooms = crate::ooms::trace_ooms(&after);
            let again = judged(&after, &after_ooms, bounds, None, &super::steps(&after))?;
            gap::agreed(answers, &again, trace)
        }
        None => answers,
    };
    // Last, the fits that are left, through the rest of the step.
    let answers = through_the_rest(trace, answers, bounds, &steps)?;
    let answers = roundup_with_room(answers);
    let answers = inside_an_accumulating_first_step(trace, answers, &steps);
    let mut answers = split_open_under_graphs(trace, answers);
    for answer in &mut answers {
        answer.at_given_capacity = given.is_some();
    }
    Ok(answers)
}

/// Each `roundup_power2_divisions` "fits" left once the rest of the step has been judged,
/// open where the N it names served the request with too little to spare (a "fails" the
/// rest of the step gave stands: the close N got through the request only).
fn roundup_with_room(mut answers: Vec<OomRemedies>) -> Vec<OomRemedies> {
    for oom in &mut answers {
        for r in &mut oom.remedies {
            if let Remedy::RoundupPower2Divisions(Some(n)) = r.remedy {
                if r.verdict == Verdict::Fits && oom.roundup_close.contains(&n) {
                    *r = verdicts::too_close(n);
                }
            }
        }
    }
    answers
}

/// The verdicts at the OOM the hook kept, where it saw the job inside its first step,
/// accumulating gradients (`KeptOom::accumulating`), with nothing marked
/// (`open_inside_accumulating`).
fn inside_an_accumulating_first_step(
    trace: &Trace,
    mut answers: Vec<OomRemedies>,
    steps: &super::Steps,
) -> Vec<OomRemedies> {
    let micro = trace.stats.kept_oom.as_ref().map_or(0, |k| k.accumulating);
    if micro == 0 || steps.marked() {
        return answers;
    }
    if let Some(last) = answers.last_mut() {
        last.remedies = open_inside_accumulating(std::mem::take(&mut last.remedies), micro);
    }
    answers
}

/// Verdicts at an OOM where the hook saw the job inside its first step, accumulating
/// gradients: its model's forward ran `micro` more times after a backward whose gradients
/// it left untouched, and no step was marked. A "fits" serves the request and may get
/// through this micro-batch, but the micro-batches still to come in the step are not in
/// the history, nor their sizes: it is left open. A GPT-2 accumulating 8 micro-batches of
/// 2 to 9 sequences (H200, PyTorch 2.11, an 8.15 GiB cap) ran out in the fifth; the replay
/// served the request with expandable segments and max_split 20 to 256, carried on as the
/// fourth went on, and PyTorch, run with each, ran out in a later one. `empty_cache()
/// between steps`: no step had ended, so the job would run as it did, but a "fails" from
/// that alone would rest on the hook's reading of the gradients, so it is left open too.
pub fn open_inside_accumulating(remedies: Vec<RemedyVerdict>, micro: u64) -> Vec<RemedyVerdict> {
    if micro == 0 {
        return remedies;
    }
    let why = format!(
        "it serves this request, but the hook saw the job inside its first step, \
         accumulating gradients (its model's forward ran {micro} more time(s) after a \
         backward whose gradients it left untouched, and no optimizer step was marked): how \
         many more micro-batches the step has, and how large, is not in its history"
    );
    overturn(remedies, &[Verdict::Fits], Verdict::CannotTell, &why)
        .into_iter()
        .map(|r| {
            if r.remedy != Remedy::EmptyCacheBetweenSteps || r.verdict == Verdict::Fails {
                return r;
            }
            RemedyVerdict::new(
                Remedy::EmptyCacheBetweenSteps,
                Verdict::CannotTell,
                format!(
                    "no step was marked before the OOM, and the hook saw the job's model run \
                     its forward {micro} more time(s) after a backward whose gradients it \
                     left untouched: accumulating gradients, no step had ended, and the job \
                     would run as it did; the hook's reading of the gradients is all that \
                     says so"
                ),
            )
        })
        .collect()
}

/// Where the job holds CUDA graphs' private pools, a `max_split_size_mb` that fits is left
/// open: under it PyTorch gives back oversize cached blocks of the request's own pool even
/// while a graph is captured, which the replay does not follow. An MLP trained by
/// captured graphs under 12 GiB (H200, 2.11): with N = 20 PyTorch aborted the capture
/// (`cudaErrorStreamCaptureInvalidated`), with N = 64 it ran out, where the replay served
/// both. A setting that fails stays failed: an aborted capture does not get through either.
fn split_open_under_graphs(trace: &Trace, mut answers: Vec<OomRemedies>) -> Vec<OomRemedies> {
    let pools: std::collections::BTreeSet<_> = trace
        .segments_at_end
        .iter()
        .map(|s| s.stream)
        .chain(trace.initial_segments.iter().map(|s| s.stream))
        .filter(|&s| vramtop_alloc::in_graph_pool(s))
        .collect();
    if pools.is_empty() {
        return answers;
    }
    let why = format!(
        "the job holds {} CUDA graph pool(s): under max_split_size_mb PyTorch gives back \
         oversize cached blocks of a pool even while its graph is captured, which can abort \
         the capture (cudaErrorStreamCaptureInvalidated) or leave it short, and vramtop's \
         replay does not follow it there",
        pools.len()
    );
    for r in answers.iter_mut().flat_map(|a| a.remedies.iter_mut()) {
        if matches!(r.remedy, Remedy::MaxSplitSizeMb(_)) && r.verdict == Verdict::Fits {
            *r = RemedyVerdict::new(
                Remedy::MaxSplitSizeMb(None),
                Verdict::CannotTell,
                why.clone(),
            );
        }
    }
    answers
}

/// Each "fits" at the OOM the job died of, carried on through the rest of its step as the
/// earlier step most like it went on past the same point (`step_rest::carried_on`), and
/// kept only where that replay gets through too. Serving the refused request is not
/// getting through the step: on a GPT-2 with activation checkpointing (H200, PyTorch 2.11,
/// a 12.5 GiB cap) the replays with `garbage_collection_threshold:0.6` and
/// `max_split_size_mb:2048` served the refused 3.06 GiB, and PyTorch, run with them, did
/// too and then failed the next 3.06 GiB request 14 allocations on, in the same step,
/// with 5.6 GiB free in its cache; expandable segments got through.
fn through_the_rest(
    trace: &Trace,
    mut answers: Vec<OomRemedies>,
    bounds: CapacityBounds,
    steps: &super::Steps,
) -> Result<Vec<OomRemedies>, ReplayError> {
    let Some(last) = answers.last_mut() else {
        return Ok(answers);
    };
    let died_there = !trace.events[last.event + 1..]
        .iter()
        .any(|e| e.kind == TraceEventKind::Alloc);
    // A row the growths left open is carried on as the fits are, by the likest step
    // whatever it grew: the least growth is a share of the working memory, which a step
    // of another size says little of; the likest step's rest at its own sizes is the
    // bytes this larger step asks at least. A Llama trained through accelerate under
    // 8.5 GiB (eager attention; H100, PyTorch 2.11) grew 1.17 to 1.34 times past the
    // point; the least came from a step 2.8 times smaller, and carried on by it every
    // setting got through, where PyTorch failed them all; the likest step (1.27 times
    // smaller, it grew 1.29 times) ran each out at both sizes.
    let carried_on = |r: &RemedyVerdict| r.verdict == Verdict::Fits || open_for_the_step(r);
    if !(died_there && last.remedies.iter().any(carried_on)) {
        return Ok(answers);
    }
    // A job whose steps are known (marked, or its rounds) is carried on as its likest
    // earlier step went on (`rest`: that step's rest, for the least it would ask). One
    // that marked none, where its rounds do not carry it on (none found, no round like
    // this one, or refused at the round's first request), as it went on just before
    // (`step_rest::repeated`), and its fits are left open where that finds no round.
    let likest = if steps.at.is_empty() {
        None
    } else {
        last.step.and_then(|rest| {
            step_rest::carried_on(trace, &rest, last.event, step_rest::Sizes::Scaled)
        })
    };
    let (carried, on, rest) = match likest {
        Some(carried) if steps.marked() => (Some(carried), LIKEST, last.step),
        Some(carried) => (Some(carried), LIKEST_ROUND, last.step),
        None if steps.marked() => (None, LIKEST, last.step),
        None => {
            let repeated = step_rest::repeated(trace, last.event);
            if repeated.is_none() {
                let allocations = trace.events[..last.event]
                    .iter()
                    .filter(|e| e.kind == TraceEventKind::Alloc)
                    .count();
                if allocations >= LOOP_ALLOCATIONS {
                    // Marks the job made that fall outside its kept history are not "no
                    // steps".
                    let marked = trace
                        .stats
                        .kept_oom
                        .as_ref()
                        .is_some_and(|k| !k.steps_us.is_empty() || !k.passes_us.is_empty());
                    last.remedies =
                        unmarked_loop(std::mem::take(&mut last.remedies), allocations, marked);
                }
            }
            (repeated, REPEATED, None)
        }
    };
    let Some(carried) = carried else {
        return Ok(answers);
    };
    // Only the runs of the remedies that fit, or that the step's growth left open, are
    // asked again (and the job's own).
    let fitting: Vec<Remedy> = last
        .remedies
        .iter()
        .filter(|r| carried_on(r))
        .map(|r| r.remedy.clone())
        .collect();
    let more = carried.events.len().saturating_sub(last.event + 2);
    let Some(through_end) = judged_at_end(carried, bounds, &fitting)? else {
        return Ok(answers);
    };
    let through = through_end.remedies;
    // Where the step carried on runs a remedy out, the same step at the pattern's own
    // sizes (the least it would ask): run out there too, with LEAST_ROOM more than the
    // cap, the remedy fails (`LEAST`); only at the cap, it is too close to call.
    let ran_out = failing(&through, &fitting);
    let least = match rest {
        Some(rest) if !ran_out.is_empty() && steps_allocate_alike(trace, steps) => {
            least_through(trace, &rest, last.event, bounds, &ran_out)?
        }
        _ => Least::default(),
    };
    last.remedies = carried_through(
        std::mem::take(&mut last.remedies),
        &through,
        &least,
        more,
        on,
    );
    // A roundup "fits" may now name the N that got through the step's end: close there,
    // it is as open as one close at the request (`roundup_with_room`).
    last.roundup_close.extend(through_end.roundup_close);
    Ok(answers)
}

/// The verdicts of `only` at the end of a trace carried on past the OOM (its last `oom`),
/// or None where it has no end. Takes the trace: a copy of the history up to the OOM,
/// gone before another is made.
fn judged_at_end(
    carried: Trace,
    bounds: CapacityBounds,
    only: &[Remedy],
) -> Result<Option<OomRemedies>, ReplayError> {
    let ooms = crate::ooms::trace_ooms(&carried);
    let Some(end) = ooms.last() else {
        return Ok(None);
    };
    let steps = super::steps(&carried);
    let again = judged(
        &carried,
        std::slice::from_ref(end),
        bounds,
        Some(only),
        &steps,
    )?;
    Ok(again.into_iter().last())
}

/// The remedies of `among` that `through` says fail.
fn failing(through: &[RemedyVerdict], among: &[Remedy]) -> Vec<Remedy> {
    through
        .iter()
        .filter(|t| t.verdict == Verdict::Fails && among.iter().any(|r| same_kind(r, &t.remedy)))
        .map(|t| t.remedy.clone())
        .collect()
}

/// Whether two remedies are the same setting (every `max_split_size_mb` alike).
fn same_kind(a: &Remedy, b: &Remedy) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Whether the job's complete steps make about as many allocations each: the most at most
/// `ALIKE_STEPS` times the fewest. Only then does an earlier step's rest at its own sizes
/// bound what this one's rest would ask: a step whose number of allocations follows its
/// shape (a Python loop over the tokens) may have more of its rest to come than the
/// pattern had.
fn steps_allocate_alike(trace: &Trace, steps: &super::Steps) -> bool {
    let counts: Vec<usize> = steps
        .at
        .windows(2)
        .map(|w| {
            trace.events[w[0]..w[1]]
                .iter()
                .filter(|e| e.kind == TraceEventKind::Alloc)
                .count()
        })
        .collect();
    match (counts.iter().min(), counts.iter().max()) {
        (Some(&fewest), Some(&most)) if counts.len() >= 2 && fewest > 0 => {
            most as f64 <= ALIKE_STEPS * fewest as f64
        }
        _ => false,
    }
}

/// How far apart the job's steps may be in allocations for the least to bound the rest
/// (`steps_allocate_alike`). Where it was right: a GPT-2 stepped by Hugging Face's Trainer
/// (677 to 739 allocations a step), one with activation checkpointing (1,191 to 1,269).
/// Where it was wrong: a Mamba whose step is a Python loop over its tokens (7,719 to
/// 22,694; H200, 2026-11-27): expandable segments and `max_split_size_mb` "failed" there,
/// in both ends, where PyTorch fitted them.
const ALIKE_STEPS: f64 = 1.25;

/// How much more memory than the cap the least must run out under for a remedy to be said
/// to fail (`through_the_rest`). The carried step is the likest earlier step's rest, not
/// this one's, so a layout that runs out by a few MiB says nothing: a GPT-2 stepped in the
/// tutorial's order under a 10.55 GiB cap (H100, PyTorch 2.11) ran out there with the
/// cache emptied after every step, at both sizes, and got through with 51 MiB more
/// (0.5 %); PyTorch got through. At 1 %, of the fixtures and this session's GPU-kept
/// files, only a BERT's `max_split_size_mb` under 7 GiB lost a right "fails"; at 2 % four
/// more did.
const LEAST_ROOM: f64 = 0.01;

/// What the step carried on at the least it would ask says of the remedies that ran out in
/// this step's sizes (`least_through`).
#[derive(Default)]
struct Least {
    /// They run out there too, with `LEAST_ROOM` more than the cap: they fail.
    fails: Vec<Remedy>,
    /// They run out there at the cap, but get through with `LEAST_ROOM` more: too close to
    /// call. A GPT-2 stepped in the tutorial's order under 10.55 GiB got through with the
    /// cache emptied after every step (H100, PyTorch 2.11), where the replay ran out by less
    /// than 51 MiB; one whose gradients are kept (`set_to_none=False`) under 11 GiB failed
    /// `max_split_size_mb:128` and the emptied cache by 38 and 20 MiB, the fourth 1.48 GiB
    /// logits of the step refused, in every placement tried, where the replay got through
    /// with 59 MiB more (H100).
    close: Vec<Remedy>,
}

/// The remedies of `ran_out` that run out as well where the step is carried on at the
/// pattern step's own sizes (`step_rest::Sizes::Pattern`), which ask no more than the
/// sizes scaled to this step's working memory: at the cap, then those with `LEAST_ROOM`
/// more. Two ends, not a proof: the caching allocator is not monotone in its request sizes
/// (pools, split thresholds), which is why the reason says "as far as the job's history
/// says".
fn least_through(
    trace: &Trace,
    rest: &StepRest,
    event: usize,
    bounds: CapacityBounds,
    ran_out: &[Remedy],
) -> Result<Least, ReplayError> {
    // The pattern's own sizes ask less than the scaled ones only where this step works
    // with more memory than the pattern did; a step smaller than it (a fragmented cache
    // can fail one) may ask less than either, and its failures stay open.
    if rest.likest.is_none_or(|p| p.working >= rest.working) {
        return Ok(Least::default());
    }
    // The carried step is built anew for the second replay, not copied: each is a copy of
    // the history up to the OOM, and one at a time is what `judged_at_end` holds.
    let judged_under = |bounds: CapacityBounds, among: &[Remedy]| match step_rest::carried_on(
        trace,
        rest,
        event,
        step_rest::Sizes::Pattern,
    ) {
        Some(least) => Ok(judged_at_end(least, bounds, among)?
            .map(|end| end.remedies)
            .unwrap_or_default()),
        None => Ok::<_, ReplayError>(Vec::new()),
    };
    let at_the_cap = failing(&judged_under(bounds, ran_out)?, ran_out);
    if at_the_cap.is_empty() {
        return Ok(Least::default());
    }
    let with_room = judged_under(bounds.with_room(LEAST_ROOM), &at_the_cap)?;
    let fits_with_room = |r: &Remedy| {
        with_room
            .iter()
            .any(|t| t.verdict == Verdict::Fits && same_kind(&t.remedy, r))
    };
    Ok(Least {
        fails: failing(&with_room, &at_the_cap),
        // Only what the room gets through: one the replay cannot tell there stays open
        // with the step's own reason.
        close: at_the_cap
            .into_iter()
            .filter(|r| fits_with_room(r))
            .collect(),
    })
}

/// How a "fits" that the step's growth leaves open begins (`Judge::through_the_step`).
const STEP_GOES_ON: &str = "it serves this request, but the step goes on";

/// A verdict that served the request and was left open because the middle growth of the
/// earlier steps passes the cap (`Judge::through_the_step`): the step carried on decides
/// it where it runs out both in this step's sizes and at the least (`through_the_rest`).
/// A GPT-2 stepped in the tutorial's order (`zero_grad()` first; H200, PyTorch 2.11, a
/// 10.3 GiB cap) grew 1.36 to 1.58 times past the point, the middle 91 MiB over the cap,
/// and PyTorch failed every setting.
fn open_for_the_step(r: &RemedyVerdict) -> bool {
    r.verdict == Verdict::CannotTell && r.reason.starts_with(STEP_GOES_ON)
}

/// How a job with its steps marked is carried on (`step_rest::carried_on`), and what the
/// carried events' sizes are.
const LIKEST: (&str, &str) = (
    "carried on through the rest of the step as the earlier step most like it went on past \
     the same point",
    "this step's own sizes where the history shows them",
);

/// The same for a job that marked no steps, whose rounds stand in for them
/// (`rounds::inferred`).
const LIKEST_ROUND: (&str, &str) = (
    "carried on through the rest of its round as the earlier round most like it went on \
     past the same point (no step is marked in the job's history: its rounds are where its \
     memory in use came back down to what it keeps)",
    LIKEST.1,
);

/// Why a remedy that runs out in the step carried on fails: at the least the rest of the
/// step would ask, it runs out too. A job's own round repeated (`REPEATED`) has no least.
const LEAST: &str = "both in this step's sizes where the history shows them (the rest scaled \
     to its working memory) and in the earlier, smaller step's own, the least it would ask: \
     as far as the job's history says, it does not get the job through this step";

/// Why a remedy that runs out in the step carried on, at both sizes, is left open
/// (`Least::close`).
const TOO_CLOSE: &str = "both in this step's sizes where the history shows them and in the \
     earlier, smaller step's own, but there it gets through with 1 % more memory than the cap: \
     too close to call from the job's history (a setting this near the cap is not one to count \
     on)";

/// How a job with no steps marked is carried on (`step_rest::repeated`).
const REPEATED: (&str, &str) = (
    "carried on as it went on just before (its last round of allocations since its previous \
     request of this size after the same ones, once more)",
    "the round's own sizes; the job marked no steps, so where its step ends is not known",
);

/// Allocations before an OOM from which a job that marked no steps is taken for a loop,
/// whose requests after the refused one its history does not hold: a script asking once
/// makes tens or hundreds.
const LOOP_ALLOCATIONS: usize = 10_000;

/// The fits of a loop that marked no steps and whose last allocations repeat none before
/// them (`step_rest::repeated`), left open: serving the refused request says nothing of
/// the next. A T5 translating with beam search (H200, PyTorch 2.11, a 1.63 GiB cap) was
/// refused 433 MiB at the first token of a batch larger than any before; the replay served
/// it with `max_split_size_mb` 20 to 256, and PyTorch, run with each, served it and failed a
/// later 110 MiB in the same `generate`.
fn unmarked_loop(
    remedies: Vec<RemedyVerdict>,
    allocations: usize,
    marked: bool,
) -> Vec<RemedyVerdict> {
    let steps = if marked {
        "whose step marks fall outside its kept history"
    } else {
        "that marked no steps"
    };
    let advice = if marked {
        ""
    } else {
        " (a loop that marks each step with vramtop.step() has the rest of its step judged)"
    };
    let why = format!(
        "it serves this request, but the job, {allocations} allocations in, is a loop \
         {steps}, and no earlier round of its allocations led up to this request: what it \
         asks next is not in its history{advice}"
    );
    remedies
        .into_iter()
        .map(|r| match (r.verdict, r.remedy) {
            (Verdict::Fits, remedy) => {
                RemedyVerdict::new(remedy.unnamed(), Verdict::CannotTell, &why)
            }
            (verdict, remedy) => RemedyVerdict {
                verdict,
                remedy,
                ..r
            },
        })
        .collect()
}

/// A "fits" kept where the same remedy fits the carried-on trace's end as well; "fails"
/// where it runs out there and in the step carried on at the pattern's own sizes too, with
/// LEAST_ROOM more than the cap (`least.fails`); open with TOO_CLOSE where it gets
/// through there only with that room (`least.close`); else open. A row the step's growth
/// left open stays as it was unless it fails. `on`: how it was carried on, and what its
/// sizes are.
fn carried_through(
    remedies: Vec<RemedyVerdict>,
    through: &[RemedyVerdict],
    least: &Least,
    events: usize,
    (on, sizes): (&str, &str),
) -> Vec<RemedyVerdict> {
    remedies
        .into_iter()
        .map(|r| {
            if r.verdict != Verdict::Fits && !open_for_the_step(&r) {
                return r;
            }
            let kind = std::mem::discriminant(&r.remedy);
            let Some(t) = through
                .iter()
                .find(|t| std::mem::discriminant(&t.remedy) == kind)
            else {
                return r;
            };
            if r.verdict == Verdict::CannotTell {
                // Left open by the step's growth: decided only where it runs out both ways.
                if t.verdict != Verdict::Fails
                    || !least.fails.iter().any(|l| same_kind(l, &r.remedy))
                {
                    return r;
                }
            } else if t.verdict == Verdict::Fits {
                // A setting tried at several values: those that get through the step, not
                // only the request.
                let kept = if r.remedy.names_a_value() { t } else { &r };
                return RemedyVerdict::new(
                    kept.remedy.clone(),
                    Verdict::Fits,
                    format!("{}; so does the job {on}", kept.reason),
                );
            }
            let remedy = r.remedy.unnamed();
            if t.verdict == Verdict::Fails && least.fails.iter().any(|l| same_kind(l, &remedy)) {
                let why = format!(
                    "it serves this request, but {on} ({events} more events), the job runs out \
                     of memory before the step's end, {LEAST}"
                );
                return RemedyVerdict::new(remedy, Verdict::Fails, why);
            }
            if t.verdict == Verdict::Fails && least.close.iter().any(|l| same_kind(l, &remedy)) {
                let why = format!(
                    "it serves this request, but {on} ({events} more events), the job runs out \
                     of memory before the step's end, {TOO_CLOSE}"
                );
                return RemedyVerdict::new(remedy, Verdict::CannotTell, why);
            }
            let outcome = if t.verdict == Verdict::Fails {
                "runs out of memory before the step's end"
            } else {
                "may run out before the step's end"
            };
            let why = format!(
                "it serves this request, but {on} ({events} more events, {sizes}), the job \
                 {outcome}: whether it gets through this step is not in its history"
            );
            RemedyVerdict::new(remedy, Verdict::CannotTell, why)
        })
        .collect()
}

/// Every remedy at each OOM, at the capacities `bounds`.
/// `carried`: the trace is one `step_rest::carried_on` made, judged at its end as replayed
/// (the rest of its step is in it), for these remedies only. `steps`: the trace's own
/// (`replay::steps`), found once by the caller.
fn judged(
    trace: &Trace,
    ooms: &[TraceOom],
    bounds: CapacityBounds,
    carried: Option<&[Remedy]>,
    steps: &super::Steps,
) -> Result<Vec<OomRemedies>, ReplayError> {
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
        .and_then(|kept| kept.checkpoint.as_ref());
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
        return Ok(kept_state(trace, ooms));
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
    let gc_tried_at = gc_cap.filter(|_| capped_any && own_gc.is_none());
    let asked = runs::asked(settings, bounds, !steps.at.is_empty(), gc_tried_at, &starts)
        .into_iter()
        .filter(|run| carried.is_none_or(|only| run.is_plain() || run.judges_any(only)))
        .collect();
    let runs = Runs::done(trace, &starts, bounds, own_gc, &steps.at, asked)?;
    let judge = Judge {
        trace,
        runs: &runs,
        checkpoint,
        plain: Run::plain(bounds.low),
        high: bounds.high,
        live_at_start,
        own_gc,
        gc_cap,
        step_marks: &steps.at,
        steps_by: steps.by,
        carried: carried.is_some(),
    };
    Ok(ooms.iter().map(|oom| judge.oom(oom)).collect())
}

/// One OOM's verdicts, read off the runs done: a function per remedy.
struct Judge<'a> {
    trace: &'a Trace,
    runs: &'a Runs<'a>,
    checkpoint: Option<&'a Checkpoint>,
    /// The job's own run, at the low capacity bound.
    plain: Run,
    /// The high capacity bound.
    high: u64,
    /// Blocks live when the trace began (none from a checkpoint's own start).
    live_at_start: usize,
    /// The job's own GC threshold, where PyTorch acted on it.
    own_gc: Option<f64>,
    /// The cap the GC threshold is replayed at, where known.
    gc_cap: Option<u64>,
    /// Where the job's steps fall in the events.
    step_marks: &'a [usize],
    /// How they were found: marked, the model's passes, or the job's rounds.
    steps_by: StepsBy,
    /// The trace carries the step on past its OOM (`through_the_rest`): its verdicts are
    /// the replays', not measured against the step's rest again.
    carried: bool,
}

/// One OOM, as a remedy's verdict is judged at it.
struct At {
    event: usize,
    /// The replay of the job's own settings fails where PyTorch failed: only then do the
    /// other runs' answers mean anything.
    replay_fails_there: bool,
    /// Why no setting fits it (the live tensors and the request exceed the high bound).
    beyond: Option<String>,
    capped: bool,
    /// The trace began with blocks already live and no checkpoint of where they were.
    partial: bool,
}

impl Judge<'_> {
    fn oom(&self, oom: &TraceOom) -> OomRemedies {
        let needed = round_size(oom.requested_bytes).unwrap_or(oom.requested_bytes);
        let at = At {
            event: oom.event,
            replay_fails_there: self.runs.fails(oom.event, self.plain) == Some(true),
            beyond: beyond_any_setting(oom.live_bytes.saturating_add(needed), self.high),
            capped: under_a_cap(oom),
            partial: self.live_at_start > 0 && self.checkpoint.is_none(),
        };
        let settings = &self.trace.settings;
        let roundup_close = self.roundup_close(&at);
        let mut remedies = Vec::new();
        if at.replay_fails_there {
            remedies.push(self.expandable(&at));
            remedies.push(self.max_split(&at));
            if !at.partial && settings.roundup_power2_divisions == [0; 16] {
                remedies.push(self.roundup(&at, &roundup_close));
            }
        } else {
            let why = "vramtop's replay of this trace does not fail where PyTorch failed, so \
                       it cannot judge remedies here";
            remedies.push(RemedyVerdict::new(
                Remedy::ExpandableSegments,
                Verdict::CannotTell,
                why,
            ));
            remedies.push(RemedyVerdict::new(
                Remedy::MaxSplitSizeMb(None),
                Verdict::CannotTell,
                why,
            ));
        }
        remedies.push(self.gc_threshold(&at));
        if let Some(both) = expandable_with_gc(&remedies, settings.expandable_segments) {
            remedies.push(both);
        }
        remedies.push(empty_cache_verdict(Some(released_before(
            self.trace, at.event,
        ))));
        remedies.push(self.between_steps(&at));
        if self.carried {
            return OomRemedies {
                event: at.event,
                remedies,
                from_history: true,
                at_given_capacity: false,
                what_would_fit: None,
                step: None,
                roundup_close,
            };
        }
        let step = step_rest::of(self.trace, self.step_marks, oom.event);
        let remedies = self.past_this_request(oom, needed, step.as_ref(), remedies);
        OomRemedies {
            event: at.event,
            remedies,
            from_history: true,
            at_given_capacity: false,
            what_would_fit: None,
            step,
            roundup_close,
        }
    }

    /// Each "fits" kept only where the job could go on from it. The history ends at the
    /// OOM, so whether the allocations after it fit is not in it: what the job did before
    /// says how much more it would need, by two measures (`floor`, `step_rest`).
    fn past_this_request(
        &self,
        oom: &TraceOom,
        needed: u64,
        step: Option<&StepRest>,
        remedies: Vec<RemedyVerdict>,
    ) -> Vec<RemedyVerdict> {
        // A job in its first steps (they are known) has its memory rise through them, not
        // between them: where an earlier step tells how this one goes on, that decides.
        let remedies = if step.is_some() && floor::too_few_steps(self.step_marks, oom.event) {
            remedies
        } else {
            self.past_a_rising_floor(oom, needed, remedies)
        };
        match step {
            Some(rest) => self.through_the_step(rest, remedies),
            None => remedies,
        }
    }

    /// For a job whose live memory keeps rising (`floor::rising`), a "fits" only where what
    /// the request leaves under the cap covers the floor's rise over the last tenth of its
    /// history.
    fn past_a_rising_floor(
        &self,
        oom: &TraceOom,
        needed: u64,
        remedies: Vec<RemedyVerdict>,
    ) -> Vec<RemedyVerdict> {
        if !remedies.iter().any(|r| r.verdict == Verdict::Fits) {
            return remedies;
        }
        let Some(rise) = floor::rising(self.trace, oom.event) else {
            return remedies;
        };
        let left = self
            .plain
            .capacity
            .saturating_sub(oom.live_bytes.saturating_add(needed));
        if left >= rise.last_tenth {
            return remedies;
        }
        let why = format!(
            "it serves this request, but the job's live memory keeps rising (its low point \
             rose in each of the last three tenths of its history, by {} the last time, to \
             {}), and as little as {} would be left under the cap: the job may run out again \
             soon after, and whether it gets through this step is not in its history",
            human_bytes(rise.last_tenth),
            human_bytes(rise.floor),
            human_bytes(left)
        );
        overturn(remedies, &[Verdict::Fits], Verdict::CannotTell, &why)
    }

    /// For a job whose steps the hook marked, a "fits" only where the step cut short could
    /// end under the cap, as the earlier steps that reached the same point grew past it
    /// (`step_rest::of`). Where even the least of them passes the high bound, scaled and
    /// unscaled, every verdict not already "fails" fails, whatever the setting (memory in
    /// use is the job's, not the allocator's); where the middle one passes the low bound a
    /// "fits" is left open.
    fn through_the_step(
        &self,
        rest: &StepRest,
        remedies: Vec<RemedyVerdict>,
    ) -> Vec<RemedyVerdict> {
        if remedies.iter().all(|r| r.verdict == Verdict::Fails) {
            return remedies;
        }
        let which = if rest.identified {
            "that allocated as much at the same point (as many allocations into the step, or \
             a few more or fewer after blocks like this step's, against the memory then in \
             use)"
        } else {
            "that reached as many allocations (too few allocated as much there to tell which \
             operation the request was)"
        };
        let grew = if rest.first_step {
            // The first marked step: the job's first, from its start, stands in.
            format!(
                "{STEP_GOES_ON}: the job's first step, from its start, which allocated as \
                 much at the same point, grew past it to {:.2} times the memory it worked \
                 with there{}",
                rest.growth,
                if rest.most_growth > rest.growth {
                    format!(
                        " ({:.2} with what it made and freed at once)",
                        rest.most_growth
                    )
                } else {
                    String::new()
                }
            )
        } else {
            format!(
                "{STEP_GOES_ON}: the {} earlier step(s) {which} grew past it to {:.2} to {:.2} \
                 times the memory they worked with there",
                rest.steps, rest.growth, rest.most_growth
            )
        };
        let at = |growth: f64, peak: u64, cap: u64| {
            format!(
                "{} held at the step's start plus {growth:.2} times the {} it worked with at \
                 the OOM: {} in use, {} over {}",
                human_bytes(rest.floor),
                human_bytes(rest.working),
                human_bytes(peak),
                human_bytes(peak.saturating_sub(cap)),
                if self.plain.capacity == self.high {
                    format!("the cap of {}", human_bytes(cap))
                } else if cap == self.high {
                    format!("the cap's high bound of {}", human_bytes(cap))
                } else {
                    format!("the cap's low bound of {}", human_bytes(cap))
                }
            )
        };
        if rest.passes(self.high) {
            let bound = if rest.unscaled_peak > self.high {
                format!(
                    "and {} rise in bytes, unscaled, {} in use",
                    if rest.first_step {
                        "its"
                    } else {
                        "the largest of them's"
                    },
                    human_bytes(rest.unscaled_peak)
                )
            } else {
                // `StepRest::proportional`: the rise follows the step's size.
                "and they grew alike whatever their size, so none of the rise is fixed".to_string()
            };
            let why = format!(
                "{grew}; even the least makes this step {}, {bound}: whatever the allocator's \
                 settings",
                at(rest.growth, rest.peak, self.high),
            );
            return overturn(
                remedies,
                &[Verdict::Fits, Verdict::CannotTell],
                Verdict::Fails,
                &why,
            );
        }
        if rest.typical_peak > self.plain.capacity {
            let why = format!(
                "{grew}; the middle of {} makes this step {}: whether it ends under the cap \
                 is not in the job's history",
                if rest.identified {
                    "those about this step's size"
                } else {
                    "them"
                },
                at(rest.typical_growth, rest.typical_peak, self.plain.capacity)
            );
            return overturn(remedies, &[Verdict::Fits], Verdict::CannotTell, &why);
        }
        remedies
    }

    /// `expandable_segments:True`: the history replayed through PyTorch's expandable rules.
    fn expandable(&self, at: &At) -> RemedyVerdict {
        let run = Run {
            policy: PolicyKind::PytorchExpandable,
            ..self.plain
        };
        let verdict =
            verdicts::expandable(self.trace.settings.expandable_segments, at.partial, || {
                self.runs.verdict(at.event, run)
            });
        self.sourced(at, verdict, &[run])
    }

    /// `max_split_size_mb:N`, each N of `MAX_SPLIT_TRIED_MB` replayed.
    fn max_split(&self, at: &At) -> RemedyVerdict {
        if at.partial {
            return RemedyVerdict::new(
                Remedy::MaxSplitSizeMb(None),
                Verdict::CannotTell,
                format!(
                    "the trace begins with {} blocks already live, placed under the job's \
                     own setting: record the job from its start",
                    self.live_at_start
                ),
            );
        }
        let run = |mb: u64| Run {
            max_split: Some(mb * MIB),
            ..self.plain
        };
        let runs: Vec<Run> = MAX_SPLIT_TRIED_MB.iter().map(|&mb| run(mb)).collect();
        let verdict = verdicts::max_split(&|mb| self.runs.verdict(at.event, run(mb)));
        self.sourced(at, verdict, &runs)
    }

    /// `roundup_power2_divisions:N`, each N of `ROUNDUP_TRIED` replayed with requests
    /// rounded as PyTorch rounds them under it; `close`: those that fit with too little to
    /// spare (`roundup_close`).
    fn roundup(&self, at: &At, close: &[u32]) -> RemedyVerdict {
        let runs: Vec<Run> = ROUNDUP_TRIED.iter().map(|&n| self.rounded(n)).collect();
        let verdict = verdicts::roundup(&|n| {
            (
                self.runs.verdict(at.event, self.rounded(n)),
                close.contains(&n),
            )
        });
        self.sourced(at, verdict, &runs)
    }

    /// The job's own run with `roundup_power2_divisions:n`.
    fn rounded(&self, n: u32) -> Run {
        Run {
            roundup: Some(n),
            ..self.plain
        }
    }

    /// The `roundup_power2_divisions` tried that serve the request at `at`, but not with
    /// `roundup_room` less.
    fn roundup_close(&self, at: &At) -> Vec<u32> {
        if !at.replay_fails_there {
            return Vec::new();
        }
        ROUNDUP_TRIED
            .into_iter()
            .filter(|&n| {
                let run = self.rounded(n);
                self.runs.verdict(at.event, run) == Verdict::Fits
                    && !self.runs.fits_with_room(at.event, run)
            })
            .collect()
    }

    /// `garbage_collection_threshold:0.6`: replayed with PyTorch's garbage collector where
    /// a memory fraction stopped the request and the cap is known, else one state's rules.
    fn gc_threshold(&self, at: &At) -> RemedyVerdict {
        let replayable = at.replay_fails_there
            && at.capped
            && at.beyond.is_none()
            && (self.live_at_start == 0 || self.checkpoint.is_some());
        if !replayable {
            return gc_threshold_verdict(at.capped, at.beyond.clone());
        }
        let run = self.gc_cap.map(|cap| Run {
            gc_tried: true,
            ..Run::plain(cap)
        });
        let verdict = run.map_or(Verdict::CannotTell, |run| self.runs.verdict(at.event, run));
        let judged = verdicts::gc_threshold(self.own_gc, verdict);
        match run {
            Some(run) if self.own_gc.is_none() => self.sourced(at, judged, &[run]),
            _ => judged,
        }
    }

    /// `empty_cache()` after each optimizer step the hook marked before the OOM, or each
    /// round, where the job marked none (`replay::steps`).
    fn between_steps(&self, at: &At) -> RemedyVerdict {
        // A step begun by the refused request counts (the cache is emptied before it).
        let steps = self.step_marks.iter().filter(|&&m| m <= at.event).count();
        if !at.replay_fails_there || at.beyond.is_some() {
            return remedy::empty_cache_between_steps(at.beyond.clone());
        }
        if steps == 0 && self.before_any_step() {
            return RemedyVerdict::new(
                Remedy::EmptyCacheBetweenSteps,
                Verdict::Fails,
                "the job ran out in its first pass through its model (the hook saw no \
                 optimizer step and no model's forward run twice before the OOM): no step \
                 had ended where the cache would be emptied, so the job runs as it did",
            );
        }
        if steps == 0 {
            return RemedyVerdict::new(
                Remedy::EmptyCacheBetweenSteps,
                Verdict::CannotTell,
                "the job marked no steps before the OOM, and its memory in use did not come \
                 back down to what it keeps in enough rounds to stand in for them, so its \
                 history has no place to empty the cache at (the hook marks each torch \
                 optimizer step; a loop without one marks its own with vramtop.step())",
            );
        }
        let run = Run {
            empty_steps: true,
            ..self.plain
        };
        let verdict =
            verdicts::between_steps(self.runs.verdict(at.event, run), steps, self.steps_by);
        self.sourced(at, verdict, &[run])
    }

    /// Whether the job died before any step of its ended: the hook marked no optimizer
    /// step, and the job was still in its first pass through its models (`Roles::
    /// first_pass`: no root module's forward had run twice). Emptying the cache after each
    /// step then changes nothing before the OOM. A compiled GPT-2 of one batch shape under
    /// 8.13 GiB ran out in its first step (H200, PyTorch 2.11), and PyTorch, run emptying
    /// the cache after every step, ran out there too; vramtop had told the user to mark
    /// steps with `vramtop.step()`, which would have settled nothing.
    fn before_any_step(&self) -> bool {
        // The history from the job's start: a hook started later saw a later pass first.
        let from_start = self.live_at_start == 0 && self.checkpoint.is_none();
        from_start
            && self.trace.stats.kept_oom.as_ref().is_some_and(|kept| {
                kept.steps_us.is_empty() && kept.roles.as_ref().is_some_and(|r| r.first_pass)
            })
    }

    /// A replayed verdict with where it came from: a checkpoint, and for one left open,
    /// what its runs' variants disagree on.
    fn sourced(&self, at: &At, verdict: RemedyVerdict, runs: &[Run]) -> RemedyVerdict {
        let mut r = verdict;
        let since = at.event.min(self.trace.events.len());
        let split = runs
            .iter()
            .find_map(|&run| self.runs.disagreement(at.event, run));
        let diverged = runs
            .iter()
            .filter_map(|&run| self.runs.diverged(at.event, run))
            .min_by_key(|c| c.event);
        if let (Verdict::CannotTell, Some(caught), false) = (r.verdict, diverged, at.partial) {
            // Left open because the job run so goes another way: no flag, no cap settles it.
            r.missing = None;
            r.reason = format!(
                "under it the job could have been given the {} it was refused at event {} \
                 and went on without (an OOM it caught), and gone another way from there, \
                 which its history does not hold: cuDNN, given a convolution's workspace, \
                 keeps that algorithm and asks for it again; a batch-size finder keeps the \
                 larger batch",
                human_bytes(caught.requested_bytes),
                caught.event
            );
            return r;
        }
        if r.verdict == Verdict::CannotTell {
            if split.is_some() || self.plain.capacity == self.high {
                // The variants disagree whatever the cap, or the cap is known already:
                // giving it would settle nothing.
                r.missing = None;
            }
            match (split, self.checkpoint) {
                (Some(Disagreement::Start), Some(cp)) => {
                    r.reason = format!(
                        "the blocks live at the hook's checkpoint ({}) decide it: the \
                         {since} events since, replayed with those blocks where PyTorch \
                         had them and with them packed anew, give different answers",
                        checkpoint_age(cp, self.trace)
                    );
                }
                (Some(Disagreement::Addresses), _) => {
                    r.reason = "it turns on where CUDA would place the new segments \
                                (PyTorch takes the lowest of equal free blocks): the \
                                replays under the two address orders, the job's own \
                                segment addresses and where CUDA's driver would put \
                                each new segment, give different answers, \
                                and vramtop's model of CUDA's placement cannot decide \
                                between them (PyTorch's own outcome may turn on it too)"
                        .to_string();
                }
                _ => {}
            }
        } else if let Some(cp) = self.checkpoint {
            r.reason = format!(
                "{} (from the hook's checkpoint {} and the {since} events since, with \
                 the blocks live then where PyTorch had them and packed anew alike)",
                r.reason,
                checkpoint_age(cp, self.trace)
            );
        }
        r
    }
}

/// Expandable segments with the GC threshold as well: PyTorch unmaps every free page and
/// retries before it raises, so at the OOM the threshold changes nothing that expandable
/// segments alone would not; its verdict is theirs (none where they were already on).
fn expandable_with_gc(remedies: &[RemedyVerdict], already_on: bool) -> Option<RemedyVerdict> {
    let alone = remedies
        .iter()
        .find(|r| r.remedy == Remedy::ExpandableSegments && !already_on)?;
    let mut with_gc = RemedyVerdict::new(
        Remedy::ExpandableWithGc(GC_THRESHOLD_TRIED),
        alone.verdict,
        format!(
            "as expandable_segments:True alone (PyTorch unmaps every free page and retries \
             before it raises, whatever the threshold): {}",
            alone.reason
        ),
    );
    with_gc.missing = alone.missing;
    Some(with_gc)
}

/// Every verdict among `remedies` that is one of `these` made `verdict`, for `why`. An
/// overturned max_split names no N, as every max_split verdict but a fit.
fn overturn(
    remedies: Vec<RemedyVerdict>,
    these: &[Verdict],
    verdict: Verdict,
    why: &str,
) -> Vec<RemedyVerdict> {
    remedies
        .into_iter()
        .map(|r| {
            if !these.contains(&r.verdict) {
                return r;
            }
            RemedyVerdict::new(r.remedy.unnamed(), verdict, why)
        })
        .collect()
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
fn kept_state(trace: &Trace, ooms: &[TraceOom]) -> Vec<OomRemedies> {
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
        at_given_capacity: false,
        what_would_fit: Some(remedy::what_would_fit(&scene)),
        step: None,
        roundup_close: Vec::new(),
    }]
}

/// "3.2 s before the OOM", or "before the OOM" where the times are not known.
fn checkpoint_age(cp: &Checkpoint, trace: &Trace) -> String {
    let at = trace.stats.kept_oom.as_ref().map_or(0, |k| k.time_us);
    if cp.time_us > 0 && at >= cp.time_us {
        format!("{:.1} s before the OOM", (at - cp.time_us) as f64 / 1e6)
    } else {
        "before the OOM".to_string()
    }
}

/// The device had room for the request's new segment: a memory fraction refused it.
fn under_a_cap(oom: &TraceOom) -> bool {
    let needed = round_size(oom.requested_bytes).unwrap_or(oom.requested_bytes);
    oom.device_free_bytes >= segment_size_for(needed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LiveAtStart, TraceEvent};

    fn event(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::bare(kind, addr, size)
    }

    fn trace(initial: Vec<LiveAtStart>, events: Vec<TraceEvent>) -> Trace {
        Trace::bare(initial, events)
    }

    #[test]
    fn a_roundup_fits_naming_a_close_n_is_left_open_and_a_fails_stands() {
        let oom = |remedy: Remedy, verdict: Verdict| OomRemedies {
            event: 5,
            remedies: vec![RemedyVerdict::new(remedy, verdict, "x")],
            from_history: true,
            at_given_capacity: false,
            what_would_fit: None,
            step: None,
            roundup_close: vec![16],
        };
        let judged = roundup_with_room(vec![
            oom(Remedy::RoundupPower2Divisions(Some(16)), Verdict::Fits),
            oom(Remedy::RoundupPower2Divisions(Some(8)), Verdict::Fits),
            oom(Remedy::RoundupPower2Divisions(None), Verdict::Fails),
        ]);
        let open = &judged[0].remedies[0];
        assert_eq!(
            (&open.remedy, open.verdict),
            (&Remedy::RoundupPower2Divisions(None), Verdict::CannotTell)
        );
        assert!(open.reason.contains("N = 16 served it"), "{open:?}");
        assert_eq!(judged[1].remedies[0].verdict, Verdict::Fits, "8 had room");
        assert_eq!(judged[2].remedies[0].verdict, Verdict::Fails);
    }

    #[test]
    fn inside_an_accumulating_first_step_only_the_fits_and_the_emptied_cache_are_opened() {
        let at_the_oom = vec![
            RemedyVerdict::new(Remedy::ExpandableSegments, Verdict::Fits, "serves it"),
            RemedyVerdict::new(Remedy::MaxSplitSizeMb(Some(512)), Verdict::Fits, "N = 512"),
            RemedyVerdict::new(
                Remedy::RoundupPower2Divisions(None),
                Verdict::Fails,
                "fails",
            ),
            RemedyVerdict::new(
                Remedy::EmptyCacheBetweenSteps,
                Verdict::CannotTell,
                "rounds",
            ),
        ];
        // Nothing counted: as they were (the live view's one-state path passes 0 too).
        assert_eq!(open_inside_accumulating(at_the_oom.clone(), 0), at_the_oom);
        let opened = open_inside_accumulating(at_the_oom, 3);
        let verdicts: Vec<_> = opened.iter().map(|r| (&r.remedy, r.verdict)).collect();
        assert_eq!(
            verdicts,
            vec![
                (&Remedy::ExpandableSegments, Verdict::CannotTell),
                (&Remedy::MaxSplitSizeMb(None), Verdict::CannotTell),
                (&Remedy::RoundupPower2Divisions(None), Verdict::Fails),
                (&Remedy::EmptyCacheBetweenSteps, Verdict::CannotTell),
            ]
        );
        assert!(
            opened[0].reason.contains("ran 3 more time(s)"),
            "{:?}",
            opened[0]
        );
        assert!(opened[3].reason.contains("accumulating"), "{:?}", opened[3]);
    }

    #[test]
    fn a_fit_that_runs_out_in_the_carried_step_fails_only_where_the_least_runs_out_too() {
        let fits = |remedy: Remedy| RemedyVerdict::new(remedy, Verdict::Fits, "serves it");
        let at_the_oom = vec![
            fits(Remedy::ExpandableSegments),
            fits(Remedy::GarbageCollectionThreshold(0.6)),
            fits(Remedy::RoundupPower2Divisions(Some(4))),
            fits(Remedy::EmptyCacheBetweenSteps),
        ];
        // Carried on: expandable gets through; the others run out.
        let through = vec![
            fits(Remedy::ExpandableSegments),
            RemedyVerdict::new(Remedy::GarbageCollectionThreshold(0.6), Verdict::Fails, "x"),
            RemedyVerdict::new(Remedy::RoundupPower2Divisions(None), Verdict::Fails, "x"),
            RemedyVerdict::new(Remedy::EmptyCacheBetweenSteps, Verdict::Fails, "x"),
        ];
        // At the pattern's own sizes, the least the step would ask, GC ran out with 1 %
        // more than the cap too, roundup only at the cap, the emptied cache not at all.
        let least = Least {
            fails: vec![Remedy::GarbageCollectionThreshold(0.6)],
            close: vec![Remedy::RoundupPower2Divisions(None)],
        };
        let judged = carried_through(at_the_oom, &through, &least, 40, LIKEST);
        let verdicts: Vec<Verdict> = judged.iter().map(|r| r.verdict).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Fits,
                Verdict::Fails,
                Verdict::CannotTell,
                Verdict::CannotTell
            ],
            "{judged:?}"
        );
        assert!(
            judged[1].reason.contains("the least it would ask"),
            "{judged:?}"
        );
        assert!(judged[2].reason.contains("too close to call"), "{judged:?}");
        assert!(
            judged[3].reason.contains("not in its history"),
            "{judged:?}"
        );
    }

    #[test]
    fn a_verdict_the_steps_growth_left_open_is_decided_only_where_it_runs_out_both_ways() {
        let open = |remedy: Remedy| {
            RemedyVerdict::new(
                remedy,
                Verdict::CannotTell,
                format!("{STEP_GOES_ON}: the middle passes the cap"),
            )
        };
        let at_the_oom = vec![
            open(Remedy::ExpandableSegments),
            open(Remedy::GarbageCollectionThreshold(0.6)),
            open(Remedy::EmptyCacheBetweenSteps),
            // Open for another reason: not the step's to decide.
            RemedyVerdict::new(
                Remedy::RoundupPower2Divisions(None),
                Verdict::CannotTell,
                "the address orders disagree",
            ),
        ];
        assert!(at_the_oom[..3].iter().all(open_for_the_step));
        assert!(!open_for_the_step(&at_the_oom[3]));
        // Carried on: expandable gets through, GC and the emptied cache run out, and only
        // GC runs out at the least too.
        let through = vec![
            RemedyVerdict::new(Remedy::ExpandableSegments, Verdict::Fits, "x"),
            RemedyVerdict::new(Remedy::GarbageCollectionThreshold(0.6), Verdict::Fails, "x"),
            RemedyVerdict::new(Remedy::EmptyCacheBetweenSteps, Verdict::Fails, "x"),
            RemedyVerdict::new(Remedy::RoundupPower2Divisions(None), Verdict::Fails, "x"),
        ];
        let least = Least {
            fails: vec![
                Remedy::GarbageCollectionThreshold(0.6),
                Remedy::RoundupPower2Divisions(None),
            ],
            // Too close to call at the least: the row stays as the growth left it.
            close: vec![Remedy::EmptyCacheBetweenSteps],
        };
        let judged = carried_through(at_the_oom, &through, &least, 40, LIKEST);
        let verdicts: Vec<Verdict> = judged.iter().map(|r| r.verdict).collect();
        // Getting through the carried step does not overturn the middle growth: open.
        assert_eq!(
            verdicts,
            [
                Verdict::CannotTell,
                Verdict::Fails,
                Verdict::CannotTell,
                Verdict::CannotTell
            ],
            "{judged:?}"
        );
        assert!(judged[0].reason.starts_with(STEP_GOES_ON), "{judged:?}");
        assert!(
            judged[1].reason.contains("the least it would ask"),
            "{judged:?}"
        );
        assert!(judged[2].reason.starts_with(STEP_GOES_ON), "{judged:?}");
        assert_eq!(judged[3].reason, "the address orders disagree");
    }

    #[test]
    fn the_too_close_reason_names_the_room_the_least_is_given() {
        let room = format!("with {} % more memory than the cap", LEAST_ROOM * 100.0);
        assert!(TOO_CLOSE.contains(&room), "{TOO_CLOSE}");
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
        let v: Vec<(Remedy, Verdict)> = all[0]
            .remedies
            .iter()
            .map(|r| (r.remedy.clone(), r.verdict))
            .collect();
        // PyTorch 2.11 on an H100: expandable fits; max_split_size_mb:200 and :1000 fit;
        // garbage_collection_threshold:0.6 and empty_cache() do not. The GC never runs
        // here: every request but the last finds a cached block.
        assert_eq!(v[0], (Remedy::ExpandableSegments, Verdict::Fits), "{v:?}");
        assert_eq!(v[1].1, Verdict::Fits, "{v:?}");
        assert_eq!(v[2].1, Verdict::Fails, "{v:?}");
        assert_eq!(v[3].1, Verdict::Fails, "{v:?}");
    }

    #[test]
    fn a_long_loop_with_no_steps_and_no_round_like_its_last_leaves_its_fits_open() {
        use TraceEventKind::*;
        // The split cache after 10,000 small blocks made and freed: a loop, as far as its
        // history shows, that marked no steps; nothing before asked 2.5 GiB, so no round
        // carries it on, and serving the request says nothing of what it asks next.
        let short = split_cache();
        let mut events: Vec<TraceEvent> = (0..LOOP_ALLOCATIONS as u64)
            .flat_map(|i| {
                [
                    event(Alloc, 0x9000_0000 + i, 512),
                    event(FreeCompleted, 0x9000_0000 + i, 512),
                ]
            })
            .collect();
        events.extend(short.events.iter().cloned());
        let long = trace(Vec::new(), events);
        let cap = Some(7900 * MIB);
        let verdict = |t: &Trace| {
            let ooms = crate::ooms::trace_ooms(t);
            remedies(t, &ooms, cap).unwrap()[0].remedies[0].clone()
        };
        assert_eq!(verdict(&short).verdict, Verdict::Fits);
        let open = verdict(&long);
        assert_eq!(open.verdict, Verdict::CannotTell, "{open:?}");
        assert!(
            open.reason.contains("is a loop that marked no steps"),
            "{open:?}"
        );
        assert!(open.reason.contains("vramtop.step()"), "{open:?}");
    }

    #[test]
    fn a_loop_whose_rounds_hold_none_like_its_last_leaves_its_fits_open() {
        use TraceEventKind::*;
        // The same loop gone in rounds of 1 GiB, each with 1,000 small blocks: its rounds
        // are found, but none reached a request like the refused one, so none carries it
        // on; the fits stay open, as where no round is found.
        let mut events = Vec::new();
        for round in 0..10u64 {
            let big = 0x8000_0000 + round;
            events.push(event(Alloc, big, 1 << 30));
            for i in 0..(LOOP_ALLOCATIONS as u64 / 10) {
                let small = 0x9000_0000 + round * 10_000 + i;
                events.push(event(Alloc, small, 512));
                events.push(event(FreeCompleted, small, 512));
            }
            events.push(event(FreeCompleted, big, 1 << 30));
        }
        events.extend(split_cache().events.iter().cloned());
        let long = trace(Vec::new(), events);
        assert!(super::super::steps(&long).at.len() >= 4, "rounds found");
        let ooms = crate::ooms::trace_ooms(&long);
        let open = remedies(&long, &ooms, Some(7900 * MIB)).unwrap()[0].remedies[0].clone();
        assert_eq!(open.verdict, Verdict::CannotTell, "{open:?}");
        assert!(open.reason.contains("vramtop.step()"), "{open:?}");
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
                .find(|r| r.remedy == Remedy::GarbageCollectionThreshold(0.6))
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
