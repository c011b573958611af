//! The command line: options for the live app and the subcommands vramtop grows into.
//! Layering is CLI > environment > settings file > defaults (the file is `config`'s job;
//! `Defaulted` tells it what it may fill); every bad value gets one line that names the
//! flag and the accepted range.

use std::path::PathBuf;

use crate::demo::story::StoryBacking;
use crate::ui::screen_theme::ScreenTheme;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use vramtop_alloc::backing::BackingChoice;
use vramtop_telemetry::DeviceChoice;

use vramtop_alloc::PolicyKind;

pub const MIN_INTERVAL_S: f64 = 0.05;
pub const MAX_INTERVAL_S: f64 = 3600.0;

#[derive(Debug, Parser)]
#[command(
    name = "vramtop",
    version,
    about = "Watch GPU memory live and make fragmentation and leaks visible",
    long_about = "Watch GPU memory live and make fragmentation and leaks visible.\n\n\
        Without a subcommand, vramtop opens the live view (NVML when an NVIDIA driver is \
        present, else a clearly labelled simulated device). When stdout is not a terminal \
        it prints one snapshot, as --once does.",
    after_long_help = "Files:\n  \
        $XDG_CONFIG_HOME/vramtop/config.toml (else ~/.config/vramtop/config.toml), or the \
        file named by --config or VRAMTOP_CONFIG: settings (interval, sort, policy, \
        backing, probe_limit, theme, columns, tour). Flags beat VRAMTOP_* variables, which beat the file, \
        which beats the defaults. F12 in the live view saves the current settings there.\n\n\
        Shell completions: vramtop completions bash|zsh|fish|elvish|powershell. \
        This manual: vramtop man."
)]
pub struct Cli {
    #[command(flatten)]
    pub live: LiveArgs,

    /// Settings file (default: $XDG_CONFIG_HOME/vramtop/config.toml, else
    /// ~/.config/vramtop/config.toml)
    #[arg(long, value_name = "FILE", env = "VRAMTOP_CONFIG", global = true)]
    pub config: Option<std::path::PathBuf>,

    #[command(subcommand)]
    pub command: Option<Command>,

    /// Which options the settings file may fill.
    #[arg(skip)]
    pub defaulted: Defaulted,
}

/// The layered options left at their built-in default (set by neither a flag nor an
/// environment variable) in this command line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Defaulted {
    pub interval: bool,
    pub policy: bool,
    pub backing: bool,
    pub probe_limit: bool,
    pub theme: bool,
}

impl Defaulted {
    fn of(matches: &clap::ArgMatches) -> Defaulted {
        use clap::parser::ValueSource;
        let m = matches.subcommand().map_or(matches, |(_, sub)| sub);
        // An option this mode lacks is not the file's to fill either.
        let default = |id: &str| {
            m.try_contains_id(id).is_ok()
                && m.value_source(id)
                    .is_none_or(|s| s == ValueSource::DefaultValue)
        };
        Defaulted {
            interval: default("interval"),
            policy: default("policy"),
            backing: default("backing"),
            probe_limit: default("probe_limit"),
            theme: default("theme"),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct LiveArgs {
    /// Seconds between telemetry polls (0.05 to 3600)
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_interval, env = "VRAMTOP_INTERVAL")]
    pub interval: f64,

    /// Seed for the simulated device and probe workloads (0 to 18446744073709551615)
    #[arg(long, value_name = "N", default_value = "0", value_parser = parse_seed, allow_hyphen_values = true)]
    pub seed: u64,

    /// Where telemetry comes from
    #[arg(long, value_parser = device_parser(), default_value = "auto", env = "VRAMTOP_DEVICE")]
    pub device: DeviceChoice,

    /// Print one snapshot and exit
    #[arg(long)]
    pub once: bool,

    /// With --once: print JSON instead of a table
    #[arg(long, requires = "once")]
    pub json: bool,

    /// One-shot runs: also read PCIe throughput and per-process SM utilisation (about
    /// 45 ms more on an H100; N/A without it)
    #[arg(long)]
    pub all_fields: bool,

    /// One-shot runs: print where the time went (NVML load, each group of driver calls,
    /// /proc, output) on stderr
    #[arg(long)]
    pub timings: bool,

    /// Run a probe workload in the background and show its block map
    #[arg(long, value_name = "SCENARIO")]
    pub probe: Option<String>,

    /// On the simulated device, do not play the built-in scenarios one after another
    /// (the tour; settings key `tour = false`). A real GPU never plays it
    #[arg(long)]
    pub no_tour: bool,

    /// Run the probe through two or more policies side by side, e.g. caching,expandable
    #[arg(long, value_name = "POLICY,POLICY", value_delimiter = ',', value_parser = parse_policy, requires = "probe")]
    pub compare: Vec<PolicyKind>,

    /// Record the probe's allocator events to FILE (vramtop's trace format, for `replay`)
    #[arg(long, value_name = "FILE", requires = "probe")]
    pub record: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub probe_opts: ProbeOptions,

    /// Show the devices of hosts that run `vramtop serve`, e.g. gpu1:9464,gpu2:9464
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',', value_parser = parse_remote, conflicts_with = "probe")]
    pub remote: Vec<String>,

    /// With --remote: send `Authorization: Bearer TOKEN`, the token read from FILE
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub token_file: Option<std::path::PathBuf>,

    /// Folder the P key saves SVG pictures of the screen into
    #[arg(long, value_name = "DIR", default_value = ".", env = "VRAMTOP_SVG_DIR")]
    pub svg_dir: PathBuf,
}

