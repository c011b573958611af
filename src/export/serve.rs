//! `vramtop serve`: a read-only HTTP endpoint over the same telemetry and probes as the
//! live view, and over hooked PyTorch jobs. `GET /metrics` is the Prometheus text format,
//! `GET /api/snapshot` the JSON that `vramtop --remote` reads; anything else is 404, any
//! other method 405.
//! The routes over what the telemetry poller and the probe publish; the command that
//! starts it all is `modes::serve`. Must not depend on ratatui or the app's state.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use color_eyre::eyre::Result;
use hyper::Method;
use serde::Serialize;
use tokio::sync::watch;

use super::http::Reply;
use super::metrics;
use crate::probe::live::ProbeView;
use vramtop_alloc::Stats;
use vramtop_attach::AttachedJobs;
use vramtop_telemetry::{now_ms, DeviceHealth, SystemSnapshot};

/// Where the server reads its figures: the latest telemetry poll, the latest probe view
/// and the hooked jobs the attacher last published.
#[derive(Clone)]
pub struct Feeds {
    pub snapshots: watch::Receiver<Option<SystemSnapshot>>,
    pub probe: Option<watch::Receiver<Arc<ProbeView>>>,
    /// None when the attacher could not start: telemetry is still worth serving.
    pub torch: Option<watch::Receiver<Arc<AttachedJobs>>>,
    /// The poll interval: a snapshot older than three of them (and 2 s) is marked stale.
    pub interval: Duration,
    /// Also write dcgm-exporter's DCGM_FI_DEV_* series.
    pub dcgm_names: bool,
}

/// The body of `/api/snapshot`: the `SystemSnapshot` JSON (as `--once --json` prints it)
/// with the allocator stats of each running probe policy added under `allocator`.
#[derive(Serialize)]
pub struct ApiSnapshot<'a> {
    /// `vramtop_telemetry::SNAPSHOT_SCHEMA`: the system part is `--once --json`'s.
    pub schema: u32,
    #[serde(flatten)]
    pub system: &'a SystemSnapshot,
    pub allocator: &'a [Stats],
}

impl Feeds {
    /// The latest snapshot, with devices marked stale when the poller has fallen behind
    /// (a hung driver call), and the probes' stats. None before the first poll.
    fn current(&self) -> Option<(SystemSnapshot, Vec<Stats>)> {
        let mut snapshot = self.snapshots.borrow().clone()?;
        let stale_after_ms = (self.interval * 3).max(Duration::from_secs(2)).as_millis() as u64;
        if now_ms().saturating_sub(snapshot.taken_at_ms) > stale_after_ms {
            for d in &mut snapshot.devices {
                if d.health == DeviceHealth::Ok {
                    d.health = DeviceHealth::Stale;
                }
            }
        }
        // Borrow the view rather than clone it: its block layout can be large.
        let stats = self.probe.as_ref().map_or_else(Vec::new, |views| {
            views
                .borrow()
                .policies
                .iter()
                .map(|p| p.stats.clone())
                .collect()
        });
        Some((snapshot, stats))
    }
}

/// What to answer to `method` and `url`: pure, so the routing is testable without sockets.
pub fn route(method: &Method, url: &str, feeds: &Feeds) -> Reply {
    let path = url.split(['?', '#']).next().unwrap_or("");
    let known = matches!(path, "/metrics" | "/api/snapshot");
    if !known {
        return Reply::text(404, "not found: try /metrics or /api/snapshot\n");
    }
    if !matches!(*method, Method::GET | Method::HEAD) {
        return Reply {
            allow: true,
            ..Reply::text(405, "method not allowed: this endpoint serves reads only\n")
        };
    }
    let Some((snapshot, stats)) = feeds.current() else {
        return Reply::text(
            503,
            "no telemetry poll has finished yet; retry in a second\n",
        );
    };
    if path == "/metrics" {
        // An Arc of the attacher's snapshot, not the jobs: their block maps can be large.
        let torch = feeds
            .torch
            .as_ref()
            .map_or_else(Default::default, |jobs| Arc::clone(&jobs.borrow()));
        match metrics::encode(&snapshot, &stats, &torch, feeds.dcgm_names) {
            Ok(body) => Reply {
                status: 200,
                content_type: metrics::CONTENT_TYPE,
                body,
                allow: false,
            },
            Err(e) => Reply::text(500, format!("could not encode metrics: {e}\n")),
        }
    } else {
        let api = ApiSnapshot {
            schema: vramtop_telemetry::SNAPSHOT_SCHEMA,
            system: &snapshot,
            allocator: &stats,
        };
        match serde_json::to_string(&api) {
            Ok(body) => Reply {
                status: 200,
                content_type: "application/json",
                body,
                allow: false,
            },
            Err(e) => Reply::text(500, format!("could not serialise the snapshot: {e}\n")),
        }
    }
}

