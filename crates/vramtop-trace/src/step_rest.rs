//! The rest of the step an OOM cut short. A remedy that serves the refused request has
//! only got the job past one allocation: the step goes on, and its history ends at the
//! OOM. On a ResNet-50 whose batch and resolution vary (H100, PyTorch 2.11, a 6.5 GiB cap)
//! the replay served the refused 62 MiB with expandable segments, and PyTorch, run with
//! them, died later in the same step: the step's memory in use went on rising past what
//! the cap held, whatever the layout.
//!
//! The job's earlier steps say how far a step's memory rises past the same point. The
//! point is the step's `j`-th allocation, as many into the step as the refused request.
//! Counting alone does not find the same operation in every step (a step whose shapes
//! take another kernel allocates more or fewer blocks before it), so a step counts only
//! where its `j`-th allocation is about as large, against the step's working memory then,
//! as the refused request is now; or, where its shapes or its router took other kernels
//! before the point, the nearest allocation within `band` that is as large and follows
//! blocks like the request's (`leads_alike`).
//!
//! Where even the step that rose least, its rise scaled to this step's working memory,
//! passes the cap (and the largest step's rise in bytes, unscaled, too), no setting gets
//! the step through, and the cause is the step's size, not fragmentation; where the middle
//! one's passes it, a "fits" is left open. On a T5 under a 5 GiB cap the least rise (1.04
//! times) left the step 42 MiB under the cap and the middle one (1.06) 45 MiB over;
//! PyTorch with expandable segments died in the step. The middle is taken among the steps
//! of about this one's size (`like_this`): a small step grows more, for its size, than a
//! large one. Where fewer than three steps match, the point is not identified, and every
//! step that reached as many allocations gives its growth, a "fits" left open where the
//! middle one passes the cap. A BERT with four micro-batches of their own shape a step was
//! so by the count alone (its steps grew 1.00 to 6.16 times, 2.0 in the middle); found
//! within the band, its steps of about its size put it under an 8 GiB cap and over a 7
//! GiB one, and PyTorch got through under 8 and not under 7.
//!
//! Memory in use is not all: a setting that serves the refused request may fail a later one
//! in the same step for want of a contiguous block. `carried_on` appends the rest of the
//! likest matching step to the history, so that each remedy's replay can be asked whether
//! it gets through the step's end.

use serde::Serialize;

use crate::{Trace, TraceEvent, TraceEventKind};
use vramtop_alloc::hash::{AddrMap, AddrSet};
use vramtop_alloc::{round_size, segment_size_for, StreamId};

/// What the job's earlier steps say the step cut short still needed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepRest {
    /// The memory in use the step would reach at least: its floor plus its working memory
    /// at the OOM, grown as little as any matching earlier step grew past the same point.
    pub peak: u64,
    /// That growth: the step's highest working memory after the point over its working
    /// memory at the point, the least of the matching steps'.
    pub growth: f64,
    /// The same with the middle growth (the median) of the matching steps that worked with
    /// about as much memory at the point (`like_this`; of all of them where the point is
    /// not identified): where the step would end up were it a typical one of its size.
    pub typical_peak: u64,
    pub typical_growth: f64,
    /// The most any matching step grew.
    pub most_growth: f64,
    /// The memory in use the step would reach as the step that grew most grew (or as the
    /// largest one's rise, unscaled, where that is more): what a cap must hold for the
    /// step to end, as far as the job's history says. Under a 6.5 GiB cap the ResNet's
    /// step needed 6.6 GiB at least and 7.06 GiB at most: PyTorch got through it under
    /// 7.07 GiB and died in it under 6.65 and 6.8 (H200).
    pub most_peak: u64,
    /// The memory in use at the OOM plus the bytes the largest matching step (by working
    /// memory at the point) rose past it, unscaled: what the step reaches at least even
    /// where part of the rise is fixed (gradients made anew, the optimizer's temporaries)
    /// and would not grow with this step's shapes, as this step is mostly the largest yet.
    pub unscaled_peak: u64,
    /// How many earlier steps the growths come from: those that matched at the point, or,
    /// where too few did (`identified` false), all that reached as many allocations.
    pub steps: usize,
    /// Enough earlier steps matched at the point (`SURE_MATCHING`) that the least of them
    /// says what the step needs at least.
    pub identified: bool,
    /// The job's first step stood in (`first_step`). What it made that this step still
    /// holds (the optimizer's state) is taken for this step's floor (`held_on`); what it
    /// made and freed at once (cuDNN's benchmark trials, workspaces a job makes once or
    /// every step) is left out of the least it says (`peak`, `growth`, `unscaled_peak`;
    /// `lasting_rise`), not out of the middle and the most.
    pub first_step: bool,
    /// The matching steps grew alike (within GROWN_ALIKE) over working memories SPAN or more
    /// apart: none of their rise is fixed, so the least growth scaled to this step is a
    /// bound without the unscaled one (`passes`). A ResNet-50 classifying batches (no
    /// gradients, no optimizer; H200, a 5.11 GiB cap) grew 2.19 times past the point in
    /// each of 37 earlier rounds; the largest's rise, unscaled, stayed under the cap, and
    /// PyTorch failed the round with every setting.
    pub proportional: bool,
    /// This step's working memory at the OOM: in use less `floor`.
    pub working: u64,
    /// Memory in use when this step began (weights, optimizer state, gradients kept).
    pub floor: u64,
    /// Of the matching steps (where the point is identified), the one that worked with the
    /// most memory at the point: the pattern the step cut short is carried on by
    /// (`carried_on`).
    #[serde(skip)]
    pub likest: Option<Pattern>,
    /// The event this step began at.
    #[serde(skip)]
    pub begun: usize,
    /// The event the step before it began at, where one did.
    #[serde(skip)]
    pub previous: Option<usize>,
}

/// Where an earlier step lies in the events: its first event, its allocation at the point,
/// and its end (the next step's first event), with its working memory at the point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pattern {
    pub start: usize,
    /// The first event of the step before it, where one was marked.
    pub previous: Option<usize>,
    pub point: usize,
    pub end: usize,
    pub working: u64,
}

/// How far apart the matching steps' growths may lie, as a share of the least, for the
/// rise to be taken as following the step's size (`StepRest::proportional`).
const GROWN_ALIKE: f64 = 0.01;

/// How far apart, as a factor, the matching steps' working memories at the point must lie
/// for growths alike to show that none of the rise is fixed.
const SPAN: f64 = 1.5;

impl StepRest {
    /// Whether the step could not have ended under `cap` whatever the allocator's
    /// settings: the point identified (one or two steps whose allocation there only
    /// happened to be as large could alone fail every setting), and both the least growth
    /// scaled and the largest matching step's rise unscaled (part of a rise, such as
    /// gradients made anew, does not grow with the shapes) passing the cap.
    pub fn passes(&self, cap: u64) -> bool {
        self.identified && self.peak > cap && (self.unscaled_peak > cap || self.proportional)
    }
}

/// How far a step's allocation at the point, over its working memory there, may lie from
/// the request over this step's working memory: 0.75 to 1.25 times it (the operation's
/// size follows the step's shapes as the working memory does; another operation's seldom
/// lies this close).
const MATCH: f64 = 0.25;

/// Matching steps that identify the point: fewer, and the growths are every step's that
/// reached as many allocations (the point's operation unknown, they say only how much a
/// step may grow, not how little).
const SURE_MATCHING: usize = 3;

/// How far apart two steps' working memories at the point may be, as a factor either way,
/// for one to say how the other goes on (`like_this`).
const LIKE: f64 = 2.0;

/// Of the matching steps, those that worked with about as much memory at the point as this
/// step (`working`, within LIKE either way), or, where fewer than SURE_MATCHING did, the
/// SURE_MATCHING nearest: the typical growth is theirs. Part of a step's rise does not grow
/// with its shapes (the gradients, the optimizer's temporaries), so a small step grows more
/// past the point, for its size, than a large one: in a Mixtral's steps the logits were
/// followed by a rise of 4.8 times the working memory in the smallest and 1.14 times in
/// the largest, and PyTorch got the largest step yet through under a cap that the middle
/// growth of all of them passed. The least and the most stay every matching step's: the
/// nearest are no bound (a ResNet's 17 nearest steps grew at most 1.09 times, a cap of
/// 6.75 GiB; PyTorch died in the step under 6.8 GiB: its 1.14 came from a step of
/// another size).
fn like_this(mut rises: Vec<Rise>, working: f64) -> Vec<Rise> {
    let far = |r: &Rise| (r.pattern.working as f64 / working).ln().abs();
    rises.sort_by(|a, b| far(a).total_cmp(&far(b)));
    let within = rises.iter().take_while(|r| far(r) <= LIKE.ln()).count();
    rises.truncate(within.max(SURE_MATCHING));
    rises
}

/// Memory in use along the events, from the blocks live at the trace's start (keyed by
/// address with the replay's own hash: a whole history holds millions of events).
pub(crate) struct InUse {
    sizes: AddrMap<u64>,
    pub(crate) bytes: u64,
}

