//! A fixed-size ring of samples for sparklines: memory over the last minutes.

use std::collections::VecDeque;

#[derive(Clone, Debug)]
pub struct History {
    samples: VecDeque<u64>,
    capacity: usize,
}

impl History {
    pub fn new(capacity: usize) -> Self {
        History {
            samples: VecDeque::with_capacity(capacity),
            capacity: capacity.max(1),
        }
    }

    pub fn push(&mut self, value: u64) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
    }

    /// The newest `n` samples, oldest first.
    pub fn last(&self, n: usize) -> Vec<u64> {
        let skip = self.samples.len().saturating_sub(n);
        self.samples.iter().skip(skip).copied().collect()
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub fn latest(&self) -> Option<u64> {
        self.samples.back().copied()
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
