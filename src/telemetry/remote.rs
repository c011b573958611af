//! `vramtop --remote host:port,...`: the devices and processes of hosts running
//! `vramtop serve`, merged into one snapshot. Each host is fetched on its own thread with
//! a timeout and exponential backoff, so `poll` only reads the latest result per host and
//! never waits on the network. A host that is down shows as one device marked Lost.
//! Must not depend on ratatui or on the app.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use color_eyre::eyre::{Result, WrapErr};

use super::open::Opened;
use super::{now_ms, DeviceHealth, DeviceSnapshot, SystemSnapshot, TelemetrySource};

/// How long one fetch may take before the host is marked down.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Retries after a failure wait 1 s, 2 s, 4 s… up to this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A snapshot larger than this is not a vramtop snapshot.
const MAX_BODY_BYTES: u64 = 16 << 20;

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
    /// Dropping the sender wakes the fetch thread and ends it.
    _stop: mpsc::Sender<()>,
}

/// Several `vramtop serve` hosts as one telemetry source.
pub struct RemoteSource {
    hosts: Vec<Host>,
}

fn lock(state: &Mutex<HostState>) -> MutexGuard<'_, HostState> {
    // A fetch thread cannot panic while holding the lock (it only assigns), but a
    // poisoned lock still holds a usable state.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl RemoteSource {
    /// Start fetching every host in `addrs` ("host:port") each `interval`.
    pub fn new(addrs: &[String], interval: Duration, timeout: Duration) -> Result<Self> {
        let mut hosts = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let state = Arc::new(Mutex::new(HostState::Connecting));
            let (stop_tx, stop_rx) = mpsc::channel();
            let fetcher = Fetcher {
                url: format!("http://{addr}/api/snapshot"),
                state: Arc::clone(&state),
                interval,
                timeout,
            };
            thread::Builder::new()
                .name(format!("vramtop-remote-{addr}"))
                .spawn(move || fetcher.run(stop_rx))
                .wrap_err_with(|| format!("could not start the fetch thread for {addr}"))?;
            hosts.push(Host {
                addr: addr.clone(),
                state,
                _stop: stop_tx,
            });
        }
        Ok(RemoteSource { hosts })
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
            thread::sleep(Duration::from_millis(10));
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

/// The loop of one host's thread: fetch, publish, wait (interval, or backoff after a
/// failure), until the source is dropped.
struct Fetcher {
    url: String,
    state: Arc<Mutex<HostState>>,
    interval: Duration,
    timeout: Duration,
}

impl Fetcher {
    fn run(self, stop: mpsc::Receiver<()>) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(self.timeout))
            .user_agent(concat!("vramtop/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let mut failures = 0u32;
        loop {
            let wait = match fetch(&agent, &self.url, self.timeout) {
                Ok(snapshot) => {
                    failures = 0;
                    *lock(&self.state) = HostState::Up(snapshot);
                    self.interval
                }
                Err(why) => {
                    failures = failures.saturating_add(1);
                    let wait = backoff(failures);
                    *lock(&self.state) = HostState::Down {
                        why,
                        next_try: Instant::now() + wait,
                    };
                    wait
                }
            };
            // The stop channel doubles as an interruptible sleep.
            match stop.recv_timeout(wait) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
        }
    }
}

/// One GET of `/api/snapshot`, with every failure said in a few words.
fn fetch(agent: &ureq::Agent, url: &str, timeout: Duration) -> Result<SystemSnapshot, String> {
    let mut response = agent.get(url).call().map_err(|e| match e {
        ureq::Error::Timeout(_) => format!("no answer within {} s", timeout.as_secs_f64()),
        ureq::Error::StatusCode(code) => format!("HTTP {code}"),
        ureq::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    })?;
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_BODY_BYTES)
        .read_to_string()
        .map_err(|e| match e {
            ureq::Error::Timeout(_) => format!("no answer within {} s", timeout.as_secs_f64()),
            other => format!("reading the answer: {other}"),
        })?;
    // The allocator stats beside the snapshot are not shown remotely: serde skips them.
    serde_json::from_str(&body).map_err(|e| format!("not a vramtop snapshot ({e})"))
}

/// The source for `--remote`; with `once`, wait for every host's first answer (or
/// failure) so a one-shot print shows real figures.
pub fn open(addrs: &[String], interval: Duration, once: bool) -> Result<Opened> {
    let source = RemoteSource::new(addrs, interval, DEFAULT_TIMEOUT)?;
    if once {
        source.wait_settled(DEFAULT_TIMEOUT + Duration::from_secs(1));
    }
    Ok(Opened {
        source: Box::new(source),
        notice: None,
        simulated: false,
    })
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
