//! The app's state and how it changes: snapshots come in, actions come in, and the
//! state is what `ui::draw` reads. No drawing and no I/O here.

pub mod action;
pub mod history;
pub mod jobs;
pub mod process_actions;
pub mod process_history;
pub mod process_table;
pub mod replayer;
pub mod signal;
pub mod viewer;
pub mod views;

use std::sync::Arc;

use ratatui::widgets::TableState;

use crate::probe::live::ProbeView;
use action::Action;
pub use history::ChartHistory;
use history::History;
pub use jobs::{RankChoice, RankOom, RunView};
pub use process_table::{ProcessRow, SortKey};
pub use views::{View, ViewStack};
use vramtop_attach::AttachedJobs;
use vramtop_telemetry::trend::{ProcessTrend, ProcessWatch, TrendConfig};
use vramtop_telemetry::{DeviceHealth, SystemSnapshot};

/// Samples kept per device: ten minutes at the default 1 s interval.
pub const HISTORY_SAMPLES: usize = 600;
/// Zoom steps either way from the fitted scale.
const MAX_ZOOM: i32 = 16;

/// How the app ended, which decides the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Quit,
    Interrupted,
    Terminated,
    /// Quit after the job `vramtop run` started had ended: its exit code is ours.
    JobEnded(u8),
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Quit | Exit::Terminated => 0,
            Exit::Interrupted => 130,
            Exit::JobEnded(code) => code,
        }
    }
}

pub struct App {
    /// The snapshot on screen.
    pub snapshot: Option<SystemSnapshot>,
    /// A newer snapshot held back while the display is frozen.
    pub held_back: Option<SystemSnapshot>,
    pub frozen: bool,
    /// Memory used per device, oldest first, indexed like `snapshot.devices`.
    pub memory_history: Vec<History>,
    /// Per device, for the history charts: (used, driver-reserved) and GPU utilisation,
    /// None where the device could not say.
    pub chart_history: Vec<ChartHistory>,
    /// The process table: processes matching `filter`, sorted.
    pub rows: Vec<ProcessRow>,
    pub sort: SortKey,
    /// Sort against the column's natural direction.
    pub sort_reversed: bool,
    /// Rows are kept when their pid, user, command or group holds this text (any case).
    pub filter: String,
    /// Processes before filtering, for the table's "3 of 12".
    pub process_count: usize,
    /// Memory trend per process, one list per device (in snapshot order), from the last poll.
    pub trends: Vec<Vec<ProcessTrend>>,
    pub table: TableState,
    pub selected_device: usize,
    /// What is open over the main view (help, a segment's block list, the leaks view).
    pub views: ViewStack,
    /// No snapshot arrived for longer than the poll should take: figures are old.
    pub stale: bool,
    pub interval_s: f64,
    pub exit: Option<Exit>,
    /// A one-line notice from start-up, such as why NVML is not in use.
    pub notice: Option<String>,
    /// The background probe's latest published state, when one runs.
    pub probe: Option<std::sync::Arc<ProbeView>>,
    /// Block map zoom: +1 halves the bytes per cell.
    pub map_zoom: i32,
    /// Selected segment of the (first) block map, for its block list.
    pub selected_segment: Option<usize>,
    pub segment_table: TableState,
    /// Per-device process memory trends (NVML), for the leaks view.
    pub process_watch: Vec<ProcessWatch>,
    /// Hooked PyTorch jobs, running or ended.
    pub attached: Arc<AttachedJobs>,
    /// The command `vramtop run` started, when it did.
    pub run: Option<RunView>,
    /// A pid to select once it shows in the table (the job `vramtop run` started).
    pub focus_pid: Option<u32>,
    /// The rank that last ran out of memory: the view went there, the overview says so.
    pub rank_oom: Option<RankOom>,
    /// Every GPU process over time, for its own screen.
    pub process_history: process_history::ProcessHistories,
    /// The process whose own screen is open (`View::Process`).
    pub process_screen: Option<u32>,
    /// Process-table columns to show (the settings file's `columns`); None: all that fit.
    pub columns: Option<Vec<SortKey>>,
    /// A signal asked for and awaiting the user's confirmation.
    pub pending_signal: Option<signal::KillRequest>,
    /// Sends signals: kill(2), or a fake in tests of refusals.
    pub signals: Box<dyn signal::SignalSender + Send>,
    /// What the last process action did, or why it did nothing.
    pub status: Option<process_actions::StatusLine>,
}

