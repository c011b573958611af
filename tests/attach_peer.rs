//! The attacher against fake hooks: Rust servers that speak (or break) the attach
//! protocol over real Unix sockets, named after real (sleeping) processes.

#[path = "support/json_doc.rs"]
mod json_doc;
#[path = "support/temp_dir.rs"]
mod temp_dir;
#[path = "support/hook_wire.rs"]
mod wire;

use wire::{read_json, send, sleeper, socket_dir};

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use vramtop::attach::job::Answer;
use vramtop::attach::{AttachedJobs, Attacher, JobReport};

const MIB: u64 = 1 << 20;

fn listen(dir: &Path, pid: u32) -> UnixListener {
    UnixListener::bind(dir.join(format!("vramtop-{pid}.sock"))).expect("bind")
}

fn hello(pid: u32) -> serde_json::Value {
    json!({"type": "hello", "protocol": 1, "pid": pid, "ppid": 1,
           "argv": ["python", "train.py"], "hook_version": "test",
           "torch_version": "2.11.0", "cuda_ready": true, "history": true,
           "capabilities": ["memory_snapshot"], "missing": []})
}

/// Two 20 MiB segments: 6 MiB blocks at 0 and 12 MiB of each, the rest free.
fn segments(site: &str) -> serde_json::Value {
    let seg = |base: u64| {
        json!({"address": base, "total_size": 20 * MIB, "stream": 0,
               "segment_type": "large", "is_expandable": false,
               "blocks": [
                 {"address": base, "size": 6 * MIB, "requested_size": 6 * MIB,
                  "state": "active_allocated", "site": site},
                 {"address": base + 6 * MIB, "size": 6 * MIB, "requested_size": 0,
                  "state": "inactive", "site": null},
                 {"address": base + 12 * MIB, "size": 6 * MIB, "requested_size": 6 * MIB,
                  "state": "active_allocated", "site": site},
                 {"address": base + 18 * MIB, "size": 2 * MIB, "requested_size": 0,
                  "state": "inactive", "site": null}]})
    };
    json!([seg(0x7f00_0000_0000), seg(0x7f00_0140_0000)])
}

fn state(seq: u64) -> serde_json::Value {
    json!({"type": "state", "seq": seq, "time_s": 1.0, "device": 0,
           "stats": {"allocated_bytes": 24 * MIB, "reserved_bytes": 40 * MIB},
           "settings": {"expandable_segments": false},
           "segments": segments("train.py:41 forward"), "truncated": false})
}

fn attacher(dir: &Path) -> Attacher {
    Attacher::spawn(dir.to_path_buf(), Duration::from_millis(100)).expect("attacher")
}

/// Waits until `done` holds for the published jobs, or fails after `limit`.
fn wait_for(
    attacher: &Attacher,
    limit: Duration,
    what: &str,
    done: impl Fn(&AttachedJobs) -> bool,
) -> Arc<AttachedJobs> {
    let deadline = Instant::now() + limit;
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

/// The viewer's connection, taken and greeted as a hook does: its hello sent, the viewer's
/// subscribe read.
fn greeted(listener: &UnixListener, pid: u32) -> UnixStream {
    let (mut stream, _) = listener.accept().expect("accept");
    send(&mut stream, &hello(pid));
    let _ = read_json(&mut stream);
    stream
}

#[test]
fn hello_and_state_become_a_block_map() {
    let dir = socket_dir("peer", "state");
    let mut job = sleeper();
    let pid = job.id();
    let listener = listen(&dir, pid);
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        send(&mut stream, &hello(pid));
        let subscribe = read_json(&mut stream).expect("a subscribe");
        send(&mut stream, &state(1));
        std::thread::sleep(Duration::from_secs(1));
        subscribe
    });
    let attacher = attacher(&dir);
    let jobs = wait_for(&attacher, Duration::from_secs(5), "a state", |j| {
        j.get(pid).is_some_and(|j| j.frame.is_some())
    });
    let subscribe = server.join().expect("server");
    assert_eq!(subscribe["type"], "subscribe");
    assert_eq!(subscribe["interval_s"], 0.1);
    let view = jobs.get(pid).expect("job");
    let map = view.map().expect("map");
    assert_eq!(map.layout.segments.len(), 2);
    assert_eq!(map.stats.reserved_bytes, 40 * MIB);
    assert_eq!(map.stats.allocated_bytes, 24 * MIB);
    assert_eq!(map.stats.largest_free_bytes, 6 * MIB);
    assert_eq!(map.layout.tags, vec!["train.py:41 forward".to_string()]);
    let report = JobReport::of(view);
    assert_eq!(report.argv, vec!["python", "train.py"]);
    assert_eq!(report.torch_version.as_deref(), Some("2.11.0"));
    assert_eq!(report.segments, 2);
    assert_eq!(report.free_runs, 4);
    let _ = job.kill();
    let _ = job.wait();
}

