//! What every trace target does with a trace that parsed: the steps `vramtop replay` and
//! `vramtop snapshot` take next, so a hostile value that parses but breaks them is found.

use vramtop::alloc::PolicyKind;
use vramtop::trace::{replay, snapshot, LoadOptions, Trace};

/// Replaying is linear in events; past this many the target only parses, so one input
/// stays well under libFuzzer's time limit.
const MAX_REPLAYED_EVENTS: usize = 4096;

/// Small limits, so the fuzzer reaches "too large" and "too deep" with small inputs.
pub fn small_limits() -> LoadOptions {
    let mut opts = LoadOptions::default();
    opts.max_bytes = 4 << 20;
    opts
}

pub fn exercise(trace: &Trace) {
    let _ = trace.notices();
    let _ = trace.live_bytes_peak(512);
    let _ = trace.live_bytes_peak_with_initial(512);
    let layout = snapshot::layout_at_end(trace);
    let _ = snapshot::summary("fuzz", trace, &layout);
    if trace.events.len() + trace.initial.len() <= MAX_REPLAYED_EVENTS {
        for policy in [PolicyKind::Caching, PolicyKind::Expandable] {
            let _ = replay::replay(trace, policy, replay::ReplayOptions::default());
        }
    }
}
