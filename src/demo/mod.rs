//! Talk mode, `vramtop demo [NAME]`: scripted stories of allocator behaviour played on
//! a presenter screen (`ui::presenter`), stepped by the speaker, optionally recorded as
//! an asciicast and saved as SVG pictures for slides. Stories run on bookkeeping or host
//! memory, never the GPU, and play the same under the same seed.
//!
//! `story` (the TOML format) -> `player` (steps, no terminal) -> `runtime` (the loop).

pub mod keys;
pub mod player;
pub mod runtime;
pub mod story;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use color_eyre::eyre::{Result, WrapErr};

use crate::export::cast::CastRecorder;
use crate::ui::presenter::Chrome;
use crate::ui::screen_theme::{no_color_from_env, Palette, ScreenTheme};
use player::StoryPlayer;
use story::{Story, StoryBacking};

/// Options of `vramtop demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoOptions {
    /// Seed of the story's random draws
    #[arg(long, value_name = "N", default_value = "0")]
    pub seed: u64,

    /// Colours of the presenter screen (NO_COLOR turns colours off whatever the theme)
    #[arg(long, value_enum, default_value = "dark")]
    pub theme: ScreenTheme,

    /// Where the story's memory comes from (default: what the story says)
    #[arg(long, value_enum)]
    pub backing: Option<StoryBacking>,

    /// Record what is shown as an asciicast v2 file (play it with asciinema)
    #[arg(long, value_name = "FILE")]
    pub record_cast: Option<PathBuf>,

    /// Folder the s key saves SVG pictures of the screen into
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub svg_dir: PathBuf,
}

/// One line for a user mistake, exit 2.
fn usage_error(msg: impl std::fmt::Display) -> Result<ExitCode> {
    eprintln!("vramtop: {msg}");
    Ok(ExitCode::from(2))
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
    if !opts.svg_dir.is_dir() {
        return usage_error(format!(
            "--svg-dir {}: not a folder; create it or name another",
            opts.svg_dir.display()
        ));
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
) -> Result<(runtime::Session, crate::app::Exit)> {
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
        let mut session = runtime::Session::new(player, chrome, opts.svg_dir.clone(), recorder);
        let exit = rt.block_on(runtime::run(&mut terminal, &mut session))?;
        Ok((session, exit))
    })();
    ratatui::restore();
    result
}

/// After the terminal is back: finish the recording and say where things went.
fn report(
    (mut session, exit): (runtime::Session, crate::app::Exit),
    opts: &DemoOptions,
) -> Result<ExitCode> {
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