/// Options shared by `--probe` in the live view and `vramtop probe`.
#[derive(Debug, Clone, Args)]
pub struct ProbeOptions {
    /// Allocator policy: caching, best-fit, first-fit, tlsf, expandable (an ideal
    /// page-mapped allocator, the lower bound) or pytorch-expandable (PyTorch's
    /// expandable_segments:True, rule for rule)
    #[arg(long, value_name = "NAME", default_value = "caching", value_parser = parse_policy, env = "VRAMTOP_POLICY")]
    pub policy: PolicyKind,

    /// Where probe memory comes from: auto (cuda when libcuda loads, else host)
    #[arg(long, value_parser = backing_parser(), default_value = "auto", env = "VRAMTOP_BACKING")]
    pub backing: BackingChoice,

    /// Most memory a probe may hold, e.g. 512MiB or 4GiB (default 512 MiB, the size the
    /// scenarios are drawn for, on host and GPU alike; on a GPU never more than 25 % of
    /// free memory nor closer than 1 GiB to full)
    #[arg(long, value_name = "BYTES", value_parser = parse_probe_limit, env = "VRAMTOP_PROBE_LIMIT")]
    pub probe_limit: Option<u64>,

    /// GPU for cuda probes, as CUDA numbers them (after CUDA_VISIBLE_DEVICES), 0 to 1023
    #[arg(long, value_name = "INDEX", default_value = "0", value_parser = parse_gpu)]
    pub gpu: usize,

    /// Probe operations per second in the live view (1 to 200000)
    #[arg(long, value_name = "N", default_value = "200", value_parser = parse_rate)]
    pub ops_per_s: f64,
}

/// `--backing`'s values, with the help each shows; they parse into `BackingChoice`.
fn backing_parser() -> impl clap::builder::TypedValueParser<Value = BackingChoice> {
    PossibleValuesParser::new([
        PossibleValue::new("auto")
            .help("The GPU through CUDA when libcuda loads, else host memory"),
        PossibleValue::new("host").help("Real host memory"),
        PossibleValue::new("cuda").help(
            "Real device memory through CUDA (cuMemAlloc, or cuMemCreate pages for expandable)",
        ),
        PossibleValue::new("bookkeeping")
            .help("Address ranges only, no memory behind them (fastest; nothing to verify)"),
    ])
    .try_map(|name| name.parse::<BackingChoice>())
}

