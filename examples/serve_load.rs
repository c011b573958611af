//! Load on a real `vramtop serve` process: its RSS before and after REQUESTS scrapes of
//! /metrics over CONCURRENCY keep-alive connections, and the latency of a fresh scrape
//! while 500 clients scrape and 200 slowloris clients hold half-sent requests.
//! `cargo run --release --example serve_load -- PATH/TO/vramtop [REQUESTS] [CONCURRENCY]
//! [DEVICE]` (defaults 100000, 16 and sim; nvml on a GPU machine). Prints one block of
//! figures; exits 1 when a request failed.

use std::io::{BufRead, BufReader as StdBufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[path = "common/keep_alive.rs"]
mod keep_alive;
use keep_alive::get;

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn connect(addr: &str) -> std::io::Result<BufReader<TcpStream>> {
    Ok(BufReader::new(TcpStream::connect(addr).await?))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// REQUESTS scrapes over CONCURRENCY connections: (failures, per-request latencies).
async fn scrape_many(addr: &str, requests: usize, concurrency: usize) -> (usize, Vec<Duration>) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (addr, next) = (addr.to_string(), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failures = 0;
            let Ok(mut conn) = connect(&addr).await else {
                return (1, latencies);
            };
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let started = Instant::now();
                match get(&mut conn, "/metrics").await {
                    Ok(200) => latencies.push(started.elapsed()),
                    _ => {
                        failures += 1;
                        match connect(&addr).await {
                            Ok(c) => conn = c,
                            Err(_) => return (failures, latencies),
                        }
                    }
                }
            }
            (failures, latencies)
        }));
    }
    let mut failures = 0;
    let mut all = Vec::with_capacity(requests);
    for task in tasks {
        if let Ok((f, l)) = task.await {
            failures += f;
            all.extend(l);
        }
    }
    all.sort();
    (failures, all)
}

/// Fresh-connection scrapes while 500 clients scrape and 200 hold half-sent requests.
async fn scrapes_under_siege(addr: &str, samples: usize) -> Vec<Duration> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut busy = Vec::new();
    for _ in 0..500 {
        let (addr, stop) = (addr.to_string(), Arc::clone(&stop));
        busy.push(tokio::spawn(async move {
            let Ok(mut conn) = connect(&addr).await else {
                return;
            };
            while !stop.load(Ordering::Relaxed) {
                if get(&mut conn, "/metrics").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    let mut slow = Vec::new();
    for _ in 0..200 {
        if let Ok(mut s) = TcpStream::connect(addr).await {
            let _ = s
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: slow\r\n")
                .await;
            slow.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut latencies = Vec::new();
    for _ in 0..samples {
        let started = Instant::now();
        if let Ok(mut conn) = connect(addr).await {
            if let Ok(200) = get(&mut conn, "/metrics").await {
                latencies.push(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in busy {
        let _ = task.await;
    }
    drop(slow);
    latencies.sort();
    latencies
}

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(binary) = args.next() else {
        eprintln!("usage: serve_load PATH/TO/vramtop [REQUESTS] [CONCURRENCY]");
        return std::process::ExitCode::from(2);
    };
    let requests: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let concurrency: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(16);
    let device = args.next().unwrap_or_else(|| "sim".to_string());
    let mut serve = match Command::new(&binary)
        .args(["serve", "--device", &device, "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("could not start {binary}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let addr = serve.stderr.take().and_then(|stderr| {
        StdBufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| {
                let rest = l.split("listening on http://").nth(1)?;
                Some(rest.split('/').next()?.to_string())
            })
    });
    let Some(addr) = addr else {
        eprintln!("vramtop serve did not say where it listens");
        let _ = serve.kill();
        return std::process::ExitCode::from(1);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("no tokio runtime: {e}");
            let _ = serve.kill();
            return std::process::ExitCode::from(1);
        }
    };
    let pid = serve.id();
    let failed = runtime.block_on(async {
        // Let the first polls land so every scrape is a full one.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (_, warm) = scrape_many(&addr, 100, 1).await;
        let before = rss_kib(pid).unwrap_or(0);
        let started = Instant::now();
        let (failures, latencies) = scrape_many(&addr, requests, concurrency).await;
        let elapsed = started.elapsed().as_secs_f64();
        let after = rss_kib(pid).unwrap_or(0);
        println!("serve at {addr} (pid {pid}, --device {device}), binary {binary}");
        println!(
            "warm-up: {} scrapes, median {:.3} ms",
            warm.len(),
            percentile(&warm, 0.5)
        );
        println!(
            "{requests} scrapes over {concurrency} keep-alive connections in {elapsed:.1} s \
             ({:.0}/s), {failures} failed; latency median {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            latencies.len() as f64 / elapsed,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            percentile(&latencies, 1.0)
        );
        println!(
            "RSS before {before} KiB, after {after} KiB ({:+} KiB)",
            after as i64 - before as i64
        );
        let siege = scrapes_under_siege(&addr, 20).await;
        println!(
            "fresh scrape with 500 busy + 200 slowloris connections: {} of 20 answered, \
             median {:.2} ms, max {:.2} ms",
            siege.len(),
            percentile(&siege, 0.5),
            percentile(&siege, 1.0)
        );
        println!("RSS after the siege {} KiB", rss_kib(pid).unwrap_or(0));
        failures > 0 || siege.len() < 20
    });
    let _ = serve.kill();
    let _ = serve.wait();
    if failed {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    }
}
