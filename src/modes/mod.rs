//! The commands, one module each: what runs them, their terminal loop (`screen`) and the
//! `Screen` each hands it. The only layer that may import `cli`, `config`, `app` and `ui`
//! together: state (`app`, `demo`) and drawing (`ui`) never import a mode.
//!
//! Shared by every mode here: the one runtime builder, the one terminal take-over, the
//! one probe set-up, and the usage error (exit 2).

pub mod attach;
pub mod bench;
pub mod demo;
pub mod hook;
pub mod live;
pub mod once;
pub mod probe;
pub mod replay;
pub mod run;
pub mod screen;
pub mod serve;
pub mod snapshot;

use std::io::Write;
use std::process::ExitCode;

use color_eyre::eyre::{Result, WrapErr};
use ratatui::DefaultTerminal;

use crate::cli::{self, BenchCommand, Cli, Command};
use crate::config::ConfigFile;
use crate::probe::setup::{self, ProbeSet, SetupError};
use crate::probe::Scenario;
use replay::ReplayArgs;
use vramtop_alloc::PolicyKind;

/// Runs the command `cli` names; the exit code, or an error for `main` to print (exit 1).
pub fn run(cli: Cli, config: ConfigFile) -> Result<ExitCode> {
    match cli.command {
        None => live::run(cli.live, config),
        Some(Command::Completions { shell }) => {
            std::io::stdout().write_all(&crate::docs::completions(shell))?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man { dir: None }) => {
            std::io::stdout().write_all(&crate::docs::man_page()?)?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man { dir: Some(dir) }) => match crate::docs::write_man_pages(&dir) {
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
            let figures = bench::render(width, height, frames, blocks)?;
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
        }) => match bench::replay(&file, &policy.0) {
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
                vramtop_alloc::bench::run(&PolicyKind::ALL, &[1_000, 10_000, 100_000], pairs, 1);
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", vramtop_alloc::bench::table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::GpuSelfCheck) => {
            let check = vramtop_alloc::backing::cuda::self_check(0);
            println!("{}", check.report);
            Ok(if check.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Some(Command::Probe {
            scenario,
            seconds,
            json,
            hold,
            seed,
            opts,
        }) => probe::run(&scenario, seconds, json, seed, &opts, hold),
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
            Ok(ExitCode::from(replay::run(&file, &args)?))
        }
        Some(Command::Snapshot { file, once }) => Ok(ExitCode::from(snapshot::run(&file, once)?)),
        Some(Command::Serve(args)) => serve::run(args),
        Some(Command::Demo { name, opts }) => demo::run(name.as_deref(), &opts),
        Some(Command::Run {
            history,
            log,
            quiet,
            command,
        }) => run::run(cli.live, &command, history, log, quiet),
        Some(Command::HookPath) => match hook::write(&socket_dir()) {
            Ok(dir) => {
                println!("{}", dir.display());
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Ok(ExitCode::from(error_line(e))),
        },
        Some(Command::Attach {
            pid,
            seconds,
            interval,
            json,
            until_ended,
        }) => {
            let args = attach::AttachArgs {
                dir: socket_dir(),
                pid,
                seconds,
                interval_s: interval,
                json,
                until_ended,
            };
            Ok(ExitCode::from(attach::run(&args)?))
        }
    }
}

/// One line for a failure vramtop cannot fix itself (exit 1).
pub(crate) fn error_line(msg: impl std::fmt::Display) -> u8 {
    eprintln!("vramtop: {msg}");
    1
}

/// One line for a user mistake, exit 2.
pub(crate) fn usage_error(msg: impl std::fmt::Display) -> Result<ExitCode> {
    eprintln!("vramtop: {msg}");
    Ok(ExitCode::from(2))
}

/// The tokio runtime of the modes with background sources: two workers are plenty for a
/// monitor. (A viewer with no sources runs on `screen::run_blocking`'s own.)
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .wrap_err("could not start the async runtime")
}

/// Takes over the terminal for `f` and gives it back whatever `f` returns, before any
/// error is reported (a panic is restored by ratatui's own hook).
pub(crate) fn in_terminal<T>(f: impl FnOnce(&mut DefaultTerminal) -> Result<T>) -> Result<T> {
    let mut terminal = ratatui::try_init().wrap_err("cannot take over the terminal")?;
    let result = f(&mut terminal);
    ratatui::restore();
    result
}

/// Where hooked jobs put their sockets and `vramtop run` its logs.
pub(crate) fn socket_dir() -> std::path::PathBuf {
    vramtop_attach::discovery::socket_dir()
}

/// What `--probe NAME` gave: the probes, or why the GPU runs none (the live view and
/// `serve` go on without them and say so).
pub(crate) enum Probes {
    Built(ProbeSet),
    Disabled(String),
}

/// The probes of `--probe NAME` under `policies`; `Err` is the one line of a mistake of the
/// user's (an unknown scenario, a limit that cannot be met), for exit 2.
pub(crate) fn build_probes(
    name: &str,
    policies: &[PolicyKind],
    opts: &cli::ProbeOptions,
    seed: u64,
) -> std::result::Result<Probes, String> {
    let scenario = Scenario::load(name)?;
    match setup::build_on_gpu(
        &scenario,
        policies,
        opts.backing,
        opts.probe_limit,
        opts.gpu,
        seed,
    ) {
        Ok(set) => Ok(Probes::Built(set)),
        Err(e @ SetupError::Disabled(_)) => Ok(Probes::Disabled(e.to_string())),
        Err(e @ SetupError::Refused(_)) => Err(e.to_string()),
    }
}

/// Why pictures could not be saved into `dir` (`--svg-dir`), found before the screen
/// is taken over; `None` when it is a folder.
fn svg_dir_problem(dir: &std::path::Path) -> Option<String> {
    (!dir.is_dir()).then(|| {
        format!(
            "--svg-dir {}: not a folder; create it or name another",
            dir.display()
        )
    })
}
