//! What a job's memory is for: its parameters (and buffers), gradients and optimizer
//! state, as the hook read them off the job's own tensors (hook 1.4), beside what no role
//! claims (activations, temporaries, inputs) and PyTorch's cache. The roles are
//! measurements (each storage's bytes, counted once); "other" is the allocated bytes less
//! them, so it also holds the few bytes PyTorch rounds each block up by.

use serde::{Deserialize, Serialize};

use vramtop_alloc::human_bytes;

use crate::cause::Shortfall;

/// The hook's `roles`: bytes of the job's tensors' storages by role on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Roles {
    #[serde(default)]
    pub parameters: u64,
    #[serde(default)]
    pub gradients: u64,
    #[serde(default)]
    pub optimizer_state: u64,
    /// `parameters` split (hook 1.17, where the job has an optimizer): those an optimizer
    /// trains (holds, and they need a gradient), and the rest, frozen (a distilling job's
    /// teacher, a LoRA model's base weights); buffers are neither. 0 from older hooks.
    #[serde(default)]
    pub trained: u64,
    #[serde(default)]
    pub frozen: u64,
    /// Root models and optimizers the hook found.
    #[serde(default)]
    pub models: u64,
    #[serde(default)]
    pub optimizers: u64,
    /// When they were read (`time.time()`): for a job with an optimizer, just after its
    /// last optimizer step that a state asked them of (the hook reads gradients on the
    /// job's thread only), else at the state.
    #[serde(default)]
    pub time_s: Option<f64>,
    /// PyTorch's allocated and reserved bytes read with them, so that what no role claims
    /// is told at the same moment.
    #[serde(default)]
    pub allocated: Option<u64>,
    #[serde(default)]
    pub reserved: Option<u64>,
    /// At an OOM (hook 1.13): the job was still in its first pass through its models, no
    /// root module's forward run twice, so no step or batch had ended before it.
    #[serde(default)]
    pub first_pass: bool,
}

/// The roles beside the allocator's figures at the same moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RoleBreakdown {
    pub parameters: u64,
    /// Of the parameters, those an optimizer trains and the frozen rest (`Roles::trained`).
    pub trained: u64,
    pub frozen: u64,
    pub gradients: u64,
    pub optimizer_state: u64,
    /// Allocated bytes no role claims: activations, temporaries, inputs.
    pub other: u64,
    /// Reserved but not allocated: PyTorch's cache.
    pub cache: u64,
    pub models: u64,
    pub optimizers: u64,
    /// When the roles were read (see `Roles::time_s`).
    pub time_s: Option<f64>,
}

impl RoleBreakdown {
    /// The roles beside PyTorch's allocated and reserved bytes: those read with them when
    /// the hook sent them, else the ones given (the same state's).
    pub fn of(roles: &Roles, allocated: u64, reserved: u64) -> Self {
        let allocated = roles.allocated.unwrap_or(allocated);
        let reserved = roles.reserved.unwrap_or(reserved);
        let claimed = roles
            .parameters
            .saturating_add(roles.gradients)
            .saturating_add(roles.optimizer_state);
        RoleBreakdown {
            parameters: roles.parameters,
            trained: roles.trained.min(roles.parameters),
            frozen: roles.frozen.min(roles.parameters),
            gradients: roles.gradients,
            optimizer_state: roles.optimizer_state,
            other: allocated.saturating_sub(claimed),
            cache: reserved.saturating_sub(allocated),
            models: roles.models,
            optimizers: roles.optimizers,
            time_s: roles.time_s,
        }
    }

