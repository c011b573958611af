//! `vramtop replay` and `vramtop snapshot` as a user runs them: reports, summaries, and
//! one line with exit 2 for every way a file can be wrong. Files are written to a
//! fresh folder under the system temp dir; stdout is a pipe, so no TUI opens.

#[path = "support/trace_support.rs"]
mod support;
#[path = "support/temp_dir.rs"]
mod temp_dir;

use std::path::Path;

use assert_cmd::Command;
use predicates::prelude::*;
use support::{block, pickle, segment, small_snapshot, snapshot, P};

const LEAK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/linear_leak.pickle.gz"
);

fn vramtop() -> Command {
    let mut cmd = Command::cargo_bin("vramtop").expect("binary built");
    cmd.env_remove("VRAMTOP_INTERVAL")
        .env_remove("VRAMTOP_DEVICE");
    cmd
}

/// Writes `bytes` to `name` in this test's own folder under the temp dir.
fn temp_file(test: &str, name: &str, bytes: &[u8]) -> temp_dir::TempFile {
    temp_dir::TempFile::new(&format!("replay-cli-{test}"), name, bytes)
}

/// Runs `args` + `path`; expects exit 2, nothing on stdout and one stderr line
/// `vramtop: <path>: ...` containing `what`.
fn fails_with_one_line(args: &[&str], path: &Path, what: &str) {
    let out = vramtop()
        .args(args)
        .arg(path)
        .assert()
        .code(2)
        .stdout(predicate::str::is_empty())
        .get_output()
        .stderr
        .clone();
    let text = String::from_utf8(out).expect("utf-8 stderr");
    let prefix = format!("vramtop: {}: ", path.display());
    assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
    assert!(text.starts_with(&prefix), "{args:?}: {text}");
    assert!(text.contains(what), "{args:?}: wanted '{what}' in {text}");
}

fn bad_files() -> Vec<(temp_dir::TempFile, &'static str)> {
    let leak = std::fs::read(LEAK).unwrap_or_else(|e| panic!("{LEAK}: {e}"));
    let rmm = "Thread,Time,Action,Pointer,Size,Stream\n\
               1,00:00:00.100000,allocate,0x7f8a40000000,1024,0x0\n\
               1,00:00:00.200000,allocate,0x7f8a40000400,lots,0x0\n";
    let other = pickle(&P::List(vec![P::Int(1), P::Int(2)]));
    vec![
        (temp_file("bad", "empty.pickle", b""), "empty"),
        (
            temp_file("bad", "notes.txt", b"hello, not a trace\n"),
            "not a trace vramtop knows",
        ),
        (
            temp_file("bad", "list.pickle", &other),
            "not a memory snapshot",
        ),
        (
            temp_file("bad", "cut.pickle.gz", &leak[..leak.len() / 2]),
            "cut short",
        ),
        (temp_file("bad", "bad.csv", rmm.as_bytes()), "row 3"),
    ]
}

#[test]
fn bad_files_are_one_line_and_exit_2() {
    for (path, what) in bad_files() {
        fails_with_one_line(&["replay", "--report"], &path, what);
        fails_with_one_line(&["replay"], &path, what);
        fails_with_one_line(&["snapshot", "--once"], &path, what);
    }
    let missing = std::env::temp_dir().join("vramtop-replay-cli-no-such-file.pickle");
    fails_with_one_line(&["replay", "--report"], &missing, "cannot read the file");
}