impl InUse {
    pub(crate) fn new(trace: &Trace) -> InUse {
        let sizes: AddrMap<u64> = trace.initial.iter().map(|b| (b.addr, b.size)).collect();
        let bytes = sizes.values().sum();
        InUse { sizes, bytes }
    }

    pub(crate) fn apply(&mut self, kind: TraceEventKind, addr: u64, size: u64) {
        match kind {
            TraceEventKind::Alloc => {
                if let Some(old) = self.sizes.insert(addr, size) {
                    self.bytes = self.bytes.saturating_sub(old);
                }
                self.bytes = self.bytes.saturating_add(size);
            }
            TraceEventKind::FreeCompleted => {
                if let Some(size) = self.sizes.remove(&addr) {
                    self.bytes = self.bytes.saturating_sub(size);
                }
            }
            _ => {}
        }
    }
}

/// How far from the point, in allocations, a step's allocation may lie and still be taken
/// for the operation at the point: a step whose shapes take another kernel here and there
/// allocates a few blocks more or fewer before it (a Mixtral's steps, 6 layers of 8
/// experts, held 1,261 to 1,309 allocations, and its logits came 2 to 6 allocations off
/// the count of the step cut short). The nearest allocation that matches is taken.
fn band(point: usize) -> usize {
    (point / 16).clamp(16, 256)
}

/// An allocation of a step near the point: how many allocations into the step, the memory
/// in use before it, its size and event, the sizes of the step's allocations just before
/// it (nearest first; 0 where the step had none), and the most in use from it to the
/// step's end.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    nth: usize,
    before: u64,
    size: u64,
    event: usize,
    lead: Lead,
    peak_after: u64,
}

/// The sizes of the allocations just before one, nearest first (0: none).
type Lead = [u64; LEAD];

/// How many allocations before it an allocation away from the point must share with the
/// request's (`leads_alike`): a step's share alone lets another operation of about the same
/// size stand in for it (in a Mixtral's steps the experts' blocks, sized by how many tokens
/// the router sent each, lay near every share).
const LEAD: usize = 3;

/// Whether the allocations before a candidate (`theirs`, of size `their_size`) look like
/// those before the request (`ours`, of `our_size`): each the same size, or the same size
/// against its own allocation within ALIKE (the same operations on other shapes).
fn leads_alike(theirs: &Lead, their_size: u64, ours: &Lead, our_size: u64) -> bool {
    theirs.iter().zip(ours).all(|(&t, &o)| {
        if t == o {
            return true;
        }
        if t == 0 || o == 0 || their_size == 0 || our_size == 0 {
            return false;
        }
        let x = (t as f64 / their_size as f64) / (o as f64 / our_size as f64);
        (1.0 - ALIKE..=1.0 + ALIKE).contains(&x)
    })
}

/// One step, seen near the point.
#[derive(Clone, Debug)]
struct Step {
    /// Its first event.
    start: usize,
    /// The first event of the step before it, where there was one.
    previous: Option<usize>,
    /// Its last event plus one (the next step's first).
    end: usize,
    /// Memory in use when it began.
    floor: u64,
    /// Its allocations within `band` of the point, in order.
    near: Vec<Candidate>,
}

impl Step {
    /// The step's rise past `c`, where it had working memory there.
    fn rise(&self, c: &Candidate) -> Option<Rise> {
        let working = c.before.checked_sub(self.floor).filter(|&w| w > 0)? as f64;
        Some(Rise {
            pattern: Pattern {
                start: self.start,
                previous: self.previous,
                point: c.event,
                end: self.end,
                working: working as u64,
            },
            share: c.size as f64 / working,
            growth: c.peak_after.saturating_sub(self.floor) as f64 / working,
            bytes: c.peak_after.saturating_sub(c.before),
        })
    }

    /// Its rise past the allocation as many into the step as the point (`point`), where it
    /// reached that many.
    fn rise_at(&self, point: usize) -> Option<Rise> {
        self.rise(self.near.iter().find(|c| c.nth == point)?)
    }

    /// Its rise past the allocation nearest the point whose share of the working memory
    /// matches `share_now` (the earlier of two as near); away from the point, only one whose
    /// allocations before it look like those before the request (`ours`, `request`).
    fn matching_rise(
        &self,
        point: usize,
        share_now: f64,
        ours: &Lead,
        request: u64,
    ) -> Option<Rise> {
        self.near
            .iter()
            .filter(|c| c.nth == point || leads_alike(&c.lead, c.size, ours, request))
            .filter_map(|c| Some((c.nth.abs_diff(point), self.rise(c)?)))
            .filter(|(_, r)| (r.share / share_now - 1.0).abs() < MATCH)
            .min_by_key(|&(distance, _)| distance)
            .map(|(_, r)| r)
    }
}

/// One step's rise past the point.
#[derive(Clone, Copy, Debug)]
struct Rise {
    /// Where the step lies.
    pattern: Pattern,
    /// Its allocation at the point over its working memory there.
    share: f64,
    /// Its highest working memory after the point over its working memory there.
    growth: f64,
    /// Bytes in use it rose past the point.
    bytes: u64,
}

/// Memory in use after each event from a step's first allocation near the point to its
/// last, then the most in use from there to the step's end (`after`), so that each
/// candidate's peak after it is the most from its own event on.
struct Trail {
    from: usize,
    in_use: Vec<u64>,
    after: u64,
}

impl Trail {
    fn push(&mut self, in_use: u64, past_the_band: bool) {
        if past_the_band {
            self.after = self.after.max(in_use);
        } else {
            self.in_use.push(in_use);
        }
    }

    /// Each of `step`'s candidates' most in use from its event on.
    fn close(&mut self, step: &mut Step) {
        let mut most = std::mem::take(&mut self.after);
        for v in self.in_use.iter_mut().rev() {
            most = most.max(*v);
            *v = most;
        }
        for c in &mut step.near {
            c.peak_after = self.in_use.get(c.event - self.from).copied().unwrap_or(0);
        }
        self.in_use.clear();
    }
}

/// Allocations at the start of the step cut short that the job's first step must have
/// made alike, in order, to stand in for it (`first_step`).
const FIRST_ALIKE: usize = 8;

/// Allocations of other sizes the first step may make among those FIRST_ALIKE: what a job
/// allocates once, at its first use, in its first step. A Llama's first step (H200,
/// PyTorch 2.11) made cuBLAS's 32 MiB workspace at its first matrix product, between the
/// sixth and the seventh of the allocations its second step began with.
const FIRST_EXTRA: usize = 2;

/// Where the job's first step began, for a step cut short (begun at `start`) that is the
/// first one marked: the job ran out in its second step, and its history holds the first
/// from the job's start (no block live before it), setup and all. That step begins at the
/// first allocation from which it makes the allocations this step began with (FIRST_ALIKE
/// of them, or all of this step's where it made fewer), in order, with at most FIRST_EXTRA
/// others among them; the model's and the optimizer's setup come before it. A GPT-2 of one
/// batch shape (H200, PyTorch 2.11) ran out in its second step asking 2.3 GiB; its first
/// step, made alike, told how far the second would rise. None where no such run is found
/// (its shapes were other) or the history did not begin with the job.
fn first_step(trace: &Trace, start: usize, event: usize) -> Option<usize> {
    if start == 0 || !trace.initial.is_empty() || !trace.initial_segments.is_empty() {
        return None;
    }
    let allocs = |range: std::ops::Range<usize>| {
        let from = range.start;
        trace.events[range]
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == TraceEventKind::Alloc)
            .map(move |(i, e)| (from + i, e.size))
            .collect::<Vec<_>>()
    };
    let ours: Vec<u64> = allocs(start..event)
        .into_iter()
        .take(FIRST_ALIKE)
        .map(|(_, size)| size)
        .collect();
    if ours.is_empty() {
        return None;
    }
    let before = allocs(0..start);
    let theirs: Vec<u64> = before.iter().map(|&(_, size)| size).collect();
    let at = (0..theirs.len()).find(|&j| begins_alike(&theirs[j..], &ours))?;
    Some(before[at].0)
}

/// Of the allocations in `span` (the first step standing in), those whose blocks are
/// still live at `event` (the OOM), in order: what the job made once in its first step and
/// holds since, above all the optimizer's state, made at the first step's end. The step cut
/// short holds them from its start, so they are its floor, not part of the rise the first
/// step says it goes on by. Left in the rise, AdamW's state made again in a ViT-Base's
/// second step (128 images of 224 x 224; H200, PyTorch 2.11, a 10.44 GiB cap) ran every
/// setting out in the step carried on, where PyTorch got through it with expandable
/// segments.
fn held_on(trace: &Trace, span: std::ops::Range<usize>, event: usize) -> Vec<usize> {
    let mut made: AddrMap<usize> = AddrMap::default();
    for (i, e) in trace.events[span.start..event].iter().enumerate() {
        let i = span.start + i;
        match e.kind {
            TraceEventKind::Alloc if span.contains(&i) => {
                made.insert(e.addr, i);
            }
            TraceEventKind::Alloc | TraceEventKind::FreeCompleted => {
                made.remove(&e.addr);
            }
            _ => {}
        }
    }
    let mut held: Vec<usize> = made.into_values().collect();
    held.sort_unstable();
    held
}

