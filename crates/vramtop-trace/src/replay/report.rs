//! The trace's own figures (what the traced allocator did) and the text table of
//! `vramtop replay --report`. Plain data and strings; no allocator here.

use serde::Serialize;

use super::remedies::OomRemedies;
// Kept here too: the binary and the replay's own tables read them from the report.
use super::{ReplayReport, TRACE_ROUNDING};
use crate::ooms::TraceOom;
pub use crate::units::{mib, thousands};
use crate::{Trace, TraceEventKind, TraceFormat};

/// What the trace says by itself, before any policy replays it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceFigures {
    pub source: TraceFormat,
    pub events: u64,
    pub initial_blocks: u64,
    pub initial_bytes: u64,
    /// `Trace::live_bytes_peak(512)`: blocks live at the start left out.
    pub live_peak_bytes: u64,
    /// `Trace::live_bytes_peak_with_initial(512)`.
    pub live_peak_with_initial_bytes: u64,
    /// PyTorch snapshots: sum of segment sizes when the snapshot was taken.
    pub reserved_at_end_bytes: Option<u64>,
    /// PyTorch snapshots: peak of the traced allocator's reserved bytes.
    pub reserved_peak_bytes: Option<u64>,
    /// Where a kept file's history begins, when the hook kept it in pieces (hook 1.5).
    #[serde(skip)]
    pub history: Option<String>,
}

impl TraceFigures {
    pub fn of(trace: &Trace) -> Self {
        let has_segments = trace.source == TraceFormat::PytorchSnapshot;
        let reserved_at_end = has_segments.then(|| {
            trace
                .segments_at_end
                .iter()
                .map(|s| s.total_size)
                .sum::<u64>()
        });
        TraceFigures {
            source: trace.source,
            events: trace.events.len() as u64,
            initial_blocks: trace.initial.len() as u64,
            initial_bytes: trace.stats.initial_live_bytes,
            live_peak_bytes: trace.live_bytes_peak(TRACE_ROUNDING),
            live_peak_with_initial_bytes: trace.live_bytes_peak_with_initial(TRACE_ROUNDING),
            reserved_at_end_bytes: reserved_at_end,
            reserved_peak_bytes: reserved_at_end.and_then(|end| reserved_peak(trace, end)),
            history: trace
                .stats
                .kept_oom
                .as_ref()
                .and_then(|k| k.history.as_ref())
                .map(|h| {
                    format!(
                        "history: {}, {} events stitched from {} pieces the hook kept ({} put \
                         in where a ring's read and its clearing left a gap)",
                        if h.from_start {
                            "from the job's first allocation"
                        } else {
                            "from an older checkpoint"
                        },
                        thousands(h.events as u64),
                        h.pieces,
                        h.filled
                    )
                }),
        }
    }
}

/// Walks the segment events from the reserved bytes at the start (the end figure
/// less what the trace added); `None` when the two do not add up, e.g. a trace that
/// lost its early segment events (the ring of recorded events wrapped).
fn reserved_peak(trace: &Trace, at_end: u64) -> Option<u64> {
    let (mut grown, mut shrunk) = (0u64, 0u64);
    for event in &trace.events {
        match event.kind {
            TraceEventKind::SegmentAlloc | TraceEventKind::SegmentMap => grown += event.size,
            TraceEventKind::SegmentFree | TraceEventKind::SegmentUnmap => shrunk += event.size,
            _ => {}
        }
    }
    let mut current = (at_end + shrunk).checked_sub(grown)?;
    let mut peak = current;
    for event in &trace.events {
        match event.kind {
            TraceEventKind::SegmentAlloc | TraceEventKind::SegmentMap => {
                current += event.size;
                peak = peak.max(current);
            }
            TraceEventKind::SegmentFree | TraceEventKind::SegmentUnmap => {
                current = current.checked_sub(event.size)?;
            }
            _ => {}
        }
    }
    Some(peak)
}

const HEADER: [&str; 10] = [
    "policy",
    "peak live",
    "peak held",
    "peak reserved",
    "vs trace",
    "reserved/live",
    "frag@peak",
    "OOMs",
    "backing calls",
    "ns/event",
];

