//! The whole screen on a TestBackend, snapshotted with insta, from a seeded simulated
//! source with its clock and host name pinned.

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use vramtop::app::action::Action;
use vramtop::app::App;
use vramtop::telemetry::sim::{SimSource, WorkloadGauge};
use vramtop::telemetry::{HostView, ProcessKind, ProcessSnapshot, SystemSnapshot, TelemetrySource};

fn seeded_snapshot() -> SystemSnapshot {
    let mut source = SimSource::new(7, WorkloadGauge::default()).with_fixed_clock();
    let mut s = source.poll();
    s.hostname = "test-host".to_string();
    s
}

fn render(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal.draw(|f| vramtop::ui::draw(f, app)).expect("draw");
    let buffer = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..buffer.area.height {
        for x in 0..buffer.area.width {
            out.push_str(buffer[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

fn idle_app() -> App {
    let mut app = App::new(1.0);
    for _ in 0..30 {
        app.apply_snapshot(seeded_snapshot());
    }
    app
}

#[test]
fn idle_simulated_device_120x40() {
    let screen = render(&idle_app(), 120, 40);
    assert!(screen.contains("sim0  simulated H100 80GB  (no NVIDIA driver found)"));
    insta::assert_snapshot!("idle_120x40", screen);
}

#[test]
fn idle_simulated_device_80x24() {
    let screen = render(&idle_app(), 80, 24);
    assert!(screen.contains("simulated"));
    insta::assert_snapshot!("idle_80x24", screen);
}

#[test]
fn tiny_terminal_asks_to_be_enlarged() {
    let screen = render(&idle_app(), 20, 5);
    assert!(screen.contains("enlarge"), "{screen}");
    insta::assert_snapshot!("tiny_20x5", screen);
    for (w, h) in [(1, 1), (2, 1), (1, 3), (59, 40), (120, 15)] {
        render(&idle_app(), w, h);
    }
}

/// A hand-built device with processes, to show the table: fixture data, not a source.
fn fixture_with_processes() -> SystemSnapshot {
    let mut s = seeded_snapshot();
    s.source = "fixture".to_string();
    let d = &mut s.devices[0];
    d.simulated = false;
    d.name = "Fixture GPU".to_string();
    d.memory_used_bytes = Some(20 << 30);
    let proc = |pid, mem: u64, view| ProcessSnapshot {
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: Some(mem),
        sm_util_pct: None,
        user: Some("alice".to_string()),
        command: Some(format!("python train.py --rank {pid}")),
        cpu_pct: Some(99.0),
        rss_bytes: Some(3 << 30),
        host_view: view,
    };
    d.processes = vec![
        proc(300, 4 << 30, HostView::Visible),
        proc(100, 12 << 30, HostView::Visible),
        proc(200, 2 << 30, HostView::OtherNamespace),
    ];
    s
}

#[test]
fn process_table_sorts_and_selects() {
    let mut app = App::new(1.0);
    app.apply_snapshot(fixture_with_processes());
    let pids: Vec<u32> = app.rows.iter().map(|r| r.process.pid).collect();
    assert_eq!(pids, vec![100, 300, 200], "by memory, largest first");
    app.handle(Action::SortByPid);
    let pids: Vec<u32> = app.rows.iter().map(|r| r.process.pid).collect();
    assert_eq!(pids, vec![100, 200, 300]);
    app.handle(Action::ScrollDown);
    app.handle(Action::ScrollDown);
    let screen = render(&app, 120, 40);
    assert!(screen.contains("(not in our PID namespace)"));
    assert!(
        screen.contains("unattributed"),
        "20 GiB used, 18 GiB attributed"
    );
    insta::assert_snapshot!("processes_by_pid_120x40", screen);
}

#[test]
fn help_overlay_lists_every_binding() {
    let mut app = idle_app();
    app.handle(Action::ToggleHelp);
    let screen = render(&app, 80, 24);
    for b in vramtop::app::action::BINDINGS
        .iter()
        .filter(|b| !b.keys.is_empty())
    {
        assert!(screen.contains(b.keys), "help lacks {}", b.keys);
    }
}

#[test]
fn many_devices_compact_to_one_row_each() {
    let mut s = seeded_snapshot();
    let template = s.devices[0].clone();
    s.devices = (0..8)
        .map(|i| {
            let mut d = template.clone();
            d.index = i;
            d
        })
        .collect();
    let mut app = App::new(1.0);
    app.apply_snapshot(s);
    let screen = render(&app, 120, 40);
    for i in 0..8 {
        assert!(
            screen.contains(&format!("sim{i}")),
            "device {i} missing:\n{screen}"
        );
    }
}
