//! `vramtop attach`: watch hooked jobs without a terminal, for scripts and checks. Every
//! interval it prints one line: JSON (`{"time_s":..,"attached":[..]}`) with `--json`,
//! else one summary per job. It stops after `--seconds`, or with `--until-ended` once
//! every job it saw has ended.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use color_eyre::eyre::{Result, WrapErr};

use super::job::JobView;
use super::ranks::{is_launcher, ranks_of};
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
        let shown: Vec<JobView> = jobs
            .jobs
            .iter()
            .filter(|j| args.pid.is_none_or(|pid| pid == j.pid))
            .cloned()
            .collect();
        seen |= !shown.is_empty();
        let line = if args.json {
            // Launchers are told beside every job, not only the ones shown (`--pid`).
            let reports: Vec<JobReport> = JobReport::of_all(&jobs.jobs)
                .into_iter()
                .filter(|r| args.pid.is_none_or(|pid| pid == r.pid))
                .collect();
            serde_json::json!({
                "schema": super::report::ATTACH_SCHEMA,
                "time_s": started.elapsed().as_secs_f64(),
                "attached": reports,
            })
            .to_string()
        } else {
            shown
                .iter()
                .map(|j| summary(j, &jobs.jobs))
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

/// One line per job: who (with its rank, or as a launcher), the allocator's figures, its
/// last OOM, whether it ended. `all` is every job shown, to tell launchers.
pub fn summary(job: &JobView, all: &[JobView]) -> String {
    let mut parts = vec![format!(
        "pid {} {}",
        job.pid,
        job.command()
            .unwrap_or_else(|| "(no hello yet)".to_string())
    )];
    if let Some(rank) = job.rank() {
        let world = job
            .world_size()
            .map_or_else(String::new, |w| format!("/{w}"));
        let local = job
            .local_rank()
            .map_or_else(String::new, |l| format!(" (local {l})"));
        parts.push(format!("rank {rank}{world}{local}"));
    }
    if let Some(torch) = job.hello.as_ref().and_then(|h| h.torch_version.as_deref()) {
        parts.push(format!("torch {torch}"));
    }
    match (job.map(), job.figures()) {
        (Some(map), Some(f)) => parts.push(format!(
            "gpu {} · {} segments · reserved {} · allocated {} · largest free {} · frag {:.2}",
            f.device,
            map.layout.segments.len(),
            human_bytes(f.reserved_bytes),
            human_bytes(f.allocated_bytes),
            human_bytes(f.largest_free_bytes),
            f.external_fragmentation
        )),
        _ if is_launcher(all, job.pid) => {
            let ranks: Vec<String> = ranks_of(all, job.pid).iter().map(u32::to_string).collect();
            let ranks = if ranks.is_empty() {
                "hooked children".to_string()
            } else {
                format!("ranks {}", ranks.join(", "))
            };
            parts.push(format!(
                "launcher of {ranks} (no CUDA: the job's parent, on no GPU)"
            ));
        }
        _ => parts.push("no state yet (CUDA not initialised?)".to_string()),
    }
    if let Some(oom) = &job.oom {
        let remedies: Vec<String> = oom
            .remedies
            .iter()
            .map(|r| format!("{} {}", r.remedy, r.verdict))
            .collect();
        // From the job's whole history, the remedies say it all; from one state, the
        // expandable line gives its bounds.
        // The cause first: it says what the remedies then address.
        if let Some(cause) = oom.causes.first() {
            parts.push(format!("OOM cause: {}", cause.line()));
        }
        parts.push(match oom.history_events {
            Some(events) => format!(
                "OOM: {}; remedies from the job's whole history ({events} events replayed): {}",
                oom.line(),
                remedies.join(", ")
            ),
            None => format!(
                "OOM: {}; {}; remedies: {}",
                oom.line(),
                oom.expandable_line(),
                remedies.join(", ")
            ),
        });
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
