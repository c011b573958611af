//! Per-process trends from the driver's figures: the high-water mark, the slope, and a
//! flag when a process's device memory only ever went up over the window; and a flag
//! when memory no listed process accounts for stays high. Pure, fed by snapshots; the
//! driver cannot say *where* in a process memory goes, only that it does.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::DeviceSnapshot;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrendConfig {
    /// Samples kept per process: the window.
    pub window: usize,
    /// K: samples needed before anything is flagged.
    pub min_samples: usize,
    /// Growth over the window below this is not flagged (allocator warm-up, a cache
    /// settling).
    pub min_growth_bytes: u64,
    /// Unattributed memory above this for the whole window is flagged.
    pub unattributed_bytes: u64,
}

impl Default for TrendConfig {
    fn default() -> Self {
        TrendConfig {
            window: 60,
            min_samples: 5,
            min_growth_bytes: 64 << 20,
            unattributed_bytes: 256 << 20,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessTrend {
    pub pid: u32,
    pub samples: usize,
    pub current_bytes: u64,
    pub high_water_bytes: u64,
    /// Least-squares slope over the window; None with fewer than two distinct times.
    pub slope_bytes_per_s: Option<f64>,
    /// At least K samples, never decreasing, and grown by at least the threshold.
    pub growing: bool,
}

impl ProcessTrend {
    /// `history` is (milliseconds, used bytes), oldest first; None when it is empty.
    pub fn compute(pid: u32, history: &[(u64, u64)], config: &TrendConfig) -> Option<Self> {
        let (&(_, first), &(_, current)) = (history.first()?, history.last()?);
        let monotone = history.windows(2).all(|w| w[1].1 >= w[0].1);
        Some(ProcessTrend {
            pid,
            samples: history.len(),
            current_bytes: current,
            high_water_bytes: history.iter().map(|s| s.1).max().unwrap_or(current),
            slope_bytes_per_s: slope(history),
            growing: history.len() >= config.min_samples.max(2)
                && monotone
                && current.saturating_sub(first) >= config.min_growth_bytes.max(1),
        })
    }
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
        self.per_pid
            .retain(|pid, _| device.processes.iter().any(|p| p.pid == *pid));
        for process in &device.processes {
            let Some(bytes) = process.used_memory_bytes else {
                continue;
            };
            let history = self.per_pid.entry(process.pid).or_default();
            history.push_back((time_ms, bytes));
            while history.len() > window {
                history.pop_front();
            }
        }
        self.unattributed
            .push_back((time_ms, device.unattributed_bytes()));
        while self.unattributed.len() > window {
            self.unattributed.pop_front();
        }
    }

    /// One trend per listed process with a known figure, by pid.
    pub fn trends(&self) -> Vec<ProcessTrend> {
        self.per_pid
            .iter()
            .filter_map(|(&pid, history)| {
                let history: Vec<(u64, u64)> = history.iter().copied().collect();
                ProcessTrend::compute(pid, &history, &self.config)
            })
            .collect()
    }

    pub fn unattributed(&self) -> UnattributedTrend {
        let history: Vec<(u64, Option<u64>)> = self.unattributed.iter().copied().collect();
        UnattributedTrend::compute(&history, &self.config)
    }
}
