//! `vramtop run`: starting a command with the hook injected. The hook enters through
//! `PYTHONPATH` (its directory first, before whatever the user had) and the environment
//! passes to the command's children, so every rank of a launcher is hooked too.

use super::error::AttachError;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use tokio::sync::watch;

use super::discovery::SOCKET_DIR_ENV;

/// `PYTHONPATH` with `hook_dir` first.
pub fn python_path(hook_dir: &Path, existing: Option<&OsStr>) -> OsString {
    let mut path = hook_dir.as_os_str().to_os_string();
    if let Some(rest) = existing.filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(rest);
    }
    path
}

/// Where the command's output goes.
pub enum Output {
    /// Straight through (stdout is not a terminal): vramtop adds nothing.
    Inherit,
    /// To a log file, so it cannot tear the live view; stdin is closed.
    Log(File),
}

/// Starts `command` with the hook's environment, keeping its OOMs as `oom` says.
pub fn spawn(
    command: &[OsString],
    hook_dir: &Path,
    socket_dir: &Path,
    history: bool,
    oom: &crate::oom_files::OomKeeping,
    output: Output,
) -> Result<Child, AttachError> {
    let Some((program, args)) = command.split_first() else {
        return Err(AttachError::NoCommand);
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env(
            "PYTHONPATH",
            python_path(hook_dir, std::env::var_os("PYTHONPATH").as_deref()),
        )
        .env(SOCKET_DIR_ENV, socket_dir);
    if history {
        cmd.env("VRAMTOP_HISTORY", "1");
    }
    cmd.envs(oom.env());
    if !oom.quiet {
        // The live view explains OOMs itself: a quiet left in the user's shell must not
        // make the hook leave them to a batch run (nor mark dying processes for one).
        cmd.env_remove(crate::oom_files::QUIET_ENV);
    }
    if let Output::Log(file) = output {
        let err = file.try_clone().map_err(AttachError::Log)?;
        // A process group of its own: Ctrl-C in the live view reaches the whole job (a
        // shell's children, a launcher's ranks) as it would from a shell, and nothing
        // vramtop's own group receives touches it.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .process_group(0);
    }
    cmd.spawn().map_err(|source| AttachError::Start {
        program: program.to_string_lossy().into_owned(),
        source,
    })
}

/// The exit code a shell would give: the code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => 1,
    }
}

/// The child that forwarded signals go to (0: none).
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(signal: libc::c_int) {
    let pid = FORWARD_TO.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; the pid is our own child's.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// While vramtop waits for a command in passthrough mode: Ctrl-C and Ctrl-\ reach the
/// command from the terminal already, so vramtop must only outlive them to pass its
/// exit code on; SIGTERM and SIGHUP sent to vramtop alone are passed to the command.
/// Handlers (not SIG_IGN) are used because exec resets them, so the command starts with
/// default dispositions.
pub fn forward_signals_to(child: &Child) {
    FORWARD_TO.store(child.id() as i32, Ordering::Relaxed);
    let handler = forward_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for signal in [libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: installing a handler that only reads an atomic and calls kill for
        // signals the child has already had (a second one is harmless to a shell job).
        unsafe {
            libc::signal(
                signal,
                noop as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
    for signal in [libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: as above; forward_signal is async-signal-safe.
        unsafe {
            libc::signal(signal, handler);
        }
    }
}

extern "C" fn noop(_signal: libc::c_int) {}

/// Bytes read from the end of the log for the pane.
const TAIL_BYTES: u64 = 16 * 1024;
/// Lines kept for the pane.
const TAIL_LINES: usize = 200;
/// How often the log and the child are looked at.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// What the screen shows of a started command.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommandOutput {
    /// The log's last lines, with control characters and escape sequences removed.
    pub lines: Vec<String>,
    /// Set once the command has exited: its code as a shell gives it.
    pub exit_code: Option<u8>,
}

/// A started command, watched on a thread of its own: its exit and its log's tail.
/// Dropping it stops watching and leaves the command running.
pub struct RunningCommand {
    pub pid: u32,
    pub log_path: PathBuf,
    pub output: watch::Receiver<Arc<CommandOutput>>,
    _stop: mpsc::Sender<()>,
}

impl RunningCommand {
    pub fn watch(mut child: Child, log_path: PathBuf) -> io::Result<Self> {
        let pid = child.id();
        let (tx, rx) = watch::channel(Arc::new(CommandOutput::default()));
        let (stop, stopped) = mpsc::channel::<()>();
        let path = log_path.clone();
        thread::Builder::new()
            .name("vramtop-command".into())
            .spawn(move || {
                let mut seen_len = None;
                let mut output = CommandOutput::default();
                loop {
                    let exit = child.try_wait().ok().flatten().map(exit_code);
                    let len = std::fs::metadata(&path).map(|m| m.len()).ok();
                    if len != seen_len || exit != output.exit_code {
                        seen_len = len;
                        output.lines = tail_lines(&path);
                        output.exit_code = exit;
                        tx.send_replace(Arc::new(output.clone()));
                    }
                    if exit.is_some() {
                        return;
                    }
                    match stopped.recv_timeout(WATCH_EVERY) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
            })?;
        Ok(RunningCommand {
            pid,
            log_path,
            output: rx,
            _stop: stop,
        })
    }

    /// Sends `signal` to the command's process group (Ctrl-C in the live view interrupts
    /// the job), or to the command alone when the group is gone.
    pub fn signal(&self, signal: libc::c_int) {
        if let Ok(pid) = libc::pid_t::try_from(self.pid) {
            // SAFETY: kill with our own child's pid and group (the child leads its group);
            // a failure (already gone) is harmless.
            unsafe {
                if libc::kill(-pid, signal) != 0 {
                    libc::kill(pid, signal);
                }
            }
        }
    }
}

/// The last lines of a log, made safe to draw: text after the last carriage return of a
/// line (progress bars), no escape sequences, no control characters.
pub fn tail_lines(path: &Path) -> Vec<String> {
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(TAIL_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<String> = text.lines().map(clean_line).collect();
    if start > 0 && !lines.is_empty() {
        // The first line was cut by the window.
        lines.remove(0);
    }
    let first = lines.len().saturating_sub(TAIL_LINES);
    lines.split_off(first)
}

fn clean_line(line: &str) -> String {
    let visible = line.rsplit('\r').next().unwrap_or("");
    let mut out = String::with_capacity(visible.len());
    let mut chars = visible.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ parameters final-byte; other escapes: ESC and one char.
                if chars.next_if_eq(&'[').is_some() {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\t' => out.push_str("    "),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_goes_first_on_pythonpath() {
        let hook = Path::new("/run/user/1/vramtop/hook-x");
        assert_eq!(
            python_path(hook, None),
            OsString::from("/run/user/1/vramtop/hook-x")
        );
        assert_eq!(
            python_path(hook, Some(OsStr::new("/src:/lib"))),
            OsString::from("/run/user/1/vramtop/hook-x:/src:/lib")
        );
    }

    #[test]
    fn log_lines_are_safe_to_draw() {
        assert_eq!(
            clean_line("epoch 1\r\x1b[2K\x1b[32mepoch 2\x1b[0m\tok\x07"),
            "epoch 2    ok"
        );
    }

    #[test]
    fn signals_become_128_plus_n() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
