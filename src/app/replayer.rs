//! `vramtop replay FILE`: the report (`--report`, or when stdout is not a terminal) and
//! the player, which replays the trace through one policy with play / pause / step /
//! speed / seek over the viewer's block map. Seeking backwards replays from the start:
//! a whole trace replays in well under a second. State only: no drawing here
//! (`ui::replayer`), and the command itself is `modes::replay`.

use std::time::Duration;

use super::viewer::{MapNav, MapView, ViewerAction};
use super::Exit;
use vramtop_alloc::PolicyKind;
use vramtop_trace::replay::{self, Replay, ReplayCounts, ReplayOptions};
use vramtop_trace::{Trace, TraceEvent};

/// Fragmentation samples over a whole trace (the panel's history).
pub const HISTORY_SAMPLES: usize = 600;
/// A trace plays in about this long at the starting speed...
const DEFAULT_PLAY_S: f64 = 60.0;
/// ...within these speeds, in events per second (`[` and `]` halve and double).
pub const MIN_SPEED: f64 = 1.0;
pub const MAX_SPEED: f64 = (1u64 << 20) as f64;
/// Left/Right seek by this fraction of the events.
const SEEK_FRACTION: usize = 100;

/// The player's state: one policy's replay and what the screen shows of it.
pub struct ReplayerState<'t> {
    pub name: String,
    pub notices: Vec<String>,
    pub capacity: Option<u64>,
    pub capacity_source: replay::CapacitySource,
    /// The trace's own OOMs with the traced allocator's state at each.
    pub trace_ooms: Vec<vramtop_trace::ooms::TraceOom>,
    replay: Replay<'t>,
    opts: ReplayOptions,
    pub view: MapView,
    pub nav: MapNav,
    pub playing: bool,
    /// Events per second while playing.
    pub speed: f64,
    /// Fractional events owed by past ticks.
    owed: f64,
    sample_every: usize,
    /// Why the replay stopped, if the allocator refused something.
    pub error: Option<String>,
    pub exit: Option<Exit>,
}

impl<'t> ReplayerState<'t> {
    pub fn new(
        name: &str,
        trace: &'t Trace,
        policy: PolicyKind,
        capacity: Option<u64>,
    ) -> std::result::Result<Self, replay::ReplayError> {
        let trace_ooms = vramtop_trace::ooms::trace_ooms(trace);
        let opts = replay::plan_capacity(trace, capacity, &trace_ooms);
        let mut notices = trace.notices();
        if let Some(line) = capacity_line(opts, trace_ooms.len()) {
            notices.insert(0, line);
        }
        let events = trace.events.len();
        let mut state = ReplayerState {
            name: name.to_string(),
            notices,
            capacity: (opts.source != replay::CapacitySource::Unlimited).then_some(opts.capacity),
            capacity_source: opts.source,
            trace_ooms,
            replay: Replay::new(trace, policy, opts)?,
            opts,
            view: MapView::default(),
            nav: MapNav::default(),
            playing: false,
            speed: (events as f64 / DEFAULT_PLAY_S)
                .round()
                .clamp(MIN_SPEED, MAX_SPEED),
            owed: 0.0,
            sample_every: (events / HISTORY_SAMPLES).max(1),
            error: None,
            exit: None,
        };
        state.refresh();
        Ok(state)
    }

    pub fn policy(&self) -> PolicyKind {
        self.replay.policy()
    }

    /// Events applied so far.
    pub fn position(&self) -> usize {
        self.replay.position()
    }

    pub fn len(&self) -> usize {
        self.replay.len()
    }

    pub fn is_empty(&self) -> bool {
        self.replay.is_empty()
    }

