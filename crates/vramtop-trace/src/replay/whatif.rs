//! The replay report's what-if: "with `expandable_segments:True`", answered by
//! `pytorch-expandable` (what PyTorch itself would reserve) with the ideal `expandable`
//! policy (the lower bound) beside it. Rows already replayed are reused.

use serde::Serialize;

use super::report::mib;
use super::{replay, ReplayError, ReplayOptions, ReplayReport};
use crate::Trace;
use vramtop_alloc::PolicyKind;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ExpandableWhatIf {
    /// Peak reserved under `pytorch-expandable`.
    pub faithful_peak_reserved_bytes: u64,
    pub faithful_ooms: u64,
    /// Peak reserved under the ideal `expandable` policy.
    pub ideal_peak_reserved_bytes: u64,
    pub ideal_ooms: u64,
    /// The traced allocator had expandable segments on (a segment says so).
    pub recorded_with_expandable: bool,
    /// What the traced allocator reserved at its peak, when the trace tells.
    pub trace_reserved_peak_bytes: Option<u64>,
}

/// Peak reserved and OOMs of `policy`: from its row if there is one, else replayed.
fn peak_of(
    trace: &Trace,
    rows: &[ReplayReport],
    policy: PolicyKind,
    opts: ReplayOptions,
) -> Result<(u64, u64), ReplayError> {
    if let Some(row) = rows.iter().find(|r| r.policy == policy) {
        return Ok((row.peak_reserved_bytes, row.ooms));
    }
    let run = replay(trace, policy, opts)?;
    Ok((run.peak_reserved_bytes, run.ooms))
}

pub fn what_if(
    trace: &Trace,
    rows: &[ReplayReport],
    opts: ReplayOptions,
) -> Result<ExpandableWhatIf, ReplayError> {
    let (faithful, faithful_ooms) = peak_of(trace, rows, PolicyKind::PytorchExpandable, opts)?;
    let (ideal, ideal_ooms) = peak_of(trace, rows, PolicyKind::Expandable, opts)?;
    Ok(ExpandableWhatIf {
        faithful_peak_reserved_bytes: faithful,
        faithful_ooms,
        ideal_peak_reserved_bytes: ideal,
        ideal_ooms,
        recorded_with_expandable: trace.segments_at_end.iter().any(|s| s.is_expandable),
        trace_reserved_peak_bytes: rows.first().and_then(|r| r.trace_reserved_peak_bytes),
    })
}

/// `+1.2 %` of `value` against `base`.
fn percent(value: u64, base: u64) -> String {
    format!("{:+.1} %", (value as f64 / base as f64 - 1.0) * 100.0)
}

/// The what-if as people read it, a few lines for the end of the report.
pub fn what_if_text(w: &ExpandableWhatIf) -> String {
    let against = |bytes: u64| match w.trace_reserved_peak_bytes {
        Some(peak) if peak > 0 => format!(", {} against the trace", percent(bytes, peak)),
        _ => String::new(),
    };
    let ooms = |n: u64| {
        if n > 0 {
            format!(", {n} allocs would not fit")
        } else {
            String::new()
        }
    };
    let mut out = format!(
        "what if expandable_segments:True: PyTorch would reserve {} at the peak \
         (pytorch-expandable{}{})\n",
        mib(w.faithful_peak_reserved_bytes),
        against(w.faithful_peak_reserved_bytes),
        ooms(w.faithful_ooms)
    );
    out += &format!(
        "  lower bound: {} for an ideal page-mapped allocator (expandable{}{})\n",
        mib(w.ideal_peak_reserved_bytes),
        against(w.ideal_peak_reserved_bytes),
        ooms(w.ideal_ooms)
    );
    if w.recorded_with_expandable {
        out += "  this trace was recorded with expandable segments on: pytorch-expandable \
                replays what PyTorch did\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TraceEvent, TraceEventKind, TraceFormat, TraceStats};

    const MIB: u64 = 1 << 20;

    fn trace() -> Trace {
        let event = TraceEvent::bare;
        Trace {
            source: TraceFormat::VramtopRecord,
            device: 0,
            initial: Vec::new(),
            initial_segments: Vec::new(),
            events: vec![
                event(TraceEventKind::Alloc, 0x1000, 25 * MIB),
                event(TraceEventKind::Alloc, 0x2000, 25 * MIB),
                event(TraceEventKind::FreeCompleted, 0x1000, 25 * MIB),
                event(TraceEventKind::Alloc, 0x3000, 30 * MIB),
            ],
            segments_at_end: Vec::new(),
            settings: Default::default(),
            stats: TraceStats::default(),
        }
    }

    #[test]
    fn faithful_and_ideal_are_replayed_when_not_in_the_rows() {
        let t = trace();
        let w = what_if(&t, &[], ReplayOptions::default()).unwrap();
        // PyTorch: 25 MiB maps 40; the next 25 MiB grows to 60; the freed 25 MiB at the
        // start cannot hold 30 MiB, so the end grows by one more page: 80 MiB.
        assert_eq!(w.faithful_peak_reserved_bytes, 80 * MIB);
        // Ideal: the freed pages go back at once; 2 MiB pages throughout.
        assert!(w.ideal_peak_reserved_bytes < w.faithful_peak_reserved_bytes);
        assert!(!w.recorded_with_expandable);
        let text = what_if_text(&w);
        assert!(text.contains("PyTorch would reserve 80.0 MiB"), "{text}");
        assert!(text.contains("lower bound"), "{text}");
    }

    #[test]
    fn rows_already_replayed_are_reused() {
        let t = trace();
        let rows = super::super::report(
            &t,
            &[PolicyKind::PytorchExpandable, PolicyKind::Expandable],
            ReplayOptions::default(),
        )
        .unwrap();
        let w = what_if(&t, &rows, ReplayOptions::default()).unwrap();
        assert_eq!(w.faithful_peak_reserved_bytes, rows[0].peak_reserved_bytes);
        assert_eq!(w.ideal_peak_reserved_bytes, rows[1].peak_reserved_bytes);
    }
}
