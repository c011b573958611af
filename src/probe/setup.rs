//! Building probes from command-line choices: the scenario, one allocator per policy,
//! each over its own backing of the same capacity.

use std::sync::Arc;

use super::runner::Probe;
use super::scenario::Scenario;
use vramtop_alloc::backing::BackingChoice;
use vramtop_alloc::backing::{cuda, Backing, BookkeepingBacking, HostBacking};
use vramtop_alloc::{AllocConfig, Allocator, PolicyKind};

/// Default probe capacity, on host memory and on the GPU alike: the size the built-in
/// scenarios are drawn for, large enough for every one of them, small enough to fill and
/// verify in a moment. On a GPU the same size gives the same picture as on host (at 25 %
/// of an H100's free memory the caching column was 714 rows of full 20 MiB segments, its
/// holes invisible); `--probe-limit` asks for more.
pub const HOST_DEFAULT_LIMIT: u64 = 512 << 20;

/// Why no probe was built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetupError {
    /// A choice of the user's cannot be met (a limit larger than the memory there, a GPU
    /// that is not there): theirs to fix, exit 2.
    Refused(String),
    /// The GPU cannot run probes (NVRTC missing or failing, so probes could not verify
    /// their memory): the live view and `serve` go on without one and say why.
    Disabled(String),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Refused(line) => f.write_str(line),
            SetupError::Disabled(why) => write!(f, "probes disabled: {why}"),
        }
    }
}

impl From<String> for SetupError {
    fn from(line: String) -> Self {
        SetupError::Refused(line)
    }
}

pub struct ProbeSet {
    pub probes: Vec<Probe>,
    /// "host 512.0 MiB", "cuda 19.8 GiB": shown in titles and reports.
    pub backing_label: String,
}

/// Host memory available to us, from /proc/meminfo, so a limit larger than the machine
/// can be refused before anything is allocated.
fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

fn make_backing(
    choice: BackingChoice,
    limit: Option<u64>,
    gpu: usize,
) -> Result<(Box<dyn Backing>, String), SetupError> {
    use vramtop_alloc::human_bytes;
    match choice {
        BackingChoice::Bookkeeping => {
            let cap = limit.unwrap_or(HOST_DEFAULT_LIMIT);
            Ok((
                Box::new(BookkeepingBacking::new(cap)),
                format!("bookkeeping {}", human_bytes(cap)),
            ))
        }
        BackingChoice::Cuda => cuda_backing(limit, gpu),
        BackingChoice::Auto if cuda::driver_present() => match cuda_backing(limit, gpu) {
            Ok(b) => Ok(b),
            // A GPU the user named is not quietly swapped for host memory.
            Err(e) if gpu != 0 => Err(e),
            // No usable GPU after all (no device, driver error): host memory still
            // shows fragmentation; the label says which one is in use.
            Err(_) => make_backing(BackingChoice::Host, limit, gpu),
        },
        BackingChoice::Host | BackingChoice::Auto => {
            let cap = limit.unwrap_or(HOST_DEFAULT_LIMIT);
            if let Some(avail) = host_available() {
                if cap > avail {
                    return Err(SetupError::Refused(format!(
                        "--probe-limit {} is more than the {} of host memory available; give a smaller limit",
                        human_bytes(cap),
                        human_bytes(avail)
                    )));
                }
            }
            Ok((
                Box::new(HostBacking::new(cap)),
                format!("host {}", human_bytes(cap)),
            ))
        }
    }
}

/// Device memory through CUDA, capped by `--probe-limit` or by default at the scenarios'
/// size (`HOST_DEFAULT_LIMIT`), and by default never more than 25 % of free memory nor
/// closer than 1 GiB to full. Probes that cannot verify their memory
/// (NVRTC missing or failing) are refused: a probe that cannot check itself could hide
/// corruption.
fn cuda_backing(limit: Option<u64>, gpu: usize) -> Result<(Box<dyn Backing>, String), SetupError> {
    use vramtop_alloc::human_bytes;
    let (free, total) =
        cuda::device_memory_checked(gpu).map_err(|e| format!("--backing cuda: {e}"))?;
    let default = cuda::default_probe_limit(free, total).min(HOST_DEFAULT_LIMIT);
    let cap = match limit {
        None => default,
        Some(l) if l > free.saturating_sub(cuda::PROBE_HEADROOM) => {
            return Err(SetupError::Refused(format!(
                "--probe-limit {} is more than the GPU can spare: {} free, and 1 GiB must stay free; at most {}",
                human_bytes(l),
                human_bytes(free),
                human_bytes(free.saturating_sub(cuda::PROBE_HEADROOM))
            )))
        }
        Some(l) => l,
    };
    let backing = cuda::CudaBacking::open(gpu, cap).map_err(|e| format!("--backing cuda: {e}"))?;
    if !backing.kernels_ready() {
        return Err(SetupError::Disabled(backing.kernel_status().to_string()));
    }
    let label = format!("cuda {} on {}", human_bytes(cap), backing.device_name());
    Ok((Box::new(backing), label))
}

/// One probe per policy, all with the same scenario, seed and capacity, on GPU 0 when
/// the backing is cuda.
pub fn build(
    scenario: &Scenario,
    policies: &[PolicyKind],
    backing: BackingChoice,
    limit: Option<u64>,
    seed: u64,
) -> Result<ProbeSet, SetupError> {
    build_on_gpu(scenario, policies, backing, limit, 0, seed)
}

/// As `build`, with `gpu` the CUDA device (`--gpu`) for a cuda backing.
pub fn build_on_gpu(
    scenario: &Scenario,
    policies: &[PolicyKind],
    backing: BackingChoice,
    limit: Option<u64>,
    gpu: usize,
    seed: u64,
) -> Result<ProbeSet, SetupError> {
    let mut probes = Vec::with_capacity(policies.len());
    let mut label = String::new();
    for &policy in policies {
        let (b, l) = make_backing(backing, limit, gpu)?;
        label = l;
        let allocator = Arc::new(Allocator::new(policy, b, AllocConfig::default()));
        probes.push(Probe::new(scenario, allocator, &label, seed));
    }
    Ok(ProbeSet {
        probes,
        backing_label: label,
    })
}
