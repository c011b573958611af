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
    vramtop::ui::buffer_text(terminal.backend().buffer())
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
        cgroup: None,
        frameworks: None,
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

fn finished_probe_view(policies: &[vramtop::alloc::PolicyKind]) -> vramtop::probe::live::ProbeView {
    use vramtop::backing::BackingChoice;
    use vramtop::probe::live::{PolicyView, ProbeView};
    use vramtop::probe::{setup, Scenario};
    let scenario = Scenario::load("checkerboard").expect("built-in");
    let mut set = setup::build(
        &scenario,
        policies,
        BackingChoice::Bookkeeping,
        Some(256 << 20),
        1,
    )
    .expect("backing");
    let views = set
        .probes
        .iter_mut()
        .map(|p| {
            p.run(None);
            let mut report = p.report();
            report.elapsed_s = 0.0;
            PolicyView {
                layout: p.allocator().layout(),
                stats: report.stats.clone(),
                report,
                frag_history: vec![0, 100, 500, 900],
                ..Default::default()
            }
        })
        .collect();
    ProbeView {
        policies: views,
        paused: false,
        ops_per_s: 200.0,
        done: true,
        recording: None,
        tour: None,
    }
}

#[test]
fn checkerboard_probe_shows_the_oom_with_free_memory() {
    let mut app = idle_app();
    app.apply_probe(finished_probe_view(&[vramtop::alloc::PolicyKind::Caching]));
    for (w, h) in [(120, 40), (80, 24)] {
        let screen = render(&app, w, h);
        assert!(
            screen.contains("OOM: needed 24.0 MiB contiguous"),
            "{w}x{h}:\n{screen}"
        );
        assert!(screen.contains("probe checkerboard"), "{w}x{h}");
        insta::assert_snapshot!(format!("probe_checkerboard_{w}x{h}"), screen);
    }
}

#[test]
fn compare_shows_one_policy_failing_where_the_other_succeeds() {
    use vramtop::alloc::PolicyKind;
    let mut app = idle_app();
    app.apply_probe(finished_probe_view(&[
        PolicyKind::Caching,
        PolicyKind::Expandable,
    ]));
    let screen = render(&app, 160, 45);
    assert!(screen.contains("caching · OOM"), "{screen}");
    assert!(screen.contains("expandable · ok"), "{screen}");
    insta::assert_snapshot!("compare_caching_expandable_160x45", screen);
}

#[test]
fn segment_list_opens_on_enter() {
    let mut app = idle_app();
    app.apply_probe(finished_probe_view(&[vramtop::alloc::PolicyKind::Caching]));
    app.handle(Action::NextSegment);
    app.handle(Action::ToggleSegmentList);
    let screen = render(&app, 120, 40);
    assert!(screen.contains("segment 0"), "{screen}");
    // Movement keys move in the block list while it is open, not in the process table.
    assert_eq!(app.segment_table.selected(), Some(0));
    app.handle(Action::ScrollDown);
    app.handle(Action::ScrollDown);
    assert_eq!(app.segment_table.selected(), Some(2));
    app.handle(Action::Bottom);
    let runs = app
        .probe
        .as_ref()
        .map_or(0, |p| p.policies[0].layout.segments[0].runs.len());
    assert_eq!(app.segment_table.selected(), Some(runs - 1));
    app.handle(Action::CloseOverlay);
    assert!(!app.views.contains(vramtop::app::View::SegmentList));
}

