//! A whole job, not single processes: a torchrun-like launcher (hooked, never initialises
//! CUDA) and two ranks, each a fake hook speaking the attach protocol over a real Unix
//! socket named after a real (sleeping) process, watched by the real attacher and shown
//! by the real app and screen.

#[path = "support/temp_dir.rs"]
mod temp_dir;
#[path = "support/hook_wire.rs"]
mod wire;

use wire::{read_json, send, sleeper, socket_dir};

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Child;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::Terminal;
use serde_json::json;
use vramtop::app::action::Action;
use vramtop::app::App;
use vramtop::attach::{AttachedJobs, Attacher, JobReport};
use vramtop::telemetry::sim::{SimSource, WorkloadGauge};
use vramtop::telemetry::TelemetrySource;

const MIB: u64 = 1 << 20;

/// One segment of `size` MiB holding `used` MiB at its start, the rest free.
fn segments(size: u64, used: u64) -> serde_json::Value {
    json!([{"address": 0x7f00_0000_0000u64, "total_size": size * MIB, "stream": 0,
            "segment_type": "large", "is_expandable": false,
            "blocks": [
              {"address": 0x7f00_0000_0000u64, "size": used * MIB, "requested_size": used * MIB,
               "state": "active_allocated", "site": null},
              {"address": 0x7f00_0000_0000u64 + used * MIB, "size": (size - used) * MIB,
               "requested_size": 0, "state": "inactive", "site": null}]}])
}

/// What a fake hook is: the launcher (no rank, no CUDA) or a rank with its memory.
#[derive(Clone, Copy)]
struct Role {
    rank: Option<u32>,
    /// Reserved and allocated MiB (one segment).
    reserved: u64,
    allocated: u64,
}

/// A fake hook for `pid`, child of `ppid`: says hello, sends one state when it has CUDA,
/// then sends an OOM each time it is told to, and keeps the connection open.
fn fake_hook(dir: &Path, pid: u32, ppid: u32, role: Role) -> mpsc::Sender<()> {
    let listener = UnixListener::bind(dir.join(format!("vramtop-{pid}.sock"))).expect("bind");
    let (tell, told) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let cuda = role.rank.is_some();
        let argv = if cuda {
            json!(["python3", "/work/train.py", "--lr", "1"])
        } else {
            json!([
                "/usr/bin/python3",
                "/usr/local/bin/torchrun",
                "--nproc-per-node",
                "2",
                "train.py"
            ])
        };
        send(
            &mut stream,
            &json!({"type": "hello", "protocol": 1, "pid": pid, "ppid": ppid, "argv": argv,
                    "hook_version": "test", "torch_version": "2.11.0", "cuda_ready": cuda,
                    "history": false, "capabilities": [], "missing": [],
                    "rank": role.rank, "local_rank": role.rank,
                    "world_size": role.rank.map(|_| 2)}),
        );
        let _ = read_json(&mut stream);
        let stats = json!({"allocated_bytes": role.allocated * MIB,
                           "reserved_bytes": role.reserved * MIB, "num_ooms": 0});
        if cuda {
            send(
                &mut stream,
                &json!({"type": "state", "seq": 1, "time_s": 1.0, "device": 0, "stats": stats,
                        "settings": {"expandable_segments": false},
                        "segments": segments(role.reserved, role.allocated),
                        "truncated": false}),
            );
        }
        let mut seq = 1.0;
        while told.recv().is_ok() {
            seq += 1.0;
            send(
                &mut stream,
                &json!({"type": "oom", "time_s": seq, "device": 0,
                        "requested_bytes": 4096 * MIB, "device_free_bytes": 0,
                        "device_total_bytes": 80u64 << 30, "stats": stats,
                        "segments": segments(role.reserved, role.allocated),
                        "truncated": false}),
            );
        }
    });
    tell
}

