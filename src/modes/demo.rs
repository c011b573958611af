//! `vramtop demo [NAME]`, talk mode: the story list, or a story played on the presenter
//! screen, recorded as an asciicast on request, pictures saved as SVG.
//!
//! Talk mode as a `Screen` for the one loop (`modes::screen::run`): the story clock runs
//! only while something moves, status messages expire on a deadline. Each drawn frame
//! goes to the cast recording when there is one, and is kept for the `s` key's SVG picture.
//! The story's allocators are small and in memory we hold, so their calls run on this
//! task: a step of the built-in story costs microseconds.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Duration;

use std::io::IsTerminal;
use std::process::ExitCode;

use color_eyre::eyre::{Result, WrapErr};
use crossterm::event::KeyEvent;
use ratatui::buffer::Buffer;
use ratatui::{DefaultTerminal, Frame};
use tokio::time::Instant;

use super::screen::{self, Screen};
use super::usage_error;
use crate::app::Exit;
use crate::cli::DemoOptions;
use crate::demo::keys::{demo_action_for, DemoAction};
use crate::demo::player::{PlayState, StoryPlayer};
use crate::demo::story::{self, Story};
use crate::export::cast::CastRecorder;
use crate::export::svg;
use crate::ui::presenter::{self, Chrome};
use crate::ui::screen_theme::{no_color_from_env, Palette};

/// Story clock period while a step runs or holds.
const TICK: Duration = Duration::from_millis(50);
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
    /// When the first frame was drawn: the recording's time zero.
    started: Option<Instant>,
    exit: Option<Exit>,
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
            started: None,
            exit: None,
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
        let colors = self.chrome.palette.default_colors();
        let title = format!("vramtop demo {}: {}", view.story_name, view.caption);
        match svg::save(screen, &self.svg_dir, &stem, colors, &title) {
            Ok(path) => {
                let shown = path
                    .strip_prefix(".")
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                self.say(format!("saved {shown}"));
                self.saved.push(path);
            }
            Err(e) => self.say(format!("could not save {e}")),
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

impl Screen for Session {
    type Action = DemoAction;

    fn action_for(&self, key: KeyEvent) -> Option<DemoAction> {
        demo_action_for(key)
    }

    fn handle(&mut self, action: DemoAction) {
        if let Some(exit) = self.apply(action) {
            self.exit = Some(exit);
        }
    }

    fn draw(&self, frame: &mut Frame) {
        presenter::draw(frame, &self.player.view(), &self.chrome);
    }

    fn exit(&self) -> Option<Exit> {
        self.exit
    }

    fn tick_period(&self) -> Option<Duration> {
        self.moving().then_some(TICK)
    }

    fn tick(&mut self, elapsed: Duration) -> bool {
        self.player.advance(elapsed.as_secs_f64())
    }

    fn deadline(&self) -> Option<Instant> {
        self.message_until
    }

    fn deadline_passed(&mut self) -> bool {
        if self.message_until.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        self.chrome.message = None;
        self.message_until = None;
        true
    }

    fn drawn(&mut self, screen: &Buffer) -> bool {
        let started = *self.started.get_or_insert_with(Instant::now);
        self.record(started.elapsed().as_secs_f64(), screen);
        self.last_screen = Some(screen.clone());
        false
    }
}

/// Plays the session in the terminal until the presenter quits.
pub async fn run_session(terminal: &mut DefaultTerminal, session: &mut Session) -> Result<Exit> {
    screen::run(terminal, session).await
}

/// `vramtop demo [NAME]`: lists the stories without a name, else plays one.
pub fn run(name: Option<&str>, opts: &DemoOptions) -> Result<ExitCode> {
    let Some(name) = name else {
        print!("{}", story::listing());
        return Ok(ExitCode::SUCCESS);
    };
    let story = match Story::load(name) {
        Ok(s) => s,
        Err(e) => return usage_error(e),
    };
    if !std::io::stdout().is_terminal() {
        return usage_error("demo: stdout is not a terminal; run it in one (80x24 or larger)");
    }
    if let Some(line) = super::svg_dir_problem(&opts.svg_dir) {
        return usage_error(line);
    }
    let player = match StoryPlayer::new(story, opts.seed, opts.backing) {
        Ok(p) => p,
        Err(e) => return usage_error(e),
    };
    let cast_file = match &opts.record_cast {
        None => None,
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Some(std::io::BufWriter::new(f)),
            Err(e) => {
                return usage_error(format!("--record-cast {}: {e}", path.display()));
            }
        },
    };
    let session = play(player, opts, cast_file, &format!("vramtop demo {name}"))?;
    report(session, opts)
}

/// The terminal part: set up, run the loop, restore the terminal whatever happened.
fn play(
    player: StoryPlayer,
    opts: &DemoOptions,
    cast_file: Option<std::io::BufWriter<std::fs::File>>,
    title: &str,
) -> Result<(Session, Exit)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .wrap_err("could not start the async runtime")?;
    let chrome = Chrome {
        palette: Palette::new(opts.theme, no_color_from_env()),
        message: None,
    };
    let mut terminal = ratatui::try_init().wrap_err("cannot take over the terminal")?;
    let result = (|| {
        let size = terminal.size().wrap_err("reading the terminal size")?;
        let recorder = match cast_file {
            None => None,
            Some(file) => {
                let timestamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                Some(
                    CastRecorder::new(file, size.width, size.height, timestamp, title)
                        .wrap_err("writing the --record-cast file")?,
                )
            }
        };
        let mut session = Session::new(player, chrome, opts.svg_dir.clone(), recorder);
        let exit = rt.block_on(run_session(&mut terminal, &mut session))?;
        Ok((session, exit))
    })();
    ratatui::restore();
    result
}

/// After the terminal is back: finish the recording and say where things went.
fn report((mut session, exit): (Session, Exit), opts: &DemoOptions) -> Result<ExitCode> {
    if let (Some(recorder), Some(path)) = (session.recorder.take(), &opts.record_cast) {
        recorder
            .finish()
            .wrap_err_with(|| format!("writing {}", path.display()))?;
        eprintln!(
            "vramtop: recorded {} frames to {}",
            session.frames_recorded,
            path.display()
        );
    }
    for path in &session.saved {
        eprintln!("vramtop: saved {}", path.display());
    }
    Ok(ExitCode::from(exit.code()))
}
