//! Process actions: SIGTERM or SIGKILL to a process of the table, after the user has
//! confirmed it by pid and command. The one place the live view acts on the system; the
//! sender is a trait so tests can make the kernel refuse (EPERM) without another user.

use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Ask the process to end (it may clean up, or ignore it).
    Term,
    /// End it now; it cannot refuse.
    Kill,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Kill => "SIGKILL",
        }
    }

    fn number(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
        }
    }
}

/// What the confirmation shows and what is sent once confirmed. `start_ticks` (from
/// /proc/PID/stat when asked) tells the same process from a later one given its pid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillRequest {
    pub pid: u32,
    pub command: String,
    pub signal: Signal,
    pub start_ticks: Option<u64>,
}

/// Why a signal was not sent, each one line for the status bar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KillError {
    /// pid 0 or 1, or vramtop itself.
    Protected(u32),
    /// Listed by the driver but not in our PID namespace: its pid means nothing here.
    OtherNamespace(u32),
    /// It exited, or its pid now belongs to another process.
    Gone(u32),
    /// EPERM: another user's process.
    NotPermitted(u32),
    Other(u32, String),
}

impl std::fmt::Display for KillError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KillError::Protected(pid) => write!(f, "refused: pid {pid} is init or vramtop itself"),
            KillError::OtherNamespace(pid) => write!(
                f,
                "refused: pid {pid} is in another PID namespace (a container): signal it from there"
            ),
            KillError::Gone(pid) => write!(f, "not sent: pid {pid} has exited"),
            KillError::NotPermitted(pid) => write!(
                f,
                "not permitted to signal pid {pid} (EPERM): it belongs to another user; run vramtop as that user or root"
            ),
            KillError::Other(pid, why) => write!(f, "could not signal pid {pid}: {why}"),
        }
    }
}

/// Sends a signal to a pid; the real one calls kill(2).
pub trait SignalSender {
    fn send(&mut self, pid: u32, signal: Signal) -> Result<(), std::io::Error>;
    /// The process's start time (ticks after boot), to check it is still the same one.
    fn start_ticks(&self, pid: u32) -> Option<u64>;
}

/// kill(2) and /proc.
pub struct KernelSignals {
    proc_root: PathBuf,
}

impl Default for KernelSignals {
    fn default() -> Self {
        KernelSignals {
            proc_root: PathBuf::from("/proc"),
        }
    }
}

impl SignalSender for KernelSignals {
    fn send(&mut self, pid: u32, signal: Signal) -> Result<(), std::io::Error> {
        let pid = libc::pid_t::try_from(pid)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        let rc = unsafe { libc::kill(pid, signal.number()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn start_ticks(&self, pid: u32) -> Option<u64> {
        let stat =
            std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("stat")).ok()?;
        vramtop_telemetry::procfs::parse_stat_start(&stat)
    }
}

/// Check the request against what can be signalled, then send it.
pub fn send(sender: &mut dyn SignalSender, request: &KillRequest) -> Result<(), KillError> {
    let pid = request.pid;
    if pid <= 1 || pid == std::process::id() {
        return Err(KillError::Protected(pid));
    }
    let now = sender.start_ticks(pid);
    match (request.start_ticks, now) {
        (_, None) => return Err(KillError::Gone(pid)),
        (Some(then), Some(now)) if then != now => return Err(KillError::Gone(pid)),
        _ => {}
    }
    sender
        .send(pid, request.signal)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => KillError::NotPermitted(pid),
            Some(libc::ESRCH) => KillError::Gone(pid),
            _ => KillError::Other(pid, e.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Refusing;

    impl SignalSender for Refusing {
        fn send(&mut self, _: u32, _: Signal) -> Result<(), std::io::Error> {
            Err(std::io::Error::from_raw_os_error(libc::EPERM))
        }
        fn start_ticks(&self, _: u32) -> Option<u64> {
            Some(7)
        }
    }

    fn request(pid: u32, start: Option<u64>) -> KillRequest {
        KillRequest {
            pid,
            command: "python train.py".into(),
            signal: Signal::Term,
            start_ticks: start,
        }
    }

    #[test]
    fn init_and_ourselves_are_never_signalled() {
        let mut s = Refusing;
        assert_eq!(
            send(&mut s, &request(1, None)),
            Err(KillError::Protected(1))
        );
        let me = std::process::id();
        assert_eq!(
            send(&mut s, &request(me, None)),
            Err(KillError::Protected(me))
        );
    }

    #[test]
    fn eperm_reads_as_not_permitted_in_one_line() {
        let err = send(&mut Refusing, &request(4242, Some(7))).unwrap_err();
        assert_eq!(err, KillError::NotPermitted(4242));
        let text = err.to_string();
        assert!(text.contains("EPERM") && text.contains("4242") && !text.contains('\n'));
    }

    #[test]
    fn a_reused_pid_is_not_signalled() {
        assert_eq!(
            send(&mut Refusing, &request(4242, Some(6))),
            Err(KillError::Gone(4242))
        );
    }

    #[test]
    fn a_missing_process_is_gone() {
        let mut kernel = KernelSignals::default();
        let pid = u32::MAX / 2;
        assert_eq!(
            send(&mut kernel, &request(pid, None)),
            Err(KillError::Gone(pid))
        );
    }
}
