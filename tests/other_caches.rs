//! `empty_cache()` in another process on the same GPU: a job runs out of memory while
//! another hooked process holds a large free cache. Each is a fake hook speaking the
//! attach protocol over a real Unix socket named after a real (sleeping) process, whose
//! `CUDA_VISIBLE_DEVICES` says which GPU it is on; the real attacher judges the remedy.

#[path = "support/temp_dir.rs"]
mod temp_dir;
#[path = "support/hook_wire.rs"]
mod wire;

use wire::{read_json, send, socket_dir};

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::json;
use vramtop::alloc::remedy::{RemedyVerdict, Verdict};
use vramtop::attach::Attacher;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A sleeping process that CUDA would put on `visible` (None: CUDA_VISIBLE_DEVICES unset).
fn sleeper(visible: Option<&str>) -> Child {
    let mut command = Command::new("sleep");
    command.arg("60").env_remove("CUDA_VISIBLE_DEVICES");
    if let Some(v) = visible {
        command.env("CUDA_VISIBLE_DEVICES", v);
    }
    command.spawn().expect("sleep")
}

/// One segment of `size` bytes: `used` of it live, the rest free.
fn segments(size: u64, used: u64) -> serde_json::Value {
    let base = 0x7f00_0000_0000u64;
    let mut blocks = Vec::new();
    if used > 0 {
        blocks.push(
            json!({"address": base, "size": used, "requested_size": used,
                           "state": "active_allocated", "site": null}),
        );
    }
    if size > used {
        blocks.push(
            json!({"address": base + used, "size": size - used, "requested_size": 0,
                           "state": "inactive", "site": null}),
        );
    }
    json!([{"address": base, "total_size": size, "stream": 0, "segment_type": "large",
            "is_expandable": false, "blocks": blocks}])
}

/// A fake hook for `pid`: hello, one state (`reserved` bytes, `allocated` of them live),
/// then, if `oom` is given as (requested, device free, allowed), that OOM once a viewer
/// has had time to see the other process; the connection stays open.
fn fake_hook(
    dir: &Path,
    pid: u32,
    reserved: u64,
    allocated: u64,
    oom: Option<(u64, u64, u64)>,
    uuid: Option<&'static str>,
) {
    let listener = UnixListener::bind(dir.join(format!("vramtop-{pid}.sock"))).expect("bind");
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let argv = if oom.is_some() {
            json!(["python3", "/work/train.py"])
        } else {
            json!(["python3", "/work/holder.py"])
        };
        send(
            &mut stream,
            &json!({"type": "hello", "protocol": 1, "pid": pid, "ppid": 1, "argv": argv,
                    "hook_version": "test", "torch_version": "2.11.0", "cuda_ready": true,
                    "history": false, "capabilities": [], "missing": []}),
        );
        let _ = read_json(&mut stream);
        let stats = json!({"allocated_bytes": allocated, "reserved_bytes": reserved});
        send(
            &mut stream,
            &json!({"type": "state", "seq": 1, "time_s": 100.0, "device": 0, "stats": stats,
                    "device_uuid": uuid,
                    "settings": {"expandable_segments": false},
                    "segments": segments(reserved, allocated), "truncated": false}),
        );
        if let Some((requested, free, allowed)) = oom {
            std::thread::sleep(Duration::from_millis(600));
            send(
                &mut stream,
                &json!({"type": "oom", "time_s": 100.5, "device": 0, "device_uuid": uuid,
                        "requested_bytes": requested, "device_free_bytes": free,
                        "device_total_bytes": allowed, "stats": stats,
                        "segments": segments(reserved, allocated), "truncated": false}),
            );
        }
        std::thread::sleep(Duration::from_secs(30));
    });
}

/// The failing job's remedies once its OOM is in, named after the holder's pid.
fn remedies_at_oom(
    name: &str,
    holder_gpu: Option<&str>,
    oom: (u64, u64, u64),
) -> (u32, Vec<RemedyVerdict>) {
    remedies_with_uuids(name, holder_gpu, oom, (None, None))
}

