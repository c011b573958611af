//! Test support for the `serve` and `--remote` tests, included with `#[path]`: child
//! processes that are killed when dropped (even when an assertion fails), `vramtop serve`
//! on a free loopback port, tiny misbehaving HTTP servers, and a bounded GET.
//! Every address is on 127.0.0.1 and every loop has a deadline.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

/// A child process killed and reaped on drop.
pub struct ChildGuard {
    pub child: Child,
    pub name: &'static str,
}

impl ChildGuard {
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `vramtop serve` with `extra` arguments on 127.0.0.1, on a port the kernel picks; the
/// port is read from the line serve prints once it listens.
pub fn start_serve(extra: &[&str]) -> (ChildGuard, String) {
    start_serve_with_env(extra, &[])
}

/// `start_serve` with environment variables set for the child (the socket directory of
/// hooked jobs, `VRAMTOP_SOCKET_DIR`, for one).
pub fn start_serve_with_env(
    extra: &[&str],
    env: &[(&str, &std::path::Path)],
) -> (ChildGuard, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("VRAMTOP_INTERVAL")
        .env_remove("VRAMTOP_DEVICE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vramtop serve starts");
    let mut guard = ChildGuard {
        child,
        name: "vramtop serve",
    };
    let stderr = guard.child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    // Keeps draining stderr so the child never blocks on a full pipe; ends with it.
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr = rest.split('/').next().unwrap_or("").to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("vramtop serve said where it listens within 20 s");
    (guard, addr)
}

/// A port free right now on 127.0.0.1, for programs that cannot be told to pick one.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// A server on 127.0.0.1 that answers every connection with `answer` (or nothing, when
/// None: it reads the request and keeps the connection open, silent). Stops on drop.
pub struct FakeServer {
    pub addr: String,
    stop: Arc<AtomicBool>,
}

impl FakeServer {
    pub fn start(answer: Option<&'static str>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("local address").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        thread::spawn(move || {
            // Bounded in time even if the test forgets to drop it.
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut held = Vec::new();
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
                        let mut buf = [0u8; 4096];
                        let _ = stream.read(&mut buf);
                        match answer {
                            Some(body) => {
                                let _ = write!(
                                    stream,
                                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                    body.len()
                                );
                            }
                            None => held.push(stream),
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        FakeServer { addr, stop }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// GET `http://addr/path` with a 5 s timeout: (status, body).
pub fn get(addr: &str, path: &str) -> (u16, String) {
    request("GET", addr, path)
}

/// A one-shot HTTP/1.0 request, for methods and paths a client library would not send.
pub fn request(method: &str, addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the server");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send request");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Retry `probe` every 100 ms until it gives Some, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(100));
    }
}
