//! `vramtop --once` (or stdout not a terminal): one poll of the devices and the hooked
//! jobs, printed as a table or JSON.

use std::process::ExitCode;
use std::time::Duration;

use color_eyre::eyre::{Result, WrapErr};

use super::{runtime, socket_dir, usage_error};
use crate::cli;
use vramtop_telemetry::auth::BearerToken;
use vramtop_telemetry::nvml::NvmlOptions;
use vramtop_telemetry::open::open_with;
use vramtop_telemetry::sim::WorkloadGauge;
use vramtop_telemetry::timing::Laps;

/// How long `--once` waits for hooked jobs to answer.
const ONCE_ATTACH_WAIT: Duration = Duration::from_secs(3);

/// `--once` (or stdout not a terminal): one poll, printed. The slow fields (PCIe
/// throughput, per-process utilisation) are left out unless `--all-fields` asks, so that a
/// one-shot run costs no more than `nvidia-smi`; `--timings` says where the time went.
pub fn run(args: &cli::LiveArgs, workload: WorkloadGauge) -> Result<ExitCode> {
    let mut laps = Laps::new(args.timings);
    // Only `--remote` needs the async runtime here: NVML and the simulated device do not.
    let rt = if args.remote.is_empty() {
        None
    } else {
        Some(runtime()?)
    };
    let opened = match &rt {
        None => {
            let options = NvmlOptions {
                slow_fields: args.all_fields,
                timings: args.timings,
                ..NvmlOptions::default()
            };
            open_with(args.device, args.seed, workload, options).wrap_err("--device nvml")?
        }
        Some(rt) => {
            let token = match args.token_file.as_deref().map(BearerToken::from_file) {
                None => None,
                Some(Ok(token)) => Some(token),
                Some(Err(e)) => return usage_error(format!("--token-file {e}")),
            };
            let interval = Duration::from_secs_f64(args.interval);
            vramtop_telemetry::remote::open(rt.handle(), &args.remote, interval, token, true)
        }
    };
    laps.lap(|| "open the source".to_string());
    if let Some(notice) = &opened.notice {
        eprintln!("vramtop: {notice}");
    }
    let mut source = opened.source;
    let open_spans = source.take_spans();
    laps.restart();
    let snapshot = source.poll();
    laps.lap(|| "poll".to_string());
    let poll_spans = source.take_spans();
    // Hooked jobs answer within a few intervals of 0.1 s; a wedged one is dropped after
    // 2 s without a hello. With no job socket there, this returns at once.
    let attached = vramtop_attach::collect_once(socket_dir(), ONCE_ATTACH_WAIT)
        .wrap_err("could not start the attach thread")?;
    laps.lap(|| "hooked jobs".to_string());
    let text = if args.json {
        crate::export::once::json_with_attached(&snapshot, &attached)
    } else {
        crate::export::once::table(&snapshot) + &crate::export::once::attached_table(&attached)
    };
    println!("{text}");
    laps.lap(|| "format and print".to_string());
    if laps.enabled() {
        let spans = nest_spans(laps.take(), open_spans, poll_spans);
        eprint!("{}", vramtop_telemetry::timing::report(&spans));
    }
    // Scripts watching remote hosts need to see when none answered.
    let all_down = !args.remote.is_empty()
        && snapshot
            .devices
            .iter()
            .all(|d| matches!(d.health, vramtop_telemetry::DeviceHealth::Lost(_)));
    Ok(if all_down {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The one-shot run's own spans (open, poll, output) with the source's spans of opening and
/// of polling indented under the first two, and the total of the outer ones last.
fn nest_spans(
    outer: Vec<(String, Duration)>,
    open_spans: Vec<(String, Duration)>,
    poll_spans: Vec<(String, Duration)>,
) -> Vec<(String, Duration)> {
    let indent = |inner: Vec<(String, Duration)>| {
        inner
            .into_iter()
            .map(|(name, took)| (format!("  {name}"), took))
    };
    let total: Duration = outer.iter().map(|s| s.1).sum();
    let mut outer = outer.into_iter();
    let mut spans = Vec::new();
    spans.extend(outer.next());
    spans.extend(indent(open_spans));
    spans.extend(outer.next());
    spans.extend(indent(poll_spans));
    spans.extend(outer);
    spans.push(("total after argument parsing".to_string(), total));
    spans
}