impl App {
    pub fn new(interval_s: f64) -> Self {
        App {
            snapshot: None,
            held_back: None,
            frozen: false,
            memory_history: Vec::new(),
            chart_history: Vec::new(),
            rows: Vec::new(),
            sort: SortKey::Memory,
            sort_reversed: false,
            filter: String::new(),
            process_count: 0,
            trends: Vec::new(),
            table: TableState::default(),
            selected_device: 0,
            views: ViewStack::default(),
            stale: false,
            interval_s,
            exit: None,
            notice: None,
            probe: None,
            map_zoom: 0,
            selected_segment: None,
            segment_table: TableState::default(),
            process_watch: Vec::new(),
            attached: Arc::default(),
            run: None,
            focus_pid: None,
            rank_oom: None,
            process_history: Default::default(),
            process_screen: None,
            columns: None,
            pending_signal: None,
            signals: Box::new(signal::KernelSignals::default()),
            status: None,
        }
    }

    /// Take in a new poll. History is recorded even while frozen, so nothing is lost.
    pub fn apply_snapshot(&mut self, snapshot: SystemSnapshot) {
        self.stale = false;
        if self.memory_history.len() != snapshot.devices.len() {
            self.memory_history
                .resize_with(snapshot.devices.len(), || History::new(HISTORY_SAMPLES));
        }
        for (history, device) in self.memory_history.iter_mut().zip(&snapshot.devices) {
            history.push(device.memory_used_bytes.unwrap_or(0));
        }
        if self.chart_history.len() != snapshot.devices.len() {
            self.chart_history
                .resize_with(snapshot.devices.len(), ChartHistory::default);
        }
        for (history, device) in self.chart_history.iter_mut().zip(&snapshot.devices) {
            history.push(device);
        }
        self.process_history.record(&snapshot, &self.attached);
        if self.process_watch.len() != snapshot.devices.len() {
            self.process_watch.resize_with(snapshot.devices.len(), || {
                ProcessWatch::new(TrendConfig::default())
            });
        }
        // PyTorch's own figure for the jobs vramtop is attached to: their leak flag.
        let allocated: Vec<(u32, u64, u64)> = self
            .attached
            .jobs
            .iter()
            .filter(|job| !job.ended)
            .filter_map(|job| {
                let frame = job.frame.as_ref()?;
                Some((job.pid, frame.seq, frame.torch.as_ref()?.allocated_bytes?))
            })
            .collect();
        for (watch, device) in self.process_watch.iter_mut().zip(&snapshot.devices) {
            watch.observe(snapshot.taken_at_ms, device);
            watch.observe_allocated(snapshot.taken_at_ms, &allocated);
        }
        self.trends = self
            .process_watch
            .iter()
            .map(ProcessWatch::trends)
            .collect();
        if self.frozen {
            self.held_back = Some(snapshot);
            return;
        }
        self.show(snapshot);
    }

    fn show(&mut self, snapshot: SystemSnapshot) {
        self.selected_device = self
            .selected_device
            .min(snapshot.devices.len().saturating_sub(1));
        self.snapshot = Some(snapshot);
        self.rebuild_rows();
    }

    /// Mark the figures on screen as old: the poller has not answered in time.
    pub fn mark_stale(&mut self) {
        self.stale = true;
        if let Some(s) = self.snapshot.as_mut() {
            for d in &mut s.devices {
                if d.health == DeviceHealth::Ok {
                    d.health = DeviceHealth::Stale;
                }
            }
        }
    }

