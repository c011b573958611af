//! The tour: what the live view plays on the simulated device when no probe was asked for.
//! The built-in scenarios, one after another (checkerboard first, since "out of memory
//! with memory free" is what vramtop is for), each on bookkeeping memory so the tour
//! allocates nothing real and costs next to nothing. It never runs on a real GPU:
//! there vramtop allocates only when asked (`--probe`).

use std::sync::Arc;
use std::time::Duration;

use super::runner::Probe;
use super::scenario::Scenario;
use vramtop_alloc::backing::BookkeepingBacking;
use vramtop_alloc::{human_bytes, AllocConfig, Allocator, PolicyKind};

/// The order the stories play in: the OOM with memory free first, then what else a
/// caching allocator does (churn, a training loop, a leak, streams, a steady baseline).
pub const ORDER: &[&str] = &[
    "checkerboard",
    "churn",
    "training",
    "leak",
    "streams",
    "steady",
];

/// How long a finished story stays on screen before the next one starts.
pub const HOLD: Duration = Duration::from_secs(8);

/// Capacity of each story's allocator: the size the scenarios are drawn for.
const CAPACITY: u64 = super::setup::HOST_DEFAULT_LIMIT;

/// Where the tour is, for the screen: "tour 1/6".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TourStep {
    /// 1-based number of the story playing.
    pub number: usize,
    pub count: usize,
    /// Whole seconds until the next story, once this one is done.
    pub next_in_s: Option<u64>,
}

/// The built-in scenarios in `ORDER`, cycled for as long as the view stays open.
pub struct Tour {
    scenarios: Vec<Scenario>,
    policy: PolicyKind,
    seed: u64,
    /// Index in `scenarios` of the story built last.
    current: usize,
    /// How long a finished story stays on screen (`HOLD`).
    hold: Duration,
}

impl Tour {
    /// The tour under `policy` (the live view's `--policy`), with the live view's seed.
    pub fn new(policy: PolicyKind, seed: u64) -> Result<Tour, String> {
        let scenarios = ORDER
            .iter()
            .map(|name| Scenario::load(name))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Tour {
            scenarios,
            policy,
            seed,
            current: 0,
            hold: HOLD,
        })
    }

    /// The same tour with another hold between stories.
    pub fn with_hold(self, hold: Duration) -> Tour {
        Tour { hold, ..self }
    }

    pub fn hold(&self) -> Duration {
        self.hold
    }

    pub fn step(&self, next_in: Option<Duration>) -> TourStep {
        TourStep {
            number: self.current + 1,
            count: self.scenarios.len(),
            next_in_s: next_in.map(|d| d.as_secs_f64().ceil() as u64),
        }
    }

    /// The probe of the story playing now, on fresh bookkeeping memory.
    pub fn probe(&self) -> Probe {
        let backing = BookkeepingBacking::new(CAPACITY);
        let label = format!("simulated {}", human_bytes(CAPACITY));
        let allocator = Arc::new(Allocator::new(
            self.policy,
            Box::new(backing),
            AllocConfig::default(),
        ));
        Probe::new(&self.scenarios[self.current], allocator, &label, self.seed)
    }

    /// Move to the next story (back to the first after the last) and build its probe.
    pub fn advance(&mut self) -> Probe {
        self.current = (self.current + 1) % self.scenarios.len();
        self.probe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_story_of_the_tour_is_built_in_and_checkerboard_comes_first() {
        let mut tour = Tour::new(PolicyKind::Caching, 0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tour.probe().report().scenario, "checkerboard");
        let mut seen = vec![tour.probe().report().scenario];
        for _ in 1..ORDER.len() {
            seen.push(tour.advance().report().scenario);
        }
        assert_eq!(seen, ORDER);
        assert_eq!(tour.advance().report().scenario, "checkerboard");
        assert_eq!(tour.step(None).number, 1);
        assert_eq!(tour.step(None).count, ORDER.len());
    }

    #[test]
    fn every_story_finishes_so_the_tour_moves_on() {
        let mut tour = Tour::new(PolicyKind::Caching, 7).unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..ORDER.len() {
            let mut probe = tour.probe();
            probe.run(None);
            let report = probe.report();
            assert!(probe.is_done(), "{} never ends", report.scenario);
            assert_eq!(report.verify_mismatches, 0);
            tour.advance();
        }
    }
}
