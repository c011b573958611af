//! The talk-mode loop: one `tokio::select!` over terminal events, the story clock (only
//! while something moves), the frame deadline and signals. Each drawn frame goes to the
//! cast recording when there is one, and is kept for the `s` key's SVG picture.
//! The story's allocators are small and in memory we hold, so their calls run on this
//! task: a step of the built-in story costs microseconds.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Duration;

use color_eyre::eyre::{Result, WrapErr};
use crossterm::event::{Event, EventStream, KeyEventKind};
use futures::StreamExt;
use ratatui::buffer::Buffer;
use ratatui::DefaultTerminal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use super::keys::{demo_action_for, DemoAction};
use super::player::{PlayState, StoryPlayer};
use crate::app::Exit;
use crate::export::cast::CastRecorder;
use crate::export::svg::buffer_to_svg;
use crate::ui::presenter::{self, Chrome};

/// Story clock period while a step runs or holds.
const TICK: Duration = Duration::from_millis(50);
const MAX_FPS: f64 = 30.0;
/// How long a status message (a saved picture, an error) stays on screen.
const MESSAGE_FOR: Duration = Duration::from_secs(5);

pub type CastFile = CastRecorder<BufWriter<File>>;

/// Everything the loop works on besides the terminal.
pub struct Session {
    pub player: StoryPlayer,
    pub chrome: Chrome,
    pub svg_dir: PathBuf,
    pub recorder: Option<CastFile>,
    /// Frames written to the recording.
    pub frames_recorded: u64,
    /// Pictures saved with `s`.
    pub saved: Vec<PathBuf>,
    last_screen: Option<Buffer>,
    message_until: Option<Instant>,
}

impl Session {
    pub fn new(
        player: StoryPlayer,
        chrome: Chrome,
        svg_dir: PathBuf,
        recorder: Option<CastFile>,
    ) -> Self {
        Session {
            player,
            chrome,
            svg_dir,
            recorder,
            frames_recorded: 0,
            saved: Vec::new(),
            last_screen: None,
            message_until: None,
        }
    }

    fn say(&mut self, message: String) {
        self.chrome.message = Some(message);
        self.message_until = Some(Instant::now() + MESSAGE_FOR);
    }

    /// Whether the story clock has anything to do.
    fn moving(&self) -> bool {
        let state = self.player.state();
        !self.player.is_paused() && matches!(state, PlayState::Running | PlayState::Holding { .. })
    }

    fn apply(&mut self, action: DemoAction) -> Option<Exit> {
        match action {
            DemoAction::Quit => return Some(Exit::Quit),
            DemoAction::Interrupt => return Some(Exit::Interrupted),
            DemoAction::TogglePause => self.player.toggle_pause(),
            DemoAction::Next => self.player.next(),
            DemoAction::Previous => {
                if let Err(e) = self.player.previous() {
                    self.say(format!("could not go back: {e}"));
                }
            }
            DemoAction::Faster => self.player.faster(),
            DemoAction::Slower => self.player.slower(),
            DemoAction::Restart => {
                if let Err(e) = self.player.restart() {
                    self.say(format!("could not restart: {e}"));
                }
            }
            DemoAction::SaveSvg => self.save_svg(),
        }
        None
    }

    fn save_svg(&mut self) {
        let Some(screen) = &self.last_screen else {
            return;
        };
        let view = self.player.view();
        let stem = format!(
            "{}-act{}-step{}",
            view.story_name,
            view.act + 1,
            view.step_in_act + 1
        );
        let path = free_path(&self.svg_dir, &stem);
        let (fg, bg) = self.chrome.palette.default_colors();
        let title = format!("vramtop demo {}: {}", view.story_name, view.caption);
        let svg = buffer_to_svg(screen, fg, bg, &title);
        match std::fs::write(&path, svg) {
            Ok(()) => {
                let shown = path
                    .strip_prefix(".")
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                self.say(format!("saved {shown}"));
                self.saved.push(path);
            }
            Err(e) => self.say(format!("could not save {}: {e}", path.display())),
        }
    }

    fn record(&mut self, time_s: f64, screen: &Buffer) {
        let Some(recorder) = self.recorder.as_mut() else {
            return;
        };
        match recorder.frame(time_s, screen) {
            Ok(true) => self.frames_recorded += 1,
            Ok(false) => {}
            Err(e) => {
                // A talk goes on without its recording rather than stopping.
                self.recorder = None;
                self.say(format!("recording stopped: {e}"));
            }
        }
    }
}

/// `dir/stem.svg`, or `dir/stem-2.svg` and so on when that exists: never overwrite.
fn free_path(dir: &Path, stem: &str) -> PathBuf {
    let first = dir.join(format!("{stem}.svg"));
    if !first.exists() {
        return first;
    }
    (2u32..)
        .map(|n| dir.join(format!("{stem}-{n}.svg")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

pub async fn run(terminal: &mut DefaultTerminal, session: &mut Session) -> Result<Exit> {
    let mut events = EventStream::new();
    let mut sigterm = signal(SignalKind::terminate()).wrap_err("installing SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).wrap_err("installing SIGHUP handler")?;
    let mut sigint = signal(SignalKind::interrupt()).wrap_err("installing SIGINT handler")?;
    let frame_period = Duration::from_secs_f64(1.0 / MAX_FPS);
    let started = Instant::now();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_tick = Instant::now();
    let mut next_frame = Instant::now();
    let mut dirty = true;

    loop {
        if dirty && Instant::now() >= next_frame {
            let view = session.player.view();
            let chrome = session.chrome.clone();
            let completed = terminal
                .draw(|frame| presenter::draw(frame, &view, &chrome))
                .wrap_err("drawing the screen")?;
            let screen = completed.buffer.clone();
            session.record(started.elapsed().as_secs_f64(), &screen);
            session.last_screen = Some(screen);
            dirty = false;
            next_frame = Instant::now() + frame_period;
        }
        let moving = session.moving();
        let message_until = session.message_until;
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) if key.kind == KeyEventKind::Press => {
                    if let Some(action) = demo_action_for(key) {
                        if let Some(exit) = session.apply(action) {
                            return Ok(exit);
                        }
                        last_tick = Instant::now();
                        dirty = true;
                    }
                }
                Some(Ok(Event::Resize(_, _))) => dirty = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).wrap_err("reading terminal input"),
                None => return Ok(Exit::Terminated),
            },
            _ = ticker.tick(), if moving => {
                let now = Instant::now();
                let dt = now.duration_since(last_tick).as_secs_f64();
                last_tick = now;
                dirty |= session.player.advance(dt);
            },
            _ = tokio::time::sleep_until(message_until.unwrap_or(next_frame)), if message_until.is_some() => {
                if message_until.is_some_and(|t| Instant::now() >= t) {
                    session.chrome.message = None;
                    session.message_until = None;
                    dirty = true;
                }
            },
            _ = tokio::time::sleep_until(next_frame), if dirty => {},
            _ = sigint.recv() => return Ok(Exit::Interrupted),
            _ = sigterm.recv() => return Ok(Exit::Terminated),
            _ = sighup.recv() => return Ok(Exit::Terminated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pictures_never_overwrite() {
        let dir = std::env::temp_dir().join(format!("vramtop-svg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let first = free_path(&dir, "s");
        assert_eq!(first, dir.join("s.svg"));
        std::fs::write(&first, "x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(free_path(&dir, "s"), dir.join("s-2.svg"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
