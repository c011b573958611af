//! What a key means in talk mode: one table from key to `DemoAction`, shown as the
//! presenter's key line, so bindings and their hints cannot drift apart.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoAction {
    TogglePause,
    Next,
    Previous,
    Faster,
    Slower,
    Restart,
    SaveSvg,
    Quit,
    /// Ctrl-C: quit the way an interrupted program does (exit 130).
    Interrupt,
}

pub struct DemoBinding {
    pub code: KeyCode,
    pub modifiers: KeyModifiers,
    pub action: DemoAction,
    /// Key names for the hint line; empty for an alias left out of it.
    pub keys: &'static str,
    pub hint: &'static str,
}

const fn bind(
    code: KeyCode,
    modifiers: KeyModifiers,
    action: DemoAction,
    keys: &'static str,
    hint: &'static str,
) -> DemoBinding {
    DemoBinding {
        code,
        modifiers,
        action,
        keys,
        hint,
    }
}

const NONE: KeyModifiers = KeyModifiers::NONE;

pub const DEMO_BINDINGS: &[DemoBinding] = &[
    bind(
        KeyCode::Char(' '),
        NONE,
        DemoAction::TogglePause,
        "space",
        "pause",
    ),
    bind(KeyCode::Right, NONE, DemoAction::Next, "→/n", "next"),
    bind(KeyCode::Char('n'), NONE, DemoAction::Next, "", ""),
    bind(KeyCode::Left, NONE, DemoAction::Previous, "←/p", "back"),
    bind(KeyCode::Char('p'), NONE, DemoAction::Previous, "", ""),
    bind(KeyCode::Char('+'), NONE, DemoAction::Faster, "+/-", "speed"),
    bind(KeyCode::Char('='), NONE, DemoAction::Faster, "", ""),
    bind(KeyCode::Char('-'), NONE, DemoAction::Slower, "", ""),
    bind(
        KeyCode::Char('r'),
        NONE,
        DemoAction::Restart,
        "r",
        "restart",
    ),
    bind(
        KeyCode::Char('s'),
        NONE,
        DemoAction::SaveSvg,
        "s",
        "save SVG",
    ),
    bind(KeyCode::Char('q'), NONE, DemoAction::Quit, "q", "quit"),
    bind(KeyCode::Esc, NONE, DemoAction::Quit, "", ""),
    bind(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
        DemoAction::Interrupt,
        "",
        "",
    ),
];

/// The action bound to a key press, if any. Shift is ignored for characters ('+' often
/// arrives with it).
pub fn demo_action_for(key: KeyEvent) -> Option<DemoAction> {
    let mods = match key.code {
        KeyCode::Char(_) => key.modifiers - KeyModifiers::SHIFT,
        _ => key.modifiers,
    };
    DEMO_BINDINGS
        .iter()
        .find(|b| b.code == key.code && b.modifiers == mods)
        .map(|b| b.action)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_actions() {
        let key = |code, mods| demo_action_for(KeyEvent::new(code, mods));
        assert_eq!(key(KeyCode::Char(' '), NONE), Some(DemoAction::TogglePause));
        assert_eq!(key(KeyCode::Right, NONE), Some(DemoAction::Next));
        assert_eq!(
            key(KeyCode::Char('+'), KeyModifiers::SHIFT),
            Some(DemoAction::Faster)
        );
        assert_eq!(key(KeyCode::Esc, NONE), Some(DemoAction::Quit));
        assert_eq!(
            key(KeyCode::Char('c'), KeyModifiers::CONTROL),
            Some(DemoAction::Interrupt)
        );
        assert_eq!(key(KeyCode::Char('c'), NONE), None);
    }

    #[test]
    fn no_key_is_bound_twice() {
        for (i, a) in DEMO_BINDINGS.iter().enumerate() {
            for b in &DEMO_BINDINGS[i + 1..] {
                assert!(
                    !(a.code == b.code && a.modifiers == b.modifiers),
                    "{:?}",
                    a.code
                );
            }
        }
    }
}
