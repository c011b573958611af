//! The real hook (python/vramtop/_hook, as `vramtop run` writes it) inside a Python job, read by
//! the real vramtop: `vramtop run --history` with `vramtop attach --json` beside it. The
//! job uses the hook's stub torch (tests/hook/stub_torch: SIMULATED, a model of the
//! caching allocator, no GPU); without python3 or the stub the test says so and skips.

use std::path::{Path, PathBuf};

#[path = "support/json_doc.rs"]
mod json_doc;
use std::process::{Command, Stdio};

const JOB: &str = r#"
import time, torch
torch.cuda.init()
def keep(i):
    torch.cuda.stub_alloc("keep%d" % i, 3 * 1024 * 1024)  # KEEP-SITE
for i in range(8):
    keep(i)
    time.sleep(0.1)
try:
    torch.cuda.stub_oom(9 << 30)  # more than the stub's 8 GiB device
except torch.OutOfMemoryError:
    print("caught")
time.sleep(1.0)
"#;

fn stub_torch() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hook/stub_torch");
    dir.join("torch").is_dir().then_some(dir)
}

#[test]
fn a_hooked_python_job_is_seen_with_its_segments_sites_and_oom() {
    let python = Command::new("python3").arg("--version").output();
    let (Some(stub), true) = (stub_torch(), python.is_ok_and(|o| o.status.success())) else {
        eprintln!("python3 or tests/hook/stub_torch missing: skipped");
        return;
    };
    let work = std::env::temp_dir().join(format!("vramtop-hook-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");
    let job = work.join("job.py");
    std::fs::write(&job, JOB).expect("job");
    let sockets = work.join("sock");
    let bin = assert_cmd::cargo::cargo_bin("vramtop");
    let watcher = Command::new(&bin)
        .args([
            "attach",
            "--json",
            "--interval",
            "0.1",
            "--seconds",
            "20",
            "--until-ended",
        ])
        .env("VRAMTOP_SOCKET_DIR", &sockets)
        .stdout(Stdio::piped())
        .spawn()
        .expect("vramtop attach");
    let run = Command::new(&bin)
        .args(["run", "--history", "--", "python3"])
        .arg(&job)
        .env("VRAMTOP_SOCKET_DIR", &sockets)
        // Its output is a pipe here, so the OOM it keeps would land in the current folder.
        .env("VRAMTOP_OOM_DIR", &work)
        .env("PYTHONPATH", &stub)
        .output()
        .expect("vramtop run");
    assert_eq!(String::from_utf8_lossy(&run.stdout), "caught\n");
    assert_eq!(run.status.code(), Some(0));
    let watched = watcher.wait_with_output().expect("attach output");
    let text = String::from_utf8(watched.stdout).expect("utf-8");
    let last: serde_json::Value = text
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["attached"].as_array().is_some_and(|a| !a.is_empty()))
        .unwrap_or_else(|| panic!("no attached job in:\n{text}"));
    assert_eq!(last["schema"], 1);
    json_doc::assert_documented("attach --json", &last);
    let job_view = &last["attached"][0];
    assert_eq!(job_view["history"], true, "{job_view}");
    assert_eq!(job_view["ended"], true, "{job_view}");
    assert!(job_view["segments"].as_u64() >= Some(8), "{job_view}");
    assert_eq!(
        job_view["allocated_bytes"],
        job_view["stats"]["allocated_bytes"]
    );
    assert_eq!(
        job_view["reserved_bytes"],
        job_view["stats"]["reserved_bytes"]
    );
    let oom = &job_view["last_oom"];
    assert!(
        oom["line"]
            .as_str()
            .is_some_and(|l| l.starts_with("needed 9.0 GiB contiguous;")),
        "{oom}"
    );
    assert!(oom["pytorch_summary"]
        .as_str()
        .is_some_and(|s| s.contains("Tried to allocate")));
    // The hook's event ring held the whole history (8 allocations with their segments and
    // the OOM), so the live view replayed the file the hook kept under each remedy.
    assert_eq!(oom["history_events"], 17, "{oom}");
    let expandable = &oom["remedies"][0];
    assert_eq!(expandable["remedy"], "expandable_segments:True", "{oom}");
    assert!(
        expandable["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the job's own history replayed")),
        "{expandable}"
    );
    let site = format!("{}:5 keep", job.display());
    assert!(
        job_view["top_sites"]
            .as_array()
            .is_some_and(|s| s.iter().any(|t| t["site"] == site.as_str())),
        "wanted {site} in {}",
        job_view["top_sites"]
    );
    let _ = std::fs::remove_dir_all(&work);
}