/// `--device`'s values, with the help each shows; they parse into `DeviceChoice`.
fn device_parser() -> impl clap::builder::TypedValueParser<Value = DeviceChoice> {
    PossibleValuesParser::new([
        PossibleValue::new("auto")
            .help("NVML when libnvidia-ml.so.1 loads, else the simulated device"),
        PossibleValue::new("nvml").help("NVML only: exit 1 when it cannot be loaded"),
        PossibleValue::new("sim").help("The simulated device, labelled as such"),
    ])
    .try_map(|name| name.parse::<DeviceChoice>())
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a probe workload headless and print allocator metrics
    Probe {
        /// Scenario name, or a path to a scenario .toml file
        scenario: String,
        /// Stop after this many seconds even if the scenario is not finished
        #[arg(long, value_name = "N", default_value = "30", value_parser = parse_seconds)]
        seconds: f64,
        /// Print JSON instead of a summary
        #[arg(long)]
        json: bool,
        /// After the run, keep the probe's memory for this many seconds (for checks that
        /// compare with nvidia-smi)
        #[arg(long, value_name = "SECONDS", default_value = "0", value_parser = parse_hold)]
        hold: f64,
        /// Seed of the scenario's random draws
        #[arg(long, value_name = "N", default_value = "0", value_parser = parse_seed, allow_hyphen_values = true)]
        seed: u64,
        #[command(flatten)]
        opts: ProbeOptions,
    },
    /// Replay an allocation trace through vramtop's allocator policies
    Replay {
        /// Trace file (PyTorch snapshot, RMM CSV or vramtop recording)
        file: std::path::PathBuf,
        /// Policies to replay through: caching, best-fit, first-fit, tlsf, expandable (ideal,
        /// the lower bound), pytorch-expandable (PyTorch's expandable segments), a
        /// comma-separated list of them, or all (the TUI shows the first)
        #[arg(long, value_name = "NAME|all", default_value = "caching", value_parser = parse_policy_set)]
        policy: PolicySet,
        /// Most memory the replayed allocator may hold, e.g. 80GiB; allocs past it fail
        /// and are counted (default: what the trace's own OOMs show PyTorch could hold,
        /// else unlimited, so the peak is measured without OOMs)
        #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
        capacity: Option<u64>,
        /// Print a report (one row per policy) instead of opening the player; also what
        /// happens when stdout is not a terminal
        #[arg(long)]
        report: bool,
        /// Print the report as JSON: the capacity, one row per policy and the trace's OOMs with
        /// their causes and remedies (docs/json.md; implies --report)
        #[arg(long)]
        json: bool,
        /// Print the leak suspects over the whole trace (with --json: a list with tag,
        /// live_bytes, growth_bytes_per_window; empty when there are none)
        #[arg(long)]
        leaks: bool,
    },
    /// Show the segments and blocks of a PyTorch memory snapshot
    Snapshot {
        /// Snapshot file (.pickle or .pickle.gz)
        file: std::path::PathBuf,
        /// Print a text summary and exit (also what happens when stdout is not a terminal)
        #[arg(long)]
        once: bool,
    },
    /// Play a scripted fragmentation story for talks
    Demo {
        /// Story name, or a path to a story .toml file; leave out to list the stories
        name: Option<String>,
        #[command(flatten)]
        opts: DemoOptions,
    },
    /// Run a command with vramtop's PyTorch hook and watch its allocator live
    #[command(
        long_about = "Run a command with vramtop's PyTorch hook and watch its allocator live.\n\n\
            The hook enters every Python process of the command through PYTHONPATH (no code \
            change), and the live view opens with the job selected: its segments in the block \
            map, its OOMs explained, leak suspects with --history. The command's output goes \
            to a log whose last lines show in a pane. Ctrl-C interrupts the job (again: \
            SIGTERM, then SIGKILL); q after it ended exits with its exit code; q while it \
            runs asks first, and a second q leaves it running. When stdout is not a terminal \
            (a batch job) the output passes straight through, and after the job vramtop \
            explains on stderr each OOM it kept (lines starting `vramtop:`); a process that \
            died of an OOM while the job runs on (a torchrun job's ranks waiting on it) has \
            its OOM explained 10 s after (VRAMTOP_OOM_HANG_S).\n\n\
            Every OOM of the job is kept as a PyTorch memory snapshot (the first 3 and the \
            latest of each process), viewer or not: beside the log (the file stdout goes to \
            in a batch job, else --log's folder), or in VRAMTOP_OOM_DIR. Open one with \
            vramtop snapshot FILE, or PyTorch's python -m torch.cuda._memory_viz.",
        after_help = "Example: vramtop run --history -- python train.py --epochs 3"
    )]
    Run {
        /// Record each live block's allocation site (file:line), for leak suspects
        #[arg(long)]
        history: bool,
        /// Write the command's output to FILE (default: a log beside the hook's sockets)
        #[arg(long, value_name = "FILE")]
        log: Option<std::path::PathBuf>,
        /// In a batch job (stdout not a terminal), print nothing of vramtop's own after the
        /// job; OOMs are still kept
        #[arg(long)]
        quiet: bool,
        /// The command and its arguments, after --
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "COMMAND"
        )]
        command: Vec<std::ffi::OsString>,
    },
    /// Print the directory to put first on PYTHONPATH to hook a Python process yourself
    #[command(after_help = "Example: PYTHONPATH=$(vramtop hook-path) jupyter lab\n\
            In a running notebook: import sys; sys.path.insert(0, \"<hook-path>\"); \
            import vramtop_hook; vramtop_hook.start()")]
    HookPath,
    /// Watch hooked jobs without a terminal: one line (or JSON) per interval
    Attach {
        /// Only the job with this pid
        #[arg(long, value_name = "PID")]
        pid: Option<u32>,
        /// Stop after this many seconds
        #[arg(long, value_name = "N", default_value = "10", value_parser = parse_seconds)]
        seconds: f64,
        /// Seconds between lines, and the pace asked of the hooks (0.05 to 3600)
        #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_interval)]
        interval: f64,
        /// Print one JSON object per line: {"time_s", "attached": [...]}
        #[arg(long)]
        json: bool,
        /// Stop as soon as every job seen has ended
        #[arg(long)]
        until_ended: bool,
    },
    /// Measure vramtop's own costs
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Serve metrics in the Prometheus text format, and snapshots for --remote
    Serve(ServeArgs),
    /// Print a shell completion script (see the README for where each shell reads it)
    Completions {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `vramtop man | man -l -`
    Man {
        /// Write vramtop.1 and a page per subcommand (vramtop-serve.1, ...) into DIR instead
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
    /// Check the CUDA backing on GPU 0: segments, pages, fill and verify kernels
    #[command(hide = true)]
    GpuSelfCheck,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Nanoseconds per alloc+free pair for each allocator policy
    Alloc {
        /// Print JSON rows instead of a table
        #[arg(long)]
        json: bool,
        /// Timed alloc+free pairs per policy and size
        #[arg(long, default_value = "100000")]
        pairs: usize,
    },
    /// Load a trace and replay it through policies: load time, replay time, events per
    /// second and peak memory (RSS) of this process
    Replay {
        /// Trace file (PyTorch snapshot, RMM CSV or vramtop recording)
        file: std::path::PathBuf,
        /// Policies to replay through (default: all)
        #[arg(long, value_name = "NAME|all", default_value = "all", value_parser = parse_policy_set)]
        policy: PolicySet,
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Time to draw the full screen
    Render {
        /// Terminal width to draw at (1 to 2000)
        #[arg(long, default_value = "200", value_parser = clap::value_parser!(u16).range(1..=2000))]
        width: u16,
        /// Terminal height to draw at (1 to 1000)
        #[arg(long, default_value = "60", value_parser = clap::value_parser!(u16).range(1..=1000))]
        height: u16,
        /// Frames to draw
        #[arg(long, default_value = "200")]
        frames: usize,
        /// Live blocks in the block map drawn (0 for no probe view; at most 10000000)
        #[arg(long, default_value = "100000", value_parser = parse_blocks)]
        blocks: usize,
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
}

/// Options of `vramtop serve`: where to listen, and the live view's telemetry and probe
/// options.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default; port 0 picks a free port)
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,

    /// Allow a --listen address that other hosts can reach (refused otherwise)
    #[arg(long)]
    pub allow_remote: bool,

    /// Require `Authorization: Bearer TOKEN` with the token read from FILE
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,

    /// Also export dcgm-exporter's DCGM_FI_DEV_* series, in its units and label names
    #[arg(long)]
    pub dcgm_names: bool,

    /// Seconds between telemetry polls (0.05 to 3600)
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_interval, env = "VRAMTOP_INTERVAL")]
    pub interval: f64,

    /// Seed for the simulated device and probe workloads (0 to 18446744073709551615)
    #[arg(long, value_name = "N", default_value = "0", value_parser = parse_seed, allow_hyphen_values = true)]
    pub seed: u64,

    /// Where telemetry comes from
    #[arg(long, value_parser = device_parser(), default_value = "auto", env = "VRAMTOP_DEVICE")]
    pub device: DeviceChoice,

    /// Run a probe workload in the background and export its allocator metrics
    #[arg(long, value_name = "SCENARIO")]
    pub probe: Option<String>,

    /// Run the probe through two or more policies, e.g. caching,expandable
    #[arg(long, value_name = "POLICY,POLICY", value_delimiter = ',', value_parser = parse_policy, requires = "probe")]
    pub compare: Vec<PolicyKind>,

    #[command(flatten)]
    pub probe_opts: ProbeOptions,
}