    fn rebuild_rows(&mut self) {
        let selected_pid = self
            .table
            .selected()
            .and_then(|i| self.rows.get(i))
            .map(|r| (r.device, r.process.pid));
        self.process_count = self
            .snapshot
            .as_ref()
            .map_or(0, |s| s.devices.iter().map(|d| d.processes.len()).sum());
        self.rows = process_table::gather(self.snapshot.as_ref(), &self.trends, &self.filter);
        self.add_hooked_rows();
        process_table::sort(&mut self.rows, self.sort, self.sort_reversed);
        // Keep the cursor on the same process when the table reorders under it.
        let position = selected_pid.and_then(|key| {
            self.rows
                .iter()
                .position(|r| (r.device, r.process.pid) == key)
        });
        let clamped = self
            .table
            .selected()
            .map(|i| i.min(self.rows.len().saturating_sub(1)));
        self.table.select(if self.rows.is_empty() {
            None
        } else {
            position.or(clamped)
        });
        self.select_focus();
    }

    /// The selected row of the process table, if any.
    pub fn selected_row(&self) -> Option<&ProcessRow> {
        self.table.selected().and_then(|i| self.rows.get(i))
    }

    /// Keep only processes matching `text` (any case; empty shows all).
    pub fn set_filter(&mut self, text: &str) {
        self.filter = text.to_string();
        self.rebuild_rows();
    }

    pub fn device_count(&self) -> usize {
        self.snapshot.as_ref().map_or(0, |s| s.devices.len())
    }

    pub fn handle(&mut self, action: Action) {
        const PAGE: usize = 10;
        // An action's status line stays until the next key that is not an answer to it.
        if !matches!(action, Action::Input(_)) {
            self.status = None;
        }
        // While a segment's block list has the keys, the movement keys move in that list.
        let in_list = self.views.focus() == Some(View::SegmentList);
        let action = match (in_list, action) {
            (true, Action::ScrollUp) => return self.move_in_segment(-1),
            (true, Action::ScrollDown) => return self.move_in_segment(1),
            (true, Action::PageUp) => return self.move_in_segment(-(PAGE as isize)),
            (true, Action::PageDown) => return self.move_in_segment(PAGE as isize),
            (true, Action::Top) => return self.move_in_segment(isize::MIN / 2),
            (true, Action::Bottom) => return self.move_in_segment(isize::MAX / 2),
            (_, action) => action,
        };
        match action {
            Action::Quit => self.quit(),
            Action::Interrupt => {
                self.exit = Some(match self.run.as_ref().and_then(|r| r.exit_code) {
                    Some(code) => Exit::JobEnded(code),
                    None => Exit::Interrupted,
                })
            }
            Action::ToggleHelp => self.views.toggle(View::Help),
            Action::CloseOverlay => match self.run.as_mut().filter(|r| r.quit_asked) {
                Some(run) => run.quit_asked = false,
                None => {
                    self.views.pop();
                }
            },
            Action::ScrollUp => self.move_cursor(-1),
            Action::ScrollDown => self.move_cursor(1),
            Action::PageUp => self.move_cursor(-(PAGE as isize)),
            Action::PageDown => self.move_cursor(PAGE as isize),
            Action::Top => self.move_cursor(isize::MIN / 2),
            Action::Bottom => self.move_cursor(isize::MAX / 2),
            Action::SortByMemory => self.set_sort(SortKey::Memory),
            Action::SortByPid => self.set_sort(SortKey::Pid),
            Action::SortNext => self.set_sort(self.sort.next()),
            Action::SortReverse => {
                self.sort_reversed = !self.sort_reversed;
                self.rebuild_rows();
            }
            // Over a job's ranks, Tab walks the ranks; elsewhere, the devices.
            Action::NextDevice => {
                if !self.select_rank(RankChoice::Step(1)) {
                    self.cycle_device(1)
                }
            }
            Action::PrevDevice => {
                if !self.select_rank(RankChoice::Step(-1)) {
                    self.cycle_device(-1)
                }
            }
            Action::SelectRank(rank) => {
                self.select_rank(RankChoice::Rank(rank));
            }
            Action::ZoomIn => self.map_zoom = (self.map_zoom + 1).min(MAX_ZOOM),
            Action::ZoomOut => self.map_zoom = (self.map_zoom - 1).max(-MAX_ZOOM),
            Action::NextSegment => self.move_segment(1),
            Action::PrevSegment => self.move_segment(-1),
            Action::ToggleSegmentList => {
                // A selected segment opens its block list (it belongs to the block map);
                // otherwise Enter opens the selected process's own screen.
                match self.views.focus() {
                    Some(View::SegmentList) => self.views.remove(View::SegmentList),
                    Some(View::Process) => self.views.remove(View::Process),
                    None if self.selected_segment.is_some() => self.views.push(View::SegmentList),
                    None => {
                        self.process_screen = self.selected_row().map(|r| r.process.pid);
                        if self.process_screen.is_some() {
                            self.views.push(View::Process);
                        }
                    }
                    _ => {}
                }
                self.segment_table = TableState::default().with_selected(Some(0));
            }
            Action::ToggleLeaksView => self.views.toggle(View::Leaks),
            // Forwarded to the probe runner by the event loop.
            Action::ProbePause
            | Action::ProbeStep
            | Action::ProbeFaster
            | Action::ProbeSlower
            | Action::ToggleMark => {}
            // File I/O: done by the event loop, which shows the outcome as the notice.
            Action::SaveSettings | Action::SaveScreen => {}
            Action::Terminate => self.ask_signal(signal::Signal::Term),
            Action::KillProcess => self.ask_signal(signal::Signal::Kill),
            Action::Filter => self.views.push(View::Filter),
            Action::Input(key) => self.handle_input(key),
            Action::ToggleFreeze => {
                self.frozen = !self.frozen;
                if !self.frozen {
                    if let Some(s) = self.held_back.take() {
                        self.show(s);
                    }
                }
            }
        }
    }

