//! The live loop: one `tokio::select!` over terminal events, telemetry snapshots, the
//! frame deadline, a staleness watchdog and signals. Telemetry is polled on its own
//! thread so a slow or hung driver call never freezes the screen. The screen is redrawn
//! only when something changed, so an idle vramtop costs next to nothing.

use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::Duration;

use color_eyre::eyre::{eyre, Result, WrapErr};
use crossterm::event::{Event, EventStream, KeyEventKind};
use futures::StreamExt;
use ratatui::DefaultTerminal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::time::Instant;

use super::action::{action_for, Action};
use super::{App, Exit};
use crate::probe::live::{LiveProbe, ProbeView};
use crate::telemetry::{SystemSnapshot, TelemetrySource};

/// Upper bound on redraws per second; input and data are coalesced into frames.
const MAX_FPS: f64 = 30.0;

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

pub async fn run(
    terminal: &mut DefaultTerminal,
    app: &mut App,
    mut poller: Poller,
    probe: Option<LiveProbe>,
) -> Result<Exit> {
    // Without a probe, a channel that never changes keeps the select arm idle.
    let (_idle_tx, idle_rx) = watch::channel(std::sync::Arc::new(ProbeView::default()));
    let mut probe_views = probe.as_ref().map_or(idle_rx, |p| p.views.clone());
    let probe_alive = probe.is_some();
    let mut events = EventStream::new();
    let mut sigterm = signal(SignalKind::terminate()).wrap_err("installing SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).wrap_err("installing SIGHUP handler")?;
    let mut sigint = signal(SignalKind::interrupt()).wrap_err("installing SIGINT handler")?;
    let frame_period = Duration::from_secs_f64(1.0 / MAX_FPS);
    let interval = Duration::from_secs_f64(app.interval_s);
    // A poll that has not answered in three intervals (and at least two seconds) is hung.
    let stale_after = (interval * 3).max(Duration::from_secs(2));
    let mut stale_deadline = Instant::now() + stale_after;
    let mut next_frame = Instant::now();
    let mut dirty = true;

    loop {
        if let Some(exit) = app.exit {
            return Ok(exit);
        }
        if dirty && Instant::now() >= next_frame {
            terminal
                .draw(|frame| crate::ui::draw(frame, app))
                .wrap_err("drawing the screen")?;
            dirty = false;
            next_frame = Instant::now() + frame_period;
        }
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) if key.kind == KeyEventKind::Press => {
                    if let Some(action) = action_for(key) {
                        if let Some(p) = probe.as_ref().filter(|_| action.is_probe_control()) {
                            forward(p, action);
                        }
                        app.handle(action);
                        if let (Action::SaveSettings, Some(saver)) = (action, &app.settings) {
                            app.notice = Some(saver.save(app.interval_s, app.sort));
                        }
                        dirty = true;
                    }
                }
                Some(Ok(Event::Resize(_, _))) => dirty = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).wrap_err("reading terminal input"),
                None => return Ok(Exit::Terminated),
            },
            changed = poller.snapshots.changed() => {
                if changed.is_err() {
                    // The thread only ends this way by panicking. Its panic hook has
                    // already restored the terminal, so carrying on would draw into a
                    // cooked screen that no longer reads keys: stop with the reason.
                    return Err(eyre!("the telemetry thread stopped unexpectedly"));
                }
                let snapshot = poller.snapshots.borrow_and_update().clone();
                if let Some(snapshot) = snapshot {
                    app.apply_snapshot(snapshot);
                    stale_deadline = Instant::now() + stale_after;
                    dirty = true;
                }
            },
            changed = probe_views.changed(), if probe_alive => {
                if changed.is_err() {
                    // As above: the probe task ends only by panicking while we run.
                    return Err(eyre!("the probe workload stopped unexpectedly"));
                } else {
                    let view = probe_views.borrow_and_update().clone();
                    app.apply_probe(view);
                    dirty = true;
                }
            },
            _ = tokio::time::sleep_until(next_frame), if dirty => {},
            _ = tokio::time::sleep_until(stale_deadline), if !app.stale => {
                app.mark_stale();
                dirty = true;
            },
            _ = sigint.recv() => return Ok(Exit::Interrupted),
            _ = sigterm.recv() => return Ok(Exit::Terminated),
            _ = sighup.recv() => return Ok(Exit::Terminated),
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
