//! Executing a plan against an allocator: one allocator call per `step`, so the live
//! view can pause, single-step and change speed. Every block is filled with a pattern
//! derived from its id after allocation and verified just before it is freed; a mismatch
//! means two live blocks overlapped or memory was corrupted, and is reported loudly.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::plan::{plan, Op, Slot};
use super::scenario::{Scenario, SizeRange};
use vramtop_alloc::rng::Rng;
use vramtop_alloc::{AllocError, Allocator, Block, OomReport, Stats};

/// What a probe run did, for `vramtop probe --json` and the live view.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProbeReport {
    pub scenario: String,
    pub policy: String,
    pub backing: String,
    pub seed: u64,
    pub ops_total: usize,
    pub ops_done: usize,
    pub complete: bool,
    pub allocs: u64,
    pub frees: u64,
    /// Requests that failed for lack of memory, not counting the one that ends a fill.
    pub ooms: u64,
    pub last_oom: Option<OomReport>,
    /// Fills that stopped because the allocator ran out, as they are meant to.
    pub fill_stops: u64,
    pub verified_blocks: u64,
    /// 32-bit words that did not read back as written. Anything but 0 is a bug.
    pub verify_mismatches: u64,
    /// Blocks with no memory behind them to check (a bookkeeping backing).
    pub unverified_blocks: u64,
    /// The latest driver or OS errors other than out-of-memory (at most
    /// `KEPT_ERRORS`); the probe goes on past them.
    pub backing_errors: Vec<String>,
    /// All such errors, counted.
    pub backing_error_count: u64,
    pub phase: Option<String>,
    pub step: Option<(u32, u32)>,
    pub elapsed_s: f64,
    pub stats: Stats,
}

/// Backing errors kept in a report: a broken driver context fails every call, and the
/// report must not grow with each one.
pub const KEPT_ERRORS: usize = 8;

/// A symbolic operation being worked through one allocator call at a time.
enum InProgress {
    Fill {
        tag: String,
        size: SizeRange,
        until: f64,
    },
    Frees(VecDeque<Slot>),
}

pub struct Probe {
    allocator: Arc<Allocator>,
    ops: Vec<Op>,
    pos: usize,
    current: Option<InProgress>,
    live: HashMap<Slot, Block>,
    /// Live slots per tag in allocation order, for "free every other block of a tag".
    tag_slots: HashMap<String, Vec<Slot>>,
    next_dynamic_slot: Slot,
    rng: Rng,
    report: ProbeReport,
    started: Instant,
    phase_index: usize,
}

