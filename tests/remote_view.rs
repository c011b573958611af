//! `vramtop --remote`: several hosts in one screen. Two real `vramtop serve` processes
//! (one killed midway), one server that answers garbage and one that never answers, all
//! on 127.0.0.1. The screen shows who is up and who is down, and `poll` never waits on
//! the network. Fetches run as tasks on a tokio runtime, as in the app.

#[path = "support/serve_support.rs"]
mod support;

use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::Terminal;
use vramtop::app::App;
use vramtop::telemetry::remote::{FetchOptions, RemoteSource};
use vramtop::telemetry::{DeviceHealth, SystemSnapshot, TelemetrySource};

use support::{start_serve, FakeServer};

/// Well under the 2 s fetch timeout: a poll that waited on a fetch would blow it.
const POLL_BUDGET: Duration = Duration::from_millis(100);

fn timed_poll(source: &mut RemoteSource) -> SystemSnapshot {
    let started = Instant::now();
    let snapshot = source.poll();
    let took = started.elapsed();
    assert!(
        took < POLL_BUDGET,
        "poll() took {took:?}: it must not wait on the network"
    );
    snapshot
}

fn health_of<'a>(snapshot: &'a SystemSnapshot, addr: &str) -> &'a DeviceHealth {
    &snapshot
        .devices
        .iter()
        .find(|d| d.name.starts_with(addr))
        .unwrap_or_else(|| panic!("no device for {addr} in {:?}", snapshot.devices))
        .health
}

fn screen(app: &App) -> String {
    let mut terminal = Terminal::new(TestBackend::new(180, 45)).expect("test terminal");
    terminal
        .draw(|frame| vramtop::ui::draw(frame, app))
        .expect("draw");
    vramtop::ui::buffer_text(terminal.backend().buffer())
}

#[test]
fn one_host_up_others_down_without_a_stall() {
    let (_up, up_addr) = start_serve(&["--device", "sim", "--interval", "0.2"]);
    let (mut doomed, doomed_addr) = start_serve(&["--device", "sim", "--interval", "0.2"]);
    let garbage = FakeServer::start(Some("not json"));
    let silent = FakeServer::start(None);
    let addrs = vec![
        up_addr.clone(),
        doomed_addr.clone(),
        garbage.addr.clone(),
        silent.addr.clone(),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let options = FetchOptions {
        interval: Duration::from_millis(200),
        timeout: Duration::from_secs(2),
        token: None,
    };
    let mut source = RemoteSource::new(runtime.handle(), &addrs, options);

    // Right away, before any fetch can have finished: an answer, not a wait.
    let first = timed_poll(&mut source);
    assert_eq!(first.devices.len(), 4);

    // Both serve hosts answer and the garbage host is down, while the silent one may
    // still be waiting out its timeout.
    let settled = support::wait_for(Duration::from_secs(10), || {
        let s = timed_poll(&mut source);
        let ok = |a: &str| *health_of(&s, a) == DeviceHealth::Ok;
        let lost = |a: &str| matches!(health_of(&s, a), DeviceHealth::Lost(_));
        (ok(&up_addr) && ok(&doomed_addr) && lost(&garbage.addr)).then_some(s)
    })
    .expect("both serve hosts up and the garbage host down within 10 s");
    match health_of(&settled, &garbage.addr) {
        DeviceHealth::Lost(why) => assert!(
            why.contains("not a vramtop snapshot"),
            "garbage host reason: {why}"
        ),
        other => panic!("garbage host: {other:?}"),
    }
    let up_device = settled
        .devices
        .iter()
        .find(|d| d.name.starts_with(&up_addr))
        .expect("the up host's device");
    assert!(up_device.simulated);
    assert!(up_device.name.contains("simulated H100"));
    assert!(up_device.memory_total_bytes.is_some());

    // Kill one serve host: it is marked down, the silent host times out, and the
    // first host keeps answering throughout. Every poll stays instant.
    doomed.kill();
    let before = source.answered_at_ms();
    let after_kill = support::wait_for(Duration::from_secs(10), || {
        let s = timed_poll(&mut source);
        let lost = |a: &str| matches!(health_of(&s, a), DeviceHealth::Lost(_));
        (lost(&doomed_addr) && lost(&silent.addr)).then_some(s)
    })
    .expect("killed and silent hosts marked down within 10 s");
    assert_eq!(*health_of(&after_kill, &up_addr), DeviceHealth::Ok);
    match health_of(&after_kill, &silent.addr) {
        DeviceHealth::Lost(why) => assert!(why.contains("no answer within 2 s"), "{why}"),
        other => panic!("silent host: {other:?}"),
    }
    let still_updating = support::wait_for(Duration::from_secs(5), || {
        let now = source.answered_at_ms();
        (now[0] > before[0]).then_some(())
    });
    assert!(still_updating.is_some(), "the up host stopped updating");
    assert_eq!(after_kill.source, "remote: 1 of 4 hosts up");

    // The existing screen shows it all.
    let mut app = App::new(0.2);
    app.apply_snapshot(timed_poll(&mut source));
    let text = screen(&app);
    assert!(text.contains("remote: 1 of 4 hosts up"), "{text}");
    assert!(
        text.contains(&format!("{up_addr} simulated H100")),
        "{text}"
    );
    for down in [&doomed_addr, &garbage.addr, &silent.addr] {
        assert!(
            text.contains(&format!("LOST: {down} down:")),
            "{down}:\n{text}"
        );
    }
}

#[test]
fn once_json_reads_remote_hosts() {
    let (_up, up_addr) = start_serve(&["--device", "sim"]);
    let garbage = FakeServer::start(Some("not json"));
    let remote = format!("{up_addr},{}", garbage.addr);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(["--once", "--json", "--remote", &remote])
        .env_remove("VRAMTOP_INTERVAL")
        .env_remove("VRAMTOP_DEVICE")
        .output()
        .expect("vramtop --once runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let devices = v["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2, "{v}");
    assert!(devices[0]["name"]
        .as_str()
        .is_some_and(|n| n.starts_with(&up_addr)));
    assert_eq!(devices[0]["health"]["state"], "ok");
    assert_eq!(devices[1]["health"]["state"], "lost");
    assert_eq!(v["source"], "remote: 1 of 2 hosts up");
}
