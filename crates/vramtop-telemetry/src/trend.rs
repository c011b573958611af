//! Per-process trends from the driver's figures: the high-water mark, the slope, and a
//! flag when a process's device memory looks like a leak; and a flag when memory no
//! listed process accounts for stays high. Pure, fed by snapshots; the driver cannot say
//! *where* in a process memory goes, only that it does.
//!
//! A leak, not a warm-up: every training job grows at its start, while its caching
//! allocator reserves what its steps need, and then levels off at that high-water mark
//! (on an H100: a GPT-2 loop 1.2 -> 7.0 GiB in 10 s, DDP ranks 0.5 -> 3.8 / 4.8 GiB in
//! 10 s, ResNet-50 0.9 -> 4.3 GiB in 2 s, then flat for minutes). A leak is a floor that
//! keeps rising. So the history (the last `span_ms`) is cut into `windows` equal parts
//! and a process is flagged only when each part's floor (its least figure) is above the
//! one before by a share of `min_growth_bytes`, and the last part is still rising: growth
//! that levelled off fails the last two tests, one step up (a larger batch seen once)
//! fails the first.
//!
//! A job vramtop is attached to says more than the driver: PyTorch's allocated bytes. Its
//! driver figure is what the caching allocator reserved, which fragmentation and a cache
//! still settling can raise with no leak at all. So for such a process the same test also
//! runs on its allocated bytes (the live tensors' floor per window, as the per-site leak
//! detector does), and it is flagged only when both floors rise. Not the allocated floor
//! alone: read once a second it lands at a random point of the job's step, and on the H100
//! a ResNet-50 loop's allocated floors per 20 s went 262, 369, 201, 262, 315, 283, 440 MiB
//! with no leak (tests/fixtures/allocated_series.json), which that test alone flagged.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::DeviceSnapshot;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrendConfig {
    /// Samples of unattributed memory kept: its window.
    pub window: usize,
    /// K: samples needed before anything is flagged.
    pub min_samples: usize,
    /// A process's history kept, in milliseconds: the slope and the leak flag's span.
    pub span_ms: u64,
    /// No leak flag before the history covers this long.
    pub min_span_ms: u64,
    /// Parts the history is cut into for the leak flag (see the module docs).
    pub windows: usize,
    /// The floor must rise by this over the history, and by its share in each part.
    pub min_growth_bytes: u64,
    /// Unattributed memory above this for the whole window is flagged.
    pub unattributed_bytes: u64,
}

impl Default for TrendConfig {
    fn default() -> Self {
        TrendConfig {
            window: 60,
            min_samples: 5,
            // A minute in three parts of 20 s: a job leaking 8 MiB/s is flagged about
            // 45 s after it starts to leak (its second part's floor must have risen).
            span_ms: 60_000,
            min_span_ms: 30_000,
            windows: 3,
            min_growth_bytes: 64 << 20,
            unattributed_bytes: 256 << 20,
        }
    }
}

/// Most samples kept per process, whatever the interval (0.05 s over a minute is 1,200).
const MAX_SAMPLES: usize = 2_048;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessTrend {
    pub pid: u32,
    pub samples: usize,
    pub current_bytes: u64,
    pub high_water_bytes: u64,
    /// Least-squares slope over the history; None with fewer than two distinct times.
    pub slope_bytes_per_s: Option<f64>,
    /// Looks like a leak: a floor rising through every part of the history, still
    /// rising at its end (see the module docs); never for growth that levelled off.
    pub growing: bool,
    /// `growing` was tested on PyTorch's allocated bytes (an attached job) as well as on
    /// the driver's figure.
    #[serde(default)]
    pub of_allocated: bool,
}

impl ProcessTrend {
    /// `history` is (milliseconds, used bytes), oldest first; None when it is empty.
    pub fn compute(pid: u32, history: &[(u64, u64)], config: &TrendConfig) -> Option<Self> {
        let &(_, current) = history.last()?;
        Some(ProcessTrend {
            pid,
            samples: history.len(),
            current_bytes: current,
            high_water_bytes: history.iter().map(|s| s.1).max().unwrap_or(current),
            slope_bytes_per_s: slope(history),
            growing: history.len() >= config.min_samples.max(2) && rising_floor(history, config),
            of_allocated: false,
        })
    }
}

/// The leak test of the module docs over `history` (milliseconds, bytes), oldest first.
fn rising_floor(history: &[(u64, u64)], config: &TrendConfig) -> bool {
    let (Some(&(start, _)), Some(&(end, last))) = (history.first(), history.last()) else {
        return false;
    };
    let span = end.saturating_sub(start);
    if span < config.min_span_ms.max(1) {
        return false;
    }
    let parts = config.windows.max(2) as u64;
    let mut floors = vec![u64::MAX; parts as usize];
    for &(t, bytes) in history {
        // The last sample belongs to the last part.
        let part = ((t - start) * parts / span).min(parts - 1) as usize;
        floors[part] = floors[part].min(bytes);
    }
    if floors.contains(&u64::MAX) {
        return false; // a part with no sample (the driver did not answer): no verdict
    }
    let step = (config.min_growth_bytes / parts).max(1);
    let each_part_rose = floors.windows(2).all(|w| w[1] >= w[0].saturating_add(step));
    let last_floor = floors[floors.len() - 1];
    let still_rising = last >= last_floor.saturating_add(step / 2);
    let total = last_floor.saturating_sub(floors[0]);
    each_part_rose && still_rising && total >= config.min_growth_bytes.max(1)
}

