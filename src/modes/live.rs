//! The live view: its sources (telemetry snapshots, the probe's views, hooked jobs, the
//! command `vramtop run` started) for the one loop (`screen::run`), a staleness watchdog,
//! and the side effects of keys (signals to the job, forwarding probe controls, saving
//! the settings file). Telemetry is polled on its own thread (`Poller`) so a slow or hung
//! driver call never freezes the screen.

use std::sync::Arc;
use std::time::Duration;

use color_eyre::eyre::{eyre, Result, WrapErr};
use crossterm::event::KeyEvent;
use ratatui::buffer::Buffer;
use ratatui::{DefaultTerminal, Frame};
use tokio::sync::watch;
use tokio::time::Instant;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use super::screen::{self, Screen};
use super::{build_probes, in_terminal, once, runtime, socket_dir, usage_error, Probes};
use crate::app::action::{action_for, Action};
use crate::app::{App, Exit};
use crate::cli;
use crate::config::{ConfigFile, Saver};
use crate::export::svg;
use crate::probe::live::{LiveProbe, ProbeView};
use crate::probe::record::Recorder;
use crate::probe::tour::Tour;
use crate::probe::Scenario;
use crate::ui::screen_theme::Palette;
use vramtop_attach::launch::{CommandOutput, RunningCommand};
use vramtop_attach::{AttachedJobs, Attacher};
use vramtop_telemetry::auth::BearerToken;
use vramtop_telemetry::open::open;
use vramtop_telemetry::poller::Poller;
use vramtop_telemetry::sim::WorkloadGauge;

/// `vramtop` with no subcommand: the live view, or one poll printed (`--once`, or stdout
/// not a terminal).
pub fn run(args: cli::LiveArgs, config: ConfigFile) -> Result<ExitCode> {
    let workload = WorkloadGauge::default();
    let once = args.once || !std::io::stdout().is_terminal();
    // A one-shot run has no probe to show, but a misspelt scenario still deserves its line.
    if let (true, Some(name)) = (once, &args.probe) {
        if let Err(e) = Scenario::load(name) {
            return usage_error(e);
        }
    }
    if once && args.record.is_some() {
        return usage_error("--record needs the live view: run it in a terminal, without --once");
    }
    if once {
        return once::run(&args, workload);
    }
    if let Some(line) = super::svg_dir_problem(&args.svg_dir) {
        return usage_error(line);
    }
    let rt = runtime()?;
    let opened = if args.remote.is_empty() {
        open(args.device, args.seed, workload.clone()).wrap_err("--device nvml")?
    } else {
        let token = match args.token_file.as_deref().map(BearerToken::from_file) {
            None => None,
            Some(Ok(token)) => Some(token),
            Some(Err(e)) => return usage_error(format!("--token-file {e}")),
        };
        let interval = Duration::from_secs_f64(args.interval);
        vramtop_telemetry::remote::open(rt.handle(), &args.remote, interval, token, false)
    };

    let mut probe_notice = None;
    let probe_set = match &args.probe {
        None => None,
        Some(name) => {
            let policies = if args.compare.is_empty() {
                vec![args.probe_opts.policy]
            } else {
                args.compare.clone()
            };
            match build_probes(name, &policies, &args.probe_opts, args.seed) {
                Ok(Probes::Built(set)) => Some(set),
                // A bad limit is the user's to fix; a GPU that cannot run probes is not:
                // keep monitoring and say why there is no probe.
                Ok(Probes::Disabled(line)) => {
                    probe_notice = Some(line);
                    None
                }
                Err(line) => return usage_error(line),
            }
        }
    };
    // With no GPU the first screen would be empty charts: the simulated device plays the
    // built-in scenarios instead, on bookkeeping memory. A real GPU never gets a probe
    // that was not asked for.
    let tour = if opened.simulated
        && args.probe.is_none()
        && !args.no_tour
        && config.from_file.tour != Some(false)
    {
        let tour = Tour::new(args.probe_opts.policy, args.seed);
        Some(tour.map_err(|e| eyre!("the simulated device's tour: {e}"))?)
    } else {
        None
    };
    let poller = Poller::spawn(opened.source, Duration::from_secs_f64(args.interval))?;
    let mut app = App::new(args.interval);
    app.notice = probe_notice
        .or_else(|| opened.notice.clone())
        .or_else(|| config.notice.clone());
    if let Some(sort) = config.from_file.sort {
        app.sort = sort;
    }
    app.columns = config.from_file.columns.clone();
    let saver = Saver::new(config, &args);
    // The file is opened before the terminal is taken over, so a bad path is one line.
    let recorder = match (
        &args.record,
        probe_set.as_ref().and_then(|s| s.probes.first()),
    ) {
        (Some(path), Some(first)) => match Recorder::create(path, first.allocator().clone()) {
            Ok(r) => Some((r, path.display().to_string())),
            Err(e) => return usage_error(format!("--record {}: {e}", path.display())),
        },
        _ => None,
    };
    let ops_per_s = args.probe_opts.ops_per_s;
    let attacher = Attacher::spawn(socket_dir(), Duration::from_secs_f64(args.interval))
        .wrap_err("could not start the attach thread")?;
    let exit = in_terminal(|terminal| {
        rt.block_on(async {
            let probe = match (probe_set, tour) {
                (Some(set), _) => Some(LiveProbe::spawn(
                    set.probes,
                    Some(workload),
                    ops_per_s,
                    recorder,
                )),
                (None, Some(tour)) => Some(LiveProbe::spawn_tour(tour, Some(workload), ops_per_s)),
                (None, None) => None,
            };
            let sources = Sources {
                poller,
                probe,
                attacher: Some(attacher),
                command: None,
                saver: Some(saver),
            };
            run_screen(terminal, &mut app, sources, args.svg_dir.clone()).await
        })
    })?;
    Ok(ExitCode::from(exit.code()))
}