/// The bytes in use the first step standing in rose past its point (`pattern.point`) to,
/// leaving out what this step holds already (`held`, as `of` does) and every block made
/// after the point and freed before any other block was made or freed: a workspace taken
/// for one kernel. The first step takes some once, above all cuDNN's benchmark trials of
/// each convolution's algorithms, which the steps after it do not; the steps after it
/// take theirs too, so the least a step rises is told without any.
fn lasting_rise(trace: &Trace, pattern: &Pattern, held: &[usize]) -> u64 {
    let lone = |i: usize| {
        let made = &trace.events[i];
        trace.events[i + 1..pattern.end]
            .iter()
            .find(|e| {
                matches!(
                    e.kind,
                    TraceEventKind::Alloc | TraceEventKind::FreeCompleted
                )
            })
            .is_some_and(|e| e.kind == TraceEventKind::FreeCompleted && e.addr == made.addr)
    };
    let mut in_use = InUse::new(trace);
    let (mut before, mut most) = (0, 0);
    for (i, e) in trace.events[..pattern.end].iter().enumerate() {
        if i == pattern.point {
            before = in_use.bytes;
        }
        let left_out = e.kind == TraceEventKind::Alloc
            && (held.binary_search(&i).is_ok() || (i > pattern.point && lone(i)));
        // A block left out is not in `in_use`: its free finds nothing to take off.
        if !left_out {
            in_use.apply(e.kind, e.addr, e.size);
        }
        if i >= pattern.point {
            most = most.max(in_use.bytes);
        }
    }
    most.saturating_sub(before)
}

/// Whether `theirs` begins with `ours` in order, its first the same, with at most
/// FIRST_EXTRA other allocations among them.
fn begins_alike(theirs: &[u64], ours: &[u64]) -> bool {
    if theirs.first() != ours.first() {
        return false;
    }
    let mut theirs = theirs.iter();
    let mut extra = 0;
    for &size in ours {
        loop {
            match theirs.next() {
                Some(&t) if t == size => break,
                Some(_) if extra < FIRST_EXTRA => extra += 1,
                _ => return false,
            }
        }
    }
    true
}

/// The rest of the step cut short by the OOM at `event` (its request: the event's size),
/// from the steps marked before it (`marks`: the event each step begins at); None where no
/// earlier step matched near the point nor reached as many allocations, or the step had
/// no working memory yet.
pub fn of(trace: &Trace, marks: &[usize], event: usize) -> Option<StepRest> {
    let begun = marks.iter().rposition(|&m| m <= event)?;
    let start = marks[begun];
    if start == event {
        // Refused as the step's first request: nothing of this step to scale.
        return None;
    }
    let point = trace.events[start..event]
        .iter()
        .filter(|e| e.kind == TraceEventKind::Alloc)
        .count();
    let near = point.saturating_sub(band(point))..=point + band(point);
    // The job's first step stands in where no marked step is done yet (`first_step`): its
    // allocations counted from where they begin to match this step's.
    let first = if begun == 0 {
        first_step(trace, start, event)
    } else {
        None
    };
    let mut in_use = InUse::new(trace);
    let mut done: Vec<Step> = Vec::new();
    let mut step: Option<Step> = None;
    let mut trail = Trail {
        from: 0,
        in_use: Vec::new(),
        after: 0,
    };
    let mut allocs = 0;
    let mut lead: Lead = [0; LEAD];
    let mut next_mark = 0;
    // The first step's blocks this step still holds (`held_on`), and of them the bytes not
    // made yet: counted in the first step's floor, not in its rise.
    let held = match first {
        Some(from) => held_on(trace, from..start, event),
        None => Vec::new(),
    };
    let mut pending: u64 = 0;
    for (i, e) in trace.events[..event].iter().enumerate() {
        if first == Some(i) {
            pending = held.iter().map(|&h| trace.events[h].size).sum();
            step = Some(Step {
                start: i,
                previous: None,
                end: event,
                floor: in_use.bytes + pending,
                near: Vec::new(),
            });
            allocs = 0;
            lead = [0; LEAD];
        }
        if marks.get(next_mark) == Some(&i) {
            let previous = step.as_ref().map(|s| s.start);
            if let Some(mut s) = step.take() {
                s.end = i;
                trail.close(&mut s);
                done.push(s);
            }
            step = Some(Step {
                start: i,
                previous,
                end: event,
                floor: in_use.bytes,
                near: Vec::new(),
            });
            allocs = 0;
            lead = [0; LEAD];
            next_mark += 1;
        }
        if e.kind == TraceEventKind::Alloc {
            if near.contains(&allocs) {
                if let Some(s) = step.as_mut() {
                    if s.near.is_empty() {
                        trail.from = i;
                    }
                    s.near.push(Candidate {
                        nth: allocs,
                        before: in_use.bytes + pending,
                        size: e.size,
                        event: i,
                        lead,
                        peak_after: 0,
                    });
                }
            }
            allocs += 1;
            lead.rotate_right(1);
            lead[0] = e.size;
        }
        in_use.apply(e.kind, e.addr, e.size);
        if e.kind == TraceEventKind::Alloc && held.binary_search(&i).is_ok() {
            pending -= e.size;
        }
        if step.as_ref().is_some_and(|s| !s.near.is_empty()) {
            trail.push(in_use.bytes + pending, allocs > *near.end() + 1);
        }
    }
    // The step cut short: begun at `start`, its working memory now, and the request.
    let (floor, previous) = step.map(|s| (s.floor, s.previous))?;
    let working = in_use.bytes.checked_sub(floor).filter(|&w| w > 0)? as f64;
    let request = trace.events[event].size;
    let share_now = request as f64 / working;
    let matching: Vec<Rise> = done
        .iter()
        .filter_map(|s| s.matching_rise(point, share_now, &lead, request))
        .collect();
    // The first step standing in alone is one step made alike from the job's start: where
    // its allocation there matches the request, it is the same operation; where none does,
    // it says nothing (its count may be off by its setup), and the step is not told.
    if first.is_some() && matching.len() < done.len() {
        return None;
    }
    let identified = matching.len() >= SURE_MATCHING || first.is_some();
    let counted: Vec<Rise> = if identified {
        matching
    } else {
        done.iter().filter_map(|s| s.rise_at(point)).collect()
    };
    let mut growths: Vec<f64> = counted.iter().map(|r| r.growth).collect();
    growths.sort_by(f64::total_cmp);
    let (&least, &most) = (growths.first()?, growths.last()?);
    // The middle of the steps about this one's size, where the point is identified.
    let mut alike: Vec<f64> = if identified {
        like_this(counted.clone(), working)
            .iter()
            .map(|r| r.growth)
            .collect()
    } else {
        growths.clone()
    };
    alike.sort_by(f64::total_cmp);
    let middle = alike.len() / 2;
    let typical = if alike.len() % 2 == 1 {
        alike[middle]
    } else {
        (alike[middle - 1] + alike[middle]) / 2.0
    };
    let largest = counted.iter().max_by_key(|r| r.pattern.working)?;
    let likest = identified.then_some(largest.pattern);
    let grown = |growth: f64| floor.saturating_add((working * growth) as u64);
    let unscaled_peak = in_use.bytes.saturating_add(largest.bytes);
    // The first step standing in says the least with what it made and freed at once left
    // out (`lasting_rise`); the most and the middle keep them.
    let (least, least_unscaled) = match first {
        Some(_) => {
            let made = largest.pattern.working as f64;
            let lasting = lasting_rise(trace, &largest.pattern, &held);
            (
                ((made + lasting as f64) / made).min(least),
                in_use.bytes.saturating_add(lasting).min(unscaled_peak),
            )
        }
        None => (least, unscaled_peak),
    };
    let smallest = counted.iter().map(|r| r.pattern.working).min()?;
    let proportional = identified
        && most <= least * (1.0 + GROWN_ALIKE)
        && largest.pattern.working as f64 >= SPAN * smallest as f64;
    Some(StepRest {
        peak: grown(least),
        growth: least,
        typical_peak: grown(typical),
        typical_growth: typical,
        most_growth: most,
        most_peak: grown(most).max(unscaled_peak),
        unscaled_peak: least_unscaled,
        steps: growths.len(),
        identified,
        first_step: first.is_some(),
        proportional,
        working: working as u64,
        floor,
        likest,
        begun: start,
        previous,
    })
}

/// Where the continuation's own blocks live: far above any device address, so they meet
/// none of the trace's.
const CARRIED_ADDR: u64 = 0xffff_0000_0000_0000;

