//! `vramtop attach`: watch hooked jobs without a terminal, for scripts and checks. Every
//! interval it prints one line: JSON (`{"schema":1,"time_s":..,"attached":[..]}`, see
//! docs/json.md) with `--json`, else one summary per job. It stops after `--seconds`, or
//! with `--until-ended` once every job it saw has ended.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use color_eyre::eyre::{Result, WrapErr};

use crate::advice::line_with;
use vramtop_attach::report::{JobReport, ATTACH_SCHEMA};
use vramtop_attach::summary::job_line;
use vramtop_attach::{Attacher, JobView};

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
    let attacher = Attacher::spawn(args.dir.clone(), interval)
        .wrap_err("could not start the attach thread")?;
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
                "schema": ATTACH_SCHEMA,
                "time_s": started.elapsed().as_secs_f64(),
                "attached": reports,
            })
            .to_string()
        } else {
            shown
                .iter()
                .map(|j| job_line(j, &jobs.jobs, line_with))
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
