//! The OOM nobody watched: `vramtop run` in a batch job (stdout to a file, stdin not a
//! terminal) keeps each OOM of its job and explains it on stderr after the job, with the
//! job's exit code unchanged. Real processes: vramtop, the real hook, and a Python job on
//! the stub torch (SIMULATED: tests/hook/stub_torch, no GPU here).

#[path = "support/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;

fn python3() -> bool {
    let found = Command::new("python3").arg("--version").output().is_ok();
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 not found, and CI=true: the batch OOM tests must run in CI"
        );
        eprintln!("skipped: python3 not found, so the batch OOM tests did not run");
    }
    found
}

fn temp_dir(name: &str) -> TempDir {
    TempDir::new(&format!("oom-{name}"))
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `vramtop run [extra] -- python3 job_driver.py` with `commands` on its stdin and its
/// stdout going to `dir/job.log`: (exit code, stderr).
fn batch_run(dir: &Path, extra: &[&str], env: &[(&str, &Path)], commands: &str) -> (i32, String) {
    let log = std::fs::File::create(dir.join("job.log")).expect("log file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vramtop"));
    cmd.arg("run")
        .args(extra)
        .arg("--")
        .arg("python3")
        .arg(repo("tests/hook/job_driver.py"))
        .env("PYTHONPATH", repo("tests/hook/stub_torch"))
        .env("VRAMTOP_SOCKET_DIR", dir.join("sockets"))
        .env_remove("VRAMTOP_OOM_DIR")
        .env_remove("VRAMTOP_HISTORY")
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(Stdio::piped());
    for (key, value) in env {
        cmd.env(key, value);
    }
    let mut child = cmd.spawn().expect("vramtop runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(commands.as_bytes())
        .expect("commands sent");
    let out = child.wait_with_output().expect("vramtop ends");
    let code = out.status.code().expect("an exit code");
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `text` with each "pid 1234" read as "pid N".
fn strip_pids(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("pid ") {
        out.push_str(&rest[..at + 4]);
        let after = &rest[at + 4..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        out.push_str(if digits > 0 { "N" } else { "" });
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

fn kept_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("vramtop-oom-") && n.ends_with(".pickle"))
        .collect();
    names.sort();
    names
}

fn vramtop_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("vramtop:"))
        .collect()
}

#[test]
fn a_job_that_dies_of_an_oom_leaves_its_explanation_and_the_state() {
    if !python3() {
        return;
    }
    let dir = temp_dir("dies");
    let commands = format!(
        "import\ninit\nalloc a {}\nalloc b {}\nfree a\noom_uncaught {}\n",
        6 * MIB,
        6 * MIB,
        1024 * MIB
    );
    let (code, stderr) = batch_run(&dir, &[], &[], &commands);
    assert_eq!(code, 1, "the job's exit code passes through: {stderr}");
    assert!(stderr.contains("OutOfMemoryError"), "{stderr}");
    // Beside the log, named for this run.
    let files = kept_files(&dir);
    assert_eq!(files.len(), 1, "{files:?} {stderr}");
    assert!(files[0].starts_with("vramtop-oom-run"), "{files:?}");
    assert!(files[0].ends_with("-1.pickle"), "{files:?}");
    let file = dir.join(&files[0]);

    // After the job's own lines, each of vramtop's starts `vramtop:`.
    let lines = vramtop_lines(&stderr);
    let block = lines.join("\n");
    assert!(lines[0].starts_with("vramtop: OOM 1 of pid "), "{block}");
    assert!(lines[0].contains("job_driver.py"), "{block}");
    assert!(
        block.contains(
            "OOM: needed 1.0 GiB contiguous; 6.0 MiB free in 1 runs, largest 6.0 MiB; \
             PyTorch held 12.0 MiB reserved, 6.0 MiB allocated"
        ),
        "{block}"
    );
    assert!(
        block.contains("PyTorch: Tried to allocate 1024.00 MiB"),
        "{block}"
    );
    // Replayed at the cap the hook kept (the stub's 8 GiB, 7.99 GiB free), the request
    // fits, as the remedies below say ("does not fail where PyTorch failed").
    assert!(
        block.contains("vramtop replay: caching fits, pytorch-expandable fits"),
        "{block}"
    );
    assert!(
        block.contains("largest live blocks: 6.0 MiB (no call sites: run with --history"),
        "{block}"
    );
    assert!(
        block.contains(&format!("kept in {} (", dir.join(&files[0]).display())),
        "{block}"
    );
    assert!(block.contains("open it with: vramtop snapshot "), "{block}");
    let job_error = stderr.find("OutOfMemoryError").expect("the traceback");
    let first_ours = stderr.find("vramtop: OOM 1").expect("our block");
    assert!(
        job_error < first_ours,
        "vramtop speaks after the job: {stderr}"
    );

    // The file opens later with no GPU and says the same.
    let once = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(["snapshot", "--once"])
        .arg(&file)
        .output()
        .expect("snapshot runs");
    assert!(once.status.success());
    let text = String::from_utf8_lossy(&once.stdout);
    assert!(
        text.contains("OOM: needed 1.0 GiB contiguous; 6.0 MiB free in 1 runs, largest 6.0 MiB"),
        "{text}"
    );
    assert!(text.contains("reserved       12.0 MiB"), "{text}");
    // The hook's event ring kept the job's whole history (the stub's events: two
    // allocations with their segments, a free, the OOM; the free's `free_requested` is not
    // recorded, as with PyTorch 2.11's skip_actions), so the remedies come from a replay,
    // at the cap the hook kept (the stub's 8 GiB). The stub raised an OOM that cap had
    // room for, which the replay finds and so judges nothing.
    assert!(
        text.contains("history        6 events (vramtop replay shows them)"),
        "{text}"
    );
    assert!(
        block.contains(
            "expandable_segments:True: cannot tell: vramtop's replay of this trace does not \
             fail where PyTorch failed"
        ),
        "{block}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_under_cuda_malloc_async_that_dies_of_an_oom_is_named_from_pytorchs_words() {
    if !python3() {
        return;
    }
    let dir = temp_dir("async");
    // 3 MiB live, 9 GiB asked of the stub's 8 GiB: the limit is passed whatever is live.
    let commands = format!(
        "import\ninit\nalloc a {}\noom_uncaught {}\n",
        3 * MIB,
        9 * 1024 * MIB
    );
    let conf = Path::new("backend:cudaMallocAsync");
    let (code, stderr) = batch_run(&dir, &[], &[("PYTORCH_CUDA_ALLOC_CONF", conf)], &commands);
    assert_eq!(code, 1, "the job's exit code passes through: {stderr}");
    // No state to keep under this backend: no pickle, PyTorch's words instead.
    assert!(kept_files(&dir).is_empty(), "{stderr}");
    let block = vramtop_lines(&stderr).join("\n");
    // Its pid, as the line of a native allocator's OOM names it.
    let block = strip_pids(&block);
    assert!(
        block.contains(
            "vramtop: OOM 1 of pid N under backend:cudaMallocAsync: needed 9.00 GiB; cause: the \
             job's live tensors (3.00 MiB) and the request (9.00 GiB) exceed the limit its memory \
             fraction sets (8.00 GiB) by 1.00 GiB"
        ),
        "{block}"
    );
    assert!(
        block.contains("apply to the native allocator only"),
        "{block}"
    );
}

#[test]
fn a_job_under_cuda_malloc_async_that_catches_its_ooms_has_each_explained_after_it() {
    if !python3() {
        return;
    }
    let dir = temp_dir("async-caught");
    // A batch-size finder's way: each OOM caught, a smaller try next, then the job ends well.
    let mut commands = format!("import\ninit\nalloc a {}\n", 3 * MIB);
    for size in [10 * 1024, 9 * 1024] {
        commands += &format!("oom {}\n", size * MIB);
    }
    commands += "exit 0\n";
    let conf = Path::new("backend:cudaMallocAsync");
    let (code, stderr) = batch_run(&dir, &[], &[("PYTORCH_CUDA_ALLOC_CONF", conf)], &commands);
    assert_eq!(code, 0, "{stderr}");
    let block = strip_pids(&vramtop_lines(&stderr).join("\n"));
    for (n, asked) in [(1, "10.00 GiB"), (2, "9.00 GiB")] {
        assert!(
            block.contains(&format!(
                "vramtop: OOM {n} of pid N under backend:cudaMallocAsync (caught by the job): \
                 needed {asked}; cause: the job's live tensors (3.00 MiB) and the request \
                 ({asked})"
            )),
            "{block}"
        );
    }
    // Why there is no more, once.
    assert_eq!(block.matches("native allocator only").count(), 1, "{block}");
}

#[test]
fn a_job_that_catches_its_ooms_goes_on_and_the_first_three_and_the_last_are_kept() {
    if !python3() {
        return;
    }
    let dir = temp_dir("catches");
    let mut commands = format!("import\ninit\nalloc a {}\n", 3 * MIB);
    for size in [100, 200, 300, 400, 500] {
        commands += &format!("oom {}\n", size * MIB);
    }
    commands += "exit 0\n";
    let (code, stderr) = batch_run(&dir, &[], &[], &commands);
    assert_eq!(code, 0, "{stderr}");
    let files = kept_files(&dir);
    let suffixes: Vec<&str> = files
        .iter()
        .map(|f| f.rsplit('-').next().unwrap_or(""))
        .collect();
    assert_eq!(
        suffixes,
        ["1.pickle", "2.pickle", "3.pickle", "last.pickle"],
        "{files:?}"
    );
    let block = vramtop_lines(&stderr).join("\n");
    for n in [1, 2, 3, 5] {
        assert!(
            block.contains(&format!("vramtop: OOM {n} of pid ")),
            "{block}"
        );
    }
    assert!(!block.contains("vramtop: OOM 4 of pid"), "{block}");
    assert!(block.contains("needed 500.0 MiB contiguous"), "{block}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quiet_keeps_the_files_and_prints_nothing_of_its_own() {
    if !python3() {
        return;
    }
    let dir = temp_dir("quiet");
    let commands = format!("import\ninit\noom {}\nexit 0\n", 64 * MIB);
    let (code, stderr) = batch_run(&dir, &["--quiet"], &[], &commands);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(kept_files(&dir).len(), 1);
    assert!(vramtop_lines(&stderr).is_empty(), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_folder_that_cannot_be_written_costs_one_line_not_the_job() {
    if !python3() {
        return;
    }
    let dir = temp_dir("unwritable");
    // Root writes anywhere, but not under a plain file.
    let blocked = dir.join("a-file");
    std::fs::write(&blocked, "not a folder").expect("file");
    let target = blocked.join("oom");
    let commands = format!("import\ninit\noom {0}\noom {0}\nexit 4\n", 64 * MIB);
    let (code, stderr) = batch_run(&dir, &[], &[("VRAMTOP_OOM_DIR", &target)], &commands);
    assert_eq!(code, 4, "{stderr}");
    let lines = vramtop_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("could not keep the allocator state at an OOM in"),
        "{stderr}"
    );
    assert!(lines[0].contains("the job goes on"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job that dies of an OOM but does not end (a torchrun job whose rank ran out, waiting
/// in NCCL's teardown: seen on two H200s): its OOM is explained while it still waits,
/// once, and not again after it; the mark the hook left for it is gone.
#[test]
fn a_job_that_waits_after_dying_of_an_oom_has_it_explained_meanwhile() {
    if !python3() {
        return;
    }
    let dir = temp_dir("waits");
    let commands = format!(
        "import\ninit\nalloc a {}\nhang_at_exit 4\noom_uncaught {}\n",
        6 * MIB,
        1024 * MIB
    );
    // As torchrun sets them for its second rank.
    let (code, stderr) = batch_run(
        &dir,
        &[],
        &[
            ("VRAMTOP_OOM_HANG_S", Path::new("0.5")),
            ("RANK", Path::new("1")),
            ("WORLD_SIZE", Path::new("2")),
        ],
        &commands,
    );
    assert_eq!(code, 1, "{stderr}");
    let header = vramtop_lines(&stderr)
        .into_iter()
        .find(|l| l.starts_with("vramtop: OOM 1 of pid "))
        .unwrap_or_default();
    assert!(header.contains(", rank 1 of 2 ("), "{stderr}");
    let early = stderr
        .find("died of an OOM")
        .unwrap_or_else(|| panic!("no early explanation: {stderr}"));
    let ended = stderr
        .find("job: exit after waiting")
        .unwrap_or_else(|| panic!("the job's wait did not end: {stderr}"));
    assert!(early < ended, "explained only after the job: {stderr}");
    assert!(
        stderr[early..ended].contains("OOM: needed 1.0 GiB contiguous"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("vramtop: OOM 1 of pid").count(),
        1,
        "{stderr}"
    );
    let marks: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with("-dying.json"))
        .collect();
    assert!(marks.is_empty(), "{marks:?}");
    assert_eq!(kept_files(&dir).len(), 1, "{stderr}");
}