/// As `remedies_at_oom`, the hooks sending these GPU UUIDs (holder, job).
fn remedies_with_uuids(
    name: &str,
    holder_gpu: Option<&str>,
    oom: (u64, u64, u64),
    uuids: (Option<&'static str>, Option<&'static str>),
) -> (u32, Vec<RemedyVerdict>) {
    let dir = socket_dir("others", name);
    let mut processes = vec![sleeper(holder_gpu), sleeper(None)];
    let (holder, job) = (processes[0].id(), processes[1].id());
    // The other process: 60 GiB cached, nothing live (a model freed, its cache kept).
    fake_hook(&dir, holder, 60 * GIB, 0, None, uuids.0);
    fake_hook(&dir, job, 2 * GIB, 2 * GIB, Some(oom), uuids.1);
    let attacher =
        Attacher::spawn(dir.to_path_buf(), Duration::from_millis(100)).expect("attacher");
    let deadline = Instant::now() + Duration::from_secs(10);
    let remedies = loop {
        let jobs = attacher.snapshot();
        if let Some(oom) = jobs
            .jobs
            .iter()
            .find(|j| j.pid == job)
            .and_then(|j| j.oom.clone())
        {
            break oom.remedies.clone();
        }
        assert!(Instant::now() < deadline, "no OOM: {jobs:#?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    for p in &mut processes {
        let _ = p.kill();
        let _ = p.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    (holder, remedies)
}

#[test]
fn another_process_on_the_gpu_giving_back_its_cache_would_fit_the_request() {
    // 30 GiB asked with 18 GiB free on an 80 GiB device: PyTorch's own release could not
    // help (nothing of its own was free); the other process's 60 GiB would.
    let (holder, remedies) = remedies_at_oom("fits", None, (30 * GIB, 18 * GIB, 80 * GIB));
    let name = format!("empty_cache() in pid {holder} (holder.py)");
    let other = remedies
        .iter()
        .find(|r| r.remedy.to_string() == name)
        .unwrap_or_else(|| {
            panic!("no verdict for the other process: {remedies:#?}");
        });
    assert_eq!(other.verdict, Verdict::Fits, "{other:?}");
    assert!(
        other
            .reason
            .contains("60.0 GiB in wholly free cached segments"),
        "{other:?}"
    );
    // The failing process's own empty_cache() still does not help.
    let own = remedies
        .iter()
        .find(|r| r.remedy.to_string() == "empty_cache()")
        .unwrap();
    assert_eq!(own.verdict, Verdict::Fails);
}

#[test]
fn a_request_larger_than_the_other_cache_can_make_room_for_still_fails() {
    let (holder, remedies) = remedies_at_oom("fails", None, (90 * GIB, 18 * GIB, 80 * GIB));
    let other = remedies
        .iter()
        .find(|r| {
            r.remedy
                .to_string()
                .starts_with(&format!("empty_cache() in pid {holder}"))
        })
        .expect("a verdict for the other process");
    assert_eq!(other.verdict, Verdict::Fails, "{other:?}");
}

#[test]
fn under_a_memory_fraction_the_other_cache_does_not_matter() {
    // 7.9 GiB allowed and 18 GiB free on the device: the fraction refused it.
    let (_, remedies) = remedies_at_oom("capped", None, (GIB, 18 * GIB, 7900 * MIB));
    let other = remedies
        .iter()
        .find(|r| r.remedy.to_string().starts_with("empty_cache() in pid"))
        .expect("a verdict for the other process");
    assert_eq!(other.verdict, Verdict::Fails, "{other:?}");
    assert!(other.reason.contains("memory fraction"), "{other:?}");
}

#[test]
fn a_process_on_another_gpu_is_not_offered() {
    // The holder's CUDA_VISIBLE_DEVICES puts its device 0 on GPU 1; the job is on GPU 0.
    let (_, remedies) = remedies_at_oom("elsewhere", Some("1"), (30 * GIB, 18 * GIB, 80 * GIB));
    assert!(
        !remedies
            .iter()
            .any(|r| r.remedy.to_string().starts_with("empty_cache() in pid")),
        "{remedies:#?}"
    );
}

#[test]
fn the_gpus_uuid_decides_where_both_hooks_send_it() {
    const A: &str = "GPU-aaaa";
    const B: &str = "GPU-bbbb";
    let offered = |remedies: &[RemedyVerdict]| {
        remedies
            .iter()
            .any(|r| r.remedy.to_string().starts_with("empty_cache() in pid"))
    };
    // Its CUDA_VISIBLE_DEVICES says GPU 1 (it may have changed it in its code since), but
    // torch says the same GPU as the job's.
    let (_, same) = remedies_with_uuids(
        "uuid-same",
        Some("1"),
        (30 * GIB, 18 * GIB, 80 * GIB),
        (Some(A), Some(A)),
    );
    assert!(offered(&same), "{same:#?}");
    // Both started with the same environment, but are on different GPUs.
    let (_, other) = remedies_with_uuids(
        "uuid-other",
        None,
        (30 * GIB, 18 * GIB, 80 * GIB),
        (Some(A), Some(B)),
    );
    assert!(!offered(&other), "{other:#?}");
}
