//! `vramtop run [--history] -- COMMAND...`: the command with the job hook injected,
//! watched in the live view; passed straight through when stdout is not a terminal.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use color_eyre::eyre::{Result, WrapErr};

use super::live::{self, Sources};
use super::{error_line, in_terminal, runtime, socket_dir, usage_error};
use crate::app::App;
use crate::cli;
use crate::export::oom_report;
use vramtop_attach::oom_files::{self, OomKeeping};
use vramtop_attach::Attacher;
use vramtop_telemetry::open::open;
use vramtop_telemetry::poller::Poller;
use vramtop_telemetry::sim::WorkloadGauge;

/// `vramtop run [--history] -- COMMAND...`: the command with the hook injected, in the
/// live view; or, when stdout is not a terminal, straight through with its exit code and,
/// after it, each OOM it kept explained on stderr (unless `quiet`).
pub fn run(
    args: cli::LiveArgs,
    command: &[std::ffi::OsString],
    history: bool,
    log: Option<std::path::PathBuf>,
    quiet: bool,
) -> Result<ExitCode> {
    use vramtop_attach::launch::{self, Output, RunningCommand};
    if command.is_empty() {
        return usage_error("vramtop run needs a command: vramtop run -- python train.py");
    }
    let dir = socket_dir();
    let hook_dir = match super::hook::write(&dir) {
        Ok(d) => d,
        Err(e) => return Ok(ExitCode::from(error_line(e))),
    };
    if !std::io::stdout().is_terminal() {
        // Passthrough: the job's output and exit code; vramtop speaks after the job, so its
        // lines do not come among the job's, unless a process of the job died of an OOM and
        // the job runs on (wait_telling_the_dying). The hook keeps quiet meanwhile.
        let stdout_file = oom_files::stdout_file();
        let keeping = OomKeeping::for_run(
            oom_files::batch_dir(stdout_file.as_deref()),
            std::process::id(),
            true,
        );
        let spawned = launch::spawn(command, &hook_dir, &dir, history, &keeping, Output::Inherit);
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => return Ok(ExitCode::from(error_line(e))),
        };
        launch::forward_signals_to(&child);
        let waited = wait_telling_the_dying(&mut child, &keeping, quiet);
        keeping.clear_dying();
        let (status, told) = waited?;
        if !quiet {
            explain_kept_ooms(&keeping, |pid| !told.contains(&pid), status.success());
        }
        return Ok(ExitCode::from(launch::exit_code(status)));
    }
    // Pictures are for the live view: a batch job never fails for want of their folder.
    if let Some(line) = super::svg_dir_problem(&args.svg_dir) {
        return usage_error(line);
    }
    let log_path = log.unwrap_or_else(|| dir.join(format!("run-{}.log", std::process::id())));
    let keeping = OomKeeping::for_run(
        oom_files::batch_dir(Some(&log_path)),
        std::process::id(),
        false,
    );
    let log_file = match std::fs::File::create(&log_path) {
        Ok(f) => f,
        Err(e) => return usage_error(format!("--log {}: {e}", log_path.display())),
    };
    // Telemetry is opened before the job starts, so a bad --device costs no job.
    let opened =
        open(args.device, args.seed, WorkloadGauge::default()).wrap_err("--device nvml")?;
    let spawned = launch::spawn(
        command,
        &hook_dir,
        &dir,
        history,
        &keeping,
        Output::Log(log_file),
    );
    let child = match spawned {
        Ok(c) => c,
        Err(e) => return Ok(ExitCode::from(error_line(e))),
    };
    let pid = child.id();
    let running =
        RunningCommand::watch(child, log_path.clone()).wrap_err("could not watch the command")?;
    let interval = Duration::from_secs_f64(args.interval);
    let attacher = Attacher::spawn(dir, interval).wrap_err("could not start the attach thread")?;
    let poller = Poller::spawn(opened.source, interval)?;
    let mut app = App::new(args.interval);
    app.notice = opened.notice.clone();
    app.run = Some(crate::app::RunView::new(pid, log_path.clone()));
    app.focus_pid = Some(pid);
    let rt = runtime()?;
    let sources = Sources {
        poller,
        probe: None,
        attacher: Some(attacher),
        command: Some(running),
        saver: None,
    };
    let exit = in_terminal(|terminal| {
        rt.block_on(live::run_screen(
            terminal,
            &mut app,
            sources,
            args.svg_dir.clone(),
        ))
    })?;
    if app.run.as_ref().is_some_and(|r| r.running()) {
        eprintln!(
            "vramtop: job {pid} is still running; its output goes to {}",
            log_path.display()
        );
    }
    Ok(ExitCode::from(exit.code()))
}