    /// The parts in the order a bar draws them: (name, bytes).
    pub fn parts(&self) -> [(&'static str, u64); 5] {
        [
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("activations and other", self.other),
            ("cache", self.cache),
        ]
    }

    /// "parameters 1.2 GiB · gradients 1.2 GiB · optimizer state 2.4 GiB (2.0x the
    /// parameters) · activations and other 6.2 GiB (58 % of live) · cache 1.5 GiB".
    /// Where some parameters are frozen, "parameters 555.8 MiB (294.4 MiB frozen)" and the
    /// optimizer's state against the parameters it trains ("2.0x the trained
    /// parameters"): a distilling job read "0.9x the parameters", its teacher among them.
    pub fn line(&self) -> String {
        let live = self
            .parameters
            .saturating_add(self.gradients)
            .saturating_add(self.optimizer_state)
            .saturating_add(self.other);
        self.parts()
            .iter()
            .map(|&(name, bytes)| {
                let note = match name {
                    "parameters" if self.frozen > 0 => {
                        format!(" ({} frozen)", human_bytes(self.frozen))
                    }
                    // Nothing trained: no ratio, rather than one against frozen weights.
                    "optimizer state" if self.frozen > 0 && self.trained == 0 => String::new(),
                    "optimizer state" if self.frozen > 0 && bytes > 0 => format!(
                        " ({:.1}x the trained parameters)",
                        bytes as f64 / self.trained as f64
                    ),
                    "optimizer state" if self.parameters > 0 && bytes > 0 => format!(
                        " ({:.1}x the parameters)",
                        bytes as f64 / self.parameters as f64
                    ),
                    "activations and other" if live > 0 => {
                        format!(" ({:.0} % of live)", bytes as f64 * 100.0 / live as f64)
                    }
                    _ => String::new(),
                };
                format!("{name} {}{note}", human_bytes(bytes))
            })
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

impl RoleBreakdown {
    /// For an OOM `shortfall` short (over its cap, or too big for the GPU) asking for
    /// `request` bytes: what each knob would give back, and whether that is enough (against
    /// the most it may be short). What the roles hold is measured; what halving the batch
    /// gives back is an estimate (the activations and the request, which grow with the
    /// batch, halved), and it says so. None when nothing would be said (no roles, no
    /// shortfall).
    pub fn knobs_line(&self, shortfall: Shortfall, request: u64) -> Option<String> {
        if shortfall.most == 0 {
            return None;
        }
        let enough = |bytes: u64| {
            if bytes >= shortfall.most {
                "enough"
            } else {
                "not enough"
            }
        };
        let mut knobs = Vec::new();
        if self.other > 0 {
            let half = self.other.saturating_add(request) / 2;
            knobs.push(format!(
                "half the batch or sequence about {} (an estimate: half the activations and \
                 the request; {})",
                human_bytes(half),
                enough(half)
            ));
        }
        if self.optimizer_state > 0 {
            knobs.push(format!(
                "an optimizer without state (SGD) {} (measured; {})",
                human_bytes(self.optimizer_state),
                enough(self.optimizer_state)
            ));
        }
        if knobs.is_empty() {
            return None;
        }
        Some(format!(
            "{} short; would give back: {}",
            shortfall.text(),
            knobs.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn other_is_the_allocated_bytes_no_role_claims_and_the_cache_the_rest() {
        let roles = Roles {
            parameters: 100 * MIB,
            gradients: 100 * MIB,
            optimizer_state: 200 * MIB,
            models: 1,
            optimizers: 1,
            ..Default::default()
        };
        let b = RoleBreakdown::of(&roles, 1000 * MIB, 1200 * MIB);
        assert_eq!(b.other, 600 * MIB);
        assert_eq!(b.cache, 200 * MIB);
        assert_eq!(
            b.line(),
            "parameters 100.0 MiB · gradients 100.0 MiB · optimizer state 200.0 MiB (2.0x the \
             parameters) · activations and other 600.0 MiB (60 % of live) · cache 200.0 MiB"
        );
    }

    /// A distillation's student trained beside its frozen teacher (hook 1.17): the teacher's
    /// bytes are parameters, said apart, and AdamW's state is told against the student's.
    #[test]
    fn frozen_parameters_are_said_apart_and_the_state_told_against_the_trained() {
        let roles = Roles {
            parameters: 556 * MIB,
            trained: 262 * MIB,
            frozen: 294 * MIB,
            optimizer_state: 524 * MIB,
            ..Default::default()
        };
        let line = RoleBreakdown::of(&roles, 8 * 1024 * MIB, 9 * 1024 * MIB).line();
        assert!(
            line.starts_with(
                "parameters 556.0 MiB (294.0 MiB frozen) · gradients 0 B · optimizer state \
                 524.0 MiB (2.0x the trained parameters)"
            ),
            "{line}"
        );
        // Everything frozen (an optimizer holding none of them): no ratio against frozen
        // weights.
        let all_frozen = Roles {
            trained: 0,
            frozen: 556 * MIB,
            ..roles
        };
        let line = RoleBreakdown::of(&all_frozen, 8 * 1024 * MIB, 9 * 1024 * MIB).line();
        assert!(line.contains("optimizer state 524.0 MiB · "), "{line}");
        // An older hook sends no "frozen": the line is as before.
        let old: Roles =
            serde_json::from_str(r#"{"parameters": 100, "optimizer_state": 200}"#).unwrap();
        assert_eq!(old.frozen, 0);
        assert!(RoleBreakdown::of(&old, 400, 400)
            .line()
            .contains("(2.0x the parameters)"));
    }

    #[test]
    fn knobs_say_what_each_gives_back_and_whether_it_is_enough() {
        let b = RoleBreakdown {
            parameters: 100 * MIB,
            gradients: 100 * MIB,
            optimizer_state: 200 * MIB,
            other: 600 * MIB,
            ..Default::default()
        };
        let short = |least, most| Shortfall { least, most };
        assert_eq!(
            b.knobs_line(short(250 * MIB, 250 * MIB), 100 * MIB)
                .unwrap(),
            "250.0 MiB short; would give back: half the batch or sequence about 350.0 MiB (an \
             estimate: half the activations and the request; enough); an optimizer without \
             state (SGD) 200.0 MiB (measured; not enough)"
        );
        // A step in progress: enough only against the most it may be short.
        assert_eq!(
            b.knobs_line(short(150 * MIB, 250 * MIB), 100 * MIB)
                .unwrap(),
            "150.0 MiB to 250.0 MiB short; would give back: half the batch or sequence about \
             350.0 MiB (an estimate: half the activations and the request; enough); an \
             optimizer without state (SGD) 200.0 MiB (measured; not enough)"
        );
        assert_eq!(b.knobs_line(short(0, 0), MIB), None);
        assert_eq!(
            RoleBreakdown::default().knobs_line(short(MIB, MIB), MIB),
            None
        );
    }

    #[test]
    fn the_totals_read_with_the_roles_win_over_a_later_states() {
        // Read just after a step (gradients alive); the state came after zero_grad.
        let roles = Roles {
            parameters: 100 * MIB,
            gradients: 100 * MIB,
            allocated: Some(300 * MIB),
            reserved: Some(400 * MIB),
            ..Default::default()
        };
        let b = RoleBreakdown::of(&roles, 150 * MIB, 400 * MIB);
        assert_eq!((b.other, b.cache), (100 * MIB, 100 * MIB));
    }

    #[test]
    fn roles_read_more_than_allocated_leave_no_negative_other() {
        // Read a moment apart from the stats: never a wrapped figure.
        let roles = Roles {
            parameters: 10 * MIB,
            ..Default::default()
        };
        let b = RoleBreakdown::of(&roles, 8 * MIB, 8 * MIB);
        assert_eq!((b.other, b.cache), (0, 0));
    }
}