/// A number of `unit` within [lo, hi]; the error names the accepted range, so clap's one
/// line says what to type instead.
fn parse_in_range(raw: &str, lo: f64, hi: f64, unit: &str) -> Result<f64, String> {
    let range = format!("accepted range: {lo} to {hi}{unit}");
    let value: f64 = raw
        .trim()
        .parse()
        .map_err(|_| format!("not a number; {range}"))?;
    if !value.is_finite() || !(lo..=hi).contains(&value) {
        return Err(format!("out of range; {range}"));
    }
    Ok(value)
}

pub(crate) fn parse_interval(raw: &str) -> Result<f64, String> {
    parse_in_range(raw, MIN_INTERVAL_S, MAX_INTERVAL_S, " seconds")
}

fn parse_rate(raw: &str) -> Result<f64, String> {
    parse_in_range(raw, 1.0, 200_000.0, "")
}

fn parse_seconds(raw: &str) -> Result<f64, String> {
    parse_in_range(raw, 0.1, 86_400.0, " seconds")
}

fn parse_hold(raw: &str) -> Result<f64, String> {
    parse_in_range(raw, 0.0, 3600.0, " seconds")
}

/// Most GPUs a machine may have; an index past it is a typo, not a device.
const MAX_GPU_INDEX: usize = 1023;