/// Why `listen` may not be used as asked: a non-loopback address needs `--allow-remote`.
pub fn check_listen(listen: SocketAddr, allow_remote: bool) -> Result<(), String> {
    if listen.ip().is_loopback() || allow_remote {
        return Ok(());
    }
    Err(format!(
        "--listen {listen} is reachable from other hosts: add --allow-remote to mean it \
         (and --token-file FILE to require a token), or listen on 127.0.0.1"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_telemetry::sim::{SimSource, WorkloadGauge};
    use vramtop_telemetry::TelemetrySource;

    fn feeds_with(
        snapshot: Option<SystemSnapshot>,
    ) -> (watch::Sender<Option<SystemSnapshot>>, Feeds) {
        let (tx, rx) = watch::channel(snapshot);
        let feeds = Feeds {
            snapshots: rx,
            probe: None,
            torch: None,
            interval: Duration::from_secs(1),
            dcgm_names: false,
        };
        (tx, feeds)
    }

    fn sim_snapshot() -> SystemSnapshot {
        SimSource::new(1, WorkloadGauge::default()).poll()
    }

    #[test]
    fn routes_reads_and_refuses_the_rest() {
        let (_tx, feeds) = feeds_with(Some(sim_snapshot()));
        let metrics = route(&Method::GET, "/metrics?x=1", &feeds);
        assert_eq!(metrics.status, 200);
        assert_eq!(metrics.content_type, metrics::CONTENT_TYPE);
        assert!(metrics.body.contains("vramtop_memory_total_bytes{"));
        let api = route(&Method::GET, "/api/snapshot", &feeds);
        assert_eq!(api.status, 200);
        let v: serde_json::Value = serde_json::from_str(&api.body).unwrap();
        assert_eq!(v["devices"][0]["simulated"], true);
        assert!(v["allocator"].as_array().is_some_and(|a| a.is_empty()));
        assert_eq!(route(&Method::GET, "/", &feeds).status, 404);
        assert_eq!(route(&Method::GET, "/metricsx", &feeds).status, 404);
        let post = route(&Method::POST, "/metrics", &feeds);
        assert_eq!(post.status, 405);
        assert!(post.allow);
        assert_eq!(route(&Method::DELETE, "/api/snapshot", &feeds).status, 405);
    }

    #[test]
    fn nothing_to_serve_before_the_first_poll() {
        let (_tx, feeds) = feeds_with(None);
        assert_eq!(route(&Method::GET, "/metrics", &feeds).status, 503);
    }

    #[test]
    fn an_old_snapshot_is_served_as_stale() {
        let mut old = sim_snapshot();
        old.taken_at_ms = now_ms() - 60_000;
        let (_tx, feeds) = feeds_with(Some(old));
        let (snapshot, _) = feeds.current().unwrap();
        assert_eq!(snapshot.devices[0].health, DeviceHealth::Stale);
        let text = route(&Method::GET, "/metrics", &feeds).body;
        assert!(text.contains("vramtop_device_up{gpu=\"0\""));
        assert!(text
            .lines()
            .any(|l| l.starts_with("vramtop_device_up{") && l.ends_with(" 0")));
    }
}
