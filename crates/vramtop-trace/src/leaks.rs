//! Leak detection over a recorded trace, without an allocator: live bytes per site are
//! summed from the events themselves (an alloc adds to its site, `free_completed` takes
//! the block off the site it was allocated at), and the detector is fed a sample just
//! before every allocation, where each site is at its lowest since the frees before it.
//!
//! Windows are runs of `window_allocs` allocations; by default the trace is cut into
//! `windows` (20) of them and a trailing partial run joins the last. A training step
//! allocates the same number of times whatever its batch, so windows this long span
//! whole steps; a leak is seen in every window when it recurs at least once per window
//! (20 times over the trace), and in most when it is rarer (see `max_flat_gap`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::{Trace, TraceEventKind};
use vramtop_alloc::hash::AddrMap;
use vramtop_alloc::leaks::{DetectorConfig, LeakDetector, Suspect};

/// The site of allocations with no user frame (autograd's backward, for one).
pub const UNTAGGED_SITE: &str = "(no user frame)";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceLeakConfig {
    pub detector: DetectorConfig,
    /// How many windows to cut the trace into when `window_allocs` is not set.
    pub windows: usize,
    /// Allocations per window, overriding `windows`.
    pub window_allocs: Option<usize>,
}

impl Default for TraceLeakConfig {
    fn default() -> Self {
        TraceLeakConfig {
            detector: DetectorConfig::default(),
            windows: 20,
            window_allocs: None,
        }
    }
}

/// Live bytes and blocks per site while walking a trace.
#[derive(Default)]
struct SiteBooks {
    names: Vec<String>,
    index: HashMap<String, usize>,
    usage: Vec<(u64, u64)>,
    /// Live blocks by address: (site, size).
    live: AddrMap<(usize, u64)>,
}

impl SiteBooks {
    fn site(&mut self, tag: Option<&str>) -> usize {
        let tag = tag.unwrap_or(UNTAGGED_SITE);
        if let Some(&i) = self.index.get(tag) {
            return i;
        }
        self.names.push(tag.to_string());
        self.usage.push((0, 0));
        self.index.insert(tag.to_string(), self.names.len() - 1);
        self.names.len() - 1
    }

    fn alloc(&mut self, addr: u64, size: u64, tag: Option<&str>) {
        self.free(addr);
        let site = self.site(tag);
        self.live.insert(addr, (site, size));
        let u = &mut self.usage[site];
        u.0 = u.0.saturating_add(size);
        u.1 += 1;
    }

    fn free(&mut self, addr: u64) {
        if let Some((site, size)) = self.live.remove(&addr) {
            let u = &mut self.usage[site];
            u.0 = u.0.saturating_sub(size);
            u.1 = u.1.saturating_sub(1);
        }
    }

    fn samples(&self) -> Vec<(&str, u64, u64)> {
        self.names
            .iter()
            .zip(&self.usage)
            .filter(|(_, u)| u.1 > 0)
            .map(|(name, &(bytes, blocks))| (name.as_str(), bytes, blocks))
            .collect()
    }
}

/// The detector after walking the whole trace: `suspects()` for the verdict,
/// `sites()` for the trends.
pub fn detect_in_trace(trace: &Trace, config: &TraceLeakConfig) -> LeakDetector {
    let mut detector = LeakDetector::new(config.detector.clone());
    let allocs = trace
        .events
        .iter()
        .filter(|e| e.kind == TraceEventKind::Alloc)
        .count();
    let per_window = config
        .window_allocs
        .unwrap_or_else(|| allocs.div_ceil(config.windows.max(1)))
        .max(1);
    let last_window = (allocs / per_window).max(1) - 1;
    let window_of = |n: usize| (n / per_window).min(last_window) as u64;

    let mut books = SiteBooks::default();
    for block in &trace.initial {
        books.alloc(block.addr, block.size, block.tag.as_deref());
    }
    let mut n = 0;
    for event in &trace.events {
        match event.kind {
            TraceEventKind::Alloc => {
                detector.observe(window_of(n), &books.samples());
                n += 1;
                books.alloc(event.addr, event.size, event.tag.as_deref());
            }
            TraceEventKind::FreeCompleted => books.free(event.addr),
            _ => {}
        }
    }
    detector.observe(window_of(n.saturating_sub(1)), &books.samples());
    detector.close_window();
    detector
}

/// Sites whose floor kept rising over the trace; empty when none did.
pub fn suspects_in_trace(trace: &Trace, config: &TraceLeakConfig) -> Vec<Suspect> {
    detect_in_trace(trace, config).suspects()
}
