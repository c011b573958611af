//! A kept history with a gap that hid the job's own segment decisions (`history::Stitched::
//! restart`: the job's allocator took or gave back segments between a read of PyTorch's
//! ring and its clearing). Each verdict is replayed over the history with the gap filled,
//! and again from the state after the gap (as from a checkpoint); it is given only where
//! the two agree, else it is `cannot tell` and says both.

use vramtop_alloc::remedy::{RemedyVerdict, Verdict};

use super::OomRemedies;
use crate::{Checkpoint, Trace};

/// The trace begun again at its last segment-changing gap: the state after it as the
/// checkpoint the replay starts from, and the events from there. None without such a gap.
pub(super) fn begun_after(trace: &Trace) -> Option<Trace> {
    let restart = trace
        .stats
        .kept_oom
        .as_ref()?
        .history
        .as_ref()?
        .restart
        .as_ref()?;
    let events = trace.events.get(restart.event..)?.to_vec();
    let (initial, initial_segments) = crate::checkpoint::initial_state(&restart.segments);
    let time_us = events.iter().find_map(|e| e.time_us).unwrap_or(0);
    // Field by field: `..trace.clone()` would copy the whole history's events only to drop them.
    let mut after = Trace {
        source: trace.source,
        device: trace.device,
        initial,
        initial_segments,
        events,
        segments_at_end: trace.segments_at_end.clone(),
        settings: trace.settings.clone(),
        stats: trace.stats.clone(),
    };
    let kept = after.stats.kept_oom.as_mut()?;
    kept.history = None;
    kept.checkpoint = Some(Checkpoint {
        time_us,
        skipped: 0,
        reconciled: 0,
        contradictions: 0,
    });
    Some(after)
}

/// `answers` (over the whole history), each verdict kept where `again` (from the state
/// after the gap) gives the same, else `cannot tell`. The OOMs before the gap are not in
/// `again` and keep their verdicts.
pub(super) fn agreed(
    answers: Vec<OomRemedies>,
    again: &[OomRemedies],
    trace: &Trace,
) -> Vec<OomRemedies> {
    let before_gap = answers.len().saturating_sub(again.len());
    let age = gap_age(trace);
    answers
        .into_iter()
        .enumerate()
        .map(|(i, mut oom)| {
            let Some(other) = i.checked_sub(before_gap).and_then(|j| again.get(j)) else {
                return oom;
            };
            // A roundup N close in either replay is close (`roundup_with_room`).
            oom.roundup_close
                .extend(other.roundup_close.iter().copied());
            for verdict in &mut oom.remedies {
                let theirs = other.remedies.iter().find(|o| {
                    std::mem::discriminant(&o.remedy) == std::mem::discriminant(&verdict.remedy)
                });
                // Open for the step's growth on both sides, or on neither: only such a row
                // is carried on through the rest of the step (`through_the_rest`).
                let same = theirs.is_some_and(|o| {
                    o.verdict == verdict.verdict
                        && o.remedy == verdict.remedy
                        && super::open_for_the_step(o) == super::open_for_the_step(verdict)
                });
                if !same {
                    *verdict = differ(verdict, theirs, &age);
                }
            }
            oom
        })
        .collect()
}

fn differ(filled: &RemedyVerdict, again: Option<&RemedyVerdict>, age: &str) -> RemedyVerdict {
    let remedy = filled.remedy.clone().unnamed();
    let said = |v: &RemedyVerdict| format!("{} {}", v.remedy, v.verdict);
    let again = again.map_or_else(|| "no verdict".to_string(), said);
    RemedyVerdict::new(
        remedy,
        Verdict::CannotTell,
        format!(
            "the hook's history lost the job's own segment decisions in a gap {age} (between \
             a read of PyTorch's ring and its clearing the job's allocator took or gave back \
             segments): replayed with the gap filled, {}; begun again after it, {again}",
            said(filled)
        ),
    )
}

/// How long before the OOM the gap was.
fn gap_age(trace: &Trace) -> String {
    let kept = trace.stats.kept_oom.as_ref();
    let at = kept.map_or(0, |k| k.time_us);
    let gap = kept
        .and_then(|k| k.history.as_ref())
        .and_then(|h| h.restart.as_ref())
        .and_then(|r| trace.events.get(r.event..))
        .and_then(|events| events.iter().find_map(|e| e.time_us));
    match gap {
        Some(t) if t > 0 && at >= t => format!("{:.1} s before the OOM", (at - t) as f64 / 1e6),
        _ => "before the OOM".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_alloc::remedy::Remedy;

    #[test]
    fn a_roundup_close_from_the_state_after_the_gap_counts_as_close() {
        let oom = |close: Vec<u32>| OomRemedies {
            event: 5,
            remedies: vec![RemedyVerdict::new(
                Remedy::RoundupPower2Divisions(Some(16)),
                Verdict::Fits,
                "fits with N = 16",
            )],
            from_history: true,
            at_given_capacity: false,
            what_would_fit: None,
            step: None,
            roundup_close: close,
        };
        let trace = Trace::bare(Vec::new(), Vec::new());
        // Both replays name 16; only the one begun after the gap had too little room.
        let merged = agreed(vec![oom(Vec::new())], &[oom(vec![16])], &trace);
        assert_eq!(merged[0].roundup_close, vec![16]);
        // Left to `roundup_with_room`, once the rest of the step has been judged.
        assert_eq!(merged[0].remedies[0].verdict, Verdict::Fits);
    }
}