/// What feeds the live view besides the terminal.
pub struct Sources {
    pub poller: Poller,
    pub probe: Option<LiveProbe>,
    /// Hooked PyTorch jobs.
    pub attacher: Option<Attacher>,
    /// The command `vramtop run` started.
    pub command: Option<RunningCommand>,
    /// Where F12 saves the current settings; None where there is no settings file to
    /// speak of (`vramtop run`).
    pub saver: Option<Saver>,
}

/// The live view as a `Screen`: the app state plus its sources and the staleness
/// watchdog.
struct LiveScreen<'a> {
    app: &'a mut App,
    sources: Sources,
    /// P was pressed: the next frame drawn (the screen as seen, P changes nothing on it)
    /// is saved as a picture. No frame is kept otherwise, so drawing copies nothing.
    picture_asked: bool,
    svg_dir: PathBuf,
    probe_views: watch::Receiver<Arc<ProbeView>>,
    jobs: watch::Receiver<Arc<AttachedJobs>>,
    output: watch::Receiver<Arc<CommandOutput>>,
    /// A poll that has not answered by then is hung: the figures are marked stale.
    stale_deadline: Instant,
    stale_after: Duration,
}

/// Runs the live view over `sources` until it exits; the P key saves pictures of it
/// into `svg_dir`.
pub async fn run_screen(
    terminal: &mut DefaultTerminal,
    app: &mut App,
    sources: Sources,
    svg_dir: PathBuf,
) -> Result<Exit> {
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
        picture_asked: false,
        svg_dir,
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
        if let (Action::SaveSettings, Some(saver)) = (action, &self.sources.saver) {
            self.app.notice = Some(saver.save(self.app.interval_s, self.app.sort));
        }
        if action == Action::SaveScreen {
            self.picture_asked = true;
        }
    }

    fn draw(&self, frame: &mut Frame) {
        crate::ui::draw(frame, self.app);
    }

    fn drawn(&mut self, screen: &Buffer) -> bool {
        if !std::mem::take(&mut self.picture_asked) {
            return false;
        }
        self.app.notice = Some(self.save_screen(screen));
        true
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

impl LiveScreen<'_> {
    /// `screen` as `svg_dir/vramtop.svg` (or `vramtop-2.svg` and on; `vramtop-run` under
    /// `vramtop run`); the outcome as a one-line notice.
    fn save_screen(&self, screen: &Buffer) -> String {
        let (stem, title) = match &self.app.run {
            Some(run) => ("vramtop-run", format!("vramtop run: job {}", run.pid)),
            None => ("vramtop", "vramtop".to_string()),
        };
        // The live view draws in the terminal's own colours; the picture takes the dark
        // palette's for them.
        let colors = Palette::default().default_colors();
        match svg::save(screen, &self.svg_dir, stem, colors, &title) {
            Ok(path) => format!("picture saved to {}", path.display()),
            Err(e) => format!("picture not saved: {e}"),
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
