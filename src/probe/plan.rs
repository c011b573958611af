//! Turning a scenario into a plan: a flat list of operations, drawn once from the seed,
//! so a run is repeatable and the live view can pause, step and seek through it.
//! Operations that depend on what the allocator did (a fill, freeing every other live
//! block) stay symbolic and are resolved when executed.

use std::collections::VecDeque;

use super::scenario::{Phase, Scenario, SizeRange};
use vramtop_alloc::rng::Rng;

/// A handle to one planned allocation, so a later free can name it before it exists.
pub type Slot = u32;

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Start of a phase: its index and caption, for the live view and talks.
    Phase {
        index: usize,
        caption: String,
    },
    /// Start of a training step (1-based), for "step 12 / 60".
    Step {
        step: u32,
        of: u32,
    },
    Alloc {
        slot: Slot,
        size: u64,
        stream: u32,
        tag: String,
    },
    Free {
        slot: Slot,
    },
    /// A stream-ordered free: the block stays pending until `ProcessPending`.
    FreeDeferred {
        slot: Slot,
    },
    ProcessPending,
    Fill {
        tag: String,
        size: SizeRange,
        until: f64,
    },
    FreeEvery {
        tag: String,
        every: u32,
        offset: u32,
    },
    FreeTag {
        tag: String,
    },
    EmptyCache,
}

struct Planner {
    rng: Rng,
    next_slot: Slot,
    ops: Vec<Op>,
}

impl Planner {
    fn alloc(&mut self, size: u64, stream: u32, tag: &str) -> Slot {
        let slot = self.next_slot;
        self.next_slot += 1;
        self.ops.push(Op::Alloc {
            slot,
            size,
            stream,
            tag: tag.to_string(),
        });
        slot
    }

    /// Log-uniform in [min, max], so small and large sizes are both common, as in real
    /// workloads; rounded to 256 B so sizes look like tensors, not noise.
    fn size(&mut self, range: SizeRange) -> u64 {
        if range.min >= range.max {
            return range.min;
        }
        let lo = (range.min.max(1) as f64).ln();
        let hi = (range.max as f64).ln();
        let v = (lo + self.rng.next_f64() * (hi - lo)).exp() as u64;
        (v.div_ceil(256) * 256).clamp(range.min, range.max)
    }
}

pub fn plan(scenario: &Scenario, seed: u64) -> Vec<Op> {
    let mut p = Planner {
        rng: Rng::new(seed),
        next_slot: 0,
        ops: Vec::new(),
    };
    for (index, phase) in scenario.phases.iter().enumerate() {
        p.ops.push(Op::Phase {
            index,
            caption: phase.caption().to_string(),
        });
        plan_phase(&mut p, phase);
    }
    p.ops
}

fn plan_phase(p: &mut Planner, phase: &Phase) {
    match phase {
        Phase::Alloc {
            tag,
            size,
            count,
            stream,
            ..
        } => {
            for _ in 0..*count {
                let bytes = p.size(*size);
                p.alloc(bytes, *stream, tag);
            }
        }
        Phase::Fill {
            tag, size, until, ..
        } => p.ops.push(Op::Fill {
            tag: tag.clone(),
            size: *size,
            until: *until,
        }),
        Phase::FreeEvery {
            tag, every, offset, ..
        } => p.ops.push(Op::FreeEvery {
            tag: tag.clone(),
            every: (*every).max(1),
            offset: *offset,
        }),
        Phase::FreeTag { tag, .. } => p.ops.push(Op::FreeTag { tag: tag.clone() }),
        Phase::EmptyCache { .. } => p.ops.push(Op::EmptyCache),
        Phase::Churn {
            tag,
            count,
            size,
            max_live,
            ..
        } => plan_churn(p, tag, *count, *size, *max_live),
        Phase::Steps {
            steps,
            layers,
            batch,
            activation_per_sample,
            gradient,
            leak,
            ..
        } => {
            for step in 1..=*steps {
                p.ops.push(Op::Step { step, of: *steps });
                let b = p.rng.range(batch[0] as u64, batch[1].max(batch[0]) as u64);
                plan_step(
                    p,
                    *layers,
                    b.saturating_mul(activation_per_sample.0),
                    gradient.0,
                    leak.map(|l| l.0),
                );
            }
        }
        Phase::Streams {
            streams,
            ops,
            size,
            lifetime,
            process_every,
            ..
        } => plan_streams(p, *streams, *ops, *size, *lifetime, *process_every),
        Phase::Steady {
            tag,
            blocks,
            size,
            steps,
            ..
        } => {
            let mut live: Vec<(Slot, u64)> = (0..*blocks)
                .map(|_| {
                    let bytes = p.size(*size);
                    (p.alloc(bytes, 0, tag), bytes)
                })
                .collect();
            for step in 1..=*steps {
                p.ops.push(Op::Step { step, of: *steps });
                if live.is_empty() {
                    break;
                }
                let i = p.rng.range(0, live.len() as u64 - 1) as usize;
                let (slot, bytes) = live[i];
                p.ops.push(Op::Free { slot });
                live[i] = (p.alloc(bytes, 0, tag), bytes);
            }
        }
    }
}

