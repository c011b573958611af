//! The binary as a user runs it: help, one-shot output, and bad input.

use assert_cmd::Command;
use predicates::prelude::*;

#[path = "support/json_doc.rs"]
mod json_doc;

fn vramtop() -> Command {
    let mut cmd = Command::cargo_bin("vramtop").expect("binary built");
    // Keep the environment from steering the run.
    cmd.env_remove("VRAMTOP_INTERVAL")
        .env_remove("VRAMTOP_DEVICE");
    cmd
}

#[test]
fn help_lists_options_and_subcommands() {
    let out = vramtop()
        .arg("--help")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).expect("utf-8 help");
    insta::assert_snapshot!("help", text);
}

#[test]
fn once_prints_a_labelled_table() {
    vramtop()
        .args(["--once", "--device", "sim"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "sim0  simulated H100 80GB  (no NVIDIA driver found)",
        ))
        .stdout(predicate::str::contains("source: simulated"))
        .stdout(predicate::str::contains("DRIVER"));
}

#[test]
fn once_json_has_the_documented_fields() {
    let out = vramtop()
        .args(["--once", "--json", "--device", "sim"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
    assert_eq!(v["schema"], 1);
    json_doc::assert_documented("--once --json", &v);
    let devices = v["devices"].as_array().expect("devices array");
    assert_eq!(devices.len(), 1);
    let d = &devices[0];
    assert_eq!(d["index"], 0);
    assert_eq!(d["simulated"], true);
    assert!(d["name"].as_str().is_some_and(|n| n.contains("simulated")));
    let total = d["memory_total_bytes"].as_u64().expect("total");
    let used = d["memory_used_bytes"].as_u64().expect("used");
    let reserved = d["memory_reserved_bytes"].as_u64().expect("reserved");
    assert!(used + reserved <= total);
    assert!(d["processes"].as_array().is_some());
    // Unknown figures are null, never 0: the simulated H100 has no fan, like the real one.
    assert!(d["fan_pct"].is_null());
}

#[test]
fn a_pipe_gets_the_one_shot_table() {
    // assert_cmd gives the child a pipe for stdout, not a terminal.
    vramtop()
        .args(["--device", "sim"])
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .success()
        .stdout(predicate::str::contains("DEVICE"));
}

fn one_line_error(args: &[&str], flag: &str) {
    let out = vramtop().args(args).assert().code(2).get_output().clone();
    let err = String::from_utf8(out.stderr).expect("utf-8");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(flag), "{args:?}: {err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_interval_is_one_line_with_the_range() {
    one_line_error(&["--interval", "0"], "--interval");
    one_line_error(&["--interval", "abc"], "--interval");
    let out = vramtop()
        .args(["--interval", "0"])
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    assert!(String::from_utf8_lossy(&out).contains("0.05 to 3600"));
}

#[test]
fn negative_seed_and_unknown_flag_are_one_line() {
    one_line_error(&["--seed", "-1"], "--seed");
    one_line_error(&["--frobnicate"], "--frobnicate");
}

#[test]
fn nvml_only_without_a_driver_exits_1() {
    vramtop()
        .args(["--device", "nvml", "--once"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("NVML"));
}
