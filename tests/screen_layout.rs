//! The live screen's layout from 80x24 to 300x100 with 0, 1 and 12 processes on 1, 2 and
//! 8 devices: every combination is drawn and checked for what must hold (every device
//! on screen, the table shows what fits, charts when there is room, the allocator one
//! hint line when nothing feeds it); a representative few are snapshotted.
//! Devices are the seeded simulated device, renamed per index; the processes are fixture
//! data (no source invents processes), with one growing 8 MiB per second.

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use vramtop::app::App;
use vramtop::telemetry::cgroup::CgroupOrigin;
use vramtop::telemetry::sim::{SimSource, WorkloadGauge};
use vramtop::telemetry::{HostView, ProcessKind, ProcessSnapshot, SystemSnapshot, TelemetrySource};

const SIZES: [(u16, u16); 4] = [(80, 24), (120, 40), (200, 60), (300, 100)];
const PROCESSES: [usize; 3] = [0, 1, 12];
const DEVICES: [u32; 3] = [1, 2, 8];
/// Polls applied before drawing, one second apart: enough for trends and chart columns.
const POLLS: u64 = 40;
const LEAK_PER_POLL: u64 = 8 << 20;

fn render(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal.draw(|f| vramtop::ui::draw(f, app)).expect("draw");
    vramtop::ui::buffer_text(terminal.backend().buffer())
}

fn process(pid: u32, used: u64, k: usize) -> ProcessSnapshot {
    let cgroup = match k % 4 {
        1 => Some(CgroupOrigin {
            runtime: Some("docker".into()),
            container_id: Some(format!("3f2a1b2c{k:056x}")),
            ..CgroupOrigin::default()
        }),
        2 => Some(CgroupOrigin {
            unit: Some("trainer.service".into()),
            slice: Some("system.slice".into()),
            ..CgroupOrigin::default()
        }),
        _ => None,
    };
    ProcessSnapshot {
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: Some(used),
        sm_util_pct: Some((k as u32 * 7) % 100),
        user: Some(if k % 3 == 0 { "alice" } else { "bob" }.to_string()),
        command: Some(format!("python train.py --rank {k}")),
        cpu_pct: Some(k as f32 * 8.5),
        rss_bytes: Some((k as u64 + 1) << 29),
        host_view: if k == 5 {
            HostView::OtherNamespace
        } else {
            HostView::Visible
        },
        cgroup,
        frameworks: None,
    }
}

/// Poll `poll` of a machine with `devices` devices and `processes` processes spread over
/// them; process 0 grows by 8 MiB a poll (a leak), the others hold still.
fn snapshot(devices: u32, processes: usize, poll: u64) -> SystemSnapshot {
    let mut source = SimSource::new(7, WorkloadGauge::default()).with_fixed_clock();
    let mut s = source.poll();
    s.hostname = "test-host".to_string();
    s.source = "fixture".to_string();
    s.taken_at_ms = 1_000_000 + poll * 1000;
    let template = s.devices[0].clone();
    s.devices = (0..devices)
        .map(|i| {
            let mut d = template.clone();
            d.index = i;
            d.simulated = false;
            d.name = format!("Fixture GPU {i}");
            d.gpu_util_pct = Some(((poll as u32 * 13) + i * 29) % 100);
            d
        })
        .collect();
    for k in 0..processes {
        let used = ((k as u64 % 5) + 1) << 30;
        let used = if k == 0 {
            used + poll * LEAK_PER_POLL
        } else {
            used
        };
        let d = &mut s.devices[k % devices as usize];
        d.processes.push(process(10_000 + k as u32, used, k));
    }
    for d in &mut s.devices {
        let held: u64 = d.processes.iter().filter_map(|p| p.used_memory_bytes).sum();
        d.memory_used_bytes = Some(held + (1 << 30));
        let total = d.memory_total_bytes.unwrap_or(0);
        let reserved = d.memory_reserved_bytes.unwrap_or(0);
        d.memory_free_bytes = Some(total.saturating_sub(held + (1 << 30) + reserved));
    }
    s
}

