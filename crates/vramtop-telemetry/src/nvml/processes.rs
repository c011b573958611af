//! GPU processes as the NVML source reports them: NVML's compute and graphics lists merged
//! by pid, per-process SM utilisation from a slow call made every few seconds, and the host
//! side (user, command, CPU, RSS) from /proc with each pid's namespace status.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::api::{ApiError, GpuProcess, ProcessUtilSample};
use crate::procfs::{ProcInfo, ProcSampler};
use crate::{HostView, ProcessKind};

/// One pid on one device after merging NVML's two lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergedProcess {
    pub pid: u32,
    pub kind: ProcessKind,
    pub used_bytes: Option<u64>,
}

/// Merge the compute and graphics lists into `merged` (cleared first), one entry per pid,
/// in the order NVML listed them.
///
/// Memory is the max of a pid's entries, not the sum: NVML reports a process's memory on
/// the device as a whole in each list it appears in (nvidia-smi shows a C+G process once,
/// with one figure), so adding the entries would count the same bytes twice. The max is
/// never more than the process holds. A pid listed twice in one list is merged the same way.
pub fn merge_process_lists(
    compute: &[GpuProcess],
    graphics: &[GpuProcess],
    merged: &mut Vec<MergedProcess>,
) {
    merged.clear();
    let tagged = compute
        .iter()
        .map(|p| (p, ProcessKind::Compute))
        .chain(graphics.iter().map(|p| (p, ProcessKind::Graphics)));
    // Lists hold a handful of entries, so a linear search beats hashing.
    for (p, kind) in tagged {
        match merged.iter_mut().find(|m| m.pid == p.pid) {
            Some(m) => {
                if m.kind != kind {
                    m.kind = ProcessKind::Both;
                }
                m.used_bytes = max_known(m.used_bytes, p.used_bytes);
            }
            None => merged.push(MergedProcess {
                pid: p.pid,
                kind,
                used_bytes: p.used_bytes,
            }),
        }
    }
}

fn max_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Per-process SM utilisation of one device. The NVML call costs about 2.5 ms on an H100
/// (a whole poll otherwise costs about 15 us), so it is made at most once per `interval`
/// and its values are reused in between.
#[derive(Debug)]
pub struct ProcessUtilCache {
    interval: Duration,
    last_query: Option<Instant>,
    /// Timestamp of the newest sample seen, so the next query asks only for newer ones.
    last_seen_us: u64,
    sm_util_by_pid: HashMap<u32, u32>,
}

