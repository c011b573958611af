//! What a key means: one table from key to `Action`, so bindings live in one place and
//! a config file can later override them, instead of a chain of key checks.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Quit,
    /// Ctrl-C: quit the way an interrupted program does (exit 130).
    Interrupt,
    ToggleHelp,
    CloseOverlay,
    ScrollUp,
    ScrollDown,
    PageUp,
    PageDown,
    Top,
    Bottom,
    SortByMemory,
    SortByPid,
    /// Sort by the next column (in table order).
    SortNext,
    /// Sort the other way.
    SortReverse,
    /// Next device, or, over a job's ranks, the next rank.
    NextDevice,
    PrevDevice,
    /// Show the rank of this number of the shown job (keys 0-9).
    SelectRank(u32),
    ToggleFreeze,
    /// Probe workload controls (forwarded to the probe runner).
    ProbePause,
    ProbeStep,
    ProbeFaster,
    ProbeSlower,
    ZoomIn,
    ZoomOut,
    NextSegment,
    PrevSegment,
    ToggleSegmentList,
    ToggleLeaksView,
    /// Set a baseline for mark-and-compare, or clear it (forwarded to the probe runner).
    ToggleMark,
    /// Save the current settings to the settings file (nvtop's F12).
    SaveSettings,
    /// Save the screen as it is drawn now as an SVG picture (in `--svg-dir`).
    SaveScreen,
    /// Ask to send SIGTERM to the selected process (a confirmation follows).
    Terminate,
    /// Ask to send SIGKILL to the selected process (a confirmation follows).
    KillProcess,
    /// Type a filter for the process table.
    Filter,
    /// A key as typed, for a view that reads text or an answer (the filter, a
    /// confirmation); not in the key table.
    Input(KeyEvent),
}

impl Action {
    /// Actions that steer the background probe rather than the app state.
    pub fn is_probe_control(self) -> bool {
        matches!(
            self,
            Action::ProbePause
                | Action::ProbeStep
                | Action::ProbeFaster
                | Action::ProbeSlower
                | Action::ToggleMark
        )
    }
}

/// One binding: a key, the modifiers it needs, what it does, and the text the help shows.
pub struct Binding {
    pub code: KeyCode,
    pub modifiers: KeyModifiers,
    pub action: Action,
    pub keys: &'static str,
    pub help: &'static str,
}

const fn bind(
    code: KeyCode,
    modifiers: KeyModifiers,
    action: Action,
    keys: &'static str,
    help: &'static str,
) -> Binding {
    Binding {
        code,
        modifiers,
        action,
        keys,
        help,
    }
}

const NONE: KeyModifiers = KeyModifiers::NONE;

