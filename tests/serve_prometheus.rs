//! `vramtop serve` as Prometheus sees it: a real Prometheus scrapes it every second on
//! 127.0.0.1, its query API returns the vramtop series with the simulated device's
//! labels, and `promtool check metrics` accepts the exposition. Also the HTTP surface:
//! reads only, 404 and 405 for the rest.
//!
//! The real-Prometheus test needs Debian's `prometheus` package (prometheus and promtool
//! on PATH); .ci/run installs it and sets CI=true, under which a missing tool is a
//! failure. Elsewhere the test is skipped with one line on stderr saying so.

#[path = "support/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;
#[path = "support/serve_support.rs"]
mod support;

#[path = "support/json_doc.rs"]
mod json_doc;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{free_port, get, request, start_serve, wait_for, ChildGuard};

const SIM_UUID: &str = "SIM-00000000-0000-0000-0000-000000000000";

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// The Prometheus tools, or None when the test is to be skipped: on a machine with only
/// a Rust toolchain `cargo test` passes and says plainly what it skipped. CI (CI=true, as
/// .ci/run sets) installs the tools, so there a missing tool fails the test instead.
fn prometheus_tools() -> Option<(PathBuf, PathBuf)> {
    if let (Some(p), Some(t)) = (on_path("prometheus"), on_path("promtool")) {
        return Some((p, t));
    }
    let why = "prometheus/promtool not on PATH (Debian: apt-get install prometheus; .ci/run does)";
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("CI=true but {why}: CI must run the real-Prometheus test");
    }
    // Written to stderr directly, not with eprintln!: libtest hides a passing test's
    // captured output, and this line must be seen in a plain `cargo test`.
    let _ = writeln!(
        std::io::stderr(),
        "\nSKIPPED tests/serve_prometheus.rs prometheus_scrapes_serve: {why}\n"
    );
    None
}

/// `promtool check metrics` on `text`: (passed, what it said).
fn promtool_check(promtool: &Path, text: &str) -> (bool, String) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool finishes");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

fn query(prom_addr: &str, promql: &str) -> serde_json::Value {
    let encoded: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, body) = get(prom_addr, &format!("/api/v1/query?query={encoded}"));
    assert_eq!(status, 200, "query {promql}: {body}");
    serde_json::from_str(&body).expect("Prometheus answers JSON")
}

