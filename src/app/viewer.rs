//! The trace viewers' shared state: `vramtop snapshot` (a snapshot's final segments) and
//! `vramtop replay` (see `replayer`) both show one block map with its fragmentation
//! panel, steered by one key table, in the one loop (`screen::run`). No drawing here
//! (`ui::viewer` draws).

use std::path::Path;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::widgets::TableState;

use super::Exit;
use vramtop_alloc::metrics::layout_stats;
use vramtop_alloc::Layout;
pub use vramtop_alloc::MapView;
use vramtop_trace::{self as trace, snapshot, Trace, TraceFormat};

/// Replay clock ticks per second while it plays; an idle viewer redraws only on input.
pub const FPS: f64 = 30.0;
/// Zoom steps either way from the fitted scale.
const MAX_ZOOM: i32 = 16;
/// Segments (or block-list rows) that PgUp/PgDn move by.
const PAGE: isize = 10;

/// Where the user is in the map: zoom, selected segment, and its block list.
#[derive(Clone, Debug, Default)]
pub struct MapNav {
    pub zoom: i32,
    pub selected_segment: Option<usize>,
    pub show_segment_list: bool,
    pub segment_table: TableState,
}

impl MapNav {
    /// Applies a map action; `false` when `action` is not one.
    pub fn handle(&mut self, action: ViewerAction, layout: &Layout) -> bool {
        match action {
            ViewerAction::ZoomIn => self.zoom = (self.zoom + 1).min(MAX_ZOOM),
            ViewerAction::ZoomOut => self.zoom = (self.zoom - 1).max(-MAX_ZOOM),
            ViewerAction::Up => self.move_by(-1, layout),
            ViewerAction::Down => self.move_by(1, layout),
            ViewerAction::PageUp => self.move_by(-PAGE, layout),
            ViewerAction::PageDown => self.move_by(PAGE, layout),
            ViewerAction::ToggleSegmentList => {
                if self.selected_segment.is_none() {
                    self.move_by(0, layout);
                }
                self.show_segment_list = !self.show_segment_list && self.selected_segment.is_some();
                self.segment_table = TableState::default().with_selected(Some(0));
            }
            _ => return false,
        }
        true
    }

    /// Moves the block-list row when the list is open, else the selected segment.
    fn move_by(&mut self, delta: isize, layout: &Layout) {
        let list = self
            .selected_segment
            .filter(|_| self.show_segment_list)
            .and_then(|s| layout.segments.get(s));
        if let Some(segment) = list {
            let last = segment.runs.len().saturating_sub(1) as isize;
            let row = self.segment_table.selected().unwrap_or(0) as isize;
            self.segment_table
                .select(Some((row + delta).clamp(0, last) as usize));
            return;
        }
        let count = layout.segments.len() as isize;
        self.selected_segment = match (count, self.selected_segment) {
            (0, _) => None,
            (_, None) => Some(if delta < 0 { count - 1 } else { 0 } as usize),
            (_, Some(i)) => Some((i as isize + delta).clamp(0, count - 1) as usize),
        };
    }

    pub fn select_segment(&mut self, segment: Option<usize>, layout: &Layout) {
        self.selected_segment = segment;
        self.clamp(layout);
    }