fn app_for(devices: u32, processes: usize) -> App {
    let mut app = App::new(1.0);
    for poll in 0..POLLS {
        app.apply_snapshot(snapshot(devices, processes, poll));
    }
    app
}

/// Rows of the process table on screen: lines holding one of the fixture's pids.
fn table_rows(screen: &str) -> usize {
    screen
        .lines()
        .filter(|l| {
            l.split(['│', ' '])
                .any(|word| (0..12).any(|k| word == (10_000 + k).to_string()))
        })
        .count()
}

#[test]
fn every_size_device_count_and_process_count_keeps_its_promises() {
    for (width, height) in SIZES {
        for devices in DEVICES {
            for processes in PROCESSES {
                let app = app_for(devices, processes);
                let screen = render(&app, width, height);
                let case = format!("{width}x{height}, {devices} devices, {processes} processes");
                for i in 0..devices {
                    assert!(
                        screen.contains(&format!("gpu{i}")),
                        "{case}: gpu{i} not on screen\n{screen}"
                    );
                }
                assert!(
                    screen.contains(&format!("processes · by memory · {processes} ")),
                    "{case}: table title\n{screen}"
                );
                // The table shows every process when the screen is tall enough, and at
                // least the first few on the smallest.
                let wanted = if height >= 60 {
                    processes
                } else {
                    processes.min(3)
                };
                assert!(
                    table_rows(&screen) >= wanted,
                    "{case}: {} of {wanted} process rows\n{screen}",
                    table_rows(&screen)
                );
                assert!(
                    screen.contains(" allocator  "),
                    "{case}: no allocator hint line\n{screen}"
                );
                assert!(
                    !screen.contains("no probe is running."),
                    "{case}: the old allocator panel takes rows\n{screen}"
                );
                // History charts with a time axis wherever each device has the room.
                if height >= 40 && devices <= 2 {
                    assert!(
                        screen.contains("memory: used") && screen.contains("now"),
                        "{case}: no history chart\n{screen}"
                    );
                }
                if processes == 12 && width >= 120 {
                    assert!(
                        screen.contains("docker 3f2a1b2c0000"),
                        "{case}: group\n{screen}"
                    );
                    assert!(
                        screen.contains("+8.0M/s↑"),
                        "{case}: the leaking process's trend\n{screen}"
                    );
                }
            }
        }
    }
}

#[test]
fn charts_grow_with_the_room() {
    let app = app_for(1, 1);
    let chart_rows = |screen: &str| {
        screen
            .lines()
            .filter(|l| l.contains('█') && !l.contains("mem "))
            .count()
    };
    let small = chart_rows(&render(&app, 80, 24));
    let large = chart_rows(&render(&app, 200, 60));
    assert!(
        large > small && large >= 10,
        "chart rows: {small} at 80x24, {large} at 200x60"
    );
}

#[test]
fn representative_layouts() {
    for (width, height, devices, processes) in [
        (80, 24, 1, 1),
        (120, 40, 2, 12),
        (200, 60, 1, 12),
        (200, 60, 8, 12),
        (300, 100, 2, 0),
        (80, 24, 8, 12),
    ] {
        let screen = render(&app_for(devices, processes), width, height);
        insta::assert_snapshot!(
            format!("layout_{width}x{height}_{devices}dev_{processes}proc"),
            screen
        );
    }
}

#[test]
fn the_smallest_accepted_terminal_still_lists_devices_and_processes() {
    for devices in DEVICES {
        let app = app_for(devices, 12);
        let screen = render(&app, vramtop::ui::MIN_WIDTH, vramtop::ui::MIN_HEIGHT);
        assert!(screen.contains("gpu0"), "{screen}");
        assert!(table_rows(&screen) >= 1, "{screen}");
    }
}
