//! `vramtop probe SCENARIO`: a probe workload run headless, its allocator metrics printed.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use color_eyre::eyre::Result;

use super::{build_probes, usage_error, Probes};
use crate::cli;

/// `vramtop probe SCENARIO`: run it headless for `seconds` (or to its end), print the
/// report, hold the memory for `hold_s`; exit 3 when verification found a mismatch.
pub fn run(
    name: &str,
    seconds: f64,
    json: bool,
    seed: u64,
    opts: &cli::ProbeOptions,
    hold_s: f64,
) -> Result<ExitCode> {
    // Headless, a GPU that cannot run probes is as much a refusal as a bad limit.
    let mut set = match build_probes(name, &[opts.policy], opts, seed) {
        Ok(Probes::Built(set)) => set,
        Ok(Probes::Disabled(line)) | Err(line) => return usage_error(line),
    };
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(seconds);
    let Some(probe) = set.probes.first_mut() else {
        return usage_error("no probe was built");
    };
    probe.run(Some(deadline));
    let report = probe.report();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", crate::probe::runner::summary(&report));
    }
    if hold_s > 0.0 {
        // The report is out before the hold, so a script can read it while we still
        // hold the memory it describes.
        std::io::stdout().flush()?;
        std::thread::sleep(Duration::from_secs_f64(hold_s));
    }
    // A verification mismatch is a correctness failure: say so in the exit code too.
    Ok(if report.verify_mismatches > 0 {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}
