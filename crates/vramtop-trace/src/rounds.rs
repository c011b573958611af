//! The rounds of a job that marked no steps. The hook marks each torch optimizer step; a
//! loop without one (a model generating for batch after batch, an evaluation) marks
//! nothing, yet it goes in rounds all the same: each rises from what the job keeps
//! (weights, caches) and comes back down to it when its batch is done. Where it came back
//! is where a step ends, as far as the history can say, and the rounds found there stand
//! in for the marks (`replay::steps`).
//!
//! A T5 translating batches with beam search (H200, PyTorch 2.11) kept 262.8 MiB between
//! its `generate` calls and rose 137 to 1,071 MiB in each; with each call marked by hand
//! (`vramtop.step()`), every one of its 40 marks fell where its memory in use came back to
//! 262.8 MiB. On the GPU-kept histories of 18 training loops, marked by their optimizers,
//! the step rose once and came back to within 5 % of its rise in almost every step.

use crate::step_rest::InUse;
use crate::{Trace, TraceEventKind};

/// A round has ended once the memory in use is back within this share of the round's
/// rise above where it began (a batch's outputs kept for the next, a cache grown a little).
const RETURN: f64 = 0.05;

/// A rise from rest smaller than this share of the job's largest begins no round: the next
/// batch's inputs, copied in before the last one's outputs are freed.
const LEAST_RISE: f64 = 0.05;

/// Rounds the job must have gone through, the one the OOM cut short among them, for them to
/// be taken as its steps: `step_rest` matches the step cut short against 3 earlier ones.
pub const LEAST_ROUNDS: usize = 4;