    /// Whether keys go to a prompt as typed rather than through the key table.
    pub fn wants_raw_keys(&self) -> bool {
        self.views.focus().is_some_and(View::takes_raw_keys)
    }

    /// Ask to signal the selected process: the confirmation opens, or the refusal shows.
    fn ask_signal(&mut self, signal: signal::Signal) {
        if self.request_signal(signal) {
            self.views.push(View::ConfirmSignal);
        }
    }

    /// A key typed into the prompt that has the focus.
    fn handle_input(&mut self, key: crossterm::event::KeyEvent) {
        match self.views.focus() {
            Some(View::ConfirmSignal) => match process_actions::confirmation_answer(key) {
                Some(true) => {
                    self.views.remove(View::ConfirmSignal);
                    self.confirm_signal();
                }
                Some(false) => {
                    self.views.remove(View::ConfirmSignal);
                    self.cancel_signal();
                }
                None => {}
            },
            Some(View::Filter) if self.filter_key(key) != process_actions::FilterKey::Editing => {
                self.views.remove(View::Filter);
            }
            _ => {}
        }
    }

    /// Take in the probe's latest state, keeping the segment selection in range.
    pub fn apply_probe(&mut self, view: impl Into<std::sync::Arc<ProbeView>>) {
        self.probe = Some(view.into());
        self.clamp_segment();
    }

    fn move_in_segment(&mut self, delta: isize) {
        let rows = self
            .shown_layout()
            .zip(self.selected_segment)
            .and_then(|(layout, i)| layout.segments.get(i))
            .map_or(0, |seg| seg.runs.len());
        if rows == 0 {
            self.segment_table.select(None);
            return;
        }
        let current = self.segment_table.selected().map_or(-1, |i| i as isize);
        let next = current.saturating_add(delta).clamp(0, rows as isize - 1);
        self.segment_table.select(Some(next as usize));
    }

    fn move_segment(&mut self, delta: isize) {
        let segments = self.shown_layout().map_or(0, |l| l.segments.len());
        if segments == 0 {
            self.selected_segment = None;
            return;
        }
        let next = match self.selected_segment {
            None => 0,
            Some(i) => (i as isize + delta).clamp(0, segments as isize - 1) as usize,
        };
        self.selected_segment = Some(next);
    }

