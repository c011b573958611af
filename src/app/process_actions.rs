//! Acting on the process table: asking to signal the selected process, then sending or
//! cancelling once the user answers the confirmation; and editing the filter text as it
//! is typed. The view stack decides which of these has the keys; this keeps their state.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::signal::{self, KillError, KillRequest, Signal};
use super::App;
use vramtop_telemetry::HostView;

/// One line for the footer after an action: what was done, or why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusLine {
    pub text: String,
    pub ok: bool,
}

impl StatusLine {
    fn ok(text: impl Into<String>) -> Self {
        StatusLine {
            text: text.into(),
            ok: true,
        }
    }

    fn refused(text: impl Into<String>) -> Self {
        StatusLine {
            text: text.into(),
            ok: false,
        }
    }
}

/// What a key did to the filter being typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterKey {
    /// The text changed (or the key was ignored): keep typing.
    Editing,
    /// Enter: keep the filter and close the input.
    Accepted,
    /// Esc: filter cleared, input closed.
    Cleared,
}

/// The command line shown in a confirmation, cut so the dialog stays one screen wide.
const COMMAND_CHARS: usize = 120;

impl App {
    /// Prepare `signal` for the selected process. True when a confirmation is now pending;
    /// false when it was refused at once (no selection, a process we cannot address),
    /// with the reason in the status line.
    pub fn request_signal(&mut self, signal: Signal) -> bool {
        let Some(row) = self.selected_row() else {
            self.status = Some(StatusLine::refused(
                "select a process first (↑↓), then t (SIGTERM) or K (SIGKILL)",
            ));
            return false;
        };
        let pid = row.process.pid;
        let refusal = match row.process.host_view {
            HostView::Visible => None,
            HostView::OtherNamespace => Some(KillError::OtherNamespace(pid)),
            HostView::Exited => Some(KillError::Gone(pid)),
        };
        if let Some(why) = refusal {
            self.status = Some(StatusLine::refused(why.to_string()));
            return false;
        }
        let command: String = row.command_text().chars().take(COMMAND_CHARS).collect();
        let start_ticks = self.signals.start_ticks(pid);
        self.pending_signal = Some(KillRequest {
            pid,
            command,
            signal,
            start_ticks,
        });
        true
    }

    /// The user said yes: send the pending signal and say what happened.
    pub fn confirm_signal(&mut self) {
        let Some(request) = self.pending_signal.take() else {
            return;
        };
        self.status = Some(match signal::send(self.signals.as_mut(), &request) {
            Ok(()) => StatusLine::ok(format!(
                "sent {} to pid {} ({})",
                request.signal.name(),
                request.pid,
                request.command
            )),
            Err(e) => StatusLine::refused(e.to_string()),
        });
    }

    /// The user said no: nothing is sent.
    pub fn cancel_signal(&mut self) {
        if let Some(request) = self.pending_signal.take() {
            self.status = Some(StatusLine::ok(format!(
                "cancelled: no {} sent to pid {}",
                request.signal.name(),
                request.pid
            )));
        }
    }

    /// A key typed into the filter: the table follows as it is typed.
    pub fn filter_key(&mut self, key: KeyEvent) -> FilterKey {
        let mut text = self.filter.clone();
        let outcome = match key.code {
            KeyCode::Enter => FilterKey::Accepted,
            KeyCode::Esc => {
                text.clear();
                FilterKey::Cleared
            }
            KeyCode::Backspace => {
                text.pop();
                FilterKey::Editing
            }
            KeyCode::Char('u') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                text.clear();
                FilterKey::Editing
            }
            KeyCode::Char(c)
                if !key.modifiers.contains(KeyModifiers::CONTROL) && !c.is_control() =>
            {
                text.push(c);
                FilterKey::Editing
            }
            _ => FilterKey::Editing,
        };
        if text != self.filter {
            self.set_filter(&text);
        }
        outcome
    }
}

/// The question a confirmation asks, in one line.
pub fn confirmation_question(request: &KillRequest) -> String {
    format!(
        "Send {} to pid {} ({})?",
        request.signal.name(),
        request.pid,
        request.command
    )
}

/// Whether a key answers a confirmation: Some(true) send, Some(false) cancel.
pub fn confirmation_answer(key: KeyEvent) -> Option<bool> {
    match key.code {
        KeyCode::Char('y') | KeyCode::Char('Y') | KeyCode::Enter => Some(true),
        KeyCode::Char('n') | KeyCode::Char('N') | KeyCode::Esc | KeyCode::Char('q') => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn filter_keys_edit_accept_and_clear() {
        let mut app = App::new(1.0);
        for c in "py".chars() {
            assert_eq!(app.filter_key(key(KeyCode::Char(c))), FilterKey::Editing);
        }
        assert_eq!(app.filter, "py");
        app.filter_key(key(KeyCode::Backspace));
        assert_eq!(app.filter, "p");
        assert_eq!(app.filter_key(key(KeyCode::Enter)), FilterKey::Accepted);
        assert_eq!(app.filter, "p");
        assert_eq!(app.filter_key(key(KeyCode::Esc)), FilterKey::Cleared);
        assert_eq!(app.filter, "");
    }

    #[test]
    fn nothing_selected_is_refused_with_a_hint() {
        let mut app = App::new(1.0);
        assert!(!app.request_signal(Signal::Term));
        let status = app.status.clone().map(|s| (s.ok, s.text));
        assert!(matches!(status, Some((false, text)) if text.contains("select a process")));
        assert!(app.pending_signal.is_none());
    }

    #[test]
    fn answers_are_y_enter_or_n_esc() {
        assert_eq!(confirmation_answer(key(KeyCode::Char('y'))), Some(true));
        assert_eq!(confirmation_answer(key(KeyCode::Enter)), Some(true));
        assert_eq!(confirmation_answer(key(KeyCode::Esc)), Some(false));
        assert_eq!(confirmation_answer(key(KeyCode::Char('x'))), None);
    }
}
