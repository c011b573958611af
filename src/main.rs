//! The vramtop binary: parse the command line, pick a mode, and make sure the terminal
//! is restored before any error or panic report prints.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use color_eyre::eyre::{Result, WrapErr};

use vramtop::alloc::PolicyKind;
use vramtop::app::replayer::{self, ReplayArgs};
use vramtop::app::runtime::{self, Poller};
use vramtop::app::viewer;
use vramtop::app::App;
use vramtop::cli::{self, BenchCommand, Cli, Command};
use vramtop::probe::live::LiveProbe;
use vramtop::probe::record::Recorder;
use vramtop::probe::{setup, Scenario};
use vramtop::telemetry::nvml::NvmlOptions;
use vramtop::telemetry::open::{open, open_with};
use vramtop::telemetry::sim::WorkloadGauge;
use vramtop::telemetry::timing::Laps;

fn main() -> ExitCode {
    let cli = match cli::parse(std::env::args_os()) {
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
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vramtop: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        None => live(cli.live),
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
    }
}

/// One line for a user mistake, exit 2; the caller prints it.
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
    let mut set = match setup::build(
        &scenario,
        &[opts.policy],
        opts.backing,
        opts.probe_limit,
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
        use std::io::Write as _;
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
    let opened = if args.remote.is_empty() {
        let options = NvmlOptions {
            slow_fields: args.all_fields,
            timings: args.timings,
            ..NvmlOptions::default()
        };
        open_with(args.device, args.seed, workload, options)?
    } else {
        let interval = Duration::from_secs_f64(args.interval);
        vramtop::telemetry::remote::open(&args.remote, interval, true)?
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
    let text = if args.json {
        vramtop::export::once::json(&snapshot)
    } else {
        vramtop::export::once::table(&snapshot)
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

fn live(args: cli::LiveArgs) -> Result<ExitCode> {
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
    let opened = if args.remote.is_empty() {
        open(args.device, args.seed, workload.clone())?
    } else {
        let interval = Duration::from_secs_f64(args.interval);
        vramtop::telemetry::remote::open(&args.remote, interval, false)?
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .wrap_err("could not start the async runtime")?;
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
            match setup::build(&scenario, &policies, o.backing, o.probe_limit, args.seed) {
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
    let poller = Poller::spawn(opened.source, Duration::from_secs_f64(args.interval))?;
    let mut app = App::new(args.interval);
    app.notice = probe_notice.or_else(|| opened.notice.clone());
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
    let mut terminal = ratatui::try_init().wrap_err("cannot take over the terminal")?;
    let result = rt.block_on(async {
        let live =
            probe_set.map(|set| LiveProbe::spawn(set.probes, Some(workload), ops_per_s, recorder));
        runtime::run(&mut terminal, &mut app, poller, live).await
    });
    ratatui::restore();
    let exit = result?;
    Ok(ExitCode::from(exit.code()))
}
