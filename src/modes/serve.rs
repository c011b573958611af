//! `vramtop serve`: poll telemetry (and run a probe when asked), attach to hooked PyTorch
//! jobs, answer HTTP until SIGTERM or SIGINT. The routes are `export::serve`'s, the server
//! `export::http`'s.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use color_eyre::eyre::{Result, WrapErr};
use hyper::Method;
use tokio::signal::unix::{signal, SignalKind};

use super::{build_probes, runtime, usage_error, Probes};
use crate::cli::ServeArgs;
use crate::export::http::{self, Server, LIMITS};
use crate::export::serve::{check_listen, route, Feeds};
use crate::probe::live::LiveProbe;
use vramtop_attach::discovery::socket_dir;
use vramtop_attach::Attacher;
use vramtop_telemetry::auth::BearerToken;
use vramtop_telemetry::open::open;
use vramtop_telemetry::poller::Poller;
use vramtop_telemetry::sim::WorkloadGauge;

/// `vramtop serve`: poll telemetry, run the probe if asked, export hooked jobs' allocators,
/// serve until SIGTERM or SIGINT.
pub fn run(args: ServeArgs) -> Result<ExitCode> {
    if let Err(e) = check_listen(args.listen, args.allow_remote) {
        return usage_error(e);
    }
    let token = match args.token_file.as_deref().map(read_token).transpose() {
        Ok(token) => token,
        Err(e) => return usage_error(e),
    };
    let workload = WorkloadGauge::default();
    let opened = open(args.device, args.seed, workload.clone()).wrap_err("--device nvml")?;
    if let Some(notice) = &opened.notice {
        eprintln!("vramtop: {notice}");
    }
    let probe_set = match &args.probe {
        None => None,
        Some(name) => {
            let mut policies = vec![args.probe_opts.policy];
            if !args.compare.is_empty() {
                policies = args.compare.clone();
                policies.dedup();
            }
            match build_probes(name, &policies, &args.probe_opts, args.seed) {
                Ok(Probes::Built(set)) => Some(set),
                // As in the live view: a GPU that cannot run probes still has telemetry
                // worth serving.
                Ok(Probes::Disabled(line)) => {
                    eprintln!("vramtop: {line}; serving telemetry without allocator metrics");
                    None
                }
                Err(line) => return usage_error(line),
            }
        }
    };
    // Room for LIMITS.max_connections sockets where the soft limit is 1024.
    http::raise_open_file_limit();
    let rt = runtime()?;
    let interval = Duration::from_secs_f64(args.interval);
    let poller = Poller::spawn(opened.source, interval)?;
    let probe = {
        let _in_runtime = rt.enter();
        let ops_per_s = args.probe_opts.ops_per_s;
        probe_set.map(|set| LiveProbe::spawn(set.probes, Some(workload), ops_per_s, None))
    };
    // Hooked jobs subscribe at the serve interval: a scrape sees states that fresh.
    let attacher = match Attacher::spawn(socket_dir(), interval) {
        Ok(attacher) => Some(attacher),
        // As with probes: the telemetry is worth serving without the jobs.
        Err(e) => {
            eprintln!("vramtop: {e:#}; serving telemetry without hooked PyTorch jobs");
            None
        }
    };
    let feeds = Feeds {
        snapshots: poller.snapshots.clone(),
        probe: probe.as_ref().map(|p| p.views.clone()),
        torch: attacher.as_ref().map(|a| a.jobs.clone()),
        interval,
        dcgm_names: args.dcgm_names,
    };
    let what = if opened.simulated {
        "the simulated device"
    } else {
        "NVML"
    };
    let router: http::Router =
        Arc::new(move |method: &Method, target: &str| route(method, target, &feeds));
    let code = rt.block_on(serve_until_signal(args.listen, router, token, what))?;
    drop(attacher);
    drop(probe);
    drop(poller);
    Ok(ExitCode::from(code))
}

/// The bearer token in `path`, with a warning when others can read the file.
fn read_token(path: &std::path::Path) -> Result<BearerToken, String> {
    let token = BearerToken::from_file(path).map_err(|e| format!("--token-file {e}"))?;
    if BearerToken::readable_by_others(path) {
        eprintln!(
            "vramtop: warning: {} is readable by other users; chmod 600 it",
            path.display()
        );
    }
    Ok(token)
}

/// Listen, say where, and answer until SIGINT (exit code 130) or SIGTERM (0); then shut
/// down gracefully.
async fn serve_until_signal(
    listen: SocketAddr,
    router: http::Router,
    token: Option<BearerToken>,
    what: &str,
) -> Result<u8> {
    // Signal handlers first, so a SIGTERM right after the "listening" line is graceful.
    let mut sigint = signal(SignalKind::interrupt()).wrap_err("installing signal handlers")?;
    let mut sigterm = signal(SignalKind::terminate()).wrap_err("installing signal handlers")?;
    let auth = if token.is_some() {
        ", bearer token required"
    } else {
        ""
    };
    let server = Server::bind(listen, router, token, LIMITS).await?;
    // Scripts and tests read this line to learn the port when --listen asked for port 0.
    eprintln!(
        "vramtop serve: listening on http://{}/metrics and /api/snapshot ({what}{auth})",
        server.addr()
    );
    let code: u8 = tokio::select! {
        _ = sigint.recv() => 130,
        _ = sigterm.recv() => 0,
    };
    if !server.shutdown().await {
        eprintln!(
            "vramtop serve: stopped waiting for connections still busy after {} s",
            LIMITS.shutdown_grace.as_secs()
        );
    }
    Ok(code)
}
