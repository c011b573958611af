//! The live view's sources for the one loop (`screen::run`): telemetry snapshots, the
//! probe's views and a staleness watchdog. Telemetry is polled on its own thread so a
//! slow or hung driver call never freezes the screen.

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use color_eyre::eyre::{eyre, Result, WrapErr};
use crossterm::event::KeyEvent;
use ratatui::{DefaultTerminal, Frame};
use tokio::sync::watch;
use tokio::time::Instant;

use super::action::{action_for, Action};
use super::screen::{self, Screen};
use super::{App, Exit};
use crate::probe::live::{LiveProbe, ProbeView};
use crate::telemetry::{SystemSnapshot, TelemetrySource};

/// Polls a source on a dedicated thread at a fixed cadence and publishes only the latest
/// snapshot: if the UI is busy, older snapshots are replaced, never queued.
/// Dropping the poller stops the thread at its next wake-up.
pub struct Poller {
    pub snapshots: watch::Receiver<Option<SystemSnapshot>>,
    _stop: std_mpsc::Sender<()>,
}

impl Poller {
    pub fn spawn(mut source: Box<dyn TelemetrySource>, interval: Duration) -> Result<Self> {
        let (tx, rx) = watch::channel(None);
        let (stop_tx, stop_rx) = std_mpsc::channel::<()>();
        thread::Builder::new()
            .name("vramtop-telemetry".into())
            .spawn(move || {
                let mut next = std::time::Instant::now();
                loop {
                    tx.send_replace(Some(source.poll()));
                    next += interval;
                    // After a slow poll, start a fresh cadence rather than polling back
                    // to back to catch up on ticks nobody will see.
                    let now = std::time::Instant::now();
                    if next < now {
                        next = now + interval;
                    }
                    let wait = next.saturating_duration_since(std::time::Instant::now());
                    // The stop channel doubles as an interruptible sleep.
                    match stop_rx.recv_timeout(wait) {
                        Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    if tx.is_closed() {
                        return;
                    }
                }
            })
            .wrap_err("could not start the telemetry thread")?;
        Ok(Poller {
            snapshots: rx,
            _stop: stop_tx,
        })
    }
}

/// The live view as a `Screen`: the app state plus its sources (telemetry, the probe)
/// and the staleness watchdog.
struct LiveScreen<'a> {
    app: &'a mut App,
    poller: Poller,
    probe: Option<LiveProbe>,
    probe_views: watch::Receiver<Arc<ProbeView>>,
    /// A poll that has not answered by then is hung: the figures are marked stale.
    stale_deadline: Instant,
    stale_after: Duration,
}

pub async fn run(
    terminal: &mut DefaultTerminal,
    app: &mut App,
    poller: Poller,
    probe: Option<LiveProbe>,
) -> Result<Exit> {
    // Without a probe, a channel that never changes keeps the select arm idle.
    let (_idle_tx, idle_rx) = watch::channel(Arc::new(ProbeView::default()));
    let probe_views = probe.as_ref().map_or(idle_rx, |p| p.views.clone());
    let interval = Duration::from_secs_f64(app.interval_s);
    // A poll that has not answered in three intervals (and at least two seconds) is hung.
    let stale_after = (interval * 3).max(Duration::from_secs(2));
    let mut screen = LiveScreen {
        app,
        poller,
        probe,
        probe_views,
        stale_deadline: Instant::now() + stale_after,
        stale_after,
    };
    screen::run(terminal, &mut screen).await
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
        if let Some(p) = self.probe.as_ref().filter(|_| action.is_probe_control()) {
            forward(p, action);
        }
        self.app.handle(action);
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
        let probe_alive = self.probe.is_some();
        tokio::select! {
            changed = self.poller.snapshots.changed() => {
                if changed.is_err() {
                    // The thread only ends this way by panicking. Its panic hook has
                    // already restored the terminal, so carrying on would draw into a
                    // cooked screen that no longer reads keys: stop with the reason.
                    return Err(eyre!("the telemetry thread stopped unexpectedly"));
                }
                let snapshot = self.poller.snapshots.borrow_and_update().clone();
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