fn results(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

#[test]
fn prometheus_scrapes_serve() {
    let Some((prometheus, promtool)) = prometheus_tools() else {
        return;
    };
    let (_serve, serve_addr) = start_serve(&["--device", "sim", "--probe", "steady"]);

    // The probe publishes its first stats within a tick or two, and the simulated device
    // lists our process from the next poll on.
    let metrics = wait_for(Duration::from_secs(15), || {
        let (status, body) = get(&serve_addr, "/metrics");
        let complete = body.contains("vramtop_allocator_reserved_bytes{")
            && body.contains("vramtop_process_memory_used_bytes{");
        (status == 200 && complete).then_some(body)
    })
    .expect("/metrics with allocator and process series within 15 s");
    let (ok, said) = promtool_check(&promtool, &metrics);
    assert!(
        ok,
        "promtool check metrics refused /metrics:\n{said}\n---\n{metrics}"
    );

    let dir = TempDir::new("prometheus");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: vramtop\n    scrape_interval: 1s\n    \
             static_configs:\n      - targets: ['{serve_addr}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
    let child = Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prometheus starts");
    let _prometheus = ChildGuard {
        child,
        name: "prometheus",
    };
    let prom_log =
        || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();

    let series = wait_for(Duration::from_secs(30), || {
        // Prometheus answers 503 until its storage is open: wait for /-/ready first.
        let connectable = std::net::TcpStream::connect(&prom_addr).is_ok();
        if !connectable || get(&prom_addr, "/-/ready").0 != 200 {
            return None;
        }
        let found = results(&query(&prom_addr, "vramtop_memory_used_bytes"));
        (!found.is_empty()).then_some(found)
    })
    .unwrap_or_else(|| {
        panic!(
            "no vramtop series scraped within 30 s; prometheus said:\n{}",
            prom_log()
        )
    });

    let labels = &series[0]["metric"];
    assert_eq!(labels["job"], "vramtop", "{labels}");
    assert_eq!(labels["gpu"], "0", "{labels}");
    assert_eq!(labels["uuid"], SIM_UUID, "{labels}");
    assert!(labels["hostname"].as_str().is_some_and(|h| !h.is_empty()));

    let up = results(&query(&prom_addr, "up{job=\"vramtop\"}"));
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    let info = results(&query(&prom_addr, "vramtop_device_info"));
    assert_eq!(info[0]["metric"]["simulated"], "true", "{info:?}");
    assert!(info[0]["metric"]["name"]
        .as_str()
        .is_some_and(|n| n.contains("simulated")));
    for name in [
        "vramtop_memory_total_bytes",
        "vramtop_temperature_celsius",
        "vramtop_power_watts",
        "vramtop_allocator_reserved_bytes{policy=\"caching\"}",
        "vramtop_allocator_external_fragmentation_ratio",
        "vramtop_allocator_ooms_total",
        "vramtop_allocator_backing_calls_total",
    ] {
        assert!(
            !results(&query(&prom_addr, name)).is_empty(),
            "{name} missing from Prometheus"
        );
    }
    // The simulated H100 has no fan: nothing exported, rather than a 0.
    assert!(!metrics.contains("fan"));

    check_dashboard(&prom_addr, &metrics);
}

/// Every query of the Grafana dashboard parses in Prometheus, and every vramtop series
/// it names is one that /metrics exports (a typo would leave a panel silently empty).
fn check_dashboard(prom_addr: &str, metrics: &str) {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../assets/grafana/vramtop.json"))
            .expect("assets/grafana/vramtop.json is JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    assert!(exprs.len() >= 10, "dashboard queries: {exprs:?}");
    for expr in exprs {
        let promql = expr
            .replace("$hostname", ".*")
            .replace("$gpu", ".*")
            .replace("$__rate_interval", "1m");
        let v = query(prom_addr, &promql);
        assert_eq!(v["status"], "success", "{promql}: {v}");
        for name in expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|t| t.starts_with("vramtop_"))
        {
            assert!(
                metrics.contains(&format!("# TYPE {name} ")),
                "dashboard names {name}, which /metrics does not export"
            );
        }
    }
}

#[test]
fn serve_answers_reads_only() {
    // With a probe, so that `allocator` has its stats to check against docs/json.md.
    let (_serve, addr) = start_serve(&["--device", "sim", "--dcgm-names", "--probe", "steady"]);
    let (status, body) = wait_for(Duration::from_secs(10), || {
        let (status, body) = get(&addr, "/api/snapshot");
        (status == 200 && body.contains("\"allocs\"")).then_some((status, body))
    })
    .expect("/api/snapshot answers within 10 s");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON snapshot");
    assert_eq!(v["devices"][0]["uuid"], SIM_UUID);
    assert!(v["allocator"].as_array().is_some(), "{v}");
    assert_eq!(v["schema"], 1);
    json_doc::assert_documented("/api/snapshot", &v);

    let (status, metrics) = get(&addr, "/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("# TYPE vramtop_memory_used_bytes gauge"));
    // dcgm-exporter's names, in MiB: the simulated H100 has 81559 MiB.
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("DCGM_FI_DEV_FB_TOTAL{") && l.ends_with(" 81559")),
        "{metrics}"
    );

    assert_eq!(get(&addr, "/").0, 404);
    assert_eq!(get(&addr, "/api/other").0, 404);
    assert_eq!(request("POST", &addr, "/metrics").0, 405);
    assert_eq!(request("PUT", &addr, "/api/snapshot").0, 405);
    assert_eq!(request("DELETE", &addr, "/metrics").0, 405);
}

#[test]
fn serve_help_lists_its_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(["serve", "--help"])
        .output()
        .expect("vramtop serve --help runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "127.0.0.1:9464",
        "--device",
        "--probe",
        "--policy",
        "--compare",
        "--interval",
        "--dcgm-names",
    ] {
        assert!(text.contains(flag), "serve --help lacks {flag}:\n{text}");
    }
    for flag in ["--once", "--remote <"] {
        assert!(!text.contains(flag), "serve --help offers {flag}:\n{text}");
    }
}

#[test]
fn serve_refuses_a_busy_port_in_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(["serve", "--device", "sim", "--listen", &addr])
        .output()
        .expect("vramtop serve runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("could not listen on {addr}")),
        "{err}"
    );
}