/// How long a batch job may run on after one of its processes began dying of an OOM
/// before `vramtop run` explains that OOM (VRAMTOP_OOM_HANG_S sets it, in seconds).
const DYING_GRACE: Duration = Duration::from_secs(10);

/// Waits for a batch job. A process of it that died of an OOM (the hook's `-dying.json`)
/// while the job runs on past the grace has its OOM explained then: a torchrun job whose
/// rank ran out can wait for good (two H200s, ranks calling `destroy_process_group`
/// at exit: hung until killed, with or without vramtop), and its user would otherwise see
/// nothing until they killed it. Only then may vramtop's lines come among the job's.
/// Returns the job's status and the pids whose OOMs were explained.
fn wait_telling_the_dying(
    child: &mut std::process::Child,
    keeping: &OomKeeping,
    quiet: bool,
) -> Result<(std::process::ExitStatus, Vec<u32>)> {
    let grace = match std::env::var("VRAMTOP_OOM_HANG_S") {
        Err(_) => DYING_GRACE,
        Ok(text) => match text.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s),
            _ => {
                eprintln!(
                    "vramtop: VRAMTOP_OOM_HANG_S={text:?} is not a number of seconds; using {}",
                    DYING_GRACE.as_secs()
                );
                DYING_GRACE
            }
        },
    };
    let mut told = Vec::new();
    let mut tick = 0u64;
    loop {
        tick += 1;
        if let Some(status) = child.try_wait().wrap_err("waiting for the command")? {
            return Ok((status, told));
        }
        std::thread::sleep(Duration::from_millis(200));
        // The folder (often a shared one: the job log's) is read once a second.
        if quiet || tick % 5 != 0 {
            continue;
        }
        let due: Vec<(u32, Duration)> = keeping
            .dying()
            .into_iter()
            .map(|(pid, marked)| (pid, marked.elapsed().unwrap_or_default()))
            .filter(|(pid, waited)| !told.contains(pid) && *waited >= grace)
            .collect();
        if due.is_empty() {
            continue;
        }
        // Only once its files are there (a burst's last may still be being written): a
        // pid told with nothing under it would never be explained. The folder read once.
        let kept: Vec<u32> = keeping
            .files()
            .iter()
            .chain(&keeping.untracked_files())
            .filter_map(|p| keeping.pid_of(p))
            .collect();
        for (pid, waited) in due {
            if !kept.contains(&pid) {
                continue;
            }
            let theirs = |of| of == pid;
            eprintln!(
                "vramtop: pid {pid} died of an OOM {:.0} s ago and the job is still running \
                 (a torchrun job's other ranks can wait on a failed one); its OOM now:",
                waited.as_secs_f64()
            );
            explain_kept_ooms(keeping, theirs, false);
            told.push(pid);
        }
    }
}

/// After a batch job: each OOM its hooks kept (of the pids `which` takes), explained in
/// a few lines on stderr, each starting `vramtop:` so `grep vramtop job.log` finds them. A
/// file that cannot be read is one line too; nothing here changes the job's exit code.
/// `ended_well`: the job exited 0, so an OOM no process died of was caught.
fn explain_kept_ooms(keeping: &OomKeeping, which: impl Fn(u32) -> bool, ended_well: bool) {
    let taken = |path: &std::path::PathBuf| keeping.pid_of(path).is_none_or(&which);
    for path in keeping.files().into_iter().filter(taken) {
        let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        let lines = match vramtop_trace::load(&path) {
            Ok(trace) => oom_report::explain(&trace, &path, bytes),
            Err(e) => vec![format!(
                "{}: kept at an OOM, but unreadable: {e}",
                path.display()
            )],
        };
        for line in lines {
            eprintln!("vramtop: {line}");
        }
    }
    // A job under cudaMallocAsync (or a pluggable allocator) leaves no state: its words,
    // and why there is no more, once.
    let mut said_why = false;
    for path in keeping.untracked_files().into_iter().filter(taken) {
        let lines = match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| {
                serde_json::from_str::<vramtop_attach::async_oom::KeptUntracked>(&text)
                    .map_err(|e| e.to_string())
            }) {
            Ok(kept) => kept.explain(keeping.pid_of(&path), ended_well),
            Err(e) => vec![format!(
                "{}: kept at an OOM, but unreadable: {e}",
                path.display()
            )],
        };
        for line in lines {
            if line == vramtop_attach::async_oom::UNTRACKED_WHY {
                if said_why {
                    continue;
                }
                said_why = true;
            }
            eprintln!("vramtop: {line}");
        }
    }
}