/// The trace up to the OOM at `event`, with the refused request served and the step carried
/// on to its end as the earlier step most like it went on past the same point (`likest`),
/// then a last `oom` event asking for almost nothing: a replay that reaches that last event
/// without an allocation it could not place got the job through the step, as far as the
/// job's history can say. None where no step is like it (the point not identified).
///
/// The sizes are this step's own where it can tell: a size the pattern step allocated
/// before the point stands for the size this step allocated at the same place, where the
/// two are alike against the steps' working memory (a checkpointed block is made again in
/// the backward, a gradient is the same whatever the batch). Any other is scaled by the
/// two steps' working memory at the point, never below its own size (a parameter's
/// gradient does not shrink with a smaller batch). A block freed after the point that the
/// step before the pattern made is freed as its counterpart (`made_before`): the block of
/// the same size made as many into the step before this one, where this step still holds
/// it. One made earlier, one this step no longer holds, or one with no counterpart is not
/// freed: what stands for it, the history does not say.
///
/// With `Sizes::Pattern` the sizes this step's own do not stand for are the pattern's, not
/// scaled up: the least the rest of the step would ask, where this step works with more
/// memory than the pattern did (`through_the_rest` judges a remedy "fails" only where it
/// runs out both ways).
pub fn carried_on(trace: &Trace, rest: &StepRest, event: usize, sizing: Sizes) -> Option<Trace> {
    let pattern = rest.likest?;
    let oom = trace
        .events
        .get(event)
        .filter(|e| e.kind == TraceEventKind::Oom)?;
    let ratio = rest.working as f64 / pattern.working.max(1) as f64;
    let ours = this_steps_allocations(trace, rest.begun, event);
    let theirs: Vec<u64> = trace.events[pattern.start..pattern.point]
        .iter()
        .filter(|e| e.kind == TraceEventKind::Alloc)
        .map(|e| e.size)
        .collect();
    let alike = |size: u64, theirs: u64| {
        // A size stands for this step's only where the two are alike (a workspace one
        // step took where the other made an activation is not).
        let scaled = theirs as f64 * ratio;
        size == theirs
            || (size as f64 >= scaled * (1.0 - ALIKE) && size as f64 <= scaled * (1.0 + ALIKE))
    };
    let paired = pair_up(&theirs, &ours, |t, o| alike(o.1, t))?;
    let mut sizes: AddrMap<u64> = AddrMap::default();
    let mut blocks: AddrMap<u64> = AddrMap::default();
    let mut k = 0;
    for e in &trace.events[pattern.start..pattern.point] {
        match e.kind {
            TraceEventKind::Alloc => {
                // Only a block this step still holds can be freed in its place (PyTorch
                // reuses addresses: one this step freed may hold another block now).
                match paired[k].map(|j| ours[j]) {
                    Some((addr, size, live)) => {
                        if alike(size, e.size) {
                            let mapped = sizes.entry(e.size).or_insert(size);
                            *mapped = (*mapped).max(size);
                        }
                        if live {
                            blocks.insert(e.addr, addr);
                        } else {
                            blocks.remove(&e.addr);
                        }
                    }
                    None => {
                        blocks.remove(&e.addr);
                    }
                }
                k += 1;
            }
            TraceEventKind::FreeCompleted => {
                blocks.remove(&e.addr);
            }
            _ => {}
        }
    }
    let before = made_before(trace, &pattern, rest, event);
    // The first step standing in: its blocks this step holds already are not made again.
    let held = if rest.first_step {
        held_on(trace, pattern.start..pattern.end, event)
    } else {
        Vec::new()
    };
    let mut events = trace.events[..event].to_vec();
    // The refused request, served, in the place of the pattern's allocation at the point.
    blocks.insert(trace.events[pattern.point].addr, CARRIED_ADDR);
    events.push(carried(
        TraceEventKind::Alloc,
        CARRIED_ADDR,
        oom.size,
        oom.stream,
    ));
    let mut next = CARRIED_ADDR;
    let mut freed = AddrSet::default();
    for (k, e) in trace.events[pattern.point + 1..pattern.end]
        .iter()
        .enumerate()
    {
        match e.kind {
            TraceEventKind::Alloc if held.binary_search(&(pattern.point + 1 + k)).is_ok() => {}
            TraceEventKind::Alloc => {
                let size = sizes.get(&e.size).copied().unwrap_or_else(|| match sizing {
                    Sizes::Scaled => {
                        let scaled = (e.size as f64 * ratio).ceil() as u64;
                        scaled.next_multiple_of(512).max(e.size)
                    }
                    Sizes::Pattern => e.size,
                });
                next += 1;
                blocks.insert(e.addr, next);
                events.push(carried(TraceEventKind::Alloc, next, size, e.stream));
            }
            TraceEventKind::FreeCompleted => {
                let ours = blocks.remove(&e.addr).or(before[k]);
                if let Some(addr) = ours.filter(|&a| freed.insert(a)) {
                    events.push(carried(TraceEventKind::FreeCompleted, addr, 0, e.stream));
                }
            }
            _ => {}
        }
    }
    Some(ended(trace, oom, events))
}

/// For each event of the pattern step after its point (`pattern.point + 1..pattern.end`),
/// where it frees a block the step before the pattern made, this step's counterpart of
/// that block: of the blocks the step before this one made, still live when this step
/// began, the one of the same size made as many such blocks into that step, where this
/// step still holds it at the OOM. A loop that drops the gradients inside the next step
/// frees the last step's there: PyTorch Lightning's closure runs the forward, then
/// `zero_grad`, then the backward, so a GPT-2's 76 gradients (493 MiB) made in one step
/// are freed after the next step's forward. Left live, they made every remedy of a GPT-2
/// trained by Lightning under a 10.8 GiB cap run out in the step carried on (H200,
/// PyTorch 2.11), where PyTorch got through it with expandable segments,
/// `max_split_size_mb` 20 and 200, and `empty_cache()` between steps. Gradients come in
/// the same order every step; counting within the step before, from its first block, not
/// among every live block of the size, keeps blocks made once after the gradients
/// (AdamW's state, the size of its parameter, made in the first step) from shifting the
/// count.
fn made_before(
    trace: &Trace,
    pattern: &Pattern,
    rest: &StepRest,
    event: usize,
) -> Vec<Option<u64>> {
    let after = pattern.point + 1;
    let mut counterparts = vec![None; pattern.end.saturating_sub(after)];
    let (Some(theirs_from), Some(ours_from)) = (pattern.previous, rest.previous) else {
        return counterparts;
    };
    // When each live block was made (the blocks live at the trace's start before any
    // event, so in no step) and its size.
    let mut live: AddrMap<(i64, u64)> = trace
        .initial
        .iter()
        .map(|b| (b.addr, (-1, b.size)))
        .collect();
    let mut at_pattern: Option<BySize> = None;
    let mut at_this: Option<BySize> = None;
    // The pattern's frees of blocks the step before it made: (event, size, how many in).
    let mut wanted: Vec<(usize, u64, usize)> = Vec::new();
    for (i, e) in trace.events[..event].iter().enumerate() {
        if i == pattern.start {
            at_pattern = Some(by_size(&live, theirs_from..pattern.start));
        }
        if i == rest.begun {
            at_this = Some(by_size(&live, ours_from..rest.begun));
        }
        match e.kind {
            TraceEventKind::Alloc => {
                live.insert(e.addr, (i as i64, e.size));
            }
            TraceEventKind::FreeCompleted => {
                let made = live.remove(&e.addr);
                let Some(((when, size), of_pattern)) = made.zip(at_pattern.as_ref()) else {
                    continue;
                };
                if !(after..pattern.end).contains(&i) {
                    continue;
                }
                let nth = of_pattern
                    .get(&size)
                    .and_then(|made| made.binary_search_by(|&(w, _)| w.cmp(&when)).ok());
                if let Some(nth) = nth {
                    wanted.push((i, size, nth));
                }
            }
            _ => {}
        }
    }
    let Some(at_this) = at_this else {
        return counterparts;
    };
    for (i, size, nth) in wanted {
        let Some(&(when, addr)) = at_this.get(&size).and_then(|made| made.get(nth)) else {
            continue;
        };
        if live.get(&addr) == Some(&(when, size)) {
            counterparts[i - after] = Some(addr);
        }
    }
    counterparts
}

/// Live blocks made within a span of events, by size: (when made, address), the earliest
/// first.
type BySize = AddrMap<Vec<(i64, u64)>>;

fn by_size(live: &AddrMap<(i64, u64)>, made: std::ops::Range<usize>) -> BySize {
    let mut sizes = BySize::default();
    for (&addr, &(when, size)) in live {
        if usize::try_from(when).is_ok_and(|w| made.contains(&w)) {
            sizes.entry(size).or_default().push((when, addr));
        }
    }
    for made in sizes.values_mut() {
        made.sort_unstable();
    }
    sizes
}

/// What the sizes `carried_on` cannot pair with this step's own are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizes {
    /// The pattern's, scaled by the two steps' working memory, never below their own:
    /// the step as it likely goes on.
    Scaled,
    /// The pattern's own: the least it asks, where this step works with more memory.
    Pattern,
}

