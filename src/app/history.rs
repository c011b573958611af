//! A fixed-size ring of samples for sparklines and charts: memory over the last minutes.

use std::collections::VecDeque;

#[derive(Clone, Debug)]
pub struct History<T = u64> {
    samples: VecDeque<T>,
    capacity: usize,
}

impl<T: Copy> History<T> {
    pub fn new(capacity: usize) -> Self {
        History {
            samples: VecDeque::with_capacity(capacity),
            capacity: capacity.max(1),
        }
    }

    pub fn push(&mut self, value: T) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
    }

    /// The newest `n` samples, oldest first.
    pub fn last(&self, n: usize) -> Vec<T> {
        let skip = self.samples.len().saturating_sub(n);
        self.samples.iter().skip(skip).copied().collect()
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn latest(&self) -> Option<T> {
        self.samples.back().copied()
    }
}

/// What a device's history charts draw: memory (used, driver-reserved) and GPU
/// utilisation per poll, None where the device could not say.
#[derive(Clone, Debug)]
pub struct ChartHistory {
    pub memory: History<(Option<u64>, Option<u64>)>,
    pub util: History<(Option<u64>, Option<u64>)>,
}

impl Default for ChartHistory {
    fn default() -> Self {
        ChartHistory {
            memory: History::new(super::HISTORY_SAMPLES),
            util: History::new(super::HISTORY_SAMPLES),
        }
    }
}

impl ChartHistory {
    pub fn push(&mut self, device: &vramtop_telemetry::DeviceSnapshot) {
        self.memory
            .push((device.memory_used_bytes, device.memory_reserved_bytes));
        self.util.push((device.gpu_util_pct.map(u64::from), None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_newest() {
        let mut h = History::new(3);
        for v in 1..=5 {
            h.push(v);
        }
        assert_eq!(h.last(10), vec![3, 4, 5]);
        assert_eq!(h.last(2), vec![4, 5]);
        assert_eq!(h.latest(), Some(5));
    }
}
