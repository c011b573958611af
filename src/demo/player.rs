//! Playing a story: a state machine over its steps (each act's intro, then its phases),
//! driven by story time (`advance`) and the speaker (`next`, `previous`, pause, speed).
//! It runs the probes itself, one allocator call at a time, and hands out owned
//! `DemoView` snapshots to draw; no terminal and no wall clock here, so a run is the same
//! under the same seed, on a screen or in a test.

use crate::probe::scenario::Pacing;
use crate::probe::{setup, Probe};
use vramtop_alloc::backing::BackingChoice;
use vramtop_alloc::{FreeForRequests, Layout, OomReport, PolicyKind, Stats};

use super::story::{Story, StoryBacking};

pub const MIN_SPEED: f64 = 1.0 / 16.0;
pub const MAX_SPEED: f64 = 64.0;
/// Story time advanced at most per call: after a stall (a suspended laptop) the story
/// goes on where it was instead of racing through the steps it missed.
const MAX_ADVANCE_S: f64 = 1.0;

/// One step of a story: an act's intro (no allocator calls) or one of its phases.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub act: usize,
    /// Index of the phase in its act's scenario; `None` for the act's intro.
    pub phase: Option<usize>,
    pub caption: String,
    pub pacing: Pacing,
    /// Whether the phase is a plain request (`alloc`), whose outcome the screen shows.
    pub is_request: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PlayState {
    /// Working through the step's allocator calls.
    Running,
    /// The step is done; going on after this much more story time.
    Holding { left_s: f64 },
    /// The step is done; waiting for the speaker.
    Waiting,
    /// The last step is done.
    Finished,
}

/// What a request step came to.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestOutcome {
    Placed { bytes: u64 },
    OutOfMemory(OomReport),
}

/// How an act ended: `None` while it has not.
#[derive(Clone, Debug, PartialEq)]
pub struct ActSummary {
    pub title: String,
    pub policy: PolicyKind,
    pub outcome: Option<RequestOutcome>,
}

/// Everything the presenter screen draws, owned.
#[derive(Clone, Debug)]
pub struct DemoView {
    pub story_name: String,
    pub story_title: String,
    pub acts: Vec<ActSummary>,
    pub act: usize,
    /// 0-based step within the act, and the act's step count.
    pub step_in_act: usize,
    pub steps_in_act: usize,
    pub caption: String,
    pub state: PlayState,
    pub paused: bool,
    pub speed: f64,
    pub backing_label: String,
    pub capacity: u64,
    pub layout: Layout,
    pub stats: Stats,
    pub free_for_requests: FreeForRequests,
    /// The outcome of the step on screen, when it is a finished request.
    pub outcome: Option<RequestOutcome>,
}

impl DemoView {
    /// Memory not held by live blocks: what a request could hope to use.
    pub fn free_bytes(&self) -> u64 {
        self.capacity.saturating_sub(self.stats.allocated_bytes)
    }

    /// The largest request that could succeed now: the largest free run (for expandable,
    /// counting the pages that can still be mapped), or a new segment from what the
    /// driver has left, whichever is larger.
    pub fn largest_free_bytes(&self) -> u64 {
        let headroom = self.capacity.saturating_sub(self.stats.reserved_bytes);
        self.free_for_requests
            .largest_bytes
            .max(headroom)
            .min(self.free_bytes())
    }

    /// 1 - largest / free: 0 when all free memory is one run, near 1 when it is dust.
    pub fn fragmentation(&self) -> f64 {
        let free = self.free_bytes();
        if free == 0 {
            0.0
        } else {
            1.0 - self.largest_free_bytes() as f64 / free as f64
        }
    }
}

