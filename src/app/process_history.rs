//! Each GPU process over time, for its own screen (`Enter` on a process): the memory the
//! driver says it holds at every poll and, for a hooked job, PyTorch's allocated and
//! reserved beside it, with the polls at which it ran out of memory or was first flagged
//! for a leak. One sample per poll for every process followed, so all share the device
//! history chart's time axis.

use std::collections::HashMap;

use super::history::History;
use super::HISTORY_SAMPLES;
use vramtop_attach::AttachedJobs;
use vramtop_telemetry::SystemSnapshot;

/// Processes followed at most: a host churning through short jobs must not grow this.
const MAX_PROCESSES: usize = 256;

/// What happened to a process at one poll, marked on the time axis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mark {
    #[default]
    None,
    /// A new OOM (its time differs from the last one seen).
    Oom,
    /// Leak suspects appeared where there were none.
    Leak,
}

/// One process's samples, one per poll since it was first seen.
#[derive(Clone, Debug)]
pub struct ProcessHistory {
    pub device: Option<u32>,
    /// Memory the driver says it holds (NVML); None where it could not say.
    pub memory: History<Option<u64>>,
    /// PyTorch's (allocated, reserved - allocated), for a hooked job with a state.
    pub torch: History<(Option<u64>, Option<u64>)>,
    pub marks: History<Mark>,
    /// The last OOM's time and whether leaks were flagged, to mark only what is new.
    last_oom_s: Option<f64>,
    leaking: bool,
    /// Polls since the process was last listed anywhere.
    absent: usize,
    /// Whether vramtop is attached to it (it has PyTorch figures).
    pub hooked: bool,
}

impl ProcessHistory {
    fn new() -> Self {
        ProcessHistory {
            device: None,
            memory: History::new(HISTORY_SAMPLES),
            torch: History::new(HISTORY_SAMPLES),
            marks: History::new(HISTORY_SAMPLES),
            last_oom_s: None,
            leaking: false,
            absent: 0,
            hooked: false,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct ProcessHistories {
    by_pid: HashMap<u32, ProcessHistory>,
}

impl ProcessHistories {
    pub fn get(&self, pid: u32) -> Option<&ProcessHistory> {
        self.by_pid.get(&pid)
    }

    /// One poll: a sample for every process the snapshot or the attacher lists, and an
    /// empty one for those followed but gone (until they have been gone a whole chart).
    pub fn record(&mut self, snapshot: &SystemSnapshot, jobs: &AttachedJobs) {
        let mut memory: HashMap<u32, (u32, Option<u64>)> = HashMap::new();
        for device in &snapshot.devices {
            for process in &device.processes {
                let entry = memory.entry(process.pid).or_insert((device.index, Some(0)));
                // A process on two devices: the sum, as its own total.
                entry.1 = match (entry.1, process.used_memory_bytes) {
                    (Some(a), Some(b)) => Some(a + b),
                    _ => None,
                };
            }
        }
        // Ended jobs too: an OOM that kills a rank ends it within the same poll, and its
        // mark must still show; an ended job's figures are not sampled (below).
        let hooked = jobs
            .jobs
            .iter()
            .filter(|j| j.frame.is_some() && !jobs.is_launcher(j.pid));
        for job in hooked.clone() {
            self.by_pid
                .entry(job.pid)
                .or_insert_with(ProcessHistory::new);
        }
        for &pid in memory.keys() {
            self.by_pid.entry(pid).or_insert_with(ProcessHistory::new);
        }
        for (pid, history) in &mut self.by_pid {
            let job = hooked.clone().find(|j| j.pid == *pid);
            let listed = memory.get(pid);
            history.absent = if listed.is_some() || job.is_some_and(|j| !j.ended) {
                0
            } else {
                history.absent + 1
            };
            history.memory.push(listed.and_then(|m| m.1));
            if let Some((device, _)) = listed {
                history.device = Some(*device);
            }
            let figures = job.filter(|j| !j.ended).and_then(|j| j.figures());
            history.hooked |= figures.is_some();
            history.torch.push(figures.map_or((None, None), |f| {
                (
                    Some(f.allocated_bytes),
                    Some(f.reserved_bytes.saturating_sub(f.allocated_bytes)),
                )
            }));
            let mut mark = Mark::None;
            if let Some(job) = job {
                if history.device.is_none() {
                    history.device = figures.and_then(|f| u32::try_from(f.device).ok());
                }
                let oom_s = job.oom.as_ref().map(|o| o.time_s);
                if oom_s.is_some() && oom_s != history.last_oom_s {
                    mark = Mark::Oom;
                }
                history.last_oom_s = oom_s;
                let leaking = !job.suspects.is_empty();
                if leaking && !history.leaking && mark == Mark::None {
                    mark = Mark::Leak;
                }
                history.leaking = leaking;
            }
            history.marks.push(mark);
        }
        self.by_pid.retain(|_, h| h.absent < HISTORY_SAMPLES);
        if self.by_pid.len() > MAX_PROCESSES {
            // Keep those seen most recently.
            let mut by_absence: Vec<(usize, u32)> = self
                .by_pid
                .iter()
                .map(|(pid, h)| (h.absent, *pid))
                .collect();
            by_absence.sort_unstable();
            for (_, pid) in by_absence.into_iter().skip(MAX_PROCESSES) {
                self.by_pid.remove(&pid);
            }
        }
    }
}
