//! The HTTP/1.1 listener under `vramtop serve`: hyper on the tokio runtime, one task per
//! connection, with limits that keep a slow or greedy client from starving the others
//! (see `Limits`), an optional bearer token, and a graceful shutdown.
//! Knows nothing of metrics: what to answer comes from a `Router`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use color_eyre::eyre::{eyre, Result};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ALLOW, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use vramtop_telemetry::auth::BearerToken;

/// What one connection may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once; past it a connection gets a 503 and is closed.
    pub max_connections: usize,
    /// A client must send a request's whole header in this time (slowloris guard).
    pub header_timeout: Duration,
    /// Largest request header hyper buffers (hyper's floor is 8 KiB); bodies are never
    /// read, since every route is a read.
    pub max_header_bytes: usize,
    /// A keep-alive connection is closed (after its current answer) when this old, so
    /// idle connections cannot pile up.
    pub connection_lifetime: Duration,
    /// On shutdown, how long answers in flight may take before connections are dropped.
    pub shutdown_grace: Duration,
}

pub const LIMITS: Limits = Limits {
    max_connections: 1024,
    header_timeout: Duration::from_secs(10),
    max_header_bytes: 16 * 1024,
    connection_lifetime: Duration::from_secs(120),
    shutdown_grace: Duration::from_secs(5),
};

/// An answer: status, content type and body, plus `Allow` for a 405.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    pub allow: bool,
}

impl Reply {
    pub fn text(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            allow: false,
        }
    }
}

/// What to answer to a method and a path (with its query).
pub type Router = Arc<dyn Fn(&Method, &str) -> Reply + Send + Sync>;

struct Shared {
    route: Router,
    token: Option<BearerToken>,
    limits: Limits,
}

impl Shared {
    fn answer(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        let header = request.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
        let reply = match &self.token {
            Some(token) if !token.accepts(header) => Reply::text(
                401,
                "unauthorized: send the token as `Authorization: Bearer TOKEN`\n",
            ),
            _ => {
                let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
                (self.route)(request.method(), target)
            }
        };
        let mut response = Response::new(Full::new(Bytes::from(reply.body)));
        *response.status_mut() =
            StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
        if reply.allow {
            headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        }
        if reply.status == 401 {
            headers.insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"vramtop\""),
            );
        }
        response
    }
}

/// A listening server. `shutdown` stops it gracefully; dropping it stops accepting and
/// lets the runtime drop the connections.
pub struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    tracker: TaskTracker,
    accept: JoinHandle<()>,
    grace: Duration,
}