/// The report as people read it: what the trace says, then one row per policy.
pub fn table(name: &str, figures: &TraceFigures, rows: &[ReplayReport]) -> String {
    let mut out = format!(
        "{name}: {}, {} events, {} blocks live at the start ({})\n",
        figures.source,
        thousands(figures.events),
        thousands(figures.initial_blocks),
        mib(figures.initial_bytes)
    );
    if let Some(history) = &figures.history {
        out += history;
        out.push('\n');
    }
    if let Some(n) = rows
        .first()
        .map(|r| r.counts.initial_from_frees)
        .filter(|&n| n > 0)
    {
        out += &format!(
            "{} blocks freed without being allocated in the trace: placed as live at the start\n",
            thousands(n)
        );
    }
    out += &format!(
        "trace: live peak {} ({} with the blocks live at the start)",
        mib(figures.live_peak_bytes),
        mib(figures.live_peak_with_initial_bytes)
    );
    if let (Some(peak), Some(end)) = (figures.reserved_peak_bytes, figures.reserved_at_end_bytes) {
        out += &format!("; reserved peak {}, at the end {}", mib(peak), mib(end));
    } else if let Some(end) = figures.reserved_at_end_bytes {
        out += &format!("; reserved at the end {}", mib(end));
    }
    out += "\n\n";
    let cells: Vec<[String; 10]> = rows.iter().map(row_cells).collect();
    let mut widths = HEADER.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i == 0 {
                text += &format!("{cell:<w$}");
            } else {
                text += &format!("  {cell:>w$}");
            }
        }
        text.trim_end().to_string() + "\n"
    };
    out += &line(&HEADER.map(String::from));
    for row in &cells {
        out += &line(row);
    }
    out += "\npeak live: the trace's own live bytes (512 B rounding, blocks live at the start \
            left out); held: what the policy held for them after its rounding; reserved/live: \
            peak reserved over peak live with the blocks live at the start; vs trace: over \
            what the traced allocator reserved at its peak\n";
    out
}

/// The trace's OOMs, each with the traced allocator's state and every policy's answer;
/// empty when the trace has none.
pub fn oom_table(ooms: &[TraceOom], rows: &[ReplayReport], remedies: &[OomRemedies]) -> String {
    if ooms.is_empty() {
        return String::new();
    }
    let mut out = format!("\nthe trace's own OOMs ({}):\n", ooms.len());
    for (n, oom) in ooms.iter().enumerate() {
        out += &format!(
            "  {}. event {}: {}; PyTorch held {} reserved, {} allocated\n",
            n + 1,
            thousands(oom.event as u64 + 1),
            oom.explain(),
            mib(oom.reserved_bytes),
            mib(oom.allocated_bytes)
        );
        let answers: Vec<String> = rows
            .iter()
            .filter_map(|row| {
                let check = row.trace_ooms.iter().find(|c| c.event == oom.event)?;
                Some(format!(
                    "{} {}",
                    row.policy,
                    if check.fails { "fails too" } else { "fits" }
                ))
            })
            .collect();
        if !answers.is_empty() {
            out += &format!("     {}\n", answers.join(", "));
        }
        for remedy in remedies
            .iter()
            .filter(|r| r.event == oom.event)
            .flat_map(|r| &r.remedies)
        {
            out += &format!("     {}\n", remedy.line());
        }
    }
    out
}

fn row_cells(row: &ReplayReport) -> [String; 10] {
    let dash = || "-".to_string();
    [
        row.policy.to_string(),
        mib(row.peak_live_bytes),
        mib(row.peak_held_bytes),
        mib(row.peak_reserved_bytes),
        row.reserved_vs_trace
            .map_or_else(dash, |r| format!("{:+.1} %", (r - 1.0) * 100.0)),
        row.reserved_over_live
            .map_or_else(dash, |r| format!("{r:.3}")),
        format!("{:.3}", row.external_fragmentation_at_peak),
        thousands(row.ooms),
        thousands(row.backing_calls),
        format!("{:.0}", row.ns_per_event),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TraceEvent, TraceStats};

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(68_861), "68,861");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(mib(3940 << 20), "3,940.0 MiB");
        assert_eq!(mib(3 << 19), "1.5 MiB");
    }

    fn segment_event(kind: TraceEventKind, size: u64) -> TraceEvent {
        TraceEvent {
            kind,
            addr: 0,
            size,
            stream: 0,
            tag: None,
            time_us: None,
        }
    }

    #[test]
    fn reserved_peak_walks_segment_events_from_the_start() {
        let trace = Trace {
            source: TraceFormat::PytorchSnapshot,
            device: 0,
            initial: Vec::new(),
            initial_segments: Vec::new(),
            events: vec![
                segment_event(TraceEventKind::SegmentAlloc, 20),
                segment_event(TraceEventKind::SegmentAlloc, 10),
                segment_event(TraceEventKind::SegmentFree, 20),
            ],
            segments_at_end: Vec::new(),
            settings: Default::default(),
            stats: TraceStats::default(),
        };
        // 30 at the end: 20 at the start, 50 at the peak.
        assert_eq!(reserved_peak(&trace, 30), Some(50));
        assert_eq!(reserved_peak(&trace, 40), Some(60));
        assert_eq!(reserved_peak(&trace, 5), None);
        // Fewer bytes at the end than the trace added and kept: does not add up.
        let mut grows = trace.clone();
        grows.events.truncate(2);
        assert_eq!(reserved_peak(&grows, 10), None);
    }
}
