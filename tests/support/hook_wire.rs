//! Test support for fake hooks, included with `#[path]` beside `temp_dir.rs`: the attach protocol's framing
//! (a 4-byte big-endian length, then JSON) over a Unix socket, a private socket directory,
//! and a sleeping process to name a socket after (the attacher drops sockets of dead pids).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};

use super::temp_dir::TempDir;

/// A fresh private socket directory for one test, named after it and this process, and
/// removed when dropped (the suite including this file includes temp_dir.rs too).
pub fn socket_dir(suite: &str, name: &str) -> TempDir {
    TempDir::new(&format!("{suite}-{name}"))
}

/// A live process to name a socket after.
pub fn sleeper() -> Child {
    Command::new("sleep").arg("60").spawn().expect("sleep")
}

/// One frame; the error when the viewer went away.
pub fn try_send(stream: &mut UnixStream, value: &serde_json::Value) -> std::io::Result<()> {
    let body = value.to_string().into_bytes();
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame)
}

/// One frame; a viewer that went away is what some tests are about, so no error.
pub fn send(stream: &mut UnixStream, value: &serde_json::Value) {
    let _ = try_send(stream, value);
}

/// The next frame, None when the viewer closed or sent garbage.
pub fn read_json(stream: &mut UnixStream) -> Option<serde_json::Value> {
    let mut header = [0u8; 4];
    stream.read_exact(&mut header).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(header) as usize];
    stream.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}
