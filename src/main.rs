//! The vramtop binary: parse the command line, pick a mode, and make sure the terminal
//! is restored before any error or panic report prints.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use color_eyre::eyre::{eyre, Result, WrapErr};

use vramtop::alloc::PolicyKind;
use vramtop::app::replayer::{self, ReplayArgs};
use vramtop::app::runtime::{self, Sources};
use vramtop::app::viewer;
use vramtop::app::App;
use vramtop::attach::Attacher;
use vramtop::cli::{self, BenchCommand, Cli, Command};
use vramtop::config::{ConfigFile, Saver};
use vramtop::probe::live::LiveProbe;
use vramtop::probe::record::Recorder;
use vramtop::probe::tour::Tour;
use vramtop::probe::{setup, Scenario};
use vramtop::telemetry::auth::BearerToken;
use vramtop::telemetry::nvml::NvmlOptions;
use vramtop::telemetry::open::{open, open_with};
use vramtop::telemetry::poller::Poller;
use vramtop::telemetry::sim::WorkloadGauge;
use vramtop::telemetry::timing::Laps;

fn main() -> ExitCode {
    let mut cli = match cli::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err((0, text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err((code, text)) => {
            eprint!("vramtop: {}", text.trim_start_matches("error: "));
            return ExitCode::from(code as u8);
        }
    };
    // Installs the panic and error hooks first, so that ratatui's own hook (installed
    // by ratatui::init) restores the terminal before color-eyre prints anything.
    if let Err(e) = color_eyre::install() {
        eprintln!("vramtop: could not install the error reporter: {e}");
    }
    // Flags and environment first, then the settings file; a bad file is one line and
    // the defaults, never a refusal to start.
    let config = vramtop::config::apply(&mut cli);
    if let Some(notice) = &config.notice {
        eprintln!("vramtop: {notice}");
    }
    match run(cli, config) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vramtop: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli, config: ConfigFile) -> Result<ExitCode> {
    match cli.command {
        None => live(cli.live, config),
        Some(Command::Completions { shell }) => {
            std::io::stdout().write_all(&vramtop::docs::completions(shell))?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man { dir: None }) => {
            std::io::stdout().write_all(&vramtop::docs::man_page()?)?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man { dir: Some(dir) }) => match vramtop::docs::write_man_pages(&dir) {
            Ok(files) => {
                println!("wrote {} into {}", files.join(", "), dir.display());
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => usage_error(format!("man --dir {}: {e}", dir.display())),
        },
        Some(Command::Bench {
            what:
                BenchCommand::Render {
                    width,
                    height,
                    frames,
                    blocks,
                    json,
                },
        }) => {
            let figures = vramtop::bench::render(width, height, frames, blocks)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&figures)?);
            } else {
                println!(
                    "render {}x{} with {} live blocks: {} frames, median {:.1} us, p90 {:.1} us, max {:.1} us",
                    figures.width,
                    figures.height,
                    figures.live_blocks,
                    figures.frames,
                    figures.median_us,
                    figures.p90_us,
                    figures.max_us
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Bench {
            what: BenchCommand::Replay { file, policy, json },
        }) => match vramtop::bench::replay(&file, &policy.0) {
            Ok(figures) => {
                if json {
                    println!("{}", serde_json::to_string_pretty(&figures)?);
                } else {
                    print!("{}", figures.table());
                }
                Ok(ExitCode::SUCCESS)
            }
            Err(line) => {
                eprintln!("vramtop: {line}");
                Ok(ExitCode::from(2))
            }
        },
        Some(Command::Bench {
            what: BenchCommand::Alloc { json, pairs },
        }) => {
            let rows =
                vramtop::alloc::bench::run(&PolicyKind::ALL, &[1_000, 10_000, 100_000], pairs, 1);
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", vramtop::alloc::bench::table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::GpuSelfCheck) => match vramtop::backing::cuda::self_check(0) {
            Ok(report) => {
                println!("{report}");
                Ok(ExitCode::SUCCESS)
            }
            Err(report) => {
                println!("{report}");
                Ok(ExitCode::from(1))
            }
        },
        Some(Command::Probe {
            scenario,
            seconds,
            json,
            hold,
            seed,
            opts,
        }) => probe_headless(&scenario, seconds, json, seed, &opts, hold),
        Some(Command::Replay {
            file,
            policy,
            capacity,
            report,
            json,
            leaks,
        }) => {
            let args = ReplayArgs {
                policies: policy.0,
                capacity,
                report,
                json,
                leaks,
            };
            Ok(ExitCode::from(replayer::replay_command(&file, &args)?))
        }
        Some(Command::Snapshot { file, once }) => {
            Ok(ExitCode::from(viewer::snapshot_command(&file, once)?))
        }
        Some(Command::Serve(args)) => vramtop::export::serve::run(args),
        Some(Command::Demo { name, opts }) => vramtop::demo::run(name.as_deref(), &opts),
        Some(Command::Run {
            history,
            log,
            command,
        }) => run_command(cli.live, &command, history, log),
        Some(Command::HookPath) => {
            match vramtop::attach::hook_files::write_hook_files(&socket_dir()) {
                Ok(dir) => {
                    println!("{}", dir.display());
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => Ok(ExitCode::from(error_line(e))),
            }
        }
        Some(Command::Attach {
            pid,
            seconds,
            interval,
            json,
            until_ended,
        }) => {
            let args = vramtop::attach::headless::AttachArgs {
                dir: socket_dir(),
                pid,
                seconds,
                interval_s: interval,
                json,
                until_ended,
            };
            Ok(ExitCode::from(vramtop::attach::headless::run(&args)?))
        }
    }
}

/// One line for a failure vramtop cannot fix itself (exit 1).
fn error_line(msg: impl std::fmt::Display) -> u8 {
    eprintln!("vramtop: {msg}");
    1
}

/// One line for a user mistake, exit 2; the caller prints it.
/// The app's tokio runtime: two workers are plenty for a monitor.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .wrap_err("could not start the async runtime")
}

fn usage_error(msg: impl std::fmt::Display) -> Result<ExitCode> {
    eprintln!("vramtop: {msg}");
    Ok(ExitCode::from(2))
}

fn probe_headless(
    name: &str,
    seconds: f64,
    json: bool,
    seed: u64,
    opts: &cli::ProbeOptions,
    hold_s: f64,
) -> Result<ExitCode> {
    let scenario = match Scenario::load(name) {
        Ok(s) => s,
        Err(e) => return usage_error(e),
    };
    let mut set = match setup::build_on_gpu(
        &scenario,
        &[opts.policy],
        opts.backing,
        opts.probe_limit,
        opts.gpu,
        seed,
    ) {
        Ok(s) => s,
        Err(e) => return usage_error(e),
    };
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(seconds);
    let Some(probe) = set.probes.first_mut() else {
        return usage_error("no probe was built");
    };
    probe.run(Some(deadline));
    let report = probe.report();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", vramtop::probe::runner::summary(&report));
    }
    if hold_s > 0.0 {
        // The report is out before the hold, so a script can read it while we still
        // hold the memory it describes.
        std::io::stdout().flush()?;
        std::thread::sleep(Duration::from_secs_f64(hold_s));
    }
    // A verification mismatch is a correctness failure: say so in the exit code too.
    Ok(if report.verify_mismatches > 0 {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// `--once` (or stdout not a terminal): one poll, printed. The slow fields (PCIe
/// throughput, per-process utilisation) are left out unless `--all-fields` asks, so that a
/// one-shot run costs no more than `nvidia-smi`; `--timings` says where the time went.
fn one_shot(args: &cli::LiveArgs, workload: WorkloadGauge) -> Result<ExitCode> {
    let mut laps = Laps::new(args.timings);
    // Only `--remote` needs the async runtime here: NVML and the simulated device do not.
    let rt = if args.remote.is_empty() {
        None
    } else {
        Some(runtime()?)
    };
    let opened = match &rt {
        None => {
            let options = NvmlOptions {
                slow_fields: args.all_fields,
                timings: args.timings,
                ..NvmlOptions::default()
            };
            open_with(args.device, args.seed, workload, options)?
        }
        Some(rt) => {
            let token = match args.token_file.as_deref().map(BearerToken::from_file) {
                None => None,
                Some(Ok(token)) => Some(token),
                Some(Err(e)) => return usage_error(e),
            };
            let interval = Duration::from_secs_f64(args.interval);
            vramtop::telemetry::remote::open(rt.handle(), &args.remote, interval, token, true)?
        }
    };
    laps.lap(|| "open the source".to_string());
    if let Some(notice) = &opened.notice {
        eprintln!("vramtop: {notice}");
    }
    let mut source = opened.source;
    let open_spans = source.take_spans();
    laps.restart();
    let snapshot = source.poll();
    laps.lap(|| "poll".to_string());
    let poll_spans = source.take_spans();
    // Hooked jobs answer within a few intervals of 0.1 s; a wedged one is dropped after
    // 2 s without a hello. With no job socket there, this returns at once.
    let attached = vramtop::attach::collect_once(socket_dir(), ONCE_ATTACH_WAIT)?;
    laps.lap(|| "hooked jobs".to_string());
    let text = if args.json {
        vramtop::export::once::json_with_attached(&snapshot, &attached)
    } else {
        vramtop::export::once::table(&snapshot) + &vramtop::export::once::attached_table(&attached)
    };
    println!("{text}");
    laps.lap(|| "format and print".to_string());
    if laps.enabled() {
        let spans = nest_spans(laps.take(), open_spans, poll_spans);
        eprint!("{}", vramtop::telemetry::timing::report(&spans));
    }
    // Scripts watching remote hosts need to see when none answered.
    let all_down = !args.remote.is_empty()
        && snapshot
            .devices
            .iter()
            .all(|d| matches!(d.health, vramtop::telemetry::DeviceHealth::Lost(_)));
    Ok(if all_down {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The one-shot run's own spans (open, poll, output) with the source's spans of opening and
/// of polling indented under the first two, and the total of the outer ones last.
fn nest_spans(
    outer: Vec<(String, Duration)>,
    open_spans: Vec<(String, Duration)>,
    poll_spans: Vec<(String, Duration)>,
) -> Vec<(String, Duration)> {
    let indent = |inner: Vec<(String, Duration)>| {
        inner
            .into_iter()
            .map(|(name, took)| (format!("  {name}"), took))
    };
    let total: Duration = outer.iter().map(|s| s.1).sum();
    let mut outer = outer.into_iter();
    let mut spans = Vec::new();
    spans.extend(outer.next());
    spans.extend(indent(open_spans));
    spans.extend(outer.next());
    spans.extend(indent(poll_spans));
    spans.extend(outer);
    spans.push(("total after argument parsing".to_string(), total));
    spans
}

fn live(args: cli::LiveArgs, config: ConfigFile) -> Result<ExitCode> {
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
        return one_shot(&args, workload);
    }
    let rt = runtime()?;
    let opened = if args.remote.is_empty() {
        open(args.device, args.seed, workload.clone())?
    } else {
        let token = match args.token_file.as_deref().map(BearerToken::from_file) {
            None => None,
            Some(Ok(token)) => Some(token),
            Some(Err(e)) => return usage_error(e),
        };
        let interval = Duration::from_secs_f64(args.interval);
        vramtop::telemetry::remote::open(rt.handle(), &args.remote, interval, token, false)?
    };

    let mut probe_notice = None;
    let probe_set = match &args.probe {
        None => None,
        Some(name) => {
            let scenario = match Scenario::load(name) {
                Ok(s) => s,
                Err(e) => return usage_error(e),
            };
            let policies = if args.compare.is_empty() {
                vec![args.probe_opts.policy]
            } else {
                args.compare.clone()
            };
            let o = &args.probe_opts;
            match setup::build_on_gpu(
                &scenario,
                &policies,
                o.backing,
                o.probe_limit,
                o.gpu,
                args.seed,
            ) {
                Ok(set) => Some(set),
                // A bad limit is the user's to fix; a GPU that cannot run probes is not:
                // keep monitoring and say why there is no probe.
                Err(e) if e.starts_with("probes disabled") => {
                    probe_notice = Some(e);
                    None
                }
                Err(e) => return usage_error(e),
            }
        }
    };
    // With no GPU the first screen would be empty charts: the simulated device plays the
    // built-in scenarios instead, on bookkeeping memory. A real GPU never gets a probe
    // that was not asked for.
    let tour = if opened.simulated
        && probe_set.is_none()
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
    app.settings = Some(Saver::new(config, &args));
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
    let attacher = Attacher::spawn(socket_dir(), Duration::from_secs_f64(args.interval))?;
    let mut terminal = ratatui::try_init().wrap_err("cannot take over the terminal")?;
    let result = rt.block_on(async {
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
        };
        runtime::run(&mut terminal, &mut app, sources).await
    });
    ratatui::restore();
    let exit = result?;
    Ok(ExitCode::from(exit.code()))
}

/// How long `--once` waits for hooked jobs to answer.
const ONCE_ATTACH_WAIT: Duration = Duration::from_secs(3);

fn socket_dir() -> std::path::PathBuf {
    vramtop::attach::discovery::socket_dir()
}

/// `vramtop run [--history] -- COMMAND...`: the command with the hook injected, in the
/// live view; or, when stdout is not a terminal, straight through with its exit code.
fn run_command(
    args: cli::LiveArgs,
    command: &[std::ffi::OsString],
    history: bool,
    log: Option<std::path::PathBuf>,
) -> Result<ExitCode> {
    use vramtop::attach::launch::{self, Output, RunningCommand};
    if command.is_empty() {
        return usage_error("vramtop run needs a command: vramtop run -- python train.py");
    }
    let dir = socket_dir();
    let hook_dir = match vramtop::attach::hook_files::write_hook_files(&dir) {
        Ok(d) => d,
        Err(e) => return Ok(ExitCode::from(error_line(e))),
    };
    if !std::io::stdout().is_terminal() {
        // Passthrough: the job's output and exit code, nothing of vramtop's own.
        let mut child = match launch::spawn(command, &hook_dir, &dir, history, Output::Inherit) {
            Ok(c) => c,
            Err(e) => return Ok(ExitCode::from(error_line(e))),
        };
        launch::forward_signals_to(&child);
        let status = child.wait().wrap_err("waiting for the command")?;
        return Ok(ExitCode::from(launch::exit_code(status)));
    }
    let log_path = log.unwrap_or_else(|| dir.join(format!("run-{}.log", std::process::id())));
    let log_file = match std::fs::File::create(&log_path) {
        Ok(f) => f,
        Err(e) => return usage_error(format!("--log {}: {e}", log_path.display())),
    };
    // Telemetry is opened before the job starts, so a bad --device costs no job.
    let opened = open(args.device, args.seed, WorkloadGauge::default())?;
    let child = match launch::spawn(command, &hook_dir, &dir, history, Output::Log(log_file)) {
        Ok(c) => c,
        Err(e) => return Ok(ExitCode::from(error_line(e))),
    };
    let pid = child.id();
    let running =
        RunningCommand::watch(child, log_path.clone()).wrap_err("could not watch the command")?;
    let interval = Duration::from_secs_f64(args.interval);
    let attacher = Attacher::spawn(dir, interval)?;
    let poller = Poller::spawn(opened.source, interval)?;
    let mut app = App::new(args.interval);
    app.notice = opened.notice.clone();
    app.run = Some(vramtop::app::RunView::new(pid, log_path.clone()));
    app.focus_pid = Some(pid);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .wrap_err("could not start the async runtime")?;
    let mut terminal = ratatui::try_init().wrap_err("cannot take over the terminal")?;
    let result = rt.block_on(async {
        let sources = Sources {
            poller,
            probe: None,
            attacher: Some(attacher),
            command: Some(running),
        };
        runtime::run(&mut terminal, &mut app, sources).await
    });
    ratatui::restore();
    let exit = result?;
    if app.run.as_ref().is_some_and(|r| r.running()) {
        eprintln!(
            "vramtop: job {pid} is still running; its output goes to {}",
            log_path.display()
        );
    }
    Ok(ExitCode::from(exit.code()))
}
