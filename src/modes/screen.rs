//! The one terminal loop every interactive mode runs: a single `tokio::select!` over
//! terminal input, the screen's own data sources, its clock, its deadline and signals.
//! Modes differ only in the `Screen` they hand it (the live view, the trace viewers,
//! talk mode), so a new source is a new `Screen::update`, never a new loop.
//! The screen is redrawn only when something changed, at most `MAX_FPS` times a second.

use std::future::Future;
use std::time::Duration;

use color_eyre::eyre::{Result, WrapErr};
use crossterm::event::{Event, EventStream, KeyEvent, KeyEventKind};
use futures::StreamExt;
use ratatui::buffer::Buffer;
use ratatui::{DefaultTerminal, Frame};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::app::Exit;

/// Upper bound on redraws per second; input and data are coalesced into frames.
pub const MAX_FPS: f64 = 30.0;

/// One interactive mode: draws itself from its state, maps keys to its own actions,
/// and may have sources, a clock and a deadline of its own.
pub trait Screen {
    /// What a key means to this screen (each mode has its own key table).
    type Action: Copy;

    fn action_for(&self, key: KeyEvent) -> Option<Self::Action>;
    fn handle(&mut self, action: Self::Action);
    fn draw(&self, frame: &mut Frame);
    /// `Some` once the screen wants the loop to end.
    fn exit(&self) -> Option<Exit>;

    /// While time moves the screen on (a replay playing, a story step running): how often
    /// to call `tick`. `None` stops the clock, so an idle screen costs nothing.
    fn tick_period(&self) -> Option<Duration> {
        None
    }
    /// Moves the screen on by `elapsed`; `true` when it changed.
    fn tick(&mut self, _elapsed: Duration) -> bool {
        false
    }

    /// A moment the screen wants to be woken at (a staleness watchdog, a message that
    /// expires); `deadline_passed` is then called and says whether anything changed.
    fn deadline(&self) -> Option<Instant> {
        None
    }
    fn deadline_passed(&mut self) -> bool {
        false
    }

    /// Waits for the screen's data sources and takes in what arrived; `Ok(true)` when
    /// something changed. It must be cancel-safe: the loop drops it when input wins.
    /// An `Err` ends the loop (a source that died takes the app down with its reason).
    fn update(&mut self) -> impl Future<Output = Result<bool>> {
        std::future::pending()
    }

    /// Called with each drawn frame (talk mode records it, the live view saves one as a
    /// picture when asked); `true` when that changed the screen (a notice to show).
    fn drawn(&mut self, _screen: &Buffer) -> bool {
        false
    }
}

/// Runs `screen` in the terminal until it exits or a signal ends it; the caller owns
/// `ratatui::init`/`restore`, so the terminal is restored whatever this returns.
pub async fn run<S: Screen>(terminal: &mut DefaultTerminal, screen: &mut S) -> Result<Exit> {
    let mut events = EventStream::new();
    let mut sigterm = signal(SignalKind::terminate()).wrap_err("installing SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).wrap_err("installing SIGHUP handler")?;
    let mut sigint = signal(SignalKind::interrupt()).wrap_err("installing SIGINT handler")?;
    let frame_period = Duration::from_secs_f64(1.0 / MAX_FPS);
    let mut next_frame = Instant::now();
    let mut last_tick = Instant::now();
    let mut dirty = true;

    loop {
        if let Some(exit) = screen.exit() {
            return Ok(exit);
        }
        if dirty && Instant::now() >= next_frame {
            let completed = terminal
                .draw(|frame| screen.draw(frame))
                .wrap_err("drawing the screen")?;
            dirty = screen.drawn(completed.buffer);
            next_frame = Instant::now() + frame_period;
        }
        let tick_period = screen.tick_period();
        if tick_period.is_none() {
            // Time spent stopped is not owed to the clock when it starts again.
            last_tick = Instant::now();
        }
        let next_tick = tick_period.map(|p| last_tick + p);
        let deadline = screen.deadline();
        // A disabled branch still builds its future; this instant is never waited on.
        let never = Instant::now();
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) if key.kind == KeyEventKind::Press => {
                    if let Some(action) = screen.action_for(key) {
                        screen.handle(action);
                        dirty = true;
                    }
                }
                Some(Ok(Event::Resize(_, _))) => dirty = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).wrap_err("reading terminal input"),
                None => return Ok(Exit::Terminated),
            },
            changed = screen.update() => dirty |= changed?,
            _ = tokio::time::sleep_until(next_tick.unwrap_or(never)), if next_tick.is_some() => {
                let now = Instant::now();
                let elapsed = now.saturating_duration_since(last_tick);
                last_tick = now;
                dirty |= screen.tick(elapsed);
            },
            _ = tokio::time::sleep_until(deadline.unwrap_or(never)), if deadline.is_some() => {
                dirty |= screen.deadline_passed();
            },
            _ = tokio::time::sleep_until(next_frame), if dirty => {},
            _ = sigint.recv() => return Ok(Exit::Interrupted),
            _ = sigterm.recv() => return Ok(Exit::Terminated),
            _ = sighup.recv() => return Ok(Exit::Terminated),
        }
    }
}

/// Runs a screen with no background sources (the trace viewers, talk mode) until it
/// exits, on a runtime of its own: one thread is enough for input and a clock.
pub fn run_blocking(terminal: &mut DefaultTerminal, screen: &mut impl Screen) -> Result<Exit> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .wrap_err("could not start the async runtime")?;
    rt.block_on(run(terminal, screen))
}
