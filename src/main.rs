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
use vramtop::telemetry::open::open;
use vramtop::telemetry::sim::WorkloadGauge;

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
    let opened = if args.remote.is_empty() {
        open(args.device, args.seed, workload.clone())?
    } else {
        let interval = Duration::from_secs_f64(args.interval);
        vramtop::telemetry::remote::open(&args.remote, interval, once)?
    };
    if let (true, Some(notice)) = (once, &opened.notice) {
        eprintln!("vramtop: {notice}");
    }
    if once {
        let mut source = opened.source;
        let snapshot = source.poll();
        let text = if args.json {
            vramtop::export::once::json(&snapshot)
        } else {
            vramtop::export::once::table(&snapshot)
        };
        println!("{text}");
        // Scripts watching remote hosts need to see when none answered.
        let all_down = !args.remote.is_empty()
            && snapshot
                .devices
                .iter()
                .all(|d| matches!(d.health, vramtop::telemetry::DeviceHealth::Lost(_)));
        return Ok(if all_down {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        });
    }

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
