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
//! as the refused request is now. Where even the step that rose least, its rise scaled to
//! this step's working memory, passes the cap (and the largest step's rise in bytes,
//! unscaled, too), no setting gets the step through, and the cause is the step's size,
//! not fragmentation; where the middle one's passes it, a "fits" is left open. On a T5 under a 5 GiB cap the least rise (1.04 times) left the
//! step 42 MiB under the cap and the middle one (1.06) 45 MiB over; PyTorch with expandable
//! segments died in the step. Where fewer than three steps match, the point is not
//! identified, and every step that reached as many allocations gives its growth: on a BERT
//! with four micro-batches of their own shape a step they grew 1.00 to 6.16 times, 2.0 in
//! the middle, and the fits are open (PyTorch got through under 8 GiB and not under 7; no
//! history holds the micro-batches still to come).
//!
//! Memory in use is not all: a setting that serves the refused request may fail a later one
//! in the same step for want of a contiguous block. `carried_on` appends the rest of the
//! likest matching step to the history, so that each remedy's replay can be asked whether
//! it gets through the step's end.

use serde::Serialize;

use crate::{Trace, TraceEvent, TraceEventKind};
use vramtop_alloc::hash::AddrMap;
use vramtop_alloc::{round_size, segment_size_for};

/// What the job's earlier steps say the step cut short still needed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepRest {
    /// The memory in use the step would reach at least: its floor plus its working memory
    /// at the OOM, grown as little as any matching earlier step grew past the same point.
    pub peak: u64,
    /// That growth: the step's highest working memory after the point over its working
    /// memory at the point, the least of the matching steps'.
    pub growth: f64,
    /// The same with the matching steps' middle growth (their median): where the step
    /// would end up were it a typical one.
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
}

/// Where an earlier step lies in the events: its first event, its allocation at the point,
/// and its end (the next step's first event), with its working memory at the point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pattern {
    pub start: usize,
    pub point: usize,
    pub end: usize,
    pub working: u64,
}