/// The default key map. Entries with an empty `keys` are aliases left out of the help.
pub const BINDINGS: &[Binding] = &[
    bind(KeyCode::Char('q'), NONE, Action::Quit, "q", "quit"),
    bind(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
        Action::Interrupt,
        "Ctrl-C",
        "quit (exit 130)",
    ),
    bind(
        KeyCode::Char('?'),
        NONE,
        Action::ToggleHelp,
        "?",
        "show / hide help",
    ),
    bind(
        KeyCode::Esc,
        NONE,
        Action::CloseOverlay,
        "Esc",
        "close the help",
    ),
    bind(
        KeyCode::Up,
        NONE,
        Action::ScrollUp,
        "Up/k",
        "previous process",
    ),
    bind(KeyCode::Char('k'), NONE, Action::ScrollUp, "", ""),
    bind(
        KeyCode::Down,
        NONE,
        Action::ScrollDown,
        "Down/j",
        "next process",
    ),
    bind(KeyCode::Char('j'), NONE, Action::ScrollDown, "", ""),
    bind(KeyCode::PageUp, NONE, Action::PageUp, "PgUp", "page up"),
    bind(
        KeyCode::PageDown,
        NONE,
        Action::PageDown,
        "PgDn",
        "page down",
    ),
    bind(KeyCode::Home, NONE, Action::Top, "Home/g", "first process"),
    bind(KeyCode::Char('g'), NONE, Action::Top, "", ""),
    bind(KeyCode::End, NONE, Action::Bottom, "End/G", "last process"),
    bind(KeyCode::Char('G'), NONE, Action::Bottom, "", ""),
    bind(
        KeyCode::Char('m'),
        NONE,
        Action::SortByMemory,
        "m",
        "sort by GPU memory",
    ),
    bind(
        KeyCode::Char('p'),
        NONE,
        Action::SortByPid,
        "p",
        "sort by pid",
    ),
    bind(
        KeyCode::Char('s'),
        NONE,
        Action::SortNext,
        "s",
        "sort by the next column",
    ),
    bind(
        KeyCode::Char('r'),
        NONE,
        Action::SortReverse,
        "r",
        "reverse the sort",
    ),
    bind(
        KeyCode::Tab,
        NONE,
        Action::NextDevice,
        "Tab",
        "next device (next rank over a job's ranks)",
    ),
    bind(
        KeyCode::BackTab,
        KeyModifiers::SHIFT,
        Action::PrevDevice,
        "Shift-Tab",
        "previous device (previous rank)",
    ),
    bind(
        KeyCode::Char('0'),
        NONE,
        Action::SelectRank(0),
        "0-9",
        "show that rank of the job",
    ),
    bind(KeyCode::Char('1'), NONE, Action::SelectRank(1), "", ""),
    bind(KeyCode::Char('2'), NONE, Action::SelectRank(2), "", ""),
    bind(KeyCode::Char('3'), NONE, Action::SelectRank(3), "", ""),
    bind(KeyCode::Char('4'), NONE, Action::SelectRank(4), "", ""),
    bind(KeyCode::Char('5'), NONE, Action::SelectRank(5), "", ""),
    bind(KeyCode::Char('6'), NONE, Action::SelectRank(6), "", ""),
    bind(KeyCode::Char('7'), NONE, Action::SelectRank(7), "", ""),
    bind(KeyCode::Char('8'), NONE, Action::SelectRank(8), "", ""),
    bind(KeyCode::Char('9'), NONE, Action::SelectRank(9), "", ""),
    bind(
        KeyCode::Char('f'),
        NONE,
        Action::ToggleFreeze,
        "f",
        "freeze / unfreeze",
    ),
    bind(
        KeyCode::Char(' '),
        NONE,
        Action::ProbePause,
        "Space",
        "pause / resume the probe",
    ),
    bind(
        KeyCode::Char('.'),
        NONE,
        Action::ProbeStep,
        ".",
        "probe: one step (pauses)",
    ),
    bind(
        KeyCode::Char(']'),
        NONE,
        Action::ProbeFaster,
        "]",
        "probe: twice as fast",
    ),
    bind(
        KeyCode::Char('['),
        NONE,
        Action::ProbeSlower,
        "[",
        "probe: half as fast",
    ),
    bind(
        KeyCode::Char('+'),
        NONE,
        Action::ZoomIn,
        "+",
        "block map: zoom in",
    ),
    bind(KeyCode::Char('='), NONE, Action::ZoomIn, "", ""),
    bind(
        KeyCode::Char('-'),
        NONE,
        Action::ZoomOut,
        "-",
        "block map: zoom out",
    ),
    bind(
        KeyCode::Right,
        NONE,
        Action::NextSegment,
        "Right/l",
        "next segment",
    ),
    bind(KeyCode::Char('l'), NONE, Action::NextSegment, "", ""),
    bind(
        KeyCode::Left,
        NONE,
        Action::PrevSegment,
        "Left/h",
        "previous segment",
    ),
    bind(KeyCode::Char('h'), NONE, Action::PrevSegment, "", ""),
    bind(
        KeyCode::Enter,
        NONE,
        Action::ToggleSegmentList,
        "Enter",
        "blocks of the selected segment, else the process over time",
    ),
    bind(
        KeyCode::Char('L'),
        NONE,
        Action::ToggleLeaksView,
        "L",
        "leaks view / main view",
    ),
    bind(
        KeyCode::Char('M'),
        NONE,
        Action::ToggleMark,
        "M",
        "leaks: mark now / clear mark",
    ),
    bind(
        KeyCode::F(12),
        NONE,
        Action::SaveSettings,
        "F12",
        "save settings to the config file",
    ),
    bind(
        KeyCode::Char('P'),
        NONE,
        Action::SaveScreen,
        "P",
        "save the screen as an SVG picture (--svg-dir)",
    ),
    bind(
        KeyCode::Char('t'),
        NONE,
        Action::Terminate,
        "t/F9",
        "SIGTERM the process (asks first)",
    ),
    bind(KeyCode::F(9), NONE, Action::Terminate, "", ""),
    bind(
        KeyCode::Char('K'),
        NONE,
        Action::KillProcess,
        "K",
        "SIGKILL the process (asks first)",
    ),
    bind(
        KeyCode::Char('/'),
        NONE,
        Action::Filter,
        "/",
        "filter processes by text",
    ),
];