#[test]
fn leaks_view_points_at_the_leaking_site_of_the_leak_probe() {
    use std::sync::Arc;
    use vramtop::alloc::{AllocConfig, Allocator, PolicyKind};
    use vramtop::backing::BookkeepingBacking;
    use vramtop::leaks::{usage_samples, DetectorConfig, LeakDetector};
    use vramtop::probe::live::{PolicyView, ProbeView};
    use vramtop::probe::{Probe, Scenario};

    let scenario = Scenario::load("leak").expect("built-in");
    let allocator = Arc::new(Allocator::new(
        PolicyKind::Caching,
        Box::new(BookkeepingBacking::new(1 << 30)),
        AllocConfig::default(),
    ));
    let mut probe = Probe::new(&scenario, allocator, "bookkeeping", 1);
    let mut detector = LeakDetector::new(DetectorConfig::default());
    let (mut last, mut windows, mut flagged_at) = (None, 0u64, None);
    while probe.step() {
        if last != Some(probe.window()) {
            last = Some(probe.window());
            windows += 1;
            detector.observe(
                windows,
                &usage_samples(&probe.allocator().live_bytes_by_tag()),
            );
            detector.close_window();
            if flagged_at.is_none() && !detector.suspects().is_empty() {
                flagged_at = probe.report().step;
            }
        }
    }
    let suspects = detector.suspects();
    assert_eq!(suspects.len(), 1, "{suspects:?}");
    assert_eq!(suspects[0].tag, "leak: kept output");
    let (step, _) = flagged_at.expect("flagged during the run");
    assert!(step <= 5, "flagged only at step {step}");

    let mut app = idle_app();
    let report = probe.report();
    app.apply_probe(ProbeView {
        policies: vec![PolicyView {
            layout: probe.allocator().layout(),
            stats: report.stats.clone(),
            report,
            suspects,
            sites: detector.sites(),
            ..Default::default()
        }],
        done: true,
        ..Default::default()
    });
    app.handle(Action::ToggleLeaksView);
    let screen = render(&app, 120, 40);
    assert!(screen.contains("leak suspects"), "{screen}");
    assert!(screen.contains("leak: kept output"), "{screen}");
}

#[test]
fn an_attached_job_shows_its_segments_and_its_oom() {
    use std::sync::Arc;
    use vramtop::attach::job::{AttachedJob, JobFrame, OomExplained};
    use vramtop::attach::protocol::{
        AllocatorSettings, ErrorReport, Hello, HookBlock, HookSegment, JobState, OomState,
    };
    use vramtop::attach::AttachedJobs;

    const MIB: u64 = 1 << 20;
    // 6 MiB tensors with every other one freed, in 20 MiB segments: the OOM job.
    let segments: Vec<HookSegment> = (0..12u64)
        .map(|i| {
            let base = 0x7f00_0000_0000 + i * 20 * MIB;
            let block = |at: u64, size: u64, state: &str| HookBlock {
                address: base + at,
                size,
                requested_size: size,
                state: state.to_string(),
                site: None,
            };
            HookSegment {
                address: base,
                total_size: 20 * MIB,
                stream: 0,
                segment_type: "large".to_string(),
                is_expandable: false,
                blocks: vec![
                    block(0, 6 * MIB, "active_allocated"),
                    block(6 * MIB, 6 * MIB, "inactive"),
                    block(12 * MIB, 6 * MIB, "active_allocated"),
                    block(18 * MIB, 2 * MIB, "inactive"),
                ],
            }
        })
        .collect();
    let mut job = AttachedJob::new(4242, 1.0);
    job.on_hello(Hello {
        protocol: 1,
        pid: 4242,
        ppid: Some(1),
        argv: vec!["python".into(), "oom_cap.py".into()],
        hook_version: "test".into(),
        torch_version: Some("2.11.0".into()),
        cuda_ready: true,
        // With history, sampled: the header says what share of allocations has sites.
        history: true,
        capabilities: Vec::new(),
        missing: Vec::new(),
        ..Hello::default()
    });
    job.on_frame(JobFrame::from_state(&JobState {
        seq: 1,
        device_uuid: None,
        time_s: 1.0,
        device: 0,
        stats: None,
        settings: AllocatorSettings::default(),
        segments: segments.clone(),
        segments_omitted: false,
        truncated: false,
        collect_ms: None,
        history_share: Some(0.25),
        roles: None,
    }));
    job.on_oom(OomExplained::from_oom(&OomState {
        time_s: 2.0,
        device: 0,
        requested_bytes: 64 * MIB,
        device_free_bytes: Some(70 << 30),
        device_total_bytes: Some(240 * MIB),
        stats: None,
        segments,
        truncated: false,
        summary: None,
        settings: AllocatorSettings::default(),
        ring: None,
        kept_path: None,
        device_uuid: None,
        ..Default::default()
    }));
    job.on_error(ErrorReport {
        time_s: 2.0,
        kind: "OutOfMemoryError".into(),
        message: "CUDA out of memory. Tried to allocate 64.00 MiB. Of the allocated memory \
                  144.00 MiB is allocated by PyTorch, and 96.00 MiB is reserved by PyTorch \
                  but unallocated."
            .into(),
        ..ErrorReport::default()
    });
    let mut app = idle_app();
    app.focus_pid = Some(4242);
    app.apply_attached(Arc::new(AttachedJobs {
        jobs: vec![job.view.clone()],
        scan_error: None,
        scans: 1,
    }));
    assert_eq!(app.shown_job().map(|j| j.pid), Some(4242));
    let screen = render(&app, 120, 40);
    assert!(screen.contains("python oom_cap.py"), "{screen}");
    assert!(screen.contains("⚓"), "the hooked row is marked: {screen}");
    assert!(screen.contains("last OOM: needed 64.0 MiB"), "{screen}");
    assert!(
        screen
            .contains("OOM: needed 64.0 MiB contiguous; 96.0 MiB free in 24 runs, largest 6.0 MiB"),
        "{screen}"
    );
    assert!(screen.contains("PyTorch: CUDA out of memory."), "{screen}");
    // 24 live 6 MiB tensors: 208 MiB with the request packed tight, within the 240 MiB
    // cap; 960 MiB if each kept its own 20 MiB pages. One state cannot tell which.
    assert!(
        screen.contains("cannot tell expandable_segments:True one state does not settle it"),
        "{screen}"
    );
    // The memory fraction stopped it (the device had 70 GiB free): the GC threshold is
    // weighed, and empty_cache() in the job itself never helps.
    assert!(
        screen.contains("cannot tell garbage_collection_threshold:0.6 under a memory fraction"),
        "{screen}"
    );
    assert!(screen.contains("fails       empty_cache()"), "{screen}");
    assert!(
        screen.contains("what would: a request of at most 6.0 MiB fits now"),
        "{screen}"
    );
    assert!(screen.contains("12 segments"), "{screen}");
    insta::assert_snapshot!("attached_job_oom_120x40", screen);
}