/// Runs one misbehaving peer and returns the reason it was dropped.
fn dropped_reason(name: &str, misbehave: fn(&mut UnixStream, u32)) -> String {
    let dir = socket_dir("peer", name);
    let mut job = sleeper();
    let pid = job.id();
    let listener = listen(&dir, pid);
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            misbehave(&mut stream, pid);
            // Keep the connection open: the viewer must drop it, not the peer.
            std::thread::sleep(Duration::from_secs(10));
        }
    });
    let attacher = attacher(&dir);
    let jobs = wait_for(&attacher, Duration::from_secs(8), "a drop", |j| {
        j.get(pid).is_some_and(|j| j.last_drop.is_some())
    });
    let reason = jobs.get(pid).and_then(|j| j.last_drop.clone());
    assert!(
        jobs.get(pid).is_some_and(|j| !j.ended),
        "alive, so not ended"
    );
    let _ = job.kill();
    let _ = job.wait();
    reason.unwrap_or_default()
}

#[test]
fn garbage_drops_the_peer_with_one_line() {
    let reason = dropped_reason("garbage", |s, pid| {
        send(s, &hello(pid));
        let _ = s.write_all(b"\x00\x00\x00\x05hello");
    });
    assert!(
        reason.contains("garbage") && reason.contains("not JSON"),
        "{reason}"
    );
    assert!(!reason.contains('\n'));
}

#[test]
fn a_frame_of_100_mib_announced_is_refused_unread() {
    let reason = dropped_reason("huge", |s, pid| {
        send(s, &hello(pid));
        let _ = s.write_all(&(100u32 << 20).to_be_bytes());
    });
    assert!(reason.contains("100.0 MiB"), "{reason}");
}

#[test]
fn a_silent_peer_is_dropped_after_two_seconds() {
    let started = Instant::now();
    let reason = dropped_reason("silent", |_, _| {});
    assert!(reason.contains("no hello within 2 s"), "{reason}");
    assert!(started.elapsed() >= Duration::from_secs(2));
}

#[test]
fn a_vanishing_peer_keeps_its_last_state_marked_ended() {
    let dir = socket_dir("peer", "vanish");
    let mut job = sleeper();
    let pid = job.id();
    let listener = listen(&dir, pid);
    let socket = dir.join(format!("vramtop-{pid}.sock"));
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        send(&mut stream, &hello(pid));
        let _ = read_json(&mut stream);
        send(&mut stream, &state(1));
        std::thread::sleep(Duration::from_millis(500));
        // The process dies without a bye; its socket stays behind.
    });
    let attacher = attacher(&dir);
    wait_for(&attacher, Duration::from_secs(5), "a state", |j| {
        j.get(pid).is_some_and(|j| j.frame.is_some())
    });
    let _ = job.kill();
    let _ = job.wait();
    let jobs = wait_for(&attacher, Duration::from_secs(5), "the end", |j| {
        j.get(pid).is_some_and(|j| j.ended)
    });
    let view = jobs.get(pid).expect("kept");
    assert!(view.frame.is_some(), "the last state stays on screen");
    // The stale socket is cleaned up on a later scan.
    let deadline = Instant::now() + Duration::from_secs(3);
    while socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!socket.exists());
}

