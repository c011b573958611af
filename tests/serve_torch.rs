//! `vramtop serve` exporting hooked PyTorch jobs: a torchrun-like fleet of fake hooks (a
//! launcher and two ranks, Rust servers speaking the attach protocol over real Unix
//! sockets named after real sleeping processes), the real binary serving /metrics on a
//! loopback port, scraped over TCP. Also: every series the Grafana dashboards query is
//! one that serve writes.

#[path = "support/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;
#[path = "support/serve_support.rs"]
mod support;
#[path = "support/hook_wire.rs"]
mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;
use wire::try_send;

use serde_json::{json, Value};
use support::{get, wait_for, ChildGuard};

const MIB: u64 = 1 << 20;

/// The series of one job, as labelled by serve.
const TORCH_NAMES: [&str; 6] = [
    "vramtop_torch_reserved_bytes",
    "vramtop_torch_allocated_bytes",
    "vramtop_torch_largest_free_bytes",
    "vramtop_torch_external_fragmentation_ratio",
    "vramtop_torch_ooms_total",
    "vramtop_torch_leak_suspects",
];

/// A hooked job: a real process (`sleep`) and a server on `vramtop-<pid>.sock` that
/// answers every viewer with `hello`, then a `state` every 100 ms while it has one.
struct FakeHook {
    process: Child,
    stop: Arc<AtomicBool>,
    accepter: Option<JoinHandle<()>>,
}

impl FakeHook {
    fn start(dir: &Path, hello: impl Fn(u32) -> Value, state: Option<Value>) -> FakeHook {
        let process = Command::new("sleep")
            .arg("120")
            .spawn()
            .expect("sleep starts");
        let pid = process.id();
        let socket = dir.join(format!("vramtop-{pid}.sock"));
        let listener = UnixListener::bind(&socket).expect("bind the job's socket");
        listener.set_nonblocking(true).expect("non-blocking");
        let stop = Arc::new(AtomicBool::new(false));
        let hello = hello(pid);
        let flag = Arc::clone(&stop);
        let accepter = thread::spawn(move || {
            let mut viewers = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (hello, state, flag) = (hello.clone(), state.clone(), flag.clone());
                        viewers.push(thread::spawn(move || {
                            serve_viewer(stream, &hello, state, &flag)
                        }));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
            for viewer in viewers {
                let _ = viewer.join();
            }
            let _ = std::fs::remove_file(&socket);
        });
        FakeHook {
            process,
            stop,
            accepter: Some(accepter),
        }
    }

    fn pid(&self) -> u32 {
        self.process.id()
    }

    /// The process dies (reaped, so its pid is gone) and its hook's connections close.
    fn end(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accepter) = self.accepter.take() {
            let _ = accepter.join();
        }
    }
}

impl Drop for FakeHook {
    fn drop(&mut self) {
        self.end();
    }
}

