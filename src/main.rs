//! The vramtop binary: parse the command line, pick a mode, and make sure the terminal
//! is restored before any error or panic report prints.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use color_eyre::eyre::{Result, WrapErr};

use vramtop::app::runtime::{self, Poller};
use vramtop::app::App;
use vramtop::cli::{self, BenchCommand, Cli, Command};
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
                    json,
                },
        }) => {
            let figures = vramtop::bench::render(width, height, frames)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&figures)?);
            } else {
                println!(
                    "render {}x{}: {} frames, median {:.1} us, p90 {:.1} us, max {:.1} us",
                    figures.width,
                    figures.height,
                    figures.frames,
                    figures.median_us,
                    figures.p90_us,
                    figures.max_us
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(other) => {
            let name = match other {
                Command::Probe { .. } => "probe",
                Command::Replay { .. } => "replay",
                Command::Snapshot { .. } => "snapshot",
                Command::Demo { .. } => "demo",
                Command::Bench { .. } => "bench alloc",
                Command::Serve => "serve",
            };
            eprintln!("vramtop: '{name}' is not yet available in this version");
            Ok(ExitCode::from(2))
        }
    }
}

fn live(args: cli::LiveArgs) -> Result<ExitCode> {
    let workload = WorkloadGauge::default();
    let opened = open(args.device, args.seed, workload)?;
    let once = args.once || !std::io::stdout().is_terminal();
    if once {
        let mut source = opened.source;
        let snapshot = source.poll();
        let text = if args.json {
            vramtop::export::once::json(&snapshot)
        } else {
            vramtop::export::once::table(&snapshot)
        };
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .wrap_err("could not start the async runtime")?;
    let poller = Poller::spawn(opened.source, Duration::from_secs_f64(args.interval))?;
    let mut app = App::new(args.interval);
    let mut terminal = ratatui::init();
    let result = rt.block_on(runtime::run(&mut terminal, &mut app, poller));
    ratatui::restore();
    let exit = result?;
    Ok(ExitCode::from(exit.code()))
}