fn wait_for(
    attacher: &Attacher,
    what: &str,
    done: impl Fn(&AttachedJobs) -> bool,
) -> Arc<AttachedJobs> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let jobs = attacher.snapshot();
        if done(&jobs) {
            return jobs;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {jobs:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn render(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal.draw(|f| vramtop::ui::draw(f, app)).expect("draw");
    vramtop::ui::buffer_text(terminal.backend().buffer())
}

fn app() -> App {
    let mut source = SimSource::new(7, WorkloadGauge::default()).with_fixed_clock();
    let mut app = App::new(1.0);
    for _ in 0..5 {
        app.apply_snapshot(source.poll());
    }
    app
}

/// The job under test: a launcher and ranks 0 and 1 (rank 1 holds more), their fake
/// hooks' OOM triggers, and the processes to end.
struct Job {
    dir: temp_dir::TempDir,
    launcher: u32,
    ranks: [u32; 2],
    oom: [mpsc::Sender<()>; 2],
    processes: Vec<Child>,
    _launcher_hook: mpsc::Sender<()>,
}

impl Job {
    fn start(name: &str) -> Job {
        let dir = socket_dir("ranks", name);
        let processes: Vec<Child> = (0..3).map(|_| sleeper()).collect();
        let [launcher, r0, r1] = [processes[0].id(), processes[1].id(), processes[2].id()];
        let me = std::process::id();
        let launcher_hook = fake_hook(
            &dir,
            launcher,
            me,
            Role {
                rank: None,
                reserved: 0,
                allocated: 0,
            },
        );
        // Rank 1 is listed first on purpose: the selection goes by rank, not by pid.
        let oom1 = fake_hook(
            &dir,
            r1,
            launcher,
            Role {
                rank: Some(1),
                reserved: 100,
                allocated: 60,
            },
        );
        let oom0 = fake_hook(
            &dir,
            r0,
            launcher,
            Role {
                rank: Some(0),
                reserved: 40,
                allocated: 30,
            },
        );
        Job {
            dir,
            launcher,
            ranks: [r0, r1],
            oom: [oom0, oom1],
            processes,
            _launcher_hook: launcher_hook,
        }
    }

    fn attacher(&self) -> Attacher {
        Attacher::spawn(self.dir.to_path_buf(), Duration::from_millis(50)).expect("attacher")
    }

    fn all_in(&self, jobs: &AttachedJobs) -> bool {
        jobs.get(self.launcher).is_some_and(|j| j.hello.is_some())
            && self
                .ranks
                .iter()
                .all(|&pid| jobs.get(pid).is_some_and(|j| j.frame.is_some()))
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for p in &mut self.processes {
            let _ = p.kill();
            let _ = p.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn run_opens_on_the_jobs_lowest_rank_with_every_rank_in_the_overview() {
    let job = Job::start("overview");
    let attacher = job.attacher();
    let mut app = app();
    // `vramtop run -- torchrun ...` focuses the launcher it started.
    app.focus_pid = Some(job.launcher);
    let jobs = wait_for(&attacher, "the launcher and both ranks", |j| job.all_in(j));
    app.apply_attached(jobs);

    assert_eq!(
        app.shown_job().map(|j| j.pid),
        Some(job.ranks[0]),
        "rank 0 is shown"
    );
    assert!(
        app.rows.iter().all(|r| r.process.pid != job.launcher),
        "the launcher is the job's parent, not a GPU process"
    );
    let group = app.shown_ranks().expect("the job's ranks");
    assert_eq!(group.parent_pid, Some(job.launcher));
    assert_eq!(
        group.ranks.iter().map(|j| j.pid).collect::<Vec<_>>(),
        job.ranks
    );

    let screen = render(&app, 200, 60);
    assert!(
        screen.contains(&format!("2 ranks (world 2) · launcher {}", job.launcher)),
        "{screen}"
    );
    assert!(
        screen.contains("job torchrun --nproc-per-node 2 train.py"),
        "{screen}"
    );
    // One row per rank, with PyTorch's own reserved and allocated.
    let row = |pid: u32| {
        screen
            .lines()
            .find(|l| l.contains(&format!(" {pid} ")) && l.contains("running"))
            .unwrap_or_else(|| panic!("no overview row for {pid}: {screen}"))
            .to_string()
    };
    let r0 = row(job.ranks[0]);
    assert!(
        r0.contains("▶ 0") && r0.contains("40.0 MiB") && r0.contains("30.0 MiB"),
        "{r0}"
    );
    let r1 = row(job.ranks[1]);
    assert!(
        r1.contains("  1 ") && r1.contains("100.0 MiB") && r1.contains("60.0 MiB"),
        "{r1}"
    );
    // 200 columns hold both ranks' maps side by side, on one scale.
    assert!(
        screen.contains("ranks side by side, same scale"),
        "{screen}"
    );
    assert!(
        screen.contains(&format!("rank 1 · pid {}", job.ranks[1])),
        "{screen}"
    );

    // Number keys and Tab choose a rank.
    app.handle(Action::SelectRank(1));
    assert_eq!(app.shown_job().map(|j| j.pid), Some(job.ranks[1]));
    app.handle(Action::NextDevice);
    assert_eq!(app.shown_job().map(|j| j.pid), Some(job.ranks[0]));
    app.handle(Action::PrevDevice);
    assert_eq!(app.shown_job().map(|j| j.pid), Some(job.ranks[1]));
    // A rank that is not there leaves the choice alone.
    app.handle(Action::SelectRank(7));
    assert_eq!(app.shown_job().map(|j| j.pid), Some(job.ranks[1]));

    // Narrow: the chosen rank's own region under the overview.
    let narrow = render(&app, 100, 50);
    assert!(!narrow.contains("ranks side by side"), "{narrow}");
    assert!(narrow.contains("2 ranks (world 2)"), "{narrow}");
}

#[test]
fn an_oom_on_rank_1_takes_the_view_there_and_says_which_rank() {
    let job = Job::start("oom");
    let attacher = job.attacher();
    let mut app = app();
    app.focus_pid = Some(job.launcher);
    app.apply_attached(wait_for(&attacher, "the job", |j| job.all_in(j)));
    assert_eq!(app.shown_job().map(|j| j.pid), Some(job.ranks[0]));

    job.oom[1].send(()).expect("rank 1's hook");
    let r1 = job.ranks[1];
    app.apply_attached(wait_for(&attacher, "rank 1's OOM", |j| {
        j.get(r1).is_some_and(|v| v.oom.is_some())
    }));
    assert_eq!(
        app.shown_job().map(|j| j.pid),
        Some(r1),
        "the view went to rank 1"
    );
    let screen = render(&app, 200, 60);
    assert!(
        screen.contains(&format!("rank 1 (pid {r1}) ran out of memory")),
        "{screen}"
    );
    assert!(screen.contains("OOM: needed 4.0 GiB"), "{screen}");

    // The user goes back to rank 0: the same OOM, seen again, does not pull the view.
    app.handle(Action::SelectRank(0));
    app.apply_attached(attacher.snapshot());
    assert_eq!(app.shown_job().map(|j| j.pid), Some(job.ranks[0]));
}

#[test]
fn json_and_attach_lines_name_ranks_and_the_launcher() {
    let job = Job::start("json");
    let attacher = job.attacher();
    let jobs = wait_for(&attacher, "the job", |j| job.all_in(j));
    let reports = JobReport::of_all(&jobs.jobs);
    let report = |pid: u32| {
        let r = reports.iter().find(|r| r.pid == pid).expect("a report");
        serde_json::to_value(r).expect("json")
    };
    let launcher = report(job.launcher);
    assert_eq!(launcher["launcher"], true);
    assert_eq!(launcher["rank"], serde_json::Value::Null);
    assert_eq!(launcher["world_size"], serde_json::Value::Null);
    for (rank, &pid) in job.ranks.iter().enumerate() {
        let r = report(pid);
        assert_eq!(r["rank"], rank as u64);
        assert_eq!(r["local_rank"], rank as u64);
        assert_eq!(r["world_size"], 2);
        assert_eq!(r["launcher"], false);
        assert_eq!(r["ppid"], job.launcher);
    }
    assert_eq!(report(job.ranks[1])["stats"]["reserved_bytes"], 100 * MIB);

    let line = |pid: u32| {
        vramtop::attach::summary::job_line(
            jobs.get(pid).expect("job"),
            &jobs.jobs,
            vramtop::advice::line_with,
        )
    };
    let l = line(job.launcher);
    assert!(
        l.contains("launcher of ranks 0, 1 (no CUDA: the job's parent, on no GPU)"),
        "{l}"
    );
    let l = line(job.ranks[1]);
    assert!(l.contains("rank 1/2 (local 1)"), "{l}");
    assert!(
        l.contains("gpu 0") && l.contains("reserved 100.0 MiB") && l.contains("allocated 60.0 MiB"),
        "{l}"
    );
}

#[test]
fn enter_on_a_rank_opens_its_screen_over_time_with_its_oom_marked() {
    let job = Job::start("screen");
    let attacher = job.attacher();
    let mut source = SimSource::new(7, WorkloadGauge::default()).with_fixed_clock();
    let mut app = App::new(1.0);
    app.focus_pid = Some(job.launcher);
    app.apply_attached(wait_for(&attacher, "the job", |j| job.all_in(j)));
    app.handle(Action::SelectRank(1));
    let r1 = job.ranks[1];
    for _ in 0..5 {
        app.apply_snapshot(source.poll());
    }
    job.oom[1].send(()).expect("rank 1's hook");
    app.apply_attached(wait_for(&attacher, "rank 1's OOM", |j| {
        j.get(r1).is_some_and(|v| v.oom.is_some())
    }));
    for _ in 0..3 {
        app.apply_snapshot(source.poll());
    }

    app.handle(Action::ToggleSegmentList);
    assert_eq!(app.process_screen, Some(r1));
    let history = app.process_history.get(r1).expect("rank 1 followed");
    assert_eq!(history.torch.len(), 8, "one sample per poll");
    assert_eq!(
        history.torch.latest(),
        Some((Some(60 * MIB), Some(40 * MIB))),
        "PyTorch's allocated, and reserved above it"
    );
    let screen = render(&app, 120, 40);
    assert!(
        screen.contains(&format!("process {r1} · rank 1")),
        "{screen}"
    );
    assert!(
        screen.contains("PyTorch allocated █ reserved ▓"),
        "{screen}"
    );
    assert!(screen.contains("now 60.0 MiB / 100.0 MiB"), "{screen}");
    // The OOM came between the 5th and 6th poll: marked once, 3 polls before now.
    assert_eq!(
        screen.matches('✖').count(),
        2,
        "the mark and its legend: {screen}"
    );
    assert!(screen.contains("✖ out of memory at -2s"), "{screen}");
    assert!(
        !screen.contains("2 ranks (world 2)"),
        "the screen replaces the overview"
    );

    // Small and odd terminals draw without panicking, on the screen and off it.
    for (w, h) in [(60, 16), (61, 17), (80, 24), (200, 18), (300, 100)] {
        render(&app, w, h);
    }
    app.handle(Action::ToggleSegmentList);
    assert!(
        render(&app, 120, 40).contains("2 ranks (world 2)"),
        "Enter returns"
    );
    for (w, h) in [(60, 16), (61, 17), (80, 24), (120, 20), (200, 18)] {
        render(&app, w, h);
    }
}

/// A rank as the attacher shows it before and after it initialises CUDA.
fn rank_view(pid: u32, launcher: u32, rank: u32, cuda: bool) -> vramtop::attach::JobView {
    use vramtop::attach::protocol::Hello;
    vramtop::attach::JobView {
        pid,
        connected: true,
        hello: Some(Hello {
            protocol: 1,
            pid,
            ppid: Some(launcher),
            argv: vec!["python3".into(), "train.py".into()],
            cuda_ready: cuda,
            rank: Some(rank),
            local_rank: Some(rank),
            world_size: Some(2),
            ..Hello::default()
        }),
        ..Default::default()
    }
}

#[test]
fn the_job_opens_on_rank_0_even_when_rank_1_initialises_cuda_first() {
    let (launcher, r0, r1) = (900_001, 900_002, 900_003);
    let mut app = app();
    app.focus_pid = Some(launcher);
    let jobs = |rank0_ready: bool| {
        let mut launcher_view = rank_view(launcher, 1, 0, false);
        if let Some(h) = launcher_view.hello.as_mut() {
            h.rank = None;
            h.local_rank = None;
            h.world_size = None;
        }
        Arc::new(AttachedJobs {
            jobs: vec![
                launcher_view,
                rank_view(r0, launcher, 0, rank0_ready),
                rank_view(r1, launcher, 1, true),
            ],
            scan_error: None,
            scans: 1,
        })
    };
    app.apply_attached(jobs(false));
    assert_eq!(
        app.shown_job().map(|j| j.pid),
        Some(r1),
        "rank 1 is the only one with CUDA"
    );
    assert_eq!(app.focus_pid, Some(launcher), "the focus waits for rank 0");
    app.apply_attached(jobs(true));
    assert_eq!(
        app.shown_job().map(|j| j.pid),
        Some(r0),
        "rank 0 takes the view"
    );
    assert_eq!(app.focus_pid, None);
    // From then on the user's choice stays.
    app.handle(Action::SelectRank(1));
    app.apply_attached(jobs(true));
    assert_eq!(app.shown_job().map(|j| j.pid), Some(r1));
}

/// A 1 GiB request the device could not give, at `time_s`, as the attacher explains it.
fn oom_at(time_s: f64) -> Arc<vramtop::attach::job::OomExplained> {
    use vramtop::attach::protocol::{AllocatorSettings, OomState};
    Arc::new(vramtop::attach::job::OomExplained::from_oom(&OomState {
        time_s,
        device: 0,
        requested_bytes: 1 << 30,
        device_free_bytes: Some(0),
        device_total_bytes: Some(80 << 30),
        stats: None,
        segments: Vec::new(),
        truncated: false,
        summary: None,
        settings: AllocatorSettings::default(),
        ring: None,
        kept_path: None,
        device_uuid: None,
        ..Default::default()
    }))
}

/// An OOM already over when a job is first seen, or one in another launch, leaves the
/// view where it is.
#[test]
fn old_ooms_and_other_jobs_ooms_leave_the_view_alone() {
    let oom = |time_s: f64| Some(oom_at(time_s));
    // Job A (launcher 1000): ranks 0 and 1; job B (launcher 2000): ranks 0 and 1.
    let jobs = |b1_oom: Option<f64>, a1_oom: Option<f64>| {
        let mut views = vec![
            rank_view(1001, 1000, 0, true),
            rank_view(1002, 1000, 1, true),
            rank_view(2001, 2000, 0, true),
            rank_view(2002, 2000, 1, true),
        ];
        views[1].oom = a1_oom.and_then(oom);
        views[3].oom = b1_oom.and_then(oom);
        Arc::new(AttachedJobs {
            jobs: views,
            scan_error: None,
            scans: 1,
        })
    };
    let mut app = app();
    // First seen with an old OOM on job A's rank 1: not news.
    app.focus_pid = Some(1000);
    app.apply_attached(jobs(None, Some(5.0)));
    assert_eq!(app.shown_job().map(|j| j.pid), Some(1001));
    assert_eq!(app.rank_oom, None);
    // Job B's rank 1 runs out of memory: A stays on screen.
    app.apply_attached(jobs(Some(9.0), Some(5.0)));
    assert_eq!(app.shown_job().map(|j| j.pid), Some(1001));
    assert_eq!(app.rank_oom, None);
    assert!(!render(&app, 200, 60).contains("ran out of memory"));
    // A's rank 1 runs out of memory again: the view goes there.
    app.apply_attached(jobs(Some(9.0), Some(12.0)));
    assert_eq!(app.shown_job().map(|j| j.pid), Some(1002));
    let screen = render(&app, 200, 60);
    assert!(
        screen.contains("rank 1 (pid 1002) ran out of memory"),
        "{screen}"
    );
}

#[test]
fn a_rank_that_dies_of_its_oom_keeps_the_mark_on_its_screen() {
    use vramtop::attach::protocol::AllocatorSettings;
    let mut source = SimSource::new(7, WorkloadGauge::default()).with_fixed_clock();
    let mut app = App::new(1.0);
    let mut rank = rank_view(3001, 3000, 0, true);
    let frame = |view: &mut vramtop::attach::JobView| {
        use vramtop::attach::job::JobFrame;
        use vramtop::attach::protocol::JobState;
        view.frame = Some(Arc::new(JobFrame::from_state(&JobState {
            seq: 1,
            device_uuid: None,
            time_s: 1.0,
            device: 0,
            stats: None,
            settings: AllocatorSettings::default(),
            segments: Vec::new(),
            segments_omitted: false,
            truncated: false,
            collect_ms: None,
            history_share: None,
            roles: None,
        })));
    };
    frame(&mut rank);
    let publish = |app: &mut App, view: &vramtop::attach::JobView| {
        app.apply_attached(Arc::new(AttachedJobs {
            jobs: vec![view.clone()],
            scan_error: None,
            scans: 1,
        }))
    };
    publish(&mut app, &rank);
    app.apply_snapshot(source.poll());
    // Within one poll: the OOM, and the process ends of it.
    rank.oom = Some(oom_at(2.0));
    rank.ended = true;
    publish(&mut app, &rank);
    app.apply_snapshot(source.poll());
    let history = app.process_history.get(3001).expect("followed");
    assert_eq!(
        history.marks.latest(),
        Some(vramtop::app::process_history::Mark::Oom)
    );
    assert_eq!(
        history.torch.latest(),
        Some((None, None)),
        "no figures once ended"
    );
}
