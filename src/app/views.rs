//! The live view's stack of views: what is open over the main screen (processes and the
//! block map), in the order it was opened. The topmost view that is not the help takes
//! the movement keys; `Esc` closes the top one. A new kind of view is one more variant
//! here, not one more flag on `App`.

/// A view opened over the main screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Leak suspects and memory trends, in place of the process table and block map.
    Leaks,
    /// The selected segment's blocks, in place of the block map.
    SegmentList,
    /// One process over time (`App::process_screen`), in place of the process table
    /// and the block map.
    Process,
    /// The key help, drawn over everything.
    Help,
    /// "Send SIGTERM to pid N (command)?": y sends, n cancels (`App::pending_signal`).
    ConfirmSignal,
    /// The process filter being typed, in the footer (`App::filter`).
    Filter,
}

impl View {
    /// Views that take every key as typed (text, or an answer) instead of the key table.
    pub fn takes_raw_keys(self) -> bool {
        matches!(self, View::ConfirmSignal | View::Filter)
    }
}

/// Views open over the main screen, bottom first; each at most once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewStack(Vec<View>);

impl ViewStack {
    pub fn contains(&self, view: View) -> bool {
        self.0.contains(&view)
    }

    /// The view drawn last (the help when it is open).
    pub fn top(&self) -> Option<View> {
        self.0.last().copied()
    }

    /// The view that takes the keys: the topmost that is not the help, which only shows
    /// them. `None` is the main screen.
    pub fn focus(&self) -> Option<View> {
        self.0.iter().rev().copied().find(|v| *v != View::Help)
    }

    /// Opens `view` on top, below the help: the help is drawn over everything, so
    /// closing views under it must not leave it covering a view opened later.
    pub fn push(&mut self, view: View) {
        self.remove(view);
        let at = match (view, self.top()) {
            (View::Help, _) | (_, None) => self.0.len(),
            (_, Some(View::Help)) => self.0.len() - 1,
            (_, Some(_)) => self.0.len(),
        };
        self.0.insert(at, view);
    }

    pub fn remove(&mut self, view: View) {
        self.0.retain(|v| *v != view);
    }

    /// Closes `view` when it is open, else opens it.
    pub fn toggle(&mut self, view: View) {
        if self.contains(view) {
            self.remove(view);
        } else {
            self.push(view);
        }
    }

    /// Closes the top view; `None` when only the main screen was showing.
    pub fn pop(&mut self) -> Option<View> {
        self.0.pop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_stays_on_top_and_esc_closes_one_view_at_a_time() {
        let mut views = ViewStack::default();
        views.push(View::Help);
        views.push(View::SegmentList);
        assert_eq!(views.top(), Some(View::Help));
        assert_eq!(views.focus(), Some(View::SegmentList));
        assert_eq!(views.pop(), Some(View::Help));
        assert_eq!(views.pop(), Some(View::SegmentList));
        assert_eq!(views.pop(), None);
    }

    #[test]
    fn closing_the_leaks_view_returns_to_what_was_under_it() {
        let mut views = ViewStack::default();
        views.push(View::SegmentList);
        views.toggle(View::Leaks);
        assert_eq!(views.focus(), Some(View::Leaks));
        views.toggle(View::Leaks);
        assert_eq!(views.focus(), Some(View::SegmentList));
        views.push(View::SegmentList);
        assert_eq!(views, {
            let mut once = ViewStack::default();
            once.push(View::SegmentList);
            once
        });
    }
}