impl StepRest {
    /// Whether the step could not have ended under `cap` whatever the allocator's
    /// settings: the point identified (one or two steps whose allocation there only
    /// happened to be as large could alone fail every setting), and both the least growth
    /// scaled and the largest matching step's rise unscaled (part of a rise, such as
    /// gradients made anew, does not grow with the shapes) passing the cap.
    pub fn passes(&self, cap: u64) -> bool {
        self.identified && self.peak > cap && self.unscaled_peak > cap
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

/// One step, seen at the point.
#[derive(Clone, Copy, Debug)]
struct Step {
    /// Its first event.
    start: usize,
    /// Its last event plus one (the next step's first).
    end: usize,
    /// Memory in use when it began.
    floor: u64,
    /// Memory in use just before its allocation at the point, that allocation's size, and
    /// its event.
    at_point: Option<(u64, u64, usize)>,
    /// The most in use from that allocation to the step's end.
    peak_after: u64,
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
    /// Its working memory at the point.
    working: u64,
}

impl Step {
    /// The step's rise past the point, where it had working memory there.
    fn rise(&self) -> Option<Rise> {
        let (before, size, point) = self.at_point?;
        let working = before.checked_sub(self.floor).filter(|&w| w > 0)? as f64;
        Some(Rise {
            pattern: Pattern {
                start: self.start,
                point,
                end: self.end,
                working: working as u64,
            },
            share: size as f64 / working,
            growth: self.peak_after.saturating_sub(self.floor) as f64 / working,
            bytes: self.peak_after.saturating_sub(before),
            working: working as u64,
        })
    }
}

/// The rest of the step cut short by the OOM at `event` (its request: the event's size),
/// from the steps marked before it (`marks`: the event each step begins at); None where no
/// earlier step reached as many allocations, or the step had no working memory yet.
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
    let mut in_use = InUse::new(trace);
    let mut done: Vec<Step> = Vec::new();
    let mut step: Option<Step> = None;
    let mut allocs = 0;
    let mut next_mark = 0;
    for (i, e) in trace.events[..event].iter().enumerate() {
        if marks.get(next_mark) == Some(&i) {
            done.extend(step.take().map(|s| Step { end: i, ..s }));
            step = Some(Step {
                start: i,
                end: event,
                floor: in_use.bytes,
                at_point: None,
                peak_after: 0,
            });
            allocs = 0;
            next_mark += 1;
        }
        if e.kind == TraceEventKind::Alloc {
            if allocs == point {
                if let Some(s) = step.as_mut() {
                    s.at_point = Some((in_use.bytes, e.size, i));
                }
            }
            allocs += 1;
        }
        in_use.apply(e.kind, e.addr, e.size);
        if let Some(s) = step.as_mut().filter(|s| s.at_point.is_some()) {
            s.peak_after = s.peak_after.max(in_use.bytes);
        }
    }
    // The step cut short: begun at `start`, its working memory now, and the request.
    let floor = step.map(|s| s.floor)?;
    let working = in_use.bytes.checked_sub(floor).filter(|&w| w > 0)? as f64;
    let share_now = trace.events[event].size as f64 / working;
    let rises: Vec<Rise> = done.iter().filter_map(Step::rise).collect();
    let matching: Vec<Rise> = rises
        .iter()
        .copied()
        .filter(|r| (r.share / share_now - 1.0).abs() < MATCH)
        .collect();
    let identified = matching.len() >= SURE_MATCHING;
    let counted = if identified { matching } else { rises };
    let mut growths: Vec<f64> = counted.iter().map(|r| r.growth).collect();
    growths.sort_by(f64::total_cmp);
    let (&least, &most) = (growths.first()?, growths.last()?);
    let middle = growths.len() / 2;
    let typical = if growths.len() % 2 == 1 {
        growths[middle]
    } else {
        (growths[middle - 1] + growths[middle]) / 2.0
    };
    let largest = counted.iter().max_by_key(|r| r.working)?;
    let likest = identified.then_some(largest.pattern);
    let grown = |growth: f64| floor.saturating_add((working * growth) as u64);
    let unscaled_peak = in_use.bytes.saturating_add(largest.bytes);
    Some(StepRest {
        peak: grown(least),
        growth: least,
        typical_peak: grown(typical),
        typical_growth: typical,
        most_growth: most,
        most_peak: grown(most).max(unscaled_peak),
        unscaled_peak,
        steps: growths.len(),
        identified,
        working: working as u64,
        floor,
        likest,
        begun: start,
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
/// gradient does not shrink with a smaller batch). A block freed after the point that was
/// live before the pattern step began, or that this step no longer holds, is not freed:
/// what this step's counterpart of it is, the history does not say.
pub fn carried_on(trace: &Trace, rest: &StepRest, event: usize) -> Option<Trace> {
    let pattern = rest.likest?;
    let oom = trace
        .events
        .get(event)
        .filter(|e| e.kind == TraceEventKind::Oom)?;
    let ratio = rest.working as f64 / pattern.working.max(1) as f64;
    let ours = this_steps_allocations(trace, rest.begun, event);
    let mut sizes: AddrMap<u64> = AddrMap::default();
    let mut blocks: AddrMap<u64> = AddrMap::default();
    let mut k = 0;
    for e in &trace.events[pattern.start..pattern.point] {
        match e.kind {
            TraceEventKind::Alloc => {
                let &(addr, size, live) = ours.get(k)?;
                // A size stands for this step's only where the two are alike (a
                // workspace one step took where the other made an activation is not).
                let scaled = e.size as f64 * ratio;
                let alike = size == e.size
                    || (size as f64 >= scaled * (1.0 - ALIKE)
                        && size as f64 <= scaled * (1.0 + ALIKE));
                if alike {
                    let mapped = sizes.entry(e.size).or_insert(size);
                    *mapped = (*mapped).max(size);
                }
                // Only a block this step still holds can be freed in its place (PyTorch
                // reuses addresses: one this step freed may hold another block now).
                if live {
                    blocks.insert(e.addr, addr);
                } else {
                    blocks.remove(&e.addr);
                }
                k += 1;
            }
            TraceEventKind::FreeCompleted => {
                blocks.remove(&e.addr);
            }
            _ => {}
        }
    }
    let mut events = trace.events[..event].to_vec();
    let carried = |kind, addr, size, stream| TraceEvent {
        kind,
        addr,
        size,
        stream,
        tag: None,
        time_us: None,
    };
    // The refused request, served, in the place of the pattern's allocation at the point.
    blocks.insert(trace.events[pattern.point].addr, CARRIED_ADDR);
    events.push(carried(
        TraceEventKind::Alloc,
        CARRIED_ADDR,
        oom.size,
        oom.stream,
    ));
    let mut next = CARRIED_ADDR;
    let mut freed = std::collections::HashSet::new();
    for e in &trace.events[pattern.point + 1..pattern.end] {
        match e.kind {
            TraceEventKind::Alloc => {
                let size = sizes.get(&e.size).copied().unwrap_or_else(|| {
                    let scaled = (e.size as f64 * ratio).ceil() as u64;
                    scaled.next_multiple_of(512).max(e.size)
                });
                next += 1;
                blocks.insert(e.addr, next);
                events.push(carried(TraceEventKind::Alloc, next, size, e.stream));
            }
            TraceEventKind::FreeCompleted => {
                if let Some(addr) = blocks.remove(&e.addr).filter(|&a| freed.insert(a)) {
                    events.push(carried(TraceEventKind::FreeCompleted, addr, 0, e.stream));
                }
            }
            _ => {}
        }
    }
    // The end: a request for almost nothing, under a cap where the OOM was under one (the
    // device's free bytes stand for that in an `oom` event), so that the end is judged
    // as the OOM was.
    let needed = round_size(oom.size).unwrap_or(oom.size);
    let capped = oom.addr >= segment_size_for(needed);
    let device_free = if capped { oom.addr } else { 0 };
    events.push(carried(TraceEventKind::Oom, device_free, 512, oom.stream));
    Some(Trace {
        source: trace.source,
        device: trace.device,
        initial: trace.initial.clone(),
        initial_segments: trace.initial_segments.clone(),
        events,
        segments_at_end: trace.segments_at_end.clone(),
        settings: trace.settings.clone(),
        stats: trace.stats.clone(),
    })
}

/// How far this step's allocation before the OOM may lie from the pattern's at the same
/// place, scaled by the working memories, for the pattern's size to stand for this one's.
const ALIKE: f64 = 0.5;

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
    use crate::TraceEvent;

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
        let carried = carried_on(&trace, &rest, oom).expect("a step to carry it on by");
        assert_eq!(carried.events[..oom], trace.events[..oom]);
        let on = &carried.events[oom..];
        let sizes = |kind| -> Vec<u64> {
            on.iter()
                .filter(|e| e.kind == kind)
                .map(|e| e.size / MIB)
                .collect()
        };
        // The refused request served; an activation in this step's own size (the pattern
        // made 200 MiB ones before its point where this step made 300); the gradient,
        // never seen before the point, scaled by the working memories (600 over 400).
        assert_eq!(sizes(Alloc), vec![300, 300, 600]);
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
        assert_eq!(carried_on(&trace, &rest, oom), None);
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
        let carried = carried_on(&trace, &rest, oom).expect("a step to carry it on by");
        let frees = carried.events[oom..]
            .iter()
            .filter(|e| e.kind == FreeCompleted && e.addr == reused)
            .count();
        assert_eq!(frees, 1, "{:?}", &carried.events[oom..]);
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