fn parse_gpu(raw: &str) -> Result<usize, String> {
    let range = format!("accepted range: 0 to {MAX_GPU_INDEX}");
    match raw.trim().parse::<usize>() {
        Ok(i) if i <= MAX_GPU_INDEX => Ok(i),
        Ok(_) => Err(format!("out of range; {range}")),
        Err(_) => Err(format!("not a whole number; {range}")),
    }
}

fn parse_policy(raw: &str) -> Result<PolicyKind, String> {
    raw.trim().parse()
}

/// The policies of `vramtop replay --policy`, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySet(pub Vec<PolicyKind>);

fn parse_policy_set(raw: &str) -> Result<PolicySet, String> {
    if raw.trim() == "all" {
        return Ok(PolicySet(PolicyKind::ALL.to_vec()));
    }
    let mut set = Vec::new();
    for name in raw.split(',') {
        let policy = parse_policy(name).map_err(|e| format!("{e}, or all"))?;
        if !set.contains(&policy) {
            set.push(policy);
        }
    }
    Ok(PolicySet(set))
}

fn parse_blocks(raw: &str) -> Result<usize, String> {
    parse_in_range(raw, 0.0, 10_000_000.0, " blocks").map(|v| v as usize)
}

/// A probe must hold at least one 2 MiB segment (the caching allocator's smallest).
const MIN_PROBE_LIMIT: u64 = 2 << 20;

fn parse_bytes(raw: &str) -> Result<u64, String> {
    match crate::probe::scenario::parse_size(raw) {
        Ok(0) => Err("must be more than 0 bytes".to_string()),
        other => other,
    }
}

pub(crate) fn parse_probe_limit(raw: &str) -> Result<u64, String> {
    match parse_bytes(raw)? {
        n if n < MIN_PROBE_LIMIT => Err("must be at least 2MiB, one segment".to_string()),
        n => Ok(n),
    }
}

/// "host:port" (an `http://` prefix and a trailing `/` are dropped).
fn parse_remote(raw: &str) -> Result<String, String> {
    let addr = raw.trim();
    let addr = addr.strip_prefix("http://").unwrap_or(addr);
    let addr = addr.trim_end_matches('/');
    let bad = || format!("'{raw}' is not host:port, e.g. gpu1:9464 (plain http only)");
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 && !host.is_empty() && !host.contains('/') => Ok(addr.to_string()),
        _ => Err(bad()),
    }
}

