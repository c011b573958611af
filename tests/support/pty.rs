//! Test support, included with `#[path]`: the real binary in a pseudo-terminal made by
//! util-linux's `script`, its screen read as it is drawn, keys typed into it.

#![allow(dead_code)] // each suite that includes this uses part of it

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The live view (or any screen) running in a pseudo-terminal of `rows` x `cols`.
pub struct Pty {
    child: Child,
    stdin: ChildStdin,
    /// Everything drawn so far, escape sequences included.
    screen: Arc<Mutex<String>>,
}

impl Pty {
    /// `None` (after saying why on stderr) where `script` is not installed.
    pub fn spawn(args: &str, rows: u16, cols: u16, envs: &[(&str, &Path)]) -> Option<Pty> {
        if !Path::new("/usr/bin/script").exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "/usr/bin/script (util-linux) is missing, and CI=true: install util-linux"
            );
            eprintln!("skipped: /usr/bin/script (util-linux) is not installed");
            return None;
        }
        let inner = format!(
            "stty rows {rows} cols {cols}; exec {} {args}",
            env!("CARGO_BIN_EXE_vramtop")
        );
        let mut command = std::process::Command::new("/usr/bin/script");
        command
            .args(["-qfec", &inner, "/dev/null"])
            .env_remove("VRAMTOP_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (key, value) in envs {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("script starts");
        let screen = Arc::new(Mutex::new(String::new()));
        let mut stdout = child.stdout.take().expect("stdout");
        let sink = Arc::clone(&screen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        let stdin = child.stdin.take().expect("stdin");
        Some(Pty {
            child,
            stdin,
            screen,
        })
    }

    /// Whether `text` has been drawn, within 20 s.
    pub fn shows(&self, text: &str) -> bool {
        let seen = || {
            self.screen
                .lock()
                .map(|s| s.contains(text))
                .unwrap_or(false)
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !seen() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        seen()
    }

    /// Types `bytes` (a key, or an escape sequence such as F12's `\x1b[24~`).
    pub fn send(&mut self, bytes: &[u8]) {
        let _ = self.stdin.write_all(bytes);
        let _ = self.stdin.flush();
    }

    /// Types `q` and waits up to 20 s for the program to end (killed after); its exit
    /// code, `None` when `q` did not end it.
    pub fn quit(mut self) -> Option<i32> {
        self.send(b"q");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut code = None;
        while code.is_none() && Instant::now() < deadline {
            code = self
                .child
                .try_wait()
                .ok()
                .flatten()
                .map(|s| s.code().unwrap_or(-1));
            std::thread::sleep(Duration::from_millis(50));
        }
        if code.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        code
    }
}

impl Drop for Pty {
    /// A test that fails before `quit` leaves no `script` and vramtop behind.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether `path` exists within 20 s (a file the program writes).
pub fn appears(path: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    path.exists()
}