#[test]
fn several_peers_at_once_and_an_oom_explained() {
    let dir = socket_dir("peer", "several");
    let mut jobs: Vec<Child> = (0..3).map(|_| sleeper()).collect();
    let pids: Vec<u32> = jobs.iter().map(Child::id).collect();
    for (i, &pid) in pids.iter().enumerate() {
        let listener = listen(&dir, pid);
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            send(&mut stream, &hello(pid));
            let _ = read_json(&mut stream);
            send(&mut stream, &state(1));
            if i == 0 {
                send(
                    &mut stream,
                    &json!({"type": "oom", "time_s": 2.0, "device": 0,
                    "requested_bytes": 16 * MIB, "device_free_bytes": 0,
                    "device_total_bytes": 80u64 << 30,
                    "stats": {"allocated_bytes": 24 * MIB, "reserved_bytes": 40 * MIB},
                    "segments": segments("train.py:41 forward"), "truncated": false}),
                );
                send(
                    &mut stream,
                    &json!({"type": "error", "time_s": 2.0,
                    "kind": "OutOfMemoryError",
                    "message": "CUDA out of memory. Tried to allocate 16.00 MiB."}),
                );
            }
            std::thread::sleep(Duration::from_secs(3));
        });
    }
    let attacher = attacher(&dir);
    // The OOM is explained on a thread of its own: it may come after the error.
    let seen = wait_for(&attacher, Duration::from_secs(5), "three states", |j| {
        pids.iter()
            .all(|&pid| j.get(pid).is_some_and(|v| v.frame.is_some()))
            && j.get(pids[0])
                .is_some_and(|v| v.error.is_some() && v.oom.is_some())
    });
    let first = seen.get(pids[0]).expect("first");
    let oom = first.oom.as_ref().expect("oom");
    assert_eq!(
        oom.line(),
        "needed 16.0 MiB contiguous; 16.0 MiB free in 4 runs, largest 6.0 MiB"
    );
    // Packed tight the live tensors and the request fill the 40 MiB held exactly; each on
    // pages of its own they would need 160 MiB: one state cannot tell.
    assert_eq!(
        oom.expandable.answer,
        Answer::CannotTell,
        "{:?}",
        oom.expandable
    );
    assert!(first
        .error
        .as_ref()
        .is_some_and(|e| e.message.contains("Tried to allocate")));
    assert!(seen.get(pids[1]).is_some_and(|v| v.oom.is_none()));
    for job in &mut jobs {
        let _ = job.kill();
        let _ = job.wait();
    }
}

#[test]
fn a_dropped_peer_is_reconnected_on_the_next_scan() {
    let dir = socket_dir("peer", "reconnect");
    let mut job = sleeper();
    let pid = job.id();
    let listener = listen(&dir, pid);
    std::thread::spawn(move || {
        // First connection: garbage.
        if let Ok((mut stream, _)) = listener.accept() {
            send(&mut stream, &hello(pid));
            let _ = stream.write_all(b"\x00\x00\x00\x02[]");
        }
        // Second: a proper hook.
        if let Ok((mut stream, _)) = listener.accept() {
            send(&mut stream, &hello(pid));
            let _ = read_json(&mut stream);
            send(&mut stream, &state(7));
            std::thread::sleep(Duration::from_secs(3));
        }
    });
    let attacher = attacher(&dir);
    let jobs = wait_for(
        &attacher,
        Duration::from_secs(5),
        "a reconnected state",
        |j| {
            j.get(pid)
                .is_some_and(|v| v.frame.as_ref().is_some_and(|f| f.seq == 7))
        },
    );
    let view = jobs.get(pid).expect("job");
    assert!(view.connected);
    assert_eq!(view.last_drop, None, "a good hello clears the old reason");
    let _ = job.kill();
    let _ = job.wait();
}

