//! The live view's side of `vramtop run` and attached jobs: the started command's state,
//! rows for hooked jobs, which job the map shows, and quitting while a job runs.

use std::path::PathBuf;
use std::sync::Arc;

use super::{App, Exit, ProcessRow, View};
use vramtop_alloc::Layout;
use vramtop_attach::{AttachedJobs, JobView};
use vramtop_telemetry::{HostView, ProcessKind, ProcessSnapshot};

/// The command `vramtop run` started, as the screen shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct RunView {
    pub pid: u32,
    pub log_path: PathBuf,
    /// The last lines of its output, safe to draw.
    pub lines: Vec<String>,
    /// Set once it has exited (128 + N for a signal).
    pub exit_code: Option<u8>,
    /// `q` was pressed while it ran: the footer asks for a second `q`.
    pub quit_asked: bool,
    /// Interrupts sent to it with Ctrl-C (SIGINT, then SIGTERM, then SIGKILL).
    pub interrupts: u32,
}

impl RunView {
    pub fn new(pid: u32, log_path: PathBuf) -> Self {
        RunView {
            pid,
            log_path,
            lines: Vec::new(),
            exit_code: None,
            quit_asked: false,
            interrupts: 0,
        }
    }

    pub fn running(&self) -> bool {
        self.exit_code.is_none()
    }
}

impl App {
    /// Marks rows of hooked jobs, and adds a row for each hooked job the telemetry does
    /// not list (another PID namespace, or the simulated device): its memory is then
    /// N/A, since only the driver can say what a process holds.
    pub(super) fn add_hooked_rows(&mut self) {
        for row in &mut self.rows {
            row.hooked = self.attached.get(row.process.pid).is_some();
        }
        for job in &self.attached.jobs {
            if self.rows.iter().any(|r| r.process.pid == job.pid) {
                continue;
            }
            let device = job
                .frame
                .as_ref()
                .map_or(0, |f| u32::try_from(f.device).unwrap_or(0));
            self.rows.push(ProcessRow {
                device,
                process: ProcessSnapshot {
                    pid: job.pid,
                    kind: ProcessKind::Compute,
                    used_memory_bytes: None,
                    sm_util_pct: None,
                    user: None,
                    command: job.command(),
                    cpu_pct: None,
                    rss_bytes: None,
                    cgroup: None,
                    host_view: if job.ended {
                        HostView::Exited
                    } else {
                        HostView::Visible
                    },
                },
                trend_bytes_per_s: None,
                growing: false,
                hooked: true,
            });
        }
    }

    /// Selects the job `vramtop run` started (or the first hooked child of it) once it
    /// shows up, then lets the user move freely.
    pub(super) fn select_focus(&mut self) {
        let Some(focus) = self.focus_pid else {
            return;
        };
        let child_of_focus = |r: &ProcessRow| {
            r.hooked
                && self
                    .attached
                    .get(r.process.pid)
                    .and_then(|j| j.hello.as_ref())
                    .is_some_and(|h| h.ppid == Some(focus))
        };
        let found = self
            .rows
            .iter()
            .position(|r| r.process.pid == focus && r.hooked)
            .or_else(|| self.rows.iter().position(child_of_focus));
        if let Some(i) = found {
            self.table.select(Some(i));
            self.focus_pid = None;
        }
    }

    /// Takes in the attacher's latest jobs.
    pub fn apply_attached(&mut self, jobs: Arc<AttachedJobs>) {
        self.attached = jobs;
        self.rebuild_rows();
        self.clamp_segment();
    }

    /// Takes in the started command's output and exit.
    pub fn apply_run_output(&mut self, lines: Vec<String>, exit_code: Option<u8>) {
        if let Some(run) = self.run.as_mut() {
            run.lines = lines;
            run.exit_code = exit_code;
            if exit_code.is_some() {
                run.quit_asked = false;
            }
        }
    }

    /// The hooked job of the selected row: its map replaces the probe's.
    pub fn shown_job(&self) -> Option<&JobView> {
        let row = self.table.selected().and_then(|i| self.rows.get(i))?;
        if !row.hooked {
            return None;
        }
        self.attached.get(row.process.pid)
    }

    /// The layout the block map shows: the selected hooked job's, else the probe's first.
    pub fn shown_layout(&self) -> Option<&Layout> {
        match self.shown_job() {
            Some(job) => job.map().map(|m| &m.layout),
            None => self
                .probe
                .as_ref()
                .and_then(|p| p.policies.first())
                .map(|p| &p.layout),
        }
    }

    pub(super) fn clamp_segment(&mut self) {
        let segments = self.shown_layout().map_or(0, |l| l.segments.len());
        self.selected_segment = match self.selected_segment {
            Some(_) if segments == 0 => None,
            Some(i) => Some(i.min(segments - 1)),
            None => None,
        };
        if self.selected_segment.is_none() {
            self.views.remove(View::SegmentList);
        }
    }

    /// `q`: quit, but ask first while a started job still runs; after it ended, quit
    /// with its exit code.
    pub(super) fn quit(&mut self) {
        match self.run.as_mut() {
            Some(run) if run.running() && !run.quit_asked => run.quit_asked = true,
            Some(run) => {
                self.exit = Some(match run.exit_code {
                    Some(code) => Exit::JobEnded(code),
                    None => Exit::Quit,
                })
            }
            None => self.exit = Some(Exit::Quit),
        }
    }
}