    pub fn current_event(&self) -> Option<&'t TraceEvent> {
        self.replay.last_event()
    }

    pub fn counts(&self) -> &ReplayCounts {
        self.replay.counts()
    }

    pub fn is_done(&self) -> bool {
        self.replay.is_done()
    }

    /// Applies up to `n` events, sampling fragmentation on the way, then refreshes
    /// the view. Stops playing at the end or on an error.
    pub fn advance(&mut self, n: usize) {
        for _ in 0..n {
            match self.replay.step() {
                Ok(Some(_)) => {
                    if self.replay.position() % self.sample_every == 0 {
                        let frag = self.replay.allocator().stats().external_fragmentation;
                        self.view
                            .frag_history
                            .push((frag.clamp(0.0, 1.0) * 1000.0).round() as u64);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.error = Some(e.to_string());
                    self.playing = false;
                    break;
                }
            }
        }
        if self.replay.is_done() {
            self.playing = false;
        }
        self.refresh();
    }

    /// Moves to `position` events applied: forward by stepping, backward by replaying
    /// from the start (history included, so it reads the same either way).
    pub fn seek(&mut self, position: usize) {
        let target = position.min(self.len());
        if target < self.position() {
            match Replay::new(self.replay.trace(), self.policy(), self.opts) {
                Ok(fresh) => {
                    self.replay = fresh;
                    self.view.frag_history.clear();
                    self.error = None;
                }
                Err(e) => {
                    self.error = Some(e.to_string());
                    return;
                }
            }
        }
        self.owed = 0.0;
        self.advance(target - self.position());
    }

    /// The trace OOM at the current event, with this policy's answer to it.
    pub fn oom_here(&self) -> Option<(&vramtop_trace::ooms::TraceOom, Option<&replay::OomCheck>)> {
        let at = self.position().checked_sub(1)?;
        let oom = self.trace_ooms.iter().find(|o| o.event == at)?;
        let check = self.replay.oom_checks().iter().find(|c| c.event == at);
        Some((oom, check))
    }

    /// Reads the allocator into the view. Births are on the replay's wall clock, which
    /// means nothing for a trace: they are dropped, so the block list shows no ages.
    /// Without `--capacity` the backing's capacity is a placeholder (1 TiB) that would
    /// flatten the panel's usage bars: they are scaled to the peak reserved so far.
    fn refresh(&mut self) {
        let allocator = self.replay.allocator();
        let mut layout = allocator.layout();
        for run in layout.segments.iter_mut().flat_map(|s| s.runs.iter_mut()) {
            run.born_ns = None;
        }
        let mut stats = allocator.stats();
        if self.capacity.is_none() {
            stats.capacity_bytes = stats.peak_reserved_bytes;
            layout.capacity = stats.peak_reserved_bytes;
        }
        self.view.layout = layout;
        self.view.stats = stats;
        self.nav.clamp(&self.view.layout);
    }

    fn seek_step(&self) -> usize {
        (self.len() / SEEK_FRACTION).max(1)
    }

    pub fn handle(&mut self, action: ViewerAction) {
        match action {
            ViewerAction::Quit => self.exit = Some(Exit::Quit),
            ViewerAction::Interrupt => self.exit = Some(Exit::Interrupted),
            ViewerAction::Back if self.nav.show_segment_list => self.nav.show_segment_list = false,
            ViewerAction::Back => self.exit = Some(Exit::Quit),
            ViewerAction::PlayPause => {
                if self.is_done() {
                    self.seek(0);
                }
                self.playing = !self.playing && self.error.is_none();
                self.owed = 0.0;
            }
            ViewerAction::Step => {
                self.playing = false;
                self.advance(1);
            }
            ViewerAction::Slower => self.speed = (self.speed / 2.0).max(MIN_SPEED),
            ViewerAction::Faster => self.speed = (self.speed * 2.0).min(MAX_SPEED),
            ViewerAction::SeekBack => {
                self.seek(self.position().saturating_sub(self.seek_step()));
            }
            ViewerAction::SeekForward => self.seek(self.position() + self.seek_step()),
            ViewerAction::Home => self.seek(0),
            ViewerAction::End => self.seek(self.len()),
            other => {
                self.nav.handle(other, &self.view.layout);
            }
        }
    }

    /// Plays `elapsed` worth of events at the current speed.
    pub fn tick(&mut self, elapsed: Duration) -> bool {
        if !self.playing {
            return false;
        }
        self.owed += self.speed * elapsed.as_secs_f64();
        let due = self.owed.floor();
        self.owed -= due;
        if due < 1.0 {
            return false;
        }
        self.advance(due as usize);
        true
    }
}

