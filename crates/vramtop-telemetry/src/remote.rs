//! `vramtop --remote host:port,...`: the devices and processes of hosts running
//! `vramtop serve`, merged into one snapshot. Each host is fetched by its own task on the
//! app's tokio runtime (hyper's HTTP/1.1 client) with a timeout and exponential backoff,
//! so `poll` only reads the latest result per host and never waits on the network. A host
//! that is down shows as one device marked Lost.
//! Must not depend on ratatui or on the app.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, HOST, USER_AGENT};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::open::Opened;
use super::{now_ms, DeviceHealth, DeviceSnapshot, SystemSnapshot, TelemetrySource};
use crate::auth::BearerToken;
use crate::error::FetchError;

/// How long one fetch may take before the host is marked down.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Retries after a failure wait 1 s, 2 s, 4 s… up to this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A snapshot larger than this is not a vramtop snapshot.
const MAX_BODY_BYTES: usize = 16 << 20;

/// The wait before the next try after `failures` failures in a row (at least 1).
pub fn backoff(failures: u32) -> Duration {
    let secs = 1u64 << failures.saturating_sub(1).min(5);
    Duration::from_secs(secs).min(MAX_BACKOFF)
}

/// What we know of one host.
#[derive(Clone, Debug)]
enum HostState {
    /// No fetch has finished yet.
    Connecting,
    Up(SystemSnapshot),
    Down {
        why: String,
        next_try: Instant,
    },
}

struct Host {
    /// "host:port", as given on the command line.
    addr: String,
    state: Arc<Mutex<HostState>>,
}

/// How hosts are fetched.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Between two fetches of a host that answered.
    pub interval: Duration,
    /// How long one fetch may take before the host is marked down.
    pub timeout: Duration,
    /// Sent as `Authorization: Bearer TOKEN` when the hosts require one.
    pub token: Option<BearerToken>,
}

/// Several `vramtop serve` hosts as one telemetry source. Dropping it stops the fetches.
pub struct RemoteSource {
    hosts: Vec<Host>,
    stop: CancellationToken,
}