/// An event carried on past the OOM (no site, no time).
fn carried(kind: TraceEventKind, addr: u64, size: u64, stream: StreamId) -> TraceEvent {
    TraceEvent {
        kind,
        addr,
        size,
        stream,
        tag: None,
        time_us: None,
    }
}

/// `trace` with its events replaced by `events` and a last `oom` asking for almost
/// nothing, under a cap where the OOM was under one (the device's free bytes stand for
/// that in an `oom` event), so that the end is judged as the OOM was.
fn ended(trace: &Trace, oom: &TraceEvent, mut events: Vec<TraceEvent>) -> Trace {
    let needed = round_size(oom.size).unwrap_or(oom.size);
    let capped = oom.addr >= segment_size_for(needed);
    let device_free = if capped { oom.addr } else { 0 };
    events.push(carried(TraceEventKind::Oom, device_free, 512, oom.stream));
    Trace {
        source: trace.source,
        device: trace.device,
        initial: trace.initial.clone(),
        initial_segments: trace.initial_segments.clone(),
        events,
        segments_at_end: trace.segments_at_end.clone(),
        settings: trace.settings.clone(),
        stats: trace.stats.clone(),
    }
}

/// Rounds a job with no steps marked is carried on by (`repeated`): the same operation once
/// more, the least that shows a layout serving the request only once.
const ROUNDS: usize = 1;

/// Longest round `repeated` carries a job on by, in events: a longer one is no operation
/// repeating, and its copy would double a long history.
const MAX_CARRIED: usize = 2_000_000;

/// The trace up to the OOM at `event` of a job that marked no steps, with the refused
/// request served and the job carried on as it went on just before: its last round of
/// events, from its previous request of the same size after the same allocations (the
/// same operation, a layer or a token back) up to this one, repeated ROUNDS times, then
/// a last `oom` as `carried_on` ends. None where no earlier request was the same.
///
/// A round's block freed in it is freed in the copy as the copy's; one made before the
/// round began is freed where its counterpart a round on is still live (each once), and
/// else not. On a Llama generating for batches of prompts (H200, PyTorch 2.11, a 2.34 GiB
/// cap), the replay served the refused 166 MiB with `max_split_size_mb` 20, 64 and 128,
/// and PyTorch, run with 64 and 128, served it and failed a later one in the same call.
pub fn repeated(trace: &Trace, event: usize) -> Option<Trace> {
    use TraceEventKind::{Alloc, FreeCompleted, Oom};
    let oom = trace.events.get(event).filter(|e| e.kind == Oom)?;
    let same = |size: u64| size == oom.size || round_size(size) == round_size(oom.size);
    // The allocations just before the request, and each earlier request of its size.
    let mut lead: Lead = [0; LEAD];
    let mut leads: Vec<(usize, Lead)> = Vec::new();
    for (i, e) in trace.events[..event].iter().enumerate() {
        if e.kind == Alloc {
            if same(e.size) {
                leads.push((i, lead));
            }
            lead.rotate_right(1);
            lead[0] = e.size;
        }
    }
    // The nearest earlier request like it whose round holds more than its lead (a round
    // of the request alone, repeated inside one operation, would carry nothing on).
    let allocations_since = |i: usize| {
        trace.events[i..event]
            .iter()
            .filter(|e| e.kind == Alloc)
            .count()
    };
    let start = leads
        .iter()
        .rev()
        .filter(|(_, l)| l == &lead && l.iter().all(|&s| s > 0))
        .map(|&(i, _)| i)
        .find(|&i| allocations_since(i) > LEAD)
        .filter(|&i| event - i <= MAX_CARRIED)?;
    // Where each block the round frees was made, and the blocks still live at the OOM.
    let mut made: AddrMap<usize> = AddrMap::default();
    let mut freed_made: Vec<Option<usize>> = vec![None; event - start];
    for (i, e) in trace.events[..event].iter().enumerate() {
        match e.kind {
            Alloc => {
                made.insert(e.addr, i);
            }
            FreeCompleted => {
                let m = made.remove(&e.addr);
                if i >= start {
                    freed_made[i - start] = m;
                }
            }
            _ => {}
        }
    }
    let live: std::collections::HashSet<usize> = made.values().copied().collect();
    let period = event - start;
    let mut events = trace.events[..event].to_vec();
    // The copy of each event of the rounds, by position past the OOM: its block's address.
    let mut copies: Vec<Option<u64>> = Vec::new();
    let mut freed = AddrSet::default();
    let mut next = CARRIED_ADDR;
    for round in 1..=ROUNDS {
        let round_events = trace.events[start..event].iter().zip(&freed_made);
        for (k, (source, &made_at)) in round_events.enumerate() {
            let mut copy = None;
            match source.kind {
                Alloc => {
                    next += 1;
                    copy = Some(next);
                    // The first of the first round is the refused request, served.
                    let size = if round == 1 && k == 0 {
                        oom.size
                    } else {
                        source.size
                    };
                    events.push(carried(Alloc, next, size, source.stream));
                }
                FreeCompleted => {
                    // The block a round on from the one this freed: in the copies, or
                    // made before the OOM and still live.
                    let counterpart = made_at.and_then(|m| {
                        let at = m + round * period;
                        if at >= event {
                            copies.get(at - event).copied().flatten()
                        } else {
                            (trace.events[at].kind == Alloc && live.contains(&at))
                                .then_some(trace.events[at].addr)
                        }
                    });
                    if let Some(addr) = counterpart.filter(|&a| freed.insert(a)) {
                        events.push(carried(FreeCompleted, addr, 0, source.stream));
                    }
                }
                _ => {}
            }
            copies.push(copy);
        }
    }
    Some(ended(trace, oom, events))
}

/// How far this step's allocation before the OOM may lie from the pattern's at the same
/// place, scaled by the working memories, for the pattern's size to stand for this one's.
const ALIKE: f64 = 0.5;

/// Widest shift between the pattern step's allocations and this step's that `pair_up`
/// lines up, on top of the difference in their counts.
const SHIFT: usize = 16;

/// For each of the pattern step's allocations before its point (`theirs`), this step's
/// allocation in its place (`ours`), or None. Where both made as many, the k-th stands for
/// the k-th. Where one made a few more (another kernel here and there, the point found
/// `band` away), the two are lined up as an edit distance lines up two words: fewest
/// allocations left unpaired or paired unlike, within SHIFT of the shortest path. None
/// where the counts differ by more than `band` allows.
fn pair_up<T: Copy, O: Copy>(
    theirs: &[T],
    ours: &[O],
    alike: impl Fn(T, O) -> bool,
) -> Option<Vec<Option<usize>>> {
    let (n, m) = (theirs.len(), ours.len());
    if n == m {
        return Some((0..n).map(Some).collect());
    }
    if n.abs_diff(m) > band(n.max(m)) {
        return None;
    }
    // Alike at both ends: paired as they stand (an edit distance pairs them so at no
    // cost), and only the middle lined up, so a long step costs the few cells of its
    // shifted part.
    let head = theirs
        .iter()
        .zip(ours)
        .take_while(|&(&t, &o)| alike(t, o))
        .count();
    let tail = theirs[head..]
        .iter()
        .rev()
        .zip(ours[head..].iter().rev())
        .take_while(|&(&t, &o)| alike(t, o))
        .count();
    let middle = line_up(&theirs[head..n - tail], &ours[head..m - tail], &alike)?;
    let mut paired: Vec<Option<usize>> = (0..head).map(Some).collect();
    paired.extend(middle.into_iter().map(|j| j.map(|j| j + head)));
    paired.extend((0..tail).map(|k| Some(m - tail + k)));
    Some(paired)
}

/// `pair_up`'s edit distance, for the parts of the two steps that do not line up as they
/// stand.
fn line_up<T: Copy, O: Copy>(
    theirs: &[T],
    ours: &[O],
    alike: &impl Fn(T, O) -> bool,
) -> Option<Vec<Option<usize>>> {
    let (n, m) = (theirs.len(), ours.len());
    // Cells (i, j) with j - i in lo..=hi: the diagonals between the two ends, and SHIFT
    // either side.
    let d = m as i64 - n as i64;
    let (lo, hi) = (d.min(0) - SHIFT as i64, d.max(0) + SHIFT as i64);
    let width = (hi - lo + 1) as usize;
    let at = |i: usize, j: usize| -> Option<usize> {
        let k = j as i64 - i as i64 - lo;
        (0..width as i64)
            .contains(&k)
            .then(|| i * width + k as usize)
    };
    const FAR: u32 = u32::MAX / 2;
    // cost[i][j]: fewest unpaired or unlike to line up theirs[..i] with ours[..j];
    // step: 0 diagonal, 1 from above (theirs[i-1] unpaired), 2 from the left.
    let mut cost = vec![FAR; (n + 1) * width];
    let mut step = vec![0u8; (n + 1) * width];
    for i in 0..=n {
        let first = (i as i64 + lo).max(0) as usize;
        let last = (i as i64 + hi).min(m as i64) as usize; // hi > 0: never below 0
        for j in first..=last {
            let Some(here) = at(i, j) else { continue };
            if i == 0 && j == 0 {
                cost[here] = 0;
                continue;
            }
            let mut best = (FAR, 0u8);
            if i > 0 && j > 0 {
                if let Some(c) = at(i - 1, j - 1) {
                    let unlike = u32::from(!alike(theirs[i - 1], ours[j - 1]));
                    best = (cost[c] + unlike, 0);
                }
            }
            if i > 0 {
                if let Some(c) = at(i - 1, j) {
                    if cost[c] + 1 < best.0 {
                        best = (cost[c] + 1, 1);
                    }
                }
            }
            if j > 0 {
                if let Some(c) = at(i, j - 1) {
                    if cost[c] + 1 < best.0 {
                        best = (cost[c] + 1, 2);
                    }
                }
            }
            cost[here] = best.0;
            step[here] = best.1;
        }
    }
    let mut paired = vec![None; n];
    let (mut i, mut j) = (n, m);
    while i > 0 || j > 0 {
        match step[at(i, j)?] {
            0 => {
                paired[i - 1] = Some(j - 1);
                i -= 1;
                j -= 1;
            }
            1 => i -= 1,
            _ => j -= 1,
        }
    }
    Some(paired)
}