    /// Sort by `key` in its natural direction.
    fn set_sort(&mut self, key: SortKey) {
        self.sort = key;
        self.sort_reversed = false;
        self.rebuild_rows();
    }

    fn move_cursor(&mut self, delta: isize) {
        if self.rows.is_empty() {
            self.table.select(None);
            return;
        }
        let last = self.rows.len() as isize - 1;
        let current = self.table.selected().map_or(-1, |i| i as isize);
        let next = current.saturating_add(delta).clamp(0, last);
        self.table.select(Some(next as usize));
        // The user chose: a pending `vramtop run` focus no longer moves the cursor.
        self.focus_pid = None;
        // Another row may show another job's map.
        self.clamp_segment();
    }

    fn cycle_device(&mut self, delta: isize) {
        let n = self.device_count() as isize;
        if n > 0 {
            self.selected_device = (self.selected_device as isize + delta).rem_euclid(n) as usize;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_telemetry::sim::{SimSource, WorkloadGauge};
    use vramtop_telemetry::TelemetrySource;

    fn busy_snapshot() -> SystemSnapshot {
        let w = WorkloadGauge::default();
        w.set(1 << 30);
        SimSource::new(1, w).poll()
    }

    #[test]
    fn freeze_holds_the_screen_but_keeps_history() {
        let mut app = App::new(1.0);
        app.apply_snapshot(busy_snapshot());
        app.handle(Action::ToggleFreeze);
        let mut newer = busy_snapshot();
        newer.taken_at_ms = 42;
        app.apply_snapshot(newer);
        assert_ne!(app.snapshot.as_ref().map(|s| s.taken_at_ms), Some(42));
        assert_eq!(app.memory_history[0].len(), 2);
        app.handle(Action::ToggleFreeze);
        assert_eq!(app.snapshot.as_ref().map(|s| s.taken_at_ms), Some(42));
    }

    #[test]
    fn cursor_stays_in_bounds() {
        let mut app = App::new(1.0);
        app.handle(Action::ScrollDown);
        assert_eq!(app.table.selected(), None);
        app.apply_snapshot(busy_snapshot());
        app.handle(Action::Bottom);
        assert_eq!(app.table.selected(), Some(0));
        app.handle(Action::PageUp);
        assert_eq!(app.table.selected(), Some(0));
    }

    #[test]
    fn stale_marks_devices_until_the_next_poll() {
        let mut app = App::new(1.0);
        app.apply_snapshot(busy_snapshot());
        app.mark_stale();
        assert_eq!(
            app.snapshot.as_ref().map(|s| s.devices[0].health.clone()),
            Some(DeviceHealth::Stale)
        );
        app.apply_snapshot(busy_snapshot());
        assert!(!app.stale);
    }

    #[test]
    fn quitting_a_started_job_asks_first_then_passes_its_exit_code_on() {
        let mut app = App::new(1.0);
        app.run = Some(RunView::new(42, std::path::PathBuf::from("/tmp/run.log")));
        app.handle(Action::Quit);
        assert_eq!(app.exit, None, "the first q only asks");
        assert!(app.run.as_ref().is_some_and(|r| r.quit_asked));
        app.handle(Action::CloseOverlay);
        assert!(app.run.as_ref().is_some_and(|r| !r.quit_asked), "Esc stays");
        app.handle(Action::Quit);
        app.handle(Action::Quit);
        assert_eq!(app.exit, Some(Exit::Quit), "a second q leaves it running");
        let mut app = App::new(1.0);
        app.run = Some(RunView::new(42, std::path::PathBuf::from("/tmp/run.log")));
        app.apply_run_output(vec!["done".into()], Some(3));
        app.handle(Action::Quit);
        assert_eq!(app.exit.map(Exit::code), Some(3));
    }

    #[test]
    fn quit_and_interrupt_exit_codes() {
        let mut app = App::new(1.0);
        app.handle(Action::Interrupt);
        assert_eq!(app.exit.map(Exit::code), Some(130));
        app.handle(Action::Quit);
        assert_eq!(app.exit.map(Exit::code), Some(0));
    }
}
