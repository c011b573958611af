//! `vramtop probe` as a user runs it: JSON fields, and one-line errors for bad input.

use assert_cmd::Command;

fn vramtop() -> Command {
    Command::cargo_bin("vramtop").expect("binary built")
}

#[test]
fn checkerboard_json_explains_the_oom() {
    let out = vramtop()
        .args([
            "probe",
            "checkerboard",
            "--backing",
            "host",
            "--probe-limit",
            "128MiB",
            "--json",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let r: serde_json::Value = serde_json::from_slice(&out).expect("JSON report");
    assert_eq!(r["verify_mismatches"], 0);
    assert_eq!(r["ooms"], 1);
    let oom = &r["last_oom"];
    let requested = oom["requested_bytes"].as_u64().expect("requested");
    let free = oom["total_free_bytes"].as_u64().expect("free");
    let largest = oom["largest_free_bytes"].as_u64().expect("largest");
    assert!(free > requested && largest < requested, "{oom}");
}

fn one_line_error(args: &[&str], needle: &str) {
    let out = vramtop().args(args).assert().code(2).get_output().clone();
    let err = String::from_utf8(out.stderr).expect("utf-8");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
}

#[test]
fn unknown_scenario_lists_the_known_ones() {
    one_line_error(&["probe", "nope"], "checkerboard");
}

#[test]
fn bad_scenario_file_names_file_line_and_field() {
    let path = std::env::temp_dir().join(format!("vramtop-bad-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "name = \"x\"\nsummary = \"y\"\n[[phase]]\nkind = \"alloc\"\ncaption = \"c\"\ntag = \"t\"\nsize = \"4 parsecs\"\n",
    )
    .expect("temp file");
    let p = path.to_string_lossy().to_string();
    one_line_error(&["probe", &p], "line 3");
    one_line_error(&["probe", &p], "parsecs");
    let _ = std::fs::remove_file(path);
}

#[test]
fn probe_limit_beyond_host_memory_is_refused() {
    one_line_error(
        &[
            "probe",
            "steady",
            "--backing",
            "host",
            "--probe-limit",
            "64TiB",
        ],
        "--probe-limit",
    );
}

#[test]
fn unknown_policy_is_one_line() {
    let out = vramtop()
        .args(["probe", "steady", "--policy", "buddy"])
        .assert()
        .code(2)
        .get_output()
        .clone();
    let err = String::from_utf8(out.stderr).expect("utf-8");
    assert!(err.contains("--policy") && err.contains("tlsf"), "{err}");
}

#[test]
fn no_cuda_here_is_a_clear_error() {
    if vramtop::backing::cuda::driver_present() {
        return; // a machine with a GPU: covered by scripts/gpu-check.sh
    }
    one_line_error(&["probe", "steady", "--backing", "cuda"], "libcuda");
}

#[test]
fn replay_leaks_points_at_the_kept_output() {
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/linear_leak.pickle.gz"
    );
    let out = vramtop()
        .args(["replay", trace, "--leaks", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let suspects: serde_json::Value = serde_json::from_slice(&out).expect("JSON list");
    let list = suspects.as_array().expect("a list");
    assert_eq!(list.len(), 1, "{suspects}");
    assert_eq!(list[0]["tag"], "torch_trace.py:68 step");
    assert!(list[0]["live_bytes"].as_u64().unwrap_or(0) > 0);
    assert!(list[0]["growth_bytes_per_window"].as_u64().unwrap_or(0) > 0);
    let resnet = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/resnet50_varbatch_train.pickle.gz"
    );
    vramtop()
        .args(["replay", resnet, "--leaks", "--json"])
        .assert()
        .success()
        .stdout(predicates::str::diff("[]\n"));
}
