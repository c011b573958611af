//! The live view's sources for the one loop (`screen::run`): telemetry snapshots, the
//! probe's views and a staleness watchdog. Telemetry is polled on its own thread so a
//! slow or hung driver call never freezes the screen.

use std::sync::Arc;
use std::time::Duration;

use color_eyre::eyre::{eyre, Result};
use crossterm::event::KeyEvent;
use ratatui::{DefaultTerminal, Frame};
use tokio::sync::watch;
use tokio::time::Instant;

use super::action::{action_for, Action};
use super::screen::{self, Screen};
use super::{App, Exit};
use crate::probe::live::{LiveProbe, ProbeView};
use vramtop_attach::launch::{CommandOutput, RunningCommand};
use vramtop_attach::{AttachedJobs, Attacher};
use vramtop_telemetry::poller::Poller;

/// What feeds the live view besides the terminal.
pub struct Sources {
    pub poller: Poller,
    pub probe: Option<LiveProbe>,
    /// Hooked PyTorch jobs.
    pub attacher: Option<Attacher>,
    /// The command `vramtop run` started.
    pub command: Option<RunningCommand>,
}

/// The live view as a `Screen`: the app state plus its sources and the staleness
/// watchdog.
struct LiveScreen<'a> {
    app: &'a mut App,
    sources: Sources,
    probe_views: watch::Receiver<Arc<ProbeView>>,
    jobs: watch::Receiver<Arc<AttachedJobs>>,
    output: watch::Receiver<Arc<CommandOutput>>,
    /// A poll that has not answered by then is hung: the figures are marked stale.
    stale_deadline: Instant,
    stale_after: Duration,
}

pub async fn run(terminal: &mut DefaultTerminal, app: &mut App, sources: Sources) -> Result<Exit> {
    // A missing source is a channel that never changes: its select arm stays idle.
    let probe_views = sources
        .probe
        .as_ref()
        .map_or_else(|| idle(ProbeView::default()), |p| p.views.clone());
    let jobs = sources
        .attacher
        .as_ref()
        .map_or_else(|| idle(AttachedJobs::default()), |a| a.jobs.clone());
    let output = sources
        .command
        .as_ref()
        .map_or_else(|| idle(CommandOutput::default()), |c| c.output.clone());
    let interval = Duration::from_secs_f64(app.interval_s);
    // A poll that has not answered in three intervals (and at least two seconds) is hung.
    let stale_after = (interval * 3).max(Duration::from_secs(2));
    let mut screen = LiveScreen {
        app,
        sources,
        probe_views,
        jobs,
        output,
        stale_deadline: Instant::now() + stale_after,
        stale_after,
    };
    screen::run(terminal, &mut screen).await
}

/// A receiver whose sender is gone after one value: `changed()` then fails at once,
/// so callers only wait on it while the source is there (`if` guards below).
fn idle<T>(value: T) -> watch::Receiver<Arc<T>> {
    watch::channel(Arc::new(value)).1
}

impl Screen for LiveScreen<'_> {
    type Action = Action;

    fn action_for(&self, key: KeyEvent) -> Option<Action> {
        // A prompt (filter, confirmation) reads keys as typed; Ctrl-C still quits.
        match action_for(key) {
            Some(Action::Interrupt) => Some(Action::Interrupt),
            _ if self.app.wants_raw_keys() => Some(Action::Input(key)),
            action => action,
        }
    }

    fn handle(&mut self, action: Action) {
        if let Some(p) = self
            .sources
            .probe
            .as_ref()
            .filter(|_| action.is_probe_control())
        {
            forward(p, action);
        }
        // Ctrl-C while the started job runs interrupts the job, as in a shell; vramtop
        // stays to show how it ended.
        if let (Action::Interrupt, Some(command), Some(run)) =
            (action, self.sources.command.as_ref(), self.app.run.as_mut())
        {
            if run.running() {
                let signal = match run.interrupts {
                    0 => libc::SIGINT,
                    1 => libc::SIGTERM,
                    _ => libc::SIGKILL,
                };
                command.signal(signal);
                run.interrupts += 1;
                return;
            }
        }
        self.app.handle(action);
        if let (Action::SaveSettings, Some(saver)) = (action, &self.app.settings) {
            self.app.notice = Some(saver.save(self.app.interval_s, self.app.sort));
        }
    }

    fn draw(&self, frame: &mut Frame) {
        crate::ui::draw(frame, self.app);
    }

    fn exit(&self) -> Option<Exit> {
        self.app.exit
    }

    fn deadline(&self) -> Option<Instant> {
        (!self.app.stale).then_some(self.stale_deadline)
    }

    fn deadline_passed(&mut self) -> bool {
        if Instant::now() < self.stale_deadline {
            return false;
        }
        self.app.mark_stale();
        true
    }

    async fn update(&mut self) -> Result<bool> {
        let probe_alive = self.sources.probe.is_some();
        let attaching = self.sources.attacher.is_some();
        let watching_command = self.sources.command.is_some();
        tokio::select! {
            changed = self.sources.poller.snapshots.changed() => {
                if changed.is_err() {
                    // The thread only ends this way by panicking. Its panic hook has
                    // already restored the terminal, so carrying on would draw into a
                    // cooked screen that no longer reads keys: stop with the reason.
                    return Err(eyre!("the telemetry thread stopped unexpectedly"));
                }
                let snapshot = self.sources.poller.snapshots.borrow_and_update().clone();
                let Some(snapshot) = snapshot else {
                    return Ok(false);
                };
                self.app.apply_snapshot(snapshot);
                self.stale_deadline = Instant::now() + self.stale_after;
                Ok(true)
            },
            changed = self.probe_views.changed(), if probe_alive => {
                if changed.is_err() {
                    // As above: the probe task ends only by panicking while we run.
                    return Err(eyre!("the probe workload stopped unexpectedly"));
                }
                let view = self.probe_views.borrow_and_update().clone();
                self.app.apply_probe(view);
                Ok(true)
            },
            changed = self.jobs.changed(), if attaching => {
                if changed.is_err() {
                    return Err(eyre!("the attach thread stopped unexpectedly"));
                }
                let jobs = self.jobs.borrow_and_update().clone();
                self.app.apply_attached(jobs);
                Ok(true)
            },
            changed = self.output.changed(), if watching_command => {
                if changed.is_err() {
                    // The watcher ends after the command has exited and been reported.
                    self.sources.command = None;
                    return Ok(false);
                }
                let output = self.output.borrow_and_update().clone();
                self.app.apply_run_output(output.lines.clone(), output.exit_code);
                if let (Some(code), Some(command), Some(attacher)) = (
                    output.exit_code,
                    self.sources.command.as_ref(),
                    self.sources.attacher.as_ref(),
                ) {
                    attacher.job_exited(command.pid, i64::from(code));
                }
                Ok(true)
            },
        }
    }
}

fn forward(probe: &LiveProbe, action: Action) {
    match action {
        Action::ProbePause => probe.toggle_pause(),
        Action::ProbeStep => probe.step(),
        Action::ProbeFaster => probe.faster(),
        Action::ProbeSlower => probe.slower(),
        Action::ToggleMark => probe.toggle_mark(),
        _ => {}
    }
}
