//! The live view's side of `vramtop run` and attached jobs: the started command's state,
//! rows for hooked jobs, which job the map shows, and quitting while a job runs.

use std::path::PathBuf;
use std::sync::Arc;

use super::{App, Exit, ProcessRow, View};
use vramtop_alloc::Layout;
use vramtop_attach::{AttachedJobs, JobView, RankGroup};
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

/// A rank chosen by its number (keys 0-9) or a step from the shown one (Tab).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankChoice {
    Rank(u32),
    Step(isize),
}

/// The rank that last ran out of memory, which the view went to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankOom {
    pub pid: u32,
    pub rank: u32,
}

impl App {
    /// Marks rows of hooked jobs, and adds a row for each hooked job the telemetry does
    /// not list (another PID namespace, or the simulated device): its memory is then
    /// N/A, since only the driver can say what a process holds.
    /// A launcher (torchrun: hooked, no CUDA, parent of hooked ranks) gets no row: it is
    /// the job's parent, named in the ranks' overview, not a GPU process.
    pub(super) fn add_hooked_rows(&mut self) {
        for row in &mut self.rows {
            let job = self.attached.get(row.process.pid);
            row.hooked = job.is_some();
            row.rank = job.and_then(JobView::rank);
        }
        for job in &self.attached.jobs {
            if self.rows.iter().any(|r| r.process.pid == job.pid)
                || self.attached.is_launcher(job.pid)
            {
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
                    frameworks: None,
                    host_view: if job.ended {
                        HostView::Exited
                    } else {
                        HostView::Visible
                    },
                },
                trend_bytes_per_s: None,
                growing: false,
                hooked: true,
                rank: job.rank(),
            });
        }
    }

    /// Selects the job `vramtop run` started once it shows up with CUDA state, or, when
    /// it is a launcher (torchrun), its lowest rank with CUDA state; then lets the user
    /// move freely. Until then a hooked process without CUDA may hold the cursor, but the
    /// focus stays pending so the first rank with CUDA takes it over.
    pub(super) fn select_focus(&mut self) {
        let Some(focus) = self.focus_pid else {
            return;
        };
        let jobs = Arc::clone(&self.attached);
        let started_by_focus = |pid: u32| {
            let Some(job) = jobs.get(pid) else {
                return false;
            };
            // A child, or a grandchild through a hooked launcher (bash -c "torchrun ...").
            job.ppid() == Some(focus)
                || job
                    .ppid()
                    .and_then(|p| jobs.get(p))
                    .is_some_and(|parent| parent.ppid() == Some(focus))
        };
        let row_of = |pid: u32| {
            self.rows
                .iter()
                .position(|r| r.process.pid == pid && r.hooked)
        };
        let ready = |pid: u32| jobs.get(pid).is_some_and(|j| j.cuda_ready());
        if ready(focus) {
            if let Some(i) = row_of(focus) {
                self.table.select(Some(i));
                self.focus_pid = None;
                self.clamp_segment();
            }
            return;
        }
        let mut children: Vec<&JobView> = jobs
            .jobs
            .iter()
            .filter(|j| started_by_focus(j.pid) && row_of(j.pid).is_some())
            .collect();
        let order = |j: &JobView| {
            (
                !j.cuda_ready(),
                j.local_rank().unwrap_or(u32::MAX),
                j.rank().unwrap_or(u32::MAX),
                j.pid,
            )
        };
        children.sort_by_key(|j| order(j));
        match children.first() {
            Some(child) if child.cuda_ready() => {
                self.table.select(row_of(child.pid));
                // Ranks initialise CUDA at their own pace: until local rank 0 (there is
                // one on every node) has, a later rank holds the cursor and the focus
                // stays pending, so the job opens on its first rank.
                if child.local_rank().is_none_or(|r| r == 0) {
                    self.focus_pid = None;
                }
                self.clamp_segment();
            }
            // Not yet: show what there is (waiting for CUDA), keep the focus pending.
            Some(child) => self.table.select(row_of(child.pid)),
            None => {
                if let Some(i) = row_of(focus) {
                    self.table.select(Some(i));
                }
            }
        }
    }

    /// The ranks of the shown job's launch, when it is a rank among two or more.
    pub fn shown_ranks(&self) -> Option<RankGroup<'_>> {
        let job = self.shown_job()?;
        self.attached
            .rank_group(job.pid)
            .filter(|g| g.ranks.len() >= 2)
    }

    /// Moves the cursor to the rank at `position` among the shown job's ranks (number
    /// keys) or `delta` from the shown one (Tab); false when no ranks are shown.
    pub(super) fn select_rank(&mut self, choice: RankChoice) -> bool {
        let Some(group) = self.shown_ranks() else {
            return false;
        };
        let current = self.shown_job().and_then(|j| group.position(j.pid));
        let n = group.ranks.len() as isize;
        let target = match choice {
            // On a node whose ranks start past 9 (ranks 8-15 of two nodes), the keys
            // name the local ranks.
            RankChoice::Rank(rank) => group
                .ranks
                .iter()
                .find(|j| j.rank() == Some(rank))
                .or_else(|| group.ranks.iter().find(|j| j.local_rank() == Some(rank)))
                .copied(),
            RankChoice::Step(delta) => {
                let from = current.map_or(0, |i| i as isize);
                group
                    .ranks
                    .get((from + delta).rem_euclid(n) as usize)
                    .copied()
            }
        }
        .map(|j| j.pid);
        // The rank key was an answer: even a rank that is not there keeps Tab's meaning.
        if let Some(i) = target.and_then(|pid| self.rows.iter().position(|r| r.process.pid == pid))
        {
            self.table.select(Some(i));
            self.focus_pid = None;
            self.clamp_segment();
        }
        true
    }

    /// Takes the view to a rank of the shown job that has just run out of memory, and
    /// says so. Another job's OOM leaves the view alone (its own overview says it).
    fn follow_rank_ooms(&mut self, before: &AttachedJobs) {
        let new_oom = |job: &JobView| {
            let Some(oom) = &job.oom else { return false };
            // A job first seen now replays its last OOM, however old: not news.
            let Some(seen) = before.get(job.pid).filter(|j| j.hello.is_some()) else {
                return false;
            };
            // A reconnect replays the last OOM as a new message: compare what it says.
            seen.oom.as_ref().is_none_or(|o| o.time_s != oom.time_s)
        };
        // The launch the view shows, when it shows a rank; else any job's ranks.
        let shown_launch = self
            .shown_job()
            .filter(|j| j.rank().is_some())
            .map(|j| j.ppid());
        let failed = self
            .attached
            .jobs
            .iter()
            .filter(|j| shown_launch.is_none_or(|parent| j.ppid() == parent))
            .filter(|j| j.rank().is_some() && new_oom(j))
            .map(|j| (j.pid, j.rank().unwrap_or(0)))
            .min_by_key(|&(_, rank)| rank);
        let Some((pid, rank)) = failed else { return };
        self.rank_oom = Some(RankOom { pid, rank });
        if let Some(i) = self.rows.iter().position(|r| r.process.pid == pid) {
            self.table.select(Some(i));
            self.focus_pid = None;
            self.clamp_segment();
        }
    }

    /// Takes in the attacher's latest jobs.
    pub fn apply_attached(&mut self, jobs: Arc<AttachedJobs>) {
        let before = std::mem::replace(&mut self.attached, jobs);
        self.rebuild_rows();
        self.follow_rank_ooms(&before);
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