#[test]
fn once_json_and_attach_json_include_the_hooked_job() {
    let dir = socket_dir("peer", "once");
    let mut job = sleeper();
    let pid = job.id();
    let listener = listen(&dir, pid);
    std::thread::spawn(move || {
        // Two viewers, one after the other: --once, then vramtop attach.
        for _ in 0..2 {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            std::thread::spawn(move || {
                send(&mut stream, &hello(pid));
                let _ = read_json(&mut stream);
                for seq in 1..40 {
                    send(&mut stream, &state(seq));
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    let bin = || {
        let mut cmd = assert_cmd::Command::cargo_bin("vramtop").expect("binary");
        cmd.env("VRAMTOP_SOCKET_DIR", &dir)
            .env_remove("VRAMTOP_INTERVAL")
            .env_remove("VRAMTOP_DEVICE");
        cmd
    };
    let out = bin()
        .args(["--once", "--json", "--device", "sim"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
    let attached = &v["attached"][0];
    assert_eq!(v["schema"], 1);
    json_doc::assert_documented("--once --json", &v);
    assert_eq!(attached["pid"], pid);
    assert_eq!(attached["torch_version"], "2.11.0");
    assert_eq!(attached["segments"], 2);
    assert_eq!(attached["reserved_bytes"], 40 * MIB);
    assert_eq!(attached["stats"]["reserved_bytes"], 40 * MIB);
    assert_eq!(attached["largest_free_bytes"], 6 * MIB);
    assert!(
        v["devices"].as_array().is_some(),
        "the devices are still there"
    );

    let out = bin()
        .args(["attach", "--json", "--seconds", "1", "--interval", "0.2"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).expect("utf-8");
    let last: serde_json::Value =
        serde_json::from_str(text.lines().last().expect("lines")).expect("JSON line");
    assert_eq!(last["attached"][0]["pid"], pid);
    assert!(last["attached"][0]["states"].as_u64() >= Some(1), "{last}");
    assert_eq!(last["schema"], 1);
    json_doc::assert_documented("attach --json", &last);
    let _ = job.kill();
    let _ = job.wait();
}

/// Each publish wakes the live view for a redraw: scans of an idle directory publish
/// nothing after the first, and a new job still does.
#[test]
fn an_idle_directory_publishes_once_and_a_new_job_wakes_it() {
    let dir = socket_dir("peer", "idle");
    let mut attacher =
        Attacher::spawn(dir.to_path_buf(), Duration::from_millis(10)).expect("attacher");
    wait_for(&attacher, Duration::from_secs(10), "the first scan", |j| {
        j.scans > 0
    });
    attacher.jobs.borrow_and_update();
    std::thread::sleep(Duration::from_millis(300)); // about 30 scans
    assert!(
        !attacher.jobs.has_changed().expect("attacher alive"),
        "an unchanged directory was published again"
    );
    let mut job = sleeper();
    let _listener = listen(&dir, job.id());
    wait_for(&attacher, Duration::from_secs(10), "the new job", |j| {
        j.jobs.len() == 1
    });
    let _ = job.kill();
    let _ = job.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job that said its bye while its process lingers, its socket still there and still
/// listening (a hook's server ends with its process, after the bye): the viewer keeps the
/// job as it ended, and neither forgets it nor connects anew (it did both at its next
/// scan, which lost the job's last OOM from the view, and made a test that waited for the
/// end miss it under load). A new socket file under the name, another process that got
/// the pid, replaces it.
#[test]
fn an_ended_job_is_kept_while_its_socket_lingers_and_a_new_socket_replaces_it() {
    let dir = socket_dir("peer", "lingers");
    let mut job = sleeper();
    let pid = job.id();
    let listener = listen(&dir, pid);
    let server = std::thread::spawn(move || {
        let mut stream = greeted(&listener, pid);
        send(&mut stream, &state(1));
        send(
            &mut stream,
            &json!({"type": "bye", "time_s": 3.0, "exit_code": 0}),
        );
        listener
    });
    let attacher = attacher(&dir);
    let listener = server.join().expect("server");
    wait_for(&attacher, Duration::from_secs(10), "the end", |j| {
        j.get(pid).is_some_and(|v| v.ended)
    });
    // Six scans later: still there, as it ended, with its state.
    std::thread::sleep(Duration::from_millis(600));
    let jobs = attacher.snapshot();
    let view = jobs.get(pid).expect("the ended job is kept");
    assert!(view.ended, "{view:?}");
    assert_eq!(view.exit_code, Some(0));
    assert_eq!(view.states, 1, "connected anew: {view:?}");
    // Another process's socket under the same name: a new file.
    drop(listener);
    std::fs::remove_file(dir.join(format!("vramtop-{pid}.sock"))).expect("remove");
    let listener = listen(&dir, pid);
    let server = std::thread::spawn(move || {
        let mut stream = greeted(&listener, pid);
        for seq in 1..=20 {
            send(&mut stream, &state(seq));
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    wait_for(&attacher, Duration::from_secs(10), "the new job", |j| {
        j.get(pid).is_some_and(|v| !v.ended && v.states > 0)
    });
    server.join().expect("server");
    let _ = job.kill();
    let _ = job.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hook whose job ran out of memory, its state kept in a file with the whole history
/// (the viewer replays it to judge the remedies: seconds in a debug build), then sends
/// 3 MiB of states at once and gives the viewer half a second to take them, as the hook
/// does at exit, then an OOM that killed the job and its bye. The viewer keeps reading
/// while it judges: it takes every byte in time, and the OOM it shows last is the one the
/// job died of. (A convolutional GAN under a cap lost its fatal OOM so on the GPU: 47
/// caught in cuDNN's workspace search came first.)
#[test]
fn the_viewer_reads_on_while_it_judges_an_oom_and_shows_the_job_s_last() {
    use std::io::Read;
    let dir = socket_dir("peer", "judging");
    let mut job = sleeper();
    let pid = job.id();
    // The hook names its files so; the viewer opens no other.
    let kept = dir.join(format!("vramtop-oom-{pid}-1.pickle"));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open("tests/fixtures/history_gpt2ckpt_cap12g5_hook18.pickle.gz")
            .expect("fixture"),
    )
    .read_to_end(&mut bytes)
    .expect("gunzip");
    std::fs::write(&kept, &bytes).expect("write");
    let time_s = vramtop_trace::load(&kept)
        .expect("loads")
        .stats
        .kept_oom
        .expect("kept")
        .time_us as f64
        / 1e6;
    let listener = listen(&dir, pid);
    let kept_path = kept.to_string_lossy().into_owned();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        send(&mut stream, &hello(pid));
        let _ = read_json(&mut stream);
        send(&mut stream, &state(1));
        let oom = |time_s: f64, requested: u64, kept_path: Option<&str>| {
            json!({"type": "oom", "time_s": time_s, "device": 0,
                   "requested_bytes": requested, "device_free_bytes": 0,
                   "device_total_bytes": 80u64 << 30,
                   "stats": {"allocated_bytes": 24 * MIB, "reserved_bytes": 40 * MIB},
                   "segments": segments("train.py:41 forward"), "truncated": false,
                   "ring": {"max_entries": 32768, "entries": 1, "complete": true},
                   "kept_path": kept_path})
        };
        send(&mut stream, &oom(time_s, 3 << 30, Some(&kept_path)));
        // The hook's exit: what it owes, in half a second, or never.
        stream.set_nonblocking(true).expect("nonblocking");
        let mut owed = Vec::new();
        for seq in 2..40 {
            let body = state(seq).to_string().into_bytes();
            let pad = json!({"type": "state", "seq": seq, "time_s": 1.0, "device": 0,
                             "stats": {"allocated_bytes": 24 * MIB, "reserved_bytes": 40 * MIB},
                             "segments": segments(&"x".repeat(80_000)), "truncated": false});
            let body = if seq % 2 == 0 {
                pad.to_string().into_bytes()
            } else {
                body
            };
            owed.extend_from_slice(&(body.len() as u32).to_be_bytes());
            owed.extend_from_slice(&body);
        }
        let last = oom(time_s + 1.0, 16 * MIB, None).to_string().into_bytes();
        owed.extend_from_slice(&(last.len() as u32).to_be_bytes());
        owed.extend_from_slice(&last);
        let bye = json!({"type": "bye", "time_s": 3.0, "exit_code": 1}).to_string();
        owed.extend_from_slice(&(bye.len() as u32).to_be_bytes());
        owed.extend_from_slice(bye.as_bytes());
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut sent = 0;
        while sent < owed.len() && Instant::now() < deadline {
            match stream.write(&owed[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(_) => break,
            }
        }
        (sent, owed.len())
    });
    let attacher = attacher(&dir);
    let (sent, owed) = server.join().expect("server");
    assert_eq!(sent, owed, "the viewer stopped reading while it judged");
    let jobs = wait_for(&attacher, Duration::from_secs(120), "the end", |j| {
        j.get(pid).is_some_and(|v| v.ended)
    });
    let view = jobs.get(pid).expect("job");
    let oom = view.oom.as_ref().expect("an OOM");
    assert_eq!(oom.report.requested_bytes, 16 * MIB, "the job's last OOM");
    let _ = job.kill();
    let _ = job.wait();
}
