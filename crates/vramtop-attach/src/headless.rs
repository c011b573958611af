//! `vramtop attach`: watch hooked jobs without a terminal, for scripts and checks. Every
//! interval it prints one line: JSON (`{"time_s":..,"attached":[..]}`) with `--json`,
//! else one summary per job. It stops after `--seconds`, or with `--until-ended` once
//! every job it saw has ended.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use color_eyre::eyre::{Result, WrapErr};

use super::job::JobView;
use super::report::JobReport;
use super::watcher::Attacher;
use vramtop_alloc::human_bytes;

#[derive(Clone, Debug)]
pub struct AttachArgs {
    pub dir: PathBuf,
    pub pid: Option<u32>,
    pub seconds: f64,
    pub interval_s: f64,
    pub json: bool,
    pub until_ended: bool,
}

/// Runs the watch; the exit code is 0 when a job was seen, 1 when none was.
pub fn run(args: &AttachArgs) -> Result<u8> {
    let interval = Duration::from_secs_f64(args.interval_s);
    let attacher = Attacher::spawn(args.dir.clone(), interval)?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let mut seen = false;
    let mut stdout = std::io::stdout().lock();
    loop {
        std::thread::sleep(interval.min(deadline.saturating_duration_since(Instant::now())));
        let jobs = attacher.snapshot();
        let shown: Vec<&JobView> = jobs
            .jobs
            .iter()
            .filter(|j| args.pid.is_none_or(|pid| pid == j.pid))
            .collect();
        seen |= !shown.is_empty();
        let line = if args.json {
            let reports: Vec<JobReport> = shown.iter().map(|j| JobReport::of(j)).collect();
            serde_json::json!({
                "time_s": started.elapsed().as_secs_f64(),
                "attached": reports,
            })
            .to_string()
        } else {
            shown
                .iter()
                .map(|j| summary(j))
                .collect::<Vec<_>>()
                .join("\n")
        };
        if !line.is_empty() {
            writeln!(stdout, "{line}").wrap_err("writing to stdout")?;
            stdout.flush().wrap_err("writing to stdout")?;
        }
        let all_ended = seen && shown.iter().all(|j| j.ended);
        if Instant::now() >= deadline || (args.until_ended && all_ended) {
            break;
        }
    }
    if !seen {
        eprintln!(
            "vramtop: no hooked job in {}: start one with `vramtop run -- python ...`, or put \
             `vramtop hook-path` on its PYTHONPATH",
            args.dir.display()
        );
        return Ok(1);
    }
    Ok(0)
}

/// One line per job: who, the allocator's figures, its last OOM, whether it ended.
pub fn summary(job: &JobView) -> String {
    let mut parts = vec![format!(
        "pid {} {}",
        job.pid,
        job.command()
            .unwrap_or_else(|| "(no hello yet)".to_string())
    )];
    if let Some(torch) = job.hello.as_ref().and_then(|h| h.torch_version.as_deref()) {
        parts.push(format!("torch {torch}"));
    }
    match job.map() {
        Some(map) => parts.push(format!(
            "{} segments · reserved {} · allocated {} · largest free {} · frag {:.2}",
            map.layout.segments.len(),
            human_bytes(map.stats.reserved_bytes),
            human_bytes(map.stats.allocated_bytes),
            human_bytes(map.stats.largest_free_bytes),
            map.stats.external_fragmentation
        )),
        None => parts.push("no state yet (CUDA not initialised?)".to_string()),
    }
    if let Some(oom) = &job.oom {
        let remedies: Vec<String> = oom
            .remedies
            .iter()
            .map(|r| format!("{} {}", r.remedy, r.verdict))
            .collect();
        parts.push(format!(
            "OOM: {}; {}; remedies: {}",
            oom.line(),
            oom.expandable_line(),
            remedies.join(", ")
        ));
    }
    if let Some(suspect) = job.suspects.first() {
        parts.push(format!("leak suspect {}", suspect.tag));
    }
    if job.ended {
        parts.push(match job.exit_code {
            Some(code) => format!("ended (exit {code})"),
            None => "ended".to_string(),
        });
    } else if let Some(reason) = &job.last_drop {
        parts.push(format!("dropped: {reason}"));
    }
    parts.join(" · ")
}
