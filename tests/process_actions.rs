//! Process actions through the app's own action path: SIGTERM / SIGKILL with a
//! confirmation naming pid and command (sent to real child processes this test starts),
//! the refusal when the kernel says EPERM (a fake sender: the only way to get EPERM
//! without a second user), and the filter typed with `/`.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use vramtop::app::action::Action;
use vramtop::app::signal::{Signal, SignalSender};
use vramtop::app::{App, View};
use vramtop::telemetry::sim::{SimSource, WorkloadGauge};
use vramtop::telemetry::{HostView, ProcessKind, ProcessSnapshot, SystemSnapshot, TelemetrySource};

fn render(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal.draw(|f| vramtop::ui::draw(f, app)).expect("draw");
    vramtop::ui::buffer_text(terminal.backend().buffer())
}

fn key(code: KeyCode) -> Action {
    Action::Input(KeyEvent::new(code, KeyModifiers::NONE))
}

fn type_text(app: &mut App, text: &str) {
    for c in text.chars() {
        app.handle(key(KeyCode::Char(c)));
    }
}

fn process(pid: u32, used: u64, command: &str, view: HostView) -> ProcessSnapshot {
    ProcessSnapshot {
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: Some(used),
        sm_util_pct: None,
        user: Some("alice".into()),
        command: Some(command.into()),
        cpu_pct: None,
        rss_bytes: None,
        host_view: view,
        cgroup: None,
        frameworks: None,
    }
}

/// A device listing these processes (fixture data on the seeded simulated device).
fn snapshot(processes: Vec<ProcessSnapshot>) -> SystemSnapshot {
    let mut s = SimSource::new(7, WorkloadGauge::default())
        .with_fixed_clock()
        .poll();
    s.hostname = "test-host".into();
    s.source = "fixture".into();
    s.devices[0].simulated = false;
    s.devices[0].name = "Fixture GPU".into();
    s.devices[0].processes = processes;
    s
}

/// Kills the child if the test fails before the action does.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper() -> Reaped {
    Reaped(
        Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("spawn sleep 60"),
    )
}

/// The child's exit status within 10 s, or None if it is still running.
fn wait_for_exit(child: &mut Child) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn app_with_child(child: &Reaped) -> App {
    let mut app = App::new(1.0);
    app.apply_snapshot(snapshot(vec![process(
        child.0.id(),
        1 << 30,
        "sleep 60",
        HostView::Visible,
    )]));
    app.handle(Action::Top);
    app
}

#[test]
fn sigterm_after_confirmation_ends_a_real_child() {
    let mut child = sleeper();
    let pid = child.0.id();
    let mut app = app_with_child(&child);
    app.handle(Action::Terminate);
    assert_eq!(app.views.focus(), Some(View::ConfirmSignal));
    assert!(app.wants_raw_keys());
    let screen = render(&app, 120, 40);
    assert!(
        screen.contains(&format!("Send SIGTERM to pid {pid} (sleep 60)?")),
        "{screen}"
    );
    // Nothing is sent before the answer.
    assert!(matches!(child.0.try_wait(), Ok(None)));
    app.handle(key(KeyCode::Char('y')));
    assert_eq!(app.views.focus(), None);
    let status = wait_for_exit(&mut child.0).expect("the child ends after SIGTERM");
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    let line = app.status.clone().expect("a status line");
    assert!(line.ok, "{line:?}");
    assert!(render(&app, 120, 40).contains(&format!("sent SIGTERM to pid {pid} (sleep 60)")));
}

#[test]
fn sigkill_is_asked_for_with_k_and_sent_on_enter() {
    let mut child = sleeper();
    let mut app = app_with_child(&child);
    app.handle(Action::KillProcess);
    assert!(render(&app, 80, 24).contains("SIGKILL"));
    app.handle(key(KeyCode::Enter));
    let status = wait_for_exit(&mut child.0).expect("the child ends after SIGKILL");
    assert_eq!(status.signal(), Some(libc::SIGKILL));
}

#[test]
fn cancelling_sends_nothing() {
    let mut child = sleeper();
    let mut app = app_with_child(&child);
    app.handle(Action::Terminate);
    app.handle(key(KeyCode::Char('q'))); // q answers "no" here; it does not quit
    assert_eq!(app.exit, None);
    assert_eq!(app.views.focus(), None);
    std::thread::sleep(Duration::from_millis(100));
    assert!(matches!(child.0.try_wait(), Ok(None)), "still running");
    assert!(app
        .status
        .as_ref()
        .is_some_and(|s| s.text.starts_with("cancelled")));
}

