//! A job whose live memory keeps rising between its steps (a cache grown at every step, a
//! leak). A remedy that serves the request PyTorch refused only puts such a job's OOM off:
//! the allocations after it, which no history holds, need more again. On a KV cache grown
//! by `torch.cat` each step (H200, PyTorch 2.11), `max_split_size_mb:20` and `:64` served
//! the refused 84 MiB in the replay of the plain run's history, and PyTorch, run with them,
//! died a few hundred events later in the same step. So a "fits" there is given only when
//! what it leaves under the cap covers the floor's rise over the last tenth of the history.

use crate::step_rest::InUse;
use crate::{Trace, TraceEventKind};

/// How the job's live-memory floor (its lowest live bytes in each tenth of the history
/// before the OOM) rose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RisingFloor {
    /// Over the last tenth.
    pub last_tenth: u64,
    /// The floor in that tenth.
    pub floor: u64,
}

/// Fewer allocations than this say nothing about a trend.
const MIN_ALLOCS: usize = 500;

/// Steps the history must hold before the OOM, where the job's steps are known, for a
/// tenth of it to span one: in a shorter one the floor rises within a step, as memory does
/// through every forward pass, and through a job's first steps (the model loaded, the
/// optimizer's state made). A GPT-2 of one batch shape (H200, PyTorch 2.11) ran out in its
/// second step; its floor "rose" in each of the last three tenths, all of them inside that
/// step's forward pass, and every remedy PyTorch fitted with was left open for it.
const MIN_STEPS: usize = 10;

/// Whether the history holds too few of the job's steps (`steps`: each one's first event)
/// before `event` for its floor's rise to be one between steps (`rising`).
pub(super) fn too_few_steps(steps: &[usize], event: usize) -> bool {
    steps.iter().filter(|&&at| at < event).count() < MIN_STEPS
}

/// The floor's rise over the last tenth of the allocations before `event`, where it rose in
/// each of the last three tenths by at least 1 % of itself (a floor that stays put moves by
/// a few small blocks); None otherwise.
pub(super) fn rising(trace: &Trace, event: usize) -> Option<RisingFloor> {
    let events = trace.events.get(..event)?;
    // Tenths by allocations, not by events: what else the ring kept (PyTorch's
    // free_requested, segment events) moves no boundary.
    let allocs = events
        .iter()
        .filter(|e| e.kind == TraceEventKind::Alloc)
        .count();
    if allocs < MIN_ALLOCS {
        return None;
    }
    let mut seen: usize = 0;
    let mut in_use = InUse::new(trace);
    let mut floors = [u64::MAX; 10];
    for e in events {
        if e.kind == TraceEventKind::Alloc {
            seen += 1;
        }
        in_use.apply(e.kind, e.addr, e.size);
        let live = in_use.bytes;
        let tenth = (seen.saturating_sub(1) * 10 / allocs).min(9);
        floors[tenth] = floors[tenth].min(live);
    }
    let rose = |w: usize| {
        let (before, now) = (floors[w - 1], floors[w]);
        now > before && now - before >= (now / 100).max(1)
    };
    (rose(7) && rose(8) && rose(9)).then(|| RisingFloor {
        last_tenth: floors[9] - floors[8],
        floor: floors[9],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TraceEvent;

    fn event(kind: TraceEventKind, addr: u64, size: u64) -> TraceEvent {
        TraceEvent::bare(kind, addr, size)
    }

    /// `steps` steps of 20 scratch blocks each, and `kept` bytes added to what stays live
    /// at every step (a growing cache when not 0).
    fn job(steps: u64, kept: u64) -> Trace {
        let mut events = Vec::new();
        for s in 0..steps {
            for k in 0..20 {
                let addr = (s * 100 + k) << 20;
                events.push(event(TraceEventKind::Alloc, addr, 64 << 20));
                events.push(event(TraceEventKind::FreeCompleted, addr, 64 << 20));
            }
            if kept > 0 {
                events.push(event(TraceEventKind::Alloc, (1 << 40) + (s << 20), kept));
            }
        }
        Trace::bare(Vec::new(), events)
    }

    #[test]
    fn a_floor_that_keeps_rising_is_told_from_one_that_stays() {
        let growing = job(100, 8 << 20);
        let rise = rising(&growing, growing.events.len()).expect("a rising floor");
        // A tenth of 100 steps, 8 MiB each.
        assert_eq!(rise.last_tenth, 10 * (8 << 20));
        let flat = job(100, 0);
        assert_eq!(rising(&flat, flat.events.len()), None);
        // Too short a history says nothing.
        let short = job(20, 8 << 20);
        assert_eq!(rising(&short, short.events.len()), None);
    }

    /// A job one step in: memory rises through its second step's forward pass, which reads
    /// as a floor rising; with its steps known, too few for that to be a trend.
    #[test]
    fn a_floor_rising_inside_a_jobs_first_steps_is_told_by_its_steps() {
        // The model (1 GiB), one step of scratch freed at its end, then the second step's
        // forward: 600 activations kept, each 8 MiB, up to the OOM.
        let mut events = vec![event(TraceEventKind::Alloc, 1 << 40, 1 << 30)];
        for k in 0..600u64 {
            events.push(event(TraceEventKind::Alloc, k << 24, 8 << 20));
        }
        for k in 0..600u64 {
            events.push(event(TraceEventKind::FreeCompleted, k << 24, 8 << 20));
        }
        let second = events.len();
        for k in 0..600u64 {
            events.push(event(TraceEventKind::Alloc, k << 24, 8 << 20));
        }
        let trace = Trace::bare(Vec::new(), events);
        let end = trace.events.len();
        assert!(rising(&trace, end).is_some());
        assert!(too_few_steps(&[1, second], end));
        // A hundred steps in, a tenth spans ten of them.
        let many: Vec<usize> = (0..100).map(|s| s * 41).collect();
        assert!(!too_few_steps(&many, 100 * 41));
        assert!(too_few_steps(&many, 9 * 41));
    }
}