impl Server {
    /// Bind `listen` (port 0 picks a free port) and serve from the current runtime.
    pub async fn bind(
        listen: SocketAddr,
        route: Router,
        token: Option<BearerToken>,
        limits: Limits,
    ) -> Result<Server> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| eyre!("could not listen on {listen}: {e}; pick another --listen"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| eyre!("listening on {listen} gave no address: {e}"))?;
        let shared = Arc::new(Shared {
            route,
            token,
            limits,
        });
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let accept = tokio::spawn(accept_loop(listener, shared, stop.clone(), tracker.clone()));
        Ok(Server {
            addr,
            stop,
            tracker,
            accept,
            grace: limits.shutdown_grace,
        })
    }

    /// The address actually bound (with the port chosen when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting, let answers in flight finish and close idle connections, for at
    /// most the shutdown grace; true when every connection ended in time.
    pub async fn shutdown(mut self) -> bool {
        self.stop.cancel();
        let _ = (&mut self.accept).await;
        self.tracker.close();
        tokio::time::timeout(self.grace, self.tracker.wait())
            .await
            .is_ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(shared.limits.max_connections));
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            // Out of file descriptors or a connection reset before accept: wait a little
            // rather than spin, and keep serving the connections we have.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                tracker.spawn(serve_connection(
                    stream,
                    Arc::clone(&shared),
                    stop.clone(),
                    permit,
                ));
            }
            Err(_) => {
                tracker.spawn(refuse_busy(stream));
            }
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    stop: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let limits = shared.limits;
    let service = service_fn(move |request: Request<Incoming>| {
        let response = shared.answer(&request);
        async move { Ok::<_, Infallible>(response) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        // A client error (bad request, timeout, reset) ends only its own connection.
        _ = conn.as_mut() => return,
        _ = stop.cancelled() => {}
        _ = tokio::time::sleep(limits.connection_lifetime) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.shutdown_grace, conn).await;
}

/// Past the connection limit: a short 503 instead of a connection left in the backlog.
async fn refuse_busy(mut stream: TcpStream) {
    const BODY: &str = "too many connections; retry shortly\n";
    let reply = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Raise the soft limit on open files to the hard limit, so `max_connections` sockets
/// fit where the soft limit is 1024. Returns the limit now in force, if known.
pub fn raise_open_file_limit() -> Option<libc::rlim_t> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads only the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(raised.rlim_cur);
        }
    }
    Some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    //! The limits on real loopback sockets, in-process, with limits small enough to hit.
    use super::*;
    use tokio::io::AsyncReadExt;

    fn ok_router() -> Router {
        Arc::new(|_: &Method, _: &str| Reply::text(200, "ok\n"))
    }

    async fn start(limits: Limits, token: Option<BearerToken>) -> Server {
        let listen: SocketAddr = ([127, 0, 0, 1], 0).into();
        Server::bind(listen, ok_router(), token, limits)
            .await
            .expect("bind loopback")
    }

    /// Send `request` on a fresh connection and read until the server closes it (or 5 s).
    async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request).await.expect("send");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).to_string()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn past_the_connection_limit_a_client_gets_503() {
        runtime().block_on(async {
            let limits = Limits {
                max_connections: 2,
                ..LIMITS
            };
            let server = start(limits, None).await;
            let held_a = TcpStream::connect(server.addr()).await.expect("a");
            let held_b = TcpStream::connect(server.addr()).await.expect("b");
            // Let the accept loop take both before the third arrives.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let third = exchange(server.addr(), b"GET / HTTP/1.0\r\n\r\n").await;
            assert!(third.starts_with("HTTP/1.1 503"), "{third}");
            drop((held_a, held_b));
            tokio::time::sleep(Duration::from_millis(100)).await;
            let after = exchange(server.addr(), b"GET / HTTP/1.0\r\n\r\n").await;
            assert!(after.contains(" 200 "), "{after}");
            assert!(server.shutdown().await);
        });
    }

    #[test]
    fn a_slow_or_oversized_header_ends_only_its_connection() {
        runtime().block_on(async {
            let limits = Limits {
                header_timeout: Duration::from_millis(300),
                ..LIMITS
            };
            let server = start(limits, None).await;
            let started = std::time::Instant::now();
            let slow = exchange(server.addr(), b"GET / HTTP/1.1\r\nHost: x\r\n").await;
            let waited = started.elapsed();
            assert!(
                waited < Duration::from_secs(4),
                "a half-sent header was held {waited:?}: {slow}"
            );
            let mut huge = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
            huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
            huge.extend(b"\r\n\r\n");
            let refused = exchange(server.addr(), &huge).await;
            assert!(!refused.contains(" 200 "), "{refused}");
            let fine = exchange(server.addr(), b"GET / HTTP/1.0\r\n\r\n").await;
            assert!(fine.contains(" 200 "), "{fine}");
            assert!(server.shutdown().await);
        });
    }

    #[test]
    fn the_token_is_asked_for_on_every_path() {
        runtime().block_on(async {
            let token = BearerToken::parse("t0ken").ok();
            let server = start(LIMITS, token).await;
            let without = exchange(server.addr(), b"GET /metrics HTTP/1.0\r\n\r\n").await;
            assert!(without.contains(" 401 "), "{without}");
            assert!(without.contains("www-authenticate: Bearer"), "{without}");
            let with = exchange(
                server.addr(),
                b"GET /anything HTTP/1.0\r\nAuthorization: Bearer t0ken\r\n\r\n",
            )
            .await;
            assert!(with.contains(" 200 "), "{with}");
            assert!(server.shutdown().await);
        });
    }
}