fn plan_churn(p: &mut Planner, tag: &str, count: u32, size: SizeRange, max_live: u32) {
    let mut live: Vec<Slot> = Vec::new();
    for _ in 0..count {
        if live.len() as u32 >= max_live.max(1) {
            let i = p.rng.range(0, live.len() as u64 - 1) as usize;
            let slot = live.swap_remove(i);
            p.ops.push(Op::Free { slot });
        }
        let bytes = p.size(size);
        live.push(p.alloc(bytes, 0, tag));
    }
    // Free two thirds of what is left in random order: churn leaves holes behind.
    let keep = live.len() / 3;
    while live.len() > keep {
        let i = p.rng.range(0, live.len() as u64 - 1) as usize;
        let slot = live.swap_remove(i);
        p.ops.push(Op::Free { slot });
    }
}

fn plan_step(p: &mut Planner, layers: u32, activation: u64, gradient: u64, leak: Option<u64>) {
    let mut activations = Vec::with_capacity(layers as usize);
    for layer in 0..layers {
        // Later layers are smaller, as in a network that downsamples.
        let bytes = (activation >> (layer / 3)).max(512);
        activations.push(p.alloc(bytes, 0, &format!("activation L{layer}")));
    }
    if let Some(bytes) = leak {
        // Allocated and never freed: the leak the leaks view should point at.
        p.alloc(bytes, 0, "leak: kept output");
    }
    for (layer, slot) in activations.into_iter().enumerate().rev() {
        let grad = p.alloc(gradient, 0, &format!("gradient L{layer}"));
        p.ops.push(Op::Free { slot });
        p.ops.push(Op::Free { slot: grad });
    }
}

fn plan_streams(
    p: &mut Planner,
    streams: u32,
    ops: u32,
    size: SizeRange,
    lifetime: [u32; 2],
    process_every: u32,
) {
    // Frees due at an operation index, per stream: a block lives for a drawn number of ops.
    let mut due: VecDeque<(u32, Slot)> = VecDeque::new();
    for i in 0..ops {
        let stream = i % streams.max(1);
        let bytes = p.size(size);
        let slot = p.alloc(bytes, stream, &format!("stream {stream}"));
        let life =
            p.rng
                .range(lifetime[0] as u64, lifetime[1].max(lifetime[0]) as u64) as u32;
        let at = i.saturating_add(life);
        let pos = due.partition_point(|(t, _)| *t <= at);
        due.insert(pos, (at, slot));
        while due.front().is_some_and(|(t, _)| *t <= i) {
            if let Some((_, s)) = due.pop_front() {
                p.ops.push(Op::FreeDeferred { slot: s });
            }
        }
        if process_every > 0 && i % process_every == process_every - 1 {
            p.ops.push(Op::ProcessPending);
        }
    }
    for (_, slot) in due {
        p.ops.push(Op::FreeDeferred { slot });
    }
    p.ops.push(Op::ProcessPending);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::scenario::{Scenario, BUILTIN};

    #[test]
    fn same_seed_same_plan() {
        for (name, _) in BUILTIN {
            let s = Scenario::load(name).expect("builtin");
            assert_eq!(plan(&s, 9), plan(&s, 9), "{name}");
        }
        let s = Scenario::load("churn").expect("builtin");
        assert_ne!(plan(&s, 1), plan(&s, 2));
    }

    #[test]
    fn every_free_names_an_earlier_alloc_once() {
        for (name, _) in BUILTIN {
            let s = Scenario::load(name).expect("builtin");
            let mut allocated = std::collections::HashSet::new();
            let mut freed = std::collections::HashSet::new();
            for op in plan(&s, 3) {
                match op {
                    Op::Alloc { slot, .. } => assert!(allocated.insert(slot)),
                    Op::Free { slot } | Op::FreeDeferred { slot } => {
                        assert!(allocated.contains(&slot), "{name}: free before alloc");
                        assert!(freed.insert(slot), "{name}: slot {slot} freed twice");
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn leak_plan_keeps_one_buffer_per_step() {
        let s = Scenario::load("leak").expect("builtin");
        let ops = plan(&s, 1);
        let leaks = ops
            .iter()
            .filter(|o| matches!(o, Op::Alloc { tag, .. } if tag.starts_with("leak")))
            .count();
        assert_eq!(leaks, 60);
    }
}
