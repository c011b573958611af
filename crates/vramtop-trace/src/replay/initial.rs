//! The blocks a replay places before the first event: the trace's own (live at its end,
//! never allocated in it) and those whose first event is a free (allocated before the
//! trace began and freed during it, such as a model deleted at the end).

use std::collections::HashSet;

use crate::{LiveAtStart, Trace, TraceEventKind};

/// The blocks live before the first event, in address order: the trace's initial
/// blocks, then those first seen being freed; and how many of the latter there are.
pub(super) fn live_before_trace(trace: &Trace) -> (Vec<LiveAtStart>, u64) {
    let mut seen: HashSet<u64> = trace.initial.iter().map(|b| b.addr).collect();
    let mut blocks = trace.initial.clone();
    let mut from_frees = 0;
    for event in &trace.events {
        match event.kind {
            TraceEventKind::Alloc => {
                seen.insert(event.addr);
            }
            TraceEventKind::FreeRequested | TraceEventKind::FreeCompleted
                if seen.insert(event.addr) =>
            {
                from_frees += 1;
                blocks.push(LiveAtStart {
                    addr: event.addr,
                    size: event.size,
                    stream: event.stream,
                    tag: event.tag.clone(),
                });
            }
            _ => {}
        }
    }
    blocks.sort_by_key(|b| b.addr);
    (blocks, from_frees)
}