pub struct StoryPlayer {
    story: Story,
    seed: u64,
    backing: StoryBacking,
    steps: Vec<Step>,
    current: usize,
    state: PlayState,
    paused: bool,
    speed: f64,
    /// Allocator calls owed to the clock, below one.
    credit: f64,
    /// One probe per act, built fresh on every (re)start.
    probes: Vec<Probe>,
    backing_label: String,
    /// Counters when the current step began, to tell what the step did.
    ooms_at_start: u64,
    requested_at_start: u64,
    outcome: Option<RequestOutcome>,
    act_outcomes: Vec<Option<RequestOutcome>>,
}

fn steps_of(story: &Story) -> Vec<Step> {
    let mut steps = Vec::new();
    for (act_index, act) in story.acts.iter().enumerate() {
        if let Some(intro) = &act.intro {
            steps.push(Step {
                act: act_index,
                phase: None,
                caption: intro.clone(),
                pacing: Pacing::Pause,
                is_request: false,
            });
        }
        for (i, phase) in act.scenario.phases.iter().enumerate() {
            steps.push(Step {
                act: act_index,
                phase: Some(i),
                caption: phase.caption().to_string(),
                pacing: phase.pacing(),
                is_request: matches!(phase, crate::probe::scenario::Phase::Alloc { .. }),
            });
        }
    }
    steps
}

impl StoryPlayer {
    /// A player at the start of the first step. Fails when the backing cannot be had
    /// (host memory short of the story's capacity).
    pub fn new(story: Story, seed: u64, backing: Option<StoryBacking>) -> Result<Self, String> {
        let backing = backing.unwrap_or(story.backing);
        let steps = steps_of(&story);
        let mut player = StoryPlayer {
            act_outcomes: vec![None; story.acts.len()],
            story,
            seed,
            backing,
            steps,
            current: 0,
            state: PlayState::Running,
            paused: false,
            speed: 1.0,
            credit: 0.0,
            probes: Vec::new(),
            backing_label: String::new(),
            ooms_at_start: 0,
            requested_at_start: 0,
            outcome: None,
        };
        player.restart()?;
        Ok(player)
    }