/// This step's allocations from `start` to the OOM at `event`, in order: address, size,
/// and whether the block is still live at the OOM.
fn this_steps_allocations(trace: &Trace, start: usize, event: usize) -> Vec<(u64, u64, bool)> {
    let mut ours: Vec<(u64, u64, bool)> = Vec::new();
    let mut at: AddrMap<usize> = AddrMap::default();
    for e in &trace.events[start..event] {
        match e.kind {
            TraceEventKind::Alloc => {
                at.insert(e.addr, ours.len());
                ours.push((e.addr, e.size, true));
            }
            TraceEventKind::FreeCompleted => {
                if let Some(k) = at.remove(&e.addr) {
                    ours[k].2 = false;
                }
            }
            _ => {}
        }
    }
    ours
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LiveAtStart, TraceEvent};

    const MIB: u64 = 1 << 20;

    fn event(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::bare(kind, addr, size)
    }

    /// A step of `scale`: 1 GiB of weights live throughout; the forward pass keeps four
    /// activations of `scale` MiB; the backward allocates a gradient of twice that before
    /// it frees them. Returns the events and where the step began.
    fn step(events: &mut Vec<TraceEvent>, base: u64, scale: u64) -> usize {
        use TraceEventKind::*;
        let begun = events.len();
        for k in 0..4 {
            events.push(event(Alloc, base + k, scale * MIB));
        }
        events.push(event(Alloc, base + 10, 2 * scale * MIB));
        for k in 0..4 {
            events.push(event(FreeCompleted, base + k, scale * MIB));
        }
        events.push(event(FreeCompleted, base + 10, 2 * scale * MIB));
        begun
    }

    fn job(scales: &[u64], last: u64, cut_at: usize) -> (Trace, Vec<usize>, usize) {
        let mut events = vec![event(TraceEventKind::Alloc, 1 << 40, 1 << 30)];
        let mut marks = Vec::new();
        for (i, &s) in scales.iter().enumerate() {
            marks.push(step(&mut events, (i as u64 + 1) << 32, s));
        }
        // The step cut short: `cut_at` of its activations, then the OOM asking the next.
        marks.push(events.len());
        for k in 0..cut_at as u64 {
            events.push(event(TraceEventKind::Alloc, (99 << 32) + k, last * MIB));
        }
        let oom = events.len();
        events.push(event(TraceEventKind::Oom, 0, last * MIB));
        (Trace::bare(Vec::new(), events), marks, oom)
    }

    #[test]
    fn the_steps_rise_past_the_point_is_scaled_to_this_steps_working_memory() {
        // Cut at the third activation: earlier steps had 2 of `s` then, and rose to 6.
        let (trace, marks, oom) = job(&[100, 200, 150], 300, 2);
        let rest = of(&trace, &marks, oom).expect("earlier steps reached the point");
        assert_eq!(rest.steps, 3);
        assert!(rest.identified);
        assert!((rest.growth - 3.0).abs() < 1e-9, "{rest:?}");
        assert!((rest.typical_growth - 3.0).abs() < 1e-9, "{rest:?}");
        assert_eq!(rest.floor, 1 << 30);
        assert_eq!(rest.peak, (1 << 30) + 3 * 600 * MIB);
    }

    /// A job that ran out in its second step: the model and the optimizer's setup, the first
    /// step unmarked at its start (the hook marks the optimizer's step, at its end), then
    /// the second, cut at its third activation. Returns the trace, its one mark and the OOM.
    fn second_step_job(first_scale: u64, live_before: bool) -> (Trace, Vec<usize>, usize) {
        use TraceEventKind::*;
        let mut events = vec![
            event(Alloc, 1 << 40, 1 << 30),
            event(Alloc, (1 << 40) + (1 << 30), 3 * MIB),
        ];
        step(&mut events, 1 << 32, first_scale);
        let marks = vec![events.len()];
        for k in 0..2 {
            events.push(event(Alloc, (99 << 32) + k, 100 * MIB));
        }
        let oom = events.len();
        events.push(event(Oom, 0, 100 * MIB));
        let initial = if live_before {
            vec![LiveAtStart {
                addr: 1 << 44,
                size: MIB,
                stream: 0,
                tag: None,
            }]
        } else {
            Vec::new()
        };
        (Trace::bare(initial, events), marks, oom)
    }

    #[test]
    fn a_first_step_begins_alike_across_what_a_job_allocates_once() {
        // cuBLAS's workspace (32) made at the first step's first matrix product.
        assert!(begins_alike(
            &[64, 32, 8, 8, 32, 256, 256],
            &[64, 32, 8, 8, 256, 256]
        ));
        assert!(begins_alike(&[64, 32, 8], &[64, 32, 8]));
        // Not the same first allocation; too many others among them; cut short.
        assert!(!begins_alike(&[32, 64, 32, 8], &[64, 32, 8]));
        assert!(!begins_alike(&[64, 1, 2, 3, 32], &[64, 32]));
        assert!(!begins_alike(&[64, 32], &[64, 32, 8]));
    }

    #[test]
    fn a_second_step_is_told_by_the_first_made_alike_from_the_jobs_start() {
        let (trace, marks, oom) = second_step_job(100, false);
        let rest = of(&trace, &marks, oom).expect("the first step stands in");
        assert_eq!(rest.steps, 1);
        assert!(rest.identified && rest.first_step, "{rest:?}");
        // Two activations of 100 MiB worked with, and the step rose to four and a gradient
        // of 200 MiB: three times.
        assert!((rest.growth - 3.0).abs() < 1e-9, "{rest:?}");
        assert_eq!(rest.peak, (1 << 30) + 3 * MIB + 600 * MIB);
        // Alone it says the step cannot end under a cap it passes.
        assert!(
            rest.passes(rest.peak - 1) && !rest.passes(rest.peak),
            "{rest:?}"
        );
        // A first step of other shapes makes no allocation alike: nothing stands in.
        let (other, marks, oom) = second_step_job(50, false);
        assert_eq!(of(&other, &marks, oom), None);
        // Nor one made alike at its start whose allocation at the point is another size
        // (here a first step of three activations then the gradient).
        let (short, marks, oom) = {
            use TraceEventKind::*;
            let (mut trace, marks, oom) = second_step_job(100, false);
            // The first step's third activation (event 4) made the size of a gradient, and
            // freed as one (event 9).
            trace.events[4].size = 200 * MIB;
            trace.events[9].size = 200 * MIB;
            assert_eq!(trace.events[9].kind, FreeCompleted);
            (trace, marks, oom)
        };
        assert_eq!(of(&short, &marks, oom), None);
        // Nor where the history began after the job did (blocks live at its start).
        let (late, marks, oom) = second_step_job(100, true);
        assert_eq!(of(&late, &marks, oom), None);
    }

    #[test]
    fn what_the_first_step_made_and_this_step_holds_is_not_made_again() {
        use TraceEventKind::*;
        // The first step ends making the optimizer's state, 1000 MiB the job holds since:
        // more than the step's activations and gradient ever held.
        let (mut trace, mut marks, mut oom) = second_step_job(100, false);
        let state = event(Alloc, 7 << 40, 1000 * MIB);
        trace.events.insert(marks[0], state);
        marks[0] += 1;
        oom += 1;
        let rest = of(&trace, &marks, oom).expect("the first step stands in");
        assert!(rest.first_step, "{rest:?}");
        // The rise is the activations' and the gradient's (three times), not the state's
        // (five times); the state is in the floor.
        assert!((rest.growth - 3.0).abs() < 1e-9, "{rest:?}");
        assert_eq!(rest.floor, (1 << 30) + 3 * MIB + 1000 * MIB);
        assert_eq!(rest.working, 200 * MIB);
        // Carried on, the step makes its activations and gradient, not the state again.
        let carried = carried_on(&trace, &rest, oom, Sizes::Scaled).expect("carried on");
        let made: Vec<u64> = carried.events[oom..]
            .iter()
            .filter(|e| e.kind == Alloc)
            .map(|e| e.size / MIB)
            .collect();
        assert_eq!(made, vec![100, 100, 200]);
    }

    #[test]
    fn the_least_a_first_step_says_leaves_out_what_it_made_and_freed_at_once() {
        use TraceEventKind::*;
        // cuDNN's benchmark in the first step: a 5000 MiB workspace taken and given back
        // beside its gradient, at its peak.
        let (mut trace, mut marks, mut oom) = second_step_job(100, false);
        let gradient = trace
            .events
            .iter()
            .position(|e| e.size == 200 * MIB)
            .unwrap();
        for (k, kind) in [Alloc, FreeCompleted].into_iter().enumerate() {
            trace
                .events
                .insert(gradient + 1 + k, event(kind, 8 << 40, 5000 * MIB));
        }
        marks[0] += 2;
        oom += 2;
        let rest = of(&trace, &marks, oom).expect("the first step stands in");
        // The least is the activations' and the gradient's three times; the most keeps the
        // workspace (28 times).
        assert!((rest.growth - 3.0).abs() < 1e-9, "{rest:?}");
        assert!((rest.most_growth - 28.0).abs() < 1e-9, "{rest:?}");
        assert_eq!(rest.peak, (1 << 30) + 3 * MIB + 600 * MIB);
        assert_eq!(rest.unscaled_peak, (1 << 30) + 3 * MIB + 600 * MIB);
        assert!(rest.most_peak >= (1 << 30) + 5600 * MIB, "{rest:?}");
        // A cap the workspace alone passes is no "fails".
        assert!(!rest.passes(2 << 30), "{rest:?}");
    }

    #[test]
    fn steps_whose_allocation_at_the_point_is_another_size_leave_it_unidentified() {
        // Cut at the fifth allocation (the gradient in earlier steps, twice an
        // activation): the request is one activation, so no earlier step matches, and the
        // growths are every step's at that count (the gradient's: 6 over 4 activations).
        let (trace, marks, oom) = job(&[100, 200, 150], 300, 4);
        let rest = of(&trace, &marks, oom).expect("steps reached the count");
        assert!(!rest.identified && !rest.passes(0), "{rest:?}");
        assert_eq!(rest.steps, 3);
        assert!((rest.growth - 1.5).abs() < 1e-9, "{rest:?}");
        // Two matching steps are too few to be sure of.
        let (trace, marks, oom) = job(&[100, 200], 300, 2);
        assert!(
            !of(&trace, &marks, oom)
                .expect("two steps matched")
                .identified
        );
        // No step before this one: nothing to go by.
        let (trace, marks, oom) = job(&[], 300, 2);
        assert_eq!(of(&trace, &marks, oom), None);
    }

    #[test]
    fn the_step_is_carried_on_as_the_likest_step_went_on_in_this_steps_sizes() {
        use TraceEventKind::*;
        // Cut at the third activation of 300 MiB; the likest step (the largest, 200 MiB)
        // went on to its fourth activation, a gradient of twice that, and freed all five.
        let (trace, marks, oom) = job(&[100, 200, 150], 300, 2);
        let rest = of(&trace, &marks, oom).expect("earlier steps reached the point");
        let pattern = rest.likest.expect("the point is identified");
        assert_eq!(trace.events[pattern.point].size, 200 * MIB);
        let carried =
            carried_on(&trace, &rest, oom, Sizes::Scaled).expect("a step to carry it on by");
        assert_eq!(carried.events[..oom], trace.events[..oom]);
        let on = &carried.events[oom..];
        let sizes_in = |events: &[TraceEvent], kind| -> Vec<u64> {
            events
                .iter()
                .filter(|e| e.kind == kind)
                .map(|e| e.size / MIB)
                .collect()
        };
        let sizes = |kind| sizes_in(on, kind);
        // The refused request served; an activation in this step's own size (the pattern
        // made 200 MiB ones before its point where this step made 300); the gradient,
        // never seen before the point, scaled by the working memories (600 over 400).
        assert_eq!(sizes(Alloc), vec![300, 300, 600]);
        // At the pattern's own sizes, the least the rest would ask: the gradient as the
        // pattern made it; the activation still this step's own.
        let least =
            carried_on(&trace, &rest, oom, Sizes::Pattern).expect("a step to carry it on by");
        assert_eq!(sizes_in(&least.events[oom..], Alloc), vec![300, 300, 400]);
        // Every block of the step freed: the two this step made before the OOM at their
        // own addresses, the three carried on at theirs.
        let freed: Vec<u64> = on
            .iter()
            .filter(|e| e.kind == FreeCompleted)
            .map(|e| e.addr)
            .collect();
        assert_eq!(freed.len(), 5);
        assert!(freed.contains(&(99 << 32)) && freed.contains(&((99 << 32) + 1)));
        let end = on.last().expect("an end");
        assert_eq!((end.kind, end.size), (Oom, 512));
        // Unidentified: nothing to carry it on by.
        let (trace, marks, oom) = job(&[100, 200], 300, 2);
        let rest = of(&trace, &marks, oom).expect("two steps matched");
        assert_eq!(carried_on(&trace, &rest, oom, Sizes::Scaled), None);
    }

    #[test]
    fn the_last_steps_gradients_freed_inside_the_step_are_freed_as_this_steps() {
        use TraceEventKind::*;
        // A Lightning-like loop: the forward's four activations, then `zero_grad` frees
        // the gradients the step before made (64 and 32 MiB), then the backward makes this
        // step's and frees the activations; the gradients stay live into the next step.
        let mut events = vec![event(Alloc, 1 << 40, 1 << 30)];
        let mut marks = Vec::new();
        let mut grads: Vec<(u64, u64)> = Vec::new();
        for (i, scale) in [100u64, 200, 150].into_iter().enumerate() {
            let base = (i as u64 + 1) << 32;
            marks.push(events.len());
            for k in 0..4 {
                events.push(event(Alloc, base + k, scale * MIB));
            }
            for &(addr, size) in &grads {
                events.push(event(FreeCompleted, addr, size));
            }
            grads = vec![(base + 20, 64 * MIB), (base + 21, 32 * MIB)];
            for &(addr, size) in &grads {
                events.push(event(Alloc, addr, size));
            }
            if i == 0 {
                // AdamW's state, made in the first step after its gradients, of their
                // sizes, and kept: counted after them, and in no later step.
                for (k, &(_, size)) in grads.iter().enumerate() {
                    events.push(event(Alloc, (50 << 32) + 2 * k as u64, size));
                    events.push(event(Alloc, (50 << 32) + 2 * k as u64 + 1, size));
                }
            }
            for k in 0..4 {
                events.push(event(FreeCompleted, base + k, scale * MIB));
            }
        }
        marks.push(events.len());
        for k in 0..2 {
            events.push(event(Alloc, (99 << 32) + k, 300 * MIB));
        }
        let oom = events.len();
        events.push(event(Oom, 0, 300 * MIB));
        let trace = Trace::bare(Vec::new(), events);
        let rest = of(&trace, &marks, oom).expect("earlier steps reached the point");
        let carried =
            carried_on(&trace, &rest, oom, Sizes::Scaled).expect("a step to carry it on by");
        let freed: Vec<u64> = carried.events[oom..]
            .iter()
            .filter(|e| e.kind == FreeCompleted)
            .map(|e| e.addr)
            .collect();
        // The likest step (200 MiB) is the second: it freed the first step's gradients,
        // made before AdamW's state. The step before this one's gradients are freed in
        // their place, each once, and no state; then the four activations.
        assert_eq!(rest.likest.map(|p| p.previous), Some(Some(marks[0])));
        let last = 3u64 << 32;
        assert!(freed.contains(&(last + 20)), "{freed:x?}");
        assert!(freed.contains(&(last + 21)), "{freed:x?}");
        assert_eq!(freed.len(), 6, "{freed:x?}");
        // A gradient this step already dropped before the OOM has no counterpart left.
        let mut events = trace.events.clone();
        events.insert(oom, event(FreeCompleted, last + 21, 32 * MIB));
        let trace = Trace::bare(Vec::new(), events);
        let rest = of(&trace, &marks, oom + 1).expect("earlier steps reached the point");
        let carried = carried_on(&trace, &rest, oom + 1, Sizes::Scaled).expect("carried");
        let freed: Vec<u64> = carried.events[oom + 1..]
            .iter()
            .filter(|e| e.kind == FreeCompleted)
            .map(|e| e.addr)
            .collect();
        assert!(
            freed.contains(&(last + 20)) && !freed.contains(&(last + 21)),
            "{freed:x?}"
        );
    }

    #[test]
    fn a_block_this_step_freed_is_not_freed_again_in_its_place() {
        use TraceEventKind::*;
        // This step made its first activation, freed it, and made the second at the same
        // address; the pattern step kept both. Only the block live at the OOM is freed
        // when the pattern frees its counterpart, and only once.
        let (mut trace, marks, _) = job(&[100, 200, 150], 300, 0);
        let reused = 99 << 32;
        trace.events.truncate(*marks.last().unwrap());
        for (kind, size) in [(Alloc, 300), (FreeCompleted, 300), (Alloc, 300)] {
            trace.events.push(event(kind, reused, size * MIB));
        }
        // Asking half what it holds, as the pattern's third activation was against its two.
        let oom = trace.events.len();
        trace.events.push(event(Oom, 0, 150 * MIB));
        let rest = of(&trace, &marks, oom).expect("the steps reached the point");
        let carried =
            carried_on(&trace, &rest, oom, Sizes::Scaled).expect("a step to carry it on by");
        let frees = carried.events[oom..]
            .iter()
            .filter(|e| e.kind == FreeCompleted && e.addr == reused)
            .count();
        assert_eq!(frees, 1, "{:?}", &carried.events[oom..]);
    }

    /// A step of `scale` with `extra` small blocks (another kernel's) made and freed before
    /// its activations; otherwise `step`.
    fn step_with(events: &mut Vec<TraceEvent>, base: u64, scale: u64, extra: u64) -> usize {
        use TraceEventKind::*;
        let begun = events.len();
        for k in 0..extra {
            events.push(event(Alloc, base + 100 + k, 4096));
        }
        for k in 0..extra {
            events.push(event(FreeCompleted, base + 100 + k, 4096));
        }
        step(events, base, scale);
        begun
    }

    #[test]
    fn the_point_is_found_a_few_allocations_off_the_count() {
        // Earlier steps made 1, 2 and 3 small blocks before their activations; this one
        // made 1, then two activations, and is refused the third: the count alone lands
        // on another allocation in two of the three, the band on the third activation in
        // each, where the rise is the same as at the count (3 times).
        let mut events = vec![event(TraceEventKind::Alloc, 1 << 40, 1 << 30)];
        let mut marks = Vec::new();
        for (i, (s, extra)) in [(100, 1), (200, 2), (150, 3)].into_iter().enumerate() {
            marks.push(step_with(&mut events, (i as u64 + 1) << 32, s, extra));
        }
        marks.push(events.len());
        events.push(event(TraceEventKind::Alloc, (99 << 32) + 100, 4096));
        for k in 0..2 {
            events.push(event(TraceEventKind::Alloc, (99 << 32) + k, 300 * MIB));
        }
        let oom = events.len();
        events.push(event(TraceEventKind::Oom, 0, 300 * MIB));
        let trace = Trace::bare(Vec::new(), events);
        let rest = of(&trace, &marks, oom).expect("earlier steps reached the point");
        assert!(rest.identified && rest.steps == 3, "{rest:?}");
        assert!((rest.growth - 3.0).abs() < 1e-9, "{rest:?}");
        let pattern = rest.likest.expect("identified");
        assert_eq!(trace.events[pattern.point].size, 200 * MIB);
        // Carried on: the pattern step (200 MiB, two small blocks first) is lined up with
        // this one (one small block), so its third and fourth activations and its gradient
        // come in this step's sizes, and every activation is freed, this step's at its own
        // addresses.
        let carried =
            carried_on(&trace, &rest, oom, Sizes::Scaled).expect("a step to carry it on by");
        let on = &carried.events[oom..];
        let allocs: Vec<u64> = on
            .iter()
            .filter(|e| e.kind == TraceEventKind::Alloc)
            .map(|e| e.size / MIB)
            .collect();
        assert_eq!(allocs, vec![300, 300, 600]);
        let freed: Vec<u64> = on
            .iter()
            .filter(|e| e.kind == TraceEventKind::FreeCompleted)
            .map(|e| e.addr)
            .collect();
        assert!(freed.contains(&(99 << 32)) && freed.contains(&((99 << 32) + 1)));
        assert_eq!(freed.len(), 5, "{on:?}");
    }

    #[test]
    fn a_lookalike_away_from_the_count_is_not_taken_for_the_point() {
        // Earlier steps made a block as large, against their working memory, as the
        // request two allocations past the count, but after other blocks than the
        // request's: not the same operation, so the point stays unidentified.
        let mut events = vec![event(TraceEventKind::Alloc, 1 << 40, 1 << 30)];
        let mut marks = Vec::new();
        for (i, s) in [100u64, 200, 150].into_iter().enumerate() {
            let base = (i as u64 + 1) << 32;
            marks.push(events.len());
            for k in 0..2 {
                events.push(event(TraceEventKind::Alloc, base + k, s * MIB));
            }
            events.push(event(TraceEventKind::Alloc, base + 2, 4096));
            events.push(event(TraceEventKind::Alloc, base + 3, 4096));
            // Half the working memory, as the request is below.
            events.push(event(TraceEventKind::Alloc, base + 4, s * MIB));
            for k in 0..5 {
                events.push(event(TraceEventKind::FreeCompleted, base + k, 0));
            }
        }
        marks.push(events.len());
        for k in 0..2 {
            events.push(event(TraceEventKind::Alloc, (99 << 32) + k, 300 * MIB));
        }
        let oom = events.len();
        // The count lands on the first 4 KiB block in the earlier steps.
        events.push(event(TraceEventKind::Oom, 0, 300 * MIB));
        let trace = Trace::bare(Vec::new(), events);
        let rest = of(&trace, &marks, oom).expect("steps reached the count");
        assert!(!rest.identified, "{rest:?}");
    }

    #[test]
    fn allocations_are_lined_up_across_a_few_more_or_fewer() {
        let alike = |a: u64, b: u64| a == b;
        // As many: the k-th for the k-th, alike or not.
        assert_eq!(
            pair_up(&[1u64, 2, 3], &[1u64, 9, 3], alike),
            Some(vec![Some(0), Some(1), Some(2)])
        );
        // One more in ours, in the middle: the rest lines up past it.
        assert_eq!(
            pair_up(&[1u64, 2, 3, 4], &[1u64, 2, 7, 3, 4], alike),
            Some(vec![Some(0), Some(1), Some(3), Some(4)])
        );
        // One fewer: the pattern's extra is left unpaired.
        assert_eq!(
            pair_up(&[1u64, 5, 2, 3], &[1u64, 2, 3], alike),
            Some(vec![Some(0), None, Some(1), Some(2)])
        );
        // Counts further apart than the band: not lined up.
        let long: Vec<u64> = (0..20).collect();
        assert_eq!(pair_up(&long, &[0u64], alike), None);
    }

    #[test]
    fn a_job_with_no_steps_is_carried_on_as_it_went_on_just_before() {
        use TraceEventKind::*;
        // Rounds of a 100 MiB block and a 10 MiB one, each round freeing the round
        // before's; the fifth round's 100 MiB refused. A round of two allocations is no
        // more than the request's lead, so its last round is taken from the third's 100
        // MiB (after the same allocations): carried on once, the request served, the
        // blocks made and freed as they were then, the fourth round's and then the
        // copies' own.
        let x = |r: u64| (1 << 32) + r;
        let y = |r: u64| (2 << 32) + r;
        let mut events = Vec::new();
        for r in 0..4 {
            events.push(event(Alloc, x(r), 100 * MIB));
            events.push(event(Alloc, y(r), 10 * MIB));
            if r > 0 {
                events.push(event(FreeCompleted, x(r - 1), 0));
                events.push(event(FreeCompleted, y(r - 1), 0));
            }
        }
        let oom = events.len();
        events.push(event(Oom, 0, 100 * MIB));
        let trace = Trace::bare(Vec::new(), events);
        let carried = repeated(&trace, oom).expect("an earlier round");
        assert_eq!(carried.events[..oom], trace.events[..oom]);
        let on: Vec<(TraceEventKind, u64, u64)> = carried.events[oom..]
            .iter()
            .map(|e| (e.kind, e.addr, e.size / MIB))
            .collect();
        assert_eq!(
            on,
            vec![
                (Alloc, CARRIED_ADDR + 1, 100),
                (Alloc, CARRIED_ADDR + 2, 10),
                (FreeCompleted, x(3), 0),
                (FreeCompleted, y(3), 0),
                (Alloc, CARRIED_ADDR + 3, 100),
                (Alloc, CARRIED_ADDR + 4, 10),
                (FreeCompleted, CARRIED_ADDR + 1, 0),
                (FreeCompleted, CARRIED_ADDR + 2, 0),
                (Oom, 0, 0),
            ]
        );
        // Asked a size no earlier request had: nothing to carry it on by.
        let mut other = trace.events.clone();
        other[oom] = event(Oom, 0, 70 * MIB);
        assert_eq!(repeated(&Trace::bare(Vec::new(), other), oom), None);
    }

    #[test]
    fn a_step_refused_its_first_request_is_not_taken_for_the_step_before() {
        // The mark is the OOM itself (step_boundaries lands it there): the step before
        // had five allocations, and the refused request is not its sixth.
        let (trace, marks, oom) = job(&[100, 200, 150], 300, 0);
        assert_eq!(marks.last(), Some(&oom));
        assert_eq!(of(&trace, &marks, oom), None);
    }
}