fn parse_seed(raw: &str) -> Result<u64, String> {
    raw.trim()
        .parse()
        .map_err(|_| format!("not a whole number; accepted range: 0 to {}", u64::MAX))
}

/// Parse the command line. Errors come back as one line (clap's first line, which names
/// the flag) so scripts and people see what was wrong without a wall of usage text;
/// `--help` and `--version` come back as `Ok(Err(text))` to be printed as they are.
pub fn parse<I, T>(args: I) -> Result<Cli, (i32, String)>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::error::ErrorKind;
    use clap::{CommandFactory, FromArgMatches};
    let parsed = Cli::command()
        .try_get_matches_from(args)
        .and_then(|matches| {
            let mut cli = Cli::from_arg_matches(&matches)?;
            cli.defaulted = Defaulted::of(&matches);
            Ok(cli)
        });
    parsed.map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => (0, e.render().to_string()),
        _ => {
            let text = e.render().to_string();
            let mut lines = text.lines().filter(|l| !l.trim().is_empty());
            let mut first = lines.next().unwrap_or("error: bad arguments").to_string();
            // "the following required arguments were not provided:" names them below.
            if first.ends_with(':') {
                if let Some(next) = lines.next() {
                    first = format!("{first} {}", next.trim());
                }
            }
            (2, format!("{first} (see vramtop --help)\n"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_bounds() {
        assert!(parse_interval("0.05").is_ok());
        assert!(parse_interval("0").unwrap_err().contains("0.05"));
        assert!(parse_interval("abc")
            .unwrap_err()
            .contains("accepted range"));
        assert!(parse_interval("NaN").is_err());
    }

    #[test]
    fn bad_input_is_one_line_naming_the_flag() {
        for args in [
            vec!["vramtop", "--interval", "0"],
            vec!["vramtop", "--interval", "abc"],
            vec!["vramtop", "--seed", "-1"],
            vec!["vramtop", "--bogus"],
        ] {
            let (code, text) = parse(args.clone()).unwrap_err();
            assert_eq!(code, 2, "{args:?}");
            assert_eq!(text.trim_end().lines().count(), 1, "{args:?}: {text}");
            let flag = args[1].to_string();
            assert!(text.contains(&flag), "{args:?}: {text}");
        }
        // A missing companion flag is named on the same line.
        let (code, text) = parse(["vramtop", "--token-file", "t"]).unwrap_err();
        assert_eq!(code, 2);
        assert_eq!(text.trim_end().lines().count(), 1, "{text}");
        assert!(text.contains("not provided: --remote"), "{text}");
    }

    #[test]
    fn policy_sets() {
        assert_eq!(
            parse_policy_set("all").map(|s| s.0.len()),
            Ok(PolicyKind::ALL.len())
        );
        assert_eq!(
            parse_policy_set("tlsf,caching,tlsf"),
            Ok(PolicySet(vec![PolicyKind::Tlsf, PolicyKind::Caching]))
        );
        assert!(parse_policy_set("nope").unwrap_err().contains("or all"));
    }

    #[test]
    fn remote_addresses() {
        assert_eq!(parse_remote("gpu1:9464").unwrap(), "gpu1:9464");
        assert_eq!(
            parse_remote("http://10.0.0.5:9464/").unwrap(),
            "10.0.0.5:9464"
        );
        assert_eq!(parse_remote("[::1]:9464").unwrap(), "[::1]:9464");
        for bad in ["gpu1", "gpu1:0", ":9464", "gpu1:x", "https://gpu1:9464"] {
            assert!(parse_remote(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn verify_cli() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

/// Options of `vramtop demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoOptions {
    /// Seed of the story's random draws
    #[arg(long, value_name = "N", default_value = "0")]
    pub seed: u64,

    /// Colours of the presenter screen (NO_COLOR turns colours off whatever the theme)
    #[arg(long, value_enum, default_value = "dark")]
    pub theme: ScreenTheme,

    /// Where the story's memory comes from (default: what the story says)
    #[arg(long, value_enum)]
    pub backing: Option<StoryBacking>,

    /// Record what is shown as an asciicast v2 file (play it with asciinema)
    #[arg(long, value_name = "FILE")]
    pub record_cast: Option<PathBuf>,

    /// Folder the s key saves SVG pictures of the screen into
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub svg_dir: PathBuf,
}