#[test]
fn a_job_under_cuda_malloc_async_shows_its_totals_and_why_there_is_no_map() {
    use std::sync::Arc;
    use vramtop::attach::job::{AttachedJob, JobFrame};
    use vramtop::attach::protocol::{ErrorReport, Hello, JobState, TorchStats, UntrackedOom};
    use vramtop::attach::AttachedJobs;

    const GIB: u64 = 1 << 30;
    let mut job = AttachedJob::new(5151, 1.0);
    job.on_hello(Hello {
        protocol: 1,
        pid: 5151,
        ppid: Some(1),
        argv: vec!["python".into(), "train.py".into()],
        hook_version: "test".into(),
        torch_version: Some("2.11.0".into()),
        cuda_ready: true,
        allocator_backend: Some("cudaMallocAsync".into()),
        ..Hello::default()
    });
    // What the hook sends under this backend: the totals of memory_stats, no segments.
    job.on_frame(JobFrame::from_state(&JobState {
        seq: 1,
        time_s: 1.0,
        stats: Some(TorchStats {
            allocated_bytes: Some(6 * GIB),
            reserved_bytes: Some(7 * GIB),
            ..TorchStats::default()
        }),
        ..JobState::default()
    }));
    let mut app = idle_app();
    app.focus_pid = Some(5151);
    app.apply_attached(Arc::new(AttachedJobs {
        jobs: vec![job.view.clone()],
        scan_error: None,
        scans: 1,
    }));
    let screen = render(&app, 120, 40);
    assert!(
        screen.contains("backend:cudaMallocAsync · allocated 6.0 GiB · reserved 7.0 GiB"),
        "{screen}"
    );
    assert!(screen.contains("no map, no history"), "{screen}");
    // Not the native job's head and map: nothing reserved, no OOM.
    assert!(!screen.contains("reserved 0 B"), "{screen}");
    assert!(!screen.contains("last OOM: none"), "{screen}");
    // `vramtop attach`'s line: the totals, not a map's "largest free 0 B · frag 0.00".
    let views = [job.view.clone()];
    let line = vramtop::attach::summary::job_line(&views[0], &views, vramtop::advice::line_with);
    assert!(
        line.contains(
            "backend:cudaMallocAsync, no segments or OOM state · reserved 7.0 GiB · allocated 6.0 GiB"
        ),
        "{line}"
    );
    assert!(!line.contains("largest free"), "{line}");

    // PyTorch's message (H200, PyTorch 2.11): all this backend gives at an OOM.
    let words = |asked: &str| {
        format!(
            "Allocation on device 0 would exceed allowed memory. (out of memory)\n\
             Currently allocated     : 6.00 GiB\nRequested               : {asked}\n\
             Device limit            : 139.80 GiB\nFree (according to CUDA): 122.17 GiB\n\
             PyTorch limit (set by user-supplied memory fraction)\n                        : \
             6.99 GiB"
        )
    };
    // An OOM the job catches (hook 1.11 sees it as PyTorch makes it): numbered, its figures;
    // not called caught while the job runs (it may still be unwinding to its end).
    job.on_untracked_oom(UntrackedOom {
        time_s: 1.5,
        number: 1,
        message: words("2.00 GiB"),
    });
    app.apply_attached(Arc::new(AttachedJobs {
        jobs: vec![job.view.clone()],
        scan_error: None,
        scans: 2,
    }));
    let screen = render(&app, 120, 40);
    assert!(
        screen
            .contains("OOM 1: needed 2.00 GiB · cause: the job's live tensors (6.00 GiB) and the"),
        "{screen}"
    );
    assert!(
        screen.contains("PyTorch: Allocation on device 0"),
        "{screen}"
    );
    // It dies of the next one: that one is shown, as PyTorch's error, with no number.
    job.on_untracked_oom(UntrackedOom {
        time_s: 2.0,
        number: 2,
        message: words("1024.00 MiB"),
    });
    job.on_error(ErrorReport {
        time_s: 2.0,
        kind: "OutOfMemoryError".into(),
        message: words("1024.00 MiB"),
        oom_number: Some(2),
    });
    app.apply_attached(Arc::new(AttachedJobs {
        jobs: vec![job.view.clone()],
        scan_error: None,
        scans: 3,
    }));
    let screen = render(&app, 120, 40);
    assert!(
        screen.contains("OOM: needed 1.00 GiB · cause: the job's live tensors (6.00 GiB) and the"),
        "{screen}"
    );
    // Counted as the hook numbered them (the ranks table's column): PyTorch counts none
    // under this backend.
    assert_eq!(job.view.figures().expect("figures").ooms, 2);
    assert!(
        screen.contains("PyTorch: Allocation on device 0"),
        "{screen}"
    );
    let views = [job.view.clone()];
    let line = vramtop::attach::summary::job_line(&views[0], &views, vramtop::advice::line_with);
    assert!(
        line.contains("OOM (cudaMallocAsync): needed 1.00 GiB; cause: the job's live tensors"),
        "{line}"
    );

    // A job that caught its OOM and ended well: that one, said to be caught.
    let mut caught = AttachedJob::new(5152, 1.0);
    caught.on_hello(job.view.hello.clone().expect("hello"));
    caught.on_untracked_oom(UntrackedOom {
        time_s: 1.5,
        number: 1,
        message: words("2.00 GiB"),
    });
    caught.on_bye(vramtop::attach::protocol::Bye {
        time_s: 3.0,
        exit_code: Some(0),
    });
    app.focus_pid = Some(5152);
    app.apply_attached(Arc::new(AttachedJobs {
        jobs: vec![caught.view.clone()],
        scan_error: None,
        scans: 4,
    }));
    let screen = render(&app, 120, 40);
    assert!(
        screen.contains("OOM 1 (the job caught it): needed 2.00 GiB · cause: the job's live"),
        "{screen}"
    );
    let views = [caught.view.clone()];
    let line = vramtop::attach::summary::job_line(&views[0], &views, vramtop::advice::line_with);
    assert!(
        line.contains("OOM (cudaMallocAsync 1, caught by the job): needed 2.00 GiB"),
        "{line}"
    );

    // One that caught OOM 1, then died of another error: that OOM's number and figures
    // together, not said to be caught (the job failed), and the error it died of too.
    let mut failed = AttachedJob::new(5153, 1.0);
    failed.on_hello(job.view.hello.clone().expect("hello"));
    failed.on_untracked_oom(UntrackedOom {
        time_s: 1.5,
        number: 1,
        message: words("2.00 GiB"),
    });
    failed.on_error(ErrorReport {
        time_s: 2.5,
        kind: "ValueError".into(),
        message: "loss is nan".into(),
        oom_number: None,
    });
    failed.on_bye(vramtop::attach::protocol::Bye {
        time_s: 3.0,
        exit_code: Some(1),
    });
    app.focus_pid = Some(5153);
    app.apply_attached(Arc::new(AttachedJobs {
        jobs: vec![failed.view.clone()],
        scan_error: None,
        scans: 5,
    }));
    let screen = render(&app, 120, 40);
    assert!(
        screen.contains("OOM 1: needed 2.00 GiB · cause: the job's live tensors"),
        "{screen}"
    );
    assert!(!screen.contains("caught it"), "{screen}");
    assert!(screen.contains("PyTorch: loss is nan"), "{screen}");
}