/// Where each round of the job began (its first request after coming back to rest), up to
/// the last OOM: like the marks `replay::step_boundaries` gives, sorted and each once.
/// Empty where the memory in use does not go in LEAST_ROUNDS rounds.
///
/// Rounds are counted from the job's rest level in the second half of its history before
/// the OOM (the least memory in use there), from the first time it was at that level and
/// never again below: the weights' loading before it, or an optimizer's state made in the
/// first step, would make the first round one that never comes back down.
pub fn inferred(trace: &Trace) -> Vec<usize> {
    let events = &trace.events;
    let end = events
        .iter()
        .rposition(|e| e.kind == TraceEventKind::Oom)
        .unwrap_or(events.len());
    if end < 2 {
        return Vec::new();
    }
    // Memory in use after each event.
    let mut in_use = InUse::new(trace);
    let series: Vec<u64> = events[..end]
        .iter()
        .map(|e| {
            in_use.apply(e.kind, e.addr, e.size);
            in_use.bytes
        })
        .collect();
    let later = &series[end / 2..];
    let (Some(&rest), Some(&highest)) = (later.iter().min(), later.iter().max()) else {
        return Vec::new();
    };
    let least_rise = (LEAST_RISE * (highest - rest) as f64) as u64;
    if least_rise == 0 {
        return Vec::new();
    }
    // The first time at the rest level from which the job never went below it again.
    let mut lowest_after = rest;
    let mut start = end / 2 + later.iter().position(|&x| x == rest).unwrap_or(0);
    for i in (0..end / 2).rev() {
        lowest_after = lowest_after.min(series[i]);
        if lowest_after < rest {
            break;
        }
        if series[i] == rest {
            start = i;
        }
    }
    let request = |from: usize| crate::first_request(events, from);
    let mut rounds = Vec::new();
    let mut began_at = series[start]; // the level the round in progress rose from
    let mut rise = 0u64; // its rise so far
    let mut in_round = false;
    let (mut rest_min, mut rest_at) = (series[start], start);
    for (i, &x) in series.iter().enumerate().skip(start + 1) {
        if in_round {
            rise = rise.max(x.saturating_sub(began_at));
            if x <= began_at + (RETURN * rise as f64) as u64 {
                in_round = false;
                (rest_min, rest_at) = (x, i);
            }
        } else {
            if x <= rest_min {
                // The latest of equal lows: the round begins after it.
                (rest_min, rest_at) = (x, i);
            }
            if x > rest_min + least_rise {
                rounds.extend(request(rest_at + 1));
                (began_at, rise, in_round) = (rest_min, x - rest_min, true);
            }
        }
    }
    // Back at rest at the OOM: its round begins after the last low (the refused request
    // may be that round's first big one).
    if !in_round {
        rounds.extend(request(rest_at + 1));
    }
    rounds.sort_unstable();
    rounds.dedup();
    if rounds.len() < LEAST_ROUNDS {
        return Vec::new();
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LiveAtStart, TraceEvent};
    use TraceEventKind::{Alloc, FreeCompleted, Oom};

    const MIB: u64 = 1 << 20;

    /// A loop over `rounds` batches after weights of 100 MiB: each copies its 1 MiB input
    /// in, works with `work(k)` MiB and a 50 MiB temporary, and frees them all; a round
    /// may keep `kept(k)` MiB for good (an optimizer's state made in the first). Then the
    /// last batch's input and work, and an OOM. Returns the trace and each round's first
    /// event.
    fn looping(
        rounds: usize,
        work: impl Fn(usize) -> u64,
        kept: impl Fn(usize) -> u64,
    ) -> (Trace, Vec<usize>) {
        let weights = LiveAtStart {
            addr: 1,
            size: 100 * MIB,
            stream: 0,
            tag: None,
        };
        let mut events = Vec::new();
        let mut starts = Vec::new();
        let mut next = 0x1000;
        let mut addr = || {
            next += 1;
            next
        };
        for k in 0..=rounds {
            starts.push(events.len());
            let (input, act) = (addr(), addr());
            events.push(TraceEvent::bare(Alloc, input, MIB));
            if k == rounds {
                events.push(TraceEvent::bare(Alloc, act, work(k) * MIB));
                events.push(TraceEvent::bare(Oom, 0, 900 * MIB));
                break;
            }
            let temp = addr();
            events.push(TraceEvent::bare(Alloc, act, work(k) * MIB));
            events.push(TraceEvent::bare(Alloc, temp, 50 * MIB));
            events.push(TraceEvent::bare(FreeCompleted, temp, 50 * MIB));
            if kept(k) > 0 {
                events.push(TraceEvent::bare(Alloc, addr(), kept(k) * MIB));
            }
            events.push(TraceEvent::bare(FreeCompleted, act, work(k) * MIB));
            events.push(TraceEvent::bare(FreeCompleted, input, MIB));
        }
        (Trace::bare(vec![weights], events), starts)
    }

    #[test]
    fn each_round_begins_where_the_memory_came_back_to_rest() {
        let (trace, starts) = looping(8, |k| 200 + 150 * (k as u64 % 3), |_| 0);
        // The first round rose from the weights before any event: no low precedes it.
        assert_eq!(inferred(&trace), starts[1..].to_vec());
    }

    #[test]
    fn a_state_kept_from_the_first_round_raises_the_rest() {
        // 150 MiB kept by the first round (its 200 MiB work's 75 %): that round never
        // comes back to where it began, and the rest is counted from above it.
        let (trace, starts) = looping(8, |k| 200 + 40 * k as u64, |k| if k == 0 { 150 } else { 0 });
        assert_eq!(inferred(&trace), starts[1..].to_vec());
    }

    #[test]
    fn fewer_rounds_than_a_step_is_matched_against_give_none() {
        let (trace, starts) = looping(LEAST_ROUNDS - 1, |_| 300, |_| 0);
        assert_eq!(starts.len(), LEAST_ROUNDS);
        // The first round has no low before it: one too few.
        assert_eq!(inferred(&trace), Vec::<usize>::new());
        let (trace, starts) = looping(LEAST_ROUNDS, |_| 300, |_| 0);
        assert_eq!(inferred(&trace), starts[1..].to_vec());
    }

    #[test]
    fn memory_that_never_comes_back_down_goes_in_no_rounds() {
        // Every round keeps most of what it worked with: a leak, not a loop at rest.
        let (trace, _) = looping(8, |_| 200, |_| 180);
        assert_eq!(inferred(&trace), Vec::<usize>::new());
    }
}