/// The action bound to a key press, if any. Shift is ignored for characters, since
/// terminals disagree on whether '?' or 'G' arrive with it.
pub fn action_for(key: KeyEvent) -> Option<Action> {
    let mods = match key.code {
        KeyCode::Char(_) => key.modifiers - KeyModifiers::SHIFT,
        _ => key.modifiers,
    };
    BINDINGS
        .iter()
        .find(|b| b.code == key.code && (b.modifiers == mods || (b.code == KeyCode::BackTab)))
        .map(|b| b.action)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode, modifiers: KeyModifiers) -> KeyEvent {
        KeyEvent::new(code, modifiers)
    }

    #[test]
    fn keys_map_to_actions() {
        assert_eq!(
            action_for(key(KeyCode::Char('q'), NONE)),
            Some(Action::Quit)
        );
        assert_eq!(
            action_for(key(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Some(Action::Interrupt)
        );
        assert_eq!(action_for(key(KeyCode::Char('c'), NONE)), None);
        assert_eq!(
            action_for(key(KeyCode::Char('?'), KeyModifiers::SHIFT)),
            Some(Action::ToggleHelp)
        );
        assert_eq!(
            action_for(key(KeyCode::BackTab, NONE)),
            Some(Action::PrevDevice)
        );
    }

    #[test]
    fn every_action_has_a_key() {
        use Action::*;
        let all = [
            Quit,
            Interrupt,
            ToggleHelp,
            CloseOverlay,
            ScrollUp,
            ScrollDown,
            PageUp,
            PageDown,
            Top,
            Bottom,
            SortByMemory,
            SortByPid,
            SortNext,
            SortReverse,
            NextDevice,
            PrevDevice,
            ToggleFreeze,
            ProbePause,
            ProbeStep,
            ProbeFaster,
            ProbeSlower,
            ZoomIn,
            ZoomOut,
            NextSegment,
            PrevSegment,
            ToggleSegmentList,
            ToggleLeaksView,
            ToggleMark,
            SaveSettings,
            SaveScreen,
            Terminate,
            KillProcess,
            Filter,
        ];
        for action in all {
            assert!(
                BINDINGS
                    .iter()
                    .any(|b| b.action == action && !b.keys.is_empty()),
                "{action:?} has no key in the help"
            );
        }
        assert_eq!(action_for(key(KeyCode::Char(' '), NONE)), Some(ProbePause));
        assert_eq!(
            action_for(key(KeyCode::Char('+'), KeyModifiers::SHIFT)),
            Some(ZoomIn)
        );
    }

    #[test]
    fn no_key_is_bound_twice() {
        for (i, a) in BINDINGS.iter().enumerate() {
            for b in &BINDINGS[i + 1..] {
                assert!(
                    !(a.code == b.code && a.modifiers == b.modifiers),
                    "{:?} bound twice",
                    a.code
                );
            }
        }
    }
}
