//! `torch.cuda.empty_cache()` in another process on the same GPU. In the failing process it
//! never changes the OOM (PyTorch released that process's free cached segments itself
//! before it raised), but another PyTorch process's cache is out of its reach: when the
//! device itself ran out, what the other hooked processes hold in wholly free cached
//! segments is what their `empty_cache()` would give back.
//!
//! Which GPU a process is on: the UUID its hook sends (hook 1.2, from torch), else its
//! CUDA ordinal through its `CUDA_VISIBLE_DEVICES` as it started (/proc/PID/environ;
//! unset: the ordinal itself). Two processes that name the same GPU differently (an index
//! and a UUID) are not matched: no verdict is better than one about another GPU. Only
//! states taken before the OOM count.

use vramtop_alloc::remedy::{Remedy, RemedyVerdict, Verdict};
use vramtop_alloc::{human_bytes, round_size, segment_size_for, BlockState};

use super::job::{capped, JobFrame, OomExplained};

/// Under this much room to spare the driver's own overhead could decide it.
const MARGIN: u64 = 64 << 20;

/// Another hooked process on the failing process's GPU, at its last state.
#[derive(Clone, Debug, PartialEq)]
pub struct OtherCache {
    pub pid: u32,
    /// Its command, shortened, for the remedy's name.
    pub command: String,
    /// Bytes in its wholly free cached segments: what `empty_cache()` releases.
    pub idle_bytes: u64,
    /// With expandable segments `empty_cache()` also unmaps free pages of segments in
    /// use, which one state does not count.
    pub expandable: bool,
    /// Seconds between its last state and the OOM.
    pub age_s: f64,
}

impl OtherCache {
    pub fn of(pid: u32, command: String, frame: &JobFrame, oom_time_s: f64) -> Self {
        let idle_bytes = frame
            .map
            .layout
            .segments
            .iter()
            .filter(|s| s.runs.iter().all(|r| r.state == BlockState::Free))
            .map(|s| s.size)
            .sum();
        OtherCache {
            pid,
            command,
            idle_bytes,
            expandable: frame.settings.expandable_segments == Some(true),
            age_s: (oom_time_s - frame.time_s).max(0.0),
        }
    }
}

/// The physical GPU a process's CUDA ordinal names: an index or UUID as the driver knows
/// it. None when the process's environment cannot be read or names no such ordinal.
pub fn gpu_of(pid: u32, ordinal: i64) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let visible = environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(b"CUDA_VISIBLE_DEVICES="))
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let ordinal = usize::try_from(ordinal).ok()?;
    match visible {
        None => Some(ordinal.to_string()),
        Some(list) => list
            .split(',')
            .map(str::trim)
            .nth(ordinal)
            .filter(|id| !id.is_empty())
            .map(str::to_string),
    }
}

/// `empty_cache()` in each other hooked process on the GPU, as one verdict per process
/// that holds something to give back (none when no other process holds any).
pub fn empty_cache_elsewhere(oom: &OomExplained, others: &[OtherCache]) -> Vec<RemedyVerdict> {
    let holding: Vec<&OtherCache> = others
        .iter()
        .filter(|o| o.idle_bytes > 0 || o.expandable)
        .collect();
    if holding.is_empty() {
        return Vec::new();
    }
    let needed = round_size(oom.report.requested_bytes).unwrap_or(oom.report.requested_bytes);
    let segment = segment_size_for(needed);
    let device_free = oom.device_free_bytes.unwrap_or(0);
    let all_idle: u64 = holding.iter().map(|o| o.idle_bytes).sum();
    holding
        .into_iter()
        .map(|other| {
            let name = Remedy::EmptyCacheElsewhere {
                pid: other.pid,
                command: other.command.clone(),
            };
            let when = if other.age_s >= 0.05 {
                format!(" at its last state, {:.1} s before the OOM", other.age_s)
            } else {
                String::new()
            };
            if capped(oom.device_free_bytes, needed) {
                return RemedyVerdict::new(
                    name,
                    Verdict::Fails,
                    format!(
                        "the device had {} free: a memory fraction refused the request, not \
                         the device, and another process's cache does not change the fraction",
                        human_bytes(device_free)
                    ),
                );
            }
            let then = device_free.saturating_add(other.idle_bytes);
            let gives = format!(
                "it holds {} in wholly free cached segments{when}: {} free then, {} needed",
                human_bytes(other.idle_bytes),
                human_bytes(then),
                human_bytes(segment)
            );
            let (verdict, reason) = if then >= segment.saturating_add(MARGIN) {
                (Verdict::Fits, gives)
            } else if other.expandable && then < segment {
                (
                    Verdict::CannotTell,
                    format!(
                        "{gives}; with expandable segments it also unmaps free pages of \
                         segments in use, which one state does not count"
                    ),
                )
            } else if then.saturating_add(MARGIN) <= segment {
                let together = device_free.saturating_add(all_idle);
                let also = if others.len() > 1 && together >= segment.saturating_add(MARGIN) {
                    "; with the other processes' empty_cache() too it would fit"
                } else {
                    ""
                };
                (Verdict::Fails, format!("{gives}{also}"))
            } else {
                (
                    Verdict::CannotTell,
                    format!("{gives}: too close to call, the driver keeps some for itself"),
                )
            };
            RemedyVerdict::new(name, verdict, reason)
        })
        .collect()
}