impl Drop for RemoteSource {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn lock(state: &Mutex<HostState>) -> MutexGuard<'_, HostState> {
    // A fetch thread cannot panic while holding the lock (it only assigns), but a
    // poisoned lock still holds a usable state.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl RemoteSource {
    /// Start fetching every host in `addrs` ("host:port"), one task each on `runtime`.
    pub fn new(runtime: &Handle, addrs: &[String], options: FetchOptions) -> RemoteSource {
        let stop = CancellationToken::new();
        let mut hosts = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let state = Arc::new(Mutex::new(HostState::Connecting));
            let fetcher = Fetcher {
                addr: addr.clone(),
                state: Arc::clone(&state),
                options: options.clone(),
            };
            runtime.spawn(fetcher.run(stop.child_token()));
            hosts.push(Host {
                addr: addr.clone(),
                state,
            });
        }
        RemoteSource { hosts, stop }
    }

    /// Whether every host has answered or failed at least once.
    pub fn settled(&self) -> bool {
        self.hosts
            .iter()
            .all(|h| !matches!(*lock(&h.state), HostState::Connecting))
    }

    /// When each host's latest snapshot was taken (by its clock), None while not up.
    pub fn answered_at_ms(&self) -> Vec<Option<u64>> {
        self.hosts
            .iter()
            .map(|h| match &*lock(&h.state) {
                HostState::Up(s) => Some(s.taken_at_ms),
                _ => None,
            })
            .collect()
    }

    /// Wait, at most `limit`, until every host has answered or failed once.
    pub fn wait_settled(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while !self.settled() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

impl TelemetrySource for RemoteSource {
    fn poll(&mut self) -> SystemSnapshot {
        let states: Vec<(&str, HostState)> = self
            .hosts
            .iter()
            .map(|h| (h.addr.as_str(), lock(&h.state).clone()))
            .collect();
        merge(&states, Instant::now())
    }
}

/// One snapshot from the latest state of each host, devices numbered in host order.
fn merge(states: &[(&str, HostState)], now: Instant) -> SystemSnapshot {
    let mut devices = Vec::new();
    let mut warnings = Vec::new();
    let mut up_hosts = Vec::new();
    for (addr, state) in states {
        let index = devices.len() as u32;
        match state {
            HostState::Connecting => {
                let mut d = DeviceSnapshot::unknown(index, format!("{addr} (connecting…)"), false);
                d.health = DeviceHealth::Stale;
                devices.push(d);
            }
            HostState::Down { why, next_try } => {
                let retry = next_try.saturating_duration_since(now).as_secs_f64().ceil();
                let reason = format!("{addr} down: {why}; retry in {retry} s");
                let mut d = DeviceSnapshot::unknown(index, *addr, false);
                d.health = DeviceHealth::Lost(reason.clone());
                devices.push(d);
                warnings.push(reason);
            }
            HostState::Up(snapshot) => {
                up_hosts.push(snapshot);
                for device in &snapshot.devices {
                    let mut d = device.clone();
                    d.index = devices.len() as u32;
                    d.name = format!("{addr} {}", device.name);
                    devices.push(d);
                }
                warnings.extend(snapshot.warnings.iter().map(|w| format!("{addr}: {w}")));
            }
        }
    }
    // A version is shown only when every host that answered agrees on it.
    let common = |field: fn(&SystemSnapshot) -> &Option<String>| {
        let first = up_hosts.first().and_then(|s| field(s).clone())?;
        up_hosts
            .iter()
            .all(|s| field(s).as_deref() == Some(first.as_str()))
            .then_some(first)
    };
    let hostnames: Vec<&str> = up_hosts.iter().map(|s| s.hostname.as_str()).collect();
    SystemSnapshot {
        hostname: if hostnames.is_empty() {
            "none up".to_string()
        } else {
            hostnames.join(",")
        },
        source: format!("remote: {} of {} hosts up", up_hosts.len(), states.len()),
        driver_version: common(|s| &s.driver_version),
        cuda_version: common(|s| &s.cuda_version),
        devices,
        taken_at_ms: now_ms(),
        warnings,
    }
}

/// The loop of one host's task: fetch, publish, wait (interval, or backoff after a
/// failure), until the source is dropped.
struct Fetcher {
    addr: String,
    state: Arc<Mutex<HostState>>,
    options: FetchOptions,
}

impl Fetcher {
    async fn run(self, stop: CancellationToken) {
        let timeout = self.options.timeout;
        let mut failures = 0u32;
        loop {
            let fetched = tokio::select! {
                _ = stop.cancelled() => return,
                fetched = tokio::time::timeout(timeout, self.fetch()) => fetched,
            };
            let result = fetched.unwrap_or(Err(FetchError::Timeout(timeout)));
            let wait = match result {
                Ok(snapshot) => {
                    failures = 0;
                    *lock(&self.state) = HostState::Up(snapshot);
                    self.options.interval
                }
                Err(why) => {
                    failures = failures.saturating_add(1);
                    let wait = backoff(failures);
                    *lock(&self.state) = HostState::Down {
                        why: why.to_string(),
                        next_try: Instant::now() + wait,
                    };
                    wait
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One GET of `/api/snapshot` on a fresh connection, with every failure said in a
    /// few words.
    async fn fetch(&self) -> Result<SystemSnapshot, FetchError> {
        let stream = TcpStream::connect(&self.addr)
            .await
            .map_err(FetchError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(FetchError::Http)?;
        // The connection is driven beside the request and ends when `sender` is dropped.
        let driver = tokio::spawn(connection);
        let mut request = Request::get("/api/snapshot")
            .header(HOST, &self.addr)
            .header(USER_AGENT, concat!("vramtop/", env!("CARGO_PKG_VERSION")));
        if let Some(token) = &self.options.token {
            request = request.header(AUTHORIZATION, token.header_value());
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(FetchError::Request)?;
        let answer = async {
            let response = sender
                .send_request(request)
                .await
                .map_err(FetchError::Http)?;
            let status = response.status();
            if !status.is_success() {
                return Err(FetchError::Status(status.as_u16()));
            }
            let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(FetchError::Body)?
                .to_bytes();
            decode(&body)
        }
        .await;
        drop(sender);
        driver.abort();
        answer
    }
}

/// `/api/snapshot` as served: its shape's version (absent before vramtop had one) and the
/// snapshot. The allocator stats beside it are not shown remotely: serde skips them.
#[derive(serde::Deserialize)]
struct Served {
    schema: Option<u32>,
    #[serde(flatten)]
    snapshot: SystemSnapshot,
}

/// The snapshot in a body of `/api/snapshot`; a newer shape than this vramtop reads is
/// refused whole rather than misread. (Public for the fuzz target `remote`.)
pub fn decode(body: &[u8]) -> Result<SystemSnapshot, FetchError> {
    let served: Served = serde_json::from_slice(body).map_err(FetchError::NotASnapshot)?;
    match served.schema {
        Some(served) if served > crate::SNAPSHOT_SCHEMA => Err(FetchError::NewerSchema {
            served,
            read: crate::SNAPSHOT_SCHEMA,
        }),
        _ => Ok(served.snapshot),
    }
}

/// The source for `--remote`, fetching on `runtime`; with `once`, wait for every host's
/// first answer (or failure) so a one-shot print shows real figures.
pub fn open(
    runtime: &Handle,
    addrs: &[String],
    interval: Duration,
    token: Option<BearerToken>,
    once: bool,
) -> Opened {
    let options = FetchOptions {
        interval,
        timeout: DEFAULT_TIMEOUT,
        token,
    };
    let source = RemoteSource::new(runtime, addrs, options);
    if once {
        source.wait_settled(DEFAULT_TIMEOUT + Duration::from_secs(1));
    }
    Opened {
        source: Box::new(source),
        notice: None,
        simulated: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_thirty_seconds() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    fn host_snapshot(host: &str, devices: usize) -> SystemSnapshot {
        SystemSnapshot {
            hostname: host.into(),
            source: "NVML".into(),
            driver_version: Some("580.1".into()),
            cuda_version: Some("13.0".into()),
            devices: (0..devices)
                .map(|i| DeviceSnapshot::unknown(i as u32, "H100", false))
                .collect(),
            taken_at_ms: 0,
            warnings: vec!["no permission".into()],
        }
    }

    #[test]
    fn merge_renumbers_devices_and_marks_down_hosts_lost() {
        let now = Instant::now();
        let states = [
            ("a:1", HostState::Up(host_snapshot("box-a", 2))),
            (
                "b:2",
                HostState::Down {
                    why: "connection refused".into(),
                    next_try: now + Duration::from_secs(4),
                },
            ),
            ("c:3", HostState::Connecting),
            ("d:4", HostState::Up(host_snapshot("box-d", 1))),
        ];
        let s = merge(&states, now);
        let names: Vec<&str> = s.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "a:1 H100",
                "a:1 H100",
                "b:2",
                "c:3 (connecting…)",
                "d:4 H100"
            ]
        );
        let indexes: Vec<u32> = s.devices.iter().map(|d| d.index).collect();
        assert_eq!(indexes, [0, 1, 2, 3, 4]);
        assert_eq!(
            s.devices[2].health,
            DeviceHealth::Lost("b:2 down: connection refused; retry in 4 s".into())
        );
        assert_eq!(s.devices[3].health, DeviceHealth::Stale);
        assert_eq!(s.source, "remote: 2 of 4 hosts up");
        assert_eq!(s.hostname, "box-a,box-d");
        assert_eq!(s.driver_version.as_deref(), Some("580.1"));
        assert_eq!(
            s.warnings,
            [
                "a:1: no permission",
                "b:2 down: connection refused; retry in 4 s",
                "d:4: no permission"
            ]
        );
    }
}

#[cfg(test)]
mod schema_tests {
    use super::*;

    #[test]
    fn a_newer_snapshot_schema_is_refused_in_one_line() {
        let snapshot = SystemSnapshot {
            hostname: "gpu1".into(),
            source: "NVML".into(),
            driver_version: None,
            cuda_version: None,
            devices: Vec::new(),
            taken_at_ms: 7,
            warnings: Vec::new(),
        };
        let mut served = serde_json::to_value(&snapshot).unwrap_or_default();
        // A host from before `schema`, and one of this version with its probes' stats.
        assert_eq!(
            decode(served.to_string().as_bytes()).ok(),
            Some(snapshot.clone())
        );
        served["schema"] = crate::SNAPSHOT_SCHEMA.into();
        served["allocator"] = serde_json::json!([]);
        assert_eq!(decode(served.to_string().as_bytes()).ok(), Some(snapshot));
        served["schema"] = (crate::SNAPSHOT_SCHEMA + 1).into();
        let refused = decode(served.to_string().as_bytes());
        let line = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            line.starts_with("serves snapshot schema 2, newer than"),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }
}