impl Probe {
    pub fn new(scenario: &Scenario, allocator: Arc<Allocator>, backing: &str, seed: u64) -> Self {
        let ops = plan(scenario, seed);
        // Slots made at run time (fills) start above every planned one.
        let next_dynamic_slot = ops
            .iter()
            .filter_map(|o| match o {
                Op::Alloc { slot, .. } => Some(*slot + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let report = ProbeReport {
            scenario: scenario.name.clone(),
            policy: allocator.policy().name().to_string(),
            backing: backing.to_string(),
            seed,
            ops_total: ops.len(),
            ..ProbeReport::default()
        };
        Probe {
            allocator,
            ops,
            pos: 0,
            current: None,
            live: HashMap::new(),
            tag_slots: HashMap::new(),
            next_dynamic_slot,
            rng: Rng::new(seed ^ 0x5eed),
            report,
            started: Instant::now(),
            phase_index: 0,
        }
    }

    /// The leak detector's window: the training step within a phase of steps, else a
    /// bucket of operations, so windows only ever move forward.
    pub fn window(&self) -> u64 {
        /// Operations per window outside training steps.
        const OPS_PER_WINDOW: u64 = 200;
        let within = match self.report.step {
            Some((step, _)) => u64::from(step),
            None => self.pos as u64 / OPS_PER_WINDOW,
        };
        self.phase_index as u64 * 1_000_000 + within
    }

    pub fn allocator(&self) -> &Arc<Allocator> {
        &self.allocator
    }

    pub fn is_done(&self) -> bool {
        self.pos >= self.ops.len() && self.current.is_none()
    }

    /// Whether the phase begun last has no work left: the next `step` starts another
    /// phase, or the plan is done. Talks stop here between phases.
    pub fn at_phase_end(&self) -> bool {
        self.current.is_none() && matches!(self.ops.get(self.pos), None | Some(Op::Phase { .. }))
    }

    /// Execute one allocator call (or one marker). Returns false once the plan is done.
    pub fn step(&mut self) -> bool {
        if let Some(work) = self.current.take() {
            self.continue_work(work);
            return true;
        }
        let Some(op) = self.ops.get(self.pos).cloned() else {
            self.report.complete = true;
            return false;
        };
        self.pos += 1;
        self.report.ops_done = self.pos;
        self.execute(op);
        true
    }

    /// Run until the plan ends or `deadline` passes.
    pub fn run(&mut self, deadline: Option<Instant>) {
        let mut n: u32 = 0;
        while self.step() {
            n = n.wrapping_add(1);
            if n % 64 == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
    }

    pub fn report(&self) -> ProbeReport {
        let mut r = self.report.clone();
        r.complete = self.is_done();
        r.elapsed_s = self.started.elapsed().as_secs_f64();
        r.stats = self.allocator.stats();
        r
    }

    fn execute(&mut self, op: Op) {
        match op {
            Op::Phase { index, caption } => {
                self.report.phase = Some(caption);
                self.report.step = None;
                self.phase_index = index;
            }
            Op::Step { step, of } => self.report.step = Some((step, of)),
            Op::Alloc {
                slot,
                size,
                stream,
                tag,
            } => {
                self.alloc(slot, size, stream, &tag, false);
            }
            Op::Free { slot } => self.free(slot, false),
            Op::FreeDeferred { slot } => self.free(slot, true),
            Op::ProcessPending => {
                self.allocator.process_pending();
            }
            Op::EmptyCache => self.allocator.empty_cache(),
            Op::Fill { tag, size, until } => {
                self.current = Some(InProgress::Fill { tag, size, until })
            }
            Op::FreeEvery { tag, every, offset } => {
                let slots: VecDeque<Slot> = self
                    .live_slots_of(&tag)
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| *i as u32 % every == offset % every)
                    .map(|(_, s)| s)
                    .collect();
                self.current = Some(InProgress::Frees(slots));
            }
            Op::FreeTag { tag } => {
                self.current = Some(InProgress::Frees(self.live_slots_of(&tag).into()));
            }
        }
    }

    fn continue_work(&mut self, work: InProgress) {
        match work {
            InProgress::Fill { tag, size, until } => {
                let capacity = self.allocator.stats().capacity_bytes as f64;
                let allocated = self.allocator.stats().allocated_bytes as f64;
                if allocated >= capacity * until {
                    return;
                }
                let bytes = if size.min >= size.max {
                    size.min
                } else {
                    self.rng.range(size.min, size.max)
                };
                let slot = self.next_dynamic_slot;
                self.next_dynamic_slot += 1;
                if self.alloc(slot, bytes, 0, &tag, true) {
                    self.current = Some(InProgress::Fill { tag, size, until });
                }
            }
            InProgress::Frees(mut slots) => {
                if let Some(slot) = slots.pop_front() {
                    self.free(slot, false);
                }
                if !slots.is_empty() {
                    self.current = Some(InProgress::Frees(slots));
                }
            }
        }
    }

    fn backing_error(&mut self, message: String) {
        self.report.backing_error_count += 1;
        if self.report.backing_errors.len() == KEPT_ERRORS {
            self.report.backing_errors.remove(0);
        }
        self.report.backing_errors.push(message);
    }

    fn live_slots_of(&self, tag: &str) -> Vec<Slot> {
        self.tag_slots
            .get(tag)
            .map(|slots| {
                slots
                    .iter()
                    .copied()
                    .filter(|s| self.live.contains_key(s))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Returns whether the allocation succeeded.
    fn alloc(&mut self, slot: Slot, size: u64, stream: u32, tag: &str, in_fill: bool) -> bool {
        match self.allocator.alloc(size, stream, tag) {
            Ok(block) => {
                self.report.allocs += 1;
                match self.allocator.fill_block(&block, block.id) {
                    Ok(_) => {}
                    Err(e) => self.backing_error(format!("fill of block #{}: {e}", block.id)),
                }
                let slots = self.tag_slots.entry(tag.to_string()).or_default();
                // Freed slots stay listed until the list would grow: then they go, so the
                // list holds at most about twice the tag's live blocks. (Never pruned, it
                // grew by every allocation: 2 KB/s in a 1,000 ops/s churn soak.)
                if slots.len() == slots.capacity() && slots.len() >= 64 {
                    let live = &self.live;
                    slots.retain(|s| live.contains_key(s));
                    // Mostly live still: grow now, or the next push would compact again
                    // (a compaction per allocation).
                    if slots.len() * 2 > slots.capacity() {
                        slots.reserve(slots.len());
                    }
                }
                slots.push(slot);
                self.live.insert(slot, block);
                true
            }
            Err(AllocError::OutOfMemory(oom)) => {
                if in_fill {
                    self.report.fill_stops += 1;
                } else {
                    self.report.ooms += 1;
                    self.report.last_oom = Some(*oom);
                }
                false
            }
            Err(e) => {
                self.backing_error(format!("alloc of {size} B: {e}"));
                false
            }
        }
    }

    fn free(&mut self, slot: Slot, deferred: bool) {
        // A slot whose allocation failed has nothing to free.
        let Some(block) = self.live.remove(&slot) else {
            return;
        };
        match self.allocator.verify_block(&block, block.id) {
            Ok(Some(bad)) => {
                self.report.verified_blocks += 1;
                self.report.verify_mismatches += bad;
            }
            Ok(None) => self.report.unverified_blocks += 1,
            Err(e) => self.backing_error(format!("verify of block #{}: {e}", block.id)),
        }
        let result = if deferred {
            self.allocator.free_deferred(&block)
        } else {
            self.allocator.free(&block)
        };
        match result {
            Ok(()) => self.report.frees += 1,
            Err(e) => self.backing_error(format!("free of block #{}: {e}", block.id)),
        }
    }
}

/// The report as a few lines for people: what ran, the allocator's figures, OOMs and
/// verification.
pub fn summary(r: &ProbeReport) -> String {
    use vramtop_alloc::human_bytes;
    let s = &r.stats;
    let mut out = format!(
        "probe {} · policy {} · backing {} · seed {}\n\
         ops {}/{}{} in {:.2} s · allocs {} · frees {}\n\
         reserved {} (peak {}) · allocated {} · requested {} · live blocks {}\n\
         free {} in {} runs, largest {} · external fragmentation {:.3}\n\
         backing calls {} · OOMs {} · fill stops {} · retries {}\n",
        r.scenario,
        r.policy,
        r.backing,
        r.seed,
        r.ops_done,
        r.ops_total,
        if r.complete {
            " (complete)"
        } else {
            " (stopped at the time limit)"
        },
        r.elapsed_s,
        r.allocs,
        r.frees,
        human_bytes(s.reserved_bytes),
        human_bytes(s.peak_reserved_bytes),
        human_bytes(s.allocated_bytes),
        human_bytes(s.requested_bytes),
        s.live_blocks,
        human_bytes(s.total_free_bytes),
        s.free_runs,
        human_bytes(s.largest_free_bytes),
        s.external_fragmentation,
        s.backing_calls(),
        r.ooms,
        r.fill_stops,
        s.retries,
    );
    if let Some(oom) = &r.last_oom {
        out.push_str(&format!("last OOM: {oom}\n"));
    }
    let verdict = if r.verify_mismatches == 0 {
        "ok"
    } else {
        "MISMATCH: memory was corrupted or blocks overlapped"
    };
    out.push_str(&format!(
        "verified {} blocks ({} unverifiable): {} mismatched words, {verdict}\n",
        r.verified_blocks, r.unverified_blocks, r.verify_mismatches
    ));
    if r.backing_error_count > r.backing_errors.len() as u64 {
        out.push_str(&format!(
            "backing errors: {} in all; the latest {}:\n",
            r.backing_error_count,
            r.backing_errors.len()
        ));
    }
    for e in &r.backing_errors {
        out.push_str(&format!("backing error: {e}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use vramtop_alloc::backing::BookkeepingBacking;
    use vramtop_alloc::{AllocConfig, PolicyKind};

    /// A long churn keeps its per-tag slot lists near its live blocks, not its history.
    #[test]
    fn slot_lists_stay_bounded_by_live_blocks_in_a_long_churn() {
        let scenario = Scenario::from_toml(
            r#"
name = "long churn"
summary = "many allocations, few live"
[[phase]]
kind = "churn"
caption = "churn"
tag = "c"
count = 50000
size = ["512B", "64KiB"]
max_live = 40
"#,
            "test",
        )
        .expect("valid scenario");
        let allocator = Arc::new(Allocator::new(
            PolicyKind::Caching,
            Box::new(BookkeepingBacking::new(1 << 30)),
            AllocConfig::default(),
        ));
        let mut probe = Probe::new(&scenario, allocator, "bookkeeping", 7);
        let mut most = 0;
        while probe.step() {
            most = most.max(probe.tag_slots.values().map(Vec::len).sum::<usize>());
        }
        assert!(probe.report().allocs > 20_000, "the churn ran");
        // 40 live at most: the list compacts when it would grow past its capacity.
        assert!(most <= 256, "slot lists grew to {most} entries");
    }
}