fn serve_viewer(mut stream: UnixStream, hello: &Value, state: Option<Value>, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    if try_send(&mut stream, hello).is_err() {
        return;
    }
    // The viewer's subscribe: read and let go (the pace is fixed here).
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = wire::read_json(&mut stream);
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if let Some(state) = &state {
            seq += 1;
            let mut state = state.clone();
            state["seq"] = json!(seq);
            if try_send(&mut stream, &state).is_err() {
                return;
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
}

fn hello(pid: u32, ppid: u32, cuda: bool, rank: Option<u32>, argv: &[&str]) -> Value {
    json!({"type": "hello", "protocol": 1, "pid": pid, "ppid": ppid, "argv": argv,
           "hook_version": "test", "torch_version": "2.11.0", "cuda_ready": cuda,
           "history": false, "capabilities": ["memory_snapshot"], "missing": [],
           "rank": rank, "local_rank": rank, "world_size": rank.map(|_| 2)})
}

/// One segment at `base` of `blocks` (size, allocated) laid end to end.
fn segment(base: u64, blocks: &[(u64, bool)]) -> Value {
    let mut addr = base;
    let blocks: Vec<Value> = blocks
        .iter()
        .map(|&(size, live)| {
            let block = json!({"address": addr, "size": size,
                "requested_size": if live { size } else { 0 },
                "state": if live { "active_allocated" } else { "inactive" }, "site": null});
            addr += size;
            block
        })
        .collect();
    json!({"address": base, "total_size": addr - base, "stream": 0,
           "segment_type": "large", "is_expandable": false, "blocks": blocks})
}

/// What one rank's fake hook reports, and the figures serve must export for it.
struct RankSpec {
    rank: u32,
    segments: Value,
    num_ooms: u64,
    reserved: u64,
    allocated: u64,
    largest_free: u64,
    fragmentation: f64,
}

fn rank_specs() -> [RankSpec; 2] {
    [
        // Two 20 MiB segments of 6 MiB tensors at 0 and 12 MiB: 16 MiB free in runs of 6
        // and 2 MiB, so 1 - 6/16 of the free memory is out of reach of the largest request.
        RankSpec {
            rank: 0,
            segments: [0x7f00_0000_0000, 0x7f00_0140_0000]
                .into_iter()
                .map(|base| {
                    let blocks = [
                        (6 * MIB, true),
                        (6 * MIB, false),
                        (6 * MIB, true),
                        (2 * MIB, false),
                    ];
                    segment(base, &blocks)
                })
                .collect(),
            num_ooms: 2,
            reserved: 40 * MIB,
            allocated: 24 * MIB,
            largest_free: 6 * MIB,
            fragmentation: 0.625,
        },
        // One 64 MiB segment: 32 and 16 MiB tensors, two 8 MiB holes.
        RankSpec {
            rank: 1,
            segments: json!([segment(
                0x7e00_0000_0000,
                &[
                    (32 * MIB, true),
                    (8 * MIB, false),
                    (16 * MIB, true),
                    (8 * MIB, false)
                ]
            )]),
            num_ooms: 0,
            reserved: 64 * MIB,
            allocated: 48 * MIB,
            largest_free: 8 * MIB,
            fragmentation: 0.5,
        },
    ]
}

fn state(spec: &RankSpec) -> Value {
    json!({"type": "state", "seq": 0, "time_s": 1.0, "device": spec.rank,
           "stats": {"allocated_bytes": spec.allocated, "reserved_bytes": spec.reserved,
                     "num_ooms": spec.num_ooms},
           "settings": {"expandable_segments": false},
           "segments": spec.segments, "truncated": false})
}

/// torchrun on this host: a launcher (hooked, never initialises CUDA, child of this test)
/// and two ranks, its children.
struct Fleet {
    launcher: FakeHook,
    ranks: Vec<FakeHook>,
}

impl Fleet {
    fn start(dir: &Path) -> Fleet {
        let me = std::process::id();
        let launcher = FakeHook::start(
            dir,
            |pid| {
                hello(
                    pid,
                    me,
                    false,
                    None,
                    &[
                        "/usr/bin/python3",
                        "/usr/bin/torchrun",
                        "--nproc-per-node",
                        "2",
                    ],
                )
            },
            None,
        );
        let parent = launcher.pid();
        let ranks = rank_specs()
            .iter()
            .map(|spec| {
                let rank = spec.rank;
                FakeHook::start(
                    dir,
                    |pid| {
                        hello(
                            pid,
                            parent,
                            true,
                            Some(rank),
                            &["/usr/bin/python3", "/home/u/train.py", "--epochs", "3"],
                        )
                    },
                    Some(state(spec)),
                )
            })
            .collect();
        Fleet { launcher, ranks }
    }
}

/// `vramtop serve` (simulated device) on a free loopback port, attaching to the jobs in
/// `sockets`.
fn start_serve(sockets: &Path, extra: &[&str]) -> (ChildGuard, String) {
    let mut args = vec!["--device", "sim", "--interval", "0.2"];
    args.extend_from_slice(extra);
    support::start_serve_with_env(&args, &[("VRAMTOP_SOCKET_DIR", sockets)])
}

/// One sample of the text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of a scrape, label values unescaped.
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let end = line.find(['{', ' ']).expect("a name");
            let name = line[..end].to_string();
            let mut labels = BTreeMap::new();
            let mut chars = line[end..].chars().peekable();
            if chars.peek() == Some(&'{') {
                chars.next();
                loop {
                    let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
                    if key.is_empty() {
                        break;
                    }
                    assert_eq!(chars.next(), Some('"'), "{line}");
                    let mut value = String::new();
                    while let Some(c) = chars.next() {
                        match c {
                            '"' => break,
                            '\\' => match chars.next() {
                                Some('n') => value.push('\n'),
                                Some(other) => value.push(other),
                                None => panic!("cut escape: {line}"),
                            },
                            c => value.push(c),
                        }
                    }
                    labels.insert(key, value);
                    if chars.next() != Some(',') {
                        break;
                    }
                }
            }
            let value: String = chars.collect();
            Sample {
                name,
                labels,
                value: value.trim().parse().expect("a number"),
            }
        })
        .collect()
}