impl ProcessUtilCache {
    pub fn new(interval: Duration) -> Self {
        ProcessUtilCache {
            interval,
            last_query: None,
            last_seen_us: 0,
            sm_util_by_pid: HashMap::new(),
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether the slow call is due. With no processes listed there is nothing to
    /// attribute, so it waits; the first poll that lists one queries at once.
    pub fn due(&self, now: Instant, processes_listed: bool) -> bool {
        processes_listed
            && self
                .last_query
                .is_none_or(|at| now.saturating_duration_since(at) >= self.interval)
    }

    /// Where the next query starts; 0 asks for every sample the driver holds.
    pub fn since_us(&self) -> u64 {
        self.last_seen_us
    }

    /// Take a query's answer. `NotFound` means no process had a sample in the window: no
    /// data, so earlier values are dropped rather than shown as current. A lost GPU is
    /// handed back for the caller to act on; other failures (`NotSupported` under MIG,
    /// say) leave no data and are asked again at the next interval.
    pub fn record(
        &mut self,
        now: Instant,
        answer: Result<Vec<ProcessUtilSample>, ApiError>,
    ) -> Result<(), ApiError> {
        self.last_query = Some(now);
        self.sm_util_by_pid.clear();
        match answer {
            Ok(samples) => {
                // Several samples per pid can come back; the newest one stands.
                let mut newest: HashMap<u32, u64> = HashMap::with_capacity(samples.len());
                for s in samples {
                    self.last_seen_us = self.last_seen_us.max(s.timestamp_us);
                    let is_newer = newest.get(&s.pid).is_none_or(|&t| s.timestamp_us >= t);
                    if is_newer {
                        newest.insert(s.pid, s.timestamp_us);
                        self.sm_util_by_pid.insert(s.pid, s.sm_util_pct);
                    }
                }
                Ok(())
            }
            Err(e) if e.is_lost() => Err(e),
            Err(_) => Ok(()),
        }
    }

    /// A pid with no sample in the last window has no data, not 0 %.
    pub fn sm_util(&self, pid: u32) -> Option<u32> {
        self.sm_util_by_pid.get(&pid).copied()
    }
}

/// The host side of GPU processes: /proc facts, and which pids were seen there before so
/// that one that has gone is `Exited` rather than `OtherNamespace`.
pub struct HostTracker {
    sampler: ProcSampler,
    /// Pids found in /proc at some poll while NVML still listed them.
    seen_in_proc: HashSet<u32>,
    /// This poll's answers, so a pid on two GPUs is read once (a second read moments
    /// later would give a CPU share over a near-zero interval).
    this_poll: HashMap<u32, (HostView, ProcInfo)>,
    live: Vec<u32>,
}

impl HostTracker {
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        HostTracker {
            sampler: ProcSampler::new(proc_root),
            seen_in_proc: HashSet::new(),
            this_poll: HashMap::new(),
            live: Vec::new(),
        }
    }

    pub fn begin_poll(&mut self) {
        self.this_poll.clear();
        self.live.clear();
    }

    pub fn lookup(&mut self, pid: u32) -> (HostView, ProcInfo) {
        if let Some(known) = self.this_poll.get(&pid) {
            return known.clone();
        }
        let answer = match self.sampler.sample(pid) {
            Some(info) => (HostView::Visible, info),
            // hidepid or a process between exit and reap: there, but unreadable.
            None if self.sampler.exists(pid) => (HostView::Visible, ProcInfo::default()),
            None if self.seen_in_proc.contains(&pid) => (HostView::Exited, ProcInfo::default()),
            None => (HostView::OtherNamespace, ProcInfo::default()),
        };
        if answer.0 == HostView::Visible {
            self.seen_in_proc.insert(pid);
        }
        self.live.push(pid);
        self.this_poll.insert(pid, answer.clone());
        answer
    }

    /// Forget pids NVML no longer lists, so a reused pid starts afresh and the maps stay
    /// small. Devices that could not be read this poll list nothing, so their pids are
    /// forgotten too; at worst an exited one then shows as another namespace's.
    pub fn end_poll(&mut self) {
        let live = &self.live;
        self.seen_in_proc.retain(|pid| live.contains(pid));
        self.sampler.retain(live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gp(pid: u32, used: Option<u64>) -> GpuProcess {
        GpuProcess {
            pid,
            used_bytes: used,
        }
    }

    #[test]
    fn compute_and_graphics_merge_by_pid_without_double_counting() {
        let compute = [gp(10, Some(100)), gp(11, Some(5)), gp(13, None)];
        let graphics = [gp(11, Some(7)), gp(12, None), gp(13, Some(9))];
        let mut merged = Vec::new();
        merge_process_lists(&compute, &graphics, &mut merged);
        let view: Vec<_> = merged
            .iter()
            .map(|m| (m.pid, m.kind, m.used_bytes))
            .collect();
        assert_eq!(
            view,
            vec![
                (10, ProcessKind::Compute, Some(100)),
                (11, ProcessKind::Both, Some(7)),
                (13, ProcessKind::Both, Some(9)),
                (12, ProcessKind::Graphics, None),
            ]
        );
    }

    #[test]
    fn newest_sample_per_pid_wins_and_not_found_is_no_data() {
        let t0 = Instant::now();
        let mut cache = ProcessUtilCache::new(Duration::from_secs(5));
        assert!(!cache.due(t0, false));
        assert!(cache.due(t0, true));
        let samples = vec![
            ProcessUtilSample {
                pid: 1,
                timestamp_us: 20,
                sm_util_pct: 80,
            },
            ProcessUtilSample {
                pid: 1,
                timestamp_us: 10,
                sm_util_pct: 30,
            },
            ProcessUtilSample {
                pid: 2,
                timestamp_us: 15,
                sm_util_pct: 5,
            },
        ];
        assert_eq!(cache.record(t0, Ok(samples)), Ok(()));
        assert_eq!(
            (cache.sm_util(1), cache.sm_util(2), cache.sm_util(3)),
            (Some(80), Some(5), None)
        );
        assert_eq!(cache.since_us(), 20);
        assert!(!cache.due(t0 + Duration::from_secs(4), true));
        assert!(cache.due(t0 + Duration::from_secs(5), true));
        assert_eq!(cache.record(t0, Err(ApiError::NotFound)), Ok(()));
        assert_eq!(cache.sm_util(1), None);
        assert_eq!(
            cache.record(t0, Err(ApiError::GpuLost)),
            Err(ApiError::GpuLost)
        );
    }
}