/// Bytes per second by least squares: one noisy sample moves it less than first-to-last.
fn slope(history: &[(u64, u64)]) -> Option<f64> {
    let t0 = history.first()?.0;
    let n = history.len() as f64;
    let points = || {
        history
            .iter()
            .map(|&(t, b)| (t.saturating_sub(t0) as f64 / 1e3, b as f64))
    };
    let mean_t = points().map(|p| p.0).sum::<f64>() / n;
    let mean_b = points().map(|p| p.1).sum::<f64>() / n;
    let var_t: f64 = points().map(|p| (p.0 - mean_t).powi(2)).sum();
    if var_t <= 0.0 {
        return None;
    }
    let cov: f64 = points().map(|p| (p.0 - mean_t) * (p.1 - mean_b)).sum();
    Some(cov / var_t)
}

/// Device memory that no listed process accounts for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnattributedTrend {
    pub samples: usize,
    pub current_bytes: Option<u64>,
    /// The least over the window; None when any sample was unknown.
    pub min_bytes: Option<u64>,
    /// Above the threshold at every one of at least K samples.
    pub flagged: bool,
}

impl UnattributedTrend {
    pub fn compute(history: &[(u64, Option<u64>)], config: &TrendConfig) -> Self {
        let min_bytes = history
            .iter()
            .map(|s| s.1)
            .try_fold(u64::MAX, |m, b| b.map(|b| m.min(b)))
            .filter(|_| !history.is_empty());
        UnattributedTrend {
            samples: history.len(),
            current_bytes: history.last().and_then(|s| s.1),
            min_bytes,
            flagged: history.len() >= config.min_samples.max(1)
                && min_bytes.is_some_and(|m| m > config.unattributed_bytes),
        }
    }
}

/// Histories of one device, fed one snapshot at a time.
#[derive(Clone, Debug, Default)]
pub struct ProcessWatch {
    config: TrendConfig,
    per_pid: BTreeMap<u32, VecDeque<(u64, u64)>>,
    /// PyTorch's allocated bytes of the listed processes vramtop is attached to, and the
    /// sequence number of the hook's state each came from.
    allocated: BTreeMap<u32, VecDeque<(u64, u64)>>,
    allocated_seq: BTreeMap<u32, u64>,
    unattributed: VecDeque<(u64, Option<u64>)>,
}

impl ProcessWatch {
    pub fn new(config: TrendConfig) -> Self {
        ProcessWatch {
            config,
            ..ProcessWatch::default()
        }
    }

    /// A process that is no longer listed is forgotten; one whose memory the driver
    /// will not tell keeps its history without a new sample.
    pub fn observe(&mut self, time_ms: u64, device: &DeviceSnapshot) {
        let window = self.config.window.max(1);
        let oldest = time_ms.saturating_sub(self.config.span_ms);
        self.per_pid
            .retain(|pid, _| device.processes.iter().any(|p| p.pid == *pid));
        for process in &device.processes {
            let Some(bytes) = process.used_memory_bytes else {
                continue;
            };
            let history = self.per_pid.entry(process.pid).or_default();
            history.push_back((time_ms, bytes));
            while history.len() > MAX_SAMPLES || history.front().is_some_and(|s| s.0 < oldest) {
                history.pop_front();
            }
        }
        self.allocated
            .retain(|pid, _| self.per_pid.contains_key(pid));
        self.allocated_seq
            .retain(|pid, _| self.per_pid.contains_key(pid));
        self.unattributed
            .push_back((time_ms, device.unattributed_bytes()));
        while self.unattributed.len() > window {
            self.unattributed.pop_front();
        }
    }

    /// PyTorch's allocated bytes of attached processes, (pid, state seq, bytes), at
    /// `time_ms`: after `observe` of the same poll. Processes this device does not list
    /// are left out, and so is a state already taken (a hook that went quiet would make a
    /// flat series that hides a leak the driver sees).
    pub fn observe_allocated(&mut self, time_ms: u64, figures: &[(u32, u64, u64)]) {
        let oldest = time_ms.saturating_sub(self.config.span_ms);
        for &(pid, seq, bytes) in figures {
            if !self.per_pid.contains_key(&pid) || self.allocated_seq.get(&pid) == Some(&seq) {
                continue;
            }
            self.allocated_seq.insert(pid, seq);
            let history = self.allocated.entry(pid).or_default();
            history.push_back((time_ms, bytes));
            while history.len() > MAX_SAMPLES || history.front().is_some_and(|s| s.0 < oldest) {
                history.pop_front();
            }
        }
    }

    /// One trend per listed process with a known figure, by pid; an attached process is
    /// flagged only when its allocated floor rises too (see the module docs).
    pub fn trends(&self) -> Vec<ProcessTrend> {
        self.per_pid
            .iter()
            .filter_map(|(&pid, history)| {
                let history: Vec<(u64, u64)> = history.iter().copied().collect();
                let mut trend = ProcessTrend::compute(pid, &history, &self.config)?;
                // Only a series that is still fed: its last figure within the last part.
                let part_ms = self.config.span_ms / self.config.windows.max(1) as u64;
                let fresh = |s: &&VecDeque<(u64, u64)>| {
                    let (Some(&(own, _)), Some(&(now, _))) = (s.back(), history.last()) else {
                        return false;
                    };
                    now.saturating_sub(own) <= part_ms
                };
                if let Some(allocated) = self.allocated.get(&pid).filter(fresh) {
                    let allocated: Vec<(u64, u64)> = allocated.iter().copied().collect();
                    if let Some(of_allocated) = ProcessTrend::compute(pid, &allocated, &self.config)
                    {
                        trend.growing &= of_allocated.growing;
                        trend.of_allocated = true;
                    }
                }
                Some(trend)
            })
            .collect()
    }

    pub fn unattributed(&self) -> UnattributedTrend {
        let history: Vec<(u64, Option<u64>)> = self.unattributed.iter().copied().collect();
        UnattributedTrend::compute(&history, &self.config)
    }
}