/// The `/metrics` body; empty until serve's first telemetry poll (503).
fn scrape(addr: &str) -> String {
    let (status, body) = get(addr, "/metrics");
    match status {
        200 => body,
        503 => String::new(),
        _ => panic!("GET /metrics: {status} {body}"),
    }
}

fn torch_samples(samples: &[Sample], pid: u32) -> Vec<&Sample> {
    let pid = pid.to_string();
    samples
        .iter()
        .filter(|s| s.name.starts_with("vramtop_torch_") && s.labels["pid"] == pid)
        .collect()
}

#[test]
fn serve_exports_each_rank_but_not_the_launcher_and_forgets_an_ended_rank() {
    let dir = TempDir::new("fleet");
    let mut fleet = Fleet::start(dir.path());
    let (_serve, addr) = start_serve(dir.path(), &[]);

    let pids: Vec<u32> = fleet.ranks.iter().map(FakeHook::pid).collect();
    let text = wait_for(Duration::from_secs(15), || {
        let text = scrape(&addr);
        let samples = parse(&text);
        pids.iter()
            .all(|&pid| torch_samples(&samples, pid).len() == TORCH_NAMES.len())
            .then_some(text)
    })
    .unwrap_or_else(|| panic!("both ranks exported within 15 s:\n{}", scrape(&addr)));
    let samples = parse(&text);

    for name in TORCH_NAMES {
        for kind in ["HELP", "TYPE"] {
            let head = format!("# {kind} {name} ");
            assert_eq!(text.matches(&head).count(), 1, "{head}once:\n{text}");
        }
    }
    assert!(text.contains("# TYPE vramtop_torch_ooms_total counter"));
    assert!(text.contains("# TYPE vramtop_torch_reserved_bytes gauge"));
    let hostname = samples
        .iter()
        .find(|s| s.name == "vramtop_device_info")
        .map(|s| s.labels["hostname"].clone())
        .expect("the simulated device");

    // `--once --json` reads the same jobs: its figures are the ones serve exports.
    let once = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(["--once", "--json", "--device", "sim"])
        .env("VRAMTOP_SOCKET_DIR", dir.path())
        .env_remove("VRAMTOP_INTERVAL")
        .env_remove("VRAMTOP_DEVICE")
        .output()
        .expect("vramtop --once --json runs");
    assert!(once.status.success(), "{once:?}");
    let once: Value = serde_json::from_slice(&once.stdout).expect("JSON");

    for (spec, pid) in rank_specs().iter().zip(&pids) {
        let series = torch_samples(&samples, *pid);
        assert_eq!(
            series.len(),
            TORCH_NAMES.len(),
            "one series per name: {series:?}"
        );
        let rank = spec.rank.to_string();
        let labels: BTreeMap<String, String> = [
            ("hostname", hostname.as_str()),
            ("pid", pid.to_string().as_str()),
            ("device", rank.as_str()),
            ("rank", rank.as_str()),
            ("local_rank", rank.as_str()),
            ("world_size", "2"),
            ("job", "train.py"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let value = |name: &str| {
            let sample = series
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{name} for rank {rank}"));
            assert_eq!(sample.labels, labels, "{name}");
            sample.value
        };
        let expected = [
            ("vramtop_torch_reserved_bytes", spec.reserved as f64),
            ("vramtop_torch_allocated_bytes", spec.allocated as f64),
            ("vramtop_torch_largest_free_bytes", spec.largest_free as f64),
            (
                "vramtop_torch_external_fragmentation_ratio",
                spec.fragmentation,
            ),
            ("vramtop_torch_ooms_total", spec.num_ooms as f64),
            ("vramtop_torch_leak_suspects", 0.0),
        ];
        for (name, want) in expected {
            assert!(
                (value(name) - want).abs() < 1e-9,
                "{name} rank {rank}: {}",
                value(name)
            );
        }

        let report = once["attached"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["pid"] == *pid))
            .unwrap_or_else(|| panic!("rank {rank} in --once --json: {once}"));
        // The states are whole (not truncated): PyTorch's counts and the segments agree.
        let same = [
            ("vramtop_torch_reserved_bytes", &report["reserved_bytes"]),
            (
                "vramtop_torch_reserved_bytes",
                &report["stats"]["reserved_bytes"],
            ),
            ("vramtop_torch_allocated_bytes", &report["allocated_bytes"]),
            (
                "vramtop_torch_allocated_bytes",
                &report["stats"]["allocated_bytes"],
            ),
            (
                "vramtop_torch_largest_free_bytes",
                &report["largest_free_bytes"],
            ),
            (
                "vramtop_torch_external_fragmentation_ratio",
                &report["external_fragmentation"],
            ),
            ("vramtop_torch_ooms_total", &report["stats"]["num_ooms"]),
        ];
        for (name, json) in same {
            assert_eq!(json.as_f64(), Some(value(name)), "{name} vs --once --json");
        }
        let suspects = report["leak_suspects"].as_array().map_or(0, Vec::len);
        assert_eq!(suspects as f64, value("vramtop_torch_leak_suspects"));
    }
    assert!(
        torch_samples(&samples, fleet.launcher.pid()).is_empty(),
        "the launcher holds no GPU memory: no series"
    );

    // Rank 1's process ends and its socket closes: its series go, rank 0's stay.
    let mut rank1 = fleet.ranks.pop().expect("rank 1");
    rank1.end();
    let after = wait_for(Duration::from_secs(5), || {
        let samples = parse(&scrape(&addr));
        torch_samples(&samples, rank1.pid())
            .is_empty()
            .then_some(samples)
    })
    .unwrap_or_else(|| panic!("rank 1's series gone within 5 s:\n{}", scrape(&addr)));
    assert_eq!(torch_samples(&after, pids[0]).len(), TORCH_NAMES.len());
}

/// Every `vramtop_*` name in the dashboard's queries (panels and template variables).
fn queried_names(dashboard: &Value) -> BTreeSet<String> {
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr" | "query" | "definition", Value::String(text)) => {
                            out.extend(metric_names_in(text));
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk(dashboard, &mut out);
    out
}

/// Matches of `vramtop_[a-z_]+` in `text`, names cut at the first other character.
fn metric_names_in(text: &str) -> Vec<String> {
    text.match_indices("vramtop_")
        .filter(|(at, _)| {
            // Not the tail of a longer identifier.
            !text[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(at, _)| {
            let rest = &text[at + "vramtop_".len()..];
            let len = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(rest.len());
            format!("vramtop_{}", &rest[..len])
        })
        .filter(|name| name.len() > "vramtop_".len())
        .collect()
}

fn dashboard(file: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("assets/grafana")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

#[test]
fn the_dashboards_query_only_series_serve_writes() {
    let dir = TempDir::new("dashboards");
    let _fleet = Fleet::start(dir.path());
    let (_serve, addr) = start_serve(dir.path(), &["--probe", "steady"]);
    let text = wait_for(Duration::from_secs(15), || {
        let text = scrape(&addr);
        (text.contains("\nvramtop_torch_reserved_bytes{")
            && text.contains("\nvramtop_allocator_reserved_bytes{"))
        .then_some(text)
    })
    .unwrap_or_else(|| panic!("jobs and probe exported within 15 s:\n{}", scrape(&addr)));
    let mut written: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    // The simulated device runs no processes: their series come from the encoder itself.
    let mut device = vramtop::telemetry::DeviceSnapshot::unknown(0, "GPU", false);
    device.processes.push(vramtop::telemetry::ProcessSnapshot {
        pid: 1,
        kind: vramtop::telemetry::ProcessKind::Compute,
        used_memory_bytes: Some(MIB),
        sm_util_pct: None,
        user: None,
        command: None,
        cpu_pct: None,
        rss_bytes: None,
        host_view: vramtop::telemetry::HostView::Visible,
        cgroup: None,
        frameworks: None,
    });
    let snapshot = vramtop::telemetry::SystemSnapshot {
        hostname: "h".into(),
        source: "test".into(),
        driver_version: None,
        cuda_version: None,
        devices: vec![device],
        taken_at_ms: 0,
        warnings: Vec::new(),
    };
    let with_process = vramtop::export::metrics::encode(
        &snapshot,
        &[],
        &vramtop::attach::AttachedJobs::default(),
        false,
    )
    .expect("encode");
    assert!(with_process.contains("\nvramtop_process_memory_used_bytes{"));
    written.extend(
        with_process
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_string),
    );

    // Roles come from hooks that found a model or optimizer (the fleet's stub jobs have
    // none): their series come from the encoder itself, for a job that has them.
    let state = vramtop::attach::protocol::JobState {
        stats: Some(vramtop::attach::protocol::TorchStats {
            allocated_bytes: Some(MIB),
            reserved_bytes: Some(2 * MIB),
            ..Default::default()
        }),
        roles: Some(vramtop::trace::roles::Roles {
            parameters: 1024,
            ..Default::default()
        }),
        ..Default::default()
    };
    let with_roles = vramtop::attach::AttachedJobs {
        jobs: vec![vramtop::attach::JobView {
            pid: 7,
            frame: Some(std::sync::Arc::new(
                vramtop::attach::job::JobFrame::from_state(&state),
            )),
            connected: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    let roles_text =
        vramtop::export::metrics::encode(&snapshot, &[], &with_roles, false).expect("encode");
    assert!(
        roles_text.contains("\nvramtop_torch_role_bytes{"),
        "{roles_text}"
    );
    written.extend(
        roles_text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_string),
    );

    for file in ["vramtop-torch.json", "vramtop.json"] {
        let board = dashboard(file);
        let queried = queried_names(&board);
        assert!(!queried.is_empty(), "{file} queries nothing");
        let unknown: Vec<&String> = queried.difference(&written).collect();
        assert!(
            unknown.is_empty(),
            "{file} queries series serve never writes: {unknown:?}"
        );
    }

    // The torch dashboard covers what issue 27 asks of it.
    let torch = dashboard("vramtop-torch.json");
    let queried = queried_names(&torch);
    for name in TORCH_NAMES {
        assert!(queried.contains(name), "vramtop-torch.json shows {name}");
    }
    let vars: Vec<&str> = torch["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "hostname", "job"]);
    let panels = torch["panels"].as_array().expect("panels");
    let exprs = |p: &Value| -> Vec<String> {
        p["targets"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t["expr"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(panels.iter().any(|p| {
        matches!(p["type"].as_str(), Some("state-timeline" | "heatmap"))
            && exprs(p).iter().any(|e| {
                e.contains("vramtop_torch_external_fragmentation_ratio") && e.contains("rank")
            })
    }));
    assert!(panels
        .iter()
        .flat_map(exprs)
        .any(|e| e.starts_with("increase(vramtop_torch_ooms_total")));
}