    pub fn story(&self) -> &Story {
        &self.story
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Index of the step on screen.
    pub fn current(&self) -> usize {
        self.current
    }

    pub fn state(&self) -> PlayState {
        self.state
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    pub fn is_finished(&self) -> bool {
        self.state == PlayState::Finished
    }

    pub fn act_outcomes(&self) -> &[Option<RequestOutcome>] {
        &self.act_outcomes
    }

    /// Back to the first step with fresh allocators; the speed is kept.
    pub fn restart(&mut self) -> Result<(), String> {
        let choice = match self.backing {
            StoryBacking::Bookkeeping => BackingChoice::Bookkeeping,
            StoryBacking::Host => BackingChoice::Host,
        };
        let mut probes = Vec::with_capacity(self.story.acts.len());
        for act in &self.story.acts {
            let set = setup::build(
                &act.scenario,
                &[act.policy],
                choice,
                Some(self.story.capacity),
                self.seed,
            )
            .map_err(|e| e.to_string())?;
            self.backing_label = set.backing_label;
            probes.extend(set.probes);
        }
        self.probes = probes;
        self.act_outcomes = vec![None; self.story.acts.len()];
        self.paused = false;
        self.credit = 0.0;
        self.enter(0);
        Ok(())
    }

    /// Story time passes: runs allocator calls at the current speed, counts holds down.
    /// Returns whether anything on screen changed.
    pub fn advance(&mut self, dt_s: f64) -> bool {
        if self.paused || dt_s.is_nan() || dt_s <= 0.0 {
            return false;
        }
        let dt = dt_s.min(MAX_ADVANCE_S) * self.speed;
        match self.state {
            PlayState::Running => {
                self.credit += dt * self.story.ops_per_s;
                let mut changed = false;
                while self.credit >= 1.0 && self.state == PlayState::Running {
                    self.credit -= 1.0;
                    self.call();
                    changed = true;
                }
                if self.state != PlayState::Running {
                    self.credit = 0.0;
                }
                changed
            }
            PlayState::Holding { left_s } => {
                let left_s = left_s - dt;
                if left_s <= 0.0 {
                    self.go_on();
                } else {
                    self.state = PlayState::Holding { left_s };
                }
                true
            }
            PlayState::Waiting | PlayState::Finished => false,
        }
    }

    /// The speaker's "next": a running step jumps to its end; a finished one gives way to
    /// the next step.
    pub fn next(&mut self) {
        self.paused = false;
        match self.state {
            PlayState::Running => {
                self.finish_step();
                self.after_step();
            }
            PlayState::Holding { .. } | PlayState::Waiting => self.go_on(),
            PlayState::Finished => {}
        }
    }

    /// The speaker's "back": the end of the step before this one, replayed from the
    /// start so the allocator is exactly as it was then.
    pub fn previous(&mut self) -> Result<(), String> {
        let target = self.current.checked_sub(1);
        self.restart()?;
        let Some(target) = target else {
            return Ok(());
        };
        // A step that goes on at once may carry the replay past the target: harmless.
        while self.current < target || (self.current == target && self.state == PlayState::Running)
        {
            if self.is_finished() {
                break;
            }
            self.next();
        }
        if matches!(self.state, PlayState::Holding { .. }) {
            self.state = PlayState::Waiting;
        }
        Ok(())
    }

    /// Space: pause or resume; at a step waiting for the speaker, go on.
    pub fn toggle_pause(&mut self) {
        match self.state {
            PlayState::Waiting => self.next(),
            PlayState::Finished => {}
            _ => self.paused = !self.paused,
        }
    }

    pub fn faster(&mut self) {
        self.speed = (self.speed * 2.0).min(MAX_SPEED);
    }

    pub fn slower(&mut self) {
        self.speed = (self.speed / 2.0).max(MIN_SPEED);
    }

    /// Runs to the end of the story, ignoring pauses and holds (headless use).
    pub fn run_to_end(&mut self) {
        while !self.is_finished() {
            self.next();
        }
    }

    pub fn view(&self) -> DemoView {
        let step = &self.steps[self.current];
        let act = step.act;
        let probe = &self.probes[act];
        let allocator = probe.allocator();
        let first_of_act = self.steps.iter().position(|s| s.act == act).unwrap_or(0);
        let acts = self
            .story
            .acts
            .iter()
            .zip(&self.act_outcomes)
            .map(|(a, outcome)| ActSummary {
                title: a.title.clone(),
                policy: a.policy,
                outcome: outcome.clone(),
            })
            .collect();
        DemoView {
            story_name: self.story.name.clone(),
            story_title: self.story.title.clone(),
            acts,
            act,
            step_in_act: self.current - first_of_act,
            steps_in_act: self.steps.iter().filter(|s| s.act == act).count(),
            caption: step.caption.clone(),
            state: self.state,
            paused: self.paused,
            speed: self.speed,
            backing_label: self.backing_label.clone(),
            capacity: self.story.capacity,
            layout: allocator.layout(),
            stats: allocator.stats(),
            free_for_requests: allocator.free_for_requests(),
            outcome: self.outcome.clone(),
        }
    }

    /// Starts step `index`: its phase marker is executed, so the report names it.
    fn enter(&mut self, index: usize) {
        self.current = index;
        self.outcome = None;
        let step = &self.steps[index];
        let probe = &mut self.probes[step.act];
        let report = probe.report();
        self.ooms_at_start = report.ooms;
        self.requested_at_start = report.stats.requested_bytes;
        if step.phase.is_some() {
            probe.step();
        }
        if step.phase.is_none() || probe.at_phase_end() {
            self.finish_step();
            self.after_step();
        } else {
            self.state = PlayState::Running;
        }
    }

    /// One allocator call of the running step.
    fn call(&mut self) {
        let probe = &mut self.probes[self.steps[self.current].act];
        probe.step();
        if probe.at_phase_end() {
            self.finish_step();
            self.after_step();
        }
    }

    /// Runs what is left of the step and records what it came to; pacing aside.
    fn finish_step(&mut self) {
        let step = &self.steps[self.current];
        let probe = &mut self.probes[step.act];
        if step.phase.is_some() {
            while !probe.at_phase_end() {
                probe.step();
            }
        }
        let report = probe.report();
        if step.is_request {
            let outcome = if report.ooms > self.ooms_at_start {
                report.last_oom.clone().map(RequestOutcome::OutOfMemory)
            } else {
                Some(RequestOutcome::Placed {
                    bytes: report
                        .stats
                        .requested_bytes
                        .saturating_sub(self.requested_at_start),
                })
            };
            self.outcome = outcome.clone();
            self.act_outcomes[step.act] = outcome;
        }
        let last_of_act = self
            .steps
            .get(self.current + 1)
            .is_none_or(|next| next.act != step.act);
        // An act without a plain request is judged by whether anything failed in it.
        if last_of_act && self.act_outcomes[step.act].is_none() {
            self.act_outcomes[step.act] = Some(match report.last_oom {
                Some(oom) if report.ooms > 0 => RequestOutcome::OutOfMemory(oom),
                _ => RequestOutcome::Placed {
                    bytes: report.stats.requested_bytes,
                },
            });
        }
        self.state = PlayState::Waiting;
    }

    /// After a finished step: wait, hold or go on, as the phase asks.
    fn after_step(&mut self) {
        if self.current + 1 >= self.steps.len() {
            self.state = PlayState::Finished;
            return;
        }
        self.state = match self.steps[self.current].pacing {
            Pacing::Pause => PlayState::Waiting,
            Pacing::Hold(s) => PlayState::Holding { left_s: s },
            Pacing::Continue => {
                self.go_on();
                return;
            }
        };
    }

    fn go_on(&mut self) {
        if self.current + 1 < self.steps.len() {
            self.enter(self.current + 1);
        } else {
            self.state = PlayState::Finished;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn player() -> StoryPlayer {
        let story = Story::load("oom-with-free-memory").unwrap_or_else(|e| panic!("{e}"));
        StoryPlayer::new(story, 0, None).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn starts_waiting_on_the_intro() {
        let p = player();
        assert_eq!(p.state(), PlayState::Waiting);
        assert_eq!(p.current(), 0);
        assert_eq!(p.steps()[0].phase, None);
    }

    #[test]
    fn time_runs_a_step_then_waits_for_the_speaker() {
        let mut p = player();
        p.next();
        assert_eq!(p.state(), PlayState::Running);
        let mut seconds = 0;
        while p.state() == PlayState::Running && seconds < 600 {
            p.advance(1.0);
            seconds += 1;
        }
        // 30 fills at 10 calls per second, and the call that finds the device full.
        assert!((3..=5).contains(&seconds), "{seconds}");
        assert_eq!(p.state(), PlayState::Waiting);
        let v = p.view();
        assert_eq!(v.stats.allocated_bytes, 120 << 20);
    }

    #[test]
    fn pause_stops_time_and_speed_doubles_it() {
        let mut p = player();
        p.next();
        p.toggle_pause();
        assert!(!p.advance(1.0));
        p.toggle_pause();
        p.faster();
        p.advance(0.5);
        // Ten calls: the first starts the fill, nine allocate.
        assert_eq!(p.view().stats.live_blocks, 9);
    }

    #[test]
    fn previous_replays_to_the_end_of_the_step_before() {
        let mut p = player();
        for _ in 0..3 {
            p.next();
            p.next();
        }
        let at = p.current();
        let want = p.view().stats;
        assert_eq!(want.allocated_bytes, 60 << 20);
        p.next();
        assert_eq!(p.current(), at + 1);
        p.previous().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.current(), at);
        assert_eq!(p.view().stats.allocated_bytes, want.allocated_bytes);
        assert_eq!(p.state(), PlayState::Waiting);
    }
}
