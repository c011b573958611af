//! One GET on a keep-alive HTTP/1.1 connection, shared by examples/serve_load.rs and
//! tests/serve_load.rs (included by `#[path]`: not an example of its own).

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// One GET on a keep-alive connection: the status, after reading the whole body.
pub async fn get(conn: &mut BufReader<TcpStream>, path: &str) -> std::io::Result<u16> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: vramtop\r\n\r\n");
    conn.get_mut().write_all(request.as_bytes()).await?;
    let mut line = String::new();
    conn.read_line(&mut line).await?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = 0usize;
    loop {
        line.clear();
        if conn.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).await?;
    Ok(status)
}
