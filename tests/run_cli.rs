//! `vramtop run`, `vramtop hook-path` and `vramtop attach` as a user runs them, with real
//! child processes (no torch here: the hook must leave such a job untouched).

#[path = "support/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;

fn socket_dir(name: &str) -> TempDir {
    TempDir::new(&format!("run-{name}"))
}

fn vramtop(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("vramtop").expect("binary built");
    cmd.env_remove("VRAMTOP_INTERVAL")
        .env_remove("VRAMTOP_DEVICE")
        .env_remove("VRAMTOP_HISTORY")
        .env("VRAMTOP_SOCKET_DIR", dir);
    cmd
}

#[test]
fn output_and_exit_code_pass_straight_through_when_not_a_terminal() {
    let dir = socket_dir("passthrough");
    vramtop(&dir)
        .args(["run", "--", "sh", "-c", "echo hi; echo oops >&2; exit 3"])
        .assert()
        .code(3)
        .stdout("hi\n")
        .stderr("oops\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_signal_gives_128_plus_n_as_a_shell_does() {
    let dir = socket_dir("signal");
    vramtop(&dir)
        .args(["run", "--", "sh", "-c", "kill -9 $$"])
        .assert()
        .code(137)
        .stdout("");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_hook_directory_goes_first_on_pythonpath() {
    let dir = socket_dir("env");
    let out = vramtop(&dir)
        .env("PYTHONPATH", "/opt/mine")
        .args([
            "run",
            "--history",
            "--",
            "sh",
            "-c",
            "echo \"$PYTHONPATH\"; echo \"$VRAMTOP_SOCKET_DIR\"; echo \"$VRAMTOP_HISTORY\"",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    let (hook_dir, rest) = lines[0].split_once(':').expect("two entries");
    assert_eq!(rest, "/opt/mine");
    let hook_dir = PathBuf::from(hook_dir);
    assert!(hook_dir.starts_with(&dir), "{hook_dir:?} under {dir:?}");
    assert!(hook_dir.join("sitecustomize.py").is_file());
    assert!(hook_dir.join("vramtop_hook/__init__.py").is_file());
    assert_eq!(lines[1], dir.to_str().expect("utf-8 path"));
    assert_eq!(lines[2], "1");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&hook_dir)
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "the hook directory is private");
    let _ = std::fs::remove_dir_all(&dir);
}

fn python3() -> bool {
    std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn a_python_job_without_torch_runs_untouched_and_loads_the_bootstrap() {
    if !python3() {
        eprintln!("python3 not found: skipped");
        return;
    }
    let dir = socket_dir("python");
    // The bootstrap ran (its torch-import watch is on the meta path), and nothing else.
    let script = "import sys\n\
                  names = [getattr(f, '__name__', '') for f in sys.meta_path]\n\
                  print('_TorchImportWatch' in names)\n\
                  print('torch' in sys.modules, 'vramtop_hook' in sys.modules)\n\
                  sys.exit(4)";
    vramtop(&dir)
        .args(["run", "--", "python3", "-c", script])
        .assert()
        .code(4)
        .stdout("True\nFalse False\n")
        .stderr("");
    // No torch, no socket.
    let sockets = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".sock"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(sockets, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_command_is_one_line() {
    let dir = socket_dir("missing");
    vramtop(&dir)
        .args(["run", "--", "/nonexistent/train"])
        .assert()
        .code(1)
        .stdout("")
        .stderr("vramtop: /nonexistent/train: command not found\n");
    vramtop(&dir)
        .arg("run")
        .assert()
        .code(2)
        .stderr("vramtop: vramtop run needs a command: vramtop run -- python train.py\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hook_path_prints_a_private_directory_with_the_hook() {
    let dir = socket_dir("hookpath");
    let out = vramtop(&dir)
        .arg("hook-path")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let path = PathBuf::from(String::from_utf8(out).expect("utf-8").trim_end());
    assert!(path.join("vramtop_hook/__init__.py").is_file(), "{path:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attach_without_jobs_says_where_it_looked() {
    let dir = socket_dir("nojobs");
    let out = vramtop(&dir)
        .args(["attach", "--seconds", "0.3", "--interval", "0.1", "--json"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("no hooked job in"))
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.lines().count() >= 2, "{text}");
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(v["attached"], serde_json::json!([]));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
