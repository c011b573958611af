//! `vramtop completions SHELL` and `vramtop man`, from the real binary: each script names
//! the subcommands and flags `--help` offers, parses in its shell where that shell is
//! installed, and the man page renders with `man -l` where man is installed.

use std::io::Write;
use std::process::{Command, Stdio};

fn vramtop(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(args)
        .env_remove("VRAMTOP_CONFIG")
        .output()
        .expect("vramtop runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Run `shell` with `args`, the script on stdin: (passed, what it said).
fn check_with(shell: &str, args: &[&str], script: &str) -> (bool, String) {
    let mut child = Command::new(shell)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shell starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("feed the script");
    let out = child.wait_with_output().expect("shell ends");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn completions_for_each_shell_know_the_commands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (ok, script, err) = vramtop(&["completions", shell]);
        assert!(ok, "{shell}: {err}");
        for word in ["serve", "replay", "completions", "interval", "allow-remote"] {
            assert!(script.contains(word), "{shell} script lacks {word}");
        }
    }
    // The generated scripts are real shell code, checked by the shells themselves.
    let checks: [(&str, &[&str]); 3] = [("bash", &["-n"]), ("zsh", &["-n"]), ("fish", &["-n"])];
    for (shell, args) in checks {
        if !installed(shell) {
            eprintln!("{shell} not installed: its completion script is checked for content only");
            continue;
        }
        let (_, script, _) = vramtop(&["completions", shell]);
        let (ok, said) = check_with(shell, args, &script);
        assert!(ok, "{shell} -n refused the script: {said}");
    }
    if installed("bash") {
        // Loaded into bash, the function completes subcommands.
        let (_, script, _) = vramtop(&["completions", "bash"]);
        let probe = format!(
            "{script}\nCOMP_WORDS=(vramtop ser); COMP_CWORD=1; COMP_LINE='vramtop ser'; \
             COMP_POINT=11; _vramtop vramtop ser vramtop; printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
        );
        let (ok, said) = check_with("bash", &[], &probe);
        assert!(ok && said.lines().any(|l| l == "serve"), "{said}");
    }
}

#[test]
fn an_unknown_shell_is_one_line() {
    let (ok, _, err) = vramtop(&["completions", "tcsh"]);
    assert!(!ok);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("tcsh"), "{err}");
}

#[test]
fn man_page_matches_help_and_renders() {
    let (ok, page, err) = vramtop(&["man"]);
    assert!(ok, "{err}");
    assert!(
        page.starts_with(".ie"),
        "not roff: {}",
        &page[..page.len().min(80)]
    );
    assert!(page.contains(".TH vramtop 1"), "no title");
    let (_, help, _) = vramtop(&["--help"]);
    // Every long flag of --help is in the page (roff escapes dashes as \-).
    for flag in help
        .split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
    {
        let flag = flag.split(['=', '[', '<']).next().unwrap_or(flag);
        let flag = flag.trim_end_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
        let escaped = flag.replace('-', "\\-");
        assert!(
            page.contains(&escaped) || page.contains(flag),
            "man page lacks {flag}"
        );
    }
    if !installed("man") {
        eprintln!("man not installed: the page is checked as roff text only");
        return;
    }
    let mut child = Command::new("man")
        .args(["-l", "-"])
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "100")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("man starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("feed man");
    let out = child.wait_with_output().expect("man ends");
    let shown = String::from_utf8_lossy(&out.stdout);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "man -l failed: {said}");
    assert!(!said.contains("warning"), "man warned: {said}");
    for text in [
        "NAME",
        "SYNOPSIS",
        "vramtop",
        "SUBCOMMANDS",
        "serve",
        "--interval",
        "config.toml",
    ] {
        assert!(shown.contains(text), "rendered page lacks {text}:\n{shown}");
    }
}

#[test]
fn man_dir_writes_a_page_per_subcommand() {
    let dir = std::env::temp_dir().join(format!("vramtop-man-{}", std::process::id()));
    let (ok, said, err) = vramtop(&["man", "--dir", dir.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    assert!(said.contains("vramtop-serve.1"), "{said}");
    let serve = std::fs::read_to_string(dir.join("vramtop-serve.1")).expect("serve page");
    assert!(
        serve.contains("token\\-file"),
        "serve page lacks --token-file"
    );
    assert!(
        !dir.join("vramtop-gpu-self-check.1").exists(),
        "hidden command got a page"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