    /// Keeps the selection inside a layout that changed under it.
    pub fn clamp(&mut self, layout: &Layout) {
        let count = layout.segments.len();
        self.selected_segment = self
            .selected_segment
            .filter(|_| count > 0)
            .map(|i| i.min(count - 1));
        if self.selected_segment.is_none() {
            self.show_segment_list = false;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewerAction {
    Quit,
    /// Ctrl-C: quit the way an interrupted program does (exit 130).
    Interrupt,
    /// Esc: close the block list, else quit.
    Back,
    ZoomIn,
    ZoomOut,
    Up,
    Down,
    PageUp,
    PageDown,
    ToggleSegmentList,
    /// Replay: play / pause. The rest of the replay controls follow.
    PlayPause,
    Step,
    Slower,
    Faster,
    /// Replay: back 1 % of the events; the snapshot viewer ignores it.
    SeekBack,
    SeekForward,
    /// Replay: to the first event; the snapshot viewer: the first segment.
    Home,
    End,
}

/// One binding: key, action, the keys as the footer shows them ("" for an alias),
/// what it does, and whether only the replayer uses it.
pub struct ViewerBinding {
    pub code: KeyCode,
    pub action: ViewerAction,
    pub keys: &'static str,
    pub help: &'static str,
    pub replay_only: bool,
}

const fn bind(
    code: KeyCode,
    action: ViewerAction,
    keys: &'static str,
    help: &'static str,
    replay_only: bool,
) -> ViewerBinding {
    ViewerBinding {
        code,
        action,
        keys,
        help,
        replay_only,
    }
}

/// The viewers' key map, one table (Ctrl-C is handled beside it, as in the live app).
pub const VIEWER_BINDINGS: &[ViewerBinding] = &[
    bind(KeyCode::Char('q'), ViewerAction::Quit, "q", "quit", false),
    bind(KeyCode::Esc, ViewerAction::Back, "", "", false),
    bind(
        KeyCode::Char(' '),
        ViewerAction::PlayPause,
        "space",
        "play/pause",
        true,
    ),
    bind(KeyCode::Char('.'), ViewerAction::Step, ".", "step", true),
    bind(
        KeyCode::Char('['),
        ViewerAction::Slower,
        "[ ]",
        "speed",
        true,
    ),
    bind(KeyCode::Char(']'), ViewerAction::Faster, "", "", true),
    bind(
        KeyCode::Left,
        ViewerAction::SeekBack,
        "←→",
        "seek 1 %",
        true,
    ),
    bind(KeyCode::Right, ViewerAction::SeekForward, "", "", true),
    bind(
        KeyCode::Home,
        ViewerAction::Home,
        "Home/End",
        "first/last",
        false,
    ),
    bind(KeyCode::End, ViewerAction::End, "", "", false),
    bind(
        KeyCode::Char('+'),
        ViewerAction::ZoomIn,
        "+/-",
        "zoom",
        false,
    ),
    bind(KeyCode::Char('='), ViewerAction::ZoomIn, "", "", false),
    bind(KeyCode::Char('-'), ViewerAction::ZoomOut, "", "", false),
    bind(KeyCode::Up, ViewerAction::Up, "↑↓", "segment", false),
    bind(KeyCode::Down, ViewerAction::Down, "", "", false),
    bind(KeyCode::Char('k'), ViewerAction::Up, "", "", false),
    bind(KeyCode::Char('j'), ViewerAction::Down, "", "", false),
    bind(KeyCode::PageUp, ViewerAction::PageUp, "", "", false),
    bind(KeyCode::PageDown, ViewerAction::PageDown, "", "", false),
    bind(
        KeyCode::Enter,
        ViewerAction::ToggleSegmentList,
        "Enter",
        "blocks",
        false,
    ),
];

/// The action of a key press in a viewer (`replay`: the replayer, with its controls).
pub fn viewer_action(key: KeyEvent, replay: bool) -> Option<ViewerAction> {
    if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
        return Some(ViewerAction::Interrupt);
    }
    if key
        .modifiers
        .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
    {
        return None;
    }
    VIEWER_BINDINGS
        .iter()
        .filter(|b| replay || !b.replay_only)
        .find(|b| b.code == key.code)
        .map(|b| b.action)
}

/// The state of `vramtop snapshot`: the snapshot's final layout and where the user is.
#[derive(Clone, Debug)]
pub struct SnapshotViewer {
    pub name: String,
    pub source: TraceFormat,
    pub device: i64,
    /// Events in the snapshot's history (0 without one).
    pub events: usize,
    pub no_history: bool,
    pub notices: Vec<String>,
    pub view: MapView,
    pub nav: MapNav,
    pub exit: Option<Exit>,
}

impl SnapshotViewer {
    pub fn new(name: &str, trace: &Trace) -> Self {
        let layout = snapshot::layout_at_end(trace);
        SnapshotViewer {
            name: name.to_string(),
            source: trace.source,
            device: trace.device,
            events: trace.events.len(),
            no_history: trace.stats.no_history || trace.events.is_empty(),
            // The note line says when there is no history; the footer keeps the rest.
            notices: trace
                .notices()
                .into_iter()
                .filter(|n| !n.starts_with("no allocation history"))
                .collect(),
            view: MapView {
                stats: layout_stats(&layout),
                layout,
                frag_history: Vec::new(),
            },
            nav: MapNav::default(),
            exit: None,
        }
    }

    pub fn handle(&mut self, action: ViewerAction) {
        let layout = &self.view.layout;
        match action {
            ViewerAction::Quit => self.exit = Some(Exit::Quit),
            ViewerAction::Interrupt => self.exit = Some(Exit::Interrupted),
            ViewerAction::Back if self.nav.show_segment_list => self.nav.show_segment_list = false,
            ViewerAction::Back => self.exit = Some(Exit::Quit),
            ViewerAction::Home => self.nav.select_segment(Some(0), layout),
            ViewerAction::End => self.nav.select_segment(Some(usize::MAX), layout),
            other => {
                self.nav.handle(other, layout);
            }
        }
    }
}

/// The file name a title shows.
pub fn display_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Loads a trace for a viewer: `Err` carries the one line to print (exit 2).
pub fn load_trace(path: &Path) -> std::result::Result<Trace, String> {
    trace::load(path).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn replay_keys_only_in_the_replayer() {
        assert_eq!(
            viewer_action(key(KeyCode::Char(' ')), true),
            Some(ViewerAction::PlayPause)
        );
        assert_eq!(viewer_action(key(KeyCode::Char(' ')), false), None);
        assert_eq!(
            viewer_action(key(KeyCode::Esc), false),
            Some(ViewerAction::Back)
        );
        assert_eq!(
            viewer_action(
                KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL),
                false
            ),
            Some(ViewerAction::Interrupt)
        );
        assert_eq!(
            viewer_action(
                KeyEvent::new(KeyCode::Char('+'), KeyModifiers::SHIFT),
                false
            ),
            Some(ViewerAction::ZoomIn)
        );
    }

    #[test]
    fn no_key_is_bound_twice() {
        for (i, a) in VIEWER_BINDINGS.iter().enumerate() {
            assert!(
                VIEWER_BINDINGS[i + 1..].iter().all(|b| b.code != a.code),
                "{:?} bound twice",
                a.code
            );
        }
    }
}
