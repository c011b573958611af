//! The settings file as a user meets it: a real file in a scratch XDG_CONFIG_HOME, the
//! real binary, and the policy a headless probe reports as the witness of which layer
//! won: flag > environment > file > default. A bad file is one line naming the file, the
//! line and the field, and the run goes on with the defaults.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

#[path = "support/pty.rs"]
mod pty;
use pty::Pty;

/// A scratch XDG_CONFIG_HOME, removed on drop.
struct ConfigHome(PathBuf);

impl ConfigHome {
    fn new(tag: &str) -> ConfigHome {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "vramtop-config-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("vramtop")).expect("scratch config home");
        ConfigHome(dir)
    }
    fn file(&self) -> PathBuf {
        self.0.join("vramtop").join("config.toml")
    }
    fn write(&self, text: &str) {
        std::fs::write(self.file(), text).expect("write config.toml");
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ConfigHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `vramtop probe steady` with the config home, extra environment and flags: (policy
/// reported, stderr, exit code).
fn probe(home: &ConfigHome, env: &[(&str, &str)], flags: &[&str]) -> (String, String, i32) {
    let mut cmd = Command::cargo_bin("vramtop").expect("binary built");
    cmd.env("XDG_CONFIG_HOME", home.path())
        .env_remove("VRAMTOP_CONFIG")
        .env_remove("VRAMTOP_POLICY")
        .env_remove("VRAMTOP_BACKING")
        .env_remove("VRAMTOP_PROBE_LIMIT")
        .args(["probe", "steady", "--seconds", "0.2", "--json"])
        .args(["--backing", "bookkeeping"])
        .args(flags);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("vramtop probe runs");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    (
        report["policy"].as_str().unwrap_or("").to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
        out.status.code().unwrap_or(-1),
    )
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let home = ConfigHome::new("precedence");
    // No file: the built-in default.
    assert_eq!(probe(&home, &[], &[]).0, "caching");
    home.write("policy = \"tlsf\"\n");
    assert_eq!(probe(&home, &[], &[]).0, "tlsf");
    let env = [("VRAMTOP_POLICY", "best-fit")];
    assert_eq!(probe(&home, &env, &[]).0, "best-fit");
    assert_eq!(
        probe(&home, &env, &["--policy", "first-fit"]).0,
        "first-fit"
    );
    // A flag equal to the default still counts as given: the file does not override it.
    assert_eq!(probe(&home, &[], &["--policy", "caching"]).0, "caching");
}

#[test]
fn config_flag_and_env_name_another_file() {
    let home = ConfigHome::new("explicit");
    home.write("policy = \"tlsf\"\n");
    let other = home.path().join("other.toml");
    std::fs::write(&other, "policy = \"expandable\"\n").expect("write other.toml");
    let other = other.to_str().expect("utf-8 path");
    assert_eq!(
        probe(&home, &[], &["--config", other]).0,
        "expandable",
        "--config FILE"
    );
    assert_eq!(
        probe(&home, &[("VRAMTOP_CONFIG", other)], &[]).0,
        "expandable",
        "VRAMTOP_CONFIG"
    );
}

#[test]
fn a_bad_file_is_one_line_and_the_defaults() {
    let home = ConfigHome::new("bad");
    home.write("# mine\npolicy = \"tlsf\"\ninterval = 0\n");
    let (policy, err, code) = probe(&home, &[], &[]);
    assert_eq!(code, 0, "{err}");
    // The whole file is set aside, not just the bad line.
    assert_eq!(policy, "caching");
    let file = home.file();
    let line = format!("vramtop: {} line 3: `interval`:", file.display());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with(&line), "{err}");
    assert!(err.contains("accepted range"), "{err}");
    assert!(err.contains("default settings"), "{err}");

    home.write("polcy = \"tlsf\"\n");
    let (policy, err, code) = probe(&home, &[], &[]);
    assert_eq!((policy.as_str(), code), ("caching", 0), "{err}");
    assert!(err.contains("line 1:"), "{err}");
    assert!(err.contains("unknown field `polcy`"), "{err}");

    home.write("policy = [\n");
    let (_, err, code) = probe(&home, &[], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn the_one_shot_view_starts_despite_a_bad_file() {
    let home = ConfigHome::new("once");
    home.write("sort = \"name\"\n");
    let out = Command::cargo_bin("vramtop")
        .expect("binary built")
        .env("XDG_CONFIG_HOME", home.path())
        .env_remove("VRAMTOP_CONFIG")
        .args(["--once", "--device", "sim"])
        .output()
        .expect("vramtop --once runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("simulated"));
    assert!(err.contains("line 1: `sort`: not a sort column"), "{err}");
}

#[test]
fn saved_settings_are_read_back() {
    use vramtop::app::SortKey;
    use vramtop::config::{ConfigFile, Saver};
    let home = ConfigHome::new("save");
    home.write("theme = \"light\"\n");
    let cli =
        vramtop::cli::parse(["vramtop", "--interval", "0.5", "--policy", "tlsf"]).expect("parses");
    let config = ConfigFile {
        path: Some(home.file()),
        from_file: vramtop::config::file::read(&home.file())
            .expect("readable")
            .expect("present"),
        notice: None,
    };
    let saver = Saver::new(config, &cli.live);
    let said = saver.save(0.5, SortKey::Pid);
    assert_eq!(said, format!("settings saved to {}", home.file().display()));
    let back = vramtop::config::file::read(&home.file())
        .expect("readable")
        .expect("present");
    assert_eq!(back.interval, Some(0.5));
    assert_eq!(back.sort, Some(SortKey::Pid));
    assert_eq!(back.policy, Some(vramtop::alloc::PolicyKind::Tlsf));
    // What the file said and the live view does not change survives the save.
    assert_eq!(
        back.theme,
        Some(vramtop::ui::screen_theme::ScreenTheme::Light)
    );
    // A folder that cannot be created: one line, nothing written.
    let blocked = ConfigFile {
        path: Some(PathBuf::from("/proc/vramtop/config.toml")),
        ..ConfigFile::default()
    };
    let said = Saver::new(blocked, &cli.live).save(1.0, SortKey::Memory);
    assert!(said.starts_with("settings not saved:"), "{said}");
}

/// F12 in the real live view, in a pseudo-terminal (`script`): the settings of the run
/// land in the file and the screen says where.
#[test]
fn f12_in_the_live_view_saves_the_settings() {
    let home = ConfigHome::new("f12");
    let args = "--device sim --interval 0.5 --policy tlsf";
    let Some(mut live) = Pty::spawn(args, 40, 120, &[("XDG_CONFIG_HOME", home.path())]) else {
        return;
    };
    let drawn = live.shows("simulated");
    if drawn {
        live.send(b"\x1b[24~");
    }
    let saved = drawn && live.shows("settings saved to");
    let exited = live.quit();
    assert!(drawn, "the live view never drew");
    assert!(saved, "no 'settings saved' notice after F12");
    assert!(exited.is_some(), "q did not end the live view");
    let back = vramtop::config::file::read(&home.file())
        .expect("readable")
        .expect("written by F12");
    assert_eq!(back.interval, Some(0.5));
    assert_eq!(back.policy, Some(vramtop::alloc::PolicyKind::Tlsf));
    assert_eq!(back.sort, Some(vramtop::app::SortKey::Memory));
}
