//! `vramtop serve` under load and at its edges, as a real process on 127.0.0.1: a scrape
//! still answers while 500 clients scrape on keep-alive connections and 200 slowloris
//! clients hold half-sent requests; SIGTERM ends it gracefully; a non-loopback --listen
//! needs --allow-remote; --token-file makes it ask for a bearer token, which --remote
//! sends. Latency is reported, not judged here: the bound asserted is generous (timing
//! targets belong to benchmarks; see examples/serve_load.rs for the figure).

#[path = "support/serve_support.rs"]
mod support;

#[path = "../examples/common/keep_alive.rs"]
mod keep_alive;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use support::{get, start_serve, wait_for, ChildGuard};

const BUSY_CLIENTS: usize = 500;
const SLOW_CLIENTS: usize = 200;

#[test]
fn a_scrape_answers_while_500_clients_and_200_slowloris_hold_connections() {
    let (_serve, addr) = start_serve(&["--device", "sim", "--interval", "0.2"]);
    wait_for(Duration::from_secs(10), || {
        (get(&addr, "/metrics").0 == 200).then_some(())
    })
    .expect("/metrics answers within 10 s");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let mut busy = Vec::new();
        for _ in 0..BUSY_CLIENTS {
            let (addr, stop) = (addr.clone(), Arc::clone(&stop));
            let (answered, failed) = (Arc::clone(&answered), Arc::clone(&failed));
            busy.push(tokio::spawn(async move {
                let Ok(stream) = TcpStream::connect(&addr).await else {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let mut conn = BufReader::new(stream);
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(200) = keep_alive::get(&mut conn, "/metrics").await {
                        answered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        // Every busy client is connected and has been answered once.
        let deadline = Instant::now() + Duration::from_secs(60);
        while answered.load(Ordering::Relaxed) < BUSY_CLIENTS && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            answered.load(Ordering::Relaxed) >= BUSY_CLIENTS,
            "only {} of {BUSY_CLIENTS} busy clients answered in 60 s ({} failed)",
            answered.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed)
        );

        // Slowloris: a request line and one header, then nothing more.
        let mut slow = Vec::new();
        for _ in 0..SLOW_CLIENTS {
            let mut stream = TcpStream::connect(&addr)
                .await
                .expect("slow client connects");
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Slow: 1\r\n")
                .await
                .expect("slow client sends half a request");
            slow.push(stream);
        }

        let started = Instant::now();
        let scrape_addr = addr.clone();
        let (status, body) = tokio::task::spawn_blocking(move || get(&scrape_addr, "/metrics"))
            .await
            .expect("the scrape thread");
        let took = started.elapsed();
        eprintln!(
            "scrape with {BUSY_CLIENTS} busy and {SLOW_CLIENTS} slow connections: {:.1} ms",
            took.as_secs_f64() * 1e3
        );
        assert_eq!(status, 200);
        assert!(body.contains("vramtop_memory_used_bytes{"), "{body}");
        assert!(took < Duration::from_secs(2), "the scrape took {took:?}");

        // The slow clients were held open all along, not dropped to make room.
        let mut buf = [0u8; 64];
        let still_open = slow
            .iter()
            .filter(|s| {
                matches!(s.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count();
        assert_eq!(still_open, SLOW_CLIENTS, "slow connections closed early");

        stop.store(true, Ordering::Relaxed);
        for task in busy {
            let _ = task.await;
        }
        assert_eq!(failed.load(Ordering::Relaxed), 0, "busy clients saw errors");
    });
}

#[test]
fn sigterm_closes_connections_and_exits_zero() {
    let (mut serve, addr) = start_serve(&["--device", "sim"]);
    wait_for(Duration::from_secs(10), || {
        (get(&addr, "/metrics").0 == 200).then_some(())
    })
    .expect("/metrics answers within 10 s");
    // An idle keep-alive connection and a client stuck halfway through its request.
    let mut idle = std::net::TcpStream::connect(&addr).expect("connect");
    use std::io::Write;
    write!(idle, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
    idle.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).expect("an answer");
    assert_eq!(&first, b"HTTP/1.1 200");
    let mut stuck = std::net::TcpStream::connect(&addr).expect("connect");
    write!(stuck, "GET /metrics HTTP/1.1\r\nHost: x\r\n").expect("send half");

    let pid = serve.child.id() as libc::pid_t;
    let sent_at = Instant::now();
    // SAFETY: kill only sends a signal to the child we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_for(Duration::from_secs(15), || {
        serve.child.try_wait().ok().flatten()
    })
    .expect("serve exits within 15 s of SIGTERM");
    let took = sent_at.elapsed();
    assert_eq!(status.code(), Some(0), "{status:?}");
    // The grace for answers in flight is 5 s; the stuck client must not hold it longer.
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
    // The idle connection was closed, not left hanging.
    let mut rest = Vec::new();
    let _ = idle.read_to_end(&mut rest);
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "still listening"
    );
}

fn serve_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vramtop"));
    cmd.arg("serve")
        .args(["--device", "sim"])
        .args(args)
        .env_remove("VRAMTOP_CONFIG")
        .stdin(Stdio::null());
    cmd
}

#[test]
fn a_remote_listen_address_needs_allow_remote() {
    let out = serve_command(&["--listen", "0.0.0.0:0"])
        .output()
        .expect("vramtop serve runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--allow-remote"), "{err}");

    let child = serve_command(&["--listen", "0.0.0.0:0", "--allow-remote"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vramtop serve starts");
    let mut guard = ChildGuard {
        child,
        name: "vramtop serve",
    };
    let stderr = guard.child.stderr.take().expect("stderr");
    let said = std::io::BufRead::lines(std::io::BufReader::new(stderr))
        .map_while(Result::ok)
        .find(|l| l.contains("listening on"))
        .unwrap_or_default();
    assert!(said.contains("listening on http://0.0.0.0:"), "{said}");
    guard.kill();
}

fn status_of(response: &str) -> &str {
    response.split_whitespace().nth(1).unwrap_or("")
}

/// A token file in a scratch place, removed on drop.
struct TokenFile(std::path::PathBuf);

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_token_file_guards_every_route_and_remote_sends_it() {
    let path = std::env::temp_dir().join(format!("vramtop-token-{}", std::process::id()));
    std::fs::write(&path, "0123456789abcdef\n").expect("write the token");
    let token = TokenFile(path);
    let file = token.0.to_str().expect("utf-8 path");
    let (_serve, addr) = start_serve(&["--device", "sim", "--token-file", file]);
    let with = |auth: Option<&str>| {
        let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let header = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
        use std::io::Write;
        write!(stream, "GET /metrics HTTP/1.0\r\n{header}\r\n").expect("send");
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    };
    let answered = wait_for(Duration::from_secs(10), || {
        let text = with(Some("Bearer 0123456789abcdef"));
        (status_of(&text) == "200").then_some(text)
    });
    assert!(answered.is_some(), "the right token is let in");
    for auth in [None, Some("Bearer 0123456789abcdeX"), Some("Basic 0123")] {
        let text = with(auth);
        assert_eq!(status_of(&text), "401", "{auth:?}: {text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
            "{auth:?}: {text}"
        );
    }
    assert!(
        get(&addr, "/nope").0 == 401,
        "unknown paths are not revealed either"
    );

    let remote = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
            .args(["--once", "--json", "--remote", &addr])
            .args(args)
            .env_remove("VRAMTOP_CONFIG")
            .output()
            .expect("vramtop --remote runs");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()
    };
    let v = remote(&["--token-file", file]);
    assert_eq!(v["devices"][0]["health"]["state"], "ok", "{v}");
    let v = remote(&[]);
    assert_eq!(v["devices"][0]["health"]["state"], "lost", "{v}");
    assert!(v.to_string().contains("HTTP 401"), "{v}");
}

#[test]
fn a_bad_token_file_is_one_line() {
    let missing = serve_command(&["--token-file", "/nonexistent/vramtop-token"])
        .output()
        .expect("vramtop serve runs");
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("--token-file /nonexistent/vramtop-token"),
        "{err}"
    );
}