/// The kernel's answer for another user's process.
struct NotPermitted;

impl SignalSender for NotPermitted {
    fn send(&mut self, _: u32, _: Signal) -> Result<(), std::io::Error> {
        Err(std::io::Error::from_raw_os_error(libc::EPERM))
    }
    fn start_ticks(&self, _: u32) -> Option<u64> {
        Some(1)
    }
}

#[test]
fn eperm_is_refused_in_one_clear_line() {
    let mut app = App::new(1.0);
    app.signals = Box::new(NotPermitted);
    app.apply_snapshot(snapshot(vec![process(
        4242,
        2 << 30,
        "python train.py --rank 0",
        HostView::Visible,
    )]));
    app.handle(Action::Top);
    app.handle(Action::Terminate);
    let asking = render(&app, 80, 24);
    insta::assert_snapshot!("confirm_sigterm_80x24", asking);
    app.handle(key(KeyCode::Char('y')));
    let status = app.status.clone().expect("a status line");
    assert!(!status.ok);
    assert!(
        status.text.contains("not permitted") && status.text.contains("EPERM"),
        "{status:?}"
    );
    let refused = render(&app, 200, 60);
    assert!(
        refused.contains("not permitted to signal pid 4242 (EPERM)"),
        "{refused}"
    );
}

#[test]
fn a_process_of_another_namespace_is_refused_without_asking() {
    let mut app = App::new(1.0);
    app.apply_snapshot(snapshot(vec![process(
        77,
        1 << 30,
        "",
        HostView::OtherNamespace,
    )]));
    app.handle(Action::Top);
    app.handle(Action::KillProcess);
    assert_eq!(
        app.views.focus(),
        None,
        "no confirmation for a pid we cannot address"
    );
    assert!(app
        .status
        .as_ref()
        .is_some_and(|s| !s.ok && s.text.contains("another PID namespace")));
}

#[test]
fn filter_narrows_the_table_as_it_is_typed() {
    let mut app = App::new(1.0);
    app.apply_snapshot(snapshot(vec![
        process(101, 3 << 30, "python train.py", HostView::Visible),
        process(102, 2 << 30, "vllm serve llama", HostView::Visible),
        process(103, 1 << 30, "python eval.py", HostView::Visible),
    ]));
    app.handle(Action::Filter);
    assert!(app.wants_raw_keys());
    type_text(&mut app, "PYTHON");
    let pids: Vec<u32> = app.rows.iter().map(|r| r.process.pid).collect();
    assert_eq!(pids, [101, 103], "any case");
    assert_eq!(app.exit, None, "letters typed into the filter are not keys");
    let screen = render(&app, 120, 40);
    insta::assert_snapshot!("filter_typing_120x40", screen);
    app.handle(key(KeyCode::Enter));
    assert_eq!(app.views.focus(), None);
    assert_eq!(app.rows.len(), 2, "Enter keeps the filter");
    assert!(render(&app, 120, 40).contains("2 of 3"));
    app.handle(Action::Filter);
    type_text(&mut app, "zzz");
    assert!(render(&app, 120, 40).contains("no process matches"));
    app.handle(key(KeyCode::Esc));
    assert_eq!(app.rows.len(), 3, "Esc clears the filter");
    assert_eq!(app.filter, "");
}

#[test]
fn sort_cycles_through_columns_and_reverses() {
    let mut app = App::new(1.0);
    app.apply_snapshot(snapshot(vec![
        process(300, 1 << 30, "b", HostView::Visible),
        process(100, 3 << 30, "c", HostView::Visible),
        process(200, 2 << 30, "a", HostView::Visible),
    ]));
    let pids = |app: &App| app.rows.iter().map(|r| r.process.pid).collect::<Vec<_>>();
    assert_eq!(pids(&app), [100, 200, 300], "by memory");
    app.handle(Action::SortReverse);
    assert_eq!(pids(&app), [300, 200, 100]);
    assert!(render(&app, 120, 40).contains("by memory (reversed)"));
    // Memory -> trend -> sm% -> cpu% -> rss -> group -> framework -> command.
    for _ in 0..7 {
        app.handle(Action::SortNext);
    }
    assert!(render(&app, 120, 40).contains("by command"));
    assert_eq!(pids(&app), [200, 300, 100]);
}