#[test]
fn report_json_on_linear_leak() {
    let out = vramtop()
        .args(["replay", LEAK, "--report", "--json", "--policy", "all"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
    let rows = report["policies"].as_array().expect("a list of rows");
    // No OOM in the trace: no capacity to bound, no remedies.
    assert_eq!(report["capacity"], serde_json::Value::Null);
    assert_eq!(report["trace_ooms"], serde_json::json!([]));
    let names: Vec<&str> = rows.iter().filter_map(|r| r["policy"].as_str()).collect();
    assert_eq!(
        names,
        [
            "caching",
            "best-fit",
            "first-fit",
            "tlsf",
            "expandable",
            "pytorch-expandable"
        ]
    );
    for row in rows {
        assert_eq!(row["events"], 460, "{row}");
        // The trace-only live peak (172 MiB: the kept relu outputs and temporaries).
        assert_eq!(row["peak_live_bytes"], 180_355_072u64, "{row}");
        assert_eq!(row["peak_live_bytes_with_initial"], 315_637_760u64, "{row}");
        let reserved = row["peak_reserved_bytes"].as_u64().expect("reserved");
        assert!(reserved >= 315_637_760, "{row}");
        assert_eq!(row["ooms"], 0, "{row}");
        assert!(
            row["backing_calls"].as_u64().is_some_and(|n| n > 0),
            "{row}"
        );
        assert!(
            row["ns_per_event"].as_f64().is_some_and(|n| n > 0.0),
            "{row}"
        );
        assert!(
            row["external_fragmentation_at_peak"].as_f64().is_some(),
            "{row}"
        );
        assert_eq!(row["counts"]["free_requests"], 140, "{row}");
    }
}

#[test]
fn report_table_and_replay_without_a_terminal() {
    for args in [vec!["replay", LEAK, "--report"], vec!["replay", LEAK]] {
        vramtop()
            .args(&args)
            .assert()
            .success()
            .stdout(predicate::str::contains(
                "linear_leak.pickle.gz: PyTorch memory snapshot, 460 events",
            ))
            .stdout(predicate::str::contains("caching"))
            .stdout(predicate::str::contains("ns/event"));
    }
}

#[test]
fn a_capacity_makes_ooms_that_are_counted() {
    let rmm = "Thread,Time,Action,Pointer,Size,Stream\n\
               1,00:00:00.100000,allocate,0x1000,16777216,0x0\n\
               1,00:00:00.200000,allocate,0x2000,16777216,0x0\n\
               1,00:00:00.300000,free,0x2000,16777216,0x0\n\
               1,00:00:00.400000,free,0x9999,512,0x0\n\
               1,00:00:00.500000,free,0x1000,16777216,0x0\n\
               1,00:00:00.600000,free,0x1000,16777216,0x0\n";
    let path = temp_file("capacity", "two.csv", rmm.as_bytes());
    let out = vramtop()
        .args([
            "replay",
            "--report",
            "--json",
            "--policy",
            "first-fit",
            "--capacity",
            "30MiB",
        ])
        .arg(&path)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
    let row = &report["policies"][0];
    assert_eq!(row["ooms"], 1, "{row}");
    assert_eq!(row["counts"]["frees_after_oom"], 1, "{row}");
    // 0x9999 is freed without an alloc: allocated before the log began, placed first.
    assert_eq!(row["counts"]["initial_from_frees"], 1, "{row}");
    // 0x1000 is freed twice: the second free is of an address not live then.
    assert_eq!(row["counts"]["unknown_frees"], 1, "{row}");
    assert_eq!(
        row["trace_reserved_peak_bytes"],
        serde_json::Value::Null,
        "{row}"
    );
}

#[test]
fn snapshot_summaries() {
    let path = temp_file("snapshot", "small.pickle", &pickle(&small_snapshot()));
    vramtop()
        .args(["snapshot", "--once"])
        .arg(&path)
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "segments       1 (small pool 0, large pool 1)",
        ))
        .stdout(predicate::str::contains("reserved       2.0 MiB"))
        .stdout(predicate::str::contains("history        6 events"));

    // Segments, no history: says so, on stderr too (as a notice).
    let bare = snapshot(
        vec![segment(
            0x7f00_0000_0000,
            2 << 20,
            vec![block(0x7f00_0000_0000, 1 << 20, "active_allocated")],
        )],
        vec![],
    );
    let path = temp_file("snapshot", "bare.pickle", &pickle(&bare));
    vramtop()
        .arg("snapshot")
        .arg(&path)
        .assert()
        .success()
        .stderr(predicate::str::contains("no allocation history"))
        .stdout(predicate::str::contains("history        none"))
        .stdout(predicate::str::contains(
            "free           1.0 MiB in 1 runs, largest 1.0 MiB",
        ));

    // An RMM log has events but no segments.
    let rmm = "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.1,allocate,0x1000,512,0x0\n";
    let path = temp_file("snapshot", "log.csv", rmm.as_bytes());
    fails_with_one_line(&["snapshot"], &path, "no segments to show");
}

/// The trace's own OOMs and the capacity they imply, as `replay --report` prints them
/// (a capped checkerboard on an H100, tests/fixtures).
#[test]
fn the_report_shows_the_traces_ooms_and_the_inferred_capacity() {
    let out = vramtop()
        .args(["replay", "--report", "--policy", "caching,expandable"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/oom_cap.pickle.gz"
        ))
        .output()
        .expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("capacity 7.9 GiB inferred from the trace's 2 OOM(s)"),
        "{err}"
    );
    assert!(text.contains("the trace's own OOMs (2):"), "{text}");
    assert!(
        text.contains("caching fails too, expandable fits"),
        "{text}"
    );
}

/// A snapshot of a torchrun job's rank on cuda:1 (two H200s, NCCL): PyTorch wrote
/// `snapshot` markers into cuda:0's ring too, and that trace of markers alone was taken
/// for the first device with history, so the rank's file opened on cuda:0, empty.
#[test]
fn a_ranks_snapshot_opens_on_its_own_device() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/snapshot_ddp2_rank1_cuda1.pickle.gz"
    );
    vramtop()
        .args(["snapshot", "--once", path])
        .assert()
        .success()
        .stderr(predicate::str::contains("traces for devices").not())
        .stdout(predicate::str::contains(
            "PyTorch memory snapshot, device 1",
        ))
        .stdout(predicate::str::contains("history        3,392 events"));
}