/// Where the replay's capacity came from, where the user did not give it: "capacity 8.0 GiB
/// inferred from the trace's 2 OOM(s): what PyTorch held when it gave up ...".
pub fn capacity_line(opts: replay::ReplayOptions, ooms: usize) -> Option<String> {
    let capacity = vramtop_alloc::human_bytes(opts.capacity);
    match opts.source {
        replay::CapacitySource::Inferred => Some(format!(
            "capacity {capacity} inferred from the trace's {ooms} OOM(s): what PyTorch held when \
             it gave up (give --capacity to choose another)"
        )),
        replay::CapacitySource::Kept => Some(format!(
            "capacity {capacity}: the cap the job ran under, as the hook kept it at the OOM \
             (give --capacity to choose another)"
        )),
        replay::CapacitySource::Given | replay::CapacitySource::Unlimited => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_trace::{TraceEventKind, TraceFormat, TraceStats};

    fn trace(n: usize) -> Trace {
        let events = (0..n)
            .map(|i| TraceEvent {
                kind: if i % 2 == 0 {
                    TraceEventKind::Alloc
                } else {
                    TraceEventKind::FreeCompleted
                },
                addr: 0x1000 * (i as u64 / 4 + 1),
                size: 1 << 20,
                stream: 0,
                tag: Some(format!("m.py:{i} f").into()),
                time_us: None,
            })
            .collect();
        Trace {
            source: TraceFormat::VramtopRecord,
            device: 0,
            initial: Vec::new(),
            initial_segments: Vec::new(),
            events,
            segments_at_end: Vec::new(),
            settings: Default::default(),
            stats: TraceStats::default(),
        }
    }

    #[test]
    fn step_seek_and_play() {
        let t = trace(1000);
        let mut s = ReplayerState::new("t", &t, PolicyKind::Caching, None).unwrap();
        assert_eq!((s.position(), s.len()), (0, 1000));
        s.handle(ViewerAction::Step);
        assert_eq!(s.position(), 1);
        assert_eq!(
            s.current_event().and_then(|e| e.tag.as_deref()),
            Some("m.py:0 f")
        );
        assert_eq!(s.view.stats.live_blocks, 1);
        s.handle(ViewerAction::SeekForward);
        assert_eq!(s.position(), 11);
        s.handle(ViewerAction::End);
        assert!(s.is_done());
        let history = s.view.frag_history.clone();
        assert_eq!(history.len(), 1000);
        s.handle(ViewerAction::SeekBack);
        assert_eq!(s.position(), 990);
        s.handle(ViewerAction::End);
        // Replayed from the start: the same history either way.
        assert_eq!(s.view.frag_history, history);
        s.handle(ViewerAction::Home);
        assert_eq!((s.position(), s.view.frag_history.len()), (0, 0));

        s.handle(ViewerAction::PlayPause);
        assert!(s.playing);
        let speed = s.speed;
        s.handle(ViewerAction::Faster);
        assert_eq!(s.speed, speed * 2.0);
        assert!(s.tick(Duration::from_secs(1)));
        assert_eq!(s.position(), (speed * 2.0) as usize);
        s.handle(ViewerAction::PlayPause);
        assert!(!s.tick(Duration::from_secs(1)));
        s.handle(ViewerAction::Quit);
        assert_eq!(s.exit, Some(Exit::Quit));
    }

    #[test]
    fn esc_closes_the_block_list_first() {
        let t = trace(10);
        let mut s = ReplayerState::new("t", &t, PolicyKind::BestFit, None).unwrap();
        s.advance(3);
        s.handle(ViewerAction::ToggleSegmentList);
        assert!(s.nav.show_segment_list);
        s.handle(ViewerAction::Down);
        assert_eq!(s.nav.segment_table.selected(), Some(1));
        s.handle(ViewerAction::Back);
        assert!(!s.nav.show_segment_list);
        assert_eq!(s.exit, None);
        s.handle(ViewerAction::Back);
        assert_eq!(s.exit, Some(Exit::Quit));
    }
}
